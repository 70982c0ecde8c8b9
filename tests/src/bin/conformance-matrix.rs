//! `conformance-matrix`: rewrites README.md's SDK conformance matrix (between its
//! `conformance-matrix` markers) from the results of the last run, `target/conformance/<sdk>.json`
//! for every SDK of `tests/conformance/sdks.json`. `--check` only says whether it would change.

use anyhow::{Context as _, Result, bail};
use ctrlhub_tests::conformance::matrix::{
    read_results, read_text, readme_path, render, replace_section, results_path,
};
use ctrlhub_tests::conformance::sdk::{load_table, table_path};

fn main() -> Result<()> {
    let check = std::env::args().skip(1).any(|a| a == "--check");
    let table = load_table(&table_path())?;
    let mut results = Vec::with_capacity(table.len());
    for sdk in &table {
        let r = read_results(&sdk.name)?;
        if r.is_none() {
            eprintln!(
                "conformance-matrix: no results for {} ({} is missing): its column shows \"not run\"",
                sdk.name,
                results_path(&sdk.name).display()
            );
        }
        results.push(r);
    }
    let path = readme_path();
    let readme = read_text(&path)?;
    let updated = replace_section(&readme, &render(&table, &results))?;
    if updated == readme {
        println!("{} is up to date", path.display());
        return Ok(());
    }
    if check {
        bail!("{} is out of date: run without --check", path.display());
    }
    std::fs::write(&path, updated).with_context(|| format!("writing {}", path.display()))?;
    println!("rewrote the conformance matrix in {}", path.display());
    Ok(())
}
