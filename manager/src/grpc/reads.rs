//! Cached reads: Get and List served from the shared caches, for a live session of the caller's
//! own, only for kinds that session registered, only from the informers that session's
//! controller uses and within its namespace scope (so never beyond its label selector or
//! namespaces, whatever other tenants cache), and only where RBAC lets the caller read.

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
    ) -> Result<Readable, Status> {
        let (owner, controller) = self.session(session_id)?;
        if &owner != identity {
            return Err(Status::permission_denied(
                "session_id belongs to another identity",
            ));
        }
        let informers = readable_informers(&controller, rt)?;
        // Registering granted list+watch; reading from the cache also needs get+list, checked
        // for the namespace asked about ("" = all, which needs a cluster-wide grant).
        if let Some(key) = informers.first().map(|i| i.key().clone()) {
            let allowed = self
                .authz
                .allowed(identity, Access::Read, &key.group, &key.plural, namespace)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            if !allowed {
                return Err(Status::permission_denied(format!(
                    "{} may not get and list {} in {}; {}",
                    identity.username,
                    resource_name(&key.group, &key.plural),
                    namespace_phrase(namespace),
                    recheck_phrase(self.authz.deny_ttl())
                )));
            }
        }
        Ok(Readable {
            controller,
            informers,
        })
    }
}

/// What a cached read may see: the session's controller (whose scope admits keys) and its
/// informers of the kind asked for.
struct Readable {
    controller: Arc<Controller>,
    informers: Vec<Arc<Informer>>,
}

impl Readable {
    /// The object `key` if the session's caches hold it within its scope.
    fn get(&self, key: &ObjectKey) -> Option<(CachedObject, bool)> {
        if !self.controller.admits(key) {
            return None;
        }
        self.informers.iter().find_map(|i| {
            i.get(&key.namespace, &key.name)
                .map(|o| (o, i.key().metadata_only))
        })
    }

    /// Objects of the session's informers after `after`, in key order, up to [`SCAN`] of them
    /// per informer; and the key beyond which they may be incomplete (None: nothing follows).
    /// A page costs what it looks at, never the whole cache.
    fn candidates(
        &self,
        namespace: Option<&str>,
        after: Option<&ObjectKey>,
    ) -> (Vec<(ObjectKey, CachedObject)>, Option<ObjectKey>) {
        let mut items = Vec::new();
        let mut horizon: Option<ObjectKey> = None;
        for informer in &self.informers {
            // An informer of one namespace holds nothing of another.
            if let (Some(want), Some(holds)) = (namespace, informer.key().namespace.as_deref())
                && want != holds
            {
                continue;
            }
            let (found, more) = informer.range(namespace, after, SCAN);
            if more && let Some((last, _)) = found.last() {
                horizon = Some(horizon.map_or(last.clone(), |h| h.min(last.clone())));
            }
            items.extend(found);
        }
        items.sort_by(|a, b| a.0.cmp(&b.0));
        items.dedup_by(|a, b| a.0 == b.0);
        if let Some(h) = &horizon {
            // Past the first informer that stopped early, another's objects might be missing.
            items.retain(|(k, _)| k <= h);
        }
        (items, horizon)
    }

    /// The newest resourceVersion among the informers read.
    fn resource_version(&self) -> String {
        self.informers
            .iter()
            .map(|i| i.newest_resource_version())
            .max_by(|a, b| match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) => a.cmp(&b),
                _ => a.len().cmp(&b.len()).then_with(|| a.cmp(b)),
            })
            .unwrap_or_default()
    }

    fn metadata_only(&self) -> bool {
        self.informers
            .first()
            .is_some_and(|i| i.key().metadata_only)
    }
}

/// The informers of the controller's own registration that hold `rt`: its primary, owned or
/// watched kind, never another controller's cache of the same kind.
fn readable_informers(
    controller: &Controller,
    rt: Option<&pb::ResourceType>,
) -> Result<Vec<Arc<Informer>>, Status> {
    let rt = rt.ok_or_else(|| Status::invalid_argument("resource: is required"))?;
    let matches = |group: &str, version: &str, kind: &str| {
        group == rt.group && kind == rt.kind && (rt.version.is_empty() || version == rt.version)
    };
    let reg = &controller.registration;
    let registered = std::iter::once(&reg.primary)
        .chain(reg.owns.iter().map(|o| &o.resource))
        .chain(reg.watches.iter().map(|w| &w.resource))
        .any(|r| matches(&r.group, &r.version, &r.kind));
    if !registered {
        return Err(Status::failed_precondition(format!(
            "resource: {} is not a kind this session registered (primary, owns or watches); only those are cached",
            rt.kind
        )));
    }
    Ok(controller
        .informers()
        .into_iter()
        .filter(|i| {
            let k: &InformerKey = i.key();
            matches(&k.group, &k.version, &k.kind)
        })
        .collect())
}

impl Service {
    /// A cached Get.
    pub(super) async fn read_one(
        &self,
        req: GrpcRequest<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let identity = self.authenticate(&req).await?;
        let _turn = self.controllers.read_turn(&identity.tenant).await;
        let r = req.into_inner();
        let readable = self
            .cached_read(&identity, &r.session_id, r.resource.as_ref(), &r.namespace)
            .await?;
        match readable.get(&ObjectKey::new(&r.namespace, &r.name)) {
            Some((obj, metadata_only)) => Ok(Response::new(pb::GetResponse {
                object_json: obj.json().to_vec(),
                resource_version: obj.resource_version().to_string(),
                metadata_only,
            })),
            None => Err(Status::not_found(format!(
                "{}/{} not found in this session's cache",
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
        let _turn = self.controllers.read_turn(&identity.tenant).await;
        let r = req.into_inner();
        let readable = self
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
        let after = match r.page_token.as_str() {
            "" => None,
            token => Some(PageToken::decode(token, fingerprint(&r))?),
        };
        // Read the consistency point before the objects: every object is at least that new.
        let resource_version = readable.resource_version();
        let (candidates, horizon) = readable.candidates(namespace, after.as_ref());
        let size = page_size(&r);
        let mut wanted = Vec::with_capacity(candidates.len().min(size + 1));
        for (k, o) in candidates {
            // Reading labels costs a partial parse per object: the runtime's budget makes this
            // task give way to others (other tenants' dispatch) every hundred or so.
            tokio::task::consume_budget().await;
            let keep = readable.controller.admits(&k)
                && selector
                    .as_ref()
                    .is_none_or(|s| s.matches_label_map(o.labels().as_ref()));
            if keep {
                wanted.push((k, o));
                if wanted.len() > size {
                    break;
                }
            }
        }
        let (page, next) = cut_page(size, wanted, horizon, |_, _| true);
        let next_page_token = next
            .map(|k| PageToken::encode(&k, fingerprint(&r)))
            .unwrap_or_default();
        Ok(Response::new(pb::ListResponse {
            items: page
                .iter()
                .map(|(_, o)| pb::CachedObject {
                    object_json: o.json().to_vec(),
                    resource_version: o.resource_version().to_string(),
                })
                .collect(),
            next_page_token,
            resource_version,
            metadata_only: readable.metadata_only(),
        }))
    }
}

/// Most objects one List request looks at per informer, matching or not: with a selective
/// label selector a page may come back short (with a token to go on), but no request costs more
/// than this, however large the cache.
const SCAN: usize = 10_000;

/// The page size a List asks for: 500 by default, at most 5000.
fn page_size(r: &pb::ListRequest) -> usize {
    match r.page_size {
        0 => 500,
        n => n.min(5000) as usize,
    }
}

/// The first `size` of `candidates` that are `wanted`, and the key to resume after (None: the
/// list is complete). `horizon` is where the candidates may stop being complete.
fn cut_page(
    size: usize,
    candidates: Vec<Item>,
    horizon: Option<ObjectKey>,
    wanted: impl Fn(&ObjectKey, &CachedObject) -> bool,
) -> (Vec<Item>, Option<ObjectKey>) {
    let total = candidates.len();
    let mut page = Vec::new();
    for (seen, (k, o)) in candidates.into_iter().enumerate() {
        if !wanted(&k, &o) {
            continue;
        }
        page.push((k, o));
        if page.len() == size {
            let more = seen + 1 < total || horizon.is_some();
            let next = more.then(|| page[page.len() - 1].0.clone());
            return (page, next);
        }
    }
    (page, horizon)
}

/// One cached object with its key.
type Item = (ObjectKey, CachedObject);

/// What a List's pages must agree on: every request field but the page token and size.
fn fingerprint(r: &pb::ListRequest) -> u64 {
    use prost::Message;
    use std::hash::{Hash, Hasher};
    let fixed = pb::ListRequest {
        page_token: String::new(),
        page_size: 0,
        ..r.clone()
    };
    // DefaultHasher::new() has fixed keys: the same request hashes the same in this process.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    fixed.encode_to_vec().hash(&mut h);
    h.finish()
}

/// `ListResponse.next_page_token`: base64 of `v1 <fingerprint> <namespace>/<name>`.
struct PageToken;

impl PageToken {
    fn encode(after: &ObjectKey, fingerprint: u64) -> String {
        use base64::Engine as _;
        let text = format!("v1 {fingerprint:x} {}/{}", after.namespace, after.name);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
    }

    fn decode(token: &str, fingerprint: u64) -> Result<ObjectKey, Status> {
        use base64::Engine as _;
        let bad = || {
            Status::invalid_argument(
                "page_token: not a next_page_token of a previous ListResponse to the same request; keep every other field unchanged between pages, or start again without a token",
            )
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| bad())?;
        let text = String::from_utf8(bytes).map_err(|_| bad())?;
        let mut parts = text.splitn(3, ' ');
        let (Some("v1"), Some(hash), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        if u64::from_str_radix(hash, 16).ok() != Some(fingerprint) {
            return Err(bad());
        }
        let (namespace, name) = key.split_once('/').ok_or_else(bad)?;
        Ok(ObjectKey::new(namespace, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(names: &[&str]) -> Vec<(ObjectKey, CachedObject)> {
        names
            .iter()
            .map(|n| {
                let v = serde_json::json!({"metadata": {"namespace": "ns", "name": n}});
                (ObjectKey::new("ns", *n), CachedObject::from_value(&v))
            })
            .collect()
    }

    fn request(size: u32, token: &str) -> pb::ListRequest {
        pb::ListRequest {
            session_id: "s".into(),
            namespace: "ns".into(),
            page_size: size,
            page_token: token.into(),
            ..Default::default()
        }
    }

    /// The keys after `after` in `all`, as one informer's range would give them.
    fn after(all: &[Item], after: Option<&ObjectKey>) -> Vec<Item> {
        all.iter()
            .filter(|(k, _)| after.is_none_or(|a| k > a))
            .cloned()
            .collect()
    }

    fn names(page: &[Item]) -> Vec<&str> {
        page.iter().map(|(k, _)| k.name.as_str()).collect()
    }

    #[test]
    fn pages_resume_after_the_last_key_even_when_the_cache_changed() {
        let before = items(&["a", "b", "c", "d"]);
        let (first, next) = cut_page(2, after(&before, None), None, |_, _| true);
        assert_eq!(names(&first), ["a", "b"]);
        // "a" was deleted and "bb" created between the pages: nothing is skipped or repeated.
        let later = items(&["b", "bb", "c", "d"]);
        let (second, next) = cut_page(2, after(&later, next.as_ref()), None, |_, _| true);
        assert_eq!(names(&second), ["bb", "c"]);
        let (third, end) = cut_page(2, after(&later, next.as_ref()), None, |_, _| true);
        assert_eq!(names(&third), ["d"]);
        assert_eq!(end, None, "the last page has no token");
    }

    #[test]
    fn a_selective_page_stops_at_the_scan_horizon_with_a_token_to_go_on() {
        let all = items(&["a", "b", "c", "d", "e"]);
        // The informer stopped after "c" (its scan bound) and only "e" matches.
        let (page, next) = cut_page(
            10,
            after(&all, None)[..3].to_vec(),
            Some(ObjectKey::new("ns", "c")),
            |k, _| k.name == "e",
        );
        assert!(page.is_empty(), "nothing matched within the scan");
        assert_eq!(
            next,
            Some(ObjectKey::new("ns", "c")),
            "resume after what was looked at"
        );
        let (page, next) = cut_page(10, after(&all, next.as_ref()), None, |k, _| k.name == "e");
        assert_eq!(names(&page), ["e"]);
        assert_eq!(next, None);
    }

    #[test]
    fn a_token_is_refused_for_another_request_or_when_forged() {
        let key = ObjectKey::new("ns", "a");
        let r = request(1, "");
        let token = PageToken::encode(&key, fingerprint(&r));
        assert_eq!(
            PageToken::decode(&token, fingerprint(&request(7, &token))).ok(),
            Some(key),
            "the page size may change between pages"
        );
        let mut other = request(1, &token);
        other.namespace = "elsewhere".into();
        let refused = PageToken::decode(&token, fingerprint(&other)).expect_err("changed field");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert!(
            PageToken::decode("999", fingerprint(&r)).is_err(),
            "an offset is no token"
        );
    }
}
