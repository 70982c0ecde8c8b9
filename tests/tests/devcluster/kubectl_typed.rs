//! kubectl 1.32's typed commands against devcluster: every `kubectl create`
//! subcommand, `run`, `expose`, `scale` and `create token` send protobuf bodies; `explain`
//! reads the OpenAPI v3 documents; `apply --server-side` after `apply` upgrades from
//! client-side apply; and invalid objects are refused as a real server refuses them.
//!
//! Every invocation gets `--kubeconfig` (the cluster's own) and a fresh `--cache-dir`, so
//! discovery and OpenAPI always come from this server.

use std::collections::BTreeSet;
use std::process::{Output, Stdio};

use ctrlhub_tests::{Cluster, PATIENCE, install_widget_crd, start_cluster, within};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ResourceQuota, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::Api;
use serde_json::{Value, json};
use tokio::process::Command;

async fn run(tc: &Cluster, args: &[&str]) -> Output {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(&tc.kubeconfig)
        .arg("--cache-dir")
        .arg(tc.dir.path().join("kube-cache"))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    within(
        &format!("kubectl {}", args.join(" ")),
        PATIENCE,
        cmd.output(),
    )
    .await
    .expect("kubectl must be installed and runnable")
}

/// Runs kubectl and requires success, returning stdout.
async fn kubectl(tc: &Cluster, args: &[&str]) -> String {
    let out = run(tc, args).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {} failed ({}):\nstdout: {stdout}\nstderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs kubectl and requires failure, returning stderr.
async fn kubectl_fails(tc: &Cluster, args: &[&str]) -> String {
    let out = run(tc, args).await;
    assert!(
        !out.status.success(),
        "kubectl {} should have failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write_file(tc: &Cluster, name: &str, contents: &str) -> String {
    let path = tc.dir.path().join(name);
    std::fs::write(&path, contents).expect("write file");
    path.to_string_lossy().into_owned()
}

/// The subcommands `kubectl <parent> --help` lists, so the test notices new ones.
async fn subcommands(tc: &Cluster, parent: &[&str]) -> BTreeSet<String> {
    let mut args = parent.to_vec();
    args.push("--help");
    let help = kubectl(tc, &args).await;
    help.lines()
        .skip_while(|l| !l.starts_with("Available Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn decoded(secret: &Secret, key: &str) -> String {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .unwrap_or_else(|| panic!("secret has no {key}"));
    String::from_utf8_lossy(&bytes.0).into_owned()
}

#[tokio::test]
async fn every_kubectl_create_subcommand_works() {
    let tc = start_cluster().await;
    let ns = "typed";
    // Every subcommand kubectl offers is exercised below; a new kubectl subcommand fails here.
    let covered: BTreeSet<String> = [
        "clusterrole",
        "clusterrolebinding",
        "configmap",
        "cronjob",
        "deployment",
        "ingress",
        "job",
        "namespace",
        "poddisruptionbudget",
        "priorityclass",
        "quota",
        "role",
        "rolebinding",
        "secret",
        "service",
        "serviceaccount",
        "token",
    ]
    .map(str::to_string)
    .into();
    assert_eq!(subcommands(&tc, &["create"]).await, covered);
    let secrets: BTreeSet<String> = ["docker-registry", "generic", "tls"]
        .map(str::to_string)
        .into();
    assert_eq!(subcommands(&tc, &["create", "secret"]).await, secrets);
    let services: BTreeSet<String> = ["clusterip", "externalname", "loadbalancer", "nodeport"]
        .map(str::to_string)
        .into();
    assert_eq!(subcommands(&tc, &["create", "service"]).await, services);

    kubectl(&tc, &["create", "namespace", ns]).await;
    // The namespace goes first: anything after `--` is the container's command.
    let n = |args: &[&str]| {
        let mut v = vec!["-n".to_string(), ns.to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        v
    };
    let cert = rcgen::generate_simple_self_signed(vec!["typed.example".to_string()]).expect("cert");
    let crt = write_file(&tc, "tls.crt", &cert.cert.pem());
    let key = write_file(&tc, "tls.key", &cert.signing_key.serialize_pem());
    let commands: Vec<Vec<String>> = vec![
        n(&[
            "create",
            "configmap",
            "cm",
            "--from-literal=greeting=hello",
            "--from-literal=n=1",
        ]),
        n(&[
            "create",
            "secret",
            "generic",
            "generic",
            "--from-literal=password=s3cret",
        ]),
        n(&[
            "create",
            "secret",
            "docker-registry",
            "registry",
            "--docker-server=r.example",
            "--docker-username=u",
            "--docker-password=p",
        ]),
        n(&[
            "create",
            "secret",
            "tls",
            "tls",
            &format!("--cert={crt}"),
            &format!("--key={key}"),
        ]),
        n(&["create", "serviceaccount", "robot"]),
        n(&[
            "create",
            "deployment",
            "web",
            "--image=nginx:1.27",
            "--replicas=0",
            "--port=80",
        ]),
        n(&[
            "create",
            "job",
            "once",
            "--image=busybox",
            "--",
            "echo",
            "hi",
        ]),
        n(&[
            "create",
            "cronjob",
            "nightly",
            "--image=busybox",
            "--schedule=0 3 * * *",
            "--",
            "echo",
            "hi",
        ]),
        n(&[
            "create",
            "ingress",
            "site",
            "--rule=site.example/api*=web:80",
            "--class=nginx",
        ]),
        n(&[
            "create",
            "poddisruptionbudget",
            "web",
            "--selector=app=web",
            "--min-available=1",
        ]),
        vec![
            "create".into(),
            "priorityclass".into(),
            "important".into(),
            "--value=1000".into(),
            "--description=test".into(),
        ],
        n(&["create", "quota", "small", "--hard=cpu=1,memory=1Gi,pods=2"]),
        n(&[
            "create",
            "role",
            "reader",
            "--verb=get,list",
            "--resource=pods",
        ]),
        n(&[
            "create",
            "rolebinding",
            "reader",
            "--role=reader",
            "--serviceaccount=typed:robot",
        ]),
        vec![
            "create".into(),
            "clusterrole".into(),
            "viewer".into(),
            "--verb=get".into(),
            "--resource=deployments.apps".into(),
        ],
        vec![
            "create".into(),
            "clusterrolebinding".into(),
            "viewer".into(),
            "--clusterrole=viewer".into(),
            "--user=alice".into(),
        ],
        n(&["create", "service", "clusterip", "web", "--tcp=80:8080"]),
        n(&["create", "service", "nodeport", "node", "--tcp=80:8080"]),
        n(&["create", "service", "loadbalancer", "lb", "--tcp=443:8443"]),
        n(&[
            "create",
            "service",
            "externalname",
            "ext",
            "--external-name=db.example",
        ]),
    ];
    for args in &commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl(&tc, &args).await;
    }
    let token = kubectl(&tc, &["create", "token", "robot", "-n", ns]).await;
    assert_eq!(token.trim().split('.').count(), 3, "a JWT: {token}");

    // What the protobuf bodies carried arrived as the JSON a manifest would have.
    let c = &tc.client;
    let cm = Api::<ConfigMap>::namespaced(c.clone(), ns)
        .get("cm")
        .await
        .expect("cm");
    assert_eq!(
        cm.data
            .unwrap_or_default()
            .get("greeting")
            .map(String::as_str),
        Some("hello")
    );
    let secrets = Api::<Secret>::namespaced(c.clone(), ns);
    assert_eq!(
        decoded(&secrets.get("generic").await.expect("generic"), "password"),
        "s3cret"
    );
    let registry = secrets.get("registry").await.expect("registry");
    assert_eq!(
        registry.type_.as_deref(),
        Some("kubernetes.io/dockerconfigjson")
    );
    assert!(decoded(&registry, ".dockerconfigjson").contains("r.example"));
    let tls = secrets.get("tls").await.expect("tls");
    assert!(decoded(&tls, "tls.crt").starts_with("-----BEGIN CERTIFICATE-----"));
    Api::<ServiceAccount>::namespaced(c.clone(), ns)
        .get("robot")
        .await
        .expect("sa");
    let d = Api::<Deployment>::namespaced(c.clone(), ns)
        .get("web")
        .await
        .expect("deployment");
    let spec = d.spec.expect("spec");
    assert_eq!(spec.replicas, Some(0), "an explicit zero survives protobuf");
    let container = &spec.template.spec.expect("pod spec").containers[0];
    assert_eq!(container.image.as_deref(), Some("nginx:1.27"));
    assert_eq!(
        container.ports.as_ref().map(|p| p[0].container_port),
        Some(80)
    );
    let job = Api::<Job>::namespaced(c.clone(), ns)
        .get("once")
        .await
        .expect("job");
    let job_spec = job.spec.expect("job spec");
    assert_eq!(
        job_spec
            .template
            .spec
            .expect("pod")
            .restart_policy
            .as_deref(),
        Some("Never")
    );
    assert!(
        job_spec.selector.is_some(),
        "the server generates a Job's selector"
    );
    let cj = Api::<CronJob>::namespaced(c.clone(), ns)
        .get("nightly")
        .await
        .expect("cronjob");
    assert_eq!(cj.spec.expect("cj spec").schedule, "0 3 * * *");
    let ing = Api::<Ingress>::namespaced(c.clone(), ns)
        .get("site")
        .await
        .expect("ingress");
    let ing = serde_json::to_value(ing.spec.expect("ingress spec")).expect("json");
    assert_eq!(ing["ingressClassName"], "nginx");
    assert_eq!(
        ing["rules"][0]["host"], "site.example",
        "embedded structs are flattened: {ing}"
    );
    assert_eq!(ing["rules"][0]["http"]["paths"][0]["pathType"], "Prefix");
    assert_eq!(
        ing["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"]["number"],
        80
    );
    let pdb = Api::<PodDisruptionBudget>::namespaced(c.clone(), ns)
        .get("web")
        .await
        .expect("pdb");
    assert_eq!(
        serde_json::to_value(pdb.spec.expect("pdb spec").min_available).expect("json"),
        json!(1)
    );
    let pc = Api::<PriorityClass>::all(c.clone())
        .get("important")
        .await
        .expect("pc");
    assert_eq!(pc.value, 1000);
    let quota = Api::<ResourceQuota>::namespaced(c.clone(), ns)
        .get("small")
        .await
        .expect("quota");
    let hard = quota.spec.and_then(|s| s.hard).unwrap_or_default();
    assert_eq!(hard.get("memory").map(|q| q.0.as_str()), Some("1Gi"));
    let role = Api::<Role>::namespaced(c.clone(), ns)
        .get("reader")
        .await
        .expect("role");
    assert_eq!(role.rules.unwrap_or_default()[0].verbs, vec!["get", "list"]);
    let rb = Api::<RoleBinding>::namespaced(c.clone(), ns)
        .get("reader")
        .await
        .expect("rb");
    assert_eq!(rb.subjects.unwrap_or_default()[0].name, "robot");
    let cr = Api::<ClusterRole>::all(c.clone())
        .get("viewer")
        .await
        .expect("cr");
    assert_eq!(
        cr.rules.unwrap_or_default()[0].api_groups,
        Some(vec!["apps".to_string()])
    );
    let crb = Api::<ClusterRoleBinding>::all(c.clone())
        .get("viewer")
        .await
        .expect("crb");
    assert_eq!(crb.role_ref.name, "viewer");
    let svcs = Api::<Service>::namespaced(c.clone(), ns);
    let web = serde_json::to_value(svcs.get("web").await.expect("svc")).expect("json");
    assert_eq!(
        web["spec"]["ports"][0]["targetPort"], 8080,
        "IntOrString as a number: {web}"
    );
    assert_eq!(web["spec"]["type"], "ClusterIP");
    let node = serde_json::to_value(svcs.get("node").await.expect("svc")).expect("json");
    assert_eq!(node["spec"]["type"], "NodePort");
    let ext = serde_json::to_value(svcs.get("ext").await.expect("svc")).expect("json");
    assert_eq!(ext["spec"]["externalName"], "db.example");
}

#[tokio::test]
async fn kubectl_run_expose_and_scale_work() {
    let tc = start_cluster().await;
    kubectl(
        &tc,
        &[
            "run",
            "solo",
            "--image=nginx",
            "--port=8080",
            "--labels=app=solo",
            "--env=MODE=test",
        ],
    )
    .await;
    let pod = Api::<Pod>::namespaced(tc.client.clone(), "default")
        .get("solo")
        .await
        .expect("pod");
    let pod = serde_json::to_value(pod).expect("json");
    assert_eq!(
        pod["spec"]["containers"][0]["env"],
        json!([{"name": "MODE", "value": "test"}])
    );
    kubectl(
        &tc,
        &[
            "expose",
            "pod",
            "solo",
            "--port=80",
            "--target-port=8080",
            "--name=solo",
        ],
    )
    .await;
    let svc = Api::<Service>::namespaced(tc.client.clone(), "default")
        .get("solo")
        .await
        .expect("svc");
    let svc = serde_json::to_value(svc).expect("json");
    assert_eq!(svc["spec"]["selector"], json!({"app": "solo"}));
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080);

    kubectl(&tc, &["create", "deployment", "web", "--image=nginx"]).await;
    kubectl(
        &tc,
        &["expose", "deployment", "web", "--port=80", "--name=web"],
    )
    .await;
    kubectl(&tc, &["scale", "deployment", "web", "--replicas=4"]).await;
    let replicas = kubectl(
        &tc,
        &[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    )
    .await;
    assert_eq!(replicas, "4");
}

#[tokio::test]
async fn kubectl_explain_reads_built_in_and_crd_schemas() {
    let tc = start_cluster().await;
    let out = kubectl(&tc, &["explain", "deployment.spec.replicas"]).await;
    assert!(out.contains("FIELD: replicas <integer>"), "{out}");
    assert!(out.contains("Number of desired pods"), "{out}");
    let out = kubectl(&tc, &["explain", "pods.spec.containers", "--recursive"]).await;
    assert!(out.contains("livenessProbe"), "{out}");
    install_widget_crd(&tc.client).await;
    let out = kubectl(&tc, &["explain", "widgets.spec.size"]).await;
    assert!(out.contains("Desired size"), "{out}");
    let out = kubectl(&tc, &["explain", "widgets.metadata.labels"]).await;
    assert!(out.contains("map[string]string"), "{out}");
}

#[tokio::test]
async fn openapi_v3_documents_are_cached_by_etag() {
    let tc = start_cluster().await;
    let index = tc.raw.get("/openapi/v3").await;
    assert_eq!(index.status, 200);
    let url = index.body["paths"]["apis/apps/v1"]["serverRelativeURL"]
        .as_str()
        .expect("apps/v1 in the index")
        .to_string();
    let http = tc.raw.http();
    let first = http.get(tc.raw.url(&url)).send().await.expect("get");
    assert_eq!(first.status().as_u16(), 200);
    assert_eq!(
        first
            .headers()
            .get("cache-control")
            .and_then(|v| v.to_str().ok()),
        Some("public, immutable")
    );
    let etag = first.headers().get("etag").cloned().expect("etag");
    let doc: Value = first.json().await.expect("json");
    assert!(doc["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"].is_object());
    let again = http
        .get(tc.raw.url("/openapi/v3/apis/apps/v1"))
        .header("if-none-match", etag)
        .send()
        .await
        .expect("get");
    assert_eq!(again.status().as_u16(), 304);
    // A new CRD group appears in the index; a stale hash redirects to the current document.
    install_widget_crd(&tc.client).await;
    let index = tc.raw.get("/openapi/v3").await;
    assert!(
        index.body["paths"]["apis/conformance.ctrlhub.dev/v1"].is_object(),
        "{}",
        index.body
    );
    let stale = http
        .get(tc.raw.url("/openapi/v3/apis/apps/v1?hash=0000"))
        .send()
        .await
        .expect("get");
    assert_eq!(stale.status().as_u16(), 200);
    assert_eq!(
        stale.url().as_str(),
        tc.raw.url(&url),
        "redirected to the current hash"
    );
}

#[tokio::test]
async fn kubectl_upgrades_client_side_apply_to_server_side_apply() {
    let tc = start_cluster().await;
    let manifest = |a: &str, b: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{}}\ndata:\n  a: \"{a}\"\n  b: \"{b}\"\n"
        )
    };
    let first = write_file(&tc, "v1.yaml", &manifest("1", "x").replace("{}", "upgrade"));
    kubectl(&tc, &["apply", "-f", &first]).await;
    let second = write_file(&tc, "v2.yaml", &manifest("2", "x").replace("{}", "upgrade"));
    kubectl(&tc, &["apply", "--server-side", "-f", &second]).await;
    let cm = Api::<ConfigMap>::namespaced(tc.client.clone(), "default")
        .get("upgrade")
        .await
        .expect("cm");
    assert_eq!(
        cm.data.unwrap_or_default().get("a").map(String::as_str),
        Some("2")
    );
    let managers: Vec<(String, String)> = cm
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m.manager.unwrap_or_default(),
                m.operation.unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&("kubectl".to_string(), "Apply".to_string())),
        "{managers:?}"
    );

    // A field someone else changed after the client-side apply still conflicts.
    let other = write_file(
        &tc,
        "o1.yaml",
        &manifest("1", "x").replace("{}", "contested"),
    );
    kubectl(&tc, &["apply", "-f", &other]).await;
    kubectl(
        &tc,
        &[
            "patch",
            "configmap",
            "contested",
            "--type=merge",
            "-p",
            r#"{"data":{"b":"y"}}"#,
            "--field-manager=someone",
        ],
    )
    .await;
    let changed = write_file(
        &tc,
        "o2.yaml",
        &manifest("1", "z").replace("{}", "contested"),
    );
    let err = kubectl_fails(&tc, &["apply", "--server-side", "-f", &changed]).await;
    assert!(err.contains("conflict with \"someone\": .data.b"), "{err}");
}

#[tokio::test]
async fn kubectl_sees_the_servers_validation_errors() {
    let tc = start_cluster().await;
    let bad_type = write_file(
        &tc,
        "three.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: three}\nspec:\n  replicas: \"three\"\n  selector: {matchLabels: {app: a}}\n  template:\n    metadata: {labels: {app: a}}\n    spec: {containers: [{name: c, image: nginx}]}\n",
    );
    let err = kubectl_fails(&tc, &["apply", "-f", &bad_type]).await;
    assert!(
        err.contains("json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"),
        "{err}"
    );
    let mismatch = write_file(
        &tc,
        "mismatch.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: mismatch}\nspec:\n  selector: {matchLabels: {app: a}}\n  template:\n    metadata: {labels: {app: b}}\n    spec: {containers: [{name: c, image: nginx}]}\n",
    );
    let err = kubectl_fails(&tc, &["apply", "-f", &mismatch]).await;
    assert!(
        err.contains("The Deployment \"mismatch\" is invalid"),
        "{err}"
    );
    assert!(
        err.contains("`selector` does not match template `labels`"),
        "{err}"
    );
    // kubectl asks for strict field validation by default.
    let unknown = write_file(
        &tc,
        "unknown.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: unknown}\nbogus: 1\n",
    );
    let err = kubectl_fails(&tc, &["create", "-f", &unknown]).await;
    assert!(
        err.contains("strict decoding error: unknown field \"bogus\""),
        "{err}"
    );
    let out = run(&tc, &["create", "-f", &unknown, "--validate=warn"]).await;
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field \"bogus\""));
}
