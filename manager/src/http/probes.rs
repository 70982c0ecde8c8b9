//! The kubelet's probes, with named checks as kube-apiserver answers them: `/livez` (restarting
//! would help), `/readyz` (this replica can do its job), `/healthz` (the old name of `/livez`).
//! `?verbose` lists every check (`[+]api-server ok`, `[-]lease failed: …`), `?exclude=NAME`
//! leaves one out, and `/readyz/NAME` asks one.
//!
//! They are served on the probe port (`--probe-addr`, plain HTTP, no token) and, for probes
//! written before it existed, on the HTTP port too. Every check reads memory: none waits on the
//! API server or on tenants' work.

use crate::leader::LeaderState;
use crate::leader::health::{ApiReachability, LeaseHealth};
use crate::leader::heartbeat::Liveness;
use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;
use tokio::sync::watch;

/// What the probes look at.
pub(crate) struct Probes {
    /// The dispatch runtime's heartbeat.
    pub liveness: Liveness,
    /// Leadership, whose channel closes when the election stops.
    pub leader: watch::Receiver<LeaderState>,
    /// Whether the API server answers (None: not probed, e.g. in unit tests).
    pub api: Option<ApiReachability>,
    /// Whether the election's Lease round trips succeed (None: not recorded).
    pub lease: Option<LeaseHealth>,
}

/// Which probe a check belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Live,
    Ready,
}

/// One named check's verdict.
struct Verdict {
    name: &'static str,
    result: Result<(), String>,
}

impl Probes {
    /// Liveness: only what a restart would cure. An unreachable API server is not that (a new
    /// container would not reach it either), a stalled dispatch runtime is.
    fn live(&self) -> Vec<Verdict> {
        vec![
            Verdict {
                name: "ping",
                result: Ok(()),
            },
            Verdict {
                name: "dispatch-runtime",
                result: self.liveness.check().map_err(|e| e.to_string()),
            },
        ]
    }

    /// Readiness: alive, the election running, the API server answering and the Lease held or
    /// contended for. Tenant informers play no part: one tenant's informer that cannot list
    /// fails that tenant's registration, never the replica every tenant shares.
    fn ready(&self) -> Vec<Verdict> {
        let mut checks = self.live();
        checks.push(Verdict {
            name: "leader-election",
            result: match self.leader.has_changed() {
                Ok(_) => Ok(()),
                Err(_) => Err("leader election stopped".into()),
            },
        });
        if let Some(api) = &self.api {
            checks.push(Verdict {
                name: "api-server",
                result: api.check(),
            });
        }
        if let Some(lease) = &self.lease {
            checks.push(Verdict {
                name: "lease",
                result: lease.check(),
            });
        }
        checks
    }

    fn checks(&self, probe: Probe) -> Vec<Verdict> {
        match probe {
            Probe::Live => self.live(),
            Probe::Ready => self.ready(),
        }
    }
}

/// The probe routes: `/livez`, `/readyz`, `/healthz` and `/livez/NAME`, `/readyz/NAME`.
pub(crate) fn router(probes: Arc<Probes>) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/healthz", get(livez))
        .route("/readyz", get(readyz))
        .route("/livez/{check}", get(livez_one))
        .route("/readyz/{check}", get(readyz_one))
        .with_state(probes)
}

async fn livez(State(p): State<Arc<Probes>>, RawQuery(q): RawQuery) -> Response {
    answer(p.checks(Probe::Live), &Query::parse(q.as_deref()), "livez")
}

async fn readyz(State(p): State<Arc<Probes>>, RawQuery(q): RawQuery) -> Response {
    answer(
        p.checks(Probe::Ready),
        &Query::parse(q.as_deref()),
        "readyz",
    )
}

async fn livez_one(State(p): State<Arc<Probes>>, Path(name): Path<String>) -> Response {
    one(p.checks(Probe::Live), &name)
}

async fn readyz_one(State(p): State<Arc<Probes>>, Path(name): Path<String>) -> Response {
    one(p.checks(Probe::Ready), &name)
}

/// `?verbose` and `?exclude=NAME` (repeatable), as kube-apiserver takes them.
#[derive(Debug, Default)]
struct Query {
    verbose: bool,
    exclude: Vec<String>,
}

impl Query {
    fn parse(raw: Option<&str>) -> Query {
        let mut q = Query::default();
        for pair in raw.unwrap_or_default().split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "verbose" => q.verbose = true,
                "exclude" => q.exclude.push(value.to_string()),
                _ => {}
            }
        }
        q
    }
}

/// `ok` (or the list with `?verbose`) and 200 when every check passes; otherwise 503 with the
/// list, so the kubelet's event for a failed probe says which check failed and why.
fn answer(checks: Vec<Verdict>, q: &Query, probe: &str) -> Response {
    let checks: Vec<Verdict> = checks
        .into_iter()
        .filter(|c| !q.exclude.iter().any(|e| e == c.name))
        .collect();
    let healthy = checks.iter().all(|c| c.result.is_ok());
    if healthy && !q.verbose {
        return (StatusCode::OK, "ok").into_response();
    }
    let mut body = String::new();
    for c in &checks {
        match &c.result {
            Ok(()) => body.push_str(&format!("[+]{} ok\n", c.name)),
            Err(why) => body.push_str(&format!("[-]{} failed: {why}\n", c.name)),
        }
    }
    for e in &q.exclude {
        body.push_str(&format!("[+]{e} excluded: ok\n"));
    }
    if healthy {
        body.push_str(&format!("{probe} check passed\n"));
        (StatusCode::OK, body).into_response()
    } else {
        body.push_str(&format!("{probe} check failed\n"));
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

/// One check by name: `ok`, or 503 with why; 404 for a name that is no check.
fn one(checks: Vec<Verdict>, name: &str) -> Response {
    match checks.into_iter().find(|c| c.name == name) {
        Some(Verdict { result: Ok(()), .. }) => (StatusCode::OK, "ok\n".to_string()),
        Some(Verdict {
            result: Err(why), ..
        }) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("[-]{name} failed: {why}\n"),
        ),
        None => (StatusCode::NOT_FOUND, format!("no check named {name}\n")),
    }
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::heartbeat::Heartbeat;
    use std::time::Duration;

    fn probes(lease: &LeaseHealth) -> (Probes, watch::Sender<LeaderState>) {
        let (tx, rx) = watch::channel(LeaderState::default());
        let probes = Probes {
            liveness: Liveness {
                heartbeat: Heartbeat::new(),
                limit: Duration::from_secs(60),
            },
            leader: rx,
            api: None,
            lease: Some(lease.clone()),
        };
        (probes, tx)
    }

    async fn body(r: Response) -> (StatusCode, String) {
        let status = r.status();
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 16)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn readiness_names_the_failed_check_and_liveness_ignores_it() {
        let lease = LeaseHealth::default();
        let (p, _election) = probes(&lease);
        lease.failed("lease request failed: 403 forbidden");
        let q = Query::parse(Some("verbose"));
        let (status, text) = body(answer(p.checks(Probe::Ready), &q, "readyz")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(text.contains("[+]leader-election ok\n"), "{text}");
        assert!(
            text.contains("[-]lease failed: lease request failed: 403 forbidden"),
            "{text}"
        );
        assert!(text.ends_with("readyz check failed\n"), "{text}");
        let (status, text) = body(answer(p.checks(Probe::Live), &Query::default(), "livez")).await;
        assert_eq!((status, text.as_str()), (StatusCode::OK, "ok"));
        let q = Query::parse(Some("exclude=lease"));
        let (status, _) = body(answer(p.checks(Probe::Ready), &q, "readyz")).await;
        assert_eq!(status, StatusCode::OK);
        let (status, text) = body(one(p.checks(Probe::Ready), "lease")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
        lease.succeeded();
        let (status, text) =
            body(answer(p.checks(Probe::Ready), &Query::default(), "readyz")).await;
        assert_eq!((status, text.as_str()), (StatusCode::OK, "ok"));
    }

    #[tokio::test]
    async fn readiness_fails_once_the_election_has_stopped() {
        let lease = LeaseHealth::default();
        lease.succeeded();
        let (p, election) = probes(&lease);
        drop(election);
        let (status, text) =
            body(answer(p.checks(Probe::Ready), &Query::default(), "readyz")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(text.contains("[-]leader-election failed"), "{text}");
    }
}
