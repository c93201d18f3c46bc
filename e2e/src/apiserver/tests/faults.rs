//! Down/up, the request log, admin endpoints and HTTPS.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Config};
use serde_json::{json, Value};

use super::super::{Access, TestApiServer, TestApiServerOptions};
use super::*;

#[tokio::test]
async fn request_log_counts_and_waits() {
    let srv = start();
    let c = client(&srv, TOKEN).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "a");
    pods.get("p").await.expect("warm up");
    srv.clear_requests();

    pods.get("p").await.expect("get");
    assert!(pods.get_opt("other").await.expect("get other").is_none());
    pods.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Failed"}})),
    )
    .await
    .expect("patch status");
    let recs = srv.requests();
    let got: Vec<(&str, &str, u16)> = recs
        .iter()
        .map(|r| (r.method.as_str(), r.path.as_str(), r.status))
        .collect();
    assert_eq!(
        got,
        vec![
            ("GET", "/api/v1/namespaces/a/pods/p", 200),
            ("GET", "/api/v1/namespaces/a/pods/other", 404),
            ("PATCH", "/api/v1/namespaces/a/pods/p/status", 200),
        ]
    );
    assert_eq!(
        srv.count_requests("PATCH", "/api/v1/namespaces/a/pods/p/status"),
        1
    );
    assert_eq!(srv.count_requests("GET", "/api/v1/namespaces/a/pods/"), 2);
    assert!(srv.wait_for_requests(
        "GET",
        "/api/v1/namespaces/a/pods/p",
        1,
        Duration::from_secs(1)
    ));
    assert!(!srv.wait_for_requests(
        "GET",
        "/api/v1/namespaces/a/pods/p",
        99,
        Duration::from_millis(50)
    ));
}

#[tokio::test]
async fn down_refuses_connections_and_up_rebinds_same_port() {
    let srv = start();
    let pods: Api<Pod> = Api::namespaced(client(&srv, TOKEN).await, "a");
    pods.get("p").await.expect("up");
    let addr = srv.addr();

    srv.down();
    assert!(!srv.is_up());
    let err = TcpStream::connect(addr).expect_err("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    match pods.get("p").await {
        Err(kube::Error::Api(s)) => panic!("expected a transport error, got API status {s:?}"),
        Err(_) => {}
        Ok(_) => panic!("request succeeded while down"),
    }

    srv.up().expect("up");
    assert_eq!(srv.addr(), addr);
    pods.get("p").await.expect("works again on the same port");
}

#[test]
fn admin_endpoints_read_the_log_and_take_the_server_down() {
    let srv = start();
    let addr = srv.addr();
    assert_eq!(
        raw_http(addr, "GET", "/_test/requests", Some("bad"), "").0,
        401
    );
    assert_eq!(
        raw_http(addr, "GET", "/api/v1/namespaces/a/pods/p", None, "").0,
        401
    );
    let (code, body) = raw_http(addr, "GET", "/api/v1/namespaces/a/pods/p", Some(TOKEN), "");
    assert_eq!(code, 200, "{body}");

    let (code, body) = raw_http(addr, "GET", "/api/v1/namespaces/a/pods/x", Some(TOKEN), "");
    assert_eq!(code, 404);
    let status: Value = serde_json::from_str(&body).expect("status");
    assert_eq!(status["reason"], "NotFound");
    assert_eq!(status["kind"], "Status");

    let (code, body) = raw_http(addr, "GET", "/_test/requests", Some(ADMIN), "");
    assert_eq!(code, 200);
    let log: Value = serde_json::from_str(&body).expect("log");
    let statuses: Vec<u64> = log
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|r| r["status"].as_u64())
        .collect();
    assert_eq!(statuses, vec![401, 200, 404]);
    assert!(!body.contains(TOKEN), "the log must not contain tokens");

    let (code, _) = raw_http(addr, "POST", "/_test/down", Some(ADMIN), r#"{"ms":400}"#);
    assert_eq!(code, 202);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        TcpStream::connect(addr).expect_err("down").kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !srv.is_up() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        raw_http(addr, "GET", "/api/v1/namespaces/a/pods/p", Some(TOKEN), "").0,
        200
    );
}

#[tokio::test]
async fn https_with_generated_ca() {
    let srv = TestApiServer::start(TestApiServerOptions {
        tls: true,
        ..Default::default()
    })
    .expect("start tls");
    srv.add_token(TOKEN, Access::Full);
    srv.put_pod(json!({"metadata": {"name": "p", "namespace": "a"}, "spec": {"containers": []}}))
        .expect("pod");
    assert!(srv.url().starts_with("https://127.0.0.1:"));
    assert!(srv
        .ca_pem()
        .expect("ca")
        .starts_with("-----BEGIN CERTIFICATE-----"));
    let pods: Api<Pod> = Api::namespaced(client(&srv, TOKEN).await, "a");
    pods.get("p").await.expect("get over https");

    // Without the CA the client must refuse the server certificate.
    let mut cfg = Config::new(srv.url().parse().expect("url"));
    cfg.auth_info.token = Some(TOKEN.to_string().into());
    let untrusting: Api<Pod> = Api::namespaced(Client::try_from(cfg).expect("client"), "a");
    match untrusting.get("p").await {
        Err(kube::Error::Api(s)) => panic!("expected a TLS error, got API status {s:?}"),
        Err(_) => {}
        Ok(_) => panic!("an unknown CA was trusted"),
    }
    // A plain HTTP request to the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(srv.addr()).expect("connect");
    plain
        .write_all(b"GET /api HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut out = Vec::new();
    let _ = plain.read_to_end(&mut out); // a reset is fine too
    assert!(
        !out.starts_with(b"HTTP/"),
        "plain HTTP was answered on the TLS port"
    );
    srv.down();
    srv.up().expect("up");
    pods.get("p").await.expect("get over https after down/up");
}
