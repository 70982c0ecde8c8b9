//! Defaulting on create, as kube-apiserver's strategies do it: Namespaces get the `kubernetes`
//! finalizer, `Active` phase and name label; Deployments, ReplicaSets and StatefulSets one
//! replica; Jobs their generated selector and labels; CRDs their accepted names and conditions.

use crate::catalog::resources::{ResourceInfo, infos_from_crd};
use crate::meta;
use crate::status::ApiError;
use serde_json::{Value, json};

/// Fills in what kube-apiserver defaults on a new object of `info`'s kind.
pub(crate) fn on_create(info: &ResourceInfo, obj: &mut Value, now: &str) -> Result<(), ApiError> {
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "namespaces") => {
            meta::set_path(obj, "spec.finalizers", json!(["kubernetes"]));
            meta::set_path(obj, "status.phase", json!("Active"));
            let name = meta::name(obj).to_string();
            let labels = meta::metadata_mut(obj)
                .entry("labels")
                .or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
        }
        ("apps", "deployments" | "replicasets" | "statefulsets")
            if meta::get_path(obj, "spec.replicas").is_none() =>
        {
            meta::set_path(obj, "spec.replicas", json!(1));
        }
        ("batch", "jobs") => super::validation::default_job(obj),
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            let infos = infos_from_crd(obj).map_err(|m| {
                ApiError::invalid_field(
                    &info.kind,
                    &info.group,
                    meta::name(obj),
                    "spec",
                    "FieldValueInvalid",
                    &m,
                )
            })?;
            let _ = infos;
            let names = obj
                .pointer("/spec/names")
                .cloned()
                .unwrap_or_else(|| json!({}));
            let mut accepted = names.clone();
            if accepted.get("singular").is_none()
                && let Some(kind) = names.get("kind").and_then(Value::as_str)
            {
                accepted["singular"] = json!(kind.to_lowercase());
            }
            if accepted.get("listKind").is_none()
                && let Some(kind) = names.get("kind").and_then(Value::as_str)
            {
                accepted["listKind"] = json!(format!("{kind}List"));
            }
            let stored: Vec<Value> = obj
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .map(|vs| {
                    vs.iter()
                        .filter(|v| v.get("storage").and_then(Value::as_bool).unwrap_or(false))
                        .filter_map(|v| v.get("name").cloned())
                        .collect()
                })
                .unwrap_or_default();
            obj["status"] = json!({
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
                ],
                "acceptedNames": accepted,
                "storedVersions": stored,
            });
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                spec.entry("conversion")
                    .or_insert_with(|| json!({"strategy": "None"}));
            }
        }
        _ => {}
    }
    Ok(())
}
