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

/// The owner of `name` (tenant `dev`) among `members`, by the manager's function.
fn expected_owner(name: &str, members: &[&Manager]) -> String {
    let ms: Vec<Member> = members
        .iter()
        .map(|m| Member {
            identity: m.identity.clone(),
            weight: 100,
        })
        .collect();
    owner("ctrlhub", &Unit::new("dev", name), &ms)
        .map(|m| m.identity.clone())
        .unwrap_or_default()
}

/// Waits until every member's /status shows the others live and its own view naming exactly
/// `members`, published.
async fn settled(members: &[&Manager]) {
    let want: Vec<String> = {
        let mut ids: Vec<String> = members.iter().map(|m| format!("{}=100", m.identity)).collect();
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

/// Registers `name` starting at `first`, following redirects as the protocol says (at most 3
/// in a row); returns the replica and the address that accepted it.
async fn register_following(first: &str, name: &str) -> (Replica, String) {
    let mut target = first.to_string();
    let deadline = Instant::now() + PATIENCE;
    let mut hops = 0;
    loop {
        let reg = register(name, replica::configmaps(), 8, Some(NS));
        match Replica::connect(&format!("http://{target}"), reg).await {
            Ok(r) => return (r, target),
            Err(status) => {
                let next = status
                    .metadata()
                    .get("ctrlhub-owner-addr")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                assert!(Instant::now() < deadline, "{name} never registered: {status:?}");
                match next {
                    Some(n) if hops < 3 => {
                        assert_eq!(status.code(), tonic::Code::Unavailable);
                        hops += 1;
                        target = n;
                    }
                    _ => {
                        // Not ready or bounced too often: back to the first address, with a pause.
                        hops = 0;
                        target = first.to_string();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
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
        let at_member = if at == addr(&m0) { &m0.identity } else { &m1.identity };
        assert_eq!(*at_member, want, "{name} registered at the member the function names");
        assert_eq!(r.registered.member_identity, want);
        assert!(reconciles(&mut r, &format!("{NS}/seed"), PATIENCE).await, "{name} reconciles");
        replicas.insert(name.clone(), r);
    }
    let redirects = m0.metric("ctrlhub_ring_redirects_total{tenant=\"dev\"}").await
        + m1.metric("ctrlhub_ring_redirects_total{tenant=\"dev\"}").await;
    assert!(redirects >= 1.0, "misrouted sessions were redirected ({redirects})");
    let by_member = owned(&[&m0, &m1]).await;
    for name in &names {
        let want = expected_owner(name, &[&m0, &m1]);
        assert!(by_member[&want].contains(name), "{want} owns {name}: {by_member:?}");
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
        assert_eq!(revoked.reason, pb::revoked::Reason::UnitMoved as i32, "{revoked:?}");
        assert_eq!(revoked.owner_address, addr(&m2), "names the new owner's address");
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
    assert_eq!(by_member[&m2.identity], moving, "the joiner owns exactly its share");
    let moved_out = m0.metric("ctrlhub_ring_unit_moves_total{direction=\"out\"}").await
        + m1.metric("ctrlhub_ring_unit_moves_total{direction=\"out\"}").await;
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
        assert_eq!(revoked.reason, pb::revoked::Reason::UnitMoved as i32, "{revoked:?}");
        let want = expected_owner(name, &[&m1, &m2]);
        let want_addr = if want == m1.identity { addr(&m1) } else { addr(&m2) };
        assert_eq!(revoked.owner_address, want_addr, "{name} is sent to its next owner");
        let (r2, _) = register_following(&revoked.owner_address, name).await;
        replicas.insert(name.clone(), r2);
    }
    assert!(m0.exited(PATIENCE).await, "the leaving member exits");
    settled(&[&m1, &m2]).await;
    put_configmap(&c.client, NS, "after-leave", &[("v", "1")]).await;
    for (name, r) in replicas.iter_mut() {
        assert!(reconciles(r, &format!("{NS}/after-leave"), PATIENCE).await, "{name} after the leave");
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
        assert!(reconciles(&mut r, &format!("{NS}/after-crash"), PATIENCE).await, "{name} after the crash");
        println!("{name}: first reconcile at the survivor {:?} after the kill", killed.elapsed());
        replicas.insert(name.clone(), r);
    }
    for (name, r) in replicas.iter_mut().filter(|(n, _)| !crashed.contains(*n)) {
        assert!(reconciles(r, &format!("{NS}/after-crash"), PATIENCE).await, "{name} after the crash");
    }
    let s = m2.status().await;
    let units = s["ring"]["units"].as_array().cloned().unwrap_or_default();
    assert_eq!(units.len(), names.len(), "the survivor owns all: {units:?}");
}
