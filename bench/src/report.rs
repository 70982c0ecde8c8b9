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
    /// A reference implementation's figure (the throughput scenario's kopf operator),
    /// formatted; empty when there is none. Not part of any goal.
    pub reference: String,
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
            reference: String::new(),
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

    /// This row with a reference figure (shown in the table's `reference (kopf)` column).
    pub fn with_reference(mut self, reference: impl Into<String>) -> Row {
        self.reference = reference.into();
        self
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
/// The `reference (kopf)` column appears only when some row has a reference figure, so the
/// tables of the other scenarios keep their shape.
pub fn table(rows: &[Row]) -> String {
    let with_reference = rows.iter().any(|r| !r.reference.is_empty());
    let mut headers = vec!["scenario", "metric", "ctrlhub", "peer (kube-rs)"];
    if with_reference {
        headers.push("reference (kopf)");
    }
    headers.extend(["goal", "verdict"]);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.scenario.clone(),
                r.metric.clone(),
                r.ctrlhub.clone(),
                r.peer.clone(),
            ];
            if with_reference {
                row.push(r.reference.clone());
            }
            row.extend([r.goal.clone(), r.verdict.text().to_string()]);
            row
        })
        .collect();
    let mut width: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[String]| {
        out.push('|');
        for (c, &w) in row.iter().zip(&width) {
            let _ = write!(out, " {c:<w$} |");
        }
        out.push('\n');
    };
    let header_cells: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    line(&mut out, &header_cells);
    let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
    line(&mut out, &rule);
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
