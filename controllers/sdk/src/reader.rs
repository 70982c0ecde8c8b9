//! Cached reads (Get/List) through the manager's shared caches.

use std::sync::Arc;

use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use kube::Resource;
use kube::core::PartialObjectMeta;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;

use crate::{Config, ConfigError, Selector, resource_type};

/// Reads objects from the manager's cache through one session
/// (`Registered.session_id`). Obtain it from [`Request::reader`](crate::Request::reader).
///
/// Only the session's registered types (primary, owned, watched) are
/// readable, within its namespace scope and label selector. Each is served
/// in the form the manager caches it in (`Registered.readable`, logged when
/// a session registers): in full, so [`get`](CachedReader::get) and
/// [`list`](CachedReader::list) return `K` with its spec and status; or,
/// when every `owns`/`watches` entry of the kind asked for metadata only
/// ([`Controller::owns_metadata`](crate::Controller::owns_metadata)), as
/// metadata, which [`get_metadata`](CachedReader::get_metadata) and
/// [`list_metadata`](CachedReader::list_metadata) return as
/// `PartialObjectMeta<K>` (they read full kinds too). Reads are eventually
/// consistent; read the API server when you must see your own writes.
#[derive(Clone, Debug)]
pub struct CachedReader {
    client: ControllerManagerClient<Channel>,
    config: Arc<Config>,
    session_id: String,
}

/// A failed cached read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The manager refused or failed the read (FAILED_PRECONDITION for an
    /// unregistered type or an ended session, PERMISSION_DENIED, ...).
    #[error("cached read failed: {}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// The type is cached metadata-only; use `get_metadata`, or read the API
    /// server for spec and status.
    #[error(
        "{kind} is cached metadata-only by the manager (every owns/watches entry of it asked for \
         metadata_only): read it with get_metadata, register it in full, or read the API server"
    )]
    MetadataOnly {
        /// The kind that was read.
        kind: String,
    },
    /// The object does not decode as the requested type.
    #[error("cannot decode cached object: {0}")]
    Decode(#[from] serde_json::Error),
    /// The bearer token could not be loaded.
    #[error(transparent)]
    Auth(#[from] ConfigError),
}

/// One raw object from the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawObject {
    /// Kubernetes JSON (a PartialObjectMetadata when `metadata_only`).
    pub json: Vec<u8>,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
    /// Whether the type is cached metadata-only.
    pub metadata_only: bool,
}

impl CachedReader {
    pub(crate) fn new(
        client: ControllerManagerClient<Channel>,
        config: Arc<Config>,
        session_id: String,
    ) -> Self {
        Self {
            client,
            config,
            session_id,
        }
    }

    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        Self::new(
            ControllerManagerClient::new(channel),
            Arc::new(Config::default()),
            "test".into(),
        )
    }

    /// The session this reader reads through.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, ReadError> {
        let mut req = tonic::Request::new(message);
        req.metadata_mut()
            .insert("authorization", self.config.authorization()?);
        Ok(req)
    }

    /// Reads one object of any registered type; `Ok(None)` when it does not
    /// exist (or is outside the session's scope).
    pub async fn get_raw(
        &self,
        resource: pb::ResourceType,
        namespace: &str,
        name: &str,
    ) -> Result<Option<RawObject>, ReadError> {
        let req = self.request(pb::GetRequest {
            session_id: self.session_id.clone(),
            resource: Some(resource),
            namespace: namespace.into(),
            name: name.into(),
        })?;
        match self.client.clone().get(req).await {
            Ok(resp) => {
                let resp = resp.into_inner();
                Ok(Some(RawObject {
                    json: resp.object_json,
                    resource_version: resp.resource_version,
                    metadata_only: resp.metadata_only,
                }))
            }
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(status.into()),
        }
    }

    /// Lists every object of a registered type (all pages), in `namespace`
    /// (or every namespace in scope when `None`), optionally filtered by a
    /// label selector.
    pub async fn list_raw(
        &self,
        resource: pb::ResourceType,
        namespace: Option<&str>,
        selector: Option<&Selector>,
    ) -> Result<Vec<RawObject>, ReadError> {
        let mut items = Vec::new();
        let mut page_token = String::new();
        loop {
            let req = self.request(pb::ListRequest {
                session_id: self.session_id.clone(),
                resource: Some(resource.clone()),
                namespace: namespace.unwrap_or_default().into(),
                label_selector: selector.map(Selector::to_proto),
                page_size: 0,
                page_token: page_token.clone(),
            })?;
            let resp = self.client.clone().list(req).await?.into_inner();
            items.extend(resp.items.into_iter().map(|item| RawObject {
                json: item.object_json,
                resource_version: item.resource_version,
                metadata_only: resp.metadata_only,
            }));
            if resp.next_page_token.is_empty() {
                return Ok(items);
            }
            page_token = resp.next_page_token;
        }
    }

    /// Reads one object of type `K`; `Ok(None)` when not found. Fails with
    /// [`ReadError::MetadataOnly`] when the manager caches `K` as metadata.
    pub async fn get<K>(&self, namespace: &str, name: &str) -> Result<Option<K>, ReadError>
    where
        K: Resource + DeserializeOwned,
        K::DynamicType: Default,
    {
        let Some(raw) = self.get_raw(resource_type::<K>(), namespace, name).await? else {
            return Ok(None);
        };
        decode_full::<K>(&raw).map(Some)
    }

    /// Reads the metadata of one object of type `K`, whichever form the
    /// manager caches `K` in; `Ok(None)` when not found.
    pub async fn get_metadata<K>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PartialObjectMeta<K>>, ReadError>
    where
        K: Resource,
        K::DynamicType: Default,
    {
        let Some(raw) = self.get_raw(resource_type::<K>(), namespace, name).await? else {
            return Ok(None);
        };
        decode_metadata(&raw).map(Some)
    }

    /// Lists objects of type `K`; see [`CachedReader::list_raw`].
    pub async fn list<K>(
        &self,
        namespace: Option<&str>,
        selector: Option<&Selector>,
    ) -> Result<Vec<K>, ReadError>
    where
        K: Resource + DeserializeOwned,
        K::DynamicType: Default,
    {
        self.list_raw(resource_type::<K>(), namespace, selector)
            .await?
            .iter()
            .map(decode_full::<K>)
            .collect()
    }

    /// Lists the metadata of objects of type `K`, whichever form the manager
    /// caches `K` in.
    pub async fn list_metadata<K>(
        &self,
        namespace: Option<&str>,
        selector: Option<&Selector>,
    ) -> Result<Vec<PartialObjectMeta<K>>, ReadError>
    where
        K: Resource,
        K::DynamicType: Default,
    {
        self.list_raw(resource_type::<K>(), namespace, selector)
            .await?
            .iter()
            .map(decode_metadata)
            .collect()
    }
}

fn decode_full<K>(raw: &RawObject) -> Result<K, ReadError>
where
    K: Resource + DeserializeOwned,
    K::DynamicType: Default,
{
    if raw.metadata_only {
        return Err(ReadError::MetadataOnly {
            kind: K::kind(&K::DynamicType::default()).into_owned(),
        });
    }
    Ok(serde_json::from_slice(&raw.json)?)
}

/// The metadata of a full object or of a PartialObjectMetadata, typed as `K`'s.
fn decode_metadata<K>(raw: &RawObject) -> Result<PartialObjectMeta<K>, ReadError> {
    Ok(serde_json::from_slice(&raw.json)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;

    #[test]
    fn metadata_only_objects() -> Result<(), ReadError> {
        let raw = RawObject {
            json: br#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"d","namespace":"ns","uid":"u1"}}"#.to_vec(),
            resource_version: "5".into(),
            metadata_only: true,
        };
        assert!(matches!(
            decode_full::<Deployment>(&raw),
            Err(ReadError::MetadataOnly { kind }) if kind == "Deployment"
        ));
        let meta: PartialObjectMeta<Deployment> = decode_metadata(&raw)?;
        assert_eq!(meta.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(
            meta.types.map(|t| t.kind).as_deref(),
            Some("PartialObjectMetadata")
        );
        Ok(())
    }

    #[test]
    fn full_objects_read_as_metadata_too() -> Result<(), ReadError> {
        let raw = RawObject {
            json: br#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","labels":{"a":"b"}},"spec":{"replicas":2}}"#.to_vec(),
            resource_version: "5".into(),
            metadata_only: false,
        };
        let meta: PartialObjectMeta<Deployment> = decode_metadata(&raw)?;
        assert_eq!(meta.metadata.name.as_deref(), Some("d"));
        let full = decode_full::<Deployment>(&raw)?;
        assert_eq!(full.spec.and_then(|s| s.replicas), Some(2));
        Ok(())
    }
}
