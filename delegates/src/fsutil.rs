//! Private files: atomic writes with 0600 files in 0700 directories.

pub use plexus_conf::limits::MAX_STATE_FILE_BYTES;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Create `dir` and its missing parents with mode 0700; tighten an existing one to 0700.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let meta = fs::metadata(dir)?;
    if meta.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Write `bytes` to `path` atomically: a temporary file in the same directory (created with
/// `mode`, fsync'ed) renamed over the target. The parent directory is created 0700.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_renamed(path, bytes, mode, true)
}

/// Like [`write_atomic`] without the fsync: readers never see a partial file, but a crash may
/// lose the write. For state whose loss is tolerated (result caches, tombstones); an fsync
/// costs about a millisecond per file on the hot path.
pub fn write_atomic_nosync(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_renamed(path, bytes, mode, false)
}

fn write_renamed(path: &Path, bytes: &[u8], mode: u32, sync: bool) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))?;
    ensure_private_dir(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Read a file of at most `limit` bytes; a bigger one is an [`io::ErrorKind::InvalidData`] error
/// saying "file is too large: N bytes, the limit is L bytes" (checked before reading, and again
/// while reading in case it grows).
pub fn read_capped(path: &Path, limit: usize) -> io::Result<Vec<u8>> {
    let too_large = |n: u64| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("file is too large: {n} bytes, the limit is {limit} bytes"),
        )
    };
    let f = fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len > limit as u64 {
        return Err(too_large(len));
    }
    let mut buf = Vec::with_capacity(len as usize);
    f.take(limit as u64 + 1).read_to_end(&mut buf)?;
    if buf.len() > limit {
        return Err(too_large(buf.len() as u64));
    }
    Ok(buf)
}

/// Read a state file (at most [`MAX_STATE_FILE_BYTES`], see [`read_capped`]), mapping
/// "not found" to `None`.
pub fn read_optional(path: &Path) -> io::Result<Option<Vec<u8>>> {
    match read_capped(path, MAX_STATE_FILE_BYTES) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Remove a file; a file already gone is success.
pub fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_is_private_and_replaces() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("a/b/cache.json");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let dmode = fs::metadata(p.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dmode & 0o777, 0o700);
        assert_eq!(
            fs::read_dir(p.parent().unwrap()).unwrap().count(),
            1,
            "no temp left"
        );
        remove_if_exists(&p).unwrap();
        remove_if_exists(&p).unwrap();
        assert!(read_optional(&p).unwrap().is_none());
    }

    #[test]
    fn oversized_state_files_are_refused_with_their_size() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("big.json");
        let f = fs::File::create(&p).unwrap();
        f.set_len(MAX_STATE_FILE_BYTES as u64).unwrap();
        assert_eq!(
            read_optional(&p).unwrap().unwrap().len(),
            MAX_STATE_FILE_BYTES
        );
        f.set_len(MAX_STATE_FILE_BYTES as u64 + 1).unwrap();
        let e = read_optional(&p).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            e.to_string(),
            format!(
                "file is too large: {} bytes, the limit is {MAX_STATE_FILE_BYTES} bytes",
                MAX_STATE_FILE_BYTES + 1
            )
        );
        assert!(read_capped(&p, 10).is_err());
    }
}
