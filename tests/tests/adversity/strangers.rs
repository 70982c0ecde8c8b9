//! Strangers get nothing free (the isolation issue, red team items 4, 8, 9 and 10): what anyone
//! who can reach the manager's ports spends without credentials, or with junk or only a
//! tenant's, is bounded where it enters. One test per row of "Bounds: what a stranger can
//! spend" in `docs/architecture.md`, each against a real `ctrlhub run --auth kubernetes` on
//! devcluster in the hostile bed (`ctrlhub_tests::hostile`), at the row's bound.
//!
//! As in `tests/tests/adversity/hostile.rs`, team-b's well-behaved controller is measured during each
//! attack and after it (every update within [`BOUND`], its session never ended), the manager
//! keeps its Lease and `/readyz` answers 200 throughout, and a test reports every expectation
//! it saw broken. Attackers connect from 127.0.0.2 and 127.0.0.3 ([`ATTACKER`]), as another
//! host would, so that per-address caps on them leave the tenants on 127.0.0.1 alone. The
//! drivers live in `ctrlhub_tests::strangers`, shared with `ctrlhub-bench hostile`. Tests run
//! one at a time: each loads both cores.

use ctrlhub_tests::hostile::*;
use ctrlhub_tests::replica::{Replica, configmaps, register};
use ctrlhub_tests::strangers::*;
use ctrlhub_tests::{Launch, bin};
use std::future::Future;
use std::time::{Duration, Instant};

/// How long one update of team-b may take to reach its controller (quiet median about 3 ms).
const BOUND: Duration = Duration::from_secs(2);

/// How much the manager's resident memory may grow during an attack.
const RSS_BOUND: u64 = 256 * MIB;

/// How long one test may take before it fails as hung.
const TEST_LIMIT: Duration = Duration::from_secs(150);

/// The manager's defaults these tests hold it to (see `ctrlhub run --help`).
mod defaults {
    use std::time::Duration;
    /// `--handshake-timeout`: first bytes, TLS handshake, the HTTP port's first request.
    pub(super) const HANDSHAKE: Duration = Duration::from_secs(10);
    /// `--max-connections-per-peer` (the open-file limit here leaves it as it is).
    pub(super) const PER_PEER: usize = 128;
    /// The HTTP port's per-peer cap: a quarter of its 256 connections.
    pub(super) const HTTP_PER_PEER: usize = 64;
    /// Failed authentications a peer may make at once (gRPC), then one a second.
    pub(super) const AUTH_BURST: u64 = 20;
    /// TokenReviews in flight from the gRPC port.
    pub(super) const REVIEWS_IN_FLIGHT: usize = 16;
    /// Connect streams of one tenant waiting for their Register.
    pub(super) const PENDING_PER_TENANT: usize = 64;
    /// Discovery lookups a tenant may cost at once, then one a second; kinds not served are
    /// remembered this long.
    pub(super) const DISCOVERY_BURST: u64 = 80;
    pub(super) const UNSERVED_TTL: Duration = Duration::from_secs(10);
}

/// One test at a time.
use ctrlhub_tests::SERIAL;

/// team-b probed every 100 ms while an attack runs, for at most 30 s.
const DURING: ProbePlan = ProbePlan {
    updates: usize::MAX,
    gap: Duration::from_millis(100),
    bound: BOUND,
    window: Duration::from_secs(30),
};

/// team-b probed 10 more times after an attack.
const AFTER: ProbePlan = ProbePlan {
    updates: 10,
    gap: Duration::from_millis(100),
    bound: BOUND,
    window: Duration::from_secs(10),
};

/// The manager binary: `CTRLHUB_BIN` (to judge another build), else `target/debug/ctrlhub`.
fn launch() -> Launch {
    Launch {
        binary: std::env::var_os("CTRLHUB_BIN")
            .map(Into::into)
            .unwrap_or_else(|| bin("ctrlhub")),
        rust_log: std::env::var("HOSTILE_RUST_LOG").unwrap_or_else(|_| "info".into()),
        ..Launch::for_tests()
    }
}

/// A test's bed with team-b running and measured quiet, the watchdog started, and the broken
/// expectations collected so far (as in `tests/tests/adversity/hostile.rs`).
struct Run {
    bed: Bed,
    meter: Meter,
    watchdog: Watchdog,
    findings: Vec<String>,
    started: Instant,
}

/// team-b and what was measured of it.
struct Meter {
    team_b: TeamB,
    samples: Samples,
}

impl Meter {
    /// Runs `attack` while measuring team-b, then measures team-b [`AFTER`] it.
    async fn during<T>(&mut self, attack: impl Future<Output = T>) -> T {
        let (out, samples) = probe_during(&mut self.team_b, DURING, attack).await;
        self.samples.extend(samples);
        self.samples.extend(probe(&mut self.team_b, AFTER).await);
        out
    }
}

impl Run {
    async fn start(identity: &str, extra: &[&str]) -> Run {
        Run::start_with(&launch(), identity, extra).await
    }

    async fn start_with(launch: &Launch, identity: &str, extra: &[&str]) -> Run {
        let started = Instant::now();
        let bed = Bed::start(launch, identity, extra)
            .await
            .expect("the bed starts");
        println!("manager {identity} logs to {}", bed.manager.log.display());
        let mut team_b = TeamB::start(&bed)
            .await
            .expect("team-b's controller starts");
        let quiet = probe(
            &mut team_b,
            ProbePlan {
                updates: 5,
                window: Duration::from_secs(30),
                ..DURING
            },
        )
        .await;
        assert!(
            quiet.late.is_empty(),
            "team-b is late even without an attack: {:?}",
            quiet.late
        );
        bed.wait_ready().await.expect("the manager is ready");
        let watchdog = Watchdog::start(&bed, RSS_BOUND)
            .await
            .expect("the watchdog starts");
        Run {
            bed,
            meter: Meter {
                team_b,
                samples: Samples::default(),
            },
            watchdog,
            findings: Vec::new(),
            started,
        }
    }

    /// Records a broken expectation unless `ok`.
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.findings.push(what());
        }
    }

    /// The common expectations, then fails with every broken expectation.
    async fn finish(self, attack: &str) {
        let Run {
            bed,
            meter,
            watchdog,
            mut findings,
            started,
        } = self;
        let health = watchdog.finish().await;
        let samples = &meter.samples;
        let (p50, p99, max) = samples.percentiles(BOUND);
        println!(
            "{attack}: team-b {} updates, {} late, median {p50:.1?}, p99 {p99:.1?}, max \
             {max:.1?}; manager RSS {} -> peak {} MiB; {} readyz and {} lease failures in {} \
             samples; {:.1?} in all",
            samples.count(),
            samples.late.len(),
            health.rss_start / MIB,
            health.rss_peak / MIB,
            health.readyz_failures,
            health.lease_failures,
            health.samples,
            started.elapsed()
        );
        let late = &samples.late;
        if !late.is_empty() {
            let first: Vec<String> = late.iter().take(3).map(ToString::to_string).collect();
            findings.push(format!(
                "team-b was late {} times, first: {first:?}",
                late.len()
            ));
        }
        findings.extend(meter.team_b.ended());
        if samples.count() < 10 {
            findings.push(format!(
                "team-b was measured only {} times",
                samples.count()
            ));
        }
        findings.extend(health.problems());
        drop(bed);
        assert!(
            findings.is_empty(),
            "{attack}: {} broken expectation(s):\n- {}",
            findings.len(),
            findings.join("\n- ")
        );
    }
}

/// Runs one test body alone and within [`TEST_LIMIT`].
async fn serial(body: impl Future<Output = ()>) {
    let _alone = SERIAL.lock().await;
    if tokio::time::timeout(TEST_LIMIT, body).await.is_err() {
        panic!("the test did not finish within {TEST_LIMIT:?}");
    }
}

/// Waits up to `timeout` for `pid`'s open descriptors to fall to `at_most`; returns the count.
async fn fds_settle(pid: u32, at_most: usize, timeout: Duration) -> usize {
    let t0 = Instant::now();
    loop {
        let n = open_fds(pid);
        if n <= at_most || t0.elapsed() >= timeout {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Row "silent TCP connections, gRPC port": 300 connections from one address that never send
/// the HTTP/2 preface. At most the per-peer cap (128) stay open, the rest are closed as soon as
/// they are accepted, and every one is closed by the first-bytes deadline (10 s); the
/// manager's descriptors return to where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_grpc_connections_are_capped_and_closed_at_the_preface_deadline() {
    serial(async {
        let mut run = Run::start("strangers-grpc-silent", &[]).await;
        let bed = &run.bed;
        let pid = bed.pid();
        let grpc = socket_addr(&bed.manager.grpc).expect("gRPC address");
        let fds_before = open_fds(pid);
        let t0 = Instant::now();
        let (silent, capped, closed_all, peak_fds) = run
            .meter
            .during(async {
                let (silent, peak) =
                    peak_fds_during(pid, silent_connections(ATTACKER, grpc, 300)).await;
                let capped = wait_closed(&silent, defaults::PER_PEER, Duration::from_secs(5)).await;
                let closed_all =
                    wait_closed(&silent, 0, defaults::HANDSHAKE + Duration::from_secs(5)).await;
                (silent, capped, closed_all, peak)
            })
            .await;
        let fds_after = fds_settle(pid, fds_before + 8, Duration::from_secs(5)).await;
        println!(
            "gRPC silent: {} connected ({} failed); open after the cap: {} ({:.1?}); all closed: \
             {} open after {:.1?} (since the flood: {:.1?}); manager fds {fds_before} -> peak \
             {peak_fds} -> {fds_after}",
            silent.streams.len(),
            silent.failed,
            capped.1,
            capped.0,
            closed_all.1,
            closed_all.0,
            t0.elapsed()
        );
        run.check(silent.streams.len() == 300, || {
            format!("only {} of 300 connections were made", silent.streams.len())
        });
        run.check(capped.1 <= defaults::PER_PEER, || {
            format!(
                "{} silent connections from one address stayed open (cap {})",
                capped.1,
                defaults::PER_PEER
            )
        });
        run.check(closed_all.1 == 0, || {
            format!(
                "{} silent connections were still open {:.1?} after the flood (deadline {:?})",
                closed_all.1,
                t0.elapsed(),
                defaults::HANDSHAKE
            )
        });
        run.check(fds_after <= fds_before + 8, || {
            format!("the manager's descriptors went from {fds_before} to {fds_after}")
        });
        run.finish("silent gRPC connections").await;
    })
    .await;
}

/// Rows "silent connections, HTTPS port", "TLS handshake" and "silence after TLS": on the
/// HTTPS port, 150 silent TCP connections from one address are capped at 64 and closed by the
/// handshake deadline; 20 connections that finish TLS and then say nothing are closed by the
/// first-request deadline (10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_https_connections_before_and_after_tls_are_capped_and_closed() {
    serial(async {
        let mut run = Run::start("strangers-https-silent", &[]).await;
        let bed = &run.bed;
        let http = socket_addr(&bed.manager.http).expect("HTTP address");
        let (silent, capped, silent_closed, after_tls) = run
            .meter
            .during(async {
                let silent = silent_connections(ATTACKER_2, http, 150).await;
                let capped =
                    wait_closed(&silent, defaults::HTTP_PER_PEER, Duration::from_secs(5)).await;
                let tls = silent_after_tls(ATTACKER, http, 20).await;
                let t0 = Instant::now();
                let after_tls = match tls {
                    Ok(mut streams) => {
                        let mut closed_after = Vec::new();
                        for s in &mut streams {
                            let left = (defaults::HANDSHAKE + Duration::from_secs(5))
                                .saturating_sub(t0.elapsed());
                            closed_after.push(until_closed(s, left).await.map(|_| t0.elapsed()));
                        }
                        Ok(closed_after)
                    }
                    Err(e) => Err(format!("{e:#}")),
                };
                let silent_closed =
                    wait_closed(&silent, 0, defaults::HANDSHAKE + Duration::from_secs(5)).await;
                (silent, capped, silent_closed, after_tls)
            })
            .await;
        let latest = after_tls
            .as_ref()
            .ok()
            .and_then(|c| c.iter().flatten().max().copied());
        println!(
            "HTTPS: {} silent connected; open after the cap {}; all closed: {} open after {:.1?}; 20 silent after TLS: {} still open, the last closed {latest:?} after the handshakes",
            silent.streams.len(),
            capped.1,
            silent_closed.1,
            silent_closed.0,
            after_tls
                .as_ref()
                .map_or(20, |c| c.iter().filter(|c| c.is_none()).count()),
        );
        run.check(capped.1 <= defaults::HTTP_PER_PEER, || {
            format!(
                "{} silent HTTPS connections from one address stayed open (cap {})",
                capped.1,
                defaults::HTTP_PER_PEER
            )
        });
        run.check(silent_closed.1 == 0, || {
            format!("{} silent HTTPS connections were never closed", silent_closed.1)
        });
        match &after_tls {
            Ok(closed) => {
                let open = closed.iter().filter(|c| c.is_none()).count();
                run.check(open == 0, || {
                    format!(
                        "{open} of {} connections silent after their TLS handshake were still \
                         open 5 s past the {:?} deadline",
                        closed.len(),
                        defaults::HANDSHAKE
                    )
                });
            }
            Err(e) => run.check(false, || format!("TLS connections could not be made: {e}")),
        }
        run.finish("silent HTTPS connections").await;
    })
    .await;
}

/// Row "idle connections": with `--connection-idle-timeout 3s`, a kept-alive HTTPS connection
/// that made one request and a gRPC connection that sent its HTTP/2 preface and settings but
/// no call are each closed about 3 s later (a Connect stream keeps its connection: team-b's
/// session lives on through the test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    serial(async {
        let mut run = Run::start("strangers-idle", &["--connection-idle-timeout", "3s"]).await;
        let bed = &run.bed;
        let http = socket_addr(&bed.manager.http).expect("HTTP address");
        let grpc = socket_addr(&bed.manager.grpc).expect("gRPC address");
        let idle_timeout = Duration::from_secs(3);
        let wait = idle_timeout + Duration::from_secs(5);
        let (https_idle, grpc_idle) = run
            .meter
            .during(async {
                let https = async {
                    let mut stream = tls_request(ATTACKER, http, "/healthz").await?;
                    Ok::<_, anyhow::Error>(until_closed(&mut stream, wait).await)
                };
                let grpc = async {
                    let stream = h2_preface_then_silent(ATTACKER, grpc).await?;
                    Ok::<_, anyhow::Error>(tcp_closed_within(&stream, wait).await)
                };
                tokio::join!(https, grpc)
            })
            .await;
        println!("idle: HTTPS after one request closed after {https_idle:?}; gRPC after its preface closed after {grpc_idle:?}");
        for (what, closed) in [("HTTPS", &https_idle), ("gRPC", &grpc_idle)] {
            match closed {
                Ok(Some(after)) => run.check(*after < idle_timeout + Duration::from_secs(3), || {
                    format!("an idle {what} connection was closed only after {after:.1?}")
                }),
                Ok(None) => run.check(false, || {
                    format!("an idle {what} connection was still open {wait:?} after its last call")
                }),
                Err(e) => run.check(false, || format!("the idle {what} connection failed: {e:#}")),
            }
        }
        run.finish("idle connections").await;
    })
    .await;
}

/// Row "file descriptors": the manager started with an open-file limit of 256 (soft and hard,
/// as a container runtime may set it) gets 1,100 silent connections on its gRPC port from one
/// address. Its accept loops do not spin (under half a core while the connections are held),
/// it never runs out of descriptors, and team-b still opens a new connection and registers a
/// new session meanwhile (`/healthz` and `/readyz` keep answering: the watchdog).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_under_a_low_fd_limit_neither_spins_nor_locks_tenants_out() {
    serial(async {
        let base = launch();
        let script =
            with_fd_limit(&base.binary, 256, &std::env::temp_dir()).expect("the launch script");
        let low = Launch {
            binary: script,
            ..base
        };
        let mut run = Run::start_with(&low, "strangers-fd", &[]).await;
        let bed = &run.bed;
        let pid = bed.pid();
        let grpc = socket_addr(&bed.manager.grpc).expect("gRPC address");
        let endpoint = tonic::transport::Endpoint::from_shared(bed.manager.grpc.clone())
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(5));
        let hold = Duration::from_secs(6);
        let (silent, cpu, team_b_new, peak_fds) = run
            .meter
            .during(async {
                let (silent, peak) = peak_fds_during(pid, async {
                    let silent = silent_connections(ATTACKER, grpc, 1_100).await;
                    let cpu0 = cpu_time(pid);
                    let t0 = Instant::now();
                    let join = async {
                        let channel = endpoint
                            .connect()
                            .await
                            .map_err(|e| format!("connecting: {e}"))?;
                        let r = register("steady-new", configmaps(), 1, Some(TEAM_B));
                        tokio::time::timeout(
                            Duration::from_secs(10),
                            Replica::connect_over(channel, r, Some(&bed.b_auth), &[]),
                        )
                        .await
                        .map_err(|_| "no answer within 10 s".to_string())?
                        .map(drop)
                        .map_err(|s| format!("{s:?}"))
                    };
                    let (joined, ()) = tokio::join!(join, tokio::time::sleep(hold));
                    let cpu = (cpu_time(pid).saturating_sub(cpu0)).as_secs_f64()
                        / t0.elapsed().as_secs_f64();
                    (silent, cpu, joined)
                })
                .await;
                (silent.0, silent.1, silent.2, peak)
            })
            .await;
        println!(
            "fd limit 256: {} of 1100 connected ({} failed), {} still open after {hold:?}; \
             manager CPU {:.2} cores while held; peak fds {peak_fds}; team-b's new session: \
             {team_b_new:?}",
            silent.streams.len(),
            silent.failed,
            silent.still_open(),
            cpu
        );
        run.check(cpu < 0.5, || {
            format!("the manager used {cpu:.2} cores while 1,100 silent connections were held")
        });
        run.check(peak_fds < 250, || {
            format!("the manager held {peak_fds} descriptors under a limit of 256")
        });
        run.check(team_b_new.is_ok(), || {
            format!(
                "team-b could not register over a new connection during the flood: {team_b_new:?}"
            )
        });
        drop(silent);
        run.finish("connection flood under a low fd limit").await;
    })
    .await;
}

/// Row "TokenReviews (junk tokens)": 900 Connects with distinct junk tokens in 3 concurrent
/// waves of 300 (100 at a time each) from one address cost at most the burst (20) plus one a
/// second of TokenReviews, and the manager never holds more than the reviews-in-flight cap (16)
/// of extra descriptors for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_junk_token_waves_cost_a_bounded_number_of_token_reviews() {
    serial(async {
        let mut run = Run::start("strangers-junk-waves", &[]).await;
        let bed = &run.bed;
        let pid = bed.pid();
        let fds_before = open_fds(pid);
        let reviews_before = bed.token_reviews();
        let t0 = Instant::now();
        let ((a, b, c), peak_fds) = run
            .meter
            .during(peak_fds_during(pid, async {
                tokio::join!(
                    junk_token_flood(bed, 300, 100),
                    junk_token_flood(bed, 300, 100),
                    junk_token_flood(bed, 300, 100)
                )
            }))
            .await;
        let elapsed = t0.elapsed();
        let reviews = bed.token_reviews().saturating_sub(reviews_before);
        let bound = defaults::AUTH_BURST + elapsed.as_secs() + 1;
        let calls = a.calls + b.calls + c.calls;
        let accepted = a.accepted + b.accepted + c.accepted;
        println!(
            "junk waves: {calls} calls in {elapsed:.1?}, codes {:?} {:?} {:?}; {reviews} \
             TokenReviews (bound {bound}); manager fds {fds_before} -> peak {peak_fds}",
            a.codes, b.codes, c.codes
        );
        // The HTTP port's gate: 300 junk-token requests, 100 at a time, cost at most its burst
        // (20) plus five a second.
        let http_before = bed.token_reviews();
        let t1 = Instant::now();
        let (http_codes, http_peak_fds) = peak_fds_during(pid, junk_http_wave(bed, 300, 100)).await;
        let http_reviews = bed.token_reviews().saturating_sub(http_before);
        let http_bound = defaults::AUTH_BURST + 5 * (t1.elapsed().as_secs() + 1);
        println!(
            "HTTP junk wave: 300 requests in {:.1?}, statuses {http_codes:?}; {http_reviews} TokenReviews (bound {http_bound}); manager fds peak {http_peak_fds}",
            t1.elapsed()
        );
        run.check(accepted == 0, || format!("{accepted} junk tokens were accepted"));
        run.check(reviews <= bound, || {
            format!("{calls} junk-token Connects in 3 concurrent waves made {reviews} TokenReviews (bound {bound})")
        });
        run.check(http_reviews <= http_bound, || {
            format!("300 junk-token requests to the HTTP port made {http_reviews} TokenReviews (bound {http_bound})")
        });
        run.check(peak_fds <= fds_before + defaults::REVIEWS_IN_FLIGHT + 8, || {
            format!(
                "the manager's descriptors went from {fds_before} to {peak_fds} during the waves \
                 (at most {} reviews in flight)",
                defaults::REVIEWS_IN_FLIGHT
            )
        });
        run.finish("concurrent junk-token waves").await;
    })
    .await;
}

/// Row "a valid tenant behind the same address": once junk tokens from 127.0.0.1 have spent
/// that address's budget (RESOURCE_EXHAUSTED), team-b, on the same address with a token the
/// manager has already reviewed, still opens 10 new sessions while the junk goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_valid_token_is_never_throttled_by_junk_from_the_same_address() {
    serial(async {
        let mut run = Run::start("strangers-cached-token", &[]).await;
        let bed = &run.bed;
        let (spent, (more, sessions)) = run
            .meter
            .during(async {
                let spent = junk_token_flood(bed, 100, 16).await;
                let sessions = async {
                    let mut out = Vec::new();
                    for i in 0..10 {
                        let r = register(&format!("steady-{i}"), configmaps(), 1, Some(TEAM_B));
                        out.push(bed.connect(r, &bed.b_auth).await.map(drop));
                    }
                    out
                };
                (spent, tokio::join!(junk_token_flood(bed, 300, 16), sessions))
            })
            .await;
        let refused: Vec<String> = sessions
            .iter()
            .filter_map(|s| s.as_ref().err())
            .map(|s| format!("{:?}: {}", s.code(), s.message()))
            .collect();
        println!(
            "junk first {:?}, then {:?}; team-b's 10 sessions meanwhile: {} refused {refused:?}",
            spent.codes,
            more.codes,
            refused.len()
        );
        run.check(spent.codes.contains_key("ResourceExhausted"), || {
            format!("100 junk tokens never spent the address's budget: {:?}", spent.codes)
        });
        run.check(refused.is_empty(), || {
            format!(
                "team-b, with a cached valid token, was refused {} of 10 times while junk came from \
                 its address: {refused:?}",
                refused.len()
            )
        });
        run.finish("cached token behind junk").await;
    })
    .await;
}

/// Row "Connect streams before Register": team-a opens 2,000 Connect streams on one connection
/// and never sends Register. At most the per-tenant bound (64) wait for their Register; every
/// other one is refused at once with RESOURCE_EXHAUSTED saying what to do; the manager's
/// memory grows by less than 32 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_streams_before_register_are_bounded_per_tenant() {
    serial(async {
        let mut run = Run::start("strangers-pending", &[]).await;
        let bed = &run.bed;
        // team-a's token reviewed once (as any tenant's is when it first connects), so the
        // streams below measure what waiting for Register costs, not authentication.
        let prime = bed.connect(team_a_registration("prime", 1), &bed.a_auth).await;
        assert!(prime.is_ok(), "team-a registers: {}", describe(&prime));
        drop(prime);
        let rss_before = bed.rss();
        let count = 2_000;
        let peak_rss = std::sync::atomic::AtomicU64::new(rss_before);
        let sample = async {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(4) {
                peak_rss.fetch_max(bed.rss(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let answers = run
            .meter
            .during(silent_connects(
                bed.channel(),
                &bed.a_auth,
                count,
                Duration::from_secs(5),
                sample,
            ))
            .await
            .expect("the streams open");
        let (answers, ()) = answers;
        let peak = peak_rss.load(std::sync::atomic::Ordering::Relaxed);
        let growth = peak.saturating_sub(rss_before);
        let waiting = answers.count("Pending") + answers.count("Ok");
        let refused = answers.count("ResourceExhausted");
        println!(
            "pending Connects: {count} opened, answers {:?}; first refusal {:?}; RSS {} -> peak {} MiB",
            answers.codes,
            answers.messages.get("ResourceExhausted"),
            rss_before / MIB,
            peak / MIB
        );
        run.check(waiting <= defaults::PENDING_PER_TENANT, || {
            format!(
                "{waiting} Connect streams of one tenant waited for their Register (bound {})",
                defaults::PENDING_PER_TENANT
            )
        });
        run.check(refused >= count - defaults::PENDING_PER_TENANT, || {
            format!("only {refused} of {count} streams were refused with RESOURCE_EXHAUSTED: {:?}", answers.codes)
        });
        let message = answers.messages.get("ResourceExhausted").cloned().unwrap_or_default();
        run.check(refused == 0 || message.contains("Register"), || {
            format!("the refusal does not say what to do: {message:?}")
        });
        run.check(growth < 32 * MIB, || {
            format!("the manager's RSS grew by {} MiB with streams waiting for Register", growth / MIB)
        });
        run.finish("Connect streams before Register").await;
    })
    .await;
}

/// Row "discovery": team-a registers 100 times naming the same kind nobody serves, then 150
/// times naming a new such kind each time. The repeated kind costs one discovery call per
/// not-served memory (10 s), the new kinds at most the tenant's burst (80) plus one a second,
/// the rest refused with RESOURCE_EXHAUSTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_naming_unknown_kinds_cost_bounded_discovery_calls() {
    serial(async {
        let mut run = Run::start("strangers-discovery", &[]).await;
        let bed = &run.bed;
        let before = discovery_calls(bed);
        let t0 = Instant::now();
        let (repeated, mid, t1, distinct) = run
            .meter
            .during(async {
                // Once alone (the lookup), then 99 times 8 at a time from the memory of it.
                let mut repeated = unknown_kinds(bed, 1, |_| unknown_kind(0)).await;
                let again = unknown_kinds(bed, 99, |_| unknown_kind(0)).await;
                for (code, n) in again.codes {
                    *repeated.codes.entry(code).or_default() += n;
                }
                let (mid, t1) = (discovery_calls(bed), Instant::now());
                let distinct = unknown_kinds(bed, 150, |i| unknown_kind(1_000 + i)).await;
                (repeated, mid, t1, distinct)
            })
            .await;
        let after = discovery_calls(bed);
        let repeated_calls = mid.saturating_sub(before);
        let repeated_bound = 1 + t1.duration_since(t0).as_secs() / defaults::UNSERVED_TTL.as_secs() + 1;
        let distinct_calls = after.saturating_sub(mid);
        let distinct_bound = defaults::DISCOVERY_BURST + t1.elapsed().as_secs() + 1;
        println!(
            "discovery: 100 Registers of one unknown kind in {:.1?} made {repeated_calls} calls \
             (bound {repeated_bound}), answers {:?}; 150 of new unknown kinds made \
             {distinct_calls} (bound {distinct_bound}), answers {:?}, first refusal {:?}",
            t1.duration_since(t0),
            repeated.codes,
            distinct.codes,
            distinct.messages.get("ResourceExhausted")
        );
        run.check(repeated.count("Ok") == 0 && distinct.count("Ok") == 0, || {
            "a Register naming a kind nobody serves was accepted".into()
        });
        run.check(repeated_calls <= repeated_bound, || {
            format!("100 Registers naming one unknown kind made {repeated_calls} discovery calls (bound {repeated_bound})")
        });
        run.check(distinct_calls <= distinct_bound, || {
            format!("150 Registers naming new unknown kinds made {distinct_calls} discovery calls (bound {distinct_bound})")
        });
        run.check(distinct.count("ResourceExhausted") > 0, || {
            format!("no Register was refused for its discovery budget: {:?}", distinct.codes)
        });
        run.finish("unknown kinds").await;
    })
    .await;
}
