//! `memcached-controller`: the Operator SDK memcached sample as an out-of-process ctrlhub
//! controller. See the library for the reconcile logic.

use clap::Parser;
use ctrlhub_sdk::CancellationToken;
use kube::CustomResourceExt;
use memcached_controller::{Args, Memcached, run};
use tracing::{info, warn};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.print_crd {
        print!("{}", serde_saphyr::to_string(&Memcached::crd())?);
        return Ok(());
    }
    ctrlhub_sdk::traces::logs::init(args.log_format, "info");
    // Off unless OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT is set.
    let traces = ctrlhub_sdk::traces::init("memcached-controller").unwrap_or_else(|err| {
        warn!("traces are not exported: {err}");
        ctrlhub_sdk::traces::Traces::disabled()
    });
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    let result = run(args, shutdown).await;
    // After the drain, so the last reconciles' spans are exported too.
    traces.shutdown().await;
    result
}

/// SIGTERM/SIGINT → graceful drain; a second signal exits at once.
async fn watch_signals(shutdown: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(err) => {
            warn!("cannot listen for SIGTERM: {err}");
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
            return;
        }
    };
    for n in 0.. {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        if n == 0 {
            info!("signal received: draining (signal again to exit immediately)");
            shutdown.cancel();
        } else {
            warn!("second signal: exiting without draining");
            std::process::exit(130);
        }
    }
}
