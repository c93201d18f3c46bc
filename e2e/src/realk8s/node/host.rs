//! What a node changes on the host and takes back: its cgroup root (every hierarchy), the
//! containerd shims it started, the mounts under its directory, its log links in
//! /var/log/containers; and the host facts it reads (eth0's address, the `cni-*` netns,
//! the mount table).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::Node;

impl Node<'_> {
    /// containerd-shim-runc-v2 processes started for this containerd (they leave its process
    /// group): killed by pid.
    pub(super) fn kill_shims(&self) {
        let addr = self
            .path("containerd/containerd.sock")
            .display()
            .to_string();
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return;
        };
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
            let is_shim = args
                .first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
            if is_shim && args.contains(&addr.as_bytes()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    pub(super) fn make_cgroup_root(&self) -> Result<()> {
        for m in cgroup_mounts() {
            let d = m.join(self.cgroup_root.trim_start_matches('/'));
            std::fs::create_dir_all(&d).with_context(|| format!("mkdir {}", d.display()))?;
            // A new cpuset cgroup starts with no CPUs and no memory nodes: copy the parent's.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(v) = std::fs::read_to_string(m.join(f)) {
                    let _ = std::fs::write(d.join(f), v.trim());
                }
            }
        }
        Ok(())
    }

    pub(super) fn remove_cgroup_root(&self) {
        for m in cgroup_mounts() {
            let d = m.join(self.cgroup_root.trim_start_matches('/'));
            if d.exists() {
                remove_cgroup_tree(&d);
            }
        }
    }
}

/// The cgroup v1 hierarchies (or the v2 root) the kubelet will use.
pub(super) fn cgroup_mounts() -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink() && p.join("cgroup.procs").exists())
        .collect();
    if Path::new("/sys/fs/cgroup/cgroup.procs").exists() {
        v.push(PathBuf::from("/sys/fs/cgroup"));
    }
    v
}

/// Remove the symlinks in `dir` that point under `target` (the kubelet links every container's
/// log into the fixed /var/log/containers).
pub(super) fn remove_links_into(dir: &str, target: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(target)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// rmdir a cgroup tree bottom-up (cgroup dirs hold only virtual files).
pub(super) fn remove_cgroup_tree(d: &Path) {
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(d) {
        eprintln!("realk8s node: rmdir {}: {e}", d.display());
    }
}

/// eth0's first IPv4 address (read only; the kubelet refuses a loopback node IP).
pub fn eth0_ipv4() -> Result<String> {
    let out = Command::new("ip")
        .args(["-j", "-4", "addr", "show", "dev", "eth0"])
        .output()
        .context("run ip")?;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v[0]["addr_info"][0]["local"]
        .as_str()
        .map(str::to_string)
        .context("eth0 has no IPv4 address (the kubelet needs a non-loopback node IP)")
}

/// Names of the `cni-*` network namespaces in /run/netns.
pub fn cni_netns() -> BTreeSet<String> {
    std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("cni-"))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn mount_points() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// Make /run/netns a (shared) mount point, as `ip netns add` does on first use.
pub(super) fn ensure_run_netns_mounted() -> Result<()> {
    if mount_points().iter().any(|m| m == "/run/netns") {
        return Ok(());
    }
    let name = format!("pxnode-probe{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &name])
        .status()?
        .success();
    let _ = Command::new("ip").args(["netns", "del", &name]).status();
    if !ok {
        bail!("ip netns add {name} failed");
    }
    Ok(())
}

/// Unmount (lazily, deepest first) every mount under `dir`. Each is made private first: the
/// node's directory is a shared mount, and a CRI-O node binds the host's `/run/netns` (a
/// shared peer) inside it, so an unmount there would propagate to the host's `/run/netns` and
/// take other tests' network namespaces with it.
pub(super) fn unmount_under(dir: &Path) {
    let prefix = dir.display().to_string();
    let mut ours: Vec<String> = mount_points()
        .into_iter()
        .filter(|m| m == &prefix || m.starts_with(&format!("{prefix}/")))
        .collect();
    ours.sort_by_key(|m| m.len());
    for m in &ours {
        let _ = nix::mount::mount(
            None::<&str>,
            m.as_str(),
            None::<&str>,
            nix::mount::MsFlags::MS_PRIVATE,
            None::<&str>,
        );
    }
    // Several passes: mounts can be stacked on one path.
    for _ in 0..5 {
        let mut mounts: Vec<String> = mount_points()
            .into_iter()
            .filter(|m| m == &prefix || m.starts_with(&format!("{prefix}/")))
            .collect();
        if mounts.is_empty() {
            return;
        }
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
    }
    eprintln!("realk8s node: mounts left under {prefix}");
}
