//! The object store: every object, the global resourceVersion, the bounded watch history, and the
//! write semantics kube-apiserver applies (preconditions, generation, status split, finalizers,
//! owner-reference garbage collection, namespace termination, CRD registration).
//!
//! Everything happens under one mutex so that a resourceVersion totally orders all writes, a
//! watch can subscribe and read history atomically, and a continue token can pin a snapshot.

use crate::admission::fieldcheck::{self, FieldValidation};
use crate::admission::validation;
use crate::apply::fieldmanager;
use crate::apply::lists::list_key_of;
use crate::apply::patch;
use crate::catalog::resources::{GroupResource, Registry, ResourceInfo, infos_from_crd};
use crate::catalog::schema;
use crate::meta;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::{ApiError, Cause};
use parking_lot::{Mutex, MutexGuard};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// The kind of a change, as watch events name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    /// An object was created.
    Added,
    /// An object changed.
    Modified,
    /// An object was removed.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change, kept in the history and broadcast to watches.
#[derive(Debug)]
pub(crate) struct Change {
    /// The resourceVersion the change was committed at.
    pub(crate) rv: u64,
    /// Which collection changed.
    pub(crate) gr: GroupResource,
    /// What happened.
    pub(crate) kind: EventType,
    /// The object after the change (for deletes: its last state, with the delete's resourceVersion).
    pub(crate) object: Arc<Value>,
    /// The object before the change, so selector watches can see objects leave and enter.
    pub(crate) old: Option<Arc<Value>>,
}

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

/// Options shared by create, update and patch.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// The field manager recorded in managedFields.
    pub(crate) manager: String,
    /// `dryRun=All`: validate and answer, store nothing.
    pub(crate) dry_run: bool,
    /// `force=true` for server-side apply.
    pub(crate) force: bool,
    /// What to do with fields the kind's schema does not declare.
    pub(crate) field_validation: FieldValidation,
    /// Warnings for the response's `Warning` headers (unknown fields under `Warn`).
    pub(crate) warnings: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl WriteOptions {
    /// Options for writes by field manager `manager`, with every other option at its default
    /// (not a dry run, no force, `fieldValidation=Warn`).
    pub fn new(manager: &str) -> Self {
        WriteOptions {
            manager: manager.to_string(),
            ..Default::default()
        }
    }

    /// Type-checks an object against its kind's schema, drops undeclared fields and applies
    /// `fieldValidation` to them.
    fn decode_check(&self, info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
        let unknown = fieldcheck::check(info, obj)?;
        self.enforce(info, &unknown)
    }

    fn enforce(&self, info: &ResourceInfo, unknown: &[String]) -> Result<(), ApiError> {
        let warnings = fieldcheck::enforce(info, self.field_validation, unknown)?;
        self.warnings.lock().extend(warnings);
        Ok(())
    }
}

/// The outcome of a delete.
#[derive(Debug)]
pub(crate) enum Deleted {
    /// The object is gone; this was its last state.
    Gone(Arc<Value>),
    /// Deletion is pending on finalizers; this is the object now.
    Pending(Arc<Value>),
}

/// A patch request's body, by content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    /// application/merge-patch+json
    Merge,
    /// application/json-patch+json
    Json,
    /// application/strategic-merge-patch+json
    Strategic,
    /// application/apply-patch+yaml
    Apply,
}

/// The result of a list.
pub(crate) struct ListResult {
    /// Items in key order.
    pub(crate) items: Vec<Arc<Value>>,
    /// The list's resourceVersion (the snapshot it reflects).
    pub(crate) rv: u64,
    /// Token for the next page.
    pub(crate) continue_token: Option<String>,
    /// Items after this page.
    pub(crate) remaining: Option<usize>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WatchStart {
    /// Synthetic ADDED events for the current state, then live changes.
    Now {
        /// Send the `k8s.io/initial-events-end` bookmark after the initial events.
        end_bookmark: bool,
    },
    /// Changes after this resourceVersion, from the history.
    From(u64),
}

/// What a new watch needs: its initial events, its receiver, and the resourceVersion it starts at.
pub(crate) struct WatchSetup {
    /// Synthetic ADDED objects (for `WatchStart::Now`).
    pub(crate) initial: Vec<Arc<Value>>,
    /// Changes replayed from history (for `WatchStart::From`).
    pub(crate) replay: Vec<Arc<Change>>,
    /// Live changes committed after `rv`.
    pub(crate) receiver: broadcast::Receiver<Arc<Change>>,
    /// The resourceVersion this watch is current as of.
    pub(crate) rv: u64,
}

struct Snapshot {
    items: Arc<Vec<Arc<Value>>>,
    rv: u64,
    created: Instant,
}

type ObjectKey = (String, String);
type Location = (GroupResource, String, String);

/// Mutable state behind the store's lock.
pub struct State {
    rv: u64,
    /// Served resources; CRD writes change it.
    pub registry: Registry,
    collections: HashMap<GroupResource, BTreeMap<ObjectKey, Arc<Value>>>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    min_resume_rv: u64,
    by_owner: HashMap<String, BTreeSet<Location>>,
    by_uid: HashMap<String, Location>,
    snapshots: HashMap<u64, Snapshot>,
    next_snapshot: u64,
    events: broadcast::Sender<Arc<Change>>,
}

/// The shared store handle.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Mutex<State>>,
}

/// Work left over by a write: garbage collection and namespace termination run to completion
/// inside the same lock so clients observe a consistent cascade.
enum Task {
    OwnerGone(String),
    Foreground(String),
    Namespace(String),
}

const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
const MAX_SNAPSHOTS: usize = 512;
const BROADCAST_CAPACITY: usize = 1 << 16;

impl Store {
    /// A store with the built-in kinds and the default namespaces.
    pub fn new(history_limit: usize) -> Self {
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        let state = State {
            rv: 0,
            registry: Registry::builtin(),
            collections: HashMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            min_resume_rv: 0,
            by_owner: HashMap::new(),
            by_uid: HashMap::new(),
            snapshots: HashMap::new(),
            next_snapshot: 1,
            events,
        };
        let store = Store {
            inner: Arc::new(Mutex::new(state)),
        };
        {
            let mut st = store.lock();
            let ns_info = st.registry.get("", "v1", "namespaces").cloned();
            if let Some(info) = ns_info {
                for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                    let obj =
                        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                    let opts = WriteOptions::new("devcluster");
                    if let Err(e) = st.create(&info, None, obj, &opts) {
                        tracing::error!(error = %e, "creating default namespace");
                    }
                }
            }
        }
        store
    }

    /// Take the lock. parking_lot locks do not poison: every write commits atomically at its
    /// end, so a panic mid-request leaves the state structurally valid and serving goes on.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }
}

impl State {
    /// The current (latest committed) resourceVersion.
    pub(crate) fn current_rv(&self) -> u64 {
        self.rv
    }

    /// Number of stored objects, for statistics.
    pub(crate) fn object_count(&self) -> usize {
        self.collections.values().map(BTreeMap::len).sum()
    }

    /// Drop the watch history so any resume from an older resourceVersion gets 410 Expired.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        // Nothing at or after the current version was lost, so a client that relists and
        // resumes from the list's resourceVersion must not loop on 410.
        self.min_resume_rv = self.rv;
        self.snapshots.clear();
    }

    /// One object.
    pub(crate) fn get(&self, gr: &GroupResource, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.collections
            .get(gr)?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Every object of one collection, or only those in namespace `ns`, without the copying and
    /// paging of [`State::list`] (the authorizer reads bindings on every non-admin request).
    pub(crate) fn objects<'a>(
        &'a self,
        gr: &GroupResource,
        ns: Option<&str>,
    ) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
        let ns = ns.map(str::to_string);
        self.collections
            .get(gr)
            .into_iter()
            .flat_map(|c| c.iter())
            .filter(move |((n, _), _)| ns.as_ref().is_none_or(|ns| ns == n))
            .map(|(_, obj)| obj)
    }

    fn require(&self, info: &ResourceInfo, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.get(&info.group_resource(), ns, name)
            .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))
    }

    /// Get for the GET verb.
    pub(crate) fn read(
        &self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        self.require(info, ns, name)
    }

    /// List with selectors and pagination.
    pub(crate) fn list(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<ListResult, ApiError> {
        let (items, rv, offset) = match continue_token.filter(|t| !t.is_empty()) {
            Some(token) => {
                let (id, offset) = decode_continue(token).ok_or_else(|| {
                    ApiError::bad_request("continue key is not valid: malformed token")
                })?;
                self.expire_snapshots();
                let snap = self.snapshots.get(&id).ok_or_else(|| {
                    ApiError::expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")
                })?;
                (snap.items.clone(), snap.rv, offset)
            }
            None => {
                let gr = info.group_resource();
                let items: Vec<Arc<Value>> = match self.collections.get(&gr) {
                    None => Vec::new(),
                    Some(coll) => {
                        let iter: Box<dyn Iterator<Item = (&ObjectKey, &Arc<Value>)>> = match ns {
                            Some(ns) => Box::new(
                                coll.range((ns.to_string(), String::new())..)
                                    .take_while(move |((n, _), _)| n == ns),
                            ),
                            None => Box::new(coll.iter()),
                        };
                        iter.filter(|(_, o)| labels.matches_object(o) && fields.matches(o))
                            .map(|(_, o)| o.clone())
                            .collect()
                    }
                };
                (Arc::new(items), self.rv, 0)
            }
        };
        let total = items.len();
        let start = offset.min(total);
        let end = match limit.filter(|l| *l > 0) {
            Some(l) => (start + l).min(total),
            None => total,
        };
        let page: Vec<Arc<Value>> = items[start..end].to_vec();
        let (continue_token, remaining) = if end < total {
            let id = match continue_token.and_then(decode_continue) {
                Some((id, _)) => id,
                None => {
                    self.expire_snapshots();
                    let id = self.next_snapshot;
                    self.next_snapshot += 1;
                    self.snapshots.insert(
                        id,
                        Snapshot {
                            items: items.clone(),
                            rv,
                            created: Instant::now(),
                        },
                    );
                    id
                }
            };
            (Some(encode_continue(id, end, rv)), Some(total - end))
        } else {
            (None, None)
        };
        Ok(ListResult {
            items: page,
            rv,
            continue_token,
            remaining,
        })
    }

    fn expire_snapshots(&mut self) {
        self.snapshots
            .retain(|_, s| s.created.elapsed() < SNAPSHOT_TTL);
        while self.snapshots.len() >= MAX_SNAPSHOTS {
            let oldest = self
                .snapshots
                .iter()
                .min_by_key(|(_, s)| s.created)
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => self.snapshots.remove(&k),
                None => break,
            };
        }
    }

    /// Subscribe a watch atomically with its starting state.
    pub(crate) fn watch(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        start: WatchStart,
    ) -> Result<WatchSetup, ApiError> {
        let gr = info.group_resource();
        let receiver = self.events.subscribe();
        match start {
            WatchStart::Now { .. } => {
                let initial = match self.collections.get(&gr) {
                    None => Vec::new(),
                    Some(coll) => coll
                        .iter()
                        .filter(|((n, _), _)| ns.is_none_or(|ns| ns == n))
                        .map(|(_, o)| o.clone())
                        .collect(),
                };
                Ok(WatchSetup {
                    initial,
                    replay: Vec::new(),
                    receiver,
                    rv: self.rv,
                })
            }
            WatchStart::From(from) => {
                if from < self.min_resume_rv {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {from} ({})",
                        self.min_resume_rv
                    )));
                }
                let replay = self
                    .history
                    .iter()
                    .filter(|c| c.rv > from && c.gr == gr)
                    .cloned()
                    .collect();
                Ok(WatchSetup {
                    initial: Vec::new(),
                    replay,
                    receiver,
                    rv: self.rv.max(from),
                })
            }
        }
    }

    fn commit(
        &mut self,
        gr: &GroupResource,
        kind: EventType,
        mut obj: Value,
        old: Option<Arc<Value>>,
    ) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        meta::set(&mut obj, "resourceVersion", Some(json!(rv.to_string())));
        let key = (
            meta::namespace(&obj).to_string(),
            meta::name(&obj).to_string(),
        );
        let uid = meta::uid(&obj).to_string();
        let location: Location = (gr.clone(), key.0.clone(), key.1.clone());
        if let Some(old) = &old {
            for owner in meta::owner_uids(old) {
                if let Some(set) = self.by_owner.get_mut(&owner) {
                    set.remove(&location);
                    if set.is_empty() {
                        self.by_owner.remove(&owner);
                    }
                }
            }
        }
        let obj = Arc::new(obj);
        let coll = self.collections.entry(gr.clone()).or_default();
        if kind == EventType::Deleted {
            coll.remove(&key);
            self.by_uid.remove(&uid);
        } else {
            coll.insert(key, obj.clone());
            for owner in meta::owner_uids(&obj) {
                self.by_owner
                    .entry(owner)
                    .or_default()
                    .insert(location.clone());
            }
            self.by_uid.insert(uid, location);
        }
        let change = Arc::new(Change {
            rv,
            gr: gr.clone(),
            kind,
            object: obj.clone(),
            old,
        });
        if self.history.len() >= self.history_limit
            && let Some(evicted) = self.history.pop_front()
        {
            self.min_resume_rv = self.min_resume_rv.max(evicted.rv);
        }
        self.history.push_back(change.clone());
        // No receivers is normal: nobody is watching.
        let _ = self.events.send(change);
        obj
    }

    fn namespace_gate(&self, info: &ResourceInfo, ns: &str) -> Result<(), ApiError> {
        if !info.namespaced {
            return Ok(());
        }
        let ns_gr = GroupResource::new("", "namespaces");
        match self.get(&ns_gr, "", ns) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(n) if meta::is_deleting(&n) => Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                info.plural, "",
            ))
            .with_name_hint(ns)),
            Some(_) => Ok(()),
        }
    }

    /// Create an object (POST), including create-on-apply.
    pub fn create(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        mut obj: Value,
        opts: &WriteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        self.create_inner(info, ns, &mut obj, opts, true)
    }

    fn create_inner(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        obj: &mut Value,
        opts: &WriteOptions,
        record_fields: bool,
    ) -> Result<Arc<Value>, ApiError> {
        check_type(info, obj)?;
        opts.decode_check(info, obj)?;
        let ns = normalize_namespace(info, ns, obj)?;
        let mut name = meta::name(obj).to_string();
        if name.is_empty() {
            let generate = obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if generate.is_empty() {
                return Err(ApiError::invalid_field(
                    &info.kind,
                    &info.group,
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                ));
            }
            name = format!("{generate}{}", random_suffix());
            meta::set(obj, "name", Some(json!(name)));
        }
        if !info.builtin {
            // Built-in names are checked per kind by validation::validate.
            validate_name(info, &name)?;
        }
        self.namespace_gate(info, &ns)
            .map_err(|e| e.with_resource_name(&name))?;
        let gr = info.group_resource();
        {
            let md = meta::metadata_mut(obj);
            md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            md.insert("creationTimestamp".into(), json!(meta::now()));
            for f in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
                "selfLink",
            ] {
                md.remove(f);
            }
            if info.generation {
                md.insert("generation".into(), json!(1));
            } else {
                md.remove("generation");
            }
            if md
                .get("finalizers")
                .is_some_and(|f| f.as_array().is_some_and(Vec::is_empty))
            {
                md.remove("finalizers");
            }
        }
        if info.status
            && let Some(map) = obj.as_object_mut()
        {
            map.remove("status");
        }
        self.defaults_on_create(info, obj)?;
        validation::validate(info, obj, None)?;
        self.check_custom(info, obj, &name, opts)?;
        // Like kube-apiserver, an invalid object is refused as invalid even if the name is taken.
        if self.get(&gr, &ns, &name).is_some() {
            return Err(ApiError::already_exists(&info.group, &info.plural, &name));
        }
        if record_fields {
            record(obj, None, info, opts, None);
        }
        if opts.dry_run {
            return Ok(Arc::new(obj.clone()));
        }
        if gr.group == "apiextensions.k8s.io" && gr.resource == "customresourcedefinitions" {
            self.register_crd(obj, &name)?;
        }
        Ok(self.commit(&gr, EventType::Added, obj.clone(), None))
    }

    fn defaults_on_create(&self, info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
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
            ("batch", "jobs") => validation::default_job(obj),
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
                let now = meta::now();
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

    fn register_crd(&mut self, crd: &Value, name: &str) -> Result<(), ApiError> {
        let infos = infos_from_crd(crd).map_err(|m| {
            ApiError::invalid_field(
                "CustomResourceDefinition",
                "apiextensions.k8s.io",
                name,
                "spec",
                "FieldValueInvalid",
                &m,
            )
        })?;
        self.registry.remove_crd(name);
        for info in infos {
            self.registry.insert(info);
        }
        Ok(())
    }

    /// Prune, default and validate a custom resource against its CRD's structural schema.
    fn check_custom(
        &self,
        info: &ResourceInfo,
        obj: &mut Value,
        name: &str,
        opts: &WriteOptions,
    ) -> Result<(), ApiError> {
        let Some(schema) = &info.schema else {
            return Ok(());
        };
        let pruned = schema::prune_and_default(obj, schema);
        opts.enforce(info, &pruned)?;
        let causes = schema::validate(obj, schema);
        if causes.is_empty() {
            return Ok(());
        }
        Err(ApiError::invalid(
            &info.kind,
            &info.group,
            name,
            causes
                .into_iter()
                .map(|c| Cause {
                    reason: c.reason.to_string(),
                    message: c.message,
                    field: c.field,
                })
                .collect(),
        ))
    }

    /// Replace an object (PUT), on the main resource or a subresource.
    pub(crate) fn update(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        mut obj: Value,
        sub: Option<&str>,
        opts: &WriteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        check_type(info, &obj)?;
        let old = self.require(info, ns, name)?;
        let given_rv = meta::resource_version(&obj).to_string();
        if given_rv.is_empty() {
            if !info.unconditional_update {
                return Err(ApiError::invalid_field(
                    &info.kind,
                    &info.group,
                    name,
                    "metadata.resourceVersion",
                    "FieldValueInvalid",
                    "Invalid value: 0x0: must be specified for an update",
                ));
            }
            meta::set(
                &mut obj,
                "resourceVersion",
                Some(json!(meta::resource_version(&old))),
            );
        }
        self.write_existing(info, ns, name, old, obj, sub, opts, true)
    }

    /// Patch an object (PATCH), including server-side apply and create-on-apply.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn patch(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        kind: PatchType,
        body: &Value,
        sub: Option<&str>,
        opts: &WriteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        let existing = self.get(&info.group_resource(), ns, name);
        if kind == PatchType::Apply {
            return self.apply(info, ns, name, existing, body, sub, opts);
        }
        let old = existing.ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
        let mut new = (*old).clone();
        match kind {
            PatchType::Merge => {
                if !body.is_object() {
                    return Err(ApiError::bad_request(
                        "the body of a merge patch must be a JSON object",
                    ));
                }
                patch::merge_patch(&mut new, body)
            }
            PatchType::Json => patch::json_patch(&mut new, body).map_err(|e| match e {
                patch::PatchError::Malformed(m) => ApiError::bad_request(m),
                patch::PatchError::Failed(m) => ApiError::invalid_field(
                    &info.kind,
                    &info.group,
                    name,
                    "",
                    "FieldValueInvalid",
                    &m,
                ),
            })?,
            PatchType::Strategic => {
                if !info.builtin {
                    return Err(ApiError::unsupported_media_type(
                        "application/strategic-merge-patch+json",
                    ));
                }
                patch::strategic_merge_patch(&mut new, body)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?
            }
            PatchType::Apply => unreachable!("handled above"),
        }
        // A resourceVersion that differs from the live one can only have come from the patch body:
        // it is a precondition, checked in write_existing.
        if meta::resource_version(&new).is_empty() {
            meta::set(
                &mut new,
                "resourceVersion",
                Some(json!(meta::resource_version(&old))),
            );
        }
        self.write_existing(info, ns, name, old, new, sub, opts, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn apply(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        existing: Option<Arc<Value>>,
        body: &Value,
        sub: Option<&str>,
        opts: &WriteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of an apply patch must be a YAML or JSON object",
            ));
        }
        check_type(info, body)?;
        // Undeclared fields are dropped before ownership is computed, so nobody owns them.
        let mut body = body.clone();
        opts.decode_check(info, &mut body)?;
        let body = &body;
        let body_name = meta::name(body);
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if opts.manager.is_empty() {
            return Err(ApiError::bad_request(
                "PATCH requests with apply content type must include fieldManager",
            ));
        }
        let now = meta::now();
        let api_version = info.api_version();
        let list_key = |path: &[&str]| list_key_of(info, path);
        let op = fieldmanager::Op {
            manager: &opts.manager,
            api_version: &api_version,
            time: &now,
            subresource: sub,
            list_key: &list_key,
        };
        let merged = fieldmanager::apply(existing.as_deref(), body, opts.force, &op).map_err(
            |e| match e {
                fieldmanager::ApplyError::Conflicts(conflicts) => {
                    let (message, causes) = fieldmanager::conflict_status_parts(&conflicts);
                    ApiError::apply_conflict(
                        message,
                        causes
                            .into_iter()
                            .map(|c| Cause {
                                reason: c
                                    .get("type")
                                    .and_then(Value::as_str)
                                    .unwrap_or("FieldManagerConflict")
                                    .to_string(),
                                message: c
                                    .get("message")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_string(),
                                field: c
                                    .get("field")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_string(),
                            })
                            .collect(),
                    )
                }
                fieldmanager::ApplyError::Invalid(m) => ApiError::bad_request(m),
            },
        )?;
        match existing {
            None => {
                let mut obj = merged;
                meta::set(&mut obj, "name", Some(json!(name)));
                if info.namespaced {
                    meta::set(&mut obj, "namespace", Some(json!(ns)));
                }
                self.create_inner(info, Some(ns), &mut obj, opts, false)
            }
            Some(old) => {
                let mut new = merged;
                meta::set(
                    &mut new,
                    "resourceVersion",
                    Some(json!(meta::resource_version(&old))),
                );
                self.write_existing(info, ns, name, old, new, sub, opts, false)
            }
        }
    }

    /// Read the scale subresource.
    pub(crate) fn get_scale(
        &self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let obj = self.require(info, ns, name)?;
        scale_of(info, &obj)
    }

    /// Write the scale subresource from a Scale object.
    pub(crate) fn set_scale(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        scale: &Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let paths = info
            .scale
            .clone()
            .ok_or_else(|| ApiError::no_route("scale"))?;
        let old = self.require(info, ns, name)?;
        let replicas = scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .ok_or_else(|| {
                ApiError::invalid_field(
                    "Scale",
                    "autoscaling",
                    name,
                    "spec.replicas",
                    "FieldValueRequired",
                    "Required value",
                )
            })?;
        if replicas < 0 {
            return Err(ApiError::invalid_field(
                "Scale",
                "autoscaling",
                name,
                "spec.replicas",
                "FieldValueInvalid",
                "Invalid value: must be greater than or equal to 0",
            ));
        }
        let given = meta::resource_version(scale);
        if !given.is_empty() && given != meta::resource_version(&old) {
            return Err(ApiError::conflict(
                &info.group,
                &info.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let mut new = (*old).clone();
        meta::set_path(&mut new, &paths.spec_replicas, json!(replicas));
        let updated = self.write_existing(info, ns, name, old, new, None, opts, true)?;
        scale_of(info, &updated)
    }

    #[allow(clippy::too_many_arguments)]
    fn write_existing(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        old: Arc<Value>,
        mut new: Value,
        sub: Option<&str>,
        opts: &WriteOptions,
        record_fields: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let gr = info.group_resource();
        opts.decode_check(info, &mut new)?;
        if meta::name(&new) != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta::name(&new)
            )));
        }
        if info.namespaced {
            let body_ns = meta::namespace(&new);
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta::set(&mut new, "namespace", Some(json!(ns)));
        }
        if meta::resource_version(&new) != meta::resource_version(&old) {
            return Err(ApiError::conflict(
                &info.group,
                &info.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        new["apiVersion"] = old.get("apiVersion").cloned().unwrap_or(Value::Null);
        new["kind"] = json!(info.kind);
        match sub {
            Some("status") => {
                let status = new.get("status").cloned();
                let mut only_status = (*old).clone();
                match status {
                    Some(s) => only_status["status"] = s,
                    None => {
                        if let Some(m) = only_status.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                // Status writers may still carry managedFields; everything else of metadata is ignored.
                new = only_status;
            }
            Some(other) => return Err(ApiError::no_route(other)),
            None => {
                if info.status {
                    match old.get("status") {
                        Some(s) => new["status"] = s.clone(),
                        None => {
                            if let Some(m) = new.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
            }
        }
        // Fields the server owns are not the client's to change.
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            meta::set(
                &mut new,
                field,
                old.pointer(&format!("/metadata/{field}")).cloned(),
            );
        }
        if sub.is_none() || !record_fields {
            // keep client-supplied managedFields only through apply
        }
        if new
            .pointer("/metadata/finalizers")
            .is_some_and(|f| f.as_array().is_some_and(Vec::is_empty))
        {
            meta::set(&mut new, "finalizers", None);
        }
        let deleting = meta::is_deleting(&old);
        if deleting {
            let before: BTreeSet<String> = meta::finalizers(&old).into_iter().collect();
            let added: Vec<String> = meta::finalizers(&new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid_field(
                    &info.kind,
                    &info.group,
                    name,
                    "metadata.finalizers",
                    "FieldValueForbidden",
                    &format!(
                        "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                ));
            }
        }
        if sub.is_none() {
            validation::validate(info, &new, Some(&old))?;
            self.check_custom(info, &mut new, name, opts)?;
        }
        if info.generation && spec_changed(info, &old, &new) {
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta::set(&mut new, "generation", Some(json!(generation + 1)));
        }
        if same_ignoring_managed_fields(&old, &new) {
            return Ok(old);
        }
        if record_fields {
            record(&mut new, Some(&old), info, opts, sub);
        } else if let Some(mf) = old.pointer("/metadata/managedFields")
            && new.pointer("/metadata/managedFields").is_none()
        {
            meta::set(&mut new, "managedFields", Some(mf.clone()));
        }
        if opts.dry_run {
            return Ok(Arc::new(new));
        }
        if gr.group == "apiextensions.k8s.io"
            && gr.resource == "customresourcedefinitions"
            && sub.is_none()
        {
            self.register_crd(&new, name)?;
        }
        if deleting && meta::finalizers(&new).is_empty() {
            let gone = self.remove(&gr, new, old);
            return Ok(gone);
        }
        Ok(self.commit(&gr, EventType::Modified, new, Some(old)))
    }

    /// Remove an object for good and run the cascade it triggers.
    fn remove(&mut self, gr: &GroupResource, last: Value, old: Arc<Value>) -> Arc<Value> {
        let uid = meta::uid(&last).to_string();
        let ns = meta::namespace(&last).to_string();
        let owners = meta::owner_uids(&last);
        let is_crd =
            gr.group == "apiextensions.k8s.io" && gr.resource == "customresourcedefinitions";
        let is_ns = gr.group.is_empty() && gr.resource == "namespaces";
        let name = meta::name(&last).to_string();
        let gone = self.commit(gr, EventType::Deleted, last, Some(old));
        let mut tasks = vec![Task::OwnerGone(uid)];
        tasks.extend(owners.into_iter().map(Task::Foreground));
        if !ns.is_empty() {
            tasks.push(Task::Namespace(ns));
        }
        if is_crd {
            self.drop_crd_objects(&name);
        }
        if is_ns {
            // Nothing else to do: content was removed before the namespace could go.
        }
        self.run(tasks);
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
    pub(crate) fn delete(
        &mut self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
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

    fn delete_object(
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
            meta::set(&mut new, "deletionTimestamp", Some(json!(meta::now())));
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
        let mut tasks = Vec::new();
        if policy == Propagation::Foreground {
            tasks.push(Task::Foreground(uid));
        }
        if is_ns {
            tasks.push(Task::Namespace(meta::name(&pending).to_string()));
        }
        self.run(tasks);
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

    fn run(&mut self, mut tasks: Vec<Task>) {
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

impl ApiError {
    fn with_name_hint(mut self, ns: &str) -> Self {
        self.details = Some(Box::new(json!({"name": ns, "kind": "namespaces"})));
        self
    }

    fn with_resource_name(mut self, name: &str) -> Self {
        if self.code == 403 {
            self.message = self.message.replacen("\"\"", &format!("\"{name}\""), 1);
        }
        self
    }
}

fn check_type(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !kind.is_empty() && kind != info.kind {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({}) or the kind {kind} does not match {}",
            info.api_version(),
            info.kind
        )));
    }
    if !api_version.is_empty() && api_version != info.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            info.api_version()
        )));
    }
    Ok(())
}

fn normalize_namespace(
    info: &ResourceInfo,
    ns: Option<&str>,
    obj: &mut Value,
) -> Result<String, ApiError> {
    obj["apiVersion"] = json!(info.api_version());
    obj["kind"] = json!(info.kind);
    if !info.namespaced {
        meta::set(obj, "namespace", None);
        return Ok(String::new());
    }
    let url_ns = ns.unwrap_or_default();
    let body_ns = meta::namespace(obj).to_string();
    if !body_ns.is_empty() && !url_ns.is_empty() && body_ns != url_ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let ns = if url_ns.is_empty() {
        body_ns
    } else {
        url_ns.to_string()
    };
    if ns.is_empty() {
        return Err(ApiError::bad_request(
            "a namespace is required for namespaced resources",
        ));
    }
    meta::set(obj, "namespace", Some(json!(ns)));
    Ok(ns)
}

fn validate_name(info: &ResourceInfo, name: &str) -> Result<(), ApiError> {
    let rbac = info.group == "rbac.authorization.k8s.io";
    let problem = if name == "." || name == ".." || name.contains('/') || name.contains('%') {
        Some("may not be '.' or '..' and may not contain '/' or '%'")
    } else if rbac {
        None
    } else if info.plural == "namespaces" {
        (!is_dns_label(name)).then_some("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
    } else {
        (!is_dns_subdomain(name)).then_some("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
    };
    match problem {
        None => Ok(()),
        Some(why) => Err(ApiError::invalid_field(
            &info.kind,
            &info.group,
            name,
            "metadata.name",
            "FieldValueInvalid",
            &format!("Invalid value: \"{name}\": {why}"),
        )),
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn random_suffix() -> String {
    use rand::Rng;
    // The alphabet kube-apiserver uses: no vowels, no confusable digits.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Whether anything but metadata (and status, where status is a subresource) differs.
fn spec_changed(info: &ResourceInfo, old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            if info.status {
                m.remove("status");
            }
        }
        v
    };
    strip(old) != strip(new)
}

fn same_ignoring_managed_fields(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        meta::set(&mut v, "managedFields", None);
        v
    };
    strip(old) == strip(new)
}

fn record(
    obj: &mut Value,
    old: Option<&Value>,
    info: &ResourceInfo,
    opts: &WriteOptions,
    sub: Option<&str>,
) {
    if opts.manager.is_empty() {
        return;
    }
    if let Some(old) = old
        && let Some(mf) = old.pointer("/metadata/managedFields")
    {
        meta::set(obj, "managedFields", Some(mf.clone()));
    }
    let now = meta::now();
    let api_version = info.api_version();
    let list_key = |path: &[&str]| list_key_of(info, path);
    let op = fieldmanager::Op {
        manager: &opts.manager,
        api_version: &api_version,
        time: &now,
        subresource: sub,
        list_key: &list_key,
    };
    fieldmanager::record_update(old, obj, &op);
}

fn scale_of(info: &ResourceInfo, obj: &Value) -> Result<Value, ApiError> {
    let paths = info
        .scale
        .clone()
        .ok_or_else(|| ApiError::no_route("scale"))?;
    let spec = meta::get_path(obj, &paths.spec_replicas)
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let status = meta::get_path(obj, &paths.status_replicas)
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let mut scale = json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta::name(obj),
            "uid": meta::uid(obj),
            "resourceVersion": meta::resource_version(obj),
            "creationTimestamp": obj.pointer("/metadata/creationTimestamp").cloned().unwrap_or(Value::Null),
        },
        "spec": {"replicas": spec},
        "status": {"replicas": status},
    });
    if info.namespaced {
        scale["metadata"]["namespace"] = json!(meta::namespace(obj));
    }
    let selector = paths
        .label_selector
        .as_deref()
        .and_then(|p| meta::get_path(obj, p))
        .cloned()
        .or_else(|| {
            // Built-in workloads keep a LabelSelector object in spec.selector; Scale wants it serialized.
            obj.pointer("/spec/selector/matchLabels")
                .and_then(Value::as_object)
                .map(|m| {
                    json!(
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                })
        });
    if let Some(sel) = selector {
        scale["status"]["selector"] = sel;
    }
    Ok(scale)
}

fn encode_continue(id: u64, offset: usize, rv: u64) -> String {
    use base64::Engine;
    let raw = json!({"v": "devcluster/v1", "id": id, "offset": offset, "rv": rv}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(token: &str) -> Option<(u64, usize)> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    Some((
        v.get("id")?.as_u64()?,
        usize::try_from(v.get("offset")?.as_u64()?).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm_info(st: &State) -> ResourceInfo {
        st.registry
            .get("", "v1", "configmaps")
            .cloned()
            .expect("configmaps served")
    }

    fn opts() -> WriteOptions {
        WriteOptions::new("test")
    }

    #[test]
    fn resource_versions_are_monotonic_and_deletes_get_a_new_one() {
        let store = Store::new(100);
        let mut st = store.lock();
        let info = cm_info(&st);
        let a = st
            .create(
                &info,
                Some("default"),
                json!({"metadata": {"name": "a"}, "data": {"k": "v"}}),
                &opts(),
            )
            .expect("create");
        let rv_a: u64 = meta::resource_version(&a).parse().expect("numeric rv");
        let del = st
            .delete(
                &info,
                "default",
                "a",
                &DeleteOptions {
                    propagation: None,
                    uid: None,
                    resource_version: None,
                    dry_run: false,
                },
            )
            .expect("delete");
        let Deleted::Gone(gone) = del else {
            panic!("no finalizers: must be gone")
        };
        let rv_del: u64 = meta::resource_version(&gone).parse().expect("numeric rv");
        assert!(rv_del > rv_a);
        assert_eq!(st.current_rv(), rv_del);
    }

    #[test]
    fn continue_tokens_pin_a_snapshot() {
        let store = Store::new(100);
        let mut st = store.lock();
        let info = cm_info(&st);
        for i in 0..5 {
            st.create(
                &info,
                Some("default"),
                json!({"metadata": {"name": format!("cm{i}")}}),
                &opts(),
            )
            .expect("create");
        }
        let all = LabelSelector::default();
        let none = FieldSelector::default();
        let first = st
            .list(&info, Some("default"), &all, &none, Some(2), None)
            .expect("list");
        assert_eq!(first.items.len(), 2);
        st.create(
            &info,
            Some("default"),
            json!({"metadata": {"name": "cm-late"}}),
            &opts(),
        )
        .expect("create");
        let token = first.continue_token.clone().expect("more pages");
        let second = st
            .list(&info, Some("default"), &all, &none, Some(10), Some(&token))
            .expect("list");
        assert_eq!(second.rv, first.rv);
        assert_eq!(second.items.len(), 3);
        assert!(second.items.iter().all(|o| meta::name(o) != "cm-late"));
        assert!(second.continue_token.is_none());
    }

    #[test]
    fn compacted_history_expires_resumes() {
        let store = Store::new(100);
        let mut st = store.lock();
        let info = cm_info(&st);
        let before = st.current_rv();
        st.create(
            &info,
            Some("default"),
            json!({"metadata": {"name": "x"}}),
            &opts(),
        )
        .expect("create");
        st.compact();
        assert!(
            st.watch(&info, None, WatchStart::From(before)).is_err(),
            "older versions are gone"
        );
        let now = st.current_rv();
        assert!(
            st.watch(&info, None, WatchStart::From(now)).is_ok(),
            "the current version stays watchable"
        );
    }
}
