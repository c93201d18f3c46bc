//! The framing: each connection is a `hyper::client::conn::http1` client connection driven by
//! its own task; this module turns a [`Request`] into hyper's and reads the whole answer.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Body as _;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use super::super::error::chain as error_chain;
use super::super::transport::{Request, Response, TransportError};
use super::{is_idempotent, Endpoint, Exchange, Io, MAX_BODY};

/// The sending half of one connection.
pub(super) type Sender = SendRequest<Full<Bytes>>;

/// Start HTTP/1.1 on `io`; the connection runs in its own task until the sender is dropped.
pub(super) async fn handshake(io: Box<dyn Io>) -> Result<Sender, TransportError> {
    let (sender, conn) = http1::Builder::new()
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| TransportError::Unreachable(format!("HTTP: {}", error_chain(&e))))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!("API connection ended: {}", error_chain(&e));
        }
    });
    Ok(sender)
}

/// `req` as hyper sends it: the path under the endpoint's base path, `Host`, the transport's
/// headers, and `Accept: application/json` unless the request names one.
pub(super) fn request(
    ep: &Endpoint,
    headers: &[(HeaderName, HeaderValue)],
    req: &Request,
) -> http::Request<Full<Bytes>> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut out = http::Request::new(Full::new(Bytes::from(req.body().clone())));
    *out.method_mut() = req.method().clone();
    *out.uri_mut() = format!("{}{path}", ep.base_path)
        .parse()
        .unwrap_or_else(|_| http::Uri::from_static("/"));
    let h = out.headers_mut();
    if let Ok(host) = HeaderValue::from_str(&ep.authority) {
        h.insert(http::header::HOST, host);
    }
    for (name, value) in headers {
        h.append(name.clone(), value.clone());
    }
    for (name, value) in req.headers() {
        if name != http::header::HOST && name != http::header::CONTENT_LENGTH {
            h.append(name.clone(), value.clone());
        }
    }
    if !h.contains_key(http::header::ACCEPT) {
        h.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json"),
        );
    }
    out
}

fn classify(e: &hyper::Error) -> TransportError {
    if e.is_parse() || e.is_parse_status() {
        TransportError::Other(format!("malformed answer: {}", error_chain(e)))
    } else {
        TransportError::Unreachable(error_chain(e))
    }
}

/// Send `req` on `sender` and read the whole answer.
pub(super) async fn exchange(sender: &mut Sender, req: http::Request<Full<Bytes>>) -> Exchange {
    if let Err(e) = sender.ready().await {
        return Exchange::NotSent(classify(&e));
    }
    let idempotent = is_idempotent(req.method());
    let answer = match sender.send_request(req).await {
        Ok(a) => a,
        Err(e) if e.is_parse() || e.is_parse_status() => return Exchange::Broken(classify(&e)),
        // Canceled: never written. Otherwise the server may have acted on it.
        Err(e) if e.is_canceled() || idempotent => return Exchange::NotSent(classify(&e)),
        Err(e) => return Exchange::Broken(classify(&e)),
    };
    let (mut parts, body) = answer.into_parts();
    if body.size_hint().lower() > MAX_BODY as u64 {
        return Exchange::Broken(TransportError::Other(format!(
            "answer body over {MAX_BODY} bytes"
        )));
    }
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(e) => {
            let err = match e.downcast::<hyper::Error>() {
                Ok(h) if h.is_incomplete_message() || h.is_closed() || h.is_timeout() => {
                    TransportError::Unreachable(error_chain(&*h))
                }
                Ok(h) if io_eof(&h) => TransportError::Unreachable(error_chain(&*h)),
                Ok(h) => TransportError::Other(format!("malformed answer: {}", error_chain(&*h))),
                Err(_) => TransportError::Other(format!("answer body over {MAX_BODY} bytes")),
            };
            return Exchange::Broken(err);
        }
    };
    parts.headers.remove(http::header::TRANSFER_ENCODING);
    Exchange::Answered {
        response: Response::from_parts(parts, body),
        keep_alive: !sender.is_closed(),
    }
}

/// True when hyper's error is an end of stream in the middle of a body.
fn io_eof(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::UnexpectedEof;
        }
        source = s.source();
    }
    false
}
