//! The kubelet device manager's checkpoint (`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`):
//! which device IDs each pod was allocated, per resource. Multus' fallback when the
//! pod-resources API is not available.

use crate::error::CniError;
use serde_json::Value;
use std::collections::BTreeMap;

/// Device IDs per resource name allocated to the pod with `pod_uid` (all containers merged,
/// each list sorted and deduplicated). Both checkpoint layouts are read: `DeviceIDs` as a list
/// (before 1.20) and as a map of NUMA node to list.
pub fn pod_devices(bytes: &[u8], pod_uid: &str) -> Result<BTreeMap<String, Vec<String>>, CniError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        CniError::decode(
            "failed to parse the kubelet device checkpoint",
            e.to_string(),
        )
    })?;
    let entries = v
        .get("Data")
        .and_then(|d| d.get("PodDeviceEntries"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in entries {
        if e.get("PodUID").and_then(Value::as_str) != Some(pod_uid) {
            continue;
        }
        let Some(resource) = e.get("ResourceName").and_then(Value::as_str) else {
            continue;
        };
        let ids = out.entry(resource.to_string()).or_default();
        match e.get("DeviceIDs") {
            Some(Value::Array(list)) => {
                ids.extend(list.iter().filter_map(Value::as_str).map(str::to_string))
            }
            Some(Value::Object(by_numa)) => {
                for list in by_numa.values().filter_map(Value::as_array) {
                    ids.extend(list.iter().filter_map(Value::as_str).map(str::to_string));
                }
            }
            _ => {}
        }
    }
    for ids in out.values_mut() {
        ids.sort();
        ids.dedup();
    }
    out.retain(|_, ids| !ids.is_empty());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_layouts_for_one_pod() {
        let cp = br#"{"Data":{"PodDeviceEntries":[
            {"PodUID":"u1","ContainerName":"db","ResourceName":"intel.com/sriov_netdevice","DeviceIDs":{"0":["0000:af:06.3","0000:af:06.1"],"1":["0000:af:06.1"]},"AllocResp":"x"},
            {"PodUID":"u1","ContainerName":"side","ResourceName":"intel.com/sriov_netdevice","DeviceIDs":["0000:af:06.2"],"AllocResp":"x"},
            {"PodUID":"u2","ContainerName":"db","ResourceName":"intel.com/sriov_netdevice","DeviceIDs":{"0":["0000:af:06.9"]}}],
            "RegisteredDevices":{"intel.com/sriov_netdevice":["0000:af:06.1"]}},"Checksum":123}"#;
        let d = pod_devices(cp, "u1").unwrap();
        assert_eq!(
            d["intel.com/sriov_netdevice"],
            vec!["0000:af:06.1", "0000:af:06.2", "0000:af:06.3"]
        );
        assert!(pod_devices(cp, "nobody").unwrap().is_empty());
        assert_eq!(pod_devices(b"{", "u1").unwrap_err().code, 6);
    }
}
