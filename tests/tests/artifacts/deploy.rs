//! deploy/ as the README tells a platform engineer to use it, against devcluster with kubectl:
//! both documented `kubectl apply --server-side -k` commands exit 0 on a cluster without the
//! Prometheus Operator, monitoring is a separate opt-in apply, an overlay of one's own sets the
//! image and adds cert-manager TLS, the manager runs from the rendered Deployment's args and env
//! with its own ServiceAccount's token (so the shipped RBAC is proven sufficient), the
//! no-Secrets overlay really cannot read Secrets, and a tenant following the multi-tenancy
//! section gets its Memcached reconciled.

use ctrlhub_tests::*;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository root")
}

/// kubectl against the test's devcluster, run from the repository root like the README's
/// commands.
struct Kubectl {
    kubeconfig: PathBuf,
    cache: tempfile::TempDir,
}

impl Kubectl {
    fn new(c: &Cluster) -> Kubectl {
        Kubectl {
            kubeconfig: c.kubeconfig.clone(),
            cache: tempfile::tempdir().expect("cache dir"),
        }
    }

    /// Runs `kubectl ARGS` (stdin from `input`): exit status, stdout, stderr.
    async fn run(&self, args: &[&str], input: Option<&[u8]>) -> (bool, String, String) {
        use tokio::io::AsyncWriteExt as _;
        let mut child = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args)
            .current_dir(repo())
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        if let (Some(input), Some(mut pipe)) = (input, child.stdin.take()) {
            pipe.write_all(input).await.expect("stdin written");
        }
        let out = child.wait_with_output().await.expect("kubectl finishes");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `kubectl ARGS`, which must exit 0; its stdout.
    async fn ok(&self, args: &[&str]) -> String {
        self.ok_with(args, None).await
    }

    async fn ok_with(&self, args: &[&str], input: Option<&[u8]>) -> String {
        let (ok, out, err) = self.run(args, input).await;
        assert!(ok, "kubectl {} failed:\n{err}", args.join(" "));
        out
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all).await).expect("kubectl -o json")
    }
}

/// The kinds of the Prometheus Operator (or cert-manager), reduced to what a cluster needs to
/// accept their objects.
async fn install_crds(k: &Kubectl, group: &str, kinds: &[(&str, &str)]) {
    for (plural, kind) in kinds {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group,
                "names": {"plural": plural, "kind": kind, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
                "scope": "Namespaced",
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                }],
            },
        });
        k.ok_with(&["apply", "-f", "-"], Some(crd.to_string().as_bytes()))
            .await;
    }
}

const OVERLAYS: [&str; 3] = ["cluster-wide", "cluster-wide-no-secrets", "namespaced"];

// kubectl runs as a child process; devcluster keeps serving on the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_apply_commands_exit_0_without_the_monitoring_crds() {
    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    // README: the namespaced overlay's namespaces exist first.
    k.ok(&["apply", "-f", "deploy/overlays/namespaced/namespaces.yaml"])
        .await;
    for overlay in OVERLAYS {
        let dir = format!("deploy/overlays/{overlay}");
        let applied = k.ok(&["apply", "--server-side", "-k", &dir]).await;
        for object in [
            "deployment.apps/ctrlhub",
            "poddisruptionbudget.policy/ctrlhub",
            "networkpolicy.networking.k8s.io/ctrlhub",
            "service/ctrlhub",
            "service/ctrlhub-metrics",
        ] {
            assert!(applied.contains(object), "{overlay}: {object}: {applied}");
        }
        assert!(
            !applied.contains("monitoring.coreos.com"),
            "{overlay}: monitoring is opt-in: {applied}"
        );
        let deployment = k
            .json(&["get", "deployment", "ctrlhub", "-n", "ctrlhub-system"])
            .await;
        assert_eq!(deployment["spec"]["replicas"], 2, "a leader and a standby");
        let spread = &deployment["spec"]["template"]["spec"]["topologySpreadConstraints"];
        assert!(
            spread.as_array().is_some_and(|s| s
                .iter()
                .any(|t| t["topologyKey"] == "kubernetes.io/hostname")),
            "{overlay}: replicas spread over nodes: {spread}"
        );
        let selector = k
            .ok(&[
                "get",
                "service",
                "ctrlhub",
                "-n",
                "ctrlhub-system",
                "-o",
                "jsonpath={.spec.selector}",
            ])
            .await;
        assert!(
            selector.contains(r#""ctrlhub.io/leader":"true""#),
            "{overlay}: the controllers' Service selects the leader: {selector}"
        );
    }
    let binding = k
        .ok(&[
            "get",
            "rolebinding",
            "ctrlhub-cache-reader",
            "-n",
            "team-b",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(
        binding.trim(),
        "rolebinding.rbac.authorization.k8s.io/ctrlhub-cache-reader"
    );

    // Monitoring needs the operator's CRDs: without them its own apply fails (which is why it
    // is not in the overlays), with them it exits 0.
    let (ok, _, err) = k
        .run(&["apply", "--server-side", "-k", "deploy/monitoring"], None)
        .await;
    assert!(!ok, "no ServiceMonitor kind on this cluster yet");
    assert!(err.contains("ServiceMonitor"), "{err}");
    install_crds(
        &k,
        "monitoring.coreos.com",
        &[
            ("servicemonitors", "ServiceMonitor"),
            ("prometheusrules", "PrometheusRule"),
        ],
    )
    .await;
    let applied = k
        .ok(&["apply", "--server-side", "-k", "deploy/monitoring"])
        .await;
    for object in [
        "servicemonitor.monitoring.coreos.com/ctrlhub",
        "prometheusrule.monitoring.coreos.com/ctrlhub",
        "configmap/ctrlhub-dashboard-overview",
    ] {
        assert!(applied.contains(object), "{object}: {applied}");
    }
}

/// The README's own overlay: `images:` points at a pushed image and the cert-manager component
/// adds TLS to both ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlay_of_ones_own_sets_the_image_and_adds_cert_manager_tls() {
    let base: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("deploy/base/deployment.yaml")).expect("deployment"),
    )
    .expect("yaml");
    let image = base["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .map(str::to_string);
    assert_eq!(
        image,
        Some(format!("ctrlhub:{}", env!("CARGO_PKG_VERSION"))),
        "the image tag is the release version (ctrlhub --version)"
    );

    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    install_crds(
        &k,
        "cert-manager.io",
        &[("issuers", "Issuer"), ("certificates", "Certificate")],
    )
    .await;
    // An overlay in the repository's target dir, naming deploy/ by relative paths as an overlay
    // in a user's repository would name a remote base.
    let dir = tempfile::tempdir_in(target_dir()).expect("overlay dir");
    let to_repo = relative(&dir.path().canonicalize().expect("overlay dir"), &repo());
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {r}/deploy/overlays/cluster-wide\ncomponents:\n  - {r}/deploy/components/cert-manager\nimages:\n  - name: ctrlhub\n    newName: registry.example.com/platform/ctrlhub\n    newTag: 0.1.0\n",
            r = to_repo.display()
        ),
    )
    .expect("kustomization written");
    let path = dir.path().to_string_lossy().into_owned();
    k.ok(&["apply", "--server-side", "-k", &path]).await;
    let deployment = k
        .json(&["get", "deployment", "ctrlhub", "-n", "ctrlhub-system"])
        .await;
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"], "registry.example.com/platform/ctrlhub:0.1.0",
        "images: overrides the image"
    );
    let env: HashMap<&str, &str> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    for var in [
        "CTRLHUB_GRPC_TLS_CERT",
        "CTRLHUB_HTTP_TLS_CERT",
        "CTRLHUB_GRPC_TLS_KEY",
        "CTRLHUB_HTTP_TLS_KEY",
    ] {
        assert!(
            env.get(var)
                .is_some_and(|p| p.starts_with("/etc/ctrlhub/tls/")),
            "{var}: {env:?}"
        );
    }
    assert!(
        pod["volumes"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v["secret"]["secretName"] == "ctrlhub-tls")),
        "the certificate's Secret is mounted: {pod}"
    );
    let certificate = k
        .json(&["get", "certificate", "ctrlhub-tls", "-n", "ctrlhub-system"])
        .await;
    let names = certificate["spec"]["dnsNames"].to_string();
    for name in [
        "ctrlhub.ctrlhub-system.svc",
        "ctrlhub-metrics.ctrlhub-system.svc",
    ] {
        assert!(names.contains(&format!("\"{name}\"")), "{name} in {names}");
    }
}

/// `from`'s path to `to` (both absolute), for kustomize, which refuses absolute paths.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to_parts: Vec<_> = to.components().collect();
    let common = from
        .iter()
        .zip(&to_parts)
        .take_while(|(a, b)| a == b)
        .count();
    let mut rel = PathBuf::new();
    for _ in common..from.len() {
        rel.push("..");
    }
    rel.extend(to_parts.iter().skip(common));
    rel
}

/// A kubeconfig for devcluster that authenticates with `token` instead of the admin's.
fn kubeconfig_with_token(c: &Cluster, token: &str) -> PathBuf {
    let admin = ctrlhub_tests::manager::admin_token(c).expect("admin token");
    let text = c.dc.kubeconfig_yaml().replace(&admin, token.trim());
    let path = c.dir.path().join(format!("kubeconfig-{}", free_port()));
    std::fs::write(&path, text).expect("kubeconfig written");
    path
}

/// What the kubelet would resolve for one `env` entry of a container in `namespace`.
fn resolve_env(pod: &str, namespace: &str, entry: &Value) -> String {
    if let Some(v) = entry["value"].as_str() {
        return v.to_string();
    }
    match entry["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
        Some("metadata.name") => pod.to_string(),
        Some("metadata.namespace") => namespace.to_string(),
        other => panic!("the test does not resolve env source {other:?}"),
    }
}

/// The manager as the rendered Deployment runs it: its args and env, its own ServiceAccount's
/// token (`kubectl create token`, standing in for the mounted one) and a pod it can label.
/// Only what a cluster supplies is stood in for: the API server's address and loopback ports.
struct Deployed {
    _child: tokio::process::Child,
    /// Loopback port of the container port named `grpc`.
    grpc_port: u16,
    /// The readiness probe's URL.
    ready: String,
    pod: String,
}

async fn start_deployed_manager(c: &Cluster, k: &Kubectl) -> Deployed {
    let deployment = k
        .json(&["get", "deployment", "ctrlhub", "-n", "ctrlhub-system"])
        .await;
    let template = &deployment["spec"]["template"];
    let container = &template["spec"]["containers"][0];
    let pod = "ctrlhub-7d9f-abcde".to_string();
    k.ok_with(
        &["create", "-f", "-"],
        Some(
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": "ctrlhub-system", "labels": template["metadata"]["labels"]},
                "spec": template["spec"]})
            .to_string()
            .as_bytes(),
        ),
    )
    .await;
    let ports: HashMap<String, u16> = container["ports"]
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
    let mut local: HashMap<u16, u16> = HashMap::new();
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
    let token = k
        .ok(&["create", "token", "ctrlhub", "-n", "ctrlhub-system"])
        .await;
    let log = std::env::temp_dir().join(format!("ctrlhub-deployed-{}.log", free_port()));
    println!("deployed manager logs to {}", log.display());
    let mut cmd = tokio::process::Command::new(bin("ctrlhub"));
    cmd.args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig_with_token(c, &token))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(&log)
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .kill_on_drop(true);
    let mut env_names = Vec::new();
    for entry in container["env"].as_array().expect("env") {
        let name = entry["name"].as_str().expect("env name");
        env_names.push(name.to_string());
        cmd.env(name, resolve_env(&pod, "ctrlhub-system", entry));
    }
    assert!(
        env_names.iter().any(|n| n == "CTRLHUB_IDENTITY")
            && env_names.iter().any(|n| n == "CTRLHUB_LEASE_NAMESPACE"),
        "the Deployment passes the pod's identity: {env_names:?}"
    );
    let child = cmd.spawn().expect("ctrlhub starts");

    let probe_url = |probe: &str| {
        let p = &container[probe]["httpGet"];
        let port = match &p["port"] {
            Value::String(name) => ports[name],
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
    Deployed {
        _child: child,
        grpc_port: local[&ports["grpc"]],
        ready,
        pod,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_runs_with_the_deployments_args_env_and_its_own_service_account() {
    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    k.ok(&[
        "apply",
        "--server-side",
        "-k",
        "deploy/overlays/cluster-wide",
    ])
    .await;
    let m = start_deployed_manager(&c, &k).await;
    // Leading, it labels its own pod, so the `ctrlhub` Service would route controllers to it.
    wait_for("the manager labels its pod as leader", || async {
        k.ok(&[
            "get",
            "pod",
            &m.pod,
            "-n",
            "ctrlhub-system",
            "-o",
            "jsonpath={.metadata.labels.ctrlhub\\.io/leader}",
        ])
        .await
        .trim()
            == "true"
    })
    .await;
    metrics_need_the_deployed_reader_role(&c, &m.ready.replace("/readyz", "/metrics")).await;
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", m.grpc_port))
            .await
            .is_ok(),
        "the gRPC port from the args accepts connections"
    );
}

/// The HTTP port as deploy/ runs it: `/metrics` refuses an anonymous caller and serves a
/// ServiceAccount bound to deploy/'s `ctrlhub-metrics-reader` ClusterRole, as Prometheus is.
async fn metrics_need_the_deployed_reader_role(c: &Cluster, metrics_url: &str) {
    let http = ctrlhub_tests::manager::self_signed_client().expect("client");
    let anonymous = http.get(metrics_url).send().await.expect("answered");
    assert_eq!(anonymous.status(), 401, "anonymous /metrics");
    let token = ctrlhub_tests::rbac::prometheus_bound_to(c, "ctrlhub-metrics-reader")
        .await
        .expect("prometheus' token");
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

/// `kubectl auth can-i VERB RESOURCE -A` as the manager's ServiceAccount.
async fn manager_can(k: &Kubectl, verb: &str, resource: &str) -> bool {
    let token = k
        .ok(&["create", "token", "ctrlhub", "-n", "ctrlhub-system"])
        .await;
    let (_, out, _) = k
        .run(
            &[
                "--token",
                token.trim(),
                "auth",
                "can-i",
                verb,
                resource,
                "--all-namespaces",
            ],
            None,
        )
        .await;
    out.trim() == "yes"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_no_secrets_overlay_cannot_read_secrets() {
    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    k.ok(&[
        "apply",
        "--server-side",
        "-k",
        "deploy/overlays/cluster-wide",
    ])
    .await;
    assert!(
        manager_can(&k, "list", "secrets").await,
        "cluster-wide reads Secrets"
    );
    k.ok(&[
        "apply",
        "--server-side",
        "-k",
        "deploy/overlays/cluster-wide-no-secrets",
    ])
    .await;
    for (verb, resource, allowed) in [
        ("list", "secrets", false),
        ("get", "secrets", false),
        ("watch", "secrets", false),
        ("list", "configmaps", true),
        ("watch", "deployments.apps", true),
    ] {
        assert_eq!(
            manager_can(&k, verb, resource).await,
            allowed,
            "{verb} {resource}"
        );
    }
    // The manager still runs: leader election, pod label and its caches need no Secret.
    let m = start_deployed_manager(&c, &k).await;
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", m.grpc_port))
            .await
            .is_ok()
    );
}

/// The multi-tenancy section end to end: the platform deploys ctrlhub and the Memcached CRD,
/// team-a applies the README's RBAC and controller Deployment, and its controller — started with
/// that Deployment's env, its projected ctrlhub token and its API-server token — gets its
/// Memcached reconciled through the manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_following_the_readme_gets_a_reconcile() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let example = repo().join("deploy/examples/memcached-tenant");
    for file in ["rbac.yaml", "controller.yaml"] {
        let text = std::fs::read_to_string(example.join(file)).expect("example");
        assert!(
            readme.contains(&text),
            "the README shows deploy/examples/memcached-tenant/{file} as it is"
        );
    }

    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    // The platform team: ctrlhub, and the tenant's CRD (tenants cannot install cluster-scoped kinds).
    k.ok(&[
        "apply",
        "--server-side",
        "-k",
        "deploy/overlays/cluster-wide",
    ])
    .await;
    let m = start_deployed_manager(&c, &k).await;
    let crd = std::process::Command::new(bin("memcached-controller"))
        .arg("--print-crd")
        .output()
        .expect("memcached-controller --print-crd");
    k.ok_with(&["apply", "-f", "-"], Some(&crd.stdout)).await;
    let team_a = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}});
    k.ok_with(&["apply", "-f", "-"], Some(team_a.to_string().as_bytes()))
        .await;
    // team-a, as the README says.
    k.ok(&[
        "apply",
        "-f",
        "deploy/examples/memcached-tenant/rbac.yaml",
        "-f",
        "deploy/examples/memcached-tenant/controller.yaml",
    ])
    .await;
    let deployment = k
        .json(&["get", "deployment", "memcached-controller", "-n", "team-a"])
        .await;
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    // The two tokens the pod gets: the projected ctrlhub-audience one at CTRLHUB_TOKEN_FILE and
    // the ServiceAccount's API-server token for writes.
    let ctrlhub_token = k
        .ok(&[
            "create",
            "token",
            "memcached",
            "-n",
            "team-a",
            "--audience",
            "ctrlhub",
        ])
        .await;
    let api_token = k
        .ok(&["create", "token", "memcached", "-n", "team-a"])
        .await;
    let token_file = c.dir.path().join("ctrlhub-token");
    std::fs::write(&token_file, ctrlhub_token.trim()).expect("token file");
    let log = std::env::temp_dir().join(format!("memcached-tenant-{}.log", free_port()));
    println!("the tenant's controller logs to {}", log.display());
    let mut cmd = tokio::process::Command::new(bin("memcached-controller"));
    cmd.env_clear()
        .env("KUBECONFIG", kubeconfig_with_token(&c, &api_token))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(&log)
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .kill_on_drop(true);
    for entry in container["env"].as_array().expect("env") {
        let name = entry["name"].as_str().expect("env name");
        let value = match name {
            // No cluster DNS here: the Service's host:port becomes the manager's loopback
            // host:port, in the same scheme-less form.
            "CTRLHUB_ADDR" => {
                let value = resolve_env("memcached-controller-x", "team-a", entry);
                assert_eq!(value, "ctrlhub.ctrlhub-system.svc:9090");
                format!("127.0.0.1:{}", m.grpc_port)
            }
            "CTRLHUB_TOKEN_FILE" => token_file.to_string_lossy().into_owned(),
            _ => resolve_env("memcached-controller-x", "team-a", entry),
        };
        cmd.env(name, value);
    }
    let _controller = cmd.spawn().expect("memcached-controller starts");

    let memcached = json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "cache", "namespace": "team-a"}, "spec": {"size": 2}});
    k.ok_with(
        &["apply", "-f", "-"],
        Some(memcached.to_string().as_bytes()),
    )
    .await;
    wait_for(
        "team-a's Memcached is reconciled through ctrlhub",
        || async {
            let (ok, out, _) = k
                .run(
                    &["get", "memcached", "cache", "-n", "team-a", "-o", "json"],
                    None,
                )
                .await;
            let v: Value = if ok {
                serde_json::from_str(&out).unwrap_or_default()
            } else {
                Value::Null
            };
            v["status"]["observedGeneration"] == v["metadata"]["generation"]
                && v["status"]["conditions"][0]["status"] == "True"
        },
    )
    .await;
    let replicas = k
        .ok(&[
            "get",
            "deployment",
            "cache",
            "-n",
            "team-a",
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .await;
    assert_eq!(
        replicas.trim(),
        "2",
        "the controller created the Deployment"
    );
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("reconcile end key=team-a/cache")
                && serde_json::from_str::<Value>(l).is_ok()),
        "JSON log lines (LOG_FORMAT=json): {logged}"
    );
}
