//! Host resources a delegate config names — host interfaces (`master`, `bridge`, `device`),
//! VLAN IDs (`vlan`, `vlanId`, `vlanTrunk`), PCI devices (`deviceID`, `pciBusID`,
//! `kernelpath`) — and the operator's allowances per namespace: `<namespace>.<kind>` (or
//! `_all.<kind>` for every namespace) → a comma list, the `plexus-nad-policy` ConfigMap's form.

use crate::error::CniError;
use serde_json::Value;
use std::collections::BTreeMap;

/// A kind of host resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostKind {
    /// A host network interface or bridge.
    Interface,
    /// A VLAN ID (or a trunk range `a-b`).
    Vlan,
    /// A device-plugin / DRA resource name.
    Resource,
    /// A PCI device (address or sysfs path).
    Device,
}

impl HostKind {
    /// The allowance key suffix.
    pub fn key(self) -> &'static str {
        match self {
            HostKind::Interface => "interfaces",
            HostKind::Vlan => "vlans",
            HostKind::Resource => "resourceNames",
            HostKind::Device => "devices",
        }
    }

    fn from_key(s: &str) -> Option<HostKind> {
        [
            HostKind::Interface,
            HostKind::Vlan,
            HostKind::Resource,
            HostKind::Device,
        ]
        .into_iter()
        .find(|k| k.key() == s)
    }
}

/// Allowance key prefix for every namespace (not a valid namespace name, so never one).
pub const ALL_NAMESPACES: &str = "_all";

/// One host resource a config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostUse {
    /// Where: `plugins[0].master`.
    pub location: String,
    /// What kind.
    pub kind: HostKind,
    /// The value (`""` for a macvlan/ipvlan without `master`: the node's default-route
    /// interface); VLAN ranges as `a-b`.
    pub value: String,
}

/// Plugins whose `master` defaults to the node's default-route interface when left out.
const DEFAULT_MASTER_PLUGINS: &[&str] = &["macvlan", "ipvlan"];

/// The host resources the plugins of `config` (a conflist or a single config) name, at any
/// depth (a plugin's `delegate`, its IPAM, `args`). `skip_devices`: the plugins' top-level
/// device keys were filled in from the kubelet's allocation (checked by resource name instead).
pub fn find(config: &Value, skip_devices: bool) -> Vec<HostUse> {
    let mut out = Vec::new();
    for (at, p) in super::plugins(config) {
        let Some(obj) = p.as_object() else { continue };
        let ty = obj.get("type").and_then(Value::as_str).unwrap_or("");
        if DEFAULT_MASTER_PLUGINS.contains(&ty) && !obj.contains_key("master") {
            out.push(HostUse {
                location: join(&at, "master"),
                kind: HostKind::Interface,
                value: String::new(),
            });
        }
        walk(p, &at, skip_devices, true, &mut out);
    }
    out
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

/// The resource keys of object `v` at `at`, and of every object below it.
fn walk(v: &Value, at: &str, skip_devices: bool, top: bool, out: &mut Vec<HostUse>) {
    match v {
        Value::Object(obj) => {
            for (key, item) in obj {
                let here = join(at, key);
                let scalar_value = !item.is_object() && !item.is_array() && !item.is_null();
                let mut push = |kind, value: String| {
                    out.push(HostUse {
                        location: here.clone(),
                        kind,
                        value,
                    })
                };
                match key.as_str() {
                    "master" | "bridge" | "device" if scalar_value => {
                        push(HostKind::Interface, scalar(item))
                    }
                    // vlan 0 is "no VLAN" in sriov-cni and the bridge plugin.
                    "vlan" | "vlanId" | "vlanID" if scalar_value && item.as_u64() != Some(0) => {
                        push(HostKind::Vlan, scalar(item))
                    }
                    "deviceID" | "pciBusID" | "kernelpath"
                        if scalar_value && !(top && skip_devices) =>
                    {
                        push(HostKind::Device, scalar(item))
                    }
                    "vlanTrunk" if item.is_array() => {
                        for (i, t) in item.as_array().into_iter().flatten().enumerate() {
                            let id = |k: &str| t.get(k).map(scalar);
                            let value = match (id("id"), id("minID"), id("maxID")) {
                                (Some(id), _, _) => id,
                                (None, Some(a), Some(b)) => format!("{a}-{b}"),
                                _ => scalar(t),
                            };
                            out.push(HostUse {
                                location: format!("{here}[{i}]"),
                                kind: HostKind::Vlan,
                                value,
                            });
                        }
                    }
                    _ => walk(item, &here, skip_devices, false, out),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, &format!("{at}[{i}]"), skip_devices, false, out);
            }
        }
        _ => {}
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A VLAN allowance: an inclusive range.
type VlanRange = (u16, u16);

/// The highest VLAN ID.
const MAX_VLAN: u16 = 4094;

fn parse_vlan_range(s: &str) -> Option<VlanRange> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let (a, b) = (a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?);
    (a <= b && b <= MAX_VLAN).then_some((a, b))
}

/// The operator's allowances, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowances {
    /// (namespace or `_all`, kind) → entries.
    entries: BTreeMap<(String, HostKind), Vec<String>>,
}

impl Allowances {
    /// Parse `<ns>.<kind>` → comma list; invalid-config (7) on a malformed key or VLAN entry.
    pub fn parse(map: &BTreeMap<String, String>) -> Result<Allowances, CniError> {
        let mut entries = BTreeMap::new();
        for (k, v) in map {
            let bad = |why: String| {
                CniError::invalid_config(
                    format!("nadPolicy.hostResources.allow key {k:?}: {why}"),
                    "keys are <namespace>.<interfaces|vlans|resourceNames|devices> or _all.<kind>; values comma lists (a trailing '*' matches a prefix, '*' anything; VLANs N or A-B)",
                )
            };
            let (ns, kind) = k
                .rsplit_once('.')
                .ok_or_else(|| bad("no '.<kind>'".into()))?;
            let kind =
                HostKind::from_key(kind).ok_or_else(|| bad(format!("unknown kind {kind:?}")))?;
            if ns.is_empty() {
                return Err(bad("no namespace".into()));
            }
            let list: Vec<String> = v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if kind == HostKind::Vlan {
                if let Some(e) = list
                    .iter()
                    .find(|e| *e != "*" && parse_vlan_range(e).is_none())
                {
                    return Err(bad(format!(
                        "{e:?} is not a VLAN ID or range (0-{MAX_VLAN})"
                    )));
                }
            }
            entries.insert((ns.to_string(), kind), list);
        }
        Ok(Allowances { entries })
    }

    /// The entries that apply to `ns` for `kind` (its own and `_all`'s).
    pub fn entries(&self, ns: &str, kind: HostKind) -> Vec<&str> {
        [ns, ALL_NAMESPACES]
            .iter()
            .filter_map(|n| self.entries.get(&(n.to_string(), kind)))
            .flatten()
            .map(String::as_str)
            .collect()
    }

    /// Whether `ns` may use `value` of `kind`. An empty interface value (macvlan/ipvlan
    /// without `master`) needs `*`: it is whatever the node routes by default.
    pub fn allows(&self, ns: &str, kind: HostKind, value: &str) -> bool {
        let entries = self.entries(ns, kind);
        if kind == HostKind::Vlan {
            let Some((a, b)) = parse_vlan_range(value) else {
                return entries.contains(&"*");
            };
            let ranges: Vec<VlanRange> =
                entries.iter().filter_map(|e| parse_vlan_range(e)).collect();
            return entries.contains(&"*")
                || (a..=b).all(|id| ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&id)));
        }
        entries.iter().any(|e| match e.strip_suffix('*') {
            Some(prefix) => value.starts_with(prefix) && (!value.is_empty() || prefix.is_empty()),
            None => *e == value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn allow(pairs: &[(&str, &str)]) -> Allowances {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Allowances::parse(&m).unwrap()
    }

    #[test]
    fn finds_interfaces_vlans_and_devices() {
        let v = json!({"plugins":[
            {"type":"macvlan","master":"ens1f0"},
            {"type":"bridge","bridge":"br-data","vlan":100,"vlanTrunk":[{"id":5},{"minID":10,"maxID":20}]},
            {"type":"host-device","device":"ens2","pciBusID":"0000:04:00.1"},
            {"type":"sriov","vlan":0,"deviceID":"0000:af:06.1"}]});
        let got: Vec<(String, HostKind, String)> = find(&v, false)
            .into_iter()
            .map(|u| (u.location, u.kind, u.value))
            .collect();
        let want = [
            ("plugins[0].master", HostKind::Interface, "ens1f0"),
            ("plugins[1].bridge", HostKind::Interface, "br-data"),
            ("plugins[1].vlan", HostKind::Vlan, "100"),
            ("plugins[1].vlanTrunk[0]", HostKind::Vlan, "5"),
            ("plugins[1].vlanTrunk[1]", HostKind::Vlan, "10-20"),
            ("plugins[2].device", HostKind::Interface, "ens2"),
            ("plugins[2].pciBusID", HostKind::Device, "0000:04:00.1"),
            ("plugins[3].deviceID", HostKind::Device, "0000:af:06.1"),
        ];
        let want: Vec<(String, HostKind, String)> = want
            .iter()
            .map(|(a, k, b)| (a.to_string(), *k, b.to_string()))
            .collect();
        assert_eq!(got, want);
        // Devices from the kubelet's allocation are not the NAD's choice.
        assert!(find(&v, true).iter().all(|u| u.kind != HostKind::Device));
        // Nested: flannel's delegate names a host bridge; a trunk inside a delegate too.
        let nested = find(
            &json!({"type":"flannel","delegate":{"bridge":"cni0","vlanTrunk":[{"id":7}]}}),
            false,
        );
        let got: Vec<(&str, &str)> = nested
            .iter()
            .map(|u| (u.location.as_str(), u.value.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![("delegate.bridge", "cni0"), ("delegate.vlanTrunk[0]", "7")]
        );
        // A macvlan without master is on the node's default-route interface.
        let m = find(&json!({"type":"macvlan"}), false);
        assert_eq!((m[0].kind, m[0].value.as_str()), (HostKind::Interface, ""));
    }

    #[test]
    fn allowances_per_namespace_with_prefixes_and_ranges() {
        let a = allow(&[
            ("bank.interfaces", "ens1f0, br-bank-*"),
            ("bank.vlans", "100,200-210"),
            ("_all.resourceNames", "intel.com/shared_*"),
            ("lab.interfaces", "*"),
        ]);
        assert!(a.allows("bank", HostKind::Interface, "ens1f0"));
        assert!(a.allows("bank", HostKind::Interface, "br-bank-7"));
        assert!(!a.allows("bank", HostKind::Interface, "eth0"));
        assert!(!a.allows("dev", HostKind::Interface, "ens1f0"));
        assert!(!a.allows("bank", HostKind::Interface, ""));
        assert!(a.allows("lab", HostKind::Interface, ""));
        assert!(a.allows("bank", HostKind::Vlan, "205"));
        assert!(a.allows("bank", HostKind::Vlan, "200-210"));
        assert!(!a.allows("bank", HostKind::Vlan, "200-211"));
        assert!(!a.allows("bank", HostKind::Vlan, "101"));
        assert!(!a.allows("bank", HostKind::Vlan, "x"));
        assert!(a.allows("dev", HostKind::Resource, "intel.com/shared_vf"));
        assert!(!a.allows("dev", HostKind::Resource, "intel.com/bank_vf"));
        assert!(!a.allows("bank", HostKind::Device, "0000:af:06.1"));
    }
}
