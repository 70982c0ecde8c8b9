//! Semantic validation of the built-in kinds controllers write most, as kube-apiserver's
//! `pkg/apis/*/validation` does it: 422 `Invalid` with one `field.Error`-shaped cause per
//! problem (`spec.replicas: Invalid value: -1: must be greater than or equal to 0`).
//!
//! Covered: object names per kind; label and annotation keys, values and sizes; workload
//! selectors against template labels, and their immutability; pod template containers (names
//! unique and DNS labels, image required, ports in range); Service type, ports and names;
//! ConfigMap and Secret keys, sizes and immutability; Lease fields. See LIMITATIONS.md for the
//! rest.

use crate::catalog::resources::ResourceInfo;
use crate::selector::LabelSelector;
use crate::status::{ApiError, Cause};
use serde_json::{Map, Value};

/// The value at a path of keys, like `Value::pointer` without parsing or allocating.
fn get_in<'v>(v: &'v Value, keys: &[&str]) -> Option<&'v Value> {
    keys.iter().try_fold(v, |cur, k| cur.get(*k))
}

/// One `field.Error`.
fn cause(reason: &str, field: &str, message: String) -> Cause {
    Cause {
        reason: reason.into(),
        message,
        field: field.into(),
    }
}

/// The accumulated `field.ErrorList` of one object.
#[derive(Default)]
struct Errors(Vec<Cause>);

impl Errors {
    fn invalid(&mut self, field: &str, value: &str, detail: &str) {
        self.0.push(cause(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {value}: {detail}"),
        ));
    }
    fn required(&mut self, field: &str, detail: &str) {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        self.0.push(cause("FieldValueRequired", field, message));
    }
    fn duplicate(&mut self, field: &str, value: &str) {
        self.0.push(cause(
            "FieldValueDuplicate",
            field,
            format!("Duplicate value: {value}"),
        ));
    }
    fn forbidden(&mut self, field: &str, detail: &str) {
        self.0.push(cause(
            "FieldValueForbidden",
            field,
            format!("Forbidden: {detail}"),
        ));
    }
    fn not_supported(&mut self, field: &str, value: &str, supported: &[&str]) {
        let supported: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        self.0.push(cause(
            "FieldValueNotSupported",
            field,
            format!(
                "Unsupported value: \"{value}\": supported values: {}",
                supported.join(", ")
            ),
        ));
    }
    fn too_long(&mut self, field: &str, max: usize) {
        self.0.push(cause(
            "FieldValueTooLong",
            field,
            format!("Too long: must have at most {max} bytes"),
        ));
    }
}

/// Validates a create (`old == None`) or update of a built-in object.
pub fn validate(info: &ResourceInfo, obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    if !info.builtin {
        return Ok(());
    }
    let mut errs = Errors::default();
    let name = get_in(obj, &["metadata", "name"])
        .and_then(Value::as_str)
        .unwrap_or_default();
    if old.is_none() {
        validate_name(info, name, &mut errs);
    }
    object_meta(obj.get("metadata"), "metadata", &mut errs);
    match (info.group.as_str(), info.kind.as_str()) {
        ("apps", "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet") => {
            workload(info, obj, old, &mut errs)
        }
        ("batch", "Job") => job(obj, old, &mut errs),
        ("batch", "CronJob") => cron_job(obj, name, &mut errs),
        ("", "Pod") => pod_spec(obj.get("spec"), "spec", &mut errs),
        ("", "Service") => service(obj, &mut errs),
        ("", "ConfigMap") => config_map(obj, old, &mut errs),
        ("", "Secret") => secret(obj, old, &mut errs),
        ("coordination.k8s.io", "Lease") => lease(obj, &mut errs),
        _ => {}
    }
    if errs.0.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(&info.kind, &info.group, name, errs.0))
}

// ---- names, labels and annotations (apimachinery/pkg/util/validation) ----

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const CONFIG_KEY_MSG: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";
const IANA_SVC_NAME_MSG: &str =
    "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)";

/// `IsDNS1123Label`.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `IsDNS1123Subdomain`.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_part(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// `IsQualifiedName`: the messages for a label or annotation key, empty when valid.
fn qualified_name_problems(key: &str) -> Vec<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let mut out = Vec::new();
    if let Some(p) = prefix {
        if p.is_empty() {
            out.push("prefix part must be non-empty".to_string());
        } else if !is_dns1123_subdomain(p) {
            out.push(format!("prefix part {DNS1123_SUBDOMAIN_MSG}"));
        }
        if name.contains('/') {
            out.push("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string());
            return out;
        }
    }
    if name.is_empty() {
        out.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        out.push("name part must be no more than 63 characters".to_string());
    }
    if !name.is_empty() && !is_qualified_part(name) {
        out.push(QUALIFIED_NAME_MSG.to_string());
    }
    out
}

fn label_value_problems(v: &str) -> Vec<String> {
    let mut out = Vec::new();
    if v.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    if !v.is_empty() && !is_qualified_part(v) {
        out.push(LABEL_VALUE_MSG.to_string());
    }
    out
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn validate_name(info: &ResourceInfo, name: &str, errs: &mut Errors) {
    if name.is_empty() {
        return;
    }
    let field = "metadata.name";
    let q = quote(name);
    if name == "." || name == ".." || name.contains('/') || name.contains('%') {
        let detail = if name == "." || name == ".." {
            format!("may not be '{name}'")
        } else {
            "may not contain '/'".to_string()
        };
        errs.invalid(field, &q, &detail);
        return;
    }
    match (info.group.as_str(), info.plural.as_str()) {
        ("rbac.authorization.k8s.io", _) => {}
        ("", "namespaces") if !is_dns1123_label(name) => errs.invalid(field, &q, DNS1123_LABEL_MSG),
        ("", "services") if !is_dns1035_label(name) => errs.invalid(field, &q, DNS1035_LABEL_MSG),
        ("", "namespaces" | "services") => {}
        _ if !is_dns1123_subdomain(name) => errs.invalid(field, &q, DNS1123_SUBDOMAIN_MSG),
        _ => {}
    }
}

/// kube-apiserver's limit on the total size of an object's annotations.
const TOTAL_ANNOTATION_SIZE: usize = 256 * 1024;

/// Labels and annotations of an object's or a template's metadata at `path`. Field paths are
/// built only for errors: this runs on every write.
fn object_meta(meta: Option<&Value>, path: &str, errs: &mut Errors) {
    let Some(meta) = meta else {
        return;
    };
    labels(meta.get("labels"), path, errs);
    let Some(annotations) = meta.get("annotations").and_then(Value::as_object) else {
        return;
    };
    let field = || format!("{path}.annotations");
    let mut total = 0;
    for (k, v) in annotations {
        // Annotation keys are checked lowercased (only the prefix cares).
        let key = if k.bytes().any(|b| b.is_ascii_uppercase()) {
            std::borrow::Cow::Owned(k.to_lowercase())
        } else {
            std::borrow::Cow::Borrowed(k.as_str())
        };
        for problem in qualified_name_problems(&key) {
            errs.invalid(&field(), &quote(k), &problem);
        }
        total += k.len() + v.as_str().map_or(0, str::len);
    }
    if total > TOTAL_ANNOTATION_SIZE {
        errs.too_long(&field(), TOTAL_ANNOTATION_SIZE);
    }
}

fn labels(labels: Option<&Value>, path: &str, errs: &mut Errors) {
    let Some(labels) = labels.and_then(Value::as_object) else {
        return;
    };
    let field = || format!("{path}.labels");
    for (k, v) in labels {
        for problem in qualified_name_problems(k) {
            errs.invalid(&field(), &quote(k), &problem);
        }
        let v = v.as_str().unwrap_or_default();
        for problem in label_value_problems(v) {
            errs.invalid(&field(), &quote(v), &problem);
        }
    }
}

// ---- workloads (pkg/apis/apps/validation, pkg/apis/batch/validation) ----

/// Go's `%#v` of a `map[string]string`, as field errors print label maps.
fn go_string_map(m: Option<&Map<String, Value>>) -> String {
    let Some(m) = m else {
        return "map[string]string(nil)".into();
    };
    let mut pairs: Vec<(&String, &str)> = m
        .iter()
        .map(|(k, v)| (k, v.as_str().unwrap_or_default()))
        .collect();
    pairs.sort();
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}:{}", quote(k), quote(v)))
        .collect();
    format!("map[string]string{{{}}}", body.join(", "))
}

/// Go's `%#v` of a `*metav1.LabelSelector`.
fn go_label_selector(s: &Value) -> String {
    let expressions = match s.get("matchExpressions").and_then(Value::as_array) {
        None => "[]v1.LabelSelectorRequirement(nil)".to_string(),
        Some(exprs) => {
            let items: Vec<String> = exprs
                .iter()
                .map(|e| {
                    let values = match e.get("values").and_then(Value::as_array) {
                        None => "[]string(nil)".to_string(),
                        Some(vs) => format!(
                            "[]string{{{}}}",
                            vs.iter()
                                .map(|v| quote(v.as_str().unwrap_or_default()))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    };
                    format!(
                        "v1.LabelSelectorRequirement{{Key:{}, Operator:{}, Values:{values}}}",
                        quote(e.get("key").and_then(Value::as_str).unwrap_or_default()),
                        quote(
                            e.get("operator")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                        ),
                    )
                })
                .collect();
            format!("[]v1.LabelSelectorRequirement{{{}}}", items.join(", "))
        }
    };
    format!(
        "v1.LabelSelector{{MatchLabels:{}, MatchExpressions:{expressions}}}",
        go_string_map(s.get("matchLabels").and_then(Value::as_object))
    )
}

fn is_empty_selector(s: &Value) -> bool {
    let empty = |k: &str| match s.get(k) {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    };
    empty("matchLabels") && empty("matchExpressions")
}

/// A count at a dotted field path (`spec.replicas`) that must not be negative.
fn non_negative(obj: &Value, field: &str, errs: &mut Errors) {
    let value = field.split('.').try_fold(obj, |cur, k| cur.get(k));
    if let Some(n) = value.and_then(Value::as_i64)
        && n < 0
    {
        errs.invalid(field, &n.to_string(), "must be greater than or equal to 0");
    }
}

/// Selector required, non-empty and matching the template's labels (`ValidateDeploymentSpec`
/// and its siblings).
fn selector_matches_template(obj: &Value, kind: &str, errs: &mut Errors) {
    let Some(selector) = get_in(obj, &["spec", "selector"]).filter(|s| !s.is_null()) else {
        errs.required("spec.selector", "");
        return;
    };
    if is_empty_selector(selector) {
        errs.invalid(
            "spec.selector",
            &go_label_selector(selector),
            &format!("empty selector is invalid for {kind}"),
        );
        return;
    }
    let template_labels =
        get_in(obj, &["spec", "template", "metadata", "labels"]).and_then(Value::as_object);
    if selects_by_labels_only(selector, template_labels) {
        return;
    }
    match LabelSelector::from_label_selector_json(selector) {
        Ok(s) if s.matches(template_labels) => {}
        Ok(_) => errs.invalid(
            "spec.template.metadata.labels",
            &go_string_map(template_labels),
            "`selector` does not match template `labels`",
        ),
        Err(e) => errs.invalid(
            "spec.selector",
            &go_label_selector(selector),
            &e.to_string(),
        ),
    }
}

/// The common case, decided without building a selector: only `matchLabels`, all present in
/// the template's labels with the same values.
fn selects_by_labels_only(selector: &Value, labels: Option<&Map<String, Value>>) -> bool {
    if selector
        .get("matchExpressions")
        .is_some_and(|e| !e.is_null() && e.as_array().is_none_or(|a| !a.is_empty()))
    {
        return false;
    }
    let (Some(wanted), Some(labels)) = (
        selector.get("matchLabels").and_then(Value::as_object),
        labels,
    ) else {
        return false;
    };
    wanted
        .iter()
        .all(|(k, v)| v.is_string() && labels.get(k) == Some(v))
}

fn workload(info: &ResourceInfo, obj: &Value, old: Option<&Value>, errs: &mut Errors) {
    let kind = info.kind.to_lowercase();
    non_negative(obj, "spec.replicas", errs);
    non_negative(obj, "spec.minReadySeconds", errs);
    non_negative(obj, "spec.revisionHistoryLimit", errs);
    selector_matches_template(obj, &kind, errs);
    pod_template(obj, &["Always"], errs);
    let Some(old) = old else {
        return;
    };
    let old_selector = get_in(old, &["spec", "selector"]);
    if get_in(obj, &["spec", "selector"]) != old_selector {
        let shown = get_in(obj, &["spec", "selector"])
            .map(go_label_selector)
            .unwrap_or_else(|| "(*v1.LabelSelector)(nil)".into());
        errs.invalid("spec.selector", &shown, "field is immutable");
    }
    if info.kind == "StatefulSet" {
        statefulset_update(obj, old, errs);
    }
}

/// Only these StatefulSet spec fields may change (`ValidateStatefulSetUpdate`).
fn statefulset_update(obj: &Value, old: &Value, errs: &mut Errors) {
    const MUTABLE: &[&str] = &[
        "replicas",
        "ordinals",
        "template",
        "updateStrategy",
        "persistentVolumeClaimRetentionPolicy",
        "minReadySeconds",
        "revisionHistoryLimit",
        "selector",
    ];
    let strip = |v: Option<&Value>| -> Map<String, Value> {
        let mut m = v.and_then(Value::as_object).cloned().unwrap_or_default();
        m.retain(|k, _| !MUTABLE.contains(&k.as_str()));
        m
    };
    if strip(obj.get("spec")) != strip(old.get("spec")) {
        errs.forbidden(
            "spec",
            "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
        );
    }
}

fn pod_template(obj: &Value, restart_policies: &[&str], errs: &mut Errors) {
    let Some(template) = get_in(obj, &["spec", "template"]) else {
        errs.required("spec.template", "");
        return;
    };
    object_meta(template.get("metadata"), "spec.template.metadata", errs);
    pod_spec(template.get("spec"), "spec.template.spec", errs);
    let policy = get_in(template, &["spec", "restartPolicy"]).and_then(Value::as_str);
    match policy {
        Some(p) if !restart_policies.contains(&p) => {
            errs.not_supported("spec.template.spec.restartPolicy", p, restart_policies)
        }
        // Batch kinds have no default restart policy; apps default it to Always.
        None if !restart_policies.contains(&"Always") => {
            let valid: Vec<String> = restart_policies.iter().map(|p| quote(p)).collect();
            errs.required(
                "spec.template.spec.restartPolicy",
                &format!("valid values: {}", valid.join(", ")),
            )
        }
        _ => {}
    }
}

/// The label the server puts on a Job's selector and pods (`batch.kubernetes.io/controller-uid`).
pub(crate) const JOB_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";

fn job(obj: &Value, old: Option<&Value>, errs: &mut Errors) {
    for f in [
        "parallelism",
        "completions",
        "backoffLimit",
        "activeDeadlineSeconds",
    ] {
        non_negative(obj, &format!("spec.{f}"), errs);
    }
    let manual = get_in(obj, &["spec", "manualSelector"])
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if manual || get_in(obj, &["spec", "selector"]).is_some() {
        selector_matches_template(obj, "job", errs);
    }
    pod_template(obj, &["OnFailure", "Never"], errs);
    if let Some(old) = old {
        for (pointer, field) in [
            ("/spec/selector", "spec.selector"),
            ("/spec/completions", "spec.completions"),
        ] {
            if obj.pointer(pointer) != old.pointer(pointer) {
                let shown = obj
                    .pointer(pointer)
                    .map(|v| match v {
                        Value::Object(_) => go_label_selector(v),
                        other => other.to_string(),
                    })
                    .unwrap_or_else(|| "null".into());
                errs.invalid(field, &shown, "field is immutable");
            }
        }
        if get_in(obj, &["spec", "template", "spec"]) != get_in(old, &["spec", "template", "spec"])
        {
            errs.invalid(
                "spec.template",
                "core.PodTemplateSpec{...}",
                "field is immutable",
            );
        }
    }
}

/// Fills in what kube-apiserver generates for a Job without `manualSelector`: a selector on
/// the Job's uid and the matching pod template labels.
pub(crate) fn default_job(obj: &mut Value) {
    let manual = get_in(obj, &["spec", "manualSelector"])
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if manual || get_in(obj, &["spec", "selector"]).is_some() {
        return;
    }
    let uid = get_in(obj, &["metadata", "uid"])
        .cloned()
        .unwrap_or(Value::Null);
    let name = get_in(obj, &["metadata", "name"])
        .cloned()
        .unwrap_or(Value::Null);
    crate::meta::set_path(
        obj,
        "spec.selector",
        serde_json::json!({"matchLabels": {JOB_UID_LABEL: uid}}),
    );
    // Label keys contain dots, so the map is reached key by key rather than by dotted path.
    if let Some(labels) = object_at(obj, &["spec", "template", "metadata", "labels"]) {
        for (k, v) in [
            (JOB_UID_LABEL, &uid),
            ("controller-uid", &uid),
            ("batch.kubernetes.io/job-name", &name),
            ("job-name", &name),
        ] {
            labels.insert(k.to_string(), v.clone());
        }
    }
}

/// The object at a path of keys, made (as `{}`) where missing; `None` if a non-object is in the
/// way.
fn object_at<'a>(obj: &'a mut Value, keys: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut cur = obj;
    for k in keys {
        cur = cur
            .as_object_mut()?
            .entry(k.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    cur.as_object_mut()
}

fn cron_job(obj: &Value, name: &str, errs: &mut Errors) {
    if name.len() > 52 {
        errs.invalid(
            "metadata.name",
            &quote(name),
            "must be no more than 52 characters",
        );
    }
    match get_in(obj, &["spec", "schedule"]).and_then(Value::as_str) {
        None | Some("") => errs.required("spec.schedule", ""),
        Some(s) if s.split_whitespace().count() != 5 && !s.starts_with('@') => errs.invalid(
            "spec.schedule",
            &quote(s),
            &format!(
                "expected exactly 5 fields, found {}: {s}",
                s.split_whitespace().count()
            ),
        ),
        Some(_) => {}
    }
    if let Some(template) = get_in(obj, &["spec", "jobTemplate"]) {
        let wrapped =
            serde_json::json!({"spec": template.get("spec").cloned().unwrap_or_default()});
        let mut inner = Errors::default();
        pod_template(&wrapped, &["OnFailure", "Never"], &mut inner);
        for mut c in inner.0 {
            c.field = c.field.replacen("spec.", "spec.jobTemplate.spec.", 1);
            errs.0.push(c);
        }
    }
}

// ---- pods (pkg/apis/core/validation) ----

/// A port number in 1–65535 (or 0 where that means unset); `field` is built only on error.
fn port_in_range(v: &Value, field: impl Fn() -> String, errs: &mut Errors, allow_zero: bool) {
    let Some(n) = v.as_i64() else {
        return;
    };
    if (allow_zero && n == 0) || (1..=65535).contains(&n) {
        return;
    }
    errs.invalid(
        &field(),
        &n.to_string(),
        "must be between 1 and 65535, inclusive",
    );
}

/// `IsValidPortName` (an IANA service name).
fn port_name_problems(name: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    if name.len() > 15 {
        out.push("must be no more than 15 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        out.push(IANA_SVC_NAME_MSG);
    }
    if name.contains("--") {
        out.push("must not contain consecutive hyphens");
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        out.push("must contain at least one letter (a-z)");
    }
    if name.starts_with('-') || name.ends_with('-') {
        out.push("must not begin or end with a hyphen");
    }
    out
}

const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];

fn container_ports(c: &Value, path: &dyn Fn() -> String, errs: &mut Errors) {
    let Some(ports) = c.get("ports").and_then(Value::as_array) else {
        return;
    };
    for (i, p) in ports.iter().enumerate() {
        let at = |f: &str| format!("{}.ports[{i}].{f}", path());
        match p.get("containerPort") {
            None => errs.required(&at("containerPort"), ""),
            Some(v) => port_in_range(v, || at("containerPort"), errs, false),
        }
        if let Some(v) = p.get("hostPort") {
            port_in_range(v, || at("hostPort"), errs, true);
        }
        if let Some(name) = p.get("name").and_then(Value::as_str) {
            for problem in port_name_problems(name) {
                errs.invalid(&at("name"), &quote(name), problem);
            }
        }
        if let Some(proto) = p.get("protocol").and_then(Value::as_str)
            && !PROTOCOLS.contains(&proto)
        {
            errs.not_supported(&at("protocol"), proto, PROTOCOLS);
        }
    }
}

/// Containers of a pod spec at `path`. Paths are built only for errors: this runs for every
/// workload write.
fn pod_spec(spec: Option<&Value>, path: &str, errs: &mut Errors) {
    let Some(spec) = spec else {
        return;
    };
    let containers = spec.get("containers").and_then(Value::as_array);
    if containers.is_none_or(Vec::is_empty) {
        errs.required(&format!("{path}.containers"), "");
    }
    // Init containers and containers share one name space.
    let mut seen: Vec<&str> = Vec::new();
    for list in ["initContainers", "containers"] {
        let Some(items) = spec.get(list).and_then(Value::as_array) else {
            continue;
        };
        for (i, c) in items.iter().enumerate() {
            let at = || format!("{path}.{list}[{i}]");
            match c.get("name").and_then(Value::as_str) {
                None | Some("") => errs.required(&format!("{}.name", at()), ""),
                Some(name) => {
                    if !is_dns1123_label(name) {
                        errs.invalid(&format!("{}.name", at()), &quote(name), DNS1123_LABEL_MSG);
                    }
                    if seen.contains(&name) {
                        errs.duplicate(&format!("{}.name", at()), &quote(name));
                    }
                    seen.push(name);
                }
            }
            if c.get("image")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                errs.required(&format!("{}.image", at()), "");
            }
            container_ports(c, &at, errs);
        }
    }
}

// ---- services ----

const SERVICE_TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];

fn service(obj: &Value, errs: &mut Errors) {
    let ty = get_in(obj, &["spec", "type"])
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if !SERVICE_TYPES.contains(&ty) {
        errs.not_supported("spec.type", ty, SERVICE_TYPES);
        return;
    }
    let ports = get_in(obj, &["spec", "ports"]).and_then(Value::as_array);
    if ty == "ExternalName" {
        if get_in(obj, &["spec", "externalName"])
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            errs.required("spec.externalName", "");
        }
        return;
    }
    let headless = get_in(obj, &["spec", "clusterIP"]).and_then(Value::as_str) == Some("None");
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        if !headless {
            errs.required("spec.ports", "");
        }
        return;
    };
    let mut names = std::collections::HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let at = format!("spec.ports[{i}]");
        match p
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            None if ports.len() > 1 => errs.required(&format!("{at}.name"), ""),
            None => {}
            Some(n) => {
                if !is_dns1123_label(n) {
                    errs.invalid(&format!("{at}.name"), &quote(n), DNS1123_LABEL_MSG);
                }
                if !names.insert(n.to_string()) {
                    errs.duplicate(&format!("{at}.name"), &quote(n));
                }
            }
        }
        match p.get("port") {
            None => errs.required(&format!("{at}.port"), ""),
            Some(v) => port_in_range(v, || format!("{at}.port"), errs, false),
        }
        match p.get("targetPort") {
            Some(v @ Value::Number(_)) => {
                port_in_range(v, || format!("{at}.targetPort"), errs, true)
            }
            Some(Value::String(name)) => {
                for problem in port_name_problems(name) {
                    errs.invalid(&format!("{at}.targetPort"), &quote(name), problem);
                }
            }
            _ => {}
        }
        if let Some(v) = p.get("nodePort") {
            port_in_range(v, || format!("{at}.nodePort"), errs, true);
        }
        if let Some(proto) = p.get("protocol").and_then(Value::as_str)
            && !PROTOCOLS.contains(&proto)
        {
            errs.not_supported(&format!("{at}.protocol"), proto, PROTOCOLS);
        }
    }
}

// ---- config maps and secrets ----

/// kube-apiserver's cap on a ConfigMap's or Secret's data.
const MAX_DATA_SIZE: usize = 1024 * 1024;

fn config_key_problems(key: &str) -> Vec<String> {
    let mut out = Vec::new();
    if key.len() > 253 {
        out.push("must be no more than 253 characters".to_string());
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        || key.is_empty()
    {
        out.push(CONFIG_KEY_MSG.to_string());
    }
    if key == "." {
        out.push("must not be '.'".to_string());
    } else if key == ".." {
        out.push("must not be '..'".to_string());
    } else if key.starts_with("..") {
        out.push("must not start with '..'".to_string());
    }
    out
}

/// Checks the keys of `data`/`binaryData` (or `stringData`) and returns the data size.
fn data_keys(obj: &Value, fields: &[&str], errs: &mut Errors) -> usize {
    let mut size = 0;
    for (i, field) in fields.iter().enumerate() {
        let Some(m) = obj.get(*field).and_then(Value::as_object) else {
            continue;
        };
        for (k, v) in m {
            // The path is built only for a bad key: this runs for every ConfigMap write.
            let at = || format!("{field}[{k}]");
            for problem in config_key_problems(k) {
                errs.invalid(&at(), &quote(k), &problem);
            }
            let earlier = fields[..i]
                .iter()
                .find(|f| obj.get(**f).and_then(|m| m.get(k)).is_some());
            if let Some(other) = earlier {
                errs.invalid(
                    &at(),
                    &quote(k),
                    &format!("duplicate of key present in {other}"),
                );
            }
            size += v.as_str().map_or(0, str::len);
        }
    }
    size
}

/// A write that changes data of an object made `immutable: true`.
fn immutable_data(obj: &Value, old: Option<&Value>, fields: &[&str], errs: &mut Errors) {
    let Some(old) = old else {
        return;
    };
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return;
    }
    let detail = "field is immutable when `immutable` is set";
    for f in fields {
        if obj.get(*f) != old.get(*f) {
            errs.forbidden(f, detail);
        }
    }
    if obj.get("immutable").and_then(Value::as_bool) != Some(true) {
        errs.forbidden("immutable", detail);
    }
}

fn config_map(obj: &Value, old: Option<&Value>, errs: &mut Errors) {
    let size = data_keys(obj, &["data", "binaryData"], errs);
    if size > MAX_DATA_SIZE {
        errs.too_long("[]", MAX_DATA_SIZE);
    }
    immutable_data(obj, old, &["data", "binaryData"], errs);
}

fn secret(obj: &Value, old: Option<&Value>, errs: &mut Errors) {
    // Secret data is base64 in JSON; the limit is on the decoded bytes (3/4 of the text).
    let size = data_keys(obj, &["data"], errs) * 3 / 4;
    if size > MAX_DATA_SIZE {
        errs.too_long("data", MAX_DATA_SIZE);
    }
    let ty = obj.get("type").and_then(Value::as_str).unwrap_or("Opaque");
    let has = |k: &str| {
        obj.pointer(&format!(
            "/data/{}",
            k.replace('~', "~0").replace('/', "~1")
        ))
        .is_some()
    };
    let required: &[&str] = match ty {
        "kubernetes.io/tls" => &["tls.crt", "tls.key"],
        "kubernetes.io/dockerconfigjson" => &[".dockerconfigjson"],
        "kubernetes.io/dockercfg" => &[".dockercfg"],
        "kubernetes.io/basic-auth" | "kubernetes.io/ssh-auth" => &[],
        _ => &[],
    };
    for key in required {
        if !has(key) {
            errs.required(&format!("data[{key}]"), "");
        }
    }
    if ty == "kubernetes.io/ssh-auth" && !has("ssh-privatekey") {
        errs.required("data[ssh-privatekey]", "");
    }
    if let Some(old) = old {
        let old_ty = old.get("type").and_then(Value::as_str).unwrap_or("Opaque");
        if old_ty != ty {
            errs.invalid("type", &quote(ty), "field is immutable");
        }
    }
    immutable_data(obj, old, &["data"], errs);
}

// ---- leases (pkg/apis/coordination/validation) ----

fn lease(obj: &Value, errs: &mut Errors) {
    if let Some(n) = get_in(obj, &["spec", "leaseDurationSeconds"]).and_then(Value::as_i64)
        && n <= 0
    {
        errs.invalid(
            "spec.leaseDurationSeconds",
            &n.to_string(),
            "must be greater than 0",
        );
    }
    non_negative(obj, "spec.leaseTransitions", errs);
    let preferred = get_in(obj, &["spec", "preferredHolder"])
        .and_then(Value::as_str)
        .unwrap_or_default();
    let strategy = get_in(obj, &["spec", "strategy"])
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !preferred.is_empty() && strategy.is_empty() {
        errs.forbidden(
            "spec.preferredHolder",
            "preferredHolder is only allowed if strategy is set",
        );
    }
}

/// The name rules of custom resources (built-in kinds are checked per kind by [`validate`]):
/// path-segment safe, and a DNS-1123 subdomain (a label for `namespaces`) except in the RBAC group.
pub(crate) fn custom_resource_name(info: &ResourceInfo, name: &str) -> Result<(), ApiError> {
    let rbac = info.group == "rbac.authorization.k8s.io";
    let problem = if name == "." || name == ".." || name.contains('/') || name.contains('%') {
        Some("may not be '.' or '..' and may not contain '/' or '%'")
    } else if rbac {
        None
    } else if info.plural == "namespaces" {
        (!is_dns1123_label(name)).then_some("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
    } else {
        (!is_dns1123_subdomain(name)).then_some("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
    };
    match problem {
        None => Ok(()),
        Some(why) => Err(ApiError::invalid_field(
            &info.kind,
            &info.group,
            name,
            "metadata.name",
            "FieldValueInvalid",
            &format!("Invalid value: \"{name}\": {why}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::resources::Registry;
    use serde_json::json;

    fn info(group: &str, plural: &str) -> ResourceInfo {
        Registry::builtin()
            .get(group, "v1", plural)
            .cloned()
            .expect("built-in")
    }

    fn causes(group: &str, plural: &str, obj: Value, old: Option<Value>) -> Vec<(String, String)> {
        match validate(&info(group, plural), &obj, old.as_ref()) {
            Ok(()) => Vec::new(),
            Err(e) => {
                assert_eq!(e.code, 422);
                e.causes.into_iter().map(|c| (c.field, c.message)).collect()
            }
        }
    }

    fn deployment(selector: Value, labels: Value) -> Value {
        json!({"metadata": {"name": "web"}, "spec": {"selector": selector,
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "a", "image": "i"}]}}}})
    }

    #[test]
    fn deployment_selector_must_match_template() {
        let c = causes(
            "apps",
            "deployments",
            deployment(
                json!({"matchLabels": {"app": "web"}}),
                json!({"app": "api"}),
            ),
            None,
        );
        assert_eq!(
            c,
            vec![(
                "spec.template.metadata.labels".into(),
                "Invalid value: map[string]string{\"app\":\"api\"}: `selector` does not match template `labels`".into()
            )]
        );
        let ok = deployment(
            json!({"matchLabels": {"app": "web"}}),
            json!({"app": "web"}),
        );
        assert!(causes("apps", "deployments", ok, None).is_empty());
    }

    #[test]
    fn deployment_selector_is_immutable() {
        let old = deployment(
            json!({"matchLabels": {"app": "web"}}),
            json!({"app": "web", "v": "2"}),
        );
        let new = deployment(
            json!({"matchLabels": {"v": "2"}}),
            json!({"app": "web", "v": "2"}),
        );
        let c = causes("apps", "deployments", new, Some(old));
        assert_eq!(c[0].0, "spec.selector");
        assert!(c[0].1.ends_with("field is immutable"), "{}", c[0].1);
    }

    #[test]
    fn label_values_longer_than_63_are_invalid() {
        let v = "a".repeat(64);
        let c = causes(
            "",
            "configmaps",
            json!({"metadata": {"name": "c", "labels": {"k": v}}}),
            None,
        );
        assert_eq!(
            c,
            vec![(
                "metadata.labels".into(),
                format!("Invalid value: \"{v}\": must be no more than 63 characters")
            )]
        );
    }

    #[test]
    fn container_names_are_unique_and_ports_in_range() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "i", "ports": [{"containerPort": 70000}]},
            {"name": "a", "image": "i"}]}});
        let c = causes("", "pods", pod, None);
        assert_eq!(
            c,
            vec![
                (
                    "spec.containers[0].ports[0].containerPort".into(),
                    "Invalid value: 70000: must be between 1 and 65535, inclusive".into()
                ),
                (
                    "spec.containers[1].name".into(),
                    "Duplicate value: \"a\"".into()
                ),
            ]
        );
    }

    #[test]
    fn config_keys_and_lease_fields() {
        let c = causes(
            "",
            "configmaps",
            json!({"metadata": {"name": "c"}, "data": {"a b": "x"}}),
            None,
        );
        assert_eq!(c[0].0, "data[a b]");
        let c = causes(
            "coordination.k8s.io",
            "leases",
            json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 0}}),
            None,
        );
        assert_eq!(
            c,
            vec![(
                "spec.leaseDurationSeconds".into(),
                "Invalid value: 0: must be greater than 0".into()
            )]
        );
    }

    #[test]
    fn service_names_are_dns_1035_labels() {
        let svc = json!({"metadata": {"name": "1svc"}, "spec": {"ports": [{"port": 80}]}});
        let c = causes("", "services", svc, None);
        assert_eq!(c[0].0, "metadata.name");
    }
}
