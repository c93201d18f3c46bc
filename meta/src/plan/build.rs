//! Building the plan: from the pod's resolved networks ([`PlanInput`]) to the validated
//! attachments — interface names, each delegate's config with the capability args and
//! `CNI_ARGS` injected, the devices handed out, and which attachment owns the default route.

use super::{DeviceMap, PlanInput, PlannedAttachment, ResolvedNetwork};
use crate::error::MetaError;
use crate::pod::PodInfo;
use plexus_conf::args::CniArgs;
use plexus_conf::k8s::selection::NetworkSelection;
use plexus_conf::netconf::NetConfList;
use plexus_conf::result::is_v6;
use plexus_conf::validate;
use serde_json::{Map, Value};

/// Plugin types that are meta-plugins themselves: never run as delegates.
const META_PLUGINS: &[&str] = &["plexus", "plexus-shim", "multus", "multus-shim"];

/// Hands out a pod's allocated devices: each network with a resource name takes the next
/// device of that resource (sorted order, as Multus and OVN-Kubernetes do).
struct DeviceAllocator<'a> {
    devices: Option<&'a DeviceMap>,
    next: std::collections::HashMap<String, usize>,
}

impl DeviceAllocator<'_> {
    fn take(&mut self, net: &ResolvedNetwork, ctx: &str) -> Result<Option<String>, MetaError> {
        let (Some(res), Some(devices)) = (net.resource_name.as_deref(), self.devices) else {
            return Ok(None);
        };
        let idx = self.next.entry(res.to_string()).or_insert(0);
        let id = devices
            .get(res)
            .and_then(|ids| ids.get(*idx))
            .cloned()
            .ok_or_else(|| MetaError::NoDeviceLeft {
                pod: ctx.to_string(),
                network: net.name.clone(),
                resource: res.to_string(),
                allocated: devices.get(res).map_or(0, Vec::len),
            })?;
        *idx += 1;
        Ok(Some(id))
    }
}

fn pod_ctx(pod: Option<&PodInfo>) -> String {
    pod.map(|p| format!("pod {}", p.id.key()))
        .unwrap_or_else(|| "static delegates".to_string())
}

/// Capability args an annotation requests for one attachment.
fn requested_caps(sel: &NetworkSelection) -> Map<String, Value> {
    let mut m = Map::new();
    if !sel.ips.is_empty() {
        m.insert("ips".into(), Value::from(sel.ips.clone()));
    }
    if let Some(mac) = &sel.mac {
        m.insert("mac".into(), Value::from(mac.clone()));
    }
    if !sel.port_mappings.is_empty() {
        m.insert(
            "portMappings".into(),
            Value::from(sel.port_mappings.clone()),
        );
    }
    if let Some(b) = &sel.bandwidth {
        m.insert("bandwidth".into(), b.clone());
    }
    if let Some(g) = &sel.infiniband_guid {
        m.insert("infinibandGUID".into(), Value::from(g.clone()));
    }
    if let Some(d) = &sel.device_id {
        m.insert("deviceID".into(), Value::from(d.clone()));
    }
    m
}

/// Whether some plugin of `list` can honour capability `cap`: it declares it, or (for `ips`
/// and `mac`) it reads the legacy `CNI_ARGS` `IP=`/`MAC=` that plexus also sets.
fn honoured(list: &NetConfList, cap: &str) -> bool {
    list.plugins.iter().any(|p| {
        p.has_capability(cap)
            || (cap == "ips" && matches!(p.ipam_type(), Some("static" | "host-local")))
            || (cap == "mac" && p.plugin_type() == "sriov")
    })
}

/// Inject `args.cni` keys and a device ID into every plugin of a config.
fn inject(config: &mut Value, cni_args: Option<&Map<String, Value>>, device_id: Option<&str>) {
    let apply = |obj: &mut Map<String, Value>| {
        if let Some(extra) = cni_args {
            let args = obj
                .entry("args")
                .or_insert_with(|| Value::Object(Map::new()));
            if !args.is_object() {
                *args = Value::Object(Map::new());
            }
            let cni = args
                .as_object_mut()
                .map(|a| a.entry("cni").or_insert_with(|| Value::Object(Map::new())));
            if let Some(cni) = cni {
                if !cni.is_object() {
                    *cni = Value::Object(Map::new());
                }
                if let Some(c) = cni.as_object_mut() {
                    for (k, v) in extra {
                        c.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        if let Some(d) = device_id {
            obj.insert("deviceID".into(), Value::from(d));
            obj.insert("pciBusID".into(), Value::from(d));
        }
    };
    match config.get_mut("plugins").and_then(Value::as_array_mut) {
        Some(plugins) => plugins
            .iter_mut()
            .filter_map(Value::as_object_mut)
            .for_each(apply),
        None => {
            if let Some(o) = config.as_object_mut() {
                apply(o)
            }
        }
    }
}

/// Whether the selection's `ips` reach the network as `args.cni.ips` (in every plugin's config)
/// instead of `CNI_ARGS IP=`: host-local reads one address from `IP=` and fails ADD and DEL on a
/// list ("invalid IP address a,b"), so two or more (one per family) go where it reads a list.
/// One address, and static IPAM (which reads a list from `IP=`), stay on `IP=`.
fn ips_in_config_args(list: &NetConfList, sel: &NetworkSelection) -> bool {
    sel.ips.len() > 1
        && list
            .plugins
            .iter()
            .any(|p| p.ipam_type() == Some("host-local"))
}

fn delegate_args(base: &CniArgs, sel: Option<&NetworkSelection>, ip_arg: bool) -> String {
    let mut a = base.clone();
    a.set("IgnoreUnknown", "1");
    if let Some(sel) = sel {
        if ip_arg && !sel.ips.is_empty() {
            a.set("IP", &sel.ips.join(","));
        }
        if let Some(mac) = &sel.mac {
            a.set("MAC", mac);
        }
    }
    a.render()
}

/// Build and validate the plan.
pub fn build(input: PlanInput<'_>) -> Result<Vec<PlannedAttachment>, MetaError> {
    let ctx = pod_ctx(input.pod);
    let mut out: Vec<PlannedAttachment> = Vec::new();
    let (default_net, default_if) = &input.default;
    let default_ifname = default_if
        .clone()
        .unwrap_or_else(|| input.ifname.to_string());
    out.push(PlannedAttachment {
        network: default_net.name.clone(),
        ifname: default_ifname,
        is_default: true,
        config: default_net.list.to_value(),
        capability_args: input.runtime_config.clone(),
        cni_args: delegate_args(input.cni_args, None, true),
        default_route: Vec::new(),
        filter_v4: false,
        filter_v6: false,
        resource_name: None,
        dra: None,
        nad: default_net.nad.clone(),
    });
    let mut allocator = DeviceAllocator {
        devices: input.devices,
        next: Default::default(),
    };
    for net in &input.always {
        let idx = out.len();
        let mut config = net.list.to_value();
        let mut capability_args = Map::new();
        let allocated = allocator.take(net, &ctx)?;
        if let Some(id) = &allocated {
            inject(&mut config, None, Some(id));
            capability_args.insert("deviceID".into(), Value::from(id.clone()));
        }
        out.push(PlannedAttachment {
            network: net.name.clone(),
            ifname: format!("net{idx}"),
            is_default: false,
            config,
            capability_args,
            cni_args: delegate_args(input.cni_args, None, true),
            default_route: Vec::new(),
            filter_v4: false,
            filter_v6: false,
            resource_name: allocated.and(net.resource_name.clone()),
            dra: None,
            nad: net.nad.clone(),
        });
    }
    for (sel, net) in &input.selected {
        let idx = out.len();
        let ifname = sel
            .requested_interface()
            .map(str::to_string)
            .unwrap_or_else(|| format!("net{idx}"));
        let mut caps = requested_caps(sel);
        // A device the kubelet allocated for the NAD's resource is authoritative: it goes into
        // the config (deviceID, pciBusID) and replaces any deviceID the pod asked for.
        let allocated = allocator.take(net, &ctx)?;
        if allocated.is_some() {
            caps.remove("deviceID");
        }
        for cap in caps.keys() {
            if !honoured(&net.list, cap) {
                return Err(MetaError::CapabilityNotHonoured {
                    pod: ctx.clone(),
                    network: net.name.clone(),
                    capability: cap.clone(),
                    config_name: net.list.name.clone(),
                });
            }
        }
        let mut config = net.list.to_value();
        // A pod's deviceID reaches the delegate only as runtimeConfig.deviceID, and only when the
        // NAD declares the capability: a pod author must not pick any NIC of the node.
        inject(&mut config, sel.cni_args.as_ref(), allocated.as_deref());
        let ips_in_config = ips_in_config_args(&net.list, sel);
        if ips_in_config {
            let mut ips = Map::new();
            ips.insert("ips".into(), Value::from(sel.ips.clone()));
            inject(&mut config, Some(&ips), None);
        }
        let resource_name = allocated.as_ref().and(net.resource_name.clone());
        if let Some(id) = allocated {
            caps.insert("deviceID".into(), Value::from(id));
        }
        out.push(PlannedAttachment {
            network: net.name.clone(),
            ifname,
            is_default: false,
            config,
            capability_args: caps,
            cni_args: delegate_args(input.cni_args, Some(sel), !ips_in_config),
            default_route: sel.default_route.clone(),
            filter_v4: false,
            filter_v6: false,
            resource_name,
            dra: None,
            nad: net.nad.clone(),
        });
    }
    // Interface names: valid and unique.
    for (i, a) in out.iter().enumerate() {
        validate::interface_name(&a.ifname).map_err(|source| MetaError::InterfaceName {
            pod: ctx.clone(),
            network: a.network.clone(),
            source: source.into(),
        })?;
        if let Some(prev) = out[..i].iter().find(|p| p.ifname == a.ifname) {
            return Err(MetaError::DuplicateInterface {
                pod: ctx.clone(),
                ifname: a.ifname.clone(),
                first: prev.network.clone(),
                second: a.network.clone(),
            });
        }
    }
    for a in &out {
        let list = a.list()?;
        // As a plugin or as its IPAM: either way plexus would run again with a config (its own
        // delegates, its own nadPolicy) that the network's author chose.
        if let Some(t) = list
            .plugins
            .iter()
            .flat_map(|p| [Some(p.plugin_type()), p.ipam_type()])
            .flatten()
            .find(|t| META_PLUGINS.contains(t))
        {
            return Err(MetaError::MetaPluginDelegate {
                pod: ctx.clone(),
                network: a.network.clone(),
                plugin_type: t.to_string(),
            });
        }
        // A version plexus cannot speak fails now, before any delegate runs (at ADD it would
        // fail after the networks before it were added, and so would its rollback DEL).
        plexus_conf::version::precheck(&list.cni_version, &list.cni_versions).map_err(
            |source| MetaError::PlanInvalid {
                pod: ctx.clone(),
                source: Box::new(MetaError::NetworkConfig {
                    network: a.network.clone(),
                    source: source.into(),
                }),
            },
        )?;
    }
    apply_default_route(&mut out, &ctx)?;
    Ok(out)
}

/// At most one gateway per family across the pod (no ECMP); every other attachment drops its
/// default route of a family that some attachment claims.
fn apply_default_route(plan: &mut [PlannedAttachment], ctx: &str) -> Result<(), MetaError> {
    let mut owner4: Option<usize> = None;
    let mut owner6: Option<usize> = None;
    for (i, a) in plan.iter().enumerate() {
        for gw in &a.default_route {
            let slot = if is_v6(gw) { &mut owner6 } else { &mut owner4 };
            if slot.is_some() {
                return Err(MetaError::MultipleDefaultRoutes {
                    pod: ctx.to_string(),
                });
            }
            *slot = Some(i);
        }
    }
    for (i, a) in plan.iter_mut().enumerate() {
        a.filter_v4 = owner4.is_some_and(|o| o != i);
        a.filter_v6 = owner6.is_some_and(|o| o != i);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_conf::k8s::selection::{parse_selections, NETWORKS_ANNOTATION};
    use serde_json::json;

    fn plan_one(selected: &str, nad: Value) -> Vec<PlannedAttachment> {
        let net = |name: &str, v: Value| ResolvedNetwork {
            name: name.into(),
            list: NetConfList::from_value(v).unwrap(),
            resource_name: None,
            nad: None,
        };
        let sels = parse_selections(selected, NETWORKS_ANNOTATION).unwrap();
        let args = CniArgs::parse("K8S_POD_NAMESPACE=db;K8S_POD_NAME=pg-0").unwrap();
        let primary = json!({"cniVersion":"1.0.0","name":"cbr0","type":"bridge"});
        build(PlanInput {
            ifname: "eth0",
            cni_args: &args,
            runtime_config: &Map::new(),
            pod: None,
            default: (net("cbr0", primary), None),
            always: vec![],
            selected: sels.into_iter().zip([net("db/a", nad)]).collect(),
            devices: None,
        })
        .unwrap()
    }

    #[test]
    fn dual_stack_ips_reach_host_local_as_a_list_in_args_cni_never_as_an_ip_arg_list() {
        let hl = json!({"cniVersion":"1.0.0","name":"a","type":"bridge","ipam":{"type":"host-local",
            "ranges":[[{"subnet":"10.1.1.0/24"}],[{"subnet":"2001:db8:1::/64"}]]}});
        let p = plan_one(
            r#"[{"name":"a","ips":["10.1.1.5/24","2001:db8:1::5/64"]}]"#,
            hl.clone(),
        );
        assert!(!p[1].cni_args.contains("IP="), "{}", p[1].cni_args);
        assert_eq!(
            p[1].config["args"]["cni"]["ips"],
            json!(["10.1.1.5/24", "2001:db8:1::5/64"])
        );
        // Every family kept in the requested addresses (the address guard reads them).
        assert_eq!(
            p[1].capability_args["ips"],
            json!(["10.1.1.5/24", "2001:db8:1::5/64"])
        );
        // One address: CNI_ARGS IP= as before (host-local reads one), no args.cni.
        let p = plan_one(r#"[{"name":"a","ips":["2001:db8:1::5/64"]}]"#, hl);
        assert!(p[1].cni_args.contains("IP=2001:db8:1::5/64"));
        assert!(p[1].config.get("args").is_none(), "{}", p[1].config);
        // static IPAM reads a list from IP=: unchanged.
        let st = json!({"cniVersion":"1.0.0","name":"a","type":"macvlan","ipam":{"type":"static"}});
        let p = plan_one(
            r#"[{"name":"a","ips":["10.1.1.5/24","2001:db8:1::5/64"]}]"#,
            st,
        );
        assert!(p[1].cni_args.contains("IP=10.1.1.5/24,2001:db8:1::5/64"));
        assert!(p[1].config.get("args").is_none(), "{}", p[1].config);
    }
}
