//! Real-TLS tests: a loopback rustls server with a test CA (testdata/, valid until 2126).

use std::sync::Arc;
use std::time::Instant;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;

use super::{ClientOptions, InClusterEnv, KubeClient, RetryPolicy};

const CA: &[u8] = include_bytes!("testdata/ca.crt");
const CERT: &[u8] = include_bytes!("testdata/server.crt");
const KEY: &[u8] = include_bytes!("testdata/server.key");

/// Request heads seen by the server.
type Heads = Arc<std::sync::Mutex<Vec<String>>>;

/// Serve every connection: read one request at a time, answer a fixed pod. Returns the port.
async fn start_tls_server() -> u16 {
    start_tls_server_recording().await.0
}

/// Like [`start_tls_server`], also returning the recorded request heads.
async fn start_tls_server_recording() -> (u16, Heads) {
    start_tls_server_with(None).await
}

/// The server, requiring a client certificate signed by `client_ca` when given.
async fn start_tls_server_with(client_ca: Option<&[u8]>) -> (u16, Heads) {
    let heads = Heads::default();
    let seen = heads.clone();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(CERT)
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(KEY).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap();
    let config = match client_ca {
        None => config.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                roots.add(cert.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                Arc::new(rustls::crypto::ring::default_provider()),
            )
            .build()
            .unwrap();
            config.with_client_cert_verifier(verifier)
        }
    }
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            sock.set_nodelay(true).unwrap();
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // Read the head, then the body (content-length), before answering.
                    let mut need = None;
                    while need.is_none_or(|n| buf.len() < n) {
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        if need.is_none() {
                            need = head_and_body_len(&buf);
                        }
                    }
                    let req: Vec<u8> = buf.drain(..need.unwrap_or(0)).collect();
                    seen.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&req).into_owned());
                    let body = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p1","namespace":"ns1","uid":"u1"}}"#;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let mut out = head.into_bytes();
                    out.extend_from_slice(body);
                    if tls.write_all(&out).await.is_err() || tls.flush().await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, heads)
}

/// Total request length (head + content-length body) once the head is complete.
fn head_and_body_len(buf: &[u8]) -> Option<usize> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let body = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    Some(end + body)
}

fn write_kubeconfig(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, CA).unwrap();
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: ca.crt\n\
             users:\n- name: u\n  user:\n    token: tok\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    path
}

/// HTTPS with a kubeconfig CA given as a relative path, the ring provider installed by us, a
/// GET on a fresh connection and a PATCH (head + body) on the reused one.
#[tokio::test]
async fn https_with_kubeconfig_ca() {
    let port = start_tls_server().await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_kubeconfig(dir.path(), port);
    for _ in 0..2 {
        let client = KubeClient::from_kubeconfig_path(&path).await.unwrap();
        let start = Instant::now();
        let pod = client
            .get_pod("ns1", "p1", Some("u1"), RetryPolicy::none())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("u1"));
        client
            .set_network_status("ns1", "p1", "u1", "[]")
            .await
            .unwrap();
        tracing::debug!(elapsed = ?start.elapsed(), "GET + PATCH over fresh TLS connection");
    }
}

/// A server certificate not signed by the kubeconfig's CA is rejected (not retried as transient
/// forever, not accepted).
#[tokio::test]
async fn https_rejects_unknown_ca() {
    let port = start_tls_server().await;
    let dir = tempfile::tempdir().unwrap();
    let path = write_kubeconfig(dir.path(), port);
    // Trust an unrelated CA instead.
    std::fs::write(dir.path().join("ca.crt"), OTHER_CA).unwrap();
    let client = KubeClient::from_kubeconfig_path(&path).await.unwrap();
    let err = client
        .get_pod("ns1", "p1", None, RetryPolicy::none())
        .await
        .unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
}

/// A kubeconfig whose cluster and user are given as YAML fragments.
fn kubeconfig_with(dir: &std::path::Path, cluster: &str, user: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "clusters:\n- name: c\n  cluster:\n{cluster}users:\n- name: u\n  user:\n{user}\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    path
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A client certificate and key given inline (`-data`), the CA too, against a server that
/// requires a client certificate from its CA: accepted, and no bearer token is sent.
#[tokio::test]
async fn client_certificate_data_against_a_server_requiring_one() {
    let (port, heads) = start_tls_server_with(Some(CLIENT_CA)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig_with(
        dir.path(),
        &format!(
            "    server: https://127.0.0.1:{port}\n    certificate-authority-data: {}\n",
            b64(CA)
        ),
        &format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(CLIENT_CERT),
            b64(CLIENT_KEY)
        ),
    );
    let client = KubeClient::from_kubeconfig_path(&path).await.unwrap();
    client
        .get_pod("ns1", "p1", Some("u1"), RetryPolicy::none())
        .await
        .unwrap()
        .unwrap();
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1);
    assert!(
        !heads[0].to_ascii_lowercase().contains("authorization:"),
        "{heads:?}"
    );

    // Without the client certificate the same server refuses the handshake.
    let path = kubeconfig_with(
        dir.path(),
        &format!(
            "    server: https://127.0.0.1:{port}\n    certificate-authority-data: {}\n",
            b64(CA)
        ),
        "    token: tok\n",
    );
    let client = KubeClient::from_kubeconfig_path(&path).await.unwrap();
    let err = client
        .get_pod("ns1", "p1", None, RetryPolicy::none())
        .await
        .unwrap_err();
    assert!(
        matches!(err, super::K8sError::Unreachable { .. }),
        "{err:?}"
    );
}

/// `tls-server-name` is the name verified: the certificate's name passes, another fails.
#[tokio::test]
async fn tls_server_name_is_the_name_verified() {
    let port = start_tls_server().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), CA).unwrap();
    for (name, ok) in [("localhost", true), ("api.example", false)] {
        let path = kubeconfig_with(
            dir.path(),
            &format!(
                "    server: https://127.0.0.1:{port}\n    certificate-authority: ca.crt\n    tls-server-name: {name}\n"
            ),
            "    token: tok\n",
        );
        let client = KubeClient::from_kubeconfig_path(&path).await.unwrap();
        let got = client.get_pod("ns1", "p1", None, RetryPolicy::none()).await;
        assert_eq!(got.is_ok(), ok, "{name}: {got:?}");
    }
}

/// `insecure-skip-tls-verify: true` accepts a server no configured CA vouches for.
#[tokio::test]
async fn insecure_skip_tls_verify_accepts_any_server() {
    let port = start_tls_server().await;
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig_with(
        dir.path(),
        &format!("    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\n"),
        "    token: tok\n",
    );
    let client = KubeClient::from_kubeconfig_path(&path).await.unwrap();
    client
        .get_pod("ns1", "p1", None, RetryPolicy::none())
        .await
        .unwrap()
        .unwrap();
}

/// A CA for client certificates, and a client certificate it signed (valid until 2126).
const CLIENT_CA: &[u8] = include_bytes!("testdata/client-ca.crt");
const CLIENT_CERT: &[u8] = include_bytes!("testdata/client.crt");
const CLIENT_KEY: &[u8] = include_bytes!("testdata/client.key");

/// An unrelated CA (CN=other-ca).
const OTHER_CA: &[u8] = include_bytes!("testdata/other-ca.crt");

/// The in-cluster path: service host/port, service-account CA and token files.
#[tokio::test]
async fn in_cluster_uses_ca_and_token_file() {
    let (port, heads) = start_tls_server_recording().await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = InClusterEnv::new("127.0.0.1", port.to_string());
    env.ca_file = dir.path().join("ca.crt");
    env.token_file = dir.path().join("token");
    std::fs::write(&env.ca_file, CA).unwrap();
    std::fs::write(&env.token_file, "sa-token-1\n").unwrap();
    let client = KubeClient::in_cluster(&env, ClientOptions::default())
        .await
        .unwrap();
    client
        .get_pod("ns1", "p1", Some("u1"), RetryPolicy::none())
        .await
        .unwrap()
        .unwrap();
    // A token file is read as it is when the client is built.
    std::fs::write(&env.token_file, "sa-token-2").unwrap();
    let client = KubeClient::in_cluster(&env, ClientOptions::default())
        .await
        .unwrap();
    client
        .get_pod("ns1", "p1", None, RetryPolicy::none())
        .await
        .unwrap();
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2);
    assert!(
        heads[1]
            .to_ascii_lowercase()
            .contains("authorization: bearer sa-token-2\r\n"),
        "{heads:?}"
    );
    assert!(
        heads[0].starts_with("GET /api/v1/namespaces/ns1/pods/p1 HTTP/1.1\r\n"),
        "{heads:?}"
    );
    assert!(
        heads[0]
            .to_ascii_lowercase()
            .contains("authorization: bearer sa-token-1\r\n"),
        "{heads:?}"
    );
}

#[tokio::test]
async fn in_cluster_without_token_file_fails_as_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = InClusterEnv::new("127.0.0.1", "6443");
    env.ca_file = dir.path().join("ca.crt");
    env.token_file = dir.path().join("missing-token");
    std::fs::write(&env.ca_file, CA).unwrap();
    let err = KubeClient::in_cluster(&env, ClientOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, super::K8sError::InCluster(_)), "{err:?}");
    assert_eq!(err.cni_code(), 7);
}
