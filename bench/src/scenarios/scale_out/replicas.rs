//! The controllers' replicas: raw gRPC sessions in the harness' process that follow a ring
//! member's redirect by hand, as the protocol documents it (`ctrlhub-owner-addr` on a refusal,
//! `Revoked(UNIT_MOVED).owner_address` on a move, at most 3 hops in a row), and one shared log
//! of what every replica saw: sessions, first dispatches, revocations, and keys in flight.

use crate::env::widget_type;
use anyhow::{Result, bail};
use ctrlhub_proto::v1 as pb;
use ctrlhub_tests::PATIENCE;
use ctrlhub_tests::replica::{Replica, done_message, key, register};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How long each reconcile "works"; it finishes that work even when its session has ended
/// meanwhile, as a real controller would (what makes a double dispatch visible).
const WORK: Duration = Duration::from_millis(10);
/// A Connect that has not answered Registered by then is given up (a member shutting down may
/// hold a new stream open without answering).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Redirects followed in a row without a Registered (the SDKs' rule).
const MAX_HOPS: u32 = 3;
/// Longer than any run: a session is served until it ends.
const FOREVER: Duration = Duration::from_secs(24 * 3600);

/// What a replica saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A session registered at the member.
    Registered,
    /// The session's first reconcile request.
    FirstDispatch,
    /// `Revoked`, naming the next owner's address when the unit moved.
    Revoked(Option<String>),
    /// The stream ended without a `Revoked` (the member died).
    Ended,
}

/// One entry of the log.
#[derive(Debug, Clone)]
pub struct Entry {
    /// When.
    pub at: Instant,
    /// The controller.
    pub controller: String,
    /// The member's address (host:port).
    pub member: String,
    /// What.
    pub seen: Seen,
}

/// The replicas' shared log.
#[derive(Default)]
pub struct Log {
    /// Where a replica dials when no member named an address: the live members in turn, as a
    /// Service in front of them would pick.
    pub members: Vec<String>,
    /// (controller, key) being worked on right now, and by how many replicas.
    in_flight: HashMap<(String, String), u32>,
    /// Dispatches of a (controller, key) already in flight at another replica.
    pub overlaps: u64,
    /// Every reconcile request received.
    pub dispatched: u64,
    /// Sessions, first dispatches, revocations, ends.
    pub entries: Vec<Entry>,
}

/// The log, shared by every replica task.
pub type Shared = Arc<Mutex<Log>>;

impl Log {
    /// A log whose replicas dial `members` first.
    pub fn serving(members: Vec<String>) -> Shared {
        Arc::new(Mutex::new(Log {
            members,
            ..Default::default()
        }))
    }

    fn note(&mut self, controller: &str, member: &str, seen: Seen) {
        self.entries.push(Entry {
            at: Instant::now(),
            controller: controller.to_string(),
            member: member.to_string(),
            seen,
        });
    }

    /// Keys in flight across all replicas.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// When `name` first saw a `Revoked` from `member` after `t0`.
    pub fn revoked_at(&self, name: &str, member: &str, t0: Instant) -> Option<Instant> {
        self.first_after(name, t0, |e| {
            e.member == member && matches!(e.seen, Seen::Revoked(_))
        })
        .map(|e| e.at)
    }

    /// When `name` first got a session's first request after `t0` from a member `at` accepts.
    pub fn first_dispatch_at(
        &self,
        name: &str,
        t0: Instant,
        at: impl Fn(&str) -> bool,
    ) -> Option<Instant> {
        self.first_after(name, t0, |e| at(&e.member) && e.seen == Seen::FirstDispatch)
            .map(|e| e.at)
    }

    /// The earliest entry for `controller` after `t0` matching `pick`.
    pub fn first_after(
        &self,
        controller: &str,
        t0: Instant,
        pick: impl Fn(&Entry) -> bool,
    ) -> Option<&Entry> {
        self.entries
            .iter()
            .filter(|e| e.controller == controller && e.at >= t0)
            .find(|e| pick(e))
    }
}

/// A controller's registration: Widgets in `namespace` (all when None), optionally with a
/// predicate.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Controller name.
    pub name: String,
    /// Its namespace, or every namespace.
    pub namespace: Option<String>,
    /// A predicate on the primary (the memory phase's, which no object passes).
    pub predicate: Option<pb::Predicate>,
}

impl Spec {
    fn register(&self) -> pb::Register {
        let mut r = register(&self.name, widget_type(), 8, self.namespace.as_deref());
        r.predicate = self.predicate.clone();
        r
    }
}

/// Connects to `target` (host:port) and registers `spec`: the replica, or Err with the owner's
/// address when the member redirected (None for any other refusal or a timeout).
pub async fn connect(target: &str, spec: &Spec) -> Result<Replica, Option<String>> {
    let endpoint = format!("http://{target}");
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        Replica::connect(&endpoint, spec.register()),
    )
    .await
    {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(status)) => {
            let owner = status
                .metadata()
                .get("ctrlhub-owner-addr")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            // A member not ready (UNAVAILABLE) is routine around a move; anything else is
            // worth a line on stderr.
            if owner.is_none() && status.code() != tonic::Code::Unavailable {
                eprintln!("  {} refused at {target}: {status:?}", spec.name);
            }
            Err(owner)
        }
        Err(_) => Err(None),
    }
}

/// Starts a replica of `spec` that stays registered until aborted; `seed` spreads the first
/// dials over the members.
pub fn spawn(log: Shared, spec: Spec, seed: usize) -> JoinHandle<()> {
    tokio::spawn(async move { replica(log, spec, seed).await })
}

async fn replica(log: Shared, spec: Spec, mut turn: usize) {
    let mut next: Option<String> = None;
    let mut hops = 0;
    loop {
        let target = match next.take() {
            Some(t) => t,
            None => {
                let members = log.lock().members.clone();
                if members.is_empty() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                turn += 1;
                members[turn % members.len()].clone()
            }
        };
        match connect(&target, &spec).await {
            Ok(r) => {
                hops = 0;
                next = serve(&log, &spec.name, &target, r).await;
            }
            Err(Some(owner)) if hops < MAX_HOPS => {
                hops += 1;
                next = Some(owner);
            }
            // Not ready, or bounced too often: through the "Service" again, after a pause.
            Err(_) => {
                hops = 0;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves the session until it ends; the address a `Revoked` named, if any.
async fn serve(log: &Shared, name: &str, member: &str, mut r: Replica) -> Option<String> {
    log.lock().note(name, member, Seen::Registered);
    let answers = r.answers();
    let mut first = true;
    loop {
        match r.next_message(FOREVER).await {
            Some(pb::manager_message::Message::Reconcile(req)) => {
                let k = (name.to_string(), key(&req));
                {
                    let mut l = log.lock();
                    l.dispatched += 1;
                    if std::mem::take(&mut first) {
                        l.note(name, member, Seen::FirstDispatch);
                    }
                    let n = l.in_flight.entry(k.clone()).or_default();
                    *n += 1;
                    if *n > 1 {
                        l.overlaps += 1;
                    }
                }
                let (log, answers) = (log.clone(), answers.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(WORK).await;
                    {
                        let mut l = log.lock();
                        if let Some(n) = l.in_flight.get_mut(&k) {
                            *n -= 1;
                            if *n == 0 {
                                l.in_flight.remove(&k);
                            }
                        }
                    }
                    let _ = answers.send(done_message(&req.id)).await;
                });
            }
            Some(pb::manager_message::Message::Revoked(rv)) => {
                let to = (!rv.owner_address.is_empty()).then_some(rv.owner_address);
                log.lock().note(name, member, Seen::Revoked(to.clone()));
                return to;
            }
            Some(_) => continue,
            None => {
                log.lock().note(name, member, Seen::Ended);
                return None;
            }
        }
    }
}

/// Connect → Registered → first reconcile request for `spec`, dialling `first` and following
/// redirects; (time taken, redirects followed). The session ends when this returns.
pub async fn time_to_first_request(first: &str, spec: &Spec) -> Result<(Duration, u32)> {
    let t0 = Instant::now();
    let mut target = first.to_string();
    let mut hops = 0;
    loop {
        match connect(&target, spec).await {
            Ok(mut r) => {
                let Some(req) = r.next(PATIENCE).await else {
                    bail!("{} registered at {target} but got no request", spec.name);
                };
                let took = t0.elapsed();
                r.done(&req.id).await;
                return Ok((took, hops));
            }
            Err(Some(owner)) if hops < MAX_HOPS => {
                hops += 1;
                target = owner;
            }
            Err(_) => bail!("{} was not registered at {target}", spec.name),
        }
    }
}
