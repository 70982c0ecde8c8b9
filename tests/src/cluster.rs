//! devcluster in process, with the clients the suites and the benchmark harness use against it:
//! kube-rs, raw HTTPS, and a kubeconfig file for child processes (kubectl, the manager, Python).

use anyhow::{Context, Result};
use devcluster::{DevCluster, Options};
use kube::api::Api;
use std::path::PathBuf;

use crate::raw::RawApi;

/// Installs a tracing subscriber honouring `RUST_LOG` (once per process; later calls are no-ops).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A running devcluster together with the clients used against it.
pub struct Cluster {
    /// The running in-memory API server.
    pub dc: DevCluster,
    /// A kube-rs client configured from the cluster's kubeconfig (HTTPS, token auth).
    pub client: kube::Client,
    /// A raw HTTP client for checks that kube-rs would hide.
    pub raw: RawApi,
    /// Path of a kubeconfig file for child processes (kubectl, Python, the manager).
    pub kubeconfig: PathBuf,
    /// Keeps the kubeconfig's temporary directory alive; tests may put their own files in it.
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts a devcluster with `opts` and builds the kube-rs and raw HTTP clients for it.
    pub async fn start(opts: Options) -> Result<Cluster> {
        let token = opts.token.clone();
        let dc = DevCluster::start(opts)
            .await
            .context("starting devcluster")?;
        let client = dc.client().await.context("devcluster kube client")?;
        let config = dc.kube_config().await.context("devcluster kube config")?;
        let raw = RawApi::new(&dc.url(), &token, config.root_cert.as_deref())?;
        let dir = tempfile::tempdir().context("kubeconfig directory")?;
        let kubeconfig = dir.path().join("kubeconfig");
        dc.write_kubeconfig(&kubeconfig)
            .context("writing the kubeconfig")?;
        Ok(Cluster {
            dc,
            client,
            raw,
            kubeconfig,
            dir,
        })
    }

    /// Raw HTTPS access like [`Cluster::raw`] but authenticating with `token`
    /// (e.g. a ServiceAccount token from [`DevCluster::issue_token`]).
    pub async fn raw_as(&self, token: &str) -> RawApi {
        let config = self.dc.kube_config().await.expect("devcluster kube config");
        RawApi::new(&self.dc.url(), token, config.root_cert.as_deref()).expect("raw client")
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
pub async fn start_cluster() -> Cluster {
    start_cluster_with(Options::default()).await
}

/// Starts a devcluster with the given options, with tracing on (see [`init_tracing`]).
pub async fn start_cluster_with(opts: Options) -> Cluster {
    init_tracing();
    Cluster::start(opts).await.expect("devcluster starts")
}
