//! DRA objects (`resource.k8s.io/v1`) for device lookups: the pod's ResourceClaims, the
//! ResourceSlices of one driver on one node, and the claim's device status (KEP-4817
//! `networkData`), written by server-side apply so the entries of the DRA driver stay as they
//! are.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{ListParams, ObjectList, Patch, PatchParams};
use kube::Resource;
use serde_json::{json, Value};

use super::client::{built, KubeClient};
use super::error::{Ctx, K8sError};
use super::names::segment;
use super::retry;

/// Device attribute holding the resource name a NAD refers to.
pub const RESOURCE_NAME_ATTR: &str = "k8s.cni.cncf.io/resourceName";

/// Field manager of plexus' server-side applies.
pub const FIELD_MANAGER: &str = "plexus";

/// One `status.devices[]` entry plexus owns: the device and its network data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNetworkData {
    /// Driver name.
    pub driver: String,
    /// Pool name.
    pub pool: String,
    /// Device name in the pool.
    pub device: String,
    /// Interface in the pod.
    pub interface_name: String,
    /// Addresses in CIDR form.
    pub ips: Vec<String>,
    /// MAC address.
    pub hardware_address: String,
}

/// The apply body setting exactly `entries` as plexus' part of the claim's device status; an
/// empty list releases everything plexus set before.
pub fn network_data_apply(ns: &str, claim: &str, entries: &[DeviceNetworkData]) -> Value {
    let devices: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut nd = serde_json::Map::new();
            if !e.interface_name.is_empty() {
                nd.insert("interfaceName".into(), json!(e.interface_name));
            }
            if !e.ips.is_empty() {
                nd.insert("ips".into(), json!(e.ips));
            }
            if !e.hardware_address.is_empty() {
                nd.insert("hardwareAddress".into(), json!(e.hardware_address));
            }
            json!({"driver": e.driver, "pool": e.pool, "device": e.device, "networkData": nd})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim, "namespace": ns},
        "status": {"devices": devices}
    })
}

impl KubeClient {
    /// GET one ResourceClaim; `Ok(None)` when it does not exist.
    pub async fn get_resource_claim(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<ResourceClaim>, K8sError> {
        let ctx = Ctx {
            what: "get resourceclaim",
            ns,
            name,
        };
        K8sError::check_names(ctx)?;
        let url = ResourceClaim::url_path(&(), Some(&segment(ns)));
        let name = segment(name);
        let got = retry::run(self.opts.retry, self.opts.request_timeout, ctx, || async {
            let req = built(
                ctx,
                kube::core::Request::new(&url).get(&name, &Default::default()),
            )?;
            self.fetch::<ResourceClaim>(ctx, req).await
        })
        .await;
        match got {
            Ok(claim) => Ok(Some(claim)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// LIST the ResourceSlices of `driver` on `node` (field selectors, one request).
    pub async fn list_resource_slices(
        &self,
        node: &str,
        driver: &str,
    ) -> Result<Vec<ResourceSlice>, K8sError> {
        let params =
            ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={driver}"));
        let ctx = Ctx {
            what: "list resourceslices",
            ns: "",
            name: driver,
        };
        let url = ResourceSlice::url_path(&(), None);
        let list = retry::run(self.opts.retry, self.opts.request_timeout, ctx, || async {
            let req = built(ctx, kube::core::Request::new(&url).list(&params))?;
            self.fetch::<ObjectList<ResourceSlice>>(ctx, req).await
        })
        .await?;
        Ok(list.items)
    }

    /// Server-side apply of plexus' `status.devices[].networkData` entries on a claim
    /// (RBAC: `resourceclaims/status: patch`).
    pub async fn apply_claim_network_data(
        &self,
        ns: &str,
        claim: &str,
        entries: &[DeviceNetworkData],
    ) -> Result<(), K8sError> {
        let body = network_data_apply(ns, claim, entries);
        let patch = Patch::Apply(&body);
        let params = PatchParams::apply(FIELD_MANAGER);
        let ctx = Ctx {
            what: "apply resourceclaim status",
            ns,
            name: claim,
        };
        K8sError::check_names(ctx)?;
        let url = ResourceClaim::url_path(&(), Some(&segment(ns)));
        let claim = segment(claim);
        retry::run(self.opts.retry, self.opts.request_timeout, ctx, || async {
            let req =
                kube::core::Request::new(&url).patch_subresource("status", &claim, &params, &patch);
            self.exchange(ctx, built(ctx, req)?).await
        })
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_body_names_the_device_and_only_set_fields() {
        let b = network_data_apply(
            "bank",
            "pg-vfs",
            &[DeviceNetworkData {
                driver: "sriov.k8s.io".into(),
                pool: "node1".into(),
                device: "vf-0".into(),
                interface_name: "net1".into(),
                ips: vec!["10.56.217.10/24".into()],
                hardware_address: String::new(),
            }],
        );
        assert_eq!(b["kind"], "ResourceClaim");
        assert_eq!(b["metadata"]["namespace"], "bank");
        let d = &b["status"]["devices"][0];
        assert_eq!(d["device"], "vf-0");
        assert_eq!(d["networkData"]["interfaceName"], "net1");
        assert!(d["networkData"].get("hardwareAddress").is_none());
        let cleared = network_data_apply("bank", "pg-vfs", &[]);
        assert_eq!(cleared["status"]["devices"], json!([]));
    }
}
