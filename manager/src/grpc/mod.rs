//! The gRPC edge: `ctrlhub.v1.ControllerManager`. Protobuf types stop here: [`convert`] turns
//! messages into domain types (errors name the offending field) and domain requests and
//! outcomes back; [`registering`] resolves and authorizes a Register; [`connect`] runs one
//! Connect stream; [`reads`] serves cached Get and List.
//!
//! Owns: the service and its sessions by id. May call: `dispatch`, `registration`, `tenancy`,
//! `informer`, `leader` and `metrics`; nothing below calls back up into it.

mod connect;
pub(crate) mod convert;
pub(crate) mod health;
mod reads;
mod registering;
pub(crate) mod server_metrics;

use crate::dispatch::controllers::ControllerTable;
use crate::dispatch::dispatcher::Controller;
use crate::leader::LeaderState;
use crate::registration::ResourceRef;
use crate::tenancy::{AuthError, Authenticator, Authorizer, Identity};
use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_server::ControllerManager;
use futures::Stream;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request as GrpcRequest, Response, Status, Streaming};

/// Shared state behind the gRPC service.
pub(crate) struct ServiceState {
    controllers: Arc<ControllerTable>,
    client: kube::Client,
    authn: Arc<dyn Authenticator>,
    authz: Arc<dyn Authorizer>,
    leader: watch::Receiver<LeaderState>,
    discovered: Mutex<HashMap<(String, String, String), ResourceRef>>,
    sessions: Mutex<HashMap<String, (Identity, Arc<Controller>)>>,
    metrics: Arc<crate::metrics::Metrics>,
    /// Answer a registration naming an unserved kind like a denied one (set under RBAC).
    conceal_unserved: bool,
    /// How often live registrations are re-authorized (under RBAC).
    recheck: Option<Duration>,
    /// How often a live session's token is authenticated again (under TokenReview).
    token_recheck: Option<Duration>,
    /// Failed authentications and reviews in flight per peer address.
    peers: crate::throttle::PeerThrottle,
    /// Connect streams waiting for their Register, per tenant and in all.
    pending: Arc<crate::throttle::Slots<String>>,
    /// Discovery calls per tenant, and kinds recently found not served.
    discovery: registering::DiscoveryBudget,
    /// This manager's Lease identity (so a revocation never names it as the new leader).
    identity: String,
    /// One refusal log line per second per tenant and code.
    refusal_logs: Mutex<HashMap<(String, String), crate::throttle::LogEvery>>,
    /// How long a registration waits for the first lists of all its caches.
    first_list_timeout: Duration,
    /// Ring mode: which member owns each controller (None: leader mode).
    ring: Option<Arc<crate::members::Ring>>,
}

/// How long a registration waits for its caches' first lists by default (controller-runtime
/// waits 2 minutes for its caches to sync): a list of a large kind through a slow API server
/// finishes; one that cannot (forbidden, a refused selector) is reported to the controller.
pub(crate) const FIRST_LIST_TIMEOUT: Duration = Duration::from_secs(120);

/// Failed authentications a peer address may make at once, then per second: a controller with
/// a stale token retries a few times; a flood of junk tokens is cut off before each one costs a
/// TokenReview. Each review reserves its token before it is made, so concurrency cannot spend
/// more: a peer costs at most 20 reviews, then one a second.
pub(crate) const AUTH_FAILURE_BURST: u32 = 20;
/// Failed authentications per second a peer may make after its burst.
pub(crate) const AUTH_FAILURES_PER_SECOND: f64 = 1.0;
/// TokenReviews in flight for one peer address: a node's controllers starting together are
/// reviewed four at a time (a token already reviewed is answered from the cache, not counted).
pub(crate) const REVIEWS_IN_FLIGHT_PER_PEER: usize = 4;
/// TokenReviews in flight from the gRPC port in all: each is an API request (and, under load,
/// an API connection), so this bounds both whatever strangers send.
pub(crate) const REVIEWS_IN_FLIGHT: usize = 16;
/// Connect streams of one tenant waiting for their Register: replicas reconnecting together
/// after a leader change fit; a tenant opening thousands of silent streams does not.
pub(crate) const PENDING_CONNECTS_PER_TENANT: usize = 64;
/// Connect streams waiting for their Register in all (each costs a task and its stream's
/// buffers, about 14 KiB: 512 are about 7 MiB).
pub(crate) const PENDING_CONNECTS: usize = 512;

impl ServiceState {
    /// RBAC mode: live registrations are re-authorized every `recheck` and revoked with
    /// PERMISSION_DENIED when access is gone, and a kind that does not exist is reported
    /// exactly as a denied one would be.
    pub(crate) fn with_rbac(mut self, recheck: Duration) -> Self {
        self.conceal_unserved = true;
        self.recheck = Some(recheck);
        self
    }

    /// Tokens that can expire or be revoked: each live session's token is authenticated again
    /// every `every` (and at its `exp`), and the session ends with CREDENTIALS_EXPIRED once it
    /// is no longer accepted.
    pub(crate) fn with_token_recheck(mut self, every: Duration) -> Self {
        self.token_recheck = Some(every);
        self
    }

    /// A service over `controllers`.
    pub(crate) fn new(
        controllers: Arc<ControllerTable>,
        client: kube::Client,
        authn: Arc<dyn Authenticator>,
        authz: Arc<dyn Authorizer>,
        leader: watch::Receiver<LeaderState>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        ServiceState {
            controllers,
            client,
            authn,
            authz,
            leader,
            discovered: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            metrics,
            conceal_unserved: false,
            recheck: None,
            token_recheck: None,
            peers: crate::throttle::PeerThrottle::new(
                AUTH_FAILURE_BURST,
                AUTH_FAILURES_PER_SECOND,
                REVIEWS_IN_FLIGHT_PER_PEER,
                REVIEWS_IN_FLIGHT,
            ),
            pending: crate::throttle::Slots::new(PENDING_CONNECTS_PER_TENANT, PENDING_CONNECTS),
            discovery: registering::DiscoveryBudget::default(),
            identity: String::new(),
            refusal_logs: Mutex::new(HashMap::new()),
            first_list_timeout: FIRST_LIST_TIMEOUT,
            ring: None,
        }
    }

    /// Ring mode: sessions are served by the member that owns their controller and sent there
    /// from any other.
    pub(crate) fn with_ring(mut self, ring: Arc<crate::members::Ring>) -> Self {
        self.ring = Some(ring);
        self
    }

    /// How long a registration waits for the first lists of all its caches before it is
    /// refused with UNAVAILABLE (`--first-list-timeout`).
    pub(crate) fn with_first_list_timeout(mut self, timeout: Duration) -> Self {
        self.first_list_timeout = timeout;
        self
    }

    /// This manager's Lease identity.
    pub(crate) fn with_identity(mut self, identity: &str) -> Self {
        self.identity = identity.to_string();
        self
    }

    /// The Lease holder when it is another manager (the new leader after this one lost it).
    fn other_leader(&self) -> Option<String> {
        let state = self.leader.borrow();
        state
            .holder
            .clone()
            .filter(|h| !state.leading && !h.is_empty() && *h != self.identity)
    }

    /// The caller's identity. A token already decided (cached) is answered at once, whoever
    /// else sends junk from the same address; any other token reserves a review of its peer's
    /// budget first (given back when the token is accepted), so a peer address that keeps
    /// failing, or sends many at once, is refused before its tokens are looked at.
    async fn authenticate<T>(&self, req: &GrpcRequest<T>) -> Result<Identity, Status> {
        let token =
            bearer_token(req.metadata()).map_err(|e| Status::unauthenticated(e.to_string()))?;
        if let Some(known) = self.authn.cached(token) {
            return known.map_err(|e| Status::unauthenticated(e.to_string()));
        }
        let peer = req.remote_addr().map(|a| a.ip());
        let reservation = self
            .peers
            .reserve(peer, std::time::Instant::now())
            .map_err(|why| {
                self.metrics.auth_throttled("grpc", why.label());
                Status::resource_exhausted(why.message(peer))
            })?;
        match self.authn.authenticate(token).await {
            Ok(identity) => {
                reservation.succeeded(std::time::Instant::now());
                Ok(identity)
            }
            // An outage keeps the reservation spent too: retries must not hammer an API
            // server that is already failing.
            Err(e @ AuthError::Unavailable(_)) => Err(Status::unavailable(e.to_string())),
            Err(e) => Err(Status::unauthenticated(e.to_string())),
        }
    }

    /// A refused Connect: counted by tenant and code, and logged (at most once a second per
    /// tenant and code, the rest counted) so an operator sees who was refused and why.
    fn refused(&self, tenant: Option<&str>, status: &Status) {
        let tenant = tenant.unwrap_or("unauthenticated");
        let code = format!("{:?}", status.code());
        self.metrics.rejected(tenant, &code);
        let now = std::time::Instant::now();
        let mut logs = self.refusal_logs.lock();
        if logs.len() >= 4096 {
            logs.clear();
        }
        let log = logs
            .entry((tenant.to_string(), code.clone()))
            .or_insert_with(|| crate::throttle::LogEvery::new(Duration::from_secs(1)));
        if let Some(held_back) = log.hit(now) {
            tracing::info!(tenant, code = %code, held_back, reason = %status.message(), "registration refused");
        }
    }

    fn require_leader(&self) -> Result<(), Status> {
        let state = self.leader.borrow().clone();
        if state.leading {
            return Ok(());
        }
        let leader = state
            .holder
            .unwrap_or_else(|| "unknown (election in progress)".into());
        let mut status = Status::unavailable(format!(
            "this ctrlhub manager is a standby; the leader is {leader}. Reconnect (through the Service, which selects the leader) with backoff"
        ));
        if let Ok(v) = leader.parse() {
            status.metadata_mut().insert("ctrlhub-leader", v);
        }
        Err(status)
    }
}

/// The gRPC service: a cheap handle on [`ServiceState`].
#[derive(Clone)]
pub(crate) struct Service(pub Arc<ServiceState>);

impl std::ops::Deref for Service {
    type Target = ServiceState;
    fn deref(&self) -> &ServiceState {
        &self.0
    }
}

type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::ManagerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl ControllerManager for Service {
    type ConnectStream = ConnectStream;

    async fn connect(
        &self,
        req: GrpcRequest<Streaming<pb::ControllerMessage>>,
    ) -> Result<Response<ConnectStream>, Status> {
        match self.open(req).await {
            Ok(response) => Ok(response),
            Err(connect::Refused::Early(status, tenant)) => {
                self.refused(tenant.as_deref(), &status);
                Err(status)
            }
            Err(connect::Refused::Rejected(rejection, tenant)) => {
                self.refused(Some(&tenant), &rejection.status);
                let messages = futures::stream::iter(rejection.messages());
                Ok(Response::new(Box::pin(messages)))
            }
        }
    }

    async fn get(
        &self,
        req: GrpcRequest<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        self.read_one(req).await
    }

    async fn list(
        &self,
        req: GrpcRequest<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        self.read_many(req).await
    }
}

/// The bearer token of a request, without ever putting it into an error.
fn bearer_token(metadata: &tonic::metadata::MetadataMap) -> Result<&str, AuthError> {
    let Some(value) = metadata.get("authorization") else {
        return Err(AuthError::Missing);
    };
    let header = value.to_str().map_err(|_| AuthError::Malformed)?;
    let token = header
        .strip_prefix("Bearer ")
        .map(str::trim)
        .ok_or(AuthError::Malformed)?;
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(AuthError::Malformed);
    }
    Ok(token)
}
