//! HTTP: serving, routing and TLS — the Kubernetes REST paths, discovery and OpenAPI, watch
//! streams, and the `/_devcluster/` fault-injection endpoints.
//!
//! Owns:
//! - `serve`: the accept loop, TLS handshakes, HTTP/1.1 and HTTP/2, graceful shutdown;
//! - `tls`: the generated CA and serving certificate, and kubeconfigs;
//! - `app`: what every handler shares — the server's state ([`App`]) and the request's head;
//! - `router`: the axum router;
//! - `admin`: the `/_devcluster/` endpoints;
//! - `request`: the request path as named steps — authenticate, authorize, resolve, decode,
//!   inject faults, then a handler;
//! - `target`: a path resolved to a resource, namespace, name and subresource, and its verb;
//! - `decode`: bodies (protobuf, JSON, YAML) and query parameters into store options;
//! - `discovery`: `/version`, health, discovery and OpenAPI documents;
//! - `verbs`: a handler per verb, and the review APIs;
//! - `watch`: watch streams (events, bookmarks, in-stream errors);
//! - `reply`: JSON responses and `Warning` headers.
//!
//! May call every room below it (`auth`, `storage`, `admission`, `apply`, `catalog`) and the
//! modules `faults`, `render`, `protobuf`, `listoptions`, `selector`, `status` and `meta`;
//! only the crate root's [`crate::DevCluster`] calls into it.

mod admin;
mod app;
mod decode;
mod discovery;
mod reply;
mod request;
mod router;
pub(crate) mod serve;
mod target;
pub(crate) mod tls;
mod verbs;
mod watch;

pub(crate) use app::App;
pub(crate) use router::router;
