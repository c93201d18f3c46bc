//! The seam under [`KubeClient`](super::KubeClient): one HTTP exchange with the API server.
//!
//! The thin plugin uses [`Http1Transport`](super::http1::Http1Transport), a small HTTP/1.1
//! client; the daemon uses its `kube::Client` (see [`super::kube_transport`]), which it needs for
//! its watches anyway. Everything above the seam (request building, status handling, retries,
//! error classification) is shared, so both modes send the same requests and read the same
//! answers.

use std::future::Future;
use std::pin::Pin;

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
