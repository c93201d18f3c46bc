//! A pause image built locally (nothing can be pulled here): a static C program that sleeps
//! until `SIGTERM`, in a one-layer OCI image tarball with correct digests, ready for
//! `ctr -n k8s.io images import`. The image is stored as [`PAUSE_IMAGE`] (the CRI looks images up
//! by their normalized name). It serves as the sandbox image and as the pods' container image.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::image::{self, ImageFile};

/// The image's normalized name (pods may call it `local/pause:1`).
pub const PAUSE_IMAGE: &str = "docker.io/local/pause:1";

/// The program: exits 0 on `SIGTERM`/`SIGINT` and sleeps otherwise. With any argument (e.g.
/// `ignore-sigterm`) it installs no handler: as PID 1 of its pid namespace it then ignores
/// `SIGTERM`, and only the runtime's `SIGKILL` after the grace period stops it.
const PAUSE_C: &str = r#"#include <signal.h>
#include <unistd.h>
static void done(int s) { (void)s; _exit(0); }
int main(int argc, char **argv) {
  (void)argv;
  if (argc < 2) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
  }
  for (;;) pause();
}
"#;

/// Compile the pause program with `gcc -static` in `work` and write the OCI image tarball to
/// `out`.
pub fn build_image(work: &Path, out: &Path) -> Result<()> {
    std::fs::create_dir_all(work)?;
    let src = work.join("pause.c");
    let bin = work.join("pause");
    std::fs::write(&src, PAUSE_C)?;
    let res = Command::new("gcc")
        .args(["-static", "-Os", "-s", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .context("run gcc (needed to build the pause image)")?;
    if !res.status.success() {
        bail!(
            "gcc -static pause.c failed: {}",
            String::from_utf8_lossy(&res.stderr)
        );
    }
    let program = std::fs::read(&bin)?;
    std::fs::write(out, oci_archive(&program)?)?;
    Ok(())
}

/// The OCI image layout (as a tar) of [`PAUSE_IMAGE`], whose only file is `/pause` = `program`.
pub fn oci_archive(program: &[u8]) -> Result<Vec<u8>> {
    let files = [ImageFile::new("/pause", 0o755, program.to_vec())];
    image::oci_archive(PAUSE_IMAGE, &files, &["/pause"], &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_holds_an_index_naming_the_pause_image() {
        let tar = oci_archive(b"\x7fELF-not-really").unwrap();
        let text = String::from_utf8_lossy(&tar);
        assert!(text.contains(PAUSE_IMAGE));
        assert!(
            text.contains("\"Entrypoint\":[\"/pause\"]"),
            "entrypoint in the config"
        );
    }
}
