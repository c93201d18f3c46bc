//! The daemon's record of network-status writes not sent yet, so that a daemon killed
//! (SIGKILL, OOM) between an ADD's answer and its background PATCH ([`super::background`])
//! does not leave the pod without network-status for good.
//!
//! Before an ADD answers, its status goes to `<cniDir>/status-pending/<container>.json`
//! (atomic rename, no fsync: it must outlive the process, not the machine — after a reboot
//! the sandbox is gone anyway). The file is removed once the write is finished one way or the
//! other (written, the pod gone or replaced, superseded by a newer ADD of the pod, cancelled
//! by the container's DEL, given up). The first call a (re)started daemon serves for a
//! `cniDir` replays what is left: a record whose container still has its saved plan is
//! written again (the UID precondition keeps it off a replaced pod), any other is dropped.

use crate::pod::PodIdentity;
use crate::state::PlanStore;
use plexus_delegates::fsutil;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// One pending write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingStatus {
    /// The ADD's container.
    pub container_id: String,
    /// Its `CNI_IFNAME` (the saved plan's key).
    pub ifname: String,
    /// The pod.
    pub pod: PodIdentity,
    /// The annotation's value.
    pub status: String,
}

fn dir(cni_dir: &Path) -> PathBuf {
    cni_dir.join("status-pending")
}

/// Where `container`'s record lives; `None` for a container ID that is not a plain file name.
fn path(cni_dir: &Path, container: &str) -> Option<PathBuf> {
    let plain =
        !container.is_empty() && !container.starts_with('.') && !container.contains(['/', '\0']);
    plain.then(|| dir(cni_dir).join(format!("{container}.json")))
}

/// Record `p` before the ADD answers; returns the record's path (remove it with
/// [`finished`]). A record that cannot be written is logged: the write still happens, only a
/// daemon killed before it would lose it.
pub fn record(cni_dir: &Path, p: &PendingStatus) -> Option<PathBuf> {
    let _phase = plexus_delegates::timing::phase("status_record");
    let file = path(cni_dir, &p.container_id)?;
    let bytes = serde_json::to_vec(p).ok()?;
    match fsutil::write_atomic_nosync(&file, &bytes, 0o600) {
        Ok(()) => Some(file),
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "pending network-status not recorded");
            None
        }
    }
}

/// The write of `file`'s record is over (whatever its outcome).
pub fn finished(file: &Path) {
    let _ = fsutil::remove_if_exists(file);
}

/// The records under `cni_dir` (unreadable or foreign files are removed).
pub fn pending(cni_dir: &Path) -> Vec<(PathBuf, PendingStatus)> {
    let Ok(rd) = std::fs::read_dir(dir(cni_dir)) else {
        return vec![];
    };
    let mut out = vec![];
    for e in rd.filter_map(Result::ok) {
        let file = e.path();
        if e.file_name().to_string_lossy().starts_with('.') {
            continue; // a write in progress (fsutil's temporary name)
        }
        let parsed = fsutil::read_capped(&file, fsutil::MAX_STATE_FILE_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice::<PendingStatus>(&b).ok())
            .filter(|p| path(cni_dir, &p.container_id).as_deref() == Some(file.as_path()));
        match parsed {
            Some(p) => out.push((file, p)),
            None => finished(&file),
        }
    }
    out
}

/// The records of `cni_dir` to write again, once per `cni_dir` and process (the first call
/// after a start): those whose container still has its saved plan; the others are removed.
pub fn take_for_replay(cni_dir: &Path, store: &PlanStore) -> Vec<(PathBuf, PendingStatus)> {
    static SEEN: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let first = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(cni_dir.to_path_buf());
    if !first {
        return vec![];
    }
    pending(cni_dir)
        .into_iter()
        .filter(|(file, p)| {
            let live = matches!(store.load(&p.container_id, &p.ifname), Ok(Some(_)));
            if !live {
                finished(file);
            }
            live
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::SavedPlan;

    fn rec(c: &str) -> PendingStatus {
        PendingStatus {
            container_id: c.into(),
            ifname: "eth0".into(),
            pod: PodIdentity {
                namespace: "db".into(),
                name: "p".into(),
                uid: "u1".into(),
                ..Default::default()
            },
            status: "[]".into(),
        }
    }

    #[test]
    fn records_are_replayed_once_and_only_for_live_containers() {
        let t = tempfile::tempdir().unwrap();
        let store = PlanStore::new(t.path());
        store
            .save(&SavedPlan::new("live", "eth0", "", None, vec![]))
            .unwrap();
        let live = record(t.path(), &rec("live")).unwrap();
        let gone = record(t.path(), &rec("gone")).unwrap();
        let done = record(t.path(), &rec("done")).unwrap();
        finished(&done);
        assert!(!done.exists());
        // Refused names never become paths outside the directory.
        assert!(record(t.path(), &rec("../x")).is_none());
        assert!(record(t.path(), &rec("")).is_none());
        std::fs::write(dir(t.path()).join("junk.json"), b"{").unwrap();
        let replay = take_for_replay(t.path(), &store);
        assert_eq!(replay, vec![(live.clone(), rec("live"))]);
        assert!(!gone.exists(), "a container without a plan: dropped");
        assert!(!dir(t.path()).join("junk.json").exists());
        assert!(live.exists(), "removed when its write is over");
        assert!(take_for_replay(t.path(), &store).is_empty(), "once");
    }

    /// A record in the format every daemon so far wrote, and one from a newer plexus that adds
    /// a field, are both read (an upgrade or a downgrade with writes pending loses none).
    #[test]
    fn records_of_earlier_and_newer_daemons_are_read() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir(t.path())).unwrap();
        let written = r#"{"containerId":"c1","ifname":"eth0","pod":{"namespace":"db","name":"p","uid":"u1","infra_container_id":"c1"},"status":"[]"}"#;
        let newer = r#"{"containerId":"c2","ifname":"eth0","pod":{"namespace":"db","name":"q","uid":"u2","infra_container_id":"c2"},"status":"[]","attempts":3}"#;
        std::fs::write(dir(t.path()).join("c1.json"), written).unwrap();
        std::fs::write(dir(t.path()).join("c2.json"), newer).unwrap();
        let mut got: Vec<String> = pending(t.path())
            .into_iter()
            .map(|(_, p)| format!("{}/{}", p.container_id, p.pod.uid))
            .collect();
        got.sort();
        assert_eq!(got, vec!["c1/u1", "c2/u2"]);
    }
}
