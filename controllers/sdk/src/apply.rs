//! Server-side apply of owned children.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ObjectError;

/// Sets `owner` as the controller owner of `child` (`controller: true`,
/// `blockOwnerDeletion: true`), replacing any previous reference to the same
/// owner and dropping other controller references (an object has at most
/// one controller). Fails when the owner has no name or uid yet.
pub fn set_controller_owner<O, C>(owner: &O, child: &mut C) -> Result<(), ObjectError>
where
    O: Resource<DynamicType = ()>,
    C: Resource,
{
    let oref = OwnerReference {
        controller: Some(true),
        block_owner_deletion: Some(true),
        ..owner.owner_ref(&()).ok_or(ObjectError::MissingUid)?
    };
    let refs = child
        .meta_mut()
        .owner_references
        .get_or_insert_with(Vec::new);
    refs.retain(|r: &OwnerReference| r.uid != oref.uid && r.controller != Some(true));
    refs.push(oref);
    Ok(())
}

/// Server-side applies `child` (with field manager `field_manager`, forcing
/// conflicts) as a controlled child of `owner`. The child's namespace
/// defaults to the owner's. Returns the object as stored.
///
/// Build `child` with only the fields you care about: server-side apply
/// makes this controller own exactly those, and prunes fields it set before
/// but no longer sends.
pub async fn apply_owned<O, C>(
    client: &Client,
    owner: &O,
    mut child: C,
    field_manager: &str,
) -> Result<C, ObjectError>
where
    O: Resource<DynamicType = ()>,
    C: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug,
{
    set_controller_owner(owner, &mut child)?;
    if child.meta().namespace.is_none() {
        child.meta_mut().namespace = owner.meta().namespace.clone();
    }
    let name = child.meta().name.clone().ok_or(ObjectError::MissingName)?;
    let namespace = child
        .meta()
        .namespace
        .clone()
        .ok_or(ObjectError::MissingNamespace)?;
    // Server-side apply refuses managedFields and a resourceVersion would
    // turn the apply into a precondition: send neither.
    child.meta_mut().managed_fields = None;
    child.meta_mut().resource_version = None;
    let api: Api<C> = Api::namespaced(client.clone(), &namespace);
    let plural = C::plural(&()).into_owned();
    let (params, patch) = (
        PatchParams::apply(field_manager).force(),
        Patch::Apply(&child),
    );
    let call = api.patch(&name, &params, &patch);
    Ok(crate::traces::k8s_call("PATCH", &plural, &namespace, &name, call).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    #[test]
    fn owner_reference_is_controller() -> Result<(), ObjectError> {
        let owner = ConfigMap {
            metadata: ObjectMeta {
                name: Some("o".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut child = Deployment::default();
        child.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Secret".into(),
            name: "other".into(),
            uid: "u-2".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        set_controller_owner(&owner, &mut child)?;
        set_controller_owner(&owner, &mut child)?;
        let refs = child.metadata.owner_references.unwrap_or_default();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].uid, "u-1");
        assert_eq!(refs[0].kind, "ConfigMap");
        assert_eq!(refs[0].controller, Some(true));
        assert_eq!(refs[0].block_owner_deletion, Some(true));
        Ok(())
    }

    #[test]
    fn owner_without_uid_is_refused() {
        let owner = ConfigMap::default();
        let mut child = Deployment::default();
        assert!(matches!(
            set_controller_owner(&owner, &mut child),
            Err(ObjectError::MissingUid)
        ));
    }
}
