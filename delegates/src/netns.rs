//! Network namespace entry. Every namespace switch happens on a dedicated, short-lived thread
//! (setns changes only the calling thread), never on a thread the caller keeps using.

use nix::sched::{setns, CloneFlags};
use std::fs::File;
use std::path::{Path, PathBuf};

const NSFS_MAGIC: i64 = 0x6e73_6673;
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Errors opening or entering a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetNsError {
    /// The path does not exist (the namespace is gone).
    #[error("network namespace {0} does not exist")]
    NotFound(PathBuf),
    /// The path is not a namespace file.
    #[error("{0} is not a network namespace")]
    NotANamespace(PathBuf),
    /// Opening or entering failed.
    #[error("network namespace {path}: {source}")]
    Io {
        /// The namespace path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl NetNsError {
    /// True when the namespace is gone.
    pub fn is_not_found(&self) -> bool {
        matches!(self, NetNsError::NotFound(_))
    }
}

/// An open network namespace.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

impl NetNs {
    /// Open a namespace by path (`/run/netns/x`, `/proc/<pid>/ns/net`), checking it really is one.
    pub fn open(path: impl AsRef<Path>) -> Result<NetNs, NetNsError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                NetNsError::NotFound(path.clone())
            } else {
                NetNsError::Io {
                    path: path.clone(),
                    source: e,
                }
            }
        })?;
        let st = nix::sys::statfs::fstatfs(&file).map_err(|e| NetNsError::Io {
            path: path.clone(),
            source: e.into(),
        })?;
        let magic = st.filesystem_type().0 as i64;
        if magic != NSFS_MAGIC && magic != PROC_SUPER_MAGIC {
            return Err(NetNsError::NotANamespace(path));
        }
        Ok(NetNs { file, path })
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<NetNs, NetNsError> {
        NetNs::open("/proc/thread-self/ns/net")
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` inside the namespace on a dedicated thread, and return its value.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, NetNsError> {
        let _phase = crate::timing::phase("netns");
        std::thread::scope(|s| {
            s.spawn(|| {
                setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|e| NetNsError::Io {
                    path: self.path.clone(),
                    source: e.into(),
                })?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl std::os::fd::AsFd for NetNs {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Whether a link named `ifname` exists in the calling thread's namespace.
pub fn link_exists(ifname: &str) -> bool {
    nix::net::if_::if_nametoindex(ifname).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_wrong_paths() {
        assert!(NetNs::open("/run/netns/definitely-not-here-plexus")
            .unwrap_err()
            .is_not_found());
        assert!(matches!(
            NetNs::open("/etc/hostname"),
            Err(NetNsError::NotANamespace(_))
        ));
    }

    #[test]
    fn run_in_current_namespace_sees_lo() {
        let ns = NetNs::current().unwrap();
        assert!(ns.run(|| link_exists("lo")).unwrap());
        assert!(!ns.run(|| link_exists("plexus-nope0")).unwrap());
    }
}
