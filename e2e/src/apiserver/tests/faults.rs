//! Faults (latency, injected errors, down/up), the request log, admin endpoints and HTTPS.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Config};
use serde_json::{json, Value};

use super::super::{Access, RequestMatcher, TestApiServer, TestApiServerOptions};
use super::*;

#[tokio::test]
async fn faults_latency_failures_and_request_log() {
    let srv = start();
    let c = client(&srv, TOKEN).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "a");
    pods.get("p").await.expect("warm up");
    srv.clear_requests();

    srv.set_latency(
        Duration::from_millis(250),
        RequestMatcher::method("GET").and_path("/pods/p"),
    );
    let t = Instant::now();
    pods.get("p").await.expect("slow get");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    assert!(pods.get_opt("other").await.expect("fast").is_none());
    srv.clear_latency();
    let recs = srv.requests();
    assert_eq!(recs.len(), 2);
    assert!(recs[0].duration >= Duration::from_millis(250));
    assert!(
        recs[1].duration < Duration::from_millis(250),
        "{:?}",
        recs[1].duration
    );
    assert_eq!(recs[1].status, 404);

    // kube retries 503 by default: two injected 503s, then the real answer, in one call.
    srv.clear_requests();
    srv.fail_next(2, 503, RequestMatcher::path("/pods/p"));
    pods.get("p").await.expect("get after retried 503s");
    let codes: Vec<(u16, bool)> = srv
        .requests()
        .iter()
        .map(|r| (r.status, r.injected))
        .collect();
    assert_eq!(codes, vec![(503, true), (503, true), (200, false)]);

    // 500 is not retried: the client sees the injected Status.
    srv.fail_next(1, 500, RequestMatcher::method("PATCH"));
    let s = api_err(
        pods.patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"));
    assert_eq!(srv.pending_failures(), 0);
    assert_eq!(
        srv.get_pod("a", "p").expect("pod")["status"]["phase"],
        "Running"
    );
    assert_eq!(
        srv.count_requests("PATCH", "/api/v1/namespaces/a/pods/p/status"),
        1
    );
    assert_eq!(srv.count_requests("GET", "/api/v1/namespaces/a/pods/"), 3);

    // A dropped connection is a transport error, not an API status; the pod is untouched.
    srv.drop_next(1, RequestMatcher::method("PATCH"));
    match pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
    {
        Err(kube::Error::Api(s)) => panic!("expected a transport error, got API status {s:?}"),
        Err(_) => {}
        Ok(_) => panic!("a dropped request succeeded"),
    }
    let last = srv.requests().into_iter().last().expect("record");
    assert_eq!(
        (last.method.as_str(), last.status, last.injected),
        ("PATCH", 0, true)
    );
    assert_eq!(
        srv.get_pod("a", "p").expect("pod")["status"]["phase"],
        "Running"
    );
    pods.get("p")
        .await
        .expect("the client reconnects after a drop");
    assert!(srv.wait_for_requests(
        "GET",
        "/api/v1/namespaces/a/pods/p",
        4,
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
fn admin_endpoints_drive_faults_from_another_process() {
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

    let (code, _) = raw_http(
        addr,
        "POST",
        "/_test/fail",
        Some(ADMIN),
        r#"{"count":1,"code":503,"pathContains":"/pods/p"}"#,
    );
    assert_eq!(code, 200);
    let (code, body) = raw_http(addr, "GET", "/api/v1/namespaces/a/pods/p", Some(TOKEN), "");
    assert_eq!(code, 503);
    let status: Value = serde_json::from_str(&body).expect("status");
    assert_eq!(status["reason"], "ServiceUnavailable");
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
    assert_eq!(statuses, vec![401, 200, 503]);
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
