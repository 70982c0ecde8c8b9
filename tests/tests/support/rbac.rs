//! Tenants as the security and fairness suites set them up: ServiceAccounts with tokens from the
//! TokenRequest API, RBAC objects granting them ConfigMaps, and a manager in `--auth kubernetes`
//! mode with decision caches short enough for grants and revocations to show within seconds.

use super::{Cluster, Manager, namespace, register_configmaps};
use ctrlhub_proto::v1 as pb;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

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

/// Create (or keep) ServiceAccount `ns/name`.
pub async fn service_account(c: &Cluster, ns: &str, name: &str) {
    let api: Api<ServiceAccount> = Api::namespaced(c.client.clone(), ns);
    let sa = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}});
    api.patch(
        name,
        &PatchParams::apply("tests").force(),
        &Patch::Apply(&sa),
    )
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

/// Grant `sa` list and watch on ConfigMaps in `ns` (RoleBinding) or everywhere (`ns` = None).
pub async fn grant_configmaps(c: &Cluster, sa_ns: &str, sa: &str, ns: Option<&str>) {
    let rules = serde_json::json!([{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list", "watch"]}]);
    let subject = serde_json::json!([{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]);
    let name = format!("{sa_ns}-{sa}-reader");
    let (role, binding) = match ns {
        Some(ns) => (
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name, "namespace": ns}, "rules": rules}),
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name, "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}, "subjects": subject}),
        ),
        None => (
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules}),
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}, "subjects": subject}),
        ),
    };
    for obj in [role, binding] {
        apply_dynamic(c, &obj).await;
    }
}

/// Server-side apply an RBAC object given as JSON.
pub async fn apply_dynamic(c: &Cluster, obj: &serde_json::Value) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let kind = obj["kind"].as_str().expect("kind");
    let gvk = GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
    let ar = ApiResource::from_gvk(&gvk);
    let name = obj["metadata"]["name"].as_str().expect("name");
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(c.client.clone(), ns, &ar),
        None => Api::all_with(c.client.clone(), &ar),
    };
    api.patch(
        name,
        &PatchParams::apply("tests").force(),
        &Patch::Apply(obj),
    )
    .await
    .expect("rbac object applied");
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
        r.namespaces = Some(pb::NamespaceScope {
            scope: Some(pb::namespace_scope::Scope::Names(
                pb::namespace_scope::Names {
                    names: namespaces.iter().map(|n| n.to_string()).collect(),
                },
            )),
        });
    }
    r
}
