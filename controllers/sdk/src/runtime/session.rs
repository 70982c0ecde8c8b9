//! The sessions of a run, as named steps, the way the manager's side reads
//! (`manager/src/grpc/connect.rs`): [`sessions`] one after another ([`connect`] → one
//! [`session`] → [`reconnect_delay`], [`outdated_wait`] or [`follow`] a ring member's redirect
//! → [`pause_unless_shutdown`]); one
//! session is [`open`] the stream with the Register → [`registered`] waits for the answer →
//! [`fenced`] starts the hold's watchdog → [`Session::serve`] runs requests, heartbeats, the
//! drain and the end.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use pb::{controller_message, manager_message};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, warn};

use super::batches::ResultBatches;
use super::fence::{self, Heartbeats, SessionState, round_ms};
use super::redirect::{Follow, Owner, Redirects, owner_uri};
use super::{Error, SessionEnd, Shared, attempt, classify, classify_status};
use crate::{
    Action, Backoff, CachedReader, Config, ConfigError, ReconcileError, Request, SessionInfo,
};

/// Sessions one after another until a shutdown (`Ok`) or a refusal that needs a human (`Err`):
/// connect and run one session, then reconnect after a backoff, wait while a newer definition
/// runs, or dial the owner a ring member named at once (see [`follow`]).
pub(super) async fn sessions<K, C, F, Fut>(
    shared: &Arc<Shared<F, C>>,
    endpoint: &Endpoint,
    shutdown: &CancellationToken,
) -> Result<(), Error>
where
    K: DeserializeOwned + Send + 'static,
    C: Send + Sync + 'static,
    F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    let mut backoff = shared.config.reconnect.clone();
    let mut redirects = Redirects::default();
    loop {
        let started = Instant::now();
        let target = redirects.target().cloned();
        let end = connect::<K, C, F, Fut>(shared, endpoint, target.as_ref(), shutdown).await;
        if !matches!(end, SessionEnd::Redirect { .. }) {
            redirects.back_to_configured();
        }
        let pause = match end {
            SessionEnd::Stopped => return Ok(()),
            SessionEnd::Fatal(err) => {
                shared.health.not_ready(format!("giving up: {err}"));
                return Err(err);
            }
            SessionEnd::Retry { reason, registered } => {
                reconnect_delay(shared, &mut backoff, started.elapsed(), &reason, registered)
            }
            SessionEnd::Outdated { reason } => {
                backoff.reset();
                outdated_wait(shared, &reason)
            }
            SessionEnd::Redirect { owner, registered } => {
                match follow(shared, &mut redirects, &mut backoff, owner, registered) {
                    Some(reason) => {
                        reconnect_delay(shared, &mut backoff, started.elapsed(), &reason, false)
                    }
                    None => continue,
                }
            }
        };
        if !pause_unless_shutdown(&shared.name, pause, shutdown).await {
            return Ok(());
        }
    }
}

/// Dials a new connection (to the configured `endpoint`, or to the `owner` a ring member
/// named) and runs one session on it. A new connection for every session: a Kubernetes Service
/// picks the backend per TCP connection, so re-opening the stream on the old one would keep
/// asking a manager that stepped down (and answers UNAVAILABLE) instead of reaching the new
/// leader. Cached reads ride the session's channel, so they reach the member it registered
/// with.
async fn connect<K, C, F, Fut>(
    shared: &Arc<Shared<F, C>>,
    endpoint: &Endpoint,
    owner: Option<&Owner>,
    shutdown: &CancellationToken,
) -> SessionEnd
where
    K: DeserializeOwned + Send + 'static,
    C: Send + Sync + 'static,
    F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    let config = &shared.config;
    let dialled = match owner {
        None => dial(endpoint, config, None),
        Some(owner) => dial_owner(config, owner),
    };
    let addr = owner.map_or(config.addr.as_str(), |o| o.addr.as_str());
    match dialled {
        Ok(channel) => {
            let client = ControllerManagerClient::new(channel);
            session::<K, C, F, Fut>(shared, client, addr, shutdown).await
        }
        // Certificates may not be mounted yet, or be mid-rotation (or a redirect named an
        // address that is not one): retry with backoff, through the configured address.
        Err(e) => SessionEnd::Retry {
            reason: e.to_string(),
            registered: false,
        },
    }
}

/// After a session that ended with a redirect to `owner`: `None` to dial it at once (no
/// backoff, and not a failure: a redirect that followed a `Registered` resets the backoff as
/// any registered session does), or, for the redirect after [`MAX_REDIRECTS`] in a row, the
/// reason to reconnect through the configured address with the normal backoff.
///
/// [`MAX_REDIRECTS`]: super::redirect::MAX_REDIRECTS
fn follow<F, C>(
    shared: &Shared<F, C>,
    redirects: &mut Redirects,
    backoff: &mut Backoff,
    owner: Owner,
    registered: bool,
) -> Option<String> {
    let name = shared.name.as_str();
    let Owner { identity, addr } = owner.clone();
    match redirects.redirected(owner, registered) {
        Follow::Dial(in_a_row) => {
            if registered {
                backoff.reset();
            }
            info!(controller = %name, owner = %identity, addr = %addr, in_a_row, "redirected: {identity} owns this controller; dialling it at {addr}");
            shared
                .health
                .not_ready(format!("redirected to the owner {identity} at {addr}"));
            None
        }
        Follow::TooMany => Some(format!(
            "redirected {} times in a row without registering (the last to {identity} at \
             {addr}): the ring members' views may differ for a moment; going back to {}",
            super::redirect::MAX_REDIRECTS + 1,
            shared.config.addr
        )),
    }
}

/// After a session that ended with `reason`: how long to wait before reconnecting, said in the
/// health reason and the log. A session that registered resets the backoff however short it
/// was (two leader changes in a rolling update of the manager are two first steps).
fn reconnect_delay<F, C>(
    shared: &Shared<F, C>,
    backoff: &mut Backoff,
    lasted: Duration,
    reason: &str,
    registered: bool,
) -> Duration {
    let delay = backoff.next_delay(lasted, registered, &mut rand::rng());
    let delay_ms = u64::try_from(round_ms(delay).as_millis()).unwrap_or(u64::MAX);
    let wait = humantime::format_duration(round_ms(delay));
    shared
        .health
        .not_ready(format!("reconnecting to the manager in {wait}: {reason}"));
    // A manager that shuts down, or a standby, is the normal course of a rollout.
    if registered || backoff.failures() < 3 {
        info!(controller = %shared.name, failures = backoff.failures(), delay_ms, "session ended: {reason}; reconnecting in {wait}");
    } else {
        warn!(controller = %shared.name, failures = backoff.failures(), delay_ms, "session ended: {reason}; reconnecting in {wait}");
    }
    delay
}

/// While a newer (or conflicting) definition runs: [`Config::outdated_wait`](crate::Config::outdated_wait)
/// before registering again, said in the health reason and the log.
fn outdated_wait<F, C>(shared: &Shared<F, C>, reason: &str) -> Duration {
    let wait = shared.config.outdated_wait;
    let said = humantime::format_duration(wait);
    shared.health.not_ready(format!(
        "waiting as outdated: {reason}; registering again in {said}"
    ));
    warn!(
        controller = %shared.name,
        revision = shared.register.revision,
        "{reason}; this replica takes no work and registers again in {said} (a rollout \
         replaces it meanwhile, or the newer definition's replicas go away)"
    );
    wait
}

/// Sleeps `pause`; false when a shutdown came first.
async fn pause_unless_shutdown(name: &str, pause: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => {
            info!(controller = %name, "shutdown requested while disconnected");
            false
        }
        _ = tokio::time::sleep(pause) => true,
    }
}

/// The manager's endpoint with this SDK's connection settings.
pub(super) fn endpoint(config: &Config) -> Result<Endpoint, ConfigError> {
    endpoint_at(config, config.uri(), &config.addr)
}

/// The endpoint at `uri` (from `addr`) with this SDK's connection settings.
fn endpoint_at(config: &Config, uri: String, addr: &str) -> Result<Endpoint, ConfigError> {
    let endpoint = Endpoint::from_shared(uri).map_err(|e| ConfigError::InvalidAddr {
        addr: addr.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(endpoint
        .connect_timeout(config.connect_timeout)
        .http2_keep_alive_interval(config.keepalive_interval)
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true))
}

/// A lazily connecting channel to the manager, with TLS read from its files now; its
/// certificate must name `server_name` when given (else the configured name or the host).
fn dial(endpoint: &Endpoint, config: &Config, server_name: Option<&str>) -> Result<Channel, Error> {
    let endpoint = match config.client_tls()? {
        Some(tls) => {
            let tls = match server_name {
                Some(name) => tls.domain_name(name),
                None => tls,
            };
            endpoint
                .clone()
                .tls_config(tls)
                .map_err(|e| ConfigError::InvalidTls(e.to_string()))?
        }
        None => endpoint.clone(),
    };
    Ok(endpoint.connect_lazy())
}

/// A new channel to the `owner` a ring member named: the configured scheme, connection
/// settings, credentials and TLS files, with the owner's host as the TLS server name.
fn dial_owner(config: &Config, owner: &Owner) -> Result<Channel, Error> {
    let (uri, host) = owner_uri(config, &owner.addr)?;
    dial(&endpoint_at(config, uri, &owner.addr)?, config, Some(&host))
}

/// One session, in order: open the stream with the Register → wait until registered → start
/// the fence (heartbeats, the hold watchdog) → serve requests until the session ends.
async fn session<K, C, F, Fut>(
    shared: &Arc<Shared<F, C>>,
    mut client: ControllerManagerClient<Channel>,
    addr: &str,
    shutdown: &CancellationToken,
) -> SessionEnd
where
    K: DeserializeOwned + Send + 'static,
    C: Send + Sync + 'static,
    F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    if shutdown.is_cancelled() {
        return SessionEnd::Stopped;
    }
    let batches = Arc::new(AtomicBool::new(false));
    let (tx, mut inbound) = match open(shared, &mut client, addr, &batches, shutdown).await {
        Ok(opened) => opened,
        Err(end) => return end,
    };
    let info = match registered(shared, &mut inbound, shutdown).await {
        Ok(info) => info,
        Err(end) => return end,
    };
    // An older manager does not echo max_batch, and would refuse a ResultBatch.
    let takes_batches = info.effective.as_ref().is_some_and(|e| e.max_batch > 1);
    batches.store(takes_batches, Ordering::Release);
    let state = fenced(shared, &info);
    // However this function ends (also when its future is dropped), every handler of the
    // session is cancelled and no result is sent on it any more.
    let _end = EndOnDrop(state.clone());
    let mut session = Session::<K, F, C> {
        shared,
        reader: CachedReader::new(client, shared.config.clone(), info.session_id.clone()),
        beats: Heartbeats::new(state.clone(), info.heartbeat_interval),
        state,
        tx,
        waiting: Vec::new(),
        drain: None,
        _primary: PhantomData,
    };
    session.serve(&mut inbound, shutdown).await
}

/// The session's fence state, with the watchdog that stops the process if a reconcile of it
/// outlives the hold.
fn fenced<F, C>(shared: &Shared<F, C>, info: &SessionInfo) -> Arc<SessionState> {
    let state = Arc::new(SessionState::new(
        info.session_id.clone(),
        shared.name.clone(),
        info.hold,
    ));
    fence::watch(state.clone());
    state
}

/// Ends the session when dropped.
struct EndOnDrop(Arc<SessionState>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end();
    }
}

type Outbound = mpsc::Sender<pb::ControllerMessage>;

fn message(m: controller_message::Message) -> pb::ControllerMessage {
    pb::ControllerMessage { message: Some(m) }
}

/// Opens the Connect stream (to the manager at `addr`) with the Register as its first message.
async fn open<F, C>(
    shared: &Shared<F, C>,
    client: &mut ControllerManagerClient<Channel>,
    addr: &str,
    batches: &Arc<AtomicBool>,
    shutdown: &CancellationToken,
) -> Result<(Outbound, Streaming<pb::ManagerMessage>), SessionEnd> {
    let retry = |reason: String| SessionEnd::Retry {
        reason,
        registered: false,
    };
    let capacity = shared.register.max_in_flight.max(1) as usize * 2 + 8;
    let (tx, rx) = mpsc::channel::<pb::ControllerMessage>(capacity);
    let register = controller_message::Message::Register(Box::new(shared.register.clone()));
    if tx.send(message(register)).await.is_err() {
        return Err(retry("outbound stream closed".into()));
    }
    let mut request = tonic::Request::new(ResultBatches::new(rx, batches.clone()));
    let auth = shared
        .config
        .authorization()
        .map_err(|e| retry(e.to_string()))?;
    request.metadata_mut().insert("authorization", auth);
    info!(controller = %shared.name, addr = %addr, "connecting to manager");
    let response = tokio::select! {
        _ = shutdown.cancelled() => return Err(SessionEnd::Stopped),
        r = client.connect(request) => r,
    };
    match response {
        Ok(r) => Ok((tx, r.into_inner())),
        Err(status) => Err(classify_status(&status, false)),
    }
}

/// Waits for `Registered`; logs it (with the readable kinds) and tells `on_registered`.
async fn registered<F, C>(
    shared: &Shared<F, C>,
    inbound: &mut Streaming<pb::ManagerMessage>,
    shutdown: &CancellationToken,
) -> Result<SessionInfo, SessionEnd> {
    let name = shared.name.as_str();
    let retry = |reason: String| SessionEnd::Retry {
        reason,
        registered: false,
    };
    let first = tokio::select! {
        _ = shutdown.cancelled() => return Err(SessionEnd::Stopped),
        m = inbound.message() => m,
    };
    let registered = match first.map(|m| m.and_then(|m| m.message)) {
        Ok(Some(manager_message::Message::Registered(r))) => *r,
        Ok(Some(manager_message::Message::Rejected(rej))) => {
            let end = classify(&rej, false);
            log_refusal(name, &rej, &end);
            return Err(end);
        }
        Ok(Some(other)) => return Err(retry(format!("expected Registered, got {other:?}"))),
        Ok(None) => return Err(retry("stream ended before Registered".into())),
        Err(status) => return Err(classify_status(&status, false)),
    };
    let member = registered.member_identity.clone();
    let info = SessionInfo::new(registered, shared.register.revision);
    info!(
        controller = %name,
        session_id = %info.session_id,
        leader = %info.leader_identity,
        member = %member,
        revision = info.revision,
        readable = %info.readable_summary(),
        "registered with manager"
    );
    debug!(controller = %name, effective = ?info.effective, hold = ?info.hold, "effective registration");
    shared.health.ready();
    if let Some(callback) = &shared.on_registered {
        (callback.0)(&info);
    }
    Ok(info)
}

/// Logs a `Rejected`: as a rejection only when a human must act; a refusal that is retried
/// (UNAVAILABLE from a manager shutting down or a standby, RESOURCE_EXHAUSTED, ...) is said
/// once more by the reconnect line, and an outdated definition by its wait line.
fn log_refusal(name: &str, rej: &pb::Rejected, end: &SessionEnd) {
    let code = tonic::Code::from_i32(rej.code);
    match end {
        SessionEnd::Fatal(_) => {
            warn!(controller = %name, ?code, field = %rej.field, "registration rejected: {}", rej.message);
        }
        _ => {
            debug!(controller = %name, ?code, field = %rej.field, outdated = rej.outdated, "the manager did not take the session ({code:?}): {}", rej.message);
        }
    }
}

/// A session in progress.
struct Session<'a, K, F, C> {
    shared: &'a Arc<Shared<F, C>>,
    state: Arc<SessionState>,
    tx: Outbound,
    reader: CachedReader,
    beats: Heartbeats,
    /// Requests received before the first heartbeat answer: they start once the anchor is
    /// fresh.
    waiting: Vec<pb::ReconcileRequest>,
    drain: Option<Draining>,
    _primary: PhantomData<fn() -> K>,
}

/// A shutdown in progress.
struct Draining {
    /// When the Drain was sent.
    since: Instant,
    /// Once every request was answered: when to stop waiting for the manager to close.
    close_by: Option<Instant>,
}

/// What one turn of the session decided.
enum Step {
    Continue,
    End(SessionEnd),
}

impl<K, F, C, Fut> Session<'_, K, F, C>
where
    K: DeserializeOwned + Send + 'static,
    C: Send + Sync + 'static,
    F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    /// Serves the session until it ends.
    async fn serve(
        &mut self,
        inbound: &mut Streaming<pb::ManagerMessage>,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        let mut ticker = self.beats.interval().map(|every| {
            let mut t = tokio::time::interval(every);
            t.set_missed_tick_behavior(MissedTickBehavior::Delay);
            t
        });
        loop {
            let silence = self.beats.silence_deadline().map(Instant::from_std);
            let answered = self.drain.as_ref().is_some_and(|d| d.close_by.is_none());
            let step = tokio::select! {
                _ = shutdown.cancelled(), if self.drain.is_none() => self.start_drain().await,
                _ = tick(&mut ticker) => self.heartbeat(),
                () = sleep_until(silence) => self.silent(),
                () = self.state.all_answered(), if answered => self.all_answered(),
                () = sleep_until(self.drain_deadline()) => self.drain_over(),
                msg = inbound.message() => self.on_message(msg),
            };
            if let Step::End(end) = step {
                return end;
            }
        }
    }

    /// Shutdown: Drain, and let in-flight reconciles finish.
    async fn start_drain(&mut self) -> Step {
        let in_flight = self.state.in_flight_count();
        info!(controller = %self.shared.name, in_flight, "shutdown requested: draining session");
        self.shared
            .health
            .not_ready("draining: shutdown requested, finishing the reconciles in flight");
        self.drain = Some(Draining {
            since: Instant::now(),
            close_by: None,
        });
        let drain = message(controller_message::Message::Drain(pb::Drain::default()));
        if self.tx.send(drain).await.is_err() {
            return Step::End(SessionEnd::Stopped);
        }
        Step::Continue
    }

    /// Every request of a draining session is answered: the manager should close soon.
    fn all_answered(&mut self) -> Step {
        if let Some(drain) = &mut self.drain {
            drain.close_by = Some(Instant::now() + self.shared.config.drain_grace);
        }
        Step::Continue
    }

    /// When a draining session stops waiting: for the manager to close after the last answer,
    /// or for its reconciles at the end of the shutdown grace.
    fn drain_deadline(&self) -> Option<Instant> {
        let drain = self.drain.as_ref()?;
        let grace_over = drain.since + self.shared.config.shutdown_grace;
        Some(drain.close_by.map_or(grace_over, |at| at.min(grace_over)))
    }

    fn drain_over(&mut self) -> Step {
        let config = &self.shared.config;
        let running = self.state.running_count();
        if running > 0 {
            warn!(controller = %self.shared.name, running, "the shutdown grace of {} is over: cancelling the reconciles that still run", humantime::format_duration(config.shutdown_grace));
        } else {
            warn!(controller = %self.shared.name, "the manager did not close the drained session within {}; ending it", humantime::format_duration(config.drain_grace));
        }
        Step::End(SessionEnd::Stopped)
    }

    /// Sends the next heartbeat, unless the stream is backed up (then this one is skipped).
    fn heartbeat(&mut self) -> Step {
        match self.tx.try_send(self.beats.beat()) {
            Err(mpsc::error::TrySendError::Closed(_)) => Step::End(SessionEnd::Retry {
                reason: "outbound stream closed".into(),
                registered: true,
            }),
            Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => Step::Continue,
        }
    }

    /// No heartbeat answered for half the hold: the manager may be gone or cut off.
    fn silent(&mut self) -> Step {
        let hold = self.state.hold().unwrap_or_default();
        let reason = format!(
            "the manager answered no heartbeat for {} (half the hold of {}): it may be gone or cut off; cancelling this session's reconciles",
            humantime::format_duration(round_ms(hold / 2)),
            humantime::format_duration(hold)
        );
        warn!(controller = %self.shared.name, session_id = %self.state.id, running = self.state.running_count(), "{reason}");
        self.ended(SessionEnd::Retry {
            reason,
            registered: true,
        })
    }

    /// One message from the manager (or the stream's end).
    fn on_message(&mut self, msg: Result<Option<pb::ManagerMessage>, tonic::Status>) -> Step {
        let name = self.shared.name.as_str();
        let m = match msg {
            Ok(Some(pb::ManagerMessage { message: Some(m) })) => m,
            Ok(Some(pb::ManagerMessage { message: None })) => {
                debug!(controller = %name, "ignoring a manager message of an unknown kind");
                return Step::Continue;
            }
            Ok(None) if self.drain.is_some() => {
                debug!(controller = %name, "the manager closed the drained session");
                return Step::End(SessionEnd::Stopped);
            }
            Ok(None) => {
                return self.ended(SessionEnd::Retry {
                    reason: "manager closed the stream".into(),
                    registered: true,
                });
            }
            Err(status) => {
                // The reconnect line says why, at the level it deserves.
                debug!(controller = %name, code = ?status.code(), "stream ended: {}", status.message());
                return self.ended(classify_status(&status, true));
            }
        };
        match m {
            manager_message::Message::Reconcile(req) => self.request(req),
            manager_message::Message::Batch(batch) => {
                for req in batch.requests {
                    self.request(req);
                }
                if !batch.events.is_empty() {
                    warn!(controller = %name, count = batch.events.len(), "ignoring Events on a reconcile-mode session");
                }
                Step::Continue
            }
            manager_message::Message::Heartbeat(beat) => self.answered(beat.nonce),
            manager_message::Message::Revoked(rev) => self.revoked(rev),
            manager_message::Message::Rejected(rej) => {
                let end = classify(&rej, true);
                log_refusal(name, &rej, &end);
                self.ended(end)
            }
            manager_message::Message::Registered(_) => {
                warn!(controller = %name, "ignoring a second Registered");
                Step::Continue
            }
            manager_message::Message::Event(ev) => {
                warn!(controller = %name, id = %ev.id, "ignoring an Event on a reconcile-mode session");
                Step::Continue
            }
        }
    }

    /// A request: started at once, or once the first heartbeat is answered.
    fn request(&mut self, req: pb::ReconcileRequest) -> Step {
        if self.beats.anchored() {
            attempt::spawn::<K, C, F, Fut>(self.shared, &self.state, &self.reader, &self.tx, req);
        } else {
            self.waiting.push(req);
        }
        Step::Continue
    }

    /// A heartbeat answer: the anchor moves; requests waiting for one start.
    fn answered(&mut self, nonce: u64) -> Step {
        self.beats.answered(nonce);
        if self.beats.anchored() {
            for req in std::mem::take(&mut self.waiting) {
                attempt::spawn::<K, C, F, Fut>(
                    self.shared,
                    &self.state,
                    &self.reader,
                    &self.tx,
                    req,
                );
            }
        }
        Step::Continue
    }

    /// The manager ended the session. `UNIT_MOVED` with the new owner's address is a redirect;
    /// without one (not yet known) a retry through the configured address.
    fn revoked(&mut self, rev: pb::Revoked) -> Step {
        let reason = pb::revoked::Reason::try_from(rev.reason).unwrap_or_default();
        let code = tonic::Code::from_i32(rev.code);
        // A manager shutting down or stepping down revokes sessions in the normal course of a
        // rollout; the reconnect line follows.
        info!(controller = %self.shared.name, ?reason, ?code, leader = %rev.leader_identity, owner_address = %rev.owner_address, "session revoked by the manager: {}", rev.message);
        let end = if let Some(owner) = Owner::from_revoked(&rev) {
            SessionEnd::Redirect {
                owner,
                registered: true,
            }
        } else if reason == pb::revoked::Reason::Superseded {
            SessionEnd::Outdated {
                reason: format!(
                    "a newer definition of this controller replaced this one (revision {}): {}",
                    self.shared.register.revision, rev.message
                ),
            }
        } else {
            SessionEnd::Retry {
                reason: format!("revoked ({reason:?}): {}", rev.message),
                registered: true,
            }
        };
        self.ended(end)
    }

    /// The session ends with `end`; while draining, that completes the shutdown.
    fn ended(&self, end: SessionEnd) -> Step {
        if self.drain.is_some() && !matches!(end, SessionEnd::Fatal(_)) {
            return Step::End(SessionEnd::Stopped);
        }
        Step::End(end)
    }
}

/// The next tick, or never without a ticker.
async fn tick(ticker: &mut Option<Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`, or for ever when there is none.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
