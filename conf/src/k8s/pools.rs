//! Address pools and segments: which addresses a pooled IPAM (whereabouts, host-local) of a
//! network may hand out, and which layer-2 segment a network's interfaces join, so that a fixed
//! address on one network can be checked against the pool of another network on the same
//! segment (static and pooled addresses never collide). Pure: no I/O.

use super::fixed_ips::{contains, parse_cidr};
use crate::netconf::NetConfList;
use serde_json::Value;
use std::net::IpAddr;

/// One range a pooled IPAM allocates from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRange {
    /// The subnet (`net/prefix`).
    pub subnet: (IpAddr, u8),
    /// First address handed out, if bounded.
    pub start: Option<IpAddr>,
    /// Last address handed out, if bounded.
    pub end: Option<IpAddr>,
    /// Subnets never handed out (whereabouts `exclude`).
    pub exclude: Vec<(IpAddr, u8)>,
}

/// A network's pool: its IPAM type and ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// `whereabouts` or `host-local`.
    pub ipam: String,
    /// The ranges.
    pub ranges: Vec<PoolRange>,
}

fn as_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

impl PoolRange {
    /// Whether this range may hand out `ip`.
    pub fn hands_out(&self, ip: IpAddr) -> bool {
        let (net, prefix) = self.subnet;
        if !contains(net, prefix, ip) {
            return false;
        }
        let after_start = self
            .start
            .is_none_or(|s| s.is_ipv4() == ip.is_ipv4() && as_u128(s) <= as_u128(ip));
        let before_end = self
            .end
            .is_none_or(|e| e.is_ipv4() == ip.is_ipv4() && as_u128(ip) <= as_u128(e));
        after_start && before_end && !self.exclude.iter().any(|(n, p)| contains(*n, *p, ip))
    }
}

impl Pool {
    /// Whether some range of the pool may hand out `ip`.
    pub fn hands_out(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.hands_out(ip))
    }
}

/// The CIDRs of a list of strings (an `exclude`); others are skipped.
fn cidrs(v: Option<&Value>) -> Vec<(IpAddr, u8)> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str().and_then(parse_cidr))
        .collect()
}

fn ip_of(v: Option<&Value>) -> Option<IpAddr> {
    v.and_then(Value::as_str).and_then(|s| s.parse().ok())
}

/// A whereabouts range object (`range`, `range_start`, `range_end`, `exclude`). `range` is a
/// CIDR or `first-last/prefix`.
fn whereabouts_range(r: &Value, exclude_outer: &[(IpAddr, u8)]) -> Option<PoolRange> {
    let text = r.get("range")?.as_str()?;
    let (mut start, mut end) = (ip_of(r.get("range_start")), ip_of(r.get("range_end")));
    let subnet = match text.split_once('-') {
        Some((first, rest)) => {
            let (last, prefix) = rest.split_once('/')?;
            start = start.or(first.parse().ok());
            end = end.or(last.parse().ok());
            parse_cidr(&format!("{first}/{prefix}"))?
        }
        None => parse_cidr(text)?,
    };
    let mut exclude = cidrs(r.get("exclude"));
    exclude.extend_from_slice(exclude_outer);
    Some(PoolRange {
        subnet,
        start,
        end,
        exclude,
    })
}

/// The pool of `list`: whereabouts (`range` or `ipRanges`) or host-local (`ranges`, or the
/// old `subnet`/`rangeStart`/`rangeEnd`); `None` for any other IPAM.
pub fn pool_of(list: &NetConfList) -> Option<Pool> {
    for p in &list.plugins {
        let Some(ipam) = p.raw.get("ipam") else {
            continue;
        };
        let mut ranges = Vec::new();
        match p.ipam_type() {
            Some("whereabouts") => {
                let outer = cidrs(ipam.get("exclude"));
                ranges.extend(whereabouts_range(ipam, &[]));
                for r in ipam
                    .get("ipRanges")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    ranges.extend(whereabouts_range(r, &outer));
                }
            }
            Some("host-local") => {
                let one = |r: &Value| -> Option<PoolRange> {
                    Some(PoolRange {
                        subnet: r.get("subnet")?.as_str().and_then(parse_cidr)?,
                        start: ip_of(r.get("rangeStart")),
                        end: ip_of(r.get("rangeEnd")),
                        exclude: vec![],
                    })
                };
                ranges.extend(one(ipam));
                for set in ipam
                    .get("ranges")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    ranges.extend(set.as_array().into_iter().flatten().filter_map(one));
                }
            }
            _ => continue,
        }
        return Some(Pool {
            ipam: p.ipam_type().unwrap_or_default().to_string(),
            ranges,
        });
    }
    None
}

fn vlan_of(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

/// The layer-2 segment the interfaces of `list` join, as a comparable key; `None` when it
/// cannot be told from the config (no master named: the node's default-route interface).
///
/// - `sriov`: the device resource (`resource_name`, the NAD's `k8s.v1.cni.cncf.io/resourceName`)
///   and `vlan`;
/// - `macvlan`, `ipvlan`, `host-device`: the `master` (or `device`) link;
/// - `vlan`: its `master` and `vlanId`;
/// - `bridge`: the bridge and `vlan`.
pub fn segment_of(list: &NetConfList, resource_name: Option<&str>) -> Option<String> {
    let p = list.plugins.first()?;
    let s = |k: &str| {
        p.raw
            .get(k)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    match p.plugin_type() {
        "sriov" => Some(format!(
            "sriov {} vlan {}",
            resource_name.filter(|r| !r.is_empty())?,
            vlan_of(p.raw.get("vlan"))
        )),
        "macvlan" | "ipvlan" => Some(format!("link {}", s("master")?)),
        "host-device" => Some(format!("link {}", s("device")?)),
        "vlan" => Some(format!(
            "link {} vlan {}",
            s("master")?,
            vlan_of(p.raw.get("vlanId"))
        )),
        "bridge" => Some(format!(
            "bridge {} vlan {}",
            s("bridge").unwrap_or("cni0"),
            vlan_of(p.raw.get("vlan"))
        )),
        _ => None,
    }
}

/// Whether `list` joins a segment that may span nodes (a physical link or VF, not a node-local
/// bridge): where host-local, a per-node allocator, hands one address out on every node.
pub fn spans_nodes(list: &NetConfList) -> bool {
    list.plugins.first().is_some_and(|p| {
        matches!(
            p.plugin_type(),
            "sriov" | "macvlan" | "ipvlan" | "host-device" | "vlan" | "ib-sriov"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list(v: Value) -> NetConfList {
        NetConfList::from_value(v).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn whereabouts_ranges_bounds_and_excludes() {
        let l = list(json!({"cniVersion":"1.0.0","name":"c","type":"sriov",
            "ipam":{"type":"whereabouts","range":"10.56.100.0/24","range_start":"10.56.100.20",
                "exclude":["10.56.100.32/28"]}}));
        let p = pool_of(&l).unwrap();
        assert_eq!(p.ipam, "whereabouts");
        assert!(!p.hands_out(ip("10.56.100.10")), "below range_start");
        assert!(p.hands_out(ip("10.56.100.20")));
        assert!(!p.hands_out(ip("10.56.100.40")), "excluded");
        assert!(p.hands_out(ip("10.56.100.50")));
        assert!(!p.hands_out(ip("10.56.101.50")), "outside the subnet");
        let dash = list(
            json!({"cniVersion":"1.0.0","name":"c","type":"macvlan","master":"eth1",
            "ipam":{"type":"whereabouts","range":"10.9.0.100-10.9.0.150/24"}}),
        );
        let p = pool_of(&dash).unwrap();
        assert!(p.hands_out(ip("10.9.0.100")) && p.hands_out(ip("10.9.0.150")));
        assert!(!p.hands_out(ip("10.9.0.99")) && !p.hands_out(ip("10.9.0.151")));
        let v6 = list(
            json!({"cniVersion":"1.0.0","name":"c","type":"macvlan","master":"eth1",
            "ipam":{"type":"whereabouts","ipRanges":[{"range":"fd00:56::/64","exclude":["fd00:56::/120"]}]}}),
        );
        let p = pool_of(&v6).unwrap();
        assert!(!p.hands_out(ip("fd00:56::10")));
        assert!(p.hands_out(ip("fd00:56::1:10")));
        assert!(!p.hands_out(ip("10.9.0.120")), "another family");
    }

    #[test]
    fn host_local_ranges_and_other_ipams() {
        let l = list(
            json!({"cniVersion":"1.0.0","name":"c","type":"macvlan","master":"eth1",
            "ipam":{"type":"host-local","ranges":[[{"subnet":"10.7.0.0/24","rangeStart":"10.7.0.100","rangeEnd":"10.7.0.200"}]]}}),
        );
        let p = pool_of(&l).unwrap();
        assert_eq!(p.ipam, "host-local");
        assert!(!p.hands_out(ip("10.7.0.10")));
        assert!(p.hands_out(ip("10.7.0.150")));
        let old = list(
            json!({"cniVersion":"1.0.0","name":"c","type":"macvlan","master":"eth1",
            "ipam":{"type":"host-local","subnet":"10.8.0.0/24"}}),
        );
        assert!(pool_of(&old).unwrap().hands_out(ip("10.8.0.9")));
        let stat = list(
            json!({"cniVersion":"1.0.0","name":"c","type":"macvlan","master":"eth1",
            "ipam":{"type":"static","addresses":[{"address":"10.7.0.10/24"}]}}),
        );
        assert_eq!(pool_of(&stat), None);
    }

    #[test]
    fn segments_by_type() {
        let sriov = |vlan: u64| {
            list(json!({"cniVersion":"1.0.0","name":"s","type":"sriov","vlan":vlan,"ipam":{}}))
        };
        assert_eq!(
            segment_of(&sriov(100), Some("intel.com/sriov_netdevice")),
            segment_of(&sriov(100), Some("intel.com/sriov_netdevice"))
        );
        assert_ne!(
            segment_of(&sriov(100), Some("intel.com/sriov_netdevice")),
            segment_of(&sriov(200), Some("intel.com/sriov_netdevice"))
        );
        assert_eq!(segment_of(&sriov(100), None), None);
        let mv = list(json!({"cniVersion":"1.0.0","name":"m","type":"macvlan","master":"ens1"}));
        let iv = list(json!({"cniVersion":"1.0.0","name":"i","type":"ipvlan","master":"ens1"}));
        assert_eq!(segment_of(&mv, None), segment_of(&iv, None));
        let nomaster = list(json!({"cniVersion":"1.0.0","name":"m","type":"macvlan"}));
        assert_eq!(segment_of(&nomaster, None), None);
        let br = list(json!({"cniVersion":"1.0.0","name":"b","type":"bridge"}));
        assert!(!spans_nodes(&br) && spans_nodes(&mv) && spans_nodes(&sriov(0)));
    }
}
