//! The `Widget` test custom resource of the conformance suites, and resourceVersion helpers.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wait::{PATIENCE, wait_until};

/// Spec of the [`Widget`] test custom resource.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "conformance.ctrlhub.dev",
    version = "v1",
    kind = "Widget",
    plural = "widgets",
    namespaced,
    status = "WidgetStatus",
    shortname = "wdg",
    doc = "A namespaced test custom resource with a status subresource."
)]
pub struct WidgetSpec {
    /// Desired size.
    pub size: i32,
    /// Optional colour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
}

/// Status of the [`Widget`] test custom resource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WidgetStatus {
    /// Set by a controller once it has seen the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// The spec size the controller last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_size: Option<i32>,
}

/// Creates the [`Widget`] CRD through kube-rs and waits until the resource is served.
pub async fn install_widget_crd(client: &kube::Client) -> CustomResourceDefinition {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .create(&PostParams::default(), &Widget::crd())
        .await
        .expect("create Widget CRD");
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    wait_until("Widget CRD to be served", PATIENCE, || async {
        widgets
            .list(&Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    crd
}

/// A new [`Widget`] named `name` with the given size.
pub fn widget(name: &str, size: i32) -> Widget {
    let mut w = Widget::new(name, WidgetSpec { size, color: None });
    w.metadata.namespace = Some("default".into());
    w
}

/// `metadata.resourceVersion` of a JSON object, panicking when absent.
pub fn rv_of(obj: &Value) -> String {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no metadata.resourceVersion in {obj}"))
        .to_string()
}

/// Parses a resourceVersion as an integer (devcluster, like etcd, uses a global counter).
pub fn rv_num(rv: &str) -> u64 {
    rv.parse()
        .unwrap_or_else(|_| panic!("resourceVersion {rv:?} is not numeric"))
}
