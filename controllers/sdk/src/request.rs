//! A reconcile request as the reconcile function sees it.

use std::fmt;
use std::time::{Duration, SystemTime};

use ctrlhub_proto::v1 as pb;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::reader::CachedReader;

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
/// The SDK cancels the reconcile future a little before [`Request::deadline`]
/// (the manager discards late results and re-delivers the key), and also when
/// the session ends; use [`Request::cancelled`] to stop cooperative work
/// (e.g. in spawned tasks) at the same moment.
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
    /// `include_object(true)` and the object exists.
    pub object: Option<K>,
    /// The last known state of a deleted (or out-of-scope) object.
    pub deleted: Option<K>,
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

    /// Whether the manager reports the object as gone (a tombstone).
    pub fn is_deleted(&self) -> bool {
        self.deleted.is_some() || self.reasons.contains(&Reason::Deleted)
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
}

impl<K: DeserializeOwned> Request<K> {
    /// Decodes a wire request. `now`/`now_instant` are the same moment on the
    /// wall clock and the monotonic clock; `fallback_deadline` applies when
    /// the manager sent none.
    pub(crate) fn from_proto(
        req: pb::ReconcileRequest,
        reader: CachedReader,
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
        let (object, deleted, final_state_unknown) = match req.object {
            None => (None, None, false),
            Some(pb::reconcile_request::Object::ObjectJson(json)) => {
                let obj = serde_json::from_slice(&json).map_err(|source| DecodeError::Object {
                    what: "object",
                    key: key.clone(),
                    source,
                })?;
                (Some(obj), None, false)
            }
            Some(pb::reconcile_request::Object::Tombstone(t)) => {
                let obj = serde_json::from_slice(&t.object_json).map_err(|source| {
                    DecodeError::Object {
                        what: "tombstone",
                        key: key.clone(),
                        source,
                    }
                })?;
                (None, Some(obj), t.final_state_unknown)
            }
        };
        let manager_deadline = req.deadline.as_ref().and_then(timestamp_to_system);
        let remaining = match manager_deadline {
            Some(at) => at.duration_since(now).unwrap_or(Duration::ZERO),
            None => fallback_deadline,
        };
        let deadline = now_instant + remaining - safety_margin(remaining);
        Ok(Self {
            id: req.id,
            key,
            attempt: req.attempt,
            reasons,
            object,
            deleted,
            final_state_unknown,
            deadline,
            manager_deadline,
            traceparent: req.traceparent,
            tracestate: req.tracestate,
            reader,
            cancel,
        })
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
        // 30 s left minus the 500 ms margin.
        let left = req.deadline - start;
        assert!(left >= Duration::from_millis(29_500) && left < Duration::from_millis(29_900));
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

    #[tokio::test]
    async fn no_object_and_errors() -> Result<(), DecodeError> {
        let req = decode(wire(None))?;
        assert!(req.object.is_none() && req.deleted.is_none());

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
