//! Ring mode: every replica is an active **member**, and each registered controller (a unit,
//! keyed by tenant group and name) is owned by exactly one member, chosen by weighted
//! rendezvous hashing ([`hrw`]) over the members that are live.
//!
//! Each member renews its own Lease and publishes in it the view of the ring it acts on
//! (`keeper`); what it knows of the others and the rules it dispatches by are pure functions
//! (`view`). A unit moves **release before acquire**: the old owner stops handing it out,
//! lets attempts in flight finish (up to `--handover-drain`), tells its sessions where to go
//! (`Revoked(UNIT_MOVED)`), and only then publishes a view without it; the new owner dispatches
//! it once no live peer's published view claims it. `Ring` is the handle the rest of the
//! manager uses: the owner of a unit (routing), one dispatch gate per unit, and the units to
//! seal.
//!
//! Owns: the member Lease, the view, the per-unit gates, the record of moves. May call:
//! `metrics`, the Kubernetes client (its own, on its own thread), and `leader` (the runtime
//! heartbeat and the Lease health readiness reports).

pub mod hrw;
pub(crate) mod keeper;
pub(crate) mod view;

use hrw::{Member, Unit, owner};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use view::{Peers, State};

/// Ring settings (`--ring-name`, `--member-address`, `--member-weight`, the Lease timings and
/// `--handover-drain`).
#[derive(Debug, Clone)]
pub(crate) struct RingConfig {
    /// The ring's name: the label value every member Lease carries, and the hash's salt.
    pub ring: String,
    /// Namespace of the member Leases.
    pub namespace: String,
    /// This member's identity.
    pub identity: String,
    /// Where other members send this member's sessions (host:port).
    pub address: String,
    /// This member's relative share of units.
    pub weight: u32,
    /// How long a member Lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long a member keeps trying to renew before it stops dispatching.
    pub renew_deadline: Duration,
    /// Interval between renewals.
    pub retry_period: Duration,
    /// How long a moving unit's attempts in flight may take to finish before they are abandoned.
    pub drain: Duration,
    /// The same when this member shuts down (`--shutdown-grace`).
    pub leave_drain: Duration,
}

impl RingConfig {
    /// The name of this member's Lease.
    pub(crate) fn lease_name(&self) -> String {
        format!("ctrlhub-member-{}", self.identity)
    }
}

/// Where a session for a unit belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// Here.
    Serve,
    /// At another member.
    Redirect {
        /// Its identity.
        identity: String,
        /// Its address (host:port).
        address: String,
    },
    /// Nowhere yet: this member holds no Lease, or is leaving with no one to send to.
    NotReady(&'static str),
}

/// One move, for the status page.
#[derive(Debug, Clone)]
pub(crate) struct Move {
    /// The unit.
    pub unit: Unit,
    /// `in` or `out`.
    pub direction: &'static str,
    /// The other member (the previous owner for `in`, the new one for `out`), when known.
    pub peer: Option<String>,
    /// How long the phase took (seal for `out`, acquire for `in`).
    pub took: Duration,
    /// When it finished (seconds since the Unix epoch).
    pub at: u64,
}

/// A unit's dispatch gate and when it was opened for the first time.
struct Gate {
    tx: watch::Sender<bool>,
    created: Instant,
    /// The peer that claimed it when it was created here (None: nobody, a fresh unit).
    from: Option<String>,
    opened: bool,
}

/// What the keeper last learnt.
struct Known {
    peers: Peers,
    /// The view as last written in this member's Lease.
    published: Vec<Member>,
    /// The peers were read at least once: until then this member publishes an empty view
    /// (claims nothing), so a member starting never stalls the others' units.
    read: bool,
    /// Renewed within the renew deadline.
    held: bool,
    leaving: bool,
}

/// The shared handle on this member's place in the ring.
pub(crate) struct Ring {
    config: RingConfig,
    incarnation: String,
    known: Mutex<Known>,
    gates: Mutex<HashMap<Unit, Gate>>,
    /// Units being sealed, since when.
    sealing: Mutex<BTreeMap<Unit, Instant>>,
    /// Fingerprints of units released lately, and when: still published as held for a while.
    released_lately: Mutex<HashMap<u64, Instant>>,
    moves: Mutex<VecDeque<Move>>,
    /// Controllers here whose gate waits for a peer's release (after the last refresh).
    acquiring: std::sync::atomic::AtomicUsize,
    /// Bumped after every keeper round: the sealer looks at the units again.
    rounds: watch::Sender<u64>,
    /// Wakes the keeper for an out-of-cycle renewal (a seal finished, leaving).
    publish_now: Notify,
    /// Wakes the keeper's wait between renewals: a controller started waiting for a release.
    pub(crate) poll_now: Notify,
    /// The member Lease is held (for what watches leadership in leader mode).
    held: watch::Sender<bool>,
    metrics: Arc<crate::metrics::Metrics>,
}

/// Moves kept for the status page.
const MOVES_KEPT: usize = 50;

impl Ring {
    /// A member that holds nothing yet.
    pub(crate) fn new(config: RingConfig, metrics: Arc<crate::metrics::Metrics>) -> Arc<Self> {
        Arc::new(Ring {
            config,
            incarnation: uuid::Uuid::new_v4().to_string()[..8].to_string(),
            known: Mutex::new(Known {
                peers: Peers::default(),
                published: Vec::new(),
                read: false,
                held: false,
                leaving: false,
            }),
            gates: Mutex::new(HashMap::new()),
            sealing: Mutex::new(BTreeMap::new()),
            released_lately: Mutex::new(HashMap::new()),
            moves: Mutex::new(VecDeque::new()),
            acquiring: std::sync::atomic::AtomicUsize::new(0),
            rounds: watch::channel(0).0,
            publish_now: Notify::new(),
            poll_now: Notify::new(),
            held: watch::channel(false).0,
            metrics,
        })
    }

    /// The settings.
    pub(crate) fn config(&self) -> &RingConfig {
        &self.config
    }

    fn me(&self) -> Member {
        Member {
            identity: self.config.identity.clone(),
            weight: self.config.weight,
        }
    }

    /// Whether the member Lease is held, as a channel (what `leading` is in leader mode).
    pub(crate) fn held(&self) -> watch::Receiver<bool> {
        self.held.subscribe()
    }

    /// Bumped after every keeper round.
    pub(crate) fn rounds(&self) -> watch::Receiver<u64> {
        self.rounds.subscribe()
    }

    /// The view units are assigned over now.
    fn view(&self, known: &Known, now: Instant) -> Vec<Member> {
        let me = (!known.leaving).then(|| self.me());
        known
            .peers
            .view(me.as_ref(), now, self.config.renew_deadline)
    }

    /// Where a session for `unit` belongs now.
    pub(crate) fn route(&self, unit: &Unit) -> Route {
        let known = self.known.lock();
        if !known.held {
            return Route::NotReady("this member does not hold its member Lease yet");
        }
        if !known.read {
            // Alone in its own view until then: it would take in every controller.
            return Route::NotReady("this member has not read the other members' Leases yet");
        }
        let view = self.view(&known, Instant::now());
        match owner(&self.config.ring, unit, &view) {
            Some(m) if m.identity == self.config.identity => Route::Serve,
            Some(m) => match known.peers.get(&m.identity) {
                Some(p) => Route::Redirect {
                    identity: m.identity.clone(),
                    address: p.record.address.clone(),
                },
                None => Route::NotReady("the owner's Lease was not read yet"),
            },
            None => Route::NotReady("this member is leaving and sees no other member"),
        }
    }

    /// The owner of `unit` other than this member, for a revoked session's next address.
    pub(crate) fn successor(&self, unit: &Unit) -> Option<(String, String)> {
        match self.route(unit) {
            Route::Redirect { identity, address } => Some((identity, address)),
            _ => None,
        }
    }

    /// Whether this member may dispatch `unit` now (R2 and its own Lease), given the live
    /// peers' `claims`.
    fn allowed(&self, known: &Known, claims: &view::Claims<'_>, unit: &Unit) -> bool {
        known.held
            && !self.sealing.lock().contains_key(unit)
            && claims.may_dispatch(
                &self.config.ring,
                unit,
                (&self.config.identity, &known.published),
            )
    }

    /// The dispatch gate of a new controller of `unit`: open while this member may dispatch it.
    pub(crate) fn gate(&self, unit: &Unit) -> watch::Receiver<bool> {
        let now = Instant::now();
        let known = self.known.lock();
        let claims = known.peers.claims_at(now);
        let allowed = self.allowed(&known, &claims, unit);
        let from = claims
            .claimant(&self.config.ring, unit)
            .map(|p| p.record.identity.clone());
        drop(claims);
        drop(known);
        let (tx, rx) = watch::channel(allowed);
        let gate = Gate {
            tx,
            created: now,
            from,
            opened: false,
        };
        self.gates.lock().insert(unit.clone(), gate);
        if allowed {
            self.opened(unit, now);
        } else {
            // Counted at once, not at the next round: the keeper reads the peers often while a
            // controller waits, so the release is seen promptly.
            self.acquiring
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.poll_now.notify_one();
        }
        rx
    }

    /// A gate opened for the first time: a unit that came from a peer has moved in.
    fn opened(&self, unit: &Unit, now: Instant) {
        let mut gates = self.gates.lock();
        let Some(gate) = gates.get_mut(unit) else {
            return;
        };
        if gate.opened {
            return;
        }
        gate.opened = true;
        if let Some(from) = gate.from.clone() {
            let took = now.saturating_duration_since(gate.created);
            drop(gates);
            self.record(Move {
                unit: unit.clone(),
                direction: "in",
                peer: Some(from),
                took,
                at: unix_now(),
            });
            self.metrics.ring.moved("in", "acquire", took);
        }
    }

    /// Re-evaluates every gate after a keeper round, drops those of controllers that are gone,
    /// and updates the series.
    fn refresh(&self) {
        let now = Instant::now();
        let known = self.known.lock();
        let mut opened = Vec::new();
        let (mut owned, mut acquiring, mut waiting) = (0, 0, 0);
        {
            // Grouped once per round: deciding every unit costs one assignment per distinct
            // published view, not one per peer.
            let claims = known.peers.claims_at(now);
            let mut gates = self.gates.lock();
            gates.retain(|_, g| g.tx.receiver_count() > 0);
            for (unit, gate) in gates.iter_mut() {
                let allowed = self.allowed(&known, &claims, unit);
                gate.tx
                    .send_if_modified(|v| std::mem::replace(v, allowed) != allowed);
                if allowed {
                    owned += 1;
                    if !gate.opened {
                        opened.push(unit.clone());
                    }
                } else if !self.sealing.lock().contains_key(unit) {
                    acquiring += 1;
                    if now.saturating_duration_since(gate.created) > self.config.lease_duration {
                        waiting += 1;
                    }
                }
            }
        }
        let members = self.view(&known, now).len();
        for p in known.peers.all() {
            let age = now.saturating_duration_since(p.seen);
            self.metrics
                .ring
                .set_peer(&p.record.identity, Some((age, p.record.units)));
        }
        drop(known);
        for unit in opened {
            self.opened(&unit, now);
        }
        let sealing = self.sealing.lock().len();
        self.acquiring
            .store(acquiring, std::sync::atomic::Ordering::Relaxed);
        self.metrics
            .ring
            .set_shape(members, (owned, acquiring, sealing), waiting);
        self.rounds.send_modify(|r| *r += 1);
    }

    /// The units of `present` (the controllers this member runs) that the current view gives
    /// another member and that are not being sealed yet: they are marked sealing (their gates
    /// close at once) and returned with their new owner, when known.
    pub(crate) fn to_seal(&self, present: &[Unit]) -> Vec<(Unit, Option<(String, String)>)> {
        let known = self.known.lock();
        let now = Instant::now();
        let view = self.view(&known, now);
        let leaving = known.leaving || !known.held;
        let mut out = Vec::new();
        let mut sealing = self.sealing.lock();
        for unit in present {
            let mine = owner(&self.config.ring, unit, &view)
                .is_some_and(|m| m.identity == self.config.identity);
            if (mine && !leaving) || sealing.contains_key(unit) {
                continue;
            }
            sealing.insert(unit.clone(), now);
            let next = owner(&self.config.ring, unit, &view)
                .filter(|m| m.identity != self.config.identity)
                .and_then(|m| known.peers.get(&m.identity))
                .map(|p| (p.record.identity.clone(), p.record.address.clone()));
            out.push((unit.clone(), next));
        }
        drop(sealing);
        drop(known);
        let gates = self.gates.lock();
        for (unit, _) in &out {
            if let Some(g) = gates.get(unit) {
                g.tx.send_if_modified(|v| std::mem::replace(v, false));
            }
        }
        out
    }

    /// `unit` is released (its controller retired here): it no longer holds back the next
    /// published view.
    pub(crate) fn released(&self, unit: &Unit, to: Option<String>) {
        self.released_lately
            .lock()
            .insert(hrw::fingerprint(unit), Instant::now());
        let since = self.sealing.lock().remove(unit);
        // The sealed controller's gate only: a controller of the same unit that registered
        // here again meanwhile (the ring changed back) keeps its own.
        let mut gates = self.gates.lock();
        if gates
            .get(unit)
            .is_some_and(|g| since.is_none_or(|s| g.created <= s))
        {
            gates.remove(unit);
        }
        drop(gates);
        if let Some(since) = since {
            let took = since.elapsed();
            self.metrics.ring.moved("out", "seal", took);
            self.record(Move {
                unit: unit.clone(),
                direction: "out",
                peer: to,
                took,
                at: unix_now(),
            });
        }
        self.publish_now.notify_one();
    }

    /// The view this member may publish now (R1): the current view once no unit it gives
    /// another member is still here, else the one already published.
    fn publishable(&self) -> Vec<Member> {
        let known = self.known.lock();
        if !known.read {
            return Vec::new();
        }
        let view = self.view(&known, Instant::now());
        let gates = self.gates.lock();
        let clear = gates.keys().all(|u| {
            owner(&self.config.ring, u, &view).is_some_and(|m| m.identity == self.config.identity)
        });
        if clear { view } else { known.published.clone() }
    }

    /// Whether `unit` is moving here from another member: a live peer published that it held
    /// it, within twice the lease. A moved unit is admitted whatever this member's tenant limits
    /// say; a new one is not.
    pub(crate) fn moved_in(&self, unit: &Unit) -> bool {
        let window = self.config.lease_duration * 2;
        self.known
            .lock()
            .peers
            .held_lately(hrw::fingerprint(unit), Instant::now(), window)
    }

    /// The fingerprints of the units here, as published in the member Lease (sorted hex).
    /// Units released within twice the lease stay listed: the new owner may not have read this
    /// Lease while they were here, and must still see that they moved (not new).
    fn held_fingerprints(&self) -> String {
        let window = self.config.lease_duration * 2;
        let mut held: Vec<u64> = self.gates.lock().keys().map(hrw::fingerprint).collect();
        {
            let mut released = self.released_lately.lock();
            released.retain(|_, at| at.elapsed() <= window);
            held.extend(released.keys().copied());
        }
        held.sort_unstable();
        held.dedup();
        held.iter()
            .map(|f| format!("{f:016x}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// What the keeper wrote: the view now published.
    fn published(&self, view: Vec<Member>) {
        self.known.lock().published = view;
    }

    /// Whether a controller here waits for a peer's release.
    pub(crate) fn acquiring(&self) -> bool {
        self.acquiring.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Whether this member is shutting down.
    pub(crate) fn is_leaving(&self) -> bool {
        self.known.lock().leaving
    }

    /// Start leaving: take no more units and publish that at once.
    pub(crate) fn leave(&self) {
        self.known.lock().leaving = true;
        self.publish_now.notify_one();
    }

    fn record(&self, m: Move) {
        tracing::info!(unit = %m.unit, direction = m.direction, peer = ?m.peer, took = ?m.took, "unit moved");
        let mut moves = self.moves.lock();
        if moves.len() == MOVES_KEPT {
            moves.pop_front();
        }
        moves.push_back(m);
    }

    /// What `/status` shows of the ring.
    pub(crate) fn status(&self) -> RingStatus {
        let now = Instant::now();
        let known = self.known.lock();
        let view = self.view(&known, now);
        let members = known
            .peers
            .all()
            .map(|p| PeerStatus {
                identity: p.record.identity.clone(),
                address: p.record.address.clone(),
                state: p.record.state.as_str(),
                weight: p.record.weight,
                units: p.record.units,
                renew_age: now.saturating_duration_since(p.seen),
                live: p.live(now),
                published: view::encode_view(&p.record.view),
            })
            .collect();
        let sealing = self.sealing.lock().clone();
        let units = self
            .gates
            .lock()
            .iter()
            .map(|(u, g)| {
                let state = if sealing.contains_key(u) {
                    "sealing"
                } else if *g.tx.borrow() {
                    "owned"
                } else {
                    "acquiring"
                };
                (u.clone(), state)
            })
            .collect();
        RingStatus {
            ring: self.config.ring.clone(),
            identity: self.config.identity.clone(),
            address: self.config.address.clone(),
            weight: self.config.weight,
            incarnation: self.incarnation.clone(),
            held: known.held,
            leaving: known.leaving,
            view: view::encode_view(&view),
            published: view::encode_view(&known.published),
            members,
            units,
            moves: self.moves.lock().iter().cloned().collect(),
        }
    }
}

/// A peer as `/status` shows it.
#[derive(Debug, Clone)]
pub(crate) struct PeerStatus {
    /// Identity.
    pub identity: String,
    /// Address.
    pub address: String,
    /// `active` or `leaving`.
    pub state: &'static str,
    /// Weight.
    pub weight: u32,
    /// The units it says it owns.
    pub units: u32,
    /// Since its Lease was last seen renewed.
    pub renew_age: Duration,
    /// Whether its claims still count.
    pub live: bool,
    /// The view it published.
    pub published: String,
}

/// This member's place in the ring, for `/status` and the page.
#[derive(Debug, Clone)]
pub(crate) struct RingStatus {
    /// The ring's name.
    pub ring: String,
    /// This member.
    pub identity: String,
    /// Its address.
    pub address: String,
    /// Its weight.
    pub weight: u32,
    /// Its incarnation.
    pub incarnation: String,
    /// Whether it holds its Lease.
    pub held: bool,
    /// Whether it is leaving.
    pub leaving: bool,
    /// The view it assigns units over.
    pub view: String,
    /// The view it last published.
    pub published: String,
    /// The other members.
    pub members: Vec<PeerStatus>,
    /// Its units and their states.
    pub units: Vec<(Unit, &'static str)>,
    /// The latest moves, oldest first.
    pub moves: Vec<Move>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// State as published by this member.
fn state_of(leaving: bool) -> State {
    if leaving {
        State::Leaving
    } else {
        State::Active
    }
}
