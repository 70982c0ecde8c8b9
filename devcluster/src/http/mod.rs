//! HTTP: serving, routing and TLS — the Kubernetes REST paths, discovery, `/version`, the
//! OpenAPI endpoints, watch streams, and the `/_devcluster/` fault-injection endpoints.
//!
//! Owns:
//! - `api`: the router and the request path;
//! - `watch`: watch streams (events, bookmarks, in-stream errors);
//! - `tls`: the generated CA and serving certificate, and kubeconfigs.
//!
//! May call every room below it (`auth`, `storage`, `admission`, `apply`, `catalog`) and the
//! modules `faults`, `render`, `protobuf`, `listoptions`, `selector`, `status` and `meta`;
//! nothing calls into it but the crate root's [`crate::DevCluster`].

pub(crate) mod api;
pub(crate) mod tls;
pub(crate) mod watch;
