//! Events (core and events.k8s.io) and NetworkAttachmentDefinitions, with discovery.

use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::api::{
    DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::Api;
use serde_json::json;

use super::*;

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
