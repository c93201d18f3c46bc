//! Running delegates with the host's filesystem view from inside a container (daemon mode as
//! deployed): with a host root set (the DaemonSet mounts the host's `/` at `/hostroot`, as
//! Multus thick does), every delegate is exec'd chrooted into it, so a plugin finds whatever it
//! keeps on the host (calico's `/var/lib/calico`, `/var/log/calico`, flannel's `/run/flannel`,
//! whereabouts' files, vendor plugins' state) without a mount per path. Plugin lookup checks the
//! same view. Unset (the default, and always in the shim), nothing changes.
//!
//! Why chroot and not `setns(/proc/1/ns/mnt)`: opening another process' namespace needs
//! ptrace-read access to it, which fails whenever PID 1 holds a capability the container lacks
//! (measured on the test machine: `readlink /proc/1/ns/mnt` is EACCES even for root); a host
//! root mount needs only what the privileged daemon container already has (CAP_SYS_CHROOT).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

static HOST_ROOT: OnceLock<PathBuf> = OnceLock::new();

/// `PATH` of a delegate run in the host root: the container's own `PATH` names the image's
/// directories, not the host's (flannel's bridge found no `iptables` with the image's `/bin`).
pub const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Set the host root for the whole process (once; the daemon at startup). `/` or an empty path
/// mean no chroot. An error when it is not a directory or was already set to another path.
pub fn set(root: &Path) -> Result<(), String> {
    if root.as_os_str().is_empty() || root == Path::new("/") {
        return Ok(());
    }
    if !root.is_dir() {
        return Err(format!("host root {}: not a directory", root.display()));
    }
    let root = root.to_path_buf();
    let got = HOST_ROOT.get_or_init(|| root.clone());
    if *got != root {
        return Err(format!("host root already set to {}", got.display()));
    }
    Ok(())
}

/// The host root, when set.
pub fn get() -> Option<&'static Path> {
    HOST_ROOT.get().map(PathBuf::as_path)
}

/// Where host path `p` is seen from this process: `<root>/<p>` with a host root, else `p`.
pub fn host_path(p: &Path) -> PathBuf {
    match get() {
        Some(root) => root.join(p.strip_prefix("/").unwrap_or(p)),
        None => p.to_path_buf(),
    }
}

/// `std::fs::metadata` of host path `p` as the host sees it: under the host root, following
/// symlinks of the last component inside it (an absolute link target is a host path too).
pub fn metadata(p: &Path) -> std::io::Result<std::fs::Metadata> {
    let Some(root) = get() else {
        return std::fs::metadata(p);
    };
    let mut cur = p.to_path_buf();
    for _ in 0..40 {
        let seen = root.join(cur.strip_prefix("/").unwrap_or(&cur));
        let m = std::fs::symlink_metadata(&seen)?;
        if !m.file_type().is_symlink() {
            return Ok(m);
        }
        let target = std::fs::read_link(&seen)?;
        cur = match cur.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
    }
    Err(std::io::Error::from_raw_os_error(libc::ELOOP))
}

/// Make `cmd` chroot into the host root (and `chdir /`) between fork and exec, with `PATH`
/// [`HOST_PATH`]; a no-op without one. The program path and every path the plugin uses are then
/// the host's. (`pre_exec` is
/// the one `unsafe` here: nothing in std chroots a child.)
#[allow(unsafe_code)]
pub fn prepare(cmd: &mut Command) {
    let Some(root) = get() else {
        return;
    };
    let Ok(root) = CString::new(root.as_os_str().as_bytes()) else {
        return;
    };
    cmd.env("PATH", HOST_PATH);
    // SAFETY: between fork and exec only async-signal-safe calls (chroot, chdir) on memory
    // allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_path_without_a_root_is_the_path() {
        // The process-wide root is never set in unit tests (the tier proves the chroot).
        assert_eq!(
            host_path(Path::new("/opt/cni/bin")),
            Path::new("/opt/cni/bin")
        );
        assert!(metadata(Path::new("/")).is_ok_and(|m| m.is_dir()));
        assert!(set(Path::new("/")).is_ok() && get().is_none());
        assert!(set(Path::new("/nonexistent-plexus-root")).is_err());
        let mut cmd = Command::new("true");
        prepare(&mut cmd);
        assert!(cmd.status().unwrap().success());
    }
}
