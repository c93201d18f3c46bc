//! VF discovery through sysfs (root configurable, default `/sys`).

use std::path::{Path, PathBuf};

/// Userspace (DPDK) drivers: a VF bound to one of these has no netdev.
pub const USERSPACE_DRIVERS: &[&str] = &["vfio-pci", "uio_pci_generic", "igb_uio"];

/// Error of a sysfs lookup.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// The PCI device does not exist.
    #[error("VF {vf}: no PCI device at {path}")]
    NoDevice {
        /// VF PCI address.
        vf: String,
        /// The path looked at.
        path: PathBuf,
    },
    /// The device is not a VF (no `physfn`).
    #[error("VF {vf}: not an SR-IOV VF ({path} missing)")]
    NotAVf {
        /// VF PCI address.
        vf: String,
        /// The path looked at.
        path: PathBuf,
    },
    /// The PF has no netdev.
    #[error("VF {vf}: PF {pf} has no network device")]
    NoPfNetdev {
        /// VF PCI address.
        vf: String,
        /// PF PCI address.
        pf: String,
    },
    /// No `virtfnN` link of the PF points at the VF.
    #[error("VF {vf}: not listed as a virtfnN of PF {pf}")]
    NoVfIndex {
        /// VF PCI address.
        vf: String,
        /// PF PCI address.
        pf: String,
    },
    /// Neither a netdev nor a userspace driver.
    #[error("VF {vf}: has neither a network device nor a userspace driver (driver: {driver})")]
    NoNetdevNorDpdk {
        /// VF PCI address.
        vf: String,
        /// Bound driver or "none".
        driver: String,
    },
    /// An I/O error reading sysfs.
    #[error("read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// How the VF is used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VfMode {
    /// Kernel driver with a netdev (name as sysfs shows it in this netns).
    Netdev(String),
    /// Userspace driver (DPDK); the name is the driver.
    Userspace(String),
}

/// Everything sysfs tells about one VF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VfLocation {
    /// VF PCI address.
    pub vf_pci: String,
    /// PF PCI address.
    pub pf_pci: String,
    /// PF netdev name (first in sorted order, as sriov-cni).
    pub pf_netdev: String,
    /// VF index on the PF (the N of `virtfnN`).
    pub vf_index: u32,
    /// VF netdev names visible in this netns, sorted.
    pub netdevs: Vec<String>,
    /// Bound driver, if any.
    pub driver: Option<String>,
}

impl VfLocation {
    /// The mode: netdev if the VF has one, userspace if bound to a userspace driver.
    pub fn mode(&self) -> Result<VfMode, SysfsError> {
        if let Some(n) = self.netdevs.first() {
            return Ok(VfMode::Netdev(n.clone()));
        }
        match &self.driver {
            Some(d) if USERSPACE_DRIVERS.contains(&d.as_str()) => Ok(VfMode::Userspace(d.clone())),
            d => Err(SysfsError::NoNetdevNorDpdk {
                vf: self.vf_pci.clone(),
                driver: d.clone().unwrap_or_else(|| "none".into()),
            }),
        }
    }
}

/// A PF with its VFs (for `sriov list`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PfEntry {
    /// PF PCI address.
    pub pf_pci: String,
    /// PF netdev name, if any.
    pub pf_netdev: Option<String>,
    /// VFs, by index: (index, VF PCI address).
    pub vfs: Vec<(u32, String)>,
}

/// A sysfs tree rooted at `root` (normally `/sys`).
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SysfsError + '_ {
    move |source| SysfsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn sorted_names(dir: &Path) -> Result<Vec<String>, SysfsError> {
    match std::fs::read_dir(dir) {
        Ok(rd) => {
            let mut v = Vec::new();
            for e in rd {
                let e = e.map_err(io(dir))?;
                v.push(e.file_name().to_string_lossy().into_owned());
            }
            v.sort();
            Ok(v)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io(dir)(e)),
    }
}

fn link_basename(p: &Path) -> Option<String> {
    std::fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

impl Sysfs {
    /// A tree at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/bus/pci/devices/<pci>`.
    pub fn pci_dir(&self, pci: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(pci)
    }

    /// Looks up a VF: its PF, index, netdevs and driver.
    pub fn find_vf(&self, vf_pci: &str) -> Result<VfLocation, SysfsError> {
        // deviceID was validated as a PCI address, so it cannot escape the devices directory.
        let dir = self.pci_dir(vf_pci);
        if !dir.exists() {
            return Err(SysfsError::NoDevice {
                vf: vf_pci.into(),
                path: dir,
            });
        }
        let physfn = dir.join("physfn");
        let pf_pci = link_basename(&physfn).ok_or_else(|| SysfsError::NotAVf {
            vf: vf_pci.into(),
            path: physfn.clone(),
        })?;
        let pf_dir = self.pci_dir(&pf_pci);
        let pf_netdev = sorted_names(&pf_dir.join("net"))?
            .into_iter()
            .next()
            .ok_or_else(|| SysfsError::NoPfNetdev {
                vf: vf_pci.into(),
                pf: pf_pci.clone(),
            })?;
        let vf_index = self
            .virtfns(&pf_dir)?
            .into_iter()
            .find(|(_, pci)| pci == vf_pci)
            .map(|(i, _)| i)
            .ok_or_else(|| SysfsError::NoVfIndex {
                vf: vf_pci.into(),
                pf: pf_pci.clone(),
            })?;
        Ok(VfLocation {
            vf_pci: vf_pci.into(),
            pf_pci,
            pf_netdev,
            vf_index,
            netdevs: sorted_names(&dir.join("net"))?,
            driver: link_basename(&dir.join("driver")),
        })
    }

    /// The VF netdev names sysfs shows for `vf_pci` now.
    pub fn vf_netdevs(&self, vf_pci: &str) -> Result<Vec<String>, SysfsError> {
        sorted_names(&self.pci_dir(vf_pci).join("net"))
    }

    /// `(index, VF PCI address)` for every `virtfnN` link of a PF directory, by index.
    fn virtfns(&self, pf_dir: &Path) -> Result<Vec<(u32, String)>, SysfsError> {
        let mut out = Vec::new();
        for name in sorted_names(pf_dir)? {
            let Some(idx) = name
                .strip_prefix("virtfn")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(pci) = link_basename(&pf_dir.join(&name)) {
                out.push((idx, pci));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Every PCI device that has VFs, with its VFs.
    pub fn list_pfs(&self) -> Result<Vec<PfEntry>, SysfsError> {
        let devices = self.root.join("bus/pci/devices");
        let mut out = Vec::new();
        for pci in sorted_names(&devices)? {
            let dir = devices.join(&pci);
            let vfs = self.virtfns(&dir)?;
            if vfs.is_empty() {
                continue;
            }
            out.push(PfEntry {
                pf_netdev: sorted_names(&dir.join("net"))?.into_iter().next(),
                pf_pci: pci,
                vfs,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_sysfs::{FakeSysfs, FakeVf};

    fn tree() -> (tempfile::TempDir, Sysfs) {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeSysfs::new(dir.path());
        fake.add_pf(
            "0000:af:00.1",
            "enp175s0f1",
            &[
                FakeVf::netdev("0000:af:06.0", "enp175s6"),
                FakeVf::netdev("0000:af:06.1", "enp175s7"),
                FakeVf::userspace("0000:af:06.2", "vfio-pci"),
                FakeVf::userspace("0000:af:06.3", "ixgbevf-unbound"),
            ],
        )
        .unwrap();
        fake.add_pf("0000:05:00.0", "ens1", &[]).unwrap();
        let s = Sysfs::new(dir.path());
        (dir, s)
    }

    #[test]
    fn finds_pf_index_netdev_and_driver() {
        let (_d, s) = tree();
        let l = s.find_vf("0000:af:06.1").unwrap();
        assert_eq!(l.pf_netdev, "enp175s0f1");
        assert_eq!(l.pf_pci, "0000:af:00.1");
        assert_eq!(l.vf_index, 1);
        assert_eq!(l.mode().unwrap(), VfMode::Netdev("enp175s7".into()));
        let d = s.find_vf("0000:af:06.2").unwrap();
        assert_eq!(d.vf_index, 2);
        assert_eq!(d.mode().unwrap(), VfMode::Userspace("vfio-pci".into()));
        let e = s.find_vf("0000:af:06.3").unwrap().mode().unwrap_err();
        assert!(e.to_string().contains("neither a network device"), "{e}");
    }

    #[test]
    fn errors_name_the_vf() {
        let (_d, s) = tree();
        let e = s.find_vf("0000:99:00.0").unwrap_err().to_string();
        assert!(
            e.contains("0000:99:00.0") && e.contains("no PCI device"),
            "{e}"
        );
        let e = s.find_vf("0000:05:00.0").unwrap_err().to_string();
        assert!(e.contains("not an SR-IOV VF"), "{e}");
    }

    #[test]
    fn lists_pfs_with_vfs_only() {
        let (_d, s) = tree();
        let pfs = s.list_pfs().unwrap();
        assert_eq!(pfs.len(), 1);
        assert_eq!(pfs[0].pf_netdev.as_deref(), Some("enp175s0f1"));
        assert_eq!(pfs[0].vfs.len(), 4);
        assert_eq!(pfs[0].vfs[3], (3, "0000:af:06.3".to_string()));
    }
}
