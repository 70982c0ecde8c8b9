//! How work is handed out and answered: exclusive keys, redelivery, requeue-after, backoff,
//! terminal errors and deadlines.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::{QUIET, counter, end_of, find_start, key, ms_between, sessions, starts};
use crate::conformance::interface::{Directives, Event};
use crate::conformance::world::{
    Proc, Spawn, World, line, merged, stay_quiet, wait_events, wait_events_within,
};
use crate::conformance::{Failure, require};

/// Starts `n` replicas of controller `name` in namespace `name` and waits until the manager
/// lists them all.
pub(super) async fn replicas(w: &World, name: &str, n: usize) -> Result<Vec<Proc>, Failure> {
    replicas_with(w, name, n, |_| {}).await
}

/// [`replicas`] with the spawn settings adjusted by `tune`.
pub(super) async fn replicas_with(
    w: &World,
    name: &str,
    n: usize,
    tune: impl Fn(&mut Spawn),
) -> Result<Vec<Proc>, Failure> {
    w.namespace(name).await?;
    let mut procs = Vec::with_capacity(n);
    for i in 1..=n {
        let mut spawn = Spawn::new(name, name, &format!("r{i}"));
        tune(&mut spawn);
        procs.push(w.spawn(&spawn)?);
    }
    let refs: Vec<&Proc> = procs.iter().collect();
    w.wait_controller(
        &format!("{n} replica(s) of {name} registered"),
        name,
        &refs,
        |c| sessions(c) == n,
    )
    .await?;
    Ok(procs)
}

/// The `end` of `start`, waiting for it.
async fn wait_end(procs: &[&Proc], start: &Event) -> Result<Event, Failure> {
    let what = format!("the end of {}", line(start));
    wait_events(&what, procs, |ev| end_of(ev, start).cloned()).await
}

/// Exclusive: two replicas, twelve keys (400 ms reconciles) updated while they run, every connection cut once in
/// the middle; no key's reconciles overlap, across replicas and sessions.
pub(super) async fn exclusive(w: &mut World) -> Result<(), Failure> {
    let ns = "exclusive";
    let procs = replicas(w, ns, 2).await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    let final_rv = update_in_rounds(w, ns, &refs).await?;
    wait_events("every key reconciled at its final version", &refs, |ev| {
        final_rv
            .iter()
            .all(|(k, rv)| {
                starts(ev, k)
                    .iter()
                    .any(|s| &s.rv == rv && end_of(ev, s).is_some_and(|e| e.outcome == "done"))
            })
            .then_some(())
    })
    .await?;
    let events = merged(&refs)?;
    no_overlap(&events)?;
    let runs = events.iter().filter(|e| e.is_start()).count();
    require(runs >= 24, || {
        format!(
            "only {runs} reconciles for 12 keys updated 3 times: the scenario had no contention"
        )
    })?;
    for p in &procs {
        require(p.events()?.iter().any(Event::is_start), || {
            format!(
                "replica {} got no work: keys are not spread over the replicas",
                p.name
            )
        })?;
    }
    Ok(())
}

/// Writes 12 keys in 4 rounds, each round once about half of the previous one's reconciles
/// started, so that changes land on keys in flight on either replica; cuts every connection
/// after the second round, so that keys in flight are re-delivered while the old sessions'
/// handlers must stop. Returns each key's final resourceVersion.
async fn update_in_rounds(
    w: &World,
    ns: &str,
    procs: &[&Proc],
) -> Result<BTreeMap<String, String>, Failure> {
    let mut final_rv = BTreeMap::new();
    for round in 0..4 {
        for i in 0..12 {
            let name = format!("k{i:02}");
            let d = Directives::done()
                .sleep_ms("400")
                .with("round", &round.to_string());
            final_rv.insert(key(ns, &name), w.put(ns, &name, true, &d).await?);
        }
        wait_events("half of the round's keys started", procs, |ev| {
            let started = final_rv
                .iter()
                .filter(|(k, rv)| starts(ev, k).iter().any(|s| &&s.rv == rv))
                .count();
            (started >= 6).then_some(())
        })
        .await?;
        if round == 1 {
            w.proxy.cut();
        }
    }
    Ok(final_rv)
}

/// Fails when two reconciles of one key overlap in time (across every replica).
pub(super) fn no_overlap(events: &[Event]) -> Result<(), Failure> {
    let mut by_key: HashMap<&str, Vec<(&Event, u64)>> = HashMap::new();
    for s in events.iter().filter(|e| e.is_start()) {
        let end = end_of(events, s).map_or(u64::MAX, |e| e.ts_us);
        by_key.entry(&s.key).or_default().push((s, end));
    }
    for (k, mut runs) in by_key {
        runs.sort_by_key(|(s, _)| s.ts_us);
        for pair in runs.windows(2) {
            let ((a, a_end), (b, _)) = (pair[0], pair[1]);
            require(b.ts_us >= a_end, || {
                format!(
                    "key {k} was reconciled twice at once: {} (ended {}) overlaps {}",
                    line(a),
                    if a_end == u64::MAX {
                        "never".into()
                    } else {
                        a_end.to_string()
                    },
                    line(b)
                )
            })?;
        }
    }
    Ok(())
}

/// Redelivery: the replica working on a key is SIGKILLed; the other one gets it again.
pub(super) async fn redelivery(w: &mut World) -> Result<(), Failure> {
    let ns = "redelivery";
    let procs = replicas(w, ns, 2).await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    let k = key(ns, "victim");
    w.put(ns, "victim", true, &Directives::done().sleep_ms("60000,0"))
        .await?;
    let first = wait_events("attempt 1 started", &refs, |ev| {
        find_start(ev, &k, |s| s.attempt == 1).cloned()
    })
    .await?;
    let (holder, other) = if first.replica == "r1" {
        (&procs[0], &procs[1])
    } else {
        (&procs[1], &procs[0])
    };
    holder.kill();
    let again = wait_events(
        "the surviving replica starts the key again",
        &[other],
        |ev| find_start(ev, &k, |_| true).cloned(),
    )
    .await?;
    require(again.attempt == 2, || {
        format!(
            "a key whose worker died must come back as attempt 2: {}",
            line(&again)
        )
    })?;
    require(
        first.deadline_us > 0 && again.ts_us < first.deadline_us,
        || {
            format!(
                "redelivered {} ms after attempt 1's deadline ({}): the SIGKILLed session's work \
             should come back as soon as the session is lost",
                ms_between(first.deadline_us, again.ts_us),
                first.deadline_us
            )
        },
    )?;
    let end = wait_end(&[other], &again).await?;
    require(end.outcome == "done", || {
        format!("attempt 2 should succeed: {}", line(&end))
    })
}

/// Requeue-after: the next delivery comes no earlier than asked, as a fresh attempt.
pub(super) async fn requeue_after(w: &mut World) -> Result<(), Failure> {
    let ns = "requeue";
    let procs = replicas(w, ns, 1).await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    let k = key(ns, "poll");
    w.put(
        ns,
        "poll",
        true,
        &Directives::done().outcome("requeue:1200"),
    )
    .await?;
    let (end1, start2) = wait_events("a second delivery after the requeue", &refs, |ev| {
        let s = starts(ev, &k);
        let end1 = end_of(ev, s.first()?)?;
        Some((end1.clone(), (*s.get(1)?).clone()))
    })
    .await?;
    require(end1.outcome == "requeue", || {
        format!("the handler answered {}, not requeue", end1.outcome)
    })?;
    let gap = ms_between(end1.ts_us, start2.ts_us);
    require(gap >= 1200.0, || {
        format!("re-delivered {gap} ms after requeue_after 1200 ms: earlier than asked")
    })?;
    require(start2.attempt == 1, || {
        format!(
            "requeue_after is a success: the next attempt is 1, got {}",
            line(&start2)
        )
    })
}

/// Backoff: retries come after 200, 400, 800 ms; success resets the backoff and the attempt.
pub(super) async fn backoff(w: &mut World) -> Result<(), Failure> {
    let ns = "backoff";
    let procs = replicas(w, ns, 1).await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    let k = key(ns, "flaky");
    let d = Directives::done().outcome("error,error,error,done");
    let rv1 = w.put(ns, "flaky", true, &d.clone().with("v", "1")).await?;
    let runs = wait_runs(&refs, &k, &rv1, 4).await?;
    let outcomes: Vec<(u32, &str)> = runs
        .iter()
        .take(5)
        .map(|(s, e)| (s.attempt, e.outcome.as_str()))
        .collect();
    require(
        outcomes == [(1, "error"), (2, "error"), (3, "error"), (4, "done")],
        || format!("expected attempts 1-3 failing and 4 done, got (attempt, outcome) {outcomes:?}"),
    )?;
    for (n, pair) in runs.windows(2).enumerate() {
        let want = 200.0 * f64::from(1u32 << n);
        let gap = ms_between(pair[0].1.ts_us, pair[1].0.ts_us);
        require(gap >= want, || {
            format!(
                "retry {} came {gap} ms after the error, before the {want} ms backoff",
                n + 1
            )
        })?;
    }
    let rv2 = w
        .put(
            ns,
            "flaky",
            true,
            &Directives::done().outcome("error,done").with("v", "2"),
        )
        .await?;
    let runs = wait_runs(&refs, &k, &rv2, 2).await?;
    require(runs[0].0.attempt == 1, || {
        format!("success resets the attempt count: {}", line(&runs[0].0))
    })?;
    let gap = ms_between(runs[0].1.ts_us, runs[1].0.ts_us);
    require((200.0..1000.0).contains(&gap), || {
        format!(
            "after a success the backoff starts again at its 200 ms base (without the reset it \
             would be 1600 ms); the retry came after {gap} ms"
        )
    })
}

/// Waits for `n` finished reconciles of `k` that saw resourceVersion `rv`; returns them as
/// (start, end) in time order.
async fn wait_runs(
    procs: &[&Proc],
    k: &str,
    rv: &str,
    n: usize,
) -> Result<Vec<(Event, Event)>, Failure> {
    let what = format!("{n} finished reconciles of {k} at resourceVersion {rv}");
    wait_events(&what, procs, |ev| {
        let runs: Vec<(Event, Event)> = starts(ev, k)
            .into_iter()
            .filter(|s| s.rv == rv)
            .filter_map(|s| Some((s.clone(), end_of(ev, s)?.clone())))
            .collect();
        (runs.len() >= n).then_some(runs)
    })
    .await
}

/// Terminal: not retried by timers; the next change brings the key back as attempt 1.
pub(super) async fn terminal(w: &mut World) -> Result<(), Failure> {
    let ns = "terminal";
    let procs = replicas(w, ns, 1).await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    let k = key(ns, "broken");
    let rv1 = w
        .put(
            ns,
            "broken",
            true,
            &Directives::done().outcome("terminal").with("v", "1"),
        )
        .await?;
    let first = wait_runs(&refs, &k, &rv1, 1).await?.remove(0);
    require(first.1.outcome == "terminal", || {
        format!("the handler answered {}, not terminal", first.1.outcome)
    })?;
    w.wait_controller("the manager counts the terminal error", ns, &refs, |c| {
        counter(c, "terminal") >= 1
    })
    .await?;
    stay_quiet("a terminal error must not be retried", &refs, QUIET, |e| {
        e.is_start() && e.key == k && e.ts_us > first.0.ts_us
    })
    .await?;
    let rv2 = w
        .put(ns, "broken", true, &Directives::done().with("v", "2"))
        .await?;
    let again = wait_runs(&refs, &k, &rv2, 1).await?.remove(0);
    require(again.0.attempt == 1 && again.1.outcome == "done", || {
        format!(
            "a change after a terminal error is a fresh attempt 1 that succeeds: {} / {}",
            line(&again.0),
            line(&again.1)
        )
    })
}

/// Deadline: the handler is cancelled by its deadline, the late result never sent, and the key
/// comes back after the deadline.
pub(super) async fn deadline(w: &mut World) -> Result<(), Failure> {
    let ns = "deadline";
    let procs = replicas_with(w, ns, 1, |s| s.deadline_ms = 2_000).await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    let k = key(ns, "slow");
    w.put(ns, "slow", true, &Directives::done().sleep_ms("60000,0"))
        .await?;
    let s1 = wait_events("attempt 1 started", &refs, |ev| {
        find_start(ev, &k, |s| s.attempt == 1).cloned()
    })
    .await?;
    cancelled_at_deadline(&refs, &s1).await?;
    let s2 = wait_events("attempt 2", &refs, |ev| {
        find_start(ev, &k, |s| s.attempt == 2).cloned()
    })
    .await?;
    let e2 = wait_end(&refs, &s2).await?;
    require(s2.ts_us >= s1.deadline_us && e2.outcome == "done", || {
        format!(
            "attempt 2 comes after attempt 1's deadline and succeeds: {} / {}",
            line(&s2),
            line(&e2)
        )
    })?;
    let ends1 = merged(&refs)?
        .iter()
        .filter(|e| e.is_end() && e.id == s1.id && e.replica == s1.replica)
        .count();
    require(ends1 == 1, || {
        format!("attempt 1 ended {ends1} times: a cancelled handler must stop")
    })?;
    w.wait_controller("the manager counts the missed deadline", ns, &refs, |c| {
        counter(c, "deadlineMisses") >= 1
    })
    .await?;
    Ok(())
}

/// The handler of `s1` (which sleeps 60 s) ends `cancelled` close to its deadline.
async fn cancelled_at_deadline(procs: &[&Proc], s1: &Event) -> Result<(), Failure> {
    require(s1.deadline_us > s1.ts_us, || {
        format!(
            "the start line must carry the request's deadline: {}",
            line(s1)
        )
    })?;
    // Wait a little past the deadline, no longer: a handler still running then was not
    // cancelled.
    let left = Duration::from_micros(s1.deadline_us - s1.ts_us);
    let e1 = wait_events_within(
        "attempt 1 to be cancelled by its deadline",
        procs,
        left + Duration::from_secs(3),
        |ev| end_of(ev, s1).cloned(),
    )
    .await?;
    let late = ms_between(s1.deadline_us, e1.ts_us);
    require(
        e1.outcome == "cancelled" && (-1000.0..=300.0).contains(&late),
        || {
            format!(
                "attempt 1 should end cancelled between 1 s before and 300 ms after its deadline; \
             it ended {} {late} ms after it",
                e1.outcome
            )
        },
    )
}
