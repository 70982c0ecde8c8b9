//! Leader election against devcluster: kube-lease-manager contenders and client-go-style
//! optimistic-concurrency races on one Lease.

use std::time::Duration;

use ctrlhub_tests::{PATIENCE, start_cluster, within};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use kube_lease_manager::LeaseManagerBuilder;

const LEASE: &str = "ctrlhub-leader";

/// Polls both contenders' beliefs for a bounded number of rounds, asserting they never both
/// hold the lease and that the server's holder agrees with any believer.
async fn observe_rounds(
    leases: &Api<Lease>,
    a: &tokio::sync::watch::Receiver<bool>,
    b: &tokio::sync::watch::Receiver<bool>,
    rounds: usize,
) -> (bool, bool) {
    let mut last = (false, false);
    for round in 0..rounds {
        let (ha, hb) = (*a.borrow(), *b.borrow());
        assert!(
            !(ha && hb),
            "round {round}: both contenders believe they hold the lease"
        );
        let holder = leases
            .get(LEASE)
            .await
            .expect("get lease")
            .spec
            .and_then(|s| s.holder_identity);
        // Re-read beliefs after the server read: a belief held across the whole read must
        // match the server's holder.
        if ha && *a.borrow() {
            assert_eq!(holder.as_deref(), Some("contender-a"), "round {round}");
        }
        if hb && *b.borrow() {
            assert_eq!(holder.as_deref(), Some("contender-b"), "round {round}");
        }
        last = (ha, hb);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

#[tokio::test]
async fn lease_contenders_never_both_hold() {
    let tc = start_cluster().await;
    let leases: Api<Lease> = tc.api("default");

    let manager = |id: &str| {
        LeaseManagerBuilder::new(tc.client.clone(), LEASE)
            .with_namespace("default")
            .with_identity(id)
            .with_duration(10)
            // Renew 4s before expiry: enough slack for a loaded 2-core CI machine.
            .with_grace(4)
            .build()
    };

    // Contender A starts first and must become the leader.
    let a = manager("contender-a").await.expect("build manager a");
    let (mut rx_a, task_a) = a.watch().await;
    within(
        "contender a to acquire",
        PATIENCE,
        rx_a.wait_for(|held| *held),
    )
    .await
    .expect("a's manager task ended");

    // Contender B joins; over several lease renewals it must never take over.
    let b = manager("contender-b").await.expect("build manager b");
    let (mut rx_b, task_b) = b.watch().await;
    let (ha, hb) = observe_rounds(&leases, &rx_a, &rx_b, 80).await;
    assert!(
        ha && !hb,
        "a keeps the lease while it renews (a={ha}, b={hb})"
    );

    // A releases (dropping its receiver makes its manager release and exit).
    drop(rx_a);
    within("contender a to release", PATIENCE, task_a)
        .await
        .expect("a's task panicked")
        .expect("a's release failed");
    let released = leases.get(LEASE).await.expect("get lease");
    assert_ne!(
        released.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("contender-a"),
        "a released the lease"
    );

    // Leadership moves to B.
    within(
        "contender b to acquire",
        PATIENCE,
        rx_b.wait_for(|held| *held),
    )
    .await
    .expect("b's manager task ended");
    let (_, never) = tokio::sync::watch::channel(false);
    let (_, hb) = observe_rounds(&leases, &never, &rx_b, 20).await;
    assert!(hb, "b holds the lease after a released it");
    let holder = leases
        .get(LEASE)
        .await
        .expect("get")
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("contender-b"));

    drop(rx_b);
    within("contender b to release", PATIENCE, task_b)
        .await
        .expect("b's task panicked")
        .expect("b's release failed");

    // client-go-style races: both contenders read the same free Lease, then both try to
    // claim it with a resourceVersion precondition. Exactly one may win every round.
    let lease = leases.get(LEASE).await.expect("get lease");
    let mut free = lease.clone();
    free.spec = Some(LeaseSpec {
        holder_identity: None,
        ..free.spec.unwrap_or_default()
    });
    leases
        .replace(LEASE, &PostParams::default(), &free)
        .await
        .expect("free the lease");
    for round in 0..10 {
        let seen_a = leases.get(LEASE).await.expect("a reads");
        let seen_b = leases.get(LEASE).await.expect("b reads");
        assert_eq!(
            seen_a.metadata.resource_version,
            seen_b.metadata.resource_version
        );
        let claim = |mut l: Lease, who: &str| {
            let spec = l.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some(who.to_string());
            spec.lease_duration_seconds = Some(15);
            spec.acquire_time = Some(MicroTime(jiff_now()));
            spec.renew_time = spec.acquire_time.clone();
            l
        };
        let (claim_a, claim_b) = (claim(seen_a, "race-a"), claim(seen_b, "race-b"));
        let pp = PostParams::default();
        let (ra, rb) = tokio::join!(
            leases.replace(LEASE, &pp, &claim_a),
            leases.replace(LEASE, &pp, &claim_b),
        );
        let winner = match (&ra, &rb) {
            (Ok(_), Err(kube::Error::Api(s))) if s.code == 409 => "race-a",
            (Err(kube::Error::Api(s)), Ok(_)) if s.code == 409 => "race-b",
            _ => panic!(
                "round {round}: exactly one claim must win, the other 409: a={ra:?} b={rb:?}"
            ),
        };
        let holder = leases
            .get(LEASE)
            .await
            .expect("get")
            .spec
            .and_then(|s| s.holder_identity);
        assert_eq!(holder.as_deref(), Some(winner), "round {round}");
        // The winner releases for the next round.
        let mut l = leases.get(LEASE).await.expect("get");
        if let Some(s) = l.spec.as_mut() {
            s.holder_identity = None;
        }
        leases
            .replace(LEASE, &PostParams::default(), &l)
            .await
            .expect("release");
    }

    // A frozen Lease refuses writes with 503 (devcluster fault). Raw HTTP is used because
    // kube-rs transparently retries 503s with backoff (for minutes).
    let faults = tc.dc.faults();
    faults.freeze_lease("default", LEASE);
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/default/leases/{LEASE}");
    let current = tc.raw.get(&path).await;
    assert_eq!(
        current.status, 200,
        "reads of a frozen lease still work: {}",
        current.body
    );
    let mut body = current.body.clone();
    body["spec"]["holderIdentity"] = serde_json::json!("sneaky");
    let put = tc.raw.put(&path, &body).await;
    assert_eq!(put.status, 503, "write to a frozen lease: {}", put.body);
    assert_eq!(put.body["kind"], "Status", "{}", put.body);
    let holder = leases
        .get(LEASE)
        .await
        .expect("get")
        .spec
        .and_then(|s| s.holder_identity);
    assert_ne!(
        holder.as_deref(),
        Some("sneaky"),
        "a refused write must not apply"
    );

    faults.unfreeze_lease("default", LEASE);
    let put = tc.raw.put(&path, &body).await;
    assert_eq!(put.status, 200, "write after unfreeze: {}", put.body);
    assert_eq!(put.body["spec"]["holderIdentity"], "sneaky");
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}
