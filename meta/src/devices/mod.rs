//! Device-plugin lookups: which devices (SR-IOV VF PCI addresses) the kubelet allocated to a
//! pod, per resource name, so a NAD annotated with `k8s.v1.cni.cncf.io/resourceName` gets its
//! `deviceID` without the pod or the NAD naming one. The kubelet pod-resources API is asked
//! first (as Multus does); its device-manager checkpoint file is the fallback.

pub mod claims;
pub mod devinfo;
pub mod dra;
pub mod podresources;

use crate::context::Ctx;
use crate::error::MetaError;
use crate::plan::DeviceMap;
use crate::pod::PodInfo;
use plexus_conf::k8s::checkpoint;
use podresources::PodAllocations;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Deadline for the pod-resources call.
const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(10);

/// Devices allocated to `pod`, per resource: the pod-resources API when its socket answers,
/// else the checkpoint file.
pub fn lookup(ctx: &mut Ctx, pod: &PodInfo) -> Result<PodAllocations, MetaError> {
    let label = format!("pod {}", pod.id.key());
    let socket = PathBuf::from(&ctx.config.pod_resources_socket);
    let (ns, name) = (pod.id.namespace.clone(), pod.id.name.clone());
    let api = ctx.block_on(async move {
        podresources::pod_allocations(&socket, &ns, &name, POD_RESOURCES_TIMEOUT).await
    })?;
    let mut named = Vec::new();
    let api_err = match api {
        Ok(a) if !a.devices.is_empty() => return Ok(a),
        Ok(a) => {
            named = a.claim_devices;
            None
        }
        Err(e) => {
            tracing::info!(error = %e, "pod-resources API unavailable; reading the device checkpoint");
            Some(e)
        }
    };
    let cp_path = PathBuf::from(&ctx.config.device_checkpoint_file);
    let with_named = |devices| PodAllocations {
        devices,
        claim_devices: named.clone(),
    };
    match (from_checkpoint(&cp_path, &pod.id.uid, &label), api_err) {
        (Ok(devices), _) => Ok(with_named(devices)),
        // The API answered (with no devices) but there is no checkpoint: nothing is allocated.
        (Err(_), None) => Ok(with_named(DeviceMap::new())),
        (Err(e), Some(pod_resources)) => Err(MetaError::DevicesUnavailable {
            source: Box::new(e),
            pod_resources,
        }),
    }
}

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
        None => crate::inputs::api::fetch_pod(ctx, Some(client), Some(&pod.id))?
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

/// After planning: tie each attachment's allocated device to its DRA identity, and give
/// attachments with a device their per-attachment device-info file
/// (`runtimeConfig.CNIDeviceInfoFile`, for plugins that declare the capability).
pub fn annotate(
    plan: &mut [crate::plan::PlannedAttachment],
    found: &[dra::DraDevice],
    info_dir: &Path,
    container_id: &str,
) {
    use plexus_conf::k8s::devinfo;
    for a in plan.iter_mut().filter(|a| a.resource_name.is_some()) {
        let Some(id) = a
            .capability_args
            .get("deviceID")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
        else {
            continue;
        };
        a.dra = found
            .iter()
            .find(|d| d.device_id == id && Some(&d.resource_name) == a.resource_name.as_ref())
            .cloned();
        let file = devinfo::attachment_file(info_dir, &a.network, container_id, &a.ifname);
        a.capability_args.insert(
            devinfo::CAPABILITY.into(),
            serde_json::Value::from(file.display().to_string()),
        );
    }
}

/// Read the kubelet device-manager checkpoint for the pod with `uid`.
pub fn from_checkpoint(path: &Path, uid: &str, label: &str) -> Result<DeviceMap, MetaError> {
    let bytes = std::fs::read(path).map_err(|source| MetaError::CheckpointUnreadable {
        pod: label.to_string(),
        path: path.to_path_buf(),
        source,
    })?;
    checkpoint::pod_devices(&bytes, uid).map_err(|source| MetaError::CheckpointInvalid {
        pod: label.to_string(),
        source: source.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodIdentity;
    use plexus_conf::plexus_config::PlexusConfig;

    #[test]
    fn without_kubelet_sources_the_error_names_both() {
        let t = tempfile::tempdir().unwrap();
        let cfg = PlexusConfig::parse(
            serde_json::json!({"cniVersion":"1.0.0","name":"p","type":"plexus",
                "delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}],
                "podResourcesSocket": t.path().join("kubelet.sock"),
                "deviceCheckpointFile": t.path().join("kubelet_internal_checkpoint")})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let mut ctx = Ctx::from_config(cfg, &[], None);
        let pod = PodInfo {
            id: PodIdentity {
                namespace: "bank".into(),
                name: "pg-0".into(),
                uid: "u1".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let e = lookup(&mut ctx, &pod).unwrap_err();
        match &e {
            MetaError::DevicesUnavailable {
                source,
                pod_resources,
            } => {
                assert!(
                    matches!(&**source, MetaError::CheckpointUnreadable { pod, .. } if pod == "pod bank/pg-0"),
                    "{source:?}"
                );
                assert!(pod_resources.is_unavailable(), "{pod_resources:?}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(e.code(), 11);
        assert!(e.details().contains("; pod-resources: "), "{e}");

        // A checkpoint that is not JSON.
        std::fs::write(t.path().join("kubelet_internal_checkpoint"), b"{").unwrap();
        let e = from_checkpoint(
            &t.path().join("kubelet_internal_checkpoint"),
            "u1",
            "pod bank/pg-0",
        )
        .unwrap_err();
        assert!(matches!(e, MetaError::CheckpointInvalid { .. }), "{e:?}");
        assert_eq!(e.code(), 6);
    }
}
