//! Kubernetes Events (`events.k8s.io/v1`) about objects, as client-go's recorder posts them:
//! aggregated into series, rate-limited per object, and never in the reconcile's way.
//!
//! Every reconcile has a recorder, [`Request::events`](crate::Request::events):
//!
//! ```no_run
//! # use ctrlhub_sdk::{Action, ReconcileError, Request};
//! # use k8s_openapi::api::core::v1::ConfigMap;
//! async fn reconcile(req: Request<ConfigMap>) -> Result<Action, ReconcileError> {
//!     if let Some(cm) = &req.object {
//!         req.events().info(cm, "Synced", "copied 3 keys");
//!     }
//!     Ok(Action::done())
//! }
//! ```
//!
//! - **Who reports**: `reportingController` is `ctrlhub.io/<controller name>`,
//!   `reportingInstance` the pod's name (`POD_NAME`, else the host name).
//! - **Failures are posted for you**: a reconcile that fails (an error or a panic) posts a
//!   Warning with reason `ReconcileFailed` and the error's message about the request's object,
//!   except when the request carries no object and when the error is the primary's own
//!   NotFound (it is gone).
//! - **Aggregation**: the same object, type, reason and message again within 10 minutes
//!   increments `series.count` (and `series.lastObservedTime`) of the Event already posted
//!   instead of creating another.
//! - **Rate limits**: at most 25 Events per object in a burst, then one every 5 minutes (a
//!   token bucket per object, like client-go's spam filter); the rest are dropped.
//! - **Never blocking**: [`EventRecorder::info`] and [`EventRecorder::warning`] queue the
//!   Event and return at once; one background task posts them in order. A failed post is
//!   logged at DEBUG, and at WARN at most once a minute; it never fails a reconcile.
//!
//! The controller needs RBAC to `create` and `patch` `events` in the `events.k8s.io` group in
//! its objects' namespaces (`default` for cluster-scoped objects).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Normal or Warning.
pub use kube::runtime::events::EventType;

/// How long the same Event aggregates into one series (client-go: 10 minutes).
pub const SERIES_WINDOW: Duration = Duration::from_secs(10 * 60);
/// Events one object may get at once before the rate limit applies (client-go: 25).
pub const BURST: u32 = 25;
/// After a burst, one Event per object this often (client-go: every 5 minutes).
pub const REFILL_EVERY: Duration = Duration::from_secs(5 * 60);
/// Events waiting to be posted; more are dropped (client-go's broadcaster keeps 1000).
const QUEUE: usize = 1000;
/// At most this many series and buckets are remembered (the oldest are forgotten first).
const REMEMBERED: usize = 4096;
/// The longest note the API server takes.
const MAX_NOTE: usize = 1024;

/// Records Events about objects for one controller (see the module docs). Cheap to clone;
/// clones share the queue, the series and the rate limits.
#[derive(Clone)]
pub struct EventRecorder {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("EventRecorder");
        if let Some(inner) = &self.inner {
            d.field("controller", &inner.reporter.controller)
                .field("instance", &inner.reporter.instance);
        }
        d.finish_non_exhaustive()
    }
}

struct Inner {
    client: Client,
    reporter: Reporter,
    queue: OnceLock<mpsc::Sender<Post>>,
}

/// Who posts the Events.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reporter {
    controller: String,
    instance: String,
}

/// One Event to post.
#[derive(Clone, Debug)]
struct Post {
    regarding: ObjectReference,
    type_: EventType,
    reason: String,
    note: String,
}

impl EventRecorder {
    /// A recorder posting with `client` as controller `controller` (`reportingController`
    /// `ctrlhub.io/<controller>`). Every [`Request::events`](crate::Request::events) is one
    /// already, for the controller's client.
    pub fn new(client: Client, controller: &str) -> Self {
        Self {
            inner: Some(Arc::new(Inner {
                client,
                reporter: Reporter {
                    controller: format!("ctrlhub.io/{controller}"),
                    instance: instance(controller),
                },
                queue: OnceLock::new(),
            })),
        }
    }

    /// A recorder that posts nothing (a controller without a Kubernetes client).
    pub(crate) fn disabled() -> Self {
        Self { inner: None }
    }

    /// Posts a Normal Event about `obj` (a PascalCase `reason`, a human-readable `message`).
    /// Returns at once; see the module docs.
    pub fn info<K>(&self, obj: &K, reason: &str, message: impl Into<String>)
    where
        K: Resource<DynamicType = ()>,
    {
        self.post(obj.object_ref(&()), EventType::Normal, reason, message);
    }

    /// Posts a Warning Event about `obj`. Returns at once; see the module docs.
    pub fn warning<K>(&self, obj: &K, reason: &str, message: impl Into<String>)
    where
        K: Resource<DynamicType = ()>,
    {
        self.post(obj.object_ref(&()), EventType::Warning, reason, message);
    }

    /// Posts an Event about the object `regarding` names (any kind, also one only known at
    /// run time). Returns at once; see the module docs.
    pub fn post(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let Some(inner) = &self.inner else {
            debug!(
                reason,
                "event not posted: the controller has no Kubernetes client"
            );
            return;
        };
        let post = Post {
            regarding,
            type_,
            reason: reason.to_owned(),
            note: truncate(message.into(), MAX_NOTE),
        };
        let queue = inner
            .queue
            .get_or_init(|| spawn_poster(inner.clone_parts()));
        if let Err(err) = queue.try_send(post) {
            complain(&format!("event dropped: {err}"));
        }
    }
}

impl Inner {
    fn clone_parts(&self) -> (Client, Reporter) {
        (self.client.clone(), self.reporter.clone())
    }
}

/// Starts the task that posts queued Events in order; without a tokio runtime, Events are
/// dropped (the queue's receiver is gone).
fn spawn_poster((client, reporter): (Client, Reporter)) -> mpsc::Sender<Post> {
    let (tx, mut rx) = mpsc::channel::<Post>(QUEUE);
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        complain("events are not posted: no tokio runtime");
        return tx;
    };
    runtime.spawn(async move {
        let mut correlator = Correlator::default();
        while let Some(post) = rx.recv().await {
            let (now, wall) = (Instant::now(), jiff::Timestamp::now());
            match correlator.decide(&post, now) {
                Decision::Drop => {
                    debug!(reason = %post.reason, object = ?post.regarding.name, "event dropped by the per-object rate limit");
                }
                Decision::Create => {
                    match create(&client, &reporter, &post, wall).await {
                        Ok((namespace, name)) => correlator.created(&post, now, namespace, name),
                        Err(err) => complain(&format!("posting event {}: {err}", post.reason)),
                    }
                }
                Decision::Increment {
                    namespace,
                    name,
                    count,
                } => {
                    let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
                    let series = json!({ "series": EventSeries {
                        count,
                        last_observed_time: MicroTime(wall),
                    }});
                    let (params, patch) = (PatchParams::default(), Patch::Merge(&series));
                    let call = api.patch(&name, &params, &patch);
                    match crate::traces::k8s_call("PATCH", "events", &namespace, &name, call).await {
                        Ok(_) => correlator.incremented(&post, now, count),
                        // Expired or deleted meanwhile: start a new series.
                        Err(err) if crate::is_not_found(&err) => {
                            correlator.forget(&post);
                            match create(&client, &reporter, &post, wall).await {
                                Ok((ns, n)) => correlator.created(&post, now, ns, n),
                                Err(err) => complain(&format!("posting event {}: {err}", post.reason)),
                            }
                        }
                        Err(err) => complain(&format!("updating event {name}: {err}")),
                    }
                }
            }
        }
    });
    tx
}

/// Creates the first Event of a series; returns its namespace and name.
async fn create(
    client: &Client,
    reporter: &Reporter,
    post: &Post,
    now: jiff::Timestamp,
) -> Result<(String, String), kube::Error> {
    let regarding = &post.regarding;
    let namespace = regarding
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into());
    let object = regarding.name.as_deref().unwrap_or("object");
    let name = format!("{object}.{:x}", now.as_nanosecond());
    let event = Event {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some(post.reason.clone()),
        reason: Some(post.reason.clone()),
        note: Some(post.note.clone()),
        type_: Some(
            match post.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        regarding: Some(regarding.clone()),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(reporter.instance.clone()),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let params = PostParams::default();
    let call = api.create(&params, &event);
    crate::traces::k8s_call("POST", "events", &namespace, &name, call).await?;
    Ok((namespace, name))
}

/// A failed post: at DEBUG always, at WARN at most once a minute (process-wide).
fn complain(what: &str) {
    static LAST_WARN: Mutex<Option<Instant>> = Mutex::new(None);
    let now = Instant::now();
    let loud = {
        let mut last = LAST_WARN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let loud = last.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(60));
        if loud {
            *last = Some(now);
        }
        loud
    };
    if loud {
        warn!(
            "{what} (Events are best effort; further failures within a minute are logged at DEBUG)"
        );
    } else {
        debug!("{what}");
    }
}

/// The reporting instance: the pod's name, else the host name, else the controller.
fn instance(controller: &str) -> String {
    ["POD_NAME", "HOSTNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| controller.to_owned())
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

/// The object an Event is about.
type ObjectId = (String, String, String, String, String);

fn object_id(r: &ObjectReference) -> ObjectId {
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    (
        s(&r.api_version),
        s(&r.kind),
        s(&r.namespace),
        s(&r.name),
        s(&r.uid),
    )
}

/// Which Events are the same: object, type, reason and message.
type SeriesKey = (ObjectId, bool, String, String);

fn series_key(post: &Post) -> SeriesKey {
    (
        object_id(&post.regarding),
        post.type_ == EventType::Warning,
        post.reason.clone(),
        post.note.clone(),
    )
}

/// An Event already posted.
#[derive(Clone, Debug)]
struct Seen {
    namespace: String,
    name: String,
    count: i32,
    last: Instant,
}

/// A token bucket of one object.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// What to do with a post.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// Over the object's rate limit.
    Drop,
    /// A new Event.
    Create,
    /// Another occurrence of a posted Event: set its series count.
    Increment {
        namespace: String,
        name: String,
        count: i32,
    },
}

/// client-go's event correlation, on the poster's task: series and per-object token buckets.
#[derive(Debug, Default)]
struct Correlator {
    series: HashMap<SeriesKey, Seen>,
    buckets: HashMap<ObjectId, Bucket>,
}

impl Correlator {
    fn decide(&mut self, post: &Post, now: Instant) -> Decision {
        let id = object_id(&post.regarding);
        let bucket = self.buckets.entry(id).or_insert(Bucket {
            tokens: f64::from(BURST),
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() / REFILL_EVERY.as_secs_f64();
        bucket.tokens = (bucket.tokens + refill).min(f64::from(BURST));
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Decision::Drop;
        }
        bucket.tokens -= 1.0;
        self.trim(now);
        match self.series.get(&series_key(post)) {
            Some(seen) if now.duration_since(seen.last) < SERIES_WINDOW => Decision::Increment {
                namespace: seen.namespace.clone(),
                name: seen.name.clone(),
                count: seen.count.saturating_add(1),
            },
            _ => Decision::Create,
        }
    }

    fn created(&mut self, post: &Post, now: Instant, namespace: String, name: String) {
        self.series.insert(
            series_key(post),
            Seen {
                namespace,
                name,
                count: 1,
                last: now,
            },
        );
        self.trim(now);
    }

    fn incremented(&mut self, post: &Post, now: Instant, count: i32) {
        if let Some(seen) = self.series.get_mut(&series_key(post)) {
            seen.count = count;
            seen.last = now;
        }
    }

    fn forget(&mut self, post: &Post) {
        self.series.remove(&series_key(post));
    }

    /// Forgets expired series and full buckets, then the oldest, beyond [`REMEMBERED`].
    fn trim(&mut self, now: Instant) {
        if self.series.len() > REMEMBERED {
            self.series
                .retain(|_, s| now.duration_since(s.last) < SERIES_WINDOW);
            while self.series.len() > REMEMBERED {
                let oldest = self
                    .series
                    .iter()
                    .min_by_key(|(_, s)| s.last)
                    .map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => self.series.remove(&k),
                    None => break,
                };
            }
        }
        if self.buckets.len() > REMEMBERED {
            let full = REFILL_EVERY * BURST;
            self.buckets.retain(|_, b| now.duration_since(b.at) < full);
            while self.buckets.len() > REMEMBERED {
                let oldest = self
                    .buckets
                    .iter()
                    .min_by_key(|(_, b)| b.at)
                    .map(|(k, _)| k.clone());
                match oldest {
                    Some(k) => self.buckets.remove(&k),
                    None => break,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(name: &str, reason: &str, note: &str) -> Post {
        Post {
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("ConfigMap".into()),
                namespace: Some("ns".into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            type_: EventType::Warning,
            reason: reason.into(),
            note: note.into(),
        }
    }

    fn created(c: &mut Correlator, p: &Post, now: Instant, name: &str) {
        assert_eq!(c.decide(p, now), Decision::Create);
        c.created(p, now, "ns".into(), name.into());
    }

    #[test]
    fn the_same_event_within_ten_minutes_is_one_series() {
        let mut c = Correlator::default();
        let t0 = Instant::now();
        let p = post("a", "ReconcileFailed", "boom");
        created(&mut c, &p, t0, "a.1");
        for (i, count) in [(1u64, 2), (2, 3)] {
            let now = t0 + Duration::from_secs(60 * i);
            let d = c.decide(&p, now);
            assert_eq!(
                d,
                Decision::Increment {
                    namespace: "ns".into(),
                    name: "a.1".into(),
                    count
                }
            );
            c.incremented(&p, now, count);
        }
        // Another message, reason, type or object is another Event.
        assert_eq!(
            c.decide(&post("a", "ReconcileFailed", "bang"), t0),
            Decision::Create
        );
        assert_eq!(c.decide(&post("a", "Other", "boom"), t0), Decision::Create);
        assert_eq!(
            c.decide(&post("b", "ReconcileFailed", "boom"), t0),
            Decision::Create
        );
        let mut normal = p.clone();
        normal.type_ = EventType::Normal;
        assert_eq!(c.decide(&normal, t0), Decision::Create);
        // Ten minutes after the last occurrence, a new series starts.
        let later = t0 + Duration::from_secs(120) + SERIES_WINDOW;
        assert_eq!(c.decide(&p, later), Decision::Create);
    }

    #[test]
    fn twenty_five_per_object_then_one_every_five_minutes() {
        let mut c = Correlator::default();
        let t0 = Instant::now();
        for i in 0..BURST {
            let p = post("a", "R", &format!("m{i}"));
            assert_ne!(c.decide(&p, t0), Decision::Drop, "event {i} of the burst");
        }
        assert_eq!(c.decide(&post("a", "R", "over"), t0), Decision::Drop);
        // Other objects have their own bucket.
        assert_eq!(c.decide(&post("b", "R", "m"), t0), Decision::Create);
        // Repeats count too: a series does not grow past the limit either.
        assert_eq!(
            c.decide(&post("a", "R", "m0"), t0 + Duration::from_secs(60)),
            Decision::Drop
        );
        let refilled = t0 + REFILL_EVERY;
        assert_ne!(c.decide(&post("a", "R", "again"), refilled), Decision::Drop);
        assert_eq!(
            c.decide(&post("a", "R", "again2"), refilled),
            Decision::Drop
        );
    }

    #[test]
    fn memory_is_bounded() {
        let mut c = Correlator::default();
        let t0 = Instant::now();
        for i in 0..(REMEMBERED + 10) {
            let p = post(&format!("o{i}"), "R", "m");
            created(&mut c, &p, t0 + Duration::from_millis(i as u64), "e");
        }
        assert!(c.series.len() <= REMEMBERED);
        assert!(c.buckets.len() <= REMEMBERED);
    }

    #[test]
    fn notes_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_NOTE);
        let cut = truncate(long, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(truncate("short".into(), MAX_NOTE), "short");
    }

    #[test]
    fn a_recorder_without_a_client_drops_quietly() {
        let r = EventRecorder::disabled();
        r.post(ObjectReference::default(), EventType::Warning, "R", "m");
        assert!(format!("{r:?}").starts_with("EventRecorder"));
    }
}
