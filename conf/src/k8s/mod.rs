//! Kubernetes-side data: network selection annotations, NAD configs, network-status.

pub mod checkpoint;
pub mod devinfo;
pub mod fixed_ips;
pub mod nad;
pub mod network_status;
pub mod pools;
pub mod selection;
