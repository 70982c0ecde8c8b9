//! The axum router: the `/_devcluster/` admin endpoints, and every other path through the
//! request path of [`super::request`].

use super::admin;
use super::request::{self, Request};
use crate::auth::authn::Authenticator;
use crate::faults::Faults;
use crate::storage::store::Store;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Shared state of the HTTP handlers.
pub(crate) struct App {
    /// The object store.
    pub(crate) store: Store,
    /// Fault injection and statistics.
    pub(crate) faults: Faults,
    /// Verifies bearer tokens (the admin's and ServiceAccount tokens) and mints the latter.
    pub(crate) auth: Arc<Authenticator>,
    /// How often watches with allowWatchBookmarks get a bookmark.
    pub(crate) bookmark_interval: Duration,
    /// Cancelled on shutdown; ends every watch.
    pub(crate) shutdown: CancellationToken,
    /// The address clients reach the server at (for `/api`'s serverAddressByClientCIDRs).
    pub(crate) address: String,
}

/// The request body limit: kube-apiserver accepts about 3 MiB objects; allow headroom for lists.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// The axum router for the whole server.
pub(crate) fn router(app: Arc<App>) -> Router {
    admin::routes()
        .fallback(handle)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(app)
}

async fn handle(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let req = Request {
        method,
        path: uri.path().to_string(),
        headers,
        query,
    };
    match request::serve(&app, &req, body).await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::debug!(method = %req.method, path = %req.path, code = e.code, reason = e.reason, message = %e.message, "request failed");
            e.into_response()
        }
    }
}
