//! What kube-apiserver checks while it decodes a request body into a built-in kind's Go type:
//! values of the wrong JSON type (400, `json: cannot unmarshal ...`) and fields the type does
//! not declare, which `fieldValidation` turns into an error (`Strict`), a warning (`Warn`, the
//! default) or nothing (`Ignore`). Unknown fields are dropped in every mode, as decoding into a
//! Go struct drops them.
//!
//! Custom resources reach `enforce` with the fields their structural schema pruned, so both
//! kinds of object answer `fieldValidation` the same way.

use crate::catalog::openapi::CATALOG;
use crate::catalog::resources::ResourceInfo;
use crate::status::ApiError;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::LazyLock;

/// The `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum FieldValidation {
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
    pub(crate) fn parse(v: Option<&str>) -> Result<Self, ApiError> {
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

/// Index of a [`Shape`] in [`Shapes::nodes`].
type ShapeId = usize;

/// A schema compiled for decoding: references resolved once, so checking an object costs one
/// map lookup per field instead of walking JSON schemas keyword by keyword.
enum Shape {
    /// Any JSON value (RawExtension, FieldsV1, apiextensions' JSON, oneOf/anyOf schemas).
    Any,
    Bool,
    Number,
    /// An integer; `format` is `int32`, `int64` or none (Go `int`).
    Integer {
        format: Option<&'static str>,
    },
    String,
    /// `x-kubernetes-int-or-string`: an integer or a string.
    IntOrString,
    /// A resource.Quantity: a string or any number.
    Quantity,
    /// A Go struct: its declared fields, and its name if it is a named definition.
    Struct {
        go: Option<GoName>,
        fields: HashMap<String, ShapeId>,
    },
    /// A Go map: every value has this shape.
    Map(ShapeId),
    /// A Go slice.
    Array(ShapeId),
}

/// How Go's decoder names a struct type: `DeploymentSpec` in paths, `v1.DeploymentSpec` as a
/// type.
struct GoName {
    short: String,
    qualified: String,
}

impl GoName {
    fn of(definition: &str) -> Self {
        let mut parts = definition.rsplit('.');
        let short = parts.next().unwrap_or(definition).to_string();
        let package = parts.next().unwrap_or("v1");
        GoName {
            qualified: format!("{package}.{short}"),
            short,
        }
    }
}

/// Every built-in kind's compiled schema.
struct Shapes {
    nodes: Vec<Shape>,
    by_definition: HashMap<String, ShapeId>,
    roots: HashMap<(String, String), ShapeId>,
}

/// Compiled once from [`CATALOG`], on first use.
static SHAPES: LazyLock<Shapes> = LazyLock::new(Shapes::compile_catalog);

impl Shapes {
    fn compile_catalog() -> Self {
        let mut shapes = Shapes {
            nodes: Vec::new(),
            by_definition: HashMap::new(),
            roots: HashMap::new(),
        };
        for (key, name) in CATALOG.root_names() {
            let reference =
                json!({ "$ref": format!("{}{name}", crate::catalog::openapi::DEFINITIONS) });
            let id = shapes.compile(&reference);
            shapes.roots.insert(key, id);
        }
        shapes
    }

    fn push(&mut self, shape: Shape) -> ShapeId {
        self.nodes.push(shape);
        self.nodes.len() - 1
    }

    fn compile(&mut self, schema: &Value) -> ShapeId {
        let (name, s) = CATALOG.resolve(schema);
        let Some(name) = name else {
            let shape = self.shape_of(s, None);
            return self.push(shape);
        };
        if let Some(id) = self.by_definition.get(name) {
            return *id;
        }
        // Registered before its body so that recursive definitions refer to themselves.
        let id = self.push(Shape::Any);
        self.by_definition.insert(name.to_string(), id);
        self.nodes[id] = self.shape_of(s, Some(name));
        id
    }

    fn shape_of(&mut self, s: &Value, name: Option<&str>) -> Shape {
        if s.get("x-kubernetes-int-or-string").is_some() {
            return match name {
                Some(n) if n.ends_with(".Quantity") => Shape::Quantity,
                _ => Shape::IntOrString,
            };
        }
        if s.get("oneOf").is_some() || s.get("anyOf").is_some() {
            return Shape::Any;
        }
        let format = match s.get("format").and_then(Value::as_str) {
            Some("int32") => Some("int32"),
            Some("int64") => Some("int64"),
            _ => None,
        };
        match s.get("type").and_then(Value::as_str) {
            Some("boolean") => Shape::Bool,
            Some("number") => Shape::Number,
            Some("string") => Shape::String,
            Some("integer") => Shape::Integer { format },
            Some("array") => Shape::Array(self.compile(s.get("items").unwrap_or(&Value::Null))),
            Some("object") => self.object_shape(s, name),
            _ => Shape::Any,
        }
    }

    fn object_shape(&mut self, s: &Value, name: Option<&str>) -> Shape {
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            let fields = props
                .iter()
                .map(|(k, v)| (k.clone(), self.compile(v)))
                .collect();
            return Shape::Struct {
                go: name.map(GoName::of),
                fields,
            };
        }
        match s.get("additionalProperties") {
            Some(a) if a.is_object() => Shape::Map(self.compile(a)),
            // Neither: free-form (RawExtension, FieldsV1, apiextensions' JSON).
            _ => Shape::Any,
        }
    }

    /// The Go type of a shape, as Go's decoder prints it (`int32`, `[]v1.Container`,
    /// `map[string]string`, `v1.PodSpec`).
    fn go_type(&self, id: ShapeId) -> String {
        match &self.nodes[id] {
            Shape::Any => "interface {}".into(),
            Shape::Bool => "bool".into(),
            Shape::Number => "float64".into(),
            Shape::Integer { format, .. } => format.unwrap_or("int").into(),
            Shape::String => "string".into(),
            Shape::IntOrString => "intstr.IntOrString".into(),
            Shape::Quantity => "resource.Quantity".into(),
            Shape::Struct { go: Some(g), .. } => g.qualified.clone(),
            Shape::Struct { go: None, .. } => "struct {}".into(),
            Shape::Map(v) => format!("map[string]{}", self.go_type(*v)),
            Shape::Array(i) => format!("[]{}", self.go_type(*i)),
        }
    }
}

/// One walk over an object. The paths are buffers extended and truncated around each field,
/// so a valid object allocates nothing per field.
struct Walk<'s> {
    shapes: &'s Shapes,
    unknown: Vec<String>,
    type_error: Option<TypeError>,
    /// JSON path with list indices (for unknown-field messages).
    path: String,
    /// The same without indices and map keys (Go's decoder reports field paths that way).
    go_path: String,
}

/// Checks a built-in kind's object against its schema, removes the fields the schema does not
/// declare, and returns their paths (`spec.foo`, `spec.containers[0].bar`). Kinds without a
/// schema pass unchanged.
pub fn check(info: &ResourceInfo, obj: &mut Value) -> Result<Vec<String>, ApiError> {
    if !info.builtin {
        return Ok(Vec::new());
    }
    let shapes = &*SHAPES;
    let Some(root) = shapes.roots.get(&(info.api_version(), info.kind.clone())) else {
        return Ok(Vec::new());
    };
    let mut walk = Walk {
        shapes,
        unknown: Vec::new(),
        type_error: None,
        path: String::new(),
        go_path: String::new(),
    };
    walk.value(obj, *root, "");
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
pub(crate) fn enforce(
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

/// Appends `.key` (or `key` at the root) to a path buffer.
fn push_key(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
}

impl Walk<'_> {
    /// `go_struct` is the innermost named struct around the value.
    fn value(&mut self, x: &mut Value, id: ShapeId, go_struct: &str) {
        if self.type_error.is_some() || x.is_null() {
            return;
        }
        let shapes = self.shapes;
        let fits = match (&shapes.nodes[id], &mut *x) {
            (Shape::Any, _) => true,
            (Shape::Struct { go, fields }, Value::Object(m)) => {
                let go_struct = go.as_ref().map_or(go_struct, |g| g.short.as_str());
                self.fields(m, fields, go_struct);
                true
            }
            (Shape::Map(values), Value::Object(m)) => {
                for (k, v) in m.iter_mut() {
                    let len = self.path.len();
                    push_key(&mut self.path, k);
                    self.value(v, *values, go_struct);
                    self.path.truncate(len);
                }
                true
            }
            (Shape::Array(items), Value::Array(a)) => {
                for (i, item) in a.iter_mut().enumerate() {
                    let len = self.path.len();
                    let _ = write!(self.path, "[{i}]");
                    self.value(item, *items, go_struct);
                    self.path.truncate(len);
                }
                true
            }
            (Shape::Bool, Value::Bool(_)) | (Shape::String, Value::String(_)) => true,
            (Shape::Number, Value::Number(_)) => true,
            (Shape::Integer { format }, Value::Number(n)) => n
                .as_i64()
                .is_some_and(|i| *format != Some("int32") || i32::try_from(i).is_ok()),
            (Shape::IntOrString, v) => v.is_string() || v.is_i64(),
            (Shape::Quantity, v) => v.is_string() || v.is_number(),
            _ => false,
        };
        if !fits {
            self.mismatch(x, id, go_struct);
        }
    }

    fn fields(
        &mut self,
        m: &mut Map<String, Value>,
        fields: &HashMap<String, ShapeId>,
        go_struct: &str,
    ) {
        let mut unknown = Vec::new();
        let at_root = self.path.is_empty();
        for (k, v) in m.iter_mut() {
            match fields.get(k) {
                Some(fs) => {
                    let (len, go_len) = (self.path.len(), self.go_path.len());
                    push_key(&mut self.path, k);
                    push_key(&mut self.go_path, k);
                    self.value(v, *fs, go_struct);
                    self.path.truncate(len);
                    self.go_path.truncate(go_len);
                }
                None if at_root && matches!(k.as_str(), "apiVersion" | "kind") => {}
                None => unknown.push(k.clone()),
            }
        }
        for k in unknown {
            m.remove(&k);
            let mut path = self.path.clone();
            push_key(&mut path, &k);
            self.unknown.push(path);
        }
    }

    fn mismatch(&mut self, x: &Value, id: ShapeId, go_struct: &str) {
        let integer = matches!(self.shapes.nodes[id], Shape::Integer { .. });
        self.type_error = Some(TypeError {
            value: go_json_kind(x, integer),
            go_struct: go_struct.to_string(),
            path: self.go_path.clone(),
            go_type: self.shapes.go_type(id),
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::resources::Registry;
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
