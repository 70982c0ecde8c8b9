//! Shared helpers for the ctrlhub conformance suites.
//!
//! Every suite starts its own [`devcluster::DevCluster`] (one per test), talks to it
//! through kube-rs, through raw HTTPS (see [`RawApi`]) or through external clients
//! (kubectl, the Python client), and waits on observable conditions with
//! [`wait_until`] instead of sleeping and hoping.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use devcluster::{DevCluster, Options};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{CustomResource, CustomResourceExt};
use reqwest::Method;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The generous default timeout every suite uses when waiting for a condition.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// How often [`wait_until`] re-runs its probe.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Installs a tracing subscriber honouring `RUST_LOG` (once per process; later calls are no-ops).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A running devcluster together with the clients the suites use against it.
pub struct TestCluster {
    /// The running in-memory API server.
    pub dc: DevCluster,
    /// A kube-rs client configured from the cluster's kubeconfig (HTTPS, token auth).
    pub client: kube::Client,
    /// A raw HTTP client for checks that kube-rs would hide.
    pub raw: RawApi,
    /// Path of a kubeconfig file for external clients (kubectl, Python).
    pub kubeconfig: PathBuf,
    /// Keeps the kubeconfig's temporary directory alive.
    pub dir: tempfile::TempDir,
}

impl TestCluster {
    /// Raw HTTPS access like [`TestCluster::raw`] but authenticating with `token`
    /// (e.g. a ServiceAccount token from [`DevCluster::issue_token`]).
    pub async fn raw_as(&self, token: &str) -> RawApi {
        let config = self.dc.kube_config().await.expect("devcluster kube config");
        RawApi::new(&self.dc.url(), token, config.root_cert.as_deref())
    }

    /// A typed namespaced API handle in namespace `ns`.
    pub fn api<K>(&self, ns: &str) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), ns)
    }
}

/// Starts a devcluster with default options (HTTPS, token auth).
pub async fn start_cluster() -> TestCluster {
    start_cluster_with(Options::default()).await
}

/// Starts a devcluster with the given options and builds kube-rs and raw HTTP clients for it.
pub async fn start_cluster_with(opts: Options) -> TestCluster {
    init_tracing();
    let token = opts.token.clone();
    let dc = DevCluster::start(opts)
        .await
        .expect("devcluster failed to start");
    let client = dc.client().await.expect("devcluster kube client");
    let config = dc.kube_config().await.expect("devcluster kube config");
    let raw = RawApi::new(&dc.url(), &token, config.root_cert.as_deref());
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    dc.write_kubeconfig(&kubeconfig).expect("write kubeconfig");
    TestCluster {
        dc,
        client,
        raw,
        kubeconfig,
        dir,
    }
}

/// Polls `probe` every [`POLL_INTERVAL`] until it returns `Ok`, and returns that value.
///
/// The probe's `Err` carries a description of what it saw last; it is included in the
/// panic message when `timeout` passes without success, so a failure says why.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(last) => {
                if Instant::now() >= deadline {
                    panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Runs `fut` with a [`TIMEOUT`]-style deadline, panicking with `what` if it does not finish.
pub async fn within<T>(what: &str, timeout: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(timeout, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {timeout:?}: {what}"),
    }
}

/// A response from [`RawApi`]: HTTP status code and the body parsed as JSON
/// (`Value::Null` when empty, `Value::String` when not JSON).
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// HTTP status code.
    pub status: u16,
    /// Parsed body.
    pub body: Value,
}

/// Raw HTTPS access to the devcluster, trusting its CA and sending its bearer token.
#[derive(Clone)]
pub struct RawApi {
    http: reqwest::Client,
    base: String,
}

impl RawApi {
    /// Builds a client for `base` (e.g. `https://127.0.0.1:PORT`) that trusts the given
    /// DER certificates (the kubeconfig's CA) and authenticates with `token`.
    pub fn new(base: &str, token: &str, roots: Option<&[Vec<u8>]>) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("header value"),
        );
        let mut builder = reqwest::Client::builder().default_headers(headers);
        for der in roots.unwrap_or_default() {
            builder =
                builder.add_root_certificate(reqwest::Certificate::from_der(der).expect("CA cert"));
        }
        RawApi {
            http: builder.build().expect("reqwest client"),
            base: base.trim_end_matches('/').to_string(),
        }
    }

    /// The underlying reqwest client (carries the bearer token by default).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Absolute URL for an API path such as `/api/v1/namespaces`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends a request with an optional JSON body and content type.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> RawResponse {
        let mut req = self
            .http
            .request(method.clone(), self.url(path))
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(body) = body {
            req = req
                .header(
                    reqwest::header::CONTENT_TYPE,
                    content_type.unwrap_or("application/json"),
                )
                .body(serde_json::to_vec(body).expect("serialize body"));
        }
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path} failed to send: {e}"));
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("response body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        RawResponse { status, body }
    }

    /// GET `path`.
    pub async fn get(&self, path: &str) -> RawResponse {
        self.request(Method::GET, path, None, None).await
    }

    /// POST `body` as JSON to `path`.
    pub async fn post(&self, path: &str, body: &Value) -> RawResponse {
        self.request(Method::POST, path, None, Some(body)).await
    }

    /// PUT `body` as JSON to `path`.
    pub async fn put(&self, path: &str, body: &Value) -> RawResponse {
        self.request(Method::PUT, path, None, Some(body)).await
    }

    /// PATCH `path` with `body` using the given patch content type.
    pub async fn patch(&self, path: &str, content_type: &str, body: &Value) -> RawResponse {
        self.request(Method::PATCH, path, Some(content_type), Some(body))
            .await
    }

    /// DELETE `path`, optionally with DeleteOptions in the body.
    pub async fn delete(&self, path: &str, options: Option<&Value>) -> RawResponse {
        self.request(Method::DELETE, path, None, options).await
    }

    /// Opens a streaming GET (a watch) on `path` (which should carry `watch=true` or similar).
    pub async fn watch(&self, path: &str) -> RawWatch {
        let resp = self
            .http
            .get(self.url(path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("watch {path} failed to send: {e}"));
        RawWatch {
            status: resp.status().as_u16(),
            resp,
            buf: Vec::new(),
        }
    }
}

/// A raw watch stream: newline-delimited JSON events read incrementally.
pub struct RawWatch {
    /// HTTP status code of the watch response.
    pub status: u16,
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl RawWatch {
    /// The next event, or `None` when the server ended the stream.
    /// Panics if no event arrives within `timeout`.
    pub async fn next_event(&mut self, timeout: Duration) -> Option<Value> {
        within("next watch event", timeout, self.next_inner()).await
    }

    /// The next event if one arrives within `wait`; `Ok(None)` on end of stream,
    /// `Err(())` when nothing arrived in time (the stream stays usable).
    pub async fn try_next_event(&mut self, wait: Duration) -> Result<Option<Value>, ()> {
        tokio::time::timeout(wait, self.next_inner())
            .await
            .map_err(|_| ())
    }

    async fn next_inner(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let line = &line[..line.len() - 1];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(serde_json::from_slice(line).unwrap_or_else(|e| {
                    panic!(
                        "watch line is not JSON ({e}): {}",
                        String::from_utf8_lossy(line)
                    )
                }));
            }
            match self.resp.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) | Err(_) => {
                    if self.buf.iter().all(u8::is_ascii_whitespace) {
                        return None;
                    }
                    let rest = std::mem::take(&mut self.buf);
                    return Some(serde_json::from_slice(&rest).unwrap_or_else(|e| {
                        panic!(
                            "trailing watch data is not JSON ({e}): {}",
                            String::from_utf8_lossy(&rest)
                        )
                    }));
                }
            }
        }
    }
}

/// Spec of the [`Widget`] test custom resource.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "conformance.ctrlhub.dev",
    version = "v1",
    kind = "Widget",
    plural = "widgets",
    namespaced,
    status = "WidgetStatus",
    shortname = "wdg",
    doc = "A namespaced test custom resource with a status subresource."
)]
pub struct WidgetSpec {
    /// Desired size.
    pub size: i32,
    /// Optional colour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
}

/// Status of the [`Widget`] test custom resource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WidgetStatus {
    /// Set by a controller once it has seen the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// The spec size the controller last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_size: Option<i32>,
}

/// Creates the [`Widget`] CRD through kube-rs and waits until the resource is served.
pub async fn install_widget_crd(client: &kube::Client) -> CustomResourceDefinition {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .create(&PostParams::default(), &Widget::crd())
        .await
        .expect("create Widget CRD");
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    wait_until("Widget CRD to be served", TIMEOUT, || async {
        widgets
            .list(&Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    crd
}

/// A new [`Widget`] named `name` with the given size.
pub fn widget(name: &str, size: i32) -> Widget {
    let mut w = Widget::new(name, WidgetSpec { size, color: None });
    w.metadata.namespace = Some("default".into());
    w
}

/// `metadata.resourceVersion` of a JSON object, panicking when absent.
pub fn rv_of(obj: &Value) -> String {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no metadata.resourceVersion in {obj}"))
        .to_string()
}

/// Parses a resourceVersion as an integer (devcluster, like etcd, uses a global counter).
pub fn rv_num(rv: &str) -> u64 {
    rv.parse()
        .unwrap_or_else(|_| panic!("resourceVersion {rv:?} is not numeric"))
}
