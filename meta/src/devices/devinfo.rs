//! NPWG device-info files around a delegate call: before ADD the device plugin's file for the
//! allocated device is copied to the attachment's file (the path the delegate gets as
//! `runtimeConfig.CNIDeviceInfoFile` and may rewrite); after ADD that file is read back into the
//! network-status entry; DEL removes it.

use crate::plan::PlannedAttachment;
use plexus_conf::k8s::{devinfo, selection::is_pci_address};
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The attachment's device-info file, if it has one.
pub fn attachment_file(a: &PlannedAttachment) -> Option<PathBuf> {
    a.capability_args
        .get(devinfo::CAPABILITY)
        .and_then(Value::as_str)
        .map(PathBuf::from)
}

fn device_id(a: &PlannedAttachment) -> Option<String> {
    let id = |v: &Value| {
        v.get("deviceID")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    a.capability_args
        .get("deviceID")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| id(&a.config))
        .or_else(|| {
            a.config
                .get("plugins")
                .and_then(Value::as_array)
                .and_then(|ps| ps.iter().find_map(id))
        })
}

fn read_doc(path: &Path) -> Option<Value> {
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(devinfo::MAX_FILE_SIZE).read_to_end(&mut buf).ok()?;
    serde_json::from_slice::<Value>(&buf)
        .ok()
        .filter(devinfo::is_device_info)
}

/// Before ADD: start each attachment's file from the device plugin's file (when one exists),
/// replacing a stale one. Failures are logged: the file is informational.
pub fn seed(plan: &[PlannedAttachment], dir: &Path) {
    for a in plan {
        let (Some(file), Some(res), Some(id)) =
            (attachment_file(a), &a.resource_name, device_id(a))
        else {
            continue;
        };
        let _ = std::fs::remove_file(&file);
        let Some(doc) = read_doc(&devinfo::device_plugin_file(dir, res, &id)) else {
            continue;
        };
        let res = file
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&file, doc.to_string()));
        if let Err(e) = res {
            tracing::warn!(file = %file.display(), error = %e, "cannot write the device-info file");
        }
    }
}

/// After ADD: the attachment's device-info — its file as the delegate left it, else a `pci`
/// document for the PCI address it was given (the NAD's deviceID or an allocated device, e.g.
/// a DRA device whose driver writes no file).
pub fn read(a: &PlannedAttachment) -> Option<Value> {
    if let Some(doc) = attachment_file(a).and_then(|f| read_doc(&f)) {
        return Some(doc);
    }
    device_id(a)
        .filter(|d| is_pci_address(d))
        .map(|d| devinfo::pci(&d))
}

/// DEL (and a rolled-back ADD): remove the attachments' files; already gone is fine.
pub fn remove(plan: &[PlannedAttachment]) {
    for f in plan.iter().filter_map(attachment_file) {
        match std::fs::remove_file(&f) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %f.display(), error = %e, "cannot remove the device-info file")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_info_file_is_read_up_to_its_cap() {
        let t = tempfile::tempdir().unwrap();
        let ok = serde_json::json!({"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:af:06.1"}});
        let small = t.path().join("small.json");
        std::fs::write(&small, ok.to_string()).unwrap();
        assert_eq!(read_doc(&small), Some(ok.clone()));
        // The same document padded past the cap (whitespace is valid JSON) is not read at all.
        let big = t.path().join("big.json");
        let pad = " ".repeat(devinfo::MAX_FILE_SIZE as usize);
        std::fs::write(&big, format!("{pad}{ok}")).unwrap();
        assert_eq!(read_doc(&big), None);
    }
}
