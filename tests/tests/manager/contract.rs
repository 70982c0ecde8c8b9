//! One end-to-end test per guarantee of DESIGN.md's contract table, each against devcluster and
//! the real `ctrlhub` binary over real gRPC on loopback.

use ctrlhub_proto::v1 as pb;
use ctrlhub_tests::replica::configmaps;
use ctrlhub_tests::*;
use pb::reconcile_result::Outcome;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

async fn setup() -> (Cluster, Manager) {
    let c = start_cluster().await;
    let m = Manager::start(&c, "m1", &[]).await;
    m.wait_leading().await;
    (c, m)
}

/// Many events for one key while it is in flight collapse into one more request.
#[tokio::test]
async fn contract_level_triggered() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "lt", &[("v", "0")]).await;
    let mut r = Replica::connect(&m.grpc, register_configmaps("level", 1))
        .await
        .expect("registered");
    let first = r.expect().await;
    assert_eq!(key(&first), "default/lt");
    for i in 1..=5 {
        put_configmap(&c.client, "default", "lt", &[("v", &i.to_string())]).await;
    }
    // Wait until the manager's cache holds the last write, so the next request reflects it.
    let mut reader = r.client.clone();
    let session = r.session_id.clone();
    wait_for("manager cache sees v=5", || {
        let mut reader = reader.clone();
        let session = session.clone();
        async move {
            let mut req = tonic::Request::new(pb::GetRequest {
                session_id: session,
                resource: Some(pb::ResourceType {
                    group: String::new(),
                    version: "v1".into(),
                    kind: "ConfigMap".into(),
                    plural: String::new(),
                }),
                namespace: "default".into(),
                name: "lt".into(),
            });
            req.metadata_mut()
                .insert("authorization", "Bearer dev".parse().expect("header"));
            match reader.get(req).await {
                Ok(resp) => {
                    serde_json::from_slice::<serde_json::Value>(&resp.into_inner().object_json)
                        .is_ok_and(|o| o["data"]["v"] == "5")
                }
                Err(_) => false,
            }
        }
    })
    .await;
    let _ = &mut reader;
    r.done(&first.id).await;
    let second = r.expect().await;
    assert_eq!(key(&second), "default/lt");
    let object: serde_json::Value = match second.object {
        Some(pb::reconcile_request::Object::ObjectJson(ref j)) => {
            serde_json::from_slice(j).expect("object json")
        }
        ref other => panic!("expected the object, got {other:?}"),
    };
    assert_eq!(
        object["data"]["v"], "5",
        "the request carries the latest state, not an event"
    );
    r.done(&second.id).await;
    assert!(
        r.next(Duration::from_secs(2)).await.is_none(),
        "five updates during one reconcile must collapse into a single request"
    );
}

/// At most one in-flight request per key across all replicas.
#[tokio::test]
async fn contract_exclusive() {
    let (c, m) = setup().await;
    for i in 0..10 {
        put_configmap(&c.client, "default", &format!("ex-{i}"), &[("v", "0")]).await;
    }
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(
            Replica::connect(&m.grpc, register_configmaps("exclusive", 4))
                .await
                .expect("registered"),
        );
    }
    let writer = {
        let client = c.client.clone();
        tokio::spawn(async move {
            for round in 1..=5 {
                for i in 0..10 {
                    put_configmap(
                        &client,
                        "default",
                        &format!("ex-{i}"),
                        &[("v", &round.to_string())],
                    )
                    .await;
                }
            }
        })
    };
    // Every replica holds its requests a little before answering, so overlaps would be visible.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, String, bool)>();
    let mut tasks = Vec::new();
    for (n, mut r) in replicas.into_iter().enumerate() {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(req) = r.next(Duration::from_secs(3)).await {
                let _ = tx.send((n, key(&req), true));
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = tx.send((n, key(&req), false));
                r.done(&req.id).await;
            }
        }));
    }
    drop(tx);
    writer.await.expect("writer");
    let mut in_flight: HashSet<String> = HashSet::new();
    let mut by_replica: HashMap<usize, usize> = HashMap::new();
    while let Some((n, k, start)) = rx.recv().await {
        if start {
            assert!(
                in_flight.insert(k.clone()),
                "key {k} was handed to a second worker while in flight"
            );
            *by_replica.entry(n).or_default() += 1;
        } else {
            in_flight.remove(&k);
        }
    }
    for t in tasks {
        t.await.expect("replica task");
    }
    assert_eq!(
        by_replica.len(),
        3,
        "keys are spread over all three replicas: {by_replica:?}"
    );
}

/// A key whose worker disconnects is handed out again.
#[tokio::test]
async fn contract_at_least_once() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "alo", &[("v", "0")]).await;
    let mut a = Replica::connect(&m.grpc, register_configmaps("atleast", 1))
        .await
        .expect("registered");
    let mut b = Replica::connect(&m.grpc, register_configmaps("atleast", 1))
        .await
        .expect("registered");
    let (holder, mut other) = tokio::select! {
        r = a.next(PATIENCE) => (a, r, b),
        r = b.next(PATIENCE) => (b, r, a),
    }
    .pipe();
    let first = holder.1;
    assert_eq!(key(&first), "default/alo");
    assert_eq!(first.attempt, 1);
    // The worker vanishes without answering.
    drop(holder.0);
    let again = other.expect().await;
    assert_eq!(key(&again), "default/alo");
    assert_eq!(again.attempt, 2);
    assert!(
        again
            .reasons
            .contains(&(pb::reconcile_request::Reason::Redelivery as i32)),
        "reasons: {:?}",
        again.reasons
    );
    other.done(&again.id).await;
}

trait Pipe {
    fn pipe(self) -> ((Replica, pb::ReconcileRequest), Replica);
}

impl Pipe for (Replica, Option<pb::ReconcileRequest>, Replica) {
    fn pipe(self) -> ((Replica, pb::ReconcileRequest), Replica) {
        let (holder, req, other) = self;
        ((holder, req.expect("a request")), other)
    }
}

/// requeue_after re-delivers no earlier than asked.
#[tokio::test]
async fn contract_requeue_after() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "ra", &[("v", "0")]).await;
    let mut r = Replica::connect(&m.grpc, register_configmaps("requeue", 1))
        .await
        .expect("registered");
    let first = r.expect().await;
    let asked = Duration::from_millis(1500);
    let replied = Instant::now();
    r.reply(
        &first.id,
        Outcome::RequeueAfter(pb::reconcile_result::RequeueAfter {
            delay: Some(secs(asked.as_secs_f64())),
        }),
    )
    .await;
    let second = r.expect().await;
    assert_eq!(key(&second), "default/ra");
    assert!(
        replied.elapsed() >= asked,
        "re-delivered after {:?}, earlier than the {asked:?} asked",
        replied.elapsed()
    );
    assert!(
        second
            .reasons
            .contains(&(pb::reconcile_request::Reason::Requeue as i32))
    );
    r.done(&second.id).await;
}

/// Errors back off exponentially per key, and success resets the backoff.
#[tokio::test]
async fn contract_backoff() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "bo", &[("v", "0")]).await;
    let mut reg = register_configmaps("backoff", 1);
    reg.backoff = Some(pb::Backoff {
        base: Some(secs(0.2)),
        max: Some(secs(10.0)),
    });
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    let error = || {
        Outcome::Error(pb::reconcile_result::Error {
            message: "boom".into(),
            retry_after: None,
        })
    };
    let mut req = r.expect().await;
    let mut expected = Duration::from_millis(200);
    for attempt in 1..=3u32 {
        assert_eq!(req.attempt, attempt);
        let at = Instant::now();
        r.reply(&req.id, error()).await;
        req = r.expect().await;
        assert!(
            at.elapsed() >= expected,
            "attempt {} came after {:?}, before the {expected:?} backoff",
            attempt + 1,
            at.elapsed()
        );
        expected *= 2;
    }
    r.done(&req.id).await;
    put_configmap(&c.client, "default", "bo", &[("v", "1")]).await;
    let req = r.expect().await;
    assert_eq!(req.attempt, 1, "success resets the attempt count");
    let at = Instant::now();
    r.reply(&req.id, error()).await;
    let req = r.expect().await;
    let gap = at.elapsed();
    assert!(
        gap >= Duration::from_millis(200) && gap < Duration::from_millis(1600),
        "after a reset the backoff starts at the base again, took {gap:?}"
    );
    r.done(&req.id).await;
}

/// A terminal error is not retried until the object changes.
#[tokio::test]
async fn contract_terminal() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "term", &[("v", "0")]).await;
    let mut reg = register_configmaps("terminal", 1);
    reg.backoff = Some(pb::Backoff {
        base: Some(secs(0.05)),
        max: Some(secs(0.1)),
    });
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    let first = r.expect().await;
    r.reply(
        &first.id,
        Outcome::Terminal(pb::reconcile_result::Terminal {
            message: "cannot fix".into(),
        }),
    )
    .await;
    assert!(
        r.next(Duration::from_secs(2)).await.is_none(),
        "a terminal error must not be retried by timers"
    );
    put_configmap(&c.client, "default", "term", &[("v", "1")]).await;
    let again = r.expect().await;
    assert_eq!(key(&again), "default/term");
    r.done(&again.id).await;
}

/// A request past its deadline is re-queued, and its late result is discarded.
#[tokio::test]
async fn contract_deadline() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "dl", &[("v", "0")]).await;
    let mut reg = register_configmaps("deadline", 2);
    reg.request_deadline = Some(secs(1.0));
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    let first = r.expect().await;
    let deadline = first.deadline.expect("each request carries its deadline");
    let deadline =
        std::time::UNIX_EPOCH + Duration::new(deadline.seconds as u64, deadline.nanos as u32);
    let second = r.expect().await;
    assert_eq!(key(&second), "default/dl");
    assert!(
        std::time::SystemTime::now() >= deadline,
        "re-delivered before the first request's deadline passed"
    );
    assert_eq!(second.attempt, 2);
    // The late answer to the first request must not complete the second.
    r.done(&first.id).await;
    assert!(
        r.next(Duration::from_millis(1500)).await.is_some(),
        "the second request also missed its deadline: delivered again"
    );
}

/// Live changes are delivered before initial-list work, without starving it.
#[tokio::test]
async fn contract_priority() {
    let (c, m) = setup().await;
    namespace(&c.client, "prio", &[]).await;
    for i in 0..60 {
        put_configmap(&c.client, "prio", &format!("bg-{i:02}"), &[("v", "0")]).await;
    }
    let mut r = Replica::connect(&m.grpc, register_configmaps("priority", 1))
        .await
        .expect("registered");
    let first = r.expect().await;
    put_configmap(&c.client, "prio", "live", &[("v", "1")]).await;
    // Let the watch event reach the manager before the next pop.
    wait_for("live event cached", || async {
        m.status().await["informers"]
            .as_array()
            .is_some_and(|a| a.iter().any(|i| i["objects"].as_u64().unwrap_or(0) >= 61))
    })
    .await;
    r.done(&first.id).await;
    let mut seen = Vec::new();
    for _ in 0..70 {
        let Some(req) = r.next(Duration::from_secs(5)).await else {
            break;
        };
        seen.push(key(&req));
        r.done(&req.id).await;
    }
    let live_at = seen
        .iter()
        .position(|k| k == "prio/live")
        .expect("the live change is delivered");
    assert!(
        live_at <= 1,
        "the live change should jump the 59 queued initial-list keys, came at position {live_at}"
    );
    let background: HashSet<&String> = seen.iter().filter(|k| k.starts_with("prio/bg-")).collect();
    assert_eq!(
        background.len() + 1,
        60,
        "initial-list work is not starved: {} of 60 delivered",
        background.len() + 1
    );
}

/// No event from outside the registered namespaces, labels or predicates reaches the controller.
#[tokio::test]
async fn contract_scoping() {
    let (c, m) = setup().await;
    namespace(&c.client, "inside", &[]).await;
    namespace(&c.client, "outside", &[]).await;
    let mut reg = register_configmaps("scoped", 8);
    reg.namespaces = Some(pb::NamespaceScope {
        scope: Some(pb::namespace_scope::Scope::Names(
            pb::namespace_scope::Names {
                names: vec!["inside".into()],
            },
        )),
    });
    reg.label_selector = Some(pb::LabelSelector {
        match_labels: [("team".to_string(), "a".to_string())]
            .into_iter()
            .collect(),
        match_expressions: vec![],
    });
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    let labelled = |ns: &str, name: &str, team: &str| serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": {"team": team}}});
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    for (ns, name, team) in [
        ("outside", "o1", "a"),
        ("inside", "wrong-team", "b"),
        ("inside", "ok", "a"),
    ] {
        let api: Api<ConfigMap> = Api::namespaced(c.client.clone(), ns);
        api.patch(
            name,
            &PatchParams::apply("tests"),
            &Patch::Apply(labelled(ns, name, team)),
        )
        .await
        .expect("applied");
    }
    let got = r.expect().await;
    assert_eq!(key(&got), "inside/ok");
    r.done(&got.id).await;
    assert!(
        r.next(Duration::from_secs(2)).await.is_none(),
        "objects outside the namespace or label scope must not arrive"
    );
}

/// Only the Lease holder dispatches; a standby refuses sessions with UNAVAILABLE naming the leader.
#[tokio::test]
async fn contract_single_leader() {
    let c = start_cluster().await;
    let timing = FAST_LEASE;
    let mut m1 = Manager::start(&c, "leader-a", &timing).await;
    m1.wait_leading().await;
    let m2 = Manager::start(&c, "leader-b", &timing).await;
    let refused = Replica::connect(&m2.grpc, register_configmaps("single", 1))
        .await
        .err()
        .expect("a standby refuses sessions");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().contains("leader-a"),
        "the refusal names the leader: {}",
        refused.message()
    );
    put_configmap(&c.client, "default", "sl", &[("v", "0")]).await;
    m1.stop().await;
    m2.wait_leading().await;
    let mut r = Replica::connect(&m2.grpc, register_configmaps("single", 1))
        .await
        .expect("the new leader accepts sessions");
    let req = r.expect().await;
    assert_eq!(key(&req), "default/sl");
    r.done(&req.id).await;
}

// ----- the contract in the operators people write: startup, exclusive attempts, rollouts --------

/// A manager whose hold is 2 s (a 4 s Lease, 2 s renew deadline), so that fencing tests finish
/// quickly.
async fn short_hold() -> (Cluster, Manager) {
    let c = start_cluster().await;
    let m = Manager::start(
        &c,
        "m1",
        &["--lease-duration", "4s", "--renew-deadline", "2s"],
    )
    .await;
    m.wait_leading().await;
    (c, m)
}

fn leases() -> pb::ResourceType {
    pb::ResourceType {
        group: "coordination.k8s.io".into(),
        version: "v1".into(),
        kind: "Lease".into(),
        plural: String::new(),
    }
}

/// Primary `default/<name>` (labelled `startup=yes`) owning Lease `default/<name>-child`.
async fn primary_with_child(c: &Cluster, name: &str) {
    put_configmap(&c.client, "default", name, &[("v", "0")]).await;
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(c.client.clone(), "default");
    let mut cm = cms.get(name).await.expect("the primary");
    cm.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("startup".into(), "yes".into());
    cms.replace(name, &Default::default(), &cm)
        .await
        .expect("labelled");
    let uid = cm.metadata.uid.unwrap_or_default();
    let lease = serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": format!("{name}-child"), "namespace": "default",
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": name,
                "uid": uid, "controller": true}]},
        "spec": {"holderIdentity": "child"}});
    apply(&c.client, &lease).await.expect("the child");
}

/// A registration of primaries labelled `startup=yes` owning Leases; `selector_salt` makes its
/// primary informer new (a label requirement nobody sets).
fn owning(name: &str, selector_salt: usize, metadata_only: bool) -> pb::Register {
    let mut r = register(name, configmaps(), 8, Some("default"));
    r.label_selector = Some(pb::LabelSelector {
        match_labels: [("startup".to_string(), "yes".to_string())].into(),
        match_expressions: vec![pb::LabelSelectorRequirement {
            key: format!("absent-{selector_salt}"),
            operator: pb::label_selector_requirement::Operator::DoesNotExist as i32,
            values: vec![],
        }],
    });
    r.owns = vec![pb::OwnedResource {
        resource: Some(leases()),
        controller_only: true,
        predicate: None,
        metadata_only,
    }];
    r
}

/// No dispatch before the caches know: while the owned kind's cache is already full (another
/// controller keeps it) and a fresh registration's primary cache is still listing, no request
/// may go out for an owner the primary cache does not hold yet. Five fresh registrations: every
/// key arrives once, with its object, as INITIAL_LIST, never DELETED.
#[tokio::test]
async fn contract_startup_waits_for_every_cache() {
    let (c, m) = setup().await;
    for i in 0..5 {
        primary_with_child(&c, &format!("owner-{i}")).await;
    }
    // Keeps the Lease cache listed and warm for every fresh registration below.
    let _warm = Replica::connect(&m.grpc, owning("warm", 99, false))
        .await
        .expect("registered");
    for run in 0..5 {
        let mut r = Replica::connect(&m.grpc, owning(&format!("fresh-{run}"), run, false))
            .await
            .expect("registered");
        let mut seen: HashMap<String, u32> = HashMap::new();
        // Everything at startup comes within this window; a second delivery of a key too.
        while let Some(req) = r.next(Duration::from_secs(2)).await {
            let k = key(&req);
            assert!(
                !req.reasons
                    .contains(&(pb::reconcile_request::Reason::Deleted as i32)),
                "run {run}: {k} exists but was delivered as DELETED: {req:?}"
            );
            assert!(
                matches!(
                    req.object,
                    Some(pb::reconcile_request::Object::ObjectJson(_))
                ),
                "run {run}: {k} exists but came without its object: {req:?}"
            );
            *seen.entry(k).or_default() += 1;
            r.done(&req.id).await;
        }
        assert_eq!(seen.len(), 5, "run {run}: every key once: {seen:?}");
        assert!(
            seen.values().all(|n| *n == 1),
            "run {run}: a key delivered twice at startup: {seen:?}"
        );
    }
}

/// Children are cached and read in full unless every entry of the kind asks for metadata only;
/// `Registered.readable` names each kind once, with the form Get serves.
#[tokio::test]
async fn contract_children_in_full_unless_asked_for_metadata() {
    let (c, m) = setup().await;
    primary_with_child(&c, "parent").await;
    for metadata_only in [false, true] {
        let name = format!("forms-{metadata_only}");
        let r = Replica::connect(&m.grpc, owning(&name, 7, metadata_only))
            .await
            .expect("registered");
        let kinds: Vec<(String, bool)> = r
            .registered
            .readable
            .iter()
            .map(|x| {
                let kind = x
                    .resource
                    .as_ref()
                    .map(|r| r.kind.clone())
                    .unwrap_or_default();
                (kind, x.metadata_only)
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("ConfigMap".to_string(), false),
                ("Lease".to_string(), metadata_only)
            ]
        );
        let mut client = r.client.clone();
        let mut get = tonic::Request::new(pb::GetRequest {
            session_id: r.session_id.clone(),
            resource: Some(leases()),
            namespace: "default".into(),
            name: "parent-child".into(),
        });
        get.metadata_mut()
            .insert("authorization", "Bearer dev".parse().expect("header"));
        let got = client.get(get).await.expect("the child").into_inner();
        assert_eq!(got.metadata_only, metadata_only);
        let child: serde_json::Value = serde_json::from_slice(&got.object_json).expect("JSON");
        assert_eq!(
            child["spec"]["holderIdentity"].as_str(),
            (!metadata_only).then_some("child"),
            "{child}"
        );
    }
}

/// Exclusive attempts, past the deadline: the key stays with the replica whose handler overran
/// until its result says the attempt ended; only then is it delivered again.
#[tokio::test]
async fn contract_exclusive_past_the_deadline() {
    let (c, m) = short_hold().await;
    put_configmap(&c.client, "default", "slow", &[("v", "0")]).await;
    let mut reg = register_configmaps("overrun", 1);
    reg.request_deadline = Some(secs(1.0));
    reg.exclusive_attempts = true;
    let mut a = Replica::connect(&m.grpc, reg.clone()).await.expect("a");
    let _a_beats = a.keep_alive(Duration::from_millis(300));
    let first = a.expect().await;
    let mut b = Replica::connect(&m.grpc, reg).await.expect("b");
    let _b_beats = b.keep_alive(Duration::from_millis(300));
    // Three deadlines go by: nobody gets the key while attempt 1 may still run.
    assert!(
        b.next(Duration::from_secs(3)).await.is_none() && a.next(Duration::ZERO).await.is_none(),
        "the key was delivered again while its first attempt had not ended"
    );
    a.done(&first.id).await;
    let again = tokio::select! {
        r = a.next(PATIENCE) => r,
        r = b.next(PATIENCE) => r,
    }
    .expect("delivered again once the attempt ended");
    assert_eq!(key(&again), "default/slow");
    assert_eq!(again.attempt, 2);
}

/// Exclusive attempts, a session gone: its keys go to another replica only once the hold after
/// the manager's last heartbeat answer is over (the replica stops by then).
#[tokio::test]
async fn contract_exclusive_keys_wait_out_the_hold() {
    let (c, m) = short_hold().await;
    put_configmap(&c.client, "default", "held", &[("v", "0")]).await;
    let mut reg = register_configmaps("fenced", 1);
    reg.exclusive_attempts = true;
    let hold = Duration::from_secs(2);
    let mut a = Replica::connect(&m.grpc, reg.clone()).await.expect("a");
    assert_eq!(
        a.registered.hold,
        Some(prost_types::Duration {
            seconds: 2,
            nanos: 0
        }),
        "the hold is the lease less the renew deadline"
    );
    let a_beats = a.keep_alive(Duration::from_millis(200));
    a.expect().await;
    let mut b = Replica::connect(&m.grpc, reg).await.expect("b");
    let _b_beats = b.keep_alive(Duration::from_millis(200));
    a_beats.abort();
    let gone = Instant::now();
    drop(a);
    let again = b.expect().await;
    assert!(
        gone.elapsed() >= hold - Duration::from_millis(300),
        "re-delivered {:?} after the session ended, before the {hold:?} hold",
        gone.elapsed()
    );
    assert_eq!(again.attempt, 2);
}

/// Exclusive attempts: a session that sends nothing for the hold is ended by the manager.
#[tokio::test]
async fn contract_silent_exclusive_session_is_ended() {
    let (_c, m) = short_hold().await;
    let mut reg = register_configmaps("silent", 1);
    reg.exclusive_attempts = true;
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    let status = r
        .ended(PATIENCE)
        .await
        .expect("the silent session is ended");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("no message"), "{status:?}");
}

/// Rolling upgrades: a different definition replaces the running one only with a higher
/// revision; a lower or equal one is refused as outdated (FAILED_PRECONDITION, Rejected.outdated)
/// naming what differs; the running sessions of a replaced definition are revoked SUPERSEDED.
#[tokio::test]
async fn contract_rolling_upgrade_by_revision() {
    let (_c, m) = setup().await;
    let mut v1 = register_configmaps("rolled", 1);
    v1.revision = 1;
    let mut running = Replica::connect(&m.grpc, v1.clone()).await.expect("v1");
    let mut v2 = v1.clone();
    v2.request_deadline = Some(secs(9.0));
    let same = Replica::connect(&m.grpc, v2.clone())
        .await
        .err()
        .expect("an equal revision of another definition is refused");
    assert_eq!(same.code(), tonic::Code::FailedPrecondition, "{same:?}");
    assert!(same.message().contains("request_deadline"), "{same:?}");
    v2.revision = 2;
    let _newer = Replica::connect(&m.grpc, v2)
        .await
        .expect("a higher revision takes over");
    let revoked = running.ended(PATIENCE).await.expect("the old session ends");
    assert_eq!(
        revoked.code(),
        tonic::Code::FailedPrecondition,
        "{revoked:?}"
    );
    let older = Replica::connect(&m.grpc, v1)
        .await
        .err()
        .expect("the old definition cannot come back while the new one runs");
    assert_eq!(older.code(), tonic::Code::FailedPrecondition, "{older:?}");
    assert!(older.message().contains("revision 2"), "{older:?}");
}
