//! The protocol exactly as `proto/ctrlhub/v1/*.proto` and `docs/protocol.md` document it: one
//! test per place a stranger writing a controller from those docs found the manager doing
//! something else, each over raw gRPC against the real `ctrlhub` binary on
//! devcluster, reading only what a controller receives (and `/status` and `/metrics`).

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use ctrlhub_tests::replica::configmaps;
use ctrlhub_tests::*;
use pb::reconcile_request::Reason;
use pb::reconcile_result::Outcome;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Code;

async fn setup(identity: &str) -> (Cluster, Manager) {
    let c = start_cluster().await;
    let m = Manager::start(&c, identity, &[]).await;
    m.wait_leading().await;
    (c, m)
}

/// What a Connect answers: its first message and how the stream ended (within [`PATIENCE`]).
struct Answer {
    first: Option<pb::manager_message::Message>,
    end: Option<tonic::Status>,
}

/// Opens a Connect with `authorization`, sends `register`, and reads the answer up to the end
/// of the stream (or the first message when the stream stays open).
async fn answer(m: &Manager, register: pb::Register, authorization: &str) -> Answer {
    let channel = tonic::transport::Endpoint::from_shared(m.grpc.clone())
        .expect("endpoint")
        .connect()
        .await
        .expect("connected");
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::ControllerMessage {
        message: Some(pb::controller_message::Message::Register(Box::new(
            register,
        ))),
    })
    .await
    .expect("queued");
    let request = with_authorization(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        Some(authorization),
    );
    let mut stream = match ControllerManagerClient::new(channel).connect(request).await {
        Ok(s) => s.into_inner(),
        Err(status) => {
            return Answer {
                first: None,
                end: Some(status),
            };
        }
    };
    let first = match tokio::time::timeout(PATIENCE, stream.message()).await {
        Ok(Ok(m)) => m.and_then(|m| m.message),
        Ok(Err(status)) => {
            return Answer {
                first: None,
                end: Some(status),
            };
        }
        Err(_) => panic!("no answer to Register within {PATIENCE:?}"),
    };
    if matches!(first, Some(pb::manager_message::Message::Registered(_))) {
        drop(tx);
        return Answer { first, end: None };
    }
    let end = match tokio::time::timeout(PATIENCE, stream.message()).await {
        Ok(Err(status)) => Some(status),
        Ok(Ok(None)) => Some(tonic::Status::ok("")),
        other => panic!("after {first:?} the stream went on: {other:?}"),
    };
    drop(tx);
    Answer { first, end }
}

fn rejected(a: &Answer) -> &pb::Rejected {
    match &a.first {
        Some(pb::manager_message::Message::Rejected(r)) => r,
        other => panic!("expected Rejected, got {other:?} then {:?}", a.end),
    }
}

/// 1. Drain ends the stream with OK once nothing is in flight, also when the last request
/// misses its deadline instead of being answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_ends_with_ok_after_the_last_request_misses_its_deadline() {
    let (c, m) = setup("proto-drain").await;
    put_configmap(&c.client, "default", "slow", &[("v", "0")]).await;
    let mut reg = register("drain", configmaps(), 1, Some("default"));
    reg.request_deadline = Some(secs(2.0));
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    let first = r.expect().await;
    assert_eq!(key(&first), "default/slow");
    r.answers()
        .send(pb::ControllerMessage {
            message: Some(pb::controller_message::Message::Drain(pb::Drain::default())),
        })
        .await
        .expect("drain sent");
    // Never answered: the deadline passes 2 s after dispatch, and then nothing is in flight.
    let end = r
        .ended(Duration::from_secs(15))
        .await
        .expect("the stream ends after the missed deadline");
    assert_eq!(end.code(), Code::Ok, "{end:?}");
}

/// 2. An invalid Register is answered with Rejected naming the field, then the same status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_register_is_answered_with_rejected_naming_the_field() {
    let (_c, m) = setup("proto-rejected").await;
    let a = answer(&m, register_configmaps("Not_A_DNS_Label", 1), "Bearer dev").await;
    let r = rejected(&a).clone();
    assert_eq!(r.code, Code::InvalidArgument as i32, "{r:?}");
    assert_eq!(r.field, "register.controller_name", "{r:?}");
    let end = a.end.expect("the stream ends");
    assert_eq!(end.code(), Code::InvalidArgument);
    assert_eq!(end.message(), r.message, "Rejected and the status agree");
    // A refusal from the headers alone (no valid token) is a status without Rejected.
    let a = answer(&m, register_configmaps("fine", 1), "Bearer wrong").await;
    assert!(a.first.is_none(), "{:?}", a.first);
    assert_eq!(a.end.expect("ended").code(), Code::Unauthenticated);
}

/// 3. Registered.effective echoes every default the manager filled in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_echoes_the_defaults_it_filled_in() {
    let (_c, m) = setup("proto-effective").await;
    let bare = pb::Register {
        controller_name: "bare".into(),
        primary: Some(configmaps()),
        ..Default::default()
    };
    let a = answer(&m, bare, "Bearer dev").await;
    let Some(pb::manager_message::Message::Registered(r)) = a.first else {
        panic!("expected Registered, got {:?} {:?}", a.first, a.end);
    };
    let e = r.effective.expect("effective");
    assert_eq!(e.mode, pb::register::Mode::Reconcile as i32, "mode");
    assert_eq!(e.primary.expect("primary").plural, "configmaps", "plural");
    assert!(
        matches!(
            e.namespaces.and_then(|n| n.scope),
            Some(pb::namespace_scope::Scope::All(_))
        ),
        "namespaces"
    );
    assert_eq!(e.max_in_flight, 1, "max_in_flight: 0 means 1");
    assert_eq!(e.request_deadline, Some(secs(60.0)), "request_deadline");
    assert_eq!(e.resync_period, Some(secs(36_000.0)), "resync_period");
    let backoff = e.backoff.expect("backoff");
    assert_eq!(backoff.base, Some(secs(0.005)));
    assert_eq!(backoff.max, Some(secs(1000.0)));
}

/// 4. A zero request deadline is refused, not turned into the default; so is 1 ns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_or_tiny_request_deadline_is_refused() {
    let (_c, m) = setup("proto-deadline").await;
    for deadline in [
        prost_types::Duration::default(),
        prost_types::Duration {
            seconds: 0,
            nanos: 1,
        },
    ] {
        let mut reg = register_configmaps("zero", 1);
        reg.request_deadline = Some(deadline);
        let a = answer(&m, reg, "Bearer dev").await;
        let r = rejected(&a);
        assert_eq!(r.code, Code::InvalidArgument as i32, "{deadline:?}: {r:?}");
        assert_eq!(r.field, "register.request_deadline", "{r:?}");
    }
    let mut reg = register_configmaps("zero-backoff", 1);
    reg.backoff = Some(pb::Backoff {
        base: Some(prost_types::Duration::default()),
        max: None,
    });
    let a = answer(&m, reg, "Bearer dev").await;
    assert_eq!(rejected(&a).field, "register.backoff.base");
}

/// The reasons of the next request for `name`, answering every other request Done.
async fn reasons_of(r: &mut Replica, name: &str) -> (Vec<Reason>, pb::ReconcileRequest) {
    loop {
        let req = r.expect().await;
        r.done(&req.id).await;
        if key(&req).ends_with(&format!("/{name}")) {
            let reasons = req
                .reasons
                .iter()
                .map(|x| Reason::try_from(*x).unwrap_or(Reason::Unspecified))
                .collect();
            return (reasons, req);
        }
    }
}

/// 5. Reasons as documented: INITIAL_LIST for what a fresh registration finds, CREATED for a
/// new object, UPDATED, LEFT_SCOPE (with a tombstone) for an object whose labels stop matching
/// the selector, DELETED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasons_are_the_documented_ones() {
    let (c, m) = setup("proto-reasons").await;
    let labelled = |name: &str, team: &str, v: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": {"team": team}},
            "data": {"v": v}})
    };
    apply(&c.client, &labelled("before", "a", "0"))
        .await
        .expect("applied");
    let mut reg = register("reasons", configmaps(), 4, Some("default"));
    reg.label_selector = Some(pb::LabelSelector {
        match_labels: [("team".to_string(), "a".to_string())].into(),
        match_expressions: Vec::new(),
    });
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    assert_eq!(reasons_of(&mut r, "before").await.0, [Reason::InitialList]);
    apply(&c.client, &labelled("new", "a", "0"))
        .await
        .expect("applied");
    assert_eq!(reasons_of(&mut r, "new").await.0, [Reason::Created]);
    apply(&c.client, &labelled("new", "a", "1"))
        .await
        .expect("applied");
    assert_eq!(reasons_of(&mut r, "new").await.0, [Reason::Updated]);
    apply(&c.client, &labelled("new", "b", "1"))
        .await
        .expect("applied");
    let (reasons, left) = reasons_of(&mut r, "new").await;
    assert_eq!(reasons, [Reason::LeftScope]);
    assert!(
        matches!(
            left.object,
            Some(pb::reconcile_request::Object::Tombstone(_))
        ),
        "LEFT_SCOPE carries a tombstone: {:?}",
        left.object
    );
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(c.client.clone(), "default");
    cms.delete("before", &Default::default())
        .await
        .expect("deleted");
    assert_eq!(reasons_of(&mut r, "before").await.0, [Reason::Deleted]);
}

/// 6. A label-selector error names its field once, in the proto's own field names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selector_errors_name_the_field_once() {
    let (_c, m) = setup("proto-selector").await;
    let mut reg = register_configmaps("sel", 1);
    reg.predicate = Some(pb::Predicate {
        predicate: Some(pb::predicate::Predicate::Negate(Box::new(pb::Predicate {
            predicate: Some(pb::predicate::Predicate::LabelSelector(pb::LabelSelector {
                match_labels: [("bad key!".to_string(), "v".to_string())].into(),
                match_expressions: Vec::new(),
            })),
        }))),
    });
    let a = answer(&m, reg, "Bearer dev").await;
    let r = rejected(&a);
    assert!(
        r.field
            .starts_with("register.predicate.negate.label_selector"),
        "{r:?}"
    );
    assert_eq!(
        r.message.matches(&r.field).count(),
        1,
        "the path appears once: {r:?}"
    );
    let mut reg = register_configmaps("empty-all-of", 1);
    reg.predicate = Some(pb::Predicate {
        predicate: Some(pb::predicate::Predicate::AllOf(pb::predicate::AllOf {
            predicates: Vec::new(),
        })),
    });
    let a = answer(&m, reg, "Bearer dev").await;
    assert_eq!(rejected(&a).field, "register.predicate.all_of.predicates");
}

/// 7. A wrong token in static mode says to send the manager's --token, not a ServiceAccount's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_static_token_names_the_managers_token() {
    let (_c, m) = setup("proto-static").await;
    let a = answer(&m, register_configmaps("tok", 1), "Bearer nope").await;
    let end = a.end.expect("refused");
    assert_eq!(end.code(), Code::Unauthenticated);
    assert!(end.message().contains("--token"), "{end:?}");
    assert!(!end.message().contains("ServiceAccount"), "{end:?}");
}

/// 8. Results for ids not in flight are counted in /metrics and /status, and /status counts
/// RequeueAfter results as well as Done ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discarded_and_requeued_results_are_counted() {
    let (c, m) = setup("proto-counts").await;
    put_configmap(&c.client, "default", "poll", &[("v", "0")]).await;
    let mut r = Replica::connect(
        &m.grpc,
        register("counts", configmaps(), 1, Some("default")),
    )
    .await
    .expect("registered");
    let req = r.expect().await;
    let requeue = Outcome::RequeueAfter(pb::reconcile_result::RequeueAfter {
        delay: Some(secs(3600.0)),
    });
    r.reply(&req.id, requeue.clone()).await;
    r.reply(&req.id, requeue).await; // a duplicate
    r.done("no-such-id").await; // an unknown id
    let series = r#"ctrlhub_discarded_results_total{controller="counts",tenant="dev"}"#;
    wait_for("two discarded results in /metrics", || async {
        m.metric(series).await == 2.0
    })
    .await;
    let status = m.status().await;
    let c = status["controllers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "counts"))
        .expect("the controller in /status");
    assert_eq!(c["discarded"], 2, "{c}");
    assert_eq!(c["requeued"], 1, "{c}");
    assert_eq!(c["succeeded"], 1, "{c}");
}

/// 5b. A change of an owned object arrives for its owner as OWNED_CHANGED, of a watched object
/// for the primary it maps to as WATCHED_CHANGED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_and_watched_changes_say_so() {
    let (c, m) = setup("proto-related").await;
    let secrets = pb::ResourceType {
        group: String::new(),
        version: "v1".into(),
        kind: "Secret".into(),
        plural: String::new(),
    };
    let mut reg = register("related", configmaps(), 4, Some("default"));
    reg.owns = vec![pb::OwnedResource {
        resource: Some(secrets.clone()),
        controller_only: true,
        predicate: None,
        metadata_only: false,
    }];
    reg.watches = vec![pb::WatchedResource {
        resource: Some(pb::ResourceType {
            kind: "ServiceAccount".into(),
            ..secrets
        }),
        mapping: Some(pb::watched_resource::Mapping::LabelKey("for".into())),
        predicate: None,
        metadata_only: false,
    }];
    put_configmap(&c.client, "default", "parent", &[("v", "0")]).await;
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    assert_eq!(reasons_of(&mut r, "parent").await.0, [Reason::InitialList]);
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(c.client.clone(), "default");
    let uid = cms
        .get("parent")
        .await
        .expect("parent")
        .metadata
        .uid
        .expect("uid");
    let child = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "child", "namespace": "default", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": uid, "controller": true}]},
        "stringData": {"k": "v"}});
    apply(&c.client, &child).await.expect("child applied");
    assert_eq!(reasons_of(&mut r, "parent").await.0, [Reason::OwnedChanged]);
    let pointer = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "pointer", "namespace": "default", "labels": {"for": "parent"}}});
    apply(&c.client, &pointer).await.expect("pointer applied");
    assert_eq!(
        reasons_of(&mut r, "parent").await.0,
        [Reason::WatchedChanged]
    );
}

/// Cached reads answer from the session's own caches and scope: an object outside the
/// session's label selector is NOT_FOUND and absent from List, even while another controller
/// caches it; List reports the cache's resourceVersion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_reads_stay_within_the_sessions_scope() {
    let (c, m) = setup("proto-reads").await;
    for (name, team) in [("mine", "a"), ("theirs", "b")] {
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "labels": {"team": team}}});
        apply(&c.client, &cm).await.expect("applied");
    }
    let _broad = Replica::connect(&m.grpc, register("broad", configmaps(), 1, Some("default")))
        .await
        .expect("a controller caching every ConfigMap");
    let mut reg = register("narrow", configmaps(), 1, Some("default"));
    reg.label_selector = Some(pb::LabelSelector {
        match_labels: [("team".to_string(), "a".to_string())].into(),
        match_expressions: Vec::new(),
    });
    let narrow = Replica::connect(&m.grpc, reg).await.expect("registered");
    let mut client = narrow.client.clone();
    let get = |name: &str| {
        with_authorization(
            pb::GetRequest {
                session_id: narrow.session_id.clone(),
                resource: Some(configmaps()),
                namespace: "default".into(),
                name: name.into(),
            },
            Some("Bearer dev"),
        )
    };
    assert!(client.get(get("mine")).await.is_ok(), "its own object");
    let theirs = client
        .get(get("theirs"))
        .await
        .expect_err("outside the selector");
    assert_eq!(theirs.code(), Code::NotFound, "{theirs:?}");
    let list = client
        .list(with_authorization(
            pb::ListRequest {
                session_id: narrow.session_id.clone(),
                resource: Some(configmaps()),
                namespace: "default".into(),
                ..Default::default()
            },
            Some("Bearer dev"),
        ))
        .await
        .expect("listed")
        .into_inner();
    assert_eq!(list.items.len(), 1, "only its own object");
    assert!(
        list.resource_version.parse::<u64>().is_ok(),
        "the cache's resourceVersion: {:?}",
        list.resource_version
    );
}

/// The requests of one burst as a session sees them: each request once, and how many
/// messages carried them (a batch is one).
async fn burst(r: &mut Replica, n: usize) -> (Vec<pb::ReconcileRequest>, usize) {
    let (mut requests, mut messages) = (Vec::new(), 0);
    while requests.len() < n {
        match r.next_message(PATIENCE).await {
            Some(pb::manager_message::Message::Reconcile(one)) => requests.push(one),
            Some(pb::manager_message::Message::Batch(batch)) => {
                assert!(
                    batch.events.is_empty(),
                    "events in a reconcile batch: {batch:?}"
                );
                requests.extend(batch.requests);
            }
            Some(_) => continue,
            None => panic!("only {} of {n} requests arrived", requests.len()),
        }
        messages += 1;
    }
    (requests, messages)
}

/// Makes `n` ConfigMaps while `r` has no credit, waits until all are queued for `name`, then
/// gives the credit for all at once, so the burst waits for the stream together.
async fn queued_burst(c: &Cluster, m: &Manager, r: &Replica, name: &str, n: usize) {
    let credit = |max_in_flight| pb::ControllerMessage {
        message: Some(pb::controller_message::Message::Credit(pb::Credit {
            max_in_flight,
        })),
    };
    r.answers().send(credit(0)).await.expect("credit sent");
    // The pause must hold before the first change, or that change goes out alone at once.
    wait_for("the session paused", || async {
        let status = m.status().await;
        status["controllers"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["name"] == name && c["sessionList"][0]["credits"] == 0)
        })
    })
    .await;
    for i in 0..n {
        put_configmap(&c.client, name, &format!("burst-{i}"), &[("v", "1")]).await;
    }
    let depth = format!(r#"workqueue_depth{{name="{name}",tenant="dev"}}"#);
    wait_for("the whole burst queued", || async {
        m.metric(&depth).await == n as f64
    })
    .await;
    r.answers()
        .send(credit(n as u32))
        .await
        .expect("credit sent");
}

/// Batches (docs/protocol.md, "Batches"): a session that opts in gets the work that waited for
/// its stream in fewer messages than requests, each request with its own id; it may answer them
/// in one ResultBatch, applied result by result; a session that does not opt in never sees a
/// batch, and the manager caps what is asked at 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_carry_a_burst_and_single_pieces_stay_alone() {
    let (c, m) = setup("proto-batches").await;
    const N: usize = 12;
    for name in ["batched", "single"] {
        namespace(&c.client, name, &[]).await;
    }
    let asked = pb::Register {
        max_batch: 1000,
        max_concurrent_reconciles: 64,
        ..register("batched", configmaps(), 1, Some("batched"))
    };
    let mut batched = Replica::connect(&m.grpc, asked).await.expect("registered");
    let effective = batched.registered.effective.clone().expect("effective");
    assert_eq!(effective.max_batch, 64, "the manager applies at most 64");
    queued_burst(&c, &m, &batched, "batched", N).await;
    let (requests, messages) = burst(&mut batched, N).await;
    let mut keys: Vec<String> = requests.iter().map(key).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), N, "every key exactly once: {keys:?}");
    assert!(
        messages < N,
        "{N} requests that waited together came in {messages} messages"
    );

    let results = pb::ControllerMessage {
        message: Some(pb::controller_message::Message::Results(pb::ResultBatch {
            results: requests
                .iter()
                .map(|r| pb::ReconcileResult {
                    id: r.id.clone(),
                    outcome: Some(Outcome::Done(pb::reconcile_result::Done {})),
                })
                .collect(),
            acks: Vec::new(),
        })),
    };
    batched.answers().send(results).await.expect("results sent");
    let received = r#"ctrlhub_batch_size_count{direction="received"}"#;
    wait_for("the ResultBatch counted", || async {
        m.metric(received).await == 1.0
    })
    .await;
    let succeeded =
        r#"controller_runtime_reconcile_total{controller="batched",result="success",tenant="dev"}"#;
    wait_for("every result of the batch applied", || async {
        m.metric(succeeded).await == N as f64
    })
    .await;

    let mut single = Replica::connect(
        &m.grpc,
        pb::Register {
            max_concurrent_reconciles: 64,
            ..register("single", configmaps(), 1, Some("single"))
        },
    )
    .await
    .expect("registered");
    let effective = single.registered.effective.clone().expect("effective");
    assert_eq!(effective.max_batch, 0, "no batches asked, none applied");
    queued_burst(&c, &m, &single, "single", N).await;
    let (_, messages) = burst(&mut single, N).await;
    assert_eq!(
        messages, N,
        "a session that did not opt in gets every request alone"
    );
    // Register, two Credits and one ResultBatch, then Register and two Credits: a batch is one
    // message, and the Register counts like any other.
    let received = r#"grpc_server_msg_received_total{grpc_method="Connect",grpc_service="ctrlhub.v1.ControllerManager",grpc_type="bidi_stream"}"#;
    assert_eq!(m.metric(received).await, 7.0);
}
