//! A shared view of the host's root for the daemon DaemonSet's pod in the node tier
//! ([`SharedHostRoot`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::node::mount_points;

/// A view of the host's root for a pod's `hostPath: /` with `mountPropagation:
/// HostToContainer`, which containerd refuses unless the source is a shared or slave mount (on
/// this machine `/` is private; on a systemd node it is shared). At `path` (outside any directory
/// the tiers remove recursively): `/` bound WITHOUT its submounts (so no copy of another test's
/// container mounts can make its cleanup fail with EBUSY), plus `/proc`, `/sys`, `/dev` and
/// `/run/netns` (a peer of the host's: pod namespaces created later appear in it), all made
/// shared. Drop makes it private first (so the detach propagates nowhere), detaches it, and
/// removes the empty directory; the host's own mounts never change.
pub struct SharedHostRoot {
    path: PathBuf,
}

impl SharedHostRoot {
    /// Build it at `path` (created; must not exist).
    pub fn new(path: &Path) -> Result<SharedHostRoot> {
        use nix::mount::{mount, MsFlags};
        std::fs::create_dir(path).with_context(|| format!("mkdir {}", path.display()))?;
        let root = SharedHostRoot {
            path: path.to_path_buf(),
        };
        let none: Option<&str> = None;
        mount(Some("/"), path, none, MsFlags::MS_BIND, none)
            .with_context(|| format!("bind / on {}", path.display()))?;
        for d in ["proc", "sys", "dev", "run/netns"] {
            let src = Path::new("/").join(d);
            if src.is_dir() {
                mount(
                    Some(&src),
                    &path.join(d),
                    none,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    none,
                )
                .with_context(|| format!("rbind {} under {}", src.display(), path.display()))?;
            }
        }
        mount(none, path, none, MsFlags::MS_SHARED | MsFlags::MS_REC, none)
            .with_context(|| format!("make {} rshared", path.display()))?;
        Ok(root)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SharedHostRoot {
    fn drop(&mut self) {
        use nix::mount::{mount, umount2, MntFlags, MsFlags};
        let none: Option<&str> = None;
        if mount_points().iter().any(|m| Path::new(m) == self.path) {
            if let Err(e) = mount(
                none,
                &self.path,
                none,
                MsFlags::MS_PRIVATE | MsFlags::MS_REC,
                none,
            ) {
                // Never detach a tree that is still a peer of the host's mounts.
                eprintln!(
                    "realk8s: make {} private: {e}; left mounted",
                    self.path.display()
                );
                return;
            }
            let _ = umount2(&self.path, MntFlags::MNT_DETACH);
        }
        if let Err(e) = std::fs::remove_dir(&self.path) {
            eprintln!("realk8s: rmdir {}: {e}", self.path.display());
        }
    }
}
