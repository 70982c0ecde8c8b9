//! The manager's HTTP port: `/` (the status page for people), `/healthz`, `/readyz` (leader
//! election running and caches synced), `/metrics`, and `/status` (the same facts as JSON).
//!
//! Owns: the HTTP routes and the status page. May call: `dispatch`, `informer`, `leader`,
//! `metrics` and `registration`, read-only — nothing below calls back up into it.

pub mod status_page;

use crate::dispatch::controllers::ControllerTable;
use crate::informer::Cache;
use crate::leader::LeaderState;
use crate::metrics::Metrics;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use status_page::Snapshot;
use std::sync::Arc;
use tokio::sync::watch;

/// What the HTTP handlers read.
pub struct HttpState {
    /// Controllers.
    pub controllers: Arc<ControllerTable>,
    /// Caches.
    pub cache: Arc<Cache>,
    /// Leadership.
    pub leader: watch::Receiver<LeaderState>,
    /// This manager's identity.
    pub identity: String,
    /// The Prometheus registry.
    pub metrics: Arc<Metrics>,
    /// The Lease name (the `name` label of leader_election_master_status).
    pub lease_name: String,
}

/// The router for the HTTP port.
pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/", get(page))
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
    axum::Json(snapshot(&s).to_json())
}

/// Query parameters of the status page.
#[derive(Debug, serde::Deserialize)]
struct PageParams {
    /// Seconds between reloads; 0 turns reloading off (e.g. while reading a long error).
    refresh: Option<u32>,
}

async fn page(State(s): State<Arc<HttpState>>, Query(p): Query<PageParams>) -> impl IntoResponse {
    let refresh = p.refresh.unwrap_or(status_page::DEFAULT_REFRESH_SECS);
    (
        [
            ("content-type", "text/html; charset=utf-8"),
            ("cache-control", "no-store"),
        ],
        status_page::render(&snapshot(&s), refresh),
    )
}

fn snapshot(s: &HttpState) -> Snapshot {
    let leader = s.leader.borrow().clone();
    Snapshot::collect(
        &s.controllers,
        &s.cache,
        &leader,
        &s.identity,
        &s.lease_name,
    )
}

async fn metrics(State(s): State<Arc<HttpState>>) -> impl IntoResponse {
    // Gauges that describe the present are set at scrape time, from the source of truth.
    let m = &s.metrics;
    m.leader
        .with_label_values(&[s.lease_name.as_str()])
        .set(i64::from(s.leader.borrow().leading));
    // Controllers and informers come and go: drop their old series before writing live ones.
    m.depth.reset();
    m.active_workers.reset();
    m.sessions.reset();
    m.max_concurrent.reset();
    m.unfinished.reset();
    m.longest.reset();
    m.informer_objects.reset();
    m.informer_relists.reset();
    m.informer_watch_restarts.reset();
    for c in s.controllers.all() {
        let (name, tenant) = (c.id.name.as_str(), c.id.tenant.as_str());
        let q = c.queue_stats();
        let labels = [name, tenant];
        m.depth
            .with_label_values(&labels)
            .set(i64::try_from(q.depth).unwrap_or(i64::MAX));
        m.active_workers
            .with_label_values(&labels)
            .set(i64::try_from(q.in_flight).unwrap_or(i64::MAX));
        m.sessions
            .with_label_values(&labels)
            .set(i64::try_from(q.sessions).unwrap_or(i64::MAX));
        m.max_concurrent
            .with_label_values(&labels)
            .set(i64::from(c.registration.max_concurrent));
        m.unfinished.with_label_values(&labels).set(q.unfinished);
        m.longest.with_label_values(&labels).set(q.longest);
        Metrics::advance(&m.adds, &labels, q.adds);
        Metrics::advance(&m.retries, &labels, q.retries);
    }
    let seat_pool = s.controllers.seat_pool();
    m.dispatch_seats.set(seat_pool.capacity() as f64);
    m.seats_in_use.reset();
    m.seats_waiting.reset();
    for t in seat_pool.tenants() {
        let weight = t.weight.to_string();
        let labels = [t.tenant.as_str(), weight.as_str()];
        m.seats_in_use
            .with_label_values(&labels)
            .set(i64::try_from(t.in_use).unwrap_or(i64::MAX));
        m.seats_waiting
            .with_label_values(&labels)
            .set(i64::try_from(t.waiting).unwrap_or(i64::MAX));
        Metrics::advance(&m.seat_grants, &[t.tenant.as_str()], t.granted);
        Metrics::advance(&m.seat_waits, &[t.tenant.as_str()], t.waited);
    }
    let informers = s.cache.all();
    m.informers.set(informers.len() as f64);
    for i in &informers {
        let k = i.key();
        let labels = [
            k.group.as_str(),
            k.plural.as_str(),
            k.namespace.as_deref().unwrap_or(""),
        ];
        m.informer_objects
            .with_label_values(&labels)
            .set(i64::try_from(i.len()).unwrap_or(i64::MAX));
        m.informer_relists
            .with_label_values(&labels)
            .set(i64::try_from(i.relists()).unwrap_or(i64::MAX));
        m.informer_watch_restarts
            .with_label_values(&labels)
            .set(i64::try_from(i.watch_restarts()).unwrap_or(i64::MAX));
    }
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        m.render(),
    )
}
