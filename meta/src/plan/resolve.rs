//! Resolving network references to configs: `clusterNetwork`/`defaultNetworks` values (a NAD
//! name, a config name in `confDir`, a directory or a file), NADs, and the on-disk fallback for
//! NADs with an empty spec.

use crate::error::MetaError;
use crate::plan::ResolvedNetwork;
use plexus_conf::k8s::nad;
use plexus_conf::limits;
use plexus_conf::netconf::NetConfList;
use plexus_delegates::fsutil;
use std::path::{Path, PathBuf};

/// A NAD as plexus needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NadData {
    /// `spec.config` (may be empty).
    pub config: String,
    /// The `k8s.v1.cni.cncf.io/resourceName` annotation, if any.
    pub resource_name: Option<String>,
    /// The `plexus.cni.io/fixed-ips` annotation (addresses per StatefulSet replica), if any.
    pub fixed_ips: Option<String>,
}

impl NadData {
    /// What plexus keeps of a NAD object.
    pub fn from_nad(n: &crate::k8s::Nad) -> NadData {
        NadData {
            config: n.config().unwrap_or_default().to_string(),
            resource_name: n.resource_name().map(str::to_string),
            fixed_ips: n
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(plexus_conf::k8s::fixed_ips::FIXED_IPS_ANNOTATION))
                .cloned(),
        }
    }
}

/// What a `clusterNetwork`/`defaultNetworks` value refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetRef {
    /// A NAD (`ns/name`, or a bare name in `multusNamespace`) with a config-name fallback.
    Nad {
        /// Namespace.
        ns: String,
        /// Name.
        name: String,
        /// Fall back to a config of this name in `confDir` when the NAD is missing.
        conf_fallback: bool,
    },
    /// A config file or directory.
    Path(PathBuf),
}

/// Classify a value: an existing absolute path is a file or directory; `ns/name` is a NAD; a
/// bare name is a NAD in `multus_ns`, else a config name in `confDir` (Multus' order).
pub fn classify(value: &str, multus_ns: &str) -> NetRef {
    if value.starts_with('/') || Path::new(value).exists() {
        return NetRef::Path(PathBuf::from(value));
    }
    match value.split_once('/') {
        Some((ns, name)) => NetRef::Nad {
            ns: ns.into(),
            name: name.into(),
            conf_fallback: false,
        },
        None => NetRef::Nad {
            ns: multus_ns.into(),
            name: value.into(),
            conf_fallback: true,
        },
    }
}

/// Config files of a directory, as `(file name, bytes)`; a missing directory is empty.
pub fn read_conf_dir(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let wanted = [".conf", ".conflist", ".json"]
                .iter()
                .any(|s| name.ends_with(s));
            if !wanted {
                return None;
            }
            // An unreadable or oversized file is skipped, like an unparsable one.
            fsutil::read_capped(&e.path(), limits::MAX_CONFIG_FILE_BYTES)
                .inspect_err(|err| tracing::warn!(file = %e.path().display(), error = %err, "config file skipped"))
                .ok()
                .map(|b| (name, b))
        })
        .collect()
}

/// Load a config from a file, or the first config file (name order) of a directory, skipping
/// plexus' and Multus' own generated configs.
pub fn load_path(path: &Path) -> Result<NetConfList, MetaError> {
    if path.is_dir() {
        let mut files = read_conf_dir(path);
        files.retain(|(n, _)| !n.starts_with("00-multus") && !n.starts_with("00-plexus"));
        files.sort_by(|a, b| a.0.cmp(&b.0));
        let (name, bytes) = files.first().ok_or_else(|| MetaError::ConfigDirEmpty {
            path: path.to_path_buf(),
        })?;
        return NetConfList::parse(bytes).map_err(|source| MetaError::ConfigParse {
            file: format!("{}/{name}", path.display()),
            source: source.into(),
        });
    }
    let bytes = fsutil::read_capped(path, limits::MAX_CONFIG_FILE_BYTES).map_err(|source| {
        MetaError::ConfigFile {
            path: path.to_path_buf(),
            source,
        }
    })?;
    let list = NetConfList::parse(&bytes).map_err(|source| MetaError::ConfigParse {
        file: path.display().to_string(),
        source: source.into(),
    })?;
    if let Some(dir) = unread_plugin_dir(path, &list) {
        tracing::warn!(file = %path.display(), dir = %dir.display(),
            "plugin files next to a .conflist are not loaded (libcni's subdirectory chaining): only the plugins inlined in the file run; inline the others, or set loadOnlyInlinedPlugins");
    }
    Ok(list)
}

/// `<dir>/<network name>/` when it holds `.conf` files that libcni would append to the
/// `.conflist` at `path` (subdirectory chaining) and plexus does not: see docs/compatibility.md.
fn unread_plugin_dir(path: &Path, list: &NetConfList) -> Option<PathBuf> {
    if list.load_only_inlined_plugins || path.extension().is_none_or(|e| e != "conflist") {
        return None;
    }
    let dir = path.parent()?.join(&list.name);
    let has_conf = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(Result::ok)
        .any(|e| e.path().extension().is_some_and(|x| x == "conf"));
    has_conf.then_some(dir)
}

/// Resolve a NAD (already fetched) to its network, using `conf_dir` for an empty spec.
pub fn from_nad(
    ns: &str,
    name: &str,
    data: &NadData,
    conf_dir: &Path,
) -> Result<ResolvedNetwork, MetaError> {
    let spec =
        nad::config_from_spec(ns, name, &data.config).map_err(|source| MetaError::NadInvalid {
            ns: ns.to_string(),
            name: name.to_string(),
            source: source.into(),
        })?;
    let inline_config = spec.is_some();
    let list = match spec {
        Some(l) => l,
        None => nad::find_by_name(name, &read_conf_dir(conf_dir)).ok_or_else(|| {
            MetaError::NadEmpty {
                ns: ns.to_string(),
                name: name.to_string(),
                conf_dir: conf_dir.to_path_buf(),
            }
        })?,
    };
    Ok(ResolvedNetwork {
        name: format!("{ns}/{name}"),
        list,
        resource_name: data.resource_name.clone(),
        nad: Some(crate::plan::SelectedNad {
            namespace: ns.to_string(),
            inline_config,
            resource_name: data.resource_name.clone(),
        }),
    })
}

/// A network that was not found.
pub fn not_found(ns: &str, name: &str, pod: &str) -> MetaError {
    MetaError::NadNotFound {
        pod: pod.to_string(),
        ns: ns.to_string(),
        name: name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(
            classify("/etc/cni/net.d/10-flannel.conflist", "kube-system"),
            NetRef::Path("/etc/cni/net.d/10-flannel.conflist".into())
        );
        assert_eq!(
            classify("net-ns/calico", "kube-system"),
            NetRef::Nad {
                ns: "net-ns".into(),
                name: "calico".into(),
                conf_fallback: false
            }
        );
        assert_eq!(
            classify("cbr0", "kube-system"),
            NetRef::Nad {
                ns: "kube-system".into(),
                name: "cbr0".into(),
                conf_fallback: true
            }
        );
    }

    #[test]
    fn files_dirs_and_empty_nads() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(
            t.path().join("00-multus.conf"),
            br#"{"name":"multus","type":"multus"}"#,
        )
        .unwrap();
        std::fs::write(
            t.path().join("10-flannel.conflist"),
            br#"{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        std::fs::write(
            t.path().join("20-mv.conf"),
            br#"{"cniVersion":"1.0.0","name":"mv","type":"macvlan"}"#,
        )
        .unwrap();
        assert_eq!(load_path(t.path()).unwrap().name, "cbr0");
        assert_eq!(load_path(&t.path().join("20-mv.conf")).unwrap().name, "mv");
        let e = load_path(&t.path().join("missing.conf")).unwrap_err();
        assert!(
            matches!(&e, MetaError::ConfigFile { path, source }
                if path.ends_with("missing.conf") && source.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            load_path(empty.path()).unwrap_err(),
            MetaError::ConfigDirEmpty { .. }
        ));
        std::fs::write(empty.path().join("1.conf"), b"{not json").unwrap();
        let e = load_path(empty.path()).unwrap_err();
        assert!(
            matches!(&e, MetaError::ConfigParse { file, .. } if file.ends_with("/1.conf")),
            "{e:?}"
        );
        let r = from_nad("db", "mv", &NadData::default(), t.path()).unwrap();
        assert_eq!(r.name, "db/mv");
        assert_eq!(r.list.plugins[0].plugin_type(), "macvlan");
        let e = from_nad("db", "nope", &NadData::default(), t.path()).unwrap_err();
        assert!(
            matches!(&e, MetaError::NadEmpty { ns, name, .. } if ns == "db" && name == "nope"),
            "{e:?}"
        );
        assert!(e.msg().contains("db/nope"));
    }

    /// libcni's subdirectory chaining is not done (docs/compatibility.md): only the inlined
    /// plugins run, and the directory that would have been read is named in a warning.
    #[test]
    fn plugin_files_next_to_a_conflist_are_not_loaded() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("10-flannel.conflist");
        std::fs::write(
            &file,
            br#"{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        let list = load_path(&file).unwrap();
        assert_eq!(unread_plugin_dir(&file, &list), None);
        std::fs::create_dir(t.path().join("cbr0")).unwrap();
        std::fs::write(
            t.path().join("cbr0/20-tuning.conf"),
            br#"{"type":"tuning"}"#,
        )
        .unwrap();
        let list = load_path(&file).unwrap();
        assert_eq!(list.plugins.len(), 1, "only the inlined plugin");
        assert_eq!(unread_plugin_dir(&file, &list), Some(t.path().join("cbr0")));
        std::fs::write(
            &file,
            br#"{"cniVersion":"1.0.0","name":"cbr0","loadOnlyInlinedPlugins":true,"plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        let list = load_path(&file).unwrap();
        assert_eq!(unread_plugin_dir(&file, &list), None);
    }

    #[test]
    fn oversized_config_files_are_refused_with_their_size() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("05-huge.conflist");
        let mut cfg =
            br#"{"cniVersion":"1.0.0","name":"huge","plugins":[{"type":"bridge"}]}"#.to_vec();
        cfg.resize(limits::MAX_CONFIG_FILE_BYTES + 1, b' ');
        std::fs::write(&p, &cfg).unwrap();
        let e = load_path(&p).unwrap_err();
        assert!(matches!(e, MetaError::ConfigFile { .. }), "{e:?}");
        assert_eq!(e.code(), plexus_conf::error::code::INVALID_CONFIG);
        assert!(e.msg().contains("05-huge.conflist"), "{e}");
        assert_eq!(
            e.details(),
            format!(
                "file is too large: {} bytes, the limit is {} bytes",
                limits::MAX_CONFIG_FILE_BYTES + 1,
                limits::MAX_CONFIG_FILE_BYTES
            )
        );
        // In a directory it is skipped like an unparsable file; at the limit it loads.
        assert!(read_conf_dir(t.path()).is_empty());
        cfg.truncate(limits::MAX_CONFIG_FILE_BYTES);
        std::fs::write(&p, &cfg).unwrap();
        assert_eq!(load_path(&p).unwrap().name, "huge");
    }
}
