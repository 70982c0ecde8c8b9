//! Finalizers: add/remove one with a JSON merge patch guarded by the
//! object's resourceVersion.
//!
//! In a reconcile, [`Request::finalizers`](crate::Request::finalizers) gives the two steps
//! every finalizer needs, on the controller's own client:
//!
//! ```no_run
//! # use ctrlhub_sdk::{Action, ReconcileError, Request};
//! # use k8s_openapi::api::core::v1::ConfigMap;
//! # async fn release_external_state(cm: &ConfigMap) -> Result<(), ReconcileError> { Ok(()) }
//! async fn reconcile(req: Request<ConfigMap>) -> Result<Action, ReconcileError> {
//!     let Some(cm) = &req.object else { return Ok(Action::done()) };
//!     // Deleting, and ours to clean up: clean up, then let the object go.
//!     if req.finalizers().finalize(cm, "example.com/cleanup", || release_external_state(cm)).await? {
//!         return Ok(Action::done());
//!     }
//!     req.finalizers().ensure(cm, "example.com/cleanup").await?;
//!     // ... reconcile the live object ...
//!     Ok(Action::done())
//! }
//! ```
//!
//! [`finalize`] is the same as one flow in the style of `kube::runtime::finalizer`, on an
//! [`Api`] of your own.

use std::fmt::Debug;
use std::future::Future;

use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::{Action, ReconcileError, WriteError};

/// The two finalizer steps of a reconcile, on the controller's client (see the module docs).
/// From [`Request::finalizers`](crate::Request::finalizers), or [`Finalizers::new`] outside a
/// reconcile.
#[derive(Clone, Copy)]
pub struct Finalizers<'a> {
    client: Option<&'a Client>,
}

impl std::fmt::Debug for Finalizers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finalizers")
            .field("client", &self.client.map(|_| "kube::Client"))
            .finish()
    }
}

impl<'a> Finalizers<'a> {
    /// Finalizer steps writing with `client`.
    pub fn new(client: &'a Client) -> Self {
        Self {
            client: Some(client),
        }
    }

    pub(crate) fn without_client() -> Self {
        Self { client: None }
    }

    /// Adds finalizer `name` to `obj` unless it holds it already, with a merge patch guarded by
    /// `obj`'s resourceVersion (a Conflict when the object changed since it was read: the
    /// reconcile is retried with the newer object). Returns whether it patched. An object being
    /// deleted is left alone (`false`): the API server refuses new finalizers on it.
    pub async fn ensure<K>(&self, obj: &K, name: &str) -> Result<bool, WriteError>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
        K::Scope: 'static,
    {
        let patch = match step(obj, name) {
            Step::Add => add_patch(obj, name),
            Step::Apply | Step::Cleanup | Step::None => None,
        };
        let Some(patch) = patch else {
            return Ok(false);
        };
        let client = self.client.ok_or(WriteError::NoClient)?;
        patch_finalizers(client, obj, &patch).await?;
        Ok(true)
    }

    /// When `obj` is being deleted and holds finalizer `name`: runs `cleanup`, then removes the
    /// finalizer with a merge patch guarded by `obj`'s resourceVersion, and returns `true`.
    /// Otherwise does nothing and returns `false`. A failed `cleanup` keeps the finalizer and
    /// fails the reconcile (retried), so `cleanup` must be idempotent. Blocking work in
    /// `cleanup` goes through [`blocking`](crate::blocking) like any other.
    pub async fn finalize<K, F, Fut, E>(
        &self,
        obj: &K,
        name: &str,
        cleanup: F,
    ) -> Result<bool, ReconcileError>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
        K::Scope: 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Into<ReconcileError>,
    {
        let patch = match step(obj, name) {
            Step::Cleanup => remove_patch(obj, name),
            Step::Add | Step::Apply | Step::None => None,
        };
        let Some(patch) = patch else {
            return Ok(false);
        };
        let client = self.client.ok_or(WriteError::NoClient)?;
        cleanup().await.map_err(Into::into)?;
        match patch_finalizers(client, obj, &patch).await {
            // Removing the last finalizer lets the API server delete the object.
            Err(err) if crate::is_not_found(&err) => Ok(true),
            Err(err) => Err(err.into()),
            Ok(()) => Ok(true),
        }
    }
}

/// Sends `patch` (from [`add_patch`] or [`remove_patch`]) for `obj`.
async fn patch_finalizers<K>(
    client: &Client,
    obj: &K,
    patch: &serde_json::Value,
) -> Result<(), WriteError>
where
    K: Resource<DynamicType = ()>,
    K::Scope: 'static,
{
    let (api, name) = crate::write::api_of(client, obj)?;
    let plural = K::plural(&());
    let namespace = obj.meta().namespace.clone().unwrap_or_default();
    let (params, patch) = (PatchParams::default(), Patch::Merge(patch));
    let call = api.patch(&name, &params, &patch);
    crate::traces::k8s_call("PATCH", &plural, &namespace, &name, call).await?;
    Ok(())
}

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

/// Whether `obj` is being deleted (`metadata.deletionTimestamp` set): it waits for its
/// finalizers, and the API server takes no new ones.
pub fn is_deleting<K: Resource>(obj: &K) -> bool {
    obj.meta().deletion_timestamp.is_some()
}

/// What the finalizer flow does with an object (the same four steps in every ctrlhub SDK):
/// [`Finalizers::ensure`] patches only on [`Add`](Step::Add), [`Finalizers::finalize`] runs the
/// cleanup only on [`Cleanup`](Step::Cleanup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Live, without the finalizer: add it, then reconcile.
    Add,
    /// Live, with it: reconcile.
    Apply,
    /// Being deleted, with it: clean up, then remove it.
    Cleanup,
    /// Being deleted without it: nothing to do.
    None,
}

/// The [`Step`] for `obj` and finalizer `name`.
pub fn step<K: Resource>(obj: &K, name: &str) -> Step {
    match (is_deleting(obj), has_finalizer(obj, name)) {
        (false, false) => Step::Add,
        (false, true) => Step::Apply,
        (true, true) => Step::Cleanup,
        (true, false) => Step::None,
    }
}

/// The merge patch setting `finalizers`, guarded by `resource_version`
/// (the API server answers 409 Conflict if the object changed since); an
/// absent or empty resourceVersion adds no precondition.
pub fn finalizers_patch(
    finalizers: &[String],
    resource_version: Option<&str>,
) -> serde_json::Value {
    let mut metadata = json!({ "finalizers": finalizers });
    if let Some(rv) = resource_version.filter(|rv| !rv.is_empty()) {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({ "metadata": metadata })
}

/// The merge patch adding `name` after `obj`'s other finalizers, or `None` when it is there.
pub fn add_patch<K: Resource>(obj: &K, name: &str) -> Option<serde_json::Value> {
    if has_finalizer(obj, name) {
        return None;
    }
    let mut finalizers = obj.meta().finalizers.clone().unwrap_or_default();
    finalizers.push(name.to_owned());
    Some(finalizers_patch(
        &finalizers,
        obj.meta().resource_version.as_deref(),
    ))
}

/// The merge patch removing `name` from `obj`'s finalizers (the others kept in order), or
/// `None` when it is absent.
pub fn remove_patch<K: Resource>(obj: &K, name: &str) -> Option<serde_json::Value> {
    if !has_finalizer(obj, name) {
        return None;
    }
    let rest: Vec<String> = (obj.meta().finalizers.iter().flatten())
        .filter(|f| *f != name)
        .cloned()
        .collect();
    Some(finalizers_patch(
        &rest,
        obj.meta().resource_version.as_deref(),
    ))
}

/// Adds finalizer `name` to `obj` unless present; returns the object as
/// stored afterwards.
pub async fn ensure_finalizer<K>(api: &Api<K>, obj: &K, name: &str) -> Result<K, WriteError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let Some(patch) = add_patch(obj, name) else {
        return Ok(obj.clone());
    };
    let obj_name = name_of(api, obj)?;
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let call = api.patch(&obj_name, &params, &patch);
    Ok(traced_patch(api, obj, &obj_name, call).await?)
}

/// Removes finalizer `name` from `obj` if present; returns the object as
/// stored afterwards, or `None` if it is gone (removing the last finalizer
/// of a deleted object lets the API server delete it).
pub async fn remove_finalizer<K>(api: &Api<K>, obj: &K, name: &str) -> Result<Option<K>, WriteError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let Some(patch) = remove_patch(obj, name) else {
        return Ok(Some(obj.clone()));
    };
    let obj_name = name_of(api, obj)?;
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let call = api.patch(&obj_name, &params, &patch);
    match traced_patch(api, obj, &obj_name, call).await {
        Ok(obj) => Ok(Some(obj)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// `obj`'s name, or the error naming what lacks it.
fn name_of<K: Resource>(api: &Api<K>, obj: &K) -> Result<String, WriteError> {
    obj.meta()
        .name
        .clone()
        .ok_or_else(|| WriteError::MissingName {
            kind: api
                .resource_url()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned(),
        })
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
    match step(&obj, name) {
        Step::Apply => reconcile(FinalizerEvent::Apply(obj)).await,
        Step::Add => {
            let obj = ensure_finalizer(api, &obj, name).await?;
            reconcile(FinalizerEvent::Apply(obj)).await
        }
        Step::Cleanup => {
            let action = reconcile(FinalizerEvent::Cleanup(obj.clone())).await?;
            remove_finalizer(api, &obj, name).await?;
            Ok(action)
        }
        Step::None => Ok(Action::done()),
    }
}

// The pure helpers' semantics are cases of tests/conformance/helpers.json, run by
// `crate::shared_cases`.
