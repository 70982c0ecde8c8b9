//! Who registered what: controllers by (tenant, name), their sessions, and the informer
//! subscriptions that feed their queues through scope, predicates and mapping.

use crate::cache::{Cache, CacheEvent, InformerKey, ObjectKey, Subscriber};
use crate::controller::{Controller, ControllerId, Outbound, RevokeReason};
use crate::mapper;
use crate::predicate::{EventKind, LabelSelector, Predicate};
use crate::registration::{Invalid, NamespaceScope, Registration, ResourceRef, selector_query};
use crate::scheduler::Scheduler;
use crate::tenant::TenantLimits;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// A field is wrong.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// Outside the manager's WATCH_NAMESPACE ceiling.
    #[error("{0}")]
    OutsideCeiling(String),
    /// A tenant limit is reached (RESOURCE_EXHAUSTED).
    #[error("tenant {tenant} is at its {limit} limit of {max}: {hint}")]
    Limit {
        /// The tenant.
        tenant: String,
        /// Which limit.
        limit: &'static str,
        /// Its value.
        max: u64,
        /// What to do about it.
        hint: &'static str,
    },
    /// The manager is shutting down (UNAVAILABLE): the controller should reconnect to the next
    /// leader instead of attaching to a manager that is about to close.
    #[error(
        "this ctrlhub manager is shutting down; reconnect (through the Service) to the next leader"
    )]
    ShuttingDown,
}

/// How a session is attached.
pub struct Attached {
    /// The controller it joined.
    pub controller: Arc<Controller>,
    /// Its session id.
    pub session: u64,
    /// What it receives.
    pub outbound: mpsc::UnboundedReceiver<Outbound>,
    /// The credits granted: what it asked for, capped by its tenant's in-flight limit.
    pub credits: u32,
}

/// Every registered controller of this manager.
pub struct Registry {
    cache: Arc<Cache>,
    ceiling: Option<Vec<String>>,
    controllers: Mutex<BTreeMap<ControllerId, Arc<Controller>>>,
    next_session: AtomicU64,
    /// Set by [`Registry::close`]: no session may attach any more.
    closed: std::sync::atomic::AtomicBool,
    leading: watch::Receiver<bool>,
    stop: CancellationToken,
    metrics: Arc<crate::telemetry::Metrics>,
    limits: TenantLimits,
    /// Dispatch seats shared by every tenant's controllers.
    scheduler: Arc<Scheduler>,
}

fn event_kind(event: &CacheEvent) -> (EventKind, Option<&Value>, &Value) {
    match event {
        CacheEvent::Added { object, .. } => (EventKind::Added, None, object),
        CacheEvent::Modified { old, new } => (EventKind::Modified, Some(old), new),
        CacheEvent::Deleted { object, .. } => (EventKind::Deleted, Some(object), object),
    }
}

fn passes(predicate: &Option<Predicate>, event: &CacheEvent) -> bool {
    let (kind, old, new) = event_kind(event);
    predicate
        .as_ref()
        .is_none_or(|p| p.evaluate(kind, old, new))
}

/// EVENTS mode: a list-time Added is a SYNC (it may have changed while nobody watched).
fn event_type(event: &CacheEvent) -> crate::events::EventType {
    use crate::events::EventType as T;
    match event {
        CacheEvent::Added { initial: true, .. } => T::Sync,
        CacheEvent::Added { .. } => T::Added,
        CacheEvent::Modified { .. } => T::Modified,
        CacheEvent::Deleted { .. } => T::Deleted,
    }
}

fn is_initial(event: &CacheEvent) -> bool {
    matches!(event, CacheEvent::Added { initial: true, .. })
}

/// The server-side label selector of a registration's primary informer.
fn primary_labels(reg: &Registration) -> Option<String> {
    reg.label_selector
        .as_ref()
        .map(selector_query)
        .filter(|s| !s.is_empty())
}

/// Watched kinds are cached metadata-only unless the mapping reads a field of the object.
fn watched_metadata_only(mapping: &crate::registration::Mapping) -> bool {
    !matches!(mapping, crate::registration::Mapping::Field(_))
}

/// The informer that follows namespaces for label-selector scopes.
fn namespaces_informer_key() -> InformerKey {
    InformerKey {
        group: String::new(),
        version: "v1".into(),
        kind: "Namespace".into(),
        plural: "namespaces".into(),
        namespaced: false,
        namespace: None,
        label_selector: None,
        metadata_only: true,
    }
}

/// Namespaces currently in scope for a namespace-label-selector registration.
type ScopeSet = Arc<RwLock<HashSet<String>>>;

fn in_scope(scope: &Option<ScopeSet>, obj: &Value) -> bool {
    key_in_scope(
        scope,
        obj.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    )
}

fn key_in_scope(scope: &Option<ScopeSet>, namespace: &str) -> bool {
    scope.as_ref().is_none_or(|set| {
        set.read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(namespace)
    })
}

/// A subscriber for an owned or watched kind: filter by its predicate, map old and new states
/// to primary keys, keep those in scope, enqueue.
fn related_subscriber(
    controller: &Arc<Controller>,
    scope: Option<ScopeSet>,
    predicate: Option<Predicate>,
    map: impl Fn(&Value) -> Vec<ObjectKey> + Send + Sync + 'static,
) -> Subscriber {
    let c = Arc::downgrade(controller);
    Arc::new(move |event: &CacheEvent| {
        let Some(c) = c.upgrade() else { return };
        if !passes(&predicate, event) {
            return;
        }
        let mut keys: Vec<ObjectKey> = Vec::new();
        // An update can move an object from one primary to another: both need a look.
        if let CacheEvent::Modified { old, .. } = event {
            keys.extend(map(old));
        }
        let (_, _, obj) = event_kind(event);
        keys.extend(map(obj));
        keys.retain(|(ns, _)| key_in_scope(&scope, ns));
        keys.sort();
        keys.dedup();
        c.enqueue(keys, is_initial(event));
    })
}

impl Registry {
    /// A registry over `cache`; `ceiling` is WATCH_NAMESPACE (None = all namespaces).
    pub fn new(
        cache: Arc<Cache>,
        ceiling: Option<Vec<String>>,
        leading: watch::Receiver<bool>,
        stop: CancellationToken,
        metrics: Arc<crate::telemetry::Metrics>,
    ) -> Arc<Self> {
        Self::with_limits(
            cache,
            ceiling,
            leading,
            stop,
            metrics,
            TenantLimits::default(),
        )
    }

    /// A registry enforcing `limits` (instead of the defaults).
    pub fn with_limits(
        cache: Arc<Cache>,
        ceiling: Option<Vec<String>>,
        leading: watch::Receiver<bool>,
        stop: CancellationToken,
        metrics: Arc<crate::telemetry::Metrics>,
        limits: TenantLimits,
    ) -> Arc<Self> {
        Self::with_scheduler(
            cache,
            ceiling,
            leading,
            stop,
            metrics,
            limits,
            Scheduler::unlimited(),
        )
    }

    /// A registry enforcing `limits` whose controllers share the dispatch seats of `scheduler`.
    pub fn with_scheduler(
        cache: Arc<Cache>,
        ceiling: Option<Vec<String>>,
        leading: watch::Receiver<bool>,
        stop: CancellationToken,
        metrics: Arc<crate::telemetry::Metrics>,
        limits: TenantLimits,
        scheduler: Arc<Scheduler>,
    ) -> Arc<Self> {
        Arc::new(Registry {
            cache,
            ceiling,
            controllers: Mutex::new(BTreeMap::new()),
            next_session: AtomicU64::new(1),
            closed: std::sync::atomic::AtomicBool::new(false),
            leading,
            stop,
            metrics,
            limits,
            scheduler,
        })
    }

    fn controllers(&self) -> MutexGuard<'_, BTreeMap<ControllerId, Arc<Controller>>> {
        self.controllers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every controller, for status and metrics.
    pub fn all(&self) -> Vec<Arc<Controller>> {
        self.controllers().values().cloned().collect()
    }

    /// The dispatch seats every controller of this registry shares.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.scheduler
    }

    /// The shared cache.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// Find a controller.
    pub fn get(&self, id: &ControllerId) -> Option<Arc<Controller>> {
        self.controllers().get(id).cloned()
    }

    /// Attach a session of `tenant` with `registration`. Replicas with the same registration
    /// share one controller; a different registration under the same name supersedes it.
    pub fn attach(
        &self,
        tenant: &str,
        registration: Registration,
        mut credits: u32,
    ) -> Result<Attached, RegisterError> {
        let id = ControllerId {
            tenant: tenant.to_string(),
            name: registration.name.clone(),
        };
        if self.is_closed() {
            return Err(RegisterError::ShuttingDown);
        }
        let namespaces = self.effective_namespaces(&registration)?;
        let limits = self.limits.for_tenant(tenant);
        let controller = {
            let mut controllers = self.controllers();
            let mine: Vec<&Arc<Controller>> = controllers
                .values()
                .filter(|c| c.id.tenant == tenant)
                .collect();
            let refuse = |limit: &'static str, max: u64, hint: &'static str| {
                self.metrics.limit_hit(tenant, limit);
                RegisterError::Limit {
                    tenant: tenant.to_string(),
                    limit,
                    max,
                    hint,
                }
            };
            let sessions: usize = mine.iter().map(|c| c.session_count()).sum();
            if sessions >= limits.sessions {
                return Err(refuse(
                    "sessions",
                    limits.sessions as u64,
                    "run fewer replicas or ask for a higher limit",
                ));
            }
            if !controllers.contains_key(&id) && mine.len() >= limits.controllers {
                return Err(refuse(
                    "controllers",
                    limits.controllers as u64,
                    "remove a controller or ask for a higher limit",
                ));
            }
            let used: u64 = mine.iter().map(|c| c.total_credits()).sum();
            let left = limits.in_flight.saturating_sub(used);
            if left == 0 {
                return Err(refuse(
                    "in_flight",
                    limits.in_flight,
                    "lower max_in_flight on running replicas or ask for a higher limit",
                ));
            }
            // Ask for more than is left and get what is left: Registered.effective says so.
            credits = credits.min(u32::try_from(left).unwrap_or(u32::MAX));
            match controllers.get(&id) {
                Some(existing) if existing.registration == registration => existing.clone(),
                existing => {
                    // Count what the tenant would hold with this registration in place of the
                    // one it supersedes: informers shared between its controllers count once.
                    let mut informers: HashSet<InformerKey> = mine
                        .iter()
                        .filter(|c| c.id != id)
                        .flat_map(|c| c.informer_keys())
                        .collect();
                    informers.extend(self.needed_informers(&registration, &namespaces));
                    if informers.len() > limits.informers {
                        return Err(refuse(
                            "informers",
                            limits.informers as u64,
                            "watch fewer kinds or namespaces, share label selectors between controllers, or ask for a higher limit",
                        ));
                    }
                    if let Some(old) = existing {
                        tracing::info!(controller = %id, "registration changed; superseding the previous one");
                        old.revoke_all(RevokeReason::Superseded, "a replica registered a different definition under this controller name");
                        old.release_informers();
                    }
                    let controller = Controller::with_scheduler(
                        id.clone(),
                        registration.clone(),
                        self.metrics.clone(),
                        &self.scheduler,
                    );
                    controller.set_queue_limit(limits.queued_keys);
                    self.wire(&controller, &namespaces);
                    tokio::spawn(
                        controller
                            .clone()
                            .run(self.leading.clone(), self.stop.child_token()),
                    );
                    controllers.insert(id.clone(), controller.clone());
                    tracing::info!(controller = %id, primary = %format!("{}/{}", registration.primary.api_version(), registration.primary.kind), "controller registered");
                    controller
                }
            }
        };
        let session = self.next_session.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        controller.add_session(session, credits.max(1), tx);
        if self.is_closed() {
            // close() ran between the check above and here and may have missed this session.
            self.detach(&controller, session);
            return Err(RegisterError::ShuttingDown);
        }
        if controller.is_overflowed() {
            // Its initial list alone overflowed the queue while wiring, before any session was
            // attached to hear the revocation: refuse this one instead.
            self.detach(&controller, session);
            self.metrics.limit_hit(tenant, "queued_keys");
            return Err(RegisterError::Limit {
                tenant: tenant.to_string(),
                limit: "queued_keys",
                max: limits.queued_keys as u64,
                hint: "narrow the registration's scope (namespaces, label selector, predicates) or ask for a higher limit",
            });
        }
        Ok(Attached {
            controller,
            session,
            outbound: rx,
            credits: credits.max(1),
        })
    }

    /// Detach a session; the controller goes away with its last session.
    pub fn detach(&self, controller: &Arc<Controller>, session: u64) {
        let remaining = controller.remove_session(session);
        if remaining == 0 {
            let mut controllers = self.controllers();
            if controllers
                .get(&controller.id)
                .is_some_and(|c| Arc::ptr_eq(c, controller))
                && controller.session_count() == 0
            {
                controllers.remove(&controller.id);
                controller.release_informers();
                tracing::info!(controller = %controller.id, "last session left; controller removed");
            }
        }
    }

    /// Shut down: refuse every later attach, then revoke every session. A session that attaches
    /// concurrently is either revoked here or sees the flag in `attach` and is refused.
    pub fn close(&self, message: &str) {
        self.closed.store(true, Ordering::SeqCst);
        self.revoke_all(RevokeReason::ShuttingDown, message);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Revoke every session of every controller (e.g. on losing the lease).
    pub fn revoke_all(&self, reason: RevokeReason, message: &str) {
        for c in self.all() {
            c.revoke_all(reason, message);
        }
    }

    /// The namespaces to open informers in: None = one cluster-wide informer.
    fn effective_namespaces(
        &self,
        reg: &Registration,
    ) -> Result<Option<Vec<String>>, RegisterError> {
        match (&reg.namespaces, &self.ceiling) {
            (NamespaceScope::Names(names), Some(ceiling)) => {
                if let Some(outside) = names.iter().find(|n| !ceiling.contains(n)) {
                    return Err(RegisterError::OutsideCeiling(format!(
                        "register.namespaces.names: namespace {outside:?} is outside this manager's WATCH_NAMESPACE ({})",
                        ceiling.join(",")
                    )));
                }
                Ok(Some(names.clone()))
            }
            (NamespaceScope::Names(names), None) => Ok(Some(names.clone())),
            (_, Some(ceiling)) => Ok(Some(ceiling.clone())),
            (_, None) => Ok(None),
        }
    }

    fn informer_keys(
        &self,
        resource: &ResourceRef,
        namespaces: &Option<Vec<String>>,
        labels: Option<String>,
        metadata_only: bool,
    ) -> Vec<InformerKey> {
        let key = |ns: Option<String>| InformerKey {
            group: resource.group.clone(),
            version: resource.version.clone(),
            kind: resource.kind.clone(),
            plural: resource.plural.clone(),
            namespaced: resource.namespaced,
            namespace: ns,
            label_selector: labels.clone(),
            metadata_only,
        };
        match namespaces {
            Some(list) if resource.namespaced => {
                list.iter().map(|n| key(Some(n.clone()))).collect()
            }
            _ => vec![key(None)],
        }
    }

    /// Every informer `reg` would subscribe to (the same keys [`Registry::wire`] uses).
    fn needed_informers(
        &self,
        reg: &Registration,
        namespaces: &Option<Vec<String>>,
    ) -> HashSet<InformerKey> {
        let mut keys: HashSet<InformerKey> = self
            .informer_keys(&reg.primary, namespaces, primary_labels(reg), false)
            .into_iter()
            .collect();
        for owned in &reg.owns {
            keys.extend(self.informer_keys(&owned.resource, namespaces, None, true));
        }
        for watched in &reg.watches {
            keys.extend(self.informer_keys(
                &watched.resource,
                namespaces,
                None,
                watched_metadata_only(&watched.mapping),
            ));
        }
        if matches!(reg.namespaces, NamespaceScope::Selector(_)) {
            keys.insert(namespaces_informer_key());
        }
        keys
    }

    /// Subscribe a new controller to everything it needs.
    fn wire(&self, controller: &Arc<Controller>, namespaces: &Option<Vec<String>>) {
        let reg = &controller.registration;
        let scope: Option<ScopeSet> = match &reg.namespaces {
            NamespaceScope::Selector(sel) => Some(self.wire_namespace_selector(controller, sel)),
            _ => None,
        };
        for key in self.informer_keys(&reg.primary, namespaces, primary_labels(reg), false) {
            let c = Arc::downgrade(controller);
            let scope = scope.clone();
            let predicate = reg.predicate.clone();
            let sub: Subscriber = Arc::new(move |event: &CacheEvent| {
                let Some(c) = c.upgrade() else { return };
                c.observe_primary(event);
                if c.registration.mode == crate::registration::Mode::Events {
                    let (_, _, obj) = event_kind(event);
                    if in_scope(&scope, obj) && passes(&predicate, event) {
                        let object = match event {
                            CacheEvent::Added { object, .. }
                            | CacheEvent::Deleted { object, .. } => object,
                            CacheEvent::Modified { new, .. } => new,
                        };
                        c.push_event(event_type(event), object.clone());
                    }
                    return;
                }
                let (_, _, obj) = event_kind(event);
                if !in_scope(&scope, obj) || !passes(&predicate, event) {
                    return;
                }
                c.enqueue([mapper::own_key(obj)], is_initial(event));
            });
            let subscription = self.cache.subscribe(key, sub);
            controller.hold(subscription, true);
        }
        for owned in &reg.owns {
            let primary = reg.primary.clone();
            let controller_only = owned.controller_only;
            let map = move |obj: &Value| mapper::owner_keys(obj, &primary, controller_only);
            for key in self.informer_keys(&owned.resource, namespaces, None, true) {
                let sub = related_subscriber(
                    controller,
                    scope.clone(),
                    owned.predicate.clone(),
                    map.clone(),
                );
                controller.hold(self.cache.subscribe(key, sub), false);
            }
        }
        for watched in &reg.watches {
            let metadata_only = watched_metadata_only(&watched.mapping);
            let mapping = watched.mapping.clone();
            let primary_namespaced = reg.primary.namespaced;
            let map = move |obj: &Value| {
                mapper::mapped_key(obj, &mapping, primary_namespaced)
                    .into_iter()
                    .collect::<Vec<_>>()
            };
            for key in self.informer_keys(&watched.resource, namespaces, None, metadata_only) {
                let sub = related_subscriber(
                    controller,
                    scope.clone(),
                    watched.predicate.clone(),
                    map.clone(),
                );
                controller.hold(self.cache.subscribe(key, sub), false);
            }
        }
    }

    /// Follow namespaces matching `sel`: when one enters the scope its primaries are enqueued.
    fn wire_namespace_selector(
        &self,
        controller: &Arc<Controller>,
        sel: &LabelSelector,
    ) -> ScopeSet {
        let set: ScopeSet = Arc::new(RwLock::new(HashSet::new()));
        let key = namespaces_informer_key();
        let ceiling = self.ceiling.clone();
        let c = Arc::downgrade(controller);
        let sel = sel.clone();
        let scope = set.clone();
        let sub: Subscriber = Arc::new(move |event: &CacheEvent| {
            let Some(c) = c.upgrade() else { return };
            let (_, _, ns) = event_kind(event);
            let name = ns
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let allowed = ceiling.as_ref().is_none_or(|c| c.contains(&name));
            let matches =
                allowed && !matches!(event, CacheEvent::Deleted { .. }) && sel.matches_object(ns);
            let entered = {
                let mut s = scope.write().unwrap_or_else(|p| p.into_inner());
                if matches {
                    s.insert(name.clone())
                } else {
                    // Leaving the scope: later events of its objects are filtered out.
                    s.remove(&name);
                    false
                }
            };
            if entered {
                // Objects of a namespace that just came into scope: deliver them as new work.
                let keys: Vec<ObjectKey> = c
                    .primary_keys()
                    .into_iter()
                    .filter(|(n, _)| *n == name)
                    .collect();
                c.enqueue(keys, is_initial(event));
            }
        });
        controller.hold(self.cache.subscribe(key, sub), false);
        set
    }
}
