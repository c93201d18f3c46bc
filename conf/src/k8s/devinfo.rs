//! NPWG device-info files (device-info spec 1.1.0): where a device plugin leaves the file for an
//! allocated device, where the per-attachment file handed to a delegate as
//! `runtimeConfig.CNIDeviceInfoFile` lives, and the `pci` document plexus builds when no
//! plugin wrote one. Paths only; reading and writing is the caller's.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The spec's default root.
pub const DEFAULT_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo";

/// The capability (and `runtimeConfig` key) carrying the per-attachment file path.
pub const CAPABILITY: &str = "CNIDeviceInfoFile";

/// The device-info spec version written.
pub const VERSION: &str = "1.1.0";

/// Largest device-info file read back (real ones are a few hundred bytes).
pub const MAX_FILE_SIZE: u64 = 64 * 1024;

fn flat(s: &str) -> String {
    s.replace('/', "-")
}

/// `dp/<resourceName>-<deviceID>-device.json`, every `/` replaced by `-`.
pub fn device_plugin_file(dir: &Path, resource: &str, device_id: &str) -> PathBuf {
    dir.join("dp").join(format!(
        "{}-{}-device.json",
        flat(resource),
        flat(device_id)
    ))
}

/// `cni/<network>-<containerID>_<ifname>`, every `/` replaced by `-` (a NAD network
/// `ns/name` gives `ns-name-…`, as Multus names it).
pub fn attachment_file(dir: &Path, network: &str, container_id: &str, ifname: &str) -> PathBuf {
    dir.join("cni")
        .join(flat(&format!("{network}-{container_id}_{ifname}")))
}

/// A `pci` device-info document for a PCI address.
pub fn pci(pci_address: &str) -> Value {
    json!({"type": "pci", "version": VERSION, "pci": {"pci-address": pci_address}})
}

/// Whether a parsed file is a device-info document (has a known `type`).
pub fn is_device_info(v: &Value) -> bool {
    matches!(
        v.get("type").and_then(Value::as_str),
        Some("pci" | "vdpa" | "vhost-user" | "memif")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_follow_the_spec_and_multus() {
        let d = Path::new(DEFAULT_DIR);
        assert_eq!(
            device_plugin_file(d, "intel.com/sriov_vf", "0000:af:06.0"),
            Path::new(
                "/var/run/k8s.cni.cncf.io/devinfo/dp/intel.com-sriov_vf-0000:af:06.0-device.json"
            )
        );
        assert_eq!(
            attachment_file(d, "bank/sriov-a", "cid1", "net1"),
            Path::new("/var/run/k8s.cni.cncf.io/devinfo/cni/bank-sriov-a-cid1_net1")
        );
    }

    #[test]
    fn pci_document() {
        let v = pci("0000:af:06.0");
        assert!(is_device_info(&v));
        assert_eq!(v["pci"]["pci-address"], "0000:af:06.0");
        assert_eq!(v["version"], "1.1.0");
        assert!(!is_device_info(&json!({"type": "gpu"})));
    }
}
