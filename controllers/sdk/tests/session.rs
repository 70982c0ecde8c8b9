//! The SDK against a scripted in-process fake manager: reconnect after a
//! standby's UNAVAILABLE, register, answer a request, honour deadlines,
//! drain on shutdown, and give up on a rejection that needs a human.
#![allow(clippy::unwrap_used)]

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_server::{ControllerManager, ControllerManagerServer};
use ctrlhub_sdk::{Action, CancellationToken, Config, Controller, ReconcileError, Request};
use futures::Stream;
use k8s_openapi::api::core::v1::ConfigMap;
use pb::{controller_message, manager_message};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::{Status, Streaming};

type Out = Pin<Box<dyn Stream<Item = Result<pb::ManagerMessage, Status>> + Send>>;

/// What the fake does with each accepted Connect.
#[derive(Clone, Copy)]
enum Script {
    /// First connect: UNAVAILABLE; then register and send two requests
    /// (one with a short deadline), end with OK after Drain.
    Work,
    /// Reject the registration with INVALID_ARGUMENT.
    Reject,
}

struct Fake {
    script: Script,
    connects: AtomicUsize,
    seen: mpsc::UnboundedSender<pb::ControllerMessage>,
    slow_deadline: Arc<std::sync::Mutex<Option<oneshot::Sender<SystemTime>>>>,
}

fn msg(m: manager_message::Message) -> Result<pb::ManagerMessage, Status> {
    Ok(pb::ManagerMessage { message: Some(m) })
}

fn request(id: &str, name: &str, at: SystemTime) -> manager_message::Message {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    manager_message::Message::Reconcile(pb::ReconcileRequest {
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
    })
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
        let n = self.connects.fetch_add(1, Ordering::SeqCst);
        if matches!(self.script, Script::Work) && n == 0 {
            return Err(Status::unavailable("standby; the leader is mgr-1"));
        }
        let mut inbound = req.into_inner();
        let seen = self.seen.clone();
        let script = self.script;
        let slow_deadline_tx = self.slow_deadline.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let first = inbound.message().await.unwrap().unwrap();
            assert!(matches!(
                first.message,
                Some(controller_message::Message::Register(_))
            ));
            seen.send(first).unwrap();
            if let Script::Reject = script {
                tx.send(msg(manager_message::Message::Rejected(pb::Rejected {
                    code: tonic::Code::InvalidArgument as i32,
                    message: "kind 'Nope' not found".into(),
                    field: "register.primary.kind".into(),
                    outdated: false,
                })))
                .await
                .unwrap();
                let _ = tx
                    .send(Err(Status::invalid_argument("kind 'Nope' not found")))
                    .await;
                return;
            }
            tx.send(msg(manager_message::Message::Registered(Box::new(
                pb::Registered {
                    session_id: "s-1".into(),
                    leader_identity: "mgr-0".into(),
                    effective: None,
                    readable: vec![],
                    ..Default::default()
                },
            ))))
            .await
            .unwrap();
            let slow_deadline = SystemTime::now() + Duration::from_millis(400);
            tx.send(msg(request("r-slow", "slow", slow_deadline)))
                .await
                .unwrap();
            if let Some(report) = slow_deadline_tx.lock().unwrap().take() {
                let _ = report.send(slow_deadline);
            }
            tx.send(msg(request(
                "r-1",
                "a",
                SystemTime::now() + Duration::from_secs(10),
            )))
            .await
            .unwrap();
            // Forward everything until Drain, then close with OK.
            while let Ok(Some(m)) = inbound.message().await {
                let drain = matches!(m.message, Some(controller_message::Message::Drain(_)));
                seen.send(m).unwrap();
                if drain {
                    break;
                }
            }
            drop(tx);
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

/// The fake manager's address, what the controller sent it, and the deadline it gave the slow
/// request (so the test waits for that event, not a guessed duration).
async fn serve(
    script: Script,
) -> (
    String,
    UnboundedReceiverStream<pb::ControllerMessage>,
    oneshot::Receiver<SystemTime>,
) {
    let (seen_tx, seen_rx) = mpsc::unbounded_channel();
    let (deadline_tx, deadline_rx) = oneshot::channel();
    let fake = Fake {
        script,
        connects: AtomicUsize::new(0),
        seen: seen_tx,
        slow_deadline: Arc::new(std::sync::Mutex::new(Some(deadline_tx))),
    };
    let incoming =
        tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ControllerManagerServer::new(fake))
            .serve_with_incoming(incoming),
    );
    (
        format!("http://{addr}"),
        UnboundedReceiverStream::new(seen_rx),
        deadline_rx,
    )
}

async fn reconcile(req: Request<ConfigMap>, _: Arc<()>) -> Result<Action, ReconcileError> {
    if req.name() == "slow" {
        // Never finishes: the SDK must cancel it at its deadline and not answer.
        std::future::pending::<()>().await;
    }
    // A cached read through the session: not found maps to None.
    let cached = req.reader().get::<ConfigMap>("ns", req.name()).await?;
    assert!(cached.is_none());
    assert_eq!(req.reader().session_id(), "s-1");
    Ok(Action::requeue_after(Duration::from_secs(5)))
}

#[tokio::test]
async fn reconnects_registers_answers_and_drains() {
    use futures::StreamExt as _;
    let (addr, mut seen, slow_deadline) = serve(Script::Work).await;
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("test")
            .reconciles::<ConfigMap>()
            .max_concurrent_reconciles(2)
            .run(
                Config::new(addr, "s3cret"),
                reconcile,
                Arc::new(()),
                shutdown.clone(),
            ),
    );

    let register = tokio::time::timeout(Duration::from_secs(5), seen.next())
        .await
        .unwrap()
        .unwrap();
    let Some(controller_message::Message::Register(r)) = register.message else {
        panic!("expected Register");
    };
    assert_eq!(r.controller_name, "test");
    assert_eq!(r.max_in_flight, 2);

    let result = tokio::time::timeout(Duration::from_secs(5), seen.next())
        .await
        .unwrap()
        .unwrap();
    let Some(controller_message::Message::Result(result)) = result.message else {
        panic!("expected a Result, got {:?}", result.message);
    };
    assert_eq!(result.id, "r-1");
    assert!(matches!(
        result.outcome,
        Some(pb::reconcile_result::Outcome::RequeueAfter(_))
    ));

    // Once the slow request's deadline has passed (plus a margin for the SDK to act on it),
    // no result may come for it: the next message must be the Drain.
    let deadline = tokio::time::timeout(Duration::from_secs(5), slow_deadline)
        .await
        .unwrap()
        .unwrap();
    let left = deadline
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(left + Duration::from_millis(300)).await;
    shutdown.cancel();
    let next = tokio::time::timeout(Duration::from_secs(5), seen.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(next.message, Some(controller_message::Message::Drain(_))),
        "expected Drain (and no late result), got {:?}",
        next.message
    );
    let outcome = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .unwrap()
        .unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}

#[tokio::test]
async fn invalid_registration_is_fatal() {
    let (addr, _seen, _) = serve(Script::Reject).await;
    let outcome = tokio::time::timeout(
        Duration::from_secs(5),
        Controller::new("test").reconciles::<ConfigMap>().run(
            Config::new(addr, "s3cret"),
            reconcile,
            Arc::new(()),
            CancellationToken::new(),
        ),
    )
    .await
    .unwrap();
    match outcome {
        Err(ctrlhub_sdk::Error::Rejected { code, field, .. }) => {
            assert_eq!(code, tonic::Code::InvalidArgument);
            assert_eq!(field, "register.primary.kind");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}
