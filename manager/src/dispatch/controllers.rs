//! The controller table: who registered what, controllers by (tenant, name), and their
//! sessions. Attaching a session checks its tenant's limits, joins or supersedes the controller
//! of its name, and starts a new one (its scope, its subscriptions through `routing`, its
//! dispatch loop); detaching keeps a sessionless controller for the grace period.

use crate::dispatch::dispatcher::{Controller, ControllerId, Outbox, RevokeReason};
use crate::dispatch::queue::Reason;
use crate::dispatch::register_error::RegisterError;
use crate::dispatch::routing;
use crate::dispatch::scope::Scope;
use crate::dispatch::seats::SeatPool;
use crate::dispatch::usage::QueuedBytes;
use crate::informer::{Cache, InformerKey, ListBudget};
use crate::registration::{Invalid, NamespaceScope, Registration};
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
    /// Ring mode: the controller moved here from another member. A moved controller is
    /// admitted whatever this member's tenant limits say (the overshoot is counted): limits
    /// govern new controllers, and refusing a moved one would orphan it.
    pub moved: bool,
}

/// Where each controller's dispatch gate comes from: one for all while this manager leads
/// (leader mode), or one per controller from the ring (ring mode).
pub(crate) trait Gates: Send + Sync {
    /// The gate of a new controller named `name` of tenant group `group`: it dispatches while
    /// the gate is open, and stops when the sender goes away.
    fn gate(&self, group: &str, name: &str) -> watch::Receiver<bool>;
}

/// Leader mode's gates: every controller dispatches while this manager holds the Lease.
pub(crate) struct Leading(pub watch::Receiver<bool>);

impl Gates for Leading {
    fn gate(&self, _group: &str, _name: &str) -> watch::Receiver<bool> {
        self.0.clone()
    }
}

/// A tenant being attached to, its limits, and what the first lists of a registration it
/// starts may still fill.
struct Quota<'a> {
    tenant: &'a str,
    limits: Limits,
    budget: Arc<ListBudget>,
    /// A moved controller: over a limit is counted, not refused.
    moved: bool,
}
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

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
    /// Whether this session's registration created the controller (rather than joining it).
    pub created: bool,
    /// Whether the controller moved here from another member (exempt from tenant limits).
    pub moved: bool,
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
    /// Each new controller's dispatch gate.
    gates: Arc<dyn Gates>,
    stop: CancellationToken,
    metrics: Arc<crate::metrics::Metrics>,
    /// Replaced whole when tenant policies change (`set_limits`).
    limits: RwLock<TenantLimits>,
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

impl ControllerTable {
    /// A controller table whose tenants share the manager as `sharing` says.
    pub(crate) fn new(
        cache: Arc<Cache>,
        ceiling: Option<Vec<String>>,
        (leading, gates): (watch::Receiver<bool>, Arc<dyn Gates>),
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
            gates,
            stop,
            metrics,
            limits: RwLock::new(limits),
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
        let scope = self.scope_for(&registration, gate)?;
        let group = self.group_of(tenant);
        let limits = self.limits.read().for_tenant(&group);
        let held = self.cached_bytes(&group);
        let quota = Quota {
            tenant: &group,
            limits,
            budget: if terms.moved {
                ListBudget::new(u64::MAX, u64::MAX)
            } else {
                ListBudget::new(
                    limits.cached_bytes.saturating_sub(held),
                    limits.cached_bytes,
                )
            },
            moved: terms.moved,
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
                scope,
                &quota,
            )?;
            let created = before != Some(Arc::as_ptr(&controller));
            (controller, credits, created)
        };
        let mut attached = self.open_session(controller, &quota, (credits, terms.exclusive))?;
        attached.created = created;
        attached.moved = terms.moved;
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
        let starts = routing::needed_informers(registration, namespaces.as_deref())
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
        if attached.moved {
            self.exempted(tenant, "cached_bytes");
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

    /// A moved controller went over `limit`: admitted, and counted.
    fn exempted(&self, tenant: &str, limit: &str) {
        self.metrics.ring.exempted(tenant);
        tracing::info!(
            tenant,
            limit,
            "a controller that moved here is admitted over a tenant limit"
        );
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
        let over = !controllers.contains_key(id) && mine.len() >= quota.limits.controllers;
        if over && quota.moved {
            self.exempted(quota.tenant, "controllers");
        } else if over {
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
        scope: Scope,
        quota: &Quota<'_>,
    ) -> Result<Arc<Controller>, RegisterError> {
        let joinable = |existing: &Arc<Controller>| {
            let theirs = existing.scope();
            existing.registration == registration
                && (!scope.is_gated() || !theirs.is_selecting() || theirs.is_gated())
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
        self.check_informer_limit(controllers, id, &registration, scope.namespaces(), quota)?;
        self.check_registration_rate(quota)?;
        if let Some(old) = existing {
            self.supersede(old, &registration);
        }
        let controller = self.start_controller(id, (registration, scope), quota);
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
        if quota.moved {
            self.exempted(tenant, "registrations");
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
        namespaces: Option<&[String]>,
        quota: &Quota<'_>,
    ) -> Result<(), RegisterError> {
        let mut informers: HashSet<InformerKey> = controllers
            .values()
            .filter(|c| &*c.group == quota.tenant && c.id != *id)
            .flat_map(|c| c.informer_keys())
            .collect();
        informers.extend(routing::needed_informers(registration, namespaces));
        if informers.len() > quota.limits.informers {
            if quota.moved {
                self.exempted(quota.tenant, "informers");
                return Ok(());
            }
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
        // Its admission task, if any, stops with it.
        old.retire();
    }

    /// A new controller: wired to its informers, its dispatch loop running.
    fn start_controller(
        &self,
        id: &ControllerId,
        (registration, scope): (Registration, Scope),
        quota: &Quota<'_>,
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
            scope,
            self.metrics.clone(),
            (&self.seat_pool, queued),
        );
        controller.apply_limits(&quota.limits);
        controller.set_hold(self.hold);
        routing::wire(&self.cache, &controller, &quota.budget, &self.stop);
        tokio::spawn(controller.clone().run(
            self.gates.gate(quota.tenant, &id.name),
            self.stop.child_token(),
        ));
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
        Ok(Attached {
            controller,
            session,
            outbound: rx,
            credits: credits.max(1),
            created: false,
            moved: false,
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
            self.metrics
                .forget_controller(&controller.id.name, &controller.group);
            tracing::info!(controller = %controller.id, why, "controller removed");
        }
    }

    /// Ring mode: hand `controller` over to the member that owns it now. Its gate is already
    /// closed, so nothing more goes out; attempts out may finish within `drain`; then every
    /// session is told where to go (`UNIT_MOVED`), and once the keys an exclusive session may
    /// still be working on are free (the hold), the controller leaves the table. Only then may
    /// this member publish a view without it.
    pub(crate) async fn seal(&self, controller: &Arc<Controller>, drain: std::time::Duration) {
        let tick = std::time::Duration::from_millis(20);
        // Polled: a seal happens once per move, and results arrive on many sessions' tasks.
        let deadline = Instant::now() + drain;
        while controller.live_attempts() > 0 && Instant::now() < deadline {
            tokio::time::sleep(tick).await;
        }
        let abandoned = controller.live_attempts();
        controller.revoke_all(
            RevokeReason::UnitMoved,
            "another ctrlhub member owns this controller now: register there (Revoked.owner_address)",
        );
        // The sessions end on their own tasks; an exclusive one's keys are fenced from then.
        let ended = Instant::now() + std::time::Duration::from_secs(2);
        while controller.session_count() > 0 && Instant::now() < ended {
            tokio::time::sleep(tick).await;
        }
        if let Some(until) = controller.fenced_until() {
            tokio::time::sleep_until(until.into()).await;
        }
        {
            let mut controllers = self.controllers();
            if controllers
                .get(&controller.id)
                .is_some_and(|c| Arc::ptr_eq(c, controller))
            {
                controllers.remove(&controller.id);
            }
        }
        controller.retire();
        self.metrics
            .forget_controller(&controller.id.name, &controller.group);
        tracing::info!(controller = %controller.id, abandoned, "controller handed over to another member");
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

    /// The scope a new controller of `reg` gets: its namespaces (within the ceiling) and, for a
    /// namespace label selector, the namespaces matching it, each checked by `gate` first when
    /// there is one.
    fn scope_for(
        &self,
        reg: &Registration,
        gate: Option<Arc<dyn NamespaceGate>>,
    ) -> Result<Scope, RegisterError> {
        let names = self.effective_namespaces(reg)?;
        let namespaced = reg.primary.namespaced;
        Ok(match &reg.namespaces {
            NamespaceScope::Selector(sel) => Scope::selecting(namespaced, names, sel.clone(), gate),
            _ => Scope::new(namespaced, names),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
