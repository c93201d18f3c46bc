//! Builds fake sysfs trees for tests and e2e (the layout `sysfs.rs` reads).
//!
//! `bus/pci/devices/<pf>/{net/<pfname>, virtfnN -> ../<vf>}`,
//! `bus/pci/devices/<vf>/{physfn -> ../<pf>, net/<vfname>, driver -> ../../drivers/<drv>}`,
//! `bus/pci/drivers/<drv>/`, `class/net/<if> -> ../../bus/pci/devices/<pci>/net/<if>`,
//! `bus/pci/devices/<pci>/net/<if>/device -> ../..`.

use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// One VF of a fake PF.
#[derive(Clone, Debug)]
pub struct FakeVf {
    /// PCI address.
    pub pci: String,
    /// Netdev name, if bound to a kernel driver.
    pub netdev: Option<String>,
    /// Driver name (`iavf` for netdev VFs unless set).
    pub driver: Option<String>,
}

impl FakeVf {
    /// A VF with a kernel netdev.
    pub fn netdev(pci: &str, netdev: &str) -> Self {
        FakeVf {
            pci: pci.into(),
            netdev: Some(netdev.into()),
            driver: Some("iavf".into()),
        }
    }

    /// A VF bound to a userspace driver (no netdev).
    pub fn userspace(pci: &str, driver: &str) -> Self {
        FakeVf {
            pci: pci.into(),
            netdev: None,
            driver: Some(driver.into()),
        }
    }
}

/// A fake sysfs tree under a directory.
#[derive(Clone, Debug)]
pub struct FakeSysfs {
    root: PathBuf,
}

impl FakeSysfs {
    /// A tree rooted at `root` (created on demand).
    pub fn new(root: &Path) -> Self {
        FakeSysfs {
            root: root.to_path_buf(),
        }
    }

    fn dev(&self, pci: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(pci)
    }

    fn add_netdev(&self, pci: &str, name: &str) -> io::Result<()> {
        let nd = self.dev(pci).join("net").join(name);
        std::fs::create_dir_all(&nd)?;
        symlink("../..", nd.join("device"))?;
        std::fs::create_dir_all(self.root.join("class/net"))?;
        symlink(
            format!("../../bus/pci/devices/{pci}/net/{name}"),
            self.root.join("class/net").join(name),
        )
    }

    /// Adds a PF with netdev `pf_netdev` and the given VFs (`virtfn0..`).
    pub fn add_pf(&self, pf_pci: &str, pf_netdev: &str, vfs: &[FakeVf]) -> io::Result<()> {
        let pf = self.dev(pf_pci);
        std::fs::create_dir_all(&pf)?;
        self.add_netdev(pf_pci, pf_netdev)?;
        std::fs::write(pf.join("sriov_numvfs"), format!("{}\n", vfs.len()))?;
        std::fs::write(pf.join("sriov_totalvfs"), format!("{}\n", vfs.len().max(8)))?;
        for (i, vf) in vfs.iter().enumerate() {
            let d = self.dev(&vf.pci);
            std::fs::create_dir_all(&d)?;
            symlink(format!("../{pf_pci}"), d.join("physfn"))?;
            symlink(format!("../{}", vf.pci), pf.join(format!("virtfn{i}")))?;
            if let Some(n) = &vf.netdev {
                self.add_netdev(&vf.pci, n)?;
            }
            if let Some(drv) = &vf.driver {
                std::fs::create_dir_all(self.root.join("bus/pci/drivers").join(drv))?;
                symlink(format!("../../drivers/{drv}"), d.join("driver"))?;
            }
        }
        Ok(())
    }

    /// Renames a VF netdev entry, as the kernel's sysfs view changes when the netdev is renamed
    /// (e.g. to `devN` when its netns is destroyed).
    pub fn rename_netdev(&self, pci: &str, from: &str, to: &str) -> io::Result<()> {
        let net = self.dev(pci).join("net");
        std::fs::rename(net.join(from), net.join(to))?;
        let class = self.root.join("class/net");
        let _ = std::fs::remove_file(class.join(from));
        symlink(
            format!("../../bus/pci/devices/{pci}/net/{to}"),
            class.join(to),
        )
    }
}
