//! A thin ctrlhub controller for the benchmarks: the Rust SDK with a no-op reconciler on the
//! bench Widget CRD. Each reconcile start is reported on stdout as `R <ns>/<name> <latency-µs>`
//! (latency from the object's timestamp annotation; -1 without one). SIGTERM drains and exits.

use clap::Parser;
use ctrlhub_bench::env::{latency_of, widget_type};
use ctrlhub_sdk::{Action, Config, Controller, ReconcileError, Request, Scope};
use kube::api::DynamicObject;
use std::io::Write;
use std::sync::Arc;

#[derive(Parser)]
struct Args {
    /// Manager gRPC endpoint.
    #[arg(long)]
    addr: String,
    /// Controller name (replicas share it).
    #[arg(long, default_value = "bench")]
    name: String,
    /// Namespace to reconcile (all when empty).
    #[arg(long, default_value = "")]
    namespace: String,
    /// Concurrent reconciles of this replica.
    #[arg(long, default_value_t = 16)]
    concurrency: u32,
}

/// Reports go through a channel to one writer thread, which flushes only when it runs dry, so a
/// burst of reconciles costs one write(2) rather than one per line.
struct Ctx {
    lines: std::sync::mpsc::Sender<String>,
}

async fn reconcile(req: Request<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let latency = latency_of(
        req.object
            .as_ref()
            .and_then(|o| o.metadata.annotations.as_ref()),
    );
    let _ = ctx.lines.send(format!(
        "R {}/{} {latency}",
        req.namespace().unwrap_or_default(),
        req.name()
    ));
    Ok(Action::done())
}

fn writer(rx: std::sync::mpsc::Receiver<String>) {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    while let Ok(line) = rx.recv() {
        let _ = writeln!(out, "{line}");
        while let Ok(line) = rx.try_recv() {
            let _ = writeln!(out, "{line}");
        }
        if out.flush().is_err() {
            return;
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || writer(rx));
    let shutdown = ctrlhub_sdk::CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            term.recv().await;
        }
        on_signal.cancel();
    });
    let scope = if args.namespace.is_empty() {
        Scope::All
    } else {
        Scope::Names(vec![args.namespace.clone()])
    };
    Controller::new(args.name)
        .reconciles_dynamic(widget_type())
        .namespaces(scope)
        .max_concurrent_reconciles(args.concurrency)
        .include_object(true)
        .run(
            Config::new(args.addr, "dev"),
            reconcile,
            Arc::new(Ctx { lines: tx }),
            shutdown,
        )
        .await?;
    Ok(())
}
