//! `/debug/pprof/profile?seconds=N`: a CPU profile of the manager, authorized like `/metrics`
//! (a SubjectAccessReview of `get` on the path; deploy/'s ClusterRole `ctrlhub-profiler`).
//!
//! pprof-rs samples every thread at 99 Hz with SIGPROF while the profile runs, and nothing at
//! all otherwise. The answer is pprof's protobuf (`go tool pprof -http`, Pyroscope, speedscope
//! draw it as a flamegraph). No SVG is drawn here: pprof-rs draws them with inferno, whose
//! CDDL-1.0 licence is outside deny.toml's permissive-only policy. One profile at a time (the
//! sampler is process-wide), for 1 to [`MAX_SECONDS`] seconds.

use super::access::Refusal;
use super::{HttpState, Peer};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The path, as authorized.
pub(crate) const PATH: &str = "/debug/pprof/profile";
/// The longest profile: the request (and one blocking thread) is held that long.
pub(crate) const MAX_SECONDS: u64 = 60;
/// The profile's length when `seconds` is not given (Go's net/http/pprof takes 30).
pub(crate) const DEFAULT_SECONDS: u64 = 30;
/// Samples per second (pprof-rs' default; not a round number, so it does not beat with timers).
const FREQUENCY: i32 = 99;

/// Whether a profile is being taken (the sampler is one per process).
static TAKING: AtomicBool = AtomicBool::new(false);

/// The claim on [`TAKING`], given back when the profile ends: it moves onto the sampling thread,
/// so a client that hangs up mid-profile frees it only when the sampler has stopped.
struct Taking;

impl Drop for Taking {
    fn drop(&mut self) {
        TAKING.store(false, Ordering::Release);
    }
}

/// Query parameters.
#[derive(Debug, serde::Deserialize)]
pub(super) struct ProfileParams {
    seconds: Option<u64>,
    format: Option<String>,
}

/// Why no profile was taken.
#[derive(Debug, thiserror::Error)]
enum ProfileError {
    #[error("seconds must be 1 to {MAX_SECONDS}")]
    Seconds,
    #[error("format must be `pprof` (the default; `go tool pprof -http` draws it as a flamegraph)")]
    Format,
    #[error("a profile is already being taken; try again when it is done")]
    Busy,
    #[error("profiling failed: {0}")]
    Pprof(#[from] pprof::Error),
    #[error("profiling failed: {0}")]
    Task(String),
}

impl IntoResponse for ProfileError {
    fn into_response(self) -> Response {
        let status = match self {
            ProfileError::Seconds | ProfileError::Format => StatusCode::BAD_REQUEST,
            ProfileError::Busy => StatusCode::CONFLICT,
            ProfileError::Pprof(_) | ProfileError::Task(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, format!("{self}\n")).into_response()
    }
}

/// `GET /debug/pprof/profile`: authorize, then profile for the seconds asked.
pub(super) async fn cpu(
    State(s): State<Arc<HttpState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    Query(p): Query<ProfileParams>,
) -> Result<Response, Refusal> {
    s.gate.viewer(&headers, peer, PATH, false).await?;
    Ok(match take(&p).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    })
}

async fn take(p: &ProfileParams) -> Result<Response, ProfileError> {
    let seconds = p.seconds.unwrap_or(DEFAULT_SECONDS);
    if !(1..=MAX_SECONDS).contains(&seconds) {
        return Err(ProfileError::Seconds);
    }
    if !matches!(p.format.as_deref(), None | Some("pprof") | Some("proto")) {
        return Err(ProfileError::Format);
    }
    if TAKING.swap(true, Ordering::AcqRel) {
        return Err(ProfileError::Busy);
    }
    let taking = Taking;
    tracing::info!(seconds, "taking a CPU profile");
    // The sampler's guard is not Send: it lives on one blocking thread for the whole profile.
    let body = tokio::task::spawn_blocking(move || {
        let _taking = taking;
        profile(Duration::from_secs(seconds))
    })
    .await
    .map_err(|e| ProfileError::Task(e.to_string()))??;
    let (content_type, file) = ("application/octet-stream", "ctrlhub-cpu.pb");
    Ok((
        [
            (header::CONTENT_TYPE, content_type.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("inline; filename=\"{file}\""),
            ),
            (header::CACHE_CONTROL, "no-store".to_string()),
        ],
        body,
    )
        .into_response())
}

/// Samples every thread for `length`, then encodes what it saw as pprof protobuf.
fn profile(length: Duration) -> Result<Vec<u8>, ProfileError> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        // Frames inside these libraries cannot be unwound safely from a signal handler.
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()?;
    std::thread::sleep(length);
    let report = guard.report().build()?;
    use pprof::protos::Message as _;
    let mut body = Vec::new();
    report
        .pprof()?
        .encode(&mut body)
        .map_err(|e| ProfileError::Task(e.to_string()))?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seconds: Option<u64>, format: Option<&str>) -> ProfileParams {
        ProfileParams {
            seconds,
            format: format.map(String::from),
        }
    }

    #[tokio::test]
    async fn out_of_bounds_requests_are_refused_before_sampling() {
        for bad in [Some(0), Some(MAX_SECONDS + 1)] {
            assert!(matches!(
                take(&params(bad, None)).await,
                Err(ProfileError::Seconds)
            ));
        }
        assert!(matches!(
            take(&params(Some(1), Some("svg"))).await,
            Err(ProfileError::Format)
        ));
        assert!(!TAKING.load(Ordering::Acquire), "nothing was started");
    }
}
