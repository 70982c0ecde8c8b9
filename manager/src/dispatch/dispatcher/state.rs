//! What a controller's lock guards: its queues, its sessions and what each holds, plus the small
//! operations every path that ends a request shares.

use super::messages::{Mailbox, Outbound, Tombstone};
use crate::dispatch::event_queue::EventQueue;
use crate::dispatch::queue::{Outcome, WorkQueue};
use crate::dispatch::seats::Seat;
use crate::dispatch::spans::{Attempt, LinkKind, PendingLinks};
use crate::informer::ObjectKey;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// An attached session: its credits, what it holds, and its outbound channels (read through
/// [`super::inspect::Inspection`]).
pub(crate) struct SessionSlot {
    pub(super) credits: u32,
    pub(super) in_flight: u32,
    pub(super) draining: bool,
    pub(super) tx: Mailbox,
    /// Registered with `exclusive_attempts`: its attempts stay in flight until it confirms
    /// they ended, or until the hold after its last heartbeat answer once it is gone.
    pub(super) exclusive: bool,
    /// When the manager last answered its heartbeat (its registration, before the first):
    /// the replica stops every handler within the hold of that answer.
    pub(super) last_echo: Instant,
}

/// Where an attempt stands: dispatched and before its deadline, or (on an exclusive session)
/// past it and not yet confirmed ended, or its session gone and fenced until a release time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Before its deadline; a result counts.
    Live,
    /// Past its deadline on a live exclusive session: the key stays with the session until a
    /// result (discarded as an outcome) confirms the attempt ended.
    Expired,
    /// Its exclusive session ended: the key is handed out again at `release`, the hold after
    /// the session's last heartbeat answer, when the replica has stopped whatever ran.
    Orphaned {
        /// When the key may go to another replica.
        release: Instant,
    },
}

/// A request (or EVENTS-mode delivery) handed to a session and not yet answered (read through
/// [`super::inspect::Inspection`]).
pub(crate) struct InFlight {
    pub(super) key: ObjectKey,
    pub(super) session: u64,
    /// The queue's handout id (0 for an EVENTS-mode delivery).
    pub(super) handout: u64,
    pub(super) deadline: Instant,
    pub(super) started: Instant,
    /// 1-based attempt, for status pages and error records.
    pub(super) attempt: u32,
    /// An EVENTS-mode delivery (acknowledged, not completed with an outcome).
    pub(super) event: bool,
    /// Its spans, when tracing is on.
    pub(super) trace: Option<Attempt>,
    /// Its share of the manager's dispatch budget, freed when the request ends however it
    /// ends, or at its deadline (a handler stuck past it holds its key, not a seat).
    pub(super) seat: Option<Seat>,
    /// Dispatched to an exclusive session.
    pub(super) exclusive: bool,
    /// Live, expired or orphaned.
    pub(super) phase: Phase,
}

impl InFlight {
    /// When the dispatch loop must next look at it: its deadline while live, its release once
    /// orphaned; never while expired (only a result or its session's end moves it).
    pub(super) fn next_look(&self) -> Option<Instant> {
        match self.phase {
            Phase::Live => Some(self.deadline),
            Phase::Expired => None,
            Phase::Orphaned { release } => Some(release),
        }
    }
}

/// Everything behind a controller's lock.
pub(super) struct State {
    pub(super) queue: WorkQueue<ObjectKey>,
    pub(super) sessions: BTreeMap<u64, SessionSlot>,
    /// In-flight requests by request id.
    pub(super) in_flight: HashMap<String, InFlight>,
    /// The last state of deleted primaries, for tombstone payloads.
    pub(super) tombstones: HashMap<ObjectKey, Tombstone>,
    pub(super) events: EventQueue,
    pub(super) next_session_pick: u64,
    /// Enqueue spans (and re-delivered attempts) to link from each key's next attempt; only
    /// filled while tracing is on.
    pub(super) links: PendingLinks,
}

impl State {
    /// Nothing queued, nothing in flight, no session.
    pub(super) fn new(queue: WorkQueue<ObjectKey>) -> Self {
        State {
            queue,
            sessions: BTreeMap::new(),
            in_flight: HashMap::new(),
            tombstones: HashMap::new(),
            events: EventQueue::default(),
            next_session_pick: 0,
            links: PendingLinks::default(),
        }
    }

    /// Hand a lost delivery out again at once (at-least-once), in whichever queue it came from.
    pub(super) fn requeue_lost(&mut self, f: &InFlight, now: Instant) {
        self.requeue(f, Outcome::Lost, now);
    }

    /// Hand a delivery whose deadline passed out again, a key after its backoff.
    pub(super) fn requeue_missed(&mut self, f: &InFlight, now: Instant) {
        self.requeue(f, Outcome::Missed, now);
    }

    fn requeue(&mut self, f: &InFlight, outcome: Outcome, now: Instant) {
        if f.event {
            self.events.lost(&f.key);
        } else {
            self.queue.done_handout(&f.key, f.handout, outcome, now);
        }
    }

    /// End an attempt's spans; when its outcome re-delivers the key, the next attempt links
    /// to it.
    pub(super) fn end_trace(
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

    /// A request of `session` ended, however it ended (result, ack, missed deadline, never
    /// sent): it holds one request less, and a draining session that now holds none is told it
    /// has drained (the proto: the stream ends with OK once nothing is in flight).
    pub(super) fn release_credit(&mut self, session: u64) {
        if let Some(s) = self.sessions.get_mut(&session) {
            s.in_flight = s.in_flight.saturating_sub(1);
            if s.draining && s.in_flight == 0 {
                s.tx.control(Outbound::Drained);
            }
        }
    }
}

/// The session with the most free credits, rotating among equals so keys spread over replicas.
pub(super) fn pick_session(st: &mut State) -> Option<u64> {
    let start = st.next_session_pick;
    let best = st
        .sessions
        .iter()
        .filter(|(_, s)| !s.draining && s.in_flight < s.credits && s.tx.has_room())
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
