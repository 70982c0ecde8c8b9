//! Weighted rendezvous (highest random weight) hashing: which member owns a unit.
//!
//! Every member computes the same answer from the unit and the member list alone, with no
//! shared state: a member joining takes only the units it now scores highest on (none move
//! between the others), and a member leaving gives up exactly its own. Public so tests and
//! benchmarks compute the expected owner with the manager's own function.

use twox_hash::XxHash3_64;

/// One member of a ring, as the assignment sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    /// The member's identity (`--identity`, the pod name in a cluster).
    pub identity: String,
    /// Its relative share of units (`--member-weight`); 0 takes none while others exist.
    pub weight: u32,
}

/// The unit of assignment: one registered controller, keyed by its tenant group and name, so
/// that every identity of a group registering one name lands on the same member (the name
/// check and supersede are decided in one member's table).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Unit {
    /// The tenant group (the tenant whose limits the controller counts against).
    pub group: String,
    /// The controller's name.
    pub name: String,
}

impl Unit {
    /// The unit of `name` registered by tenant group `group`.
    pub fn new(group: &str, name: &str) -> Self {
        Unit {
            group: group.to_string(),
            name: name.to_string(),
        }
    }
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.group, self.name)
    }
}

/// The 64-bit hash of (ring, unit, member): xxh3, stable across releases and platforms, with a
/// NUL between fields so no two different tuples hash the same bytes.
fn hash(ring: &str, unit: &Unit, member: &str) -> u64 {
    let mut bytes =
        Vec::with_capacity(ring.len() + unit.group.len() + unit.name.len() + member.len() + 4);
    for part in [ring, &unit.group, &unit.name, member] {
        bytes.extend_from_slice(part.as_bytes());
        bytes.push(0);
    }
    XxHash3_64::oneshot(&bytes)
}

/// `member`'s score for `unit`: −w / ln(u) with u the hash mapped into (0, 1), the weighted
/// rendezvous score whose argmax picks each member with probability proportional to its weight.
fn score(ring: &str, unit: &Unit, member: &Member) -> f64 {
    // The midpoint of the hash's bucket: never 0 or 1, so ln is finite and negative.
    let u = (hash(ring, unit, &member.identity) as f64 + 0.5) / 18_446_744_073_709_551_616.0;
    -f64::from(member.weight) / u.ln()
}

/// A unit's 64-bit fingerprint, as members publish the units they hold: fixed-size whatever the
/// tenant and name, and no tenant's names in another member's Lease.
pub fn fingerprint(unit: &Unit) -> u64 {
    let mut bytes = Vec::with_capacity(unit.group.len() + unit.name.len() + 1);
    bytes.extend_from_slice(unit.group.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(unit.name.as_bytes());
    XxHash3_64::oneshot(&bytes)
}

/// The member of `members` that owns `unit` in ring `ring` (None when there is none). Ties, as
/// improbable as they are, go to the smaller identity so every member agrees.
pub fn owner<'a>(ring: &str, unit: &Unit, members: &'a [Member]) -> Option<&'a Member> {
    members.iter().max_by(|a, b| {
        score(ring, unit, a)
            .total_cmp(&score(ring, unit, b))
            .then_with(|| b.identity.cmp(&a.identity))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn members(names: &[&str]) -> Vec<Member> {
        names
            .iter()
            .map(|n| Member {
                identity: (*n).to_string(),
                weight: 100,
            })
            .collect()
    }

    fn units(n: usize) -> Vec<Unit> {
        (0..n)
            .map(|i| Unit::new(&format!("team-{}", i % 17), &format!("c{i}")))
            .collect()
    }

    fn owners(units: &[Unit], members: &[Member]) -> Vec<String> {
        units
            .iter()
            .map(|u| {
                owner("r", u, members)
                    .map(|m| m.identity.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn the_answer_depends_only_on_the_unit_and_the_member_set() {
        let us = units(200);
        let a = members(&["m-0", "m-1", "m-2"]);
        let mut b = a.clone();
        b.reverse();
        assert_eq!(
            owners(&us, &a),
            owners(&us, &b),
            "order of members does not matter"
        );
        assert_eq!(owner("r", &us[0], &[]), None);
        // Pinned: a change of hash or score would move every unit of a running ring on upgrade.
        let pinned = owners(&us[..6], &a);
        assert_eq!(pinned, ["m-1", "m-2", "m-2", "m-0", "m-1", "m-0"]);
    }

    #[test]
    fn a_join_moves_only_the_joiners_share_and_a_leave_only_the_leavers_units() {
        let us = units(10_000);
        let two = members(&["m-0", "m-1"]);
        let three = members(&["m-0", "m-1", "m-2"]);
        let (before, after) = (owners(&us, &two), owners(&us, &three));
        let moved: Vec<_> = before.iter().zip(&after).filter(|(b, a)| b != a).collect();
        assert!(moved.iter().all(|(_, a)| *a == "m-2"), "0 collateral moves");
        let share = moved.len() as f64 / us.len() as f64;
        assert!(
            (0.31..0.36).contains(&share),
            "about a third moves: {share}"
        );
        // Leaving is the same comparison the other way round.
        assert!(
            after
                .iter()
                .zip(&before)
                .filter(|(a, b)| a != b)
                .all(|(a, _)| *a == "m-2")
        );
    }

    #[test]
    fn weights_set_each_members_share() {
        let us = units(100_000);
        let mut ms = members(&["a", "b", "c"]);
        ms[0].weight = 200;
        let mut count: HashMap<String, usize> = HashMap::new();
        for o in owners(&us, &ms) {
            *count.entry(o).or_default() += 1;
        }
        let share = |m: &str| count[m] as f64 / us.len() as f64;
        assert!((share("a") - 0.5).abs() < 0.02, "{count:?}");
        assert!((share("b") - 0.25).abs() < 0.02, "{count:?}");
        assert!((share("c") - 0.25).abs() < 0.02, "{count:?}");
        // Weight 0 takes nothing while anyone else can.
        ms[2].weight = 0;
        assert!(owners(&us[..1000], &ms).iter().all(|o| o != "c"));
    }
}
