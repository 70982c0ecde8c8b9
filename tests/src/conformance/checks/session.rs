//! The session's life: Drain on SIGTERM, Revoked, token rotation, and reconnecting after a
//! manager restart and a leader change.

use ctrlhub_proto::v1 as pb;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::work::replicas;
use super::{counter, end_of, find_start, key, ms_between, sessions, starts};
use crate::conformance::interface::{Directives, Event, SCOPE_LABEL};
use crate::conformance::proxy::Connection;
use crate::conformance::world::{
    Proc, Spawn, World, line, now_us, wait_events, wait_events_within, write_token,
};
use crate::conformance::{Failure, require};
use crate::replica::{Replica, configmaps, namespace_names, secs};
use crate::wait::{PATIENCE, POLL_INTERVAL, TimedOut};

/// Whether any session of a controller's `/status` entry is draining.
fn draining(c: &serde_json::Value) -> bool {
    c["sessionList"]
        .as_array()
        .is_some_and(|l| l.iter().any(|s| s["draining"] == serde_json::json!(true)))
}

/// Drain: SIGTERM lets the running reconcile finish and answer; nothing new starts on the
/// draining replica, nothing is re-delivered, and the process exits 0.
pub(super) async fn drain(w: &mut World) -> Result<(), Failure> {
    let ns = "drain";
    let procs = replicas(w, ns, 1).await?;
    let a = &procs[0];
    let k = key(ns, "slow");
    w.put(ns, "slow", true, &Directives::done().sleep_ms("1500"))
        .await?;
    let s = wait_events("the slow key started", &[a], |ev| {
        find_start(ev, &k, |_| true).cloned()
    })
    .await?;
    let sigterm_us = now_us();
    a.terminate();
    // The second replica joins once the manager stopped sending to the first, so new work
    // cannot go to the draining one. A session that ended instead of draining is judged below
    // by its reconcile, which it then did not finish.
    // The last replica leaving removes the controller from /status.
    w.wait_controller_entry(
        "the manager sees the session draining or gone",
        ns,
        &[],
        |c| c.is_none_or(|c| draining(c) || sessions(c) == 0),
    )
    .await?;
    let b = w.spawn(&Spawn::new(ns, ns, "r2"))?;
    w.put(ns, "after", true, &Directives::done()).await?;
    let k_after = key(ns, "after");
    wait_events("the second replica reconciles a new key", &[&b], |ev| {
        find_start(ev, &k_after, |_| true)
            .and_then(|s| end_of(ev, s))
            .cloned()
    })
    .await?;
    let status = a.wait_exit().await?;
    require(status.success(), || {
        format!(
            "a drained controller exits 0; it exited {status} (see {})",
            a.log.display()
        )
    })?;
    w.wait_controller("nothing queued or in flight", ns, &[&b], |c| {
        counter(c, "inFlight") == 0 && counter(c, "queued") == 0
    })
    .await?;
    judge_drain(&a.events()?, &b.events()?, &s, sigterm_us)
}

/// The reports of the draining replica `a` and of `b` after the drain.
fn judge_drain(a: &[Event], b: &[Event], s: &Event, sigterm_us: u64) -> Result<(), Failure> {
    let end = end_of(a, s);
    require(
        end.is_some_and(|e| e.outcome == "done" && e.ts_us >= sigterm_us),
        || {
            format!(
                "the in-flight reconcile must finish after SIGTERM and answer: {}",
                end.map_or("it never ended".into(), line)
            )
        },
    )?;
    let new = a.iter().find(|e| e.is_start() && e.ts_us > sigterm_us);
    require(new.is_none(), || {
        format!(
            "a draining replica must start nothing new: {}",
            new.map_or(String::new(), line)
        )
    })?;
    // When the second replica registers only after the first has gone, the controller starts
    // again and reconciles every object once (INITIAL_LIST, attempt 1: docs/protocol.md); a
    // lost result would come back as a REDELIVERY, a second attempt.
    let again = b
        .iter()
        .find(|e| e.is_start() && e.key == s.key && !fresh_start(e));
    require(again.is_none(), || {
        format!(
            "the drained key was re-delivered, so its result was lost: {}",
            again.map_or(String::new(), line)
        )
    })
}

/// A start of a controller that starts again after all its replicas had gone: a first attempt
/// for the initial list, nothing re-delivered.
fn fresh_start(e: &Event) -> bool {
    e.attempt == 1
        && e.reasons.iter().any(|r| r == "INITIAL_LIST")
        && !e.reasons.iter().any(|r| r == "REDELIVERY")
}

/// The registration of README section 2, as a raw replica sends it.
fn conformance_register(name: &str, ns: &str) -> pb::Register {
    pb::Register {
        controller_name: name.into(),
        mode: pb::register::Mode::Reconcile as i32,
        primary: Some(configmaps()),
        namespaces: Some(namespace_names(&[ns])),
        label_selector: Some(pb::LabelSelector {
            match_labels: [(SCOPE_LABEL.to_string(), "in".to_string())].into(),
            match_expressions: Vec::new(),
        }),
        include_object: true,
        resync_period: Some(secs(0.0)),
        request_deadline: Some(secs(10.0)),
        backoff: Some(pb::Backoff {
            base: Some(secs(0.2)),
            max: Some(secs(5.0)),
        }),
        max_in_flight: 1,
        ..Default::default()
    }
}

/// The sum of every `ctrlhub_rejected_registrations_total` series of the leader.
async fn rejected_registrations(w: &World) -> Result<f64, Failure> {
    let text = w.wait_leader().await?.try_metrics().await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("ctrlhub_rejected_registrations_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>()
        // An empty sum is -0.0.
        + 0.0)
}

/// A raw replica that answers Done to everything and notes whether its session ended.
struct Newcomer {
    ended: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Newcomer {
    fn serve(mut r: Replica) -> Newcomer {
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        let task = tokio::spawn(async move {
            loop {
                match r.recv().await {
                    Ok(Some(req)) => r.done(&req.id).await,
                    Ok(None) => {}
                    Err(()) => break,
                }
            }
            flag.store(true, Ordering::SeqCst);
        });
        Newcomer { ended, task }
    }
}

impl Drop for Newcomer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Revoked SUPERSEDED: in-flight work is cancelled, and the replica exits instead of
/// registering its outdated definition again.
pub(super) async fn revoked(w: &mut World) -> Result<(), Failure> {
    let ns = "revoked";
    let procs = replicas(w, ns, 1).await?;
    let a = &procs[0];
    let k = key(ns, "hang");
    w.put(ns, "hang", true, &Directives::done().sleep_ms("60000"))
        .await?;
    let s = wait_events("the hanging key started", &[a], |ev| {
        find_start(ev, &k, |_| true).cloned()
    })
    .await?;
    let rejected = rejected_registrations(w).await?;
    let newcomer = supersede(w, ns).await?;
    let within = Duration::from_secs(5);
    let end = wait_events_within("the superseded handler to stop", &[a], within, |ev| {
        end_of(ev, &s).cloned()
    })
    .await?;
    require(end.outcome == "cancelled", || {
        format!(
            "a revoked session's handler must be cancelled: {}",
            line(&end)
        )
    })?;
    waits_without_registering(w, a, &newcomer, rejected).await
}

/// Registers the same controller name, with the same identity, and a different definition
/// (the newest wins): the running replica is revoked with SUPERSEDED.
async fn supersede(w: &World, ns: &str) -> Result<Newcomer, Failure> {
    let token = std::fs::read_to_string(&w.token_file)
        .map_err(|e| Failure::Setup(format!("reading the token file: {e}")))?;
    let mut newer = conformance_register(ns, ns);
    newer.resync_period = Some(secs(3600.0));
    // A higher revision replaces the running definition (a lower or equal one would be
    // refused as outdated).
    newer.revision = 1;
    let leader = w.wait_leader().await?.grpc.clone();
    let bearer = format!("Bearer {}", token.trim());
    let replica = Replica::connect_with(&leader, newer, Some(&bearer))
        .await
        .map_err(|e| Failure::Setup(format!("registering the newer definition: {e}")))?;
    Ok(Newcomer::serve(replica))
}

/// For 10 s the superseded replica neither exits nor registers again (it waits 30 s, as an
/// outdated replica of a rollout does): registering would be refused while the newer
/// definition runs, and exiting would crash-loop it in a Deployment.
async fn waits_without_registering(
    w: &World,
    a: &Proc,
    newcomer: &Newcomer,
    rejected: f64,
) -> Result<(), Failure> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let now_rejected = rejected_registrations(w).await?;
        require(
            !newcomer.ended.load(Ordering::SeqCst) && now_rejected == rejected,
            || {
                format!(
                    "the superseded controller registered again within 10 s (the newer \
                 definition's session ended: {}; registrations refused: {rejected} -> \
                 {now_rejected}); it must wait 30 s",
                    newcomer.ended.load(Ordering::SeqCst)
                )
            },
        )?;
        if let Some(status) = a.exit_status() {
            return Err(Failure::Violation(format!(
                "a superseded controller must wait, not exit (it exited {status}): in a \
                 Deployment an exit restarts it and the rollout crash-loops"
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    a.terminate();
    let status = a.wait_exit().await?;
    require(status.success(), || {
        format!("a waiting superseded controller should exit 0 on SIGTERM (it exited {status})")
    })
}

/// Token rotation: the first token expires, the manager ends the session, and the controller
/// comes back with the token the file holds now.
pub(super) async fn token_rotation(w: &mut World) -> Result<(), Failure> {
    let ns = "token";
    w.namespace(ns).await?;
    let file = w.dir.join("token-rotation");
    // The token's `exp` is whole seconds (issue time rounded down, plus the lifetime), so it
    // expires no earlier than this.
    let expires_us = now_us() / 1_000_000 * 1_000_000 + 6_000_000;
    write_token(&file, &w.issue_token(Duration::from_secs(6))?)?;
    let a = w.spawn(&Spawn {
        token_file: Some(file.clone()),
        ..Spawn::new(ns, ns, "r1")
    })?;
    let first = w
        .wait_controller("registered with the first token", ns, &[&a], |c| {
            sessions(c) == 1
        })
        .await?;
    let first_session = first["sessionList"][0]["session"].clone();
    write_token(&file, &w.issue_token(Duration::from_secs(3600))?)?;
    let second = w
        .wait_controller(
            "registered again after the first token expired",
            ns,
            &[&a],
            |c| sessions(c) == 1 && c["sessionList"][0]["session"] != first_session,
        )
        .await?;
    require(now_us() >= expires_us, || {
        format!("the session was replaced before the first token expired: {second}")
    })?;
    let k = key(ns, "after");
    w.put(ns, "after", true, &Directives::done()).await?;
    wait_events("a key reconciled on the new session", &[&a], |ev| {
        find_start(ev, &k, |_| true)
            .and_then(|s| end_of(ev, s))
            .cloned()
    })
    .await?;
    a.require_running()
}

/// The proxy's refused connections since `since_us`.
fn refused(w: &World, since_us: u64) -> Vec<Connection> {
    w.proxy
        .connections()
        .into_iter()
        .filter(|c| c.to.is_none() && c.at_us >= since_us)
        .collect()
}

/// Waits until the controller has tried `n` times to connect while no manager leads, and
/// checks that the attempts are spaced like a backoff rather than a loop.
async fn retries_back_off(w: &World, a: &Proc, since_us: u64, n: usize) -> Result<(), Failure> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let tries = loop {
        let tries = refused(w, since_us);
        if tries.len() >= n {
            break tries;
        }
        a.require_running()?;
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut {
                what: format!("{n} connection attempts while no manager leads"),
                timeout: PATIENCE,
                last: format!("{} attempts", tries.len()),
            }
            .into());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    };
    let at: Vec<u64> = tries.iter().take(n).map(|c| c.at_us).collect();
    let gaps: Vec<f64> = at.windows(2).map(|p| ms_between(p[0], p[1])).collect();
    let span = ms_between(at[0], at[n - 1]);
    require(gaps.iter().all(|g| *g >= 25.0) && span >= 150.0, || {
        format!(
            "reconnect attempts must back off (gaps >= 25 ms, attempt {n} >= 150 ms after the \
             first); gaps were {gaps:?} ms"
        )
    })
}

/// Reconnect after a manager restart: SIGTERM to the only manager, a new one later.
pub(super) async fn reconnect_restart(w: &mut World) -> Result<(), Failure> {
    let ns = "restart";
    let procs = replicas(w, ns, 1).await?;
    let a = &procs[0];
    reconciles(w, a, ns, "before").await?;
    let mut old = w.take_leader().await?;
    let since = now_us();
    old.stop().await;
    w.put(ns, "during", true, &Directives::done()).await?;
    let backed_off = retries_back_off(w, a, since, 4).await;
    // A new manager whatever the verdict, so that the checks after this one have one.
    w.start_manager().await?;
    backed_off?;
    back_and_caught_up(w, ns, a, "the new manager", "no manager ran").await
}

/// Reconnect after a leader change: a standby, SIGKILL to the leader.
pub(super) async fn reconnect_leader(w: &mut World) -> Result<(), Failure> {
    let ns = "leader";
    w.start_manager().await?;
    let procs = replicas(w, ns, 1).await?;
    let a = &procs[0];
    reconciles(w, a, ns, "before").await?;
    let mut old = w.take_leader().await?;
    old.kill().await;
    w.put(ns, "during", true, &Directives::done()).await?;
    w.wait_leader().await?;
    back_and_caught_up(w, ns, a, "the new leader", "the Lease was orphaned").await
}

/// After a manager went away: the replica `a` registers with `manager` again, reconciles the
/// key `during` created while `gap`, and is still running.
async fn back_and_caught_up(
    w: &mut World,
    ns: &str,
    a: &Proc,
    manager: &str,
    gap: &str,
) -> Result<(), Failure> {
    w.wait_controller(&format!("registered with {manager}"), ns, &[a], |c| {
        sessions(c) == 1
    })
    .await?;
    let k = key(ns, "during");
    wait_events(&format!("the key created while {gap}"), &[a], |ev| {
        starts(ev, &k)
            .into_iter()
            .find_map(|s| end_of(ev, s))
            .cloned()
    })
    .await?;
    a.require_running()
}

/// The leader-election Lease every manager of the suite uses (the manager's defaults).
const LEASE: (&str, &str) = ("default", "ctrlhub-leader");

/// Reconnect after the leader steps down but keeps running (its Lease cannot be renewed): it
/// revokes its sessions (LEADERSHIP_LOST) and answers UNAVAILABLE from then on, so only a
/// controller that dials a new connection reaches the next leader through the Service.
pub(super) async fn reconnect_stepdown(w: &mut World) -> Result<(), Failure> {
    let ns = "stepdown";
    w.start_manager().await?;
    let procs = replicas(w, ns, 1).await?;
    let a = &procs[0];
    reconciles(w, a, ns, "before").await?;
    let old = w.wait_leader().await?.identity.clone();
    let faults = w.cluster.dc.faults();
    faults.freeze_lease(LEASE.0, LEASE.1);
    let stepped_down = wait_stepped_down(w, &old).await;
    // The standby must win the Lease once it can be written again: the old leader sleeps
    // through the heal, then carries on as a standby.
    w.manager(&old)?.signal("STOP");
    faults.unfreeze_lease(LEASE.0, LEASE.1);
    let new_leader = w.wait_leader().await.map(|m| m.identity.clone());
    w.manager(&old)?.signal("CONT");
    stepped_down?;
    require(new_leader? != old, || {
        format!("{old} led again after the heal")
    })?;
    w.put(ns, "during", true, &Directives::done()).await?;
    w.wait_controller("registered with the new leader", ns, &[a], |c| {
        sessions(c) == 1
    })
    .await?;
    let k = key(ns, "during");
    wait_events("a key reconciled through the new leader", &[a], |ev| {
        starts(ev, &k)
            .into_iter()
            .find_map(|s| end_of(ev, s))
            .cloned()
    })
    .await?;
    a.require_running()
}

/// Waits until manager `identity` says it no longer leads.
async fn wait_stepped_down(w: &World, identity: &str) -> Result<(), Failure> {
    let m = w.manager(identity)?;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while m.leading().await {
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut {
                what: format!("{identity} to step down when it cannot renew its Lease"),
                timeout: PATIENCE,
                last: "still leading".into(),
            }
            .into());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(())
}

/// Creates `name` and waits until `a` reconciled it.
async fn reconciles(w: &World, a: &Proc, ns: &str, name: &str) -> Result<(), Failure> {
    w.put(ns, name, true, &Directives::done()).await?;
    let k = key(ns, name);
    wait_events(&format!("{k} reconciled"), &[a], |ev| {
        find_start(ev, &k, |_| true)
            .and_then(|s| end_of(ev, s))
            .cloned()
    })
    .await?;
    Ok(())
}
