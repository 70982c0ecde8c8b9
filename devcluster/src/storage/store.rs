//! The object store: every object, the global resourceVersion, the bounded watch history, and the
//! write semantics kube-apiserver applies (preconditions, generation, status split, finalizers,
//! owner-reference garbage collection, namespace termination, CRD registration).
//!
//! Everything happens under one mutex so that a resourceVersion totally orders all writes, a
//! watch can subscribe and read history atomically, and a continue token can pin a snapshot.

use super::clock::Clock;
use crate::catalog::resources::{GroupResource, Registry, ResourceInfo};
use crate::meta;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
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
/// Where an object is stored: its collection, namespace and name.
pub(super) type Location = (GroupResource, String, String);

/// Mutable state behind the store's lock.
pub struct State {
    rv: u64,
    /// Served resources; CRD writes change it.
    pub registry: Registry,
    pub(super) collections: HashMap<GroupResource, BTreeMap<ObjectKey, Arc<Value>>>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    min_resume_rv: u64,
    pub(super) by_owner: HashMap<String, BTreeSet<Location>>,
    pub(super) by_uid: HashMap<String, Location>,
    snapshots: HashMap<u64, Snapshot>,
    next_snapshot: u64,
    events: broadcast::Sender<Arc<Change>>,
    /// Timestamps and continue-token ages; tests set it by hand.
    pub(super) clock: Clock,
}

const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
const MAX_SNAPSHOTS: usize = 512;
const BROADCAST_CAPACITY: usize = 1 << 16;

impl State {
    /// An empty state serving the built-in kinds (no objects yet: [`super::Store::new`] adds the
    /// default namespaces).
    pub(super) fn new(history_limit: usize) -> Self {
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        State {
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
            clock: Clock::default(),
        }
    }

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

    pub(super) fn require(
        &self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
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
                            created: self.clock.instant(),
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
        let now = self.clock.instant();
        self.snapshots
            .retain(|_, s| now.duration_since(s.created) < SNAPSHOT_TTL);
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

    pub(super) fn commit(
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
