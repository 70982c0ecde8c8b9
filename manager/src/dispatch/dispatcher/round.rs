//! The dispatch loop, one round at a time: expire missed deadlines → dispatch events (EVENTS
//! mode) → dispatch keys (reserve under the lock, read payloads without it, send).
//!
//! Informer callbacks take the informer lock and then this controller's lock, so objects are
//! read from informers only while this controller's lock is *not* held: that is why a key's
//! request is reserved first and completed and sent after the lock is released. Events carry
//! their object already and are sent under the lock.

use super::messages::Tombstone;
use super::state::{InFlight, Phase, State, pick_session};
use super::{Controller, Outbound, Payload, Request, TraceContext};
use crate::dispatch::queue::{Handout, Outcome, Reason};
use crate::dispatch::seats::Seat;
use crate::dispatch::spans::{self, Attempt, AttemptInfo, AttemptKind, LinkKind};
use crate::informer::ObjectKey;
use crate::registration::Mode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::watch;

/// A key's request reserved under the lock (session credit, seat and in-flight entry taken),
/// to be completed with its payload and sent once the lock is released.
struct Reserved {
    session: u64,
    /// Its place in the session's outbox.
    permit: tokio::sync::mpsc::OwnedPermit<Outbound>,
    handout: Handout<ObjectKey>,
    /// The request id.
    id: String,
    /// The tombstone known when it was reserved.
    tombstone: Option<Tombstone>,
    /// The dispatch span's trace context.
    trace: TraceContext,
}

/// Why a round stopped handing out work, which decides what may wake the loop next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// Nothing is ready: the next queue timer is worth waking for.
    NoWork,
    /// Work is ready but no session can take it (no credit, a full outbox, the controller's
    /// concurrency reached, or not leading): a result, a credit, a new session or leadership
    /// wakes the loop, not the clock.
    Blocked,
    /// Work and a session are ready but no dispatch seat is free: the seat pool wakes the loop
    /// when it grants one.
    WaitingForSeat,
}

impl Controller {
    /// The dispatch loop: runs until `stop` fires. Only dispatches while `leading` is true.
    pub(crate) async fn run(
        self: Arc<Self>,
        mut leading: watch::Receiver<bool>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let resync = self.registration.resync;
        let mut next_resync = resync.map(|r| Instant::now() + r);
        loop {
            // However much work arrives, each round gives the runtime back its thread: a loop
            // that never awaits would starve every other task on it (probes, other tenants).
            tokio::task::consume_budget().await;
            let is_leader = *leading.borrow();
            if let Some(at) = next_resync
                && Instant::now() >= at
            {
                let keys = self.scoped_primary_keys();
                tracing::debug!(controller = %self.id, keys = keys.len(), "resync");
                self.enqueue(keys, Reason::Resync);
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
                _ = self.retired.cancelled() => return,
            }
        }
    }

    #[cfg(test)]
    /// One round as the leader, for unit tests elsewhere in dispatch (routing's) that drive a
    /// controller by hand.
    pub(crate) fn dispatch_round(&self) {
        self.dispatch_once(true);
    }

    /// One round: expire missed deadlines, then (when leading) hand out as much ready work as
    /// sessions, concurrency and dispatch seats allow. Returns when the caller should look again
    /// at the latest.
    pub(super) fn dispatch_once(&self, leading: bool) -> Option<Instant> {
        let now = Instant::now();
        let (reserved, stop) = {
            let mut st = self.lock();
            self.expire_deadlines(&mut st, now);
            if leading {
                self.hand_out(&mut st, now)
            } else {
                (Vec::new(), Stop::Blocked)
            }
        };
        if !reserved.is_empty() {
            self.send_keys(reserved);
        }
        self.next_wake(stop)
    }

    /// Requests whose deadline passed, and orphaned ones whose hold is over. A missed deadline
    /// on an ordinary session re-queues the key at once (at-least-once; a late result is
    /// discarded); on an exclusive session the attempt may still run there, so the key stays
    /// with it, expired, until a result confirms the end (its seat is freed now). An orphaned
    /// attempt's key goes back to the queue once its release time comes.
    fn expire_deadlines(&self, st: &mut State, now: Instant) {
        let due: Vec<String> = st
            .in_flight
            .iter()
            .filter(|(_, f)| f.next_look().is_some_and(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        let mut missed = 0;
        for id in due {
            let Some(phase) = st.in_flight.get(&id).map(|f| f.phase) else {
                continue;
            };
            match phase {
                Phase::Orphaned { .. } => {
                    if let Some(f) = st.in_flight.remove(&id) {
                        st.requeue_lost(&f, now);
                    }
                }
                Phase::Live => {
                    missed += 1;
                    self.miss_deadline(st, &id, now);
                }
                Phase::Expired => {}
            }
        }
        if missed > 0
            && let Some(held_back) = self.deadline_log.lock().hit(now)
        {
            // One line per period however many deadlines a controller misses: the count is in
            // ctrlhub_deadline_misses_total.
            tracing::warn!(controller = %self.id, missed, held_back, "requests missed their deadline; re-queued with backoff once they end");
        }
    }

    /// Request `id` missed its deadline: counted, and its key re-queued with backoff now, or
    /// (exclusive session) kept until the replica confirms the attempt ended.
    fn miss_deadline(&self, st: &mut State, id: &str, now: Instant) {
        let Some(f) = st.in_flight.get_mut(id) else {
            return;
        };
        let traced = f.trace.as_ref().map(|t| t.root());
        tracing::debug!(
            controller = %self.id,
            key = %f.key,
            exclusive = f.exclusive,
            trace_id = traced.as_ref().map(|t| tracing::field::display(t.trace_id())),
            span_id = traced.as_ref().map(|t| tracing::field::display(t.span_id())),
            "request missed its deadline"
        );
        self.counters
            .deadline_misses
            .fetch_add(1, Ordering::Relaxed);
        self.metrics.deadline_missed(&self.id.name, &self.group);
        let (key, attempt) = (f.key.clone(), f.attempt);
        self.record_error(&key, attempt, "deadline", "");
        if f.exclusive {
            f.phase = Phase::Expired;
            f.seat = None;
            if let Some(t) = f.trace.take() {
                st.links.add(&key, t.root(), LinkKind::PreviousAttempt);
                t.finish("deadline", Some("no result before the deadline"));
            }
            return;
        }
        if let Some(mut f) = st.in_flight.remove(id) {
            st.end_trace(
                &mut f,
                "deadline",
                true,
                Some("no result before the deadline"),
            );
            st.requeue_missed(&f, now);
            st.release_credit(f.session);
        }
    }

    /// Under the lock, while the controller is below `max_concurrent`: take a session with a
    /// free credit, a dispatch seat and the next piece of work. Events are sent at once; keys
    /// are reserved and returned, to be sent once the lock is released.
    fn hand_out(&self, st: &mut State, now: Instant) -> (Vec<Reserved>, Stop) {
        if !self.is_synced() {
            // Until every informer it uses has its first list, a key could be handed out
            // without its primary (a child listed first): nothing goes out before the caches
            // know. Syncing wakes the loop.
            return (Vec::new(), Stop::Blocked);
        }
        if self.is_quiesced() {
            // Shutting down: what is out may finish, nothing new starts.
            return (Vec::new(), Stop::Blocked);
        }
        let max = match self.registration.max_concurrent {
            0 => usize::MAX,
            n => n as usize,
        };
        let events = self.registration.mode == Mode::Events;
        let mut reserved = Vec::new();
        let stop = loop {
            if st.in_flight.len() >= max {
                break Stop::Blocked;
            }
            let Some(session) = pick_session(st) else {
                break Stop::Blocked;
            };
            let has_work = if events {
                !st.events.is_empty()
            } else {
                st.queue.has_ready(now)
            };
            if !has_work {
                break Stop::NoWork;
            }
            let Some(seat) = self.flow.acquire() else {
                break Stop::WaitingForSeat;
            };
            if events {
                if !self.send_event(st, session, seat, now) {
                    break Stop::Blocked;
                }
            } else {
                let Some(request) = self.reserve_key(st, session, seat, now) else {
                    break Stop::NoWork;
                };
                reserved.push(request);
            }
        };
        if stop != Stop::WaitingForSeat {
            // Seats granted while this controller waited but not needed now go to others.
            self.flow.withdraw();
        }
        (reserved, stop)
    }

    /// Dispatch events: pop the next one and send it to `session` now. False when there was
    /// none or the session is gone (the event is queued again), which ends the round.
    fn send_event(&self, st: &mut State, session: u64, seat: Seat, now: Instant) -> bool {
        let Some(delivery) = st.events.pop() else {
            return false;
        };
        let id = self.next_request_id();
        let deadline = SystemTime::now() + self.registration.deadline;
        let key = delivery.key.clone();
        let attempt = delivery.attempt;
        let trace = self.start_attempt(st, AttemptKind::Event, &key, attempt, &id, session);
        let sent = st.sessions.get(&session).is_some_and(|slot| {
            slot.tx.try_send(Outbound::Event {
                id: id.clone(),
                delivery,
                deadline,
                trace: TraceContext::of(trace.as_ref()),
            })
        });
        if !sent {
            st.events.lost(&key);
            if let Some(t) = trace {
                t.finish("lost", Some("the session ended before the event was sent"));
            }
            return false;
        }
        let exclusive = st.sessions.get_mut(&session).is_some_and(|slot| {
            slot.in_flight += 1;
            slot.exclusive
        });
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
                seat: Some(seat),
                exclusive,
                phase: Phase::Live,
            },
        );
        self.counters.dispatched.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Dispatch keys, first half: pop the next ready key and reserve its request for `session`
    /// (credit, seat, in-flight entry). None when no key is ready.
    fn reserve_key(
        &self,
        st: &mut State,
        session: u64,
        seat: Seat,
        now: Instant,
    ) -> Option<Reserved> {
        let permit = st.sessions.get(&session)?.tx.reserve()?;
        let handout = st.queue.pop(now)?;
        let id = self.next_request_id();
        let tombstone = st.tombstones.get(&handout.key).cloned();
        let exclusive = st.sessions.get_mut(&session).is_some_and(|slot| {
            slot.in_flight += 1;
            slot.exclusive
        });
        let trace = self.start_attempt(
            st,
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
                seat: Some(seat),
                exclusive,
                phase: Phase::Live,
            },
        );
        Some(Reserved {
            session,
            permit,
            handout,
            id,
            tombstone,
            trace: trace_context,
        })
    }

    /// Dispatch keys, second half: complete each reserved request with its payload while the
    /// lock is released, then send them under it. A request whose session went away meanwhile
    /// is handed back to the queue at once.
    fn send_keys(&self, reserved: Vec<Reserved>) {
        let requests: Vec<(u64, _, Request)> = reserved
            .into_iter()
            .map(|r| {
                (
                    r.session,
                    r.permit,
                    self.request_of(r.handout, r.id, r.tombstone, r.trace),
                )
            })
            .collect();
        let mut st = self.lock();
        for (session, permit, request) in requests {
            // A session still attached still reads its outbox: detaching it re-queues what it
            // held, this request included, so nothing is lost if it goes right after.
            let sent = st.sessions.contains_key(&session);
            let id = request.id.clone();
            if sent {
                permit.send(Outbound::Reconcile(request));
                self.counters.dispatched.fetch_add(1, Ordering::Relaxed);
            } else if let Some(mut f) = st.in_flight.remove(&id) {
                // The session went away between reservation and sending.
                st.queue
                    .done_handout(&f.key, f.handout, Outcome::Lost, Instant::now());
                st.end_trace(
                    &mut f,
                    "lost",
                    true,
                    Some("the session ended before the request was sent"),
                );
                st.release_credit(session);
            }
        }
    }

    /// The request for a reserved key (reads the informer: call without the lock).
    fn request_of(
        &self,
        handout: Handout<ObjectKey>,
        id: String,
        tombstone: Option<Tombstone>,
        trace: TraceContext,
    ) -> Request {
        self.metrics
            .dispatched(&self.id.name, &self.group, handout.enqueued_at.elapsed());
        let payload = self.payload(&handout.key, tombstone);
        Request {
            id,
            key: handout.key.clone(),
            attempt: handout.attempt,
            reasons: handout.reasons.iter().collect(),
            payload,
            deadline: SystemTime::now() + self.registration.deadline,
            trace,
        }
    }

    /// What a request carries: nothing unless the registration asked for the object; else the
    /// cached primary, or the tombstone of a deletion the manager saw. A key with neither (a
    /// watch mapped to a name that does not exist) carries nothing, which the proto says to
    /// treat as NotFound: a tombstone, and the DELETED it implies, only for a real deletion.
    fn payload(&self, key: &ObjectKey, tombstone: Option<Tombstone>) -> Payload {
        if !self.registration.include_object {
            return Payload::None;
        }
        match (self.primary_object(key), tombstone) {
            (Some(obj), _) => Payload::Object(obj),
            (None, Some(t)) => Payload::Tombstone(t),
            (None, None) => Payload::None,
        }
    }

    /// The earliest missed deadline, and the earliest queue timer when the round ran out of
    /// work (not of sessions, credits, seats or leadership): when the loop must look again even
    /// if nothing wakes it. A due timer while every session is full would otherwise wake the
    /// loop at once, again and again, until a result came: each of those ends with a `wake`.
    fn next_wake(&self, stop: Stop) -> Option<Instant> {
        let st = self.lock();
        let next_deadline = st.in_flight.values().filter_map(InFlight::next_look).min();
        let next_ready = match stop {
            Stop::NoWork => st.queue.next_ready_at(),
            Stop::Blocked | Stop::WaitingForSeat => None,
        };
        match (next_deadline, next_ready) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn next_request_id(&self) -> String {
        format!(
            "{}-{}",
            self.id.name,
            self.next_request.fetch_add(1, Ordering::Relaxed)
        )
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
                tenant: &self.group,
                kind,
                key,
                attempt,
                request_id,
                session,
            },
            links,
        ))
    }
}
