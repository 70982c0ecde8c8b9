//! OpenTelemetry traces across the gRPC hop: the real manager binary and a real SDK controller
//! process (memcached) export over OTLP/gRPC to a receiver running in this test process, and one
//! reconcile must come out as one trace — the manager's root `reconcile` span, its CLIENT
//! `dispatch` child, and the controller's SERVER `reconcile` span under that.

use ctrlhub_tests::*;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{Span, Status as SpanStatus};
use parking_lot::Mutex;
use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::Arc;

/// A span as received, with the `service.name` of the resource that sent it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    instance: Option<String>,
    /// Every attribute of the resource that sent it.
    resource: Vec<KeyValue>,
    span: Span,
}

/// An OTLP/gRPC trace receiver: what a collector would get.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut out = self.spans.lock();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| string_attr(&r.attributes, "service.name"))
                .unwrap_or_default();
            let instance = rs
                .resource
                .as_ref()
                .and_then(|r| string_attr(&r.attributes, "service.instance.id"));
            let resource = rs
                .resource
                .as_ref()
                .map(|r| r.attributes.clone())
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    out.push(Received {
                        service: service.clone(),
                        instance: instance.clone(),
                        resource: resource.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// Serve on a loopback port; returns the endpoint URL for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("receiver binds");
        let addr = listener.local_addr().expect("receiver address");
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        format!("http://{addr}")
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().clone()
    }

    /// The `service.instance.id` of the process that sent span `id`.
    fn instance(&self, id: &[u8]) -> Option<String> {
        self.spans
            .lock()
            .iter()
            .find(|r| r.span.span_id == id)
            .and_then(|r| r.instance.clone())
    }
}

fn value(attrs: &[KeyValue], key: &str) -> Option<any_value::Value> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|AnyValue { value }| value)
}

fn string_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    match value(attrs, key)? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

fn int_attr(attrs: &[KeyValue], key: &str) -> Option<i64> {
    match value(attrs, key)? {
        any_value::Value::IntValue(i) => Some(i),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn kind(span: &Span) -> SpanKind {
    SpanKind::try_from(span.kind).unwrap_or(SpanKind::Unspecified)
}

const MANAGER: &str = "ctrlhub";
/// The pod name the traced manager is given, as the Deployment's Downward API would.
const POD: &str = "ctrlhub-7d4b9c6f5-x2k8q";
const CONTROLLER: &str = "memcached-controller";

/// One reconcile's trace, as received.
struct Found {
    root: Received,
    dispatch: Received,
    server: Received,
}

/// The first manager root `reconcile` of `name` whose trace holds the CLIENT dispatch child and
/// the controller's SERVER span under it.
fn find_trace(spans: &[Received], name: &str) -> Option<Found> {
    let mut roots: Vec<&Received> = spans
        .iter()
        .filter(|r| {
            r.service == MANAGER
                && r.span.name == "reconcile"
                && r.span.parent_span_id.is_empty()
                && string_attr(&r.span.attributes, "k8s.object.name").as_deref() == Some(name)
        })
        .collect();
    roots.sort_by_key(|r| r.span.start_time_unix_nano);
    roots.into_iter().find_map(|root| {
        let dispatch = spans.iter().find(|d| {
            d.span.trace_id == root.span.trace_id
                && d.span.parent_span_id == root.span.span_id
                && d.span.name == "dispatch"
        })?;
        let server = spans.iter().find(|s| {
            s.span.trace_id == root.span.trace_id
                && s.span.parent_span_id == dispatch.span.span_id
                && s.service == CONTROLLER
        })?;
        Some(Found {
            root: root.clone(),
            dispatch: dispatch.clone(),
            server: server.clone(),
        })
    })
}

/// `name [KIND] service=… span=… parent=…`, children indented under their parents, then the
/// spans the root links to.
fn render(spans: &[Received], found: &Found) -> String {
    let trace: Vec<&Received> = spans
        .iter()
        .filter(|r| r.span.trace_id == found.root.span.trace_id)
        .collect();
    let mut out = format!("trace {}\n", hex(&found.root.span.trace_id));
    fn line(out: &mut String, r: &Received, depth: usize) {
        let parent = if r.span.parent_span_id.is_empty() {
            "-".to_string()
        } else {
            hex(&r.span.parent_span_id)
        };
        let outcome = string_attr(&r.span.attributes, "ctrlhub.outcome")
            .map(|o| format!(" outcome={o}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{}{} [{:?}] service={} span={} parent={}{}",
            "  ".repeat(depth + 1),
            r.span.name,
            kind(&r.span),
            r.service,
            hex(&r.span.span_id),
            parent,
            outcome
        );
    }
    fn walk(out: &mut String, trace: &[&Received], parent: &[u8], depth: usize) {
        let mut children: Vec<&&Received> = trace
            .iter()
            .filter(|r| r.span.parent_span_id == parent)
            .collect();
        children.sort_by_key(|r| r.span.start_time_unix_nano);
        for child in children {
            line(out, child, depth);
            walk(out, trace, &child.span.span_id, depth + 1);
        }
    }
    walk(&mut out, &trace, &[], 0);
    for link in &found.root.span.links {
        let target = spans
            .iter()
            .find(|r| r.span.span_id == link.span_id && r.span.trace_id == link.trace_id);
        let kind_attr = string_attr(&link.attributes, "ctrlhub.link").unwrap_or_default();
        match target {
            Some(t) => {
                let _ = writeln!(
                    out,
                    "  link ({kind_attr}) -> {} [{:?}] service={} trace={} span={}",
                    t.span.name,
                    kind(&t.span),
                    t.service,
                    hex(&t.span.trace_id),
                    hex(&t.span.span_id)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  link ({kind_attr}) -> (not received) trace={} span={}",
                    hex(&link.trace_id),
                    hex(&link.span_id)
                );
            }
        }
    }
    out
}

fn memcached_api(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "cache.example.com".into(),
        version: "v1alpha1".into(),
        api_version: "cache.example.com/v1alpha1".into(),
        kind: "Memcached".into(),
        plural: "memcacheds".into(),
    };
    Api::namespaced_with(client.clone(), "default", &ar)
}

async fn reconciled(api: &Api<DynamicObject>, name: &str) -> bool {
    let Ok(obj) = api.get(name).await else {
        return false;
    };
    obj.data
        .pointer("/status/observedGeneration")
        .and_then(|g| g.as_i64())
        == obj.metadata.generation
}

/// SIGTERM a child and wait for it to exit (graceful: drain, then flush spans).
async fn terminate(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("controller exits within PATIENCE after SIGTERM")
        .expect("controller exit status");
}

#[tokio::test]
async fn one_reconcile_is_one_trace_across_the_grpc_hop() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let c = start_cluster().await;
    let mut launch = Launch::for_tests();
    launch.env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("CTRLHUB_LOG_FORMAT", "json"),
        // What deploy/'s Deployment passes from the Downward API.
        ("POD_NAME", POD),
        ("POD_NAMESPACE", "ctrlhub-system"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut manager = Manager::launch(&c, "traces", &[], &launch)
        .await
        .expect("manager starts");
    println!("manager logs to {}", manager.log.display());
    manager.wait_leading().await;

    // The controller's batch processor waits 10 minutes between exports, so its spans can only
    // reach the receiver through the flush on shutdown (SIGTERM) — which this test relies on.
    let log = std::env::temp_dir().join(format!("memcached-traces-{}.log", free_port()));
    println!("memcached controller logs to {}", log.display());
    let mut controller = tokio::process::Command::new(bin("memcached-controller"))
        .args([
            "--manager",
            &manager.grpc,
            "--token",
            "dev",
            "--install-crd",
        ])
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env("RUST_LOG", "info")
        .args(["--log-format", "json"])
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(&log)
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .kill_on_drop(true)
        .spawn()
        .expect("memcached-controller starts");

    let name = "traced";
    let api = memcached_api(&c.client);
    wait_for("the Memcached CRD is served", || async {
        api.list(&Default::default()).await.is_ok()
    })
    .await;
    let obj = serde_json::json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"size": 1}});
    api.patch(
        name,
        &PatchParams::apply("tests").force(),
        &Patch::Apply(obj),
    )
    .await
    .expect("memcached applied");
    wait_for("the controller reconciled the Memcached", || {
        reconciled(&api, name)
    })
    .await;
    wait_for("the manager exported a reconcile root span", || async {
        receiver.spans().iter().any(|r| {
            r.service == MANAGER
                && r.span.name == "reconcile"
                && string_attr(&r.span.attributes, "k8s.object.name").as_deref() == Some(name)
        })
    })
    .await;
    assert!(
        !receiver.spans().iter().any(|r| r.service == CONTROLLER),
        "the controller's spans wait in its batch processor until shutdown"
    );

    terminate(&mut controller).await;
    wait_for("one trace spans manager and controller", || async {
        find_trace(&receiver.spans(), name).is_some()
    })
    .await;
    // The manager's remaining spans are flushed when it stops.
    manager.stop().await;

    let spans = receiver.spans();
    let found = find_trace(&spans, name).expect("the trace found above");
    let tree = render(&spans, &found);
    println!("{tree}");
    let path = target_dir().join("trace-tree.txt");
    std::fs::write(&path, &tree).expect("trace tree written");
    println!("span tree written to {}", path.display());

    let Found {
        root,
        dispatch,
        server,
    } = &found;
    let lines = logs_join_the_trace(&found, &manager.log, &log);
    let path = target_dir().join("trace-logs.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").expect("log lines written");
    println!(
        "the reconcile's JSON log lines (also in {}):",
        path.display()
    );
    for line in &lines {
        println!("{line}");
    }

    // Span kinds and services.
    assert_eq!(kind(&root.span), SpanKind::Internal, "root: {root:?}");
    assert_eq!(
        kind(&dispatch.span),
        SpanKind::Client,
        "dispatch: {dispatch:?}"
    );
    assert_eq!(kind(&server.span), SpanKind::Server, "server: {server:?}");
    assert_eq!(root.service, MANAGER);
    assert_eq!(dispatch.service, MANAGER);
    assert_eq!(server.service, CONTROLLER);
    assert_eq!(server.span.name, "reconcile");
    // Replicas can be told apart: each process names its instance, and the controller's span
    // carries the session id it logged at registration.
    let logged_session = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["fields"]["message"] == "registered with manager")
        .and_then(|l| l["fields"]["session_id"].as_str().map(str::to_string));
    assert!(
        logged_session.is_some(),
        "the controller logs its session id"
    );
    assert_eq!(
        string_attr(&server.span.attributes, "ctrlhub.session.id"),
        logged_session,
        "the span names the session the controller logged"
    );
    for r in [root, server] {
        let instance = receiver.instance(&r.span.span_id);
        assert!(
            instance.as_deref().is_some_and(|i| !i.is_empty()),
            "{} reports service.instance.id",
            r.service
        );
    }
    // One trace: the controller's span is the dispatch span's child, across processes.
    assert_eq!(dispatch.span.trace_id, root.span.trace_id);
    assert_eq!(server.span.trace_id, root.span.trace_id);
    assert_eq!(server.span.parent_span_id, dispatch.span.span_id);
    // Attributes of the attempt.
    let attrs = &root.span.attributes;
    assert_eq!(
        string_attr(attrs, "ctrlhub.controller").as_deref(),
        Some("memcached")
    );
    assert_eq!(string_attr(attrs, "ctrlhub.tenant").as_deref(), Some("dev"));
    assert_eq!(
        string_attr(attrs, "k8s.namespace.name").as_deref(),
        Some("default")
    );
    assert_eq!(string_attr(attrs, "k8s.object.name").as_deref(), Some(name));
    assert_eq!(int_attr(attrs, "ctrlhub.attempt"), Some(1), "first attempt");
    // memcached answers "requeue after" to poll its Deployment; both sides record the same
    // outcome, and it is not a failure.
    let outcome = string_attr(attrs, "ctrlhub.outcome");
    assert!(
        matches!(
            outcome.as_deref(),
            Some("success" | "requeue" | "requeue_after")
        ),
        "the reconcile succeeded: {outcome:?}"
    );
    assert_eq!(
        string_attr(&dispatch.span.attributes, "ctrlhub.outcome"),
        outcome
    );
    assert_eq!(
        string_attr(&server.span.attributes, "ctrlhub.outcome"),
        outcome
    );
    assert_eq!(
        string_attr(&server.span.attributes, "ctrlhub.request.id"),
        string_attr(&dispatch.span.attributes, "ctrlhub.request.id"),
        "both sides name the same request"
    );
    for s in [root, dispatch, server] {
        let code = s.span.status.as_ref().map(|SpanStatus { code, .. }| *code);
        assert_ne!(
            code,
            Some(StatusCode::Error as i32),
            "a successful reconcile is not an error: {s:?}"
        );
        assert!(
            string_attr(&s.span.attributes, "authorization").is_none()
                && !s.span.attributes.iter().any(|kv| {
                    let v = format!("{:?}", kv.value);
                    v.contains("Bearer") || v.contains("\"spec\"")
                }),
            "no token or object content in spans: {s:?}"
        );
    }
    // The watch event that queued the key is an event on the attempt, at the time it came,
    // not a trace of its own.
    let enqueues: Vec<_> = root
        .span
        .events
        .iter()
        .filter(|e| e.name == "enqueue")
        .collect();
    assert!(
        !enqueues.is_empty() && enqueues.len() <= 8,
        "the root span records 1 to 8 enqueue events: {:?}",
        root.span.events
    );
    assert!(
        enqueues
            .iter()
            .all(|e| e.time_unix_nano <= root.span.start_time_unix_nano),
        "enqueued before the attempt started"
    );
    // A live change, or the registration's first list if that came first: either way, the lane.
    let lane = string_attr(&enqueues[0].attributes, "ctrlhub.priority");
    assert!(
        matches!(lane.as_deref(), Some("live" | "background")),
        "{lane:?}"
    );
    manager_traces_are_attempts_with_their_pod(&spans);
}

/// Every span the manager exported names its release and its pod, and belongs to an attempt:
/// no trace of the manager's is a lone `enqueue` (or anything else that is not an attempt).
fn manager_traces_are_attempts_with_their_pod(spans: &[Received]) {
    let manager: Vec<&Received> = spans.iter().filter(|r| r.service == MANAGER).collect();
    assert!(!manager.is_empty());
    for r in &manager {
        let attr = |k: &str| string_attr(&r.resource, k);
        assert_eq!(
            attr("service.version").as_deref(),
            Some(env!("CARGO_PKG_VERSION")),
            "{:?}",
            r.resource
        );
        assert_eq!(attr("k8s.pod.name").as_deref(), Some(POD));
        assert_eq!(
            attr("k8s.namespace.name").as_deref(),
            Some("ctrlhub-system")
        );
        assert_eq!(
            r.instance.as_deref(),
            Some(POD),
            "service.instance.id is the pod's name, stable across restarts"
        );
    }
    let names: std::collections::BTreeSet<&str> =
        manager.iter().map(|r| r.span.name.as_str()).collect();
    assert!(!names.contains("enqueue"), "no enqueue spans: {names:?}");
    for root in manager.iter().filter(|r| r.span.parent_span_id.is_empty()) {
        assert!(
            ["reconcile", "event"].contains(&root.span.name.as_str()),
            "a manager trace that is not an attempt: {root:?}"
        );
    }
}

/// The JSON log lines of the traced reconcile, from both processes: the controller's lines
/// inside the reconcile carry its SERVER span's `trace_id` and `span_id`, and the manager's
/// `result` line (debug) the trace id and its root span's id.
fn logs_join_the_trace(
    found: &Found,
    manager_log: &std::path::Path,
    controller_log: &std::path::Path,
) -> Vec<String> {
    let trace_id = hex(&found.root.span.trace_id);
    let read = |path: &std::path::Path| -> Vec<(String, serde_json::Value)> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| Some((l.to_string(), serde_json::from_str(l).ok()?)))
            .collect()
    };
    let controller: Vec<(String, serde_json::Value)> = read(controller_log)
        .into_iter()
        .filter(|(_, v)| v["span"]["trace_id"] == trace_id.as_str())
        .collect();
    assert!(
        controller.len() >= 2,
        "the controller's log lines of the reconcile carry trace_id {trace_id} ({})",
        controller_log.display()
    );
    for (line, v) in &controller {
        assert_eq!(v["span"]["name"], "reconcile", "{line}");
        assert_eq!(
            v["span"]["span_id"],
            hex(&found.server.span.span_id).as_str(),
            "{line}"
        );
    }
    let manager: Vec<(String, serde_json::Value)> = read(manager_log)
        .into_iter()
        .filter(|(_, v)| v["fields"]["trace_id"] == trace_id.as_str())
        .collect();
    assert!(
        manager
            .iter()
            .any(|(_, v)| v["fields"]["message"] == "result"
                && v["fields"]["span_id"] == hex(&found.root.span.span_id).as_str()),
        "the manager's result line carries the trace ({}): {manager:?}",
        manager_log.display()
    );
    manager
        .into_iter()
        .chain(controller)
        .map(|(l, _)| l)
        .collect()
}

/// A reconcile whose session ends under it (the manager dies) never answers: the controller
/// exports its span as `lost` with an error status, not as an unfinished success.
#[tokio::test]
async fn a_reconcile_cut_off_by_its_session_is_exported_as_lost() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let c = start_cluster().await;
    let mut manager = Manager::start_with_env(
        &c,
        "lost",
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    manager.wait_leading().await;
    let dir = tempfile::tempdir().expect("log dir");
    let log = dir.path().join("reconciles.log");
    let _controller = tokio::process::Command::new(bin("fault-controller"))
        .args([
            "--manager",
            &manager.grpc,
            "--name",
            "r1",
            "--namespace",
            "default",
        ])
        .args(["--work-ms", "600000", "--concurrency", "1"])
        .arg("--log")
        .arg(&log)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("fault-controller starts");
    put_configmap(&c.client, "default", "cut", &[("k", "v")]).await;
    wait_for("the controller works on default/cut", || async {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains(" start default/cut "))
    })
    .await;
    manager.kill().await;
    wait_for("the cut-off reconcile is exported", || async {
        receiver.spans().iter().any(|r| {
            r.service == "fault-controller"
                && r.span.name == "reconcile"
                && string_attr(&r.span.attributes, "k8s.object.name").as_deref() == Some("cut")
        })
    })
    .await;
    let spans = receiver.spans();
    let span = spans
        .iter()
        .find(|r| {
            r.service == "fault-controller"
                && string_attr(&r.span.attributes, "k8s.object.name").as_deref() == Some("cut")
        })
        .expect("found above");
    assert_eq!(
        string_attr(&span.span.attributes, "ctrlhub.outcome").as_deref(),
        Some("lost"),
        "{span:?}"
    );
    let status = span.span.status.clone().expect("a status");
    assert_eq!(status.code, StatusCode::Error as i32, "{span:?}");
}

#[tokio::test]
async fn without_an_otlp_endpoint_requests_carry_no_traceparent() {
    let c = start_cluster().await;
    let manager = Manager::start(&c, "untraced", &[]).await;
    manager.wait_leading().await;
    let mut replica = Replica::connect(&manager.grpc, register_configmaps("untraced", 1))
        .await
        .expect("registers");
    put_configmap(&c.client, "default", "untraced", &[("k", "v")]).await;
    let request = loop {
        let r = replica.expect().await;
        replica.done(&r.id).await;
        if key(&r) == "default/untraced" {
            break r;
        }
    };
    assert_eq!(request.traceparent, "", "tracing is off: no trace context");
    assert_eq!(request.tracestate, "");
}

#[tokio::test]
async fn an_unsampled_trace_still_sends_its_traceparent_and_exports_nothing() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let c = start_cluster().await;
    let mut manager = Manager::start_with_env(
        &c,
        "unsampled",
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_TRACES_SAMPLER", "always_off"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    manager.wait_leading().await;
    let mut replica = Replica::connect(&manager.grpc, register_configmaps("unsampled", 1))
        .await
        .expect("registers");
    put_configmap(&c.client, "default", "unsampled", &[("k", "v")]).await;
    let request = loop {
        let r = replica.expect().await;
        replica.done(&r.id).await;
        if key(&r) == "default/unsampled" {
            break r;
        }
    };
    // version-traceid-spanid-flags, with the sampled flag clear so the controller does not
    // sample either (parent-based sampling).
    let parts: Vec<&str> = request.traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {:?}", request.traceparent);
    assert_eq!(parts[0], "00");
    assert_eq!(parts[1].len(), 32);
    assert_ne!(parts[1], "0".repeat(32));
    assert_eq!(parts[2].len(), 16);
    assert_eq!(parts[3], "00", "not sampled: {:?}", request.traceparent);
    // Stopping flushes the exporter, so anything sampled would have arrived by now.
    manager.stop().await;
    assert!(
        receiver.spans().is_empty(),
        "always_off exports no spans: {:?}",
        receiver.spans()
    );
}

/// The next request for `default/<name>`, answering every other key Done.
async fn request_for(replica: &mut Replica, name: &str) -> ctrlhub_proto::v1::ReconcileRequest {
    let want = format!("default/{name}");
    loop {
        let r = replica.expect().await;
        if key(&r) == want {
            return r;
        }
        replica.done(&r.id).await;
    }
}

/// The manager's `reconcile` root span for `name` at `attempt`, once exported.
fn root_of(spans: &[Received], name: &str, attempt: i64) -> Option<Received> {
    spans
        .iter()
        .find(|r| {
            r.service == MANAGER
                && r.span.name == "reconcile"
                && string_attr(&r.span.attributes, "k8s.object.name").as_deref() == Some(name)
                && int_attr(&r.span.attributes, "ctrlhub.attempt") == Some(attempt)
        })
        .cloned()
}

/// The `dispatch` child of `root`.
fn dispatch_of(spans: &[Received], root: &Received) -> Option<Received> {
    spans
        .iter()
        .find(|d| d.span.name == "dispatch" && d.span.parent_span_id == root.span.span_id)
        .cloned()
}

#[tokio::test]
async fn a_failed_attempt_is_an_error_span_and_its_retry_links_to_it() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let c = start_cluster().await;
    let manager = Manager::start_with_env(
        &c,
        "retries",
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    manager.wait_leading().await;
    let mut replica = Replica::connect(&manager.grpc, register_configmaps("retries", 1))
        .await
        .expect("registers");
    put_configmap(&c.client, "default", "flaky", &[("k", "v")]).await;
    let first = request_for(&mut replica, "flaky").await;
    replica
        .reply(
            &first.id,
            ctrlhub_proto::v1::reconcile_result::Outcome::Error(
                ctrlhub_proto::v1::reconcile_result::Error {
                    message: "boom".into(),
                    retry_after: None,
                },
            ),
        )
        .await;
    let second = request_for(&mut replica, "flaky").await;
    assert_eq!(second.attempt, 2);
    replica.done(&second.id).await;

    wait_for("both attempts exported", || async {
        let spans = receiver.spans();
        [1, 2]
            .into_iter()
            .all(|n| root_of(&spans, "flaky", n).is_some_and(|r| dispatch_of(&spans, &r).is_some()))
    })
    .await;
    let spans = receiver.spans();
    let failed = root_of(&spans, "flaky", 1).expect("attempt 1");
    let retried = root_of(&spans, "flaky", 2).expect("attempt 2");
    // Each request carries its own dispatch span's context, sampled.
    for (request, root) in [(&first, &failed), (&second, &retried)] {
        let dispatch = dispatch_of(&spans, root).expect("dispatch span");
        assert_eq!(
            request.traceparent,
            format!(
                "00-{}-{}-01",
                hex(&dispatch.span.trace_id),
                hex(&dispatch.span.span_id)
            )
        );
    }
    assert_ne!(
        failed.span.trace_id, retried.span.trace_id,
        "one trace per attempt"
    );
    assert_eq!(
        string_attr(&failed.span.attributes, "ctrlhub.outcome").as_deref(),
        Some("error")
    );
    let status = failed.span.status.clone().expect("an error status");
    assert_eq!(status.code, StatusCode::Error as i32);
    assert_eq!(status.message, "boom");
    assert_eq!(
        string_attr(&retried.span.attributes, "ctrlhub.outcome").as_deref(),
        Some("success")
    );
    assert!(
        retried.span.links.iter().any(|l| {
            l.span_id == failed.span.span_id
                && l.trace_id == failed.span.trace_id
                && string_attr(&l.attributes, "ctrlhub.link").as_deref() == Some("previous_attempt")
        }),
        "the retry links to the failed attempt: {:?}",
        retried.span.links
    );
}

#[tokio::test]
async fn events_mode_deliveries_carry_a_traceparent() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let c = start_cluster().await;
    let manager = Manager::start_with_env(
        &c,
        "events",
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    manager.wait_leading().await;
    let mut register = register_configmaps("events", 1);
    register.mode = ctrlhub_proto::v1::register::Mode::Events as i32;
    register.max_concurrent_reconciles = 0;
    let mut replica = Replica::connect(&manager.grpc, register)
        .await
        .expect("registers");
    put_configmap(&c.client, "default", "evented", &[("k", "v")]).await;
    let event = loop {
        let e = replica.next_event(PATIENCE).await.expect("an event");
        replica.ack(&e.id).await;
        if e.key.as_ref().is_some_and(|k| k.name == "evented") {
            break e;
        }
    };
    let parts: Vec<&str> = event.traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent {:?}", event.traceparent);
    wait_for("the event's dispatch span is exported", || async {
        receiver.spans().iter().any(|r| {
            r.span.name == "dispatch"
                && kind(&r.span) == SpanKind::Client
                && hex(&r.span.span_id) == parts[2]
                && hex(&r.span.trace_id) == parts[1]
        })
    })
    .await;
    let spans = receiver.spans();
    let root = spans
        .iter()
        .find(|r| r.span.name == "event" && hex(&r.span.trace_id) == parts[1])
        .expect("the delivery's root span is named event");
    assert!(root.span.parent_span_id.is_empty());
    assert_eq!(
        string_attr(&root.span.attributes, "k8s.object.name").as_deref(),
        Some("evented")
    );
}

/// `ctrlhub dev` runs the demo controller in the manager's process, yet its spans are its own
/// service's: one trace from the manager's `ctrlhub` into `memcached-controller`.
#[tokio::test]
async fn in_ctrlhub_dev_the_controller_exports_as_its_own_service() {
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = tokio::process::Command::new(bin("ctrlhub"))
        .arg("dev")
        .args(["--grpc-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--exit-when-ready")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE.saturating_mul(2), out)
        .await
        .expect("ctrlhub dev finishes")
        .expect("output");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Both pipelines were flushed on the way out.
    let spans = receiver.spans();
    let found = find_trace(&spans, "memcached-sample");
    let found = found.unwrap_or_else(|| {
        let services: std::collections::BTreeSet<_> =
            spans.iter().map(|r| (&r.service, &r.span.name)).collect();
        panic!("no trace from ctrlhub into memcached-controller; spans: {services:?}")
    });
    assert_eq!(found.server.service, CONTROLLER);
    assert_eq!(found.root.service, MANAGER);
    assert!(
        !spans
            .iter()
            .any(|r| r.service == MANAGER && kind(&r.span) == SpanKind::Server),
        "no controller span under the manager's service name"
    );
}

/// One tenant name everywhere: a ServiceAccount's controller is shown, counted and traced under
/// its tenant as limits count it (`system:serviceaccounts:<namespace>`), the name the
/// dashboards' `tenant` variable takes from the metrics and the Traces dashboard filters spans
/// by; the identity that registered it is shown beside it.
#[tokio::test]
async fn spans_metrics_and_the_page_name_the_tenant_alike() {
    const TENANT: &str = "system:serviceaccounts:team-t";
    const IDENTITY: &str = "system:serviceaccount:team-t:ctl";
    let receiver = Receiver::default();
    let endpoint = receiver.start().await;
    let c = start_cluster().await;
    let m = Manager::start_with_env(
        &c,
        "tenant-names",
        &ctrlhub_tests::rbac::RBAC_ARGS,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    m.wait_leading().await;
    let auth = ctrlhub_tests::rbac::tenant(&c, "team-t", "ctl").await;
    ctrlhub_tests::rbac::grant_configmaps(&c, "team-t", "ctl", Some("team-t")).await;
    let reg = ctrlhub_tests::rbac::configmaps_in("named", &["team-t"]);
    let mut replica = Replica::connect_with(&m.grpc, reg, Some(&auth))
        .await
        .expect("registers");
    put_configmap(&c.client, "team-t", "who", &[("k", "v")]).await;
    let r = replica.expect().await;
    replica.done(&r.id).await;

    wait_for("the attempt's root span is exported", || async {
        root_of(&receiver.spans(), "who", 1).is_some()
    })
    .await;
    let root = root_of(&receiver.spans(), "who", 1).expect("found above");
    let attrs = &root.span.attributes;
    assert_eq!(
        string_attr(attrs, "ctrlhub.tenant").as_deref(),
        Some(TENANT)
    );
    assert_eq!(
        string_attr(attrs, "ctrlhub.identity").as_deref(),
        Some(IDENTITY)
    );

    let series = format!(
        r#"controller_runtime_reconcile_total{{controller="named",result="success",tenant="{TENANT}"}}"#
    );
    wait_for("the reconcile is counted under the tenant", || async {
        m.metric(&series).await >= 1.0
    })
    .await;
    let status = m.status().await;
    let entry = status["controllers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "named"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(entry["tenant"], TENANT, "{status}");
    assert_eq!(entry["identity"], IDENTITY, "{status}");
    assert_eq!(status["tenants"][0]["tenant"], TENANT, "{status}");
    let page = m
        .get("/?refresh=0")
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("page text");
    assert!(
        page.contains(&format!("<tr data-tenant=\"{TENANT}\">")),
        "the tenants table names the tenant"
    );
    assert!(
        page.contains(&format!("data-tenant=\"{TENANT}\" data-name=\"named\"")),
        "the controller's card names the tenant"
    );
    assert!(
        page.contains(&format!("data-identity=\"{IDENTITY}\"")),
        "and shows who registered it"
    );
    // The Traces dashboard filters `span.ctrlhub.tenant` by the tenants Prometheus knows.
    let traces: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../dashboards/grafana/ctrlhub-traces.json"),
        )
        .expect("traces dashboard"),
    )
    .expect("JSON");
    let filters = traces.to_string();
    assert!(filters.contains(r#"span.ctrlhub.tenant =~ \"${tenant:regex}\""#));
    assert!(filters.contains(
        r#"label_values(ctrlhub_sessions{job=\"$job\", namespace=\"$namespace\"}, tenant)"#
    ));
    let sessions = format!(r#"ctrlhub_sessions{{controller="named",tenant="{TENANT}"}}"#);
    assert_eq!(
        m.metric(&sessions).await,
        1.0,
        "the variable's source names the tenant so"
    );
}

/// A manager that cannot start says why as its last log line, in the log format it was asked
/// for: under `--log-format json` that line is JSON too, so a log collector keeps it.
#[tokio::test]
async fn a_fatal_error_is_logged_as_json_under_log_format_json() {
    let out = tokio::process::Command::new(Launch::for_tests().binary)
        .args(["--log-format", "json", "run", "--kubeconfig"])
        .arg("/nonexistent/ctrlhub-kubeconfig")
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE, out)
        .await
        .expect("ctrlhub exits")
        .expect("output");
    assert_eq!(out.status.code(), Some(1), "a fatal error exits 1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let last = lines.last().expect("at least one line");
    assert_eq!(last["level"], "ERROR", "{stderr}");
    let error = last["fields"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("reading kubeconfig /nonexistent/ctrlhub-kubeconfig"),
        "the cause, whole: {stderr}"
    );
}
