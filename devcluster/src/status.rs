//! API errors rendered as `metav1.Status`, the only error shape Kubernetes clients understand.
//!
//! Clients branch on `reason` and `code` (kube-rs `ErrorResponse`, client-go `apierrors.IsConflict`,
//! kubectl's messages), so every failure the server returns goes through [`ApiError`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One `details.causes` entry of a Status (which field was wrong and why).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cause {
    /// Machine-readable cause type, e.g. `FieldValueRequired`.
    pub(crate) reason: String,
    /// Human-readable explanation.
    pub(crate) message: String,
    /// JSON path of the offending field, e.g. `metadata.name`.
    pub(crate) field: String,
}

/// A failed API request, carrying everything a `metav1.Status` needs.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub(crate) code: u16,
    /// `metav1.StatusReason`, e.g. `NotFound`.
    pub(crate) reason: &'static str,
    /// Human-readable message, worded like kube-apiserver's.
    pub(crate) message: String,
    /// `details.name`, `details.group`, `details.kind` when known.
    pub(crate) details: Option<Box<Value>>,
    /// `details.causes` for Invalid and Conflict errors.
    pub(crate) causes: Vec<Cause>,
    /// `details.retryAfterSeconds` for throttling-like failures.
    pub(crate) retry_after: Option<u32>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            causes: Vec::new(),
            retry_after: None,
        }
    }

    /// 404: `resource "name" not found` in kube-apiserver's wording.
    pub(crate) fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        let mut e = Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"));
        e.details = Some(Box::new(
            json!({"name": name, "group": group, "kind": resource}),
        ));
        e
    }

    /// 404 for a path that names no served resource.
    pub(crate) fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 AlreadyExists.
    pub(crate) fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        );
        e.details = Some(Box::new(
            json!({"name": name, "group": group, "kind": resource}),
        ));
        e
    }

    /// 409 Conflict on a stale resourceVersion precondition.
    pub(crate) fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let qualified = qualified(group, resource);
        let mut e = Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
        );
        e.details = Some(Box::new(
            json!({"name": name, "group": group, "kind": resource}),
        ));
        e
    }

    /// 409 Conflict with causes (server-side apply field conflicts).
    pub(crate) fn apply_conflict(message: String, causes: Vec<Cause>) -> Self {
        let mut e = Self::new(409, "Conflict", message);
        e.causes = causes;
        e
    }

    /// 422 Invalid with the causes that say which fields to fix.
    pub(crate) fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let message = format!(
            "{kind}.{group} \"{name}\" is invalid: {}",
            summary.join(", ")
        );
        let message = message.replace(".\"", "\"").replace(". \"", " \"");
        let mut e = Self::new(422, "Invalid", message);
        e.details = Some(Box::new(
            json!({"name": name, "group": group, "kind": kind}),
        ));
        e.causes = causes;
        e
    }

    /// 422 Invalid for a single field.
    pub(crate) fn invalid_field(
        kind: &str,
        group: &str,
        name: &str,
        field: &str,
        reason: &str,
        message: &str,
    ) -> Self {
        Self::invalid(
            kind,
            group,
            name,
            vec![Cause {
                reason: reason.to_string(),
                message: message.to_string(),
                field: field.to_string(),
            }],
        )
    }

    /// 400 BadRequest.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 403 Forbidden.
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 405 MethodNotAllowed.
    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 415 UnsupportedMediaType.
    pub(crate) fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type})"
            ),
        )
    }

    /// 410 Expired (used in-stream for watches and for stale continue tokens).
    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// An arbitrary code, used by fault injection; the reason follows the code as kube-apiserver would.
    pub(crate) fn injected(code: u16) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            410 => "Expired",
            422 => "Invalid",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        let mut e = Self::new(
            code,
            reason,
            format!("devcluster: injected failure ({code} {reason})"),
        );
        if code == 429 || code == 503 {
            e.retry_after = Some(1);
        }
        e
    }

    /// The `metav1.Status` object for this error.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = self
            .details
            .as_deref()
            .cloned()
            .unwrap_or_else(|| json!({}));
        if !self.causes.is_empty() {
            details["causes"] = self
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
        }
        if let Some(secs) = self.retry_after {
            details["retryAfterSeconds"] = json!(secs);
        }
        if details.as_object().is_some_and(|d| !d.is_empty()) {
            status["details"] = details;
        }
        status
    }
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (code, axum::Json(self.to_status())).into_response();
        if let Some(secs) = self.retry_after
            && let Ok(v) = secs.to_string().parse()
        {
            resp.headers_mut().insert("retry-after", v);
        }
        resp
    }
}

/// A successful delete of an object that is gone answers this Status (kube-apiserver does for some kinds).
pub(crate) fn success_status(name: &str, group: &str, kind: &str, uid: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": {"name": name, "group": group, "kind": kind, "uid": uid}
    })
}
