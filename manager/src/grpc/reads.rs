//! Cached reads: Get and List served from the shared caches, for a live session of the caller's
//! own, only for kinds that session registered, and only where RBAC lets the caller read.

use super::convert::translate_selector;
use super::registering::{namespace_phrase, recheck_phrase, resource_name};
use super::{Service, ServiceState};
use crate::dispatch::dispatcher::Controller;
use crate::informer::object::CachedObject;
use crate::informer::{Informer, InformerKey, ObjectKey};
use crate::tenancy::{Access, Identity};
use ctrlhub_proto::v1 as pb;
use std::sync::Arc;
use tonic::{Request as GrpcRequest, Response, Status};

impl ServiceState {
    fn session(&self, id: &str) -> Result<(Identity, Arc<Controller>), Status> {
        self.sessions
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| Status::failed_precondition(format!("unknown session_id {id:?}: use the session_id from Registered of a live Connect stream")))
    }

    /// The informers a cached read may use: the session must be live and the caller's own, and
    /// the kind one the session registered.
    async fn cached_read(
        &self,
        identity: &Identity,
        session_id: &str,
        rt: Option<&pb::ResourceType>,
        namespace: &str,
    ) -> Result<Vec<Arc<Informer>>, Status> {
        let (owner, controller) = self.session(session_id)?;
        if &owner != identity {
            return Err(Status::permission_denied(
                "session_id belongs to another identity",
            ));
        }
        let informers = self.readable_informers(&controller, rt)?;
        // Registering granted list+watch; reading from the cache also needs get+list, checked
        // for the namespace asked about ("" = all, which needs a cluster-wide grant).
        if let Some(plural) = informers.first().map(|i| i.key().plural.clone()) {
            let group = informers[0].key().group.clone();
            let allowed = self
                .authz
                .allowed(identity, Access::Read, &group, &plural, namespace)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            if !allowed {
                return Err(Status::permission_denied(format!(
                    "{} may not get and list {} in {}; {}",
                    identity.username,
                    resource_name(&group, &plural),
                    namespace_phrase(namespace),
                    recheck_phrase(self.authz.deny_ttl())
                )));
            }
        }
        Ok(informers)
    }

    fn readable_informers(
        &self,
        controller: &Controller,
        rt: Option<&pb::ResourceType>,
    ) -> Result<Vec<Arc<Informer>>, Status> {
        let rt = rt.ok_or_else(|| Status::invalid_argument("resource: is required"))?;
        let reg = &controller.registration;
        let registered = std::iter::once(&reg.primary)
            .chain(reg.owns.iter().map(|o| &o.resource))
            .chain(reg.watches.iter().map(|w| &w.resource))
            .any(|r| {
                r.group == rt.group
                    && r.kind == rt.kind
                    && (rt.version.is_empty() || r.version == rt.version)
            });
        if !registered {
            return Err(Status::failed_precondition(format!(
                "resource: {} is not a kind this session registered (primary, owns or watches); only those are cached",
                rt.kind
            )));
        }
        let informers: Vec<_> = self
            .controllers
            .cache()
            .all()
            .into_iter()
            .filter(|i| {
                let k: &InformerKey = i.key();
                k.group == rt.group && k.kind == rt.kind
            })
            .collect();
        Ok(informers)
    }
}

impl Service {
    /// A cached Get.
    pub(super) async fn read_one(
        &self,
        req: GrpcRequest<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let identity = self.authenticate(&req).await?;
        let r = req.into_inner();
        let informers = self
            .cached_read(&identity, &r.session_id, r.resource.as_ref(), &r.namespace)
            .await?;
        let found = informers.iter().find_map(|i| {
            i.get(&r.namespace, &r.name)
                .map(|o| (o, i.key().metadata_only))
        });
        match found {
            Some((obj, metadata_only)) => Ok(Response::new(pb::GetResponse {
                object_json: obj.json().to_vec(),
                resource_version: obj.resource_version().to_string(),
                metadata_only,
            })),
            None => Err(Status::not_found(format!(
                "{}/{} not found in the cache",
                r.namespace, r.name
            ))),
        }
    }

    /// A cached List.
    pub(super) async fn read_many(
        &self,
        req: GrpcRequest<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let identity = self.authenticate(&req).await?;
        let r = req.into_inner();
        let informers = self
            .cached_read(&identity, &r.session_id, r.resource.as_ref(), &r.namespace)
            .await?;
        let selector = match &r.label_selector {
            Some(sel) => Some(
                translate_selector(sel, "label_selector")
                    .map_err(|e| Status::invalid_argument(e.to_string()))?,
            ),
            None => None,
        };
        let namespace = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
        let mut items: Vec<(ObjectKey, CachedObject)> = informers
            .iter()
            .flat_map(|i| i.list(namespace))
            .filter(|(_, o)| {
                selector
                    .as_ref()
                    .is_none_or(|s| s.matches_object(&o.value()))
            })
            .collect();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        items.dedup_by(|a, b| a.0 == b.0);
        let (range, next_page_token) = page(&r, items.len())?;
        Ok(Response::new(pb::ListResponse {
            items: items[range]
                .iter()
                .map(|(_, o)| pb::CachedObject {
                    object_json: o.json().to_vec(),
                    resource_version: o.resource_version().to_string(),
                })
                .collect(),
            next_page_token,
            resource_version: String::new(),
            metadata_only: informers.first().is_some_and(|i| i.key().metadata_only),
        }))
    }
}

/// The slice of `len` sorted items a List asks for, and the token of the next page ("" at the
/// end). The token is the offset of the next item.
fn page(r: &pb::ListRequest, len: usize) -> Result<(std::ops::Range<usize>, String), Status> {
    let page_size = match r.page_size {
        0 => 500,
        n => n.min(5000),
    } as usize;
    let offset: usize = if r.page_token.is_empty() {
        0
    } else {
        r.page_token.parse().map_err(|_| {
            Status::invalid_argument("page_token: not a token from a previous ListResponse")
        })?
    };
    let end = offset.saturating_add(page_size).min(len);
    let next = if end < len {
        end.to_string()
    } else {
        String::new()
    };
    Ok((offset.min(end)..end, next))
}
