//! Who registered what: controllers by (tenant, name), their sessions, and the informer
//! subscriptions that feed their queues through scope, predicates and mapping.

use crate::dispatch::dispatcher::{Controller, ControllerId, Outbox, RevokeReason};
use crate::dispatch::queue::Reason;
use crate::dispatch::seats::SeatPool;
use crate::dispatch::usage::QueuedBytes;
use crate::informer::{Cache, CacheEvent, InformerKey, ListBudget, ObjectKey, Subscriber};
use crate::registration::filter::Filter;
use crate::registration::mapping;
use crate::registration::predicate::{EventKind, LabelSelector, Predicate};
use crate::registration::{Invalid, NamespaceScope, Registration, ResourceRef, selector_query};
use crate::tenancy::{Limits, NamespaceGate, TenantGrouping, TenantLimits};

/// How tenants share the manager: their limits, the dispatch seats, and which identities make
/// one tenant.
pub(crate) struct Sharing {
    /// Per-tenant limits.
    pub limits: TenantLimits,
    /// The dispatch seats.
    pub seat_pool: Arc<SeatPool>,
    /// Which identities share one tenant's limits and seats.
    pub grouping: TenantGrouping,
    /// How long an exclusive session's unfinished keys stay with it after its last heartbeat
    /// answer once it is gone (`--hold-period`): the time its replica has to stop.
    pub hold: std::time::Duration,
    /// How long a controller whose last session ended stays, with its queue and series
    /// (`--controller-grace`; zero: it goes at once).
    pub grace: std::time::Duration,
    /// Registrations that may be listing new caches at once across tenants
    /// (`--max-concurrent-first-lists`): after a failover every controller registers again,
    /// and this paces the relist instead of sending every tenant's lists at once.
    pub first_lists: usize,
}

/// A registration's turn to start informers: its tenant's turn and one of the manager's
/// first-list slots. Held until its first lists are done.
pub(crate) struct FirstListTurn {
    _tenant: tokio::sync::OwnedMutexGuard<()>,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Turns to list new caches: one registration of a tenant at a time, and a number of them
/// across tenants. The slots are taken in arrival order and a tenant waits for at most one (its
/// others wait for its turn first), so tenants are served in turn, whatever one of them sends.
pub(crate) struct ListTurns {
    tenants: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl ListTurns {
    /// Turns with `slots` registrations listing at once (at least one).
    pub(crate) fn new(slots: usize) -> Self {
        ListTurns {
            tenants: Mutex::new(HashMap::new()),
            slots: Arc::new(tokio::sync::Semaphore::new(slots.max(1))),
        }
    }

    /// Waits for `tenant`'s turn, then for a slot.
    pub(crate) async fn take(&self, tenant: String) -> FirstListTurn {
        let turn = self.tenants.lock().entry(tenant).or_default().clone();
        let tenant = turn.lock_owned().await;
        let slot = self.slots.clone().acquire_owned().await.ok();
        FirstListTurn {
            _tenant: tenant,
            _slot: slot,
        }
    }
}

/// What a session brings besides its registration: the revision of its definition and whether
/// it confirms the end of its attempts (`exclusive_attempts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Terms {
    /// `Register.revision`.
    pub revision: u64,
    /// `Register.exclusive_attempts`.
    pub exclusive: bool,
}

/// A tenant being attached to, its limits, and what the first lists of a registration it
/// starts may still fill.
struct Quota<'a> {
    tenant: &'a str,
    limits: Limits,
    budget: Arc<ListBudget>,
}
use parking_lot::{Mutex, MutexGuard, RwLock};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    /// A field is wrong.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// Outside the manager's namespace ceiling (`--watch-namespace`).
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
    /// Another identity of the same tenant already runs a controller of this name
    /// (ALREADY_EXISTS): series and pages name a controller by tenant and name, so the name
    /// must be unique within the tenant.
    #[error(
        "controller {name:?} is already registered by {owner}, another identity of your tenant {tenant}: choose another name"
    )]
    NameTaken {
        /// The name.
        name: String,
        /// The identity that holds it.
        owner: String,
        /// The tenant both belong to.
        tenant: String,
    },
    /// Another definition of this controller runs under a higher or equal revision
    /// (FAILED_PRECONDITION, `Rejected.outdated`): the replica waits instead of superseding it.
    #[error(
        "controller {name:?} runs another definition at revision {running} (this replica: revision {asked}; {what}): {hint}"
    )]
    Outdated {
        /// The controller.
        name: String,
        /// The running definition's revision.
        running: u64,
        /// This replica's revision.
        asked: u64,
        /// Which fields differ.
        what: String,
        /// What to do.
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
pub(crate) struct Attached {
    /// The controller it joined.
    pub controller: Arc<Controller>,
    /// Its session id.
    pub session: u64,
    /// What it receives.
    pub outbound: Outbox,
    /// The credits granted: what it asked for, capped by its tenant's in-flight limit.
    pub credits: u32,
    /// The namespaces admitted into the controller's scope when it is a namespace label
    /// selector (None for every other scope).
    pub scope: Option<AdmittedNamespaces>,
    /// Whether this session's registration created the controller (rather than joining it).
    pub created: bool,
}

/// The namespaces currently admitted into a namespace-label-selector scope: a read-only view
/// for the gRPC edge, which re-authorizes them and keeps every key outside them from leaving.
#[derive(Clone)]
pub(crate) struct AdmittedNamespaces {
    set: ScopeSet,
    gated: bool,
}

impl AdmittedNamespaces {
    /// Whether `namespace` is in the scope now.
    pub(crate) fn contains(&self, namespace: &str) -> bool {
        self.set.read().contains(namespace)
    }

    /// Every namespace in the scope now, sorted.
    pub(crate) fn namespaces(&self) -> Vec<String> {
        let mut all: Vec<String> = self.set.read().iter().cloned().collect();
        all.sort();
        all
    }

    /// Whether each namespace was admitted only after its own check (a [`NamespaceGate`]).
    pub(crate) fn is_gated(&self) -> bool {
        self.gated
    }
}

/// A live namespace-selector scope: what it admitted, and how to stop its admission task.
struct SelectorScope {
    controller: Weak<Controller>,
    admitted: AdmittedNamespaces,
    stop: CancellationToken,
}

/// Every registered controller of this manager.
pub(crate) struct ControllerTable {
    cache: Arc<Cache>,
    ceiling: Option<Vec<String>>,
    controllers: Mutex<BTreeMap<ControllerId, Arc<Controller>>>,
    next_session: AtomicU64,
    /// Set by [`ControllerTable::close`]: no session may attach any more.
    closed: std::sync::atomic::AtomicBool,
    leading: watch::Receiver<bool>,
    stop: CancellationToken,
    metrics: Arc<crate::metrics::Metrics>,
    /// Replaced whole when tenant policies change (`set_limits`).
    limits: RwLock<TenantLimits>,
    /// The namespace-selector scope of each controller that has one.
    selector_scopes: Mutex<HashMap<ControllerId, SelectorScope>>,
    /// Dispatch seats shared by every tenant's controllers.
    seat_pool: Arc<SeatPool>,
    /// Which identities share one tenant's limits and seats.
    grouping: TenantGrouping,
    /// New registrations per tenant.
    registration_rates: Mutex<HashMap<String, crate::throttle::TokenBucket>>,
    /// Bytes of events and tombstones each tenant's controllers hold.
    queued_bytes: Mutex<HashMap<String, Arc<AtomicU64>>>,
    /// See [`Sharing::hold`].
    hold: std::time::Duration,
    /// See [`Sharing::grace`].
    grace: std::time::Duration,
    /// The latest release of a key fenced by a controller that has gone away since.
    fenced_until: Mutex<Option<Instant>>,
    /// One turn per tenant for registrations that start informers: their first lists run one
    /// after another, so a tenant's concurrent registrations cannot list at once what its
    /// budget would refuse one by one.
    list_turns: ListTurns,
    /// Cached reads (Get, List) each tenant may have served at once; more wait their turn.
    reads: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

/// Cached reads one tenant may have served at once: a tenant repeating large Lists gets its
/// own reads queued behind each other, not every thread of the manager.
pub(crate) const READS_PER_TENANT: usize = 2;

/// New registrations a tenant may make at once, at the least: each may start informers whose
/// first lists the manager must decode, so a burst of them is a burst of work for everyone.
const MIN_REGISTRATION_BURST: u32 = 5;

fn event_kind(event: &CacheEvent) -> (EventKind, Option<&Value>, &Value) {
    match event {
        CacheEvent::Added { object, .. } => (EventKind::Added, None, object),
        CacheEvent::Modified { old, new } => (EventKind::Modified, Some(old), new),
        CacheEvent::Deleted { object, .. } => (EventKind::Deleted, Some(object), object),
    }
}

fn passes(filter: &Option<Filter>, event: &CacheEvent) -> bool {
    let (kind, old, new) = event_kind(event);
    filter.as_ref().is_none_or(|f| f.evaluate(kind, old, new))
}

/// A registration's predicate, compiled once for the events it will filter.
fn compiled(predicate: &Option<Predicate>) -> Option<Filter> {
    predicate.as_ref().map(Filter::compile)
}

/// EVENTS mode: a list-time Added is a SYNC (it may have changed while nobody watched).
fn event_type(event: &CacheEvent) -> crate::dispatch::event_queue::EventType {
    use crate::dispatch::event_queue::EventType as T;
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
type ScopeSet = crate::dispatch::dispatcher::NamespaceSet;

fn in_scope(scope: &Option<ScopeSet>, obj: &Value) -> bool {
    key_in_scope(
        scope,
        obj.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    )
}

fn key_in_scope(scope: &Option<ScopeSet>, namespace: &str) -> bool {
    scope
        .as_ref()
        .is_none_or(|set| set.read().contains(namespace))
}

/// The subscriber for a primary informer: remember tombstones, then (in scope and past the
/// predicate) push the event in EVENTS mode, or enqueue the object's own key.
fn primary_subscriber(
    controller: &Arc<Controller>,
    scope: Option<ScopeSet>,
    predicate: Option<Predicate>,
) -> Subscriber {
    let c = Arc::downgrade(controller);
    let predicate = compiled(&predicate);
    Arc::new(move |event: &CacheEvent| {
        let Some(c) = c.upgrade() else { return };
        let object = match event {
            CacheEvent::Added { object, .. } | CacheEvent::Deleted { object, .. } => object,
            CacheEvent::Modified { new, .. } => new,
        };
        // Scope, then predicate, before anything is kept for the event: an object this
        // controller will never hear of costs it nothing.
        let wanted = in_scope(&scope, object) && passes(&predicate, event);
        if c.registration.mode == crate::registration::Mode::Events {
            if wanted {
                c.push_event(event_type(event), object);
            }
            return;
        }
        if !matches!(event, CacheEvent::Deleted { .. }) || wanted {
            c.settle_tombstone(event);
        }
        if wanted {
            c.enqueue([mapping::own_key(object)], c.primary_reason(event));
        }
    })
}

/// A subscriber for an owned or watched kind: filter by its predicate, map old and new states
/// to primary keys, keep those in scope, enqueue.
fn related_subscriber(
    controller: &Arc<Controller>,
    scope: Option<ScopeSet>,
    predicate: Option<Predicate>,
    reason: Reason,
    map: impl Fn(&Value) -> Vec<ObjectKey> + Send + Sync + 'static,
) -> Subscriber {
    let c = Arc::downgrade(controller);
    let predicate = compiled(&predicate);
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
        keys.retain(|k| key_in_scope(&scope, &k.namespace));
        keys.sort();
        keys.dedup();
        let reason = if is_initial(event) {
            Reason::InitialList
        } else {
            reason
        };
        c.enqueue(keys, reason);
    })
}

impl ControllerTable {
    /// A controller table whose tenants share the manager as `sharing` says.
    pub(crate) fn new(
        cache: Arc<Cache>,
        ceiling: Option<Vec<String>>,
        leading: watch::Receiver<bool>,
        stop: CancellationToken,
        metrics: Arc<crate::metrics::Metrics>,
        sharing: Sharing,
    ) -> Arc<Self> {
        let Sharing {
            limits,
            seat_pool,
            grouping,
            hold,
            grace,
            first_lists,
        } = sharing;
        Arc::new(ControllerTable {
            cache,
            ceiling,
            controllers: Mutex::new(BTreeMap::new()),
            next_session: AtomicU64::new(1),
            closed: std::sync::atomic::AtomicBool::new(false),
            leading,
            stop,
            metrics,
            limits: RwLock::new(limits),
            selector_scopes: Mutex::new(HashMap::new()),
            seat_pool,
            grouping,
            registration_rates: Mutex::new(HashMap::new()),
            queued_bytes: Mutex::new(HashMap::new()),
            hold,
            grace,
            fenced_until: Mutex::new(None),
            list_turns: ListTurns::new(first_lists),
            reads: Mutex::new(HashMap::new()),
        })
    }

    /// Replace every tenant's limits (tenant policies changed). Limits counted while a
    /// controller runs (queued keys and bytes) apply to running controllers at once; the others
    /// (sessions, controllers, informers, cached bytes, deadlines, resync, registration rate)
    /// to registrations from now on: nothing running is cut off by a policy change.
    pub(crate) fn set_limits(&self, limits: TenantLimits) {
        for c in self.all() {
            c.apply_limits(&limits.for_tenant(&c.group));
        }
        *self.limits.write() = limits;
    }

    /// The tenant `identity`'s limits and seats count against.
    pub(crate) fn group_of(&self, identity: &str) -> String {
        self.grouping.tenant_of(identity)
    }

    fn selector_scopes(&self) -> MutexGuard<'_, HashMap<ControllerId, SelectorScope>> {
        self.selector_scopes.lock()
    }

    /// The selector scope of exactly this controller (not of one that superseded it).
    fn scope_of(&self, controller: &Arc<Controller>) -> Option<AdmittedNamespaces> {
        self.selector_scopes()
            .get(&controller.id)
            .filter(|s| std::ptr::eq(s.controller.as_ptr(), Arc::as_ptr(controller)))
            .map(|s| s.admitted.clone())
    }

    /// Stop the admission task of `controller`'s selector scope and forget it.
    fn forget_scope(&self, controller: &Arc<Controller>) {
        let mut scopes = self.selector_scopes();
        if scopes
            .get(&controller.id)
            .is_some_and(|s| std::ptr::eq(s.controller.as_ptr(), Arc::as_ptr(controller)))
            && let Some(gone) = scopes.remove(&controller.id)
        {
            gone.stop.cancel();
        }
    }

    fn controllers(&self) -> MutexGuard<'_, BTreeMap<ControllerId, Arc<Controller>>> {
        self.controllers.lock()
    }

    /// Every controller, for status and metrics.
    pub(crate) fn all(&self) -> Vec<Arc<Controller>> {
        self.controllers().values().cloned().collect()
    }

    /// The dispatch seats every controller of this controllers shares.
    pub(crate) fn seat_pool(&self) -> &Arc<SeatPool> {
        &self.seat_pool
    }

    /// Attach a session of `tenant` with `registration`. Replicas with the same registration
    /// share one controller; a different registration under the same name supersedes it. A
    /// namespace-label-selector scope admits each matching namespace only once `gate` allows it (None: every matching namespace enters at once, for
    /// an identity allowed cluster-wide). A gated registration never joins an ungated controller
    /// of the same name: that one delivers from namespaces nobody checked for this session, so
    /// the gated one supersedes it.
    pub(crate) fn attach_gated(
        &self,
        tenant: &str,
        registration: Registration,
        (credits, terms): (u32, Terms),
        gate: Option<Arc<dyn NamespaceGate>>,
    ) -> Result<Attached, RegisterError> {
        let id = ControllerId {
            tenant: tenant.to_string(),
            name: registration.name.clone(),
        };
        if self.is_closed() {
            return Err(RegisterError::ShuttingDown);
        }
        let namespaces = self.effective_namespaces(&registration)?;
        let group = self.group_of(tenant);
        let limits = self.limits.read().for_tenant(&group);
        let held = self.cached_bytes(&group);
        let quota = Quota {
            tenant: &group,
            limits,
            budget: ListBudget::new(
                limits.cached_bytes.saturating_sub(held),
                limits.cached_bytes,
            ),
        };
        quota
            .limits
            .check_deadline(registration.deadline)
            .map_err(|e| Invalid::new("register.request_deadline", e.to_string()))?;
        quota
            .limits
            .check_resync(registration.resync)
            .map_err(|e| Invalid::new("register.resync_period", e.to_string()))?;
        let (controller, credits, created) = {
            let mut controllers = self.controllers();
            let credits = self.check_tenant_limits(&controllers, &id, &quota, credits)?;
            let before = controllers.get(&id).map(Arc::as_ptr);
            let controller = self.join_or_register(
                &mut controllers,
                &id,
                (registration, terms.revision),
                &namespaces,
                &quota,
                gate,
            )?;
            let created = before != Some(Arc::as_ptr(&controller));
            (controller, credits, created)
        };
        let mut attached = self.open_session(controller, &quota, (credits, terms.exclusive))?;
        attached.created = created;
        Ok(attached)
    }

    /// The tenant's turn to start informers, when `registration` would start any that do not
    /// run yet (a replica joining a running controller never waits here). Hold it until the
    /// registration's first lists are done.
    pub(crate) async fn first_list_turn(
        &self,
        identity: &str,
        registration: &Registration,
    ) -> Option<FirstListTurn> {
        let namespaces = self.effective_namespaces(registration).ok()?;
        let starts = self
            .needed_informers(registration, &namespaces)
            .iter()
            .any(|k| !self.cache.is_running(k));
        if !starts {
            return None;
        }
        Some(self.list_turns.take(self.group_of(identity)).await)
    }

    /// A turn to serve one cached read for `identity`'s tenant (at most [`READS_PER_TENANT`]
    /// at once); hold it while the read is served.
    pub(crate) async fn read_turn(
        &self,
        identity: &str,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let turns = self
            .reads
            .lock()
            .entry(self.group_of(identity))
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(READS_PER_TENANT)))
            .clone();
        turns.acquire_owned().await.ok()
    }

    /// Once a new registration's informers have their first lists: refuse it (detaching the
    /// session) if its tenant's controllers now make the manager cache more than the tenant's
    /// budget. Checked when a registration is new, not when replicas join it, so a controller
    /// that was admitted keeps running as the cluster grows.
    pub(crate) fn check_cache_budget(&self, attached: &Attached) -> Result<(), RegisterError> {
        let tenant = &*attached.controller.group;
        let limits = self.limits.read().for_tenant(tenant);
        let held = self.cached_bytes(tenant);
        if !attached.created || held <= limits.cached_bytes {
            return Ok(());
        }
        self.detach_refused(&attached.controller, attached.session);
        Err(self.refuse(
            tenant,
            "cached_bytes",
            limits.cached_bytes,
            "share informers between controllers (same kinds, namespaces and label selectors), narrow namespaces or selectors, or ask for a higher limit",
        ))
    }

    /// Bytes held by the distinct informers `tenant`'s controllers use.
    pub(crate) fn cached_bytes(&self, tenant: &str) -> u64 {
        let mut seen = HashSet::new();
        self.controllers()
            .values()
            .filter(|c| &*c.group == tenant)
            .flat_map(|c| c.informers())
            .filter(|i| seen.insert(i.key().clone()))
            .map(|i| i.bytes() as u64)
            .sum()
    }

    /// Refuse an attach for a tenant limit, and count it.
    fn refuse(
        &self,
        tenant: &str,
        limit: &'static str,
        max: u64,
        hint: &'static str,
    ) -> RegisterError {
        self.metrics.limit_hit(tenant, limit);
        RegisterError::Limit {
            tenant: tenant.to_string(),
            limit,
            max,
            hint,
        }
    }

    /// Attach, step 1: the tenant's session, controller and in-flight limits. Returns the
    /// credits to grant: what was asked for, capped by what is left of the in-flight limit.
    fn check_tenant_limits(
        &self,
        controllers: &BTreeMap<ControllerId, Arc<Controller>>,
        id: &ControllerId,
        quota: &Quota<'_>,
        credits: u32,
    ) -> Result<u32, RegisterError> {
        let mine: Vec<&Arc<Controller>> = controllers
            .values()
            .filter(|c| &*c.group == quota.tenant)
            .collect();
        if let Some(other) = mine
            .iter()
            .find(|c| c.id.name == id.name && c.id.tenant != id.tenant)
        {
            return Err(RegisterError::NameTaken {
                name: id.name.clone(),
                owner: other.id.tenant.clone(),
                tenant: quota.tenant.to_string(),
            });
        }
        let sessions: usize = mine.iter().map(|c| c.session_count()).sum();
        if sessions >= quota.limits.sessions {
            return Err(self.refuse(
                quota.tenant,
                "sessions",
                quota.limits.sessions as u64,
                "run fewer replicas or ask for a higher limit",
            ));
        }
        if !controllers.contains_key(id) && mine.len() >= quota.limits.controllers {
            return Err(self.refuse(
                quota.tenant,
                "controllers",
                quota.limits.controllers as u64,
                "remove a controller or ask for a higher limit",
            ));
        }
        let used: u64 = mine.iter().map(|c| c.total_credits()).sum();
        let left = quota.limits.in_flight.saturating_sub(used);
        if left == 0 {
            return Err(self.refuse(
                quota.tenant,
                "in_flight",
                quota.limits.in_flight,
                "lower max_in_flight on running replicas or ask for a higher limit",
            ));
        }
        // Ask for more than is left and get what is left: Registered.effective says so.
        Ok(credits.min(u32::try_from(left).unwrap_or(u32::MAX)))
    }

    /// Attach, step 2: join the controller already registered under this name with the same
    /// definition, or register a new one in its place (within the tenant's informer limit)
    /// when its revision is higher; a lower or equal revision of another definition is refused
    /// as outdated, so a rolling upgrade never ping-pongs between definitions.
    fn join_or_register(
        &self,
        controllers: &mut BTreeMap<ControllerId, Arc<Controller>>,
        id: &ControllerId,
        (registration, revision): (Registration, u64),
        namespaces: &Option<Vec<String>>,
        quota: &Quota<'_>,
        gate: Option<Arc<dyn NamespaceGate>>,
    ) -> Result<Arc<Controller>, RegisterError> {
        let joinable = |existing: &Arc<Controller>| {
            existing.registration == registration
                && (gate.is_none() || self.scope_of(existing).is_none_or(|s| s.is_gated()))
        };
        let existing = match controllers.get(id) {
            Some(existing) if joinable(existing) => {
                if existing.sessionless_since().is_some() {
                    // Every replica had gone (kept for the grace): this is the controller
                    // starting again, after a crash or a rollout through zero, and a controller
                    // that starts reconciles every object once, as a new registration would. It
                    // replays the cache as one does, so it counts as one.
                    self.check_registration_rate(quota)?;
                    existing.enqueue(existing.scoped_primary_keys(), Reason::InitialList);
                }
                existing.raise_revision(revision);
                return Ok(existing.clone());
            }
            existing => existing,
        };
        if let Some(old) = existing
            && old.registration != registration
            && old.revision() >= revision
            && old.session_count() > 0
        {
            return Err(RegisterError::Outdated {
                name: id.name.clone(),
                running: old.revision(),
                asked: revision,
                what: format!(
                    "differs in {}",
                    old.registration.differences(&registration).join(", ")
                ),
                hint: "a rollout replaces the running replicas and this one is accepted once they are gone; give a new definition a higher revision (CTRLHUB_REVISION) to replace the running one at once",
            });
        }
        self.check_informer_limit(controllers, id, &registration, namespaces, quota)?;
        self.check_registration_rate(quota)?;
        if let Some(old) = existing {
            self.supersede(old, &registration);
        }
        let controller = self.start_controller(id, registration, namespaces, quota, gate);
        controller.raise_revision(revision);
        controllers.insert(id.clone(), controller.clone());
        Ok(controller)
    }

    /// A new controller subscribes to its informers, and each subscription replays the cache
    /// under the informer's lock: a tenant re-registering in a loop would keep every informer it
    /// uses busy for everyone. So new registrations (not replicas joining) are rate limited per
    /// tenant.
    fn check_registration_rate(&self, quota: &Quota<'_>) -> Result<(), RegisterError> {
        let (tenant, rate) = (quota.tenant, quota.limits.registrations_per_second);
        if rate == 0 {
            return Ok(());
        }
        let burst = u32::try_from(rate.saturating_mul(5))
            .unwrap_or(u32::MAX)
            .max(MIN_REGISTRATION_BURST);
        let now = Instant::now();
        let mut rates = self.registration_rates.lock();
        if rates.len() >= 4096 {
            rates.retain(|_, b| !b.is_full(now));
        }
        let allowed = rates
            .entry(tenant.to_string())
            .or_insert_with(|| crate::throttle::TokenBucket::new(burst, rate as f64, now))
            .take(now);
        if allowed {
            return Ok(());
        }
        Err(self.refuse(
            tenant,
            "registrations",
            rate,
            "new registrations per second: reconnect with backoff",
        ))
    }

    /// Count what the tenant would hold with this registration in place of the one it
    /// supersedes: informers shared between its controllers count once.
    fn check_informer_limit(
        &self,
        controllers: &BTreeMap<ControllerId, Arc<Controller>>,
        id: &ControllerId,
        registration: &Registration,
        namespaces: &Option<Vec<String>>,
        quota: &Quota<'_>,
    ) -> Result<(), RegisterError> {
        let mut informers: HashSet<InformerKey> = controllers
            .values()
            .filter(|c| &*c.group == quota.tenant && c.id != *id)
            .flat_map(|c| c.informer_keys())
            .collect();
        informers.extend(self.needed_informers(registration, namespaces));
        if informers.len() > quota.limits.informers {
            return Err(self.refuse(
                quota.tenant,
                "informers",
                quota.limits.informers as u64,
                "watch fewer kinds or namespaces, share label selectors between controllers, or ask for a higher limit",
            ));
        }
        Ok(())
    }

    /// End every session of `old`, which a new registration under its name replaces.
    fn supersede(&self, old: &Arc<Controller>, registration: &Registration) {
        let why = if old.registration == *registration {
            // Same definition, but this replica's namespaces must each be
            // checked: the old scope was filled on a cluster-wide grant.
            "a replica without a cluster-wide grant registered this controller; its namespaces are now admitted one by one after a permission check: reconnect"
        } else {
            "a replica registered a different definition under this controller name with a higher revision: this replica is outdated; wait for the rollout to replace it"
        };
        tracing::info!(controller = %old.id, why, "superseding the previous registration");
        old.revoke_all(RevokeReason::Superseded, why);
        old.retire();
        self.forget_scope(old);
    }

    /// A new controller: wired to its informers, its dispatch loop running.
    fn start_controller(
        &self,
        id: &ControllerId,
        registration: Registration,
        namespaces: &Option<Vec<String>>,
        quota: &Quota<'_>,
        gate: Option<Arc<dyn NamespaceGate>>,
    ) -> Arc<Controller> {
        let queued = QueuedBytes::new(
            self.queued_bytes
                .lock()
                .entry(quota.tenant.to_string())
                .or_default()
                .clone(),
            quota.limits.queued_bytes,
        );
        let controller = Controller::with_seat_pool(
            id.clone(),
            quota.tenant,
            registration,
            self.metrics.clone(),
            (&self.seat_pool, queued),
        );
        controller.apply_limits(&quota.limits);
        controller.set_hold(self.hold);
        if let Some(names) = namespaces {
            controller.confine_to(names);
        }
        self.wire(&controller, namespaces, gate, &quota.budget);
        tokio::spawn(
            controller
                .clone()
                .run(self.leading.clone(), self.stop.child_token()),
        );
        let primary = &controller.registration.primary;
        tracing::info!(controller = %id, primary = %format!("{}/{}", primary.api_version(), primary.kind), "controller registered");
        controller
    }

    /// Attach, step 3: the session itself, unless the manager closed or the controller's
    /// initial list overflowed its queue meanwhile.
    fn open_session(
        &self,
        controller: Arc<Controller>,
        quota: &Quota<'_>,
        (credits, exclusive): (u32, bool),
    ) -> Result<Attached, RegisterError> {
        let session = self.next_session.fetch_add(1, Ordering::Relaxed);
        let rx = controller.add_session(session, credits.max(1), exclusive);
        if self.is_closed() {
            // close() ran between the check above and here and may have missed this session.
            self.detach_refused(&controller, session);
            return Err(RegisterError::ShuttingDown);
        }
        if controller.is_overflowed() {
            // Its initial list alone overflowed the queue while wiring, before any session was
            // attached to hear the revocation: refuse this one instead.
            self.detach_refused(&controller, session);
            self.metrics.limit_hit(quota.tenant, "queued_keys");
            return Err(RegisterError::Limit {
                tenant: quota.tenant.to_string(),
                limit: "queued_keys",
                max: quota.limits.queued_keys as u64,
                hint: "narrow the registration's scope (namespaces, label selector, predicates) or ask for a higher limit",
            });
        }
        let scope = self.scope_of(&controller);
        Ok(Attached {
            controller,
            session,
            outbound: rx,
            credits: credits.max(1),
            scope,
            created: false,
        })
    }

    /// Set a session's credits from a Credit message, clamped so the tenant's sessions never
    /// hold more than its in-flight limit between them. Returns the credits granted.
    pub(crate) fn set_credits(
        &self,
        controller: &Arc<Controller>,
        session: u64,
        asked: u32,
    ) -> u32 {
        let tenant = &*controller.group;
        let limits = self.limits.read().for_tenant(tenant);
        // Under the table's lock, as attach checks the same sum, so the two cannot race past it.
        let controllers = self.controllers();
        let elsewhere: u64 = controllers
            .values()
            .filter(|c| &*c.group == tenant && !Arc::ptr_eq(c, controller))
            .map(|c| c.total_credits())
            .sum::<u64>()
            + controller.credits_except(session);
        let left = limits.in_flight.saturating_sub(elsewhere);
        let granted = asked.min(u32::try_from(left).unwrap_or(u32::MAX));
        if granted < asked {
            self.metrics.limit_hit(tenant, "in_flight");
            tracing::debug!(controller = %controller.id, asked, granted, "credit clamped to the tenant's in-flight limit");
        }
        controller.set_credits(session, granted);
        granted
    }

    /// Detach a session whose registration was refused (its informers could not list, the
    /// tenant's budget, the manager closing): a controller it created goes away at once.
    pub(crate) fn detach_refused(&self, controller: &Arc<Controller>, session: u64) {
        if controller.remove_session(session) == 0 {
            self.remove_if_sessionless(controller, "its registration was refused");
        }
    }

    /// Detach a session that ended. A controller whose last session ends stays, with its
    /// queue and series, for the grace period (`--controller-grace`), so a dead controller is
    /// seen (sessions 0, its queue growing, an alert) rather than vanishing; a replica that
    /// registers meanwhile takes it up where it was. Without leadership, while shutting down,
    /// with no grace, or past its queue limit, it goes at once.
    pub(crate) fn detach(&self, controller: &Arc<Controller>, session: u64) {
        if controller.remove_session(session) > 0 {
            return;
        }
        let keep = !self.grace.is_zero()
            && *self.leading.borrow()
            && !self.is_closed()
            && !controller.is_overflowed()
            && !controller.is_retiring();
        if controller.is_retiring() {
            self.remove_if_sessionless(controller, "retired by its last replica (Drain retire)");
        } else if keep {
            controller.mark_sessionless(Instant::now());
            tracing::info!(controller = %controller.id, grace = ?self.grace, "last session left; the controller stays for the grace period, its queue still counting");
        } else {
            self.remove_if_sessionless(controller, "last session left");
        }
    }

    /// Removes `controller` from the table (its subscriptions, scope and series with it) if it
    /// is still the registered one and has no session.
    fn remove_if_sessionless(&self, controller: &Arc<Controller>, why: &str) {
        let mut controllers = self.controllers();
        if controllers
            .get(&controller.id)
            .is_some_and(|c| Arc::ptr_eq(c, controller))
            && controller.session_count() == 0
        {
            controllers.remove(&controller.id);
            if let Some(release) = controller.fenced_until() {
                let mut fenced = self.fenced_until.lock();
                *fenced = Some(fenced.map_or(release, |f| f.max(release)));
            }
            controller.retire();
            self.forget_scope(controller);
            self.metrics
                .forget_controller(&controller.id.name, &controller.group);
            tracing::info!(controller = %controller.id, why, "controller removed");
        }
    }

    /// Removes the controllers whose grace period is over (no session since `grace` ago), and
    /// every sessionless one once this manager no longer leads (the next leader keeps them).
    pub(crate) fn sweep(&self, now: Instant) {
        let leading = *self.leading.borrow();
        let expired: Vec<Arc<Controller>> = self
            .all()
            .into_iter()
            .filter(|c| {
                c.sessionless_since()
                    .is_some_and(|t| !leading || now >= t + self.grace)
            })
            .collect();
        for c in expired {
            self.remove_if_sessionless(&c, "no session for the grace period");
        }
    }

    /// Shut down: refuse every later attach, then revoke every session. A session that attaches
    /// concurrently is either revoked here or sees the flag in `attach` and is refused.
    pub(crate) fn close(&self, message: &str) {
        self.closed.store(true, Ordering::SeqCst);
        self.revoke_all(RevokeReason::ShuttingDown, message);
    }

    /// Shutting down, step 1: no new session attaches and nothing more is handed out, while
    /// sessions stay open so the attempts already out can report their results.
    pub(crate) fn quiesce(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for c in self.all() {
            c.quiesce();
        }
    }

    /// Attempts still out on live sessions, across every controller.
    pub(crate) fn live_attempts(&self) -> usize {
        self.all().iter().map(|c| c.live_attempts()).sum()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// When the last key fenced after an exclusive session ended may move (None: none waits).
    /// A manager handing over waits for it before giving up its Lease, so a successor never
    /// hands out a key a replica of this manager's sessions may still be working on.
    pub(crate) fn fenced_until(&self) -> Option<Instant> {
        let gone = *self.fenced_until.lock();
        self.all()
            .iter()
            .filter_map(|c| c.fenced_until())
            .chain(gone)
            .max()
            .filter(|at| *at > Instant::now())
    }

    /// How long an exclusive session's keys stay fenced after its last heartbeat answer.
    pub(crate) fn hold(&self) -> std::time::Duration {
        self.hold
    }

    /// Revoke every session of every controller (e.g. on losing the lease).
    pub(crate) fn revoke_all(&self, reason: RevokeReason, message: &str) {
        for c in self.all() {
            c.revoke_all(reason, message);
        }
    }

    /// The namespaces to open informers in: None = one cluster-wide informer.
    /// The namespaces a registration watches: its list, or the manager's ceiling when it asks for
    /// every namespace (None: every namespace).
    pub(crate) fn effective_namespaces(
        &self,
        reg: &Registration,
    ) -> Result<Option<Vec<String>>, RegisterError> {
        match (&reg.namespaces, &self.ceiling) {
            (NamespaceScope::Names(names), Some(ceiling)) => {
                if let Some(outside) = names.iter().find(|n| !ceiling.contains(n)) {
                    return Err(RegisterError::OutsideCeiling(format!(
                        "register.namespaces.names: namespace {outside:?} is outside this manager's namespace ceiling --watch-namespace (CTRLHUB_WATCH_NAMESPACE: {})",
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

    /// Every informer `reg` would subscribe to (the same keys [`ControllerTable::wire`] uses).
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
            let form = reg.metadata_only(&owned.resource);
            keys.extend(self.informer_keys(&owned.resource, namespaces, None, form));
        }
        for watched in &reg.watches {
            let form = reg.metadata_only(&watched.resource);
            keys.extend(self.informer_keys(&watched.resource, namespaces, None, form));
        }
        if matches!(reg.namespaces, NamespaceScope::Selector(_)) {
            keys.insert(namespaces_informer_key());
        }
        keys
    }

    /// Subscribe a new controller to everything it needs; the informers it starts list within
    /// `budget`.
    fn wire(
        &self,
        controller: &Arc<Controller>,
        namespaces: &Option<Vec<String>>,
        gate: Option<Arc<dyn NamespaceGate>>,
        budget: &Arc<ListBudget>,
    ) {
        let subscribe = |key, sub| self.cache.subscribe_within(key, sub, Some(budget.clone()));
        let reg = &controller.registration;
        let scope: Option<ScopeSet> = match &reg.namespaces {
            NamespaceScope::Selector(sel) => {
                Some(self.wire_namespace_selector(controller, sel, gate))
            }
            _ => None,
        };
        for key in self.informer_keys(&reg.primary, namespaces, primary_labels(reg), false) {
            let sub = primary_subscriber(controller, scope.clone(), reg.predicate.clone());
            controller.hold(subscribe(key, sub), true);
        }
        for owned in &reg.owns {
            let primary = reg.primary.clone();
            let controller_only = owned.controller_only;
            let map = move |obj: &Value| mapping::owner_keys(obj, &primary, controller_only);
            let form = reg.metadata_only(&owned.resource);
            for key in self.informer_keys(&owned.resource, namespaces, None, form) {
                let sub = related_subscriber(
                    controller,
                    scope.clone(),
                    owned.predicate.clone(),
                    Reason::OwnedChanged,
                    map.clone(),
                );
                controller.hold(subscribe(key, sub), false);
            }
        }
        for watched in &reg.watches {
            let metadata_only = reg.metadata_only(&watched.resource);
            let mapping = watched.mapping.clone();
            let primary_namespaced = reg.primary.namespaced;
            let map = move |obj: &Value| {
                mapping::mapped_key(obj, &mapping, primary_namespaced)
                    .into_iter()
                    .collect::<Vec<_>>()
            };
            for key in self.informer_keys(&watched.resource, namespaces, None, metadata_only) {
                let sub = related_subscriber(
                    controller,
                    scope.clone(),
                    watched.predicate.clone(),
                    Reason::WatchedChanged,
                    map.clone(),
                );
                controller.hold(subscribe(key, sub), false);
            }
        }
    }

    /// Follow namespaces matching `sel`: when one enters the scope its primaries are enqueued.
    /// With a `gate`, a matching namespace enters only once the gate allows it; the check is
    /// asynchronous (a SubjectAccessReview) and this runs in the cache's synchronous fan-out, so
    /// a per-controller task makes the decisions, in the order namespaces matched.
    fn wire_namespace_selector(
        &self,
        controller: &Arc<Controller>,
        sel: &LabelSelector,
        gate: Option<Arc<dyn NamespaceGate>>,
    ) -> ScopeSet {
        let set: ScopeSet = Arc::new(RwLock::new(HashSet::new()));
        controller.limit_to_namespaces(set.clone());
        let stop = self.stop.child_token();
        let gated = gate.as_ref().map(|gate| {
            let scope = Arc::new(GatedScope::new(set.clone()));
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(admit_namespaces(
                Arc::downgrade(controller),
                gate.clone(),
                scope.clone(),
                rx,
                stop.clone(),
            ));
            (scope, tx)
        });
        self.selector_scopes().insert(
            controller.id.clone(),
            SelectorScope {
                controller: Arc::downgrade(controller),
                admitted: AdmittedNamespaces {
                    set: set.clone(),
                    gated: gated.is_some(),
                },
                stop,
            },
        );
        let sub = namespace_subscriber(
            controller,
            sel.clone(),
            self.ceiling.clone(),
            set.clone(),
            gated,
        );
        let key = namespaces_informer_key();
        controller.hold(self.cache.subscribe(key, sub), false);
        set
    }
}

/// Where a gated scope's subscriber sends each namespace that starts matching (and whether it
/// came from the initial list) to its admission task.
type Matched = mpsc::UnboundedSender<String>;

/// The subscriber to namespaces for a selector scope: a namespace that starts matching enters
/// the scope (after the gate's check when gated) and its objects are enqueued; one that stops
/// matching leaves it at once.
fn namespace_subscriber(
    controller: &Arc<Controller>,
    sel: LabelSelector,
    ceiling: Option<Vec<String>>,
    scope: ScopeSet,
    gated: Option<(Arc<GatedScope>, Matched)>,
) -> Subscriber {
    let c = Arc::downgrade(controller);
    Arc::new(move |event: &CacheEvent| {
        let Some(c) = c.upgrade() else { return };
        let (_, _, ns) = event_kind(event);
        let name = ns
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        // The namespace ceiling (--watch-namespace) bounds every scope: a namespace outside it never even gets checked.
        let allowed = ceiling.as_ref().is_none_or(|c| c.contains(&name));
        let matches =
            allowed && !matches!(event, CacheEvent::Deleted { .. }) && sel.matches_object(ns);
        if let Some((gated, tx)) = &gated {
            if !matches {
                gated.unmatched(&name);
            } else if gated.matched(&name) {
                // The task ends only with the controller, and then nothing waits for this.
                let _ = tx.send(name);
            }
            return;
        }
        let entered = {
            let mut s = scope.write();
            if matches {
                s.insert(name.clone())
            } else {
                // Leaving the scope: later events of its objects are filtered out.
                s.remove(&name);
                false
            }
        };
        if entered {
            enqueue_namespace(&c, &name);
        }
    })
}

/// Objects of a namespace that just came into scope: deliver them as initial-list work (the
/// proto: "the objects in it are delivered as INITIAL_LIST work").
fn enqueue_namespace(c: &Controller, namespace: &str) {
    c.enqueue(c.primary_keys_in(namespace), Reason::InitialList);
}

/// The namespaces of a gated selector scope: those matching the selector now, and those of
/// them the gate admitted. A namespace is admitted only while it still matches, so one that
/// stops matching while its check is in flight does not slip in when the answer comes.
struct GatedScope {
    matching: Mutex<HashSet<String>>,
    admitted: ScopeSet,
}

impl GatedScope {
    fn new(admitted: ScopeSet) -> Self {
        GatedScope {
            matching: Mutex::new(HashSet::new()),
            admitted,
        }
    }

    fn matching(&self) -> MutexGuard<'_, HashSet<String>> {
        self.matching.lock()
    }

    /// `namespace` matches the selector; true if it just started to (it needs a check).
    fn matched(&self, namespace: &str) -> bool {
        self.matching().insert(namespace.to_string())
    }

    /// `namespace` no longer matches (label removed, deleted): out of the scope at once.
    fn unmatched(&self, namespace: &str) {
        let mut matching = self.matching();
        matching.remove(namespace);
        self.admitted.write().remove(namespace);
    }

    fn is_matching(&self, namespace: &str) -> bool {
        self.matching().contains(namespace)
    }

    /// The gate allowed `namespace`: true if it entered the scope now (it still matches and was
    /// not in already), so its objects are enqueued exactly once.
    fn admit(&self, namespace: &str) -> bool {
        let matching = self.matching();
        matching.contains(namespace) && self.admitted.write().insert(namespace.to_string())
    }
}

/// When each denied namespace is asked about again: at most one entry per namespace, earliest
/// first. Plain data with the time passed in, so it is tested without a runtime.
#[derive(Debug, Default)]
struct RetrySchedule {
    due: BTreeSet<(Instant, String)>,
    at: HashMap<String, Instant>,
}

impl RetrySchedule {
    /// Ask about `namespace` again at `when` (replacing an earlier plan for it).
    fn schedule(&mut self, namespace: String, when: Instant) {
        if let Some(old) = self.at.insert(namespace.clone(), when) {
            self.due.remove(&(old, namespace.clone()));
        }
        self.due.insert((when, namespace));
    }

    /// The earliest planned re-check.
    fn next_due(&self) -> Option<Instant> {
        self.due.first().map(|(when, _)| *when)
    }

    /// One namespace whose re-check is due at `now`, if any.
    fn take_due(&mut self, now: Instant) -> Option<String> {
        let first = self.due.first().filter(|(when, _)| *when <= now)?.clone();
        self.due.remove(&first);
        self.at.remove(&first.1);
        Some(first.1)
    }

    fn len(&self) -> usize {
        self.due.len()
    }
}

/// The admission task of one gated selector scope: checks each namespace that starts matching,
/// admits it (and enqueues its objects) when allowed, and asks again about a denied one every
/// `gate.retry_after()`, so a RoleBinding created later admits it. A denial is invisible to the
/// tenant: a denied namespace and one that does not exist both simply deliver nothing.
async fn admit_namespaces(
    controller: Weak<Controller>,
    gate: Arc<dyn NamespaceGate>,
    scope: Arc<GatedScope>,
    mut matched: mpsc::UnboundedReceiver<String>,
    stop: CancellationToken,
) {
    let mut retry = RetrySchedule::default();
    loop {
        let namespace = match retry.take_due(Instant::now()) {
            Some(namespace) => namespace,
            None => {
                let wake = retry.next_due();
                tokio::select! {
                    _ = stop.cancelled() => return,
                    got = matched.recv() => match got {
                        Some(next) => next,
                        None => return,
                    },
                    _ = async {
                        match wake {
                            Some(at) => tokio::time::sleep_until(at.into()).await,
                            None => std::future::pending().await,
                        }
                    } => continue,
                }
            }
        };
        if !scope.is_matching(&namespace) {
            continue;
        }
        let decision = tokio::select! {
            _ = stop.cancelled() => return,
            d = gate.admit(&namespace) => d,
        };
        let Some(c) = controller.upgrade() else {
            return;
        };
        match decision {
            Ok(true) => {
                if scope.admit(&namespace) {
                    tracing::debug!(controller = %c.id, namespace = %namespace, "namespace admitted into the selector scope");
                    enqueue_namespace(&c, &namespace);
                }
            }
            Ok(false) => {
                tracing::debug!(controller = %c.id, namespace = %namespace, "namespace matches the selector but access is denied; asking again later");
                retry.schedule(namespace, Instant::now() + gate.retry_after());
            }
            Err(e) => {
                tracing::warn!(controller = %c.id, namespace = %namespace, error = %e, "cannot check access to a namespace entering the selector scope; asking again later");
                retry.schedule(namespace, Instant::now() + gate.retry_after());
            }
        }
        tracing::trace!(controller = %c.id, waiting = retry.len(), "namespace admissions pending a re-check");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_namespace_is_admitted_only_while_it_matches_and_only_once() {
        let scope = GatedScope::new(Arc::new(RwLock::new(HashSet::new())));
        assert!(!scope.admit("a"), "never matched: not admitted");
        assert!(scope.matched("a"), "first match asks for a check");
        assert!(
            !scope.matched("a"),
            "a relabel that still matches does not ask again"
        );
        assert!(scope.admit("a"));
        assert!(!scope.admit("a"), "entering twice would enqueue twice");
        assert!(scope.admitted.read().contains("a"));
        scope.unmatched("a");
        assert!(!scope.admitted.read().contains("a"));
        assert!(
            !scope.admit("a"),
            "an answer arriving after the label was removed does not admit it"
        );
        assert!(scope.matched("a"), "matching again asks for a new check");
    }

    /// With one slot, a tenant's second registration waits behind another tenant's first:
    /// after a failover no tenant's many registrations starve the others' lists.
    #[tokio::test]
    async fn first_list_turns_go_round_the_tenants() {
        let turns = Arc::new(ListTurns::new(1));
        let a1 = turns.take("a".into()).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let wait = |tenant: &'static str, label: &'static str| {
            let (turns, order) = (turns.clone(), order.clone());
            tokio::spawn(async move {
                let turn = turns.take(tenant.into()).await;
                order.lock().push(label);
                drop(turn);
            })
        };
        let a2 = wait("a", "a2");
        tokio::task::yield_now().await;
        let b1 = wait("b", "b1");
        // Both wait: a2 for tenant a's turn, b1 for the slot.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(order.lock().is_empty(), "the one slot is taken");
        drop(a1);
        let (r1, r2) = tokio::join!(a2, b1);
        r1.expect("a2 ran");
        r2.expect("b1 ran");
        assert_eq!(*order.lock(), vec!["b1", "a2"]);
    }

    #[test]
    fn retries_come_due_in_order_once_per_namespace() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut r = RetrySchedule::default();
        assert_eq!(r.take_due(t0), None);
        r.schedule("b".into(), t0 + 2 * s);
        r.schedule("a".into(), t0 + s);
        r.schedule("b".into(), t0 + 3 * s);
        assert_eq!(r.len(), 2, "one plan per namespace");
        assert_eq!(r.next_due(), Some(t0 + s));
        assert_eq!(r.take_due(t0), None, "nothing before its time");
        assert_eq!(r.take_due(t0 + 2 * s).as_deref(), Some("a"));
        assert_eq!(r.take_due(t0 + 2 * s), None, "b was moved to 3 s");
        assert_eq!(r.take_due(t0 + 3 * s).as_deref(), Some("b"));
        assert_eq!(r.next_due(), None);
    }
}
