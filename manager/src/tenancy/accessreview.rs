//! Authorization with Kubernetes RBAC as the policy, through SubjectAccessReview: a tenant may
//! watch R in N through ctrlhub only if its own identity may `list` and `watch` R in N.
//!
//! Allows are cached longer than denies (reference: 5 minutes and 30 seconds), so a new
//! RoleBinding takes effect quickly and a revoked one is noticed within the allow TTL, which is
//! also the interval on which live registrations are re-checked. A registration scoped by a
//! namespace label selector needs no cluster-wide grant: each namespace enters its scope once
//! this authorizer allows it there (see `controllers`). Secrets need more than RBAC: a
//! tenant must also be listed in the manager's configuration, because a shared cache of Secrets
//! is a bigger exposure than a tenant's own API access.

use crate::metrics::auth::ReviewMetrics;
use crate::tenancy::decision_cache::TtlCache;
use crate::tenancy::{Access, Authorizer, AuthzError, BoxFuture, Identity, PathAuthorizer};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// How many decisions the cache remembers; beyond that, it evicts.
const CACHE_ENTRIES: usize = 50_000;

/// How long decisions are trusted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecisionTtl {
    /// An allow (also the re-check interval of live registrations).
    pub allow: Duration,
    /// A deny (also how often a namespace kept out of a label-selector scope is asked about
    /// again, so a RoleBinding created later admits it within this long).
    pub deny: Duration,
}

impl Default for DecisionTtl {
    fn default() -> Self {
        DecisionTtl {
            allow: Duration::from_secs(300),
            deny: Duration::from_secs(30),
        }
    }
}

/// What a decision is about: a resource (verb, group, plural, namespace) or a non-resource URL
/// (verb, path; e.g. `get /metrics` on the HTTP port).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Attributes {
    Resource {
        verb: &'static str,
        group: String,
        plural: String,
        namespace: String,
    },
    Path {
        verb: &'static str,
        path: String,
    },
}

impl Attributes {
    fn resource(&self) -> Option<ResourceAttributes> {
        let Attributes::Resource {
            verb,
            group,
            plural,
            namespace,
        } = self
        else {
            return None;
        };
        Some(ResourceAttributes {
            verb: Some(verb.to_string()),
            group: Some(group.clone()),
            resource: Some(plural.clone()),
            // "" asks about all namespaces: only a cluster-wide grant allows that.
            namespace: Some(namespace.clone()),
            ..Default::default()
        })
    }

    fn non_resource(&self) -> Option<NonResourceAttributes> {
        let Attributes::Path { verb, path } = self else {
            return None;
        };
        Some(NonResourceAttributes {
            verb: Some(verb.to_string()),
            path: Some(path.clone()),
        })
    }
}

/// Who asks (username and uid) and about what.
type DecisionKey = (String, String, Attributes);

/// Authorizes through SubjectAccessReview.
pub(crate) struct AccessReviewAuthorizer {
    api: Api<SubjectAccessReview>,
    ttl: DecisionTtl,
    secrets_tenants: HashSet<String>,
    cache: Mutex<TtlCache<DecisionKey, bool>>,
    /// Review latency and cache hits, when the manager records them.
    metrics: Option<ReviewMetrics>,
}

impl AccessReviewAuthorizer {
    /// Check through `client`; `secrets_tenants` are the tenants (full usernames) that may have
    /// Secrets cached for them at all.
    pub(crate) fn new(
        client: kube::Client,
        ttl: DecisionTtl,
        secrets_tenants: impl IntoIterator<Item = String>,
    ) -> Self {
        AccessReviewAuthorizer {
            api: Api::all(client),
            ttl,
            secrets_tenants: secrets_tenants.into_iter().collect(),
            cache: Mutex::new(TtlCache::new(CACHE_ENTRIES)),
            metrics: None,
        }
    }

    /// Records each decision as a cache hit or a timed review in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: ReviewMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Secrets are cached for a tenant only if the configuration lists it.
    fn secrets_refused(&self, who: &Identity, group: &str, plural: &str) -> bool {
        group.is_empty() && plural == "secrets" && !self.secrets_tenants.contains(&who.tenant)
    }

    async fn verb_allowed(
        &self,
        who: &Identity,
        verb: &'static str,
        group: &str,
        plural: &str,
        namespace: &str,
    ) -> Result<bool, AuthzError> {
        let attributes = Attributes::Resource {
            verb,
            group: group.to_string(),
            plural: plural.to_string(),
            namespace: namespace.to_string(),
        };
        self.decide(who, attributes).await
    }

    /// The cached decision, or a SubjectAccessReview's.
    async fn decide(&self, who: &Identity, attributes: Attributes) -> Result<bool, AuthzError> {
        let key: DecisionKey = (who.username.clone(), who.uid.clone(), attributes);
        let now = Instant::now();
        if let Some(hit) = self.cache.lock().get(&key, now) {
            if let Some(m) = &self.metrics {
                m.hit();
            }
            return Ok(hit);
        }
        let allowed = self.review(who, &key.2).await;
        if let Some(m) = &self.metrics {
            m.reviewed(now.elapsed());
        }
        let allowed = allowed?;
        let ttl = if allowed {
            self.ttl.allow
        } else {
            self.ttl.deny
        };
        self.cache.lock().insert(key, allowed, ttl, now);
        Ok(allowed)
    }

    /// What the API server says about `who` and `attributes`.
    async fn review(&self, who: &Identity, attributes: &Attributes) -> Result<bool, AuthzError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.username.clone()),
                uid: (!who.uid.is_empty()).then(|| who.uid.clone()),
                groups: (!who.groups.is_empty()).then(|| who.groups.clone()),
                resource_attributes: attributes.resource(),
                non_resource_attributes: attributes.non_resource(),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = self
            .api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthzError::Unavailable(e.to_string()))?;
        Ok(answer
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true)))
    }
}

impl PathAuthorizer for AccessReviewAuthorizer {
    fn path_allowed<'a>(
        &'a self,
        who: &'a Identity,
        verb: &'static str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthzError>> {
        let attributes = Attributes::Path {
            verb,
            path: path.to_string(),
        };
        Box::pin(self.decide(who, attributes))
    }
}

impl Authorizer for AccessReviewAuthorizer {
    fn refused_outright(&self, who: &Identity, group: &str, plural: &str) -> bool {
        self.secrets_refused(who, group, plural)
    }

    fn deny_ttl(&self) -> Duration {
        self.ttl.deny
    }

    fn allowed<'a>(
        &'a self,
        who: &'a Identity,
        access: Access,
        group: &'a str,
        plural: &'a str,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthzError>> {
        Box::pin(async move {
            if self.secrets_refused(who, group, plural) {
                return Ok(false);
            }
            for verb in access.verbs() {
                if !self
                    .verb_allowed(who, verb, group, plural, namespace)
                    .await?
                {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }
}
