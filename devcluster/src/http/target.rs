//! What a request addresses: its path resolved against the served resources (resource,
//! namespace, name, subresource), and its Kubernetes verb.

use crate::catalog::resources::{Registry, ResourceInfo};
use axum::http::Method;
use std::collections::HashMap;

/// A parsed request target under `/api` or `/apis`.
pub(super) struct Target {
    pub(super) info: ResourceInfo,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
}

impl Target {
    /// Resolves a path under `/api` or `/apis` against the served resources.
    pub(super) fn resolve(registry: &Registry, segs: &[&str]) -> Option<Target> {
        let (group, version, rest) = match segs {
            ["api", "v1", rest @ ..] => ("", "v1", rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return None,
        };
        let lookup = |plural: &str| registry.get(group, version, plural).cloned();
        let (info, namespace, name, sub) = match rest {
            // The namespace object itself: /api/v1/namespaces/{name}[/status|/finalize].
            ["namespaces", name] if group.is_empty() => {
                (lookup("namespaces")?, None, Some(*name), None)
            }
            ["namespaces", name, sub @ ("status" | "finalize")] if group.is_empty() => {
                (lookup("namespaces")?, None, Some(*name), Some(*sub))
            }
            ["namespaces", ns, plural, tail @ ..] => {
                let info = lookup(plural)?;
                if !info.namespaced {
                    return None;
                }
                match tail {
                    [] => (info, Some(*ns), None, None),
                    [name] => (info, Some(*ns), Some(*name), None),
                    [name, sub] => (info, Some(*ns), Some(*name), Some(*sub)),
                    _ => return None,
                }
            }
            [plural, tail @ ..] => {
                let info = lookup(plural)?;
                match tail {
                    [] => (info, None, None, None),
                    [name] if !info.namespaced => (info, None, Some(*name), None),
                    [name, sub] if !info.namespaced => (info, None, Some(*name), Some(*sub)),
                    _ => return None,
                }
            }
            _ => return None,
        };
        Some(Target {
            info,
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            sub: sub.map(str::to_string),
        })
    }

    /// The Kubernetes verb of a request on this target.
    pub(super) fn verb(&self, method: &Method, query: &HashMap<String, String>) -> &'static str {
        let watch = flag(query, "watch");
        match *method {
            Method::GET if watch => "watch",
            Method::GET if self.name.is_none() => "list",
            Method::GET => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if self.name.is_none() => "deletecollection",
            Method::DELETE => "delete",
            _ => "unknown",
        }
    }

    /// The namespace and name of a Lease, which fault injection can freeze.
    pub(super) fn lease(&self) -> Option<(&str, &str)> {
        (self.info.group == "coordination.k8s.io" && self.info.plural == "leases").then(|| {
            (
                self.namespace.as_deref().unwrap_or_default(),
                self.name.as_deref().unwrap_or_default(),
            )
        })
    }

    /// The namespace for a request on one object (empty for cluster-scoped ones).
    pub(super) fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }
}

/// Booleans in query strings as Go's `strconv.ParseBool` reads them (the Python client sends `True`).
pub(super) fn parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

pub(super) fn flag(query: &HashMap<String, String>, name: &str) -> bool {
    query.get(name).is_some_and(|v| parse_bool(v))
}
