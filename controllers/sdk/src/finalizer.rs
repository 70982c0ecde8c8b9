//! Finalizers: add/remove one with a JSON merge patch guarded by the
//! object's resourceVersion, and a [`finalize`] flow like
//! `kube::runtime::finalizer`.

use std::fmt::Debug;
use std::future::Future;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::{Action, ObjectError, ReconcileError};

/// What [`finalize`] asks the reconcile closure to do.
#[derive(Debug)]
pub enum FinalizerEvent<K> {
    /// The object is live (and carries the finalizer): reconcile it.
    Apply(K),
    /// The object is being deleted and still carries the finalizer: clean
    /// up external state. The finalizer is removed when this succeeds.
    Cleanup(K),
}

/// Whether `obj` carries finalizer `name`.
pub fn has_finalizer<K: Resource>(obj: &K, name: &str) -> bool {
    obj.meta()
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == name))
}

/// The merge patch setting `finalizers`, guarded by `resource_version`
/// (the API server answers 409 Conflict if the object changed since).
pub fn finalizers_patch(
    finalizers: &[String],
    resource_version: Option<&str>,
) -> serde_json::Value {
    let mut metadata = json!({ "finalizers": finalizers });
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({ "metadata": metadata })
}

/// Adds finalizer `name` to `obj` unless present; returns the object as
/// stored afterwards.
pub async fn ensure_finalizer<K>(api: &Api<K>, obj: &K, name: &str) -> Result<K, ObjectError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    if has_finalizer(obj, name) {
        return Ok(obj.clone());
    }
    let obj_name = obj.meta().name.clone().ok_or(ObjectError::MissingName)?;
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(name.to_owned());
    let patch = finalizers_patch(&finalizers, obj.meta().resource_version.as_deref());
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let call = api.patch(&obj_name, &params, &patch);
    Ok(traced_patch(api, obj, &obj_name, call).await?)
}

/// Removes finalizer `name` from `obj` if present; returns the object as
/// stored afterwards, or `None` if it is gone (removing the last finalizer
/// of a deleted object lets the API server delete it).
pub async fn remove_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    name: &str,
) -> Result<Option<K>, ObjectError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    if !has_finalizer(obj, name) {
        return Ok(Some(obj.clone()));
    }
    let obj_name = obj.meta().name.clone().ok_or(ObjectError::MissingName)?;
    let finalizers: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != name)
        .cloned()
        .collect();
    let patch = finalizers_patch(&finalizers, obj.meta().resource_version.as_deref());
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let call = api.patch(&obj_name, &params, &patch);
    match traced_patch(api, obj, &obj_name, call).await {
        Ok(obj) => Ok(Some(obj)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// A finalizer patch of `obj` as a child span of the reconcile.
async fn traced_patch<K: Resource, T>(
    api: &Api<K>,
    obj: &K,
    name: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    // The URL's last segment is the plural, whatever the object's dynamic type.
    let plural = api
        .resource_url()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let namespace = obj.meta().namespace.clone().unwrap_or_default();
    crate::traces::k8s_call("PATCH", &plural, &namespace, name, call).await
}

/// Runs `reconcile` under finalizer `name`:
///
/// - live object without the finalizer: add it, then `Apply` the updated
///   object (no extra round trip through the manager);
/// - live object with the finalizer: `Apply`;
/// - deleting object with the finalizer: `Cleanup`, then remove the
///   finalizer; returns the cleanup's action;
/// - deleting object without it: nothing to do (`Action::done()`).
///
/// A conflict while patching (the object changed meanwhile) is a retryable
/// error; `Cleanup` must therefore be idempotent.
pub async fn finalize<K, F, Fut>(
    api: &Api<K>,
    obj: K,
    name: &str,
    reconcile: F,
) -> Result<Action, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    F: FnOnce(FinalizerEvent<K>) -> Fut,
    Fut: Future<Output = Result<Action, ReconcileError>>,
{
    let deleting = obj.meta().deletion_timestamp.is_some();
    match (deleting, has_finalizer(&obj, name)) {
        (false, true) => reconcile(FinalizerEvent::Apply(obj)).await,
        (false, false) => {
            let obj = ensure_finalizer(api, &obj, name).await?;
            reconcile(FinalizerEvent::Apply(obj)).await
        }
        (true, true) => {
            let action = reconcile(FinalizerEvent::Cleanup(obj.clone())).await?;
            remove_finalizer(api, &obj, name).await?;
            Ok(action)
        }
        (true, false) => Ok(Action::done()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    #[test]
    fn patch_carries_precondition() {
        let p = finalizers_patch(&["a/b".into()], Some("42"));
        assert_eq!(
            p,
            json!({"metadata": {"finalizers": ["a/b"], "resourceVersion": "42"}})
        );
        let p = finalizers_patch(&[], None);
        assert_eq!(p, json!({"metadata": {"finalizers": []}}));
    }

    #[test]
    fn detects_finalizer() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                finalizers: Some(vec!["x/y".into()]),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(has_finalizer(&cm, "x/y"));
        assert!(!has_finalizer(&cm, "x/z"));
        assert!(!has_finalizer(&ConfigMap::default(), "x/y"));
    }
}
