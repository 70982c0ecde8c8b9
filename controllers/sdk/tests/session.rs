//! The SDK against an in-process fake manager that each test scripts message by message:
//! reconnecting after a standby's UNAVAILABLE, results (late ones too, once the handler has
//! stopped), heartbeats and the anchor, the silence that ends a session, requests held until
//! the first heartbeat answer, one attempt of a key at a time, empty tombstones, SUPERSEDED and
//! outdated registrations, and the refusals that need a human. The same points are tested
//! against the real manager in `tests/protocol.rs`.
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
    connects: AtomicUsize,
    refuse_first: bool,
    conns: mpsc::UnboundedSender<Conn>,
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
        if self.connects.fetch_add(1, Ordering::SeqCst) == 0 && self.refuse_first {
            return Err(Status::unavailable("standby; the leader is mgr-1"));
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
        Err(Status::not_found("nothing cached"))
    }

    async fn list(
        &self,
        _: tonic::Request<pb::ListRequest>,
    ) -> Result<tonic::Response<pb::ListResponse>, Status> {
        Err(Status::unimplemented("list"))
    }
}

/// The fake manager's address and the connects it accepts.
async fn serve(refuse_first: bool) -> (String, mpsc::UnboundedReceiver<Conn>) {
    let (conns, rx) = mpsc::unbounded_channel();
    let fake = Fake {
        connects: AtomicUsize::new(0),
        refuse_first,
        conns,
    };
    let incoming =
        tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ControllerManagerServer::new(fake))
            .serve_with_incoming(incoming),
    );
    (format!("http://{addr}"), rx)
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

/// Handlers by key name: `slow` never finishes (only cancellation ends it), `block` blocks for
/// 600 ms in `ctrlhub_sdk::blocking` whatever its cancellation says, `gone` answers done
/// exactly when the request says the object was deleted, anything else requeues after 5 s.
async fn reconcile(req: Request<ConfigMap>, probe: Arc<Probe>) -> Result<Action, ReconcileError> {
    let name = req.name().to_owned();
    probe.note(&name, "start");
    match name.as_str() {
        "slow" => std::future::pending::<()>().await,
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
