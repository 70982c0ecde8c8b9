//! One accepted connection: [`Guarded`] wraps its socket, holds its cap slot until it closes,
//! and ends it (as if the peer had closed it) when a deadline passes: no first byte within
//! [`PortRules::first_bytes`], no first call within [`PortRules::first_call`], or no call in
//! progress for [`PortRules::idle`]. Calls are counted by [`Activity`], which the HTTP port
//! updates directly and the gRPC port through [`CountCallsLayer`] (tonic tells each request its
//! peer address, which finds the connection in [`CallRegistry`]).

use super::PortRules;
use crate::metrics::Metrics;
use crate::throttle::{PeerKey, Slot};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Calls in progress on one connection and when that last changed.
#[derive(Debug)]
pub(crate) struct Activity {
    state: Mutex<ActivityState>,
}

#[derive(Debug)]
struct ActivityState {
    open: usize,
    since: Instant,
    ever: bool,
}

impl Activity {
    fn new(now: Instant) -> Arc<Self> {
        Arc::new(Activity {
            state: Mutex::new(ActivityState {
                open: 0,
                since: now,
                ever: false,
            }),
        })
    }

    /// A call starts; it ends when the returned guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> CallGuard {
        let mut s = self.state.lock();
        s.open += 1;
        s.ever = true;
        s.since = Instant::now();
        CallGuard(Some(self.clone()))
    }

    /// When the connection must end if nothing changes: `None` while a call is open.
    fn deadline(&self, rules: &PortRules) -> Option<(Instant, &'static str)> {
        let s = self.state.lock();
        if s.open > 0 {
            return None;
        }
        match (s.ever, rules.first_call) {
            (false, Some(first)) => Some((s.since + first, "first_call_timeout")),
            _ => Some((s.since + rules.idle, "idle")),
        }
    }
}

/// One call in progress (see [`Activity::begin`]); a guard of no connection counts nothing.
#[derive(Debug)]
pub(crate) struct CallGuard(Option<Arc<Activity>>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            let mut s = a.state.lock();
            s.open = s.open.saturating_sub(1);
            s.since = Instant::now();
        }
    }
}

/// The open connections of a port by peer address (ip and port: one entry per connection), so
/// a request that knows only its peer address finds its connection's [`Activity`].
#[derive(Debug, Default)]
pub(crate) struct CallRegistry {
    by_peer: Mutex<HashMap<SocketAddr, Weak<Activity>>>,
}

impl CallRegistry {
    /// A call from `peer` starts (counting nothing if the connection is unknown).
    pub(crate) fn begin(&self, peer: Option<SocketAddr>) -> CallGuard {
        let found = peer.and_then(|p| self.by_peer.lock().get(&p).and_then(Weak::upgrade));
        match found {
            Some(a) => a.begin(),
            None => CallGuard(None),
        }
    }
}

/// Everything a [`Guarded`] connection needs from its port.
#[derive(Clone)]
pub(crate) struct PortState {
    /// The port's rules.
    pub rules: Arc<PortRules>,
    /// Where its connections are found by peer address.
    pub registry: Arc<CallRegistry>,
    /// Where closes are counted.
    pub metrics: Arc<Metrics>,
}

/// An accepted connection under its port's deadlines. Reads end (EOF) once a deadline passes,
/// which makes the server above it close the connection; the cap slot is given back when it is
/// dropped.
pub(crate) struct Guarded<IO> {
    io: IO,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    port: PortState,
    activity: Arc<Activity>,
    got_bytes: bool,
    timer: Pin<Box<Sleep>>,
    ended: bool,
    _slot: Slot<PeerKey>,
}

impl<IO> Guarded<IO> {
    /// Guards `io` from `peer` with the cap slot it was admitted with.
    pub(crate) fn new(
        io: IO,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        slot: Slot<PeerKey>,
        port: PortState,
    ) -> Self {
        let now = Instant::now();
        let activity = Activity::new(now);
        port.registry
            .by_peer
            .lock()
            .insert(peer, Arc::downgrade(&activity));
        port.metrics.connection_opened(port.rules.port);
        let timer = Box::pin(tokio::time::sleep_until(now + port.rules.first_bytes));
        Guarded {
            io,
            peer,
            local,
            port,
            activity,
            got_bytes: false,
            timer,
            ended: false,
            _slot: slot,
        }
    }

    /// The peer's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The connection's call counter (the HTTP port counts its requests here directly).
    pub(crate) fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }

    /// Whether a deadline has passed (the timer fired and nothing keeps the connection).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let now = Instant::now();
            let next = if self.got_bytes {
                match self.activity.deadline(&self.port.rules) {
                    // A call is open: look again an idle period from now.
                    None => Some(now + self.port.rules.idle),
                    Some((at, _)) if at > now => Some(at),
                    Some((_, why)) => {
                        self.end(why);
                        return true;
                    }
                }
            } else {
                self.end("first_bytes_timeout");
                return true;
            };
            if let Some(at) = next {
                // Registers the waker again on the next turn of the loop.
                self.timer.as_mut().reset(at);
            }
        }
    }

    fn end(&mut self, why: &'static str) {
        if !self.ended {
            self.ended = true;
            self.port
                .metrics
                .connection_closed(self.port.rules.port, why);
            tracing::debug!(peer = %self.peer, why, "connection closed by its deadline");
        }
    }
}

impl<IO> Drop for Guarded<IO> {
    fn drop(&mut self) {
        self.port.registry.by_peer.lock().remove(&self.peer);
        self.port.metrics.connection_dropped(self.port.rules.port);
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.ended {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before && !self.got_bytes {
                    self.got_bytes = true;
                    // From now on the connection's calls decide (first call or idle).
                    let now = Instant::now();
                    let at = match self.activity.deadline(&self.port.rules) {
                        Some((at, _)) => at.max(now),
                        None => now + self.port.rules.idle,
                    };
                    self.timer.as_mut().reset(at);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                // A call that ended since the timer was set moves the deadline (earlier, to
                // its end plus the idle timeout); an open call leaves it to be looked at again
                // when it fires.
                if self.got_bytes
                    && let Some((at, _)) = self.activity.deadline(&self.port.rules)
                    && at != self.timer.deadline()
                {
                    self.timer.as_mut().reset(at);
                }
                if self.expired(cx) {
                    // EOF: the server sees the peer gone and closes the connection.
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> tonic::transport::server::Connected
    for Guarded<IO>
{
    // The same connect info as a bare TcpStream, so `Request::remote_addr` keeps working (the
    // authentication throttle is per peer).
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local,
            remote_addr: Some(self.peer),
        }
    }
}

/// A tower layer for the gRPC server that counts each request as a call on its connection from
/// the request's start until its response body ends (a Connect stream counts while it lives).
#[derive(Debug, Clone)]
pub(crate) struct CountCallsLayer(pub Arc<CallRegistry>);

impl<S> tower::Layer<S> for CountCallsLayer {
    type Service = CountCalls<S>;

    fn layer(&self, inner: S) -> CountCalls<S> {
        CountCalls {
            inner,
            registry: self.0.clone(),
        }
    }
}

/// The service of [`CountCallsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct CountCalls<S> {
    inner: S,
    registry: Arc<CallRegistry>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for CountCalls<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: http_body::Body + Send + 'static,
{
    type Response = http::Response<Counted<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let ext = req.extensions();
        let peer = ext
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(|i| i.remote_addr())
            .or_else(|| {
                ext.get::<tonic::transport::server::TlsConnectInfo<
                    tonic::transport::server::TcpConnectInfo,
                >>()
                .and_then(|i| i.get_ref().remote_addr())
            });
        let guard = self.registry.begin(peer);
        let future = self.inner.call(req);
        Box::pin(async move {
            let response = future.await?;
            Ok(response.map(|body| Counted::new(body, guard)))
        })
    }
}

/// A response body that keeps its call counted until it ends or is dropped.
pub(crate) struct Counted<B> {
    inner: Pin<Box<B>>,
    _guard: CallGuard,
}

impl<B> Counted<B> {
    /// `body`, counted by `guard`.
    pub(crate) fn new(body: B, guard: CallGuard) -> Self {
        Counted {
            inner: Box::pin(body),
            _guard: guard,
        }
    }
}

impl<B: http_body::Body> http_body::Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throttle::Slots;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The unit of time of these tests (on tokio's paused clock).
    const TICK: Duration = Duration::from_millis(100);

    fn port(first_call: Option<Duration>) -> PortState {
        PortState {
            rules: Arc::new(PortRules {
                port: "test",
                first_bytes: 10 * TICK,
                first_call,
                idle: 30 * TICK,
            }),
            registry: Arc::new(CallRegistry::default()),
            metrics: Arc::new(Metrics::new()),
        }
    }

    fn guarded(
        state: &PortState,
    ) -> (
        Guarded<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        Arc<Slots<PeerKey>>,
    ) {
        let (server, client) = tokio::io::duplex(1024);
        let slots = Slots::new(10, 10);
        let peer: SocketAddr = "10.0.0.1:40000".parse().expect("addr");
        let slot = slots.take(PeerKey::from(peer.ip())).expect("slot");
        (
            Guarded::new(server, peer, None, slot, state.clone()),
            client,
            slots,
        )
    }

    /// Reads until EOF; returns when it came (from the start of the test's paused clock).
    async fn eof_at(mut g: Guarded<tokio::io::DuplexStream>, start: Instant) -> Duration {
        let mut buf = [0u8; 64];
        loop {
            match g.read(&mut buf).await {
                Ok(0) | Err(_) => return start.elapsed(),
                Ok(_) => {}
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_ends_at_the_first_bytes_deadline_and_frees_its_slot() {
        let state = port(None);
        let (g, _client, slots) = guarded(&state);
        assert_eq!(slots.held(), 1);
        let at = eof_at(g, Instant::now()).await;
        assert_eq!(at, 10 * TICK);
        assert_eq!(slots.held(), 0, "the slot came back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_no_call_ends_after_the_idle_timeout() {
        let state = port(None);
        let (g, mut client, _slots) = guarded(&state);
        let start = Instant::now();
        client.write_all(b"PRI").await.expect("write");
        let at = eof_at(g, start).await;
        assert_eq!(at, 30 * TICK);
    }

    #[tokio::test(start_paused = true)]
    async fn the_http_port_wants_a_first_call_soon() {
        let state = port(Some(5 * TICK));
        let (g, mut client, _slots) = guarded(&state);
        let start = Instant::now();
        client.write_all(b"GET").await.expect("write");
        assert_eq!(eof_at(g, start).await, 5 * TICK);
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_call_keeps_the_connection_and_its_end_starts_the_idle_clock() {
        let state = port(Some(5 * TICK));
        let (g, mut client, _slots) = guarded(&state);
        let start = Instant::now();
        client.write_all(b"x").await.expect("write");
        let peer = g.peer();
        let call = state.registry.begin(Some(peer));
        let reader = tokio::spawn(eof_at(g, start));
        tokio::time::sleep(100 * TICK).await;
        assert!(!reader.is_finished(), "a long call keeps its connection");
        drop(call);
        let at = reader.await.expect("reader");
        assert_eq!(at, 130 * TICK, "idle counted from the call's end");
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_call_then_silence_closes_one_idle_period_after_the_call() {
        let state = port(Some(50 * TICK));
        let (g, mut client, _slots) = guarded(&state);
        let start = Instant::now();
        client.write_all(b"GET").await.expect("write");
        let peer = g.peer();
        let reader = tokio::spawn(eof_at(g, start));
        tokio::time::sleep(TICK).await;
        drop(state.registry.begin(Some(peer)));
        // The connection task reads again after answering, as hyper does.
        client.write_all(b"x").await.expect("write");
        let at = reader.await.expect("reader");
        assert_eq!(
            at,
            31 * TICK,
            "closed at the call's end plus the idle timeout"
        );
    }

    #[tokio::test]
    async fn an_unknown_peer_counts_nothing() {
        let registry = CallRegistry::default();
        let guard = registry.begin(Some("10.9.9.9:1".parse().expect("addr")));
        assert!(guard.0.is_none());
    }
}
