//! From an object event to the primary keys it concerns: the object itself, its controller
//! owner, or the primary a watched object names by label, annotation or field.

use crate::key::ObjectKey;
use crate::registration::{Mapping, ResourceRef};
use serde_json::Value;

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The object's own key.
pub fn own_key(obj: &Value) -> ObjectKey {
    ObjectKey::of(obj)
}

/// Primaries owning `obj`: ownerReferences of the primary's group and kind (only the one marked
/// `controller: true` when `controller_only`). Owners live in the object's namespace, or are
/// cluster-scoped when the primary is.
pub fn owner_keys(obj: &Value, primary: &ResourceRef, controller_only: bool) -> Vec<ObjectKey> {
    let ns = if primary.namespaced {
        str_at(obj, "/metadata/namespace").to_string()
    } else {
        String::new()
    };
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter(|r| {
                    !controller_only
                        || r.get("controller")
                            .and_then(Value::as_bool)
                            .unwrap_or(false)
                })
                .filter(|r| r.get("kind").and_then(Value::as_str) == Some(primary.kind.as_str()))
                .filter(|r| {
                    // The group must match; the version may differ (owners are referenced by any served version).
                    let av = r
                        .get("apiVersion")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let group = av.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
                    group == primary.group
                })
                .filter_map(|r| r.get("name").and_then(Value::as_str))
                .map(|name| ObjectKey::new(ns.clone(), name))
                .collect()
        })
        .unwrap_or_default()
}

/// The primary a watched object names through `mapping`, if any.
pub fn mapped_key(obj: &Value, mapping: &Mapping, primary_namespaced: bool) -> Option<ObjectKey> {
    let ns = str_at(obj, "/metadata/namespace");
    let same_ns = |name: &str| -> Option<ObjectKey> {
        (!name.is_empty()).then(|| ObjectKey::new(if primary_namespaced { ns } else { "" }, name))
    };
    match mapping {
        Mapping::Label(key) => same_ns(
            obj.pointer("/metadata/labels")
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)?,
        ),
        Mapping::Annotation(key) => same_ns(
            obj.pointer("/metadata/annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_str)?,
        ),
        Mapping::Field(path) => {
            let value = path
                .split('.')
                .filter(|p| !p.is_empty())
                .try_fold(obj, |v, k| v.get(k))?
                .as_str()?;
            match value.split_once('/') {
                Some((ns, name)) if !name.is_empty() => Some(ObjectKey::new(
                    if primary_namespaced { ns } else { "" },
                    name,
                )),
                Some(_) => None,
                None => same_ns(value),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn primary() -> ResourceRef {
        ResourceRef {
            group: "cache.example.com".into(),
            version: "v1alpha1".into(),
            kind: "Memcached".into(),
            plural: "memcacheds".into(),
            namespaced: true,
        }
    }

    #[test]
    fn controller_owner_maps_to_primary() {
        let dep = json!({"metadata": {"namespace": "ns", "name": "d", "ownerReferences": [
            {"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "m", "uid": "1", "controller": true},
            {"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "other", "uid": "2"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "3", "controller": false},
        ]}});
        assert_eq!(
            owner_keys(&dep, &primary(), true),
            vec![ObjectKey::new("ns", "m")]
        );
        assert_eq!(owner_keys(&dep, &primary(), false).len(), 2);
    }

    #[test]
    fn owners_of_another_group_do_not_map() {
        let obj = json!({"metadata": {"namespace": "ns", "name": "d", "ownerReferences": [
            {"apiVersion": "other.io/v1", "kind": "Memcached", "name": "m", "uid": "1", "controller": true}]}});
        assert!(owner_keys(&obj, &primary(), true).is_empty());
    }

    #[test]
    fn label_annotation_and_field_mappings() {
        let cm = json!({"metadata": {"namespace": "ns", "name": "cm", "labels": {"owner": "web"}, "annotations": {"target": "api"}},
            "spec": {"ref": "other/db", "local": "cache"}});
        assert_eq!(
            mapped_key(&cm, &Mapping::Label("owner".into()), true),
            Some(ObjectKey::new("ns", "web"))
        );
        assert_eq!(
            mapped_key(&cm, &Mapping::Annotation("target".into()), true),
            Some(ObjectKey::new("ns", "api"))
        );
        assert_eq!(
            mapped_key(&cm, &Mapping::Field("spec.ref".into()), true),
            Some(ObjectKey::new("other", "db"))
        );
        assert_eq!(
            mapped_key(&cm, &Mapping::Field("spec.local".into()), true),
            Some(ObjectKey::new("ns", "cache"))
        );
        assert_eq!(
            mapped_key(&cm, &Mapping::Label("missing".into()), true),
            None
        );
        assert_eq!(
            mapped_key(&cm, &Mapping::Label("owner".into()), false),
            Some(ObjectKey::new("", "web"))
        );
    }
}
