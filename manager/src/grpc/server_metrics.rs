//! The gRPC server's own metrics (`grpc_server_*`, as go-grpc-prometheus names them), counted
//! by a tower layer on the tonic server: a call is started when its request arrives and handled
//! when its response ends, with the status code from the trailers (or the headers of a
//! trailers-only answer); a response dropped before it ended was cancelled by the client.
//! A stream's lifetime is never observed as latency (see [`crate::metrics::grpc`]).
//!
//! Methods are looked up in a table built from the descriptor sets of the services the port
//! serves, so labels are bounded: an unknown path is `unknown`.

use crate::metrics::Metrics;
use crate::metrics::grpc::{GrpcMethod, GrpcServerMetrics};
use futures::future::BoxFuture;
use prost::Message as _;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// A method the port serves, as its series label it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Known {
    kind: &'static str,
    service: String,
    method: String,
}

impl Known {
    fn labels(&self) -> GrpcMethod<'_> {
        GrpcMethod {
            kind: self.kind,
            service: &self.service,
            method: &self.method,
        }
    }
}

/// `/package.Service/Method` → the method, for every service of the gRPC port.
#[derive(Debug, Default)]
struct MethodTable {
    by_path: HashMap<String, Known>,
}

impl MethodTable {
    /// The methods of ctrlhub.v1, grpc.health.v1 and server reflection (v1 and v1alpha).
    fn served() -> Self {
        let mut table = MethodTable::default();
        for set in [
            ctrlhub_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ] {
            // Compiled into the binary: a set that does not decode adds nothing rather than
            // stopping the server (its calls are then counted as unknown).
            if let Ok(set) = prost_types::FileDescriptorSet::decode(set) {
                table.add(&set);
            }
        }
        table
    }

    fn add(&mut self, set: &prost_types::FileDescriptorSet) {
        for file in &set.file {
            let package = file.package();
            for service in &file.service {
                let name = if package.is_empty() {
                    service.name().to_owned()
                } else {
                    format!("{package}.{}", service.name())
                };
                for m in &service.method {
                    let kind = match (m.client_streaming(), m.server_streaming()) {
                        (false, false) => "unary",
                        (true, false) => "client_stream",
                        (false, true) => "server_stream",
                        (true, true) => "bidi_stream",
                    };
                    self.by_path.insert(
                        format!("/{name}/{}", m.name()),
                        Known {
                            kind,
                            service: name.clone(),
                            method: m.name().to_owned(),
                        },
                    );
                }
            }
        }
    }
}

/// What a path nobody serves is counted as.
fn unknown() -> Known {
    Known {
        kind: "unary",
        service: "unknown".into(),
        method: "unknown".into(),
    }
}

/// Counts and times the calls of the gRPC server.
#[derive(Clone)]
pub(crate) struct ServerMetricsLayer {
    table: Arc<MethodTable>,
    metrics: GrpcServerMetrics,
}

impl ServerMetricsLayer {
    /// Records into `metrics`; every served method's series exist at 0 from now on.
    pub(crate) fn new(metrics: &Metrics) -> Self {
        let table = MethodTable::served();
        for known in table.by_path.values() {
            metrics.grpc.preinitialise(known.labels());
        }
        ServerMetricsLayer {
            table: Arc::new(table),
            metrics: metrics.grpc.clone(),
        }
    }
}

impl<S> tower::Layer<S> for ServerMetricsLayer {
    type Service = ServerMetrics<S>;

    fn layer(&self, inner: S) -> ServerMetrics<S> {
        ServerMetrics {
            inner,
            table: self.table.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The service of [`ServerMetricsLayer`].
#[derive(Clone)]
pub(crate) struct ServerMetrics<S> {
    inner: S,
    table: Arc<MethodTable>,
    metrics: GrpcServerMetrics,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for ServerMetrics<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: http_body::Body + Send + 'static,
{
    type Response = http::Response<Observed<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let known = self
            .table
            .by_path
            .get(req.uri().path())
            .cloned()
            .unwrap_or_else(unknown);
        self.metrics.started(known.labels());
        let call = Call {
            known,
            metrics: self.metrics.clone(),
            started: Instant::now(),
        };
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            // A trailers-only answer (an error before any message) has its code in the headers.
            let code = response.headers().get("grpc-status").map(code_name);
            let mut pending = Some(call);
            if let Some(code) = code
                && let Some(call) = pending.take()
            {
                call.end(code);
            }
            Ok(response.map(|body| Observed {
                inner: Box::pin(body),
                pending,
            }))
        })
    }
}

/// A call whose end is still to be counted.
struct Call {
    known: Known,
    metrics: GrpcServerMetrics,
    started: Instant,
}

impl Call {
    fn end(self, code: &str) {
        self.metrics
            .handled(self.known.labels(), code, self.started.elapsed());
    }
}

/// A response body that counts its call as handled when the trailers arrive with the status, or
/// as cancelled when it is dropped before.
pub(crate) struct Observed<B> {
    inner: Pin<Box<B>>,
    pending: Option<Call>,
}

impl<B: http_body::Body> http_body::Body for Observed<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = self.inner.as_mut().poll_frame(cx);
        let code = match &polled {
            Poll::Ready(Some(Ok(frame))) => frame
                .trailers_ref()
                .and_then(|t| t.get("grpc-status"))
                .map(code_name),
            Poll::Ready(Some(Err(_))) => Some("Unknown"),
            // The end without trailers: no status was sent.
            Poll::Ready(None) => Some("Unknown"),
            Poll::Pending => None,
        };
        if let Some(code) = code
            && let Some(call) = self.pending.take()
        {
            call.end(code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Observed<B> {
    fn drop(&mut self) {
        if let Some(call) = self.pending.take() {
            call.end("Canceled");
        }
    }
}

/// go-grpc-prometheus' name for a `grpc-status` value (grpc-go's `codes.Code.String()`).
fn code_name(value: &http::HeaderValue) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .and_then(|n| NAMES.get(n).copied())
        .unwrap_or("Unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_knows_every_served_method_and_its_kind() {
        let table = MethodTable::served();
        let kind = |path: &str| table.by_path.get(path).map(|k| k.kind);
        assert_eq!(
            kind("/ctrlhub.v1.ControllerManager/Connect"),
            Some("bidi_stream")
        );
        assert_eq!(kind("/ctrlhub.v1.ControllerManager/Get"), Some("unary"));
        assert_eq!(kind("/grpc.health.v1.Health/Check"), Some("unary"));
        assert_eq!(kind("/grpc.health.v1.Health/Watch"), Some("server_stream"));
        assert_eq!(
            kind("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            Some("bidi_stream")
        );
        assert_eq!(kind("/evil/path-1234"), None);
    }

    #[test]
    fn codes_have_grpc_go_names() {
        let name = |v: &'static str| code_name(&http::HeaderValue::from_static(v));
        assert_eq!(name("0"), "OK");
        assert_eq!(name("1"), "Canceled");
        assert_eq!(name("14"), "Unavailable");
        assert_eq!(name("16"), "Unauthenticated");
        assert_eq!(name("99"), "Unknown");
        assert_eq!(name("x"), "Unknown");
    }
}
