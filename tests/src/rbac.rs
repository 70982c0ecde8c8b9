//! Tenants as the security and fairness suites set them up: ServiceAccounts with tokens from the
//! TokenRequest API, RBAC objects granting them ConfigMaps, and a manager in `--auth kubernetes`
//! mode with decision caches short enough for grants and revocations to show within seconds.

use ctrlhub_proto::v1 as pb;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::manager::Manager;
use crate::objects::{apply, namespace};
use crate::replica::{namespace_names, register_configmaps};

/// Short decision TTLs so grants and revocations show within seconds; the defaults are 5 min and
/// 30 s and only change how long a test would wait.
pub const RBAC_ARGS: [&str; 10] = [
    "--auth",
    "kubernetes",
    "--audience",
    "ctrlhub",
    "--authz-allow-ttl",
    "2s",
    "--authz-deny-ttl",
    "1s",
    "--token-cache-ttl",
    "1s",
];

/// A leading manager in `--auth kubernetes` mode with [`RBAC_ARGS`].
pub async fn rbac_manager(c: &Cluster, identity: &str) -> Manager {
    let m = Manager::start(c, identity, &RBAC_ARGS).await;
    m.wait_leading().await;
    m
}

/// ServiceAccount `ns/name`, as JSON.
pub fn service_account_object(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}})
}

/// Create (or keep) ServiceAccount `ns/name`.
pub async fn service_account(c: &Cluster, ns: &str, name: &str) {
    apply(&c.client, &service_account_object(ns, name))
        .await
        .expect("serviceaccount applied");
}

/// A token from the TokenRequest API, as a projected volume would hold it.
pub async fn token(c: &Cluster, ns: &str, sa: &str, audience: &str) -> String {
    let api: Api<ServiceAccount> = Api::namespaced(c.client.clone(), ns);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_string()],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let issued: TokenRequest = api
        .create_subresource("token", sa, &PostParams::default(), &request)
        .await
        .expect("token issued");
    issued.status.expect("token status").token
}

/// A tenant: a namespace, a ServiceAccount in it, and a token for ctrlhub's audience.
pub async fn tenant(c: &Cluster, ns: &str, sa: &str) -> String {
    namespace(&c.client, ns, &[]).await;
    service_account(c, ns, sa).await;
    format!("Bearer {}", token(c, ns, sa, "ctrlhub").await)
}

/// A Role and RoleBinding (or, with `ns` = None, a ClusterRole and ClusterRoleBinding) named
/// `<sa_ns>-<sa>-reader` that let ServiceAccount `sa_ns/sa` get, list and watch ConfigMaps and
/// Secrets in `ns` (everywhere), as JSON.
pub fn configmap_reader(sa_ns: &str, sa: &str, ns: Option<&str>) -> [Value; 2] {
    let name = format!("{sa_ns}-{sa}-reader");
    let (role_kind, binding_kind, metadata) = match ns {
        Some(ns) => (
            "Role",
            "RoleBinding",
            json!({"name": name, "namespace": ns}),
        ),
        None => ("ClusterRole", "ClusterRoleBinding", json!({"name": name})),
    };
    let rbac = "rbac.authorization.k8s.io";
    [
        json!({"apiVersion": format!("{rbac}/v1"), "kind": role_kind, "metadata": metadata,
            "rules": [{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": format!("{rbac}/v1"), "kind": binding_kind, "metadata": metadata,
            "roleRef": {"apiGroup": rbac, "kind": role_kind, "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]}),
    ]
}

/// Grant `sa` list and watch on ConfigMaps in `ns` (RoleBinding) or everywhere (`ns` = None).
pub async fn grant_configmaps(c: &Cluster, sa_ns: &str, sa: &str, ns: Option<&str>) {
    for obj in configmap_reader(sa_ns, sa, ns) {
        apply(&c.client, &obj).await.expect("rbac object applied");
    }
}

/// Delete the RoleBinding [`grant_configmaps`] made in `ns`.
pub async fn revoke_configmaps(c: &Cluster, sa_ns: &str, sa: &str, ns: &str) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
    ));
    let api: Api<DynamicObject> = Api::namespaced_with(c.client.clone(), ns, &ar);
    api.delete(&format!("{sa_ns}-{sa}-reader"), &DeleteParams::default())
        .await
        .expect("rolebinding deleted");
}

/// A ConfigMap registration limited to `namespaces` (empty: all namespaces).
pub fn configmaps_in(name: &str, namespaces: &[&str]) -> pb::Register {
    let mut r = register_configmaps(name, 8);
    if !namespaces.is_empty() {
        r.namespaces = Some(namespace_names(namespaces));
    }
    r
}

/// ServiceAccount `monitoring/prometheus` bound to the ClusterRole `role` (which must exist,
/// e.g. deploy/'s `ctrlhub-metrics-reader`), as docs/multi-tenancy.md says to bind Prometheus; returns a
/// token of it for the API server's audience, which the manager's HTTP port accepts.
pub async fn prometheus_bound_to(c: &Cluster, role: &str) -> anyhow::Result<String> {
    namespace(&c.client, "monitoring", &[]).await;
    apply(
        &c.client,
        &service_account_object("monitoring", "prometheus"),
    )
    .await?;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("prometheus-{role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
    });
    apply(&c.client, &binding).await?;
    Ok(c.dc.issue_token(
        "monitoring",
        "prometheus",
        &[],
        std::time::Duration::from_secs(3600),
    )?)
}
