//! Dispatch: from a key in a controller's queue to a request on one of its sessions, and the
//! result back into the queue.
//!
//! Owns the per-controller work queues (`queue`, and `event_queue` for EVENTS mode), the
//! manager-wide dispatch seats shared fairly between tenants (`seats`), the per-controller
//! dispatcher (`dispatcher`), the table of live controllers that wires informer subscriptions to
//! their queues (`controllers`), and the dispatch path's spans (`spans`). It may call
//! `informer`, `registration`, `tenancy` and `metrics`; it knows nothing of gRPC or HTTP.

pub mod controllers;
pub mod dispatcher;
pub mod event_queue;
pub mod queue;
pub mod seats;
pub mod spans;
