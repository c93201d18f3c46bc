//! Plexus configuration and protocol types: CNI configs, results, errors, versions, `CNI_ARGS`,
//! and the Kubernetes network annotations, NADs and the plexus config. Pure data: this crate
//! never reads files, the environment or the network.

pub mod args;
pub mod bounds;
pub mod error;
pub mod limits;
pub mod netconf;
pub mod result;
pub mod validate;
pub mod version;

pub use error::CniError;
pub use result::CniResult;
pub mod k8s;
pub mod nad_policy;
pub mod plexus_config;
