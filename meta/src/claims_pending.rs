//! Address claims whose release failed (the API server down or failing at DEL or rollback):
//! recorded under `<cniDir>/claims-pending/` and released by a later call on this node — in
//! thin mode the next DEL or GC, in daemon mode also a sweep every minute — so that no claim
//! outlives its pod for good. Until then the claim still names its pod, and the next pod that
//! wants the address takes it over once that pod is gone (`address_guard`).

use plexus_delegates::fsutil;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A claim to release.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingRelease {
    /// The claim's namespace (the NAD's).
    pub namespace: String,
    /// The network (NAD `namespace/name`).
    pub network: String,
    /// The address.
    pub address: IpAddr,
    /// The pod whose claim it is (`namespace/name`, for logs).
    pub pod: String,
    /// Its UID: the claim is deleted only while it still names this UID.
    pub pod_uid: String,
}

/// The `cniDir`s a daemon has served calls for (its sweep's work list).
static SERVED_DIRS: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Note that calls for `cni_dir` are served by this process.
pub fn note_dir(cni_dir: &Path) {
    let mut dirs = SERVED_DIRS.lock().unwrap_or_else(|p| p.into_inner());
    if !dirs.contains(cni_dir) {
        dirs.insert(cni_dir.to_path_buf());
    }
}

/// The `cniDir`s noted so far.
pub fn served_dirs() -> Vec<PathBuf> {
    let dirs = SERVED_DIRS.lock().unwrap_or_else(|p| p.into_inner());
    dirs.iter().cloned().collect()
}

fn dir(cni_dir: &Path) -> PathBuf {
    cni_dir.join("claims-pending")
}

/// Record `p` (owner-only file); a record that cannot be written is logged.
pub fn record(cni_dir: &Path, p: &PendingRelease) {
    // SipHash with fixed keys: the same record always has the same file name.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.hash(&mut h);
    let file = dir(cni_dir).join(format!("{:016x}.json", h.finish()));
    let written = serde_json::to_vec(p)
        .map_err(std::io::Error::other)
        .and_then(|b| fsutil::write_atomic(&file, &b, 0o600));
    match written {
        Ok(()) => {
            tracing::warn!(pod = %p.pod, network = %p.network, address = %p.address,
                "address claim not released now: recorded, a later call of this node releases it")
        }
        Err(e) => {
            tracing::error!(pod = %p.pod, network = %p.network, address = %p.address, error = %e,
                "address claim neither released nor recorded: it stays until the address is wanted again")
        }
    }
}

/// The records under `cni_dir` (unreadable ones are removed).
pub fn pending(cni_dir: &Path) -> Vec<(PathBuf, PendingRelease)> {
    let Ok(rd) = std::fs::read_dir(dir(cni_dir)) else {
        return vec![];
    };
    let mut out = vec![];
    for e in rd.filter_map(Result::ok) {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue; // a write in progress
        }
        let file = e.path();
        let parsed = fsutil::read_capped(&file, fsutil::MAX_STATE_FILE_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice::<PendingRelease>(&b).ok());
        match parsed {
            Some(p) => out.push((file, p)),
            None => {
                tracing::warn!(file = %file.display(), "unreadable pending claim release removed");
                let _ = fsutil::remove_if_exists(&file);
            }
        }
    }
    out
}

/// `file`'s release is over (done, or not ours to do any more).
pub fn done(file: &Path) {
    let _ = fsutil::remove_if_exists(file);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn records_read_back_owner_only_and_once_per_claim() {
        let tmp = tempfile::tempdir().unwrap();
        let p = PendingRelease {
            namespace: "db".into(),
            network: "db/bank".into(),
            address: "10.56.100.10".parse().unwrap(),
            pod: "db/mysql-0".into(),
            pod_uid: "u1".into(),
        };
        record(tmp.path(), &p);
        record(tmp.path(), &p);
        std::fs::write(dir(tmp.path()).join("junk.json"), b"{").unwrap();
        let got = pending(tmp.path());
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].1, p);
        let mode = std::fs::metadata(&got[0].0).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        assert!(!dir(tmp.path()).join("junk.json").exists());
        done(&got[0].0);
        assert!(pending(tmp.path()).is_empty());
    }
}
