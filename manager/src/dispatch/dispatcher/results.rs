//! Results and acks coming back from sessions, and the failures kept for the status page.
//!
//! A result counts only from the session that holds the request and before its deadline;
//! anything else is discarded, which is how a late result after a redelivery is ignored.

use super::state::{InFlight, Phase};
use super::{Completion, Controller};
use crate::dispatch::queue::Outcome;
use crate::dispatch::spans;
use crate::informer::ObjectKey;
use crate::metrics::ResultLabel;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

/// How many failed reconciles each controller keeps for the status page.
pub(crate) const RECENT_ERRORS: usize = 20;

/// A failed reconcile kept for the status page: bounded per controller, newest last.
#[derive(Debug, Clone)]
pub(crate) struct RecentError {
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

impl Controller {
    pub(super) fn record_error(
        &self,
        key: &ObjectKey,
        attempt: u32,
        kind: &'static str,
        message: &str,
    ) {
        let mut ring = self.recent_errors.lock();
        if ring.len() == RECENT_ERRORS {
            ring.pop_front();
        }
        ring.push_back(RecentError {
            at: SystemTime::now(),
            key: key.clone(),
            attempt,
            kind,
            message: truncate(message, MAX_ERROR_MESSAGE).to_owned(),
        });
    }

    /// EVENTS mode: `session` acknowledged delivery `id`. On an exclusive session an ack after
    /// the deadline still counts: the event was processed, and its handler has ended.
    pub(crate) fn ack(&self, session: u64, id: &str) -> Completion {
        let now = Instant::now();
        let mut st = self.lock();
        let valid = st.in_flight.get(id).is_some_and(|f| {
            f.session == session && f.event && (f.deadline > now || f.phase == Phase::Expired)
        });
        if !valid {
            return self.discarded();
        }
        let Some(mut f) = st.in_flight.remove(id) else {
            return self.discarded();
        };
        let held = st.events.bytes();
        st.events.ack(&f.key);
        let freed = held - st.events.bytes();
        st.end_trace(&mut f, "success", false, None);
        st.release_credit(f.session);
        drop(st);
        self.queued.add(-(freed as isize));
        self.counters.done.fetch_add(1, Ordering::Relaxed);
        self.metrics.reconciled(
            &self.id.name,
            &self.group,
            ResultLabel::Success,
            false,
            f.started.elapsed(),
        );
        self.wake.notify_one();
        Completion::Accepted
    }

    /// A result from `session` for request `id`; `message` is the controller's error text.
    pub(crate) fn complete(
        &self,
        session: u64,
        id: &str,
        outcome: Outcome,
        message: &str,
    ) -> Completion {
        let now = Instant::now();
        let mut st = self.lock();
        let Some(f) = st
            .in_flight
            .get(id)
            .filter(|f| f.session == session && !f.event)
        else {
            return self.discarded();
        };
        if f.phase != Phase::Live || f.deadline <= now {
            if f.exclusive {
                // The replica says the attempt past its deadline has ended: its outcome comes
                // too late to count, but the key may now go to whoever is next.
                self.confirm_ended(&mut st, id, now);
                drop(st);
                self.wake.notify_one();
            }
            return self.discarded();
        }
        let Some(mut f) = st.in_flight.remove(id) else {
            return self.discarded();
        };
        st.queue.done_handout(&f.key, f.handout, outcome, now);
        // Its tombstone served its last request unless the key is queued again.
        let tombstone = if st.queue.holds(&f.key) {
            None
        } else {
            st.tombstones.remove(&f.key)
        };
        // The last key of a backlog: the queue's and the dispatch's transient memory is free now.
        let drained = st.queue.is_empty() && st.queue.in_flight_count() == 0;
        let (label, again) = spans::outcome(outcome);
        let failed = matches!(outcome, Outcome::Error { .. } | Outcome::Terminal);
        // For the result's log line: the trace this attempt is.
        let traced = f.trace.as_ref().map(|t| t.root());
        st.end_trace(&mut f, label, again, failed.then_some(message));
        st.release_credit(f.session);
        drop(st);
        if let Some(t) = tombstone {
            self.queued.add(-(t.last.json().len() as isize));
        }
        if drained {
            crate::informer::heap::release_after_burst();
        }
        self.count_result(&f, outcome, message, traced);
        self.wake.notify_one();
        Completion::Accepted
    }

    /// An exclusive attempt past its deadline ended: its key goes back to the queue after its
    /// backoff (a missed deadline), and the session's credit is free again.
    fn confirm_ended(&self, st: &mut super::state::State, id: &str, now: Instant) {
        let Some(mut f) = st.in_flight.remove(id) else {
            return;
        };
        if f.phase == Phase::Live {
            // Its deadline passed before the dispatch loop noticed: count the miss now.
            self.counters
                .deadline_misses
                .fetch_add(1, Ordering::Relaxed);
            self.metrics.deadline_missed(&self.id.name, &self.group);
            self.record_error(&f.key, f.attempt, "deadline", "");
            st.end_trace(
                &mut f,
                "deadline",
                true,
                Some("no result before the deadline"),
            );
        }
        st.requeue_missed(&f, now);
        st.release_credit(f.session);
        tracing::debug!(controller = %self.id, key = %f.key, "an attempt past its deadline ended; its key may be handed out again");
    }

    /// A result or ack for an id not in flight on its session (a duplicate, a late one, an
    /// unknown one): dropped, but counted, as the proto says.
    fn discarded(&self) -> Completion {
        self.counters.discarded.fetch_add(1, Ordering::Relaxed);
        self.metrics.discarded(&self.id.name, &self.group);
        Completion::Discarded
    }

    /// Metrics, counters, the recent-errors ring and the log line of an accepted result.
    fn count_result(
        &self,
        f: &InFlight,
        outcome: Outcome,
        message: &str,
        traced: Option<opentelemetry::trace::SpanContext>,
    ) {
        let (label, terminal) = match outcome {
            Outcome::Done => (ResultLabel::Success, false),
            Outcome::RequeueAfter(d) if d.is_zero() => (ResultLabel::Requeue, false),
            Outcome::RequeueAfter(_) => (ResultLabel::RequeueAfter, false),
            Outcome::Error { .. } | Outcome::Lost | Outcome::Missed => (ResultLabel::Error, false),
            Outcome::Terminal => (ResultLabel::Error, true),
        };
        self.metrics.reconciled(
            &self.id.name,
            &self.group,
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
            Outcome::Missed => &self.counters.deadline_misses,
        };
        c.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Outcome::Error { .. } => self.record_error(&f.key, f.attempt, "error", message),
            Outcome::Terminal => self.record_error(&f.key, f.attempt, "terminal", message),
            _ => {}
        }
        tracing::debug!(
            controller = %self.id,
            key = %f.key,
            ?outcome,
            took = ?f.started.elapsed(),
            trace_id = traced.as_ref().map(|t| tracing::field::display(t.trace_id())),
            span_id = traced.as_ref().map(|t| tracing::field::display(t.span_id())),
            "result"
        );
    }
}

/// How much of a controller's error message the recent-errors ring keeps: the ring is kept
/// per controller, and a message may be as large as a gRPC message.
const MAX_ERROR_MESSAGE: usize = 1024;

/// `s` cut to at most `max` bytes, on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_messages_are_cut_on_a_character_boundary() {
        assert_eq!(super::truncate("short", 1024), "short");
        let long = "é".repeat(1000);
        let cut = super::truncate(&long, 1023);
        assert_eq!(cut.len(), 1022);
        assert!(long.starts_with(cut));
    }
}
