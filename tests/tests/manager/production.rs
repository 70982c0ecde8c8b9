//! Safe defaults, as an operator meets them with the built binaries: `--help` never shows a
//! secret set in the environment, static auth is refused off loopback unless asked for by name,
//! warned about when it runs and shown on the status page, and the namespace ceiling is logged
//! at start and shown in `/status`.

use ctrlhub_tests::*;
use std::process::Command;

const SECRET: &str = "s3cret-t0ken-value";

/// `binary ARGS` with the secret in every token variable: its output, which must not show it.
fn help_of(binary: &str, args: &[&str]) -> String {
    let out = Command::new(bin(binary))
        .args(args)
        .env("CTRLHUB_TOKEN", SECRET)
        .env("CTRLHUB_TOKEN_FILE", "/var/run/secrets/ctrlhub/token")
        .output()
        .expect("binary runs");
    assert!(out.status.success(), "{binary} {args:?}");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn help_never_prints_a_secret_from_the_environment() {
    for (binary, args) in [
        ("ctrlhub", &["run", "--help"][..]),
        ("ctrlhub", &["dev", "--help"][..]),
        ("ctrlhub", &["--help"][..]),
        ("memcached-controller", &["--help"][..]),
    ] {
        let help = help_of(binary, args);
        assert!(
            !help.contains(SECRET),
            "{binary} {args:?} shows the token:\n{help}"
        );
        if binary == "memcached-controller" {
            assert!(
                help.contains("CTRLHUB_TOKEN_FILE"),
                "the token file is documented:\n{help}"
            );
        }
    }
    // The variable is still named, so an operator knows it is read.
    assert!(help_of("ctrlhub", &["run", "--help"]).contains("[env: CTRLHUB_TOKEN]"));
}

#[test]
fn static_auth_on_every_interface_is_refused_without_the_explicit_flag() {
    let out = Command::new(bin("ctrlhub"))
        .arg("run")
        .env("KUBECONFIG", "/nonexistent")
        .env_remove("CTRLHUB_INSECURE_STATIC_AUTH")
        .env_remove("CTRLHUB_AUTH")
        .output()
        .expect("ctrlhub runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--auth static (the default) on --grpc-addr 0.0.0.0:9090")
            && stderr.contains("--insecure-static-auth"),
        "{stderr}"
    );
    // With the flag (here as its environment variable) the check passes and start-up goes on
    // to the kubeconfig, which does not exist.
    let out = Command::new(bin("ctrlhub"))
        .arg("run")
        .env("KUBECONFIG", "/nonexistent")
        .env("CTRLHUB_INSECURE_STATIC_AUTH", "true")
        .output()
        .expect("ctrlhub runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("--insecure-static-auth"), "{stderr}");
    assert!(stderr.contains("static token authentication"), "{stderr}");
}

#[tokio::test]
async fn static_auth_and_the_namespace_ceiling_are_shown_to_the_operator() {
    let c = start_cluster().await;
    let mut launch = Launch::for_tests();
    launch.env = vec![("CTRLHUB_LOG_FORMAT".into(), "json".into())];
    let m = Manager::launch(
        &c,
        "ceiling",
        &["--watch-namespace", "team-a,team-b"],
        &launch,
    )
    .await
    .expect("manager starts");
    let status = m.status().await;
    assert_eq!(status["auth"], "static", "{status}");
    assert_eq!(
        status["namespaceCeiling"],
        serde_json::json!(["team-a", "team-b"])
    );
    let page = m
        .get("/")
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    assert!(page.contains("id=\"static-auth\""), "a static-auth banner");
    assert!(
        page.contains("Namespace ceiling: <b>team-a, team-b</b>"),
        "the ceiling on the page"
    );
    // Both said once at start, as JSON lines.
    let log = std::fs::read_to_string(&m.log).expect("manager log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "WARN"
            && l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("static token authentication"))),
        "{log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["namespaces"] == "team-a,team-b"),
        "{log}"
    );
}

/// A denial says which grant is missing — a ClusterRole for all namespaces, a Role for one — and
/// when the cached decision is asked about again.
#[tokio::test]
async fn denials_name_the_missing_grant_and_when_they_are_re_checked() {
    let c = start_cluster().await;
    let args = [
        "--auth",
        "kubernetes",
        "--audience",
        "ctrlhub",
        "--authz-deny-ttl",
        "45s",
    ];
    let m = Manager::start(&c, "denials", &args).await;
    m.wait_leading().await;
    let auth = ctrlhub_tests::rbac::tenant(&c, "team-a", "ctl").await;
    let all = Replica::connect_with(
        &m.grpc,
        ctrlhub_tests::rbac::configmaps_in("everywhere", &[]),
        Some(&auth),
    )
    .await
    .err()
    .expect("all namespaces without a grant is refused");
    assert_eq!(all.code(), tonic::Code::PermissionDenied);
    let text = all.message();
    assert!(
        text.contains("in all namespaces")
            && text.contains("ClusterRole")
            && !text.contains("a Role"),
        "{text}"
    );
    assert!(text.contains("re-checked in 45s"), "{text}");
    let one = Replica::connect_with(
        &m.grpc,
        ctrlhub_tests::rbac::configmaps_in("here", &["team-a"]),
        Some(&auth),
    )
    .await
    .err()
    .expect("a namespace without a grant is refused");
    let text = one.message();
    assert!(
        text.contains("in namespace team-a") && text.contains("a Role granting list and watch"),
        "{text}"
    );
    assert!(text.contains("re-checked in 45s"), "{text}");
}

/// `memcached-controller --help` says an empty namespace list means all namespaces: so it must,
/// from the flag and from the environment alike.
#[tokio::test]
async fn memcached_with_an_empty_namespace_list_watches_all_namespaces() {
    let c = start_cluster().await;
    let m = Manager::start(&c, "empty-ns", &[]).await;
    m.wait_leading().await;
    for (flag, env) in [(Some(""), None), (None, Some(""))] {
        let mut cmd = tokio::process::Command::new(bin("memcached-controller"));
        cmd.args(["--manager", &m.grpc, "--token", "dev", "--install-crd"])
            .arg("--kubeconfig")
            .arg(&c.kubeconfig)
            .env_remove("WATCH_NAMESPACES")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Some(f) = flag {
            cmd.args(["--namespace", f]);
        }
        if let Some(e) = env {
            cmd.env("WATCH_NAMESPACES", e);
        }
        let mut controller = cmd.spawn().expect("memcached-controller starts");
        wait_for("memcached registers for all namespaces", || async {
            m.try_status().await.is_ok_and(|s| {
                s["controllers"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["name"] == "memcached" && c["sessions"] == 1)
                })
            })
        })
        .await;
        assert!(
            controller.try_wait().expect("status").is_none(),
            "still running (not refused) with {flag:?} / {env:?}"
        );
        let _ = controller.kill().await;
        // The controller stays (for --controller-grace) with no session.
        wait_for("the session ends", || async {
            m.try_status().await.is_ok_and(|s| {
                !s["controllers"].as_array().is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["name"] == "memcached" && c["sessions"] != 0)
                })
            })
        })
        .await;
    }
}
