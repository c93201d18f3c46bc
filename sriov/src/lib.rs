//! plexus-sriov: the `sriov` CNI delegate that attaches an SR-IOV VF to a pod.

pub mod error;
pub mod fake_sysfs;
pub mod netconf;
pub mod nl;
pub mod ns;
pub mod pf;
pub mod pf_fake;
pub mod pf_netlink;
pub mod sysfs;

pub use error::SriovError;
