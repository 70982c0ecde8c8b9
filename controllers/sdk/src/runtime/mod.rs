//! The runtime: [`Controller::run`] keeps a session with the manager (reconnecting with
//! backoff, waiting while a newer definition runs), runs reconciles, and returns once shut down
//! and no reconcile runs any more. In order: start (check the settings, bind the health
//! endpoint) → sessions (each: dial → open → registered → serve → end, then reconnect after a
//! backoff, wait while outdated, or stop) → wait for the cancelled reconciles → return.
//!
//! - `session`: the sessions one after another, and one session as named steps;
//! - `attempt`: one request, from waiting for its key to sending its result;
//! - `batches`: the outbound stream, results that are ready together in one message;
//! - `fence`: heartbeats, the anchor and the hold watchdog (exclusive attempts);
//! - `keys`: one attempt of a key at a time in the process;
//! - `redirect`: ring mode, following a member's redirect to the owner of the controller;
//! - `info`: what a registration answered ([`SessionInfo`]).

mod attempt;
mod batches;
mod fence;
mod info;
mod keys;
mod redirect;
mod session;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ctrlhub_proto::v1 as pb;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::transport::Endpoint;
use tracing::{error, info, warn};

pub(crate) use batches::MAX_BATCH;
pub use fence::HOLD_EXIT_CODE;
pub use info::{Readable, SessionInfo};

use crate::definition::{OnRegistered, REVISION_ENV, effective_revision};
use crate::health::Health;
use crate::request::Kit;
use crate::{Action, Config, ConfigError, Controller, ReconcileError, Request};
use keys::Attempts;
use redirect::Owner;

/// Why [`Controller::run`] gave up. Everything else (manager restarts, leader changes, network
/// errors, a newer definition running) is waited out.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid connection settings (or an invalid `CTRLHUB_REVISION`).
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
    /// The health endpoint ([`Config::health_addr`]) cannot listen.
    #[error("the health endpoint cannot listen on {addr}: {source}")]
    Health {
        /// The address it was given.
        addr: std::net::SocketAddr,
        /// Why it cannot.
        #[source]
        source: std::io::Error,
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
            Self::Health { .. } => "health",
        }
    }
}

/// How one session ended.
#[derive(Debug)]
pub(crate) enum SessionEnd {
    /// Shutdown requested before a session was established, or a drain completed: `run`
    /// returns Ok.
    Stopped,
    /// Needs a human: `run` returns this error.
    Fatal(Error),
    /// Reconnect with backoff. `registered` tells whether the session got going (for the
    /// backoff reset).
    Retry { reason: String, registered: bool },
    /// A newer (or conflicting) definition runs: take no work, register again after
    /// [`Config::outdated_wait`].
    Outdated { reason: String },
    /// Ring mode: another member owns this controller; the next session dials `owner` at once
    /// (see `redirect`). `registered` as in `Retry`.
    Redirect { owner: Owner, registered: bool },
}

/// What every session and reconcile of one `run` shares.
pub(crate) struct Shared<F, C> {
    name: String,
    register: pb::Register,
    reconcile: F,
    ctx: Arc<C>,
    workers: Arc<Semaphore>,
    fallback_deadline: Duration,
    config: Arc<Config>,
    attempts: Arc<Attempts>,
    on_registered: Option<OnRegistered>,
    /// The write helpers and Events of every request.
    kit: Arc<Kit>,
    /// What the health endpoint answers.
    health: Arc<Health>,
}

impl<K> Controller<K>
where
    K: DeserializeOwned + Send + 'static,
{
    /// Runs the controller until `shutdown` is cancelled (then drains and returns `Ok`) or a
    /// registration is rejected in a way that needs a human (returns `Err`).
    ///
    /// Connects to the manager, registers (with `Register.revision` from
    /// [`revision`](Controller::revision) or `CTRLHUB_REVISION`, and `exclusive_attempts`),
    /// runs up to `max_concurrent_reconciles` reconciles at once, one attempt of a key at a
    /// time, and answers each request once its reconcile has really stopped. It cancels a
    /// reconcile shortly before its deadline, and every reconcile of a session that ends or
    /// whose heartbeats go unanswered for half the hold. It reconnects with exponential backoff
    /// and jitter when a session ends, and waits [`Config::outdated_wait`] when a newer
    /// definition runs. It returns only once no reconcile runs any more (see the crate docs).
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
        let started = self.start(config, reconcile, ctx)?;
        let shared = &started.shared;
        let end = session::sessions::<K, C, F, Fut>(shared, &started.endpoint, &shutdown).await;
        shared.health.not_ready("stopped: the controller shut down");
        wait_for_reconciles(shared).await;
        match &end {
            Ok(()) => {
                info!(controller = %shared.name, "controller stopped: drained, and no reconcile runs")
            }
            Err(err) => error!(controller = %shared.name, error = %err, "giving up: {err}"),
        }
        end
    }

    /// Checks the settings and the definition, and starts what lives as long as `run`: the
    /// health endpoint (bound now, so that a port in use fails `run` at once) and its ticker.
    fn start<C, F>(
        self,
        config: Config,
        reconcile: F,
        ctx: Arc<C>,
    ) -> Result<Started<F, C>, Error> {
        config.validate()?;
        if self.primary.is_none() {
            return Err(Error::NoPrimary(self.name));
        }
        let endpoint = session::endpoint(&config)?;
        let env = std::env::var(REVISION_ENV).ok();
        let mut register = self.to_register();
        register.revision = effective_revision(self.revision, env.as_deref())?;
        let health = Arc::new(Health::new(
            config.stuck_after,
            format!("connecting to the manager at {}", config.addr),
        ));
        let server = match config.health_addr {
            Some(addr) => Some(
                crate::health::serve(addr, health.clone())
                    .map_err(|source| Error::Health { addr, source })?,
            ),
            None => None,
        };
        let ticking = CancellationToken::new();
        health.keep_ticking(ticking.clone());
        let shared = Arc::new(Shared {
            name: self.name.clone(),
            register,
            reconcile,
            ctx,
            workers: Arc::new(Semaphore::new(self.concurrency as usize)),
            fallback_deadline: self.deadline.unwrap_or(Duration::from_secs(60)),
            config: Arc::new(config),
            attempts: Arc::new(Attempts::default()),
            on_registered: self.on_registered,
            kit: Arc::new(Kit::new(&self.name, self.client.map(|c| c.0))),
            health,
        });
        Ok(Started {
            shared,
            endpoint,
            _server: server,
            _ticking: ticking.drop_guard(),
        })
    }
}

/// What [`Controller::run`] started; the health endpoint and its ticker stop when it drops.
struct Started<F, C> {
    shared: Arc<Shared<F, C>>,
    endpoint: Endpoint,
    _server: Option<crate::health::Server>,
    _ticking: DropGuard,
}

/// Waits until no reconcile of any session runs, at most [`Config::shutdown_grace`]. The
/// sessions have ended, so every one of them is cancelled; blocking work may hold one up.
async fn wait_for_reconciles<F, C>(shared: &Shared<F, C>) {
    let running = shared.attempts.running();
    if running == 0 {
        return;
    }
    info!(controller = %shared.name, running, "waiting for the cancelled reconciles to stop");
    let grace = shared.config.shutdown_grace;
    if tokio::time::timeout(grace, shared.attempts.all_stopped())
        .await
        .is_err()
    {
        warn!(
            controller = %shared.name,
            running = shared.attempts.running(),
            "reconciles still run {} after the end of the last session; returning anyway",
            humantime::format_duration(grace)
        );
    }
}

/// How a stream's status ends the session: a redirect when its trailers name the owner.
fn classify_status(status: &tonic::Status, registered: bool) -> SessionEnd {
    if let Some(owner) = Owner::from_status(status) {
        return SessionEnd::Redirect { owner, registered };
    }
    classify_code(
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

/// How a `Rejected` ends the session: outdated (a newer or conflicting definition runs), a
/// redirect when another ring member owns the controller, fatal before registration for
/// refusals only a human can fix, otherwise retried.
fn classify(rej: &pb::Rejected, registered: bool) -> SessionEnd {
    if rej.outdated {
        return SessionEnd::Outdated {
            reason: format!(
                "another definition of this controller runs at a higher or equal revision: {}",
                rej.message
            ),
        };
    }
    if let Some(owner) = Owner::from_rejected(rej) {
        return SessionEnd::Redirect { owner, registered };
    }
    let code = tonic::Code::from_i32(rej.code);
    classify_code(code, &rej.message, &rej.field, None, registered)
}

fn classify_code(
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn rejected(code: Code, field: &str, outdated: bool) -> pb::Rejected {
        pb::Rejected {
            code: code as i32,
            message: "no".into(),
            field: field.into(),
            outdated,
            ..Default::default()
        }
    }

    #[test]
    fn rejections_needing_a_human_are_fatal() {
        for code in [
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::Unauthenticated,
        ] {
            assert!(matches!(
                classify(&rejected(code, "register.primary", false), false),
                SessionEnd::Fatal(Error::Rejected { code: c, ref field, .. }) if c == code && field == "register.primary"
            ));
            // After registration (e.g. a stream error later) they are retried:
            // re-registering re-checks access.
            assert!(matches!(
                classify(&rejected(code, "", false), true),
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
                classify(&rejected(code, "", false), false),
                SessionEnd::Retry { .. }
            ));
        }
    }

    #[test]
    fn an_outdated_definition_waits_and_never_fails() {
        for registered in [false, true] {
            assert!(matches!(
                classify(&rejected(Code::FailedPrecondition, "", true), registered),
                SessionEnd::Outdated { .. }
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

    #[test]
    fn a_ring_members_redirect_names_the_owner() {
        let rej = pb::Rejected {
            code: Code::Unavailable as i32,
            message: "mgr-1 owns this controller".into(),
            owner_identity: "mgr-1".into(),
            owner_address: "10.0.0.2:9090".into(),
            ..Default::default()
        };
        assert!(matches!(
            classify(&rej, false),
            SessionEnd::Redirect { ref owner, registered: false } if owner.addr == "10.0.0.2:9090" && owner.identity == "mgr-1"
        ));
        let mut status = tonic::Status::unavailable("not the owner");
        status.metadata_mut().insert(
            "ctrlhub-owner-addr",
            tonic::metadata::MetadataValue::from_static("10.0.0.2:9090"),
        );
        assert!(matches!(
            classify_status(&status, true),
            SessionEnd::Redirect { ref owner, registered: true } if owner.addr == "10.0.0.2:9090"
        ));
    }
}
