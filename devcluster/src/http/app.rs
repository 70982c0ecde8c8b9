//! What every handler shares: the server's state ([`App`]) and the head of the request being
//! served ([`Request`]).

use crate::auth::authn::Authenticator;
use crate::faults::Faults;
use crate::storage::Store;
use axum::http::{HeaderMap, HeaderName, Method, header};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Shared state of the HTTP handlers.
pub(crate) struct App {
    /// The object store.
    pub(crate) store: Store,
    /// Fault injection and statistics.
    pub(crate) faults: Faults,
    /// Verifies bearer tokens (the admin's and ServiceAccount tokens) and mints the latter.
    pub(crate) auth: Arc<Authenticator>,
    /// How often watches with allowWatchBookmarks get a bookmark.
    pub(crate) bookmark_interval: Duration,
    /// Cancelled on shutdown; ends every watch.
    pub(crate) shutdown: CancellationToken,
    /// The address clients reach the server at (for `/api`'s serverAddressByClientCIDRs).
    pub(crate) address: String,
}

/// An HTTP request's head, as the steps read it.
pub(crate) struct Request {
    /// The HTTP method.
    pub(crate) method: Method,
    /// The URL path.
    pub(crate) path: String,
    /// The request headers.
    pub(crate) headers: HeaderMap,
    /// The query parameters.
    pub(crate) query: HashMap<String, String>,
}

impl Request {
    /// A header's value, if it is present and visible ASCII.
    pub(super) fn header(&self, name: HeaderName) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `Content-Type`, empty when absent.
    pub(super) fn content_type(&self) -> &str {
        self.header(header::CONTENT_TYPE).unwrap_or_default()
    }
}
