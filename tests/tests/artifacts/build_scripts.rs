//! Build scripts' environment: `cargo run` and `cargo test` put every `cargo:rustc-env` variable
//! of a build script into the environment of the program they run, so a name a controller reads
//! at run time must never be one (the manager's build script once exported the commit as
//! `CTRLHUB_REVISION`, which `ctrlhub dev`'s demo controller then read as its rollout revision:
//! the README's first command never reconciled).

use ctrlhub_tests::readme::repo;
use std::path::{Path, PathBuf};

/// Every `build.rs` of the workspace (outside target/ and dependencies).
fn build_scripts(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() && !name.starts_with('.') && name != "target" && name != "node_modules" {
            build_scripts(&path, found);
        } else if name == "build.rs" {
            found.push(path);
        }
    }
}

/// The names a build script exports with `cargo:rustc-env=NAME=...`.
fn exported(script: &str) -> Vec<String> {
    script
        .match_indices("cargo:rustc-env=")
        .filter_map(|(at, m)| {
            let rest = &script[at + m.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// Every file under `dir` with one of `extensions`, as text.
fn sources(dir: &Path, extensions: &[&str], out: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, extensions, out);
        } else if path
            .extension()
            .is_some_and(|e| extensions.iter().any(|x| e == *x))
            && let Ok(text) = std::fs::read_to_string(&path)
        {
            out.push((path, text));
        }
    }
}

#[test]
fn no_build_script_exports_a_variable_a_controller_reads() {
    let root = repo();
    let mut scripts = Vec::new();
    build_scripts(&root, &mut scripts);
    assert!(
        scripts.iter().any(|s| s.ends_with("manager/build.rs")),
        "the manager's build script is found: {scripts:?}"
    );
    // What controllers read at run time: the three SDKs, the demo controller and the
    // conformance interface, which names every variable a conformance controller honours.
    let mut readers = Vec::new();
    for dir in [
        "controllers/sdk/src",
        "controllers/python-sdk/src",
        "controllers/typescript-sdk/src",
        "controllers/memcached/src",
        "tests/src/conformance",
    ] {
        sources(&root.join(dir), &["rs", "py", "ts"], &mut readers);
    }
    assert!(readers.len() > 20, "the SDK sources are read");
    for script in &scripts {
        let text = std::fs::read_to_string(script).expect("build script");
        for name in exported(&text) {
            let quoted = format!("\"{name}\"");
            let readers: Vec<_> = readers
                .iter()
                .filter(|(_, src)| src.contains(&quoted))
                .map(|(p, _)| p.display().to_string())
                .collect();
            assert!(
                readers.is_empty(),
                "{} exports {name} to programs `cargo run` starts, and controllers read it: {readers:?}",
                script.display()
            );
        }
    }
}

#[test]
fn exported_names_are_read_from_rustc_env_lines() {
    let script =
        r#"println!("cargo:rustc-env=CTRLHUB_COMMIT={}", r); println!("cargo:rustc-env=X_1=2");"#;
    assert_eq!(exported(script), ["CTRLHUB_COMMIT", "X_1"]);
}
