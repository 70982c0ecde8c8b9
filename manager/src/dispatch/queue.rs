//! One work queue per controller.
//!
//! The queue is where ctrlhub's delivery contract (level-triggered, exclusive, at-least-once,
//! requeue-after, backoff, terminal, priority) is decided, so it is a plain synchronous data
//! structure with no Kubernetes, gRPC or async types: every rule can be unit-tested by driving
//! time by hand. The reference semantics are client-go's workqueue (dirty set, processing set,
//! delayed heap, per-item rate limiter) and controller-runtime's priority queue.
//!
//! Time is never read from the system: every mutating call takes `now`, and
//! [`WorkQueue::next_ready_at`] tells the caller how long it may sleep.
//!
//! # Life of a key
//!
//! A key is in at most one of these states:
//!
//! * **ready** — waiting in the Live or Background ready queue for [`WorkQueue::pop`];
//! * **waiting** — has a timer (requeue-after, error backoff or [`WorkQueue::add_after`]) and
//!   becomes ready when it fires, or earlier if an event arrives;
//! * **processing** — handed out by `pop` and not yet finished with [`WorkQueue::done`]; it may
//!   additionally be *dirty* (an event arrived meanwhile) so it is delivered once more after
//!   `done`, never concurrently;
//! * **terminal** — the last attempt ended in a terminal error; only [`WorkQueue::add`] (an
//!   object change) brings it back.
//!
//! # Priority rule
//!
//! Live work (watch events) is popped before Background work (initial list, resync), except that
//! after `live_burst` (default [`DEFAULT_LIVE_BURST`]) consecutive Live pops made while
//! Background work was ready, the next pop takes one Background item. A Live pop made while no
//! Background work is ready resets the count, so a ready Background item waits behind at most
//! `live_burst` Live pops. Within one priority, keys are FIFO by the time they became ready.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, Instant};

pub(crate) use crate::registration::Backoff;

/// Consecutive Live pops allowed while Background work waits; large enough that live changes
/// dominate latency, small enough that a full resync still drains at a useful rate.
pub(crate) const DEFAULT_LIVE_BURST: u32 = 8;

/// Which lane a key is queued in.
///
/// Ordered so that `Live > Background`, which lets merges keep the more urgent priority with
/// `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Priority {
    /// Initial list and resync work: must make progress, but never ahead of real changes.
    Background,
    /// Watch events: someone is waiting for the controller to react to a change.
    Live,
}

/// `now + d`, saturating far in the future instead of panicking: delays come from controllers
/// (`requeue_after`, `retry_after`, backoff settings) and `Instant + Duration` panics on
/// overflow — in [`WorkQueue::done_handout`] after the entry was taken out, losing the key.
fn later(now: Instant, d: Duration) -> Instant {
    /// About a century: "never" for any manager process.
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(d)
        .or_else(|| now.checked_add(FAR))
        .unwrap_or(now)
}

/// How a worker finished a key; fed back with [`WorkQueue::done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Reconciled; forget the backoff.
    Done,
    /// Reconciled, but look again no earlier than this (unless the object changes first).
    RequeueAfter(Duration),
    /// Failed; retry with backoff, or later if the controller asked for more time.
    Error {
        /// A controller-supplied minimum delay (e.g. from a `Retry-After`); the larger of this
        /// and the backoff wins so neither a polite controller nor the backoff is overridden.
        retry_after: Option<Duration>,
    },
    /// Failed in a way retrying cannot fix; wait for the object to change.
    Terminal,
    /// The worker's session ended first: the work was not done, so deliver again at once. It
    /// counts as an attempt but not as a failure, so the backoff does not grow.
    Lost,
    /// The worker missed its deadline: deliver again, after the key's backoff, which grows. A
    /// controller that never answers must not turn its keys into a redelivery loop.
    Missed,
}

/// Why a key is being delivered; several reasons can collapse into one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reason {
    /// The primary object was created (a watch event).
    Created,
    /// The primary object was updated.
    Updated,
    /// The primary object was deleted.
    Deleted,
    /// The primary object still exists but left the registration's scope (its labels stopped
    /// matching the label selector).
    LeftScope,
    /// An owned object changed.
    OwnedChanged,
    /// A watched object mapping to the key changed.
    WatchedChanged,
    /// The object was in a cache's initial list (a new registration, a new leader, a namespace
    /// entering the scope): background work.
    InitialList,
    /// A periodic resync: background work.
    Resync,
    /// A [`WorkQueue::add_after`] timer fired.
    Scheduled,
    /// The previous attempt asked for [`Outcome::RequeueAfter`].
    RequeueAfter,
    /// The previous attempt failed with [`Outcome::Error`].
    Backoff,
    /// The previous attempt was [`Outcome::Lost`] or [`Outcome::Missed`].
    Redelivery,
}

impl Reason {
    const ALL: [Reason; 12] = [
        Reason::Created,
        Reason::Updated,
        Reason::Deleted,
        Reason::LeftScope,
        Reason::OwnedChanged,
        Reason::WatchedChanged,
        Reason::InitialList,
        Reason::Resync,
        Reason::Scheduled,
        Reason::RequeueAfter,
        Reason::Backoff,
        Reason::Redelivery,
    ];

    fn bit(self) -> u16 {
        1 << (self as u16)
    }

    /// The lane a key added for this reason waits in: changes are live, initial lists and
    /// resyncs background.
    pub(crate) fn priority(self) -> Priority {
        match self {
            Reason::InitialList | Reason::Resync => Priority::Background,
            _ => Priority::Live,
        }
    }

    /// A stable lower-case name for wire messages and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Created => "created",
            Reason::Updated => "updated",
            Reason::Deleted => "deleted",
            Reason::LeftScope => "left_scope",
            Reason::OwnedChanged => "owned_changed",
            Reason::WatchedChanged => "watched_changed",
            Reason::InitialList => "initial_list",
            Reason::Resync => "resync",
            Reason::Scheduled => "scheduled",
            Reason::RequeueAfter => "requeue_after",
            Reason::Backoff => "backoff",
            Reason::Redelivery => "redelivery",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A small set of [`Reason`]s; a bit set because collapsing thousands of events must not grow
/// memory per key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct Reasons(u16);

impl Reasons {
    /// Whether `reason` contributed to this delivery.
    pub(crate) fn contains(&self, reason: Reason) -> bool {
        self.0 & reason.bit() != 0
    }

    /// The reasons in a fixed order, so wire messages are deterministic.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Reason> + '_ {
        Reason::ALL.into_iter().filter(|r| self.contains(*r))
    }

    fn insert(&mut self, reason: Reason) {
        self.0 |= reason.bit();
    }
}

/// Identifies one hand-out of a key, so a late result for an earlier hand-out can be told apart
/// from the result of the current one.
pub(crate) type HandoutId = u64;

/// A key handed to a worker by [`WorkQueue::pop`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handout<K> {
    /// The key to reconcile.
    pub key: K,
    /// Unique per hand-out; pass it to [`WorkQueue::done_handout`] to ignore stale results.
    pub id: HandoutId,
    /// 1-based attempt number: 1 plus the errors and redeliveries since the last success.
    pub attempt: u32,
    /// The lane it was popped from.
    pub priority: Priority,
    /// When the key became ready, for `workqueue_queue_duration_seconds`.
    pub enqueued_at: Instant,
    /// Everything that asked for this delivery since the previous one.
    pub reasons: Reasons,
}

/// Where a key is; see the module docs for the life cycle.
#[derive(Debug, Clone)]
enum State {
    /// Only kept around to remember a terminal verdict.
    Idle,
    Ready {
        priority: Priority,
        seq: u64,
        enqueued_at: Instant,
    },
    Waiting {
        at: Instant,
        seq: u64,
        priority: Priority,
    },
    Processing {
        handout_id: HandoutId,
        priority: Priority,
        /// Read by the inspection API only (longest-running and unfinished work).
        #[cfg_attr(not(test), allow(dead_code))]
        started_at: Instant,
        /// Set by an add during processing: deliver again right after `done`.
        dirty: Option<Dirty>,
        /// The earliest `add_after` requested during processing.
        timer: Option<Instant>,
        /// Set by `remove` during processing: drop everything on `done`.
        forgotten: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct Dirty {
    priority: Priority,
    since: Instant,
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    /// Consecutive errors: drives the backoff exponent.
    failures: u32,
    /// Consecutive errors plus redeliveries: drives the attempt number.
    retries: u32,
    terminal: bool,
    /// Reasons collected for the next delivery.
    reasons: Reasons,
}

impl Entry {
    fn new() -> Self {
        Self {
            state: State::Idle,
            failures: 0,
            retries: 0,
            terminal: false,
            reasons: Reasons::default(),
        }
    }
}

/// Where a queued key sits, as [`WorkQueue::peek`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueuedAs {
    /// Ready in the Live lane.
    Live,
    /// Ready in the Background lane.
    Background,
    /// Waiting on a requeue-after or `add_after` timer until this instant: scheduled, not
    /// failing.
    Timer(Instant),
    /// Waiting out its backoff after an error or a missed deadline until this instant: failing.
    Retry(Instant),
}

/// A level-triggered, exclusive, prioritized work queue with per-key backoff and timers.
///
/// `K` needs `Ord` only so timers with equal deadlines have a deterministic order.
#[derive(Debug)]
pub(crate) struct WorkQueue<K: Clone + Eq + Hash + Ord> {
    backoff: Backoff,
    live_burst: u32,
    entries: HashMap<K, Entry>,
    live: BTreeMap<u64, K>,
    background: BTreeMap<u64, K>,
    timers: BTreeMap<(Instant, u64), K>,
    /// The timers (by sequence number) that are a backoff after a failure, not a schedule.
    retry_timers: HashSet<u64>,
    next_seq: u64,
    next_handout: HandoutId,
    in_flight: usize,
    live_streak: u32,
    adds_total: u64,
    retries_total: u64,
}

impl<K: Clone + Eq + Hash + Ord> WorkQueue<K> {
    /// An empty queue with the given backoff and [`DEFAULT_LIVE_BURST`].
    pub(crate) fn new(backoff: Backoff) -> Self {
        Self {
            backoff,
            live_burst: DEFAULT_LIVE_BURST,
            entries: HashMap::new(),
            live: BTreeMap::new(),
            background: BTreeMap::new(),
            timers: BTreeMap::new(),
            retry_timers: HashSet::new(),
            next_seq: 0,
            next_handout: 1,
            in_flight: 0,
            live_streak: 0,
            adds_total: 0,
            retries_total: 0,
        }
    }

    #[cfg(test)]
    /// Sets how many consecutive Live pops may pass a waiting Background item.
    ///
    /// Clamped to at least 1: zero would invert the priorities rather than disable them.
    pub(crate) fn with_live_burst(mut self, live_burst: u32) -> Self {
        self.live_burst = live_burst.max(1);
        self
    }

    /// Records that `key` needs reconciling at `priority`, for an update (Live) or a resync
    /// (Background); see [`WorkQueue::add_because`].
    #[cfg(test)]
    pub(crate) fn add(&mut self, key: K, priority: Priority, now: Instant) {
        let reason = match priority {
            Priority::Live => Reason::Updated,
            Priority::Background => Reason::Resync,
        };
        self.add_because(key, reason, now);
    }

    /// Records that `key` needs reconciling, because of `reason` (which also decides its lane).
    ///
    /// Level-triggered: a key already ready stays queued once (upgraded to Live if this add is
    /// Live); a key being processed is marked dirty and delivered again after `done`; a key
    /// waiting on a requeue-after, backoff or `add_after` timer becomes ready now, because an
    /// event means there is new state to look at; a terminal key is revived.
    pub(crate) fn add_because(&mut self, key: K, reason: Reason, now: Instant) {
        let priority = reason.priority();
        let mut entry = self.entries.remove(&key).unwrap_or_else(Entry::new);
        entry.terminal = false;
        entry.reasons.insert(reason);
        match entry.state {
            State::Idle => {
                self.adds_total += 1;
                entry.state = self.enqueue(&key, priority, now);
            }
            State::Ready {
                priority: old,
                seq,
                enqueued_at,
            } => {
                if priority > old {
                    self.background.remove(&seq);
                    let seq = self.push_ready(&key, priority);
                    entry.state = State::Ready {
                        priority,
                        seq,
                        enqueued_at,
                    };
                }
            }
            State::Waiting {
                at,
                seq,
                priority: old,
            } => {
                self.unschedule(at, seq);
                self.adds_total += 1;
                entry.state = self.enqueue(&key, priority.max(old), now);
            }
            State::Processing {
                forgotten: true, ..
            } => {
                // The key was removed while in flight and is now back in scope: treat it like a
                // fresh key that happens to be busy, so it is delivered after the old attempt.
                if let State::Processing {
                    ref mut dirty,
                    ref mut forgotten,
                    ..
                } = entry.state
                {
                    *forgotten = false;
                    *dirty = Some(Dirty {
                        priority,
                        since: now,
                    });
                }
                self.adds_total += 1;
            }
            State::Processing { ref mut dirty, .. } => match dirty {
                Some(d) => d.priority = d.priority.max(priority),
                None => {
                    self.adds_total += 1;
                    *dirty = Some(Dirty {
                        priority,
                        since: now,
                    });
                }
            },
        }
        self.entries.insert(key, entry);
    }

    #[cfg(test)]
    /// Makes `key` ready after `delay`, at Live priority.
    ///
    /// Keeps the earlier of an existing timer and this one; does nothing to a key that is
    /// already ready (it will be delivered sooner anyway) and nothing to a terminal key, since
    /// only an object change may revive it. During processing the request is remembered and
    /// merged with the outcome on `done`.
    pub(crate) fn add_after(&mut self, key: K, delay: Duration, now: Instant) {
        let at = later(now, delay);
        let mut entry = self.entries.remove(&key).unwrap_or_else(Entry::new);
        match entry.state {
            State::Idle if entry.terminal => {}
            State::Idle => {
                entry.reasons.insert(Reason::Scheduled);
                entry.state = self.schedule(&key, at, Priority::Live);
            }
            State::Ready { .. } => {}
            State::Waiting {
                at: old,
                seq,
                priority,
            } => {
                entry.reasons.insert(Reason::Scheduled);
                if at < old {
                    self.unschedule(old, seq);
                    entry.state = self.schedule(&key, at, priority);
                }
            }
            State::Processing {
                ref mut timer,
                forgotten,
                ..
            } => {
                if !forgotten {
                    entry.reasons.insert(Reason::Scheduled);
                    *timer = Some(timer.map_or(at, |t| t.min(at)));
                }
            }
        }
        self.entries.insert(key, entry);
    }

    /// Hands out the next key, or `None` if nothing is ready at `now`.
    ///
    /// Due timers are moved to the ready queues first; the lane is chosen by the priority rule in
    /// the module docs. The key stays exclusive until [`WorkQueue::done`].
    pub(crate) fn pop(&mut self, now: Instant) -> Option<Handout<K>> {
        self.fire_timers(now);
        let take_background = !self.background.is_empty()
            && (self.live.is_empty() || self.live_streak >= self.live_burst);
        let (priority, key) = if take_background {
            self.live_streak = 0;
            let (_, key) = self.background.pop_first()?;
            (Priority::Background, key)
        } else {
            let (_, key) = self.live.pop_first()?;
            if self.background.is_empty() {
                self.live_streak = 0;
            } else {
                self.live_streak += 1;
            }
            (Priority::Live, key)
        };
        let handout_id = self.next_handout;
        self.next_handout += 1;
        let entry = self.entries.get_mut(&key)?;
        let enqueued_at = match entry.state {
            State::Ready { enqueued_at, .. } => enqueued_at,
            _ => now,
        };
        entry.state = State::Processing {
            handout_id,
            priority,
            started_at: now,
            dirty: None,
            timer: None,
            forgotten: false,
        };
        self.in_flight += 1;
        Some(Handout {
            attempt: entry.retries.saturating_add(1),
            reasons: std::mem::take(&mut entry.reasons),
            key,
            id: handout_id,
            priority,
            enqueued_at,
        })
    }

    #[cfg(test)]
    /// Finishes the current hand-out of `key`, whichever it is.
    ///
    /// Returns false (and changes nothing) if `key` is not being processed. Callers that can
    /// receive results late should prefer [`WorkQueue::done_handout`].
    ///
    /// If the key was dirtied while processing it becomes ready at once, at the priority of the
    /// adds that dirtied it, whatever the outcome: the object changed after the worker started,
    /// so even a terminal verdict or a requeue-after may be stale. The outcome's bookkeeping
    /// still applies (an error still counts towards the backoff; a terminal verdict is not
    /// recorded because the change supersedes it). Without a dirty mark, an `add_after` made
    /// during processing and the outcome's own timer are merged by keeping the earlier one.
    pub(crate) fn done(&mut self, key: &K, outcome: Outcome, now: Instant) -> bool {
        let Some(entry) = self.entries.get(key) else {
            return false;
        };
        let State::Processing { handout_id, .. } = entry.state else {
            return false;
        };
        self.done_handout(key, handout_id, outcome, now)
    }

    /// Finishes hand-out `id` of `key`; a result for any other hand-out is ignored (returns
    /// false), which is how a late result after a deadline is discarded.
    pub(crate) fn done_handout(
        &mut self,
        key: &K,
        id: HandoutId,
        outcome: Outcome,
        now: Instant,
    ) -> bool {
        let Some(mut entry) = self.entries.remove(key) else {
            return false;
        };
        let State::Processing {
            handout_id,
            priority,
            dirty,
            timer,
            forgotten,
            ..
        } = entry.state
        else {
            self.entries.insert(key.clone(), entry);
            return false;
        };
        if handout_id != id {
            self.entries.insert(key.clone(), entry);
            return false;
        }
        self.in_flight -= 1;
        if forgotten {
            return true;
        }

        let next = self.apply_outcome(&mut entry, outcome, timer, dirty.is_some(), now);
        entry.state = if let Some(d) = dirty {
            let seq = self.push_ready(key, d.priority);
            State::Ready {
                priority: d.priority,
                seq,
                enqueued_at: d.since,
            }
        } else if outcome == Outcome::Lost {
            self.adds_total += 1;
            self.enqueue(key, priority, now)
        } else if let Some((at, reason)) = next {
            entry.reasons.insert(reason);
            // Retries keep the lane of the attempt that produced them, so a failing resync item
            // does not jump ahead of live changes.
            let state = self.schedule(key, at, priority);
            if matches!(reason, Reason::Backoff | Reason::Redelivery)
                && let State::Waiting { seq, .. } = &state
            {
                self.retry_timers.insert(*seq);
            }
            state
        } else {
            State::Idle
        };
        if matches!(entry.state, State::Idle) && !entry.terminal {
            self.shrink_if_sparse();
            return true;
        }
        self.entries.insert(key.clone(), entry);
        true
    }

    /// `done_handout`'s bookkeeping of `outcome` on `entry` (failures, retries, terminal), and
    /// what the outcome alone asks for: a ready-at time and the reason for it, merged with a
    /// `timer` set by `add_after` during processing by keeping the earlier one.
    fn apply_outcome(
        &mut self,
        entry: &mut Entry,
        outcome: Outcome,
        timer: Option<Instant>,
        dirty: bool,
        now: Instant,
    ) -> Option<(Instant, Reason)> {
        let mut next: Option<(Instant, Reason)> = timer.map(|t| (t, Reason::Scheduled));
        let mut keep = |at: Instant, reason: Reason| match next {
            Some((t, _)) if t <= at => {}
            _ => next = Some((at, reason)),
        };
        match outcome {
            Outcome::Done => {
                entry.failures = 0;
                entry.retries = 0;
            }
            Outcome::RequeueAfter(d) => {
                entry.failures = 0;
                entry.retries = 0;
                keep(later(now, d), Reason::RequeueAfter);
            }
            Outcome::Error { retry_after } => {
                let delay = self.backoff.delay(entry.failures);
                let delay = retry_after.map_or(delay, |r| r.max(delay));
                entry.failures = entry.failures.saturating_add(1);
                entry.retries = entry.retries.saturating_add(1);
                self.retries_total += 1;
                keep(later(now, delay), Reason::Backoff);
            }
            Outcome::Terminal => {
                entry.failures = 0;
                entry.retries = 0;
                next = None;
                if !dirty {
                    entry.terminal = true;
                }
            }
            Outcome::Lost => {
                entry.retries = entry.retries.saturating_add(1);
                self.retries_total += 1;
                entry.reasons.insert(Reason::Redelivery);
                next = None;
            }
            Outcome::Missed => {
                let delay = self.backoff.delay(entry.failures);
                entry.failures = entry.failures.saturating_add(1);
                entry.retries = entry.retries.saturating_add(1);
                self.retries_total += 1;
                keep(later(now, delay), Reason::Redelivery);
            }
        }
        next
    }

    /// A HashMap keeps the capacity of its largest moment: after an initial list of 100k keys has
    /// drained, that is several MiB held for nothing. Shrinking once it is three-quarters empty
    /// costs O(len) at most once per halving, so it stays amortized O(1).
    fn shrink_if_sparse(&mut self) {
        const MIN_CAPACITY: usize = 1024;
        let capacity = self.entries.capacity();
        if capacity > MIN_CAPACITY && self.entries.len() < capacity / 4 {
            self.entries
                .shrink_to((self.entries.len() * 2).max(MIN_CAPACITY));
        }
    }

    #[cfg(test)]
    /// Forgets `key` entirely: its place in the queue, timers, backoff and terminal verdict.
    ///
    /// A key in flight stays exclusive until its worker reports back (so a re-added key is never
    /// handed to a second worker concurrently), but that result then changes nothing.
    pub(crate) fn remove(&mut self, key: &K) {
        let Some(mut entry) = self.entries.remove(key) else {
            return;
        };
        match entry.state {
            State::Idle => {}
            State::Ready { priority, seq, .. } => {
                self.lane(priority).remove(&seq);
            }
            State::Waiting { at, seq, .. } => {
                self.unschedule(at, seq);
            }
            State::Processing {
                handout_id,
                priority,
                started_at,
                ..
            } => {
                entry = Entry::new();
                entry.state = State::Processing {
                    handout_id,
                    priority,
                    started_at,
                    dirty: None,
                    timer: None,
                    forgotten: true,
                };
                self.entries.insert(key.clone(), entry);
            }
        }
    }

    /// The earliest pending timer, so the caller can sleep until then (or until an add).
    ///
    /// `None` means no timer is pending; ready work is reported by [`WorkQueue::len`], not here.
    pub(crate) fn next_ready_at(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    /// Keys ready to pop (`workqueue_depth`); excludes keys waiting on timers and in flight.
    pub(crate) fn len(&self) -> usize {
        self.live.len() + self.background.len()
    }

    /// True when nothing is ready to pop right now.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether [`WorkQueue::pop`] at `now` may hand out a key: one is ready, or a timer is due
    /// (pop fires due timers first, which [`WorkQueue::len`] does not count yet).
    pub(crate) fn has_ready(&self, now: Instant) -> bool {
        !self.is_empty() || self.next_ready_at().is_some_and(|at| at <= now)
    }

    #[cfg(test)]
    /// Ready keys in one lane.
    pub(crate) fn depth(&self, priority: Priority) -> usize {
        match priority {
            Priority::Live => self.live.len(),
            Priority::Background => self.background.len(),
        }
    }

    /// Up to `limit` keys in the order they would be popped now (Live lane first), then keys
    /// waiting on a timer, earliest first; for status pages, so bounded by `limit`.
    pub(crate) fn peek(&self, limit: usize) -> Vec<(K, QueuedAs)> {
        self.live
            .values()
            .map(|k| (k.clone(), QueuedAs::Live))
            .chain(
                self.background
                    .values()
                    .map(|k| (k.clone(), QueuedAs::Background)),
            )
            .chain(self.timers.iter().map(|((at, seq), k)| {
                let waits = if self.retry_timers.contains(seq) {
                    QueuedAs::Retry(*at)
                } else {
                    QueuedAs::Timer(*at)
                };
                (k.clone(), waits)
            }))
            .take(limit)
            .collect()
    }

    /// Keys waiting on a timer (requeue-after, backoff, `add_after`).
    pub(crate) fn waiting_len(&self) -> usize {
        self.timers.len()
    }

    /// Keys of [`WorkQueue::waiting_len`] waiting out a backoff after an error or a missed
    /// deadline (failing), as opposed to a requeue-after they asked for (scheduled).
    pub(crate) fn retrying_len(&self) -> usize {
        self.retry_timers.len()
    }

    /// Whether `key` is ready, waiting on a timer or handed out: whether anything still to
    /// come may need what the caller keeps for it (its tombstone).
    pub(crate) fn holds(&self, key: &K) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| !matches!(e.state, State::Idle))
    }

    /// Keys handed out and not yet finished.
    pub(crate) fn in_flight_count(&self) -> usize {
        self.in_flight
    }

    #[cfg(test)]
    /// Whether `key` is currently handed out.
    pub(crate) fn is_processing(&self, key: &K) -> bool {
        matches!(
            self.entries.get(key).map(|e| &e.state),
            Some(State::Processing { .. })
        )
    }

    #[cfg(test)]
    /// Whether `key` is parked after a terminal error.
    pub(crate) fn is_terminal(&self, key: &K) -> bool {
        self.entries.get(key).is_some_and(|e| e.terminal)
    }

    #[cfg(test)]
    /// The current hand-out of `key`, so a deadline timer can report [`Outcome::Lost`] for
    /// exactly the handout it was armed for.
    pub(crate) fn current_handout(&self, key: &K) -> Option<HandoutId> {
        match self.entries.get(key).map(|e| &e.state) {
            Some(State::Processing { handout_id, .. }) => Some(*handout_id),
            _ => None,
        }
    }

    #[cfg(test)]
    /// Consecutive errors recorded for `key` (the backoff exponent).
    pub(crate) fn failures(&self, key: &K) -> u32 {
        self.entries.get(key).map_or(0, |e| e.failures)
    }

    /// Keys that entered the ready queue or were marked dirty (`workqueue_adds_total`);
    /// collapsed adds are not counted, as in client-go.
    pub(crate) fn adds_total(&self) -> u64 {
        self.adds_total
    }

    /// Errors and redeliveries (`workqueue_retries_total`).
    pub(crate) fn retries_total(&self) -> u64 {
        self.retries_total
    }

    #[cfg(test)]
    /// How long the oldest in-flight key has been processing
    /// (`workqueue_longest_running_processor_seconds`); zero when idle.
    pub(crate) fn longest_running(&self, now: Instant) -> Duration {
        self.processing_ages(now).max().unwrap_or_default()
    }

    #[cfg(test)]
    /// Total time in-flight keys have been processing (`workqueue_unfinished_work_seconds`),
    /// which grows when workers are stuck.
    pub(crate) fn unfinished_work(&self, now: Instant) -> Duration {
        self.processing_ages(now).sum()
    }

    #[cfg(test)]
    fn processing_ages(&self, now: Instant) -> impl Iterator<Item = Duration> + '_ {
        self.entries.values().filter_map(move |e| match e.state {
            State::Processing { started_at, .. } => Some(now.saturating_duration_since(started_at)),
            _ => None,
        })
    }

    fn lane(&mut self, priority: Priority) -> &mut BTreeMap<u64, K> {
        match priority {
            Priority::Live => &mut self.live,
            Priority::Background => &mut self.background,
        }
    }

    fn seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    fn push_ready(&mut self, key: &K, priority: Priority) -> u64 {
        let seq = self.seq();
        self.lane(priority).insert(seq, key.clone());
        seq
    }

    fn enqueue(&mut self, key: &K, priority: Priority, now: Instant) -> State {
        let seq = self.push_ready(key, priority);
        State::Ready {
            priority,
            seq,
            enqueued_at: now,
        }
    }

    fn schedule(&mut self, key: &K, at: Instant, priority: Priority) -> State {
        let seq = self.seq();
        self.timers.insert((at, seq), key.clone());
        State::Waiting { at, seq, priority }
    }

    /// Removes the timer `(at, seq)` of a key that stops waiting.
    fn unschedule(&mut self, at: Instant, seq: u64) {
        self.timers.remove(&(at, seq));
        self.retry_timers.remove(&seq);
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(entry) = self.timers.first_entry() {
            let (at, seq) = *entry.key();
            if at > now {
                break;
            }
            let key = entry.remove();
            self.retry_timers.remove(&seq);
            let Some(State::Waiting { priority, .. }) = self.entries.get(&key).map(|e| &e.state)
            else {
                continue;
            };
            let priority = *priority;
            let seq = self.push_ready(&key, priority);
            self.adds_total += 1;
            if let Some(e) = self.entries.get_mut(&key) {
                // Queue duration is measured from when the key was due, not from when the
                // caller got round to popping: lateness of the pop loop is queue latency.
                e.state = State::Ready {
                    priority,
                    seq,
                    enqueued_at: at,
                };
            }
        }
    }

    /// Checks the internal indexes agree with each other; tests call it after every step.
    #[cfg(test)]
    fn check_invariants(&self) {
        let mut ready = 0;
        let mut waiting = 0;
        let mut processing = 0;
        for (key, e) in &self.entries {
            match e.state {
                State::Idle => assert!(e.terminal, "idle entries exist only to remember terminal"),
                State::Ready { priority, seq, .. } => {
                    ready += 1;
                    let lane = match priority {
                        Priority::Live => &self.live,
                        Priority::Background => &self.background,
                    };
                    assert!(
                        lane.get(&seq) == Some(key),
                        "ready key missing from its lane"
                    );
                }
                State::Waiting { at, seq, .. } => {
                    waiting += 1;
                    assert!(self.timers.get(&(at, seq)) == Some(key), "timer missing");
                }
                State::Processing { .. } => processing += 1,
            }
            if !matches!(e.state, State::Idle) {
                assert!(!e.terminal || matches!(e.state, State::Processing { .. }));
            }
        }
        assert_eq!(ready, self.len(), "stale entries in ready lanes");
        assert_eq!(waiting, self.timers.len(), "stale timers");
        assert!(
            self.retry_timers
                .iter()
                .all(|seq| self.timers.keys().any(|(_, s)| s == seq)),
            "stale retry timers"
        );
        assert_eq!(processing, self.in_flight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const MS: Duration = Duration::from_millis(1);

    /// A manual clock: tests move time explicitly, so nothing sleeps and nothing flakes.
    struct Clock(Instant);

    impl Clock {
        fn new() -> Self {
            Self(Instant::now())
        }
        fn now(&self) -> Instant {
            self.0
        }
        fn advance(&mut self, d: Duration) {
            self.0 += d;
        }
    }

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new(Backoff::default())
    }

    fn pop_key(q: &mut WorkQueue<&'static str>, now: Instant) -> Option<&'static str> {
        let handout = q.pop(now);
        q.check_invariants();
        handout.map(|l| l.key)
    }

    #[test]
    fn a_drained_backlog_gives_its_capacity_back() {
        let c = Clock::new();
        let mut q: WorkQueue<u32> = WorkQueue::new(Backoff::default());
        for k in 0..50_000 {
            q.add(k, Priority::Background, c.now());
        }
        let peak = q.entries.capacity();
        assert!(peak >= 50_000);
        while let Some(handout) = q.pop(c.now()) {
            assert!(q.done(&handout.key, Outcome::Done, c.now()));
        }
        assert!(q.entries.is_empty());
        assert!(
            q.entries.capacity() <= 4096,
            "capacity {} kept after draining from {peak}",
            q.entries.capacity()
        );
        // Still a working queue afterwards.
        q.add(7, Priority::Live, c.now());
        assert_eq!(q.pop(c.now()).map(|l| l.key), Some(7));
    }

    #[test]
    fn peek_lists_keys_in_pop_order_then_timers_and_is_bounded() {
        let c = Clock::new();
        let mut q = queue();
        q.add("bg", Priority::Background, c.now());
        q.add("live", Priority::Live, c.now());
        q.add_after("later", 5 * MS, c.now());
        assert_eq!(
            q.peek(10),
            vec![
                ("live", QueuedAs::Live),
                ("bg", QueuedAs::Background),
                ("later", QueuedAs::Timer(c.now() + 5 * MS)),
            ]
        );
        assert_eq!(q.peek(1), vec![("live", QueuedAs::Live)]);
        assert_eq!(pop_key(&mut q, c.now()), Some("live"));
        assert_eq!(q.peek(10).len(), 2, "a popped key is in flight, not queued");
    }

    /// A key waiting on the requeue-after it asked for is scheduled; one waiting out a backoff
    /// after an error or a missed deadline is failing, until it runs again.
    #[test]
    fn timers_tell_scheduled_keys_from_failing_ones() {
        let mut c = Clock::new();
        let mut q = queue();
        for k in ["poll", "fails", "late"] {
            q.add(k, Priority::Live, c.now());
        }
        let outcomes = [
            Outcome::RequeueAfter(300 * 1000 * MS),
            Outcome::Error { retry_after: None },
            Outcome::Missed,
        ];
        for outcome in outcomes {
            let h = q.pop(c.now()).expect("a ready key");
            assert!(q.done(&h.key, outcome, c.now()));
            q.check_invariants();
        }
        assert_eq!((q.waiting_len(), q.retrying_len()), (3, 2));
        let waits: HashMap<&str, QueuedAs> = q.peek(10).into_iter().collect();
        assert!(matches!(waits["poll"], QueuedAs::Timer(_)), "{waits:?}");
        assert!(matches!(waits["fails"], QueuedAs::Retry(_)), "{waits:?}");
        assert!(matches!(waits["late"], QueuedAs::Retry(_)), "{waits:?}");
        // An event makes a failing key ready at once; a fired backoff leaves nothing behind.
        q.add("fails", Priority::Live, c.now());
        q.check_invariants();
        assert_eq!((q.waiting_len(), q.retrying_len()), (2, 1));
        c.advance(10 * 1000 * MS);
        while let Some(h) = q.pop(c.now()) {
            assert!(q.done(&h.key, Outcome::Done, c.now()));
        }
        q.check_invariants();
        assert_eq!((q.waiting_len(), q.retrying_len()), (1, 0));
    }

    #[test]
    fn many_adds_collapse_into_one_pop() {
        let c = Clock::new();
        let mut q = queue();
        for _ in 0..100 {
            q.add("a", Priority::Live, c.now());
        }
        q.add("a", Priority::Background, c.now());
        assert_eq!(q.len(), 1);
        assert_eq!(q.adds_total(), 1);
        let handout = q.pop(c.now()).expect("a is ready");
        assert_eq!(handout.key, "a");
        assert_eq!(handout.attempt, 1);
        assert_eq!(handout.priority, Priority::Live);
        assert!(handout.reasons.contains(Reason::Updated));
        assert!(handout.reasons.contains(Reason::Resync));
        assert!(q.pop(c.now()).is_none());
    }

    #[test]
    fn processing_key_is_exclusive_and_dirty_redelivers_once() {
        let mut c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        let first = q.pop(c.now()).expect("ready");
        assert!(q.is_processing(&"a"));
        for _ in 0..5 {
            q.add("a", Priority::Live, c.now());
        }
        assert_eq!(pop_key(&mut q, c.now()), None, "never two in flight");
        assert_eq!(q.in_flight_count(), 1);
        c.advance(MS);
        assert!(q.done(&"a", Outcome::Done, c.now()));
        let second = q.pop(c.now()).expect("dirty key redelivered");
        assert_eq!(second.key, "a");
        assert_ne!(second.id, first.id);
        assert_eq!(
            second.enqueued_at, first.enqueued_at,
            "dirty since the first add"
        );
        assert!(q.done(&"a", Outcome::Done, c.now()));
        assert_eq!(pop_key(&mut q, c.now()), None, "exactly one more pop");
        assert_eq!(q.in_flight_count(), 0);
    }

    #[test]
    fn requeue_after_never_fires_early() {
        let mut c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        q.pop(c.now());
        q.done(&"a", Outcome::RequeueAfter(100 * MS), c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + 100 * MS));
        c.advance(99 * MS);
        assert_eq!(pop_key(&mut q, c.now()), None);
        c.advance(MS);
        let handout = q.pop(c.now()).expect("due");
        assert!(handout.reasons.contains(Reason::RequeueAfter));
        assert_eq!(handout.attempt, 1);
        assert_eq!(q.next_ready_at(), None);
    }

    #[test]
    fn event_before_requeue_after_makes_key_ready_now() {
        let mut c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        q.pop(c.now());
        q.done(
            &"a",
            Outcome::RequeueAfter(Duration::from_secs(60)),
            c.now(),
        );
        c.advance(MS);
        q.add("a", Priority::Live, c.now());
        assert_eq!(
            q.next_ready_at(),
            None,
            "timer dropped once the key is ready"
        );
        let handout = q.pop(c.now()).expect("ready now");
        assert!(handout.reasons.contains(Reason::Updated));
        q.done(&"a", Outcome::Done, c.now());
        c.advance(Duration::from_secs(120));
        assert_eq!(pop_key(&mut q, c.now()), None, "no leftover timer");
    }

    #[test]
    fn add_after_keeps_the_earlier_time() {
        let mut c = Clock::new();
        let mut q = queue();
        q.add_after("a", 50 * MS, c.now());
        q.add_after("a", 80 * MS, c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + 50 * MS));
        q.add_after("a", 20 * MS, c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + 20 * MS));
        assert_eq!(q.waiting_len(), 1);
        c.advance(19 * MS);
        assert_eq!(pop_key(&mut q, c.now()), None);
        c.advance(MS);
        let handout = q.pop(c.now()).expect("due");
        assert!(handout.reasons.contains(Reason::Scheduled));
        assert_eq!(handout.enqueued_at, c.now());
    }

    #[test]
    fn add_after_on_ready_key_is_a_no_op() {
        let c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        q.add_after("a", 10 * MS, c.now());
        assert_eq!(q.next_ready_at(), None);
        assert_eq!(pop_key(&mut q, c.now()), Some("a"));
    }

    #[test]
    fn backoff_doubles_caps_and_resets_on_success() {
        let mut c = Clock::new();
        let backoff = Backoff {
            base: 5 * MS,
            max: 100 * MS,
        };
        let mut q = WorkQueue::new(backoff);
        q.add("a", Priority::Live, c.now());
        let expected = [5, 10, 20, 40, 80, 100, 100];
        for (i, want) in expected.iter().enumerate() {
            let handout = q.pop(c.now()).expect("ready");
            assert_eq!(handout.attempt, i as u32 + 1);
            q.done(&"a", Outcome::Error { retry_after: None }, c.now());
            let due = q.next_ready_at().expect("backoff timer");
            assert_eq!(due - c.now(), *want * MS, "attempt {}", i + 1);
            c.advance(due - c.now() - MS);
            assert_eq!(pop_key(&mut q, c.now()), None, "not before backoff");
            c.advance(MS);
        }
        assert_eq!(q.retries_total(), expected.len() as u64);
        let handout = q.pop(c.now()).expect("ready");
        assert!(handout.reasons.contains(Reason::Backoff));
        q.done(&"a", Outcome::Done, c.now());
        assert_eq!(q.failures(&"a"), 0);
        q.add("a", Priority::Live, c.now());
        let handout = q.pop(c.now()).expect("ready");
        assert_eq!(handout.attempt, 1, "attempts reset by success");
        q.done(&"a", Outcome::Error { retry_after: None }, c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + 5 * MS), "backoff reset");
    }

    #[test]
    fn default_backoff_matches_contract() {
        let b = Backoff::default();
        assert_eq!(b.delay(0), 5 * MS);
        assert_eq!(b.delay(1), 10 * MS);
        assert_eq!(b.delay(2), 20 * MS);
        assert_eq!(b.delay(30), Duration::from_secs(1000));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1000));
    }

    #[test]
    fn retry_after_wins_when_larger_than_backoff() {
        let c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        q.pop(c.now());
        let retry_after = Some(Duration::from_secs(3));
        q.done(&"a", Outcome::Error { retry_after }, c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + Duration::from_secs(3)));
        // Smaller than the backoff: the backoff wins.
        let mut q = WorkQueue::new(Backoff {
            base: Duration::from_secs(10),
            max: Duration::from_secs(100),
        });
        q.add("a", Priority::Live, c.now());
        q.pop(c.now());
        q.done(&"a", Outcome::Error { retry_after }, c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + Duration::from_secs(10)));
    }

    #[test]
    fn event_during_backoff_makes_key_ready_but_keeps_failure_count() {
        let mut c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        q.pop(c.now());
        q.done(&"a", Outcome::Error { retry_after: None }, c.now());
        c.advance(MS);
        q.add("a", Priority::Live, c.now());
        let handout = q.pop(c.now()).expect("ready now");
        assert_eq!(handout.attempt, 2);
        q.done(&"a", Outcome::Error { retry_after: None }, c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + 10 * MS));
    }

    #[test]
    fn terminal_is_not_retried_by_timers_but_revived_by_add() {
        let mut c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        q.pop(c.now());
        q.add_after("a", 10 * MS, c.now()); // a pending timer must not revive it either
        q.done(&"a", Outcome::Terminal, c.now());
        assert!(q.is_terminal(&"a"));
        assert_eq!(q.next_ready_at(), None);
        q.add_after("a", 10 * MS, c.now());
        c.advance(Duration::from_secs(10_000));
        assert_eq!(pop_key(&mut q, c.now()), None);
        q.add("a", Priority::Live, c.now());
        assert!(!q.is_terminal(&"a"));
        let handout = q.pop(c.now()).expect("revived");
        assert_eq!(handout.attempt, 1);
    }

    #[test]
    fn terminal_with_dirty_mark_is_redelivered() {
        let c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        q.pop(c.now());
        q.add("a", Priority::Live, c.now());
        q.done(&"a", Outcome::Terminal, c.now());
        assert!(!q.is_terminal(&"a"));
        assert_eq!(pop_key(&mut q, c.now()), Some("a"));
    }

    #[test]
    fn dirty_overrides_timers_but_error_still_counts() {
        let c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        q.pop(c.now());
        q.add("a", Priority::Background, c.now());
        q.done(&"a", Outcome::Error { retry_after: None }, c.now());
        assert_eq!(q.next_ready_at(), None);
        let handout = q.pop(c.now()).expect("dirty key ready now");
        assert_eq!(
            handout.priority,
            Priority::Background,
            "lane of the dirtying add"
        );
        assert_eq!(handout.attempt, 2);
        assert_eq!(q.failures(&"a"), 1);
    }

    #[test]
    fn lost_requeues_immediately_without_backoff() {
        let c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Background, c.now());
        let first = q.pop(c.now()).expect("ready");
        assert!(q.done(&"a", Outcome::Lost, c.now()));
        let second = q.pop(c.now()).expect("redelivered now");
        assert_eq!(second.attempt, first.attempt + 1);
        assert_eq!(second.priority, Priority::Background, "keeps its lane");
        assert!(second.reasons.contains(Reason::Redelivery));
        assert_eq!(q.failures(&"a"), 0, "lost is not a failure");
        q.done(&"a", Outcome::Error { retry_after: None }, c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + 5 * MS));
    }

    #[test]
    fn late_result_for_old_lease_is_ignored() {
        let c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        let old = q.pop(c.now()).expect("ready");
        // The deadline passes: dispatch reports the handout lost.
        assert!(q.done_handout(&"a", old.id, Outcome::Lost, c.now()));
        let new = q.pop(c.now()).expect("redelivered");
        assert_eq!(q.current_handout(&"a"), Some(new.id));
        // The slow worker answers after all: discarded, the new handout is untouched.
        assert!(!q.done_handout(&"a", old.id, Outcome::Done, c.now()));
        assert!(q.is_processing(&"a"));
        assert!(q.done_handout(&"a", new.id, Outcome::Done, c.now()));
        assert!(!q.done(&"a", Outcome::Done, c.now()), "nothing in flight");
    }

    #[test]
    fn live_goes_first() {
        let c = Clock::new();
        let mut q = queue();
        q.add("bg1", Priority::Background, c.now());
        q.add("bg2", Priority::Background, c.now());
        q.add("live", Priority::Live, c.now());
        assert_eq!(q.depth(Priority::Live), 1);
        assert_eq!(q.depth(Priority::Background), 2);
        assert_eq!(pop_key(&mut q, c.now()), Some("live"));
        assert_eq!(pop_key(&mut q, c.now()), Some("bg1"));
        assert_eq!(pop_key(&mut q, c.now()), Some("bg2"));
    }

    #[test]
    fn background_add_upgraded_by_live_add() {
        let c = Clock::new();
        let mut q = queue();
        q.add("x", Priority::Live, c.now());
        q.add("a", Priority::Background, c.now());
        q.add("a", Priority::Live, c.now());
        assert_eq!(q.depth(Priority::Background), 0);
        assert_eq!(pop_key(&mut q, c.now()), Some("x"));
        let handout = q.pop(c.now()).expect("ready");
        assert_eq!(handout.priority, Priority::Live);
    }

    #[test]
    fn background_is_not_starved_by_continuous_live_stream() {
        let c = Clock::new();
        let mut q: WorkQueue<String> = WorkQueue::new(Backoff::default()).with_live_burst(3);
        for i in 0..4 {
            q.add(format!("bg{i}"), Priority::Background, c.now());
        }
        let mut order = Vec::new();
        for i in 0..16 {
            // Two fresh live keys per pop: the live lane never runs dry.
            q.add(format!("live{}", 2 * i), Priority::Live, c.now());
            q.add(format!("live{}", 2 * i + 1), Priority::Live, c.now());
            let handout = q.pop(c.now()).expect("ready");
            order.push(handout.priority);
            q.done(&handout.key, Outcome::Done, c.now());
        }
        use Priority::{Background as B, Live as L};
        assert_eq!(
            order,
            [L, L, L, B, L, L, L, B, L, L, L, B, L, L, L, B],
            "exactly one background pop after every 3 live pops"
        );
    }

    #[test]
    fn live_streak_resets_when_background_empty() {
        let c = Clock::new();
        let mut q = queue().with_live_burst(2);
        q.add("l1", Priority::Live, c.now());
        q.add("l2", Priority::Live, c.now());
        q.add("l3", Priority::Live, c.now());
        assert_eq!(pop_key(&mut q, c.now()), Some("l1"));
        assert_eq!(pop_key(&mut q, c.now()), Some("l2"));
        // Background arrives now: it waits behind at most `live_burst` live pops from here.
        q.add("b", Priority::Background, c.now());
        q.add("l4", Priority::Live, c.now());
        assert_eq!(pop_key(&mut q, c.now()), Some("l3"));
        assert_eq!(pop_key(&mut q, c.now()), Some("l4"));
        q.add("l5", Priority::Live, c.now());
        assert_eq!(pop_key(&mut q, c.now()), Some("b"));
        assert_eq!(pop_key(&mut q, c.now()), Some("l5"));
    }

    #[test]
    fn next_ready_at_tracks_earliest_timer() {
        let mut c = Clock::new();
        let mut q = queue();
        assert_eq!(q.next_ready_at(), None);
        q.add_after("a", 30 * MS, c.now());
        q.add_after("b", 10 * MS, c.now());
        q.add_after("c", 20 * MS, c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + 10 * MS));
        let t0 = c.now();
        c.advance(15 * MS);
        assert_eq!(pop_key(&mut q, c.now()), Some("b"));
        assert_eq!(q.next_ready_at(), Some(t0 + 20 * MS));
        q.add("c", Priority::Live, c.now());
        assert_eq!(q.next_ready_at(), Some(t0 + 30 * MS));
        q.remove(&"a");
        assert_eq!(q.next_ready_at(), None);
    }

    #[test]
    fn timers_fire_in_deadline_order() {
        let mut c = Clock::new();
        let mut q = queue();
        q.add_after("late", 20 * MS, c.now());
        q.add_after("early", 10 * MS, c.now());
        c.advance(30 * MS);
        assert_eq!(pop_key(&mut q, c.now()), Some("early"));
        assert_eq!(pop_key(&mut q, c.now()), Some("late"));
    }

    #[test]
    fn add_after_during_processing_merges_with_outcome() {
        let mut c = Clock::new();
        let mut q = queue();
        q.add("a", Priority::Live, c.now());
        q.pop(c.now());
        q.add_after("a", 10 * MS, c.now());
        q.done(&"a", Outcome::RequeueAfter(50 * MS), c.now());
        assert_eq!(q.next_ready_at(), Some(c.now() + 10 * MS));
        c.advance(10 * MS);
        assert_eq!(pop_key(&mut q, c.now()), Some("a"));
        q.done(&"a", Outcome::Done, c.now());
        assert_eq!(q.next_ready_at(), None);
    }

    #[test]
    fn remove_forgets_everything_but_keeps_exclusivity() {
        let c = Clock::new();
        let mut q = queue();
        q.add("ready", Priority::Live, c.now());
        q.add_after("waiting", MS, c.now());
        q.remove(&"ready");
        q.remove(&"waiting");
        assert!(q.is_empty());
        assert_eq!(q.waiting_len(), 0);

        q.add("busy", Priority::Live, c.now());
        q.pop(c.now());
        q.remove(&"busy");
        assert!(q.is_processing(&"busy"));
        assert!(q.done(&"busy", Outcome::Error { retry_after: None }, c.now()));
        assert_eq!(q.next_ready_at(), None, "removed key is not retried");
        assert_eq!(q.failures(&"busy"), 0);

        q.add("busy", Priority::Live, c.now());
        q.pop(c.now());
        q.remove(&"busy");
        q.add("busy", Priority::Live, c.now()); // back in scope while in flight
        assert_eq!(pop_key(&mut q, c.now()), None, "still exclusive");
        q.done(&"busy", Outcome::Done, c.now());
        assert_eq!(pop_key(&mut q, c.now()), Some("busy"));
    }

    #[test]
    fn processing_metrics() {
        let mut c = Clock::new();
        let mut q = queue();
        assert_eq!(q.longest_running(c.now()), Duration::ZERO);
        q.add("a", Priority::Live, c.now());
        q.add("b", Priority::Live, c.now());
        q.pop(c.now());
        c.advance(10 * MS);
        q.pop(c.now());
        c.advance(5 * MS);
        assert_eq!(q.longest_running(c.now()), 15 * MS);
        assert_eq!(q.unfinished_work(c.now()), 20 * MS);
        assert_eq!(q.in_flight_count(), 2);
        assert_eq!(q.adds_total(), 2);
    }

    #[test]
    fn queue_duration_measured_from_enqueue() {
        let mut c = Clock::new();
        let mut q = queue();
        let t0 = c.now();
        q.add("a", Priority::Live, t0);
        c.advance(7 * MS);
        q.add("a", Priority::Live, c.now());
        let handout = q.pop(c.now()).expect("ready");
        assert_eq!(handout.enqueued_at, t0);
    }

    /// xorshift64*: enough randomness for operation mixes, reproducible from the seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u32) -> u32 {
            (self.next() % u64::from(n)) as u32
        }
    }

    #[test]
    fn random_operations_keep_invariants() {
        for seed in 1..=20u64 {
            run_random(seed, 5_000);
        }
    }

    /// What the random test expects of the queue, kept beside it.
    #[derive(Default)]
    struct Model {
        /// Handouts the test holds.
        held: HashMap<u8, Handout<u8>>,
        /// Keys owed a delivery since their last add.
        owed: HashSet<u8>,
        /// Held keys added again while held.
        dirtied: HashSet<u8>,
        /// The earliest instant a key may be delivered after a requeue-after or error (unless
        /// an event intervenes).
        not_before: HashMap<u8, Instant>,
        /// Held keys removed while held.
        forgotten: HashSet<u8>,
    }

    fn run_random(seed: u64, steps: usize) {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut c = Clock::new();
        let mut q: WorkQueue<u8> = WorkQueue::new(Backoff {
            base: MS,
            max: 64 * MS,
        })
        .with_live_burst(1 + rng.below(4));
        let mut m = Model::default();
        for _ in 0..steps {
            let key = rng.below(12) as u8;
            match rng.below(10) {
                0..=2 => m.add(&mut q, &mut rng, key, c.now()),
                3 => m.add_after(&mut q, &mut rng, key, c.now()),
                4..=5 => m.pop(&mut q, c.now()),
                6..=7 => m.finish(&mut q, &mut rng, key, c.now()),
                8 => c.advance(rng.below(10) * MS),
                _ => {
                    if rng.below(4) == 0 {
                        m.remove(&mut q, key);
                    }
                }
            }
            m.check(&q);
        }
        m.drain(&mut q, &mut c);
        assert!(
            m.owed.is_empty(),
            "seed {seed}: never delivered: {:?}",
            m.owed
        );
    }

    impl Model {
        fn add(&mut self, q: &mut WorkQueue<u8>, rng: &mut Rng, key: u8, now: Instant) {
            let p = if rng.below(2) == 0 {
                Priority::Live
            } else {
                Priority::Background
            };
            q.add(key, p, now);
            self.owed.insert(key);
            self.forgotten.remove(&key);
            self.not_before.remove(&key);
            if self.held.contains_key(&key) {
                self.dirtied.insert(key);
            }
        }

        fn add_after(&mut self, q: &mut WorkQueue<u8>, rng: &mut Rng, key: u8, now: Instant) {
            q.add_after(key, rng.below(20) * MS, now);
            self.not_before.remove(&key);
            if self.held.contains_key(&key) {
                self.dirtied.insert(key);
            }
        }

        fn pop(&mut self, q: &mut WorkQueue<u8>, now: Instant) {
            let Some(handout) = q.pop(now) else {
                return;
            };
            assert!(
                !self.held.contains_key(&handout.key),
                "double pop of {}",
                handout.key
            );
            if let Some(t) = self.not_before.remove(&handout.key) {
                assert!(now >= t, "delivered before requeue-after/backoff");
            }
            self.owed.remove(&handout.key);
            assert!(handout.attempt >= 1);
            self.held.insert(handout.key, handout);
        }

        /// Finish the held key nearest `key` with a random outcome.
        fn finish(&mut self, q: &mut WorkQueue<u8>, rng: &mut Rng, key: u8, now: Instant) {
            let Some(&k) = self.held.keys().min_by_key(|k| (**k).wrapping_sub(key)) else {
                return;
            };
            let handout = self.held.remove(&k).expect("held");
            let outcome = match rng.below(5) {
                0 => Outcome::Done,
                1 => Outcome::RequeueAfter(rng.below(30) * MS),
                2 => Outcome::Error {
                    retry_after: Some(rng.below(30) * MS),
                },
                3 => Outcome::Terminal,
                _ => Outcome::Lost,
            };
            let was_dirty = self.dirtied.remove(&k);
            let was_forgotten = self.forgotten.contains(&k);
            let applied = q.done_handout(&k, handout.id, outcome, now);
            assert!(applied || !q.is_processing(&k) || q.current_handout(&k) != Some(handout.id));
            if !was_dirty && !was_forgotten {
                match outcome {
                    Outcome::RequeueAfter(d) => {
                        self.not_before.insert(k, now + d);
                    }
                    Outcome::Error {
                        retry_after: Some(d),
                    } => {
                        self.not_before.insert(k, now + d);
                    }
                    _ => {}
                }
            }
            if outcome == Outcome::Lost && !self.forgotten.remove(&k) {
                self.owed.insert(k);
            }
        }

        fn remove(&mut self, q: &mut WorkQueue<u8>, key: u8) {
            q.remove(&key);
            self.owed.remove(&key);
            self.not_before.remove(&key);
            self.dirtied.remove(&key);
            if self.held.contains_key(&key) {
                self.forgotten.insert(key);
            }
        }

        fn check(&self, q: &WorkQueue<u8>) {
            q.check_invariants();
            assert_eq!(q.in_flight_count(), self.held.len());
            for k in self.held.keys() {
                assert!(q.is_processing(k));
            }
        }

        /// Liveness: finish everything and drain; every key owed a delivery must show up.
        fn drain(&mut self, q: &mut WorkQueue<u8>, c: &mut Clock) {
            for _ in 0..200 {
                for (k, handout) in self.held.drain() {
                    q.done_handout(&k, handout.id, Outcome::Done, c.now());
                }
                while let Some(handout) = q.pop(c.now()) {
                    self.owed.remove(&handout.key);
                    self.held.insert(handout.key, handout);
                }
                q.check_invariants();
                c.advance(16 * MS);
            }
        }
    }

    #[test]
    fn huge_delays_from_a_controller_neither_panic_nor_lose_the_key() {
        // A controller may send requeue_after / retry_after of i64::MAX seconds; adding that to
        // an Instant used to panic inside done_handout after the entry was removed.
        let c = Clock::new();
        let huge = Duration::from_secs(i64::MAX as u64);
        for outcome in [
            Outcome::RequeueAfter(huge),
            Outcome::Error {
                retry_after: Some(huge),
            },
        ] {
            let mut q = queue();
            q.add("a", Priority::Live, c.now());
            let handout = q.pop(c.now()).expect("ready");
            assert!(q.done_handout(&"a", handout.id, outcome, c.now()));
            q.check_invariants();
            assert_eq!(pop_key(&mut q, c.now()), None, "not due for a long time");
            // The key is still tracked: a change makes it ready again.
            q.add("a", Priority::Live, c.now());
            assert_eq!(pop_key(&mut q, c.now()), Some("a"), "{outcome:?}");
        }
        let mut q = queue();
        q.add_after("b", huge, c.now());
        q.check_invariants();
        assert_eq!(pop_key(&mut q, c.now()), None);
    }
}
