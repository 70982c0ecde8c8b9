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

    fn review(group: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        let mut info = Self::builtin(group, "v1", plural, kind, namespaced);
        info.create_only = true;
        info
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

/// All served resources, looked up by URL parts or by storage key.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    by_gvr: BTreeMap<(String, String, String), ResourceInfo>,
}

impl Registry {
    /// The built-in kinds devcluster serves from the start.
    pub fn builtin() -> Self {
        let mut r = Registry::default();
        let core = [
            ResourceInfo::builtin("", "v1", "namespaces", "Namespace", false)
                .short(&["ns"])
                .with_status(),
            ResourceInfo::builtin("", "v1", "configmaps", "ConfigMap", true).short(&["cm"]),
            ResourceInfo::builtin("", "v1", "secrets", "Secret", true),
            ResourceInfo::builtin("", "v1", "serviceaccounts", "ServiceAccount", true)
                .short(&["sa"]),
            ResourceInfo::builtin("", "v1", "pods", "Pod", true)
                .short(&["po"])
                .with_status()
                .with_generation()
                .in_all(),
            ResourceInfo::builtin("", "v1", "services", "Service", true)
                .short(&["svc"])
                .with_status()
                .in_all(),
            ResourceInfo::builtin("", "v1", "events", "Event", true).short(&["ev"]),
            ResourceInfo::builtin("events.k8s.io", "v1", "events", "Event", true).short(&["ev"]),
            ResourceInfo::builtin("apps", "v1", "deployments", "Deployment", true)
                .short(&["deploy"])
                .with_status()
                .with_scale()
                .with_generation()
                .in_all(),
            ResourceInfo::builtin("apps", "v1", "replicasets", "ReplicaSet", true)
                .short(&["rs"])
                .with_status()
                .with_scale()
                .with_generation()
                .in_all(),
            ResourceInfo::builtin("apps", "v1", "statefulsets", "StatefulSet", true)
                .short(&["sts"])
                .with_status()
                .with_scale()
                .with_generation()
                .in_all(),
            ResourceInfo::builtin("apps", "v1", "daemonsets", "DaemonSet", true)
                .short(&["ds"])
                .with_status()
                .with_generation()
                .in_all(),
            ResourceInfo::builtin("coordination.k8s.io", "v1", "leases", "Lease", true),
            ResourceInfo::builtin("", "v1", "resourcequotas", "ResourceQuota", true)
                .short(&["quota"])
                .with_status(),
            ResourceInfo::builtin("batch", "v1", "jobs", "Job", true)
                .with_status()
                .with_generation()
                .in_all(),
            ResourceInfo::builtin("batch", "v1", "cronjobs", "CronJob", true)
                .short(&["cj"])
                .with_status()
                .with_generation()
                .in_all(),
            ResourceInfo::builtin("networking.k8s.io", "v1", "ingresses", "Ingress", true)
                .short(&["ing"])
                .with_status()
                .with_generation(),
            ResourceInfo::builtin(
                "scheduling.k8s.io",
                "v1",
                "priorityclasses",
                "PriorityClass",
                false,
            )
            .short(&["pc"]),
            ResourceInfo::builtin(
                "policy",
                "v1",
                "poddisruptionbudgets",
                "PodDisruptionBudget",
                true,
            )
            .short(&["pdb"])
            .with_status()
            .with_generation(),
            ResourceInfo::builtin(
                "networking.k8s.io",
                "v1",
                "networkpolicies",
                "NetworkPolicy",
                true,
            )
            .short(&["netpol"])
            .with_generation(),
            ResourceInfo::builtin(
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                "CustomResourceDefinition",
                false,
            )
            .short(&["crd", "crds"])
            .with_status()
            .with_generation(),
            ResourceInfo::builtin("rbac.authorization.k8s.io", "v1", "roles", "Role", true),
            ResourceInfo::builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "rolebindings",
                "RoleBinding",
                true,
            ),
            ResourceInfo::builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "clusterroles",
                "ClusterRole",
                false,
            ),
            ResourceInfo::builtin(
                "rbac.authorization.k8s.io",
                "v1",
                "clusterrolebindings",
                "ClusterRoleBinding",
                false,
            ),
            ResourceInfo::review(
                "authentication.k8s.io",
                "tokenreviews",
                "TokenReview",
                false,
            ),
            ResourceInfo::review(
                "authentication.k8s.io",
                "selfsubjectreviews",
                "SelfSubjectReview",
                false,
            ),
            ResourceInfo::review(
                "authorization.k8s.io",
                "subjectaccessreviews",
                "SubjectAccessReview",
                false,
            ),
            ResourceInfo::review(
                "authorization.k8s.io",
                "selfsubjectaccessreviews",
                "SelfSubjectAccessReview",
                false,
            ),
            ResourceInfo::review(
                "authorization.k8s.io",
                "localsubjectaccessreviews",
                "LocalSubjectAccessReview",
                true,
            ),
        ];
        for info in core {
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
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("spec.versions is required")?;
    if versions.is_empty() {
        return Err("spec.versions must have at least one version".into());
    }
    let mut out = Vec::new();
    for v in versions {
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or("spec.versions[].name is required")?;
        if !v.get("served").and_then(Value::as_bool).unwrap_or(false) {
            continue;
        }
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
        out.push(ResourceInfo {
            group: group.into(),
            version: name.into(),
            plural: plural.into(),
            singular: singular.clone(),
            kind: kind.into(),
            namespaced,
            short_names: strings(names.get("shortNames")),
            categories: strings(names.get("categories")),
            status: subresources.and_then(|s| s.get("status")).is_some(),
            scale,
            builtin: false,
            generation: true,
            unconditional_update: false,
            schema: v.pointer("/schema/openAPIV3Schema").cloned(),
            printer_columns: v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            crd: Some(crd_name.to_string()),
            create_only: false,
        });
    }
    Ok(out)
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
