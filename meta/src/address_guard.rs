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

use crate::claims_pending::{self, PendingRelease};
use crate::context::Ctx;
use crate::error::MetaError;
use crate::inputs::Read;
use crate::k8s::{
    claim_name, claim_namespace, ClaimHolder, ClaimOutcome, ClaimSpec, K8sError, KubeClient,
    ListedPod,
};
use crate::plan::PlannedAttachment;
use crate::pod::PodIdentity;
use crate::state::{ClaimedAddress, SavedPlan};
use plexus_conf::k8s::fixed_ips::{parse_cidr, static_addresses as ipam_addresses};
use plexus_conf::k8s::network_status::NetworkStatus;
use plexus_delegates::lock::FileLock;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// How long a node that found no `AddressClaim` CRD (or no right to it) uses the namespace
/// LIST without asking again: no failed create per ADD; a CRD installed later is used within
/// this time.
const CLAIMS_OFF_FOR: Duration = Duration::from_secs(60);

/// The file whose modification time says when this node last found claims unusable (thin
/// calls are separate processes; the daemon's client also remembers). It sits with the node's
/// lock files: node-wide coordination, no pod's state.
pub(crate) fn claims_off_marker(ctx: &Ctx) -> std::path::PathBuf {
    Path::new(&ctx.config.cni_dir)
        .join("locks")
        .join("claims-off")
}

/// Whether `marker` was written less than [`CLAIMS_OFF_FOR`] ago.
pub(crate) fn claims_off_recently(marker: &Path) -> bool {
    written_within(marker, CLAIMS_OFF_FOR)
}

/// Whether `marker` was written less than `span` ago.
pub(crate) fn written_within(marker: &Path, span: Duration) -> bool {
    std::fs::metadata(marker)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < span)
}

/// (Re)write the marker file `marker` (owner-only, empty): its time is what counts.
pub(crate) fn touch(marker: &Path) {
    if let Err(e) = plexus_delegates::fsutil::write_atomic_nosync(marker, b"", 0o600) {
        tracing::debug!(file = %marker.display(), error = %e, "marker not written");
    }
}

/// How long an ADD waits for another ADD of the node to finish its address check.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// One address the plan fixes: `(network, address)`.
pub type Wanted = (String, IpAddr);

/// Who holds an address: `(network, address, holder description)`.
pub(crate) type Held = (String, IpAddr, String);

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
    crate::outcome::sink().claim_conflict();
    MetaError::AddressInUse {
        pod: label.to_string(),
        network,
        address: ip.to_string(),
        holder,
    }
}

/// What the guard holds for an ADD: the node-wide lock (held until the plan is saved) and the
/// addresses claimed in the API (recorded in the plan, released at DEL or rollback).
#[derive(Debug, Default)]
pub struct Guarded {
    /// The node-wide lock, when any address was checked.
    pub lock: Option<FileLock>,
    /// The addresses this ADD now holds an `AddressClaim` for.
    pub claimed: Vec<ClaimedAddress>,
}

/// Check the plan's static addresses (see [`Guarded`]); `node`: the pod's node when known
/// (recorded in its claims; else the client's reporting instance, the host name).
pub fn check(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    id: Option<&PodIdentity>,
    node: &str,
    plan: &[PlannedAttachment],
) -> Result<Guarded, MetaError> {
    let wanted = static_addresses(plan);
    let Some(me) = id.filter(|_| !wanted.is_empty()) else {
        return Ok(Guarded::default());
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
        // The API server arbitrates: one AddressClaim per address (O(1) per ADD). Without the
        // CRD, the rights to it, or a pod UID, the namespace LIST below decides instead.
        match claim_all(ctx, client, me, node, &wanted)? {
            Claims::Taken => {
                let claimed = wanted
                    .iter()
                    .map(|(network, address)| ClaimedAddress {
                        network: network.clone(),
                        address: *address,
                    })
                    .collect();
                return Ok(Guarded {
                    lock: Some(lock),
                    claimed,
                });
            }
            Claims::HeldBy(h) => return Err(in_use(&label, h)),
            Claims::Unavailable(why) => {
                tracing::debug!(pod = %me.key(), reason = %why, "address claims unavailable: checking the namespace's pods")
            }
        }
        match ctx.block_on(client.list_pods(&me.namespace, policy))? {
            Ok(pods) => {
                if let Some(h) = held_in_namespace(&pods, me, &wanted) {
                    return Err(in_use(&label, h));
                }
            }
            Err(e) => tracing::warn!(
                pod = %me.key(),
                error = %e,
                "cannot list the namespace's pods: static addresses checked on this node only (thin mode needs deploy/components/fixed-ips)"
            ),
        }
    }
    Ok(Guarded {
        lock: Some(lock),
        claimed: Vec::new(),
    })
}

/// Release the claims an ADD of `pod` recorded (DEL, rollback): one GET and one DELETE each; a
/// claim another pod took over stays. A release the API does not answer is recorded
/// ([`crate::claims_pending`]) and done by a later call of this node.
pub fn release(ctx: &mut Ctx, pod: Option<&PodIdentity>, claimed: &[ClaimedAddress]) {
    let Some(pod) = pod.filter(|p| !p.uid.is_empty() && !claimed.is_empty()) else {
        return;
    };
    let records: Vec<PendingRelease> = claimed
        .iter()
        .map(|c| PendingRelease {
            namespace: claim_namespace(&c.network, &pod.namespace).to_string(),
            network: c.network.clone(),
            address: c.address,
            pod: pod.key(),
            pod_uid: pod.uid.clone(),
        })
        .collect();
    let cni_dir = std::path::PathBuf::from(&ctx.config.cni_dir);
    // Once the API server does not answer, the rest is recorded without trying.
    let mut answering = true;
    for r in records {
        answering = answering && release_one(ctx, &r);
        if !answering {
            claims_pending::record(&cni_dir, &r);
        }
    }
}

/// Release the claims earlier calls of this node could not (see [`release`]); cheap when there
/// are none (one directory read). Stops at the first release the API server does not answer.
pub fn release_pending(ctx: &mut Ctx) {
    let cni_dir = std::path::PathBuf::from(&ctx.config.cni_dir);
    let pending = claims_pending::pending(&cni_dir);
    if pending.is_empty() {
        return;
    }
    let client = match ctx.client() {
        Ok(Some(c)) => c,
        _ => return,
    };
    let _ = ctx.block_on(release_recorded(&client, pending));
}

/// Release recorded claims (see [`release_pending`]); the daemon's sweep calls it directly.
pub async fn release_recorded(
    client: &KubeClient,
    pending: Vec<(std::path::PathBuf, PendingRelease)>,
) {
    for (file, r) in pending {
        if !release_claim_of(client, &r).await {
            break;
        }
        tracing::info!(pod = %r.pod, network = %r.network, address = %r.address, "pending address claim released");
        claims_pending::done(&file);
    }
}

/// Release one claim; `false` when it should be tried again later (the API server unreachable
/// or failing). A claim that is gone, or names another pod, is done; so is one this node has
/// no right to (the next pod that wants the address takes it over once its holder is gone).
async fn release_claim_of(client: &KubeClient, r: &PendingRelease) -> bool {
    let quick = crate::k8s::RetryPolicy::none();
    match client
        .release_claim(&r.namespace, &r.network, r.address, &r.pod_uid, quick)
        .await
    {
        Ok(()) => true,
        Err(e) if e.is_transient() => {
            tracing::debug!(pod = %r.pod, network = %r.network, address = %r.address, error = %e, "address claim not released");
            false
        }
        Err(e) => {
            tracing::warn!(pod = %r.pod, network = %r.network, address = %r.address, error = %e, "address claim not released");
            true
        }
    }
}

/// Release one claim now (see [`release_claim_of`]); without an API client there is nothing
/// to release.
fn release_one(ctx: &mut Ctx, r: &PendingRelease) -> bool {
    let client = match ctx.client() {
        Ok(Some(c)) => c,
        Ok(None) => return true,
        Err(e) => {
            tracing::warn!(pod = %r.pod, error = %e, "address claim not released: no API client");
            return false;
        }
    };
    ctx.block_on(release_claim_of(&client, r)).unwrap_or(false)
}

/// How the claims of an ADD's addresses went.
#[derive(Debug)]
pub(crate) enum Claims {
    /// Every address is this pod's now (created, already its own, or taken over from a pod
    /// that is gone).
    Taken,
    /// Another live pod holds one (the claims this call made are released).
    HeldBy(Held),
    /// Claims cannot decide (no CRD, no right, no pod UID, the API failing): the caller falls
    /// back to the namespace LIST.
    Unavailable(String),
}

/// Whether the pod a claim names still holds its address: it exists with that UID and has
/// not finished. Unknown (the API failing) counts as alive: the ADD is retried.
fn holder_alive(ctx: &mut Ctx, client: &KubeClient, ns: &str, holder: &ClaimHolder) -> bool {
    let got = ctx.block_on(client.get_pod(ns, &holder.name, None, client.options().retry));
    tracing::debug!(holder = %holder.name, result = ?got.as_ref().map(|r| r.as_ref().map(|p| p.is_some())), "address claim holder read");
    match got {
        Ok(Ok(None)) => false,
        Ok(Ok(Some(p))) => {
            let same = p.metadata.uid.as_deref() == Some(holder.uid.as_str());
            let finished = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
            same && !finished
        }
        _ => true,
    }
}

/// Claim every wanted address for `me` (see [`Claims`]).
pub(crate) fn claim_all(
    ctx: &mut Ctx,
    client: &KubeClient,
    me: &PodIdentity,
    node: &str,
    wanted: &[Wanted],
) -> Result<Claims, MetaError> {
    if me.uid.is_empty() {
        return Ok(Claims::Unavailable(
            "no K8S_POD_UID from the runtime".into(),
        ));
    }
    let marker = claims_off_marker(ctx);
    if client.claims_off() || claims_off_recently(&marker) {
        return Ok(Claims::Unavailable(
            "the AddressClaim CRD or the right to it was missing a moment ago".into(),
        ));
    }
    let policy = client.options().retry;
    let spec = |net: &str, ip: &IpAddr| ClaimSpec {
        network: net.to_string(),
        address: ip.to_string(),
        node: if node.is_empty() {
            client.options().reporting_instance.clone()
        } else {
            node.to_string()
        },
        container_id: me.infra_container_id.clone(),
        pod: ClaimHolder {
            namespace: me.namespace.clone(),
            name: me.name.clone(),
            uid: me.uid.clone(),
        },
    };
    let mut mine: Vec<&Wanted> = Vec::new();
    let mut outcome = Claims::Taken;
    for w in wanted {
        let sp = spec(&w.0, &w.1);
        let ns = claim_namespace(&w.0, &me.namespace);
        let got = ctx.block_on(client.claim_address(ns, &sp, policy))?;
        match got {
            Ok(ClaimOutcome::Created | ClaimOutcome::AlreadyOurs) => mine.push(w),
            Ok(ClaimOutcome::HeldBy {
                holder,
                resource_version,
            }) => {
                // Claims written before the holder's namespace was recorded: the claim's own.
                let holder_ns = if holder.pod.namespace.is_empty() {
                    ns
                } else {
                    holder.pod.namespace.as_str()
                };
                let who = format!(
                    "pod {holder_ns}/{} on node {} (address claim {ns}/{})",
                    holder.pod.name,
                    if holder.node.is_empty() {
                        "?"
                    } else {
                        &holder.node
                    },
                    claim_name(&w.0, w.1)
                );
                if holder_alive(ctx, client, holder_ns, &holder.pod) {
                    outcome = Claims::HeldBy((w.0.clone(), w.1, who));
                    break;
                }
                let taken = ctx.block_on(client.take_over_claim(ns, &sp, &resource_version))?;
                match taken {
                    Ok(()) => {
                        crate::outcome::sink().claim_takeover();
                        mine.push(w);
                    }
                    Err(e) => {
                        tracing::info!(pod = %me.key(), error = %e, "address claim taken over by another pod first");
                        outcome = Claims::HeldBy((
                            w.0.clone(),
                            w.1,
                            format!("{who}, taken over just now"),
                        ));
                        break;
                    }
                }
            }
            Err(e) => {
                if matches!(
                    e,
                    K8sError::Api {
                        code: 403 | 404,
                        ..
                    } | K8sError::NoSuchPath { .. }
                ) {
                    // No CRD, or no right to it: this node stops asking for a while (the
                    // daemon's client remembers; thin calls read the marker file).
                    client.turn_claims_off(CLAIMS_OFF_FOR);
                    touch(&marker);
                }
                outcome = Claims::Unavailable(e.to_string());
                break;
            }
        }
    }
    if !matches!(outcome, Claims::Taken) {
        for (net, ip) in mine {
            let released = ctx.block_on(client.release_claim(
                claim_namespace(net, &me.namespace),
                net,
                *ip,
                &me.uid,
                policy,
            ))?;
            if let Err(e) = released {
                tracing::warn!(pod = %me.key(), network = %net, address = %ip, error = %e, "address claim not released");
            }
        }
    }
    Ok(outcome)
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
            capability_args: caps,
            ..PlannedAttachment::for_test(network, config)
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

    /// `claim_all` against a mock API answering by method and path; the requests it saw.
    fn claim_with(
        answer: impl Fn(&crate::k8s::testutil::Recorded) -> Option<crate::k8s::testutil::Canned>
            + Send
            + Sync
            + 'static,
    ) -> (Claims, Vec<String>) {
        let (mut got, seen) = claim_times(1, answer);
        (got.remove(0), seen)
    }

    /// `claim_all` `times` times on one client: the outcomes and every request seen.
    fn claim_times(
        times: usize,
        answer: impl Fn(&crate::k8s::testutil::Recorded) -> Option<crate::k8s::testutil::Canned>
            + Send
            + Sync
            + 'static,
    ) -> (Vec<Claims>, Vec<String>) {
        use crate::k8s::testutil::MockApi;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mock = MockApi::with_handler(answer);
        let client = {
            let _in_rt = rt.enter();
            mock.client()
        };
        let state = tempfile::tempdir().unwrap();
        let cfg = plexus_conf::plexus_config::PlexusConfig::parse(
            serde_json::json!({"cniVersion":"1.0.0","name":"p","type":"plexus","cniDir":state.path(),
                "delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}]})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let mut ctx =
            Ctx::from_config(cfg, &[], None).with_shared(rt.handle().clone(), Some(client.clone()));
        let wanted = vec![("db/data".to_string(), ip("10.246.0.10"))];
        let got = (0..times)
            .map(|_| claim_all(&mut ctx, &client, &id("mysql-1", "new"), "n1", &wanted).unwrap())
            .collect();
        let seen = mock
            .requests()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path_and_query))
            .collect();
        (got, seen)
    }

    /// Thin calls are separate processes: the marker a call wrote when the CRD was missing
    /// keeps the node's next calls from asking for a minute, then they ask again.
    #[test]
    fn the_nodes_claims_off_marker_spares_later_calls_for_a_minute() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("claims-off");
        assert!(!claims_off_recently(&marker));
        std::fs::write(&marker, b"").unwrap();
        assert!(claims_off_recently(&marker));
        let old = std::time::SystemTime::now() - CLAIMS_OFF_FOR - Duration::from_secs(1);
        std::fs::File::options()
            .write(true)
            .open(&marker)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(!claims_off_recently(&marker));
    }

    fn answer(status: u16, body: &str) -> Option<crate::k8s::testutil::Canned> {
        Some(crate::k8s::testutil::json_response(status, body))
    }

    const CONFLICT: &str =
        r#"{"kind":"Status","code":409,"reason":"AlreadyExists","message":"exists"}"#;
    const CLAIM_OF_OLD: &str = r#"{"metadata":{"resourceVersion":"7"},"spec":{"network":"db/data","address":"10.246.0.10","pod":{"name":"mysql-1","uid":"old"}}}"#;

    #[test]
    fn a_free_address_is_claimed_in_one_request() {
        let (got, seen) = claim_with(|_| answer(201, "{}"));
        assert!(matches!(got, Claims::Taken), "{got:?}");
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].starts_with("POST /apis/plexus.cni.io/v1alpha1/namespaces/db/addressclaims")
        );
    }

    #[test]
    fn a_gone_holders_claim_is_taken_over() {
        let (got, seen) = claim_with(|r| match (r.method.as_str(), r.path_and_query.as_str()) {
            ("POST", _) => answer(409, CONFLICT),
            ("GET", p) if p.contains("/addressclaims/") => answer(200, CLAIM_OF_OLD),
            ("GET", _) => answer(
                404,
                r#"{"kind":"Status","code":404,"reason":"NotFound","message":"pods \"mysql-1\" not found","details":{"name":"mysql-1","kind":"pods"}}"#,
            ),
            ("PUT", _) => answer(200, "{}"),
            _ => None,
        });
        assert!(matches!(got, Claims::Taken), "{got:?} {seen:?}");
        assert!(seen.iter().any(|r| r.starts_with("PUT ")), "{seen:?}");
    }

    #[test]
    fn a_live_holder_keeps_its_address() {
        let (got, seen) = claim_with(|r| match (r.method.as_str(), r.path_and_query.as_str()) {
            ("POST", _) => answer(409, CONFLICT),
            ("GET", p) if p.contains("/addressclaims/") => answer(200, CLAIM_OF_OLD),
            ("GET", _) => answer(
                200,
                r#"{"metadata":{"name":"mysql-1","namespace":"db","uid":"old"},"spec":{},"status":{"phase":"Running"}}"#,
            ),
            _ => None,
        });
        match got {
            Claims::HeldBy((net, addr, who)) => {
                assert_eq!((net.as_str(), addr), ("db/data", ip("10.246.0.10")));
                assert!(who.contains("pod db/mysql-1"), "{who}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!seen.iter().any(|r| r.starts_with("PUT ")), "{seen:?}");
    }

    #[test]
    fn without_the_crd_the_namespace_list_decides() {
        let (got, seen) = claim_times(2, |_| {
            answer(
                404,
                r#"{"kind":"Status","code":404,"reason":"NotFound","message":"the server could not find the requested resource"}"#,
            )
        });
        assert!(
            got.iter().all(|g| matches!(g, Claims::Unavailable(_))),
            "{got:?}"
        );
        // The client remembers: the second ADD does not ask again.
        assert_eq!(seen.len(), 1, "{seen:?}");
    }
}
