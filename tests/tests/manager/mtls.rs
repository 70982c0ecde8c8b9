//! Mutual TLS on the gRPC port (`--grpc-tls-cert`, `--grpc-tls-key`, `--grpc-client-ca`): the
//! real manager serving TLS, controllers presenting client certificates, real handshakes on
//! loopback. The bearer token still names the tenant; the certificate decides who may connect.

use ctrlhub_sdk::{Action, Config, Controller, ReconcileError, Request, TlsFiles};
use ctrlhub_tests::*;
use k8s_openapi::api::core::v1::ConfigMap;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A certificate authority for the test.
struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("ca key");
        Ca(CertifiedIssuer::self_signed(params, key).expect("ca certificate"))
    }

    fn pem(&self) -> String {
        self.0.pem()
    }

    /// A leaf certificate and key (PEM) for `name`, for serving or for a client.
    fn issue(&self, name: &str, server: bool) -> (String, String) {
        let sans = if server {
            vec!["localhost".to_string(), "127.0.0.1".to_string()]
        } else {
            Vec::new()
        };
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.0).expect("leaf certificate");
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).expect("pem written");
    path
}

/// A manager serving mutual TLS with certificates from `ca`; returns it with the CA's PEM.
struct Pki {
    ca: Ca,
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        Pki {
            ca: Ca::new("ctrlhub-test-ca"),
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    async fn manager(&self, c: &Cluster) -> Manager {
        let (cert, key) = self.ca.issue("ctrlhub", true);
        let cert = write(self.dir.path(), "tls.crt", &cert);
        let key = write(self.dir.path(), "tls.key", &key);
        let ca = write(self.dir.path(), "client-ca.pem", &self.ca.pem());
        let args = [
            "--grpc-tls-cert",
            cert.to_str().expect("utf-8 path"),
            "--grpc-tls-key",
            key.to_str().expect("utf-8 path"),
            "--grpc-client-ca",
            ca.to_str().expect("utf-8 path"),
        ];
        let m = Manager::start(c, "mtls", &args).await;
        m.wait_leading().await;
        m
    }

    /// The manager's `http://` gRPC address as `https://`.
    fn https(m: &Manager) -> String {
        m.grpc.replacen("http://", "https://", 1)
    }

    /// A TLS channel trusting the test CA, presenting `identity` if given.
    async fn channel(
        &self,
        m: &Manager,
        identity: Option<(String, String)>,
    ) -> Result<Channel, tonic::transport::Error> {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.ca.pem()))
            .domain_name("localhost");
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        Endpoint::from_shared(Self::https(m))
            .expect("endpoint")
            .tls_config(tls)?
            .connect()
            .await
    }
}

/// Connect and register over `channel`, or the error the handshake or the call ended with.
async fn register_over(
    channel: Result<Channel, tonic::transport::Error>,
) -> Result<Replica, String> {
    let channel = channel.map_err(|e| format!("connect: {e:?}"))?;
    Replica::connect_over(
        channel,
        register_configmaps("mtls", 4),
        Some("Bearer dev"),
        &[],
    )
    .await
    .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_admits_a_controller_with_a_certificate_from_the_client_ca() {
    let c = start_cluster().await;
    let pki = Pki::new();
    let m = pki.manager(&c).await;
    let mut r = register_over(pki.channel(&m, Some(pki.ca.issue("team-a", false))).await)
        .await
        .expect("a client certificate from the client CA is accepted");
    put_configmap(&c.client, "default", "over-tls", &[("k", "v")]).await;
    let req = r.expect().await;
    assert_eq!(key(&req), "default/over-tls");
    r.done(&req.id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_refuses_a_controller_without_a_client_certificate() {
    let c = start_cluster().await;
    let pki = Pki::new();
    let m = pki.manager(&c).await;
    let refused = register_over(pki.channel(&m, None).await).await;
    assert!(
        refused.is_err(),
        "a connection without a client certificate registered"
    );
    // Nor does plaintext get through on the TLS port.
    let plain = Replica::connect(&m.grpc, register_configmaps("mtls", 4)).await;
    assert!(plain.is_err(), "a plaintext connection registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_refuses_a_certificate_from_another_ca() {
    let c = start_cluster().await;
    let pki = Pki::new();
    let m = pki.manager(&c).await;
    let rogue = Ca::new("someone-else");
    let refused = register_over(pki.channel(&m, Some(rogue.issue("team-a", false))).await).await;
    assert!(
        refused.is_err(),
        "a certificate the client CA did not sign registered"
    );
}

async fn reconcile(
    req: Request<ConfigMap>,
    seen: Arc<tokio::sync::mpsc::UnboundedSender<String>>,
) -> Result<Action, ReconcileError> {
    let _ = seen.send(format!("{}/{}", req.key.namespace, req.key.name));
    Ok(Action::done())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sdk_connects_over_mutual_tls_from_its_pem_files() {
    let c = start_cluster().await;
    let pki = Pki::new();
    let m = pki.manager(&c).await;
    let (cert, key) = pki.ca.issue("team-a", false);
    let dir = pki.dir.path();
    let mut config = Config::new(Pki::https(&m), "dev");
    config.tls = Some(TlsFiles {
        ca: write(dir, "ca.pem", &pki.ca.pem()),
        cert: Some(write(dir, "client.crt", &cert)),
        key: Some(write(dir, "client.key", &key)),
        server_name: Some("localhost".into()),
    });
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let stop = ctrlhub_sdk::CancellationToken::new();
    let controller = tokio::spawn(Controller::new("sdk-mtls").reconciles::<ConfigMap>().run(
        config,
        reconcile,
        Arc::new(tx),
        stop.clone(),
    ));
    put_configmap(&c.client, "default", "via-sdk", &[("k", "v")]).await;
    let got = tokio::time::timeout(PATIENCE, async {
        while let Some(k) = seen.recv().await {
            if k == "default/via-sdk" {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        got,
        Ok(true),
        "the SDK controller never reconciled over TLS"
    );
    stop.cancel();
    let _ = controller.await;
}
