//! Read-only figures of a controller for `/metrics` and the status page. The page builds its
//! own views from these; nothing here is shaped for HTML or JSON.

use super::state::{InFlight, SessionSlot, State};
use super::{Controller, RecentError};
use crate::dispatch::queue::QueuedAs;
use crate::informer::ObjectKey;
use std::time::Instant;

/// A controller's queue as `/metrics` reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueStats {
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
    /// Bytes of events and tombstones held for delivery.
    pub queued_bytes: u64,
    /// Credits of its sessions together: what its replicas accept at once.
    pub credits: u64,
}

/// Where a controller's keys are, for the status page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KeyCounts {
    /// Ready to be handed out (and EVENTS-mode events waiting).
    pub ready: usize,
    /// Waiting on a requeue-after the controller asked for: scheduled, not failing.
    pub scheduled: usize,
    /// Waiting out a backoff after an error or a missed deadline.
    pub failing: usize,
    /// Handed out and not yet answered.
    pub in_flight: usize,
}

/// A controller's sessions, in-flight requests and queue, read under its lock
/// (see [`Controller::inspect`]).
pub(crate) struct Inspection<'a> {
    st: &'a State,
}

impl Inspection<'_> {
    /// Requests in flight, in no particular order.
    pub(crate) fn in_flight(&self) -> impl Iterator<Item = &InFlight> {
        self.st.in_flight.values()
    }

    /// Attached sessions by number, in the order they attached.
    pub(crate) fn sessions(&self) -> impl Iterator<Item = (u64, &SessionSlot)> {
        self.st.sessions.iter().map(|(n, slot)| (*n, slot))
    }

    /// At most `limit` queued keys in dispatch order, then keys waiting on a timer.
    pub(crate) fn queued(&self, limit: usize) -> Vec<(ObjectKey, QueuedAs)> {
        self.st.queue.peek(limit)
    }
}

impl InFlight {
    /// The key.
    pub(crate) fn key(&self) -> &ObjectKey {
        &self.key
    }

    /// The session it went to.
    pub(crate) fn session(&self) -> u64 {
        self.session
    }

    /// 1-based attempt.
    pub(crate) fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When it was handed out.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }
}

impl SessionSlot {
    /// Requests it accepts at once.
    pub(crate) fn credits(&self) -> u32 {
        self.credits
    }

    /// Requests it holds now.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Whether it asked to drain.
    pub(crate) fn draining(&self) -> bool {
        self.draining
    }
}

impl Controller {
    /// Queue figures for `/metrics`.
    pub(crate) fn queue_stats(&self) -> QueueStats {
        let now = Instant::now();
        let st = self.lock();
        QueueStats {
            depth: st.queue.len() + st.queue.waiting_len() + st.events.len(),
            in_flight: st.in_flight.len(),
            sessions: st.sessions.len(),
            adds: st.queue.adds_total(),
            retries: st.queue.retries_total(),
            // Folded from +0.0: an empty f64 `sum()` is -0.0, which a dashboard shows as "-0".
            unfinished: st
                .in_flight
                .values()
                .map(|f| now.saturating_duration_since(f.started).as_secs_f64())
                .fold(0.0, |total, s| total + s),
            longest: st
                .in_flight
                .values()
                .map(|f| now.saturating_duration_since(f.started).as_secs_f64())
                .fold(0.0, f64::max),
            queued_bytes: self.queued.own(),
            credits: st.sessions.values().map(|s| u64::from(s.credits)).sum(),
        }
    }

    #[cfg(test)]
    /// Queue depth, in-flight count and number of sessions.
    pub(crate) fn snapshot(&self) -> (usize, usize, usize) {
        let st = self.lock();
        (
            st.queue.len() + st.queue.waiting_len(),
            st.in_flight.len(),
            st.sessions.len(),
        )
    }

    /// Its keys counted by where they are: ready, scheduled, failing, in flight.
    pub(crate) fn key_counts(&self) -> KeyCounts {
        let st = self.lock();
        let failing = st.queue.retrying_len();
        KeyCounts {
            ready: st.queue.len() + st.events.len(),
            scheduled: st.queue.waiting_len().saturating_sub(failing),
            failing,
            in_flight: st.in_flight.len(),
        }
    }

    /// Read sessions, in-flight requests and queued keys together, under the controller's lock:
    /// keep `read` short, it holds up dispatch.
    pub(crate) fn inspect<R>(&self, read: impl FnOnce(&Inspection<'_>) -> R) -> R {
        let st = self.lock();
        read(&Inspection { st: &st })
    }

    /// The latest failures, newest first, at most `limit`.
    pub(crate) fn recent_errors(&self, limit: usize) -> Vec<RecentError> {
        self.recent_errors
            .lock()
            .iter()
            .rev()
            .take(limit)
            .cloned()
            .collect()
    }
}
