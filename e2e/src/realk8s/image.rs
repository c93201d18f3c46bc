//! Container images for the node tiers, as OCI image-layout tar archives for `ctr -n k8s.io
//! images import` and `skopeo copy oci-archive:…` (nothing can be pulled here):
//!
//! - [`plexus_image`]: the shipped installer image, built by `scripts/build-image.sh` (a Debian
//!   root from `mmdebstrap`, then plexus' files) from the binaries under test;
//! - [`oci_archive`]: a one-layer image of a few given files (the test pause image), laid out
//!   with GNU tar in the same reproducible way as the script.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
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

/// The binaries the installer image carries in `/usr/src/plexus/bin/` (deploy/Dockerfile's
/// COPY, scripts/build-image.sh's `BINARIES`).
pub const IMAGE_BINARIES: [&str; 4] = ["plexus", "plexus-daemon", "plexus-shim", "sriov"];

/// The installer image, built by `scripts/build-image.sh` from `install_sh` and the binaries
/// `bins` (name, built binary; debug builds, stripped on the way in). A binary of
/// [`IMAGE_BINARIES`] missing from `bins` is taken from beside the first one (the e2e binaries
/// sit together in `target/<profile>/e2e-bin/`). With `PLEXUS_RELEASE_DIR` set, the release
/// binaries there go in instead of `bins` (CI). The image is named as the DaemonSet manifests
/// reference it ([`image_ref`]). The Debian layer is cached under `target/image/cache` (keyed by
/// its package list, suite, mirror and `SOURCE_DATE_EPOCH`): only the first call of a run
/// bootstraps it. Written under `work`; returns the archive's path.
pub fn plexus_image(work: &Path, install_sh: &Path, bins: &[(&str, PathBuf)]) -> Result<PathBuf> {
    std::fs::create_dir_all(work)?;
    let out = work.join("plexus-image.tar");
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("scripts/build-image.sh"));
    match std::env::var_os("PLEXUS_RELEASE_DIR") {
        Some(dir) => {
            cmd.arg("--bin-dir").arg(dir);
        }
        None => {
            cmd.arg("--bin-dir")
                .arg(bin_dir(&work.join("bin"), bins)?)
                .arg("--strip");
        }
    }
    cmd.arg("--install-sh")
        .arg(install_sh)
        .arg("--out")
        .arg(&out)
        .arg("--sbom")
        .arg(work.join("plexus-image.sbom.txt"))
        .arg("--name")
        .arg(image_ref()?)
        .arg("--cache-dir")
        .arg(super::bins::target_dir().join("image/cache"));
    let t0 = std::time::Instant::now();
    let res = cmd.output().context("run scripts/build-image.sh")?;
    if !res.status.success() {
        bail!(
            "scripts/build-image.sh failed ({}): {}",
            res.status,
            String::from_utf8_lossy(&res.stderr).trim()
        );
    }
    tracing::info!(
        archive = %out.display(),
        seconds = t0.elapsed().as_secs_f64(),
        "built the plexus image with scripts/build-image.sh"
    );
    Ok(out)
}

/// A directory `dir` holding each of [`IMAGE_BINARIES`] under its name: from `bins`, else from
/// beside the first of `bins`.
fn bin_dir(dir: &Path, bins: &[(&str, PathBuf)]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let beside = bins
        .first()
        .and_then(|(_, p)| p.parent())
        .context("no binaries given")?
        .to_path_buf();
    for name in IMAGE_BINARIES {
        let src = bins
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| beside.join(name));
        let dst = dir.join(name);
        let _ = std::fs::remove_file(&dst);
        std::fs::copy(&src, &dst)
            .with_context(|| format!("copy {} to {}", src.display(), dst.display()))?;
    }
    for (name, _) in bins {
        if !IMAGE_BINARIES.contains(name) {
            bail!("{name} is not a binary of the plexus image ({IMAGE_BINARIES:?})");
        }
    }
    Ok(dir.to_path_buf())
}

/// The workspace root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The fully qualified reference of the plexus image as the manifests under `deploy/` name it:
/// `PLEXUS_IMAGE_REF` if set; else a kustomization's `images:` entry for `plexus`
/// (`newName`/`newTag`: deploy/settings, the one place the manifests set it); else
/// `plexus:<workspace version>`.
pub fn image_ref() -> Result<String> {
    if let Ok(r) = std::env::var("PLEXUS_IMAGE_REF") {
        return Ok(normalize_ref(&r));
    }
    let deploy = repo_root().join("deploy");
    let mut kustomizations = Vec::new();
    find_files(&deploy, "kustomization.yaml", &mut kustomizations);
    kustomizations.sort();
    for k in &kustomizations {
        let text = std::fs::read_to_string(k)?;
        if let Some(r) = kustomize_image(&text, "plexus") {
            return Ok(normalize_ref(&r));
        }
    }
    Ok(normalize_ref(&format!(
        "plexus:{}",
        env!("CARGO_PKG_VERSION")
    )))
}

/// Files named `name` under `dir`, recursively.
fn find_files(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            find_files(&p, name, out);
        } else if e.file_name() == name {
            out.push(p);
        }
    }
}

/// The reference a kustomization's `images:` list gives image `name` (`newName`, `newTag`,
/// `digest` applied), if it has an entry for it. Line-based: the list as kustomize writes it.
fn kustomize_image(text: &str, name: &str) -> Option<String> {
    // The entries of the `images:` list: (name, newName, newTag).
    let mut entries: Vec<(String, Option<String>, Option<String>)> = Vec::new();
    let mut in_images = false;
    for line in text.lines() {
        let t = line.trim();
        if !line.starts_with(' ') && !line.starts_with('-') && !t.is_empty() {
            in_images = t == "images:";
            continue;
        }
        if !in_images {
            continue;
        }
        let t = match t.strip_prefix("- ") {
            Some(rest) => {
                entries.push((String::new(), None, None));
                rest
            }
            None => t,
        };
        let (Some((k, v)), Some(e)) = (t.split_once(':'), entries.last_mut()) else {
            continue;
        };
        let v = v.trim().trim_matches('"').trim_matches('\'').to_string();
        match k.trim() {
            "name" => e.0 = v,
            "newName" => e.1 = Some(v),
            "newTag" => e.2 = Some(v),
            _ => {}
        }
    }
    entries.into_iter().find_map(|e| finish_entry(e, name))
}

/// The reference of one `images:` entry, if it is image `name`'s.
fn finish_entry(
    (n, new_name, new_tag): (String, Option<String>, Option<String>),
    name: &str,
) -> Option<String> {
    if n != name {
        return None;
    }
    let repo = new_name.unwrap_or(n);
    Some(match new_tag {
        Some(t) => format!("{repo}:{t}"),
        None => repo,
    })
}

/// The normalized form of an image reference, as the CRI stores it: `plexus:1` →
/// `docker.io/library/plexus:1`, `x/plexus` → `docker.io/x/plexus:latest`.
pub fn normalize_ref(reference: &str) -> String {
    let (first, rest) = match reference.split_once('/') {
        Some((f, r)) if f.contains('.') || f.contains(':') || f == "localhost" => {
            (f.to_string(), r.to_string())
        }
        Some(_) => ("docker.io".to_string(), reference.to_string()),
        None => ("docker.io".to_string(), format!("library/{reference}")),
    };
    let last = rest.rsplit('/').next().unwrap_or(&rest);
    let tagged = last.contains(':') || rest.contains('@');
    format!("{first}/{rest}{}", if tagged { "" } else { ":latest" })
}

/// The OCI image layout (as a tar) of image `name` (normalized, e.g. `docker.io/local/x:1`) with
/// one uncompressed layer holding `files` (parent directories added, owner root), `entrypoint`
/// and `env`. Tars made by GNU tar with the options of scripts/build-image.sh (sorted, mtime 0,
/// numeric owner 0, no atime/ctime): the same files give the same bytes.
pub fn oci_archive(
    name: &str,
    files: &[ImageFile],
    entrypoint: &[&str],
    env: &[&str],
) -> Result<Vec<u8>> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("root");
    std::fs::create_dir(&root)?;
    for f in files {
        let path = root.join(f.path.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().context("file path")?)?;
        std::fs::write(&path, &f.data)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode & 0o7777))?;
    }
    let layer = deterministic_tar(&root)?;
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
    let layout = tmp.path().join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    std::fs::write(layout.join("index.json"), &index)?;
    for blob in [&layer, &config, &manifest] {
        let hex = &digest(blob)["sha256:".len()..];
        std::fs::write(blobs.join(hex), blob)?;
    }
    deterministic_tar(&layout)
}

/// A tar of everything under `dir` (names relative, sorted), by GNU tar: mtime 0, owner and
/// group 0, readable by all (not writable but by the owner), no atime/ctime.
fn deterministic_tar(dir: &Path) -> Result<Vec<u8>> {
    let out = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args([
            "--format=posix",
            "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mode=go-w,a+rX",
            "-cf",
            "-",
        ])
        .args(top_level(dir)?)
        .output()
        .context("run tar")?;
    if !out.status.success() {
        bail!("tar: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out.stdout)
}

/// The entries directly under `dir`, sorted (tar's arguments: names without `./`).
fn top_level(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    names.sort();
    Ok(names)
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

    /// The blobs of an archive, by digest, after checking each one's name is its sha256.
    fn blobs_of(tar: &[u8]) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("image.tar");
        std::fs::write(&file, tar).unwrap();
        let st = Command::new("tar")
            .arg("-xf")
            .arg(&file)
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "tar -xf refused the archive");
        assert!(dir.path().join("oci-layout").exists());
        let mut names = Vec::new();
        for e in std::fs::read_dir(dir.path().join("blobs/sha256")).unwrap() {
            let e = e.unwrap();
            let data = std::fs::read(e.path()).unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            assert_eq!(digest(&data), format!("sha256:{name}"));
            names.push(name);
        }
        names
    }

    #[test]
    fn archive_holds_blobs_named_by_their_digests() {
        let files = [ImageFile::new("/usr/bin/x", 0o755, b"\x7fELF".to_vec())];
        let tar = oci_archive("docker.io/local/x:1", &files, &["/usr/bin/x"], &[]).unwrap();
        assert_eq!(blobs_of(&tar).len(), 3, "layer, config, manifest");
    }

    #[test]
    fn archive_is_reproducible_and_its_layer_carries_parent_directories() {
        let files = [ImageFile::new("/usr/bin/x", 0o755, b"x".to_vec())];
        let a = oci_archive("docker.io/local/x:1", &files, &[], &[]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let b = oci_archive("docker.io/local/x:1", &files, &[], &[]).unwrap();
        assert!(a == b, "two builds of the same files differ");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::write(root.join("usr/bin/x"), b"x").unwrap();
        let layer = deterministic_tar(&root).unwrap();
        let file = dir.path().join("layer.tar");
        std::fs::write(&file, layer).unwrap();
        let out = Command::new("tar").arg("-tvf").arg(&file).output().unwrap();
        let list = String::from_utf8(out.stdout).unwrap();
        let names: Vec<&str> = list
            .lines()
            .filter_map(|l| l.split_whitespace().last())
            .collect();
        assert_eq!(names, ["usr/", "usr/bin/", "usr/bin/x"], "{list}");
        assert!(list.contains("0/0"), "{list}");
    }

    #[test]
    fn references_are_normalized_as_the_cri_stores_them() {
        assert_eq!(normalize_ref("plexus:1"), "docker.io/library/plexus:1");
        assert_eq!(normalize_ref("plexus"), "docker.io/library/plexus:latest");
        assert_eq!(normalize_ref("x/plexus:2"), "docker.io/x/plexus:2");
        assert_eq!(
            normalize_ref("registry.example:5000/x/plexus"),
            "registry.example:5000/x/plexus:latest"
        );
    }

    #[test]
    fn kustomization_images_entry_gives_the_reference() {
        let k = "resources:\n- ../base\nimages:\n- name: pause\n  newTag: \"3\"\n- name: plexus\n  newName: registry.example/plexus\n  newTag: 0.2.0\nnamespace: x\n";
        assert_eq!(
            kustomize_image(k, "plexus").as_deref(),
            Some("registry.example/plexus:0.2.0")
        );
        assert_eq!(kustomize_image(k, "pause").as_deref(), Some("pause:3"));
        assert_eq!(kustomize_image("images:\n- name: other\n", "plexus"), None);
        // deploy/settings' style: the list indented, the tag quoted.
        let k = "kind: Component\nimages:\n  - name: plexus\n    newTag: \"0.1.0\"\n";
        assert_eq!(
            kustomize_image(k, "plexus").as_deref(),
            Some("plexus:0.1.0")
        );
    }
}
