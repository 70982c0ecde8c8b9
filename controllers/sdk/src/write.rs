//! Writes to the Kubernetes API with the controller's own client: [`adopt`] a child,
//! server-side [`apply`] an object, [`patch_status`], and tell a NotFound ([`is_not_found`]) or
//! a Conflict ([`is_conflict`]) from any other failure.
//!
//! Inside a reconcile, use the same helpers through the request, which knows the controller's
//! client and name ([`Request::adopt`](crate::Request::adopt),
//! [`Request::apply`](crate::Request::apply),
//! [`Request::patch_status`](crate::Request::patch_status)); the functions here take them
//! explicitly, for code outside a reconcile.
//!
//! They work for built-in kinds (`k8s-openapi`) and custom resources (`#[derive(CustomResource)]`)
//! alike: any type whose kind is known at compile time (`Resource<DynamicType = ()>`).

use std::any::TypeId;
use std::error::Error as StdError;

use k8s_openapi::ClusterResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

/// A write helper could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The controller has no Kubernetes client: give it one with
    /// [`Controller::client`](crate::Controller::client).
    #[error(
        "the controller has no Kubernetes client for writes: give it one with \
         Controller::client(kube::Client)"
    )]
    NoClient,
    /// The object has no `metadata.name`.
    #[error("{kind} has no metadata.name")]
    MissingName {
        /// The object's kind.
        kind: String,
    },
    /// A namespaced object has no `metadata.namespace`.
    #[error("{kind} {name} has no metadata.namespace")]
    MissingNamespace {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
    },
    /// The owner has no uid: it was never stored by the API server.
    #[error("owner {kind} {name} has no metadata.uid (read it back from the API server first)")]
    OwnerWithoutUid {
        /// The owner's kind.
        kind: String,
        /// The owner's name.
        name: String,
    },
    /// Owner references never cross namespaces: the API server's garbage collector would treat
    /// the owner as absent and delete the child.
    #[error(
        "owner {owner} is in namespace {owner_namespace:?} but the child is in \
         {child_namespace:?}: an owner must be in the child's namespace (or cluster-scoped)"
    )]
    OwnerInAnotherNamespace {
        /// `kind/name` of the owner.
        owner: String,
        /// The owner's namespace.
        owner_namespace: String,
        /// The child's namespace.
        child_namespace: String,
    },
    /// A cluster-scoped object cannot be owned by a namespaced one.
    #[error(
        "owner {owner} is namespaced but the child kind {child_kind} is cluster-scoped: a \
         cluster-scoped object can only have cluster-scoped owners"
    )]
    ClusterScopedChild {
        /// `kind/name` of the owner.
        owner: String,
        /// The child's kind.
        child_kind: String,
    },
    /// The object does not (de)serialize.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The API server refused the write, or could not be reached.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

impl WriteError {
    /// The Kubernetes API's HTTP status for a refused write (404, 409, ...).
    pub fn api_status(&self) -> Option<u16> {
        api_status(self)
    }
}

/// Whether `err` is, or was caused by, a Kubernetes API NotFound (HTTP 404): for a
/// [`kube::Error`], a [`WriteError`], a [`ReconcileError`](crate::ReconcileError) converted from
/// one of those, a [`kube::core::Status`], or any error whose `source()` chain holds one (so
/// `anyhow::Error` works through `err.as_ref()`).
///
/// ```
/// # fn f(err: kube::Error) {
/// if ctrlhub_sdk::is_not_found(&err) {
///     // gone: nothing to do
/// }
/// # }
/// ```
pub fn is_not_found(err: &(dyn StdError + 'static)) -> bool {
    api_status(err) == Some(404)
}

/// Whether `err` is, or was caused by, a Kubernetes API Conflict (HTTP 409: a stale
/// resourceVersion, or an apply conflict). Takes the same errors as [`is_not_found`].
pub fn is_conflict(err: &(dyn StdError + 'static)) -> bool {
    api_status(err) == Some(409)
}

/// The HTTP status of the first Kubernetes API error in `err`'s chain.
pub(crate) fn api_status(err: &(dyn StdError + 'static)) -> Option<u16> {
    let mut next: Option<&(dyn StdError + 'static)> = Some(err);
    // Bounded: an error chain is short, and a cycle must not hang a reconcile.
    for _ in 0..32 {
        let e = next?;
        if let Some(kube::Error::Api(status)) = e.downcast_ref::<kube::Error>() {
            return Some(status.code);
        }
        if let Some(status) = e.downcast_ref::<kube::core::Status>() {
            return Some(status.code);
        }
        // Transparent wrappers skip themselves in `source()`: look inside them.
        if let Some(WriteError::Kube(inner)) = e.downcast_ref::<WriteError>() {
            next = Some(inner);
            continue;
        }
        if let Some(inner) = e
            .downcast_ref::<crate::ReconcileError>()
            .and_then(crate::ReconcileError::cause)
        {
            next = Some(inner);
            continue;
        }
        next = e.source();
    }
    None
}

/// The owner's `kind/name`, for messages.
fn describe<O: Resource<DynamicType = ()>>(owner: &O) -> String {
    format!(
        "{}/{}",
        O::kind(&()),
        owner.meta().name.as_deref().unwrap_or("<unnamed>")
    )
}

/// Whether `K` is a cluster-scoped kind (known for typed kinds only).
fn cluster_scoped<K>() -> bool
where
    K: Resource,
    K::Scope: 'static,
{
    TypeId::of::<K::Scope>() == TypeId::of::<ClusterResourceScope>()
}

/// Makes `owner` the controller of `child` (kopf's `adopt`): an owner reference with
/// `controller: true` and `blockOwnerDeletion: true` (apiVersion, kind, name and uid from the
/// owner), replacing any earlier reference to the same owner and any other controller
/// reference (an object has at most one controller). A child without a namespace gets the
/// owner's.
///
/// Refused with a [`WriteError`]: an owner in another namespace than the child, a namespaced
/// owner of a cluster-scoped child, an owner without a name or uid. Returns `child`, so that
/// `apply(client, manager, adopt(&mut child, &owner)?)` reads in one line.
pub fn adopt<'c, C, O>(child: &'c mut C, owner: &O) -> Result<&'c mut C, WriteError>
where
    C: Resource<DynamicType = ()>,
    C::Scope: 'static,
    O: Resource<DynamicType = ()>,
{
    let owner_meta = owner.meta();
    let name = owner_meta
        .name
        .clone()
        .ok_or_else(|| WriteError::MissingName {
            kind: O::kind(&()).into_owned(),
        })?;
    let uid = owner_meta
        .uid
        .clone()
        .ok_or_else(|| WriteError::OwnerWithoutUid {
            kind: O::kind(&()).into_owned(),
            name: name.clone(),
        })?;
    if let Some(owner_ns) = owner_meta.namespace.as_deref().filter(|n| !n.is_empty()) {
        if cluster_scoped::<C>() {
            return Err(WriteError::ClusterScopedChild {
                owner: describe(owner),
                child_kind: C::kind(&()).into_owned(),
            });
        }
        let child_ns = child.meta_mut().namespace.get_or_insert_with(String::new);
        if child_ns.is_empty() {
            owner_ns.clone_into(child_ns);
        } else if child_ns != owner_ns {
            return Err(WriteError::OwnerInAnotherNamespace {
                owner: describe(owner),
                owner_namespace: owner_ns.to_owned(),
                child_namespace: child_ns.clone(),
            });
        }
    }
    let reference = OwnerReference {
        api_version: O::api_version(&()).into_owned(),
        kind: O::kind(&()).into_owned(),
        name,
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let refs = child
        .meta_mut()
        .owner_references
        .get_or_insert_with(Vec::new);
    refs.retain(|r| r.uid != reference.uid && r.controller != Some(true));
    refs.push(reference);
    Ok(child)
}

/// The dynamic API of `obj`'s kind, in its namespace for a namespaced kind.
pub(crate) fn api_of<K>(
    client: &Client,
    obj: &K,
) -> Result<(Api<DynamicObject>, String), WriteError>
where
    K: Resource<DynamicType = ()>,
    K::Scope: 'static,
{
    let kind = K::kind(&()).into_owned();
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or_else(|| WriteError::MissingName { kind: kind.clone() })?;
    let resource = ApiResource::erase::<K>(&());
    let api = if cluster_scoped::<K>() {
        Api::all_with(client.clone(), &resource)
    } else {
        let namespace = obj
            .meta()
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| WriteError::MissingNamespace {
                kind,
                name: name.clone(),
            })?;
        Api::namespaced_with(client.clone(), namespace, &resource)
    };
    Ok((api, name))
}

/// Converts the server's answer back into `K`.
fn typed<K: DeserializeOwned>(obj: DynamicObject) -> Result<K, WriteError> {
    Ok(serde_json::from_value(serde_json::to_value(obj)?)?)
}

/// Server-side applies `obj` (`PATCH` with `application/apply-patch+yaml`) as field manager
/// `field_manager`, forcing conflicts, and returns the object as the server stored it.
///
/// Send the whole object as this controller wants it, with only the fields it cares about:
/// server-side apply makes the field manager own exactly those, and removes fields it set
/// before but no longer sends. `apiVersion` and `kind` are filled in;
/// `metadata.resourceVersion` and `managedFields` are never sent.
pub async fn apply<K>(client: &Client, field_manager: &str, obj: &K) -> Result<K, WriteError>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    K::Scope: 'static,
{
    let (api, name) = api_of(client, obj)?;
    let mut body = serde_json::to_value(obj)?;
    body["apiVersion"] = json!(K::api_version(&()));
    body["kind"] = json!(K::kind(&()));
    if let Some(meta) = body.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        // A resourceVersion would turn the apply into a precondition; managedFields are
        // refused.
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    let params = PatchParams::apply(field_manager).force();
    let plural = K::plural(&());
    let namespace = obj.meta().namespace.clone().unwrap_or_default();
    let patch = Patch::Apply(&body);
    let call = api.patch(&name, &params, &patch);
    let stored = crate::traces::k8s_call("PATCH", &plural, &namespace, &name, call).await?;
    typed(stored)
}

/// Merge-patches the `status` subresource of `obj` with `{"status": status}` and returns the
/// updated object. Works for custom resources (with a status subresource) and built-ins.
/// Fields of `status` that serialize as `null` are removed.
pub async fn patch_status<K, S>(client: &Client, obj: &K, status: &S) -> Result<K, WriteError>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
    K::Scope: 'static,
    S: Serialize + ?Sized,
{
    let (api, name) = api_of(client, obj)?;
    let patch = json!({ "status": status });
    let plural = format!("{}/status", K::plural(&()));
    let namespace = obj.meta().namespace.clone().unwrap_or_default();
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let call = api.patch_status(&name, &params, &patch);
    let stored = crate::traces::k8s_call("PATCH", &plural, &namespace, &name, call).await?;
    typed(stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use k8s_openapi::api::rbac::v1::ClusterRole;
    use kube::api::ObjectMeta;

    fn owner(namespace: Option<&str>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("o".into()),
                namespace: namespace.map(Into::into),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn adopt_sets_one_controller_reference_and_the_namespace() -> Result<(), WriteError> {
        let mut child = Deployment::default();
        child.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Secret".into(),
            name: "other".into(),
            uid: "u-2".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        adopt(&mut child, &owner(Some("ns")))?;
        adopt(&mut child, &owner(Some("ns")))?;
        assert_eq!(child.metadata.namespace.as_deref(), Some("ns"));
        let refs = child.metadata.owner_references.unwrap_or_default();
        assert_eq!(refs.len(), 1);
        let r = &refs[0];
        assert_eq!(
            (r.api_version.as_str(), r.kind.as_str(), r.name.as_str()),
            ("v1", "ConfigMap", "o")
        );
        assert_eq!(r.uid, "u-1");
        assert_eq!(
            (r.controller, r.block_owner_deletion),
            (Some(true), Some(true))
        );
        Ok(())
    }

    #[test]
    fn adopt_refuses_what_the_garbage_collector_would_not_honour() {
        let mut elsewhere = Deployment::default();
        elsewhere.metadata.namespace = Some("b".into());
        assert!(matches!(
            adopt(&mut elsewhere, &owner(Some("a"))),
            Err(WriteError::OwnerInAnotherNamespace { ref owner_namespace, ref child_namespace, .. })
                if owner_namespace == "a" && child_namespace == "b"
        ));
        let mut role = ClusterRole::default();
        assert!(matches!(
            adopt(&mut role, &owner(Some("a"))),
            Err(WriteError::ClusterScopedChild { ref child_kind, .. }) if child_kind == "ClusterRole"
        ));
        let mut child = Deployment::default();
        assert!(matches!(
            adopt(&mut child, &ConfigMap::default()),
            Err(WriteError::MissingName { .. })
        ));
        let mut unsaved = owner(Some("a"));
        unsaved.metadata.uid = None;
        assert!(matches!(
            adopt(&mut child, &unsaved),
            Err(WriteError::OwnerWithoutUid { .. })
        ));
        assert!(child.metadata.owner_references.is_none());
    }

    #[test]
    fn a_cluster_scoped_owner_may_own_anything() -> Result<(), WriteError> {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some("team".into()),
                uid: Some("u-ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut role = ClusterRole::default();
        adopt(&mut role, &ns)?;
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some("team".into());
        adopt(&mut cm, &ns)?;
        assert_eq!(cm.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(role.metadata.namespace, None);
        Ok(())
    }

    fn api_error(code: u16) -> kube::Error {
        let mut status = kube::core::Status::failure("boom", "Reason");
        status.code = code;
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn not_found_and_conflict_whatever_the_wrapper() {
        let not_found = api_error(404);
        assert!(is_not_found(&not_found));
        assert!(!is_conflict(&not_found));
        assert!(is_conflict(&api_error(409)));
        assert!(is_not_found(&WriteError::Kube(api_error(404))));
        assert!(is_not_found(&crate::ReconcileError::from(api_error(404))));
        assert!(is_conflict(&crate::ReconcileError::from(WriteError::Kube(
            api_error(409)
        ))));
        assert!(!is_not_found(&WriteError::NoClient));
        assert!(!is_not_found(&crate::ReconcileError::retry("no code")));
        // Any error whose source chain holds one.
        #[derive(Debug, thiserror::Error)]
        #[error("wrapped")]
        struct Wrapped(#[source] kube::Error);
        assert!(is_not_found(&Wrapped(api_error(404))));
        let boxed: Box<dyn StdError + Send + Sync> = Box::new(api_error(409));
        assert!(is_conflict(boxed.as_ref()));
    }

    #[test]
    fn the_scope_of_a_typed_kind_is_known() {
        assert!(cluster_scoped::<ClusterRole>());
        assert!(cluster_scoped::<Namespace>());
        assert!(!cluster_scoped::<ConfigMap>());
    }
}
