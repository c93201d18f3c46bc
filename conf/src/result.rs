//! CNI results in every spec version, held in one canonical (1.1.0) model, with the conversions
//! the spec and libcni define between the 0.1/0.2, 0.3/0.4 and 1.x formats.

use crate::error::{code, CniError};
use crate::version::{Band, CniVersion};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// A result in the canonical 1.1.0 model; `cni_version` is the version it was parsed from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CniResult {
    /// Version the result was produced in.
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    /// Interfaces created or touched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// IP configurations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    /// Routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// DNS settings.
    #[serde(default, skip_serializing_if = "Dns::is_empty")]
    pub dns: Dns,
}

/// One interface of a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hardware address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Netns path for container interfaces; empty on the host side.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    /// Socket path for userspace interfaces (1.1.0).
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub socket_path: String,
    /// PCI address of the device (1.1.0).
    #[serde(rename = "pciID", default, skip_serializing_if = "String::is_empty")]
    pub pci_id: String,
}

/// One IP configuration of a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Index into `interfaces`; absent for IPAM results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<i64>,
    /// Address in CIDR notation.
    pub address: String,
    /// Gateway address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// A route of a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination in CIDR notation.
    pub dst: String,
    /// Next hop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
    /// Route MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Advertised MSS (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Priority / metric (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Scope (1.1.0): 0 global, 253 link, 254 host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u32>,
}

/// DNS settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    /// Search domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// True for an IPv6 address or CIDR string.
pub fn is_v6(addr: &str) -> bool {
    addr.contains(':')
}

/// True for a default-route destination: empty, or any address with prefix length 0 in either
/// family (`0.0.0.0/0`, `::/0`, and the spellings other plugins write, e.g.
/// `0:0:0:0:0:0:0:0/0`, `0/0`).
pub fn is_default_dst(dst: &str) -> bool {
    if dst.is_empty() {
        return true;
    }
    let Some((addr, len)) = dst.split_once('/') else {
        return false;
    };
    len.trim() == "0"
        && (addr == "0"
            || addr
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_unspecified()))
}

#[derive(Deserialize)]
struct LegacyIp {
    ip: String,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    routes: Vec<LegacyRoute>,
}

#[derive(Deserialize, Serialize)]
struct LegacyRoute {
    dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gw: Option<String>,
}

/// Remove `null` members from objects, recursively (Go writes `null` for empty slices).
pub fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

fn decode_err(e: impl std::fmt::Display) -> CniError {
    CniError::decode("failed to decode CNI result", e.to_string())
}

impl CniResult {
    /// Parse a result of any version. The body decides the format (a `0.2.0`-labelled body with
    /// `ips` is read as 0.3+, a quirk of Debian's loopback); `fallback_version` is used when the
    /// result carries no `cniVersion` (libcni's `ParsePrevResult` does the same).
    pub fn parse_with_version(value: &Value, fallback_version: &str) -> Result<Self, CniError> {
        let obj = value
            .as_object()
            .ok_or_else(|| decode_err("result is not a JSON object"))?;
        let version = obj
            .get("cniVersion")
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .unwrap_or(fallback_version)
            .to_string();
        // Go marshals empty slices and pointers as null: read null as absent.
        let cleaned = strip_nulls(value.clone());
        let value = &cleaned;
        let obj = value
            .as_object()
            .ok_or_else(|| decode_err("result is not a JSON object"))?;
        let legacy = obj.contains_key("ip4") || obj.contains_key("ip6");
        let modern = obj.contains_key("ips") || obj.contains_key("interfaces");
        let mut result = if legacy && !modern {
            Self::parse_legacy(obj)?
        } else {
            let mut v = value.clone();
            if let Some(ips) = v.get_mut("ips").and_then(Value::as_array_mut) {
                for ip in ips.iter_mut().filter_map(Value::as_object_mut) {
                    ip.remove("version");
                }
            }
            serde_json::from_value::<CniResult>(v).map_err(decode_err)?
        };
        result.cni_version = version;
        Ok(result)
    }

    /// Parse a result that carries its own `cniVersion` (0.1.0 if absent, as libcni decodes it).
    pub fn parse(value: &Value) -> Result<Self, CniError> {
        Self::parse_with_version(value, "0.1.0")
    }

    fn parse_legacy(obj: &Map<String, Value>) -> Result<Self, CniError> {
        let mut r = CniResult::default();
        for key in ["ip4", "ip6"] {
            let Some(v) = obj.get(key).filter(|v| !v.is_null()) else {
                continue;
            };
            let ip: LegacyIp = serde_json::from_value(v.clone()).map_err(decode_err)?;
            r.ips.push(IpConfig {
                interface: None,
                address: ip.ip,
                gateway: ip.gateway,
            });
            r.routes.extend(ip.routes.into_iter().map(|lr| Route {
                dst: lr.dst,
                gw: lr.gw,
                ..Route::default()
            }));
        }
        if let Some(dns) = obj.get("dns").filter(|v| !v.is_null()) {
            r.dns = serde_json::from_value(dns.clone()).map_err(decode_err)?;
        }
        Ok(r)
    }

    /// Serialize in the given version, converting as the spec defines. Converting to 0.1/0.2
    /// keeps the first IPv4 and IPv6 address and fails when there is none.
    pub fn to_value(&self, version: &str) -> Result<Value, CniError> {
        let v = CniVersion::parse(version)?;
        match v.band() {
            Band::V1 => {
                let mut out = serde_json::to_value(self).map_err(decode_err)?;
                out["cniVersion"] = json!(v.as_str());
                Ok(out)
            }
            Band::V03 => {
                let mut out = Map::new();
                out.insert("cniVersion".into(), json!(v.as_str()));
                if !self.interfaces.is_empty() {
                    let ifs: Vec<Value> = self
                        .interfaces
                        .iter()
                        .map(|i| {
                            let mut o = Map::new();
                            o.insert("name".into(), json!(i.name));
                            if !i.mac.is_empty() {
                                o.insert("mac".into(), json!(i.mac));
                            }
                            if !i.sandbox.is_empty() {
                                o.insert("sandbox".into(), json!(i.sandbox));
                            }
                            Value::Object(o)
                        })
                        .collect();
                    out.insert("interfaces".into(), Value::Array(ifs));
                }
                if !self.ips.is_empty() {
                    let ips: Vec<Value> = self
                        .ips
                        .iter()
                        .map(|ip| {
                            let mut o = Map::new();
                            o.insert(
                                "version".into(),
                                json!(if is_v6(&ip.address) { "6" } else { "4" }),
                            );
                            if let Some(i) = ip.interface {
                                o.insert("interface".into(), json!(i));
                            }
                            o.insert("address".into(), json!(ip.address));
                            if let Some(g) = &ip.gateway {
                                o.insert("gateway".into(), json!(g));
                            }
                            Value::Object(o)
                        })
                        .collect();
                    out.insert("ips".into(), Value::Array(ips));
                }
                if !self.routes.is_empty() {
                    out.insert(
                        "routes".into(),
                        serde_json::to_value(&self.routes).map_err(decode_err)?,
                    );
                }
                if !self.dns.is_empty() {
                    out.insert(
                        "dns".into(),
                        serde_json::to_value(&self.dns).map_err(decode_err)?,
                    );
                }
                Ok(Value::Object(out))
            }
            Band::Legacy => {
                let mut out = Map::new();
                out.insert("cniVersion".into(), json!(v.as_str()));
                let first = |v6: bool| self.ips.iter().find(|ip| is_v6(&ip.address) == v6);
                if first(false).is_none() && first(true).is_none() {
                    return Err(CniError::new(
                        code::INCOMPATIBLE_VERSION,
                        format!("cannot convert result to {version}"),
                        "no valid IP addresses",
                    ));
                }
                for (key, fam6) in [("ip4", false), ("ip6", true)] {
                    let Some(ip) = first(fam6) else { continue };
                    let mut o = Map::new();
                    o.insert("ip".into(), json!(ip.address));
                    if let Some(g) = &ip.gateway {
                        o.insert("gateway".into(), json!(g));
                    }
                    let routes: Vec<LegacyRoute> = self
                        .routes
                        .iter()
                        .filter(|r| is_v6(&r.dst) == fam6)
                        .map(|r| LegacyRoute {
                            dst: r.dst.clone(),
                            gw: r.gw.clone(),
                        })
                        .collect();
                    if !routes.is_empty() {
                        o.insert(
                            "routes".into(),
                            serde_json::to_value(routes).map_err(decode_err)?,
                        );
                    }
                    out.insert(key.into(), Value::Object(o));
                }
                if !self.dns.is_empty() {
                    out.insert(
                        "dns".into(),
                        serde_json::to_value(&self.dns).map_err(decode_err)?,
                    );
                }
                Ok(Value::Object(out))
            }
        }
    }

    /// Interfaces that live in a sandbox (the container side), with their indexes.
    pub fn sandbox_interfaces(&self) -> impl Iterator<Item = (usize, &Interface)> {
        self.interfaces
            .iter()
            .enumerate()
            .filter(|(_, i)| !i.sandbox.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    const BRIDGE_100: &str = r#"{"cniVersion":"1.0.0",
     "interfaces":[{"name":"cnitestbr0","mac":"de:5d:00:00:00:01"},{"name":"vethad9d88c0","mac":"06:18:00:00:00:02"},
                   {"name":"eth0","mac":"aa:48:00:00:00:03","sandbox":"/var/run/netns/cnit1"}],
     "ips":[{"interface":2,"address":"10.77.0.2/24","gateway":"10.77.0.1"}],
     "routes":[{"dst":"0.0.0.0/0"}], "dns":{}}"#;

    #[test]
    fn parses_debian_bridge_result() {
        let r = CniResult::parse(&v(BRIDGE_100)).unwrap();
        assert_eq!(r.cni_version, "1.0.0");
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.ips[0].interface, Some(2));
        assert_eq!(r.sandbox_interfaces().next().unwrap().1.name, "eth0");
        assert!(r.dns.is_empty());
    }

    #[test]
    fn v1_to_v040_adds_version_and_drops_new_fields() {
        let mut r = CniResult::parse(&v(BRIDGE_100)).unwrap();
        r.interfaces[2].mtu = Some(1500);
        r.interfaces[2].pci_id = "0000:04:00.5".into();
        r.ips.push(IpConfig {
            interface: Some(2),
            address: "fd00::2/64".into(),
            gateway: None,
        });
        let out = r.to_value("0.4.0").unwrap();
        assert_eq!(out["cniVersion"], "0.4.0");
        assert_eq!(out["ips"][0]["version"], "4");
        assert_eq!(out["ips"][1]["version"], "6");
        assert!(out["interfaces"][2].get("mtu").is_none());
        assert!(out["interfaces"][2].get("pciID").is_none());
        // And back up: lossless for the 0.3/0.4 fields.
        let back = CniResult::parse(&out).unwrap();
        assert_eq!(back.ips, r.ips);
        assert_eq!(back.routes, r.routes);
    }

    #[test]
    fn static_040_example_round_trips() {
        let src = r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.1.1/24","gateway":"10.1.1.254"},{"version":"6","address":"fd00::1/64"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#;
        let r = CniResult::parse(&v(src)).unwrap();
        let out = r.to_value("0.4.0").unwrap();
        assert_eq!(
            out,
            v(
                r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.1.1/24","gateway":"10.1.1.254"},{"version":"6","address":"fd00::1/64"}],"routes":[{"dst":"0.0.0.0/0"}]}"#
            )
        );
        let v1 = r.to_value("1.1.0").unwrap();
        assert!(v1["ips"][0].get("version").is_none());
        assert_eq!(v1["cniVersion"], "1.1.0");
    }

    #[test]
    fn down_to_020_keeps_first_of_each_family() {
        let src = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.1.1/24","gateway":"10.1.1.254"},{"address":"10.1.1.2/24"},{"address":"fd00::1/64"}],
            "routes":[{"dst":"0.0.0.0/0","gw":"10.1.1.254"},{"dst":"fd00:1::/64","gw":"fd00::9"}],"dns":{"nameservers":["1.1.1.1"]}}"#;
        let out = CniResult::parse(&v(src))
            .unwrap()
            .to_value("0.2.0")
            .unwrap();
        assert_eq!(
            out,
            v(
                r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.1.1.1/24","gateway":"10.1.1.254","routes":[{"dst":"0.0.0.0/0","gw":"10.1.1.254"}]},
                  "ip6":{"ip":"fd00::1/64","routes":[{"dst":"fd00:1::/64","gw":"fd00::9"}]},"dns":{"nameservers":["1.1.1.1"]}}"#
            )
        );
    }

    #[test]
    fn down_to_010_without_ip_fails() {
        let r = CniResult::parse(&v(
            r#"{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}]}"#,
        ))
        .unwrap();
        let e = r.to_value("0.1.0").unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(e.details.contains("no valid IP"));
    }

    #[test]
    fn legacy_020_up_to_1x() {
        let src = r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.1.1.1/24","gateway":"10.1.1.254","routes":[{"dst":"0.0.0.0/0"}]},"ip6":{"ip":"fd00::1/64"},"dns":{}}"#;
        let r = CniResult::parse(&v(src)).unwrap();
        assert_eq!(r.cni_version, "0.2.0");
        let out = r.to_value("1.0.0").unwrap();
        assert_eq!(
            out,
            v(
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.1.1/24","gateway":"10.1.1.254"},{"address":"fd00::1/64"}],"routes":[{"dst":"0.0.0.0/0"}]}"#
            )
        );
        // Within the legacy band only the label changes.
        assert_eq!(r.to_value("0.1.0").unwrap()["ip4"]["ip"], "10.1.1.1/24");
    }

    #[test]
    fn loopback_quirk_020_label_with_modern_body() {
        let src = r#"{"cniVersion":"0.2.0","interfaces":[{"name":"lo","mac":"00:00:00:00:00:00","sandbox":"/x"}],"ips":[{"version":"4","interface":0,"address":"127.0.0.1/8"}],"dns":{}}"#;
        let r = CniResult::parse(&v(src)).unwrap();
        assert_eq!(r.ips[0].address, "127.0.0.1/8");
        assert_eq!(r.interfaces[0].name, "lo");
    }

    #[test]
    fn fallback_version_and_garbage() {
        let r = CniResult::parse_with_version(&v(r#"{"ips":[{"address":"10.0.0.1/8"}]}"#), "0.4.0")
            .unwrap();
        assert_eq!(r.cni_version, "0.4.0");
        assert_eq!(CniResult::parse(&v("[1,2]")).unwrap_err().code, 6);
        assert_eq!(
            CniResult::parse(&v(r#"{"ips":"nope"}"#)).unwrap_err().code,
            6
        );
        assert_eq!(CniResult::default().to_value("7.0.0").unwrap_err().code, 1);
    }

    #[test]
    fn default_destinations_in_both_families_whatever_the_spelling() {
        for d in [
            "",
            "0.0.0.0/0",
            "::/0",
            "::0/0",
            "0::0/0",
            "0:0:0:0:0:0:0:0/0",
            "0/0",
        ] {
            assert!(is_default_dst(d), "{d:?}");
        }
        for d in [
            "0.0.0.0/8",
            "::/64",
            "10.0.0.0/0x",
            "2001:db8::/0",
            "2001:db8::/32",
            "10.1.0.0/16",
            "::",
            "0.0.0.0",
        ] {
            assert!(!is_default_dst(d), "{d:?}");
        }
    }

    #[test]
    fn go_nulls_are_absent() {
        let r = CniResult::parse(&v(r#"{"cniVersion":"1.0.0","interfaces":null,"ips":[{"address":"10.0.0.2/24","gateway":null}],"routes":null,"dns":null}"#)).unwrap();
        assert_eq!(r.ips[0].gateway, None);
        assert!(r.interfaces.is_empty() && r.dns.is_empty());
    }

    #[test]
    fn v11_fields_survive_1x_band() {
        let src = r#"{"cniVersion":"1.1.0","interfaces":[{"name":"net1","mac":"02:00:00:00:00:01","mtu":9000,"sandbox":"/run/netns/x","pciID":"0000:04:00.5"}],
            "routes":[{"dst":"10.0.0.0/8","gw":"10.1.0.1","mtu":1400,"advmss":1360,"priority":10,"table":100,"scope":0}]}"#;
        let r = CniResult::parse(&v(src)).unwrap();
        let out = r.to_value("1.1.0").unwrap();
        assert_eq!(out, v(src));
        assert_eq!(r.to_value("1.0.0").unwrap()["interfaces"][0]["mtu"], 9000);
    }
}
