//! The seam under [`KubeClient`](super::KubeClient): one HTTP exchange with the API server.
//!
//! The thin plugin uses [`Http1Transport`](super::http1::Http1Transport), a small HTTP/1.1
//! client; the daemon uses its `kube::Client` (see [`super::kube_transport`]), which it needs for
//! its watches anyway. Everything above the seam (request building, status handling, retries,
//! error classification) is shared, so both modes send the same requests and read the same
//! answers.

use std::future::Future;
use std::pin::Pin;

use serde::Deserialize;

use super::error::{Ctx, K8sError};

/// A request body plexus sends (JSON, merge-patch or apply-patch).
pub(crate) type Request = http::Request<Vec<u8>>;
/// A whole answer: status, headers and the complete body.
pub(crate) type Response = http::Response<Vec<u8>>;
/// What [`Transport::send`] returns.
pub(crate) type SendFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Response, TransportError>> + Send + 'a>>;

/// Why no answer came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TransportError {
    /// No complete HTTP answer: connection refused or reset, TLS failure, closed early.
    Unreachable(String),
    /// The request could not be made (credentials, an oversized answer, a malformed one).
    Other(String),
}

/// One HTTP exchange with the API server; the path and query are relative to the server URL.
pub(crate) trait Transport: Send + Sync {
    /// Send `req`, return the complete answer whatever its status.
    fn send(&self, req: Request) -> SendFuture<'_>;

    /// The `kube::Client` behind this transport, for the daemon's watches.
    fn kube_client(&self) -> Option<kube::Client> {
        None
    }
}

impl K8sError {
    /// Label a transport failure with the object it was about.
    pub(crate) fn from_transport(ctx: Ctx<'_>, err: TransportError) -> Self {
        let (what, ns, name) = (ctx.what, ctx.ns.to_owned(), ctx.name.to_owned());
        match err {
            TransportError::Unreachable(reason) => K8sError::Unreachable {
                what,
                ns,
                name,
                reason,
            },
            TransportError::Other(reason) => K8sError::Other {
                what,
                ns,
                name,
                reason,
            },
        }
    }

    /// The error for a non-success answer: the API server's `Status` when the body is one,
    /// else the HTTP status with the start of the body.
    pub(crate) fn from_answer(ctx: Ctx<'_>, code: u16, body: &[u8]) -> Self {
        #[derive(Deserialize)]
        struct Status {
            #[serde(default)]
            reason: String,
            #[serde(default)]
            message: String,
        }
        let (reason, message) = match serde_json::from_slice::<Status>(body) {
            Ok(s) if !s.reason.is_empty() || !s.message.is_empty() => (s.reason, s.message),
            _ => {
                let reason = http::StatusCode::from_u16(code)
                    .ok()
                    .and_then(|c| c.canonical_reason())
                    .unwrap_or("")
                    .to_owned();
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                let cut = text.char_indices().nth(200).map_or(text.len(), |(i, _)| i);
                (reason, text[..cut].to_owned())
            }
        };
        K8sError::Api {
            what: ctx.what,
            ns: ctx.ns.to_owned(),
            name: ctx.name.to_owned(),
            code,
            reason,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Ctx<'static> {
        Ctx {
            what: "get pod",
            ns: "ns1",
            name: "p1",
        }
    }

    #[test]
    fn a_status_body_gives_its_reason_and_message() {
        let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"p1\" not found","reason":"NotFound","code":404}"#;
        match K8sError::from_answer(ctx(), 404, body) {
            K8sError::Api {
                code,
                reason,
                message,
                ..
            } => {
                assert_eq!((code, reason.as_str()), (404, "NotFound"));
                assert_eq!(message, "pods \"p1\" not found");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn another_body_gives_the_http_reason_and_its_start() {
        let body = "x".repeat(1000);
        match K8sError::from_answer(ctx(), 503, body.as_bytes()) {
            K8sError::Api {
                code,
                reason,
                message,
                ..
            } => {
                assert_eq!((code, reason.as_str()), (503, "Service Unavailable"));
                assert_eq!(message.len(), 200);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn transport_failures_keep_their_class() {
        let e = K8sError::from_transport(ctx(), TransportError::Unreachable("refused".into()));
        assert!(e.is_transient(), "{e:?}");
        let e = K8sError::from_transport(ctx(), TransportError::Other("bad token".into()));
        assert!(!e.is_transient(), "{e:?}");
        assert!(e.to_string().contains("get pod ns1/p1"), "{e}");
    }
}
