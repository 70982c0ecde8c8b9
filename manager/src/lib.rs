//! The ctrlhub manager: shared caches, one work queue per controller, gRPC registration and
//! dispatch to out-of-process controllers, and Lease-based leader election.
//!
//! The data path, one module per step:
//! `cache` (informers) → `registry` (scope, predicates) → `mapper` (keys) → `queue` (per
//! controller) → `controller` (dispatch to sessions) → `session` (gRPC) → back into `queue`.

pub mod accessreview;
pub mod cache;
pub mod config;
pub mod controller;
pub mod dev;
pub mod events;
pub mod http;
pub mod leader;
pub mod mapper;
pub mod memory;
pub mod object;
pub mod predicate;
pub mod queue;
pub mod registration;
pub mod registry;
pub mod scheduler;
pub mod session;
pub mod status_page;
pub mod telemetry;
pub mod tenant;
pub mod tokenreview;
pub mod traces;
pub mod ttlcache;
pub mod watched;
