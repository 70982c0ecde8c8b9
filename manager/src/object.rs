//! One object as the shared caches hold it: its JSON, serialized once when it arrives, plus the
//! few metadata fields the cache itself needs on every event.
//!
//! A `serde_json::Value` tree (with `preserve_order`) costs about six times the object's JSON in
//! memory; the bytes cost their length. Dispatch and cached reads send these bytes as they are,
//! so an object is no longer re-serialized for every request. Code that needs fields beyond the
//! ones kept here (predicates, mappers) gets them from the parsed `Value` the live event carries,
//! or calls [`CachedObject::value`] for the rare cases that start from the store.

use serde_json::Value;

/// A cached object: its JSON and its identity fields.
#[derive(Debug, PartialEq, Eq)]
pub struct CachedObject {
    json: Box<[u8]>,
    resource_version: Box<str>,
    owner_uids: Box<[Box<str>]>,
}

impl CachedObject {
    /// Serialize `value` once and keep what the store indexes.
    pub fn from_value(value: &Value) -> Self {
        // Serializing a Value cannot fail: its map keys are strings.
        let json = serde_json::to_vec(value).unwrap_or_default();
        let metadata = value.get("metadata");
        let resource_version = metadata
            .and_then(|m| m.get("resourceVersion"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let owner_uids = metadata
            .and_then(|m| m.get("ownerReferences"))
            .and_then(Value::as_array)
            .map(|refs| {
                refs.iter()
                    .filter_map(|r| r.get("uid").and_then(Value::as_str))
                    .map(Box::from)
                    .collect()
            })
            .unwrap_or_default();
        CachedObject {
            json: json.into_boxed_slice(),
            resource_version: resource_version.into(),
            owner_uids,
        }
    }

    /// The object's JSON, ready to send.
    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// metadata.resourceVersion ("" if the server sent none).
    pub fn resource_version(&self) -> &str {
        &self.resource_version
    }

    /// The uids its ownerReferences name.
    pub fn owner_uids(&self) -> &[Box<str>] {
        &self.owner_uids
    }

    /// Parse the object. The bytes were written by [`CachedObject::from_value`], so they always
    /// parse; Null stands in should that ever not hold.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_json_identity_and_owners() {
        let v = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "42",
                "ownerReferences": [{"uid": "u1"}, {"uid": "u2"}, {"name": "no-uid"}]},
            "data": {"k": "v"}
        });
        let o = CachedObject::from_value(&v);
        assert_eq!(o.resource_version(), "42");
        let owners: Vec<&str> = o.owner_uids().iter().map(|u| &**u).collect();
        assert_eq!(owners, ["u1", "u2"]);
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
        assert!(o.owner_uids().is_empty());
    }
}
