//! The `k8s.v1.cni.cncf.io/network-status` annotation (NPWG spec section 5), built from
//! delegate results the way the NAD client does, without Multus' `"<nil>"` gateway bug.

use crate::result::{is_default_dst, is_v6, CniResult, Dns};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One entry of the network-status list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkStatus {
    /// `ns/nad` for NAD networks, the config name otherwise.
    pub name: String,
    /// Interface name in the pod.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interface: String,
    /// Addresses, without prefix length.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// MAC address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// True for the pod's default network.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    /// DNS (always emitted, `{}` when empty, as Multus does).
    #[serde(default)]
    pub dns: Dns,
    /// Device information (NPWG device-info spec).
    #[serde(
        rename = "device-info",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub device_info: Option<Value>,
    /// Default-route gateways (the key Multus writes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateway: Vec<String>,
    /// Default-route gateways (the key the NPWG spec names).
    #[serde(
        rename = "default-route",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub default_route: Vec<String>,
}

fn strip_prefix(addr: &str) -> String {
    addr.split('/').next().unwrap_or(addr).to_string()
}

/// Gateways of the result's default routes; a route without `gw` takes the gateway of the
/// result's first IP of the same family (never `"<nil>"`).
pub fn default_gateways(r: &CniResult) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for route in r.routes.iter().filter(|rt| is_default_dst(&rt.dst)) {
        let v6 = is_v6(&route.dst);
        let gw = route.gw.clone().or_else(|| {
            r.ips
                .iter()
                .find(|ip| is_v6(&ip.address) == v6)
                .and_then(|ip| ip.gateway.clone())
        });
        if let Some(gw) = gw.filter(|g| !g.is_empty()) {
            if !out.contains(&gw) {
                out.push(gw);
            }
        }
    }
    out
}

/// Build the entries for one attachment's result.
pub fn statuses_from_result(
    name: &str,
    result: &CniResult,
    is_default: bool,
    device_info: Option<&Value>,
) -> Vec<NetworkStatus> {
    let gateways = default_gateways(result);
    let sandboxed: Vec<usize> = result.sandbox_interfaces().map(|(i, _)| i).collect();
    let base = |iface_idx: Option<usize>| {
        let iface = iface_idx.and_then(|i| result.interfaces.get(i));
        NetworkStatus {
            name: name.to_string(),
            interface: iface.map(|i| i.name.clone()).unwrap_or_default(),
            mac: iface.map(|i| i.mac.clone()).unwrap_or_default(),
            mtu: iface.and_then(|i| i.mtu),
            dns: result.dns.clone(),
            device_info: device_info.cloned(),
            ..NetworkStatus::default()
        }
    };
    if sandboxed.len() <= 1 {
        let mut st = base(sandboxed.first().copied());
        st.ips = result
            .ips
            .iter()
            .map(|ip| strip_prefix(&ip.address))
            .collect();
        if st.ips.is_empty() && st.interface.is_empty() && result.interfaces.is_empty() {
            return Vec::new();
        }
        st.default = is_default;
        st.gateway = gateways.clone();
        st.default_route = gateways;
        return vec![st];
    }
    let mut entries: Vec<NetworkStatus> = sandboxed.iter().map(|&i| base(Some(i))).collect();
    let last = entries.len() - 1;
    for ip in &result.ips {
        let pos = ip
            .interface
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| sandboxed.iter().position(|&s| s == i))
            .unwrap_or(last);
        entries[pos].ips.push(strip_prefix(&ip.address));
    }
    if is_default {
        let owner = result
            .ips
            .iter()
            .filter(|ip| ip.gateway.is_some())
            .find_map(|ip| {
                ip.interface
                    .and_then(|i| usize::try_from(i).ok())
                    .and_then(|i| sandboxed.iter().position(|&s| s == i))
            })
            .unwrap_or(0);
        entries[owner].default = true;
        entries[owner].gateway = gateways.clone();
        entries[owner].default_route = gateways;
    }
    entries
}

/// Serialize the list as the annotation value (pretty-printed like the NAD client).
pub fn to_annotation(list: &[NetworkStatus]) -> String {
    serde_json::to_string_pretty(list).unwrap_or_else(|_| "[]".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn r(v: Value) -> CniResult {
        CniResult::parse(&v).unwrap()
    }

    #[test]
    fn bridge_result_gives_one_default_entry_with_gateway() {
        let res = r(
            json!({"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"aa:00:00:00:00:01"},{"name":"veth1","mac":"aa:00:00:00:00:02"},
            {"name":"eth0","mac":"aa:00:00:00:00:03","sandbox":"/run/netns/p","mtu":1450}],
            "ips":[{"interface":2,"address":"10.244.1.5/24","gateway":"10.244.1.1"}],"routes":[{"dst":"0.0.0.0/0"}]}),
        );
        let st = statuses_from_result("cbr0", &res, true, None);
        assert_eq!(st.len(), 1);
        let v = serde_json::to_value(&st[0]).unwrap();
        assert_eq!(
            v,
            json!({"name":"cbr0","interface":"eth0","ips":["10.244.1.5"],"mac":"aa:00:00:00:00:03","mtu":1450,"default":true,
                   "dns":{},"gateway":["10.244.1.1"],"default-route":["10.244.1.1"]})
        );
    }

    #[test]
    fn secondary_without_default_route_has_no_gateway() {
        let res = r(
            json!({"cniVersion":"1.0.0","interfaces":[{"name":"net1","mac":"02:00:00:00:00:01","sandbox":"/p"}],
            "ips":[{"interface":0,"address":"192.168.1.205/24","gateway":"192.168.1.1"}]}),
        );
        let st = statuses_from_result(
            "default/macvlan-conf",
            &res,
            false,
            Some(&json!({"type":"pci"})),
        );
        assert!(!st[0].default);
        assert!(st[0].gateway.is_empty());
        assert_eq!(st[0].device_info, Some(json!({"type":"pci"})));
        assert!(!to_annotation(&st).contains("<nil>"));
    }

    #[test]
    fn multi_interface_results_map_ips_by_index() {
        let res = r(
            json!({"cniVersion":"1.0.0","interfaces":[{"name":"a","sandbox":"/p"},{"name":"host"},{"name":"b","sandbox":"/p"}],
            "ips":[{"interface":2,"address":"10.0.0.2/24","gateway":"10.0.0.1"},{"address":"10.9.0.2/24"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.0.0.1"}]}),
        );
        let st = statuses_from_result("n", &res, true, None);
        assert_eq!(st.len(), 2);
        assert_eq!(st[0].interface, "a");
        assert_eq!(st[1].ips, vec!["10.0.0.2", "10.9.0.2"]);
        assert!(st[1].default && !st[0].default);
    }

    #[test]
    fn ipam_only_result_still_reports_ips() {
        let res = r(json!({"cniVersion":"1.0.0","ips":[{"address":"10.1.1.1/24"}]}));
        let st = statuses_from_result("n", &res, false, None);
        assert_eq!(st[0].ips, vec!["10.1.1.1"]);
        assert!(statuses_from_result("n", &CniResult::default(), false, None).is_empty());
    }
}
