//! A full object as the informers decode it from list and watch responses: one JSON tree, parsed
//! once.
//!
//! kube's `DynamicObject` parses `metadata` field by field into a typed `ObjectMeta` and buffers
//! the rest through serde's `flatten`, which the informer would then turn back into one tree — a
//! costly round trip on the hottest path (see BENCHMARKS.md). This type parses the body straight
//! into the tree and lifts out beside it only what kube's watcher reads (the resourceVersion it
//! resumes from, and the name and namespace it logs).

use kube::api::{ApiResource, ObjectMeta};
use kube::core::{DynamicResourceScope, Resource};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// One object from a list or watch response.
#[derive(Debug, Clone)]
pub(crate) struct WatchedObject {
    /// name, namespace, uid and resourceVersion, copied out of `tree` for kube's watcher.
    metadata: ObjectMeta,
    /// The object as the API server sent it.
    tree: Value,
}

impl<'de> Deserialize<'de> for WatchedObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let tree = Value::deserialize(d)?;
        if !tree.is_object() {
            return Err(serde::de::Error::custom("an object must be a JSON object"));
        }
        let field = |name: &str| {
            tree.get("metadata")
                .and_then(|m| m.get(name))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let metadata = ObjectMeta {
            name: field("name"),
            namespace: field("namespace"),
            uid: field("uid"),
            resource_version: field("resourceVersion"),
            ..ObjectMeta::default()
        };
        Ok(WatchedObject { metadata, tree })
    }
}

impl WatchedObject {
    /// The tree the caches keep: managedFields removed (no consumer needs them and they can be
    /// larger than the rest of the object), apiVersion and kind first, filled in from the watched
    /// resource where the server left them out (list items of built-in kinds carry neither).
    pub(crate) fn into_tree(self, api_version: &str, kind: &str) -> Value {
        let Value::Object(mut map) = self.tree else {
            return Value::Null;
        };
        if let Some(Value::Object(md)) = map.get_mut("metadata") {
            md.shift_remove("managedFields");
        }
        let starts_right = {
            let mut keys = map.keys();
            keys.next().map(String::as_str) == Some("apiVersion")
                && keys.next().map(String::as_str) == Some("kind")
        };
        if starts_right {
            return Value::Object(map);
        }
        let mut ordered = Map::with_capacity(map.len() + 2);
        let version = map
            .shift_remove("apiVersion")
            .unwrap_or_else(|| Value::String(api_version.to_owned()));
        let kind = map
            .shift_remove("kind")
            .unwrap_or_else(|| Value::String(kind.to_owned()));
        ordered.insert("apiVersion".into(), version);
        ordered.insert("kind".into(), kind);
        ordered.extend(map);
        Value::Object(ordered)
    }
}

impl Resource for WatchedObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(v: Value) -> WatchedObject {
        serde_json::from_value(v).expect("decodes")
    }

    #[test]
    fn keeps_every_field_but_managed_fields_in_the_servers_order() {
        let o = decode(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "7", "uid": "u",
                "labels": {"a": "b"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
                "annotations": {"x": "y"}},
            "spec": {"size": 3, "tags": ["x", "y"]},
            "status": {"ready": true}
        }));
        assert_eq!(o.meta().name.as_deref(), Some("w"));
        assert_eq!(o.meta().namespace.as_deref(), Some("ns"));
        assert_eq!(o.meta().resource_version.as_deref(), Some("7"));
        assert_eq!(o.meta().uid.as_deref(), Some("u"));
        let v = o.into_tree("ignored/v1", "Ignored");
        assert_eq!(
            serde_json::to_string(&v).ok().as_deref(),
            Some(
                r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns","resourceVersion":"7","uid":"u","labels":{"a":"b"},"annotations":{"x":"y"}},"spec":{"size":3,"tags":["x","y"]},"status":{"ready":true}}"#
            )
        );
    }

    #[test]
    fn list_items_without_api_version_and_kind_get_the_watched_ones_first() {
        let o = decode(json!({"metadata": {"name": "c"}, "data": {"k": "v"}}));
        let v = o.into_tree("v1", "ConfigMap");
        let order: Vec<&str> = v
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(order, ["apiVersion", "kind", "metadata", "data"]);
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["kind"], "ConfigMap");
    }

    #[test]
    fn decodes_inside_a_watch_event_and_a_list() {
        let event: kube::api::WatchEvent<WatchedObject> = serde_json::from_str(
            r#"{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"12"}}}"#,
        )
        .expect("a watch event");
        let kube::api::WatchEvent::Modified(o) = event else {
            panic!("expected MODIFIED, got {event:?}");
        };
        assert_eq!(o.meta().resource_version.as_deref(), Some("12"));
        let list: kube::core::ObjectList<WatchedObject> = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"13"},"items":[{"metadata":{"name":"a","resourceVersion":"12"}}]}"#,
        )
        .expect("a list");
        assert_eq!(list.items.len(), 1);
    }

    #[test]
    fn a_body_that_is_not_an_object_is_an_error_not_a_panic() {
        assert!(serde_json::from_str::<WatchedObject>("[1, 2]").is_err());
        assert!(serde_json::from_str::<WatchedObject>("\"x\"").is_err());
    }
}
