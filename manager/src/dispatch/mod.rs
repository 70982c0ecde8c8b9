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
//! - `controllers`: the table of live controllers, which attaches sessions within tenant limits
//!   and wires informer subscriptions to their queues;
//! - `spans`: the dispatch path's OpenTelemetry spans;
//! - `usage`: what a tenant's controllers hold waiting for delivery, against its limits.
//!
//! May call `informer`, `registration`, `tenancy`, `metrics` and `key`; never `grpc`, `http` or
//! `run`, which call into it.

pub(crate) mod controllers;
pub(crate) mod dispatcher;
pub(crate) mod event_queue;
pub(crate) mod queue;
pub(crate) mod seats;
pub(crate) mod spans;
pub(crate) mod usage;
