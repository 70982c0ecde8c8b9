//! The manager's HTTP port: `/` (the status page for people), `/metrics`, `/status` (the same
//! facts as JSON) and the probes of [`probes`] (also on the probe port, `--probe-addr`). With
//! `--auth kubernetes` it is HTTPS and every path but the probes needs a token ([`access`]).
//!
//! Owns: the HTTP routes and the status page. May call: `dispatch`, `informer`, `leader`,
//! `metrics` and `registration`, read-only — nothing below calls back up into it.

pub(crate) mod access;
pub(crate) mod login;
pub(crate) mod probes;
#[cfg(feature = "profiling")]
pub(crate) mod profile;
pub(crate) mod session;
pub(crate) mod status_page;
pub(crate) mod tls;

use crate::dispatch::controllers::ControllerTable;
use crate::informer::Cache;
use crate::leader::LeaderState;
use crate::metrics::Metrics;
use access::{Gate, Refusal, Viewer};
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::{ConnectInfo, FromRequestParts, Query, State};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use status_page::Snapshot;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tokio::sync::watch;

/// What the HTTP handlers read.
pub(crate) struct HttpState {
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
    /// Who may see what.
    pub gate: Gate,
    /// How the manager was started (static auth, namespace ceiling), shown on the page.
    pub settings: status_page::Settings,
    /// The probes' checks (`/livez`, `/readyz`, `/healthz`), served here and on the probe port.
    pub probes: Arc<probes::Probes>,
    /// Ring mode: this member's place in the ring (None: leader mode).
    pub ring: Option<Arc<crate::members::Ring>>,
}

/// The caller's address, when the connection told it (per-peer throttling of bad tokens).
struct Peer(Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let addr = parts.extensions.get::<ConnectInfo<SocketAddr>>();
        Ok(Peer(addr.map(|ConnectInfo(a)| a.ip())))
    }
}

/// The router for the HTTP port.
pub(crate) fn router(state: Arc<HttpState>) -> Router {
    // The probes stay here, open, for probes written before the probe port existed.
    let probes = probes::router(state.probes.clone());
    let router = Router::new();
    #[cfg(feature = "profiling")]
    let router = router.route(profile::PATH, get(profile::cpu));
    router
        .route("/", get(page))
        .route(
            "/login",
            get(login::form)
                .post(login::submit)
                .layer(DefaultBodyLimit::max(login::MAX_LOGIN_BYTES)),
        )
        .route("/logout", post(login::logout))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(state)
        .merge(probes)
}

async fn status(
    State(s): State<Arc<HttpState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    let viewer = s.gate.viewer(&headers, peer, "/status", true).await?;
    Ok(axum::Json(snapshot(&s, &viewer).to_json()).into_response())
}

/// Query parameters of the status page.
#[derive(Debug, serde::Deserialize)]
struct PageParams {
    /// Seconds between reloads; 0 turns reloading off (e.g. while reading a long error).
    refresh: Option<u32>,
}

async fn page(
    State(s): State<Arc<HttpState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
    Query(p): Query<PageParams>,
) -> Result<Response, Refusal> {
    // A browser without credentials gets the login form rather than a bare 401.
    let viewer = match s.gate.viewer(&headers, peer, "/", true).await {
        Err(Refusal::Unauthenticated(_)) if login::wants_login(&headers) => {
            return Ok(login::to_login());
        }
        other => other?,
    };
    let refresh = p.refresh.unwrap_or(status_page::DEFAULT_REFRESH_SECS);
    Ok((
        [
            ("content-type", "text/html; charset=utf-8"),
            ("cache-control", "no-store"),
        ],
        status_page::render(&snapshot(&s, &viewer), refresh),
    )
        .into_response())
}

fn snapshot(s: &HttpState, viewer: &Viewer) -> Snapshot {
    let leader = s.leader.borrow().clone();
    let mut snapshot = Snapshot::collect(
        &s.controllers,
        &s.cache,
        &leader,
        (&s.identity, &s.lease_name, &s.settings),
        viewer,
    );
    // The ring names every tenant's controllers: operators only.
    if matches!(viewer, Viewer::Operator) {
        snapshot.ring = s.ring.as_ref().map(|r| r.status());
    }
    snapshot
}

/// Every tenant's series: only for callers with the `get /metrics` grant (Prometheus).
async fn metrics(
    State(s): State<Arc<HttpState>>,
    Peer(peer): Peer,
    headers: HeaderMap,
) -> Result<Response, Refusal> {
    s.gate.viewer(&headers, peer, "/metrics", false).await?;
    Ok(render_metrics(&s).into_response())
}

fn render_metrics(s: &HttpState) -> impl IntoResponse + use<> {
    // Gauges that describe the present are set at scrape time, from the source of truth.
    let m = &s.metrics;
    m.leader
        .with_label_values(&[s.lease_name.as_str()])
        .set(i64::from(s.leader.borrow().leading));
    set_controller_gauges(m, &s.controllers);
    set_seat_gauges(m, &s.controllers);
    set_informer_gauges(m, &s.cache);
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        m.render(),
    )
}

/// A count as a gauge value, saturating instead of wrapping.
fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Per-controller queue and worker gauges. Controllers come and go: their old series are
/// dropped before the live ones are written.
fn set_controller_gauges(m: &Metrics, controllers: &ControllerTable) {
    m.depth.reset();
    m.active_workers.reset();
    m.sessions.reset();
    m.queued_bytes.reset();
    m.max_concurrent.reset();
    m.unfinished.reset();
    m.longest.reset();
    for c in controllers.all() {
        // Series are per tenant as limits and seats count it (controller names are unique
        // within a tenant), so the dashboards' tenant variable selects seats and controllers alike.
        let (name, tenant) = (c.id.name.as_str(), &*c.group);
        let q = c.queue_stats();
        let labels = [name, tenant];
        m.depth.with_label_values(&labels).set(gauge(q.depth));
        m.active_workers
            .with_label_values(&labels)
            .set(gauge(q.in_flight));
        m.sessions.with_label_values(&labels).set(gauge(q.sessions));
        m.queued_bytes
            .with_label_values(&labels)
            .set(i64::try_from(q.queued_bytes).unwrap_or(i64::MAX));
        // What it can run now (its sessions' credits, within its maximum), as controller-runtime
        // reports its worker count: 0 means nothing can run, not "no limit".
        let effective =
            status_page::effective_concurrency(c.registration.max_concurrent, q.credits);
        m.max_concurrent
            .with_label_values(&labels)
            .set(i64::try_from(effective).unwrap_or(i64::MAX));
        m.unfinished.with_label_values(&labels).set(q.unfinished);
        m.longest.with_label_values(&labels).set(q.longest);
        Metrics::advance(&m.adds, &labels, q.adds);
        Metrics::advance(&m.retries, &labels, q.retries);
    }
}

/// Dispatch seats per tenant.
fn set_seat_gauges(m: &Metrics, controllers: &ControllerTable) {
    let seat_pool = controllers.seat_pool();
    m.dispatch_seats.set(seat_pool.capacity() as f64);
    m.seats_in_use.reset();
    m.seats_waiting.reset();
    for t in seat_pool.tenants() {
        let weight = t.weight.to_string();
        let labels = [t.tenant.as_str(), weight.as_str()];
        m.seats_in_use
            .with_label_values(&labels)
            .set(gauge(t.in_use));
        m.seats_waiting
            .with_label_values(&labels)
            .set(gauge(t.waiting));
        Metrics::advance(&m.seat_grants, &[t.tenant.as_str()], t.granted);
        Metrics::advance(&m.seat_waits, &[t.tenant.as_str()], t.waited);
    }
}

/// Per-informer object counts and restarts; informers come and go like controllers.
fn set_informer_gauges(m: &Metrics, cache: &Cache) {
    m.informer_objects.reset();
    m.informer_relists.reset();
    m.informer_watch_restarts.reset();
    let informers = cache.all();
    m.informers.set(informers.len() as f64);
    for i in &informers {
        let k = i.key();
        let labels = [
            k.group.as_str(),
            k.plural.as_str(),
            k.namespace.as_deref().unwrap_or(""),
            k.label_selector.as_deref().unwrap_or(""),
            if k.metadata_only { "metadata" } else { "full" },
        ];
        m.informer_objects
            .with_label_values(&labels)
            .set(gauge(i.len()));
        m.informer_relists
            .with_label_values(&labels)
            .set(i64::try_from(i.relists()).unwrap_or(i64::MAX));
        m.informer_watch_restarts
            .with_label_values(&labels)
            .set(i64::try_from(i.watch_restarts()).unwrap_or(i64::MAX));
    }
}
