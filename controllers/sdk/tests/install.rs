//! The README's install lines, verbatim, in a fresh crate outside the repository (`<ctrlhub>`
//! replaced by this clone), then its quick start as that crate's `src/main.rs`, built with
//! `cargo build` offline against the local registry cache, and run against devcluster and the
//! real manager: the labelled ConfigMap gets its annotation and its Event.
//!
//! Fast because it shares this workspace's target directory and profile: the new crate resolves
//! the same versions offline, so only `ctrlhub-proto`, `ctrlhub-otel`, `ctrlhub-sdk` (once per
//! change) and the crate itself are compiled. Cargo runs with the environment of the shell
//! that ran the tests, less what `cargo test` adds (a changed `CARGO_MANIFEST_DIR` alone would
//! make `ring`'s build script, and everything above it, build again).
#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use support::{Cluster, Manager, ManagerOptions, PATIENCE, Process, TOKEN, eventually, repo};

/// The fenced block of `lang` between `<!-- {marker}:begin -->` and `<!-- {marker}:end -->`.
fn readme_block(marker: &str, lang: &str) -> String {
    let readme = std::fs::read_to_string(repo("controllers/sdk/README.md")).unwrap();
    let begin = format!("<!-- {marker}:begin -->");
    let end = format!("<!-- {marker}:end -->");
    let start = readme.find(&begin).unwrap() + begin.len();
    let stop = readme[start..].find(&end).unwrap() + start;
    let section = readme[start..stop].trim();
    let fence = format!("```{lang}\n");
    section
        .strip_prefix(&fence)
        .and_then(|s| s.strip_suffix("```"))
        .unwrap_or_else(|| panic!("{marker}: one ```{lang} block"))
        .to_owned()
}

/// A temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `command` with the environment of the shell that ran `cargo test` (less the variables
/// `cargo test` sets for a test), offline, into this workspace's target directory.
fn cargo_env(command: &mut Command, target: &Path) {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let set_by_cargo_test = matches!(
            key.as_str(),
            "CARGO"
                | "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "OUT_DIR"
        ) || key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_EXE_");
        if set_by_cargo_test {
            command.env_remove(key);
        }
    }
    // It also puts the target directory in front of the library path.
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        let kept: Vec<PathBuf> = std::env::split_paths(&paths)
            .filter(|p| !p.starts_with(target))
            .collect();
        command.env("LD_LIBRARY_PATH", std::env::join_paths(kept).unwrap());
    }
    command
        .env("CARGO_NET_OFFLINE", "true")
        .env("CARGO_INCREMENTAL", "0")
        .env("CARGO_TARGET_DIR", target);
}

/// The workspace's dev profile as a cargo config for crates outside it (so that they reuse
/// its artifacts): its `[profile.dev*]` sections, and `[profile.dev]`'s settings for the SDK's
/// own crates, which are workspace members here and path dependencies there.
fn workspace_profile() -> String {
    let manifest = std::fs::read_to_string(repo("Cargo.toml")).unwrap();
    let mut sections = String::new();
    let mut dev = String::new();
    let mut current: Option<String> = None;
    for line in manifest.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            current = trimmed
                .starts_with("[profile.dev")
                .then(|| trimmed.to_owned());
        }
        if let Some(section) = &current {
            sections.push_str(line);
            sections.push('\n');
            if section == "[profile.dev]" && !trimmed.starts_with('[') && !trimmed.starts_with('#')
            {
                dev.push_str(line);
                dev.push('\n');
            }
        }
    }
    for member in ["ctrlhub-sdk", "ctrlhub-proto", "ctrlhub-otel"] {
        sections.push_str(&format!(
            "[profile.dev.package.{member}]\nopt-level = 0\n{dev}"
        ));
    }
    sections
}

#[tokio::test]
async fn the_readme_install_and_quick_start_work_as_written() {
    let target = support::target_dir().canonicalize().unwrap();
    let clone = repo("").canonicalize().unwrap();
    let root =
        TempDir(std::env::temp_dir().join(format!("ctrlhub-sdk-install-{}", std::process::id())));
    std::fs::create_dir_all(root.0.join(".cargo")).unwrap();
    std::fs::write(root.0.join(".cargo/config.toml"), workspace_profile()).unwrap();

    let install = readme_block("rust-install", "sh").replace("<ctrlhub>", clone.to_str().unwrap());
    println!("$ {}", install.replace('\n', "\n$ "));
    let started = Instant::now();
    let mut sh = Command::new("bash");
    sh.args(["-euo", "pipefail", "-c", &install])
        .current_dir(&root.0);
    cargo_env(&mut sh, &target);
    let out = sh.output().unwrap();
    assert!(
        out.status.success(),
        "the install lines failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let project = root.0.join("my-controller");
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("ctrlhub-sdk"), "{manifest}");

    std::fs::write(
        project.join("src/main.rs"),
        readme_block("rust-quickstart", "rust"),
    )
    .unwrap();
    let mut build = Command::new("cargo");
    build.arg("build").current_dir(&project);
    cargo_env(&mut build, &target);
    let out = build.output().unwrap();
    assert!(
        out.status.success(),
        "cargo build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "installed and built in {:?}:\n{}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );

    // Run as the README says, against devcluster and the real manager.
    let cluster = Cluster::start("install").await;
    let manager = Manager::start(&cluster, ManagerOptions::default()).await;
    let log = cluster.dir.join("my-controller.log");
    let child = Command::new(target.join("debug/my-controller"))
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("CTRLHUB_ADDR", format!("127.0.0.1:{}", manager.grpc_port))
        .env("CTRLHUB_TOKEN", TOKEN)
        .env_remove("CTRLHUB_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut controller = Process { child, log };
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let demo: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "demo", "labels": {"example.com/stamp": "yes"}},
        "data": {"a": "b"},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &demo).await.unwrap();
    let stamped = eventually("the annotation", PATIENCE, || async {
        let cm = cms.get("demo").await.ok()?;
        cm.metadata
            .annotations?
            .get("example.com/stamped-by")
            .cloned()
    })
    .await;
    assert_eq!(stamped, "stamper", "{}", controller.tail(20));
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), "default");
    eventually("the Stamped event", PATIENCE, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("Stamped"))
            .then_some(())
    })
    .await;
    controller.signal("TERM");
    let status = controller.exited(Duration::from_secs(30)).await;
    assert!(status.success(), "{status}: {}", controller.tail(20));
    let logged = std::fs::read_to_string(&controller.log).unwrap();
    assert!(
        logged.contains("reconcile end key=default/demo outcome=success"),
        "{logged}"
    );
}
