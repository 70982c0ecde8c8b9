//! The Website operator: for each `Website` (example.ctrlhub.io/v1, CRD in
//! deploy/examples/website/crd.yaml) a Deployment of `spec.replicas` pods running `spec.image`
//! and a Service in front of it (port 80 to 8080), both repaired when edited or deleted; an
//! entry `<name>: <image>` in the ConfigMap `website-registry`, removed under the finalizer
//! when the Website is deleted; and a `Ready` condition from the Deployment's ready replicas,
//! read through the manager's cache. Writes go to the API server with this process's own
//! credentials (`KUBECONFIG`); `CTRLHUB_ADDR`/`CTRLHUB_TOKEN` say where the manager is.
//!
//! `cargo run -p ctrlhub-sdk --example website`, e.g. against `ctrlhub dev` after
//! `kubectl apply -f deploy/examples/website/crd.yaml`.

use std::collections::BTreeMap;
use std::sync::Arc;

use ctrlhub_sdk::apply::apply_owned;
use ctrlhub_sdk::conditions::{condition, set_condition};
use ctrlhub_sdk::finalizer::{FinalizerEvent, finalize};
use ctrlhub_sdk::{Action, CancellationToken, Config, Controller, ReconcileError, Request};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, CustomResource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The finalizer that guards the registry entry.
pub const FINALIZER: &str = "example.ctrlhub.io/registry";
/// The ConfigMap that lists every Website of a namespace with its image.
pub const REGISTRY: &str = "website-registry";

/// A website: an image served by `replicas` pods.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug)]
#[kube(
    group = "example.ctrlhub.io",
    version = "v1",
    kind = "Website",
    namespaced
)]
#[kube(status = "WebsiteStatus", schema = "disabled")]
pub struct WebsiteSpec {
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
pub struct WebsiteStatus {
    /// `Ready`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The Deployment's ready replicas.
    pub ready_replicas: Option<i32>,
    /// The generation this status describes.
    pub observed_generation: Option<i64>,
}

/// Runs the operator until `shutdown` (then drains).
pub async fn run(
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
        .run(config, reconcile, Arc::new(client), shutdown)
        .await
}

/// One Website, level-triggered.
async fn reconcile(req: Request<Website>, client: Arc<Client>) -> Result<Action, ReconcileError> {
    // No object means NotFound (or a deletion already finished): never a reason to clean up;
    // the finalizer below is what makes cleanup happen, once.
    let Some(site) = req.object.clone() else {
        return Ok(Action::done());
    };
    let api: Api<Website> =
        Api::namespaced((*client).clone(), &site.namespace().unwrap_or_default());
    finalize(&api, site, FINALIZER, |event| async {
        match event {
            FinalizerEvent::Apply(site) => apply(&req, &client, &api, site).await,
            FinalizerEvent::Cleanup(site) => registry(&client, &site, Value::Null).await,
        }
    })
    .await
}

/// Registry entry, children and status.
async fn apply(
    req: &Request<Website>,
    client: &Client,
    api: &Api<Website>,
    site: Website,
) -> Result<Action, ReconcileError> {
    registry(client, &site, json!(site.spec.image)).await?;
    apply_owned(client, &site, deployment(&site)?, "website").await?;
    apply_owned(client, &site, service(&site)?, "website").await?;
    let (ns, name) = (site.namespace().unwrap_or_default(), site.name_any());
    let deployment = req.reader().get::<Deployment>(&ns, &name).await?;
    let ready = deployment
        .and_then(|d| d.status?.ready_replicas)
        .unwrap_or(0);
    let mut status = site.status.clone().unwrap_or_default();
    let (up, message) = (
        ready >= site.spec.replicas,
        format!("{ready}/{} ready", site.spec.replicas),
    );
    let reason = if up { "Available" } else { "Progressing" };
    set_condition(
        &mut status.conditions,
        condition("Ready", up, reason, message, site.metadata.generation),
    );
    (status.ready_replicas, status.observed_generation) = (Some(ready), site.metadata.generation);
    if site.status.as_ref() != Some(&status) {
        let patch = Patch::Merge(json!({ "status": status }));
        api.patch_status(&name, &PatchParams::default(), &patch)
            .await?;
    }
    Ok(Action::done())
}

/// The Deployment of `site`, with only the fields the operator owns.
fn deployment(site: &Website) -> Result<Deployment, ReconcileError> {
    let labels = json!({ "app.kubernetes.io/name": site.name_any() });
    Ok(serde_json::from_value(json!({
        "metadata": { "name": site.name_any(), "labels": labels },
        "spec": { "replicas": site.spec.replicas, "selector": { "matchLabels": labels },
            "template": { "metadata": { "labels": labels }, "spec": { "containers": [{
                "name": "web", "image": site.spec.image, "ports": [{ "containerPort": 8080 }],
            }] } } },
    }))?)
}

/// The Service of `site`: port 80 to the pods' 8080.
fn service(site: &Website) -> Result<Service, ReconcileError> {
    let labels = json!({ "app.kubernetes.io/name": site.name_any() });
    Ok(serde_json::from_value(json!({
        "metadata": { "name": site.name_any(), "labels": labels },
        "spec": { "selector": labels, "ports": [{ "port": 80, "targetPort": 8080 }] },
    }))?)
}

/// Sets (or with `null`, removes) the entry of `site` in the registry of its namespace.
async fn registry(client: &Client, site: &Website, image: Value) -> Result<Action, ReconcileError> {
    let api: Api<ConfigMap> =
        Api::namespaced(client.clone(), &site.namespace().unwrap_or_default());
    let data = BTreeMap::from([(site.name_any(), image.clone())]);
    match api
        .patch(
            REGISTRY,
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": data })),
        )
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 && !image.is_null() => {
            let registry = json!({ "metadata": { "name": REGISTRY }, "data": data });
            api.create(&PostParams::default(), &serde_json::from_value(registry)?)
                .await?;
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {} // nothing to remove
        Err(e) => return Err(e.into()),
        Ok(_) => {}
    }
    Ok(Action::done())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ctrlhub_sdk::traces::logs::init(Default::default(), "info");
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel(); // drains: running reconciles finish, then run() returns
    });
    run(Client::try_default().await?, Config::from_env()?, shutdown).await?;
    Ok(())
}
