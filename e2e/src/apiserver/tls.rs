//! Optional HTTPS: a fresh self-signed CA and a server certificate for the listen address,
//! served with rustls (ring provider). The CA goes into the kubeconfig.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

/// Why TLS setup failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Certificate generation failed.
    #[error("generate certificate: {0}")]
    Cert(#[from] rcgen::Error),
    /// rustls rejected the configuration.
    #[error("rustls config: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Server TLS material.
#[derive(Clone)]
pub struct Tls {
    /// PEM of the CA that signed the server certificate.
    pub ca_pem: String,
    /// Acceptor for incoming connections.
    pub acceptor: TlsAcceptor,
}

/// Generates a CA and a server certificate valid for `localhost`, `127.0.0.1` and `ip`.
pub fn generate(ip: IpAddr) -> Result<Tls, TlsError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "plexus-test-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut sans = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if !ip.is_unspecified() && !ip.is_loopback() {
        sans.push(ip.to_string());
    }
    let mut params = CertificateParams::new(sans)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "plexus-test-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone(), ca.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls {
        ca_pem: ca.pem(),
        acceptor: TlsAcceptor::from(Arc::new(cfg)),
    })
}
