//! An OTLP/gRPC trace receiver in the harness process. The managers export to it, so that
//! tracing is on for real (requests carry a `traceparent` only when the manager traces), and
//! SDKs that export spans may use it too. It only counts what it receives: the trace check
//! reads the controllers' reports, which every language can write.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The receiver; it stops when dropped.
pub struct OtlpSink {
    spans: Arc<AtomicU64>,
    endpoint: String,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Counter(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Counter {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let n: usize = request
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .map(|ss| ss.spans.len())
            .sum();
        self.0
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl OtlpSink {
    /// Serves on a loopback port.
    pub async fn start() -> std::io::Result<OtlpSink> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let spans = Arc::new(AtomicU64::new(0));
        let service = TraceServiceServer::new(Counter(spans.clone()));
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Ok(OtlpSink {
            spans,
            endpoint,
            task,
        })
    }

    /// The URL for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Spans received so far.
    pub fn spans(&self) -> u64 {
        self.spans.load(Ordering::Relaxed)
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}
