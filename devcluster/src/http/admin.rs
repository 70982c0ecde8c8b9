//! The `/_devcluster/` endpoints: fault injection and statistics for tests that run devcluster
//! out of process, backed by the same [`crate::Faults`] handle as the Rust API.

use super::app::App;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The admin routes, merged into the server's router ahead of the Kubernetes paths.
pub(super) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/_devcluster/close-watches", post(admin_close_watches))
        .route("/_devcluster/compact", post(admin_compact))
        .route("/_devcluster/fail", post(admin_fail))
        .route("/_devcluster/latency", post(admin_latency))
        .route("/_devcluster/freeze-lease", post(admin_freeze))
        .route("/_devcluster/unfreeze-lease", post(admin_unfreeze))
        .route("/_devcluster/clear", post(admin_clear))
        .route("/_devcluster/stats", get(admin_stats))
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
