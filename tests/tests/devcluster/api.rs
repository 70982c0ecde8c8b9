//! kube-rs (client and runtime) against devcluster over HTTPS.
//!
//! Each test starts its own devcluster and drives it only through kube-rs, the way a
//! ctrlhub controller would, plus devcluster's fault injection.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ctrlhub_tests::{
    PATIENCE, Widget, WidgetStatus, install_widget_crd, start_cluster, start_cluster_with,
    wait_until, widget,
};
use devcluster::Options;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{Controller, WatchStreamExt};
use kube::{Client, ResourceExt};
use serde_json::json;

fn configmap(name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    cm.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    cm.data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    cm
}

#[tokio::test]
async fn kube_api_crud() {
    let tc = start_cluster().await;
    let cms: Api<ConfigMap> = tc.api("default");
    let pp = PostParams::default();

    // ConfigMap: create / get / list / replace / patch / delete.
    let created = cms
        .create(&pp, &configmap("crud", &[("app", "crud")], &[("a", "1")]))
        .await
        .expect("create configmap");
    assert_eq!(created.name_any(), "crud");
    assert!(created.metadata.uid.is_some(), "server must assign a uid");
    assert!(created.metadata.creation_timestamp.is_some());
    let rv1 = created.resource_version().expect("rv on create");

    let got = cms.get("crud").await.expect("get configmap");
    assert_eq!(
        got.data.as_ref().and_then(|d| d.get("a")).cloned(),
        Some("1".into())
    );
    assert_eq!(got.resource_version().as_deref(), Some(rv1.as_str()));

    let listed = cms
        .list(&ListParams::default().labels("app=crud"))
        .await
        .expect("list configmaps");
    assert_eq!(
        listed
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>(),
        vec!["crud".to_string()]
    );

    let mut changed = got.clone();
    changed
        .data
        .get_or_insert_with(Default::default)
        .insert("a".into(), "2".into());
    let replaced = cms
        .replace("crud", &pp, &changed)
        .await
        .expect("replace configmap");
    let rv2 = replaced.resource_version().expect("rv on replace");
    assert_ne!(
        rv1, rv2,
        "replace that changes data must bump resourceVersion"
    );
    assert_eq!(
        replaced.data.as_ref().and_then(|d| d.get("a")).cloned(),
        Some("2".into())
    );

    // Replacing with the stale object must conflict.
    let stale = cms.replace("crud", &pp, &got).await;
    match stale {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409, "stale replace: {s:?}"),
        other => panic!("stale replace should be 409 Conflict, got {other:?}"),
    }

    let patched = cms
        .patch(
            "crud",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"b": "3"}})),
        )
        .await
        .expect("merge patch configmap");
    let data = patched.data.clone().unwrap_or_default();
    assert_eq!(data.get("a").map(String::as_str), Some("2"));
    assert_eq!(data.get("b").map(String::as_str), Some("3"));

    cms.delete("crud", &DeleteParams::default())
        .await
        .expect("delete configmap");
    assert!(
        cms.get_opt("crud").await.expect("get_opt").is_none(),
        "configmap without finalizers must be gone right after delete"
    );

    // Namespaced custom resource through a CRD created with kube-rs.
    install_widget_crd(&tc.client).await;
    let widgets: Api<Widget> = tc.api("default");
    let w = widgets
        .create(&pp, &widget("w1", 1))
        .await
        .expect("create widget");
    assert_eq!(w.spec.size, 1);
    assert_eq!(w.metadata.generation, Some(1), "CRs start at generation 1");
    let got = widgets.get("w1").await.expect("get widget");
    assert_eq!(got.spec.size, 1);
    let list = widgets
        .list(&ListParams::default())
        .await
        .expect("list widgets");
    assert_eq!(list.items.len(), 1);

    let mut bigger = got.clone();
    bigger.spec.size = 2;
    let replaced = widgets
        .replace("w1", &pp, &bigger)
        .await
        .expect("replace widget");
    assert_eq!(replaced.spec.size, 2);
    assert_eq!(
        replaced.metadata.generation,
        Some(2),
        "spec change bumps generation"
    );

    let patched = widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"color": "blue"}})),
        )
        .await
        .expect("merge patch widget");
    assert_eq!(patched.spec.color.as_deref(), Some("blue"));
    assert_eq!(patched.spec.size, 2);

    let applied = widgets
        .patch(
            "w1",
            &PatchParams::apply("conformance").force(),
            &Patch::Apply(json!({
                "apiVersion": "conformance.ctrlhub.dev/v1",
                "kind": "Widget",
                "metadata": {"name": "w1"},
                "spec": {"size": 7}
            })),
        )
        .await
        .expect("server-side apply widget");
    assert_eq!(applied.spec.size, 7);

    widgets
        .delete("w1", &DeleteParams::default())
        .await
        .expect("delete widget");
    wait_until("widget w1 to be gone", PATIENCE, || async {
        match widgets.get_opt("w1").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Runs a reflector over configmaps labelled `app=<label>` and returns its store plus a
/// counter of how many times the watcher (re)listed (`Event::Init`).
/// A reflector over ConfigMaps labelled `app=<label>`. `bookmarks: false` keeps the watcher's
/// resourceVersion at the last matching event, so that compacting history after an unrelated
/// write is certain to make its resume fail with 410 (a periodic bookmark could otherwise carry
/// the newest version just before the compaction, and the resume would rightly succeed).
fn spawn_reflector(
    client: Client,
    label: &str,
    bookmarks: bool,
) -> (
    Store<ConfigMap>,
    Arc<AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let (reader, writer) = reflector::store();
    let inits = Arc::new(AtomicUsize::new(0));
    let counter = inits.clone();
    let mut config = watcher::Config::default().labels(&format!("app={label}"));
    if !bookmarks {
        config = config.disable_bookmarks();
    }
    let stream = watcher::watcher(api, config).default_backoff();
    let task = tokio::spawn(async move {
        reflector::reflector(writer, stream)
            .for_each(|ev| {
                if let Ok(Event::Init) = ev {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                futures::future::ready(())
            })
            .await;
    });
    (reader, inits, task)
}

/// name -> resourceVersion, as the store sees it; also checks the store holds no duplicates.
fn store_view(store: &Store<ConfigMap>) -> BTreeMap<String, String> {
    let state = store.state();
    let view: BTreeMap<String, String> = state
        .iter()
        .map(|c| (c.name_any(), c.resource_version().unwrap_or_default()))
        .collect();
    assert_eq!(view.len(), state.len(), "store holds duplicate objects");
    view
}

async fn server_view(api: &Api<ConfigMap>, label: &str) -> BTreeMap<String, String> {
    api.list(&ListParams::default().labels(&format!("app={label}")))
        .await
        .expect("list")
        .items
        .iter()
        .map(|c| (c.name_any(), c.resource_version().unwrap_or_default()))
        .collect()
}

async fn wait_converged(store: &Store<ConfigMap>, api: &Api<ConfigMap>, label: &str) {
    wait_until(
        "reflector store to equal server state",
        PATIENCE,
        || async {
            let server = server_view(api, label).await;
            let local = store_view(store);
            if server == local {
                Ok(())
            } else {
                Err(format!("server={server:?} store={local:?}"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn kube_watcher_reflector_survives_forced_410() {
    // A long bookmark interval makes sure no bookmark moves the watcher's resourceVersion
    // past the compaction point, so resuming really gets 410 Expired.
    let tc = start_cluster_with(Options {
        bookmark_interval: Duration::from_secs(3600),
        ..Options::default()
    })
    .await;
    let api: Api<ConfigMap> = tc.api("default");
    let pp = PostParams::default();
    for i in 0..5 {
        api.create(
            &pp,
            &configmap(&format!("r{i}"), &[("app", "r410")], &[("v", "0")]),
        )
        .await
        .expect("create");
    }
    let (store, inits, task) = spawn_reflector(tc.client.clone(), "r410", false);
    wait_converged(&store, &api, "r410").await;
    assert_eq!(inits.load(Ordering::SeqCst), 1);

    // An unrelated write moves the global resourceVersion past what the watcher last saw.
    api.create(&pp, &configmap("unrelated", &[("app", "other")], &[]))
        .await
        .expect("create unrelated");

    let faults = tc.dc.faults();
    faults.compact();
    faults.close_watches();

    // Mutate while the watcher is re-establishing.
    for i in 5..8 {
        api.create(
            &pp,
            &configmap(&format!("r{i}"), &[("app", "r410")], &[("v", "0")]),
        )
        .await
        .expect("create after compaction");
    }
    api.delete("r0", &DeleteParams::default())
        .await
        .expect("delete r0");
    api.delete("r1", &DeleteParams::default())
        .await
        .expect("delete r1");
    api.patch(
        "r2",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "1"}})),
    )
    .await
    .expect("patch r2");
    // Relabel one object out of the selector: the store must drop it.
    api.patch(
        "r3",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "gone"}}})),
    )
    .await
    .expect("relabel r3");

    wait_converged(&store, &api, "r410").await;
    let names: Vec<String> = store_view(&store).into_keys().collect();
    assert_eq!(names, vec!["r2", "r4", "r5", "r6", "r7"]);
    let r2 = store
        .state()
        .into_iter()
        .find(|c| c.name_any() == "r2")
        .expect("r2 in store");
    assert_eq!(
        r2.data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(String::as_str),
        Some("1")
    );
    assert!(
        inits.load(Ordering::SeqCst) >= 2,
        "the watcher must have relisted after the forced 410 (inits={})",
        inits.load(Ordering::SeqCst)
    );
    task.abort();
}

#[tokio::test]
async fn kube_watcher_reflector_survives_dropped_watch() {
    let tc = start_cluster().await;
    let api: Api<ConfigMap> = tc.api("default");
    let pp = PostParams::default();
    for i in 0..3 {
        api.create(
            &pp,
            &configmap(&format!("d{i}"), &[("app", "drop")], &[("v", "0")]),
        )
        .await
        .expect("create");
    }
    let (store, inits, task) = spawn_reflector(tc.client.clone(), "drop", true);
    wait_converged(&store, &api, "drop").await;

    let faults = tc.dc.faults();
    let stats_watches = || tc.dc.stats().watches_open();
    for round in 0..3 {
        wait_until("watch to be (re)established", PATIENCE, || async {
            let open = stats_watches();
            if open >= 1 {
                Ok(())
            } else {
                Err(format!("watches_open={open}"))
            }
        })
        .await;
        faults.close_watches();
        // Writes made while no watch is open must be delivered when the watch resumes.
        api.create(
            &pp,
            &configmap(&format!("n{round}"), &[("app", "drop")], &[("v", "0")]),
        )
        .await
        .expect("create while dropped");
        api.patch(
            &format!("d{round}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": format!("{round}")}})),
        )
        .await
        .expect("patch while dropped");
        if round == 2 {
            api.delete("d0", &DeleteParams::default())
                .await
                .expect("delete d0");
        }
        wait_converged(&store, &api, "drop").await;
    }
    let names: Vec<String> = store_view(&store).into_keys().collect();
    assert_eq!(names, vec!["d1", "d2", "n0", "n1", "n2"]);
    assert_eq!(
        inits.load(Ordering::SeqCst),
        1,
        "a dropped (not expired) watch must resume from its resourceVersion without relisting"
    );
    task.abort();
}

#[derive(Debug, thiserror::Error)]
#[error("reconcile failed: {0}")]
struct ReconcileError(#[from] kube::Error);

#[tokio::test]
async fn kube_controller_reconciles_crd() {
    let tc = start_cluster().await;
    install_widget_crd(&tc.client).await;
    let widgets: Api<Widget> = tc.api("default");

    async fn reconcile(w: Arc<Widget>, api: Arc<Api<Widget>>) -> Result<Action, ReconcileError> {
        let status = WidgetStatus {
            ready: Some(true),
            observed_size: Some(w.spec.size),
        };
        api.patch_status(
            &w.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await?;
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<Widget>, _: &ReconcileError, _: Arc<Api<Widget>>) -> Action {
        Action::requeue(Duration::from_millis(500))
    }

    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .run(reconcile, error_policy, Arc::new(widgets.clone()))
            .for_each(|_| futures::future::ready(())),
    );

    widgets
        .create(&PostParams::default(), &widget("ctl", 3))
        .await
        .expect("create widget");
    let observed = |want: i32| {
        let widgets = widgets.clone();
        async move {
            let w = widgets.get("ctl").await.map_err(|e| e.to_string())?;
            match &w.status {
                Some(s) if s.ready == Some(true) && s.observed_size == Some(want) => Ok(()),
                other => Err(format!("status={other:?}")),
            }
        }
    };
    wait_until("controller to report size 3", PATIENCE, || observed(3)).await;

    widgets
        .patch(
            "ctl",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .expect("patch spec");
    wait_until("controller to report size 5", PATIENCE, || observed(5)).await;
    let w = widgets.get("ctl").await.expect("get");
    assert_eq!(w.spec.size, 5, "status writes must not touch spec");
    controller.abort();
}

const FINALIZER: &str = "conformance.ctrlhub.dev/cleanup";

#[tokio::test]
async fn kube_finalizer_completes() {
    let tc = start_cluster().await;
    install_widget_crd(&tc.client).await;
    let widgets: Api<Widget> = tc.api("default");

    struct Ctx {
        api: Api<Widget>,
        cleaned: Mutex<Vec<String>>,
    }
    let ctx = Arc::new(Ctx {
        api: widgets.clone(),
        cleaned: Mutex::new(Vec::new()),
    });

    async fn reconcile(
        w: Arc<Widget>,
        ctx: Arc<Ctx>,
    ) -> Result<Action, kube::runtime::finalizer::Error<ReconcileError>> {
        let api = ctx.api.clone();
        finalizer(&api, FINALIZER, w, |event| async move {
            match event {
                FinalizerEvent::Apply(_) => Ok(Action::await_change()),
                FinalizerEvent::Cleanup(w) => {
                    ctx.cleaned.lock().push(w.name_any());
                    Ok::<_, ReconcileError>(Action::await_change())
                }
            }
        })
        .await
    }
    fn error_policy(
        _: Arc<Widget>,
        _: &kube::runtime::finalizer::Error<ReconcileError>,
        _: Arc<Ctx>,
    ) -> Action {
        Action::requeue(Duration::from_millis(500))
    }

    let controller = tokio::spawn(
        Controller::new(widgets.clone(), watcher::Config::default())
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|_| futures::future::ready(())),
    );

    widgets
        .create(&PostParams::default(), &widget("fin", 1))
        .await
        .expect("create widget");
    wait_until("finalizer to be added", PATIENCE, || async {
        let w = widgets.get("fin").await.map_err(|e| e.to_string())?;
        if w.finalizers().iter().any(|f| f == FINALIZER) {
            Ok(())
        } else {
            Err(format!("finalizers={:?}", w.finalizers()))
        }
    })
    .await;
    assert!(ctx.cleaned.lock().is_empty(), "no cleanup before delete");

    widgets
        .delete("fin", &DeleteParams::default())
        .await
        .expect("delete widget");
    wait_until("widget to disappear after cleanup", PATIENCE, || async {
        match widgets.get_opt("fin").await {
            Ok(None) => Ok(()),
            Ok(Some(w)) => Err(format!(
                "still present: deletionTimestamp={:?} finalizers={:?}",
                w.metadata.deletion_timestamp,
                w.finalizers()
            )),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    let cleaned = ctx.cleaned.lock().clone();
    assert!(
        cleaned.iter().any(|n| n == "fin"),
        "cleanup must have run before the object disappeared: {cleaned:?}"
    );
    controller.abort();
}
