//! Pods: get, status patches and replaces, conflicts, create/delete/list, JSON patch, auth.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Config};
use serde_json::{json, Value};

use super::super::{Access, TestApiServer};
use super::*;

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
    // A stale resourceVersion in a patch body conflicts too; a wrong uid in a patch is an
    // immutable-field error (422), as a real kube-apiserver answers (not a 409 precondition).
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
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        s.message,
        "Pod \"p\" is invalid: metadata.uid: Invalid value: \"other-uid\": field is immutable"
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
