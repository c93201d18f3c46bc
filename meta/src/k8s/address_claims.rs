//! Address claims: one `AddressClaim` object (plexus.cni.io/v1alpha1, namespaced) per fixed
//! address a pod holds on a network, so that the API server arbitrates "never one address
//! twice" with a create (a conflict means taken) instead of a LIST of the namespace's pods.
//!
//! A claim lives in the namespace of the network's NAD (the address space is the NAD's), not
//! in the pod's: pods of several namespaces on one NAD are arbitrated by the same object.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

use super::client::{built, KubeClient};
use super::error::{Ctx, K8sError};
use super::names::segment;
use super::retry::{self, RetryPolicy};

/// API path prefix of the claims of namespace `ns`.
fn collection(ns: &str) -> String {
    format!(
        "/apis/plexus.cni.io/v1alpha1/namespaces/{}/addressclaims",
        segment(ns)
    )
}

/// FNV-1a, 64 bits: a stable short digest for object names (not a security boundary: the
/// object's spec, not its name, says what it claims).
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The claim's object name for `address` on `network` (`namespace/name` of its NAD, or a
/// network name): readable (`<network name>-<address>`) and unique (a digest of both), a valid
/// DNS subdomain of at most 253 characters.
pub fn claim_name(network: &str, address: IpAddr) -> String {
    let net = network.rsplit('/').next().unwrap_or(network);
    let addr = address.to_string().replace([':', '.'], "-");
    let digest = fnv1a(format!("{network}|{address}").as_bytes());
    let mut readable: String = format!("{net}-{addr}")
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    readable.truncate(253 - 17);
    let readable = readable.trim_matches('-');
    format!("{readable}-{digest:016x}")
}

/// The namespace the claims of `network` live in: the NAD's (`namespace/name`), else
/// `pod_namespace` (a network named without a namespace).
pub fn claim_namespace<'a>(network: &'a str, pod_namespace: &'a str) -> &'a str {
    match network.split_once('/') {
        Some((ns, _)) if !ns.is_empty() => ns,
        _ => pod_namespace,
    }
}

/// The claim object of `spec` in `ns` (at `resource_version`, for a replace): its name and
/// JSON body.
fn claim_object(
    ns: &str,
    spec: &ClaimSpec,
    resource_version: Option<&str>,
) -> Result<(String, Vec<u8>), K8sError> {
    let ip: IpAddr = spec.address.parse().map_err(|_| {
        K8sError::Client(format!(
            "address claim: not an IP address: {:?}",
            spec.address
        ))
    })?;
    let name = claim_name(&spec.network, ip);
    let mut metadata = serde_json::json!({"name": name, "namespace": ns});
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = rv.into();
    }
    let body = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "plexus.cni.io/v1alpha1",
        "kind": "AddressClaim",
        "metadata": metadata,
        "spec": spec,
    }))
    .map_err(|e| K8sError::Client(e.to_string()))?;
    Ok((name, body))
}

/// Who holds a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClaimHolder {
    /// Pod namespace (empty in claims written before it was recorded: the claim's own).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

/// An `AddressClaim`'s spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSpec {
    /// The network.
    pub network: String,
    /// The address.
    pub address: String,
    /// The node.
    #[serde(default)]
    pub node: String,
    /// The sandbox.
    #[serde(default)]
    pub container_id: String,
    /// The pod.
    pub pod: ClaimHolder,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimView {
    metadata: ClaimMeta,
    spec: ClaimSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimMeta {
    #[serde(default)]
    resource_version: String,
}

/// What a create of a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Created: the address is this pod's.
    Created,
    /// It existed and already names this pod (an ADD retried).
    AlreadyOurs,
    /// It names another pod: the caller decides whether that pod still holds it, and takes it
    /// over with [`KubeClient::take_over_claim`] at `resource_version` if not.
    HeldBy {
        /// The holder.
        holder: ClaimSpec,
        /// The claim's resourceVersion (the precondition of a take-over).
        resource_version: String,
    },
}

impl KubeClient {
    /// Whether claims were found unusable on this API server (no CRD, no right) less than a
    /// while ago ([`KubeClient::turn_claims_off`]).
    pub fn claims_off(&self) -> bool {
        let until = self
            .claims_off_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        until.is_some_and(|t| std::time::Instant::now() < t)
    }

    /// Remember for `span` that claims are unusable here, so that a long-lived client (the
    /// daemon's) does not pay a failed create per ADD.
    pub fn turn_claims_off(&self, span: std::time::Duration) {
        *self
            .claims_off_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now() + span);
    }

    /// Whether this client may create address claims in `ns`: a SelfSubjectAccessReview, which
    /// every authenticated user may make, so that a node without the claim rights is never
    /// refused (and audited as refused) for trying.
    pub async fn may_create_claims(&self, ns: &str) -> Result<bool, K8sError> {
        let ctx = Ctx {
            what: "review access to address claims",
            ns,
            name: "",
        };
        #[derive(Deserialize)]
        struct Review {
            #[serde(default)]
            status: ReviewStatus,
        }
        #[derive(Deserialize, Default)]
        struct ReviewStatus {
            #[serde(default)]
            allowed: bool,
        }
        let body = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"group": "plexus.cni.io", "resource": "addressclaims",
                "verb": "create", "namespace": ns}},
        }))
        .map_err(|e| K8sError::Client(e.to_string()))?;
        let req = http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body);
        let req = built(ctx, req.map_err(kube::core::request::Error::BuildRequest))?;
        Ok(self.fetch::<Review>(ctx, req).await?.status.allowed)
    }

    /// Create the claim `spec` in `ns` (one request; two when it exists: the GET of who holds it).
    pub async fn claim_address(
        &self,
        ns: &str,
        spec: &ClaimSpec,
        policy: RetryPolicy,
    ) -> Result<ClaimOutcome, K8sError> {
        let (name, body) = claim_object(ns, spec, None)?;
        let ctx = Ctx {
            what: "create address claim",
            ns,
            name: &name,
        };
        K8sError::check_names(ctx)?;
        let url = collection(ns);
        let created = retry::run(policy, self.options().request_timeout, ctx, || async {
            let req = http::Request::post(url.as_str())
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            let req = built(ctx, req.map_err(kube::core::request::Error::BuildRequest))?;
            self.exchange(ctx, req).await
        })
        .await;
        match created {
            Ok(_) => Ok(ClaimOutcome::Created),
            Err(K8sError::Api { code: 409, .. }) => {
                let (held, rv) = self.get_claim(ns, &name, policy).await?;
                if held.pod.uid == spec.pod.uid {
                    Ok(ClaimOutcome::AlreadyOurs)
                } else {
                    Ok(ClaimOutcome::HeldBy {
                        holder: held,
                        resource_version: rv,
                    })
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The claim `name` of `ns`: its spec and resourceVersion.
    async fn get_claim(
        &self,
        ns: &str,
        name: &str,
        policy: RetryPolicy,
    ) -> Result<(ClaimSpec, String), K8sError> {
        let ctx = Ctx {
            what: "get address claim",
            ns,
            name,
        };
        let url = format!("{}/{}", collection(ns), segment(name));
        let view = retry::run(policy, self.options().request_timeout, ctx, || async {
            let req = http::Request::get(url.as_str()).body(Vec::new());
            let req = built(ctx, req.map_err(kube::core::request::Error::BuildRequest))?;
            self.fetch::<ClaimView>(ctx, req).await
        })
        .await?;
        Ok((view.spec, view.metadata.resource_version))
    }

    /// Replace the claim of `spec`'s address, held by a pod that is gone, with `spec`: a PUT
    /// preconditioned on `resource_version`, so of two callers taking over at once exactly one
    /// wins (the other gets `409 Conflict`).
    pub async fn take_over_claim(
        &self,
        ns: &str,
        spec: &ClaimSpec,
        resource_version: &str,
    ) -> Result<(), K8sError> {
        let (name, body) = claim_object(ns, spec, Some(resource_version))?;
        let ctx = Ctx {
            what: "take over address claim",
            ns,
            name: &name,
        };
        K8sError::check_names(ctx)?;
        let url = format!("{}/{}", collection(ns), segment(&name));
        let req = http::Request::put(url.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body);
        let req = built(ctx, req.map_err(kube::core::request::Error::BuildRequest))?;
        self.exchange(ctx, req).await.map(drop)
    }

    /// Delete the claim of `address` on `network` if `pod_uid` still holds it (a claim another
    /// pod took over stays). Gone already: `Ok`.
    pub async fn release_claim(
        &self,
        ns: &str,
        network: &str,
        address: IpAddr,
        pod_uid: &str,
        policy: RetryPolicy,
    ) -> Result<(), K8sError> {
        let name = claim_name(network, address);
        let (held, rv) = match self.get_claim(ns, &name, policy).await {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        if held.pod.uid != pod_uid {
            return Ok(());
        }
        let ctx = Ctx {
            what: "delete address claim",
            ns,
            name: &name,
        };
        let url = format!("{}/{}", collection(ns), segment(&name));
        // Preconditioned on the version read: a take-over in between is not deleted.
        let body = serde_json::to_vec(&serde_json::json!({
            "kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"resourceVersion": rv},
        }))
        .map_err(|e| K8sError::Client(e.to_string()))?;
        let req = http::Request::delete(url.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body);
        let req = built(ctx, req.map_err(kube::core::request::Error::BuildRequest))?;
        match self.exchange(ctx, req).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(K8sError::Api { code: 409, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{json_response, MockApi};
    use super::*;

    fn spec(pod: &str, uid: &str) -> ClaimSpec {
        ClaimSpec {
            network: "db/data".into(),
            address: "10.56.100.10".into(),
            node: "n1".into(),
            container_id: "c1".into(),
            pod: ClaimHolder {
                namespace: "db".into(),
                name: pod.into(),
                uid: uid.into(),
            },
        }
    }

    #[test]
    fn claims_live_in_the_nads_namespace() {
        assert_eq!(claim_namespace("shared/bank", "db"), "shared");
        assert_eq!(claim_namespace("bank", "db"), "db");
        assert_eq!(claim_namespace("/bank", "db"), "db");
    }

    #[test]
    fn names_are_readable_unique_and_valid() {
        let a = claim_name("db/data", "10.56.100.10".parse().unwrap());
        assert!(a.starts_with("data-10-56-100-10-"), "{a}");
        assert_ne!(a, claim_name("other/data", "10.56.100.10".parse().unwrap()));
        assert_ne!(a, claim_name("db/data", "10.56.100.11".parse().unwrap()));
        let v6 = claim_name("db/Data_Net", "fd00::a".parse().unwrap());
        assert!(v6.starts_with("data-net-fd00--a-"), "{v6}");
        let long = claim_name(
            &format!("db/{}", "x".repeat(300)),
            "10.0.0.1".parse().unwrap(),
        );
        assert!(long.len() <= 253);
        for n in [&a, &v6, &long] {
            assert!(n
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        }
    }

    #[test]
    fn create_then_conflict_tells_who_holds_it() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _in = rt.enter();
        let created = MockApi::repeating(json_response(201, "{}")).client();
        assert_eq!(
            rt.block_on(created.claim_address("db", &spec("mysql-0", "u1"), RetryPolicy::none()))
                .unwrap(),
            ClaimOutcome::Created
        );
        let held = r#"{"metadata":{"resourceVersion":"42"},"spec":{"network":"db/data","address":"10.56.100.10","pod":{"name":"mysql-0","uid":"u0"}}}"#;
        let api = MockApi::with_handler(move |r| {
            Some(if r.method == "POST" {
                json_response(
                    409,
                    r#"{"kind":"Status","code":409,"reason":"AlreadyExists","message":"exists"}"#,
                )
            } else {
                json_response(200, held)
            })
        });
        let client = api.client();
        match rt
            .block_on(client.claim_address("db", &spec("mysql-0", "u1"), RetryPolicy::none()))
            .unwrap()
        {
            ClaimOutcome::HeldBy {
                holder,
                resource_version,
            } => {
                assert_eq!(holder.pod.uid, "u0");
                assert_eq!(resource_version, "42");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            rt.block_on(client.claim_address("db", &spec("mysql-0", "u0"), RetryPolicy::none()))
                .unwrap(),
            ClaimOutcome::AlreadyOurs
        );
    }
}
