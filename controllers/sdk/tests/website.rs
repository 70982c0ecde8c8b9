//! The Website example operator (examples/website.rs) end to end, against the real manager
//! and devcluster: children created from the spec, the registry entry, Ready once the
//! Deployment's pods are (devcluster runs no pods: the test plays the kubelet and patches the
//! Deployment's status), a restart without a phantom delete, hand-edited and deleted children
//! repaired, and a deletion that removes the registry entry before the Website goes.
//!
//! Build the binaries first: `cargo build --bin ctrlhub --bin devcluster`.
#![allow(clippy::unwrap_used)]

mod support;
#[allow(dead_code)]
#[path = "../examples/website.rs"]
mod website;

use ctrlhub_sdk::CancellationToken;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Cluster, Manager, ManagerOptions, PATIENCE, config_for, eventually, repo};
use tokio::task::JoinHandle;
use website::{FINALIZER, REGISTRY, Website};

const NS: &str = "web";

/// The operator running in this test.
struct Operator {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ctrlhub_sdk::Error>>,
}

impl Operator {
    fn start(cluster: &Cluster, manager: &Manager) -> Operator {
        let shutdown = CancellationToken::new();
        let run = website::run(
            cluster.client.clone(),
            config_for(manager.addr()),
            shutdown.clone(),
        );
        Operator {
            shutdown,
            task: tokio::spawn(run),
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(PATIENCE, self.task).await.unwrap();
        assert!(result.unwrap().is_ok());
    }
}

/// Installs the committed CRD and waits until it is served.
async fn install_crd(cluster: &Cluster) {
    let yaml = std::fs::read_to_string(repo("deploy/examples/website/crd.yaml")).unwrap();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let sites: Api<Website> = Api::namespaced(cluster.client.clone(), NS);
    eventually("the Website kind to be served", PATIENCE, || async {
        sites.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;
}

/// The registry's entry for `name`.
async fn registered(cms: &Api<ConfigMap>, name: &str) -> Option<String> {
    let registry = cms.get_opt(REGISTRY).await.unwrap()?;
    registry.data?.get(name).cloned()
}

/// The Deployment's (image, replicas), once it exists.
async fn deployment_shape(deployments: &Api<Deployment>) -> Option<(String, i32)> {
    let d = deployments.get_opt("blog").await.unwrap()?;
    let spec = d.spec?;
    let image = spec.template.spec?.containers.first()?.image.clone()?;
    Some((image, spec.replicas?))
}

/// The Website's `Ready` status and readyReplicas.
async fn readiness(sites: &Api<Website>) -> Option<(String, Option<i32>)> {
    let site = sites.get_opt("blog").await.unwrap()?;
    let status = site.status?;
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((ready.status.clone(), status.ready_replicas))
}

#[tokio::test]
async fn website_operator_end_to_end() {
    let cluster = Cluster::start("website").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    cluster.namespace(NS).await;
    install_crd(&cluster).await;
    let client = cluster.client.clone();
    let sites: Api<Website> = Api::namespaced(client.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);

    let blog: Website = serde_json::from_value(json!({
        "apiVersion": "example.ctrlhub.io/v1", "kind": "Website",
        "metadata": {"name": "blog"}, "spec": {"replicas": 2},
    }))
    .unwrap();
    sites.create(&PostParams::default(), &blog).await.unwrap();
    let operator = Operator::start(&cluster, &manager);

    // Children from the spec (the image defaults), the registry entry, the finalizer.
    let shape = eventually("the Deployment", PATIENCE, || {
        deployment_shape(&deployments)
    })
    .await;
    assert_eq!(shape, ("nginx:1.27".to_owned(), 2));
    let d = deployments.get("blog").await.unwrap();
    let labels = d.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("blog")
    );
    let svc = eventually("the Service", PATIENCE, || async {
        services.get_opt("blog").await.unwrap()
    })
    .await;
    let spec = svc.spec.unwrap();
    assert_eq!(spec.selector, Some(labels.clone()));
    let port = &spec.ports.unwrap()[0];
    assert_eq!(port.port, 80);
    assert_eq!(port.target_port, Some(IntOrString::Int(8080)));
    let image = eventually("the registry entry", PATIENCE, || registered(&cms, "blog")).await;
    assert_eq!(image, "nginx:1.27");
    let finalizers = sites.get("blog").await.unwrap().metadata.finalizers;
    assert_eq!(finalizers, Some(vec![FINALIZER.to_owned()]));
    let ready = eventually("a Ready condition", PATIENCE, || readiness(&sites)).await;
    assert_eq!(ready, ("False".to_owned(), Some(0)));

    // The kubelet's part: the pods are ready. The operator reads it through the cache.
    let status = Patch::Merge(json!({"status": {"replicas": 2, "readyReplicas": 2}}));
    deployments
        .patch_status("blog", &PatchParams::default(), &status)
        .await
        .unwrap();
    eventually("Ready True", PATIENCE, || async {
        (readiness(&sites).await? == ("True".to_owned(), Some(2))).then_some(())
    })
    .await;

    // A restart: no phantom delete, the registry entry stays.
    operator.stop().await;
    let operator = Operator::start(&cluster, &manager);

    // A hand-edited Deployment is repaired (which also shows the new instance works).
    let edit = Patch::Merge(
        json!({"spec": {"replicas": 5, "template": {"spec": {"containers": [
        {"name": "web", "image": "httpd:2.4"}]}}}}),
    );
    deployments
        .patch("blog", &PatchParams::default(), &edit)
        .await
        .unwrap();
    eventually("the Deployment repaired", PATIENCE, || async {
        let shape = deployment_shape(&deployments).await?;
        (shape == ("nginx:1.27".to_owned(), 2)).then_some(())
    })
    .await;
    assert_eq!(
        registered(&cms, "blog").await.as_deref(),
        Some("nginx:1.27")
    );
    let finalizers = sites.get("blog").await.unwrap().metadata.finalizers;
    assert_eq!(finalizers, Some(vec![FINALIZER.to_owned()]));

    // A deleted Service comes back.
    services
        .delete("blog", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Service re-created", PATIENCE, || async {
        services.get_opt("blog").await.unwrap()
    })
    .await;

    // Deleting the Website removes its registry entry, then the finalizer, then the object.
    sites
        .delete("blog", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Website gone", PATIENCE, || async {
        sites.get_opt("blog").await.unwrap().is_none().then_some(())
    })
    .await;
    // The entry went before the finalizer did.
    assert_eq!(registered(&cms, "blog").await, None);
    operator.stop().await;
}
