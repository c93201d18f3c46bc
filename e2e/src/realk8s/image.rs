//! Container images built locally, as OCI image-layout tarballs with correct digests, for
//! `ctr -n k8s.io images import` (nothing can be pulled here): one layer of given files, plus
//! helpers to copy host binaries with the shared libraries they need.

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::json;

/// One regular file of an image.
#[derive(Clone, Debug)]
pub struct ImageFile {
    /// Absolute path in the image.
    pub path: String,
    /// Permission bits.
    pub mode: u32,
    /// Content.
    pub data: Vec<u8>,
}

impl ImageFile {
    /// A file with `mode`.
    pub fn new(path: &str, mode: u32, data: Vec<u8>) -> ImageFile {
        ImageFile {
            path: path.to_string(),
            mode,
            data,
        }
    }
}

/// `sha256:<hex>` of `data`.
pub fn digest(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The OCI image layout (as a tar) of image `name` (normalized, e.g. `docker.io/local/x:1`) with
/// one layer holding `files` (parent directories added), `entrypoint` and `env`.
pub fn oci_archive(
    name: &str,
    files: &[ImageFile],
    entrypoint: &[&str],
    env: &[&str],
) -> Result<Vec<u8>> {
    let layer = layer_tar(files);
    let layer_digest = digest(&layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": env},
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
                       "annotations": {"org.opencontainers.image.ref.name": name,
                                       "io.containerd.image.name": name}}],
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

/// `ImageFile::mode` type bits of a symbolic link (its `data` is the target).
pub const SYMLINK: u32 = 0o120000;

/// One layer: `files` and their parent directories.
pub fn layer_tar(files: &[ImageFile]) -> Vec<u8> {
    let mut layer = Tar::default();
    let mut dirs = BTreeSet::new();
    for f in files {
        let rel = f.path.trim_start_matches('/');
        let mut acc = String::new();
        let parts: Vec<&str> = rel.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            acc.push_str(part);
            acc.push('/');
            dirs.insert(acc.clone());
        }
    }
    for d in &dirs {
        layer.dir(d);
    }
    for f in files {
        let name = f.path.trim_start_matches('/');
        if f.mode & 0o170000 == SYMLINK {
            layer.symlink(name, &String::from_utf8_lossy(&f.data));
        } else {
            layer.file(name, f.mode, &f.data);
        }
    }
    layer.finish()
}

/// Host programs (found in PATH) as `/bin/<name>`, plus every shared library `ldd` lists for
/// them at its host path (symlinks resolved to their content).
pub fn host_programs(names: &[&str]) -> Result<Vec<ImageFile>> {
    let mut files = Vec::new();
    let mut libs = BTreeSet::new();
    for n in names {
        let out = Command::new("sh")
            .args(["-c", "command -v \"$1\"", "sh", n])
            .output()?;
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || !path.starts_with('/') {
            bail!("{n} not found on the host");
        }
        files.push(ImageFile::new(
            &format!("/bin/{n}"),
            0o755,
            std::fs::read(&path).with_context(|| format!("read {path}"))?,
        ));
        libs.extend(shared_libraries(&path)?);
    }
    for l in libs {
        files.push(ImageFile::new(
            &l,
            0o755,
            std::fs::read(&l).with_context(|| format!("read {l}"))?,
        ));
    }
    Ok(files)
}

/// The programs deploy/install.sh runs (for an installer image).
pub const INSTALLER_PROGRAMS: &[&str] = &[
    "sh",
    "jq",
    "cp",
    "mv",
    "cmp",
    "dd",
    "sha256sum",
    "cut",
    "base64",
    "tr",
    "mkdir",
    "rm",
    "grep",
    "sleep",
    "cat",
    "date",
    "chmod",
];

/// The `plexus:latest` image of deploy/Dockerfile, built from the host instead: the installer's
/// programs ([`INSTALLER_PROGRAMS`]) and their libraries, `/install.sh`, and each of `bins`
/// (name, built binary) stripped into `/usr/src/plexus/bin/` with the libraries it needs (the
/// daemon runs in the image). Written as an OCI tarball under `work`; returns its path.
pub fn plexus_image(
    work: &std::path::Path,
    install_sh: &std::path::Path,
    bins: &[(&str, std::path::PathBuf)],
) -> Result<std::path::PathBuf> {
    std::fs::create_dir_all(work)?;
    let mut files = host_programs(INSTALLER_PROGRAMS)?;
    let mut have: BTreeSet<String> = files.iter().map(|f| f.path.clone()).collect();
    files.push(ImageFile::new(
        "/install.sh",
        0o755,
        std::fs::read(install_sh)?,
    ));
    // As in debian:12-slim: CNI_NETNS paths are /var/run/netns/… .
    files.push(ImageFile::new(
        "/var/run",
        SYMLINK | 0o777,
        b"/run".to_vec(),
    ));
    for (name, built) in bins {
        let out = work.join(name);
        let ok = Command::new("strip")
            .arg("-o")
            .arg(&out)
            .arg(built)
            .status()?
            .success();
        if !ok {
            bail!("strip {}", built.display());
        }
        files.push(ImageFile::new(
            &format!("/usr/src/plexus/bin/{name}"),
            0o755,
            std::fs::read(&out)?,
        ));
        for l in shared_libraries(&built.display().to_string())? {
            if have.insert(l.clone()) {
                files.push(ImageFile::new(&l, 0o755, std::fs::read(&l)?));
            }
        }
    }
    let tar = work.join("plexus-image.tar");
    std::fs::write(
        &tar,
        oci_archive(
            "docker.io/library/plexus:latest",
            &files,
            &["/install.sh"],
            &["PATH=/bin"],
        )?,
    )?;
    Ok(tar)
}

/// Absolute paths of the shared libraries (and the loader) `ldd` lists for `binary`.
fn shared_libraries(binary: &str) -> Result<Vec<String>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("run ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let p = match l.split_once("=>") {
                Some((_, rhs)) => rhs.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            p.starts_with('/').then(|| p.to_string())
        })
        .collect())
}

/// A minimal ustar writer (regular files and directories, owner root, mtime 0).
#[derive(Default)]
pub(crate) struct Tar {
    out: Vec<u8>,
    /// The link name of the entry being written (symlinks).
    link_target: String,
}

impl Tar {
    pub(crate) fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.header(name, mode, data.len(), b'0');
        self.out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.out.resize(self.out.len() + pad, 0);
    }

    pub(crate) fn dir(&mut self, name: &str) {
        self.header(name, 0o755, 0, b'5');
    }

    pub(crate) fn symlink(&mut self, name: &str, target: &str) {
        assert!(target.len() < 100, "symlink target too long: {target}");
        self.link_target = target.to_string();
        self.header(name, 0o777, 0, b'2');
        self.link_target.clear();
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
        put(&mut h, 157, self.link_target.as_bytes());
        put(&mut h, 257, b"ustar\0");
        put(&mut h, 263, b"00");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
        self.out.extend_from_slice(&h);
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
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
        let files = [ImageFile::new("/usr/bin/x", 0o755, b"\x7fELF".to_vec())];
        let tar = oci_archive("docker.io/local/x:1", &files, &["/usr/bin/x"], &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("image.tar");
        std::fs::write(&file, &tar).unwrap();
        let out = Command::new("tar").arg("-tf").arg(&file).output().unwrap();
        assert!(out.status.success(), "tar -tf refused the archive");
        let names = String::from_utf8(out.stdout).unwrap();
        assert!(names.contains("index.json\n") && names.contains("oci-layout\n"));
        assert_eq!(names.matches("blobs/sha256/").count(), 4, "{names}");
    }

    #[test]
    fn layer_carries_parent_directories() {
        let files = [ImageFile::new("/usr/bin/x", 0o755, b"x".to_vec())];
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("layer.tar");
        std::fs::write(&file, layer_tar(&files)).unwrap();
        let out = Command::new("tar").arg("-tvf").arg(&file).output().unwrap();
        let list = String::from_utf8(out.stdout).unwrap();
        let names: Vec<&str> = list
            .lines()
            .filter_map(|l| l.split_whitespace().last())
            .collect();
        assert_eq!(names, ["usr/", "usr/bin/", "usr/bin/x"], "{list}");
        assert!(list.contains("-rwxr-xr-x"), "{list}");
    }

    #[test]
    fn host_programs_bring_their_libraries() {
        let files = host_programs(&["sh"]).unwrap();
        assert!(files.iter().any(|f| f.path == "/bin/sh"));
        assert!(
            files.iter().any(|f| f.path.contains("libc.so")),
            "{:?}",
            files.iter().map(|f| &f.path).collect::<Vec<_>>()
        );
    }
}
