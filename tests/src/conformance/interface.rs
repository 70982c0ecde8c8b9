//! The language-neutral interface of a conformance controller (tests/conformance/README.md):
//! the environment it is given, the ConfigMap data that directs its handler, and the JSON lines
//! it reports.

use serde::Deserialize;
use serde_json::{Value, json};
use std::path::Path;

use super::Failure;

/// The label every in-scope object carries (`Register.label_selector` matches `in`).
pub const SCOPE_LABEL: &str = "conformance.ctrlhub.io/scope";

/// Environment variable: the manager's gRPC endpoint (`http://127.0.0.1:PORT`).
pub const ENV_ADDR: &str = "CTRLHUB_ADDR";
/// Environment variable: the file holding the bearer token, read again on every connect.
pub const ENV_TOKEN_FILE: &str = "CTRLHUB_TOKEN_FILE";
/// Environment variable: `Register.controller_name`.
pub const ENV_CONTROLLER: &str = "CONFORMANCE_CONTROLLER";
/// Environment variable: the one namespace to watch.
pub const ENV_NAMESPACE: &str = "CONFORMANCE_NAMESPACE";
/// Environment variable: `Register.max_in_flight` and concurrent reconciles.
pub const ENV_MAX_IN_FLIGHT: &str = "CONFORMANCE_MAX_IN_FLIGHT";
/// Environment variable: `Register.request_deadline` in milliseconds.
pub const ENV_DEADLINE_MS: &str = "CONFORMANCE_DEADLINE_MS";
/// Environment variable: `Register.backoff.base` in milliseconds.
pub const ENV_BACKOFF_BASE_MS: &str = "CONFORMANCE_BACKOFF_BASE_MS";
/// Environment variable: `Register.backoff.max` in milliseconds.
pub const ENV_BACKOFF_MAX_MS: &str = "CONFORMANCE_BACKOFF_MAX_MS";
/// Environment variable: the JSON-lines report file.
pub const ENV_REPORT: &str = "CONFORMANCE_REPORT";
/// Environment variable: the replica's name, copied into every report line.
pub const ENV_REPLICA: &str = "CONFORMANCE_REPLICA";
/// Environment variable: `leases` or `leases-metadata` to own `coordination.k8s.io/v1` Leases.
pub const ENV_OWNS: &str = "CONFORMANCE_OWNS";
/// Environment variable: `Register.revision`, read by the SDKs themselves.
pub const ENV_REVISION: &str = "CTRLHUB_REVISION";

/// One report line of a conformance controller. Fields a line does not carry take their
/// defaults; a `start` or `end` line missing its key, id or attempt breaks the interface, and
/// [`read_report`] says so.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Event {
    /// `start`, `end`, or anything else (ignored).
    pub event: String,
    /// Wall-clock Unix microseconds when the line was written.
    pub ts_us: u64,
    /// The replica that wrote it.
    #[serde(default)]
    pub replica: String,
    /// `namespace/name`.
    #[serde(default)]
    pub key: String,
    /// The request id.
    #[serde(default)]
    pub id: String,
    /// The request's attempt.
    #[serde(default)]
    pub attempt: u32,
    /// Reason names without the `REASON_` prefix (start only).
    #[serde(default)]
    pub reasons: Vec<Value>,
    /// `object`, `tombstone` or `none` (start only).
    #[serde(default)]
    pub object: String,
    /// The object's resourceVersion (start only).
    #[serde(default)]
    pub rv: String,
    /// The manager's deadline in Unix microseconds (start only).
    #[serde(default)]
    pub deadline_us: u64,
    /// The request's traceparent as received (start only).
    #[serde(default)]
    pub traceparent: String,
    /// The controller's own reconcile span (start only).
    #[serde(default)]
    pub span_traceparent: String,
    /// `done`, `error`, `terminal`, `requeue` or `cancelled` (end only).
    #[serde(default)]
    pub outcome: String,
    /// The reads of the `read` directive (end only).
    #[serde(default)]
    pub reads: Option<Value>,
    /// The session the line is about (`Registered.session_id`).
    #[serde(default)]
    pub session: String,
    /// The revision registered (registered only).
    #[serde(default)]
    pub revision: u64,
    /// `Registered.readable` as `{"Kind": "full" | "metadata"}` (registered only).
    #[serde(default)]
    pub readable: Option<Value>,
    /// The read of the `read_child` directive (end only).
    #[serde(default)]
    pub child: Option<Value>,
}

impl Event {
    /// Whether this is a `start` line.
    pub fn is_start(&self) -> bool {
        self.event == "start"
    }

    /// Whether this is an `end` line.
    pub fn is_end(&self) -> bool {
        self.event == "end"
    }

    /// Whether this is a `registered` line.
    pub fn is_registered(&self) -> bool {
        self.event == "registered"
    }

    /// Whether the reasons include `name` (e.g. `CREATED`).
    pub fn has_reason(&self, name: &str) -> bool {
        self.reasons.iter().any(|r| r.as_str() == Some(name))
    }

    /// The reasons as written, for messages.
    pub fn reason_list(&self) -> String {
        let names: Vec<String> = self
            .reasons
            .iter()
            .map(|r| r.as_str().map_or_else(|| r.to_string(), str::to_string))
            .collect();
        format!("[{}]", names.join(", "))
    }

    /// Whether a `start` or `end` line carries what every such line must.
    fn validate(&self) -> Result<(), String> {
        if !(self.is_start() || self.is_end()) {
            return Ok(());
        }
        if self.key.is_empty() || self.id.is_empty() || self.attempt == 0 || self.ts_us == 0 {
            return Err("a start or end line needs key, id, attempt >= 1 and ts_us".into());
        }
        if self.is_end() && self.outcome.is_empty() {
            return Err("an end line needs an outcome".into());
        }
        Ok(())
    }
}

/// Parses a report file. A missing file is an empty report (the process has not written yet);
/// a cut-off last line is ignored (a SIGKILL may cut it); any other line that is not a valid
/// event breaks the interface.
pub fn read_report(path: &Path) -> Result<Vec<Event>, Failure> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Failure::Setup(format!("reading {}: {e}", path.display()))),
    };
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut events = Vec::with_capacity(lines.len());
    for (n, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let last_and_cut = n + 1 == lines.len() && !complete;
        match serde_json::from_str::<Event>(line) {
            Ok(e) => match e.validate() {
                Ok(()) => events.push(e),
                Err(why) => return Err(bad_line(path, n, line, &why)),
            },
            Err(_) if last_and_cut => {}
            Err(e) => return Err(bad_line(path, n, line, &e.to_string())),
        }
    }
    Ok(events)
}

fn bad_line(path: &Path, n: usize, line: &str, why: &str) -> Failure {
    Failure::Violation(format!(
        "report {} line {} breaks the interface ({why}): {line}",
        path.display(),
        n + 1
    ))
}

/// The ConfigMap data of a handler's instructions (README section 3).
#[derive(Debug, Clone, Default)]
pub struct Directives {
    data: Vec<(String, String)>,
}

impl Directives {
    /// No instructions: answer `done` at once.
    pub fn done() -> Directives {
        Directives::default()
    }

    /// `outcome`: one entry per attempt, the last one repeating.
    pub fn outcome(mut self, per_attempt: &str) -> Directives {
        self.data.push(("outcome".into(), per_attempt.into()));
        self
    }

    /// `sleep_ms`: one entry per attempt, the last one repeating.
    pub fn sleep_ms(mut self, per_attempt: &str) -> Directives {
        self.data.push(("sleep_ms".into(), per_attempt.into()));
        self
    }

    /// `read`: Get this object and List the namespace through the manager.
    pub fn read(mut self, name: &str) -> Directives {
        self.data.push(("read".into(), name.into()));
        self
    }

    /// `block_ms`: work that ignores cancellation, one entry per attempt.
    pub fn block_ms(mut self, per_attempt: &str) -> Directives {
        self.data.push(("block_ms".into(), per_attempt.into()));
        self
    }

    /// `read_child`: Get this Lease (an owned child) through the manager.
    pub fn read_child(mut self, name: &str) -> Directives {
        self.data.push(("read_child".into(), name.into()));
        self
    }

    /// Any other data entry (e.g. a counter that makes an update a real change).
    pub fn with(mut self, key: &str, value: &str) -> Directives {
        self.data.push((key.into(), value.into()));
        self
    }

    /// The ConfigMap `data` object.
    pub fn to_data(&self) -> Value {
        let map: serde_json::Map<String, Value> = self
            .data
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        Value::Object(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> Result<Vec<Event>, Failure> {
        let dir = tempfile::tempdir().map_err(|e| Failure::Setup(e.to_string()))?;
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, text).map_err(|e| Failure::Setup(e.to_string()))?;
        read_report(&path)
    }

    #[test]
    fn parses_lines_and_tolerates_a_cut_last_line() -> Result<(), Failure> {
        let events = write(concat!(
            r#"{"event":"start","ts_us":5,"replica":"r1","key":"a/b","id":"1","attempt":1,"reasons":["CREATED",7]}"#,
            "\n",
            r#"{"event":"registered","ts_us":6}"#,
            "\n",
            r#"{"event":"end","ts_us":7,"key":"a/b","id":"1","attempt":1,"outc"#,
        ))?;
        assert_eq!(events.len(), 2);
        assert!(events[0].has_reason("CREATED"));
        assert_eq!(events[0].reason_list(), "[CREATED, 7]");
        Ok(())
    }

    #[test]
    fn incomplete_or_garbled_lines_break_the_interface() {
        assert!(matches!(
            write("{\"event\":\"start\",\"ts_us\":5,\"key\":\"a/b\"}\n"),
            Err(Failure::Violation(_))
        ));
        assert!(matches!(
            write("not json\n{\"event\":\"x\",\"ts_us\":1}\n"),
            Err(Failure::Violation(_))
        ));
        assert!(matches!(write(""), Ok(v) if v.is_empty()));
    }

    #[test]
    fn directives_become_configmap_data() {
        let d = Directives::done()
            .outcome("error,done")
            .sleep_ms("60000,0")
            .read("target");
        assert_eq!(
            d.to_data(),
            json!({"outcome": "error,done", "sleep_ms": "60000,0", "read": "target"})
        );
    }
}
