//! The SDK table, `tests/conformance/sdks.json`: one entry per column of the matrix, each with
//! the command line that starts its conformance controller. Adding an SDK is adding an entry;
//! the harness does not change.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::process::target_dir;

/// One SDK of the table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sdk {
    /// The column name, e.g. `rust`; also names its results file and log directory.
    pub name: String,
    /// What the column is, in a few words.
    pub title: String,
    /// The conformance controller's argv; `{target}` is the cargo target directory, relative
    /// paths are relative to the repository root (the working directory).
    pub command: Vec<String>,
    /// An argv run once before the checks (generating stubs, installing packages), if needed.
    #[serde(default)]
    pub prepare: Option<Vec<String>>,
    /// Whether the controller follows a ring member's redirect (README section 5, rule 12);
    /// `false` for a raw client that does not, which the ring rows then reach through a
    /// Service spreading its connections over the members instead.
    #[serde(default = "yes")]
    pub follows_redirects: bool,
}

fn yes() -> bool {
    true
}

/// The table as stored.
#[derive(Debug, Clone, Deserialize)]
struct Table {
    sdks: Vec<Sdk>,
}

/// The SDK table could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid table.
    #[error("{path} is not a valid SDK table: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// An entry is unusable (empty command, a name that cannot be a file name, a duplicate).
    #[error("{path}: {why}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// The repository root (the conformance controllers' working directory).
pub fn repo_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// Where the table lives.
pub fn table_path() -> PathBuf {
    repo_root().join("tests/conformance/sdks.json")
}

/// Every SDK of the table, in column order.
pub fn load_table(path: &Path) -> Result<Vec<Sdk>, TableError> {
    let text = std::fs::read_to_string(path).map_err(|source| TableError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let table: Table = serde_json::from_str(&text).map_err(|source| TableError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |why: String| TableError::Invalid {
        path: path.to_path_buf(),
        why,
    };
    let mut seen = std::collections::HashSet::new();
    for sdk in &table.sdks {
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if sdk.name.is_empty() || !sdk.name.chars().all(plain) {
            return Err(invalid(format!(
                "SDK name {:?} must be [A-Za-z0-9_-]+",
                sdk.name
            )));
        }
        if !seen.insert(sdk.name.clone()) {
            return Err(invalid(format!("SDK {:?} is listed twice", sdk.name)));
        }
        if sdk.command.is_empty() {
            return Err(invalid(format!("SDK {:?} has an empty command", sdk.name)));
        }
    }
    Ok(table.sdks)
}

impl Sdk {
    /// `argv` with `{target}` expanded.
    pub fn expand(argv: &[String]) -> Vec<String> {
        let target = target_dir();
        let target = target.to_string_lossy();
        argv.iter()
            .map(|a| a.replace("{target}", &target))
            .collect()
    }

    /// The controller's command, ready to spawn (program, arguments).
    pub fn command(&self) -> (String, Vec<String>) {
        let mut argv = Self::expand(&self.command);
        let program = argv.remove(0);
        (program, argv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_table_loads() -> Result<(), TableError> {
        let sdks = load_table(&table_path())?;
        assert!(sdks.iter().any(|s| s.name == "rust"));
        assert!(sdks.iter().any(|s| s.name == "python-raw"));
        Ok(())
    }

    #[test]
    fn duplicates_and_bad_names_are_refused() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sdks.json");
        let entry = r#"{"name":"x","title":"t","command":["a"]}"#;
        std::fs::write(&path, format!(r#"{{"sdks":[{entry},{entry}]}}"#))?;
        assert!(matches!(load_table(&path), Err(TableError::Invalid { .. })));
        std::fs::write(
            &path,
            r#"{"sdks":[{"name":"a/b","title":"t","command":["a"]}]}"#,
        )?;
        assert!(matches!(load_table(&path), Err(TableError::Invalid { .. })));
        Ok(())
    }
}
