//! A TCP proxy in front of one address that can stand for a network that stops carrying
//! packets: [`Freezable::freeze`] severs every open connection and holds new ones open without
//! forwarding a byte (a client sees its requests time out, as with a dropped route or a hung
//! API server), [`Freezable::thaw`] forwards again.

use std::net::SocketAddr;
use tokio::sync::watch;

/// The proxy; it stops when dropped.
pub struct Freezable {
    /// The loopback address clients dial instead of the target.
    pub addr: SocketAddr,
    frozen: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Freezable {
    /// Forwards every connection to `target` until frozen.
    pub async fn start(target: SocketAddr) -> std::io::Result<Freezable> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (frozen, _) = watch::channel(false);
        let gate = frozen.clone();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                tokio::spawn(relay(inbound, target, gate.subscribe()));
            }
        });
        Ok(Freezable { addr, frozen, task })
    }

    /// Sever every open connection and hold new ones silent.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forward again.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// The target's URL as clients dial it through the proxy: `https://127.0.0.1:PORT`.
    pub fn https_url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for Freezable {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection: held silent while frozen, forwarded while not, dropped on a freeze.
async fn relay(
    mut inbound: tokio::net::TcpStream,
    target: SocketAddr,
    mut frozen: watch::Receiver<bool>,
) {
    // A connection made while frozen waits, silent, until the thaw (or the client gives up).
    if frozen.wait_for(|f| !*f).await.is_err() {
        return;
    }
    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        // Dropping both sockets mid-stream is the cut.
        _ = frozen.wait_for(|f| *f) => {}
    }
}
