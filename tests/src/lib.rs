//! # ctrlhub-tests
//!
//! The one test support library of ctrlhub, used by the integration and conformance suites
//! (`tests/tests/*.rs`) and by the benchmark harness (`ctrlhub-bench`) alike:
//!
//! - [`conformance`]: the SDK conformance suite's harness (tests/conformance/README.md);
//! - [`browser`]: headless Chromium over the DevTools protocol, acting as a person;
//! - [`cluster`]: devcluster in process with kube-rs, raw HTTPS and a kubeconfig for children;
//! - [`manager`]: the real `ctrlhub` binary as a child process, its status, metrics and lease;
//! - [`replica`]: a controller replica speaking the raw gRPC protocol;
//! - [`hostile`], [`strangers`]: the hostile-tenant bed and its attacks, and the attacks that
//!   need no credentials (or only junk ones);
//! - [`readme`](mod@readme): the command blocks of the README and docs/, for tests that run them
//!   as written;
//! - [`rbac`]: tenants as ServiceAccounts with tokens and RBAC grants;
//! - [`objects`]: namespaces, ConfigMaps and other objects applied as JSON;
//! - [`raw`]: raw HTTPS requests and watch streams;
//! - [`netproxy`]: a TCP proxy that can freeze, standing for an unreachable API server;
//! - [`widget`](mod@widget): the conformance suites' `Widget` custom resource;
//! - [`prometheus`]: a real Prometheus server scraping what a test points it at;
//! - [`process`]: binaries, free ports and child process handles;
//! - [`wait`]: [`PATIENCE`], the one bound on how long anything waits for a condition.
//!
//! Everything a suite uses is re-exported here (`use ctrlhub_tests::*;`), except [`rbac`].
//! Helpers that panic with a message are for tests; the harness uses their `try_`/`Result`
//! forms so that one failing scenario does not cost the figures of the others.

pub mod browser;
pub mod cluster;
pub mod conformance;
pub mod hostile;
pub mod manager;
pub mod netproxy;
pub mod objects;
pub mod process;
pub mod prometheus;
pub mod raw;
pub mod rbac;
pub mod readme;
pub mod replica;
pub mod strangers;
pub mod wait;
pub mod widget;

pub use cluster::{Cluster, init_tracing, start_cluster, start_cluster_with};
pub use manager::{FAST_LEASE, Launch, Manager, is_leading, metric_value};
pub use objects::{apply, namespace, put_configmap};
pub use process::{ChildProcess, bin, free_port, target_dir};
pub use raw::{RawApi, RawResponse, RawWatch};
pub use replica::{
    ConnectError, Replica, key, register, register_configmaps, secs, with_authorization,
};
pub use wait::{
    PATIENCE, POLL_INTERVAL, SERIAL, TimedOut, poll_until, wait_for, wait_until, within,
};
pub use widget::{Widget, WidgetSpec, WidgetStatus, install_widget_crd, rv_num, rv_of, widget};
