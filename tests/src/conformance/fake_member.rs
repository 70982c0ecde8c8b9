//! Two fake ring members that send every `Register` to each other: the worst case of members
//! whose views of the ring differ (no real member does this for long). Each answers the stream's
//! first message with `Rejected(UNAVAILABLE)` naming the other as owner, then ends the stream
//! with UNAVAILABLE and the owner trailers (`ctrlhub-owner`, `ctrlhub-owner-addr`), exactly as a
//! member that does not own a controller does, and notes when each Register arrived.

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_server::{ControllerManager, ControllerManagerServer};
use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use super::world::now_us;

/// One Register a fake received.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The fake's identity.
    pub member: String,
    /// When it arrived (Unix microseconds).
    pub at_us: u64,
}

type Out = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ManagerMessage, Status>> + Send>>;

/// One fake: who it names as owner, and the shared record of Registers.
struct Fake {
    identity: String,
    owner: (String, String),
    seen: Arc<Mutex<Vec<Arrival>>>,
}

/// The two fakes; they stop when dropped.
pub struct RedirectLoop {
    /// `host:port` of each fake, in the order of [`RedirectLoop::identities`].
    pub addresses: [String; 2],
    /// Each fake's identity (`fake-a`, `fake-b`).
    pub identities: [String; 2],
    seen: Arc<Mutex<Vec<Arrival>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RedirectLoop {
    /// Binds two loopback ports and serves a fake on each, each redirecting to the other.
    pub async fn start() -> std::io::Result<RedirectLoop> {
        let a = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let b = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addresses = [a.local_addr()?.to_string(), b.local_addr()?.to_string()];
        let identities = ["fake-a".to_string(), "fake-b".to_string()];
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, listener) in [a, b].into_iter().enumerate() {
            let other = 1 - i;
            let fake = Fake {
                identity: identities[i].clone(),
                owner: (identities[other].clone(), addresses[other].clone()),
                seen: seen.clone(),
            };
            tasks.push(tokio::spawn(async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(ControllerManagerServer::new(fake))
                    .serve_with_incoming(TcpListenerStream::new(listener))
                    .await;
            }));
        }
        Ok(RedirectLoop {
            addresses,
            identities,
            seen,
            tasks,
        })
    }

    /// Every Register so far, oldest first.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.seen.lock().clone()
    }
}

impl Drop for RedirectLoop {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Fake {
    /// UNAVAILABLE naming the other fake, as `ctrlhub`'s redirect status does.
    fn status(&self) -> Status {
        let (identity, address) = &self.owner;
        let mut status = Status::unavailable(format!(
            "{} does not own this controller; member {identity} does: dial {address}",
            self.identity
        ));
        let md = status.metadata_mut();
        for (key, value) in [
            ("ctrlhub-owner", identity),
            ("ctrlhub-owner-addr", address),
            ("ctrlhub-leader", identity),
        ] {
            if let Ok(v) = value.parse() {
                md.insert(key, v);
            }
        }
        status
    }

    fn rejected(&self) -> pb::ManagerMessage {
        let (identity, address) = &self.owner;
        pb::ManagerMessage {
            message: Some(pb::manager_message::Message::Rejected(pb::Rejected {
                code: tonic::Code::Unavailable as i32,
                message: self.status().message().to_string(),
                owner_identity: identity.clone(),
                owner_address: address.clone(),
                ..Default::default()
            })),
        }
    }
}

#[tonic::async_trait]
impl ControllerManager for Fake {
    type ConnectStream = Out;

    async fn connect(
        &self,
        req: Request<Streaming<pb::ControllerMessage>>,
    ) -> Result<Response<Out>, Status> {
        let mut from = req.into_inner();
        // Only a Register is answered with the redirect; anything else ends the stream.
        let first = from.message().await?;
        let is_register = matches!(
            first,
            Some(pb::ControllerMessage {
                message: Some(pb::controller_message::Message::Register(_))
            })
        );
        if !is_register {
            return Err(Status::invalid_argument(
                "the first message must be Register",
            ));
        }
        self.seen.lock().push(Arrival {
            member: self.identity.clone(),
            at_us: now_us(),
        });
        // Read what else the controller sends until it closes, so the stream ends cleanly.
        tokio::spawn(async move { while let Ok(Some(_)) = from.message().await {} });
        let (to, rx) = mpsc::channel(2);
        let _ = to.send(Ok(self.rejected())).await;
        let _ = to.send(Err(self.status())).await;
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get(&self, _: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        Err(Status::unavailable("a fake member caches nothing"))
    }

    async fn list(
        &self,
        _: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        Err(Status::unavailable("a fake member caches nothing"))
    }
}
