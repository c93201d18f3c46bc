//! The per-attachment state file (original VF state saved before ADD changes anything) and the
//! per-VF allocation record, both under the state directory.
//!
//! Layout: `<dir>/<containerID>-<ifname>.json` (state), `<dir>/pci/<bdf>.json` (allocation),
//! `<dir>/lock/<bdf>.lock` (flock). Files 0600, directories 0700, writes atomic.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plexus_delegates::fsutil;
use plexus_delegates::lock::FileLock;
use serde::{Deserialize, Serialize};

use crate::error::SriovError;
use crate::pf::{MacAddr, VfConfig};

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/plexus-sriov";

/// How long a call waits for another call on the same VF (sriov-cni also waits 60 s).
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// Which PF-side settings ADD changed (and DEL must revert).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    /// VLAN / QoS / proto.
    pub vlan: bool,
    /// Admin MAC.
    pub mac: bool,
    /// Rates.
    pub rate: bool,
    /// Spoof check.
    pub spoofchk: bool,
    /// Trust.
    pub trust: bool,
    /// Link state.
    pub link_state: bool,
}

/// The VF netdev as it was in the host before ADD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetdevOrig {
    /// Host name.
    pub name: String,
    /// MAC address.
    pub mac: MacAddr,
    /// MTU.
    pub mtu: u32,
    /// Host ifindex (the kernel names a VF `dev<ifindex>` when its netns dies).
    pub ifindex: u32,
}

/// One attachment's saved state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfState {
    /// Container id.
    pub container_id: String,
    /// Interface name in the container.
    pub ifname: String,
    /// Netns path at ADD.
    pub netns: String,
    /// VF PCI address.
    pub vf_pci: String,
    /// PF netdev.
    pub pf: String,
    /// VF index on the PF.
    pub vf_index: u32,
    /// Userspace driver name when in DPDK mode (persisted, unlike sriov-cni's DPDKMode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userspace_driver: Option<String>,
    /// PF-side configuration before ADD.
    pub orig_pf: VfConfig,
    /// What ADD changed on the PF side so far.
    pub applied: Applied,
    /// The netdev before ADD (netdev mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orig_netdev: Option<NetdevOrig>,
    /// `ipam.type` of the ADD config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam_type: Option<String>,
    /// The ADD config (stdin), so GC can release IPAM.
    pub config: serde_json::Value,
    /// True once ADD finished.
    pub complete: bool,
}

/// Who holds a VF.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// Container id.
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
    /// Netns path.
    pub netns: String,
}

/// Whether `e` (from [`StateStore::load`]) means the state file exists but cannot be used:
/// undecodable, or over its size cap. DEL then does what it can without it.
pub fn is_corrupt(e: &SriovError) -> bool {
    match e {
        SriovError::Io { what, source, .. } => {
            *what == "decode"
                || (*what == "read" && source.kind() == std::io::ErrorKind::InvalidData)
        }
        _ => false,
    }
}

/// The state directory.
#[derive(Clone, Debug)]
pub struct StateStore {
    dir: PathBuf,
}

fn io<'p>(what: &'static str, p: &'p Path) -> impl FnOnce(std::io::Error) -> SriovError + 'p {
    move |e| SriovError::io(what, p, e)
}

impl StateStore {
    /// A store rooted at `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StateStore { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the state file of (container, ifname).
    pub fn state_path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.dir.join(format!("{container_id}-{ifname}.json"))
    }

    fn alloc_path(&self, vf_pci: &str) -> PathBuf {
        self.dir.join("pci").join(format!("{vf_pci}.json"))
    }

    /// Takes the per-VF lock (serialises ADD/DEL/CHECK/GC on one VF across processes).
    pub fn lock_vf(&self, vf_pci: &str) -> Result<FileLock, SriovError> {
        let p = self.dir.join("lock").join(format!("{vf_pci}.lock"));
        FileLock::acquire(&p, LOCK_TIMEOUT).map_err(io("lock VF", &p))
    }

    fn write_json<T: Serialize>(&self, p: &Path, v: &T) -> Result<(), SriovError> {
        let bytes = serde_json::to_vec_pretty(v)
            .map_err(|e| SriovError::io("encode", p, std::io::Error::other(e)))?;
        if let Some(parent) = p.parent() {
            fsutil::ensure_private_dir(parent).map_err(io("create state dir", parent))?;
        }
        fsutil::write_atomic(p, &bytes, 0o600).map_err(io("write", p))
    }

    fn read_json<T: for<'de> Deserialize<'de>>(&self, p: &Path) -> Result<Option<T>, SriovError> {
        match fsutil::read_optional(p).map_err(io("read", p))? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| SriovError::io("decode", p, std::io::Error::other(e))),
        }
    }

    /// Saves a state record.
    pub fn save(&self, st: &VfState) -> Result<(), SriovError> {
        self.write_json(&self.state_path(&st.container_id, &st.ifname), st)
    }

    /// Loads the state of (container, ifname), if any.
    pub fn load(&self, container_id: &str, ifname: &str) -> Result<Option<VfState>, SriovError> {
        self.read_json(&self.state_path(container_id, ifname))
    }

    /// Removes the state of (container, ifname) (missing is fine).
    pub fn remove(&self, container_id: &str, ifname: &str) -> Result<(), SriovError> {
        let p = self.state_path(container_id, ifname);
        fsutil::remove_if_exists(&p).map_err(io("remove", &p))
    }

    /// Every saved state (for GC and `sriov list`); unreadable files are skipped with a warning.
    pub fn all(&self) -> Result<Vec<VfState>, SriovError> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(SriovError::io("list", &self.dir, e)),
        };
        let mut out = Vec::new();
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json") && p.is_file() {
                match self.read_json::<VfState>(&p) {
                    Ok(Some(s)) => out.push(s),
                    Ok(None) => {}
                    Err(err) => tracing::warn!(%err, "skipping unreadable state file"),
                }
            }
        }
        out.sort_by(|a, b| (&a.vf_pci, &a.container_id).cmp(&(&b.vf_pci, &b.container_id)));
        Ok(out)
    }

    /// Moves the state file of (container, ifname) aside as `<name>.json.corrupt` (kept for
    /// the operator, no longer read by DEL, GC or `sriov list`); returns the new path.
    pub fn quarantine(&self, container_id: &str, ifname: &str) -> Result<PathBuf, SriovError> {
        let p = self.state_path(container_id, ifname);
        let mut to = p.clone().into_os_string();
        to.push(".corrupt");
        let to = PathBuf::from(to);
        std::fs::rename(&p, &to).map_err(io("move aside", &p))?;
        Ok(to)
    }

    /// The VFs whose allocation record names (container, ifname); unreadable records are
    /// skipped.
    pub fn allocations_of(&self, container_id: &str, ifname: &str) -> Vec<String> {
        let dir = self.dir.join("pci");
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out: Vec<String> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let vf = name.strip_suffix(".json")?.to_string();
                let a = self.allocation(&vf).ok()??;
                (a.container_id == container_id && a.ifname == ifname).then_some(vf)
            })
            .collect();
        out.sort();
        out
    }

    /// Records that `alloc` holds `vf_pci`.
    pub fn set_allocation(&self, vf_pci: &str, alloc: &Allocation) -> Result<(), SriovError> {
        self.write_json(&self.alloc_path(vf_pci), alloc)
    }

    /// Who holds `vf_pci`, if anyone.
    pub fn allocation(&self, vf_pci: &str) -> Result<Option<Allocation>, SriovError> {
        self.read_json(&self.alloc_path(vf_pci))
    }

    /// Clears the allocation of `vf_pci` (missing is fine).
    pub fn clear_allocation(&self, vf_pci: &str) -> Result<(), SriovError> {
        let p = self.alloc_path(vf_pci);
        fsutil::remove_if_exists(&p).map_err(io("remove", &p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn save_load_remove_with_private_modes() {
        let d = tempfile::tempdir().unwrap();
        let store = StateStore::new(d.path().join("state"));
        let st = VfState {
            container_id: "c1".into(),
            ifname: "net1".into(),
            netns: "/run/netns/x".into(),
            vf_pci: "0000:af:06.0".into(),
            pf: "pf0".into(),
            vf_index: 0,
            userspace_driver: None,
            orig_pf: VfConfig::default(),
            applied: Applied {
                vlan: true,
                ..Default::default()
            },
            orig_netdev: None,
            ipam_type: None,
            config: serde_json::json!({}),
            complete: false,
        };
        store.save(&st).unwrap();
        let p = store.state_path("c1", "net1");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(store.dir()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(store.load("c1", "net1").unwrap(), Some(st.clone()));
        assert_eq!(store.all().unwrap(), vec![st]);
        store.remove("c1", "net1").unwrap();
        store.remove("c1", "net1").unwrap();
        assert_eq!(store.load("c1", "net1").unwrap(), None);
        let a = Allocation {
            container_id: "c1".into(),
            ifname: "net1".into(),
            netns: "n".into(),
        };
        store.set_allocation("0000:af:06.0", &a).unwrap();
        assert_eq!(store.allocation("0000:af:06.0").unwrap(), Some(a));
        store.clear_allocation("0000:af:06.0").unwrap();
        assert_eq!(store.allocation("0000:af:06.0").unwrap(), None);
    }

    #[test]
    fn corrupt_state_is_recognised_and_moved_aside() {
        let d = tempfile::tempdir().unwrap();
        let store = StateStore::new(d.path());
        std::fs::write(store.state_path("c1", "net1"), b"\x00{trunc").unwrap();
        let e = store.load("c1", "net1").unwrap_err();
        assert!(is_corrupt(&e), "{e}");
        assert!(!is_corrupt(&SriovError::io(
            "read",
            "/x",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied)
        )));
        let to = store.quarantine("c1", "net1").unwrap();
        assert!(to.to_string_lossy().ends_with("c1-net1.json.corrupt"));
        assert_eq!(store.load("c1", "net1").unwrap(), None);
        assert!(store.all().unwrap().is_empty());
        let a = |c: &str| Allocation {
            container_id: c.into(),
            ifname: "net1".into(),
            netns: "n".into(),
        };
        store.set_allocation("0000:af:06.1", &a("c1")).unwrap();
        store.set_allocation("0000:af:06.0", &a("c1")).unwrap();
        store.set_allocation("0000:af:06.2", &a("c2")).unwrap();
        assert_eq!(
            store.allocations_of("c1", "net1"),
            vec!["0000:af:06.0", "0000:af:06.1"]
        );
    }
}
