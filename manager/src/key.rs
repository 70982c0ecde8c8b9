//! Keys: the namespace and name every queue, cache and request works on, and the identity of a
//! registered controller.

use serde_json::Value;
use std::fmt;

/// Namespace and name of an object; the unit every queue works on. The namespace is empty for
/// cluster-scoped objects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The object's namespace, empty when it is cluster-scoped.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl ObjectKey {
    /// The key of `name` in `namespace` (empty for a cluster-scoped object).
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key an object's own `metadata` names; missing fields read as empty.
    pub fn of(obj: &Value) -> Self {
        let field = |f: &str| {
            obj.pointer(f)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        ObjectKey::new(field("/metadata/namespace"), field("/metadata/name"))
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object, as kubectl prints them.
impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// Who registered a controller: the tenant, and the name unique within it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ControllerId {
    /// Tenant identity.
    pub tenant: String,
    /// Controller name.
    pub name: String,
}

impl fmt::Display for ControllerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn displays_like_kubectl() {
        assert_eq!(ObjectKey::new("team-a", "web").to_string(), "team-a/web");
        assert_eq!(ObjectKey::new("", "node-1").to_string(), "node-1");
    }

    #[test]
    fn reads_metadata_and_tolerates_missing_fields() {
        let obj = json!({"metadata": {"namespace": "ns", "name": "a"}});
        assert_eq!(ObjectKey::of(&obj), ObjectKey::new("ns", "a"));
        assert_eq!(
            ObjectKey::of(&json!({"metadata": {"name": "n"}})),
            ObjectKey::new("", "n")
        );
        assert_eq!(ObjectKey::of(&json!(42)), ObjectKey::default());
    }
}
