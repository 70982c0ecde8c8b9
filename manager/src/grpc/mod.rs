//! The gRPC edge: `ctrlhub.v1.ControllerManager`. Protobuf types stop here — registrations are
//! translated into domain types (with errors naming the offending field), and domain requests
//! and outcomes are translated back.

use crate::dispatch::controllers::{AdmittedNamespaces, ControllerTable, RegisterError};
use crate::dispatch::dispatcher::{
    Completion, Controller, Outbound, Payload, Request, RevokeReason, TraceContext,
};
use crate::dispatch::queue::{Backoff, Outcome, Reason};
use crate::informer::object::CachedObject;
use crate::informer::{InformerKey, ObjectKey};
use crate::leader::LeaderState;
use crate::registration::predicate::{
    self, LabelSelector, LabelSelectorRequirement, Predicate, SelectorOperator,
};
use crate::registration::{
    self, Invalid, Mapping, Mode, NamespaceScope, Owned, Registration, ResourceRef, Watched,
    defaults,
};
use crate::tenancy::{
    Access, AuthError, Authenticator, Authorizer, AuthzError, BoxFuture, Identity, NamespaceGate,
};
use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_server::ControllerManager;
use futures::Stream;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tonic::{Request as GrpcRequest, Response, Status, Streaming};

/// How long a new stream may take to send its Register.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Shared state behind the gRPC service.
pub struct ServiceState {
    controllers: Arc<ControllerTable>,
    client: kube::Client,
    authn: Arc<dyn Authenticator>,
    authz: Arc<dyn Authorizer>,
    leader: watch::Receiver<LeaderState>,
    discovered: Mutex<HashMap<(String, String, String), ResourceRef>>,
    sessions: Mutex<HashMap<String, (Identity, Arc<Controller>)>>,
    metrics: Arc<crate::metrics::Metrics>,
    /// Answer a registration naming an unserved kind like a denied one (set under RBAC).
    conceal_unserved: bool,
    /// How often live registrations are re-authorized (under RBAC).
    recheck: Option<Duration>,
}

impl ServiceState {
    /// RBAC mode: live registrations are re-authorized every `recheck` and revoked with
    /// PERMISSION_DENIED when access is gone, and a kind that does not exist is reported
    /// exactly as a denied one would be.
    pub fn with_rbac(mut self, recheck: Duration) -> Self {
        self.conceal_unserved = true;
        self.recheck = Some(recheck);
        self
    }

    /// A service over `controllers`.
    pub fn new(
        controllers: Arc<ControllerTable>,
        client: kube::Client,
        authn: Arc<dyn Authenticator>,
        authz: Arc<dyn Authorizer>,
        leader: watch::Receiver<LeaderState>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        ServiceState {
            controllers,
            client,
            authn,
            authz,
            leader,
            discovered: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            metrics,
            conceal_unserved: false,
            recheck: None,
        }
    }

    async fn authenticate<T>(&self, req: &GrpcRequest<T>) -> Result<Identity, Status> {
        let token =
            bearer_token(req.metadata()).map_err(|e| Status::unauthenticated(e.to_string()))?;
        self.authn.authenticate(token).await.map_err(|e| match e {
            AuthError::Unavailable(_) => Status::unavailable(e.to_string()),
            _ => Status::unauthenticated(e.to_string()),
        })
    }

    fn require_leader(&self) -> Result<(), Status> {
        let state = self.leader.borrow().clone();
        if state.leading {
            return Ok(());
        }
        let leader = state
            .holder
            .unwrap_or_else(|| "unknown (election in progress)".into());
        let mut status = Status::unavailable(format!(
            "this ctrlhub manager is a standby; the leader is {leader}. Reconnect (through the Service, which selects the leader) with backoff"
        ));
        if let Ok(v) = leader.parse() {
            status.metadata_mut().insert("ctrlhub-leader", v);
        }
        Err(status)
    }

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
        let cache_key = (rt.group.clone(), rt.version.clone(), rt.kind.clone());
        if let Some(found) = self.discovered.lock().get(&cache_key) {
            return Ok(found.clone());
        }
        let gvk = kube::api::GroupVersionKind::gvk(&rt.group, &rt.version, &rt.kind);
        let (ar, caps) = kube::discovery::pinned_kind(&self.client, &gvk).await.map_err(|_| {
            let gv = if rt.group.is_empty() { rt.version.clone() } else { format!("{}/{}", rt.group, rt.version) };
            Invalid::new(field, format!("kind {} in {gv} is not served by the API server (check group, version and kind, and that its CRD is installed)", rt.kind))
                .unserved(&rt.group, &rt.kind)
        })?;
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

    async fn translate(&self, r: &pb::Register) -> Result<Registration, Invalid> {
        registration::validate_name(&r.controller_name)?;
        let mode = match pb::register::Mode::try_from(r.mode) {
            Ok(pb::register::Mode::Unspecified | pb::register::Mode::Reconcile) => Mode::Reconcile,
            Ok(pb::register::Mode::Events) => {
                if !r.owns.is_empty() || !r.watches.is_empty() {
                    return Err(Invalid::new(
                        if r.owns.is_empty() {
                            "register.watches"
                        } else {
                            "register.owns"
                        },
                        "MODE_EVENTS delivers the primary's own changes; owns and watches map to keys and need MODE_RECONCILE",
                    ));
                }
                Mode::Events
            }
            Err(_) => {
                return Err(Invalid::new(
                    "register.mode",
                    format!("unknown mode {}", r.mode),
                ));
            }
        };
        let primary = self.resolve(r.primary.as_ref(), "register.primary").await?;
        let mut owns = Vec::new();
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
            });
        }
        let mut watches = Vec::new();
        for (i, w) in r.watches.iter().enumerate() {
            let field = format!("register.watches[{i}]");
            let mapping = match &w.mapping {
                Some(pb::watched_resource::Mapping::LabelKey(k)) if !k.is_empty() => {
                    Mapping::Label(k.clone())
                }
                Some(pb::watched_resource::Mapping::AnnotationKey(k)) if !k.is_empty() => {
                    Mapping::Annotation(k.clone())
                }
                Some(pb::watched_resource::Mapping::FieldPath(p)) if !p.is_empty() => {
                    Mapping::Field(p.trim_start_matches('.').to_string())
                }
                _ => {
                    return Err(Invalid::new(
                        format!("{field}.mapping"),
                        "set one of label_key, annotation_key or field_path (non-empty)",
                    ));
                }
            };
            let predicate =
                translate_predicate_opt(w.predicate.as_ref(), &format!("{field}.predicate"))?;
            watches.push(Watched {
                resource: self
                    .resolve(w.resource.as_ref(), &format!("{field}.resource"))
                    .await?,
                mapping,
                predicate,
            });
        }
        let namespaces = match r.namespaces.as_ref().and_then(|n| n.scope.as_ref()) {
            None | Some(pb::namespace_scope::Scope::All(_)) => NamespaceScope::All,
            Some(pb::namespace_scope::Scope::Names(n)) => {
                if n.names.is_empty() {
                    return Err(Invalid::new(
                        "register.namespaces.names.names",
                        "must list at least one namespace (use `all` for every namespace)",
                    ));
                }
                for (i, name) in n.names.iter().enumerate() {
                    if !is_dns_label(name) {
                        return Err(Invalid::new(
                            format!("register.namespaces.names.names[{i}]"),
                            format!("{name:?} is not a valid namespace name"),
                        ));
                    }
                }
                NamespaceScope::Names(n.names.clone())
            }
            Some(pb::namespace_scope::Scope::LabelSelector(sel)) => NamespaceScope::Selector(
                translate_selector(sel, "register.namespaces.label_selector")?,
            ),
        };
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
        // 0 = no controller-wide bound: capacity is the sum of the sessions' credits.
        let max_concurrent = r.max_concurrent_reconciles;
        let deadline = match &r.request_deadline {
            None => defaults::DEADLINE,
            Some(d) => duration(d, "register.request_deadline")?
                .filter(|d| !d.is_zero())
                .unwrap_or(defaults::DEADLINE),
        };
        let resync = match &r.resync_period {
            None => Some(defaults::RESYNC),
            Some(d) => duration(d, "register.resync_period")?.filter(|d| !d.is_zero()),
        };
        let mut backoff = Backoff::default();
        if let Some(b) = &r.backoff {
            if let Some(base) = b.base.as_ref() {
                backoff.base = duration(base, "register.backoff.base")?
                    .filter(|d| !d.is_zero())
                    .unwrap_or(backoff.base);
            }
            if let Some(max) = b.max.as_ref() {
                backoff.max = duration(max, "register.backoff.max")?
                    .filter(|d| !d.is_zero())
                    .unwrap_or(backoff.max);
            }
            if backoff.base > backoff.max {
                return Err(Invalid::new("register.backoff", "base must not exceed max"));
            }
        }
        Ok(Registration {
            name: r.controller_name.clone(),
            mode,
            primary,
            owns,
            watches,
            namespaces,
            label_selector,
            predicate,
            max_concurrent,
            deadline,
            resync,
            backoff,
            include_object: r.include_object,
        })
    }

    /// Whether `who` may register `reg`, and how. A namespace-label-selector scope is accepted
    /// without a cluster-wide grant: then each namespace enters it only after its own check
    /// (see [`RbacNamespaceGate`]).
    async fn authorize(&self, who: &Identity, reg: &Registration) -> Result<Grant, Status> {
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
                    return Err(denied(who, &r.group, &r.kind, ""));
                }
                match self.require(who, reg, &[String::new()]).await {
                    Ok(()) => Ok(Grant::Full),
                    Err(s) if s.code() == tonic::Code::PermissionDenied => Ok(Grant::PerNamespace),
                    Err(s) => Err(s),
                }
            }
        }
    }

    /// Re-authorize a live registration on the re-check interval: an error with
    /// PERMISSION_DENIED means access it relies on is gone. For a gated selector scope that is
    /// every namespace admitted so far (whoever's check admitted it: replicas share the scope).
    async fn reauthorize(
        &self,
        who: &Identity,
        reg: &Registration,
        scope: Option<&AdmittedNamespaces>,
    ) -> Result<(), Status> {
        match (&reg.namespaces, scope) {
            (NamespaceScope::Names(names), _) => self.require(who, reg, names).await,
            (NamespaceScope::Selector(_), Some(scope)) if scope.is_gated() => {
                self.require(who, reg, &scope.namespaces()).await
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
                    return Err(denied(who, &r.group, &r.kind, ns));
                }
            }
        }
        Ok(())
    }

    fn session(&self, id: &str) -> Result<(Identity, Arc<Controller>), Status> {
        self.sessions
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| Status::failed_precondition(format!("unknown session_id {id:?}: use the session_id from Registered of a live Connect stream")))
    }

    /// The informers a cached read may use: the session must be live and the caller's own, and
    /// the kind one the session registered.
    async fn cached_read(
        &self,
        identity: &Identity,
        session_id: &str,
        rt: Option<&pb::ResourceType>,
        namespace: &str,
    ) -> Result<Vec<Arc<crate::informer::Informer>>, Status> {
        let (owner, controller) = self.session(session_id)?;
        if &owner != identity {
            return Err(Status::permission_denied(
                "session_id belongs to another identity",
            ));
        }
        let informers = self.readable_informers(&controller, rt)?;
        // Registering granted list+watch; reading from the cache also needs get+list, checked
        // for the namespace asked about ("" = all, which needs a cluster-wide grant).
        if let Some(plural) = informers.first().map(|i| i.key().plural.clone()) {
            let group = informers[0].key().group.clone();
            let allowed = self
                .authz
                .allowed(identity, Access::Read, &group, &plural, namespace)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            if !allowed {
                return Err(Status::permission_denied(format!(
                    "{} may not get and list {} in {}",
                    identity.username,
                    resource_name(&group, &plural),
                    namespace_phrase(namespace)
                )));
            }
        }
        Ok(informers)
    }

    fn readable_informers(
        &self,
        controller: &Controller,
        rt: Option<&pb::ResourceType>,
    ) -> Result<Vec<Arc<crate::informer::Informer>>, Status> {
        let rt = rt.ok_or_else(|| Status::invalid_argument("resource: is required"))?;
        let reg = &controller.registration;
        let registered = std::iter::once(&reg.primary)
            .chain(reg.owns.iter().map(|o| &o.resource))
            .chain(reg.watches.iter().map(|w| &w.resource))
            .any(|r| {
                r.group == rt.group
                    && r.kind == rt.kind
                    && (rt.version.is_empty() || r.version == rt.version)
            });
        if !registered {
            return Err(Status::failed_precondition(format!(
                "resource: {} is not a kind this session registered (primary, owns or watches); only those are cached",
                rt.kind
            )));
        }
        let informers: Vec<_> = self
            .controllers
            .cache()
            .all()
            .into_iter()
            .filter(|i| {
                let k: &InformerKey = i.key();
                k.group == rt.group && k.kind == rt.kind
            })
            .collect();
        Ok(informers)
    }
}

/// What registering was allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grant {
    /// Everything the registration asks for, in every namespace it covers.
    Full,
    /// A namespace label selector without a cluster-wide grant: each namespace enters the scope
    /// only after its own check, and admitted namespaces are what the re-check covers.
    PerNamespace,
}

/// The resources a registration lists and watches: its primary, what it owns, what it watches.
fn watched_resources(reg: &Registration) -> impl Iterator<Item = &ResourceRef> {
    std::iter::once(&reg.primary)
        .chain(reg.owns.iter().map(|o| &o.resource))
        .chain(reg.watches.iter().map(|w| &w.resource))
}

/// Admits a namespace into a label-selector scope when the registering identity may list and
/// watch every resource of the registration there: the same check a registration naming that
/// namespace passes, made as the namespace enters the scope instead of up front.
struct RbacNamespaceGate {
    authz: Arc<dyn Authorizer>,
    who: Identity,
    /// (group, plural) of each watched resource.
    resources: Vec<(String, String)>,
}

impl NamespaceGate for RbacNamespaceGate {
    fn admit<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<bool, AuthzError>> {
        Box::pin(async move {
            for (group, plural) in &self.resources {
                if !self
                    .authz
                    .allowed(&self.who, Access::Watch, group, plural, namespace)
                    .await?
                {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    fn retry_after(&self) -> Duration {
        // A deny is cached this long: asking sooner would get the cached answer.
        self.authz.deny_ttl()
    }
}

/// A registration's denial. A kind the API server does not serve gets this same answer under
/// RBAC, so the message names only what the tenant sent and what to do.
fn denied(who: &Identity, group: &str, kind: &str, ns: &str) -> Status {
    let kind = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    Status::permission_denied(format!(
        "{} may not list and watch {kind} in {}: ask for a Role granting list and watch there, bound to this identity",
        who.username,
        namespace_phrase(ns)
    ))
}

/// `plural.group`, or just `plural` for the core group, as kubectl spells a resource.
fn resource_name(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn namespace_phrase(ns: &str) -> String {
    if ns.is_empty() {
        "all namespaces".to_string()
    } else {
        format!("namespace {ns}")
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Longer durations mean "never" and are treated as this (a century), so that adding one to
/// `Instant::now()` or `SystemTime::now()` anywhere in the manager cannot overflow.
pub const LONGEST_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn duration(d: &prost_types::Duration, field: &str) -> Result<Option<Duration>, Invalid> {
    if d.seconds < 0 || d.nanos < 0 {
        return Err(Invalid::new(field, "must not be negative"));
    }
    let secs = u64::try_from(d.seconds).map_err(|_| Invalid::new(field, "out of range"))?;
    let nanos = u32::try_from(d.nanos).map_err(|_| Invalid::new(field, "out of range"))?;
    let exact = Duration::from_secs(secs).saturating_add(Duration::from_nanos(u64::from(nanos)));
    Ok(Some(exact.min(LONGEST_DURATION)))
}

fn translate_selector(sel: &pb::LabelSelector, field: &str) -> Result<LabelSelector, Invalid> {
    let mut out = LabelSelector {
        match_labels: sel.match_labels.clone().into_iter().collect(),
        match_expressions: Vec::new(),
    };
    for (i, e) in sel.match_expressions.iter().enumerate() {
        let operator = match pb::label_selector_requirement::Operator::try_from(e.operator) {
            Ok(pb::label_selector_requirement::Operator::In) => SelectorOperator::In,
            Ok(pb::label_selector_requirement::Operator::NotIn) => SelectorOperator::NotIn,
            Ok(pb::label_selector_requirement::Operator::Exists) => SelectorOperator::Exists,
            Ok(pb::label_selector_requirement::Operator::DoesNotExist) => {
                SelectorOperator::DoesNotExist
            }
            _ => {
                return Err(Invalid::new(
                    format!("{field}.match_expressions[{i}].operator"),
                    "must be one of OPERATOR_IN, OPERATOR_NOT_IN, OPERATOR_EXISTS, OPERATOR_DOES_NOT_EXIST",
                ));
            }
        };
        out.match_expressions.push(LabelSelectorRequirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone(),
        });
    }
    out.validate_at(field)
        .map_err(|e| Invalid::new(e.path().to_string(), e.to_string()))?;
    Ok(out)
}

fn translate_predicate_opt(
    p: Option<&pb::Predicate>,
    field: &str,
) -> Result<Option<Predicate>, Invalid> {
    let Some(p) = p else { return Ok(None) };
    let out = translate_predicate(p, field, 0)?;
    out.validate_at(field)
        .map_err(|e| Invalid::new(e.path().to_string(), e.to_string()))?;
    Ok(Some(out))
}

fn translate_predicate(p: &pb::Predicate, field: &str, depth: usize) -> Result<Predicate, Invalid> {
    use pb::predicate::Predicate as P;
    if depth > predicate::MAX_DEPTH {
        return Err(Invalid::new(
            field,
            format!(
                "predicate nesting exceeds the maximum depth of {}",
                predicate::MAX_DEPTH
            ),
        ));
    }
    let list = |ps: &[pb::Predicate], name: &str| -> Result<Vec<Predicate>, Invalid> {
        ps.iter()
            .enumerate()
            .map(|(i, p)| {
                translate_predicate(p, &format!("{field}.{name}.predicates[{i}]"), depth + 1)
            })
            .collect()
    };
    Ok(match p.predicate.as_ref() {
        None => {
            return Err(Invalid::new(
                field,
                "set one predicate (e.g. generation_changed)",
            ));
        }
        Some(P::GenerationChanged(_)) => Predicate::GenerationChanged,
        Some(P::LabelsChanged(_)) => Predicate::LabelsChanged,
        Some(P::AnnotationsChanged(_)) => Predicate::AnnotationsChanged,
        Some(P::ResourceVersionChanged(_)) => Predicate::ResourceVersionChanged,
        Some(P::LabelSelector(sel)) => {
            Predicate::LabelSelector(translate_selector(sel, &format!("{field}.label_selector"))?)
        }
        Some(P::Deleting(_)) => Predicate::Deleting,
        Some(P::HasFinalizer(f)) => Predicate::HasFinalizer(f.name.clone()),
        Some(P::AllOf(a)) => Predicate::AllOf(list(&a.predicates, "all_of")?),
        Some(P::AnyOf(a)) => Predicate::AnyOf(list(&a.predicates, "any_of")?),
        Some(P::Negate(n)) => Predicate::Not(Box::new(translate_predicate(
            n,
            &format!("{field}.negate"),
            depth + 1,
        )?)),
    })
}

fn reason_to_pb(r: Reason, background: bool) -> pb::reconcile_request::Reason {
    use pb::reconcile_request::Reason as R;
    match r {
        Reason::Event => R::Updated,
        Reason::Resync if background => R::Resync,
        Reason::Resync => R::Updated,
        Reason::Scheduled | Reason::RequeueAfter => R::Requeue,
        Reason::Backoff => R::Retry,
        Reason::Redelivery => R::Redelivery,
    }
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn request_to_pb(r: &Request) -> pb::ReconcileRequest {
    let mut reasons: Vec<i32> = r
        .reasons
        .iter()
        .map(|x| reason_to_pb(*x, r.background) as i32)
        .collect();
    let object = match &r.payload {
        Payload::None => None,
        Payload::Object(o) => Some(pb::reconcile_request::Object::ObjectJson(o.json().to_vec())),
        Payload::Tombstone {
            last,
            final_state_unknown,
        } => {
            reasons.push(pb::reconcile_request::Reason::Deleted as i32);
            let json = if last.is_null() {
                Vec::new()
            } else {
                serde_json::to_vec(last.as_ref()).unwrap_or_default()
            };
            Some(pb::reconcile_request::Object::Tombstone(pb::Tombstone {
                object_json: json,
                final_state_unknown: *final_state_unknown,
            }))
        }
    };
    reasons.sort_unstable();
    reasons.dedup();
    pb::ReconcileRequest {
        id: r.id.clone(),
        key: Some(pb::ObjectKey {
            namespace: r.key.namespace.clone(),
            name: r.key.name.clone(),
        }),
        attempt: r.attempt,
        reasons,
        object,
        deadline: Some(timestamp(r.deadline)),
        traceparent: r.trace.traceparent.clone(),
        tracestate: r.trace.tracestate.clone(),
    }
}

fn event_to_pb(
    id: &str,
    d: &crate::dispatch::event_queue::Delivery,
    deadline: SystemTime,
    trace: TraceContext,
) -> pb::Event {
    use crate::dispatch::event_queue::EventType as T;
    let kind = match d.event.kind {
        T::Added => pb::event::Type::Added,
        T::Modified => pb::event::Type::Modified,
        T::Deleted => pb::event::Type::Deleted,
        T::Sync => pb::event::Type::Sync,
    };
    pb::Event {
        id: id.to_string(),
        key: Some(pb::ObjectKey {
            namespace: d.key.namespace.clone(),
            name: d.key.name.clone(),
        }),
        r#type: kind as i32,
        object_json: serde_json::to_vec(d.event.object.as_ref()).unwrap_or_default(),
        sequence: d.event.sequence,
        attempt: d.attempt,
        deadline: Some(timestamp(deadline)),
        traceparent: trace.traceparent,
        tracestate: trace.tracestate,
    }
}

/// The controller's error text of a result, for the status page's recent errors.
fn result_message(r: &pb::ReconcileResult) -> &str {
    use pb::reconcile_result::Outcome as O;
    match r.outcome.as_ref() {
        Some(O::Error(e)) => &e.message,
        Some(O::Terminal(t)) => &t.message,
        _ => "",
    }
}

/// tonic refuses an oversized message before reading it, with OUT_OF_RANGE; gRPC's code for a
/// message over the receiver's limit is RESOURCE_EXHAUSTED, and the user needs to know which knob.
fn inbound_error(e: Status) -> Status {
    if e.code() == tonic::Code::OutOfRange {
        Status::resource_exhausted(format!(
            "{}; send smaller messages or raise the manager's --max-message-bytes",
            e.message()
        ))
    } else {
        e
    }
}

/// Stops the re-authorization task when its session ends.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The bearer token of a request, without ever putting it into an error.
fn bearer_token(metadata: &tonic::metadata::MetadataMap) -> Result<&str, AuthError> {
    let Some(value) = metadata.get("authorization") else {
        return Err(AuthError::Missing);
    };
    let header = value.to_str().map_err(|_| AuthError::Malformed)?;
    let token = header
        .strip_prefix("Bearer ")
        .map(str::trim)
        .ok_or(AuthError::Malformed)?;
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(AuthError::Malformed);
    }
    Ok(token)
}

fn outcome_from_pb(r: &pb::ReconcileResult) -> Result<Outcome, Invalid> {
    use pb::reconcile_result::Outcome as O;
    Ok(match r.outcome.as_ref() {
        Some(O::Done(_)) => Outcome::Done,
        Some(O::RequeueAfter(ra)) => Outcome::RequeueAfter(
            ra.delay
                .as_ref()
                .map(|d| duration(d, "result.requeue_after.delay"))
                .transpose()?
                .flatten()
                .unwrap_or_default(),
        ),
        Some(O::Error(e)) => Outcome::Error {
            retry_after: e
                .retry_after
                .as_ref()
                .map(|d| duration(d, "result.error.retry_after"))
                .transpose()?
                .flatten(),
        },
        Some(O::Terminal(_)) => Outcome::Terminal,
        // An empty outcome is a controller bug; retrying is the safe reading.
        None => Outcome::Error { retry_after: None },
    })
}

fn resource_to_pb(r: &ResourceRef) -> pb::ResourceType {
    pb::ResourceType {
        group: r.group.clone(),
        version: r.version.clone(),
        kind: r.kind.clone(),
        plural: r.plural.clone(),
    }
}

/// The gRPC service: a cheap handle on [`ServiceState`].
#[derive(Clone)]
pub struct Service(pub Arc<ServiceState>);

impl std::ops::Deref for Service {
    type Target = ServiceState;
    fn deref(&self) -> &ServiceState {
        &self.0
    }
}

type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::ManagerMessage, Status>> + Send>>;

fn msg(m: pb::manager_message::Message) -> pb::ManagerMessage {
    pb::ManagerMessage { message: Some(m) }
}

#[tonic::async_trait]
impl ControllerManager for Service {
    type ConnectStream = ConnectStream;

    async fn connect(
        &self,
        req: GrpcRequest<Streaming<pb::ControllerMessage>>,
    ) -> Result<Response<ConnectStream>, Status> {
        let result = self.open(req).await;
        if let Err(status) = &result {
            self.metrics.rejected(&format!("{:?}", status.code()));
        }
        result
    }

    async fn get(
        &self,
        req: GrpcRequest<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        self.read_one(req).await
    }

    async fn list(
        &self,
        req: GrpcRequest<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        self.read_many(req).await
    }
}

impl Service {
    /// Authenticate, register and start a session (the body of Connect).
    async fn open(
        &self,
        req: GrpcRequest<Streaming<pb::ControllerMessage>>,
    ) -> Result<Response<ConnectStream>, Status> {
        let identity = self.authenticate(&req).await?;
        self.require_leader()?;
        let mut inbound = req.into_inner();
        let first = tokio::time::timeout(REGISTER_TIMEOUT, inbound.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded("no Register message within 30s of opening the stream")
            })?
            .map_err(|e| {
                if e.code() == tonic::Code::OutOfRange {
                    self.metrics.limit_hit(&identity.tenant, "message_bytes");
                }
                inbound_error(e)
            })?
            .ok_or_else(|| Status::cancelled("the stream closed before Register"))?;
        let register = match first.message {
            Some(pb::controller_message::Message::Register(r)) => *r,
            _ => {
                return Err(Status::invalid_argument(
                    "register: the first message on a Connect stream must be Register",
                ));
            }
        };
        let registration = match self.translate(&register).await {
            Ok(r) => r,
            Err(Invalid {
                unserved: Some((group, kind)),
                ..
            }) if self.conceal_unserved => {
                let ns = match register.namespaces.as_ref().and_then(|n| n.scope.as_ref()) {
                    Some(pb::namespace_scope::Scope::Names(n)) => {
                        n.names.first().cloned().unwrap_or_default()
                    }
                    _ => String::new(),
                };
                return Err(denied(&identity, &group, &kind, &ns));
            }
            Err(e) => return Err(Status::invalid_argument(e.to_string())),
        };
        let grant = self.authorize(&identity, &registration).await?;
        let gate: Option<Arc<dyn NamespaceGate>> = (grant == Grant::PerNamespace).then(|| {
            Arc::new(RbacNamespaceGate {
                authz: self.authz.clone(),
                who: identity.clone(),
                resources: watched_resources(&registration)
                    .map(|r| (r.group.clone(), r.plural.clone()))
                    .collect(),
            }) as Arc<dyn NamespaceGate>
        });
        let credits = match (register.max_in_flight, registration.max_concurrent) {
            (0, 0) => defaults::MAX_IN_FLIGHT,
            (0, max) => max,
            (credits, _) => credits,
        };
        let attached = self
            .controllers
            .attach_gated(&identity.tenant, registration.clone(), credits, gate)
            .map_err(|e| match e {
                RegisterError::Invalid(i) => Status::invalid_argument(i.to_string()),
                RegisterError::OutsideCeiling(m) => Status::permission_denied(m),
                limit @ RegisterError::Limit { .. } => {
                    Status::resource_exhausted(limit.to_string())
                }
                closing @ RegisterError::ShuttingDown => Status::unavailable(closing.to_string()),
            })?;
        let credits = attached.credits;
        let scope = attached.scope.clone();
        let controller = attached.controller.clone();
        let session_num = attached.session;
        let session_id = format!("{}-{}", controller.id.name, uuid::Uuid::new_v4());
        self.sessions
            .lock()
            .insert(session_id.clone(), (identity.clone(), controller.clone()));
        tracing::info!(controller = %controller.id, session = %session_id, credits, "session attached");

        let mut effective = register.clone();
        effective.max_concurrent_reconciles = registration.max_concurrent;
        effective.max_in_flight = credits;
        effective.request_deadline =
            Some(prost_types::Duration::try_from(registration.deadline).unwrap_or_default());
        effective.resync_period = Some(
            prost_types::Duration::try_from(registration.resync.unwrap_or_default())
                .unwrap_or_default(),
        );
        effective.backoff = Some(pb::Backoff {
            base: prost_types::Duration::try_from(registration.backoff.base).ok(),
            max: prost_types::Duration::try_from(registration.backoff.max).ok(),
        });
        let mut readable = vec![pb::ReadableResource {
            resource: Some(resource_to_pb(&registration.primary)),
            metadata_only: false,
        }];
        readable.extend(registration.owns.iter().map(|o| pb::ReadableResource {
            resource: Some(resource_to_pb(&o.resource)),
            metadata_only: true,
        }));
        readable.extend(registration.watches.iter().map(|w| pb::ReadableResource {
            resource: Some(resource_to_pb(&w.resource)),
            metadata_only: !matches!(w.mapping, Mapping::Field(_)),
        }));
        let registered = pb::Registered {
            session_id: session_id.clone(),
            leader_identity: self.leader.borrow().holder.clone().unwrap_or_default(),
            effective: Some(effective),
            readable,
        };

        let recheck = self.recheck.map(|every| {
            let (service, who, reg, controller, scope) = (
                self.clone(),
                identity.clone(),
                registration.clone(),
                controller.clone(),
                scope.clone(),
            );
            AbortOnDrop(
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(every);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    tick.tick().await;
                    loop {
                        tick.tick().await;
                        match service.reauthorize(&who, &reg, scope.as_ref()).await {
                            Err(denied) if denied.code() == tonic::Code::PermissionDenied => {
                                tracing::warn!(controller = %controller.id, user = %who.username, "permission revoked; ending the registration's sessions");
                                controller.revoke_all(RevokeReason::PermissionRevoked, denied.message());
                                return;
                            }
                            // An API outage is not a revocation: keep the session, ask again.
                            _ => {}
                        }
                    }
                })
                .abort_handle(),
            )
        });
        let (tx, rx) = mpsc::channel::<Result<pb::ManagerMessage, Status>>(256);
        let service = self.clone();
        let mut outbound = attached.outbound;
        tokio::spawn(async move {
            let _recheck = recheck;
            let _ = tx
                .send(Ok(msg(pb::manager_message::Message::Registered(Box::new(
                    registered,
                )))))
                .await;
            let end: Option<Status> = loop {
                tokio::select! {
                    out = outbound.recv() => match out {
                        Some(Outbound::Reconcile(r)) if scope.as_ref().is_some_and(|s| !s.contains(&r.key.namespace)) => {
                            // Resync and retries re-deliver keys the controller has cached, from
                            // every namespace: one outside the admitted scope (never admitted, or
                            // left it) must not leave the manager, so it is settled here unseen.
                            tracing::debug!(controller = %controller.id, namespace = %r.key.namespace, "key outside the namespace scope withheld");
                            controller.complete(session_num, &r.id, Outcome::Done, "");
                        }
                        Some(Outbound::Reconcile(r)) => {
                            if tx.send(Ok(msg(pb::manager_message::Message::Reconcile(request_to_pb(&r))))).await.is_err() {
                                break None;
                            }
                        }
                        Some(Outbound::Revoke { reason, message }) => {
                            let (r, status) = match reason {
                                RevokeReason::LeadershipLost => (pb::revoked::Reason::LeadershipLost, Status::unavailable(message.clone())),
                                RevokeReason::Superseded => (pb::revoked::Reason::Superseded, Status::aborted(message.clone())),
                                RevokeReason::ShuttingDown => (pb::revoked::Reason::ShuttingDown, Status::unavailable(message.clone())),
                                RevokeReason::PermissionRevoked => (pb::revoked::Reason::PermissionRevoked, Status::permission_denied(message.clone())),
                                RevokeReason::QuotaExceeded => (pb::revoked::Reason::QuotaExceeded, Status::resource_exhausted(message.clone())),
                            };
                            let revoked = pb::Revoked { reason: r as i32, code: status.code() as i32, message, leader_identity: String::new() };
                            let _ = tx.send(Ok(msg(pb::manager_message::Message::Revoked(revoked)))).await;
                            break Some(status);
                        }
                        Some(Outbound::Event { id, delivery, .. }) if scope.as_ref().is_some_and(|s| !s.contains(&delivery.key.namespace)) => {
                            tracing::debug!(controller = %controller.id, namespace = %delivery.key.namespace, "event outside the namespace scope withheld");
                            controller.ack(session_num, &id);
                        }
                        Some(Outbound::Event { id, delivery, deadline, trace }) => {
                            if tx.send(Ok(msg(pb::manager_message::Message::Event(event_to_pb(&id, &delivery, deadline, trace))))).await.is_err() {
                                break None;
                            }
                        }
                        Some(Outbound::Drained) => break Some(Status::ok("drained")),
                        None => break None,
                    },
                    incoming = inbound.message() => match incoming {
                        Ok(Some(m)) => match m.message {
                            Some(pb::controller_message::Message::Result(result)) => {
                                match outcome_from_pb(&result) {
                                    Ok(outcome) => {
                                        if controller.complete(session_num, &result.id, outcome, result_message(&result)) == Completion::Discarded {
                                            tracing::debug!(controller = %controller.id, id = %result.id, "late or unknown result discarded");
                                        }
                                    }
                                    Err(e) => break Some(Status::invalid_argument(e.to_string())),
                                }
                            }
                            Some(pb::controller_message::Message::Credit(c)) => controller.set_credits(session_num, c.max_in_flight),
                            Some(pb::controller_message::Message::Drain(_)) => controller.drain(session_num),
                            Some(pb::controller_message::Message::EventAck(ack))
                                if controller.ack(session_num, &ack.id) == Completion::Discarded =>
                            {
                                tracing::debug!(controller = %controller.id, id = %ack.id, "late or unknown ack discarded");
                            }
                            Some(pb::controller_message::Message::EventAck(_)) => {}
                            Some(pb::controller_message::Message::Register(_)) => {
                                break Some(Status::invalid_argument("register: a session registers once; open a new Connect stream to change the registration"));
                            }
                            None => {}
                        },
                        Ok(None) => break None,
                        // tonic refuses an oversized message before reading it (OUT_OF_RANGE);
                        // gRPC's code for a message over the receiver's limit is RESOURCE_EXHAUSTED.
                        Err(e) if e.code() == tonic::Code::OutOfRange => {
                            service.metrics.limit_hit(&controller.id.tenant, "message_bytes");
                            break Some(inbound_error(e));
                        }
                        Err(e) => {
                            tracing::debug!(controller = %controller.id, error = %e, "session stream error");
                            break None;
                        }
                    },
                }
            };
            service.controllers.detach(&controller, session_num);
            service.sessions.lock().remove(&session_id);
            tracing::info!(controller = %controller.id, session = %session_id, "session ended");
            if let Some(status) = end
                && status.code() != tonic::Code::Ok
            {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    /// A cached Get.
    async fn read_one(
        &self,
        req: GrpcRequest<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let identity = self.authenticate(&req).await?;
        let r = req.into_inner();
        let informers = self
            .cached_read(&identity, &r.session_id, r.resource.as_ref(), &r.namespace)
            .await?;
        let found = informers.iter().find_map(|i| {
            i.get(&r.namespace, &r.name)
                .map(|o| (o, i.key().metadata_only))
        });
        match found {
            Some((obj, metadata_only)) => Ok(Response::new(pb::GetResponse {
                object_json: obj.json().to_vec(),
                resource_version: obj.resource_version().to_string(),
                metadata_only,
            })),
            None => Err(Status::not_found(format!(
                "{}/{} not found in the cache",
                r.namespace, r.name
            ))),
        }
    }

    /// A cached List.
    async fn read_many(
        &self,
        req: GrpcRequest<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let identity = self.authenticate(&req).await?;
        let r = req.into_inner();
        let informers = self
            .cached_read(&identity, &r.session_id, r.resource.as_ref(), &r.namespace)
            .await?;
        let selector = match &r.label_selector {
            Some(sel) => Some(
                translate_selector(sel, "label_selector")
                    .map_err(|e| Status::invalid_argument(e.to_string()))?,
            ),
            None => None,
        };
        let namespace = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
        let mut items: Vec<(ObjectKey, CachedObject)> = informers
            .iter()
            .flat_map(|i| i.list(namespace))
            .filter(|(_, o)| {
                selector
                    .as_ref()
                    .is_none_or(|s| s.matches_object(&o.value()))
            })
            .collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        items.dedup_by(|a, b| a.0 == b.0);
        let page_size = match r.page_size {
            0 => 500,
            n => n.min(5000),
        } as usize;
        let offset: usize = if r.page_token.is_empty() {
            0
        } else {
            r.page_token.parse().map_err(|_| {
                Status::invalid_argument("page_token: not a token from a previous ListResponse")
            })?
        };
        let end = (offset + page_size).min(items.len());
        let page = items.get(offset.min(end)..end).unwrap_or_default();
        Ok(Response::new(pb::ListResponse {
            items: page
                .iter()
                .map(|(_, o)| pb::CachedObject {
                    object_json: o.json().to_vec(),
                    resource_version: o.resource_version().to_string(),
                })
                .collect(),
            next_page_token: if end < items.len() {
                end.to_string()
            } else {
                String::new()
            },
            resource_version: String::new(),
            metadata_only: informers.first().is_some_and(|i| i.key().metadata_only),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_capped_so_no_deadline_can_overflow_the_clock() {
        let huge = prost_types::Duration {
            seconds: i64::MAX,
            nanos: 999_999_999,
        };
        let d = duration(&huge, "register.request_deadline")
            .ok()
            .flatten()
            .expect("accepted");
        assert_eq!(d, LONGEST_DURATION);
        assert!(std::time::Instant::now().checked_add(d).is_some());
        assert!(SystemTime::now().checked_add(d).is_some());
        let small = prost_types::Duration {
            seconds: 2,
            nanos: 500_000_000,
        };
        assert_eq!(
            duration(&small, "f").ok().flatten(),
            Some(Duration::from_millis(2500))
        );
        let negative = prost_types::Duration {
            seconds: -1,
            nanos: 0,
        };
        assert!(duration(&negative, "f").is_err());
    }
}
