//! CRD structural-schema handling (`apiextensions.k8s.io/v1`
//! `openAPIV3Schema`): pruning, defaulting and validation of custom resources.
//!
//! The semantics follow the apiextensions-apiserver (`pruning`,
//! `structuraldefaulting` and the kube-openapi validator) so that operators
//! developed against devcluster see the same stored objects and the same
//! rejections as on a real cluster. Schemas are taken as raw JSON and are not
//! themselves validated: a malformed schema keyword is ignored rather than
//! failing requests, because rejecting bad CRDs is the CRD endpoint's job.

use serde_json::{Map, Number, Value};

/// One validation failure, rendered into a `metav1.Status` cause by the
/// server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cause {
    /// The k8s `CauseType`: `"FieldValueRequired"`, `"FieldValueInvalid"`,
    /// `"FieldValueNotSupported"` or `"FieldValueTypeInvalid"`.
    pub(crate) reason: &'static str,
    /// Dotted path of the offending field, e.g. `spec.size` or
    /// `spec.items[0].name`.
    pub(crate) field: String,
    /// Human-readable text in the k8s wording, e.g. `Required value`.
    pub(crate) message: String,
}

/// Fields that belong to the API machinery rather than the CRD author; a
/// real server handles them itself, so the schema must never remove, default
/// or validate them.
fn is_meta_field(k: &str) -> bool {
    matches!(k, "apiVersion" | "kind" | "metadata")
}

fn flag(s: &Map<String, Value>, name: &str) -> bool {
    s.get(name).and_then(Value::as_bool).unwrap_or(false)
}

fn properties(s: &Map<String, Value>) -> Option<&Map<String, Value>> {
    s.get("properties").and_then(Value::as_object)
}

/// The schema governing one named field: a declared property wins over
/// `additionalProperties`, as in k8s.
fn field_schema<'a>(s: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    properties(s)
        .and_then(|p| p.get(k))
        .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
}

/// Drops fields not declared by the schema, then applies `default:` values
/// to missing fields.
///
/// Pruning honours `x-kubernetes-preserve-unknown-fields`,
/// `additionalProperties` (`true` keeps values as-is, a schema prunes each
/// value), `items`, `x-kubernetes-embedded-resource` (its `apiVersion`,
/// `kind` and `metadata` survive) and `x-kubernetes-int-or-string`.
/// Defaults are deep-copied and themselves pruned and defaulted; a default
/// nested under an absent parent object is not applied unless the parent has
/// a default of its own. A declared, non-nullable field that is `null` is
/// replaced by its default or removed, as k8s does before defaulting. At the
/// root, `apiVersion`, `kind` and `metadata` are always left untouched.
///
/// Returns the paths of the pruned fields (`spec.foo`, `spec.items[0].bar`), for
/// `fieldValidation`.
pub(crate) fn prune_and_default(obj: &mut Value, schema: &Value) -> Vec<String> {
    let mut pruned = Vec::new();
    prune(obj, Some(schema), true, "", &mut pruned);
    apply_defaults(obj, schema, true);
    pruned
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

fn prune(x: &mut Value, s: Option<&Value>, root: bool, path: &str, pruned: &mut Vec<String>) {
    let s = s.and_then(Value::as_object);
    if let Some(s) = s
        && flag(s, "x-kubernetes-preserve-unknown-fields")
    {
        skip_prune(x, s, root, path, pruned);
        return;
    }
    match x {
        Value::Object(m) => {
            let Some(s) = s else {
                // No schema at all for an object means nothing in it is
                // declared (k8s prunes it to `{}`), except root meta fields.
                m.retain(|k, _| {
                    let keep = root && is_meta_field(k);
                    if !keep {
                        pruned.push(join(path, k));
                    }
                    keep
                });
                return;
            };
            let embedded = flag(s, "x-kubernetes-embedded-resource");
            let props = properties(s);
            let additional = s.get("additionalProperties");
            m.retain(|k, v| {
                if (root || embedded) && is_meta_field(k) {
                    return true;
                }
                let child = join(path, k);
                if let Some(p) = props.and_then(|p| p.get(k)) {
                    prune(v, Some(p), false, &child, pruned);
                    return true;
                }
                let keep = match additional {
                    Some(Value::Bool(keep)) => *keep,
                    Some(ap @ Value::Object(_)) => {
                        prune(v, Some(ap), false, &child, pruned);
                        true
                    }
                    _ => false,
                };
                if !keep {
                    pruned.push(child);
                }
                keep
            });
        }
        Value::Array(items) => {
            let item_schema = s.and_then(|s| s.get("items"));
            for (i, v) in items.iter_mut().enumerate() {
                prune(v, item_schema, false, &format!("{path}[{i}]"), pruned);
            }
        }
        _ => {}
    }
}

/// Pruning below a preserve-unknown-fields node: unknown fields stay, but
/// declared properties (and additionalProperties values) are still pruned by
/// their own schemas, and the preservation carries into array items.
fn skip_prune(
    x: &mut Value,
    s: &Map<String, Value>,
    root: bool,
    path: &str,
    pruned: &mut Vec<String>,
) {
    match x {
        Value::Object(m) => {
            let embedded = flag(s, "x-kubernetes-embedded-resource");
            for (k, v) in m.iter_mut() {
                if (root || embedded) && is_meta_field(k) {
                    continue;
                }
                if let Some(fs) = field_schema(s, k) {
                    prune(v, Some(fs), false, &join(path, k), pruned);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items").and_then(Value::as_object) {
                for (i, v) in items.iter_mut().enumerate() {
                    skip_prune(v, is, false, &format!("{path}[{i}]"), pruned);
                }
            }
        }
        _ => {}
    }
}

fn apply_defaults(x: &mut Value, s: &Value, root: bool) {
    let Some(s) = s.as_object() else {
        return;
    };
    match x {
        Value::Object(m) => {
            if let Some(props) = properties(s) {
                for (k, p) in props {
                    if root && is_meta_field(k) {
                        continue;
                    }
                    let Some(p) = p.as_object() else {
                        continue;
                    };
                    let nullable = flag(p, "nullable");
                    let needs_default = match m.get(k) {
                        None => true,
                        Some(Value::Null) => !nullable,
                        Some(_) => false,
                    };
                    if !needs_default {
                        continue;
                    }
                    match p.get("default") {
                        Some(d) => {
                            let mut d = d.clone();
                            let ps = Value::Object(p.clone());
                            prune(&mut d, Some(&ps), false, "", &mut Vec::new());
                            m.insert(k.clone(), d);
                        }
                        // A null the schema does not allow carries no
                        // information, so k8s drops it instead of failing.
                        None if m.contains_key(k) => {
                            m.remove(k);
                        }
                        None => {}
                    }
                }
            }
            for (k, v) in m.iter_mut() {
                if root && is_meta_field(k) {
                    continue;
                }
                if let Some(fs) = field_schema(s, k) {
                    apply_defaults(v, fs, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for v in items {
                    apply_defaults(v, is, false);
                }
            }
        }
        _ => {}
    }
}

/// Validates `obj` against the schema and returns every failure found.
///
/// Checks `type` (`integer` accepts whole-number JSON numbers such as `3.0`),
/// `nullable`, `x-kubernetes-int-or-string`, `required`, `enum`,
/// `minimum`/`maximum` (with boolean `exclusiveMinimum`/`exclusiveMaximum`),
/// `multipleOf`, `minLength`/`maxLength`, `minItems`/`maxItems`,
/// `uniqueItems`, `minProperties`/`maxProperties` and `allOf`. `format` and
/// `pattern` are not enforced (no regex engine), nor are `anyOf`, `oneOf`
/// and `not`. The root's `apiVersion`, `kind` and `metadata` are skipped.
pub(crate) fn validate(obj: &Value, schema: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    validate_node(obj, schema, "", true, &mut out);
    out
}

fn child_path(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_owned()
    } else {
        format!("{path}.{k}")
    }
}

/// The name used for a path inside messages; k8s never validates a bare
/// root here, but keep the message readable if a schema makes us.
fn display_path(path: &str) -> &str {
    if path.is_empty() { "<root>" } else { path }
}

fn is_whole(n: &Number) -> bool {
    n.is_i64()
        || n.is_u64()
        || n.as_f64()
            .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
}

/// JSON type name as k8s reports it, where whole numbers are "integer".
fn type_name(x: &Value) -> &'static str {
    match x {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if is_whole(n) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(x: &Value, t: &str) -> bool {
    match t {
        "object" => x.is_object(),
        "array" => x.is_array(),
        "string" => x.is_string(),
        "boolean" => x.is_boolean(),
        "number" => x.is_number(),
        "integer" => matches!(x, Value::Number(n) if is_whole(n)),
        // An unknown type keyword is a schema problem, not the object's.
        _ => true,
    }
}

/// Formats a float like Go's `%v`, so `1.0` prints as `1`.
fn fmt_f64(f: f64) -> String {
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e15 {
        // Exact: the value is whole and well inside i64 range.
        #[allow(clippy::cast_possible_truncation)]
        let i = f as i64;
        i.to_string()
    } else {
        f.to_string()
    }
}

/// Renders a value the way k8s prints it after `Invalid value: `.
fn render(x: &Value) -> String {
    match x {
        Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
        Value::Number(n) => n.as_f64().map_or_else(|| n.to_string(), fmt_f64),
        other => other.to_string(),
    }
}

/// Equality with numbers compared by value, so an enum entry `1` matches an
/// object's `1.0` as it does after k8s JSON decoding.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(i), Some(j)) => i == j,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn invalid(out: &mut Vec<Cause>, path: &str, x: &Value, what: &str) {
    out.push(Cause {
        reason: "FieldValueInvalid",
        field: path.to_owned(),
        message: format!(
            "Invalid value: {}: {} in body {what}",
            render(x),
            display_path(path)
        ),
    });
}

fn type_invalid(out: &mut Vec<Cause>, path: &str, x: &Value, expected: &str) {
    let actual = type_name(x);
    out.push(Cause {
        reason: "FieldValueTypeInvalid",
        field: path.to_owned(),
        message: format!(
            "Invalid value: \"{actual}\": {} in body must be of type {expected}: \"{actual}\"",
            display_path(path)
        ),
    });
}

fn validate_node(x: &Value, s: &Value, path: &str, root: bool, out: &mut Vec<Cause>) {
    let Some(s) = s.as_object() else {
        return;
    };
    let int_or_string = flag(s, "x-kubernetes-int-or-string");
    let ty = s.get("type").and_then(Value::as_str);

    if x.is_null() {
        if flag(s, "nullable") {
            return;
        }
        if let Some(t) = ty {
            type_invalid(out, path, x, t);
        } else if int_or_string {
            type_invalid(out, path, x, "integer or string");
        }
        return;
    }
    if int_or_string {
        if !(x.is_string() || has_type(x, "integer")) {
            type_invalid(out, path, x, "integer or string");
            return;
        }
    } else if let Some(t) = ty
        && !has_type(x, t)
    {
        type_invalid(out, path, x, t);
        return;
    }

    if let Some(Value::Array(allowed)) = s.get("enum")
        && !allowed.iter().any(|e| json_eq(e, x))
    {
        let supported: Vec<String> = allowed.iter().map(render).collect();
        out.push(Cause {
            reason: "FieldValueNotSupported",
            field: path.to_owned(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                render(x),
                supported.join(", ")
            ),
        });
    }

    if let Some(i) = s.get("allOf").and_then(Value::as_array) {
        for sub in i {
            validate_node(x, sub, path, root, out);
        }
    }

    match x {
        Value::Number(n) => validate_number(n, x, s, path, out),
        Value::String(st) => validate_string(st, x, s, path, out),
        Value::Array(items) => validate_array(items, x, s, path, out),
        Value::Object(m) => validate_object(m, x, s, path, root, out),
        Value::Bool(_) | Value::Null => {}
    }
}

/// `minLength` and `maxLength`, in characters.
fn validate_string(st: &str, x: &Value, s: &Map<String, Value>, path: &str, out: &mut Vec<Cause>) {
    let count = |k: &str| s.get(k).and_then(Value::as_u64);
    let len = st.chars().count() as u64;
    if let Some(min) = count("minLength")
        && len < min
    {
        invalid(
            out,
            path,
            x,
            &format!("should be at least {min} chars long"),
        );
    }
    if let Some(max) = count("maxLength")
        && len > max
    {
        invalid(out, path, x, &format!("may not be longer than {max}"));
    }
}

/// `minItems`, `maxItems`, `uniqueItems`, then each item against `items`.
fn validate_array(
    items: &[Value],
    x: &Value,
    s: &Map<String, Value>,
    path: &str,
    out: &mut Vec<Cause>,
) {
    let count = |k: &str| s.get(k).and_then(Value::as_u64);
    let len = items.len() as u64;
    if let Some(min) = count("minItems")
        && len < min
    {
        invalid(out, path, x, &format!("should have at least {min} items"));
    }
    if let Some(max) = count("maxItems")
        && len > max
    {
        invalid(out, path, x, &format!("should have at most {max} items"));
    }
    if flag(s, "uniqueItems")
        && items
            .iter()
            .enumerate()
            .any(|(i, a)| items[i + 1..].iter().any(|b| json_eq(a, b)))
    {
        invalid(out, path, x, "shouldn't contain duplicates");
    }
    if let Some(is) = s.get("items") {
        for (i, v) in items.iter().enumerate() {
            validate_node(v, is, &format!("{path}[{i}]"), false, out);
        }
    }
}

/// `minProperties`, `maxProperties`, `required`, then each field against its schema (the root's
/// `apiVersion`, `kind` and `metadata` skipped).
fn validate_object(
    m: &Map<String, Value>,
    x: &Value,
    s: &Map<String, Value>,
    path: &str,
    root: bool,
    out: &mut Vec<Cause>,
) {
    let count = |k: &str| s.get(k).and_then(Value::as_u64);
    let len = m.len() as u64;
    if let Some(min) = count("minProperties")
        && len < min
    {
        invalid(
            out,
            path,
            x,
            &format!("should have at least {min} properties"),
        );
    }
    if let Some(max) = count("maxProperties")
        && len > max
    {
        invalid(
            out,
            path,
            x,
            &format!("should have at most {max} properties"),
        );
    }
    if let Some(req) = s.get("required").and_then(Value::as_array) {
        for k in req.iter().filter_map(Value::as_str) {
            if root && is_meta_field(k) {
                continue;
            }
            if !m.contains_key(k) {
                out.push(Cause {
                    reason: "FieldValueRequired",
                    field: child_path(path, k),
                    message: "Required value".to_owned(),
                });
            }
        }
    }
    for (k, v) in m {
        if root && is_meta_field(k) {
            continue;
        }
        if let Some(fs) = field_schema(s, k) {
            validate_node(v, fs, &child_path(path, k), false, out);
        }
    }
}

fn validate_number(
    n: &Number,
    x: &Value,
    s: &Map<String, Value>,
    path: &str,
    out: &mut Vec<Cause>,
) {
    let num = |k: &str| s.get(k).and_then(Value::as_f64);
    let Some(f) = n.as_f64() else {
        return;
    };
    if let Some(min) = num("minimum") {
        if flag(s, "exclusiveMinimum") {
            if f <= min {
                invalid(
                    out,
                    path,
                    x,
                    &format!("should be greater than {}", fmt_f64(min)),
                );
            }
        } else if f < min {
            invalid(
                out,
                path,
                x,
                &format!("should be greater than or equal to {}", fmt_f64(min)),
            );
        }
    }
    if let Some(max) = num("maximum") {
        if flag(s, "exclusiveMaximum") {
            if f >= max {
                invalid(
                    out,
                    path,
                    x,
                    &format!("should be less than {}", fmt_f64(max)),
                );
            }
        } else if f > max {
            invalid(
                out,
                path,
                x,
                &format!("should be less than or equal to {}", fmt_f64(max)),
            );
        }
    }
    if let Some(m) = s.get("multipleOf").and_then(Value::as_number) {
        let ok = match (n.as_i64(), m.as_i64()) {
            (Some(a), Some(b)) if b != 0 => a % b == 0,
            _ => match m.as_f64() {
                Some(mf) if mf > 0.0 => (f / mf).fract() == 0.0,
                _ => true,
            },
        };
        if !ok {
            let mf = m.as_f64().map_or_else(|| m.to_string(), fmt_f64);
            invalid(out, path, x, &format!("should be a multiple of {mf}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 1, "maximum": 10},
                        "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                        "name": {"type": "string", "minLength": 2, "maxLength": 5},
                        "port": {"x-kubernetes-int-or-string": true},
                        "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": true},
                        "note": {"type": "string", "nullable": true},
                        "tags": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": 3,
                            "items": {"type": "string"}
                        },
                        "containers": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "pull": {"type": "string", "default": "IfNotPresent"}
                                }
                            }
                        },
                        "resources": {
                            "type": "object",
                            "additionalProperties": {
                                "type": "object",
                                "properties": {
                                    "cpu": {"type": "integer"},
                                    "unit": {"type": "string", "default": "m"}
                                }
                            }
                        },
                        "labels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"}
                        },
                        "free": {"type": "object", "additionalProperties": true},
                        "config": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": true,
                            "properties": {
                                "strict": {
                                    "type": "object",
                                    "properties": {"x": {"type": "integer"}}
                                }
                            }
                        },
                        "template": {
                            "type": "object",
                            "x-kubernetes-embedded-resource": true,
                            "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}}}
                        },
                        "nested": {
                            "type": "object",
                            "properties": {
                                "inner": {"type": "integer", "default": 7}
                            }
                        },
                        "withDefault": {
                            "type": "object",
                            "default": {"unknown": 1},
                            "properties": {
                                "inner": {"type": "integer", "default": 3}
                            }
                        }
                    }
                },
                "status": {
                    "type": "object",
                    "properties": {"ready": {"type": "boolean"}}
                }
            }
        })
    }

    fn pruned(obj: Value) -> Value {
        let mut obj = obj;
        prune_and_default(&mut obj, &schema());
        obj
    }

    #[test]
    fn root_meta_fields_are_untouched() {
        let out = pruned(json!({
            "apiVersion": "x.io/v1",
            "kind": "Thing",
            "metadata": {"name": "n", "anything": {"deep": true}},
            "spec": {"size": 1},
            "extra": 1
        }));
        assert_eq!(out["apiVersion"], "x.io/v1");
        assert_eq!(out["kind"], "Thing");
        assert_eq!(
            out["metadata"],
            json!({"name": "n", "anything": {"deep": true}})
        );
        assert!(out.get("extra").is_none());
    }

    #[test]
    fn prunes_nested_unknown_fields() {
        let out = pruned(json!({
            "spec": {
                "size": 1,
                "bogus": {"a": 1},
                "nested": {"inner": 2, "junk": "x"},
                "status": {"ready": true}
            },
            "status": {"ready": true, "phase": "Up"}
        }));
        assert!(out["spec"].get("bogus").is_none());
        assert!(out["spec"].get("status").is_none());
        assert_eq!(out["spec"]["nested"], json!({"inner": 2}));
        assert_eq!(out["status"], json!({"ready": true}));
    }

    #[test]
    fn prunes_array_items_per_schema() {
        let out = pruned(json!({
            "spec": {"size": 1, "containers": [{"name": "c", "junk": 1, "pull": "Always"}]}
        }));
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "c", "pull": "Always"}])
        );
    }

    #[test]
    fn preserve_unknown_fields_subtree_is_kept() {
        let out = pruned(json!({
            "spec": {
                "size": 1,
                "config": {
                    "anything": {"goes": [1, {"deep": true}]},
                    "strict": {"x": 1, "y": 2}
                }
            }
        }));
        assert_eq!(
            out["spec"]["config"]["anything"],
            json!({"goes": [1, {"deep": true}]})
        );
        // Declared properties under a preserving node are still pruned.
        assert_eq!(out["spec"]["config"]["strict"], json!({"x": 1}));
    }

    #[test]
    fn root_preserve_unknown_fields_keeps_everything() {
        let s = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        let mut obj = json!({"kind": "K", "spec": {"a": {"b": 1}}, "other": [1]});
        let before = obj.clone();
        prune_and_default(&mut obj, &s);
        assert_eq!(obj, before);
    }

    #[test]
    fn additional_properties_values_pruned_per_schema() {
        let out = pruned(json!({
            "spec": {
                "size": 1,
                "resources": {
                    "a": {"cpu": 1, "junk": true, "unit": "k"},
                    "b": {"cpu": 2}
                },
                "labels": {"x": "y"},
                "free": {"k": {"deep": 1}}
            }
        }));
        assert_eq!(
            out["spec"]["resources"],
            json!({"a": {"cpu": 1, "unit": "k"}, "b": {"cpu": 2, "unit": "m"}})
        );
        assert_eq!(out["spec"]["labels"], json!({"x": "y"}));
        assert_eq!(out["spec"]["free"], json!({"k": {"deep": 1}}));
    }

    #[test]
    fn embedded_resource_keeps_its_meta_fields() {
        let out = pruned(json!({
            "spec": {
                "size": 1,
                "template": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"labels": {"a": "b"}},
                    "spec": {"a": "x", "b": "y"},
                    "junk": 1
                }
            }
        }));
        assert_eq!(
            out["spec"]["template"],
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"labels": {"a": "b"}},
                "spec": {"a": "x"}
            })
        );
    }

    #[test]
    fn int_or_string_values_survive() {
        let a = pruned(json!({"spec": {"size": 1, "port": 80}}));
        assert_eq!(a["spec"]["port"], 80);
        let b = pruned(json!({"spec": {"size": 1, "port": "http"}}));
        assert_eq!(b["spec"]["port"], "http");
    }

    #[test]
    fn defaults_applied_including_nested() {
        let out = pruned(json!({
            "spec": {"size": 1, "nested": {}, "containers": [{"name": "c"}]}
        }));
        assert_eq!(out["spec"]["mode"], "a");
        assert_eq!(out["spec"]["nested"]["inner"], 7);
        assert_eq!(out["spec"]["containers"][0]["pull"], "IfNotPresent");
    }

    #[test]
    fn default_not_applied_under_absent_parent() {
        let out = pruned(json!({"spec": {"size": 1}}));
        assert!(out["spec"].get("nested").is_none());
        // Without a default on `status`, nothing is created at the root.
        assert!(out.get("status").is_none());
    }

    #[test]
    fn parent_default_is_pruned_then_defaulted() {
        let out = pruned(json!({"spec": {"size": 1}}));
        assert_eq!(out["spec"]["withDefault"], json!({"inner": 3}));
    }

    #[test]
    fn defaults_do_not_override_present_values() {
        let out = pruned(json!({"spec": {"size": 1, "mode": "b", "withDefault": {"inner": 9}}}));
        assert_eq!(out["spec"]["mode"], "b");
        assert_eq!(out["spec"]["withDefault"], json!({"inner": 9}));
    }

    #[test]
    fn defaults_are_deep_copies() {
        let s = schema();
        let mut a = json!({"spec": {"size": 1}});
        let mut b = json!({"spec": {"size": 1}});
        prune_and_default(&mut a, &s);
        if let Some(w) = a["spec"]["withDefault"].as_object_mut() {
            w.insert("inner".to_owned(), json!(100));
        }
        prune_and_default(&mut b, &s);
        assert_eq!(b["spec"]["withDefault"]["inner"], 3);
        assert_eq!(
            s["properties"]["spec"]["properties"]["withDefault"]["default"],
            json!({"unknown": 1})
        );
    }

    #[test]
    fn non_nullable_nulls_defaulted_or_dropped() {
        let out = pruned(json!({
            "spec": {"size": 1, "mode": null, "name": null, "note": null}
        }));
        assert_eq!(out["spec"]["mode"], "a");
        assert!(out["spec"].get("name").is_none());
        assert_eq!(out["spec"]["note"], Value::Null);
    }

    #[test]
    fn root_meta_fields_not_defaulted() {
        let s = json!({
            "type": "object",
            "properties": {"kind": {"type": "string", "default": "X"}}
        });
        let mut obj = json!({});
        prune_and_default(&mut obj, &s);
        assert_eq!(obj, json!({}));
    }

    fn causes(obj: Value) -> Vec<Cause> {
        validate(&obj, &schema())
    }

    #[test]
    fn valid_object_has_no_causes() {
        let c = causes(json!({
            "apiVersion": "x.io/v1",
            "kind": "Thing",
            "metadata": {"name": "n"},
            "spec": {
                "size": 3.0,
                "mode": "b",
                "name": "abc",
                "port": "http",
                "ratio": 0.5,
                "note": null,
                "tags": ["x"],
                "containers": [{"name": "c"}],
                "resources": {"a": {"cpu": 1}},
                "config": {"whatever": [1]}
            }
        }));
        assert_eq!(c, vec![]);
    }

    #[test]
    fn type_errors_have_k8s_messages() {
        let c = causes(json!({"spec": {"size": "string"}}));
        assert_eq!(
            c,
            vec![Cause {
                reason: "FieldValueTypeInvalid",
                field: "spec.size".to_owned(),
                message: r#"Invalid value: "string": spec.size in body must be of type integer: "string""#
                    .to_owned(),
            }]
        );
        let c = causes(json!({"spec": {"size": 1.5}}));
        assert_eq!(
            c[0].message,
            r#"Invalid value: "number": spec.size in body must be of type integer: "number""#
        );
        let c = causes(json!({"spec": {"size": 1, "name": 5}}));
        assert_eq!(c[0].field, "spec.name");
        assert!(
            c[0].message
                .ends_with(r#"must be of type string: "integer""#)
        );
    }

    #[test]
    fn required_fields() {
        let c = causes(json!({"metadata": {}}));
        assert_eq!(
            c,
            vec![Cause {
                reason: "FieldValueRequired",
                field: "spec".to_owned(),
                message: "Required value".to_owned(),
            }]
        );
        let c = causes(json!({"spec": {"containers": [{}]}}));
        let fields: Vec<&str> = c.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, vec!["spec.size", "spec.containers[0].name"]);
        assert!(c.iter().all(|c| c.reason == "FieldValueRequired"));
    }

    #[test]
    fn root_meta_required_is_skipped() {
        let s = json!({"type": "object", "required": ["metadata", "kind"], "properties": {"metadata": {"type": "string"}}});
        assert!(validate(&json!({"metadata": {"name": "x"}}), &s).is_empty());
    }

    #[test]
    fn enum_violation() {
        let c = causes(json!({"spec": {"size": 1, "mode": "x"}}));
        assert_eq!(
            c,
            vec![Cause {
                reason: "FieldValueNotSupported",
                field: "spec.mode".to_owned(),
                message: r#"Unsupported value: "x": supported values: "a", "b""#.to_owned(),
            }]
        );
        let s = json!({"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}}});
        assert!(validate(&json!({"n": 2.0}), &s).is_empty());
        assert_eq!(
            validate(&json!({"n": 3}), &s)[0].message,
            "Unsupported value: 3: supported values: 1, 2"
        );
    }

    #[test]
    fn numeric_bounds() {
        let c = causes(json!({"spec": {"size": 0}}));
        assert_eq!(c[0].reason, "FieldValueInvalid");
        assert_eq!(
            c[0].message,
            "Invalid value: 0: spec.size in body should be greater than or equal to 1"
        );
        let c = causes(json!({"spec": {"size": 11}}));
        assert_eq!(
            c[0].message,
            "Invalid value: 11: spec.size in body should be less than or equal to 10"
        );
        let c = causes(json!({"spec": {"size": 1, "ratio": 0}}));
        assert_eq!(
            c[0].message,
            "Invalid value: 0: spec.ratio in body should be greater than 0"
        );
        let s = json!({"type": "object", "properties": {"n": {"type": "number", "maximum": 1.5, "exclusiveMaximum": true, "multipleOf": 0.5}}});
        assert!(validate(&json!({"n": 1.0}), &s).is_empty());
        let c = validate(&json!({"n": 1.5}), &s);
        assert_eq!(
            c[0].message,
            "Invalid value: 1.5: n in body should be less than 1.5"
        );
        let c = validate(&json!({"n": 0.3}), &s);
        assert_eq!(
            c[0].message,
            "Invalid value: 0.3: n in body should be a multiple of 0.5"
        );
    }

    #[test]
    fn string_lengths() {
        let c = causes(json!({"spec": {"size": 1, "name": "a"}}));
        assert_eq!(
            c[0].message,
            r#"Invalid value: "a": spec.name in body should be at least 2 chars long"#
        );
        let c = causes(json!({"spec": {"size": 1, "name": "abcdef"}}));
        assert_eq!(
            c[0].message,
            r#"Invalid value: "abcdef": spec.name in body may not be longer than 5"#
        );
        // Length is in characters, not bytes.
        assert!(causes(json!({"spec": {"size": 1, "name": "ééééé"}})).is_empty());
    }

    #[test]
    fn array_constraints_and_item_paths() {
        let c = causes(json!({"spec": {"size": 1, "tags": []}}));
        assert_eq!(c[0].field, "spec.tags");
        assert!(c[0].message.ends_with("should have at least 1 items"));
        let c = causes(json!({"spec": {"size": 1, "tags": ["a", "b", "c", "d"]}}));
        assert!(c[0].message.ends_with("should have at most 3 items"));
        let c = causes(json!({"spec": {"size": 1, "tags": ["a", 2]}}));
        assert_eq!(c[0].field, "spec.tags[1]");
        assert_eq!(c[0].reason, "FieldValueTypeInvalid");
        let s = json!({"type": "array", "uniqueItems": true});
        assert_eq!(validate(&json!([1, 2, 1.0]), &s).len(), 1);
    }

    #[test]
    fn nullable_and_int_or_string() {
        let c = causes(json!({"spec": {"size": null}}));
        assert_eq!(
            c[0].message,
            r#"Invalid value: "null": spec.size in body must be of type integer: "null""#
        );
        assert!(causes(json!({"spec": {"size": 1, "port": 8080}})).is_empty());
        let c = causes(json!({"spec": {"size": 1, "port": true}}));
        assert_eq!(c[0].field, "spec.port");
        assert_eq!(c[0].reason, "FieldValueTypeInvalid");
        let c = causes(json!({"spec": {"size": 1, "port": 1.5}}));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn additional_properties_validated_with_key_paths() {
        let c = causes(
            json!({"spec": {"size": 1, "labels": {"k": 1}, "resources": {"r": {"cpu": "x"}}}}),
        );
        let fields: Vec<&str> = c.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, vec!["spec.labels.k", "spec.resources.r.cpu"]);
    }

    #[test]
    fn multiple_causes_collected() {
        let c = causes(json!({"spec": {"size": 0, "mode": "z", "name": "x"}}));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn object_property_counts_and_all_of() {
        let s = json!({
            "type": "object",
            "maxProperties": 1,
            "allOf": [{"required": ["a"]}]
        });
        let c = validate(&json!({"b": 1, "c": 2}), &s);
        let reasons: Vec<&str> = c.iter().map(|c| c.reason).collect();
        assert_eq!(reasons, vec!["FieldValueRequired", "FieldValueInvalid"]);
        assert_eq!(c[0].field, "a");
    }
}
