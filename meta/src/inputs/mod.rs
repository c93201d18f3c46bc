//! Stage 1 of every verb: read what a plan depends on — the pod, the NetworkAttachmentDefinitions
//! it references, the devices allocated to it — from one source behind the [`Inputs`] seam:
//!
//! | source | used by | cost |
//! |---|---|---|
//! | [`api::ApiInputs`] | thin mode (`plexus` per call) | GET pod + N concurrent NAD GETs (+ DRA reads) |
//! | `crate::daemon::cache::CacheInputs` | daemon mode | none: the daemon's watch caches (a GET only on a cache miss) |
//! | [`files::FileInputs`] | `plexus explain` | manifests on disk |
//!
//! The stages after it (plan → attach with undo → report) are the same for every source. It
//! gives a [`Read`] (a plan type); [`devices`] joins the device plugin's allocations and the
//! pod's DRA claims.

pub mod api;
pub mod devices;
pub mod files;

use crate::context::Ctx;
use crate::devices::dra::DraDevice;
use crate::error::MetaError;
use crate::k8s::KubeClient;
use crate::plan::requests::{self, NadMap};
use crate::plan::resolve::NadData;
use crate::plan::DeviceMap;
use crate::pod::{PodIdentity, PodInfo};
use std::collections::BTreeSet;

/// A source of the pod, its NADs and its devices. Every method fails with a typed
/// [`MetaError`] naming what could not be read ([`MetaError::PodRead`], [`MetaError::NadRead`],
/// a device variant…), whichever the source.
pub trait Inputs {
    /// The pod. `Ok(None)`: no API (static mode) or the pod is gone.
    fn pod(&mut self, ctx: &mut Ctx, id: &PodIdentity) -> Result<Option<PodInfo>, MetaError>;
    /// The pod for a DEL without a plan: at most one quick attempt, so that an API server that
    /// is down does not hold the pod's teardown (`Err` when the source cannot answer now).
    /// Sources without a retry budget read it as [`Inputs::pod`] does.
    fn pod_quick(&mut self, ctx: &mut Ctx, id: &PodIdentity) -> Result<Option<PodInfo>, MetaError> {
        self.pod(ctx, id)
    }
    /// The NADs `refs` names, by `(namespace, name)`; a missing NAD maps to `None`. `label`
    /// names the pod in errors.
    fn nads(
        &mut self,
        ctx: &mut Ctx,
        refs: &[(String, String)],
        label: &str,
    ) -> Result<NadMap, MetaError>;
    /// The devices allocated to `pod` for the `wanted` resources: per resource, and the DRA
    /// devices among them.
    fn devices(
        &mut self,
        ctx: &mut Ctx,
        pod: &PodInfo,
        wanted: &BTreeSet<String>,
    ) -> Result<(DeviceMap, Vec<DraDevice>), MetaError>;
    /// The API client the report stage writes through (`None`: static mode, nothing is
    /// reported).
    fn client(&mut self, ctx: &mut Ctx) -> Result<Option<KubeClient>, MetaError>;
    /// Every NAD of namespace `ns`, by name; `None` when they cannot be read now (logged).
    /// Sources without an API have none.
    fn namespace_nads(&mut self, _ctx: &mut Ctx, _ns: &str) -> Option<Vec<(String, NadData)>> {
        Some(Vec::new())
    }
}

pub use crate::plan::Read;

/// Read the requests of `pod`, the NADs they reference and, when a NAD names a device
/// resource, the pod's allocated devices.
pub fn read(
    ctx: &mut Ctx,
    inputs: &mut dyn Inputs,
    pod: Option<PodInfo>,
    label: &str,
) -> Result<Read, MetaError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::files::{DeviceInputs, FileInputs};
    use crate::plan::resolve::NadData;
    use crate::pod::PodClaims;
    use plexus_conf::plexus_config::PlexusConfig;
    use serde_json::json;

    fn ctx() -> Ctx {
        let cfg = PlexusConfig::parse(
            br#"{"cniVersion":"1.0.0","name":"p","type":"plexus","delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}]}"#,
        )
        .unwrap();
        Ctx::from_config(cfg, &[], None)
    }

    fn pod(networks: &str) -> PodInfo {
        PodInfo {
            id: PodIdentity {
                namespace: "bank".into(),
                name: "pg-0".into(),
                ..Default::default()
            },
            annotations: [(
                plexus_conf::k8s::selection::NETWORKS_ANNOTATION.to_string(),
                networks.to_string(),
            )]
            .into(),
            claims: Some(PodClaims {
                node_name: "node-a".into(),
                claims: vec!["pg-vfs".into()],
                extended: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn typed_errors_come_through_the_inputs_stage() {
        let mut ctx = ctx();
        let mut files = FileInputs::default();
        let e = read(&mut ctx, &mut files, Some(pod("[{bad")), "pod bank/pg-0").unwrap_err();
        assert!(
            matches!(&e, MetaError::Annotation { pod, .. } if pod == "bank/pg-0"),
            "{e:?}"
        );

        // A device network whose claim is not allocated yet: typed, code 11.
        files.nads.insert(
            ("bank".into(), "vf".into()),
            Some(NadData {
                config: r#"{"cniVersion":"1.0.0","type":"sriov"}"#.into(),
                resource_name: Some("intel.com/sriov".into()),
                ..Default::default()
            }),
        );
        files.devices = DeviceInputs {
            claims: vec![json!({"metadata":{"name":"pg-vfs","namespace":"bank"},"spec":{}})],
            ..Default::default()
        };
        let e = read(&mut ctx, &mut files, Some(pod("vf")), "pod bank/pg-0").unwrap_err();
        assert!(
            matches!(&e, MetaError::ClaimNotAllocated { name, .. } if name == "pg-vfs"),
            "{e:?}"
        );
        assert_eq!(e.code(), 11);
    }
}
