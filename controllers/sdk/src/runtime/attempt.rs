//! One reconcile request: wait until the key's earlier attempt in this process has stopped and
//! a worker is free, run the reconcile function until it finishes or is cancelled (at its
//! deadline, or when its session ends), wait for blocking work it left behind, and only then
//! send its result, on its own session if that still lives.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::SystemTime;

use ctrlhub_proto::v1 as pb;
use futures::FutureExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use pb::controller_message;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, error, info, info_span, warn};

use super::Shared;
use super::fence::SessionState;
use crate::blocking::Shields;
use crate::events::EventType;
use crate::traces::ReconcileSpan;
use crate::{Action, CachedReader, ObjectKey, ReconcileError, Request};

/// Why a reconcile was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Its deadline (less the safety margin) passed.
    Deadline,
    /// Its session ended (or the shutdown grace ran out).
    SessionEnded,
}

/// What the reconcile function returned, or its panic.
type Returned = Result<Result<Action, ReconcileError>, Box<dyn std::any::Any + Send>>;

/// What became of a reconcile.
enum Ran {
    /// The function returned (perhaps after it was cancelled, if blocking work held it).
    Finished(Returned),
    /// It was dropped after its cancellation, once no blocking work of it ran.
    Cancelled(Stop),
}

/// Starts a task for one request of `session`; its result goes to `tx`.
pub(super) fn spawn<K, C, F, Fut>(
    shared: &Arc<Shared<F, C>>,
    session: &Arc<SessionState>,
    reader: &CachedReader,
    tx: &mpsc::Sender<pb::ControllerMessage>,
    req: pb::ReconcileRequest,
) where
    K: DeserializeOwned + Send + 'static,
    C: Send + Sync + 'static,
    F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    let in_flight = session.in_flight();
    let id = req.id.clone();
    let cancel = session.child_token();
    let decoded = Request::<K>::from_proto(
        req,
        reader.clone(),
        shared.kit.clone(),
        cancel.clone(),
        SystemTime::now(),
        Instant::now(),
        shared.fallback_deadline,
    );
    let (session, tx) = (session.clone(), tx.clone());
    let request = match decoded {
        Ok(r) => r,
        Err(err) => {
            // Never Terminal: an object this controller's type cannot read is not the object's
            // fault (a newer schema, a controller built against an older one). Retried with
            // the key's backoff, so a fixed controller or object goes through.
            error!(controller = %shared.name, request_id = %id, "undecodable request, retried with backoff: {err}");
            let outcome = ReconcileError::retry(format!("undecodable request: {err}")).to_outcome();
            tokio::spawn(async move {
                send(&session, &tx, id, outcome).await;
                drop(in_flight);
            });
            return;
        }
    };
    // Only when this process exports traces: otherwise no span, no cost.
    let otel = ReconcileSpan::new(crate::traces::enabled().then(|| {
        crate::traces::start_reconcile(&shared.name, &request, shared.config.tracer.as_ref())
    }));
    let span = log_span(&shared.name, &request, &otel);
    let shared = shared.clone();
    tokio::spawn(
        async move {
            let outcome = attempt(&shared, &session, request, cancel, otel).await;
            send(&session, &tx, id, outcome).await;
            drop(in_flight);
        }
        .instrument(span),
    );
}

/// Runs one attempt to its real end and returns the result to send.
async fn attempt<K, C, F, Fut>(
    shared: &Arc<Shared<F, C>>,
    session: &Arc<SessionState>,
    request: Request<K>,
    cancel: CancellationToken,
    otel: ReconcileSpan,
) -> pb::reconcile_result::Outcome
where
    C: Send + Sync + 'static,
    F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    let (key, deadline, missed_after) =
        (request.key.clone(), request.deadline, request.missed_after);
    // Never two attempts of a key at once in this process (the earlier one may belong to an
    // ended session and still be stopping), never more than max_concurrent_reconciles.
    let ready = async {
        let key_guard = shared.attempts.lock(&key).await;
        let permit = shared.workers.clone().acquire_owned().await.ok();
        (key_guard, permit)
    };
    let (key_guard, permit) = tokio::select! {
        biased;
        why = stopped(&cancel, deadline) => {
            return missed(why, missed_after, not_started(&key, why, otel)).await;
        }
        held = ready => held,
    };
    let running = session.running(&request.id, &key);
    let handler = shared.attempts.handler();
    let shields = Shields::default();
    let line = Line::start(&request);
    let regarding = request.regarding.clone();
    let work = AssertUnwindSafe((shared.reconcile)(request, shared.ctx.clone())).catch_unwind();
    // The reconcile span is the current OpenTelemetry context inside the reconcile function.
    let work = opentelemetry::context::FutureExt::with_context(shields.scope(work), otel.context());
    let work = crate::logs::as_reconcile_of(key.to_string(), work);
    let ran = drive(work, &cancel, deadline, &shields).await;
    // Blocking work the reconcile left behind is part of the attempt.
    shields.idle().await;
    drop((running, handler, permit, key_guard));
    let (outcome, failure, stop) = match ran {
        Ran::Finished(returned) => {
            let (outcome, failure) = outcome_of(returned);
            let (label, error) = crate::traces::outcome_label(&outcome);
            line.end(label, error);
            otel.finish(label, error);
            (outcome, failure, None)
        }
        Ran::Cancelled(why) => {
            let (label, message) = cancelled(why);
            line.end(label, Some(message));
            otel.finish(label, Some(message));
            // A reconcile that overran its deadline failed; one whose session ended did not.
            let failure = (why == Stop::Deadline).then(|| ReconcileError::retry(message));
            (
                ReconcileError::retry(message).to_outcome(),
                failure,
                Some(why),
            )
        }
    };
    if let (Some(failure), Some(regarding)) = (failure, regarding) {
        post_failure(shared, &key, regarding, &failure);
    }
    match stop {
        Some(why) => missed(why, missed_after, outcome).await,
        None => outcome,
    }
}

/// Posts the Warning `ReconcileFailed` about the request's object, unless the failure is that
/// very object's NotFound (it is gone: nothing to post about).
fn post_failure<F, C>(
    shared: &Shared<F, C>,
    key: &ObjectKey,
    regarding: ObjectReference,
    failure: &ReconcileError,
) {
    if primary_not_found(failure, key) {
        debug!(%key, "no ReconcileFailed event: the object itself is gone");
        return;
    }
    shared.kit.events.post(
        regarding,
        EventType::Warning,
        "ReconcileFailed",
        failure.message(),
    );
}

/// Whether `err` is the API server's NotFound for the object `key` names (a 404 whose details
/// name it, or name nothing).
fn primary_not_found(err: &ReconcileError, key: &ObjectKey) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> =
        err.cause().map(|c| c as &(dyn std::error::Error + 'static));
    for _ in 0..32 {
        let Some(e) = next else { return false };
        let status = match e.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(status)) => Some(status.as_ref()),
            _ => e.downcast_ref::<kube::core::Status>(),
        };
        if let Some(status) = status {
            let named = status.details.as_ref().map_or("", |d| d.name.as_str());
            return status.code == 404 && (named.is_empty() || named == key.name);
        }
        next = match e.downcast_ref::<crate::WriteError>() {
            Some(crate::WriteError::Kube(inner)) => Some(inner),
            _ => e.source(),
        };
    }
    false
}

/// The start and end lines of one reconcile (inside its span).
struct Line {
    key: String,
    reasons: String,
    attempt: u32,
    started: Instant,
}

impl Line {
    /// Logs the start line.
    fn start<K>(request: &Request<K>) -> Self {
        let reasons: Vec<&str> = request
            .reasons
            .iter()
            .map(|r| r.as_str_name().trim_start_matches("REASON_"))
            .collect();
        let line = Self {
            key: request.key.to_string(),
            reasons: reasons.join(","),
            attempt: request.attempt,
            started: Instant::now(),
        };
        info!(
            key = %line.key,
            reasons = %line.reasons,
            attempt = line.attempt,
            "reconcile start key={} attempt={}",
            line.key,
            line.attempt
        );
        line
    }

    /// Logs the end line: INFO, or WARN with the error for a failure.
    fn end(&self, outcome: &str, error: Option<&str>) {
        let duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (key, reasons, attempt) = (&self.key, &self.reasons, self.attempt);
        match error {
            None => info!(
                %key, %reasons, attempt, outcome, duration_ms,
                "reconcile end key={key} outcome={outcome}"
            ),
            Some(error) => warn!(
                %key, %reasons, attempt, outcome, duration_ms, error,
                "reconcile end key={key} outcome={outcome}: {error}"
            ),
        }
    }
}

/// An attempt cancelled at its deadline has no outcome: its result waits until the manager's
/// deadline has passed (`missed_after`), so that the manager counts a missed deadline and
/// re-delivers the key (REDELIVERY) rather than taking the cancellation for a failure.
async fn missed(
    why: Stop,
    missed_after: Instant,
    outcome: pb::reconcile_result::Outcome,
) -> pb::reconcile_result::Outcome {
    if why == Stop::Deadline {
        tokio::time::sleep_until(missed_after).await;
    }
    outcome
}

/// Resolves when the attempt must stop: its session ended or its deadline passed.
async fn stopped(cancel: &CancellationToken, deadline: Instant) -> Stop {
    tokio::select! {
        biased;
        () = cancel.cancelled() => Stop::SessionEnded,
        () = tokio::time::sleep_until(deadline) => Stop::Deadline,
    }
}

/// Polls the reconcile until it returns, or until it must stop: then cancels its token and
/// drops it, as soon as no blocking work of it runs (until then it is still polled, and may
/// still return).
async fn drive<W>(work: W, cancel: &CancellationToken, deadline: Instant, shields: &Shields) -> Ran
where
    W: Future<Output = Returned>,
{
    let mut work = pin!(work);
    let why = tokio::select! {
        biased;
        returned = &mut work => return Ran::Finished(returned),
        why = stopped(cancel, deadline) => why,
    };
    cancel.cancel();
    match why {
        Stop::Deadline => warn!(
            "reconcile cancelled at its deadline; its result goes to the manager once it has stopped"
        ),
        Stop::SessionEnded => debug!("session ended: reconcile cancelled"),
    }
    while !shields.is_idle() {
        tokio::select! {
            biased;
            returned = &mut work => return Ran::Finished(returned),
            () = shields.idle() => {}
        }
    }
    Ran::Cancelled(why)
}

/// The result of an attempt cancelled before its reconcile started.
fn not_started(key: &ObjectKey, why: Stop, otel: ReconcileSpan) -> pb::reconcile_result::Outcome {
    let message = match why {
        Stop::Deadline => {
            warn!(%key, "the deadline passed before the reconcile could start (an earlier attempt of the key still ran, or every worker was busy)");
            "deadline passed before the reconcile started"
        }
        Stop::SessionEnded => "session ended before the reconcile started",
    };
    otel.finish("lost", Some(message));
    ReconcileError::retry(message).to_outcome()
}

/// The outcome label and message of a reconcile that was cancelled and has stopped.
fn cancelled(why: Stop) -> (&'static str, &'static str) {
    match why {
        Stop::Deadline => ("deadline", "cancelled at its deadline"),
        Stop::SessionEnded => ("lost", "cancelled: its session ended"),
    }
}

/// Sends the result, on its own session only, and only while that lives.
async fn send(
    session: &SessionState,
    tx: &mpsc::Sender<pb::ControllerMessage>,
    id: String,
    outcome: pb::reconcile_result::Outcome,
) {
    if !session.is_live() {
        debug!(request_id = %id, "session ended: result not sent (the manager re-delivers the key)");
        return;
    }
    let result = pb::ReconcileResult {
        id,
        outcome: Some(outcome),
    };
    let message = pb::ControllerMessage {
        message: Some(controller_message::Message::Result(result)),
    };
    if tx.send(message).await.is_err() {
        debug!("session ended before the result could be sent");
    }
}

/// The log span of one reconcile: every line logged while it runs names the key, attempt and
/// request, and the `trace_id`/`span_id` of its trace (this process's span when it exports
/// traces, else the trace the manager's `traceparent` names), so logs join traces.
fn log_span<K>(controller: &str, request: &Request<K>, otel: &ReconcileSpan) -> tracing::Span {
    let span = info_span!(
        "reconcile",
        controller = %controller,
        key = %request.key,
        attempt = request.attempt,
        request_id = %request.id,
        session_id = %request.reader().session_id(),
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    let ids = otel.ids().or_else(|| {
        let remote = crate::traces::extract(&request.traceparent, &request.tracestate);
        crate::traces::logs::ids(&remote).map(|(trace, _)| (trace, String::new()))
    });
    if let Some((trace_id, span_id)) = ids {
        span.record("trace_id", trace_id.as_str());
        if !span_id.is_empty() {
            span.record("span_id", span_id.as_str());
        }
    }
    span
}

/// The result to send for a reconcile function's return (or panic), and the failure to post.
fn outcome_of(returned: Returned) -> (pb::reconcile_result::Outcome, Option<ReconcileError>) {
    match returned {
        Ok(Ok(action)) => (action.to_outcome(), None),
        Ok(Err(err)) => (err.to_outcome(), Some(err)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // The panic hook of `logs::init` logged where (with a backtrace, rate-limited);
            // the end line says it failed.
            let err = ReconcileError::retry(format!("reconcile panicked: {what}"));
            (err.to_outcome(), Some(err))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_found(name: &str) -> kube::Error {
        let mut status = kube::core::Status::failure("not found", "NotFound");
        status.code = 404;
        if !name.is_empty() {
            status.details = Some(kube::core::response::StatusDetails {
                name: name.into(),
                group: "example.ctrlhub.io".into(),
                kind: "websites".into(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds: 0,
            });
        }
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn only_the_primary_s_own_not_found_posts_no_event() {
        let key = ObjectKey::new("ns", "blog");
        assert!(primary_not_found(&not_found("blog").into(), &key));
        assert!(primary_not_found(&not_found("").into(), &key));
        assert!(primary_not_found(
            &crate::WriteError::Kube(not_found("blog")).into(),
            &key
        ));
        assert!(!primary_not_found(&not_found("a-secret").into(), &key));
        assert!(!primary_not_found(&ReconcileError::retry("boom"), &key));
    }
}
