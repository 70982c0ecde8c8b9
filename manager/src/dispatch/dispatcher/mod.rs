//! One registered controller at run time: its work queue, the sessions of its replicas, what is in
//! flight where, and the dispatch loop that hands keys to sessions with free credits.
//!
//! Exclusivity comes from the queue (a key in processing is never popped again); at-least-once
//! from re-queueing everything a session held when it ends and every request whose deadline
//! passes; a late result carries a stale handout id and is ignored.
//!
//! - this file: the [`Controller`] and what feeds it — keys, events, informers, sessions;
//! - `round`: the dispatch loop, one round at a time (expire deadlines → dispatch events →
//!   dispatch keys);
//! - `results`: results and acks coming back, and the failures kept for the status page;
//! - `state`: what the controller's lock guards;
//! - `messages`: what goes out to a session, its outbox, and what a result did;
//! - `inspect`: read-only figures for `/metrics` and the status page.

mod inspect;
mod messages;
mod results;
mod round;
mod state;
#[cfg(test)]
mod tests;

pub(crate) use messages::{
    Completion, Outbound, Outbox, Payload, Request, RevokeReason, Tombstone, TraceContext,
};
pub(crate) use results::{RECENT_ERRORS, RecentError};

use crate::dispatch::event_queue::EventType;
use crate::dispatch::queue::{Priority, Reason, WorkQueue};
use crate::dispatch::scope::Scope;
use crate::dispatch::seats::{Flow, SeatPool};
use crate::dispatch::spans;
use crate::dispatch::usage::QueuedBytes;
use crate::informer::object::CachedObject;
use crate::informer::{CacheEvent, Informer, InformerKey, ObjectKey, Subscription};
use crate::metrics::Metrics;
use crate::registration::Registration;
use parking_lot::{Mutex, MutexGuard};
use serde_json::Value;
use state::{SessionSlot, State};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::Notify;

pub(crate) use crate::key::ControllerId;

/// Counters for status and metrics.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Requests dispatched.
    pub dispatched: AtomicU64,
    /// Reconciles that finished well, and EVENTS-mode acks.
    pub done: AtomicU64,
    /// Results asking for a requeue.
    pub requeued: AtomicU64,
    /// Error results.
    pub errors: AtomicU64,
    /// Terminal results.
    pub terminal: AtomicU64,
    /// Requests whose deadline passed.
    pub deadline_misses: AtomicU64,
    /// Requests re-queued because their session ended.
    pub redelivered: AtomicU64,
    /// Results and acks discarded: for an id not in flight on their session (late, duplicate
    /// or unknown).
    pub discarded: AtomicU64,
}

/// A registered controller.
pub(crate) struct Controller {
    /// Tenant and name.
    pub id: ControllerId,
    /// The tenant its limits and dispatch seats count against: `id.tenant`, or the group it
    /// belongs to (see [`crate::tenancy::TenantGrouping`]).
    pub group: Arc<str>,
    /// What it registered.
    pub registration: Registration,
    state: Mutex<State>,
    /// Wakes the dispatch task: new work, credits, results, or a dispatch seat granted.
    wake: Arc<Notify>,
    /// This controller's claim on the manager's dispatch seats.
    flow: Flow,
    next_request: AtomicU64,
    /// Informers holding primaries, by namespace ("" = all namespaces).
    primaries: Mutex<Vec<Arc<Informer>>>,
    subscriptions: Mutex<Vec<Subscription>>,
    /// Which keys it may deliver: every key is checked against it whatever produced it.
    scope: Scope,
    /// Counters for status and metrics.
    pub counters: Counters,
    metrics: Arc<Metrics>,
    recent_errors: Mutex<VecDeque<RecentError>>,
    queue_limit: std::sync::atomic::AtomicUsize,
    overflowed: std::sync::atomic::AtomicBool,
    /// Missed deadlines are logged once per period, not once per request.
    deadline_log: Mutex<crate::throttle::LogEvery>,
    /// Cancelled when the controller goes away: ends its dispatch task, which holds it.
    retired: tokio_util::sync::CancellationToken,
    /// Bytes of events and tombstones it holds, counted against its tenant's limit.
    queued: QueuedBytes,
    /// Set once every informer it uses has its first list: nothing is dispatched before.
    synced: std::sync::atomic::AtomicBool,
    /// Set when the manager shuts down: nothing more is handed out, so the attempts already
    /// out can finish within the shutdown grace.
    quiesced: std::sync::atomic::AtomicBool,
    /// Its last replica said it is retired on purpose (Drain with `retire`): when no session
    /// is left it goes at once instead of staying for the grace. A session attaching clears it.
    retiring: std::sync::atomic::AtomicBool,
    /// The highest `Register.revision` among its sessions: a different definition needs a
    /// higher one to supersede it.
    revision: AtomicU64,
    /// Since when it has had no session (None while one is attached).
    sessionless: Mutex<Option<Instant>>,
    /// How long after an exclusive session's last heartbeat answer its unfinished keys stay
    /// fenced once it is gone (the manager's `--hold-period`).
    hold: std::sync::atomic::AtomicU64,
}

/// What a tombstone keeps of an object when the tenant's queued bytes cannot hold all of it:
/// enough for a controller to know what is gone and to clean up after it.
fn identity_of(object: &Value) -> Value {
    let field = |path: &str| object.pointer(path).cloned().unwrap_or(Value::Null);
    let mut metadata = serde_json::Map::new();
    for name in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "deletionTimestamp",
    ] {
        let value = field(&format!("/metadata/{name}"));
        if !value.is_null() {
            metadata.insert(name.into(), value);
        }
    }
    serde_json::json!({
        "apiVersion": field("/apiVersion"),
        "kind": field("/kind"),
        "metadata": metadata,
    })
}

/// The last look at a message before it leaves the manager: dispatch checked its key when it
/// was queued, but resyncs and retries re-deliver keys from every namespace the primary
/// informers cache, and a namespace can leave a selector scope while a key waits in the outbox.
/// One outside the scope now is settled here, unseen: a request as done, an event as acked.
impl messages::Release for Controller {
    fn release(&self, session: u64, message: &Outbound) -> bool {
        match message {
            Outbound::Reconcile(r) if !self.admits(&r.key) => {
                tracing::debug!(controller = %self.id, key = %r.key, "key outside the namespace scope withheld");
                self.complete(session, &r.id, crate::dispatch::queue::Outcome::Done, "");
                false
            }
            Outbound::Event { id, delivery, .. } if !self.admits(&delivery.key) => {
                tracing::debug!(controller = %self.id, key = %delivery.key, "event outside the namespace scope withheld");
                self.ack(session, id);
                false
            }
            _ => true,
        }
    }
}

/// How often a controller that keeps missing deadlines gets a log line.
const DEADLINE_LOG_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

impl Controller {
    #[cfg(test)]
    /// A controller with an empty queue and no sessions, no limit on dispatch seats, and
    /// nothing to wait for before dispatching, in every namespace.
    pub(crate) fn new(
        id: ControllerId,
        registration: Registration,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let scope = Scope::new(registration.primary.namespaced, None);
        Self::scoped(id, registration, scope, metrics)
    }

    #[cfg(test)]
    /// [`Controller::new`] within `scope`.
    pub(crate) fn scoped(
        id: ControllerId,
        registration: Registration,
        scope: Scope,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let group = id.tenant.clone();
        let c = Self::with_seat_pool(
            id,
            &group,
            registration,
            scope,
            metrics,
            (&SeatPool::unlimited(), QueuedBytes::unlimited()),
        );
        // Unit tests have no informers to wait for.
        c.mark_synced();
        c
    }

    /// A controller whose requests take seats from `seat_pool`, shared with other tenants, and
    /// whose events and tombstones count in `queued`, its tenant's queued bytes.
    pub(crate) fn with_seat_pool(
        id: ControllerId,
        group: &str,
        registration: Registration,
        scope: Scope,
        metrics: Arc<Metrics>,
        (seat_pool, queued): (&Arc<SeatPool>, QueuedBytes),
    ) -> Arc<Self> {
        let queue = WorkQueue::new(registration.backoff);
        // Its counters and histograms read 0 until it does something, not "No data".
        metrics.preinitialise_controller(&id.name, group);
        let wake = Arc::new(Notify::new());
        let flow = seat_pool.flow(group, wake.clone());
        Arc::new(Controller {
            id,
            group: Arc::from(group),
            registration,
            state: Mutex::new(State::new(queue)),
            wake,
            flow,
            next_request: AtomicU64::new(1),
            primaries: Mutex::new(Vec::new()),
            subscriptions: Mutex::new(Vec::new()),
            scope,
            counters: Counters::default(),
            metrics,
            recent_errors: Mutex::new(VecDeque::with_capacity(RECENT_ERRORS)),
            queue_limit: std::sync::atomic::AtomicUsize::new(0),
            overflowed: std::sync::atomic::AtomicBool::new(false),
            deadline_log: Mutex::new(crate::throttle::LogEvery::new(DEADLINE_LOG_PERIOD)),
            retired: tokio_util::sync::CancellationToken::new(),
            queued,
            synced: std::sync::atomic::AtomicBool::new(false),
            quiesced: std::sync::atomic::AtomicBool::new(false),
            retiring: std::sync::atomic::AtomicBool::new(false),
            revision: AtomicU64::new(0),
            sessionless: Mutex::new(None),
            hold: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// What every informer this controller holds watches.
    pub(crate) fn informer_keys(&self) -> Vec<InformerKey> {
        self.subscriptions
            .lock()
            .iter()
            .map(|s| s.informer().key().clone())
            .collect()
    }

    /// Every informer this controller subscribed to.
    pub(crate) fn informers(&self) -> Vec<Arc<Informer>> {
        self.subscriptions
            .lock()
            .iter()
            .map(|s| s.informer().clone())
            .collect()
    }

    /// Keep the informer subscriptions alive as long as the controller.
    pub(crate) fn hold(&self, subscription: Subscription, primary: bool) {
        if primary {
            self.primaries.lock().push(subscription.informer().clone());
        }
        self.subscriptions.lock().push(subscription);
    }

    /// Drop every informer subscription (the controller is going away).
    pub(crate) fn release_informers(&self) {
        self.subscriptions.lock().clear();
        self.primaries.lock().clear();
    }

    /// The controller is going away: drop its subscriptions and end its dispatch task, so
    /// nothing it spawned outlives it.
    pub(crate) fn retire(&self) {
        self.release_informers();
        self.retired.cancel();
    }

    /// Cancelled when the controller goes away: what it started beside its dispatch task
    /// (a scope's admission task) stops with it.
    pub(crate) fn retirement(&self) -> tokio_util::sync::CancellationToken {
        self.retired.clone()
    }

    /// Its namespace scope.
    pub(crate) fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Whether `key` is within the registration's scope (see [`Scope::admits`]). Every key is
    /// checked here whatever produced it, so no mapping (a field naming another tenant's
    /// namespace, an owner reference) can deliver a key from outside the scope.
    pub(crate) fn admits(&self, key: &ObjectKey) -> bool {
        self.scope.admits(key)
    }

    /// Enqueue keys because of `reason` (initial lists and resyncs are background work). Keys
    /// outside the scope are dropped.
    pub(crate) fn enqueue(&self, keys: impl IntoIterator<Item = ObjectKey>, reason: Reason) {
        if self.overflowed.load(Ordering::Relaxed) {
            // Revoked for exceeding its queue limit: hold nothing more until it is gone.
            return;
        }
        let keys = keys.into_iter().filter(|k| {
            let inside = self.admits(k);
            if !inside {
                tracing::debug!(controller = %self.id, key = %k, "key outside the registration's scope dropped");
            }
            inside
        });
        let keys: Vec<ObjectKey> = keys.collect();
        if keys.is_empty() {
            return;
        }
        let now = Instant::now();
        let background = reason.priority() == Priority::Background;
        let enqueued = spans::enabled().then(|| spans::Enqueued::now(background));
        let mut st = self.lock();
        for key in keys {
            if let Some(enqueued) = enqueued {
                st.links.enqueued(&key, enqueued);
            }
            st.queue.add_because(key, reason, now);
        }
        let queued = st.queue.len() + st.queue.waiting_len();
        drop(st);
        self.check_queue_limit(queued);
        self.wake.notify_one();
    }

    /// EVENTS mode: append a change of a primary (compacted into its pending change when the
    /// queue allows), counted against the tenant's queued bytes and the queued-keys limit.
    pub(crate) fn push_event(&self, kind: EventType, object: &Value) {
        if self.overflowed.load(Ordering::Relaxed) {
            return;
        }
        let key = crate::registration::mapping::own_key(object);
        if !self.admits(&key) {
            return;
        }
        let object = CachedObject::from_value(object);
        let enqueued = spans::enabled().then(|| spans::Enqueued::now(kind == EventType::Sync));
        let mut st = self.lock();
        if let Some(enqueued) = enqueued {
            st.links.enqueued(&key, enqueued);
        }
        let grew = st.events.push(key, kind, object);
        let waiting = st.events.len();
        drop(st);
        let within = self.queued.add(grew);
        self.check_queue_limit(waiting);
        if !within {
            self.revoke_for_queued_bytes();
        }
        self.wake.notify_one();
    }

    /// EVENTS mode: the tenant's queued bytes are spent (a consumer that does not acknowledge,
    /// a flood of large objects): revoke the controller as for its queued keys, so what it pins
    /// stays bounded; it goes away with its sessions.
    fn revoke_for_queued_bytes(&self) {
        if self.overflowed.swap(true, Ordering::Relaxed) {
            return;
        }
        let limit = self.queued.limit();
        tracing::warn!(controller = %self.id, tenant = %self.group, limit, "queued-bytes limit exceeded; revoking the registration");
        self.metrics.limit_hit(&self.group, "queued_bytes");
        self.revoke_all(
            RevokeReason::QuotaExceeded,
            &format!(
                "the events waiting for controller {} and the tenant's other controllers hold more than {limit} bytes (the tenant's queued-bytes limit): acknowledge events promptly, narrow the registration, or ask for a higher limit",
                self.id.name
            ),
        );
    }

    /// Caps the keys this controller may hold queued (`0` = unlimited); set from the tenant's
    /// limits when the controller is created.
    pub(crate) fn set_queue_limit(&self, limit: usize) {
        self.queue_limit.store(limit, Ordering::Relaxed);
    }

    /// Take its tenant's limits as they are now (set at start, and again when tenant policies
    /// change): the ones counted while it runs; the others apply when a registration comes.
    pub(crate) fn apply_limits(&self, limits: &crate::tenancy::Limits) {
        self.set_queue_limit(limits.queued_keys);
        self.queued.set_limit(limits.queued_bytes);
    }

    /// Past its limit the controller is revoked (RESOURCE_EXHAUSTED) and stops taking keys, so
    /// the memory a tenant's flood can pin stays bounded; it goes away with its sessions.
    fn check_queue_limit(&self, queued: usize) {
        let limit = self.queue_limit.load(Ordering::Relaxed);
        if limit == 0 || queued <= limit || self.overflowed.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(controller = %self.id, queued, limit, "queued-keys limit exceeded; revoking the registration");
        self.metrics.limit_hit(&self.group, "queued_keys");
        self.revoke_all(
            RevokeReason::QuotaExceeded,
            &format!(
                "controller {} has more than {limit} keys queued (the tenant's queued-keys limit): narrow its scope with namespaces, a label selector or predicates, or ask for a higher limit",
                self.id.name
            ),
        );
    }

    /// Whether the controller exceeded its queued-keys limit (it is being removed).
    pub(crate) fn is_overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// Credits of all attached sessions (what the tenant's in-flight limit counts).
    pub(crate) fn total_credits(&self) -> u64 {
        self.lock()
            .sessions
            .values()
            .map(|s| u64::from(s.credits))
            .sum()
    }

    /// Credits of every attached session but `session`.
    pub(crate) fn credits_except(&self, session: u64) -> u64 {
        self.lock()
            .sessions
            .iter()
            .filter(|(id, _)| **id != session)
            .map(|(_, s)| u64::from(s.credits))
            .sum()
    }

    /// Keep a deleted primary's last state for the request its deletion enqueues, or forget a
    /// recreated one's. Called only for events that enqueue the key (in scope, past the
    /// predicate): a tombstone is kept only while its key is queued or in flight, never for
    /// deletions nobody will hear of (another tenant's objects in a shared informer).
    pub(crate) fn settle_tombstone(&self, event: &CacheEvent) {
        match event {
            CacheEvent::Deleted {
                object,
                final_state_unknown,
            } => {
                let key = crate::registration::mapping::own_key(object);
                if !self.admits(&key) {
                    return;
                }
                let full = CachedObject::from_value(object);
                let last = if self.queued.fits(full.json().len()) {
                    full
                } else {
                    // Past the tenant's queued bytes, the request still says what is gone.
                    self.metrics.limit_hit(&self.group, "queued_bytes");
                    CachedObject::from_value(&identity_of(object))
                };
                let tombstone = Tombstone {
                    last,
                    final_state_unknown: *final_state_unknown,
                    left_scope: self.left_scope(object),
                };
                let added = tombstone.last.json().len() as isize;
                let replaced = self.lock().tombstones.insert(key, tombstone);
                let freed = replaced.map_or(0, |t| t.last.json().len() as isize);
                self.queued.add(added - freed);
            }
            CacheEvent::Added { object, .. } | CacheEvent::Modified { new: object, .. } => {
                self.forget_tombstone(&crate::registration::mapping::own_key(object));
            }
        }
    }

    /// Drop `key`'s tombstone (recreated, or its last request finished), giving its bytes back.
    fn forget_tombstone(&self, key: &ObjectKey) {
        let gone = self.lock().tombstones.remove(key);
        if let Some(t) = gone {
            self.queued.add(-(t.last.json().len() as isize));
        }
    }

    /// Why a primary's change enqueues its key, as the proto names it.
    pub(crate) fn primary_reason(&self, event: &CacheEvent) -> Reason {
        match event {
            CacheEvent::Added { initial: true, .. } => Reason::InitialList,
            CacheEvent::Added { .. } => Reason::Created,
            CacheEvent::Modified { .. } => Reason::Updated,
            CacheEvent::Deleted { object, .. } if self.left_scope(object) => Reason::LeftScope,
            CacheEvent::Deleted { .. } => Reason::Deleted,
        }
    }

    /// Whether a primary the informer reports gone still exists but left the registration's
    /// label selector: a selector-filtered watch reports such an object as deleted, in its new
    /// state, which no longer matches; a real deletion's last state still does.
    fn left_scope(&self, object: &Value) -> bool {
        self.registration
            .label_selector
            .as_ref()
            .is_some_and(|s| !s.matches_object(object))
    }

    /// The primary keys cached in `namespace`: a range of each primary informer, not a scan
    /// of every key (a namespace entering a selector scope costs what it holds).
    pub(crate) fn primary_keys_in(&self, namespace: &str) -> Vec<ObjectKey> {
        let informers = self.primaries.lock().clone();
        informers
            .iter()
            .flat_map(|i| i.range(Some(namespace), None, usize::MAX).0)
            .map(|(k, _)| k)
            .collect()
    }

    /// Every primary key currently cached (for resync).
    pub(crate) fn primary_keys(&self) -> Vec<ObjectKey> {
        let informers = self.primaries.lock().clone();
        informers.iter().flat_map(|i| i.keys()).collect()
    }

    /// The primary keys within this controller's scope: every cached one, less those of
    /// namespaces a selector scope has not admitted.
    pub(crate) fn scoped_primary_keys(&self) -> Vec<ObjectKey> {
        let mut keys = self.primary_keys();
        keys.retain(|k| self.admits(k));
        keys
    }

    fn primary_object(&self, key: &ObjectKey) -> Option<CachedObject> {
        let informers = self.primaries.lock().clone();
        informers
            .iter()
            .find_map(|i| i.get(&key.namespace, &key.name))
    }

    /// Attach a replica's session; returns what it receives. An `exclusive` session's
    /// attempts stay in flight until it confirms they ended (see [`Phase`]).
    pub(crate) fn add_session(
        self: &Arc<Self>,
        session: u64,
        credits: u32,
        exclusive: bool,
    ) -> Outbox {
        let me: std::sync::Weak<Self> = Arc::downgrade(self);
        let release: std::sync::Weak<dyn messages::Release> = me;
        let (tx, outbox) = messages::mailbox(self.wake.clone(), release, session);
        // A replica attaching means the controller runs again, whatever an earlier one said.
        self.retiring.store(false, Ordering::Relaxed);
        let mut st = self.lock();
        st.sessions.insert(
            session,
            SessionSlot {
                credits,
                in_flight: 0,
                draining: false,
                tx,
                exclusive,
                last_echo: Instant::now(),
            },
        );
        self.update_demand(&st);
        drop(st);
        *self.sessionless.lock() = None;
        self.wake.notify_one();
        outbox
    }

    /// Its last session ended at `at`: it waits for a replica for the grace period.
    pub(crate) fn mark_sessionless(&self, at: Instant) {
        *self.sessionless.lock() = Some(at);
    }

    /// Since when it has had no session, if it has none.
    pub(crate) fn sessionless_since(&self) -> Option<Instant> {
        *self.sessionless.lock()
    }

    /// The manager answered `session`'s heartbeat now.
    pub(crate) fn heartbeat_answered(&self, session: u64) {
        if let Some(slot) = self.lock().sessions.get_mut(&session) {
            slot.last_echo = Instant::now();
        }
    }

    /// The revision of its definition (the highest its sessions registered with).
    pub(crate) fn revision(&self) -> u64 {
        self.revision.load(Ordering::Relaxed)
    }

    /// A session registered this definition with `revision`.
    pub(crate) fn raise_revision(&self, revision: u64) {
        self.revision.fetch_max(revision, Ordering::Relaxed);
    }

    /// Every informer has its first list: dispatch may begin.
    pub(crate) fn mark_synced(&self) {
        if !self.synced.swap(true, Ordering::Relaxed) {
            self.wake.notify_one();
        }
    }

    /// Whether dispatch may begin (every informer has its first list).
    pub(crate) fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// Hand out nothing more (the manager is shutting down); attempts already out may finish.
    pub(crate) fn quiesce(&self) {
        self.quiesced.store(true, Ordering::Relaxed);
    }

    /// A replica said the controller is retired on purpose (Drain with `retire`).
    pub(crate) fn mark_retiring(&self) {
        self.retiring.store(true, Ordering::Relaxed);
    }

    /// Whether it goes at once when its last session ends.
    pub(crate) fn is_retiring(&self) -> bool {
        self.retiring.load(Ordering::Relaxed)
    }

    /// Whether the manager stopped handing out this controller's work.
    pub(crate) fn is_quiesced(&self) -> bool {
        self.quiesced.load(Ordering::Relaxed)
    }

    /// Attempts out on a live session whose results have not come back (expired and orphaned
    /// ones are not waited for: their sessions may never answer).
    pub(crate) fn live_attempts(&self) -> usize {
        self.lock()
            .in_flight
            .values()
            .filter(|f| matches!(f.phase, state::Phase::Live))
            .count()
    }

    /// Sets how long an exclusive session's unfinished keys stay fenced after its last
    /// heartbeat answer once it is gone.
    pub(crate) fn set_hold(&self, hold: std::time::Duration) {
        self.hold.store(
            u64::try_from(hold.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn hold_period(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.hold.load(Ordering::Relaxed))
    }

    /// The latest release of a key fenced after its exclusive session ended, if any waits:
    /// a manager handing over must not let another take the key earlier.
    pub(crate) fn fenced_until(&self) -> Option<Instant> {
        self.lock()
            .in_flight
            .values()
            .filter_map(|f| match f.phase {
                state::Phase::Orphaned { release } => Some(release),
                _ => None,
            })
            .max()
    }

    /// Change a session's credits (absolute).
    pub(crate) fn set_credits(&self, session: u64, credits: u32) {
        let mut st = self.lock();
        if let Some(s) = st.sessions.get_mut(&session) {
            s.credits = credits;
        }
        self.update_demand(&st);
        drop(st);
        self.wake.notify_one();
    }

    /// Tell the seat pool how many seats this controller's sessions could hold at once, which
    /// sizes its tenant's guaranteed share.
    fn update_demand(&self, st: &State) {
        let credits: u64 = st
            .sessions
            .values()
            .filter(|s| !s.draining)
            .map(|s| u64::from(s.credits))
            .sum();
        let demand = match self.registration.max_concurrent {
            0 => credits,
            max => credits.min(u64::from(max)),
        };
        self.flow.set_demand(demand);
    }

    /// Stop sending new work to a session; it gets `Drained` once its in-flight results are in.
    pub(crate) fn drain(&self, session: u64) {
        let mut st = self.lock();
        if let Some(s) = st.sessions.get_mut(&session) {
            s.draining = true;
            if s.in_flight == 0 {
                s.tx.control(Outbound::Drained);
            }
        }
        self.update_demand(&st);
    }

    /// Detach a session; everything it held is re-queued (at-least-once): at once for an
    /// ordinary session, and for an exclusive one once the hold after its last heartbeat
    /// answer is over, when the replica has stopped whatever still ran there.
    pub(crate) fn remove_session(&self, session: u64) -> usize {
        let now = Instant::now();
        let hold = self.hold_period();
        let mut st = self.lock();
        let fence = st
            .sessions
            .remove(&session)
            .filter(|slot| slot.exclusive)
            .map(|slot| slot.last_echo + hold);
        self.update_demand(&st);
        let held: Vec<String> = st
            .in_flight
            .iter()
            .filter(|(_, f)| f.session == session)
            .map(|(id, _)| id.clone())
            .collect();
        let (mut lost, mut fenced) = (0usize, 0usize);
        for id in &held {
            match fence.filter(|release| *release > now) {
                Some(release) => {
                    if let Some(f) = st.in_flight.get_mut(id) {
                        f.phase = state::Phase::Orphaned { release };
                        f.seat = None;
                        fenced += 1;
                    }
                }
                None => {
                    if let Some(mut f) = st.in_flight.remove(id) {
                        st.requeue_lost(&f, now);
                        st.end_trace(
                            &mut f,
                            "lost",
                            true,
                            Some("the session ended before the result"),
                        );
                        lost += 1;
                    }
                }
            }
        }
        let remaining = st.sessions.len();
        drop(st);
        self.counters
            .redelivered
            .fetch_add((lost + fenced) as u64, Ordering::Relaxed);
        if lost + fenced > 0 {
            tracing::info!(controller = %self.id, session, requeued = lost, fenced, ?hold, "session ended; its in-flight keys are re-queued (fenced ones once the hold is over)");
        }
        self.wake.notify_one();
        remaining
    }

    /// End every session with a reason.
    pub(crate) fn revoke_all(&self, reason: RevokeReason, message: &str) {
        let st = self.lock();
        for s in st.sessions.values() {
            s.tx.control(Outbound::Revoke {
                reason,
                message: message.to_string(),
            });
        }
    }

    /// End one session with a reason (its own credentials, not the controller's, are at fault).
    pub(crate) fn revoke_session(&self, session: u64, reason: RevokeReason, message: &str) {
        if let Some(s) = self.lock().sessions.get(&session) {
            s.tx.control(Outbound::Revoke {
                reason,
                message: message.to_string(),
            });
        }
    }

    /// Number of attached sessions.
    pub(crate) fn session_count(&self) -> usize {
        self.lock().sessions.len()
    }
}
