//! Response helpers shared by the handlers: JSON bodies and the `Warning` headers of writes.

use crate::storage::WriteOptions;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

pub(super) fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

pub(super) fn ok(v: &Value) -> Response {
    json_response(StatusCode::OK, v)
}

/// Adds a `Warning: 299` header per warning the write produced, as kube-apiserver does.
pub(super) fn with_warnings(mut response: Response, wopts: &WriteOptions) -> Response {
    for w in wopts.warnings.lock().iter() {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = header::HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}
