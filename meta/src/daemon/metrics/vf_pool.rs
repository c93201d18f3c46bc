//! `plexus_sriov_vfs{pf,state}`: the VF pool of each SR-IOV PF of the node, read from sysfs.
//!
//! A PF is a netdev of `/sys/class/net` whose device has `virtfnN` links. A VF is `attached`
//! when the in-tree sriov delegate holds an allocation record for it
//! (`/var/lib/cni/plexus-sriov/pci/<bdf>.json`), or when it has no netdev in the host's
//! namespace while bound to a network driver (another plugin moved it into a pod); else it is
//! `free`. A VF bound to `vfio-pci` (DPDK) without a record counts as free.

use super::Metrics;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The host's sysfs.
pub const SYSFS: &str = "/sys";
/// The in-tree sriov delegate's allocation records.
pub const ALLOCATIONS: &str = "/var/lib/cni/plexus-sriov/pci";
/// How often the pool is read.
pub const REFRESH: Duration = Duration::from_secs(30);

/// One PF's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// The PF's netdev name.
    pub pf: String,
    /// VFs free.
    pub free: u64,
    /// VFs attached.
    pub attached: u64,
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn link_name(p: &Path) -> Option<String> {
    std::fs::read_link(p)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// The pool of every PF under `sysfs` (`<sysfs>/class/net/<pf>/device/virtfnN`), VFs with a
/// record under `allocations` counted attached.
pub fn read(sysfs: &Path, allocations: &Path) -> Vec<Pool> {
    let mut out = Vec::new();
    for pf in names(&sysfs.join("class/net")) {
        let dev = sysfs.join("class/net").join(&pf).join("device");
        let vfs: Vec<String> = names(&dev)
            .into_iter()
            .filter(|n| {
                n.strip_prefix("virtfn")
                    .is_some_and(|i| i.parse::<u32>().is_ok())
            })
            .collect();
        if vfs.is_empty() {
            continue;
        }
        let (mut free, mut attached) = (0, 0);
        for vf in vfs {
            let link = dev.join(&vf);
            let bdf = link_name(&link).unwrap_or_default();
            let recorded = !bdf.is_empty() && allocations.join(format!("{bdf}.json")).exists();
            let netdevs = names(&link.join("net"));
            let driver = link_name(&link.join("driver")).unwrap_or_default();
            let moved = netdevs.is_empty() && !driver.is_empty() && driver != "vfio-pci";
            if recorded || moved {
                attached += 1;
            } else {
                free += 1;
            }
        }
        out.push(Pool { pf, free, attached });
    }
    out
}

/// Set the gauges from one read.
pub fn refresh(m: &Metrics, sysfs: &Path, allocations: &Path) {
    let pools = read(sysfs, allocations);
    m.clear_vfs();
    for p in pools {
        m.set_vfs(&p.pf, p.free, p.attached);
    }
}

/// Read the pool now and every `every` on a thread of its own (nothing is exported on a node
/// without PFs).
pub fn spawn_refresh(m: Arc<Metrics>, sysfs: &'static str, every: Duration) {
    let sysfs = PathBuf::from(sysfs);
    let started = std::thread::Builder::new()
        .name("plexus-vf-pool".into())
        .spawn(move || loop {
            refresh(&m, &sysfs, Path::new(ALLOCATIONS));
            std::thread::sleep(every);
        });
    if let Err(e) = started {
        tracing::warn!(error = %e, "cannot start the VF pool refresh: plexus_sriov_vfs not exported");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A PF `ens1f0` with 3 VFs: 0 free (netdev in the host, a net driver), 1 recorded by the
    /// sriov delegate, 2 moved (no netdev, a net driver); `eth9` has no VFs.
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        let pci = r.join("bus/pci/devices");
        let drivers = r.join("bus/pci/drivers");
        std::fs::create_dir_all(drivers.join("iavf")).unwrap();
        std::fs::create_dir_all(r.join("class/net/eth9/device")).unwrap();
        let pf_dev = pci.join("0000:3b:00.0");
        std::fs::create_dir_all(&pf_dev).unwrap();
        std::fs::create_dir_all(r.join("class/net/ens1f0")).unwrap();
        symlink(&pf_dev, r.join("class/net/ens1f0/device")).unwrap();
        for (i, netdev) in [(0, Some("ens1f0v0")), (1, Some("ens1f0v1")), (2, None)] {
            let vf = pci.join(format!("0000:3b:02.{i}"));
            std::fs::create_dir_all(vf.join("net")).unwrap();
            if let Some(n) = netdev {
                std::fs::create_dir_all(vf.join("net").join(n)).unwrap();
            }
            symlink(drivers.join("iavf"), vf.join("driver")).unwrap();
            symlink(&vf, pf_dev.join(format!("virtfn{i}"))).unwrap();
        }
        let alloc = r.join("alloc");
        std::fs::create_dir_all(&alloc).unwrap();
        std::fs::write(alloc.join("0000:3b:02.1.json"), "{}").unwrap();
        t
    }

    #[test]
    fn counts_free_and_attached_vfs_per_pf() {
        let t = tree();
        let pools = read(t.path(), &t.path().join("alloc"));
        assert_eq!(
            pools,
            vec![Pool {
                pf: "ens1f0".into(),
                free: 1,
                attached: 2
            }]
        );
        let m = Metrics::new();
        refresh(&m, t.path(), &t.path().join("alloc"));
        let text = m.encode();
        assert!(
            text.contains(r#"plexus_sriov_vfs{pf="ens1f0",state="free"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"plexus_sriov_vfs{pf="ens1f0",state="attached"} 2"#),
            "{text}"
        );
        assert!(!text.contains("eth9"), "{text}");
    }
}
