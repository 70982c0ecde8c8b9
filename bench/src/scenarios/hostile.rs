//! Hostile tenants: team-b's update-to-delivery latency (median and p99 over N
//! updates) and the manager's peak resident memory while team-a makes each attack of the issue,
//! beside a quiet baseline. Each case gets its own devcluster and `ctrlhub run --auth kubernetes`
//! with default limits (attack 6 shortens the token cache to 2 s, attack 8 sets team-a's
//! in-flight limit to 20, as the issue does), built from the same bed and attack drivers as the
//! hostile suite (`ctrlhub_tests::hostile`); cases 13–19 are the strangers suite's attacks
//! (`ctrlhub_tests::strangers`), case 15 with the manager's open-file limit at 256; cases 20–28
//! the tenant attacks of the isolation issue (the hostile suite's attacks 13–21).
//!
//! An update that does not arrive within [`BOUND`] counts at the bound (so its real latency is
//! at least the figure shown) and the case stops measuring after [`WINDOW`]: today an attack can
//! make team-b wait a minute or forever. The manager's memory is capped at its Deployment's limit
//! (1 GiB): an attack that drives it past that is stopped, and the row says so.

use crate::env::{bin, out_dir};
use crate::report::{Outcome, Row, Verdict, mib, ms};
use anyhow::{Context, Result};
use ctrlhub_tests::Launch;
use ctrlhub_tests::hostile::*;
use ctrlhub_tests::strangers;
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long one update may take before it counts as late.
pub const BOUND: Duration = Duration::from_secs(5);

/// How long one case measures team-b at most.
pub const WINDOW: Duration = Duration::from_secs(20);

/// The manager's memory cap: the Deployment's limit.
const CAP: u64 = 1024 * MIB;

/// The cases: 0 is the quiet baseline, 1–12 the first named attacks by a tenant, 13–19 the
/// attacks that need no credentials (drivers shared with `tests/tests/adversity/strangers.rs` in
/// `ctrlhub_tests::strangers`), 20–28 the tenant attacks one step beside the first ones
/// (`tests/tests/adversity/hostile.rs` attacks 13–21).
pub const CASES: [u8; 29] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
    26, 27, 28,
];

/// What a case is called in the table.
fn case_name(case: u8) -> &'static str {
    match case {
        0 => "quiet baseline",
        1 => "1 seat monopoly",
        2 => "2 redelivery storm",
        3 => "3 readiness poisoning",
        4 => "4 quadratic registrations",
        5 => "5 leak on churn",
        6 => "6 credentials outlive revocation",
        7 => "7 cache amplification",
        8 => "8 credit bypass",
        9 => "9 large messages",
        10 => "10 TokenReview amplification",
        11 => "11 scope",
        12 => "12 HTTP",
        13 => "13 silent gRPC connections",
        14 => "14 silent HTTPS connections",
        15 => "15 connection flood at fd limit 256",
        16 => "16 concurrent junk-token waves",
        17 => "17 junk beside a cached token",
        18 => "18 Connect streams before Register",
        19 => "19 unknown kinds",
        20 => "20 resync storm",
        21 => "21 predicate cost",
        22 => "22 Sybil tenants (16 seats)",
        23 => "23 unacknowledged events",
        24 => "24 first lists over budget",
        25 => "25 others' tombstones",
        26 => "26 credit flood",
        27 => "27 List amplification",
        28 => "28 registration counts and rates",
        _ => "unknown",
    }
}

/// The flags a case adds to the manager's: the attack's own settings for attacks 6 and 8, and
/// for 5 no registration rate limit, so that the churn reaches the leak it looks for (the same
/// flags as `tests/tests/adversity/hostile.rs`). Tenants are namespaces (the default grouping), so limits
/// name team-a's group.
fn case_flags(case: u8) -> Vec<String> {
    let team_a = format!("system:serviceaccounts:{TEAM_A}");
    match case {
        5 => vec![
            "--tenant-limit".into(),
            format!("{team_a}/registrations-per-second=0"),
        ],
        6 => vec!["--token-cache-ttl".into(), "2s".into()],
        8 => vec!["--tenant-limit".into(), format!("{team_a}/in-flight=20")],
        21 => vec![
            "--tenant-limit".into(),
            format!("{team_a}/registrations-per-second=0"),
        ],
        22 => vec!["--max-dispatch-seats".into(), "16".into()],
        23 => vec![
            "--tenant-limit".into(),
            format!("{team_a}/queued-bytes=8388608"),
        ],
        24 => vec![
            "--tenant-limit".into(),
            format!("{team_a}/cached-bytes=8388608"),
        ],
        28 => vec!["--tenant-limit".into(), format!("{team_a}/controllers=11")],
        _ => Vec::new(),
    }
}

/// The harness' launch of the release manager, logging warnings only; case 15 starts it with
/// an open-file limit of 256 (soft and hard), as a container runtime may.
fn launch(case: u8) -> Result<Launch> {
    let mut binary = bin("ctrlhub")?;
    if case == 15 {
        std::fs::create_dir_all(out_dir())?;
        binary = ctrlhub_tests::strangers::with_fd_limit(&binary, 256, &out_dir())?;
    }
    Ok(Launch {
        binary,
        log_dir: out_dir().join("logs"),
        rust_log: std::env::var("CTRLHUB_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
        token: None,
        env: Vec::new(),
    })
}

/// When a case's attack is under way, and when it must stop.
struct Switch {
    armed: AtomicBool,
    stop: AtomicBool,
    breached: Arc<AtomicBool>,
}

impl Switch {
    /// The attack is under way: team-b is measured from now on.
    fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Whether the attack must stop: team-b has been measured, or the manager hit its cap.
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.breached.load(Ordering::Relaxed)
    }

    /// Waits until the attack must stop.
    async fn hold(&self) {
        while !self.stopping() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A flag for drivers that poll one, raised once the attack must stop, and the future that
    /// raises it (run it beside the driver).
    fn relay(&self) -> (Arc<AtomicBool>, impl Future<Output = ()> + '_) {
        let flag = Arc::new(AtomicBool::new(false));
        let raise = flag.clone();
        let relay = async move {
            self.hold().await;
            raise.store(true, Ordering::Relaxed);
        };
        (flag, relay)
    }
}

/// One case's figures.
struct Figures {
    case: u8,
    samples: Samples,
    health: Health,
    note: String,
    seconds: f64,
}

impl Figures {
    fn json(&self) -> serde_json::Value {
        let (p50, p99, max) = self.samples.percentiles(BOUND);
        json!({"case": self.case, "name": case_name(self.case),
            "updates": self.samples.count(), "late": self.samples.late.len(),
            "medianMs": p50.as_secs_f64() * 1e3, "p99Ms": p99.as_secs_f64() * 1e3,
            "maxMs": max.as_secs_f64() * 1e3, "boundMs": BOUND.as_secs_f64() * 1e3,
            "rssStartBytes": self.health.rss_start, "rssPeakBytes": self.health.rss_peak,
            "readyzFailures": self.health.readyz_failures, "leaseFailures": self.health.lease_failures,
            "watchdogSamples": self.health.samples, "note": self.note, "seconds": self.seconds})
    }
}

/// Runs every case, `updates` team-b updates each (within [`WINDOW`]).
pub async fn run(updates: usize) -> Result<Outcome> {
    let mut figures = Vec::new();
    for case in CASES {
        eprintln!("hostile: {}", case_name(case));
        let f = measure(case, updates)
            .await
            .with_context(|| format!("case {}", case_name(case)))?;
        let (p50, p99, _) = f.samples.percentiles(BOUND);
        eprintln!(
            "  team-b median {} p99 {} ({} of {} late); peak RSS {}; {}",
            ms(p50),
            ms(p99),
            f.samples.late.len(),
            f.samples.count(),
            mib(f.health.rss_peak),
            f.note
        );
        figures.push(f);
    }
    Ok(outcome(&figures))
}

/// One case: bed, team-b, watchdog; the attack set up, then team-b measured while it goes on.
async fn measure(case: u8, updates: usize) -> Result<Figures> {
    let started = Instant::now();
    let flags = case_flags(case);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let bed = Bed::start(&launch(case)?, &format!("hostile-{case}"), &flags).await?;
    let mut team_b = TeamB::start(&bed).await?;
    bed.wait_ready().await?;
    let watchdog = Watchdog::start(&bed, CAP).await?;
    let switch = Switch {
        armed: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        breached: watchdog.breached(),
    };
    let plan = ProbePlan {
        updates,
        // Spread over ten seconds or more, so that attacks whose cost builds up are measured
        // at their height, not only as they start.
        gap: Duration::from_millis(100),
        bound: BOUND,
        window: WINDOW,
    };
    let attack = async {
        let note = attack(case, &bed, &switch).await;
        // An attack that ends (or fails) early must not leave team-b's probe waiting to start.
        switch.arm();
        note
    };
    let probing = async {
        while !switch.armed.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let samples = probe(&mut team_b, plan).await;
        switch.stop.store(true, Ordering::Relaxed);
        samples
    };
    let (note, samples) = tokio::join!(attack, probing);
    let mut note = note.unwrap_or_else(|e| format!("the attack failed: {e:#}"));
    if switch.breached.load(Ordering::Relaxed) {
        note.push_str("; stopped at the 1 GiB cap");
    }
    if let Some(ended) = team_b.ended() {
        note.push_str(&format!("; {ended}"));
    }
    let health = watchdog.finish().await;
    Ok(Figures {
        case,
        samples,
        health,
        note,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Sets up `case`'s attack, arms the switch and keeps the attack going until told to stop;
/// returns what the manager answered, in words.
async fn attack(case: u8, bed: &Bed, sw: &Switch) -> Result<String> {
    match case {
        1 => seat_monopoly_case(bed, sw).await,
        2 => storm_case(bed, sw).await,
        3 => poisoning_case(bed, sw).await,
        4 => owns_case(bed, sw).await,
        5 => churn_case(bed, sw).await,
        6 => credentials_case(bed, sw).await,
        7 => amplification_case(bed, sw).await,
        8 => credit_case(bed, sw).await,
        9 => large_case(bed, sw).await,
        10 => junk_case(bed, sw).await,
        11 => scope_case(bed, sw).await,
        12 => http_case(bed, sw).await,
        13 => silent_grpc_case(bed, sw).await,
        14 => silent_https_case(bed, sw).await,
        15 => fd_flood_case(bed, sw).await,
        16 => junk_waves_case(bed, sw).await,
        17 => cached_token_case(bed, sw).await,
        18 => pending_case(bed, sw).await,
        19 => unknown_kinds_case(bed, sw).await,
        20 => resync_case(bed, sw).await,
        21 => predicate_case(bed, sw).await,
        22 => sybil_case(bed, sw).await,
        23 => deaf_events_case(bed, sw).await,
        24 => first_lists_case(bed, sw).await,
        25 => tombstones_case(bed, sw).await,
        26 => credit_flood_case(bed, sw).await,
        27 => list_case(bed, sw).await,
        28 => counts_case(bed, sw).await,
        _ => {
            sw.arm();
            sw.hold().await;
            Ok("no attack".into())
        }
    }
}

async fn resync_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let refused = short(&short_resync(bed, "resync", Duration::from_nanos(1)).await);
    bed.fill(TEAM_A, "resync", 2_000, 16).await?;
    let mut hogs = Vec::new();
    for name in ["resync-a", "resync-b"] {
        if let Ok(r) = short_resync(bed, name, Duration::from_secs(10)).await {
            hogs.push(Holder::spawn(r));
        }
    }
    let cpu = cpu_seconds(bed.pid());
    let t0 = Instant::now();
    sw.arm();
    sw.hold().await;
    let cores = (cpu_seconds(bed.pid()) - cpu) / t0.elapsed().as_secs_f64();
    Ok(format!(
        "a 1 ns resync: {refused}; two 10 s resyncs over 2,000 never-answered keys: {cores:.2} cores"
    ))
}

async fn predicate_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let wide = short(&bed.connect(predicate_bomb(99, 1000, 11), &bed.a_auth).await);
    annotate(bed, 2_000, 0).await?;
    let mut bombs = Vec::new();
    for i in 0..12 {
        if let Ok(r) = bed.connect(predicate_bomb(i, 1023, 0), &bed.a_auth).await {
            bombs.push(r);
        }
    }
    let cpu = cpu_seconds(bed.pid());
    sw.arm();
    let mut rounds = 0;
    while !sw.stopping() {
        rounds += 1;
        annotate(bed, 2_000, rounds).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let spent = cpu_seconds(bed.pid()) - cpu;
    Ok(format!(
        "12 trees of 1,000 nodes in one Register: {wide}; {} registrations of 1,024 nodes, {rounds} updates of a 2,000-annotation object: {:.1} CPU-ms per update",
        bombs.len(),
        spent * 1e3 / rounds.max(1) as f64
    ))
}

async fn sybil_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let mut sybils = Vec::new();
    for i in 0..16 {
        sybils.push(sybil(bed, i).await?);
    }
    for s in &sybils {
        s.settle(Duration::from_millis(500), Duration::from_secs(10))
            .await;
    }
    let held: usize = sybils.iter().map(Holder::in_flight).sum();
    sw.arm();
    sw.hold().await;
    Ok(format!(
        "16 tenants with a 600 s deadline hold {held} of 16 seats"
    ))
}

async fn deaf_events_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let deaf = deaf_events(bed, "deaf").await?;
    let payload = "x".repeat(256 * 1024);
    sw.arm();
    let mut updates = 0;
    while !sw.stopping() && updates < 600 {
        bed.put(
            TEAM_A,
            "big",
            &[("payload", &payload), ("i", &updates.to_string())],
        )
        .await?;
        updates += 1;
    }
    let compacted = deaf.alive();
    bed.fill(TEAM_A, "many", 40, 256 * 1024).await?;
    let revoked = poll_ok(Duration::from_secs(30), || !deaf.alive()).await;
    sw.hold().await;
    Ok(format!(
        "{updates} updates of a 256 KiB object never acked: session {}; 40 more objects under 8 MiB of queued bytes: {}",
        if compacted {
            "kept (compacted)"
        } else {
            "revoked"
        },
        if revoked { "revoked" } else { "not revoked" }
    ))
}

async fn first_lists_case(bed: &Bed, sw: &Switch) -> Result<String> {
    bed.fill_bystander("bulk", 400, 100 * 1024).await?;
    sw.arm();
    let answers =
        futures::future::join_all((0..10).map(|i| bed.connect(amplifier(i), &bed.a_auth))).await;
    let exhausted = answers
        .iter()
        .filter(|a| matches!(a, Err(s) if s.code() == tonic::Code::ResourceExhausted))
        .count();
    sw.hold().await;
    Ok(format!(
        "10 concurrent selector registrations over 40 MiB at an 8 MiB budget: {exhausted} RESOURCE_EXHAUSTED"
    ))
}

async fn tombstones_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let holder = Holder::spawn(
        bed.connect(amplifier(0), &bed.a_auth)
            .await
            .map_err(|s| anyhow::anyhow!("{s:?}"))?,
    );
    sw.arm();
    let mut rounds = 0;
    let mut warm = 0;
    while !sw.stopping() {
        churn_bystander(bed, rounds, 200, 20_000).await?;
        rounds += 1;
        if rounds == 2 {
            warm = bed.rss();
        }
    }
    let grew = bed.rss().saturating_sub(warm);
    drop(holder);
    Ok(format!(
        "{rounds} rounds of 200 ConfigMaps of 20 KB created and deleted elsewhere: RSS {} after the second round",
        if rounds > 2 {
            format!("{:+} KiB", grew / 1024)
        } else {
            "not measured".into()
        }
    ))
}

async fn credit_flood_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let holder = credit_bypass(bed, 10).await?;
    sw.arm();
    let mut sent = 0usize;
    while !sw.stopping() {
        credit_flood(&holder, 10_000).await?;
        sent += 10_000;
    }
    Ok(format!(
        "{sent} alternating Credits, session alive: {}",
        holder.alive()
    ))
}

async fn list_case(bed: &Bed, sw: &Switch) -> Result<String> {
    bed.fill(TEAM_A, "listed", 20_000, 64).await?;
    let reader = bed
        .connect(team_a_registration("reader", 1), &bed.a_auth)
        .await
        .map_err(|s| anyhow::anyhow!("{s:?}"))?;
    let session = reader.session_id.clone();
    let _holder = Holder::spawn(reader);
    sw.arm();
    let (stop, relay) = sw.relay();
    let ((answered, largest), ()) = tokio::join!(list_flood(bed, &session, 8, stop), relay);
    Ok(format!(
        "8 loops listing 20,000 objects with a selector matching none: {answered} Lists, largest page {largest}"
    ))
}

async fn counts_case(bed: &Bed, sw: &Switch) -> Result<String> {
    sw.arm();
    let mut accepted = 0;
    let mut refused = 0;
    for i in 0..12 {
        match bed
            .connect(team_a_registration(&format!("r{i}"), 1), &bed.a_auth)
            .await
        {
            Ok(_) => accepted += 1,
            Err(_) => refused += 1,
        }
    }
    sw.hold().await;
    Ok(format!(
        "12 registrations at once: {accepted} accepted, {refused} RESOURCE_EXHAUSTED"
    ))
}

/// Waits up to `within` for `done`.
async fn poll_ok(within: Duration, done: impl Fn() -> bool) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}

async fn seat_monopoly_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let hog = seat_monopoly(bed, 300).await?;
    hog.settle(Duration::from_secs(1), Duration::from_secs(20))
        .await;
    let century = century_deadline(bed).await;
    sw.arm();
    sw.hold().await;
    Ok(format!(
        "the hog held up to {} requests; a century deadline: {}",
        hog.peak(),
        describe(&century)
    ))
}

async fn storm_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let storm = redelivery_storm(bed, 300).await?;
    sw.arm();
    sw.hold().await;
    Ok(format!(
        "shortest deadline accepted {:?}, never read",
        storm.deadline
    ))
}

async fn poisoning_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let poisoned = poisoned_selector(bed, 70_000).await;
    sw.arm();
    let slow = stalled_informer(bed, "Pod", "pods", ListFault::Slow(Duration::from_secs(6)));
    let failing = stalled_informer(bed, "Service", "services", ListFault::Failing(403));
    let (slow, failing) = tokio::join!(slow, failing);
    sw.hold().await;
    Ok(format!(
        "70 KB selector: {}; slow list: {}; failing list: {}",
        short(&poisoned),
        short(&slow),
        short(&failing)
    ))
}

async fn owns_case(bed: &Bed, sw: &Switch) -> Result<String> {
    sw.arm();
    let (mut cycles, mut accepted, mut slowest) = (0, 0, Duration::ZERO);
    while !sw.stopping() {
        let (answer, took) = owns_flood_cycle(bed, 100_000).await;
        cycles += 1;
        accepted += usize::from(answer.is_ok());
        slowest = slowest.max(took);
    }
    Ok(format!(
        "{cycles} registrations of 100,000 owns entries, {accepted} accepted, slowest answer \
         {slowest:.1?}"
    ))
}

async fn churn_case(bed: &Bed, sw: &Switch) -> Result<String> {
    sw.arm();
    let (stop, relay) = sw.relay();
    let (samples, ()) = tokio::join!(churn(bed, usize::MAX, 4, 50, stop), relay);
    let samples = samples?;
    let cycles = samples.last().map_or(0, |s| s.cycle);
    let slope = growth_per_cycle(&samples, cycles / 2);
    Ok(format!(
        "{cycles} Connect/Register/close cycles; RSS growth over the second half {} bytes/cycle",
        slope.map_or("?".into(), |b| format!("{b:.0}"))
    ))
}

async fn credentials_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let (expiring, expiry) = expiring_session(bed, Duration::from_secs(5)).await?;
    let doomed = account_session(bed, "doomed").await?;
    delete_account(bed, "doomed").await?;
    let deleted = Instant::now();
    sw.arm();
    let (expired, removed) = tokio::join!(end_of(expiring, expiry), end_of(doomed, deleted));
    sw.hold().await;
    Ok(format!(
        "the expired-token session {expired} the expiry; the deleted account's session \
         {removed} the deletion"
    ))
}

/// How long after `since` the session ended, and how, in words (within [`WINDOW`]).
async fn end_of(mut session: ctrlhub_tests::Replica, since: Instant) -> String {
    let left = (since + WINDOW).saturating_duration_since(Instant::now());
    match session.ended(left).await {
        Some(s) => format!("ended ({:?}) {:.1?} after", s.code(), since.elapsed()),
        None => format!("was still open {WINDOW:?} after"),
    }
}

async fn amplification_case(bed: &Bed, sw: &Switch) -> Result<String> {
    bed.fill_bystander("bulk", 250, 20_000).await?;
    sw.arm();
    let answers = cache_amplification(bed, 63, &sw.breached).await;
    sw.hold().await;
    let accepted = answers.iter().filter(|a| a.is_ok()).count();
    Ok(format!(
        "{accepted} of {} registrations accepted (5 MB of ConfigMaps in a bystander namespace); first refusal: \
         {}",
        answers.len(),
        answers
            .iter()
            .find(|a| a.is_err())
            .map_or("none".into(), short)
    ))
}

async fn credit_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let hog = credit_bypass(bed, 100).await?;
    sw.arm();
    hog.credit(1000).await?;
    hog.settle(Duration::from_secs(1), Duration::from_secs(10))
        .await;
    let after_1000 = hog.peak();
    hog.credit(4_000_000_000).await?;
    sw.hold().await;
    Ok(format!(
        "in flight under a limit of 20: {after_1000} after Credit{{1000}}, {} after \
         Credit{{4000000000}}",
        hog.peak()
    ))
}

async fn large_case(bed: &Bed, sw: &Switch) -> Result<String> {
    sw.arm();
    let (stop, relay) = sw.relay();
    let (tally, ()) = tokio::join!(large_messages(bed, 3_300_000, 2, stop), relay);
    Ok(format!(
        "3.3 MB Registers: {} accepted, refused {:?}",
        tally.accepted, tally.refused
    ))
}

async fn junk_case(bed: &Bed, sw: &Switch) -> Result<String> {
    sw.arm();
    let (mut calls, mut reviews, mut accepted) = (0, 0, 0);
    let t0 = Instant::now();
    while !sw.stopping() {
        let flood = junk_token_flood(bed, 5_000, 64).await;
        calls += flood.calls;
        reviews += flood.token_reviews;
        accepted += flood.accepted;
    }
    Ok(format!(
        "{calls} junk-token Connects in {:.1?}: {reviews} TokenReviews, {accepted} accepted",
        t0.elapsed()
    ))
}

async fn scope_case(bed: &Bed, sw: &Switch) -> Result<String> {
    sw.arm();
    let escape = scope_escape(bed, 20).await?;
    sw.hold().await;
    Ok(format!(
        "{} of {} requests to team-a named a key in team-b",
        escape.leaked.len(),
        escape.keys.len()
    ))
}

async fn http_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let snoop = http_snoop(bed, 500).await?;
    sw.arm();
    let (mut requests, mut errors) = (snoop.flood, snoop.flood_errors);
    let t0 = Instant::now();
    while !sw.stopping() {
        let (made, failed) = http_flood_team_a(bed, 500).await?;
        requests += made;
        errors += failed;
    }
    Ok(format!(
        "{requests} HTTP requests (valid and junk tokens) in {:.1?}, {errors} answered 5xx; \
         team-a read team-b on {:?}; anonymous callers served {:?}",
        t0.elapsed(),
        snoop.leaked,
        snoop.anonymous_served
    ))
}

async fn silent_grpc_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let grpc = strangers::socket_addr(&bed.manager.grpc)?;
    sw.arm();
    let (mut rounds, mut peak_open) = (0, 0);
    while !sw.stopping() {
        let silent = strangers::silent_connections(strangers::ATTACKER, grpc, 300).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        peak_open = peak_open.max(silent.still_open());
        rounds += 1;
    }
    Ok(format!(
        "{rounds} rounds of 300 silent connections from one address: at most {peak_open} open a second later; manager fds {}",
        strangers::open_fds(bed.pid())
    ))
}

async fn silent_https_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let http = strangers::socket_addr(&bed.manager.http)?;
    let tls = strangers::silent_after_tls(strangers::ATTACKER, http, 20).await?;
    sw.arm();
    let mut peak_open = 0;
    while !sw.stopping() {
        let silent = strangers::silent_connections(strangers::ATTACKER_2, http, 150).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        peak_open = peak_open.max(silent.still_open());
    }
    Ok(format!(
        "150 silent HTTPS connections a second from one address: at most {peak_open} open; {} connections silent after TLS held",
        tls.len()
    ))
}

async fn fd_flood_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let pid = bed.pid();
    let grpc = strangers::socket_addr(&bed.manager.grpc)?;
    let (cpu0, t0) = (strangers::cpu_time(pid), Instant::now());
    sw.arm();
    let mut peak_fds = 0;
    while !sw.stopping() {
        let (_silent, peak) = strangers::peak_fds_during(pid, async {
            let silent = strangers::silent_connections(strangers::ATTACKER, grpc, 1_100).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            silent
        })
        .await;
        peak_fds = peak_fds.max(peak);
    }
    let cpu =
        strangers::cpu_time(pid).saturating_sub(cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();
    Ok(format!(
        "1,100 silent connections every 2 s under an open-file limit of 256: peak {peak_fds} fds, {cpu:.2} cores"
    ))
}

async fn junk_waves_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let before = bed.token_reviews();
    let t0 = Instant::now();
    sw.arm();
    let (mut calls, mut accepted) = (0, 0);
    while !sw.stopping() {
        let (a, b, c) = tokio::join!(
            junk_token_flood(bed, 300, 100),
            junk_token_flood(bed, 300, 100),
            junk_token_flood(bed, 300, 100)
        );
        calls += a.calls + b.calls + c.calls;
        accepted += a.accepted + b.accepted + c.accepted;
    }
    Ok(format!(
        "{calls} junk-token Connects in waves of 3 x 300 over {:.1?}: {} TokenReviews, {accepted} accepted",
        t0.elapsed(),
        bed.token_reviews().saturating_sub(before)
    ))
}

async fn cached_token_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let (stop, relay) = sw.relay();
    let junk = async {
        let mut calls = 0;
        while !stop.load(Ordering::Relaxed) {
            calls += junk_token_flood(bed, 200, 16).await.calls;
        }
        calls
    };
    let sessions = async {
        sw.arm();
        let (mut opened, mut refused) = (0, 0);
        while !sw.stopping() {
            let r = ctrlhub_tests::register(
                "steady-again",
                ctrlhub_tests::replica::configmaps(),
                1,
                Some(TEAM_B),
            );
            match bed.connect(r, &bed.b_auth).await {
                Ok(_) => opened += 1,
                Err(_) => refused += 1,
            }
        }
        (opened, refused)
    };
    let (calls, (opened, refused), ()) = tokio::join!(junk, sessions, relay);
    Ok(format!(
        "{calls} junk-token Connects from team-b's address; team-b opened {opened} sessions with its cached token meanwhile, {refused} refused"
    ))
}

async fn pending_case(bed: &Bed, sw: &Switch) -> Result<String> {
    drop(
        bed.connect(team_a_registration("prime", 1), &bed.a_auth)
            .await,
    );
    sw.arm();
    let mut answers = strangers::Answers::default();
    while !sw.stopping() {
        let (round, ()) = strangers::silent_connects(
            bed.channel(),
            &bed.a_auth,
            2_000,
            Duration::from_secs(3),
            async {},
        )
        .await?;
        for (code, n) in round.codes {
            *answers.codes.entry(code).or_default() += n;
        }
    }
    Ok(format!(
        "Connect streams that never Register, 2,000 at a time: {:?}",
        answers.codes
    ))
}

async fn unknown_kinds_case(bed: &Bed, sw: &Switch) -> Result<String> {
    let before = strangers::discovery_calls(bed);
    sw.arm();
    let (mut registers, mut round) = (0, 0);
    while !sw.stopping() {
        let repeated = strangers::unknown_kinds(bed, 50, |_| strangers::unknown_kind(0)).await;
        let distinct = strangers::unknown_kinds(bed, 50, |i| {
            strangers::unknown_kind(1_000 * (round + 1) + i)
        })
        .await;
        registers +=
            repeated.codes.values().sum::<usize>() + distinct.codes.values().sum::<usize>();
        round += 1;
    }
    Ok(format!(
        "{registers} Registers naming kinds nobody serves (half one kind, half new ones): {} discovery calls",
        strangers::discovery_calls(bed).saturating_sub(before)
    ))
}

/// An answer in a few words: `accepted`, or the status code.
fn short(answer: &Answer) -> String {
    match answer {
        Ok(_) => "accepted".into(),
        Err(s) => format!("{:?}", s.code()),
    }
}

/// The table rows and JSON of every case: team-b's latency against the goal of the issue (p99
/// within 50 ms of the quiet p99) and the manager's peak memory against its limit.
fn outcome(figures: &[Figures]) -> Outcome {
    let quiet_p99 = figures
        .iter()
        .find(|f| f.case == 0)
        .map_or(Duration::ZERO, |f| f.samples.percentiles(BOUND).1);
    let mut rows = Vec::new();
    for f in figures {
        let (p50, p99, _) = f.samples.percentiles(BOUND);
        let bound = if f.samples.late.is_empty() {
            ""
        } else {
            "≥ "
        };
        let late = format!("{} of {} late", f.samples.late.len(), f.samples.count());
        let name = case_name(f.case);
        rows.push(Row::new(
            "hostile",
            &format!("{name}: team-b median/p99"),
            format!("{}/{bound}{} ({late})", ms(p50), ms(p99)),
            "",
            "p99 ≤ quiet p99 + 50 ms",
            Verdict::of(f.samples.late.is_empty() && p99 <= quiet_p99 + Duration::from_millis(50)),
        ));
        rows.push(Row::new(
            "hostile",
            &format!("{name}: manager peak RSS"),
            mib(f.health.rss_peak),
            "",
            "< 1 GiB (Deployment limit)",
            Verdict::of(f.health.rss_peak < CAP),
        ));
    }
    let cases: Vec<_> = figures.iter().map(Figures::json).collect();
    Outcome {
        scenario: "hostile".into(),
        rows,
        json: json!({"boundMs": BOUND.as_secs_f64() * 1e3, "windowSeconds": WINDOW.as_secs_f64(),
            "cases": cases}),
    }
}
