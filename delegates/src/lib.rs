//! Running CNI plugins: lookup in the plugin path, exec with the CNI protocol, chaining a
//! network's plugins, the result cache, delegated IPAM, the shared skel, namespaces, logging.

pub mod announce;
pub mod cache;
pub mod chain;
pub mod exec;
pub mod fsutil;
pub mod hostroot;
pub mod ipam;
pub mod lock;
pub mod logging;
pub mod netns;
pub mod skel;
pub mod spawn;
pub mod support;
pub mod timing;

pub use chain::{Attachment, Runtime};
pub use exec::{find_plugin, CniEnv, Verb};
