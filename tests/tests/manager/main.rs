//! The manager from the outside: the real `ctrlhub` binary on devcluster, driven over gRPC,
//! HTTP and kubectl as controllers, operators and Prometheus drive it. One test binary, a
//! module per subject.

mod contract;
mod failover;
mod lifecycle;
mod mtls;
mod production;
mod protocol;
mod ring;
mod security;
mod status_page;
mod traces;
