//! Shared caches: one informer per (resource, namespace, label selector, metadata-only), shared by
//! every registration that needs it, started on first need and stopped when the last one leaves.
//!
//! List/watch, backoff and 410 recovery come from `kube::runtime::watcher`; the store and the
//! fan-out are ours because kube-runtime's shared streams cannot take a late subscriber and stall
//! every consumer on a slow one. Subscribers here are synchronous callbacks (they only push keys
//! into queues), invoked under the informer's lock so that a late subscriber's snapshot replay and
//! the live events that follow it never overlap or leave a gap.
//!
//! The store keeps each object as JSON bytes behind its key in one allocation ([`Entry`]), not
//! as a parsed tree: events carry the parsed state subscribers filter and map on, and only
//! transiently. A metadata-only informer keeps only each object's metadata.
//!
//! Owns: informers, their stores ([`entry`]), decoding ([`watched`]), and giving heap back
//! after bursts ([`heap`]). May call: `key` and the Kubernetes client — nothing that knows about
//! controllers, so caches stay testable on their own.

pub(crate) mod entry;
pub(crate) mod heap;
pub(crate) mod object;
pub(crate) mod watched;

use crate::informer::entry::{Entry, Form, encode_key};
use crate::informer::object::CachedObject;
use crate::informer::watched::WatchedObject;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use parking_lot::{Mutex, MutexGuard};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::watch as signal;

pub(crate) use crate::key::ObjectKey;

/// What one informer lists and watches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct InformerKey {
    /// API group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Plural resource name.
    pub plural: String,
    /// Whether the resource is namespaced.
    pub namespaced: bool,
    /// One namespace, or None for all.
    pub namespace: Option<String>,
    /// Server-side label selector, if any.
    pub label_selector: Option<String>,
    /// Watch metadata only (PartialObjectMetadata): owned kinds need nothing else.
    pub metadata_only: bool,
}

impl InformerKey {
    fn api_resource(&self) -> ApiResource {
        let api_version = if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        };
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version,
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }

    /// A short label for logs and metrics (never per object).
    pub(crate) fn label(&self) -> String {
        let gv = if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        };
        format!(
            "{gv}/{}{}{}{}",
            self.plural,
            self.namespace
                .as_deref()
                .map(|n| format!(" ns={n}"))
                .unwrap_or_default(),
            self.label_selector
                .as_deref()
                .map(|l| format!(" labels={l}"))
                .unwrap_or_default(),
            if self.metadata_only {
                " metadata-only"
            } else {
                ""
            }
        )
    }
}

/// A change seen by an informer, as subscribers receive it.
#[derive(Debug, Clone)]
pub(crate) enum CacheEvent {
    /// An object appeared. `initial` is true for objects delivered by a (re)list or by the replay
    /// a late subscriber gets, which dispatch treats as background work.
    Added {
        /// The object.
        object: Arc<Value>,
        /// From a list rather than a live watch event.
        initial: bool,
    },
    /// An object changed.
    Modified {
        /// Before.
        old: Arc<Value>,
        /// After.
        new: Arc<Value>,
    },
    /// An object is gone. `final_state_unknown` when the deletion was inferred from a relist.
    Deleted {
        /// Its last known state.
        object: Arc<Value>,
        /// The delete happened while the watch was down.
        final_state_unknown: bool,
    },
}

/// A subscriber callback. It runs under the informer's lock: it must be quick and must not call
/// back into the cache.
pub(crate) type Subscriber = Arc<dyn Fn(&CacheEvent) + Send + Sync>;

struct Store {
    /// What is kept of each object: all of it, or its metadata.
    form: Form,
    /// Ordered by key, so a page of a List is a range, not a scan of the whole cache.
    objects: BTreeSet<Entry>,
    /// By subscription id: removing one is O(log n) however many a registration made.
    subscribers: BTreeMap<u64, Subscriber>,
    /// Bytes of the objects held (their stored JSON, see [`Entry::stored_len`]): what the
    /// informer costs, for tenants' budgets.
    bytes: usize,
    /// The newest resourceVersion among the objects and deletions applied: the consistency point
    /// cached reads report.
    newest_rv: String,
    /// Objects received since the current (re)list began, in arrival order. Held as bytes too,
    /// so that a list of 100k objects never has them all parsed at once.
    relisting: Option<Vec<Entry>>,
}

/// One informer: its store, its subscribers and its watch task.
pub(crate) struct Informer {
    key: InformerKey,
    store: Mutex<Store>,
    synced: signal::Sender<bool>,
    relists: AtomicU64,
    watch_restarts: Arc<AtomicU64>,
    /// The latest list or watch error, kept until the first list completes: a registration
    /// waiting for this informer fails with it instead of waiting forever.
    first_list_error: Arc<Mutex<Option<String>>>,
    task: Mutex<Option<tokio::task::AbortHandle>>,
    /// What its first list may fill (None: unbounded, for the manager's own informers).
    budget: Option<Arc<ListBudget>>,
    /// Set when the first list overdrew `budget`: the informer stopped and holds nothing.
    over_budget: std::sync::atomic::AtomicBool,
}

/// Bytes the first lists of one registration may fill, shared by every informer it starts: a
/// tenant's cache budget is checked while the lists arrive, before the memory is spent, not
/// after (ten cluster-wide registrations once each listed the whole cluster, +530 MB, only to
/// be refused for exceeding a 16 MiB budget).
#[derive(Debug)]
pub(crate) struct ListBudget {
    left: std::sync::atomic::AtomicI64,
    limit: u64,
}

impl ListBudget {
    /// `left` bytes may still be listed, out of a tenant limit of `limit`.
    pub(crate) fn new(left: u64, limit: u64) -> Arc<Self> {
        Arc::new(ListBudget {
            left: std::sync::atomic::AtomicI64::new(i64::try_from(left).unwrap_or(i64::MAX)),
            limit,
        })
    }

    /// Spend `bytes`; false once the budget is overdrawn.
    fn spend(&self, bytes: usize) -> bool {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        self.left.fetch_sub(bytes, Ordering::Relaxed) - bytes >= 0
    }
}

/// Why an informer could not complete its first list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SyncError {
    /// The first list would have held more than the budget of the registration that started it.
    #[error(
        "the informer for {informer} was stopped during its first list: it would hold more than what is left of the tenant's cached_bytes limit of {limit} bytes"
    )]
    OverBudget {
        /// The informer's label.
        informer: String,
        /// The tenant's limit.
        limit: u64,
    },
    /// A list or watch request failed before the first list completed.
    #[error("the informer for {informer} could not list: {error}")]
    Failed {
        /// The informer's label.
        informer: String,
        /// The API server's error.
        error: String,
    },
    /// The first list did not complete in time.
    #[error("the informer for {informer} did not complete its first list within {waited:?}")]
    TimedOut {
        /// The informer's label.
        informer: String,
        /// How long it was given.
        waited: std::time::Duration,
    },
}

impl Store {
    fn new(form: Form) -> Self {
        Store {
            form,
            objects: BTreeSet::new(),
            subscribers: BTreeMap::new(),
            bytes: 0,
            newest_rv: String::new(),
            relisting: None,
        }
    }

    /// Remember `rv` if it is newer than what was seen. resourceVersions are opaque to clients,
    /// but every API server issues them as increasing integers; anything else is taken as is.
    fn note_rv(&mut self, rv: &str) {
        let newer = match (rv.parse::<u64>(), self.newest_rv.parse::<u64>()) {
            (Ok(new), Ok(old)) => new > old,
            _ => !rv.is_empty(),
        };
        if newer {
            self.newest_rv = rv.to_string();
        }
    }

    fn insert(&mut self, entry: Entry) -> Option<Entry> {
        self.bytes += entry.stored_len();
        let old = self.objects.replace(entry)?;
        self.bytes -= old.stored_len();
        Some(old)
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Entry> {
        let old = self.objects.take(encode_key(key).as_slice())?;
        self.bytes -= old.stored_len();
        Some(old)
    }

    /// The object `entry` holds, parsed.
    fn value(&self, entry: &Entry) -> Arc<Value> {
        Arc::new(entry.object(&self.form).value())
    }

    /// Store an object and announce it: Added if new, Modified if its resourceVersion moved,
    /// nothing if a relist saw it unchanged. `parsed` gives the new state as a tree, parsing the
    /// stored bytes only when an event needs it.
    fn upsert(
        &mut self,
        stored: Entry,
        parsed: impl FnOnce(&Self, &Entry) -> Arc<Value>,
        initial: bool,
    ) {
        let rv = stored.resource_version();
        self.note_rv(&rv);
        match self.insert(stored.clone()) {
            None => self.emit(&CacheEvent::Added {
                object: parsed(self, &stored),
                initial,
            }),
            Some(old) if old.resource_version() != rv => self.emit(&CacheEvent::Modified {
                old: self.value(&old),
                new: parsed(self, &stored),
            }),
            Some(_) => {}
        }
    }

    /// Apply a complete (re)list: announce as deleted what it no longer has, then store and
    /// announce what it has. The first list fills the empty store in one go (its nodes full,
    /// not half full as they are left by inserting keys in order).
    fn relisted(&mut self, listed: Vec<Entry>) {
        let listed = last_of_each_key(listed);
        if self.objects.is_empty() {
            for entry in &listed {
                self.note_rv(&entry.resource_version());
                self.bytes += entry.stored_len();
            }
            self.objects = listed.into_iter().collect();
            for entry in &self.objects {
                self.emit(&CacheEvent::Added {
                    object: self.value(entry),
                    initial: true,
                });
            }
            return;
        }
        // Diff the relist against the store so a relist after a 410 neither loses a deletion
        // nor re-announces unchanged objects as changes.
        let gone: Vec<ObjectKey> = self
            .objects
            .iter()
            .filter(|e| {
                listed
                    .binary_search_by(|l| l.key_bytes().cmp(e.key_bytes()))
                    .is_err()
            })
            .map(Entry::key)
            .collect();
        for key in gone {
            if let Some(old) = self.remove(&key) {
                self.emit(&CacheEvent::Deleted {
                    object: self.value(&old),
                    final_state_unknown: true,
                });
            }
        }
        for entry in listed {
            self.upsert(entry, Self::value, true);
        }
    }

    fn emit(&self, event: &CacheEvent) {
        for sub in self.subscribers.values() {
            sub(event);
        }
    }
}

impl Informer {
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock()
    }

    /// What this informer watches.
    pub(crate) fn key(&self) -> &InformerKey {
        &self.key
    }

    /// Objects held now.
    pub(crate) fn len(&self) -> usize {
        self.lock().objects.len()
    }

    /// Bytes of the objects held (their JSON).
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// How many times the watcher (re)listed, including the first list.
    pub(crate) fn relists(&self) -> u64 {
        self.relists.load(Ordering::Relaxed)
    }

    /// How many list or watch requests failed (each followed by a restart with backoff).
    pub(crate) fn watch_restarts(&self) -> u64 {
        self.watch_restarts.load(Ordering::Relaxed)
    }

    /// Whether the first list completed.
    pub(crate) fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Wait until the first list completed. Fails as soon as a list or watch request fails
    /// before that (the watcher keeps retrying, but whoever waits is told at once), or after
    /// `within`.
    pub(crate) async fn wait_synced(&self, within: std::time::Duration) -> Result<(), SyncError> {
        let mut synced = self.synced.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if *synced.borrow_and_update() {
                return Ok(());
            }
            if self.over_budget.load(Ordering::Relaxed) {
                return Err(SyncError::OverBudget {
                    informer: self.key.label(),
                    limit: self.budget.as_ref().map_or(0, |b| b.limit),
                });
            }
            if let Some(error) = self.first_list_error.lock().clone() {
                return Err(SyncError::Failed {
                    informer: self.key.label(),
                    error,
                });
            }
            // The watcher task records errors without a signal; a short poll is enough for a
            // wait that happens once per registration.
            let tick = tokio::time::sleep(std::time::Duration::from_millis(50));
            tokio::select! {
                _ = synced.changed() => {}
                _ = tick => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(SyncError::TimedOut { informer: self.key.label(), waited: within });
                }
            }
        }
    }

    /// One cached object.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<CachedObject> {
        let store = self.lock();
        store
            .objects
            .get(encode_key(&ObjectKey::new(namespace, name)).as_slice())
            .map(|e| e.object(&store.form))
    }

    /// At most `limit` cached objects after `after` (from the first when None), in key order,
    /// within `namespace` (None: all); and whether more follow. The cost is the range read,
    /// `O(log n + limit)` under the informer's lock, whatever the cache holds: the entries are
    /// shared, not copied (a metadata-only informer's objects are written out after the lock is
    /// released).
    pub(crate) fn range(
        &self,
        namespace: Option<&str>,
        after: Option<&ObjectKey>,
        limit: usize,
    ) -> (Vec<(ObjectKey, CachedObject)>, bool) {
        use std::ops::Bound;
        let first_of_namespace = namespace.map(|n| ObjectKey::new(n, ""));
        let start = match (after, &first_of_namespace) {
            (Some(a), Some(f)) if f > a => Bound::Included(encode_key(f)),
            (Some(a), _) => Bound::Excluded(encode_key(a)),
            (None, Some(f)) => Bound::Included(encode_key(f)),
            (None, None) => Bound::Unbounded,
        };
        let (entries, more, form) = {
            let store = self.lock();
            let mut within = store
                .objects
                .range::<[u8], _>((start.as_ref().map(Vec::as_slice), Bound::Unbounded))
                .take_while(|e| namespace.is_none_or(|n| n.as_bytes() == e.namespace_bytes()));
            let entries: Vec<Entry> = within.by_ref().take(limit).cloned().collect();
            (entries, within.next().is_some(), store.form.clone())
        };
        let out = entries.iter().map(|e| (e.key(), e.object(&form))).collect();
        (out, more)
    }

    /// The newest resourceVersion this cache applied ("" before anything was).
    pub(crate) fn newest_resource_version(&self) -> String {
        self.lock().newest_rv.clone()
    }

    /// Keys of every cached object.
    pub(crate) fn keys(&self) -> Vec<ObjectKey> {
        self.lock().objects.iter().map(Entry::key).collect()
    }

    /// Apply one watcher event; false when the informer must stop (its first list overdrew its
    /// budget: the partial list is dropped at once).
    fn apply(&self, event: Event<Value>) -> bool {
        let mut store = self.lock();
        match event {
            Event::Init => {
                store.relisting = Some(Vec::new());
            }
            Event::InitApply(obj) => {
                let entry = Entry::of_value(&obj, &store.form);
                if !self.is_synced()
                    && let Some(budget) = &self.budget
                    && !budget.spend(entry.stored_len())
                {
                    store.relisting = None;
                    drop(store);
                    self.over_budget.store(true, Ordering::Relaxed);
                    tracing::warn!(informer = %self.key.label(), limit = budget.limit, "first list stopped: over the cached-bytes budget of the registration that started it");
                    crate::informer::heap::release_after_burst();
                    return false;
                }
                if let Some(buf) = store.relisting.as_mut() {
                    buf.push(entry);
                }
            }
            Event::InitDone => {
                self.relists.fetch_add(1, Ordering::Relaxed);
                let listed = store.relisting.take().unwrap_or_default();
                store.relisted(listed);
                drop(store);
                crate::informer::heap::release_after_burst();
                self.first_list_error.lock().take();
                self.synced.send_replace(true);
            }
            Event::Apply(obj) => {
                let stored = Entry::of_value(&obj, &store.form);
                store.upsert(stored, |_, _| Arc::new(obj), false);
            }
            Event::Delete(obj) => {
                // The watch event carries the object's final state, newer than the stored one.
                if let Some(rv) = obj
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                {
                    store.note_rv(rv);
                }
                let key = ObjectKey::of(&obj);
                store.remove(&key);
                store.emit(&CacheEvent::Deleted {
                    object: Arc::new(obj),
                    final_state_unknown: false,
                });
            }
        }
        true
    }
}

/// `listed` sorted by key, the last received of each key kept (as a map filled in arrival order
/// would keep it).
fn last_of_each_key(mut listed: Vec<Entry>) -> Vec<Entry> {
    listed.reverse();
    // Stable: of equal keys, the last received comes first, and dedup keeps the first.
    listed.sort();
    listed.dedup();
    listed
}

/// Remove what no consumer needs and what would only cost memory: managedFields can be larger
/// than the rest of the object.
fn slim(mut v: Value) -> Value {
    if let Some(md) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        md.remove("managedFields");
    }
    v
}

fn api_version(key: &InformerKey) -> String {
    if key.group.is_empty() {
        key.version.clone()
    } else {
        format!("{}/{}", key.group, key.version)
    }
}

/// What an informer for `key` keeps of each object.
fn store_form(key: &InformerKey) -> Form {
    if key.metadata_only {
        Form::metadata(&api_version(key), &key.kind)
    } else {
        Form::Full
    }
}

/// A full object as the tree the caches keep: parsed once by [`WatchedObject`], managedFields
/// removed, apiVersion and kind first.
fn object_to_value(obj: WatchedObject, key: &InformerKey) -> Option<Value> {
    Some(obj.into_tree(&api_version(key), &key.kind)).filter(|v| !v.is_null())
}

/// Metadata-only objects (PartialObjectMetadata) through their Serialize impl.
fn partial_to_value(obj: PartialObjectMeta<DynamicObject>, key: &InformerKey) -> Option<Value> {
    to_value(&obj, key)
}

fn to_value<T: serde::Serialize>(obj: &T, key: &InformerKey) -> Option<Value> {
    let mut v = serde_json::to_value(obj).ok()?;
    if let Some(map) = v.as_object_mut() {
        map.insert("apiVersion".into(), Value::String(api_version(key)));
        map.insert("kind".into(), Value::String(key.kind.clone()));
    }
    Some(slim(v))
}

fn map_event<T>(
    event: Event<T>,
    key: &InformerKey,
    convert: fn(T, &InformerKey) -> Option<Value>,
) -> Option<Event<Value>> {
    Some(match event {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(o) => Event::InitApply(convert(o, key)?),
        Event::Apply(o) => Event::Apply(convert(o, key)?),
        Event::Delete(o) => Event::Delete(convert(o, key)?),
    })
}

/// The shared caches of one manager.
pub(crate) struct Cache {
    client: kube::Client,
    informers: Mutex<HashMap<InformerKey, (Arc<Informer>, usize)>>,
    next_id: AtomicU64,
}

/// A live subscription; dropping it unsubscribes and releases the informer.
pub(crate) struct Subscription {
    cache: Weak<Cache>,
    key: InformerKey,
    id: u64,
    informer: Arc<Informer>,
}

impl Subscription {
    /// The informer this subscription reads from.
    pub(crate) fn informer(&self) -> &Arc<Informer> {
        &self.informer
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.informer.lock().subscribers.remove(&self.id);
        if let Some(cache) = self.cache.upgrade() {
            cache.release(&self.key);
        }
    }
}

impl Cache {
    /// A cache reading through `client`.
    pub(crate) fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Cache {
            client,
            informers: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        })
    }

    fn informers(&self) -> MutexGuard<'_, HashMap<InformerKey, (Arc<Informer>, usize)>> {
        self.informers.lock()
    }

    /// Subscribe to an informer, starting it if this is its first subscriber. The current
    /// snapshot is replayed to `subscriber` as initial `Added` events before any live event.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        key: InformerKey,
        subscriber: Subscriber,
    ) -> Subscription {
        self.subscribe_within(key, subscriber, None)
    }

    /// [`Cache::subscribe`]; an informer it starts stops during its first list once that list
    /// overdraws `budget`.
    pub(crate) fn subscribe_within(
        self: &Arc<Self>,
        key: InformerKey,
        subscriber: Subscriber,
        budget: Option<Arc<ListBudget>>,
    ) -> Subscription {
        let informer = {
            let mut informers = self.informers();
            let entry = informers
                .entry(key.clone())
                .or_insert_with(|| (self.start(key.clone(), budget), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut store = informer.lock();
            for entry in &store.objects {
                subscriber(&CacheEvent::Added {
                    object: store.value(entry),
                    initial: true,
                });
            }
            store.subscribers.insert(id, subscriber);
        }
        Subscription {
            cache: Arc::downgrade(self),
            key,
            id,
            informer,
        }
    }

    /// Every running informer, for status and metrics.
    pub(crate) fn all(&self) -> Vec<Arc<Informer>> {
        self.informers().values().map(|(i, _)| i.clone()).collect()
    }

    fn release(&self, key: &InformerKey) {
        let mut informers = self.informers();
        let Some(entry) = informers.get_mut(key) else {
            return;
        };
        entry.1 = entry.1.saturating_sub(1);
        if entry.1 == 0 {
            if let Some(task) = entry.0.task.lock().take() {
                task.abort();
            }
            tracing::info!(informer = %key.label(), "informer stopped: no subscribers left");
            informers.remove(key);
        }
    }

    /// Whether an informer for `key` runs now.
    pub(crate) fn is_running(&self, key: &InformerKey) -> bool {
        self.informers().contains_key(key)
    }

    fn start(&self, key: InformerKey, budget: Option<Arc<ListBudget>>) -> Arc<Informer> {
        let (synced, _) = signal::channel(false);
        let informer = Arc::new(Informer {
            key: key.clone(),
            store: Mutex::new(Store::new(store_form(&key))),
            synced,
            relists: AtomicU64::new(0),
            watch_restarts: Arc::new(AtomicU64::new(0)),
            first_list_error: Arc::new(Mutex::new(None)),
            task: Mutex::new(None),
            budget,
            over_budget: std::sync::atomic::AtomicBool::new(false),
        });
        let ar = key.api_resource();
        let api: Api<WatchedObject> = match (&key.namespace, key.namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        };
        let mut config = watcher::Config::default().page_size(LIST_PAGE_SIZE);
        if let Some(sel) = &key.label_selector {
            config = config.labels(sel);
        }
        let weak = Arc::downgrade(&informer);
        let label = key.label();
        let client = self.client.clone();
        let failures = Failures {
            restarts: informer.watch_restarts.clone(),
            first_list: informer.first_list_error.clone(),
            synced: informer.synced.subscribe(),
        };
        tracing::info!(informer = %label, "informer started");
        let task = tokio::spawn(async move {
            let mut stream = if key.metadata_only {
                let api: Api<PartialObjectMeta<DynamicObject>> =
                    match (&key.namespace, key.namespaced) {
                        (Some(ns), true) => Api::namespaced_with(client.clone(), ns, &ar),
                        _ => Api::all_with(client.clone(), &ar),
                    };
                as_values(api, config, key.clone(), failures, partial_to_value)
            } else {
                as_values(api, config, key.clone(), failures, object_to_value)
            };
            while let Some(event) = stream.next().await {
                let Some(informer) = weak.upgrade() else {
                    break;
                };
                if !informer.apply(event) {
                    break;
                }
            }
            tracing::debug!(informer = %label, "informer stream ended");
        });
        *informer.task.lock() = Some(task.abort_handle());
        informer
    }
}

/// Objects per list request. A page is decoded whole before its objects can be charged to a
/// budget, so it is what a first list may hold beyond its budget: 100 objects (kube's default
/// is 500), at most 150 MiB at the API server's 1.5 MiB object limit, a few hundred KB for
/// typical objects; 100,000 objects still list in 1,000 requests.
pub(crate) const LIST_PAGE_SIZE: u32 = 100;

/// Where a watcher's errors are recorded.
struct Failures {
    restarts: Arc<AtomicU64>,
    /// Set on an error before the first list completed.
    first_list: Arc<Mutex<Option<String>>>,
    synced: signal::Receiver<bool>,
}

impl Failures {
    fn record(&self, key: &InformerKey, error: &watcher::Error) {
        let n = self.restarts.fetch_add(1, Ordering::Relaxed);
        if !*self.synced.borrow() {
            *self.first_list.lock() = Some(error.to_string());
        }
        // One line per error would be a line per backoff step forever for an informer that
        // cannot list: the first, then every 64th (the count is ctrlhub_informer_watch_restarts).
        if n.is_multiple_of(64) {
            tracing::warn!(informer = %key.label(), error = %error, failures = n + 1, "watch error; the watcher retries with backoff");
        }
    }
}

/// A watcher over `api` with kube's default backoff, as JSON values with apiVersion and kind set.
fn as_values<K>(
    api: Api<K>,
    config: watcher::Config,
    key: InformerKey,
    failures: Failures,
    convert: fn(K, &InformerKey) -> Option<Value>,
) -> futures::stream::BoxStream<'static, Event<Value>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, config)
        .default_backoff()
        .filter_map(move |r| {
            let event = match r {
                Ok(event) => map_event(event, &key, convert),
                Err(e) => {
                    failures.record(&key, &e);
                    None
                }
            };
            std::future::ready(event)
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> InformerKey {
        InformerKey {
            group: "example.com".into(),
            version: "v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
            namespaced: true,
            namespace: None,
            label_selector: None,
            metadata_only: false,
        }
    }

    /// An informer that is not watching anything, fed by hand.
    fn informer(budget: Option<Arc<ListBudget>>) -> Informer {
        informer_of(key(), budget)
    }

    /// [`informer`] of `key`.
    fn informer_of(key: InformerKey, budget: Option<Arc<ListBudget>>) -> Informer {
        let (synced, _) = signal::channel(false);
        Informer {
            store: Mutex::new(Store::new(store_form(&key))),
            key,
            synced,
            relists: AtomicU64::new(0),
            watch_restarts: Arc::new(AtomicU64::new(0)),
            first_list_error: Arc::new(Mutex::new(None)),
            task: Mutex::new(None),
            budget,
            over_budget: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn widget(i: usize, pad: usize) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": format!("w{i}"), "namespace": "ns", "resourceVersion": "1"},
            "spec": {"pad": "x".repeat(pad)}})
    }

    #[tokio::test]
    async fn a_first_list_stops_when_it_overdraws_its_budget_and_keeps_nothing() {
        let budget = ListBudget::new(10_000, 16 << 20);
        let i = informer(Some(budget));
        assert!(i.apply(Event::Init));
        let accepted = (0..100)
            .take_while(|n| i.apply(Event::InitApply(widget(*n, 1_000))))
            .count();
        assert!(
            (8..=10).contains(&accepted),
            "about ten 1 KB objects fit 10,000 bytes: {accepted}"
        );
        assert!(i.lock().relisting.is_none(), "the partial list is dropped");
        assert_eq!(i.len(), 0);
        let e = i
            .wait_synced(std::time::Duration::from_secs(5))
            .await
            .expect_err("over budget");
        assert!(
            matches!(e, SyncError::OverBudget { limit, .. } if limit == 16 << 20),
            "{e}"
        );
    }

    #[test]
    fn a_synced_informer_is_not_stopped_by_the_budget_of_its_first_list() {
        let i = informer(Some(ListBudget::new(2_000, 2_000)));
        assert!(i.apply(Event::Init));
        assert!(i.apply(Event::InitApply(widget(0, 1_000))));
        assert!(i.apply(Event::InitDone));
        assert!(i.is_synced());
        // A relist after a 410 re-lists what the cache already holds and may grow: the
        // registration that started it was admitted, and later growth is the tenant's to
        // watch on the status page, not a reason to drop a live cache.
        assert!(i.apply(Event::Init));
        for n in 0..10 {
            assert!(i.apply(Event::InitApply(widget(n, 1_000))));
        }
        assert!(i.apply(Event::InitDone));
        assert_eq!(i.len(), 10);
    }

    #[test]
    fn a_range_reads_one_namespace_after_a_key_and_says_whether_more_follow() {
        let i = informer(None);
        assert!(i.apply(Event::Init));
        for (ns, name) in [("a", "1"), ("b", "1"), ("b", "2"), ("b", "3"), ("c", "1")] {
            let o = json!({"metadata": {"namespace": ns, "name": name, "resourceVersion": "1"}});
            assert!(i.apply(Event::InitApply(o)));
        }
        assert!(i.apply(Event::InitDone));
        let names = |v: Vec<(ObjectKey, CachedObject)>| -> Vec<String> {
            v.into_iter().map(|(k, _)| k.to_string()).collect()
        };
        let (page, more) = i.range(Some("b"), None, 2);
        assert_eq!(names(page), ["b/1", "b/2"]);
        assert!(more);
        let (page, more) = i.range(Some("b"), Some(&ObjectKey::new("b", "2")), 2);
        assert_eq!(names(page), ["b/3"]);
        assert!(!more, "c/1 is another namespace");
        let (page, _) = i.range(Some("b"), Some(&ObjectKey::new("a", "1")), 10);
        assert_eq!(
            names(page).len(),
            3,
            "a key before the namespace starts at its first"
        );
        let (page, more) = i.range(None, Some(&ObjectKey::new("b", "3")), 10);
        assert_eq!(names(page), ["c/1"]);
        assert!(!more);
    }

    /// An owned Widget as the API server serves it, managedFields removed: metadata filled in
    /// by the server, labels, an annotation and a spec.
    fn served_widget(i: usize, rv: u64) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": format!("w-{i:06}"), "namespace": "mem-100000",
                "uid": format!("6c0e1b2a-0000-4000-8000-{i:012}"), "resourceVersion": rv.to_string(),
                "generation": 1, "creationTimestamp": "2026-11-26T19:00:00Z",
                "labels": {"app.kubernetes.io/name": "widget", "app.kubernetes.io/part-of": "ctrlhub-bench", "tier": "backend"},
                "annotations": {"bench.ctrlhub.io/ts": "1795000000000000"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u", "controller": true}]},
            "spec": {"replicas": 3, "image": "registry.example.com/widgets/widget:1.2.3", "size": "medium",
                "ports": [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}],
                "env": {"LOG_LEVEL": "info", "REGION": "eu-west-1"}, "paused": false,
                "owner": "team-widgets", "tags": ["bench", "widget", "ctrlhub"]}})
    }

    /// What a client reads of a metadata-only object: apiVersion, kind and metadata.
    fn partial(v: &Value) -> Value {
        json!({"apiVersion": v["apiVersion"], "kind": v["kind"], "metadata": v["metadata"]})
    }

    fn metadata_only_informer(budget: Option<Arc<ListBudget>>) -> Informer {
        informer_of(
            InformerKey {
                metadata_only: true,
                ..key()
            },
            budget,
        )
    }

    /// Events as (kind, object, final_state_unknown).
    type Seen = Arc<Mutex<Vec<(&'static str, Value, bool)>>>;

    /// Every event `i` announces from now on.
    fn record(i: &Informer) -> Seen {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let sub: Subscriber = Arc::new(move |e: &CacheEvent| {
            let row = match e {
                CacheEvent::Added { object, .. } => ("added", (**object).clone(), false),
                CacheEvent::Modified { old, new } => {
                    ("modified", json!({"old": **old, "new": **new}), false)
                }
                CacheEvent::Deleted {
                    object,
                    final_state_unknown,
                } => ("deleted", (**object).clone(), *final_state_unknown),
            };
            into.lock().push(row);
        });
        i.lock().subscribers.insert(1, sub);
        seen
    }

    /// The cost of one metadata-only object, pinned: what it is charged is its metadata, less
    /// than the PartialObjectMetadata JSON a client reads (the informer's apiVersion and kind
    /// are kept once, not per object), and nothing of its spec. 100 objects, so that a
    /// per-object regression shows whatever the fixed costs.
    #[test]
    fn a_metadata_only_object_costs_its_metadata_json() {
        let budget = ListBudget::new(1 << 20, 1 << 20);
        let i = metadata_only_informer(Some(budget.clone()));
        assert!(i.apply(Event::Init));
        for n in 0..100 {
            assert!(i.apply(Event::InitApply(served_widget(n, 5))));
        }
        assert!(i.apply(Event::InitDone));
        let client = serde_json::to_vec(&partial(&served_widget(0, 5)))
            .expect("serializes")
            .len();
        let metadata = serde_json::to_vec(&served_widget(0, 5)["metadata"])
            .expect("serializes")
            .len();
        let per_object = i.bytes() / 100;
        assert_eq!(i.bytes() % 100, 0, "every object is charged the same");
        // `{"metadata":` and `}` around the metadata itself.
        assert_eq!(per_object, metadata + 13);
        assert!(
            per_object + 40 <= client,
            "{per_object} B charged for a {client} B PartialObjectMetadata"
        );
        assert_eq!(
            budget.left.load(Ordering::Relaxed),
            (1 << 20) - i64::try_from(i.bytes()).expect("small")
        );
        let full = informer(None);
        assert!(full.apply(Event::Init));
        assert!(full.apply(Event::InitApply(served_widget(0, 5))));
        assert!(full.apply(Event::InitDone));
        assert!(full.bytes() > per_object + 250, "the spec is not kept");
    }

    #[test]
    fn metadata_only_reads_and_events_carry_apiversion_kind_and_metadata() {
        let i = metadata_only_informer(None);
        let seen = record(&i);
        assert!(i.apply(Event::Init));
        for n in 0..3 {
            assert!(i.apply(Event::InitApply(served_widget(n, 5))));
        }
        assert!(i.apply(Event::InitDone));
        let want = |n, rv| partial(&served_widget(n, rv));
        let got = i.get("mem-100000", "w-000001").expect("cached");
        assert_eq!(got.value(), want(1, 5));
        assert_eq!(got.resource_version(), "5");
        assert_eq!(
            got.json(),
            serde_json::to_vec(&want(1, 5)).expect("serializes"),
            "apiVersion, kind, metadata in that order"
        );
        assert_eq!(
            got.labels().and_then(|l| l.get("tier").cloned()),
            Some(json!("backend"))
        );
        let (page, more) = i.range(Some("mem-100000"), None, 2);
        assert!(more);
        assert_eq!(page.len(), 2);
        assert_eq!(page[1].0, ObjectKey::new("mem-100000", "w-000001"));
        assert_eq!(page[1].1, got);
        assert_eq!(i.newest_resource_version(), "5");
        // A live change, then a relist after a 410 that misses w-000000 and changed w-000002.
        assert!(i.apply(Event::Apply(served_widget(1, 6))));
        assert!(i.apply(Event::Init));
        assert!(i.apply(Event::InitApply(served_widget(1, 6))));
        assert!(i.apply(Event::InitApply(served_widget(2, 7))));
        assert!(i.apply(Event::InitDone));
        let seen = seen.lock().clone();
        let kinds: Vec<&str> = seen.iter().map(|(k, _, _)| *k).collect();
        assert_eq!(
            kinds,
            ["added", "added", "added", "modified", "deleted", "modified"]
        );
        assert_eq!(seen[3].1["old"], want(1, 5));
        assert_eq!(
            seen[3].1["new"],
            served_widget(1, 6),
            "the live event's own state"
        );
        assert_eq!(seen[4].1, want(0, 5));
        assert!(
            seen[4].2,
            "a deletion seen by a relist is final-state-unknown"
        );
        assert_eq!(seen[5].1, json!({"old": want(2, 5), "new": want(2, 7)}));
        assert_eq!(i.len(), 2);
        assert_eq!(i.newest_resource_version(), "7");
        let one = i.bytes() / 2;
        assert!(i.apply(Event::Delete(served_widget(2, 8))));
        assert_eq!(i.bytes(), one);
        assert_eq!(i.keys(), [ObjectKey::new("mem-100000", "w-000001")]);
    }

    #[test]
    fn a_list_that_names_an_object_twice_keeps_the_last() {
        let i = informer(None);
        assert!(i.apply(Event::Init));
        assert!(i.apply(Event::InitApply(served_widget(0, 5))));
        assert!(i.apply(Event::InitApply(served_widget(0, 6))));
        assert!(i.apply(Event::InitDone));
        assert_eq!(i.len(), 1);
        assert_eq!(
            i.get("mem-100000", "w-000000")
                .map(|o| o.resource_version()),
            Some("6".to_string())
        );
        assert_eq!(
            i.bytes(),
            serde_json::to_vec(&served_widget(0, 6))
                .expect("serializes")
                .len()
        );
    }

    #[test]
    fn full_objects_keep_every_field_but_managed_fields() {
        let body = json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "7",
                "labels": {"a": "b"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"size": 3, "tags": ["x", "y"]},
            "status": {"ready": true}
        });
        let obj: WatchedObject = serde_json::from_value(body).expect("a WatchedObject");
        let v = object_to_value(obj, &key()).expect("converted");
        assert_eq!(
            v,
            json!({
                "apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "7",
                    "labels": {"a": "b"}},
                "spec": {"size": 3, "tags": ["x", "y"]},
                "status": {"ready": true}
            })
        );
        let order: Vec<&str> = v
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(order, ["apiVersion", "kind", "metadata", "spec", "status"]);
    }

    #[test]
    fn metadata_only_objects_get_api_version_and_kind() {
        let body = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "w", "namespace": "ns",
                "managedFields": [{"manager": "kubectl"}]}});
        let obj: PartialObjectMeta<DynamicObject> =
            serde_json::from_value(body).expect("a PartialObjectMeta");
        let v = partial_to_value(obj, &key()).expect("converted");
        assert_eq!(v["apiVersion"], "example.com/v1");
        assert_eq!(v["kind"], "Widget");
        assert_eq!(v["metadata"]["name"], "w");
        assert!(v["metadata"].get("managedFields").is_none());
    }
}
