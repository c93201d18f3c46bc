//! A pause image built locally (nothing can be pulled here): a static C program that sleeps
//! until `SIGTERM`, in a one-layer OCI image tarball with correct digests, ready for
//! `ctr -n k8s.io images import`. The image is stored as [`PAUSE_IMAGE`] (the CRI looks images up
//! by their normalized name). It serves as the sandbox image and as the pods' container image.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::json;

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

/// `sha256:<hex>` of `data`.
pub fn digest(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The OCI image layout (as a tar) of an image whose only file is `/pause` = `program`.
pub fn oci_archive(program: &[u8]) -> Result<Vec<u8>> {
    let mut layer = Tar::default();
    layer.file("pause", 0o755, program);
    let layer = layer.finish();
    let layer_digest = digest(&layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": layer.len()}],
    }))?;
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": digest(&manifest), "size": manifest.len(),
                       "annotations": {"org.opencontainers.image.ref.name": PAUSE_IMAGE,
                                       "io.containerd.image.name": PAUSE_IMAGE}}],
    }))?;
    let mut tar = Tar::default();
    tar.file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#);
    tar.file("index.json", 0o644, &index);
    tar.dir("blobs/");
    tar.dir("blobs/sha256/");
    for blob in [&layer, &config, &manifest] {
        let hex = digest(blob)["sha256:".len()..].to_string();
        tar.file(&format!("blobs/sha256/{hex}"), 0o644, blob);
    }
    Ok(tar.finish())
}

/// A minimal ustar writer (regular files and directories, owner root, mtime 0).
#[derive(Default)]
struct Tar {
    out: Vec<u8>,
}

impl Tar {
    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.header(name, mode, data.len(), b'0');
        self.out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.out.resize(self.out.len() + pad, 0);
    }

    fn dir(&mut self, name: &str) {
        self.header(name, 0o755, 0, b'5');
    }

    fn header(&mut self, name: &str, mode: u32, size: usize, kind: u8) {
        assert!(name.len() < 100, "tar name too long: {name}");
        let mut h = [0u8; 512];
        let put = |h: &mut [u8; 512], at: usize, s: &[u8]| h[at..at + s.len()].copy_from_slice(s);
        put(&mut h, 0, name.as_bytes());
        put(&mut h, 100, format!("{mode:07o}\0").as_bytes());
        put(&mut h, 108, b"0000000\0");
        put(&mut h, 116, b"0000000\0");
        put(&mut h, 124, format!("{size:011o}\0").as_bytes());
        put(&mut h, 136, b"00000000000\0");
        put(&mut h, 148, b"        ");
        h[156] = kind;
        put(&mut h, 257, b"ustar\0");
        put(&mut h, 263, b"00");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
        self.out.extend_from_slice(&h);
    }

    fn finish(mut self) -> Vec<u8> {
        self.out.resize(self.out.len() + 1024, 0);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_of_empty_input_is_the_known_sha256() {
        assert_eq!(
            digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn archive_lists_the_blobs_its_index_names() {
        let tar = oci_archive(b"\x7fELF-not-really").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("image.tar");
        std::fs::write(&file, &tar).unwrap();
        let out = Command::new("tar").arg("-tf").arg(&file).output().unwrap();
        assert!(out.status.success(), "tar -tf refused the archive");
        let names = String::from_utf8(out.stdout).unwrap();
        assert!(names.contains("index.json\n") && names.contains("oci-layout\n"));
        assert_eq!(names.matches("blobs/sha256/").count(), 4, "{names}");
    }
}
