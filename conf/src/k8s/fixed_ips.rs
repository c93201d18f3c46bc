//! Fixed addresses bound to a StatefulSet replica's identity: the NAD annotation
//! `plexus.cni.io/fixed-ips`, a map from StatefulSet name to a list indexed by the replica's
//! ordinal (`mysql-2` takes entry 2). Parsing, validation against the network's config (the
//! addresses fit its subnets, none is given twice, its IPAM can take requested addresses) and the
//! lookup of one replica's addresses. No I/O; see docs/annotations.md for the design.

use crate::error::CniError;
use crate::limits;
use crate::netconf::NetConfList;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The NAD annotation carrying the mapping.
pub const FIXED_IPS_ANNOTATION: &str = "plexus.cni.io/fixed-ips";

/// Most replicas one StatefulSet entry may list.
pub const MAX_ORDINALS: usize = 4096;

/// One address of the mapping: as written (`10.246.0.10/24`) and parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedAddress {
    /// The CIDR as written; this is what the delegate is given.
    pub cidr: String,
    /// The address.
    pub ip: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

/// The parsed mapping: StatefulSet name → addresses per ordinal (`None`: no address for it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FixedIps {
    /// Per StatefulSet, the addresses of each ordinal.
    pub sets: BTreeMap<String, Vec<Option<Vec<FixedAddress>>>>,
}

/// What the mapping gives one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// The mapping does not name the pod's StatefulSet: the network behaves as without it.
    NotMapped,
    /// The replica's addresses.
    Addresses(&'a [FixedAddress]),
}

fn bad(network: &str, details: impl Into<String>) -> CniError {
    CniError::invalid_config(
        format!("network {network}: invalid annotation {FIXED_IPS_ANNOTATION}"),
        details,
    )
}

/// Parse `a.b.c.d/len` or `v6/len`.
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, len_text) = s.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let len: u8 = len_text.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max && len.to_string() == len_text).then_some((ip, len))
}

/// True when `ip` is inside `net/prefix`.
pub fn contains(net: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// A StatefulSet name as Kubernetes allows it (DNS-1123 subdomain, at most 253 bytes).
fn valid_set_name(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.chars().next().is_some_and(ok)
        && s.chars().last().is_some_and(ok)
        && s.chars().all(|c| ok(c) || c == '-' || c == '.')
}

fn parse_entry(
    network: &str,
    where_: &str,
    v: &Value,
) -> Result<Option<Vec<FixedAddress>>, CniError> {
    let strings: Vec<&Value> = match v {
        Value::Null => return Ok(None),
        Value::String(_) => vec![v],
        Value::Array(a) if !a.is_empty() && a.len() <= 2 => a.iter().collect(),
        _ => {
            return Err(bad(
                network,
                format!("{where_}: expected an address (\"10.1.1.5/24\"), a list of one address per IP family, or null"),
            ))
        }
    };
    let mut out = Vec::new();
    for s in strings {
        let Some(text) = s.as_str() else {
            return Err(bad(network, format!("{where_}: {s} is not a string")));
        };
        let Some((ip, prefix)) = parse_cidr(text) else {
            return Err(bad(
                network,
                format!("{where_}: {text:?} is not an address with a prefix length (10.1.1.5/24, fd00::5/64)"),
            ));
        };
        if out
            .iter()
            .any(|a: &FixedAddress| a.ip.is_ipv4() == ip.is_ipv4())
        {
            return Err(bad(
                network,
                format!("{where_}: two addresses of the same IP family"),
            ));
        }
        out.push(FixedAddress {
            cidr: text.to_string(),
            ip,
            prefix,
        });
    }
    Ok(Some(out))
}

impl FixedIps {
    /// Parse the annotation of the NAD `network` (`ns/name`, for messages). Every address must
    /// parse, and no address may be given twice across the whole mapping.
    pub fn parse(network: &str, text: &str) -> Result<FixedIps, CniError> {
        if text.len() > limits::MAX_ANNOTATION_BYTES {
            return Err(bad(
                network,
                format!(
                    "{} bytes, over the {} byte limit",
                    text.len(),
                    limits::MAX_ANNOTATION_BYTES
                ),
            ));
        }
        let v: Value = serde_json::from_str(text).map_err(|e| {
            bad(
                network,
                format!("not JSON ({e}); expected {{\"<statefulset>\": [\"<address of ordinal 0>\", ...]}}"),
            )
        })?;
        let Value::Object(map) = v else {
            return Err(bad(
                network,
                "expected an object {\"<statefulset>\": [\"<address of ordinal 0>\", ...]}",
            ));
        };
        let mut sets = BTreeMap::new();
        let mut seen: BTreeMap<IpAddr, String> = BTreeMap::new();
        for (set, list) in map {
            if !valid_set_name(&set) {
                return Err(bad(network, format!("{set:?} is not a StatefulSet name")));
            }
            let Value::Array(items) = list else {
                return Err(bad(
                    network,
                    format!("{set}: expected a list of addresses indexed by ordinal"),
                ));
            };
            if items.len() > MAX_ORDINALS {
                return Err(bad(
                    network,
                    format!("{set}: more than {MAX_ORDINALS} ordinals"),
                ));
            }
            let mut entries = Vec::with_capacity(items.len());
            for (ord, item) in items.iter().enumerate() {
                let pod = format!("{set}-{ord}");
                let entry = parse_entry(network, &pod, item)?;
                for a in entry.iter().flatten() {
                    if let Some(first) = seen.insert(a.ip, pod.clone()) {
                        return Err(bad(
                            network,
                            format!("address {} is given twice: to {first} and to {pod}", a.ip),
                        ));
                    }
                }
                entries.push(entry);
            }
            sets.insert(set, entries);
        }
        Ok(FixedIps { sets })
    }

    /// Check the mapping against the network's config: its IPAM can take requested addresses
    /// (a plugin declaring the `ips` capability, or static/host-local IPAM reading
    /// `CNI_ARGS IP=`), the config names no fixed address of its own (static IPAM `addresses`
    /// would give every replica the same one), and every address fits a subnet the IPAM
    /// declares (host-local `subnet`/`ranges`, whereabouts `range`), when it declares one.
    pub fn check_against(&self, network: &str, list: &NetConfList) -> Result<(), CniError> {
        if !takes_requested_ips(list) {
            return Err(bad(
                network,
                format!("no plugin of network {:?} can take requested addresses: declare capabilities {{\"ips\": true}} or use static or host-local IPAM", list.name),
            ));
        }
        if !static_addresses(list).is_empty() {
            return Err(bad(
                network,
                "the network's static IPAM lists \"addresses\" of its own: every replica would get them too; remove them and keep the addresses in the mapping",
            ));
        }
        let subnets = declared_subnets(list);
        if subnets.is_empty() {
            return Ok(());
        }
        let named: Vec<String> = subnets.iter().map(|(n, p)| format!("{n}/{p}")).collect();
        for (set, entries) in &self.sets {
            for (ord, a) in entries.iter().enumerate() {
                for a in a.iter().flatten() {
                    let fits = subnets.iter().any(|(n, p)| contains(*n, *p, a.ip));
                    let same_family = subnets.iter().any(|(n, _)| n.is_ipv4() == a.ip.is_ipv4());
                    if !same_family {
                        // host-local and whereabouts hand out only addresses of the families
                        // they have ranges for: the ADD would fail later, less clearly.
                        return Err(bad(
                            network,
                            format!(
                                "{set}-{ord}: address {} is {} but the network's IPAM has only {} subnets ({}): add a range of that family or drop the address",
                                a.cidr,
                                family(a.ip),
                                family(subnets[0].0),
                                named.join(", ")
                            ),
                        ));
                    }
                    if !fits {
                        return Err(bad(
                            network,
                            format!(
                                "{set}-{ord}: address {} is outside the network's subnets {}",
                                a.cidr,
                                named.join(", ")
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The addresses of replica `ordinal` of StatefulSet `set`, or a clear error when the set
    /// is mapped but that ordinal is not.
    pub fn lookup(&self, network: &str, set: &str, ordinal: usize) -> Result<Lookup<'_>, CniError> {
        let Some(entries) = self.sets.get(set) else {
            return Ok(Lookup::NotMapped);
        };
        match entries.get(ordinal) {
            Some(Some(a)) => Ok(Lookup::Addresses(a)),
            _ => Err(CniError::invalid_config(
                format!("network {network}: no fixed address for {set}-{ordinal}"),
                format!(
                    "annotation {FIXED_IPS_ANNOTATION} maps {} ordinal(s) of StatefulSet {set} and none for ordinal {ordinal}; add an address at index {ordinal} (the pod starts once it is there)",
                    entries.iter().filter(|e| e.is_some()).count()
                ),
            )),
        }
    }
}

/// "IPv4" or "IPv6".
fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// The ordinal of pod `pod` of StatefulSet `set` (`mysql-2` → 2), if the name has that form.
pub fn ordinal(set: &str, pod: &str) -> Option<usize> {
    let n = pod.strip_prefix(set)?.strip_prefix('-')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0')))
        .then(|| n.parse().ok())
        .flatten()
}

/// Whether some plugin of `list` can take requested addresses: it declares the `ips`
/// capability, or its IPAM (static, host-local) reads `CNI_ARGS IP=`.
pub fn takes_requested_ips(list: &NetConfList) -> bool {
    list.plugins
        .iter()
        .any(|p| p.has_capability("ips") || matches!(p.ipam_type(), Some("static" | "host-local")))
}

/// Addresses a static IPAM config fixes for every pod of the network (`ipam.addresses`).
pub fn static_addresses(list: &NetConfList) -> Vec<IpAddr> {
    list.plugins
        .iter()
        .filter(|p| p.ipam_type() == Some("static"))
        .filter_map(|p| p.raw.get("ipam")?.get("addresses")?.as_array().cloned())
        .flatten()
        .filter_map(|a| a.get("address")?.as_str().and_then(parse_cidr))
        .map(|(ip, _)| ip)
        .collect()
}

/// Subnets the network's IPAM declares: host-local `subnet` and `ranges[][].subnet`,
/// whereabouts `range` and `ipRanges[].range` (CIDR form; its dual-stack form lists one range
/// per family there).
pub fn declared_subnets(list: &NetConfList) -> Vec<(IpAddr, u8)> {
    let mut out = Vec::new();
    for p in &list.plugins {
        let Some(ipam) = p.raw.get("ipam") else {
            continue;
        };
        let mut push = |v: Option<&Value>| {
            if let Some(c) = v.and_then(Value::as_str).and_then(parse_cidr) {
                out.push(c);
            }
        };
        push(ipam.get("subnet"));
        push(ipam.get("range"));
        for set in ipam
            .get("ranges")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for r in set.as_array().into_iter().flatten() {
                push(r.get("subnet"));
            }
        }
        for r in ipam
            .get("ipRanges")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            push(r.get("range"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NET: &str = "db/data";

    fn list(v: Value) -> NetConfList {
        NetConfList::from_value(v).unwrap()
    }

    fn host_local() -> NetConfList {
        list(json!({"cniVersion":"1.0.0","name":"data","type":"macvlan",
            "ipam":{"type":"host-local","ranges":[[{"subnet":"10.246.0.0/24"}],[{"subnet":"fd00:246::/64"}]]}}))
    }

    #[test]
    fn parses_lists_indexed_by_ordinal() {
        let m = FixedIps::parse(
            NET,
            r#"{"mysql":["10.246.0.10/24",null,["10.246.0.12/24","fd00:246::12/64"]],"pg":[]}"#,
        )
        .unwrap();
        let Lookup::Addresses(a) = m.lookup(NET, "mysql", 0).unwrap() else {
            panic!()
        };
        assert_eq!(a[0].cidr, "10.246.0.10/24");
        let Lookup::Addresses(a) = m.lookup(NET, "mysql", 2).unwrap() else {
            panic!()
        };
        assert_eq!(a.len(), 2);
        assert_eq!(m.lookup(NET, "redis", 0).unwrap(), Lookup::NotMapped);
        // A hole and the end of the list: an error naming the replica and the fix.
        for ord in [1, 3] {
            let e = m.lookup(NET, "mysql", ord).unwrap_err();
            assert_eq!(e.code, 7);
            assert!(
                e.msg.contains(&format!("mysql-{ord}")) && e.msg.contains(NET),
                "{e}"
            );
            assert!(e.details.contains(&format!("index {ord}")), "{e}");
        }
        m.check_against(NET, &host_local()).unwrap();
    }

    #[test]
    fn bad_mappings_are_refused_with_the_reason() {
        let cases = [
            ("[1]", "expected an object"),
            ("{bad", "not JSON"),
            (r#"{"My_Set":["10.0.0.1/24"]}"#, "not a StatefulSet name"),
            (r#"{"a":"10.0.0.1/24"}"#, "list of addresses"),
            (r#"{"a":["10.0.0.1"]}"#, "prefix length"),
            (r#"{"a":["10.0.0.300/24"]}"#, "prefix length"),
            (r#"{"a":["10.0.0.1/33"]}"#, "prefix length"),
            (r#"{"a":[5]}"#, "expected an address"),
            (r#"{"a":[["10.0.0.1/24","10.0.0.2/24"]]}"#, "same IP family"),
            (
                r#"{"a":["10.0.0.1/24","10.0.0.1/24"]}"#,
                "given twice: to a-0 and to a-1",
            ),
            (
                r#"{"a":["10.0.0.1/24"],"b":["10.0.0.1/16"]}"#,
                "given twice: to a-0 and to b-0",
            ),
        ];
        for (text, want) in cases {
            let e = FixedIps::parse(NET, text).unwrap_err();
            assert_eq!(e.code, 7, "{text}");
            assert!(
                e.msg.contains(NET) && e.msg.contains(FIXED_IPS_ANNOTATION),
                "{e}"
            );
            assert!(e.details.contains(want), "{text}: {e}");
        }
        let huge = format!("{{\"a\":[{}]}}", vec!["null"; 5000].join(","));
        assert!(FixedIps::parse(NET, &huge)
            .unwrap_err()
            .details
            .contains("ordinals"));
    }

    #[test]
    fn checked_against_the_network() {
        let m = FixedIps::parse(NET, r#"{"mysql":["10.9.0.10/24"]}"#).unwrap();
        let e = m.check_against(NET, &host_local()).unwrap_err();
        assert!(
            e.details.contains("mysql-0") && e.details.contains("10.246.0.0/24"),
            "{e}"
        );
        // IPAM that cannot take requested addresses.
        let dhcp =
            list(json!({"cniVersion":"1.0.0","name":"d","type":"macvlan","ipam":{"type":"dhcp"}}));
        assert!(m
            .check_against(NET, &dhcp)
            .unwrap_err()
            .details
            .contains("\"ips\": true"));
        // whereabouts declaring the capability: fine, checked against its range.
        let wb = list(
            json!({"cniVersion":"1.0.0","name":"w","type":"macvlan","capabilities":{"ips":true},
            "ipam":{"type":"whereabouts","range":"10.9.0.0/16"}}),
        );
        m.check_against(NET, &wb).unwrap();
        // Static IPAM with its own address: the issue's duplicate, refused.
        let fixed = list(json!({"cniVersion":"1.0.0","name":"s","type":"macvlan",
            "ipam":{"type":"static","addresses":[{"address":"10.9.0.10/24"}]}}));
        assert!(m
            .check_against(NET, &fixed)
            .unwrap_err()
            .details
            .contains("remove them"));
        let bare = list(
            json!({"cniVersion":"1.0.0","name":"s","type":"macvlan","ipam":{"type":"static"}}),
        );
        m.check_against(NET, &bare).unwrap();
        assert_eq!(
            static_addresses(&fixed),
            vec!["10.9.0.10".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn ipv6_and_dual_entries_per_ordinal() {
        let m = FixedIps::parse(
            NET,
            r#"{"pg":[["10.246.0.20/24","fd00:246::20/64"],"fd00:246::21/64",["fd00:246::22/64","10.246.0.22/24"]]}"#,
        )
        .unwrap();
        let Lookup::Addresses(a) = m.lookup(NET, "pg", 1).unwrap() else {
            panic!()
        };
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].ip, "fd00:246::21".parse::<IpAddr>().unwrap());
        assert_eq!((a[0].prefix, a[0].cidr.as_str()), (64, "fd00:246::21/64"));
        let Lookup::Addresses(a) = m.lookup(NET, "pg", 2).unwrap() else {
            panic!()
        };
        assert_eq!(a.len(), 2);
        assert!(
            a[0].ip.is_ipv6() && a[1].ip.is_ipv4(),
            "the order as written"
        );
        m.check_against(NET, &host_local()).unwrap();
        // The same IPv6 address in two spellings is the same address: given twice.
        let e = FixedIps::parse(
            NET,
            r#"{"pg":["2001:db8::a/64"],"mysql":[["10.0.0.1/24","2001:0db8:0:0::a/64"]]}"#,
        )
        .unwrap_err();
        assert!(
            e.details.contains("address 2001:db8::a is given twice"),
            "{e}"
        );
        for (text, want) in [
            (r#"{"a":["fd00::1/129"]}"#, "prefix length"),
            (r#"{"a":["fd00::1"]}"#, "prefix length"),
            (r#"{"a":["[fd00::1]/64"]}"#, "prefix length"),
            (r#"{"a":[["fd00::1/64","fd00::2/64"]]}"#, "same IP family"),
        ] {
            let e = FixedIps::parse(NET, text).unwrap_err();
            assert!(e.details.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn ipv6_addresses_are_checked_against_the_networks_ipv6_ranges() {
        // Outside the IPv6 range.
        let m = FixedIps::parse(NET, r#"{"pg":[["10.246.0.20/24","fd00:999::20/64"]]}"#).unwrap();
        let e = m.check_against(NET, &host_local()).unwrap_err();
        assert!(
            e.details.contains("pg-0")
                && e.details.contains("fd00:999::20/64")
                && e.details.contains("fd00:246::/64"),
            "{e}"
        );
        // An IPv6 address on an IPv4-only host-local network: refused, naming the family.
        let v4_only = list(json!({"cniVersion":"1.0.0","name":"data","type":"macvlan",
            "ipam":{"type":"host-local","ranges":[[{"subnet":"10.246.0.0/24"}]]}}));
        let m = FixedIps::parse(NET, r#"{"pg":[["10.246.0.20/24","fd00:246::20/64"]]}"#).unwrap();
        let e = m.check_against(NET, &v4_only).unwrap_err();
        assert!(
            e.details.contains("fd00:246::20/64 is IPv6")
                && e.details.contains("only IPv4 subnets (10.246.0.0/24)"),
            "{e}"
        );
        // whereabouts' dual-stack form (ipRanges): each family checked against its range.
        let wb = list(json!({"cniVersion":"1.0.0","name":"w","type":"macvlan",
            "capabilities":{"ips":true},
            "ipam":{"type":"whereabouts","ipRanges":[{"range":"10.246.0.0/24"},{"range":"fd00:246::/64"}]}}));
        m.check_against(NET, &wb).unwrap();
        let v6_only = list(json!({"cniVersion":"1.0.0","name":"w","type":"macvlan",
            "capabilities":{"ips":true},"ipam":{"type":"whereabouts","range":"fd00:246::/64"}}));
        FixedIps::parse(NET, r#"{"pg":["fd00:246::20/64"]}"#)
            .unwrap()
            .check_against(NET, &v6_only)
            .unwrap();
        assert!(m
            .check_against(NET, &v6_only)
            .unwrap_err()
            .details
            .contains("10.246.0.20/24 is IPv4"));
    }

    #[test]
    fn ordinals_come_from_the_name_suffix() {
        assert_eq!(ordinal("mysql", "mysql-0"), Some(0));
        assert_eq!(ordinal("mysql", "mysql-12"), Some(12));
        assert_eq!(ordinal("my-sql", "my-sql-3"), Some(3));
        for bad in [
            "mysql", "mysql-", "mysql-01", "mysql-x", "mysqlx-1", "mysql--1", "other-1",
        ] {
            assert_eq!(ordinal("mysql", bad), None, "{bad}");
        }
        assert!(contains(
            "10.0.0.0".parse().unwrap(),
            0,
            "1.2.3.4".parse().unwrap()
        ));
        assert!(!contains(
            "10.0.0.0".parse().unwrap(),
            8,
            "fd00::1".parse().unwrap()
        ));
        assert_eq!(parse_cidr("10.0.0.1/024"), None);
    }
}
