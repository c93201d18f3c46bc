//! LIST the pods of a namespace with only what the address guard reads: name, UID, phase,
//! deletion, and the network-status annotation (one request; RBAC `list` on pods, granted by
//! `deploy/components/fixed-ips/rbac-fixed-ips.yaml` in thin mode and
//! `deploy/components/daemon/rbac-daemon.yaml` in daemon mode).

use serde::Deserialize;
use std::collections::BTreeMap;

use super::client::{built, KubeClient};
use super::error::{Ctx, K8sError};
use super::retry::{self, RetryPolicy};
use super::status::NETWORK_STATUS_ANNOTATION;

/// A pod of the namespace as the address guard sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedPod {
    /// `metadata.name`
    pub name: String,
    /// `metadata.uid`
    pub uid: String,
    /// `metadata.deletionTimestamp` is set (the pod is terminating, its sandbox may still run).
    pub terminating: bool,
    /// `status.phase` is `Succeeded` or `Failed` (its sandbox is gone).
    pub finished: bool,
    /// The network-status annotation, if any.
    pub network_status: Option<String>,
}

#[derive(Deserialize)]
struct ListView {
    #[serde(default)]
    items: Vec<ItemView>,
}

#[derive(Deserialize)]
struct ItemView {
    #[serde(default)]
    metadata: MetaView,
    #[serde(default)]
    status: Option<StatusView>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaView {
    #[serde(default)]
    name: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    deletion_timestamp: Option<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct StatusView {
    #[serde(default)]
    phase: Option<String>,
}

impl KubeClient {
    /// LIST the pods of `ns` (transient errors retried within `policy`).
    pub async fn list_pods(
        &self,
        ns: &str,
        policy: RetryPolicy,
    ) -> Result<Vec<ListedPod>, K8sError> {
        let ctx = Ctx {
            what: "list pods",
            ns,
            name: "",
        };
        K8sError::check_namespace(ctx)?;
        let url = format!("/api/v1/namespaces/{}/pods", super::names::segment(ns));
        let view = retry::run(policy, self.options().request_timeout, ctx, || async {
            let req = http::Request::get(url.as_str()).body(Vec::new());
            let req = built(ctx, req.map_err(kube::core::request::Error::BuildRequest))?;
            self.fetch::<ListView>(ctx, req).await
        })
        .await?;
        Ok(view
            .items
            .into_iter()
            .map(|mut i| ListedPod {
                name: i.metadata.name,
                uid: i.metadata.uid,
                terminating: i.metadata.deletion_timestamp.is_some(),
                finished: matches!(
                    i.status.and_then(|s| s.phase).as_deref(),
                    Some("Succeeded" | "Failed")
                ),
                network_status: i.metadata.annotations.remove(NETWORK_STATUS_ANNOTATION),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{json_response, MockApi};
    use super::*;

    #[test]
    fn keeps_what_the_guard_reads() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _in = rt.enter();
        let body = r#"{"kind":"PodList","items":[
            {"metadata":{"name":"a","uid":"u1","annotations":{"k8s.v1.cni.cncf.io/network-status":"[]"}},"status":{"phase":"Running"}},
            {"metadata":{"name":"b","uid":"u2","deletionTimestamp":"2026-01-01T00:00:00Z"},"status":{"phase":"Failed"}}]}"#;
        let client = MockApi::repeating(json_response(200, body)).client();
        let got = rt
            .block_on(client.list_pods("db", RetryPolicy::default()))
            .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].network_status.as_deref(), Some("[]"));
        assert!(!got[0].terminating && !got[0].finished);
        assert!(got[1].terminating && got[1].finished);
    }
}
