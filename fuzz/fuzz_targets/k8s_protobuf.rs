//! Kubernetes protobuf request bodies: devcluster's decoder (`k8s\0` envelope around a
//! `runtime.Unknown`, decoded by reflection into JSON) on arbitrary bytes, and on well-formed
//! envelopes of every built-in kind around arbitrary message bytes, whose JSON then goes
//! through the same schema checks and semantic validation a decoded request body does.
#![no_main]

use arbitrary::Arbitrary;
use devcluster::catalog::resources::Registry;
use devcluster::admission::{fieldcheck, validation};
use devcluster::protobuf;
use libfuzzer_sys::fuzz_target;
use prost::encoding::{WireType, encode_key, encode_varint};

#[derive(Arbitrary, Debug)]
struct Input {
    body: Vec<u8>,
    kind: u8,
    message: Vec<u8>,
}

/// A length-delimited field.
fn field(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// The envelope client-go writes: `k8s\0` + Unknown{typeMeta{apiVersion, kind}, raw}.
fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    field(&mut type_meta, 1, api_version.as_bytes());
    field(&mut type_meta, 2, kind.as_bytes());
    let mut out = b"k8s\0".to_vec();
    field(&mut out, 1, &type_meta);
    field(&mut out, 2, raw);
    out
}

fuzz_target!(|input: Input| {
    // Arbitrary bytes: decoded or refused, never a panic.
    let _ = protobuf::decode(&input.body);
    let registry = Registry::builtin();
    let kinds: Vec<_> = registry.all().filter(|i| i.builtin).collect();
    let info = kinds[usize::from(input.kind) % kinds.len()];
    let body = envelope(&info.api_version(), &info.kind, &input.message);
    let Ok(mut obj) = protobuf::decode(&body) else {
        return;
    };
    assert_eq!(obj["kind"], info.kind.as_str(), "the envelope names the kind");
    // The decoded JSON takes the request path's checks without panicking.
    if fieldcheck::check(info, &mut obj).is_ok() {
        let _ = validation::validate(info, &obj, None);
        let _ = validation::validate(info, &obj, Some(&obj));
    }
});
