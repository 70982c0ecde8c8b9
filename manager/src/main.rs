//! The `ctrlhub` binary: `ctrlhub run` (the manager) and, with the default `dev` feature,
//! `ctrlhub dev` (devcluster + manager + demo controller in one command).

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

/// A multi-tenant Kubernetes controller manager for out-of-process controllers.
///
/// Every option can also be set by the environment variable shown with it (`CTRLHUB_` and the
/// flag's name, e.g. `--grpc-addr` is `CTRLHUB_GRPC_ADDR`; only `--kubeconfig` reads the usual
/// `KUBECONFIG`). Secret values are never shown here.
#[derive(Parser, Debug)]
#[command(name = "ctrlhub", version)]
struct Cli {
    /// Log lines as human-readable `text` or one JSON object per line (`json`), with the trace
    /// and span ids of a traced reconcile; filtered by `RUST_LOG`.
    #[arg(
        long,
        global = true,
        env = "CTRLHUB_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    log_format: ctrlhub_otel::logs::LogFormat,
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

/// Runs the command; a fatal error is logged as the last line in the chosen log format (JSON
/// under `--log-format json`, so log collectors keep it) and the exit status is 1.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Parsed first: the log format is an option. Argument errors and --help print on their own.
    let cli = Cli::parse();
    ctrlhub_otel::logs::init(
        cli.log_format,
        "info,kube=warn,tower=warn,h2=warn,hyper=warn",
    );
    // Off (no exporter, no spans) unless OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT is set; a bad
    // tracing setup is reported but does not stop the manager.
    let traces = ctrlhub_otel::init_with_version("ctrlhub", Some(env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|e| {
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
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}`: the whole chain of causes on one line, as anyhow's `Error:` output had it.
            tracing::error!(error = %format!("{e:#}"), "ctrlhub stopped on a fatal error");
            std::process::ExitCode::FAILURE
        }
    }
}
