//! The attachment plan saved at ADD (before any delegate runs) so that DEL can undo everything
//! with no API request, whatever happened to the pod, the NADs or the API server since.

use crate::error::MetaError;
use crate::plan::PlannedAttachment;
use crate::pod::PodIdentity;
use plexus_delegates::fsutil;
use plexus_delegates::lock::FileLock;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The format tag of the plans this plexus writes and reads. Fields are only ever added (with
/// defaults), so every earlier plan of this kind reads (fixtures in `state_fixtures/`, one per
/// format change); a change that cannot be read that way gets a new kind.
pub const PLAN_KIND: &str = "plexusPlanV1";

/// Tombstone content of a DEL that ran without any network namespace.
const NETNS_UNKNOWN: &[u8] = b"netns-unknown";

/// The saved plan of one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedPlan {
    /// Format tag.
    pub kind: String,
    /// `CNI_CONTAINERID`
    pub container_id: String,
    /// The kubelet's `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS` at ADD.
    pub netns: String,
    /// The pod, when known.
    pub pod: Option<PodIdentity>,
    /// Attachments, in ADD order.
    pub attachments: Vec<PlannedAttachment>,
    /// Failed DEL attempts so far.
    #[serde(default)]
    pub del_failures: u32,
    /// When the first DEL attempt failed (seconds since the Unix epoch), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_del_failure: Option<u64>,
    /// The fixed addresses this ADD holds an `AddressClaim` for (released at DEL).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<ClaimedAddress>,
}

/// A fixed address claimed in the API at ADD (`address_guard`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimedAddress {
    /// The network (NAD `namespace/name`).
    pub network: String,
    /// The address.
    pub address: std::net::IpAddr,
}

impl SavedPlan {
    /// A new plan record.
    pub fn new(
        container_id: &str,
        ifname: &str,
        netns: &str,
        pod: Option<PodIdentity>,
        attachments: Vec<PlannedAttachment>,
    ) -> Self {
        SavedPlan {
            kind: PLAN_KIND.into(),
            container_id: container_id.into(),
            ifname: ifname.into(),
            netns: netns.into(),
            pod,
            attachments,
            del_failures: 0,
            first_del_failure: None,
            claims: Vec::new(),
        }
    }
}

/// The fsync of a plan saved by [`PlanStore::save_for_add`], running.
#[derive(Debug)]
#[must_use = "wait for the plan to be on disk before answering ADD"]
pub struct Durable {
    path: PathBuf,
    /// `None`: no thread could be started; [`Durable::wait`] syncs in the caller.
    sync: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Durable {
    /// Wait until the plan is on disk. A failed fsync is logged, not returned: the plan is in
    /// place for every DEL short of a power loss, and the attachments are fine.
    pub fn wait(self) {
        let _phase = plexus_delegates::timing::phase("plan_sync_wait");
        let res = match self.sync {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("fsync thread panicked"))),
            None => std::fs::File::open(&self.path).and_then(|f| f.sync_all()),
        };
        if let Err(e) = res {
            tracing::warn!(path = %self.path.display(), error = %e, "plan saved but not synced to disk");
        }
    }
}

/// Plan files and per-container locks under `cniDir`.
#[derive(Debug, Clone)]
pub struct PlanStore {
    dir: PathBuf,
}

impl PlanStore {
    /// Store rooted at `cni_dir`.
    pub fn new(cni_dir: &Path) -> Self {
        PlanStore {
            dir: cni_dir.to_path_buf(),
        }
    }

    fn path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.dir
            .join("plans")
            .join(format!("{container_id}-{ifname}.json"))
    }

    /// Serialise operations on one container (the spec forbids parallel calls, but runtimes
    /// retry and GC may run concurrently).
    pub fn lock(&self, container_id: &str) -> Result<FileLock, MetaError> {
        let p = self.dir.join("locks").join(format!("{container_id}.lock"));
        // Another call holding the lock (TimedOut) is worth a retry (11); a state directory that
        // cannot be written is an I/O failure that retrying will not fix (5).
        FileLock::acquire(&p, Duration::from_secs(120)).map_err(|source| MetaError::Lock {
            container_id: container_id.to_string(),
            path: p.clone(),
            source,
        })
    }

    /// Save (atomic, 0600).
    pub fn save(&self, plan: &SavedPlan) -> Result<(), MetaError> {
        let _phase = plexus_delegates::timing::phase("plan_save");
        let p = self.path(&plan.container_id, &plan.ifname);
        let bytes = serde_json::to_vec(plan).map_err(|source| MetaError::PlanEncode { source })?;
        fsutil::write_atomic(&p, &bytes, 0o600).map_err(|source| MetaError::PlanSave {
            path: p.clone(),
            source,
        })
    }

    /// Save for ADD (atomic, 0600): the plan is in place when this returns — any process that
    /// dies after it (plexus, the daemon, SIGKILL, OOM) leaves it for DEL — and its fsync runs
    /// on a thread of its own while the delegates run; [`Durable::wait`] joins it before ADD
    /// answers. Only a power loss (or kernel crash) during the ADD itself can lose it, a window
    /// in which the delegates' own state (IPAM lease files, the result cache) is not on disk
    /// either; DEL then falls back to the result cache and a rebuilt plan.
    pub fn save_for_add(&self, plan: &SavedPlan) -> Result<Durable, MetaError> {
        let _phase = plexus_delegates::timing::phase("plan_save");
        let p = self.path(&plan.container_id, &plan.ifname);
        let bytes = serde_json::to_vec(plan).map_err(|source| MetaError::PlanEncode { source })?;
        fsutil::write_atomic_nosync(&p, &bytes, 0o600).map_err(|source| MetaError::PlanSave {
            path: p.clone(),
            source,
        })?;
        let synced = p.clone();
        let sync = std::thread::Builder::new()
            .name("plexus-plan-sync".into())
            .spawn(move || std::fs::File::open(&synced).and_then(|f| f.sync_all()));
        Ok(Durable {
            path: p,
            sync: sync.ok(),
        })
    }

    /// Load; `Ok(None)` when there is none, an error only when it exists but is unusable.
    pub fn load(&self, container_id: &str, ifname: &str) -> Result<Option<SavedPlan>, MetaError> {
        let p = self.path(container_id, ifname);
        // An oversized plan (InvalidData) is as unusable as a corrupt one (code 6).
        let Some(bytes) = fsutil::read_optional(&p).map_err(|source| MetaError::PlanRead {
            path: p.clone(),
            source,
        })?
        else {
            return Ok(None);
        };
        let error = match serde_json::from_slice::<SavedPlan>(&bytes) {
            Ok(plan) if plan.kind == PLAN_KIND => return Ok(Some(plan)),
            Ok(_) => None,
            Err(e) => Some(e),
        };
        // A plexus plan of another format (a newer plexus, before a downgrade) is named as such,
        // whether or not its fields decode.
        let kind = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
            .filter(|k| k.starts_with("plexusPlan") && k != PLAN_KIND);
        match kind {
            Some(kind) => Err(MetaError::PlanOfAnotherVersion {
                path: p,
                kind,
                reads: PLAN_KIND,
            }),
            None => Err(MetaError::CorruptPlan {
                path: p,
                source: error,
            }),
        }
    }

    /// Remove; already gone is success.
    pub fn remove(&self, container_id: &str, ifname: &str) -> Result<(), MetaError> {
        let p = self.path(container_id, ifname);
        fsutil::remove_if_exists(&p).map_err(|source| MetaError::PlanRemove { path: p, source })
    }

    fn tombstone(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.dir
            .join("tombstones")
            .join(format!("{container_id}-{ifname}"))
    }

    /// Remove `container_id`'s lock file, by the holder of its lock that finds the container
    /// deleted already: a call that waited for the lock while a DEL removed the file re-creates
    /// it ([`FileLock::acquire`] locks only the file the path names), and nobody else would
    /// remove that one.
    pub fn drop_lock_file(&self, container_id: &str) {
        let _ =
            fsutil::remove_if_exists(&self.dir.join("locks").join(format!("{container_id}.lock")));
    }

    /// After a complete DEL, called while still holding the container lock: leave a tombstone,
    /// so that the runtime's repeated DELs (typically two more, with an empty netns) return at
    /// once, then unlink the lock file (lockers verify the path still names the file they
    /// locked). Tombstones older than an hour are swept on each call.
    pub fn finish_delete(&self, container_id: &str, ifname: &str) {
        self.write_tombstone(container_id, ifname, b"");
    }

    /// Like [`PlanStore::finish_delete`] for a DEL that knew no network namespace: whatever
    /// its delegates held outside the pod is released, but interfaces may still live in a
    /// namespace it never saw, so only later DELs without a usable netns are skipped.
    pub fn finish_delete_without_netns(&self, container_id: &str, ifname: &str) {
        self.write_tombstone(container_id, ifname, NETNS_UNKNOWN);
    }

    fn write_tombstone(&self, container_id: &str, ifname: &str, content: &[u8]) {
        let t = self.tombstone(container_id, ifname);
        if let Err(e) = fsutil::write_atomic_nosync(&t, content, 0o600) {
            tracing::warn!(error = %e, "cannot write DEL tombstone");
        }
        let _ =
            fsutil::remove_if_exists(&self.dir.join("locks").join(format!("{container_id}.lock")));
        self.sweep_tombstones(Duration::from_secs(3600));
    }

    /// Whether a DEL already did everything a DEL with (`has_netns`) or without a usable
    /// network namespace could do for this attachment.
    pub fn deleted(&self, container_id: &str, ifname: &str, has_netns: bool) -> bool {
        match fsutil::read_capped(
            &self.tombstone(container_id, ifname),
            fsutil::MAX_STATE_FILE_BYTES,
        ) {
            Ok(content) => content.is_empty() || !has_netns,
            Err(_) => false,
        }
    }

    /// Forget a tombstone (a new ADD for the same container).
    pub fn clear_tombstone(&self, container_id: &str, ifname: &str) {
        let _ = fsutil::remove_if_exists(
            &self
                .dir
                .join("tombstones")
                .join(format!("{container_id}-{ifname}")),
        );
    }

    fn sweep_tombstones(&self, max_age: Duration) {
        let Ok(rd) = std::fs::read_dir(self.dir.join("tombstones")) else {
            return;
        };
        for e in rd.filter_map(Result::ok) {
            let old = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > max_age);
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Every saved plan (for GC).
    pub fn all(&self) -> Vec<SavedPlan> {
        let Ok(rd) = std::fs::read_dir(self.dir.join("plans")) else {
            return Vec::new();
        };
        rd.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|e| fsutil::read_capped(&e.path(), fsutil::MAX_STATE_FILE_BYTES).ok())
            .filter_map(|b| serde_json::from_slice::<SavedPlan>(&b).ok())
            .filter(|p| p.kind == PLAN_KIND)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    /// Two DELs of one container: the second waits for the lock while the first finishes and
    /// removes the lock file; its wait re-creates the file, and seeing the container deleted it
    /// removes that file again: no lock file is left for a container that is gone.
    #[test]
    fn a_del_that_waited_for_a_finished_del_leaves_no_lock_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::PlanStore::new(dir.path());
        let lock_file = dir.path().join("locks").join("c1.lock");
        let first = store.lock("c1").unwrap();
        let second = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let l = store.lock("c1").unwrap();
                assert!(
                    store.deleted("c1", "eth0", true),
                    "the first DEL's tombstone"
                );
                assert!(lock_file.exists(), "the wait re-created the lock file");
                store.drop_lock_file("c1");
                drop(l);
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            store.finish_delete("c1", "eth0");
            drop(first);
            waiter.join()
        });
        assert!(second.is_ok());
        assert!(
            !lock_file.exists(),
            "a lock file left for a deleted container"
        );
    }

    /// A plan's address claims are kept across a save; a plan without any writes no `claims`
    /// key (what an earlier plexus reads is unchanged).
    #[test]
    fn claims_are_saved_and_absent_when_none() {
        let mut p = super::SavedPlan::new("c1", "eth0", "/n", None, vec![]);
        let plain = serde_json::to_value(&p).unwrap();
        assert!(plain.get("claims").is_none(), "{plain}");
        p.claims.push(super::ClaimedAddress {
            network: "db/data".into(),
            address: "10.56.100.10".parse().unwrap(),
        });
        let text = serde_json::to_string(&p).unwrap();
        let back: super::SavedPlan = serde_json::from_str(&text).unwrap();
        assert_eq!(back.claims, p.claims);
        assert!(
            text.contains(r#""claims":[{"network":"db/data","address":"10.56.100.10"}]"#),
            "{text}"
        );
    }

    /// Every plan format an earlier plexus wrote still reads (one fixture per format change:
    /// the first plans; `resourceName`; `delFailures`/`firstDelFailure`; `nad`), and a plan of
    /// another kind (a newer plexus, before a downgrade) is refused naming its kind.
    #[test]
    fn every_earlier_plan_format_reads_and_a_newer_kind_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = PlanStore::new(dir.path());
        std::fs::create_dir_all(dir.path().join("plans")).unwrap();
        let put = |cid: &str, text: &str| {
            std::fs::write(
                dir.path().join("plans").join(format!("{cid}-eth0.json")),
                text,
            )
            .unwrap()
        };
        let fixtures = [
            (
                "c20261121",
                include_str!("state_fixtures/plan-2026-11-21.json"),
                2,
            ),
            (
                "c20261123",
                include_str!("state_fixtures/plan-2026-11-23.json"),
                2,
            ),
            (
                "c20261126",
                include_str!("state_fixtures/plan-2026-11-26.json"),
                1,
            ),
            (
                "c20261127",
                include_str!("state_fixtures/plan-2026-11-27.json"),
                2,
            ),
        ];
        for (cid, text, attachments) in fixtures {
            put(cid, text);
            let plan = store
                .load(cid, "eth0")
                .unwrap()
                .unwrap_or_else(|| panic!("{cid}"));
            assert_eq!(plan.container_id, cid);
            assert_eq!(plan.attachments.len(), attachments, "{cid}");
            assert!(plan.attachments[0].is_default, "{cid}");
            assert!(
                plan.pod.as_ref().is_some_and(|p| !p.uid.is_empty()),
                "{cid}"
            );
        }
        let old = store.load("c20261121", "eth0").unwrap().unwrap();
        assert_eq!(
            crate::address_guard::static_addresses(&old.attachments),
            vec![("db/data".to_string(), "10.246.0.10".parse().unwrap())]
        );
        let sriov = store.load("c20261123", "eth0").unwrap().unwrap();
        assert_eq!(
            sriov.attachments[1].resource_name.as_deref(),
            Some("intel.com/sriov_igb")
        );
        let failing = store.load("c20261126", "eth0").unwrap().unwrap();
        assert_eq!(
            (failing.del_failures, failing.first_del_failure),
            (2, Some(1795600000))
        );
        let nad = store.load("c20261127", "eth0").unwrap().unwrap();
        assert!(nad.attachments[1]
            .nad
            .as_ref()
            .is_some_and(|n| n.inline_config));

        put(
            "cnewer",
            include_str!("state_fixtures/plan-newer-kind.json"),
        );
        let e = store.load("cnewer", "eth0").unwrap_err();
        assert_eq!(e.code(), 6);
        let text = format!("{} {}", e.msg(), e.details());
        assert!(
            text.contains("plexusPlanV2") && text.contains(PLAN_KIND),
            "{text}"
        );
        put("cgarbage", r#"{"kind":"somethingElse"}"#);
        assert!(matches!(
            store.load("cgarbage", "eth0"),
            Err(MetaError::CorruptPlan { .. })
        ));
    }

    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn save_load_remove_private() {
        let t = tempfile::tempdir().unwrap();
        let s = PlanStore::new(t.path());
        let plan = SavedPlan::new("c1", "eth0", "/run/netns/x", None, vec![]);
        s.save(&plan).unwrap();
        assert_eq!(s.load("c1", "eth0").unwrap().unwrap(), plan);
        let mode = std::fs::metadata(t.path().join("plans/c1-eth0.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(s.all().len(), 1);
        s.remove("c1", "eth0").unwrap();
        s.remove("c1", "eth0").unwrap();
        assert!(s.load("c1", "eth0").unwrap().is_none());
        std::fs::write(t.path().join("plans/c2-eth0.json"), b"{trunc").unwrap();
        let e = s.load("c2", "eth0").unwrap_err();
        assert!(
            matches!(&e, MetaError::CorruptPlan { source: Some(_), path } if path.ends_with("c2-eth0.json")),
            "{e:?}"
        );
        assert_eq!(e.code(), 6);
        // Valid JSON of another kind is as corrupt.
        let other = SavedPlan {
            kind: "somethingElseV1".into(),
            ..SavedPlan::new("c4", "eth0", "", None, vec![])
        };
        std::fs::write(
            t.path().join("plans/c4-eth0.json"),
            serde_json::to_vec(&other).unwrap(),
        )
        .unwrap();
        assert!(matches!(
            s.load("c4", "eth0").unwrap_err(),
            MetaError::CorruptPlan { source: None, .. }
        ));
        // An oversized plan is refused before it is read, naming its size and the limit.
        let big = std::fs::File::create(t.path().join("plans/c3-eth0.json")).unwrap();
        big.set_len(fsutil::MAX_STATE_FILE_BYTES as u64 + 1)
            .unwrap();
        let e = s.load("c3", "eth0").unwrap_err();
        assert!(matches!(&e, MetaError::PlanRead { .. }), "{e:?}");
        assert_eq!(e.code(), 6);
        assert!(
            e.details().ends_with(&format!(
                "file is too large: {} bytes, the limit is {} bytes",
                fsutil::MAX_STATE_FILE_BYTES + 1,
                fsutil::MAX_STATE_FILE_BYTES
            )),
            "{e}"
        );
    }

    #[test]
    fn a_delete_without_netns_does_not_stop_one_with_a_netns() {
        let t = tempfile::tempdir().unwrap();
        let s = PlanStore::new(t.path());
        assert!(!s.deleted("c1", "eth0", false));
        s.finish_delete_without_netns("c1", "eth0");
        assert!(s.deleted("c1", "eth0", false));
        assert!(!s.deleted("c1", "eth0", true));
        s.finish_delete("c1", "eth0");
        assert!(s.deleted("c1", "eth0", true));
        s.clear_tombstone("c1", "eth0");
        assert!(!s.deleted("c1", "eth0", false));
    }

    #[test]
    fn an_unwritable_state_dir_is_an_io_failure_not_a_retry() {
        let t = tempfile::tempdir().unwrap();
        // A regular file where the state directory should be: nothing can be created in it.
        let blocked = t.path().join("not-a-dir");
        std::fs::write(&blocked, b"").unwrap();
        let e = PlanStore::new(&blocked).lock("c1").unwrap_err();
        assert!(
            matches!(&e, MetaError::Lock { container_id, path, .. } if container_id == "c1" && path.starts_with(&blocked)),
            "{e:?}"
        );
        assert_eq!(e.code(), plexus_conf::error::code::IO_FAILURE, "{e}");
        assert!(e.details().contains("not-a-dir"), "{e}");
        // Saving there fails as an I/O failure too.
        let e = PlanStore::new(&blocked)
            .save(&SavedPlan::new("c1", "eth0", "", None, vec![]))
            .unwrap_err();
        assert!(matches!(e, MetaError::PlanSave { .. }), "{e:?}");
        assert_eq!(e.code(), plexus_conf::error::code::IO_FAILURE);
    }
}
