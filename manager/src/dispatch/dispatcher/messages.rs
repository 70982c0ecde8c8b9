//! What the dispatcher tells a session (translated to protobuf at the gRPC edge), and what a
//! result did. Plain data: no locks, no queue.

use crate::dispatch::event_queue::Delivery;
use crate::dispatch::queue::Reason;
use crate::dispatch::spans::Attempt;
use crate::informer::ObjectKey;
use crate::informer::object::CachedObject;
use serde_json::Value;
use std::sync::Arc;
use std::time::SystemTime;

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

/// What a result did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Accepted.
    Accepted,
    /// Unknown id, another session's request, or past its deadline: discarded.
    Discarded,
}
