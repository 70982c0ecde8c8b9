//! The SDK conformance matrix: every SDK of `tests/conformance/sdks.json` runs its conformance
//! controller as a real process against real managers and a real devcluster, through the same
//! table of checks (tests/conformance/README.md). Each SDK's results go to
//! `target/conformance/<sdk>.json`; after a run of every SDK, README.md's matrix must match
//! them. `CONFORMANCE_SDKS=rust,python-raw` runs only those columns; `CONFORMANCE_ROWS=ring-move`
//! only the scenarios deciding those rows (then README.md is not compared).

use ctrlhub::members::hrw::{Member, Unit, owner};
use ctrlhub_tests::conformance::checks::ROWS;
use ctrlhub_tests::conformance::matrix::{
    SdkResults, read_text, readme_path, render, section, write_results,
};
use ctrlhub_tests::conformance::run::run_sdk;
use ctrlhub_tests::conformance::sdk::{Sdk, load_table, table_path};
use ctrlhub_tests::init_tracing;

/// The manager's own placement of a controller on ring members (ring `ctrlhub`, every weight
/// 100, as the ring rows run them), for the harness, which does not link the manager.
fn ring_owner(group: &str, name: &str, members: &[String]) -> Option<String> {
    let members: Vec<Member> = members
        .iter()
        .map(|identity| Member {
            identity: identity.clone(),
            weight: 100,
        })
        .collect();
    owner("ctrlhub", &Unit::new(group, name), &members).map(|m| m.identity.clone())
}

/// The row ids of `CONFORMANCE_ROWS` (empty: every row).
fn chosen_rows() -> Vec<String> {
    let wanted = std::env::var("CONFORMANCE_ROWS").unwrap_or_default();
    let wanted: Vec<String> = wanted
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    for w in &wanted {
        assert!(
            ROWS.iter().any(|r| r.id == w),
            "CONFORMANCE_ROWS names {w:?}, which is not a row id of the matrix"
        );
    }
    wanted
}

/// The SDKs chosen by `CONFORMANCE_SDKS` (all of the table when unset).
fn chosen(table: &[Sdk]) -> Vec<Sdk> {
    let wanted = std::env::var("CONFORMANCE_SDKS").unwrap_or_default();
    let wanted: Vec<&str> = wanted
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for w in &wanted {
        assert!(
            table.iter().any(|s| s.name == *w),
            "CONFORMANCE_SDKS names {w:?}, which tests/conformance/sdks.json does not list"
        );
    }
    table
        .iter()
        .filter(|s| wanted.is_empty() || wanted.contains(&s.name.as_str()))
        .cloned()
        .collect()
}

fn summary(r: &SdkResults) -> String {
    let red: Vec<String> = r
        .red()
        .map(|row| format!("  ❌ {}: {}", row.row, row.message.as_deref().unwrap_or("")))
        .collect();
    format!(
        "{}: {} of {} rows pass in {:.0} s{}{}",
        r.sdk.name,
        r.rows.len() - red.len(),
        r.rows.len(),
        r.seconds,
        if red.is_empty() { "" } else { "\n" },
        red.join("\n")
    )
}

/// After a run of every SDK: README.md's matrix must be what this run produced.
fn readme_drift(table: &[Sdk], results: &[SdkResults]) -> Option<String> {
    let by_table: Vec<Option<SdkResults>> = table
        .iter()
        .map(|s| results.iter().find(|r| r.sdk.name == s.name).cloned())
        .collect();
    let want = render(table, &by_table);
    let readme = match read_text(&readme_path()) {
        Ok(t) => t,
        Err(e) => return Some(e.to_string()),
    };
    match section(&readme) {
        Ok(have) if have == want.trim_matches('\n') => None,
        Ok(have) => Some(format!(
            "README.md's conformance matrix differs from this run's results; run \
             `cargo run -p ctrlhub-tests --bin conformance-matrix` and commit README.md.\n\
             README has:\n{have}\nthis run:\n{want}"
        )),
        Err(e) => Some(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_matrix() {
    init_tracing();
    let table = load_table(&table_path()).unwrap_or_else(|e| panic!("{e}"));
    let sdks = chosen(&table);
    let rows = chosen_rows();
    let mut results = Vec::new();
    for sdk in &sdks {
        let r = run_sdk(sdk, ring_owner, &rows).await;
        write_results(&r).unwrap_or_else(|e| panic!("{e}"));
        println!("{}", summary(&r));
        results.push(r);
    }
    let drift = (sdks.len() == table.len() && rows.is_empty())
        .then(|| readme_drift(&table, &results))
        .flatten();
    let red: Vec<String> = results
        .iter()
        .filter(|r| r.red().next().is_some())
        .map(summary)
        .collect();
    assert!(
        red.is_empty() && drift.is_none(),
        "{}{}",
        red.join("\n"),
        drift.map_or(String::new(), |d| format!("\n{d}"))
    );
}
