//! Which namespaces an identity may read, one at a time: the [`NamespaceGate`] a namespace label
//! selector scope uses when its identity has no cluster-wide grant, answered by the
//! [`Authorizer`] (SubjectAccessReview under RBAC).

use super::{Access, Authorizer, AuthzError, BoxFuture, Identity, NamespaceGate};
use std::sync::Arc;
use std::time::Duration;

/// Admits a namespace into a label-selector scope when the registering identity may list and
/// watch every resource of the registration there: the same check a registration naming that
/// namespace passes, made as the namespace enters the scope instead of up front.
pub(crate) struct RbacNamespaceGate {
    authz: Arc<dyn Authorizer>,
    who: Identity,
    /// (group, plural) of each watched resource.
    resources: Vec<(String, String)>,
}

impl RbacNamespaceGate {
    /// A gate for `who`, who must be allowed to list and watch each of `resources` (group,
    /// plural) in a namespace for it to enter.
    pub(crate) fn new(
        authz: Arc<dyn Authorizer>,
        who: Identity,
        resources: Vec<(String, String)>,
    ) -> Self {
        RbacNamespaceGate {
            authz,
            who,
            resources,
        }
    }
}

impl NamespaceGate for RbacNamespaceGate {
    fn admit<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<bool, AuthzError>> {
        Box::pin(async move {
            for (group, plural) in &self.resources {
                if !self
                    .authz
                    .allowed(&self.who, Access::Watch, group, plural, namespace)
                    .await?
                {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    fn retry_after(&self) -> Duration {
        // A deny is cached this long: asking sooner would get the cached answer.
        self.authz.deny_ttl()
    }
}
