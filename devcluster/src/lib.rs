//! devcluster: an embedded, in-memory Kubernetes API server for `ctrlhub dev` and for tests.
//!
//! It speaks the real REST protocol over HTTPS — discovery, CRUD, list/watch with
//! resourceVersions and bookmarks, every patch type, subresources, finalizers, garbage
//! collection, CRDs — so kube-rs, kubectl and the Python client work against it unchanged, and it
//! injects faults (dropped watches, forced 410s, failing or slow requests, frozen Leases) for
//! reliability tests. Requests authenticate with bearer tokens (the kubeconfig's admin token, or
//! ServiceAccount tokens from the TokenRequest API) and non-admin users are authorized by RBAC;
//! TokenReview and SubjectAccessReview answer as kube-apiserver's do.
//!
//! ```no_run
//! # async fn demo() -> Result<(), devcluster::Error> {
//! let cluster = devcluster::DevCluster::start(devcluster::Options::default()).await?;
//! let client = cluster.client().await?;
//! cluster.faults().close_watches();
//! # Ok(()) }
//! ```

#![warn(unreachable_pub)]

pub mod admission;
pub(crate) mod apply;
pub(crate) mod auth;
pub mod catalog;
pub(crate) mod cluster;
pub(crate) mod faults;
pub(crate) mod http;
pub(crate) mod listoptions;
pub(crate) mod meta;
pub mod protobuf;
pub(crate) mod render;
#[cfg(test)]
mod rooms;
pub mod selector;
pub(crate) mod status;
pub mod storage;

pub use auth::authn::{AuthCounts, Identity};
pub use cluster::{DevCluster, Options};
pub use faults::{Faults, Stats};

/// Why a devcluster could not start or a client could not be built for it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listen address could not be bound.
    #[error("cannot listen: {0}")]
    Bind(#[source] std::io::Error),
    /// Certificate generation or TLS configuration failed.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// The kube client configuration could not be built.
    #[error("kube client configuration failed: {0}")]
    Client(String),
    /// A token could not be issued.
    #[error("cannot issue a token: {0}")]
    Token(#[from] auth::authn::MintError),
}
