//! Writing objects to the cluster as JSON, by server-side apply: namespaces, ConfigMaps and
//! whatever else a suite or a scenario sets up.

use anyhow::{Context, Result};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Map, Value, json};

/// The field manager every applied object is written under.
pub const FIELD_MANAGER: &str = "tests";

/// Server-side applies `obj` (JSON with `apiVersion`, `kind`, `metadata.name` and, when
/// namespaced, `metadata.namespace`), taking over any field another manager owns.
pub async fn apply(client: &kube::Client, obj: &Value) -> Result<()> {
    let field = |pointer: &str| {
        obj.pointer(pointer)
            .and_then(Value::as_str)
            .with_context(|| format!("no {pointer} in {obj}"))
    };
    let (kind, name) = (field("/kind")?, field("/metadata/name")?);
    let api_version = field("/apiVersion")?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| format!("applying {kind} {name}"))?;
    Ok(())
}

/// `pairs` as a JSON map of strings (labels, ConfigMap data).
fn string_map(pairs: &[(&str, &str)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect()
}

/// A Namespace `name` with `labels`, as JSON.
pub fn namespace_object(name: &str, labels: &[(&str, &str)]) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": string_map(labels)}})
}

/// A ConfigMap `ns/name` holding `data`, as JSON.
pub fn configmap_object(ns: &str, name: &str, data: &[(&str, &str)]) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns}, "data": string_map(data)})
}

/// Create or update a ConfigMap with `data`.
pub async fn put_configmap(client: &kube::Client, ns: &str, name: &str, data: &[(&str, &str)]) {
    apply(client, &configmap_object(ns, name, data))
        .await
        .expect("configmap applied");
}

/// Create a namespace (optionally labelled).
pub async fn namespace(client: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    apply(client, &namespace_object(name, labels))
        .await
        .expect("namespace applied");
}
