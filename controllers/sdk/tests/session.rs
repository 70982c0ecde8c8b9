//! The SDK against an in-process fake manager that each test scripts message by message:
//! reconnecting after a standby's UNAVAILABLE, results (late ones too, once the handler has
//! stopped), heartbeats and the anchor, the silence that ends a session, requests held until
//! the first heartbeat answer, one attempt of a key at a time, empty tombstones, SUPERSEDED and
//! outdated registrations, the refusals that need a human, and ring mode's redirects between
//! two or more fake members (at most 3 in a row; over TLS too). The same points but the
//! redirects are tested against the real manager in `tests/protocol.rs`.
#![allow(clippy::unwrap_used)]

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_server::{ControllerManager, ControllerManagerServer};
use ctrlhub_sdk::{
    Action, CancellationToken, Config, Controller, ReconcileError, Request, SessionInfo,
};
use futures::Stream;
use k8s_openapi::api::core::v1::ConfigMap;
use pb::{controller_message, manager_message};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

type Out = Pin<Box<dyn Stream<Item = Result<pb::ManagerMessage, Status>> + Send>>;
type Reply = mpsc::Sender<Result<pb::ManagerMessage, Status>>;

/// Generous: nothing here should take more than a fraction of it.
const PATIENCE: Duration = Duration::from_secs(10);

/// One accepted Connect, handed to the test to play the manager's side.
struct Conn {
    from: Streaming<pb::ControllerMessage>,
    to: Reply,
}

impl Conn {
    /// The next message the controller sends (panics after [`PATIENCE`]).
    async fn next(&mut self) -> controller_message::Message {
        let m = tokio::time::timeout(PATIENCE, self.from.message())
            .await
            .expect("the controller sent nothing in time")
            .expect("stream error")
            .expect("the controller closed the stream");
        m.message.expect("an empty message")
    }

    /// The next message that is not a heartbeat; heartbeats are echoed on the way when `echo`.
    async fn next_not_heartbeat(&mut self, echo: bool) -> controller_message::Message {
        loop {
            match self.next().await {
                controller_message::Message::Heartbeat(beat) if echo => {
                    self.send(manager_message::Message::Heartbeat(beat)).await;
                }
                controller_message::Message::Heartbeat(_) => {}
                other => return other,
            }
        }
    }

    async fn send(&self, m: manager_message::Message) {
        let _ = self
            .to
            .send(Ok(pb::ManagerMessage { message: Some(m) }))
            .await;
    }

    /// Reads the Register and answers Registered (with a hold when `hold` is set).
    async fn register(&mut self, session: &str, hold: Option<Duration>) -> pb::Register {
        let controller_message::Message::Register(r) = self.next().await else {
            panic!("expected Register first");
        };
        let duration = |d: Duration| prost_types::Duration::try_from(d).unwrap();
        self.send(manager_message::Message::Registered(Box::new(
            pb::Registered {
                session_id: session.into(),
                leader_identity: "mgr-0".into(),
                heartbeat_interval: hold.map(|h| duration(h / 5)),
                hold: hold.map(duration),
                ..Default::default()
            },
        )))
        .await;
        *r
    }
}

struct Fake {
    /// Which fake member this is, in [`Seen`].
    name: &'static str,
    connects: AtomicUsize,
    refuse_first: bool,
    /// Ring mode: answer every Register with a redirect to this member instead of handing the
    /// connect to the test.
    redirect_to: Option<Redirect>,
    seen: Arc<Seen>,
    conns: mpsc::UnboundedSender<Conn>,
}

/// A ring member's redirect to the owner.
#[derive(Clone)]
struct Redirect {
    identity: String,
    /// `host:port`.
    addr: String,
    /// Only the status's trailers name the owner (no `Rejected` first).
    trailers_only: bool,
}

impl Redirect {
    fn to(identity: &str, url: &str) -> Self {
        Self {
            identity: identity.into(),
            addr: host_port(url),
            trailers_only: false,
        }
    }

    /// UNAVAILABLE with the owner in its trailers, as a member that does not own the
    /// controller ends the stream.
    fn status(&self) -> Status {
        let mut status = Status::unavailable(format!("{} owns controller test", self.identity));
        let md = status.metadata_mut();
        md.insert("ctrlhub-leader", self.identity.parse().unwrap());
        md.insert("ctrlhub-owner", self.identity.parse().unwrap());
        md.insert("ctrlhub-owner-addr", self.addr.parse().unwrap());
        status
    }

    /// What the member sends: `Rejected(UNAVAILABLE)` naming the owner, then the status.
    async fn answer(&self, to: &Reply) {
        if !self.trailers_only {
            let rejected = manager_message::Message::Rejected(pb::Rejected {
                code: tonic::Code::Unavailable as i32,
                message: format!("{} owns controller test", self.identity),
                owner_identity: self.identity.clone(),
                owner_address: self.addr.clone(),
                ..Default::default()
            });
            let _ = to
                .send(Ok(pb::ManagerMessage {
                    message: Some(rejected),
                }))
                .await;
        }
        let _ = to.send(Err(self.status())).await;
    }
}

/// `host:port` of a fake's `http://host:port`: the form a redirect names.
fn host_port(url: &str) -> String {
    url.trim_start_matches("http://").to_owned()
}

/// What every fake member of one test saw, in order: each Connect (its first message is the
/// Register) and each cached Get, by member.
#[derive(Default)]
struct Seen {
    connects: Mutex<Vec<(&'static str, Instant)>>,
    gets: Mutex<Vec<&'static str>>,
}

impl Seen {
    fn connects(&self) -> Vec<(&'static str, Instant)> {
        self.connects.lock().unwrap().clone()
    }

    fn connects_to(&self, member: &str) -> Vec<Instant> {
        let connects = self.connects();
        connects
            .iter()
            .filter(|(m, _)| *m == member)
            .map(|(_, at)| *at)
            .collect()
    }

    fn gets_from(&self, member: &str) -> usize {
        self.gets
            .lock()
            .unwrap()
            .iter()
            .filter(|m| **m == member)
            .count()
    }
}

#[tonic::async_trait]
impl ControllerManager for Fake {
    type ConnectStream = Out;

    async fn connect(
        &self,
        req: tonic::Request<Streaming<pb::ControllerMessage>>,
    ) -> Result<tonic::Response<Out>, Status> {
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        assert_eq!(auth, Some("Bearer s3cret"));
        self.seen
            .connects
            .lock()
            .unwrap()
            .push((self.name, Instant::now()));
        if self.connects.fetch_add(1, Ordering::SeqCst) == 0 && self.refuse_first {
            return Err(Status::unavailable("standby; the leader is mgr-1"));
        }
        if let Some(redirect) = &self.redirect_to {
            return Ok(tonic::Response::new(
                self.redirect(redirect, req.into_inner()).await,
            ));
        }
        let (to, rx) = mpsc::channel(64);
        let _ = self.conns.send(Conn {
            from: req.into_inner(),
            to,
        });
        Ok(tonic::Response::new(
            Box::pin(ReceiverStream::new(rx)) as Out
        ))
    }

    async fn get(
        &self,
        _: tonic::Request<pb::GetRequest>,
    ) -> Result<tonic::Response<pb::GetResponse>, Status> {
        self.seen.gets.lock().unwrap().push(self.name);
        Err(Status::not_found("nothing cached"))
    }

    async fn list(
        &self,
        _: tonic::Request<pb::ListRequest>,
    ) -> Result<tonic::Response<pb::ListResponse>, Status> {
        Err(Status::unimplemented("list"))
    }
}

impl Fake {
    /// Reads the Register (the stream's first message) and answers with `redirect`; the rest
    /// of what the controller sends is read until it closes.
    async fn redirect(
        &self,
        redirect: &Redirect,
        mut from: Streaming<pb::ControllerMessage>,
    ) -> Out {
        let first = tokio::time::timeout(PATIENCE, from.message()).await;
        assert!(
            matches!(
                first,
                Ok(Ok(Some(pb::ControllerMessage {
                    message: Some(controller_message::Message::Register(_))
                })))
            ),
            "expected a Register first, got {first:?}"
        );
        tokio::spawn(async move { while let Ok(Some(_)) = from.message().await {} });
        let (to, rx) = mpsc::channel(4);
        redirect.answer(&to).await;
        Box::pin(ReceiverStream::new(rx))
    }
}

/// The fake manager's address and the connects it accepts.
async fn serve(refuse_first: bool) -> (String, mpsc::UnboundedReceiver<Conn>) {
    let member = Member::bind("mgr-0");
    let addr = member.url.clone();
    let conns = member.serve(Arc::default(), refuse_first, None);
    (addr, conns)
}

/// A fake ring member whose port is bound, so that others can redirect to it before it serves.
struct Member {
    name: &'static str,
    url: String,
    incoming: tonic::transport::server::TcpIncoming,
    tls: Option<tonic::transport::ServerTlsConfig>,
}

impl Member {
    fn bind(name: &'static str) -> Self {
        let incoming =
            tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let url = format!("http://{}", incoming.local_addr().unwrap());
        Self {
            name,
            url,
            incoming,
            tls: None,
        }
    }

    /// Serves TLS with `cert`.
    fn with_tls(self, cert: &Cert) -> Self {
        let identity = tonic::transport::Identity::from_pem(&cert.pem, &cert.key);
        Self {
            tls: Some(tonic::transport::ServerTlsConfig::new().identity(identity)),
            ..self
        }
    }

    fn port(&self) -> u16 {
        self.incoming.local_addr().unwrap().port()
    }

    /// Serves: hands each connect to the test, or answers it with `redirect_to`.
    fn serve(
        self,
        seen: Arc<Seen>,
        refuse_first: bool,
        redirect_to: Option<Redirect>,
    ) -> mpsc::UnboundedReceiver<Conn> {
        let (conns, rx) = mpsc::unbounded_channel();
        let fake = Fake {
            name: self.name,
            connects: AtomicUsize::new(0),
            refuse_first,
            redirect_to,
            seen,
            conns,
        };
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = self.tls {
            server = server.tls_config(tls).unwrap();
        }
        tokio::spawn(
            server
                .add_service(ControllerManagerServer::new(fake))
                .serve_with_incoming(self.incoming),
        );
        rx
    }
}

/// A serving certificate and its key, PEM.
struct Cert {
    pem: String,
    key: String,
}

/// A CA (PEM) and, signed by it, a serving certificate for each name of `names`.
fn certificates(names: &[&str]) -> (String, Vec<Cert>) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let certs = names
        .iter()
        .map(|name| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(vec![(*name).to_owned()])
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            Cert {
                pem: cert.pem(),
                key: key.serialize_pem(),
            }
        })
        .collect();
    (ca.pem(), certs)
}

async fn next_conn(conns: &mut mpsc::UnboundedReceiver<Conn>) -> Conn {
    tokio::time::timeout(PATIENCE, conns.recv())
        .await
        .expect("no connect in time")
        .expect("the fake stopped")
}

fn request(id: &str, name: &str, deadline_in: Duration) -> pb::ReconcileRequest {
    let since = (SystemTime::now() + deadline_in)
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    pb::ReconcileRequest {
        id: id.into(),
        key: Some(pb::ObjectKey {
            namespace: "ns".into(),
            name: name.into(),
        }),
        attempt: 1,
        reasons: vec![pb::reconcile_request::Reason::Created as i32],
        object: None,
        deadline: Some(prost_types::Timestamp {
            seconds: since.as_secs() as i64,
            nanos: since.subsec_nanos() as i32,
        }),
        traceparent: String::new(),
        tracestate: String::new(),
    }
}

fn reconcile_msg(req: pb::ReconcileRequest) -> manager_message::Message {
    manager_message::Message::Reconcile(req)
}

/// What the handlers saw: (key name, event, when).
#[derive(Default)]
struct Probe {
    events: Mutex<Vec<(String, &'static str, Instant)>>,
    sessions: Mutex<Vec<SessionInfo>>,
}

impl Probe {
    fn note(&self, name: &str, event: &'static str) {
        self.events
            .lock()
            .unwrap()
            .push((name.to_owned(), event, Instant::now()));
    }

    fn when(&self, name: &str, event: &str) -> Vec<Instant> {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter(|(n, e, _)| n == name && *e == event)
            .map(|(_, _, at)| *at)
            .collect()
    }
}

/// Notes `stopped` for its key when dropped: a handler that never returns stops only when it is
/// cancelled.
struct NoteOnDrop(Arc<Probe>, String);

impl Drop for NoteOnDrop {
    fn drop(&mut self) {
        self.0.note(&self.1, "stopped");
    }
}

/// Handlers by key name: `slow` never finishes (only cancellation ends it), `block` blocks for
/// 600 ms in `ctrlhub_sdk::blocking` whatever its cancellation says, `gone` answers done
/// exactly when the request says the object was deleted, anything else requeues after 5 s.
async fn reconcile(req: Request<ConfigMap>, probe: Arc<Probe>) -> Result<Action, ReconcileError> {
    let name = req.name().to_owned();
    probe.note(&name, "start");
    match name.as_str() {
        "slow" => {
            let _stopped = NoteOnDrop(probe.clone(), name.clone());
            std::future::pending::<()>().await
        }
        "block" => {
            ctrlhub_sdk::blocking(|| std::thread::sleep(Duration::from_millis(600))).await?;
            probe.note(&name, "unblocked");
        }
        "gone" if req.is_deleted() && req.object.is_none() => return Ok(Action::done()),
        "gone" => return Err(ReconcileError::retry("expected a deletion")),
        _ => {}
    }
    // A cached read through the session: not found maps to None.
    let cached = req.reader().get::<ConfigMap>("ns", req.name()).await?;
    assert!(cached.is_none());
    Ok(Action::requeue_after(Duration::from_secs(5)))
}

/// Runs the controller against `addr` with `config` tweaks; returns its probe and task.
fn start(
    addr: String,
    shutdown: &CancellationToken,
    tweak: impl FnOnce(&mut Config),
) -> (Arc<Probe>, JoinHandle<Result<(), ctrlhub_sdk::Error>>) {
    let probe = Arc::new(Probe::default());
    let mut config = Config::new(addr, "s3cret");
    config.reconnect = ctrlhub_sdk::Backoff::new(
        Duration::from_millis(20),
        Duration::from_millis(100),
        Duration::from_secs(30),
    );
    tweak(&mut config);
    let sessions = probe.clone();
    let run = tokio::spawn(
        Controller::new("test")
            .reconciles::<ConfigMap>()
            .max_concurrent_reconciles(2)
            .on_registered(move |info| sessions.sessions.lock().unwrap().push(info.clone()))
            .run(config, reconcile, probe.clone(), shutdown.clone()),
    );
    (probe, run)
}

fn result_of(m: controller_message::Message) -> pb::ReconcileResult {
    let controller_message::Message::Result(r) = m else {
        panic!("expected a Result, got {m:?}");
    };
    r
}

#[tokio::test]
async fn reconnects_registers_answers_late_results_and_drains() {
    let (addr, mut conns) = serve(true).await;
    let shutdown = CancellationToken::new();
    let (probe, run) = start(addr, &shutdown, |_| {});
    let mut conn = next_conn(&mut conns).await;
    let r = conn.register("s-1", None).await;
    assert_eq!(r.controller_name, "test");
    assert_eq!(r.max_in_flight, 2);
    assert!(r.exclusive_attempts, "the SDK keeps exclusive attempts");
    let slow_deadline = SystemTime::now() + Duration::from_millis(400);
    conn.send(reconcile_msg(request(
        "r-slow",
        "slow",
        Duration::from_millis(400),
    )))
    .await;
    conn.send(reconcile_msg(request("r-1", "a", PATIENCE)))
        .await;

    let result = result_of(conn.next().await);
    assert_eq!(result.id, "r-1");
    assert!(matches!(
        result.outcome,
        Some(pb::reconcile_result::Outcome::RequeueAfter(_))
    ));
    // The slow reconcile is cancelled a little before its deadline; once it has stopped its
    // result goes out (the manager keeps the key until then), as an error.
    let late = result_of(conn.next().await);
    assert_eq!(late.id, "r-slow");
    assert!(
        matches!(late.outcome, Some(pb::reconcile_result::Outcome::Error(ref e)) if e.message.contains("deadline")),
        "{late:?}"
    );
    assert!(SystemTime::now() + Duration::from_millis(100) >= slow_deadline);
    assert_eq!(probe.sessions.lock().unwrap().len(), 1);

    shutdown.cancel();
    let drain = conn.next().await;
    assert!(
        matches!(drain, controller_message::Message::Drain(_)),
        "{drain:?}"
    );
    drop(conn);
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}

#[tokio::test]
async fn invalid_registration_is_fatal() {
    let (addr, mut conns) = serve(false).await;
    let (_, run) = start(addr, &CancellationToken::new(), |_| {});
    let mut conn = next_conn(&mut conns).await;
    let _ = conn.next().await;
    conn.send(manager_message::Message::Rejected(pb::Rejected {
        code: tonic::Code::InvalidArgument as i32,
        message: "kind 'Nope' not found".into(),
        field: "register.primary.kind".into(),
        outdated: false,
        ..Default::default()
    }))
    .await;
    let _ = conn
        .to
        .send(Err(Status::invalid_argument("kind 'Nope' not found")))
        .await;
    match tokio::time::timeout(PATIENCE, run).await.unwrap().unwrap() {
        Err(ctrlhub_sdk::Error::Rejected { code, field, .. }) => {
            assert_eq!(code, tonic::Code::InvalidArgument);
            assert_eq!(field, "register.primary.kind");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Heartbeats go out every `hold / 5` with increasing nonces; a request waits for the first
/// answer; when answers stop, the session ends at half the hold after the last answered beat
/// was sent, its reconcile is cancelled, and no result of it reaches the next session.
#[tokio::test]
async fn heartbeats_anchor_and_silence() {
    let hold = Duration::from_millis(1000);
    let (addr, mut conns) = serve(false).await;
    let shutdown = CancellationToken::new();
    let (probe, run) = start(addr, &shutdown, |_| {});
    let mut conn = next_conn(&mut conns).await;
    conn.register("s-1", Some(hold)).await;
    conn.send(reconcile_msg(request("r-1", "slow", PATIENCE)))
        .await;
    let controller_message::Message::Heartbeat(first) = conn.next().await else {
        panic!("expected a heartbeat right after Registered");
    };
    assert!(
        probe.when("slow", "start").is_empty(),
        "no reconcile starts before a heartbeat is answered"
    );
    let answered = Instant::now();
    conn.send(manager_message::Message::Heartbeat(first)).await;
    let mut last_nonce = first.nonce;
    let mut last_answered = answered;
    for _ in 0..4 {
        let controller_message::Message::Heartbeat(beat) = conn.next().await else {
            panic!("expected heartbeats only");
        };
        assert!(beat.nonce > last_nonce);
        last_nonce = beat.nonce;
        last_answered = Instant::now();
        conn.send(manager_message::Message::Heartbeat(beat)).await;
    }
    let started = probe.when("slow", "start");
    assert_eq!(started.len(), 1);
    assert!(
        started[0] >= answered,
        "started only after the first answer"
    );

    // No more answers: the session ends by half the hold, and a new one registers.
    let mut next = next_conn(&mut conns).await;
    let ended = Instant::now();
    assert!(
        ended >= last_answered + hold / 2 - Duration::from_millis(150),
        "ended {:?} after the last answer",
        ended - last_answered
    );
    next.register("s-2", Some(hold)).await;
    let beat = next.next().await;
    assert!(
        matches!(beat, controller_message::Message::Heartbeat(_)),
        "the cancelled reconcile's result must not reach the new session: {beat:?}"
    );
    assert_eq!(probe.sessions.lock().unwrap().len(), 2);
    shutdown.cancel();
    drop((conn, next));
    assert!(tokio::time::timeout(PATIENCE, run).await.unwrap().is_ok());
}

/// A reconcile blocked in `ctrlhub_sdk::blocking` past its deadline answers only once the
/// blocking work has ended, and the key's next attempt (re-delivered meanwhile) starts only
/// after that.
#[tokio::test]
async fn blocking_work_holds_the_result_and_the_next_attempt() {
    let (addr, mut conns) = serve(false).await;
    let shutdown = CancellationToken::new();
    let (probe, run) = start(addr, &shutdown, |_| {});
    let mut conn = next_conn(&mut conns).await;
    conn.register("s-1", Some(Duration::from_secs(5))).await;
    conn.send(reconcile_msg(request(
        "r-1",
        "block",
        Duration::from_millis(200),
    )))
    .await;
    conn.send(reconcile_msg(request("r-2", "block", PATIENCE)))
        .await;
    let first = result_of(conn.next_not_heartbeat(true).await);
    let answered = Instant::now();
    assert_eq!(first.id, "r-1");
    let starts = probe.when("block", "start");
    assert!(
        !starts.is_empty() && answered >= starts[0] + Duration::from_millis(600),
        "the result waited for the blocking work"
    );
    let second = result_of(conn.next_not_heartbeat(true).await);
    assert_eq!(second.id, "r-2");
    let starts = probe.when("block", "start");
    assert_eq!(starts.len(), 2);
    assert!(
        starts[1] >= starts[0] + Duration::from_millis(600),
        "attempt 2 started before attempt 1's blocking work ended"
    );
    shutdown.cancel();
    drop(conn);
    assert!(tokio::time::timeout(PATIENCE, run).await.unwrap().is_ok());
}

/// A tombstone with empty JSON is a deletion, and never an undecodable (Terminal) request.
#[tokio::test]
async fn an_empty_tombstone_is_a_deletion_not_a_terminal_error() {
    let (addr, mut conns) = serve(false).await;
    let shutdown = CancellationToken::new();
    let (_, run) = start(addr, &shutdown, |_| {});
    let mut conn = next_conn(&mut conns).await;
    conn.register("s-1", None).await;
    let mut req = request("r-1", "gone", PATIENCE);
    req.reasons = vec![pb::reconcile_request::Reason::Deleted as i32];
    req.object = Some(pb::reconcile_request::Object::Tombstone(pb::Tombstone {
        object_json: Vec::new(),
        final_state_unknown: true,
    }));
    conn.send(reconcile_msg(req)).await;
    let result = result_of(conn.next().await);
    assert!(
        matches!(result.outcome, Some(pb::reconcile_result::Outcome::Done(_))),
        "{result:?}"
    );
    shutdown.cancel();
    drop(conn);
    assert!(tokio::time::timeout(PATIENCE, run).await.unwrap().is_ok());
}

/// An object the primary type cannot read is not the object's fault: retried with backoff (an
/// error), never answered Terminal, and the handler does not run.
#[tokio::test]
async fn an_undecodable_object_is_retried_not_terminal() {
    let (addr, mut conns) = serve(false).await;
    let shutdown = CancellationToken::new();
    let (probe, run) = start(addr, &shutdown, |_| {});
    let mut conn = next_conn(&mut conns).await;
    conn.register("s-1", None).await;
    let mut req = request("r-1", "odd", PATIENCE);
    req.object = Some(pb::reconcile_request::Object::ObjectJson(
        br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"odd"}}"#.to_vec(),
    ));
    conn.send(reconcile_msg(req)).await;
    let result = result_of(conn.next().await);
    let Some(pb::reconcile_result::Outcome::Error(error)) = result.outcome else {
        panic!("expected a retried error, got {result:?}");
    };
    assert!(error.message.contains("undecodable"), "{error:?}");
    assert!(probe.when("odd", "start").is_empty());
    shutdown.cancel();
    drop(conn);
    assert!(tokio::time::timeout(PATIENCE, run).await.unwrap().is_ok());
}

/// SUPERSEDED and `Rejected.outdated` stop the replica taking work without ending `run`; it
/// registers again only after `outdated_wait`.
#[tokio::test]
async fn superseded_and_outdated_wait_then_register_again() {
    let wait = Duration::from_millis(800);
    let (addr, mut conns) = serve(false).await;
    let shutdown = CancellationToken::new();
    let (probe, run) = start(addr, &shutdown, |c| c.outdated_wait = wait);
    let mut conn = next_conn(&mut conns).await;
    conn.register("s-1", None).await;
    conn.send(reconcile_msg(request("r-1", "slow", PATIENCE)))
        .await;
    tokio::time::timeout(PATIENCE, async {
        while probe.when("slow", "start").is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    conn.send(manager_message::Message::Revoked(pb::Revoked {
        reason: pb::revoked::Reason::Superseded as i32,
        code: tonic::Code::FailedPrecondition as i32,
        message: "revision 2 replaced revision 1".into(),
        leader_identity: String::new(),
        ..Default::default()
    }))
    .await;
    let revoked = Instant::now();
    let _ = conn
        .to
        .send(Err(Status::failed_precondition("superseded")))
        .await;

    let mut again = next_conn(&mut conns).await;
    assert!(revoked.elapsed() >= wait, "registered again too early");
    assert!(!run.is_finished(), "a superseded replica does not exit");
    let _ = again.next().await;
    again
        .send(manager_message::Message::Rejected(pb::Rejected {
            code: tonic::Code::FailedPrecondition as i32,
            message: "controller test runs revision 2".into(),
            field: String::new(),
            outdated: true,
            ..Default::default()
        }))
        .await;
    let rejected = Instant::now();
    let mut third = next_conn(&mut conns).await;
    assert!(rejected.elapsed() >= wait, "registered again too early");
    assert!(!run.is_finished(), "an outdated replica does not exit");
    third.register("s-3", None).await;
    tokio::time::timeout(PATIENCE, async {
        while probe.sessions.lock().unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    shutdown.cancel();
    let drain = third.next().await;
    assert!(matches!(drain, controller_message::Message::Drain(_)));
    drop((conn, again, third));
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}

/// Waits (at most [`PATIENCE`]) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not in time"));
}

/// A reconnect backoff whose every step waits at least `step / 2`: a session that follows a
/// redirect sooner than that did not back off.
fn backoff_of(step: Duration) -> ctrlhub_sdk::Backoff {
    ctrlhub_sdk::Backoff::new(step, step, Duration::from_secs(300))
}

/// A member that does not own the controller answers its Register with `Rejected(UNAVAILABLE)`
/// naming the owner and ends the stream with the owner in its trailers: the controller
/// registers at the owner at once, on a new connection with the same token, and works there
/// (a request is reconciled, and its cached read reaches the owner).
#[tokio::test]
async fn a_redirect_on_register_dials_the_owner_at_once() {
    redirect_on_register(false).await;
}

/// The same when only the status's trailers name the owner.
#[tokio::test]
async fn a_redirect_in_the_trailers_alone_dials_the_owner_at_once() {
    redirect_on_register(true).await;
}

async fn redirect_on_register(trailers_only: bool) {
    let seen = Arc::new(Seen::default());
    let (a, b) = (Member::bind("a"), Member::bind("b"));
    let (a_url, b_url) = (a.url.clone(), b.url.clone());
    let redirect = Redirect {
        trailers_only,
        ..Redirect::to("mgr-b", &b_url)
    };
    let _a = a.serve(seen.clone(), false, Some(redirect));
    let mut at_b = b.serve(seen.clone(), false, None);
    let step = Duration::from_secs(6);
    let shutdown = CancellationToken::new();
    let (probe, run) = start(a_url, &shutdown, |c| c.reconnect = backoff_of(step));

    let mut conn = next_conn(&mut at_b).await;
    let connects = seen.connects();
    assert_eq!(
        connects.iter().map(|(m, _)| *m).collect::<Vec<_>>(),
        ["a", "b"]
    );
    let followed_in = connects[1].1 - connects[0].1;
    assert!(
        followed_in < step / 2,
        "the redirect waited {followed_in:?}"
    );
    conn.register("s-b", None).await;
    conn.send(reconcile_msg(request("r-1", "a", PATIENCE)))
        .await;
    let result = result_of(conn.next().await);
    assert_eq!(result.id, "r-1");
    assert!(matches!(
        result.outcome,
        Some(pb::reconcile_result::Outcome::RequeueAfter(_))
    ));
    assert_eq!(seen.gets_from("b"), 1, "the cached read went to the owner");
    assert_eq!(seen.gets_from("a"), 0);
    assert_eq!(probe.sessions.lock().unwrap().len(), 1);

    shutdown.cancel();
    assert!(matches!(
        conn.next().await,
        controller_message::Message::Drain(_)
    ));
    drop(conn);
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}

/// A live session whose controller moved to another member (`Revoked(UNIT_MOVED)` with the new
/// owner's address, then UNAVAILABLE): its running handler is cancelled as with any ended
/// session, the next session registers at the new owner at once, and cached reads go there.
#[tokio::test]
async fn a_moved_controller_registers_at_its_new_owner_at_once() {
    let seen = Arc::new(Seen::default());
    let (a, b) = (Member::bind("a"), Member::bind("b"));
    let (a_url, b_url) = (a.url.clone(), b.url.clone());
    let mut at_a = a.serve(seen.clone(), false, None);
    let mut at_b = b.serve(seen.clone(), false, None);
    let step = Duration::from_secs(6);
    let shutdown = CancellationToken::new();
    let (probe, run) = start(b_url, &shutdown, |c| c.reconnect = backoff_of(step));

    let mut old = next_conn(&mut at_b).await;
    old.register("s-b", None).await;
    old.send(reconcile_msg(request("r-1", "slow", PATIENCE)))
        .await;
    until("the slow handler starts", || {
        !probe.when("slow", "start").is_empty()
    })
    .await;
    old.send(manager_message::Message::Revoked(pb::Revoked {
        reason: pb::revoked::Reason::UnitMoved as i32,
        code: tonic::Code::Unavailable as i32,
        message: "the ring changed: mgr-a owns controller test".into(),
        leader_identity: "mgr-a".into(),
        owner_address: host_port(&a_url),
    }))
    .await;
    let moved = Instant::now();
    let _ = old.to.send(Err(Status::unavailable("unit moved"))).await;

    let mut new = next_conn(&mut at_a).await;
    assert!(
        moved.elapsed() < step / 2,
        "the move waited {:?}",
        moved.elapsed()
    );
    until("the old session's handler is cancelled", || {
        !probe.when("slow", "stopped").is_empty()
    })
    .await;
    new.register("s-a", None).await;
    new.send(reconcile_msg(request("r-2", "a", PATIENCE))).await;
    let result = result_of(new.next().await);
    assert_eq!(
        result.id, "r-2",
        "only the new session's request is answered on it"
    );
    assert_eq!(
        seen.gets_from("a"),
        1,
        "the cached read went to the new owner"
    );
    assert_eq!(seen.gets_from("b"), 0);
    assert_eq!(
        seen.connects().iter().map(|(m, _)| *m).collect::<Vec<_>>(),
        ["b", "a"]
    );

    shutdown.cancel();
    assert!(matches!(
        new.next().await,
        controller_message::Message::Drain(_)
    ));
    drop((old, new));
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}

/// Two members that each say the other owns the controller: the controller follows 3
/// redirects in a row (a → b → a → b), does not follow the 4th, and goes back to the
/// configured address (a) after its backoff, again and again: each round is 4 Registers, and
/// rounds are a backoff apart.
#[tokio::test]
async fn members_redirecting_to_each_other_are_followed_3_times_then_backed_off() {
    let seen = Arc::new(Seen::default());
    let (a, b) = (Member::bind("a"), Member::bind("b"));
    let (a_url, b_url) = (a.url.clone(), b.url.clone());
    let _a = a.serve(seen.clone(), false, Some(Redirect::to("mgr-b", &b_url)));
    let _b = b.serve(seen.clone(), false, Some(Redirect::to("mgr-a", &a_url)));
    let step = Duration::from_secs(2);
    let shutdown = CancellationToken::new();
    let (probe, run) = start(a_url, &shutdown, |c| c.reconnect = backoff_of(step));

    let rounds = 3;
    until("three rounds of redirects", || {
        seen.connects().len() >= 4 * rounds
    })
    .await;
    shutdown.cancel();
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");

    let connects = seen.connects();
    let members: Vec<&str> = connects.iter().map(|(m, _)| *m).collect();
    let round = ["a", "b", "a", "b"];
    assert_eq!(
        members[..4 * rounds],
        round.repeat(rounds)[..],
        "3 redirects followed, then back to a"
    );
    assert!(
        members.len() <= 4 * rounds + 1,
        "connected on during the shutdown: {members:?}"
    );
    for (n, pair) in connects[..4 * rounds].windows(2).enumerate() {
        let gap = pair[1].1 - pair[0].1;
        if n % 4 == 3 {
            assert!(
                gap >= step / 2,
                "no backoff before round {}: {gap:?}",
                n / 4 + 2
            );
        } else {
            assert!(gap < step / 2, "redirect {} waited {gap:?}", n % 4 + 1);
        }
    }
    assert!(probe.sessions.lock().unwrap().is_empty());
}

/// A redirect to an address where nothing listens is an ordinary failure: back to the
/// configured address, after the backoff. (This member names the owner in the status's
/// trailers only.)
#[tokio::test]
async fn a_redirect_to_nothing_goes_back_to_the_configured_address() {
    let nowhere = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let seen = Arc::new(Seen::default());
    let a = Member::bind("a");
    let a_url = a.url.clone();
    let redirect = Redirect {
        trailers_only: true,
        ..Redirect::to("mgr-gone", &nowhere)
    };
    let _a = a.serve(seen.clone(), false, Some(redirect));
    let step = Duration::from_secs(1);
    let shutdown = CancellationToken::new();
    let (probe, run) = start(a_url, &shutdown, |c| c.reconnect = backoff_of(step));

    until("a second Register at the configured address", || {
        seen.connects_to("a").len() >= 2
    })
    .await;
    let at_a = seen.connects_to("a");
    assert!(
        at_a[1] - at_a[0] >= step / 2,
        "back to the configured address without a backoff: {:?}",
        at_a[1] - at_a[0]
    );
    assert!(!run.is_finished(), "an unreachable owner is not fatal");
    assert!(probe.sessions.lock().unwrap().is_empty());
    shutdown.cancel();
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}

/// Over TLS, the owner is dialled with the configured CA and token, and its certificate must
/// name the redirect's host, not the configured server name: a's certificate names only
/// `a.ring.test` (the configured `server_name`), b's only `localhost` (the redirect's host).
#[tokio::test]
async fn a_redirect_over_tls_verifies_the_owners_host() {
    let (ca, certs) = certificates(&["a.ring.test", "localhost"]);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let seen = Arc::new(Seen::default());
    let a = Member::bind("a").with_tls(&certs[0]);
    let b = Member::bind("b").with_tls(&certs[1]);
    let (a_port, b_port) = (a.port(), b.port());
    let _a = a.serve(
        seen.clone(),
        false,
        Some(Redirect::to("mgr-b", &format!("localhost:{b_port}"))),
    );
    let mut at_b = b.serve(seen.clone(), false, None);
    let shutdown = CancellationToken::new();
    let (_, run) = start(format!("127.0.0.1:{a_port}"), &shutdown, |c| {
        c.tls = Some(ctrlhub_sdk::TlsFiles {
            ca: ca_file.clone(),
            cert: None,
            key: None,
            server_name: Some("a.ring.test".into()),
        });
    });

    let mut conn = next_conn(&mut at_b).await;
    conn.register("s-b", None).await;
    conn.send(reconcile_msg(request("r-1", "a", PATIENCE)))
        .await;
    assert_eq!(result_of(conn.next().await).id, "r-1");
    assert_eq!(seen.gets_from("b"), 1);
    shutdown.cancel();
    drop(conn);
    let outcome = tokio::time::timeout(PATIENCE, run).await.unwrap().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}
