//! The devices stage of the inputs: the device plugin's allocations ([`crate::devices`]) and,
//! for resources they do not cover, the pod's DRA claims.

use crate::context::Ctx;
use crate::devices::{dra, lookup};
use crate::error::MetaError;
use crate::plan::DeviceMap;
use crate::pod::PodInfo;

/// Every device allocated to the pod for the `wanted` resources: the device plugin's (kubelet)
/// first; for resources it does not cover, the pod's DRA claims (only pods that have claims pay
/// the claim GETs and slice LISTs). `claims` is the pod's DRA side when the pod object was
/// read; `None` means it must be read (one GET) before the claims can be known.
pub fn allocated(
    ctx: &mut Ctx,
    client: Option<&crate::k8s::KubeClient>,
    pod: &PodInfo,
    wanted: &std::collections::BTreeSet<String>,
) -> Result<(DeviceMap, Vec<dra::DraDevice>), MetaError> {
    let label = format!("pod {}", pod.id.key());
    let (plugin, named) = match lookup(ctx, pod) {
        Ok(a) => (Ok(a.devices), a.claim_devices),
        Err(e) => (Err(e), Vec::new()),
    };
    let covered = |m: &DeviceMap| wanted.iter().all(|r| m.contains_key(r));
    if plugin.as_ref().is_ok_and(covered) {
        return Ok((plugin.unwrap_or_default(), Vec::new()));
    }
    let Some(client) = client else {
        return plugin.map(|m| (m, Vec::new()));
    };
    let claims = match &pod.claims {
        Some(c) => c.clone(),
        None => super::api::fetch_pod(ctx, Some(client), Some(&pod.id))?
            .and_then(|p| p.claims)
            .unwrap_or_default(),
    };
    if claims.is_empty() {
        return plugin.map(|m| (m, Vec::new()));
    }
    let ns = pod.id.namespace.clone();
    // The kubelet names the prepared devices: then only the slices are read.
    let found = match ctx.block_on(dra::lookup_named(client, &ns, &claims, &named, &label))? {
        Some(found) => found?,
        None => ctx.block_on(dra::lookup(client, &ns, &claims, &label))??,
    };
    let mut map = match plugin {
        Ok(m) => m,
        // The device plugin's sources failing is fine when the claims cover every resource.
        Err(e) if !covered(&dra::device_map(&found)) => return Err(e),
        Err(e) => {
            tracing::debug!(error = %e, "no device-plugin allocations; DRA covers every resource");
            DeviceMap::new()
        }
    };
    for (res, ids) in dra::device_map(&found) {
        let entry = map.entry(res).or_default();
        entry.extend(ids);
        entry.sort();
        entry.dedup();
    }
    Ok((map, found))
}
