//! Runs one SDK through every check: prepare it, start its world, run each scenario (a panic or
//! a failed set-up turns the scenario's rows red rather than ending the run), and collect the
//! results in matrix order.

use futures::FutureExt as _;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};
use tokio::process::Command;

use super::Failure;
use super::checks::{ROWS, SCENARIOS, Scenario, Verdict};
use super::matrix::{RowResult, SdkResults};
use super::ring::OwnerFn;
use super::sdk::{Sdk, repo_root};
use super::world::World;

/// How long an SDK's `prepare` step may take.
const PREPARE_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs the checks for `sdk`: every scenario, or when `only` names rows, the scenarios deciding
/// any of them. `ring_owner` is the manager's placement of controllers on ring members
/// (`ctrlhub::members::hrw::owner`), which the ring rows check against.
pub async fn run_sdk(sdk: &Sdk, ring_owner: OwnerFn, only: &[String]) -> SdkResults {
    let started = Instant::now();
    let mut verdicts: Vec<(Verdict, f64)> = Vec::new();
    let chosen = SCENARIOS
        .iter()
        .filter(|s| only.is_empty() || s.rows.iter().any(|r| only.iter().any(|o| o == r)));
    match start(sdk, ring_owner).await {
        Ok(mut world) => {
            for scenario in chosen {
                let t = Instant::now();
                let run = AssertUnwindSafe(heal_then_run(scenario, &mut world)).catch_unwind();
                let outcome = match run.await {
                    Ok(v) => v,
                    Err(panic) => scenario
                        .rows
                        .iter()
                        .map(|r| (*r, Err(Failure::Setup(panic_message(&*panic)))))
                        .collect(),
                };
                let secs = t.elapsed().as_secs_f64();
                println!(
                    "conformance {}: {} took {secs:.1} s",
                    sdk.name, scenario.name
                );
                verdicts.extend(outcome.into_iter().map(|v| (v, secs)));
            }
        }
        Err(e) => {
            let why = e.to_string();
            verdicts.extend(
                chosen
                    .flat_map(|s| s.rows.iter())
                    .map(|r| ((*r, Err(Failure::Setup(why.clone()))), 0.0)),
            );
        }
    }
    SdkResults {
        sdk: sdk.clone(),
        seconds: started.elapsed().as_secs_f64(),
        rows: in_matrix_order(verdicts),
    }
}

/// Runs `scenario` once the world has a leader again; when it cannot get one, every row of
/// the scenario is red with that reason.
async fn heal_then_run(scenario: &Scenario, world: &mut World) -> Vec<Verdict> {
    match world.heal().await {
        Ok(()) => scenario.run(world).await,
        Err(e) => {
            let why = format!("no leading manager before the check: {e}");
            scenario
                .rows
                .iter()
                .map(|r| (*r, Err(Failure::Setup(why.clone()))))
                .collect()
        }
    }
}

async fn start(sdk: &Sdk, ring_owner: OwnerFn) -> Result<World, Failure> {
    if let Some(argv) = &sdk.prepare {
        prepare(argv).await?;
    }
    World::start(sdk, ring_owner).await
}

/// Runs the SDK's `prepare` argv from the repository root.
async fn prepare(argv: &[String]) -> Result<(), Failure> {
    let argv = Sdk::expand(argv);
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| Failure::Setup("empty prepare command".into()))?;
    let run = Command::new(program)
        .args(args)
        .current_dir(repo_root())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PREPARE_TIMEOUT, run)
        .await
        .map_err(|_| Failure::Setup(format!("prepare {argv:?} took over {PREPARE_TIMEOUT:?}")))?
        .map_err(|e| Failure::Setup(format!("prepare {argv:?}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Failure::Setup(format!(
        "prepare {argv:?} exited {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

fn in_matrix_order(verdicts: Vec<(Verdict, f64)>) -> Vec<RowResult> {
    ROWS.iter()
        .filter_map(|row| {
            let ((_, result), seconds) = verdicts.iter().find(|((id, _), _)| *id == row.id)?;
            Some(RowResult {
                row: row.id.to_string(),
                passed: result.is_ok(),
                kind: result.as_ref().err().map(|f| f.kind().to_string()),
                message: result.as_ref().err().map(ToString::to_string),
                seconds: *seconds,
            })
        })
        .collect()
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("the check panicked: {what}")
}
