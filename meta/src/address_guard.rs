//! Never one static address twice. Before ADD changes anything, every address the plan fixes
//! for a secondary network (a pod's `ips`, a StatefulSet replica's `plexus.cni.io/fixed-ips`
//! address, a NAD's static IPAM `addresses`) is checked against the pods that may hold it:
//!
//! - **this node**: plexus' own saved plans (every attachment not yet deleted, whatever the API
//!   says), under a node-wide lock held until this ADD's plan is saved, so two ADDs on one node
//!   cannot both take an address;
//! - **the cluster**, when the API answers: the network-status of the pods of the pod's
//!   namespace (one LIST), terminating pods included, finished pods (`Succeeded`, `Failed`) not.
//!
//! A held address fails ADD with [`MetaError::AddressInUse`] (code 11): the kubelet retries and
//! the pod starts once the holder is gone. Pods that reference no static address pay nothing.

use crate::context::Ctx;
use crate::error::MetaError;
use crate::inputs::Read;
use crate::k8s::{KubeClient, ListedPod};
use crate::plan::PlannedAttachment;
use crate::pod::PodIdentity;
use crate::state::SavedPlan;
use plexus_conf::k8s::fixed_ips::{parse_cidr, static_addresses as ipam_addresses};
use plexus_conf::k8s::network_status::NetworkStatus;
use plexus_delegates::lock::FileLock;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// How long an ADD waits for another ADD of the node to finish its address check.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// One address the plan fixes: `(network, address)`.
pub type Wanted = (String, IpAddr);

/// Who holds an address: `(network, address, holder description)`.
type Held = (String, IpAddr, String);

fn parse_ip(s: &str) -> Option<IpAddr> {
    parse_cidr(s).map(|(ip, _)| ip).or_else(|| s.parse().ok())
}

/// The static addresses of the secondary attachments of a plan: requested `ips` and static
/// IPAM `addresses`.
pub fn static_addresses(plan: &[PlannedAttachment]) -> Vec<Wanted> {
    let mut out: Vec<Wanted> = Vec::new();
    for a in plan.iter().filter(|a| !a.is_default) {
        let requested = a
            .capability_args
            .get("ips")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().and_then(parse_ip));
        let fixed = a.list().map(|l| ipam_addresses(&l)).unwrap_or_default();
        for ip in requested.chain(fixed) {
            let w = (a.network.clone(), ip);
            if !out.contains(&w) {
                out.push(w);
            }
        }
    }
    out
}

/// A pod the runtime described (its annotations, no object read) has no known owner: when a
/// NAD it uses has a fixed-ips mapping, read the pod (one GET) for its `ownerReferences`.
pub fn complete_owner(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    read: &mut Read,
) -> Result<(), MetaError> {
    let mapped = read.nads.values().flatten().any(|n| n.fixed_ips.is_some());
    let Some(pod) = read.pod.as_mut() else {
        return Ok(());
    };
    if !mapped || pod.claims.is_some() || pod.statefulset.is_some() {
        return Ok(());
    }
    if let Some(full) = crate::inputs::api::fetch_pod(ctx, client, Some(&pod.id))? {
        pod.statefulset = full.statefulset;
    }
    Ok(())
}

/// The first wanted address some other pod's saved plan on this node holds.
fn held_on_node(plans: &[SavedPlan], me: &PodIdentity, wanted: &[Wanted]) -> Option<Held> {
    for p in plans {
        let holder = match &p.pod {
            Some(other) if other.namespace == me.namespace && other.name == me.name => {
                // The same pod again (a new sandbox) is no conflict; an earlier pod of that
                // name whose sandbox is not deleted yet is.
                if other.uid.is_empty() || me.uid.is_empty() || other.uid == me.uid {
                    continue;
                }
                format!(
                    "an earlier pod {} (UID {}, container {}) still attached on this node",
                    other.key(),
                    other.uid,
                    p.container_id
                )
            }
            Some(other) => format!("pod {} (on this node)", other.key()),
            None => format!("container {} (on this node)", p.container_id),
        };
        let theirs = static_addresses(&p.attachments);
        if let Some((net, ip)) = wanted.iter().find(|w| theirs.contains(w)) {
            return Some((net.clone(), *ip, holder));
        }
    }
    None
}

/// The first wanted address the network-status of another live pod of the namespace lists.
fn held_in_namespace(pods: &[ListedPod], me: &PodIdentity, wanted: &[Wanted]) -> Option<Held> {
    for p in pods.iter().filter(|p| p.name != me.name && !p.finished) {
        let Some(status) = p.network_status.as_deref() else {
            continue;
        };
        let entries: Vec<NetworkStatus> = serde_json::from_str(status).unwrap_or_default();
        for e in entries {
            let ips: Vec<IpAddr> = e.ips.iter().filter_map(|s| parse_ip(s)).collect();
            if let Some((net, ip)) = wanted
                .iter()
                .find(|(n, ip)| *n == e.name && ips.contains(ip))
            {
                let state = if p.terminating { ", terminating" } else { "" };
                let holder = format!("pod {}/{} (network-status{state})", me.namespace, p.name);
                return Some((net.clone(), *ip, holder));
            }
        }
    }
    None
}

fn in_use(label: &str, (network, ip, holder): Held) -> MetaError {
    MetaError::AddressInUse {
        pod: label.to_string(),
        network,
        address: ip.to_string(),
        holder,
    }
}

/// Check the plan's static addresses; on success the returned lock (when any address was
/// checked) must be held until the plan is saved.
pub fn check(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    id: Option<&PodIdentity>,
    plan: &[PlannedAttachment],
) -> Result<Option<FileLock>, MetaError> {
    let wanted = static_addresses(plan);
    let Some(me) = id.filter(|_| !wanted.is_empty()) else {
        return Ok(None);
    };
    let label = format!("pod {}", me.key());
    let path = Path::new(&ctx.config.cni_dir)
        .join("locks")
        .join("static-addresses.lock");
    let lock = FileLock::acquire(&path, LOCK_WAIT).map_err(|source| MetaError::Lock {
        container_id: "static-addresses".into(),
        path: path.clone(),
        source,
    })?;
    if let Some(h) = held_on_node(&ctx.store.all(), me, &wanted) {
        return Err(in_use(&label, h));
    }
    if let Some(client) = client {
        let policy = client.options().retry;
        match ctx.block_on(client.list_pods(&me.namespace, policy))? {
            Ok(pods) => {
                if let Some(h) = held_in_namespace(&pods, me, &wanted) {
                    return Err(in_use(&label, h));
                }
            }
            Err(e) => tracing::warn!(
                pod = %me.key(),
                error = %e,
                "cannot list the namespace's pods: static addresses checked on this node only (thin mode needs deploy/rbac-fixed-ips.yaml)"
            ),
        }
    }
    Ok(Some(lock))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attachment(network: &str, ips: &[&str], config: serde_json::Value) -> PlannedAttachment {
        let mut caps = serde_json::Map::new();
        if !ips.is_empty() {
            caps.insert("ips".into(), json!(ips));
        }
        PlannedAttachment {
            network: network.into(),
            ifname: "net1".into(),
            is_default: false,
            config,
            capability_args: caps,
            cni_args: String::new(),
            default_route: vec![],
            filter_v4: false,
            filter_v6: false,
            resource_name: None,
            dra: None,
            nad: None,
        }
    }

    fn macvlan() -> serde_json::Value {
        json!({"cniVersion":"1.0.0","name":"data","type":"macvlan","ipam":{"type":"static"}})
    }

    fn id(name: &str, uid: &str) -> PodIdentity {
        PodIdentity {
            namespace: "db".into(),
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn collects_requested_and_nad_static_addresses() {
        let fixed = json!({"cniVersion":"1.0.0","name":"data","type":"macvlan",
            "ipam":{"type":"static","addresses":[{"address":"10.246.0.10/24"}]}});
        let mut default = attachment("cbr0", &["10.244.0.5/24"], macvlan());
        default.is_default = true;
        let plan = vec![
            default,
            attachment("db/data", &["10.246.0.11/24", "10.246.0.11"], macvlan()),
            attachment("db/fixed", &[], fixed),
        ];
        assert_eq!(
            static_addresses(&plan),
            vec![
                ("db/data".to_string(), ip("10.246.0.11")),
                ("db/fixed".to_string(), ip("10.246.0.10"))
            ]
        );
    }

    #[test]
    fn this_node_saved_plans_hold_addresses() {
        let plan = |pod: Option<PodIdentity>, c: &str, a: &str| {
            SavedPlan::new(
                c,
                "eth0",
                "/n",
                pod,
                vec![attachment("db/data", &[a], macvlan())],
            )
        };
        let wanted = vec![("db/data".to_string(), ip("10.246.0.10"))];
        let me = id("mysql-1", "new");
        let saved = vec![plan(Some(id("mysql-0", "u0")), "c0", "10.246.0.10/24")];
        let (_, _, who) = held_on_node(&saved, &me, &wanted).unwrap();
        assert!(who.contains("pod db/mysql-0"), "{who}");
        // Another address, another network: free.
        let other = vec![plan(Some(id("mysql-0", "u0")), "c0", "10.246.0.11/24")];
        assert!(held_on_node(&other, &me, &wanted).is_none());
        // The same pod (a new sandbox): free. An earlier pod of the same name: held.
        let same = vec![plan(Some(id("mysql-1", "new")), "c1", "10.246.0.10/24")];
        assert!(held_on_node(&same, &me, &wanted).is_none());
        let old = vec![plan(Some(id("mysql-1", "old")), "c1", "10.246.0.10/24")];
        let (_, _, who) = held_on_node(&old, &me, &wanted).unwrap();
        assert!(
            who.contains("earlier pod db/mysql-1") && who.contains("old"),
            "{who}"
        );
    }

    #[test]
    fn live_pods_of_the_namespace_hold_addresses() {
        let status = |net: &str, a: &str| {
            Some(
                json!([{"name":"cbr0","ips":["10.244.0.9"],"default":true},{"name":net,"ips":[a]}])
                    .to_string(),
            )
        };
        let wanted = vec![("db/data".to_string(), ip("10.246.0.10"))];
        let me = id("mysql-1", "u1");
        let pod = |name: &str, s: Option<String>| ListedPod {
            name: name.into(),
            network_status: s,
            ..Default::default()
        };
        let pods = vec![
            pod("mysql-1", status("db/data", "10.246.0.10")), // itself
            pod("web", status("db/other", "10.246.0.10")),    // another network
            pod("x", Some("not json".into())),
        ];
        assert!(held_in_namespace(&pods, &me, &wanted).is_none());
        let mut old = pod("mysql-0", status("db/data", "10.246.0.10"));
        old.terminating = true;
        let (_, _, who) = held_in_namespace(&[old.clone()], &me, &wanted).unwrap();
        assert_eq!(who, "pod db/mysql-0 (network-status, terminating)");
        old.finished = true;
        assert!(held_in_namespace(&[old], &me, &wanted).is_none());
        let e = in_use("pod db/mysql-1", ("db/data".into(), ip("10.246.0.10"), who));
        assert_eq!(e.code(), 11);
        assert!(
            e.msg().contains("10.246.0.10") && e.msg().contains("pod db/mysql-0"),
            "{e}"
        );
    }
}
