//! deploy/: every overlay renders with kubectl's kustomize and applies cleanly with kubectl to
//! devcluster, creating the manager's Deployment and the leader-selecting Service.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use support::*;

fn kubectl(
    cluster: &Cluster,
    cache: &std::path::Path,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> String {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(args);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl runs");
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input).expect("stdin written");
    }
    let out = child.wait_with_output().expect("kubectl finishes");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// kubectl runs as a blocking child process; devcluster keeps serving on the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_overlays_apply_with_kubectl() {
    let c = cluster().await;
    namespace(&c.client, "team-a", &[]).await;
    namespace(&c.client, "team-b", &[]).await;
    let cache = tempfile::tempdir().expect("cache dir");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for overlay in ["cluster-wide", "namespaced"] {
        let dir = repo.join("deploy/overlays").join(overlay);
        let rendered = kubectl(
            &c,
            cache.path(),
            &["kustomize", &dir.to_string_lossy()],
            None,
        );
        let applied = kubectl(
            &c,
            cache.path(),
            &["apply", "-f", "-"],
            Some(rendered.as_bytes()),
        );
        assert!(
            applied.contains("deployment.apps/ctrlhub"),
            "{overlay}: {applied}"
        );
        let deployment: serde_json::Value = serde_json::from_str(&kubectl(
            &c,
            cache.path(),
            &[
                "get",
                "deployment",
                "ctrlhub",
                "-n",
                "ctrlhub-system",
                "-o",
                "json",
            ],
            None,
        ))
        .expect("json");
        assert_eq!(
            deployment["spec"]["replicas"], 2,
            "{overlay}: a leader and a standby"
        );
        let selector = kubectl(
            &c,
            cache.path(),
            &[
                "get",
                "service",
                "ctrlhub",
                "-n",
                "ctrlhub-system",
                "-o",
                "jsonpath={.spec.selector}",
            ],
            None,
        );
        assert!(
            selector.contains(r#""ctrlhub.io/leader":"true""#),
            "{overlay}: the controllers' Service selects the leader: {selector}"
        );
    }
    let bindings = kubectl(
        &c,
        cache.path(),
        &[
            "get",
            "rolebinding",
            "ctrlhub-reader",
            "-n",
            "team-b",
            "-o",
            "name",
        ],
        None,
    );
    assert_eq!(
        bindings.trim(),
        "rolebinding.rbac.authorization.k8s.io/ctrlhub-reader"
    );
}
