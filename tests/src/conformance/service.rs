//! A TCP proxy playing the Kubernetes Service in front of ring members: each new connection
//! goes to the next of its targets in turn (a Service spreads connections over every ready
//! member), and the targets can be replaced while it runs (endpoints added or gone). Every
//! connection is logged, so a ring check sees when a controller came back to its configured
//! address rather than dialling the owner a redirect named.

use parking_lot::Mutex;
use std::sync::Arc;

use super::proxy::Connection;
use super::world::now_us;

/// What the accept loop shares with the handle.
#[derive(Default)]
struct Shared {
    /// `127.0.0.1:PORT` of every endpoint, in the order connections go to them.
    targets: Vec<String>,
    /// How many connections were accepted (the next one goes to `targets[next % len]`).
    next: usize,
    log: Vec<Connection>,
}

/// The proxy; it stops when dropped.
pub struct ServiceProxy {
    port: u16,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl ServiceProxy {
    /// Listens on a loopback port and spreads connections over `targets` (`host:port`).
    pub async fn start(targets: Vec<String>) -> std::io::Result<ServiceProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Mutex::new(Shared {
            targets,
            ..Shared::default()
        }));
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(ServiceProxy { port, shared, task })
    }

    /// The endpoint controllers dial: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Replaces the endpoints; open connections stay where they are, as with a Service.
    pub fn set_targets(&self, targets: Vec<String>) {
        let mut s = self.shared.lock();
        s.targets = targets;
        s.next = 0;
    }

    /// Every connection accepted so far, oldest first.
    pub fn connections(&self) -> Vec<Connection> {
        self.shared.lock().log.clone()
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Arc<Mutex<Shared>>) {
    while let Ok((inbound, _)) = listener.accept().await {
        let target = {
            let mut s = shared.lock();
            let target =
                (!s.targets.is_empty()).then(|| s.targets[s.next % s.targets.len()].clone());
            s.next += 1;
            s.log.push(Connection {
                at_us: now_us(),
                to: target.clone(),
            });
            target
        };
        // No endpoint: dropping `inbound` closes it, as a Service without endpoints does.
        if let Some(addr) = target {
            tokio::spawn(forward(inbound, addr));
        }
    }
}

async fn forward(mut inbound: tokio::net::TcpStream, addr: String) {
    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&addr).await {
        let _ = outbound.set_nodelay(true);
        let _ = inbound.set_nodelay(true);
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    }
}
