//! The documents are the contract: what they promise is checked against the repository.
//!
//! `docs/architecture.md`'s bounds tables ("what a tenant can spend", "what a stranger can
//! spend") and its telemetry table must give every row a test, and every test they name must
//! exist: a bound (or a signal) without a test is a promise nobody checks.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the repository")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, recursively, skipping build output.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name == "node_modules" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The rows of the markdown tables under every heading of `doc` that starts with `prefix`, up
/// to the next heading of the same level, as (section, cells).
fn table_rows(doc: &str, prefix: &str) -> Vec<(String, Vec<String>)> {
    let mut rows = Vec::new();
    let mut section: Option<String> = None;
    for line in doc.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            section = title.starts_with(prefix).then(|| title.to_string());
            continue;
        }
        let Some(section) = &section else { continue };
        let line = line.trim();
        if !line.starts_with('|') || line.starts_with("| ---") {
            continue;
        }
        let cells: Vec<String> = line
            .trim_matches('|')
            .split(" | ")
            .map(|c| c.trim().to_string())
            .collect();
        rows.push((section.clone(), cells));
    }
    rows
}

/// The names in backticks of a table cell that look like test function names.
fn named_tests(cell: &str) -> Vec<&str> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .filter(|n| {
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && n.contains('_')
        })
        .collect()
}

#[test]
fn every_bounds_row_names_a_test_that_exists() {
    let root = repo();
    let doc =
        std::fs::read_to_string(root.join("docs/architecture.md")).expect("the architecture doc");
    let mut files = Vec::new();
    for dir in [
        "manager",
        "tests",
        "otel",
        "controllers",
        "devcluster",
        "bench",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    let sources: String = files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .collect::<Vec<_>>()
        .join("\n");
    let mut rows = table_rows(&doc, "Bounds:");
    assert!(
        rows.len() > 40,
        "the bounds tables were not found: {} rows",
        rows.len()
    );
    let telemetry = table_rows(&doc, "Telemetry");
    assert!(telemetry.len() > 10, "the telemetry table was not found");
    rows.extend(telemetry);
    let mut problems = Vec::new();
    for (section, cells) in rows {
        if cells.first().is_some_and(|c| {
            ["input", "structure", "input or resource", "signal"].contains(&c.as_str())
        }) {
            continue;
        }
        let test = cells.last().map(String::as_str).unwrap_or_default();
        let names = named_tests(test);
        if names.is_empty() && !test.starts_with('—') {
            problems.push(format!("{section}: `{}` names no test", cells[0]));
        }
        for name in names {
            if !sources.contains(&format!("fn {name}(")) {
                problems.push(format!(
                    "{section}: `{}` names `{name}`, which is no test",
                    cells[0]
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
