//! Results and the matrix. Each SDK's run is written to `target/conformance/<sdk>.json`; the
//! README's table (between [`BEGIN`] and [`END`]) is rendered from those files only. Cells say
//! pass, fail or not run, never timings or messages, so the table changes exactly when a
//! guarantee starts or stops holding.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::checks::ROWS;
use super::sdk::{Sdk, repo_root};
use crate::process::target_dir;

/// Opens the generated section of README.md.
pub const BEGIN: &str = "<!-- conformance-matrix:begin -->";
/// Closes the generated section of README.md.
pub const END: &str = "<!-- conformance-matrix:end -->";

/// One row's outcome for one SDK.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RowResult {
    /// The row id (see [`ROWS`]).
    pub row: String,
    /// Whether the guarantee held.
    pub passed: bool,
    /// `violation`, `timed_out` or `setup` when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Why it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How long the scenario deciding it took.
    pub seconds: f64,
}

/// One SDK's run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SdkResults {
    /// The SDK as the table described it.
    pub sdk: Sdk,
    /// Wall-clock seconds of the whole run (set-up included).
    pub seconds: f64,
    /// Every row, in matrix order.
    pub rows: Vec<RowResult>,
}

impl SdkResults {
    /// The rows that did not pass.
    pub fn red(&self) -> impl Iterator<Item = &RowResult> {
        self.rows.iter().filter(|r| !r.passed)
    }
}

/// The results or README could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A results file is not valid JSON of the expected shape.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// README.md lacks the markers (or has them out of order).
    #[error("README.md must contain {BEGIN} followed by {END}")]
    NoMarkers,
}

/// `target/conformance/<sdk>.json`.
pub fn results_path(sdk: &str) -> PathBuf {
    target_dir().join("conformance").join(format!("{sdk}.json"))
}

/// The repository's README.md.
pub fn readme_path() -> PathBuf {
    repo_root().join("README.md")
}

/// Writes one SDK's results file.
pub fn write_results(results: &SdkResults) -> Result<(), MatrixError> {
    let path = results_path(&results.sdk.name);
    let io = |source| MatrixError::Io {
        path: path.clone(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let json = serde_json::to_string_pretty(results).map_err(|source| MatrixError::Json {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, json + "\n").map_err(io)
}

/// Reads one SDK's results file; None when it has not run yet.
pub fn read_results(sdk: &str) -> Result<Option<SdkResults>, MatrixError> {
    let path = results_path(sdk);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| MatrixError::Json { path, source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(MatrixError::Io { path, source }),
    }
}

/// The generated section: a row per guarantee, a column per SDK of the table (in its order).
pub fn render(sdks: &[Sdk], results: &[Option<SdkResults>]) -> String {
    let mut out = String::from("| guarantee |");
    for sdk in sdks {
        let _ = write!(out, " `{}` |", sdk.name);
    }
    out.push_str("\n| --- |");
    out.push_str(&" :---: |".repeat(sdks.len()));
    out.push('\n');
    for row in ROWS {
        let _ = write!(out, "| {} |", row.guarantee);
        for r in results {
            let cell = r
                .as_ref()
                .and_then(|r| r.rows.iter().find(|x| x.row == row.id))
                .map_or("—", |x| if x.passed { "✅" } else { "❌" });
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out.push('\n');
    for sdk in sdks {
        let _ = writeln!(out, "- `{}`: {}", sdk.name, sdk.title);
    }
    out.push_str(
        "\n✅ holds · ❌ does not hold (the reason is in `target/conformance/<sdk>.json` and the \
         test's output) · — not run\n",
    );
    out
}

/// The text between the markers of `readme`.
pub fn section(readme: &str) -> Result<&str, MatrixError> {
    let start = readme.find(BEGIN).ok_or(MatrixError::NoMarkers)? + BEGIN.len();
    let len = readme[start..].find(END).ok_or(MatrixError::NoMarkers)?;
    Ok(readme[start..start + len].trim_matches('\n'))
}

/// `readme` with the text between the markers replaced by `table`.
pub fn replace_section(readme: &str, table: &str) -> Result<String, MatrixError> {
    let start = readme.find(BEGIN).ok_or(MatrixError::NoMarkers)? + BEGIN.len();
    let end = start + readme[start..].find(END).ok_or(MatrixError::NoMarkers)?;
    Ok(format!(
        "{}\n{}\n{}",
        &readme[..start],
        table.trim_matches('\n'),
        &readme[end..]
    ))
}

/// Reads a file as text.
pub fn read_text(path: &Path) -> Result<String, MatrixError> {
    std::fs::read_to_string(path).map_err(|source| MatrixError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdk(name: &str) -> Sdk {
        Sdk {
            name: name.into(),
            title: format!("the {name} SDK"),
            command: vec!["x".into()],
            prepare: None,
            follows_redirects: true,
        }
    }

    #[test]
    fn renders_pass_fail_and_not_run() {
        let results = SdkResults {
            sdk: sdk("a"),
            seconds: 1.0,
            rows: vec![
                RowResult {
                    row: "exclusive".into(),
                    passed: true,
                    kind: None,
                    message: None,
                    seconds: 1.0,
                },
                RowResult {
                    row: "backoff".into(),
                    passed: false,
                    kind: Some("violation".into()),
                    message: Some("too early".into()),
                    seconds: 1.0,
                },
            ],
        };
        let table = render(&[sdk("a"), sdk("b")], &[Some(results), None]);
        assert!(table.starts_with("| guarantee | `a` | `b` |\n| --- | :---: | :---: |\n"));
        assert!(table.contains("| exclusive keys across replicas | ✅ | — |"));
        assert!(table.contains("| backoff | ❌ | — |"));
        assert!(table.contains("| requeue-after | — | — |"));
        assert!(table.contains("- `b`: the b SDK"));
        assert!(
            !table.contains("too early"),
            "messages stay out of the README"
        );
    }

    #[test]
    fn replaces_only_between_the_markers() -> Result<(), MatrixError> {
        let readme = format!("intro\n{BEGIN}\nold\n{END}\nrest\n");
        let new = replace_section(&readme, "| new |\n")?;
        assert_eq!(new, format!("intro\n{BEGIN}\n| new |\n{END}\nrest\n"));
        assert_eq!(section(&new)?, "| new |");
        assert!(matches!(section("no markers"), Err(MatrixError::NoMarkers)));
        Ok(())
    }
}
