//! The controller's HTTP health endpoint, for kubelet probes: off unless
//! [`Config::health_addr`](crate::Config::health_addr) (`CTRLHUB_HEALTH_ADDR`, e.g.
//! `0.0.0.0:8081`) is set.
//!
//! - `GET /healthz`: `200 ok` while the process's async runtime works; `500` with the reason
//!   when it has not run a tick for [`Config::stuck_after`](crate::Config::stuck_after)
//!   (10 s): every worker is blocked, say by blocking code outside
//!   [`blocking`](crate::blocking). It is served from a thread of its own, so a stuck runtime
//!   still gets its answer.
//! - `GET /readyz`: `200 ok` while a session is registered and not draining; `503` with a
//!   one-line reason otherwise (connecting, reconnecting after a manager restart or a leader
//!   change, draining on SIGTERM, waiting while a newer definition of the controller runs).
//!
//! The server starts with [`Controller::run`](crate::Controller::run) (a port it cannot bind
//! fails `run` at once) and stops when `run` returns.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

/// What the probes answer, shared by the runtime (which updates it) and the server.
#[derive(Debug)]
pub(crate) struct Health {
    started: Instant,
    /// Milliseconds since `started` of the runtime's last tick.
    ticked: AtomicU64,
    stuck_after: Duration,
    /// `None` while ready, else why not.
    not_ready: Mutex<Option<String>>,
}

impl Health {
    pub(crate) fn new(stuck_after: Duration, not_ready: String) -> Self {
        Self {
            started: Instant::now(),
            ticked: AtomicU64::new(0),
            stuck_after,
            not_ready: Mutex::new(Some(not_ready)),
        }
    }

    /// The runtime is alive now.
    pub(crate) fn tick(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.ticked.store(ms, Ordering::Relaxed);
    }

    /// Ready from now on.
    pub(crate) fn ready(&self) {
        *self
            .not_ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Not ready from now on, because of `why` (one line).
    pub(crate) fn not_ready(&self, why: impl Into<String>) {
        let why: String = why.into();
        let line = why.lines().next().unwrap_or_default().to_owned();
        *self
            .not_ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(line);
    }

    /// `/readyz`: `None` when ready, else the reason.
    pub(crate) fn readiness(&self) -> Option<String> {
        self.not_ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `/healthz`: `None` when live, else the reason.
    pub(crate) fn liveness(&self) -> Option<String> {
        let ticked = Duration::from_millis(self.ticked.load(Ordering::Relaxed));
        let silent = self.started.elapsed().saturating_sub(ticked);
        (silent > self.stuck_after).then(|| {
            format!(
                "stuck: the controller's async runtime ran no tick for {} (more than {}); \
                 is blocking code running outside ctrlhub_sdk::blocking?",
                humantime::format_duration(Duration::from_millis(
                    u64::try_from(silent.as_millis() / 100 * 100).unwrap_or(u64::MAX)
                )),
                humantime::format_duration(self.stuck_after)
            )
        })
    }

    /// Ticks on the current runtime every second until `stop`.
    pub(crate) fn keep_ticking(self: &Arc<Self>, stop: CancellationToken) {
        let health = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = every.tick() => health.tick(),
                }
            }
        });
    }
}

/// The running server; dropping it stops the server.
#[derive(Debug)]
pub(crate) struct Server {
    stop: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Binds `addr` now (an error is the caller's) and serves the probes from a thread of its own.
pub(crate) fn serve(addr: SocketAddr, health: Arc<Health>) -> std::io::Result<Server> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    std::thread::Builder::new()
        .name("ctrlhub-health".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(err) => {
                        tracing::error!("the health endpoint cannot listen: {err}");
                        return;
                    }
                };
                loop {
                    let (stream, _) = tokio::select! {
                        () = stopped.cancelled() => return,
                        accepted = listener.accept() => match accepted {
                            Ok(a) => a,
                            Err(err) => {
                                debug!("health endpoint: accept failed: {err}");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                continue;
                            }
                        },
                    };
                    let health = health.clone();
                    let service = hyper::service::service_fn(move |req| {
                        let health = health.clone();
                        async move { Ok::<_, Infallible>(answer(&health, &req)) }
                    });
                    let stopped = stopped.clone();
                    tokio::spawn(async move {
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(Duration::from_secs(10))
                            .serve_connection(TokioIo::new(stream), service);
                        tokio::select! {
                            () = stopped.cancelled() => {}
                            r = conn => if let Err(err) = r {
                                debug!("health endpoint: connection: {err}");
                            },
                        }
                    });
                }
            });
        })?;
    info!(%addr, "health endpoint listening: /healthz (liveness), /readyz (readiness)");
    Ok(Server { stop })
}

/// The answer to one probe.
fn answer(health: &Health, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, body) = match req.uri().path() {
        "/healthz" | "/livez" => match health.liveness() {
            None => (StatusCode::OK, "ok".to_owned()),
            Some(why) => (StatusCode::INTERNAL_SERVER_ERROR, why),
        },
        "/readyz" => match health.readiness() {
            None => (StatusCode::OK, "ok".to_owned()),
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found: /healthz and /readyz are served here".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body + "\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_is_one_line() {
        let h = Health::new(Duration::from_secs(10), "connecting".into());
        assert_eq!(h.readiness().as_deref(), Some("connecting"));
        h.ready();
        assert_eq!(h.readiness(), None);
        h.not_ready("draining\nmore");
        assert_eq!(h.readiness().as_deref(), Some("draining"));
    }

    #[test]
    fn liveness_follows_the_ticks() {
        let h = Health::new(Duration::from_millis(30), "x".into());
        h.tick();
        assert_eq!(h.liveness(), None);
        std::thread::sleep(Duration::from_millis(60));
        let why = h.liveness().unwrap_or_default();
        assert!(why.starts_with("stuck:"), "{why}");
        h.tick();
        assert_eq!(h.liveness(), None);
    }
}
