//! Response shapes a client can ask for with `Accept`: plain objects, `meta.k8s.io/v1` Tables
//! (kubectl's server-side printing) and PartialObjectMetadata (metadata-only informers).

use crate::catalog::resources::ResourceInfo;
use crate::meta;
use serde_json::{Value, json};
use std::sync::Arc;

/// The representation negotiated from the `Accept` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Plain JSON objects.
    Json,
    /// `as=Table`, with rows carrying the object as asked by `includeObject`.
    Table(IncludeObject),
    /// `as=PartialObjectMetadata` / `as=PartialObjectMetadataList`.
    Metadata,
}

/// `includeObject` of a Table request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IncludeObject {
    /// No object in rows.
    None,
    /// PartialObjectMetadata in rows (the default).
    Metadata,
    /// The full object in rows.
    Object,
}

/// Pick the first representation of the Accept header that devcluster can produce.
pub(crate) fn negotiate(accept: Option<&str>, include_object: Option<&str>) -> Format {
    let include = match include_object {
        Some("None") => IncludeObject::None,
        Some("Object") => IncludeObject::Object,
        _ => IncludeObject::Metadata,
    };
    let Some(accept) = accept else {
        return Format::Json;
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default();
        if media != "application/json" && media != "*/*" && media != "application/*" {
            continue;
        }
        let mut as_ = None;
        let mut group = None;
        for p in parts {
            if let Some(v) = p.strip_prefix("as=") {
                as_ = Some(v);
            } else if let Some(v) = p.strip_prefix("g=") {
                group = Some(v);
            }
        }
        match (as_, group) {
            (None, _) => return Format::Json,
            (Some("Table"), Some("meta.k8s.io")) => return Format::Table(include),
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                return Format::Metadata;
            }
            _ => continue,
        }
    }
    Format::Json
}

/// The object as the requested version presents it (CRD versions share storage; no conversion
/// beyond the apiVersion, as with the `None` conversion strategy).
pub(crate) fn versioned(info: &ResourceInfo, obj: &Arc<Value>) -> Arc<Value> {
    let want = info.api_version();
    if obj.get("apiVersion").and_then(Value::as_str) == Some(want.as_str()) {
        return obj.clone();
    }
    let mut o = (**obj).clone();
    o["apiVersion"] = json!(want);
    Arc::new(o)
}

/// PartialObjectMetadata for one object.
pub(crate) fn partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

/// One object in the negotiated representation.
pub(crate) fn object(info: &ResourceInfo, format: Format, obj: &Arc<Value>) -> Value {
    match format {
        Format::Json => (*versioned(info, obj)).clone(),
        Format::Metadata => partial(obj),
        Format::Table(inc) => table(
            info,
            inc,
            std::slice::from_ref(obj),
            meta::resource_version(obj),
            None,
        ),
    }
}

/// A list in the negotiated representation.
pub(crate) fn list(
    info: &ResourceInfo,
    format: Format,
    items: &[Arc<Value>],
    rv: u64,
    cont: Option<&str>,
    remaining: Option<usize>,
) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        metadata["continue"] = json!(c);
    }
    if let Some(r) = remaining {
        metadata["remainingItemCount"] = json!(r);
    }
    match format {
        Format::Json => json!({
            "kind": format!("{}List", info.kind),
            "apiVersion": info.api_version(),
            "metadata": metadata,
            "items": items.iter().map(|o| (*versioned(info, o)).clone()).collect::<Vec<_>>(),
        }),
        Format::Metadata => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": metadata,
            "items": items.iter().map(|o| partial(o)).collect::<Vec<_>>(),
        }),
        Format::Table(inc) => {
            let mut t = table(info, inc, items, &rv.to_string(), cont);
            if let Some(r) = remaining {
                t["metadata"]["remainingItemCount"] = json!(r);
            }
            t
        }
    }
}

/// A `meta.k8s.io/v1` Table: Name, the CRD's printer columns, Age.
pub(crate) fn table(
    info: &ResourceInfo,
    include: IncludeObject,
    items: &[Arc<Value>],
    rv: &str,
    cont: Option<&str>,
) -> Value {
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    let mut extra: Vec<(String, String)> = Vec::new();
    for c in &info.printer_columns {
        let name = c
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let path = c
            .get("jsonPath")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let ty = c
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("string")
            .to_string();
        let priority = c.get("priority").and_then(Value::as_i64).unwrap_or(0);
        columns.push(json!({"name": name, "type": ty, "format": c.get("format").cloned().unwrap_or(json!("")), "description": c.get("description").cloned().unwrap_or(json!("")), "priority": priority}));
        extra.push((path, ty));
    }
    let has_age = extra
        .iter()
        .any(|(p, _)| p == ".metadata.creationTimestamp");
    if !has_age {
        columns.push(json!({"name": "Age", "type": "date", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
    }
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut cells = vec![json!(meta::name(o))];
            for (path, ty) in &extra {
                let v = column_value(o, path);
                cells.push(if ty == "date" {
                    json!(age(v.as_str()))
                } else {
                    v
                });
            }
            if !has_age {
                cells.push(json!(age(o
                    .pointer("/metadata/creationTimestamp")
                    .and_then(Value::as_str))));
            }
            let mut row = json!({"cells": cells});
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => row["object"] = partial(o),
                IncludeObject::Object => row["object"] = (*versioned(info, o)).clone(),
            }
            row
        })
        .collect();
    let mut metadata = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        metadata["continue"] = json!(c);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": columns, "rows": rows})
}

/// A printer column's cell: the first value its JSONPath selects, as kube-apiserver shows it
/// (`.status.conditions[?(@.type=="Available")].status` filters, not only dotted fields), or
/// null when nothing matches.
fn column_value(o: &Value, path: &str) -> Value {
    use jsonpath_rust::JsonPath as _;
    // Printer columns are written without the root: ".spec.size" is "$.spec.size".
    match o.query(&format!("${path}")) {
        Ok(found) => found.first().map_or(Value::Null, |v| (*v).clone()),
        Err(_) => meta::get_path(o, path.trim_start_matches('.'))
            .cloned()
            .unwrap_or(Value::Null),
    }
}

/// kubectl's short human duration ("5s", "3m", "2h", "4d") since an RFC 3339 time.
fn age(ts: Option<&str>) -> String {
    let Some(ts) = ts else {
        return "<unknown>".into();
    };
    let Ok(then) = ts.parse::<jiff::Timestamp>() else {
        return "<invalid>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - then.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 3 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_prefers_the_first_supported_range() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            negotiate(Some(kubectl), None),
            Format::Table(IncludeObject::Metadata)
        );
        let kube_meta = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        assert_eq!(negotiate(Some(kube_meta), None), Format::Metadata);
        assert_eq!(
            negotiate(
                Some("application/vnd.kubernetes.protobuf,application/json"),
                None
            ),
            Format::Json
        );
        assert_eq!(negotiate(None, None), Format::Json);
    }

    #[test]
    fn printer_columns_follow_jsonpath_filters_and_fields() {
        let o = json!({"spec": {"size": 3}, "status": {"conditions": [
            {"type": "Progressing", "status": "False"},
            {"type": "Available", "status": "True"},
        ]}});
        assert_eq!(column_value(&o, ".spec.size"), json!(3));
        assert_eq!(
            column_value(&o, r#".status.conditions[?(@.type=="Available")].status"#),
            json!("True")
        );
        assert_eq!(
            column_value(&o, r#".status.conditions[?(@.type=="Ready")].status"#),
            Value::Null
        );
        assert_eq!(column_value(&o, ".status.missing"), Value::Null);
    }
}
