//! A controller replica speaking the raw gRPC protocol, for scenarios that must see exactly
//! which manager dispatched what and when (failover, fairness, memory).

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Streaming;

/// One registered session.
pub struct Replica {
    tx: mpsc::Sender<pb::ControllerMessage>,
    rx: Streaming<pb::ManagerMessage>,
    /// From Registered.
    pub session_id: String,
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
        namespaces: namespace.map(|ns| pb::NamespaceScope {
            scope: Some(pb::namespace_scope::Scope::Names(
                pb::namespace_scope::Names {
                    names: vec![ns.to_string()],
                },
            )),
        }),
        ..Default::default()
    }
}

impl Replica {
    /// Connect to `endpoint` and register, sending `authorization` (e.g. `Bearer dev`).
    pub async fn connect(
        endpoint: &str,
        register: pb::Register,
        authorization: &str,
    ) -> Result<Replica, tonic::Status> {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut client = ControllerManagerClient::new(channel);
        let (tx, rx) = mpsc::channel(4096);
        tx.send(pb::ControllerMessage {
            message: Some(pb::controller_message::Message::Register(Box::new(
                register,
            ))),
        })
        .await
        .map_err(|_| tonic::Status::internal("queue closed"))?;
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        request.metadata_mut().insert(
            "authorization",
            authorization
                .parse()
                .map_err(|_| tonic::Status::invalid_argument("authorization"))?,
        );
        let mut stream = client.connect(request).await?.into_inner();
        let first = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no Registered"))??
            .ok_or_else(|| tonic::Status::cancelled("stream ended before Registered"))?;
        match first.message {
            Some(pb::manager_message::Message::Registered(r)) => Ok(Replica {
                tx,
                rx: stream,
                session_id: r.session_id,
            }),
            other => Err(tonic::Status::internal(format!(
                "expected Registered, got {other:?}"
            ))),
        }
    }

    /// The next reconcile request; None when none arrives within `within` or the session ends.
    pub async fn next(&mut self, within: Duration) -> Option<pb::ReconcileRequest> {
        loop {
            match tokio::time::timeout(within, self.rx.message()).await {
                Ok(Ok(Some(pb::ManagerMessage {
                    message: Some(pb::manager_message::Message::Reconcile(r)),
                }))) => return Some(r),
                Ok(Ok(Some(_))) => continue,
                _ => return None,
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

    /// A cheap handle for answering requests from other tasks.
    pub fn answers(&self) -> mpsc::Sender<pb::ControllerMessage> {
        self.tx.clone()
    }

    /// Answer Done.
    pub async fn done(&self, id: &str) {
        let _ = self.tx.send(done_message(id)).await;
    }
}

/// A Done result for request `id`.
pub fn done_message(id: &str) -> pb::ControllerMessage {
    pb::ControllerMessage {
        message: Some(pb::controller_message::Message::Result(
            pb::ReconcileResult {
                id: id.to_string(),
                outcome: Some(pb::reconcile_result::Outcome::Done(
                    pb::reconcile_result::Done {},
                )),
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

/// The request's object as JSON (Null when absent).
pub fn object(r: &pb::ReconcileRequest) -> serde_json::Value {
    match &r.object {
        Some(pb::reconcile_request::Object::ObjectJson(j)) => {
            serde_json::from_slice(j).unwrap_or_default()
        }
        _ => serde_json::Value::Null,
    }
}
