//! The Operator SDK memcached sample, rebuilt as an out-of-process ctrlhub
//! controller on `ctrlhub-sdk`.
//!
//! For every `Memcached` (cache.example.com/v1alpha1) it keeps a Deployment
//! of `spec.size` memcached pods, reports an `Available` condition, and uses
//! the finalizer `cache.example.com/finalizer` to record an Event before the
//! custom resource goes away. It writes with the SDK's helpers (`adopt`,
//! `apply`, `patch_status`, `finalizers`, `events`), and the SDK logs each
//! reconcile's start and end (`reconcile start key=ns/name attempt=1`).
//!
//! The SDK keeps the protocol: exclusive attempts (heartbeats; the process
//! exits only if a reconcile outlives its session's hold), and rolling
//! upgrades: `CTRLHUB_REVISION` sets the registration's revision, and a
//! replica superseded by a newer definition (or refused as outdated) keeps
//! running without work and registers again every 30 s instead of exiting,
//! until the rollout replaces it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ctrlhub_sdk::conditions::{ConditionStatus, condition, set_condition};
use ctrlhub_sdk::traces::k8s_call;
use ctrlhub_sdk::{
    Action, CancellationToken, Config, Controller, Predicate, ReconcileError, Request, Scope,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec, PodTemplateSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing::info;

/// Controller name: registration name, field manager and event reporter.
const CONTROLLER_NAME: &str = "memcached";
/// The finalizer guarding cleanup.
const FINALIZER: &str = "cache.example.com/finalizer";
/// The memcached image.
const IMAGE: &str = "memcached:1.6.26-alpine";
/// The condition type reported in status.
const AVAILABLE: &str = "Available";

/// Desired state of a Memcached cluster.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cache.example.com",
    version = "v1alpha1",
    kind = "Memcached",
    plural = "memcacheds",
    shortname = "mc",
    namespaced,
    status = "MemcachedStatus",
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size"}"#,
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct MemcachedSpec {
    /// Number of memcached pods.
    #[serde(default = "default_size")]
    #[schemars(range(min = 0))]
    pub size: i32,
}

fn default_size() -> i32 {
    1
}

/// Observed state of a Memcached cluster.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedStatus {
    /// Conditions (metav1.Condition), e.g. `Available`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Command line (every flag also reads an environment variable).
#[derive(clap::Parser, Debug, Clone)]
#[command(name = "memcached-controller", version, about)]
pub struct Args {
    /// ctrlhub manager endpoint: host:port (e.g. ctrlhub.ctrlhub-system.svc:9090) or an
    /// http:// / https:// URL.
    #[arg(long, env = "CTRLHUB_ADDR", default_value = ctrlhub_sdk::DEFAULT_ADDR)]
    pub manager: String,
    /// Bearer token for the manager (a value set in the environment is never shown).
    #[arg(long, env = "CTRLHUB_TOKEN", default_value = ctrlhub_sdk::DEFAULT_TOKEN, hide_env_values = true)]
    pub token: String,
    /// File holding the bearer token, read anew on every connect (a projected ServiceAccount
    /// token with the manager's audience, rotated by the kubelet); takes precedence over
    /// --token.
    #[arg(long, env = "CTRLHUB_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Kubeconfig for writes to the API server; in-cluster (or
    /// ~/.kube/config) when unset.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Server-side apply the Memcached CRD at start and wait until it is
    /// established.
    #[arg(long, env = "INSTALL_CRD")]
    pub install_crd: bool,
    /// Print the Memcached CRD as YAML and exit.
    #[arg(long)]
    pub print_crd: bool,
    /// Reconciles run at once by this process.
    #[arg(long, env = "MAX_CONCURRENT_RECONCILES", default_value_t = 4)]
    pub max_concurrent_reconciles: u32,
    /// Namespaces to watch (repeatable or comma-separated); all when empty.
    #[arg(long = "namespace", env = "WATCH_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Log lines as `text` or one JSON object per line (`json`), with the trace and span ids
    /// of each reconcile; the level comes from `CTRLHUB_LOG` (or `RUST_LOG`), as in every
    /// ctrlhub SDK.
    #[arg(long, env = "CTRLHUB_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: ctrlhub_sdk::logs::LogFormat,
    /// The tracer of this controller's spans when it shares a process with another traced
    /// service (`ctrlhub dev`); the global one otherwise.
    #[arg(skip)]
    pub tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
}

impl Args {
    /// The namespaces to watch: `--namespace ''` or an empty `WATCH_NAMESPACES` means all, and
    /// blanks around commas are ignored.
    pub fn scope(&self) -> Scope {
        let names: Vec<String> = self
            .namespaces
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        if names.is_empty() {
            Scope::All
        } else {
            Scope::Names(names)
        }
    }
}

/// Run the controller until `shutdown` fires (then drain). Logging is the caller's business.
pub async fn run(args: Args, shutdown: CancellationToken) -> anyhow::Result<()> {
    let client = kube_client(args.kubeconfig.as_deref()).await?;
    if args.install_crd {
        install_crd(&client).await?;
    }

    let scope = args.scope();
    let mut config = Config::new(args.manager, args.token);
    config.token_file = args.token_file;
    config.tracer = args.tracer;
    // `/healthz` and `/readyz` for kubelet probes when CTRLHUB_HEALTH_ADDR is set.
    config.health_addr = Config::health_addr_from_env()?;

    Controller::new(CONTROLLER_NAME)
        .reconciles::<Memcached>()
        .owns::<Deployment>()
        .namespaces(scope)
        .predicate(Predicate::generation_changed().or(Predicate::deleting()))
        .max_concurrent_reconciles(args.max_concurrent_reconciles)
        .deadline(Duration::from_secs(30))
        .client(client)
        .run(config, reconcile, Arc::new(()), shutdown)
        .await?;
    info!("memcached-controller exiting");
    Ok(())
}

/// A client from `--kubeconfig`, else the usual inference (in-cluster
/// service account, then ~/.kube/config).
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig given and in-cluster configuration unavailable")?,
    };
    Ok(Client::try_from(config)?)
}

/// Server-side applies the CRD and waits until it is established, so the
/// manager can resolve the type when we register.
async fn install_crd(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = Memcached::crd();
    let name = crd.name_any();
    crds.patch(
        &name,
        &PatchParams::apply(CONTROLLER_NAME).force(),
        &Patch::Apply(&crd),
    )
    .await
    .with_context(|| format!("applying CRD {name}"))?;
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(crds, &name, conditions::is_crd_established()),
    )
    .await
    .with_context(|| format!("CRD {name} not established after 30s"))??;
    info!(crd = %name, "CRD installed");
    Ok(())
}

async fn reconcile(req: Request<Memcached>, _: Arc<()>) -> Result<Action, ReconcileError> {
    let api: Api<Memcached> = Api::namespaced(req.client()?.clone(), &req.key.namespace);
    // Level-triggered: act on the current state, read from the API server
    // so that our own recent writes (finalizer, status) are visible.
    let (ns, name) = (req.key.namespace.as_str(), req.key.name.as_str());
    let read = api.get_opt(name);
    let Some(mc) = k8s_call("GET", "memcacheds", ns, name, read).await? else {
        // Gone: the Deployment is garbage-collected through its owner reference.
        return Ok(Action::done());
    };
    // Being deleted: record an Event (best effort, never blocking), then let it go.
    let note = format!("Custom resource {name} is being deleted from the namespace {ns}");
    let cleanup = || async {
        req.events().warning(&mc, "Deleting", note);
        Ok::<_, ReconcileError>(())
    };
    let deleting = mc.metadata.deletion_timestamp.is_some();
    if req.finalizers().finalize(&mc, FINALIZER, cleanup).await? || deleting {
        return Ok(Action::done());
    }
    req.finalizers().ensure(&mc, FINALIZER).await?;
    if mc.spec.size < 0 {
        let size = mc.spec.size;
        return Err(ReconcileError::terminal(format!(
            "spec.size must be >= 0, got {size}"
        )));
    }
    req.apply(req.adopt(&mut deployment(&mc), &mc)?).await?;
    let status = desired_status(&mc);
    if mc.status.as_ref() != Some(&status) {
        req.patch_status(&mc, &status).await?;
    }
    Ok(Action::requeue_after(Duration::from_secs(5 * 60)))
}

/// Desired Deployment for `mc` (only the fields we own).
fn deployment(mc: &Memcached) -> Deployment {
    let name = mc.name_any();
    let labels = BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "memcached".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), name.clone()),
    ]);
    Deployment {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: mc.namespace(),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(mc.spec.size),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "memcached".into(),
                        image: Some(IMAGE.into()),
                        image_pull_policy: Some("IfNotPresent".into()),
                        command: Some(vec![
                            "memcached".into(),
                            "--memory-limit=64".into(),
                            "-o".into(),
                            "modern".into(),
                            "-v".into(),
                        ]),
                        ports: Some(vec![ContainerPort {
                            container_port: 11211,
                            name: Some("memcached".into()),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The status `mc` should have once its Deployment is applied.
fn desired_status(mc: &Memcached) -> MemcachedStatus {
    let name = mc.name_any();
    let generation = mc.meta().generation;
    let mut status = mc.status.clone().unwrap_or_default();
    set_condition(
        &mut status.conditions,
        condition(
            AVAILABLE,
            ConditionStatus::True,
            "Reconciled",
            format!(
                "Deployment {name} for custom resource {name} with {} replicas created successfully",
                mc.spec.size
            ),
            generation,
        ),
    );
    status.observed_generation = generation;
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn memcached(size: i32, generation: i64) -> Memcached {
        let mut mc = Memcached::new("cache", MemcachedSpec { size });
        mc.metadata.namespace = Some("ns".into());
        mc.metadata.generation = Some(generation);
        mc
    }

    #[test]
    fn crd_shape() -> anyhow::Result<()> {
        let crd = Memcached::crd();
        assert_eq!(crd.name_any(), "memcacheds.cache.example.com");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["mc".to_owned()][..])
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let schema = serde_json::to_value(&version.schema)?;
        let size = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["size"];
        assert_eq!(size["default"], json!(1));
        assert_eq!(size["minimum"], json!(0.0));
        assert_eq!(size["format"], json!("int32"));
        Ok(())
    }

    #[test]
    fn spec_size_defaults_to_one() -> anyhow::Result<()> {
        let spec: MemcachedSpec = serde_json::from_value(json!({}))?;
        assert_eq!(spec.size, 1);
        Ok(())
    }

    #[test]
    fn deployment_matches_spec() {
        let d = deployment(&memcached(3, 1));
        assert_eq!(d.metadata.name.as_deref(), Some("cache"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("ns"));
        let spec = d.spec.unwrap_or_default();
        assert_eq!(spec.replicas, Some(3));
        let labels = spec.selector.match_labels.unwrap_or_default();
        assert_eq!(
            labels.get("app.kubernetes.io/name").map(String::as_str),
            Some("memcached")
        );
        assert_eq!(
            labels.get("app.kubernetes.io/instance").map(String::as_str),
            Some("cache")
        );
        let container = &spec.template.spec.unwrap_or_default().containers[0];
        assert_eq!(container.image.as_deref(), Some(IMAGE));
    }

    #[test]
    fn status_is_stable_once_written() {
        let mut mc = memcached(2, 4);
        let status = desired_status(&mc);
        assert_eq!(status.observed_generation, Some(4));
        let c = &status.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Available", "True", "Reconciled")
        );
        assert_eq!(
            c.message,
            "Deployment cache for custom resource cache with 2 replicas created successfully"
        );
        assert_eq!(c.observed_generation, Some(4));
        mc.status = Some(status.clone());
        // Same generation: nothing to write.
        assert_eq!(desired_status(&mc), status);
        // New generation: observedGeneration moves, transition time does not.
        mc.metadata.generation = Some(5);
        mc.spec.size = 3;
        let next = desired_status(&mc);
        assert_ne!(next, status);
        assert_eq!(
            next.conditions[0].last_transition_time,
            c.last_transition_time
        );
    }
}
