//! The OpenAPI schemas of the built-in kinds, generated once from k8s-openapi's `schemars`
//! implementations, and the `/openapi/v2` and `/openapi/v3` documents served from them plus the
//! CRDs' structural schemas.
//!
//! The same definitions drive request decoding checks (admission's `fieldcheck`), so what kubectl
//! explains and validates is what the server enforces.

use crate::catalog::resources::{Registry, ResourceInfo};
use parking_lot::Mutex;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

/// Where definitions live in the generated schemas; v3 documents rewrite it to
/// `#/components/schemas/`.
pub(crate) const DEFINITIONS: &str = "#/definitions/";
const V3_DEFINITIONS: &str = "#/components/schemas/";

/// The schemas of every built-in kind devcluster serves.
pub(crate) struct Catalog {
    /// Every definition, by its OpenAPI name (`io.k8s.api.apps.v1.Deployment`).
    pub(crate) definitions: Map<String, Value>,
    /// (apiVersion, kind) → definition name of the kind's root schema.
    roots: HashMap<(String, String), String>,
}

/// The catalog, built on first use and shared by every request.
pub(crate) static CATALOG: LazyLock<Catalog> = LazyLock::new(Catalog::build);

/// Registers one k8s-openapi type as the schema of a kind.
macro_rules! kinds {
    ($gen:ident, $roots:ident, $( $api_version:literal $kind:literal => $ty:ty ),* $(,)?) => {
        $(
            let schema = $gen.subschema_for::<$ty>();
            if let Some(name) = schema
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix(DEFINITIONS))
            {
                $roots.insert(($api_version.to_string(), $kind.to_string()), name.to_string());
            }
        )*
    };
}

impl Catalog {
    fn build() -> Self {
        use k8s_openapi::api::{
            apps::v1 as apps, authentication::v1 as authn, authorization::v1 as authz,
            autoscaling::v1 as autoscaling, batch::v1 as batch, coordination::v1 as coordination,
            core::v1 as core, events::v1 as events, networking::v1 as networking,
            policy::v1 as policy, rbac::v1 as rbac, scheduling::v1 as scheduling,
        };
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
        let mut generator = SchemaSettings::draft07().into_generator();
        let mut roots = HashMap::new();
        kinds!(generator, roots,
            "v1" "Namespace" => core::Namespace,
            "v1" "ConfigMap" => core::ConfigMap,
            "v1" "Secret" => core::Secret,
            "v1" "ServiceAccount" => core::ServiceAccount,
            "v1" "Pod" => core::Pod,
            "v1" "Service" => core::Service,
            "v1" "Event" => core::Event,
            "v1" "ResourceQuota" => core::ResourceQuota,
            "events.k8s.io/v1" "Event" => events::Event,
            "apps/v1" "Deployment" => apps::Deployment,
            "apps/v1" "ReplicaSet" => apps::ReplicaSet,
            "apps/v1" "StatefulSet" => apps::StatefulSet,
            "apps/v1" "DaemonSet" => apps::DaemonSet,
            "batch/v1" "Job" => batch::Job,
            "batch/v1" "CronJob" => batch::CronJob,
            "coordination.k8s.io/v1" "Lease" => coordination::Lease,
            "policy/v1" "PodDisruptionBudget" => policy::PodDisruptionBudget,
            "networking.k8s.io/v1" "NetworkPolicy" => networking::NetworkPolicy,
            "networking.k8s.io/v1" "Ingress" => networking::Ingress,
            "scheduling.k8s.io/v1" "PriorityClass" => scheduling::PriorityClass,
            "autoscaling/v1" "Scale" => autoscaling::Scale,
            "apiextensions.k8s.io/v1" "CustomResourceDefinition" => apiext::CustomResourceDefinition,
            "rbac.authorization.k8s.io/v1" "Role" => rbac::Role,
            "rbac.authorization.k8s.io/v1" "RoleBinding" => rbac::RoleBinding,
            "rbac.authorization.k8s.io/v1" "ClusterRole" => rbac::ClusterRole,
            "rbac.authorization.k8s.io/v1" "ClusterRoleBinding" => rbac::ClusterRoleBinding,
            "authentication.k8s.io/v1" "TokenRequest" => authn::TokenRequest,
            "authentication.k8s.io/v1" "TokenReview" => authn::TokenReview,
            "authentication.k8s.io/v1" "SelfSubjectReview" => authn::SelfSubjectReview,
            "authorization.k8s.io/v1" "SubjectAccessReview" => authz::SubjectAccessReview,
            "authorization.k8s.io/v1" "SelfSubjectAccessReview" => authz::SelfSubjectAccessReview,
            "authorization.k8s.io/v1" "LocalSubjectAccessReview" => authz::LocalSubjectAccessReview,
        );
        let mut definitions = generator.take_definitions(true);
        // kubectl explain finds a kind's schema by this extension, as in kube-apiserver's
        // documents.
        for ((api_version, kind), name) in &roots {
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            if let Some(Value::Object(s)) = definitions.get_mut(name) {
                s.insert(
                    "x-kubernetes-group-version-kind".into(),
                    json!([{"group": group, "version": version, "kind": kind}]),
                );
            }
        }
        Catalog { definitions, roots }
    }

    /// The root schema of a built-in kind, if devcluster knows it.
    pub(crate) fn root(&self, api_version: &str, kind: &str) -> Option<(&str, &Value)> {
        let name = self
            .roots
            .get(&(api_version.to_string(), kind.to_string()))?;
        Some((name.as_str(), self.definitions.get(name)?))
    }

    /// Every kind's (apiVersion, kind) with the definition name of its root schema.
    pub(crate) fn root_names(&self) -> impl Iterator<Item = ((String, String), String)> + '_ {
        self.roots.iter().map(|(k, n)| (k.clone(), n.clone()))
    }

    /// Follows `$ref` (bare, or wrapped in a one-element `allOf` when the reference carries a
    /// description) to the definition it names, with that name.
    pub(crate) fn resolve<'a>(&'a self, schema: &'a Value) -> (Option<&'a str>, &'a Value) {
        let reference = schema.get("$ref").or_else(|| {
            schema
                .get("allOf")
                .and_then(Value::as_array)
                .filter(|a| a.len() == 1)
                .and_then(|a| a[0].get("$ref"))
        });
        match reference
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix(DEFINITIONS))
        {
            Some(name) => match self.definitions.get(name) {
                Some(s) => (Some(name), s),
                None => (None, schema),
            },
            None => (None, schema),
        }
    }

    /// Every definition reachable from the given roots (by `$ref`), for one document.
    fn closure(&self, roots: impl IntoIterator<Item = String>) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        let mut todo: Vec<String> = roots.into_iter().collect();
        while let Some(name) = todo.pop() {
            if out.contains_key(&name) {
                continue;
            }
            let Some(s) = self.definitions.get(&name) else {
                continue;
            };
            collect_refs(s, &mut todo);
            out.insert(name, s.clone());
        }
        out
    }

    /// The roots of one group version's built-in kinds.
    fn roots_of(&self, api_version: &str) -> Vec<String> {
        self.roots
            .iter()
            .filter(|((av, _), _)| av == api_version)
            .map(|(_, n)| n.clone())
            .collect()
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(name) = m
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix(DEFINITIONS))
            {
                out.push(name.to_string());
            }
            m.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// The definition name kube-apiserver gives a custom resource kind: the reversed group, then
/// version and kind (`dev.ctrlhub.v1.Widget`).
fn crd_definition_name(info: &ResourceInfo) -> String {
    let group: Vec<&str> = info.group.split('.').rev().collect();
    format!("{}.{}.{}", group.join("."), info.version, info.kind)
}

/// A CRD's structural schema as an OpenAPI definition, with the standard fields a real server
/// adds (apiVersion, kind, metadata) and the GVK extension.
fn crd_definition(info: &ResourceInfo) -> Value {
    let mut s = info
        .schema
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    if let Some(m) = s.as_object_mut() {
        let props = m
            .entry("properties")
            .or_insert_with(|| json!({}))
            .as_object_mut();
        if let Some(props) = props {
            props.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
            props.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
            props.insert(
                "metadata".into(),
                json!({"$ref": format!("{DEFINITIONS}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), "description": "Standard object's metadata."}),
            );
        }
        m.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([{"group": info.group, "version": info.version, "kind": info.kind}]),
        );
    }
    s
}

/// The URL path of a resource's objects, as the documents list them.
fn object_path(info: &ResourceInfo) -> String {
    let prefix = if info.group.is_empty() {
        "/api/v1".to_string()
    } else {
        format!("/apis/{}/{}", info.group, info.version)
    };
    if info.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", info.plural)
    } else {
        format!("{prefix}/{}/{{name}}", info.plural)
    }
}

/// The paths of one resource: enough for clients that look for a kind's operations (kubectl
/// checks a PATCH operation's `fieldValidation` parameter to know the server validates).
fn paths_for(info: &ResourceInfo, schema_ref: &str) -> (String, Value) {
    let gvk = json!({"group": info.group, "version": info.version, "kind": info.kind});
    let op = |verb: &str| {
        json!({
            "operationId": format!("{verb}{}", info.kind),
            "x-kubernetes-action": verb,
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [
                {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            ],
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": schema_ref}}}}},
        })
    };
    (
        object_path(info),
        json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
    )
}

/// The resources served in one group version, with each one's definition name.
fn documented<'a>(
    infos: impl Iterator<Item = &'a ResourceInfo>,
    api_version: &str,
) -> Vec<(&'a ResourceInfo, String)> {
    infos
        .filter(|i| i.api_version() == api_version && !i.create_only)
        .filter_map(|i| {
            if i.builtin {
                CATALOG
                    .root(&i.api_version(), &i.kind)
                    .map(|(n, _)| (i, n.to_string()))
            } else {
                Some((i, crd_definition_name(i)))
            }
        })
        .collect()
}

/// One group version's OpenAPI v3 document (`/openapi/v3/apis/{group}/{version}`).
pub(crate) fn v3_document(registry: &Registry, api_version: &str) -> Value {
    let resources = documented(registry.all(), api_version);
    let builtin_roots = resources
        .iter()
        .filter(|(i, _)| i.builtin)
        .map(|(_, n)| n.clone());
    let mut schemas = CATALOG.closure(builtin_roots.chain(CATALOG.roots_of(api_version)).chain(
        std::iter::once("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta".to_string()),
    ));
    let mut paths = Map::new();
    for (info, name) in &resources {
        if !info.builtin {
            schemas.insert(name.clone(), crd_definition(info));
        }
        let (path, item) = paths_for(info, &format!("{V3_DEFINITIONS}{name}"));
        paths.insert(path, item);
    }
    let doc = json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    });
    rewrite_refs(doc, DEFINITIONS, V3_DEFINITIONS)
}

/// The Swagger 2.0 document (`/openapi/v2`) of every served kind.
pub(crate) fn v2_document(registry: &Registry) -> Value {
    let mut definitions: BTreeMap<String, Value> = CATALOG
        .definitions
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut paths = Map::new();
    for info in registry.all().filter(|i| !i.create_only) {
        let name = if info.builtin {
            match CATALOG.root(&info.api_version(), &info.kind) {
                Some((n, _)) => n.to_string(),
                None => continue,
            }
        } else {
            let n = crd_definition_name(info);
            definitions.insert(n.clone(), crd_definition(info));
            n
        };
        let (path, item) = paths_for(info, &format!("{DEFINITIONS}{name}"));
        paths.insert(path, item);
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "definitions": definitions,
    })
}

fn rewrite_refs(v: Value, from: &str, to: &str) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("$ref", Value::String(s)) => match s.strip_prefix(from) {
                            Some(rest) => Value::String(format!("{to}{rest}")),
                            None => Value::String(s),
                        },
                        (_, v) => rewrite_refs(v, from, to),
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(|v| rewrite_refs(v, from, to)).collect()),
        other => other,
    }
}

/// A rendered v3 document and its ETag.
#[derive(Clone)]
pub(crate) struct Rendered {
    /// The JSON bytes.
    pub(crate) body: Arc<Vec<u8>>,
    /// Upper-case hex SHA-512 of `body`.
    pub(crate) etag: String,
}

/// Rendered v3 documents by apiVersion, with the fingerprint of the resources they were
/// rendered from: built-in documents render once, CRD documents again when their CRD changes.
static V3_CACHE: LazyLock<Mutex<HashMap<String, (String, Rendered)>>> =
    LazyLock::new(Default::default);

/// What a group version's document depends on besides the fixed built-in schemas.
fn fingerprint<'a>(infos: impl Iterator<Item = &'a ResourceInfo>, api_version: &str) -> String {
    infos
        .filter(|i| i.api_version() == api_version)
        .map(|i| {
            let schema = if i.builtin {
                String::new()
            } else {
                format!("{:?}", i.schema)
            };
            format!("{}|{}|{}|{schema};", i.plural, i.kind, i.namespaced)
        })
        .collect()
}

/// The v3 document of one group version, rendered once per change.
pub(crate) fn v3_rendered(registry: &Registry, api_version: &str) -> Rendered {
    let print = fingerprint(registry.all(), api_version);
    if let Some((p, r)) = V3_CACHE.lock().get(api_version)
        && *p == print
    {
        return r.clone();
    }
    let body = v3_document(registry, api_version).to_string().into_bytes();
    let rendered = Rendered {
        etag: etag(&body),
        body: Arc::new(body),
    };
    V3_CACHE
        .lock()
        .insert(api_version.to_string(), (print, rendered.clone()));
    rendered
}

/// The URL path of a group version's v3 document, relative to `/openapi/v3/`.
pub(crate) fn v3_path(api_version: &str) -> String {
    if api_version.contains('/') {
        format!("apis/{api_version}")
    } else {
        format!("api/{api_version}")
    }
}

/// `/openapi/v3`: each served group version with the hashed URL of its document.
pub(crate) fn v3_index(registry: &Registry) -> Value {
    let mut versions: Vec<String> = registry
        .all()
        .filter(|i| !i.create_only)
        .map(ResourceInfo::api_version)
        .collect();
    versions.sort();
    versions.dedup();
    let mut paths = Map::new();
    for av in versions {
        let rendered = v3_rendered(registry, &av);
        let path = v3_path(&av);
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", rendered.etag)}),
        );
    }
    json!({"paths": paths})
}

/// The hex SHA-512 of a document, its ETag and the `hash` of its URL in the v3 index.
pub(crate) fn etag(body: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA512, body);
    digest.as_ref().iter().map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_schema_knows_replicas_and_its_gvk() {
        let (name, root) = CATALOG.root("apps/v1", "Deployment").expect("known");
        assert_eq!(name, "io.k8s.api.apps.v1.Deployment");
        assert_eq!(
            root["x-kubernetes-group-version-kind"][0]["kind"],
            "Deployment"
        );
        let (_, spec) = CATALOG.resolve(&root["properties"]["spec"]);
        assert_eq!(spec["properties"]["replicas"]["type"], "integer");
    }

    #[test]
    fn v3_documents_hold_the_closure_with_v3_refs() {
        let registry = crate::catalog::resources::Registry::builtin();
        let doc = v3_document(&registry, "apps/v1");
        let schemas = &doc["components"]["schemas"];
        assert!(schemas.get("io.k8s.api.apps.v1.Deployment").is_some());
        assert!(schemas.get("io.k8s.api.core.v1.PodSpec").is_some());
        let text = doc.to_string();
        assert!(!text.contains(DEFINITIONS), "v2 refs left in a v3 document");
        assert!(
            doc["paths"]
                .get("/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
                .is_some()
        );
    }
}
