//! Authorization: what a request does (its attributes, derived from the URL as kube-apiserver's
//! RequestInfo does) and whether RBAC allows it.
//!
//! The authorizer reads Roles, ClusterRoles, RoleBindings and ClusterRoleBindings from the live
//! store on every decision, so a new binding takes effect on the next request and a deleted one
//! revokes at once. `system:masters` bypasses it. Besides stored objects, the bootstrap policy
//! every cluster has is built in: authenticated users may read discovery (`system:discovery`,
//! `system:public-info-viewer`) and ask about themselves (`system:basic-user`).

use crate::auth::authn::{AUTHENTICATED, Identity};
use crate::catalog::resources::GroupResource;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::storage::store::State;
use axum::http::Method;
use serde_json::Value;
use std::collections::HashMap;

/// A request against a resource.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct ResourceAttributes {
    /// Namespace; empty for cluster-scoped requests and all-namespace lists.
    pub(crate) namespace: String,
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub(crate) verb: String,
    /// API group, empty for core.
    pub(crate) group: String,
    /// Plural resource.
    pub(crate) resource: String,
    /// Subresource, e.g. `status`.
    pub(crate) subresource: String,
    /// Object name, when the request names one.
    pub(crate) name: String,
}

/// What a request asks to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Attributes {
    /// A resource request.
    Resource(ResourceAttributes),
    /// Any other path (discovery, `/version`, ...), with the lower-case HTTP verb.
    NonResource {
        /// URL path.
        path: String,
        /// `get`, `post`, ...
        verb: String,
    },
}

/// The authorizer's answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Allowed, with the rule's provenance (`RBAC: allowed by ...`).
    Allow(String),
    /// No rule allows it; the reason is empty unless bindings referred to missing roles.
    Deny(String),
}

impl Decision {
    /// Whether the request may proceed.
    pub(crate) fn allowed(&self) -> bool {
        matches!(self, Decision::Allow(_))
    }

    /// The reason text.
    pub(crate) fn reason(&self) -> &str {
        match self {
            Decision::Allow(r) | Decision::Deny(r) => r,
        }
    }
}

impl Attributes {
    /// The attributes of an HTTP request, as kube-apiserver's RequestInfoFactory derives them.
    pub(crate) fn from_request(
        method: &Method,
        path: &str,
        query: &HashMap<String, String>,
    ) -> Self {
        let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let non_resource = || Attributes::NonResource {
            path: path.to_string(),
            verb: method.as_str().to_ascii_lowercase(),
        };
        let (group, rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
            ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
            _ => return non_resource(),
        };
        let watch = query
            .get("watch")
            .is_some_and(|v| matches!(v.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True"));
        let mut verb = match *method {
            Method::GET | Method::HEAD if watch => "watch",
            Method::GET | Method::HEAD => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        };
        let mut namespace = "";
        let mut rest = rest;
        if rest[0] == "namespaces" && rest.len() > 1 {
            namespace = rest[1];
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        let resource = rest.first().copied().unwrap_or_default();
        let name = rest.get(1).copied().unwrap_or_default();
        let subresource = rest.get(2).copied().unwrap_or_default();
        let mut name = name.to_string();
        if name.is_empty() {
            verb = match verb {
                "get" => "list",
                "delete" => "deletecollection",
                v => v,
            };
            // A list or watch pinned to one name is authorized against that name, so
            // `resourceNames` rules cover informers on a single object.
            if matches!(verb, "list" | "watch")
                && let Some(sel) = query.get("fieldSelector")
                && let Ok(sel) = FieldSelector::parse_for(sel, group, resource)
                && let Some(pinned) = sel.pinned_name()
            {
                name = pinned.to_string();
            }
        }
        Attributes::Resource(ResourceAttributes {
            namespace: namespace.to_string(),
            verb: verb.to_string(),
            group: group.to_string(),
            resource: resource.to_string(),
            subresource: subresource.to_string(),
            name,
        })
    }

    /// The 403 kube-apiserver answers when `user` may not do this.
    pub(crate) fn forbidden(&self, user: &Identity, reason: &str) -> ApiError {
        let who = &user.username;
        let (what, gr, name) = match self {
            Attributes::NonResource { path, verb } => (
                format!("User {who:?} cannot {verb} path {path:?}"),
                None,
                "",
            ),
            Attributes::Resource(r) => {
                let mut resource = r.resource.clone();
                if !r.subresource.is_empty() {
                    resource = format!("{resource}/{}", r.subresource);
                }
                let scope = if r.namespace.is_empty() {
                    "at the cluster scope".to_string()
                } else {
                    format!("in the namespace {:?}", r.namespace)
                };
                (
                    format!(
                        "User {who:?} cannot {} resource {resource:?} in API group {:?} {scope}",
                        r.verb, r.group
                    ),
                    Some((r.group.as_str(), r.resource.as_str())),
                    r.name.as_str(),
                )
            }
        };
        let what = if reason.is_empty() {
            what
        } else {
            format!("{what}: {reason}")
        };
        let message = match gr {
            None => format!("forbidden: {what}"),
            Some((group, resource)) => {
                let qualified = if group.is_empty() {
                    resource.to_string()
                } else {
                    format!("{resource}.{group}")
                };
                if name.is_empty() {
                    format!("{qualified} is forbidden: {what}")
                } else {
                    format!("{qualified} {name:?} is forbidden: {what}")
                }
            }
        };
        let mut e = ApiError::forbidden(message);
        if let Some((group, resource)) = gr {
            e.details = Some(Box::new(
                serde_json::json!({"name": name, "group": group, "kind": resource}),
            ));
        }
        e
    }
}

/// Paths every authenticated user may GET (Kubernetes' `system:discovery` and
/// `system:public-info-viewer` ClusterRoles).
const DISCOVERY_URLS: &[&str] = &[
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/readyz",
    "/version",
    "/version/",
    "/openapi",
    "/openapi/*",
];

/// Decide whether `user` may do `attrs`, reading RBAC objects from `state`.
pub(crate) fn authorize(state: &State, user: &Identity, attrs: &Attributes) -> Decision {
    if user.is_master() {
        return Decision::Allow(String::new());
    }
    if let Some(reason) = bootstrap_policy(user, attrs) {
        return Decision::Allow(reason);
    }
    let namespace = match attrs {
        Attributes::Resource(r) => r.namespace.as_str(),
        Attributes::NonResource { .. } => "",
    };
    let mut errors = Vec::new();
    let rbac = |plural: &str| GroupResource::new("rbac.authorization.k8s.io", plural);
    for crb in state.objects(&rbac("clusterrolebindings"), None) {
        let Some(subject) = matching_subject(crb, "", user) else {
            continue;
        };
        match role_rules(state, crb, "") {
            Ok((role_kind, role_name, rules)) => {
                if rules.iter().any(|rule| rule_allows(rule, attrs)) {
                    return Decision::Allow(format!(
                        "RBAC: allowed by ClusterRoleBinding {:?} of {role_kind} {role_name:?} to {subject}",
                        crate::meta::name(crb)
                    ));
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if !namespace.is_empty() {
        for rb in state.objects(&rbac("rolebindings"), Some(namespace)) {
            let Some(subject) = matching_subject(rb, namespace, user) else {
                continue;
            };
            match role_rules(state, rb, namespace) {
                Ok((role_kind, role_name, rules)) => {
                    if rules.iter().any(|rule| rule_allows(rule, attrs)) {
                        return Decision::Allow(format!(
                            "RBAC: allowed by RoleBinding \"{}/{namespace}\" of {role_kind} {role_name:?} to {subject}",
                            crate::meta::name(rb)
                        ));
                    }
                }
                Err(e) => errors.push(e),
            }
        }
    }
    if errors.is_empty() {
        Decision::Deny(String::new())
    } else {
        Decision::Deny(format!("RBAC: [{}]", errors.join(", ")))
    }
}

fn bootstrap_policy(user: &Identity, attrs: &Attributes) -> Option<String> {
    if !user.groups.iter().any(|g| g == AUTHENTICATED) {
        return None;
    }
    match attrs {
        Attributes::NonResource { path, verb }
            if verb == "get" && DISCOVERY_URLS.iter().any(|u| url_matches(u, path)) =>
        {
            Some(
                "RBAC: allowed by ClusterRoleBinding \"system:discovery\" of ClusterRole \"system:discovery\" to Group \"system:authenticated\"".into(),
            )
        }
        Attributes::Resource(r)
            if r.verb == "create"
                && matches!(
                    (r.group.as_str(), r.resource.as_str()),
                    ("authorization.k8s.io", "selfsubjectaccessreviews" | "selfsubjectrulesreviews")
                        | ("authentication.k8s.io", "selfsubjectreviews")
                ) =>
        {
            Some(
                "RBAC: allowed by ClusterRoleBinding \"system:basic-user\" of ClusterRole \"system:basic-user\" to Group \"system:authenticated\"".into(),
            )
        }
        _ => None,
    }
}

fn strings(v: Option<&Value>) -> impl Iterator<Item = &str> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// The binding's first subject that is `user`, described as kube-apiserver does in reasons.
fn matching_subject(binding: &Value, binding_ns: &str, user: &Identity) -> Option<String> {
    let subjects = binding.get("subjects")?.as_array()?;
    subjects.iter().find_map(|s| {
        let field = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or_default();
        let name = field("name");
        match field("kind") {
            "User" if user.username == name => Some(format!("User {name:?}")),
            "Group" if user.groups.iter().any(|g| g == name) => Some(format!("Group {name:?}")),
            "ServiceAccount" => {
                // A RoleBinding's ServiceAccount subject defaults to the binding's namespace.
                let ns = match field("namespace") {
                    "" => binding_ns,
                    ns => ns,
                };
                (!ns.is_empty() && user.username == format!("system:serviceaccount:{ns}:{name}"))
                    .then(|| format!("ServiceAccount \"{name}/{ns}\""))
            }
            _ => None,
        }
    })
}

/// The rules of the role a binding refers to: a Role in the binding's namespace or a
/// ClusterRole (plus the rules of ClusterRoles its aggregationRule selects).
fn role_rules<'a>(
    state: &'a State,
    binding: &Value,
    binding_ns: &str,
) -> Result<(&'static str, String, Vec<&'a Value>), String> {
    let role_ref = binding.get("roleRef");
    let field = |k: &str| {
        role_ref
            .and_then(|r| r.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (kind, name) = (field("kind"), field("name"));
    let rbac = |plural: &str| GroupResource::new("rbac.authorization.k8s.io", plural);
    let rules_of = |role: &'a Value| -> Vec<&'a Value> {
        role.get("rules")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default()
    };
    match kind.as_str() {
        "Role" if !binding_ns.is_empty() => {
            let role = state
                .objects(&rbac("roles"), Some(binding_ns))
                .find(|r| crate::meta::name(r) == name)
                .ok_or_else(|| format!("role.rbac.authorization.k8s.io {name:?} not found"))?;
            Ok(("Role", name, rules_of(role)))
        }
        "ClusterRole" => {
            let role = state
                .objects(&rbac("clusterroles"), None)
                .find(|r| crate::meta::name(r) == name)
                .ok_or_else(|| {
                    format!("clusterrole.rbac.authorization.k8s.io {name:?} not found")
                })?;
            let mut rules = rules_of(role);
            let selectors: Vec<LabelSelector> = role
                .pointer("/aggregationRule/clusterRoleSelectors")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|s| LabelSelector::from_label_selector_json(s).ok())
                .collect();
            if !selectors.is_empty() {
                for other in state.objects(&rbac("clusterroles"), None) {
                    if crate::meta::name(other) != name
                        && selectors.iter().any(|s| s.matches_object(other))
                    {
                        rules.extend(rules_of(other));
                    }
                }
            }
            Ok(("ClusterRole", name, rules))
        }
        other => Err(format!("unsupported roleRef kind {other:?}")),
    }
}

fn has(list: Option<&Value>, want: &str) -> bool {
    strings(list).any(|v| v == "*" || v == want)
}

/// Whether one PolicyRule allows the request (Kubernetes' `RuleAllows`).
pub(crate) fn rule_allows(rule: &Value, attrs: &Attributes) -> bool {
    match attrs {
        Attributes::Resource(r) => {
            if !has(rule.get("verbs"), &r.verb) || !has(rule.get("apiGroups"), &r.group) {
                return false;
            }
            let combined = if r.subresource.is_empty() {
                r.resource.clone()
            } else {
                format!("{}/{}", r.resource, r.subresource)
            };
            let resource_ok = strings(rule.get("resources")).any(|res| {
                res == "*"
                    || res == combined
                    || (!r.subresource.is_empty()
                        && res.strip_prefix("*/") == Some(r.subresource.as_str()))
            });
            if !resource_ok {
                return false;
            }
            let mut names = strings(rule.get("resourceNames")).peekable();
            names.peek().is_none() || names.any(|n| n == r.name)
        }
        Attributes::NonResource { path, verb } => {
            has(rule.get("verbs"), verb)
                && strings(rule.get("nonResourceURLs")).any(|u| url_matches(u, path))
        }
    }
}

fn url_matches(rule: &str, path: &str) -> bool {
    rule == "*"
        || rule == path
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(method: Method, path: &str, query: &[(&str, &str)]) -> Attributes {
        let q = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Attributes::from_request(&method, path, &q)
    }

    fn res(ns: &str, verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes::Resource(ResourceAttributes {
            namespace: ns.into(),
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
        })
    }

    #[test]
    fn request_info_like_kube_apiserver() {
        assert_eq!(
            attrs(Method::GET, "/api/v1/namespaces/a/configmaps", &[]),
            res("a", "list", "", "configmaps", "", "")
        );
        assert_eq!(
            attrs(Method::GET, "/apis/apps/v1/deployments", &[("watch", "1")]),
            res("", "watch", "apps", "deployments", "", "")
        );
        assert_eq!(
            attrs(Method::PUT, "/api/v1/namespaces/a/pods/p/status", &[]),
            res("a", "update", "", "pods", "status", "p")
        );
        assert_eq!(
            attrs(Method::GET, "/api/v1/namespaces/a", &[]),
            res("a", "get", "", "namespaces", "", "a")
        );
        assert_eq!(
            attrs(Method::DELETE, "/api/v1/namespaces/a/secrets", &[]),
            res("a", "deletecollection", "", "secrets", "", "")
        );
        assert_eq!(
            attrs(
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/a/leases",
                &[("watch", "true"), ("fieldSelector", "metadata.name=l")]
            ),
            res("a", "watch", "coordination.k8s.io", "leases", "", "l")
        );
        for path in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
        ] {
            assert!(
                matches!(
                    attrs(Method::GET, path, &[]),
                    Attributes::NonResource { .. }
                ),
                "{path}"
            );
        }
    }

    #[test]
    fn rules_match_like_kubernetes() {
        let rule =
            json!({"apiGroups": [""], "resources": ["pods", "*/scale"], "verbs": ["get", "list"]});
        assert!(rule_allows(&rule, &res("a", "get", "", "pods", "", "p")));
        assert!(!rule_allows(
            &rule,
            &res("a", "get", "", "pods", "status", "p")
        ));
        assert!(rule_allows(
            &rule,
            &res("a", "get", "", "deployments", "scale", "d")
        ));
        assert!(!rule_allows(
            &rule,
            &res("a", "get", "apps", "pods", "", "p")
        ));
        assert!(!rule_allows(
            &rule,
            &res("a", "delete", "", "pods", "", "p")
        ));
        let star = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(rule_allows(
            &star,
            &res("", "patch", "x.io", "foos", "status", "f")
        ));
        let named = json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"], "resourceNames": ["one"]});
        assert!(rule_allows(
            &named,
            &res("a", "get", "", "configmaps", "", "one")
        ));
        assert!(!rule_allows(
            &named,
            &res("a", "get", "", "configmaps", "", "two")
        ));
        assert!(!rule_allows(
            &named,
            &res("a", "list", "", "configmaps", "", "")
        ));
        let urls = json!({"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]});
        let nr = |p: &str| Attributes::NonResource {
            path: p.into(),
            verb: "get".into(),
        };
        assert!(rule_allows(&urls, &nr("/metrics")));
        assert!(rule_allows(&urls, &nr("/logs/a/b")));
        assert!(!rule_allows(&urls, &nr("/metricsx")));
        assert!(!rule_allows(&urls, &res("", "get", "", "metrics", "", "")));
    }

    #[test]
    fn forbidden_message_matches_kube_apiserver() {
        let user = Identity {
            username: "system:serviceaccount:team-a:ctl".into(),
            ..Default::default()
        };
        let e = res("team-b", "list", "", "configmaps", "", "").forbidden(&user, "");
        assert_eq!(
            e.message,
            "configmaps is forbidden: User \"system:serviceaccount:team-a:ctl\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team-b\""
        );
        let e = res("", "get", "apps", "deployments", "scale", "d").forbidden(&user, "");
        assert_eq!(
            e.message,
            "deployments.apps \"d\" is forbidden: User \"system:serviceaccount:team-a:ctl\" cannot get resource \"deployments/scale\" in API group \"apps\" at the cluster scope"
        );
    }
}
