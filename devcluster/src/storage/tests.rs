//! The store's write semantics on the synchronous state, without HTTP: preconditions,
//! generation, the status split, finalizers and deletion, garbage collection, namespace
//! termination, and continue tokens that age on a stopped clock.

use super::Store;
use super::clock::Clock;
use super::store::{State, WatchStart};
use super::{Delete, DeleteOptions, Deleted, PatchType, Propagation, Write, WriteOptions};
use crate::catalog::resources::{GroupResource, ResourceInfo};
use crate::meta;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// 2026-01-01T00:00:00Z, where every test's clock stands.
const START: i64 = 1_767_225_600;

/// A store whose clock stands at [`START`].
fn store() -> Store {
    let store = Store::new(1_000);
    store.lock().clock = Clock::stopped_at(jiff::Timestamp::from_second(START).expect("in range"));
    store
}

fn info(st: &State, group: &str, plural: &str) -> ResourceInfo {
    st.registry
        .get(group, "v1", plural)
        .cloned()
        .expect("served")
}

fn opts() -> WriteOptions {
    WriteOptions::new("test")
}

fn create(
    st: &mut State,
    info: &ResourceInfo,
    ns: &str,
    obj: Value,
) -> Result<Arc<Value>, ApiError> {
    st.create(&Write::create(info, ns, &opts()), obj)
}

fn update(
    st: &mut State,
    info: &ResourceInfo,
    ns: &str,
    obj: Value,
) -> Result<Arc<Value>, ApiError> {
    let name = meta::name(&obj).to_string();
    st.update(&Write::to(info, ns, &name, None, &opts()), obj)
}

fn delete_with(
    st: &mut State,
    info: &ResourceInfo,
    ns: &str,
    name: &str,
    options: DeleteOptions,
) -> Result<Deleted, ApiError> {
    st.delete(&Delete {
        info,
        namespace: ns,
        name,
        options: &options,
    })
}

fn delete(st: &mut State, info: &ResourceInfo, ns: &str, name: &str) -> Result<Deleted, ApiError> {
    delete_with(st, info, ns, name, no_options())
}

fn no_options() -> DeleteOptions {
    DeleteOptions {
        propagation: None,
        uid: None,
        resource_version: None,
        dry_run: false,
    }
}

fn get(st: &State, info: &ResourceInfo, ns: &str, name: &str) -> Option<Arc<Value>> {
    st.get(&info.group_resource(), ns, name)
}

fn rv(obj: &Value) -> u64 {
    meta::resource_version(obj)
        .parse()
        .expect("numeric resourceVersion")
}

fn generation(obj: &Value) -> i64 {
    obj.pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .expect("generation")
}

fn deployment(name: &str, replicas: i64) -> Value {
    json!({"metadata": {"name": name}, "spec": {"replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}})
}

/// A ConfigMap owned by `owner` (uid and name), optionally blocking its owner's deletion.
fn owned(name: &str, owner: &Value) -> Value {
    json!({"metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
        "name": meta::name(owner), "uid": meta::uid(owner)}]}})
}

#[test]
fn create_sets_what_the_server_owns() {
    let store = store();
    let mut st = store.lock();
    let deploy = info(&st, "apps", "deployments");
    let given = json!({"metadata": {"name": "web", "uid": "mine", "resourceVersion": "7",
        "creationTimestamp": "1999-01-01T00:00:00Z", "deletionTimestamp": "1999-01-01T00:00:00Z",
        "generation": 9, "finalizers": []}, "status": {"replicas": 5}});
    let mut obj = deployment("web", 2);
    obj["metadata"] = given["metadata"].clone();
    obj["status"] = given["status"].clone();
    let created = create(&mut st, &deploy, "default", obj).expect("create");
    assert_ne!(meta::uid(&created), "mine");
    assert_eq!(rv(&created), st.current_rv());
    assert_eq!(
        created["metadata"]["creationTimestamp"],
        "2026-01-01T00:00:00Z"
    );
    assert_eq!(generation(&created), 1);
    assert!(created.pointer("/metadata/deletionTimestamp").is_none());
    assert!(
        created.pointer("/metadata/finalizers").is_none(),
        "an empty list is none"
    );
    assert!(created.get("status").is_none(), "status is a subresource");
    assert_eq!(created["metadata"]["managedFields"][0]["manager"], "test");
    assert_eq!(created["metadata"]["namespace"], "default");
}

#[test]
fn create_refuses_taken_names_missing_and_terminating_namespaces() {
    let store = store();
    let mut st = store.lock();
    let cm = info(&st, "", "configmaps");
    let ns = info(&st, "", "namespaces");
    let a = json!({"metadata": {"name": "a"}});
    create(&mut st, &cm, "default", a.clone()).expect("first");
    let taken = create(&mut st, &cm, "default", a.clone()).expect_err("taken");
    assert_eq!((taken.code, taken.reason), (409, "AlreadyExists"));
    let missing = create(&mut st, &cm, "nowhere", a.clone()).expect_err("no namespace");
    assert_eq!(missing.code, 404);
    create(
        &mut st,
        &ns,
        "",
        json!({"metadata": {"name": "going", "finalizers": ["hold"]}}),
    )
    .expect("namespace");
    delete(&mut st, &ns, "", "going").expect("delete namespace");
    let terminating = create(&mut st, &cm, "going", a).expect_err("terminating");
    assert_eq!(terminating.code, 403);
    assert!(
        terminating
            .message
            .contains("because it is being terminated")
    );
}

#[test]
fn generate_name_and_dry_run() {
    let store = store();
    let mut st = store.lock();
    let cm = info(&st, "", "configmaps");
    let made = create(
        &mut st,
        &cm,
        "default",
        json!({"metadata": {"generateName": "x-"}}),
    )
    .expect("generated");
    assert!(meta::name(&made).starts_with("x-") && meta::name(&made).len() == 7);
    let none = create(&mut st, &cm, "default", json!({"metadata": {}})).expect_err("no name");
    assert_eq!(none.code, 422);
    let before = st.current_rv();
    let dry = WriteOptions {
        dry_run: true,
        ..opts()
    };
    st.create(
        &Write::create(&cm, "default", &dry),
        json!({"metadata": {"name": "dry"}}),
    )
    .expect("dry run");
    assert_eq!(st.current_rv(), before, "a dry run commits nothing");
    assert!(get(&st, &cm, "default", "dry").is_none());
}

#[test]
fn updates_need_the_live_resource_version() {
    let store = store();
    let mut st = store.lock();
    let cm = info(&st, "", "configmaps");
    let v1 = create(
        &mut st,
        &cm,
        "default",
        json!({"metadata": {"name": "a"}, "data": {"k": "1"}}),
    )
    .expect("create");
    let mut v2 = (*v1).clone();
    v2["data"]["k"] = json!("2");
    let v2 = update(&mut st, &cm, "default", v2).expect("update at the live version");
    assert!(rv(&v2) > rv(&v1));
    let mut stale = (*v1).clone();
    stale["data"]["k"] = json!("3");
    let conflict = update(&mut st, &cm, "default", stale).expect_err("stale");
    assert_eq!((conflict.code, conflict.reason), (409, "Conflict"));
    // ConfigMaps allow unconditional updates: no resourceVersion means the live one.
    let mut blind = (*v2).clone();
    meta::set(&mut blind, "resourceVersion", None);
    blind["data"]["k"] = json!("4");
    update(&mut st, &cm, "default", blind).expect("unconditional update");
    // An update that changes nothing commits nothing.
    let live = get(&st, &cm, "default", "a").expect("live");
    let before = st.current_rv();
    let same = update(&mut st, &cm, "default", (*live).clone()).expect("no-op");
    assert_eq!(rv(&same), rv(&live));
    assert_eq!(st.current_rv(), before);
}

#[test]
fn custom_resources_need_a_resource_version_to_update() {
    let store = store();
    let mut st = store.lock();
    let crds = info(&st, "apiextensions.k8s.io", "customresourcedefinitions");
    create(&mut st, &crds, "", widget_crd()).expect("crd");
    let widgets = st
        .registry
        .get("example.com", "v1", "widgets")
        .cloned()
        .expect("served");
    create(
        &mut st,
        &widgets,
        "default",
        json!({"metadata": {"name": "w"}, "spec": {"size": 1}}),
    )
    .expect("widget");
    let e = update(
        &mut st,
        &widgets,
        "default",
        json!({"metadata": {"name": "w"}, "spec": {"size": 2}}),
    )
    .expect_err("no resourceVersion");
    assert_eq!(e.code, 422);
    assert!(e.message.contains("must be specified for an update"));
}

#[test]
fn generation_counts_spec_changes_only_and_status_is_split() {
    let store = store();
    let mut st = store.lock();
    let deploy = info(&st, "apps", "deployments");
    let v1 = create(&mut st, &deploy, "default", deployment("web", 1)).expect("create");
    let mut labelled = (*v1).clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    labelled["status"] = json!({"replicas": 7});
    let v2 = update(&mut st, &deploy, "default", labelled).expect("metadata change");
    assert_eq!(generation(&v2), 1, "metadata is not spec");
    assert!(
        v2.get("status").is_none(),
        "the main resource does not write status"
    );
    let mut scaled = (*v2).clone();
    scaled["spec"]["replicas"] = json!(3);
    let v3 = update(&mut st, &deploy, "default", scaled).expect("spec change");
    assert_eq!(generation(&v3), 2);
    let mut status = (*v3).clone();
    status["status"] = json!({"replicas": 3});
    status["spec"]["replicas"] = json!(9);
    let kcm = WriteOptions::new("kcm");
    let write = Write::to(&deploy, "default", "web", Some("status"), &kcm);
    let v4 = st.update(&write, status).expect("status write");
    assert_eq!(v4["status"]["replicas"], 3);
    assert_eq!(
        v4["spec"]["replicas"], 3,
        "a status write leaves spec alone"
    );
    assert_eq!(generation(&v4), 2);
}

#[test]
fn patches_check_preconditions_and_their_own_form() {
    let store = store();
    let mut st = store.lock();
    let cm = info(&st, "", "configmaps");
    let v1 = create(
        &mut st,
        &cm,
        "default",
        json!({"metadata": {"name": "a"}, "data": {"k": "1"}}),
    )
    .expect("create");
    let o = opts();
    let w = Write::to(&cm, "default", "a", None, &o);
    let merged = st
        .patch(&w, PatchType::Merge, &json!({"data": {"j": "2"}}))
        .expect("merge");
    assert_eq!(merged["data"], json!({"k": "1", "j": "2"}));
    let stale =
        json!({"metadata": {"resourceVersion": meta::resource_version(&v1)}, "data": {"k": "x"}});
    let e = st
        .patch(&w, PatchType::Merge, &stale)
        .expect_err("stale precondition");
    assert_eq!(e.code, 409);
    let test_fails = json!([{"op": "test", "path": "/data/k", "value": "nope"}]);
    assert_eq!(
        st.patch(&w, PatchType::Json, &test_fails)
            .expect_err("test op")
            .code,
        422
    );
    let missing = Write::to(&cm, "default", "b", None, &o);
    let e = st
        .patch(&missing, PatchType::Merge, &json!({}))
        .expect_err("missing");
    assert_eq!(e.code, 404);
}

#[test]
fn delete_preconditions() {
    let store = store();
    let mut st = store.lock();
    let cm = info(&st, "", "configmaps");
    let a = create(&mut st, &cm, "default", json!({"metadata": {"name": "a"}})).expect("create");
    let wrong_uid = DeleteOptions {
        uid: Some("other".into()),
        ..no_options()
    };
    let e = delete_with(&mut st, &cm, "default", "a", wrong_uid).expect_err("uid");
    assert_eq!(e.code, 409);
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition: other")
    );
    let wrong_rv = DeleteOptions {
        resource_version: Some("1".into()),
        ..no_options()
    };
    assert_eq!(
        delete_with(&mut st, &cm, "default", "a", wrong_rv)
            .expect_err("rv")
            .code,
        409
    );
    let dry = DeleteOptions {
        dry_run: true,
        ..no_options()
    };
    delete_with(&mut st, &cm, "default", "a", dry).expect("dry run");
    assert!(
        get(&st, &cm, "default", "a").is_some(),
        "a dry run deletes nothing"
    );
    let right = DeleteOptions {
        uid: Some(meta::uid(&a).to_string()),
        resource_version: Some(meta::resource_version(&a).to_string()),
        ..no_options()
    };
    let gone = delete_with(&mut st, &cm, "default", "a", right).expect("delete");
    assert!(matches!(gone, Deleted::Gone(_)));
    assert_eq!(
        delete(&mut st, &cm, "default", "a").expect_err("gone").code,
        404
    );
}

#[test]
fn finalizers_hold_a_deletion_until_the_last_goes() {
    let store = store();
    let mut st = store.lock();
    let deploy = info(&st, "apps", "deployments");
    let mut obj = deployment("web", 1);
    obj["metadata"]["finalizers"] = json!(["a.example/x", "b.example/y"]);
    create(&mut st, &deploy, "default", obj).expect("create");
    st.clock.advance(Duration::from_secs(30));
    let Deleted::Pending(pending) = delete(&mut st, &deploy, "default", "web").expect("delete")
    else {
        panic!("finalizers hold it")
    };
    assert_eq!(
        pending["metadata"]["deletionTimestamp"],
        "2026-01-01T00:00:30Z"
    );
    assert_eq!(pending["metadata"]["deletionGracePeriodSeconds"], 0);
    assert_eq!(generation(&pending), 2, "deletion bumps the generation");
    // Deleting again changes nothing.
    let Deleted::Pending(again) = delete(&mut st, &deploy, "default", "web").expect("again") else {
        panic!("still held")
    };
    assert_eq!(rv(&again), rv(&pending));
    let mut more = (*pending).clone();
    more["metadata"]["finalizers"] = json!(["a.example/x", "b.example/y", "c.example/z"]);
    let e = update(&mut st, &deploy, "default", more).expect_err("no new finalizers");
    assert_eq!(e.code, 422);
    let mut fewer = (*pending).clone();
    fewer["metadata"]["finalizers"] = json!(["b.example/y"]);
    let fewer = update(&mut st, &deploy, "default", fewer).expect("one finalizer gone");
    assert!(get(&st, &deploy, "default", "web").is_some());
    let mut none = (*fewer).clone();
    meta::set(&mut none, "finalizers", None);
    let last = update(&mut st, &deploy, "default", none).expect("last finalizer gone");
    assert!(
        get(&st, &deploy, "default", "web").is_none(),
        "removed with its last finalizer"
    );
    let history = st
        .watch(&deploy, None, WatchStart::From(rv(&fewer)))
        .expect("history");
    let kinds: Vec<&str> = history.replay.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(kinds, ["DELETED"]);
    assert_eq!(
        rv(&last),
        st.current_rv(),
        "the removal has its own resourceVersion"
    );
}

#[test]
fn background_deletion_collects_dependents_with_no_other_owner() {
    let store = store();
    let mut st = store.lock();
    let cm = info(&st, "", "configmaps");
    let owner = create(
        &mut st,
        &cm,
        "default",
        json!({"metadata": {"name": "owner"}}),
    )
    .expect("owner");
    let other = create(
        &mut st,
        &cm,
        "default",
        json!({"metadata": {"name": "other"}}),
    )
    .expect("other");
    create(&mut st, &cm, "default", owned("only", &owner)).expect("dependent");
    let mut shared = owned("shared", &owner);
    let second =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": meta::uid(&other)});
    shared["metadata"]["ownerReferences"]
        .as_array_mut()
        .expect("refs")
        .push(second);
    create(&mut st, &cm, "default", shared).expect("shared dependent");
    delete(&mut st, &cm, "default", "owner").expect("delete owner");
    assert!(
        get(&st, &cm, "default", "only").is_none(),
        "its only owner is gone"
    );
    let shared = get(&st, &cm, "default", "shared").expect("another owner keeps it");
    assert_eq!(
        meta::owner_uids(&shared),
        vec![meta::uid(&other).to_string()]
    );
}

#[test]
fn orphan_deletion_keeps_dependents_and_drops_the_reference() {
    let store = store();
    let mut st = store.lock();
    let cm = info(&st, "", "configmaps");
    let owner = create(
        &mut st,
        &cm,
        "default",
        json!({"metadata": {"name": "owner"}}),
    )
    .expect("owner");
    create(&mut st, &cm, "default", owned("dep", &owner)).expect("dependent");
    let orphan = DeleteOptions {
        propagation: Some(Propagation::Orphan),
        ..no_options()
    };
    delete_with(&mut st, &cm, "default", "owner", orphan).expect("delete");
    let dep = get(&st, &cm, "default", "dep").expect("orphaned, not deleted");
    assert!(meta::owner_uids(&dep).is_empty());
}

#[test]
fn foreground_deletion_waits_for_dependents() {
    let store = store();
    let mut st = store.lock();
    let cm = info(&st, "", "configmaps");
    let owner = create(
        &mut st,
        &cm,
        "default",
        json!({"metadata": {"name": "owner"}}),
    )
    .expect("owner");
    let mut held = owned("held", &owner);
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create(&mut st, &cm, "default", held).expect("dependent");
    let foreground = DeleteOptions {
        propagation: Some(Propagation::Foreground),
        ..no_options()
    };
    let Deleted::Pending(pending) =
        delete_with(&mut st, &cm, "default", "owner", foreground).expect("delete")
    else {
        panic!("the owner waits for its dependent")
    };
    assert_eq!(meta::finalizers(&pending), ["foregroundDeletion"]);
    let dep = get(&st, &cm, "default", "held").expect("held by its finalizer");
    assert!(meta::is_deleting(&dep), "the dependent is being deleted");
    let mut release = (*dep).clone();
    meta::set(&mut release, "finalizers", None);
    update(&mut st, &cm, "default", release).expect("release");
    assert!(get(&st, &cm, "default", "held").is_none());
    assert!(
        get(&st, &cm, "default", "owner").is_none(),
        "the owner follows"
    );
}

#[test]
fn a_deleted_namespace_empties_then_goes() {
    let store = store();
    let mut st = store.lock();
    let ns = info(&st, "", "namespaces");
    let cm = info(&st, "", "configmaps");
    let created =
        create(&mut st, &ns, "", json!({"metadata": {"name": "team"}})).expect("namespace");
    assert_eq!(created["spec"]["finalizers"], json!(["kubernetes"]));
    assert_eq!(created["status"]["phase"], "Active");
    create(&mut st, &cm, "team", json!({"metadata": {"name": "plain"}})).expect("plain");
    create(
        &mut st,
        &cm,
        "team",
        json!({"metadata": {"name": "held", "finalizers": ["x.io/y"]}}),
    )
    .expect("held");
    let Deleted::Pending(terminating) = delete(&mut st, &ns, "", "team").expect("delete") else {
        panic!("content holds the namespace")
    };
    assert_eq!(terminating["status"]["phase"], "Terminating");
    assert!(get(&st, &cm, "team", "plain").is_none());
    let held = get(&st, &cm, "team", "held").expect("held by its finalizer");
    let mut release = (*held).clone();
    meta::set(&mut release, "finalizers", None);
    update(&mut st, &cm, "team", release).expect("release");
    assert!(get(&st, &ns, "", "team").is_none(), "empty, so gone");
}

#[test]
fn deleting_a_crd_drops_its_resources_and_objects() {
    let store = store();
    let mut st = store.lock();
    let crds = info(&st, "apiextensions.k8s.io", "customresourcedefinitions");
    let crd = create(&mut st, &crds, "", widget_crd()).expect("crd");
    assert_eq!(crd["status"]["acceptedNames"]["kind"], "Widget");
    assert_eq!(
        crd["status"]["conditions"][0]["lastTransitionTime"],
        "2026-01-01T00:00:00Z"
    );
    let widgets = st
        .registry
        .get("example.com", "v1", "widgets")
        .cloned()
        .expect("served");
    create(
        &mut st,
        &widgets,
        "default",
        json!({"metadata": {"name": "w"}}),
    )
    .expect("widget");
    delete(&mut st, &crds, "", "widgets.example.com").expect("delete crd");
    assert!(st.registry.get("example.com", "v1", "widgets").is_none());
    let gr = GroupResource::new("example.com", "widgets");
    assert_eq!(st.objects(&gr, None).count(), 0);
}

#[test]
fn continue_tokens_expire_after_five_minutes() {
    let store = store();
    let mut st = store.lock();
    let cm = info(&st, "", "configmaps");
    for i in 0..3 {
        create(
            &mut st,
            &cm,
            "default",
            json!({"metadata": {"name": format!("c{i}")}}),
        )
        .expect("create");
    }
    let (all, none) = (LabelSelector::default(), FieldSelector::default());
    let first = st
        .list(&cm, Some("default"), &all, &none, Some(1), None)
        .expect("first page");
    let token = first.continue_token.expect("more");
    st.clock.advance(Duration::from_secs(299));
    let second = st
        .list(&cm, Some("default"), &all, &none, Some(1), Some(&token))
        .expect("still fresh");
    let token = second.continue_token.expect("more");
    st.clock.advance(Duration::from_secs(2));
    let Err(e) = st.list(&cm, Some("default"), &all, &none, Some(1), Some(&token)) else {
        panic!("the token has expired")
    };
    assert_eq!((e.code, e.reason), (410, "Expired"));
}

#[test]
fn resource_versions_are_monotonic_and_deletes_get_a_new_one() {
    let store = Store::new(100);
    let mut st = store.lock();
    let info = info(&st, "", "configmaps");
    let a = st
        .create(
            &Write::create(&info, "default", &opts()),
            json!({"metadata": {"name": "a"}, "data": {"k": "v"}}),
        )
        .expect("create");
    let rv_a: u64 = meta::resource_version(&a).parse().expect("numeric rv");
    let del = st
        .delete(&Delete {
            info: &info,
            namespace: "default",
            name: "a",
            options: &DeleteOptions {
                propagation: None,
                uid: None,
                resource_version: None,
                dry_run: false,
            },
        })
        .expect("delete");
    let Deleted::Gone(gone) = del else {
        panic!("no finalizers: must be gone")
    };
    let rv_del: u64 = meta::resource_version(&gone).parse().expect("numeric rv");
    assert!(rv_del > rv_a);
    assert_eq!(st.current_rv(), rv_del);
}

#[test]
fn continue_tokens_pin_a_snapshot() {
    let store = Store::new(100);
    let mut st = store.lock();
    let info = info(&st, "", "configmaps");
    for i in 0..5 {
        st.create(
            &Write::create(&info, "default", &opts()),
            json!({"metadata": {"name": format!("cm{i}")}}),
        )
        .expect("create");
    }
    let all = LabelSelector::default();
    let none = FieldSelector::default();
    let first = st
        .list(&info, Some("default"), &all, &none, Some(2), None)
        .expect("list");
    assert_eq!(first.items.len(), 2);
    st.create(
        &Write::create(&info, "default", &opts()),
        json!({"metadata": {"name": "cm-late"}}),
    )
    .expect("create");
    let token = first.continue_token.clone().expect("more pages");
    let second = st
        .list(&info, Some("default"), &all, &none, Some(10), Some(&token))
        .expect("list");
    assert_eq!(second.rv, first.rv);
    assert_eq!(second.items.len(), 3);
    assert!(second.items.iter().all(|o| meta::name(o) != "cm-late"));
    assert!(second.continue_token.is_none());
}

#[test]
fn compacted_history_expires_resumes() {
    let store = Store::new(100);
    let mut st = store.lock();
    let info = info(&st, "", "configmaps");
    let before = st.current_rv();
    st.create(
        &Write::create(&info, "default", &opts()),
        json!({"metadata": {"name": "x"}}),
    )
    .expect("create");
    st.compact();
    assert!(
        st.watch(&info, None, WatchStart::From(before)).is_err(),
        "older versions are gone"
    );
    let now = st.current_rv();
    assert!(
        st.watch(&info, None, WatchStart::From(now)).is_ok(),
        "the current version stays watchable"
    );
}

fn widget_crd() -> Value {
    json!({"metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com",
        "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
        "versions": [{"name": "v1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]}})
}
