//! Advisory file locks (`flock(2)`) that serialise plugin processes, with a deadline.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An exclusive lock held until dropped.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
    path: PathBuf,
}

impl FileLock {
    /// Take an exclusive lock on `path` (created 0600, parent 0700), waiting up to `timeout`.
    pub fn acquire(path: &Path, timeout: Duration) -> io::Result<FileLock> {
        let _phase = crate::timing::phase("lock");
        if let Some(dir) = path.parent() {
            crate::fsutil::ensure_private_dir(dir)?;
        }
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)?;
            match file.try_lock() {
                // The holder may have unlinked the file before releasing it (lock files are
                // removed after DEL): only a lock on the file the path still names counts.
                Ok(()) if same_file(&file, path) => {
                    return Ok(FileLock {
                        _file: file,
                        path: path.to_path_buf(),
                    })
                }
                Ok(()) | Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    drop(file);
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Ok(()) | Err(TryLockError::WouldBlock) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "timed out after {timeout:?} waiting for lock {}",
                            path.display()
                        ),
                    ))
                }
                Err(TryLockError::Error(e)) => return Err(e),
            }
        }
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_waits_then_times_out() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("locks/c1.lock");
        let held = FileLock::acquire(&p, Duration::from_secs(1)).unwrap();
        let e = FileLock::acquire(&p, Duration::from_millis(30)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        drop(held);
        assert!(FileLock::acquire(&p, Duration::from_millis(30)).is_ok());
    }

    #[test]
    fn a_lock_on_an_unlinked_file_does_not_count() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("c2.lock");
        let held = FileLock::acquire(&p, Duration::from_secs(1)).unwrap();
        // The holder removes the file while holding the lock; a newcomer gets a fresh file.
        std::fs::remove_file(&p).unwrap();
        let second = FileLock::acquire(&p, Duration::from_millis(50)).unwrap();
        // A third caller now contends with the second one, not with the unlinked inode.
        assert!(FileLock::acquire(&p, Duration::from_millis(30)).is_err());
        drop(second);
        drop(held);
    }
}
