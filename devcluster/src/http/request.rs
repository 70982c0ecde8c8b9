//! The request path, as named steps. A Kubernetes request goes
//!
//! 1. [`authenticate`]: the bearer token names a user, or 401;
//! 2. [`authorize`]: RBAC allows the request's attributes, or 403 (the admin skips this);
//! 3. discovery and OpenAPI documents answer here, before any resource is resolved;
//! 4. [`resolve`]: the path names a served resource (and namespace, name, subresource), or 404;
//! 5. [`decode`]: a protobuf body becomes JSON, CBOR is refused;
//! 6. [`inject_faults`]: the request is counted, delayed and failed as tests asked;
//! 7. a handler per verb ([`super::verbs`]), or the review APIs.
//!
//! Authentication and authorization come before fault injection, so injected failures and
//! latency apply only to requests that were allowed (devcluster/README.md, "Fault injection").
//! `/version` and the health checks need no credentials.

use super::app::{App, Request};
use super::decode;
use super::discovery;
use super::target::Target;
use super::verbs;
use crate::auth::authn::Identity;
use crate::auth::rbac::{self, Attributes, Decision};
use crate::auth::reviews::ReviewApi;
use crate::status::ApiError;
use axum::body::Bytes;
use axum::response::Response;

/// Serves one request through the steps above.
pub(super) async fn serve(app: &App, req: &Request, body: Bytes) -> Result<Response, ApiError> {
    let segs: Vec<&str> = req
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(response) = discovery::public(&segs) {
        return Ok(response);
    }
    let user = authenticate(app, req)?;
    authorize(app, req, &user)?;
    if let Some(response) = discovery::answer(app, req, &segs)? {
        return Ok(response);
    }
    let target = resolve(app, req, &segs)?;
    let review = ReviewApi::of(
        &target.info,
        target.namespace.as_deref(),
        target.name.as_deref(),
        target.sub.as_deref(),
    );
    let body = match review {
        // Reviews decode their own bodies, after fault injection.
        Some(_) => body,
        None => decode(req, body)?,
    };
    let verb = target.verb(&req.method, &req.query);
    inject_faults(app, &target, verb).await?;
    match review {
        Some(review) => verbs::review(app, req, &user, verb, &review, &body),
        None => verbs::handle(app, req, &target, verb, body),
    }
}

/// Step 1: who is asking. Every outcome is counted for `auth_stats()`.
fn authenticate(app: &App, req: &Request) -> Result<Identity, ApiError> {
    match app.auth.authenticate(&app.store, &req.headers) {
        Ok(user) => {
            app.auth.stats.authenticated(true);
            Ok(user)
        }
        Err(e) => {
            app.auth.stats.authenticated(false);
            tracing::debug!(method = %req.method, path = %req.path, error = %e, "unauthenticated");
            Err(unauthorized())
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

/// Step 2: whether the user may do what the URL asks. The admin never waits for the store lock;
/// everyone else is checked against live RBAC.
fn authorize(app: &App, req: &Request, user: &Identity) -> Result<(), ApiError> {
    let attrs = Attributes::from_request(&req.method, &req.path, &req.query);
    let decision = if user.is_master() {
        Decision::Allow(String::new())
    } else {
        rbac::authorize(&app.store.lock(), user, &attrs)
    };
    app.auth.stats.authorized(decision.allowed());
    if decision.allowed() {
        Ok(())
    } else {
        Err(attrs.forbidden(user, decision.reason()))
    }
}

/// Step 4: the served resource, namespace, name and subresource the path names.
fn resolve(app: &App, req: &Request, segs: &[&str]) -> Result<Target, ApiError> {
    Target::resolve(&app.store.lock().registry, segs).ok_or_else(|| ApiError::no_route(&req.path))
}

/// Step 5: the body as the store takes it (JSON or YAML; protobuf decoded).
fn decode(req: &Request, body: Bytes) -> Result<Bytes, ApiError> {
    if body.is_empty() {
        return Ok(body);
    }
    decode::content(req.content_type(), body)
}

/// Step 6: count the request, wait out injected latency, and fail it if a fault says so.
async fn inject_faults(app: &App, target: &Target, verb: &str) -> Result<(), ApiError> {
    let (injected, delay) = app
        .faults
        .on_request(verb, &target.info.plural, target.lease());
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match injected {
        Some(code) => Err(ApiError::injected(code)),
        None => Ok(()),
    }
}
