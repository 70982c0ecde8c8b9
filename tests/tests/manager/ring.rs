//! Ring mode from the outside: real `ctrlhub run --mode ring` members on devcluster, and raw
//! gRPC replicas that follow the documented redirect (`Rejected.owner_address`, the
//! `ctrlhub-owner-addr` trailer) and `Revoked(UNIT_MOVED).owner_address` by hand, as a client in
//! any language would. Who owns what is checked against the manager's own pure function.

use ctrlhub::members::hrw::{Member, Unit, owner};
use ctrlhub_proto::v1 as pb;
use ctrlhub_tests::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const NS: &str = "ring-test";

/// A member with fast leases (3 s lease, 2 s renew deadline, 500 ms retry).
async fn member(c: &Cluster, identity: &str) -> Manager {
    let mut args = vec!["--mode", "ring", "--handover-drain", "2s"];
    args.extend(FAST_LEASE);
    Manager::start(c, identity, &args).await
}

fn addr(m: &Manager) -> String {
    m.grpc.trim_start_matches("http://").to_string()
}

/// The owner of `name` (tenant `dev`) among the member identities `ids`, by the manager's
/// function.
fn owner_among(name: &str, ids: &[&str]) -> String {
    let ms: Vec<Member> = ids
        .iter()
        .map(|id| Member {
            identity: (*id).to_string(),
            weight: 100,
        })
        .collect();
    owner("ctrlhub", &Unit::new("dev", name), &ms)
        .map(|m| m.identity.clone())
        .unwrap_or_default()
}

/// The owner of `name` (tenant `dev`) among `members`.
fn expected_owner(name: &str, members: &[&Manager]) -> String {
    let ids: Vec<&str> = members.iter().map(|m| m.identity.as_str()).collect();
    owner_among(name, &ids)
}

/// A controller name starting with `prefix` that ring-a owns among ring-a and ring-b, and that
/// a joining ring-c takes.
fn moving_to_the_joiner(prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| {
            owner_among(n, &["ring-a", "ring-b"]) == "ring-a"
                && owner_among(n, &["ring-a", "ring-b", "ring-c"]) == "ring-c"
        })
        .expect("some name")
}

/// Waits until every member's /status shows the others live and its own view naming exactly
/// `members`, published.
async fn settled(members: &[&Manager]) {
    let want: Vec<String> = {
        let mut ids: Vec<String> = members
            .iter()
            .map(|m| format!("{}=100", m.identity))
            .collect();
        ids.sort();
        ids
    };
    let want = want.join(",");
    for m in members {
        wait_for(&format!("{} publishes view {want}", m.identity), || async {
            let Ok(s) = m.try_status().await else {
                return false;
            };
            s["ring"]["held"] == true && s["ring"]["view"] == want && s["ring"]["published"] == want
        })
        .await;
    }
}

/// One try to register `name` at `first`, following up to 3 redirects in a row as the
/// protocol says; the replica and the address that accepted it, or the last refusal.
async fn try_register(first: &str, name: &str) -> Result<(Replica, String), tonic::Status> {
    try_register_with(first, || register(name, replica::configmaps(), 8, Some(NS))).await
}

/// [`try_register`] with the Register `make` builds.
async fn try_register_with(
    first: &str,
    make: impl Fn() -> pb::Register,
) -> Result<(Replica, String), tonic::Status> {
    let mut target = first.to_string();
    for _ in 0..=3 {
        let reg = make();
        match Replica::connect(&format!("http://{target}"), reg).await {
            Ok(r) => return Ok((r, target)),
            Err(status) => {
                let next = status
                    .metadata()
                    .get("ctrlhub-owner-addr")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                match next {
                    Some(n) => {
                        assert_eq!(status.code(), tonic::Code::Unavailable);
                        target = n;
                    }
                    None => return Err(status),
                }
            }
        }
    }
    Err(tonic::Status::unavailable("3 redirects in a row"))
}

/// Registers `name` at `first`, following redirects, retrying there (with a pause) until it is
/// accepted within [`PATIENCE`]; the replica and the address that accepted it.
async fn register_following(first: &str, name: &str) -> (Replica, String) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match try_register(first, name).await {
            Ok(done) => return done,
            Err(status) => {
                assert!(
                    Instant::now() < deadline,
                    "{name} never registered: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Answers every request on `r` until one for `key` arrives, within `within`.
async fn reconciles(r: &mut Replica, key: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Some(req) = r.next(left).await else {
            return false;
        };
        r.done(&req.id).await;
        if crate_key(&req) == key {
            return true;
        }
    }
    false
}

fn crate_key(r: &pb::ReconcileRequest) -> String {
    key(r)
}

/// The units each member's /status lists as owned.
async fn owned(members: &[&Manager]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for m in members {
        let s = m.status().await;
        let units = s["ring"]["units"].as_array().cloned().unwrap_or_default();
        let names = units
            .iter()
            .filter(|u| u["state"] == "owned")
            .filter_map(|u| u["name"].as_str().map(str::to_string))
            .collect();
        out.insert(m.identity.clone(), names);
    }
    out
}

#[tokio::test]
async fn each_controller_has_one_owner_and_a_join_moves_only_the_joiners_share() {
    let c = start_cluster().await;
    namespace(&c.client, NS, &[]).await;
    put_configmap(&c.client, NS, "seed", &[("v", "1")]).await;
    let (m0, m1) = (member(&c, "ring-a").await, member(&c, "ring-b").await);
    settled(&[&m0, &m1]).await;

    // Every controller registers at a member chosen without knowing the ring: about half
    // are redirected once.
    let names: Vec<String> = (0..12).map(|i| format!("ring-c{i}")).collect();
    let mut replicas = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        let first = if i % 2 == 0 { addr(&m0) } else { addr(&m1) };
        let (mut r, at) = register_following(&first, name).await;
        let want = expected_owner(name, &[&m0, &m1]);
        let at_member = if at == addr(&m0) {
            &m0.identity
        } else {
            &m1.identity
        };
        assert_eq!(
            *at_member, want,
            "{name} registered at the member the function names"
        );
        assert_eq!(r.registered.member_identity, want);
        assert!(
            reconciles(&mut r, &format!("{NS}/seed"), PATIENCE).await,
            "{name} reconciles"
        );
        replicas.insert(name.clone(), r);
    }
    let redirects = m0
        .metric("ctrlhub_ring_redirects_total{tenant=\"dev\"}")
        .await
        + m1.metric("ctrlhub_ring_redirects_total{tenant=\"dev\"}")
            .await;
    assert!(
        redirects >= 1.0,
        "misrouted sessions were redirected ({redirects})"
    );
    let by_member = owned(&[&m0, &m1]).await;
    for name in &names {
        let want = expected_owner(name, &[&m0, &m1]);
        assert!(
            by_member[&want].contains(name),
            "{want} owns {name}: {by_member:?}"
        );
    }

    // A third member joins: exactly the units the function now gives it move, nothing else.
    let m2 = member(&c, "ring-c").await;
    let moving: BTreeSet<String> = names
        .iter()
        .filter(|n| expected_owner(n, &[&m0, &m1, &m2]) == m2.identity)
        .cloned()
        .collect();
    for name in &moving {
        let r = replicas.get_mut(name).expect("replica");
        let revoked = loop {
            match r.next_message(PATIENCE).await {
                Some(pb::manager_message::Message::Revoked(rv)) => break rv,
                Some(pb::manager_message::Message::Reconcile(req)) => r.done(&req.id).await,
                other => panic!("{name}: expected Revoked(UNIT_MOVED), got {other:?}"),
            }
        };
        assert_eq!(
            revoked.reason,
            pb::revoked::Reason::UnitMoved as i32,
            "{revoked:?}"
        );
        assert_eq!(
            revoked.owner_address,
            addr(&m2),
            "names the new owner's address"
        );
        assert_eq!(revoked.leader_identity, m2.identity);
        let (r2, at) = register_following(&revoked.owner_address, name).await;
        assert_eq!(at, addr(&m2), "{name} registers at the new owner directly");
        replicas.insert(name.clone(), r2);
    }
    settled(&[&m0, &m1, &m2]).await;
    // Every replica, moved or not, reconciles a new object: nothing was left unowned, and the
    // ones that did not move were never revoked (a Revoked would end their stream here).
    put_configmap(&c.client, NS, "after-join", &[("v", "1")]).await;
    for (name, r) in replicas.iter_mut() {
        assert!(
            reconciles(r, &format!("{NS}/after-join"), PATIENCE).await,
            "{name} (moved: {}) reconciles after the join",
            moving.contains(name)
        );
    }
    let by_member = owned(&[&m0, &m1, &m2]).await;
    assert_eq!(
        by_member[&m2.identity], moving,
        "the joiner owns exactly its share"
    );
    let moved_out = m0
        .metric("ctrlhub_ring_unit_moves_total{direction=\"out\"}")
        .await
        + m1.metric("ctrlhub_ring_unit_moves_total{direction=\"out\"}")
            .await;
    assert_eq!(moved_out as usize, moving.len(), "0 collateral moves");
}

#[tokio::test]
async fn a_member_that_leaves_or_crashes_hands_its_controllers_over() {
    let c = start_cluster().await;
    namespace(&c.client, NS, &[]).await;
    let mut m0 = member(&c, "ring-a").await;
    let mut m1 = member(&c, "ring-b").await;
    let m2 = member(&c, "ring-c").await;
    settled(&[&m0, &m1, &m2]).await;
    let names: Vec<String> = (0..9).map(|i| format!("ring-d{i}")).collect();
    let mut replicas = BTreeMap::new();
    for name in &names {
        let (r, _) = register_following(&addr(&m2), name).await;
        replicas.insert(name.clone(), r);
    }

    // SIGTERM: every controller of the leaver is told where to go, and only those.
    let leaving: BTreeSet<String> = names
        .iter()
        .filter(|n| expected_owner(n, &[&m0, &m1, &m2]) == m0.identity)
        .cloned()
        .collect();
    m0.signal("TERM");
    for name in &leaving {
        let r = replicas.get_mut(name).expect("replica");
        let revoked = loop {
            match r.next_message(PATIENCE).await {
                Some(pb::manager_message::Message::Revoked(rv)) => break rv,
                Some(pb::manager_message::Message::Reconcile(req)) => r.done(&req.id).await,
                other => panic!("{name}: expected Revoked, got {other:?}"),
            }
        };
        assert_eq!(
            revoked.reason,
            pb::revoked::Reason::UnitMoved as i32,
            "{revoked:?}"
        );
        let want = expected_owner(name, &[&m1, &m2]);
        let want_addr = if want == m1.identity {
            addr(&m1)
        } else {
            addr(&m2)
        };
        assert_eq!(
            revoked.owner_address, want_addr,
            "{name} is sent to its next owner"
        );
        let (r2, _) = register_following(&revoked.owner_address, name).await;
        replicas.insert(name.clone(), r2);
    }
    assert!(m0.exited(PATIENCE).await, "the leaving member exits");
    settled(&[&m1, &m2]).await;
    put_configmap(&c.client, NS, "after-leave", &[("v", "1")]).await;
    for (name, r) in replicas.iter_mut() {
        assert!(
            reconciles(r, &format!("{NS}/after-leave"), PATIENCE).await,
            "{name} after the leave"
        );
    }

    // SIGKILL: its sessions die with it; they find the survivor, which dispatches once the
    // dead member's Lease has expired.
    let crashed: BTreeSet<String> = names
        .iter()
        .filter(|n| expected_owner(n, &[&m1, &m2]) == m1.identity)
        .cloned()
        .collect();
    m1.kill().await;
    let killed = Instant::now();
    put_configmap(&c.client, NS, "after-crash", &[("v", "1")]).await;
    for name in &crashed {
        let (mut r, at) = register_following(&addr(&m2), name).await;
        assert_eq!(at, addr(&m2));
        assert!(
            reconciles(&mut r, &format!("{NS}/after-crash"), PATIENCE).await,
            "{name} after the crash"
        );
        println!(
            "{name}: first reconcile at the survivor {:?} after the kill",
            killed.elapsed()
        );
        replicas.insert(name.clone(), r);
    }
    for (name, r) in replicas.iter_mut().filter(|(n, _)| !crashed.contains(*n)) {
        assert!(
            reconciles(r, &format!("{NS}/after-crash"), PATIENCE).await,
            "{name} after the crash"
        );
    }
    let s = m2.status().await;
    let units = s["ring"]["units"].as_array().cloned().unwrap_or_default();
    assert_eq!(units.len(), names.len(), "the survivor owns all: {units:?}");
}

/// One reconcile as a replica saw it: which controller and key, which member, when it started
/// and ended, and the object's resourceVersion.
#[derive(Debug, Clone)]
struct Attempt {
    controller: String,
    key: String,
    member: String,
    rv: String,
    start: Instant,
    end: Instant,
}

/// A replica that registers through `members` (the addresses a Service would pick from),
/// follows redirects and moves by hand, works each request for `work`, and records it.
fn follower(
    name: String,
    members: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
    log: std::sync::Arc<parking_lot::Mutex<Vec<Attempt>>>,
    work: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut turn = 0usize;
        loop {
            // Each try at the next member, as a Service would pick one.
            let first = {
                let m = members.lock();
                m[turn % m.len()].clone()
            };
            turn += 1;
            let Ok((mut r, at)) = try_register(&first, &name).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            // Until Revoked (a move) or the stream's end: then register again.
            while let Some(pb::manager_message::Message::Reconcile(req)) =
                r.next_message(Duration::from_secs(3600)).await
            {
                let start = Instant::now();
                tokio::time::sleep(work).await;
                let rv = replica::object(&req)["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                r.done(&req.id).await;
                log.lock().push(Attempt {
                    controller: name.clone(),
                    key: key(&req),
                    member: at.clone(),
                    rv,
                    start,
                    end: Instant::now(),
                });
            }
        }
    })
}

/// No key of one controller was worked by two replicas at once.
fn overlaps(log: &[Attempt]) -> Vec<(Attempt, Attempt)> {
    let mut by: BTreeMap<(String, String), Vec<&Attempt>> = BTreeMap::new();
    for a in log {
        by.entry((a.controller.clone(), a.key.clone()))
            .or_default()
            .push(a);
    }
    let mut out = Vec::new();
    for attempts in by.values_mut() {
        attempts.sort_by_key(|a| a.start);
        for w in attempts.windows(2) {
            if w[1].start < w[0].end {
                out.push((w[0].clone(), w[1].clone()));
            }
        }
    }
    out
}

#[tokio::test]
async fn a_rolling_restart_of_every_member_loses_and_doubles_nothing() {
    let c = start_cluster().await;
    namespace(&c.client, NS, &[]).await;
    for i in 0..5 {
        put_configmap(&c.client, NS, &format!("cm-{i}"), &[("v", "0")]).await;
    }
    let ids = ["ring-a", "ring-b", "ring-c"];
    let mut members = Vec::new();
    for id in ids {
        members.push(member(&c, id).await);
    }
    settled(&members.iter().collect::<Vec<_>>()).await;
    let addrs = std::sync::Arc::new(parking_lot::Mutex::new(
        members.iter().map(addr).collect::<Vec<_>>(),
    ));
    let log = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let names: Vec<String> = (0..6).map(|i| format!("ring-r{i}")).collect();
    let mut tasks = Vec::new();
    for name in &names {
        // Two replicas each: one worker pool per controller, whichever member serves it.
        for _ in 0..2 {
            tasks.push(follower(
                name.clone(),
                addrs.clone(),
                log.clone(),
                Duration::from_millis(30),
            ));
        }
    }
    // Steady updates while every member restarts, one at a time, under the same identity.
    let writer = {
        let client = c.client.clone();
        tokio::spawn(async move {
            for n in 1.. {
                for i in 0..5 {
                    put_configmap(&client, NS, &format!("cm-{i}"), &[("v", &n.to_string())]).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    for i in 0..members.len() {
        members[i].signal("TERM");
        assert!(members[i].exited(PATIENCE).await, "{} exits", ids[i]);
        members[i] = member(&c, ids[i]).await;
        addrs.lock()[i] = addr(&members[i]);
        settled(&members.iter().collect::<Vec<_>>()).await;
    }
    writer.abort();
    // The last version of every object reaches every controller.
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(c.client.clone(), NS);
    let mut last = BTreeMap::new();
    for i in 0..5 {
        let cm = api.get(&format!("cm-{i}")).await.expect("configmap");
        last.insert(
            format!("{NS}/cm-{i}"),
            cm.metadata.resource_version.unwrap_or_default(),
        );
    }
    wait_for(
        "every controller reconciles the last version of every object",
        || {
            let log = log.clone();
            let (names, last) = (names.clone(), last.clone());
            async move {
                let log = log.lock();
                names.iter().all(|n| {
                    last.iter().all(|(k, rv)| {
                        log.iter()
                            .any(|a| a.controller == *n && a.key == *k && a.rv == *rv)
                    })
                })
            }
        },
    )
    .await;
    for t in tasks {
        t.abort();
    }
    let log = log.lock().clone();
    let doubled = overlaps(&log);
    assert!(
        doubled.is_empty(),
        "keys worked by two replicas at once: {doubled:#?}"
    );
    let by_member: BTreeSet<&str> = log.iter().map(|a| a.member.as_str()).collect();
    println!(
        "{} reconciles over {} member addresses, 0 overlapping",
        log.len(),
        by_member.len()
    );
    for m in &members {
        let units = m.status().await["ring"]["units"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for u in units {
            let name = u["name"].as_str().unwrap_or_default();
            assert_eq!(
                expected_owner(name, &members.iter().collect::<Vec<_>>()),
                m.identity,
                "{name} is back at its owner"
            );
        }
    }
}

/// A controller name whose owner among `members` is `want`.
fn name_owned_by(prefix: &str, want: &Manager, members: &[&Manager]) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| expected_owner(n, members) == want.identity)
        .expect("some name")
}

#[tokio::test]
async fn a_partitioned_member_stops_by_its_renew_deadline_before_the_successor_starts() {
    let c = start_cluster().await;
    namespace(&c.client, NS, &[]).await;
    put_configmap(&c.client, NS, "seed", &[("v", "1")]).await;
    let (a, b) = (member(&c, "ring-a").await, member(&c, "ring-b").await);
    settled(&[&a, &b]).await;
    let name = name_owned_by("ring-p", &a, &[&a, &b]);
    let (mut r, at) = register_following(&addr(&b), &name).await;
    assert_eq!(at, addr(&a));
    assert!(reconciles(&mut r, &format!("{NS}/seed"), PATIENCE).await);

    // a cannot renew: it must end its sessions by its renew deadline (2 s), and b may start
    // only once a's Lease has gone unrenewed for the lease duration (3 s).
    c.dc.faults()
        .freeze_lease("default", "ctrlhub-member-ring-a");
    let frozen = Instant::now();
    let end = loop {
        match r.next_message(PATIENCE).await {
            Some(pb::manager_message::Message::Reconcile(req)) => r.done(&req.id).await,
            other => break other,
        }
    };
    let stopped = Instant::now();
    assert!(
        matches!(&end, Some(pb::manager_message::Message::Revoked(rv)) if rv.reason == pb::revoked::Reason::UnitMoved as i32),
        "a ends its session with UNIT_MOVED: {end:?}"
    );
    let (mut r2, at) = register_following(&addr(&b), &name).await;
    assert_eq!(at, addr(&b), "b takes the controller in");
    let first = r2
        .next(PATIENCE)
        .await
        .expect("b dispatches once a's Lease expired");
    let started = Instant::now();
    r2.done(&first.id).await;
    println!(
        "frozen → a stopped {:?}, → b's first dispatch {:?}",
        stopped - frozen,
        started - frozen
    );
    assert!(stopped < started, "a stopped before b started");
    // b may start only once a's Lease (3 s) has run out after a's last renewal, which was at
    // most a retry period (500 ms) before the freeze: never on seeing a late (2 s) alone.
    assert!(
        started - frozen >= Duration::from_millis(2500),
        "b started {:?} after the freeze, before a's Lease could have expired",
        started - frozen
    );

    // Healed, a rejoins and takes back exactly what the function gives it.
    c.dc.faults()
        .unfreeze_lease("default", "ctrlhub-member-ring-a");
    settled(&[&a, &b]).await;
    let back = loop {
        match r2.next_message(PATIENCE).await {
            Some(pb::manager_message::Message::Reconcile(req)) => r2.done(&req.id).await,
            other => break other,
        }
    };
    match back {
        Some(pb::manager_message::Message::Revoked(rv)) => {
            assert_eq!(rv.reason, pb::revoked::Reason::UnitMoved as i32);
            assert_eq!(rv.owner_address, addr(&a), "sent back to a");
        }
        other => panic!("expected the controller to move back to a: {other:?}"),
    }
}

#[tokio::test]
async fn moved_controllers_are_admitted_over_tenant_limits_and_new_ones_are_not() {
    let c = start_cluster().await;
    namespace(&c.client, NS, &[]).await;
    let limit = ["--max-controllers-per-tenant", "2"];
    let start = |id: &'static str| {
        let c = &c;
        async move {
            let mut args = vec!["--mode", "ring", "--handover-drain", "1s"];
            args.extend(FAST_LEASE);
            args.extend(limit);
            Manager::start(c, id, &args).await
        }
    };
    let (mut a, b) = (start("ring-a").await, start("ring-b").await);
    settled(&[&a, &b]).await;
    // Two controllers on each member: each at its limit.
    let mut names = Vec::new();
    for (m, prefix) in [(&a, "ring-qa"), (&b, "ring-qb")] {
        let mut i = 0;
        while names
            .iter()
            .filter(|n: &&String| n.starts_with(prefix))
            .count()
            < 2
        {
            let n = format!("{prefix}{i}");
            i += 1;
            if expected_owner(&n, &[&a, &b]) == m.identity {
                names.push(n);
            }
        }
    }
    let mut replicas = BTreeMap::new();
    for n in &names {
        let (r, _) = register_following(&addr(&b), n).await;
        replicas.insert(n.clone(), r);
    }
    // a leaves: its two controllers move to b, which already holds two.
    a.signal("TERM");
    for n in names.iter().filter(|n| n.starts_with("ring-qa")) {
        let r = replicas.get_mut(n).expect("replica");
        loop {
            match r.next_message(PATIENCE).await {
                Some(pb::manager_message::Message::Revoked(rv)) => {
                    assert_eq!(rv.owner_address, addr(&b));
                    break;
                }
                Some(pb::manager_message::Message::Reconcile(req)) => r.done(&req.id).await,
                other => panic!("{n}: expected a move, got {other:?}"),
            }
        }
        let (r2, at) = register_following(&addr(&b), n).await;
        assert_eq!(at, addr(&b), "{n} admitted at b over the limit of 2");
        replicas.insert(n.clone(), r2);
    }
    assert!(a.exited(PATIENCE).await);
    let exempt = b
        .metric("ctrlhub_admission_exempt_moves_total{tenant=\"dev\"}")
        .await;
    assert!(exempt >= 2.0, "the overshoot is counted: {exempt}");
    // A new controller is still refused: limits govern new ones.
    let refused = Replica::connect(
        &b.grpc,
        register("ring-qnew", replica::configmaps(), 1, Some(NS)),
    )
    .await;
    match refused {
        Err(s) => assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}"),
        Ok(_) => panic!("a new controller over the limit was admitted"),
    }
}

/// An EVENTS-mode registration of `name` on ConfigMaps in the test namespace.
fn events(name: &str) -> pb::Register {
    pb::Register {
        mode: pb::register::Mode::Events as i32,
        max_concurrent_reconciles: 0,
        ..register(name, replica::configmaps(), 8, Some(NS))
    }
}

/// The next event on `r` for `key`, acknowledging every event before it.
async fn event_for(r: &mut Replica, key: &str) -> Option<pb::Event> {
    let deadline = Instant::now() + PATIENCE;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let e = r.next_event(left).await?;
        r.ack(&e.id).await;
        let k = e
            .key
            .as_ref()
            .map(|k| format!("{}/{}", k.namespace, k.name));
        if k.as_deref() == Some(key) {
            return Some(e);
        }
    }
    None
}

#[tokio::test]
async fn an_events_mode_controller_survives_a_move() {
    let c = start_cluster().await;
    namespace(&c.client, NS, &[]).await;
    put_configmap(&c.client, NS, "seed", &[("v", "1")]).await;
    let (a, b) = (member(&c, "ring-a").await, member(&c, "ring-b").await);
    settled(&[&a, &b]).await;
    // A name that ring-a owns now and the joiner ring-c will own.
    let name = moving_to_the_joiner("ring-e");
    let (mut r, at) = try_register_with(&addr(&b), || events(&name))
        .await
        .expect("registers at a through a redirect");
    assert_eq!(at, addr(&a));
    let first = event_for(&mut r, &format!("{NS}/seed"))
        .await
        .expect("seed at a");
    assert_eq!(first.r#type, pb::event::Type::Sync as i32, "{first:?}");

    let m3 = member(&c, "ring-c").await;
    let moved = loop {
        match r.next_message(PATIENCE).await {
            Some(pb::manager_message::Message::Event(e)) => r.ack(&e.id).await,
            other => break other,
        }
    };
    let Some(pb::manager_message::Message::Revoked(rv)) = moved else {
        panic!("expected the EVENTS controller to move: {moved:?}");
    };
    assert_eq!(rv.reason, pb::revoked::Reason::UnitMoved as i32);
    assert_eq!(rv.owner_address, addr(&m3));
    let (mut r2, at) = try_register_with(&rv.owner_address, || events(&name))
        .await
        .expect("registers at the new owner");
    assert_eq!(at, addr(&m3));
    // The new owner starts from the current state, then live events follow.
    let again = event_for(&mut r2, &format!("{NS}/seed"))
        .await
        .expect("seed again at c");
    assert_eq!(again.r#type, pb::event::Type::Sync as i32, "{again:?}");
    put_configmap(&c.client, NS, "after-move", &[("v", "1")]).await;
    let live = event_for(&mut r2, &format!("{NS}/after-move"))
        .await
        .expect("a live event at c");
    assert_eq!(live.r#type, pb::event::Type::Added as i32, "{live:?}");
}

#[tokio::test]
async fn a_client_that_ignores_redirects_still_registers_through_the_service() {
    let c = start_cluster().await;
    namespace(&c.client, NS, &[]).await;
    let members = [
        member(&c, "ring-a").await,
        member(&c, "ring-b").await,
        member(&c, "ring-c").await,
    ];
    settled(&members.iter().collect::<Vec<_>>()).await;
    // An older client: on UNAVAILABLE it only retries, and the Service picks another member
    // each time (here, in turn). It gets there within as many tries as there are members.
    for name in ["ring-o0", "ring-o1", "ring-o2", "ring-o3"] {
        let mut tries = 0;
        let at = loop {
            let target = &members[tries % members.len()];
            tries += 1;
            let reg = register(name, replica::configmaps(), 1, Some(NS));
            match Replica::connect(&target.grpc, reg).await {
                Ok(_) => break target.identity.clone(),
                Err(s) => {
                    assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
                    assert!(tries < 3 * members.len(), "{name} never registered");
                }
            }
        };
        assert_eq!(
            at,
            expected_owner(name, &members.iter().collect::<Vec<_>>())
        );
    }
}

#[tokio::test]
async fn a_member_shutting_down_takes_the_results_of_attempts_already_out() {
    let c = start_cluster().await;
    namespace(&c.client, NS, &[]).await;
    put_configmap(&c.client, NS, "slow", &[("v", "1")]).await;
    let (a, b) = (member(&c, "ring-a").await, member(&c, "ring-b").await);
    settled(&[&a, &b]).await;
    let name = name_owned_by("ring-s", &a, &[&a, &b]);
    let (mut r, _) = register_following(&addr(&a), &name).await;
    let req = r.next(PATIENCE).await.expect("a request at a");
    // SIGTERM while the attempt is out, and answer after more than the handover drain (2 s):
    // a member shutting down gives attempts the shutdown grace (15 s), as leader mode does.
    a.signal("TERM");
    let termed = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    r.done(&req.id).await;
    let end = loop {
        match r.next_message(PATIENCE).await {
            Some(pb::manager_message::Message::Reconcile(more)) => r.done(&more.id).await,
            other => break other,
        }
    };
    assert!(
        termed.elapsed() >= Duration::from_secs(3),
        "the session stayed for the result"
    );
    let Some(pb::manager_message::Message::Revoked(rv)) = end else {
        panic!("expected UNIT_MOVED after the result: {end:?}");
    };
    assert_eq!(rv.reason, pb::revoked::Reason::UnitMoved as i32);
    assert_eq!(rv.owner_address, addr(&b));
}

#[tokio::test]
async fn a_joining_member_waits_for_the_old_owners_release() {
    let c = start_cluster().await;
    namespace(&c.client, NS, &[]).await;
    put_configmap(&c.client, NS, "held", &[("v", "1")]).await;
    let (a, b) = (member(&c, "ring-a").await, member(&c, "ring-b").await);
    settled(&[&a, &b]).await;
    let name = moving_to_the_joiner("ring-j");
    let (mut old, _) = register_following(&addr(&a), &name).await;
    let held = old.next(PATIENCE).await.expect("the attempt at a");
    // c joins while a's attempt is out; a second replica goes straight to c, which owns the
    // controller now, and must get nothing until a has released it.
    let m3 = member(&c, "ring-c").await;
    let (mut new, at) = register_following(&addr(&m3), &name).await;
    assert_eq!(at, addr(&m3));
    let early = new.next(Duration::from_millis(1500)).await;
    assert!(
        early.is_none(),
        "c dispatched while a's attempt was still out: {early:?}"
    );
    old.done(&held.id).await;
    let answered = Instant::now();
    let first = new
        .next(PATIENCE)
        .await
        .expect("c dispatches once a released");
    assert_eq!(key(&first), format!("{NS}/held"));
    println!(
        "c's first dispatch {:?} after a's last result",
        answered.elapsed()
    );
}
