//! Starting, addressing and stopping a devcluster: the listener, TLS, and the handle tests hold.

use crate::Error;
use crate::auth::authn::{AuthCounts, Authenticator};
use crate::faults::{Faults, Stats};
use crate::http::{self, App, serve, tls};
use crate::storage::Store;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How to run a devcluster.
#[derive(Debug, Clone)]
pub struct Options {
    /// Address to listen on; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Serve HTTPS with a generated CA (true) or plain HTTP.
    pub tls: bool,
    /// Interval of bookmarks on watches that allow them.
    pub bookmark_interval: Duration,
    /// How many events the watch history keeps before resumes from older versions get 410.
    pub history_limit: usize,
    /// The admin's bearer token (a `system:masters` member; the generated kubeconfig uses it).
    pub token: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: true,
            bookmark_interval: Duration::from_secs(5),
            history_limit: 10_000,
            token: "devcluster-admin".into(),
        }
    }
}

/// A running devcluster. Dropping it (or [`DevCluster::shutdown`]) stops the server.
pub struct DevCluster {
    addr: SocketAddr,
    url: String,
    kubeconfig: String,
    ca_pem: Option<String>,
    store: Store,
    auth: Arc<Authenticator>,
    faults: Faults,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl DevCluster {
    /// Bind, generate certificates and start serving; returns once requests are accepted.
    pub async fn start(opts: Options) -> Result<DevCluster, Error> {
        let listener = TcpListener::bind(opts.listen).await.map_err(Error::Bind)?;
        let addr = listener.local_addr().map_err(Error::Bind)?;
        let scheme = if opts.tls { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");
        let store = Store::new(opts.history_limit);
        let faults = Faults::new(store.clone());
        let shutdown = CancellationToken::new();
        let auth = Arc::new(Authenticator::new(opts.token.clone()));
        let app = Arc::new(App {
            store: store.clone(),
            faults: faults.clone(),
            auth: auth.clone(),
            bookmark_interval: opts.bookmark_interval,
            shutdown: shutdown.clone(),
            address: addr.to_string(),
        });
        let router = http::router(app);
        let (acceptor, ca_pem) = if opts.tls {
            let certs = tls::generate(addr.ip()).map_err(|e| Error::Tls(e.to_string()))?;
            (Some(serve::acceptor(&certs)?), Some(certs.ca_pem))
        } else {
            (None, None)
        };
        let kubeconfig = tls::kubeconfig(&url, ca_pem.as_deref(), "devcluster-admin", &opts.token);
        let task = serve::spawn(listener, router, acceptor, shutdown.clone());
        Ok(DevCluster {
            addr,
            url,
            kubeconfig,
            ca_pem,
            store,
            auth,
            faults,
            shutdown,
            task: Some(task),
        })
    }

    /// The server's base URL, e.g. `https://127.0.0.1:40123`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig (YAML) for this server: CA embedded, token auth, context `devcluster`.
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig.clone()
    }

    /// Write the kubeconfig to a file.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, &self.kubeconfig)
    }

    /// A kube-rs `Config` for this server.
    pub async fn kube_config(&self) -> Result<kube::Config, Error> {
        config_from_yaml(&self.kubeconfig).await
    }

    /// A kube-rs `Client` for this server.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        kube::Client::try_from(self.kube_config().await?).map_err(|e| Error::Client(e.to_string()))
    }

    /// Mint a ServiceAccount token, as the TokenRequest API does but with any lifetime (even
    /// zero, for "expired token" tests) and no 10-minute minimum. Empty `audiences` means the
    /// API server's own (`https://kubernetes.default.svc`), which API requests require.
    pub fn issue_token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[&str],
        ttl: Duration,
    ) -> Result<String, Error> {
        let audiences = audiences.iter().map(|a| a.to_string()).collect();
        let (token, _) = self
            .auth
            .mint(&self.store, namespace, service_account, audiences, ttl)?;
        Ok(token)
    }

    /// A kubeconfig (YAML) like [`DevCluster::kubeconfig_yaml`] but authenticating with `token`,
    /// so kubectl can act as a ServiceAccount.
    pub fn kubeconfig_yaml_for_token(&self, token: &str) -> String {
        tls::kubeconfig(&self.url, self.ca_pem.as_deref(), "token-user", token)
    }

    /// A kube-rs `Config` authenticating with `token`.
    pub async fn kube_config_for_token(&self, token: &str) -> Result<kube::Config, Error> {
        config_from_yaml(&self.kubeconfig_yaml_for_token(token)).await
    }

    /// A kube-rs `Client` authenticating with `token`.
    pub async fn client_for_token(&self, token: &str) -> Result<kube::Client, Error> {
        kube::Client::try_from(self.kube_config_for_token(token).await?)
            .map_err(|e| Error::Client(e.to_string()))
    }

    /// How many requests authenticated, were rejected with 401, were allowed and were
    /// forbidden (403) so far.
    pub fn auth_stats(&self) -> AuthCounts {
        self.auth.stats.counts()
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// Request counters.
    pub fn stats(&self) -> Stats {
        self.faults.stats()
    }

    /// Stop accepting, end every watch and wait for the accept loop to finish.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn config_from_yaml(yaml: &str) -> Result<kube::Config, Error> {
    let kc = kube::config::Kubeconfig::from_yaml(yaml).map_err(|e| Error::Client(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Client(e.to_string()))
}
