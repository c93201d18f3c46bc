//! The pod a CNI call is for: identity from `CNI_ARGS`, and the pod data plexus uses.

use plexus_conf::args::CniArgs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The pod identity the runtime passes in `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodIdentity {
    /// `K8S_POD_NAMESPACE`
    pub namespace: String,
    /// `K8S_POD_NAME`
    pub name: String,
    /// `K8S_POD_UID` (newer runtimes)
    #[serde(default)]
    pub uid: String,
    /// `K8S_POD_INFRA_CONTAINER_ID`
    #[serde(default)]
    pub infra_container_id: String,
}

impl PodIdentity {
    /// Read from `CNI_ARGS`; `None` when namespace or name is missing (static mode).
    pub fn from_args(args: &CniArgs) -> Option<Self> {
        let ns = args.get("K8S_POD_NAMESPACE").filter(|s| !s.is_empty())?;
        let name = args.get("K8S_POD_NAME").filter(|s| !s.is_empty())?;
        Some(PodIdentity {
            namespace: ns.to_string(),
            name: name.to_string(),
            uid: args.get("K8S_POD_UID").unwrap_or_default().to_string(),
            infra_container_id: args
                .get("K8S_POD_INFRA_CONTAINER_ID")
                .unwrap_or_default()
                .to_string(),
        })
    }

    /// `namespace/name`
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What plexus needs of a pod object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// Identity.
    pub id: PodIdentity,
    /// The pod's annotations.
    pub annotations: BTreeMap<String, String>,
    /// The pod's DRA claims; `None` when the pod object was not read (the runtime passed the
    /// annotations).
    pub claims: Option<PodClaims>,
    /// The StatefulSet controlling the pod (its controller `ownerReference`), if any.
    pub statefulset: Option<String>,
}

impl PodInfo {
    /// What plexus keeps of a pod object read for `id` (the object's UID wins over the
    /// runtime's, which may be empty).
    pub fn from_pod(pod: &k8s_openapi::api::core::v1::Pod, id: &PodIdentity) -> PodInfo {
        PodInfo {
            id: PodIdentity {
                uid: pod.metadata.uid.clone().unwrap_or_else(|| id.uid.clone()),
                ..id.clone()
            },
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            claims: Some(PodClaims::from_pod(pod)),
            statefulset: statefulset_of(pod),
        }
    }
}

/// The name of the StatefulSet controlling `pod` (the controller `ownerReference` of kind
/// `StatefulSet`, of any API group: `apps/v1` or OpenKruise's).
pub fn statefulset_of(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "StatefulSet")
        .map(|o| o.name.clone())
}

/// The DRA side of a pod: which ResourceClaims hold its devices, on which node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodClaims {
    /// `spec.nodeName` (the node whose ResourceSlices describe the devices).
    pub node_name: String,
    /// API names of the pod's claims: `spec.resourceClaims[].resourceClaimName` (a claim the
    /// pod names directly) and `status.resourceClaimStatuses[].resourceClaimName` (claims made
    /// from templates), without duplicates.
    pub claims: Vec<String>,
    /// `status.extendedResourceClaimStatus`: the claim holding extended-resource requests.
    pub extended: Option<ExtendedClaim>,
}

/// A claim made for extended resources, with its request ↔ resource name mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtendedClaim {
    /// The claim's API name.
    pub claim_name: String,
    /// `(resourceName, requestName)` per mapping.
    pub mappings: Vec<(String, String)>,
}

impl PodClaims {
    /// Read from a pod object.
    pub fn from_pod(pod: &k8s_openapi::api::core::v1::Pod) -> PodClaims {
        let status = pod.status.as_ref();
        PodClaims {
            node_name: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            claims: {
                let direct = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.resource_claims.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.resource_claim_name.clone());
                let made = status
                    .and_then(|s| s.resource_claim_statuses.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.resource_claim_name.clone());
                let mut all: Vec<String> = Vec::new();
                for c in direct.chain(made) {
                    if !all.contains(&c) {
                        all.push(c);
                    }
                }
                all
            },
            extended: status
                .and_then(|s| s.extended_resource_claim_status.as_ref())
                .map(|e| ExtendedClaim {
                    claim_name: e.resource_claim_name.clone(),
                    mappings: e
                        .request_mappings
                        .iter()
                        .map(|m| (m.resource_name.clone(), m.request_name.clone()))
                        .collect(),
                }),
        }
    }

    /// True when the pod has no claims at all.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.extended.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kubelet_args() {
        let a = CniArgs::parse("K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u1;IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=pg-0").unwrap();
        let p = PodIdentity::from_args(&a).unwrap();
        assert_eq!(p.key(), "db/pg-0");
        assert_eq!(p.uid, "u1");
        assert!(PodIdentity::from_args(&CniArgs::parse("K8S_POD_NAME=x").unwrap()).is_none());
    }

    /// A claim the pod names directly (`spec.resourceClaims[].resourceClaimName`) has no
    /// `status.resourceClaimStatuses` entry (Kubernetes fills that only for template claims):
    /// found by the real VM tier's DRA case, where such a pod got no device.
    #[test]
    fn claims_named_in_the_spec_count_as_well_as_template_claims() {
        let pod = crate::k8s::pod_from_json(serde_json::json!({
            "metadata": {"name": "pg-dra", "namespace": "default", "uid": "u"},
            "spec": {"nodeName": "n1", "resourceClaims": [
                {"name": "vf", "resourceClaimName": "bank-vf"},
                {"name": "gpu", "resourceClaimTemplateName": "gpu-t"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "pg-dra-gpu-x"}]}
        }))
        .unwrap();
        let c = PodClaims::from_pod(&pod);
        assert_eq!(c.node_name, "n1");
        assert_eq!(
            c.claims,
            vec!["bank-vf".to_string(), "pg-dra-gpu-x".to_string()]
        );
        // Only a direct claim, no status at all.
        let pod = crate::k8s::pod_from_json(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"resourceClaims": [{"name": "vf", "resourceClaimName": "bank-vf"}]}
        }))
        .unwrap();
        assert_eq!(
            PodClaims::from_pod(&pod).claims,
            vec!["bank-vf".to_string()]
        );
        assert!(!PodClaims::from_pod(&pod).is_empty());
    }
}
