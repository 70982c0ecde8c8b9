//! API-server semantics that controllers and client libraries silently depend on.
//!
//! Most checks use raw HTTPS (see `ctrlhub_tests::RawApi`) because kube-rs would hide the
//! exact status codes, headers, watch events and Status bodies being verified.

use std::collections::BTreeSet;
use std::time::Duration;

use ctrlhub_tests::{
    PATIENCE, RawApi, RawWatch, install_widget_crd, rv_num, rv_of, start_cluster,
    start_cluster_with, wait_until,
};
use devcluster::Options;
use serde_json::{Value, json};

const CM: &str = "/api/v1/namespaces/default/configmaps";
const WIDGETS: &str = "/apis/conformance.ctrlhub.dev/v1/namespaces/default/widgets";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";

/// How long we listen to make sure *no* event arrives.
const QUIET: Duration = Duration::from_millis(1500);

fn cm(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

async fn create(raw: &RawApi, collection: &str, body: &Value) -> Value {
    let r = raw.post(collection, body).await;
    assert_eq!(r.status, 201, "create in {collection} failed: {}", r.body);
    r.body
}

fn widget_body(name: &str, size: i64) -> Value {
    json!({
        "apiVersion": "conformance.ctrlhub.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size}
    })
}

fn ev_type(ev: &Value) -> &str {
    ev["type"].as_str().unwrap_or_default()
}

fn ev_name(ev: &Value) -> &str {
    ev["object"]["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
}

/// Next non-BOOKMARK event; panics if the stream ends or stays silent too long.
async fn next_change(w: &mut RawWatch) -> Value {
    loop {
        let ev = w
            .next_event(PATIENCE)
            .await
            .expect("watch ended unexpectedly");
        if ev_type(&ev) != "BOOKMARK" {
            return ev;
        }
    }
}

/// Asserts that no non-BOOKMARK event arrives within [`QUIET`].
async fn assert_quiet(w: &mut RawWatch, why: &str) {
    let deadline = tokio::time::Instant::now() + QUIET;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return;
        }
        match w.try_next_event(left).await {
            Err(()) => return,
            Ok(None) => panic!("watch ended while checking that {why}"),
            Ok(Some(ev)) if ev_type(&ev) == "BOOKMARK" => {}
            Ok(Some(ev)) => panic!("unexpected event ({why}): {ev}"),
        }
    }
}

fn assert_status(body: &Value, code: u64, reason: &str) {
    assert_eq!(body["kind"], "Status", "not a Status object: {body}");
    assert_eq!(body["apiVersion"], "v1", "Status apiVersion: {body}");
    assert_eq!(body["status"], "Failure", "Status.status: {body}");
    assert_eq!(body["code"], code, "Status.code: {body}");
    assert_eq!(body["reason"], reason, "Status.reason: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "Status.message must be set: {body}"
    );
}

#[tokio::test]
async fn deleted_event_carries_new_resource_version() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let created = create(raw, CM, &cm("gone", json!({"a": "1"}))).await;
    let rv1 = rv_of(&created);

    let mut w = raw
        .watch(&format!("{CM}?watch=true&resourceVersion={rv1}"))
        .await;
    assert_eq!(w.status, 200);
    let del = raw.delete(&format!("{CM}/gone"), None).await;
    assert_eq!(del.status, 200, "delete: {}", del.body);

    let ev = next_change(&mut w).await;
    assert_eq!(ev_type(&ev), "DELETED", "event: {ev}");
    assert_eq!(ev_name(&ev), "gone");
    let deleted_rv = rv_of(&ev["object"]);
    assert_ne!(
        deleted_rv, rv1,
        "DELETED must carry the deletion's resourceVersion"
    );
    assert!(rv_num(&deleted_rv) > rv_num(&rv1));

    // Resuming from the DELETED event's resourceVersion must not replay the deletion.
    let mut w2 = raw
        .watch(&format!("{CM}?watch=true&resourceVersion={deleted_rv}"))
        .await;
    create(raw, CM, &cm("after", json!({}))).await;
    let ev = next_change(&mut w2).await;
    assert_eq!(
        (ev_type(&ev), ev_name(&ev)),
        ("ADDED", "after"),
        "event: {ev}"
    );
}

#[tokio::test]
async fn empty_list_carries_current_resource_version() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let created = create(raw, CM, &cm("somewhere-else", json!({}))).await;

    let list = raw.get("/api/v1/namespaces/kube-public/configmaps").await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(list.body["kind"], "ConfigMapList");
    assert_eq!(list.body["apiVersion"], "v1");
    assert_eq!(
        list.body["items"],
        json!([]),
        "items must be an empty array, not null"
    );
    let list_rv = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        !list_rv.is_empty(),
        "empty list must carry a resourceVersion: {}",
        list.body
    );
    assert!(
        rv_num(&list_rv) >= rv_num(&rv_of(&created)),
        "empty list rv {list_rv} must be current (>= {})",
        rv_of(&created)
    );

    // A watch from the empty list's rv sees only later changes.
    let mut w = raw
        .watch(&format!(
            "/api/v1/configmaps?watch=true&resourceVersion={list_rv}"
        ))
        .await;
    assert_eq!(w.status, 200);
    assert_quiet(
        &mut w,
        "watch from a current rv must not replay older writes",
    )
    .await;
    create(
        raw,
        "/api/v1/namespaces/kube-public/configmaps",
        &cm("late", json!({})),
    )
    .await;
    let ev = next_change(&mut w).await;
    assert_eq!(
        (ev_type(&ev), ev_name(&ev)),
        ("ADDED", "late"),
        "event: {ev}"
    );
}

#[tokio::test]
async fn noop_update_and_patch_do_not_bump_or_emit() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let created = create(raw, CM, &cm("still", json!({"a": "1"}))).await;
    let rv = rv_of(&created);
    let mut w = raw
        .watch(&format!("{CM}?watch=true&resourceVersion={rv}"))
        .await;

    let put = raw.put(&format!("{CM}/still"), &created).await;
    assert_eq!(put.status, 200, "{}", put.body);
    assert_eq!(
        rv_of(&put.body),
        rv,
        "no-op PUT must not bump resourceVersion"
    );

    let patch = raw
        .patch(&format!("{CM}/still"), MERGE, &json!({"data": {"a": "1"}}))
        .await;
    assert_eq!(patch.status, 200, "{}", patch.body);
    assert_eq!(
        rv_of(&patch.body),
        rv,
        "no-op merge patch must not bump resourceVersion"
    );

    let patch = raw
        .patch(
            &format!("{CM}/still"),
            JSON_PATCH,
            &json!([{"op": "replace", "path": "/data/a", "value": "1"}]),
        )
        .await;
    assert_eq!(patch.status, 200, "{}", patch.body);
    assert_eq!(
        rv_of(&patch.body),
        rv,
        "no-op JSON patch must not bump resourceVersion"
    );

    assert_quiet(&mut w, "no-op writes must not emit watch events").await;

    let real = raw
        .patch(&format!("{CM}/still"), MERGE, &json!({"data": {"a": "2"}}))
        .await;
    assert_eq!(real.status, 200);
    assert_ne!(rv_of(&real.body), rv, "a real change bumps resourceVersion");
    let ev = next_change(&mut w).await;
    assert_eq!(ev_type(&ev), "MODIFIED", "event: {ev}");
    assert_eq!(ev["object"]["data"]["a"], "2");
    assert_eq!(rv_of(&ev["object"]), rv_of(&real.body));
}

#[tokio::test]
async fn label_selector_watch_sees_leave_and_enter() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let mut body = cm("mover", json!({}));
    body["metadata"]["labels"] = json!({"team": "a"});
    let created = create(raw, CM, &body).await;
    let rv = rv_of(&created);

    let mut w = raw
        .watch(&format!(
            "{CM}?watch=true&labelSelector=team%3Da&resourceVersion={rv}"
        ))
        .await;
    assert_eq!(w.status, 200);

    let left = raw
        .patch(
            &format!("{CM}/mover"),
            MERGE,
            &json!({"metadata": {"labels": {"team": "b"}}}),
        )
        .await;
    assert_eq!(left.status, 200);
    let ev = next_change(&mut w).await;
    assert_eq!(
        (ev_type(&ev), ev_name(&ev)),
        ("DELETED", "mover"),
        "leaving the selector must look like a deletion: {ev}"
    );

    // A change while outside the selector is invisible.
    let outside = raw
        .patch(&format!("{CM}/mover"), MERGE, &json!({"data": {"x": "1"}}))
        .await;
    assert_eq!(outside.status, 200);
    assert_quiet(&mut w, "changes outside the selector are not sent").await;

    let back = raw
        .patch(
            &format!("{CM}/mover"),
            MERGE,
            &json!({"metadata": {"labels": {"team": "a"}}}),
        )
        .await;
    assert_eq!(back.status, 200);
    let ev = next_change(&mut w).await;
    assert_eq!(
        (ev_type(&ev), ev_name(&ev)),
        ("ADDED", "mover"),
        "entering the selector must look like a creation: {ev}"
    );
    assert_eq!(ev["object"]["metadata"]["labels"]["team"], "a");
    assert_eq!(ev["object"]["data"]["x"], "1");
    assert_eq!(rv_of(&ev["object"]), rv_of(&back.body));
}

async fn first_bookmark(raw: &RawApi, collection: &str) -> Value {
    let list = raw.get(collection).await;
    assert_eq!(list.status, 200, "{}", list.body);
    let rv = list.body["metadata"]["resourceVersion"]
        .as_str()
        .expect("list rv")
        .to_string();
    let mut w = raw
        .watch(&format!(
            "{collection}?watch=true&allowWatchBookmarks=true&resourceVersion={rv}"
        ))
        .await;
    assert_eq!(w.status, 200);
    loop {
        let ev = w
            .next_event(PATIENCE)
            .await
            .expect("watch ended before a bookmark");
        if ev_type(&ev) == "BOOKMARK" {
            return ev;
        }
    }
}

#[tokio::test]
async fn bookmarks_carry_api_version_and_kind() {
    let tc = start_cluster_with(Options {
        bookmark_interval: Duration::from_millis(200),
        ..Options::default()
    })
    .await;
    let raw = &tc.raw;
    create(raw, CM, &cm("bm", json!({}))).await;

    let bm = first_bookmark(raw, CM).await;
    assert_eq!(bm["object"]["kind"], "ConfigMap", "bookmark: {bm}");
    assert_eq!(bm["object"]["apiVersion"], "v1", "bookmark: {bm}");
    assert!(
        !rv_of(&bm["object"]).is_empty(),
        "bookmark must carry a resourceVersion: {bm}"
    );

    install_widget_crd(&tc.client).await;
    let bm = first_bookmark(raw, WIDGETS).await;
    assert_eq!(bm["object"]["kind"], "Widget", "bookmark: {bm}");
    assert_eq!(
        bm["object"]["apiVersion"], "conformance.ctrlhub.dev/v1",
        "bookmark: {bm}"
    );
    assert!(!rv_of(&bm["object"]).is_empty());
}

#[tokio::test]
async fn json_patch_test_missing_path_null_passes() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    create(raw, CM, &cm("jp", json!({"a": "1"}))).await;
    let path = format!("{CM}/jp");

    // `test` of a missing path against null passes (as in kube-apiserver's json-patch).
    let ok = raw
        .patch(
            &path,
            JSON_PATCH,
            &json!([
                {"op": "test", "path": "/data/missing", "value": null},
                {"op": "add", "path": "/data/b", "value": "2"}
            ]),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.body["data"], json!({"a": "1", "b": "2"}));

    // A failing `test` rejects the whole patch with 422 and changes nothing.
    let bad = raw
        .patch(
            &path,
            JSON_PATCH,
            &json!([
                {"op": "test", "path": "/data/a", "value": "not-1"},
                {"op": "add", "path": "/data/c", "value": "3"}
            ]),
        )
        .await;
    assert_eq!(bad.status, 422, "failed test op: {}", bad.body);
    assert_eq!(bad.body["kind"], "Status");
    let now = raw.get(&path).await;
    assert_eq!(now.body["data"], json!({"a": "1", "b": "2"}));
}

#[tokio::test]
async fn strategic_merge_on_cr_is_415() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    install_widget_crd(&tc.client).await;
    create(raw, WIDGETS, &widget_body("smp", 1)).await;

    let r = raw
        .patch(
            &format!("{WIDGETS}/smp"),
            STRATEGIC,
            &json!({"spec": {"size": 2}}),
        )
        .await;
    assert_eq!(r.status, 415, "{}", r.body);
    assert_status(&r.body, 415, "UnsupportedMediaType");
    let now = raw.get(&format!("{WIDGETS}/smp")).await;
    assert_eq!(now.body["spec"]["size"], 1, "rejected patch must not apply");

    // Built-in types do support strategic merge.
    create(raw, CM, &cm("smp", json!({"a": "1"}))).await;
    let r = raw
        .patch(
            &format!("{CM}/smp"),
            STRATEGIC,
            &json!({"data": {"b": "2"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["data"], json!({"a": "1", "b": "2"}));
}

#[tokio::test]
async fn put_without_resource_version_on_cr_is_422() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    install_widget_crd(&tc.client).await;
    create(raw, WIDGETS, &widget_body("norv", 1)).await;

    let r = raw
        .put(&format!("{WIDGETS}/norv"), &widget_body("norv", 2))
        .await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_status(&r.body, 422, "Invalid");
    let causes = r.body["details"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        causes
            .iter()
            .any(|c| c["field"] == "metadata.resourceVersion"),
        "cause must name metadata.resourceVersion: {}",
        r.body
    );
    assert_eq!(
        raw.get(&format!("{WIDGETS}/norv")).await.body["spec"]["size"],
        1
    );

    // ConfigMaps allow unconditional update.
    create(raw, CM, &cm("norv", json!({"a": "1"}))).await;
    let r = raw
        .put(&format!("{CM}/norv"), &cm("norv", json!({"a": "2"})))
        .await;
    assert_eq!(r.status, 200, "unconditional configmap PUT: {}", r.body);
    assert_eq!(r.body["data"]["a"], "2");
}

#[tokio::test]
async fn resource_version_in_patch_body_is_precondition() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let created = create(raw, CM, &cm("pre", json!({"a": "1"}))).await;
    let stale = rv_of(&created);
    let path = format!("{CM}/pre");
    let moved = raw.patch(&path, MERGE, &json!({"data": {"a": "2"}})).await;
    assert_eq!(moved.status, 200);
    let current = rv_of(&moved.body);

    let r = raw
        .patch(
            &path,
            MERGE,
            &json!({"metadata": {"resourceVersion": stale}, "data": {"a": "3"}}),
        )
        .await;
    assert_eq!(r.status, 409, "stale rv in patch body: {}", r.body);
    assert_status(&r.body, 409, "Conflict");
    assert_eq!(raw.get(&path).await.body["data"]["a"], "2");

    let r = raw
        .patch(
            &path,
            MERGE,
            &json!({"metadata": {"resourceVersion": current}, "data": {"a": "3"}}),
        )
        .await;
    assert_eq!(r.status, 200, "current rv in patch body: {}", r.body);
    assert_eq!(r.body["data"]["a"], "3");
}

#[tokio::test]
async fn watch_from_compacted_rv_gets_in_stream_410() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let created = create(raw, CM, &cm("old", json!({"v": "0"}))).await;
    let old_rv = rv_of(&created);
    for i in 1..4 {
        let r = raw
            .patch(
                &format!("{CM}/old"),
                MERGE,
                &json!({"data": {"v": i.to_string()}}),
            )
            .await;
        assert_eq!(r.status, 200);
    }
    tc.dc.faults().compact();

    let mut w = raw
        .watch(&format!("{CM}?watch=true&resourceVersion={old_rv}"))
        .await;
    assert_eq!(
        w.status, 200,
        "expired watches fail in-stream, not with an HTTP error"
    );
    let ev = w.next_event(PATIENCE).await.expect("an ERROR event");
    assert_eq!(ev_type(&ev), "ERROR", "event: {ev}");
    let status = &ev["object"];
    assert_eq!(status["kind"], "Status", "{ev}");
    assert_eq!(status["code"], 410, "{ev}");
    assert_eq!(status["reason"], "Expired", "{ev}");
    assert_eq!(status["status"], "Failure", "{ev}");
    assert!(
        w.next_event(PATIENCE).await.is_none(),
        "the server must end the stream after the ERROR event"
    );

    // A relist gives a usable, current resourceVersion.
    let list = raw.get(CM).await;
    let rv = list.body["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let mut w = raw
        .watch(&format!("{CM}?watch=true&resourceVersion={rv}"))
        .await;
    create(raw, CM, &cm("new", json!({}))).await;
    let ev = next_change(&mut w).await;
    assert_eq!(
        (ev_type(&ev), ev_name(&ev)),
        ("ADDED", "new"),
        "event: {ev}"
    );
}

#[tokio::test]
async fn send_initial_events_ends_with_bookmark() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    for n in ["i1", "i2", "i3"] {
        create(raw, CM, &cm(n, json!({}))).await;
    }
    let mut w = raw
        .watch(&format!(
            "{CM}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        ))
        .await;
    assert_eq!(w.status, 200);

    let mut initial = BTreeSet::new();
    let end = loop {
        let ev = w
            .next_event(PATIENCE)
            .await
            .expect("watch ended during initial events");
        match ev_type(&ev) {
            "ADDED" => {
                assert!(
                    initial.insert(ev_name(&ev).to_string()),
                    "duplicate initial event: {ev}"
                );
            }
            "BOOKMARK" => {
                let annotations = &ev["object"]["metadata"]["annotations"];
                if annotations["k8s.io/initial-events-end"] == "true" {
                    break ev;
                }
            }
            other => panic!("unexpected {other} during initial events: {ev}"),
        }
    };
    assert_eq!(
        initial,
        ["i1", "i2", "i3"]
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()
    );
    assert_eq!(end["object"]["kind"], "ConfigMap", "{end}");
    assert_eq!(end["object"]["apiVersion"], "v1", "{end}");
    assert!(!rv_of(&end["object"]).is_empty());

    create(raw, CM, &cm("i4", json!({}))).await;
    let ev = next_change(&mut w).await;
    assert_eq!((ev_type(&ev), ev_name(&ev)), ("ADDED", "i4"), "event: {ev}");
}

#[tokio::test]
async fn paginated_list_is_snapshot_consistent() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let labelled = |name: &str| {
        let mut b = cm(name, json!({}));
        b["metadata"]["labels"] = json!({"page": "yes"});
        b
    };
    for i in 0..10 {
        create(raw, CM, &labelled(&format!("p{i:02}"))).await;
    }

    let mut seen: Vec<String> = Vec::new();
    let mut list_rv: Option<String> = None;
    let mut cont = String::new();
    let mut pages = 0;
    loop {
        let mut url = format!("{CM}?labelSelector=page%3Dyes&limit=4");
        if !cont.is_empty() {
            url.push_str(&format!("&continue={cont}"));
        }
        let r = raw.get(&url).await;
        assert_eq!(r.status, 200, "page {pages}: {}", r.body);
        pages += 1;
        let items = r.body["items"].as_array().cloned().unwrap_or_default();
        assert!(items.len() <= 4, "limit ignored: {} items", items.len());
        seen.extend(items.iter().map(|i| {
            i["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }));
        let rv = r.body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        match &list_rv {
            None => list_rv = Some(rv),
            Some(first) => assert_eq!(
                &rv, first,
                "every page reports the snapshot's resourceVersion"
            ),
        }
        cont = r.body["metadata"]["continue"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if pages == 1 {
            assert!(
                !cont.is_empty(),
                "a truncated list must return a continue token"
            );
            // Between pages: add objects that sort after everything, and delete one not yet listed.
            for i in 10..13 {
                create(raw, CM, &labelled(&format!("p{i:02}"))).await;
            }
            let d = raw.delete(&format!("{CM}/p08"), None).await;
            assert_eq!(d.status, 200);
        }
        if cont.is_empty() {
            break;
        }
        assert!(pages < 10, "pagination does not terminate");
    }
    let expected: Vec<String> = (0..10).map(|i| format!("p{i:02}")).collect();
    assert_eq!(
        seen, expected,
        "pages must form the snapshot taken at the first page"
    );
    assert_eq!(pages, 3);

    // A fresh list sees the new state.
    let r = raw.get(&format!("{CM}?labelSelector=page%3Dyes")).await;
    let now: Vec<&str> = r.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(now.len(), 12);
    assert!(!now.contains(&"p08"));
}

#[tokio::test]
async fn status_subresource_rules() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    install_widget_crd(&tc.client).await;
    let mut body = widget_body("st", 1);
    body["status"] = json!({"ready": true});
    let created = create(raw, WIDGETS, &body).await;
    assert_eq!(created["metadata"]["generation"], 1);
    assert!(
        created["status"].is_null(),
        "status is dropped on create: {created}"
    );
    let path = format!("{WIDGETS}/st");

    // Main resource PUT: spec applies, status is ignored, generation bumps.
    let mut main = created.clone();
    main["spec"]["size"] = json!(2);
    main["status"] = json!({"ready": true, "observedSize": 2});
    let r = raw.put(&path, &main).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["spec"]["size"], 2);
    assert!(
        r.body["status"].is_null(),
        "main PUT must ignore status: {}",
        r.body
    );
    assert_eq!(r.body["metadata"]["generation"], 2);

    // /status PUT: status applies, spec is ignored, generation unchanged.
    let mut st = r.body.clone();
    st["spec"]["size"] = json!(99);
    st["status"] = json!({"ready": true, "observedSize": 2});
    let r = raw.put(&format!("{path}/status"), &st).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["spec"]["size"], 2,
        "/status must ignore spec: {}",
        r.body
    );
    assert_eq!(r.body["status"], json!({"ready": true, "observedSize": 2}));
    assert_eq!(
        r.body["metadata"]["generation"], 2,
        "status writes do not bump generation"
    );

    // /status merge patch: same rules.
    let r = raw
        .patch(
            &format!("{path}/status"),
            MERGE,
            &json!({"spec": {"size": 50}, "status": {"observedSize": 3}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["spec"]["size"], 2);
    assert_eq!(r.body["status"]["observedSize"], 3);
    assert_eq!(r.body["metadata"]["generation"], 2);

    // Main merge patch of status is ignored; metadata-only changes do not bump generation.
    let r = raw
        .patch(
            &path,
            MERGE,
            &json!({"status": {"observedSize": 100}, "metadata": {"labels": {"x": "y"}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["status"]["observedSize"], 3,
        "main patch must ignore status"
    );
    assert_eq!(r.body["metadata"]["labels"]["x"], "y");
    assert_eq!(
        r.body["metadata"]["generation"], 2,
        "metadata change must not bump generation"
    );

    let r = raw.patch(&path, MERGE, &json!({"spec": {"size": 4}})).await;
    assert_eq!(
        r.body["metadata"]["generation"], 3,
        "spec change bumps generation"
    );

    // GET /status returns the whole object.
    let r = raw.get(&format!("{path}/status")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["kind"], "Widget");
    assert_eq!(r.body["spec"]["size"], 4);
    assert_eq!(r.body["status"]["observedSize"], 3);
}

#[tokio::test]
async fn finalizer_blocks_deletion() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let mut body = cm("held", json!({"a": "1"}));
    body["metadata"]["finalizers"] = json!(["conformance.ctrlhub.dev/hold"]);
    let created = create(raw, CM, &body).await;
    let path = format!("{CM}/held");
    let mut w = raw
        .watch(&format!(
            "{CM}?watch=true&resourceVersion={}",
            rv_of(&created)
        ))
        .await;

    let del = raw.delete(&path, None).await;
    assert_eq!(del.status, 200, "{}", del.body);
    assert!(
        del.body["metadata"]["deletionTimestamp"].is_string(),
        "DELETE of a finalized object returns it with deletionTimestamp: {}",
        del.body
    );
    let ev = next_change(&mut w).await;
    assert_eq!(
        ev_type(&ev),
        "MODIFIED",
        "marking for deletion is a modification: {ev}"
    );
    assert!(ev["object"]["metadata"]["deletionTimestamp"].is_string());

    let got = raw.get(&path).await;
    assert_eq!(
        got.status, 200,
        "object must survive while a finalizer remains"
    );
    assert_eq!(
        got.body["metadata"]["finalizers"],
        json!(["conformance.ctrlhub.dev/hold"])
    );

    // No new finalizers may be added once deletion started.
    let r = raw
        .patch(
            &path,
            JSON_PATCH,
            &json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "late/one"}]),
        )
        .await;
    assert_eq!(
        r.status, 422,
        "adding a finalizer while deleting: {}",
        r.body
    );

    // A second DELETE is accepted and changes nothing.
    let again = raw.delete(&path, None).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(
        again.body["metadata"]["deletionTimestamp"],
        got.body["metadata"]["deletionTimestamp"]
    );

    let r = raw
        .patch(&path, MERGE, &json!({"metadata": {"finalizers": null}}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let ev = next_change(&mut w).await;
    assert_eq!(
        (ev_type(&ev), ev_name(&ev)),
        ("DELETED", "held"),
        "event: {ev}"
    );
    let gone = raw.get(&path).await;
    assert_eq!(
        gone.status, 404,
        "object must be gone once finalizers are empty"
    );
}

fn owned_cm(name: &str, owner: &Value, block: bool, finalizer: Option<&str>) -> Value {
    let mut b = cm(name, json!({}));
    b["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "blockOwnerDeletion": block,
    }]);
    if let Some(f) = finalizer {
        b["metadata"]["finalizers"] = json!([f]);
    }
    b
}

async fn wait_gone(raw: &RawApi, path: &str) {
    wait_until(&format!("{path} to be deleted"), PATIENCE, || async {
        let r = raw.get(path).await;
        if r.status == 404 {
            Ok(())
        } else {
            Err(format!("status {} body {}", r.status, r.body))
        }
    })
    .await;
}

#[tokio::test]
async fn owner_gc_background_and_foreground() {
    let tc = start_cluster().await;
    let raw = &tc.raw;

    // Background: owner disappears at once, dependents are collected afterwards.
    let owner = create(raw, CM, &cm("bg-owner", json!({}))).await;
    create(raw, CM, &owned_cm("bg-child-1", &owner, false, None)).await;
    create(raw, CM, &owned_cm("bg-child-2", &owner, false, None)).await;
    let d = raw
        .delete(
            &format!("{CM}/bg-owner"),
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})),
        )
        .await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(raw.get(&format!("{CM}/bg-owner")).await.status, 404);
    wait_gone(raw, &format!("{CM}/bg-child-1")).await;
    wait_gone(raw, &format!("{CM}/bg-child-2")).await;

    // Foreground: owner stays (foregroundDeletion finalizer) until blocking dependents are gone.
    let owner = create(raw, CM, &cm("fg-owner", json!({}))).await;
    create(
        raw,
        CM,
        &owned_cm(
            "fg-child",
            &owner,
            true,
            Some("conformance.ctrlhub.dev/hold"),
        ),
    )
    .await;
    let d = raw
        .delete(
            &format!("{CM}/fg-owner"),
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"})),
        )
        .await;
    assert!(d.status == 200 || d.status == 202, "{}", d.body);
    let o = raw.get(&format!("{CM}/fg-owner")).await;
    assert_eq!(
        o.status, 200,
        "foreground owner must still exist: {}",
        o.body
    );
    assert!(o.body["metadata"]["deletionTimestamp"].is_string());
    assert!(
        o.body["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "foregroundDeletion")),
        "foreground deletion adds the foregroundDeletion finalizer: {}",
        o.body
    );
    wait_until("GC to delete the dependent", PATIENCE, || async {
        let c = raw.get(&format!("{CM}/fg-child")).await;
        if c.body["metadata"]["deletionTimestamp"].is_string() {
            Ok(())
        } else {
            Err(c.body.to_string())
        }
    })
    .await;
    assert_eq!(
        raw.get(&format!("{CM}/fg-owner")).await.status,
        200,
        "owner must wait for its blocking dependent"
    );
    let r = raw
        .patch(
            &format!("{CM}/fg-child"),
            MERGE,
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    wait_gone(raw, &format!("{CM}/fg-child")).await;
    wait_gone(raw, &format!("{CM}/fg-owner")).await;
}

#[tokio::test]
async fn namespace_termination_refuses_creates() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let ns = create(
        raw,
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}}),
    )
    .await;
    assert_eq!(ns["status"]["phase"], "Active", "{ns}");
    let coll = "/api/v1/namespaces/doomed/configmaps";
    let mut held = cm("held", json!({}));
    held["metadata"]["finalizers"] = json!(["conformance.ctrlhub.dev/hold"]);
    create(raw, coll, &held).await;

    let d = raw.delete("/api/v1/namespaces/doomed", None).await;
    assert_eq!(d.status, 200, "{}", d.body);
    let got = raw.get("/api/v1/namespaces/doomed").await;
    assert_eq!(
        got.status, 200,
        "namespace with content must linger: {}",
        got.body
    );
    assert_eq!(got.body["status"]["phase"], "Terminating", "{}", got.body);
    assert!(got.body["metadata"]["deletionTimestamp"].is_string());

    let r = raw.post(coll, &cm("newcomer", json!({}))).await;
    assert_eq!(
        r.status, 403,
        "create in a terminating namespace: {}",
        r.body
    );
    assert_status(&r.body, 403, "Forbidden");
    assert!(
        r.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("because it is being terminated")),
        "{}",
        r.body
    );

    // The namespace's content is deleted; once its finalizer is released the namespace goes.
    wait_until(
        "content of the namespace to be marked deleted",
        PATIENCE,
        || async {
            let c = raw.get(&format!("{coll}/held")).await;
            if c.body["metadata"]["deletionTimestamp"].is_string() {
                Ok(())
            } else {
                Err(c.body.to_string())
            }
        },
    )
    .await;
    let r = raw
        .patch(
            &format!("{coll}/held"),
            MERGE,
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    wait_gone(raw, "/api/v1/namespaces/doomed").await;
}

#[tokio::test]
async fn crd_pruning_and_defaults() {
    let tc = start_cluster().await;
    let raw = &tc.raw;
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "knobs.conformance.ctrlhub.dev"},
        "spec": {
            "group": "conformance.ctrlhub.dev",
            "scope": "Namespaced",
            "names": {"plural": "knobs", "singular": "knob", "kind": "Knob", "listKind": "KnobList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "properties": {
                                "replicas": {"type": "integer", "default": 1},
                                "mode": {"type": "string", "default": "fast"},
                                "nested": {
                                    "type": "object",
                                    "properties": {"flag": {"type": "boolean", "default": true}}
                                },
                                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                            }
                        }
                    }
                }}
            }]
        }
    });
    create(
        raw,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        &crd,
    )
    .await;
    let coll = "/apis/conformance.ctrlhub.dev/v1/namespaces/default/knobs";
    wait_until("knobs to be served", PATIENCE, || async {
        let r = raw.get(coll).await;
        if r.status == 200 {
            Ok(())
        } else {
            Err(r.body.to_string())
        }
    })
    .await;

    let obj = json!({
        "apiVersion": "conformance.ctrlhub.dev/v1",
        "kind": "Knob",
        "metadata": {"name": "k1"},
        "extraTopLevel": "drop me",
        "spec": {
            "mode": "slow",
            "unknownField": "drop me",
            "nested": {"alsoUnknown": 1},
            "free": {"anything": {"goes": [1, 2]}}
        }
    });
    let created = create(raw, coll, &obj).await;
    let want_spec = json!({
        "replicas": 1,
        "mode": "slow",
        "nested": {"flag": true},
        "free": {"anything": {"goes": [1, 2]}}
    });
    assert_eq!(created["spec"], want_spec, "create response: {created}");
    assert!(
        created.get("extraTopLevel").is_none(),
        "unknown top-level field pruned: {created}"
    );
    let got = raw.get(&format!("{coll}/k1")).await;
    assert_eq!(got.body["spec"], want_spec, "stored object: {}", got.body);

    // Defaults also apply on update when a field is removed.
    let r = raw
        .patch(
            &format!("{coll}/k1"),
            MERGE,
            &json!({"spec": {"mode": null, "bogus": true}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["spec"]["mode"], "fast", "{}", r.body);
    assert!(r.body["spec"].get("bogus").is_none(), "{}", r.body);
}

#[tokio::test]
async fn errors_are_status_objects() {
    let tc = start_cluster().await;
    let raw = &tc.raw;

    let r = raw.get(&format!("{CM}/missing")).await;
    assert_eq!(r.status, 404);
    assert_status(&r.body, 404, "NotFound");
    assert_eq!(r.body["message"], r#"configmaps "missing" not found"#);
    assert_eq!(r.body["details"]["name"], "missing");
    assert_eq!(r.body["details"]["kind"], "configmaps");

    let created = create(raw, CM, &cm("dup", json!({}))).await;
    let r = raw.post(CM, &cm("dup", json!({}))).await;
    assert_eq!(r.status, 409);
    assert_status(&r.body, 409, "AlreadyExists");
    assert_eq!(r.body["message"], r#"configmaps "dup" already exists"#);
    assert_eq!(r.body["details"]["name"], "dup");

    let moved = raw
        .patch(&format!("{CM}/dup"), MERGE, &json!({"data": {"x": "1"}}))
        .await;
    assert_eq!(moved.status, 200);
    let r = raw.put(&format!("{CM}/dup"), &created).await;
    assert_eq!(r.status, 409);
    assert_status(&r.body, 409, "Conflict");
    assert!(
        r.body["message"].as_str().is_some_and(|m| m.contains(
            "the object has been modified; please apply your changes to the latest version and try again"
        )),
        "{}",
        r.body
    );

    let r = raw.post(CM, &cm("Not_A_Valid_Name", json!({}))).await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_status(&r.body, 422, "Invalid");
    assert_eq!(r.body["details"]["name"], "Not_A_Valid_Name");
    assert_eq!(r.body["details"]["kind"], "ConfigMap");
    let causes = r.body["details"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        causes
            .iter()
            .any(|c| c["field"] == "metadata.name" && c["reason"] == "FieldValueInvalid"),
        "Invalid must list causes: {}",
        r.body
    );

    // Unknown resource paths are Status 404s too.
    let r = raw.get("/api/v1/namespaces/default/nosuchthings").await;
    assert_eq!(r.status, 404);
    assert_status(&r.body, 404, "NotFound");
}
