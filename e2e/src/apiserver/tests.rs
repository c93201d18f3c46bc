//! Tests of the test API server through the real `kube` client over real HTTP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{json, Value};

use super::{Access, RequestMatcher, TestApiServer, TestApiServerOptions};

const TOKEN: &str = "full-token";
const ADMIN: &str = "admin-token";

fn start() -> TestApiServer {
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
async fn client(srv: &TestApiServer, token: &str) -> Client {
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

fn api_err(r: Result<impl std::fmt::Debug, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn nad_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    )
}

/// One raw HTTP/1.1 request; returns status code and body.
fn raw_http(
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

#[tokio::test]
async fn typed_pod_get_patch_status_and_conflicts() {
    let srv = start();
    let pods: Api<Pod> = Api::namespaced(client(&srv, TOKEN).await, "a");

    let p = pods.get("p").await.expect("get");
    assert_eq!(p.metadata.name.as_deref(), Some("p"));
    let rv0 = p.metadata.resource_version.clone().expect("rv");
    let uid = p.metadata.uid.clone().expect("uid");
    assert!(pods.get_opt("missing").await.expect("get_opt").is_none());
    let s = api_err(pods.get("missing").await);
    assert_eq!(
        (s.code, s.reason.as_str(), s.message.as_str()),
        (404, "NotFound", "pods \"missing\" not found")
    );

    let patched = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": { "annotations": { "k8s.v1.cni.cncf.io/network-status": "[]" } },
                "spec": { "nodeName": "ignored-by-status" },
                "status": { "phase": "Failed" }
            })),
        )
        .await
        .expect("patch_status");
    let ann = patched.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("k8s.v1.cni.cncf.io/network-status")
            .map(String::as_str),
        Some("[]")
    );
    assert_eq!(
        ann.get("k8s.v1.cni.cncf.io/networks").map(String::as_str),
        Some("net1")
    );
    assert_ne!(
        patched.metadata.resource_version.as_deref(),
        Some(rv0.as_str())
    );
    let stored = srv.get_pod("a", "p").expect("stored");
    assert_eq!(stored["status"]["phase"], "Failed");
    assert_eq!(stored["spec"]["nodeName"], "node1");

    // Replace with the stale object: 409 Conflict with the real message.
    let s = api_err(pods.replace("p", &PostParams::default(), &p).await);
    assert_eq!(s.code, 409);
    assert_eq!(s.reason, "Conflict");
    assert_eq!(
        s.message,
        "Operation cannot be fulfilled on pods \"p\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // A stale resourceVersion in a patch body conflicts too; a wrong uid fails the precondition.
    let s = api_err(
        pods.patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": rv0}})),
        )
        .await,
    );
    assert_eq!(s.code, 409);
    let s = api_err(
        pods.patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"uid": "other-uid"}})),
        )
        .await,
    );
    assert_eq!(s.code, 409);
    assert!(
        s.message.contains(&format!(
            "Precondition failed: UID in precondition: other-uid, UID in object meta: {uid}"
        )),
        "{}",
        s.message
    );
    // The matching uid is accepted (this is how a uid precondition is sent in a patch).
    pods.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"uid": uid, "annotations": {"x": "y"}}})),
    )
    .await
    .expect("patch with matching uid");

    // Replace with the fresh object succeeds and keeps status (main resource ignores status).
    let mut fresh = pods.get("p").await.expect("get");
    fresh
        .metadata
        .labels
        .get_or_insert_default()
        .insert("new".into(), "label".into());
    let replaced = pods
        .replace("p", &PostParams::default(), &fresh)
        .await
        .expect("replace");
    assert_eq!(
        replaced
            .metadata
            .labels
            .unwrap_or_default()
            .get("new")
            .map(String::as_str),
        Some("label")
    );
}

#[tokio::test]
async fn replace_status_takes_annotations_not_spec() {
    let srv = start();
    let pods: Api<Pod> = Api::namespaced(client(&srv, TOKEN).await, "a");
    let mut p = pods.get("p").await.expect("get");
    p.metadata
        .annotations
        .get_or_insert_default()
        .insert("k8s.v1.cni.cncf.io/network-status".into(), "[]".into());
    if let Some(spec) = p.spec.as_mut() {
        spec.node_name = Some("elsewhere".into());
    }
    let updated = pods
        .replace_status("p", &PostParams::default(), &p)
        .await
        .expect("replace_status");
    assert!(updated
        .metadata
        .annotations
        .unwrap_or_default()
        .contains_key("k8s.v1.cni.cncf.io/network-status"));
    assert_eq!(
        updated.spec.and_then(|s| s.node_name).as_deref(),
        Some("node1")
    );
    // The same (now stale) body again: 409.
    let s = api_err(pods.replace_status("p", &PostParams::default(), &p).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
}

#[test]
fn server_handle_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<TestApiServer>();
}

#[tokio::test]
async fn create_delete_list_and_errors() {
    let srv = start();
    let c = client(&srv, TOKEN).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "a");
    let new: Pod = serde_json::from_value(json!({
        "metadata": { "name": "q", "labels": { "app": "y" } },
        "spec": { "containers": [{ "name": "c", "image": "i" }] }
    }))
    .expect("pod");
    let created = pods
        .create(&PostParams::default(), &new)
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(
        created.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    let s = api_err(pods.create(&PostParams::default(), &new).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(s.message, "pods \"q\" already exists");

    let mut bad = new.clone();
    bad.metadata.name = Some("Bad_Name".into());
    let s = api_err(pods.create(&PostParams::default(), &bad).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    let s = api_err(
        Api::<Pod>::namespaced(c.clone(), "nope")
            .create(&PostParams::default(), &new)
            .await,
    );
    assert_eq!(
        (s.code, s.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );

    let listed = pods
        .list(&ListParams::default().labels("app=y"))
        .await
        .expect("list");
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].metadata.name.as_deref(), Some("q"));
    let all = Api::<Pod>::all(c.clone())
        .list(&ListParams::default().fields("spec.nodeName=node1"))
        .await
        .expect("list all");
    assert_eq!(all.items.len(), 1);
    let s = api_err(
        Api::<Pod>::all(c.clone())
            .list(&ListParams::default().fields("spec.bogus=1"))
            .await,
    );
    assert_eq!(s.code, 400);

    let deleted = pods
        .delete("q", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(deleted.is_left(), "pods answer with the object");
    assert!(pods.get_opt("q").await.expect("get_opt").is_none());
    let s = api_err(pods.delete("q", &DeleteParams::default()).await);
    assert_eq!(s.code, 404);
    let s = api_err(
        pods.delete(
            "p",
            &DeleteParams::default().preconditions(kube::api::Preconditions {
                uid: Some("not-it".into()),
                resource_version: None,
            }),
        )
        .await,
    );
    assert_eq!(s.code, 409);

    // Watch is not implemented and says so.
    let s = api_err(
        c.request::<Value>(
            http::Request::get("/api/v1/namespaces/a/pods?watch=true")
                .body(Vec::new())
                .expect("req"),
        )
        .await,
    );
    assert_eq!(s.code, 405);
    assert_eq!(c.apiserver_version().await.expect("version").major, "1");
}

#[tokio::test]
async fn json_patch_and_content_types() {
    let srv = start();
    let c = client(&srv, TOKEN).await;
    let patch = |ct: &str, body: Value| {
        http::Request::patch("/api/v1/namespaces/a/pods/p")
            .header("content-type", ct)
            .body(serde_json::to_vec(&body).expect("json"))
            .expect("req")
    };
    let pod: Pod = c
        .request(patch(
            "application/json-patch+json",
            json!([
                {"op": "test", "path": "/metadata/annotations/k8s.v1.cni.cncf.io~1networks", "value": "net1"},
                {"op": "add", "path": "/metadata/annotations/k8s.v1.cni.cncf.io~1network-status", "value": "[{}]"},
                {"op": "remove", "path": "/metadata/labels/app"}
            ]),
        ))
        .await
        .expect("json patch");
    let ann = pod.metadata.annotations.unwrap_or_default();
    assert_eq!(
        ann.get("k8s.v1.cni.cncf.io/network-status")
            .map(String::as_str),
        Some("[{}]")
    );
    assert!(pod.metadata.labels.unwrap_or_default().is_empty());

    let s = api_err(
        c.request::<Pod>(patch(
            "application/json-patch+json",
            json!([{"op": "test", "path": "/metadata/name", "value": "other"}]),
        ))
        .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    let s = api_err(
        c.request::<Pod>(patch("application/apply-patch+yaml", json!({})))
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (415, "UnsupportedMediaType"));
    let pods: Api<Pod> = Api::namespaced(c.clone(), "a");
    let p = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"annotations": {"s": "1"}}})),
        )
        .await
        .expect("strategic");
    assert_eq!(
        p.metadata
            .annotations
            .unwrap_or_default()
            .get("s")
            .map(String::as_str),
        Some("1")
    );
}

#[tokio::test]
async fn auth_401_and_403() {
    let srv = start();
    srv.add_token_for("viewer-token", "viewer", Access::ReadOnly);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let anon = Client::try_from(Config::new(srv.url().parse().expect("url"))).expect("client");
    let s = api_err(Api::<Pod>::namespaced(anon, "a").get("p").await);
    assert_eq!((s.code, s.reason.as_str()), (401, "Unauthorized"));
    let s = api_err(
        Api::<Pod>::namespaced(client(&srv, "wrong").await, "a")
            .get("p")
            .await,
    );
    assert_eq!(s.code, 401);

    let ro: Api<Pod> = Api::namespaced(client(&srv, "viewer-token").await, "a");
    ro.get("p").await.expect("read-only get");
    let s = api_err(
        ro.patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"a": "b"}}})),
        )
        .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        s.message,
        r#"pods "p" is forbidden: User "viewer" cannot patch resource "pods/status" in API group "" in the namespace "a""#
    );
    assert!(
        srv.get_pod("a", "p").expect("pod")["metadata"]["annotations"]
            .get("a")
            .is_none()
    );
    let rec = srv.requests().into_iter().last().expect("record");
    assert_eq!((rec.status, rec.user.as_deref()), (403, Some("viewer")));
}

#[tokio::test]
async fn events_core_and_events_k8s_io() {
    let srv = start();
    let c = client(&srv, TOKEN).await;
    let core: CoreEvent = serde_json::from_value(json!({
        "metadata": { "name": "p.1" },
        "involvedObject": { "kind": "Pod", "namespace": "a", "name": "p" },
        "reason": "AddedInterface", "message": "Add net1", "type": "Normal"
    }))
    .expect("core event");
    Api::<CoreEvent>::namespaced(c.clone(), "a")
        .create(&PostParams::default(), &core)
        .await
        .expect("core event create");
    let v1: EventV1 = serde_json::from_value(json!({
        "metadata": { "generateName": "p." },
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "plexus", "reportingInstance": "node1",
        "action": "Add", "reason": "AddedInterface", "type": "Normal",
        "regarding": { "kind": "Pod", "namespace": "a", "name": "p" }
    }))
    .expect("v1 event");
    let created = Api::<EventV1>::namespaced(c.clone(), "a")
        .create(&PostParams::default(), &v1)
        .await
        .expect("events.k8s.io create");
    assert!(created.metadata.name.unwrap_or_default().starts_with("p."));
    let listed = Api::<CoreEvent>::namespaced(c.clone(), "a")
        .list(&ListParams::default().fields("involvedObject.name=p"))
        .await
        .expect("list");
    assert_eq!(listed.items.len(), 1);
    let evs = srv.events("a");
    assert_eq!(evs.len(), 2);
    assert_eq!(evs[0]["reason"], "AddedInterface");
    assert_eq!(evs[1]["apiVersion"], "events.k8s.io/v1");
    assert_eq!(
        srv.count_requests("POST", "/apis/events.k8s.io/v1/namespaces/a/events"),
        1
    );
}

#[tokio::test]
async fn nad_through_dynamic_object_and_discovery() {
    let srv = start();
    srv.put_nad(
        "a",
        "net1",
        r#"{"cniVersion":"1.0.0","type":"macvlan"}"#,
        &[("k8s.v1.cni.cncf.io/resourceName", "x/y")],
    )
    .expect("nad");
    let c = client(&srv, TOKEN).await;
    let (ar, _caps) = kube::discovery::pinned_kind(
        &c,
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
    )
    .await
    .expect("discovery");
    assert_eq!(ar, nad_resource());
    let nads: Api<DynamicObject> = Api::namespaced_with(c.clone(), "a", &ar);
    let n = nads.get("net1").await.expect("get nad");
    assert_eq!(
        n.data["spec"]["config"],
        r#"{"cniVersion":"1.0.0","type":"macvlan"}"#
    );
    assert_eq!(
        n.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("k8s.v1.cni.cncf.io/resourceName")
            .map(String::as_str),
        Some("x/y")
    );
    let s = api_err(nads.get("nope").await);
    assert_eq!(
        s.message,
        "network-attachment-definitions.k8s.cni.cncf.io \"nope\" not found"
    );

    let mut obj = DynamicObject::new("net2", &ar).within("a");
    obj.data = json!({ "spec": { "config": "{}" } });
    nads.create(&PostParams::default(), &obj)
        .await
        .expect("create nad");
    assert_eq!(
        nads.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        2
    );

    let mut stale = n.clone();
    nads.patch(
        "net1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"config": "{\"a\":1}"}})),
    )
    .await
    .expect("merge patch nad");
    stale.data["spec"]["config"] = json!("{}");
    let s = api_err(nads.replace("net1", &PostParams::default(), &stale).await);
    assert_eq!(s.code, 409);
    assert!(s.message.starts_with(
        "Operation cannot be fulfilled on network-attachment-definitions.k8s.cni.cncf.io \"net1\""
    ));

    let gone = nads
        .delete("net2", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(gone.is_right(), "custom resources answer with a Status");
    assert!(nads.get_opt("net2").await.expect("get_opt").is_none());
    assert!(srv.delete_nad("a", "net1"));
    assert!(srv.get_nad("a", "net1").is_none());
}

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
