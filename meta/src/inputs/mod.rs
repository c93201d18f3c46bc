//! Stage 1 of every verb: read what a plan depends on — the pod, the NetworkAttachmentDefinitions
//! it references, the devices allocated to it — from one source behind the [`Inputs`] seam:
//!
//! | source | used by | cost |
//! |---|---|---|
//! | [`api::ApiInputs`] | thin mode (`plexus` per call) | GET pod + N concurrent NAD GETs (+ DRA reads) |
//! | `crate::daemon::cache::CacheInputs` | daemon mode | none: the daemon's watch caches (a GET only on a cache miss) |
//! | [`files::FileInputs`] | `plexus explain` | manifests on disk |
//!
//! The stages after it (plan → attach with undo → report) are the same for every source.

pub mod api;
pub mod files;

use crate::context::Ctx;
use crate::devices::dra::DraDevice;
use crate::k8s::KubeClient;
use crate::plan::requests::{self, NadMap, Requests};
use crate::plan::DeviceMap;
use crate::pod::{PodIdentity, PodInfo};
use plexus_conf::error::CniError;
use std::collections::BTreeSet;

/// A source of the pod, its NADs and its devices.
pub trait Inputs {
    /// The pod. `Ok(None)`: no API (static mode) or the pod is gone.
    fn pod(&mut self, ctx: &mut Ctx, id: &PodIdentity) -> Result<Option<PodInfo>, CniError>;
    /// The NADs `refs` names, by `(namespace, name)`; a missing NAD maps to `None`. `label`
    /// names the pod in errors.
    fn nads(
        &mut self,
        ctx: &mut Ctx,
        refs: &[(String, String)],
        label: &str,
    ) -> Result<NadMap, CniError>;
    /// The devices allocated to `pod` for the `wanted` resources: per resource, and the DRA
    /// devices among them.
    fn devices(
        &mut self,
        ctx: &mut Ctx,
        pod: &PodInfo,
        wanted: &BTreeSet<String>,
    ) -> Result<(DeviceMap, Vec<DraDevice>), CniError>;
    /// The API client the report stage writes through (`None`: static mode, nothing is
    /// reported).
    fn client(&mut self, ctx: &mut Ctx) -> Result<Option<KubeClient>, CniError>;
}

/// Everything the planner needs, as read from an [`Inputs`].
#[derive(Debug, Clone, Default)]
pub struct Read {
    /// The pod, when known.
    pub pod: Option<PodInfo>,
    /// What the pod asks for.
    pub requests: Requests,
    /// The NADs those requests reference.
    pub nads: NadMap,
    /// Devices per resource, when some NAD names a resource (`None`: not looked up).
    pub devices: Option<DeviceMap>,
    /// The DRA devices among them.
    pub dra: Vec<DraDevice>,
}

/// Read the requests of `pod`, the NADs they reference and, when a NAD names a device
/// resource, the pod's allocated devices.
pub fn read(
    ctx: &mut Ctx,
    inputs: &mut dyn Inputs,
    pod: Option<PodInfo>,
    label: &str,
) -> Result<Read, CniError> {
    let requests = requests::requests(&ctx.config, pod.as_ref())?;
    let refs = requests::nad_refs(
        &requests,
        pod.as_ref().map(|p| p.id.namespace.as_str()).unwrap_or(""),
    );
    let nads = if refs.is_empty() {
        NadMap::new()
    } else {
        inputs.nads(ctx, &refs, label)?
    };
    // Device networks: ask for what was allocated only when a NAD names a resource.
    let wanted: BTreeSet<String> = nads
        .values()
        .flatten()
        .filter_map(|n| n.resource_name.clone())
        .collect();
    let (devices, dra) = match (wanted.is_empty(), pod.as_ref()) {
        (false, Some(p)) => {
            let (map, found) = inputs.devices(ctx, p, &wanted)?;
            (Some(map), found)
        }
        _ => (None, Vec::new()),
    };
    Ok(Read {
        pod,
        requests,
        nads,
        devices,
        dra,
    })
}
