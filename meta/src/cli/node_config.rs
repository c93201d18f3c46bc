//! The node's installed plexus config, for the live diagnostics (`plexus state`, `plexus explain
//! --pod`): `--config FILE` when given, else the file the installer writes
//! ([`INSTALLED`], the first that exists), read and parsed exactly as a CNI call reads it, so
//! the diagnostics use the same `cniDir`, `kubeconfig`, `deviceInfoDir`, `runtimeEndpoint` and
//! NAD policy as the node's ADDs.

use plexus_conf::plexus_config::PlexusConfig;
use std::path::{Path, PathBuf};

/// Where `deploy/install.sh` installs plexus' config (the conflist, or a plain config).
pub const INSTALLED: [&str; 2] = [
    "/etc/cni/net.d/00-plexus.conflist",
    "/etc/cni/net.d/00-plexus.conf",
];

/// The config a diagnostic runs with, and the file it came from.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The file read.
    pub path: PathBuf,
    /// Its plexus config.
    pub config: PlexusConfig,
}

/// The file `--config` names, or the first of [`INSTALLED`] that exists.
pub fn locate(flag: Option<&str>) -> Result<PathBuf, String> {
    if let Some(f) = flag {
        return Ok(PathBuf::from(f));
    }
    INSTALLED
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            format!(
                "no plexus config found at {}: give --config FILE",
                INSTALLED.join(" or ")
            )
        })
}

/// Read and parse the config [`locate`] finds; the error says which file and why.
pub fn load(flag: Option<&str>) -> Result<NodeConfig, String> {
    let path = locate(flag)?;
    let bytes =
        plexus_delegates::fsutil::read_capped(&path, plexus_conf::limits::MAX_CONFIG_FILE_BYTES)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    let config = PlexusConfig::parse(&bytes)
        .map_err(|e| format!("{}: {}: {}", path.display(), e.msg, e.details))?;
    Ok(NodeConfig { path, config })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_file_is_read_and_a_bad_one_named() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("p.conflist");
        std::fs::write(
            &f,
            br#"{"cniVersion":"1.0.0","name":"plexus","plugins":[{"type":"plexus","cniDir":"/x/state",
                "delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}]}]}"#,
        )
        .unwrap();
        let c = load(f.to_str()).unwrap();
        assert_eq!(c.config.cni_dir, "/x/state");
        std::fs::write(&f, b"{").unwrap();
        let e = load(f.to_str()).unwrap_err();
        assert!(e.starts_with(f.to_str().unwrap()), "{e}");
        let e = load(t.path().join("absent").to_str()).unwrap_err();
        assert!(e.contains("absent"), "{e}");
    }
}
