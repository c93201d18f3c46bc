//! The plexus meta-plugin: the one CNI entry the kubelet calls. It attaches the pod's default
//! network on `eth0` and the networks its annotations select on `net1`, `net2`…, records
//! `k8s.v1.cni.cncf.io/network-status`, and undoes it all on DEL from a saved plan.
//!
//! Every verb is one pipeline of stages, used by thin mode (a process per CNI call) and daemon
//! mode (`plexus daemon` + the `daemonSocket` shim) alike: [`inputs`] (pod, NADs, devices,
//! from the API, the daemon's watch caches or files) → [`plan`] → [`attach`] (with undo) →
//! [`report`] (network-status, events). [`verbs`] holds ADD, DEL, CHECK/STATUS/GC and
//! `plexus explain` side by side.

pub mod address_guard;
pub mod attach;
pub mod build_info;
pub mod claims_pending;
pub mod cli;
pub mod context;
pub mod daemon;
pub mod devices;
pub mod error;
pub mod grpc_unix;
pub mod host_local_guard;
pub mod inputs;
pub mod k8s;
pub mod nad_guard;
pub mod outcome;
pub mod plan;
pub mod plugin;
pub mod pod;
pub mod pool_guard;
pub mod report;
pub mod routes;
pub mod shim;
pub mod state;
pub mod verbs;
