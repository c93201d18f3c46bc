//! [`MetaError`]: every way a plexus verb fails, each variant with the data its message needs
//! and its cause as a typed source.

use super::{BoxError, PodResourcesError};
use crate::k8s::K8sError;
use plexus_conf::error::CniError;
use plexus_delegates::netns::NetNsError;
use std::path::PathBuf;

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
    /// A NAD's config names a host path or host resource the node's NAD policy does not give
    /// (7): refused before any delegate runs.
    NadPolicy {
        /// Pod label.
        pod: String,
        /// The network.
        network: String,
        /// What is refused and why.
        refusal: Box<NadRefusal>,
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
    /// A fixed address of the plan lies in the range a pooled IPAM (whereabouts, host-local) of
    /// another network on the same segment hands out, and is not excluded from it (7).
    AddressInPool {
        /// Pod label.
        pod: String,
        /// The network with the fixed address.
        network: String,
        /// The address and the pool that may hand it out.
        overlap: Box<PoolOverlap>,
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
    /// The plan is a plexus plan of another format version, e.g. written by a newer plexus
    /// before a downgrade (6).
    PlanOfAnotherVersion {
        /// The plan file.
        path: PathBuf,
        /// The `kind` it carries.
        kind: String,
        /// The kind this plexus reads.
        reads: &'static str,
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

impl MetaError {
    /// `None` for no errors, the error itself for one, [`MetaError::Combined`] for several.
    pub fn combine(mut errors: Vec<MetaError>) -> Option<MetaError> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(MetaError::Combined(errors)),
        }
    }
}

/// What the node's NAD policy refuses in a network's config ([`MetaError::NadPolicy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NadRefusal {
    /// Where in the config: `plugins[0].ipam.dataDir`, or `resourceName`.
    pub location: String,
    /// The value named there.
    pub value: String,
    /// Why it is refused.
    pub why: String,
    /// What the policy allows instead, with the config field that says so.
    pub allowed: String,
}

/// A fixed address inside another network's pool ([`MetaError::AddressInPool`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOverlap {
    /// The address.
    pub address: String,
    /// The network whose pool holds it.
    pub pool_network: String,
    /// That pool's IPAM type.
    pub ipam: String,
    /// The segment both networks join.
    pub segment: String,
}
