//! The config's `logFile` (sriov-cni's key, so whoever writes a NAD chooses it) opened without
//! letting that author steer a root write: the file must sit directly in the node's sriov log
//! directory (`PLEXUS_SRIOV_LOG_DIR`, default [`DEFAULT_LOG_DIR`]), is opened relative to that
//! directory with `O_NOFOLLOW` (a planted symlink is refused, not followed), must be a regular
//! file owned by us with one link (no hard link to another file), and is forced to 0600 even when
//! it already existed. Nothing is ever rotated, renamed or created outside the directory.
//!
//! A refused path is not an error of the call (the key is valid sriov-cni config): the plugin
//! logs to stderr instead and says why there.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path};

/// Where a NAD's `logFile` may point when the node does not set `PLEXUS_SRIOV_LOG_DIR`.
pub const DEFAULT_LOG_DIR: &str = "/var/log/plexus-sriov";

/// Why `requested` cannot be used as a log file under `dir` (the text of the stderr warning).
pub type Refused = String;

/// The file name `requested` names directly inside `dir`, compared component by component
/// (so `dir/./x` is fine, `dir/../x`, `dir/sub/x` and relative paths are not).
fn name_in<'a>(dir: &Path, requested: &'a Path) -> Option<&'a std::ffi::OsStr> {
    if !requested.is_absolute() {
        return None;
    }
    let rest = requested.strip_prefix(dir).ok()?;
    let mut it = rest.components();
    match (it.next(), it.next()) {
        (Some(Component::Normal(n)), None) => Some(n),
        _ => None,
    }
}

/// Opens `requested` for appending, confined to `dir` as the module says.
pub fn open(dir: &Path, requested: &Path) -> Result<File, Refused> {
    let refuse = |why: String| {
        format!(
            "logFile {} refused: {why}; logging to stderr (a NAD's logFile must name a file \
             directly in {}, the node's PLEXUS_SRIOV_LOG_DIR)",
            requested.display(),
            dir.display()
        )
    };
    let Some(name) = name_in(dir, requested) else {
        return Err(refuse(
            "it is not a file directly in the sriov log directory".into(),
        ));
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| refuse(format!("cannot create {}: {e}", dir.display())))?;
    }
    let d = File::open(dir).map_err(|e| refuse(format!("cannot open {}: {e}", dir.display())))?;
    let dm = d.metadata().map_err(|e| refuse(e.to_string()))?;
    if !dm.is_dir() {
        return Err(refuse(format!("{} is not a directory", dir.display())));
    }
    if dm.mode() & 0o022 != 0 {
        // Others could plant links or files there between our checks.
        return Err(refuse(format!(
            "{} is writable by group or others (mode {:o})",
            dir.display(),
            dm.mode() & 0o7777
        )));
    }
    use nix::fcntl::OFlag;
    let flags = OFlag::O_WRONLY
        | OFlag::O_APPEND
        | OFlag::O_CREAT
        | OFlag::O_NOFOLLOW
        | OFlag::O_CLOEXEC
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY;
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
    let fd = nix::fcntl::openat(d.as_fd(), Path::new(name), flags, mode).map_err(|e| {
        refuse(if e == nix::errno::Errno::ELOOP {
            "it is a symbolic link".to_string()
        } else {
            format!("cannot open it: {e}")
        })
    })?;
    let file = File::from(fd);
    let m = file.metadata().map_err(|e| refuse(e.to_string()))?;
    if !m.is_file() {
        return Err(refuse("it is not a regular file".into()));
    }
    if m.nlink() != 1 {
        return Err(refuse(format!("it has {} hard links", m.nlink())));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if m.uid() != euid {
        return Err(refuse(format!(
            "it is owned by uid {}, not {euid}",
            m.uid()
        )));
    }
    if m.mode() & 0o7777 != 0o600 {
        nix::sys::stat::fchmod(
            file.as_fd(),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| refuse(format!("cannot make it 0600: {e}")))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn logdir() -> (tempfile::TempDir, std::path::PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("log");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        (t, d)
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_file_in_the_directory_is_created_0600_and_appended() {
        let (_t, d) = logdir();
        let p = d.join("sriov.log");
        open(&d, &p).unwrap().write_all(b"one\n").unwrap();
        open(&d, &d.join(".").join("sriov.log"))
            .unwrap()
            .write_all(b"two\n")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\ntwo\n");
        assert_eq!(mode(&p), 0o600);
        // An existing 0644 file becomes 0600.
        let q = d.join("old.log");
        std::fs::write(&q, b"x").unwrap();
        std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o644)).unwrap();
        open(&d, &q).unwrap();
        assert_eq!(mode(&q), 0o600);
    }

    #[test]
    fn the_directory_is_created_private_when_missing() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b");
        open(&d, &d.join("x.log")).unwrap();
        assert_eq!(mode(&d), 0o700);
    }

    #[test]
    fn paths_outside_links_and_foreign_files_are_refused_and_untouched() {
        let (t, d) = logdir();
        let outside = t.path().join("target");
        std::fs::write(&outside, b"keep").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        for p in [
            outside.clone(),
            d.join("../target"),
            d.join("sub/x.log"),
            "relative.log".into(),
            d.clone(),
            "/etc/anything".into(),
        ] {
            let e = open(&d, &p).unwrap_err();
            assert!(e.contains("not a file directly in"), "{}: {e}", p.display());
        }
        // A symlink planted in the directory is not followed.
        std::os::unix::fs::symlink(&outside, d.join("link.log")).unwrap();
        let e = open(&d, &d.join("link.log")).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        // Neither is a hard link to a file elsewhere.
        std::fs::hard_link(&outside, d.join("hard.log")).unwrap();
        let e = open(&d, &d.join("hard.log")).unwrap_err();
        assert!(e.contains("2 hard links"), "{e}");
        // Nor a FIFO (no blocking open, no write).
        nix::unistd::mkfifo(&d.join("fifo.log"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = open(&d, &d.join("fifo.log")).unwrap_err();
        assert!(
            e.contains("not a regular file") || e.contains("cannot open"),
            "{e}"
        );
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        assert_eq!(mode(&outside), 0o644);
        // A directory others may write to is refused as a whole.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = open(&d, &d.join("new.log")).unwrap_err();
        assert!(e.contains("writable by group or others"), "{e}");
        assert!(!d.join("new.log").exists());
    }
}
