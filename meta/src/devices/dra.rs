//! DRA device lookup, compatible with Multus' contract: the pod's ResourceClaims → their
//! allocation results → each device in its driver's ResourceSlices on the pod's node → the
//! device's `k8s.cni.cncf.io/deviceID` and `k8s.cni.cncf.io/resourceName` attributes. Devices
//! without them (a GPU in the same claim) are skipped; a claim without allocation, or a device
//! the slices do not describe, is an error naming it.

use crate::error::MetaError;
use crate::k8s::KubeClient;
use crate::plan::DeviceMap;
use crate::pod::{ExtendedClaim, PodClaims};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use std::collections::{BTreeMap, BTreeSet};

/// Device attribute holding the device ID (a VF's PCI address).
pub const DEVICE_ID_ATTR: &str = "k8s.cni.cncf.io/deviceID";
/// Device attribute holding the resource name a NAD refers to (defined with the API types).
pub use crate::k8s::RESOURCE_NAME_ATTR;

pub use crate::plan::DraDevice;

/// An allocation result to look up: which claim, driver, pool, device, request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Allocated {
    claim: String,
    driver: String,
    pool: String,
    device: String,
    request: String,
}

/// The allocation results of `claim`; an error when it has none yet.
fn allocated(claim: &ResourceClaim, label: &str) -> Result<Vec<Allocated>, MetaError> {
    let name = claim.metadata.name.clone().unwrap_or_default();
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .map(|a| {
            a.devices
                .as_ref()
                .and_then(|d| d.results.clone())
                .unwrap_or_default()
        })
        .ok_or_else(|| MetaError::ClaimNotAllocated {
            pod: label.to_string(),
            name: name.clone(),
        })?;
    Ok(results
        .into_iter()
        .map(|r| Allocated {
            claim: name.clone(),
            driver: r.driver,
            pool: r.pool,
            device: r.device,
            request: r.request,
        })
        .collect())
}

/// A device's string attribute.
fn attribute(slice: &ResourceSlice, device: &str, key: &str) -> Option<Option<String>> {
    let d = slice
        .spec
        .devices
        .as_ref()?
        .iter()
        .find(|d| d.name == device)?;
    Some(
        d.attributes
            .as_ref()
            .and_then(|a| a.get(key))
            .and_then(|v| v.string.clone())
            .filter(|s| !s.is_empty()),
    )
}

/// Resolve the claims' allocated devices against the slices. `claims` are the pod's claims
/// (already fetched), `extended` the extended-resource claim mapping if any.
pub fn resolve(
    namespace: &str,
    node: &str,
    claims: &[ResourceClaim],
    extended: Option<&ExtendedClaim>,
    slices: &[ResourceSlice],
    label: &str,
) -> Result<Vec<DraDevice>, MetaError> {
    let mut all = Vec::new();
    for claim in claims {
        all.extend(allocated(claim, label)?);
    }
    resolve_allocated(namespace, node, all, extended, slices, label)
}

/// [`resolve`] for allocation results already known (from the claims, or named by the kubelet).
fn resolve_allocated(
    namespace: &str,
    node: &str,
    all: Vec<Allocated>,
    extended: Option<&ExtendedClaim>,
    slices: &[ResourceSlice],
    label: &str,
) -> Result<Vec<DraDevice>, MetaError> {
    let mut out = Vec::new();
    for a in all {
        let mapping = extended.filter(|e| e.claim_name == a.claim);
        let slice = slices.iter().find(|s| {
            s.spec.driver == a.driver
                && s.spec.pool.name == a.pool
                && attribute(s, &a.device, DEVICE_ID_ATTR).is_some()
        });
        let Some(slice) = slice else {
            return Err(MetaError::DraDeviceUnpublished {
                pod: label.to_string(),
                device: format!("{}/{}/{}", a.driver, a.pool, a.device),
                claim: a.claim,
                node: node.to_string(),
            });
        };
        let Some(device_id) = attribute(slice, &a.device, DEVICE_ID_ATTR).flatten() else {
            tracing::debug!(device = %a.device, "allocated device has no deviceID attribute: not a network device");
            continue;
        };
        let attr_resource = attribute(slice, &a.device, RESOURCE_NAME_ATTR).flatten();
        let resource = match mapping {
            Some(m) => {
                let base = a.request.split('/').next().unwrap_or_default();
                let Some((wanted, _)) = m.mappings.iter().find(|(_, req)| req == base) else {
                    continue;
                };
                if let Some(got) = attr_resource.as_ref().filter(|g| *g != wanted) {
                    return Err(MetaError::DraResourceMismatch {
                        pod: label.to_string(),
                        device: a.device,
                        claim: a.claim,
                        got: got.clone(),
                        wanted: wanted.clone(),
                    });
                }
                wanted.clone()
            }
            None => match attr_resource {
                Some(r) => r,
                None => {
                    tracing::debug!(device = %a.device, "allocated device has no resourceName attribute: skipped");
                    continue;
                }
            },
        };
        out.push(DraDevice {
            claim_namespace: namespace.to_string(),
            claim_name: a.claim.clone(),
            driver: a.driver,
            pool: a.pool,
            device: a.device,
            device_id,
            resource_name: resource,
        });
    }
    Ok(out)
}

/// Device IDs per resource name, sorted, as the planner consumes them.
pub fn device_map(devices: &[DraDevice]) -> DeviceMap {
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for d in devices {
        map.entry(d.resource_name.clone())
            .or_default()
            .insert(d.device_id.clone());
    }
    map.into_iter()
        .map(|(k, v)| (k, v.into_iter().collect()))
        .collect()
}

/// The slices of `drivers` on `node` (one LIST per driver, concurrently).
async fn list_slices(
    client: &KubeClient,
    node: &str,
    drivers: &BTreeSet<String>,
    label: &str,
) -> Result<Vec<ResourceSlice>, MetaError> {
    let listed =
        futures::future::join_all(drivers.iter().map(|d| client.list_resource_slices(node, d)))
            .await;
    let mut slices = Vec::new();
    for (driver, got) in drivers.iter().zip(listed) {
        slices.extend(got.map_err(|source| MetaError::SliceList {
            pod: label.to_string(),
            driver: driver.clone(),
            node: node.to_string(),
            source: source.into(),
        })?);
    }
    Ok(slices)
}

/// The pod's devices as the kubelet named them (pod-resources `dynamic_resources`), when they
/// cover every claim of the pod: no claim GET is needed, only the slices for the attributes.
/// `None` when the kubelet's report cannot stand in for the claims (an extended-resource claim
/// needs its request names; a claim without a reported device needs its allocation checked).
pub async fn lookup_named(
    client: &KubeClient,
    namespace: &str,
    pod: &PodClaims,
    named: &[crate::devices::podresources::ClaimDevice],
    label: &str,
) -> Option<Result<Vec<DraDevice>, MetaError>> {
    let named: Vec<_> = named
        .iter()
        .filter(|d| d.claim_namespace == namespace)
        .collect();
    let covered = pod
        .claims
        .iter()
        .all(|c| named.iter().any(|d| &d.claim_name == c));
    if pod.extended.is_some() || named.is_empty() || !covered {
        return None;
    }
    let all: Vec<Allocated> = named
        .iter()
        .map(|d| Allocated {
            claim: d.claim_name.clone(),
            driver: d.driver.clone(),
            pool: d.pool.clone(),
            device: d.device.clone(),
            request: String::new(),
        })
        .collect();
    let drivers: BTreeSet<String> = all.iter().map(|a| a.driver.clone()).collect();
    Some(
        match list_slices(client, &pod.node_name, &drivers, label).await {
            Ok(slices) => resolve_allocated(namespace, &pod.node_name, all, None, &slices, label),
            Err(e) => Err(e),
        },
    )
}

/// Fetch the pod's claims and the slices of their drivers on its node (one GET per claim, one
/// LIST per driver), then [`resolve`].
pub async fn lookup(
    client: &KubeClient,
    namespace: &str,
    pod: &PodClaims,
    label: &str,
) -> Result<Vec<DraDevice>, MetaError> {
    let mut names: Vec<&str> = pod.claims.iter().map(String::as_str).collect();
    if let Some(e) = &pod.extended {
        if !names.contains(&e.claim_name.as_str()) {
            names.push(&e.claim_name);
        }
    }
    let fetched = futures::future::join_all(
        names
            .iter()
            .map(|n| client.get_resource_claim(namespace, n)),
    )
    .await;
    let mut claims = Vec::new();
    for (name, got) in names.iter().zip(fetched) {
        match got {
            Ok(Some(c)) => claims.push(c),
            Ok(None) => {
                return Err(MetaError::ClaimMissing {
                    pod: label.to_string(),
                    ns: namespace.to_string(),
                    name: name.to_string(),
                })
            }
            Err(source) => {
                return Err(MetaError::ClaimRead {
                    pod: label.to_string(),
                    ns: namespace.to_string(),
                    name: name.to_string(),
                    source: source.into(),
                })
            }
        }
    }
    let mut drivers = BTreeSet::new();
    for c in &claims {
        for a in allocated(c, label)? {
            drivers.insert(a.driver);
        }
    }
    let slices = list_slices(client, &pod.node_name, &drivers, label).await?;
    resolve(
        namespace,
        &pod.node_name,
        &claims,
        pod.extended.as_ref(),
        &slices,
        label,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(name: &str, results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "bank"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": results}}}
        }))
        .unwrap()
    }

    fn result(request: &str, device: &str) -> serde_json::Value {
        json!({"request": request, "driver": "sriov.example.com", "pool": "node1", "device": device})
    }

    fn slices() -> Vec<ResourceSlice> {
        let dev = |name: &str, id: Option<&str>, res: Option<&str>| {
            let mut attrs = serde_json::Map::new();
            if let Some(id) = id {
                attrs.insert(DEVICE_ID_ATTR.into(), json!({"string": id}));
            }
            if let Some(r) = res {
                attrs.insert(RESOURCE_NAME_ATTR.into(), json!({"string": r}));
            }
            json!({"name": name, "attributes": attrs})
        };
        vec![serde_json::from_value(json!({
            "metadata": {"name": "node1-sriov"},
            "spec": {"driver": "sriov.example.com", "nodeName": "node1",
                     "pool": {"name": "node1", "generation": 1, "resourceSliceCount": 1},
                     "devices": [
                        dev("vf-1", Some("0000:00:12.2"), Some("intel.com/sriov_a")),
                        dev("vf-0", Some("0000:00:12.0"), Some("intel.com/sriov_a")),
                        dev("vf-2", Some("0000:00:12.4"), Some("intel.com/sriov_b")),
                        dev("gpu-0", None, None),
                        dev("vf-x", Some("0000:00:12.6"), None)]}
        }))
        .unwrap()]
    }

    #[test]
    fn devices_map_to_sorted_ids_per_resource_and_non_network_devices_are_skipped() {
        let c = claim(
            "pg-vfs",
            json!([
                result("vfs", "vf-1"),
                result("vfs", "vf-0"),
                result("vfs", "vf-2"),
                result("gpu", "gpu-0"),
                result("vfs", "vf-x")
            ]),
        );
        let devs = resolve("bank", "node1", &[c], None, &slices(), "pod bank/pg-0").unwrap();
        assert_eq!(devs.len(), 3);
        let map = device_map(&devs);
        assert_eq!(
            map["intel.com/sriov_a"],
            vec!["0000:00:12.0", "0000:00:12.2"]
        );
        assert_eq!(map["intel.com/sriov_b"], vec!["0000:00:12.4"]);
        assert_eq!(devs[0].claim_name, "pg-vfs");
        assert_eq!(devs[0].device, "vf-1");
    }

    #[test]
    fn a_claim_without_allocation_and_an_unpublished_device_are_errors() {
        let unallocated: ResourceClaim = serde_json::from_value(
            json!({"metadata": {"name": "pending", "namespace": "bank"}, "spec": {}}),
        )
        .unwrap();
        let e = resolve(
            "bank",
            "node1",
            &[unallocated],
            None,
            &slices(),
            "pod bank/pg-0",
        )
        .unwrap_err();
        assert!(
            matches!(&e, MetaError::ClaimNotAllocated { pod, name } if pod == "pod bank/pg-0" && name == "pending"),
            "{e:?}"
        );
        assert_eq!(e.code(), plexus_conf::error::code::TRY_AGAIN_LATER);
        let c = claim("pg-vfs", json!([result("vfs", "vf-9")]));
        let e = resolve("bank", "node1", &[c], None, &slices(), "pod bank/pg-0").unwrap_err();
        assert!(
            matches!(&e, MetaError::DraDeviceUnpublished { device, claim, node, .. }
                if device == "sriov.example.com/node1/vf-9" && claim == "pg-vfs" && node == "node1"),
            "{e:?}"
        );
        assert_eq!(e.code(), plexus_conf::error::code::INVALID_CONFIG);
    }

    #[test]
    fn extended_resources_use_the_mapping_and_refuse_a_mismatch() {
        let c = claim(
            "pg-ext",
            json!([
                result("container-0-request-0", "vf-x"),
                result("other", "vf-2")
            ]),
        );
        let ext = ExtendedClaim {
            claim_name: "pg-ext".into(),
            mappings: vec![("intel.com/sriov_c".into(), "container-0-request-0".into())],
        };
        let devs = resolve("bank", "node1", &[c], Some(&ext), &slices(), "pod").unwrap();
        assert_eq!(devs.len(), 1, "only mapped requests count");
        assert_eq!(devs[0].resource_name, "intel.com/sriov_c");
        let bad = claim("pg-ext", json!([result("container-0-request-0", "vf-2")]));
        let e = resolve("bank", "node1", &[bad], Some(&ext), &slices(), "pod").unwrap_err();
        assert!(
            matches!(&e, MetaError::DraResourceMismatch { got, wanted, .. }
                if got == "intel.com/sriov_b" && wanted == "intel.com/sriov_c"),
            "{e:?}"
        );
    }
}
