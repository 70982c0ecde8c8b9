//! The checks: the rows of the matrix ([`ROWS`]) and the scenarios that decide them
//! ([`SCENARIOS`]; most decide one row, the reasons scenario eight, the ring scenario two). Each scenario drives the
//! world, then judges the controllers' reports, the manager's `/status` and `/metrics`, the
//! proxy's connection log and process exits; tests/conformance/README.md section 6 is the
//! table in prose.

mod data;
mod fencing;
mod ring;
mod session;
mod startup;
mod work;

use futures::future::BoxFuture;
use serde_json::Value;
use std::time::Duration;

use super::Failure;
use super::interface::Event;
use super::world::World;

/// One row of the matrix.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// Stable id, used in the results files.
    pub id: &'static str,
    /// The guarantee, as the matrix names it.
    pub guarantee: &'static str,
}

/// Every row, in matrix order.
pub const ROWS: &[Row] = &[
    row("exclusive", "exclusive keys across replicas"),
    row("redelivery", "redelivery after SIGKILL"),
    row("requeue-after", "requeue-after"),
    row("backoff", "backoff"),
    row("terminal", "terminal errors"),
    row(
        "deadline",
        "deadline: handler cancelled, late result discarded",
    ),
    row("drain", "Drain completes in-flight work on SIGTERM"),
    row("reconnect-restart", "reconnect after a manager restart"),
    row(
        "reconnect-leader",
        "reconnect after a leader change (leader killed)",
    ),
    row(
        "reconnect-stepdown",
        "reconnect after a leader change (leader steps down, stays up)",
    ),
    row("token-rotation", "token rotation (token file re-read)"),
    row("revoked", "Revoked handling (SUPERSEDED)"),
    row(
        "cached-reads",
        "cached reads (Get/List through the manager)",
    ),
    row("trace-context", "trace context continued"),
    row("reason-created", "reason CREATED"),
    row("reason-updated", "reason UPDATED"),
    row("reason-deleted", "reason DELETED"),
    row("reason-initial-list", "reason INITIAL_LIST"),
    row("reason-requeue", "reason REQUEUE"),
    row("reason-retry", "reason RETRY"),
    row("reason-redelivery", "reason REDELIVERY"),
    row("reason-left-scope", "reason LEFT_SCOPE"),
    row(
        "startup-no-phantom-delete",
        "no phantom DELETED at startup (owns)",
    ),
    row("startup-once", "each key once at startup (owns)"),
    row("child-full", "owned child readable in full"),
    row("child-metadata", "metadata-only child served as metadata"),
    row(
        "stuck-one",
        "stuck handler never overlaps its re-delivery (one process)",
    ),
    row(
        "stuck-two",
        "stuck handler never overlaps its re-delivery (two replicas)",
    ),
    row(
        "partition",
        "partitioned replica stops before its key moves",
    ),
    row("rollout", "rolling definition upgrade converges"),
    row("ring-redirect", "ring: follows a redirect to the owner"),
    row("ring-move", "ring: honours a move to a joining member"),
    row("ring-loop", "ring: stops after 3 redirects in a row"),
];

const fn row(id: &'static str, guarantee: &'static str) -> Row {
    Row { id, guarantee }
}

/// A row's verdict.
pub type Verdict = (&'static str, Result<(), Failure>);

/// A check deciding one row.
pub type OneRow = for<'a> fn(&'a mut World) -> BoxFuture<'a, Result<(), Failure>>;
/// A check deciding several rows, one verdict each.
pub type ManyRows = for<'a> fn(&'a mut World) -> BoxFuture<'a, Vec<Verdict>>;

/// How a scenario runs.
#[derive(Clone, Copy)]
pub enum Runner {
    /// It decides one row.
    One(OneRow),
    /// It decides every row of [`Scenario::rows`].
    Many(ManyRows),
}

/// A scenario: the rows it decides and how it runs.
pub struct Scenario {
    /// Its name (for logs).
    pub name: &'static str,
    /// The rows it decides.
    pub rows: &'static [&'static str],
    /// How it runs.
    pub runner: Runner,
}

impl Scenario {
    /// Runs the scenario: one verdict per row of [`Scenario::rows`].
    pub async fn run(&self, w: &mut World) -> Vec<Verdict> {
        match self.runner {
            Runner::One(run) => vec![(self.rows[0], run(w).await)],
            Runner::Many(run) => run(w).await,
        }
    }
}

/// A scenario deciding the row it is named after.
const fn one(rows: &'static [&'static str], run: OneRow) -> Scenario {
    Scenario {
        name: rows[0],
        rows,
        runner: Runner::One(run),
    }
}

/// Every scenario, in the order they run: the ones that replace managers, then the ring ones,
/// last.
pub const SCENARIOS: &[Scenario] = &[
    one(&["exclusive"], |w| Box::pin(work::exclusive(w))),
    one(&["redelivery"], |w| Box::pin(work::redelivery(w))),
    one(&["requeue-after"], |w| Box::pin(work::requeue_after(w))),
    one(&["backoff"], |w| Box::pin(work::backoff(w))),
    one(&["terminal"], |w| Box::pin(work::terminal(w))),
    one(&["deadline"], |w| Box::pin(work::deadline(w))),
    one(&["drain"], |w| Box::pin(session::drain(w))),
    one(&["revoked"], |w| Box::pin(session::revoked(w))),
    one(&["cached-reads"], |w| Box::pin(data::cached_reads(w))),
    one(&["trace-context"], |w| Box::pin(data::trace_context(w))),
    Scenario {
        name: "reasons",
        rows: data::REASON_ROWS,
        runner: Runner::Many(|w| Box::pin(data::reasons(w))),
    },
    Scenario {
        name: "startup",
        rows: startup::STARTUP_ROWS,
        runner: Runner::Many(|w| Box::pin(startup::startup(w))),
    },
    one(&["child-full"], |w| {
        Box::pin(startup::child_read(w, "leases"))
    }),
    one(&["child-metadata"], |w| {
        Box::pin(startup::child_read(w, "leases-metadata"))
    }),
    one(&["stuck-one"], |w| Box::pin(fencing::stuck(w, 1))),
    one(&["stuck-two"], |w| Box::pin(fencing::stuck(w, 2))),
    one(&["partition"], |w| Box::pin(fencing::partition(w))),
    one(&["rollout"], |w| Box::pin(fencing::rollout(w))),
    one(&["token-rotation"], |w| {
        Box::pin(session::token_rotation(w))
    }),
    one(&["reconnect-restart"], |w| {
        Box::pin(session::reconnect_restart(w))
    }),
    one(&["reconnect-leader"], |w| {
        Box::pin(session::reconnect_leader(w))
    }),
    one(&["reconnect-stepdown"], |w| {
        Box::pin(session::reconnect_stepdown(w))
    }),
    // The ring members stay up until the world ends: these run last, so no other check shares
    // the machine with three more managers.
    Scenario {
        name: "ring",
        rows: ring::RING_ROWS,
        runner: Runner::Many(|w| Box::pin(ring::ring(w))),
    },
    one(&["ring-loop"], |w| Box::pin(ring::redirect_loop(w))),
];

/// `namespace/name`.
pub fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// The `start` lines of `key`, in time order.
pub fn starts<'a>(events: &'a [Event], key: &str) -> Vec<&'a Event> {
    events
        .iter()
        .filter(|e| e.is_start() && e.key == key)
        .collect()
}

/// The `end` line answering `start` (same replica, key and id, written after it).
pub fn end_of<'a>(events: &'a [Event], start: &Event) -> Option<&'a Event> {
    events.iter().find(|e| {
        e.is_end()
            && e.replica == start.replica
            && e.key == start.key
            && e.id == start.id
            && e.ts_us >= start.ts_us
    })
}

/// The first `start` of `key` matching `pred`, with its `end` once written.
pub fn find_start<'a>(
    events: &'a [Event],
    key: &str,
    pred: impl Fn(&Event) -> bool,
) -> Option<&'a Event> {
    starts(events, key).into_iter().find(|e| pred(e))
}

/// Milliseconds from `a` to `b` (negative when `b` is earlier).
pub fn ms_between(a: u64, b: u64) -> f64 {
    (b as f64 - a as f64) / 1000.0
}

/// The number of sessions a controller's `/status` entry lists.
pub fn sessions(c: &Value) -> usize {
    c["sessionList"].as_array().map_or(0, Vec::len)
}

/// A `/status` counter of a controller entry (0 when absent).
pub fn counter(c: &Value, name: &str) -> u64 {
    c[name].as_u64().unwrap_or(0)
}

/// A window long enough to show that something does not happen.
pub const QUIET: Duration = Duration::from_millis(1500);
