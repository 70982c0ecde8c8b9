//! The session loop: connect, register, run reconciles, reconnect, drain.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use futures::FutureExt as _;
use pb::{controller_message, manager_message};
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tracing::{Instrument as _, debug, error, info, info_span, warn};

use crate::{Action, CachedReader, Config, ConfigError, Controller, ReconcileError, Request};

/// Why [`Controller::run`] gave up. Everything else (manager restarts,
/// leader changes, network errors) is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid connection settings.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The definition has no primary type.
    #[error(
        "controller {0:?} has no primary type: call .reconciles::<K>() or .reconciles_dynamic(..)"
    )]
    NoPrimary(String),
    /// The manager refused the registration in a way that needs a human
    /// (INVALID_ARGUMENT, PERMISSION_DENIED or UNAUTHENTICATED).
    #[error("registration rejected with {code:?}{}: {message}", field_suffix(.field))]
    Rejected {
        /// The gRPC status code.
        code: tonic::Code,
        /// The manager's explanation.
        message: String,
        /// The offending field (e.g. `register.watches[2].field_path`), or
        /// empty.
        field: String,
    },
    /// A newer definition of this controller replaced this one; this
    /// replica runs outdated code and should be replaced, not re-register.
    #[error("superseded by a newer definition of controller {name:?}: {message}")]
    Superseded {
        /// The controller name.
        name: String,
        /// The manager's explanation.
        message: String,
    },
}

fn field_suffix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!(" (field {field})")
    }
}

impl Error {
    /// A stable, low-cardinality label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Config(_) => "config",
            Self::NoPrimary(_) => "no_primary",
            Self::Rejected { .. } => "rejected",
            Self::Superseded { .. } => "superseded",
        }
    }
}

/// How one session ended.
#[derive(Debug)]
enum SessionEnd {
    /// Shutdown requested before a session was established, or a drain
    /// completed: `run` returns Ok.
    Stopped,
    /// Needs a human: `run` returns this error.
    Fatal(Error),
    /// Reconnect with backoff. `registered` tells whether the session got
    /// going (for the backoff reset).
    Retry { reason: String, registered: bool },
}

struct Shared<F, C> {
    name: String,
    register: pb::Register,
    reconcile: F,
    ctx: Arc<C>,
    workers: Arc<Semaphore>,
    fallback_deadline: Duration,
    config: Arc<Config>,
}

impl<K> Controller<K>
where
    K: DeserializeOwned + Send + 'static,
{
    /// Runs the controller until `shutdown` is cancelled (then drains
    /// gracefully and returns `Ok`) or a registration is rejected in a way
    /// that needs a human (returns `Err`).
    ///
    /// Connects to the manager, registers, runs up to
    /// `max_concurrent_reconciles` reconciles at once, answers each request,
    /// cancels a reconcile shortly before its deadline (the manager discards
    /// late results anyway), and reconnects with exponential backoff and
    /// jitter whenever the session ends for any other reason.
    pub async fn run<C, F, Fut>(
        self,
        config: Config,
        reconcile: F,
        ctx: Arc<C>,
        shutdown: CancellationToken,
    ) -> Result<(), Error>
    where
        C: Send + Sync + 'static,
        F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
    {
        config.validate()?;
        if self.primary.is_none() {
            return Err(Error::NoPrimary(self.name));
        }
        let endpoint = Endpoint::from_shared(config.uri())
            .map_err(|e| ConfigError::InvalidAddr {
                addr: config.addr.clone(),
                reason: e.to_string(),
            })?
            .connect_timeout(config.connect_timeout)
            .http2_keep_alive_interval(config.keepalive_interval)
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let mut backoff = config.reconnect.clone();
        let shared = Arc::new(Shared {
            name: self.name.clone(),
            register: self.to_register(),
            reconcile,
            ctx,
            workers: Arc::new(Semaphore::new(self.concurrency as usize)),
            fallback_deadline: self.deadline.unwrap_or(Duration::from_secs(60)),
            config: Arc::new(config),
        });

        loop {
            let started = Instant::now();
            // A new connection for every session: a Kubernetes Service picks the backend per TCP
            // connection, so re-opening the stream on the old one would keep asking a manager
            // that stepped down (and answers UNAVAILABLE) instead of reaching the new leader.
            let end = match dial(&endpoint, &shared.config) {
                Ok(channel) => {
                    let client = ControllerManagerClient::new(channel);
                    session::<K, C, F, Fut>(&shared, client, &shutdown).await
                }
                // Certificates may not be mounted yet, or be mid-rotation: retry with backoff.
                Err(e) => SessionEnd::Retry {
                    reason: e.to_string(),
                    registered: false,
                },
            };
            match end {
                SessionEnd::Stopped => {
                    info!(controller = %shared.name, "controller stopped");
                    return Ok(());
                }
                SessionEnd::Fatal(err) => {
                    error!(controller = %shared.name, error = %err, "giving up: {err}");
                    return Err(err);
                }
                SessionEnd::Retry { reason, registered } => {
                    let lasted = if registered {
                        started.elapsed()
                    } else {
                        Duration::ZERO
                    };
                    let delay = backoff.next_delay(lasted, &mut rand::rng());
                    warn!(
                        controller = %shared.name,
                        failures = backoff.failures(),
                        "session ended: {reason}; reconnecting in {}",
                        humantime::format_duration(round_ms(delay))
                    );
                    tokio::select! {
                        _ = shutdown.cancelled() => {
                            info!(controller = %shared.name, "shutdown requested while disconnected; exiting");
                            return Ok(());
                        }
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }
}

/// A lazily connecting channel to the manager, with TLS read from its files now.
fn dial(endpoint: &Endpoint, config: &Config) -> Result<tonic::transport::Channel, Error> {
    let endpoint = match config.client_tls()? {
        Some(tls) => endpoint
            .clone()
            .tls_config(tls)
            .map_err(|e| ConfigError::InvalidTls(e.to_string()))?,
        None => endpoint.clone(),
    };
    Ok(endpoint.connect_lazy())
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn message(m: controller_message::Message) -> pb::ControllerMessage {
    pb::ControllerMessage { message: Some(m) }
}

/// Classifies a gRPC status that ended (or refused) a stream.
fn classify_status(status: &tonic::Status, registered: bool) -> SessionEnd {
    classify(
        status.code(),
        status.message(),
        "",
        leader_hint(status),
        registered,
    )
}

fn leader_hint(status: &tonic::Status) -> Option<String> {
    status
        .metadata()
        .get("ctrlhub-leader")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn classify(
    code: tonic::Code,
    message: &str,
    field: &str,
    leader: Option<String>,
    registered: bool,
) -> SessionEnd {
    use tonic::Code;
    match code {
        Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated if !registered => {
            SessionEnd::Fatal(Error::Rejected {
                code,
                message: message.to_owned(),
                field: field.to_owned(),
            })
        }
        Code::Unavailable => SessionEnd::Retry {
            reason: match leader {
                Some(leader) => format!("manager unavailable (leader is {leader}): {message}"),
                None => format!("manager unavailable: {message}"),
            },
            registered,
        },
        _ => SessionEnd::Retry {
            reason: format!("{code:?}: {message}{}", field_suffix(field)),
            registered,
        },
    }
}

async fn session<K, C, F, Fut>(
    shared: &Arc<Shared<F, C>>,
    mut client: ControllerManagerClient<Channel>,
    shutdown: &CancellationToken,
) -> SessionEnd
where
    K: DeserializeOwned + Send + 'static,
    C: Send + Sync + 'static,
    F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    if shutdown.is_cancelled() {
        return SessionEnd::Stopped;
    }
    let name = shared.name.as_str();
    let capacity = shared.register.max_in_flight.max(1) as usize * 2 + 4;
    let (tx, rx) = mpsc::channel::<pb::ControllerMessage>(capacity);
    let register = message(controller_message::Message::Register(Box::new(
        shared.register.clone(),
    )));
    if tx.send(register).await.is_err() {
        return SessionEnd::Retry {
            reason: "outbound stream closed".into(),
            registered: false,
        };
    }
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    match shared.config.authorization() {
        Ok(auth) => {
            request.metadata_mut().insert("authorization", auth);
        }
        Err(err) => {
            return SessionEnd::Retry {
                reason: err.to_string(),
                registered: false,
            };
        }
    }

    info!(controller = %name, addr = %shared.config.addr, "connecting to manager");
    let response = tokio::select! {
        _ = shutdown.cancelled() => return SessionEnd::Stopped,
        r = client.connect(request) => r,
    };
    let mut inbound = match response {
        Ok(r) => r.into_inner(),
        Err(status) => return classify_status(&status, false),
    };
    let first = tokio::select! {
        _ = shutdown.cancelled() => return SessionEnd::Stopped,
        m = inbound.message() => m,
    };
    let registered = match first {
        Ok(Some(pb::ManagerMessage {
            message: Some(manager_message::Message::Registered(r)),
        })) => r,
        Ok(Some(pb::ManagerMessage {
            message: Some(manager_message::Message::Rejected(rej)),
        })) => {
            let code = tonic::Code::from_i32(rej.code);
            warn!(controller = %name, ?code, field = %rej.field, "registration rejected: {}", rej.message);
            return classify(code, &rej.message, &rej.field, None, false);
        }
        Ok(Some(other)) => {
            return SessionEnd::Retry {
                reason: format!("expected Registered, got {:?}", other.message),
                registered: false,
            };
        }
        Ok(None) => {
            return SessionEnd::Retry {
                reason: "stream ended before Registered".into(),
                registered: false,
            };
        }
        Err(status) => return classify_status(&status, false),
    };
    info!(
        controller = %name,
        session_id = %registered.session_id,
        leader = %registered.leader_identity,
        "registered with manager"
    );
    debug!(controller = %name, effective = ?registered.effective, readable = ?registered.readable, "effective registration");

    let reader = CachedReader::new(
        client.clone(),
        shared.config.clone(),
        registered.session_id.clone(),
    );
    // Cancelling this (on any return) stops every reconcile of the session:
    // their results would be discarded and the keys are re-delivered.
    let session_cancel = CancellationToken::new();
    let _cancel_on_exit = session_cancel.clone().drop_guard();
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut draining = false;
    let mut drain_deadline: Option<Instant> = None;
    let grace = shared.config.drain_grace;

    loop {
        let drain_timer = async {
            match drain_deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled(), if !draining => {
                draining = true;
                info!(controller = %name, in_flight = tasks.len(), "shutdown requested: draining session");
                if tx.send(message(controller_message::Message::Drain(pb::Drain::default()))).await.is_err() {
                    return SessionEnd::Stopped;
                }
                if tasks.is_empty() {
                    drain_deadline = Some(Instant::now() + grace);
                }
            }
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(err) = joined
                    && err.is_panic()
                {
                    error!(controller = %name, "reconcile task panicked outside the reconcile function");
                }
                if draining && tasks.is_empty() {
                    drain_deadline = Some(Instant::now() + grace);
                }
            }
            _ = drain_timer => {
                warn!(controller = %name, "manager did not close the drained session within {}; exiting", humantime::format_duration(grace));
                return SessionEnd::Stopped;
            }
            msg = inbound.message() => match msg {
                Ok(Some(pb::ManagerMessage { message: Some(m) })) => {
                    match m {
                        manager_message::Message::Reconcile(req) => {
                            dispatch::<K, C, F, Fut>(shared, req, &reader, &session_cancel, &tx, &mut tasks);
                        }
                        manager_message::Message::Revoked(rev) => {
                            let reason = pb::revoked::Reason::try_from(rev.reason)
                                .unwrap_or(pb::revoked::Reason::Unspecified);
                            warn!(
                                controller = %name,
                                ?reason,
                                code = ?tonic::Code::from_i32(rev.code),
                                leader = %rev.leader_identity,
                                "session revoked: {}", rev.message
                            );
                            if draining {
                                return SessionEnd::Stopped;
                            }
                            if reason == pb::revoked::Reason::Superseded {
                                return SessionEnd::Fatal(Error::Superseded {
                                    name: name.to_owned(),
                                    message: rev.message,
                                });
                            }
                            return SessionEnd::Retry {
                                reason: format!("revoked ({reason:?}): {}", rev.message),
                                registered: true,
                            };
                        }
                        manager_message::Message::Registered(_) => {
                            warn!(controller = %name, "ignoring a second Registered");
                        }
                        manager_message::Message::Rejected(rej) => {
                            let code = tonic::Code::from_i32(rej.code);
                            warn!(controller = %name, ?code, field = %rej.field, "session rejected: {}", rej.message);
                            if draining {
                                return SessionEnd::Stopped;
                            }
                            return classify(code, &rej.message, &rej.field, None, true);
                        }
                        manager_message::Message::Event(ev) => {
                            warn!(controller = %name, id = %ev.id, "ignoring an Event on a reconcile-mode session");
                        }
                        manager_message::Message::Heartbeat(_) => {}
                    }
                }
                Ok(Some(pb::ManagerMessage { message: None })) => {
                    debug!(controller = %name, "ignoring a manager message of an unknown kind");
                }
                Ok(None) => {
                    if draining {
                        info!(controller = %name, "session drained; manager closed the stream");
                        return SessionEnd::Stopped;
                    }
                    return SessionEnd::Retry {
                        reason: "manager closed the stream".into(),
                        registered: true,
                    };
                }
                Err(status) => {
                    if draining {
                        warn!(controller = %name, code = ?status.code(), "draining session ended: {}", status.message());
                        return SessionEnd::Stopped;
                    }
                    return classify_status(&status, true);
                }
            }
        }
    }
}

/// Starts one reconcile as a task of the session.
fn dispatch<K, C, F, Fut>(
    shared: &Arc<Shared<F, C>>,
    req: pb::ReconcileRequest,
    reader: &CachedReader,
    session_cancel: &CancellationToken,
    tx: &mpsc::Sender<pb::ControllerMessage>,
    tasks: &mut JoinSet<()>,
) where
    K: DeserializeOwned + Send + 'static,
    C: Send + Sync + 'static,
    F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    let id = req.id.clone();
    let cancel = session_cancel.child_token();
    let decoded = Request::<K>::from_proto(
        req,
        reader.clone(),
        cancel.clone(),
        SystemTime::now(),
        Instant::now(),
        shared.fallback_deadline,
    );
    let tx = tx.clone();
    let request = match decoded {
        Ok(r) => r,
        Err(err) => {
            error!(controller = %shared.name, request_id = %id, "undecodable request: {err}");
            let outcome = ReconcileError::terminal(err).to_outcome();
            tasks.spawn(async move {
                let _ = tx
                    .send(message(controller_message::Message::Result(
                        pb::ReconcileResult {
                            id,
                            outcome: Some(outcome),
                        },
                    )))
                    .await;
            });
            return;
        }
    };
    // Only when this process exports traces: otherwise no span, no cost. Dropped unfinished
    // (the session ended and its task was aborted), the span ends as `lost`.
    let otel = crate::traces::ReconcileSpan::new(crate::traces::enabled().then(|| {
        crate::traces::start_reconcile(&shared.name, &request, shared.config.tracer.as_ref())
    }));
    let span = reconcile_log_span(&shared.name, &request, &otel);
    let shared = shared.clone();
    tasks.spawn(
        async move {
            let key = request.key.clone();
            let deadline = request.deadline;
            let workers = shared.workers.clone();
            let ctx = shared.ctx.clone();
            let work = async {
                // Never more than max_concurrent_reconciles at once, even if
                // the manager were to over-send.
                let _permit = workers.acquire_owned().await.ok();
                AssertUnwindSafe((shared.reconcile)(request, ctx))
                    .catch_unwind()
                    .await
            };
            // The reconcile span is the current OpenTelemetry context inside the
            // reconcile function, so spans it starts become children.
            let work = opentelemetry::context::FutureExt::with_context(work, otel.context());
            let outcome = tokio::select! {
                r = work => outcome_of(&key, r),
                _ = tokio::time::sleep_until(deadline) => {
                    cancel.cancel();
                    warn!(%key, "reconcile cancelled at its deadline; the manager re-delivers the key");
                    otel.finish("deadline", Some("cancelled at its deadline"));
                    return;
                }
                _ = cancel.cancelled() => {
                    debug!(%key, "session ended; reconcile abandoned");
                    otel.finish("lost", Some("session ended before the result"));
                    return;
                }
            };
            let (label, error) = crate::traces::outcome_label(&outcome);
            otel.finish(label, error);
            let result = pb::ReconcileResult {
                id,
                outcome: Some(outcome),
            };
            if tx
                .send(message(controller_message::Message::Result(result)))
                .await
                .is_err()
            {
                debug!(%key, "session ended before the result could be sent");
            }
        }
        .instrument(span),
    );
}

/// The log span of one reconcile: every line logged while it runs names the key, attempt and
/// request, and the `trace_id`/`span_id` of its trace (this process's span when it exports
/// traces, else the trace the manager's `traceparent` names), so logs join traces.
fn reconcile_log_span<K>(
    controller: &str,
    request: &Request<K>,
    otel: &crate::traces::ReconcileSpan,
) -> tracing::Span {
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

/// The result to send for a reconcile function's return (or panic).
fn outcome_of(
    key: &crate::ObjectKey,
    r: Result<Result<Action, ReconcileError>, Box<dyn std::any::Any + Send>>,
) -> pb::reconcile_result::Outcome {
    match r {
        Ok(Ok(action)) => {
            debug!(%key, result = %action, "reconcile finished");
            action.to_outcome()
        }
        Ok(Err(err)) => {
            debug!(%key, kind = err.metric_label(), "reconcile failed: {err}");
            err.to_outcome()
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            error!(%key, "reconcile panicked: {what}");
            ReconcileError::retry(format!("reconcile panicked: {what}")).to_outcome()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn rejections_needing_a_human_are_fatal() {
        for code in [
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::Unauthenticated,
        ] {
            assert!(matches!(
                classify(code, "no", "register.primary", None, false),
                SessionEnd::Fatal(Error::Rejected { code: c, ref field, .. }) if c == code && field == "register.primary"
            ));
            // After registration (e.g. a stream error later) they are retried:
            // re-registering re-checks access.
            assert!(matches!(
                classify(code, "no", "", None, true),
                SessionEnd::Retry {
                    registered: true,
                    ..
                }
            ));
        }
        for code in [
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Internal,
        ] {
            assert!(matches!(
                classify(code, "later", "", None, false),
                SessionEnd::Retry { .. }
            ));
        }
    }

    #[test]
    fn unavailable_names_the_leader() {
        let mut status = tonic::Status::unavailable("standby");
        status.metadata_mut().insert(
            "ctrlhub-leader",
            tonic::metadata::MetadataValue::from_static("mgr-0"),
        );
        let SessionEnd::Retry { reason, .. } = classify_status(&status, false) else {
            panic!("expected retry");
        };
        assert!(reason.contains("mgr-0"), "{reason}");
    }
}
