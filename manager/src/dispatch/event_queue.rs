//! The per-controller queue of EVENTS-mode registrations: every change of a key is delivered in
//! order, one at a time per key (the next only after the previous is acknowledged), and
//! re-delivered when its worker is lost. Different keys proceed independently.

use crate::informer::ObjectKey;
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// What happened to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
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
pub struct PendingEvent {
    /// Increases with every event of this queue, so per-key order is visible to the receiver.
    pub sequence: u64,
    /// The change.
    pub kind: EventType,
    /// The object after the change (last state for deletes).
    pub object: Arc<Value>,
}

/// A delivery handed to a worker.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The key.
    pub key: ObjectKey,
    /// The event at the head of the key's queue.
    pub event: PendingEvent,
    /// 1-based delivery attempt of this event.
    pub attempt: u32,
}

/// Ordered per-key event delivery with acknowledgements.
#[derive(Debug, Default)]
pub struct EventQueue {
    per_key: HashMap<ObjectKey, VecDeque<PendingEvent>>,
    ready: VecDeque<ObjectKey>,
    in_flight: HashSet<ObjectKey>,
    attempts: HashMap<ObjectKey, u32>,
    next_sequence: u64,
}

impl EventQueue {
    /// Append a change of `key`.
    pub fn push(&mut self, key: ObjectKey, kind: EventType, object: Arc<Value>) {
        self.next_sequence += 1;
        let queue = self.per_key.entry(key.clone()).or_default();
        queue.push_back(PendingEvent {
            sequence: self.next_sequence,
            kind,
            object,
        });
        if queue.len() == 1 && !self.in_flight.contains(&key) {
            self.ready.push_back(key);
        }
    }

    /// The next deliverable event: the head of a key with nothing in flight.
    pub fn pop(&mut self) -> Option<Delivery> {
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
    pub fn ack(&mut self, key: &ObjectKey) {
        if !self.in_flight.remove(key) {
            return;
        }
        self.attempts.remove(key);
        let more = match self.per_key.get_mut(key) {
            Some(q) => {
                q.pop_front();
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
    pub fn lost(&mut self, key: &ObjectKey) {
        if self.in_flight.remove(key) {
            self.ready.push_front(key.clone());
        }
    }

    /// Events waiting (not in flight).
    pub fn len(&self) -> usize {
        self.per_key.values().map(VecDeque::len).sum::<usize>() - self.in_flight.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn k(n: &str) -> ObjectKey {
        ObjectKey::new("ns", n)
    }

    #[test]
    fn one_key_in_order_one_at_a_time() {
        let mut q = EventQueue::default();
        q.push(k("a"), EventType::Added, Arc::new(json!({"v": 1})));
        q.push(k("a"), EventType::Modified, Arc::new(json!({"v": 2})));
        q.push(k("a"), EventType::Deleted, Arc::new(json!({"v": 2})));
        let first = q.pop().expect("first");
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
        q.push(k("a"), EventType::Added, Arc::new(json!({})));
        q.push(k("b"), EventType::Added, Arc::new(json!({})));
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
    fn stale_acks_change_nothing() {
        let mut q = EventQueue::default();
        q.push(k("a"), EventType::Added, Arc::new(json!({})));
        q.ack(&k("a"));
        assert_eq!(q.pop().expect("still there").event.kind, EventType::Added);
    }
}
