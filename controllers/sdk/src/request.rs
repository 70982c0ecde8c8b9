//! A reconcile request as the reconcile function sees it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ctrlhub_proto::v1 as pb;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::WriteError;
use crate::events::EventRecorder;
use crate::finalizers::Finalizers;
use crate::reader::CachedReader;

/// What a request's write helpers write with: the controller's name and Kubernetes client, and
/// its Events recorder.
#[derive(Clone)]
pub(crate) struct Kit {
    pub(crate) controller: String,
    pub(crate) client: Option<kube::Client>,
    pub(crate) events: EventRecorder,
}

impl fmt::Debug for Kit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kit")
            .field("controller", &self.controller)
            .field("client", &self.client.as_ref().map(|_| "kube::Client"))
            .finish_non_exhaustive()
    }
}

impl Kit {
    pub(crate) fn new(controller: &str, client: Option<kube::Client>) -> Self {
        let events = match &client {
            Some(c) => EventRecorder::new(c.clone(), controller),
            None => EventRecorder::disabled(),
        };
        Self {
            controller: controller.to_owned(),
            client,
            events,
        }
    }
}

/// Why a key was enqueued (informational only: reconcile the current state
/// whatever the reason). Unknown values from a newer manager read as
/// `Unspecified`.
pub use pb::reconcile_request::Reason;

/// The key of an object: namespace (empty for cluster-scoped) and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectKey {
    /// A namespaced key.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The namespace, or `None` for a cluster-scoped object.
    pub fn namespace(&self) -> Option<&str> {
        (!self.namespace.is_empty()).then_some(self.namespace.as_str())
    }
}

impl fmt::Display for ObjectKey {
    /// `namespace/name`, or `name` for a cluster-scoped object.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// One reconcile request for a key of the primary type `K`.
///
/// The SDK cancels the reconcile a little before [`Request::deadline`], and
/// when its session ends: it cancels [`Request::cancelled`] (for work the
/// reconcile spawned) and drops the reconcile future, so every `.await` in
/// it stops there. Blocking work cannot be stopped that way: run it through
/// [`blocking`](crate::blocking), and the SDK waits for it before it
/// answers and before it starts the key's next attempt.
///
/// A request without an object (with `include_object(true)`) means the
/// manager holds no state for the key: treat it as NotFound. Only a
/// tombstone ([`Request::tombstone`]) says the manager saw the object go;
/// neither is a reason to clean up external state on its own (use a
/// finalizer, see [`finalizers`](crate::finalizers)).
#[derive(Debug)]
pub struct Request<K> {
    /// The manager's opaque request id (for logs).
    pub id: String,
    /// The primary object's key.
    pub key: ObjectKey,
    /// 1 + consecutive unsuccessful attempts for this key since its last
    /// success.
    pub attempt: u32,
    /// Why the key was enqueued, deduplicated.
    pub reasons: Vec<Reason>,
    /// The current object, when the controller registered with
    /// `include_object(true)` and the manager's cache holds it. `None`
    /// otherwise: NotFound, not "deleted".
    pub object: Option<K>,
    /// The last known state of a deleted (or out-of-scope) object, when the
    /// tombstone carried one that decodes.
    pub deleted: Option<K>,
    /// The manager sent a tombstone: it saw the object's deletion, or the
    /// object left the label selector (`deleted` may still be `None` when
    /// the tombstone's JSON was empty or did not decode).
    pub tombstone: bool,
    /// For `deleted`: the manager did not observe the deletion itself, so the
    /// state may be older than the object's real final state.
    pub final_state_unknown: bool,
    /// The local instant at which the SDK cancels this reconcile: the
    /// manager's deadline minus a safety margin for latency and clock skew.
    pub deadline: Instant,
    /// The manager's absolute deadline, when it sent one.
    pub manager_deadline: Option<SystemTime>,
    /// W3C `traceparent` of the manager's dispatch span (may be empty).
    pub traceparent: String,
    /// W3C `tracestate` (often empty).
    pub tracestate: String,
    reader: CachedReader,
    cancel: CancellationToken,
    kit: Arc<Kit>,
    /// The object of the request as an Event's `regarding` (from its JSON, whatever `K` is).
    pub(crate) regarding: Option<ObjectReference>,
    /// When the result of an attempt cancelled at its deadline may go out: the manager's
    /// deadline on the local clock plus the safety margin, so that the manager counts the
    /// missed deadline (and re-delivers as REDELIVERY) instead of taking a "cancelled" error
    /// for the attempt's outcome.
    pub(crate) missed_after: Instant,
}

/// A ReconcileRequest that cannot be turned into a [`Request`].
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The request has no key.
    #[error("request {0:?} has no key")]
    MissingKey(String),
    /// `object_json` or the tombstone does not decode as the primary type.
    #[error("cannot decode {what} of {key} as the primary type: {source}")]
    Object {
        /// "object" or "tombstone".
        what: &'static str,
        /// The key.
        key: ObjectKey,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

impl<K> Request<K> {
    /// The primary object's namespace, or `None` when cluster-scoped.
    pub fn namespace(&self) -> Option<&str> {
        self.key.namespace()
    }

    /// The primary object's name.
    pub fn name(&self) -> &str {
        &self.key.name
    }

    /// Whether the manager reports the object as gone: a tombstone, or
    /// reason DELETED. A request without an object is not "deleted".
    pub fn is_deleted(&self) -> bool {
        self.tombstone || self.reasons.contains(&Reason::Deleted)
    }

    /// Cached reads through the manager, bound to this request's session.
    pub fn reader(&self) -> &CachedReader {
        &self.reader
    }

    /// A token cancelled when this request's deadline passes or its session
    /// ends.
    pub fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Time left until [`Request::deadline`].
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The controller's Kubernetes client, for writes of your own (see
    /// [`Controller::client`](crate::Controller::client)).
    pub fn client(&self) -> Result<&kube::Client, WriteError> {
        self.kit.client.as_ref().ok_or(WriteError::NoClient)
    }

    /// Makes `owner` the controller of `child` and returns `child`: see
    /// [`write::adopt`](crate::write::adopt).
    pub fn adopt<'c, C, O>(&self, child: &'c mut C, owner: &O) -> Result<&'c mut C, WriteError>
    where
        C: Resource<DynamicType = ()>,
        C::Scope: 'static,
        O: Resource<DynamicType = ()>,
    {
        crate::write::adopt(child, owner)
    }

    /// Server-side applies `obj` with the controller's name as field manager, forcing
    /// conflicts, and returns it as stored: see [`write::apply`](crate::write::apply).
    pub async fn apply<C>(&self, obj: &C) -> Result<C, WriteError>
    where
        C: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
        C::Scope: 'static,
    {
        crate::write::apply(self.client()?, &self.kit.controller, obj).await
    }

    /// Merge-patches the `status` subresource of `obj` with `status` and returns the updated
    /// object: see [`write::patch_status`](crate::write::patch_status).
    pub async fn patch_status<C, S>(&self, obj: &C, status: &S) -> Result<C, WriteError>
    where
        C: Resource<DynamicType = ()> + DeserializeOwned,
        C::Scope: 'static,
        S: Serialize + ?Sized,
    {
        crate::write::patch_status(self.client()?, obj, status).await
    }

    /// The controller's Events recorder: `events().info(obj, reason, message)` and
    /// `events().warning(..)` post without waiting (see [`events`](crate::events)).
    pub fn events(&self) -> &EventRecorder {
        &self.kit.events
    }

    /// Finalizer steps on the controller's client: `ensure` and `finalize` (see
    /// [`finalizers`](crate::finalizers)).
    pub fn finalizers(&self) -> Finalizers<'_> {
        match &self.kit.client {
            Some(client) => Finalizers::new(client),
            None => Finalizers::without_client(),
        }
    }
}

impl<K: DeserializeOwned> Request<K> {
    /// Decodes a wire request. `now`/`now_instant` are the same moment on the
    /// wall clock and the monotonic clock; `fallback_deadline` applies when
    /// the manager sent none.
    pub(crate) fn from_proto(
        req: pb::ReconcileRequest,
        reader: CachedReader,
        kit: Arc<Kit>,
        cancel: CancellationToken,
        now: SystemTime,
        now_instant: Instant,
        fallback_deadline: Duration,
    ) -> Result<Self, DecodeError> {
        let Some(key) = req.key.as_ref() else {
            return Err(DecodeError::MissingKey(req.id));
        };
        let key = ObjectKey::new(key.namespace.clone(), key.name.clone());
        let reasons = req
            .reasons
            .iter()
            .map(|r| Reason::try_from(*r).unwrap_or(Reason::Unspecified))
            .collect();
        let object = match req.object {
            None => Received::Nothing,
            // An empty object is no object: NotFound, never a reason to fail the request.
            Some(pb::reconcile_request::Object::ObjectJson(json)) if json.is_empty() => {
                Received::Nothing
            }
            Some(pb::reconcile_request::Object::ObjectJson(json)) => {
                let obj = serde_json::from_slice(&json).map_err(|source| DecodeError::Object {
                    what: "object",
                    key: key.clone(),
                    source,
                })?;
                Received::Object(obj, regarding(&json))
            }
            Some(pb::reconcile_request::Object::Tombstone(t)) => Received::Tombstone(
                decode_tombstone(&key, &t.object_json),
                t.final_state_unknown,
            ),
        };
        let (object, deleted, tombstone, final_state_unknown, regarding) = match object {
            Received::Nothing => (None, None, false, false, None),
            Received::Object(obj, r) => (Some(obj), None, false, false, r),
            Received::Tombstone(last, unknown) => (None, last, true, unknown, None),
        };
        let manager_deadline = req.deadline.as_ref().and_then(timestamp_to_system);
        let remaining = match manager_deadline {
            Some(at) => at.duration_since(now).unwrap_or(Duration::ZERO),
            None => fallback_deadline,
        };
        let margin = safety_margin(remaining);
        let deadline = now_instant + remaining - margin;
        let missed_after = now_instant + remaining + margin;
        Ok(Self {
            id: req.id,
            key,
            attempt: req.attempt,
            reasons,
            object,
            deleted,
            tombstone,
            final_state_unknown,
            deadline,
            manager_deadline,
            traceparent: req.traceparent,
            tracestate: req.tracestate,
            reader,
            cancel,
            kit,
            regarding,
            missed_after,
        })
    }
}

/// What a request carried in its `object` oneof.
enum Received<K> {
    Nothing,
    /// The object, and its reference for Events.
    Object(K, Option<ObjectReference>),
    /// The last known state (when it decodes) and `final_state_unknown`.
    Tombstone(Option<K>, bool),
}

/// The reference an Event about the object in `json` names (`None` without kind or name).
fn regarding(json: &[u8]) -> Option<ObjectReference> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Head {
        api_version: Option<String>,
        kind: Option<String>,
        #[serde(default)]
        metadata: Meta,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
    }
    let head: Head = serde_json::from_slice(json).ok()?;
    let (kind, name) = (head.kind?, head.metadata.name?);
    Some(ObjectReference {
        api_version: head.api_version,
        kind: Some(kind),
        name: Some(name),
        namespace: head.metadata.namespace.filter(|n| !n.is_empty()),
        uid: head.metadata.uid,
        resource_version: head.metadata.resource_version,
        field_path: None,
    })
}

/// A tombstone's last known state. The deletion is a fact whatever its JSON holds, so an
/// empty or undecodable one is `None`, not an error that would fail the request.
fn decode_tombstone<K: DeserializeOwned>(key: &ObjectKey, json: &[u8]) -> Option<K> {
    if json.is_empty() {
        return None;
    }
    match serde_json::from_slice(json) {
        Ok(obj) => Some(obj),
        Err(err) => {
            tracing::warn!(%key, "the tombstone's last known state does not decode: {err}");
            None
        }
    }
}

/// How much earlier than the manager's deadline the SDK gives up: 5% of the
/// time left, at most 500 ms.
pub(crate) fn safety_margin(remaining: Duration) -> Duration {
    (remaining / 20).min(Duration::from_millis(500))
}

fn timestamp_to_system(ts: &prost_types::Timestamp) -> Option<SystemTime> {
    let secs = u64::try_from(ts.seconds).ok()?;
    let nanos = u32::try_from(ts.nanos).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn wire(object: Option<pb::reconcile_request::Object>) -> pb::ReconcileRequest {
        pb::ReconcileRequest {
            id: "r-1".into(),
            key: Some(pb::ObjectKey {
                namespace: "default".into(),
                name: "cm".into(),
            }),
            attempt: 2,
            reasons: vec![Reason::Updated as i32, 999],
            object,
            deadline: Some(prost_types::Timestamp {
                seconds: 1_000_030,
                nanos: 0,
            }),
            traceparent: "00-abc-def-01".into(),
            tracestate: String::new(),
        }
    }

    fn decode(req: pb::ReconcileRequest) -> Result<Request<ConfigMap>, DecodeError> {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        Request::from_proto(
            req,
            CachedReader::for_tests(),
            Arc::new(Kit::new("test", None)),
            CancellationToken::new(),
            now,
            Instant::now(),
            Duration::from_secs(60),
        )
    }

    const CM: &str = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","namespace":"default","resourceVersion":"12345678901234567"},"data":{"a":"1"}}"#;

    #[tokio::test]
    async fn decodes_object() -> Result<(), DecodeError> {
        let start = Instant::now();
        let req = decode(wire(Some(pb::reconcile_request::Object::ObjectJson(
            CM.as_bytes().to_vec(),
        ))))?;
        assert_eq!(req.key.to_string(), "default/cm");
        assert_eq!(req.attempt, 2);
        assert_eq!(req.reasons, [Reason::Updated, Reason::Unspecified]);
        let obj = req.object.as_ref().and_then(|o| o.data.as_ref());
        assert_eq!(obj.and_then(|d| d.get("a")).map(String::as_str), Some("1"));
        assert!(req.deleted.is_none());
        assert!(!req.is_deleted());
        let regarding = req.regarding.clone().unwrap_or_default();
        assert_eq!(regarding.kind.as_deref(), Some("ConfigMap"));
        assert_eq!(regarding.name.as_deref(), Some("cm"));
        assert_eq!(regarding.namespace.as_deref(), Some("default"));
        // 30 s left minus the 500 ms margin, counted from when the request was made: between
        // `start` and now (a loaded machine may pause the test anywhere in between).
        let took = start.elapsed();
        let left = req.deadline - start;
        assert!(left >= Duration::from_millis(29_500), "{left:?}");
        assert!(
            left <= Duration::from_millis(29_500) + took,
            "{left:?} {took:?}"
        );
        // A cancelled attempt answers only once the manager's deadline has passed.
        let missed = req.missed_after - start;
        assert!(missed >= Duration::from_millis(30_500), "{missed:?}");
        assert!(
            missed <= Duration::from_millis(30_500) + took,
            "{missed:?} {took:?}"
        );
        assert_eq!(req.traceparent, "00-abc-def-01");
        Ok(())
    }

    #[tokio::test]
    async fn decodes_tombstone() -> Result<(), DecodeError> {
        let mut w = wire(Some(pb::reconcile_request::Object::Tombstone(
            pb::Tombstone {
                object_json: CM.as_bytes().to_vec(),
                final_state_unknown: true,
            },
        )));
        w.reasons = vec![Reason::Deleted as i32];
        let req = decode(w)?;
        assert!(req.object.is_none());
        assert!(req.deleted.is_some());
        assert!(req.final_state_unknown);
        assert!(req.is_deleted());
        Ok(())
    }

    /// No state is NotFound, not a deletion; an empty tombstone is a deletion with no last
    /// state. Neither fails the request (which the SDK would answer Terminal).
    #[tokio::test]
    async fn empty_objects_and_tombstones_are_not_errors() -> Result<(), DecodeError> {
        let req = decode(wire(Some(pb::reconcile_request::Object::ObjectJson(
            Vec::new(),
        ))))?;
        assert!(req.object.is_none() && req.deleted.is_none());
        assert!(!req.tombstone && !req.is_deleted());

        for json in [&b""[..], b"{}", b"not json"] {
            let mut w = wire(Some(pb::reconcile_request::Object::Tombstone(
                pb::Tombstone {
                    object_json: json.to_vec(),
                    final_state_unknown: false,
                },
            )));
            w.reasons = vec![Reason::Deleted as i32];
            let req = decode(w)?;
            assert!(req.tombstone && req.is_deleted(), "{json:?}");
            assert!(req.object.is_none());
        }
        Ok(())
    }

    #[tokio::test]
    async fn no_object_and_errors() -> Result<(), DecodeError> {
        let req = decode(wire(None))?;
        assert!(req.object.is_none() && req.deleted.is_none());
        assert!(!req.is_deleted(), "no object is NotFound, not deleted");

        let bad = decode(wire(Some(pb::reconcile_request::Object::ObjectJson(
            b"{\"kind\":\"Secret\",\"apiVersion\":\"v1\"}".to_vec(),
        ))));
        assert!(matches!(
            bad,
            Err(DecodeError::Object { what: "object", .. })
        ));

        let mut nokey = wire(None);
        nokey.key = None;
        assert!(matches!(decode(nokey), Err(DecodeError::MissingKey(_))));
        Ok(())
    }

    #[tokio::test]
    async fn past_deadline_is_now() -> Result<(), DecodeError> {
        let mut w = wire(None);
        w.deadline = Some(prost_types::Timestamp {
            seconds: 999_000,
            nanos: 0,
        });
        let start = Instant::now();
        let req = decode(w)?;
        assert!(req.deadline <= start + Duration::from_millis(50));
        Ok(())
    }

    #[test]
    fn margin() {
        assert_eq!(
            safety_margin(Duration::from_secs(60)),
            Duration::from_millis(500)
        );
        assert_eq!(
            safety_margin(Duration::from_secs(2)),
            Duration::from_millis(100)
        );
        assert_eq!(safety_margin(Duration::ZERO), Duration::ZERO);
    }
}
