//! What a request carries and what a handler can read: cached reads, trace context and the
//! documented reasons.

use serde_json::{Value, json};

use super::work::{replicas, replicas_with};
use super::{Verdict, end_of, find_start, key, starts};
use crate::conformance::interface::{Directives, Event};
use crate::conformance::world::{Proc, World, line, wait_events};
use crate::conformance::{Failure, require};

/// Waits for the first finished reconcile of `k` and returns its end line.
async fn finished(procs: &[&Proc], k: &str) -> Result<(Event, Event), Failure> {
    wait_events(&format!("{k} reconciled"), procs, |ev| {
        let s = find_start(ev, k, |_| true)?;
        Some((s.clone(), end_of(ev, s)?.clone()))
    })
    .await
}

/// Cached reads: Get and List answer from the manager's cache, within the label selector.
pub(super) async fn cached_reads(w: &mut World) -> Result<(), Failure> {
    let ns = "reads";
    w.namespace(ns).await?;
    w.put(ns, "target", true, &Directives::done().with("x", "1"))
        .await?;
    w.put(ns, "hidden", false, &Directives::done().with("x", "2"))
        .await?;
    for (name, read) in [
        ("reader", "target"),
        ("reader-missing", "nope"),
        ("reader-hidden", "hidden"),
    ] {
        w.put(ns, name, true, &Directives::done().read(read))
            .await?;
    }
    // Registered only after every object exists: the first List then sees them all.
    let procs = replicas(w, ns, 1).await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    let in_scope = json!(["reader", "reader-hidden", "reader-missing", "target"]);
    let expect = [
        (
            "reader",
            json!({"name": "target", "found": true, "data": {"x": "1"}}),
        ),
        ("reader-missing", json!({"name": "nope", "found": false})),
        ("reader-hidden", json!({"name": "hidden", "found": false})),
    ];
    for (name, get) in expect {
        let (_, end) = finished(&refs, &key(ns, name)).await?;
        judge_reads(name, end.reads.as_ref(), &get, &in_scope)?;
    }
    Ok(())
}

fn judge_reads(
    name: &str,
    reads: Option<&Value>,
    get: &Value,
    list: &Value,
) -> Result<(), Failure> {
    let reads =
        reads.ok_or_else(|| Failure::Violation(format!("{name}: the end line has no `reads`")))?;
    require(reads.get("error").is_none(), || {
        format!("{name}: a read failed: {reads}")
    })?;
    let got = &reads["get"];
    let found_ok = got["name"] == get["name"] && got["found"] == get["found"];
    let data_ok = get.get("data").is_none_or(|d| &got["data"] == d);
    require(found_ok && data_ok, || {
        format!("{name}: Get through the manager returned {got}, expected {get}")
    })?;
    require(&reads["list"] == list, || {
        format!(
            "{name}: List through the manager returned {}, expected exactly the objects in \
             scope {list}",
            reads["list"]
        )
    })
}

/// Whether `tp` is a W3C traceparent; returns (trace id, span id, flags).
fn traceparent(tp: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = tp.split('-').collect();
    let [version, trace, span, flags] = parts[..] else {
        return None;
    };
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let ok = version == "00"
        && hex(trace, 32)
        && hex(span, 16)
        && hex(flags, 2)
        && trace.bytes().any(|b| b != b'0')
        && span.bytes().any(|b| b != b'0');
    ok.then_some((trace, span, flags))
}

/// Trace context: the controller's span continues the request's trace.
pub(super) async fn trace_context(w: &mut World) -> Result<(), Failure> {
    let ns = "trace";
    let procs = replicas(w, ns, 1).await?;
    let refs: Vec<&Proc> = procs.iter().collect();
    w.put(ns, "traced", true, &Directives::done()).await?;
    let (s, _) = finished(&refs, &key(ns, "traced")).await?;
    let parent = traceparent(&s.traceparent).ok_or_else(|| {
        Failure::Violation(format!(
            "the request's traceparent {:?} (as reported) is not a valid W3C traceparent; the \
             manager traces, so every request carries one",
            s.traceparent
        ))
    })?;
    require(parent.2 == "01", || {
        format!("the manager samples every trace; got flags {}", parent.2)
    })?;
    let child = traceparent(&s.span_traceparent).ok_or_else(|| {
        Failure::Violation(format!(
            "span_traceparent {:?} is not a valid W3C traceparent: the controller did not \
             continue the trace",
            s.span_traceparent
        ))
    })?;
    require(
        child.0 == parent.0 && child.1 != parent.1 && child.2 == parent.2,
        || {
            format!(
                "the controller's span {} must be a child of {}: same trace id and flags, a new \
             span id",
                s.span_traceparent, s.traceparent
            )
        },
    )
}

/// The rows the reasons scenario decides, in the order of its verdicts.
pub(super) const REASON_ROWS: &[&str] = &[
    "reason-created",
    "reason-updated",
    "reason-deleted",
    "reason-initial-list",
    "reason-requeue",
    "reason-retry",
    "reason-redelivery",
    "reason-left-scope",
];

/// The reasons: each documented reason is produced once and looked for in the start line.
pub(super) async fn reasons(w: &mut World) -> Vec<Verdict> {
    let ns = "reasons";
    let setup = async {
        w.namespace(ns).await?;
        w.put(ns, "initial", true, &Directives::done()).await?;
        let procs = replicas_with(w, ns, 1, |s| s.deadline_ms = 2_000).await?;
        w.put(
            ns,
            "requeue",
            true,
            &Directives::done().outcome("requeue:300"),
        )
        .await?;
        w.put(ns, "retry", true, &Directives::done().outcome("error,done"))
            .await?;
        w.put(
            ns,
            "redeliver",
            true,
            &Directives::done().sleep_ms("60000,0"),
        )
        .await?;
        Ok::<_, Failure>(procs)
    };
    let procs = match setup.await {
        Ok(p) => p,
        Err(e) => {
            let why = e.to_string();
            return REASON_ROWS
                .iter()
                .map(|r| (*r, Err(Failure::Setup(why.clone()))))
                .collect();
        }
    };
    let a = &procs[0];
    let initial = nth_start(a, &key(ns, "initial"), 0).await;
    let initial_done = match &initial {
        Ok(s) => finished_start(a, s).await,
        Err(_) => Ok(()),
    };
    let mut verdicts = lifecycle(w, a, ns).await;
    verdicts.push((
        "reason-initial-list",
        initial.and_then(|s| reason(&s, "INITIAL_LIST", None)),
    ));
    verdicts.push((
        "reason-requeue",
        nth_start(a, &key(ns, "requeue"), 1)
            .await
            .and_then(|s| reason(&s, "REQUEUE", None)),
    ));
    verdicts.push((
        "reason-retry",
        attempt(a, &key(ns, "retry"), 2)
            .await
            .and_then(|s| reason(&s, "RETRY", None)),
    ));
    verdicts.push((
        "reason-redelivery",
        attempt(a, &key(ns, "redeliver"), 2)
            .await
            .and_then(|s| reason(&s, "REDELIVERY", None)),
    ));
    let left = match initial_done {
        Ok(()) => left_scope(w, a, ns).await,
        Err(e) => Err(e),
    };
    verdicts.push(("reason-left-scope", left));
    verdicts
}

/// CREATED, UPDATED and DELETED of one key.
async fn lifecycle(w: &World, a: &Proc, ns: &str) -> Vec<Verdict> {
    let k = key(ns, "fresh");
    let created = async {
        w.put(ns, "fresh", true, &Directives::done().with("v", "1"))
            .await?;
        let s = nth_start(a, &k, 0).await?;
        finished_start(a, &s).await?;
        reason(&s, "CREATED", Some("object"))
    }
    .await;
    let updated = async {
        w.put(ns, "fresh", true, &Directives::done().with("v", "2"))
            .await?;
        let s = nth_start(a, &k, 1).await?;
        finished_start(a, &s).await?;
        reason(&s, "UPDATED", Some("object"))
    }
    .await;
    let deleted = async {
        w.delete(ns, "fresh").await?;
        let s = nth_start(a, &k, 2).await?;
        reason(&s, "DELETED", Some("tombstone"))
    }
    .await;
    vec![
        ("reason-created", created),
        ("reason-updated", updated),
        ("reason-deleted", deleted),
    ]
}

/// LEFT_SCOPE: `initial` is relabelled out of the label selector.
async fn left_scope(w: &World, a: &Proc, ns: &str) -> Result<(), Failure> {
    w.put(ns, "initial", false, &Directives::done()).await?;
    let s = nth_start(a, &key(ns, "initial"), 1).await?;
    reason(&s, "LEFT_SCOPE", Some("tombstone"))
}

/// The `n`-th (0-based) start of `k`.
async fn nth_start(a: &Proc, k: &str, n: usize) -> Result<Event, Failure> {
    wait_events(&format!("delivery {} of {k}", n + 1), &[a], |ev| {
        starts(ev, k).get(n).map(|s| (*s).clone())
    })
    .await
}

/// The start of attempt `n` of `k`.
async fn attempt(a: &Proc, k: &str, n: u32) -> Result<Event, Failure> {
    wait_events(&format!("attempt {n} of {k}"), &[a], |ev| {
        find_start(ev, k, |s| s.attempt == n).cloned()
    })
    .await
}

/// Waits until `s` has ended, so that the next change is a new request.
async fn finished_start(a: &Proc, s: &Event) -> Result<(), Failure> {
    wait_events(&format!("the end of {}", line(s)), &[a], |ev| {
        end_of(ev, s).map(|_| ())
    })
    .await
}

/// Whether start line `s` carries reason `name` (and the object kind `object`).
fn reason(s: &Event, name: &str, object: Option<&str>) -> Result<(), Failure> {
    require(s.has_reason(name), || {
        format!(
            "expected reason {name}, the request carried {}: {}",
            s.reason_list(),
            line(s)
        )
    })?;
    require(object.is_none_or(|o| s.object == o), || {
        format!(
            "with reason {name} the request carries {}, got {:?}",
            object.unwrap_or(""),
            s.object
        )
    })
}
