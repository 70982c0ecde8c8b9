//! Decoding the few protobuf request bodies devcluster accepts: kubectl's typed clients send
//! TokenRequest (`kubectl create token`) and SelfSubjectAccessReview (`kubectl auth can-i`) as
//! `application/vnd.kubernetes.protobuf`, and there is no JSON fallback for requests.
//!
//! Bodies are the Kubernetes envelope (`k8s\0` + `runtime.Unknown`) around the message; each
//! supported message is turned into the JSON its API would carry, so the handlers see one shape.
//! Field numbers are those of `k8s.io/api/{authentication,authorization}/v1/generated.proto`.

use serde_json::{Map, Value, json};

/// Why a protobuf body could not be decoded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtobufError {
    /// Not the `k8s\0` envelope, or truncated/invalid wire data.
    #[error("malformed protobuf body")]
    Malformed,
    /// A kind devcluster does not decode from protobuf.
    #[error("devcluster decodes protobuf bodies of {0} only as JSON")]
    Unsupported(String),
}

const MAGIC: &[u8] = b"k8s\0";

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &mut &[u8]) -> Result<u64, ProtobufError> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first().ok_or(ProtobufError::Malformed)?;
        *buf = rest;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err(ProtobufError::Malformed)
}

/// All fields of one message, in wire order (fixed-width fields are skipped: none are used).
fn fields(mut buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, ProtobufError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let (number, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((number, Field::Varint(varint(&mut buf)?))),
            2 => {
                let len =
                    usize::try_from(varint(&mut buf)?).map_err(|_| ProtobufError::Malformed)?;
                if len > buf.len() {
                    return Err(ProtobufError::Malformed);
                }
                let (bytes, rest) = buf.split_at(len);
                buf = rest;
                out.push((number, Field::Bytes(bytes)));
            }
            1 => buf = buf.get(8..).ok_or(ProtobufError::Malformed)?,
            5 => buf = buf.get(4..).ok_or(ProtobufError::Malformed)?,
            _ => return Err(ProtobufError::Malformed),
        }
    }
    Ok(out)
}

/// Builds a JSON object from a message, field by field.
struct Message<'a>(Vec<(u64, Field<'a>)>);

impl<'a> Message<'a> {
    fn parse(buf: &'a [u8]) -> Result<Self, ProtobufError> {
        fields(buf).map(Message)
    }

    fn bytes(&self, n: u64) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.0.iter().filter_map(move |(k, f)| match f {
            Field::Bytes(b) if *k == n => Some(*b),
            _ => None,
        })
    }

    fn string(&self, n: u64) -> Option<String> {
        self.bytes(n)
            .last()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    fn strings(&self, n: u64) -> Vec<String> {
        self.bytes(n)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect()
    }

    fn varint(&self, n: u64) -> Option<u64> {
        self.0.iter().rev().find_map(|(k, f)| match f {
            Field::Varint(v) if *k == n => Some(*v),
            _ => None,
        })
    }

    fn message(&self, n: u64) -> Result<Option<Message<'a>>, ProtobufError> {
        self.bytes(n).last().map(Message::parse).transpose()
    }
}

/// Insert non-empty strings under their JSON names.
fn put_strings(out: &mut Map<String, Value>, m: &Message<'_>, names: &[(u64, &str)]) {
    for (n, name) in names {
        if let Some(s) = m.string(*n).filter(|s| !s.is_empty()) {
            out.insert((*name).to_string(), json!(s));
        }
    }
}

/// Whether a body is protobuf-encoded, by its content type.
pub fn is_protobuf(content_type: &str) -> bool {
    content_type.contains("protobuf")
}

/// Decode an enveloped TokenRequest, TokenReview, SelfSubjectReview, SubjectAccessReview,
/// SelfSubjectAccessReview or LocalSubjectAccessReview into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, ProtobufError> {
    let inner = body.strip_prefix(MAGIC).ok_or(ProtobufError::Malformed)?;
    let unknown = Message::parse(inner)?;
    let type_meta = unknown.message(1)?.ok_or(ProtobufError::Malformed)?;
    let api_version = type_meta.string(1).unwrap_or_default();
    let kind = type_meta.string(2).unwrap_or_default();
    let raw = unknown.bytes(2).last().unwrap_or_default();
    let msg = Message::parse(raw)?;
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!(kind));
    if let Some(meta) = msg.message(1)? {
        let mut m = Map::new();
        put_strings(
            &mut m,
            &meta,
            &[(1, "name"), (2, "generateName"), (3, "namespace")],
        );
        out.insert("metadata".into(), Value::Object(m));
    }
    let spec = msg.message(2)?;
    let spec = match (kind.as_str(), spec) {
        // SelfSubjectReview has no spec (its field 2 is the status).
        ("SelfSubjectReview", _) | (_, None) => json!({}),
        ("TokenRequest", Some(s)) => token_request_spec(&s)?,
        ("TokenReview", Some(s)) => {
            let mut m = Map::new();
            put_strings(&mut m, &s, &[(1, "token")]);
            m.insert("audiences".into(), json!(s.strings(2)));
            Value::Object(m)
        }
        ("SubjectAccessReview" | "LocalSubjectAccessReview", Some(s)) => {
            let mut m = access_attributes(&s)?;
            put_strings(&mut m, &s, &[(3, "user"), (6, "uid")]);
            m.insert("groups".into(), json!(s.strings(4)));
            let mut extra = Map::new();
            for entry in s.bytes(5) {
                let entry = Message::parse(entry)?;
                let values = entry.message(2)?.map(|v| v.strings(1)).unwrap_or_default();
                extra.insert(entry.string(1).unwrap_or_default(), json!(values));
            }
            if !extra.is_empty() {
                m.insert("extra".into(), Value::Object(extra));
            }
            Value::Object(m)
        }
        ("SelfSubjectAccessReview", Some(s)) => Value::Object(access_attributes(&s)?),
        (other, Some(_)) => return Err(ProtobufError::Unsupported(other.to_string())),
    };
    out.insert("spec".into(), spec);
    Ok(Value::Object(out))
}

fn token_request_spec(s: &Message<'_>) -> Result<Value, ProtobufError> {
    let mut m = Map::new();
    m.insert("audiences".into(), json!(s.strings(1)));
    if let Some(secs) = s.varint(4) {
        // int64 on the wire: negative values arrive as two's complement.
        m.insert("expirationSeconds".into(), json!(secs as i64));
    }
    if let Some(bound) = s.message(3)? {
        let mut b = Map::new();
        put_strings(
            &mut b,
            &bound,
            &[(1, "kind"), (2, "apiVersion"), (3, "name"), (4, "uid")],
        );
        m.insert("boundObjectRef".into(), Value::Object(b));
    }
    Ok(Value::Object(m))
}

/// `resourceAttributes` (1) and `nonResourceAttributes` (2) of an access review spec.
fn access_attributes(s: &Message<'_>) -> Result<Map<String, Value>, ProtobufError> {
    let mut m = Map::new();
    if let Some(ra) = s.message(1)? {
        let mut r = Map::new();
        put_strings(
            &mut r,
            &ra,
            &[
                (1, "namespace"),
                (2, "verb"),
                (3, "group"),
                (4, "version"),
                (5, "resource"),
                (6, "subresource"),
                (7, "name"),
            ],
        );
        m.insert("resourceAttributes".into(), Value::Object(r));
    }
    if let Some(nra) = s.message(2)? {
        let mut r = Map::new();
        put_strings(&mut r, &nra, &[(1, "path"), (2, "verb")]);
        m.insert("nonResourceAttributes".into(), Value::Object(r));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
