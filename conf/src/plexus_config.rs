//! The plexus config (the meta-plugin's own stdin): every Multus field with Multus' meaning and
//! defaults, plus a few plexus settings. A Multus config with `"type"` changed to `"plexus"`
//! parses unchanged.

use crate::error::CniError;
use crate::netconf::NetConfList;
use serde::Deserialize;
use serde_json::{Map, Value};

/// Log rotation options (accepted for compatibility; plexus appends and leaves rotation to
/// logrotate).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogOptions {
    /// Days to keep.
    pub max_age: Option<u32>,
    /// MB per file.
    pub max_size: Option<u32>,
    /// Files to keep.
    pub max_backups: Option<u32>,
    /// Compress old files.
    pub compress: Option<bool>,
}

/// The plexus / Multus configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlexusConfig {
    /// Spec version the runtime speaks to plexus.
    #[serde(default)]
    pub cni_version: String,
    /// Network name.
    #[serde(default)]
    pub name: String,
    /// `plexus` (or `multus`).
    #[serde(rename = "type", default)]
    pub plugin_type: String,
    /// Kubeconfig path; empty means in-cluster when available, else static mode.
    #[serde(default)]
    pub kubeconfig: String,
    /// Default network: NAD name, config name, directory or file.
    #[serde(default)]
    pub cluster_network: String,
    /// Networks attached to every pod outside `systemNamespaces`.
    #[serde(default)]
    pub default_networks: Vec<String>,
    /// Inline delegate configs; the first is the default network.
    #[serde(default)]
    pub delegates: Vec<Value>,
    /// Directory of on-disk CNI configs for NADs with an empty spec.
    #[serde(default = "default_conf_dir")]
    pub conf_dir: String,
    /// Plexus state directory (attachment plans, delegate result cache): an absolute path.
    #[serde(default = "default_cni_dir")]
    pub cni_dir: String,
    /// Directory searched for delegates before `CNI_PATH`.
    #[serde(default = "default_bin_dir")]
    pub bin_dir: String,
    /// File that must exist before ADD proceeds.
    #[serde(rename = "readinessindicatorfile", default)]
    pub readiness_indicator_file: String,
    /// Restrict NAD references to the pod's namespace and `globalNamespaces`.
    #[serde(default)]
    pub namespace_isolation: bool,
    /// Comma list of namespaces any pod may reference when isolation is on.
    #[serde(default)]
    pub global_namespaces: String,
    /// Namespaces whose pods do not get `defaultNetworks`.
    #[serde(default = "default_system_namespaces")]
    pub system_namespaces: Vec<String>,
    /// Namespace for `clusterNetwork`/`defaultNetworks` NAD names and the default-network annotation.
    #[serde(default = "default_multus_namespace")]
    pub multus_namespace: String,
    /// Plexus: this Node's name as the API knows it (the installer writes the DaemonSet's
    /// `spec.nodeName`); empty: the host name. Named in address claims and events.
    #[serde(default)]
    pub node_name: String,
    /// Log file.
    #[serde(default)]
    pub log_file: String,
    /// Log level (`panic`, `error`, `verbose`, `debug`, or tracing's names).
    #[serde(default)]
    pub log_level: String,
    /// Plexus: `text` (the default) or `json` (one object per line) for the log file and
    /// stderr; `PLEXUS_LOG_FORMAT` in plexus' environment wins.
    #[serde(default)]
    pub log_format: String,
    /// Also log to stderr.
    #[serde(default = "default_true")]
    pub log_to_stderr: bool,
    /// Rotation options.
    #[serde(default)]
    pub log_options: Option<LogOptions>,
    /// Capabilities advertised to the runtime.
    #[serde(default)]
    pub capabilities: Map<String, Value>,
    /// Capability args from the runtime.
    #[serde(default)]
    pub runtime_config: Map<String, Value>,
    /// Keep the attachment plan when a delegate DEL fails so a later DEL can retry.
    #[serde(default)]
    pub retry_delete_on_error: bool,
    /// Multus' auxiliary chain name (not supported; rejected when set).
    #[serde(rename = "auxiliaryCNIChainName", default)]
    pub auxiliary_cni_chain_name: String,
    /// Plexus: deadline for one delegate exec, seconds.
    #[serde(default = "default_delegate_timeout")]
    pub delegate_timeout_seconds: u64,
    /// Plexus: post Kubernetes events for attachments.
    #[serde(default = "default_true")]
    pub events: bool,
    /// Plexus: seconds ADD waits for the readiness indicator file.
    #[serde(default = "default_readiness_timeout")]
    pub readiness_timeout_seconds: u64,
    /// Plexus: total time budget for reading the pod at ADD, milliseconds.
    #[serde(default = "default_pod_timeout")]
    pub pod_timeout_ms: u64,
    /// Plexus: the kubelet pod-resources socket asked for device-plugin allocations.
    #[serde(default = "default_pod_resources_socket")]
    pub pod_resources_socket: String,
    /// Plexus: the kubelet device-manager checkpoint, the fallback for allocations.
    #[serde(default = "default_device_checkpoint")]
    pub device_checkpoint_file: String,
    /// Plexus: root of the NPWG device-info files (`dp/` written by device plugins, `cni/` per
    /// attachment).
    #[serde(default = "default_device_info_dir")]
    pub device_info_dir: String,
    /// Plexus: write each DRA-backed attachment's interface, IPs and MAC into its
    /// ResourceClaim's `status.devices[].networkData` (turned off for the call when RBAC
    /// forbids it).
    #[serde(default = "default_true")]
    pub dra_network_data: bool,
    /// Plexus: what a NAD's config may name on the host (directories, interfaces, VLANs,
    /// devices): docs/security.md.
    #[serde(default)]
    pub nad_policy: crate::nad_policy::NadPolicy,
    /// Plexus: the node is being uninstalled (`install.sh --uninstall` sets it): a new pod
    /// gets its cluster network only, with a Warning event naming the networks it asked for,
    /// while pods attached earlier are still DELed from their plans.
    #[serde(default)]
    pub uninstalling: bool,
    /// Plexus: the container runtime's CRI socket the node reconciler lists live sandboxes on
    /// (a path or `unix://PATH`); empty: the one of containerd's and CRI-O's default sockets
    /// that exists; `none`: no reconciler (docs/daemon.md).
    #[serde(default)]
    pub runtime_endpoint: String,
    /// Plexus: the node reconciler leaves plans younger than this alone (sandboxes being
    /// created are not listed by the runtime yet), seconds.
    #[serde(default = "default_reconcile_grace")]
    pub reconcile_grace_seconds: u64,
    /// Runtime-provided previous result (plexus as a chained plugin; unused).
    #[serde(default)]
    pub prev_result: Option<Value>,
}

fn default_conf_dir() -> String {
    "/etc/cni/multus/net.d".into()
}
/// `cniDir` when the config leaves it out.
pub const DEFAULT_CNI_DIR: &str = "/var/lib/cni/plexus";

fn default_cni_dir() -> String {
    DEFAULT_CNI_DIR.into()
}
fn default_bin_dir() -> String {
    "/opt/cni/bin".into()
}
fn default_system_namespaces() -> Vec<String> {
    vec!["kube-system".into()]
}
fn default_multus_namespace() -> String {
    "kube-system".into()
}
fn default_true() -> bool {
    true
}
fn default_delegate_timeout() -> u64 {
    60
}
fn default_readiness_timeout() -> u64 {
    45
}
fn default_pod_resources_socket() -> String {
    "/var/lib/kubelet/pod-resources/kubelet.sock".into()
}
fn default_device_checkpoint() -> String {
    "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint".into()
}
fn default_device_info_dir() -> String {
    crate::k8s::devinfo::DEFAULT_DIR.into()
}
fn default_reconcile_grace() -> u64 {
    120
}
fn default_pod_timeout() -> u64 {
    2500
}

impl PlexusConfig {
    /// A conflist file as the node holds it (`{"plugins": [{"type": "plexus", …}]}`, which
    /// `plexus explain --config` is given) becomes the plugin config the runtime would pass: the
    /// plexus plugin (type `plexus`, daemon mode's `plexus-shim`, or `multus`) with the list's
    /// `name` and `cniVersion`. Anything else is returned as it is.
    fn plugin_of_list(value: Value) -> Value {
        let Value::Object(top) = &value else {
            return value;
        };
        if top.contains_key("type") {
            return value;
        }
        let plugin = top.get("plugins").and_then(Value::as_array).and_then(|ps| {
            ps.iter().find(|p| {
                matches!(
                    p.get("type").and_then(Value::as_str),
                    Some("plexus" | "plexus-shim" | "multus")
                )
            })
        });
        let Some(Value::Object(plugin)) = plugin else {
            return value;
        };
        let mut out = plugin.clone();
        for key in ["name", "cniVersion"] {
            if let Some(v) = top.get(key) {
                out.insert(key.into(), v.clone());
            }
        }
        Value::Object(out)
    }

    /// Parse and validate.
    pub fn parse(bytes: &[u8]) -> Result<Self, CniError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| CniError::decode("failed to parse plexus configuration", e.to_string()))?;
        let c: PlexusConfig = serde_json::from_value(Self::plugin_of_list(value))
            .map_err(|e| CniError::decode("failed to parse plexus configuration", e.to_string()))?;
        if c.cluster_network.is_empty() && c.delegates.is_empty() {
            return Err(CniError::invalid_config(
                "at least one delegate/clusterNetwork must be specified",
                "set 'clusterNetwork' or list the default network first in 'delegates'",
            ));
        }
        if !c.auxiliary_cni_chain_name.is_empty() {
            return Err(CniError::new(
                crate::error::code::UNSUPPORTED_FIELD,
                "unsupported field auxiliaryCNIChainName",
                format!(
                    "value {:?}: plexus does not implement auxiliary chains",
                    c.auxiliary_cni_chain_name
                ),
            ));
        }
        crate::bounds::check_config(&c)?;
        c.nad_policy.validate()?;
        Ok(c)
    }

    /// The inline delegates as validated conflists.
    pub fn delegate_lists(&self) -> Result<Vec<NetConfList>, CniError> {
        self.delegates
            .iter()
            .enumerate()
            .map(|(i, d)| {
                NetConfList::from_value(d.clone()).map_err(|e| e.context(format!("delegates[{i}]")))
            })
            .collect()
    }

    /// Namespaces any pod may reference under isolation (default: `default`).
    pub fn global_namespace_list(&self) -> Vec<String> {
        if self.global_namespaces.trim().is_empty() {
            return vec!["default".into()];
        }
        self.global_namespaces
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multus_thin_config_parses_with_type_changed() {
        let src = br#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"plexus",
            "kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig","confDir":"/etc/cni/multus/net.d","cniDir":"/var/lib/cni/multus",
            "binDir":"/opt/cni/bin","logFile":"/var/log/multus.log","logLevel":"debug","logToStderr":false,
            "logOptions":{"maxAge":5,"maxSize":100,"maxBackups":5,"compress":true},
            "capabilities":{"portMappings":true,"bandwidth":true},"readinessindicatorfile":"",
            "namespaceIsolation":true,"globalNamespaces":"default, shared","systemNamespaces":["kube-system"],
            "multusNamespace":"kube-system","retryDeleteOnError":false,
            "delegates":[{"cniVersion":"0.3.1","name":"cbr0","plugins":[{"type":"flannel","delegate":{"isDefaultGateway":true}},{"type":"portmap","capabilities":{"portMappings":true}}]}]}"#;
        let c = PlexusConfig::parse(src).unwrap();
        assert_eq!(c.global_namespace_list(), vec!["default", "shared"]);
        assert!(c.namespace_isolation && !c.log_to_stderr);
        assert_eq!(c.delegate_lists().unwrap()[0].plugins.len(), 2);
    }

    #[test]
    fn defaults_match_multus() {
        let c = PlexusConfig::parse(br#"{"name":"m","type":"plexus","clusterNetwork":"/etc/cni/net.d/10-flannel.conflist"}"#).unwrap();
        assert_eq!(c.conf_dir, "/etc/cni/multus/net.d");
        assert_eq!(c.bin_dir, "/opt/cni/bin");
        assert_eq!(c.multus_namespace, "kube-system");
        assert_eq!(c.system_namespaces, vec!["kube-system"]);
        assert!(c.log_to_stderr && c.events);
        assert_eq!(c.global_namespace_list(), vec!["default"]);
    }

    #[test]
    fn errors() {
        assert_eq!(PlexusConfig::parse(br#"{"name":"m"}"#).unwrap_err().code, 7);
        assert_eq!(PlexusConfig::parse(b"{").unwrap_err().code, 6);
        assert_eq!(
            PlexusConfig::parse(br#"{"delegates":[{}],"auxiliaryCNIChainName":"x"}"#)
                .unwrap_err()
                .code,
            2
        );
        let c = PlexusConfig::parse(br#"{"delegates":[{"name":"x"}]}"#).unwrap();
        assert!(c.delegate_lists().unwrap_err().msg.contains("delegates[0]"));
    }

    #[test]
    fn a_node_conflist_reads_as_its_plexus_plugin() {
        let list =
            br#"{"cniVersion":"1.0.0","name":"plexus-cni-network","plugins":[{"type":"plexus",
            "clusterNetwork":"/etc/cni/net.d/10-flannel.conflist","logLevel":"warn"}]}"#;
        let c = PlexusConfig::parse(list).unwrap();
        assert_eq!(c.plugin_type, "plexus");
        assert_eq!(c.cni_version, "1.0.0");
        assert_eq!(c.name, "plexus-cni-network");
        assert_eq!(c.cluster_network, "/etc/cni/net.d/10-flannel.conflist");
        // A list without a plexus plugin is not a plexus config.
        assert!(PlexusConfig::parse(br#"{"plugins":[{"type":"bridge"}]}"#).is_err());
        // Daemon mode's list (install.sh writes one for every primary: it carries cniVersions).
        let shim =
            br#"{"cniVersion":"0.3.1","cniVersions":["0.3.1","1.1.0"],"name":"plexus-cni-network",
            "plugins":[{"type":"plexus-shim","daemonSocket":"/run/plexus/plexus.sock",
            "clusterNetwork":"/etc/cni/net.d/10-flannel.conflist"}]}"#;
        let c = PlexusConfig::parse(shim).unwrap();
        assert_eq!(c.plugin_type, "plexus-shim");
        assert_eq!(c.cluster_network, "/etc/cni/net.d/10-flannel.conflist");
    }
}
