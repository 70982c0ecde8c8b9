//! The peer as its own process: an in-process `kube::runtime::Controller` (concurrency 16) with a
//! no-op reconciler on the bench Widget CRD, its own list/watch and cache, reporting each
//! reconcile start on stdout as `R <ns>/<name> <latency-µs>`. Uses `KUBECONFIG`.

use clap::Parser;
use parking_lot::Mutex;
use std::io::Write;
use std::sync::Arc;

#[derive(Parser)]
struct Args {
    /// Namespace to reconcile.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Concurrent reconciles.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = kube::Client::try_default().await?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    // One writer thread flushing when it runs dry (as bench-sdk-controller does), so both
    // sides pay the same reporting cost.
    std::thread::spawn(move || {
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
    });
    let tx = Mutex::new(tx);
    ctrlhub_bench::contenders::kube_runtime::run(
        client,
        &args.namespace,
        args.concurrency,
        Arc::new(move |r| {
            let _ = tx.lock().send(format!("R {} {}", r.key, r.latency_us));
        }),
    )
    .await;
    Ok(())
}
