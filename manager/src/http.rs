//! The manager's HTTP port: `/healthz`, `/readyz` (leader election running and caches synced),
//! `/metrics`, and `/status` (JSON for people and scripts).

use crate::cache::Cache;
use crate::leader::LeaderState;
use crate::registry::Registry;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::watch;

/// What the HTTP handlers read.
pub struct HttpState {
    /// Controllers.
    pub registry: Arc<Registry>,
    /// Caches.
    pub cache: Arc<Cache>,
    /// Leadership.
    pub leader: watch::Receiver<LeaderState>,
    /// This manager's identity.
    pub identity: String,
}

/// The router for the HTTP port.
pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(state)
}

async fn readyz(State(s): State<Arc<HttpState>>) -> impl IntoResponse {
    if s.cache.all_synced() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

async fn status(State(s): State<Arc<HttpState>>) -> impl IntoResponse {
    let leader = s.leader.borrow().clone();
    let controllers: Vec<_> = s
        .registry
        .all()
        .iter()
        .map(|c| {
            let (queued, in_flight, sessions) = c.snapshot();
            json!({
                "tenant": c.id.tenant, "name": c.id.name,
                "primary": format!("{}/{}", c.registration.primary.api_version(), c.registration.primary.kind),
                "sessions": sessions, "queued": queued, "inFlight": in_flight,
                "dispatched": c.counters.dispatched.load(Ordering::Relaxed),
                "done": c.counters.done.load(Ordering::Relaxed),
                "errors": c.counters.errors.load(Ordering::Relaxed),
                "terminal": c.counters.terminal.load(Ordering::Relaxed),
                "deadlineMisses": c.counters.deadline_misses.load(Ordering::Relaxed),
            })
        })
        .collect();
    let informers: Vec<_> = s
        .cache
        .all()
        .iter()
        .map(|i| json!({"informer": i.key().label(), "objects": i.len(), "synced": i.is_synced(), "relists": i.relists()}))
        .collect();
    axum::Json(json!({
        "identity": s.identity,
        "leading": leader.leading,
        "leader": leader.holder,
        "controllers": controllers,
        "informers": informers,
    }))
}

async fn metrics(State(s): State<Arc<HttpState>>) -> impl IntoResponse {
    use std::fmt::Write;
    let mut out = String::new();
    let leading = i32::from(s.leader.borrow().leading);
    let _ = writeln!(
        out,
        "# HELP leader_election_master_status Gauge of if the reporter is master of the relevant lease, 0 indicates backup, 1 indicates master."
    );
    let _ = writeln!(out, "# TYPE leader_election_master_status gauge");
    let _ = writeln!(
        out,
        "leader_election_master_status{{name=\"ctrlhub\"}} {leading}"
    );
    let _ = writeln!(
        out,
        "# HELP controller_runtime_reconcile_total Total number of reconciliations per controller"
    );
    let _ = writeln!(out, "# TYPE controller_runtime_reconcile_total counter");
    for c in s.registry.all() {
        let n = &c.id.name;
        let t = &c.id.tenant;
        for (result, v) in [
            ("success", c.counters.done.load(Ordering::Relaxed)),
            ("requeue_after", c.counters.requeued.load(Ordering::Relaxed)),
            (
                "error",
                c.counters.errors.load(Ordering::Relaxed)
                    + c.counters.terminal.load(Ordering::Relaxed),
            ),
        ] {
            let _ = writeln!(
                out,
                "controller_runtime_reconcile_total{{controller=\"{n}\",tenant=\"{t}\",result=\"{result}\"}} {v}"
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP ctrlhub_informer_objects Objects held by each informer"
    );
    let _ = writeln!(out, "# TYPE ctrlhub_informer_objects gauge");
    for i in s.cache.all() {
        let k = i.key();
        let _ = writeln!(
            out,
            "ctrlhub_informer_objects{{group=\"{}\",resource=\"{}\",namespace=\"{}\"}} {}",
            k.group,
            k.plural,
            k.namespace.as_deref().unwrap_or(""),
            i.len()
        );
    }
    ([("content-type", "text/plain; version=0.0.4")], out)
}
