//! What a reconcile returns: [`Action`] on success, [`ReconcileError`] on
//! failure. Both translate to `ctrlhub.v1.ReconcileResult` outcomes.

use std::fmt;
use std::sync::Arc;
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

/// The error a [`ReconcileError`] was converted from, kept for
/// [`is_not_found`](crate::is_not_found) and [`is_conflict`](crate::is_conflict) and for
/// reports that print an error's `source()` chain.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A failed reconcile.
///
/// `Retry` errors are re-delivered with per-key exponential backoff (or after
/// `retry_after` when set); `Terminal` errors are recorded and not retried
/// until the object changes.
///
/// Conversions pick the sensible kind: Kubernetes API errors 400/422 (the
/// request can never succeed as built) are terminal, 429 honours the
/// server's Retry-After, everything else (conflicts, not-found, 5xx,
/// transport) is retried; JSON (de)serialization errors are terminal. A
/// converted error keeps its cause ([`ReconcileError::cause`], `source()`).
/// Equality compares the kind, message and `retry_after`, not the cause.
#[derive(Debug, Clone)]
pub enum ReconcileError {
    /// Transient failure; retried with backoff.
    Retry {
        /// What went wrong.
        message: String,
        /// Retry no earlier than this instead of the computed backoff.
        retry_after: Option<Duration>,
        /// The error this one was converted from, if any.
        cause: Option<Cause>,
    },
    /// Retrying cannot fix this (e.g. an invalid spec).
    Terminal {
        /// What went wrong.
        message: String,
        /// The error this one was converted from, if any.
        cause: Option<Cause>,
    },
}

impl fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for ReconcileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

impl PartialEq for ReconcileError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                Self::Retry {
                    message: a,
                    retry_after: ra,
                    ..
                },
                Self::Retry {
                    message: b,
                    retry_after: rb,
                    ..
                },
            ) => a == b && ra == rb,
            (Self::Terminal { message: a, .. }, Self::Terminal { message: b, .. }) => a == b,
            _ => false,
        }
    }
}

impl Eq for ReconcileError {}

impl ReconcileError {
    /// A transient failure, retried with backoff.
    pub fn retry(message: impl fmt::Display) -> Self {
        Self::Retry {
            message: message.to_string(),
            retry_after: None,
            cause: None,
        }
    }

    /// A transient failure, retried no earlier than `after`.
    pub fn retry_after(message: impl fmt::Display, after: Duration) -> Self {
        Self::Retry {
            message: message.to_string(),
            retry_after: Some(after),
            cause: None,
        }
    }

    /// A failure retrying cannot fix; not retried until the object changes.
    pub fn terminal(message: impl fmt::Display) -> Self {
        Self::Terminal {
            message: message.to_string(),
            cause: None,
        }
    }

    /// The same error, remembering `cause` (see [`ReconcileError::cause`]).
    pub fn with_cause(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        let cause: Option<Cause> = Some(Arc::new(cause));
        match &mut self {
            Self::Retry { cause: c, .. } | Self::Terminal { cause: c, .. } => *c = cause,
        }
        self
    }

    /// What went wrong.
    pub fn message(&self) -> &str {
        match self {
            Self::Retry { message, .. } | Self::Terminal { message, .. } => message,
        }
    }

    /// The error this one was converted from (a [`kube::Error`], a
    /// [`WriteError`](crate::WriteError), ...), if any.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Self::Retry { cause, .. } | Self::Terminal { cause, .. } => cause.as_deref(),
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
                ..
            } => Outcome::Error(pb::reconcile_result::Error {
                message: message.clone(),
                retry_after: retry_after.map(duration_to_proto),
            }),
            Self::Terminal { message, .. } => Outcome::Terminal(pb::reconcile_result::Terminal {
                message: message.clone(),
            }),
        }
    }
}

impl From<kube::Error> for ReconcileError {
    fn from(err: kube::Error) -> Self {
        let converted = match &err {
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
        };
        converted.with_cause(err)
    }
}

impl From<crate::WriteError> for ReconcileError {
    /// A refused or failed API call converts like [`kube::Error`]; everything else (no client,
    /// an object that cannot be written as built) is terminal.
    fn from(err: crate::WriteError) -> Self {
        match err {
            crate::WriteError::Kube(e) => e.into(),
            other => Self::terminal(&other).with_cause(other),
        }
    }
}

impl From<serde_json::Error> for ReconcileError {
    fn from(err: serde_json::Error) -> Self {
        Self::terminal(format!("JSON: {err}")).with_cause(err)
    }
}

impl From<crate::reader::ReadError> for ReconcileError {
    fn from(err: crate::reader::ReadError) -> Self {
        match err {
            crate::reader::ReadError::Decode(_) => Self::terminal(&err).with_cause(err),
            _ => Self::retry(&err).with_cause(err),
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
