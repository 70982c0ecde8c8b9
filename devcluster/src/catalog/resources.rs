//! The registry of served resources: built-in kinds plus whatever CRDs define.
//!
//! Routing, discovery documents and storage all resolve a URL's (group, version, plural) here, so
//! a CRD becomes servable the moment it is registered.

use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Where a resource's scale subresource reads and writes replicas.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScalePaths {
    /// Dotted path of the desired replicas, e.g. `spec.replicas`.
    pub(crate) spec_replicas: String,
    /// Dotted path of the observed replicas, e.g. `status.replicas`.
    pub(crate) status_replicas: String,
    /// Dotted path of the serialized label selector in status, if any.
    pub(crate) label_selector: Option<String>,
}

/// A (group, plural) pair: the unit of storage, shared by every served version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct GroupResource {
    /// API group, empty for core.
    pub(crate) group: String,
    /// Plural resource name.
    pub(crate) resource: String,
}

impl GroupResource {
    /// Build from borrowed parts.
    pub(crate) fn new(group: &str, resource: &str) -> Self {
        GroupResource {
            group: group.to_string(),
            resource: resource.to_string(),
        }
    }
}

/// Everything the server needs to know about one served resource version.
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    /// API group, empty for core.
    pub(crate) group: String,
    /// Served version.
    pub(crate) version: String,
    /// Plural name used in URLs.
    pub(crate) plural: String,
    /// Singular name.
    pub(crate) singular: String,
    /// Kind.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub(crate) namespaced: bool,
    /// kubectl short names.
    pub(crate) short_names: Vec<String>,
    /// Categories such as `all`.
    pub(crate) categories: Vec<String>,
    /// Whether a status subresource splits spec and status writes.
    pub(crate) status: bool,
    /// The scale subresource, if any.
    pub(crate) scale: Option<ScalePaths>,
    /// Built-in kinds accept strategic merge patches; custom resources answer 415.
    pub builtin: bool,
    /// Whether writes maintain `metadata.generation`.
    pub(crate) generation: bool,
    /// Whether unconditional updates (PUT without resourceVersion) are allowed.
    pub(crate) unconditional_update: bool,
    /// The CRD's structural schema for this version.
    pub(crate) schema: Option<Value>,
    /// The CRD's additionalPrinterColumns for this version.
    pub(crate) printer_columns: Vec<Value>,
    /// The CRD that defines this resource.
    pub(crate) crd: Option<String>,
    /// A virtual kind that only answers `create` and stores nothing (TokenReview,
    /// SubjectAccessReview, ...).
    pub(crate) create_only: bool,
}

impl ResourceInfo {
    /// `group/version`, or `version` for core.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The storage key shared by all versions.
    pub(crate) fn group_resource(&self) -> GroupResource {
        GroupResource::new(&self.group, &self.plural)
    }

    fn builtin(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        ResourceInfo {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            short_names: Vec::new(),
            categories: Vec::new(),
            status: false,
            scale: None,
            builtin: true,
            generation: false,
            unconditional_update: true,
            schema: None,
            printer_columns: Vec::new(),
            crd: None,
            create_only: false,
        }
    }

    fn short(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    fn with_status(mut self) -> Self {
        self.status = true;
        self
    }

    fn with_generation(mut self) -> Self {
        self.generation = true;
        self
    }

    fn with_scale(mut self) -> Self {
        self.scale = Some(ScalePaths {
            spec_replicas: "spec.replicas".into(),
            status_replicas: "status.replicas".into(),
            label_selector: Some("status.selector".into()),
        });
        self
    }

    fn in_all(mut self) -> Self {
        self.categories = vec!["all".into()];
        self
    }

    /// The discovery `APIResource` entries for this resource and its subresources.
    pub(crate) fn discovery_entries(&self) -> Vec<Value> {
        let verbs = [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ];
        let verbs: &[&str] = if self.create_only {
            &["create"]
        } else {
            &verbs
        };
        let mut main = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        let mut out = vec![main];
        if self.status {
            out.push(json!({"name": format!("{}/status", self.plural), "singularName": "", "namespaced": self.namespaced, "kind": self.kind, "verbs": ["get", "patch", "update"]}));
        }
        if self.scale.is_some() {
            out.push(json!({"name": format!("{}/scale", self.plural), "singularName": "", "namespaced": self.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
        if self.group.is_empty() && self.plural == "serviceaccounts" {
            out.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
        }
        out
    }
}

/// [`BUILTIN`] flags: a status subresource.
const STATUS: u8 = 1;
/// A scale subresource at `spec.replicas` / `status.replicas` / `status.selector`.
const SCALE: u8 = 1 << 1;
/// Writes maintain `metadata.generation`.
const GENERATION: u8 = 1 << 2;
/// In the `all` category.
const IN_ALL: u8 = 1 << 3;
/// A virtual kind that only answers `create` (the review APIs).
const CREATE_ONLY: u8 = 1 << 4;

/// One row of [`BUILTIN`]: group, plural, kind, namespaced, kubectl short names, flags.
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    u8,
);

/// The built-in kinds devcluster serves from the start, all at `v1`.
#[rustfmt::skip]
const BUILTIN: &[Builtin] = &[
    ("", "namespaces", "Namespace", false, &["ns"], STATUS),
    ("", "configmaps", "ConfigMap", true, &["cm"], 0),
    ("", "secrets", "Secret", true, &[], 0),
    ("", "serviceaccounts", "ServiceAccount", true, &["sa"], 0),
    ("", "pods", "Pod", true, &["po"], STATUS | GENERATION | IN_ALL),
    ("", "services", "Service", true, &["svc"], STATUS | IN_ALL),
    ("", "events", "Event", true, &["ev"], 0),
    ("events.k8s.io", "events", "Event", true, &["ev"], 0),
    ("apps", "deployments", "Deployment", true, &["deploy"], STATUS | SCALE | GENERATION | IN_ALL),
    ("apps", "replicasets", "ReplicaSet", true, &["rs"], STATUS | SCALE | GENERATION | IN_ALL),
    ("apps", "statefulsets", "StatefulSet", true, &["sts"], STATUS | SCALE | GENERATION | IN_ALL),
    ("apps", "daemonsets", "DaemonSet", true, &["ds"], STATUS | GENERATION | IN_ALL),
    ("coordination.k8s.io", "leases", "Lease", true, &[], 0),
    ("", "resourcequotas", "ResourceQuota", true, &["quota"], STATUS),
    ("batch", "jobs", "Job", true, &[], STATUS | GENERATION | IN_ALL),
    ("batch", "cronjobs", "CronJob", true, &["cj"], STATUS | GENERATION | IN_ALL),
    ("networking.k8s.io", "ingresses", "Ingress", true, &["ing"], STATUS | GENERATION),
    ("scheduling.k8s.io", "priorityclasses", "PriorityClass", false, &["pc"], 0),
    ("policy", "poddisruptionbudgets", "PodDisruptionBudget", true, &["pdb"], STATUS | GENERATION),
    ("networking.k8s.io", "networkpolicies", "NetworkPolicy", true, &["netpol"], GENERATION),
    ("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", false, &["crd", "crds"], STATUS | GENERATION),
    ("rbac.authorization.k8s.io", "roles", "Role", true, &[], 0),
    ("rbac.authorization.k8s.io", "rolebindings", "RoleBinding", true, &[], 0),
    ("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", false, &[], 0),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", false, &[], 0),
    ("authentication.k8s.io", "tokenreviews", "TokenReview", false, &[], CREATE_ONLY),
    ("authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview", false, &[], CREATE_ONLY),
    ("authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview", false, &[], CREATE_ONLY),
    ("authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview", false, &[], CREATE_ONLY),
    ("authorization.k8s.io", "localsubjectaccessreviews", "LocalSubjectAccessReview", true, &[], CREATE_ONLY),
];

/// All served resources, looked up by URL parts or by storage key.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    by_gvr: BTreeMap<(String, String, String), ResourceInfo>,
}

impl Registry {
    /// The built-in kinds devcluster serves from the start.
    pub fn builtin() -> Self {
        let mut r = Registry::default();
        for &(group, plural, kind, namespaced, short, flags) in BUILTIN {
            let mut info =
                ResourceInfo::builtin(group, "v1", plural, kind, namespaced).short(short);
            let has = |flag: u8| flags & flag != 0;
            if has(STATUS) {
                info = info.with_status();
            }
            if has(SCALE) {
                info = info.with_scale();
            }
            if has(GENERATION) {
                info = info.with_generation();
            }
            if has(IN_ALL) {
                info = info.in_all();
            }
            info.create_only = has(CREATE_ONLY);
            r.insert(info);
        }
        r
    }

    /// Add or replace one resource version.
    pub(crate) fn insert(&mut self, info: ResourceInfo) {
        self.by_gvr.insert(
            (
                info.group.clone(),
                info.version.clone(),
                info.plural.clone(),
            ),
            info,
        );
    }

    /// Remove every version a CRD defined.
    pub(crate) fn remove_crd(&mut self, crd_name: &str) {
        self.by_gvr
            .retain(|_, info| info.crd.as_deref() != Some(crd_name));
    }

    /// Resolve a URL's group, version and plural.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceInfo> {
        self.by_gvr
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
    }

    /// Every served resource version.
    pub fn all(&self) -> impl Iterator<Item = &ResourceInfo> {
        self.by_gvr.values()
    }

    /// Served groups with their versions, in a stable order (core excluded); the first version is preferred.
    pub(crate) fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for info in self.by_gvr.values().filter(|i| !i.group.is_empty()) {
            let versions = groups.entry(info.group.clone()).or_default();
            if !versions.contains(&info.version) {
                versions.push(info.version.clone());
            }
        }
        for versions in groups.values_mut() {
            versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        groups.into_iter().collect()
    }

    /// Discovery `APIResourceList` for one group version.
    pub(crate) fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let entries: Vec<Value> = self
            .by_gvr
            .values()
            .filter(|i| i.group == group && i.version == version)
            .flat_map(|i| i.discovery_entries())
            .collect();
        if entries.is_empty() {
            return None;
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": entries}),
        )
    }
}

/// Kubernetes version priority: GA > beta > alpha, higher numbers first.
fn version_priority(v: &str) -> (u8, u32, u32) {
    let rest = v.strip_prefix('v').unwrap_or(v);
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (stage, minor) = if let Some(n) = tail.strip_prefix("beta") {
        (2, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n.parse().unwrap_or(0))
    } else if tail.is_empty() {
        (3, 0)
    } else {
        (0, 0)
    };
    (stage, major, minor)
}

/// Register every served version of a CRD object; returns the accepted names or an error message.
pub(crate) fn infos_from_crd(crd: &Value) -> Result<Vec<ResourceInfo>, String> {
    let spec = crd.get("spec").ok_or("spec is required")?;
    let group = spec
        .get("group")
        .and_then(Value::as_str)
        .ok_or("spec.group is required")?;
    let names = spec.get("names").ok_or("spec.names is required")?;
    let plural = names
        .get("plural")
        .and_then(Value::as_str)
        .ok_or("spec.names.plural is required")?;
    let kind = names
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("spec.names.kind is required")?;
    let singular = names
        .get("singular")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let namespaced = match spec.get("scope").and_then(Value::as_str) {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        _ => return Err("spec.scope must be Namespaced or Cluster".into()),
    };
    let crd_name = crd
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if crd_name != format!("{plural}.{group}") {
        return Err(format!(
            "metadata.name must be spec.names.plural+\".\"+spec.group: {plural}.{group}"
        ));
    }
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("spec.versions is required")?;
    if versions.is_empty() {
        return Err("spec.versions must have at least one version".into());
    }
    let template = ResourceInfo {
        group: group.into(),
        version: String::new(),
        plural: plural.into(),
        singular,
        kind: kind.into(),
        namespaced,
        short_names: strings(names.get("shortNames")),
        categories: strings(names.get("categories")),
        status: false,
        scale: None,
        builtin: false,
        generation: true,
        unconditional_update: false,
        schema: None,
        printer_columns: Vec::new(),
        crd: Some(crd_name.to_string()),
        create_only: false,
    };
    let mut out = Vec::new();
    for v in versions {
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or("spec.versions[].name is required")?;
        if v.get("served").and_then(Value::as_bool).unwrap_or(false) {
            out.push(served_version(&template, name, v));
        }
    }
    Ok(out)
}

/// One served version of a CRD: the CRD's names with this version's subresources, schema and
/// printer columns.
fn served_version(template: &ResourceInfo, name: &str, v: &Value) -> ResourceInfo {
    let subresources = v.get("subresources");
    let scale = subresources
        .and_then(|s| s.get("scale"))
        .map(|s| ScalePaths {
            spec_replicas: trim_path(s.get("specReplicasPath"))
                .unwrap_or_else(|| "spec.replicas".into()),
            status_replicas: trim_path(s.get("statusReplicasPath"))
                .unwrap_or_else(|| "status.replicas".into()),
            label_selector: trim_path(s.get("labelSelectorPath")),
        });
    ResourceInfo {
        version: name.into(),
        status: subresources.and_then(|s| s.get("status")).is_some(),
        scale,
        schema: v.pointer("/schema/openAPIV3Schema").cloned(),
        printer_columns: v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        ..template.clone()
    }
}

/// A JSON array's strings (none when absent).
fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn trim_path(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str)
        .map(|p| p.trim_start_matches('.').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_ga_first() {
        let mut v = vec!["v1alpha1", "v1", "v2beta1", "v1beta2"];
        v.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(v, vec!["v1", "v2beta1", "v1beta2", "v1alpha1"]);
    }

    #[test]
    fn crd_name_must_match_names() {
        let crd = json!({"metadata": {"name": "wrong"}, "spec": {"group": "a.io", "scope": "Namespaced",
            "names": {"plural": "foos", "kind": "Foo"}, "versions": [{"name": "v1", "served": true, "storage": true}]}});
        assert!(infos_from_crd(&crd).is_err());
        let mut ok = crd.clone();
        ok["metadata"]["name"] = json!("foos.a.io");
        let infos = infos_from_crd(&ok).expect("valid crd");
        assert_eq!(infos.len(), 1);
        assert_eq!(infos[0].api_version(), "a.io/v1");
        assert!(!infos[0].builtin);
    }
}
