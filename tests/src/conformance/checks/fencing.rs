//! Exclusive means exclusive: a handler stuck past its deadline never runs beside its key's
//! re-delivery, in one process or across replicas; a replica cut off from the manager stops
//! before its key moves; a rolling upgrade of the definition converges without a crash, a lost
//! change or an overlap.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::startup::registered_session;
use super::work::{no_overlap, replicas_with};
use super::{end_of, find_start, key, starts};
use crate::conformance::interface::{Directives, Event};
use crate::conformance::world::{Proc, Spawn, World, line, merged, wait_events};
use crate::conformance::{Failure, require};

/// A stuck handler: attempt 1 blocks 4 s ignoring its 2 s deadline; attempt 2 must start only
/// after attempt 1's end, on whichever of `replicas` gets it.
pub(super) async fn stuck(w: &mut World, replicas: usize) -> Result<(), Failure> {
    let ns = if replicas == 1 {
        "stuck-one"
    } else {
        "stuck-two"
    };
    let procs = replicas_with(w, ns, replicas, |s: &mut Spawn| {
        s.deadline_ms = 2_000;
        s.max_in_flight = 2;
    })
    .await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    let k = key(ns, "stuck");
    w.put(ns, "stuck", true, &Directives::done().block_ms("4000,0"))
        .await?;
    let second = wait_events("attempt 2 ended", &refs, |ev| {
        let s = find_start(ev, &k, |s| s.attempt == 2)?;
        end_of(ev, s).map(|e| (s.clone(), e.clone()))
    })
    .await?;
    let events = merged(&refs)?;
    let first = find_start(&events, &k, |s| s.attempt == 1)
        .ok_or_else(|| Failure::Violation(format!("no attempt 1 of {k}")))?;
    let first_end = end_of(&events, first)
        .ok_or_else(|| Failure::Violation(format!("attempt 1 never ended: {}", line(first))))?;
    require(first_end.ts_us > first.deadline_us, || {
        format!(
            "attempt 1 should have overrun its deadline (it blocks 4 s): {}",
            line(first_end)
        )
    })?;
    require(second.0.ts_us >= first_end.ts_us, || {
        format!(
            "attempt 2 started while attempt 1 still ran: {} began before {}",
            line(&second.0),
            line(first_end)
        )
    })?;
    require(second.1.outcome == "done", || {
        format!("attempt 2 should succeed: {}", line(&second.1))
    })?;
    no_overlap(&events)
}

/// A partition: once a key's attempt started (a 30 s cancellable sleep under a 60 s deadline),
/// every connection is frozen. The replica hears no heartbeat answer and stops; the manager
/// hands the key out again only after the hold, on a new session, and the old attempt's end
/// comes first.
pub(super) async fn partition(w: &mut World) -> Result<(), Failure> {
    let ns = "partition";
    let procs = replicas_with(w, ns, 2, |s: &mut Spawn| s.deadline_ms = 60_000).await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    let k = key(ns, "cut-off");
    w.put(ns, "cut-off", true, &Directives::done().sleep_ms("30000,0"))
        .await?;
    let first = wait_events("attempt 1 started", &refs, |ev| {
        find_start(ev, &k, |s| s.attempt == 1).cloned()
    })
    .await?;
    w.proxy.freeze();
    let next = wait_events("the key delivered again", &refs, |ev| {
        let s = find_start(ev, &k, |s| s.attempt > 1)?;
        end_of(ev, s).map(|e| (s.clone(), e.clone()))
    })
    .await;
    // Frozen connections are dropped whatever happened.
    w.proxy.cut();
    let (again, again_end) = next?;
    let events = merged(&refs)?;
    let first_end = end_of(&events, &first).ok_or_else(|| {
        Failure::Violation(format!(
            "the cut-off attempt never ended (it must be cancelled when its manager goes silent): {}",
            line(&first)
        ))
    })?;
    require(first_end.outcome == "cancelled", || {
        format!(
            "the cut-off attempt should be cancelled: {}",
            line(first_end)
        )
    })?;
    require(again.ts_us >= first_end.ts_us, || {
        format!(
            "the key was delivered again while the cut-off attempt still ran: {} began before {}",
            line(&again),
            line(first_end)
        )
    })?;
    require(again.session != first.session, || {
        format!(
            "the re-delivery should come on a new session: {}",
            line(&again)
        )
    })?;
    require(again_end.outcome == "done", || {
        format!(
            "the re-delivered attempt should succeed: {}",
            line(&again_end)
        )
    })
}

/// How many keys the rollout updates, how often.
const ROLLOUT_KEYS: usize = 8;
const ROLLOUT_EVERY: Duration = Duration::from_millis(200);

/// A rolling definition upgrade: three replicas at revision 1 replaced one by one by replicas at
/// revision 2 with another deadline, while keys keep changing.
pub(super) async fn rollout(w: &mut World) -> Result<(), Failure> {
    let ns = "rollout";
    let old = replicas_with(w, ns, 3, |s: &mut Spawn| s.revision = Some(1)).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let writing = write_continuously(w, ns, stop.clone());
    let rolling = async {
        let rolled = roll(w, ns, &old).await;
        // The writes go on until the last old replica is gone, then end after their round.
        stop.store(true, Ordering::Relaxed);
        rolled
    };
    let (written, rolled) = futures::future::join(writing, rolling).await;
    let new = rolled?;
    let final_rv = written?;
    let all: Vec<&Proc> = old.iter().chain(new.iter()).collect();
    let new_refs: Vec<&Proc> = new.iter().collect();
    let new_sessions = sessions_of(&new_refs)?;
    wait_events(
        "every key reconciled at its final version by the new definition",
        &all,
        |ev| {
            final_rv
                .iter()
                .all(|(k, rv)| {
                    starts(ev, k).iter().any(|s| {
                        &s.rv == rv
                            && new_sessions.contains(&s.session)
                            && end_of(ev, s).is_some_and(|e| e.outcome == "done")
                    })
                })
                .then_some(())
        },
    )
    .await?;
    for p in &old {
        let status = p.wait_exit().await?;
        require(status.success(), || {
            format!(
                "an old replica exited {status} during the rollout: {}",
                p.log.display()
            )
        })?;
    }
    for p in &new {
        p.require_running()?;
    }
    no_overlap(&merged(&all)?)
}

/// Starts a revision-2 replica, waits for its registration, and stops an old one, three times.
async fn roll(w: &World, ns: &str, old: &[Proc]) -> Result<Vec<Proc>, Failure> {
    let mut new = Vec::new();
    for (i, retired) in old.iter().enumerate() {
        let mut spawn = Spawn::new(ns, ns, &format!("n{}", i + 1));
        spawn.revision = Some(2);
        spawn.deadline_ms = 9_000;
        let p = w.spawn(&spawn)?;
        registered_session(&p).await?;
        retired.terminate();
        retired.wait_exit().await?;
        new.push(p);
    }
    Ok(new)
}

/// Updates every key in turn every [`ROLLOUT_EVERY`] until `stop` (the rollout is over; at
/// most 60 s); returns each key's final resourceVersion.
async fn write_continuously(
    w: &World,
    ns: &str,
    stop: Arc<AtomicBool>,
) -> Result<BTreeMap<String, String>, Failure> {
    let mut final_rv = BTreeMap::new();
    for round in 0..300u64 {
        for i in 0..ROLLOUT_KEYS {
            let name = format!("k{i}");
            let d = Directives::done().with("round", &round.to_string());
            final_rv.insert(key(ns, &name), w.put(ns, &name, true, &d).await?);
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        tokio::time::sleep(ROLLOUT_EVERY).await;
    }
    Ok(final_rv)
}

/// The sessions `procs` registered.
fn sessions_of(procs: &[&Proc]) -> Result<Vec<String>, Failure> {
    Ok(merged(procs)?
        .into_iter()
        .filter(Event::is_registered)
        .map(|e| e.session)
        .collect())
}
