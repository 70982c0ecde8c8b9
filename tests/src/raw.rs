//! Raw HTTPS access to devcluster, for what kube-rs would hide: exact status codes, bodies,
//! content types and watch streams.

use reqwest::Method;
use serde_json::Value;
use std::time::Duration;

use crate::wait::within;

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
    pub fn new(base: &str, token: &str, roots: Option<&[Vec<u8>]>) -> anyhow::Result<Self> {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse()?,
        );
        let mut builder = reqwest::Client::builder().default_headers(headers);
        for der in roots.unwrap_or_default() {
            builder = builder.add_root_certificate(reqwest::Certificate::from_der(der)?);
        }
        Ok(RawApi {
            http: builder.build()?,
            base: base.trim_end_matches('/').to_string(),
        })
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
