//! Host side: check the prerequisites (or explain how to get them), build the initramfs, boot
//! QEMU once with a bounded wait (QEMU is always killed), then read the per-case results the VM
//! wrote to the shared directory and print them (with the VM console on failure).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::bin;

const ENABLE: &str = "to enable it, as root: `scripts/vm-setup.sh` (qemu-system-x86 from \
bookworm-backports, busybox-static, and Debian's kernel unpacked into target/vm); \
`scripts/test.sh` runs it";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn vm_dir() -> PathBuf {
    std::env::var_os("PLEXUS_VM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| plexus_e2e::realk8s::bins::target_dir().join("vm"))
}

/// What the tier needs, or why it cannot run.
struct Parts {
    qemu: PathBuf,
    vmlinuz: PathBuf,
    kernel_tree: PathBuf,
}

fn find_parts() -> Result<Parts, String> {
    let qemu = which("qemu-system-x86_64").ok_or("qemu-system-x86_64 is not installed")?;
    let devices = Command::new(&qemu)
        .args(["-device", "help"])
        .output()
        .map_err(|e| format!("{}: {e}", qemu.display()))?;
    if !String::from_utf8_lossy(&devices.stdout).contains("\"igb\"") {
        return Err(format!(
            "{} cannot emulate the 82576 (`-device igb` needs QEMU 8.0+; Debian 12 has it in \
             bookworm-backports)",
            qemu.display()
        ));
    }
    which("busybox").ok_or("busybox (busybox-static) is not installed")?;
    let kernel_tree = vm_dir().join("kernel");
    let vmlinuz = std::fs::read_dir(kernel_tree.join("boot"))
        .ok()
        .and_then(|d| {
            d.filter_map(Result::ok).map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
        })
        .ok_or_else(|| format!("no kernel unpacked in {}", kernel_tree.display()))?;
    Ok(Parts {
        qemu,
        vmlinuz,
        kernel_tree,
    })
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Kills QEMU when dropped (timeout, panic, or normal exit after it already stopped).
struct Vm(Child);

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn main() -> i32 {
    let mode = std::env::var("PLEXUS_VM_TIER").unwrap_or_default();
    if mode == "skip" {
        println!("vm_sriov: SKIPPED (PLEXUS_VM_TIER=skip)");
        return 0;
    }
    let parts = match find_parts() {
        Ok(p) => p,
        Err(why) if mode == "require" => {
            eprintln!("vm_sriov: FAILED: PLEXUS_VM_TIER=require but {why}; {ENABLE}");
            return 1;
        }
        Err(why) => {
            println!("vm_sriov: SKIPPED the SR-IOV VM tier: {why}; {ENABLE}");
            return 0;
        }
    };
    // The VM runs the binaries cargo built for this run from the host's root, which it mounts
    // read-only: link them into `common::bin_dir()` here, the guest finds them there.
    for b in ["sriov", "plexus"] {
        let _ = bin(b);
    }
    match run_vm(&parts) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("vm_sriov: FAILED: {e}");
            1
        }
    }
}

fn run_vm(parts: &Parts) -> Result<(), String> {
    let out = vm_dir().join(format!("run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    crate::bench_host::prepare(&out)?;
    crate::bench_host::prepare_peers(&out)?;
    let initrd = out.join("initramfs.cpio.gz");
    let st = Command::new(repo_root().join("scripts/vm-initramfs.sh"))
        .arg(&parts.kernel_tree)
        .arg(&initrd)
        .status()
        .map_err(|e| format!("scripts/vm-initramfs.sh: {e}"))?;
    if !st.success() {
        return Err("scripts/vm-initramfs.sh failed".into());
    }
    // The second node: its own VM (see below), its out share made now for the node files.
    let peer_wanted = std::env::var("PLEXUS_VM_PEER_VM").as_deref() != Ok("0");
    let peer_dir = out.join("peer");
    if peer_wanted {
        std::fs::create_dir_all(&peer_dir).map_err(|e| format!("{}: {e}", peer_dir.display()))?;
    }
    // The node cases' control plane (None: no PLEXUS_K8S_BIN); it outlives QEMU. With the
    // second VM, that VM is a node too.
    let node = crate::node_host::prepare(&out, peer_wanted.then_some(peer_dir.as_path()))
        .map_err(|e| format!("node cases: {e:#}"))?;
    if node.is_none() {
        println!(
            "vm_sriov: node cases skipped: {}",
            plexus_e2e::realk8s::bins::skip_message()
        );
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let console = out.join("console.log");
    // The guest hides the host's /tmp, /run, /var/tmp… under its own tmpfs: the checkout and
    // the target directory stay visible wherever they are (a clone under /tmp, say).
    let keep = [repo_root(), plexus_e2e::realk8s::bins::target_dir()]
        .iter()
        .map(|p| {
            p.canonicalize()
                .unwrap_or_else(|_| p.clone())
                .display()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join(",");
    let mut append = format!(
        "console=ttyS0 panic=-1 intel_iommu=on no_timer_check loglevel=4 plexus.run={} plexus.out={} plexus.keep={keep} plexus.args=--in-vm",
        exe.display(),
        out.display()
    );
    if let Ok(f) = std::env::var("PLEXUS_VM_CASES") {
        append += &format!(" plexus.cases={}", f.replace(' ', ""));
    }
    // The second node: its own VM, its PF's wire on a port of this VM's hub (UDP on 127.0.0.1).
    let (mut extra, mut peer) = (
        node.as_ref()
            .map(|n| n.qemu_args.clone())
            .unwrap_or_default(),
        None,
    );
    if peer_wanted {
        let (here, there) = (free_udp_port()?, free_udp_port()?);
        extra.extend([
            "-netdev".to_string(),
            format!("dgram,id=peer,local.type=inet,local.host=127.0.0.1,local.port={here},remote.type=inet,remote.host=127.0.0.1,remote.port={there}"),
            "-netdev".to_string(),
            "hubport,id=w2,hubid=0,netdev=peer".to_string(),
        ]);
        let dir = peer_dir.clone();
        let peer_node = node.as_ref().and_then(|n| n.second_qemu_args.clone());
        if peer_node.is_some() {
            append += " plexus.peernode=1";
        }
        let peer_append = format!(
            "console=ttyS0 panic=-1 no_timer_check loglevel=4 plexus.run={} plexus.out={} plexus.keep={keep} plexus.args=--peer-vm",
            exe.display(),
            dir.display()
        );
        let accel = std::env::var("PLEXUS_VM_ACCEL").unwrap_or_else(|_| "tcg".into());
        peer = Some(boot_peer(
            parts,
            &initrd,
            &peer_append,
            &accel,
            &dir,
            (there, here),
            peer_node.as_deref(),
        )?);
        append += &format!(" plexus.peer={}", crate::peer::PEER_ADDR);
    }
    let timeout = std::env::var("PLEXUS_VM_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        // The node cases (a kubelet and its pods under TCG) need several minutes more.
        // Measured in CI beside the host tiers (2 cores): 1,398 s with both nodes' cases.
        .unwrap_or(if node.is_some() { 2400 } else { 600 });
    // TCG by default: KVM boots hang on the machines this was built on (measured again with the
    // node cases: no console output within 40 s, default CPU model and `-cpu host` alike), and
    // TCG is the same everywhere.
    let accel = std::env::var("PLEXUS_VM_ACCEL").unwrap_or_else(|_| "tcg".into());
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout);
    let boot = Boot {
        qemu: &parts.qemu,
        vmlinuz: &parts.vmlinuz,
        initrd: &initrd,
        append: &append,
        accel: &accel,
        out: &out,
        console: &console,
        extra: &extra,
        node: node.is_some(),
    };
    println!(
        "vm_sriov: booting QEMU ({accel}, igb PF) with {}; waiting up to {timeout} s",
        parts.vmlinuz.display()
    );
    let mut status = boot.run(deadline)?;
    let log = std::fs::read_to_string(&console).unwrap_or_default();
    if status.is_some() && !log.contains("vm-init: running") {
        // The kernel died before the runner started (seen once under heavy host load: "timer
        // doesn't work through Interrupt-remapped IO-APIC"): one more boot, same deadline.
        let first = out.join("console-first-boot.log");
        let _ = std::fs::rename(&console, &first);
        println!(
            "vm_sriov: the VM stopped before the runner started (console in {}); booting again",
            first.display()
        );
        status = boot.run(deadline)?;
    }
    let elapsed = started.elapsed();
    // The second node has served its purpose: stop it, say how it went.
    let peer_note = peer.take().map(|vm| {
        drop(vm);
        let dir = out.join("peer");
        let said = std::fs::read_to_string(dir.join("peer.json")).unwrap_or_default();
        let console = std::fs::read_to_string(dir.join("console.log")).unwrap_or_default();
        (said, console)
    });
    if let Some((said, _)) = &peer_note {
        println!("vm_sriov: second node said: {}", said.trim());
    }
    let report = read_results(&out);
    print!("{}", report.text);
    println!(
        "vm_sriov: VM run took {:.1} s (boot included)",
        elapsed.as_secs_f64()
    );
    let problem = match status {
        None => Some(format!("the VM did not finish within {timeout} s")),
        Some(_) if !report.done => Some("the VM stopped before the runner finished".into()),
        Some(_) if report.failed > 0 => Some(format!("{} case(s) failed", report.failed)),
        Some(_) => None,
    };
    match problem {
        None => {
            if std::env::var_os("PLEXUS_VM_KEEP").is_none() {
                let _ = std::fs::remove_dir_all(&out);
            } else {
                println!("vm_sriov: results and logs kept in {}", out.display());
            }
            Ok(())
        }
        Some(p) => {
            let log = std::fs::read_to_string(&console).unwrap_or_default();
            eprintln!(
                "----- VM console ({}) -----\n{log}\n----- end of VM console -----",
                console.display()
            );
            if let Some((_, peer_console)) = &peer_note {
                let tail: Vec<&str> = peer_console.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                eprintln!(
                    "----- second node's console (last 40 lines) -----\n{}\n-----",
                    tail.join("\n")
                );
            }
            Err(format!("{p}; results and logs kept in {}", out.display()))
        }
    }
}

/// A free UDP port on 127.0.0.1 (bound, then released for QEMU).
fn free_udp_port() -> Result<u16, String> {
    crate::node_host::free_udp_port().map_err(|e| format!("no free UDP port: {e}"))
}

/// QEMU under a parent-death signal (it dies with this process even when that is killed).
fn qemu_command(qemu: &Path) -> Command {
    match which("setpriv") {
        Some(sp) => {
            let mut c = Command::new(sp);
            c.args(["--pdeathsig", "KILL", "--"]).arg(qemu);
            c
        }
        None => Command::new(qemu),
    }
}

/// Starts the second node (see `peer`): a small VM, one CPU, no IOMMU, its igb PF's wire a UDP
/// datagram link between `ports` (its own, the first VM's) on 127.0.0.1, its console in `dir`.
/// With `node` (its NICs to the apiserver and to the first VM) it is sized for a kubelet.
/// Killed on drop.
fn boot_peer(
    parts: &Parts,
    initrd: &Path,
    append: &str,
    accel: &str,
    dir: &Path,
    (port, peer_port): (u16, u16),
    node: Option<&[String]>,
) -> Result<Vm, String> {
    let mem = if node.is_some() { "3072" } else { "768" };
    let child = qemu_command(&parts.qemu)
        .args(["-accel", accel, "-machine", "q35", "-m", mem, "-smp", "1"])
        .args(node.unwrap_or_default())
        .args(["-nodefaults", "-display", "none", "-monitor", "none", "-no-reboot"])
        // The same VF BAR workaround as the first VM (see `Boot::run`).
        .args(["-global", "q35-pcihost.pci-hole64-size=0"])
        .args(["-cpu", "qemu64,phys-bits=35"])
        .arg("-kernel")
        .arg(&parts.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", append])
        .arg("-netdev")
        .arg(format!("dgram,id=wire,local.type=inet,local.host=127.0.0.1,local.port={port},remote.type=inet,remote.host=127.0.0.1,remote.port={peer_port}"))
        // Its own MAC: both QEMUs would give their first NIC the same default one.
        .args(["-device", "igb,netdev=wire,mac=52:54:00:27:0b:01"])
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ])
        .arg("-virtfs")
        .arg(format!("local,path={},mount_tag=out,security_model=none", dir.display()))
        .arg("-serial")
        .arg(format!("file:{}", dir.join("console.log").display()))
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", parts.qemu.display()))?;
    Ok(Vm(child))
}

/// One QEMU invocation.
struct Boot<'a> {
    qemu: &'a Path,
    vmlinuz: &'a Path,
    initrd: &'a Path,
    append: &'a str,
    accel: &'a str,
    out: &'a Path,
    console: &'a Path,
    extra: &'a [String],
    /// The node cases run (more memory).
    node: bool,
}

impl Boot<'_> {
    /// Boots and waits until QEMU exits (its status) or `deadline` passes (None; QEMU is killed).
    fn run(&self, deadline: Instant) -> Result<Option<std::process::ExitStatus>, String> {
        // QEMU dies with this process even when it is killed (no Drop then): util-linux's
        // setpriv sets the parent-death signal.
        let mut cmd = qemu_command(self.qemu);
        // A node (kubelet, containerd, flanneld, sriovdp) needs more memory than the cases alone.
        let mem = if self.node { "3072" } else { "1536" };
        let child = cmd
            .args([
                "-accel", self.accel, "-machine", "q35", "-m", mem, "-smp", "2",
            ])
            .args([
                "-nodefaults",
                "-display",
                "none",
                "-monitor",
                "none",
                "-no-reboot",
            ])
            .args(["-device", "intel-iommu"])
            // QEMU 10.0.0-10.0.5 (Debian's bookworm-backports 10.0.2 included) registers the
            // igbvf BARs as 32-bit and maps a VF's registers at the low 32 bits of its 64-bit
            // BAR (fixed upstream by 2e54e5fda779, 10.0.6): a VF BAR above 4 GiB then misses
            // and the VF never gets carrier. No 64-bit PCI hole and 35 physical address bits
            // keep the guest's VF BARs below 4 GiB (docs/sriov.md); harmless on a fixed QEMU.
            .args(["-global", "q35-pcihost.pci-hole64-size=0"])
            .args(["-cpu", "qemu64,phys-bits=35"])
            .arg("-kernel")
            .arg(self.vmlinuz)
            .arg("-initrd")
            .arg(self.initrd)
            .args(["-append", self.append])
            // The PF's wire goes to a second igb PF, the far end where the cases count what
            // the VFs put on the wire: both ports of one QEMU hub, nothing leaves QEMU.
            .args([
                "-netdev",
                "hubport,id=w0,hubid=0",
                "-device",
                "igb,netdev=w0",
                "-netdev",
                "hubport,id=w1,hubid=0",
                "-device",
                // Away from the first PF's VF slots (0x11, 0x12: QEMU creates all eight VFs
                // with the PF); its own VFs land at 0x18, 0x19.
                "igb,netdev=w1,addr=0x08",
            ])
            .args([
                "-virtfs",
                "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            ])
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=out,security_model=none",
                self.out.display()
            ))
            .args(self.extra)
            // A debugging knob: more QEMU arguments (e.g. `-trace enable=igb_* -D <file>`).
            .args(
                std::env::var("PLEXUS_VM_QEMU_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .arg("-serial")
            .arg(format!("file:{}", self.console.display()))
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", self.qemu.display()))?;
        let mut vm = Vm(child);
        loop {
            if let Some(s) = vm.0.try_wait().map_err(|e| e.to_string())? {
                return Ok(Some(s));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

struct Report {
    text: String,
    done: bool,
    failed: usize,
}

/// Reads `results.jsonl`: one object per case (`case`, `ok`, `secs`, `detail`), `note` lines
/// (measurements) and a final `done` line.
fn read_results(out: &Path) -> Report {
    let raw = std::fs::read_to_string(out.join("results.jsonl")).unwrap_or_default();
    let mut r = Report {
        text: String::new(),
        done: false,
        failed: 0,
    };
    for line in raw.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["done"] == true {
            r.done = true;
        } else if let Some(n) = v["note"].as_str() {
            r.text += &format!("vm_sriov: {n}\n");
        } else if let Some(c) = v["case"].as_str() {
            let ok = v["ok"] == true;
            if !ok {
                r.failed += 1;
            }
            r.text += &format!(
                "vm_sriov: case {c} ... {} ({:.1} s){}\n",
                if ok { "ok" } else { "FAILED" },
                v["secs"].as_f64().unwrap_or(0.0),
                match v["detail"].as_str() {
                    Some(d) if !ok => format!("\n    {}", d.replace('\n', "\n    ")),
                    _ => String::new(),
                }
            );
        }
    }
    r
}
