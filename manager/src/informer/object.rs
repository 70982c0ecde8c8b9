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
/// allocation per object, more than reading it back out of the JSON when it is needed. The
/// allocation may begin with what a store keeps before the JSON (its key, see
/// [`super::entry::Entry`]), so that a store's entry and the object read from it are one
/// allocation; `json_at` is where the JSON starts.
#[derive(Debug, Clone)]
pub(crate) struct CachedObject {
    bytes: Arc<[u8]>,
    json_at: usize,
}

/// Equal when the JSON is, whatever precedes it in the allocation.
impl PartialEq for CachedObject {
    fn eq(&self, other: &Self) -> bool {
        self.json() == other.json()
    }
}

impl Eq for CachedObject {}

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
        CachedObject::shared(json.into(), 0)
    }

    /// The object whose JSON is `bytes` from `json_at` on (all of them if out of range).
    pub(crate) fn shared(bytes: Arc<[u8]>, json_at: usize) -> Self {
        let json_at = if json_at <= bytes.len() { json_at } else { 0 };
        CachedObject { bytes, json_at }
    }

    /// The object's JSON, ready to send.
    pub(crate) fn json(&self) -> &[u8] {
        self.bytes.get(self.json_at..).unwrap_or_default()
    }

    /// metadata.resourceVersion ("" if the server sent none).
    pub(crate) fn resource_version(&self) -> String {
        resource_version_of(self.json())
    }

    /// `metadata.labels`, read without building the rest of the object (None when absent or
    /// not a map).
    pub(crate) fn labels(&self) -> Option<serde_json::Map<String, Value>> {
        serde_json::from_slice::<LabelsOnly>(self.json())
            .ok()
            .and_then(|o| o.metadata.labels)
    }

    /// Parse the object. The bytes were written by [`CachedObject::from_value`], so they always
    /// parse; Null stands in should that ever not hold.
    pub(crate) fn value(&self) -> Value {
        serde_json::from_slice(self.json()).unwrap_or(Value::Null)
    }
}

/// metadata.resourceVersion of the JSON object `json` ("" if absent or unreadable), read with a
/// borrowing partial parse.
pub(crate) fn resource_version_of(json: &[u8]) -> String {
    serde_json::from_slice::<Identity<'_>>(json)
        .unwrap_or_default()
        .metadata
        .resource_version
        .map(|v| v.into_owned())
        .unwrap_or_default()
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
