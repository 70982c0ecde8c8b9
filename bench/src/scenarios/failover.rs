//! Failover: two managers with a 3 s lease (2 s renew deadline, 500 ms retry), three raw gRPC
//! replicas that follow whichever manager accepts them, and a steady stream of updates. Figures:
//! time from the leader's SIGTERM, and later from the new leader's SIGKILL, to the first request
//! dispatched by the successor; the same crash with the lease deploy/ ships (15 s); and how many times a key was dispatched while another replica
//! was still working on it (must be 0). Each reconcile "works" 20 ms and finishes that work even
//! when its session has ended meanwhile, as a real controller would.

use crate::env::{Cluster, FAST_LEASE, Manager, load, widget_type};
use crate::report::{Outcome, Row, Verdict};
use anyhow::{Result, bail};
use ctrlhub_tests::PATIENCE;
use ctrlhub_tests::replica::{Replica, done_message, key, register};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const OBJECTS: usize = 200;
const WORK: Duration = Duration::from_millis(20);
/// The lease duration the managers run with (FAST_LEASE).
const LEASE: Duration = Duration::from_secs(3);
/// The lease deploy/ ships (the flags' default).
const SHIPPED_LEASE: Duration = Duration::from_secs(15);

#[derive(Default)]
struct Shared {
    /// The managers' gRPC endpoints, tried in turn by the replicas.
    endpoints: Vec<String>,
    /// (when, endpoint) of every dispatched request.
    dispatched: Vec<(Instant, String)>,
    /// Keys being worked on right now, and by how many replicas.
    in_flight: HashMap<String, u32>,
    /// Dispatches of a key already in flight.
    overlaps: u64,
}

type State = Arc<Mutex<Shared>>;

fn lock(s: &State) -> parking_lot::MutexGuard<'_, Shared> {
    s.lock()
}

/// One replica: connect to whichever endpoint accepts, serve until the session ends, repeat.
async fn replica(state: State, ns: String, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let endpoints = lock(&state).endpoints.clone();
        // Dial every manager at once and keep the first that registers us, as a Service
        // selecting the leader's pod would route a reconnect; a manager that is shutting down
        // may hold a new stream open without answering, hence the short timeout per attempt.
        let attempts = endpoints.into_iter().map(|ep| {
            let reg = register("failover", widget_type(), 8, Some(&ns));
            Box::pin(async move {
                match tokio::time::timeout(Duration::from_millis(500), Replica::connect(&ep, reg))
                    .await
                {
                    Ok(Ok(r)) => Ok((r, ep)),
                    _ => Err(()),
                }
            })
        });
        if let Ok(((mut r, ep), _)) = futures::future::select_ok(attempts).await {
            let answers = r.answers();
            while let Ok(msg) = r.recv().await {
                let Some(req) = msg else { continue };
                let k = key(&req);
                {
                    let mut s = lock(&state);
                    s.dispatched.push((Instant::now(), ep.clone()));
                    let n = s.in_flight.entry(k.clone()).or_default();
                    *n += 1;
                    if *n > 1 {
                        s.overlaps += 1;
                    }
                }
                let state = state.clone();
                let answers = answers.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(WORK).await;
                    {
                        let mut s = lock(&state);
                        if let Some(n) = s.in_flight.get_mut(&k) {
                            *n -= 1;
                            if *n == 0 {
                                s.in_flight.remove(&k);
                            }
                        }
                    }
                    let _ = answers.send(done_message(&req.id)).await;
                });
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// First dispatch through `endpoint` after `t0`.
async fn first_dispatch_after(state: &State, endpoint: &str, t0: Instant) -> Result<Duration> {
    loop {
        if let Some((at, _)) = lock(state)
            .dispatched
            .iter()
            .find(|(at, ep)| *at >= t0 && ep == endpoint)
        {
            return Ok(at.duration_since(t0));
        }
        if t0.elapsed() > PATIENCE {
            bail!("no request dispatched through {endpoint} within {PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// When `m` leads, polled from `t0` (separates the lease handover from the controllers'
/// reconnect in the figures).
async fn lease_taken_after(m: &Manager, t0: Instant) -> Result<Duration> {
    while !m.leading().await {
        if t0.elapsed() > PATIENCE {
            bail!("{} does not lead within {PATIENCE:?}", m.identity);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(t0.elapsed())
}

/// The lease deploy/ ships (15 s, renew deadline 10 s, retry 2 s: the flags' defaults): a
/// manager with it takes over from `leader` gracefully, then is SIGKILLed with a standby of the
/// same settings; the crash handover is measured from the kill to the standby's first dispatch.
async fn shipped_lease_crash(
    c: &Cluster,
    state: &State,
    leader: Manager,
) -> Result<(Duration, Duration)> {
    let shipped = Manager::start(c, "fo-shipped-a", &[]).await?;
    lock(state).endpoints = vec![leader.grpc.clone(), shipped.grpc.clone()];
    let mut leader = leader;
    let t0 = Instant::now();
    leader.stop().await;
    lease_taken_after(&shipped, t0).await?;
    first_dispatch_after(state, &shipped.grpc, t0).await?;
    let standby = Manager::start(c, "fo-shipped-b", &[]).await?;
    lock(state).endpoints = vec![shipped.grpc.clone(), standby.grpc.clone()];
    tokio::time::sleep(Duration::from_secs(3)).await;
    eprintln!("failover: SIGKILL of a leader with the shipped 15 s lease");
    let mut shipped = shipped;
    let t0 = Instant::now();
    shipped.kill().await;
    let lease = lease_taken_after(&standby, t0).await?;
    let first = first_dispatch_after(state, &standby.grpc, t0).await?;
    eprintln!(
        "  crash handover with the shipped lease {:.2} s (lease taken over after {:.2} s)",
        first.as_secs_f64(),
        lease.as_secs_f64()
    );
    Ok((first, lease))
}

/// Run the scenario.
pub async fn run() -> Result<Outcome> {
    let c = Cluster::start().await?;
    let ns = "failover";
    c.create_widgets(ns, OBJECTS, 32).await?;
    let a = Manager::start(&c, "fo-a", &FAST_LEASE).await?;
    a.wait_leading().await?;
    let b = Manager::start(&c, "fo-b", &FAST_LEASE).await?;
    let state: State = Arc::new(Mutex::new(Shared {
        endpoints: vec![a.grpc.clone(), b.grpc.clone()],
        ..Default::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let replicas: Vec<_> = (0..3)
        .map(|_| tokio::spawn(replica(state.clone(), ns.into(), stop.clone())))
        .collect();
    let sent = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let loader = {
        let (stop, sent, errors) = (stop.clone(), sent.clone(), errors.clone());
        let client = c.client.clone();
        tokio::spawn(async move { load(&client, ns, OBJECTS, 200, stop, sent, errors).await })
    };
    first_dispatch_after(&state, &a.grpc, Instant::now()).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Graceful: SIGTERM the leader (it revokes sessions and releases the lease).
    eprintln!("failover: graceful stop of the leader");
    let mut a = a;
    let t0 = Instant::now();
    let stopping = tokio::spawn(async move {
        a.stop().await;
        a
    });
    let graceful_lease = lease_taken_after(&b, t0).await?;
    let graceful = first_dispatch_after(&state, &b.grpc, t0).await?;
    let _a = stopping.await?;
    eprintln!(
        "  graceful handover {:.2} s (lease taken over after {:.2} s)",
        graceful.as_secs_f64(),
        graceful_lease.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A new standby, warm, then SIGKILL the leader: the lease must expire first.
    let a2 = Manager::start(&c, "fo-a2", &FAST_LEASE).await?;
    lock(&state).endpoints = vec![b.grpc.clone(), a2.grpc.clone()];
    tokio::time::sleep(Duration::from_secs(3)).await;
    eprintln!("failover: SIGKILL of the leader");
    let mut b = b;
    let t0 = Instant::now();
    b.kill().await;
    let crash_lease = lease_taken_after(&a2, t0).await?;
    let crash = first_dispatch_after(&state, &a2.grpc, t0).await?;
    eprintln!(
        "  crash handover {:.2} s (lease taken over after {:.2} s)",
        crash.as_secs_f64(),
        crash_lease.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (shipped, shipped_lease) = shipped_lease_crash(&c, &state, a2).await?;

    stop.store(true, Ordering::Relaxed);
    let _ = loader.await;
    for r in replicas {
        r.abort();
    }
    let (overlaps, dispatched) = {
        let s = lock(&state);
        (s.overlaps, s.dispatched.len())
    };
    let crash_goal = LEASE + Duration::from_secs(2);
    let rows = vec![
        Row::new(
            "failover",
            "graceful handover (SIGTERM → first dispatch)",
            format!("{:.2} s", graceful.as_secs_f64()),
            "",
            "≤ 1 s",
            Verdict::of(graceful <= Duration::from_secs(1)),
        ),
        Row::info(
            "failover",
            "  of which until the successor leads",
            format!("{:.2} s", graceful_lease.as_secs_f64()),
            "",
        ),
        Row::new(
            "failover",
            "crash handover (SIGKILL → first dispatch)",
            format!("{:.2} s", crash.as_secs_f64()),
            "",
            "≤ lease 3 s + 2 s",
            Verdict::of(crash <= crash_goal),
        ),
        Row::info(
            "failover",
            "  of which until the successor leads",
            format!("{:.2} s", crash_lease.as_secs_f64()),
            "",
        ),
        Row::new(
            "failover",
            "crash handover, shipped 15 s lease (SIGKILL → first dispatch)",
            format!("{:.2} s", shipped.as_secs_f64()),
            "",
            "≤ lease 15 s + 2 s",
            Verdict::of(shipped <= SHIPPED_LEASE + Duration::from_secs(2)),
        ),
        Row::info(
            "failover",
            "  of which until the successor leads",
            format!("{:.2} s", shipped_lease.as_secs_f64()),
            "",
        ),
        Row::new(
            "failover",
            "keys dispatched twice concurrently",
            overlaps.to_string(),
            "",
            "0",
            Verdict::of(overlaps == 0),
        ),
    ];
    Ok(Outcome {
        scenario: "failover".into(),
        rows,
        json: serde_json::json!({"leaseSeconds": LEASE.as_secs(), "renewDeadlineSeconds": 2, "retryPeriodMs": 500,
            "gracefulSeconds": graceful.as_secs_f64(), "crashSeconds": crash.as_secs_f64(),
            "gracefulLeaseSeconds": graceful_lease.as_secs_f64(), "crashLeaseSeconds": crash_lease.as_secs_f64(),
            "shippedLeaseSeconds": SHIPPED_LEASE.as_secs(), "shippedCrashSeconds": shipped.as_secs_f64(), "shippedCrashLeaseSeconds": shipped_lease.as_secs_f64(),
            "concurrentDuplicates": overlaps, "dispatched": dispatched,
            "writes": sent.load(Ordering::Relaxed), "writeErrors": errors.load(Ordering::Relaxed)}),
    })
}
