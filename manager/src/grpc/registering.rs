//! Registering: a `Register` becomes a [`Registration`] (resolving kinds through discovery),
//! then is authorized for the identity that sent it, up front and again while it lives.

use super::ServiceState;
use super::convert::{
    backoff_from_pb, deadline_from_pb, mapping_from_pb, mode_from_pb, namespaces_from_pb,
    resync_from_pb, translate_predicate_opt, translate_selector,
};
use crate::dispatch::dispatcher::Controller;
use crate::registration::{
    self, Invalid, NamespaceScope, Owned, Registration, ResourceRef, Watched,
};
use crate::tenancy::decision_cache::TtlCache;
use crate::tenancy::{Access, Identity};
use crate::throttle::TokenBucket;
use ctrlhub_proto::v1 as pb;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tonic::Status;

/// Discovery calls one tenant's Registers may cost at once: more than the most kinds one
/// Register can name (a primary, 32 owns and 32 watches), so any valid Register can be resolved...
pub(super) const DISCOVERY_BURST: u32 = 80;
/// ...then this many a second: a tenant naming ever new kinds that do not exist costs the API
/// server one discovery call a second, whatever it sends.
pub(super) const DISCOVERY_PER_SECOND: f64 = 1.0;
/// How long a kind found not served is answered from memory (a CRD installed meanwhile is seen
/// after this long): repeating a Register that names it costs no API call.
pub(super) const UNSERVED_TTL: Duration = Duration::from_secs(10);
/// Kinds remembered as not served at most (the cache evicts the oldest beyond).
const UNSERVED_ENTRIES: usize = 4096;
/// Tenants remembered before full (idle) buckets are forgotten.
const TENANTS_BEFORE_PRUNE: usize = 4096;

type Gvk = (String, String, String);

/// What discovery may cost: a budget per tenant and a short memory of kinds not served.
pub(super) struct DiscoveryBudget {
    per_tenant: Mutex<HashMap<String, TokenBucket>>,
    unserved: Mutex<TtlCache<Gvk, ()>>,
}

impl Default for DiscoveryBudget {
    fn default() -> Self {
        DiscoveryBudget {
            per_tenant: Mutex::new(HashMap::new()),
            unserved: Mutex::new(TtlCache::new(UNSERVED_ENTRIES)),
        }
    }
}

impl DiscoveryBudget {
    /// Takes `n` discovery calls from `tenant`'s budget, or says it is spent.
    fn charge(&self, tenant: &str, n: u32, now: Instant) -> bool {
        let mut buckets = self.per_tenant.lock();
        if buckets.len() >= TENANTS_BEFORE_PRUNE {
            buckets.retain(|_, b| !b.is_full(now));
        }
        buckets
            .entry(tenant.to_string())
            .or_insert_with(|| TokenBucket::new(DISCOVERY_BURST, DISCOVERY_PER_SECOND, now))
            .take_n(n, now)
    }

    fn is_unserved(&self, gvk: &Gvk, now: Instant) -> bool {
        self.unserved.lock().get(gvk, now).is_some()
    }
}

fn gvk_of(rt: &pb::ResourceType) -> Gvk {
    (rt.group.clone(), rt.version.clone(), rt.kind.clone())
}

impl ServiceState {
    /// Charges `tenant` (a tenant group) one discovery call for each distinct kind `r` names
    /// that is neither resolved already nor remembered as not served: RESOURCE_EXHAUSTED when
    /// its budget cannot pay for them all. Checked before anything is resolved, so a tenant's
    /// Registers cost the API server at most [`DISCOVERY_BURST`], then
    /// [`DISCOVERY_PER_SECOND`], discovery calls.
    pub(super) fn charge_discovery(&self, tenant: &str, r: &pb::Register) -> Result<(), Status> {
        let now = Instant::now();
        let named = r
            .primary
            .iter()
            .chain(r.owns.iter().filter_map(|o| o.resource.as_ref()))
            .chain(r.watches.iter().filter_map(|w| w.resource.as_ref()))
            // A Register naming more is refused by its shape check before any lookup.
            .take(1 + registration::bounds::OWNS + registration::bounds::WATCHES)
            .filter(|rt| !rt.version.is_empty() && !rt.kind.is_empty())
            .map(gvk_of)
            .collect::<HashSet<Gvk>>();
        let unknown = {
            let discovered = self.discovered.lock();
            named
                .iter()
                .filter(|k| !discovered.contains_key(*k) && !self.discovery.is_unserved(k, now))
                .count()
        };
        if unknown == 0 {
            return Ok(());
        }
        let n = u32::try_from(unknown).unwrap_or(u32::MAX);
        if self.discovery.charge(tenant, n, now) {
            return Ok(());
        }
        self.metrics.limit_hit(tenant, "discovery");
        Err(Status::resource_exhausted(format!(
            "this Register names {unknown} kind(s) the manager has not looked up yet, and tenant {tenant} has spent its discovery budget ({DISCOVERY_BURST} lookups at once, then {DISCOVERY_PER_SECOND} a second; kinds found not served are remembered for {}s). Check group, version and kind, and retry with backoff",
            UNSERVED_TTL.as_secs()
        )))
    }

    /// The domain registration a `Register` asks for, with every kind resolved.
    pub(super) async fn translate(&self, r: &pb::Register) -> Result<Registration, Invalid> {
        check_shape(r)?;
        registration::validate_name(&r.controller_name)?;
        let mode = mode_from_pb(r)?;
        let primary = self.resolve(r.primary.as_ref(), "register.primary").await?;
        let owns = self.owns(r).await?;
        let watches = self.watches(r).await?;
        let namespaces = namespaces_from_pb(r.namespaces.as_ref())?;
        if !primary.namespaced && !matches!(namespaces, NamespaceScope::All) {
            return Err(Invalid::new(
                "register.namespaces",
                format!(
                    "{} is cluster-scoped; leave the namespace scope unset",
                    primary.kind
                ),
            ));
        }
        let label_selector = match &r.label_selector {
            Some(sel) => Some(translate_selector(sel, "register.label_selector")?),
            None => None,
        };
        let predicate = translate_predicate_opt(r.predicate.as_ref(), "register.predicate")?;
        check_predicate_nodes(&predicate, &owns, &watches)?;
        Ok(Registration {
            name: r.controller_name.clone(),
            mode,
            primary,
            owns: registration::without_repeats(owns),
            watches: registration::without_repeats(watches),
            namespaces,
            label_selector,
            predicate,
            // 0 = no controller-wide bound: capacity is the sum of the sessions' credits.
            max_concurrent: r.max_concurrent_reconciles,
            deadline: deadline_from_pb(r.request_deadline.as_ref())?,
            resync: resync_from_pb(r.resync_period.as_ref())?,
            backoff: backoff_from_pb(r.backoff.as_ref())?,
            include_object: r.include_object,
        })
    }

    async fn owns(&self, r: &pb::Register) -> Result<Vec<Owned>, Invalid> {
        let mut owns = Vec::with_capacity(r.owns.len());
        for (i, o) in r.owns.iter().enumerate() {
            let field = format!("register.owns[{i}]");
            let predicate =
                translate_predicate_opt(o.predicate.as_ref(), &format!("{field}.predicate"))?;
            owns.push(Owned {
                resource: self
                    .resolve(o.resource.as_ref(), &format!("{field}.resource"))
                    .await?,
                controller_only: o.controller_only,
                predicate,
                metadata_only: o.metadata_only,
            });
        }
        Ok(owns)
    }

    async fn watches(&self, r: &pb::Register) -> Result<Vec<Watched>, Invalid> {
        let mut watches = Vec::with_capacity(r.watches.len());
        for (i, w) in r.watches.iter().enumerate() {
            let field = format!("register.watches[{i}]");
            let mapping = mapping_from_pb(w, &field)?;
            let predicate =
                translate_predicate_opt(w.predicate.as_ref(), &format!("{field}.predicate"))?;
            watches.push(Watched {
                resource: self
                    .resolve(w.resource.as_ref(), &format!("{field}.resource"))
                    .await?,
                mapping,
                predicate,
                metadata_only: w.metadata_only,
            });
        }
        Ok(watches)
    }

    /// The served resource a `ResourceType` names (discovery, cached per group/version/kind).
    async fn resolve(
        &self,
        rt: Option<&pb::ResourceType>,
        field: &str,
    ) -> Result<ResourceRef, Invalid> {
        let rt =
            rt.ok_or_else(|| Invalid::new(field, "is required: give group, version and kind"))?;
        if rt.version.is_empty() {
            return Err(Invalid::new(
                format!("{field}.version"),
                "is required (e.g. \"v1\")",
            ));
        }
        if rt.kind.is_empty() {
            return Err(Invalid::new(
                format!("{field}.kind"),
                "is required (e.g. \"ConfigMap\")",
            ));
        }
        let cache_key = gvk_of(rt);
        if let Some(found) = self.discovered.lock().get(&cache_key) {
            return Ok(found.clone());
        }
        let unserved = || {
            let gv = if rt.group.is_empty() {
                rt.version.clone()
            } else {
                format!("{}/{}", rt.group, rt.version)
            };
            Invalid::new(field, format!("kind {} in {gv} is not served by the API server (check group, version and kind, and that its CRD is installed)", rt.kind))
                .unserved(&rt.group, &rt.kind)
        };
        // Asked about recently and not served: answered without another discovery call.
        if self.discovery.is_unserved(&cache_key, Instant::now()) {
            return Err(unserved());
        }
        let gvk = kube::api::GroupVersionKind::gvk(&rt.group, &rt.version, &rt.kind);
        let (ar, caps) = match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok(found) => found,
            Err(_) => {
                self.discovery
                    .unserved
                    .lock()
                    .insert(cache_key, (), UNSERVED_TTL, Instant::now());
                return Err(unserved());
            }
        };
        if !rt.plural.is_empty() && rt.plural != ar.plural {
            return Err(Invalid::new(
                format!("{field}.plural"),
                format!(
                    "is {:?} but the API server serves {} as {:?}",
                    rt.plural, rt.kind, ar.plural
                ),
            ));
        }
        let resolved = ResourceRef {
            group: ar.group,
            version: ar.version,
            kind: ar.kind,
            plural: ar.plural,
            namespaced: caps.scope == kube::discovery::Scope::Namespaced,
        };
        self.discovered.lock().insert(cache_key, resolved.clone());
        Ok(resolved)
    }

    /// Whether `who` may register `reg`, and how. A namespace-label-selector scope is accepted
    /// without a cluster-wide grant: then each namespace enters it only after its own check
    /// (see [`crate::tenancy::namespace_gate::RbacNamespaceGate`]).
    pub(super) async fn authorize(
        &self,
        who: &Identity,
        reg: &Registration,
    ) -> Result<Grant, Status> {
        match &reg.namespaces {
            NamespaceScope::Names(names) => {
                self.require(who, reg, names).await?;
                Ok(Grant::Full)
            }
            NamespaceScope::All => {
                self.require(who, reg, &[String::new()]).await?;
                Ok(Grant::Full)
            }
            NamespaceScope::Selector(_) => {
                // A kind refused whatever RBAC says would be denied in every namespace: refuse
                // it now rather than accept a registration that can never deliver.
                if let Some(r) = watched_resources(reg)
                    .find(|r| self.authz.refused_outright(who, &r.group, &r.plural))
                {
                    return Err(denied(who, &r.group, &r.kind, "", self.authz.deny_ttl()));
                }
                match self.require(who, reg, &[String::new()]).await {
                    Ok(()) => Ok(Grant::Full),
                    Err(s) if s.code() == tonic::Code::PermissionDenied => Ok(Grant::PerNamespace),
                    Err(s) => Err(s),
                }
            }
        }
    }

    /// Re-authorize a live registration (the one `controller` runs) on the re-check interval:
    /// an error with PERMISSION_DENIED means access it relies on is gone. For a gated selector
    /// scope that is every namespace admitted so far (whoever's check admitted it: replicas
    /// share the scope).
    pub(super) async fn reauthorize(
        &self,
        who: &Identity,
        controller: &Controller,
    ) -> Result<(), Status> {
        let (reg, scope) = (&controller.registration, controller.scope());
        match &reg.namespaces {
            NamespaceScope::Names(names) => self.require(who, reg, names).await,
            NamespaceScope::Selector(_) if scope.is_gated() => {
                self.require(who, reg, &scope.admitted()).await
            }
            // All namespaces, or a selector scope filled without checks on a cluster-wide grant:
            // losing that grant ends the registration, and reconnecting gets per-namespace checks.
            _ => self.require(who, reg, &[String::new()]).await,
        }
    }

    /// PERMISSION_DENIED unless `who` may list and watch every resource of `reg` in each of
    /// `namespaces` ("" = all namespaces).
    async fn require(
        &self,
        who: &Identity,
        reg: &Registration,
        namespaces: &[String],
    ) -> Result<(), Status> {
        for r in watched_resources(reg) {
            for ns in namespaces {
                let allowed = self
                    .authz
                    .allowed(who, Access::Watch, &r.group, &r.plural, ns)
                    .await
                    .map_err(|e| Status::unavailable(e.to_string()))?;
                if !allowed {
                    return Err(denied(who, &r.group, &r.kind, ns, self.authz.deny_ttl()));
                }
            }
        }
        Ok(())
    }
}

/// What registering was allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Grant {
    /// Everything the registration asks for, in every namespace it covers.
    Full,
    /// A namespace label selector without a cluster-wide grant: each namespace enters the scope
    /// only after its own check, and admitted namespaces are what the re-check covers.
    PerNamespace,
}

/// The resources a registration lists and watches: its primary, what it owns, what it watches.
pub(super) fn watched_resources(reg: &Registration) -> impl Iterator<Item = &ResourceRef> {
    std::iter::once(&reg.primary)
        .chain(reg.owns.iter().map(|o| &o.resource))
        .chain(reg.watches.iter().map(|w| &w.resource))
}

/// A registration's denial. A kind the API server does not serve gets this same answer under
/// RBAC, so the message names only what the tenant sent and what to do: all namespaces need a
/// ClusterRole, one namespace a Role; `recheck` is how long the deny is cached.
pub(super) fn denied(
    who: &Identity,
    group: &str,
    kind: &str,
    ns: &str,
    recheck: std::time::Duration,
) -> Status {
    let kind = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    let grant = if ns.is_empty() {
        "ask for a ClusterRole granting list and watch, bound to this identity with a ClusterRoleBinding (or register named namespaces)"
    } else {
        "ask for a Role granting list and watch there, bound to this identity"
    };
    Status::permission_denied(format!(
        "{} may not list and watch {kind} in {}: {grant}; {}",
        who.username,
        namespace_phrase(ns),
        recheck_phrase(recheck)
    ))
}

/// When a cached deny is asked about again, for denial messages.
pub(super) fn recheck_phrase(recheck: std::time::Duration) -> String {
    format!(
        "denials are cached, so this is re-checked in {}",
        humantime::format_duration(recheck)
    )
}

/// `plural.group`, or just `plural` for the core group, as kubectl spells a resource.
pub(super) fn resource_name(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

pub(super) fn namespace_phrase(ns: &str) -> String {
    if ns.is_empty() {
        "all namespaces".to_string()
    } else {
        format!("namespace {ns}")
    }
}

/// Every event of a subscribed kind evaluates the registration's predicates for that kind, so
/// their nodes are bounded together, not only per tree: a registration of 64 trees of 1,000
/// nodes each would make every event cost 64,000 evaluations.
fn check_predicate_nodes(
    predicate: &Option<registration::predicate::Predicate>,
    owns: &[Owned],
    watches: &[Watched],
) -> Result<(), Invalid> {
    let nodes: usize = predicate
        .iter()
        .chain(owns.iter().filter_map(|o| o.predicate.as_ref()))
        .chain(watches.iter().filter_map(|w| w.predicate.as_ref()))
        .map(registration::predicate::Predicate::node_count)
        .sum();
    if nodes > registration::bounds::PREDICATE_NODES {
        return Err(Invalid::new(
            "register",
            format!(
                "its predicates (register.predicate and those of owns and watches) have {nodes} nodes together; the limit is {}: combine repeated conditions, or filter in the controller",
                registration::bounds::PREDICATE_NODES
            ),
        ));
    }
    Ok(())
}

/// The counts and size of a Register, checked before anything in it is resolved or compiled:
/// first the bounds that name a field (so the error says what to change), then the whole size.
fn check_shape(r: &pb::Register) -> Result<(), Invalid> {
    use prost::Message;
    use registration::{bounds, check_count};
    check_count("register.owns", r.owns.len(), bounds::OWNS)?;
    check_count("register.watches", r.watches.len(), bounds::WATCHES)?;
    if let Some(pb::namespace_scope::Scope::Names(n)) =
        r.namespaces.as_ref().and_then(|n| n.scope.as_ref())
    {
        check_count(
            "register.namespaces.names.names",
            n.names.len(),
            bounds::NAMESPACE_NAMES,
        )?;
    }
    if let Some(sel) = &r.label_selector {
        translate_selector(sel, "register.label_selector")?;
    }
    if let Some(pb::namespace_scope::Scope::LabelSelector(sel)) =
        r.namespaces.as_ref().and_then(|n| n.scope.as_ref())
    {
        translate_selector(sel, "register.namespaces.label_selector")?;
    }
    let bytes = r.encoded_len();
    if bytes > bounds::REGISTER_BYTES {
        return Err(Invalid::new(
            "register",
            format!(
                "is {bytes} bytes; the limit is {}: shorten predicates and selectors",
                bounds::REGISTER_BYTES
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_pays_for_new_kinds_up_to_its_burst_then_one_a_second() {
        let t0 = Instant::now();
        let budget = DiscoveryBudget::default();
        // The largest Register (a primary, 32 owns, 32 watches, all new) fits the burst...
        assert!(budget.charge("team-a", 65, t0));
        // ...and what is left of it, then nothing until it refills.
        assert!(budget.charge("team-a", DISCOVERY_BURST - 65, t0));
        assert!(!budget.charge("team-a", 1, t0));
        assert!(
            budget.charge("team-b", 1, t0),
            "another tenant has its own budget"
        );
        assert!(budget.charge("team-a", 1, t0 + Duration::from_secs(1)));
        assert!(!budget.charge("team-a", 2, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn a_kind_not_served_is_remembered_briefly() {
        let t0 = Instant::now();
        let budget = DiscoveryBudget::default();
        let gvk = (
            "nowhere.example".to_string(),
            "v1".to_string(),
            "Missing".to_string(),
        );
        budget
            .unserved
            .lock()
            .insert(gvk.clone(), (), UNSERVED_TTL, t0);
        assert!(budget.is_unserved(&gvk, t0 + UNSERVED_TTL - Duration::from_millis(1)));
        assert!(
            !budget.is_unserved(&gvk, t0 + UNSERVED_TTL),
            "asked again after the TTL"
        );
    }
}
