//! What a reconcile returns: [`Action`] on success, [`ReconcileError`] on
//! failure. Both translate to `ctrlhub.v1.ReconcileResult` outcomes.

use std::fmt;
use std::time::Duration;

use ctrlhub_proto::v1 as pb;
use pb::reconcile_result::Outcome;

/// A successful reconcile: either done until something changes, or
/// "reconcile again after a delay" (polling).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Nothing more to do until the object (or something it depends on)
    /// changes. Resets the key's backoff.
    pub fn done() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// Reconcile again no earlier than `delay` from now (later if a newer
    /// change arrives first). Resets the key's backoff.
    pub fn requeue_after(delay: Duration) -> Self {
        Self {
            requeue_after: Some(delay),
        }
    }

    /// Reconcile again as soon as possible (after higher-priority work).
    pub fn requeue() -> Self {
        Self::requeue_after(Duration::ZERO)
    }

    /// The requested requeue delay, if any.
    pub fn requeue_delay(&self) -> Option<Duration> {
        self.requeue_after
    }

    /// The wire outcome.
    pub fn to_outcome(&self) -> Outcome {
        match self.requeue_after {
            None => Outcome::Done(pb::reconcile_result::Done {}),
            Some(d) => Outcome::RequeueAfter(pb::reconcile_result::RequeueAfter {
                delay: Some(duration_to_proto(d)),
            }),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.requeue_after {
            None => f.write_str("done"),
            Some(d) => write!(f, "requeue after {}", humantime::format_duration(d)),
        }
    }
}

/// A failed reconcile.
///
/// `Retry` errors are re-delivered with per-key exponential backoff (or after
/// `retry_after` when set); `Terminal` errors are recorded and not retried
/// until the object changes.
///
/// Conversions pick the sensible kind: Kubernetes API errors 400/422 (the
/// request can never succeed as built) are terminal, 429 honours the
/// server's Retry-After, everything else (conflicts, not-found, 5xx,
/// transport) is retried; JSON (de)serialization errors are terminal.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ReconcileError {
    /// Transient failure; retried with backoff.
    #[error("{message}")]
    Retry {
        /// What went wrong.
        message: String,
        /// Retry no earlier than this instead of the computed backoff.
        retry_after: Option<Duration>,
    },
    /// Retrying cannot fix this (e.g. an invalid spec).
    #[error("{message}")]
    Terminal {
        /// What went wrong.
        message: String,
    },
}

impl ReconcileError {
    /// A transient failure, retried with backoff.
    pub fn retry(message: impl fmt::Display) -> Self {
        Self::Retry {
            message: message.to_string(),
            retry_after: None,
        }
    }

    /// A transient failure, retried no earlier than `after`.
    pub fn retry_after(message: impl fmt::Display, after: Duration) -> Self {
        Self::Retry {
            message: message.to_string(),
            retry_after: Some(after),
        }
    }

    /// A failure retrying cannot fix; not retried until the object changes.
    pub fn terminal(message: impl fmt::Display) -> Self {
        Self::Terminal {
            message: message.to_string(),
        }
    }

    /// Whether this error is terminal.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Terminal { .. })
    }

    /// A stable, low-cardinality label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Retry { .. } => "error",
            Self::Terminal { .. } => "terminal",
        }
    }

    /// The wire outcome.
    pub fn to_outcome(&self) -> Outcome {
        match self {
            Self::Retry {
                message,
                retry_after,
            } => Outcome::Error(pb::reconcile_result::Error {
                message: message.clone(),
                retry_after: retry_after.map(duration_to_proto),
            }),
            Self::Terminal { message } => Outcome::Terminal(pb::reconcile_result::Terminal {
                message: message.clone(),
            }),
        }
    }
}

impl From<kube::Error> for ReconcileError {
    fn from(err: kube::Error) -> Self {
        match &err {
            kube::Error::Api(status) => match status.code {
                400 | 422 => Self::terminal(format!("kubernetes API: {err}")),
                429 => {
                    let secs = status
                        .details
                        .as_ref()
                        .map(|d| d.retry_after_seconds)
                        .filter(|s| *s > 0)
                        .unwrap_or(1);
                    Self::retry_after(
                        format!("kubernetes API: {err}"),
                        Duration::from_secs(u64::from(secs)),
                    )
                }
                _ => Self::retry(format!("kubernetes API: {err}")),
            },
            kube::Error::SerdeError(_) => Self::terminal(format!("kubernetes API: {err}")),
            _ => Self::retry(format!("kubernetes API: {err}")),
        }
    }
}

impl From<serde_json::Error> for ReconcileError {
    fn from(err: serde_json::Error) -> Self {
        Self::terminal(format!("JSON: {err}"))
    }
}

impl From<crate::reader::ReadError> for ReconcileError {
    fn from(err: crate::reader::ReadError) -> Self {
        match err {
            crate::reader::ReadError::Decode(_) => Self::terminal(err),
            _ => Self::retry(err),
        }
    }
}

impl From<std::convert::Infallible> for ReconcileError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

/// `std::time::Duration` → `google.protobuf.Duration` (saturating).
pub(crate) fn duration_to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // subsec_nanos() < 1e9 always fits an i32.
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_to_outcomes() {
        assert_eq!(
            Action::done().to_outcome(),
            Outcome::Done(pb::reconcile_result::Done {})
        );
        assert_eq!(
            Action::requeue_after(Duration::from_millis(1500)).to_outcome(),
            Outcome::RequeueAfter(pb::reconcile_result::RequeueAfter {
                delay: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 500_000_000
                })
            })
        );
    }

    #[test]
    fn errors_to_outcomes() {
        let Outcome::Error(e) =
            ReconcileError::retry_after("slow down", Duration::from_secs(3)).to_outcome()
        else {
            panic!("expected error");
        };
        assert_eq!(e.message, "slow down");
        assert_eq!(e.retry_after.map(|d| d.seconds), Some(3));
        assert!(matches!(
            ReconcileError::terminal("bad spec").to_outcome(),
            Outcome::Terminal(t) if t.message == "bad spec"
        ));
    }

    fn api_error(code: u16, retry_after_seconds: u32) -> kube::Error {
        let mut status = kube::core::Status::failure("boom", "Reason");
        status.code = code;
        if retry_after_seconds > 0 {
            status.details = Some(kube::core::response::StatusDetails {
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds,
            });
        }
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn kube_errors_map_sensibly() {
        assert!(ReconcileError::from(api_error(422, 0)).is_terminal());
        assert!(ReconcileError::from(api_error(400, 0)).is_terminal());
        assert!(!ReconcileError::from(api_error(409, 0)).is_terminal());
        assert!(!ReconcileError::from(api_error(500, 0)).is_terminal());
        assert!(matches!(
            ReconcileError::from(api_error(429, 7)),
            ReconcileError::Retry { retry_after: Some(d), .. } if d == Duration::from_secs(7)
        ));
    }
}
