//! End-to-end behaviours of the manager beyond the contract table: shared watches, predicates,
//! live namespace scope, owned-kind mapping and registration validation.

use ctrlhub_proto::v1 as pb;
use ctrlhub_tests::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use std::time::Duration;

async fn setup() -> (Cluster, Manager) {
    let c = start_cluster().await;
    let m = Manager::start(&c, "m1", &[]).await;
    m.wait_leading().await;
    (c, m)
}

fn deployments(name: &str) -> pb::Register {
    let mut reg = register_configmaps(name, 4);
    reg.primary = Some(pb::ResourceType {
        group: "apps".into(),
        version: "v1".into(),
        kind: "Deployment".into(),
        plural: String::new(),
    });
    reg
}

fn deployment(name: &str, replicas: i32) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    })
}

/// Two controllers registering the same kind share one API watch.
#[tokio::test]
async fn two_controllers_share_one_watch() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "shared", &[("v", "0")]).await;
    let before = c.dc.stats().request_count("watch", "configmaps");
    let mut a = Replica::connect(&m.grpc, register_configmaps("first", 1))
        .await
        .expect("registered");
    let ra = a.expect().await;
    let mut b = Replica::connect(&m.grpc, register_configmaps("second", 1))
        .await
        .expect("registered");
    let rb = b.expect().await;
    assert_eq!(key(&ra), "default/shared");
    assert_eq!(
        key(&rb),
        "default/shared",
        "a late subscriber gets the cached snapshot"
    );
    let watches = c.dc.stats().request_count("watch", "configmaps") - before;
    assert_eq!(
        watches, 1,
        "two registrations of one kind must share a single watch, devcluster served {watches}"
    );
    assert_eq!(
        c.dc.stats().request_count("list", "configmaps"),
        1,
        "and a single list"
    );
}

/// A status-only update does not reach a controller registered with the generation predicate.
#[tokio::test]
async fn generation_predicate_filters_status_updates() {
    let (c, m) = setup().await;
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    api.patch(
        "web",
        &PatchParams::apply("tests"),
        &Patch::Apply(deployment("web", 1)),
    )
    .await
    .expect("deployment");
    let mut reg = deployments("gen");
    reg.predicate = Some(pb::Predicate {
        predicate: Some(pb::predicate::Predicate::GenerationChanged(
            pb::predicate::GenerationChanged {},
        )),
    });
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    let first = r.expect().await;
    r.done(&first.id).await;
    let status = serde_json::json!({"status": {"replicas": 1, "readyReplicas": 1}});
    api.patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status patched");
    assert!(
        r.next(Duration::from_secs(2)).await.is_none(),
        "a status-only update must be filtered by generation_changed"
    );
    api.patch(
        "web",
        &PatchParams::apply("tests"),
        &Patch::Apply(deployment("web", 3)),
    )
    .await
    .expect("spec change");
    let again = r.expect().await;
    assert_eq!(
        key(&again),
        "default/web",
        "a spec change (new generation) is delivered"
    );
    r.done(&again.id).await;
}

/// A namespace that gains the selected label comes into scope, with its existing objects.
#[tokio::test]
async fn namespace_gaining_label_comes_into_scope() {
    let (c, m) = setup().await;
    namespace(&c.client, "team-a", &[("tenant", "a")]).await;
    namespace(&c.client, "team-b", &[]).await;
    put_configmap(&c.client, "team-a", "in-a", &[("v", "0")]).await;
    put_configmap(&c.client, "team-b", "in-b", &[("v", "0")]).await;
    let mut reg = register_configmaps("by-label", 4);
    reg.namespaces = Some(pb::NamespaceScope {
        scope: Some(pb::namespace_scope::Scope::LabelSelector(
            pb::LabelSelector {
                match_labels: [("tenant".to_string(), "a".to_string())]
                    .into_iter()
                    .collect(),
                match_expressions: vec![],
            },
        )),
    });
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    let first = r.expect().await;
    assert_eq!(key(&first), "team-a/in-a");
    r.done(&first.id).await;
    assert!(
        r.next(Duration::from_secs(2)).await.is_none(),
        "team-b is not in scope yet"
    );
    namespace(&c.client, "team-b", &[("tenant", "a")]).await;
    let joined = r.expect().await;
    assert_eq!(
        key(&joined),
        "team-b/in-b",
        "objects of a namespace entering the scope are delivered"
    );
    r.done(&joined.id).await;
}

/// An owned object's change maps to its controller owner.
#[tokio::test]
async fn owned_object_change_reaches_owner() {
    let (c, m) = setup().await;
    let deps: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let owner = deps
        .patch(
            "owner",
            &PatchParams::apply("tests"),
            &Patch::Apply(deployment("owner", 1)),
        )
        .await
        .expect("owner");
    let uid = owner.metadata.uid.clone().expect("uid");
    let mut reg = deployments("owner-ctl");
    reg.owns = vec![pb::OwnedResource {
        resource: Some(pb::ResourceType {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: String::new(),
        }),
        controller_only: true,
        predicate: None,
        metadata_only: false,
    }];
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    let first = r.expect().await;
    assert_eq!(key(&first), "default/owner");
    r.done(&first.id).await;
    let child = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "child", "namespace": "default",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "owner", "uid": uid, "controller": true}]}, "data": {"k": "v"}});
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(c.client.clone(), "default");
    cms.patch("child", &PatchParams::apply("tests"), &Patch::Apply(child))
        .await
        .expect("child");
    let mapped = r.expect().await;
    assert_eq!(
        key(&mapped),
        "default/owner",
        "the child's event is delivered as its owner's key"
    );
    r.done(&mapped.id).await;
}

/// A malformed registration gets INVALID_ARGUMENT with a message naming the field.
#[tokio::test]
async fn malformed_registration_is_invalid_argument_naming_the_field() {
    let (_c, m) = setup().await;
    let mut bad_name = register_configmaps("Not_Valid", 1);
    let err = Replica::connect(&m.grpc, bad_name.clone())
        .await
        .err()
        .expect("rejected");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("register.controller_name"),
        "{}",
        err.message()
    );

    bad_name.controller_name = "ok".into();
    bad_name.primary = Some(pb::ResourceType {
        group: "nope.example.com".into(),
        version: "v1".into(),
        kind: "Ghost".into(),
        plural: String::new(),
    });
    let err = Replica::connect(&m.grpc, bad_name.clone())
        .await
        .err()
        .expect("rejected");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("register.primary") && err.message().contains("Ghost"),
        "{}",
        err.message()
    );

    let mut bad_watch = register_configmaps("ok", 1);
    bad_watch.watches = vec![pb::WatchedResource {
        resource: Some(pb::ResourceType {
            group: String::new(),
            version: "v1".into(),
            kind: "Secret".into(),
            plural: String::new(),
        }),
        mapping: None,
        predicate: None,
        metadata_only: false,
    }];
    let err = Replica::connect(&m.grpc, bad_watch)
        .await
        .err()
        .expect("rejected");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("register.watches[0].mapping"),
        "{}",
        err.message()
    );

    let mut bad_selector = register_configmaps("ok", 1);
    bad_selector.label_selector = Some(pb::LabelSelector {
        match_labels: Default::default(),
        match_expressions: vec![pb::LabelSelectorRequirement {
            key: "tier".into(),
            operator: pb::label_selector_requirement::Operator::In as i32,
            values: vec![],
        }],
    });
    let err = Replica::connect(&m.grpc, bad_selector)
        .await
        .err()
        .expect("rejected");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message()
            .contains("register.label_selector.match_expressions[0]"),
        "{}",
        err.message()
    );
}

/// A request without a token is UNAUTHENTICATED and nothing is registered.
#[tokio::test]
async fn missing_token_is_unauthenticated() {
    let (_c, m) = setup().await;
    let channel = tonic::transport::Endpoint::from_shared(m.grpc.clone())
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");
    let mut client =
        ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(pb::ControllerMessage {
        message: Some(pb::controller_message::Message::Register(Box::new(
            register_configmaps("anon", 1),
        ))),
    })
    .await
    .expect("queued");
    let err = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(
        m.status().await["controllers"].as_array().map(Vec::len),
        Some(0)
    );
}

/// --watch-namespace is the ceiling for every registration: "all namespaces" means all within it,
/// and naming a namespace outside it is refused.
#[tokio::test]
async fn watch_namespace_is_the_ceiling() {
    let c = start_cluster().await;
    namespace(&c.client, "allowed", &[]).await;
    namespace(&c.client, "forbidden", &[]).await;
    put_configmap(&c.client, "allowed", "a", &[("v", "0")]).await;
    put_configmap(&c.client, "forbidden", "f", &[("v", "0")]).await;
    let m = Manager::start(&c, "ceiling", &["--watch-namespace", "allowed"]).await;
    m.wait_leading().await;

    let mut outside = register_configmaps("outside", 1);
    outside.namespaces = Some(pb::NamespaceScope {
        scope: Some(pb::namespace_scope::Scope::Names(
            pb::namespace_scope::Names {
                names: vec!["forbidden".into()],
            },
        )),
    });
    let err = Replica::connect(&m.grpc, outside)
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(
        err.message().contains("--watch-namespace"),
        "{}",
        err.message()
    );

    let mut r = Replica::connect(&m.grpc, register_configmaps("everything", 4))
        .await
        .expect("registered");
    let got = r.expect().await;
    assert_eq!(key(&got), "allowed/a");
    r.done(&got.id).await;
    assert!(
        r.next(Duration::from_secs(2)).await.is_none(),
        "nothing from outside the namespace ceiling arrives"
    );
}

/// EVENTS mode: existing objects arrive as SYNC, then every change of a key in order, the next
/// one only after the previous is acknowledged; an unacknowledged event is re-delivered to
/// another replica when its worker disconnects.
#[tokio::test]
async fn events_mode_delivers_in_order_per_key() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "ev", &[("v", "0")]).await;
    let mut reg = register_configmaps("events", 4);
    reg.mode = pb::register::Mode::Events as i32;
    // EVENTS mode takes no controller-wide concurrency (the proto: INVALID_ARGUMENT).
    reg.max_concurrent_reconciles = 0;
    let mut r = Replica::connect(&m.grpc, reg.clone())
        .await
        .expect("registered");
    let sync = r.next_event(PATIENCE).await.expect("sync event");
    assert_eq!(
        sync.r#type,
        pb::event::Type::Sync as i32,
        "objects present at start arrive as SYNC"
    );
    for v in 1..=3 {
        put_configmap(&c.client, "default", "ev", &[("v", &v.to_string())]).await;
    }
    assert!(
        r.next_event(Duration::from_secs(1)).await.is_none(),
        "the next event of a key waits for the ack"
    );
    r.ack(&sync.id).await;
    let mut seen = Vec::new();
    let mut last_seq = sync.sequence;
    while seen.len() < 3 {
        let e = r.next_event(PATIENCE).await.expect("modified event");
        assert_eq!(e.r#type, pb::event::Type::Modified as i32);
        assert!(e.sequence > last_seq, "events of a key arrive in order");
        last_seq = e.sequence;
        let obj: serde_json::Value = serde_json::from_slice(&e.object_json).expect("object json");
        seen.push(obj["data"]["v"].as_str().unwrap_or_default().to_string());
        if seen.len() == 3 {
            // Leave the last one unacknowledged and vanish: another replica must get it.
            let mut other = Replica::connect(&m.grpc, reg.clone())
                .await
                .expect("second replica");
            drop(r);
            let again = other.next_event(PATIENCE).await.expect("redelivered");
            assert_eq!(
                again.sequence, e.sequence,
                "the unacknowledged event is delivered again"
            );
            assert_eq!(again.attempt, 2);
            other.ack(&again.id).await;
            break;
        }
        r.ack(&e.id).await;
    }
    assert_eq!(
        seen,
        vec!["1", "2", "3"],
        "every change, in order, none collapsed"
    );
}

/// /metrics carries controller-runtime's series for a reconciling controller, and a live scrape
/// passes `promtool check metrics` (Debian's prometheus package; tests/run.sh installs it).
#[tokio::test]
async fn metrics_use_controller_runtime_names_and_pass_promtool() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "ok", &[("v", "0")]).await;
    put_configmap(&c.client, "default", "bad", &[("v", "0")]).await;
    let mut reg = register_configmaps("metered", 2);
    reg.backoff = Some(pb::Backoff {
        base: Some(secs(30.0)),
        max: Some(secs(60.0)),
    });
    let mut r = Replica::connect(&m.grpc, reg).await.expect("registered");
    for _ in 0..2 {
        let req = r.expect().await;
        if key(&req) == "default/bad" {
            r.reply(
                &req.id,
                pb::reconcile_result::Outcome::Error(pb::reconcile_result::Error {
                    message: "boom".into(),
                    retry_after: None,
                }),
            )
            .await;
        } else {
            r.done(&req.id).await;
        }
    }
    let scrape = || async {
        reqwest::get(format!("{}/metrics", m.http))
            .await
            .expect("metrics reachable")
            .text()
            .await
            .expect("text")
    };
    wait_for("both results counted", || async {
        let text = scrape().await;
        text.contains(r#"controller_runtime_reconcile_total{controller="metered",result="success",tenant="dev"} 1"#)
            && text.contains(r#"controller_runtime_reconcile_total{controller="metered",result="error",tenant="dev"} 1"#)
    })
    .await;
    let text = scrape().await;
    for series in [
        r#"controller_runtime_reconcile_errors_total{controller="metered",tenant="dev"} 1"#,
        r#"controller_runtime_reconcile_time_seconds_count{controller="metered",tenant="dev"} 2"#,
        r#"workqueue_depth{name="metered",tenant="dev"} 1"#,
        r#"ctrlhub_sessions{controller="metered",tenant="dev"} 1"#,
        r#"leader_election_master_status{name="ctrlhub-leader"} 1"#,
        r#"ctrlhub_informer_objects{form="full",group="",namespace="",resource="configmaps",selector=""} 2"#,
        r#"ctrlhub_informer_watch_restarts{form="full",group="",namespace="",resource="configmaps",selector=""} 0"#,
        "workqueue_queue_duration_seconds_bucket",
        "workqueue_adds_total",
        "process_resident_memory_bytes",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("scrape.txt");
    std::fs::write(&file, &text).expect("scrape saved");
    let out = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).expect("scrape readable"))
        .output()
        .expect("promtool is installed (tests/run.sh installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The leader labels its own pod (the Service that controllers dial selects that label) and
/// removes the label when it shuts down.
#[tokio::test]
async fn leader_labels_its_own_pod_for_the_service() {
    use k8s_openapi::api::core::v1::Pod;
    let c = start_cluster().await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ctrlhub-0", "namespace": "default"},
        "spec": {"containers": [{"name": "manager", "image": "ctrlhub"}]}});
    pods.patch(
        "ctrlhub-0",
        &PatchParams::apply("tests"),
        &Patch::Apply(pod),
    )
    .await
    .expect("pod");
    let label = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("ctrlhub.io/leader").cloned())
    };
    let mut m = Manager::start(
        &c,
        "ctrlhub-0",
        &[
            "--lease-namespace",
            "default",
            "--leader-pod-label",
            "ctrlhub.io/leader",
        ],
    )
    .await;
    m.wait_leading().await;
    wait_for("the leader labels its pod", || async {
        pods.get("ctrlhub-0")
            .await
            .is_ok_and(|p| label(&p).as_deref() == Some("true"))
    })
    .await;
    m.stop().await;
    let after = pods.get("ctrlhub-0").await.expect("pod still there");
    assert_eq!(
        label(&after),
        None,
        "a stopped leader no longer attracts controllers"
    );
}

/// A failed watch is counted in `ctrlhub_informer_watch_restarts` (what the CtrlhubWatchRestarts
/// dashboards look at), and the informer recovers: a change made after it is still delivered.
#[tokio::test]
async fn failed_watches_are_counted_as_restarts_and_recovered_from() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "before", &[("v", "0")]).await;
    // The informer's first list succeeds; its next two watch requests fail.
    c.dc.faults().fail_next("watch", "configmaps", 2, 500);
    let mut r = Replica::connect(&m.grpc, register_configmaps("restarts", 4))
        .await
        .expect("registered");
    let first = r.expect().await;
    assert_eq!(key(&first), "default/before");
    r.done(&first.id).await;
    let series = r#"ctrlhub_informer_watch_restarts{form="full",group="",namespace="",resource="configmaps",selector=""}"#;
    let restarts = || async { m.metric(series).await as u64 };
    wait_for("both failed watches counted", || async {
        restarts().await >= 2
    })
    .await;
    put_configmap(&c.client, "default", "after", &[("v", "0")]).await;
    let next = r.expect().await;
    assert_eq!(
        key(&next),
        "default/after",
        "the re-established watch delivers"
    );
}

/// The entry of controller `name` in `/status`, if it is there.
async fn status_entry(m: &Manager, name: &str) -> Option<serde_json::Value> {
    m.status().await["controllers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
}

/// A controller whose every replica died stays visible for the grace period: on `/status` with
/// no session and "sessionless" time, in `/metrics` (ctrlhub_sessions 0, its queue depth still
/// counting a change made meanwhile), and a replica registering again takes up its queue where
/// it was; with its replicas gone again it is removed once the grace is over. (It used to
/// vanish from every signal the moment its last session ended.)
#[tokio::test]
async fn a_dead_controller_stays_visible_for_its_grace() {
    let c = start_cluster().await;
    let m = Manager::start(&c, "m1", &["--controller-grace", "4s"]).await;
    m.wait_leading().await;
    let reg = register(
        "mortal",
        ctrlhub_tests::replica::configmaps(),
        1,
        Some("default"),
    );
    let r = Replica::connect(&m.grpc, reg.clone())
        .await
        .expect("registered");
    drop(r);
    let entry = poll_until("the controller without sessions", PATIENCE, || async {
        match status_entry(&m, "mortal").await {
            Some(e) if e["sessions"] == 0 && e["sessionlessSeconds"].is_number() => Ok(e),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(entry["tenant"], "dev");
    put_configmap(&c.client, "default", "while-dead", &[("v", "1")]).await;
    poll_until("its queue still counting", PATIENCE, || async {
        let depth = m
            .metric(r#"workqueue_depth{name="mortal",tenant="dev"}"#)
            .await;
        let sessions = m.try_metrics().await.map_err(|e| e.to_string())?;
        (depth >= 1.0
            && sessions.contains(r#"ctrlhub_sessions{controller="mortal",tenant="dev"} 0"#))
        .then_some(())
        .ok_or_else(|| format!("depth {depth}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let mut again = Replica::connect(&m.grpc, reg)
        .await
        .expect("registers again");
    let req = again.expect().await;
    assert_eq!(key(&req), "default/while-dead", "the queue was kept");
    again.done(&req.id).await;
    drop(again);
    poll_until("removed once the grace is over", PATIENCE, || async {
        status_entry(&m, "mortal")
            .await
            .map_or(Ok(()), |e| Err(format!("{e}")))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// `process_cpu_seconds_total` of the manager at `pid`, with the CPU ticks `/proc` reports for
/// it read just before and just after the scrape.
async fn cpu_seconds_between_ticks(m: &Manager, pid: u32) -> (u64, f64, u64) {
    let ticks = || {
        let stat =
            std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the manager's stat");
        // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
        let rest = &stat[stat.rfind(')').expect("comm") + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
    };
    let before = ticks();
    let seconds = m.metric("process_cpu_seconds_total").await;
    (before, seconds, ticks())
}

/// The manager observes itself: its Kubernetes API traffic by verb, resource and code with
/// latency (a slow and then frozen Lease shows), its build, its leader transitions, its gRPC
/// server's calls (a Connect stream counted when it opens and when it ends, never as a
/// latency), the concurrency its controllers' sessions give them, and CPU time to the tick.
#[tokio::test]
async fn the_manager_observes_its_api_traffic_grpc_port_build_and_cpu() {
    let c = start_cluster().await;
    let m = Manager::start(&c, "observed", &[]).await;
    m.wait_leading().await;
    let text = m.try_metrics().await.expect("metrics");
    let build = format!(
        r#"ctrlhub_build_info{{revision="{}",rustc="#,
        metric_label(&text, "ctrlhub_build_info", "revision")
    );
    assert!(text.contains(&build), "build info:\n{text}");
    assert!(
        text.contains(&format!(r#"version="{}"}} 1"#, env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert_eq!(
        m.metric(r#"ctrlhub_leader_transitions_total{name="ctrlhub-leader"}"#)
            .await,
        1.0,
        "this replica became leader once"
    );

    // Two replicas of a controller with no maximum of its own, four credits each.
    let mut reg = register(
        "busy",
        ctrlhub_tests::replica::configmaps(),
        4,
        Some("default"),
    );
    reg.max_concurrent_reconciles = 0;
    let a = Replica::connect(&m.grpc, reg.clone()).await.expect("a");
    let b = Replica::connect(&m.grpc, reg).await.expect("b");
    let connect = r#"grpc_method="Connect",grpc_service="ctrlhub.v1.ControllerManager",grpc_type="bidi_stream""#;
    wait_for("both streams counted as started", || async {
        m.metric(&format!("grpc_server_started_total{{{connect}}}"))
            .await
            >= 2.0
    })
    .await;
    assert_eq!(
        m.metric(r#"controller_runtime_max_concurrent_reconciles{controller="busy",tenant="dev"}"#)
            .await,
        8.0,
        "what the controller can run: its sessions' credits"
    );
    drop(a);
    wait_for("a stream that ended is handled (Canceled)", || async {
        m.metric(&format!(
            r#"grpc_server_handled_total{{grpc_code="Canceled",{connect}}}"#
        ))
        .await
            >= 1.0
    })
    .await;
    let text = m.try_metrics().await.expect("metrics");
    assert!(
        !text.contains(r#"grpc_server_handling_seconds_count{grpc_method="Connect""#),
        "a stream's lifetime is not a latency"
    );
    drop(b);

    // The Lease slow, then frozen: both show in the API-client series of the Lease's PUTs.
    c.dc.faults()
        .add_latency("*", "leases", Duration::from_millis(1500));
    let slow = |le: &str| {
        format!(
            r#"rest_client_request_duration_seconds_bucket{{resource="leases",verb="PUT",le="{le}"}}"#
        )
    };
    wait_for(
        "a Lease renewal slower than a second is observed",
        || async {
            let text = m.try_metrics().await.unwrap_or_default();
            let under_1s = metric_value(&text, &slow("1")).unwrap_or(0.0);
            let all = metric_value(&text, &slow("+Inf")).unwrap_or(0.0);
            all > under_1s
        },
    )
    .await;
    c.dc.faults().clear();
    c.dc.faults().freeze_lease("default", "ctrlhub-leader");
    wait_for("a frozen Lease's 503 is counted", || async {
        m.metric(r#"rest_client_requests_total{code="503",resource="leases",verb="PUT"}"#)
            .await
            >= 1.0
    })
    .await;
    c.dc.faults().clear();
    assert!(
        m.metric(r#"rest_client_requests_total{code="200",resource="configmaps",verb="LIST"}"#)
            .await
            >= 1.0,
        "the informer's list is counted too"
    );

    // CPU seconds to the tick: between the ticks /proc counted just before and after the
    // scrape (a count of whole seconds falls below them unless the ticks are a multiple of 100).
    let pid = m.process.pid();
    let (before, seconds, after) = cpu_seconds_between_ticks(&m, pid).await;
    let hz = String::from_utf8(
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .expect("getconf")
            .stdout,
    )
    .expect("utf-8")
    .trim()
    .parse::<f64>()
    .expect("a tick rate");
    println!("process_cpu_seconds_total {seconds} with /proc ticks {before}..{after} at {hz} Hz");
    assert!(
        seconds >= before as f64 / hz - 1e-9 && seconds <= after as f64 / hz + 1e-9,
        "process_cpu_seconds_total {seconds} is not the /proc ticks {before}..{after} / {hz}"
    );
}

/// The value of `label` in the first series of `metric` in `text`.
fn metric_label(text: &str, metric: &str, label: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{metric}{{")))
        .unwrap_or_else(|| panic!("no {metric} in\n{text}"));
    let start = line.find(&format!("{label}=\"")).expect("label") + label.len() + 2;
    line[start..]
        .split('"')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The manager's client keeps to `--kube-api-qps` and `--kube-api-burst`: a registration over
/// 20 namespaces makes it list and watch 20 informers, 40 requests, and devcluster never
/// receives more of them than the burst plus the rate allows, so they take at least
/// (40 - burst) / qps seconds.
#[tokio::test]
async fn the_managers_client_keeps_to_its_qps_and_burst() {
    const QPS: f64 = 5.0;
    const BURST: f64 = 5.0;
    let c = start_cluster().await;
    let names: Vec<String> = (0..20).map(|i| format!("qps-{i}")).collect();
    for n in &names {
        namespace(&c.client, n, &[]).await;
    }
    let m = Manager::start(
        &c,
        "paced",
        &["--kube-api-qps", "5", "--kube-api-burst", "5"],
    )
    .await;
    m.wait_leading().await;
    let stats = c.dc.stats();
    let count =
        || stats.request_count("list", "configmaps") + stats.request_count("watch", "configmaps");
    let before = count();
    let mut reg = register_configmaps("paced", 1);
    reg.namespaces = Some(ctrlhub_tests::replica::namespace_names(
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    let started = std::time::Instant::now();
    let registering = tokio::spawn({
        let grpc = m.grpc.clone();
        async move { Replica::connect(&grpc, reg).await }
    });
    let mut worst = 0.0f64;
    loop {
        let sent = (count() - before) as f64;
        let allowed = BURST + QPS * started.elapsed().as_secs_f64();
        worst = worst.max(sent - allowed);
        assert!(
            sent <= allowed + 1.0,
            "{sent} list/watch requests {:?} after the Register: more than burst {BURST} + {QPS}/s allow",
            started.elapsed()
        );
        if sent >= 40.0 {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "only {sent} of 40 requests");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    println!(
        "40 list/watch requests took {took:?} (burst {BURST}, {QPS}/s; worst excess {worst:.1})"
    );
    assert!(
        took >= Duration::from_secs_f64((40.0 - BURST) / QPS * 0.9),
        "40 requests in {took:?}"
    );
    registering
        .await
        .expect("joined")
        .expect("the registration is answered once every informer has listed");
    let waited = m
        .metric("rest_client_rate_limiter_duration_seconds_count")
        .await;
    assert!(
        waited >= 40.0,
        "every request went through the limiter: {waited}"
    );
}

/// A controller retired on purpose (its last replica drains with `retire`) is forgotten at
/// once, series and all, while one whose last replica merely went stays for the grace.
#[tokio::test]
async fn a_retired_controller_goes_at_once_and_a_dead_one_stays() {
    let c = start_cluster().await;
    let m = Manager::start(&c, "retire", &[]).await;
    m.wait_leading().await;
    let dead = Replica::connect(&m.grpc, register_configmaps("dead", 1))
        .await
        .expect("registered");
    drop(dead);
    let mut retired = Replica::connect(&m.grpc, register_configmaps("retired", 1))
        .await
        .expect("registered");
    let drain = pb::controller_message::Message::Drain(pb::Drain { retire: true });
    retired
        .answers()
        .send(pb::ControllerMessage {
            message: Some(drain),
        })
        .await
        .expect("sent");
    assert!(
        retired.ended(PATIENCE).await.is_some(),
        "drained: the stream ends"
    );
    poll_until("only the dead controller is kept", PATIENCE, || async {
        let kept = status_entry(&m, "dead").await;
        let gone = status_entry(&m, "retired").await;
        let series = m.try_metrics().await.map_err(|e| e.to_string())?;
        (kept.is_some_and(|e| e["sessions"] == 0)
            && gone.is_none()
            && !series.contains(r#"controller="retired""#)
            && !series.contains(r#"name="retired""#))
        .then_some(())
        .ok_or_else(|| format!("retired still listed: {gone:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A registration whose caches cannot finish their first lists within `--first-list-timeout`
/// is refused with UNAVAILABLE naming the flag, after that long in all (not per cache), and
/// registers once the API server answers in time again.
#[tokio::test]
async fn a_first_list_past_its_timeout_refuses_the_registration_and_names_the_flag() {
    let c = start_cluster().await;
    let m = Manager::start(&c, "first-list", &["--first-list-timeout", "2s"]).await;
    m.wait_leading().await;
    let secrets = pb::ResourceType {
        version: "v1".into(),
        kind: "Secret".into(),
        ..Default::default()
    };
    let mut registration = register("slow-lists", secrets, 1, None);
    // Two caches (the primary and an owned kind), each listed slowly: one deadline covers both.
    registration.owns = vec![pb::OwnedResource {
        resource: Some(replica::configmaps()),
        ..Default::default()
    }];
    let faults = c.dc.faults();
    faults.add_latency("list", "secrets", Duration::from_secs(5));
    faults.add_latency("list", "configmaps", Duration::from_secs(5));
    let started = std::time::Instant::now();
    let refused = Replica::connect(&m.grpc, registration.clone())
        .await
        .err()
        .expect("a registration whose lists take 5 s is refused with a 2 s timeout");
    let waited = started.elapsed();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("--first-list-timeout"),
        "{refused:?}"
    );
    assert!(
        waited < Duration::from_secs(4),
        "refused after {waited:?}: the timeout is for all caches together"
    );
    faults.clear();
    wait_for("it registers once lists are fast again", || async {
        Replica::connect(&m.grpc, registration.clone())
            .await
            .is_ok()
    })
    .await;
}

/// A cluster without the TenantPolicy CRD (the test cluster has none) runs on the flags'
/// limits: the manager says so once and asks again with a growing backoff, not every 0.8 s (it
/// did: the watcher's Init before each list reset the backoff, 151 lines in 3 minutes).
#[tokio::test]
async fn a_missing_tenant_policy_crd_is_said_once_and_listed_with_backoff() {
    let (_c, m) = setup().await;
    let lists = r#"rest_client_requests_total{code="404",resource="tenantpolicies",verb="LIST"}"#;
    wait_for("the first TenantPolicy list is answered 404", || async {
        m.metric(lists).await >= 1.0
    })
    .await;
    let first = m.metric(lists).await;
    let since = std::time::Instant::now();
    // Three more lists take 0.8 + 1.6 + 3.2 s with the watcher's doubling backoff, and 2.4 s
    // at 0.8 s apart; a busy machine only makes them later, so the lower bound cannot flake.
    wait_for("three more TenantPolicy lists", || async {
        m.metric(lists).await >= first + 3.0
    })
    .await;
    let took = since.elapsed();
    assert!(
        took >= Duration::from_secs(4),
        "three more TenantPolicy lists within {took:?}: the missing CRD is not backed off"
    );
    let log = std::fs::read_to_string(&m.log).expect("the manager's log");
    assert_eq!(
        log.matches("TenantPolicy objects are not served").count(),
        1,
        "the missing CRD is said once (log {})",
        m.log.display()
    );
}

/// Two informers on one resource that differ by label selector are two series of the informer
/// gauges, each with its own count (they were one series, holding whichever was set last).
#[tokio::test]
async fn informers_differing_by_selector_are_separate_series() {
    let (c, m) = setup().await;
    put_configmap(&c.client, "default", "plain", &[("v", "0")]).await;
    let _all = Replica::connect(&m.grpc, register_configmaps("all", 1))
        .await
        .expect("registered");
    let mut stamped = register_configmaps("stamped", 1);
    stamped.label_selector = Some(pb::LabelSelector {
        match_labels: [("stamp".to_string(), "yes".to_string())].into(),
        ..Default::default()
    });
    let _stamped = Replica::connect(&m.grpc, stamped)
        .await
        .expect("registered");
    let series = |selector: &str, n: u32| {
        format!(
            r#"ctrlhub_informer_objects{{form="full",group="",namespace="",resource="configmaps",selector="{selector}"}} {n}"#
        )
    };
    wait_for("both informers have their own series", || async {
        let text = m.try_metrics().await.unwrap_or_default();
        text.contains(&series("", 1)) && text.contains(&series("stamp=yes", 0))
    })
    .await;
}
