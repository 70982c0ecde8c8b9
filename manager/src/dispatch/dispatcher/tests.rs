use super::*;
use crate::dispatch::queue::Outcome;
use crate::dispatch::seats::Weights;
use messages::OUTBOX_CAPACITY;
use std::time::Duration;

fn registration(max_concurrent: u32) -> Registration {
    Registration::config_maps("t", max_concurrent)
}

fn controller(max_concurrent: u32) -> Arc<Controller> {
    Controller::new(
        ControllerId {
            tenant: "t".into(),
            name: "c".into(),
        },
        registration(max_concurrent),
        Arc::new(Metrics::new()),
    )
}

fn recv_all(rx: &mut Outbox) -> Vec<Request> {
    let mut out = Vec::new();
    while let Some(m) = rx.work.try_next() {
        if let Outbound::Reconcile(r) = m {
            out.push(r);
        }
    }
    out
}

#[test]
fn keys_spread_over_sessions_and_never_twice_in_flight() {
    let c = controller(10);
    let mut rx1 = c.add_session(1, 2, false);
    let mut rx2 = c.add_session(2, 2, false);
    c.enqueue(
        (0..6).map(|i| ObjectKey::new("ns", format!("k{i}"))),
        Reason::Updated,
    );
    c.enqueue([ObjectKey::new("ns", "k0")], Reason::Updated);
    c.dispatch_once(true);
    let a = recv_all(&mut rx1);
    let b = recv_all(&mut rx2);
    assert_eq!(a.len(), 2, "credits bound each session");
    assert_eq!(b.len(), 2);
    let mut keys: Vec<_> = a
        .iter()
        .chain(b.iter())
        .map(|r| r.key.name.clone())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 4, "no key handed out twice");
}

#[test]
fn ended_session_requeues_its_keys_and_late_results_are_discarded() {
    let c = controller(10);
    let mut rx1 = c.add_session(1, 5, false);
    c.enqueue([ObjectKey::new("ns", "a")], Reason::Updated);
    c.dispatch_once(true);
    let first = recv_all(&mut rx1);
    assert_eq!(first.len(), 1);
    c.remove_session(1);
    let mut rx2 = c.add_session(2, 5, false);
    c.dispatch_once(true);
    let again = recv_all(&mut rx2);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
    assert_eq!(
        c.complete(1, &first[0].id, Outcome::Done, ""),
        Completion::Discarded
    );
    assert_eq!(
        c.complete(2, &again[0].id, Outcome::Done, ""),
        Completion::Accepted
    );
}

#[test]
fn standby_does_not_dispatch() {
    let c = controller(10);
    let mut rx1 = c.add_session(1, 5, false);
    c.enqueue([ObjectKey::new("ns", "a")], Reason::Updated);
    c.dispatch_once(false);
    assert!(recv_all(&mut rx1).is_empty());
    c.dispatch_once(true);
    assert_eq!(recv_all(&mut rx1).len(), 1);
}

#[test]
fn a_key_requeued_after_a_delay_is_dispatched_once_due() {
    let c = controller(10);
    let mut rx = c.add_session(1, 5, false);
    c.enqueue([ObjectKey::new("ns", "later")], Reason::Updated);
    c.dispatch_once(true);
    let first = recv_all(&mut rx);
    assert_eq!(first.len(), 1);
    let delay = Duration::from_millis(20);
    assert_eq!(
        c.complete(1, &first[0].id, Outcome::RequeueAfter(delay), ""),
        Completion::Accepted
    );
    c.dispatch_once(true);
    assert!(recv_all(&mut rx).is_empty(), "dispatched before it was due");
    // Only a due timer holds the key: nothing is in the ready lanes until pop fires it.
    std::thread::sleep(delay + Duration::from_millis(5));
    c.dispatch_once(true);
    let again = recv_all(&mut rx);
    assert_eq!(again.len(), 1, "a due requeue was never dispatched");
    assert_eq!(again[0].key.name, "later");
}

#[test]
fn max_concurrent_bounds_all_sessions() {
    let c = controller(3);
    let mut rx1 = c.add_session(1, 10, false);
    let mut rx2 = c.add_session(2, 10, false);
    c.enqueue(
        (0..10).map(|i| ObjectKey::new("ns", format!("k{i}"))),
        Reason::Updated,
    );
    c.dispatch_once(true);
    assert_eq!(recv_all(&mut rx1).len() + recv_all(&mut rx2).len(), 3);
}

#[test]
fn another_tenants_backlog_never_holds_the_seat_guaranteed_to_a_tenant_with_sessions() {
    let seats = SeatPool::new(2, Weights::default());
    let tenant = |t: &str| {
        Controller::with_seat_pool(
            ControllerId {
                tenant: t.into(),
                name: "c".into(),
            },
            t,
            registration(100),
            Scope::new(true, None),
            Arc::new(Metrics::new()),
            (&seats, crate::dispatch::usage::QueuedBytes::unlimited()),
        )
    };
    let tenant = |t: &str| {
        let c = tenant(t);
        c.mark_synced();
        c
    };
    let (a, b) = (tenant("tenant-a"), tenant("tenant-b"));
    let mut rxa = a.add_session(1, 50, false);
    let mut rxb = b.add_session(2, 50, false);
    a.enqueue(
        (0..100).map(|i| ObjectKey::new("ns", format!("k{i}"))),
        Reason::Updated,
    );
    a.dispatch_once(true);
    let first = recv_all(&mut rxa);
    assert_eq!(first.len(), 1, "A takes its own share; B's stays free");
    b.enqueue([ObjectKey::new("ns", "live")], Reason::Updated);
    b.dispatch_once(true);
    let got = recv_all(&mut rxb);
    assert_eq!(got.len(), 1, "B's live change goes out at once");
    assert_eq!(got[0].key.name, "live");
    assert_eq!(seats.in_use(), 2);
    // B idle again: its seat is still kept for it while it has sessions.
    assert_eq!(
        b.complete(2, &got[0].id, Outcome::Done, ""),
        Completion::Accepted
    );
    a.dispatch_once(true);
    assert!(recv_all(&mut rxa).is_empty(), "A borrowed B's seat");
    assert_eq!(
        a.complete(1, &first[0].id, Outcome::Done, ""),
        Completion::Accepted
    );
    a.dispatch_once(true);
    assert_eq!(
        recv_all(&mut rxa).len(),
        1,
        "A's backlog goes on in its share"
    );
}

#[test]
fn a_session_that_does_not_read_stops_receiving_at_its_outbox_bound() {
    let c = controller(0);
    let mut slow = c.add_session(1, 1000, false);
    c.enqueue(
        (0..200).map(|i| ObjectKey::new("ns", format!("k{i}"))),
        Reason::Updated,
    );
    c.dispatch_once(true);
    c.dispatch_once(true);
    assert_eq!(
        c.snapshot().1,
        OUTBOX_CAPACITY,
        "more was handed to a session than its outbox holds"
    );
    // A second replica that reads gets the rest of the backlog meanwhile.
    let mut reader = c.add_session(2, 1000, false);
    c.dispatch_once(true);
    assert_eq!(recv_all(&mut reader).len(), OUTBOX_CAPACITY);
    // The slow one reads one message: dispatch is woken and fills the room again.
    assert!(slow.work.try_next().is_some());
    c.dispatch_once(true);
    assert_eq!(
        recv_all(&mut slow).len(),
        OUTBOX_CAPACITY,
        "the slow session's outbox was not refilled"
    );
    assert_eq!(recv_all(&mut reader).len(), OUTBOX_CAPACITY);
}

#[test]
fn a_key_outside_the_registered_namespaces_is_never_queued_whatever_mapped_it() {
    let c = Controller::scoped(
        ControllerId {
            tenant: "t".into(),
            name: "c".into(),
        },
        registration(0),
        Scope::new(true, Some(vec!["team-a".to_string()])),
        Arc::new(Metrics::new()),
    );
    let mut rx = c.add_session(1, 10, false);
    // As a watches mapping by field path would produce them from a value naming another
    // tenant's namespace, or a cluster-scoped name for a namespaced primary.
    c.enqueue(
        [
            ObjectKey::new("team-b", "secret-thing"),
            ObjectKey::new("", "cluster-wide"),
            ObjectKey::new("team-a", "mine"),
        ],
        Reason::Updated,
    );
    c.dispatch_once(true);
    let got: Vec<String> = recv_all(&mut rx)
        .iter()
        .map(|r| r.key.to_string())
        .collect();
    assert_eq!(got, ["team-a/mine"]);
}

/// A controller of tenant "t" that asks for objects, with its tenant's queued-bytes total.
fn with_objects() -> (Arc<Controller>, Arc<std::sync::atomic::AtomicU64>) {
    let tenant = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut reg = registration(10);
    reg.include_object = true;
    let c = Controller::with_seat_pool(
        ControllerId {
            tenant: "t".into(),
            name: "c".into(),
        },
        "t",
        reg,
        Scope::new(true, None),
        Arc::new(Metrics::new()),
        (
            &SeatPool::unlimited(),
            crate::dispatch::usage::QueuedBytes::new(tenant.clone(), 1 << 20),
        ),
    );
    c.mark_synced();
    (c, tenant)
}

fn deleted(name: &str, pad: usize) -> CacheEvent {
    CacheEvent::Deleted {
        object: Arc::new(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns", "uid": "u1"},
            "data": {"pad": "x".repeat(pad)}})),
        final_state_unknown: false,
    }
}

#[test]
fn a_tombstone_lives_until_the_last_request_of_its_key_and_is_counted_meanwhile() {
    let (c, tenant) = with_objects();
    let mut rx = c.add_session(1, 10, false);
    let held = |t: &Arc<std::sync::atomic::AtomicU64>| t.load(Ordering::Relaxed);
    c.settle_tombstone(&deleted("a", 100));
    c.enqueue([ObjectKey::new("ns", "a")], Reason::Deleted);
    assert!(
        held(&tenant) > 100,
        "the tombstone is charged to its tenant"
    );
    c.dispatch_once(true);
    let first = recv_all(&mut rx);
    assert!(matches!(&first[0].payload, Payload::Tombstone(t) if !t.final_state_unknown));
    // An error re-queues the key: the retry still needs the tombstone.
    let error = Outcome::Error { retry_after: None };
    assert_eq!(
        c.complete(1, &first[0].id, error, "boom"),
        Completion::Accepted
    );
    assert!(held(&tenant) > 100);
    // The retry comes after the key's backoff (5 ms): wait for it, within a generous bound.
    let retry = (0..5_000)
        .find_map(|_| {
            c.dispatch_once(true);
            let got = recv_all(&mut rx);
            if got.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
                return None;
            }
            Some(got)
        })
        .expect("the key is retried after its backoff");
    assert!(matches!(&retry[0].payload, Payload::Tombstone(_)));
    assert_eq!(
        c.complete(1, &retry[0].id, Outcome::Done, ""),
        Completion::Accepted
    );
    assert_eq!(
        held(&tenant),
        0,
        "done: the tombstone and its bytes are gone"
    );
}

#[test]
fn a_key_without_an_object_or_a_seen_deletion_carries_nothing() {
    let (c, _) = with_objects();
    let mut rx = c.add_session(1, 10, false);
    // An owned child's event mapped to a primary the cache does not hold (not listed yet, or
    // never existed): NotFound, not a deletion.
    c.enqueue([ObjectKey::new("ns", "never")], Reason::OwnedChanged);
    c.dispatch_once(true);
    let got = recv_all(&mut rx);
    assert!(
        matches!(got[0].payload, Payload::None),
        "{:?}",
        got[0].payload
    );
}

#[test]
fn past_the_queued_bytes_a_tombstone_keeps_only_what_is_gone() {
    let (c, tenant) = with_objects();
    let mut rx = c.add_session(1, 10, false);
    c.settle_tombstone(&deleted("big", 2 << 20));
    c.enqueue([ObjectKey::new("ns", "big")], Reason::Deleted);
    assert!(tenant.load(Ordering::Relaxed) < 1024, "a stub, not 2 MiB");
    c.dispatch_once(true);
    let got = recv_all(&mut rx);
    let Payload::Tombstone(t) = &got[0].payload else {
        panic!("expected a tombstone, got {:?}", got[0].payload);
    };
    let last = t.last.value();
    assert_eq!(last["metadata"]["name"], "big");
    assert_eq!(last["metadata"]["uid"], "u1");
    assert_eq!(last["kind"], "ConfigMap");
    assert!(last.get("data").is_none());
}

/// Dispatch rounds until a request reaches `rx` (at most 5 s of 1 ms waits).
fn next_request(c: &Controller, rx: &mut Outbox) -> Option<Request> {
    (0..5_000).find_map(|_| {
        c.dispatch_once(true);
        let got = recv_all(rx).pop();
        if got.is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
        got
    })
}

fn short_deadline() -> Arc<Controller> {
    let mut reg = registration(10);
    reg.deadline = Duration::from_millis(20);
    Controller::new(
        ControllerId {
            tenant: "t".into(),
            name: "c".into(),
        },
        reg,
        Arc::new(Metrics::new()),
    )
}

#[test]
fn an_exclusive_attempt_past_its_deadline_keeps_its_key_until_it_confirms_the_end() {
    let c = short_deadline();
    let mut stuck = c.add_session(1, 1, true);
    c.enqueue([ObjectKey::new("ns", "k")], Reason::Updated);
    let first = next_request(&c, &mut stuck).expect("dispatched");
    let mut other = c.add_session(2, 1, true);
    // Far past the deadline, no replica gets the key while the attempt may still run there.
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..20 {
        c.dispatch_once(true);
    }
    assert!(recv_all(&mut other).is_empty() && recv_all(&mut stuck).is_empty());
    assert_eq!(c.counters.deadline_misses.load(Ordering::Relaxed), 1);
    // The handler finally ends: its result is discarded, and the key goes out again.
    assert_eq!(
        c.complete(1, &first.id, Outcome::Done, ""),
        Completion::Discarded
    );
    let again = next_request(&c, &mut other)
        .or_else(|| next_request(&c, &mut stuck))
        .expect("re-delivered after the confirmation");
    assert_eq!(again.key, first.key);
    assert_eq!(again.attempt, 2);
    assert!(again.reasons.contains(&Reason::Redelivery));
}

#[test]
fn an_exclusive_sessions_keys_move_only_once_the_hold_after_its_last_heartbeat_is_over() {
    let c = controller(10);
    c.set_hold(Duration::from_millis(300));
    let mut gone = c.add_session(1, 1, true);
    c.enqueue([ObjectKey::new("ns", "k")], Reason::Updated);
    let first = next_request(&c, &mut gone).expect("dispatched");
    let mut next = c.add_session(2, 1, true);
    c.heartbeat_answered(1);
    let ended = std::time::Instant::now();
    c.remove_session(1);
    assert!(c.fenced_until().is_some(), "the key is fenced");
    let again = next_request(&c, &mut next).expect("re-delivered once the hold is over");
    assert!(
        ended.elapsed() >= Duration::from_millis(300),
        "moved after {:?}, before the hold",
        ended.elapsed()
    );
    assert_eq!(again.key, first.key);
    assert!(again.reasons.contains(&Reason::Redelivery));
    assert!(c.fenced_until().is_none());
}

#[test]
fn an_ordinary_sessions_keys_move_at_once_and_its_deadline_misses_redeliver() {
    let c = short_deadline();
    let mut gone = c.add_session(1, 1, false);
    c.enqueue([ObjectKey::new("ns", "k")], Reason::Updated);
    next_request(&c, &mut gone).expect("dispatched");
    let mut next = c.add_session(2, 1, false);
    c.remove_session(1);
    c.dispatch_once(true);
    assert_eq!(recv_all(&mut next).len(), 1, "re-delivered at once");
}

#[test]
fn nothing_is_dispatched_before_every_informer_has_its_first_list() {
    let c = Controller::with_seat_pool(
        ControllerId {
            tenant: "t".into(),
            name: "c".into(),
        },
        "t",
        registration(10),
        Scope::new(true, None),
        Arc::new(Metrics::new()),
        (
            &SeatPool::unlimited(),
            crate::dispatch::usage::QueuedBytes::unlimited(),
        ),
    );
    let mut rx = c.add_session(1, 10, true);
    // A child's list arrived first and mapped to its owner; the primary's has not.
    c.enqueue([ObjectKey::new("ns", "owner")], Reason::OwnedChanged);
    c.dispatch_once(true);
    assert!(recv_all(&mut rx).is_empty(), "held until the caches know");
    // The primary's list brings the same key: one request for both.
    c.enqueue([ObjectKey::new("ns", "owner")], Reason::InitialList);
    c.mark_synced();
    c.dispatch_once(true);
    let got = recv_all(&mut rx);
    assert_eq!(got.len(), 1);
    assert!(got[0].reasons.contains(&Reason::InitialList));
    assert!(got[0].reasons.contains(&Reason::OwnedChanged));
}

/// A namespace left the selector scope while its key waited in the outbox: the outbox settles
/// it (done, its attempt over) and the edge never sees it.
#[test]
fn a_key_whose_namespace_left_the_scope_is_settled_before_it_leaves() {
    let selector = crate::registration::predicate::LabelSelector {
        match_labels: [("team".to_string(), "x".to_string())].into(),
        match_expressions: Vec::new(),
    };
    let scope = Scope::selecting(true, None, selector, None);
    let c = Controller::scoped(
        ControllerId {
            tenant: "t".into(),
            name: "c".into(),
        },
        registration(10),
        scope.clone(),
        Arc::new(Metrics::new()),
    );
    let labelled =
        |team: &str| serde_json::json!({"metadata": {"name": "a", "labels": {"team": team}}});
    scope.namespace_changed("a", Some(&labelled("x")));
    let mut rx = c.add_session(1, 10, false);
    c.enqueue([ObjectKey::new("a", "k")], Reason::Updated);
    c.dispatch_once(true);
    assert_eq!(c.live_attempts(), 1, "handed out while a was in the scope");

    scope.namespace_changed("a", Some(&labelled("y")));
    assert!(
        rx.work.try_next().is_none(),
        "withheld: never reaches the edge"
    );
    assert_eq!(
        c.live_attempts(),
        0,
        "and settled, not left to its deadline"
    );
    c.dispatch_once(true);
    assert!(
        recv_all(&mut rx).is_empty(),
        "settled as done: not handed out again"
    );
}
