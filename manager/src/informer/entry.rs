//! One object as an informer's store holds it: its key and its stored JSON in one allocation,
//! ordered by the key.
//!
//! A store once held an `ObjectKey` (two `String`s, two more allocations) beside each object's
//! bytes, in map nodes three times the size: for an owned kind's metadata that was about as much
//! again as the metadata itself. Here the key is written in front of the JSON, and the set's
//! element is one pointer. A metadata-only informer also leaves out what every one of its
//! objects has in common, their `apiVersion` and `kind` ([`Form::Metadata`]), and puts them
//! back when an object is read.
//!
//! Layout of the allocation: the key's length (4 bytes, little-endian), the key (namespace, a
//! NUL byte, name: compared as bytes, that orders keys as `ObjectKey` orders them, since no
//! Kubernetes name or namespace contains NUL), then the stored JSON.

use crate::informer::object::{self, CachedObject};
use crate::key::ObjectKey;
use serde_json::Value;
use std::borrow::Borrow;
use std::sync::Arc;

/// What a store keeps of each object.
#[derive(Debug, Clone)]
pub(crate) enum Form {
    /// The whole object, as dispatch and reads send it.
    Full,
    /// `{"metadata":{…}}` alone; `prefix` is the informer's `{"apiVersion":…,"kind":…`, which
    /// a read puts back in front.
    Metadata {
        /// The start of every object read: `{"apiVersion":"<api version>","kind":"<kind>"`.
        prefix: Arc<[u8]>,
    },
}

impl Form {
    /// The metadata-only form of objects of `api_version` and `kind`.
    pub(crate) fn metadata(api_version: &str, kind: &str) -> Self {
        let prefix = serde_json::to_vec(&serde_json::json!({
            "apiVersion": api_version,
            "kind": kind,
        }))
        .unwrap_or_default();
        // `{"apiVersion":"…","kind":"…"}` without its closing brace.
        let open = prefix.len().saturating_sub(1);
        Form::Metadata {
            prefix: prefix.get(..open).unwrap_or_default().into(),
        }
    }
}

/// One stored object. Cloning it is a reference-count bump.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    bytes: Arc<[u8]>,
}

const LEN: usize = 4;

/// The key as entries compare it: namespace, NUL, name.
pub(crate) fn encode_key(key: &ObjectKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.namespace.len() + 1 + key.name.len());
    push_key(&mut out, &key.namespace, &key.name);
    out
}

fn push_key(out: &mut Vec<u8>, namespace: &str, name: &str) {
    out.extend_from_slice(namespace.as_bytes());
    out.push(0);
    out.extend_from_slice(name.as_bytes());
}

impl Entry {
    /// `obj` in `form`, keyed by its own namespace and name (empty when missing).
    pub(crate) fn of_value(obj: &Value, form: &Form) -> Self {
        let field = |f: &str| obj.pointer(f).and_then(Value::as_str).unwrap_or_default();
        let mut out = vec![0; LEN];
        push_key(
            &mut out,
            field("/metadata/namespace"),
            field("/metadata/name"),
        );
        let key_len = u32::try_from(out.len() - LEN).unwrap_or(u32::MAX);
        out[..LEN].copy_from_slice(&key_len.to_le_bytes());
        // Writing a Value into a Vec cannot fail: its map keys are strings.
        let _ = match (form, obj.get("metadata")) {
            (Form::Full, _) => serde_json::to_writer(&mut out, obj),
            (Form::Metadata { .. }, None) => {
                out.extend_from_slice(b"{}");
                Ok(())
            }
            (Form::Metadata { .. }, Some(metadata)) => {
                out.extend_from_slice(b"{\"metadata\":");
                let written = serde_json::to_writer(&mut out, metadata);
                out.push(b'}');
                written
            }
        };
        Entry { bytes: out.into() }
    }

    fn key_end(&self) -> usize {
        let len = self
            .bytes
            .first_chunk::<LEN>()
            .map_or(0, |b| u32::from_le_bytes(*b));
        (LEN + len as usize).min(self.bytes.len())
    }

    /// The key as entries compare it (see [`encode_key`]).
    pub(crate) fn key_bytes(&self) -> &[u8] {
        self.bytes.get(LEN..self.key_end()).unwrap_or_default()
    }

    /// The object's namespace, as bytes.
    pub(crate) fn namespace_bytes(&self) -> &[u8] {
        let key = self.key_bytes();
        key.split(|b| *b == 0).next().unwrap_or_default()
    }

    /// The object's key.
    pub(crate) fn key(&self) -> ObjectKey {
        let key = self.key_bytes();
        let (namespace, name) = match key.iter().position(|b| *b == 0) {
            Some(at) => (&key[..at], &key[at + 1..]),
            None => (key, &[][..]),
        };
        ObjectKey::new(
            String::from_utf8_lossy(namespace),
            String::from_utf8_lossy(name),
        )
    }

    /// The stored JSON: the object, or `{"metadata":{…}}` in the metadata form.
    pub(crate) fn stored(&self) -> &[u8] {
        self.bytes.get(self.key_end()..).unwrap_or_default()
    }

    /// Bytes of stored JSON: what the entry is charged (its key and the allocation's header
    /// are a few dozen bytes more).
    pub(crate) fn stored_len(&self) -> usize {
        self.stored().len()
    }

    /// metadata.resourceVersion ("" if the server sent none).
    pub(crate) fn resource_version(&self) -> String {
        object::resource_version_of(self.stored())
    }

    /// The object as reads and events see it: shared in the full form; in the metadata form,
    /// `{"apiVersion":…,"kind":…,"metadata":{…}}` written anew.
    pub(crate) fn object(&self, form: &Form) -> CachedObject {
        match form {
            Form::Full => CachedObject::shared(self.bytes.clone(), self.key_end()),
            Form::Metadata { prefix } => {
                let stored = self.stored();
                let rest = stored.get(1..).unwrap_or(b"}");
                let mut json = Vec::with_capacity(prefix.len() + 1 + rest.len());
                json.extend_from_slice(prefix);
                if rest != b"}" {
                    json.push(b',');
                }
                json.extend_from_slice(rest);
                CachedObject::shared(json.into(), 0)
            }
        }
    }
}

/// Entries are found by key: equal, ordered and borrowed as their [`Entry::key_bytes`].
impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.key_bytes() == other.key_bytes()
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key_bytes().cmp(other.key_bytes())
    }
}

impl Borrow<[u8]> for Entry {
    fn borrow(&self) -> &[u8] {
        self.key_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn widget() -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "resourceVersion": "7",
                "labels": {"a": "b"}},
            "spec": {"size": 3}})
    }

    #[test]
    fn a_full_entry_reads_back_the_object_sharing_its_allocation() {
        let v = widget();
        let e = Entry::of_value(&v, &Form::Full);
        assert_eq!(e.key(), ObjectKey::new("ns", "w"));
        assert_eq!(e.resource_version(), "7");
        let o = e.object(&Form::Full);
        assert_eq!(o, CachedObject::from_value(&v));
        assert_eq!(e.stored_len(), o.json().len());
    }

    #[test]
    fn a_metadata_entry_keeps_the_metadata_and_reads_back_apiversion_kind_and_metadata() {
        let form = Form::metadata("example.com/v1", "Widget");
        let e = Entry::of_value(&widget(), &form);
        assert_eq!(
            std::str::from_utf8(e.stored()).ok(),
            Some(
                r#"{"metadata":{"name":"w","namespace":"ns","resourceVersion":"7","labels":{"a":"b"}}}"#
            )
        );
        assert_eq!(e.resource_version(), "7");
        assert_eq!(
            std::str::from_utf8(e.object(&form).json()).ok(),
            Some(
                r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns","resourceVersion":"7","labels":{"a":"b"}}}"#
            )
        );
        let bare = Entry::of_value(&json!({"spec": {}}), &form);
        assert_eq!(bare.key(), ObjectKey::new("", ""));
        assert_eq!(
            bare.object(&form).value(),
            json!({"apiVersion": "example.com/v1", "kind": "Widget"})
        );
    }

    #[test]
    fn entries_order_as_object_keys_do() {
        let keys = [
            ObjectKey::new("", "node"),
            ObjectKey::new("a", "z"),
            ObjectKey::new("ab", "a"),
            ObjectKey::new("b", ""),
            ObjectKey::new("b", "a"),
        ];
        let entries: Vec<Entry> = keys
            .iter()
            .map(|k| {
                let v = json!({"metadata": {"namespace": k.namespace, "name": k.name}});
                Entry::of_value(&v, &Form::Full)
            })
            .collect();
        for (i, a) in entries.iter().enumerate() {
            assert_eq!(a.key(), keys[i]);
            assert_eq!(a.key_bytes(), encode_key(&keys[i]));
            for (j, b) in entries.iter().enumerate() {
                assert_eq!(
                    a.cmp(b),
                    keys[i].cmp(&keys[j]),
                    "{} vs {}",
                    keys[i],
                    keys[j]
                );
            }
        }
        assert_eq!(entries[2].namespace_bytes(), b"ab");
    }
}
