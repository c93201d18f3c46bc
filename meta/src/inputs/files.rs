//! `plexus explain`'s inputs: the pod, NAD, ResourceClaim and ResourceSlice manifests given on
//! the command line, and device-plugin allocations given as `RESOURCE=ID`.

use super::Inputs;
use crate::context::Ctx;
use crate::devices::dra::{self, DraDevice};
use crate::error::MetaError;
use crate::k8s::KubeClient;
use crate::plan::requests::NadMap;
use crate::plan::DeviceMap;
use crate::pod::{PodIdentity, PodInfo};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::Value;
use std::collections::BTreeSet;

/// Inputs from manifests: nothing is fetched.
#[derive(Debug, Clone, Default)]
pub struct FileInputs {
    /// The pod.
    pub pod: Option<PodInfo>,
    /// Every NAD given, by `(namespace, name)`.
    pub nads: NadMap,
    /// Device allocations and DRA objects.
    pub devices: DeviceInputs,
}

impl Inputs for FileInputs {
    fn pod(&mut self, _ctx: &mut Ctx, _id: &PodIdentity) -> Result<Option<PodInfo>, MetaError> {
        Ok(self.pod.clone())
    }

    fn nads(
        &mut self,
        _ctx: &mut Ctx,
        refs: &[(String, String)],
        _label: &str,
    ) -> Result<NadMap, MetaError> {
        Ok(refs
            .iter()
            .map(|r| (r.clone(), self.nads.get(r).cloned().flatten()))
            .collect())
    }

    fn devices(
        &mut self,
        _ctx: &mut Ctx,
        pod: &PodInfo,
        _wanted: &BTreeSet<String>,
    ) -> Result<(DeviceMap, Vec<DraDevice>), MetaError> {
        self.devices.resolve(pod, &format!("pod {}", pod.id.key()))
    }

    fn client(&mut self, _ctx: &mut Ctx) -> Result<Option<KubeClient>, MetaError> {
        Ok(None)
    }
}

pub(crate) fn meta_str(v: &Value, key: &str) -> String {
    v.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Allocated devices given on the command line: device-plugin allocations and DRA objects.
#[derive(Debug, Clone, Default)]
pub struct DeviceInputs {
    /// `(resource name, device ID)` pairs, as the kubelet's device plugins allocated them.
    pub allocated: Vec<(String, String)>,
    /// ResourceClaim manifests.
    pub claims: Vec<Value>,
    /// ResourceSlice manifests.
    pub slices: Vec<Value>,
}

impl DeviceInputs {
    /// The devices per resource and the DRA devices, for `pod`'s claims.
    pub fn resolve(
        &self,
        pod: &PodInfo,
        label: &str,
    ) -> Result<(DeviceMap, Vec<DraDevice>), MetaError> {
        let mut map = DeviceMap::new();
        for (res, id) in &self.allocated {
            map.entry(res.clone()).or_default().push(id.clone());
        }
        let mut found = Vec::new();
        if let Some(pc) = pod.claims.as_ref().filter(|c| !c.is_empty()) {
            let parse = |what: &'static str, v: &Value, source| MetaError::Manifest {
                what,
                manifest: v.to_string(),
                source,
            };
            let claims: Vec<ResourceClaim> = self
                .claims
                .iter()
                .filter(|c| {
                    let n = meta_str(c, "name");
                    pc.claims.contains(&n)
                        || pc.extended.as_ref().is_some_and(|e| e.claim_name == n)
                })
                .map(|c| serde_json::from_value(c.clone()).map_err(|e| parse("a claim", c, e)))
                .collect::<Result<_, _>>()?;
            let slices: Vec<ResourceSlice> = self
                .slices
                .iter()
                .map(|c| serde_json::from_value(c.clone()).map_err(|e| parse("a slice", c, e)))
                .collect::<Result<_, _>>()?;
            found = dra::resolve(
                &pod.id.namespace,
                &pc.node_name,
                &claims,
                pc.extended.as_ref(),
                &slices,
                label,
            )?;
        }
        for (res, ids) in dra::device_map(&found) {
            map.entry(res).or_default().extend(ids);
        }
        for ids in map.values_mut() {
            ids.sort();
            ids.dedup();
        }
        Ok((map, found))
    }
}
