//! `Http1Transport`: the thin plugin's HTTP/1.1 client for its few API requests.
//!
//! A CNI call makes three to five small requests and exits, so this needs no HTTP/2, no
//! connection manager and no middleware stack: it connects (TCP_NODELAY, plain or rustls),
//! hands each connection to hyper's low-level HTTP/1.1 client connection (`hyper_framing`),
//! and keeps idle connections for the next request. A request that fails on a reused
//! connection before the server can have acted on it is sent once more on a new one (the
//! server may have closed it while idle). Keeping `kube` out of the thin binary's code path is
//! what lets it shrink (docs/performance.md); why hyper frames the requests and not code of
//! our own is measured in docs/design.md.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

mod hyper_framing;

use super::error::chain as error_chain;
use super::transport::{Request, Response, SendFuture, Transport, TransportError};

/// Largest response body accepted (a pod is a few KiB; a ResourceSlice list can be large).
pub(crate) const MAX_BODY: usize = 32 * 1024 * 1024;
/// Connect time allowed to an address when more addresses are left to try (client-go and
/// hyper move on to the next address family after about as long).
const NEXT_ADDRESS_AFTER: Duration = Duration::from_millis(300);

/// Where and how to connect.
#[derive(Clone)]
pub(crate) struct Endpoint {
    /// Host to connect to (no brackets around an IPv6 literal).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The `Host` header value.
    pub authority: String,
    /// Prefix of every request path (a server URL may have one, e.g. behind a proxy).
    pub base_path: String,
    /// TLS configuration and the name to verify; `None` for plain `http://`.
    pub tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("base_path", &self.base_path)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Anything a request can travel over.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// One connection to the API server, framed by hyper's HTTP/1.1 client connection.
struct Conn {
    sender: hyper_framing::Sender,
}

/// The thin plugin's transport (see the module docs).
pub(crate) struct Http1Transport {
    endpoint: Endpoint,
    /// Headers sent with every request (authorization, impersonation, user agent).
    headers: Vec<(HeaderName, HeaderValue)>,
    connect_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
}

impl Http1Transport {
    /// A transport to `endpoint` adding `headers` to every request.
    pub(crate) fn new(
        endpoint: Endpoint,
        headers: Vec<(HeaderName, HeaderValue)>,
        connect_timeout: Duration,
    ) -> Self {
        Http1Transport {
            endpoint,
            headers,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Where this transport connects (tests).
    #[cfg(test)]
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    async fn connect(&self) -> Result<Conn, TransportError> {
        let ep = &self.endpoint;
        let unreachable =
            |e: io::Error| TransportError::Unreachable(format!("{}:{}: {e}", ep.host, ep.port));
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((ep.host.as_str(), ep.port))
            .await
            .map_err(unreachable)?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        let mut tcp = None;
        let count = addrs.len();
        for (i, addr) in addrs.into_iter().enumerate() {
            let limit = if i + 1 < count {
                self.connect_timeout.min(NEXT_ADDRESS_AFTER)
            } else {
                self.connect_timeout
            };
            match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    tcp = Some(s);
                    break;
                }
                Ok(Err(e)) => last = e,
                Err(_) => {
                    last = io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("connect to {addr} timed out after {limit:?}"),
                    )
                }
            }
        }
        let tcp = tcp.ok_or_else(|| unreachable(last))?;
        // Small requests and answers: never wait for a delayed ACK (a 40 ms stall).
        tcp.set_nodelay(true).map_err(unreachable)?;
        let io: Box<dyn Io> = match &ep.tls {
            None => Box::new(tcp),
            Some((config, name)) => {
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| {
                        TransportError::Unreachable(format!("TLS: {}", error_chain(&e)))
                    })?;
                Box::new(tls)
            }
        };
        Ok(Conn {
            sender: hyper_framing::handshake(io).await?,
        })
    }

    async fn exchange(&self, conn: &mut Conn, req: &Request) -> Exchange {
        let req = hyper_framing::request(&self.endpoint, &self.headers, req);
        hyper_framing::exchange(&mut conn.sender, req).await
    }
}

impl Transport for Http1Transport {
    fn send(&self, req: Request) -> SendFuture<'_> {
        Box::pin(async move {
            let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let (mut conn, mut reused) = match pooled {
                Some(c) => (c, true),
                None => (self.connect().await?, false),
            };
            loop {
                match self.exchange(&mut conn, &req).await {
                    Exchange::Answered {
                        response,
                        keep_alive,
                    } => {
                        if keep_alive {
                            self.idle
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(conn);
                        }
                        return Ok(response);
                    }
                    // The server may close an idle connection at any time: one more try on a
                    // new one, only for a request it cannot have acted on (see `exchange`).
                    Exchange::NotSent(_) if reused => {
                        conn = self.connect().await?;
                        reused = false;
                    }
                    Exchange::NotSent(e) | Exchange::Broken(e) => return Err(e),
                }
            }
        })
    }
}

/// How one exchange on a connection ended.
enum Exchange {
    /// A complete answer; `keep_alive` when the connection can carry another request.
    Answered {
        response: Response,
        keep_alive: bool,
    },
    /// The request did not reach the server, or is safe to send again: nothing of an answer
    /// arrived.
    NotSent(TransportError),
    /// Part of an answer arrived, then it failed.
    Broken(TransportError),
}

/// Methods a server may see twice with the same effect (RFC 9110 §9.2.2).
fn is_idempotent(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::PUT | http::Method::DELETE
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A plain server on loopback answering each accepted connection from `script`: for every
    /// request it reads (head plus `Content-Length` body) it writes the next answer; `None`
    /// closes the connection instead. Returns the port and the requests seen.
    async fn server(script: Vec<Vec<Option<&'static [u8]>>>) -> (u16, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            for answers in script {
                let (mut sock, _) = listener.accept().await.unwrap();
                let record = record.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    for answer in answers {
                        let req = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                let head = String::from_utf8_lossy(&buf[..i]).to_string();
                                let len = head
                                    .lines()
                                    .find_map(|l| {
                                        l.to_ascii_lowercase()
                                            .strip_prefix("content-length:")
                                            .map(|v| v.trim().parse::<usize>().unwrap())
                                    })
                                    .unwrap_or(0);
                                if buf.len() >= i + 4 + len {
                                    let all: Vec<u8> = buf.drain(..i + 4 + len).collect();
                                    break String::from_utf8_lossy(&all).to_string();
                                }
                            }
                            let mut chunk = [0u8; 4096];
                            let n = sock.read(&mut chunk).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        };
                        record.lock().unwrap().push(req);
                        match answer {
                            Some(a) => sock.write_all(a).await.unwrap(),
                            None => return,
                        }
                    }
                });
            }
        });
        (port, seen)
    }

    fn transport(port: u16, base_path: &str) -> Http1Transport {
        Http1Transport::new(
            Endpoint {
                host: "127.0.0.1".into(),
                port,
                authority: format!("127.0.0.1:{port}"),
                base_path: base_path.into(),
                tls: None,
            },
            vec![(
                http::header::AUTHORIZATION,
                HeaderValue::from_static("Bearer tok"),
            )],
            Duration::from_secs(1),
        )
    }

    fn get(path: &str) -> Request {
        http::Request::get(path).body(Vec::new()).unwrap()
    }

    const OK: &[u8] =
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";

    #[tokio::test]
    async fn content_length_answers_share_one_connection() {
        let (port, seen) = server(vec![vec![Some(OK), Some(OK)]]).await;
        let t = transport(port, "");
        for _ in 0..2 {
            let r = t.send(get("/api/v1/namespaces/a/pods/b")).await.unwrap();
            assert_eq!(
                (r.status().as_u16(), r.body().as_slice()),
                (200, &b"{}"[..])
            );
        }
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen.len(),
            2,
            "both requests on the one accepted connection"
        );
        // Header names are case-insensitive (hyper writes them in lower case).
        assert!(
            seen[0].to_ascii_lowercase().starts_with(&format!(
                "get /api/v1/namespaces/a/pods/b http/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            )),
            "{}",
            seen[0]
        );
        assert!(
            seen[0].contains("authorization: Bearer tok\r\n"),
            "{}",
            seen[0]
        );
        assert!(!seen[0].to_ascii_lowercase().contains("content-length"));
    }

    #[tokio::test]
    async fn a_body_is_sent_with_its_length_under_the_base_path() {
        let (port, seen) = server(vec![vec![Some(OK)]]).await;
        let t = transport(port, "/k8s/clusters/c1");
        let req = http::Request::patch("/api/v1/namespaces/a/pods/b/status")
            .header(http::header::CONTENT_TYPE, "application/merge-patch+json")
            .body(br#"{"metadata":{}}"#.to_vec())
            .unwrap();
        t.send(req).await.unwrap();
        let seen = seen.lock().unwrap();
        assert!(
            seen[0].starts_with(
                "PATCH /k8s/clusters/c1/api/v1/namespaces/a/pods/b/status HTTP/1.1\r\n"
            ),
            "{}",
            seen[0]
        );
        assert!(seen[0].contains("content-type: application/merge-patch+json\r\n"));
        assert!(seen[0]
            .to_ascii_lowercase()
            .contains("content-length: 15\r\n"));
        assert!(
            seen[0].ends_with("\r\n\r\n{\"metadata\":{}}"),
            "{}",
            seen[0]
        );
    }

    #[tokio::test]
    async fn chunked_answers_with_trailers_and_interim_answers() {
        const CHUNKED: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\n{\"a\":\r\n3\r\n42}\r\n0\r\nX-Trailer: y\r\n\r\n";
        let (port, seen) = server(vec![vec![Some(CHUNKED), Some(OK)]]).await;
        let t = transport(port, "");
        let r = t.send(get("/x")).await.unwrap();
        assert_eq!(r.status().as_u16(), 404);
        assert_eq!(r.body().as_slice(), br#"{"a":42}"#);
        assert!(r.headers().get(http::header::TRANSFER_ENCODING).is_none());
        // The connection is still usable after a chunked answer.
        t.send(get("/y")).await.unwrap();
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn an_answer_up_to_end_of_stream_closes_the_connection() {
        const UNTIL_EOF: &[u8] = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"k\":1}";
        let (port, seen) = server(vec![vec![Some(UNTIL_EOF)], vec![Some(OK)]]).await;
        let t = transport(port, "");
        // The first server task returns after its answer, closing the socket.
        let r = t.send(get("/x")).await.unwrap();
        assert_eq!(r.body().as_slice(), br#"{"k":1}"#);
        let r = t.send(get("/y")).await.unwrap();
        assert_eq!(r.body().as_slice(), b"{}");
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_reused_connection_closed_while_idle_is_replaced_once() {
        // First connection: one answer, then closed without an answer to the second request.
        let (port, seen) = server(vec![vec![Some(OK), None], vec![Some(OK)]]).await;
        let t = transport(port, "");
        t.send(get("/1")).await.unwrap();
        let r = t.send(get("/2")).await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen.len(),
            3,
            "/2 sent on the old connection, then on a new one"
        );
        assert!(seen[2].starts_with("GET /2 "));
    }

    #[tokio::test]
    async fn a_request_unsafe_to_repeat_is_not_resent_on_a_new_connection() {
        // The server reads the POST on the reused connection and closes it unanswered: it
        // may have acted on it, so the client reports the failure instead of posting twice.
        let (port, seen) = server(vec![vec![Some(OK), None], vec![Some(OK)]]).await;
        let t = transport(port, "");
        t.send(get("/1")).await.unwrap();
        let post = http::Request::post("/api/v1/namespaces/a/events")
            .body(b"{}".to_vec())
            .unwrap();
        let err = t.send(post).await.unwrap_err();
        assert!(matches!(err, TransportError::Unreachable(_)), "{err:?}");
        assert_eq!(seen.lock().unwrap().len(), 2, "the POST was sent once");
    }

    #[tokio::test]
    async fn hostile_lengths_are_refused_without_a_panic() {
        const HUGE_CHUNK: &[u8] =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\nffffffffffffffff\r\n";
        const BAD_LENGTH: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\n{}";
        const LIST_LENGTH: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\n{}";
        for (answer, ok) in [
            (HUGE_CHUNK, false),
            (BAD_LENGTH, false),
            (LIST_LENGTH, true),
        ] {
            let (port, _) = server(vec![vec![Some(answer)]]).await;
            let got = transport(port, "").send(get("/x")).await;
            match (got, ok) {
                (Ok(r), true) => assert_eq!(r.body().as_slice(), b"{}"),
                (Err(TransportError::Other(_)), false) => {}
                // hyper takes the chunk size as given and reads until the server closes.
                (Err(TransportError::Unreachable(_)), false) if answer == HUGE_CHUNK => {}
                (other, _) => panic!("{}: {other:?}", String::from_utf8_lossy(answer)),
            }
        }
    }

    #[tokio::test]
    async fn a_fresh_connection_closed_without_an_answer_is_unreachable() {
        let (port, _) = server(vec![vec![None]]).await;
        let err = transport(port, "").send(get("/x")).await.unwrap_err();
        assert!(matches!(err, TransportError::Unreachable(_)), "{err:?}");
    }

    #[tokio::test]
    async fn a_truncated_body_is_unreachable_and_not_retried() {
        const SHORT: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}";
        let (port, seen) = server(vec![vec![Some(OK), Some(SHORT)], vec![Some(OK)]]).await;
        let t = transport(port, "");
        t.send(get("/1")).await.unwrap();
        let err = t.send(get("/2")).await.unwrap_err();
        assert!(matches!(err, TransportError::Unreachable(_)), "{err:?}");
        assert_eq!(
            seen.lock().unwrap().len(),
            2,
            "part of an answer came: no resend"
        );
    }

    #[tokio::test]
    async fn malformed_and_oversized_answers_are_refused() {
        const BAD: &[u8] = b"HTTX/1.1 200 OK\r\n\r\n";
        let (port, _) = server(vec![vec![Some(BAD)]]).await;
        let err = transport(port, "").send(get("/x")).await.unwrap_err();
        assert!(
            matches!(err, TransportError::Other(ref m) if m.contains("malformed")),
            "{err:?}"
        );

        const HUGE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n";
        let (port, _) = server(vec![vec![Some(HUGE)]]).await;
        let err = transport(port, "").send(get("/x")).await.unwrap_err();
        assert!(
            matches!(err, TransportError::Other(ref m) if m.contains("over")),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = transport(port, "").send(get("/x")).await.unwrap_err();
        assert!(
            matches!(err, TransportError::Unreachable(ref m) if m.contains("127.0.0.1")),
            "{err:?}"
        );
    }
}
