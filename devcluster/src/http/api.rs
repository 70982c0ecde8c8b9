//! The HTTP surface: Kubernetes REST paths, discovery, `/version`, `/openapi/v2`, and the
//! `/_devcluster/` admin endpoints for out-of-process fault injection.

use crate::admission::fieldcheck::FieldValidation;
use crate::auth::authn::Authenticator;
use crate::auth::rbac::{self, Attributes, Decision};
use crate::auth::reviews::{self, ReviewApi};
use crate::catalog::resources::ResourceInfo;
use crate::faults::Faults;
use crate::http::watch::{self, WatchSpec};
use crate::meta;
use crate::render::{self, Format};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::{ApiError, success_status};
use crate::storage::store::{
    DeleteOptions, Deleted, PatchType, Propagation, Store, WatchStart, WriteOptions,
};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;
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
    Router::new()
        .route("/_devcluster/close-watches", post(admin_close_watches))
        .route("/_devcluster/compact", post(admin_compact))
        .route("/_devcluster/fail", post(admin_fail))
        .route("/_devcluster/latency", post(admin_latency))
        .route("/_devcluster/freeze-lease", post(admin_freeze))
        .route("/_devcluster/unfreeze-lease", post(admin_unfreeze))
        .route("/_devcluster/clear", post(admin_clear))
        .route("/_devcluster/stats", get(admin_stats))
        .fallback(handle)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(app)
}

async fn admin_close_watches(State(app): State<Arc<App>>) -> StatusCode {
    app.faults.close_watches();
    StatusCode::NO_CONTENT
}

async fn admin_compact(State(app): State<Arc<App>>) -> StatusCode {
    app.faults.compact();
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct FailBody {
    verb: String,
    resource: String,
    count: u32,
    code: u16,
}

async fn admin_fail(
    State(app): State<Arc<App>>,
    axum::Json(b): axum::Json<FailBody>,
) -> StatusCode {
    app.faults.fail_next(&b.verb, &b.resource, b.count, b.code);
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct LatencyBody {
    verb: String,
    resource: String,
    millis: u64,
}

async fn admin_latency(
    State(app): State<Arc<App>>,
    axum::Json(b): axum::Json<LatencyBody>,
) -> StatusCode {
    app.faults
        .add_latency(&b.verb, &b.resource, Duration::from_millis(b.millis));
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct LeaseBody {
    namespace: String,
    name: String,
}

async fn admin_freeze(
    State(app): State<Arc<App>>,
    axum::Json(b): axum::Json<LeaseBody>,
) -> StatusCode {
    app.faults.freeze_lease(&b.namespace, &b.name);
    StatusCode::NO_CONTENT
}

async fn admin_unfreeze(
    State(app): State<Arc<App>>,
    axum::Json(b): axum::Json<LeaseBody>,
) -> StatusCode {
    app.faults.unfreeze_lease(&b.namespace, &b.name);
    StatusCode::NO_CONTENT
}

async fn admin_clear(State(app): State<Arc<App>>) -> StatusCode {
    app.faults.clear();
    StatusCode::NO_CONTENT
}

async fn admin_stats(State(app): State<Arc<App>>) -> axum::Json<Value> {
    let mut stats = app.faults.stats().to_json();
    stats["auth"] = app.auth.stats.counts().to_json();
    axum::Json(stats)
}

/// A parsed request target under `/api` or `/apis`.
struct Target {
    info: ResourceInfo,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn ok(v: &Value) -> Response {
    json_response(StatusCode::OK, v)
}

async fn handle(
    State(app): State<Arc<App>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let result = route(&app, &method, &path, &headers, &query, body).await;
    match result {
        Ok(resp) => resp,
        Err(e) => {
            tracing::debug!(%method, %path, code = e.code, reason = e.reason, message = %e.message, "request failed");
            e.into_response()
        }
    }
}

fn unauthorized() -> ApiError {
    ApiError {
        code: 401,
        reason: "Unauthorized",
        message: "Unauthorized".into(),
        details: None,
        causes: Vec::new(),
        retry_after: None,
    }
}

async fn route(
    app: &App,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match segs.as_slice() {
        ["version"] => return Ok(ok(&version())),
        ["healthz" | "livez" | "readyz"] => return Ok((StatusCode::OK, "ok").into_response()),
        _ => {}
    }
    let user = match app.auth.authenticate(&app.store, headers) {
        Ok(user) => {
            app.auth.stats.authenticated(true);
            user
        }
        Err(e) => {
            app.auth.stats.authenticated(false);
            tracing::debug!(%method, %path, error = %e, "unauthenticated");
            return Err(unauthorized());
        }
    };
    let attrs = Attributes::from_request(method, path, query);
    // The admin never waits for the store lock; everyone else is checked against live RBAC.
    let decision = if user.is_master() {
        Decision::Allow(String::new())
    } else {
        rbac::authorize(&app.store.lock(), &user, &attrs)
    };
    app.auth.stats.authorized(decision.allowed());
    if !decision.allowed() {
        return Err(attrs.forbidden(&user, decision.reason()));
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    match segs.as_slice() {
        ["openapi", "v2"] => return Ok(openapi_v2(app, accept)),
        ["openapi", "v3"] => {
            let registry = app.store.lock().registry.clone();
            return Ok(ok(&crate::catalog::openapi::v3_index(&registry)));
        }
        ["openapi", "v3", rest @ ..] => return openapi_v3(app, &rest.join("/"), headers, query),
        ["api"] => {
            return Ok(ok(
                &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": app.address}]}),
            ));
        }
        ["apis"] => return Ok(ok(&group_list(&app.store))),
        ["apis", group] => {
            let groups = app.store.lock().registry.groups();
            return groups
                .iter()
                .find(|(g, _)| g == group)
                .map(|(g, vs)| ok(&api_group(g, vs)))
                .ok_or_else(|| ApiError::no_route(path));
        }
        ["api", "v1"] => return discovery(app, "", "v1", path),
        ["apis", group, version] => return discovery(app, group, version, path),
        _ => {}
    }
    let target = parse_target(app, &segs).ok_or_else(|| ApiError::no_route(path))?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let review = ReviewApi::of(
        &target.info,
        target.namespace.as_deref(),
        target.name.as_deref(),
        target.sub.as_deref(),
    );
    let body = if review.is_none() && !body.is_empty() {
        request_body_as_json(content_type, body)?
    } else {
        body
    };
    let verb = verb_of(method, &target, query);
    let lease = (target.info.group == "coordination.k8s.io" && target.info.plural == "leases")
        .then(|| {
            (
                target.namespace.as_deref().unwrap_or_default(),
                target.name.as_deref().unwrap_or_default(),
            )
        });
    let (injected, delay) = app.faults.on_request(verb, &target.info.plural, lease);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(code) = injected {
        return Err(ApiError::injected(code));
    }
    if let Some(review) = review {
        if verb != "create" {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method} {path})"
            )));
        }
        let answer = reviews::handle(&app.auth, &app.store, &review, &user, content_type, &body)?;
        return Ok(json_response(StatusCode::CREATED, &answer));
    }
    let format = render::negotiate(accept, query.get("includeObject").map(String::as_str));
    let manager = field_manager(query, headers);
    let dry_run = query.get("dryRun").is_some_and(|v| v == "All");
    let wopts = WriteOptions {
        manager,
        dry_run,
        force: flag(query, "force"),
        field_validation: FieldValidation::parse(query.get("fieldValidation").map(String::as_str))?,
        warnings: Default::default(),
    };
    let response = serve(
        app, method, path, headers, query, &target, verb, format, &wopts, body,
    )
    .await?;
    Ok(with_warnings(response, &wopts))
}

/// Adds a `Warning: 299` header per warning the write produced, as kube-apiserver does.
fn with_warnings(mut response: Response, wopts: &WriteOptions) -> Response {
    for w in wopts.warnings.lock().iter() {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = header::HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

/// Serves one resource request once it is authenticated, authorized and past fault injection.
#[allow(clippy::too_many_arguments)]
async fn serve(
    app: &App,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    target: &Target,
    verb: &str,
    format: Format,
    wopts: &WriteOptions,
    body: Bytes,
) -> Result<Response, ApiError> {
    let info = &target.info;
    let ns = target.namespace.as_deref();
    match (verb, target.name.as_deref(), target.sub.as_deref()) {
        ("watch", _, _) => {
            crate::listoptions::validate(query, true)?;
            watch_response(app, target, query, format)
        }
        ("list", None, None) => {
            crate::listoptions::validate(query, false)?;
            let (labels, fields) = selectors(info, query)?;
            let limit = query.get("limit").and_then(|l| l.parse::<usize>().ok());
            let result = app.store.lock().list(
                info,
                ns,
                &labels,
                &fields,
                limit,
                query.get("continue").map(String::as_str),
            )?;
            Ok(ok(&render::list(
                info,
                format,
                &result.items,
                result.rv,
                result.continue_token.as_deref(),
                result.remaining,
            )))
        }
        ("get", Some(name), None) => {
            let obj = app.store.lock().read(info, ns.unwrap_or_default(), name)?;
            Ok(ok(&render::object(info, format, &obj)))
        }
        ("get", Some(name), Some("status")) if info.status => {
            let obj = app.store.lock().read(info, ns.unwrap_or_default(), name)?;
            Ok(ok(&render::object(info, format, &obj)))
        }
        ("get", Some(name), Some("scale")) => Ok(ok(&app.store.lock().get_scale(
            info,
            ns.unwrap_or_default(),
            name,
        )?)),
        ("create", None, None) => {
            let obj = parse_json(&body)?;
            let created = app.store.lock().create(info, ns, obj, wopts)?;
            Ok(json_response(
                StatusCode::CREATED,
                &render::object(info, Format::Json, &created),
            ))
        }
        ("update", Some(name), sub @ (None | Some("status"))) => {
            if sub.is_some() && !info.status {
                return Err(ApiError::no_route(path));
            }
            let obj = parse_json(&body)?;
            let updated =
                app.store
                    .lock()
                    .update(info, ns.unwrap_or_default(), name, obj, sub, wopts)?;
            Ok(ok(&render::object(info, Format::Json, &updated)))
        }
        ("update", Some(name), Some("scale")) => {
            let scale = parse_json(&body)?;
            Ok(ok(&app.store.lock().set_scale(
                info,
                ns.unwrap_or_default(),
                name,
                &scale,
                wopts,
            )?))
        }
        ("patch", Some(name), sub @ (None | Some("status"))) => {
            if sub.is_some() && !info.status {
                return Err(ApiError::no_route(path));
            }
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = patch_type(content_type)?;
            let patch = if kind == PatchType::Apply {
                parse_yaml(&body)?
            } else {
                parse_json(&body)?
            };
            let mut st = app.store.lock();
            let existed = st
                .get(&info.group_resource(), ns.unwrap_or_default(), name)
                .is_some();
            let patched = st.patch(info, ns.unwrap_or_default(), name, kind, &patch, sub, wopts)?;
            drop(st);
            let code = if existed {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            Ok(json_response(
                code,
                &render::object(info, Format::Json, &patched),
            ))
        }
        ("patch", Some(name), Some("scale")) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = patch_type(content_type)?;
            let patch = parse_json(&body)?;
            let mut st = app.store.lock();
            let mut scale = st.get_scale(info, ns.unwrap_or_default(), name)?;
            match kind {
                PatchType::Merge | PatchType::Strategic => {
                    crate::apply::patch::merge_patch(&mut scale, &patch)
                }
                PatchType::Json => crate::apply::patch::json_patch(&mut scale, &patch)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?,
                PatchType::Apply => return Err(ApiError::unsupported_media_type(content_type)),
            }
            Ok(ok(&st.set_scale(
                info,
                ns.unwrap_or_default(),
                name,
                &scale,
                wopts,
            )?))
        }
        ("delete", Some(name), None) => {
            let opts = delete_options(query, &body)?;
            let outcome = app
                .store
                .lock()
                .delete(info, ns.unwrap_or_default(), name, &opts)?;
            Ok(match outcome {
                Deleted::Pending(obj) => ok(&render::object(info, Format::Json, &obj)),
                Deleted::Gone(obj) if !info.builtin => {
                    ok(&render::object(info, Format::Json, &obj))
                }
                Deleted::Gone(obj) => ok(&success_status(
                    name,
                    &info.group,
                    &info.plural,
                    meta::uid(&obj),
                )),
            })
        }
        ("deletecollection", None, None) => {
            let (labels, fields) = selectors(info, query)?;
            let opts = delete_options(query, &body)?;
            let items = app
                .store
                .lock()
                .delete_collection(info, ns, &labels, &fields, &opts)?;
            let rv = app.store.lock().current_rv();
            Ok(ok(&render::list(
                info,
                Format::Json,
                &items,
                rv,
                None,
                None,
            )))
        }
        (_, _, Some(sub)) if !matches!(sub, "status" | "scale") => Err(ApiError::no_route(path)),
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {path})"
        ))),
    }
}

fn verb_of(method: &Method, target: &Target, query: &HashMap<String, String>) -> &'static str {
    let watch = flag(query, "watch");
    match *method {
        Method::GET if watch => "watch",
        Method::GET if target.name.is_none() => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if target.name.is_none() => "deletecollection",
        Method::DELETE => "delete",
        _ => "unknown",
    }
}

/// Booleans in query strings as Go's `strconv.ParseBool` reads them (the Python client sends `True`).
fn parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

fn flag(query: &HashMap<String, String>, name: &str) -> bool {
    query.get(name).is_some_and(|v| parse_bool(v))
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

fn parse_target(app: &App, segs: &[&str]) -> Option<Target> {
    let (group, version, rest) = match segs {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let registry = &app.store.lock().registry;
    let lookup = |plural: &str| registry.get(group, version, plural).cloned();
    let (info, namespace, name, sub) = match rest {
        // The namespace object itself: /api/v1/namespaces/{name}[/status|/finalize].
        ["namespaces", name] if group.is_empty() => {
            (lookup("namespaces")?, None, Some(*name), None)
        }
        ["namespaces", name, sub @ ("status" | "finalize")] if group.is_empty() => {
            (lookup("namespaces")?, None, Some(*name), Some(*sub))
        }
        ["namespaces", ns, plural, tail @ ..] => {
            let info = lookup(plural)?;
            if !info.namespaced {
                return None;
            }
            match tail {
                [] => (info, Some(*ns), None, None),
                [name] => (info, Some(*ns), Some(*name), None),
                [name, sub] => (info, Some(*ns), Some(*name), Some(*sub)),
                _ => return None,
            }
        }
        [plural, tail @ ..] => {
            let info = lookup(plural)?;
            match tail {
                [] => (info, None, None, None),
                [name] if !info.namespaced => (info, None, Some(*name), None),
                [name, sub] if !info.namespaced => (info, None, Some(*name), Some(*sub)),
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(Target {
        info,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        sub: sub.map(str::to_string),
    })
}

fn selectors(
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

fn watch_response(
    app: &App,
    target: &Target,
    query: &HashMap<String, String>,
    format: Format,
) -> Result<Response, ApiError> {
    let (labels, mut fields) = selectors(&target.info, query)?;
    let mut namespace = target.namespace.clone();
    if let Some(name) = &target.name {
        // GET .../name?watch=true watches one object.
        fields = FieldSelector::parse(&format!("metadata.name={name}"))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if !target.info.namespaced {
            namespace = None;
        }
    }
    let send_initial = query.get("sendInitialEvents").map(String::as_str);
    let rv = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let start = match (send_initial, rv) {
        (Some(v), _) if parse_bool(v) => WatchStart::Now { end_bookmark: true },
        (_, "" | "0") => WatchStart::Now {
            end_bookmark: false,
        },
        (_, rv) => WatchStart::From(rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "invalid resource version \"{rv}\": must be a decimal integer"
            ))
        })?),
    };
    let bookmarks = flag(query, "allowWatchBookmarks");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let end_bookmark = matches!(start, WatchStart::Now { end_bookmark: true });
    let spec = WatchSpec {
        info: target.info.clone(),
        namespace,
        labels,
        fields,
        bookmarks,
        end_bookmark,
        timeout,
        format,
        bookmark_interval: app.bookmark_interval,
    };
    // Listen for close_watches() before the history is checked: a close that lands between the
    // check and the stream task's start must still end this stream (otherwise a watch validated
    // just before a compaction would survive the close and never see its 410).
    let closed = app.faults.close_signal();
    let setup = app
        .store
        .lock()
        .watch(&target.info, spec.namespace.as_deref(), start);
    let body = match setup {
        Ok(setup) => {
            let rx = watch::spawn(
                spec,
                setup,
                closed,
                app.faults.clone(),
                app.shutdown.clone(),
            );
            Body::from_stream(ReceiverStream::new(rx))
        }
        // kube-rs and client-go expect an expired resume as an ERROR event on a 200 stream.
        Err(e) => Body::from(watch::error_event(&e)),
    };
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache, private"),
        ],
        body,
    )
        .into_response())
}

/// Protobuf bodies (client-go's typed clients: `kubectl create namespace`, `create configmap`,
/// `run`, `expose`, ...) are decoded into the JSON the rest of the server handles; JSON and YAML
/// pass through. CBOR is refused.
fn request_body_as_json(content_type: &str, body: Bytes) -> Result<Bytes, ApiError> {
    if content_type.contains("cbor") {
        return Err(ApiError {
            message: format!(
                "devcluster accepts JSON, YAML and protobuf request bodies, not {content_type}"
            ),
            ..ApiError::unsupported_media_type(content_type)
        });
    }
    if !crate::protobuf::is_protobuf(content_type) {
        return Ok(body);
    }
    let decoded = crate::protobuf::decode(&body).map_err(|e| match e {
        crate::protobuf::ProtobufError::Malformed => ApiError::bad_request(e.to_string()),
        crate::protobuf::ProtobufError::Unsupported(_) => ApiError {
            message: e.to_string(),
            ..ApiError::unsupported_media_type(content_type)
        },
    })?;
    Ok(Bytes::from(decoded.to_string()))
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn parse_yaml(body: &[u8]) -> Result<Value, ApiError> {
    serde_saphyr::from_slice::<Value>(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

fn patch_type(content_type: &str) -> Result<PatchType, ApiError> {
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

fn delete_options(query: &HashMap<String, String>, body: &[u8]) -> Result<DeleteOptions, ApiError> {
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

fn group_list(store: &Store) -> Value {
    let groups = store.lock().registry.groups();
    let groups: Vec<Value> = groups.iter().map(|(g, vs)| api_group(g, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/version`, with every field kube-apiserver reports.
pub(crate) fn version() -> Value {
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
    ok(&crate::catalog::openapi::v2_document(&registry))
}

/// `/openapi/v3/{api/v1 | apis/group/version}`, with kube-apiserver's caching: an `ETag`, 304
/// for a matching `If-None-Match`, immutable caching when the URL's `hash` is current and a
/// redirect to the current URL when it is not.
fn openapi_v3(
    app: &App,
    path: &str,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let registry = app.store.lock().registry.clone();
    let api_version = registry
        .all()
        .map(ResourceInfo::api_version)
        .find(|av| crate::catalog::openapi::v3_path(av) == path)
        .ok_or_else(|| ApiError::no_route(&format!("/openapi/v3/{path}")))?;
    let doc = crate::catalog::openapi::v3_rendered(&registry, &api_version);
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
