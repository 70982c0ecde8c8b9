//! Leader failover with a real controller process: the leader manager is SIGKILLed, the standby
//! takes the Lease, the memcached controller (SDK) reconnects and reconciliation resumes with no
//! key lost. A tiny TCP proxy plays the Service that selects the leader pod.

use ctrlhub_tests::*;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

/// Forward each new connection to whichever manager currently leads.
async fn leader_proxy(managers: Arc<Vec<(String, String)>>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("proxy binds");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            let managers = managers.clone();
            tokio::spawn(async move {
                for (http, grpc) in managers.iter() {
                    if is_leading(http).await {
                        let addr = grpc.trim_start_matches("http://").to_string();
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(addr).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                        return;
                    }
                }
                // No leader right now: closing makes the SDK back off and retry, as with a
                // Service without ready endpoints.
            });
        }
    });
    port
}

fn memcached_api(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "cache.example.com".into(),
        version: "v1alpha1".into(),
        api_version: "cache.example.com/v1alpha1".into(),
        kind: "Memcached".into(),
        plural: "memcacheds".into(),
    };
    Api::namespaced_with(client.clone(), "default", &ar)
}

async fn apply_memcached(api: &Api<DynamicObject>, name: &str, size: u32) {
    let obj = serde_json::json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": name, "namespace": "default"}, "spec": {"size": size}});
    api.patch(
        name,
        &PatchParams::apply("tests").force(),
        &Patch::Apply(obj),
    )
    .await
    .expect("memcached applied");
}

/// Every listed Memcached has observed its current generation and its Deployment has `size` replicas.
async fn all_reconciled(client: &kube::Client, names: &[String], size: i32) -> bool {
    let api = memcached_api(client);
    let deps: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "default");
    for name in names {
        let Ok(obj) = api.get(name).await else {
            return false;
        };
        let generation = obj.metadata.generation.unwrap_or(-1);
        if obj
            .data
            .pointer("/status/observedGeneration")
            .and_then(|g| g.as_i64())
            != Some(generation)
        {
            return false;
        }
        let Ok(d) = deps.get(name).await else {
            return false;
        };
        if d.spec.and_then(|s| s.replicas) != Some(size) {
            return false;
        }
    }
    true
}

#[tokio::test]
async fn leader_kill_hands_over_and_reconcile_resumes() {
    let c = start_cluster().await;
    let timing = FAST_LEASE;
    let mut m1 = Manager::start(&c, "fo-a", &timing).await;
    m1.wait_leading().await;
    let m2 = Manager::start(&c, "fo-b", &timing).await;
    let proxy = leader_proxy(Arc::new(vec![
        (m1.http.clone(), m1.grpc.clone()),
        (m2.http.clone(), m2.grpc.clone()),
    ]))
    .await;

    let log = std::env::temp_dir().join(format!("memcached-failover-{proxy}.log"));
    println!("memcached controller logs to {}", log.display());
    let _controller = tokio::process::Command::new(bin("memcached-controller"))
        .args([
            "--manager",
            &format!("http://127.0.0.1:{proxy}"),
            "--token",
            "dev",
            "--install-crd",
        ])
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .stdout(Stdio::null())
        // The controller logs to stderr.
        .stderr(
            std::fs::File::create(&log)
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .kill_on_drop(true)
        .spawn()
        .expect("controller starts");

    let api = memcached_api(&c.client);
    wait_for("the controller installed its CRD", || async {
        api.list(&Default::default()).await.is_ok()
    })
    .await;
    let mut names: Vec<String> = (0..5).map(|i| format!("mc-{i}")).collect();
    for n in &names {
        apply_memcached(&api, n, 1).await;
    }
    wait_for("first leader reconciles all", || {
        all_reconciled(&c.client, &names, 1)
    })
    .await;

    m1.kill().await;
    // Changes made while there is no leader must not be lost.
    for n in &names {
        apply_memcached(&api, n, 2).await;
    }
    names.push("mc-new".into());
    apply_memcached(&api, "mc-new", 2).await;
    m2.wait_leading().await;
    wait_for(
        "the new leader reconciles every change made around the handover",
        || all_reconciled(&c.client, &names, 2),
    )
    .await;
}

/// The Lease holder as the API server has it.
async fn lease_holder(client: &kube::Client) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "default");
    leases
        .get_opt("ctrlhub-leader")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

/// A leader whose dispatch runtime stalls (every worker thread blocked, as by a loop that never
/// yields) gives up its Lease: the election thread, which keeps running, stops renewing once
/// the runtime's heartbeat is older than half the renew deadline, so the standby takes over
/// while the old leader is still stalled; once it runs again it is a standby.
#[tokio::test]
async fn a_stalled_leader_gives_up_its_lease() {
    let c = start_cluster().await;
    let mut args: Vec<&str> = FAST_LEASE.to_vec();
    args.extend(["--dev-stall-on-sigusr1", "20s"]);
    let m1 = Manager::start(&c, "stall-a", &args).await;
    m1.wait_leading().await;
    let m2 = Manager::start(&c, "stall-b", &FAST_LEASE).await;
    let stalled_at = std::time::Instant::now();
    m1.signal("USR1");
    // Without the watchdog the election thread renews for the stalled leader and stall-b
    // never leads while the stall lasts (20 s).
    let holder = poll_until(
        "stall-b holds the Lease",
        Duration::from_secs(20),
        || async {
            match lease_holder(&c.client).await {
                Some(h) if h == "stall-b" => Ok(h),
                other => Err(format!("holder {other:?}")),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(holder, "stall-b");
    assert!(
        stalled_at.elapsed() < Duration::from_secs(20),
        "taken over while stall-a was still stalled"
    );
    m2.wait_leading().await;
    // Once its runtime runs again, stall-a is a standby and healthy.
    poll_until("stall-a runs again, as a standby", PATIENCE, || async {
        let status = m1.try_status().await.map_err(|e| e.to_string())?;
        let healthy = m1
            .get("/healthz")
            .send()
            .await
            .map_err(|e| e.to_string())?
            .status()
            .is_success();
        (status["leading"] == serde_json::json!(false) && healthy)
            .then_some(())
            .ok_or(format!("leading {} healthz {healthy}", status["leading"]))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Whether some manager of `managers` says it leads.
async fn someone_leads(managers: &[&Manager]) -> bool {
    for m in managers {
        if m.leading().await {
            return true;
        }
    }
    false
}

/// Leader election through a slow API server, with the shipped timings (15 s Lease, 10 s renew
/// deadline, 2 s retry): with 1 s and then 4 s of latency on every Lease request, where
/// client-go's components keep a leader, a leader exists at every probe for 20 s each (a
/// candidate's acquire once had 2 s in all, so after a step-down nobody could take over). With
/// 8 s, more than a renewal survives, leadership may go; once the latency is gone a leader is
/// back, and the log says the API server was slow rather than only "timed out".
#[tokio::test]
async fn a_leader_is_kept_through_a_slow_api_server() {
    let c = start_cluster().await;
    let a = Manager::start(&c, "slow-a", &[]).await;
    a.wait_leading().await;
    let b = Manager::start(&c, "slow-b", &[]).await;
    let both = [&a, &b];
    let faults = c.dc.faults();
    for secs in [1, 4] {
        faults.add_latency("*", "leases", Duration::from_secs(secs));
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < until {
            assert!(
                someone_leads(&both).await,
                "no manager led with {secs} s of latency on Lease requests"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        faults.clear();
    }
    faults.add_latency("*", "leases", Duration::from_secs(8));
    poll_until(
        "the slow API server named in a manager's log",
        Duration::from_secs(60),
        || async {
            let logs = [&a.log, &b.log]
                .iter()
                .filter_map(|p| std::fs::read_to_string(p).ok())
                .collect::<String>();
            logs.contains("no answer from the API server to the lease request")
                .then_some(())
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    faults.clear();
    poll_until("a leader once the latency is gone", PATIENCE, || async {
        someone_leads(&both)
            .await
            .then_some(())
            .ok_or_else(|| "none leads".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Pod `default/<name>` as the manager's own pod would be (devcluster runs no pods; the object
/// is what the Service selects on).
async fn manager_pod(c: &Cluster, name: &str, leader_label: bool) {
    let mut labels = serde_json::json!({"app": "ctrlhub"});
    if leader_label {
        labels["ctrlhub.io/leader"] = serde_json::json!("true");
    }
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "ctrlhub", "image": "ctrlhub:test"}]}});
    apply(&c.client, &pod).await.expect("pod");
}

/// The pods the `ctrlhub` Service would select: those carrying the leader label.
async fn labelled(c: &Cluster) -> Vec<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), "default");
    let mut names: Vec<String> = pods
        .list(&kube::api::ListParams::default().labels("ctrlhub.io/leader=true"))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

async fn wait_labelled(c: &Cluster, want: &[&str]) {
    poll_until(
        "the leader label on exactly the leader's pod",
        PATIENCE,
        || async {
            let now = labelled(c).await;
            (now == want)
                .then_some(())
                .ok_or_else(|| format!("labelled: {now:?}"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The Service never keeps selecting a standby: a leader SIGKILLed with its pod labelled is
/// stripped of the label by the new leader, and a container restarted in a pod that still
/// carries a stale label removes it before it campaigns.
#[tokio::test]
async fn the_leader_label_follows_the_leader_after_a_crash() {
    let c = start_cluster().await;
    let mut args: Vec<&str> = FAST_LEASE.to_vec();
    args.extend([
        "--leader-pod-label",
        "ctrlhub.io/leader",
        "--lease-namespace",
        "default",
    ]);
    manager_pod(&c, "route-a", false).await;
    manager_pod(&c, "route-b", false).await;
    let mut a = Manager::start(&c, "route-a", &args).await;
    a.wait_leading().await;
    wait_labelled(&c, &["route-a"]).await;
    a.kill().await;
    assert_eq!(
        labelled(&c).await,
        ["route-a"],
        "a SIGKILLed leader keeps its label"
    );
    let b = Manager::start(&c, "route-b", &args).await;
    b.wait_leading().await;
    wait_labelled(&c, &["route-b"]).await;
    // A container of pod route-a starts again while its pod still says it leads.
    manager_pod(&c, "route-a", true).await;
    let _a2 = Manager::start(&c, "route-a", &args).await;
    wait_labelled(&c, &["route-b"]).await;
    assert!(b.leading().await, "route-b still leads");
}

/// SIGTERM lets the attempts already out finish: for the shutdown grace nothing new is handed
/// out and the session stays open, the replica's late result is taken, and only then are
/// sessions revoked and the manager exits — well before the grace when nothing is left out.
#[tokio::test]
async fn a_shutdown_waits_for_attempts_already_out() {
    let c = start_cluster().await;
    let mut args: Vec<&str> = FAST_LEASE.to_vec();
    args.extend(["--shutdown-grace", "30s"]);
    namespace(&c.client, "graceful", &[]).await;
    let mut m = Manager::start(&c, "graceful", &args).await;
    m.wait_leading().await;
    let registration = replica::register("graceful", replica::configmaps(), 2, Some("graceful"));
    let mut replica = Replica::connect(&m.grpc, registration)
        .await
        .expect("registers");
    put_configmap(&c.client, "graceful", "slow", &[("a", "1")]).await;
    let slow = replica.expect().await;
    assert_eq!(key(&slow), "graceful/slow");

    m.signal("TERM");
    let terminated = std::time::Instant::now();
    // A change made once the manager has stopped handing work out (as its log says; before
    // that line, a busy machine may still be delivering the signal).
    wait_for("the manager says nothing new goes out", || async {
        std::fs::read_to_string(&m.log)
            .is_ok_and(|l| l.contains("shutting down: nothing new goes out"))
    })
    .await;
    put_configmap(&c.client, "graceful", "later", &[("a", "1")]).await;
    // The handler keeps working for 3 s of the 30 s grace: its session must stay open and
    // nothing new may arrive (before, Revoked came within 200 ms of SIGTERM).
    let window = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        match tokio::time::timeout_at(window, replica.recv()).await {
            Err(_) => break,
            Ok(Ok(None)) => continue,
            Ok(Ok(Some(r))) => panic!("{} was handed out while shutting down", key(&r)),
            Ok(Err(())) => panic!(
                "the session ended {:?} after SIGTERM, with its attempt still out",
                terminated.elapsed()
            ),
        }
    }
    replica.done(&slow.id).await;
    let ended = replica.ended(PATIENCE).await;
    assert!(
        ended.is_some(),
        "the session is revoked once its result is in"
    );
    assert!(
        m.exited(Duration::from_secs(15)).await,
        "the manager exits once nothing is out"
    );
    assert!(
        terminated.elapsed() < Duration::from_secs(20),
        "it did not wait out the 30 s grace: {:?}",
        terminated.elapsed()
    );
}

/// One probe of the probe port as the kubelet makes it: status, body and how long it took.
async fn probe(http: &reqwest::Client, url: &str) -> Result<(u16, String, Duration), String> {
    let started = std::time::Instant::now();
    let r = http.get(url).send().await.map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let body = r.text().await.map_err(|e| e.to_string())?;
    Ok((status, body, started.elapsed()))
}

/// Waits until `/readyz?verbose` on `base` answers `status` with `want` in its body, checking
/// on every answer that it came at once (from memory, never waiting on the API server) and
/// that `/livez` stays 200: a restart would not bring the API server or a Lease grant back.
async fn readiness_becomes(http: &reqwest::Client, base: &str, status: u16, want: &[&str]) {
    let what = format!("/readyz?verbose answers {status} naming {want:?}");
    wait_until(&what, PATIENCE, || async {
        let (code, body, took) = probe(http, &format!("{base}/readyz?verbose")).await?;
        assert!(
            took < Duration::from_secs(2),
            "/readyz took {took:?}: it must answer from memory"
        );
        let (live, live_body, _) = probe(http, &format!("{base}/livez")).await?;
        assert_eq!(live, 200, "/livez stays true: {live_body}");
        if code == status && want.iter().all(|w| body.contains(w)) {
            Ok(body)
        } else {
            Err(format!("{code}: {body}"))
        }
    })
    .await;
}

/// The probe port (`--probe-addr`) as the kubelet reads it, for a manager running as its own
/// ServiceAccount with only the Lease grant of deploy/'s Role, reaching the API server through a
/// proxy that can stop carrying packets: `/readyz` turns false, naming the check, while the API
/// server is unreachable, while the Lease RBAC is missing and while the Lease is frozen (writes
/// answer 503), and true again after each; `/livez` stays true throughout. On main there is no
/// probe port, and the HTTP port's `/readyz` answers 200 through all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_names_the_api_server_and_the_lease_and_recovers() {
    use ctrlhub_tests::{netproxy::Freezable, rbac};
    use k8s_openapi::api::rbac::v1::RoleBinding;
    let c = start_cluster().await;
    namespace(&c.client, "ctrlhub-system", &[]).await;
    rbac::service_account(&c, "ctrlhub-system", "ctrlhub").await;
    let role = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "ctrlhub-leader-election", "namespace": "ctrlhub-system"},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch"]}]});
    let binding = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "ctrlhub-leader-election", "namespace": "ctrlhub-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ctrlhub-leader-election"},
        "subjects": [{"kind": "ServiceAccount", "name": "ctrlhub", "namespace": "ctrlhub-system"}]});
    apply(&c.client, &role).await.expect("role");
    apply(&c.client, &binding).await.expect("binding");
    let token =
        c.dc.issue_token("ctrlhub-system", "ctrlhub", &[], Duration::from_secs(3600))
            .expect("token");
    let proxy = Freezable::start(c.dc.addr()).await.expect("proxy");
    let kubeconfig = c.dir.path().join("kubeconfig-through-proxy");
    let yaml =
        c.dc.kubeconfig_yaml_for_token(&token)
            .replace(&c.dc.url(), &proxy.https_url());
    std::fs::write(&kubeconfig, yaml).expect("kubeconfig");
    let probe_addr = format!("127.0.0.1:{}", free_port());
    let mut args = FAST_LEASE.to_vec();
    args.extend([
        "--lease-namespace",
        "ctrlhub-system",
        "--probe-addr",
        &probe_addr,
    ]);
    let m =
        Manager::launch_with_kubeconfig(&c, &kubeconfig, "ready-a", &args, &Launch::for_tests())
            .await
            .expect("manager starts");
    println!("manager logs to {}", m.log.display());
    m.wait_leading().await;
    let base = format!("http://{probe_addr}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let healthy = ["[+]api-server ok", "[+]lease ok", "[+]dispatch-runtime ok"];
    readiness_becomes(&http, &base, 200, &healthy).await;

    // The API server unreachable: connections held silent, requests time out.
    proxy.freeze();
    readiness_becomes(&http, &base, 503, &["[-]api-server failed: GET /version"]).await;
    proxy.thaw();
    readiness_becomes(&http, &base, 200, &healthy).await;

    // The Lease RBAC gone: every round trip is refused.
    let bindings: Api<RoleBinding> = Api::namespaced(c.client.clone(), "ctrlhub-system");
    bindings
        .delete("ctrlhub-leader-election", &Default::default())
        .await
        .expect("binding deleted");
    readiness_becomes(
        &http,
        &base,
        503,
        &["[+]api-server ok", "[-]lease failed:", "forbidden"],
    )
    .await;
    apply(&c.client, &binding).await.expect("binding restored");
    readiness_becomes(&http, &base, 200, &healthy).await;

    // The Lease frozen: the leader's renewals answer 503 (retried by the client until the
    // attempt's budget runs out, so the check may name the timeout rather than the 503).
    c.dc.faults()
        .freeze_lease("ctrlhub-system", "ctrlhub-leader");
    readiness_becomes(&http, &base, 503, &["[+]api-server ok", "[-]lease failed:"]).await;
    c.dc.faults()
        .unfreeze_lease("ctrlhub-system", "ctrlhub-leader");
    readiness_becomes(&http, &base, 200, &healthy).await;
}
