//! What one member knows of the others, from their Leases, and the rules it acts on — pure
//! functions of what was observed and the time, driven by hand in the unit tests.
//!
//! - A peer is **live** while its Lease was seen to change within its lease duration, by this
//!   member's own clock (never by the renewTime another machine wrote).
//! - The **view** is the set of members that units are assigned over: this member (unless it is
//!   leaving), and every live peer that is active and was seen renewing within the renew
//!   deadline (a peer that has not renewed for that long has stopped dispatching by its own
//!   rule, so its sessions are taken in here and wait).
//! - A member **publishes** a view in its own Lease only once it has released every unit that
//!   view does not give it (R1), and **dispatches** a unit only when it owns it under its own
//!   published view and no live peer's published view gives that peer the unit (R2). Two
//!   members that both publish, then both read, cannot both pass R2 for one unit: the later
//!   reader sees the earlier writer's claim.

use super::hrw::{Member, Unit, owner};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// A member's state as it publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Takes units.
    Active,
    /// Shutting down: takes no units; its published view still holds its claims until it has
    /// released them.
    Leaving,
}

impl State {
    /// The annotation value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Leaving => "leaving",
        }
    }

    /// From the annotation (anything unknown is read as leaving: it takes no units).
    pub(crate) fn parse(s: &str) -> Self {
        if s == "active" {
            State::Active
        } else {
            State::Leaving
        }
    }
}

/// What a member's Lease says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The member's identity.
    pub identity: String,
    /// Where its sessions are sent (host:port).
    pub address: String,
    /// Its weight.
    pub weight: u32,
    /// Active or leaving.
    pub state: State,
    /// The view it acts on: it may dispatch exactly the units this view gives it.
    pub view: Vec<Member>,
    /// How many units it owns, for status and alerts.
    pub units: u32,
    /// The fingerprints of the units registered there ([`super::hrw::fingerprint`]).
    pub held: Vec<u64>,
    /// Random per process start: a restarted member with the same identity is a new one.
    pub incarnation: String,
    /// The Lease's resourceVersion: a change is a renewal.
    pub resource_version: String,
    /// The Lease's duration.
    pub lease_duration: Duration,
}

/// A peer as observed.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    /// What its Lease said last.
    pub record: Record,
    /// When this member saw that Lease change last.
    pub seen: Instant,
}

impl Peer {
    /// Whether its claims still count at `now` (R3): a peer unrenewed for its whole lease
    /// stopped dispatching at its renew deadline, before that.
    pub(crate) fn live(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.seen) <= self.record.lease_duration
    }
}

/// Every other member, by identity, and the units live peers held lately.
#[derive(Debug, Default)]
pub(crate) struct Peers {
    peers: BTreeMap<String, Peer>,
    /// Fingerprint → when a live peer was last seen holding that unit.
    held: HashMap<u64, Instant>,
}

impl Peers {
    /// Take a full list of the ring's Leases read at `now` (this member's own left out by the
    /// caller): a peer whose Lease is gone is gone (it released everything); one whose
    /// resourceVersion is unchanged keeps the time it was last seen to change.
    pub(crate) fn observe(&mut self, records: Vec<Record>, now: Instant) {
        let mut next = BTreeMap::new();
        for record in records {
            let seen = match self.peers.get(&record.identity) {
                Some(p) if p.record.resource_version == record.resource_version => p.seen,
                _ => now,
            };
            let peer = Peer { record, seen };
            if peer.live(now) {
                for f in &peer.record.held {
                    self.held.insert(*f, now);
                }
            }
            next.insert(peer.record.identity.clone(), peer);
        }
        self.peers = next;
    }

    /// Whether a live peer held the unit of fingerprint `f` within `within` of `now`: the
    /// unit is moving here, not new.
    pub(crate) fn held_lately(&mut self, f: u64, now: Instant, within: Duration) -> bool {
        self.held
            .retain(|_, at| now.saturating_duration_since(*at) <= within);
        self.held.contains_key(&f)
    }

    /// Every peer observed, live or not.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Peer> {
        self.peers.values()
    }

    /// The peer named `identity`.
    pub(crate) fn get(&self, identity: &str) -> Option<&Peer> {
        self.peers.get(identity)
    }

    /// The members units are assigned over at `now`: `me` unless leaving, and every active
    /// peer seen renewing within `fresh`, sorted.
    pub(crate) fn view(&self, me: Option<&Member>, now: Instant, fresh: Duration) -> Vec<Member> {
        let mut view: Vec<Member> = self
            .peers
            .values()
            .filter(|p| p.record.state == State::Active)
            .filter(|p| now.saturating_duration_since(p.seen) <= fresh)
            .map(|p| Member {
                identity: p.record.identity.clone(),
                weight: p.record.weight,
            })
            .chain(me.cloned())
            .collect();
        view.sort();
        view
    }

    /// R2 without the own-Lease part: whether `me` may dispatch `unit` at `now`, having
    /// published `published`. No live peer may claim it under what it published. (The manager
    /// decides many units at once through [`Peers::claims_at`].)
    #[cfg(test)]
    pub(crate) fn may_dispatch(
        &self,
        ring: &str,
        unit: &Unit,
        (me, published): (&str, &[Member]),
        now: Instant,
    ) -> bool {
        self.claims_at(now)
            .may_dispatch(ring, unit, (me, published))
    }

    /// The live peer whose published view claims `unit` (whose release this member waits for).
    #[cfg(test)]
    pub(crate) fn claimant(&self, ring: &str, unit: &Unit, now: Instant) -> Option<&Peer> {
        self.claims_at(now).claimant(ring, unit)
    }

    /// The live peers at `now`, grouped by the view they published, for deciding many units at
    /// once: members that agree (the usual case) share one group, so whether any of them claims
    /// a unit costs one assignment per group instead of one per peer.
    pub(crate) fn claims_at(&self, now: Instant) -> Claims<'_> {
        let mut groups: Vec<(&[Member], Vec<&Peer>)> = Vec::new();
        for p in self.peers.values().filter(|p| p.live(now)) {
            let view = p.record.view.as_slice();
            match groups.iter_mut().find(|(v, _)| *v == view) {
                Some((_, peers)) => peers.push(p),
                None => groups.push((view, vec![p])),
            }
        }
        Claims { groups }
    }
}

/// The live peers' published claims, grouped by view ([`Peers::claims_at`]).
pub(crate) struct Claims<'a> {
    groups: Vec<(&'a [Member], Vec<&'a Peer>)>,
}

impl<'a> Claims<'a> {
    /// The live peer whose published view gives it `unit`: in each group, only the view's owner
    /// of the unit can claim it.
    pub(crate) fn claimant(&self, ring: &str, unit: &Unit) -> Option<&'a Peer> {
        self.groups.iter().find_map(|(view, peers)| {
            let o = owner(ring, unit, view)?;
            peers
                .iter()
                .copied()
                .find(|p| p.record.identity == o.identity)
        })
    }

    /// R2 without the own-Lease part (see [`Peers::may_dispatch`]).
    pub(crate) fn may_dispatch(
        &self,
        ring: &str,
        unit: &Unit,
        (me, published): (&str, &[Member]),
    ) -> bool {
        owner(ring, unit, published).is_some_and(|m| m.identity == me)
            && self.claimant(ring, unit).is_none()
    }
}

/// A view as published in the member Lease: `identity=weight` pairs, sorted, comma-separated.
pub(crate) fn encode_view(view: &[Member]) -> String {
    view.iter()
        .map(|m| format!("{}={}", m.identity, m.weight))
        .collect::<Vec<_>>()
        .join(",")
}

/// A published view read back; a malformed entry is skipped (it can claim nothing), never an
/// error that would stop this member from reading the others.
pub(crate) fn decode_view(s: &str) -> Vec<Member> {
    let mut view: Vec<Member> = s
        .split(',')
        .filter_map(|pair| {
            let (identity, weight) = pair.split_once('=')?;
            Some(Member {
                identity: identity.to_string(),
                weight: weight.parse().ok()?,
            })
        })
        .filter(|m| !m.identity.is_empty())
        .collect();
    view.sort();
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    const RING: &str = "r";
    const LEASE: Duration = Duration::from_secs(15);

    fn member(id: &str) -> Member {
        Member {
            identity: id.into(),
            weight: 100,
        }
    }

    fn record(id: &str, rv: &str, view: &[&str]) -> Record {
        Record {
            identity: id.into(),
            address: format!("{id}:9090"),
            weight: 100,
            state: State::Active,
            view: view.iter().map(|m| member(m)).collect(),
            units: 0,
            held: Vec::new(),
            incarnation: "i".into(),
            resource_version: rv.into(),
            lease_duration: LEASE,
        }
    }

    /// A unit `a` owns in the ring {a, b} and `b` owns in {b} alone: the one that moves when a
    /// joins b.
    fn moving_unit() -> Unit {
        (0..)
            .map(|i| Unit::new("t", &format!("c{i}")))
            .find(|u| {
                owner(RING, u, &[member("a"), member("b")]).is_some_and(|m| m.identity == "a")
            })
            .expect("some unit goes to a")
    }

    #[test]
    fn a_joiner_waits_until_the_old_owner_publishes_a_view_without_the_unit() {
        let t0 = Instant::now();
        let u = moving_unit();
        // a joined and published {a, b}; b still publishes {b}: b claims u.
        let mut at_a = Peers::default();
        at_a.observe(vec![record("b", "1", &["b"])], t0);
        let published_a = [member("a"), member("b")];
        assert!(!at_a.may_dispatch(RING, &u, ("a", &published_a), t0));
        assert_eq!(
            at_a.claimant(RING, &u, t0)
                .map(|p| p.record.identity.as_str()),
            Some("b")
        );
        // b sealed u and published {a, b}: a may go.
        at_a.observe(
            vec![record("b", "2", &["a", "b"])],
            t0 + Duration::from_secs(1),
        );
        assert!(at_a.may_dispatch(RING, &u, ("a", &published_a), t0 + Duration::from_secs(1)));
    }

    #[test]
    fn both_publish_then_both_read_and_at_most_one_dispatches() {
        let t0 = Instant::now();
        let u = moving_unit();
        // Each published before reading the other: each sees the other's publication.
        let (pa, pb) = ([member("a"), member("b")], [member("b")]);
        let mut at_a = Peers::default();
        at_a.observe(vec![record("b", "1", &["b"])], t0);
        let mut at_b = Peers::default();
        at_b.observe(vec![record("a", "1", &["a", "b"])], t0);
        let a = at_a.may_dispatch(RING, &u, ("a", &pa), t0);
        let b = at_b.may_dispatch(RING, &u, ("b", &pb), t0);
        assert!(!(a && b), "never both");
        assert!(!a && !b, "both wait until b publishes {{a, b}}");
    }

    #[test]
    fn a_silent_peer_leaves_the_view_at_the_renew_deadline_and_its_claims_at_its_lease() {
        let t0 = Instant::now();
        let u = moving_unit();
        let mut at_b = Peers::default();
        at_b.observe(vec![record("a", "1", &["a", "b"])], t0);
        let fresh = Duration::from_secs(10);
        let me = member("b");
        assert_eq!(
            at_b.view(Some(&me), t0, fresh),
            vec![member("a"), member("b")]
        );
        // The same resourceVersion again is not a renewal.
        at_b.observe(
            vec![record("a", "1", &["a", "b"])],
            t0 + Duration::from_secs(11),
        );
        let t11 = t0 + Duration::from_secs(11);
        assert_eq!(at_b.view(Some(&me), t11, fresh), vec![member("b")]);
        // b owns u in its view now, but a's claim holds until a's lease is over.
        assert!(!at_b.may_dispatch(RING, &u, ("b", &[member("b")]), t11));
        let t16 = t0 + Duration::from_secs(16);
        assert!(at_b.may_dispatch(RING, &u, ("b", &[member("b")]), t16));
    }

    #[test]
    fn a_leaving_peer_takes_no_units_but_its_claims_hold_until_it_publishes_or_goes() {
        let t0 = Instant::now();
        let u = moving_unit();
        let mut leaving = record("a", "2", &["a", "b"]);
        leaving.state = State::Leaving;
        let mut at_b = Peers::default();
        at_b.observe(vec![leaving], t0);
        let fresh = Duration::from_secs(10);
        assert_eq!(at_b.view(Some(&member("b")), t0, fresh), vec![member("b")]);
        assert!(!at_b.may_dispatch(RING, &u, ("b", &[member("b")]), t0));
        // Its Lease deleted: it released everything.
        at_b.observe(vec![], t0 + Duration::from_millis(500));
        assert!(at_b.may_dispatch(RING, &u, ("b", &[member("b")]), t0));
    }

    #[test]
    fn a_unit_counts_as_moving_while_a_live_peer_held_it_lately() {
        let t0 = Instant::now();
        let mut held = record("a", "1", &["a"]);
        held.held = vec![7];
        let mut at_b = Peers::default();
        at_b.observe(vec![held], t0);
        let window = Duration::from_secs(30);
        assert!(at_b.held_lately(7, t0, window));
        assert!(!at_b.held_lately(8, t0, window), "never held: new");
        // Released (a published without it, or its Lease went): still moving for the window.
        at_b.observe(vec![record("a", "2", &["a"])], t0 + Duration::from_secs(1));
        assert!(at_b.held_lately(7, t0 + Duration::from_secs(20), window));
        assert!(!at_b.held_lately(7, t0 + Duration::from_secs(32), window));
        // An expired peer's stale Lease refreshes nothing.
        let mut stale = record("c", "9", &["c"]);
        stale.held = vec![9];
        at_b.observe(vec![stale.clone()], t0);
        at_b.observe(vec![stale], t0 + Duration::from_secs(40));
        assert!(!at_b.held_lately(9, t0 + Duration::from_secs(40), window));
    }

    #[test]
    fn grouping_peers_by_view_names_the_same_claimants_as_asking_each_peer() {
        let t0 = Instant::now();
        let mut peers = Peers::default();
        // b and c agree; d lags behind with an older view; e has expired.
        let mut stale = record("e", "1", &["e"]);
        stale.lease_duration = Duration::from_secs(1);
        peers.observe(
            vec![
                record("b", "1", &["a", "b", "c", "d"]),
                record("c", "1", &["a", "b", "c", "d"]),
                record("d", "1", &["c", "d"]),
                stale,
            ],
            t0,
        );
        let now = t0 + Duration::from_secs(2);
        let claims = peers.claims_at(now);
        for i in 0..2000 {
            let u = Unit::new("t", &format!("c{i}"));
            let each = peers.peers.values().find(|p| {
                p.live(now)
                    && owner(RING, &u, &p.record.view)
                        .is_some_and(|m| m.identity == p.record.identity)
            });
            assert_eq!(
                claims.claimant(RING, &u).map(|p| &p.record.identity),
                each.map(|p| &p.record.identity),
                "{u}"
            );
        }
    }

    #[test]
    fn views_round_trip_and_junk_claims_nothing() {
        let view = vec![member("a"), member("b")];
        assert_eq!(decode_view(&encode_view(&view)), view);
        assert_eq!(decode_view(""), vec![]);
        assert_eq!(decode_view("a=x,=3,b"), vec![]);
        assert_eq!(State::parse("active"), State::Active);
        assert_eq!(State::parse("?"), State::Leaving);
    }
}
