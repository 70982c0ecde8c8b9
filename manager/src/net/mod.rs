//! Connections a stranger can open, on both ports. Everything here is spent before anyone is
//! authenticated, so each resource has a bound where it enters:
//!
//! - **connections**: a cap per port and per peer address ([`crate::throttle::Slots`]), sized
//!   below the open-file limit ([`fd`]); a connection over a cap is accepted and closed at once;
//! - **accept errors**: EMFILE, ENFILE and their kind back off ([`backoff`]) instead of spinning;
//! - **time**: a deadline for the first bytes (HTTP/2 preface, TLS ClientHello), for the first
//!   call where the port expects one at once, and an idle timeout for a connection with no open
//!   call ([`conn::Guarded`], with calls counted by [`conn::Activity`]);
//! - **streams and headers**: `max_concurrent_streams`, HTTP/2 keepalive with a timeout and header
//!   size limits are set on each port's server (`run/mod.rs`, `http/tls.rs`) from [`PortRules`].
//!
//! Owns: the accept loop ([`accept`]), connection caps and deadlines, the open-call count per
//! connection, and the process' open-file limit. May call: `throttle` and `metrics` only; it knows
//! nothing of gRPC services or HTTP routes (both edges call into it).

pub(crate) mod accept;
pub(crate) mod backoff;
pub(crate) mod conn;
pub(crate) mod fd;

use std::time::Duration;

/// What one port allows a connection. Built from the flags in `run/mod.rs`.
#[derive(Debug, Clone)]
pub(crate) struct PortRules {
    /// The port's name in metrics and logs (`grpc` or `http`): a bounded label.
    pub port: &'static str,
    /// How long a new connection may stay silent before its first byte arrives (an HTTP/2
    /// preface, a TLS ClientHello, an HTTP/1.1 request line).
    pub first_bytes: Duration,
    /// How long a connection may go before its first call starts, where clients call at once
    /// (the HTTP port: probes, Prometheus, browsers). `None` where clients may connect ahead
    /// of time and call later (gRPC channels connect eagerly): then only the idle timeout holds.
    pub first_call: Option<Duration>,
    /// How long a connection may stay open with no call in progress.
    pub idle: Duration,
}

/// HTTP/2 keepalive: a ping after this long without frames...
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// ...and the connection is closed when the ping is not answered within this long: a peer
/// that vanished (no FIN, no RST) holds its connection and its streams no longer than 40 s.
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// The largest header block a peer may send on either port, HTTP/2 or HTTP/1.1: ample for a
/// bearer token (a few KiB) and gRPC metadata, a bounded cost per stream.
pub(crate) const MAX_HEADER_BYTES: u32 = 16 * 1024;
