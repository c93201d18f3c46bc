//! The pod annotation `k8s.v1.cni.cncf.io/networks` (NPWG multi-net spec 4.1): the comma form
//! `[ns/]name[@ifname]` and the JSON list of network selection elements.

use crate::error::{code, CniError};
use crate::{limits, validate};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The annotation listing a pod's extra networks.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// The annotation overriding a pod's default network (Multus).
pub const DEFAULT_NETWORK_ANNOTATION: &str = "v1.multus-cni.io/default-network";
/// The annotation carrying the attachment status.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";
/// The NAD annotation naming a device-plugin resource.
pub const RESOURCE_NAME_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";

/// One network selection element.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSelection {
    /// NAD name.
    pub name: String,
    /// NAD namespace (defaults to the pod's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Requested interface name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Deprecated alias of `interface` (pre-3.2 Multus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_request: Option<String>,
    /// Static IPs (CIDR or plain).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// Static MAC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Gateways this attachment should own the default route(s) for.
    #[serde(
        rename = "default-route",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub default_route: Vec<String>,
    /// Port mappings (`runtimeConfig.portMappings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_mappings: Vec<Value>,
    /// Bandwidth (`runtimeConfig.bandwidth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Value>,
    /// Extra `args.cni` keys.
    #[serde(rename = "cni-args", default, skip_serializing_if = "Option::is_none")]
    pub cni_args: Option<Map<String, Value>>,
    /// InfiniBand GUID.
    #[serde(
        rename = "infiniband-guid",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub infiniband_guid: Option<String>,
    /// Device (PCI address) to use.
    #[serde(rename = "deviceID", default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// IPAMClaim reference (multi-net spec 1.3).
    #[serde(
        rename = "ipam-claim-reference",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub ipam_claim_reference: Option<String>,
}

/// `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`: a DNS label's characters (length is checked elsewhere).
fn is_dns_label(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    s.chars().next().is_some_and(ok)
        && s.chars().last().is_some_and(ok)
        && s.chars().all(|c| ok(c) || c == '-')
}

fn bad(annotation: &str, details: impl Into<String>) -> CniError {
    CniError::invalid_config(format!("invalid annotation {annotation}"), details)
}

impl NetworkSelection {
    /// The effective namespace.
    pub fn namespace_or<'a>(&'a self, pod_ns: &'a str) -> &'a str {
        self.namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(pod_ns)
    }

    /// The requested interface name, if any.
    pub fn requested_interface(&self) -> Option<&str> {
        self.interface
            .as_deref()
            .or(self.interface_request.as_deref())
            .filter(|s| !s.is_empty())
    }

    fn validate(&self, annotation: &str) -> Result<(), CniError> {
        if !is_dns_label(&self.name) {
            return Err(bad(
                annotation,
                format!("network name {:?} is not a DNS-1123 label", self.name),
            ));
        }
        if let Some(ns) = self.namespace.as_deref().filter(|n| !n.is_empty()) {
            if !is_dns_label(ns) {
                return Err(bad(
                    annotation,
                    format!("namespace {ns:?} is not a DNS-1123 label"),
                ));
            }
        }
        if let Some(i) = self.requested_interface() {
            if let Some(why) = validate::interface_name_problem(i) {
                return Err(bad(annotation, format!("interface name {i:?} {why}")));
            }
        }
        for ip in &self.ips {
            if !is_ip_or_cidr(ip) {
                return Err(bad(
                    annotation,
                    format!(
                        "network {:?}: {ip:?} is not an IP address or CIDR",
                        self.name
                    ),
                ));
            }
        }
        for gw in &self.default_route {
            if gw.parse::<std::net::IpAddr>().is_err() {
                return Err(bad(
                    annotation,
                    format!(
                        "network {:?}: default-route {gw:?} is not an IP address",
                        self.name
                    ),
                ));
            }
        }
        if let Some(mac) = &self.mac {
            if !is_mac(mac, 6) {
                return Err(bad(
                    annotation,
                    format!("network {:?}: {mac:?} is not a MAC address", self.name),
                ));
            }
        }
        if let Some(guid) = &self.infiniband_guid {
            if !is_mac(guid, 8) && !is_mac(guid, 20) {
                return Err(bad(
                    annotation,
                    format!(
                        "network {:?}: {guid:?} is not an InfiniBand GUID",
                        self.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// True for `a.b.c.d`, `a.b.c.d/n`, and IPv6 equivalents.
pub fn is_ip_or_cidr(s: &str) -> bool {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let Ok(ip) = addr.parse::<std::net::IpAddr>() else {
        return false;
    };
    match prefix {
        None => true,
        Some(p) => p
            .parse::<u8>()
            .is_ok_and(|n| n <= if ip.is_ipv4() { 32 } else { 128 }),
    }
}

/// True for a PCI address `domain:bus:device.function` (`0000:af:06.1`; domains may be wider).
pub fn is_pci_address(s: &str) -> bool {
    let Some((head, func)) = s.rsplit_once('.') else {
        return false;
    };
    let parts: Vec<&str> = head.split(':').collect();
    let hex = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_hexdigit());
    matches!(parts.as_slice(), [d, b, dev] if d.len() >= 4 && hex(d) && b.len() == 2 && hex(b) && dev.len() == 2 && hex(dev))
        && func.len() == 1
        && func.chars().all(|c| c.is_digit(8))
}

/// True for a colon-separated hex hardware address of `bytes` bytes.
pub fn is_mac(s: &str, bytes: usize) -> bool {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    parts.len() == bytes
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Parse the value of a networks annotation (either form). `annotation` names it in errors.
/// A value over [`limits::MAX_ANNOTATION_BYTES`] or listing more than [`limits::MAX_NETWORKS`]
/// networks is an error (code 7).
pub fn parse_selections(value: &str, annotation: &str) -> Result<Vec<NetworkSelection>, CniError> {
    limits::check(
        &format!("annotation {annotation}"),
        value.len(),
        limits::MAX_ANNOTATION_BYTES,
        code::INVALID_CONFIG,
    )?;
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let list = if trimmed.contains(['[', '{', '"']) {
        let v: Value = serde_json::from_str(trimmed)
            .map_err(|e| bad(annotation, format!("not valid JSON: {e}")))?;
        let Value::Array(items) = v else {
            return Err(bad(annotation, "the JSON form must be a list"));
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                serde_json::from_value::<NetworkSelection>(crate::result::strip_nulls(item))
                    .map_err(|e| bad(annotation, format!("element {i}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        trimmed
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|item| parse_comma_item(item, annotation))
            .collect::<Result<Vec<_>, _>>()?
    };
    if list.len() > limits::MAX_NETWORKS {
        return Err(bad(
            annotation,
            format!(
                "{} networks requested, the limit is {}",
                list.len(),
                limits::MAX_NETWORKS
            ),
        ));
    }
    for s in &list {
        s.validate(annotation)?;
    }
    Ok(list)
}

fn parse_comma_item(item: &str, annotation: &str) -> Result<NetworkSelection, CniError> {
    if item.matches('/').count() > 1 || item.matches('@').count() > 1 {
        return Err(bad(
            annotation,
            format!("{item:?}: at most one '/' and one '@' allowed"),
        ));
    }
    let (rest, ifname) = match item.split_once('@') {
        Some((r, i)) => (r, Some(i.to_string())),
        None => (item, None),
    };
    let (namespace, name) = match rest.split_once('/') {
        Some((ns, n)) => (Some(ns.to_string()), n.to_string()),
        None => (None, rest.to_string()),
    };
    Ok(NetworkSelection {
        name,
        namespace,
        interface: ifname,
        ..NetworkSelection::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comma_form() {
        let s = parse_selections(
            " macvlan-conf , other/sriov-net@data0,ns2/a ",
            NETWORKS_ANNOTATION,
        )
        .unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "macvlan-conf");
        assert_eq!(s[0].namespace_or("pod-ns"), "pod-ns");
        assert_eq!(s[1].namespace.as_deref(), Some("other"));
        assert_eq!(s[1].requested_interface(), Some("data0"));
        assert_eq!(s[2].namespace_or("x"), "ns2");
        assert!(parse_selections("", NETWORKS_ANNOTATION)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn json_form_with_every_key() {
        let v = r#"[{"name":"sriov-bank","namespace":"db","interface":"data0","ips":["10.56.217.10/24","fd00::10/64"],
            "mac":"02:00:00:00:00:aa","default-route":["10.56.217.1"],"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}],
            "bandwidth":{"ingressRate":1000,"egressRate":2000},"cni-args":{"foo":"bar"},"infiniband-guid":"c2:11:22:33:44:55:66:77",
            "deviceID":"0000:04:00.5","ipam-claim-reference":"claim-1"},{"name":"plain","interfaceRequest":"old0"}]"#;
        let s = parse_selections(v, NETWORKS_ANNOTATION).unwrap();
        assert_eq!(s[0].ips.len(), 2);
        assert_eq!(s[0].default_route, vec!["10.56.217.1"]);
        assert_eq!(s[0].port_mappings.len(), 1);
        assert_eq!(s[0].cni_args.as_ref().unwrap()["foo"], "bar");
        assert_eq!(s[0].device_id.as_deref(), Some("0000:04:00.5"));
        assert_eq!(s[0].ipam_claim_reference.as_deref(), Some("claim-1"));
        assert_eq!(s[1].requested_interface(), Some("old0"));
    }

    #[test]
    fn nulls_read_as_absent() {
        let s = parse_selections(
            r#"[{"name":"a","ips":null,"mac":null,"namespace":null}]"#,
            NETWORKS_ANNOTATION,
        )
        .unwrap();
        assert!(s[0].ips.is_empty() && s[0].mac.is_none());
    }

    #[test]
    fn malformed_annotations_are_named_errors() {
        for bad_value in [
            "a/b/c",
            "a@b@c",
            "Upper",
            "ok@this-name-is-way-too-long",
            "ok@bad/if",
            "[{\"name\":\"x\",\"ips\":[\"10.0.0.300\"]}]",
            "[{\"name\":\"x\",\"mac\":\"zz:00\"}]",
            "[{\"name\":\"x\",\"default-route\":[\"nope\"]}]",
            "{\"name\":\"x\"}",
            "[{\"name\":\"x\"",
            "[{\"nope\":1}]",
        ] {
            let e = parse_selections(bad_value, NETWORKS_ANNOTATION).unwrap_err();
            assert_eq!(e.code, 7, "{bad_value}");
            assert!(e.msg.contains(NETWORKS_ANNOTATION), "{bad_value}: {e}");
        }
    }

    #[test]
    fn oversized_annotations_name_the_limit() {
        let many = (0..=limits::MAX_NETWORKS)
            .map(|i| format!("n{i}"))
            .collect::<Vec<_>>();
        let ok = many[..limits::MAX_NETWORKS].join(",");
        assert_eq!(
            parse_selections(&ok, NETWORKS_ANNOTATION).unwrap().len(),
            limits::MAX_NETWORKS
        );
        let e = parse_selections(&many.join(","), NETWORKS_ANNOTATION).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains(NETWORKS_ANNOTATION), "{e}");
        assert_eq!(
            e.details,
            format!(
                "{} networks requested, the limit is {}",
                limits::MAX_NETWORKS + 1,
                limits::MAX_NETWORKS
            )
        );
        let long = format!("a{}", " ".repeat(limits::MAX_ANNOTATION_BYTES));
        let e = parse_selections(&long, NETWORKS_ANNOTATION).unwrap_err();
        assert_eq!(e.code, 7);
        assert_eq!(
            e.msg,
            format!("annotation {NETWORKS_ANNOTATION} is too large")
        );
        assert!(e
            .details
            .contains(&limits::MAX_ANNOTATION_BYTES.to_string()));
    }

    #[test]
    fn addresses() {
        assert!(
            is_ip_or_cidr("10.1.2.3")
                && is_ip_or_cidr("10.1.2.3/24")
                && is_ip_or_cidr("fd00::1/64")
        );
        assert!(!is_ip_or_cidr("10.1.2.3/33") && !is_ip_or_cidr("host"));
        assert!(is_mac("02:AA:bb:00:00:01", 6) && !is_mac("02:aa", 6));
        assert!(is_pci_address("0000:af:06.1") && is_pci_address("10000:00:02.0"));
        assert!(
            !is_pci_address("vdpa0")
                && !is_pci_address("0000:af:06.8")
                && !is_pci_address("af:06.1")
        );
    }

    #[test]
    fn dns_labels_character_by_character() {
        for ok in ["a", "0", "db", "kube-system", "a1-b2"] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "é"] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
    }
}
