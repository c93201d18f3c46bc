//! Device-plugin lookups: which devices (SR-IOV VF PCI addresses) the kubelet allocated to a
//! pod, per resource name, so a NAD annotated with `k8s.v1.cni.cncf.io/resourceName` gets its
//! `deviceID` without the pod or the NAD naming one. The kubelet pod-resources API is asked
//! first (as Multus does); its device-manager checkpoint file is the fallback.

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
