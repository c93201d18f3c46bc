//! Tests of the test API server through the real `kube` client over real HTTP.

mod faults;
mod pods;
mod resources;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use kube::api::{ApiResource, GroupVersionKind};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

use super::{Access, TestApiServer, TestApiServerOptions};

pub(super) const TOKEN: &str = "full-token";
pub(super) const ADMIN: &str = "admin-token";

pub(super) fn start() -> TestApiServer {
    let srv = TestApiServer::start(TestApiServerOptions {
        admin_token: Some(ADMIN.into()),
        ..Default::default()
    })
    .expect("start server");
    srv.add_token_for(TOKEN, "tester", Access::Full);
    srv.put_namespace("a").expect("namespace");
    srv.put_pod(json!({
        "metadata": { "name": "p", "namespace": "a", "labels": { "app": "x" },
                      "annotations": { "k8s.v1.cni.cncf.io/networks": "net1" } },
        "spec": { "containers": [{ "name": "c", "image": "busybox" }], "nodeName": "node1" },
        "status": { "phase": "Running" }
    }))
    .expect("pod");
    srv
}

/// A kube client configured from the kubeconfig file the server writes.
pub(super) async fn client(srv: &TestApiServer, token: &str) -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    srv.write_kubeconfig(&path, token).expect("kubeconfig");
    let kc = Kubeconfig::read_from(&path).expect("read kubeconfig");
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    assert_eq!(cfg.cluster_url.to_string(), format!("{}/", srv.url()));
    Client::try_from(cfg).expect("client")
}

pub(super) fn api_err(r: Result<impl std::fmt::Debug, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub(super) fn nad_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    )
}

/// One raw HTTP/1.1 request; returns status code and body.
pub(super) fn raw_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

#[test]
fn seeding_from_a_directory_and_kubeconfig_mode() {
    use std::os::unix::fs::PermissionsExt;
    let srv = TestApiServer::start(TestApiServerOptions::default()).expect("start");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("a.json"),
        json!({"kind": "List", "apiVersion": "v1", "items": [
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s", "namespace": "seeded"}, "spec": {"containers": []}},
            {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
             "metadata": {"name": "n", "namespace": "seeded"}, "spec": {"config": "{}"}}
        ]})
        .to_string(),
    )
    .expect("write");
    std::fs::write(
        dir.path().join("b.json"),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "seeded", "labels": {"team": "x"}}}).to_string(),
    )
    .expect("write");
    std::fs::write(dir.path().join("ignored.txt"), "not json").expect("write");
    assert_eq!(srv.load_dir(dir.path()).expect("load"), 3);
    assert!(srv.get_pod("seeded", "s").is_some());
    assert!(srv.get_nad("seeded", "n").is_some());
    let bad =
        srv.put_object(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}}));
    assert!(bad.is_err());
    assert!(srv.put_pod(json!({"metadata": {"name": "UPPER"}})).is_err());

    let kc = dir.path().join("kc");
    srv.write_kubeconfig(&kc, "t").expect("kubeconfig");
    assert_eq!(
        std::fs::metadata(&kc).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    assert!(srv.delete_pod("seeded", "s"));
    assert!(!srv.delete_pod("seeded", "s"));
    srv.stop();
}
