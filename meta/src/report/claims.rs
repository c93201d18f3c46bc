//! Beyond Multus: a DRA-backed attachment is written back into its ResourceClaim's
//! `status.devices[].networkData` (KEP-4817), so the claim shows which device became which
//! interface with which addresses; DEL releases it. Both are best-effort: the pod's networking
//! never fails on them, and a 403 (RBAC without `resourceclaims/status`) is logged once as the
//! feature being off.

use crate::attach::Attached;
use crate::context::Ctx;
use crate::k8s::{DeviceNetworkData, K8sError, KubeClient};
use crate::plan::PlannedAttachment;
use std::collections::BTreeMap;
use std::time::Duration;

/// Deadline for releasing the claims' network data at DEL (DEL never waits on the API long).
/// The request is a thin DEL's first, so it carries the connection and TLS set-up: 1 s was too
/// short on a loaded node (the VM tier's DRA case under CI load: the client took 1.5 s to build
/// and the release timed out, leaving the data on the claim).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// The network data of one finished attachment.
fn network_data(a: &PlannedAttachment, d: &Attached) -> Option<DeviceNetworkData> {
    let dev = a.dra.as_ref()?;
    let r = &d.result;
    let idx = r
        .interfaces
        .iter()
        .position(|i| i.name == a.ifname && !i.sandbox.is_empty());
    let mac = idx.map(|i| r.interfaces[i].mac.clone()).unwrap_or_default();
    let ips = r
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none() || ip.interface == idx.map(|i| i as i64))
        .map(|ip| ip.address.clone())
        .collect();
    Some(DeviceNetworkData {
        driver: dev.driver.clone(),
        pool: dev.pool.clone(),
        device: dev.device.clone(),
        interface_name: a.ifname.clone(),
        ips,
        hardware_address: mac,
    })
}

/// Per claim `(namespace, name)`, the entries plexus owns.
type PerClaim = BTreeMap<(String, String), Vec<DeviceNetworkData>>;

fn apply_all(ctx: &mut Ctx, client: &KubeClient, per_claim: PerClaim, deadline: Option<Duration>) {
    for ((ns, claim), entries) in per_claim {
        let fut = client.apply_claim_network_data(&ns, &claim, &entries);
        let res = match deadline {
            Some(t) => ctx
                .block_on(async { tokio::time::timeout(t, fut).await })
                .map(|r| r.map_err(|_| "timed out".to_string())),
            None => ctx.block_on(async { Ok(fut.await) }),
        };
        match res {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(K8sError::Api { code: 403, .. }))) => tracing::warn!(
                claim = %format!("{ns}/{claim}"),
                "ResourceClaim networkData not written: plexus' RBAC lacks patch on resourceclaims/status (set draNetworkData: false to stop trying)"
            ),
            Ok(Ok(Err(e))) => {
                tracing::warn!(claim = %format!("{ns}/{claim}"), error = %e, "ResourceClaim networkData not written")
            }
            Ok(Err(e)) => {
                tracing::warn!(claim = %format!("{ns}/{claim}"), error = %e, "ResourceClaim networkData not released")
            }
            Err(e) => tracing::warn!(error = %e, "ResourceClaim networkData skipped"),
        }
    }
}

/// After ADD: one server-side apply per claim with the network data of its attachments.
pub fn write_network_data(
    ctx: &mut Ctx,
    client: &KubeClient,
    plan: &[PlannedAttachment],
    done: &[Attached],
) {
    if !ctx.config.dra_network_data {
        return;
    }
    let mut per_claim = PerClaim::new();
    for d in done {
        let a = &plan[d.index];
        if let (Some(dev), Some(nd)) = (&a.dra, network_data(a, d)) {
            per_claim
                .entry((dev.claim_namespace.clone(), dev.claim_name.clone()))
                .or_default()
                .push(nd);
        }
    }
    apply_all(ctx, client, per_claim, None);
}

/// At DEL: release plexus' network data on the claims of the plan's DRA attachments, when the
/// API answers within [`RELEASE_TIMEOUT`] (a claim deleted with its pod needs nothing).
pub fn release_network_data(ctx: &mut Ctx, plan: &[PlannedAttachment]) {
    if !ctx.config.dra_network_data {
        return;
    }
    let per_claim: PerClaim = plan
        .iter()
        .filter_map(|a| a.dra.as_ref())
        .map(|d| {
            (
                (d.claim_namespace.clone(), d.claim_name.clone()),
                Vec::new(),
            )
        })
        .collect();
    if per_claim.is_empty() {
        return;
    }
    let client = match ctx.client() {
        Ok(Some(c)) => c,
        _ => return,
    };
    apply_all(ctx, &client, per_claim, Some(RELEASE_TIMEOUT));
}
