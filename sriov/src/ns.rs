//! Network namespace entry: run a closure on a dedicated thread inside a netns.
//!
//! (A local stand-in until `plexus_delegates::netns::NetNs` is available; it keeps setns off
//! the caller's thread the same way.)

use std::fs::File;
use std::path::Path;

use nix::sched::{setns, CloneFlags};

use crate::error::SriovError;

/// Opens a netns file (`/var/run/netns/x`, `/proc/<pid>/ns/net`).
pub fn open(path: &Path) -> Result<File, std::io::Error> {
    File::open(path)
}

/// The calling thread's current netns (`/proc/thread-self/ns/net`, not `/proc/self`, which is
/// the main thread's).
pub fn current() -> Result<File, SriovError> {
    let p = Path::new("/proc/thread-self/ns/net");
    File::open(p).map_err(|e| SriovError::io("open own netns", p, e))
}

/// Runs `f` on a new thread that first enters `ns`. The thread ends with `f`, so no thread is
/// ever left in the wrong namespace.
pub fn run_in<T: Send>(
    ns: &File,
    f: impl FnOnce() -> Result<T, SriovError> + Send,
) -> Result<T, SriovError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(ns, CloneFlags::CLONE_NEWNET)
                .map_err(|e| SriovError::Other(format!("setns: {e}")))?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(SriovError::Other("netns worker thread panicked".into())))
    })
}
