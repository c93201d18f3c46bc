//! A minimal blocking HTTPS client (HTTP/1.0, one connection per request, bearer token) for
//! `/readyz`, `/metrics`, JSON reads and the benchmarks' object writes: no client process, no
//! discovery requests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustls::pki_types::{CertificateDer, ServerName};

/// A TLS client that trusts one CA.
#[derive(Clone)]
pub struct HttpsGet {
    config: Arc<rustls::ClientConfig>,
    host: String,
    port: u16,
    token: String,
}

impl HttpsGet {
    /// For `127.0.0.1:port` with CA `ca_der`, authenticating with `token`.
    pub fn new(port: u16, ca_der: &[u8], token: &str) -> Result<HttpsGet> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(ca_der.to_vec()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(HttpsGet {
            config: Arc::new(config),
            host: "127.0.0.1".into(),
            port,
            token: token.into(),
        })
    }

    /// GET `path`: (status code, body).
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        self.send("GET", path, None)
    }

    /// `method` `path` with an optional JSON `body`: (status code, body).
    pub fn send(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .with_context(|| format!("connect {}:{}", self.host, self.port))?;
        tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
        // One request in one TLS record, sent at once: `write!` in pieces plus Nagle's
        // algorithm against the server's delayed ACK cost 40 ms per request.
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(self.host.clone())?;
        let conn = rustls::ClientConnection::new(self.config.clone(), name)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let content = body
            .map(|b| {
                format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n",
                    b.len()
                )
            })
            .unwrap_or_default();
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: {}:{}\r\nAuthorization: Bearer {}\r\nAccept: application/json, */*\r\n{content}\r\n{}",
            self.host,
            self.port,
            self.token,
            body.unwrap_or_default()
        );
        tls.write_all(request.as_bytes())?;
        tls.flush()?;
        let mut raw = Vec::new();
        // Go closes without close_notify on HTTP/1.0: keep what arrived.
        if let Err(e) = tls.read_to_end(&mut raw) {
            if raw.is_empty() {
                return Err(e).context("read response");
            }
        }
        let text = String::from_utf8_lossy(&raw);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            bail!("malformed response to {method} {path}");
        };
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .context("status code")?;
        Ok((code, body.to_string()))
    }
}
