//! `ctrlhub dev`, the README's main command, run as a user would (the real binary).

use ctrlhub_tests::{PATIENCE, bin, free_port};
use std::process::Stdio;
use std::time::Duration;

/// devcluster, manager and memcached controller come up, the sample gets its Deployment and an
/// Available condition, and everything shuts down cleanly.
/// How long the whole `ctrlhub dev` run may take: twice [`PATIENCE`], because it waits on a
/// chain of conditions (devcluster, the manager, the controller, the sample Available) in turn.
const DEV_RUN_PATIENCE: Duration = PATIENCE.saturating_mul(2);

#[tokio::test]
async fn ctrlhub_dev_reconciles_the_sample_and_exits_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let grpc = format!("127.0.0.1:{}", free_port());
    let out = run_dev(&grpc, &dir.path().join("state")).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ctrlhub dev failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("devcluster ready at https://127.0.0.1:"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Available=True"),
        "the sample reports Available:\n{stdout}"
    );
    assert!(
        stdout.contains("spec.replicas=3"),
        "the Deployment is sized to spec.size:\n{stdout}"
    );
    assert!(
        stdout.contains("kubectl --kubeconfig"),
        "it tells the user where to look next:\n{stdout}"
    );
    // Every SDK reads the same two variables, so the hint names them all, not one.
    assert!(
        stdout.contains("every SDK (Rust, Python, TypeScript) reads CTRLHUB_ADDR=http://")
            && stdout.contains("CTRLHUB_TOKEN=dev"),
        "it prints what any SDK needs to connect:\n{stdout}"
    );
    assert!(
        stderr.contains("reconcile start key=default/memcached-sample"),
        "reconciles are shown:\n{stderr}"
    );
    assert!(
        dir.path().join("state/kubeconfig").exists(),
        "the kubeconfig for kubectl is written"
    );
}

/// A gRPC port already in use stops `ctrlhub dev` with an error naming that port and the flag
/// that changes it, not the HTTP address it was polling.
#[tokio::test]
async fn ctrlhub_dev_names_the_port_in_use() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to occupy");
    let grpc = taken.local_addr().expect("its address");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run_dev(&grpc.to_string(), &dir.path().join("state")).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ctrlhub dev exited 0:\n{stderr}");
    assert!(
        stderr.contains(&format!("binding gRPC {grpc}")) && stderr.contains("--grpc-addr"),
        "the error names the port in use and the flag:\n{stderr}"
    );
    drop(taken);
}

/// Runs `ctrlhub dev --exit-when-ready` as the README does, with its gRPC port at `grpc`, an
/// HTTP port of its own and its state in `state`, to the end.
async fn run_dev(grpc: &str, state: &std::path::Path) -> std::process::Output {
    let child = tokio::process::Command::new(bin("ctrlhub"))
        .arg("dev")
        .args(["--grpc-addr", grpc])
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .arg("--state-dir")
        .arg(state)
        .arg("--exit-when-ready")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("ctrlhub dev starts");
    tokio::time::timeout(DEV_RUN_PATIENCE, child.wait_with_output())
        .await
        .expect("ctrlhub dev finishes")
        .expect("output")
}
