//! The three PATCH flavours the Kubernetes API accepts, applied to plain JSON.
//!
//! The server stores every object as an untyped `serde_json::Value`, so it
//! cannot lean on the Go struct tags (`patchStrategy`, `patchMergeKey`) that
//! drive strategic merge in a real apiserver. This module keeps those rules in
//! one table ([`list_merge_key`]) and implements the patch algorithms on top of
//! it, so handlers only pick a function by the request's `Content-Type`.
//!
//! Every function either applies the whole patch or leaves the target
//! untouched: a half-applied patch would be written back to the store and
//! bump the resourceVersion for a change the client was told had failed.

use serde_json::{Map, Value};

/// Why a patch could not be applied; the server maps these to HTTP statuses.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PatchError {
    /// The patch document is not of the form its content type requires.
    #[error("{0}")]
    Malformed(String),
    /// A JSON-patch operation could not be applied (path missing, test failed, ...).
    #[error("{0}")]
    Failed(String),
}

/// How the items of a list field are matched up between the live object and a
/// patch; the Rust counterpart of the `patchStrategy:"merge"` struct tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MergeKey {
    /// A list of objects identified by this field (e.g. containers by `name`).
    Key(&'static str),
    /// A list of primitives merged as a set (e.g. `metadata.finalizers`).
    Set,
}

/// RFC 7386 JSON merge patch (application/merge-patch+json). Never fails for object patches; a non-object patch replaces the target.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            // shift_remove keeps the remaining fields in their stored order, so
            // a patch does not shuffle the object a client reads back.
            target.shift_remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// RFC 6902 JSON patch (application/json-patch+json). Kubernetes quirk: a `test` op whose path does not exist and whose value is null PASSES. Atomic: on error the target is unchanged.
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    use json_patch::PatchOperation;

    let Value::Array(raw_ops) = patch else {
        return Err(PatchError::Malformed(format!(
            "a JSON patch must be an array of operations, got {}",
            type_name(patch)
        )));
    };
    let ops = raw_ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            serde_json::from_value::<PatchOperation>(op.clone()).map_err(|e| {
                PatchError::Malformed(format!("JSON patch operation {i} is invalid: {e}"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    // Work on a copy so a failure part-way leaves the stored object untouched;
    // this also avoids the crate's undo path, which panics if undo fails.
    let mut work = target.clone();
    for (i, op) in ops.iter().enumerate() {
        if let PatchOperation::Test(test) = op
            && test.value.is_null()
            && missing_key_in_existing_object(&work, test.path.as_str())
        {
            // The apiserver's JSON-patch library treats an absent field as
            // null, and clients (kubectl, controllers) rely on `test: null` to
            // assert "not set yet".
            continue;
        }
        json_patch::patch_unsafe(&mut work, std::slice::from_ref(op))
            .map_err(|e| PatchError::Failed(describe_json_patch_failure(i, op, &work, &e)))?;
    }
    *target = work;
    Ok(())
}

/// True when `pointer` names a key that is absent from an object that exists.
/// Only that shape gets the null-test quirk: upstream still fails a test whose
/// parent is missing or whose array index is out of range.
fn missing_key_in_existing_object(doc: &Value, pointer: &str) -> bool {
    let Some(split) = pointer.rfind('/') else {
        return false;
    };
    let (parent, _) = pointer.split_at(split);
    matches!(doc.pointer(parent), Some(Value::Object(_))) && doc.pointer(pointer).is_none()
}

fn describe_json_patch_failure(
    index: usize,
    op: &json_patch::PatchOperation,
    doc: &Value,
    err: &json_patch::PatchError,
) -> String {
    use json_patch::{PatchErrorKind, PatchOperation};
    let (name, path) = match op {
        PatchOperation::Add(o) => ("add", o.path.as_str()),
        PatchOperation::Remove(o) => ("remove", o.path.as_str()),
        PatchOperation::Replace(o) => ("replace", o.path.as_str()),
        PatchOperation::Move(o) => ("move", o.path.as_str()),
        PatchOperation::Copy(o) => ("copy", o.path.as_str()),
        PatchOperation::Test(o) => ("test", o.path.as_str()),
    };
    let detail = match (&err.kind, op) {
        (PatchErrorKind::TestFailed, PatchOperation::Test(t)) => match doc.pointer(path) {
            Some(actual) => format!("value is {actual}, expected {}", t.value),
            None => format!("path does not exist, expected {}", t.value),
        },
        (PatchErrorKind::InvalidPointer, _) => {
            "path does not exist or its parent is not an object or array".to_string()
        }
        (PatchErrorKind::InvalidFromPointer, _) => "\"from\" path does not exist".to_string(),
        (kind, _) => kind.to_string(),
    };
    format!("JSON patch operation {index} ({name} at \"{path}\") failed: {detail}")
}

/// Kubernetes strategic merge patch (application/strategic-merge-patch+json) for built-in kinds.
///
/// Follows k8s.io/apimachinery/pkg/util/strategicpatch with these
/// simplifications: list items keep their live order and new items are
/// appended in patch order (upstream may interleave when a patch reorders
/// existing items without `$setElementOrder`), and a nested
/// `{"$patch":"delete"}` removes the field rather than leaving `{}`.
pub(crate) fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(patch) = patch else {
        return Err(PatchError::Malformed(format!(
            "a strategic merge patch must be a JSON object, got {}",
            type_name(patch)
        )));
    };
    // Merge into a copy so a malformed directive deep in the patch cannot leave
    // the stored object half-patched.
    let mut work = match target {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    let mut path = Vec::new();
    let result = match merge_object(&mut work, patch, &mut path)? {
        Outcome::Keep => work,
        Outcome::Delete => Map::new(),
    };
    *target = Value::Object(result);
    Ok(())
}

/// The merge key of a list field in built-in kinds for strategic merge and server-side apply, by field name and the path of parent field names (e.g. ["spec","template","spec","containers"]); None = atomic list (replaced whole). `Some(MergeKey::Set)` for lists of primitives merged as sets (metadata.finalizers).
pub(crate) fn list_merge_key(path: &[&str]) -> Option<MergeKey> {
    let (&field, parents) = path.split_last()?;
    let parent = parents.last().copied();
    let in_container = matches!(
        parent,
        Some("containers" | "initContainers" | "ephemeralContainers")
    );
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "schedulingGates"
        | "resourceClaims" => Some(MergeKey::Key("name")),
        // A ServiceAccount's top-level imagePullSecrets carry no patch
        // strategy upstream, unlike the pod spec's.
        "imagePullSecrets" if !parents.is_empty() => Some(MergeKey::Key("name")),
        // ServiceAccount.secrets is merged by name.
        "secrets" if parents.is_empty() => Some(MergeKey::Key("name")),
        "volumeMounts" => Some(MergeKey::Key("mountPath")),
        "volumeDevices" => Some(MergeKey::Key("devicePath")),
        "ports" if in_container => Some(MergeKey::Key("containerPort")),
        // Only a Service's spec.ports is keyed; endpoint and network-policy
        // ports elsewhere are atomic.
        "ports" if parents == ["spec"] => Some(MergeKey::Key("port")),
        "conditions" => Some(MergeKey::Key("type")),
        "ownerReferences" => Some(MergeKey::Key("uid")),
        // Namespace spec.finalizers is atomic upstream; only object metadata
        // finalizers are a set.
        "finalizers" if parent == Some("metadata") => Some(MergeKey::Set),
        "hostAliases" => Some(MergeKey::Key("ip")),
        "podIPs" | "hostIPs" if parent == Some("status") => Some(MergeKey::Key("ip")),
        "addresses" if parent == Some("status") => Some(MergeKey::Key("type")),
        "podCIDRs" if parent == Some("spec") => Some(MergeKey::Set),
        "topologySpreadConstraints" => Some(MergeKey::Key("topologyKey")),
        _ => None,
    }
}

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Whether a merged map survives in its parent.
enum Outcome {
    Keep,
    Delete,
}

fn is_directive_key(key: &str) -> bool {
    key == DIRECTIVE
        || key == RETAIN_KEYS
        || key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
        || key.starts_with(SET_ELEMENT_ORDER)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn field_path(path: &[&str], field: &str) -> String {
    let mut parts: Vec<&str> = path.to_vec();
    parts.push(field);
    parts.join(".")
}

fn directive_array<'p>(
    key: &str,
    value: &'p Value,
    path: &[&str],
) -> Result<&'p Vec<Value>, PatchError> {
    value.as_array().ok_or_else(|| {
        PatchError::Malformed(format!(
            "{} must be a list, got {}",
            field_path(path, key),
            type_name(value)
        ))
    })
}

fn merge_object<'p>(
    orig: &mut Map<String, Value>,
    patch: &'p Map<String, Value>,
    path: &mut Vec<&'p str>,
) -> Result<Outcome, PatchError> {
    if let Some(directive) = patch.get(DIRECTIVE) {
        match directive.as_str() {
            Some("replace") => orig.clear(),
            Some("delete") => return Ok(Outcome::Delete),
            Some("merge") => {}
            _ => {
                return Err(PatchError::Malformed(format!(
                    "unknown $patch directive {directive} in {}",
                    if path.is_empty() {
                        "the object".to_string()
                    } else {
                        path.join(".")
                    }
                )));
            }
        }
    }

    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let retain = directive_array(RETAIN_KEYS, retain, path)?;
        orig.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k.as_str())));
    }

    for (key, value) in patch {
        let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) else {
            continue;
        };
        let doomed = directive_array(key, value, path)?;
        if let Some(Value::Array(list)) = orig.get_mut(field) {
            list.retain(|item| !doomed.contains(item));
        }
    }

    // $setElementOrder ranks items against the list as it was before this
    // patch, so keep a copy of just those lists.
    let mut before_patch: Vec<(&'p str, &'p Vec<Value>, Vec<Value>)> = Vec::new();
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(SET_ELEMENT_ORDER) {
            let order = directive_array(key, value, path)?;
            let live = match orig.get(field) {
                Some(Value::Array(list)) => list.clone(),
                _ => Vec::new(),
            };
            before_patch.push((field, order, live));
        }
    }

    for (key, value) in patch {
        if is_directive_key(key) {
            continue;
        }
        path.push(key.as_str());
        let merged = merge_field(orig.get_mut(key.as_str()), value, path);
        path.pop();
        match merged? {
            Merged::InPlace => {}
            Merged::Remove => {
                orig.shift_remove(key.as_str());
            }
            Merged::Set(v) => {
                orig.insert(key.clone(), v);
            }
        }
    }

    for (field, order, live) in before_patch {
        path.push(field);
        let strategy = list_merge_key(path);
        path.pop();
        if let Some(Value::Array(list)) = orig.get_mut(field) {
            apply_element_order(list, order, &live, strategy);
        }
    }
    Ok(Outcome::Keep)
}

/// What to do with a field after merging the patch's value for it.
enum Merged {
    /// The live value was updated where it stands.
    InPlace,
    Remove,
    Set(Value),
}

fn merge_field<'p>(
    orig: Option<&mut Value>,
    patch: &'p Value,
    path: &mut Vec<&'p str>,
) -> Result<Merged, PatchError> {
    match patch {
        Value::Null => Ok(Merged::Remove),
        Value::Object(patch_map) => {
            if let Some(Value::Object(orig_map)) = orig {
                return Ok(match merge_object(orig_map, patch_map, path)? {
                    Outcome::Keep => Merged::InPlace,
                    Outcome::Delete => Merged::Remove,
                });
            }
            // Absent or of another type: the patch value wins, but it still
            // has to lose its directives and nulls, so merge it into nothing.
            let mut fresh = Map::new();
            Ok(match merge_object(&mut fresh, patch_map, path)? {
                Outcome::Keep => Merged::Set(Value::Object(fresh)),
                Outcome::Delete => Merged::Remove,
            })
        }
        Value::Array(patch_list) => {
            let live = match orig {
                Some(Value::Array(list)) => std::mem::take(list),
                _ => Vec::new(),
            };
            let strategy = list_merge_key(path);
            Ok(Merged::Set(Value::Array(merge_list(
                live, patch_list, strategy, path,
            )?)))
        }
        scalar => Ok(Merged::Set(scalar.clone())),
    }
}

fn directive_of(item: &Value) -> Option<&Value> {
    item.as_object().and_then(|m| m.get(DIRECTIVE))
}

fn merge_list<'p>(
    live: Vec<Value>,
    patch: &'p [Value],
    strategy: Option<MergeKey>,
    path: &mut Vec<&'p str>,
) -> Result<Vec<Value>, PatchError> {
    match strategy {
        None => Ok(patch.iter().filter_map(strip_directives).collect()),
        Some(MergeKey::Set) => Ok(merge_set(live, patch)),
        Some(MergeKey::Key(key)) => merge_keyed(live, patch, key, path),
    }
}

fn merge_set(live: Vec<Value>, patch: &[Value]) -> Vec<Value> {
    let replace = patch
        .iter()
        .any(|item| directive_of(item).and_then(Value::as_str) == Some("replace"));
    let mut result: Vec<Value> = Vec::new();
    let base = if replace { Vec::new() } else { live };
    for item in base
        .into_iter()
        .chain(patch.iter().filter(|i| directive_of(i).is_none()).cloned())
    {
        if !result.contains(&item) {
            result.push(item);
        }
    }
    result
}

/// Applies a keyed list patch's `$patch: delete` items to `result`; true when an item says
/// `$patch: replace` (the live list is dropped). Unknown directives are malformed.
fn keyed_directives(
    result: &mut Vec<Value>,
    patch: &[Value],
    key: &'static str,
    path: &[&str],
) -> Result<bool, PatchError> {
    let mut replace = false;
    for item in patch {
        match directive_of(item).map(|d| d.as_str()) {
            None => {}
            Some(Some("replace")) => replace = true,
            Some(Some("delete")) => {
                let Some(id) = item.get(key) else {
                    return Err(PatchError::Malformed(format!(
                        "a $patch: delete item in {} must name its merge key \"{key}\"",
                        path.join(".")
                    )));
                };
                result.retain(|existing| existing.get(key) != Some(id));
            }
            Some(Some("merge")) => {}
            Some(_) => {
                return Err(PatchError::Malformed(format!(
                    "unknown $patch directive in a list item of {}",
                    path.join(".")
                )));
            }
        }
    }
    Ok(replace)
}

fn merge_keyed<'p>(
    live: Vec<Value>,
    patch: &'p [Value],
    key: &'static str,
    path: &mut Vec<&'p str>,
) -> Result<Vec<Value>, PatchError> {
    let mut result = live;
    // Deletions first, as upstream does, so a patch may delete an item and
    // add a fresh one with the same key.
    if keyed_directives(&mut result, patch, key, path)? {
        result.clear();
    }
    for item in patch {
        if directive_of(item).is_some_and(|d| d.as_str() != Some("merge")) {
            continue;
        }
        let Value::Object(item_map) = item else {
            // Keyed lists can still hold primitives (upstream merges them as
            // a set), so fall back to that rather than rejecting the patch.
            if !result.contains(item) {
                result.push(item.clone());
            }
            continue;
        };
        let Some(id) = item_map.get(key) else {
            return Err(PatchError::Malformed(format!(
                "an item in {} lacks its merge key \"{key}\"",
                path.join(".")
            )));
        };
        let existing = result
            .iter()
            .position(|candidate| candidate.get(key) == Some(id));
        match existing {
            Some(index) => {
                let outcome = match &mut result[index] {
                    Value::Object(live_item) => merge_object(live_item, item_map, path)?,
                    other => {
                        let mut fresh = Map::new();
                        let outcome = merge_object(&mut fresh, item_map, path)?;
                        *other = Value::Object(fresh);
                        outcome
                    }
                };
                if let Outcome::Delete = outcome {
                    result.remove(index);
                }
            }
            None => {
                let mut fresh = Map::new();
                if let Outcome::Keep = merge_object(&mut fresh, item_map, path)? {
                    result.push(Value::Object(fresh));
                }
            }
        }
    }
    Ok(result)
}

/// Drops maps that carry a `$patch` directive and the other directive keys,
/// for values that replace rather than merge (atomic lists), mirroring
/// upstream's `removeDirectives`.
fn strip_directives(value: &Value) -> Option<Value> {
    match value {
        Value::Object(map) => {
            if map.contains_key(DIRECTIVE) {
                return None;
            }
            let cleaned = map
                .iter()
                .filter(|(k, _)| !is_directive_key(k))
                .filter_map(|(k, v)| strip_directives(v).map(|v| (k.clone(), v)))
                .collect();
            Some(Value::Object(cleaned))
        }
        Value::Array(items) => Some(Value::Array(
            items.iter().filter_map(strip_directives).collect(),
        )),
        other => Some(other.clone()),
    }
}

/// Applies `$setElementOrder` the way upstream's `normalizeElementOrder` does:
/// items named in the order list follow that order, the rest keep their live
/// order, and the two runs are interleaved by position in the pre-patch list.
fn apply_element_order(
    list: &mut Vec<Value>,
    order: &[Value],
    before_patch: &[Value],
    strategy: Option<MergeKey>,
) {
    let identity = |item: &Value| -> Option<Value> {
        match strategy {
            Some(MergeKey::Key(key)) => item.get(key).cloned(),
            _ => Some(item.clone()),
        }
    };
    let order_ids: Vec<Option<Value>> = order.iter().map(&identity).collect();
    let live_ids: Vec<Option<Value>> = before_patch.iter().map(&identity).collect();
    let rank = |ids: &[Option<Value>], item: &Value| -> Option<usize> {
        let id = identity(item)?;
        ids.iter()
            .position(|candidate| candidate.as_ref() == Some(&id))
    };

    let (mut ordered, server_only): (Vec<Value>, Vec<Value>) = std::mem::take(list)
        .into_iter()
        .partition(|item| rank(&order_ids, item).is_some());
    ordered.sort_by_key(|item| rank(&order_ids, item));

    let mut left = server_only.into_iter().peekable();
    let mut right = ordered.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (Some(l), Some(r)) => match (rank(&live_ids, l), rank(&live_ids, r)) {
                (Some(li), Some(ri)) => li < ri,
                (li, _) => li.is_some(),
            },
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_left { left.next() } else { right.next() };
        list.extend(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(mut target: Value, patch: Value) -> Value {
        strategic_merge_patch(&mut target, &patch).expect("strategic merge patch applies");
        target
    }

    fn pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web",
                "labels": {"app": "web", "tier": "front"},
                "finalizers": ["a.example.com/one", "b.example.com/two"]
            },
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "image": "app:1",
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        "ports": [{"containerPort": 80, "protocol": "TCP"}]
                    },
                    {"name": "sidecar", "image": "sidecar:1"}
                ],
                "tolerations": [{"key": "k1", "operator": "Exists"}]
            }
        })
    }

    // ---- merge_patch ----

    #[test]
    fn merge_patch_merges_maps_and_null_deletes() {
        let mut target = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]});
        merge_patch(
            &mut target,
            &json!({"a": null, "b": {"c": 5, "x": {"y": null, "z": 1}}, "e": [3]}),
        );
        assert_eq!(
            target,
            json!({"b": {"c": 5, "d": 3, "x": {"z": 1}}, "e": [3]})
        );
    }

    #[test]
    fn merge_patch_non_object_replaces() {
        let mut target = json!({"a": 1});
        merge_patch(&mut target, &json!([1, 2]));
        assert_eq!(target, json!([1, 2]));
        let mut scalar = json!("s");
        merge_patch(&mut scalar, &json!({"a": {"b": 1}}));
        assert_eq!(scalar, json!({"a": {"b": 1}}));
    }

    #[test]
    fn merge_patch_keeps_field_order_on_delete() {
        let mut target = json!({"a": 1, "b": 2, "c": 3});
        merge_patch(&mut target, &json!({"a": null}));
        let keys: Vec<&String> = target.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["b", "c"]);
    }

    // ---- json_patch ----

    #[test]
    fn json_patch_applies_operations() {
        let mut target = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 2]});
        json_patch(
            &mut target,
            &json!([
                {"op": "add", "path": "/metadata/labels/b", "value": "2"},
                {"op": "replace", "path": "/metadata/labels/a", "value": "x"},
                {"op": "remove", "path": "/list/0"},
                {"op": "add", "path": "/list/-", "value": 9},
                {"op": "copy", "from": "/metadata/labels/b", "path": "/copied"},
                {"op": "move", "from": "/copied", "path": "/moved"},
                {"op": "test", "path": "/moved", "value": "2"}
            ]),
        )
        .expect("patch applies");
        assert_eq!(
            target,
            json!({"metadata": {"labels": {"a": "x", "b": "2"}}, "list": [2, 9], "moved": "2"})
        );
    }

    #[test]
    fn json_patch_test_null_on_missing_path_passes() {
        let mut target = json!({"metadata": {"name": "x"}});
        json_patch(
            &mut target,
            &json!([
                {"op": "test", "path": "/metadata/annotations", "value": null},
                {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}
            ]),
        )
        .expect("test null on a missing field passes");
        assert_eq!(target["metadata"]["annotations"], json!({"k": "v"}));
    }

    #[test]
    fn json_patch_test_null_on_present_value_fails() {
        let mut target = json!({"a": 1});
        let err = json_patch(
            &mut target,
            &json!([{"op": "test", "path": "/a", "value": null}]),
        )
        .expect_err("1 is not null");
        assert!(matches!(err, PatchError::Failed(_)));
        assert!(err.to_string().contains("expected null"), "{err}");
    }

    #[test]
    fn json_patch_test_null_with_missing_parent_fails() {
        let mut target = json!({"a": 1});
        let err = json_patch(
            &mut target,
            &json!([{"op": "test", "path": "/missing/child", "value": null}]),
        )
        .expect_err("parent does not exist");
        assert!(matches!(err, PatchError::Failed(_)));
    }

    #[test]
    fn json_patch_failed_test_reports_values() {
        let mut target = json!({"spec": {"replicas": 2}});
        let err = json_patch(
            &mut target,
            &json!([{"op": "test", "path": "/spec/replicas", "value": 3}]),
        )
        .expect_err("2 != 3");
        let msg = err.to_string();
        assert!(matches!(err, PatchError::Failed(_)));
        assert!(
            msg.contains("/spec/replicas") && msg.contains("value is 2"),
            "{msg}"
        );
    }

    #[test]
    fn json_patch_is_atomic_on_failure() {
        let original = json!({"a": 1, "b": [1, 2]});
        let mut target = original.clone();
        let err = json_patch(
            &mut target,
            &json!([
                {"op": "replace", "path": "/a", "value": 2},
                {"op": "add", "path": "/b/-", "value": 3},
                {"op": "remove", "path": "/does/not/exist"}
            ]),
        )
        .expect_err("third op fails");
        assert!(matches!(err, PatchError::Failed(_)));
        assert!(err.to_string().contains("operation 2"), "{err}");
        assert_eq!(target, original);
    }

    #[test]
    fn json_patch_rejects_malformed_documents() {
        let mut target = json!({"a": 1});
        for bad in [
            json!({"op": "add", "path": "/a", "value": 1}),
            json!([{"op": "frobnicate", "path": "/a"}]),
            json!([{"op": "add", "value": 1}]),
            json!(["not an op"]),
        ] {
            let err = json_patch(&mut target, &bad).expect_err("malformed");
            assert!(matches!(err, PatchError::Malformed(_)), "{bad}: {err:?}");
        }
        assert_eq!(target, json!({"a": 1}));
    }

    // ---- strategic_merge_patch ----

    #[test]
    fn smp_merges_containers_by_name() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [
                {"name": "sidecar", "image": "sidecar:2"},
                {"name": "new", "image": "new:1"}
            ]}}),
        );
        assert_eq!(
            out["spec"]["containers"],
            json!([
                {
                    "name": "app",
                    "image": "app:1",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                    "ports": [{"containerPort": 80, "protocol": "TCP"}]
                },
                {"name": "sidecar", "image": "sidecar:2"},
                {"name": "new", "image": "new:1"}
            ])
        );
    }

    #[test]
    fn smp_merges_nested_env_and_ports() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{
                "name": "app",
                "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}],
                "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}]
            }]}}),
        );
        let app = &out["spec"]["containers"][0];
        assert_eq!(
            app["env"],
            json!([
                {"name": "A", "value": "1"},
                {"name": "B", "value": "20"},
                {"name": "C", "value": "3"}
            ])
        );
        assert_eq!(
            app["ports"],
            json!([
                {"containerPort": 80, "protocol": "TCP", "name": "http"},
                {"containerPort": 443}
            ])
        );
        assert_eq!(app["image"], "app:1");
    }

    #[test]
    fn smp_unions_finalizers() {
        let out = smp(
            pod(),
            json!({"metadata": {"finalizers": ["c.example.com/three", "a.example.com/one"]}}),
        );
        assert_eq!(
            out["metadata"]["finalizers"],
            json!([
                "a.example.com/one",
                "b.example.com/two",
                "c.example.com/three"
            ])
        );
    }

    #[test]
    fn smp_adds_finalizers_to_object_without_any() {
        let out = smp(
            json!({"metadata": {"name": "x"}}),
            json!({"metadata": {"finalizers": ["f"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["f"]));
    }

    #[test]
    fn smp_delete_from_primitive_list() {
        let out = smp(
            pod(),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a.example.com/one"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b.example.com/two"]));
        assert!(
            out["metadata"]
                .as_object()
                .expect("object")
                .keys()
                .all(|k| !k.starts_with('$'))
        );
    }

    #[test]
    fn smp_patch_delete_removes_list_item() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}),
        );
        let containers = out["spec"]["containers"].as_array().expect("list");
        assert_eq!(containers.len(), 1);
        assert_eq!(containers[0]["name"], "app");
    }

    #[test]
    fn smp_patch_delete_of_missing_item_is_noop() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"name": "nope", "$patch": "delete"}]}}),
        );
        assert_eq!(out, pod());
    }

    #[test]
    fn smp_null_deletes_keys() {
        let out = smp(
            pod(),
            json!({"metadata": {"labels": {"tier": null, "new": "v"}}, "spec": {"tolerations": null}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"app": "web", "new": "v"}));
        assert!(out["spec"].get("tolerations").is_none());
        // Deleting a key that does not exist is harmless and leaves no null behind.
        let out = smp(pod(), json!({"metadata": {"annotations": {"x": null}}}));
        assert_eq!(out["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn smp_null_inside_list_item_deletes_field() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"name": "app", "env": null, "image": "app:2"}]}}),
        );
        let app = &out["spec"]["containers"][0];
        assert!(app.get("env").is_none());
        assert_eq!(app["image"], "app:2");
    }

    #[test]
    fn smp_atomic_lists_are_replaced() {
        let out = smp(
            pod(),
            json!({"spec": {"tolerations": [{"key": "k2", "operator": "Exists"}]}}),
        );
        assert_eq!(
            out["spec"]["tolerations"],
            json!([{"key": "k2", "operator": "Exists"}])
        );
        let out = smp(
            json!({"spec": {"args": ["a", "b"]}}),
            json!({"spec": {"args": ["c"]}}),
        );
        assert_eq!(out["spec"]["args"], json!(["c"]));
    }

    #[test]
    fn smp_patch_replace_on_map() {
        let out = smp(
            pod(),
            json!({"metadata": {"labels": {"$patch": "replace", "only": "this"}}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"only": "this"}));
    }

    #[test]
    fn smp_patch_delete_on_map() {
        let out = smp(
            json!({"spec": {"securityContext": {"runAsUser": 1}, "x": 1}}),
            json!({"spec": {"securityContext": {"$patch": "delete"}}}),
        );
        assert_eq!(out, json!({"spec": {"x": 1}}));
    }

    #[test]
    fn smp_patch_replace_in_keyed_list() {
        let out = smp(
            pod(),
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "solo", "image": "s:1"}]}}),
        );
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "solo", "image": "s:1"}])
        );
    }

    #[test]
    fn smp_service_ports_merge_by_port() {
        let svc = json!({"kind": "Service", "spec": {"ports": [
            {"port": 80, "targetPort": 8080},
            {"port": 443, "targetPort": 8443}
        ]}});
        let out = smp(
            svc,
            json!({"spec": {"ports": [{"port": 443, "targetPort": 9443}, {"port": 22}]}}),
        );
        assert_eq!(
            out["spec"]["ports"],
            json!([
                {"port": 80, "targetPort": 8080},
                {"port": 443, "targetPort": 9443},
                {"port": 22}
            ])
        );
    }

    #[test]
    fn smp_conditions_and_owner_references() {
        let obj = json!({
            "metadata": {"ownerReferences": [{"uid": "u1", "name": "a"}]},
            "status": {"conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "Scheduled", "status": "True"}
            ]}
        });
        let out = smp(
            obj,
            json!({
                "metadata": {"ownerReferences": [{"uid": "u2", "name": "b"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}
            }),
        );
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"uid": "u1", "name": "a"}, {"uid": "u2", "name": "b"}])
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([
                {"type": "Ready", "status": "True"},
                {"type": "Scheduled", "status": "True"}
            ])
        );
    }

    #[test]
    fn smp_strips_set_element_order_and_retain_keys() {
        let out = smp(
            pod(),
            json!({
                "metadata": {"$setElementOrder/finalizers": ["b.example.com/two", "a.example.com/one"]},
                "spec": {
                    "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}],
                    "containers": [{"name": "app", "image": "app:2"}]
                }
            }),
        );
        let names: Vec<&str> = out["spec"]["containers"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, ["sidecar", "app"]);
        assert_eq!(out["spec"]["containers"][1]["image"], "app:2");
        assert_eq!(
            out["metadata"]["finalizers"],
            json!(["b.example.com/two", "a.example.com/one"])
        );
        let text = out.to_string();
        assert!(!text.contains('$'), "{text}");

        let out = smp(
            json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
        );
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn smp_new_fields_lose_directives() {
        let out = smp(
            json!({"spec": {}}),
            json!({"spec": {
                "containers": [{"name": "gone", "$patch": "delete"}, {"name": "kept", "x": null}],
                "fresh": {"a": 1, "b": null}
            }}),
        );
        assert_eq!(
            out,
            json!({"spec": {"containers": [{"name": "kept"}], "fresh": {"a": 1}}})
        );
    }

    #[test]
    fn smp_rejects_non_object_patch_and_bad_directives() {
        let mut target = pod();
        for bad in [
            json!([{"op": "add"}]),
            json!("string"),
            json!(null),
            json!({"spec": {"containers": [{"image": "no-name"}]}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
            json!({"metadata": {"labels": {"$patch": "explode"}}}),
        ] {
            let err = strategic_merge_patch(&mut target, &bad).expect_err("malformed");
            assert!(matches!(err, PatchError::Malformed(_)), "{bad}: {err:?}");
        }
        assert_eq!(
            target,
            pod(),
            "a rejected patch leaves the object untouched"
        );
    }

    #[test]
    fn smp_scalar_replaces_and_type_changes() {
        let out = smp(
            json!({"spec": {"replicas": 1, "selector": "x"}}),
            json!({"spec": {"replicas": 3, "selector": {"matchLabels": {"a": "b"}}}}),
        );
        assert_eq!(
            out,
            json!({"spec": {"replicas": 3, "selector": {"matchLabels": {"a": "b"}}}})
        );
    }

    // ---- list_merge_key ----

    #[test]
    fn merge_key_table() {
        use MergeKey::{Key, Set};
        let cases: &[(&[&str], Option<MergeKey>)] = &[
            (
                &["spec", "template", "spec", "containers"],
                Some(Key("name")),
            ),
            (&["spec", "initContainers"], Some(Key("name"))),
            (&["spec", "containers", "env"], Some(Key("name"))),
            (&["spec", "containers", "envFrom"], None),
            (
                &["spec", "containers", "volumeMounts"],
                Some(Key("mountPath")),
            ),
            (&["spec", "containers", "ports"], Some(Key("containerPort"))),
            (&["spec", "ports"], Some(Key("port"))),
            (&["subsets", "ports"], None),
            (&["spec", "template", "spec", "volumes"], Some(Key("name"))),
            (&["spec", "imagePullSecrets"], Some(Key("name"))),
            (&["imagePullSecrets"], None),
            (&["status", "conditions"], Some(Key("type"))),
            (&["metadata", "ownerReferences"], Some(Key("uid"))),
            (&["metadata", "finalizers"], Some(Set)),
            (&["spec", "template", "metadata", "finalizers"], Some(Set)),
            (&["spec", "finalizers"], None),
            (&["spec", "hostAliases"], Some(Key("ip"))),
            (
                &["spec", "topologySpreadConstraints"],
                Some(Key("topologyKey")),
            ),
            (&["spec", "tolerations"], None),
            (&["rules"], None),
            (&["subsets"], None),
            (&[], None),
        ];
        for (path, expected) in cases {
            assert_eq!(list_merge_key(path), *expected, "{path:?}");
        }
    }
}
