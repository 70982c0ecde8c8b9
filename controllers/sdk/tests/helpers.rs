//! The write helpers of a request, against the real manager (`target/debug/ctrlhub run`) and
//! devcluster, from inside real reconciles:
//!
//! - `adopt` + `apply` (server-side apply, the controller's field manager) and `patch_status`,
//!   for a built-in kind (Deployment) and a custom resource (Website);
//! - `is_not_found` and `is_conflict` on the client's real errors;
//! - the Events recorder: `ReconcileFailed` posted for failures and aggregated into one series,
//!   `info`/`warning` from the handler, nothing for the primary's own NotFound, and posting that
//!   never holds a reconcile up (the Events API slowed down to 5 s);
//! - `finalizers.ensure` and `finalizers.finalize`.
//!
//! Build the binaries first: `cargo build --bin ctrlhub --bin devcluster`.
#![allow(clippy::unwrap_used)]

mod support;
#[allow(dead_code)]
#[path = "../examples/website.rs"]
mod website;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctrlhub_sdk::{
    Action, CancellationToken, Controller, ReconcileError, Request, Scope, is_conflict,
    is_not_found,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Cluster, Manager, ManagerOptions, PATIENCE, eventually, repo};
use tokio::task::JoinHandle;
use website::{Website, WebsiteSpec, WebsiteStatus};

const NS: &str = "helpers";
const FINALIZER: &str = "example.com/cleanup";

/// What the handlers did: (object name, note, when).
#[derive(Default)]
struct Probe(Mutex<Vec<(String, String, Instant)>>);

impl Probe {
    fn note(&self, name: &str, note: impl Into<String>) {
        let note = note.into();
        self.0
            .lock()
            .unwrap()
            .push((name.to_owned(), note, Instant::now()));
    }

    /// When `name` noted `note` first.
    fn when(&self, name: &str, note: &str) -> Option<Instant> {
        let notes = self.0.lock().unwrap();
        notes
            .iter()
            .find(|(n, t, _)| n == name && t == note)
            .map(|(_, _, at)| *at)
    }

    fn notes(&self, name: &str) -> Vec<String> {
        let notes = self.0.lock().unwrap();
        notes
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, t, _)| t.clone())
            .collect()
    }
}

/// Each ConfigMap's `do` says what its reconcile does.
async fn reconcile(req: Request<ConfigMap>, probe: Arc<Probe>) -> Result<Action, ReconcileError> {
    let name = req.name().to_owned();
    let Some(cm) = &req.object else {
        probe.note(&name, "no object");
        return Ok(Action::done());
    };
    let what = cm
        .data
        .as_ref()
        .and_then(|d| d.get("do"))
        .cloned()
        .unwrap_or_default();
    probe.note(&name, format!("attempt {}", req.attempt));
    let api: Api<ConfigMap> = Api::namespaced(req.client()?.clone(), NS);
    match what.as_str() {
        "write" => write(&req, cm, &probe).await?,
        "errors" => {
            let missing = api.get("does-not-exist").await.unwrap_err();
            let mut stale = cm.clone();
            stale.metadata.resource_version = Some("1".into());
            let conflict = api
                .replace(&name, &PostParams::default(), &stale)
                .await
                .unwrap_err();
            let through = ReconcileError::from(conflict);
            probe.note(
                &name,
                format!(
                    "not_found={} conflict={} crossed={} converted={}",
                    is_not_found(&missing),
                    is_conflict(&through),
                    is_conflict(&missing) || is_not_found(&through),
                    is_conflict(&ReconcileError::from(missing)),
                ),
            );
        }
        "fail" if req.attempt <= 3 => return Err(ReconcileError::retry("the same failure")),
        "fail-once" if req.attempt == 1 => return Err(ReconcileError::retry("failed once")),
        "post" => {
            req.events().info(cm, "Noticed", "hello");
            req.events().warning(cm, "Odd", "careful");
        }
        "vanish" => {
            // The primary is deleted under the reconcile: its own NotFound posts no Event.
            api.delete(&name, &DeleteParams::default()).await?;
            let patch = Patch::Merge(json!({"data": {"x": "y"}}));
            api.patch(&name, &PatchParams::default(), &patch).await?;
        }
        "finalize" => {
            let cleanup = || async {
                probe.note(&name, "cleanup");
                Ok::<_, ReconcileError>(())
            };
            if req.finalizers().finalize(cm, FINALIZER, cleanup).await? {
                probe.note(&name, "finalized");
                return Ok(Action::done());
            }
            let changed = req.finalizers().ensure(cm, FINALIZER).await?;
            probe.note(&name, format!("ensure {changed}"));
        }
        _ => {}
    }
    probe.note(&name, "end");
    Ok(Action::done())
}

/// Adopts and applies a Deployment and a Website owned by `cm`, then patches their status.
async fn write(
    req: &Request<ConfigMap>,
    cm: &ConfigMap,
    probe: &Probe,
) -> Result<(), ReconcileError> {
    let name = req.name();
    let labels = json!({"app": name});
    let mut deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
    }))?;
    let stored = req.apply(req.adopt(&mut deployment, cm)?).await?;
    let status = json!({"replicas": 1, "readyReplicas": 1});
    let patched = req.patch_status(&stored, &status).await?;
    let ready = patched.status.and_then(|s| s.ready_replicas);
    probe.note(name, format!("deployment ready {ready:?}"));

    let mut site = Website::new(
        name,
        WebsiteSpec {
            image: "httpd:2.4".into(),
            replicas: 2,
        },
    );
    let stored = req.apply(req.adopt(&mut site, cm)?).await?;
    let status = WebsiteStatus {
        ready_replicas: Some(2),
        observed_generation: stored.metadata.generation,
        ..WebsiteStatus::default()
    };
    let patched = req.patch_status(&stored, &status).await?;
    let ready = patched.status.and_then(|s| s.ready_replicas);
    probe.note(name, format!("website ready {ready:?}"));
    Ok(())
}

/// The controller under test, with the cluster's client for its writes.
fn start(
    cluster: &Cluster,
    manager: &Manager,
    probe: &Arc<Probe>,
) -> (
    CancellationToken,
    JoinHandle<Result<(), ctrlhub_sdk::Error>>,
) {
    let shutdown = CancellationToken::new();
    let run = Controller::new("helpers")
        .reconciles::<ConfigMap>()
        .namespaces(Scope::Names(vec![NS.into()]))
        .include_object(true)
        .max_concurrent_reconciles(4)
        .client(cluster.client.clone())
        .run(manager.config(), reconcile, probe.clone(), shutdown.clone());
    (shutdown, tokio::spawn(run))
}

async fn stop(shutdown: CancellationToken, run: JoinHandle<Result<(), ctrlhub_sdk::Error>>) {
    shutdown.cancel();
    let result = tokio::time::timeout(PATIENCE, run).await.unwrap();
    assert!(result.unwrap().is_ok());
}

async fn configmap(cluster: &Cluster, name: &str, what: &str) -> ConfigMap {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), NS);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"do": what}})).unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap()
}

/// Waits until `probe` saw `note` from `name`.
async fn noted(probe: &Probe, name: &str, note: &str) -> Instant {
    eventually(&format!("{name}: {note}"), PATIENCE, || async {
        probe.when(name, note)
    })
    .await
}

/// The Events about object `name`.
async fn events_about(cluster: &Cluster, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(cluster.client.clone(), NS);
    let list = api.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// devcluster's fault injection (`POST /_devcluster/...`), through the test's client.
async fn fault(cluster: &Cluster, path: &str, body: serde_json::Value) {
    let request = http::Request::post(format!("/_devcluster/{path}"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    cluster.client.request_text(request).await.unwrap();
}

#[tokio::test]
async fn writes_through_the_request() {
    let cluster = Cluster::start("helpers-writes").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    cluster.namespace(NS).await;
    let yaml = std::fs::read_to_string(repo("deploy/examples/website/crd.yaml")).unwrap();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let sites: Api<Website> = Api::namespaced(cluster.client.clone(), NS);
    eventually("the Website kind to be served", PATIENCE, || async {
        sites.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;
    let probe = Arc::new(Probe::default());
    let (shutdown, run) = start(&cluster, &manager, &probe);

    let owner = configmap(&cluster, "owner", "write").await;
    configmap(&cluster, "errors", "errors").await;
    noted(&probe, "owner", "end").await;
    assert!(
        probe
            .notes("owner")
            .contains(&"deployment ready Some(1)".into())
    );
    assert!(
        probe
            .notes("owner")
            .contains(&"website ready Some(2)".into())
    );

    // What the API server stored: the owner reference, the field manager, the status.
    let uid = owner.metadata.uid.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), NS);
    let d = deployments.get("owner").await.unwrap();
    let site = sites.get("owner").await.unwrap();
    for meta in [&d.metadata, &site.metadata] {
        let refs = meta.owner_references.clone().unwrap_or_default();
        assert_eq!(refs.len(), 1, "{refs:?}");
        let r = &refs[0];
        assert_eq!((r.kind.as_str(), r.name.as_str()), ("ConfigMap", "owner"));
        assert_eq!((r.api_version.as_str(), &r.uid), ("v1", &uid));
        assert_eq!(
            (r.controller, r.block_owner_deletion),
            (Some(true), Some(true))
        );
        let managers: Vec<(String, String)> = meta
            .managed_fields
            .clone()
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
            managers.contains(&("helpers".into(), "Apply".into())),
            "the controller's name is the field manager: {managers:?}"
        );
    }
    assert_eq!(d.status.and_then(|s| s.ready_replicas), Some(1));
    assert_eq!(site.spec.replicas, 2);
    assert_eq!(site.status.and_then(|s| s.ready_replicas), Some(2));

    noted(&probe, "errors", "end").await;
    assert!(
        probe
            .notes("errors")
            .contains(&"not_found=true conflict=true crossed=false converted=false".into()),
        "{:?}",
        probe.notes("errors")
    );
    stop(shutdown, run).await;
}

#[tokio::test]
async fn events_are_posted_aggregated_and_never_in_the_way() {
    let cluster = Cluster::start("helpers-events").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    cluster.namespace(NS).await;
    let probe = Arc::new(Probe::default());
    let (shutdown, run) = start(&cluster, &manager, &probe);

    // Three failures with the same message: one Event, counted three times.
    configmap(&cluster, "failing", "fail").await;
    noted(&probe, "failing", "end").await;
    let event = eventually("one ReconcileFailed series of 3", PATIENCE, || async {
        let events = events_about(&cluster, "failing").await;
        let counted = events
            .first()
            .and_then(|e| e.series.as_ref())
            .map(|s| s.count);
        (events.len() == 1 && counted == Some(3)).then(|| events[0].clone())
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reason.as_deref(), Some("ReconcileFailed"));
    assert_eq!(event.note.as_deref(), Some("the same failure"));
    assert_eq!(
        event.reporting_controller.as_deref(),
        Some("ctrlhub.io/helpers")
    );
    assert!(
        event
            .reporting_instance
            .as_deref()
            .is_some_and(|i| !i.is_empty())
    );
    let regarding = event.regarding.unwrap_or_default();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.namespace.as_deref()),
        (Some("ConfigMap"), Some(NS))
    );

    // The primary's own NotFound posts nothing: its next attempt (no object) starts after the
    // failure was handled, and an Event posted after that one arrives; none about it did.
    configmap(&cluster, "vanishing", "vanish").await;
    noted(&probe, "vanishing", "no object").await;
    configmap(&cluster, "posting", "post").await;
    let posted = eventually("the handler's two Events", PATIENCE, || async {
        let events = events_about(&cluster, "posting").await;
        (events.len() == 2).then_some(events)
    })
    .await;
    let mut kinds: Vec<(String, String, String)> = posted
        .into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("Normal".into(), "Noticed".into(), "hello".into()),
            ("Warning".into(), "Odd".into(), "careful".into())
        ]
    );
    assert!(events_about(&cluster, "vanishing").await.is_empty());

    // An Events API that takes 5 s per write does not hold a failed attempt's result up.
    fault(
        &cluster,
        "latency",
        json!({"verb": "*", "resource": "events", "millis": 5000}),
    )
    .await;
    configmap(&cluster, "quick", "fail-once").await;
    let first = noted(&probe, "quick", "attempt 1").await;
    let done = noted(&probe, "quick", "end").await;
    assert!(
        done - first < Duration::from_secs(3),
        "the retry was not held up by the Event: {:?}",
        done - first
    );
    eventually("the slow Event, eventually", PATIENCE, || async {
        (!events_about(&cluster, "quick").await.is_empty()).then_some(())
    })
    .await;
    fault(&cluster, "clear", json!({})).await;
    stop(shutdown, run).await;
}

#[tokio::test]
async fn finalizers_ensure_then_finalize() {
    let cluster = Cluster::start("helpers-finalizers").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    cluster.namespace(NS).await;
    let probe = Arc::new(Probe::default());
    let (shutdown, run) = start(&cluster, &manager, &probe);
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), NS);

    configmap(&cluster, "guarded", "finalize").await;
    noted(&probe, "guarded", "ensure true").await;
    let stored = api.get("guarded").await.unwrap();
    assert_eq!(stored.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    // Once there, ensure changes nothing (its own patch brought the next request).
    noted(&probe, "guarded", "ensure false").await;

    api.delete("guarded", &DeleteParams::default())
        .await
        .unwrap();
    noted(&probe, "guarded", "finalized").await;
    eventually("the ConfigMap gone", PATIENCE, || async {
        api.get_opt("guarded")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let notes = probe.notes("guarded");
    let cleanups = notes.iter().filter(|n| *n == "cleanup").count();
    assert_eq!(cleanups, 1, "{notes:?}");
    stop(shutdown, run).await;
}
