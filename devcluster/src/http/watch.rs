//! Watch streams: newline-delimited JSON events with resourceVersion resume, selector-aware
//! ADDED/DELETED when objects enter or leave the selection, periodic bookmarks, the
//! `k8s.io/initial-events-end` bookmark, and in-stream 410 Expired when a client falls behind.

use crate::catalog::resources::ResourceInfo;
use crate::faults::Faults;
use crate::meta;
use crate::render::{self, Format};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::storage::store::{Change, EventType, WatchSetup};
use bytes::Bytes;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// What one watch selects and how it encodes events.
pub(crate) struct WatchSpec {
    /// The resource version being watched (decides apiVersion and Table columns).
    pub(crate) info: ResourceInfo,
    /// Namespace, or None for all.
    pub(crate) namespace: Option<String>,
    /// `labelSelector`.
    pub(crate) labels: LabelSelector,
    /// `fieldSelector`.
    pub(crate) fields: FieldSelector,
    /// `allowWatchBookmarks`.
    pub(crate) bookmarks: bool,
    /// Send the initial-events-end bookmark after the synthetic ADDED events.
    pub(crate) end_bookmark: bool,
    /// `timeoutSeconds`.
    pub(crate) timeout: Option<Duration>,
    /// Negotiated representation.
    pub(crate) format: Format,
    /// How often to send bookmarks.
    pub(crate) bookmark_interval: Duration,
}

impl WatchSpec {
    fn selects(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| meta::namespace(obj) == ns)
            && self.labels.matches_object(obj)
            && self.fields.matches(obj)
    }

    /// How a change looks through this watch's selection: objects that leave the selection are
    /// DELETED, objects that enter it are ADDED.
    fn classify(&self, change: &Change) -> Option<EventType> {
        if change.gr != self.info.group_resource() {
            return None;
        }
        let now = self.selects(&change.object);
        let before = change.old.as_deref().is_some_and(|o| self.selects(o));
        match change.kind {
            EventType::Added => now.then_some(EventType::Added),
            EventType::Deleted => (now || before).then_some(EventType::Deleted),
            EventType::Modified => match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            },
        }
    }

    fn event(&self, kind: &str, obj: &Arc<Value>) -> Bytes {
        line(&json!({"type": kind, "object": render::object(&self.info, self.format, obj)}))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut md = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            md["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (api_version, kind) = match self.format {
            Format::Json => (self.info.api_version(), self.info.kind.clone()),
            Format::Metadata => (
                "meta.k8s.io/v1".to_string(),
                "PartialObjectMetadata".to_string(),
            ),
            Format::Table(_) => ("meta.k8s.io/v1".to_string(), "Table".to_string()),
        };
        line(
            &json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": md}}),
        )
    }
}

fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

/// The in-stream ERROR event for an error (410 Expired for resumes from compacted history).
pub(crate) fn error_event(e: &ApiError) -> Bytes {
    line(&json!({"type": "ERROR", "object": e.to_status()}))
}

/// Start streaming a watch; the returned receiver feeds the response body.
/// `closed` must have been taken from [`Faults`] before `setup` was computed.
pub(crate) fn spawn(
    spec: WatchSpec,
    setup: WatchSetup,
    mut closed: tokio::sync::watch::Receiver<u64>,
    faults: Faults,
    shutdown: CancellationToken,
) -> mpsc::Receiver<Result<Bytes, Infallible>> {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(1024);
    tokio::spawn(async move {
        let _open = faults.watch_opened();
        let WatchSetup {
            initial,
            replay,
            mut receiver,
            rv,
        } = setup;
        for obj in initial.iter().filter(|o| spec.selects(o)) {
            if tx.send(Ok(spec.event("ADDED", obj))).await.is_err() {
                return;
            }
        }
        if spec.end_bookmark && tx.send(Ok(spec.bookmark(rv, true))).await.is_err() {
            return;
        }
        for change in &replay {
            if let Some(kind) = spec.classify(change)
                && tx
                    .send(Ok(spec.event(kind.as_str(), &change.object)))
                    .await
                    .is_err()
            {
                return;
            }
        }
        let mut last_rv = rv;
        let deadline = spec.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut ticker =
            tokio::time::interval(spec.bookmark_interval.max(Duration::from_millis(10)));
        ticker.tick().await;
        loop {
            tokio::select! {
                // A close that happened before the next change must win: the test closing the
                // watches and then writing expects the writes on the resumed watch, not here.
                biased;
                _ = closed.changed() => return,
                _ = shutdown.cancelled() => return,
                received = receiver.recv() => match received {
                    Ok(change) => {
                        if change.rv <= last_rv {
                            continue;
                        }
                        last_rv = change.rv;
                        if let Some(kind) = spec.classify(&change)
                            && tx.send(Ok(spec.event(kind.as_str(), &change.object))).await.is_err()
                        {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let e = ApiError::expired(format!("watch fell behind at resourceVersion {last_rv}; relist"));
                        let _ = tx.send(Ok(error_event(&e))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = ticker.tick(), if spec.bookmarks => {
                    if tx.send(Ok(spec.bookmark(last_rv, false))).await.is_err() {
                        return;
                    }
                }
                _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => return,
                _ = tx.closed() => return,
            }
        }
    });
    rx
}
