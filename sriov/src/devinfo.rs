//! The NPWG device-info file a runtime asks for with `runtimeConfig.CNIDeviceInfoFile`: after a
//! successful ADD the VF's `pci-address` and its PF's `pf-pci-address` are written into it,
//! keeping what the device plugin already put there (e.g. `rdma-device`).

use serde_json::{json, Map, Value};
use std::path::Path;

/// Merge the VF's PCI facts into the file (created with its directory when missing).
/// Best effort: a failure is logged, never fails the ADD (the file is informational).
pub fn write(path: &Path, vf_pci: &str, pf_pci: &str) {
    let mut doc: Map<String, Value> = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if doc
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t != "pci")
    {
        // A device plugin described the device differently (vdpa…): keep its description.
        return;
    }
    doc.insert("type".into(), json!("pci"));
    doc.insert("version".into(), json!("1.1.0"));
    let pci = doc
        .entry("pci")
        .or_insert_with(|| Value::Object(Map::new()));
    if !pci.is_object() {
        *pci = Value::Object(Map::new());
    }
    if let Some(p) = pci.as_object_mut() {
        p.insert("pci-address".into(), json!(vf_pci));
        p.insert("pf-pci-address".into(), json!(pf_pci));
    }
    let res = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, Value::Object(doc).to_string()));
    if let Err(e) = res {
        tracing::warn!(file = %path.display(), error = %e, "cannot write the device-info file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_new_file_and_keeps_device_plugin_keys() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("cni/bank-sriov-c1_net1");
        write(&f, "0000:00:12.0", "0000:00:02.0");
        let v: Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
        assert_eq!(v["pci"]["pf-pci-address"], "0000:00:02.0");
        std::fs::write(
            &f,
            r#"{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:00:12.0","rdma-device":"mlx5_3"}}"#,
        )
        .unwrap();
        write(&f, "0000:00:12.0", "0000:00:02.0");
        let v: Value = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
        assert_eq!(v["pci"]["rdma-device"], "mlx5_3");
        assert_eq!(v["pci"]["pf-pci-address"], "0000:00:02.0");
    }
}
