//! The VM tier: the `sriov` delegate (alone and through `plexus`) on real SR-IOV VFs.
//!
//! QEMU (10.0+, TCG) emulates an Intel 82576 PF (`-device igb`) behind an emulated IOMMU; Debian's
//! 6.1 kernel binds `igb` to it, and the PF's VFs bind `igbvf`. The host side of this binary
//! builds an initramfs (`scripts/vm-initramfs.sh`), boots the VM once and waits for it; the VM
//! mounts the host's root read-only over 9p and runs this same binary with `--in-vm`, which runs
//! every case against the real kernel and writes one JSON line per case to a shared directory.
//!
//! `PLEXUS_VM_TIER`: unset = run when QEMU and the kernel are present, else print how to enable
//! the tier and pass; `require` = a missing part fails (CI); `skip` = do not run.
//! `PLEXUS_VM_DIR` (default `target/vm`): where `scripts/vm-kernel.sh` unpacked the kernel.
//! `PLEXUS_VM_TIMEOUT` (seconds, default 600, 2400 with the node cases): the whole VM run.
//! `PLEXUS_K8S_BIN` (as the real-cluster tiers): also run the node cases (`cases_node`: a real
//! kubelet + containerd 2.3 on cgroup v2 in the VM, the bank pod by sriovdp and by
//! dra-driver-sriov) in the same boot, after the delegate cases; `PLEXUS_K8S_REQUIRE=1` makes
//! missing binaries a failure.
//! `PLEXUS_VM_CASES=a,b`: run only the cases whose name contains `a` or `b`.
//! `PLEXUS_VM_ACCEL` (default `tcg`): QEMU accelerator, e.g. `kvm` where KVM works.
//! `PLEXUS_VM_BENCH=1`: also run the sriov vs sriov-cni benchmark (see `bench_host`), and with
//! the node cases the bank pod's create→Running through each.
//! `PLEXUS_VM_KEEP=1`: keep `target/vm/run-<pid>` (console log, results) after a passing run.
//! `PLEXUS_VM_PEER_VM` (default `1`): also boot a second node, a small VM whose PF's wire joins
//! the first VM's over a UDP datagram link on 127.0.0.1 (`peer`); `0`: do not.

#[path = "../common/mod.rs"]
mod common;

mod bench_host;
mod cases;
mod cases_bench;
mod cases_fail;
mod cases_failover;
mod cases_fidelity;
mod cases_node;
mod cases_plexus;
mod cases_traffic;
mod cases_two_nodes;
mod guest;
mod host;
mod node;
mod node_host;
mod peer;
mod peer_link;
mod vf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--in-vm") {
        std::process::exit(guest::main());
    }
    if args.iter().any(|a| a == "--peer-vm") {
        std::process::exit(peer::main());
    }
    // Behave like a libtest binary towards `cargo test -- --list` and name filters: the VM
    // boots only when this tier is selected.
    if args.iter().any(|a| a == "--list") {
        println!("vm_sriov: test");
        return;
    }
    // libtest's NAME filter and --skip, as the other harness-less tiers read them.
    if !plexus_e2e::realk8s::CliArgs::parse(args).selects("vm_sriov") {
        println!("vm_sriov: filtered out");
        return;
    }
    std::process::exit(host::main());
}
