//! The Website example operator (examples/website.rs) end to end, against the real manager
//! and devcluster: children created from the spec, the registry entry, Ready once the
//! Deployment's pods are (devcluster runs no pods: the test plays the kubelet and patches the
//! Deployment's status), a restart without a phantom delete, hand-edited and deleted children
//! repaired, and a deletion that removes the registry entry before the Website goes.
//!
//! The same round runs twice: in this process, and as the example's own `main` in a process
//! of its own at `CTRLHUB_LOG=trace` in JSON with its health endpoint on, which must change
//! nothing but the log lines (whose shape it checks), and whose probes answer as documented.
//!
//! Build the binaries first: `cargo build --bin ctrlhub --bin devcluster`.
#![allow(clippy::unwrap_used)]

mod support;
#[allow(dead_code)]
#[path = "../examples/website.rs"]
mod website;

use std::process::{Command, Stdio};

use ctrlhub_sdk::CancellationToken;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{
    Cluster, Manager, ManagerOptions, PATIENCE, Process, TOKEN, config_for, eventually, free_port,
    http_get, repo,
};
use tokio::task::JoinHandle;
use website::{FINALIZER, REGISTRY, Website};

const NS: &str = "web";

/// Set in the environment of the process that runs the example's `main`.
const CHILD: &str = "CTRLHUB_WEBSITE_TEST_CHILD";

/// The example's `main` (logs from `CTRLHUB_LOG*`, health from `CTRLHUB_HEALTH_ADDR`, SIGTERM
/// drains), run by `website_binary_at_trace_level_in_json` in a child process; does nothing
/// when run otherwise.
#[test]
#[ignore = "the child process of website_binary_at_trace_level_in_json"]
fn website_main() {
    if std::env::var_os(CHILD).is_some() {
        website::main().unwrap();
    }
}

/// Starts the example's `main` in a process of its own (this test binary again, running
/// `website_main`, so always as fresh as this test) with nothing but `env` (and `PATH`); its
/// stderr goes to a log in the cluster's directory.
fn spawn_main(cluster: &Cluster, env: &[(&str, String)]) -> Process {
    let exe = std::env::current_exe().unwrap();
    let log = cluster.dir.join(format!("website-{}.log", free_port()));
    let mut command = Command::new(exe);
    command
        .args(["--exact", "website_main", "--ignored", "--nocapture"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(CHILD, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (key, value) in env {
        command.env(key, value);
    }
    Process {
        child: command.spawn().unwrap(),
        log,
    }
}

/// The operator under test: in this process, or the example's binary.
enum Operator {
    InProcess {
        shutdown: CancellationToken,
        task: JoinHandle<Result<(), ctrlhub_sdk::Error>>,
    },
    Binary {
        process: Process,
        health: u16,
    },
}

/// How to run the operator.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    InProcess,
    /// The example's `main` in a process of its own, at trace level in JSON, with its health
    /// endpoint.
    Binary,
}

impl Operator {
    async fn start(mode: Mode, cluster: &Cluster, manager: &Manager) -> Operator {
        match mode {
            Mode::InProcess => {
                let shutdown = CancellationToken::new();
                let run = website::run(
                    cluster.client.clone(),
                    config_for(manager.addr()),
                    shutdown.clone(),
                );
                Operator::InProcess {
                    shutdown,
                    task: tokio::spawn(run),
                }
            }
            Mode::Binary => {
                let health = free_port();
                let process = spawn_main(
                    cluster,
                    &[
                        ("KUBECONFIG", cluster.kubeconfig.display().to_string()),
                        ("CTRLHUB_ADDR", manager.addr()),
                        ("CTRLHUB_TOKEN", TOKEN.into()),
                        ("CTRLHUB_LOG", "trace".into()),
                        ("CTRLHUB_LOG_FORMAT", "json".into()),
                        ("CTRLHUB_HEALTH_ADDR", format!("127.0.0.1:{health}")),
                    ],
                );
                // Ready once registered; live all along.
                eventually("/readyz 200", PATIENCE, || async {
                    let (code, _) = http_get(health, "/readyz").await?;
                    (code == 200).then_some(())
                })
                .await;
                assert_eq!(
                    http_get(health, "/healthz").await,
                    Some((200, "ok\n".into()))
                );
                Operator::Binary { process, health }
            }
        }
    }

    /// Drains and stops it; returns the binary's log lines.
    async fn stop(self) -> Vec<String> {
        match self {
            Operator::InProcess { shutdown, task } => {
                shutdown.cancel();
                let result = tokio::time::timeout(PATIENCE, task).await.unwrap();
                assert!(result.unwrap().is_ok());
                Vec::new()
            }
            Operator::Binary {
                mut process,
                health,
            } => {
                process.signal("TERM");
                let status = process.exited(PATIENCE).await;
                assert!(status.success(), "{status}: {}", process.tail(20));
                assert_eq!(http_get(health, "/healthz").await, None, "stopped with it");
                // The test harness's own lines (`running 1 test`) go to stdout; stderr is the
                // operator's.
                let text = std::fs::read_to_string(&process.log).unwrap();
                text.lines().map(str::to_owned).collect()
            }
        }
    }
}

/// Installs the committed CRD and waits until it is served.
async fn install_crd(cluster: &Cluster) {
    let yaml = std::fs::read_to_string(repo("deploy/examples/website/crd.yaml")).unwrap();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let sites: Api<Website> = Api::namespaced(cluster.client.clone(), NS);
    eventually("the Website kind to be served", PATIENCE, || async {
        sites.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;
}

/// The registry's entry for `name`.
async fn registered(cms: &Api<ConfigMap>, name: &str) -> Option<String> {
    let registry = cms.get_opt(REGISTRY).await.unwrap()?;
    registry.data?.get(name).cloned()
}

/// The Deployment's (image, replicas), once it exists.
async fn deployment_shape(deployments: &Api<Deployment>) -> Option<(String, i32)> {
    let d = deployments.get_opt("blog").await.unwrap()?;
    let spec = d.spec?;
    let image = spec.template.spec?.containers.first()?.image.clone()?;
    Some((image, spec.replicas?))
}

/// The Website's `Ready` status and readyReplicas.
async fn readiness(sites: &Api<Website>) -> Option<(String, Option<i32>)> {
    let site = sites.get_opt("blog").await.unwrap()?;
    let status = site.status?;
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((ready.status.clone(), status.ready_replicas))
}

#[tokio::test]
async fn website_operator_end_to_end() {
    round(Mode::InProcess, "website").await;
}

/// The same round as the example's binary at trace level in JSON: the same results, JSON lines
/// in the manager's shape with one start and one end line per reconcile, and the handler's
/// lines inside the reconcile span (key, request id).
#[tokio::test]
async fn website_binary_at_trace_level_in_json() {
    let lines = round(Mode::Binary, "website-binary").await;
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for line in &parsed {
        for field in ["timestamp", "level", "target"] {
            assert!(line[field].is_string(), "{field}: {line}");
        }
        assert!(line["fields"]["message"].is_string(), "{line}");
    }
    assert!(
        parsed.iter().any(|l| l["level"] == "DEBUG"),
        "CTRLHUB_LOG=trace shows the debug lines"
    );
    let message = |l: &Value| {
        l["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let starts: Vec<&Value> = parsed
        .iter()
        .filter(|l| message(l).starts_with("reconcile start key=web/blog"))
        .collect();
    let ends: Vec<&Value> = parsed
        .iter()
        .filter(|l| message(l).starts_with("reconcile end key=web/blog"))
        .collect();
    assert!(!starts.is_empty() && !ends.is_empty());
    for start in &starts {
        assert_eq!(start["level"], "INFO", "{start}");
        assert_eq!(start["fields"]["key"], "web/blog", "{start}");
        assert!(start["fields"]["attempt"].is_u64(), "{start}");
        assert!(start["fields"]["reasons"].is_string(), "{start}");
        assert_eq!(start["span"]["name"], "reconcile", "{start}");
        assert_eq!(start["span"]["key"], "web/blog", "{start}");
        assert!(start["span"]["request_id"].is_string(), "{start}");
    }
    for end in &ends {
        assert!(end["fields"]["duration_ms"].is_u64(), "{end}");
        let outcome = end["fields"]["outcome"].as_str().unwrap_or_default();
        assert!(!outcome.is_empty(), "{end}");
        let failed = matches!(outcome, "error" | "terminal" | "deadline" | "lost");
        assert_eq!(end["level"], if failed { "WARN" } else { "INFO" }, "{end}");
        assert_eq!(end["span"]["key"], "web/blog", "{end}");
    }
    // Every reconcile that started ended, one line each (the request ids pair up).
    let ids = |ls: &[&Value]| {
        let mut ids: Vec<String> = ls
            .iter()
            .map(|l| {
                l["span"]["request_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&starts), ids(&ends));
}

/// One round of the Website operator, run as `mode` says; returns the binary's log lines.
async fn round(mode: Mode, name: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let cluster = Cluster::start(name).await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    cluster.namespace(NS).await;
    install_crd(&cluster).await;
    let client = cluster.client.clone();
    let sites: Api<Website> = Api::namespaced(client.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);

    let blog: Website = serde_json::from_value(json!({
        "apiVersion": "example.ctrlhub.io/v1", "kind": "Website",
        "metadata": {"name": "blog"}, "spec": {"replicas": 2},
    }))
    .unwrap();
    sites.create(&PostParams::default(), &blog).await.unwrap();
    let operator = Operator::start(mode, &cluster, &manager).await;

    // Children from the spec (the image defaults), the registry entry, the finalizer.
    let shape = eventually("the Deployment", PATIENCE, || {
        deployment_shape(&deployments)
    })
    .await;
    assert_eq!(shape, ("nginx:1.27".to_owned(), 2));
    let d = deployments.get("blog").await.unwrap();
    let labels = d.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("blog")
    );
    let svc = eventually("the Service", PATIENCE, || async {
        services.get_opt("blog").await.unwrap()
    })
    .await;
    let spec = svc.spec.unwrap();
    assert_eq!(spec.selector, Some(labels.clone()));
    let port = &spec.ports.unwrap()[0];
    assert_eq!(port.port, 80);
    assert_eq!(port.target_port, Some(IntOrString::Int(8080)));
    let image = eventually("the registry entry", PATIENCE, || registered(&cms, "blog")).await;
    assert_eq!(image, "nginx:1.27");
    let finalizers = sites.get("blog").await.unwrap().metadata.finalizers;
    assert_eq!(finalizers, Some(vec![FINALIZER.to_owned()]));
    let ready = eventually("a Ready condition", PATIENCE, || readiness(&sites)).await;
    assert_eq!(ready, ("False".to_owned(), Some(0)));

    // The kubelet's part: the pods are ready. The operator reads it through the cache.
    let status = Patch::Merge(json!({"status": {"replicas": 2, "readyReplicas": 2}}));
    deployments
        .patch_status("blog", &PatchParams::default(), &status)
        .await
        .unwrap();
    eventually("Ready True", PATIENCE, || async {
        (readiness(&sites).await? == ("True".to_owned(), Some(2))).then_some(())
    })
    .await;

    // A restart: no phantom delete, the registry entry stays.
    lines.extend(operator.stop().await);
    let operator = Operator::start(mode, &cluster, &manager).await;

    // A hand-edited Deployment is repaired (which also shows the new instance works).
    let edit = Patch::Merge(
        json!({"spec": {"replicas": 5, "template": {"spec": {"containers": [
        {"name": "web", "image": "httpd:2.4"}]}}}}),
    );
    deployments
        .patch("blog", &PatchParams::default(), &edit)
        .await
        .unwrap();
    eventually("the Deployment repaired", PATIENCE, || async {
        let shape = deployment_shape(&deployments).await?;
        (shape == ("nginx:1.27".to_owned(), 2)).then_some(())
    })
    .await;
    assert_eq!(
        registered(&cms, "blog").await.as_deref(),
        Some("nginx:1.27")
    );
    let finalizers = sites.get("blog").await.unwrap().metadata.finalizers;
    assert_eq!(finalizers, Some(vec![FINALIZER.to_owned()]));

    // A deleted Service comes back.
    services
        .delete("blog", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Service re-created", PATIENCE, || async {
        services.get_opt("blog").await.unwrap()
    })
    .await;

    // Deleting the Website removes its registry entry, then the finalizer, then the object.
    sites
        .delete("blog", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Website gone", PATIENCE, || async {
        sites.get_opt("blog").await.unwrap().is_none().then_some(())
    })
    .await;
    // The entry went before the finalizer did.
    assert_eq!(registered(&cms, "blog").await, None);
    lines.extend(operator.stop().await);
    lines
}

/// `kubectl` against `cluster` as its admin: the output, or a panic with what it said.
async fn kubectl(cluster: &Cluster, args: &[&str]) -> String {
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(args)
        .output()
        .await
        .expect("kubectl is on the PATH");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// deploy/examples/rust-website as written: applied with kubectl (devcluster validates it
/// strictly), then the operator run with the Deployment's own environment (only the manager's
/// address, the token file and the health port made local), its ServiceAccount's token for its
/// writes (so its Role is proven sufficient: apply, finalizer, status, registry, Events), and
/// probed on the Deployment's own probe paths.
#[tokio::test]
async fn the_deploy_example_runs_with_its_own_rbac_and_probes() {
    let cluster = Cluster::start("website-deploy").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let crd = repo("deploy/examples/website/crd.yaml");
    let operator = repo("deploy/examples/rust-website/operator.yaml");
    kubectl(&cluster, &["create", "namespace", "team-a"]).await;
    kubectl(&cluster, &["apply", "-f", crd.to_str().unwrap()]).await;
    kubectl(
        &cluster,
        &["apply", "--server-side", "-f", operator.to_str().unwrap()],
    )
    .await;
    let deployment: Value = serde_json::from_str(
        &kubectl(
            &cluster,
            &[
                "get",
                "deployment",
                "website-operator",
                "-n",
                "team-a",
                "-o",
                "json",
            ],
        )
        .await,
    )
    .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let token = kubectl(
        &cluster,
        &["create", "token", "website-operator", "-n", "team-a"],
    )
    .await;
    let admin = std::fs::read_to_string(&cluster.kubeconfig).unwrap();
    assert!(admin.contains("devcluster-admin"));
    let kubeconfig = cluster.dir.join("website-operator.kubeconfig");
    std::fs::write(&kubeconfig, admin.replace("devcluster-admin", token.trim())).unwrap();
    let token_file = cluster.dir.join("ctrlhub-token");
    std::fs::write(&token_file, TOKEN).unwrap();

    let health = free_port();
    let mut env = vec![("KUBECONFIG", kubeconfig.display().to_string())];
    for entry in container["env"].as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        let value = match name {
            "CTRLHUB_ADDR" => format!("127.0.0.1:{}", manager.grpc_port),
            "CTRLHUB_TOKEN_FILE" => token_file.display().to_string(),
            "CTRLHUB_HEALTH_ADDR" => {
                assert_eq!(entry["value"], "0.0.0.0:8081");
                format!("127.0.0.1:{health}")
            }
            _ => match entry["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => "website-operator-x".into(),
                _ => entry["value"].as_str().unwrap().to_owned(),
            },
        };
        env.push((name, value));
    }
    let mut process = spawn_main(&cluster, &env);
    let probe = |kind: &str| {
        let path = container[kind]["httpGet"]["path"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(container[kind]["httpGet"]["port"], "health");
        path
    };
    let (live, ready) = (probe("livenessProbe"), probe("readinessProbe"));
    assert_eq!(container["ports"][0]["containerPort"], 8081);
    eventually("the readiness probe", PATIENCE, || async {
        (http_get(health, &ready).await?.0 == 200).then_some(())
    })
    .await;
    assert_eq!(http_get(health, &live).await.map(|r| r.0), Some(200));

    let sites: Api<Website> = Api::namespaced(cluster.client.clone(), "team-a");
    let site: Website = serde_json::from_value(json!({
        "apiVersion": "example.ctrlhub.io/v1", "kind": "Website",
        "metadata": {"name": "shop"}, "spec": {"replicas": 1},
    }))
    .unwrap();
    sites.create(&PostParams::default(), &site).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), "team-a");
    eventually(
        "the Deployment, the finalizer and the status",
        PATIENCE,
        || async {
            deployments.get_opt("shop").await.unwrap()?;
            let site = sites.get_opt("shop").await.unwrap()?;
            let ready = site
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (site.metadata.finalizers == Some(vec![FINALIZER.to_owned()])
                && ready.status == "False")
                .then_some(())
        },
    )
    .await;
    sites
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the Website gone through its finalizer",
        PATIENCE,
        || async { sites.get_opt("shop").await.unwrap().is_none().then_some(()) },
    )
    .await;
    let logged = std::fs::read_to_string(&process.log).unwrap();
    assert!(
        !logged.contains("forbidden"),
        "the Role allows everything the operator does: {logged}"
    );
    process.signal("TERM");
    let status = process.exited(PATIENCE).await;
    assert!(status.success(), "{status}: {}", process.tail(20));
}
