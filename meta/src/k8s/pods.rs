//! GET the sandbox's pod, with bounded transient retry and the `K8S_POD_UID` check.
//!
//! The pod is read into [`PodView`], the few fields plexus uses, not into the whole
//! `k8s_openapi` Pod: the full type's deserializer (every volume source, container and
//! status field) is about 0.8 MB of code in a binary that runs for every CNI call.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerExtendedResourceRequest, Pod, PodExtendedResourceClaimStatus, PodResourceClaim,
    PodResourceClaimStatus, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::client::{built, KubeClient};
use super::error::{Ctx, K8sError};
use super::names::segment;
use super::retry::{self, RetryPolicy};

/// Pod annotation set by the kubelet on static (file/http-sourced) pods.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";

/// True for static pods: `kubernetes.io/config.source` is present and is not `"api"`.
/// Their API object is a mirror pod whose UID differs from the kubelet's.
pub fn is_static_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|src| src != "api")
}

/// The fields of a Pod object plexus reads (metadata, `spec.nodeName`, the DRA claim status).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodView {
    metadata: MetaView,
    spec: SpecView,
    status: StatusView,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MetaView {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    annotations: Option<BTreeMap<String, String>>,
    /// For the StatefulSet of a replica (fixed-ips).
    #[serde(rename = "ownerReferences")]
    owner_references: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct SpecView {
    node_name: Option<String>,
    /// `spec.resourceClaims`: a claim referenced by `resourceClaimName` appears only here
    /// (`status.resourceClaimStatuses` lists only claims made from templates).
    resource_claims: Option<Vec<ClaimRefView>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ClaimRefView {
    name: String,
    resource_claim_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct StatusView {
    resource_claim_statuses: Option<Vec<ClaimStatusView>>,
    extended_resource_claim_status: Option<ExtendedView>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ClaimStatusView {
    name: String,
    resource_claim_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ExtendedView {
    resource_claim_name: String,
    request_mappings: Vec<MappingView>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct MappingView {
    container_name: String,
    request_name: String,
    resource_name: String,
}

impl PodView {
    /// A `Pod` carrying exactly the fields read (everything else empty).
    pub fn into_pod(self) -> Pod {
        let status = (self.status.resource_claim_statuses.is_some()
            || self.status.extended_resource_claim_status.is_some())
        .then(|| PodStatus {
            resource_claim_statuses: self.status.resource_claim_statuses.map(|l| {
                l.into_iter()
                    .map(|c| PodResourceClaimStatus {
                        name: c.name,
                        resource_claim_name: c.resource_claim_name,
                    })
                    .collect()
            }),
            extended_resource_claim_status: self.status.extended_resource_claim_status.map(|e| {
                PodExtendedResourceClaimStatus {
                    resource_claim_name: e.resource_claim_name,
                    request_mappings: e
                        .request_mappings
                        .into_iter()
                        .map(|m| ContainerExtendedResourceRequest {
                            container_name: m.container_name,
                            request_name: m.request_name,
                            resource_name: m.resource_name,
                        })
                        .collect(),
                }
            }),
            ..PodStatus::default()
        });
        Pod {
            metadata: ObjectMeta {
                name: self.metadata.name,
                namespace: self.metadata.namespace,
                uid: self.metadata.uid,
                annotations: self.metadata.annotations,
                owner_references: self.metadata.owner_references,
                ..ObjectMeta::default()
            },
            spec: (self.spec.node_name.is_some() || self.spec.resource_claims.is_some()).then(
                || PodSpec {
                    node_name: self.spec.node_name,
                    resource_claims: self.spec.resource_claims.map(|l| {
                        l.into_iter()
                            .map(|c| PodResourceClaim {
                                name: c.name,
                                resource_claim_name: c.resource_claim_name,
                                ..PodResourceClaim::default()
                            })
                            .collect()
                    }),
                    ..PodSpec::default()
                },
            ),
            status,
        }
    }
}

/// A Pod object (JSON) read into a [`Pod`] with only the fields plexus uses.
pub fn pod_from_json(value: serde_json::Value) -> Result<Pod, serde_json::Error> {
    serde_json::from_value::<PodView>(value).map(PodView::into_pod)
}

impl KubeClient {
    /// GET `ns/name`. Transient errors are retried within `policy`; 404 gives `Ok(None)`
    /// at once. With `expected_uid` (non-empty), a different UID gives
    /// [`K8sError::UidMismatch`] unless the pod is static.
    pub async fn get_pod(
        &self,
        ns: &str,
        name: &str,
        expected_uid: Option<&str>,
        policy: RetryPolicy,
    ) -> Result<Option<Pod>, K8sError> {
        let _phase = plexus_delegates::timing::phase("pod_get");
        let ctx = Ctx {
            what: "get pod",
            ns,
            name,
        };
        K8sError::check_names(ctx)?;
        let url = format!("/api/v1/namespaces/{}/pods/{}", segment(ns), segment(name));
        let got = retry::run(policy, self.opts.request_timeout, ctx, || async {
            let req = http::Request::get(url.as_str()).body(Vec::new());
            let req = built(ctx, req.map_err(kube::core::request::Error::BuildRequest))?;
            self.fetch::<PodView>(ctx, req).await
        })
        .await;
        let pod = match got {
            Ok(view) => view.into_pod(),
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        if let Some(expected) = expected_uid.filter(|u| !u.is_empty()) {
            let got = pod.metadata.uid.as_deref().unwrap_or_default();
            if got != expected && !is_static_pod(&pod) {
                return Err(K8sError::UidMismatch {
                    ns: ns.to_owned(),
                    name: name.to_owned(),
                    expected: expected.to_owned(),
                    got: got.to_owned(),
                });
            }
        }
        Ok(Some(pod))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::testutil::{json_response, MockApi};
    use super::*;

    fn pod_json(uid: &str, source: Option<&str>) -> String {
        let ann = source
            .map(|s| format!(r#","annotations":{{"{CONFIG_SOURCE_ANNOTATION}":"{s}"}}"#))
            .unwrap_or_default();
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p1","namespace":"ns1","uid":"{uid}"{ann}}}}}"#
        )
    }

    fn fast() -> RetryPolicy {
        RetryPolicy {
            total: Duration::from_millis(400),
            interval: Duration::from_millis(20),
        }
    }

    #[tokio::test]
    async fn get_pod_request_shape_and_uid_ok() {
        let mock = MockApi::new(vec![json_response(200, &pod_json("u1", None))]);
        let pod = mock
            .client()
            .get_pod("ns1", "p1", Some("u1"), fast())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("p1"));
        let reqs = mock.requests();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].method, "GET");
        assert_eq!(reqs[0].path_and_query, "/api/v1/namespaces/ns1/pods/p1");
    }

    #[test]
    fn the_view_keeps_what_plexus_reads_and_ignores_the_rest() {
        let pod = pod_from_json(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "db-0", "namespace": "bank", "uid": "u-9",
                "annotations": {"k8s.v1.cni.cncf.io/networks": "sriov-a"}, "labels": {"app": "db"}},
            "spec": {"nodeName": "worker-3", "containers": [{"name": "db", "image": "pg",
                "resources": {"claims": [{"name": "vf"}]}}], "volumes": [{"name": "x", "emptyDir": {}}]},
            "status": {"phase": "Pending",
                "resourceClaimStatuses": [{"name": "vf", "resourceClaimName": "db-0-vf-abc"}],
                "extendedResourceClaimStatus": {"resourceClaimName": "db-0-ext",
                    "requestMappings": [{"containerName": "db", "resourceName": "intel.com/sriov", "requestName": "container-0-request-0"}]}}
        }))
        .unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("u-9"));
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()["k8s.v1.cni.cncf.io/networks"],
            "sriov-a"
        );
        assert!(pod.metadata.labels.is_none());
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("worker-3"));
        assert!(spec.containers.is_empty());
        let status = pod.status.as_ref().unwrap();
        let claims = status.resource_claim_statuses.as_ref().unwrap();
        assert_eq!(
            claims[0].resource_claim_name.as_deref(),
            Some("db-0-vf-abc")
        );
        let ext = status.extended_resource_claim_status.as_ref().unwrap();
        assert_eq!(ext.resource_claim_name, "db-0-ext");
        assert_eq!(ext.request_mappings[0].resource_name, "intel.com/sriov");
        assert!(status.phase.is_none());

        // A bare object (no spec, no status) reads as such.
        let bare = pod_from_json(serde_json::json!({"metadata": {"name": "p"}})).unwrap();
        assert!(bare.spec.is_none() && bare.status.is_none());
        // A wrong type is still an error.
        assert!(pod_from_json(serde_json::json!({"metadata": {"uid": 7}})).is_err());
    }

    #[tokio::test]
    async fn not_found_is_none_without_retry() {
        let mock = MockApi::new(vec![json_response(
            404,
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"pods \"p1\" not found","details":{"name":"p1","kind":"pods"}}"#,
        )]);
        let got = mock
            .client()
            .get_pod("ns1", "p1", Some("u1"), fast())
            .await
            .unwrap();
        assert!(got.is_none());
        assert_eq!(mock.requests().len(), 1);
    }

    /// A 404 that does not name the pod (a wrong server path, a proxy) is an error, not "the
    /// pod was deleted" (which would silently give the pod its default network only).
    #[tokio::test]
    async fn a_404_for_a_wrong_path_is_an_error() {
        for body in [
            "404 page not found",
            r#"{"kind":"Status","status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#,
        ] {
            let mock = MockApi::new(vec![json_response(404, body)]);
            let err = mock
                .client()
                .get_pod("ns1", "p1", Some("u1"), fast())
                .await
                .unwrap_err();
            assert!(matches!(err, K8sError::NoSuchPath { .. }), "{err:?}");
            assert_eq!(mock.requests().len(), 1, "not retried");
        }
    }

    /// Names that would address another object never reach the API server.
    #[tokio::test]
    async fn names_outside_kubernetes_names_are_not_requested() {
        for (ns, name) in [
            ("ns1", "../../secrets/s"),
            ("ns1", "p1?dryRun=All"),
            ("ns1/pods/other", "p1"),
            ("ns1", "p1/status"),
            ("", "p1"),
        ] {
            let mock = MockApi::new(vec![json_response(200, &pod_json("u1", None))]);
            let err = mock
                .client()
                .get_pod(ns, name, None, fast())
                .await
                .unwrap_err();
            assert!(matches!(err, K8sError::InvalidName { .. }), "{err:?}");
            assert_eq!(err.cni_code(), 7);
            assert!(mock.requests().is_empty(), "{ns}/{name} was requested");
        }
    }

    #[tokio::test]
    async fn uid_mismatch_and_static_exemption() {
        let mock = MockApi::new(vec![json_response(200, &pod_json("other", None))]);
        let err = mock
            .client()
            .get_pod("ns1", "p1", Some("u1"), fast())
            .await
            .unwrap_err();
        match err {
            K8sError::UidMismatch { expected, got, .. } => {
                assert_eq!((expected.as_str(), got.as_str()), ("u1", "other"));
            }
            other => panic!("unexpected {other:?}"),
        }

        // config.source=api is a normal pod: still a mismatch.
        let mock = MockApi::new(vec![json_response(200, &pod_json("other", Some("api")))]);
        assert!(mock
            .client()
            .get_pod("ns1", "p1", Some("u1"), fast())
            .await
            .is_err());

        // Static (file-sourced) pod: mirror UID differs, accepted.
        let mock = MockApi::new(vec![json_response(200, &pod_json("mirror", Some("file")))]);
        let pod = mock
            .client()
            .get_pod("ns1", "p1", Some("u1"), fast())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("mirror"));

        // No expected UID: no check.
        let mock = MockApi::new(vec![json_response(200, &pod_json("other", None))]);
        assert!(mock
            .client()
            .get_pod("ns1", "p1", None, fast())
            .await
            .unwrap()
            .is_some());
    }

    #[tokio::test]
    async fn transient_errors_are_retried_then_succeed() {
        let mock = MockApi::new(vec![
            json_response(
                503,
                r#"{"kind":"Status","code":503,"reason":"ServiceUnavailable","message":"x"}"#,
            ),
            json_response(
                429,
                r#"{"kind":"Status","code":429,"reason":"TooManyRequests","message":"x"}"#,
            ),
            json_response(200, &pod_json("u1", None)),
        ]);
        let pod = mock
            .client()
            .get_pod("ns1", "p1", Some("u1"), fast())
            .await
            .unwrap();
        assert!(pod.is_some());
        assert_eq!(mock.requests().len(), 3);
    }

    #[tokio::test]
    async fn non_transient_error_is_not_retried() {
        let mock = MockApi::new(vec![json_response(
            403,
            r#"{"kind":"Status","code":403,"reason":"Forbidden","message":"no"}"#,
        )]);
        let err = mock
            .client()
            .get_pod("ns1", "p1", None, fast())
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::Api { code: 403, .. }), "{err:?}");
        assert_eq!(mock.requests().len(), 1);
    }

    #[tokio::test]
    async fn transient_retry_is_bounded_by_time() {
        // Always 500: gives up after ~total, having retried every ~interval.
        let mock = MockApi::repeating(json_response(
            500,
            r#"{"kind":"Status","code":500,"reason":"InternalError","message":"x"}"#,
        ));
        let policy = RetryPolicy {
            total: Duration::from_millis(300),
            interval: Duration::from_millis(50),
        };
        let start = Instant::now();
        let err = mock
            .client()
            .get_pod("ns1", "p1", None, policy)
            .await
            .unwrap_err();
        let took = start.elapsed();
        assert!(err.is_transient(), "{err:?}");
        let n = mock.requests().len();
        assert!((4..=7).contains(&n), "attempts {n}");
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_millis(1000), "{took:?}");
    }

    #[tokio::test]
    async fn hung_request_times_out() {
        let mock = MockApi::hanging();
        let opts = super::super::client::ClientOptions {
            request_timeout: Duration::from_millis(100),
            ..Default::default()
        };
        let client = mock.client_with(opts);
        let start = Instant::now();
        let err = client
            .get_pod("ns1", "p1", None, RetryPolicy::none())
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::Timeout { .. }), "{err:?}");
        assert!(start.elapsed() < Duration::from_millis(600));
    }
}
