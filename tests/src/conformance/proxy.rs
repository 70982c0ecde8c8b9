//! A TCP proxy in front of the managers' gRPC ports, playing the Kubernetes Service that
//! selects the leader pod: each new connection goes to whichever manager says it leads; with no
//! leader the connection is accepted and closed at once (a Service without ready endpoints
//! refuses too). Every connection is logged, so a check can see how often a controller
//! reconnects without knowing anything about its language.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use crate::manager::Manager;

use super::world::now_us;

/// How the proxy reaches one manager: its gRPC address and how to ask whether it leads.
#[derive(Clone)]
pub struct Route {
    /// `127.0.0.1:PORT` of the gRPC port.
    pub grpc: String,
    /// The `/status` URL.
    status: String,
    /// Reads the HTTP port (HTTPS under Kubernetes auth).
    client: reqwest::Client,
    /// The token `/status` needs under Kubernetes auth.
    token: Option<String>,
}

impl Route {
    /// The route to `m`.
    pub fn to(m: &Manager) -> Route {
        Route {
            grpc: m.grpc.trim_start_matches("http://").to_string(),
            status: format!("{}/status", m.http),
            client: m.http_client.clone(),
            token: m.http_token.clone(),
        }
    }

    /// Whether this manager says it leads (false when it does not answer within a second).
    async fn leading(&self) -> bool {
        let mut req = self.client.get(&self.status);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let ask = async {
            let status: serde_json::Value = req.send().await.ok()?.json().await.ok()?;
            Some(status["leading"] == serde_json::json!(true))
        };
        tokio::time::timeout(Duration::from_secs(1), ask)
            .await
            .ok()
            .flatten()
            == Some(true)
    }
}

/// One accepted connection.
#[derive(Debug, Clone)]
pub struct Connection {
    /// When it was accepted (Unix microseconds).
    pub at_us: u64,
    /// The manager it was forwarded to; None when no manager led (closed at once).
    pub to: Option<String>,
}

/// The proxy; it stops when dropped.
pub struct LeaderProxy {
    port: u16,
    routes: Arc<Mutex<Vec<Route>>>,
    log: Arc<Mutex<Vec<Connection>>>,
    cut: tokio::sync::watch::Sender<u64>,
    freeze: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaderProxy {
    /// Listens on a loopback port and forwards to the leader among `routes`.
    pub async fn start(routes: Vec<Route>) -> std::io::Result<LeaderProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let routes = Arc::new(Mutex::new(routes));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (cut, _) = tokio::sync::watch::channel(0);
        let (freeze, _) = tokio::sync::watch::channel(0);
        let shared = Shared {
            routes: routes.clone(),
            log: log.clone(),
            cut: cut.clone(),
            freeze: freeze.clone(),
        };
        let task = tokio::spawn(accept_loop(listener, shared));
        Ok(LeaderProxy {
            port,
            routes,
            log,
            cut,
            freeze,
            task,
        })
    }

    /// The endpoint controllers dial: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Replaces the managers behind the proxy (a pod added or gone).
    pub fn set_routes(&self, routes: Vec<Route>) {
        *self.routes.lock() = routes;
    }

    /// Severs every open connection at once (a network cut: both ends see the connection
    /// drop, neither gets a goodbye).
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Freezes every open connection: no byte is forwarded either way any more and neither end
    /// is closed (a partition: both ends keep a connection that has gone silent). New
    /// connections are forwarded as usual. The frozen ones are dropped at the next [`cut`].
    ///
    /// [`cut`]: LeaderProxy::cut
    pub fn freeze(&self) {
        self.freeze.send_modify(|n| *n += 1);
    }

    /// Every connection accepted so far, oldest first.
    pub fn connections(&self) -> Vec<Connection> {
        self.log.lock().clone()
    }
}

impl Drop for LeaderProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the accept loop shares with the proxy handle.
struct Shared {
    routes: Arc<Mutex<Vec<Route>>>,
    log: Arc<Mutex<Vec<Connection>>>,
    cut: tokio::sync::watch::Sender<u64>,
    freeze: tokio::sync::watch::Sender<u64>,
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Shared) {
    while let Ok((inbound, _)) = listener.accept().await {
        let at_us = now_us();
        let routes = shared.routes.lock().clone();
        let log = shared.log.clone();
        let cut = shared.cut.subscribe();
        let freeze = shared.freeze.subscribe();
        tokio::spawn(async move {
            let target = leader(&routes).await;
            log.lock().push(Connection {
                at_us,
                to: target.clone(),
            });
            if let Some(addr) = target {
                forward(inbound, &addr, (cut, freeze)).await;
            }
            // No leader: dropping `inbound` closes it, as a Service without endpoints does.
        });
    }
}

/// The gRPC address of the manager that leads, if one does.
async fn leader(routes: &[Route]) -> Option<String> {
    for route in routes {
        if route.leading().await {
            return Some(route.grpc.clone());
        }
    }
    None
}

async fn forward(
    mut inbound: tokio::net::TcpStream,
    addr: &str,
    (mut cut, mut freeze): (
        tokio::sync::watch::Receiver<u64>,
        tokio::sync::watch::Receiver<u64>,
    ),
) {
    if let Ok(mut outbound) = tokio::net::TcpStream::connect(addr).await {
        let _ = outbound.set_nodelay(true);
        let _ = inbound.set_nodelay(true);
        let frozen = tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
            // Dropping both sockets mid-stream is the cut.
            _ = cut.changed() => false,
            _ = freeze.changed() => true,
        };
        if frozen {
            // Both sockets stay open and silent until the next cut.
            let _ = cut.changed().await;
        }
    }
}
