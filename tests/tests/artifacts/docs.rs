//! The documents are the contract: what they promise is checked against the repository.
//!
//! `docs/architecture.md`'s bounds tables ("what a tenant can spend", "what a stranger can
//! spend") must give every row a test, and every test they name must exist: a bound without a
//! test is a promise nobody checks. The README stays a front page of at most 300 lines, and the
//! command blocks the docs/ pages show work as written.

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

/// The "may call" table of `docs/architecture.md`: folder (or top-level file) → what it may
/// call (`None`: everything).
fn may_call(doc: &str) -> Vec<(Vec<String>, Option<Vec<String>>)> {
    let start = doc
        .find("| folder | may call |")
        .expect("the may-call table in docs/architecture.md");
    doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            let names = |cell: &str| -> Vec<String> {
                cell.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_string)
                    .collect()
            };
            let allowed = match cells.get(1).map(|c| c.trim()) {
                Some("everything") => None,
                Some(cell) => Some(names(cell)),
                None => Some(Vec::new()),
            };
            (names(cells[0]), allowed)
        })
        .collect()
}

/// The top-level modules of the manager crate a file uses through `crate::` paths (including
/// `crate::{a, b}` groups).
fn crate_uses(source: &str) -> std::collections::BTreeSet<String> {
    let mut used = std::collections::BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in source.match_indices("crate::") {
        let rest = &source[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            used.extend(inner.split(',').map(|p| ident(p.trim())));
        } else {
            used.insert(ident(rest));
        }
    }
    used.retain(|m| !m.is_empty());
    used
}

/// Each manager folder's imports hold to the map in `docs/architecture.md`: the "never calls
/// back up" rules are checked on the code, not kept by convention.
#[test]
fn every_manager_folder_calls_only_what_the_map_allows() {
    let root = repo();
    let doc =
        std::fs::read_to_string(root.join("docs/architecture.md")).expect("the architecture doc");
    let table = may_call(&doc);
    let src = root.join("manager/src");
    let mut modules = Vec::new();
    for entry in std::fs::read_dir(&src).expect("manager/src").flatten() {
        let path = entry.path();
        let name = path
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if path.is_dir() || (name != "lib" && name != "main") {
            modules.push((name, path));
        }
    }
    let mut problems = Vec::new();
    for (module, path) in &modules {
        let Some((_, allowed)) = table.iter().find(|(names, _)| names.contains(module)) else {
            problems.push(format!(
                "manager/src/{module} is not in the may-call table of docs/architecture.md"
            ));
            continue;
        };
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(path, &mut files);
        } else {
            files.push(path.clone());
        }
        let Some(allowed) = allowed else { continue };
        for file in files {
            let source = std::fs::read_to_string(&file).unwrap_or_default();
            for used in crate_uses(&source) {
                if used != *module && !allowed.contains(&used) {
                    problems.push(format!(
                        "{} uses crate::{used}, which {module} may not call (docs/architecture.md)",
                        file.strip_prefix(&root).unwrap_or(&file).display()
                    ));
                }
            }
        }
    }
    for (names, _) in &table {
        for name in names {
            if !modules.iter().any(|(m, _)| m == name) {
                problems.push(format!(
                    "the may-call table names {name}, which is no folder or file of manager/src"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn crate_uses_reads_paths_and_groups() {
    let uses = crate_uses(
        "use crate::dispatch::x;\nuse crate::{key::ObjectKey, metrics};\nlet _ = crate::tenancy::Limits::default();",
    );
    let want: Vec<&str> = vec!["dispatch", "key", "metrics", "tenancy"];
    assert_eq!(uses.iter().map(String::as_str).collect::<Vec<_>>(), want);
}

/// `curl ARGS...` as a shell runs a documented line: its exit status and stdout.
async fn bash(script: &str) -> (bool, String, String) {
    let out = tokio::process::Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", script])
        .current_dir(repo())
        .output()
        .await
        .expect("bash runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// docs/devcluster.md's fault example, as written (PORT is the test's devcluster's): the next list
/// of configmaps answers 503 and the one after it 200; the same request without the content
/// type the page insists on injects nothing and is refused with 415, as it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devcluster_fault_endpoints_work_as_documented() {
    let blocks = ctrlhub_tests::readme::doc_blocks("docs/devcluster.md", "devcluster-faults");
    let [example] = blocks.as_slice() else {
        panic!("one block: {blocks:?}");
    };
    let c = ctrlhub_tests::start_cluster().await;
    let script = example.replace("PORT", &c.dc.addr().port().to_string());
    let (ok, out, err) = bash(&script).await;
    assert!(ok && out.is_empty(), "{script}\n{out}\n{err}");
    let path = "/api/v1/namespaces/default/configmaps";
    assert_eq!(c.raw.get(path).await.status, 503, "the injected failure");
    assert_eq!(c.raw.get(path).await.status, 200, "only the next one");

    let header = "-H 'Content-Type: application/json'";
    assert!(
        script.contains(header),
        "the example sends the content type"
    );
    // Without it nothing is injected: over HTTP/2 curl may not even show the 415 (the page
    // says so), but the next list is not failed.
    let (ok, out, err) = bash(&script.replace(header, "")).await;
    assert!(
        (!ok && err.contains("(92)")) || out.contains("Content-Type: application/json"),
        "curl without the content type: {out}\n{err}"
    );
    assert_eq!(c.raw.get(path).await.status, 200, "nothing was injected");
    let http1 = script.replace(header, "--http1.1 -s -o /dev/null -w '%{http_code}'");
    let (_, code, _) = bash(&http1).await;
    assert_eq!(code, "415");
}

/// The README is the front page: what ctrlhub is, the two commands, the contract, the matrix,
/// the SDKs and links. Whatever more it needs goes to a docs/ page it links to, so that each
/// map has one copy and the front page stays readable at once.
#[test]
fn the_readme_stays_a_front_page() {
    const MOST: usize = 300;
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= MOST,
        "README.md has {lines} lines, more than {MOST}: move the detail to a docs/ page and link it"
    );
    for command in ["cargo run -p ctrlhub -- dev", "bash tests/run.sh"] {
        assert!(
            readme.contains(&format!("```sh\n{command}\n```")),
            "the front page shows `{command}` as its own block"
        );
    }
}
