//! Faults on demand in front of the real kube-apiserver: a TLS proxy on a free loopback port
//! (serving certificate from the cluster CA, so a kubeconfig with the cluster's CA trusts it)
//! that forwards every request to the apiserver unchanged, except for the faults set on it —
//! added latency, an HTTP error answered in the apiserver's place (`429`, `5xx`, with a `Status`
//! body), the connection closed without an answer, or the proxy down (connection refused) and
//! up again on the same port. The rules: [`super::fault_rules`].
//!
//! What the real apiserver cannot do on demand, and only that: every answer that is not a fault
//! is the real one. One request per connection (`Connection: close` towards both sides), so each
//! request is matched on its own; watches stream through until either side closes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

pub use super::fault_rules::RequestMatcher;
use super::fault_rules::{Failure, Faults};
use super::ControlPlane;

/// The longest request head read before it is refused.
const MAX_HEAD: usize = 64 * 1024;

/// A running proxy; stopped on drop.
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    rt: tokio::runtime::Runtime,
    accept: Mutex<Option<tokio::task::JoinHandle<()>>>,
    url: String,
    ca_pem: String,
}

struct Shared {
    faults: Mutex<Faults>,
    upstream: u16,
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FaultProxy {
    /// Start a proxy in front of `cp`'s apiserver (no faults yet).
    pub fn start(cp: &ControlPlane) -> Result<FaultProxy> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let serving = cp.serving_cert()?;
        let cert = CertificateDer::from(pem_der(&serving.cert_pem, "CERTIFICATE")?);
        // rcgen writes PKCS#8 ("PRIVATE KEY").
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pem_der(
            &serving.key_pem,
            "PRIVATE KEY",
        )?));
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(cp.ca_der()))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let port = listener.local_addr()?.port();
        let proxy = FaultProxy {
            port,
            shared: Arc::new(Shared {
                faults: Mutex::default(),
                upstream: cp.port(),
                acceptor: TlsAcceptor::from(Arc::new(server)),
                connector: TlsConnector::from(Arc::new(client)),
            }),
            rt,
            accept: Mutex::new(None),
            url: format!("https://127.0.0.1:{port}"),
            ca_pem: cp.ca_pem(),
        };
        proxy.serve(listener);
        Ok(proxy)
    }

    fn serve(&self, listener: TcpListener) {
        let shared = self.shared.clone();
        let task = self.rt.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let shared = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = one_request(&shared, tcp).await {
                        tracing::debug!("fault proxy: {e:#}");
                    }
                });
            }
        });
        *lock(&self.accept) = Some(task);
    }

    /// `https://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Write a kubeconfig (mode 0600) for the proxy with bearer `token` and the cluster's CA.
    pub fn write_kubeconfig(&self, path: &std::path::Path, token: &str) -> Result<()> {
        crate::apiserver::kubeconfig::write(path, &self.url, Some(&self.ca_pem), token)
            .with_context(|| format!("write {}", path.display()))
    }

    /// Delay every matching request by `delay` before it is forwarded (replaces the previous
    /// latency rule).
    pub fn set_latency(&self, delay: Duration, matcher: RequestMatcher) {
        lock(&self.shared.faults).set_latency(delay, matcher);
    }

    /// Remove the latency rule.
    pub fn clear_latency(&self) {
        lock(&self.shared.faults).clear_latency();
    }

    /// Answer the next `count` matching requests with `code` (and a `Status` body) instead of
    /// forwarding them.
    pub fn fail_next(&self, count: u32, code: u16, matcher: RequestMatcher) {
        lock(&self.shared.faults).fail_next(count, code, matcher);
    }

    /// Close the connection of the next `count` matching requests without an answer.
    pub fn drop_next(&self, count: u32, matcher: RequestMatcher) {
        lock(&self.shared.faults).drop_next(count, matcher);
    }

    /// Remove every failure rule.
    pub fn clear_failures(&self) {
        lock(&self.shared.faults).clear_failures();
    }

    /// Failures still pending.
    pub fn pending_failures(&self) -> u32 {
        lock(&self.shared.faults).pending_failures()
    }

    /// Stop listening: new connections are refused (open ones finish).
    pub fn down(&self) {
        if let Some(t) = lock(&self.accept).take() {
            t.abort();
            // The listener is dropped with the task; wait until the port is closed.
            let _ = self.rt.block_on(t);
        }
    }

    /// Listen again on the same port.
    pub fn up(&self) -> Result<()> {
        if lock(&self.accept).is_some() {
            return Ok(());
        }
        let listener = self
            .rt
            .block_on(TcpListener::bind(("127.0.0.1", self.port)))
            .with_context(|| format!("rebind the fault proxy on port {}", self.port))?;
        self.serve(listener);
        Ok(())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.down();
    }
}

/// One connection, one request: read its head, apply the faults, else forward it (with
/// `Connection: close`) and pipe both ways until the apiserver closes.
async fn one_request(shared: &Shared, tcp: TcpStream) -> Result<()> {
    tcp.set_nodelay(true)?;
    let mut client = shared.acceptor.accept(tcp).await?;
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        anyhow::ensure!(buf.len() < MAX_HEAD, "request head over {MAX_HEAD} bytes");
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(()); // closed before a request
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut first = head.lines().next().unwrap_or("").split(' ');
    let (method, path) = (
        first.next().unwrap_or("").to_string(),
        first.next().unwrap_or("").to_string(),
    );
    let latency = lock(&shared.faults).latency_for(&method, &path);
    if let Some(d) = latency {
        tokio::time::sleep(d).await;
    }
    let failure = lock(&shared.faults).take_failure(&method, &path);
    match failure {
        Some(Failure::Drop) => return Ok(()),
        Some(Failure::Status(code)) => {
            let body = serde_json::json!({"kind":"Status","apiVersion":"v1","metadata":{},
                "status":"Failure","message":format!("injected by the fault proxy: {code}"),
                "reason": reason(code),"code":code})
            .to_string();
            let retry = if code == 429 {
                "Retry-After: 1\r\n"
            } else {
                ""
            };
            let resp = format!(
                "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{retry}Connection: close\r\n\r\n{body}",
                reason(code),
                body.len()
            );
            client.write_all(resp.as_bytes()).await?;
            client.shutdown().await?;
            return Ok(());
        }
        None => {}
    }
    let up = TcpStream::connect(("127.0.0.1", shared.upstream)).await?;
    up.set_nodelay(true)?;
    let name = ServerName::try_from("127.0.0.1")?.to_owned();
    let mut upstream = shared.connector.connect(name, up).await?;
    let mut out = String::with_capacity(head.len() + 20);
    for line in head.trim_end_matches("\r\n").split("\r\n") {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("connection:") || lower.starts_with("keep-alive:") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    upstream.write_all(out.as_bytes()).await?;
    upstream.write_all(&buf[head_end..]).await?;
    // Until the apiserver closes (it does after its answer, or a watch ends).
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

fn reason(code: u16) -> &'static str {
    match code {
        429 => "TooManyRequests",
        500 => "InternalError",
        403 => "Forbidden",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// The DER of the first PEM block labelled `label`.
fn pem_der(pem: &str, label: &str) -> Result<Vec<u8>> {
    use base64::Engine as _;
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem.find(&begin).context("no PEM block")? + begin.len();
    let stop = pem[start..].find(&end).context("unterminated PEM block")? + start;
    let b64: String = pem[start..stop].split_whitespace().collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(b64)?)
}
