//! `ctrlhub-bench`: runs the benchmark scenarios against devcluster, prints a table and writes
//! the figures as JSON (default `target/bench/results.json`).
//!
//! Needs the release binaries next to it: `cargo build --release -p ctrlhub -p ctrlhub-bench`,
//! then `cargo run --release -p ctrlhub-bench -- all`.

use anyhow::Result;
use clap::{Parser, Subcommand};
use ctrlhub_bench::report::{Outcome, table};
use ctrlhub_bench::scenarios::{self, Sizes};
use std::path::PathBuf;

#[derive(Parser)]
#[command(about = "ctrlhub benchmarks, side by side with kube-rs controllers on devcluster")]
struct Cli {
    /// Small sizes (seconds instead of minutes).
    #[arg(long, global = true)]
    quick: bool,
    /// Where to write the JSON figures (default: <target>/bench/results.json; `soak` writes
    /// soak.json next to it).
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    /// Leave out the throughput scenario's kopf reference (it needs python3 and, on first use,
    /// PyPI to install kopf into <target>/bench/kopf-venv).
    #[arg(long, global = true)]
    no_kopf: bool,
    /// Leave out the throughput scenario's TypeScript SDK (it needs node and npm, and on first
    /// use the npm registry, to build controllers/typescript-sdk).
    #[arg(long, global = true)]
    no_typescript: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Clone, PartialEq)]
enum Cmd {
    /// Every scenario except soak.
    All,
    /// Objects reconciled per second, live and from a backlog (ctrlhub, kube-rs, and kopf as a
    /// reference).
    Throughput,
    /// Update-to-reconcile-start latency under steady updates.
    Latency,
    /// 10 controllers on one kind: API requests and total memory.
    SharedCaches,
    /// Manager memory per cached object.
    Memory,
    /// Leader handover after SIGTERM and SIGKILL.
    Failover,
    /// Tenant B's latency while tenant A floods its queue.
    Fairness,
    /// Team-b's latency and the manager's peak memory during each attack of the hostile-tenant suite (tests/tests/adversity/hostile.rs).
    Hostile,
    /// The ceiling: raw Connect-stream requests/s over loopback with empty handlers, unbatched and
    /// batched; with `all`, the throughput run's rates as a fraction of it.
    Loopback,
    /// A second controller's start on a kind the manager already caches, against kube-rs' cold
    /// start.
    WarmStart,
    /// Ring members (`--mode ring`) with N = 1, 2, 3: units per member against the assignment
    /// function, moves per join and leave, handovers (SIGTERM, SIGKILL), double dispatches,
    /// memory (disjoint and shared kinds), CPU per reconcile, Lease requests, redirect cost
    /// and the assignment's own cost. Not part of `all` (a study of its own, minutes long).
    ScaleOut {
        /// Controllers (units), 2 replicas each.
        #[arg(long, default_value_t = 30)]
        controllers: usize,
    },
    /// Steady 1,000 updates/s for N minutes.
    Soak {
        /// Duration in minutes.
        #[arg(long, default_value_t = 60.0)]
        minutes: f64,
        /// Updates per second.
        #[arg(long, default_value_t = 1000)]
        rate: u32,
    },
}

impl Cmd {
    fn name(&self) -> &'static str {
        match self {
            Cmd::All => "all",
            Cmd::Throughput => "throughput",
            Cmd::Latency => "latency",
            Cmd::SharedCaches => "shared-caches",
            Cmd::Memory => "memory",
            Cmd::Failover => "failover",
            Cmd::Fairness => "fairness",
            Cmd::Hostile => "hostile",
            Cmd::Loopback => "loopback",
            Cmd::WarmStart => "warm-start",
            Cmd::ScaleOut { .. } => "scale-out",
            Cmd::Soak { .. } => "soak",
        }
    }
}

/// Run one scenario; `earlier` holds the outcomes of this invocation so far (the loopback
/// scenario expresses the throughput run's rates as a fraction of its ceiling).
async fn scenario(
    cmd: &Cmd,
    sizes: Sizes,
    kopf: bool,
    typescript: bool,
    earlier: &[Outcome],
) -> Result<Outcome> {
    match cmd {
        Cmd::Throughput => {
            scenarios::throughput::run(sizes.pick(10_000, 1_000), kopf, typescript).await
        }
        Cmd::Latency => scenarios::latency::run(500, sizes.pick(60, 10)).await,
        Cmd::SharedCaches => scenarios::shared_caches::run(sizes.pick(10_000, 1_000), 10).await,
        Cmd::Memory => {
            scenarios::memory::run(&sizes.pick(vec![10_000, 100_000], vec![1_000, 5_000])).await
        }
        Cmd::Failover => scenarios::failover::run().await,
        Cmd::Fairness => {
            scenarios::fairness::run(sizes.pick(100_000, 5_000), sizes.pick(200, 50)).await
        }
        Cmd::Hostile => scenarios::hostile::run(sizes.pick(100, 20)).await,
        Cmd::Loopback => {
            let throughput = earlier
                .iter()
                .find_map(scenarios::loopback::ThroughputRates::from_outcome);
            scenarios::loopback::run(sizes.pick(200_000, 20_000), throughput).await
        }
        Cmd::WarmStart => {
            scenarios::warm_start::run(&sizes.pick(vec![10_000, 100_000], vec![1_000, 5_000])).await
        }
        Cmd::ScaleOut { controllers } => {
            let plan = sizes.pick(
                scenarios::scale_out::Plan::full(*controllers),
                scenarios::scale_out::Plan::quick(*controllers),
            );
            scenarios::scale_out::run(&plan).await
        }
        Cmd::Soak { minutes, rate } => scenarios::soak::run(*minutes, *rate, 1000).await,
        Cmd::All => unreachable!("expanded by main"),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let sizes = Sizes { quick: cli.quick };
    let cmds = match &cli.command {
        Cmd::All => vec![
            Cmd::Throughput,
            Cmd::Loopback,
            Cmd::Latency,
            Cmd::SharedCaches,
            Cmd::Memory,
            Cmd::Failover,
            Cmd::Fairness,
            Cmd::Hostile,
            Cmd::WarmStart,
        ],
        other => vec![other.clone()],
    };
    let mut outcomes = Vec::new();
    let mut failures = Vec::new();
    for cmd in &cmds {
        let name = cmd.name();
        eprintln!("== {name}");
        match scenario(cmd, sizes, !cli.no_kopf, !cli.no_typescript, &outcomes).await {
            Ok(o) => {
                if cmds.len() > 1 {
                    eprintln!("\n{}", table(&o.rows));
                }
                outcomes.push(o);
            }
            // One failing scenario must not cost the figures of the others.
            Err(e) => {
                eprintln!("scenario failed: {e:#}");
                failures.push(serde_json::json!({"scenario": name, "error": format!("{e:#}")}));
            }
        }
    }
    let rows: Vec<_> = outcomes.iter().flat_map(|o| o.rows.clone()).collect();
    println!("{}", table(&rows));
    let mut json = serde_json::Map::new();
    json.insert(
        "machine".into(),
        serde_json::json!({
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "quick": cli.quick,
        }),
    );
    for o in &outcomes {
        json.insert(o.scenario.clone(), o.json.clone());
    }
    if !failures.is_empty() {
        json.insert("failures".into(), serde_json::json!(failures));
    }
    let default_name = if matches!(cli.command, Cmd::Soak { .. }) {
        "soak.json"
    } else {
        "results.json"
    };
    let path = cli
        .json
        .unwrap_or_else(|| ctrlhub_bench::env::out_dir().join(default_name));
    std::fs::write(&path, serde_json::to_vec_pretty(&json)?)?;
    eprintln!("figures written to {}", path.display());
    if !failures.is_empty() {
        anyhow::bail!("{} scenario(s) failed", failures.len());
    }
    Ok(())
}
