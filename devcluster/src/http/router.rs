//! The axum router: the `/_devcluster/` admin endpoints, and every other path through the
//! request path of [`super::request`].

use super::admin;
use super::app::{App, Request};
use super::request;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::Arc;

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
