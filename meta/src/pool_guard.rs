//! Static and pooled addresses on one segment never collide. A pooled IPAM (whereabouts,
//! host-local) knows nothing of the addresses another IPAM fixes on its segment, so it may hand
//! a client the database's fixed address. Before anything runs, every fixed address of the
//! plan (see [`crate::address_guard::static_addresses`]) on a network whose segment can be told
//! from its config (`plexus_conf::k8s::pools::segment_of`) is checked against the pools of the
//! other NADs of that network's namespace on the same segment: an address a pool may hand out
//! (inside its range, not excluded) fails ADD with [`MetaError::AddressInPool`] (code 7) naming
//! both networks. One LIST of the namespace's NADs in thin mode (the daemon's cache otherwise),
//! only for pods with a fixed address on such a network.

use crate::address_guard::static_addresses;
use crate::context::Ctx;
use crate::error::{MetaError, PoolOverlap};
use crate::inputs::Inputs;
use crate::plan::resolve::NadData;
use crate::plan::PlannedAttachment;
use plexus_conf::k8s::nad::config_from_spec;
use plexus_conf::k8s::pools::{pool_of, segment_of};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A network with fixed addresses whose segment is known.
struct Fixed<'a> {
    network: &'a str,
    namespace: &'a str,
    segment: String,
    addresses: Vec<IpAddr>,
}

/// The fixed networks of a plan (NAD-selected, segment known, with fixed addresses).
fn fixed_networks(plan: &[PlannedAttachment]) -> Vec<Fixed<'_>> {
    let wanted = static_addresses(plan);
    plan.iter()
        .filter(|a| !a.is_default)
        .filter_map(|a| {
            let nad = a.nad.as_ref()?;
            let addresses: Vec<IpAddr> = wanted
                .iter()
                .filter(|(n, _)| *n == a.network)
                .map(|(_, ip)| *ip)
                .collect();
            if addresses.is_empty() {
                return None;
            }
            let segment = segment_of(&a.list().ok()?, a.resource_name.as_deref())?;
            Some(Fixed {
                network: &a.network,
                namespace: &nad.namespace,
                segment,
                addresses,
            })
        })
        .collect()
}

/// The first fixed address of `f` that a pool of `nads` (the NADs of `f`'s namespace) on
/// `f`'s segment may hand out.
fn overlap(label: &str, f: &Fixed<'_>, nads: &[(String, NadData)]) -> Option<MetaError> {
    for (name, data) in nads {
        let network = format!("{}/{name}", f.namespace);
        if network == f.network {
            continue;
        }
        let Ok(Some(list)) = config_from_spec(f.namespace, name, &data.config) else {
            continue;
        };
        let Some(pool) = pool_of(&list) else {
            continue;
        };
        if segment_of(&list, data.resource_name.as_deref()).as_deref() != Some(&f.segment) {
            continue;
        }
        if let Some(ip) = f.addresses.iter().find(|ip| pool.hands_out(**ip)) {
            return Some(MetaError::AddressInPool {
                pod: label.to_string(),
                network: f.network.to_string(),
                overlap: Box::new(PoolOverlap {
                    address: ip.to_string(),
                    pool_network: network,
                    ipam: pool.ipam,
                    segment: f.segment.clone(),
                }),
            });
        }
    }
    None
}

/// Check the plan's fixed addresses against the pools on their segments (see the module docs).
/// NADs that cannot be read now are logged and skipped: the address claim still keeps two
/// fixed addresses apart.
pub fn check(
    ctx: &mut Ctx,
    inputs: &mut dyn Inputs,
    label: &str,
    plan: &[PlannedAttachment],
) -> Result<(), MetaError> {
    let fixed = fixed_networks(plan);
    let mut by_namespace: BTreeMap<&str, Option<Vec<(String, NadData)>>> = BTreeMap::new();
    for f in &fixed {
        let nads = by_namespace
            .entry(f.namespace)
            .or_insert_with(|| inputs.namespace_nads(ctx, f.namespace));
        if let Some(e) = nads.as_deref().and_then(|n| overlap(label, f, n)) {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::SelectedNad;
    use serde_json::{json, Value};

    fn attachment(network: &str, config: Value, resource: Option<&str>) -> PlannedAttachment {
        PlannedAttachment {
            resource_name: resource.map(str::to_string),
            nad: Some(SelectedNad {
                namespace: "db".into(),
                inline_config: true,
                resource_name: resource.map(str::to_string),
            }),
            ..PlannedAttachment::for_test(network, config)
        }
    }

    const RES: &str = "intel.com/sriov_vf";

    fn bank() -> PlannedAttachment {
        attachment(
            "db/bank",
            json!({"cniVersion":"1.0.0","name":"bank","type":"sriov","vlan":100,
                "ipam":{"type":"static","addresses":[{"address":"10.56.100.10/24"}]}}),
            Some(RES),
        )
    }

    fn nad(config: Value, resource: Option<&str>) -> NadData {
        NadData {
            config: config.to_string(),
            resource_name: resource.map(str::to_string),
            fixed_ips: None,
        }
    }

    fn clients(vlan: u64, exclude: &[&str]) -> NadData {
        nad(
            json!({"cniVersion":"1.0.0","type":"sriov","vlan":vlan,
                "ipam":{"type":"whereabouts","range":"10.56.100.0/24","exclude":exclude}}),
            Some(RES),
        )
    }

    #[test]
    fn a_fixed_address_in_a_pool_on_the_same_segment_is_refused_naming_both() {
        let plan = [bank()];
        let f = fixed_networks(&plan);
        assert_eq!(f.len(), 1);
        let nads = vec![
            ("bank".to_string(), nad(plan[0].config.clone(), Some(RES))),
            ("clients".to_string(), clients(100, &[])),
        ];
        let e = overlap("pod db/mysql-0", &f[0], &nads).expect("refused");
        let msg = e.msg();
        assert!(
            msg.contains("db/bank") && msg.contains("db/clients") && msg.contains("10.56.100.10"),
            "{msg}"
        );
        assert_eq!(e.code(), 7);
    }

    #[test]
    fn excluded_addresses_other_segments_and_fixed_ipams_pass() {
        let plan = [bank()];
        let f = fixed_networks(&plan);
        for other in [
            clients(100, &["10.56.100.0/28"]),
            clients(200, &[]),
            nad(
                json!({"cniVersion":"1.0.0","type":"sriov","vlan":100,"ipam":{"type":"whereabouts","range":"10.56.100.0/24"}}),
                Some("intel.com/other_pf"),
            ),
            nad(
                json!({"cniVersion":"1.0.0","type":"sriov","vlan":100,"ipam":{"type":"static"}}),
                Some(RES),
            ),
        ] {
            let nads = vec![("clients".to_string(), other)];
            assert!(overlap("pod db/mysql-0", &f[0], &nads).is_none());
        }
        // No segment known (a macvlan without master): nothing to compare.
        let plain = attachment(
            "db/mv",
            json!({"cniVersion":"1.0.0","name":"mv","type":"macvlan",
                "ipam":{"type":"static","addresses":[{"address":"10.56.100.10/24"}]}}),
            None,
        );
        assert!(fixed_networks(&[plain]).is_empty());
    }

    /// The bank NAD with a dual static address (IPv4 and IPv6 on VLAN 100).
    fn bank_dual(v6: &str) -> PlannedAttachment {
        attachment(
            "db/bank",
            json!({"cniVersion":"1.0.0","name":"bank","type":"sriov","vlan":100,
                "ipam":{"type":"static","addresses":[{"address":"10.56.100.10/24"},{"address":v6}]}}),
            Some(RES),
        )
    }

    fn pool6(vlan: u64, ipam: Value) -> NadData {
        nad(
            json!({"cniVersion":"1.0.0","type":"sriov","vlan":vlan,"ipam":ipam}),
            Some(RES),
        )
    }

    #[test]
    fn a_fixed_ipv6_address_in_an_ipv6_pool_is_refused_in_any_spelling() {
        for (fixed, pool) in [
            // whereabouts, an IPv6 CIDR range.
            (
                "fd00:56:100::10/64",
                json!({"type":"whereabouts","range":"fd00:56:100::/64"}),
            ),
            // The same address written long-hand: the same address.
            (
                "fd00:0056:0100:0:0:0:0:0010/64",
                json!({"type":"whereabouts","range":"fd00:56:100::/64"}),
            ),
            // whereabouts' dual-stack form: the IPv6 range in ipRanges, with start and end.
            (
                "fd00:56:100::10/64",
                json!({"type":"whereabouts","ipRanges":[{"range":"10.56.200.0/24"},
                    {"range":"fd00:56:100::/64","range_start":"fd00:56:100::8","range_end":"fd00:56:100::ff"}]}),
            ),
            // whereabouts' start-end form.
            (
                "fd00:56:100::10/64",
                json!({"type":"whereabouts","range":"fd00:56:100::1-fd00:56:100::20/64"}),
            ),
            // host-local with one range set per family.
            (
                "fd00:56:100::10/64",
                json!({"type":"host-local","ranges":[[{"subnet":"10.56.200.0/24"}],[{"subnet":"fd00:56:100::/64"}]]}),
            ),
        ] {
            let plan = [bank_dual(fixed)];
            let f = fixed_networks(&plan);
            let nads = vec![("clients6".to_string(), pool6(100, pool.clone()))];
            let e = overlap("pod db/mysql-0", &f[0], &nads)
                .unwrap_or_else(|| panic!("{fixed} in {pool} was not refused"));
            let msg = e.msg();
            assert!(
                msg.contains("db/bank")
                    && msg.contains("db/clients6")
                    && msg.contains("fd00:56:100::10"),
                "{msg}"
            );
            assert_eq!(e.code(), 7);
        }
    }

    #[test]
    fn ipv6_pools_that_cannot_hand_out_the_fixed_address_pass() {
        let plan = [bank_dual("fd00:56:100::10/64")];
        let f = fixed_networks(&plan);
        for pool in [
            pool6(
                100,
                json!({"type":"whereabouts","range":"fd00:56:100::/64","exclude":["fd00:56:100::10/128"]}),
            ),
            pool6(
                100,
                json!({"type":"whereabouts","range":"fd00:56:100::/64","exclude":["fd00:56:100::/120"]}),
            ),
            pool6(
                100,
                json!({"type":"whereabouts","range":"fd00:56:100::/64","range_start":"fd00:56:100::100"}),
            ),
            pool6(
                100,
                json!({"type":"whereabouts","range":"fd00:56:100::20-fd00:56:100::40/64"}),
            ),
            pool6(
                100,
                json!({"type":"whereabouts","range":"fd00:56:999::/64"}),
            ),
            pool6(
                100,
                json!({"type":"host-local","ranges":[[{"subnet":"fd00:56:100::/64","rangeStart":"fd00:56:100::11"}]]}),
            ),
            // An IPv4 pool does not hand out an IPv6 address (nor the bank's IPv4 one here).
            pool6(100, json!({"type":"whereabouts","range":"10.56.200.0/24"})),
            pool6(
                200,
                json!({"type":"whereabouts","range":"fd00:56:100::/64"}),
            ),
        ] {
            let nads = vec![("clients6".to_string(), pool)];
            assert!(
                overlap("pod db/mysql-0", &f[0], &nads).is_none(),
                "{:?}",
                nads[0].1.config
            );
        }
        // An IPv6 pool does not hand out the bank's IPv4 address either.
        let v4_only = [bank()];
        let f = fixed_networks(&v4_only);
        let nads = vec![(
            "clients6".to_string(),
            pool6(100, json!({"type":"whereabouts","range":"::/0"})),
        )];
        assert!(overlap("pod db/mysql-0", &f[0], &nads).is_none());
    }
}
