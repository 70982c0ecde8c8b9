//! How server-side apply and managed fields merge the list at a path: built-in kinds (and every
//! object's metadata) by the patch-merge-key table of [`crate::apply::patch`], custom resources by
//! their structural schema's `x-kubernetes-list-type` and `x-kubernetes-list-map-keys`.

use crate::apply::fieldmanager::ListKey;
use crate::catalog::resources::ResourceInfo;
use serde_json::Value;

/// How managed fields and apply treat the list at a path: metadata and built-in kinds by the
/// merge-key table, custom resources by their schema's `x-kubernetes-list-type`.
pub(crate) fn list_key_of(info: &ResourceInfo, path: &[&str]) -> Option<ListKey> {
    if info.builtin || path.first() == Some(&"metadata") {
        return crate::apply::patch::list_merge_key(path).map(|k| match k {
            crate::apply::patch::MergeKey::Key(k) => ListKey::Key(k),
            crate::apply::patch::MergeKey::Set => ListKey::Set,
        });
    }
    info.schema.as_ref().and_then(|s| list_type(s, path))
}

/// The `x-kubernetes-list-type` of the list at a path of field names (list items are stepped
/// through implicitly), with its `x-kubernetes-list-map-keys` for `map` lists: what
/// server-side apply merges CRD lists by.
fn list_type(schema: &Value, names: &[&str]) -> Option<ListKey> {
    let mut s = schema;
    for name in names {
        while s.get("type").and_then(Value::as_str) == Some("array") {
            s = s.get("items")?;
        }
        s = s
            .get("properties")
            .and_then(|p| p.get(*name))
            .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))?;
    }
    match s.get("x-kubernetes-list-type")?.as_str()? {
        "set" => Some(ListKey::Set),
        "map" => {
            let keys: Vec<String> = s
                .get("x-kubernetes-list-map-keys")?
                .as_array()?
                .iter()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect();
            (!keys.is_empty()).then_some(ListKey::Keys(keys))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn list_types_come_from_the_schema_extensions() {
        let s = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["port", "protocol"],
                "items": {"type": "object", "properties": {"tags": {"type": "array",
                    "x-kubernetes-list-type": "set", "items": {"type": "string"}}}}},
            "args": {"type": "array", "items": {"type": "string"}}}}}});
        assert_eq!(
            list_type(&s, &["spec", "ports"]),
            Some(ListKey::Keys(vec!["port".into(), "protocol".into()]))
        );
        assert_eq!(
            list_type(&s, &["spec", "ports", "tags"]),
            Some(ListKey::Set)
        );
        assert_eq!(list_type(&s, &["spec", "args"]), None);
    }
}
