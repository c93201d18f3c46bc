//! Stage 2 of every verb: the attachment plan — which networks a pod gets, on which
//! interfaces, with which exact delegate configs, capability args and `CNI_ARGS`. Built with
//! no I/O (beyond config files the config names) from the config and what the inputs stage
//! read ([`Read`]), so ADD, DEL (from the saved plan) and `plexus explain` share it. The
//! types the inputs fill in ([`Read`], [`DeviceMap`], [`DraDevice`], `requests::NadMap`) live
//! here, so the inputs stage imports the plan's types and the plan imports nothing above it
//! (docs/design.md, "Stages"):
//!
//! - [`requests`]: what the pod asks for (annotations, `clusterNetwork`, `defaultNetworks`,
//!   isolation) and which NADs that needs;
//! - [`resolve`]: network references → configs (NADs, files, `confDir`);
//! - [`fixed_ips`]: StatefulSet replicas' addresses from their NADs' mappings;
//! - [`build()`] (`build.rs`): the attachments, interface names, injected args, devices, default routes.

mod build;
pub mod fixed_ips;
pub mod requests;
pub mod resolve;

pub use build::build;

use crate::error::MetaError;
use crate::pod::PodInfo;
use plexus_conf::args::CniArgs;
use plexus_conf::k8s::selection::NetworkSelection;
use plexus_conf::netconf::NetConfList;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A network resolved to its config.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedNetwork {
    /// Name shown in network-status: `ns/nad` for NADs, the config name otherwise.
    pub name: String,
    /// The network's config.
    pub list: NetConfList,
    /// Device-plugin resource whose allocated device the network uses (NAD annotation
    /// `k8s.v1.cni.cncf.io/resourceName`).
    pub resource_name: Option<String>,
    /// The NAD the pod selected this network by; `None` for the operator's networks
    /// (`clusterNetwork`, `defaultNetworks`, inline delegates, config files).
    pub nad: Option<SelectedNad>,
}

/// A network a pod selected by NAD: what the node's NAD policy (`nad_guard`) checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectedNad {
    /// The NAD's namespace.
    pub namespace: String,
    /// The config is the NAD's own `spec.config` (written in that namespace), not a file of
    /// the operator's `confDir`.
    pub inline_config: bool,
    /// The NAD's `k8s.v1.cni.cncf.io/resourceName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
}

/// One attachment to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedAttachment {
    /// Network name for status and errors.
    pub network: String,
    /// Interface in the pod.
    pub ifname: String,
    /// True for the pod's default network.
    pub is_default: bool,
    /// The delegate config exactly as it is run (after injection).
    pub config: Value,
    /// Capability args offered (`runtimeConfig`, filtered per plugin by capabilities).
    pub capability_args: Map<String, Value>,
    /// `CNI_ARGS` for the delegate.
    pub cni_args: String,
    /// Gateways this attachment takes the default route(s) for.
    #[serde(default)]
    pub default_route: Vec<String>,
    /// Remove IPv4 default routes from this interface after ADD.
    #[serde(default)]
    pub filter_v4: bool,
    /// Remove IPv6 default routes from this interface after ADD.
    #[serde(default)]
    pub filter_v6: bool,
    /// The resource whose allocated device (`capability_args.deviceID`) this attachment uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
    /// The DRA device behind that device ID, when it came from a ResourceClaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraDevice>,
    /// The NAD the pod selected this network by (`None`: the operator's network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nad: Option<SelectedNad>,
}

#[cfg(test)]
impl PlannedAttachment {
    /// A secondary attachment (`net1`) of `network` running `config`, nothing else set: tests
    /// fill in what they need with struct update syntax.
    pub(crate) fn for_test(network: &str, config: Value) -> PlannedAttachment {
        PlannedAttachment {
            network: network.into(),
            ifname: "net1".into(),
            is_default: false,
            config,
            capability_args: Map::new(),
            cni_args: String::new(),
            default_route: vec![],
            filter_v4: false,
            filter_v6: false,
            resource_name: None,
            dra: None,
            nad: None,
        }
    }
}

impl PlannedAttachment {
    /// The delegate config as a conflist.
    pub fn list(&self) -> Result<NetConfList, MetaError> {
        NetConfList::from_value(self.config.clone()).map_err(|source| MetaError::NetworkConfig {
            network: self.network.clone(),
            source: source.into(),
        })
    }
}

/// The plan for what the inputs stage read: networks resolved and built, each attachment with
/// a device tied to its DRA identity and its device-info file.
pub fn for_pod(
    config: &plexus_conf::plexus_config::PlexusConfig,
    ifname: &str,
    cni_args: &CniArgs,
    container_id: &str,
    read: &Read,
) -> Result<Vec<PlannedAttachment>, MetaError> {
    // StatefulSet replicas: the addresses their NADs' fixed-ips mappings give them.
    let fixed = fixed_ips::apply(
        std::path::Path::new(&config.conf_dir),
        read.pod.as_ref(),
        &read.requests,
        &read.nads,
    )?;
    let mut plan = requests::make_plan(
        config,
        ifname,
        cni_args,
        read.pod.as_ref(),
        &fixed,
        &read.nads,
        read.devices.as_ref(),
    )?;
    annotate(
        &mut plan,
        &read.dra,
        std::path::Path::new(&config.device_info_dir),
        container_id,
    );
    Ok(plan)
}

/// After planning: tie each attachment's allocated device to its DRA identity, and give
/// attachments with a device their per-attachment device-info file
/// (`runtimeConfig.CNIDeviceInfoFile`, for plugins that declare the capability).
fn annotate(
    plan: &mut [PlannedAttachment],
    found: &[DraDevice],
    info_dir: &std::path::Path,
    container_id: &str,
) {
    use plexus_conf::k8s::devinfo;
    for a in plan.iter_mut().filter(|a| a.resource_name.is_some()) {
        let Some(id) = a
            .capability_args
            .get("deviceID")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
        else {
            continue;
        };
        a.dra = found
            .iter()
            .find(|d| d.device_id == id && Some(&d.resource_name) == a.resource_name.as_ref())
            .cloned();
        let file = devinfo::attachment_file(info_dir, &a.network, container_id, &a.ifname);
        a.capability_args.insert(
            devinfo::CAPABILITY.into(),
            serde_json::Value::from(file.display().to_string()),
        );
    }
}

/// A DRA-allocated device a network can use, as recorded in the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DraDevice {
    /// The claim's namespace (the pod's).
    pub claim_namespace: String,
    /// The claim's API name.
    pub claim_name: String,
    /// Driver.
    pub driver: String,
    /// Pool.
    pub pool: String,
    /// Device name in the pool.
    pub device: String,
    /// `k8s.cni.cncf.io/deviceID`.
    pub device_id: String,
    /// `k8s.cni.cncf.io/resourceName` (or the extended-resource mapping's name).
    pub resource_name: String,
}

/// Everything the planner needs, as read from an [`Inputs`](crate::inputs::Inputs).
#[derive(Debug, Clone, Default)]
pub struct Read {
    /// The pod, when known.
    pub pod: Option<PodInfo>,
    /// What the pod asks for.
    pub requests: requests::Requests,
    /// The NADs those requests reference.
    pub nads: requests::NadMap,
    /// Devices per resource, when some NAD names a resource (`None`: not looked up).
    pub devices: Option<DeviceMap>,
    /// The DRA devices among them.
    pub dra: Vec<DraDevice>,
}

/// Inputs to the planner.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// The kubelet's `CNI_IFNAME` (the default network's interface).
    pub ifname: &'a str,
    /// The kubelet's `CNI_ARGS`.
    pub cni_args: &'a CniArgs,
    /// Capability args the runtime passed to plexus (for the default network only).
    pub runtime_config: &'a Map<String, Value>,
    /// The pod, when known.
    pub pod: Option<&'a PodInfo>,
    /// The default network, with the interface requested by a default-network annotation.
    pub default: (ResolvedNetwork, Option<String>),
    /// `defaultNetworks` (already empty for pods in system namespaces).
    pub always: Vec<ResolvedNetwork>,
    /// Networks selected by the pod annotation, with their selection.
    pub selected: Vec<(NetworkSelection, ResolvedNetwork)>,
    /// Devices the kubelet allocated to the pod, per resource name; `None` when not looked up
    /// (`plexus explain`), in which case device-plugin networks keep no deviceID.
    pub devices: Option<&'a DeviceMap>,
}

/// Device IDs per resource name, each list sorted.
pub type DeviceMap = std::collections::BTreeMap<String, Vec<String>>;

/// Refuse references outside the pod's namespace and the global ones when isolation is on.
pub fn check_isolation(
    pod_ns: &str,
    selections: &[NetworkSelection],
    globals: &[String],
    pod_key: &str,
) -> Result<(), MetaError> {
    for s in selections {
        let ns = s.namespace_or(pod_ns);
        if ns != pod_ns && !globals.iter().any(|g| g == ns) {
            return Err(MetaError::Isolation {
                pod: pod_key.to_string(),
                ns: ns.to_string(),
                name: s.name.clone(),
                pod_ns: pod_ns.to_string(),
                allowed: globals.to_vec(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodIdentity;
    use plexus_conf::k8s::selection::{parse_selections, NETWORKS_ANNOTATION};
    use serde_json::json;

    fn net(name: &str, v: Value) -> ResolvedNetwork {
        ResolvedNetwork {
            name: name.into(),
            list: NetConfList::from_value(v).unwrap(),
            resource_name: None,
            nad: None,
        }
    }

    fn flannel() -> ResolvedNetwork {
        net(
            "cbr0",
            json!({"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}),
        )
    }

    fn macvlan(name: &str) -> ResolvedNetwork {
        net(
            name,
            json!({"cniVersion":"1.0.0","name":"mv","type":"macvlan","ipam":{"type":"static"}}),
        )
    }

    fn pod() -> PodInfo {
        PodInfo {
            id: PodIdentity {
                namespace: "db".into(),
                name: "pg-0".into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn plan(
        selected: &str,
        nets: Vec<ResolvedNetwork>,
    ) -> Result<Vec<PlannedAttachment>, MetaError> {
        let sels = parse_selections(selected, NETWORKS_ANNOTATION).unwrap();
        let args = CniArgs::parse("K8S_POD_NAMESPACE=db;K8S_POD_NAME=pg-0").unwrap();
        let rc = json!({"portMappings":[{"hostPort":1,"containerPort":2,"protocol":"tcp"}]});
        let p = pod();
        build(PlanInput {
            ifname: "eth0",
            cni_args: &args,
            runtime_config: rc.as_object().unwrap(),
            pod: Some(&p),
            default: (flannel(), None),
            always: vec![],
            selected: sels.into_iter().zip(nets).collect(),
            devices: None,
        })
    }

    #[test]
    fn names_interfaces_like_multus() {
        let p = plan(
            "a@data0,b,c",
            vec![macvlan("db/a"), macvlan("db/b"), macvlan("db/c")],
        )
        .unwrap();
        let names: Vec<&str> = p.iter().map(|a| a.ifname.as_str()).collect();
        assert_eq!(names, vec!["eth0", "data0", "net2", "net3"]);
        assert!(p[0].is_default && !p[1].is_default);
        // Runtime capability args go to the default network only (spec 7.5).
        assert!(p[0].capability_args.contains_key("portMappings"));
        assert!(p[1].capability_args.is_empty());
        assert!(
            p[1].cni_args.contains("IgnoreUnknown=1")
                && p[1].cni_args.contains("K8S_POD_NAME=pg-0")
        );
    }

    #[test]
    fn duplicate_interface_is_rejected() {
        let e = plan("a@eth0", vec![macvlan("db/a")]).unwrap_err();
        assert!(
            matches!(&e, MetaError::DuplicateInterface { pod, ifname, first, second }
                if pod == "pod db/pg-0" && ifname == "eth0" && first == "cbr0" && second == "db/a"),
            "{e:?}"
        );
        assert_eq!(e.code(), 7);
        // The wire form names the pod, the interface and both networks.
        let c = plexus_conf::error::CniError::from(e);
        assert!(
            c.msg.contains("pod db/pg-0") && c.msg.contains("eth0") && c.details.contains("db/a"),
            "{c}"
        );
    }

    #[test]
    fn requests_need_a_capable_plugin() {
        let sel = r#"[{"name":"a","mac":"02:00:00:00:00:01"}]"#;
        let e = plan(sel, vec![macvlan("db/a")]).unwrap_err();
        assert!(
            matches!(&e, MetaError::CapabilityNotHonoured { network, capability, .. }
                if network == "db/a" && capability == "mac"),
            "{e:?}"
        );
        assert!(
            e.msg().contains("\"mac\"") && e.msg().contains("db/a"),
            "{e}"
        );
        let tuned = net(
            "db/a",
            json!({"cniVersion":"1.0.0","name":"mv","plugins":[{"type":"macvlan"},{"type":"tuning","capabilities":{"mac":true}}]}),
        );
        let p = plan(sel, vec![tuned]).unwrap();
        assert_eq!(p[1].capability_args["mac"], "02:00:00:00:00:01");
        assert!(p[1].cni_args.contains("MAC=02:00:00:00:00:01"));
        // ips through static IPAM (which reads CNI_ARGS IP=) are fine without the capability.
        let p = plan(
            r#"[{"name":"a","ips":["10.1.1.5/24"]}]"#,
            vec![macvlan("db/a")],
        )
        .unwrap();
        assert!(p[1].cni_args.contains("IP=10.1.1.5/24"));
        let e = plan(
            r#"[{"name":"a","bandwidth":{"ingressRate":1}}]"#,
            vec![macvlan("db/a")],
        )
        .unwrap_err();
        assert!(
            matches!(&e, MetaError::CapabilityNotHonoured { capability, .. } if capability == "bandwidth"),
            "{e:?}"
        );
    }

    #[test]
    fn cni_args_are_injected_into_every_plugin_and_device_id_needs_the_capability() {
        let chain = net(
            "db/s",
            json!({"cniVersion":"1.0.0","name":"s","plugins":[{"type":"sriov","deviceID":"0000:81:00.2","args":{"cni":{"keep":1,"foo":"nad"}}},{"type":"tuning"}]}),
        );
        let p = plan(
            r#"[{"name":"s","cni-args":{"foo":"pod"}}]"#,
            vec![chain.clone()],
        )
        .unwrap();
        let c = &p[1].config;
        assert_eq!(
            c["plugins"][0]["args"]["cni"],
            json!({"keep":1,"foo":"pod"})
        );
        assert_eq!(c["plugins"][1]["args"]["cni"], json!({"foo":"pod"}));
        // The pod cannot override the NAD's device.
        let e = plan(r#"[{"name":"s","deviceID":"0000:00:03.0"}]"#, vec![chain]).unwrap_err();
        assert!(
            matches!(&e, MetaError::CapabilityNotHonoured { capability, .. } if capability == "deviceID"),
            "{e:?}"
        );
        let opted_in = net(
            "db/h",
            json!({"cniVersion":"1.0.0","name":"h","type":"host-device","capabilities":{"deviceID":true}}),
        );
        let p = plan(
            r#"[{"name":"h","deviceID":"0000:04:00.5"}]"#,
            vec![opted_in],
        )
        .unwrap();
        assert_eq!(p[1].capability_args["deviceID"], "0000:04:00.5");
        assert!(p[1].config.get("deviceID").is_none() && p[1].config.get("pciBusID").is_none());
    }

    #[test]
    fn device_plugin_networks_take_allocated_devices_in_order() {
        let mut a = net(
            "db/a",
            json!({"cniVersion":"1.0.0","name":"a","type":"sriov"}),
        );
        a.resource_name = Some("intel.com/vf".into());
        let mut b = a.clone();
        b.name = "db/b".into();
        let sels = parse_selections(
            r#"[{"name":"a"},{"name":"b","deviceID":"0000:00:03.0"}]"#,
            NETWORKS_ANNOTATION,
        )
        .unwrap();
        let args = CniArgs::default();
        let rc = Map::new();
        let devices: DeviceMap = [(
            "intel.com/vf".to_string(),
            vec!["0000:af:06.1".to_string(), "0000:af:06.2".to_string()],
        )]
        .into();
        let build_with =
            |devs: Option<&DeviceMap>, sels: Vec<NetworkSelection>, nets: Vec<ResolvedNetwork>| {
                build(PlanInput {
                    ifname: "eth0",
                    cni_args: &args,
                    runtime_config: &rc,
                    pod: None,
                    default: (flannel(), None),
                    always: vec![],
                    selected: sels.into_iter().zip(nets).collect(),
                    devices: devs,
                })
            };
        let p = build_with(Some(&devices), sels.clone(), vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(p[1].config["deviceID"], "0000:af:06.1");
        assert_eq!(p[1].config["pciBusID"], "0000:af:06.1");
        // The allocation wins over a pod's own deviceID.
        assert_eq!(p[2].config["deviceID"], "0000:af:06.2");
        assert_eq!(p[2].capability_args["deviceID"], "0000:af:06.2");
        // A third network of the same resource has no device left: a clear error.
        let mut c = a.clone();
        c.name = "db/c".into();
        let three = parse_selections("a,b,c", NETWORKS_ANNOTATION).unwrap();
        let e = build_with(Some(&devices), three, vec![a.clone(), b.clone(), c]).unwrap_err();
        assert!(
            matches!(&e, MetaError::NoDeviceLeft { network, resource, allocated: 2, .. }
                if network == "db/c" && resource == "intel.com/vf"),
            "{e:?}"
        );
        assert_eq!(e.code(), 7);
        // Not looked up (explain): no deviceID, no error.
        let p = build_with(None, sels[..1].to_vec(), vec![a]).unwrap();
        assert!(p[1].config.get("deviceID").is_none());
    }

    #[test]
    fn an_unsupported_cni_version_is_refused_by_the_plan() {
        let bad = net(
            "db/new",
            json!({"cniVersion":"9.9.9","name":"new","type":"macvlan"}),
        );
        let e = plan("new", vec![bad]).unwrap_err();
        assert_eq!(e.code(), 1, "{e:?}");
        let c = plexus_conf::error::CniError::from(e);
        assert!(
            c.msg.contains("pod db/pg-0")
                && c.msg.contains("network db/new")
                && c.msg.contains("9.9.9"),
            "{c}"
        );
        // One version plexus implements among cniVersions is enough.
        let ok = net(
            "db/new",
            json!({"cniVersion":"9.9.9","cniVersions":["1.0.0"],"name":"new","type":"macvlan"}),
        );
        assert!(plan("new", vec![ok]).is_ok());
    }

    #[test]
    fn plexus_cannot_be_its_own_delegate() {
        let me = net(
            "db/loop",
            json!({"cniVersion":"1.0.0","name":"loop","type":"plexus","cniDir":"/tmp/evil"}),
        );
        let e = plan("loop", vec![me]).unwrap_err();
        assert!(
            matches!(&e, MetaError::MetaPluginDelegate { network, plugin_type, .. }
                if network == "db/loop" && plugin_type == "plexus"),
            "{e:?}"
        );
        // Nor its delegates' IPAM.
        let as_ipam = net(
            "db/loop",
            json!({"cniVersion":"1.0.0","name":"loop","plugins":[{"type":"macvlan","master":"x",
                "ipam":{"type":"multus","delegates":[{"type":"bridge"}]}}]}),
        );
        let e = plan("loop", vec![as_ipam]).unwrap_err();
        assert!(
            matches!(&e, MetaError::MetaPluginDelegate { plugin_type, .. } if plugin_type == "multus"),
            "{e:?}"
        );
    }

    #[test]
    fn default_route_moves_and_rejects_ecmp() {
        let p = plan(
            r#"[{"name":"a","default-route":["10.1.1.1"]},{"name":"b"}]"#,
            vec![macvlan("db/a"), macvlan("db/b")],
        )
        .unwrap();
        assert!(p[0].filter_v4 && !p[0].filter_v6);
        assert!(!p[1].filter_v4 && p[1].default_route == vec!["10.1.1.1"]);
        assert!(p[2].filter_v4);
        let e = plan(r#"[{"name":"a","default-route":["10.1.1.1"]},{"name":"b","default-route":["10.2.1.1"]}]"#, vec![macvlan("db/a"), macvlan("db/b")]).unwrap_err();
        assert!(
            matches!(&e, MetaError::MultipleDefaultRoutes { pod } if pod == "pod db/pg-0"),
            "{e:?}"
        );
        assert!(e.details().contains("ECMP"));
    }

    #[test]
    fn isolation() {
        let sels = parse_selections("a,default/b,other/c", NETWORKS_ANNOTATION).unwrap();
        let e = check_isolation("db", &sels, &["default".into()], "db/pg-0").unwrap_err();
        assert!(
            matches!(&e, MetaError::Isolation { pod, ns, name, .. }
                if pod == "db/pg-0" && ns == "other" && name == "c"),
            "{e:?}"
        );
        assert!(e.msg().contains("other/c") && e.msg().contains("isolation"));
        assert!(check_isolation("db", &sels[..2], &["default".into()], "db/pg-0").is_ok());
    }
}
