//! The per-attachment result cache, in libcni's `cniCacheV1` format, so DEL and CHECK get the
//! ADD result as `prevResult` even after the config or the API has changed.

use crate::fsutil;
use base64::Engine;
use plexus_conf::error::{code, CniError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// One cached attachment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedAttachment {
    /// Always `cniCacheV1`.
    pub kind: String,
    /// Container ID.
    #[serde(rename = "containerId")]
    pub container_id: String,
    /// The network config bytes, base64 (as Go marshals `[]byte`).
    pub config: String,
    /// Interface name.
    #[serde(rename = "ifName")]
    pub if_name: String,
    /// Network name.
    #[serde(rename = "networkName")]
    pub network_name: String,
    /// Netns path at ADD.
    #[serde(default)]
    pub netns: String,
    /// CNI_ARGS pairs.
    #[serde(rename = "cniArgs", default)]
    pub cni_args: Vec<[String; 2]>,
    /// Capability args.
    #[serde(rename = "capabilityArgs", default)]
    pub capability_args: Map<String, Value>,
    /// The final ADD result.
    #[serde(default)]
    pub result: Option<Value>,
}

impl CachedAttachment {
    /// The config bytes.
    pub fn config_bytes(&self) -> Option<Vec<u8>> {
        base64::engine::general_purpose::STANDARD
            .decode(&self.config)
            .ok()
    }

    /// Encode config bytes for the `config` field.
    pub fn encode_config(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }
}

/// The results cache rooted at `<dir>/results`.
#[derive(Debug, Clone)]
pub struct ResultCache {
    dir: PathBuf,
}

impl ResultCache {
    /// A cache under `cache_dir` (libcni's default is `/var/lib/cni`).
    pub fn new(cache_dir: &Path) -> Self {
        ResultCache {
            dir: cache_dir.join("results"),
        }
    }

    /// Path of one attachment's entry.
    pub fn path(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.dir.join(format!("{network}-{container_id}-{ifname}"))
    }

    /// Store an entry (atomic, 0600 in a 0700 directory).
    pub fn store(&self, entry: &CachedAttachment) -> Result<(), CniError> {
        let _phase = crate::timing::phase("result_cache");
        let p = self.path(&entry.network_name, &entry.container_id, &entry.if_name);
        let bytes = serde_json::to_vec(entry)
            .map_err(|e| CniError::internal("failed to encode cache entry", e.to_string()))?;
        // A lost cache entry only costs DEL its prevResult (plugins cope): no fsync.
        fsutil::write_atomic_nosync(&p, &bytes, 0o600).map_err(|e| {
            CniError::new(
                code::IO_FAILURE,
                "failed to write result cache",
                format!("{}: {e}", p.display()),
            )
        })
    }

    /// Load an entry; a missing or unreadable entry is `None` (DEL must not fail on it).
    pub fn load(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Option<CachedAttachment> {
        let p = self.path(network, container_id, ifname);
        let bytes = fsutil::read_optional(&p).ok().flatten()?;
        match serde_json::from_slice::<CachedAttachment>(&bytes) {
            Ok(e) => Some(e),
            Err(err) => {
                // A legacy cache holding a bare result is still usable for prevResult.
                match serde_json::from_slice::<Value>(&bytes) {
                    Ok(v) if v.get("cniVersion").is_some() => Some(CachedAttachment {
                        kind: "legacy".into(),
                        container_id: container_id.into(),
                        config: String::new(),
                        if_name: ifname.into(),
                        network_name: network.into(),
                        netns: String::new(),
                        cni_args: Vec::new(),
                        capability_args: Map::new(),
                        result: Some(v),
                    }),
                    _ => {
                        tracing::warn!(path = %p.display(), error = %err, "ignoring corrupt cache entry");
                        None
                    }
                }
            }
        }
    }

    /// Remove an entry; already gone is success.
    pub fn remove(&self, network: &str, container_id: &str, ifname: &str) -> Result<(), CniError> {
        let p = self.path(network, container_id, ifname);
        fsutil::remove_if_exists(&p).map_err(|e| {
            CniError::new(
                code::IO_FAILURE,
                "failed to remove result cache",
                format!("{}: {e}", p.display()),
            )
        })
    }

    /// Every readable `cniCacheV1` entry whose file name passes `keep`, in file-name order.
    fn entries(&self, keep: impl Fn(&str) -> bool) -> Vec<CachedAttachment> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut paths: Vec<PathBuf> = rd
            .filter_map(Result::ok)
            .filter(|e| keep(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect();
        paths.sort();
        paths
            .iter()
            .filter_map(|p| fsutil::read_capped(p, fsutil::MAX_STATE_FILE_BYTES).ok())
            .filter_map(|b| serde_json::from_slice::<CachedAttachment>(&b).ok())
            .filter(|c| c.kind == "cniCacheV1")
            .collect()
    }

    /// Every cached attachment of `network` (for GC).
    pub fn list_network(&self, network: &str) -> Vec<CachedAttachment> {
        let prefix = format!("{network}-");
        self.entries(|f| f.starts_with(&prefix))
            .into_iter()
            .filter(|c| c.network_name == network)
            .collect()
    }

    /// Every cached attachment of one container, whatever its network (for a DEL that lost its
    /// own record of the container's networks: each entry holds what that network's DEL needs).
    pub fn list_container(&self, container_id: &str) -> Vec<CachedAttachment> {
        let infix = format!("-{container_id}-");
        self.entries(|f| f.contains(&infix))
            .into_iter()
            .filter(|c| c.container_id == container_id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One fixture per result-cache format plexus reads (docs/upgrade.md): its own `cniCacheV1`
    /// entries (unchanged since they were introduced, 2026-11-21), libcni's as containerd 1.6
    /// wrote one on this machine, and a bare result (libcni before `cniCacheV1`). Every later
    /// plexus must read each.
    #[test]
    fn every_cache_format_ever_written_reads() {
        let t = tempfile::tempdir().unwrap();
        let c = ResultCache::new(t.path());
        std::fs::create_dir_all(t.path().join("results")).unwrap();
        let fixtures = [
            (
                "plexus",
                include_str!("cache_fixtures/plexus-2026-11-21.json"),
            ),
            (
                "libcni",
                include_str!("cache_fixtures/libcni-containerd-1.6.json"),
            ),
            (
                "legacy",
                include_str!("cache_fixtures/legacy-bare-result.json"),
            ),
        ];
        for (what, text) in fixtures {
            let raw: Value = serde_json::from_str(text).unwrap();
            // Stored where the cache puts them: `<network>-<container>-<ifname>`.
            let (net, cid, ifname) = match raw["networkName"].as_str() {
                Some(net) => (
                    net.to_string(),
                    raw["containerId"].as_str().unwrap().to_string(),
                    raw["ifName"].as_str().unwrap().to_string(),
                ),
                None => ("old".into(), "c-legacy".into(), "eth0".into()),
            };
            std::fs::write(c.path(&net, &cid, &ifname), text).unwrap();
            let e = c
                .load(&net, &cid, &ifname)
                .unwrap_or_else(|| panic!("{what}: not read"));
            let ips = e
                .result
                .as_ref()
                .and_then(|r| r["ips"].as_array())
                .map(Vec::len);
            assert_eq!(ips, Some(1), "{what}: {e:?}");
            if what == "legacy" {
                assert_eq!(e.kind, "legacy");
                continue;
            }
            assert_eq!(e.kind, "cniCacheV1", "{what}");
            let cfg: Value = serde_json::from_slice(&e.config_bytes().unwrap()).unwrap();
            assert_eq!(cfg["name"].as_str(), Some(net.as_str()), "{what}: {cfg}");
            assert!(!e.cni_args.is_empty(), "{what}");
            // What GC and a DEL without its plan list.
            assert_eq!(c.list_network(&net), vec![e.clone()], "{what}");
            assert_eq!(c.list_container(&cid), vec![e], "{what}");
        }
    }

    #[test]
    fn store_load_remove_in_libcni_format() {
        let t = tempfile::tempdir().unwrap();
        let c = ResultCache::new(t.path());
        let e = CachedAttachment {
            kind: "cniCacheV1".into(),
            container_id: "c1".into(),
            config: CachedAttachment::encode_config(br#"{"name":"n"}"#),
            if_name: "eth0".into(),
            network_name: "n".into(),
            netns: "/run/netns/x".into(),
            cni_args: vec![["K8S_POD_NAME".into(), "p".into()]],
            capability_args: Map::new(),
            result: Some(serde_json::json!({"cniVersion":"1.0.0"})),
        };
        c.store(&e).unwrap();
        let raw: Value =
            serde_json::from_slice(&std::fs::read(c.path("n", "c1", "eth0")).unwrap()).unwrap();
        assert_eq!(raw["kind"], "cniCacheV1");
        assert_eq!(raw["config"], "eyJuYW1lIjoibiJ9");
        assert_eq!(c.load("n", "c1", "eth0").unwrap(), e);
        assert_eq!(c.list_network("n").len(), 1);
        assert!(c.list_network("other").is_empty());
        assert_eq!(c.list_container("c1"), vec![e.clone()]);
        assert!(c.list_container("c").is_empty());
        c.remove("n", "c1", "eth0").unwrap();
        c.remove("n", "c1", "eth0").unwrap();
        assert!(c.load("n", "c1", "eth0").is_none());
    }

    #[test]
    fn corrupt_entry_is_ignored() {
        let t = tempfile::tempdir().unwrap();
        let c = ResultCache::new(t.path());
        fsutil::write_atomic(&c.path("n", "c1", "eth0"), b"{trunc", 0o600).unwrap();
        assert!(c.load("n", "c1", "eth0").is_none());
    }
}
