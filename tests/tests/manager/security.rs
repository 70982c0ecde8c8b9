//! The security suite: the real manager in `--auth kubernetes` mode on devcluster, controllers
//! presenting ServiceAccount tokens from the TokenRequest API, Kubernetes RBAC as the policy.
//! One test per threat; each fails if the check it names is removed.

use ctrlhub_proto::v1 as pb;
use ctrlhub_tests::rbac::*;
use ctrlhub_tests::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams};
use std::time::Duration;
use tonic::Code;

async fn refused(m: &Manager, register: pb::Register, auth: Option<&str>) -> tonic::Status {
    match Replica::connect_with(&m.grpc, register, auth).await {
        Ok(_) => panic!("the manager accepted a registration it must refuse"),
        Err(status) => status,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_is_unauthenticated() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-none").await;
    let status = refused(&m, configmaps_in("c", &[]), None).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("Bearer"),
        "says what to send: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_token_is_unauthenticated() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-malformed").await;
    for auth in ["Bearer not.a.token", "Basic dXNlcjpwYXNz", "Bearer "] {
        let status = refused(&m, configmaps_in("c", &[]), Some(auth)).await;
        assert_eq!(status.code(), Code::Unauthenticated, "{auth}: {status:?}");
        assert!(
            !status.message().contains("not.a.token"),
            "the token is never echoed: {status:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_for_another_audience_is_unauthenticated() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-audience").await;
    namespace(&c.client, "team-a", &[]).await;
    service_account(&c, "team-a", "ctl").await;
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    let other = format!("Bearer {}", token(&c, "team-a", "ctl", "vault").await);
    let status = refused(&m, configmaps_in("c", &["team-a"]), Some(&other)).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("audience"), "{status:?}");
    // The same identity with the right audience is fine: only the audience was wrong.
    let right = format!("Bearer {}", token(&c, "team-a", "ctl", "ctrlhub").await);
    Replica::connect_with(&m.grpc, configmaps_in("c", &["team-a"]), Some(&right))
        .await
        .expect("a token for ctrlhub's audience registers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_serviceaccount_token_is_unauthenticated() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-deleted").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    Replica::connect_with(&m.grpc, configmaps_in("c", &["team-a"]), Some(&auth))
        .await
        .expect("registers while the ServiceAccount exists");
    let sas: Api<ServiceAccount> = Api::namespaced(c.client.clone(), "team-a");
    sas.delete("ctl", &DeleteParams::default())
        .await
        .expect("serviceaccount deleted");
    // Within the token cache TTL (1 s here) the token stops working.
    wait_for("the deleted ServiceAccount's token is refused", || async {
        matches!(
            Replica::connect_with(&m.grpc, configmaps_in("c", &["team-a"]), Some(&auth)).await,
            Err(s) if s.code() == Code::Unauthenticated
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_without_rbac_is_denied_until_a_rolebinding_grants_it() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-grant").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    let status = refused(&m, configmaps_in("c", &["team-a"]), Some(&auth)).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status
            .message()
            .contains("system:serviceaccount:team-a:ctl")
            && status.message().contains("namespace team-a"),
        "names who and where: {status:?}"
    );
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    put_configmap(&c.client, "team-a", "app", &[("k", "v")]).await;
    // The deny is cached for 1 s; then the new RoleBinding is seen.
    let mut replica = wait_until("the RoleBinding takes effect", PATIENCE, || async {
        Replica::connect_with(&m.grpc, configmaps_in("c", &["team-a"]), Some(&auth))
            .await
            .map_err(|s| format!("{s:?}"))
    })
    .await;
    let r = replica.expect().await;
    assert_eq!(key(&r), "team-a/app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_in_another_tenants_namespace_is_denied() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-other-ns").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    namespace(&c.client, "team-b", &[]).await;
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    let status = refused(&m, configmaps_in("c", &["team-a", "team-b"]), Some(&auth)).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("namespace team-b"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_namespaces_watch_with_only_namespaced_rights_is_denied() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-all-ns").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    let status = refused(&m, configmaps_in("c", &[]), Some(&auth)).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("all namespaces"), "{status:?}");
    // A cluster-wide grant is what all namespaces needs.
    grant_configmaps(&c, "team-a", "ctl", None).await;
    wait_for("the ClusterRoleBinding takes effect", || async {
        Replica::connect_with(&m.grpc, configmaps_in("c", &[]), Some(&auth))
            .await
            .is_ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_through_the_cache_are_denied_without_opt_in() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-secrets").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    // RBAC alone allows it (the Role covers secrets); the manager's opt-in list does not.
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    let mut r = configmaps_in("c", &["team-a"]);
    r.primary = Some(pb::ResourceType {
        group: String::new(),
        version: "v1".into(),
        kind: "Secret".into(),
        plural: String::new(),
    });
    let status = refused(&m, r, Some(&auth)).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_that_does_not_exist_looks_like_a_denied_one() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-probe").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    let mut missing = configmaps_in("c", &["team-a"]);
    missing.primary = Some(pb::ResourceType {
        group: "conformance.ctrlhub.dev".into(),
        version: "v1".into(),
        kind: "Widget".into(),
        plural: String::new(),
    });
    let absent = refused(&m, missing.clone(), Some(&auth)).await;
    // Install it: now it exists, and the tenant is simply not allowed.
    install_widget_crd(&c.client).await;
    let gvk = kube::api::GroupVersionKind::gvk("conformance.ctrlhub.dev", "v1", "Widget");
    wait_until("the Widget kind is served", PATIENCE, || async {
        kube::discovery::pinned_kind(&c.client, &gvk)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    let denied = refused(&m, missing, Some(&auth)).await;
    assert_eq!(absent.code(), Code::PermissionDenied, "{absent:?}");
    assert_eq!(
        (absent.code(), absent.message()),
        (denied.code(), denied.message()),
        "absent and forbidden answer alike"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_permission_stops_delivery_within_the_recheck_interval() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-revoke").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    put_configmap(&c.client, "team-a", "one", &[("k", "v")]).await;
    let mut replica = Replica::connect_with(&m.grpc, configmaps_in("c", &["team-a"]), Some(&auth))
        .await
        .expect("registers");
    let r = replica.expect().await;
    replica.done(&r.id).await;
    revoke_configmaps(&c, "team-a", "ctl", "team-a").await;
    // The allow is re-checked every 2 s here: the session ends with PERMISSION_DENIED.
    let ended = replica.ended(PATIENCE).await;
    assert_eq!(
        ended.map(|s| s.code()),
        Some(Code::PermissionDenied),
        "the session ends with PERMISSION_DENIED"
    );
    // And a reconnect is refused, so nothing more is delivered.
    let status = refused(&m, configmaps_in("c", &["team-a"]), Some(&auth)).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_naming_another_tenants_controller_gets_nothing_of_it() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-takeover").await;
    let a = tenant(&c, "team-a", "ctl").await;
    let b = tenant(&c, "team-b", "ctl2").await;
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    grant_configmaps(&c, "team-b", "ctl2", Some("team-b")).await;
    put_configmap(&c.client, "team-a", "a-secret-plan", &[("k", "v")]).await;
    put_configmap(&c.client, "team-b", "b-app", &[("k", "v")]).await;
    let mut ra = Replica::connect_with(&m.grpc, configmaps_in("shared", &["team-a"]), Some(&a))
        .await
        .expect("a registers");
    assert_eq!(key(&ra.expect().await), "team-a/a-secret-plan");
    // B registers the same controller name and tries to claim A's identity through metadata;
    // only the verified token decides who B is.
    let mut rb = Replica::connect_with_metadata(
        &m.grpc,
        configmaps_in("shared", &["team-b"]),
        Some(&b),
        &[
            ("x-ctrlhub-tenant", "system:serviceaccount:team-a:ctl"),
            ("impersonate-user", "system:serviceaccount:team-a:ctl"),
        ],
    )
    .await
    .expect("b registers its own controller of that name");
    assert_eq!(key(&rb.expect().await), "team-b/b-app");
    assert!(
        rb.next(Duration::from_secs(2)).await.is_none(),
        "B never sees A's keys"
    );
    // Two controllers named `shared`, one per tenant, and A's session is intact.
    let status = m.status().await;
    let shared: Vec<_> = status["controllers"]
        .as_array()
        .expect("controllers")
        .iter()
        .filter(|c| c["name"] == "shared")
        .map(|c| c["identity"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(shared.len(), 2, "{status}");
    assert!(shared.contains(&"system:serviceaccount:team-a:ctl".to_string()));
    assert!(shared.contains(&"system:serviceaccount:team-b:ctl2".to_string()));
    // B cannot read through A's session either.
    let mut read = with_authorization(
        pb::ListRequest {
            session_id: ra.session_id.clone(),
            resource: Some(pb::ResourceType {
                group: String::new(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: String::new(),
            }),
            namespace: "team-a".into(),
            ..Default::default()
        },
        Some(&b),
    );
    read.set_timeout(PATIENCE);
    let denied = rb
        .client
        .list(read)
        .await
        .expect_err("another tenant's session id gives nothing");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    put_configmap(&c.client, "team-a", "a-secret-plan", &[("k", "v2")]).await;
    assert_eq!(key(&ra.expect().await), "team-a/a-secret-plan");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_named_serviceaccounts_in_different_namespaces_never_share_state() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-same-name").await;
    let a = tenant(&c, "team-a", "ctl").await;
    let b = tenant(&c, "team-b", "ctl").await;
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    grant_configmaps(&c, "team-b", "ctl", Some("team-b")).await;
    put_configmap(&c.client, "team-a", "only-a", &[("k", "v")]).await;
    put_configmap(&c.client, "team-b", "only-b", &[("k", "v")]).await;
    // Same controller name, same ServiceAccount name: still two tenants.
    let mut ra = Replica::connect_with(&m.grpc, configmaps_in("ctl", &["team-a"]), Some(&a))
        .await
        .expect("a registers");
    let mut rb = Replica::connect_with(&m.grpc, configmaps_in("ctl", &["team-b"]), Some(&b))
        .await
        .expect("b registers a different definition without superseding a");
    assert_eq!(key(&ra.expect().await), "team-a/only-a");
    assert_eq!(key(&rb.expect().await), "team-b/only-b");
    assert!(ra.next(Duration::from_secs(1)).await.is_none());
    assert!(rb.next(Duration::from_secs(1)).await.is_none());
}

/// A manager in the default static-token mode with small limits for tenant `dev`.
async fn limited_manager(c: &Cluster, identity: &str, extra: &[&str]) -> Manager {
    let m = Manager::start(c, identity, extra).await;
    m.wait_leading().await;
    m
}

async fn limit_hits(m: &Manager, limit: &str) -> f64 {
    m.metric(&format!(
        r#"ctrlhub_tenant_limit_hits_total{{limit="{limit}",tenant="dev"}}"#
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_is_resource_exhausted() {
    let c = start_cluster().await;
    let m = limited_manager(&c, "sec-oversized", &["--max-message-bytes", "65536"]).await;
    let mut huge = register_configmaps("c", 1);
    huge.controller_name = "x".repeat(200_000);
    let status = refused(&m, huge, Some("Bearer dev")).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--max-message-bytes"),
        "names the knob: {status:?}"
    );
    assert_eq!(limit_hits(&m, "message_bytes").await, 1.0);
    // The manager is unharmed: a normal registration works.
    Replica::connect(&m.grpc, register_configmaps("c", 1))
        .await
        .expect("a normal registration still works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_method_is_unimplemented() {
    let c = start_cluster().await;
    let m = limited_manager(&c, "sec-unknown", &[]).await;
    let channel = tonic::transport::Endpoint::from_shared(m.grpc.clone())
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/ctrlhub.v1.ControllerManager/DeleteEverything",
    );
    let status = grpc
        .unary::<pb::GetRequest, pb::GetResponse, _>(
            with_authorization(pb::GetRequest::default(), Some("Bearer dev")),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .expect_err("no such method");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_past_the_queue_limit_is_resource_exhausted_and_released() {
    let c = start_cluster().await;
    let m = limited_manager(&c, "sec-flood", &["--max-queued-keys", "50"]).await;
    namespace(&c.client, "flood", &[]).await;
    let mut replica = Replica::connect(&m.grpc, configmaps_in("flooded", &["flood"]))
        .await
        .expect("registers while the namespace is empty");
    for i in 0..120 {
        put_configmap(&c.client, "flood", &format!("cm-{i}"), &[("k", "v")]).await;
    }
    // Credits are 8 and nothing is answered, so keys pile up past 50.
    let ended = replica.ended(PATIENCE).await;
    let ended = ended.expect("the session ends");
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended:?}");
    assert!(ended.message().contains("50"), "{ended:?}");
    // The controller and its queue are gone, so the memory it pinned is released.
    wait_for("the flooded controller is removed", || async {
        m.status().await["controllers"]
            .as_array()
            .is_some_and(|cs| cs.iter().all(|c| c["name"] != "flooded"))
    })
    .await;
    assert!(limit_hits(&m, "queued_keys").await >= 1.0);
    // Registering again with the flood already there is refused: up front when the cached
    // snapshot overflows while wiring, or right after Registered when it replays later.
    let again = match Replica::connect(&m.grpc, configmaps_in("flooded", &["flood"])).await {
        Err(status) => status,
        Ok(mut replica) => replica.ended(PATIENCE).await.expect("the session ends"),
    };
    assert_eq!(again.code(), Code::ResourceExhausted, "{again:?}");
}

/// Cache amplification: every distinct label selector is an informer holding its own copy of
/// what it matches. A tenant's new registrations stop at its cached-bytes budget, while a
/// replica joining a controller it already runs is still welcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_registrations_stop_at_the_tenants_cached_bytes_budget() {
    let c = start_cluster().await;
    namespace(&c.client, "cached", &[]).await;
    let payload = "x".repeat(2_000);
    for i in 0..40 {
        put_configmap(
            &c.client,
            "cached",
            &format!("cm-{i}"),
            &[("v", payload.as_str())],
        )
        .await;
    }
    // 40 objects of 2 KB: one informer holds about 80 KB, two do not fit in 120 KB.
    let m = limited_manager(
        &c,
        "sec-cached",
        &["--tenant-limit", "dev/cached-bytes=120000"],
    )
    .await;
    let selected = |name: &str, selector: &str| pb::Register {
        label_selector: Some(pb::LabelSelector {
            match_expressions: vec![pb::LabelSelectorRequirement {
                key: "team".into(),
                operator: pb::label_selector_requirement::Operator::NotIn as i32,
                values: vec![selector.into()],
            }],
            ..Default::default()
        }),
        ..configmaps_in(name, &["cached"])
    };
    let _first = Replica::connect(&m.grpc, selected("first", "a"))
        .await
        .expect("the first informer fits the budget");
    let second = refused(&m, selected("second", "b"), Some("Bearer dev")).await;
    assert_eq!(second.code(), Code::ResourceExhausted, "{second:?}");
    assert!(second.message().contains("cached_bytes"), "{second:?}");
    assert_eq!(limit_hits(&m, "cached_bytes").await, 1.0);
    Replica::connect(&m.grpc, selected("first", "a"))
        .await
        .expect("another replica of the admitted controller joins");
    let status = m.status().await;
    assert_eq!(
        status["controllers"].as_array().map(Vec::len),
        Some(1),
        "the refused registration left nothing behind: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_informer_limit_counts_distinct_watches() {
    let c = start_cluster().await;
    let m = limited_manager(&c, "sec-informers", &["--tenant-limit", "dev/informers=2"]).await;
    let in_namespaces = |name: &str, namespaces: &[&str]| pb::Register {
        namespaces: Some(pb::NamespaceScope {
            scope: Some(pb::namespace_scope::Scope::Names(
                pb::namespace_scope::Names {
                    names: namespaces.iter().map(|n| n.to_string()).collect(),
                },
            )),
        }),
        ..register_configmaps(name, 1)
    };
    let _a = Replica::connect(&m.grpc, in_namespaces("a", &["team-a"]))
        .await
        .expect("one informer");
    // Shares a's informer and adds one: two distinct, at the limit.
    let _b = Replica::connect(&m.grpc, in_namespaces("b", &["team-a", "team-b"]))
        .await
        .expect("two distinct informers");
    let third = refused(&m, in_namespaces("c", &["team-c"]), Some("Bearer dev")).await;
    assert_eq!(third.code(), Code::ResourceExhausted, "{third:?}");
    assert!(third.message().contains("informers"), "{third:?}");
    assert_eq!(limit_hits(&m, "informers").await, 1.0);
    // A registration reusing the informers the tenant already holds is still welcome.
    let _d = Replica::connect(&m.grpc, in_namespaces("d", &["team-b"]))
        .await
        .expect("no new informer");
    let status = m.status().await;
    assert_eq!(
        status["controllers"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_session_and_in_flight_limits_are_enforced() {
    let c = start_cluster().await;
    let m = limited_manager(
        &c,
        "sec-sessions",
        &[
            "--tenant-limit",
            "dev/sessions=2",
            "--tenant-limit",
            "dev/in-flight=10",
        ],
    )
    .await;
    let _a = Replica::connect(&m.grpc, register_configmaps("c", 8))
        .await
        .expect("first session");
    // 8 of 10 credits used: the second asks for 8 and gets the 2 left.
    let _b = Replica::connect(&m.grpc, register_configmaps("c", 8))
        .await
        .expect("second session");
    let status = m.status().await;
    let credits: Vec<u64> = status["controllers"][0]["sessionList"]
        .as_array()
        .expect("sessions")
        .iter()
        .filter_map(|s| s["credits"].as_u64())
        .collect();
    assert_eq!(credits.iter().sum::<u64>(), 10, "{status}");
    let third = refused(&m, register_configmaps("c", 1), Some("Bearer dev")).await;
    assert_eq!(third.code(), Code::ResourceExhausted, "{third:?}");
    assert!(third.message().contains("sessions"), "{third:?}");
    assert_eq!(limit_hits(&m, "sessions").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_token_is_unauthenticated() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-expired").await;
    namespace(&c.client, "team-a", &[]).await;
    service_account(&c, "team-a", "ctl").await;
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    let expired =
        c.dc.issue_token("team-a", "ctl", &["ctrlhub"], Duration::ZERO)
            .expect("token issued");
    let status = refused(
        &m,
        configmaps_in("c", &["team-a"]),
        Some(&format!("Bearer {expired}")),
    )
    .await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    // The same identity with a live token registers: only the expiry was wrong.
    let live =
        c.dc.issue_token("team-a", "ctl", &["ctrlhub"], Duration::from_secs(3600))
            .expect("token issued");
    Replica::connect_with(
        &m.grpc,
        configmaps_in("c", &["team-a"]),
        Some(&format!("Bearer {live}")),
    )
    .await
    .expect("a live token registers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_is_accepted_on_a_long_lived_session() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-rotate").await;
    let first = tenant(&c, "team-a", "ctl").await;
    grant_configmaps(&c, "team-a", "ctl", Some("team-a")).await;
    put_configmap(&c.client, "team-a", "app", &[("k", "v")]).await;
    let mut replica = Replica::connect_with(&m.grpc, configmaps_in("c", &["team-a"]), Some(&first))
        .await
        .expect("registers");
    replica.expect().await;
    // The kubelet rotates the projected token; the session's cached reads use the new one.
    let rotated = format!("Bearer {}", token(&c, "team-a", "ctl", "ctrlhub").await);
    assert_ne!(rotated, first);
    let list = |auth: String| {
        let mut client = replica.client.clone();
        let session_id = replica.session_id.clone();
        async move {
            client
                .list(with_authorization(
                    pb::ListRequest {
                        session_id,
                        resource: Some(pb::ResourceType {
                            group: String::new(),
                            version: "v1".into(),
                            kind: "ConfigMap".into(),
                            plural: String::new(),
                        }),
                        namespace: "team-a".into(),
                        ..Default::default()
                    },
                    Some(&auth),
                ))
                .await
        }
    };
    let items = list(rotated)
        .await
        .expect("the rotated token reads")
        .into_inner();
    assert_eq!(items.items.len(), 1);
    // Another identity's token on this session reads nothing.
    let other = tenant(&c, "team-b", "ctl").await;
    let denied = list(other).await.expect_err("another identity");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
}

/// ConfigMaps in every namespace labelled `label`.
fn configmaps_labelled(name: &str, label: (&str, &str)) -> pb::Register {
    let mut r = register_configmaps(name, 8);
    r.namespaces = Some(pb::NamespaceScope {
        scope: Some(pb::namespace_scope::Scope::LabelSelector(
            pb::LabelSelector {
                match_labels: [(label.0.to_string(), label.1.to_string())]
                    .into_iter()
                    .collect(),
                match_expressions: vec![],
            },
        )),
    });
    r
}

/// Answer every request arriving within `window` and return their keys.
async fn keys_within(replica: &mut Replica, window: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + window;
    let mut keys = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match replica.next(left).await {
            Some(r) => {
                keys.push(key(&r));
                replica.done(&r.id).await;
            }
            None => break,
        }
    }
    keys
}

/// Answer requests until one for `wanted` arrives (failing after [`PATIENCE`]); returns every
/// key seen, `wanted` last.
async fn keys_until(replica: &mut Replica, wanted: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut keys = Vec::new();
    loop {
        let left = deadline
            .checked_duration_since(std::time::Instant::now())
            .unwrap_or_else(|| panic!("no request for {wanted} within {PATIENCE:?}; saw {keys:?}"));
        let r = replica
            .next(left)
            .await
            .unwrap_or_else(|| panic!("no request for {wanted} within {PATIENCE:?}; saw {keys:?}"));
        keys.push(key(&r));
        replica.done(&r.id).await;
        if key(&r) == wanted {
            return keys;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_selector_scope_admits_only_namespaces_the_tenant_may_watch() {
    let c = start_cluster().await;
    // Resyncs every second (below the default floor of 10 s): many chances for a leak.
    let mut args = RBAC_ARGS.to_vec();
    args.extend(["--min-resync-period", "1s"]);
    let m = Manager::start(&c, "sec-selector", &args).await;
    m.wait_leading().await;
    let auth = tenant(&c, "team-a", "ctl").await;
    namespace(&c.client, "sel-one", &[("team", "a")]).await;
    namespace(&c.client, "sel-two", &[("team", "a")]).await;
    grant_configmaps(&c, "team-a", "ctl", Some("sel-one")).await;
    put_configmap(&c.client, "sel-two", "two", &[("k", "v")]).await;
    put_configmap(&c.client, "sel-one", "one", &[("k", "v")]).await;
    let mut register = configmaps_labelled("c", ("team", "a"));
    // A resync re-offers every cached key of the kind, whatever its namespace: with one each
    // second, a key of the denied namespace would have many chances to leak.
    register.resync_period = Some(secs(1.0));
    // No cluster-wide grant, and still accepted: each namespace is checked as it enters.
    let mut replica = Replica::connect_with(&m.grpc, register, Some(&auth))
        .await
        .expect("a selector scope registers without a cluster-wide grant");
    let mut seen = keys_until(&mut replica, "sel-one/one").await;
    // A live change in the denied namespace, then several deny re-checks (1 s) and resyncs.
    put_configmap(&c.client, "sel-two", "two", &[("k", "v2")]).await;
    let later = keys_within(&mut replica, Duration::from_secs(4)).await;
    assert!(
        later.iter().any(|k| k == "sel-one/one"),
        "resyncs ran in the window: {later:?}"
    );
    seen.extend(later);
    assert!(
        seen.iter().all(|k| k.starts_with("sel-one/")),
        "only the namespace the tenant may watch delivers: {seen:?}"
    );
    // A RoleBinding created later admits the namespace on the next deny re-check.
    grant_configmaps(&c, "team-a", "ctl", Some("sel-two")).await;
    keys_until(&mut replica, "sel-two/two").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newly_labelled_namespace_delivers_only_if_the_tenant_may_watch_it() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-relabel").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    namespace(&c.client, "lab-denied", &[]).await;
    namespace(&c.client, "lab-granted", &[]).await;
    grant_configmaps(&c, "team-a", "ctl", Some("lab-granted")).await;
    put_configmap(&c.client, "lab-denied", "app", &[("k", "v")]).await;
    put_configmap(&c.client, "lab-granted", "app", &[("k", "v")]).await;
    let mut replica = Replica::connect_with(
        &m.grpc,
        configmaps_labelled("c", ("team", "b")),
        Some(&auth),
    )
    .await
    .expect("registers while no namespace matches");
    // Labelled in this order, the namespaces are checked in this order: by the time the granted
    // one delivers, the denied one has been checked and kept out.
    namespace(&c.client, "lab-denied", &[("team", "b")]).await;
    namespace(&c.client, "lab-granted", &[("team", "b")]).await;
    let mut seen = keys_until(&mut replica, "lab-granted/app").await;
    put_configmap(&c.client, "lab-denied", "app", &[("k", "v2")]).await;
    put_configmap(&c.client, "lab-granted", "app", &[("k", "v2")]).await;
    let later = keys_within(&mut replica, Duration::from_secs(3)).await;
    assert!(
        later.iter().any(|k| k == "lab-granted/app"),
        "the live change in the granted namespace arrived: {later:?}"
    );
    seen.extend(later);
    assert!(
        seen.iter().all(|k| k == "lab-granted/app"),
        "the labelled namespace without a grant delivers nothing: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_access_to_an_admitted_namespace_ends_the_selector_registration() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-selector-revoke").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    namespace(&c.client, "sel-one", &[("team", "a")]).await;
    grant_configmaps(&c, "team-a", "ctl", Some("sel-one")).await;
    put_configmap(&c.client, "sel-one", "one", &[("k", "v")]).await;
    let mut replica = Replica::connect_with(
        &m.grpc,
        configmaps_labelled("c", ("team", "a")),
        Some(&auth),
    )
    .await
    .expect("registers");
    keys_until(&mut replica, "sel-one/one").await;
    revoke_configmaps(&c, "team-a", "ctl", "sel-one").await;
    // Admitted namespaces are re-checked every allow interval (2 s here).
    let ended = replica.ended(PATIENCE).await.expect("the session ends");
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");
    assert!(ended.message().contains("namespace sel-one"), "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_selector_scope_with_a_cluster_wide_grant_admits_every_matching_namespace() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-selector-all").await;
    let auth = tenant(&c, "team-a", "ctl").await;
    namespace(&c.client, "sel-one", &[("team", "a")]).await;
    namespace(&c.client, "sel-two", &[("team", "a")]).await;
    namespace(&c.client, "unlabelled", &[]).await;
    grant_configmaps(&c, "team-a", "ctl", None).await;
    put_configmap(&c.client, "unlabelled", "zzz", &[("k", "v")]).await;
    put_configmap(&c.client, "sel-one", "one", &[("k", "v")]).await;
    put_configmap(&c.client, "sel-two", "two", &[("k", "v")]).await;
    let mut replica = Replica::connect_with(
        &m.grpc,
        configmaps_labelled("c", ("team", "a")),
        Some(&auth),
    )
    .await
    .expect("registers");
    let mut seen = Vec::new();
    while !["sel-one/one", "sel-two/two"]
        .iter()
        .all(|k| seen.iter().any(|s| s == k))
    {
        let r = replica.expect().await;
        seen.push(key(&r));
        replica.done(&r.id).await;
    }
    seen.extend(keys_within(&mut replica, Duration::from_secs(1)).await);
    assert!(
        seen.iter().all(|k| k.starts_with("sel-")),
        "only matching namespaces deliver: {seen:?}"
    );
}

/// One session for team-a's tenant: its namespace, or each of its two accounts.
fn limits_for(grouping: &str) -> Vec<&'static str> {
    match grouping {
        "namespace" => vec!["--tenant-limit", "system:serviceaccounts:team-a/sessions=1"],
        _ => vec![
            "--tenant-limit",
            "system:serviceaccount:team-a:ctl/sessions=1",
            "--tenant-limit",
            "system:serviceaccount:team-a:other/sessions=1",
        ],
    }
}

/// Tenants are per namespace by default: a second ServiceAccount in the same namespace shares
/// the first one's limits instead of multiplying them; `--tenant-grouping identity` keeps every
/// account apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_accounts_of_one_namespace_share_its_limits() {
    let c = start_cluster().await;
    for (grouping, second_refused) in [("namespace", true), ("identity", false)] {
        let m = Manager::start(
            &c,
            &format!("sec-grouping-{grouping}"),
            &[
                &RBAC_ARGS[..],
                &["--tenant-grouping", grouping],
                &limits_for(grouping)[..],
            ]
            .concat(),
        )
        .await;
        m.wait_leading().await;
        let mut auth = Vec::new();
        for sa in ["ctl", "other"] {
            auth.push(tenant(&c, "team-a", sa).await);
            grant_configmaps(&c, "team-a", sa, Some("team-a")).await;
        }
        let _first =
            Replica::connect_with(&m.grpc, configmaps_in("one", &["team-a"]), Some(&auth[0]))
                .await
                .expect("the first account registers");
        let second =
            Replica::connect_with(&m.grpc, configmaps_in("two", &["team-a"]), Some(&auth[1])).await;
        match (second, second_refused) {
            (Err(s), true) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                assert!(
                    s.message().contains("system:serviceaccounts:team-a"),
                    "{s:?}"
                );
            }
            (Ok(_), false) => {}
            (Err(s), false) => panic!("per identity, the second account was refused: {s:?}"),
            (Ok(_), true) => panic!("per namespace, a second account doubled the session limit"),
        }
    }
}

/// Connection churn: every new registration replays its informers' caches, so a tenant that
/// re-registers in a loop is slowed to a few registrations a second (replicas joining a running
/// controller are not counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_re_registering_in_a_loop_is_slowed_down() {
    let c = start_cluster().await;
    // With no grace, closing the only replica removes the controller, so each connection is
    // a new registration (within the grace it would rejoin the kept controller, which replays
    // nothing and is not counted).
    let m = limited_manager(&c, "sec-churn", &["--controller-grace", "0s"]).await;
    let mut refused_with = None;
    for _ in 0..60 {
        match Replica::connect(&m.grpc, register_configmaps("churn", 1)).await {
            // Closing the only replica removes the controller: the next one registers anew.
            Ok(replica) => drop(replica),
            Err(status) => {
                refused_with = Some(status);
                break;
            }
        }
    }
    let status = refused_with.expect("60 registrations in a row were all accepted");
    // The default rate is 2 per second after a burst of 10.
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("registrations"), "{status:?}");
    assert!(limit_hits(&m, "registrations").await >= 1.0);
    // The tenant is slowed, not locked out: after a pause it registers again.
    wait_for("the tenant registers again after a pause", || async {
        Replica::connect(&m.grpc, register_configmaps("churn", 1))
            .await
            .is_ok()
    })
    .await;
}

/// A limit naming one ServiceAccount while tenants are namespaces could never apply: the
/// manager refuses to start and says what to write instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_naming_an_account_while_tenants_are_namespaces_is_refused_at_start() {
    let out = std::process::Command::new(bin("ctrlhub"))
        .args([
            "run",
            "--tenant-limit",
            "system:serviceaccount:team-a:ctl/sessions=1",
        ])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("ctrlhub runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("use system:serviceaccounts:team-a"),
        "{stderr}"
    );
}

/// Two ServiceAccounts of one namespace are one tenant (the default grouping), and series and
/// pages name a controller by tenant and name: the second account cannot register a name the
/// first holds (ALREADY_EXISTS naming the holder), it keeps nothing of the first's keys, and the
/// first keeps its session. A different name is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_name_is_held_by_one_identity_per_tenant() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "sec-name-taken").await;
    let mut auth = Vec::new();
    for sa in ["ctl", "other"] {
        auth.push(tenant(&c, "team-a", sa).await);
        grant_configmaps(&c, "team-a", sa, Some("team-a")).await;
    }
    put_configmap(&c.client, "team-a", "plan", &[("k", "v")]).await;
    let mut first = Replica::connect_with(
        &m.grpc,
        configmaps_in("rollout", &["team-a"]),
        Some(&auth[0]),
    )
    .await
    .expect("the first account registers");
    assert_eq!(key(&first.expect().await), "team-a/plan");
    let taken = refused(&m, configmaps_in("rollout", &["team-a"]), Some(&auth[1])).await;
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    assert!(
        taken.message().contains("system:serviceaccount:team-a:ctl"),
        "names the holder: {taken:?}"
    );
    Replica::connect_with(
        &m.grpc,
        configmaps_in("rollout-2", &["team-a"]),
        Some(&auth[1]),
    )
    .await
    .expect("another name is fine");
    put_configmap(&c.client, "team-a", "plan", &[("k", "v2")]).await;
    assert_eq!(key(&first.expect().await), "team-a/plan");
}

/// `kubectl` against `cluster`, as a user runs it; stdout on success, stderr as the error.
fn kubectl(cluster: &Cluster, args: &[&str], input: Option<&str>) -> Result<String, String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("kubectl: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn tenant_policy(limits: &str) -> String {
    format!(
        "apiVersion: ctrlhub.io/v1alpha1\nkind: TenantPolicy\nmetadata:\n  name: dev\nspec:\n  tenant: dev\n  limits: {{{limits}}}\n"
    )
}

/// The `Accepted` condition of TenantPolicy `dev`: "status reason message".
fn accepted(c: &Cluster) -> String {
    kubectl(
        c,
        &[
            "get",
            "tenantpolicy",
            "dev",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Accepted")].status} {.status.conditions[?(@.type=="Accepted")].reason} {.status.conditions[?(@.type=="Accepted")].message}"#,
        ],
        None,
    )
    .unwrap_or_default()
}

/// Limits from a TenantPolicy applied with kubectl change without a restart: a policy lowers
/// the tenant's sessions, raising it lets another replica in, and a misspelt limit is refused
/// on the policy's status and in the log while the generation before stays in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_policies_change_limits_without_a_restart() {
    let c = start_cluster().await;
    let crd = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/tenantpolicy-crd.yaml"
    );
    kubectl(&c, &["apply", "-f", crd], None).expect("the CRD applies");
    wait_for("TenantPolicy is served", || async {
        kubectl(&c, &["get", "tenantpolicies"], None).is_ok()
    })
    .await;
    kubectl(
        &c,
        &["apply", "-f", "-"],
        Some(&tenant_policy("sessions: 1")),
    )
    .expect("applies");
    let m = limited_manager(&c, "sec-policy", &[]).await;
    wait_for("the policy is accepted on its status", || async {
        accepted(&c).starts_with("True Accepted")
    })
    .await;
    let _a = Replica::connect(&m.grpc, register_configmaps("p", 1))
        .await
        .expect("first session");
    let second = refused(&m, register_configmaps("p", 1), Some("Bearer dev")).await;
    assert_eq!(second.code(), Code::ResourceExhausted, "{second:?}");
    assert!(second.message().contains("sessions"), "{second:?}");

    kubectl(
        &c,
        &["apply", "-f", "-"],
        Some(&tenant_policy("sessions: 2")),
    )
    .expect("applies");
    let second = poll_until(
        "a second replica is let in once the policy says 2",
        PATIENCE,
        || async {
            Replica::connect(&m.grpc, register_configmaps("p", 1))
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    kubectl(
        &c,
        &["apply", "-f", "-"],
        Some(&tenant_policy("sesions: 5")),
    )
    .expect("applies");
    wait_for("the misspelt limit is refused on the status", || async {
        let condition = accepted(&c);
        condition.starts_with("False Invalid")
            && condition.contains("spec.limits.sesions: unknown limit")
            && condition.contains("stays in force")
    })
    .await;
    let log = std::fs::read_to_string(&m.log).unwrap_or_default();
    assert!(
        log.contains("tenant policy refused") && log.contains("sesions"),
        "the refusal is logged"
    );
    let third = refused(&m, register_configmaps("p", 1), Some("Bearer dev")).await;
    assert_eq!(
        third.code(),
        Code::ResourceExhausted,
        "the accepted generation (2 sessions) stays in force: {third:?}"
    );
    drop(second);
}

/// The probe port is open to anyone who reaches it (no token), so it is bounded like the other
/// ports: one address holds at most 8 connections there (a quarter of its 32), each closed when
/// it stays silent past the handshake timeout, and the kubelet's probe from another address is
/// answered meanwhile. A flood of the other ports never takes these connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_port_holds_a_bounded_number_of_silent_connections() {
    use ctrlhub_tests::strangers::{ATTACKER, silent_connections, wait_closed};
    let c = start_cluster().await;
    let probe: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let probe_addr = probe.to_string();
    let m = Manager::start(
        &c,
        "probe-flood",
        &["--probe-addr", &probe_addr, "--handshake-timeout", "2s"],
    )
    .await;
    m.wait_leading().await;
    let silent = silent_connections(ATTACKER, probe, 100).await;
    let (_, open) = wait_closed(&silent, 8, Duration::from_secs(5)).await;
    assert!(
        open <= 8,
        "{open} silent connections from one address stayed open"
    );
    let ready = reqwest::get(format!("http://{probe_addr}/readyz"))
        .await
        .expect("the kubelet's address gets in");
    assert_eq!(ready.status(), 200);
    let (took, open) = wait_closed(&silent, 0, Duration::from_secs(10)).await;
    assert_eq!(
        open, 0,
        "silent connections closed at the handshake timeout"
    );
    println!("100 silent: at most 8 held, all closed after {took:?}");
}

/// `/debug/pprof/profile` is authorized like `/metrics`: anonymous callers get 401, a tenant's
/// valid token without the grant 403, and a ServiceAccount bound to deploy/'s
/// `ctrlhub-profiler` ClusterRole gets a CPU profile of the manager at work (pprof protobuf
/// naming the manager's functions); one profile at a time, 1 to 60 s.
/// On main there is no such path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_profiles_need_the_profiler_grant() {
    let c = start_cluster().await;
    let m = rbac_manager(&c, "profiled").await;
    let roles = ctrlhub_tests::readme::repo().join("deploy/base/clusterrole.yaml");
    let applied = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["apply", "-f"])
        .arg(&roles)
        .output()
        .await
        .expect("kubectl runs");
    assert!(applied.status.success(), "{applied:?}");
    namespace(&c.client, "ops", &[]).await;
    service_account(&c, "ops", "oncall").await;
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "oncall-profiler"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ctrlhub-profiler"},
        "subjects": [{"kind": "ServiceAccount", "name": "oncall", "namespace": "ops"}],
    });
    apply(&c.client, &binding).await.expect("binding");
    let hour = Duration::from_secs(3600);
    let operator = c.dc.issue_token("ops", "oncall", &[], hour).expect("token");
    tenant(&c, "team-a", "ctl").await;
    let tenant_token = c.dc.issue_token("team-a", "ctl", &[], hour).expect("token");
    let http = &m.http_client;
    let url = format!("{}/debug/pprof/profile", m.http);
    let get = |query: &str, token: Option<&str>| {
        let req = http.get(format!("{url}{query}"));
        match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
        .send()
    };

    assert_eq!(get("?seconds=1", None).await.expect("answer").status(), 401);
    let refused = get("?seconds=1", Some(&tenant_token))
        .await
        .expect("answer");
    assert_eq!(refused.status(), 403);
    let why = refused.text().await.expect("body");
    assert!(why.contains("/debug/pprof/profile"), "{why}");
    for bad in ["?seconds=0", "?seconds=61", "?seconds=1&format=flamegraph"] {
        let r = get(bad, Some(&operator)).await.expect("answer");
        assert_eq!(r.status(), 400, "{bad}");
    }

    // The manager at work while it is profiled: scrapes, each rendering every series.
    let busy = tokio::spawn({
        let (client, metrics) = (m.http_client.clone(), format!("{}/metrics", m.http));
        let token = m.http_token.clone().unwrap_or_default();
        async move {
            loop {
                let _ = client.get(&metrics).bearer_auth(&token).send().await;
            }
        }
    });
    let (a, b) = tokio::join!(
        get("?seconds=2", Some(&operator)),
        get("?seconds=2", Some(&operator))
    );
    let (a, b) = (a.expect("answer"), b.expect("answer"));
    let mut statuses = [a.status().as_u16(), b.status().as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409], "one profile at a time");
    let profile = if a.status() == 200 { a } else { b };
    let body = profile.bytes().await.expect("profile");
    // pprof's protobuf keeps function names in its string table, as UTF-8.
    let names = String::from_utf8_lossy(&body);
    assert!(
        names.contains("ctrlhub::"),
        "the manager's own functions are in the profile ({} bytes)",
        body.len()
    );
    busy.abort();
}
