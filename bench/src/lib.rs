//! # ctrlhub-bench
//!
//! The benchmark harness: every scenario runs ctrlhub (the real `ctrlhub` binary and
//! out-of-process controllers over gRPC) side by side with its peer (kube-rs'
//! `kube::runtime::Controller`, in process or as independent processes) against one in-memory
//! devcluster in the same run, and reports a table row per figure with the goal it is held to.
//!
//! Controllers report every reconcile start on stdout as `R <namespace>/<name> <latency-µs>`
//! (latency is `-1` when the object carries no timestamp annotation), so the harness observes
//! ctrlhub's out-of-process replicas and kube-rs' processes through one channel.

pub mod contenders;
pub mod env;
pub mod report;
pub mod scenarios;

pub use report::{Outcome, Row, Verdict};
