//! Decoding a request: its body into the JSON the store takes (protobuf decoded by
//! reflection, JSON and YAML passed through, CBOR refused), and its query parameters into
//! write, delete, list and watch options.

use super::target::{flag, parse_bool};
use crate::admission::fieldcheck::FieldValidation;
use crate::catalog::resources::ResourceInfo;
use crate::protobuf::{self, ProtobufError};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::storage::{DeleteOptions, PatchType, Propagation, WriteOptions};
use axum::body::Bytes;
use axum::http::{HeaderMap, header};
use serde_json::{Value, json};
use std::collections::HashMap;

/// Protobuf bodies (client-go's typed clients: `kubectl create namespace`, `create configmap`,
/// `run`, `expose`, ...) are decoded into the JSON the rest of the server handles; JSON and YAML
/// pass through. CBOR is refused.
pub(super) fn content(content_type: &str, body: Bytes) -> Result<Bytes, ApiError> {
    if content_type.contains("cbor") {
        return Err(ApiError {
            message: format!(
                "devcluster accepts JSON, YAML and protobuf request bodies, not {content_type}"
            ),
            ..ApiError::unsupported_media_type(content_type)
        });
    }
    if !protobuf::is_protobuf(content_type) {
        return Ok(body);
    }
    let decoded = protobuf_as_json(content_type, &body)?;
    Ok(Bytes::from(decoded.to_string()))
}

/// A review's body (TokenReview, SubjectAccessReview, ...) as JSON: protobuf (kubectl's `auth
/// can-i` and `create token` send it) or JSON.
pub(super) fn review_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    if protobuf::is_protobuf(content_type) {
        return protobuf_as_json(content_type, body);
    }
    parse_json(body)
}

/// A Kubernetes protobuf body decoded into JSON: malformed is 400, a kind without descriptors 415.
fn protobuf_as_json(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    protobuf::decode(body).map_err(|e| match e {
        ProtobufError::Malformed => ApiError::bad_request(e.to_string()),
        ProtobufError::Unsupported(_) => ApiError {
            message: e.to_string(),
            ..ApiError::unsupported_media_type(content_type)
        },
    })
}

pub(super) fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

pub(super) fn parse_yaml(body: &[u8]) -> Result<Value, ApiError> {
    serde_saphyr::from_slice::<Value>(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

pub(super) fn patch_type(content_type: &str) -> Result<PatchType, ApiError> {
    let media = content_type.split(';').next().unwrap_or_default().trim();
    match media {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/apply-patch+yaml"
        | "application/apply-patch+json"
        | "application/apply-patch+cbor" => Ok(PatchType::Apply),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// The options of a create, update or patch: `fieldManager` (or the User-Agent's program),
/// `dryRun`, `force` and `fieldValidation`.
pub(super) fn write_options(
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<WriteOptions, ApiError> {
    Ok(WriteOptions {
        manager: field_manager(query, headers),
        dry_run: query.get("dryRun").is_some_and(|v| v == "All"),
        force: flag(query, "force"),
        field_validation: FieldValidation::parse(query.get("fieldValidation").map(String::as_str))?,
        warnings: Default::default(),
    })
}

fn field_manager(query: &HashMap<String, String>, headers: &HeaderMap) -> String {
    if let Some(m) = query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    // kube-apiserver derives the default manager from the User-Agent's program name.
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

pub(super) fn delete_options(
    query: &HashMap<String, String>,
    body: &[u8],
) -> Result<DeleteOptions, ApiError> {
    let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        parse_json(body)?
    };
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| query.get("propagationPolicy").cloned());
    let propagation = match policy.as_deref() {
        None => match body
            .get("orphanDependents")
            .and_then(Value::as_bool)
            .or_else(|| query.get("orphanDependents").map(|v| parse_bool(v)))
        {
            Some(true) => Some(Propagation::Orphan),
            _ => None,
        },
        Some("Orphan") => Some(Propagation::Orphan),
        Some("Background") => Some(Propagation::Background),
        Some("Foreground") => Some(Propagation::Foreground),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
            )));
        }
    };
    let dry_run = body
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v == "All"))
        || query.get("dryRun").is_some_and(|v| v == "All");
    Ok(DeleteOptions {
        propagation,
        uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string),
        dry_run,
    })
}

pub(super) fn selectors(
    info: &ResourceInfo,
    query: &HashMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(
        query
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse_for(
        query
            .get("fieldSelector")
            .map(String::as_str)
            .unwrap_or_default(),
        &info.group,
        &info.plural,
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((labels, fields))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn apply_bodies_in_yaml_keep_their_types() {
        let body = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: {tier: \"1\"}\ndata:\n  n: \"3\"\nspec:\n  replicas: 3\n  paused: false\n";
        let v = parse_yaml(body).expect("valid YAML");
        assert_eq!(v["metadata"]["labels"]["tier"], json!("1"));
        assert_eq!(v["spec"]["replicas"], json!(3));
        assert_eq!(v["spec"]["paused"], json!(false));
    }

    #[test]
    fn malformed_yaml_is_a_bad_request() {
        let err = parse_yaml(b"metadata: [unclosed").expect_err("invalid YAML");
        assert!(
            format!("{err:?}").contains("error decoding YAML"),
            "{err:?}"
        );
    }
}
