//! OpenTelemetry spans of the dispatch path, so that one reconcile is one trace across the gRPC
//! hop into the controller process.
//!
//! - `reconcile` (INTERNAL, root; `event` in MODE_EVENTS): one per attempt, from dispatch to
//!   result, missed deadline or lost session, carrying the controller, tenant (as metrics and
//!   limits name it), the identity that registered the controller, key, attempt and
//!   `ctrlhub.outcome`. Every informer event (or resync) that queued its key since the previous
//!   attempt is a span event `enqueue` on it, at the time it happened ([`PendingLinks`], at
//!   most [`MAX_LINKS_PER_KEY`]): many events collapse into one request, and a watch event has
//!   no trace of its own to link to, so it is recorded, not made a one-span trace. An attempt
//!   re-delivered because of its outcome (error, requeue, lost, deadline) is linked from the
//!   next one, so a retry chain can be walked.
//! - `dispatch` (CLIENT, child of the attempt): the request on the controller's stream; its
//!   W3C `traceparent`/`tracestate` travel in `ReconcileRequest` / `Event`, so the SDK's
//!   SERVER `reconcile` span becomes its child.
//!
//! Nothing here runs unless [`ctrlhub_otel::enabled`]: with no OTLP endpoint configured
//! there are no spans, no links kept, and requests carry an empty `traceparent`.

use crate::dispatch::queue::Outcome;
use crate::informer::ObjectKey;
use crate::key::ControllerId;
use ctrlhub_otel::{key_attributes, tracer};
use opentelemetry::trace::{
    Event, Link, SpanContext, SpanKind, Status, TraceContextExt as _, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use std::collections::{HashMap, VecDeque};
use std::time::SystemTime;

pub(crate) use ctrlhub_otel::enabled;

/// Links and enqueue events kept per key for its next attempt (each); older ones are dropped
/// (and counted) beyond this, so a hot key cannot grow its attempt span without bound.
pub(crate) const MAX_LINKS_PER_KEY: usize = 8;

/// Why an attempt links to another span (`ctrlhub.link` attribute of the link).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkKind {
    /// The previous attempt, whose outcome re-delivered the key.
    PreviousAttempt,
}

impl LinkKind {
    fn as_str(self) -> &'static str {
        match self {
            LinkKind::PreviousAttempt => "previous_attempt",
        }
    }
}

/// An informer event or resync that queued a key: when, and in which lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Enqueued {
    at: SystemTime,
    background: bool,
}

impl Enqueued {
    /// Now, for a live change (`background` false) or a resync or relist.
    pub(crate) fn now(background: bool) -> Self {
        Enqueued {
            at: SystemTime::now(),
            background,
        }
    }

    fn event(self) -> Event {
        let lane = if self.background {
            "background"
        } else {
            "live"
        };
        Event::new(
            "enqueue",
            self.at,
            vec![KeyValue::new("ctrlhub.priority", lane)],
            0,
        )
    }
}

#[derive(Debug, Default)]
struct KeyLinks {
    links: VecDeque<Link>,
    enqueues: VecDeque<Enqueued>,
    dropped: u32,
}

/// What a key's next attempt records of what came before it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Pending {
    /// Links to earlier attempts.
    pub links: Vec<Link>,
    /// `enqueue` span events, oldest first.
    pub events: Vec<Event>,
    /// Links and events dropped beyond [`MAX_LINKS_PER_KEY`].
    pub dropped: u32,
}

/// Span links and enqueue events waiting for each key's next attempt.
#[derive(Debug, Default)]
pub(crate) struct PendingLinks {
    by_key: HashMap<ObjectKey, KeyLinks>,
}

impl PendingLinks {
    /// Remember `span` for `key`'s next attempt, keeping the newest [`MAX_LINKS_PER_KEY`].
    pub(crate) fn add(&mut self, key: &ObjectKey, span: SpanContext, kind: LinkKind) {
        if !span.is_valid() {
            return;
        }
        // The key is cloned only for a new entry.
        let entry = match self.by_key.get_mut(key) {
            Some(e) => e,
            None => self.by_key.entry(key.clone()).or_default(),
        };
        if entry.links.len() == MAX_LINKS_PER_KEY {
            entry.links.pop_front();
            entry.dropped = entry.dropped.saturating_add(1);
        }
        entry.links.push_back(Link::new(
            span,
            vec![KeyValue::new("ctrlhub.link", kind.as_str())],
            0,
        ));
    }

    /// Remember that `key` was queued, for its next attempt's `enqueue` events, keeping the
    /// newest [`MAX_LINKS_PER_KEY`].
    pub(crate) fn enqueued(&mut self, key: &ObjectKey, what: Enqueued) {
        let entry = match self.by_key.get_mut(key) {
            Some(e) => e,
            None => self.by_key.entry(key.clone()).or_default(),
        };
        if entry.enqueues.len() == MAX_LINKS_PER_KEY {
            entry.enqueues.pop_front();
            entry.dropped = entry.dropped.saturating_add(1);
        }
        entry.enqueues.push_back(what);
    }

    /// What `key`'s attempt starting now records; forgets it.
    pub(crate) fn take(&mut self, key: &ObjectKey) -> Pending {
        match self.by_key.remove(key) {
            Some(k) => Pending {
                links: k.links.into(),
                events: k.enqueues.into_iter().map(Enqueued::event).collect(),
                dropped: k.dropped,
            },
            None => Pending::default(),
        }
    }

    #[cfg(test)]
    /// Keys with links waiting (for tests and bounds checks).
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

/// The controller's name, its tenant as metrics, limits and dashboards name it (so the Traces
/// dashboard's tenant filter matches), and the identity that registered it.
fn controller_attributes(controller: &ControllerId, tenant: &str) -> [KeyValue; 3] {
    [
        KeyValue::new("ctrlhub.controller", controller.name.clone()),
        KeyValue::new("ctrlhub.tenant", tenant.to_owned()),
        KeyValue::new("ctrlhub.identity", controller.tenant.clone()),
    ]
}

/// What an attempt delivers: a reconcile request or an EVENTS-mode event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptKind {
    /// MODE_RECONCILE.
    Reconcile,
    /// MODE_EVENTS.
    Event,
}

/// The identity of one attempt, as its spans record it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttemptInfo<'a> {
    /// Who it is for.
    pub controller: &'a ControllerId,
    /// The controller's tenant, as metrics and limits name it.
    pub tenant: &'a str,
    /// Reconcile or event.
    pub kind: AttemptKind,
    /// The key.
    pub key: &'a ObjectKey,
    /// 1-based attempt.
    pub attempt: u32,
    /// The request id sent to the controller.
    pub request_id: &'a str,
    /// The session it goes to.
    pub session: u64,
}

/// The spans of one attempt in flight: the root and its CLIENT dispatch child.
#[derive(Debug)]
pub(crate) struct Attempt {
    root: Context,
    dispatch: Context,
}

impl Attempt {
    /// Starts the root span (with `pending`'s links and enqueue events) and the dispatch span
    /// of an attempt.
    pub(crate) fn start(info: AttemptInfo<'_>, pending: Pending) -> Attempt {
        let tracer = tracer();
        let Pending {
            links,
            events,
            dropped,
        } = pending;
        let mut attributes = Vec::with_capacity(9);
        attributes.extend(controller_attributes(info.controller, info.tenant));
        attributes.extend(key_attributes(&info.key.namespace, &info.key.name));
        attributes.push(KeyValue::new("ctrlhub.attempt", i64::from(info.attempt)));
        if dropped > 0 {
            attributes.push(KeyValue::new("ctrlhub.links.dropped", i64::from(dropped)));
        }
        let name = match info.kind {
            AttemptKind::Reconcile => "reconcile",
            AttemptKind::Event => "event",
        };
        let root = tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes)
            .with_links(links)
            .with_events(events)
            .start_with_context(&tracer, &Context::new());
        let root = Context::new().with_span(root);
        let dispatch = tracer
            .span_builder("dispatch")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "ctrlhub.v1.ControllerManager"),
                KeyValue::new("rpc.method", "Connect"),
                KeyValue::new("ctrlhub.request.id", info.request_id.to_owned()),
                KeyValue::new(
                    "ctrlhub.session",
                    i64::try_from(info.session).unwrap_or(i64::MAX),
                ),
            ])
            .start_with_context(&tracer, &root);
        let dispatch = root.with_span(dispatch);
        Attempt { root, dispatch }
    }

    /// `traceparent` and `tracestate` of the dispatch span, for the wire.
    pub(crate) fn trace_context(&self) -> (String, String) {
        ctrlhub_otel::inject(&self.dispatch)
    }

    /// The root span, for linking the next attempt.
    pub(crate) fn root(&self) -> SpanContext {
        self.root.span().span_context().clone()
    }

    /// Ends both spans with `outcome` (`ctrlhub.outcome`) and, on failure, an error status.
    pub(crate) fn finish(self, outcome: &'static str, error: Option<&str>) {
        for cx in [&self.dispatch, &self.root] {
            let span = cx.span();
            span.set_attribute(KeyValue::new("ctrlhub.outcome", outcome));
            if let Some(message) = error {
                span.set_status(Status::error(ctrlhub_otel::status_message(message)));
            }
            span.end();
        }
    }
}

/// The `ctrlhub.outcome` of a result, and whether it re-delivers the key (then the next attempt
/// links to this one).
pub(crate) fn outcome(o: Outcome) -> (&'static str, bool) {
    match o {
        Outcome::Done => ("success", false),
        Outcome::RequeueAfter(d) if d.is_zero() => ("requeue", true),
        Outcome::RequeueAfter(_) => ("requeue_after", true),
        Outcome::Error { .. } => ("error", true),
        Outcome::Terminal => ("terminal", false),
        Outcome::Lost => ("lost", true),
        Outcome::Missed => ("deadline", true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    fn sc(n: u64) -> SpanContext {
        SpanContext::new(
            TraceId::from(u128::from(n) + 1),
            SpanId::from(n + 1),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        )
    }

    #[test]
    fn links_per_key_are_bounded_newest_kept_and_taken_once() {
        let mut p = PendingLinks::default();
        let key = ObjectKey::new("ns", "a");
        for n in 0..20 {
            p.add(&key, sc(n), LinkKind::PreviousAttempt);
        }
        p.add(
            &ObjectKey::new("ns", "b"),
            sc(99),
            LinkKind::PreviousAttempt,
        );
        p.add(
            &key,
            SpanContext::empty_context(),
            LinkKind::PreviousAttempt,
        );
        for n in 0..12 {
            p.enqueued(&key, Enqueued::now(n % 2 == 1));
        }
        assert_eq!(p.len(), 2);
        let Pending {
            links,
            events,
            dropped,
        } = p.take(&key);
        assert_eq!(links.len(), MAX_LINKS_PER_KEY);
        assert_eq!(events.len(), MAX_LINKS_PER_KEY);
        assert!(events.iter().all(|e| e.name == "enqueue"));
        assert_eq!(
            dropped,
            (20 - MAX_LINKS_PER_KEY as u32) + (12 - MAX_LINKS_PER_KEY as u32)
        );
        assert_eq!(links[0].span_context, sc(12), "the oldest are dropped");
        assert_eq!(links[MAX_LINKS_PER_KEY - 1].span_context, sc(19));
        assert_eq!(p.take(&key), Pending::default(), "taken once");
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn outcomes_name_the_result_and_whether_it_comes_back() {
        use std::time::Duration;
        assert_eq!(outcome(Outcome::Done), ("success", false));
        assert_eq!(
            outcome(Outcome::RequeueAfter(Duration::ZERO)),
            ("requeue", true)
        );
        assert_eq!(
            outcome(Outcome::RequeueAfter(Duration::from_secs(1))),
            ("requeue_after", true)
        );
        assert_eq!(
            outcome(Outcome::Error { retry_after: None }),
            ("error", true)
        );
        assert_eq!(outcome(Outcome::Terminal), ("terminal", false));
        assert_eq!(outcome(Outcome::Lost), ("lost", true));
    }
}
