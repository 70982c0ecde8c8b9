//! One object as the shared caches hold it: its JSON, serialized once when it arrives.
//!
//! A `serde_json::Value` tree (with `preserve_order`) costs about six times the object's JSON in
//! memory; the bytes cost their length. Dispatch and cached reads send these bytes as they are,
//! so an object is no longer re-serialized for every request. Code that needs its fields
//! (predicates, mappers) gets them from the parsed `Value` the live event carries; the store
//! reads back the resourceVersion with a borrowing partial parse.

use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;

/// A cached object: its JSON in one shared allocation. Cloning it is a reference-count bump.
///
/// Nothing else is kept beside the bytes: a separate resourceVersion would cost another
/// allocation per object, more than reading it back out of the JSON when it is needed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CachedObject {
    json: Arc<[u8]>,
}

/// The only fields the store reads back, borrowed from the bytes; serde skips the rest of the
/// object without building anything.
#[derive(Deserialize, Default)]
struct Identity<'a> {
    #[serde(borrow, default)]
    metadata: IdentityMeta<'a>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct IdentityMeta<'a> {
    #[serde(borrow, default)]
    resource_version: Option<std::borrow::Cow<'a, str>>,
}

/// Only `metadata.labels`, for label-selected reads: serde skips the rest of the object.
#[derive(Deserialize, Default)]
struct LabelsOnly {
    #[serde(default)]
    metadata: LabelsMeta,
}

#[derive(Deserialize, Default)]
struct LabelsMeta {
    #[serde(default)]
    labels: Option<serde_json::Map<String, Value>>,
}

impl CachedObject {
    /// Serialize `value` once.
    pub(crate) fn from_value(value: &Value) -> Self {
        // Serializing a Value cannot fail: its map keys are strings.
        let json = serde_json::to_vec(value).unwrap_or_default();
        CachedObject { json: json.into() }
    }

    /// The object's JSON, ready to send.
    pub(crate) fn json(&self) -> &[u8] {
        &self.json
    }

    fn identity(&self) -> Identity<'_> {
        serde_json::from_slice(&self.json).unwrap_or_default()
    }

    /// metadata.resourceVersion ("" if the server sent none).
    pub(crate) fn resource_version(&self) -> String {
        self.identity()
            .metadata
            .resource_version
            .map(|v| v.into_owned())
            .unwrap_or_default()
    }

    /// `metadata.labels`, read without building the rest of the object (None when absent or
    /// not a map).
    pub(crate) fn labels(&self) -> Option<serde_json::Map<String, Value>> {
        serde_json::from_slice::<LabelsOnly>(&self.json)
            .ok()
            .and_then(|o| o.metadata.labels)
    }

    /// Parse the object. The bytes were written by [`CachedObject::from_value`], so they always
    /// parse; Null stands in should that ever not hold.
    pub(crate) fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_json_and_resource_version() {
        let v = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "42",
                "ownerReferences": [{"uid": "u1"}, {"uid": "u2"}, {"name": "no-uid"}]},
            "data": {"k": "v"}
        });
        let o = CachedObject::from_value(&v);
        assert_eq!(o.resource_version(), "42");
        assert_eq!(o.value(), v);
        assert_eq!(serde_json::from_slice::<Value>(o.json()).ok(), Some(v));
    }

    #[test]
    fn preserves_field_order_for_byte_stable_output() {
        let v = json!({"kind": "X", "apiVersion": "v1", "metadata": {"name": "b"}});
        let o = CachedObject::from_value(&v);
        assert_eq!(
            std::str::from_utf8(o.json()).ok(),
            Some(r#"{"kind":"X","apiVersion":"v1","metadata":{"name":"b"}}"#)
        );
        assert_eq!(o.resource_version(), "");
    }
}
