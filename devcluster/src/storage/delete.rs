//! Deletes: preconditions, propagation (orphan, background, foreground), finalizers and the
//! deletion timestamp, namespaces that terminate, and removal for good.

use super::store::{EventType, Location, State};
use crate::catalog::resources::{GroupResource, ResourceInfo};
use crate::meta;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;

/// How a delete propagates to dependents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Propagation {
    /// Remove the owner reference from dependents.
    Orphan,
    /// Delete the owner now, dependents afterwards.
    Background,
    /// Delete dependents first; the owner waits with the `foregroundDeletion` finalizer.
    Foreground,
}

/// Options of a delete request.
#[derive(Debug, Clone)]
pub(crate) struct DeleteOptions {
    /// Propagation policy; None = the kind's default (background).
    pub(crate) propagation: Option<Propagation>,
    /// `preconditions.uid`.
    pub(crate) uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub(crate) resource_version: Option<String>,
    /// `dryRun=All`.
    pub(crate) dry_run: bool,
}

/// The outcome of a delete.
#[derive(Debug)]
pub(crate) enum Deleted {
    /// The object is gone; this was its last state.
    Gone(Arc<Value>),
    /// Deletion is pending on finalizers; this is the object now.
    Pending(Arc<Value>),
}

/// One delete of one object: which, and how.
pub(crate) struct Delete<'a> {
    /// The resource version the request addressed.
    pub(crate) info: &'a ResourceInfo,
    /// The object's namespace (empty for cluster-scoped resources).
    pub(crate) namespace: &'a str,
    /// The object's name.
    pub(crate) name: &'a str,
    /// Preconditions, propagation and dry run.
    pub(crate) options: &'a DeleteOptions,
}

impl State {
    /// Remove an object for good and run the cascade it triggers.
    pub(super) fn remove(
        &mut self,
        gr: &GroupResource,
        last: Value,
        old: Arc<Value>,
    ) -> Arc<Value> {
        let uid = meta::uid(&last).to_string();
        let ns = meta::namespace(&last).to_string();
        let owners = meta::owner_uids(&last);
        let is_crd =
            gr.group == "apiextensions.k8s.io" && gr.resource == "customresourcedefinitions";
        let name = meta::name(&last).to_string();
        let gone = self.commit(gr, EventType::Deleted, last, Some(old));
        if is_crd {
            self.drop_crd_objects(&name);
        }
        // A namespace's content was removed before the namespace could go: nothing more for it.
        self.after_removal(uid, owners, ns);
        gone
    }

    fn drop_crd_objects(&mut self, crd_name: &str) {
        let grs: BTreeSet<GroupResource> = self
            .registry
            .all()
            .filter(|i| i.crd.as_deref() == Some(crd_name))
            .map(ResourceInfo::group_resource)
            .collect();
        for gr in grs {
            let objs: Vec<Arc<Value>> = self
                .collections
                .get(&gr)
                .map(|c| c.values().cloned().collect())
                .unwrap_or_default();
            for obj in objs {
                self.commit(&gr, EventType::Deleted, (*obj).clone(), Some(obj));
            }
            self.collections.remove(&gr);
        }
        self.registry.remove_crd(crd_name);
    }

    /// Delete one object (DELETE).
    pub(crate) fn delete(&mut self, d: &Delete) -> Result<Deleted, ApiError> {
        let (info, ns, name, opts) = (d.info, d.namespace, d.name, d.options);
        let old = self.require(info, ns, name)?;
        if let Some(uid) = &opts.uid
            && uid != meta::uid(&old)
        {
            return Err(ApiError::conflict(
                &info.group,
                &info.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta::uid(&old)
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && rv != meta::resource_version(&old)
        {
            return Err(ApiError::conflict(
                &info.group,
                &info.plural,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta::resource_version(&old)
                ),
            ));
        }
        if opts.dry_run {
            return Ok(Deleted::Pending(old));
        }
        Ok(self.delete_object(
            &info.group_resource(),
            old,
            opts.propagation.unwrap_or(Propagation::Background),
        ))
    }

    pub(super) fn delete_object(
        &mut self,
        gr: &GroupResource,
        old: Arc<Value>,
        policy: Propagation,
    ) -> Deleted {
        let is_ns = gr.group.is_empty() && gr.resource == "namespaces";
        let uid = meta::uid(&old).to_string();
        if policy == Propagation::Orphan {
            self.orphan_dependents(&uid);
        }
        let mut finalizers = meta::finalizers(&old);
        if policy == Propagation::Foreground
            && !finalizers.iter().any(|f| f == "foregroundDeletion")
        {
            finalizers.push("foregroundDeletion".into());
        }
        if finalizers.is_empty() && !is_ns {
            let last = (*old).clone();
            return Deleted::Gone(self.remove(gr, last, old));
        }
        if meta::is_deleting(&old) && finalizers.len() == meta::finalizers(&old).len() {
            return Deleted::Pending(old);
        }
        let mut new = (*old).clone();
        if !meta::is_deleting(&old) {
            meta::set(
                &mut new,
                "deletionTimestamp",
                Some(json!(self.clock.timestamp())),
            );
            meta::set(&mut new, "deletionGracePeriodSeconds", Some(json!(0)));
            if new.pointer("/metadata/generation").is_some() {
                let g = new
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                meta::set(&mut new, "generation", Some(json!(g + 1)));
            }
        }
        if !finalizers.is_empty() {
            meta::set(&mut new, "finalizers", Some(json!(finalizers)));
        }
        if is_ns {
            meta::set_path(&mut new, "status.phase", json!("Terminating"));
        }
        let pending = self.commit(gr, EventType::Modified, new, Some(old));
        let foreground = (policy == Propagation::Foreground).then_some(uid);
        let namespace = is_ns.then(|| meta::name(&pending).to_string());
        self.after_deletion_started(foreground, namespace);
        // The cascade may already have removed it.
        match self.get(gr, meta::namespace(&pending), meta::name(&pending)) {
            Some(now) => Deleted::Pending(now),
            None => Deleted::Gone(pending),
        }
    }

    fn orphan_dependents(&mut self, owner_uid: &str) {
        let deps: Vec<Location> = self
            .by_owner
            .get(owner_uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for (gr, ns, name) in deps {
            if let Some(dep) = self.get(&gr, &ns, &name) {
                let mut new = (*dep).clone();
                if let Some(refs) = new
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid));
                }
                self.commit(&gr, EventType::Modified, new, Some(dep));
            }
        }
    }

    /// Delete every object of a collection that matches the selectors (DELETE on a collection).
    pub(crate) fn delete_collection(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        opts: &DeleteOptions,
    ) -> Result<Vec<Arc<Value>>, ApiError> {
        let listed = self.list(info, ns, labels, fields, None, None)?;
        let mut out = Vec::new();
        for obj in listed.items {
            if opts.dry_run {
                out.push(obj);
                continue;
            }
            match self.delete_object(
                &info.group_resource(),
                obj,
                opts.propagation.unwrap_or(Propagation::Background),
            ) {
                Deleted::Gone(o) | Deleted::Pending(o) => out.push(o),
            }
        }
        Ok(out)
    }
}
