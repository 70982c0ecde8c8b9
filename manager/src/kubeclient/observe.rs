//! The tower layer that counts and times every request of a Kubernetes client
//! (`rest_client_requests_total`, `rest_client_request_duration_seconds`).

use crate::metrics::api::ApiClientMetrics;
use futures::future::BoxFuture;
use http::{Method, Request, Response, Uri};
use std::task::{Context, Poll};
use std::time::Instant;

/// Wraps a client's service so that each request is observed when its response headers
/// arrive (a watch: when it starts) or it fails.
#[derive(Clone)]
pub(crate) struct ObserveLayer {
    metrics: ApiClientMetrics,
}

impl ObserveLayer {
    /// Observes into `metrics`.
    pub(crate) fn new(metrics: &ApiClientMetrics) -> Self {
        ObserveLayer {
            metrics: metrics.clone(),
        }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service of [`ObserveLayer`].
pub(crate) struct Observe<S> {
    inner: S,
    metrics: ApiClientMetrics,
}

impl<S, B, R> tower::Service<Request<B>> for Observe<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (verb, resource) = classify(req.method(), req.uri());
        let mut attempt = Attempt {
            metrics: self.metrics.clone(),
            verb,
            resource,
            started: Instant::now(),
            recorded: false,
        };
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            match &result {
                Ok(r) => attempt.record(r.status().as_str()),
                Err(_) => attempt.record("<error>"),
            }
            result
        })
    }
}

/// One request on its way: recorded when it is answered, or as `<error>` when its caller gives
/// up on it first (a timeout), so a hung API server still shows.
struct Attempt {
    metrics: ApiClientMetrics,
    verb: &'static str,
    resource: String,
    started: Instant,
    recorded: bool,
}

impl Attempt {
    fn record(&mut self, code: &str) {
        self.recorded = true;
        self.metrics
            .observe(self.verb, &self.resource, code, self.started.elapsed());
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.recorded {
            self.record("<error>");
        }
    }
}

/// The verb and resource labels of a request: the verb from the method, with a GET told apart
/// as GET (one object), LIST (a collection) or WATCH; the resource is the plural of the path
/// (`/api/v1/namespaces/ns/configmaps/x` is `configmaps`), `discovery` for the group, version
/// and OpenAPI documents, `other` for anything else. Never a name or a namespace.
pub(crate) fn classify(method: &Method, uri: &Uri) -> (&'static str, String) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let Some(mut rest) = resource_path(&segments) else {
        let resource = match segments.first() {
            Some(&("api" | "apis" | "version" | "openapi")) | None => "discovery",
            Some(_) => "other",
        };
        return (verb(method, false, false), resource.to_owned());
    };
    // The old `/watch/` path form.
    let watch_path = rest.first() == Some(&"watch");
    if watch_path {
        rest = &rest[1..];
    }
    let (resource, named) = match rest {
        // A namespace's own subresources (`/namespaces/x/status`, `/finalize`).
        ["namespaces", _, "status" | "finalize"] => ("namespaces", true),
        ["namespaces", _, resource, more @ ..] => (*resource, !more.is_empty()),
        [resource, more @ ..] => (*resource, !more.is_empty()),
        [] => ("discovery", false),
    };
    let watch = watch_path || query_says_watch(uri.query().unwrap_or(""));
    (verb(method, named, watch), resource.to_owned())
}

/// The part of the path after `/api/v1` or `/apis/<group>/<version>`; None when the path does
/// not go on past them (discovery) or is not an API path at all.
fn resource_path<'a>(segments: &'a [&'a str]) -> Option<&'a [&'a str]> {
    let rest = match segments {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    (!rest.is_empty()).then_some(rest)
}

fn query_says_watch(query: &str) -> bool {
    query
        .split('&')
        .any(|kv| matches!(kv, "watch=true" | "watch=1"))
}

fn verb(method: &Method, named: bool, watch: bool) -> &'static str {
    match *method {
        Method::GET if watch => "WATCH",
        Method::GET if named => "GET",
        Method::GET => "LIST",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(method: Method, uri: &str) -> (&'static str, String) {
        classify(&method, &uri.parse().expect("uri"))
    }

    #[test]
    fn verbs_tell_get_list_and_watch_apart_and_resources_are_plurals_only() {
        let cases = [
            (
                Method::GET,
                "/api/v1/namespaces/team-a/configmaps/x",
                ("GET", "configmaps"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/team-a/configmaps?limit=100",
                ("LIST", "configmaps"),
            ),
            (
                Method::GET,
                "/api/v1/configmaps?watch=true&resourceVersion=5",
                ("WATCH", "configmaps"),
            ),
            (
                Method::GET,
                "/apis/apps/v1/namespaces/x/deployments?watch=1",
                ("WATCH", "deployments"),
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/x/pods",
                ("WATCH", "pods"),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/ctrlhub",
                ("PUT", "leases"),
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/x/pods/p-1",
                ("PATCH", "pods"),
            ),
            (
                Method::PUT,
                "/apis/cache.example.com/v1/namespaces/x/memcacheds/m/status",
                ("PUT", "memcacheds"),
            ),
            (
                Method::POST,
                "/apis/authentication.k8s.io/v1/tokenreviews",
                ("POST", "tokenreviews"),
            ),
            (Method::GET, "/api/v1/namespaces", ("LIST", "namespaces")),
            (
                Method::GET,
                "/api/v1/namespaces/team-a",
                ("GET", "namespaces"),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/team-a/finalize",
                ("PUT", "namespaces"),
            ),
            (Method::GET, "/apis/example.com/v1", ("LIST", "discovery")),
            (Method::GET, "/apis", ("LIST", "discovery")),
            (Method::GET, "/version", ("LIST", "discovery")),
            (Method::GET, "/healthz", ("LIST", "other")),
            (
                Method::DELETE,
                "/api/v1/namespaces/x/configmaps/c",
                ("DELETE", "configmaps"),
            ),
        ];
        for (method, uri, (verb, resource)) in cases {
            assert_eq!(label(method, uri), (verb, resource.to_owned()), "{uri}");
        }
    }
}
