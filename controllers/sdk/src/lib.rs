//! # ctrlhub-sdk
//!
//! Write an out-of-process ctrlhub controller as briefly as a
//! controller-runtime one. The ctrlhub manager (this repository's `ctrlhub`
//! binary; `README.md` and `docs/protocol.md` at the repository's root) owns
//! the caches, leader election, namespace scoping, predicates and the work
//! queue; this crate registers your controller over gRPC, runs your reconcile
//! function for each request (up to `max_concurrent_reconciles` at once, one
//! attempt of a key at a time), answers with its result once the reconcile
//! has really stopped, cancels work that outlives its deadline or its
//! session, keeps the heartbeats that let the manager guarantee exclusive
//! attempts, reconnects with backoff, waits out a newer definition during a
//! rolling upgrade, and drains gracefully on shutdown.
//!
//! Controllers write to the Kubernetes API with their own [`kube::Client`]
//! (the manager is not a write proxy), given with [`Controller::client`];
//! reads can come from the manager's cache through [`Request::reader`].
//!
//! ## Example
//!
//! A controller that keeps a Deployment for every ConfigMap labelled
//! `app.example.com/deploy=true`, with a finalizer, an Event on cleanup and a
//! periodic resync:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use ctrlhub_sdk::{
//!     Action, Config, Controller, Mapping, Predicate, ReconcileError, Request, Scope, Selector,
//! };
//! use k8s_openapi::api::apps::v1::Deployment;
//! use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//! use kube::api::ObjectMeta;
//! use kube::Client;
//!
//! async fn reconcile(req: Request<ConfigMap>, _: Arc<()>) -> Result<Action, ReconcileError> {
//!     // Level-triggered: the request carries the current object (include_object); none
//!     // means NotFound, never a reason to clean up: the finalizer is what makes that happen.
//!     let Some(cm) = &req.object else {
//!         return Ok(Action::done());
//!     };
//!     let cleanup = || async {
//!         req.events().info(cm, "Deleting", "cleaning up");
//!         Ok::<_, ReconcileError>(())
//!     };
//!     if req.finalizers().finalize(cm, "example.com/cleanup", cleanup).await? {
//!         return Ok(Action::done()); // cleaned up; the ConfigMap goes
//!     }
//!     req.finalizers().ensure(cm, "example.com/cleanup").await?;
//!     let mut deployment = Deployment {
//!         metadata: ObjectMeta { name: cm.metadata.name.clone(), ..Default::default() },
//!         ..Default::default()
//!     };
//!     // Owned by the ConfigMap, server-side applied with the controller's field manager.
//!     req.apply(req.adopt(&mut deployment, cm)?).await?;
//!     // `req.reader().get::<Deployment>(..)` reads the child back from the manager's cache.
//!     Ok(Action::requeue_after(Duration::from_secs(300)))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     ctrlhub_sdk::logs::init()?; // CTRLHUB_LOG, CTRLHUB_LOG_FORMAT
//!     // SIGTERM or Ctrl-C drains: in-flight reconciles finish, then run() returns.
//!     let shutdown = ctrlhub_sdk::shutdown_on_signals();
//!     Controller::new("example")
//!         .reconciles::<ConfigMap>()
//!         .label_selector(Selector::labels([("app.example.com/deploy", "true")]))
//!         .include_object(true)
//!         .owns::<Deployment>() // cached in full: `req.reader().get::<Deployment>(..)` has its status
//!         .watches::<Secret>(Mapping::Label("app.example.com/owner".into()))
//!         .namespaces(Scope::All)
//!         .predicate(Predicate::generation_changed().or(Predicate::deleting()))
//!         .max_concurrent_reconciles(4)
//!         .deadline(Duration::from_secs(30))
//!         .client(Client::try_default().await?) // for writes and Events
//!         .run(Config::from_env()?, reconcile, Arc::new(()), shutdown)
//!         .await?;
//!     Ok(())
//! }
//! ```
//!
//! ## Modules
//!
//! - [`write`](mod@write): [`adopt`](write::adopt), server-side [`apply`](write::apply),
//!   [`patch_status`](write::patch_status), [`is_not_found`], [`is_conflict`] (also on every
//!   [`Request`]);
//! - [`events`]: Kubernetes Events, `ReconcileFailed` posted for every failure, aggregated and
//!   rate-limited like client-go's recorder;
//! - [`finalizers`]: `ensure` and `finalize` ([`Request::finalizers`]), and a
//!   [`finalizers::finalize`] flow;
//! - [`conditions`]: `metav1.Condition` with Kubernetes' transition semantics;
//! - [`logs`]: `CTRLHUB_LOG` and `CTRLHUB_LOG_FORMAT`, the reconcile start and end lines;
//! - [`health`]: `/healthz` and `/readyz` for kubelet probes (`CTRLHUB_HEALTH_ADDR`);
//! - [`traces`]: OpenTelemetry trace export (`OTEL_*` environment) and the
//!   `reconcile` span that joins the manager's trace;
//! - [`blocking`]: blocking work inside a reconcile, which the SDK waits for.
//!
//! ## Connection behaviour
//!
//! [`Controller::run`] dials [`Config::addr`] (plaintext HTTP/2, keepalive
//! 30 s; a new connection for every session) with `authorization: Bearer
//! <token>` on every call, sends `Register` and waits for `Registered`,
//! which the manager sends once every cache the registration reads has
//! listed. It logs that in one INFO line with the session id, the revision
//! and the kinds readable through the cache with their form (`readable=v1
//! ConfigMap (full), apps/v1 Deployment (full)`), and passes it to
//! [`Controller::on_registered`]. A rejection with INVALID_ARGUMENT,
//! PERMISSION_DENIED or UNAUTHENTICATED before `Registered` ends `run` with
//! an [`Error`]; a newer definition running (see [Rolling
//! upgrades](#rolling-upgrades)) makes the replica wait; every other end of
//! the stream (standby manager, leader change, network) reconnects with
//! exponential backoff and jitter (100 ms doubling to 10 s), reset whenever a
//! session registers, so that the two leader changes of a manager rollout
//! each cost one short wait. A manager shutting down, a standby and a leader
//! change are logged as "reconnecting", never as a rejection.
//!
//! In ring mode (`ctrlhub run --mode ring`) one member owns each controller.
//! A member that does not own it answers the `Register` with
//! `Rejected(UNAVAILABLE)` naming the owner (also in the trailers
//! `ctrlhub-owner`, `ctrlhub-owner-addr`), and a session whose controller
//! moved ends with `Revoked(UNIT_MOVED)` naming the new owner. The next
//! session dials the owner's `host:port` at once (no backoff, not a failed
//! attempt) on a new connection with the same token and TLS files (the TLS
//! server name is the owner's host), logged at INFO. At most 3 redirects in a
//! row without `Registered` are followed; the 4th, like any other failure
//! (nothing listening there, another status) or a `UNIT_MOVED` without an
//! address, goes back to [`Config::addr`] with the normal backoff. The ended
//! session's reconciles are cancelled as for any ended session, and cached
//! reads ride the current session's connection, so they reach the owner.
//!
//! Cancelling the shutdown token (SIGTERM) sends `Drain` and cancels
//! nothing: running reconciles finish (each at most until its deadline) and
//! answer, the manager closes the stream, and `run` returns once no
//! reconcile runs any more. The whole shutdown is bounded by
//! [`Config::shutdown_grace`] (30 s, Kubernetes' default
//! `terminationGracePeriodSeconds`): then the session ends and what still
//! runs is cancelled.
//!
//! ## Requests without an object
//!
//! With `include_object(true)`, [`Request::object`] is the cached primary.
//! `None` means the manager's cache holds no such object and it saw no
//! deletion: NotFound, which is not "deleted". Only a tombstone
//! ([`Request::tombstone`], reasons DELETED or LEFT_SCOPE) says the manager
//! saw the object go, and its last state ([`Request::deleted`]) may be
//! missing. Clean up external state under a finalizer (the
//! [`finalizers::finalize`] flow), never because a request lacks an object:
//! the SDK itself never answers Terminal for that.
//!
//! ## Children in full, or metadata only
//!
//! [`Controller::owns`] and [`Controller::watches`] have the manager cache
//! the kind in full, so [`CachedReader::get`] and [`CachedReader::list`]
//! read a child's spec and status (a Deployment's `readyReplicas`, say).
//! [`Controller::owns_metadata`] and [`Controller::watches_metadata`] ask for
//! metadata only (a fraction of the memory); the kind is then read with
//! [`CachedReader::get_metadata`] and [`CachedReader::list_metadata`] as
//! `PartialObjectMeta<K>`, and `get::<K>` answers
//! [`ReadError::MetadataOnly`]. A kind is cached in metadata only when every
//! entry of it asks for that.
//!
//! ## Cancellation and blocking work
//!
//! A reconcile is cancelled a little before its deadline (5 % of the time
//! left, at most 500 ms) and when its session ends: [`Request::cancelled`] is
//! cancelled and the reconcile's future is dropped, so every `.await` in it
//! stops there. Blocking code cannot be stopped that way: run it through
//! [`blocking`], and the SDK waits for it before it drops the reconcile,
//! answers, or starts the key's next attempt. The result of a reconcile that
//! has stopped is sent then, on its own session while that lives (an attempt
//! cancelled at its deadline answers just after the manager's deadline, which
//! the manager counts as a missed deadline and re-delivers as REDELIVERY).
//! Within the process, a request for a key whose earlier attempt still runs
//! (from any session) waits for it before it starts.
//!
//! ## Exclusive attempts
//!
//! The SDK registers with `exclusive_attempts` (docs/protocol.md, "Exclusive
//! attempts"): the manager never hands a key to another replica while an
//! attempt of it may still run here. In return, the SDK sends a heartbeat
//! every `Registered.heartbeat_interval` and anchors on when it sent the last
//! one the manager answered. Requests start only once a heartbeat was
//! answered. With no answer for half of `Registered.hold` (the manager is
//! gone, or the network is cut), it cancels every reconcile of the session,
//! takes no more work from it, ends it and reconnects. If a reconcile of that
//! session still runs at 80 % of the hold (blocking code that ignores its
//! cancellation), a watchdog thread logs one ERROR line naming the keys and
//! exits the process with [`HOLD_EXIT_CODE`] (70), so that Kubernetes
//! restarts it before the manager may give the key to another replica. The
//! hold is the manager's lease duration less its renew deadline (5 s by
//! default).
//!
//! ## Rolling upgrades
//!
//! Replicas of one controller share a queue when their definitions (every
//! `Register` field but `max_in_flight`, `revision` and `exclusive_attempts`)
//! agree. When a Deployment rollout changes the definition (a new watch, a
//! new deadline), `Register.revision` decides; it comes from
//! [`Controller::revision`], else from the `CTRLHUB_REVISION` environment
//! variable ([`REVISION_ENV`]), else 0:
//!
//! - **a higher revision replaces the running definition at once**: the old
//!   replicas receive `Revoked(SUPERSEDED)`; each cancels its reconciles,
//!   logs why at WARN, takes no work and registers again every
//!   [`Config::outdated_wait`] (30 s) without exiting, until the rollout has
//!   replaced it. Bump `CTRLHUB_REVISION` in the pod template together with
//!   the image:
//!
//!   ```yaml
//!   env:
//!     - name: CTRLHUB_REVISION
//!       value: "7"   # raise it whenever the controller's registration changes
//!   ```
//!
//! - **an equal or lower revision waits**: the new replicas are refused
//!   (`Rejected` with `outdated`), log why at WARN, and register again every
//!   30 s; the running definition keeps working until the rollout has
//!   replaced all its replicas, and then the new one is accepted.
//!
//! Either way nothing crash-loops and no two definitions flap. Only
//! INVALID_ARGUMENT, PERMISSION_DENIED and UNAUTHENTICATED before
//! `Registered` end `run` with an error.
//!
//! ## Example operator
//!
//! `examples/website.rs` is a complete operator (a custom resource that owns
//! a Deployment and a Service, a finalizer guarding external state, a Ready
//! condition read through the cache), tested end to end against the real
//! manager in `tests/website.rs`: 157 lines with the write helpers, 96 of them
//! the operator itself.

pub mod conditions;
pub mod events;
pub mod finalizers;
pub mod health;
pub mod logs;
pub mod traces;
pub mod write;

mod action;
mod backoff;
mod blocking;
mod config;
mod definition;
mod predicate;
mod reader;
mod request;
mod runtime;
mod selector;
#[cfg(test)]
mod shared_cases;

pub use action::{Action, Cause, ReconcileError};
pub use backoff::Backoff;
pub use blocking::blocking;
pub use config::{Config, ConfigError, DEFAULT_ADDR, DEFAULT_TOKEN, TlsFiles};
pub use definition::{
    Controller, Mapping, REVISION_ENV, Scope, dynamic_resource_type, resource_type,
};
pub use predicate::Predicate;
pub use reader::{CachedReader, RawObject, ReadError};
pub use request::{DecodeError, ObjectKey, Reason, Request};
pub use runtime::{Error, HOLD_EXIT_CODE, Readable, SessionInfo};
pub use selector::{Requirement, Selector};
pub use write::{WriteError, is_conflict, is_not_found};

/// The module's earlier name, kept so that `ctrlhub_sdk::finalizer::...` paths still compile; the
/// three SDKs now all call the concept `finalizers`.
#[doc(hidden)]
pub use finalizers as finalizer;

/// The Kubernetes API types (`k8s-openapi`, with its `v1_33` feature), re-exported for the same
/// reason.
pub use k8s_openapi;
/// The Kubernetes client this SDK builds on (the version it was built against), so that a
/// controller's `kube` calls and the SDK's agree.
pub use kube;

/// The generated wire types (`ctrlhub.v1`), e.g. for
/// [`Controller::reconciles_dynamic`].
pub use ctrlhub_proto::v1 as proto;
/// Re-exported so that controllers need not depend on tokio-util directly.
pub use tokio_util::sync::CancellationToken;

/// A token cancelled on SIGTERM or SIGINT (Ctrl-C), for [`Controller::run`]'s `shutdown`: the
/// first signal drains (running reconciles finish, then `run` returns), a second one exits the
/// process at once with status 130. Call it inside the tokio runtime.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        for n in 0.. {
            let sigterm = async {
                #[cfg(unix)]
                if let Some(t) = &mut term {
                    t.recv().await;
                    return;
                }
                std::future::pending::<()>().await;
            };
            let interrupt = async {
                if tokio::signal::ctrl_c().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = sigterm => {}
                () = interrupt => {}
            }
            if n == 0 {
                tracing::info!("signal received: draining (signal again to exit at once)");
                cancel.cancel();
            } else {
                tracing::warn!("second signal: exiting without draining");
                std::process::exit(130);
            }
        }
    });
    token
}
