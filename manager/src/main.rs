//! The `ctrlhub` binary: `ctrlhub run` (the manager) and, with the default `dev` feature,
//! `ctrlhub dev` (devcluster + manager + demo controller in one command).

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

/// A multi-tenant Kubernetes controller manager for out-of-process controllers.
#[derive(Parser, Debug)]
#[command(name = "ctrlhub", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the manager against a cluster.
    Run(Box<ctrlhub::run::RunArgs>),
    /// Start devcluster, the manager and the memcached demo controller, apply a sample and show
    /// the reconciles.
    #[cfg(feature = "dev")]
    Dev(ctrlhub::run::dev::DevArgs),
}

fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("signal received; shutting down");
        t.cancel();
    });
    token
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn,tower=warn,h2=warn,hyper=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    // Off (no exporter, no spans) unless OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT is set; a bad
    // tracing setup is reported but does not stop the manager.
    let traces = ctrlhub_otel::init("ctrlhub").unwrap_or_else(|e| {
        tracing::error!(error = %e, "traces are not exported");
        ctrlhub_otel::Traces::disabled()
    });
    let stop = shutdown_on_signal();
    let result = match cli.command {
        Command::Run(args) => args.run(stop).await,
        #[cfg(feature = "dev")]
        Command::Dev(args) => args.run(stop).await,
    };
    // After the sessions are revoked, so the last attempts' spans are flushed, not lost.
    traces.shutdown().await;
    result
}
