//! Field selectors on core/v1 Events, as kube-apiserver registers them: `involvedObject.*`,
//! `reason`, `reportingComponent`, `source` and `type`, on lists and watches.
//!
//! Operators post Events on the objects they handle (kopf, for one, posts `kopf.event()`/
//! `kopf.info()` and, with `settings.posting.loggers`, its handler log lines), and people read
//! them with `kubectl describe`, which finds an object's events with
//! `fieldSelector=involvedObject.name=…,involvedObject.namespace=…,involvedObject.kind=…,
//! involvedObject.uid=…`. devcluster used to answer that with 400 "field label not supported",
//! which kubectl swallows: `describe` showed `Events: <none>`. Raw HTTPS (see
//! `ctrlhub_tests::RawApi`) for the exact answers, the real kubectl for what a user sees.

use std::collections::BTreeSet;
use std::process::Stdio;

use ctrlhub_tests::{Cluster, PATIENCE, RawApi, start_cluster, within};
use serde_json::{Value, json};
use tokio::process::Command;

const EVENTS: &str = "/api/v1/namespaces/default/events";
const CMS: &str = "/api/v1/namespaces/default/configmaps";

async fn create(raw: &RawApi, collection: &str, body: &Value) -> Value {
    let r = raw.post(collection, body).await;
    assert_eq!(r.status, 201, "create in {collection} failed: {}", r.body);
    r.body
}

/// A core/v1 Event named `name` about `kind`/`object` (uid `uid`), reported by `component`
/// in `source.component` when `in_source`, else only in `reportingComponent`.
// Each argument is one field a selector below filters on; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
fn event(
    name: &str,
    kind: &str,
    object: &str,
    uid: &str,
    reason: &str,
    type_: &str,
    component: &str,
    in_source: bool,
) -> Value {
    let mut e = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "name": object,
            "namespace": "default", "uid": uid, "resourceVersion": "7"},
        "reason": reason, "message": format!("{reason} happened to {object}"), "type": type_,
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z",
        "count": 1, "reportingComponent": component, "reportingInstance": "test",
    });
    if in_source {
        e["source"] = json!({"component": component});
    }
    e
}

/// The names of the events a list with `selector` returns.
async fn names(raw: &RawApi, selector: &str) -> BTreeSet<String> {
    let r = raw.get(&format!("{EVENTS}?fieldSelector={selector}")).await;
    assert_eq!(r.status, 200, "list with {selector}: {}", r.body);
    r.body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// Three events: two about ConfigMap `a` (one from kopf, one a Warning from a recorder that
/// fills only `reportingComponent`), one about Secret `b`.
async fn seed(raw: &RawApi) {
    let events = [
        event(
            "a.1",
            "ConfigMap",
            "a",
            "uid-a",
            "Logging",
            "Normal",
            "kopf",
            true,
        ),
        event(
            "a.2",
            "ConfigMap",
            "a",
            "uid-a",
            "Failed",
            "Warning",
            "ctl",
            false,
        ),
        event(
            "b.1", "Secret", "b", "uid-b", "Logging", "Normal", "kopf", true,
        ),
    ];
    for e in &events {
        create(raw, EVENTS, e).await;
    }
}

#[tokio::test]
async fn event_field_selectors_filter_lists() {
    let tc = start_cluster().await;
    seed(&tc.raw).await;
    let raw = &tc.raw;
    assert_eq!(
        names(raw, "involvedObject.name=a").await,
        set(&["a.1", "a.2"])
    );
    assert_eq!(
        names(raw, "involvedObject.kind=Secret").await,
        set(&["b.1"])
    );
    assert_eq!(names(raw, "involvedObject.uid=uid-b").await, set(&["b.1"]));
    assert_eq!(
        names(
            raw,
            "involvedObject.namespace=default,involvedObject.apiVersion=v1"
        )
        .await,
        set(&["a.1", "a.2", "b.1"])
    );
    assert_eq!(
        names(raw, "involvedObject.resourceVersion=7").await,
        set(&["a.1", "a.2", "b.1"])
    );
    // An unset field compares as "" (as in kube-apiserver's field sets).
    assert_eq!(
        names(raw, "involvedObject.fieldPath=").await,
        set(&["a.1", "a.2", "b.1"])
    );
    assert_eq!(names(raw, "reason=Failed").await, set(&["a.2"]));
    assert_eq!(names(raw, "type!=Normal").await, set(&["a.2"]));
    assert_eq!(
        names(raw, "reportingComponent=kopf").await,
        set(&["a.1", "b.1"])
    );
    // `source` is source.component, or reportingComponent when that is empty.
    assert_eq!(names(raw, "source=ctl").await, set(&["a.2"]));
    assert_eq!(names(raw, "source=kopf").await, set(&["a.1", "b.1"]));
    // kubectl describe's query, combined with metadata fields.
    assert_eq!(
        names(
            raw,
            "involvedObject.name=a,involvedObject.namespace=default,involvedObject.kind=ConfigMap,involvedObject.uid=uid-a"
        )
        .await,
        set(&["a.1", "a.2"])
    );
    assert_eq!(
        names(raw, "involvedObject.name=a,metadata.name!=a.1").await,
        set(&["a.2"])
    );
    // Labels are per resource: unknown event fields and event fields on other resources are
    // still refused.
    let r = raw
        .get(&format!("{EVENTS}?fieldSelector=involvedObject.color=red"))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("field label not supported: involvedObject.color"),
        "{}",
        r.body
    );
    let r = raw
        .get(&format!("{CMS}?fieldSelector=involvedObject.name=a"))
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
}

#[tokio::test]
async fn event_field_selectors_filter_watches() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let mut w = raw
        .watch(&format!(
            "{EVENTS}?watch=true&fieldSelector=involvedObject.kind%3DConfigMap,type%3DWarning"
        ))
        .await;
    assert_eq!(w.status, 200);
    seed(raw).await;
    // Only a.2 matches; the next matching event after it proves nothing else came between.
    create(
        raw,
        EVENTS,
        &event(
            "c.1",
            "ConfigMap",
            "c",
            "uid-c",
            "Failed",
            "Warning",
            "ctl",
            false,
        ),
    )
    .await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let ev = w.next_event(PATIENCE).await.expect("watch ended");
        if ev["type"] == "BOOKMARK" {
            continue;
        }
        assert_eq!(ev["type"], "ADDED", "{ev}");
        seen.push(
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    assert_eq!(seen, ["a.2", "c.1"]);
}

async fn kubectl(tc: &Cluster, args: &[&str]) -> String {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(&tc.kubeconfig)
        .arg("--cache-dir")
        .arg(tc.dir.path().join("kube-cache"))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = within("kubectl", PATIENCE, cmd.output())
        .await
        .expect("kubectl must be installed and runnable");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {} failed ({}): {stdout}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test]
async fn kubectl_describe_shows_the_objects_events() {
    let tc = start_cluster().await;
    let cm = create(
        &tc.raw,
        CMS,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}}),
    )
    .await;
    let uid = cm["metadata"]["uid"].as_str().unwrap_or_default();
    assert!(!uid.is_empty(), "{cm}");
    for e in [
        event(
            "a.1",
            "ConfigMap",
            "a",
            uid,
            "Logging",
            "Normal",
            "kopf",
            true,
        ),
        // Same name, another uid: an earlier ConfigMap `a`; describe must not show it.
        event(
            "a.old",
            "ConfigMap",
            "a",
            "uid-gone",
            "Stale",
            "Normal",
            "kopf",
            true,
        ),
    ] {
        create(&tc.raw, EVENTS, &e).await;
    }
    let out = kubectl(&tc, &["describe", "configmap", "a", "-n", "default"]).await;
    let events = out
        .split_once("Events:")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no Events section in:\n{out}"));
    assert!(
        events.contains("Logging") && events.contains("Logging happened to a"),
        "describe does not show the ConfigMap's event:\n{out}"
    );
    assert!(
        !events.contains("Stale"),
        "describe shows another object's event:\n{out}"
    );
}
