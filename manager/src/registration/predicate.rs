//! Event predicates: which watch events may reach a controller.
//!
//! A controller registers a predicate tree; the manager evaluates it on every event before the
//! event is mapped to a key, so filtered events cost the controller nothing. Objects are plain
//! Kubernetes JSON (`serde_json::Value`) because the manager serves controllers for kinds it
//! has no Rust types for.
//!
//! The semantics follow controller-runtime's `predicate` package so that controllers ported
//! from Go keep their behaviour:
//!
//! * The `*Changed` predicates only filter updates: they pass [`EventKind::Added`],
//!   [`EventKind::Deleted`] and [`EventKind::Sync`], and on [`EventKind::Modified`] compare the
//!   old and new object. An update without an old object fails them, as in controller-runtime
//!   (which logs and drops such events).
//! * The object-state predicates ([`Predicate::LabelSelector`], [`Predicate::Deleting`],
//!   [`Predicate::HasFinalizer`]) look at the event's *subject*: the new object, except for
//!   deletes, where the last known state (`old`, falling back to `new`) is what the controller
//!   was interested in.
//!
//! Trees come from untrusted registrations, so [`Predicate::validate`] bounds their size and
//! checks selector syntax with messages naming the offending field; [`Predicate::evaluate`]
//! assumes a validated tree (its recursion depth is what validation bounds).

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

/// Deepest nesting accepted by [`Predicate::validate`]; real trees are a few levels deep, and
/// the bound keeps recursive evaluation far from the stack limit.
pub const MAX_DEPTH: usize = 32;

/// Most nodes accepted by [`Predicate::validate`], so a registration cannot make every event
/// evaluation arbitrarily expensive.
pub const MAX_NODES: usize = 1024;

/// What happened to the object, in the vocabulary of controller-runtime's event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The object appeared (created, or seen for the first time in a list).
    Added,
    /// The object changed; `old` is the previous cached state.
    Modified,
    /// The object is gone; `old` is the last known state.
    Deleted,
    /// A resync or replay of an object that did not necessarily change (controller-runtime's
    /// generic event).
    Sync,
}

/// A filter over watch events, mirroring the wire `Predicate` message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Predicate {
    /// Updates pass only when `metadata.generation` changed, i.e. the spec changed; this is
    /// how controllers ignore their own status writes.
    ///
    /// A missing generation reads as 0, as in controller-runtime, so for kinds without a
    /// generation (e.g. ConfigMaps) every update is filtered: combine with
    /// [`Predicate::LabelsChanged`] / [`Predicate::AnnotationsChanged`] or use
    /// [`Predicate::ResourceVersionChanged`] for those.
    GenerationChanged,
    /// Updates pass only when `metadata.labels` changed; absent and empty labels are equal.
    LabelsChanged,
    /// Updates pass only when `metadata.annotations` changed; absent and empty are equal.
    AnnotationsChanged,
    /// Updates pass only when `metadata.resourceVersion` changed, which drops the no-op
    /// updates a resync of an informer produces.
    ResourceVersionChanged,
    /// Events pass when the subject's labels match.
    LabelSelector(LabelSelector),
    /// Events pass when the subject has `metadata.deletionTimestamp` set.
    Deleting,
    /// Events pass when the subject lists this finalizer in `metadata.finalizers`.
    HasFinalizer(String),
    /// Passes when every child passes; empty passes everything.
    AllOf(Vec<Predicate>),
    /// Passes when some child passes; empty passes nothing.
    AnyOf(Vec<Predicate>),
    /// Inverts its child.
    Not(Box<Predicate>),
}

impl Predicate {
    /// Decides whether an event reaches the controller.
    ///
    /// `old` is the previous state for [`EventKind::Modified`] and the last known state for
    /// [`EventKind::Deleted`]; it is ignored otherwise. Malformed objects never panic: missing
    /// or mistyped fields read as absent.
    pub fn evaluate(&self, kind: EventKind, old: Option<&Value>, new: &Value) -> bool {
        let subject = match kind {
            EventKind::Deleted => old.unwrap_or(new),
            _ => new,
        };
        match self {
            Predicate::GenerationChanged => changed(kind, old, new, |o| {
                metadata_i64(o, "generation").unwrap_or(0)
            }),
            Predicate::LabelsChanged => changed(kind, old, new, |o| string_map(o, "labels")),
            Predicate::AnnotationsChanged => {
                changed(kind, old, new, |o| string_map(o, "annotations"))
            }
            Predicate::ResourceVersionChanged => changed(kind, old, new, |o| {
                metadata(o)
                    .and_then(|m| m.get("resourceVersion"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            }),
            Predicate::LabelSelector(selector) => selector.matches_object(subject),
            Predicate::Deleting => metadata(subject)
                .and_then(|m| m.get("deletionTimestamp"))
                .is_some_and(|t| !t.is_null()),
            Predicate::HasFinalizer(name) => metadata(subject)
                .and_then(|m| m.get("finalizers"))
                .and_then(Value::as_array)
                .is_some_and(|fs| fs.iter().any(|f| f.as_str() == Some(name.as_str()))),
            Predicate::AllOf(children) => children.iter().all(|p| p.evaluate(kind, old, new)),
            Predicate::AnyOf(children) => children.iter().any(|p| p.evaluate(kind, old, new)),
            Predicate::Not(child) => !child.evaluate(kind, old, new),
        }
    }

    /// Nodes in the tree (leaves and combinators): what validation bounds.
    pub fn node_count(&self) -> usize {
        1 + match self {
            Predicate::AllOf(children) | Predicate::AnyOf(children) => {
                children.iter().map(Predicate::node_count).sum()
            }
            Predicate::Not(child) => child.node_count(),
            _ => 0,
        }
    }

    /// Checks a tree from a registration before it is used.
    ///
    /// The error's path uses the wire field names (`predicate.all_of.predicates[1].label_selector...`) so
    /// it can be returned verbatim as an INVALID_ARGUMENT message.
    pub fn validate(&self) -> Result<(), PredicateError> {
        self.validate_at("predicate")
    }

    /// Like [`Predicate::validate`], with the caller's path for the root (e.g.
    /// `register.predicate`).
    pub fn validate_at(&self, root: &str) -> Result<(), PredicateError> {
        let mut nodes = 0;
        self.validate_node(root, 1, &mut nodes)
    }

    fn validate_node(
        &self,
        path: &str,
        depth: usize,
        nodes: &mut usize,
    ) -> Result<(), PredicateError> {
        if depth > MAX_DEPTH {
            return Err(PredicateError::TooDeep {
                path: path.to_owned(),
                max: MAX_DEPTH,
            });
        }
        *nodes += 1;
        if *nodes > MAX_NODES {
            return Err(PredicateError::TooManyNodes {
                path: path.to_owned(),
                max: MAX_NODES,
            });
        }
        match self {
            Predicate::GenerationChanged
            | Predicate::LabelsChanged
            | Predicate::AnnotationsChanged
            | Predicate::ResourceVersionChanged
            | Predicate::Deleting => Ok(()),
            Predicate::LabelSelector(selector) => {
                selector.validate_at(&format!("{path}.label_selector"))
            }
            Predicate::HasFinalizer(name) => {
                validate_qualified_name(name).map_err(|reason| PredicateError::InvalidFinalizer {
                    path: format!("{path}.has_finalizer"),
                    name: name.clone(),
                    reason,
                })
            }
            // Paths use the proto's field names, so a user can find the field in its message.
            Predicate::AllOf(children) => children.iter().enumerate().try_for_each(|(i, c)| {
                c.validate_node(&format!("{path}.all_of.predicates[{i}]"), depth + 1, nodes)
            }),
            Predicate::AnyOf(children) => children.iter().enumerate().try_for_each(|(i, c)| {
                c.validate_node(&format!("{path}.any_of.predicates[{i}]"), depth + 1, nodes)
            }),
            Predicate::Not(child) => {
                child.validate_node(&format!("{path}.negate"), depth + 1, nodes)
            }
        }
    }
}

/// A Kubernetes label selector (`metav1.LabelSelector`): all `match_labels` and all
/// `match_expressions` must hold; an empty selector matches everything.
///
/// Written here rather than borrowed from k8s-openapi so the predicate layer stays free of
/// Kubernetes crates and can report field-level validation errors.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    /// Exact `key = value` requirements.
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements.
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One set-based requirement of a [`LabelSelector`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LabelSelectorRequirement {
    /// The label key the requirement is about.
    pub key: String,
    /// How `values` are applied.
    pub operator: SelectorOperator,
    /// Non-empty for `In`/`NotIn`, empty for `Exists`/`DoesNotExist`.
    pub values: Vec<String>,
}

/// Operators of a [`LabelSelectorRequirement`], with Kubernetes semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectorOperator {
    /// The label is present with one of the values.
    In,
    /// The label is absent, or present with none of the values.
    NotIn,
    /// The label is present, whatever its value.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl fmt::Display for SelectorOperator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SelectorOperator::In => "In",
            SelectorOperator::NotIn => "NotIn",
            SelectorOperator::Exists => "Exists",
            SelectorOperator::DoesNotExist => "DoesNotExist",
        })
    }
}

impl LabelSelector {
    /// Whether a label set satisfies the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).map(String::as_str))
    }

    /// Whether an object's `metadata.labels` satisfy the selector; labels that are not strings
    /// are treated as absent rather than failing the event.
    pub fn matches_object(&self, object: &Value) -> bool {
        let labels = metadata(object)
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        self.matches_label_map(labels)
    }

    /// Whether a `metadata.labels` map (None: no labels) satisfies the selector; values that
    /// are not strings are treated as absent.
    pub fn matches_label_map(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.matches_with(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| get(k) == Some(v.as_str()))
            && self.match_expressions.iter().all(|r| {
                let value = get(&r.key);
                match r.operator {
                    SelectorOperator::In => value.is_some_and(|v| r.values.iter().any(|x| x == v)),
                    SelectorOperator::NotIn => {
                        value.is_none_or(|v| r.values.iter().all(|x| x != v))
                    }
                    SelectorOperator::Exists => value.is_some(),
                    SelectorOperator::DoesNotExist => value.is_none(),
                }
            })
    }

    /// Checks label syntax and operator arity, reporting paths under `label_selector`.
    pub fn validate(&self) -> Result<(), PredicateError> {
        self.validate_at("label_selector")
    }

    /// Like [`LabelSelector::validate`] with the caller's path for the selector, so the same
    /// check serves the registration's scope selector and selectors inside predicate trees.
    pub fn validate_at(&self, path: &str) -> Result<(), PredicateError> {
        let bytes = self.query_bytes();
        if bytes > MAX_SELECTOR_BYTES {
            // Every informer with this selector sends it in its URL, and every event is matched
            // against it: the size is the tenant's to bound, not the API server's.
            return Err(PredicateError::SelectorTooLarge {
                path: path.to_owned(),
                bytes,
                max: MAX_SELECTOR_BYTES,
            });
        }
        for (key, value) in &self.match_labels {
            let here = format!("{path}.match_labels[{key:?}]");
            check_key(&here, key)?;
            check_value(&here, value)?;
        }
        for (i, r) in self.match_expressions.iter().enumerate() {
            let here = format!("{path}.match_expressions[{i}]");
            check_key(&format!("{here}.key"), &r.key)?;
            let arity = match r.operator {
                SelectorOperator::In | SelectorOperator::NotIn if r.values.is_empty() => {
                    Some("requires at least one value")
                }
                SelectorOperator::Exists | SelectorOperator::DoesNotExist
                    if !r.values.is_empty() =>
                {
                    Some("takes no values")
                }
                _ => None,
            };
            if let Some(reason) = arity {
                return Err(PredicateError::OperatorValues {
                    path: format!("{here}.values"),
                    operator: r.operator,
                    reason,
                });
            }
            for (j, v) in r.values.iter().enumerate() {
                check_value(&format!("{here}.values[{j}]"), v)?;
            }
        }
        Ok(())
    }
}

impl LabelSelector {
    /// Length of the selector written as the API server's `labelSelector` query (about).
    fn query_bytes(&self) -> usize {
        let labels: usize = self
            .match_labels
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum();
        let expressions: usize = self
            .match_expressions
            .iter()
            .map(|e| e.key.len() + 10 + e.values.iter().map(|v| v.len() + 1).sum::<usize>())
            .sum();
        labels + expressions
    }
}

/// Largest label selector, as the length of its query string: far above any real selector
/// (tens of bytes), far below what turns into an URL too long or a slow match per event.
pub const MAX_SELECTOR_BYTES: usize = 4096;

/// Why a predicate tree was rejected; every variant carries the path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PredicateError {
    /// A label selector longer than [`MAX_SELECTOR_BYTES`].
    #[error(
        "{path}: the label selector is {bytes} bytes long; the limit is {max}: select with fewer or shorter labels and values"
    )]
    SelectorTooLarge {
        /// The selector.
        path: String,
        /// Its length as a query.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The tree nests deeper than [`MAX_DEPTH`].
    #[error("{path}: predicate nesting exceeds the maximum depth of {max}")]
    TooDeep {
        /// The first node past the limit.
        path: String,
        /// The limit.
        max: usize,
    },
    /// The tree has more than [`MAX_NODES`] nodes.
    #[error("{path}: predicate tree exceeds the maximum of {max} nodes")]
    TooManyNodes {
        /// The first node past the limit.
        path: String,
        /// The limit.
        max: usize,
    },
    /// A label key is not a Kubernetes qualified name.
    #[error("{path}: invalid label key {key:?}: {reason}")]
    InvalidLabelKey {
        /// Where the key appears.
        path: String,
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A label value is not a valid Kubernetes label value.
    #[error("{path}: invalid label value {value:?}: {reason}")]
    InvalidLabelValue {
        /// Where the value appears.
        path: String,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A requirement has the wrong number of values for its operator.
    #[error("{path}: operator {operator} {reason}")]
    OperatorValues {
        /// The requirement's `values` field.
        path: String,
        /// The operator.
        operator: SelectorOperator,
        /// What it expects.
        reason: &'static str,
    },
    /// A finalizer name is not a Kubernetes qualified name.
    #[error("{path}: invalid finalizer name {name:?}: {reason}")]
    InvalidFinalizer {
        /// The `has_finalizer` field.
        path: String,
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl PredicateError {
    /// The offending field, for structured error details.
    pub fn path(&self) -> &str {
        match self {
            PredicateError::TooDeep { path, .. }
            | PredicateError::SelectorTooLarge { path, .. }
            | PredicateError::TooManyNodes { path, .. }
            | PredicateError::InvalidLabelKey { path, .. }
            | PredicateError::InvalidLabelValue { path, .. }
            | PredicateError::OperatorValues { path, .. }
            | PredicateError::InvalidFinalizer { path, .. } => path,
        }
    }

    /// What is wrong, without the path (which [`PredicateError::path`] gives).
    pub fn detail(&self) -> String {
        let full = self.to_string();
        match full.strip_prefix(self.path()) {
            Some(rest) => rest.trim_start_matches(": ").to_string(),
            None => full,
        }
    }

    /// A stable, low-cardinality name for metrics labels.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PredicateError::TooDeep { .. } => "too_deep",
            PredicateError::SelectorTooLarge { .. } => "selector_too_large",
            PredicateError::TooManyNodes { .. } => "too_many_nodes",
            PredicateError::InvalidLabelKey { .. } => "invalid_label_key",
            PredicateError::InvalidLabelValue { .. } => "invalid_label_value",
            PredicateError::OperatorValues { .. } => "operator_values",
            PredicateError::InvalidFinalizer { .. } => "invalid_finalizer",
        }
    }
}

/// The update-filtering rule shared by the `*Changed` predicates.
fn changed<'v, T: PartialEq>(
    kind: EventKind,
    old: Option<&'v Value>,
    new: &'v Value,
    field: impl Fn(&'v Value) -> T,
) -> bool {
    match kind {
        EventKind::Modified => old.is_some_and(|old| field(old) != field(new)),
        EventKind::Added | EventKind::Deleted | EventKind::Sync => true,
    }
}

fn metadata(object: &Value) -> Option<&Map<String, Value>> {
    object.get("metadata").and_then(Value::as_object)
}

fn metadata_i64(object: &Value, field: &str) -> Option<i64> {
    metadata(object)
        .and_then(|m| m.get(field))
        .and_then(Value::as_i64)
}

/// A string map from metadata, borrowed and normalized so that absent, `null` and `{}` compare
/// equal (all None); map equality ignores key order. Never copied: an update of an object with
/// thousands of annotations is compared in place.
fn string_map<'v>(object: &'v Value, field: &str) -> Option<&'v Map<String, Value>> {
    metadata(object)
        .and_then(|m| m.get(field))
        .and_then(Value::as_object)
        .filter(|m| !m.is_empty())
}

fn check_key(path: &str, key: &str) -> Result<(), PredicateError> {
    validate_qualified_name(key).map_err(|reason| PredicateError::InvalidLabelKey {
        path: path.to_owned(),
        key: key.to_owned(),
        reason,
    })
}

fn check_value(path: &str, value: &str) -> Result<(), PredicateError> {
    validate_label_value(value).map_err(|reason| PredicateError::InvalidLabelValue {
        path: path.to_owned(),
        value: value.to_owned(),
        reason,
    })
}

/// Kubernetes `IsQualifiedName`: an optional DNS-subdomain prefix and `/`, then a name of at
/// most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn validate_qualified_name(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("prefix part must be non-empty".to_owned());
        }
        validate_dns_subdomain(prefix).map_err(|e| format!("prefix part {e}"))?;
    }
    if name.is_empty() {
        return Err("name part must be non-empty".to_owned());
    }
    validate_name_part(name).map_err(|e| format!("name part {e}"))
}

/// Kubernetes `IsValidLabelValue`: empty, or a name part.
fn validate_label_value(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    validate_name_part(s)
}

fn validate_name_part(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err("must be no more than 63 characters".to_owned());
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let ok_chars = s
        .chars()
        .all(|c| alnum(c) || c == '-' || c == '_' || c == '.');
    let ends_ok = s.starts_with(alnum) && s.ends_with(alnum);
    if ok_chars && ends_ok {
        Ok(())
    } else {
        Err(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end \
             with an alphanumeric character"
                .to_owned(),
        )
    }
}

/// Kubernetes `IsDNS1123Subdomain`: at most 253 characters of dot-separated lower-case labels.
fn validate_dns_subdomain(s: &str) -> Result<(), String> {
    if s.len() > 253 {
        return Err("must be no more than 253 characters".to_owned());
    }
    let label_ok = |l: &str| {
        let lower_alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        !l.is_empty()
            && l.chars().all(|c| lower_alnum(c) || c == '-')
            && l.starts_with(lower_alnum)
            && l.ends_with(lower_alnum)
    };
    if s.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("must be a lower-case DNS subdomain (e.g. example.com)".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use EventKind::{Added, Deleted, Modified, Sync};

    fn obj(meta: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Thing", "metadata": meta, "spec": {}})
    }

    fn selector(labels: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            match_expressions: exprs,
        }
    }

    fn req(key: &str, operator: SelectorOperator, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator,
            values: values.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    #[test]
    fn generation_changed_filters_status_only_updates() {
        let old = json!({"metadata": {"generation": 3, "resourceVersion": "10"},
                         "spec": {"replicas": 1}, "status": {"ready": 0}});
        let status_update = json!({"metadata": {"generation": 3, "resourceVersion": "11"},
                                   "spec": {"replicas": 1}, "status": {"ready": 1}});
        let spec_update = json!({"metadata": {"generation": 4, "resourceVersion": "12"},
                                 "spec": {"replicas": 2}, "status": {"ready": 1}});
        let p = Predicate::GenerationChanged;
        assert!(!p.evaluate(Modified, Some(&old), &status_update));
        assert!(p.evaluate(Modified, Some(&status_update), &spec_update));
        assert!(Predicate::ResourceVersionChanged.evaluate(Modified, Some(&old), &status_update));
    }

    #[test]
    fn changed_predicates_pass_non_update_events() {
        let o = obj(json!({"generation": 1}));
        for p in [
            Predicate::GenerationChanged,
            Predicate::LabelsChanged,
            Predicate::AnnotationsChanged,
            Predicate::ResourceVersionChanged,
        ] {
            for kind in [Added, Deleted, Sync] {
                assert!(p.evaluate(kind, None, &o), "{p:?} on {kind:?}");
                assert!(p.evaluate(kind, Some(&o), &o), "{p:?} on {kind:?}");
            }
            assert!(
                !p.evaluate(Modified, Some(&o), &o),
                "{p:?} identical update"
            );
            assert!(!p.evaluate(Modified, None, &o), "{p:?} update without old");
        }
    }

    #[test]
    fn generation_missing_reads_as_zero() {
        let without = obj(json!({"name": "cm"}));
        let with_zero = obj(json!({"generation": 0}));
        let with_one = obj(json!({"generation": 1}));
        let p = Predicate::GenerationChanged;
        assert!(!p.evaluate(Modified, Some(&without), &without));
        assert!(!p.evaluate(Modified, Some(&without), &with_zero));
        assert!(p.evaluate(Modified, Some(&without), &with_one));
        let mistyped = obj(json!({"generation": "2"}));
        assert!(!p.evaluate(Modified, Some(&mistyped), &without));
    }

    #[test]
    fn labels_and_annotations_changed() {
        let a = obj(json!({"labels": {"app": "x", "tier": "web"}}));
        let reordered = obj(json!({"labels": {"tier": "web", "app": "x"}}));
        let b = obj(json!({"labels": {"app": "y", "tier": "web"}}));
        let none = obj(json!({}));
        let empty = obj(json!({"labels": {}, "annotations": {}}));
        let nulls = obj(json!({"labels": null, "annotations": null}));
        let p = Predicate::LabelsChanged;
        assert!(!p.evaluate(Modified, Some(&a), &reordered));
        assert!(p.evaluate(Modified, Some(&a), &b));
        assert!(p.evaluate(Modified, Some(&none), &a));
        assert!(!p.evaluate(Modified, Some(&none), &empty));
        assert!(!p.evaluate(Modified, Some(&nulls), &empty));

        let q = Predicate::AnnotationsChanged;
        let ann = obj(json!({"annotations": {"note": "1"}, "labels": {"app": "x"}}));
        let ann2 = obj(json!({"annotations": {"note": "2"}, "labels": {"app": "x"}}));
        assert!(q.evaluate(Modified, Some(&ann), &ann2));
        assert!(
            !q.evaluate(Modified, Some(&a), &b),
            "label change is not an annotation change"
        );
        assert!(!q.evaluate(Modified, Some(&none), &empty));
    }

    #[test]
    fn resource_version_changed() {
        let v1 = obj(json!({"resourceVersion": "1"}));
        let v2 = obj(json!({"resourceVersion": "2"}));
        let p = Predicate::ResourceVersionChanged;
        assert!(p.evaluate(Modified, Some(&v1), &v2));
        assert!(!p.evaluate(Modified, Some(&v1), &v1));
    }

    #[test]
    fn label_selector_match_labels_and_expressions() {
        use SelectorOperator::*;
        let o = obj(json!({"labels": {"app": "web", "env": "prod"}}));
        let cases = [
            (selector(&[], vec![]), true),
            (selector(&[("app", "web")], vec![]), true),
            (selector(&[("app", "db")], vec![]), false),
            (selector(&[("app", "web"), ("env", "prod")], vec![]), true),
            (selector(&[("missing", "")], vec![]), false),
            (
                selector(&[], vec![req("env", In, &["prod", "staging"])]),
                true,
            ),
            (selector(&[], vec![req("env", In, &["dev"])]), false),
            (selector(&[], vec![req("missing", In, &["x"])]), false),
            (selector(&[], vec![req("env", NotIn, &["dev"])]), true),
            (selector(&[], vec![req("env", NotIn, &["prod"])]), false),
            (selector(&[], vec![req("missing", NotIn, &["x"])]), true),
            (selector(&[], vec![req("app", Exists, &[])]), true),
            (selector(&[], vec![req("missing", Exists, &[])]), false),
            (selector(&[], vec![req("missing", DoesNotExist, &[])]), true),
            (selector(&[], vec![req("app", DoesNotExist, &[])]), false),
            (
                selector(&[("app", "web")], vec![req("env", In, &["dev"])]),
                false,
            ),
        ];
        for (i, (s, want)) in cases.into_iter().enumerate() {
            assert_eq!(s.matches_object(&o), want, "case {i}: {s:?}");
            let labels: BTreeMap<String, String> = [("app", "web"), ("env", "prod")]
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect();
            assert_eq!(s.matches(&labels), want, "case {i} on a label map");
            assert_eq!(
                Predicate::LabelSelector(s).evaluate(Added, None, &o),
                want,
                "case {i} as predicate"
            );
        }
    }

    #[test]
    fn label_selector_tolerates_odd_objects() {
        let s = selector(&[], vec![req("app", SelectorOperator::DoesNotExist, &[])]);
        assert!(s.matches_object(&json!({})));
        assert!(s.matches_object(&json!({"metadata": "nonsense"})));
        assert!(s.matches_object(&json!({"metadata": {"labels": {"app": 7}}})));
        assert!(s.matches_object(&json!(null)));
    }

    #[test]
    fn label_selector_uses_new_object_and_old_for_deletes() {
        let p = Predicate::LabelSelector(selector(&[("app", "web")], vec![]));
        let web = obj(json!({"labels": {"app": "web"}}));
        let db = obj(json!({"labels": {"app": "db"}}));
        assert!(p.evaluate(Modified, Some(&db), &web));
        assert!(!p.evaluate(Modified, Some(&web), &db));
        assert!(
            p.evaluate(Deleted, Some(&web), &db),
            "deletes look at the last known state"
        );
        assert!(p.evaluate(Deleted, None, &web), "falls back to new");
        assert!(p.evaluate(Sync, None, &web));
    }

    #[test]
    fn deleting_and_has_finalizer() {
        let live = obj(json!({"finalizers": ["example.com/cleanup"]}));
        let deleting = obj(json!({"deletionTimestamp": "2024-01-01T00:00:00Z",
                                  "finalizers": ["example.com/cleanup", "kubernetes"]}));
        let null_ts = obj(json!({"deletionTimestamp": null}));
        assert!(!Predicate::Deleting.evaluate(Modified, Some(&live), &live));
        assert!(Predicate::Deleting.evaluate(Modified, Some(&live), &deleting));
        assert!(!Predicate::Deleting.evaluate(Added, None, &null_ts));
        assert!(Predicate::Deleting.evaluate(Deleted, Some(&deleting), &live));

        let has = |name: &str| Predicate::HasFinalizer(name.to_owned());
        assert!(has("example.com/cleanup").evaluate(Added, None, &live));
        assert!(!has("kubernetes").evaluate(Added, None, &live));
        assert!(has("kubernetes").evaluate(Modified, Some(&live), &deleting));
        assert!(!has("x").evaluate(Added, None, &obj(json!({"finalizers": "x"}))));
        assert!(!has("x").evaluate(Added, None, &json!({})));
    }

    #[test]
    fn combinators() {
        let o = obj(json!({"labels": {"app": "web"}}));
        let t = || Predicate::AllOf(vec![]);
        let f = || Predicate::AnyOf(vec![]);
        assert!(t().evaluate(Added, None, &o), "empty all_of is true");
        assert!(!f().evaluate(Added, None, &o), "empty any_of is false");
        assert!(Predicate::AllOf(vec![t(), t()]).evaluate(Added, None, &o));
        assert!(!Predicate::AllOf(vec![t(), f()]).evaluate(Added, None, &o));
        assert!(Predicate::AnyOf(vec![f(), t()]).evaluate(Added, None, &o));
        assert!(!Predicate::AnyOf(vec![f(), f()]).evaluate(Added, None, &o));
        assert!(Predicate::Not(Box::new(f())).evaluate(Added, None, &o));
        assert!(!Predicate::Not(Box::new(t())).evaluate(Added, None, &o));
    }

    #[test]
    fn typical_tree_spec_changes_or_deletion_start() {
        // "Reconcile on spec changes, or when deletion starts, for app=web only."
        let p = Predicate::AllOf(vec![
            Predicate::LabelSelector(selector(&[("app", "web")], vec![])),
            Predicate::AnyOf(vec![Predicate::GenerationChanged, Predicate::Deleting]),
        ]);
        let old = obj(json!({"labels": {"app": "web"}, "generation": 1}));
        let status =
            obj(json!({"labels": {"app": "web"}, "generation": 1, "resourceVersion": "9"}));
        let deleting = obj(json!({"labels": {"app": "web"}, "generation": 1,
                                  "deletionTimestamp": "2024-01-01T00:00:00Z"}));
        let other = obj(json!({"labels": {"app": "db"}, "generation": 2}));
        assert!(!p.evaluate(Modified, Some(&old), &status));
        assert!(p.evaluate(Modified, Some(&old), &deleting));
        assert!(!p.evaluate(Modified, Some(&old), &other));
        assert!(p.evaluate(Added, None, &old));
    }

    #[test]
    fn validate_accepts_good_trees() {
        use SelectorOperator::*;
        let p = Predicate::AllOf(vec![
            Predicate::LabelSelector(selector(
                &[("app.kubernetes.io/name", "web"), ("empty-ok", "")],
                vec![
                    req("tier", In, &["a", "b_c.d-e"]),
                    req("example.com/x", NotIn, &["y"]),
                    req("k", Exists, &[]),
                    req("j", DoesNotExist, &[]),
                ],
            )),
            Predicate::Not(Box::new(Predicate::HasFinalizer("kubernetes".into()))),
            Predicate::HasFinalizer("example.com/cleanup".into()),
            Predicate::AnyOf(vec![Predicate::GenerationChanged, Predicate::Deleting]),
        ]);
        assert_eq!(p.validate(), Ok(()));
    }

    #[test]
    fn validate_names_the_offending_field() {
        use SelectorOperator::*;
        let sel = |s: LabelSelector| {
            Predicate::AllOf(vec![
                Predicate::Deleting,
                Predicate::Not(Box::new(Predicate::LabelSelector(s))),
            ])
        };
        let cases: Vec<(Predicate, &str, &str)> = vec![
            (
                sel(selector(&[("bad key", "v")], vec![])),
                "predicate.all_of.predicates[1].negate.label_selector.match_labels[\"bad key\"]",
                "invalid_label_key",
            ),
            (
                sel(selector(&[("k", "-bad")], vec![])),
                "predicate.all_of.predicates[1].negate.label_selector.match_labels[\"k\"]",
                "invalid_label_value",
            ),
            (
                sel(selector(&[(&"a".repeat(64), "v")], vec![])),
                "predicate.all_of.predicates[1].negate.label_selector.match_labels[\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"]",
                "invalid_label_key",
            ),
            (
                sel(selector(&[("Upper.Com/x", "v")], vec![])),
                "predicate.all_of.predicates[1].negate.label_selector.match_labels[\"Upper.Com/x\"]",
                "invalid_label_key",
            ),
            (
                sel(selector(&[], vec![req("ok", In, &[])])),
                "predicate.all_of.predicates[1].negate.label_selector.match_expressions[0].values",
                "operator_values",
            ),
            (
                sel(selector(&[], vec![req("ok", Exists, &["x"])])),
                "predicate.all_of.predicates[1].negate.label_selector.match_expressions[0].values",
                "operator_values",
            ),
            (
                sel(selector(
                    &[],
                    vec![req("ok", Exists, &[]), req("/x", Exists, &[])],
                )),
                "predicate.all_of.predicates[1].negate.label_selector.match_expressions[1].key",
                "invalid_label_key",
            ),
            (
                sel(selector(&[], vec![req("ok", NotIn, &["fine", "not fine"])])),
                "predicate.all_of.predicates[1].negate.label_selector.match_expressions[0].values[1]",
                "invalid_label_value",
            ),
            (
                Predicate::AnyOf(vec![Predicate::HasFinalizer(String::new())]),
                "predicate.any_of.predicates[0].has_finalizer",
                "invalid_finalizer",
            ),
        ];
        for (p, path, label) in cases {
            let err = p.validate().expect_err(path);
            assert_eq!(err.path(), path);
            assert_eq!(err.metric_label(), label);
            assert!(err.to_string().starts_with(path), "{err}");
        }
    }

    #[test]
    fn operator_error_message_is_actionable() {
        let p =
            Predicate::LabelSelector(selector(&[], vec![req("tier", SelectorOperator::In, &[])]));
        let err = p
            .validate_at("register.predicate")
            .expect_err("In without values");
        assert_eq!(
            err.to_string(),
            "register.predicate.label_selector.match_expressions[0].values: operator In requires \
             at least one value"
        );
    }

    #[test]
    fn validate_limits_depth_and_size() {
        let mut p = Predicate::Deleting;
        for _ in 1..MAX_DEPTH {
            p = Predicate::Not(Box::new(p));
        }
        assert_eq!(p.validate(), Ok(()), "exactly MAX_DEPTH levels is fine");
        let deeper = Predicate::AllOf(vec![p]);
        let err = deeper.validate().expect_err("too deep");
        assert_eq!(err.metric_label(), "too_deep");
        assert!(
            err.path()
                .starts_with("predicate.all_of.predicates[0].negate.negate")
        );

        let wide = Predicate::AnyOf(vec![Predicate::Deleting; MAX_NODES]);
        let err = wide.validate().expect_err("too many nodes");
        assert_eq!(err.metric_label(), "too_many_nodes");
        assert_eq!(
            err.path(),
            format!("predicate.any_of.predicates[{}]", MAX_NODES - 1)
        );
    }

    #[test]
    fn standalone_selector_validation() {
        let s = selector(&[("ok", "fine")], vec![]);
        assert_eq!(s.validate(), Ok(()));
        let bad = selector(&[("ok", &"v".repeat(64))], vec![]);
        let err = bad.validate().expect_err("value too long");
        assert_eq!(err.path(), "label_selector.match_labels[\"ok\"]");
        assert!(err.to_string().contains("63 characters"), "{err}");
    }
}
