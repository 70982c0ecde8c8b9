//! What the manager answered a session's Register with, as the controller sees it.

use std::fmt;
use std::time::Duration;

use ctrlhub_proto::v1 as pb;

/// One registered session: what `Registered` said, and the revision this replica registered
/// with. Passed to [`Controller::on_registered`](crate::Controller::on_registered).
#[derive(Clone, Debug, PartialEq)]
pub struct SessionInfo {
    /// `Registered.session_id`: cached reads name it, and it changes on every reconnect.
    pub session_id: String,
    /// The manager replica that leads (and holds the session).
    pub leader_identity: String,
    /// The `Register.revision` this replica sent.
    pub revision: u64,
    /// Every kind the session may read through the cache, once each, with its form.
    pub readable: Vec<Readable>,
    /// The registration with the manager's defaults filled in.
    pub effective: Option<pb::Register>,
    /// How often the SDK sends heartbeats on this session.
    pub heartbeat_interval: Option<Duration>,
    /// How long after its last answered heartbeat every handler of the session must have
    /// stopped (docs/protocol.md, "Exclusive attempts").
    pub hold: Option<Duration>,
}

/// A kind readable through the cache, and the form the manager serves it in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readable {
    /// The kind (with its plural).
    pub resource: pb::ResourceType,
    /// Only metadata is cached (every `owns`/`watches` entry of the kind asked for it): read
    /// it with [`CachedReader::get_metadata`](crate::CachedReader::get_metadata).
    pub metadata_only: bool,
}

impl fmt::Display for Readable {
    /// `apps/v1 Deployment (full)`, `v1 ConfigMap (metadata)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.resource;
        let form = if self.metadata_only {
            "metadata"
        } else {
            "full"
        };
        if t.group.is_empty() {
            write!(f, "{} {} ({form})", t.version, t.kind)
        } else {
            write!(f, "{}/{} {} ({form})", t.group, t.version, t.kind)
        }
    }
}

impl SessionInfo {
    /// From the manager's answer to a Register carrying `revision`.
    pub(crate) fn new(registered: pb::Registered, revision: u64) -> Self {
        let duration = |d: Option<prost_types::Duration>| {
            d.and_then(|d| Duration::try_from(d).ok())
                .filter(|d| !d.is_zero())
        };
        Self {
            session_id: registered.session_id,
            leader_identity: registered.leader_identity,
            revision,
            readable: registered
                .readable
                .into_iter()
                .map(|r| Readable {
                    resource: r.resource.unwrap_or_default(),
                    metadata_only: r.metadata_only,
                })
                .collect(),
            effective: registered.effective,
            heartbeat_interval: duration(registered.heartbeat_interval),
            hold: duration(registered.hold),
        }
    }

    /// The readable kinds for a log line: `v1 ConfigMap (full), apps/v1 Deployment (full)`.
    pub fn readable_summary(&self) -> String {
        let kinds: Vec<String> = self.readable.iter().map(ToString::to_string).collect();
        kinds.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable_kinds_name_their_form() {
        let registered = pb::Registered {
            session_id: "s-1".into(),
            readable: vec![
                pb::ReadableResource {
                    resource: Some(crate::dynamic_resource_type("", "v1", "ConfigMap")),
                    metadata_only: false,
                },
                pb::ReadableResource {
                    resource: Some(crate::dynamic_resource_type(
                        "coordination.k8s.io",
                        "v1",
                        "Lease",
                    )),
                    metadata_only: true,
                },
            ],
            heartbeat_interval: Some(prost_types::Duration {
                seconds: 0,
                nanos: 400_000_000,
            }),
            hold: Some(prost_types::Duration {
                seconds: 2,
                nanos: 0,
            }),
            ..Default::default()
        };
        let info = SessionInfo::new(registered, 3);
        assert_eq!(
            info.readable_summary(),
            "v1 ConfigMap (full), coordination.k8s.io/v1 Lease (metadata)"
        );
        assert_eq!(info.revision, 3);
        assert_eq!(info.hold, Some(Duration::from_secs(2)));
        assert_eq!(info.heartbeat_interval, Some(Duration::from_millis(400)));
    }

    #[test]
    fn a_manager_without_heartbeats_leaves_them_unset() {
        let info = SessionInfo::new(pb::Registered::default(), 0);
        assert_eq!((info.hold, info.heartbeat_interval), (None, None));
        assert_eq!(info.readable_summary(), "");
    }
}
