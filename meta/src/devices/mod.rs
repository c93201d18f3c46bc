//! Device-plugin lookups: which devices (SR-IOV VF PCI addresses) the kubelet allocated to a
//! pod, per resource name, so a NAD annotated with `k8s.v1.cni.cncf.io/resourceName` gets its
//! `deviceID` without the pod or the NAD naming one. The kubelet pod-resources API is asked
//! first (as Multus does); its device-manager checkpoint file is the fallback.

pub mod podresources;

use crate::context::Ctx;
use crate::plan::DeviceMap;
use crate::pod::PodInfo;
use plexus_conf::error::{code, CniError};
use plexus_conf::k8s::checkpoint;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Deadline for the pod-resources call.
const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(10);

/// Devices allocated to `pod`, per resource: the pod-resources API when its socket answers,
/// else the checkpoint file.
pub fn lookup(ctx: &mut Ctx, pod: &PodInfo) -> Result<DeviceMap, CniError> {
    let label = format!("pod {}", pod.id.key());
    let socket = PathBuf::from(&ctx.config.pod_resources_socket);
    let (ns, name) = (pod.id.namespace.clone(), pod.id.name.clone());
    let api = ctx.block_on(async move {
        podresources::pod_devices(&socket, &ns, &name, POD_RESOURCES_TIMEOUT).await
    })?;
    let api_err = match api {
        Ok(devices) if !devices.is_empty() => return Ok(devices),
        Ok(_) => None,
        Err(e) => {
            tracing::info!(error = %e, "pod-resources API unavailable; reading the device checkpoint");
            Some(e.to_string())
        }
    };
    let cp_path = PathBuf::from(&ctx.config.device_checkpoint_file);
    match from_checkpoint(&cp_path, &pod.id.uid, &label) {
        Ok(devices) => Ok(devices),
        // The API answered (with no devices) but there is no checkpoint: nothing is allocated.
        Err(_) if api_err.is_none() => Ok(DeviceMap::new()),
        Err(e) => Err(CniError::new(
            e.code,
            e.msg,
            format!(
                "{}; pod-resources: {}",
                e.details,
                api_err.unwrap_or_default()
            ),
        )),
    }
}

/// Read the kubelet device-manager checkpoint for the pod with `uid`.
pub fn from_checkpoint(path: &Path, uid: &str, label: &str) -> Result<DeviceMap, CniError> {
    let bytes = std::fs::read(path).map_err(|e| {
        CniError::new(
            code::TRY_AGAIN_LATER,
            format!("{label}: cannot find the devices the kubelet allocated"),
            format!(
                "the device checkpoint {} is unreadable: {e}",
                path.display()
            ),
        )
    })?;
    checkpoint::pod_devices(&bytes, uid).map_err(|e| e.context(label))
}
