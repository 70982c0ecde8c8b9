//! The status page at `/` and the `/status` JSON: one snapshot of what a person on call looks
//! for — leadership, tenants, controllers with their sessions, in-flight, queued and failed keys,
//! informers — rendered as plain server-side HTML.
//!
//! The page has no external assets (no CDN, no fonts, no scripts) so it works air-gapped and
//! through `kubectl port-forward`. Everything that comes from outside the process (object names,
//! controller messages, identities, tenant names) goes through [`Esc`].

use crate::dispatch::controllers::ControllerTable;
use crate::dispatch::dispatcher::{Controller, RecentError};
use crate::dispatch::queue::QueuedAs;
use crate::http::access::Viewer;
use crate::informer::{Cache, ObjectKey};
use crate::leader::LeaderState;
use crate::registration::Mode;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

/// How many in-flight, queued and failed keys each controller lists; more are counted, not shown.
pub(crate) const LIST_LIMIT: usize = 20;

/// Seconds between automatic reloads of the page unless the URL asks otherwise.
pub(crate) const DEFAULT_REFRESH_SECS: u32 = 5;

/// How this manager was started, as far as the page tells it: what an operator must know
/// before trusting what it shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Settings {
    /// `--auth static`: one shared token, tenant `dev`, everything allowed (development only).
    pub static_auth: bool,
    /// The namespace ceiling (`--watch-namespace`) every registration is confined to; `None`:
    /// all namespaces.
    pub ceiling: Option<Vec<String>>,
}

/// Everything the page shows, read once so the HTML and the JSON agree.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// How this manager was started.
    pub(crate) settings: Settings,
    /// This manager's identity.
    pub(crate) identity: String,
    /// The Lease name.
    pub(crate) lease_name: String,
    /// Whether this manager holds the Lease.
    pub(crate) leading: bool,
    /// The holder as last observed.
    pub(crate) holder: Option<String>,
    /// When the snapshot was taken.
    pub(crate) at: SystemTime,
    /// Controllers, sorted by tenant then name.
    pub(crate) controllers: Vec<ControllerStatus>,
    /// Informers, sorted by label (none in a tenant's view: the caches are shared by tenants).
    pub(crate) informers: Vec<InformerStatus>,
    /// The tenant whose view this is; `None`: everything (an operator, or an open port).
    pub(crate) tenant_view: Option<String>,
    /// Ring mode, for operators: the members, this member's units and the latest moves.
    pub(crate) ring: Option<crate::members::RingStatus>,
}

/// One controller as the page shows it.
#[derive(Debug, Clone)]
pub(crate) struct ControllerStatus {
    /// Tenant as limits, dispatch seats and metrics name it (`system:serviceaccounts:<ns>`
    /// under the default grouping).
    pub(crate) tenant: String,
    /// The identity that registered it (the ServiceAccount's username).
    pub(crate) identity: String,
    /// Controller name.
    pub(crate) name: String,
    /// Primary kind as `apiVersion/Kind`.
    pub(crate) primary: String,
    /// `reconcile` or `events`.
    pub(crate) mode: &'static str,
    /// Most requests in flight across replicas (0 = bounded only by credits).
    pub(crate) max_concurrent: u32,
    /// What it can have in flight now: its sessions' credits, within `max_concurrent`.
    pub(crate) effective_concurrency: u64,
    /// How long a replica has to answer one request.
    pub(crate) deadline: Duration,
    /// Keys ready to be handed out.
    pub(crate) queued: usize,
    /// Keys waiting on a requeue-after the controller asked for.
    pub(crate) scheduled: usize,
    /// Keys waiting out a backoff after an error or a missed deadline.
    pub(crate) failing: usize,
    /// Requests in flight.
    pub(crate) in_flight: usize,
    /// Requests dispatched.
    pub(crate) dispatched: u64,
    /// Reconciles that finished well (Done), and EVENTS-mode acks.
    pub(crate) done: u64,
    /// Reconciles that finished well asking to run again (RequeueAfter).
    pub(crate) requeued: u64,
    /// Results and acks discarded: their id was not in flight (late, duplicate, unknown).
    pub(crate) discarded: u64,
    /// Reconciles that failed and will be retried.
    pub(crate) errors: u64,
    /// Reconciles that failed for good.
    pub(crate) terminal: u64,
    /// Requests that missed their deadline.
    pub(crate) deadline_misses: u64,
    /// Attached sessions.
    pub(crate) sessions: Vec<SessionView>,
    /// In-flight keys, longest-running first, at most [`LIST_LIMIT`].
    pub(crate) in_flight_keys: Vec<InFlightView>,
    /// Queued keys in dispatch order, at most [`LIST_LIMIT`].
    pub(crate) queued_keys: Vec<QueuedKey>,
    /// Latest failures, newest first, at most [`LIST_LIMIT`].
    pub(crate) recent_errors: Vec<RecentError>,
    /// How long it has had no session (None while one is attached): a controller whose
    /// replicas all died stays for the grace period, queue still counting.
    pub(crate) sessionless_for: Option<Duration>,
}

impl ControllerStatus {
    /// Read one controller: its keys (each list at most [`LIST_LIMIT`]), then its figures.
    fn read(c: &Controller, now: Instant) -> ControllerStatus {
        let (sessions, in_flight_keys, queued_keys) = read_keys(c, now);
        let recent_errors = c.recent_errors(LIST_LIMIT);
        let counts = c.key_counts();
        let r = &c.registration;
        let credits: u64 = sessions.iter().map(|s| u64::from(s.credits)).sum();
        ControllerStatus {
            tenant: c.group.to_string(),
            identity: c.id.tenant.clone(),
            name: c.id.name.clone(),
            primary: format!("{}/{}", r.primary.api_version(), r.primary.kind),
            mode: match r.mode {
                Mode::Reconcile => "reconcile",
                Mode::Events => "events",
            },
            max_concurrent: r.max_concurrent,
            effective_concurrency: effective_concurrency(r.max_concurrent, credits),
            deadline: r.deadline,
            // Two reads under two locks: never claim fewer than we list.
            queued: counts
                .ready
                .max(queued_keys.iter().filter(|q| q.lane.is_ready()).count()),
            scheduled: counts.scheduled,
            failing: counts.failing,
            in_flight: counts.in_flight.max(in_flight_keys.len()),
            dispatched: c.counters.dispatched.load(Ordering::Relaxed),
            done: c.counters.done.load(Ordering::Relaxed),
            requeued: c.counters.requeued.load(Ordering::Relaxed),
            discarded: c.counters.discarded.load(Ordering::Relaxed),
            errors: c.counters.errors.load(Ordering::Relaxed),
            terminal: c.counters.terminal.load(Ordering::Relaxed),
            deadline_misses: c.counters.deadline_misses.load(Ordering::Relaxed),
            sessions,
            in_flight_keys,
            queued_keys,
            recent_errors,
            sessionless_for: c
                .sessionless_since()
                .map(|t| now.saturating_duration_since(t)),
        }
    }

    /// Queued keys (ready, scheduled or failing) that exist but are not listed.
    pub(crate) fn queued_not_shown(&self) -> usize {
        (self.queued + self.scheduled + self.failing).saturating_sub(self.queued_keys.len())
    }

    /// In-flight keys that exist but are not listed.
    pub(crate) fn in_flight_not_shown(&self) -> usize {
        self.in_flight.saturating_sub(self.in_flight_keys.len())
    }
}

/// What a controller can have in flight: its sessions' credits, within its
/// `max_concurrent_reconciles` when it set one (`controller_runtime_max_concurrent_reconciles`).
pub(crate) fn effective_concurrency(max_concurrent: u32, credits: u64) -> u64 {
    match max_concurrent {
        0 => credits,
        max => credits.min(u64::from(max)),
    }
}

/// A request in flight, as the page shows it.
#[derive(Debug, Clone)]
pub(crate) struct InFlightView {
    /// The key.
    pub(crate) key: ObjectKey,
    /// The session it went to.
    pub(crate) session: u64,
    /// 1-based attempt.
    pub(crate) attempt: u32,
    /// How long it has been running.
    pub(crate) running: Duration,
}

/// An attached session, as the page shows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionView {
    /// The session number (also in logs).
    pub(crate) session: u64,
    /// Requests it accepts at once.
    pub(crate) credits: u32,
    /// Requests it holds now.
    pub(crate) in_flight: u32,
    /// Whether it asked to drain.
    pub(crate) draining: bool,
}

/// A controller's sessions, in-flight keys (longest-running first) and queued keys, read
/// together under its lock; the key lists are at most [`LIST_LIMIT`] long.
fn read_keys(
    c: &Controller,
    now: Instant,
) -> (Vec<SessionView>, Vec<InFlightView>, Vec<QueuedKey>) {
    let (sessions, mut in_flight, queued) = c.inspect(|st| {
        let in_flight: Vec<InFlightView> = st
            .in_flight()
            .map(|f| InFlightView {
                key: f.key().clone(),
                session: f.session(),
                attempt: f.attempt(),
                running: now.saturating_duration_since(f.started()),
            })
            .collect();
        let sessions = st
            .sessions()
            .map(|(session, slot)| SessionView {
                session,
                credits: slot.credits(),
                in_flight: slot.in_flight(),
                draining: slot.draining(),
            })
            .collect();
        (sessions, in_flight, st.queued(LIST_LIMIT))
    });
    in_flight.sort_by(|a, b| b.running.cmp(&a.running).then_with(|| a.key.cmp(&b.key)));
    in_flight.truncate(LIST_LIMIT);
    let queued = queued
        .into_iter()
        .map(|(key, q)| QueuedKey {
            key,
            lane: Lane::from_queue(q, now),
        })
        .collect();
    (sessions, in_flight, queued)
}

/// A queued key and where it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueuedKey {
    /// The key.
    pub(crate) key: ObjectKey,
    /// Where it waits.
    pub(crate) lane: Lane,
}

/// Where a queued key waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Ready, live lane (changes people made).
    Live,
    /// Ready, background lane (resyncs, relists).
    Background,
    /// On the requeue-after timer the controller asked for, due in this long: scheduled.
    Scheduled(Duration),
    /// Waiting out its backoff after an error or a missed deadline, due in this long: failing.
    Retry(Duration),
}

impl Lane {
    fn from_queue(q: QueuedAs, now: Instant) -> Self {
        match q {
            QueuedAs::Live => Lane::Live,
            QueuedAs::Background => Lane::Background,
            QueuedAs::Timer(at) => Lane::Scheduled(at.saturating_duration_since(now)),
            QueuedAs::Retry(at) => Lane::Retry(at.saturating_duration_since(now)),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Lane::Live => "live",
            Lane::Background => "background",
            Lane::Scheduled(_) => "scheduled",
            Lane::Retry(_) => "retry",
        }
    }

    /// Ready to be handed out now.
    fn is_ready(self) -> bool {
        matches!(self, Lane::Live | Lane::Background)
    }

    /// How long until it is due, for a key on a timer.
    fn due(self) -> Option<Duration> {
        match self {
            Lane::Scheduled(due) | Lane::Retry(due) => Some(due),
            Lane::Live | Lane::Background => None,
        }
    }
}

/// One informer as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InformerStatus {
    /// `group/version/plural [ns=…]`.
    pub(crate) label: String,
    /// Objects in the cache.
    pub(crate) objects: usize,
    /// Whether the initial list finished.
    pub(crate) synced: bool,
    /// Relists so far.
    pub(crate) relists: u64,
}

/// Every informer, sorted by label.
fn read_informers(cache: &Cache) -> Vec<InformerStatus> {
    let mut informers: Vec<InformerStatus> = cache
        .all()
        .iter()
        .map(|i| InformerStatus {
            label: i.key().label(),
            objects: i.len(),
            synced: i.is_synced(),
            relists: i.relists(),
        })
        .collect();
    informers.sort_by(|a, b| a.label.cmp(&b.label));
    informers
}

/// Per-tenant totals, derived from the controllers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TenantStatus {
    /// Tenant.
    pub(crate) tenant: String,
    /// Registered controllers.
    pub(crate) controllers: usize,
    /// Attached sessions across its controllers.
    pub(crate) sessions: usize,
    /// Requests in flight.
    pub(crate) in_flight: usize,
    /// Keys ready to be handed out.
    pub(crate) queued: usize,
    /// Keys waiting on a requeue-after.
    pub(crate) scheduled: usize,
    /// Keys waiting out a backoff after a failure.
    pub(crate) failing: usize,
    /// Failed reconciles (retried plus terminal) since start.
    pub(crate) failures: u64,
}

impl Snapshot {
    /// Read the controllers, the caches and the leadership state once, as much of them as
    /// `viewer` may see: a tenant sees its own controllers and no informers.
    pub(crate) fn collect(
        controllers: &ControllerTable,
        cache: &Cache,
        leader: &LeaderState,
        (identity, lease_name, settings): (&str, &str, &Settings),
        viewer: &Viewer,
    ) -> Snapshot {
        let now = Instant::now();
        let tenant_view = match viewer {
            Viewer::Operator => None,
            Viewer::Tenant(t) => Some(t.clone()),
        };
        let mut controllers: Vec<ControllerStatus> = controllers
            .all()
            .iter()
            .filter(|c| tenant_view.as_deref().is_none_or(|t| *c.group == *t))
            .map(|c| ControllerStatus::read(c, now))
            .collect();
        controllers.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
        let informers = if tenant_view.is_some() {
            Vec::new()
        } else {
            read_informers(cache)
        };
        Snapshot {
            settings: settings.clone(),
            identity: identity.to_owned(),
            lease_name: lease_name.to_owned(),
            leading: leader.leading,
            holder: leader.holder.clone(),
            at: SystemTime::now(),
            controllers,
            informers,
            tenant_view,
            ring: None,
        }
    }

    /// Per-tenant totals, sorted by tenant.
    pub(crate) fn tenants(&self) -> Vec<TenantStatus> {
        let mut by: BTreeMap<&str, TenantStatus> = BTreeMap::new();
        for c in &self.controllers {
            let t = by.entry(c.tenant.as_str()).or_insert_with(|| TenantStatus {
                tenant: c.tenant.clone(),
                ..TenantStatus::default()
            });
            t.controllers += 1;
            t.sessions += c.sessions.len();
            t.in_flight += c.in_flight;
            t.queued += c.queued;
            t.scheduled += c.scheduled;
            t.failing += c.failing;
            t.failures += c.errors + c.terminal;
        }
        by.into_values().collect()
    }

    /// The `/status` JSON. Fields before `lease` are the original ones and keep their meaning,
    /// but for `tenant` (now the tenant as metrics and limits name it; `identity` is who
    /// registered) and `queued` (now the keys ready to go; keys on a timer are `scheduled` or
    /// `failing`).
    pub(crate) fn to_json(&self) -> Value {
        let controllers: Vec<Value> = self
            .controllers
            .iter()
            .map(|c| {
                json!({
                    "tenant": c.tenant, "identity": c.identity, "name": c.name, "primary": c.primary,
                    "sessions": c.sessions.len(), "queued": c.queued, "inFlight": c.in_flight,
                    "dispatched": c.dispatched, "done": c.done, "errors": c.errors,
                    "terminal": c.terminal, "deadlineMisses": c.deadline_misses,
                    "requeued": c.requeued, "succeeded": c.done + c.requeued,
                    "discarded": c.discarded,
                    "mode": c.mode,
                    "maxConcurrent": c.max_concurrent,
                    "effectiveConcurrency": c.effective_concurrency,
                    "scheduled": c.scheduled,
                    "failing": c.failing,
                    "deadlineSeconds": c.deadline.as_secs_f64(),
                    "sessionList": c.sessions.iter().map(|s| json!({
                        "session": s.session, "credits": s.credits,
                        "inFlight": s.in_flight, "draining": s.draining,
                    })).collect::<Vec<_>>(),
                    "inFlightKeys": c.in_flight_keys.iter().map(|f| json!({
                        "key": f.key.to_string(), "session": f.session, "attempt": f.attempt,
                        "runningSeconds": f.running.as_secs_f64(),
                    })).collect::<Vec<_>>(),
                    "queuedKeys": c.queued_keys.iter().map(|q| {
                        let mut v = json!({"key": q.key.to_string(), "lane": q.lane.name()});
                        if let Some(due) = q.lane.due() {
                            v["dueInSeconds"] = json!(due.as_secs_f64());
                        }
                        v
                    }).collect::<Vec<_>>(),
                    "queuedNotShown": c.queued_not_shown(),
                    "sessionlessSeconds": c.sessionless_for.map(|d| d.as_secs_f64()),
                    "recentErrors": c.recent_errors.iter().map(|e| json!({
                        "at": rfc3339(e.at), "key": e.key.to_string(), "attempt": e.attempt,
                        "kind": e.kind, "message": e.message,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let informers: Vec<Value> = self
            .informers
            .iter()
            .map(|i| json!({"informer": i.label, "objects": i.objects, "synced": i.synced, "relists": i.relists}))
            .collect();
        let tenants: Vec<Value> = self
            .tenants()
            .iter()
            .map(|t| json!({"tenant": t.tenant, "controllers": t.controllers, "sessions": t.sessions, "inFlight": t.in_flight, "queued": t.queued, "scheduled": t.scheduled, "failing": t.failing, "failures": t.failures}))
            .collect();
        json!({
            "identity": self.identity,
            "leading": self.leading,
            "leader": self.holder,
            "controllers": controllers,
            "informers": informers,
            "lease": {"name": self.lease_name, "holder": self.holder},
            "tenants": tenants,
            "view": match &self.tenant_view {
                None => json!({"scope": "all"}),
                Some(t) => json!({"scope": "tenant", "tenant": t}),
            },
            "auth": if self.settings.static_auth { "static" } else { "kubernetes" },
            "ring": self.ring.as_ref().map(ring_json),
            // null: all namespaces.
            "namespaceCeiling": self.settings.ceiling,
        })
    }
}

/// The ring as `/status` shows it.
fn ring_json(r: &crate::members::RingStatus) -> Value {
    let members: Vec<Value> = r
        .members
        .iter()
        .map(|m| json!({"identity": m.identity, "address": m.address, "state": m.state, "weight": m.weight, "units": m.units, "renewAgeSeconds": m.renew_age.as_secs_f64(), "live": m.live, "published": m.published}))
        .collect();
    let units: Vec<Value> = r
        .units
        .iter()
        .map(|(u, state)| json!({"tenant": u.group, "name": u.name, "state": state}))
        .collect();
    let moves: Vec<Value> = r
        .moves
        .iter()
        .map(|m| json!({"tenant": m.unit.group, "name": m.unit.name, "direction": m.direction, "peer": m.peer, "seconds": m.took.as_secs_f64(), "at": m.at}))
        .collect();
    json!({
        "ring": r.ring,
        "identity": r.identity,
        "address": r.address,
        "weight": r.weight,
        "incarnation": r.incarnation,
        "held": r.held,
        "leaving": r.leaving,
        "view": r.view,
        "published": r.published,
        "members": members,
        "units": units,
        "moves": moves,
    })
}

/// The ring section of the page: the members this member sees, its units, the latest moves.
fn write_ring(o: &mut String, r: &crate::members::RingStatus) -> fmt::Result {
    write!(
        o,
        "<section id=\"ring\"><h2>Ring <code>{}</code></h2><p class=\"more\">This member: <b>{}</b> at <code>{}</code>, weight {}, {} · view <code>{}</code> · published <code>{}</code></p>",
        Esc(&r.ring),
        Esc(&r.identity),
        Esc(&r.address),
        r.weight,
        if r.leaving {
            "leaving"
        } else if r.held {
            "active"
        } else {
            "not holding its Lease"
        },
        Esc(&r.view),
        Esc(&r.published)
    )?;
    o.push_str("<table><tr><th>member</th><th>address</th><th>state</th><th>units</th><th>renewed</th></tr>");
    for m in &r.members {
        write!(
            o,
            "<tr class=\"member\"><td>{}</td><td><code>{}</code></td><td>{}{}</td><td>{}</td><td>{:.1} s ago</td></tr>",
            Esc(&m.identity),
            Esc(&m.address),
            m.state,
            if m.live { "" } else { " (expired)" },
            m.units,
            m.renew_age.as_secs_f64()
        )?;
    }
    o.push_str("</table><table><tr><th>controller</th><th>state</th></tr>");
    for (u, state) in &r.units {
        write!(
            o,
            "<tr class=\"unit\"><td>{}</td><td>{state}</td></tr>",
            Esc(&u.to_string())
        )?;
    }
    o.push_str("</table><table><tr><th>moved</th><th>direction</th><th>other member</th><th>took</th></tr>");
    for m in r.moves.iter().rev() {
        write!(
            o,
            "<tr class=\"move\"><td>{}</td><td>{}</td><td>{}</td><td>{:.2} s</td></tr>",
            Esc(&m.unit.to_string()),
            m.direction,
            Esc(m.peer.as_deref().unwrap_or("?")),
            m.took.as_secs_f64()
        )?;
    }
    o.push_str("</table></section>");
    Ok(())
}

/// HTML-escapes text for element content and double- or single-quoted attribute values.
pub(crate) struct Esc<'a>(pub &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..i])?;
            f.write_str(match rest.as_bytes()[i] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[i + 1..];
        }
        f.write_str(rest)
    }
}

fn rfc3339(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|ts| ts.round(jiff::Unit::Millisecond).unwrap_or(ts).to_string())
        .unwrap_or_default()
}

fn clock(t: SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .map(|ts| ts.strftime("%H:%M:%S").to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// A duration the way people read it on a status page: `850 ms`, `4.2 s`, `3m 07s`, `2h 05m`.
pub(crate) fn human(d: Duration) -> String {
    let s = d.as_secs();
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if s < 60 {
        format!("{:.1} s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{}h {:02}m", s / 3600, (s % 3600) / 60)
    }
}

const STYLE: &str = r#"
:root{--fg:#1d2330;--muted:#5d6778;--line:#e2e6ee;--bg:#f5f7fb;--card:#fff;--ok:#137a3f;--okbg:#e3f6ea;--warn:#8a5a00;--warnbg:#fff3d6;--bad:#b42318;--badbg:#fdecea;--accent:#2f5fd0}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--fg);background:var(--bg)}
code,.mono,td.key{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;font-size:13px}
header.top{display:flex;align-items:baseline;gap:16px;flex-wrap:wrap;padding:14px 24px;background:#1d2330;color:#fff}
header.top h1{margin:0;font-size:20px;letter-spacing:.5px}
header.top .meta{color:#c5cbd6}
header.top .meta b{color:#fff}
main{padding:16px 24px 40px;max-width:1400px}
.banner{display:flex;align-items:center;gap:14px;padding:14px 18px;border-radius:8px;border:1px solid;margin-bottom:16px;font-size:15px}
.banner .role{font-weight:700;font-size:18px;letter-spacing:1px;padding:2px 10px;border-radius:6px;color:#fff}
.banner.leader{background:var(--okbg);border-color:#9ad3b0}
.banner.leader .role{background:var(--ok)}
.banner.standby{background:var(--warnbg);border-color:#ecc86b}
.banner.standby .role{background:var(--warn)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(130px,1fr));gap:10px;margin-bottom:20px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px}
.card .n{font-size:22px;font-weight:650}
.card .l{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.5px}
.card.bad{border-color:#f1a9a3;background:var(--badbg)}
.card.bad .n{color:var(--bad)}
h2{font-size:16px;margin:26px 0 10px;text-transform:uppercase;letter-spacing:.8px;color:var(--muted)}
h4{margin:14px 0 6px;font-size:13px;color:var(--muted);text-transform:uppercase;letter-spacing:.5px}
table{width:100%;border-collapse:collapse;background:var(--card);border:1px solid var(--line);border-radius:6px}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid var(--line);vertical-align:baseline}
th{font-size:12px;color:var(--muted);font-weight:600;background:#fafbfd}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.empty{color:var(--muted);font-style:italic}
tr:last-child td{border-bottom:0}
article.controller{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 18px;margin-bottom:16px}
article.controller.failing{border-left:5px solid var(--bad)}
article.controller h3{margin:0 0 10px;font-size:17px;display:flex;gap:10px;align-items:center;flex-wrap:wrap}
article.controller h3 .tenant{color:var(--muted);font-weight:500}
.badge{font-size:12px;font-weight:500;padding:1px 8px;border-radius:10px;background:#eef1f7;color:var(--muted);border:1px solid var(--line)}
.stats{display:flex;flex-wrap:wrap;gap:8px 22px;padding:8px 0 4px;border-bottom:1px solid var(--line)}
.stat .n{font-weight:650;font-size:16px;font-variant-numeric:tabular-nums}
.stat .l{color:var(--muted);font-size:12px;margin-left:4px}
.stat.bad .n{color:var(--bad)}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:0 18px}
.cols table,.errors{border-radius:6px}
tr.slow td{background:var(--warnbg)}
.more{color:var(--muted);margin:4px 2px 0;font-size:12px}
table.errors tr.err td{background:var(--badbg)}
table.errors td.msg{color:var(--bad);white-space:pre-wrap;word-break:break-word}
.kind{font-weight:600;font-size:12px;padding:0 6px;border-radius:4px;background:#fff;border:1px solid #f1a9a3;color:var(--bad)}
.pill{font-size:12px;padding:0 6px;border-radius:4px;border:1px solid var(--line)}
.pill.ok{color:var(--ok);border-color:#9ad3b0;background:var(--okbg)}
.pill.no{color:var(--warn);border-color:#ecc86b;background:var(--warnbg)}
.pill.drain{color:var(--warn);border-color:#ecc86b;background:var(--warnbg)}
footer{color:var(--muted);font-size:12px;margin-top:28px}
"#;

/// Render the page. `refresh_secs` of 0 turns automatic reloading off.
pub(crate) fn render(s: &Snapshot, refresh_secs: u32) -> String {
    let mut out = String::with_capacity(16 * 1024);
    // Writing into a String cannot fail.
    let _ = write_page(&mut out, s, refresh_secs);
    out
}

fn write_page(o: &mut String, s: &Snapshot, refresh_secs: u32) -> fmt::Result {
    let role = if s.leading { "leader" } else { "standby" };
    o.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    o.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">");
    if refresh_secs > 0 {
        write!(
            o,
            "<meta http-equiv=\"refresh\" content=\"{refresh_secs}\">"
        )?;
    }
    write!(
        o,
        "<title>ctrlhub · {} · {role}</title><style>{STYLE}</style></head><body>",
        Esc(&s.identity)
    )?;
    write!(
        o,
        "<header class=\"top\"><h1>ctrlhub</h1><span class=\"meta\">manager <b id=\"identity\">{}</b></span>\
         <span class=\"meta\">as of {} UTC",
        Esc(&s.identity),
        clock(s.at)
    )?;
    if refresh_secs > 0 {
        write!(
            o,
            " · reloads every {refresh_secs} s (<a href=\"?refresh=0\" style=\"color:#c5cbd6\">stop</a>)"
        )?;
    }
    o.push_str("</span></header><main>");

    write_banner(o, s)?;
    if let Some(r) = &s.ring {
        write_ring(o, r)?;
    }
    write_settings(o, &s.settings)?;
    write_cards(o, s)?;
    write_tenants(o, s)?;

    o.push_str("<section id=\"controllers\"><h2>Controllers</h2>");
    if s.controllers.is_empty() {
        o.push_str(if s.leading {
            "<p class=\"more\">No controller has registered.</p>"
        } else {
            "<p class=\"more\">No controller has registered here: controllers connect to the leader.</p>"
        });
    }
    for c in &s.controllers {
        write_controller(o, c, s.at)?;
    }
    o.push_str("</section>");

    if let Some(tenant) = &s.tenant_view {
        write!(
            o,
            "<p class=\"more\" id=\"view\">Showing tenant <b>{}</b> only. The caches every tenant shares, and other tenants, are shown to operators (RBAC: <code>get</code> on this URL).</p>",
            Esc(tenant)
        )?;
    } else {
        write_informers(o, s)?;
    }
    write!(
        o,
        "<footer>Lists show at most {LIST_LIMIT} keys each. The same data as JSON: \
         <a href=\"status\">/status</a> · metrics: <a href=\"metrics\">/metrics</a></footer>"
    )?;
    o.push_str("</main></body></html>\n");
    Ok(())
}

fn write_banner(o: &mut String, s: &Snapshot) -> fmt::Result {
    let holder = s.holder.as_deref().unwrap_or("");
    write!(
        o,
        "<section id=\"leadership\" class=\"banner {}\" data-leading=\"{}\" data-holder=\"{}\">",
        if s.leading { "leader" } else { "standby" },
        s.leading,
        Esc(holder)
    )?;
    if s.leading {
        write!(
            o,
            "<span class=\"role\">LEADER</span><span>This manager (<b>{}</b>) holds lease \
             <code>{}</code> and dispatches work. Holder: <b id=\"lease-holder\">{}</b></span>",
            Esc(&s.identity),
            Esc(&s.lease_name),
            Esc(holder)
        )?;
    } else {
        o.push_str("<span class=\"role\">STANDBY</span><span>");
        match &s.holder {
            Some(h) => write!(
                o,
                "Lease <code>{}</code> is held by <b id=\"lease-holder\">{}</b>.",
                Esc(&s.lease_name),
                Esc(h)
            )?,
            None => write!(
                o,
                "Lease <code>{}</code> has no holder observed yet.",
                Esc(&s.lease_name)
            )?,
        }
        write!(
            o,
            " This manager (<b>{}</b>) dispatches nothing and points connecting controllers at the leader.</span>",
            Esc(&s.identity)
        )?;
    }
    o.push_str("</section>");
    Ok(())
}

/// The static-auth warning, and the namespace ceiling every registration is narrowed to.
fn write_settings(o: &mut String, settings: &Settings) -> fmt::Result {
    if settings.static_auth {
        o.push_str(
            "<section id=\"static-auth\" class=\"banner standby\"><span class=\"role\">STATIC AUTH</span>\
             <span>Every controller presenting the static token is tenant <b>dev</b> and may watch \
             and read everything this manager can, and this page is open to anyone who reaches it. \
             For development only: run <code>--auth kubernetes</code> in a cluster.</span></section>",
        );
    }
    o.push_str("<p class=\"more\" id=\"ceiling\">Namespace ceiling: ");
    match &settings.ceiling {
        None => o.push_str("all namespaces"),
        Some(names) => {
            let names: Vec<String> = names.iter().map(|n| Esc(n).to_string()).collect();
            write!(
                o,
                "<b>{}</b> (every registration, \"all namespaces\" included, is confined to these)",
                names.join(", ")
            )?;
        }
    }
    o.push_str("</p>");
    Ok(())
}

fn write_cards(o: &mut String, s: &Snapshot) -> fmt::Result {
    let sessions: usize = s.controllers.iter().map(|c| c.sessions.len()).sum();
    let in_flight: usize = s.controllers.iter().map(|c| c.in_flight).sum();
    let queued: usize = s.controllers.iter().map(|c| c.queued).sum();
    let scheduled: usize = s.controllers.iter().map(|c| c.scheduled).sum();
    let failing: usize = s.controllers.iter().map(|c| c.failing).sum();
    let failures: u64 = s.controllers.iter().map(|c| c.errors + c.terminal).sum();
    let misses: u64 = s.controllers.iter().map(|c| c.deadline_misses).sum();
    let unsynced = s.informers.iter().filter(|i| !i.synced).count();
    o.push_str("<section id=\"summary\" class=\"cards\">");
    let mut card = |id: &str, n: String, label: &str, bad: bool| {
        write!(
            o,
            "<div class=\"card{}\" id=\"summary-{id}\"><div class=\"n\">{n}</div><div class=\"l\">{label}</div></div>",
            if bad { " bad" } else { "" }
        )
    };
    card("tenants", s.tenants().len().to_string(), "tenants", false)?;
    card(
        "controllers",
        s.controllers.len().to_string(),
        "controllers",
        false,
    )?;
    card("sessions", sessions.to_string(), "sessions", false)?;
    card("in-flight", in_flight.to_string(), "in flight", false)?;
    card("queued", queued.to_string(), "queued", false)?;
    card("scheduled", scheduled.to_string(), "scheduled", false)?;
    card("failing", failing.to_string(), "failing keys", failing > 0)?;
    card(
        "failures",
        failures.to_string(),
        "failed reconciles",
        failures > 0,
    )?;
    card(
        "deadline-misses",
        misses.to_string(),
        "deadline misses",
        misses > 0,
    )?;
    card(
        "informers",
        format!("{}/{}", s.informers.len() - unsynced, s.informers.len()),
        "informers synced",
        unsynced > 0,
    )?;
    o.push_str("</section>");
    Ok(())
}

fn write_tenants(o: &mut String, s: &Snapshot) -> fmt::Result {
    o.push_str(
        "<section id=\"tenants\"><h2>Tenants</h2><table><thead><tr><th>tenant</th>\
         <th class=\"num\">controllers</th><th class=\"num\">sessions</th>\
         <th class=\"num\">in flight</th><th class=\"num\">queued</th>\
         <th class=\"num\">failed reconciles</th><th class=\"num\">scheduled</th>\
         <th class=\"num\">failing keys</th></tr></thead><tbody>",
    );
    let tenants = s.tenants();
    if tenants.is_empty() {
        o.push_str("<tr><td colspan=\"8\" class=\"empty\">none</td></tr>");
    }
    for t in &tenants {
        write!(
            o,
            "<tr data-tenant=\"{0}\"><td>{0}</td><td class=\"num\">{1}</td><td class=\"num\">{2}</td>\
             <td class=\"num\">{3}</td><td class=\"num\">{4}</td><td class=\"num\">{5}</td>\
             <td class=\"num\">{6}</td><td class=\"num\">{7}</td></tr>",
            Esc(&t.tenant),
            t.controllers,
            t.sessions,
            t.in_flight,
            t.queued,
            t.failures,
            t.scheduled,
            t.failing
        )?;
    }
    o.push_str("</tbody></table></section>");
    Ok(())
}

/// One controller's card: heading, figures, then its sessions, in-flight and queued keys side
/// by side, and its recent errors below.
fn write_controller(o: &mut String, c: &ControllerStatus, now: SystemTime) -> fmt::Result {
    let failing = !c.recent_errors.is_empty() || c.sessionless_for.is_some();
    write!(
        o,
        "<article class=\"controller{}\" data-tenant=\"{}\" data-name=\"{}\">",
        if failing { " failing" } else { "" },
        Esc(&c.tenant),
        Esc(&c.name)
    )?;
    write_controller_heading(o, c)?;
    if let Some(gone) = c.sessionless_for {
        write!(
            o,
            "<p class=\"sessionless\">No sessions since {} ago: no replica of this controller is connected, and its queue keeps counting. Check its pods.</p>",
            human(gone)
        )?;
    }
    o.push_str("<div class=\"stats\">");
    write_controller_stats(o, c)?;
    o.push_str("</div><div class=\"cols\">");
    write_sessions(o, c)?;
    write_in_flight(o, c)?;
    write_queued(o, c)?;
    o.push_str("</div>");
    // Recent errors, full width: messages are long.
    write_recent_errors(o, c, now)?;
    o.push_str("</article>");
    Ok(())
}

/// Tenant and name, then badges: primary kind, mode, concurrency, deadline, and who
/// registered it when that is not the tenant's own name.
fn write_controller_heading(o: &mut String, c: &ControllerStatus) -> fmt::Result {
    write!(
        o,
        "<h3><span class=\"tenant\">{}&nbsp;/</span><span class=\"name\">{}</span>\
         <span class=\"badge\" title=\"primary kind\">{}</span><span class=\"badge\">{}</span>",
        Esc(&c.tenant),
        Esc(&c.name),
        Esc(&c.primary),
        c.mode
    )?;
    if c.identity != c.tenant {
        write!(
            o,
            "<span class=\"badge\" data-identity=\"{0}\" title=\"the identity that registered it\">{0}</span>",
            Esc(&c.identity)
        )?;
    }
    write!(
        o,
        "<span class=\"badge\" data-concurrency=\"{0}\" title=\"the sessions' credits{1}\">{0} concurrent</span>",
        c.effective_concurrency,
        if c.max_concurrent > 0 {
            format!(", at most {}", c.max_concurrent)
        } else {
            String::new()
        }
    )?;
    write!(
        o,
        "<span class=\"badge\">deadline {}</span></h3>",
        human(c.deadline)
    )
}

/// The controller's figures; the ones that mean trouble are marked `bad`.
fn write_controller_stats(o: &mut String, c: &ControllerStatus) -> fmt::Result {
    let stats: [(&str, String, &str, bool); 12] = [
        (
            "sessions",
            c.sessions.len().to_string(),
            "sessions",
            c.sessions.is_empty(),
        ),
        ("in-flight", c.in_flight.to_string(), "in flight", false),
        ("queued", c.queued.to_string(), "queued", false),
        ("scheduled", c.scheduled.to_string(), "scheduled", false),
        (
            "failing",
            c.failing.to_string(),
            "failing keys",
            c.failing > 0,
        ),
        ("dispatched", c.dispatched.to_string(), "dispatched", false),
        ("done", c.done.to_string(), "done", false),
        ("requeued", c.requeued.to_string(), "requeued", false),
        ("errors", c.errors.to_string(), "errors", c.errors > 0),
        (
            "terminal",
            c.terminal.to_string(),
            "terminal",
            c.terminal > 0,
        ),
        (
            "deadline-misses",
            c.deadline_misses.to_string(),
            "deadline misses",
            c.deadline_misses > 0,
        ),
        (
            "discarded",
            c.discarded.to_string(),
            "late results discarded",
            c.discarded > 0,
        ),
    ];
    for (id, n, label, bad) in stats {
        write!(
            o,
            "<span class=\"stat{}\" data-stat=\"{id}\"><span class=\"n\">{n}</span><span class=\"l\">{label}</span></span>",
            if bad { " bad" } else { "" }
        )?;
    }
    Ok(())
}

fn write_sessions(o: &mut String, c: &ControllerStatus) -> fmt::Result {
    o.push_str(
        "<div><h4>Sessions</h4><table data-list=\"sessions\"><thead><tr><th>session</th>\
         <th class=\"num\">credits</th><th class=\"num\">in flight</th><th>state</th></tr></thead><tbody>",
    );
    if c.sessions.is_empty() {
        o.push_str("<tr><td colspan=\"4\" class=\"empty\">no replica attached</td></tr>");
    }
    for s in &c.sessions {
        write!(
            o,
            "<tr data-session=\"{0}\"><td class=\"mono\">#{0}</td><td class=\"num\">{1}</td>\
             <td class=\"num\">{2}</td><td>{3}</td></tr>",
            s.session,
            s.credits,
            s.in_flight,
            if s.draining {
                "<span class=\"pill drain\">draining</span>"
            } else {
                "<span class=\"pill ok\">active</span>"
            }
        )?;
    }
    o.push_str("</tbody></table></div>");
    Ok(())
}

fn write_in_flight(o: &mut String, c: &ControllerStatus) -> fmt::Result {
    o.push_str(
        "<div><h4>In flight</h4><table data-list=\"in-flight\"><thead><tr><th>key</th>\
         <th class=\"num\">attempt</th><th>session</th><th class=\"num\">running</th></tr></thead><tbody>",
    );
    if c.in_flight_keys.is_empty() {
        o.push_str("<tr><td colspan=\"4\" class=\"empty\">none</td></tr>");
    }
    for f in &c.in_flight_keys {
        // Past half its deadline a request is worth a look before it is redelivered.
        let slow = f.running >= c.deadline / 2;
        write!(
            o,
            "<tr{}><td class=\"key\">{}</td><td class=\"num\">{}</td><td class=\"mono\">#{}</td>\
             <td class=\"num\">{}</td></tr>",
            if slow { " class=\"slow\"" } else { "" },
            Esc(&f.key.to_string()),
            f.attempt,
            f.session,
            human(f.running)
        )?;
    }
    o.push_str("</tbody></table>");
    more(o, c.in_flight_not_shown())?;
    o.push_str("</div>");
    Ok(())
}

fn write_queued(o: &mut String, c: &ControllerStatus) -> fmt::Result {
    o.push_str(
        "<div><h4>Queued</h4><table data-list=\"queued\"><thead><tr><th>key</th><th>waiting</th></tr></thead><tbody>",
    );
    if c.queued_keys.is_empty() {
        o.push_str("<tr><td colspan=\"2\" class=\"empty\">none</td></tr>");
    }
    for q in &c.queued_keys {
        let waiting = match q.lane {
            Lane::Live => "ready (live)".to_owned(),
            Lane::Background => "ready (background)".to_owned(),
            Lane::Scheduled(due) => format!("scheduled, due in {}", human(due)),
            Lane::Retry(due) => format!("failing, retry in {}", human(due)),
        };
        write!(
            o,
            "<tr data-lane=\"{}\"><td class=\"key\">{}</td><td>{}</td></tr>",
            q.lane.name(),
            Esc(&q.key.to_string()),
            waiting
        )?;
    }
    o.push_str("</tbody></table>");
    more(o, c.queued_not_shown())?;
    o.push_str("</div>");
    Ok(())
}

fn write_recent_errors(o: &mut String, c: &ControllerStatus, now: SystemTime) -> fmt::Result {
    o.push_str(
        "<h4>Recent errors</h4><table class=\"errors\" data-list=\"recent-errors\"><thead><tr>\
         <th>time (UTC)</th><th>key</th><th class=\"num\">attempt</th><th>kind</th><th>message</th>\
         </tr></thead><tbody>",
    );
    if c.recent_errors.is_empty() {
        o.push_str("<tr><td colspan=\"5\" class=\"empty\">none</td></tr>");
    }
    for e in &c.recent_errors {
        let ago = now.duration_since(e.at).unwrap_or_default();
        write!(
            o,
            "<tr class=\"err\"><td class=\"mono\" title=\"{}\">{} <span class=\"more\">({} ago)</span></td>\
             <td class=\"key\">{}</td><td class=\"num\">{}</td><td><span class=\"kind\">{}</span></td>\
             <td class=\"msg\">{}</td></tr>",
            rfc3339(e.at),
            clock(e.at),
            human(ago),
            Esc(&e.key.to_string()),
            e.attempt,
            Esc(e.kind),
            if e.message.is_empty() {
                "<span class=\"empty\">(no message)</span>".to_owned()
            } else {
                Esc(&e.message).to_string()
            }
        )?;
    }
    o.push_str("</tbody></table>");
    Ok(())
}

fn more(o: &mut String, n: usize) -> fmt::Result {
    if n > 0 {
        write!(o, "<p class=\"more\" data-more=\"{n}\">and {n} more</p>")?;
    }
    Ok(())
}

fn write_informers(o: &mut String, s: &Snapshot) -> fmt::Result {
    o.push_str(
        "<section id=\"informers\"><h2>Informers</h2><table><thead><tr><th>informer</th>\
         <th class=\"num\">objects</th><th>synced</th><th class=\"num\">relists</th></tr></thead><tbody>",
    );
    if s.informers.is_empty() {
        o.push_str("<tr><td colspan=\"4\" class=\"empty\">none</td></tr>");
    }
    for i in &s.informers {
        write!(
            o,
            "<tr data-informer=\"{0}\"><td class=\"mono\">{0}</td><td class=\"num\" data-objects=\"{1}\">{1}</td>\
             <td>{2}</td><td class=\"num\">{3}</td></tr>",
            Esc(&i.label),
            i.objects,
            if i.synced {
                "<span class=\"pill ok\">synced</span>"
            } else {
                "<span class=\"pill no\">syncing</span>"
            },
            i.relists
        )?;
    }
    o.push_str("</tbody></table></section>");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(ns, name)
    }

    fn controller(tenant: &str, name: &str) -> ControllerStatus {
        ControllerStatus {
            tenant: tenant.to_owned(),
            identity: tenant.to_owned(),
            name: name.to_owned(),
            primary: "v1/ConfigMap".to_owned(),
            mode: "reconcile",
            max_concurrent: 0,
            effective_concurrency: 0,
            deadline: Duration::from_secs(60),
            queued: 0,
            scheduled: 0,
            failing: 0,
            in_flight: 0,
            dispatched: 0,
            done: 0,
            requeued: 0,
            discarded: 0,
            errors: 0,
            terminal: 0,
            deadline_misses: 0,
            sessions: Vec::new(),
            in_flight_keys: Vec::new(),
            queued_keys: Vec::new(),
            recent_errors: Vec::new(),
            sessionless_for: None,
        }
    }

    fn snapshot(controllers: Vec<ControllerStatus>) -> Snapshot {
        Snapshot {
            settings: Settings::default(),
            identity: "mgr-a".to_owned(),
            lease_name: "ctrlhub".to_owned(),
            leading: true,
            holder: Some("mgr-a".to_owned()),
            at: SystemTime::now(),
            controllers,
            informers: vec![InformerStatus {
                label: "v1/configmaps".to_owned(),
                objects: 7,
                synced: true,
                relists: 0,
            }],
            tenant_view: None,
            ring: None,
        }
    }

    #[test]
    fn escapes_every_special_character() {
        assert_eq!(
            Esc(r#"<a href="x">'Tom' & Jerry</a>"#).to_string(),
            "&lt;a href=&quot;x&quot;&gt;&#39;Tom&#39; &amp; Jerry&lt;/a&gt;"
        );
        assert_eq!(Esc("plain ünïcode").to_string(), "plain ünïcode");
        assert_eq!(Esc("").to_string(), "");
    }

    #[test]
    fn a_script_in_an_error_message_is_shown_as_text() {
        let mut c = controller("t1", "web");
        c.recent_errors.push(RecentError {
            at: SystemTime::now(),
            key: key("ns", "a"),
            attempt: 3,
            kind: "error",
            message: "<script>alert('pwned')</script>".to_owned(),
        });
        let html = render(&snapshot(vec![c]), 0);
        assert!(!html.contains("<script"), "no script element may appear");
        assert!(
            html.contains("&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;"),
            "the message is shown escaped"
        );
    }

    #[test]
    fn names_from_outside_cannot_break_out_of_attributes() {
        let mut c = controller("t\"><b>x", "n<i>");
        c.in_flight = 1;
        c.in_flight_keys.push(InFlightView {
            key: key("ns", "\"onmouseover=\"alert(1)"),
            session: 1,
            attempt: 1,
            running: Duration::from_secs(2),
        });
        let mut s = snapshot(vec![c]);
        s.identity = "<img src=x>".to_owned();
        s.holder = Some("\"><svg>".to_owned());
        let html = render(&s, 0);
        for raw in ["\"><b>x", "<i>", "\"onmouseover", "<img", "<svg"] {
            assert!(!html.contains(raw), "{raw} appears unescaped");
        }
        assert!(html.contains("data-tenant=\"t&quot;&gt;&lt;b&gt;x\""));
    }

    #[test]
    fn queued_keys_beyond_the_limit_are_counted_not_listed() {
        let mut c = controller("t1", "web");
        c.queued = LIST_LIMIT + 7;
        c.queued_keys = (0..LIST_LIMIT)
            .map(|i| QueuedKey {
                key: key("ns", &format!("k{i}")),
                lane: Lane::Live,
            })
            .collect();
        let html = render(&snapshot(vec![c.clone()]), 0);
        assert!(html.contains("and 7 more"), "the remainder is counted");
        assert_eq!(html.matches("<tr data-lane=\"live\">").count(), LIST_LIMIT);
        assert_eq!(c.queued_not_shown(), 7);

        c.queued = 2;
        c.queued_keys.truncate(2);
        assert!(!render(&snapshot(vec![c]), 0).contains("more</p>"));
    }

    #[test]
    fn static_auth_and_the_ceiling_are_shown_and_escaped() {
        let mut s = snapshot(Vec::new());
        let html = render(&s, 0);
        assert!(!html.contains("id=\"static-auth\""));
        assert!(html.contains("Namespace ceiling: all namespaces"));
        s.settings = Settings {
            static_auth: true,
            ceiling: Some(vec!["team-a".into(), "<b>x".into()]),
        };
        let html = render(&s, 0);
        assert!(html.contains("id=\"static-auth\""));
        assert!(html.contains("<b>team-a, &lt;b&gt;x</b>"), "{html}");
        let v = s.to_json();
        assert_eq!(v["auth"], "static");
        assert_eq!(v["namespaceCeiling"], json!(["team-a", "<b>x"]));
    }

    #[test]
    fn banner_names_the_holder_for_leader_and_standby() {
        let html = render(&snapshot(Vec::new()), 5);
        assert!(html.contains("class=\"banner leader\" data-leading=\"true\""));
        assert!(html.contains("<b id=\"lease-holder\">mgr-a</b>"));
        assert!(html.contains("http-equiv=\"refresh\" content=\"5\""));

        let mut s = snapshot(Vec::new());
        s.leading = false;
        s.holder = Some("mgr-b".to_owned());
        let html = render(&s, 0);
        assert!(html.contains("STANDBY"));
        assert!(html.contains("<b id=\"lease-holder\">mgr-b</b>"));
        assert!(
            !html.contains("http-equiv"),
            "refresh 0 turns reloading off"
        );

        s.holder = None;
        assert!(render(&s, 0).contains("no holder observed yet"));
    }

    #[test]
    fn tenants_total_their_controllers() {
        let mut a = controller("t1", "a");
        a.in_flight = 2;
        a.errors = 1;
        let mut b = controller("t1", "b");
        b.queued = 3;
        b.terminal = 2;
        let c = controller("t2", "c");
        let t = snapshot(vec![a, b, c]).tenants();
        assert_eq!(t.len(), 2);
        assert_eq!(
            (
                t[0].tenant.as_str(),
                t[0].controllers,
                t[0].in_flight,
                t[0].queued,
                t[0].failures
            ),
            ("t1", 2, 2, 3, 3)
        );
        assert_eq!((t[1].tenant.as_str(), t[1].controllers), ("t2", 1));
    }

    #[test]
    fn json_keeps_the_original_fields_and_adds_keys() {
        let mut c = controller("t1", "web");
        c.scheduled = 1;
        c.queued_keys.push(QueuedKey {
            key: key("", "cluster-scoped"),
            lane: Lane::Scheduled(Duration::from_secs(30)),
        });
        let v = snapshot(vec![c]).to_json();
        assert_eq!(v["leader"], "mgr-a");
        assert_eq!(v["lease"]["holder"], "mgr-a");
        assert_eq!(v["controllers"][0]["sessions"], 0);
        assert_eq!(v["controllers"][0]["queued"], 0, "scheduled is not queued");
        assert_eq!(v["controllers"][0]["scheduled"], 1);
        assert_eq!(
            v["controllers"][0]["queuedKeys"][0]["key"],
            "cluster-scoped"
        );
        assert_eq!(v["controllers"][0]["queuedKeys"][0]["lane"], "scheduled");
        assert_eq!(v["controllers"][0]["queuedKeys"][0]["dueInSeconds"], 30.0);
        assert_eq!(v["informers"][0]["objects"], 7);
    }

    /// A key waiting on the requeue-after its controller asked for is scheduled, due at a
    /// time; a key backing off after an error is failing; neither is counted as queued.
    #[test]
    fn scheduled_and_failing_keys_are_told_apart_from_queued_ones() {
        let mut c = controller("system:serviceaccounts:team-a", "memcached");
        c.identity = "system:serviceaccount:team-a:memcached".to_owned();
        c.scheduled = 21;
        c.failing = 1;
        c.queued_keys = vec![
            QueuedKey {
                key: key("team-a", "poll"),
                lane: Lane::Scheduled(Duration::from_secs(286)),
            },
            QueuedKey {
                key: key("team-a", "broken"),
                lane: Lane::Retry(Duration::from_secs(3)),
            },
        ];
        let s = snapshot(vec![c]);
        let html = render(&s, 0);
        assert!(html.contains("<td>scheduled, due in 4m 46s</td>"), "{html}");
        assert!(html.contains("<td>failing, retry in 3.0 s</td>"), "{html}");
        assert!(html.contains("id=\"summary-queued\"><div class=\"n\">0</div>"));
        assert!(html.contains("id=\"summary-scheduled\"><div class=\"n\">21</div>"));
        assert!(
            html.contains("class=\"card bad\" id=\"summary-failing\"><div class=\"n\">1</div>")
        );
        assert!(html.contains("data-identity=\"system:serviceaccount:team-a:memcached\""));
        assert!(html.contains("data-tenant=\"system:serviceaccounts:team-a\""));
        let t = &s.to_json()["tenants"][0];
        assert_eq!(
            (
                t["queued"].as_u64(),
                t["scheduled"].as_u64(),
                t["failing"].as_u64()
            ),
            (Some(0), Some(21), Some(1))
        );
    }

    #[test]
    fn effective_concurrency_is_the_credits_within_the_maximum() {
        assert_eq!(effective_concurrency(0, 8), 8, "no maximum: the credits");
        assert_eq!(effective_concurrency(4, 8), 4);
        assert_eq!(effective_concurrency(10, 8), 8);
        assert_eq!(
            effective_concurrency(4, 0),
            0,
            "no session, nothing can run"
        );
    }

    #[test]
    fn a_request_past_half_its_deadline_is_marked() {
        let mut c = controller("t1", "web");
        c.in_flight = 2;
        for (name, secs) in [("slow", 45), ("fresh", 3)] {
            c.in_flight_keys.push(InFlightView {
                key: key("ns", name),
                session: 1,
                attempt: 1,
                running: Duration::from_secs(secs),
            });
        }
        let html = render(&snapshot(vec![c]), 0);
        assert!(html.contains("<tr class=\"slow\"><td class=\"key\">ns/slow</td>"));
        assert!(html.contains("<tr><td class=\"key\">ns/fresh</td>"));
    }

    #[test]
    fn durations_read_like_a_person_writes_them() {
        assert_eq!(human(Duration::from_millis(850)), "850 ms");
        assert_eq!(human(Duration::from_millis(4200)), "4.2 s");
        assert_eq!(human(Duration::from_secs(187)), "3m 07s");
        assert_eq!(human(Duration::from_secs(7500)), "2h 05m");
    }
}
