//! Build facts for `ctrlhub_build_info` and `service.version`: the commit (`CTRLHUB_COMMIT`
//! from the environment, as an image build passes it, else `git rev-parse HEAD`, else
//! `unknown`) and the compiler version (`rustc --version` of the compiler cargo uses).
//!
//! Not `CTRLHUB_REVISION`: that is the SDKs' rollout revision (an integer), and `cargo run`
//! puts a build script's `rustc-env` variables into the environment of the program it runs,
//! where `ctrlhub dev`'s demo controller would read a commit hash as its revision.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CTRLHUB_COMMIT");
    let revision = std::env::var("CTRLHUB_COMMIT")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .or_else(git_revision)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=CTRLHUB_COMMIT={}", revision.trim());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = output(Command::new(rustc).arg("--version"))
        // "rustc 1.89.0 (29483883e 2025-08-04)" → "1.89.0"
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=CTRLHUB_RUSTC_VERSION={version}");
}

/// The checked-out commit, and a rebuild when it moves (HEAD, or the branch HEAD points to).
fn git_revision() -> Option<String> {
    let revision = output(Command::new("git").args(["rev-parse", "HEAD"]))?;
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = output(Command::new("git").args(["rev-parse", "--git-path", path])) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(branch) = output(Command::new("git").args(["symbolic-ref", "-q", "HEAD"]))
        && let Some(p) = output(Command::new("git").args(["rev-parse", "--git-path", &branch]))
    {
        println!("cargo:rerun-if-changed={p}");
    }
    Some(revision)
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}
