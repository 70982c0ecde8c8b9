//! Tenancy seams: who a session is (authentication), what it may watch (authorization), and how
//! much it may use (limits). `ctrlhub dev` uses a static token and allows everything; in a
//! cluster, TokenReview ([`tokenreview`]) and SubjectAccessReview ([`accessreview`]) sit behind
//! the same traits, so the rest of the manager never knows which is in use.
//!
//! Owns: identities, authenticators, authorizers (and the namespace gate built on them: which
//! namespaces an identity may read, one at a time), the decision cache and per-tenant limits. May
//! call: the Kubernetes client, and `metrics` (review latency and cache hits).

pub(crate) mod accessreview;
pub(crate) mod decision_cache;
pub(crate) mod namespace_gate;
pub(crate) mod tokenreview;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A boxed future, so the seams stay object-safe (`Arc<dyn Authenticator>`).
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// Tenant name used for controller names, limits and metrics: the full username, so two
    /// ServiceAccounts with the same name in different namespaces are different tenants.
    pub tenant: String,
    /// Full username as the authenticator reported it.
    pub username: String,
    /// The user's uid (a ServiceAccount's uid changes when it is re-created).
    pub uid: String,
    /// Groups, passed on to SubjectAccessReview.
    pub groups: Vec<String>,
}

/// Why authentication failed. Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    /// No bearer token in the request metadata.
    #[error("missing bearer token: send gRPC metadata `authorization: Bearer <token>`")]
    Missing,
    /// The authorization metadata is not `Bearer <token>`.
    #[error("malformed authorization metadata: expected `Bearer <token>`")]
    Malformed,
    /// The token is not accepted (unknown, expired, tampered, or its ServiceAccount is gone).
    #[error("the bearer token was not accepted: use a current ServiceAccount token")]
    Rejected,
    /// The token is not the manager's static token (`--auth static`).
    #[error(
        "the bearer token is not this manager's static token: send the value of its --token (env CTRLHUB_TOKEN; `ctrlhub dev` and a plain `ctrlhub run` use `dev`)"
    )]
    NotTheStaticToken,
    /// The token is valid but not issued for ctrlhub.
    #[error(
        "the bearer token is not for audience {0:?}: request a projected token with that audience"
    )]
    WrongAudience(String),
    /// The authenticator could not decide (API server unreachable); retry.
    #[error("cannot verify the bearer token right now: {0}")]
    Unavailable(String),
}

/// When a JWT bearer token says it expires (its `exp` claim), read without verifying anything:
/// only ever used to end a session sooner, never to accept a token.
pub(crate) fn token_expiry(token: &str) -> Option<std::time::SystemTime> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = u64::try_from(claims.get("exp")?.as_i64()?).ok()?;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(exp))
}

/// Turns a bearer token into an identity.
pub(crate) trait Authenticator: Send + Sync {
    /// Authenticate a token.
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Identity, AuthError>>;

    /// The decision for `token` if it costs nothing to make (a cached review, a static table):
    /// asked before any throttle, so a caller whose token is already known is never held back
    /// by someone else's junk from the same address. `None`: only [`Self::authenticate`] can
    /// tell, at the cost of a review.
    fn cached(&self, _token: &str) -> Option<Result<Identity, AuthError>> {
        None
    }
}

/// Static tokens (for `ctrlhub dev` and tests): token → tenant.
pub(crate) struct StaticTokens {
    tokens: HashMap<String, String>,
}

impl StaticTokens {
    /// Accept exactly these tokens, each for its tenant.
    pub(crate) fn new(tokens: impl IntoIterator<Item = (String, String)>) -> Self {
        StaticTokens {
            tokens: tokens.into_iter().collect(),
        }
    }
}

impl StaticTokens {
    fn lookup(&self, token: &str) -> Result<Identity, AuthError> {
        self.tokens
            .get(token)
            .map(|tenant| Identity {
                tenant: tenant.clone(),
                username: format!("ctrlhub:static:{tenant}"),
                uid: String::new(),
                groups: Vec::new(),
            })
            .ok_or(AuthError::NotTheStaticToken)
    }
}

impl Authenticator for StaticTokens {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Identity, AuthError>> {
        Box::pin(std::future::ready(self.lookup(token)))
    }

    /// A table lookup costs nothing: static tokens are never throttled.
    fn cached(&self, token: &str) -> Option<Result<Identity, AuthError>> {
        Some(self.lookup(token))
    }
}

/// What a tenant wants to do with a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Access {
    /// list + watch (registrations).
    Watch,
    /// get + list (cached reads).
    Read,
}

impl Access {
    /// The Kubernetes verbs this access needs, all of them.
    pub(crate) fn verbs(self) -> [&'static str; 2] {
        match self {
            Access::Watch => ["list", "watch"],
            Access::Read => ["get", "list"],
        }
    }
}

/// Why an authorization decision could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthzError {
    /// The policy could not be consulted (API server unreachable); retry.
    #[error("cannot check permissions right now: {0}")]
    Unavailable(String),
}

/// Decides whether an identity may watch or read a resource in a namespace ("" = all).
pub(crate) trait Authorizer: Send + Sync {
    /// Whether `who` may `access` `group/plural` in `namespace`.
    fn allowed<'a>(
        &'a self,
        who: &'a Identity,
        access: Access,
        group: &'a str,
        plural: &'a str,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthzError>>;

    /// Whether `group/plural` is refused to `who` whatever RBAC says (e.g. Secrets for a tenant
    /// the configuration does not list). A namespace-selector registration for such a kind is
    /// refused up front: admitting it and then denying every namespace would look like success.
    fn refused_outright(&self, _who: &Identity, _group: &str, _plural: &str) -> bool {
        false
    }

    /// How long a deny is trusted: a namespace refused entry into a label-selector scope is
    /// asked about again after this long, so a RoleBinding created later admits it.
    fn deny_ttl(&self) -> Duration {
        Duration::from_secs(30)
    }
}

/// Decides whether an identity may use a non-resource URL of the manager's own HTTP port (e.g.
/// `get /metrics`), as the API server's authorizer decides for its own non-resource URLs.
pub(crate) trait PathAuthorizer: Send + Sync {
    /// Whether `who` may `verb` the URL path `path`.
    fn path_allowed<'a>(
        &'a self,
        who: &'a Identity,
        verb: &'static str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthzError>>;
}

/// Decides whether one namespace may enter a namespace-label-selector scope. Under RBAC: whether
/// the registering identity may list and watch everything the registration watches there.
pub(crate) trait NamespaceGate: Send + Sync {
    /// Whether `namespace` may enter the scope now.
    fn admit<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<bool, AuthzError>>;

    /// How long to wait before asking again about a namespace that was denied (or could not be
    /// decided).
    fn retry_after(&self) -> Duration;
}

/// Allows everything (dev mode).
pub(crate) struct AllowAll;

impl Authorizer for AllowAll {
    fn allowed<'a>(
        &'a self,
        _: &'a Identity,
        _: Access,
        _: &'a str,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthzError>> {
        Box::pin(std::future::ready(Ok(true)))
    }
}

/// What limits and dispatch seats are counted per: one identity, or all ServiceAccounts of a
/// namespace together (so creating more accounts in a namespace does not multiply its share).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TenantGrouping {
    /// All ServiceAccounts of a namespace are one tenant, `system:serviceaccounts:<namespace>`
    /// (the group Kubernetes puts them in); any other user is a tenant of its own.
    #[default]
    Namespace,
    /// Every identity (username) is a tenant of its own.
    Identity,
}

impl TenantGrouping {
    /// Refuses a tenant name in the configuration that can never match under this grouping:
    /// one ServiceAccount's username while tenants are namespaces (a silent no-op otherwise).
    pub fn check_configured(self, tenant: &str, flag: &str) -> Result<(), String> {
        match (self, service_account_namespace(tenant)) {
            (TenantGrouping::Namespace, Some(ns)) => Err(format!(
                "{flag} names the ServiceAccount {tenant:?}, but tenants are namespaces (--tenant-grouping namespace): use system:serviceaccounts:{ns}, or --tenant-grouping identity"
            )),
            _ => Ok(()),
        }
    }

    /// The tenant `username`'s limits and seats count against.
    pub fn tenant_of(self, username: &str) -> String {
        match (self, service_account_namespace(username)) {
            (TenantGrouping::Namespace, Some(ns)) => format!("system:serviceaccounts:{ns}"),
            _ => username.to_string(),
        }
    }
}

/// The namespace of a ServiceAccount username, `system:serviceaccount:<namespace>:<name>`.
fn service_account_namespace(username: &str) -> Option<&str> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty()).then_some(namespace)
}

/// One tenant's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Concurrent sessions (controller replicas) across the tenant's controllers.
    pub sessions: usize,
    /// Distinct controllers (registrations) the tenant may have at once.
    pub controllers: usize,
    /// Keys one of the tenant's controllers may hold queued; past it the registration is
    /// revoked (RESOURCE_EXHAUSTED) so memory stays bounded.
    pub queued_keys: usize,
    /// Requests in flight (the sum of session credits) across the tenant's controllers.
    pub in_flight: u64,
    /// Distinct informers (resource, namespace, label selector, metadata-only) the tenant's
    /// controllers hold at once: each is an API watch and a cache the manager pays for.
    pub informers: usize,
    /// New registrations (not replicas joining) per second, after a burst of five times as many
    /// (at least 5); 0 = unlimited.
    pub registrations_per_second: u64,
    /// Bytes of cached objects the tenant's controllers make the manager hold: the informers
    /// they use, each counted in full (any one of its users alone would keep it).
    pub cached_bytes: u64,
    /// Shortest request deadline a registration may ask for: a shorter one turns every request
    /// into a missed deadline and a redelivery.
    pub min_deadline: Duration,
    /// Longest request deadline a registration may ask for: how long a controller that never
    /// answers can keep the seats and keys it was handed.
    pub max_deadline: Duration,
    /// Shortest resync period a registration may ask for: each resync re-enqueues every cached
    /// primary key, so the period bounds that work per second (a 1 ns period once kept the
    /// dispatch loop from ever sleeping).
    pub min_resync: Duration,
    /// Bytes the tenant's controllers may hold in what waits for delivery: EVENTS-mode events
    /// and the tombstones of deleted primaries. Past it an EVENTS controller is revoked
    /// (RESOURCE_EXHAUSTED) and tombstones keep only the object's identity.
    pub queued_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            sessions: 256,
            controllers: 64,
            queued_keys: 1_000_000,
            in_flight: 4096,
            informers: 128,
            cached_bytes: 256 * 1024 * 1024,
            registrations_per_second: 2,
            min_deadline: Duration::from_secs(1),
            max_deadline: Duration::from_secs(15 * 60),
            min_resync: Duration::from_secs(10),
            queued_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// Whether a resync period (None: no resync) is at least this tenant's floor.
    pub(crate) fn check_resync(&self, resync: Option<Duration>) -> Result<(), ResyncTooShort> {
        match resync {
            Some(period) if period < self.min_resync => Err(ResyncTooShort {
                given: period,
                min: self.min_resync,
            }),
            _ => Ok(()),
        }
    }

    /// Whether `deadline` is within this tenant's bounds; the error says which and how to fix.
    pub(crate) fn check_deadline(&self, deadline: Duration) -> Result<(), DeadlineOutOfBounds> {
        if deadline < self.min_deadline || deadline > self.max_deadline {
            return Err(DeadlineOutOfBounds {
                given: deadline,
                min: self.min_deadline,
                max: self.max_deadline,
            });
        }
        Ok(())
    }
}

/// A request deadline outside the tenant's bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) struct DeadlineOutOfBounds {
    given: Duration,
    min: Duration,
    max: Duration,
}

impl fmt::Display for DeadlineOutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is outside this tenant's bounds ({} to {}): choose a deadline in that range, or ask the operator for other bounds (--tenant-limit TENANT/min-deadline= or max-deadline=)",
            humantime::format_duration(self.given),
            humantime::format_duration(self.min),
            humantime::format_duration(self.max)
        )
    }
}

/// A resync period below the tenant's floor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) struct ResyncTooShort {
    given: Duration,
    min: Duration,
}

impl fmt::Display for ResyncTooShort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is shorter than this tenant's minimum resync period {}: every resync re-delivers every key, so choose at least {}, or 0 to turn resync off (or ask the operator for another floor: --tenant-limit TENANT/min-resync=)",
            humantime::format_duration(self.given),
            humantime::format_duration(self.min),
            humantime::format_duration(self.min)
        )
    }
}

/// A malformed `--tenant-limit`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--tenant-limit {given:?}: {why}; expected TENANT/LIMIT=N with LIMIT one of sessions, controllers, queued-keys, in-flight, informers, cached-bytes, queued-bytes, registrations-per-second, or TENANT/LIMIT=DURATION with LIMIT min-deadline, max-deadline or min-resync (e.g. system:serviceaccount:team-a:ctl/queued-keys=50000, system:serviceaccount:team-a:ctl/max-deadline=1h)"
)]
pub(crate) struct LimitSpecError {
    given: String,
    why: &'static str,
}

/// Set the limit called `name` (as `--tenant-limit` and tenant policies spell it) to `value`;
/// the error says what is wrong with it.
pub(crate) fn set_limit(limits: &mut Limits, name: &str, value: &str) -> Result<(), &'static str> {
    let duration = || {
        humantime::parse_duration(value)
            .map_err(|_| "the value is not a duration such as 500ms, 30s or 1h")
    };
    match name {
        "min-deadline" => limits.min_deadline = duration()?,
        "max-deadline" => limits.max_deadline = duration()?,
        "min-resync" => limits.min_resync = duration()?,
        _ => {
            let value: u64 = value
                .parse()
                .map_err(|_| "the value is not a whole number")?;
            let as_usize = usize::try_from(value).unwrap_or(usize::MAX);
            match name {
                "sessions" => limits.sessions = as_usize,
                "controllers" => limits.controllers = as_usize,
                "queued-keys" => limits.queued_keys = as_usize,
                "in-flight" => limits.in_flight = value,
                "informers" => limits.informers = as_usize,
                "cached-bytes" => limits.cached_bytes = value,
                "queued-bytes" => limits.queued_bytes = value,
                "registrations-per-second" => limits.registrations_per_second = value,
                _ => return Err("unknown limit"),
            }
        }
    }
    Ok(())
}

/// Limits for every tenant: defaults plus per-tenant overrides from the configuration.
#[derive(Debug, Clone, Default)]
pub(crate) struct TenantLimits {
    defaults: Limits,
    overrides: HashMap<String, Limits>,
}

impl TenantLimits {
    /// Everyone gets `defaults`.
    pub(crate) fn new(defaults: Limits) -> Self {
        TenantLimits {
            defaults,
            overrides: HashMap::new(),
        }
    }

    /// Apply overrides written `TENANT/LIMIT=N` (tenants are usernames, which never hold `/`).
    pub(crate) fn with_overrides<'a>(
        mut self,
        specs: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, LimitSpecError> {
        for spec in specs {
            let err = |why| LimitSpecError {
                given: spec.to_string(),
                why,
            };
            let (tenant, rest) = spec.rsplit_once('/').ok_or_else(|| err("missing '/'"))?;
            let (name, value) = rest.split_once('=').ok_or_else(|| err("missing '='"))?;
            if tenant.is_empty() {
                return Err(err("empty tenant"));
            }
            let limits = self
                .overrides
                .entry(tenant.to_string())
                .or_insert(self.defaults);
            set_limit(limits, name.trim(), value.trim()).map_err(err)?;
        }
        Ok(self)
    }

    /// The same limits with `tenant`'s replaced (a tenant policy).
    pub(crate) fn with_tenant(mut self, tenant: &str, limits: Limits) -> Self {
        self.overrides.insert(tenant.to_string(), limits);
        self
    }

    /// Every tenant named by an override.
    pub(crate) fn named(&self) -> impl Iterator<Item = &str> {
        self.overrides.keys().map(String::as_str)
    }

    /// The limits that apply to `tenant`.
    pub(crate) fn for_tenant(&self, tenant: &str) -> Limits {
        self.overrides.get(tenant).copied().unwrap_or(self.defaults)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_change_one_tenant_and_one_limit() {
        let limits = TenantLimits::new(Limits::default())
            .with_overrides([
                "system:serviceaccount:team-a:ctl/queued-keys=50",
                "system:serviceaccount:team-a:ctl/sessions=2",
            ])
            .expect("valid");
        let a = limits.for_tenant("system:serviceaccount:team-a:ctl");
        assert_eq!((a.queued_keys, a.sessions), (50, 2));
        assert_eq!(a.controllers, Limits::default().controllers);
        assert_eq!(
            limits.for_tenant("system:serviceaccount:team-b:ctl"),
            Limits::default()
        );
    }

    #[test]
    fn service_accounts_of_a_namespace_are_one_tenant_unless_asked_otherwise() {
        let by_ns = TenantGrouping::Namespace;
        assert_eq!(
            by_ns.tenant_of("system:serviceaccount:team-a:ctl"),
            "system:serviceaccounts:team-a"
        );
        assert_eq!(
            by_ns.tenant_of("system:serviceaccount:team-a:other"),
            "system:serviceaccounts:team-a"
        );
        assert_eq!(by_ns.tenant_of("dev"), "dev");
        assert_eq!(
            by_ns.tenant_of("system:serviceaccount:broken"),
            "system:serviceaccount:broken"
        );
        assert_eq!(
            TenantGrouping::Identity.tenant_of("system:serviceaccount:team-a:ctl"),
            "system:serviceaccount:team-a:ctl"
        );
    }

    #[test]
    fn a_jwt_expiry_is_read_and_anything_else_is_none() {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let jwt = format!(
            "{}.{}.sig",
            b64("{\"alg\":\"RS256\"}"),
            b64("{\"exp\":1700000000}")
        );
        assert_eq!(
            token_expiry(&jwt),
            Some(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(token_expiry("dev"), None);
        assert_eq!(token_expiry("a.%%%.c"), None);
        let no_exp = format!("x.{}.y", b64("{\"sub\":\"me\"}"));
        assert_eq!(token_expiry(&no_exp), None);
    }

    #[test]
    fn deadline_bounds_are_durations_and_checked_inclusively() {
        let limits = TenantLimits::new(Limits::default())
            .with_overrides(["t/min-deadline=100ms", "t/max-deadline=1h"])
            .expect("valid");
        let t = limits.for_tenant("t");
        assert_eq!(t.min_deadline, Duration::from_millis(100));
        assert!(t.check_deadline(Duration::from_millis(100)).is_ok());
        assert!(t.check_deadline(Duration::from_secs(3600)).is_ok());
        let e = t
            .check_deadline(Duration::from_millis(1))
            .expect_err("below the minimum");
        assert!(e.to_string().contains("100ms to 1h"), "{e}");
        let d = Limits::default();
        assert!(
            d.check_deadline(Duration::from_secs(100 * 365 * 24 * 3600))
                .is_err()
        );
        assert!(d.check_deadline(Duration::from_secs(60)).is_ok());
        assert!(
            TenantLimits::default()
                .with_overrides(["t/max-deadline=3"])
                .is_err(),
            "a bare number is not a duration"
        );
    }

    #[test]
    fn bad_overrides_say_what_is_expected() {
        for bad in [
            "no-slash=3",
            "t/unknown=3",
            "t/sessions=x",
            "t/sessions",
            "/sessions=1",
        ] {
            let e = TenantLimits::default()
                .with_overrides([bad])
                .expect_err(bad);
            assert!(e.to_string().contains("TENANT/LIMIT=N"), "{e}");
        }
    }
}
