//! The virtual, create-only APIs of authentication and authorization: TokenRequest
//! (`serviceaccounts/token`), TokenReview, and the SubjectAccessReview family. Nothing is
//! stored; each answers with the request object plus a computed `status`.

use crate::auth::authn::{Authenticator, Identity, MintError};
use crate::auth::rbac::{self, Attributes, ResourceAttributes};
use crate::auth::token::{DEFAULT_TTL, MIN_TTL};
use crate::catalog::resources::ResourceInfo;
use crate::status::ApiError;
use crate::storage::Store;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

/// Which review a request is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReviewApi {
    /// `POST /api/v1/namespaces/{namespace}/serviceaccounts/{name}/token`.
    TokenRequest {
        /// The ServiceAccount's namespace.
        namespace: String,
        /// The ServiceAccount.
        name: String,
    },
    /// `POST /apis/authentication.k8s.io/v1/tokenreviews`.
    TokenReview,
    /// `POST /apis/authentication.k8s.io/v1/selfsubjectreviews` (`kubectl auth whoami`).
    SelfSubject,
    /// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`.
    SubjectAccess,
    /// `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`.
    SelfSubjectAccess,
    /// `POST /apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews`.
    LocalSubjectAccess {
        /// The namespace of the URL.
        namespace: String,
    },
}

impl ReviewApi {
    /// The review a resolved request target is, if any.
    pub(crate) fn of(
        info: &ResourceInfo,
        namespace: Option<&str>,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> Option<ReviewApi> {
        let ns = namespace.unwrap_or_default().to_string();
        match (info.group.as_str(), info.plural.as_str(), name, sub) {
            ("", "serviceaccounts", Some(name), Some("token")) => Some(ReviewApi::TokenRequest {
                namespace: ns,
                name: name.to_string(),
            }),
            ("authentication.k8s.io", "tokenreviews", ..) => Some(ReviewApi::TokenReview),
            ("authentication.k8s.io", "selfsubjectreviews", ..) => Some(ReviewApi::SelfSubject),
            ("authorization.k8s.io", "subjectaccessreviews", ..) => Some(ReviewApi::SubjectAccess),
            ("authorization.k8s.io", "selfsubjectaccessreviews", ..) => {
                Some(ReviewApi::SelfSubjectAccess)
            }
            ("authorization.k8s.io", "localsubjectaccessreviews", ..) => {
                Some(ReviewApi::LocalSubjectAccess { namespace: ns })
            }
            _ => None,
        }
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Answer a review; the caller has already authenticated and authorized the request.
pub(crate) fn handle(
    auth: &Authenticator,
    store: &Store,
    review: &ReviewApi,
    requester: &Identity,
    request: Value,
) -> Result<Value, ApiError> {
    match review {
        ReviewApi::TokenRequest { namespace, name } => {
            token_request(auth, store, namespace, name, &request)
        }
        ReviewApi::TokenReview => Ok(token_review(auth, store, request)),
        ReviewApi::SelfSubject => Ok(json!({
            "kind": "SelfSubjectReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": null},
            "status": {"userInfo": requester.to_json()},
        })),
        ReviewApi::SubjectAccess => {
            let spec = request.get("spec").cloned().unwrap_or_else(|| json!({}));
            let user = Identity {
                username: str_at(&spec, "/user").to_string(),
                uid: str_at(&spec, "/uid").to_string(),
                groups: strings(spec.get("groups")),
                extra: extra(&spec),
            };
            if user.username.is_empty() && user.groups.is_empty() {
                return Err(invalid(
                    "SubjectAccessReview",
                    "",
                    "spec.user",
                    "at least one of user or group must be specified",
                ));
            }
            access_review(store, request, "SubjectAccessReview", &user, None)
        }
        ReviewApi::SelfSubjectAccess => {
            access_review(store, request, "SelfSubjectAccessReview", requester, None)
        }
        ReviewApi::LocalSubjectAccess { namespace } => {
            let spec = request.get("spec").cloned().unwrap_or_else(|| json!({}));
            let user = Identity {
                username: str_at(&spec, "/user").to_string(),
                uid: str_at(&spec, "/uid").to_string(),
                groups: strings(spec.get("groups")),
                extra: extra(&spec),
            };
            access_review(
                store,
                request,
                "LocalSubjectAccessReview",
                &user,
                Some(namespace),
            )
        }
    }
}

fn extra(spec: &Value) -> BTreeMap<String, Vec<String>> {
    spec.get("extra")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), strings(Some(v))))
                .collect()
        })
        .unwrap_or_default()
}

fn invalid(kind: &str, name: &str, field: &str, message: &str) -> ApiError {
    let group = if kind == "TokenRequest" {
        "authentication.k8s.io"
    } else {
        "authorization.k8s.io"
    };
    ApiError::invalid_field(kind, group, name, field, "FieldValueInvalid", message)
}

fn token_request(
    auth: &Authenticator,
    store: &Store,
    namespace: &str,
    name: &str,
    request: &Value,
) -> Result<Value, ApiError> {
    let spec = request.get("spec").cloned().unwrap_or_else(|| json!({}));
    let seconds = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_TTL.as_secs(),
        Some(v) => {
            let s = v.as_i64().ok_or_else(|| {
                ApiError::bad_request("spec.expirationSeconds must be an integer")
            })?;
            if s < MIN_TTL.as_secs() as i64 {
                return Err(invalid(
                    "TokenRequest",
                    name,
                    "spec.expirationSeconds",
                    &format!("Invalid value: {s}: may not specify a duration less than 10 minutes"),
                ));
            }
            if s > 1 << 32 {
                return Err(invalid(
                    "TokenRequest",
                    name,
                    "spec.expirationSeconds",
                    &format!(
                        "Invalid value: {s}: may not specify a duration larger than 2^32 seconds"
                    ),
                ));
            }
            s as u64
        }
    };
    let audiences = strings(spec.get("audiences"));
    let (token, claims) = auth
        .mint(
            store,
            namespace,
            name,
            audiences,
            Duration::from_secs(seconds),
        )
        .map_err(|e| match e {
            MintError::NotFound { name } => ApiError::not_found("", "serviceaccounts", &name),
        })?;
    let expiry = jiff::Timestamp::from_second(claims.exp)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    let mut out_spec = json!({"audiences": claims.aud, "expirationSeconds": seconds});
    // The binding is accepted and echoed but not enforced: the token does not die with the
    // bound object (see LIMITATIONS.md).
    if let Some(bound) = spec.get("boundObjectRef").filter(|b| !b.is_null()) {
        out_spec["boundObjectRef"] = bound.clone();
    }
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": crate::meta::now()},
        "spec": out_spec,
        "status": {"token": token, "expirationTimestamp": expiry},
    }))
}

fn token_review(auth: &Authenticator, store: &Store, mut request: Value) -> Value {
    let spec = request.get("spec").cloned().unwrap_or_else(|| json!({}));
    let token = str_at(&spec, "/token");
    let wanted = strings(spec.get("audiences"));
    let status = match auth.review(store, token, &wanted) {
        Ok((user, audiences)) => {
            json!({"authenticated": true, "user": user.to_json(), "audiences": audiences})
        }
        Err(e) => json!({"authenticated": false, "user": {}, "error": e.to_string()}),
    };
    request["kind"] = json!("TokenReview");
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["metadata"] = json!({"creationTimestamp": null});
    request["status"] = status;
    request
}

fn access_review(
    store: &Store,
    mut request: Value,
    kind: &str,
    user: &Identity,
    local_namespace: Option<&str>,
) -> Result<Value, ApiError> {
    let spec = request.get("spec").cloned().unwrap_or_else(|| json!({}));
    let resource = spec.get("resourceAttributes").filter(|v| v.is_object());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| v.is_object());
    let attrs = match (resource, non_resource) {
        (Some(r), None) => Attributes::Resource(ResourceAttributes {
            namespace: str_at(r, "/namespace").to_string(),
            verb: str_at(r, "/verb").to_string(),
            group: str_at(r, "/group").to_string(),
            resource: str_at(r, "/resource").to_string(),
            subresource: str_at(r, "/subresource").to_string(),
            name: str_at(r, "/name").to_string(),
        }),
        (None, Some(n)) if local_namespace.is_none() => Attributes::NonResource {
            path: str_at(n, "/path").to_string(),
            verb: str_at(n, "/verb").to_string(),
        },
        _ => {
            return Err(invalid(
                kind,
                "",
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
    };
    if let (Some(ns), Attributes::Resource(r)) = (local_namespace, &attrs)
        && r.namespace != ns
    {
        return Err(invalid(
            kind,
            "",
            "spec.resourceAttributes.namespace",
            &format!("must match metadata.namespace {ns:?}"),
        ));
    }
    let decision = rbac::authorize(&store.lock(), user, &attrs);
    let mut status = json!({"allowed": decision.allowed()});
    if !decision.reason().is_empty() {
        status["reason"] = json!(decision.reason());
    }
    request["kind"] = json!(kind);
    request["apiVersion"] = json!("authorization.k8s.io/v1");
    let mut metadata = json!({"creationTimestamp": null});
    if let Some(ns) = local_namespace {
        metadata["namespace"] = json!(ns);
    }
    request["metadata"] = metadata;
    request["status"] = status;
    Ok(request)
}
