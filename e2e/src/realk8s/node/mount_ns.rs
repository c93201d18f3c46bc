//! A private mount namespace for a node's containerd and kubelet, so that the fixed host paths
//! they write (the kubelet's `/var/lib/kubelet/device-plugins` and `/var/log/containers`,
//! containerd's shim sockets in `/run/containerd/s`, libcni's cache in `/var/lib/cni`) land in
//! the node's own directory, and a test machine keeps no trace of a run, whether or not those
//! host directories exist.
//!
//! How: before the process execs, it unshares its mount namespace (the host's `/` is private,
//! so nothing it mounts there reaches the host). A host path that does not exist is covered by
//! a tmpfs on its deepest existing ancestor, in which the path is then created; the node's own
//! directory is bind-mounted onto it. The node's directory itself is made a shared mount point
//! on the host first ([`share_node_dir`]), so the pod volumes the kubelet mounts there reach
//! containerd, and containerd's rootfs mounts reach the host; `/run/netns` is already shared
//! (`ip netns` makes it so), so the pods' netns mounts reach the host too.
//!
//! Not redirected: containerd's shim sockets in `/run/containerd/s` (removed when a shim exits;
//! covering `/run` would hide the daemon socket and flannel's files from the CNI plugins).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::mount::{mount, MsFlags};

use super::host::mount_points;

/// What one process's namespace looks like: `redirects` (host path → node directory).
#[derive(Clone, Debug, Default)]
pub struct NodeMounts {
    redirects: Vec<(PathBuf, PathBuf)>,
}

impl NodeMounts {
    /// Redirect host path `target` to `source` (created when missing).
    pub fn redirect(mut self, target: &str, source: PathBuf) -> Self {
        self.redirects.push((PathBuf::from(target), source));
        self
    }

    /// Create the sources on the host and return the steps the child runs before exec.
    pub fn prepare(&self) -> Result<MountSteps> {
        for (_, src) in &self.redirects {
            std::fs::create_dir_all(src).with_context(|| format!("mkdir {}", src.display()))?;
        }
        let covers = covers(self.redirects.iter().map(|(t, _)| t.as_path()));
        let mut steps = Vec::new();
        for c in &covers {
            steps.push(Step::Tmpfs(cstr(c)?));
        }
        for (t, src) in &self.redirects {
            for d in dirs_to_make(t, &covers) {
                steps.push(Step::Mkdir(cstr(&d)?));
            }
            steps.push(Step::Bind(cstr(src)?, cstr(t)?));
        }
        Ok(MountSteps(steps))
    }
}

/// The syscalls a child makes after `unshare(CLONE_NEWNS)`; built in the parent (no allocation
/// after fork).
#[derive(Debug)]
pub struct MountSteps(Vec<Step>);

#[derive(Debug)]
enum Step {
    Tmpfs(CString),
    Mkdir(CString),
    Bind(CString, CString),
}

impl MountSteps {
    /// Run these steps in `cmd`'s child before it execs.
    // `pre_exec` is unsafe by signature; `apply` makes raw syscalls only (no allocation, no
    // locks), which is what a child of a multi-threaded parent may do.
    #[allow(unsafe_code)]
    pub fn install(self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        unsafe { cmd.pre_exec(move || self.apply()) };
    }

    /// Run in the child between fork and exec: async-signal-safe syscalls only.
    fn apply(&self) -> std::io::Result<()> {
        let err = |e: nix::Error| std::io::Error::from_raw_os_error(e as i32);
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(err)?;
        for s in &self.0 {
            match s {
                Step::Tmpfs(at) => mount(
                    Some(c"tmpfs"),
                    at.as_c_str(),
                    Some(c"tmpfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some(c"mode=755"),
                )
                .map_err(err)?,
                Step::Mkdir(d) => match nix::unistd::mkdir(
                    d.as_c_str(),
                    nix::sys::stat::Mode::from_bits_truncate(0o755),
                ) {
                    Ok(()) | Err(nix::Error::EEXIST) => {}
                    Err(e) => return Err(err(e)),
                },
                Step::Bind(from, to) => mount(
                    Some(from.as_c_str()),
                    to.as_c_str(),
                    None::<&std::ffi::CStr>,
                    MsFlags::MS_BIND,
                    None::<&std::ffi::CStr>,
                )
                .map_err(err)?,
            }
        }
        Ok(())
    }
}

/// For each target, its deepest existing ancestor (itself when it exists, then nothing is
/// covered for it); the shallowest of those that nest, each once.
fn covers<'a>(targets: impl Iterator<Item = &'a Path>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = targets
        .filter(|t| !t.exists())
        .filter_map(|t| t.ancestors().find(|a| a.exists()).map(Path::to_path_buf))
        .collect();
    v.sort();
    v.dedup();
    let all = v.clone();
    v.retain(|c| !all.iter().any(|o| o != c && c.starts_with(o)));
    v
}

/// The directories to create, top-down, for `target` once `covers` are tmpfs: those below the
/// cover it lies under (none when it lies under no cover: it exists on the host).
fn dirs_to_make(target: &Path, covers: &[PathBuf]) -> Vec<PathBuf> {
    let Some(cover) = covers.iter().find(|c| target.starts_with(c)) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = target
        .ancestors()
        .take_while(|a| *a != cover.as_path())
        .map(Path::to_path_buf)
        .collect();
    v.reverse();
    v
}

/// Make the node's directory `p` a shared mount point on the host (a bind onto itself first
/// when it is not a mount point yet), as `ip netns add` does for /run/netns.
pub fn share_node_dir(p: &Path) -> Result<()> {
    let s = p.display().to_string();
    if !mount_points().contains(&s) {
        mount(
            Some(p),
            p,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .with_context(|| format!("bind {s} onto itself"))?;
    }
    mount(
        None::<&str>,
        p,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .with_context(|| format!("make {s} shared"))
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).context("path with a NUL byte")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_take_the_deepest_existing_ancestor_once_and_skip_existing_targets() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path();
        std::fs::create_dir_all(base.join("var/lib/present")).unwrap();
        std::fs::create_dir_all(base.join("var/log")).unwrap();
        let t = [
            base.join("var/lib/kubelet/device-plugins"),
            base.join("var/lib/cni"),
            base.join("var/lib/present"),
            base.join("var/log/containers"),
        ];
        let c = covers(t.iter().map(PathBuf::as_path));
        assert_eq!(c, vec![base.join("var/lib"), base.join("var/log")]);
        assert_eq!(
            dirs_to_make(&t[0], &c),
            vec![base.join("var/lib/kubelet"), t[0].clone()]
        );
        // An existing target under a cover is made again inside the tmpfs.
        assert_eq!(dirs_to_make(&t[2], &c), vec![t[2].clone()]);
        assert!(dirs_to_make(&base.join("elsewhere/x"), &c).is_empty());
    }

    #[test]
    fn nested_covers_keep_the_outer_one() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path();
        std::fs::create_dir_all(base.join("run/x")).unwrap();
        let t = [base.join("run/containerd"), base.join("run/x/y")];
        assert_eq!(
            covers(t.iter().map(PathBuf::as_path)),
            vec![base.join("run")]
        );
    }
}
