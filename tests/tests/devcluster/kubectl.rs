//! The real `kubectl` binary against devcluster, driven as a process.
//!
//! Every invocation gets `--kubeconfig` (the cluster's own, HTTPS with token auth) and a
//! fresh `--cache-dir`, so discovery always comes from this server.

use std::path::PathBuf;
use std::process::{Output, Stdio};

use ctrlhub_tests::{
    Cluster, PATIENCE, Widget, install_widget_crd, start_cluster, wait_until, within,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

fn cache_dir(tc: &Cluster) -> PathBuf {
    tc.dir.path().join("kube-cache")
}

fn kubectl_cmd(tc: &Cluster, args: &[&str]) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(&tc.kubeconfig)
        .arg("--cache-dir")
        .arg(cache_dir(tc))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn kubectl_output(tc: &Cluster, args: &[&str]) -> Output {
    let mut cmd = kubectl_cmd(tc, args);
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
    let out = kubectl_output(tc, args).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "kubectl {} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        args.join(" "),
        out.status
    );
    stdout
}

fn write_file(tc: &Cluster, name: &str, contents: &str) -> String {
    let path = tc.dir.path().join(name);
    std::fs::write(&path, contents).expect("write manifest");
    path.to_string_lossy().into_owned()
}

const GIZMO_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gizmos.kubectl.ctrlhub.dev
spec:
  group: kubectl.ctrlhub.dev
  scope: Namespaced
  names:
    plural: gizmos
    singular: gizmo
    kind: Gizmo
    shortNames: [gz]
  versions:
    - name: v1
      served: true
      storage: true
      subresources:
        status: {}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size:
                  type: integer
                color:
                  type: string
            status:
              type: object
              x-kubernetes-preserve-unknown-fields: true
"#;

fn gizmo(size: i64) -> String {
    format!(
        "apiVersion: kubectl.ctrlhub.dev/v1\nkind: Gizmo\nmetadata:\n  name: g1\n  namespace: default\nspec:\n  size: {size}\n"
    )
}

#[tokio::test]
async fn kubectl_apply_crd_then_object() {
    let tc = start_cluster().await;
    let crd = write_file(&tc, "crd.yaml", GIZMO_CRD);
    let out = kubectl(&tc, &["apply", "-f", &crd]).await;
    assert!(
        out.contains(
            "customresourcedefinition.apiextensions.k8s.io/gizmos.kubectl.ctrlhub.dev created"
        ),
        "unexpected apply output: {out}"
    );

    let obj = write_file(&tc, "g1.yaml", &gizmo(3));
    let out = kubectl(&tc, &["apply", "-f", &obj]).await;
    assert!(
        out.contains("gizmo.kubectl.ctrlhub.dev/g1 created"),
        "unexpected apply output: {out}"
    );

    let size = kubectl(&tc, &["get", "gizmos", "g1", "-o", "jsonpath={.spec.size}"]).await;
    assert_eq!(size.trim(), "3");

    // Re-applying the same manifest is a no-op; a changed one is "configured".
    let out = kubectl(&tc, &["apply", "-f", &obj]).await;
    assert!(
        out.contains("gizmo.kubectl.ctrlhub.dev/g1 unchanged"),
        "re-apply output: {out}"
    );
    let obj = write_file(&tc, "g1.yaml", &gizmo(4));
    let out = kubectl(&tc, &["apply", "-f", &obj]).await;
    assert!(
        out.contains("gizmo.kubectl.ctrlhub.dev/g1 configured"),
        "apply output: {out}"
    );

    // The short name from the CRD works, and the change is visible.
    let size = kubectl(&tc, &["get", "gz", "g1", "-o", "jsonpath={.spec.size}"]).await;
    assert_eq!(size.trim(), "4");

    // kubectl apply records the last-applied annotation on the object.
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        tc.client.clone(),
        "default",
        &kube::api::ApiResource {
            group: "kubectl.ctrlhub.dev".into(),
            version: "v1".into(),
            api_version: "kubectl.ctrlhub.dev/v1".into(),
            kind: "Gizmo".into(),
            plural: "gizmos".into(),
        },
    );
    let g = api.get("g1").await.expect("get gizmo through kube-rs");
    assert_eq!(g.data["spec"]["size"], json!(4));
    assert!(
        g.annotations()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration"),
        "client-side apply must store last-applied-configuration: {:?}",
        g.annotations()
    );
}

#[tokio::test]
async fn kubectl_get_and_get_json() {
    let tc = start_cluster().await;
    let cms: Api<ConfigMap> = tc.api("default");
    for (name, n) in [("alpha", 1), ("beta", 2)] {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.labels = Some([("suite".to_string(), "kubectl".to_string())].into());
        cm.data = Some((0..n).map(|i| (format!("k{i}"), format!("v{i}"))).collect());
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("create");
    }

    let table = kubectl(&tc, &["get", "configmaps", "-l", "suite=kubectl"]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines.first().is_some_and(|h| h.starts_with("NAME")),
        "table header missing: {table}"
    );
    let names: Vec<&str> = lines[1..]
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, vec!["alpha", "beta"], "table rows: {table}");

    let one: Value =
        serde_json::from_str(&kubectl(&tc, &["get", "configmap", "beta", "-o", "json"]).await)
            .expect("kubectl -o json prints JSON");
    assert_eq!(one["kind"], "ConfigMap");
    assert_eq!(one["apiVersion"], "v1");
    assert_eq!(one["metadata"]["name"], "beta");
    assert_eq!(one["metadata"]["namespace"], "default");
    assert_eq!(one["data"], json!({"k0": "v0", "k1": "v1"}));

    let list: Value = serde_json::from_str(
        &kubectl(
            &tc,
            &["get", "configmaps", "-l", "suite=kubectl", "-o", "json"],
        )
        .await,
    )
    .expect("list JSON");
    assert_eq!(list["kind"], "List");
    let items: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(items, vec!["alpha", "beta"]);
    assert!(
        list["items"]
            .as_array()
            .expect("items")
            .iter()
            .all(|i| i["kind"] == "ConfigMap"),
        "list items must carry kind: {list}"
    );

    let missing = kubectl_output(&tc, &["get", "configmap", "nope"]).await;
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains(r#"configmaps "nope" not found"#),
        "NotFound must surface the Status message: {stderr}"
    );
}

/// Reads lines from the child's stdout until one satisfies `pred`; panics on timeout or EOF.
async fn read_until(child: &mut Child, seen: &mut Vec<String>, pred: impl Fn(&str) -> bool) {
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    within(
        &format!("kubectl output; seen so far: {seen:?}"),
        PATIENCE,
        async {
            loop {
                match lines.next_line().await.expect("read kubectl stdout") {
                    Some(line) => {
                        let hit = pred(&line);
                        seen.push(line);
                        if hit {
                            return;
                        }
                    }
                    None => panic!("kubectl exited early; saw {seen:?}"),
                }
            }
        },
    )
    .await;
}

#[tokio::test]
async fn kubectl_get_watch_observes_change() {
    let tc = start_cluster().await;
    let cms: Api<ConfigMap> = tc.api("default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("watched".into());
    cm.data = Some([("v".to_string(), "before".to_string())].into());
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");

    let mut child = kubectl_cmd(
        &tc,
        &[
            "get",
            "configmap",
            "watched",
            "-w",
            "-o",
            "jsonpath={.data.v}{\"\\n\"}",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn kubectl get -w");

    let mut seen = Vec::new();
    read_until(&mut child, &mut seen, |l| l.trim() == "before").await;

    // Make sure kubectl's watch is open before changing the object.
    wait_until("kubectl watch to be open", PATIENCE, || async {
        let n = tc.dc.stats().watches_open();
        if n >= 1 {
            Ok(())
        } else {
            Err(format!("watches_open={n}"))
        }
    })
    .await;
    cms.patch(
        "watched",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "after"}})),
    )
    .await
    .expect("patch");

    read_until(&mut child, &mut seen, |l| l.trim() == "after").await;
    child.kill().await.expect("kill kubectl");
    assert_eq!(seen.first().map(|s| s.trim()), Some("before"));
    assert_eq!(seen.last().map(|s| s.trim()), Some("after"));
}

#[tokio::test]
async fn kubectl_apply_server_side() {
    let tc = start_cluster().await;
    let v1 = write_file(
        &tc,
        "ssa1.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: default\ndata:\n  a: \"1\"\n  b: \"x\"\n",
    );
    let out = kubectl(&tc, &["apply", "--server-side", "-f", &v1]).await;
    assert!(
        out.contains("configmap/ssa serverside-applied"),
        "apply output: {out}"
    );

    let cms: Api<ConfigMap> = tc.api("default");
    let cm = cms.get("ssa").await.expect("get");
    let data = cm.data.clone().unwrap_or_default();
    assert_eq!(data.get("a").map(String::as_str), Some("1"));
    let managers: Vec<String> = cm
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.iter().any(|m| m == "kubectl"),
        "server-side apply must record kubectl as a field manager: {managers:?}"
    );
    assert!(
        !cm.annotations()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration"),
        "server-side apply must not write the client-side annotation"
    );

    // A different manager changing a field owned by kubectl conflicts ...
    let v2 = write_file(
        &tc,
        "ssa2.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: default\ndata:\n  a: \"2\"\n",
    );
    let conflict = kubectl_output(
        &tc,
        &["apply", "--server-side", "--field-manager=other", "-f", &v2],
    )
    .await;
    assert!(!conflict.status.success(), "conflicting apply must fail");
    let stderr = String::from_utf8_lossy(&conflict.stderr);
    assert!(
        stderr.to_lowercase().contains("conflict"),
        "stderr: {stderr}"
    );

    // ... unless forced.
    let out = kubectl(
        &tc,
        &[
            "apply",
            "--server-side",
            "--field-manager=other",
            "--force-conflicts",
            "-f",
            &v2,
        ],
    )
    .await;
    assert!(
        out.contains("configmap/ssa serverside-applied"),
        "forced apply: {out}"
    );
    let data = cms.get("ssa").await.expect("get").data.unwrap_or_default();
    assert_eq!(data.get("a").map(String::as_str), Some("2"));
    assert_eq!(
        data.get("b").map(String::as_str),
        Some("x"),
        "fields still owned by kubectl stay"
    );

    // kubectl re-applying its own manifest without `a`... keeps ownership semantics: dropping
    // `b` from kubectl's manifest removes it since kubectl is its only owner.
    let v3 = write_file(
        &tc,
        "ssa3.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: default\ndata: {}\n",
    );
    kubectl(&tc, &["apply", "--server-side", "-f", &v3]).await;
    let data = cms.get("ssa").await.expect("get").data.unwrap_or_default();
    assert_eq!(
        data.get("b"),
        None,
        "field dropped by its only manager is removed: {data:?}"
    );
    assert_eq!(
        data.get("a").map(String::as_str),
        Some("2"),
        "field owned by other stays"
    );
}

#[tokio::test]
async fn kubectl_delete_wait() {
    let tc = start_cluster().await;
    let cms: Api<ConfigMap> = tc.api("default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("doomed".into());
    cm.metadata.finalizers = Some(vec!["conformance.ctrlhub.dev/hold".into()]);
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");

    let mut child = kubectl_cmd(
        &tc,
        &[
            "delete",
            "configmap",
            "doomed",
            "--wait=true",
            "--timeout=60s",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn kubectl delete");

    // The delete request lands (deletionTimestamp set) but the finalizer holds the object,
    // so kubectl must still be waiting.
    wait_until("deletionTimestamp to be set", PATIENCE, || async {
        let cm = cms.get("doomed").await.map_err(|e| e.to_string())?;
        if cm.metadata.deletion_timestamp.is_some() {
            Ok(())
        } else {
            Err("no deletionTimestamp yet".into())
        }
    })
    .await;
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "kubectl delete --wait returned while a finalizer still holds the object"
    );

    cms.patch(
        "doomed",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizer");

    let out = within(
        "kubectl delete --wait to finish",
        PATIENCE,
        child.wait_with_output(),
    )
    .await
    .expect("kubectl delete output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl delete failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(r#"configmap "doomed" deleted"#),
        "stdout: {stdout}"
    );
    assert!(cms.get_opt("doomed").await.expect("get_opt").is_none());
}

/// Finds the `kubectl api-resources` row whose first column is `name`.
fn row<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.first() == Some(&name))
        .unwrap_or_else(|| panic!("no api-resources row for {name}:\n{out}"))
}

#[tokio::test]
async fn kubectl_api_resources() {
    let tc = start_cluster().await;
    let out = kubectl(&tc, &["api-resources"]).await;
    assert!(
        out.lines().next().is_some_and(|h| h.starts_with("NAME")),
        "header: {out}"
    );
    assert_eq!(
        row(&out, "configmaps"),
        vec!["configmaps", "cm", "v1", "true", "ConfigMap"]
    );
    assert_eq!(
        row(&out, "namespaces"),
        vec!["namespaces", "ns", "v1", "false", "Namespace"]
    );
    assert_eq!(
        row(&out, "deployments"),
        vec!["deployments", "deploy", "apps/v1", "true", "Deployment"]
    );
    assert_eq!(
        row(&out, "leases"),
        vec!["leases", "coordination.k8s.io/v1", "true", "Lease"]
    );
    assert_eq!(
        row(&out, "customresourcedefinitions"),
        vec![
            "customresourcedefinitions",
            "crd,crds",
            "apiextensions.k8s.io/v1",
            "false",
            "CustomResourceDefinition"
        ]
    );
    assert!(
        !out.lines().any(|l| l.starts_with("widgets")),
        "no CRD installed yet: {out}"
    );

    install_widget_crd(&tc.client).await;
    // A fresh cache dir is not needed: kubectl invalidates discovery on an unknown group.
    let out = kubectl(
        &tc,
        &["api-resources", "--api-group=conformance.ctrlhub.dev"],
    )
    .await;
    assert_eq!(
        row(&out, "widgets"),
        vec![
            "widgets",
            "wdg",
            "conformance.ctrlhub.dev/v1",
            "true",
            "Widget"
        ]
    );
    let widgets: Api<Widget> = tc.api("default");
    assert!(
        widgets
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
}

/// A CRD's printer columns show in `kubectl get` as kube-apiserver fills them, JSONPath filters
/// included: the demo's `AVAILABLE` column (`.status.conditions[?(@.type=="Available")]`) was
/// empty.
#[tokio::test]
async fn kubectl_get_shows_printer_columns_with_jsonpath_filters() {
    let tc = start_cluster().await;
    let columns = r#"      additionalPrinterColumns:
        - name: Size
          type: integer
          jsonPath: .spec.size
        - name: Available
          type: string
          jsonPath: .status.conditions[?(@.type=="Available")].status
      subresources:"#;
    let crd = write_file(
        &tc,
        "crd.yaml",
        &GIZMO_CRD.replacen("      subresources:", columns, 1),
    );
    kubectl(&tc, &["apply", "-f", &crd]).await;
    let obj = write_file(&tc, "g1.yaml", &gizmo(3));
    kubectl(&tc, &["apply", "-f", &obj]).await;
    let status = r#"{"status":{"conditions":[{"type":"Progressing","status":"False"},{"type":"Available","status":"True"}]}}"#;
    kubectl(
        &tc,
        &[
            "patch",
            "gizmo",
            "g1",
            "--subresource=status",
            "--type=merge",
            "-p",
            status,
        ],
    )
    .await;
    let out = kubectl(&tc, &["get", "gizmos"]).await;
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.contains("SIZE") && header.contains("AVAILABLE"),
        "the printer columns are the table's: {out}"
    );
    assert_eq!(row(&out, "g1")[1..3], ["3", "True"], "{out}");
}
