//! Decoding `application/vnd.kubernetes.protobuf` request bodies into the JSON the JSON path
//! stores. client-go's typed clients (every `kubectl create` subcommand, `run`, `expose`,
//! `create token`, `auth can-i`) send protobuf and have no JSON fallback for request bodies.
//!
//! A body is the Kubernetes envelope: the magic `k8s\0`, then a `runtime.Unknown` whose
//! `typeMeta` names the kind and whose `raw` holds the message. Messages are decoded by
//! reflection over descriptors compiled from the upstream `generated.proto` files (the files
//! k8s-pb generates its types from, vendored under `proto/`), so every built-in kind decodes
//! without a hand-written converter per type. The few types whose JSON form differs from their
//! message (Time, Quantity, IntOrString, RawExtension, ...) are converted by name.

use prost_reflect::{
    DescriptorPool, DynamicMessage, MapKey, MessageDescriptor, ReflectMessage, Value as PValue,
};
use serde_json::{Map, Value, json};
use std::sync::LazyLock;

/// Why a protobuf body could not be decoded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtobufError {
    /// Not the `k8s\0` envelope, or truncated/invalid wire data.
    #[error("malformed protobuf body")]
    Malformed,
    /// A kind devcluster has no protobuf descriptor for.
    #[error("devcluster cannot decode protobuf bodies of {0}; send JSON")]
    Unsupported(String),
}

const MAGIC: &[u8] = b"k8s\0";

static POOL: LazyLock<Option<DescriptorPool>> = LazyLock::new(|| {
    // Compiled by build.rs from proto/; a failure here is a build defect, reported per request.
    DescriptorPool::decode(
        include_bytes!(concat!(env!("OUT_DIR"), "/k8s_descriptors.bin")).as_slice(),
    )
    .ok()
});

fn message(name: &str) -> Option<MessageDescriptor> {
    POOL.as_ref()?.get_message_by_name(name)
}

/// Whether a body is protobuf-encoded, by its content type.
pub(crate) fn is_protobuf(content_type: &str) -> bool {
    content_type.contains("protobuf")
}

/// The proto package of an API group's v1 types (the vendored protos are rewritten to
/// `api.<dir>.v1` packages, as k8s-pb's modules are).
fn package(api_version: &str) -> Option<String> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let dir = match group {
        "" => "core",
        "rbac.authorization.k8s.io" => "rbac",
        "meta.k8s.io" => return Some(format!("apimachinery.pkg.apis.meta.{version}")),
        g => g.split('.').next()?,
    };
    Some(format!("api.{dir}.{version}"))
}

/// The descriptor of an `apiVersion`/`kind` pair. Options kinds (DeleteOptions, ...) live in
/// meta/v1 whatever group the envelope names.
fn descriptor_of(api_version: &str, kind: &str) -> Option<MessageDescriptor> {
    package(api_version)
        .and_then(|p| message(&format!("{p}.{kind}")))
        .or_else(|| message(&format!("apimachinery.pkg.apis.meta.v1.{kind}")))
}

/// Decode an enveloped message of any built-in kind into its JSON form, with `apiVersion` and
/// `kind` from the envelope.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let inner = body.strip_prefix(MAGIC).ok_or(ProtobufError::Malformed)?;
    let envelope = message("apimachinery.pkg.runtime.Unknown").ok_or(ProtobufError::Malformed)?;
    let unknown = DynamicMessage::decode(envelope, inner).map_err(|_| ProtobufError::Malformed)?;
    let field_str = |m: &DynamicMessage, name: &str| {
        m.get_field_by_name(name)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let type_meta = unknown
        .get_field_by_name("typeMeta")
        .and_then(|v| v.as_message().cloned())
        .ok_or(ProtobufError::Malformed)?;
    let api_version = field_str(&type_meta, "apiVersion");
    let kind = field_str(&type_meta, "kind");
    let raw = unknown
        .get_field_by_name("raw")
        .and_then(|v| v.as_bytes().cloned())
        .unwrap_or_default();
    let desc = descriptor_of(&api_version, &kind)
        .ok_or_else(|| ProtobufError::Unsupported(format!("{api_version}, Kind={kind}")))?;
    let msg = DynamicMessage::decode(desc, raw).map_err(|_| ProtobufError::Malformed)?;
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!(kind));
    if let Value::Object(fields) = message_json(&msg) {
        out.extend(fields);
    }
    Ok(Value::Object(out))
}

/// Integer fields that are pointers in Go, where an explicit 0 means something (`replicas: 0`
/// is not "unset"). Every other zero scalar is taken as Go's omitted zero value: the wire
/// format carries non-pointer fields even when empty, and their JSON omits them.
const MEANINGFUL_ZERO: &[&str] = &[
    "replicas",
    "parallelism",
    "completions",
    "backoffLimit",
    "activeDeadlineSeconds",
    "ttlSecondsAfterFinished",
    "terminationGracePeriodSeconds",
    "startingDeadlineSeconds",
    "successfulJobsHistoryLimit",
    "failedJobsHistoryLimit",
    "revisionHistoryLimit",
    "value",
    "leaseTransitions",
];

/// Bool fields that are pointers in Go, where an explicit `false` is kept.
const MEANINGFUL_FALSE: &[&str] = &["immutable", "automountServiceAccountToken", "suspend"];

fn message_json(m: &DynamicMessage) -> Value {
    if let Some(special) = special_json(m) {
        return special;
    }
    let mut out = Map::new();
    let definition = crate::catalog::openapi::CATALOG
        .definitions
        .get(&format!("io.k8s.{}", m.descriptor().full_name()));
    for (field, value) in m.fields() {
        // go-to-protobuf names each proto field after its JSON name, except embedded structs
        // (`json:",inline"`), whose fields belong to the parent in JSON.
        let inline = matches!(value, PValue::Message(_)) && is_inline(definition, field.name());
        match value_json(field.name(), value) {
            Some(Value::Object(fields)) if inline => out.extend(fields),
            Some(v) => {
                out.insert(field.name().to_string(), v);
            }
            None => {}
        }
    }
    Value::Object(out)
}

/// Embedded Go structs kubectl's kinds use, for messages whose OpenAPI definition is unknown.
const INLINE_FIELDS: &[&str] = &[
    "localObjectReference",
    "ingressRuleValue",
    "volumeSource",
    "persistentVolumeSource",
    "ephemeralContainerCommon",
];

/// Whether a message field is an embedded struct: the kind's OpenAPI definition has no
/// property of that name.
fn is_inline(definition: Option<&Value>, field: &str) -> bool {
    match definition.and_then(|d| d.get("properties")) {
        Some(props) => props.get(field).is_none(),
        None => INLINE_FIELDS.contains(&field),
    }
}

/// Converts one field value; `None` drops it as Go's `omitempty` would.
fn value_json(name: &str, v: &PValue) -> Option<Value> {
    match v {
        PValue::Bool(false) if !MEANINGFUL_FALSE.contains(&name) => None,
        PValue::Bool(b) => Some(json!(b)),
        PValue::I32(0) | PValue::U32(0) | PValue::I64(0) | PValue::U64(0)
            if !MEANINGFUL_ZERO.contains(&name) =>
        {
            None
        }
        PValue::I32(n) => Some(json!(n)),
        PValue::I64(n) => Some(json!(n)),
        PValue::U32(n) => Some(json!(n)),
        PValue::U64(n) => Some(json!(n)),
        PValue::F32(f) => Some(json!(f)),
        PValue::F64(f) => Some(json!(f)),
        PValue::EnumNumber(n) => Some(json!(n)),
        PValue::String(s) if s.is_empty() => None,
        PValue::String(s) => Some(json!(s)),
        PValue::Bytes(b) => Some(json!(base64_encode(b))),
        PValue::Message(m) => match message_json(m) {
            Value::Object(o) if o.is_empty() && !keeps_empty(m) => None,
            Value::Null => None,
            other => Some(other),
        },
        PValue::List(items) if items.is_empty() => None,
        PValue::List(items) => Some(Value::Array(
            items.iter().map(|i| item_json(name, i)).collect::<Vec<_>>(),
        )),
        PValue::Map(map) if map.is_empty() => None,
        PValue::Map(map) => {
            let mut entries: Vec<(String, Value)> = map
                .iter()
                .map(|(k, v)| (map_key(k), item_json(name, v)))
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Some(Value::Object(entries.into_iter().collect()))
        }
    }
}

/// List items and map values keep their zero values (an empty string in a list is data).
fn item_json(name: &str, v: &PValue) -> Value {
    match v {
        PValue::Bool(b) => json!(b),
        PValue::I32(n) => json!(n),
        PValue::I64(n) => json!(n),
        PValue::String(s) => json!(s),
        PValue::Message(m) => message_json(m),
        other => value_json(name, other).unwrap_or(Value::Null),
    }
}

/// Empty structs that still mean something when present (`emptyDir: {}` picks the volume
/// source, `rollingUpdate: {}` the strategy).
fn keeps_empty(m: &DynamicMessage) -> bool {
    !m.descriptor().full_name().starts_with("apimachinery.")
}

fn map_key(k: &MapKey) -> String {
    match k {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Messages whose JSON is not an object of their fields.
fn special_json(m: &DynamicMessage) -> Option<Value> {
    let int = |name: &str| {
        m.get_field_by_name(name)
            .and_then(|v| v.as_i64().or_else(|| v.as_i32().map(i64::from)))
            .unwrap_or(0)
    };
    let string = |name: &str| {
        m.get_field_by_name(name)
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let raw_json = |name: &str| {
        m.get_field_by_name(name)
            .and_then(|v| v.as_bytes().cloned())
            .filter(|b| !b.is_empty())
            .map(|b| serde_json::from_slice::<Value>(&b).unwrap_or(Value::Null))
            .unwrap_or(Value::Null)
    };
    Some(match m.descriptor().full_name() {
        "apimachinery.pkg.apis.meta.v1.Time" => time(int("seconds"), 0, "%Y-%m-%dT%H:%M:%SZ"),
        "apimachinery.pkg.apis.meta.v1.MicroTime" => {
            time(int("seconds"), int("nanos"), "%Y-%m-%dT%H:%M:%S%.6fZ")
        }
        "apimachinery.pkg.apis.meta.v1.Duration" => json!(go_duration(int("duration"))),
        "apimachinery.pkg.api.resource.Quantity" => json!(string("string")),
        "apimachinery.pkg.util.intstr.IntOrString" => match int("type") {
            1 => json!(string("strVal")),
            _ => json!(int("intVal")),
        },
        "apimachinery.pkg.runtime.RawExtension" => raw_json("raw"),
        "apimachinery.pkg.apis.meta.v1.FieldsV1" => raw_json("Raw"),
        "apimachinery.pkg.apis.meta.v1.Verbs" => strings(m, "items"),
        name if name.ends_with(".ExtraValue") => strings(m, "items"),
        _ => return None,
    })
}

fn strings(m: &DynamicMessage, name: &str) -> Value {
    match m.get_field_by_name(name).as_deref() {
        Some(PValue::List(items)) => items
            .iter()
            .map(|i| json!(i.as_str().unwrap_or_default()))
            .collect(),
        _ => json!([]),
    }
}

/// A metav1.Time or MicroTime; the zero time is Go's `null`.
fn time(seconds: i64, nanos: i64, format: &str) -> Value {
    if seconds == 0 && nanos == 0 {
        return Value::Null;
    }
    let nanos = i32::try_from(nanos).unwrap_or(0);
    match jiff::Timestamp::new(seconds, nanos) {
        Ok(t) => json!(t.strftime(format).to_string()),
        Err(_) => Value::Null,
    }
}

/// Go's `time.Duration.String()` for whole seconds and above (`1h0m0s`, `90s` is `1m30s`).
fn go_duration(nanos: i64) -> String {
    let secs = nanos / 1_000_000_000;
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    // Captured from `kubectl create token ctl -n team-a --audience aud1 --audience aud2
    // --duration 15m --bound-object-kind Secret --bound-object-name s1 --bound-object-uid u1`.
    const TOKEN_REQUEST: &[u8] = b"k8s\x00\x0a\x28\x0a\x18authentication.k8s.io/v1\x12\x0cTokenRequest\x12\x3f\x0a\x10\x0a\x00\x12\x00\x1a\x00\x22\x00\x2a\x00\x32\x00\x38\x00\x42\x00\x12\x25\x0a\x04aud1\x0a\x04aud2\x1a\x14\x0a\x06Secret\x12\x02v1\x1a\x02s1\x22\x02u1\x20\x84\x07\x1a\x04\x0a\x00\x12\x00\x1a\x00\x22\x00";

    // Captured from `kubectl auth can-i list configmaps -n team-b --subresource=status`.
    const SSAR: &[u8] = b"k8s\x00\x0a\x32\x0a\x17authorization.k8s.io/v1\x12\x17SelfSubjectAccessReview\x12\x48\x0a\x10\x0a\x00\x12\x00\x1a\x00\x22\x00\x2a\x00\x32\x00\x38\x00\x42\x00\x12\x2a\x0a\x28\x0a\x06team-b\x12\x04list\x1a\x00\x22\x00\x2a\x0aconfigmaps\x32\x06status\x3a\x00\x1a\x08\x08\x00\x12\x00\x1a\x00\x20\x00\x1a\x00\x22\x00";

    #[test]
    fn decodes_kubectl_create_token() {
        let v = decode(TOKEN_REQUEST).expect("decodes");
        assert_eq!(v["kind"], "TokenRequest");
        assert_eq!(v["spec"]["audiences"], json!(["aud1", "aud2"]));
        assert_eq!(v["spec"]["expirationSeconds"], 900);
        assert_eq!(v["spec"]["boundObjectRef"]["name"], "s1");
    }

    #[test]
    fn decodes_kubectl_auth_can_i() {
        let v = decode(SSAR).expect("decodes");
        assert_eq!(v["kind"], "SelfSubjectAccessReview");
        assert_eq!(
            v["spec"]["resourceAttributes"],
            json!({"namespace": "team-b", "verb": "list", "resource": "configmaps", "subresource": "status"})
        );
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(decode(b"{}"), Err(ProtobufError::Malformed));
        assert_eq!(decode(b"k8s\x00\x0a\xff"), Err(ProtobufError::Malformed));
    }

    /// Wraps a k8s-pb message the way client-go's protobuf serializer does.
    fn envelope(api_version: &str, kind: &str, msg: &impl Message) -> Vec<u8> {
        use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(msg.encode_to_vec()),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC, &unknown.encode_to_vec()].concat()
    }

    #[test]
    fn decodes_a_deployment_encoded_by_k8s_pb() {
        use k8s_pb::api::apps::v1::{Deployment, DeploymentSpec};
        use k8s_pb::api::core::v1::{Container, ContainerPort, PodSpec, PodTemplateSpec};
        use k8s_pb::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
        let labels: std::collections::BTreeMap<String, String> =
            [("app".to_string(), "web".to_string())].into();
        let meta = |name: &str| ObjectMeta {
            name: Some(name.into()),
            labels: labels.clone(),
            namespace: Some(String::new()),
            ..Default::default()
        };
        let d = Deployment {
            metadata: Some(meta("web")),
            spec: Some(DeploymentSpec {
                replicas: Some(0),
                selector: Some(LabelSelector {
                    match_labels: labels.clone(),
                    ..Default::default()
                }),
                template: Some(PodTemplateSpec {
                    metadata: Some(meta("")),
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: Some("nginx".into()),
                            image: Some("nginx:1".into()),
                            ports: vec![ContainerPort {
                                container_port: Some(80),
                                ..Default::default()
                            }],
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                min_ready_seconds: Some(0),
                ..Default::default()
            }),
            status: None,
        };
        let v = decode(&envelope("apps/v1", "Deployment", &d)).expect("decodes");
        assert_eq!(
            v,
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "nginx", "image": "nginx:1", "ports": [{"containerPort": 80}]}]}
                    }
                }
            })
        );
    }

    #[test]
    fn secret_bytes_become_base64_and_int_or_string_is_either() {
        use k8s_pb::api::core::v1::{Secret, Service, ServicePort, ServiceSpec};
        use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
        let s = Secret {
            data: [("k".to_string(), b"v".to_vec())].into(),
            ..Default::default()
        };
        let v = decode(&envelope("v1", "Secret", &s)).expect("decodes");
        assert_eq!(v["data"], json!({"k": "dg=="}));
        let port = |target: IntOrString| ServicePort {
            port: Some(80),
            target_port: Some(target),
            ..Default::default()
        };
        let svc = Service {
            spec: Some(ServiceSpec {
                ports: vec![
                    port(IntOrString {
                        r#type: Some(0),
                        int_val: Some(8080),
                        str_val: None,
                    }),
                    port(IntOrString {
                        r#type: Some(1),
                        int_val: None,
                        str_val: Some("http".into()),
                    }),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = decode(&envelope("v1", "Service", &svc)).expect("decodes");
        assert_eq!(v["spec"]["ports"][0]["targetPort"], json!(8080));
        assert_eq!(v["spec"]["ports"][1]["targetPort"], json!("http"));
    }

    #[test]
    fn unknown_kinds_are_unsupported() {
        let s = k8s_pb::api::core::v1::Secret::default();
        assert!(matches!(
            decode(&envelope("example.com/v1", "Widget", &s)),
            Err(ProtobufError::Unsupported(_))
        ));
    }
}
