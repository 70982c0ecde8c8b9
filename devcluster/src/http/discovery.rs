//! The paths that describe the server rather than objects: `/version` and the health checks
//! (answered before authentication, as kube-apiserver's public-info paths are), and the
//! discovery and OpenAPI documents (answered once the request is authorized).

use super::app::{App, Request};
use super::reply::ok;
use crate::catalog::openapi;
use crate::catalog::resources::ResourceInfo;
use crate::status::ApiError;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// `/version` and the health checks, which need no credentials.
pub(super) fn public(segs: &[&str]) -> Option<Response> {
    match segs {
        ["version"] => Some(ok(&version())),
        ["healthz" | "livez" | "readyz"] => Some((StatusCode::OK, "ok").into_response()),
        _ => None,
    }
}

/// Discovery (`/api`, `/apis`, a group, a group version) and OpenAPI documents; None for any
/// other path.
pub(super) fn answer(
    app: &App,
    req: &Request,
    segs: &[&str],
) -> Result<Option<Response>, ApiError> {
    let path = req.path.as_str();
    let accept = req.header(header::ACCEPT);
    let response = match segs {
        ["openapi", "v2"] => openapi_v2(app, accept),
        ["openapi", "v3"] => {
            let registry = app.store.lock().registry.clone();
            ok(&openapi::v3_index(&registry))
        }
        ["openapi", "v3", rest @ ..] => openapi_v3(app, req, &rest.join("/"))?,
        ["api"] => ok(
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": app.address}]}),
        ),
        ["apis"] => ok(&group_list(app)),
        ["apis", group] => {
            let groups = app.store.lock().registry.groups();
            groups
                .iter()
                .find(|(g, _)| g == group)
                .map(|(g, vs)| ok(&api_group(g, vs)))
                .ok_or_else(|| ApiError::no_route(path))?
        }
        ["api", "v1"] => discovery(app, "", "v1", path)?,
        ["apis", group, version] => discovery(app, group, version, path)?,
        _ => return Ok(None),
    };
    Ok(Some(response))
}

fn discovery(app: &App, group: &str, version: &str, path: &str) -> Result<Response, ApiError> {
    // Counted (as `get` of `discovery`) so tests can bound what a tenant's lookups cost.
    app.faults.count("get", "discovery");
    app.store
        .lock()
        .registry
        .resource_list(group, version)
        .map(|l| ok(&l))
        .ok_or_else(|| ApiError::no_route(path))
}

fn api_group(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": vs, "preferredVersion": preferred})
}

fn group_list(app: &App) -> Value {
    let groups = app.store.lock().registry.groups();
    let groups: Vec<Value> = groups.iter().map(|(g, vs)| api_group(g, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/version`, with every field kube-apiserver reports.
fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
        "gitVersion": "v1.33.0-devcluster",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/openapi/v2`: every served kind's schema as Swagger 2.0 JSON. kubectl asks for the
/// gnostic protobuf form, which devcluster does not encode: it gets an empty protobuf document
/// (zero bytes), which kubectl accepts, and validates through the server instead (the v3
/// documents advertise `fieldValidation`).
fn openapi_v2(app: &App, accept: Option<&str>) -> Response {
    let json_ok = accept.is_none_or(|a| a.contains("json") || a.contains("*/*"));
    if !json_ok && accept.is_some_and(|a| a.contains("protobuf")) {
        return (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            )],
            Vec::<u8>::new(),
        )
            .into_response();
    }
    let registry = app.store.lock().registry.clone();
    ok(&openapi::v2_document(&registry))
}

/// `/openapi/v3/{api/v1 | apis/group/version}`, with kube-apiserver's caching: an `ETag`, 304
/// for a matching `If-None-Match`, immutable caching when the URL's `hash` is current and a
/// redirect to the current URL when it is not.
fn openapi_v3(app: &App, req: &Request, path: &str) -> Result<Response, ApiError> {
    let (headers, query) = (&req.headers, &req.query);
    let registry = app.store.lock().registry.clone();
    let api_version = registry
        .all()
        .map(ResourceInfo::api_version)
        .find(|av| openapi::v3_path(av) == path)
        .ok_or_else(|| ApiError::no_route(&format!("/openapi/v3/{path}")))?;
    let doc = openapi::v3_rendered(&registry, &api_version);
    let etag = format!("\"{}\"", doc.etag);
    if let Some(hash) = query.get("hash")
        && *hash != doc.etag
    {
        let location = format!("/openapi/v3/{path}?hash={}", doc.etag);
        return Ok((
            StatusCode::MOVED_PERMANENTLY,
            [(header::LOCATION, location)],
        )
            .into_response());
    }
    let cache = if query.contains_key("hash") {
        "public, immutable"
    } else {
        "no-cache, private"
    };
    let not_modified = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    if not_modified {
        return Ok((
            StatusCode::NOT_MODIFIED,
            [
                (header::ETAG, etag),
                (header::CACHE_CONTROL, cache.to_string()),
            ],
        )
            .into_response());
    }
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, cache.to_string()),
        ],
        doc.body.as_ref().clone(),
    )
        .into_response())
}
