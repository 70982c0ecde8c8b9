//! A controller replica speaking the raw gRPC protocol, so that a test or a scenario decides
//! exactly when and how each reconcile request is answered, and sees which manager sent what.

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::Streaming;

use crate::wait::PATIENCE;

/// Why a replica could not register.
pub type ConnectError = tonic::Status;

/// The core ConfigMap kind as a ctrlhub resource type.
pub fn configmaps() -> pb::ResourceType {
    pb::ResourceType {
        group: String::new(),
        version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: String::new(),
    }
}

/// A namespace scope naming `names`.
pub fn namespace_names(names: &[&str]) -> pb::NamespaceScope {
    pb::NamespaceScope {
        scope: Some(pb::namespace_scope::Scope::Names(
            pb::namespace_scope::Names {
                names: names.iter().map(|n| n.to_string()).collect(),
            },
        )),
    }
}

/// A RECONCILE-mode registration of `name` on `primary`, with `credits` in flight, objects
/// included, in `namespace` (all when None).
pub fn register(
    name: &str,
    primary: pb::ResourceType,
    credits: u32,
    namespace: Option<&str>,
) -> pb::Register {
    pb::Register {
        controller_name: name.to_string(),
        mode: pb::register::Mode::Reconcile as i32,
        primary: Some(primary),
        max_concurrent_reconciles: credits.max(1),
        max_in_flight: credits,
        include_object: true,
        namespaces: namespace.map(|ns| namespace_names(&[ns])),
        ..Default::default()
    }
}

/// A ConfigMap controller registration with sensible test defaults (64 concurrent reconciles).
pub fn register_configmaps(name: &str, credits: u32) -> pb::Register {
    pb::Register {
        max_concurrent_reconciles: 64,
        ..register(name, configmaps(), credits, None)
    }
}

/// Seconds as a protobuf Duration.
pub fn secs(s: f64) -> prost_types::Duration {
    prost_types::Duration::try_from(Duration::from_secs_f64(s)).expect("in range")
}

/// A request carrying `authorization` metadata as given (None: none at all).
pub fn with_authorization<T>(msg: T, authorization: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(value) = authorization {
        req.metadata_mut()
            .insert("authorization", value.parse().expect("valid header value"));
    }
    req
}

/// A Done result for request `id`.
pub fn done_message(id: &str) -> pb::ControllerMessage {
    result_message(
        id,
        pb::reconcile_result::Outcome::Done(pb::reconcile_result::Done {}),
    )
}

/// A result with `outcome` for request `id`.
fn result_message(id: &str, outcome: pb::reconcile_result::Outcome) -> pb::ControllerMessage {
    pb::ControllerMessage {
        message: Some(pb::controller_message::Message::Result(
            pb::ReconcileResult {
                id: id.to_string(),
                outcome: Some(outcome),
            },
        )),
    }
}

/// `namespace/name` of a request.
pub fn key(r: &pb::ReconcileRequest) -> String {
    r.key
        .as_ref()
        .map(|k| format!("{}/{}", k.namespace, k.name))
        .unwrap_or_default()
}

/// The request's object as JSON (Null when absent or not JSON).
pub fn object(r: &pb::ReconcileRequest) -> serde_json::Value {
    match &r.object {
        Some(pb::reconcile_request::Object::ObjectJson(j)) => {
            serde_json::from_slice(j).unwrap_or_default()
        }
        _ => serde_json::Value::Null,
    }
}

/// One controller replica: a registered session.
pub struct Replica {
    tx: mpsc::Sender<pb::ControllerMessage>,
    rx: Streaming<pb::ManagerMessage>,
    /// From Registered.
    pub session_id: String,
    /// A client for Get/List.
    pub client: ControllerManagerClient<tonic::transport::Channel>,
    /// The Registered message itself.
    pub registered: pb::Registered,
}

impl Replica {
    /// Connect and register with the static `dev` token; Err carries the manager's status.
    pub async fn connect(endpoint: &str, register: pb::Register) -> Result<Replica, ConnectError> {
        Self::connect_with(endpoint, register, Some("Bearer dev")).await
    }

    /// Connect and register sending `authorization` metadata as given (None: no metadata).
    pub async fn connect_with(
        endpoint: &str,
        register: pb::Register,
        authorization: Option<&str>,
    ) -> Result<Replica, ConnectError> {
        Self::connect_with_metadata(endpoint, register, authorization, &[]).await
    }

    /// As [`Replica::connect_with`], plus extra metadata (e.g. headers trying to spoof a tenant).
    pub async fn connect_with_metadata(
        endpoint: &str,
        register: pb::Register,
        authorization: Option<&str>,
        extra: &[(&'static str, &str)],
    ) -> Result<Replica, ConnectError> {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        Self::connect_over(channel, register, authorization, extra).await
    }

    /// Register over an already connected `channel` (e.g. one speaking TLS).
    pub async fn connect_over(
        channel: tonic::transport::Channel,
        register: pb::Register,
        authorization: Option<&str>,
        extra: &[(&'static str, &str)],
    ) -> Result<Replica, ConnectError> {
        let mut client = ControllerManagerClient::new(channel);
        let (tx, rx) = mpsc::channel(4096);
        let register = pb::controller_message::Message::Register(Box::new(register));
        tx.send(pb::ControllerMessage {
            message: Some(register),
        })
        .await
        .map_err(|_| tonic::Status::internal("queue closed"))?;
        let request = connect_request(rx, authorization, extra)?;
        let mut stream = client.connect(request).await?.into_inner();
        let first = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no Registered"))??
            .ok_or_else(|| tonic::Status::cancelled("stream ended before Registered"))?;
        match first.message {
            Some(pb::manager_message::Message::Registered(r)) => Ok(Replica {
                tx,
                rx: stream,
                session_id: r.session_id.clone(),
                client,
                registered: *r,
            }),
            // A refusal after Register: Rejected, then the same status ends the stream. The
            // status is what callers check; a Rejected that disagrees with it is a bug.
            Some(pb::manager_message::Message::Rejected(rejected)) => {
                Err(status_after_rejected(&mut stream, &rejected).await)
            }
            other => Err(tonic::Status::internal(format!(
                "expected Registered, got {other:?}"
            ))),
        }
    }

    /// The next reconcile request, or None if none arrives within `within` (or the stream ends).
    pub async fn next(&mut self, within: Duration) -> Option<pb::ReconcileRequest> {
        self.next_where(within, |m| match m {
            pb::manager_message::Message::Reconcile(r) => Some(r),
            _ => None,
        })
        .await
    }

    /// The next message of any kind, or None if none arrives within `within` (or the stream
    /// ends).
    pub async fn next_message(&mut self, within: Duration) -> Option<pb::manager_message::Message> {
        self.next_where(within, Some).await
    }

    /// The next EVENTS-mode delivery, or None if none arrives within `within`.
    pub async fn next_event(&mut self, within: Duration) -> Option<pb::Event> {
        self.next_where(within, |m| match m {
            pb::manager_message::Message::Event(e) => Some(e),
            _ => None,
        })
        .await
    }

    /// The next message that `pick` takes, skipping the others (heartbeat answers among them);
    /// None if none arrives within `within` (or the stream ends).
    async fn next_where<T>(
        &mut self,
        within: Duration,
        pick: impl Fn(pb::manager_message::Message) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let message = tokio::time::timeout_at(deadline, self.rx.message()).await;
            let Ok(Ok(Some(message))) = message else {
                return None;
            };
            if let Some(v) = message.message.and_then(&pick) {
                return Some(v);
            }
        }
    }

    /// The next message of any kind: Ok(Some(request)), Ok(None) for another message, Err(())
    /// when the session ended — including by Revoked, after which a controller reconnects (as
    /// the SDK does) rather than wait for the manager to close the stream.
    pub async fn recv(&mut self) -> Result<Option<pb::ReconcileRequest>, ()> {
        match self.rx.message().await {
            Ok(Some(pb::ManagerMessage {
                message: Some(pb::manager_message::Message::Reconcile(r)),
            })) => Ok(Some(r)),
            Ok(Some(pb::ManagerMessage {
                message: Some(pb::manager_message::Message::Revoked(_)),
            })) => Err(()),
            Ok(Some(_)) => Ok(None),
            _ => Err(()),
        }
    }

    /// How the session ended, if it ends within `within`: the Revoked code, or the stream's
    /// final status. Reconcile requests arriving meanwhile are ignored.
    pub async fn ended(&mut self, within: Duration) -> Option<tonic::Status> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.rx.message()).await {
                Ok(Ok(Some(pb::ManagerMessage {
                    message: Some(pb::manager_message::Message::Revoked(r)),
                }))) => return Some(tonic::Status::new(tonic::Code::from(r.code), r.message)),
                Ok(Ok(Some(_))) => continue,
                Ok(Ok(None)) => return Some(tonic::Status::ok("stream closed")),
                Ok(Err(status)) => return Some(status),
                Err(_) => return None,
            }
        }
    }

    /// The next request, failing the test if none arrives within [`PATIENCE`].
    pub async fn expect(&mut self) -> pb::ReconcileRequest {
        self.next(PATIENCE).await.expect("a reconcile request")
    }

    /// A cheap handle for answering requests from other tasks.
    pub fn answers(&self) -> mpsc::Sender<pb::ControllerMessage> {
        self.tx.clone()
    }

    /// Acknowledge an EVENTS-mode delivery.
    pub async fn ack(&self, id: &str) {
        let msg = pb::ControllerMessage {
            message: Some(pb::controller_message::Message::EventAck(pb::EventAck {
                id: id.to_string(),
            })),
        };
        let _ = self.tx.send(msg).await;
    }

    /// Answer a request.
    pub async fn reply(&self, id: &str, outcome: pb::reconcile_result::Outcome) {
        // A closed stream just means the session is gone; the test notices through its assertions.
        let _ = self.tx.send(result_message(id, outcome)).await;
    }

    /// Answer Done.
    pub async fn done(&self, id: &str) {
        let _ = self.tx.send(done_message(id)).await;
    }

    /// Keeps an `exclusive_attempts` session alive: a Heartbeat every `every` from a task of
    /// its own (the manager ends a session silent for its hold). The task holds the stream
    /// open: abort it before dropping the replica to end the session.
    pub fn keep_alive(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            for nonce in 1.. {
                let beat = pb::controller_message::Message::Heartbeat(pb::Heartbeat { nonce });
                if tx
                    .send(pb::ControllerMessage {
                        message: Some(beat),
                    })
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        })
    }
}

/// The status that ends a stream after `rejected`; an internal error saying what differs when
/// the two disagree (the proto: the stream ends "with the same gRPC status code and message").
pub async fn status_after_rejected(
    stream: &mut tonic::Streaming<pb::ManagerMessage>,
    rejected: &pb::Rejected,
) -> tonic::Status {
    let end = match tokio::time::timeout(PATIENCE, stream.message()).await {
        Ok(Err(status)) => status,
        other => {
            return tonic::Status::internal(format!(
                "Rejected {rejected:?} was not followed by the stream's status but by {other:?}"
            ));
        }
    };
    if end.code() as i32 != rejected.code || end.message() != rejected.message {
        return tonic::Status::internal(format!(
            "Rejected {rejected:?} disagrees with the final status {end:?}"
        ));
    }
    end
}

/// The Connect request: the outgoing message stream with `authorization` and `extra` metadata.
fn connect_request(
    rx: mpsc::Receiver<pb::ControllerMessage>,
    authorization: Option<&str>,
    extra: &[(&'static str, &str)],
) -> Result<
    tonic::Request<tokio_stream::wrappers::ReceiverStream<pb::ControllerMessage>>,
    ConnectError,
> {
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut request = tonic::Request::new(stream);
    let pairs = authorization.map(|a| ("authorization", a)).into_iter();
    for (name, value) in pairs.chain(extra.iter().copied()) {
        let value = value
            .parse()
            .map_err(|_| tonic::Status::invalid_argument(format!("{name} is not ASCII")))?;
        request.metadata_mut().insert(name, value);
    }
    Ok(request)
}
