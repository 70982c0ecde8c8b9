//! Table rows, verdicts and the JSON results file.

use serde_json::Value;
use std::fmt::Write as _;
use std::time::Duration;

/// Whether a figure meets its goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The goal is met.
    Met,
    /// The goal is missed.
    Missed,
    /// A figure without a goal (context for another row).
    Info,
}

impl Verdict {
    /// `Met` when `ok`, else `Missed`.
    pub fn of(ok: bool) -> Self {
        if ok { Verdict::Met } else { Verdict::Missed }
    }

    fn text(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "MISSED",
            Verdict::Info => "",
        }
    }
}

/// One line of the results table: a figure for ctrlhub and for its peer.
#[derive(Debug, Clone)]
pub struct Row {
    /// Scenario name, e.g. `throughput`.
    pub scenario: String,
    /// What is measured, e.g. `live objects/s`.
    pub metric: String,
    /// ctrlhub's figure, formatted.
    pub ctrlhub: String,
    /// The peer's figure (kube-rs), formatted; empty when there is none.
    pub peer: String,
    /// The goal, in words; empty when there is none.
    pub goal: String,
    /// Whether the goal is met.
    pub verdict: Verdict,
}

impl Row {
    /// A row with a goal.
    pub fn new(
        scenario: &str,
        metric: &str,
        ctrlhub: impl Into<String>,
        peer: impl Into<String>,
        goal: &str,
        verdict: Verdict,
    ) -> Row {
        Row {
            scenario: scenario.into(),
            metric: metric.into(),
            ctrlhub: ctrlhub.into(),
            peer: peer.into(),
            goal: goal.into(),
            verdict,
        }
    }

    /// A context row without a goal.
    pub fn info(
        scenario: &str,
        metric: &str,
        ctrlhub: impl Into<String>,
        peer: impl Into<String>,
    ) -> Row {
        Row::new(scenario, metric, ctrlhub, peer, "", Verdict::Info)
    }
}

/// What one scenario produced: table rows and its figures as JSON.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Scenario name (the JSON key).
    pub scenario: String,
    /// Rows for the table.
    pub rows: Vec<Row>,
    /// Raw figures.
    pub json: Value,
}

/// Renders rows as a Markdown table (readable in a terminal and pasteable into BENCHMARKS.md).
pub fn table(rows: &[Row]) -> String {
    let headers = [
        "scenario",
        "metric",
        "ctrlhub",
        "peer (kube-rs)",
        "goal",
        "verdict",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.scenario.clone(),
                r.metric.clone(),
                r.ctrlhub.clone(),
                r.peer.clone(),
                r.goal.clone(),
                r.verdict.text().to_string(),
            ]
        })
        .collect();
    let mut width = headers.map(str::len);
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[String]| {
        out.push('|');
        for (c, w) in row.iter().zip(width) {
            let _ = write!(out, " {c:<w$} |");
        }
        out.push('\n');
    };
    line(&mut out, &headers.map(String::from));
    line(&mut out, &width.map(|w| "-".repeat(w)));
    for row in &cells {
        line(&mut out, row);
    }
    out
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Mebibytes with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Median, 99th percentile and maximum of `samples` (sorted in place); zeros when empty.
pub fn percentiles(samples: &mut [Duration]) -> (Duration, Duration, Duration) {
    if samples.is_empty() {
        return Default::default();
    }
    samples.sort();
    let q = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    (q(0.5), q(0.99), samples[samples.len() - 1])
}
