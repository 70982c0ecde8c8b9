//! One registered controller at run time: its work queue, the sessions of its replicas, what is in
//! flight where, and the dispatch loop that hands keys to sessions with free credits.
//!
//! Exclusivity comes from the queue (a key in processing is never popped again); at-least-once
//! from re-queueing everything a session held when it ends and every request whose deadline
//! passes; a late result carries a stale handout id and is ignored.

use crate::dispatch::event_queue::{Delivery, EventQueue, EventType};
use crate::dispatch::queue::{Handout, Outcome, Priority, QueuedAs, Reason, WorkQueue};
use crate::dispatch::seats::{Flow, Seat, SeatPool};
use crate::dispatch::spans::{self, Attempt, AttemptInfo, AttemptKind, LinkKind, PendingLinks};
use crate::informer::object::CachedObject;
use crate::informer::{CacheEvent, Informer, InformerKey, ObjectKey, Subscription};
use crate::metrics::{Metrics, ResultLabel};
use crate::registration::Mode;
use crate::registration::Registration;
use parking_lot::{Mutex, MutexGuard};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{Notify, mpsc, watch};

/// Who registered a controller: the tenant, and the name unique within it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ControllerId {
    /// Tenant identity.
    pub tenant: String,
    /// Controller name.
    pub name: String,
}

impl std::fmt::Display for ControllerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tenant, self.name)
    }
}

/// The object a request carries.
#[derive(Debug, Clone)]
pub enum Payload {
    /// The object was not requested.
    None,
    /// The current object, as the cache holds it (its JSON is sent as is).
    Object(CachedObject),
    /// The object is gone; its last known state.
    Tombstone {
        /// Last known state.
        last: Arc<Value>,
        /// Whether the deletion was inferred after a watch gap.
        final_state_unknown: bool,
    },
}

/// A reconcile request on its way to a session (translated to protobuf at the gRPC edge).
#[derive(Debug, Clone)]
pub struct Request {
    /// Unique request id.
    pub id: String,
    /// The key.
    pub key: ObjectKey,
    /// 1-based attempt.
    pub attempt: u32,
    /// Why it is delivered.
    pub reasons: Vec<Reason>,
    /// Whether this is background work (initial list or resync).
    pub background: bool,
    /// The object or tombstone.
    pub payload: Payload,
    /// When the manager stops waiting for the result.
    pub deadline: SystemTime,
    /// W3C trace context of the dispatch span; empty when tracing is off.
    pub trace: TraceContext,
}

/// W3C `traceparent` and `tracestate` of a dispatch span, as sent on the wire; both empty when
/// tracing is off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// `traceparent`.
    pub traceparent: String,
    /// `tracestate`.
    pub tracestate: String,
}

impl TraceContext {
    fn of(attempt: Option<&Attempt>) -> Self {
        attempt
            .map(|a| {
                let (traceparent, tracestate) = a.trace_context();
                TraceContext {
                    traceparent,
                    tracestate,
                }
            })
            .unwrap_or_default()
    }
}

/// What the manager tells a session.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A reconcile request.
    Reconcile(Request),
    /// An EVENTS-mode delivery.
    Event {
        /// Unique request id, acknowledged with EventAck.
        id: String,
        /// The key, its event and attempt.
        delivery: Delivery,
        /// When the manager stops waiting for the ack.
        deadline: SystemTime,
        /// W3C trace context of the dispatch span.
        trace: TraceContext,
    },
    /// The session must end (superseded, leadership lost, shutting down).
    Revoke {
        /// Why.
        reason: RevokeReason,
        /// Human-readable detail.
        message: String,
    },
    /// A drain finished: every in-flight result is in.
    Drained,
}

/// Why a session was ended by the manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevokeReason {
    /// This manager lost the Lease.
    LeadershipLost,
    /// A different registration under the same name replaced this one.
    Superseded,
    /// The manager is shutting down.
    ShuttingDown,
    /// The tenant lost RBAC access to something the registration watches.
    PermissionRevoked,
    /// The controller exceeded one of its tenant's limits.
    QuotaExceeded,
}

struct SessionSlot {
    credits: u32,
    in_flight: u32,
    draining: bool,
    tx: mpsc::UnboundedSender<Outbound>,
}

/// A slot taken under the lock: session, handout, request id, the tombstone known then and the
/// dispatch span's trace context.
type Reserved = (
    u64,
    Handout<ObjectKey>,
    String,
    Option<(Arc<Value>, bool)>,
    TraceContext,
);

struct InFlight {
    key: ObjectKey,
    session: u64,
    handout: u64,
    deadline: Instant,
    started: Instant,
    /// 1-based attempt, for status pages and error records.
    attempt: u32,
    /// An EVENTS-mode delivery (acknowledged, not completed with an outcome).
    event: bool,
    /// Its spans, when tracing is on.
    trace: Option<Attempt>,
    /// Its share of the manager's dispatch budget, freed when the request ends however it ends.
    _seat: Seat,
}

/// How many failed reconciles each controller keeps for the status page.
pub const RECENT_ERRORS: usize = 20;

/// A failed reconcile kept for the status page: bounded per controller, newest last.
#[derive(Debug, Clone)]
pub struct RecentError {
    /// When the manager saw it.
    pub at: SystemTime,
    /// The key.
    pub key: ObjectKey,
    /// The attempt that failed.
    pub attempt: u32,
    /// `error`, `terminal` or `deadline`.
    pub kind: &'static str,
    /// The controller's message (empty for a missed deadline).
    pub message: String,
}

/// A request in flight, as the status page shows it.
#[derive(Debug, Clone)]
pub struct InFlightView {
    /// The key.
    pub key: ObjectKey,
    /// The session it went to.
    pub session: u64,
    /// 1-based attempt.
    pub attempt: u32,
    /// How long it has been running.
    pub running: Duration,
}

/// An attached session, as the status page shows it.
#[derive(Debug, Clone, Copy)]
pub struct SessionView {
    /// The session number (also in logs).
    pub session: u64,
    /// Requests it accepts at once.
    pub credits: u32,
    /// Requests it holds now.
    pub in_flight: u32,
    /// Whether it asked to drain.
    pub draining: bool,
}

/// A controller's keys for the status page, each list bounded by the caller's limit.
#[derive(Debug, Clone, Default)]
pub struct KeysView {
    /// Requests in flight, longest-running first.
    pub in_flight: Vec<InFlightView>,
    /// Attached sessions in the order they attached.
    pub sessions: Vec<SessionView>,
    /// Queued keys in dispatch order, then keys waiting on a timer.
    pub queued: Vec<(ObjectKey, QueuedAs)>,
    /// The latest failures, newest first.
    pub recent_errors: Vec<RecentError>,
}

struct State {
    queue: WorkQueue<ObjectKey>,
    sessions: BTreeMap<u64, SessionSlot>,
    in_flight: HashMap<String, InFlight>,
    tombstones: HashMap<ObjectKey, (Arc<Value>, bool)>,
    events: EventQueue,
    next_session_pick: u64,
    /// Enqueue spans (and re-delivered attempts) to link from each key's next attempt; only
    /// filled while tracing is on.
    links: PendingLinks,
}

impl State {
    /// Hand a lost delivery out again at once (at-least-once), in whichever queue it came from.
    fn requeue_lost(&mut self, f: &InFlight, now: Instant) {
        if f.event {
            self.events.lost(&f.key);
        } else {
            self.queue
                .done_handout(&f.key, f.handout, Outcome::Lost, now);
        }
    }

    /// End an attempt's spans; when its outcome re-delivers the key, the next attempt links
    /// to it.
    fn end_trace(
        &mut self,
        f: &mut InFlight,
        outcome: &'static str,
        again: bool,
        error: Option<&str>,
    ) {
        if let Some(t) = f.trace.take() {
            if again {
                self.links.add(&f.key, t.root(), LinkKind::PreviousAttempt);
            }
            t.finish(outcome, error);
        }
    }
}

/// Counters for status and metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests dispatched.
    pub dispatched: AtomicU64,
    /// Results by outcome: done, requeue_after, error, terminal.
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
}

/// The namespaces a namespace-label-selector scope admits now, shared with the controllers, which
/// keeps it current as namespaces match, pass their checks, or leave.
pub type NamespaceSet = Arc<parking_lot::RwLock<std::collections::HashSet<String>>>;

/// A registered controller.
pub struct Controller {
    /// Tenant and name.
    pub id: ControllerId,
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
    /// Set for a namespace-label-selector scope: the primary informers watch every namespace,
    /// so keys read back from them (resync) are kept to the admitted ones.
    scope: std::sync::OnceLock<NamespaceSet>,
    /// Counters for status and metrics.
    pub counters: Counters,
    metrics: Arc<Metrics>,
    recent_errors: Mutex<VecDeque<RecentError>>,
    queue_limit: std::sync::atomic::AtomicUsize,
    overflowed: std::sync::atomic::AtomicBool,
}

/// A controller's queue as `/metrics` reports it.
#[derive(Debug, Clone, Copy)]
pub struct QueueStats {
    /// Keys ready or waiting on a timer.
    pub depth: usize,
    /// Requests in flight.
    pub in_flight: usize,
    /// Sessions attached.
    pub sessions: usize,
    /// Cumulative adds.
    pub adds: u64,
    /// Cumulative retries.
    pub retries: u64,
    /// Seconds of work in progress.
    pub unfinished: f64,
    /// Seconds the longest in-flight request has been running.
    pub longest: f64,
}

/// What a result did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Accepted.
    Accepted,
    /// Unknown id, another session's request, or past its deadline: discarded.
    Discarded,
}

impl Controller {
    /// A controller with an empty queue and no sessions, and no limit on dispatch seats.
    pub fn new(id: ControllerId, registration: Registration, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_seat_pool(id, registration, metrics, &SeatPool::unlimited())
    }

    /// A controller whose requests take seats from `seat_pool`, shared with other tenants.
    pub fn with_seat_pool(
        id: ControllerId,
        registration: Registration,
        metrics: Arc<Metrics>,
        seat_pool: &Arc<SeatPool>,
    ) -> Arc<Self> {
        let queue = WorkQueue::new(registration.backoff);
        let wake = Arc::new(Notify::new());
        let flow = seat_pool.flow(&id.tenant, wake.clone());
        Arc::new(Controller {
            id,
            registration,
            state: Mutex::new(State {
                queue,
                sessions: BTreeMap::new(),
                in_flight: HashMap::new(),
                tombstones: HashMap::new(),
                events: EventQueue::default(),
                next_session_pick: 0,
                links: PendingLinks::default(),
            }),
            wake,
            flow,
            next_request: AtomicU64::new(1),
            primaries: Mutex::new(Vec::new()),
            subscriptions: Mutex::new(Vec::new()),
            scope: std::sync::OnceLock::new(),
            counters: Counters::default(),
            metrics,
            recent_errors: Mutex::new(VecDeque::with_capacity(RECENT_ERRORS)),
            queue_limit: std::sync::atomic::AtomicUsize::new(0),
            overflowed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// What every informer this controller holds watches.
    pub fn informer_keys(&self) -> Vec<InformerKey> {
        self.subscriptions
            .lock()
            .iter()
            .map(|s| s.informer().key().clone())
            .collect()
    }

    /// Keep the informer subscriptions alive as long as the controller.
    pub fn hold(&self, subscription: Subscription, primary: bool) {
        if primary {
            self.primaries.lock().push(subscription.informer().clone());
        }
        self.subscriptions.lock().push(subscription);
    }

    /// Drop every informer subscription (the controller is going away).
    pub fn release_informers(&self) {
        self.subscriptions.lock().clear();
        self.primaries.lock().clear();
    }

    /// Enqueue keys; `initial` events are background work.
    pub fn enqueue(&self, keys: impl IntoIterator<Item = ObjectKey>, initial: bool) {
        if self.overflowed.load(Ordering::Relaxed) {
            // Revoked for exceeding its queue limit: hold nothing more until it is gone.
            return;
        }
        let now = Instant::now();
        let priority = if initial {
            Priority::Background
        } else {
            Priority::Live
        };
        if spans::enabled() {
            let keys: Vec<ObjectKey> = keys.into_iter().collect();
            if keys.is_empty() {
                return;
            }
            let span = spans::enqueue(&self.id, &keys, initial);
            let mut st = self.lock();
            for key in keys {
                st.links.add(&key, span.clone(), LinkKind::Enqueue);
                st.queue.add(key, priority, now);
            }
            let queued = st.queue.len() + st.queue.waiting_len();
            drop(st);
            self.check_queue_limit(queued);
            self.wake.notify_one();
            return;
        }
        let mut st = self.lock();
        let mut any = false;
        for key in keys {
            st.queue.add(key, priority, now);
            any = true;
        }
        let queued = st.queue.len() + st.queue.waiting_len();
        drop(st);
        self.check_queue_limit(queued);
        if any {
            self.wake.notify_one();
        }
    }

    /// Caps the keys this controller may hold queued (`0` = unlimited); set from the tenant's
    /// limits when the controller is created.
    pub fn set_queue_limit(&self, limit: usize) {
        self.queue_limit.store(limit, Ordering::Relaxed);
    }

    /// Past its limit the controller is revoked (RESOURCE_EXHAUSTED) and stops taking keys, so
    /// the memory a tenant's flood can pin stays bounded; it goes away with its sessions.
    fn check_queue_limit(&self, queued: usize) {
        let limit = self.queue_limit.load(Ordering::Relaxed);
        if limit == 0 || queued <= limit || self.overflowed.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(controller = %self.id, queued, limit, "queued-keys limit exceeded; revoking the registration");
        self.metrics.limit_hit(&self.id.tenant, "queued_keys");
        self.revoke_all(
            RevokeReason::QuotaExceeded,
            &format!(
                "controller {} has more than {limit} keys queued (the tenant's queued-keys limit): narrow its scope with namespaces, a label selector or predicates, or ask for a higher limit",
                self.id.name
            ),
        );
    }

    /// Whether the controller exceeded its queued-keys limit (it is being removed).
    pub fn is_overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// Credits of all attached sessions (what the tenant's in-flight limit counts).
    pub fn total_credits(&self) -> u64 {
        self.lock()
            .sessions
            .values()
            .map(|s| u64::from(s.credits))
            .sum()
    }

    /// Remember the last state of a deleted primary so its request can carry a tombstone.
    pub fn observe_primary(&self, event: &CacheEvent) {
        let mut st = self.lock();
        match event {
            CacheEvent::Deleted {
                object,
                final_state_unknown,
            } => {
                st.tombstones.insert(
                    crate::registration::mapping::own_key(object),
                    (object.clone(), *final_state_unknown),
                );
            }
            CacheEvent::Added { object, .. } | CacheEvent::Modified { new: object, .. } => {
                st.tombstones
                    .remove(&crate::registration::mapping::own_key(object));
            }
        }
    }

    /// Every primary key currently cached (for resync).
    pub fn primary_keys(&self) -> Vec<ObjectKey> {
        let informers = self.primaries.lock().clone();
        informers.iter().flat_map(|i| i.keys()).collect()
    }

    /// Keep this controller's own re-reads of its primaries (resync) to `namespaces`.
    pub fn limit_to_namespaces(&self, namespaces: NamespaceSet) {
        // Set once, when the controllers wires the scope; a second call would be a wiring bug and
        // keeps the first set, which the controllers keeps current.
        let _ = self.scope.set(namespaces);
    }

    /// The primary keys within this controller's scope: every cached one, less those of
    /// namespaces a selector scope has not admitted.
    pub fn scoped_primary_keys(&self) -> Vec<ObjectKey> {
        let keys = self.primary_keys();
        match self.scope.get() {
            None => keys,
            Some(set) => {
                let set = set.read();
                keys.into_iter()
                    .filter(|k| set.contains(&k.namespace))
                    .collect()
            }
        }
    }

    fn primary_object(&self, key: &ObjectKey) -> Option<CachedObject> {
        let informers = self.primaries.lock().clone();
        informers
            .iter()
            .find_map(|i| i.get(&key.namespace, &key.name))
    }

    /// Attach a replica's session; returns its id.
    pub fn add_session(&self, session: u64, credits: u32, tx: mpsc::UnboundedSender<Outbound>) {
        self.lock().sessions.insert(
            session,
            SessionSlot {
                credits,
                in_flight: 0,
                draining: false,
                tx,
            },
        );
        self.wake.notify_one();
    }

    /// Change a session's credits (absolute).
    pub fn set_credits(&self, session: u64, credits: u32) {
        if let Some(s) = self.lock().sessions.get_mut(&session) {
            s.credits = credits;
        }
        self.wake.notify_one();
    }

    /// Stop sending new work to a session; it gets `Drained` once its in-flight results are in.
    pub fn drain(&self, session: u64) {
        let mut st = self.lock();
        if let Some(s) = st.sessions.get_mut(&session) {
            s.draining = true;
            if s.in_flight == 0 {
                let _ = s.tx.send(Outbound::Drained);
            }
        }
    }

    /// Detach a session; everything it held is re-queued at once (at-least-once).
    pub fn remove_session(&self, session: u64) -> usize {
        let now = Instant::now();
        let mut st = self.lock();
        st.sessions.remove(&session);
        let lost: Vec<String> = st
            .in_flight
            .iter()
            .filter(|(_, f)| f.session == session)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &lost {
            if let Some(mut f) = st.in_flight.remove(id) {
                st.requeue_lost(&f, now);
                st.end_trace(
                    &mut f,
                    "lost",
                    true,
                    Some("the session ended before the result"),
                );
            }
        }
        let remaining = st.sessions.len();
        drop(st);
        self.counters
            .redelivered
            .fetch_add(lost.len() as u64, Ordering::Relaxed);
        if !lost.is_empty() {
            tracing::info!(controller = %self.id, session, requeued = lost.len(), "session ended; its in-flight keys are re-queued");
        }
        self.wake.notify_one();
        remaining
    }

    /// End every session with a reason.
    pub fn revoke_all(&self, reason: RevokeReason, message: &str) {
        let st = self.lock();
        for s in st.sessions.values() {
            let _ = s.tx.send(Outbound::Revoke {
                reason,
                message: message.to_string(),
            });
        }
    }

    /// Number of attached sessions.
    pub fn session_count(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Queue figures for `/metrics`.
    pub fn queue_stats(&self) -> QueueStats {
        let now = Instant::now();
        let st = self.lock();
        QueueStats {
            depth: st.queue.len() + st.queue.waiting_len() + st.events.len(),
            in_flight: st.in_flight.len(),
            sessions: st.sessions.len(),
            adds: st.queue.adds_total(),
            retries: st.queue.retries_total(),
            unfinished: st
                .in_flight
                .values()
                .map(|f| now.saturating_duration_since(f.started).as_secs_f64())
                .sum(),
            longest: st
                .in_flight
                .values()
                .map(|f| now.saturating_duration_since(f.started).as_secs_f64())
                .fold(0.0, f64::max),
        }
    }

    /// Queue depth, in-flight count and number of sessions, for status pages.
    pub fn snapshot(&self) -> (usize, usize, usize) {
        let st = self.lock();
        (
            st.queue.len() + st.queue.waiting_len(),
            st.in_flight.len(),
            st.sessions.len(),
        )
    }

    /// In-flight requests, queued keys and recent errors, each list at most `limit` long.
    pub fn keys_view(&self, limit: usize) -> KeysView {
        let now = Instant::now();
        let (mut in_flight, sessions, queued) = {
            let st = self.lock();
            let in_flight: Vec<InFlightView> = st
                .in_flight
                .values()
                .map(|f| InFlightView {
                    key: f.key.clone(),
                    session: f.session,
                    attempt: f.attempt,
                    running: now.saturating_duration_since(f.started),
                })
                .collect();
            let sessions = st
                .sessions
                .iter()
                .map(|(n, slot)| SessionView {
                    session: *n,
                    credits: slot.credits,
                    in_flight: slot.in_flight,
                    draining: slot.draining,
                })
                .collect();
            (in_flight, sessions, st.queue.peek(limit))
        };
        in_flight.sort_by(|a, b| b.running.cmp(&a.running).then_with(|| a.key.cmp(&b.key)));
        in_flight.truncate(limit);
        let recent_errors = self
            .recent_errors
            .lock()
            .iter()
            .rev()
            .take(limit)
            .cloned()
            .collect();
        KeysView {
            in_flight,
            sessions,
            queued,
            recent_errors,
        }
    }

    fn record_error(&self, key: &ObjectKey, attempt: u32, kind: &'static str, message: &str) {
        let mut ring = self.recent_errors.lock();
        if ring.len() == RECENT_ERRORS {
            ring.pop_front();
        }
        ring.push_back(RecentError {
            at: SystemTime::now(),
            key: key.clone(),
            attempt,
            kind,
            message: message.to_owned(),
        });
    }

    /// EVENTS mode: append a change of a primary.
    pub fn push_event(&self, kind: EventType, object: Arc<Value>) {
        let key = crate::registration::mapping::own_key(&object);
        let span = spans::enabled().then(|| {
            spans::enqueue(
                &self.id,
                std::slice::from_ref(&key),
                kind == EventType::Sync,
            )
        });
        let mut st = self.lock();
        if let Some(span) = span {
            st.links.add(&key, span, LinkKind::Enqueue);
        }
        st.events.push(key, kind, object);
        drop(st);
        self.wake.notify_one();
    }

    /// EVENTS mode: `session` acknowledged delivery `id`.
    pub fn ack(&self, session: u64, id: &str) -> Completion {
        let now = Instant::now();
        let mut st = self.lock();
        let valid = st
            .in_flight
            .get(id)
            .is_some_and(|f| f.session == session && f.deadline > now && f.event);
        if !valid {
            return Completion::Discarded;
        }
        let Some(mut f) = st.in_flight.remove(id) else {
            return Completion::Discarded;
        };
        st.events.ack(&f.key);
        st.end_trace(&mut f, "success", false, None);
        if let Some(s) = st.sessions.get_mut(&f.session) {
            s.in_flight = s.in_flight.saturating_sub(1);
            if s.draining && s.in_flight == 0 {
                let _ = s.tx.send(Outbound::Drained);
            }
        }
        drop(st);
        self.counters.done.fetch_add(1, Ordering::Relaxed);
        self.metrics.reconciled(
            &self.id.name,
            &self.id.tenant,
            ResultLabel::Success,
            false,
            f.started.elapsed(),
        );
        self.wake.notify_one();
        Completion::Accepted
    }

    /// A result from `session` for request `id`; `message` is the controller's error text.
    pub fn complete(&self, session: u64, id: &str, outcome: Outcome, message: &str) -> Completion {
        let now = Instant::now();
        let mut st = self.lock();
        let valid = st
            .in_flight
            .get(id)
            .is_some_and(|f| f.session == session && f.deadline > now && !f.event);
        if !valid {
            return Completion::Discarded;
        }
        let Some(mut f) = st.in_flight.remove(id) else {
            return Completion::Discarded;
        };
        st.queue.done_handout(&f.key, f.handout, outcome, now);
        // The last key of a backlog: the queue's and the dispatch's transient memory is free now.
        let drained = st.queue.is_empty() && st.queue.in_flight_count() == 0;
        let (label, again) = spans::outcome(outcome);
        let failed = matches!(outcome, Outcome::Error { .. } | Outcome::Terminal);
        st.end_trace(&mut f, label, again, failed.then_some(message));
        if let Some(s) = st.sessions.get_mut(&f.session) {
            s.in_flight = s.in_flight.saturating_sub(1);
            if s.draining && s.in_flight == 0 {
                let _ = s.tx.send(Outbound::Drained);
            }
        }
        drop(st);
        if drained {
            crate::informer::heap::release_after_burst();
        }
        let (label, terminal) = match outcome {
            Outcome::Done => (ResultLabel::Success, false),
            Outcome::RequeueAfter(d) if d.is_zero() => (ResultLabel::Requeue, false),
            Outcome::RequeueAfter(_) => (ResultLabel::RequeueAfter, false),
            Outcome::Error { .. } | Outcome::Lost => (ResultLabel::Error, false),
            Outcome::Terminal => (ResultLabel::Error, true),
        };
        self.metrics.reconciled(
            &self.id.name,
            &self.id.tenant,
            label,
            terminal,
            f.started.elapsed(),
        );
        let c = match outcome {
            Outcome::Done => &self.counters.done,
            Outcome::RequeueAfter(_) => &self.counters.requeued,
            Outcome::Error { .. } => &self.counters.errors,
            Outcome::Terminal => &self.counters.terminal,
            Outcome::Lost => &self.counters.redelivered,
        };
        c.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Error { .. } => self.record_error(&f.key, f.attempt, "error", message),
            Outcome::Terminal => self.record_error(&f.key, f.attempt, "terminal", message),
            _ => {}
        }
        tracing::debug!(controller = %self.id, key = %f.key, ?outcome, took = ?f.started.elapsed(), "result");
        self.wake.notify_one();
        Completion::Accepted
    }

    /// Hand out as much ready work as sessions and concurrency allow; expire missed deadlines.
    /// Returns when the caller should look again at the latest.
    ///
    /// Informer callbacks take the informer lock and then this controller's lock, so objects are
    /// read from informers only while this controller's lock is *not* held: slots are reserved
    /// first, payloads read unlocked, then the requests sent.
    fn dispatch_once(&self, leading: bool) -> Option<Instant> {
        let now = Instant::now();
        let mut reserved: Vec<Reserved> = Vec::new();
        // Set when the loop stopped for want of a dispatch seat: this controller then waits in
        // its tenant's queue and is woken when one is granted.
        let mut waiting_for_seat = false;
        {
            let mut st = self.lock();
            let expired: Vec<String> = st
                .in_flight
                .iter()
                .filter(|(_, f)| f.deadline <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in expired {
                if let Some(mut f) = st.in_flight.remove(&id) {
                    tracing::warn!(controller = %self.id, key = %f.key, "request missed its deadline; re-queued");
                    st.end_trace(
                        &mut f,
                        "deadline",
                        true,
                        Some("no result before the deadline"),
                    );
                    self.counters
                        .deadline_misses
                        .fetch_add(1, Ordering::Relaxed);
                    self.metrics.deadline_missed(&self.id.name, &self.id.tenant);
                    st.requeue_lost(&f, now);
                    self.record_error(&f.key, f.attempt, "deadline", "");
                    if let Some(s) = st.sessions.get_mut(&f.session) {
                        s.in_flight = s.in_flight.saturating_sub(1);
                    }
                }
            }
            if leading {
                let max = match self.registration.max_concurrent {
                    0 => usize::MAX,
                    n => n as usize,
                };
                while st.in_flight.len() < max {
                    let Some(session) = pick_session(&mut st) else {
                        break;
                    };
                    let has_work = if self.registration.mode == Mode::Events {
                        !st.events.is_empty()
                    } else {
                        st.queue.has_ready(now)
                    };
                    if !has_work {
                        break;
                    }
                    let Some(seat) = self.flow.acquire() else {
                        waiting_for_seat = true;
                        break;
                    };
                    if self.registration.mode == Mode::Events {
                        // Events carry their object already: send right away.
                        let Some(delivery) = st.events.pop() else {
                            break;
                        };
                        let id = format!(
                            "{}-{}",
                            self.id.name,
                            self.next_request.fetch_add(1, Ordering::Relaxed)
                        );
                        let deadline = SystemTime::now() + self.registration.deadline;
                        let key = delivery.key.clone();
                        let attempt = delivery.attempt;
                        let trace = self.start_attempt(
                            &mut st,
                            AttemptKind::Event,
                            &key,
                            attempt,
                            &id,
                            session,
                        );
                        let sent = st.sessions.get(&session).is_some_and(|slot| {
                            slot.tx
                                .send(Outbound::Event {
                                    id: id.clone(),
                                    delivery,
                                    deadline,
                                    trace: TraceContext::of(trace.as_ref()),
                                })
                                .is_ok()
                        });
                        if !sent {
                            st.events.lost(&key);
                            if let Some(t) = trace {
                                t.finish(
                                    "lost",
                                    Some("the session ended before the event was sent"),
                                );
                            }
                            break;
                        }
                        if let Some(slot) = st.sessions.get_mut(&session) {
                            slot.in_flight += 1;
                        }
                        st.in_flight.insert(
                            id,
                            InFlight {
                                key,
                                session,
                                handout: 0,
                                deadline: now + self.registration.deadline,
                                started: now,
                                attempt,
                                event: true,
                                trace,
                                _seat: seat,
                            },
                        );
                        self.counters.dispatched.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let Some(handout) = st.queue.pop(now) else {
                        break;
                    };
                    let id = format!(
                        "{}-{}",
                        self.id.name,
                        self.next_request.fetch_add(1, Ordering::Relaxed)
                    );
                    let tombstone = st.tombstones.get(&handout.key).cloned();
                    if let Some(slot) = st.sessions.get_mut(&session) {
                        slot.in_flight += 1;
                    }
                    let trace = self.start_attempt(
                        &mut st,
                        AttemptKind::Reconcile,
                        &handout.key,
                        handout.attempt,
                        &id,
                        session,
                    );
                    let trace_context = TraceContext::of(trace.as_ref());
                    st.in_flight.insert(
                        id.clone(),
                        InFlight {
                            key: handout.key.clone(),
                            session,
                            handout: handout.id,
                            deadline: now + self.registration.deadline,
                            started: now,
                            attempt: handout.attempt,
                            event: false,
                            trace,
                            _seat: seat,
                        },
                    );
                    reserved.push((session, handout, id, tombstone, trace_context));
                }
            }
            if !waiting_for_seat {
                // Seats granted while this controller waited but not needed now go to others.
                self.flow.withdraw();
            }
        }
        if !reserved.is_empty() {
            let requests: Vec<(u64, Request)> = reserved
                .into_iter()
                .map(|(session, handout, id, tombstone, trace)| {
                    self.metrics.dispatched(
                        &self.id.name,
                        &self.id.tenant,
                        handout.enqueued_at.elapsed(),
                    );
                    let payload = if self.registration.include_object {
                        match self.primary_object(&handout.key) {
                            Some(obj) => Payload::Object(obj),
                            None => match tombstone {
                                Some((last, unknown)) => Payload::Tombstone {
                                    last,
                                    final_state_unknown: unknown,
                                },
                                None => Payload::Tombstone {
                                    last: Arc::new(Value::Null),
                                    final_state_unknown: true,
                                },
                            },
                        }
                    } else {
                        Payload::None
                    };
                    let request = Request {
                        id,
                        key: handout.key.clone(),
                        attempt: handout.attempt,
                        reasons: handout.reasons.iter().collect(),
                        background: handout.priority == Priority::Background,
                        payload,
                        deadline: SystemTime::now() + self.registration.deadline,
                        trace,
                    };
                    (session, request)
                })
                .collect();
            let mut st = self.lock();
            for (session, request) in requests {
                let sent = st
                    .sessions
                    .get(&session)
                    .is_some_and(|slot| slot.tx.send(Outbound::Reconcile(request.clone())).is_ok());
                if sent {
                    self.counters.dispatched.fetch_add(1, Ordering::Relaxed);
                } else if let Some(mut f) = st.in_flight.remove(&request.id) {
                    // The session went away between reservation and sending.
                    st.queue
                        .done_handout(&f.key, f.handout, Outcome::Lost, Instant::now());
                    st.end_trace(
                        &mut f,
                        "lost",
                        true,
                        Some("the session ended before the request was sent"),
                    );
                    if let Some(slot) = st.sessions.get_mut(&session) {
                        slot.in_flight = slot.in_flight.saturating_sub(1);
                    }
                }
            }
        }
        let st = self.lock();
        let next_deadline = st.in_flight.values().map(|f| f.deadline).min();
        let next_ready = st.queue.next_ready_at();
        match (next_deadline, next_ready) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Start the spans of an attempt, linked to what enqueued its key (tracing on only).
    fn start_attempt(
        &self,
        st: &mut State,
        kind: AttemptKind,
        key: &ObjectKey,
        attempt: u32,
        request_id: &str,
        session: u64,
    ) -> Option<Attempt> {
        if !spans::enabled() {
            return None;
        }
        let links = st.links.take(key);
        Some(Attempt::start(
            AttemptInfo {
                controller: &self.id,
                kind,
                key,
                attempt,
                request_id,
                session,
            },
            links,
        ))
    }

    /// The dispatch loop: runs until `stop` fires. Only dispatches while `leading` is true.
    pub async fn run(
        self: Arc<Self>,
        mut leading: watch::Receiver<bool>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let resync = self.registration.resync;
        let mut next_resync = resync.map(|r| Instant::now() + r);
        loop {
            let is_leader = *leading.borrow();
            if let Some(at) = next_resync
                && Instant::now() >= at
            {
                let keys = self.scoped_primary_keys();
                tracing::debug!(controller = %self.id, keys = keys.len(), "resync");
                self.enqueue(keys, true);
                next_resync = resync.map(|r| Instant::now() + r);
            }
            let next = self.dispatch_once(is_leader);
            let next = [next, next_resync].into_iter().flatten().min();
            let sleep = next
                .map(|n| n.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
                changed = leading.changed() => if changed.is_err() { return },
                _ = stop.cancelled() => return,
            }
        }
    }
}

/// The session with the most free credits, rotating among equals so keys spread over replicas.
fn pick_session(st: &mut State) -> Option<u64> {
    let start = st.next_session_pick;
    let best = st
        .sessions
        .iter()
        .filter(|(_, s)| !s.draining && s.in_flight < s.credits)
        .max_by_key(|(id, s)| {
            (
                s.credits - s.in_flight,
                std::cmp::Reverse(id.wrapping_sub(start)),
            )
        })
        .map(|(id, _)| *id);
    if let Some(id) = best {
        st.next_session_pick = id.wrapping_add(1);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::queue::Backoff;
    use crate::registration::{Mode, NamespaceScope, ResourceRef};

    fn registration(max_concurrent: u32) -> Registration {
        Registration {
            name: "t".into(),
            mode: Mode::Reconcile,
            primary: ResourceRef {
                group: "".into(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
                namespaced: true,
            },
            owns: vec![],
            watches: vec![],
            namespaces: NamespaceScope::All,
            label_selector: None,
            predicate: None,
            max_concurrent,
            deadline: Duration::from_secs(30),
            resync: None,
            backoff: Backoff::default(),
            include_object: false,
        }
    }

    fn controller(max_concurrent: u32) -> Arc<Controller> {
        Controller::new(
            ControllerId {
                tenant: "t".into(),
                name: "c".into(),
            },
            registration(max_concurrent),
            Arc::new(Metrics::new()),
        )
    }

    fn recv_all(rx: &mut mpsc::UnboundedReceiver<Outbound>) -> Vec<Request> {
        let mut out = Vec::new();
        while let Ok(m) = rx.try_recv() {
            if let Outbound::Reconcile(r) = m {
                out.push(r);
            }
        }
        out
    }

    #[test]
    fn keys_spread_over_sessions_and_never_twice_in_flight() {
        let c = controller(10);
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        c.add_session(1, 2, tx1);
        c.add_session(2, 2, tx2);
        c.enqueue((0..6).map(|i| ObjectKey::new("ns", format!("k{i}"))), false);
        c.enqueue([ObjectKey::new("ns", "k0")], false);
        c.dispatch_once(true);
        let a = recv_all(&mut rx1);
        let b = recv_all(&mut rx2);
        assert_eq!(a.len(), 2, "credits bound each session");
        assert_eq!(b.len(), 2);
        let mut keys: Vec<_> = a
            .iter()
            .chain(b.iter())
            .map(|r| r.key.name.clone())
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 4, "no key handed out twice");
    }

    #[test]
    fn ended_session_requeues_its_keys_and_late_results_are_discarded() {
        let c = controller(10);
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        c.add_session(1, 5, tx1);
        c.enqueue([ObjectKey::new("ns", "a")], false);
        c.dispatch_once(true);
        let first = recv_all(&mut rx1);
        assert_eq!(first.len(), 1);
        c.remove_session(1);
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        c.add_session(2, 5, tx2);
        c.dispatch_once(true);
        let again = recv_all(&mut rx2);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].attempt, 2);
        assert_eq!(
            c.complete(1, &first[0].id, Outcome::Done, ""),
            Completion::Discarded
        );
        assert_eq!(
            c.complete(2, &again[0].id, Outcome::Done, ""),
            Completion::Accepted
        );
    }

    #[test]
    fn standby_does_not_dispatch() {
        let c = controller(10);
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        c.add_session(1, 5, tx1);
        c.enqueue([ObjectKey::new("ns", "a")], false);
        c.dispatch_once(false);
        assert!(recv_all(&mut rx1).is_empty());
        c.dispatch_once(true);
        assert_eq!(recv_all(&mut rx1).len(), 1);
    }

    #[test]
    fn a_key_requeued_after_a_delay_is_dispatched_once_due() {
        let c = controller(10);
        let (tx, mut rx) = mpsc::unbounded_channel();
        c.add_session(1, 5, tx);
        c.enqueue([ObjectKey::new("ns", "later")], false);
        c.dispatch_once(true);
        let first = recv_all(&mut rx);
        assert_eq!(first.len(), 1);
        let delay = Duration::from_millis(20);
        assert_eq!(
            c.complete(1, &first[0].id, Outcome::RequeueAfter(delay), ""),
            Completion::Accepted
        );
        c.dispatch_once(true);
        assert!(recv_all(&mut rx).is_empty(), "dispatched before it was due");
        // Only a due timer holds the key: nothing is in the ready lanes until pop fires it.
        std::thread::sleep(delay + Duration::from_millis(5));
        c.dispatch_once(true);
        let again = recv_all(&mut rx);
        assert_eq!(again.len(), 1, "a due requeue was never dispatched");
        assert_eq!(again[0].key.name, "later");
    }

    #[test]
    fn max_concurrent_bounds_all_sessions() {
        let c = controller(3);
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        c.add_session(1, 10, tx1);
        c.add_session(2, 10, tx2);
        c.enqueue(
            (0..10).map(|i| ObjectKey::new("ns", format!("k{i}"))),
            false,
        );
        c.dispatch_once(true);
        assert_eq!(recv_all(&mut rx1).len() + recv_all(&mut rx2).len(), 3);
    }

    #[test]
    fn another_tenants_backlog_does_not_hold_the_next_free_seat() {
        let seats = SeatPool::new(2, crate::dispatch::seats::Weights::default());
        let tenant = |t: &str| {
            Controller::with_seat_pool(
                ControllerId {
                    tenant: t.into(),
                    name: "c".into(),
                },
                registration(100),
                Arc::new(Metrics::new()),
                &seats,
            )
        };
        let (a, b) = (tenant("tenant-a"), tenant("tenant-b"));
        let (txa, mut rxa) = mpsc::unbounded_channel();
        let (txb, mut rxb) = mpsc::unbounded_channel();
        a.add_session(1, 50, txa);
        b.add_session(2, 50, txb);
        a.enqueue(
            (0..100).map(|i| ObjectKey::new("ns", format!("k{i}"))),
            false,
        );
        a.dispatch_once(true);
        let first = recv_all(&mut rxa);
        assert_eq!(first.len(), 2, "A takes every free seat, and no more");
        b.enqueue([ObjectKey::new("ns", "live")], false);
        b.dispatch_once(true);
        assert!(recv_all(&mut rxb).is_empty(), "no seat is free yet");
        // A's backlog waits too, but the seat A frees goes to B, whose tag is behind.
        a.dispatch_once(true);
        assert_eq!(
            a.complete(1, &first[0].id, Outcome::Done, ""),
            Completion::Accepted
        );
        a.dispatch_once(true);
        assert!(
            recv_all(&mut rxa).is_empty(),
            "A took the seat B was waiting for"
        );
        b.dispatch_once(true);
        let got = recv_all(&mut rxb);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key.name, "live");
        // B's result frees its seat, and A's backlog goes on.
        assert_eq!(
            b.complete(2, &got[0].id, Outcome::Done, ""),
            Completion::Accepted
        );
        a.dispatch_once(true);
        assert_eq!(recv_all(&mut rxa).len(), 1);
        assert_eq!(seats.in_use(), 2);
    }
}
