//! Dispatch: from a key in a controller's queue to a request on one of its sessions, and the
//! result back into the queue.
//!
//! Owns:
//! - `queue`: the per-controller work queue, where the delivery contract (exclusive,
//!   at-least-once, requeue-after, backoff, terminal, priority) is decided — sans-IO;
//! - `event_queue`: the per-controller queue of EVENTS-mode registrations;
//! - `seats`: the manager-wide dispatch seats, shared fairly between tenants;
//! - `dispatcher`: one registered controller at run time — its sessions, what is in flight, and
//!   the dispatch loop;
//! - `scope`: a registration's namespace scope, the one place that decides which keys it may
//!   deliver (namespace list, label selector, RBAC gate) — a leaf, sans-IO;
//! - `admission`: the task that asks a gated selector scope's gate about each namespace that
//!   starts matching;
//! - `routing`: which informers a registration needs, and the subscribers that take an
//!   informer's event through scope, predicates and mapping into a controller's queue;
//! - `controllers`: the table of live controllers, which attaches sessions within tenant limits;
//! - `register_error`: why the table refused a registration;
//! - `spans`: the dispatch path's OpenTelemetry spans;
//! - `usage`: what a tenant's controllers hold waiting for delivery, against its limits.
//!
//! May call `informer`, `registration`, `tenancy`, `metrics` and `key`; never `grpc`, `http` or
//! `run`, which call into it.

pub(crate) mod admission;
pub(crate) mod controllers;
pub(crate) mod dispatcher;
pub(crate) mod event_queue;
pub(crate) mod queue;
pub(crate) mod register_error;
pub(crate) mod routing;
pub(crate) mod scope;
pub(crate) mod seats;
pub(crate) mod spans;
pub(crate) mod usage;
