//! Finding the Kubernetes binaries: `PLEXUS_K8S_BIN` names a directory with `kube-apiserver`
//! and `kubelet`, plain or `.xz`-compressed. Compressed ones are unpacked once into a cache
//! under the workspace's target directory, keyed by the checksum of the `.xz` file.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Env var naming the directory with `kube-apiserver`, `kubelet` and `kubectl` (and optionally
/// `kube-scheduler`, `kube-controller-manager`).
pub const BIN_ENV: &str = "PLEXUS_K8S_BIN";
/// Env var that turns "binaries missing" from a skip into a failure (CI sets it to `1`).
pub const REQUIRE_ENV: &str = "PLEXUS_K8S_REQUIRE";

/// The message printed when the tier is skipped.
pub fn skip_message() -> String {
    format!("real-cluster tier SKIPPED: set {BIN_ENV}=<dir with kube-apiserver and kubelet>")
}

/// Whether `PLEXUS_K8S_REQUIRE` asks for a failure instead of a skip.
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The programs the harness runs from `PATH` besides the Kubernetes binaries.
/// `kubectl` is not among them: it comes from `PLEXUS_K8S_BIN` (same version as the server; a
/// fresh Debian has none, and one found on `PATH` may be anything).
pub const TOOLS: &[&str] = &["etcd", "setpriv", "xz", "sha256sum"];

/// Which of [`TOOLS`] are not on `PATH`.
pub fn missing_tools() -> Vec<&'static str> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    TOOLS
        .iter()
        .copied()
        .filter(|t| !std::env::split_paths(&path).any(|d| d.join(t).is_file()))
        .collect()
}

/// Paths of the usable (unpacked, executable) binaries.
#[derive(Clone, Debug)]
pub struct K8sBins {
    /// `kube-apiserver`
    pub apiserver: PathBuf,
    /// `kubelet`
    pub kubelet: PathBuf,
    /// `kubectl`, the server's version (`kubectl` or `kubectl.xz` in `PLEXUS_K8S_BIN`, e.g.
    /// `../shared/k8s/bin/kubectl.xz`; never one from `PATH`)
    pub kubectl: PathBuf,
    /// `kube-scheduler`, when the directory has one
    pub scheduler: Option<PathBuf>,
    /// `kube-controller-manager`, when the directory has one
    pub controller_manager: Option<PathBuf>,
}

impl K8sBins {
    /// `Ok(None)` when `PLEXUS_K8S_BIN` is unset or does not hold `kube-apiserver`, `kubelet`
    /// and `kubectl` (the caller skips); an error when they are there but cannot be unpacked.
    pub fn from_env() -> Result<Option<K8sBins>> {
        let Some(dir) = std::env::var_os(BIN_ENV).filter(|d| !d.is_empty()) else {
            return Ok(None);
        };
        let dir = PathBuf::from(dir);
        let (Some(apiserver), Some(kubelet), Some(kubectl)) = (
            find(&dir, "kube-apiserver"),
            find(&dir, "kubelet"),
            find(&dir, "kubectl"),
        ) else {
            return Ok(None);
        };
        Ok(Some(K8sBins {
            apiserver: usable(&apiserver)?,
            kubelet: usable(&kubelet)?,
            kubectl: usable(&kubectl)?,
            scheduler: find_usable(&dir, "kube-scheduler")?,
            controller_manager: find_usable(&dir, "kube-controller-manager")?,
        }))
    }
}

/// `dir/name` or `dir/name.xz`, ready to run (an `.xz` one unpacked once into the target
/// directory's cache); `Ok(None)` when neither exists. For any of `../shared`'s binary
/// directories (Kubernetes, overlays, SR-IOV agents, peers).
pub fn find_usable(dir: &Path, name: &str) -> Result<Option<PathBuf>> {
    find(dir, name).map(|p| usable(&p)).transpose()
}

/// `dir/name` or `dir/name.xz`, whichever exists (plain first).
fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    [dir.join(name), dir.join(format!("{name}.xz"))]
        .into_iter()
        .find(|p| p.is_file())
}

/// The target directory this test binary was built in: `<target>/<profile>/deps/<test>` (or a
/// binary in `<target>/<profile>/`), whatever put it there (`CARGO_TARGET_DIR`, a
/// `.cargo/config.toml`, the default `<workspace>/target`); else `CARGO_TARGET_DIR` or
/// `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?;
        let profile_dir = if dir.file_name()? == "deps" {
            dir.parent()?
        } else {
            dir
        };
        let target = profile_dir.parent()?;
        target
            .join("CACHEDIR.TAG")
            .exists()
            .then(|| target.to_path_buf())
    });
    from_exe
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("workspace root")
                .join("target")
        })
}

/// A plain binary as is; an `.xz` one unpacked into `target/k8s-bin/<sha256 prefix>/`.
fn usable(path: &Path) -> Result<PathBuf> {
    if path.extension().is_none_or(|e| e != "xz") {
        return Ok(path.to_path_buf());
    }
    let sum = sha256(path)?;
    let name = path.file_stem().context("binary name")?;
    let cache = target_dir().join("k8s-bin").join(&sum[..16]);
    let out = cache.join(name);
    if out.is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(&cache)?;
    // Unpack beside the final name, then rename: a concurrent run never sees half a binary.
    let tmp = cache.join(format!(
        ".{}.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let file = std::fs::File::create(&tmp)?;
    let ok = Command::new("xz")
        .arg("-dc")
        .arg(path)
        .stdout(file)
        .status()
        .context("run xz")?
        .success();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
        bail!("xz -dc {} failed", path.display());
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}

/// Hex SHA-256 of a file (`sha256sum`).
fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .context("run sha256sum")?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().next() {
        Some(sum) if out.status.success() && sum.len() == 64 => Ok(sum.to_string()),
        _ => bail!("sha256sum {}: {text}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_plain_before_xz_and_nothing_in_an_empty_dir() {
        let d = tempfile::tempdir().unwrap();
        assert!(find(d.path(), "kubelet").is_none());
        std::fs::write(d.path().join("kubelet.xz"), b"x").unwrap();
        assert_eq!(find(d.path(), "kubelet"), Some(d.path().join("kubelet.xz")));
        std::fs::write(d.path().join("kubelet"), b"x").unwrap();
        assert_eq!(find(d.path(), "kubelet"), Some(d.path().join("kubelet")));
        assert!(skip_message().contains(BIN_ENV));
    }

    #[test]
    fn a_plain_binary_is_used_in_place() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("kube-apiserver");
        std::fs::write(&p, b"x").unwrap();
        assert_eq!(usable(&p).unwrap(), p);
    }
}
