//! # ctrlhub-sdk
//!
//! Write an out-of-process [ctrlhub] controller as briefly as a
//! controller-runtime one. The manager owns the caches, leader election,
//! namespace scoping, predicates and the work queue; this crate registers
//! your controller over gRPC, runs your reconcile function for each request
//! (up to `max_concurrent_reconciles` at once), answers with its result,
//! cancels work that outlives its deadline, reconnects with backoff, and
//! drains gracefully on shutdown.
//!
//! Controllers write to the Kubernetes API with their own [`kube::Client`]
//! (the manager is not a write proxy); reads can come from the manager's
//! cache through [`Request::reader`].
//!
//! ## Example
//!
//! A controller that keeps a Deployment for every ConfigMap labelled
//! `app.example.com/deploy=true`, with a finalizer, a condition-free status,
//! an Event on cleanup and a periodic resync:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use ctrlhub_sdk::events::{EventRecorder, EventType};
//! use ctrlhub_sdk::finalizer::{FinalizerEvent, finalize};
//! use ctrlhub_sdk::{
//!     Action, Config, Controller, Mapping, Predicate, ReconcileError, Request, Scope, Selector,
//! };
//! use k8s_openapi::api::apps::v1::Deployment;
//! use k8s_openapi::api::core::v1::{ConfigMap, Secret};
//! use kube::api::{Api, ObjectMeta};
//! use kube::Client;
//! use tokio_util::sync::CancellationToken;
//!
//! struct Ctx {
//!     client: Client,
//!     events: EventRecorder,
//! }
//!
//! async fn reconcile(req: Request<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
//!     let ns = req.namespace().unwrap_or("default").to_owned();
//!     let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
//!     // Level-triggered: read the current state (here from the API server;
//!     // `req.reader().get::<ConfigMap>(..)` reads the manager's cache).
//!     let Some(cm) = api.get_opt(req.name()).await? else {
//!         return Ok(Action::done()); // gone: owned children are garbage-collected
//!     };
//!     finalize(&api, cm, "example.com/cleanup", |event| async {
//!         match event {
//!             FinalizerEvent::Apply(cm) => {
//!                 let deployment = Deployment {
//!                     metadata: ObjectMeta {
//!                         name: cm.metadata.name.clone(),
//!                         ..Default::default()
//!                     },
//!                     ..Default::default()
//!                 };
//!                 ctrlhub_sdk::apply::apply_owned(&ctx.client, &cm, deployment, "example").await?;
//!                 Ok(Action::requeue_after(Duration::from_secs(300)))
//!             }
//!             FinalizerEvent::Cleanup(cm) => {
//!                 let _ = ctx.events.record(&cm, EventType::Normal, "Deleting", "cleaning up").await;
//!                 Ok(Action::done())
//!             }
//!         }
//!     })
//!     .await
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let client = Client::try_default().await?;
//!     let ctx = Arc::new(Ctx {
//!         events: EventRecorder::new(client.clone(), "example"),
//!         client,
//!     });
//!     let shutdown = CancellationToken::new();
//!     let on_signal = shutdown.clone();
//!     tokio::spawn(async move {
//!         let _ = tokio::signal::ctrl_c().await;
//!         on_signal.cancel(); // drains: in-flight reconciles finish, then run() returns
//!     });
//!
//!     Controller::new("example")
//!         .reconciles::<ConfigMap>()
//!         .label_selector(Selector::labels([("app.example.com/deploy", "true")]))
//!         .owns::<Deployment>()
//!         .watches::<Secret>(Mapping::Label("app.example.com/owner".into()))
//!         .namespaces(Scope::All)
//!         .predicate(Predicate::generation_changed().or(Predicate::deleting()))
//!         .max_concurrent_reconciles(4)
//!         .deadline(Duration::from_secs(30))
//!         .run(Config::from_env()?, reconcile, ctx, shutdown)
//!         .await?;
//!     Ok(())
//! }
//! ```
//!
//! ## Modules
//!
//! - [`finalizer`]: add/remove a finalizer, and the [`finalizer::finalize`] flow;
//! - [`conditions`]: `metav1.Condition` with Kubernetes' transition semantics;
//! - [`apply`]: server-side apply of controlled children;
//! - [`events`]: Kubernetes Events about objects;
//! - [`traces`]: OpenTelemetry trace export (`OTEL_*` environment) and the
//!   `reconcile` span that joins the manager's trace.
//!
//! ## Connection behaviour
//!
//! [`Controller::run`] dials [`Config::addr`] (plaintext HTTP/2, keepalive
//! 30 s) with `authorization: Bearer <token>` on every call, sends
//! `Register`, and waits for `Registered`. A rejection with
//! INVALID_ARGUMENT, PERMISSION_DENIED or UNAUTHENTICATED, or a `Revoked`
//! with reason SUPERSEDED, ends `run` with an [`Error`]; every other end of
//! the stream (standby manager, leader change, network) reconnects with
//! exponential backoff and jitter (100 ms doubling to 10 s, reset after a
//! session of 30 s). Cancelling the shutdown token sends `Drain`, lets
//! in-flight reconciles finish and answer, and returns once the manager
//! closes the stream.
//!
//! [ctrlhub]: https://example.invalid/ctrlhub

pub mod apply;
pub mod conditions;
pub mod events;
pub mod finalizer;
pub mod traces;

mod action;
mod backoff;
mod blocking;
mod config;
mod controller;
mod predicate;
mod reader;
mod request;
mod runtime;
mod selector;

pub use action::{Action, ReconcileError};
pub use backoff::Backoff;
pub use blocking::blocking;
pub use config::{Config, ConfigError, DEFAULT_ADDR, DEFAULT_TOKEN, TlsFiles};
pub use controller::{
    Controller, Mapping, REVISION_ENV, Scope, dynamic_resource_type, resource_type,
};
pub use predicate::Predicate;
pub use reader::{CachedReader, RawObject, ReadError};
pub use request::{DecodeError, ObjectKey, Reason, Request};
pub use runtime::{Error, HOLD_EXIT_CODE, Readable, SessionInfo};
pub use selector::{Requirement, Selector};

/// The generated wire types (`ctrlhub.v1`), e.g. for
/// [`Controller::reconciles_dynamic`].
pub use ctrlhub_proto::v1 as proto;
/// Re-exported so that controllers need not depend on tokio-util directly.
pub use tokio_util::sync::CancellationToken;

/// A failed Kubernetes write from one of the helper modules.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The object has no `metadata.name`.
    #[error("object has no metadata.name")]
    MissingName,
    /// The object has no `metadata.namespace` and none could be inferred.
    #[error("object has no metadata.namespace")]
    MissingNamespace,
    /// The owner has no uid (it was never stored by the API server).
    #[error("owner has no metadata.uid (was it ever created?)")]
    MissingUid,
    /// The API server refused the write.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

impl From<ObjectError> for ReconcileError {
    fn from(err: ObjectError) -> Self {
        match err {
            ObjectError::Kube(e) => e.into(),
            other => ReconcileError::terminal(other),
        }
    }
}
