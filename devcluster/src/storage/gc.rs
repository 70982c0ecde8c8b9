//! Garbage collection: what a removal or a deletion leaves to do — dependents whose owners are
//! gone, owners waiting on their dependents (foreground deletion), namespaces waiting to be
//! emptied — run to completion inside the same lock so clients observe a consistent cascade.

use super::delete::Propagation;
use super::store::{EventType, Location, State};
use crate::catalog::resources::GroupResource;
use crate::meta;
use serde_json::{Value, json};
use std::sync::Arc;

/// Work left over by a write: garbage collection and namespace termination run to completion
/// inside the same lock so clients observe a consistent cascade.
enum Task {
    /// The object with this uid is gone: its dependents lose the owner reference, or are
    /// deleted when it was their last live owner.
    OwnerGone(String),
    /// The owner with this uid may be waiting in foreground deletion: delete its dependents, and
    /// drop its `foregroundDeletion` finalizer once they are gone.
    Foreground(String),
    /// This namespace may be terminating: delete its content, and remove it once it is empty
    /// and has no finalizers.
    Namespace(String),
}

impl State {
    /// The cascade of an object removed for good: the namespace it was in, if terminating,
    /// first; then the owners that may wait for it in foreground deletion; then its dependents.
    pub(super) fn after_removal(&mut self, uid: String, owners: Vec<String>, namespace: String) {
        let mut tasks = vec![Task::OwnerGone(uid)];
        tasks.extend(owners.into_iter().map(Task::Foreground));
        if !namespace.is_empty() {
            tasks.push(Task::Namespace(namespace));
        }
        self.collect_garbage(tasks);
    }

    /// The cascade of a deletion that started (and waits on finalizers): a terminating
    /// namespace's content first, then a foreground owner's dependents.
    pub(super) fn after_deletion_started(
        &mut self,
        foreground_owner: Option<String>,
        namespace: Option<String>,
    ) {
        let mut tasks = Vec::new();
        tasks.extend(foreground_owner.map(Task::Foreground));
        tasks.extend(namespace.map(Task::Namespace));
        self.collect_garbage(tasks);
    }

    /// Runs the cascade a write left (the garbage collector and namespace controller of a real
    /// cluster, synchronously), last task first.
    fn collect_garbage(&mut self, mut tasks: Vec<Task>) {
        // Bounded by the number of objects: each step removes or finalizes at least one.
        let mut budget = 1_000_000usize;
        while let Some(task) = tasks.pop() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                tracing::error!("garbage collection did not converge");
                return;
            }
            match task {
                Task::OwnerGone(uid) => self.owner_gone(&uid),
                Task::Foreground(owner_uid) => self.finish_foreground(&owner_uid),
                Task::Namespace(ns) => self.terminate_namespace(&ns),
            }
        }
    }

    /// [`Task::OwnerGone`].
    fn owner_gone(&mut self, uid: &str) {
        let deps: Vec<Location> = self
            .by_owner
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for (gr, ns, name) in deps {
            let Some(dep) = self.get(&gr, &ns, &name) else {
                continue;
            };
            let live_owners = meta::owner_uids(&dep)
                .into_iter()
                .filter(|o| o != uid && self.by_uid.contains_key(o))
                .count();
            if live_owners > 0 {
                let mut new = (*dep).clone();
                if let Some(refs) = new
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
                }
                self.commit(&gr, EventType::Modified, new, Some(dep));
            } else if !meta::is_deleting(&dep) {
                self.delete_object(&gr, dep, Propagation::Background);
            }
        }
    }

    /// [`Task::Foreground`].
    fn finish_foreground(&mut self, owner_uid: &str) {
        let Some((gr, ns, name)) = self.by_uid.get(owner_uid).cloned() else {
            return;
        };
        let Some(owner) = self.get(&gr, &ns, &name) else {
            return;
        };
        if !meta::is_deleting(&owner)
            || !meta::finalizers(&owner)
                .iter()
                .any(|f| f == "foregroundDeletion")
        {
            return;
        }
        let deps: Vec<Location> = self
            .by_owner
            .get(owner_uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let mut remaining = 0;
        for (dgr, dns, dname) in deps {
            let Some(dep) = self.get(&dgr, &dns, &dname) else {
                continue;
            };
            remaining += 1;
            if !meta::is_deleting(&dep) {
                self.delete_object(&dgr, dep, Propagation::Foreground);
            }
        }
        let still: usize = self
            .by_owner
            .get(owner_uid)
            .map(|s| {
                s.iter()
                    .filter(|(g, n, m)| self.get(g, n, m).is_some())
                    .count()
            })
            .unwrap_or(0);
        if remaining == 0 || still == 0 {
            let Some(owner) = self.get(&gr, &ns, &name) else {
                return;
            };
            let mut new = (*owner).clone();
            let rest: Vec<String> = meta::finalizers(&owner)
                .into_iter()
                .filter(|f| f != "foregroundDeletion")
                .collect();
            if rest.is_empty() {
                self.remove(&gr, new, owner);
            } else {
                meta::set(&mut new, "finalizers", Some(json!(rest)));
                self.commit(&gr, EventType::Modified, new, Some(owner));
            }
        }
    }

    /// [`Task::Namespace`].
    fn terminate_namespace(&mut self, ns: &str) {
        let ns_gr = GroupResource::new("", "namespaces");
        let Some(nsobj) = self.get(&ns_gr, "", ns) else {
            return;
        };
        if !meta::is_deleting(&nsobj) {
            return;
        }
        let mut left = 0usize;
        let grs: Vec<GroupResource> = self.collections.keys().cloned().collect();
        for gr in grs {
            let objs: Vec<Arc<Value>> = self
                .collections
                .get(&gr)
                .map(|c| {
                    c.range((ns.to_string(), String::new())..)
                        .take_while(|((n, _), _)| n == ns)
                        .map(|(_, o)| o.clone())
                        .collect()
                })
                .unwrap_or_default();
            for obj in objs {
                if !meta::is_deleting(&obj) {
                    self.delete_object(&gr, obj.clone(), Propagation::Background);
                }
                if self.get(&gr, ns, meta::name(&obj)).is_some() {
                    left += 1;
                }
            }
        }
        if left == 0 && meta::finalizers(&nsobj).is_empty() {
            let Some(nsobj) = self.get(&ns_gr, "", ns) else {
                return;
            };
            let mut last = (*nsobj).clone();
            if let Some(spec) = last.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("finalizers");
            }
            self.commit(&ns_gr, EventType::Deleted, last, Some(nsobj));
        }
    }
}
