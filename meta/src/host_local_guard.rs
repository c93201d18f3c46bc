//! host-local on a network that spans nodes. host-local allocates from a file on each node, so
//! a NAD whose own config (one range for the whole cluster) puts host-local on a VF, macvlan,
//! ipvlan, host-device or vlan interface hands the same addresses out on every node. After such
//! an attachment, each address host-local gave is claimed like a fixed one
//! ([`crate::address_guard`]), but never refused: a claim another live pod holds proves that
//! two nodes handed out one address, and the pod gets a Warning event naming the other pod, its
//! node and the fix (whereabouts, or per-node ranges). The claims are released at DEL.
//! NADs without a config of their own (per-node files in `confDir`) may have per-node ranges
//! and are not checked. A node that may not create claims (no `rbac-fixed-ips.yaml` /
//! `rbac-daemon.yaml` rights) never tries: it asks the API server first (a
//! SelfSubjectAccessReview, every [`ALLOWED_FOR`] at most; a refusal or an answer missing is
//! remembered for a minute), so no request of it is ever refused.

use crate::address_guard::{
    claim_all, claims_off_marker, claims_off_recently, touch, written_within, Claims, Wanted,
};
use crate::attach::Attached;
use crate::context::Ctx;
use crate::k8s::KubeClient;
use crate::plan::PlannedAttachment;
use crate::pod::PodIdentity;
use crate::state::ClaimedAddress;
use plexus_conf::k8s::fixed_ips::parse_cidr;
use plexus_conf::k8s::pools::spans_nodes;
use std::path::Path;
use std::time::Duration;

/// The addresses host-local gave on networks that span nodes (see the module docs).
fn pooled_on_spanning_networks(plan: &[PlannedAttachment], done: &[Attached]) -> Vec<Wanted> {
    let mut out = Vec::new();
    for d in done {
        let Some(a) = plan.get(d.index) else {
            continue;
        };
        if a.is_default || !a.nad.as_ref().is_some_and(|n| n.inline_config) {
            continue;
        }
        let Ok(list) = a.list() else {
            continue;
        };
        let host_local = list
            .plugins
            .iter()
            .any(|p| p.ipam_type() == Some("host-local"));
        if !host_local || !spans_nodes(&list) {
            continue;
        }
        for ip in d.result.ips.iter().filter_map(|c| parse_cidr(&c.address)) {
            out.push((a.network.clone(), ip.0));
        }
    }
    out
}

/// How long a node that was allowed to create claims goes on without asking again.
const ALLOWED_FOR: Duration = Duration::from_secs(600);

/// Whether this node may create claims in `ns` (see the module docs).
fn claims_usable(ctx: &mut Ctx, client: &KubeClient, ns: &str) -> bool {
    let off = claims_off_marker(ctx);
    if client.claims_off() || claims_off_recently(&off) {
        return false;
    }
    let allowed = Path::new(&ctx.config.cni_dir)
        .join("locks")
        .join("claims-allowed");
    if written_within(&allowed, ALLOWED_FOR) {
        return true;
    }
    match ctx.block_on(client.may_create_claims(ns)) {
        Ok(Ok(true)) => {
            touch(&allowed);
            true
        }
        other => {
            tracing::debug!(answer = ?other.map(|r| r.map_err(|e| e.to_string())), "no address claims for host-local addresses");
            touch(&off);
            false
        }
    }
}

/// Claim the addresses (see the module docs): what is now claimed (for the plan), and the
/// warnings for addresses another node's pod holds.
pub fn check(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    id: Option<&PodIdentity>,
    node: &str,
    plan: &[PlannedAttachment],
    done: &[Attached],
) -> (Vec<ClaimedAddress>, Vec<String>) {
    let (Some(client), Some(me)) = (client, id) else {
        return (vec![], vec![]);
    };
    let wanted = pooled_on_spanning_networks(plan, done);
    let (mut claimed, mut warnings) = (Vec::new(), Vec::new());
    let Some(ns) = wanted
        .first()
        .map(|(net, _)| crate::k8s::claim_namespace(net, &me.namespace).to_string())
    else {
        return (claimed, warnings);
    };
    if !claims_usable(ctx, client, &ns) {
        return (claimed, warnings);
    }
    for w in wanted {
        match claim_all(ctx, client, me, node, std::slice::from_ref(&w)) {
            Ok(Claims::Taken) => claimed.push(ClaimedAddress {
                network: w.0,
                address: w.1,
            }),
            Ok(Claims::HeldBy((network, ip, holder))) => {
                let msg = format!(
                    "network {network}: host-local gave {ip}, which {holder} also holds: host-local allocates per node, and this network spans nodes; use whereabouts (one pool for the cluster) or give each node its own range (a NAD without config and a per-node file in confDir)"
                );
                tracing::warn!(pod = %me.key(), %network, address = %ip, "{msg}");
                warnings.push(msg);
            }
            Ok(Claims::Unavailable(why)) => {
                tracing::debug!(pod = %me.key(), reason = %why, "host-local addresses not claimed");
                break;
            }
            Err(e) => {
                tracing::debug!(pod = %me.key(), error = %e, "host-local addresses not claimed");
                break;
            }
        }
    }
    (claimed, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::SelectedNad;
    use plexus_conf::result::{CniResult, IpConfig};
    use serde_json::{json, Value};

    fn attachment(network: &str, config: Value, inline: bool, default: bool) -> PlannedAttachment {
        PlannedAttachment {
            is_default: default,
            nad: Some(SelectedNad {
                namespace: "db".into(),
                inline_config: inline,
                resource_name: None,
            }),
            ..PlannedAttachment::for_test(network, config)
        }
    }

    fn done(index: usize, addr: &str) -> Attached {
        Attached {
            index,
            result: CniResult {
                ips: vec![IpConfig {
                    interface: Some(0),
                    address: addr.into(),
                    gateway: None,
                }],
                ..Default::default()
            },
        }
    }

    #[test]
    fn only_host_local_on_spanning_networks_of_a_nads_own_config() {
        let hl = |t: &str| {
            json!({"cniVersion":"1.0.0","name":"n","type":t,"master":"eth1",
                "ipam":{"type":"host-local","subnet":"10.9.0.0/24"}})
        };
        let plan = vec![
            attachment("cbr0", hl("bridge"), true, true),
            attachment("db/mv", hl("macvlan"), true, false),
            attachment("db/br", hl("bridge"), true, false),
            attachment("db/files", hl("macvlan"), false, false),
            attachment(
                "db/wb",
                json!({"cniVersion":"1.0.0","name":"n","type":"macvlan","master":"eth1",
                    "ipam":{"type":"whereabouts","range":"10.9.0.0/24"}}),
                true,
                false,
            ),
        ];
        let done: Vec<Attached> = (0..plan.len()).map(|i| done(i, "10.9.0.7/24")).collect();
        assert_eq!(
            pooled_on_spanning_networks(&plan, &done),
            vec![("db/mv".to_string(), "10.9.0.7".parse().unwrap())]
        );
    }
}
