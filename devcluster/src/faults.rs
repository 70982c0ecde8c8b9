//! Fault injection and request statistics, for reliability tests of everything built on devcluster.
//!
//! The same handle backs the Rust API and the `/_devcluster/` admin endpoints, so in-process and
//! out-of-process tests inject identical faults.

use crate::storage::Store;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, Clone)]
struct FailRule {
    verb: String,
    resource: String,
    remaining: u32,
    code: u16,
}

#[derive(Debug, Clone)]
struct LatencyRule {
    verb: String,
    resource: String,
    delay: Duration,
}

#[derive(Default)]
struct Rules {
    fail: Vec<FailRule>,
    latency: Vec<LatencyRule>,
    frozen_leases: Vec<(String, String)>,
    requests: HashMap<(String, String), u64>,
}

pub(crate) struct Shared {
    rules: Mutex<Rules>,
    close_watches: watch::Sender<u64>,
    watches_open: AtomicUsize,
    store: Store,
}

/// The fault-injection handle. Cheap to clone; every clone controls the same server.
#[derive(Clone)]
pub struct Faults {
    pub(crate) shared: Arc<Shared>,
}

/// Request counters, by verb and resource.
#[derive(Clone)]
pub struct Stats {
    shared: Arc<Shared>,
}

fn matches(rule_verb: &str, rule_resource: &str, verb: &str, resource: &str) -> bool {
    (rule_verb == "*" || rule_verb == verb) && (rule_resource == "*" || rule_resource == resource)
}

impl Faults {
    pub(crate) fn new(store: Store) -> Self {
        let (close_watches, _) = watch::channel(0);
        Faults {
            shared: Arc::new(Shared {
                rules: Mutex::new(Rules::default()),
                close_watches,
                watches_open: AtomicUsize::new(0),
                store,
            }),
        }
    }

    fn rules(&self) -> parking_lot::MutexGuard<'_, Rules> {
        self.shared.rules.lock()
    }

    /// End every open watch stream now; clients see the connection close and must resume.
    pub fn close_watches(&self) {
        self.shared.close_watches.send_modify(|n| *n += 1);
    }

    /// Drop the watch history: resuming from any resourceVersion older than the current one gets
    /// an in-stream 410 Expired, as after etcd compaction (the current one stays watchable, so a
    /// client that relists can resume).
    pub fn compact(&self) {
        self.shared.store.lock().compact();
    }

    /// Make the next `count` requests matching `verb` and `resource` (`*` for any) fail with `code`.
    pub fn fail_next(&self, verb: &str, resource: &str, count: u32, code: u16) {
        self.rules().fail.push(FailRule {
            verb: verb.into(),
            resource: resource.into(),
            remaining: count,
            code,
        });
    }

    /// Delay every request matching `verb` and `resource` (`*` for any) by `delay`.
    pub fn add_latency(&self, verb: &str, resource: &str, delay: Duration) {
        self.rules().latency.push(LatencyRule {
            verb: verb.into(),
            resource: resource.into(),
            delay,
        });
    }

    /// Make writes to one Lease fail with 503, like a leader cut off from the API server.
    pub fn freeze_lease(&self, namespace: &str, name: &str) {
        let mut rules = self.rules();
        let key = (namespace.to_string(), name.to_string());
        if !rules.frozen_leases.contains(&key) {
            rules.frozen_leases.push(key);
        }
    }

    /// Undo [`Faults::freeze_lease`].
    pub fn unfreeze_lease(&self, namespace: &str, name: &str) {
        self.rules()
            .frozen_leases
            .retain(|(n, m)| !(n == namespace && m == name));
    }

    /// Remove every injected failure, latency and frozen lease.
    pub fn clear(&self) {
        let mut rules = self.rules();
        rules.fail.clear();
        rules.latency.clear();
        rules.frozen_leases.clear();
    }

    /// Statistics view of the same server.
    pub fn stats(&self) -> Stats {
        Stats {
            shared: self.shared.clone(),
        }
    }

    pub(crate) fn close_signal(&self) -> watch::Receiver<u64> {
        self.shared.close_watches.subscribe()
    }

    pub(crate) fn watch_opened(&self) -> WatchGuard {
        self.shared.watches_open.fetch_add(1, Ordering::SeqCst);
        WatchGuard {
            shared: self.shared.clone(),
        }
    }

    /// Count a request that no fault applies to (discovery: `get` on resource `discovery`).
    pub(crate) fn count(&self, verb: &str, resource: &str) {
        *self
            .rules()
            .requests
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += 1;
    }

    /// Count the request and decide its fate: an injected error code, and a delay to sleep first.
    pub(crate) fn on_request(
        &self,
        verb: &str,
        resource: &str,
        lease: Option<(&str, &str)>,
    ) -> (Option<u16>, Duration) {
        let mut rules = self.rules();
        *rules
            .requests
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += 1;
        let delay = rules
            .latency
            .iter()
            .filter(|r| matches(&r.verb, &r.resource, verb, resource))
            .map(|r| r.delay)
            .max()
            .unwrap_or_default();
        let is_write = matches!(verb, "create" | "update" | "patch" | "delete");
        if is_write
            && let Some((ns, name)) = lease
            && rules
                .frozen_leases
                .iter()
                .any(|(n, m)| n == ns && m == name)
        {
            return (Some(503), delay);
        }
        let mut code = None;
        for rule in rules.fail.iter_mut() {
            if rule.remaining > 0 && matches(&rule.verb, &rule.resource, verb, resource) {
                rule.remaining -= 1;
                code = Some(rule.code);
                break;
            }
        }
        rules.fail.retain(|r| r.remaining > 0);
        (code, delay)
    }
}

/// Decrements the open-watch gauge when a watch stream ends.
pub(crate) struct WatchGuard {
    shared: Arc<Shared>,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.shared.watches_open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Stats {
    /// How many requests of `verb` on `resource` were served (`*` sums over that position).
    pub fn request_count(&self, verb: &str, resource: &str) -> u64 {
        let rules = self.shared.rules.lock();
        rules
            .requests
            .iter()
            .filter(|((v, r), _)| matches(verb, resource, v, r))
            .map(|(_, n)| *n)
            .sum()
    }

    /// Watches streaming right now.
    pub fn watches_open(&self) -> usize {
        self.shared.watches_open.load(Ordering::SeqCst)
    }

    /// Objects stored right now.
    pub fn objects(&self) -> usize {
        self.shared.store.lock().object_count()
    }

    /// All counters as JSON, for the admin endpoint.
    pub fn to_json(&self) -> serde_json::Value {
        let rules = self.shared.rules.lock();
        let requests: serde_json::Map<String, serde_json::Value> = rules
            .requests
            .iter()
            .map(|((v, r), n)| (format!("{v}/{r}"), serde_json::json!(n)))
            .collect();
        drop(rules);
        serde_json::json!({"requests": requests, "watchesOpen": self.watches_open(), "objects": self.objects()})
    }
}
