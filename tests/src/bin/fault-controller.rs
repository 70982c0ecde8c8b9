//! `fault-controller`: a no-op ConfigMap controller built on ctrlhub-sdk for the fault suite
//! (tests/tests/adversity/faults.rs). It logs every reconcile start and end, one line each, so the test
//! can prove after the fact that no key was lost and no key ran twice at once.
//!
//! Each replica is its own process (so a test can SIGKILL it) with its own log file:
//!
//! ```text
//! <unix micros> <replica> start <namespace/name> <resourceVersion or -> <request id>
//! <unix micros> <replica> end   <namespace/name> <resourceVersion or -> <request id> <done|cancelled>
//! ```
//!
//! Flags (all required except the last two): `--manager URL --log PATH --name REPLICA
//! --namespace NS [--concurrency N] [--work-ms MS]`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ctrlhub_sdk::{
    Action, Backoff, CancellationToken, Config, Controller, ReconcileError, Request, Scope,
};
use k8s_openapi::api::core::v1::ConfigMap;

struct Log {
    replica: String,
    file: Mutex<File>,
}

impl Log {
    fn line(&self, rest: &str) {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        // One write per line: the checker parses whole lines, and a SIGKILL may only cut the
        // last one short (the parser tolerates a truncated last line).
        let text = format!("{micros} {} {rest}\n", self.replica);
        let mut file = self.file.lock();
        if let Err(err) = file.write_all(text.as_bytes()) {
            eprintln!("fault-controller: cannot write the reconcile log: {err}");
            std::process::exit(2);
        }
    }
}

/// Writes the `end` line when the reconcile finishes — or when the SDK drops the future
/// (session ended, deadline), which is exactly when this replica stops working on the key.
struct InFlight {
    log: Arc<Log>,
    what: String,
    outcome: &'static str,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.log
            .line(&format!("end {} {}", self.what, self.outcome));
    }
}

struct Ctx {
    log: Arc<Log>,
    work: Duration,
}

async fn reconcile(req: Request<ConfigMap>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let rv = req
        .object
        .as_ref()
        .and_then(|o| o.metadata.resource_version.clone())
        .unwrap_or_else(|| "-".to_string());
    let what = format!("{} {rv} {}", req.key, req.id);
    ctx.log.line(&format!("start {what}"));
    let mut guard = InFlight {
        log: ctx.log.clone(),
        what,
        outcome: "cancelled",
    };
    // Some work, so reconciles overlap with faults; the duration is a pure function of the key
    // and version (DefaultHasher has fixed keys), so reruns behave alike.
    let max = ctx.work.as_micros().max(1) as u64;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (req.key.to_string(), &rv).hash(&mut h);
    tokio::time::sleep(Duration::from_micros(h.finish() % max)).await;
    guard.outcome = "done";
    drop(guard);
    Ok(Action::done())
}

fn parse_args() -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let Some(name) = flag.strip_prefix("--") else {
            return Err(format!("unexpected argument {flag:?}"));
        };
        let value = args
            .next()
            .ok_or_else(|| format!("--{name} needs a value"))?;
        out.insert(name.to_string(), value);
    }
    for required in ["manager", "log", "name", "namespace"] {
        if !out.contains_key(required) {
            return Err(format!("--{required} is required"));
        }
    }
    Ok(out)
}

#[tokio::main]
async fn main() {
    // The SDK's own logs (sessions, reconnects) go to stderr, which the test keeps per replica.
    ctrlhub_tests::process::log_to_stderr();
    let args = match parse_args() {
        Ok(a) => a,
        Err(err) => {
            eprintln!("fault-controller: {err}");
            std::process::exit(64);
        }
    };
    let number = |name: &str, default: u64| -> u64 {
        match args.get(name).map(|v| v.parse::<u64>()) {
            None => default,
            Some(Ok(n)) => n,
            Some(Err(err)) => {
                eprintln!("fault-controller: --{name}: {err}");
                std::process::exit(64);
            }
        }
    };
    let concurrency = u32::try_from(number("concurrency", 8)).unwrap_or(8);
    let work = Duration::from_millis(number("work-ms", 5));
    let file = match File::options().create(true).append(true).open(&args["log"]) {
        Ok(f) => f,
        Err(err) => {
            eprintln!("fault-controller: cannot open {}: {err}", args["log"]);
            std::process::exit(66);
        }
    };
    let ctx = Arc::new(Ctx {
        log: Arc::new(Log {
            replica: args["name"].clone(),
            file: Mutex::new(file),
        }),
        work,
    });
    let mut config = Config::new(args["manager"].clone(), "dev");
    // Faults end sessions on purpose: reconnect quickly (the default backoff grows to 10 s,
    // which would only make the suite slower, not stricter).
    config.reconnect = Backoff::new(
        Duration::from_millis(50),
        Duration::from_millis(500),
        Duration::from_secs(5),
    );
    // Off unless OTEL_EXPORTER_OTLP_ENDPOINT is set (the traces suite sets it).
    let _traces = ctrlhub_sdk::traces::init("fault-controller");
    let result = Controller::new("faults")
        .reconciles::<ConfigMap>()
        .namespaces(Scope::Names(vec![args["namespace"].clone()]))
        .max_concurrent_reconciles(concurrency)
        .include_object(true)
        .run(config, reconcile, ctx, CancellationToken::new())
        .await;
    if let Err(err) = result {
        eprintln!("fault-controller: {err}");
        std::process::exit(1);
    }
}
