//! What the dispatcher tells a session (translated to protobuf at the gRPC edge), what a
//! result did, and the session's outbox between the two. Plain data and channels: no locks, no
//! queue; the outbox asks its controller ([`Release`]) whether each message may still go out.

use crate::dispatch::event_queue::Delivery;
use crate::dispatch::queue::Reason;
use crate::dispatch::spans::Attempt;
use crate::informer::ObjectKey;
use crate::informer::object::CachedObject;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;
use tokio::sync::{Notify, mpsc};

/// Requests and events a session's stream may have waiting to be written, beyond what the
/// controller holds in flight. A session that does not read fills it and then receives nothing
/// more (its keys go to other sessions or wait), so what a stalled reader pins is bounded.
pub(super) const OUTBOX_CAPACITY: usize = 16;

/// The dispatcher's end of a session's outbound channels (kept in its session slot).
pub(super) struct Mailbox {
    work: mpsc::Sender<Outbound>,
    control: mpsc::UnboundedSender<Outbound>,
    /// Set when dispatch skipped the session for a full outbox: the edge then wakes the
    /// dispatcher as soon as it takes a message.
    starved: Arc<AtomicBool>,
}

impl Mailbox {
    /// Whether the outbox can take another request now; when not, the edge will wake the
    /// dispatcher once it can.
    pub(super) fn has_room(&self) -> bool {
        if self.work.capacity() > 0 {
            return true;
        }
        self.starved.store(true, Ordering::Release);
        false
    }

    /// A place in the outbox for a request to be completed once the controller's lock is
    /// released.
    pub(super) fn reserve(&self) -> Option<mpsc::OwnedPermit<Outbound>> {
        self.work.clone().try_reserve_owned().ok()
    }

    /// Queue an event now; false if the outbox is full or the session gone.
    pub(super) fn try_send(&self, message: Outbound) -> bool {
        self.work.try_send(message).is_ok()
    }

    /// Tell the session to end or that it drained; never blocked by a full outbox.
    pub(super) fn control(&self, message: Outbound) {
        // Only Revoke and Drained go here, a handful per session at most.
        let _ = self.control.send(message);
    }
}

/// The gRPC edge's end of a session's outbound channels.
pub(crate) struct Outbox {
    /// Revoke and Drained.
    pub control: mpsc::UnboundedReceiver<Outbound>,
    /// Requests and events.
    pub work: WorkOutbox,
}

/// Decides, as a message leaves a session's outbox, whether it may still go out (the
/// controller, by its scope): a key whose namespace left a selector scope while it waited, or
/// a resync or retry of one that never entered, is settled there unseen instead of leaving the
/// manager.
pub(super) trait Release: Send + Sync {
    /// Whether `message` may go out on `session`; when not, it has been settled.
    fn release(&self, session: u64, message: &Outbound) -> bool;
}

/// Requests and events for a session, at most [`OUTBOX_CAPACITY`] waiting.
pub(crate) struct WorkOutbox {
    rx: mpsc::Receiver<Outbound>,
    starved: Arc<AtomicBool>,
    wake: Arc<Notify>,
    /// Whose scope each message passes on its way out (gone with the controller).
    release: Weak<dyn Release>,
    session: u64,
}

impl WorkOutbox {
    /// The next request or event that may go out if one is already waiting (the edge fills a
    /// batch with them; unit tests drive dispatch by hand); wakes the dispatcher if it was
    /// waiting for room.
    pub(crate) fn try_next(&mut self) -> Option<Outbound> {
        loop {
            let next = self.rx.try_recv().ok()?;
            if self.starved.swap(false, Ordering::AcqRel) {
                self.wake.notify_one();
            }
            if self.may_go(&next) {
                return Some(next);
            }
        }
    }

    /// The next request or event that may go out; wakes the dispatcher if it was waiting for
    /// room.
    pub(crate) async fn next(&mut self) -> Option<Outbound> {
        loop {
            let next = self.rx.recv().await;
            if self.starved.swap(false, Ordering::AcqRel) {
                self.wake.notify_one();
            }
            match next {
                Some(message) if !self.may_go(&message) => continue,
                next => return next,
            }
        }
    }

    fn may_go(&self, message: &Outbound) -> bool {
        // A controller that is gone settles nothing; its session ends with it.
        self.release
            .upgrade()
            .is_none_or(|r| r.release(self.session, message))
    }
}

/// A session's outbound channels; `wake` is its controller's dispatch task, and `release` what
/// each message passes on its way out.
pub(super) fn mailbox(
    wake: Arc<Notify>,
    release: Weak<dyn Release>,
    session: u64,
) -> (Mailbox, Outbox) {
    let (work_tx, work_rx) = mpsc::channel(OUTBOX_CAPACITY);
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let starved = Arc::new(AtomicBool::new(false));
    (
        Mailbox {
            work: work_tx,
            control: control_tx,
            starved: starved.clone(),
        },
        Outbox {
            control: control_rx,
            work: WorkOutbox {
                rx: work_rx,
                starved,
                wake,
                release,
                session,
            },
        },
    )
}

/// The object a request carries.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    /// The object was not requested.
    None,
    /// The current object, as the cache holds it (its JSON is sent as is).
    Object(CachedObject),
    /// The object is gone, or left the registration's scope; its last known state.
    Tombstone(Tombstone),
}

/// The last known state of a primary that is gone, or left the registration's scope. Kept only
/// while its key is queued or in flight, and counted against the tenant's queued bytes.
#[derive(Debug, Clone)]
pub(crate) struct Tombstone {
    /// Its last state as JSON; only its identity (apiVersion, kind, name, namespace, uid,
    /// resourceVersion) when the tenant's queued bytes could not hold the whole object.
    pub last: CachedObject,
    /// The deletion was inferred from a relist: `last` may be older than the real final state.
    pub final_state_unknown: bool,
    /// It still exists but stopped matching the registration's label selector.
    pub left_scope: bool,
}

/// A reconcile request on its way to a session (translated to protobuf at the gRPC edge).
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// Unique request id.
    pub id: String,
    /// The key.
    pub key: ObjectKey,
    /// 1-based attempt.
    pub attempt: u32,
    /// Why it is delivered.
    pub reasons: Vec<Reason>,
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
pub(crate) struct TraceContext {
    /// `traceparent`.
    pub traceparent: String,
    /// `tracestate`.
    pub tracestate: String,
}

impl TraceContext {
    pub(super) fn of(attempt: Option<&Attempt>) -> Self {
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
pub(crate) enum Outbound {
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
pub(crate) enum RevokeReason {
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
    /// The session's token expired or is no longer accepted.
    CredentialsExpired,
    /// Ring mode: another member owns the controller now.
    UnitMoved,
}

/// What a result did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    /// Accepted.
    Accepted,
    /// Unknown id, another session's request, or past its deadline: discarded.
    Discarded,
}
