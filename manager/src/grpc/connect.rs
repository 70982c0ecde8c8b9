//! One Connect stream, in order: authenticate → leader check (leader mode) → read Register →
//! route to the owning member (ring mode) → translate → authorize → attach to the controller →
//! reply Registered → re-check loop (under RBAC) → pump requests out and results in until
//! either side ends.

use super::convert;
use super::convert::{
    Rejection, bundle, credits, effective_to_pb, event_to_pb, inbound_error, msg, outcome_from_pb,
    readable_to_pb, request_to_pb, result_message, revoked_to_pb,
};
use super::registering::{Grant, denied, watched_resources};
use super::{ConnectStream, Service, bearer_token};
use crate::dispatch::controllers::{Attached, Terms};
use crate::dispatch::dispatcher::{Completion, Controller, Outbound, Outbox, RevokeReason};
use crate::informer::SyncError;
use crate::members::Route;
use crate::registration::{Invalid, Registration};
use crate::tenancy::namespace_gate::RbacNamespaceGate;
use crate::tenancy::{Identity, NamespaceGate};
use ctrlhub_proto::v1 as pb;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tonic::{Request as GrpcRequest, Response, Status, Streaming};

/// How long a new stream may take to send its Register. Every SDK sends it as the first
/// message right after opening the stream, so 10 s is generous even on a loaded node; a stream
/// waiting for it holds one of its tenant's pending slots (`PENDING_CONNECTS_PER_TENANT`) until
/// then, so this bounds how long a silent tenant keeps them.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Messages encoded for a session and not yet taken by the transport. Small, because the
/// session's outbox already buffers requests: a controller that stops reading pins at most this
/// plus the outbox plus HTTP/2's flow-control window.
const REPLY_BUFFER: usize = 4;

/// The most requests or events one batch carries, whatever a session asks for: a batch is one
/// message, and 64 keeps the largest (64 objects of include_object) well under the message limit
/// while already taking the per-message cost down by more than an order of magnitude.
pub(crate) const MAX_BATCH: u32 = 64;

/// How long an ending session waits to hand its final status to a controller that is not
/// reading before giving up on it.
const FINAL_STATUS_WAIT: Duration = Duration::from_secs(5);

/// What the session task sends to the controller.
type Replies = mpsc::Sender<Result<pb::ManagerMessage, Status>>;

/// Why a Connect was refused: before its Register was read (no token, a standby), answered with
/// a status alone; after, with `Rejected` and then the status.
pub(super) enum Refused {
    /// Refused from the request's headers; the tenant when the token was accepted.
    Early(Status, Option<String>),
    /// Refused once the Register was read, for this tenant.
    Rejected(Rejection, String),
}

impl Service {
    /// Authenticate, register and start a session (the body of Connect).
    pub(super) async fn open(
        &self,
        req: GrpcRequest<Streaming<pb::ControllerMessage>>,
    ) -> Result<Response<ConnectStream>, Refused> {
        let identity = self
            .authenticate(&req)
            .await
            .map_err(|s| Refused::Early(s, None))?;
        let tenant = self.controllers.group_of(&identity.tenant);
        let token = bearer_token(req.metadata()).map(str::to_owned).ok();
        if self.ring.is_none() {
            self.require_leader()
                .map_err(|s| Refused::Early(s, Some(tenant.clone())))?;
        }
        self.register(req.into_inner(), identity, token)
            .await
            .map_err(|r| Refused::Rejected(r, tenant))
    }

    /// Read the Register, check it, attach the session and start pumping.
    async fn register(
        &self,
        mut inbound: Streaming<pb::ControllerMessage>,
        identity: Identity,
        token: Option<String>,
    ) -> Result<Response<ConnectStream>, Rejection> {
        let register = self.read_register(&mut inbound, &identity).await?;
        // Before discovery and authorization: a member that does not own the controller spends
        // nothing on it.
        let moved = self.route(&identity, &register.controller_name)?;
        let registration = self.registration(&register, &identity).await?;
        let grant = self.authorize(&identity, &registration).await?;
        let credits = credits(register.max_in_flight);
        // A tenant's registrations that start informers list one after another.
        let turn = self
            .controllers
            .first_list_turn(&identity.tenant, &registration)
            .await;
        let terms = Terms {
            revision: register.revision,
            exclusive: register.exclusive_attempts,
            moved,
        };
        let attached = self.controllers.attach_gated(
            &identity.tenant,
            registration.clone(),
            (credits, terms),
            self.gate(grant, &identity, &registration),
        )?;
        self.wait_first_lists(&attached).await?;
        drop(turn);
        let session_id = format!("{}-{}", attached.controller.id.name, uuid::Uuid::new_v4());
        self.sessions.lock().insert(
            session_id.clone(),
            (identity.clone(), attached.controller.clone()),
        );
        tracing::info!(controller = %attached.controller.id, tenant = %attached.controller.group, session = %session_id, credits = attached.credits, exclusive = terms.exclusive, revision = terms.revision, "session attached");
        let registered = pb::Registered {
            session_id: session_id.clone(),
            leader_identity: self.leader.borrow().holder.clone().unwrap_or_default(),
            effective: Some(effective_to_pb(
                &register,
                &registration,
                attached.credits,
                self.controllers
                    .effective_namespaces(&registration)
                    .ok()
                    .flatten()
                    .as_deref(),
            )),
            readable: readable_to_pb(&registration),
            heartbeat_interval: terms
                .exclusive
                .then(|| pb_duration(self.heartbeat_interval())),
            hold: terms
                .exclusive
                .then(|| pb_duration(self.controllers.hold())),
            member_identity: self.identity.clone(),
        };
        let guards: Vec<AbortOnDrop> = [
            self.spawn_recheck(&identity, &attached),
            token.and_then(|t| self.spawn_token_check(t, &identity, &attached)),
        ]
        .into_iter()
        .flatten()
        .collect();
        let (tx, rx) = mpsc::channel(REPLY_BUFFER);
        let pump = Pump {
            service: self.clone(),
            controller: attached.controller,
            session: attached.session,
            session_id,
            tx,
            silence: terms.exclusive.then(|| self.controllers.hold()),
            max_batch: batch_size(register.max_batch),
        };
        tokio::spawn(pump.run(attached.outbound, inbound, registered, guards));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    /// Ring mode: serve here, or send the session to the member that owns its controller.
    /// Returns whether the controller moved here from another member (then it is admitted
    /// over tenant limits). Leader mode: always here, never moved.
    fn route(&self, identity: &Identity, name: &str) -> Result<bool, Rejection> {
        let Some(ring) = &self.ring else {
            return Ok(false);
        };
        let tenant = self.controllers.group_of(&identity.tenant);
        let unit = crate::members::hrw::Unit::new(&tenant, name);
        match ring.route(&unit) {
            Route::Serve => Ok(ring.moved_in(&unit)),
            Route::Redirect { identity, address } => {
                self.metrics.ring.redirected(&tenant);
                Err(Rejection::redirect(identity, address))
            }
            Route::NotReady(why) => Err(Status::unavailable(format!(
                "{why}; reconnect with backoff (through the Service, which reaches another member)"
            ))
            .into()),
        }
    }

    /// Wait until every informer of the session's controller has its first list, so that the
    /// registration starts from a full cache. An informer that cannot list (forbidden to the
    /// manager, a selector the API server refuses, a list that does not finish) fails this
    /// registration alone: the session is detached and the controller told why.
    async fn wait_first_lists(&self, attached: &Attached) -> Result<(), Rejection> {
        // One deadline for all of them: the timeout is what the controller waits, however many
        // caches its registration reads.
        let deadline = tokio::time::Instant::now() + self.first_list_timeout;
        for informer in attached.controller.informers() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if let Err(e) = informer.wait_synced(left).await {
                self.controllers
                    .detach_refused(&attached.controller, attached.session);
                tracing::warn!(controller = %attached.controller.id, error = %e, "registration refused: its informer could not start");
                let status = match e {
                    SyncError::OverBudget { .. } => {
                        self.metrics
                            .limit_hit(&attached.controller.group, "cached_bytes");
                        Status::resource_exhausted(format!(
                            "{e}; the registration was not kept: share informers between controllers (same kinds, namespaces and label selectors), narrow namespaces or selectors, or ask for a higher limit"
                        ))
                    }
                    SyncError::TimedOut { .. } => Status::unavailable(format!(
                        "{e}: a registration's caches get {:?} in all for their first lists (the manager's --first-list-timeout); the registration was not kept. A very large kind through a slow API server needs a longer timeout or a narrower registration (namespaces, label selector); retry later",
                        self.first_list_timeout
                    )),
                    _ => Status::unavailable(format!(
                        "{e}; the registration was not kept. Check the kind, namespaces and label selector, or retry later"
                    )),
                };
                return Err(status.into());
            }
        }
        self.controllers.check_cache_budget(attached)?;
        // Every cache the controller reads knows its objects: its keys may go out now.
        attached.controller.mark_synced();
        Ok(())
    }

    /// How often an exclusive session sends a heartbeat: a fifth of the hold, so a replica
    /// notices a lost manager after a few missed answers, well within the hold.
    fn heartbeat_interval(&self) -> Duration {
        self.controllers.hold() / 5
    }

    /// The first message, which must be Register, within [`REGISTER_TIMEOUT`]; meanwhile the
    /// stream holds one of its tenant's pending slots (RESOURCE_EXHAUSTED when none is free),
    /// and the kinds it names are charged to the tenant's discovery budget.
    async fn read_register(
        &self,
        inbound: &mut Streaming<pb::ControllerMessage>,
        identity: &Identity,
    ) -> Result<pb::Register, Rejection> {
        let tenant = self.controllers.group_of(&identity.tenant);
        let _pending = self.pending.take(tenant.clone()).map_err(|full| {
            self.metrics.limit_hit(&tenant, "pending_connects");
            Status::resource_exhausted(match full {
                crate::throttle::Full::Key => format!(
                    "tenant {tenant} already has {} Connect streams waiting for their Register; send Register as the first message of each stream, and retry with backoff",
                    self.pending.per_key()
                ),
                crate::throttle::Full::Total => format!(
                    "the manager already has {} Connect streams waiting for their Register; retry with backoff",
                    self.pending.total()
                ),
            })
        })?;
        let first = tokio::time::timeout(REGISTER_TIMEOUT, inbound.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "no Register message within {}s of opening the stream: send Register as the first message",
                    REGISTER_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| {
                if e.code() == tonic::Code::OutOfRange {
                    let tenant = self.controllers.group_of(&identity.tenant);
                    self.metrics.limit_hit(&tenant, "message_bytes");
                }
                inbound_error(e)
            })?
            .ok_or_else(|| Status::cancelled("the stream closed before Register"))?;
        // Counted like every later message, so the series says all that came in.
        self.metrics.grpc.connect_received(0);
        match first.message {
            Some(pb::controller_message::Message::Register(r)) => {
                self.charge_discovery(&tenant, &r)?;
                Ok(*r)
            }
            _ => Err(Invalid::new(
                "register",
                "the first message on a Connect stream must be Register",
            )
            .into()),
        }
    }

    /// The registration `register` asks for. Under RBAC a kind that is not served is answered
    /// exactly like a denied one, so tenants cannot probe what exists.
    async fn registration(
        &self,
        register: &pb::Register,
        identity: &Identity,
    ) -> Result<Registration, Rejection> {
        match self.translate(register).await {
            Ok(r) => Ok(r),
            Err(Invalid {
                unserved: Some((group, kind)),
                ..
            }) if self.conceal_unserved => {
                let ns = match register.namespaces.as_ref().and_then(|n| n.scope.as_ref()) {
                    Some(pb::namespace_scope::Scope::Names(n)) => {
                        n.names.first().cloned().unwrap_or_default()
                    }
                    _ => String::new(),
                };
                Err(denied(identity, &group, &kind, &ns, self.authz.deny_ttl()).into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The per-namespace RBAC check of a selector scope granted namespace by namespace.
    fn gate(
        &self,
        grant: Grant,
        identity: &Identity,
        registration: &Registration,
    ) -> Option<Arc<dyn NamespaceGate>> {
        (grant == Grant::PerNamespace).then(|| {
            Arc::new(RbacNamespaceGate::new(
                self.authz.clone(),
                identity.clone(),
                watched_resources(registration)
                    .map(|r| (r.group.clone(), r.plural.clone()))
                    .collect(),
            )) as Arc<dyn NamespaceGate>
        })
    }

    /// Under RBAC, re-authorizes the registration every re-check interval and revokes the
    /// controller's sessions once access is gone; stopped when the session ends.
    fn spawn_recheck(&self, identity: &Identity, attached: &Attached) -> Option<AbortOnDrop> {
        let every = self.recheck?;
        let (service, who, controller) =
            (self.clone(), identity.clone(), attached.controller.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match service.reauthorize(&who, &controller).await {
                    Err(denied) if denied.code() == tonic::Code::PermissionDenied => {
                        tracing::warn!(controller = %controller.id, user = %who.username, "permission revoked; ending the registration's sessions");
                        controller.revoke_all(RevokeReason::PermissionRevoked, denied.message());
                        return;
                    }
                    // An API outage is not a revocation: keep the session, ask again.
                    _ => {}
                }
            }
        });
        Some(AbortOnDrop(task.abort_handle()))
    }
}

impl Service {
    /// Under TokenReview, authenticates the session's token again every re-check interval and
    /// at the token's own expiry, and ends this session (CREDENTIALS_EXPIRED) once it is
    /// expired, rejected (its ServiceAccount deleted, say) or names another identity.
    fn spawn_token_check(
        &self,
        token: String,
        identity: &Identity,
        attached: &Attached,
    ) -> Option<AbortOnDrop> {
        let every = self.token_recheck?;
        let (service, who, controller, session) = (
            self.clone(),
            identity.clone(),
            attached.controller.clone(),
            attached.session,
        );
        let expires = crate::tenancy::token_expiry(&token);
        let task = tokio::spawn(async move {
            let why = service.token_lapse(&token, &who, expires, every).await;
            tracing::info!(controller = %controller.id, user = %who.username, why = %why, "ending a session whose credentials lapsed");
            controller.revoke_session(session, RevokeReason::CredentialsExpired, &why);
        });
        Some(AbortOnDrop(task.abort_handle()))
    }

    /// Waits until `token` lapses and says why.
    async fn token_lapse(
        &self,
        token: &str,
        who: &Identity,
        expires: Option<std::time::SystemTime>,
        every: Duration,
    ) -> String {
        loop {
            let until_expiry = expires.map(|e| {
                e.duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO)
            });
            tokio::time::sleep(until_expiry.map_or(every, |d| d.min(every))).await;
            if expires.is_some_and(|e| e <= SystemTime::now()) {
                return "the session's token expired: reconnect with a fresh token (read the token file again on every connect; the kubelet rotates it)".into();
            }
            match self.authn.authenticate(token).await {
                Ok(now) if now.uid == who.uid && now.username == who.username => {}
                Ok(_) => return "the session's token now names another identity: reconnect".into(),
                // An outage is not a revocation: keep the session, ask again.
                Err(crate::tenancy::AuthError::Unavailable(_)) => {}
                Err(e) => return format!("{e} (checked again while the session was open)"),
            }
        }
    }
}

/// Stops the re-authorization task when its session ends.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What one turn of the pump got.
enum Next {
    Control(Option<Outbound>),
    Work(Option<Outbound>),
    Inbound(Result<Option<pb::ControllerMessage>, Status>),
    /// An exclusive session has been silent for the hold.
    Silent,
}

/// How many pieces of work one message to a session may carry: what it asked for, at most
/// [`MAX_BATCH`], and at least one (0 and 1 both mean no batches).
pub(crate) fn batch_size(asked: u32) -> usize {
    asked.clamp(1, MAX_BATCH) as usize
}

/// Sleeps until `at`, or for ever when there is none.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A duration as protobuf.
fn pb_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or_default()
}

/// What one turn of the pump decided.
enum Step {
    Continue,
    /// End the session, with this status unless it is None or OK (then the stream just ends).
    End(Option<Status>),
}

/// One attached session: forwards the controller's work out and applies its results as they
/// come in, until either side ends.
struct Pump {
    service: Service,
    controller: Arc<Controller>,
    session: u64,
    session_id: String,
    tx: Replies,
    /// An exclusive session that sends nothing (its heartbeats included) for this long is
    /// ended: its replica is gone or cut off, and stops on its own within the same hold.
    silence: Option<Duration>,
    /// How many pieces of work one message may carry (1: no batches).
    max_batch: usize,
}

impl Pump {
    async fn run(
        self,
        mut outbox: Outbox,
        mut inbound: Streaming<pb::ControllerMessage>,
        registered: pb::Registered,
        _guards: Vec<AbortOnDrop>,
    ) {
        let registered = pb::manager_message::Message::Registered(Box::new(registered));
        self.service.metrics.grpc.connect_sent(0);
        let _ = self.tx.send(Ok(msg(registered))).await;
        let mut heard = tokio::time::Instant::now();
        let end = loop {
            let silent_until = self.silence.map(|hold| heard + hold);
            let next = tokio::select! {
                // An ending session ends at once, whatever work is waiting.
                biased;
                control = outbox.control.recv() => Next::Control(control),
                out = outbox.work.next() => Next::Work(out),
                incoming = inbound.message() => Next::Inbound(incoming),
                _ = sleep_until_some(silent_until) => Next::Silent,
            };
            let step = match next {
                Next::Control(control) => self.control(control),
                Next::Work(out) => self.outbound(out, &mut outbox).await,
                Next::Inbound(incoming) => {
                    heard = tokio::time::Instant::now();
                    self.inbound(incoming)
                }
                Next::Silent => {
                    tracing::info!(controller = %self.controller.id, session = %self.session_id, "an exclusive session sent nothing for the hold period; ending it");
                    Step::End(Some(Status::unavailable(format!(
                        "no message from this replica for {}: the session is ended, and its unfinished keys move to other replicas once the hold is over; reconnect",
                        humantime::format_duration(self.silence.unwrap_or_default())
                    ))))
                }
            };
            if let Step::End(status) = step {
                break status;
            }
        };
        self.finish(end).await;
    }

    /// A Revoke or Drained: tells the controller (if it has room to hear it) and ends.
    fn control(&self, control: Option<Outbound>) -> Step {
        match control {
            Some(Outbound::Revoke { reason, message }) => {
                let next = self.next_member(reason);
                let (revoked, status) = revoked_to_pb(reason, message, next);
                // A controller that does not read has no room left: it just loses the stream.
                let _ = self
                    .tx
                    .try_send(Ok(msg(pb::manager_message::Message::Revoked(revoked))));
                Step::End(Some(status))
            }
            Some(Outbound::Drained) => Step::End(Some(Status::ok("drained"))),
            Some(_) | None => Step::End(None),
        }
    }

    /// Where a revoked session should go: the new owner of its controller (ring mode), or the
    /// new leader.
    fn next_member(&self, reason: RevokeReason) -> convert::Next {
        if let (RevokeReason::UnitMoved, Some(ring)) = (reason, &self.service.ring) {
            let unit =
                crate::members::hrw::Unit::new(&self.controller.group, &self.controller.id.name);
            return match ring.successor(&unit) {
                Some((identity, address)) => convert::Next::Owner { identity, address },
                None => convert::Next::Unknown,
            };
        }
        match self.service.other_leader() {
            Some(l) => convert::Next::Leader(l),
            None => convert::Next::Unknown,
        }
    }

    /// Forwards the controller's work, or ends the session. While the controller is not
    /// reading, the wait for room in the transport holds (so its outbox fills and dispatch
    /// passes it over), but a Revoke still ends it. Whatever reached the outbox during that wait
    /// leaves with `out` as one batch: batches cost a request no time, because nothing waits for
    /// one to fill.
    async fn outbound(&self, out: Option<Outbound>, outbox: &mut Outbox) -> Step {
        let first = match self.work_message(out) {
            None => return Step::Continue,
            Some(Err(step)) => return step,
            Some(Ok(m)) => m,
        };
        let permit = tokio::select! {
            biased;
            control = outbox.control.recv() => return self.control(control),
            permit = self.tx.reserve() => match permit {
                Ok(permit) => permit,
                Err(_) => return Step::End(None),
            },
        };
        let mut batch = vec![first];
        while batch.len() < self.max_batch {
            let Some(next) = outbox.work.try_next() else {
                break;
            };
            // Past its deadline (None) it was handed out again already; work never ends the
            // session (Err comes only from a closed channel, which try_next does not report).
            if let Some(Ok(m)) = self.work_message(Some(next)) {
                batch.push(m);
            }
        }
        self.service.metrics.grpc.connect_sent(batch.len());
        permit.send(Ok(msg(bundle(batch))));
        Step::Continue
    }

    /// The protobuf message for a piece of work; None when it is not to be sent (already past
    /// its deadline, which re-queued it); Err to end the session. Work outside the controller's
    /// scope never gets here: its outbox settles it (`dispatch`).
    fn work_message(
        &self,
        out: Option<Outbound>,
    ) -> Option<Result<pb::manager_message::Message, Step>> {
        let now = SystemTime::now();
        let message = match out {
            // It waited in the outbox past its deadline: it has been handed out again already.
            Some(Outbound::Reconcile(r)) if r.deadline <= now => return None,
            Some(Outbound::Event { deadline, .. }) if deadline <= now => return None,
            Some(Outbound::Reconcile(r)) => {
                pb::manager_message::Message::Reconcile(request_to_pb(&r))
            }
            Some(Outbound::Event {
                id,
                delivery,
                deadline,
                trace,
            }) => pb::manager_message::Message::Event(event_to_pb(&id, &delivery, deadline, trace)),
            // Control messages come on their own channel; the work channel only closes.
            Some(Outbound::Revoke { .. } | Outbound::Drained) | None => {
                return Some(Err(Step::End(None)));
            }
        };
        Some(Ok(message))
    }

    /// Applies one message from the controller, or ends the session.
    fn inbound(&self, incoming: Result<Option<pb::ControllerMessage>, Status>) -> Step {
        use pb::controller_message::Message as M;
        let c = &self.controller;
        let m = match incoming {
            Ok(Some(m)) => m,
            Ok(None) => return Step::End(None),
            // tonic refuses an oversized message before reading it (OUT_OF_RANGE); gRPC's code
            // for a message over the receiver's limit is RESOURCE_EXHAUSTED.
            Err(e) if e.code() == tonic::Code::OutOfRange => {
                self.service.metrics.limit_hit(&c.group, "message_bytes");
                return Step::End(Some(inbound_error(e)));
            }
            Err(e) => {
                tracing::debug!(controller = %c.id, error = %e, "session stream error");
                return Step::End(None);
            }
        };
        self.service
            .metrics
            .grpc
            .connect_received(match &m.message {
                Some(M::Results(batch)) => batch.results.len() + batch.acks.len(),
                Some(M::Result(_) | M::EventAck(_)) => 1,
                _ => 0,
            });
        match m.message {
            Some(M::Result(result)) => return self.result(&result),
            Some(M::Results(batch)) => {
                for ack in &batch.acks {
                    self.ack(ack);
                }
                for result in &batch.results {
                    if let step @ Step::End(_) = self.result(result) {
                        return step;
                    }
                }
            }
            Some(M::Credit(credit)) => {
                self.service
                    .controllers
                    .set_credits(c, self.session, credit.max_in_flight);
            }
            Some(M::Drain(d)) => {
                if d.retire {
                    c.mark_retiring();
                }
                c.drain(self.session)
            }
            Some(M::Heartbeat(beat)) => {
                // Answered at once, beside any work waiting; a replica that does not read its
                // stream gets no answer, and stops on its own within the hold.
                let echo = pb::manager_message::Message::Heartbeat(beat);
                if self.tx.try_send(Ok(msg(echo))).is_ok() {
                    self.service.metrics.grpc.connect_sent(0);
                    c.heartbeat_answered(self.session);
                }
            }
            Some(M::EventAck(ack)) => self.ack(&ack),
            Some(M::Register(_)) => {
                return Step::End(Some(Status::invalid_argument(
                    "register: a session registers once; open a new Connect stream to change the registration",
                )));
            }
            // An empty message, or a variant this manager does not know (a newer client):
            // ignoring it could stall a key until its deadline, so the proto makes it an error.
            None => {
                return Step::End(Some(Status::invalid_argument(
                    "message: empty or unknown ControllerMessage variant; this manager understands register, result, results, event_ack, credit, drain and heartbeat",
                )));
            }
        }
        Step::Continue
    }

    /// Applies one result (alone or from a batch); a result whose outcome cannot be read ends
    /// the session.
    fn result(&self, result: &pb::ReconcileResult) -> Step {
        let c = &self.controller;
        match outcome_from_pb(result) {
            Ok(outcome) => {
                let message = result_message(result);
                if c.complete(self.session, &result.id, outcome, message) == Completion::Discarded {
                    tracing::debug!(controller = %c.id, id = %result.id, "late or unknown result discarded");
                }
                Step::Continue
            }
            Err(e) => Step::End(Some(Status::invalid_argument(e.to_string()))),
        }
    }

    /// Applies one event acknowledgement (alone or from a batch).
    fn ack(&self, ack: &pb::EventAck) {
        let c = &self.controller;
        if c.ack(self.session, &ack.id) == Completion::Discarded {
            tracing::debug!(controller = %c.id, id = %ack.id, "late or unknown ack discarded");
        }
    }

    /// Detaches the session (its in-flight keys are re-queued) and ends the stream with `end`.
    async fn finish(self, end: Option<Status>) {
        self.service
            .controllers
            .detach(&self.controller, self.session);
        self.service.sessions.lock().remove(&self.session_id);
        let why = end.as_ref().map_or("the stream ended".to_string(), |s| {
            format!("{:?}: {}", s.code(), s.message())
        });
        tracing::info!(controller = %self.controller.id, tenant = %self.controller.group, session = %self.session_id, why = %why, "session ended");
        if let Some(status) = end
            && status.code() != tonic::Code::Ok
        {
            let _ = tokio::time::timeout(FINAL_STATUS_WAIT, self.tx.send(Err(status))).await;
        }
    }
}
