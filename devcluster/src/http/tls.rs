//! A certificate authority generated at start, the serving certificate it signs, and the
//! kubeconfig that trusts it — so clients verify TLS exactly as against a real cluster.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};
use std::net::IpAddr;

/// The generated CA and serving certificate, PEM-encoded.
pub(crate) struct Certs {
    /// CA certificate (goes into the kubeconfig as certificate-authority-data).
    pub(crate) ca_pem: String,
    /// Serving certificate chain.
    pub(crate) cert_pem: String,
    /// Serving private key.
    pub(crate) key_pem: String,
}

/// Generate a CA and a serving certificate for `ip`, `localhost` and `127.0.0.1`.
pub(crate) fn generate(ip: IpAddr) -> Result<Certs, rcgen::Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "devcluster-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate()?;
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let mut params = CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes.default.svc".to_string(),
    ])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "devcluster");
    params.subject_alt_names.push(SanType::IpAddress(ip));
    let loopback: IpAddr = [127, 0, 0, 1].into();
    if ip != loopback {
        params.subject_alt_names.push(SanType::IpAddress(loopback));
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(Certs {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A kubeconfig for `server`, trusting `ca_pem` (when serving HTTPS) and authenticating as
/// kubeconfig user `user` with bearer `token`.
pub(crate) fn kubeconfig(server: &str, ca_pem: Option<&str>, user: &str, token: &str) -> String {
    use base64::Engine;
    let ca_line = match ca_pem {
        Some(pem) => format!(
            "    certificate-authority-data: {}\n",
            base64::engine::general_purpose::STANDARD.encode(pem)
        ),
        None => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: devcluster\n  cluster:\n    server: {server}\n{ca_line}users:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: devcluster\n  context:\n    cluster: devcluster\n    user: {user}\n    namespace: default\ncurrent-context: devcluster\npreferences: {{}}\n"
    )
}
