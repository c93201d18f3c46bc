//! The CNI `msg` and `details` of each [`MetaError`]: what failed, naming the pod, network and
//! interface when known, and the cause (the source chain); `Display` prints `msg: details`.

use super::{chain, MetaError, PoolOverlap};
use crate::k8s::RESOURCE_NAME_ATTR;
use std::fmt;

fn prefixed(prefix: impl fmt::Display, inner: &str) -> String {
    format!("{prefix}: {inner}")
}

impl MetaError {
    /// The CNI `msg`: what failed, naming the pod, network and interface when known.
    pub fn msg(&self) -> String {
        self.describe().0
    }

    /// The CNI `details`: the cause.
    pub fn details(&self) -> String {
        self.describe().1
    }

    /// `(msg, details)`.
    pub(super) fn describe(&self) -> (String, String) {
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
            NadPolicy {
                pod,
                network,
                refusal: r,
            } => (
                format!(
                    "{pod}, network {network}: {} {:?} is not allowed by the node's NAD policy",
                    r.location, r.value
                ),
                format!("{}; allowed: {}", r.why, r.allowed),
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
            AddressInPool {
                pod,
                network,
                overlap,
            } => {
                let PoolOverlap {
                    address,
                    pool_network,
                    ipam,
                    segment,
                } = overlap.as_ref();
                (
                format!("{pod}, network {network}: fixed address {address} is in the range {ipam} hands out on network {pool_network} (same segment: {segment})"),
                format!("{ipam} does not know the addresses another IPAM fixes on its segment and may give {address} to a pod of {pool_network}: exclude it from that pool (\"exclude\": [\"{address}/32\"] for whereabouts, or a rangeStart/rangeEnd that leaves it out) or move the fixed address out of the range"),
                )
            }
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
            PlanOfAnotherVersion { path, kind, reads } => (
                "attachment plan of another plexus version".into(),
                format!(
                    "{}: kind {kind:?}, this plexus reads {reads:?} (a newer plexus wrote it: run its DELs before a downgrade; this DEL rebuilds the plan from the pod's networks and the result cache)",
                    path.display()
                ),
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
