//! `memcached-controller`: the Operator SDK memcached sample as an out-of-process ctrlhub
//! controller. See the library for the reconcile logic.

use clap::Parser;
use kube::CustomResourceExt;
use memcached_controller::{Args, Memcached, run};
use tracing::warn;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.print_crd {
        print!("{}", serde_saphyr::to_string(&Memcached::crd())?);
        return Ok(());
    }
    // The level from CTRLHUB_LOG (or RUST_LOG), the format from --log-format.
    let mut logs = ctrlhub_sdk::logs::LogOptions::from_env()?;
    logs.format = args.log_format;
    ctrlhub_sdk::logs::init_with(&logs)?;
    // Off unless OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT is set.
    let traces = ctrlhub_sdk::traces::init("memcached-controller").unwrap_or_else(|err| {
        warn!("traces are not exported: {err}");
        ctrlhub_sdk::traces::Traces::disabled()
    });
    // SIGTERM/SIGINT drains; a second signal exits at once.
    let result = run(args, ctrlhub_sdk::shutdown_on_signals()).await;
    // After the drain, so the last reconciles' spans are exported too.
    traces.shutdown().await;
    result
}
