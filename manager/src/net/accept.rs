//! The accept loop both ports share: each accepted connection takes a slot of its port's cap
//! (per peer and in all) or is closed at once, and failed accepts back off.

use super::backoff::{AcceptBackoff, AcceptFailure};
use super::conn::{Guarded, PortState};
use crate::throttle::{Full, LogEvery, PeerKey, Slots};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Connections accepted and admitted, waiting for the server to take them: small, so a server
/// that stops taking connections stops the loop from accepting more.
const HANDOFF: usize = 16;

/// Accepts on `listener` until `stop` fires or the receiver is dropped; admitted connections
/// come out of the returned channel (tonic takes it as a stream; the HTTP port reads it).
pub(crate) fn accept(
    listener: TcpListener,
    caps: Arc<Slots<PeerKey>>,
    port: PortState,
    stop: CancellationToken,
) -> mpsc::Receiver<std::io::Result<Guarded<TcpStream>>> {
    let (tx, rx) = mpsc::channel(HANDOFF);
    tokio::spawn(async move {
        let name = port.rules.port;
        let mut backoff = AcceptBackoff::default();
        let mut refusals = LogEvery::new(Duration::from_secs(10));
        let mut failures = LogEvery::new(Duration::from_secs(10));
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.cancelled() => return,
                _ = tx.closed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => {
                    backoff.succeeded();
                    a
                }
                Err(e) => {
                    let failure = AcceptFailure::of(&e);
                    port.metrics.accept_failed(name, failure.label());
                    let pause = backoff.failed(failure);
                    if let Some(held_back) = failures.hit(std::time::Instant::now()) {
                        tracing::warn!(port = name, error = %e, ?pause, held_back, "accept failed; pausing before the next accept");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stop.cancelled() => return,
                    }
                    continue;
                }
            };
            let slot = match caps.take(PeerKey::from(peer.ip())) {
                Ok(slot) => slot,
                Err(full) => {
                    let reason = match full {
                        Full::Key => "peer_cap",
                        Full::Total => "total_cap",
                    };
                    port.metrics.connection_refused(name, reason);
                    if let Some(held_back) = refusals.hit(std::time::Instant::now()) {
                        tracing::warn!(port = name, %peer, reason, per_peer = caps.per_key(), total = caps.total(), held_back, "connection refused: its cap is reached (see --max-connections and --max-connections-per-peer)");
                    }
                    // Closed at once: the peer sees its connection end, the descriptor is free.
                    drop(tcp);
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let local = tcp.local_addr().ok();
            let guarded = Guarded::new(tcp, peer, local, slot, port.clone());
            if tx.send(Ok(guarded)).await.is_err() {
                return;
            }
        }
    });
    rx
}
