//! The per-controller queue of EVENTS-mode registrations: every change of a key is delivered in
//! order, one at a time per key (the next only after the previous is acknowledged), and
//! re-delivered when its worker is lost. Different keys proceed independently.
//!
//! What waits is bounded by keys, not by changes: every change is kept until a key has
//! [`PENDING_PER_KEY`] events waiting behind its in-flight one; past that, a change that follows
//! a pending ADDED / MODIFIED / SYNC of the same key is compacted into it (the proto allows it:
//! "several MODIFIED into the latest"; `sequence` then skips values). A consumer that keeps up
//! sees every change; one that never acknowledges holds at most its in-flight event and
//! [`PENDING_PER_KEY`] pending states per key, not every update ever made. Objects are kept as
//! their JSON bytes, and [`EventQueue::bytes`] counts them for the tenant's queued-bytes limit.

use crate::informer::ObjectKey;
use crate::informer::object::CachedObject;
use std::collections::{HashMap, HashSet, VecDeque};

/// Events one key may have waiting behind its in-flight one before later changes are compacted.
pub(crate) const PENDING_PER_KEY: usize = 16;

/// What happened to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    /// Created while watched.
    Added,
    /// Changed.
    Modified,
    /// Deleted (the object is its last state).
    Deleted,
    /// Present when the subscription (re)started: it may have changed while nobody watched.
    Sync,
}

/// One change waiting for delivery.
#[derive(Debug, Clone)]
pub(crate) struct PendingEvent {
    /// Increases with every event of this queue, so per-key order is visible to the receiver.
    pub sequence: u64,
    /// The change.
    pub kind: EventType,
    /// The object after the change (last state for deletes), as JSON.
    pub object: CachedObject,
}

/// A delivery handed to a worker.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    /// The key.
    pub key: ObjectKey,
    /// The event at the head of the key's queue.
    pub event: PendingEvent,
    /// 1-based delivery attempt of this event.
    pub attempt: u32,
}

/// Ordered per-key event delivery with acknowledgements.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    per_key: HashMap<ObjectKey, VecDeque<PendingEvent>>,
    ready: VecDeque<ObjectKey>,
    in_flight: HashSet<ObjectKey>,
    attempts: HashMap<ObjectKey, u32>,
    next_sequence: u64,
    /// Bytes of every object held (in flight and pending).
    bytes: usize,
}

impl EventQueue {
    /// Append a change of `key`, or compact it into the key's pending change. Returns the bytes
    /// held now minus before (negative when a larger pending state was replaced).
    pub(crate) fn push(&mut self, key: ObjectKey, kind: EventType, object: CachedObject) -> isize {
        self.next_sequence += 1;
        let before = self.bytes;
        let in_flight = self.in_flight.contains(&key);
        let queue = self.per_key.entry(key.clone()).or_default();
        // The head of a key with an event in flight is that event: it must be re-delivered as
        // it was sent, so only a pending tail behind it is compacted, and only once the key has
        // a full set of pending events.
        let pending = queue.len() - usize::from(in_flight);
        let compacted = match queue.back_mut() {
            Some(tail) if pending >= PENDING_PER_KEY => {
                compact(tail, kind, &object, self.next_sequence)
            }
            _ => None,
        };
        match compacted {
            Some(replaced) => {
                self.bytes = self.bytes + object.json().len() - replaced;
            }
            None => {
                self.bytes += object.json().len();
                queue.push_back(PendingEvent {
                    sequence: self.next_sequence,
                    kind,
                    object,
                });
                if queue.len() == 1 && !in_flight {
                    self.ready.push_back(key);
                }
            }
        }
        self.bytes as isize - before as isize
    }

    /// Bytes of the objects this queue holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The next deliverable event: the head of a key with nothing in flight.
    pub(crate) fn pop(&mut self) -> Option<Delivery> {
        while let Some(key) = self.ready.pop_front() {
            let Some(event) = self.per_key.get(&key).and_then(|q| q.front()).cloned() else {
                continue;
            };
            self.in_flight.insert(key.clone());
            let attempt = self.attempts.entry(key.clone()).or_insert(0);
            *attempt += 1;
            return Some(Delivery {
                key,
                event,
                attempt: *attempt,
            });
        }
        None
    }

    /// The in-flight event of `key` was acknowledged: drop it and make the next one deliverable.
    pub(crate) fn ack(&mut self, key: &ObjectKey) {
        if !self.in_flight.remove(key) {
            return;
        }
        self.attempts.remove(key);
        let more = match self.per_key.get_mut(key) {
            Some(q) => {
                if let Some(done) = q.pop_front() {
                    self.bytes -= done.object.json().len();
                }
                !q.is_empty()
            }
            None => false,
        };
        if more {
            self.ready.push_back(key.clone());
        } else {
            self.per_key.remove(key);
        }
    }

    /// The worker of `key`'s in-flight event is gone (or missed its deadline): deliver it again
    /// before anything else.
    pub(crate) fn lost(&mut self, key: &ObjectKey) {
        if self.in_flight.remove(key) {
            self.ready.push_front(key.clone());
        }
    }

    /// Events waiting (not in flight).
    pub(crate) fn len(&self) -> usize {
        self.per_key.values().map(VecDeque::len).sum::<usize>() - self.in_flight.len()
    }

    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Fold a new change of a key into its pending `tail` when the later state says everything
/// the earlier one did: a MODIFIED into a pending ADDED, MODIFIED or SYNC (which keeps its
/// kind: "created, and now like this"), a SYNC into a pending MODIFIED or SYNC. A DELETED, and
/// anything after one, is kept apart. Returns the replaced object's size when folded.
fn compact(
    tail: &mut PendingEvent,
    kind: EventType,
    object: &CachedObject,
    sequence: u64,
) -> Option<usize> {
    use EventType::*;
    let kind = match (tail.kind, kind) {
        (Added | Modified | Sync, Modified) => tail.kind,
        (Modified | Sync, Sync) => Sync,
        _ => return None,
    };
    let replaced = tail.object.json().len();
    *tail = PendingEvent {
        sequence,
        kind,
        object: object.clone(),
    };
    Some(replaced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn k(n: &str) -> ObjectKey {
        ObjectKey::new("ns", n)
    }

    fn o(v: serde_json::Value) -> CachedObject {
        CachedObject::from_value(&v)
    }

    #[test]
    fn one_key_in_order_one_at_a_time() {
        let mut q = EventQueue::default();
        q.push(k("a"), EventType::Added, o(json!({"v": 1})));
        let first = q.pop().expect("first");
        q.push(k("a"), EventType::Modified, o(json!({"v": 2})));
        q.push(k("a"), EventType::Deleted, o(json!({"v": 2})));
        assert_eq!(first.event.kind, EventType::Added);
        assert!(
            q.pop().is_none(),
            "the next event of a key waits for the ack"
        );
        q.ack(&k("a"));
        let second = q.pop().expect("second");
        assert_eq!(second.event.kind, EventType::Modified);
        assert!(second.event.sequence > first.event.sequence);
        q.ack(&k("a"));
        assert_eq!(q.pop().expect("third").event.kind, EventType::Deleted);
        q.ack(&k("a"));
        assert!(q.pop().is_none());
        assert!(q.is_empty());
    }

    #[test]
    fn lost_events_are_redelivered_first_with_a_higher_attempt() {
        let mut q = EventQueue::default();
        q.push(k("a"), EventType::Added, o(json!({})));
        q.push(k("b"), EventType::Added, o(json!({})));
        let a = q.pop().expect("a");
        assert_eq!(a.key, k("a"));
        q.lost(&k("a"));
        let again = q.pop().expect("a again");
        assert_eq!(again.key, k("a"));
        assert_eq!(again.attempt, 2);
        assert_eq!(again.event.sequence, a.event.sequence);
        assert_eq!(
            q.pop().expect("b").key,
            k("b"),
            "other keys are independent"
        );
    }

    #[test]
    fn a_consumer_that_never_acks_holds_a_bounded_number_of_states_per_key() {
        let mut q = EventQueue::default();
        let big = |v: usize| o(json!({"v": v, "pad": "x".repeat(1000)}));
        q.push(k("a"), EventType::Added, big(0));
        let first = q.pop().expect("in flight, never acked");
        for v in 1..=600 {
            q.push(k("a"), EventType::Modified, big(v));
        }
        assert_eq!(
            q.len(),
            PENDING_PER_KEY,
            "600 updates wait as {PENDING_PER_KEY}"
        );
        assert!(
            q.bytes() < (PENDING_PER_KEY + 1) * 1100,
            "{} bytes held",
            q.bytes()
        );
        q.lost(&k("a"));
        let again = q.pop().expect("the in-flight event again");
        assert_eq!(
            again.event.sequence, first.event.sequence,
            "not compacted away"
        );
        let mut last = 0;
        q.ack(&k("a"));
        while let Some(d) = q.pop() {
            assert_eq!(d.event.kind, EventType::Modified);
            last = d.event.object.value()["v"].as_u64().unwrap_or_default();
            q.ack(&k("a"));
        }
        assert_eq!(last, 600, "the last state is never lost");
        assert_eq!(q.bytes(), 0, "everything acked, nothing held");
    }

    #[test]
    fn a_consumer_that_keeps_up_sees_every_change() {
        let mut q = EventQueue::default();
        q.push(k("a"), EventType::Added, o(json!({"v": 0})));
        let head = q.pop().expect("in flight");
        for v in 1..=3 {
            q.push(k("a"), EventType::Modified, o(json!({"v": v})));
        }
        q.ack(&head.key);
        let seen: Vec<u64> = std::iter::from_fn(|| {
            let d = q.pop()?;
            q.ack(&d.key);
            d.event.object.value()["v"].as_u64()
        })
        .collect();
        assert_eq!(seen, [1, 2, 3]);
    }

    #[test]
    fn compaction_folds_states_and_never_a_deletion() {
        use EventType::*;
        let pending = |kind| PendingEvent {
            sequence: 1,
            kind,
            object: o(json!({"v": 1})),
        };
        let folds = |tail, new| {
            let mut t = pending(tail);
            compact(&mut t, new, &o(json!({"v": 2})), 2).map(|_| t.kind)
        };
        assert_eq!(
            folds(Added, Modified),
            Some(Added),
            "created, and now like this"
        );
        assert_eq!(folds(Modified, Modified), Some(Modified));
        assert_eq!(folds(Sync, Modified), Some(Sync));
        assert_eq!(folds(Modified, Sync), Some(Sync));
        assert_eq!(folds(Deleted, Modified), None);
        assert_eq!(
            folds(Modified, Deleted),
            None,
            "a deletion is always delivered"
        );
        assert_eq!(folds(Added, Sync), None);
    }

    #[test]
    fn stale_acks_change_nothing() {
        let mut q = EventQueue::default();
        q.push(k("a"), EventType::Added, o(json!({})));
        q.ack(&k("a"));
        assert_eq!(q.pop().expect("still there").event.kind, EventType::Added);
    }
}
