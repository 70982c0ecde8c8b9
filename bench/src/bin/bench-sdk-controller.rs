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

/// Reports go through a channel to one writer task on the same thread, which writes whatever has
/// accumulated in one write(2): no line costs a syscall or a thread wakeup of its own.
struct Ctx {
    lines: tokio::sync::mpsc::UnboundedSender<String>,
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

async fn writer(mut rx: tokio::sync::mpsc::UnboundedReceiver<String>) {
    let mut batch = String::new();
    while let Some(line) = rx.recv().await {
        batch.clear();
        batch.push_str(&line);
        batch.push('\n');
        while let Ok(line) = rx.try_recv() {
            batch.push_str(&line);
            batch.push('\n');
        }
        let mut out = std::io::stdout().lock();
        if out
            .write_all(batch.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            return;
        }
    }
}

/// One thread: a replica is the unit of scale-out, and three multi-thread runtimes on two shared
/// cores spent their time waking each other's workers (futex calls were 15% of a replica's
/// profile in the throughput scenario).
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(writer(rx));
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
