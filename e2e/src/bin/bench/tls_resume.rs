//! `plexus-bench --tls-resume`: what TLS session resumption would save a thin call, measured
//! against a real kube-apiserver: rounds of "TCP connect, TLS handshake, `GET /version`"
//! with a full handshake every time, and with rustls' in-memory session cache (TLS 1.3 PSK
//! with (EC)DHE, the ticket of the previous connection), interleaved. A thin call is a new
//! process, so resuming across calls needs the ticket on disk; this measures the upper bound
//! of that gain in one process.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use plexus_e2e::realk8s::{ControlPlane, K8sBins};
use rustls::pki_types::{CertificateDer, ServerName};

fn config(ca_der: &[u8], resume: bool) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(ca_der.to_vec()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    if !resume {
        c.resumption = rustls::client::Resumption::disabled();
    }
    Ok(Arc::new(c))
}

/// One connection: (handshake time, whole exchange time, resumed?).
fn exchange(cfg: &Arc<rustls::ClientConfig>, port: u16, token: &str) -> Result<(f64, f64, bool)> {
    let t = Instant::now();
    let mut tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_nodelay(true)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut conn = rustls::ClientConnection::new(cfg.clone(), ServerName::try_from("127.0.0.1")?)?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp)?;
    }
    let hs = t.elapsed().as_secs_f64() * 1000.0;
    let resumed = matches!(conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    write!(
        tls,
        "GET /version HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\r\n"
    )?;
    tls.flush()?;
    let mut raw = Vec::new();
    if let Err(e) = tls.read_to_end(&mut raw) {
        if raw.is_empty() {
            return Err(e).context("read /version");
        }
    }
    ensure!(
        raw.starts_with(b"HTTP/1.0 200") || raw.starts_with(b"HTTP/1.1 200"),
        "GET /version: {}",
        String::from_utf8_lossy(&raw[..raw.len().min(80)])
    );
    Ok((hs, t.elapsed().as_secs_f64() * 1000.0, resumed))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Prints full vs resumed handshakes over `n` interleaved rounds.
pub fn run(n: usize) -> Result<()> {
    let Some(bins) = K8sBins::from_env()? else {
        bail!("--tls-resume needs PLEXUS_K8S_BIN");
    };
    let cp = ControlPlane::start(&bins)?;
    let (full, resumed) = (config(&cp.ca_der(), false)?, config(&cp.ca_der(), true)?);
    // The first resumable connection only gets the ticket.
    exchange(&resumed, cp.port(), cp.admin_token())?;
    let (mut fh, mut fx, mut rh, mut rx, mut hits) = (vec![], vec![], vec![], vec![], 0);
    for round in 0..=n {
        let a = exchange(&full, cp.port(), cp.admin_token())?;
        let b = exchange(&resumed, cp.port(), cp.admin_token())?;
        if round == 0 {
            continue;
        }
        fh.push(a.0);
        fx.push(a.1);
        rh.push(b.0);
        rx.push(b.1);
        hits += usize::from(b.2);
    }
    println!(
        "TLS to a real kube-apiserver (ECDSA P-256 serving certificate, TLS 1.3), {n} interleaved rounds, medians:"
    );
    println!(
        "  full handshake:    connect + handshake {:.2} ms, with GET /version {:.2} ms",
        median(fh),
        median(fx)
    );
    println!(
        "  resumed (PSK):     connect + handshake {:.2} ms, with GET /version {:.2} ms  ({hits} of {n} resumed)",
        median(rh),
        median(rx)
    );
    Ok(())
}
