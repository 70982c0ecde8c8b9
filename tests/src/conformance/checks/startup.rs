//! What a controller that owns children sees at startup and reads of them: no phantom DELETED
//! for a primary that exists, each key once per session, and children readable in the form
//! `Registered.readable` names.

use std::collections::BTreeMap;

use super::work::replicas_with;
use super::{QUIET, end_of, key, starts};
use crate::conformance::interface::{Directives, Event};
use crate::conformance::world::{Proc, Spawn, World, line, wait_events};
use crate::conformance::{Failure, require};

/// The startup rows: decided together by one scenario.
pub(super) const STARTUP_ROWS: &[&str] = &["startup-no-phantom-delete", "startup-once"];

/// How many keys (each owning a Lease), and how many fresh registrations of the controller.
const KEYS: usize = 6;
const RUNS: usize = 3;

/// Startup with owns: six keys each owning a Lease; the controller started, stopped and started
/// again three times. No start of theirs carries DELETED or a tombstone; every session starts
/// each key exactly once, first as INITIAL_LIST.
pub(super) async fn startup(w: &mut World) -> Vec<super::Verdict> {
    match startup_sessions(w).await {
        Ok(sessions) => vec![
            (STARTUP_ROWS[0], no_phantom_delete(&sessions)),
            (STARTUP_ROWS[1], once_per_session(&sessions)),
        ],
        Err(e) => {
            // The scenario failed before it could judge: both rows say why, as it was said.
            let (kind, why) = (e.kind(), e.to_string());
            STARTUP_ROWS
                .iter()
                .map(|r| {
                    let again = match kind {
                        "violation" => Failure::Violation(why.clone()),
                        _ => Failure::Setup(why.clone()),
                    };
                    (*r, Err(again))
                })
                .collect()
        }
    }
}

/// Runs the fresh registrations; returns each session's start lines of the keys.
async fn startup_sessions(w: &World) -> Result<Vec<Vec<Event>>, Failure> {
    let ns = "startup";
    w.namespace(ns).await?;
    for i in 0..KEYS {
        let name = format!("k{i}");
        w.put(ns, &name, true, &Directives::done()).await?;
        w.put_child(ns, &name, &format!("{name}-child"), "child")
            .await?;
    }
    let keys: Vec<String> = (0..KEYS).map(|i| key(ns, &format!("k{i}"))).collect();
    let mut sessions = Vec::new();
    for run in 1..=RUNS {
        let procs = replicas_with(w, ns, 1, |s: &mut Spawn| {
            s.replica = format!("run{run}");
            s.owns = Some("leases");
        })
        .await?;
        let p = &procs[0];
        let session = registered_session(p).await?;
        wait_events("every key reconciled once", &[p], |ev| {
            keys.iter()
                .all(|k| {
                    starts(ev, k)
                        .iter()
                        .any(|s| end_of(ev, s).is_some_and(|e| e.outcome == "done"))
                })
                .then_some(())
        })
        .await?;
        // A second delivery of a key at startup would come within this window.
        tokio::time::sleep(QUIET).await;
        p.require_running()?;
        let events = p.events()?;
        sessions.push(
            events
                .into_iter()
                .filter(|e| e.is_start() && keys.contains(&e.key) && e.session == session)
                .collect(),
        );
        p.terminate();
        p.wait_exit().await?;
    }
    Ok(sessions)
}

/// The session id of `p`'s `registered` line, waiting for it.
pub(super) async fn registered_session(p: &Proc) -> Result<String, Failure> {
    let r = wait_events("the replica's registered line", &[p], |ev| {
        ev.iter().find(|e| e.is_registered()).cloned()
    })
    .await?;
    require(!r.session.is_empty(), || {
        format!("a registered line must name its session: {}", line(&r))
    })?;
    Ok(r.session)
}

fn no_phantom_delete(sessions: &[Vec<Event>]) -> Result<(), Failure> {
    for starts in sessions {
        for s in starts {
            require(!s.has_reason("DELETED") && s.object != "tombstone", || {
                format!(
                    "a primary that exists was delivered as deleted at startup: {}",
                    line(s)
                )
            })?;
            require(s.object == "object", || {
                format!(
                    "a primary that exists was delivered without its object at startup: {}",
                    line(s)
                )
            })?;
        }
    }
    Ok(())
}

fn once_per_session(sessions: &[Vec<Event>]) -> Result<(), Failure> {
    for starts in sessions {
        let mut by_key: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
        for s in starts {
            by_key.entry(&s.key).or_default().push(s);
        }
        require(by_key.len() == KEYS, || {
            format!("a session started {} of {KEYS} keys", by_key.len())
        })?;
        for (k, runs) in by_key {
            require(runs.len() == 1, || {
                format!(
                    "key {k} started {} times in one session at startup: {}",
                    runs.len(),
                    runs.iter().map(|s| line(s)).collect::<Vec<_>>().join("; ")
                )
            })?;
            require(runs[0].has_reason("INITIAL_LIST"), || {
                format!(
                    "a key's startup delivery must be INITIAL_LIST: {}",
                    line(runs[0])
                )
            })?;
        }
    }
    Ok(())
}

/// An owned child read through the manager, in the form `Registered.readable` names: `leases`
/// owns them in full, `leases-metadata` asks for metadata only.
pub(super) async fn child_read(w: &mut World, owns: &'static str) -> Result<(), Failure> {
    let metadata = owns == "leases-metadata";
    let ns = if metadata {
        "children-metadata"
    } else {
        "children-full"
    };
    let procs = replicas_with(w, ns, 1, |s: &mut Spawn| s.owns = Some(owns)).await?;
    let p = &procs[0];
    let registered = wait_events("the registered line", &[p], |ev| {
        ev.iter().find(|e| e.is_registered()).cloned()
    })
    .await?;
    let want_form = if metadata { "metadata" } else { "full" };
    let form = registered
        .readable
        .as_ref()
        .and_then(|r| r["Lease"].as_str().map(str::to_string));
    require(form.as_deref() == Some(want_form), || {
        format!(
            "Registered.readable should list Lease as {want_form}: {}",
            line(&registered)
        )
    })?;
    w.put(ns, "parent", true, &Directives::done()).await?;
    w.put_child(ns, "parent", "parent-child", "holder-1")
        .await?;
    w.put(
        ns,
        "parent",
        true,
        &Directives::done().read_child("parent-child"),
    )
    .await?;
    let k = key(ns, "parent");
    let child = wait_events("the child read", &[p], |ev| {
        ev.iter()
            .filter(|e| e.is_end() && e.key == k)
            .find_map(|e| e.child.clone())
    })
    .await?;
    require(child["found"] == true, || {
        format!("the child was not found: {child}")
    })?;
    require(child["metadata_only"] == metadata, || {
        format!("GetResponse.metadata_only should be {metadata}: {child}")
    })?;
    let holder = child["holder"].as_str().unwrap_or_default();
    let want_holder = if metadata { "" } else { "holder-1" };
    require(holder == want_holder, || {
        format!("the child's spec.holderIdentity should read {want_holder:?}: {child}")
    })
}
