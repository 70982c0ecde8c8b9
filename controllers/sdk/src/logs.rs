//! Log output a controller can be run on, configured the same way in every ctrlhub SDK:
//!
//! - `CTRLHUB_LOG`: a level, `error`, `warn`, `info` (the default), `debug` or `trace` (or
//!   `off`), or a [`tracing_subscriber::EnvFilter`] directive such as
//!   `info,ctrlhub_sdk=debug,my_controller=trace`. A bare level applies to everything but the
//!   HTTP/2 and TLS plumbing (`h2`, `hyper`, `hyper_util`, `tower`, `rustls`), which stays at
//!   `warn` at most; name them in a directive to see more. When `CTRLHUB_LOG` is unset,
//!   `RUST_LOG` is read the same way.
//! - `CTRLHUB_LOG_FORMAT`: `text` (the default; colours only on a terminal) or `json`: one
//!   object per line in the manager's shape, `timestamp`, `level`, `target`, `fields` (with
//!   `message`) and `span`, the current span with its fields.
//!
//! ```no_run
//! fn main() -> Result<(), ctrlhub_sdk::logs::LogError> {
//!     ctrlhub_sdk::logs::init()?; // CTRLHUB_LOG, CTRLHUB_LOG_FORMAT
//!     // ...
//! #   Ok(())
//! }
//! ```
//!
//! What the SDK logs, at every level the same way (no level changes what the controller does):
//!
//! - one INFO line when a reconcile starts (`reconcile start key=ns/name attempt=1`, fields
//!   `key`, `reasons`, `attempt`) and one when it ends (`reconcile end key=ns/name
//!   outcome=success`, fields `key`, `reasons`, `attempt`, `outcome`, `duration_ms`); a failed
//!   end is at WARN with the `error`. Outcomes are `success`, `requeue`, `requeue_after`,
//!   `error`, `terminal`, `deadline` (cancelled at its deadline) and `lost` (its session ended);
//! - every line logged while a reconcile runs, by the SDK or by the handler through `tracing`,
//!   is inside the `reconcile` span: `key`, `request_id`, `attempt`, `controller`,
//!   `session_id`, and the `trace_id` and `span_id` of the reconcile's trace, so logs join
//!   traces. Work a handler spawns keeps them with `tracing::Instrument::in_current_span`;
//! - a panicking reconcile logs its backtrace at ERROR at most once a minute per key (the
//!   panic hook [`init`] installs), the other panics of that key one line each;
//! - a manager that shuts down or a standby that answers UNAVAILABLE is logged as
//!   "reconnecting" at INFO or WARN, never as a rejection; only refusals that need a human
//!   (INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED) say "rejected".

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use tracing_subscriber::EnvFilter;

/// `text` or `json`.
pub use ctrlhub_otel::logs::LogFormat;

/// The variable holding the level (or an `EnvFilter` directive).
pub const LEVEL_ENV: &str = "CTRLHUB_LOG";
/// The variable holding the format, `text` or `json`.
pub const FORMAT_ENV: &str = "CTRLHUB_LOG_FORMAT";

/// How often a key's panic backtrace is logged at most.
const BACKTRACE_EVERY: Duration = Duration::from_secs(60);

/// The log settings are not understood.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Neither a level nor an `EnvFilter` directive.
    #[error(
        "{var}={value:?} is not a log level (error, warn, info, debug, trace, off) nor an \
         EnvFilter directive (like info,ctrlhub_sdk=debug){}",
        reason_suffix(.reason)
    )]
    InvalidLevel {
        /// The variable it came from.
        var: &'static str,
        /// Its value.
        value: String,
        /// What the directive parser said, if it was tried.
        reason: String,
    },
    /// Neither `text` nor `json`.
    #[error("{FORMAT_ENV}={0:?} is not a log format: use text or json")]
    InvalidFormat(String),
}

fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

/// Log settings: the level (or directive) and the format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogOptions {
    /// A level or an `EnvFilter` directive (see the module docs).
    pub level: String,
    /// Text or JSON lines.
    pub format: LogFormat,
}

impl Default for LogOptions {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

impl LogOptions {
    /// From `CTRLHUB_LOG` (else `RUST_LOG`, else `info`) and `CTRLHUB_LOG_FORMAT` (else
    /// `text`).
    pub fn from_env() -> Result<Self, LogError> {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let (level_var, level) = match var(LEVEL_ENV) {
            Some(v) => (LEVEL_ENV, v),
            None => ("RUST_LOG", var("RUST_LOG").unwrap_or_else(|| "info".into())),
        };
        // Checked now, so that a typo is an error at start, not a silent default.
        filter_from(level_var, &level)?;
        let format = match var(FORMAT_ENV).map(|f| f.to_ascii_lowercase()).as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => return Err(LogError::InvalidFormat(other.to_owned())),
        };
        Ok(Self { level, format })
    }
}

/// Installs the process's log subscriber from `CTRLHUB_LOG` and `CTRLHUB_LOG_FORMAT` (see the
/// module docs) and the panic hook. Call it once, first thing in `main`. When a subscriber is
/// installed already (a test harness, a program embedding the controller), that one stays.
pub fn init() -> Result<(), LogError> {
    init_with(&LogOptions::from_env()?)
}

/// [`init`] with explicit settings (e.g. from command-line flags).
pub fn init_with(options: &LogOptions) -> Result<(), LogError> {
    let filter = filter_from(LEVEL_ENV, &options.level)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second call, or a subscriber installed by someone else, keeps the first one.
    let _ = match options.format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    install_panic_hook();
    Ok(())
}

/// The levels a bare value may name.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// The filter for `value` of variable `var` (see the module docs).
pub fn filter(value: &str) -> Result<EnvFilter, LogError> {
    filter_from(LEVEL_ENV, value)
}

fn filter_from(var: &'static str, value: &str) -> Result<EnvFilter, LogError> {
    let invalid = |reason: String| LogError::InvalidLevel {
        var,
        value: value.to_owned(),
        reason,
    };
    let trimmed = value.trim();
    let lower = trimmed.to_ascii_lowercase();
    let lower = if lower == "warning" {
        "warn".into()
    } else {
        lower
    };
    if let Some(rank) = LEVELS.iter().position(|l| *l == lower) {
        // The transport crates at warn at most (error, off stay as asked).
        let transport = LEVELS[rank.min(2)];
        let directive = format!(
            "{lower},h2={transport},hyper={transport},hyper_util={transport},\
             tower={transport},rustls={transport}"
        );
        return EnvFilter::try_new(directive).map_err(|e| invalid(e.to_string()));
    }
    // Anything else must look like a directive: a bare word would be taken for a target name
    // and silently turn every other line off.
    if !trimmed.contains('=') && !trimmed.contains(',') {
        return Err(invalid(String::new()));
    }
    EnvFilter::try_new(trimmed).map_err(|e| invalid(e.to_string()))
}

tokio::task_local! {
    /// The key of the reconcile running on this task, for the panic hook.
    static RECONCILE_KEY: String;
}

/// Runs `work` as the reconcile of `key` (for the panic hook).
pub(crate) async fn as_reconcile_of<F: Future>(key: String, work: F) -> F::Output {
    RECONCILE_KEY.scope(key, work).await
}

/// Installs a panic hook that logs a panic inside a reconcile through `tracing` (inside its
/// span, so with its key and request id), with a backtrace at most once a minute per key and
/// one line otherwise; panics elsewhere go to the hook installed before. [`init`] calls it;
/// call it yourself when you install your own subscriber. Installed once per process.
pub fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            match RECONCILE_KEY.try_with(Clone::clone) {
                Ok(key) => log_panic(&key, info),
                Err(_) => previous(info),
            }
        }));
    });
}

/// Logs one reconcile panic.
fn log_panic(key: &str, info: &std::panic::PanicHookInfo<'_>) {
    static LAST: Mutex<Option<HashMap<String, Instant>>> = Mutex::new(None);
    let what = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".into());
    let location = info
        .location()
        .map(|l| format!("{}:{}", l.file(), l.line()))
        .unwrap_or_default();
    let now = Instant::now();
    let due = {
        let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
        let last = last.get_or_insert_with(HashMap::new);
        let due = last
            .get(key)
            .is_none_or(|at| now.duration_since(*at) >= BACKTRACE_EVERY);
        if due {
            if last.len() >= 4096 {
                last.retain(|_, at| now.duration_since(*at) < BACKTRACE_EVERY);
            }
            last.insert(key.to_owned(), now);
        }
        due
    };
    if due {
        let backtrace = std::backtrace::Backtrace::force_capture();
        tracing::error!(
            %key,
            %location,
            %backtrace,
            "reconcile panicked at {location}: {what} (the backtrace of a key is logged at most once a minute)"
        );
    } else {
        tracing::error!(%key, %location, "reconcile panicked at {location}: {what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_directives() {
        for ok in ["info", "DEBUG", "trace", "warn", "warning", "error", "off"] {
            assert!(filter(ok).is_ok(), "{ok}");
        }
        let debug = filter("debug").map(|f| f.to_string()).unwrap_or_default();
        assert!(
            debug.contains("h2=warn") && debug.ends_with(",debug"),
            "{debug}"
        );
        let error = filter("error").map(|f| f.to_string()).unwrap_or_default();
        assert!(error.contains("h2=error"), "{error}");
        assert!(filter("info,ctrlhub_sdk=debug").is_ok());
        assert!(filter("ctrlhub_sdk=trace").is_ok());
        assert!(matches!(
            filter("verbose"),
            Err(LogError::InvalidLevel { ref value, .. }) if value == "verbose"
        ));
        assert!(matches!(
            filter("info,x=notalevel"),
            Err(LogError::InvalidLevel { ref reason, .. }) if !reason.is_empty()
        ));
    }
}
