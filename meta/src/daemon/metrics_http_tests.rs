use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Fixed {
    ready: bool,
}

impl MetricsSource for Fixed {
    fn render(&self) -> String {
        "# TYPE plexus_up gauge\nplexus_up 1\n# EOF\n".into()
    }
    fn ready(&self) -> Result<(), String> {
        if self.ready {
            Ok(())
        } else {
            Err("caches not synced".into())
        }
    }
}

/// One HTTP/1.1 request (Connection: close); the status code and the whole answer.
async fn ask(port: u16, head: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("{head}\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}

async fn start_plain(ready: bool) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(serve(l, Access::LoopbackOnly, Arc::new(Fixed { ready })));
    port
}

#[tokio::test]
async fn loopback_serves_metrics_health_and_readiness() {
    let port = start_plain(false).await;
    let (code, out) = ask(port, "GET /metrics HTTP/1.1").await;
    assert_eq!(code, 200, "{out}");
    assert!(out.contains("application/openmetrics-text"), "{out}");
    assert!(out.contains("plexus_up 1"), "{out}");
    assert_eq!(ask(port, "GET /healthz HTTP/1.1").await.0, 200);
    let (code, out) = ask(port, "GET /readyz HTTP/1.1").await;
    assert_eq!(code, 503, "{out}");
    assert!(out.contains("caches not synced"), "{out}");
    assert_eq!(ask(port, "GET /nothing HTTP/1.1").await.0, 404);
    let ready = start_plain(true).await;
    assert_eq!(ask(ready, "GET /readyz HTTP/1.1").await.0, 200);
}

#[tokio::test]
async fn only_get_and_head() {
    let port = start_plain(true).await;
    let (code, out) = ask(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0").await;
    assert_eq!(code, 405, "{out}");
    assert!(
        out.to_ascii_lowercase().contains("allow: get, head"),
        "{out}"
    );
    assert_eq!(ask(port, "DELETE /healthz HTTP/1.1").await.0, 405);
    let (code, out) = ask(port, "HEAD /metrics HTTP/1.1").await;
    assert_eq!(code, 200, "{out}");
    assert!(!out.contains("plexus_up"), "HEAD has no body: {out}");
}

#[test]
fn bearer_tokens() {
    let h = |v: &str| {
        let mut m = hyper::HeaderMap::new();
        m.insert(AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        m
    };
    assert_eq!(bearer(&h("Bearer abc.def")), Some("abc.def"));
    assert_eq!(bearer(&h("bearer  abc ")), Some("abc"));
    assert_eq!(bearer(&h("Basic dXNlcjpwYXNz")), None);
    assert_eq!(bearer(&h("Bearer ")), None);
    assert_eq!(bearer(&hyper::HeaderMap::new()), None);
    assert_ne!(token_key("a"), token_key("b"));
}

#[test]
fn insecure_http_only_on_loopback_and_https_needs_the_api() {
    let insecure = Serving {
        metrics_insecure_http: true,
        ..Default::default()
    };
    let lo: SocketAddr = "127.0.0.1:9109".parse().unwrap();
    let node: SocketAddr = "10.0.0.5:9109".parse().unwrap();
    assert!(matches!(
        insecure.plan(&lo, None),
        Ok((Transport::Http, Access::LoopbackOnly))
    ));
    let e = insecure.plan(&node, None).err().unwrap();
    assert!(e.contains("only on a loopback address"), "{e}");
    let e = Serving::default().plan(&node, None).err().unwrap();
    assert!(e.contains("no API is configured"), "{e}");
    assert!(matches!(
        Serving::default().plan(&lo, None),
        Ok((Transport::Http, Access::LoopbackOnly))
    ));
    let any: SocketAddr = "0.0.0.0:9109".parse().unwrap();
    assert!(
        Serving::default().plan(&any, None).is_err(),
        "0.0.0.0 is not loopback"
    );
    let files = Serving {
        metrics_cert_file: "/nonexistent.crt".into(),
        ..Default::default()
    };
    let e = files.plan(&lo, None).err().unwrap();
    assert!(
        e.contains("no API is configured"),
        "a cert asks for HTTPS and the reviews: {e}"
    );
}

#[test]
fn flags() {
    let mut s = Serving::default();
    let mut v = || Ok::<_, String>("/x.pem".to_string());
    assert!(s.parse_flag("--metrics-insecure-http", &mut v).unwrap());
    assert!(s.parse_flag("--metrics-cert-file", &mut v).unwrap());
    assert!(!s.parse_flag("--socket", &mut v).unwrap());
    assert!(s.metrics_insecure_http);
    assert_eq!(s.metrics_cert_file, "/x.pem");
}

#[test]
fn self_signed_and_pem_files() {
    assert!(tls_self_signed("10.1.2.3".parse().unwrap()).is_ok());
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&c, ck.cert.pem()).unwrap();
    std::fs::write(&k, ck.signing_key.serialize_pem()).unwrap();
    assert!(tls_from_files(c.to_str().unwrap(), k.to_str().unwrap()).is_ok());
    let e = tls_from_files(k.to_str().unwrap(), k.to_str().unwrap())
        .err()
        .unwrap();
    assert!(e.contains("--metrics-cert-file"), "{e}");
}

#[test]
fn allowed_tokens_are_remembered_bounded() {
    let st = State {
        access: Access::LoopbackOnly,
        source: Arc::new(Fixed { ready: true }),
        allowed: Mutex::new(HashMap::new()),
    };
    for i in 0..CACHE_MAX + 10 {
        st.remember(token_key(&i.to_string()));
    }
    assert!(st.allowed.lock().unwrap().len() <= CACHE_MAX);
    assert!(st.cached(&token_key(&(CACHE_MAX + 9).to_string())));
    assert!(!st.cached(&token_key("never")));
}

#[test]
fn a_bare_ipv6_node_address_gets_brackets() {
    assert_eq!(bracket_ipv6("fd00::5:9109"), "[fd00::5]:9109");
    assert_eq!(bracket_ipv6("[fd00::5]:9109"), "[fd00::5]:9109");
    assert_eq!(bracket_ipv6("10.0.0.5:9109"), "10.0.0.5:9109");
    assert_eq!(bracket_ipv6("localhost:9109"), "localhost:9109");
}
