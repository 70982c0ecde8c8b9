//! deploy/: every overlay renders with kubectl's kustomize and applies with
//! `kubectl apply --server-side` to devcluster, and the manager started with the rendered
//! Deployment's own arguments and environment becomes ready there.

use ctrlhub_tests::*;
use std::io::Write;
use std::process::{Command, Stdio};

fn kubectl(
    cluster: &Cluster,
    cache: &std::path::Path,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> String {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(args);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl runs");
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input).expect("stdin written");
    }
    let out = child.wait_with_output().expect("kubectl finishes");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// kubectl runs as a blocking child process; devcluster keeps serving on the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_overlays_apply_with_kubectl() {
    let c = start_cluster().await;
    install_monitoring_crds(&c);
    namespace(&c.client, "team-a", &[]).await;
    namespace(&c.client, "team-b", &[]).await;
    let cache = tempfile::tempdir().expect("cache dir");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for overlay in ["cluster-wide", "namespaced"] {
        let dir = repo.join("deploy/overlays").join(overlay);
        let rendered = kubectl(
            &c,
            cache.path(),
            &["kustomize", &dir.to_string_lossy()],
            None,
        );
        let applied = kubectl(
            &c,
            cache.path(),
            &[
                "apply",
                "--server-side",
                "--field-manager=ctrlhub-deploy",
                "-f",
                "-",
            ],
            Some(rendered.as_bytes()),
        );
        for kind in [
            "poddisruptionbudget",
            "networkpolicy",
            "servicemonitor",
            "prometheusrule",
            "configmap",
        ] {
            assert!(
                applied
                    .lines()
                    .any(|l| l.starts_with(&format!("{kind}."))
                        || l.starts_with(&format!("{kind}/"))),
                "{overlay}: {kind} applied: {applied}"
            );
        }
        assert!(
            applied.contains("deployment.apps/ctrlhub"),
            "{overlay}: {applied}"
        );
        let deployment: serde_json::Value = serde_json::from_str(&kubectl(
            &c,
            cache.path(),
            &[
                "get",
                "deployment",
                "ctrlhub",
                "-n",
                "ctrlhub-system",
                "-o",
                "json",
            ],
            None,
        ))
        .expect("json");
        assert_eq!(
            deployment["spec"]["replicas"], 2,
            "{overlay}: a leader and a standby"
        );
        let selector = kubectl(
            &c,
            cache.path(),
            &[
                "get",
                "service",
                "ctrlhub",
                "-n",
                "ctrlhub-system",
                "-o",
                "jsonpath={.spec.selector}",
            ],
            None,
        );
        assert!(
            selector.contains(r#""ctrlhub.io/leader":"true""#),
            "{overlay}: the controllers' Service selects the leader: {selector}"
        );
    }
    let bindings = kubectl(
        &c,
        cache.path(),
        &[
            "get",
            "rolebinding",
            "ctrlhub-cache-reader",
            "-n",
            "team-b",
            "-o",
            "name",
        ],
        None,
    );
    assert_eq!(
        bindings.trim(),
        "rolebinding.rbac.authorization.k8s.io/ctrlhub-cache-reader"
    );
}

/// The Prometheus Operator's kinds, reduced to what a cluster needs to accept the objects: the
/// monitoring component targets clusters that run the operator.
fn install_monitoring_crds(c: &Cluster) {
    let cache = tempfile::tempdir().expect("cache dir");
    for (plural, kind) in [
        ("servicemonitors", "ServiceMonitor"),
        ("prometheusrules", "PrometheusRule"),
    ] {
        let crd = serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
            "spec": {
                "group": "monitoring.coreos.com",
                "names": {"plural": plural, "kind": kind, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                }],
            },
        });
        kubectl(
            c,
            cache.path(),
            &["apply", "-f", "-"],
            Some(crd.to_string().as_bytes()),
        );
    }
}

/// What the kubelet would resolve for one `env` entry of the Deployment's container.
fn resolve_env(pod: &str, entry: &serde_json::Value) -> String {
    if let Some(v) = entry["value"].as_str() {
        return v.to_string();
    }
    let from = &entry["valueFrom"];
    match from["fieldRef"]["fieldPath"].as_str() {
        Some("metadata.name") => return pod.to_string(),
        Some("metadata.namespace") => return "ctrlhub-system".to_string(),
        Some(other) => panic!("the test does not resolve fieldRef {other}"),
        None => {}
    }
    panic!("the test does not resolve env source {from}")
}

// The Deployment is the contract between deploy/ and the binary: its args, env and probes must
// start a manager that becomes ready. Only what a cluster supplies is stood in for: the pod
// (created in devcluster so the leader can label it), the API server (KUBECONFIG instead of the
// in-cluster config) and loopback ports instead of the container's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_starts_with_the_deployments_own_args_and_env() {
    let c = start_cluster().await;
    install_monitoring_crds(&c);
    let cache = tempfile::tempdir().expect("cache dir");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rendered = kubectl(
        &c,
        cache.path(),
        &[
            "kustomize",
            &repo.join("deploy/overlays/cluster-wide").to_string_lossy(),
        ],
        None,
    );
    kubectl(
        &c,
        cache.path(),
        &["apply", "--server-side", "-f", "-"],
        Some(rendered.as_bytes()),
    );
    let deployment: serde_json::Value = serde_json::from_str(&kubectl(
        &c,
        cache.path(),
        &[
            "get",
            "deployment",
            "ctrlhub",
            "-n",
            "ctrlhub-system",
            "-o",
            "json",
        ],
        None,
    ))
    .expect("json");
    let template = &deployment["spec"]["template"];
    let container = &template["spec"]["containers"][0];
    let pod = "ctrlhub-7d9f-abcde";
    kubectl(
        &c,
        cache.path(),
        &["create", "-f", "-"],
        Some(
            serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": "ctrlhub-system", "labels": template["metadata"]["labels"]},
                "spec": template["spec"]})
            .to_string()
            .as_bytes(),
        ),
    );

    let ports: std::collections::HashMap<String, u16> = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("port name").to_string(),
                u16::try_from(p["containerPort"].as_u64().expect("containerPort")).expect("port"),
            )
        })
        .collect();
    let mut local: std::collections::HashMap<u16, u16> = std::collections::HashMap::new();
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| {
            let a = a.as_str().expect("string arg");
            match a.rsplit_once(':') {
                Some(("0.0.0.0", port)) => {
                    let port: u16 = port.parse().expect("port");
                    let free = *local.entry(port).or_insert_with(free_port);
                    format!("127.0.0.1:{free}")
                }
                _ => a.to_string(),
            }
        })
        .collect();
    let mut cmd = tokio::process::Command::new(bin("ctrlhub"));
    cmd.args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", &c.kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut env_names = Vec::new();
    for entry in container["env"].as_array().expect("env") {
        let name = entry["name"].as_str().expect("env name");
        env_names.push(name.to_string());
        cmd.env(name, resolve_env(pod, entry));
    }
    assert!(
        env_names.iter().any(|n| n == "CTRLHUB_IDENTITY")
            && env_names.iter().any(|n| n == "CTRLHUB_LEASE_NAMESPACE"),
        "the Deployment passes the pod's identity: {env_names:?}"
    );
    let mut child = cmd.spawn().expect("ctrlhub starts");

    let probe_url = |probe: &str| {
        let p = &container[probe]["httpGet"];
        let port = match &p["port"] {
            serde_json::Value::String(name) => ports[name],
            other => u16::try_from(other.as_u64().expect("probe port")).expect("port"),
        };
        let local_port = local
            .get(&port)
            .copied()
            .expect("the probe's port is one the args bind");
        // The kubelet probes with the scheme the probe names and does not verify certificates.
        let scheme = p["scheme"].as_str().unwrap_or("HTTP").to_ascii_lowercase();
        format!(
            "{scheme}://127.0.0.1:{local_port}{}",
            p["path"].as_str().expect("probe path")
        )
    };
    let (live, ready) = (probe_url("livenessProbe"), probe_url("readinessProbe"));
    let http = ctrlhub_tests::manager::self_signed_client().expect("client");
    for url in [&live, &ready] {
        wait_for(&format!("{url} answers 200"), || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                http.get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await;
    }
    // Leading, it labels its own pod, so the `ctrlhub` Service would route controllers to it.
    wait_for("the manager labels its pod as leader", || async {
        kubectl(
            &c,
            cache.path(),
            &[
                "get",
                "pod",
                pod,
                "-n",
                "ctrlhub-system",
                "-o",
                "jsonpath={.metadata.labels.ctrlhub\\.io/leader}",
            ],
            None,
        )
        .trim()
            == "true"
    })
    .await;
    metrics_need_the_deployed_reader_role(&c, &ready.replace("/readyz", "/metrics")).await;
    let grpc_port = local[&ports["grpc"]];
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", grpc_port))
            .await
            .is_ok(),
        "the gRPC port from the args accepts connections"
    );
    let _ = child.kill().await;
}

/// The HTTP port as deploy/ runs it: `/metrics` refuses an anonymous caller and serves a
/// ServiceAccount bound to deploy/'s `ctrlhub-metrics-reader` ClusterRole, as Prometheus is.
async fn metrics_need_the_deployed_reader_role(c: &Cluster, metrics_url: &str) {
    let http = ctrlhub_tests::manager::self_signed_client().expect("client");
    let anonymous = http.get(metrics_url).send().await.expect("answered");
    assert_eq!(anonymous.status(), 401, "anonymous /metrics");
    namespace(&c.client, "monitoring", &[]).await;
    ctrlhub_tests::rbac::service_account(c, "monitoring", "prometheus").await;
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "prometheus-ctrlhub-metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ctrlhub-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
    });
    apply(&c.client, &binding).await.expect("binding applied");
    let token =
        c.dc.issue_token(
            "monitoring",
            "prometheus",
            &[],
            std::time::Duration::from_secs(600),
        )
        .expect("token");
    let scraped = http
        .get(metrics_url)
        .bearer_auth(&token)
        .send()
        .await
        .expect("answered");
    assert_eq!(scraped.status(), 200, "/metrics for the metrics reader");
    let text = scraped.text().await.expect("body");
    assert!(text.contains("leader_election_master_status"), "{text}");
}
