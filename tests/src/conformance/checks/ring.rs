//! Ring mode: a controller configured with a member that does not own it registers at the
//! owner, follows its controller when a joining member takes it over, and does not bounce for
//! ever between members whose views differ. A controller without redirect support
//! (`follows_redirects: false` in sdks.json) is held to what it can do: it converges through a
//! Service spreading its connections over the members, as the manager keeps answering.

use std::ops::RangeInclusive;
use std::time::Duration;

use super::work::no_overlap;
use super::{Verdict, end_of, key, ms_between, sessions, starts};
use crate::conformance::fake_member::{Arrival, RedirectLoop};
use crate::conformance::interface::Directives;
use crate::conformance::proxy::Connection;
use crate::conformance::service::ServiceProxy;
use crate::conformance::world::{Proc, Spawn, World, merged, now_us, wait_events};
use crate::conformance::{Failure, require};
use crate::wait::{PATIENCE, POLL_INTERVAL, TimedOut};

/// The rows the ring scenario decides.
pub(super) const RING_ROWS: &[&str] = &["ring-redirect", "ring-move"];

/// Replicas of the ring controller: two, so the move shows any overlap between them.
const REPLICAS: usize = 2;

/// The keys updated while the controller moves.
const CHURN_KEYS: usize = 4;

/// What the redirect row leaves for the move row.
struct Placed {
    name: String,
    /// The identity the third member will have, and which takes the controller over.
    joiner: String,
    owner: String,
    service: ServiceProxy,
    procs: Vec<Proc>,
}

/// Decides both rows: the move row needs the registration the redirect row makes.
pub(super) async fn ring(w: &mut World) -> Vec<Verdict> {
    match redirect(w).await {
        Ok(placed) => {
            let moved = honour_move(w, &placed).await;
            vec![("ring-redirect", Ok(())), ("ring-move", moved)]
        }
        Err(e) => vec![
            ("ring-redirect", Err(e)),
            (
                "ring-move",
                Err(Failure::Setup(
                    "the controller never registered at its owner (see ring-redirect)".into(),
                )),
            ),
        ],
    }
}

/// A controller name that the first two members place on one of them and a third member
/// `joiner` takes over, with that first owner.
fn moving_name(w: &World, two: &[String], joiner: &str) -> Result<(String, String), Failure> {
    let three: Vec<String> = two.iter().cloned().chain([joiner.to_string()]).collect();
    for i in 0..1000 {
        let name = format!("ring-{i}");
        if w.ring.owner_of(&name, &three)? == joiner {
            return Ok((w.ring.owner_of(&name, two)?, name));
        }
    }
    Err(Failure::Setup(format!(
        "no controller name the ring moves to {joiner}"
    )))
}

/// Follows a redirect: two members; the configured address reaches the one that does not own
/// the controller, and both replicas register at the owner and reconcile there.
async fn redirect(w: &mut World) -> Result<Placed, Failure> {
    while w.ring.members.len() < 2 {
        let letter = ["a", "b"][w.ring.members.len()];
        w.start_member(letter).await?;
    }
    w.ring.settled().await?;
    let two = w.ring.identities();
    let joiner = format!("{}-c", w.sdk.name);
    let (owner, name) = moving_name(w, &two, &joiner)?;
    let other = two
        .iter()
        .find(|m| **m != owner)
        .cloned()
        .unwrap_or_default();
    // A controller that follows redirects is configured with the member that does not own
    // it; one that does not gets a Service over both, starting with that member.
    let mut targets = vec![w.ring.address(&other)?];
    if !w.sdk.follows_redirects {
        targets.push(w.ring.address(&owner)?);
    }
    let service = ServiceProxy::start(targets)
        .await
        .map_err(|e| Failure::Setup(format!("starting the Service proxy: {e}")))?;
    let ns = name.as_str();
    w.namespace(ns).await?;
    w.put(ns, "before", true, &Directives::done()).await?;
    let procs = spawn(w, &name, &service, REPLICAS)?;
    let refs: Vec<&Proc> = procs.iter().collect();
    registered_at(w, &owner, &name, &refs, REPLICAS).await?;
    require_absent(w, &other, &name).await?;
    if w.sdk.follows_redirects {
        let through = service.connections();
        require(through.len() <= REPLICAS, || {
            format!(
                "each replica should dial the owner {owner} the redirect named, not come back \
                 through its configured address ({}): {} connections there for {REPLICAS} \
                 replicas",
                service.endpoint(),
                through.len()
            )
        })?;
    }
    reconciled(&refs, &key(ns, "before")).await?;
    Ok(Placed {
        name,
        joiner,
        owner,
        service,
        procs,
    })
}

/// Honours a move: a third member joins and takes the controller over; both replicas register
/// there at once (a follower without a new connection to its configured address), a key
/// created after the move is reconciled, and no key ever runs twice at once.
async fn honour_move(w: &mut World, p: &Placed) -> Result<(), Failure> {
    let ns = p.name.as_str();
    let refs: Vec<&Proc> = p.procs.iter().collect();
    let through_before = p.service.connections().len();
    for i in 0..CHURN_KEYS {
        w.put(ns, &format!("k{i}"), true, &churn(0)).await?;
    }
    let letter = p.joiner.rsplit('-').next().unwrap_or("c");
    let (joined, churned) = tokio::join!(w.launch_member(letter), keep_updating(w, ns));
    w.ring.members.push(joined?);
    churned?;
    if !w.sdk.follows_redirects {
        // A Service that now reaches every member, the joiner included.
        let all: Result<Vec<String>, Failure> = w
            .ring
            .identities()
            .iter()
            .map(|m| w.ring.address(m))
            .collect();
        p.service.set_targets(all?);
    }
    registered_at(w, &p.joiner, &p.name, &refs, REPLICAS).await?;
    require_absent(w, &p.owner, &p.name).await?;
    if w.sdk.follows_redirects {
        let through = p.service.connections();
        let back: Vec<&Connection> = through.iter().skip(through_before).collect();
        require(back.is_empty(), || {
            format!(
                "Revoked(UNIT_MOVED) names the new owner {}: the replicas should dial it at \
                 once, but {} connection(s) came back through the configured address",
                p.joiner,
                back.len()
            )
        })?;
    }
    let after = key(ns, "after-move");
    w.put(ns, "after-move", true, &Directives::done()).await?;
    reconciled(&refs, &after).await?;
    for p in &refs {
        p.require_running()?;
    }
    no_overlap(&merged(&refs)?)
}

/// Data for a churned key: a short sleep, and a counter that makes every update a change.
fn churn(round: usize) -> Directives {
    Directives::done()
        .sleep_ms("300")
        .with("round", &round.to_string())
}

/// Updates every churned key every 250 ms for 3 s: while the joiner starts and the
/// controller moves, work is in flight.
async fn keep_updating(w: &World, ns: &str) -> Result<(), Failure> {
    for round in 1..=12 {
        for i in 0..CHURN_KEYS {
            w.put(ns, &format!("k{i}"), true, &churn(round)).await?;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Starts `n` replicas of controller `name` (watching namespace `name`) configured with
/// `service`.
fn spawn(w: &World, name: &str, service: &ServiceProxy, n: usize) -> Result<Vec<Proc>, Failure> {
    (1..=n)
        .map(|i| {
            w.spawn(&Spawn {
                addr: Some(service.endpoint()),
                ..Spawn::new(name, name, &format!("r{i}"))
            })
        })
        .collect()
}

/// Waits until member `member` lists `n` sessions of controller `name`.
async fn registered_at(
    w: &World,
    member: &str,
    name: &str,
    procs: &[&Proc],
    n: usize,
) -> Result<(), Failure> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let entry = w.ring.controller(member, name).await?;
        if entry.as_ref().is_some_and(|c| sessions(c) == n) {
            return Ok(());
        }
        for p in procs {
            p.require_running()?;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut {
                what: format!("{n} replica(s) of {name} registered at its owner {member}"),
                timeout: PATIENCE,
                last: entry.map_or("no such controller".into(), |c| c.to_string()),
            }
            .into());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Member `member` (not the owner) has no session of controller `name`.
async fn require_absent(w: &World, member: &str, name: &str) -> Result<(), Failure> {
    let entry = w.ring.controller(member, name).await?;
    require(entry.as_ref().is_none_or(|c| sessions(c) == 0), || {
        format!(
            "{member} does not own {name}, yet it has a session of it: {}",
            entry.map_or(String::new(), |c| c.to_string())
        )
    })
}

/// Waits until a `start` of `key` has ended, in the reports of `procs`.
async fn reconciled(procs: &[&Proc], key: &str) -> Result<(), Failure> {
    wait_events(&format!("{key} reconciled"), procs, |ev| {
        starts(ev, key)
            .into_iter()
            .find_map(|s| end_of(ev, s))
            .cloned()
    })
    .await?;
    Ok(())
}

/// Stops after 3 redirects: two fake members redirect to each other for ever; the configured
/// address reaches the first. The controller makes at most 4 Registers per connection through
/// its configured address (the first there, 3 redirects followed), comes back to it only
/// after a backoff, and registers once the configured address reaches a real owner.
pub(super) async fn redirect_loop(w: &mut World) -> Result<(), Failure> {
    let name = "ring-loop";
    if w.ring.members.is_empty() {
        w.start_member("a").await?;
    }
    w.namespace(name).await?;
    let fakes = RedirectLoop::start()
        .await
        .map_err(|e| Failure::Setup(format!("starting the fake members: {e}")))?;
    let service = ServiceProxy::start(vec![fakes.addresses[0].clone()])
        .await
        .map_err(|e| Failure::Setup(format!("starting the Service proxy: {e}")))?;
    let procs = spawn(w, name, &service, 1)?;
    let a = &procs[0];
    let rounds = 3;
    let through = connections_through(&service, a, rounds + 1).await?;
    // A follower that made only one Register per round would pass the bound without ever
    // being in the loop it is about: it must have followed at least one redirect.
    let registers = if w.sdk.follows_redirects {
        2..=4
    } else {
        1..=1
    };
    let at: Vec<u64> = through[..=rounds].iter().map(|c| c.at_us).collect();
    judge_rounds(registers, &at, &fakes.arrivals())?;
    // The configured address now reaches the member that owns the controller.
    w.ring.settled().await?;
    let owner = w.ring.owner_of(name, &w.ring.identities())?;
    service.set_targets(vec![w.ring.address(&owner)?]);
    registered_at(w, &owner, name, &[a], 1).await?;
    let k = key(name, "after-loop");
    w.put(name, "after-loop", true, &Directives::done()).await?;
    reconciled(&[a], &k).await?;
    a.require_running()
}

/// Waits until `n` connections came through `service`.
async fn connections_through(
    service: &ServiceProxy,
    a: &Proc,
    n: usize,
) -> Result<Vec<Connection>, Failure> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let through = service.connections();
        if through.len() >= n {
            return Ok(through);
        }
        a.require_running()?;
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut {
                what: format!("{n} connections through the configured address"),
                timeout: PATIENCE,
                last: format!("{} connections", through.len()),
            }
            .into());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Each round (from one connection through the configured address to the next; `through`
/// holds when they came) brought the fakes a number of Registers in `registers` (at most 4: the
/// first and 3 redirects followed; 1 without redirect support), and each round began a
/// backoff (>= 25 ms) after the previous one's last Register.
fn judge_rounds(
    registers: RangeInclusive<usize>,
    through: &[u64],
    arrivals: &[Arrival],
) -> Result<(), Failure> {
    let mut counts = Vec::new();
    let mut gaps = Vec::new();
    for pair in through.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        let round: Vec<&Arrival> = arrivals
            .iter()
            .filter(|r| r.at_us >= from && r.at_us < to)
            .collect();
        counts.push(round.len());
        let last = round.last().map_or(from, |r| r.at_us);
        gaps.push(ms_between(last, to));
    }
    let per_fake: Vec<(String, usize)> = ["fake-a", "fake-b"]
        .iter()
        .map(|f| {
            (
                f.to_string(),
                arrivals.iter().filter(|r| r.member == *f).count(),
            )
        })
        .collect();
    let span = through.first().map_or(0.0, |t| ms_between(*t, now_us()));
    require(counts.iter().all(|c| registers.contains(c)), || {
        format!(
            "each round through the configured address should make {registers:?} Registers \
             (the first and at most 3 redirects followed at once; 1 without redirect support), \
             then go back there with backoff; rounds made {counts:?} (Registers per fake over \
             {span:.0} ms: {per_fake:?})"
        )
    })?;
    require(gaps.iter().all(|g| *g >= 25.0), || {
        format!(
            "after the redirects of a round the controller should come back to its configured \
             address after a backoff (>= 25 ms), not in a loop; gaps were {gaps:?} ms (rounds \
             {counts:?})"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registers at `fake` at each of `at_ms` (milliseconds).
    fn arrivals(at_ms: &[u64]) -> Vec<Arrival> {
        at_ms
            .iter()
            .enumerate()
            .map(|(i, ms)| Arrival {
                member: ["fake-a", "fake-b"][i % 2].into(),
                at_us: ms * 1000,
            })
            .collect()
    }

    #[test]
    fn rounds_of_four_a_backoff_apart_pass() {
        let through = [0, 200_000, 600_000];
        let seen = arrivals(&[1, 3, 5, 7, 201, 203, 205, 207]);
        assert!(judge_rounds(2..=4, &through, &seen).is_ok());
    }

    #[test]
    fn a_fifth_register_in_a_round_fails() {
        let through = [0, 200_000];
        let seen = arrivals(&[1, 3, 5, 7, 9]);
        let err = judge_rounds(2..=4, &through, &seen).expect_err("5 Registers in a round");
        assert!(err.to_string().contains("[5]"), "{err}");
    }

    #[test]
    fn coming_back_at_once_fails() {
        let through = [0, 10_000];
        let seen = arrivals(&[1, 3, 5, 7]);
        let err = judge_rounds(2..=4, &through, &seen).expect_err("no backoff");
        assert!(err.to_string().contains("backoff"), "{err}");
    }

    #[test]
    fn a_round_without_a_register_fails() {
        let through = [0, 200_000, 400_000];
        let seen = arrivals(&[1, 3, 5, 7]);
        assert!(judge_rounds(2..=4, &through, &seen).is_err());
    }

    #[test]
    fn a_client_without_redirects_makes_one_register_per_round() {
        let through = [0, 200_000];
        assert!(judge_rounds(1..=1, &through, &arrivals(&[1])).is_ok());
        assert!(judge_rounds(1..=1, &through, &arrivals(&[1, 3])).is_err());
    }

    #[test]
    fn a_follower_that_never_follows_fails() {
        let through = [0, 200_000];
        assert!(judge_rounds(2..=4, &through, &arrivals(&[1])).is_err());
    }
}
