//! `MetaError`: what failed in plexus, with its cause kept as a typed source (a [`K8sError`],
//! an I/O or JSON error, a delegate's or a `plexus-conf` validation's [`CniError`]…) and the
//! context a user needs (pod, network, interface, container, file).
//!
//! Internal functions return `Result<_, MetaError>`; the error becomes a CNI error result
//! (`code`, `msg`, `details`) only at the edge — the `Plugin` impls (`plugin.rs`, the daemon's
//! `DaemonPlugin`), `plexus explain`'s output and the daemon-mode shim — through
//! `From<MetaError> for CniError`:
//!
//! - `code`: [`MetaError::code`], following the table of docs/design.md ("Error codes"); a
//!   wrapped `CniError` (a delegate's, or one of `plexus-conf`'s validations) keeps its own;
//! - `msg`: the short message, naming the pod, the network and the interface when known;
//! - `details`: the cause — the source chain joined with `": "` (a wrapped `CniError`
//!   contributes its own `details`, its `msg` being part of ours), or, for a failure without
//!   a cause, what to do about it.
//!
//! `Display` prints `msg: details`, exactly as the `CniError` would.

pub use crate::k8s::error_chain as chain;
use crate::k8s::{K8sError, RESOURCE_NAME_ATTR};
use plexus_conf::error::{code, CniError};
use plexus_delegates::netns::NetNsError;
use std::fmt;
use std::path::PathBuf;

/// A source error of any type (netlink, I/O, a plain message).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can make a plexus verb fail. Fields named `pod` hold the label used in
/// messages: `pod ns/name`, `container <id>` or `static delegates` (except where noted).
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    // ---- the call's own inputs ----
    /// The plexus configuration (stdin, `plexus explain --config`) is invalid: unparsable (6),
    /// an unsupported field (2) or `cniVersion` (1), an invalid value (7).
    Config {
        /// `plexus-conf`'s validation error.
        #[source]
        source: Box<CniError>,
    },
    /// `CNI_ARGS` (the runtime's, or an attachment's planned ones) cannot be parsed (4).
    CniArgs {
        /// `plexus-conf`'s parse error.
        #[source]
        source: Box<CniError>,
    },
    /// An interface name of the plan is invalid (`CNI_IFNAME`, 4).
    InterfaceName {
        /// Pod label.
        pod: String,
        /// Network the interface is for.
        network: String,
        /// `plexus-conf`'s validation error.
        #[source]
        source: Box<CniError>,
    },

    // ---- readiness (ADD, STATUS) ----
    /// ADD: the readiness indicator file did not appear within `readinessTimeoutSeconds` (11).
    NotReady {
        /// The readiness indicator file.
        file: PathBuf,
    },
    /// STATUS: the readiness indicator file does not exist (50).
    StatusNotReady {
        /// The readiness indicator file.
        file: PathBuf,
    },
    /// STATUS: a plugin of the default network is not installed (50).
    StatusPluginMissing {
        /// The default network's name.
        network: String,
        /// The plugin lookup's error.
        #[source]
        source: Box<CniError>,
    },
    /// STATUS: the default network's own STATUS failed (its code).
    StatusFailed {
        /// The default network's name.
        network: String,
        /// The delegate's error.
        #[source]
        source: Box<CniError>,
    },

    // ---- Kubernetes API ----
    /// The Kubernetes client cannot be built (kubeconfig, in-cluster config: 7).
    KubeClient {
        /// Why.
        #[source]
        source: Box<K8sError>,
    },
    /// The pod cannot be read (11 transient, 102 refused, 7 bad credentials).
    PodRead {
        /// `ns/name` of the pod.
        pod: String,
        /// The API error.
        #[source]
        source: Box<K8sError>,
    },
    /// A NetworkAttachmentDefinition cannot be read (11, 102 — e.g. 403 forbidden — or 7).
    NadRead {
        /// Pod label.
        pod: String,
        /// NAD namespace.
        ns: String,
        /// NAD name.
        name: String,
        /// The API error.
        #[source]
        source: Box<K8sError>,
    },
    /// The network-status annotation cannot be written (the attachments are undone).
    StatusWrite {
        /// Pod label.
        pod: String,
        /// The API error.
        #[source]
        source: Box<K8sError>,
    },

    // ---- requests and plan ----
    /// A networks or default-network annotation is invalid (7).
    Annotation {
        /// `ns/name` of the pod.
        pod: String,
        /// The parse error.
        #[source]
        source: Box<CniError>,
    },
    /// `namespaceIsolation`: the pod references a network outside the namespaces it may use (7).
    Isolation {
        /// `ns/name` of the pod.
        pod: String,
        /// Network namespace.
        ns: String,
        /// Network name.
        name: String,
        /// The pod's namespace.
        pod_ns: String,
        /// The other namespaces allowed.
        allowed: Vec<String>,
    },
    /// A NAD the pod references does not exist (7).
    NadNotFound {
        /// Pod label.
        pod: String,
        /// NAD namespace.
        ns: String,
        /// NAD name.
        name: String,
    },
    /// A `clusterNetwork`/`defaultNetworks` name is neither a NAD nor a config in `confDir` (7).
    NetworkNotFound {
        /// Pod label.
        pod: String,
        /// Namespace the NAD was looked for in.
        ns: String,
        /// The name.
        name: String,
        /// `confDir`.
        conf_dir: PathBuf,
    },
    /// A NAD's `spec.config` is invalid (7).
    NadInvalid {
        /// NAD namespace.
        ns: String,
        /// NAD name.
        name: String,
        /// `plexus-conf`'s validation error (its message names the NAD).
        #[source]
        source: Box<CniError>,
    },
    /// A NAD has an empty `spec.config` and `confDir` has no config of its name (7).
    NadEmpty {
        /// NAD namespace.
        ns: String,
        /// NAD name.
        name: String,
        /// `confDir`.
        conf_dir: PathBuf,
    },
    /// Neither `delegates` nor `clusterNetwork` gives a default network (7).
    NoDefaultNetwork,
    /// A network config file named by the config cannot be read (7).
    ConfigFile {
        /// The file or directory.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// A config directory named by the config holds no config file (7).
    ConfigDirEmpty {
        /// The directory.
        path: PathBuf,
    },
    /// A network config file is invalid (its code: 6 unparsable, 7 invalid, 1 version).
    ConfigParse {
        /// The file, as shown.
        file: String,
        /// `plexus-conf`'s parse error.
        #[source]
        source: Box<CniError>,
    },
    /// An attachment's delegate config is not a valid conflist.
    NetworkConfig {
        /// The network.
        network: String,
        /// `plexus-conf`'s parse error.
        #[source]
        source: Box<CniError>,
    },
    /// More networks of a device resource than devices allocated to the pod (7).
    NoDeviceLeft {
        /// Pod label.
        pod: String,
        /// The network.
        network: String,
        /// The resource name.
        resource: String,
        /// Devices of the resource allocated to the pod.
        allocated: usize,
    },
    /// The annotation requests a capability no plugin of the network declares (7).
    CapabilityNotHonoured {
        /// Pod label.
        pod: String,
        /// The network (`ns/name`).
        network: String,
        /// The capability (`mac`, `ips`…).
        capability: String,
        /// The network config's `name`.
        config_name: String,
    },
    /// Two networks of the pod ask for the same interface (7).
    DuplicateInterface {
        /// Pod label.
        pod: String,
        /// The interface.
        ifname: String,
        /// The network that asked first.
        first: String,
        /// The network that asked again.
        second: String,
    },
    /// A network's plugin is plexus or Multus itself (7).
    MetaPluginDelegate {
        /// Pod label.
        pod: String,
        /// The network.
        network: String,
        /// The plugin type.
        plugin_type: String,
    },
    /// More than one default-route gateway per IP family (7).
    MultipleDefaultRoutes {
        /// Pod label.
        pod: String,
    },
    /// A plugin (or IPAM plugin) of a network is not installed or not a valid name (7).
    PluginMissing {
        /// Pod label.
        pod: String,
        /// The network.
        network: String,
        /// The lookup's error.
        #[source]
        source: Box<CniError>,
    },
    /// A NAD's `plexus.cni.io/fixed-ips` mapping is invalid for the network, or names no
    /// address for this replica (7).
    FixedIps {
        /// Pod label.
        pod: String,
        /// `plexus-conf`'s validation or lookup error (names the network).
        #[source]
        source: Box<CniError>,
    },
    /// A static address of the plan is held by another live pod (11: retried until the holder
    /// releases it).
    AddressInUse {
        /// Pod label.
        pod: String,
        /// The network.
        network: String,
        /// The address.
        address: String,
        /// Who holds it (`pod ns/name`, with where it was seen).
        holder: String,
    },

    // ---- devices ----
    /// The kubelet's device checkpoint cannot be read (11).
    CheckpointUnreadable {
        /// Pod label.
        pod: String,
        /// The checkpoint file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The kubelet's device checkpoint is invalid (6).
    CheckpointInvalid {
        /// Pod label.
        pod: String,
        /// The parse error.
        #[source]
        source: Box<CniError>,
    },
    /// Neither the pod-resources API nor the checkpoint gave the pod's devices (the
    /// checkpoint's code).
    DevicesUnavailable {
        /// Why the checkpoint failed.
        #[source]
        source: Box<MetaError>,
        /// Why the pod-resources API failed first.
        pod_resources: PodResourcesError,
    },
    /// A ResourceClaim of the pod cannot be read (11, 102, 7).
    ClaimRead {
        /// Pod label.
        pod: String,
        /// Claim namespace.
        ns: String,
        /// Claim name.
        name: String,
        /// The API error.
        #[source]
        source: Box<K8sError>,
    },
    /// A ResourceClaim the pod's status names does not exist (11).
    ClaimMissing {
        /// Pod label.
        pod: String,
        /// Claim namespace.
        ns: String,
        /// Claim name.
        name: String,
    },
    /// A ResourceClaim has no allocation yet (11).
    ClaimNotAllocated {
        /// Pod label.
        pod: String,
        /// Claim name.
        name: String,
    },
    /// The ResourceSlices of a DRA driver cannot be listed (11, 102, 7).
    SliceList {
        /// Pod label.
        pod: String,
        /// The driver.
        driver: String,
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: Box<K8sError>,
    },
    /// An allocated DRA device is in no ResourceSlice of the node (7).
    DraDeviceUnpublished {
        /// Pod label.
        pod: String,
        /// The device: `driver/pool/device`.
        device: String,
        /// Claim name.
        claim: String,
        /// Node.
        node: String,
    },
    /// A DRA device's resourceName differs from the extended resource mapped to it (7).
    DraResourceMismatch {
        /// Pod label.
        pod: String,
        /// Device.
        device: String,
        /// Claim name.
        claim: String,
        /// The device's resourceName.
        got: String,
        /// The extended resource.
        wanted: String,
    },
    /// `plexus explain`: a ResourceClaim or ResourceSlice manifest is invalid (6).
    Manifest {
        /// `a claim`, `a slice`.
        what: &'static str,
        /// The manifest.
        manifest: String,
        /// The decode error.
        #[source]
        source: serde_json::Error,
    },

    // ---- attach ----
    /// ADD: the pod network namespace cannot be opened (3).
    NetnsOpen {
        /// Pod label.
        pod: String,
        /// Why.
        #[source]
        source: NetNsError,
    },
    /// The pod network namespace cannot be entered (999).
    NetnsEnter {
        /// Why.
        #[source]
        source: NetNsError,
    },
    /// The interface an attachment wants already exists in the pod (7).
    InterfaceExists {
        /// The interface.
        ifname: String,
    },
    /// The plan cannot be run (an attachment's config or CNI_ARGS is invalid).
    PlanInvalid {
        /// Pod label.
        pod: String,
        /// Why.
        #[source]
        source: Box<MetaError>,
    },
    /// A delegate failed: its own error, code kept.
    Delegate {
        /// The delegate's error.
        #[source]
        source: Box<CniError>,
    },
    /// Setting the default route in the pod failed (999).
    Route {
        /// The interface.
        ifname: String,
        /// The step (`find interface`, `add default via …`).
        what: String,
        /// The netlink (or netns) error.
        #[source]
        source: BoxError,
    },
    /// The delegate's cached result cannot be updated (its code).
    ResultCache {
        /// The cache's error.
        #[source]
        source: Box<CniError>,
    },
    /// One attachment of the plan failed (ADD, DEL, CHECK).
    Attachment {
        /// Pod label.
        pod: String,
        /// The network.
        network: String,
        /// The interface.
        ifname: String,
        /// Why.
        #[source]
        source: Box<MetaError>,
    },
    /// A rollback DEL failed after a failed ADD.
    Rollback {
        /// Pod label.
        pod: String,
        /// The network.
        network: String,
        /// The interface.
        ifname: String,
        /// The delegate's error.
        #[source]
        source: Box<CniError>,
    },
    /// ADD failed and some of its rollback DELs failed too (the failure's code).
    RollbackFailed {
        /// The ADD failure.
        #[source]
        source: Box<MetaError>,
        /// The failed rollbacks ([`MetaError::Rollback`]).
        rollback: Vec<MetaError>,
    },
    /// Several failures (DEL, GC attempt everything): the first one's code and message, every
    /// one in the details.
    Combined(Vec<MetaError>),

    // ---- state under cniDir ----
    /// The per-container lock cannot be taken: busy (11) or an I/O failure (5).
    Lock {
        /// Container.
        container_id: String,
        /// The lock file.
        path: PathBuf,
        /// Why (`TimedOut`: busy).
        #[source]
        source: std::io::Error,
    },
    /// The plan cannot be encoded (999).
    PlanEncode {
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The plan cannot be saved (5).
    PlanSave {
        /// The plan file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The plan cannot be read: over its size cap (6) or an I/O failure (5).
    PlanRead {
        /// The plan file.
        path: PathBuf,
        /// Why (`InvalidData`: too large).
        #[source]
        source: std::io::Error,
    },
    /// The plan is not a plexus plan (6).
    CorruptPlan {
        /// The plan file.
        path: PathBuf,
        /// The decode error (`None`: valid JSON of another kind).
        #[source]
        source: Option<serde_json::Error>,
    },
    /// The plan cannot be removed (5).
    PlanRemove {
        /// The plan file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },

    // ---- verbs ----
    /// ADD for a container whose networks are attached (7).
    AlreadyAttached {
        /// Pod label.
        pod: String,
        /// Container.
        container_id: String,
        /// `CNI_IFNAME`.
        ifname: String,
    },
    /// CHECK for a container without a saved plan (3).
    NotAttached {
        /// Container.
        container_id: String,
    },
    /// DEL: the networks are deleted but the plan cannot be removed (5).
    PlanNotRemoved {
        /// Pod label.
        pod: String,
        /// The removal's error ([`MetaError::PlanRemove`]).
        #[source]
        source: Box<MetaError>,
    },
    /// DEL: the networks are deleted but some cached results cannot be removed (5).
    ResultsLeft {
        /// Pod label.
        pod: String,
        /// `cniDir`.
        cni_dir: String,
        /// `network (ifname)` of each entry left.
        left: Vec<String>,
    },
    /// `plexus explain`: an input file cannot be read (5).
    ReadFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `plexus explain`: an input file is not JSON (6).
    JsonFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// Daemon mode: the daemon is unreachable and ADD does not fall back to thin mode (11).
    DaemonUnreachable {
        /// The socket.
        socket: String,
        /// Why no in-process ADD.
        why: &'static str,
        /// The connection error.
        #[source]
        source: std::io::Error,
    },
    /// Daemon mode: the daemon took the ADD and gave no answer (11).
    DaemonNoAnswer {
        /// The socket.
        socket: String,
        /// The connection error.
        #[source]
        source: std::io::Error,
    },
    /// The call's async runtime cannot start (999).
    Runtime {
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A broken invariant of plexus itself (999).
    Internal {
        /// What.
        what: &'static str,
    },
}

fn prefixed(prefix: impl fmt::Display, inner: &str) -> String {
    format!("{prefix}: {inner}")
}

impl MetaError {
    /// The CNI error code, as docs/design.md's table lists it.
    pub fn code(&self) -> u32 {
        use MetaError::*;
        match self {
            Config { source }
            | CniArgs { source }
            | InterfaceName { source, .. }
            | StatusFailed { source, .. }
            | Annotation { source, .. }
            | NadInvalid { source, .. }
            | ConfigParse { source, .. }
            | NetworkConfig { source, .. }
            | PluginMissing { source, .. }
            | FixedIps { source, .. }
            | CheckpointInvalid { source, .. }
            | Delegate { source }
            | ResultCache { source }
            | Rollback { source, .. } => source.code,
            DevicesUnavailable { source, .. }
            | PlanInvalid { source, .. }
            | Attachment { source, .. }
            | RollbackFailed { source, .. } => source.code(),
            Combined(all) => all.first().map_or(code::INTERNAL, MetaError::code),
            KubeClient { source }
            | PodRead { source, .. }
            | NadRead { source, .. }
            | StatusWrite { source, .. }
            | ClaimRead { source, .. }
            | SliceList { source, .. } => source.cni_code(),
            NotReady { .. }
            | CheckpointUnreadable { .. }
            | ClaimMissing { .. }
            | ClaimNotAllocated { .. }
            | DaemonUnreachable { .. }
            | DaemonNoAnswer { .. }
            | AddressInUse { .. } => code::TRY_AGAIN_LATER,
            StatusNotReady { .. } | StatusPluginMissing { .. } => code::NOT_AVAILABLE,
            Isolation { .. }
            | NadNotFound { .. }
            | NetworkNotFound { .. }
            | NadEmpty { .. }
            | NoDefaultNetwork
            | ConfigFile { .. }
            | ConfigDirEmpty { .. }
            | NoDeviceLeft { .. }
            | CapabilityNotHonoured { .. }
            | DuplicateInterface { .. }
            | MetaPluginDelegate { .. }
            | MultipleDefaultRoutes { .. }
            | DraDeviceUnpublished { .. }
            | DraResourceMismatch { .. }
            | InterfaceExists { .. }
            | AlreadyAttached { .. } => code::INVALID_CONFIG,
            Manifest { .. } | CorruptPlan { .. } | JsonFile { .. } => code::DECODE_FAILURE,
            NetnsOpen { .. } | NotAttached { .. } => code::UNKNOWN_CONTAINER,
            Lock { source, .. } if source.kind() == std::io::ErrorKind::TimedOut => {
                code::TRY_AGAIN_LATER
            }
            PlanRead { source, .. } if source.kind() == std::io::ErrorKind::InvalidData => {
                code::DECODE_FAILURE
            }
            Lock { .. }
            | PlanSave { .. }
            | PlanRead { .. }
            | PlanRemove { .. }
            | PlanNotRemoved { .. }
            | ResultsLeft { .. }
            | ReadFile { .. } => code::IO_FAILURE,
            NetnsEnter { .. }
            | Route { .. }
            | PlanEncode { .. }
            | Runtime { .. }
            | Internal { .. } => code::INTERNAL,
        }
    }

    /// The CNI `msg`: what failed, naming the pod, network and interface when known.
    pub fn msg(&self) -> String {
        self.describe().0
    }

    /// The CNI `details`: the cause.
    pub fn details(&self) -> String {
        self.describe().1
    }

    /// `(msg, details)`.
    fn describe(&self) -> (String, String) {
        use MetaError::*;
        let cause = |e: &(dyn std::error::Error + 'static)| chain(e);
        let at = |p: &std::path::Path, e: &(dyn std::error::Error + 'static)| {
            format!("{}: {}", p.display(), chain(e))
        };
        match self {
            Config { source }
            | CniArgs { source }
            | NadInvalid { source, .. }
            | Delegate { source }
            | ResultCache { source } => (source.msg.clone(), source.details.clone()),
            InterfaceName {
                pod,
                network,
                source,
            }
            | PluginMissing {
                pod,
                network,
                source,
            } => (
                prefixed(format_args!("{pod}, network {network}"), &source.msg),
                source.details.clone(),
            ),
            NotReady { file } | StatusNotReady { file } => (
                "the default network is not ready".into(),
                format!("readiness indicator file {} does not exist", file.display()),
            ),
            StatusPluginMissing { network, source } | StatusFailed { network, source } => (
                prefixed(format_args!("default network {network}"), &source.msg),
                source.details.clone(),
            ),
            KubeClient { source } => ("cannot build the Kubernetes client".into(), cause(source)),
            PodRead { pod, source } => (format!("pod {pod}: cannot read the pod"), cause(source)),
            NadRead {
                pod,
                ns,
                name,
                source,
            } => (
                format!("{pod}, network {ns}/{name}: cannot read the NetworkAttachmentDefinition"),
                cause(source),
            ),
            StatusWrite { pod, source } => (
                format!("{pod}: cannot write the network-status annotation"),
                cause(source),
            ),
            Annotation { pod, source } => (
                prefixed(format_args!("pod {pod}"), &source.msg),
                source.details.clone(),
            ),
            Isolation {
                pod,
                ns,
                name,
                pod_ns,
                allowed,
            } => (
                format!("pod {pod}, network {ns}/{name}: namespace isolation violation"),
                format!("namespaceIsolation is on: pods in {pod_ns:?} may reference networks in their own namespace or in {allowed:?}"),
            ),
            NadNotFound { pod, ns, name } => (
                format!("{pod}, network {ns}/{name}: NetworkAttachmentDefinition not found"),
                format!("create network-attachment-definitions.k8s.cni.cncf.io {name} in namespace {ns}, or fix the pod annotation"),
            ),
            NetworkNotFound {
                pod,
                ns,
                name,
                conf_dir,
            } => (
                format!("{pod}: cannot find network {name:?}"),
                format!(
                    "no NetworkAttachmentDefinition {ns}/{name} and no config named {name:?} in {}",
                    conf_dir.display()
                ),
            ),
            NadEmpty { ns, name, conf_dir } => (
                format!("network {ns}/{name}: the NAD has an empty spec.config and no config of that name exists"),
                format!("looked in {}", conf_dir.display()),
            ),
            NoDefaultNetwork => (
                "at least one delegate/clusterNetwork must be specified".into(),
                String::new(),
            ),
            ConfigFile { path, source } => (
                format!("cannot load network config {}", path.display()),
                cause(source),
            ),
            ConfigDirEmpty { path } => (
                format!("cannot load network config {}", path.display()),
                "no .conf, .conflist or .json file in directory".into(),
            ),
            ConfigParse { file, source } => (prefixed(file, &source.msg), source.details.clone()),
            NetworkConfig { network, source } => (
                prefixed(format_args!("network {network}"), &source.msg),
                source.details.clone(),
            ),
            NoDeviceLeft {
                pod,
                network,
                resource,
                allocated,
            } => (
                format!("{pod}, network {network}: no device of resource {resource:?} is left for it"),
                format!("the kubelet allocated {allocated} device(s) of {resource} to the pod; request one more in a container's resources"),
            ),
            CapabilityNotHonoured {
                pod,
                network,
                capability,
                config_name,
            } => (
                format!("{pod}, network {network}: the request for {capability:?} cannot be honoured"),
                format!("no plugin of network {config_name:?} declares capabilities {{\"{capability}\": true}}; add it to the NAD's plugin config"),
            ),
            DuplicateInterface {
                pod,
                ifname,
                first,
                second,
            } => (
                format!("{pod}: interface name {ifname:?} is requested twice"),
                format!("networks {first} and {second} both use it"),
            ),
            MetaPluginDelegate {
                pod,
                network,
                plugin_type,
            } => (
                format!("{pod}, network {network}: a meta-plugin cannot be a delegate"),
                format!("plugin type {plugin_type:?} would run plexus (or Multus) again with a config the network's author chose"),
            ),
            MultipleDefaultRoutes { pod } => (
                format!("{pod}: more than one default-route gateway per IP family"),
                "ECMP default routes are not supported: request one IPv4 and one IPv6 gateway at most".into(),
            ),
            FixedIps { pod, source } => (prefixed(pod, &source.msg), source.details.clone()),
            AddressInUse {
                pod,
                network,
                address,
                holder,
            } => (
                format!("{pod}, network {network}: address {address} is in use by {holder}"),
                "plexus never hands out one address twice: the ADD is retried and succeeds once the holder is gone (a replica still terminating); otherwise give each pod its own address (fixed-ips mapping, annotation ips, NAD static IPAM)".into(),
            ),
            CheckpointUnreadable { pod, path, source } => (
                format!("{pod}: cannot find the devices the kubelet allocated"),
                format!(
                    "the device checkpoint {} is unreadable: {}",
                    path.display(),
                    cause(source)
                ),
            ),
            CheckpointInvalid { pod, source } => {
                (prefixed(pod, &source.msg), source.details.clone())
            }
            DevicesUnavailable {
                source,
                pod_resources,
            } => {
                let (msg, details) = source.describe();
                (
                    msg,
                    format!("{details}; pod-resources: {}", cause(pod_resources)),
                )
            }
            ClaimRead {
                pod,
                ns,
                name,
                source,
            } => (
                format!("{pod}: cannot read ResourceClaim {ns}/{name}"),
                cause(source),
            ),
            ClaimMissing { pod, ns, name } => (
                format!("{pod}: ResourceClaim {ns}/{name} does not exist"),
                "the pod's status names a claim the API server does not have".into(),
            ),
            ClaimNotAllocated { pod, name } => (
                format!("{pod}: ResourceClaim {name} is not allocated"),
                "the claim has no status.allocation yet; the scheduler allocates it before the pod starts".into(),
            ),
            SliceList {
                pod,
                driver,
                node,
                source,
            } => (
                format!("{pod}: cannot list the ResourceSlices of driver {driver} on node {node}"),
                cause(source),
            ),
            DraDeviceUnpublished {
                pod,
                device,
                claim,
                node,
            } => (
                format!("{pod}: device {device} of ResourceClaim {claim} is not in any ResourceSlice of node {node}"),
                "the DRA driver has not published it (or unpublished it); the claim cannot be used".into(),
            ),
            DraResourceMismatch {
                pod,
                device,
                claim,
                got,
                wanted,
            } => (
                format!("{pod}: device {device} of ResourceClaim {claim} has resourceName {got}, but the pod's extended resource {wanted} maps to it"),
                format!(
                    "attribute {} must equal the extended resource name",
                    RESOURCE_NAME_ATTR
                ),
            ),
            Manifest { what, manifest, .. } => {
                (format!("{what} is not a valid manifest"), manifest.clone())
            }
            NetnsOpen { pod, source } => (
                format!("{pod}: cannot open the pod network namespace"),
                cause(source),
            ),
            NetnsEnter { source } => ("enter netns".into(), cause(source)),
            InterfaceExists { ifname } => (
                format!("interface {ifname} already exists in the pod"),
                "another network or a previous ADD created it".into(),
            ),
            PlanInvalid { pod, source } => {
                let (msg, details) = source.describe();
                (prefixed(pod, &msg), details)
            }
            Route {
                ifname,
                what,
                source,
            } => (
                format!("default-route on {ifname}: {what}"),
                cause(source.as_ref()),
            ),
            Attachment {
                pod,
                network,
                ifname,
                source,
            } => {
                let (msg, details) = source.describe();
                (
                    prefixed(format_args!("{pod}, network {network} ({ifname})"), &msg),
                    details,
                )
            }
            Rollback {
                pod,
                network,
                ifname,
                source,
            } => (
                prefixed(
                    format_args!("rollback of {pod}, network {network} ({ifname})"),
                    &source.msg,
                ),
                source.details.clone(),
            ),
            RollbackFailed { source, rollback } => {
                let (msg, details) = source.describe();
                let rollback: Vec<String> = rollback.iter().map(ToString::to_string).collect();
                (
                    msg,
                    format!("{details}; rollback also failed: {}", rollback.join(" / ")),
                )
            }
            Combined(all) => {
                let msg = all.first().map(MetaError::msg).unwrap_or_default();
                let every: Vec<String> = all.iter().map(ToString::to_string).collect();
                (msg, every.join(" / "))
            }
            Lock {
                container_id,
                path,
                source,
            } => (
                format!("container {container_id}: cannot take the plexus lock"),
                at(path, source),
            ),
            PlanEncode { source } => ("failed to encode plan".into(), cause(source)),
            PlanSave { path, source } => {
                ("failed to save the attachment plan".into(), at(path, source))
            }
            PlanRead { path, source } => {
                ("failed to read the attachment plan".into(), at(path, source))
            }
            CorruptPlan { path, .. } => (
                "corrupt attachment plan".into(),
                path.display().to_string(),
            ),
            PlanRemove { path, source } => (
                "failed to remove the attachment plan".into(),
                at(path, source),
            ),
            AlreadyAttached {
                pod,
                container_id,
                ifname,
            } => (
                format!("{pod}: container {container_id} already has its networks attached on {ifname}"),
                "DEL it first; the runtime must not ADD twice without a DEL".into(),
            ),
            NotAttached { container_id } => (
                format!("container {container_id}: no attachments recorded"),
                "CHECK needs a successful ADD first".into(),
            ),
            PlanNotRemoved { pod, source } => (
                format!("{pod}: networks deleted, but plexus cannot remove its plan"),
                source.details(),
            ),
            ResultsLeft { pod, cni_dir, left } => (
                format!("{pod}: networks deleted, but plexus cannot remove their cached results"),
                format!("left in {cni_dir}/results: {}", left.join(", ")),
            ),
            ReadFile { path, source } => (format!("cannot read {path}"), cause(source)),
            JsonFile { path, source } => (format!("{path} is not valid JSON"), cause(source)),
            DaemonUnreachable {
                socket,
                why,
                source,
            } => (
                format!("the plexus daemon at {socket} is unreachable"),
                format!("{}; no in-process ADD: {why}", cause(source)),
            ),
            DaemonNoAnswer { socket, source } => (
                format!("the plexus daemon at {socket} did not answer the ADD"),
                format!(
                    "{}; the runtime's DEL undoes whatever it started, from the saved plan",
                    cause(source)
                ),
            ),
            Runtime { source } => ("failed to start the async runtime".into(), cause(source)),
            Internal { what } => ((*what).to_string(), String::new()),
        }
    }

    /// The CNI error result this error is reported as.
    pub fn to_cni(&self) -> CniError {
        let (msg, details) = self.describe();
        CniError::new(self.code(), msg, details)
    }

    /// `None` for no errors, the error itself for one, [`MetaError::Combined`] for several.
    pub fn combine(mut errors: Vec<MetaError>) -> Option<MetaError> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(MetaError::Combined(errors)),
        }
    }
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (msg, details) = self.describe();
        if details.is_empty() {
            f.write_str(&msg)
        } else {
            write!(f, "{msg}: {details}")
        }
    }
}

impl From<MetaError> for CniError {
    fn from(e: MetaError) -> CniError {
        e.to_cni()
    }
}

/// Why the pod-resources API gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The socket file does not exist (no kubelet API here; use the checkpoint file).
    #[error("kubelet pod-resources socket {0} does not exist")]
    NoSocket(PathBuf),
    /// The socket exists but nothing accepted the connection or the HTTP/2 handshake.
    #[error("cannot connect to kubelet pod-resources socket {}: {message}", socket.display())]
    Connect {
        /// Socket path.
        socket: PathBuf,
        /// What failed.
        message: String,
    },
    /// The kubelet answered a call with an error status.
    #[error("kubelet pod-resources {method} failed: {code:?}: {message}")]
    Rpc {
        /// gRPC method path.
        method: &'static str,
        /// gRPC status code.
        code: tonic::Code,
        /// Status message.
        message: String,
    },
    /// No complete answer within the bound.
    #[error("kubelet pod-resources API did not answer within {0:?}")]
    Timeout(std::time::Duration),
}

impl PodResourcesError {
    /// True when the API could not be reached at all (no socket, refused, hung, or a transport
    /// status), so another source (the checkpoint file) may be tried; false when the kubelet
    /// answered with an application error.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::NoSocket(_) | Self::Connect { .. } | Self::Timeout(_) => true,
            Self::Rpc { code, .. } => matches!(
                code,
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::io::{Error as IoError, ErrorKind};

    fn io(kind: ErrorKind) -> IoError {
        IoError::new(kind, "boom")
    }

    fn json_err() -> serde_json::Error {
        serde_json::from_str::<serde_json::Value>("{").unwrap_err()
    }

    fn api(code: u16) -> Box<K8sError> {
        Box::new(K8sError::Api {
            what: "get pod",
            ns: "db".into(),
            name: "p".into(),
            code,
            reason: "R".into(),
            message: "m".into(),
        })
    }

    fn cni(code: u32) -> Box<CniError> {
        Box::new(CniError::new(code, "inner", "why"))
    }

    fn s(v: &str) -> String {
        v.to_string()
    }

    /// The variant's name; exhaustive, so a new variant cannot be left out of the table.
    fn name(e: &MetaError) -> &'static str {
        use MetaError::*;
        match e {
            Config { .. } => "Config",
            CniArgs { .. } => "CniArgs",
            InterfaceName { .. } => "InterfaceName",
            NotReady { .. } => "NotReady",
            StatusNotReady { .. } => "StatusNotReady",
            StatusPluginMissing { .. } => "StatusPluginMissing",
            StatusFailed { .. } => "StatusFailed",
            KubeClient { .. } => "KubeClient",
            PodRead { .. } => "PodRead",
            NadRead { .. } => "NadRead",
            StatusWrite { .. } => "StatusWrite",
            Annotation { .. } => "Annotation",
            Isolation { .. } => "Isolation",
            NadNotFound { .. } => "NadNotFound",
            NetworkNotFound { .. } => "NetworkNotFound",
            NadInvalid { .. } => "NadInvalid",
            NadEmpty { .. } => "NadEmpty",
            NoDefaultNetwork => "NoDefaultNetwork",
            ConfigFile { .. } => "ConfigFile",
            ConfigDirEmpty { .. } => "ConfigDirEmpty",
            ConfigParse { .. } => "ConfigParse",
            NetworkConfig { .. } => "NetworkConfig",
            NoDeviceLeft { .. } => "NoDeviceLeft",
            CapabilityNotHonoured { .. } => "CapabilityNotHonoured",
            DuplicateInterface { .. } => "DuplicateInterface",
            MetaPluginDelegate { .. } => "MetaPluginDelegate",
            MultipleDefaultRoutes { .. } => "MultipleDefaultRoutes",
            PluginMissing { .. } => "PluginMissing",
            FixedIps { .. } => "FixedIps",
            AddressInUse { .. } => "AddressInUse",
            CheckpointUnreadable { .. } => "CheckpointUnreadable",
            CheckpointInvalid { .. } => "CheckpointInvalid",
            DevicesUnavailable { .. } => "DevicesUnavailable",
            ClaimRead { .. } => "ClaimRead",
            ClaimMissing { .. } => "ClaimMissing",
            ClaimNotAllocated { .. } => "ClaimNotAllocated",
            SliceList { .. } => "SliceList",
            DraDeviceUnpublished { .. } => "DraDeviceUnpublished",
            DraResourceMismatch { .. } => "DraResourceMismatch",
            Manifest { .. } => "Manifest",
            NetnsOpen { .. } => "NetnsOpen",
            NetnsEnter { .. } => "NetnsEnter",
            InterfaceExists { .. } => "InterfaceExists",
            PlanInvalid { .. } => "PlanInvalid",
            Delegate { .. } => "Delegate",
            Route { .. } => "Route",
            ResultCache { .. } => "ResultCache",
            Attachment { .. } => "Attachment",
            Rollback { .. } => "Rollback",
            RollbackFailed { .. } => "RollbackFailed",
            Combined(_) => "Combined",
            Lock { .. } => "Lock",
            PlanEncode { .. } => "PlanEncode",
            PlanSave { .. } => "PlanSave",
            PlanRead { .. } => "PlanRead",
            CorruptPlan { .. } => "CorruptPlan",
            PlanRemove { .. } => "PlanRemove",
            AlreadyAttached { .. } => "AlreadyAttached",
            NotAttached { .. } => "NotAttached",
            PlanNotRemoved { .. } => "PlanNotRemoved",
            ResultsLeft { .. } => "ResultsLeft",
            ReadFile { .. } => "ReadFile",
            JsonFile { .. } => "JsonFile",
            DaemonUnreachable { .. } => "DaemonUnreachable",
            DaemonNoAnswer { .. } => "DaemonNoAnswer",
            Runtime { .. } => "Runtime",
            Internal { .. } => "Internal",
        }
    }

    const ALL: usize = 67;

    /// One example per variant (several where the code depends on the cause) and the code
    /// docs/design.md's "Error codes" table gives it. One row per line: a table.
    #[rustfmt::skip]
    fn table() -> Vec<(MetaError, u32)> {
        use MetaError::*;
        let pod = || s("pod db/p");
        let attachment = |source: MetaError| Attachment { pod: pod(), network: s("db/mv"), ifname: s("net1"), source: Box::new(source) };
        let rollback = |code| Rollback { pod: pod(), network: s("cbr0"), ifname: s("eth0"), source: cni(code) };
        let unreadable = || CheckpointUnreadable { pod: pod(), path: "/cp".into(), source: io(ErrorKind::NotFound) };
        vec![
            // 1, 2, 6, 7 from the config's own validation; 4 for CNI_ARGS and CNI_IFNAME.
            (Config { source: cni(1) }, 1),
            (Config { source: cni(2) }, 2),
            (Config { source: cni(6) }, 6),
            (CniArgs { source: cni(4) }, 4),
            (InterfaceName { pod: pod(), network: s("cbr0"), source: cni(4) }, 4),
            // Readiness: 11 at ADD, 50 at STATUS.
            (NotReady { file: "/r".into() }, 11),
            (StatusNotReady { file: "/r".into() }, 50),
            (StatusPluginMissing { network: s("cbr0"), source: cni(7) }, 50),
            (StatusFailed { network: s("cbr0"), source: cni(51) }, 51),
            // Kubernetes: 11 transient, 102 refused, 7 credentials / kubeconfig.
            (KubeClient { source: Box::new(K8sError::Kubeconfig { path: "/k".into(), reason: s("r") }) }, 7),
            (PodRead { pod: s("db/p"), source: api(503) }, 11),
            (PodRead { pod: s("db/p"), source: api(401) }, 7),
            (NadRead { pod: pod(), ns: s("db"), name: s("mv"), source: api(403) }, 102),
            (StatusWrite { pod: pod(), source: api(422) }, 102),
            (StatusWrite { pod: pod(), source: Box::new(K8sError::PodReplaced { ns: s("db"), name: s("p"), uid: s("u") }) }, 102),
            // 7: annotations, NADs, isolation, plan checks.
            (Annotation { pod: s("db/p"), source: cni(7) }, 7),
            (Isolation { pod: s("db/p"), ns: s("x"), name: s("n"), pod_ns: s("db"), allowed: vec![] }, 7),
            (NadNotFound { pod: pod(), ns: s("db"), name: s("mv") }, 7),
            (NetworkNotFound { pod: pod(), ns: s("kube-system"), name: s("cbr0"), conf_dir: "/c".into() }, 7),
            (NadInvalid { ns: s("db"), name: s("mv"), source: cni(7) }, 7),
            (NadEmpty { ns: s("db"), name: s("mv"), conf_dir: "/c".into() }, 7),
            (NoDefaultNetwork, 7),
            (ConfigFile { path: "/f".into(), source: io(ErrorKind::NotFound) }, 7),
            (ConfigDirEmpty { path: "/d".into() }, 7),
            (ConfigParse { file: s("/f"), source: cni(6) }, 6),
            (NetworkConfig { network: s("db/mv"), source: cni(7) }, 7),
            (NoDeviceLeft { pod: pod(), network: s("db/vf"), resource: s("r"), allocated: 1 }, 7),
            (CapabilityNotHonoured { pod: pod(), network: s("db/mv"), capability: s("mac"), config_name: s("mv") }, 7),
            (DuplicateInterface { pod: pod(), ifname: s("eth0"), first: s("a"), second: s("b") }, 7),
            (MetaPluginDelegate { pod: pod(), network: s("db/l"), plugin_type: s("multus") }, 7),
            (MultipleDefaultRoutes { pod: pod() }, 7),
            (PluginMissing { pod: pod(), network: s("db/mv"), source: cni(7) }, 7),
            (FixedIps { pod: pod(), source: cni(7) }, 7),
            (AddressInUse { pod: pod(), network: s("db/mv"), address: s("10.1.1.5"), holder: s("pod db/q") }, 11),
            // Devices: 11 while the kubelet or the scheduler may still provide them.
            (unreadable(), 11),
            (CheckpointInvalid { pod: pod(), source: cni(6) }, 6),
            (DevicesUnavailable { source: Box::new(unreadable()), pod_resources: PodResourcesError::NoSocket("/s".into()) }, 11),
            (ClaimRead { pod: pod(), ns: s("db"), name: s("c"), source: api(403) }, 102),
            (ClaimMissing { pod: pod(), ns: s("db"), name: s("c") }, 11),
            (ClaimNotAllocated { pod: pod(), name: s("c") }, 11),
            (SliceList { pod: pod(), driver: s("d"), node: s("n"), source: api(500) }, 11),
            (DraDeviceUnpublished { pod: pod(), device: s("d/p/v"), claim: s("c"), node: s("n") }, 7),
            (DraResourceMismatch { pod: pod(), device: s("v"), claim: s("c"), got: s("a"), wanted: s("b") }, 7),
            (Manifest { what: "a claim", manifest: s("{}"), source: json_err() }, 6),
            // Attach: 3 netns gone at ADD, 999 plexus' own netns / netlink work, delegates'
            // codes kept through every wrapper.
            (NetnsOpen { pod: pod(), source: NetNsError::NotFound("/n".into()) }, 3),
            (NetnsEnter { source: NetNsError::NotFound("/n".into()) }, 999),
            (InterfaceExists { ifname: s("net1") }, 7),
            (PlanInvalid { pod: pod(), source: Box::new(CniArgs { source: cni(4) }) }, 4),
            (Delegate { source: cni(100) }, 100),
            (Delegate { source: cni(110) }, 110),
            (Route { ifname: s("net1"), what: s("find interface"), source: "not found".into() }, 999),
            (ResultCache { source: cni(5) }, 5),
            (attachment(Delegate { source: cni(101) }), 101),
            (rollback(11), 11),
            (RollbackFailed { source: Box::new(attachment(Delegate { source: cni(42) })), rollback: vec![rollback(100)] }, 42),
            (Combined(vec![attachment(Delegate { source: cni(112) }), attachment(Delegate { source: cni(100) })]), 112),
            // State: 5 I/O, 6 unusable content, 11 lock busy.
            (Lock { container_id: s("c"), path: "/l".into(), source: io(ErrorKind::TimedOut) }, 11),
            (Lock { container_id: s("c"), path: "/l".into(), source: io(ErrorKind::ReadOnlyFilesystem) }, 5),
            (PlanEncode { source: json_err() }, 999),
            (PlanSave { path: "/p".into(), source: io(ErrorKind::StorageFull) }, 5),
            (PlanRead { path: "/p".into(), source: io(ErrorKind::InvalidData) }, 6),
            (PlanRead { path: "/p".into(), source: io(ErrorKind::PermissionDenied) }, 5),
            (CorruptPlan { path: "/p".into(), source: None }, 6),
            (PlanRemove { path: "/p".into(), source: io(ErrorKind::PermissionDenied) }, 5),
            // Verbs.
            (AlreadyAttached { pod: pod(), container_id: s("c"), ifname: s("eth0") }, 7),
            (NotAttached { container_id: s("c") }, 3),
            (PlanNotRemoved { pod: pod(), source: Box::new(PlanRemove { path: "/p".into(), source: io(ErrorKind::PermissionDenied) }) }, 5),
            (ResultsLeft { pod: pod(), cni_dir: s("/var/lib/cni/plexus"), left: vec![s("mv (net1)")] }, 5),
            (ReadFile { path: s("/f"), source: io(ErrorKind::NotFound) }, 5),
            (JsonFile { path: s("/f"), source: json_err() }, 6),
            (DaemonUnreachable { socket: s("/s"), why: "w", source: io(ErrorKind::ConnectionRefused) }, 11),
            (DaemonNoAnswer { socket: s("/s"), source: io(ErrorKind::UnexpectedEof) }, 11),
            (Runtime { source: io(ErrorKind::Other) }, 999),
            (Internal { what: "no default network result" }, 999),
        ]
    }

    #[test]
    fn every_variant_has_the_code_of_the_design_table() {
        let mut seen = BTreeSet::new();
        for (e, want) in table() {
            assert_eq!(e.code(), want, "{} {e:?}", name(&e));
            seen.insert(name(&e));
            // The wire form carries the same code.
            assert_eq!(CniError::from(e).code, want);
        }
        assert_eq!(seen.len(), ALL, "one example per variant: {seen:?}");
    }

    #[test]
    fn the_wire_form_names_the_pod_and_keeps_the_cause() {
        let e = MetaError::NadRead {
            pod: s("pod db/p"),
            ns: s("db"),
            name: s("mv"),
            source: api(403),
        };
        let c = CniError::from(e);
        assert_eq!(
            (c.code, c.msg.as_str(), c.details.as_str()),
            (
                102,
                "pod db/p, network db/mv: cannot read the NetworkAttachmentDefinition",
                "get pod db/p: HTTP 403 R: m"
            )
        );
        // Display is exactly the CniError's.
        let e = MetaError::Lock {
            container_id: s("c1"),
            path: "/var/lib/cni/plexus/locks/c1.lock".into(),
            source: io(ErrorKind::ReadOnlyFilesystem),
        };
        assert_eq!(e.to_string(), e.to_cni().to_string());
        assert_eq!(
            e.to_string(),
            "container c1: cannot take the plexus lock: /var/lib/cni/plexus/locks/c1.lock: boom"
        );
        // The typed cause stays reachable through `source()`.
        let src = std::error::Error::source(&e).unwrap();
        assert_eq!(
            src.downcast_ref::<IoError>().unwrap().kind(),
            ErrorKind::ReadOnlyFilesystem
        );
    }

    #[test]
    fn wrappers_prefix_the_message_and_keep_the_delegates_code() {
        let failed = MetaError::Attachment {
            pod: s("pod db/p"),
            network: s("db/mv"),
            ifname: s("net1"),
            source: Box::new(MetaError::Delegate {
                source: Box::new(CniError::new(
                    42,
                    "plugin macvlan ADD: boom",
                    "exit status 1",
                )),
            }),
        };
        let rolled = MetaError::RollbackFailed {
            source: Box::new(failed),
            rollback: vec![MetaError::Rollback {
                pod: s("pod db/p"),
                network: s("cbr0"),
                ifname: s("eth0"),
                source: Box::new(CniError::new(
                    100,
                    "plugin bridge DEL: plugin failed",
                    "exit status 2",
                )),
            }],
        };
        let c = rolled.to_cni();
        assert_eq!(c.code, 42);
        assert_eq!(
            c.msg,
            "pod db/p, network db/mv (net1): plugin macvlan ADD: boom"
        );
        assert_eq!(
            c.details,
            "exit status 1; rollback also failed: rollback of pod db/p, network cbr0 (eth0): plugin bridge DEL: plugin failed: exit status 2"
        );
        // Several failures: the first one's code and message, every one in the details.
        let all = MetaError::combine(vec![
            MetaError::Delegate {
                source: Box::new(CniError::new(7, "a", "x")),
            },
            MetaError::Delegate {
                source: Box::new(CniError::new(11, "b", "")),
            },
        ])
        .unwrap();
        let c = all.to_cni();
        assert_eq!(
            (c.code, c.msg.as_str(), c.details.as_str()),
            (7, "a", "a: x / b")
        );
        assert!(MetaError::combine(vec![]).is_none());
        assert!(matches!(
            MetaError::combine(vec![MetaError::NoDefaultNetwork]),
            Some(MetaError::NoDefaultNetwork)
        ));
    }

    #[test]
    fn the_chain_leaves_out_what_an_error_already_says() {
        let e = NetNsError::Io {
            path: "/run/netns/x".into(),
            source: io(ErrorKind::PermissionDenied),
        };
        assert_eq!(chain(&e), "network namespace /run/netns/x: boom");
        let outer = MetaError::PlanNotRemoved {
            pod: s("pod db/p"),
            source: Box::new(MetaError::PlanRemove {
                path: "/p".into(),
                source: io(ErrorKind::PermissionDenied),
            }),
        };
        assert_eq!(outer.details(), "/p: boom");
    }
}
