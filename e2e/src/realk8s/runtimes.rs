//! Which container runtime a node runs, and where its binaries are.
//!
//! containerd **2.3.4** (the runtime of every real tier) and CRI-O 1.36.3 come from
//! `PLEXUS_RUNTIMES_BIN` (default `<PLEXUS_K8S_BIN>/../../runtimes/bin`, i.e.
//! `../shared/runtimes/bin`), `.xz`-compressed, unpacked once into the target directory.
//! containerd **1.6** is Debian's (`/usr/bin/containerd`), kept as the compatibility tier's
//! runtime while kubelet 1.36 supports it. CRI-O needs Debian's `runc`, `conmon` and `skopeo`
//! beside it ([`CrioBins`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::bins;

/// Env var naming the directory with `containerd(.xz)`, `containerd-shim-runc-v2(.xz)`,
/// `ctr(.xz)`, `crio(.xz)`, `pinns(.xz)`.
pub const RUNTIMES_ENV: &str = "PLEXUS_RUNTIMES_BIN";

/// A containerd release line the node tiers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Containerd {
    /// containerd 2.3 from `../shared/runtimes` (config version 3; calls CNI STATUS).
    V2,
    /// Debian 12's containerd 1.6 (config version 2): the compatibility tier.
    V1_6,
}

impl Containerd {
    /// A short label for logs and test names.
    pub fn label(self) -> &'static str {
        match self {
            Containerd::V2 => "containerd 2.3",
            Containerd::V1_6 => "containerd 1.6",
        }
    }
}

/// The programs of one containerd installation. `dir` holds `containerd`,
/// `containerd-shim-runc-v2` and `ctr` side by side: it goes first on containerd's `PATH`, so
/// containerd starts its own shim (2.x cannot drive Debian's 1.6 shim, nor the other way).
#[derive(Clone, Debug)]
pub struct ContainerdBins {
    /// Which release line.
    pub line: Containerd,
    /// The directory of the three programs.
    pub dir: PathBuf,
}

impl ContainerdBins {
    /// Resolve `line`'s binaries; an error naming what is missing.
    pub fn find(line: Containerd) -> Result<ContainerdBins> {
        match line {
            Containerd::V1_6 => {
                for p in ["containerd", "containerd-shim-runc-v2", "ctr"] {
                    if !Path::new("/usr/bin").join(p).is_file() {
                        bail!("containerd 1.6: /usr/bin/{p} missing (apt-get install containerd)");
                    }
                }
                Ok(ContainerdBins {
                    line,
                    dir: PathBuf::from("/usr/bin"),
                })
            }
            Containerd::V2 => {
                let src = runtimes_dir();
                let dir = bins::target_dir().join("runtimes/containerd");
                std::fs::create_dir_all(&dir)?;
                for p in ["containerd", "containerd-shim-runc-v2", "ctr"] {
                    let found = bins::find_usable(&src, p)?.with_context(|| {
                        format!(
                            "containerd 2.3: no {p}(.xz) in {} (set {RUNTIMES_ENV})",
                            src.display()
                        )
                    })?;
                    link(&found, &dir.join(p))?;
                }
                Ok(ContainerdBins { line, dir })
            }
        }
    }

    /// `containerd`
    pub fn containerd(&self) -> PathBuf {
        self.dir.join("containerd")
    }

    /// `ctr`
    pub fn ctr(&self) -> PathBuf {
        self.dir.join("ctr")
    }

    /// `PATH` for containerd: its own directory first (its shim), then the caller's.
    pub fn path_env(&self) -> std::ffi::OsString {
        let rest = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.dir.clone()];
        dirs.extend(std::env::split_paths(&rest).filter(|d| d != &self.dir));
        std::env::join_paths(dirs).unwrap_or(rest)
    }
}

/// The container runtime a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// containerd, of that release line.
    Containerd(Containerd),
    /// CRI-O 1.36 from `../shared/runtimes` (with Debian's runc and conmon; images put into
    /// its storage with Debian's skopeo).
    Crio,
}

impl Runtime {
    /// A short label for logs and test names.
    pub fn label(self) -> &'static str {
        match self {
            Runtime::Containerd(line) => line.label(),
            Runtime::Crio => "CRI-O 1.36",
        }
    }
}

/// Debian's programs a CRI-O node needs beside `crio` and `pinns`.
const CRIO_HOST_TOOLS: [&str; 3] = ["runc", "conmon", "skopeo"];

/// The programs of a CRI-O node: `crio` and `pinns` unpacked from [`RUNTIMES_ENV`]'s
/// directory; `runc`, `conmon` and `skopeo` from the host (Debian's).
#[derive(Clone, Debug)]
pub struct CrioBins {
    /// `crio`
    pub crio: PathBuf,
    /// `pinns`
    pub pinns: PathBuf,
    /// `runc` (CRI-O 1.36 refuses Debian's crun 1.8)
    pub runc: PathBuf,
    /// `conmon`
    pub conmon: PathBuf,
    /// `skopeo`
    pub skopeo: PathBuf,
}

impl CrioBins {
    /// Resolve them; an error naming what is missing.
    pub fn find() -> Result<CrioBins> {
        let (crio, pinns) = crio_bins()?;
        let mut host = Vec::new();
        for p in CRIO_HOST_TOOLS {
            let found = ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
                .iter()
                .map(|d| Path::new(d).join(p))
                .find(|f| f.is_file())
                .with_context(|| format!("CRI-O: no {p} (apt-get install runc conmon skopeo)"))?;
            host.push(found);
        }
        let [runc, conmon, skopeo]: [PathBuf; 3] = host
            .try_into()
            .map_err(|_| anyhow::anyhow!("CRI-O host tools"))?;
        Ok(CrioBins {
            crio,
            pinns,
            runc,
            conmon,
            skopeo,
        })
    }
}

/// CRI-O's programs: `crio` and `pinns`, unpacked from [`RUNTIMES_ENV`]'s directory.
pub fn crio_bins() -> Result<(PathBuf, PathBuf)> {
    let src = runtimes_dir();
    let need = |p: &str| -> Result<PathBuf> {
        bins::find_usable(&src, p)?.with_context(|| {
            format!(
                "CRI-O: no {p}(.xz) in {} (set {RUNTIMES_ENV})",
                src.display()
            )
        })
    };
    Ok((need("crio")?, need("pinns")?))
}

/// The runtimes' directory: [`RUNTIMES_ENV`], else `<PLEXUS_K8S_BIN>/../../runtimes/bin`.
pub fn runtimes_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(RUNTIMES_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    std::env::var_os(bins::BIN_ENV)
        .map(|k| PathBuf::from(k).join("../../runtimes/bin"))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"))
}

/// Make `to` a symlink to `from` (replaced when it points elsewhere; atomic by rename).
fn link(from: &Path, to: &Path) -> Result<()> {
    if std::fs::read_link(to).is_ok_and(|t| t == from) {
        return Ok(());
    }
    let tmp = to.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(from, &tmp)?;
    std::fs::rename(&tmp, to).with_context(|| format!("link {}", to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_path_puts_its_own_dir_first_once() {
        let b = ContainerdBins {
            line: Containerd::V2,
            dir: PathBuf::from("/x/runtimes"),
        };
        let p = b.path_env();
        let dirs: Vec<PathBuf> = std::env::split_paths(&p).collect();
        assert_eq!(dirs[0], PathBuf::from("/x/runtimes"));
        assert_eq!(
            dirs.iter()
                .filter(|d| *d == Path::new("/x/runtimes"))
                .count(),
            1
        );
        assert_eq!(b.containerd(), PathBuf::from("/x/runtimes/containerd"));
    }
}
