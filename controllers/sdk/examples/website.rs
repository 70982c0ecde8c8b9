//! The Website operator (CRD: deploy/examples/website/crd.yaml). For each `Website`: a
//! Deployment of `spec.replicas` pods of `spec.image` and a Service (80 to 8080), repaired when
//! edited or deleted; its `<name>: <image>` entry in the ConfigMap `website-registry`, removed
//! under a finalizer when the Website goes; a `Ready` condition from the Deployment's ready
//! replicas, read through the manager's cache. Writes use the process's own credentials
//! (`KUBECONFIG`); `CTRLHUB_ADDR`/`CTRLHUB_TOKEN` say where the manager is, `CTRLHUB_LOG*` and
//! `CTRLHUB_HEALTH_ADDR` how to log and probe it. `cargo run -p ctrlhub-sdk --example website`.

use std::sync::Arc;

use ctrlhub_sdk::conditions::{condition, set_condition};
use ctrlhub_sdk::{Action, CancellationToken, Config, Controller, ReconcileError, Request};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap, core::v1::Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The finalizer that guards the registry entry.
pub(crate) const FINALIZER: &str = "example.ctrlhub.io/registry";
/// The ConfigMap that lists every Website of a namespace with its image.
pub(crate) const REGISTRY: &str = "website-registry";

/// A website: an image served by `replicas` pods.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug)]
#[kube(
    group = "example.ctrlhub.io",
    version = "v1",
    kind = "Website",
    namespaced
)]
#[kube(status = "WebsiteStatus", schema = "disabled")]
pub(crate) struct WebsiteSpec {
    /// The container image.
    #[serde(default = "default_image")]
    pub image: String,
    /// How many pods serve it.
    #[serde(default = "one")]
    pub replicas: i32,
}
fn default_image() -> String {
    "nginx:1.27".into()
}
fn one() -> i32 {
    1
}

/// What the operator observed.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WebsiteStatus {
    /// `Ready`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The Deployment's ready replicas.
    pub ready_replicas: Option<i32>,
    /// The generation this status describes.
    pub observed_generation: Option<i64>,
}

/// Runs the operator until `shutdown` (then drains).
pub(crate) async fn run(
    client: Client,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), ctrlhub_sdk::Error> {
    Controller::new("website")
        .reconciles::<Website>()
        .owns::<Deployment>() // cached in full: its status is read below
        .owns::<Service>()
        .include_object(true)
        .max_concurrent_reconciles(4)
        .client(client)
        .run(config, reconcile, Arc::new(()), shutdown)
        .await
}

/// One Website, level-triggered. No object is NotFound: never a reason to clean up.
async fn reconcile(req: Request<Website>, _: Arc<()>) -> Result<Action, ReconcileError> {
    let Some(site) = &req.object else {
        return Ok(Action::done());
    };
    let cleanup = || registry(&req, site, Value::Null);
    let deleting = site.metadata.deletion_timestamp.is_some();
    if req.finalizers().finalize(site, FINALIZER, cleanup).await? || deleting {
        return Ok(Action::done());
    }
    req.finalizers().ensure(site, FINALIZER).await?;
    registry(&req, site, json!(site.spec.image)).await?;
    let (ns, name, spec) = (
        site.namespace().unwrap_or_default(),
        site.name_any(),
        &site.spec,
    );
    let labels = json!({ "app.kubernetes.io/name": name });
    let mut deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels },
        "spec": { "replicas": spec.replicas, "selector": { "matchLabels": labels },
            "template": { "metadata": { "labels": labels }, "spec": { "containers": [{
                "name": "web", "image": spec.image, "ports": [{ "containerPort": 8080 }] }] } } },
    }))?;
    let mut service: Service = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": labels },
        "spec": { "selector": labels, "ports": [{ "port": 80, "targetPort": 8080 }] },
    }))?;
    req.apply(req.adopt(&mut deployment, site)?).await?;
    req.apply(req.adopt(&mut service, site)?).await?;
    let cached = req.reader().get::<Deployment>(&ns, &name).await?;
    let ready = cached.and_then(|d| d.status?.ready_replicas).unwrap_or(0);
    let mut status = site.status.clone().unwrap_or_default();
    let (up, message) = (
        ready >= spec.replicas,
        format!("{ready}/{} ready", spec.replicas),
    );
    let reason = if up { "Available" } else { "Progressing" };
    let ready_condition = condition("Ready", up, reason, message, site.metadata.generation);
    set_condition(&mut status.conditions, ready_condition);
    (status.ready_replicas, status.observed_generation) = (Some(ready), site.metadata.generation);
    if site.status.as_ref() != Some(&status) {
        req.patch_status(site, &status).await?;
    }
    Ok(Action::done())
}

/// Sets (or with `null`, removes) the entry of `site` in the registry of its namespace. A merge
/// patch, not an apply: every Website of the namespace writes its own key of one ConfigMap.
async fn registry(
    req: &Request<Website>,
    site: &Website,
    image: Value,
) -> Result<(), ReconcileError> {
    let cms: Api<ConfigMap> =
        Api::namespaced(req.client()?.clone(), &site.namespace().unwrap_or_default());
    let data = json!({ "metadata": { "name": REGISTRY }, "data": { site.name_any(): image } });
    match cms
        .patch(REGISTRY, &PatchParams::default(), &Patch::Merge(&data))
        .await
    {
        Err(e) if ctrlhub_sdk::is_not_found(&e) && !image.is_null() => {
            cms.create(&PostParams::default(), &serde_json::from_value(data)?)
                .await?;
        }
        Err(e) if ctrlhub_sdk::is_not_found(&e) => {} // no registry: nothing to remove
        result => drop(result?),
    }
    Ok(())
}

/// Logs, signals, the client and the manager's address from the environment; runs until SIGTERM.
#[tokio::main]
pub(crate) async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ctrlhub_sdk::logs::init()?; // CTRLHUB_LOG (info), CTRLHUB_LOG_FORMAT (text or json)
    let shutdown = ctrlhub_sdk::shutdown_on_signals(); // SIGTERM or Ctrl-C drains
    run(Client::try_default().await?, Config::from_env()?, shutdown).await?;
    Ok(())
}
