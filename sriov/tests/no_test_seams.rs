//! The shipped `sriov` binary cannot be told to pretend: with the test seams' environment set
//! (a fake sysfs tree with a PF and VF, a file-backed PF), it still reads the real `/sys` and
//! never touches the fake PF file. Only the test-only `sriov-fake-pf` binary honours them.

use plexus_sriov::fake_sysfs::{FakeSysfs, FakeVf};
use plexus_sriov::pf_fake::{FakePfState, FilePf};
use std::process::Command;

const PF_PCI: &str = "0000:af:00.1";
const VF: &str = "0000:af:06.0";

fn fake_node() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    FakeSysfs::new(&t.path().join("sys"))
        .add_pf(PF_PCI, "fakepf0", &[FakeVf::netdev(VF, "fakevf0")])
        .unwrap();
    FilePf::create(
        &t.path().join("pf.json"),
        &FakePfState::with_pf("fakepf0", 1),
    )
    .unwrap();
    t
}

fn list(binary: &str, node: &tempfile::TempDir) -> String {
    let out = Command::new(binary)
        .args(["list", "--json"])
        .env("PLEXUS_SYSFS_ROOT", node.path().join("sys"))
        .env("PLEXUS_SRIOV_FAKE_PF", node.path().join("pf.json"))
        .env("PLEXUS_SRIOV_STATE_DIR", node.path().join("state"))
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_shipped_binary_ignores_the_test_environment() {
    let node = fake_node();
    // The test binary sees the fake PF (and records its call in the file)…
    assert!(list(env!("CARGO_BIN_EXE_sriov-fake-pf"), &node).contains("fakepf0"));
    let before = std::fs::read(node.path().join("pf.json")).unwrap();
    // …the shipped one does not: it lists the machine's real SR-IOV PFs (none here).
    let shipped = list(env!("CARGO_BIN_EXE_sriov"), &node);
    assert!(!shipped.contains("fakepf0"), "{shipped}");
    // An ADD for the fake VF fails on the real sysfs, before any PF call.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sriov"))
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "c1")
        .env("CNI_NETNS", "/proc/self/ns/net")
        .env("CNI_IFNAME", "net1")
        .env("CNI_PATH", "/usr/lib/cni")
        .env("PLEXUS_SYSFS_ROOT", node.path().join("sys"))
        .env("PLEXUS_SRIOV_FAKE_PF", node.path().join("pf.json"))
        .env("PLEXUS_SRIOV_STATE_DIR", node.path().join("state"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            format!(r#"{{"cniVersion":"1.0.0","name":"n","type":"sriov","deviceID":"{VF}"}}"#)
                .as_bytes(),
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stdout);
    assert!(err.contains(VF), "{err}");
    assert_eq!(
        std::fs::read(node.path().join("pf.json")).unwrap(),
        before,
        "the fake PF file was not used"
    );
}
