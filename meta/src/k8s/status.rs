//! Write the `k8s.v1.cni.cncf.io/network-status` annotation with ONE merge PATCH of
//! `pods/{name}/status`, guarded by a `metadata.uid` precondition.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::Resource;

use super::client::{built, KubeClient};
use super::error::{Ctx, K8sError};
use super::names::segment;
use super::retry;

/// The pod annotation holding the network status.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";

/// Attempts on HTTP 409 Conflict (other than a failed UID precondition).
const CONFLICT_ATTEMPTS: u32 = 5;
/// Pause after a conflict.
const CONFLICT_PAUSE: Duration = Duration::from_millis(10);

/// The merge-patch body: the UID (a precondition for the API server) and the annotation.
pub fn network_status_patch(uid: &str, status_json: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "uid": uid,
            "annotations": { NETWORK_STATUS_ANNOTATION: status_json },
        }
    })
}

/// True for the API server's answer to a `metadata.uid` that is not the pod's.
///
/// A real kube-apiserver validates the UID of a merge PATCH as an immutable field: HTTP 422
/// `Pod "p" is invalid: metadata.uid: Invalid value: "…": field is immutable` (measured on
/// v1.36, issue 7). A 409 `Precondition failed: UID in precondition` is what an update with a
/// UID precondition gets; both mean the pod under this name is another one.
fn is_uid_precondition_failure(err: &K8sError) -> bool {
    match err {
        K8sError::Api {
            code: 409, message, ..
        } => message.contains("Precondition failed") && message.contains("UID"),
        K8sError::Api {
            code: 422, message, ..
        } => message.contains("metadata.uid") && message.contains("field is immutable"),
        _ => false,
    }
}

impl KubeClient {
    /// Set the network-status annotation of pod `ns/name` whose UID must be `uid`.
    ///
    /// One merge PATCH to `pods/{name}/status` (RBAC: `pods/status: patch`). Transient errors
    /// are retried within the client's policy, 409 Conflict up to 5 times. Errors:
    /// [`K8sError::PodGone`] on 404 (callers tolerate it), [`K8sError::PodReplaced`] when a pod
    /// with another UID now has this name (nothing is written).
    pub async fn set_network_status(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        status_json: &str,
    ) -> Result<(), K8sError> {
        self.set_network_status_with(ns, name, uid, status_json, self.opts.retry)
            .await
    }

    /// [`Self::set_network_status`] with transient errors retried within `retry` instead of
    /// the client's policy: a caller that must be able to drop the write between two attempts
    /// (daemon mode's background writer) passes [`retry::RetryPolicy::none`] and retries itself.
    pub async fn set_network_status_with(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        status_json: &str,
        retry: retry::RetryPolicy,
    ) -> Result<(), K8sError> {
        let _phase = plexus_delegates::timing::phase("status_patch");
        let patch = network_status_patch(uid, status_json);
        let ctx = Ctx {
            what: "patch pod status",
            ns,
            name,
        };
        K8sError::check_names(ctx)?;
        let url = Pod::url_path(&(), Some(&segment(ns)));
        let segment_name = segment(name);
        let mut attempt = 1;
        loop {
            let res = retry::run(retry, self.opts.request_timeout, ctx, || async {
                let req = kube::core::Request::new(&url).patch_subresource(
                    "status",
                    &segment_name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                );
                self.exchange(ctx, built(ctx, req)?).await
            })
            .await;
            let err = match res {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            if err.is_not_found() {
                return Err(K8sError::PodGone {
                    ns: ns.to_owned(),
                    name: name.to_owned(),
                });
            }
            if is_uid_precondition_failure(&err) {
                return Err(K8sError::PodReplaced {
                    ns: ns.to_owned(),
                    name: name.to_owned(),
                    uid: uid.to_owned(),
                });
            }
            if !matches!(err, K8sError::Api { code: 409, .. }) || attempt >= CONFLICT_ATTEMPTS {
                return Err(err);
            }
            tracing::debug!(
                ns,
                name,
                attempt,
                "conflict writing network-status, retrying"
            );
            attempt += 1;
            tokio::time::sleep(CONFLICT_PAUSE).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{json_response, MockApi};
    use super::*;

    const STATUS: &str = r#"[{"name":"cbr0","ips":["10.0.0.5"],"default":true,"dns":{}}]"#;
    const OK: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p1"}}"#;

    fn conflict(msg: &str) -> super::super::testutil::Canned {
        json_response(
            409,
            &serde_json::json!({"kind":"Status","apiVersion":"v1","status":"Failure",
                "reason":"Conflict","code":409,"message":msg})
            .to_string(),
        )
    }

    #[tokio::test]
    async fn one_merge_patch_with_uid_and_annotation() {
        let mock = MockApi::new(vec![json_response(200, OK)]);
        mock.client()
            .set_network_status("ns1", "p1", "u1", STATUS)
            .await
            .unwrap();
        let reqs = mock.requests();
        assert_eq!(reqs.len(), 1);
        let r = &reqs[0];
        assert_eq!(r.method, "PATCH");
        assert_eq!(r.path_and_query, "/api/v1/namespaces/ns1/pods/p1/status?");
        assert_eq!(
            r.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        assert_eq!(
            r.json(),
            serde_json::json!({"metadata":{"uid":"u1","annotations":{
                "k8s.v1.cni.cncf.io/network-status": STATUS}}})
        );
    }

    #[tokio::test]
    async fn conflict_then_success_is_retried() {
        let mock = MockApi::new(vec![
            conflict("Operation cannot be fulfilled on pods \"p1\": the object has been modified"),
            json_response(200, OK),
        ]);
        mock.client()
            .set_network_status("ns1", "p1", "u1", STATUS)
            .await
            .unwrap();
        assert_eq!(mock.requests().len(), 2);
    }

    #[tokio::test]
    async fn conflicts_are_bounded() {
        let mock = MockApi::repeating(conflict("the object has been modified"));
        let err = mock
            .client()
            .set_network_status("ns1", "p1", "u1", STATUS)
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::Api { code: 409, .. }), "{err:?}");
        assert_eq!(mock.requests().len(), 5);
    }

    #[tokio::test]
    async fn uid_precondition_failure_stops_at_once() {
        let mock = MockApi::repeating(conflict(
            "Precondition failed: UID in precondition: u1, UID in object meta: u2",
        ));
        let err = mock
            .client()
            .set_network_status("ns1", "p1", "u1", STATUS)
            .await
            .unwrap_err();
        assert!(
            matches!(err, K8sError::PodReplaced { ref uid, .. } if uid == "u1"),
            "{err:?}"
        );
        assert_eq!(mock.requests().len(), 1);
    }

    #[tokio::test]
    async fn real_apiservers_immutable_uid_answer_is_pod_replaced() {
        // Verbatim from kube-apiserver v1.36.2 (e2e/tests/real_api.rs).
        let mock = MockApi::repeating(json_response(
            422,
            &serde_json::json!({"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","code":422,
                "message":"Pod \"p1\" is invalid: metadata.uid: Invalid value: \"u1\": field is immutable",
                "details":{"name":"p1","kind":"Pod","causes":[{"reason":"FieldValueInvalid",
                    "message":"Invalid value: \"u1\": field is immutable","field":"metadata.uid"}]}})
            .to_string(),
        ));
        let err = mock
            .client()
            .set_network_status("ns1", "p1", "u1", STATUS)
            .await
            .unwrap_err();
        assert!(
            matches!(err, K8sError::PodReplaced { ref uid, .. } if uid == "u1"),
            "{err:?}"
        );
        assert_eq!(mock.requests().len(), 1);
        // Other validation errors stay errors.
        let other = K8sError::Api {
            what: "patch pod status",
            ns: "ns1".into(),
            name: "p1".into(),
            code: 422,
            reason: "Invalid".into(),
            message: "Pod \"p1\" is invalid: metadata.annotations: Too long".into(),
        };
        assert!(!is_uid_precondition_failure(&other));
    }

    #[tokio::test]
    async fn not_found_is_pod_gone() {
        let mock = MockApi::new(vec![json_response(
            404,
            r#"{"kind":"Status","code":404,"reason":"NotFound","message":"pods \"p1\" not found","details":{"name":"p1","kind":"pods"}}"#,
        )]);
        let err = mock
            .client()
            .set_network_status("ns1", "p1", "u1", STATUS)
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::PodGone { .. }), "{err:?}");
        assert!(err.is_not_found());
        assert_eq!(mock.requests().len(), 1);
    }

    #[tokio::test]
    async fn transient_then_success() {
        let mock = MockApi::new(vec![
            json_response(503, r#"{"kind":"Status","code":503,"message":"x"}"#),
            json_response(200, OK),
        ]);
        let mut opts = super::super::client::ClientOptions::default();
        opts.retry.interval = Duration::from_millis(10);
        mock.client_with(opts)
            .set_network_status("ns1", "p1", "u1", STATUS)
            .await
            .unwrap();
        assert_eq!(mock.requests().len(), 2);
    }
}
