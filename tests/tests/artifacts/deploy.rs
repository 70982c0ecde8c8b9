//! deploy/ as docs/operating.md tells a platform engineer to use it, against devcluster with kubectl:
//! both documented `kubectl apply --server-side -k` commands exit 0 on a cluster without the
//! Prometheus Operator and render ring mode (three StatefulSet members, addressable through a
//! headless Service, all behind the controllers' Service), monitoring is a separate opt-in
//! apply, an overlay of one's own sets the image and adds cert-manager TLS (with the members'
//! names), members run from the rendered StatefulSet's args and env with their own
//! ServiceAccount's token (so the shipped RBAC is proven sufficient) and form one ring, the
//! leader-mode component still runs a leader, the no-Secrets overlay really cannot read
//! Secrets, and a tenant following docs/multi-tenancy.md gets its Memcached reconciled.

use ctrlhub_tests::prometheus::Prometheus;
use ctrlhub_tests::readme::doc_blocks;
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

/// kubectl against the test's devcluster, run from the repository root like the documented
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

    /// Runs `script` (a documented block, as written) with bash as a reader pastes it into a shell
    /// at the repository root: `KUBECONFIG` is this cluster's and the workspace's binaries
    /// (`memcached-controller`, `ctrlhub`) are on `PATH`; `-e` stops at the first command that
    /// fails. `prelude` runs first (a stand-in for what devcluster lacks, e.g. port-forward).
    /// Exit status, stdout, stderr.
    async fn shell(
        &self,
        prelude: &str,
        script: &str,
        env: &[(&str, &str)],
    ) -> (bool, String, String) {
        let path = std::env::join_paths(std::iter::once(target_dir().join("debug")).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .expect("PATH");
        let out = tokio::process::Command::new("bash")
            .args([
                "-e",
                "-o",
                "pipefail",
                "-c",
                &format!("{prelude}\n{script}"),
            ])
            .current_dir(repo())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.cache.path())
            .env("PATH", path)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .await
            .expect("bash runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// [`Kubectl::shell`] for a block every command of which must succeed; its stdout.
    async fn documented(&self, script: &str) -> String {
        let (ok, out, err) = self.shell("", script, &[]).await;
        assert!(ok, "the documented commands failed:\n{script}\n{err}");
        out
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

/// One Service of `services` (a `kubectl get services -o json` list) by name.
fn service<'a>(services: &'a Value, name: &str) -> &'a Value {
    services["items"]
        .as_array()
        .and_then(|items| items.iter().find(|s| s["metadata"]["name"] == name))
        .unwrap_or_else(|| panic!("Service {name} in {services}"))
}

/// The pod's environment as the kubelet resolves it: `fieldRef`s to the pod's name and
/// namespace, and `$(VAR)` in a value expanded from the variables defined before it (a
/// reference to a later or unknown one stays as written, as the kubelet leaves it).
fn resolve_env_list(pod: &str, namespace: &str, env: &Value) -> Vec<(String, String)> {
    let mut resolved: Vec<(String, String)> = Vec::new();
    for entry in env.as_array().expect("env") {
        let name = entry["name"].as_str().expect("env name").to_string();
        let mut value = resolve_env(pod, namespace, entry);
        for (earlier, v) in &resolved {
            value = value.replace(&format!("$({earlier})"), v);
        }
        resolved.push((name, value));
    }
    resolved
}

/// Ring mode as an overlay renders it: three members of a StatefulSet whose `serviceName` is a
/// headless Service that publishes starting members, each member publishing its own name under
/// it as its address; the controllers' Service selects every member (no leader label); the PDB
/// lets one member go at a time.
fn assert_ring_members(overlay: &str, statefulset: &Value, services: &Value, pdb: &Value) {
    let spec = &statefulset["spec"];
    assert_eq!(spec["replicas"], 3, "{overlay}: three members");
    assert_eq!(spec["podManagementPolicy"], "Parallel", "{overlay}");
    let headless_name = spec["serviceName"].as_str().expect("serviceName");
    assert_eq!(headless_name, "ctrlhub-members", "{overlay}");
    let headless = service(services, headless_name);
    assert_eq!(
        headless["spec"]["clusterIP"], "None",
        "{overlay}: the StatefulSet's Service is headless: {headless}"
    );
    assert_eq!(
        headless["spec"]["publishNotReadyAddresses"], true,
        "{overlay}: a starting member is addressable: {headless}"
    );
    let pod_labels = &spec["template"]["metadata"]["labels"];
    for name in ["ctrlhub", headless_name] {
        let selector = service(services, name)["spec"]["selector"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(
            !selector.is_empty() && selector.iter().all(|(k, v)| &pod_labels[k] == v),
            "{overlay}: Service {name} selects every member, not a leader: {selector:?}"
        );
    }
    let pod = &spec["template"]["spec"];
    let spread = &pod["topologySpreadConstraints"];
    assert!(
        spread.as_array().is_some_and(|s| s
            .iter()
            .any(|t| t["topologyKey"] == "kubernetes.io/hostname")),
        "{overlay}: members spread over nodes: {spread}"
    );
    let container = &pod["containers"][0];
    let grpc = container["ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["name"] == "grpc"))
        .and_then(|p| p["containerPort"].as_u64())
        .expect("a grpc container port");
    let env: HashMap<String, String> =
        resolve_env_list("ctrlhub-1", "ctrlhub-system", &container["env"])
            .into_iter()
            .collect();
    assert_eq!(
        env.get("CTRLHUB_MODE").map(String::as_str),
        Some("ring"),
        "{overlay}"
    );
    assert_eq!(
        env.get("CTRLHUB_MEMBER_ADDRESS"),
        Some(&format!(
            "ctrlhub-1.{headless_name}.ctrlhub-system.svc:{grpc}"
        )),
        "{overlay}: the member address is the pod's name under the headless Service (POD_NAME \
         and POD_NAMESPACE defined before it, or the kubelet leaves $(VAR) unexpanded)"
    );
    assert_eq!(
        env.get("CTRLHUB_IDENTITY").map(String::as_str),
        Some("ctrlhub-1"),
        "{overlay}: the member's identity is its pod's name"
    );
    assert!(
        !env.contains_key("CTRLHUB_LEADER_POD_LABEL"),
        "{overlay}: no leader label in ring mode"
    );
    assert_eq!(
        pdb["spec"]["maxUnavailable"], 1,
        "{overlay}: one member at a time: {pdb}"
    );
}

// kubectl runs as a child process; devcluster keeps serving on the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_apply_commands_exit_0_without_the_monitoring_crds() {
    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    // docs/operating.md: the namespaced overlay's namespaces exist first.
    k.ok(&["apply", "-f", "deploy/overlays/namespaced/namespaces.yaml"])
        .await;
    for overlay in OVERLAYS {
        let dir = format!("deploy/overlays/{overlay}");
        let applied = k.ok(&["apply", "--server-side", "-k", &dir]).await;
        for object in [
            "statefulset.apps/ctrlhub",
            "poddisruptionbudget.policy/ctrlhub",
            "networkpolicy.networking.k8s.io/ctrlhub",
            "service/ctrlhub",
            "service/ctrlhub-members",
            "service/ctrlhub-metrics",
        ] {
            assert!(applied.contains(object), "{overlay}: {object}: {applied}");
        }
        assert!(
            !applied.contains("monitoring.coreos.com"),
            "{overlay}: monitoring is opt-in: {applied}"
        );
        let statefulset = k
            .json(&["get", "statefulset", "ctrlhub", "-n", "ctrlhub-system"])
            .await;
        let services = k.json(&["get", "services", "-n", "ctrlhub-system"]).await;
        let pdb = k
            .json(&[
                "get",
                "poddisruptionbudget",
                "ctrlhub",
                "-n",
                "ctrlhub-system",
            ])
            .await;
        assert_ring_members(overlay, &statefulset, &services, &pdb);
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

/// docs/operating.md's overlay of one's own: `images:` points at a pushed image and the
/// cert-manager component adds TLS to both ports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlay_of_ones_own_sets_the_image_and_adds_cert_manager_tls() {
    let base: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("deploy/base/statefulset.yaml")).expect("statefulset"),
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
    let dir = own_overlay(
        &["deploy/components/cert-manager"],
        "images:\n  - name: ctrlhub\n    newName: registry.example.com/platform/ctrlhub\n    newTag: 0.1.0\n",
    );
    let path = dir.path().to_string_lossy().into_owned();
    k.ok(&["apply", "--server-side", "-k", &path]).await;
    let statefulset = k
        .json(&["get", "statefulset", "ctrlhub", "-n", "ctrlhub-system"])
        .await;
    let pod = &statefulset["spec"]["template"]["spec"];
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
    // A redirected controller dials a member by its name under the headless Service, and
    // verifies that name: one wildcard covers every member, however many there are.
    for name in [
        "ctrlhub.ctrlhub-system.svc",
        "*.ctrlhub-members.ctrlhub-system.svc",
        "*.ctrlhub-members.ctrlhub-system.svc.cluster.local",
        "ctrlhub-metrics.ctrlhub-system.svc",
    ] {
        assert!(names.contains(&format!("\"{name}\"")), "{name} in {names}");
    }
}

/// An overlay of one's own over `deploy/overlays/cluster-wide` with `components` (paths from
/// the repository root) and `extra` kustomization lines, in the repository's target dir, naming
/// deploy/ by relative paths as an overlay in a user's repository would name a remote base.
fn own_overlay(components: &[&str], extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(target_dir()).expect("overlay dir");
    let to_repo = relative(&dir.path().canonicalize().expect("overlay dir"), &repo());
    let r = to_repo.display();
    let components: String = components
        .iter()
        .map(|c| format!("  - {r}/{c}\n"))
        .collect();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {r}/deploy/overlays/cluster-wide\ncomponents:\n{components}{extra}"
        ),
    )
    .expect("kustomization written");
    dir
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

/// The manager as the rendered StatefulSet runs it: its args and env, its own ServiceAccount's
/// token (`kubectl create token`, standing in for the mounted one) and a pod it can label.
/// Only what a cluster supplies is stood in for: the API server's address and loopback ports.
struct Deployed {
    _child: tokio::process::Child,
    /// Loopback port of the container port named `grpc`.
    grpc_port: u16,
    /// Loopback port of the container port named `http` (HTTPS under deploy/'s `--auth`).
    http_port: u16,
    /// Loopback port of each container port the args bind.
    local: HashMap<u16, u16>,
    pod: String,
}

async fn start_deployed_manager(c: &Cluster, k: &Kubectl) -> Deployed {
    start_deployed_manager_as(c, k, "ctrlhub-0").await
}

/// [`start_deployed_manager`] as member `pod` (the StatefulSet names them ctrlhub-0,
/// ctrlhub-1, ...).
async fn start_deployed_manager_as(c: &Cluster, k: &Kubectl, pod: &str) -> Deployed {
    let statefulset = k
        .json(&["get", "statefulset", "ctrlhub", "-n", "ctrlhub-system"])
        .await;
    let template = &statefulset["spec"]["template"];
    let container = &template["spec"]["containers"][0];
    let pod = pod.to_string();
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
    let log = std::env::temp_dir().join(format!("ctrlhub-deployed-{pod}-{}.log", free_port()));
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
    let env = resolve_env_list(&pod, "ctrlhub-system", &container["env"]);
    let env_names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        env_names.contains(&"CTRLHUB_IDENTITY") && env_names.contains(&"CTRLHUB_LEASE_NAMESPACE"),
        "the StatefulSet passes the pod's identity: {env_names:?}"
    );
    cmd.envs(env.iter().map(|(n, v)| (n, v)));
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
    println!("{pod}: probes {live} and {ready}");
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
        http_port: local[&ports["http"]],
        local,
        pod,
    }
}

/// Two members as the rendered StatefulSet runs them, with their own ServiceAccount's token:
/// each creates and renews its member Lease, labelled with the ring, and sees the other live, so
/// the shipped Role is sufficient for ring mode without the pod-label grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_run_with_the_statefulsets_args_env_and_their_own_service_account() {
    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    k.ok(&[
        "apply",
        "--server-side",
        "-k",
        "deploy/overlays/cluster-wide",
    ])
    .await;
    let a = start_deployed_manager_as(&c, &k, "ctrlhub-0").await;
    let b = start_deployed_manager_as(&c, &k, "ctrlhub-1").await;
    wait_for("each member renews its own Lease in the ring", || async {
        let leases = k
            .ok(&[
                "get",
                "leases",
                "-n",
                "ctrlhub-system",
                "-l",
                "ctrlhub.io/ring=ctrlhub",
                "-o",
                "name",
            ])
            .await;
        let mut names: Vec<&str> = leases.lines().collect();
        names.sort_unstable();
        names
            == [
                "lease.coordination.k8s.io/ctrlhub-member-ctrlhub-0",
                "lease.coordination.k8s.io/ctrlhub-member-ctrlhub-1",
            ]
    })
    .await;
    let token = ctrlhub_tests::rbac::prometheus_bound_to(&c, "ctrlhub-metrics-reader")
        .await
        .expect("prometheus' token");
    let http = ctrlhub_tests::manager::self_signed_client().expect("client");
    for m in [&a, &b] {
        let metrics = format!("https://127.0.0.1:{}/metrics", m.http_port);
        wait_until("both members live in each one's view", PATIENCE, || async {
            let text = match http.get(&metrics).bearer_auth(&token).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => return Err(e.to_string()),
            };
            let members = gauge(&text, "ctrlhub_ring_members");
            if members == Some(2.0) {
                Ok(())
            } else {
                Err(format!("{}: ctrlhub_ring_members {members:?}", m.pod))
            }
        })
        .await;
        metrics_need_the_deployed_reader_role(&c, &metrics, "ctrlhub_ring_members").await;
        assert!(
            tokio::net::TcpStream::connect(("127.0.0.1", m.grpc_port))
                .await
                .is_ok(),
            "the gRPC port from the args accepts connections"
        );
    }
    // No member is a leader: nothing labels a pod.
    let labelled = k
        .ok(&[
            "get",
            "pods",
            "-n",
            "ctrlhub-system",
            "-l",
            "ctrlhub.io/leader",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(labelled.trim(), "", "no leader label in ring mode");
}

/// A one-sample gauge's value in Prometheus' text format (the first sample of `name`).
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with([' ', '{']))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// deploy/components/leader-mode, for the release that still offers leader mode: the Lease
/// holder labels its own pod, so the `ctrlhub` Service, which the component makes select that
/// label, routes controllers to it; the component's pod grant is sufficient for that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_mode_component_runs_a_leader_that_labels_its_pod() {
    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    let overlay = own_overlay(&["deploy/components/leader-mode"], "");
    let path = overlay.path().to_string_lossy().into_owned();
    k.ok(&["apply", "--server-side", "-k", &path]).await;
    let statefulset = k
        .json(&["get", "statefulset", "ctrlhub", "-n", "ctrlhub-system"])
        .await;
    assert_eq!(statefulset["spec"]["replicas"], 2, "a leader and a standby");
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
        "the controllers' Service selects the leader: {selector}"
    );
    let m = start_deployed_manager(&c, &k).await;
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
    let metrics = format!("https://127.0.0.1:{}/metrics", m.http_port);
    metrics_need_the_deployed_reader_role(&c, &metrics, "leader_election_master_status").await;
}

/// The HTTP port as deploy/ runs it: `/metrics` refuses an anonymous caller and serves a
/// ServiceAccount bound to deploy/'s `ctrlhub-metrics-reader` ClusterRole, as Prometheus is,
/// with `metric` among its series; the text it served.
async fn metrics_need_the_deployed_reader_role(
    c: &Cluster,
    metrics_url: &str,
    metric: &str,
) -> String {
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
    assert!(text.contains(metric), "{metric}: {text}");
    text
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

/// docs/multi-tenancy.md's tenant end to end, its commands run as written on an empty cluster (on
/// main they never created team-a, and the tenant's first apply failed): the platform deploys
/// ctrlhub, team-a's namespace and the Memcached CRD, team-a applies the page's RBAC,
/// controller Deployment and Memcached, and its controller — started with that Deployment's
/// env, its projected ctrlhub token and its API-server token — gets its Memcached reconciled
/// through the manager. The test stands in only for the kubelet: it runs the two Deployments'
/// containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_following_the_docs_gets_a_reconcile() {
    let page = std::fs::read_to_string(repo().join("docs/multi-tenancy.md")).expect("the page");
    let example = repo().join("deploy/examples/memcached-tenant");
    for file in ["rbac.yaml", "controller.yaml"] {
        let text = std::fs::read_to_string(example.join(file)).expect("example");
        assert!(
            page.contains(&text),
            "docs/multi-tenancy.md shows deploy/examples/memcached-tenant/{file} as it is"
        );
    }
    let blocks = doc_blocks("docs/multi-tenancy.md", "tenant-walkthrough");
    let [platform, tenant] = blocks.as_slice() else {
        panic!("the walkthrough has a platform block and a tenant block: {blocks:?}");
    };

    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    // The platform team, as written: ctrlhub, team-a's namespace and the CRD.
    k.documented(platform).await;
    let m = start_deployed_manager(&c, &k).await;
    // team-a, as written: its RBAC, its controller's Deployment and a Memcached.
    k.documented(tenant).await;
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

/// `kubectl auth can-i VERB RESOURCE` in namespace `ns` as the manager's ServiceAccount.
async fn manager_can_in(k: &Kubectl, verb: &str, resource: &str, ns: &str) -> bool {
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
                "-n",
                ns,
            ],
            None,
        )
        .await;
    out.trim() == "yes"
}

/// docs/operating.md "Switching overlays": after a cluster-wide install, the documented commands (the
/// namespaced install itself) leave the manager no cluster-wide read, checked as its
/// ServiceAccount and by reading every ClusterRoleBinding that names it. On main the namespaced
/// overlay left `ctrlhub-cache-reader` as the cluster-wide overlay wrote it: Secrets included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_to_the_namespaced_overlay_leaves_no_cluster_wide_read() {
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
    let blocks = doc_blocks("docs/operating.md", "overlay-migration");
    let [migration] = blocks.as_slice() else {
        panic!("one block: {blocks:?}");
    };
    // Its last command, `kubectl auth can-i`, answers "no" with exit status 1; `-e` means every
    // command before it succeeded.
    let (_, out, err) = k.shell("", migration, &[]).await;
    assert_eq!(
        out.lines().last(),
        Some("no"),
        "the documented check says no:\n{out}\n{err}"
    );
    for (verb, resource) in [
        ("list", "secrets"),
        ("get", "secrets"),
        ("watch", "configmaps"),
        ("list", "deployments.apps"),
    ] {
        assert!(
            !manager_can(&k, verb, resource).await,
            "{verb} {resource} in every namespace after the switch"
        );
    }
    assert!(manager_can_in(&k, "list", "configmaps", "team-a").await);
    assert!(manager_can_in(&k, "watch", "secrets", "team-b").await);
    assert!(!manager_can_in(&k, "list", "configmaps", "kube-system").await);

    let bindings = k.json(&["get", "clusterrolebindings"]).await;
    let mine: Vec<&Value> = bindings["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|b| {
            b["subjects"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["name"] == "ctrlhub" && s["namespace"] == "ctrlhub-system")
            })
        })
        .collect();
    assert!(!mine.is_empty(), "ctrlhub-tenancy at least");
    for binding in mine {
        let role = binding["roleRef"]["name"].as_str().expect("roleRef");
        let role = k.json(&["get", "clusterrole", role]).await;
        for rule in role["rules"].as_array().into_iter().flatten() {
            let reads = rule["verbs"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|v| matches!(v.as_str(), Some("get" | "list" | "watch" | "*")));
            // Its own configuration is cluster-scoped: TenantPolicy objects hold no tenant data.
            let own_config = rule["apiGroups"] == serde_json::json!(["ctrlhub.io"])
                && rule["resources"] == serde_json::json!(["tenantpolicies"]);
            assert!(
                !reads || own_config || rule.get("resources").is_none(),
                "{} grants reads cluster-wide: {rule}",
                binding["metadata"]["name"]
            );
        }
    }
}

/// docs/operating.md's upgrade to ring mode, as written, over an install from before it: the
/// old Deployment is gone (it would dispatch beside the members), the StatefulSet is there, and
/// the block runs again without error (on a fresh cluster too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_upgrade_to_ring_mode_replaces_the_deployment() {
    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    // The Deployment of the release before ring mode, as far as the upgrade cares.
    k.ok(&["create", "namespace", "ctrlhub-system"]).await;
    k.ok(&[
        "-n",
        "ctrlhub-system",
        "create",
        "deployment",
        "ctrlhub",
        "--image",
        "ctrlhub:0.0.9",
        "--replicas",
        "2",
    ])
    .await;
    let blocks = doc_blocks("docs/operating.md", "ring-upgrade");
    let [upgrade] = blocks.as_slice() else {
        panic!("one block: {blocks:?}");
    };
    k.documented(upgrade).await;
    let (found, _, err) = k
        .run(
            &["-n", "ctrlhub-system", "get", "deployment", "ctrlhub"],
            None,
        )
        .await;
    assert!(
        !found && err.contains("NotFound"),
        "the Deployment is gone: {err}"
    );
    k.ok(&["-n", "ctrlhub-system", "get", "statefulset", "ctrlhub"])
        .await;
    k.documented(upgrade).await;
}

/// A TCP forwarder standing in for `kubectl port-forward`, which needs a kubelet: it listens on
/// `port` and, for each connection, waits for the stand-in `kubectl` function to record which
/// pod and ports the command named, then forwards to that replica's loopback port.
async fn port_forward_stand_in(
    port: u16,
    record: PathBuf,
    replicas: HashMap<String, HashMap<u16, u16>>,
) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the forwarded port is free");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let (record, replicas) = (record.clone(), replicas.clone());
            tokio::spawn(async move {
                let args = wait_until("kubectl port-forward was called", PATIENCE, || async {
                    std::fs::read_to_string(&record).map_err(|e| e.to_string())
                })
                .await;
                let args: Vec<&str> = args.lines().collect();
                let pod = args
                    .iter()
                    .find_map(|a| a.strip_prefix("pod/"))
                    .unwrap_or_else(|| panic!("port-forward names one pod: {args:?}"));
                let remote: u16 = args
                    .iter()
                    .find_map(|a| a.split_once(':'))
                    .and_then(|(_, r)| r.parse().ok())
                    .expect("LOCAL:REMOTE");
                let local = replicas[pod][&remote];
                if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", local)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
}

/// Runs docs/multi-tenancy.md's "a person" block as written (but for the local port, made free, and
/// `kubectl port-forward`, stood in for): it must reach the leader, in the operator's view.
async fn a_person_reaches_the_leader(
    c: &Cluster,
    k: &Kubectl,
    replicas: &[&Deployed],
    leader: &str,
) {
    let blocks = doc_blocks("docs/multi-tenancy.md", "status-page-person");
    let [person] = blocks.as_slice() else {
        panic!("one block: {blocks:?}");
    };
    let port = free_port();
    let script = person.replace("8443", &port.to_string());
    let record = c.dir.path().join("port-forward-args");
    port_forward_stand_in(
        port,
        record.clone(),
        replicas
            .iter()
            .map(|r| (r.pod.clone(), r.local.clone()))
            .collect(),
    )
    .await;
    let stand_in = r#"kubectl() {
  if [ "${3:-}" = port-forward ]; then printf '%s\n' "$@" > "$PORT_FORWARD_ARGS"; return 0; fi
  command kubectl "$@"
}"#;
    let (ok, out, err) = k
        .shell(
            stand_in,
            &script,
            &[("PORT_FORWARD_ARGS", &record.to_string_lossy())],
        )
        .await;
    assert!(ok, "the person's commands:\n{err}");
    // curl's answer is the last line, after what the kubectl commands print.
    let last = out.lines().last().unwrap_or_default();
    let status: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(status["identity"], leader, "the leader's page: {status}");
    assert_eq!(status["leading"], true);
    assert_eq!(status["view"]["scope"], "all", "the operator's view");
}

/// Where Kubernetes' endpoints discovery (`role: endpoints`) would send Prometheus in
/// ctrlhub-system, with the meta labels it sets, built from the Services and pods on the
/// cluster: each Service port of each pod its selector picks, at that replica's loopback port.
async fn discovered_endpoints(k: &Kubectl, replicas: &[&Deployed]) -> Vec<Value> {
    let services = k.json(&["get", "services", "-n", "ctrlhub-system"]).await;
    let pods = k.json(&["get", "pods", "-n", "ctrlhub-system"]).await;
    let mut groups = Vec::new();
    for svc in services["items"].as_array().into_iter().flatten() {
        let selector = svc["spec"]["selector"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for pod in pods["items"].as_array().into_iter().flatten() {
            let labels = &pod["metadata"]["labels"];
            if !selector.iter().all(|(k, v)| &labels[k] == v) {
                continue;
            }
            let name = pod["metadata"]["name"].as_str().expect("pod name");
            let Some(replica) = replicas.iter().find(|r| r.pod == name) else {
                continue;
            };
            let container_ports = &pod["spec"]["containers"][0]["ports"];
            for port in svc["spec"]["ports"].as_array().into_iter().flatten() {
                let target = container_ports
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| {
                        p["name"] == port["targetPort"] || p["containerPort"] == port["targetPort"]
                    })
                    .and_then(|p| p["containerPort"].as_u64())
                    .and_then(|p| u16::try_from(p).ok())
                    .expect("the target port is a container port");
                groups.push(json!({
                    "targets": [format!("127.0.0.1:{}", replica.local[&target])],
                    "labels": {
                        "__meta_kubernetes_namespace": "ctrlhub-system",
                        "__meta_kubernetes_service_name": svc["metadata"]["name"],
                        "__meta_kubernetes_endpoint_port_name": port["name"],
                        "__meta_kubernetes_pod_name": name,
                    },
                }));
            }
        }
    }
    groups
}

/// The one job of a scrape recipe in deploy/monitoring, as shipped.
fn recipe(file: &str) -> Value {
    let text =
        std::fs::read_to_string(repo().join("deploy/monitoring").join(file)).expect("recipe");
    let doc: Value = serde_saphyr::from_str(&text).expect("yaml");
    let jobs = doc["scrape_configs"].as_array().expect("scrape_configs");
    assert_eq!(jobs.len(), 1, "{file} is one job");
    jobs[0].clone()
}

/// A real Prometheus scraping with `job` must find exactly `pods` up, each labelled as the
/// dashboards filter (job ctrlhub-metrics, namespace ctrlhub-system, its pod), and see every
/// member in every member's view of the ring: the series came from the members themselves.
async fn prometheus_scrapes(job: Value, pods: &[&str]) -> Prometheus {
    let config = json!({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]});
    let prom = Prometheus::start(&config.to_string())
        .await
        .expect("prometheus starts");
    let want: std::collections::BTreeSet<&str> = pods.iter().copied().collect();
    let whole_ring = pods.len().to_string();
    wait_until("prometheus scrapes every member with the dashboards' labels", PATIENCE, || async {
        let (active, _) = prom.targets().await.map_err(|e| e.to_string())?;
        let up: std::collections::BTreeSet<&str> = active
            .iter()
            .filter(|t| {
                t["health"] == "up"
                    && t["labels"]["job"] == "ctrlhub-metrics"
                    && t["labels"]["namespace"] == "ctrlhub-system"
            })
            .filter_map(|t| t["labels"]["pod"].as_str())
            .collect();
        let views = prom
            .query(r#"min(ctrlhub_ring_members{job="ctrlhub-metrics", namespace="ctrlhub-system"})"#)
            .await
            .map_err(|e| e.to_string())?;
        let whole = views.first().is_some_and(|r| r["value"][1] == whole_ring.as_str());
        if active.len() == pods.len() && up == want && whole {
            Ok(())
        } else {
            Err(format!("active: {active:?}; smallest view of the ring: {views:?}"))
        }
    })
    .await;
    prom
}

/// docs/multi-tenancy.md's person on call, following its block as written ("The HTTP port
/// under Kubernetes auth"), reaches the leader's page in the operator's view. The block finds
/// the pod labelled leader, so it runs against deploy/components/leader-mode's two replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_reaches_the_leader_as_documented() {
    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    let overlay = own_overlay(&["deploy/components/leader-mode"], "");
    let path = overlay.path().to_string_lossy().into_owned();
    k.ok(&["apply", "--server-side", "-k", &path]).await;
    let a = start_deployed_manager_as(&c, &k, "ctrlhub-0").await;
    let b = start_deployed_manager_as(&c, &k, "ctrlhub-1").await;
    let leader = wait_until("one pod is labelled leader", PATIENCE, || async {
        let names = k
            .ok(&[
                "-n",
                "ctrlhub-system",
                "get",
                "pods",
                "-l",
                "ctrlhub.io/leader=true",
                "-o",
                "name",
            ])
            .await;
        match names.lines().collect::<Vec<_>>().as_slice() {
            [one] => Ok(one.trim_start_matches("pod/").to_string()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    a_person_reaches_the_leader(&c, &k, &[&a, &b], &leader).await;
}

/// Prometheus, given the documented grant (docs/multi-tenancy.md) and either scrape recipe of
/// deploy/monitoring, scrapes the three members of the ring over HTTPS with its token, labelled
/// as the dashboards filter. The static recipe runs as shipped with its targets pointed at the
/// members (on main there was none, and the Kubernetes recipe's relabels drop static targets);
/// the Kubernetes one with its discovery stood in for by the endpoints it would find, because
/// Debian's Prometheus is built without Kubernetes discovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_every_member_as_documented() {
    let c = start_cluster().await;
    let k = Kubectl::new(&c);
    k.ok(&[
        "apply",
        "--server-side",
        "-k",
        "deploy/overlays/cluster-wide",
    ])
    .await;
    let mut members = Vec::new();
    for pod in ["ctrlhub-0", "ctrlhub-1", "ctrlhub-2"] {
        members.push(start_deployed_manager_as(&c, &k, pod).await);
    }
    let members: Vec<&Deployed> = members.iter().collect();

    // Prometheus' ServiceAccount where its install would put it, granted as docs/multi-tenancy.md says.
    k.ok(&["create", "namespace", "monitoring"]).await;
    k.ok(&[
        "-n",
        "monitoring",
        "create",
        "serviceaccount",
        "prometheus-k8s",
    ])
    .await;
    let blocks = doc_blocks("docs/multi-tenancy.md", "prometheus-access");
    k.documented(&blocks[0]).await;
    let token = k
        .ok(&["-n", "monitoring", "create", "token", "prometheus-k8s"])
        .await;
    let token_file = c.dir.path().join("prometheus-token");
    std::fs::write(&token_file, token.trim()).expect("token file");
    let token_file = json!(token_file.to_string_lossy());
    let pods: Vec<&str> = members.iter().map(|m| m.pod.as_str()).collect();

    let mut static_job = recipe("prometheus-scrape-static.yml");
    static_job["authorization"]["credentials_file"] = token_file.clone();
    let groups = static_job["static_configs"]
        .as_array_mut()
        .expect("static_configs");
    assert_eq!(groups.len(), members.len(), "one entry per member");
    for (group, replica) in groups.iter_mut().zip(&members) {
        group["targets"] = json!([format!("127.0.0.1:{}", replica.http_port)]);
    }
    // The pod labels stay as written: a reader sets them to its replicas' names.
    let labelled: Vec<String> = groups
        .iter()
        .filter_map(|g| g["labels"]["pod"].as_str().map(String::from))
        .collect();
    let labelled: Vec<&str> = labelled.iter().map(String::as_str).collect();
    let _static = prometheus_scrapes(static_job, &labelled).await;

    let mut discovered_job = recipe("prometheus-scrape.yml");
    discovered_job["authorization"]["credentials_file"] = token_file;
    let job = discovered_job.as_object_mut().expect("job");
    assert_eq!(
        job.remove("kubernetes_sd_configs"),
        Some(json!([{"role": "endpoints", "namespaces": {"names": ["ctrlhub-system"]}}]))
    );
    job.insert(
        "static_configs".into(),
        json!(discovered_endpoints(&k, &members).await),
    );
    let prom = prometheus_scrapes(discovered_job, &pods).await;
    let (_, dropped) = prom.targets().await.expect("targets");
    for grpc in ["ctrlhub", "ctrlhub-members"] {
        assert!(
            dropped
                .iter()
                .any(|t| t["discoveredLabels"]["__meta_kubernetes_service_name"] == grpc),
            "the gRPC Service {grpc}'s endpoints are not scraped: {dropped:?}"
        );
    }
}
