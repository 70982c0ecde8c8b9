//! The ctrlhub manager: shared caches, one work queue per controller, gRPC registration and
//! dispatch to out-of-process controllers, and Lease-based leader election.
//!
//! One folder per stage of the data path and per cross-cutting concern; dependencies point
//! down this list, never up (see `docs/architecture.md`):
//!
//! - `run`: command-line arguments, wiring and shutdown (and `ctrlhub dev` behind the `dev`
//!   feature).
//! - `net`: connections a stranger can open on either port (caps per peer and in all, deadlines
//!   for the first bytes and idle connections, accept backoff, the open-file limit).
//! - `grpc`, `http`: the two edges — the `ctrlhub.v1` service, and probes, metrics and the
//!   status page.
//! - `dispatch`: per-controller queues, fair dispatch seats, the dispatcher, the controller table.
//! - `policy`: tenant limits and weights from `TenantPolicy` objects, applied without a
//!   restart over the flags' defaults.
//! - `tenancy`: identities, authentication, authorization and limits.
//! - `leader`: Lease-based leader election.
//! - `kubeclient`: the manager's own Kubernetes clients (API-client metrics, QPS and burst).
//! - `informer`: the shared caches and the objects they hold.
//! - `registration`: what a controller registered, as domain types (scope, predicates, mapping).
//! - `metrics`, `key`, `throttle`: Prometheus series, object keys, and throttles for what tenants
//!   make the manager repeat; used by every stage.

pub(crate) mod dispatch;
pub(crate) mod grpc;
pub(crate) mod http;
pub(crate) mod informer;
pub mod key;
pub(crate) mod kubeclient;
pub(crate) mod leader;
// Public for tests and benchmarks, which compute a unit's owner with the manager's own function.
pub mod members;
pub(crate) mod metrics;
pub(crate) mod net;
pub(crate) mod policy;
// Public for the fuzz targets, which drive registration rules and predicates directly.
pub mod registration;
// Public for the binary: `ctrlhub run` and `ctrlhub dev`.
pub mod run;
pub(crate) mod tenancy;
pub(crate) mod throttle;
