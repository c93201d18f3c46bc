//! The node operator's policy for what a NetworkAttachmentDefinition may name on the host
//! (`nadPolicy` in the plexus config). A NAD is written by namespace users, yet its config goes
//! to root plugins: its path-valued keys ([`paths`]) must point under directories the operator
//! lists, and the host interfaces, VLANs, device-plugin resources and PCI devices it names
//! ([`host`]) must be given to the namespace. Pure: what a config names and whether the policy
//! allows it; resolving symlinks on the node is meta's `nad_guard`.

pub mod host;
pub mod paths;

use crate::error::CniError;
use serde::Deserialize;
use std::collections::BTreeMap;

pub use host::{Allowances, HostKind, HostUse};
pub use paths::{PathClass, PathValue};

/// The plugins of `config` (a conflist's `plugins`, or the single config itself), each with
/// its location prefix (`plugins[0]`, or empty).
pub fn plugins(config: &serde_json::Value) -> Vec<(String, &serde_json::Value)> {
    match config.get("plugins").and_then(serde_json::Value::as_array) {
        Some(ps) => ps
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("plugins[{i}]"), p))
            .collect(),
        None => vec![(String::new(), config)],
    }
}

/// What the policy does with a NAD that breaks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Not checked.
    Off,
    /// Logged as a warning; the ADD goes on.
    Audit,
    /// The ADD fails (code 7) before any delegate runs, with an event on the pod.
    Enforce,
}

/// `nadPolicy`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NadPolicy {
    /// Namespaces whose NADs are written by the cluster's administrators: their configs' paths
    /// are not checked (their host resources still are, against the pod's namespace).
    #[serde(default = "default_trusted")]
    pub trusted_namespaces: Vec<String>,
    /// Where path-valued keys may point.
    #[serde(default)]
    pub paths: PathPolicy,
    /// Which namespaces may use which host interfaces, VLANs, resources and devices.
    #[serde(default)]
    pub host_resources: HostPolicy,
}

impl Default for NadPolicy {
    fn default() -> Self {
        NadPolicy {
            trusted_namespaces: default_trusted(),
            paths: PathPolicy::default(),
            host_resources: HostPolicy::default(),
        }
    }
}

fn default_trusted() -> Vec<String> {
    vec!["kube-system".into()]
}

/// `nadPolicy.paths`: the directories each class of path-valued key may point under.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathPolicy {
    /// `enforce` (default), `audit` or `off`.
    #[serde(default = "enforce")]
    pub mode: Mode,
    /// Data directories (`dataDir`): host-local's default.
    #[serde(default = "default_data")]
    pub data: Vec<String>,
    /// Log files (`logFile`, `log_file`, `log_file_path`, …).
    #[serde(default = "default_logs")]
    pub logs: Vec<String>,
    /// Files plugins read (`kubeconfig`, `configuration_path`, certificates, …): whereabouts'
    /// own directory.
    #[serde(default = "default_config")]
    pub config: Vec<String>,
    /// Sockets (`daemonSocketPath`, `socketPath`): the dhcp daemon's directory.
    #[serde(default = "default_sockets")]
    pub sockets: Vec<String>,
    /// More keys and their class (`data`, `logs`, `config`, `sockets`, or `ignore` for a key
    /// whose value is not a host path), over the built-in list.
    #[serde(default)]
    pub keys: BTreeMap<String, PathClass>,
}

impl Default for PathPolicy {
    fn default() -> Self {
        PathPolicy {
            mode: Mode::Enforce,
            data: default_data(),
            logs: default_logs(),
            config: default_config(),
            sockets: default_sockets(),
            keys: BTreeMap::new(),
        }
    }
}

fn enforce() -> Mode {
    Mode::Enforce
}
fn audit() -> Mode {
    Mode::Audit
}
/// host-local's default `dataDir`.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";
fn default_data() -> Vec<String> {
    vec![DEFAULT_DATA_DIR.into()]
}
fn default_logs() -> Vec<String> {
    vec!["/var/log/cni".into(), "/var/log/plexus-sriov".into()]
}
fn default_config() -> Vec<String> {
    vec!["/etc/cni/net.d/whereabouts.d".into()]
}
fn default_sockets() -> Vec<String> {
    vec!["/run/cni".into()]
}

impl PathPolicy {
    /// The directories a value of `class` may point under (`Other`: any of them).
    pub fn dirs(&self, class: PathClass) -> Vec<&str> {
        let all = [&self.data, &self.logs, &self.config, &self.sockets];
        let lists: Vec<&Vec<String>> = match class {
            PathClass::Data => vec![&self.data],
            PathClass::Logs => vec![&self.logs],
            PathClass::Config => vec![&self.config],
            PathClass::Sockets => vec![&self.sockets],
            PathClass::Other => all.to_vec(),
            PathClass::Ignore => vec![],
        };
        lists.into_iter().flatten().map(String::as_str).collect()
    }

    /// The config field that lists the directories for `class`, for messages.
    pub fn field(class: PathClass) -> &'static str {
        match class {
            PathClass::Data => "nadPolicy.paths.data",
            PathClass::Logs => "nadPolicy.paths.logs",
            PathClass::Config => "nadPolicy.paths.config",
            PathClass::Sockets => "nadPolicy.paths.sockets",
            PathClass::Other | PathClass::Ignore => "nadPolicy.paths (any class)",
        }
    }
}

/// `nadPolicy.hostResources`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostPolicy {
    /// `audit` (default: compatible with existing clusters), `enforce` or `off`.
    #[serde(default = "audit")]
    pub mode: Mode,
    /// `<namespace>.<kind>` (or `_all.<kind>`) → comma-separated allowances; the same keys
    /// and values as the `plexus-nad-policy` ConfigMap the admission policy reads
    /// (`deploy/components/nad-policy/nad-policy.yaml`).
    #[serde(default)]
    pub allow: BTreeMap<String, String>,
}

impl Default for HostPolicy {
    fn default() -> Self {
        HostPolicy {
            mode: Mode::Audit,
            allow: BTreeMap::new(),
        }
    }
}

impl NadPolicy {
    /// Check the operator's values: directories absolute without `..`, allowance keys and
    /// values well-formed. Errors are invalid-config (7) naming the field.
    pub fn validate(&self) -> Result<(), CniError> {
        let p = &self.paths;
        for (field, dirs) in [
            ("data", &p.data),
            ("logs", &p.logs),
            ("config", &p.config),
            ("sockets", &p.sockets),
        ] {
            for d in dirs {
                if let Some(why) = paths::lexical_problem(d) {
                    return Err(CniError::invalid_config(
                        format!("nadPolicy.paths.{field} entry {d:?} is not usable: {why}"),
                        "each entry must be an absolute directory without '..'",
                    ));
                }
                if d == "/" {
                    return Err(CniError::invalid_config(
                        format!("nadPolicy.paths.{field} entry \"/\" allows every path"),
                        "list the directories plugins may use, or set nadPolicy.paths.mode to \"off\"",
                    ));
                }
            }
        }
        Allowances::parse(&self.host_resources.allow).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_safe_and_compatible() {
        let p: NadPolicy = serde_json::from_str("{}").unwrap();
        assert_eq!(p, NadPolicy::default());
        assert_eq!(p.paths.mode, Mode::Enforce);
        assert_eq!(p.host_resources.mode, Mode::Audit);
        assert_eq!(p.paths.dirs(PathClass::Data), vec!["/var/lib/cni/networks"]);
        assert_eq!(p.trusted_namespaces, vec!["kube-system"]);
        assert!(p.validate().is_ok());
    }

    #[test]
    fn bad_operator_values_are_refused() {
        for bad in [
            r#"{"paths":{"data":["relative"]}}"#,
            r#"{"paths":{"logs":["/var/log/../etc"]}}"#,
            r#"{"paths":{"config":["/"]}}"#,
            r#"{"hostResources":{"allow":{"bank":"eth1"}}}"#,
            r#"{"hostResources":{"allow":{"bank.vlans":"5000"}}}"#,
        ] {
            let p: NadPolicy = serde_json::from_str(bad).unwrap();
            assert_eq!(p.validate().unwrap_err().code, 7, "{bad}");
        }
        // A typo in a field name is an error, not a silently open policy.
        assert!(serde_json::from_str::<NadPolicy>(r#"{"hostResource":{}}"#).is_err());
        assert!(serde_json::from_str::<NadPolicy>(r#"{"paths":{"mode":"strict"}}"#).is_err());
    }
}
