//! The HTTP side: listener up/down, connection serving, authentication, authorization,
//! request logging and dispatch to discovery or resource handlers.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::auth::Tokens;
use super::handlers::{self, ApiRequest};
use super::log::{RequestLog, RequestRecord};
use super::routes::{self, Query, Route};
use super::status::ApiError;
use super::store::Store;
use super::tls::Tls;
use super::{admin, discovery};

/// Largest accepted request body.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Locks a mutex, recovering the data if a holder panicked.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Listening {
    shutdown: watch::Sender<bool>,
    done: mpsc::Receiver<()>,
}

/// State shared by the server tasks and the `TestApiServer` handle.
pub struct Shared {
    /// Stored objects.
    pub store: Mutex<Store>,
    /// Registered bearer tokens.
    pub tokens: Mutex<Tokens>,
    /// Request log.
    pub log: Mutex<RequestLog>,
    /// Token for `/_test` admin endpoints; `None` disables them.
    pub admin_token: Option<String>,
    /// The bound address (kept across down/up).
    pub addr: SocketAddr,
    /// The server runtime.
    pub handle: tokio::runtime::Handle,
    /// TLS material when serving HTTPS.
    pub tls: Option<Tls>,
    listening: Mutex<Option<Listening>>,
}

impl Shared {
    /// New shared state for a server bound at `addr`.
    pub fn new(
        addr: SocketAddr,
        handle: tokio::runtime::Handle,
        admin_token: Option<String>,
        tls: Option<Tls>,
    ) -> Shared {
        Shared {
            store: Mutex::default(),
            tokens: Mutex::default(),
            log: Mutex::default(),
            admin_token,
            addr,
            handle,
            tls,
            listening: Mutex::new(None),
        }
    }

    /// Whether the listener is open.
    pub fn is_up(&self) -> bool {
        lock(&self.listening).is_some()
    }

    /// Starts accepting on an already bound listener.
    pub fn listen(self: &Arc<Self>, listener: std::net::TcpListener) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let (shutdown, rx) = watch::channel(false);
        let (done_tx, done) = mpsc::channel();
        let shared = Arc::clone(self);
        self.handle.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => accept_loop(l, shared, rx).await,
                Err(e) => tracing::error!(error = %e, "cannot register listener"),
            }
            let _ = done_tx.send(());
        });
        *lock(&self.listening) = Some(Listening { shutdown, done });
        Ok(())
    }

    /// Rebinds the same address and accepts again (no-op when already up).
    pub fn up(self: &Arc<Self>) -> std::io::Result<()> {
        if self.is_up() {
            return Ok(());
        }
        let listener = std::net::TcpListener::bind(self.addr)?;
        self.listen(listener)
    }

    /// Closes the listener and drops every open connection, then returns.
    pub fn down(&self) {
        let Some(l) = lock(&self.listening).take() else {
            return;
        };
        let _ = l.shutdown.send(true);
        if l.done.recv_timeout(Duration::from_secs(10)).is_err() {
            tracing::warn!("listener did not shut down within 10s");
        }
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Go's net/http (the real kube-apiserver) sets TCP_NODELAY on every
                    // accepted connection; without it TLS handshakes meet delayed ACKs.
                    let _ = stream.set_nodelay(true);
                    let shared = Arc::clone(&shared);
                    conns.spawn(async move {
                        match shared.tls.as_ref().map(|t| t.acceptor.clone()) {
                            Some(acceptor) => match acceptor.accept(stream).await {
                                Ok(tls) => serve_io(TokioIo::new(tls), shared).await,
                                Err(e) => tracing::debug!(error = %e, "TLS handshake failed"),
                            },
                            None => serve_io(TokioIo::new(stream), shared).await,
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    // Aborting the connection tasks drops their sockets: clients see the connection close.
    conns.shutdown().await;
}

async fn serve_io<I>(io: I, shared: Arc<Shared>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| serve(Arc::clone(&shared), req));
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, svc)
        .await
    {
        tracing::debug!(error = %e, "connection ended with error");
    }
}

/// A JSON response.
pub fn json_response(code: u16, body: &Value) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if code == 429 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// An error response with a `Status` body.
pub fn error_response(e: &ApiError) -> Response<Full<Bytes>> {
    json_response(e.code, &e.body())
}

/// Reads a request body up to `limit` bytes.
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(
            "Request entity too large: limit is 3145728",
        )),
        Err(e) => Err(ApiError::bad_request(format!("error reading body: {e}"))),
    }
}

fn header_str(req: &http::request::Parts, name: header::HeaderName) -> Option<&str> {
    req.headers.get(name).and_then(|v| v.to_str().ok())
}

async fn serve(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let start = Instant::now();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let authz = header_str(&parts, header::AUTHORIZATION).map(str::to_string);
    if path == "/_test" || path.starts_with("/_test/") {
        return Ok(admin::handle(&shared, &parts.method, &path, authz.as_deref(), body).await);
    }
    let query = parts.uri.query().map(str::to_string);
    let content_type = header_str(&parts, header::CONTENT_TYPE).map(str::to_string);
    let method = parts.method.clone();

    let (resp, user) = match read_body(body, MAX_BODY).await {
        Ok(bytes) => api(
            &shared,
            &method,
            &path,
            query.as_deref(),
            content_type.as_deref(),
            authz.as_deref(),
            &bytes,
        ),
        Err(e) => (error_response(&e), None),
    };
    let record = RequestRecord {
        method: method.to_string(),
        path,
        query,
        content_type,
        status: resp.status().as_u16(),
        duration: start.elapsed(),
        user,
    };
    tracing::debug!(method = %record.method, path = %record.path, status = record.status, "request");
    lock(&shared.log).push(record);
    Ok(resp)
}

/// Media type without parameters, lower-cased.
fn media_type(ct: Option<&str>) -> Option<String> {
    ct.and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .filter(|m| !m.is_empty())
}

fn api(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: Option<&str>,
    content_type: Option<&str>,
    authz: Option<&str>,
    body: &[u8],
) -> (Response<Full<Bytes>>, Option<String>) {
    let Some(id) = lock(&shared.tokens).authenticate(authz) else {
        return (error_response(&ApiError::unauthorized()), None);
    };
    let user = Some(id.user.clone());
    let route = routes::parse(path);
    let query = Query::parse(query);
    let result = match &route {
        Route::Unknown => Err(ApiError::no_route()),
        Route::Collection { .. } | Route::Object { .. } => {
            authorize(&route, method, &query, &id.user, id.access).and_then(|()| {
                let ct = media_type(content_type);
                let req = ApiRequest {
                    method,
                    query: &query,
                    content_type: ct.as_deref(),
                    body,
                };
                handlers::handle(&mut lock(&shared.store), &route, &req)
            })
        }
        _ if *method != Method::GET => Err(ApiError::method_not_supported()),
        _ => discovery::answer(&route, shared.addr)
            .map(|v| (200, v))
            .ok_or_else(ApiError::no_route),
    };
    let resp = match result {
        Ok((code, v)) => json_response(code, &v),
        Err(e) => error_response(&e),
    };
    (resp, user)
}

fn authorize(
    route: &Route,
    method: &Method,
    query: &Query,
    user: &str,
    access: super::Access,
) -> Result<(), ApiError> {
    let Some(verb) = handlers::verb(method, route, query) else {
        return Err(ApiError::method_not_supported());
    };
    if access.allows(verb) {
        return Ok(());
    }
    Err(match route {
        Route::Collection { res, ns } => {
            ApiError::forbidden(*res, None, None, ns.as_deref(), user, verb)
        }
        Route::Object {
            res,
            ns,
            name,
            status,
        } => ApiError::forbidden(
            *res,
            status.then_some("status"),
            Some(name),
            (!ns.is_empty()).then_some(ns.as_str()),
            user,
            verb,
        ),
        _ => ApiError::no_route(),
    })
}
