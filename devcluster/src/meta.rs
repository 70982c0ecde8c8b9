//! Small accessors for `metadata` fields of objects held as JSON.

use serde_json::{Map, Value, json};

/// `metadata.name`, or "".
pub(crate) fn name(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.namespace`, or "".
pub(crate) fn namespace(obj: &Value) -> &str {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.uid`, or "".
pub(crate) fn uid(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata.resourceVersion`, or "".
pub(crate) fn resource_version(obj: &Value) -> &str {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Whether `metadata.deletionTimestamp` is set.
pub(crate) fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// `metadata.finalizers` as strings.
pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `metadata.ownerReferences` entries as (uid, apiVersion, kind, name).
pub(crate) fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `metadata` as a mutable map, created if missing or not an object.
pub(crate) fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let map = obj.as_object_mut().expect("just made an object");
    let md = map.entry("metadata").or_insert_with(|| json!({}));
    if !md.is_object() {
        *md = json!({});
    }
    md.as_object_mut().expect("just made an object")
}

/// Set (or with `None` remove) one metadata field.
pub(crate) fn set(obj: &mut Value, field: &str, value: Option<Value>) {
    let md = metadata_mut(obj);
    match value {
        Some(v) => {
            md.insert(field.to_string(), v);
        }
        None => {
            md.remove(field);
        }
    }
}

/// Read a dotted path such as `spec.replicas`.
pub(crate) fn get_path<'a>(obj: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted
        .split('.')
        .filter(|s| !s.is_empty())
        .try_fold(obj, |v, k| v.get(k))
}

/// Write a dotted path, creating intermediate objects.
pub(crate) fn set_path(obj: &mut Value, dotted: &str, value: Value) {
    let parts: Vec<&str> = dotted.split('.').filter(|s| !s.is_empty()).collect();
    let mut cur = obj;
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let map = cur.as_object_mut().expect("just made an object");
        if i + 1 == parts.len() {
            map.insert(part.to_string(), value);
            return;
        }
        cur = map.entry(part.to_string()).or_insert_with(|| json!({}));
    }
}

/// The current time as Kubernetes writes `metav1.Time` (RFC 3339, seconds).
pub(crate) fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
