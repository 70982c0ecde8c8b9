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
pub(super) enum Task {
    OwnerGone(String),
    Foreground(String),
    Namespace(String),
}

impl State {
    pub(super) fn run(&mut self, mut tasks: Vec<Task>) {
        // Bounded by the number of objects: each step removes or finalizes at least one.
        let mut budget = 1_000_000usize;
        while let Some(task) = tasks.pop() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                tracing::error!("garbage collection did not converge");
                return;
            }
            match task {
                Task::OwnerGone(uid) => {
                    let deps: Vec<Location> = self
                        .by_owner
                        .get(&uid)
                        .map(|s| s.iter().cloned().collect())
                        .unwrap_or_default();
                    for (gr, ns, name) in deps {
                        let Some(dep) = self.get(&gr, &ns, &name) else {
                            continue;
                        };
                        let live_owners = meta::owner_uids(&dep)
                            .into_iter()
                            .filter(|o| o != &uid && self.by_uid.contains_key(o))
                            .count();
                        if live_owners > 0 {
                            let mut new = (*dep).clone();
                            if let Some(refs) = new
                                .pointer_mut("/metadata/ownerReferences")
                                .and_then(Value::as_array_mut)
                            {
                                refs.retain(|r| {
                                    r.get("uid").and_then(Value::as_str) != Some(uid.as_str())
                                });
                            }
                            self.commit(&gr, EventType::Modified, new, Some(dep));
                        } else if !meta::is_deleting(&dep) {
                            self.delete_object(&gr, dep, Propagation::Background);
                        }
                    }
                }
                Task::Foreground(owner_uid) => {
                    let Some((gr, ns, name)) = self.by_uid.get(&owner_uid).cloned() else {
                        continue;
                    };
                    let Some(owner) = self.get(&gr, &ns, &name) else {
                        continue;
                    };
                    if !meta::is_deleting(&owner)
                        || !meta::finalizers(&owner)
                            .iter()
                            .any(|f| f == "foregroundDeletion")
                    {
                        continue;
                    }
                    let deps: Vec<Location> = self
                        .by_owner
                        .get(&owner_uid)
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
                        .get(&owner_uid)
                        .map(|s| {
                            s.iter()
                                .filter(|(g, n, m)| self.get(g, n, m).is_some())
                                .count()
                        })
                        .unwrap_or(0);
                    if remaining == 0 || still == 0 {
                        let Some(owner) = self.get(&gr, &ns, &name) else {
                            continue;
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
                Task::Namespace(ns) => {
                    let ns_gr = GroupResource::new("", "namespaces");
                    let Some(nsobj) = self.get(&ns_gr, "", &ns) else {
                        continue;
                    };
                    if !meta::is_deleting(&nsobj) {
                        continue;
                    }
                    let mut left = 0usize;
                    let grs: Vec<GroupResource> = self.collections.keys().cloned().collect();
                    for gr in grs {
                        let objs: Vec<Arc<Value>> = self
                            .collections
                            .get(&gr)
                            .map(|c| {
                                c.range((ns.clone(), String::new())..)
                                    .take_while(|((n, _), _)| n == &ns)
                                    .map(|(_, o)| o.clone())
                                    .collect()
                            })
                            .unwrap_or_default();
                        for obj in objs {
                            if !meta::is_deleting(&obj) {
                                self.delete_object(&gr, obj.clone(), Propagation::Background);
                            }
                            if self.get(&gr, &ns, meta::name(&obj)).is_some() {
                                left += 1;
                            }
                        }
                    }
                    if left == 0 && meta::finalizers(&nsobj).is_empty() {
                        let Some(nsobj) = self.get(&ns_gr, "", &ns) else {
                            continue;
                        };
                        let mut last = (*nsobj).clone();
                        if let Some(spec) = last.get_mut("spec").and_then(Value::as_object_mut) {
                            spec.remove("finalizers");
                        }
                        self.commit(&ns_gr, EventType::Deleted, last, Some(nsobj));
                    }
                }
            }
        }
    }
}
