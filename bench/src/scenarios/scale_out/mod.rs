//! Scale-out: ring members (`ctrlhub run --mode ring`) sharing the registered controllers,
//! measured with N = 1, 2 and 3 members in one run and one process layout on devcluster
//! (design: `scale-out.md` §6.2). 30 controllers (`--controllers`) of 2 raw replicas each, one
//! namespace of Widgets per controller, replicas in the harness' process that follow redirects
//! and `UNIT_MOVED` by hand, and the bench's fast leases (3 s lease, 2 s renew deadline, 500 ms
//! retry).
//!
//! The run: 1 member, then 2, then a third joins (2→3), the first member leaves by SIGTERM
//! (3→2), a fourth joins and one is SIGKILLed (3→2). At each N, with the ring settled: the units
//! each member's `/status` owns against `ctrlhub::members::hrw::owner`; idle CPU-ms/s and Lease
//! requests per member; CPU-ms per 1,000 reconciles per member under steady updates spread over
//! every controller. Across each move: the units moved against the function's set (collateral
//! moves must be 0), per moved unit the seal and seal → first dispatch at the successor (join:
//! seal from the old owner's `/status` moves; leave: SIGTERM → `Revoked` at the replica), and
//! kill → first dispatch for the crash; every dispatch of a key still in flight at another
//! replica is counted (must be 0). At N = 3: Connect → Registered → first request direct and
//! through one redirect. Then fresh rings for memory (configs D and S, N = 1 and 3), and the
//! assignment function's cost over 3 and 100 members.

pub mod costs;
pub mod replicas;
pub mod ring;

use crate::env::{Cluster, Manager, load};
use crate::report::{Outcome, Row, Verdict, mib, percentiles};
use anyhow::{Result, bail};
use costs::{Config, Memory};
use replicas::{Log, Seen, Shared, Spec};
use ring::{addr, expected, owners};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The lease the members run with (FAST_LEASE).
const LEASE: Duration = Duration::from_secs(3);
/// The namespace of the routing phase's controllers.
const ROUTE_NS: &str = "so-route";

/// Sizes of one run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Controllers (units).
    pub controllers: usize,
    /// Replicas per controller.
    pub replicas: usize,
    /// Widgets per controller namespace.
    pub objects: usize,
    /// Updates per second, over all namespaces, while CPU per reconcile is measured.
    pub rate: u32,
    /// How long the updates run at each N.
    pub load: Duration,
    /// Updates per second during the handovers.
    pub handover_rate: u32,
    /// The idle window at each N.
    pub idle: Duration,
    /// Connects per routing figure (direct, and through a redirect).
    pub connects: usize,
    /// `owner()` evaluations per HRW figure over 3 members (a thirtieth over 100).
    pub hrw_evals: usize,
}

impl Plan {
    /// The full run with `controllers` controllers.
    pub fn full(controllers: usize) -> Plan {
        Plan {
            controllers,
            replicas: 2,
            objects: 1_000,
            rate: 400,
            load: Duration::from_secs(25),
            handover_rate: 60,
            idle: Duration::from_secs(10),
            connects: 50,
            hrw_evals: 3_000_000,
        }
    }

    /// A run of seconds per phase with `controllers` controllers (`--quick`, the smoke test).
    pub fn quick(controllers: usize) -> Plan {
        Plan {
            controllers,
            replicas: 2,
            objects: 20,
            rate: 100,
            load: Duration::from_secs(3),
            handover_rate: 20,
            idle: Duration::from_secs(2),
            connects: 4,
            hrw_evals: 30_000,
        }
    }
}

/// One ring size, settled.
#[derive(Debug, Clone)]
pub struct Steady {
    /// Per member: identity, units its `/status` owns, and under load (Δ CPU seconds,
    /// Δ reconciles), then idle CPU-ms/s.
    pub members: Vec<(String, usize, (f64, f64), f64)>,
    /// Whether every unit is owned where `hrw::owner` says.
    pub matches: bool,
    /// Lease writes (create, update, patch) per second per member, idle.
    pub lease_writes: f64,
    /// Lease reads (get, list) per second per member, idle.
    pub lease_reads: f64,
    /// Reconciles per second over all members while the updates ran.
    pub reconciles_per_s: f64,
}

impl Steady {
    /// CPU-ms per 1,000 reconciles summed over the members.
    pub fn cpu_per_1k(&self) -> f64 {
        let (cpu, rec) = self
            .members
            .iter()
            .fold((0.0, 0.0), |(c, r), m| (c + m.2.0, r + m.2.1));
        if rec > 0.0 { cpu * 1e6 / rec } else { 0.0 }
    }

    fn json(&self) -> serde_json::Value {
        let members: Vec<_> = self.members.iter().map(|(id, units, (cpu, rec), idle)| {
            serde_json::json!({"identity": id, "units": units, "loadCpuSeconds": cpu, "loadReconciles": rec,
                "cpuMsPer1000Reconciles": if *rec > 0.0 { Some(cpu * 1e6 / rec) } else { None },
                "idleCpuMsPerSecond": idle})
        }).collect();
        serde_json::json!({"n": self.members.len(), "matchesHrw": self.matches, "members": members,
            "cpuMsPer1000Reconciles": self.cpu_per_1k(), "leaseWritesPerSecondPerMember": self.lease_writes,
            "leaseReadsPerSecondPerMember": self.lease_reads, "reconcilesPerSecond": self.reconciles_per_s})
    }
}

/// One membership change.
#[derive(Debug, Clone, Default)]
pub struct Change {
    /// Units whose owner changed.
    pub moved: usize,
    /// Units the function moves.
    pub expected: usize,
    /// Moved units the function does not move, plus units it moves that did not.
    pub collateral: usize,
    /// Per moved unit: the seal (empty for a crash).
    pub seal: Vec<Duration>,
    /// Per moved unit: seal end (the `Revoked`) → first dispatch at the successor; for a
    /// crash, the kill → first dispatch there.
    pub to_dispatch: Vec<Duration>,
}

impl Change {
    fn json(&self) -> serde_json::Value {
        let secs = |v: &[Duration]| v.iter().map(Duration::as_secs_f64).collect::<Vec<_>>();
        serde_json::json!({"moved": self.moved, "expected": self.expected, "collateral": self.collateral,
            "sealSeconds": secs(&self.seal), "toFirstDispatchSeconds": secs(&self.to_dispatch)})
    }
}

/// Everything one run measured.
#[derive(Debug, Clone)]
pub struct Figures {
    /// N = 1, 2, 3.
    pub steady: Vec<Steady>,
    /// 2→3.
    pub join: Change,
    /// 3→2 by SIGTERM.
    pub leave: Change,
    /// 3→2 by SIGKILL.
    pub crash: Change,
    /// Dispatches of a key in flight at another replica, over the whole run.
    pub overlaps: u64,
    /// Requests dispatched over the whole run.
    pub dispatched: u64,
    /// Connect → first request: direct, and through one redirect.
    pub routing: (Vec<Duration>, Vec<Duration>),
    /// Memory rings.
    pub memory: Vec<Memory>,
    /// (members, ns per `owner()` evaluation).
    pub hrw: Vec<(usize, f64)>,
}

/// Steady updates over every controller namespace until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(c: &Cluster, namespaces: &[String], objects: usize, rate: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let each = (rate / namespaces.len().max(1) as u32).max(1);
        let tasks = namespaces
            .iter()
            .map(|ns| {
                let (client, ns) = (c.client.clone(), ns.clone());
                let (stop, sent) = (stop.clone(), sent.clone());
                let errors = Arc::new(AtomicU64::new(0));
                tokio::spawn(
                    async move { load(&client, &ns, objects, each, stop, sent, errors).await },
                )
            })
            .collect();
        Load { stop, sent, tasks }
    }

    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        self.sent.load(Ordering::Relaxed)
    }
}

/// The test bed: devcluster, the live members, the replicas and their log.
struct Bed {
    c: Cluster,
    plan: Plan,
    names: Vec<String>,
    namespaces: Vec<String>,
    members: Vec<Manager>,
    log: Shared,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Bed {
    fn refs(&self) -> Vec<&Manager> {
        self.members.iter().collect()
    }

    fn want(&self) -> BTreeMap<String, String> {
        expected("ctrlhub", &self.names, &self.refs())
    }

    /// The "Service": replicas without an address to go to dial the live members in turn.
    fn serve_members(&self) {
        self.log.lock().members = self.members.iter().map(addr).collect();
    }

    /// Starts member `identity` and waits until every member publishes the new view.
    async fn add_member(&mut self, identity: &str) -> Result<()> {
        let m = ring::member(&self.c, identity, "ctrlhub").await?;
        self.members.push(m);
        self.serve_members();
        ring::settled(&self.refs()).await
    }

    /// [`Bed::add_member`], then every unit owned where the function says.
    async fn join(&mut self, identity: &str) -> Result<()> {
        self.add_member(identity).await?;
        self.settle().await
    }

    /// The ring settled and every unit owned where the function says.
    async fn settle(&self) -> Result<()> {
        ring::settled(&self.refs()).await?;
        ring::wait_owned(&self.refs(), &self.want()).await
    }

    /// Until no key is in flight and nothing was dispatched for 500 ms.
    async fn quiet(&self) -> Result<()> {
        let start = Instant::now();
        loop {
            let before = self.log.lock().dispatched;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let l = self.log.lock();
            if l.in_flight() == 0 && l.dispatched == before {
                return Ok(());
            }
            if start.elapsed() > super::LOAD_PATIENCE {
                bail!("dispatch never went quiet");
            }
        }
    }

    async fn counters(&self) -> Result<Vec<(f64, f64)>> {
        let mut out = Vec::new();
        for m in &self.members {
            out.push(ring::counters(m).await?);
        }
        Ok(out)
    }

    /// The figures of the settled ring at its current size.
    async fn steady(&self) -> Result<Steady> {
        let n = self.members.len();
        eprintln!("scale-out: N = {n}");
        let want = self.want();
        let got = owners(&self.refs(), &self.names).await;
        self.quiet().await?;
        let (cpu0, (w0, r0), t) = (
            self.counters().await?,
            ring::lease_requests(&self.c),
            Instant::now(),
        );
        tokio::time::sleep(self.plan.idle).await;
        let (cpu1, (w1, r1)) = (self.counters().await?, ring::lease_requests(&self.c));
        let idle = t.elapsed().as_secs_f64();
        let per_member = |d: u64| d as f64 / idle / n as f64;
        let (lease_writes, lease_reads) = (per_member(w1 - w0), per_member(r1 - r0));
        let t = Instant::now();
        let load = Load::start(&self.c, &self.namespaces, self.plan.objects, self.plan.rate);
        tokio::time::sleep(self.plan.load).await;
        load.stop().await;
        self.quiet().await?;
        let cpu2 = self.counters().await?;
        let busy = t.elapsed().as_secs_f64();
        let mut members = Vec::new();
        let mut reconciles = 0.0;
        for (i, m) in self.members.iter().enumerate() {
            let units = got.values().filter(|o| **o == m.identity).count();
            let under_load = (cpu2[i].0 - cpu1[i].0, cpu2[i].1 - cpu1[i].1);
            reconciles += under_load.1;
            let idle_ms = (cpu1[i].0 - cpu0[i].0) * 1e3 / idle;
            members.push((m.identity.clone(), units, under_load, idle_ms));
        }
        Ok(Steady {
            members,
            matches: got == want,
            lease_writes,
            lease_reads,
            reconciles_per_s: reconciles / busy,
        })
    }

    /// Who owns what now, by `/status`.
    async fn owners(&self) -> BTreeMap<String, String> {
        owners(&self.refs(), &self.names).await
    }

    /// Waits until each of `units` had a first dispatch at a member other than `from` after
    /// `t0`.
    async fn wait_dispatched_elsewhere(
        &self,
        units: &BTreeSet<String>,
        from: &str,
        t0: Instant,
    ) -> Result<()> {
        ctrlhub_tests::poll_until(
            "every moved unit dispatched at its successor",
            ctrlhub_tests::PATIENCE,
            || async {
                let l = self.log.lock();
                let left = units
                    .iter()
                    .filter(|u| first_dispatch_at(&l, u, t0, |m| m != from).is_none())
                    .count();
                if left == 0 {
                    Ok(())
                } else {
                    Err(format!("{left} not yet"))
                }
            },
        )
        .await?;
        Ok(())
    }
}

/// When `name` first saw a `Revoked` from `member` after `t0`.
fn revoked_at(l: &Log, name: &str, member: &str, t0: Instant) -> Option<Instant> {
    l.first_after(name, t0, |e| {
        e.member == member && matches!(e.seen, Seen::Revoked(_))
    })
    .map(|e| e.at)
}

/// When `name` first got a session's first request, after `t0`, from a member `at` accepts.
fn first_dispatch_at(
    l: &Log,
    name: &str,
    t0: Instant,
    at: impl Fn(&str) -> bool,
) -> Option<Instant> {
    l.first_after(name, t0, |e| at(&e.member) && e.seen == Seen::FirstDispatch)
        .map(|e| e.at)
}

/// Moved, expected and collateral counts between two ownership maps.
fn compare(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    want: &BTreeSet<String>,
) -> Change {
    let moved: BTreeSet<String> = after
        .iter()
        .filter(|(n, o)| before.get(*n) != Some(o))
        .map(|(n, _)| n.clone())
        .collect();
    Change {
        moved: moved.len(),
        expected: want.len(),
        collateral: moved.symmetric_difference(want).count(),
        ..Default::default()
    }
}

/// 2→3: a member joins; seals from the old owners' `/status`.
async fn join(bed: &mut Bed, identity: &str) -> Result<Change> {
    eprintln!("scale-out: join 2→3");
    let before = bed.owners().await;
    let load = Load::start(
        &bed.c,
        &bed.namespaces,
        bed.plan.objects,
        bed.plan.handover_rate,
    );
    let t0 = Instant::now();
    bed.join(identity).await?;
    let joiner = addr(&bed.members[bed.members.len() - 1]);
    let after = bed.owners().await;
    let want: BTreeSet<String> = after
        .iter()
        .filter(|(_, o)| **o == identity)
        .map(|(n, _)| n.clone())
        .collect();
    let joined = ctrlhub_tests::poll_until(
        "the joiner dispatching its units",
        ctrlhub_tests::PATIENCE,
        || async {
            let l = bed.log.lock();
            let left = want
                .iter()
                .filter(|u| first_dispatch_at(&l, u, t0, |m| m == joiner).is_none())
                .count();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} not yet"))
            }
        },
    );
    joined.await?;
    load.stop().await;
    let mut change = compare(&before, &after, &want);
    for name in &want {
        let Some(old) = bed
            .members
            .iter()
            .find(|m| before.get(name) == Some(&m.identity))
        else {
            continue;
        };
        if let Some(s) = ring::seal_seconds(&old.status().await, name) {
            change.seal.push(Duration::from_secs_f64(s));
        }
        let l = bed.log.lock();
        if let Some(rev) = revoked_at(&l, name, &addr(old), t0)
            && let Some(first) = first_dispatch_at(&l, name, rev, |m| m == joiner)
        {
            change.to_dispatch.push(first - rev);
        }
    }
    Ok(change)
}

/// 3→2: the first member leaves by SIGTERM.
async fn leave(bed: &mut Bed) -> Result<Change> {
    eprintln!("scale-out: graceful leave 3→2");
    let before = bed.owners().await;
    let mut leaver = bed.members.remove(0);
    let from = addr(&leaver);
    let want: BTreeSet<String> = before
        .iter()
        .filter(|(_, o)| **o == leaver.identity)
        .map(|(n, _)| n.clone())
        .collect();
    let load = Load::start(
        &bed.c,
        &bed.namespaces,
        bed.plan.objects,
        bed.plan.handover_rate,
    );
    let t0 = Instant::now();
    leaver.signal("TERM");
    bed.serve_members();
    bed.wait_dispatched_elsewhere(&want, &from, t0).await?;
    if !leaver.exited(ctrlhub_tests::PATIENCE).await {
        bail!("the leaving member did not exit");
    }
    bed.settle().await?;
    load.stop().await;
    let mut change = compare(&before, &bed.owners().await, &want);
    let l = bed.log.lock();
    for name in &want {
        if let Some(rev) = revoked_at(&l, name, &from, t0) {
            change.seal.push(rev - t0);
            if let Some(first) = first_dispatch_at(&l, name, rev, |m| m != from) {
                change.to_dispatch.push(first - rev);
            }
        }
    }
    Ok(change)
}

/// 3→2: the first member is SIGKILLed.
async fn crash(bed: &mut Bed) -> Result<Change> {
    eprintln!("scale-out: crash 3→2");
    let before = bed.owners().await;
    let mut dead = bed.members.remove(0);
    let from = addr(&dead);
    let want: BTreeSet<String> = before
        .iter()
        .filter(|(_, o)| **o == dead.identity)
        .map(|(n, _)| n.clone())
        .collect();
    let load = Load::start(
        &bed.c,
        &bed.namespaces,
        bed.plan.objects,
        bed.plan.handover_rate,
    );
    let t0 = Instant::now();
    dead.kill().await;
    bed.serve_members();
    bed.wait_dispatched_elsewhere(&want, &from, t0).await?;
    bed.settle().await?;
    load.stop().await;
    let mut change = compare(&before, &bed.owners().await, &want);
    let l = bed.log.lock();
    change.to_dispatch = want
        .iter()
        .filter_map(|n| first_dispatch_at(&l, n, t0, |m| m != from))
        .map(|at| at - t0)
        .collect();
    Ok(change)
}

/// Connect → first request at N = 3, direct to the owner and through one redirect, each for
/// fresh controllers on a namespace every member already caches.
async fn routing(bed: &Bed) -> Result<(Vec<Duration>, Vec<Duration>)> {
    eprintln!("scale-out: routing");
    let refs = bed.refs();
    let spec = |name: String| Spec {
        name,
        namespace: Some(ROUTE_NS.into()),
        predicate: None,
    };
    // One controller per member on the namespace: its informer is warm everywhere.
    let mut warm = BTreeMap::new();
    for m in &refs {
        let name = (0..).map(|i| format!("so-warm-{i}")).find(|n| {
            !warm.contains_key(n)
                && expected("ctrlhub", std::slice::from_ref(n), &refs)[n] == m.identity
        });
        if let Some(n) = name {
            warm.insert(n, m.identity.clone());
        }
    }
    let tasks: Vec<_> = warm
        .keys()
        .enumerate()
        .map(|(i, n)| replicas::spawn(bed.log.clone(), spec(n.clone()), i))
        .collect();
    ring::wait_owned(&refs, &warm).await?;
    let (mut direct, mut redirected) = (Vec::new(), Vec::new());
    for i in 0..bed.plan.connects {
        // Alternating which goes first, so neither always finds the other's leftovers.
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for redirect in order {
            let name = format!("so-route-{i}-{}", if redirect { "r" } else { "d" });
            let owner = &expected("ctrlhub", std::slice::from_ref(&name), &refs)[&name];
            let others: Vec<&&Manager> = refs.iter().filter(|m| &m.identity != owner).collect();
            let first = if redirect {
                addr(others[i % others.len()])
            } else {
                bed.members
                    .iter()
                    .find(|m| &m.identity == owner)
                    .map(addr)
                    .unwrap_or_default()
            };
            let (took, hops) = replicas::time_to_first_request(&first, &spec(name.clone())).await?;
            if hops != u32::from(redirect) {
                bail!(
                    "{name}: {hops} redirects (expected {})",
                    u32::from(redirect)
                );
            }
            if redirect {
                redirected.push(took)
            } else {
                direct.push(took)
            }
        }
    }
    for t in tasks {
        t.abort();
    }
    Ok((direct, redirected))
}

/// Runs the whole scenario at `plan`'s sizes.
pub async fn measure(plan: &Plan) -> Result<Figures> {
    let c = Cluster::start().await?;
    let names: Vec<String> = (0..plan.controllers)
        .map(|i| format!("so-c{i:02}"))
        .collect();
    let namespaces: Vec<String> = (0..plan.controllers)
        .map(|i| format!("so-{i:02}"))
        .collect();
    eprintln!(
        "scale-out: {} controllers × {} Widgets",
        plan.controllers, plan.objects
    );
    for ns in &namespaces {
        c.create_widgets(ns, plan.objects, 64).await?;
    }
    c.create_widgets(ROUTE_NS, 5, 8).await?;
    let mut bed = Bed {
        c,
        plan: plan.clone(),
        names,
        namespaces,
        members: Vec::new(),
        log: Shared::default(),
        tasks: Vec::new(),
    };
    bed.add_member("so-1").await?;
    for (i, name) in bed.names.iter().enumerate() {
        for r in 0..plan.replicas {
            let spec = Spec {
                name: name.clone(),
                namespace: Some(bed.namespaces[i].clone()),
                predicate: None,
            };
            bed.tasks
                .push(replicas::spawn(bed.log.clone(), spec, i + r));
        }
    }
    bed.settle().await?;
    let mut steady = vec![bed.steady().await?];
    bed.join("so-2").await?;
    steady.push(bed.steady().await?);
    let join = join(&mut bed, "so-3").await?;
    bed.quiet().await?;
    steady.push(bed.steady().await?);
    let routing = routing(&bed).await?;
    let leave = leave(&mut bed).await?;
    bed.join("so-4").await?;
    bed.quiet().await?;
    let crash = crash(&mut bed).await?;
    bed.quiet().await?;
    for t in bed.tasks.drain(..) {
        t.abort();
    }
    for m in &mut bed.members {
        m.kill().await;
    }
    let (overlaps, dispatched) = {
        let l = bed.log.lock();
        (l.overlaps, l.dispatched)
    };
    let mut memory = Vec::new();
    let total = plan.controllers * plan.objects + 5;
    for config in [Config::Disjoint, Config::Shared] {
        for n in [1, 3] {
            eprintln!("scale-out: memory, config {}, N = {n}", config.letter());
            memory.push(
                costs::memory(
                    &bed.c,
                    config,
                    n,
                    &bed.names,
                    &bed.namespaces,
                    (plan.objects, total),
                )
                .await?,
            );
        }
    }
    let evals = plan.hrw_evals;
    let hrw = tokio::task::spawn_blocking(move || {
        vec![
            (3, costs::hrw_ns(3, evals)),
            (100, costs::hrw_ns(100, evals / 30)),
        ]
    })
    .await?;
    Ok(Figures {
        steady,
        join,
        leave,
        crash,
        overlaps,
        dispatched,
        routing,
        memory,
        hrw,
    })
}

fn pct(v: &[Duration]) -> (Duration, Duration) {
    let mut v = v.to_vec();
    let (p50, p99, _) = percentiles(&mut v);
    (p50, p99)
}

fn secs2(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// The rows of one ring size.
fn steady_rows(s: &Steady, base: Option<&Steady>) -> Vec<Row> {
    let n = s.members.len();
    let units = s
        .members
        .iter()
        .map(|m| m.1.to_string())
        .collect::<Vec<_>>()
        .join(" / ");
    let per_member = s
        .members
        .iter()
        .map(|m| {
            if m.2.1 > 0.0 {
                format!("{:.0}", m.2.0 * 1e6 / m.2.1)
            } else {
                "–".into()
            }
        })
        .collect::<Vec<_>>()
        .join(" / ");
    let idle = s
        .members
        .iter()
        .map(|m| format!("{:.1}", m.3))
        .collect::<Vec<_>>()
        .join(" / ");
    let idle_max = s.members.iter().map(|m| m.3).fold(0.0, f64::max);
    let mut rows = vec![
        Row::new(
            "scale-out",
            &format!("N={n}: units per member (/status)"),
            units,
            "",
            "= hrw::owner",
            Verdict::of(s.matches),
        ),
        Row::info(
            "scale-out",
            &format!("N={n}: CPU-ms per 1,000 reconciles, per member"),
            per_member,
            "",
        ),
    ];
    let all = s.cpu_per_1k();
    rows.push(match base {
        Some(b) => {
            let ratio = all / b.cpu_per_1k();
            Row::new(
                "scale-out",
                &format!("N={n}: CPU-ms per 1,000 reconciles, all members"),
                format!("{all:.0} ({ratio:.2}× N=1)"),
                "",
                "within ±15% of N=1",
                Verdict::of((0.85..=1.15).contains(&ratio)),
            )
        }
        None => Row::info(
            "scale-out",
            &format!("N={n}: CPU-ms per 1,000 reconciles, all members"),
            format!("{all:.0}"),
            "",
        ),
    });
    rows.push(Row::info(
        "scale-out",
        &format!("N={n}: reconciles/s under the updates (all members)"),
        format!("{:.0}", s.reconciles_per_s),
        "",
    ));
    rows.push(Row::new(
        "scale-out",
        &format!("N={n}: idle CPU-ms/s per member"),
        idle,
        "",
        "≤ 5",
        Verdict::of(idle_max <= 5.0),
    ));
    rows.push(Row::new(
        "scale-out",
        &format!("N={n}: member-Lease writes/s per member (reads/s)"),
        format!("{:.2} ({:.2})", s.lease_writes, s.lease_reads),
        "",
        "≤ 1 per 500 ms retry (2/s)",
        Verdict::of(s.lease_writes <= 2.05),
    ));
    rows
}

/// The rows of one membership change.
fn change_rows(what: &str, ch: &Change, seal: &str, dispatch: &str, crash: bool) -> Vec<Row> {
    let mut rows = vec![
        Row::new(
            "scale-out",
            &format!("{what}: units moved (HRW set)"),
            format!("{} ({})", ch.moved, ch.expected),
            "",
            "= HRW set",
            Verdict::of(ch.moved == ch.expected && ch.collateral == 0),
        ),
        Row::new(
            "scale-out",
            &format!("{what}: collateral moves"),
            ch.collateral.to_string(),
            "",
            "0",
            Verdict::of(ch.collateral == 0),
        ),
    ];
    if !crash {
        let (p50, p99) = pct(&ch.seal);
        rows.push(Row::info(
            "scale-out",
            &format!("{what}: {seal} p50 / p99 ({} units)", ch.seal.len()),
            format!("{} / {}", secs2(p50), secs2(p99)),
            "",
        ));
    }
    let (p50, p99) = pct(&ch.to_dispatch);
    let row = if crash {
        let x = p99.saturating_sub(LEASE);
        Row::new(
            "scale-out",
            &format!(
                "{what}: {dispatch} p50 / p99 ({} units)",
                ch.to_dispatch.len()
            ),
            format!(
                "{} / {} (lease 3 s + {:.2} s)",
                secs2(p50),
                secs2(p99),
                x.as_secs_f64()
            ),
            "",
            "≤ lease 3 s + 2 s",
            Verdict::of(
                p99 <= LEASE + Duration::from_secs(2) && ch.to_dispatch.len() == ch.expected,
            ),
        )
    } else {
        Row::new(
            "scale-out",
            &format!(
                "{what}: {dispatch} p50 / p99 ({} units)",
                ch.to_dispatch.len()
            ),
            format!("{} / {}", secs2(p50), secs2(p99)),
            "",
            "p99 ≤ 1 s",
            Verdict::of(p99 <= Duration::from_secs(1) && ch.to_dispatch.len() == ch.expected),
        )
    };
    rows.push(row);
    rows
}

/// The memory rows: per-member RSS per config and N; D's goal from design §6.2.
fn memory_rows(mem: &[Memory]) -> Vec<Row> {
    let mut rows = Vec::new();
    for m in mem {
        let rss = m
            .per_member
            .iter()
            .map(|(u, _, r)| format!("{} ({u} u)", mib(*r)))
            .collect::<Vec<_>>()
            .join(" / ");
        rows.push(Row::info(
            "scale-out",
            &format!(
                "memory {}, N={}: RSS per member (units)",
                m.config.letter(),
                m.members
            ),
            rss,
            "",
        ));
    }
    let one = mem
        .iter()
        .find(|m| m.config == Config::Disjoint && m.members == 1);
    let three = mem
        .iter()
        .find(|m| m.config == Config::Disjoint && m.members == 3);
    if let (Some(one), Some(three)) = (one, three) {
        // Each member's cache growth over its own baseline B, against its share of N = 1's
        // growth (design §6.2: RSS_m − B ≤ 1.2 × U_m/U × (RSS_1 − B)); members without units
        // have no share to compare with and are left out.
        let (u1, b1, r1) = one.per_member[0];
        let growth1 = r1.saturating_sub(b1) as f64;
        let ratios: Vec<f64> = three
            .per_member
            .iter()
            .filter(|(u, _, _)| *u > 0)
            .map(|(u, b, r)| {
                r.saturating_sub(*b) as f64 / (*u as f64 / u1.max(1) as f64 * growth1).max(1.0)
            })
            .collect();
        let worst = ratios.iter().copied().fold(0.0, f64::max);
        let text = ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" / ");
        rows.push(Row::new(
            "scale-out",
            "memory D, N=3: (RSS_m − B) ÷ (U_m/U × (RSS_1 − B)), members with units",
            text,
            "",
            "≤ 1.2",
            Verdict::of(worst <= 1.2),
        ));
    }
    rows
}

/// Runs the scenario with `plan` and reports it.
pub async fn run(plan: &Plan) -> Result<Outcome> {
    let f = measure(plan).await?;
    let mut rows = Vec::new();
    for (i, s) in f.steady.iter().enumerate() {
        rows.extend(steady_rows(s, (i > 0).then(|| &f.steady[0])));
    }
    rows.extend(change_rows(
        "join 2→3",
        &f.join,
        "seal (old owner's /status)",
        "Revoked → first dispatch at the joiner",
        false,
    ));
    rows.extend(change_rows(
        "leave 3→2 (SIGTERM)",
        &f.leave,
        "SIGTERM → Revoked",
        "Revoked → first dispatch at the successor",
        false,
    ));
    rows.extend(change_rows(
        "crash 3→2 (SIGKILL)",
        &f.crash,
        "",
        "kill → first dispatch at the successor",
        true,
    ));
    rows.push(Row::new(
        "scale-out",
        "keys dispatched to two replicas at once",
        f.overlaps.to_string(),
        "",
        "0",
        Verdict::of(f.overlaps == 0),
    ));
    let ((d50, _), (r50, _)) = (pct(&f.routing.0), pct(&f.routing.1));
    let added = r50.saturating_sub(d50);
    rows.push(Row::new(
        "scale-out",
        &format!(
            "Connect → first request p50, direct / one redirect ({} each)",
            f.routing.0.len()
        ),
        format!(
            "{} / {} (+{})",
            crate::report::ms(d50),
            crate::report::ms(r50),
            crate::report::ms(added)
        ),
        "",
        "redirect adds ≤ 5 ms",
        Verdict::of(added <= Duration::from_millis(5)),
    ));
    rows.extend(memory_rows(&f.memory));
    for (n, ns) in &f.hrw {
        rows.push(Row::info(
            "scale-out",
            &format!("hrw::owner over {n} members (ns per evaluation)"),
            format!("{ns:.0} ({:.1} per member)", ns / *n as f64),
            "",
        ));
    }
    let ms = |v: &[Duration]| v.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>();
    let json = serde_json::json!({
        "controllers": plan.controllers, "replicas": plan.replicas, "objectsPerController": plan.objects,
        "updatesPerSecond": plan.rate, "loadSeconds": plan.load.as_secs_f64(), "idleSeconds": plan.idle.as_secs_f64(),
        "leaseSeconds": LEASE.as_secs(), "renewDeadlineSeconds": 2, "retryPeriodMs": 500,
        "steady": f.steady.iter().map(Steady::json).collect::<Vec<_>>(),
        "join": f.join.json(), "leave": f.leave.json(), "crash": f.crash.json(),
        "concurrentDuplicates": f.overlaps, "dispatched": f.dispatched,
        "routing": {"directMs": ms(&f.routing.0), "redirectMs": ms(&f.routing.1)},
        "memory": f.memory.iter().map(Memory::json).collect::<Vec<_>>(),
        "hrw": f.hrw.iter().map(|(n, ns)| serde_json::json!({"members": n, "nsPerEvaluation": ns})).collect::<Vec<_>>(),
    });
    Ok(Outcome {
        scenario: "scale-out".into(),
        rows,
        json,
    })
}
