//! The SR-IOV "host" the sriov e2e tests run `sriov` in: a per-test netns whose veth end `vf0`
//! stands in for the VF netdev (the machine's own links stay untouched), a fake sysfs tree with
//! one PF and that VF, the file-backed fake PF (`pf.json`), and a CNI bin dir whose `sriov`
//! runs the real binary inside that netns.

use super::{bin, Netns};
use plexus_sriov::fake_sysfs::{FakeSysfs, FakeVf};
use plexus_sriov::pf_fake::{FakePfState, FilePf};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The fake PF's netdev name.
pub const PF: &str = "enp175s0f1";
/// The fake PF's PCI address.
pub const PF_PCI: &str = "0000:af:00.1";
/// Its one VF's PCI address (netdev `vf0` in the host netns).
pub const VF0: &str = "0000:af:06.0";

/// Builds the host under `dir` (`sys/`, `pf.json`, `bin/sriov`); returns its netns and the
/// bin dir.
pub fn fake_pf_host(dir: &Path) -> (Netns, PathBuf) {
    let host = Netns::new();
    host.ip(&[
        "link",
        "add",
        "vf0",
        "address",
        "02:00:00:00:00:10",
        "mtu",
        "1500",
        "type",
        "veth",
        "peer",
        "name",
        "vf0p",
    ]);
    host.ip(&["link", "set", "vf0p", "up"]);
    FakeSysfs::new(&dir.join("sys"))
        .add_pf(PF_PCI, PF, &[FakeVf::netdev(VF0, "vf0")])
        .unwrap();
    let mut st = FakePfState::with_pf(PF, 1);
    st.pfs.get_mut(PF).unwrap()[0].mac = "02:aa:00:00:00:00".parse().unwrap();
    FilePf::create(&dir.join("pf.json"), &st).unwrap();
    let bindir = dir.join("bin");
    std::fs::create_dir_all(&bindir).unwrap();
    let wrapper = format!(
        "#!/bin/sh\nexec ip netns exec {} {} \"$@\"\n",
        host.name,
        bin("sriov-fake-pf").display()
    );
    std::fs::write(bindir.join("sriov"), wrapper).unwrap();
    std::fs::set_permissions(bindir.join("sriov"), std::fs::Permissions::from_mode(0o755)).unwrap();
    (host, bindir)
}
