//! The plexus meta-plugin: the one CNI entry the kubelet calls. It attaches the pod's default
//! network on `eth0` and the networks its annotations select on `net1`, `net2`…, records
//! `k8s.v1.cni.cncf.io/network-status`, and undoes it all on DEL from a saved plan.

pub mod add;
pub mod attach;
pub mod context;
pub mod del;
pub mod devices;
pub mod explain;
pub mod k8s;
pub mod plan;
pub mod planner;
pub mod plugin;
pub mod pod;
pub mod resolve;
pub mod routes;
pub mod state;
pub mod verbs;
