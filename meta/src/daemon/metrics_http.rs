//! The metrics endpoint both modes serve (`/metrics`, `/healthz`, `/readyz`): hyper, with the
//! ServiceAccount-token authentication and authorisation Kubernetes components use for
//! `/metrics` (TokenReview + SubjectAccessReview on the non-resource URL), as
//! controller-runtime's secure metrics serving and kube-rbac-proxy do.
//!
//! - HTTPS: a certificate and key given by flags, else a self-signed certificate made at start
//!   (Prometheus scrapes it with `insecure_skip_verify`, the kubelet's HTTPS probes do not
//!   verify). A loopback address without a cert/key is node-local and served as plain HTTP
//!   without a check (`--metrics-insecure-http` says so explicitly, and is refused on any
//!   other address).
//! - `/metrics` wants `Authorization: Bearer <token>`: the API server's TokenReview says who
//!   the token is, its SubjectAccessReview whether that user may `get` the non-resource URL
//!   `/metrics` (ClusterRole `plexus-metrics-reader`). 401 without a token or with one the API
//!   does not authenticate, 403 when not allowed, 503 when the API cannot be asked. An allowed
//!   token is remembered for [`ALLOW_TTL`] under its SHA-256 (bounded map); tokens are never
//!   logged.
//! - `/healthz` (the process answers) and `/readyz` ([`MetricsSource::ready`]) are open: the
//!   kubelet's probes carry no token.
//! - Only GET and HEAD (405 otherwise); unknown paths 404.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the endpoint serves: the daemon's registry, or thin mode's exporter.
pub trait MetricsSource: Send + Sync + 'static {
    /// Every metric family, OpenMetrics text.
    fn render(&self) -> String;
    /// `/readyz`: `Ok` when ready, else the reason (e.g. "caches not synced", "draining").
    fn ready(&self) -> Result<(), String>;
}

/// How `/metrics` is protected.
pub enum Access {
    /// TokenReview + SubjectAccessReview (`get` on the non-resource URL `/metrics`) through the
    /// API server, with the caller's bearer token.
    Kubernetes(kube::Client),
    /// No check: only for a loopback address (tests, a node-local scraper).
    LoopbackOnly,
}

/// How long an allowed token is remembered.
pub const ALLOW_TTL: Duration = Duration::from_secs(60);
/// Tokens remembered at most (a full map forgets its expired entries, then all).
const CACHE_MAX: usize = 1024;
/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;
/// A request's headers must arrive within this, the TLS handshake too.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// TokenReview + SubjectAccessReview together.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// The path the SubjectAccessReview asks about.
const METRICS_PATH: &str = "/metrics";

/// The serving settings besides the address (`--metrics-*` flags, or the daemon's `--config`
/// JSON: `metricsInsecureHttp`, `metricsCertFile`, `metricsKeyFile`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Serving {
    /// Plain HTTP without authentication; refused unless the address is a loopback address
    /// (where it is the default without a cert/key).
    pub metrics_insecure_http: bool,
    /// A PEM certificate chain for HTTPS; empty: self-signed, made at start.
    pub metrics_cert_file: String,
    /// The PEM private key of `metrics_cert_file`.
    pub metrics_key_file: String,
}

/// The flags [`Serving::parse_flag`] takes, for a usage text.
pub const USAGE: &str =
    "[--metrics-insecure-http] [--metrics-cert-file PEM --metrics-key-file PEM]";

impl Serving {
    /// Take `flag` when it is one of ours (`value` yields its argument); `Ok(false)`: not ours.
    pub fn parse_flag(
        &mut self,
        flag: &str,
        value: &mut dyn FnMut() -> Result<String, String>,
    ) -> Result<bool, String> {
        match flag {
            "--metrics-insecure-http" => self.metrics_insecure_http = true,
            "--metrics-cert-file" => self.metrics_cert_file = value()?,
            "--metrics-key-file" => self.metrics_key_file = value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Check the settings against `address` and pick the transport and the access: plain
    /// HTTP without a check only on a loopback address (with `--metrics-insecure-http`, or
    /// without a cert/key), else HTTPS and the API's reviews (which need `client`).
    pub fn plan(
        &self,
        address: &SocketAddr,
        client: Option<kube::Client>,
    ) -> Result<(Transport, Access), String> {
        if self.metrics_insecure_http {
            if !address.ip().is_loopback() {
                return Err(format!(
                    "--metrics-insecure-http serves /metrics without authentication: only on a loopback address, not {address}"
                ));
            }
            return Ok((Transport::Http, Access::LoopbackOnly));
        }
        let no_files = self.metrics_cert_file.is_empty() && self.metrics_key_file.is_empty();
        if address.ip().is_loopback() && no_files {
            // Node-local: only the node's own network namespace reaches it (the daemon's
            // probes, `kubectl exec`, the tiers), as before issue 38.
            return Ok((Transport::Http, Access::LoopbackOnly));
        }
        let client = client.ok_or_else(|| {
            format!("metrics on {address}: /metrics is authorised through the API server (TokenReview, SubjectAccessReview) and no API is configured; use --metrics-insecure-http on a loopback address")
        })?;
        let tls = match (
            self.metrics_cert_file.is_empty(),
            self.metrics_key_file.is_empty(),
        ) {
            (true, true) => tls_self_signed(address.ip())?,
            (false, false) => tls_from_files(&self.metrics_cert_file, &self.metrics_key_file)?,
            _ => return Err("--metrics-cert-file and --metrics-key-file go together".into()),
        };
        Ok((Transport::Https(tls), Access::Kubernetes(client)))
    }
}

/// Bind `address`, check `serving` against it and spawn the endpoint on `rt`: what
/// `plexus-daemon` and `plexus-daemon reconcile` call. An error names the address and cause.
pub fn start(
    rt: &tokio::runtime::Handle,
    address: &str,
    serving: &Serving,
    client: Option<kube::Client>,
    source: Arc<dyn MetricsSource>,
) -> Result<(), String> {
    let std_listener = std::net::TcpListener::bind(bracket_ipv6(address))
        .map_err(|e| format!("metrics address {address}: {e}"))?;
    let local = std_listener
        .local_addr()
        .map_err(|e| format!("metrics address {address}: {e}"))?;
    let (transport, access) = serving.plan(&local, client)?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| format!("metrics address {address}: {e}"))?;
    let _guard = rt.enter();
    let listener = tokio::net::TcpListener::from_std(std_listener)
        .map_err(|e| format!("metrics address {address}: {e}"))?;
    tracing::info!(address = %local, scheme = transport.scheme(), auth = access.name(), "metrics endpoint serving");
    rt.spawn(serve_on(listener, transport, access, source));
    Ok(())
}

/// `fd00::5:9109` as `[fd00::5]:9109`: the DaemonSets write `$(PLEXUS_NODE_IP):9109`, and
/// `status.hostIP` is a bare IPv6 address on an IPv6-primary node. Anything else unchanged.
fn bracket_ipv6(address: &str) -> String {
    if address.parse::<SocketAddr>().is_err() {
        if let Some((host, port)) = address.rsplit_once(':') {
            if let Ok(IpAddr::V6(ip)) = host.parse::<IpAddr>() {
                return format!("[{ip}]:{port}");
            }
        }
    }
    address.to_string()
}

/// Serve on `listener` until the process ends: HTTPS with a self-signed certificate and the
/// API's reviews for [`Access::Kubernetes`], plain HTTP for [`Access::LoopbackOnly`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    access: Access,
    source: Arc<dyn MetricsSource>,
) {
    let transport = match &access {
        Access::LoopbackOnly => Transport::Http,
        Access::Kubernetes(_) => {
            let ip = listener
                .local_addr()
                .map(|a| a.ip())
                .unwrap_or(IpAddr::from([127, 0, 0, 1]));
            match tls_self_signed(ip) {
                Ok(t) => Transport::Https(t),
                Err(e) => {
                    tracing::error!(error = %e, "metrics endpoint not served");
                    return;
                }
            }
        }
    };
    serve_on(listener, transport, access, source).await
}

/// Plain HTTP or TLS.
pub enum Transport {
    /// Only with [`Access::LoopbackOnly`].
    Http,
    /// rustls over the accepted connection.
    Https(Arc<rustls::ServerConfig>),
}

impl Transport {
    fn scheme(&self) -> &'static str {
        match self {
            Transport::Http => "http",
            Transport::Https(_) => "https",
        }
    }
}

impl Access {
    fn name(&self) -> &'static str {
        match self {
            Access::Kubernetes(_) => "tokenreview+subjectaccessreview",
            Access::LoopbackOnly => "none (loopback)",
        }
    }
}

/// Serve on `listener` with `transport` until the process ends.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    transport: Transport,
    access: Access,
    source: Arc<dyn MetricsSource>,
) {
    let acceptor = match transport {
        Transport::Http => None,
        Transport::Https(cfg) => Some(tokio_rustls::TlsAcceptor::from(cfg)),
    };
    let state = Arc::new(State {
        access,
        source,
        allowed: Mutex::new(HashMap::new()),
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "metrics accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = conn.set_nodelay(true);
        let (state, acceptor) = (Arc::clone(&state), acceptor.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match acceptor {
                None => serve_conn(conn, state).await,
                Some(a) => match tokio::time::timeout(HEADER_TIMEOUT, a.accept(conn)).await {
                    Ok(Ok(tls)) => serve_conn(tls, state).await,
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics TLS handshake"),
                    Err(_) => tracing::debug!(%peer, "metrics TLS handshake timed out"),
                },
            }
        });
    }
}

async fn serve_conn<S>(io: S, state: Arc<State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let state = Arc::clone(&state);
        async move { Ok::<_, std::convert::Infallible>(state.handle(req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

struct State {
    access: Access,
    source: Arc<dyn MetricsSource>,
    /// SHA-256 of an allowed token → until when it stays allowed.
    allowed: Mutex<HashMap<[u8; 32], Instant>>,
}

/// What the reviews said about a request's token.
#[derive(Debug, PartialEq)]
enum Verdict {
    Allowed,
    /// No token, or the API does not authenticate it.
    Unauthenticated(&'static str),
    /// Authenticated as this user, not allowed.
    Forbidden(String),
    /// The API could not be asked.
    Unavailable(String),
}

fn text(code: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = code;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

impl State {
    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            r.headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        match req.uri().path() {
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" => match self.source.ready() {
                Ok(()) => text(StatusCode::OK, "ready\n"),
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            },
            METRICS_PATH => match self.authorize(req.headers()).await {
                Verdict::Allowed => {
                    let mut r = text(StatusCode::OK, self.source.render());
                    r.headers_mut().insert(
                        CONTENT_TYPE,
                        HeaderValue::from_static(
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        ),
                    );
                    r
                }
                Verdict::Unauthenticated(why) => {
                    let mut r = text(StatusCode::UNAUTHORIZED, format!("unauthorized: {why}\n"));
                    r.headers_mut().insert(
                        WWW_AUTHENTICATE,
                        HeaderValue::from_static("Bearer realm=\"plexus-metrics\""),
                    );
                    r
                }
                Verdict::Forbidden(user) => text(
                    StatusCode::FORBIDDEN,
                    format!("forbidden: {user:?} may not get the non-resource URL /metrics (ClusterRole plexus-metrics-reader)\n"),
                ),
                Verdict::Unavailable(e) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("authorization unavailable: {e}\n"),
                ),
            },
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    async fn authorize(&self, headers: &hyper::HeaderMap) -> Verdict {
        let client = match &self.access {
            Access::LoopbackOnly => return Verdict::Allowed,
            Access::Kubernetes(c) => c,
        };
        let Some(token) = bearer(headers) else {
            return Verdict::Unauthenticated("no bearer token");
        };
        let key = token_key(token);
        if self.cached(&key) {
            return Verdict::Allowed;
        }
        let verdict = match tokio::time::timeout(REVIEW_TIMEOUT, review(client, token)).await {
            Ok(v) => v,
            Err(_) => Verdict::Unavailable(format!(
                "the API server did not answer the reviews within {REVIEW_TIMEOUT:?}"
            )),
        };
        match &verdict {
            Verdict::Allowed => self.remember(key),
            Verdict::Forbidden(user) => {
                tracing::info!(user = %user, "metrics scrape forbidden")
            }
            Verdict::Unauthenticated(why) => {
                tracing::debug!(why, "metrics scrape unauthenticated")
            }
            Verdict::Unavailable(e) => tracing::warn!(error = %e, "metrics scrape: reviews failed"),
        }
        verdict
    }

    fn cached(&self, key: &[u8; 32]) -> bool {
        let map = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).is_some_and(|until| *until > Instant::now())
    }

    fn remember(&self, key: [u8; 32]) {
        let mut map = self.allowed.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if map.len() >= CACHE_MAX {
            map.retain(|_, until| *until > now);
            if map.len() >= CACHE_MAX {
                map.clear();
            }
        }
        map.insert(key, now + ALLOW_TTL);
    }
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive), if any.
fn bearer(headers: &hyper::HeaderMap) -> Option<&str> {
    let v = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn token_key(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut k = [0u8; 32];
    k.copy_from_slice(d.as_ref());
    k
}

/// TokenReview, then SubjectAccessReview for `get` on `/metrics`.
async fn review(client: &kube::Client, token: &str) -> Verdict {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::authorization::v1::{
        NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use kube::api::{Api, PostParams};
    let tr = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: None,
        },
        ..Default::default()
    };
    let tr = match Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &tr)
        .await
    {
        Ok(t) => t,
        Err(e) => return Verdict::Unavailable(format!("TokenReview: {}", api_error(&e))),
    };
    let Some(status) = tr.status.filter(|s| s.authenticated == Some(true)) else {
        return Verdict::Unauthenticated("the API server did not authenticate the token");
    };
    let user = status.user.unwrap_or_default();
    let name = user.username.clone().unwrap_or_default();
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username,
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(METRICS_PATH.into()),
                verb: Some("get".into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &sar)
        .await
    {
        Ok(s) if s.status.as_ref().is_some_and(|s| s.allowed) => Verdict::Allowed,
        Ok(_) => Verdict::Forbidden(name),
        Err(e) => Verdict::Unavailable(format!("SubjectAccessReview: {}", api_error(&e))),
    }
}

/// A kube error without anything of the request body (the token).
fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("HTTP {} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("metrics TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("metrics TLS: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A self-signed certificate for `ip`, the host name and `localhost`, made now (rcgen).
pub fn tls_self_signed(ip: IpAddr) -> Result<Arc<rustls::ServerConfig>, String> {
    let mut names = vec!["localhost".to_string(), ip.to_string()];
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() {
            names.push(h.to_string());
        }
    }
    let ck = rcgen::generate_simple_self_signed(names)
        .map_err(|e| format!("metrics TLS: self-signed certificate: {e}"))?;
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der());
    server_config(vec![ck.cert.der().clone()], key.into())
}

/// A certificate chain and key from PEM files.
pub fn tls_from_files(cert: &str, key: &str) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--metrics-cert-file {cert}: {e}"))?;
    if chain.is_empty() {
        return Err(format!("--metrics-cert-file {cert}: no certificate"));
    }
    let key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("--metrics-key-file {key}: {e}"))?;
    server_config(chain, key)
}

#[cfg(test)]
#[path = "metrics_http_tests.rs"]
mod tests;

/// Daemon mode's source: its registry, ready once the caches are synced and until SIGTERM.
pub struct DaemonSource {
    /// The daemon's registry.
    pub metrics: Arc<super::metrics::Metrics>,
    /// Its watch caches.
    pub caches: Arc<super::cache::Caches>,
}

impl MetricsSource for DaemonSource {
    fn render(&self) -> String {
        self.metrics.encode()
    }

    fn ready(&self) -> Result<(), String> {
        if self
            .metrics
            .draining
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            Err("draining".into())
        } else if !self.caches.synced() {
            Err("caches not synced".into())
        } else {
            Ok(())
        }
    }
}
