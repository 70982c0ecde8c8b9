//! The controller definition: what it reconciles, owns and watches, where,
//! with which predicates and concurrency. Turned into `ctrlhub.v1.Register`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ctrlhub_proto::v1 as pb;
use kube::Resource;
use kube::core::DynamicObject;

use crate::action::duration_to_proto;
use crate::{ConfigError, Predicate, Selector, SessionInfo};

/// The `ctrlhub.v1.ResourceType` of a Rust Kubernetes type (group, version,
/// kind and plural from [`kube::Resource`]).
pub fn resource_type<K>() -> pb::ResourceType
where
    K: Resource,
    K::DynamicType: Default,
{
    let dt = K::DynamicType::default();
    pb::ResourceType {
        group: K::group(&dt).into_owned(),
        version: K::version(&dt).into_owned(),
        kind: K::kind(&dt).into_owned(),
        plural: K::plural(&dt).into_owned(),
    }
}

/// A resource type named explicitly (for types without a Rust struct):
/// group (empty for core), version and kind; the manager looks up the plural.
pub fn dynamic_resource_type(
    group: impl Into<String>,
    version: impl Into<String>,
    kind: impl Into<String>,
) -> pb::ResourceType {
    pb::ResourceType {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        plural: String::new(),
    }
}

/// The environment variable [`Controller::run`] takes `Register.revision`
/// from when the definition sets none (see [`Controller::revision`]).
pub const REVISION_ENV: &str = "CTRLHUB_REVISION";

/// The revision a definition registers with: the builder's, else the value
/// of [`REVISION_ENV`] (`env`), else 0.
pub(crate) fn effective_revision(
    builder: Option<u64>,
    env: Option<&str>,
) -> Result<u64, ConfigError> {
    if let Some(revision) = builder {
        return Ok(revision);
    }
    match env.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(0),
        Some(v) => v
            .parse()
            .map_err(|_| ConfigError::InvalidRevision(v.to_owned())),
    }
}

/// How objects of a watched (not owned) type name the primary they concern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// The value of this label is the primary's name (same namespace).
    Label(String),
    /// The value of this annotation is `namespace/name` or `name`.
    Annotation(String),
    /// A dot-separated JSON path (e.g. `spec.issuerRef.name`) holding
    /// `namespace/name` or `name`, or a list of them.
    FieldPath(String),
}

impl Mapping {
    fn to_proto(&self) -> pb::watched_resource::Mapping {
        use pb::watched_resource::Mapping as M;
        match self {
            Self::Label(k) => M::LabelKey(k.clone()),
            Self::Annotation(k) => M::AnnotationKey(k.clone()),
            Self::FieldPath(p) => M::FieldPath(p.clone()),
        }
    }
}

/// Which namespaces the controller sees (primary, owned and watched types).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace.
    #[default]
    All,
    /// Exactly these namespaces.
    Names(Vec<String>),
    /// Namespaces whose labels match (followed live).
    Selector(Selector),
}

impl Scope {
    fn to_proto(&self) -> pb::NamespaceScope {
        use pb::namespace_scope::Scope as S;
        let scope = match self {
            Self::All => S::All(pb::namespace_scope::All {}),
            Self::Names(names) => S::Names(pb::namespace_scope::Names {
                names: names.clone(),
            }),
            Self::Selector(sel) => S::LabelSelector(sel.to_proto()),
        };
        pb::NamespaceScope { scope: Some(scope) }
    }
}

/// A controller definition. Build it, then [`run`](Controller::run) it.
///
/// `K` is the primary type that reconcile requests decode into; it starts as
/// [`DynamicObject`] and becomes your type with
/// [`reconciles`](Controller::reconciles).
#[derive(Debug)]
pub struct Controller<K = DynamicObject> {
    pub(crate) name: String,
    pub(crate) primary: Option<pb::ResourceType>,
    pub(crate) owns: Vec<pb::OwnedResource>,
    pub(crate) watches: Vec<pb::WatchedResource>,
    pub(crate) scope: Option<Scope>,
    pub(crate) label_selector: Option<Selector>,
    pub(crate) predicate: Option<Predicate>,
    pub(crate) concurrency: u32,
    pub(crate) controller_wide_limit: Option<u32>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) resync: Option<Duration>,
    pub(crate) backoff: Option<(Duration, Duration)>,
    pub(crate) include_object: bool,
    pub(crate) revision: Option<u64>,
    pub(crate) on_registered: Option<OnRegistered>,
    pub(crate) client: Option<KubeClient>,
    _primary: PhantomData<fn() -> K>,
}

/// The controller's Kubernetes client (not `Debug` itself).
#[derive(Clone)]
pub(crate) struct KubeClient(pub(crate) kube::Client);

impl fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("kube::Client")
    }
}

/// The callback of [`Controller::on_registered`].
#[derive(Clone)]
pub(crate) struct OnRegistered(pub(crate) Arc<dyn Fn(&SessionInfo) + Send + Sync>);

impl fmt::Debug for OnRegistered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnRegistered(..)")
    }
}

impl Controller<DynamicObject> {
    /// A new controller named `name` (a DNS-1123 label, unique in your
    /// tenant; replicas share it). Defaults: all namespaces, no predicate,
    /// 1 concurrent reconcile, the manager's default deadline (1 min),
    /// resync (10 h) and backoff (5 ms → 1000 s), objects not included.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            primary: None,
            owns: Vec::new(),
            watches: Vec::new(),
            scope: None,
            label_selector: None,
            predicate: None,
            concurrency: 1,
            controller_wide_limit: None,
            deadline: None,
            resync: None,
            backoff: None,
            include_object: false,
            revision: None,
            on_registered: None,
            client: None,
            _primary: PhantomData,
        }
    }
}

impl<K> Controller<K> {
    fn retype<K2>(self) -> Controller<K2> {
        Controller {
            name: self.name,
            primary: self.primary,
            owns: self.owns,
            watches: self.watches,
            scope: self.scope,
            label_selector: self.label_selector,
            predicate: self.predicate,
            concurrency: self.concurrency,
            controller_wide_limit: self.controller_wide_limit,
            deadline: self.deadline,
            resync: self.resync,
            backoff: self.backoff,
            include_object: self.include_object,
            revision: self.revision,
            on_registered: self.on_registered,
            client: self.client,
            _primary: PhantomData,
        }
    }

    /// The controller's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reconciles objects of type `P` (the primary type).
    pub fn reconciles<P>(mut self) -> Controller<P>
    where
        P: Resource,
        P::DynamicType: Default,
    {
        self.primary = Some(resource_type::<P>());
        self.retype()
    }

    /// Reconciles a type named at run time; requests decode as
    /// [`DynamicObject`].
    pub fn reconciles_dynamic(mut self, resource: pb::ResourceType) -> Controller<DynamicObject> {
        self.primary = Some(resource);
        self.retype()
    }

    /// Owns children of type `C`: a change to a child enqueues its
    /// controller owner (`ownerReferences[].controller == true`). The manager
    /// caches `C` in full, so [`CachedReader::get`](crate::CachedReader::get)
    /// reads a child's spec and status.
    pub fn owns<C>(self) -> Self
    where
        C: Resource,
        C::DynamicType: Default,
    {
        self.owns_dynamic(resource_type::<C>(), true, None)
    }

    /// Owns children of type `C` like [`owns`](Controller::owns), but asks
    /// the manager to cache only their metadata (a fraction of the memory).
    /// Read them with
    /// [`CachedReader::get_metadata`](crate::CachedReader::get_metadata),
    /// which returns a `PartialObjectMeta<C>`. The kind is cached in full
    /// anyway if another `owns` or `watches` entry of it asks for that
    /// (`Registered.readable`, logged at registration, says which form it
    /// got).
    pub fn owns_metadata<C>(self) -> Self
    where
        C: Resource,
        C::DynamicType: Default,
    {
        self.owns_entry(pb::OwnedResource {
            resource: Some(resource_type::<C>()),
            controller_only: true,
            predicate: None,
            metadata_only: true,
        })
    }

    /// Owns children of a type named at run time; `controller_only = false`
    /// follows every owner reference to the primary kind; `predicate`
    /// filters the children's events. Cached in full.
    pub fn owns_dynamic(
        self,
        resource: pb::ResourceType,
        controller_only: bool,
        predicate: Option<Predicate>,
    ) -> Self {
        self.owns_entry(pb::OwnedResource {
            resource: Some(resource),
            controller_only,
            predicate: predicate.as_ref().map(Predicate::to_proto),
            metadata_only: false,
        })
    }

    /// Adds an `owns` entry exactly as given (every field of
    /// `ctrlhub.v1.OwnedResource`, `metadata_only` included).
    pub fn owns_entry(mut self, entry: pb::OwnedResource) -> Self {
        self.owns.push(entry);
        self
    }

    /// Watches objects of type `W`, mapped to primaries by `mapping`; cached
    /// in full.
    pub fn watches<W>(self, mapping: Mapping) -> Self
    where
        W: Resource,
        W::DynamicType: Default,
    {
        self.watches_dynamic(resource_type::<W>(), mapping, None)
    }

    /// Watches objects of type `W` like [`watches`](Controller::watches),
    /// caching only their metadata (see
    /// [`owns_metadata`](Controller::owns_metadata)). The manager ignores
    /// the option with a [`Mapping::FieldPath`], which reads the object.
    pub fn watches_metadata<W>(self, mapping: Mapping) -> Self
    where
        W: Resource,
        W::DynamicType: Default,
    {
        self.watches_entry(pb::WatchedResource {
            resource: Some(resource_type::<W>()),
            mapping: Some(mapping.to_proto()),
            predicate: None,
            metadata_only: true,
        })
    }

    /// Watches a type named at run time, with an optional event filter;
    /// cached in full.
    pub fn watches_dynamic(
        self,
        resource: pb::ResourceType,
        mapping: Mapping,
        predicate: Option<Predicate>,
    ) -> Self {
        self.watches_entry(pb::WatchedResource {
            resource: Some(resource),
            mapping: Some(mapping.to_proto()),
            predicate: predicate.as_ref().map(Predicate::to_proto),
            metadata_only: false,
        })
    }

    /// Adds a `watches` entry exactly as given (every field of
    /// `ctrlhub.v1.WatchedResource`, `metadata_only` included).
    pub fn watches_entry(mut self, entry: pb::WatchedResource) -> Self {
        self.watches.push(entry);
        self
    }

    /// The namespaces this controller sees.
    pub fn namespaces(mut self, scope: Scope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Only primaries whose labels match (applied by the informer).
    pub fn label_selector(mut self, selector: Selector) -> Self {
        self.label_selector = Some(selector);
        self
    }

    /// Event filter for the primary type.
    pub fn predicate(mut self, predicate: Predicate) -> Self {
        self.predicate = Some(predicate);
        self
    }

    /// How many reconciles this process runs at once (at least 1); also the
    /// session's credit (`Register.max_in_flight`).
    pub fn max_concurrent_reconciles(mut self, n: u32) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Upper bound on reconciles in flight across ALL replicas of this
    /// controller (`Register.max_concurrent_reconciles`). Unset by default,
    /// so that adding replicas adds capacity.
    pub fn controller_wide_limit(mut self, n: u32) -> Self {
        self.controller_wide_limit = Some(n);
        self
    }

    /// How long one reconcile may take; the SDK cancels it slightly earlier.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Periodic resync of every primary; `Duration::ZERO` disables it.
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync = Some(period);
        self
    }

    /// Per-key retry backoff after errors.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Some((base, max));
        self
    }

    /// Whether requests carry the primary object (or its tombstone).
    pub fn include_object(mut self, include: bool) -> Self {
        self.include_object = include;
        self
    }

    /// The revision of this definition, for rolling upgrades
    /// (`Register.revision`): a higher revision replaces a running
    /// definition that differs, a lower or equal one waits until the
    /// running one's replicas are gone. Unset, [`run`](Controller::run)
    /// reads `CTRLHUB_REVISION` (0 when that is unset too). See the crate
    /// docs, "Rolling upgrades".
    pub fn revision(mut self, revision: u64) -> Self {
        self.revision = Some(revision);
        self
    }

    /// The controller's own Kubernetes client, for its writes: the write helpers of every
    /// [`Request`](crate::Request) (`adopt`, `apply`, `patch_status`, `finalizers`) and its
    /// Events recorder (`events`, and the `ReconcileFailed` Warning of every failed reconcile)
    /// use it, with the controller's name as field manager and reporting controller. Without
    /// one, the helpers answer [`WriteError::NoClient`](crate::WriteError::NoClient) and no
    /// Event is posted. Reads through the manager's cache
    /// ([`Request::reader`](crate::Request::reader)) need none.
    pub fn client(mut self, client: kube::Client) -> Self {
        self.client = Some(KubeClient(client));
        self
    }

    /// Calls `f` each time a session registers (once per connection), with
    /// what the manager answered: the session id, the readable kinds and
    /// their form, the effective registration. Keep it short: it runs on
    /// the session's task.
    pub fn on_registered(mut self, f: impl Fn(&SessionInfo) + Send + Sync + 'static) -> Self {
        self.on_registered = Some(OnRegistered(Arc::new(f)));
        self
    }

    /// The registration this definition sends. `revision` is the builder's
    /// (0 when unset: [`run`](Controller::run) fills in `CTRLHUB_REVISION`);
    /// `exclusive_attempts` is always set, because the SDK keeps its side of
    /// that protocol (docs/protocol.md, "Exclusive attempts"), and so is
    /// `max_batch` (docs/protocol.md, "Batches").
    pub fn to_register(&self) -> pb::Register {
        pb::Register {
            controller_name: self.name.clone(),
            mode: pb::register::Mode::Reconcile.into(),
            primary: self.primary.clone(),
            owns: self.owns.clone(),
            watches: self.watches.clone(),
            namespaces: self.scope.as_ref().map(Scope::to_proto),
            label_selector: self.label_selector.as_ref().map(Selector::to_proto),
            predicate: self.predicate.as_ref().map(Predicate::to_proto),
            max_concurrent_reconciles: self.controller_wide_limit.unwrap_or(0),
            max_in_flight: self.concurrency,
            request_deadline: self.deadline.map(duration_to_proto),
            resync_period: self.resync.map(duration_to_proto),
            backoff: self.backoff.map(|(base, max)| pb::Backoff {
                base: Some(duration_to_proto(base)),
                max: Some(duration_to_proto(max)),
            }),
            include_object: self.include_object,
            revision: self.revision.unwrap_or(0),
            exclusive_attempts: true,
            max_batch: crate::runtime::MAX_BATCH,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn builds_register() {
        let ctl = Controller::new("widgets")
            .reconciles::<Deployment>()
            .owns::<ConfigMap>()
            .watches::<ConfigMap>(Mapping::Label("app.example.com/owner".into()))
            .namespaces(Scope::Names(vec!["a".into(), "b".into()]))
            .predicate(Predicate::generation_changed().or(Predicate::deleting()))
            .max_concurrent_reconciles(4)
            .deadline(Duration::from_secs(30))
            .include_object(true);
        let r = ctl.to_register();
        assert_eq!(r.controller_name, "widgets");
        assert_eq!(r.mode(), pb::register::Mode::Reconcile);
        assert_eq!(
            r.primary,
            Some(pb::ResourceType {
                group: "apps".into(),
                version: "v1".into(),
                kind: "Deployment".into(),
                plural: "deployments".into(),
            })
        );
        assert_eq!(r.owns.len(), 1);
        assert!(r.owns[0].controller_only);
        assert_eq!(
            r.owns[0]
                .resource
                .as_ref()
                .map(|t| (t.group.as_str(), t.kind.as_str())),
            Some(("", "ConfigMap"))
        );
        assert_eq!(
            r.watches[0].mapping,
            Some(pb::watched_resource::Mapping::LabelKey(
                "app.example.com/owner".into()
            ))
        );
        assert!(matches!(
            r.namespaces.and_then(|n| n.scope),
            Some(pb::namespace_scope::Scope::Names(n)) if n.names == ["a", "b"]
        ));
        assert!(matches!(
            r.predicate.and_then(|p| p.predicate),
            Some(pb::predicate::Predicate::AnyOf(a)) if a.predicates.len() == 2
        ));
        assert_eq!(r.max_in_flight, 4);
        assert_eq!(r.max_concurrent_reconciles, 0);
        assert_eq!(r.request_deadline.map(|d| d.seconds), Some(30));
        assert_eq!(r.resync_period, None);
        assert!(r.include_object);
    }

    #[test]
    fn defaults_leave_manager_defaults() {
        let r = Controller::new("x").to_register();
        assert_eq!(r.primary, None);
        assert_eq!(r.namespaces, None);
        assert_eq!(r.max_in_flight, 1);
        assert_eq!(r.backoff, None);
        assert_eq!(r.request_deadline, None);
        assert_eq!(r.revision, 0);
        assert!(
            r.exclusive_attempts,
            "every ctrlhub SDK sets exclusive_attempts"
        );
        assert!(r.owns.is_empty() && r.watches.is_empty());
    }

    #[test]
    fn children_are_full_unless_asked_for_metadata() {
        let r = Controller::new("x")
            .reconciles::<ConfigMap>()
            .owns::<Deployment>()
            .owns_metadata::<ConfigMap>()
            .watches::<Deployment>(Mapping::Label("l".into()))
            .watches_metadata::<ConfigMap>(Mapping::Annotation("a".into()))
            .to_register();
        let owns: Vec<(&str, bool, bool)> = r
            .owns
            .iter()
            .map(|o| {
                let kind = o.resource.as_ref().map_or("", |t| t.kind.as_str());
                (kind, o.metadata_only, o.controller_only)
            })
            .collect();
        assert_eq!(
            owns,
            [("Deployment", false, true), ("ConfigMap", true, true)]
        );
        let watches: Vec<(&str, bool)> = r
            .watches
            .iter()
            .map(|w| {
                let kind = w.resource.as_ref().map_or("", |t| t.kind.as_str());
                (kind, w.metadata_only)
            })
            .collect();
        assert_eq!(watches, [("Deployment", false), ("ConfigMap", true)]);
    }

    #[test]
    fn revision_from_the_builder_or_the_environment() {
        assert_eq!(Controller::new("x").revision(7).to_register().revision, 7);
        assert!(matches!(effective_revision(Some(3), Some("9")), Ok(3)));
        assert!(matches!(effective_revision(None, Some(" 9 ")), Ok(9)));
        assert!(matches!(effective_revision(None, Some("")), Ok(0)));
        assert!(matches!(effective_revision(None, None), Ok(0)));
        assert!(matches!(
            effective_revision(None, Some("v2")),
            Err(ConfigError::InvalidRevision(v)) if v == "v2"
        ));
        assert!(effective_revision(None, Some("-1")).is_err());
    }
}
