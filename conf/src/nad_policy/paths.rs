//! Path-valued keys of a delegate config: which keys name host paths (a built-in list of the
//! keys real plugins read, the operator's additions, and a rule for unknown keys that look like
//! paths), at any depth, and the lexical checks a value must pass before the node looks at it.

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Component, Path};

/// What a path-valued key is for: each class has its own allowed directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PathClass {
    /// A directory a plugin writes its state in.
    Data,
    /// A log file a plugin appends to.
    Logs,
    /// A file a plugin reads (credentials, its own config).
    Config,
    /// A unix socket a plugin connects to.
    Sockets,
    /// An unknown key that looks like a path: allowed under any class's directories.
    Other,
    /// Not a host path (operator's override for a key the rule would take for one).
    Ignore,
}

impl PathClass {
    /// Lower-case name, as in the config.
    pub fn name(self) -> &'static str {
        match self {
            PathClass::Data => "data",
            PathClass::Logs => "logs",
            PathClass::Config => "config",
            PathClass::Sockets => "sockets",
            PathClass::Other => "other",
            PathClass::Ignore => "ignore",
        }
    }
}

/// The keys real plugins read host paths from (reference plugins, whereabouts, sriov-cni,
/// calico, ovs-cni, Multus).
const KNOWN: &[(&str, PathClass)] = &[
    ("dataDir", PathClass::Data),
    ("data_dir", PathClass::Data),
    ("logFile", PathClass::Logs),
    ("log_file", PathClass::Logs),
    ("log_file_path", PathClass::Logs),
    ("logPath", PathClass::Logs),
    ("kubeconfig", PathClass::Config),
    ("configuration_path", PathClass::Config),
    ("resolvConf", PathClass::Config),
    ("etcd_key_file", PathClass::Config),
    ("etcd_cert_file", PathClass::Config),
    ("etcd_ca_cert_file", PathClass::Config),
    ("daemonSocketPath", PathClass::Sockets),
    ("socketPath", PathClass::Sockets),
    ("socket_file", PathClass::Sockets),
    // host-device's sysfs path names a device: nadPolicy.hostResources' business, not a path
    // a plugin writes (a NAD naming one is checked there).
    ("kernelpath", PathClass::Ignore),
];

/// Key endings that mark an unknown key as a path (compared lower-case).
const PATH_LIKE_ENDINGS: &[&str] = &["file", "path", "dir", "directory", "socket", "kubeconfig"];

/// One path-valued string found in a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathValue {
    /// Where it is: `plugins[0].ipam.dataDir`.
    pub location: String,
    /// The key it is the value of.
    pub key: String,
    /// The value.
    pub value: String,
    /// Its class.
    pub class: PathClass,
}

/// The class of `key` with `value`, or `None` when it does not name a host path.
fn classify(key: &str, value: &str, extra: &BTreeMap<String, PathClass>) -> Option<PathClass> {
    let class = extra
        .get(key)
        .copied()
        .or_else(|| KNOWN.iter().find(|(k, _)| *k == key).map(|(_, c)| *c))
        .or_else(|| {
            let lower = key.to_ascii_lowercase();
            PATH_LIKE_ENDINGS
                .iter()
                .any(|e| lower.ends_with(e))
                .then_some(PathClass::Other)
        })
        .or_else(|| looks_absolute(value).then_some(PathClass::Other))?;
    (class != PathClass::Ignore && !value.is_empty()).then_some(class)
}

/// An absolute path, not a bare prefix length such as `/24`.
fn looks_absolute(value: &str) -> bool {
    value.starts_with('/') && !value[1..].bytes().all(|b| b.is_ascii_digit())
}

/// Every path-valued string in `config` (any depth; array elements take their array's key).
pub fn find(config: &Value, extra: &BTreeMap<String, PathClass>) -> Vec<PathValue> {
    let mut out = Vec::new();
    walk(config, "", "", extra, &mut out);
    out
}

fn walk(
    v: &Value,
    key: &str,
    at: &str,
    extra: &BTreeMap<String, PathClass>,
    out: &mut Vec<PathValue>,
) {
    match v {
        Value::String(s) => {
            if let Some(class) = classify(key, s, extra) {
                out.push(PathValue {
                    location: at.to_string(),
                    key: key.to_string(),
                    value: s.clone(),
                    class,
                });
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, key, &format!("{at}[{i}]"), extra, out);
            }
        }
        Value::Object(m) => {
            for (k, item) in m {
                let here = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                walk(item, k, &here, extra, out);
            }
        }
        _ => {}
    }
}

/// Why `value` is not usable as a host path before any lookup: relative, `..`, NUL, or too
/// long; `None` if it passes.
pub fn lexical_problem(value: &str) -> Option<&'static str> {
    let p = Path::new(value);
    if value.is_empty() {
        Some("it is empty")
    } else if !p.is_absolute() {
        Some("it is a relative path")
    } else if value.contains('\0') {
        Some("it contains a NUL byte")
    } else if p.components().any(|c| matches!(c, Component::ParentDir)) {
        Some("it contains '..'")
    } else if value.len() > 4096 {
        Some("it is longer than PATH_MAX")
    } else {
        None
    }
}

/// Whether `path` is `dir` or below it, component by component (`/var/lib/cni2` is not under
/// `/var/lib/cni`).
pub fn is_under(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn found(v: Value) -> Vec<(String, String, PathClass)> {
        find(&v, &BTreeMap::new())
            .into_iter()
            .map(|p| (p.location, p.value, p.class))
            .collect()
    }

    #[test]
    fn known_keys_at_any_depth_and_in_chains() {
        let v = json!({"cniVersion":"1.0.0","name":"n","plugins":[
            {"type":"macvlan","master":"eth1","ipam":{"type":"host-local","dataDir":"/etc/x",
              "ranges":[[{"subnet":"10.1.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
            {"type":"whereabouts-like","log_file":"/tmp/wb.log",
              "kubernetes":{"kubeconfig":"/etc/kubernetes/kubelet.conf"}},
            {"type":"tuning","sysctl":{"net.ipv4.conf.IFNAME.arp_filter":"1"}}]});
        assert_eq!(
            found(v),
            vec![
                (
                    "plugins[0].ipam.dataDir".into(),
                    "/etc/x".into(),
                    PathClass::Data
                ),
                (
                    "plugins[1].log_file".into(),
                    "/tmp/wb.log".into(),
                    PathClass::Logs
                ),
                (
                    "plugins[1].kubernetes.kubeconfig".into(),
                    "/etc/kubernetes/kubelet.conf".into(),
                    PathClass::Config
                ),
            ]
        );
    }

    #[test]
    fn unknown_keys_that_look_like_paths() {
        let v = json!({"type":"x","certFile":"c.pem","stateDirectory":"/srv/s",
            "nested":{"list":["/etc/shadow","plain"]},"prefix":"/24","note":"a/b",
            "args":{"cni":{"dumpTo":"/root/x"}}});
        let got = found(v);
        let values: Vec<&str> = got.iter().map(|g| g.1.as_str()).collect();
        assert_eq!(values, vec!["c.pem", "/srv/s", "/etc/shadow", "/root/x"]);
        assert!(got.iter().all(|g| g.2 == PathClass::Other));
    }

    #[test]
    fn operator_keys_override_the_rules() {
        let extra: BTreeMap<String, PathClass> = [
            ("certFile".to_string(), PathClass::Config),
            ("odd".to_string(), PathClass::Ignore),
        ]
        .into();
        let got = find(
            &json!({"certFile":"/etc/c","odd":"/x","kernelpath":"/sys/x"}),
            &extra,
        );
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].key.as_str(), got[0].class),
            ("certFile", PathClass::Config)
        );
    }

    #[test]
    fn lexical_checks() {
        assert_eq!(lexical_problem("/var/lib/cni/networks"), None);
        assert!(lexical_problem("var/lib").is_some());
        assert!(lexical_problem("/var/lib/cni/networks/../../../etc").is_some());
        assert!(lexical_problem("").is_some());
        assert!(lexical_problem("/a\0b").is_some());
        assert!(is_under(
            Path::new("/var/lib/cni/networks/x"),
            Path::new("/var/lib/cni/networks")
        ));
        assert!(!is_under(
            Path::new("/var/lib/cni2"),
            Path::new("/var/lib/cni")
        ));
    }
}
