//! Kubernetes label and field selectors, as sent in the `labelSelector=` and
//! `fieldSelector=` list/watch query parameters.
//!
//! The grammar and validation follow `k8s.io/apimachinery/pkg/labels` and
//! `k8s.io/apimachinery/pkg/fields` closely enough that clients (kubectl,
//! kube-rs, client-go) see the same accept/reject decisions as against a real
//! API server; the error texts are informative rather than byte-identical.

use serde_json::{Map, Value};
use std::fmt;

/// Why a selector string (or `metav1.LabelSelector`) could not be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SelectorError {
    /// The selector is syntactically malformed or names an invalid key/value;
    /// the server answers 400 Bad Request.
    #[error("unable to parse requirement: {0}")]
    Parse(String),
    /// A field selector names a field this server cannot filter on; kept apart
    /// from `Parse` because a real API server phrases it differently.
    #[error("{0}")]
    UnsupportedField(String),
}

/// Label selector operator; `Gt`/`Lt` exist because the k8s grammar accepts
/// `a>1` / `a<1`, so rejecting them would diverge from a real server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One comma-separated clause of a label selector.
#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
    /// Sorted and de-duplicated so that equal selectors compare equal.
    values: Vec<String>,
}

impl Requirement {
    /// Builds a requirement, enforcing the same invariants as k8s
    /// `labels.NewRequirement` so that both the string and JSON forms reject
    /// the same inputs.
    fn new(key: &str, op: Op, mut values: Vec<String>) -> Result<Self, SelectorError> {
        validate_label_key(key)?;
        match op {
            Op::In | Op::NotIn => {
                if values.is_empty() {
                    return Err(SelectorError::Parse(format!(
                        "key {key:?}: for 'in', 'notin' operators, values set can't be empty"
                    )));
                }
            }
            Op::Equals | Op::NotEquals => {
                if values.len() != 1 {
                    return Err(SelectorError::Parse(format!(
                        "key {key:?}: exact-match compatibility requires one single value"
                    )));
                }
            }
            Op::Exists | Op::DoesNotExist => {
                if !values.is_empty() {
                    return Err(SelectorError::Parse(format!(
                        "key {key:?}: values set must be empty for exists and does not exist"
                    )));
                }
            }
            Op::GreaterThan | Op::LessThan => {
                if values.len() != 1 || values[0].parse::<i64>().is_err() {
                    return Err(SelectorError::Parse(format!(
                        "key {key:?}: for 'Gt', 'Lt' operators, exactly one integer value is required"
                    )));
                }
            }
        }
        if !matches!(op, Op::GreaterThan | Op::LessThan) {
            for v in &values {
                validate_label_value(key, v)?;
            }
        }
        values.sort();
        values.dedup();
        Ok(Self {
            key: key.to_owned(),
            op,
            values,
        })
    }

    fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let present = labels.and_then(|l| l.get(&self.key));
        // A non-string label value cannot come from a valid object, but if
        // one slips through it counts as present yet equal to nothing.
        let value = present.and_then(Value::as_str);
        let in_set = |v: Option<&str>| v.is_some_and(|v| self.values.iter().any(|x| x == v));
        match self.op {
            Op::Equals | Op::In => in_set(value),
            Op::NotEquals | Op::NotIn => !in_set(value),
            Op::Exists => present.is_some(),
            Op::DoesNotExist => present.is_none(),
            Op::GreaterThan | Op::LessThan => {
                let (Some(have), Some(want)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|v| v.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.op == Op::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

/// A parsed label selector: every requirement must hold (logical AND).
///
/// The default value is the empty selector, which matches every object, just
/// as an empty `labelSelector=` does on a real API server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the `labelSelector=` string syntax (`a=b`, `a==b`, `a!=b`,
    /// `a in (x,y)`, `a notin (x)`, `a`, `!a`, comma-separated AND).
    ///
    /// Keys and values are validated like k8s does, so a selector a real
    /// server would reject with 400 is rejected here too.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let tokens = lex(s);
        let mut p = Parser { tokens, pos: 0 };
        let mut requirements = Vec::new();
        if p.peek() == &Tok::End {
            return Ok(Self::default());
        }
        loop {
            requirements.push(p.requirement()?);
            match p.next() {
                Tok::End => break,
                Tok::Comma => {
                    if !matches!(p.peek(), Tok::Ident(_) | Tok::Bang) {
                        return Err(SelectorError::Parse(format!(
                            "found '{}', expected: identifier after ','",
                            p.peek()
                        )));
                    }
                }
                t => {
                    return Err(SelectorError::Parse(format!(
                        "found '{t}', expected: ',' or 'end of string'"
                    )));
                }
            }
        }
        Ok(Self { requirements })
    }

    /// Builds a selector from a `metav1.LabelSelector` JSON object
    /// (`matchLabels` plus `matchExpressions`).
    ///
    /// `null` and `{}` both yield the match-everything selector; callers for
    /// which an absent selector must select nothing (k8s `nil` semantics)
    /// have to check for absence themselves.
    pub(crate) fn from_label_selector_json(v: &Value) -> Result<Self, SelectorError> {
        let obj = match v {
            Value::Null => return Ok(Self::default()),
            Value::Object(o) => o,
            other => {
                return Err(SelectorError::Parse(format!(
                    "label selector must be an object, got {other}"
                )));
            }
        };
        let mut requirements = Vec::new();
        match obj.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (k, val) in labels {
                    let Some(val) = val.as_str() else {
                        return Err(SelectorError::Parse(format!(
                            "matchLabels[{k:?}]: value must be a string"
                        )));
                    };
                    requirements.push(Requirement::new(k, Op::Equals, vec![val.to_owned()])?);
                }
            }
            Some(_) => {
                return Err(SelectorError::Parse(
                    "matchLabels must be an object".to_owned(),
                ));
            }
        }
        match obj.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(exprs)) => {
                for (i, expr) in exprs.iter().enumerate() {
                    requirements.push(requirement_from_expression(i, expr)?);
                }
            }
            Some(_) => {
                return Err(SelectorError::Parse(
                    "matchExpressions must be an array".to_owned(),
                ));
            }
        }
        Ok(Self { requirements })
    }

    /// Tests an object's `metadata.labels`; `None` means the object has no
    /// labels, which still satisfies `!=`, `notin` and `!key` requirements.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Convenience for [`LabelSelector::matches`] on a whole object, reading
    /// `metadata.labels` (absent or non-object labels count as none).
    pub(crate) fn matches_object(&self, obj: &Value) -> bool {
        let labels = obj
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        self.matches(labels)
    }
}

fn requirement_from_expression(i: usize, expr: &Value) -> Result<Requirement, SelectorError> {
    let at = |msg: &str| SelectorError::Parse(format!("matchExpressions[{i}]: {msg}"));
    let key = expr
        .get("key")
        .and_then(Value::as_str)
        .ok_or_else(|| at("key must be a string"))?;
    let op = match expr.get("operator").and_then(Value::as_str) {
        Some("In") => Op::In,
        Some("NotIn") => Op::NotIn,
        Some("Exists") => Op::Exists,
        Some("DoesNotExist") => Op::DoesNotExist,
        Some(other) => {
            return Err(at(&format!(
                "{other:?} is not a valid label selector operator"
            )));
        }
        None => return Err(at("operator must be a string")),
    };
    let values = match expr.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(vs)) => vs
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| at("values must be strings"))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(at("values must be an array")),
    };
    Requirement::new(key, op, values).map_err(|e| match e {
        SelectorError::Parse(m) => at(&m),
        other => other,
    })
}

/// Lexical token of the label selector grammar.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `=` or `==`.
    Eq,
    NotEq,
    Bang,
    Gt,
    Lt,
    LParen,
    RParen,
    Comma,
    End,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => f.write_str(s),
            Tok::Eq => f.write_str("="),
            Tok::NotEq => f.write_str("!="),
            Tok::Bang => f.write_str("!"),
            Tok::Gt => f.write_str(">"),
            Tok::Lt => f.write_str("<"),
            Tok::LParen => f.write_str("("),
            Tok::RParen => f.write_str(")"),
            Tok::Comma => f.write_str(","),
            Tok::End => Ok(()),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// Splits into tokens; never fails because any run of non-special,
/// non-space characters is an identifier and validation happens later.
fn lex(s: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if is_special(c) {
            chars.next();
            let tok = match c {
                '=' => {
                    if chars.peek() == Some(&'=') {
                        chars.next();
                    }
                    Tok::Eq
                }
                '!' => {
                    if chars.peek() == Some(&'=') {
                        chars.next();
                        Tok::NotEq
                    } else {
                        Tok::Bang
                    }
                }
                '(' => Tok::LParen,
                ')' => Tok::RParen,
                ',' => Tok::Comma,
                '>' => Tok::Gt,
                _ => Tok::Lt,
            };
            out.push(tok);
            continue;
        }
        let mut ident = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() || is_special(c) {
                break;
            }
            ident.push(c);
            chars.next();
        }
        out.push(Tok::Ident(ident));
    }
    out.push(Tok::End);
    out
}

struct Parser {
    tokens: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        self.tokens.get(self.pos).unwrap_or(&Tok::End)
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        match self.next() {
            Tok::Bang => {
                let key = match self.next() {
                    Tok::Ident(k) => k,
                    t => {
                        return Err(SelectorError::Parse(format!(
                            "found '{t}', expected: identifier after '!'"
                        )));
                    }
                };
                if !matches!(self.peek(), Tok::Comma | Tok::End) {
                    return Err(SelectorError::Parse(format!(
                        "found '{}', expected: ',' or 'end of string' after '!{key}'",
                        self.peek()
                    )));
                }
                Requirement::new(&key, Op::DoesNotExist, Vec::new())
            }
            Tok::Ident(key) => self.after_key(key),
            t => Err(SelectorError::Parse(format!(
                "found '{t}', expected: !, identifier, or 'end of string'"
            ))),
        }
    }

    fn after_key(&mut self, key: String) -> Result<Requirement, SelectorError> {
        let op = match self.peek() {
            Tok::Comma | Tok::End => return Requirement::new(&key, Op::Exists, Vec::new()),
            Tok::Eq => Op::Equals,
            Tok::NotEq => Op::NotEquals,
            Tok::Gt => Op::GreaterThan,
            Tok::Lt => Op::LessThan,
            Tok::Ident(s) if s == "in" => Op::In,
            Tok::Ident(s) if s == "notin" => Op::NotIn,
            t => {
                return Err(SelectorError::Parse(format!(
                    "found '{t}', expected: =, !=, ==, in, notin after key {key:?}"
                )));
            }
        };
        self.next();
        let values = if matches!(op, Op::In | Op::NotIn) {
            self.set_values(&key)?
        } else {
            match self.peek() {
                // `a=` selects the empty value, which is a valid label value.
                Tok::Comma | Tok::End => vec![String::new()],
                Tok::Ident(_) => match self.next() {
                    Tok::Ident(v) => vec![v],
                    _ => Vec::new(),
                },
                t => {
                    return Err(SelectorError::Parse(format!(
                        "found '{t}', expected: identifier as value of {key:?}"
                    )));
                }
            }
        };
        Requirement::new(&key, op, values)
    }

    /// Parses `( v1, v2, ... )`; an empty slot between commas is the empty
    /// label value, as in k8s.
    fn set_values(&mut self, key: &str) -> Result<Vec<String>, SelectorError> {
        match self.next() {
            Tok::LParen => {}
            t => {
                return Err(SelectorError::Parse(format!(
                    "found '{t}', expected: '(' after operator for key {key:?}"
                )));
            }
        }
        if self.peek() == &Tok::RParen {
            // apimachinery's parseValues reads "()" as the set {""}.
            self.next();
            return Ok(vec![String::new()]);
        }
        let mut values = Vec::new();
        loop {
            let v = match self.peek() {
                Tok::Ident(_) => match self.next() {
                    Tok::Ident(v) => v,
                    _ => String::new(),
                },
                Tok::Comma | Tok::RParen => String::new(),
                t => {
                    return Err(SelectorError::Parse(format!(
                        "found '{t}', expected: identifier in value list of {key:?}"
                    )));
                }
            };
            values.push(v);
            match self.next() {
                Tok::Comma => {}
                Tok::RParen => return Ok(values),
                t => {
                    return Err(SelectorError::Parse(format!(
                        "found '{t}', expected: ',' or ')' in value list of {key:?}"
                    )));
                }
            }
        }
    }
}

/// k8s "qualified name" segment: 1..=63 chars of `[A-Za-z0-9._-]`, starting
/// and ending alphanumeric. Label values use the same rule but may be empty.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            b.len() <= 63
                && f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// RFC 1123 subdomain, as required for a label key prefix.
fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            match (b.first(), b.last()) {
                (Some(f), Some(l)) => {
                    (f.is_ascii_lowercase() || f.is_ascii_digit())
                        && (l.is_ascii_lowercase() || l.is_ascii_digit())
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                }
                _ => false,
            }
        })
}

fn validate_label_key(key: &str) -> Result<(), SelectorError> {
    let bad = |why: &str| {
        Err(SelectorError::Parse(format!(
            "invalid label key {key:?}: {why}"
        )))
    };
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns1123_subdomain(prefix)
    {
        return bad("prefix part must be a lowercase RFC 1123 subdomain of at most 253 characters");
    }
    if name.is_empty() {
        return bad("name part must be non-empty");
    }
    if name.len() > 63 {
        return bad("name part must be no more than 63 characters");
    }
    if !is_qualified_name_part(name) {
        return bad(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
        );
    }
    Ok(())
}

fn validate_label_value(key: &str, value: &str) -> Result<(), SelectorError> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 {
        return Err(SelectorError::Parse(format!(
            "invalid label value {value:?} for key {key:?}: must be no more than 63 characters"
        )));
    }
    if !is_qualified_name_part(value) {
        return Err(SelectorError::Parse(format!(
            "invalid label value {value:?} for key {key:?}: must be empty or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )));
    }
    Ok(())
}

/// The object fields this server can filter on; everything else is refused
/// rather than silently matching nothing or everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Name,
    Namespace,
    /// A string field reached by these keys from the object's root.
    Path(&'static [&'static str]),
    /// An Event's `source`: `source.component`, or `reportingComponent` when
    /// that is empty (kube-apiserver's `ToSelectableFields` for events).
    EventSource,
}

/// The field labels of core/v1 Events beyond `metadata.*`, as kube-apiserver
/// registers them (pkg/registry/core/event). `kubectl describe` lists an
/// object's events with `involvedObject.name/namespace/kind/uid`, and
/// `kubectl events --for` with the same; operators that post events on their
/// objects (kopf, client-go's recorder) rely on those queries to be visible.
const EVENT_FIELDS: &[(&str, Field)] = &[
    (
        "involvedObject.kind",
        Field::Path(&["involvedObject", "kind"]),
    ),
    (
        "involvedObject.namespace",
        Field::Path(&["involvedObject", "namespace"]),
    ),
    (
        "involvedObject.name",
        Field::Path(&["involvedObject", "name"]),
    ),
    (
        "involvedObject.uid",
        Field::Path(&["involvedObject", "uid"]),
    ),
    (
        "involvedObject.apiVersion",
        Field::Path(&["involvedObject", "apiVersion"]),
    ),
    (
        "involvedObject.resourceVersion",
        Field::Path(&["involvedObject", "resourceVersion"]),
    ),
    (
        "involvedObject.fieldPath",
        Field::Path(&["involvedObject", "fieldPath"]),
    ),
    ("reason", Field::Path(&["reason"])),
    ("reportingComponent", Field::Path(&["reportingComponent"])),
    ("source", Field::EventSource),
    ("type", Field::Path(&["type"])),
];

/// The field labels `resource` of `group` accepts besides `metadata.name` and
/// `metadata.namespace`.
fn resource_fields(group: &str, resource: &str) -> &'static [(&'static str, Field)] {
    match (group, resource) {
        ("", "events") => EVENT_FIELDS,
        _ => &[],
    }
}

#[derive(Debug, Clone, PartialEq)]
struct FieldRequirement {
    field: Field,
    negate: bool,
    value: String,
}

/// A parsed field selector over `metadata.name` / `metadata.namespace` (and
/// the resource's own field labels, see [`FieldSelector::parse_for`]) with
/// `=`, `==` and `!=`; every clause must hold.
///
/// The default value is the empty selector, which matches every object.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses the `fieldSelector=` syntax, including k8s backslash escapes
    /// (`\,`, `\=`, `\\`) in values.
    ///
    /// Fields other than `metadata.name` and `metadata.namespace` yield
    /// [`SelectorError::UnsupportedField`], matching the API server's
    /// "field label not supported" rejection.
    pub(crate) fn parse(s: &str) -> Result<Self, SelectorError> {
        Self::parse_with(s, &[])
    }

    /// Like [`FieldSelector::parse`] for a request on `resource` of `group`:
    /// also accepts the field labels kube-apiserver registers for that
    /// resource (for core/v1 `events`: `involvedObject.*`, `reason`,
    /// `reportingComponent`, `source`, `type`).
    pub(crate) fn parse_for(s: &str, group: &str, resource: &str) -> Result<Self, SelectorError> {
        Self::parse_with(s, resource_fields(group, resource))
    }

    fn parse_with(s: &str, extra: &[(&str, Field)]) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for part in split_unescaped_commas(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let Some((lhs, negate, rhs)) = split_term(part) else {
                return Err(SelectorError::Parse(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let lhs = lhs.trim();
            let field = match lhs {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other => match extra.iter().find(|(label, _)| *label == other) {
                    Some((_, field)) => *field,
                    None => {
                        return Err(SelectorError::UnsupportedField(format!(
                            "field label not supported: {other}"
                        )));
                    }
                },
            };
            let value = unescape_field_value(rhs.trim())?;
            requirements.push(FieldRequirement {
                field,
                negate,
                value,
            });
        }
        Ok(Self { requirements })
    }

    /// Tests an object; a missing field compares as `""` (as in kube-apiserver,
    /// whose field sets hold every label), which is how cluster-scoped objects
    /// match `metadata.namespace=`.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let text = |path: &[&str]| {
            path.iter()
                .try_fold(obj, |v, key| v.get(key))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        self.requirements.iter().all(|r| {
            let actual = match r.field {
                Field::Name => text(&["metadata", "name"]),
                Field::Namespace => text(&["metadata", "namespace"]),
                Field::Path(path) => text(path),
                Field::EventSource => match text(&["source", "component"]) {
                    "" => text(&["reportingComponent"]),
                    component => component,
                },
            };
            (actual == r.value) != r.negate
        })
    }

    /// The exact name when some clause is `metadata.name=<x>`, so the server
    /// can do a direct lookup instead of a scan. The caller must still run
    /// [`FieldSelector::matches`] on the hit, as other clauses may exclude it.
    pub(crate) fn pinned_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == Field::Name && !r.negate)
            .map(|r| r.value.as_str())
    }
}

/// Splits on commas not preceded by an escaping backslash.
fn split_unescaped_commas(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            parts.push(&s[start..i]);
            start = i + 1;
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Finds the first unescaped operator; returns (lhs, is_not_equal, rhs).
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
            continue;
        }
        let rest = &term[i..];
        if rest.starts_with("!=") {
            return Some((&term[..i], true, &term[i + 2..]));
        }
        if rest.starts_with("==") {
            return Some((&term[..i], false, &term[i + 2..]));
        }
        if rest.starts_with('=') {
            return Some((&term[..i], false, &term[i + 1..]));
        }
    }
    None
}

/// Reverses k8s field-value escaping; like k8s, a bare `,` or `=` or an
/// unknown escape is an error rather than being taken literally.
fn unescape_field_value(v: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(SelectorError::Parse(format!(
                        "invalid escape sequence '\\{e}' in field selector value {v:?}"
                    )));
                }
                None => {
                    return Err(SelectorError::Parse(format!(
                        "trailing backslash in field selector value {v:?}"
                    )));
                }
            },
            ',' | '=' => {
                return Err(SelectorError::Parse(format!(
                    "unescaped '{c}' in field selector value {v:?}"
                )));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("test labels must be an object"),
        }
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).expect("selector should parse")
    }

    #[test]
    fn empty_selector_matches_everything() {
        for s in ["", "   "] {
            let ls = sel(s);
            assert!(ls.requirements.is_empty());
            assert!(ls.matches(None));
            assert!(ls.matches(Some(&labels(json!({"a": "b"})))));
        }
    }

    #[test]
    fn equality_operators() {
        let l = labels(json!({"app": "web", "tier": "front"}));
        assert!(sel("app=web").matches(Some(&l)));
        assert!(sel("app==web").matches(Some(&l)));
        assert!(!sel("app=db").matches(Some(&l)));
        assert!(sel("app!=db").matches(Some(&l)));
        assert!(!sel("app!=web").matches(Some(&l)));
        // `!=` also matches objects lacking the label entirely, as in k8s.
        assert!(sel("other!=x").matches(Some(&l)));
        assert!(sel("other!=x").matches(None));
        assert!(!sel("app=web").matches(None));
    }

    #[test]
    fn and_of_requirements_with_whitespace() {
        let l = labels(json!({"app": "web", "tier": "front"}));
        assert!(sel(" app = web , tier==front ").matches(Some(&l)));
        assert!(!sel("app=web,tier=back").matches(Some(&l)));
    }

    #[test]
    fn set_based_operators() {
        let l = labels(json!({"env": "prod"}));
        assert!(sel("env in (prod, staging)").matches(Some(&l)));
        assert!(sel("env in(prod)").matches(Some(&l)));
        assert!(!sel("env in (dev,staging)").matches(Some(&l)));
        assert!(sel("env notin (dev)").matches(Some(&l)));
        assert!(!sel("env notin (dev, prod)").matches(Some(&l)));
        assert!(sel("missing notin (x)").matches(Some(&l)));
        assert!(!sel("missing in (x)").matches(Some(&l)));
        assert!(sel("env in (prod),app notin (x)").matches(Some(&l)));
    }

    #[test]
    fn empty_parentheses_are_the_empty_value_as_in_apimachinery() {
        let empty = labels(json!({"a": ""}));
        let set = labels(json!({"a": "x"}));
        assert!(sel("a in ()").matches(Some(&empty)));
        assert!(!sel("a in ()").matches(Some(&set)));
        assert!(sel("a notin ()").matches(Some(&set)));
        assert!(!sel("a notin ()").matches(Some(&empty)));
    }

    #[test]
    fn empty_value_in_set_and_equality() {
        let l = labels(json!({"a": ""}));
        assert!(sel("a=").matches(Some(&l)));
        assert!(sel("a in (x,)").matches(Some(&l)));
        assert!(!sel("a in (x)").matches(Some(&l)));
    }

    #[test]
    fn exists_and_not_exists() {
        let l = labels(json!({"app": "web"}));
        assert!(sel("app").matches(Some(&l)));
        assert!(!sel("!app").matches(Some(&l)));
        assert!(sel("!db").matches(Some(&l)));
        assert!(!sel("db").matches(Some(&l)));
        assert!(sel("!db").matches(None));
        assert!(sel("app, !db").matches(Some(&l)));
    }

    #[test]
    fn prefixed_keys() {
        let l = labels(json!({"app.kubernetes.io/name": "x"}));
        assert!(sel("app.kubernetes.io/name=x").matches(Some(&l)));
        assert!(sel("app.kubernetes.io/name").matches(Some(&l)));
    }

    #[test]
    fn gt_lt() {
        let l = labels(json!({"n": "5"}));
        assert!(sel("n>3").matches(Some(&l)));
        assert!(!sel("n<3").matches(Some(&l)));
        assert!(LabelSelector::parse("n>x").is_err());
    }

    #[test]
    fn invalid_selectors_are_rejected() {
        for bad in [
            "a=b c",
            "a in",
            "a in (",
            "a in (b c)",
            "a,",
            ",a",
            "!a=b",
            "!",
            "=b",
            "a b",
            "-a=b",
            "a-=b",
            "Upper.Case/x=y",
            "a/b/c=d",
            "/a=b",
            "a/=b",
            "a=-b",
            "a=b!",
            "a==",
        ] {
            let r = LabelSelector::parse(bad);
            if bad == "a==" {
                // `a==` is `a` equal to the empty value, which is valid.
                assert!(r.is_ok(), "{bad:?} should parse");
                continue;
            }
            assert!(
                matches!(r, Err(SelectorError::Parse(_))),
                "{bad:?} should fail, got {r:?}"
            );
        }
        let long = "x".repeat(64);
        assert!(LabelSelector::parse(&format!("{long}=a")).is_err());
        assert!(LabelSelector::parse(&format!("a={long}")).is_err());
        assert!(LabelSelector::parse(&format!("a={}", "x".repeat(63))).is_ok());
    }

    #[test]
    fn error_names_the_bad_part() {
        let err = LabelSelector::parse("app=bad value!").expect_err("must fail");
        let msg = err.to_string();
        assert!(msg.starts_with("unable to parse requirement: "), "{msg}");
        let err = LabelSelector::parse("-bad=x").expect_err("must fail");
        assert!(err.to_string().contains("\"-bad\""), "{err}");
        let err = LabelSelector::parse("a=-x").expect_err("must fail");
        assert!(err.to_string().contains("\"-x\""), "{err}");
    }

    #[test]
    fn equal_selectors_compare_equal() {
        assert_eq!(sel("a in (y, x, x)"), sel("a in (x,y)"));
        assert_eq!(sel("a==b"), sel("a=b"));
    }

    #[test]
    fn from_json_match_labels_and_expressions() {
        let ls = LabelSelector::from_label_selector_json(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod", "staging"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "tier", "operator": "Exists", "values": []},
                {"key": "zone", "operator": "NotIn", "values": ["a"]}
            ]
        }))
        .expect("valid selector");
        assert!(!ls.requirements.is_empty());
        let ok = json!({"metadata": {"labels": {"app": "web", "env": "prod", "tier": "x", "zone": "b"}}});
        assert!(ls.matches_object(&ok));
        let canary = json!({"metadata": {"labels": {"app": "web", "env": "prod", "tier": "x", "canary": "1"}}});
        assert!(!ls.matches_object(&canary));
        let wrong_env = json!({"metadata": {"labels": {"app": "web", "env": "dev", "tier": "x"}}});
        assert!(!ls.matches_object(&wrong_env));
        assert!(!ls.matches_object(&json!({"metadata": {}})));
    }

    #[test]
    fn from_json_empty_and_invalid() {
        assert!(
            LabelSelector::from_label_selector_json(&json!({}))
                .expect("empty")
                .requirements
                .is_empty()
        );
        assert!(
            LabelSelector::from_label_selector_json(&Value::Null)
                .expect("null")
                .requirements
                .is_empty()
        );
        for bad in [
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}),
            json!({"matchExpressions": [{"operator": "Exists"}]}),
            json!({"matchLabels": {"a": 1}}),
            json!({"matchLabels": {"-a": "b"}}),
            json!("a=b"),
        ] {
            assert!(
                LabelSelector::from_label_selector_json(&bad).is_err(),
                "{bad} should fail"
            );
        }
    }

    #[test]
    fn matches_object_without_metadata() {
        assert!(sel("!a").matches_object(&json!({})));
        assert!(!sel("a").matches_object(&json!({"metadata": {"labels": null}})));
    }

    fn obj(ns: Option<&str>, name: &str) -> Value {
        match ns {
            Some(ns) => json!({"metadata": {"name": name, "namespace": ns}}),
            None => json!({"metadata": {"name": name}}),
        }
    }

    #[test]
    fn field_selector_equality_and_inequality() {
        let fs = FieldSelector::parse("metadata.name=foo").expect("parse");
        assert!(fs.matches(&obj(Some("default"), "foo")));
        assert!(!fs.matches(&obj(Some("default"), "bar")));
        let fs = FieldSelector::parse("metadata.name!=foo").expect("parse");
        assert!(!fs.matches(&obj(None, "foo")));
        assert!(fs.matches(&obj(None, "bar")));
        let fs =
            FieldSelector::parse("metadata.namespace==kube-system, metadata.name!=x").expect("p");
        assert!(fs.matches(&obj(Some("kube-system"), "y")));
        assert!(!fs.matches(&obj(Some("kube-system"), "x")));
        assert!(!fs.matches(&obj(Some("default"), "y")));
    }

    #[test]
    fn field_selector_cluster_scoped_namespace_is_empty() {
        let fs = FieldSelector::parse("metadata.namespace=").expect("parse");
        assert!(fs.matches(&obj(None, "n")));
        assert!(!fs.matches(&obj(Some("a"), "n")));
    }

    #[test]
    fn field_selector_empty() {
        let fs = FieldSelector::parse("").expect("parse");
        assert!(fs.requirements.is_empty());
        assert!(fs.matches(&json!({})));
        assert_eq!(fs.pinned_name(), None);
    }

    #[test]
    fn field_selector_unsupported_field() {
        assert_eq!(
            FieldSelector::parse("status.phase=Running"),
            Err(SelectorError::UnsupportedField(
                "field label not supported: status.phase".to_owned()
            ))
        );
        assert_eq!(
            FieldSelector::parse("spec.nodeName=x")
                .expect_err("unsupported")
                .to_string(),
            "field label not supported: spec.nodeName"
        );
    }

    #[test]
    fn field_selector_malformed() {
        assert!(matches!(
            FieldSelector::parse("metadata.name"),
            Err(SelectorError::Parse(_))
        ));
        assert!(matches!(
            FieldSelector::parse("metadata.name=a=b"),
            Err(SelectorError::Parse(_))
        ));
        assert!(matches!(
            FieldSelector::parse("metadata.name=a\\q"),
            Err(SelectorError::Parse(_))
        ));
    }

    #[test]
    fn field_selector_escapes() {
        let fs = FieldSelector::parse(r"metadata.name=a\,b\=c").expect("parse");
        assert_eq!(fs.pinned_name(), Some("a,b=c"));
        assert!(fs.matches(&obj(None, "a,b=c")));
    }

    #[test]
    fn pinned_name_only_for_equality() {
        let fs = FieldSelector::parse("metadata.namespace=d,metadata.name==foo").expect("p");
        assert_eq!(fs.pinned_name(), Some("foo"));
        let fs = FieldSelector::parse("metadata.name!=foo").expect("p");
        assert_eq!(fs.pinned_name(), None);
        let fs = FieldSelector::parse("metadata.namespace=foo").expect("p");
        assert_eq!(fs.pinned_name(), None);
    }
}
