//! Thin-mode inputs: the API server, read by this CNI call (GET pod, concurrent NAD GETs), or
//! the pod annotations the runtime passed when the config declares that capability.

use super::Inputs;
use crate::context::Ctx;
use crate::devices::dra::DraDevice;
use crate::k8s::KubeClient;
use crate::plan::requests::NadMap;
use crate::plan::resolve::NadData;
use crate::plan::DeviceMap;
use crate::pod::{PodIdentity, PodInfo};
use plexus_conf::error::CniError;
use plexus_conf::plexus_config::PlexusConfig;
use std::collections::BTreeSet;

/// The runtime capability carrying the pod's annotations (containerd, CRI-O).
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";

/// Inputs read from the API server by this call, through the call's client (built on first
/// use); without an API (static mode) there is no pod and NAD references resolve only
/// through the `confDir` fallback.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiInputs;

impl Inputs for ApiInputs {
    fn pod(&mut self, ctx: &mut Ctx, id: &PodIdentity) -> Result<Option<PodInfo>, CniError> {
        let client = ctx.client()?;
        if client.is_some() {
            if let Some(p) = pod_from_runtime(&ctx.config, Some(id)) {
                return Ok(Some(p));
            }
        }
        fetch_pod(ctx, client.as_ref(), Some(id))
    }

    fn nads(
        &mut self,
        ctx: &mut Ctx,
        refs: &[(String, String)],
        label: &str,
    ) -> Result<NadMap, CniError> {
        let client = ctx.client()?;
        fetch_nads(ctx, client.as_ref(), refs, label)
    }

    fn devices(
        &mut self,
        ctx: &mut Ctx,
        pod: &PodInfo,
        wanted: &BTreeSet<String>,
    ) -> Result<(DeviceMap, Vec<DraDevice>), CniError> {
        let client = ctx.client()?;
        crate::devices::allocated(ctx, client.as_ref(), pod, wanted)
    }

    fn client(&mut self, ctx: &mut Ctx) -> Result<Option<KubeClient>, CniError> {
        ctx.client()
    }
}

/// The pod from what the runtime passed, without an API request: when plexus' config declares
/// the `io.kubernetes.cri.pod-annotations` capability the runtime hands over the annotations,
/// and `K8S_POD_UID` identifies the pod (the status PATCH carries it as a precondition).
pub fn pod_from_runtime(config: &PlexusConfig, id: Option<&PodIdentity>) -> Option<PodInfo> {
    let id = id.filter(|i| !i.uid.is_empty())?;
    let ann = config
        .runtime_config
        .get(POD_ANNOTATIONS_CAPABILITY)?
        .as_object()?;
    Some(PodInfo {
        id: id.clone(),
        annotations: ann
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
            .collect(),
        claims: None,
    })
}

/// Fetch the pod (bounded retry). `Ok(None)`: no API, no pod identity, or the pod is gone.
pub fn fetch_pod(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    id: Option<&PodIdentity>,
) -> Result<Option<PodInfo>, CniError> {
    let (Some(client), Some(id)) = (client, id) else {
        return Ok(None);
    };
    let policy = client.options().retry;
    let uid = (!id.uid.is_empty()).then_some(id.uid.as_str());
    let got = ctx.block_on(client.get_pod(&id.namespace, &id.name, uid, policy))?;
    match got {
        Ok(Some(pod)) => Ok(Some(PodInfo::from_pod(&pod, id))),
        Ok(None) => {
            tracing::warn!(pod = %id.key(), "pod not found (already deleted?): only the default network and the static config are known for it");
            Ok(None)
        }
        Err(e) => Err(CniError::new(
            e.cni_code(),
            format!("pod {}: cannot read the pod", id.key()),
            e.to_string(),
        )),
    }
}

/// Fetch NADs concurrently into a map.
pub fn fetch_nads(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    refs: &[(String, String)],
    pod: &str,
) -> Result<NadMap, CniError> {
    let mut map = NadMap::new();
    if refs.is_empty() {
        return Ok(map);
    }
    let Some(client) = client else {
        // Static mode: NAD references resolve only through the confDir fallback.
        return Ok(map);
    };
    let borrowed: Vec<(&str, &str)> = refs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let results = ctx.block_on(client.get_nads(&borrowed))?;
    for (rf, res) in refs.iter().zip(results) {
        match res {
            Ok(nad) => {
                map.insert(rf.clone(), nad.as_ref().map(NadData::from_nad));
            }
            Err(e) => {
                return Err(CniError::new(
                    e.cni_code(),
                    format!(
                        "{pod}, network {}/{}: cannot read the NetworkAttachmentDefinition",
                        rf.0, rf.1
                    ),
                    e.to_string(),
                ))
            }
        }
    }
    Ok(map)
}
