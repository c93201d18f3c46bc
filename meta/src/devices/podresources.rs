//! Kubelet pod-resources gRPC API (v1) client: the device IDs (SR-IOV VF PCI addresses) the
//! kubelet's device manager allocated to one pod, per resource name, as Multus reads them.
//!
//! `Get` (beta and on by default since Kubernetes 1.34) is tried first; when the kubelet does
//! not offer it (`Unimplemented` before 1.27, `Unknown` "Get method disabled" with the gate off)
//! or reports the pod unknown, `List` decides, matching on namespace and name as Multus does.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use http::uri::PathAndQuery;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use self::proto::{
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};

/// The kubelet's pod-resources socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// Largest response accepted (the kubelet's own client and Multus use 16 MiB).
pub use crate::grpc_unix::MAX_MESSAGE_SIZE;

/// Protobuf messages of `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` (the subset plexus
/// reads; unknown fields such as `cpu_ids`, `memory` and `dynamic_resources` are skipped on
/// decode), and the gRPC method paths.
pub mod proto {
    /// gRPC path of `PodResourcesLister.List`.
    pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";
    /// gRPC path of `PodResourcesLister.Get`.
    pub const GET_PATH: &str = "/v1.PodResourcesLister/Get";
    /// gRPC service name, as a server registers it.
    pub const SERVICE_NAME: &str = "v1.PodResourcesLister";

    /// `ListPodResourcesRequest{}`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesRequest {}

    /// `ListPodResourcesResponse{ repeated PodResources pod_resources = 1 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesResponse {
        /// Every pod on the node.
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    /// `GetPodResourcesRequest{ string pod_name = 1; string pod_namespace = 2 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetPodResourcesRequest {
        /// Pod name.
        #[prost(string, tag = "1")]
        pub pod_name: String,
        /// Pod namespace.
        #[prost(string, tag = "2")]
        pub pod_namespace: String,
    }

    /// `GetPodResourcesResponse{ PodResources pod_resources = 1 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetPodResourcesResponse {
        /// The pod asked for.
        #[prost(message, optional, tag = "1")]
        pub pod_resources: Option<PodResources>,
    }

    /// `PodResources{ string name = 1; string namespace = 2; repeated ContainerResources containers = 3 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodResources {
        /// Pod name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Pod namespace.
        #[prost(string, tag = "2")]
        pub namespace: String,
        /// Its containers.
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    /// `ContainerResources{ string name = 1; repeated ContainerDevices devices = 2; repeated int64 cpu_ids = 3; ... }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerResources {
        /// Container name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Device-plugin devices allocated to it.
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
        /// Exclusive CPUs (CPU manager static policy).
        #[prost(int64, repeated, tag = "3")]
        pub cpu_ids: Vec<i64>,
        /// DRA devices of the container's claims (beta, on by default since 1.34).
        #[prost(message, repeated, tag = "5")]
        pub dynamic_resources: Vec<DynamicResource>,
    }

    /// `DynamicResource{ string claim_name = 2; string claim_namespace = 3; repeated ClaimResource claim_resources = 4 }`
    /// (field 1, `class_name`, was removed).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DynamicResource {
        /// The ResourceClaim's API name.
        #[prost(string, tag = "2")]
        pub claim_name: String,
        /// Its namespace.
        #[prost(string, tag = "3")]
        pub claim_namespace: String,
        /// The devices prepared for it.
        #[prost(message, repeated, tag = "4")]
        pub claim_resources: Vec<ClaimResource>,
    }

    /// `ClaimResource{ repeated CDIDevice cdi_devices = 1; string driver_name = 2; string pool_name = 3; string device_name = 4 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ClaimResource {
        /// Driver.
        #[prost(string, tag = "2")]
        pub driver_name: String,
        /// Pool.
        #[prost(string, tag = "3")]
        pub pool_name: String,
        /// Device name in the pool.
        #[prost(string, tag = "4")]
        pub device_name: String,
    }

    /// `ContainerDevices{ string resource_name = 1; repeated string device_ids = 2; TopologyInfo topology = 3 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        /// Extended resource name, e.g. `intel.com/sriov_netdevice`.
        #[prost(string, tag = "1")]
        pub resource_name: String,
        /// Device IDs; for SR-IOV the VF PCI addresses, e.g. `0000:04:00.5`.
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
        /// NUMA placement.
        #[prost(message, optional, tag = "3")]
        pub topology: Option<TopologyInfo>,
    }

    /// `TopologyInfo{ repeated NUMANode nodes = 1 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TopologyInfo {
        /// NUMA nodes.
        #[prost(message, repeated, tag = "1")]
        pub nodes: Vec<NumaNode>,
    }

    /// `NUMANode{ int64 ID = 1 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NumaNode {
        /// NUMA node ID.
        #[prost(int64, tag = "1")]
        pub id: i64,
    }
}

pub use crate::error::PodResourcesError;

/// A DRA device the kubelet prepared for one of the pod's claims.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimDevice {
    /// Claim namespace.
    pub claim_namespace: String,
    /// Claim API name.
    pub claim_name: String,
    /// Driver.
    pub driver: String,
    /// Pool.
    pub pool: String,
    /// Device name.
    pub device: String,
}

/// What the kubelet allocated to one pod: device-plugin IDs per resource and DRA devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAllocations {
    /// Device IDs per resource name (sorted, deduplicated).
    pub devices: BTreeMap<String, Vec<String>>,
    /// DRA devices per claim (sorted, deduplicated).
    pub claim_devices: Vec<ClaimDevice>,
}

/// Device IDs per resource name allocated to pod `ns`/`name` (all containers merged; each list
/// sorted and deduplicated). A pod the kubelet does not know, or without devices, gives an empty
/// map. The whole exchange (connect, `Get`, maybe `List`) is bounded by `timeout`.
pub async fn pod_devices(
    socket: &Path,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<BTreeMap<String, Vec<String>>, PodResourcesError> {
    pod_allocations(socket, ns, name, timeout)
        .await
        .map(|a| a.devices)
}

/// Like [`pod_devices`], with the DRA devices the kubelet reports for the pod's claims.
pub async fn pod_allocations(
    socket: &Path,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<PodAllocations, PodResourcesError> {
    if !socket.exists() {
        return Err(PodResourcesError::NoSocket(socket.to_path_buf()));
    }
    match tokio::time::timeout(timeout, query(socket, ns, name)).await {
        Ok(result) => result,
        Err(_) => Err(PodResourcesError::Timeout(timeout)),
    }
}

/// The DRA devices of pod `ns`/`name` in `pods` (every container).
pub fn merge_claim_devices(pods: &[PodResources], ns: &str, name: &str) -> Vec<ClaimDevice> {
    let mut out: Vec<ClaimDevice> = pods
        .iter()
        .filter(|p| p.namespace == ns && p.name == name)
        .flat_map(|p| p.containers.iter())
        .flat_map(|c| c.dynamic_resources.iter())
        .flat_map(|d| {
            d.claim_resources.iter().map(|r| ClaimDevice {
                claim_namespace: d.claim_namespace.clone(),
                claim_name: d.claim_name.clone(),
                driver: r.driver_name.clone(),
                pool: r.pool_name.clone(),
                device: r.device_name.clone(),
            })
        })
        .filter(|d| !d.device.is_empty())
        .collect();
    out.sort();
    out.dedup();
    out
}

fn allocations(pods: &[PodResources], ns: &str, name: &str) -> PodAllocations {
    PodAllocations {
        devices: merge_devices(pods, ns, name),
        claim_devices: merge_claim_devices(pods, ns, name),
    }
}

/// Merge the device IDs of the pod `ns`/`name` found in `pods` (every matching entry, every
/// container): resource name → sorted, deduplicated IDs. Resources with no IDs are left out.
pub fn merge_devices(pods: &[PodResources], ns: &str, name: &str) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.namespace == ns && p.name == name) {
        for dev in pod.containers.iter().flat_map(|c| c.devices.iter()) {
            if dev.device_ids.is_empty() {
                continue;
            }
            map.entry(dev.resource_name.clone())
                .or_default()
                .extend(dev.device_ids.iter().cloned());
        }
    }
    for ids in map.values_mut() {
        ids.sort();
        ids.dedup();
    }
    map
}

use crate::grpc_unix::{error_chain, Client};

async fn query(socket: &Path, ns: &str, name: &str) -> Result<PodAllocations, PodResourcesError> {
    let mut client = connect(socket).await?;
    let get = GetPodResourcesRequest {
        pod_name: name.to_string(),
        pod_namespace: ns.to_string(),
    };
    match call::<_, GetPodResourcesResponse>(&mut client, socket, proto::GET_PATH, get).await {
        Ok(resp) => {
            let pods: Vec<PodResources> = resp.pod_resources.into_iter().collect();
            return Ok(allocations(&pods, ns, name));
        }
        Err(status) if get_unusable(&status) => {
            tracing::debug!(
                code = ?status.code(),
                message = status.message(),
                "pod-resources Get unusable, falling back to List"
            );
        }
        Err(status) => return Err(rpc_error(proto::GET_PATH, status)),
    }
    let list: ListPodResourcesResponse = call(
        &mut client,
        socket,
        proto::LIST_PATH,
        ListPodResourcesRequest {},
    )
    .await
    .map_err(|status| rpc_error(proto::LIST_PATH, status))?;
    Ok(allocations(&list.pod_resources, ns, name))
}

/// `Get` errors after which `List` is asked: not implemented (kubelet < 1.27), or a plain kubelet
/// error (`Unknown`: "PodResources API Get method disabled", "pod … not found"), or `NotFound`.
fn get_unusable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unimplemented | Code::Unknown | Code::NotFound
    )
}

fn rpc_error(method: &'static str, status: Status) -> PodResourcesError {
    PodResourcesError::Rpc {
        method,
        code: status.code(),
        message: status.message().to_string(),
    }
}

async fn connect(socket: &Path) -> Result<Client, PodResourcesError> {
    crate::grpc_unix::connect(socket)
        .await
        .map_err(|message| PodResourcesError::Connect {
            socket: socket.to_path_buf(),
            message,
        })
}

async fn call<Req, Resp>(
    client: &mut Client,
    socket: &Path,
    path: &'static str,
    msg: Req,
) -> Result<Resp, Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(format!("{}: {}", socket.display(), error_chain(&e))))?;
    let resp = client
        .unary(
            tonic::Request::new(msg),
            PathAndQuery::from_static(path),
            ProstCodec::<Req, Resp>::default(),
        )
        .await?;
    Ok(resp.into_inner())
}

#[cfg(test)]
#[path = "podresources_tests.rs"]
mod tests;
