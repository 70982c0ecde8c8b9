//! `devcluster --listen 127.0.0.1:PORT --kubeconfig PATH [--http]`: run the in-memory API server.

use anyhow::Context;
use clap::Parser;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// An embedded, in-memory Kubernetes API server.
#[derive(Parser, Debug)]
#[command(name = "devcluster", version)]
struct Args {
    /// Address to serve on; port 0 picks a free port (the ready line shows which).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write a kubeconfig for this server.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Serve plain HTTP instead of HTTPS.
    #[arg(long)]
    http: bool,
    /// Seconds between bookmarks on watches that allow them.
    #[arg(long, default_value_t = 5)]
    bookmark_seconds: u64,
    /// Watch events kept for resumes; older resourceVersions get 410 Expired.
    #[arg(long, default_value_t = 10_000)]
    history: usize,
    /// Log lines as `text` or one JSON object per line (`json`), on stderr; filtered by
    /// RUST_LOG (default warn).
    #[arg(long, env = "DEVCLUSTER_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr);
    if args.log_format == "json" {
        logs.json()
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    let opts = devcluster::Options {
        listen: args.listen,
        tls: !args.http,
        bookmark_interval: Duration::from_secs(args.bookmark_seconds.max(1)),
        history_limit: args.history,
        ..Default::default()
    };
    let cluster = devcluster::DevCluster::start(opts)
        .await
        .context("starting devcluster")?;
    cluster
        .write_kubeconfig(&args.kubeconfig)
        .with_context(|| format!("writing kubeconfig to {}", args.kubeconfig.display()))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "devcluster ready at {}", cluster.url())?;
        out.flush()?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("devcluster shutting down");
    cluster.shutdown().await;
    Ok(())
}
