use super::*;
use crate::dispatch::queue::{Backoff, Outcome};
use crate::dispatch::seats::Weights;
use crate::registration::{Mode, NamespaceScope, ResourceRef};
use std::time::Duration;

fn registration(max_concurrent: u32) -> Registration {
    Registration {
        name: "t".into(),
        mode: Mode::Reconcile,
        primary: ResourceRef {
            group: "".into(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        },
        owns: vec![],
        watches: vec![],
        namespaces: NamespaceScope::All,
        label_selector: None,
        predicate: None,
        max_concurrent,
        deadline: Duration::from_secs(30),
        resync: None,
        backoff: Backoff::default(),
        include_object: false,
    }
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

fn recv_all(rx: &mut mpsc::UnboundedReceiver<Outbound>) -> Vec<Request> {
    let mut out = Vec::new();
    while let Ok(m) = rx.try_recv() {
        if let Outbound::Reconcile(r) = m {
            out.push(r);
        }
    }
    out
}

#[test]
fn keys_spread_over_sessions_and_never_twice_in_flight() {
    let c = controller(10);
    let (tx1, mut rx1) = mpsc::unbounded_channel();
    let (tx2, mut rx2) = mpsc::unbounded_channel();
    c.add_session(1, 2, tx1);
    c.add_session(2, 2, tx2);
    c.enqueue((0..6).map(|i| ObjectKey::new("ns", format!("k{i}"))), false);
    c.enqueue([ObjectKey::new("ns", "k0")], false);
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
    let (tx1, mut rx1) = mpsc::unbounded_channel();
    c.add_session(1, 5, tx1);
    c.enqueue([ObjectKey::new("ns", "a")], false);
    c.dispatch_once(true);
    let first = recv_all(&mut rx1);
    assert_eq!(first.len(), 1);
    c.remove_session(1);
    let (tx2, mut rx2) = mpsc::unbounded_channel();
    c.add_session(2, 5, tx2);
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
    let (tx1, mut rx1) = mpsc::unbounded_channel();
    c.add_session(1, 5, tx1);
    c.enqueue([ObjectKey::new("ns", "a")], false);
    c.dispatch_once(false);
    assert!(recv_all(&mut rx1).is_empty());
    c.dispatch_once(true);
    assert_eq!(recv_all(&mut rx1).len(), 1);
}

#[test]
fn a_key_requeued_after_a_delay_is_dispatched_once_due() {
    let c = controller(10);
    let (tx, mut rx) = mpsc::unbounded_channel();
    c.add_session(1, 5, tx);
    c.enqueue([ObjectKey::new("ns", "later")], false);
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
    let (tx1, mut rx1) = mpsc::unbounded_channel();
    let (tx2, mut rx2) = mpsc::unbounded_channel();
    c.add_session(1, 10, tx1);
    c.add_session(2, 10, tx2);
    c.enqueue(
        (0..10).map(|i| ObjectKey::new("ns", format!("k{i}"))),
        false,
    );
    c.dispatch_once(true);
    assert_eq!(recv_all(&mut rx1).len() + recv_all(&mut rx2).len(), 3);
}

#[test]
fn another_tenants_backlog_does_not_hold_the_next_free_seat() {
    let seats = SeatPool::new(2, Weights::default());
    let tenant = |t: &str| {
        Controller::with_seat_pool(
            ControllerId {
                tenant: t.into(),
                name: "c".into(),
            },
            registration(100),
            Arc::new(Metrics::new()),
            &seats,
        )
    };
    let (a, b) = (tenant("tenant-a"), tenant("tenant-b"));
    let (txa, mut rxa) = mpsc::unbounded_channel();
    let (txb, mut rxb) = mpsc::unbounded_channel();
    a.add_session(1, 50, txa);
    b.add_session(2, 50, txb);
    a.enqueue(
        (0..100).map(|i| ObjectKey::new("ns", format!("k{i}"))),
        false,
    );
    a.dispatch_once(true);
    let first = recv_all(&mut rxa);
    assert_eq!(first.len(), 2, "A takes every free seat, and no more");
    b.enqueue([ObjectKey::new("ns", "live")], false);
    b.dispatch_once(true);
    assert!(recv_all(&mut rxb).is_empty(), "no seat is free yet");
    // A's backlog waits too, but the seat A frees goes to B, whose tag is behind.
    a.dispatch_once(true);
    assert_eq!(
        a.complete(1, &first[0].id, Outcome::Done, ""),
        Completion::Accepted
    );
    a.dispatch_once(true);
    assert!(
        recv_all(&mut rxa).is_empty(),
        "A took the seat B was waiting for"
    );
    b.dispatch_once(true);
    let got = recv_all(&mut rxb);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key.name, "live");
    // B's result frees its seat, and A's backlog goes on.
    assert_eq!(
        b.complete(2, &got[0].id, Outcome::Done, ""),
        Completion::Accepted
    );
    a.dispatch_once(true);
    assert_eq!(recv_all(&mut rxa).len(), 1);
    assert_eq!(seats.in_use(), 2);
}
