//! What kube-apiserver checks while it decodes a request body into a built-in kind's Go type:
//! values of the wrong JSON type (400, `json: cannot unmarshal ...`) and fields the type does
//! not declare, which `fieldValidation` turns into an error (`Strict`), a warning (`Warn`, the
//! default) or nothing (`Ignore`). Unknown fields are dropped in every mode, as decoding into a
//! Go struct drops them.
//!
//! Custom resources reach [`enforce`] with the fields their structural schema pruned, so both
//! kinds of object answer `fieldValidation` the same way.

use crate::openapi::CATALOG;
use crate::resources::ResourceInfo;
use crate::status::ApiError;
use serde_json::{Map, Value};

/// The `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Unknown fields fail the request.
    Strict,
    /// Unknown fields are dropped with a warning header each (the server default).
    #[default]
    Warn,
    /// Unknown fields are dropped silently.
    Ignore,
}

impl FieldValidation {
    /// Parses the query parameter; an unknown value is kube-apiserver's 400.
    pub fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        match v {
            None | Some("") | Some("Warn") => Ok(Self::Warn),
            Some("Strict") => Ok(Self::Strict),
            Some("Ignore") => Ok(Self::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: \"{other}\": supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }
}

/// A value whose JSON type the Go field cannot hold.
struct TypeError {
    /// What Go's decoder calls the JSON value: `string`, `number`, `number 1.5`, `bool`, ...
    value: String,
    /// The innermost Go struct holding the field, e.g. `DeploymentSpec`.
    go_struct: String,
    /// The field's path from the root, without list indices, e.g. `spec.replicas`.
    path: String,
    /// The Go type, e.g. `int32`.
    go_type: String,
}

struct Walk {
    unknown: Vec<String>,
    type_error: Option<TypeError>,
}

/// Checks a built-in kind's object against its schema, removes the fields the schema does not
/// declare, and returns their paths (`spec.foo`, `spec.containers[0].bar`). Kinds without a
/// schema pass unchanged.
pub fn check(info: &ResourceInfo, obj: &mut Value) -> Result<Vec<String>, ApiError> {
    if !info.builtin {
        return Ok(Vec::new());
    }
    let Some((name, schema)) = CATALOG.root(&info.api_version(), &info.kind) else {
        return Ok(Vec::new());
    };
    let mut walk = Walk {
        unknown: Vec::new(),
        type_error: None,
    };
    walk.value(obj, schema, short_name(name), "", "");
    match walk.type_error {
        Some(e) => Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: json: cannot unmarshal {} into Go struct field {}.{} of type {}",
            e.value,
            e.go_struct,
            e.path,
            e.go_type,
            kind = info.kind,
            version = info.version,
        ))),
        None => Ok(walk.unknown),
    }
}

/// Applies the `fieldValidation` policy to the unknown fields found while decoding: `Strict`
/// refuses them (400), `Warn` returns one warning per field, `Ignore` nothing.
pub fn enforce(
    info: &ResourceInfo,
    policy: FieldValidation,
    unknown: &[String],
) -> Result<Vec<String>, ApiError> {
    if unknown.is_empty() || policy == FieldValidation::Ignore {
        return Ok(Vec::new());
    }
    let messages: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field \"{p}\""))
        .collect();
    if policy == FieldValidation::Strict {
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
            messages.join(", "),
            kind = info.kind,
            version = info.version,
        )));
    }
    Ok(messages)
}

/// `io.k8s.api.apps.v1.DeploymentSpec` → `DeploymentSpec`.
fn short_name(definition: &str) -> &str {
    definition.rsplit('.').next().unwrap_or(definition)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

impl Walk {
    /// `path` is the JSON path with list indices (for unknown-field messages), `go_path` the
    /// same without them (Go's decoder reports field paths that way).
    fn value(&mut self, x: &mut Value, schema: &Value, go_struct: &str, path: &str, go_path: &str) {
        if self.type_error.is_some() || x.is_null() {
            return;
        }
        let (name, s) = CATALOG.resolve(schema);
        let go_struct = match name {
            Some(n) if s.get("properties").is_some() => short_name(n),
            _ => go_struct,
        };
        if s.get("x-kubernetes-int-or-string").is_some() {
            // Quantities take any number (`cpu: 0.5`); IntOrString an integer.
            let quantity = name.is_some_and(|n| n.ends_with(".Quantity"));
            if !(x.is_string() || x.is_i64() || (quantity && x.is_number())) {
                self.mismatch(x, s, name, go_struct, go_path);
            }
            return;
        }
        // oneOf/anyOf (JSONSchemaPropsOrBool, ...) and untyped values (RawExtension, JSON)
        // accept anything.
        if s.get("oneOf").is_some() || s.get("anyOf").is_some() {
            return;
        }
        let ty = s.get("type").and_then(Value::as_str);
        let free_form = ty == Some("object")
            && s.get("properties").is_none()
            && s.get("additionalProperties").is_none();
        if free_form {
            // RawExtension, FieldsV1 and apiextensions' JSON hold any JSON value.
            return;
        }
        match (ty, &mut *x) {
            (None, _) => return,
            (Some("object"), Value::Object(m)) => {
                return self.object(m, s, go_struct, path, go_path);
            }
            (Some("array"), Value::Array(items)) => {
                let item_schema = s.get("items").unwrap_or(&Value::Null);
                for (i, item) in items.iter_mut().enumerate() {
                    self.value(
                        item,
                        item_schema,
                        go_struct,
                        &format!("{path}[{i}]"),
                        go_path,
                    );
                }
                return;
            }
            (Some("string"), Value::String(_)) | (Some("boolean"), Value::Bool(_)) => return,
            (Some("number"), Value::Number(_)) => return,
            (Some("integer"), Value::Number(n)) if fits(n, s) => return,
            _ => {}
        }
        self.mismatch(x, s, name, go_struct, go_path);
    }

    fn object(
        &mut self,
        m: &mut Map<String, Value>,
        s: &Value,
        go_struct: &str,
        path: &str,
        go_path: &str,
    ) {
        let props = s.get("properties").and_then(Value::as_object);
        let additional = s.get("additionalProperties").filter(|a| a.is_object());
        if props.is_none() && additional.is_none() {
            // An object schema with neither is free-form (RawExtension, FieldsV1).
            return;
        }
        let mut unknown = Vec::new();
        for (k, v) in m.iter_mut() {
            match (props.and_then(|p| p.get(k)), additional) {
                (Some(fs), _) => self.value(v, fs, go_struct, &join(path, k), &join(go_path, k)),
                // Go's decoder names struct fields in its path, not map keys.
                (None, Some(fs)) => self.value(v, fs, go_struct, &join(path, k), go_path),
                (None, None) if path.is_empty() && matches!(k.as_str(), "apiVersion" | "kind") => {}
                (None, None) => unknown.push(k.clone()),
            }
        }
        for k in unknown {
            m.remove(&k);
            self.unknown.push(join(path, &k));
        }
    }

    fn mismatch(
        &mut self,
        x: &Value,
        s: &Value,
        name: Option<&str>,
        go_struct: &str,
        go_path: &str,
    ) {
        let integer = s.get("type").and_then(Value::as_str) == Some("integer");
        self.type_error = Some(TypeError {
            value: go_json_kind(x, integer),
            go_struct: go_struct.to_string(),
            path: go_path.to_string(),
            go_type: go_type(s, name),
        });
    }
}

/// Whether a JSON number fits the integer schema's Go type.
fn fits(n: &serde_json::Number, s: &Value) -> bool {
    let Some(i) = n.as_i64() else {
        return false;
    };
    match s.get("format").and_then(Value::as_str) {
        Some("int32") => i32::try_from(i).is_ok(),
        _ => true,
    }
}

/// How Go's encoding/json names a JSON value in an UnmarshalTypeError: a number that does not
/// fit an integer field is shown with its value.
fn go_json_kind(x: &Value, integer: bool) -> String {
    match x {
        Value::String(_) => "string".into(),
        Value::Bool(_) => "bool".into(),
        Value::Array(_) => "array".into(),
        Value::Object(_) => "object".into(),
        Value::Number(n) if integer => format!("number {n}"),
        Value::Number(_) => "number".into(),
        Value::Null => "null".into(),
    }
}

/// The Go type of a schema, as Go's decoder prints it (`int32`, `[]v1.Container`,
/// `map[string]string`, `v1.PodSpec`).
fn go_type(s: &Value, name: Option<&str>) -> String {
    if let Some(n) = name.filter(|_| s.get("properties").is_some()) {
        let mut parts = n.rsplit('.');
        let ty = parts.next().unwrap_or(n);
        let package = parts.next().unwrap_or("v1");
        return format!("{package}.{ty}");
    }
    match s.get("type").and_then(Value::as_str) {
        Some("integer") => match s.get("format").and_then(Value::as_str) {
            Some(f @ ("int32" | "int64")) => f.to_string(),
            _ => "int".into(),
        },
        Some("number") => "float64".into(),
        Some("boolean") => "bool".into(),
        Some("string") => "string".into(),
        Some("array") => {
            let items = s.get("items").cloned().unwrap_or(Value::Null);
            let (n, is) = CATALOG.resolve(&items);
            format!("[]{}", go_type(is, n))
        }
        Some("object") => match s.get("additionalProperties") {
            Some(a) if a.is_object() => {
                let (n, a) = CATALOG.resolve(a);
                format!("map[string]{}", go_type(a, n))
            }
            _ => "map[string]interface {}".into(),
        },
        _ if s.get("x-kubernetes-int-or-string").is_some() => match name {
            Some(n) if n.ends_with("Quantity") => "resource.Quantity".into(),
            _ => "intstr.IntOrString".into(),
        },
        _ => "interface {}".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    fn info(api_version: &str, plural: &str) -> ResourceInfo {
        let (g, v) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        Registry::builtin()
            .get(g, v, plural)
            .cloned()
            .expect("built-in")
    }

    #[test]
    fn a_string_replica_count_is_the_go_decoder_error() {
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": "three"}});
        let err = check(&info("apps/v1", "deployments"), &mut d).expect_err("wrong type");
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            "Deployment in version \"v1\" cannot be handled as a Deployment: json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"
        );
    }

    #[test]
    fn unknown_fields_are_removed_and_reported_with_indices() {
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "bogus": 1},
            "spec": {"template": {"spec": {"containers": [{"name": "a", "imagePullPolicyy": "x"}]}}}});
        let unknown = check(&info("apps/v1", "deployments"), &mut d).expect("types fine");
        assert_eq!(
            unknown,
            vec![
                "metadata.bogus".to_string(),
                "spec.template.spec.containers[0].imagePullPolicyy".to_string()
            ]
        );
        assert!(d.pointer("/metadata/bogus").is_none());
    }

    #[test]
    fn int_or_string_and_quantities_take_both() {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": 1, "memory": "1Gi"}},
                "livenessProbe": {"httpGet": {"port": "http"}}}]}});
        assert_eq!(
            check(&info("v1", "pods"), &mut p).expect("valid"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn label_values_must_be_strings() {
        let mut c = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": 1}}});
        let err = check(&info("v1", "configmaps"), &mut c).expect_err("number label");
        assert!(
            err.message.ends_with(
                "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string"
            ),
            "{}",
            err.message
        );
    }

    #[test]
    fn free_form_json_takes_any_value() {
        let mut crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "a.b"}, "spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema":
                {"type": "object", "properties": {"size": {"type": "integer", "default": 3}}}}}]}});
        let info = Registry::builtin()
            .get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .cloned()
            .expect("built-in");
        assert_eq!(check(&info, &mut crd).expect("valid"), Vec::<String>::new());
    }
}
