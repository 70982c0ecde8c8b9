//! A handler per Kubernetes verb (get, list, watch, create, update, patch, delete,
//! deletecollection) on a resource and its `status` and `scale` subresources, and the review
//! APIs; each reads the request as [`Call`] and answers with the store's result rendered.

use super::app::{App, Request};
use super::decode::{self, delete_options, parse_json, parse_yaml, patch_type, selectors};
use super::reply::{json_response, ok, with_warnings};
use super::target::{Target, flag, parse_bool};
use super::watch::{self, WatchSpec};
use crate::auth::authn::Identity;
use crate::auth::reviews::{self, ReviewApi};
use crate::listoptions;
use crate::meta;
use crate::render::{self, Format};
use crate::selector::FieldSelector;
use crate::status::{ApiError, success_status};
use crate::storage::store::WatchStart;
use crate::storage::{Delete, Deleted, PatchType, Write, WriteOptions};
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;

/// One resource request, once it is authenticated, authorized, resolved, decoded and past
/// fault injection: what every verb handler reads.
struct Call<'a> {
    app: &'a App,
    req: &'a Request,
    target: &'a Target,
    /// The representation the client accepts (JSON, Table, PartialObjectMetadata).
    format: Format,
    /// Field manager, dry run, force and field validation; collects the response's warnings.
    wopts: WriteOptions,
    body: Bytes,
}

/// Serves a resource request with the handler of its verb and subresource.
pub(super) fn handle(
    app: &App,
    req: &Request,
    target: &Target,
    verb: &str,
    body: Bytes,
) -> Result<Response, ApiError> {
    let format = render::negotiate(
        req.header(header::ACCEPT),
        req.query.get("includeObject").map(String::as_str),
    );
    let call = Call {
        app,
        req,
        target,
        format,
        wopts: decode::write_options(&req.query, &req.headers)?,
        body,
    };
    let status = target.info.status;
    let response = match (verb, target.name.as_deref(), target.sub.as_deref()) {
        ("watch", _, _) => watch(&call),
        ("list", None, None) => list(&call),
        ("get", Some(name), None) => get(&call, name),
        ("get", Some(name), Some("status")) if status => get(&call, name),
        ("get", Some(name), Some("scale")) => get_scale(&call, name),
        ("create", None, None) => create(&call),
        ("update", Some(name), sub @ (None | Some("status"))) => update(&call, name, sub),
        ("update", Some(name), Some("scale")) => update_scale(&call, name),
        ("patch", Some(name), sub @ (None | Some("status"))) => patch(&call, name, sub),
        ("patch", Some(name), Some("scale")) => patch_scale(&call, name),
        ("delete", Some(name), None) => delete(&call, name),
        ("deletecollection", None, None) => delete_collection(&call),
        (_, _, Some(sub)) if !matches!(sub, "status" | "scale") => {
            Err(ApiError::no_route(&req.path))
        }
        _ => Err(method_not_allowed(req)),
    }?;
    Ok(with_warnings(response, &call.wopts))
}

fn method_not_allowed(req: &Request) -> ApiError {
    ApiError::method_not_allowed(format!(
        "the server does not allow this method on the requested resource ({} {})",
        req.method, req.path
    ))
}

/// The review APIs (TokenRequest, TokenReview, SubjectAccessReview, ...): create only, nothing
/// stored, answered by `auth`.
pub(super) fn review(
    app: &App,
    req: &Request,
    user: &Identity,
    verb: &str,
    review: &ReviewApi,
    body: &[u8],
) -> Result<Response, ApiError> {
    if verb != "create" {
        return Err(method_not_allowed(req));
    }
    let request = decode::review_body(req.content_type(), body)?;
    let answer = reviews::handle(&app.auth, &app.store, review, user, request)?;
    Ok(json_response(StatusCode::CREATED, &answer))
}

fn get(call: &Call, name: &str) -> Result<Response, ApiError> {
    let info = &call.target.info;
    let obj = call.app.store.lock().read(info, call.target.ns(), name)?;
    Ok(ok(&render::object(info, call.format, &obj)))
}

fn get_scale(call: &Call, name: &str) -> Result<Response, ApiError> {
    let scale = (call.app.store.lock()).get_scale(&call.target.info, call.target.ns(), name)?;
    Ok(ok(&scale))
}

fn list(call: &Call) -> Result<Response, ApiError> {
    let (info, query) = (&call.target.info, &call.req.query);
    listoptions::validate(query, false)?;
    let (labels, fields) = selectors(info, query)?;
    let limit = query.get("limit").and_then(|l| l.parse::<usize>().ok());
    let result = call.app.store.lock().list(
        info,
        call.target.namespace.as_deref(),
        &labels,
        &fields,
        limit,
        query.get("continue").map(String::as_str),
    )?;
    Ok(ok(&render::list(
        info,
        call.format,
        &result.items,
        result.rv,
        result.continue_token.as_deref(),
        result.remaining,
    )))
}

fn create(call: &Call) -> Result<Response, ApiError> {
    let info = &call.target.info;
    let obj = parse_json(&call.body)?;
    let write = Write::create(info, call.target.ns(), &call.wopts);
    let created = call.app.store.lock().create(&write, obj)?;
    Ok(json_response(
        StatusCode::CREATED,
        &render::object(info, Format::Json, &created),
    ))
}

fn update(call: &Call, name: &str, sub: Option<&str>) -> Result<Response, ApiError> {
    let info = &call.target.info;
    if sub.is_some() && !info.status {
        return Err(ApiError::no_route(&call.req.path));
    }
    let obj = parse_json(&call.body)?;
    let write = Write::to(info, call.target.ns(), name, sub, &call.wopts);
    let updated = call.app.store.lock().update(&write, obj)?;
    Ok(ok(&render::object(info, Format::Json, &updated)))
}

fn update_scale(call: &Call, name: &str) -> Result<Response, ApiError> {
    let scale = parse_json(&call.body)?;
    let write = Write::to(&call.target.info, call.target.ns(), name, None, &call.wopts);
    Ok(ok(&call.app.store.lock().set_scale(&write, &scale)?))
}

fn patch(call: &Call, name: &str, sub: Option<&str>) -> Result<Response, ApiError> {
    let (info, ns) = (&call.target.info, call.target.ns());
    if sub.is_some() && !info.status {
        return Err(ApiError::no_route(&call.req.path));
    }
    let kind = patch_type(call.req.content_type())?;
    let patch = if kind == PatchType::Apply {
        parse_yaml(&call.body)?
    } else {
        parse_json(&call.body)?
    };
    let mut st = call.app.store.lock();
    // Apply to a missing object creates it: 201 instead of 200.
    let existed = st.get(&info.group_resource(), ns, name).is_some();
    let patched = st.patch(&Write::to(info, ns, name, sub, &call.wopts), kind, &patch)?;
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

fn patch_scale(call: &Call, name: &str) -> Result<Response, ApiError> {
    let (info, ns) = (&call.target.info, call.target.ns());
    let content_type = call.req.content_type();
    let kind = patch_type(content_type)?;
    let patch = parse_json(&call.body)?;
    let mut st = call.app.store.lock();
    let mut scale = st.get_scale(info, ns, name)?;
    match kind {
        PatchType::Merge | PatchType::Strategic => {
            crate::apply::patch::merge_patch(&mut scale, &patch)
        }
        PatchType::Json => crate::apply::patch::json_patch(&mut scale, &patch)
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
        PatchType::Apply => return Err(ApiError::unsupported_media_type(content_type)),
    }
    let write = Write::to(info, ns, name, None, &call.wopts);
    Ok(ok(&st.set_scale(&write, &scale)?))
}

fn delete(call: &Call, name: &str) -> Result<Response, ApiError> {
    let info = &call.target.info;
    let opts = delete_options(&call.req.query, &call.body)?;
    let outcome = call.app.store.lock().delete(&Delete {
        info,
        namespace: call.target.ns(),
        name,
        options: &opts,
    })?;
    Ok(match outcome {
        Deleted::Pending(obj) => ok(&render::object(info, Format::Json, &obj)),
        // Custom resources answer with the object, built-in kinds with a Status.
        Deleted::Gone(obj) if !info.builtin => ok(&render::object(info, Format::Json, &obj)),
        Deleted::Gone(obj) => ok(&success_status(
            name,
            &info.group,
            &info.plural,
            meta::uid(&obj),
        )),
    })
}

fn delete_collection(call: &Call) -> Result<Response, ApiError> {
    let (info, query) = (&call.target.info, &call.req.query);
    let (labels, fields) = selectors(info, query)?;
    let opts = delete_options(query, &call.body)?;
    let items = call.app.store.lock().delete_collection(
        info,
        call.target.namespace.as_deref(),
        &labels,
        &fields,
        &opts,
    )?;
    let rv = call.app.store.lock().current_rv();
    Ok(ok(&render::list(
        info,
        Format::Json,
        &items,
        rv,
        None,
        None,
    )))
}

/// `?watch=true`: a stream of events from a resourceVersion (or from now, with synthetic ADDED
/// events first), for a collection or one named object.
fn watch(call: &Call) -> Result<Response, ApiError> {
    let (app, target) = (call.app, call.target);
    listoptions::validate(&call.req.query, true)?;
    let spec = watch_spec(call)?;
    let start = watch_start(&call.req.query)?;
    let spec = WatchSpec {
        end_bookmark: matches!(start, WatchStart::Now { end_bookmark: true }),
        ..spec
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

/// What a watch selects (namespace, selectors, or the one object its URL names) and how it
/// streams (bookmarks, timeout, representation).
fn watch_spec(call: &Call) -> Result<WatchSpec, ApiError> {
    let (target, query) = (call.target, &call.req.query);
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
    Ok(WatchSpec {
        info: target.info.clone(),
        namespace,
        labels,
        fields,
        bookmarks: flag(query, "allowWatchBookmarks"),
        end_bookmark: false,
        timeout: query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|t| *t > 0)
            .map(Duration::from_secs),
        format: call.format,
        bookmark_interval: call.app.bookmark_interval,
    })
}

/// Where a watch starts: now (with the initial-events-end bookmark when `sendInitialEvents`
/// asks for it), or after the resourceVersion given.
fn watch_start(query: &HashMap<String, String>) -> Result<WatchStart, ApiError> {
    let send_initial = query.get("sendInitialEvents").map(String::as_str);
    let rv = query
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    Ok(match (send_initial, rv) {
        (Some(v), _) if parse_bool(v) => WatchStart::Now { end_bookmark: true },
        (_, "" | "0") => WatchStart::Now {
            end_bookmark: false,
        },
        (_, rv) => WatchStart::From(rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "invalid resource version \"{rv}\": must be a decimal integer"
            ))
        })?),
    })
}
