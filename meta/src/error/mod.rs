//! `MetaError`: what failed in plexus, with its cause kept as a typed source (a [`K8sError`],
//! an I/O or JSON error, a delegate's or a `plexus-conf` validation's [`CniError`]…) and the
//! context a user needs (pod, network, interface, container, file).
//!
//! Internal functions return `Result<_, MetaError>`; the error becomes a CNI error result
//! (`code`, `msg`, `details`) only at the edge — the `Plugin` impls (`plugin.rs`, the daemon's
//! `DaemonPlugin`), `plexus explain`'s output and the daemon-mode shim — through
//! `From<MetaError> for CniError`:
//!
//! - `code`: [`MetaError::code`], following the table of docs/design.md ("Error codes"); a
//!   wrapped `CniError` (a delegate's, or one of `plexus-conf`'s validations) keeps its own;
//! - `msg`: the short message, naming the pod, the network and the interface when known;
//! - `details`: the cause — the source chain joined with `": "` (a wrapped `CniError`
//!   contributes its own `details`, its `msg` being part of ours), or, for a failure without
//!   a cause, what to do about it.
//!
//! `Display` prints `msg: details`, exactly as the `CniError` would.
//!
//! The parts, one job each: [`MetaError`] and its variants (`variants`), the CNI code of each
//! (`codes`, docs/design.md's table), its `msg` and `details` (`describe`, also `Display`), the
//! conversion to a [`CniError`] (`cni`), and [`PodResourcesError`] (`pod_resources`).

mod cni;
mod codes;
mod describe;
mod pod_resources;
#[cfg(test)]
mod tests;
mod variants;

pub use crate::k8s::error_chain as chain;
pub use pod_resources::PodResourcesError;
pub use variants::{MetaError, NadRefusal, PoolOverlap};

/// A source error of any type (netlink, I/O, a plain message).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
