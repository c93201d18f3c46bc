//! The crate's error type and its mapping to CNI error codes.

use std::path::PathBuf;

/// CNI error codes: the spec's well-known ones plus this plugin's own (>= 100).
pub mod code {
    pub use plexus_conf::error::code::{INTERNAL, INVALID_CONFIG, INVALID_ENV, IO_FAILURE};
    /// Plugin-specific: the VF is held by another container, or already attached here.
    pub const VF_BUSY: u32 = 110;
    /// Plugin-specific: CHECK found a difference.
    pub const CHECK_FAILED: u32 = 111;
    /// Plugin-specific: a netlink or PF operation failed.
    pub const OPERATION_FAILED: u32 = 112;
}

/// Everything that can go wrong in the SR-IOV plugin.
#[derive(Debug, thiserror::Error)]
pub enum SriovError {
    /// The network configuration (stdin) is invalid.
    #[error("invalid sriov config: {0}")]
    Config(String),
    /// CNI_ARGS could not be parsed.
    #[error("invalid CNI_ARGS: {0}")]
    Args(String),
    /// The sysfs lookup of the VF failed.
    #[error(transparent)]
    Sysfs(#[from] crate::sysfs::SysfsError),
    /// A PF-side VF configuration call failed.
    #[error(transparent)]
    Pf(#[from] crate::pf::PfError),
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] crate::nl::NlError),
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done ("read state file", ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The VF is attached to another live container.
    #[error("VF {vf} is already attached to container {owner} (ifname {ifname}, netns {netns})")]
    Busy {
        /// PCI address of the VF.
        vf: String,
        /// Owning container id.
        owner: String,
        /// Interface name in the owner.
        ifname: String,
        /// Netns path of the owner.
        netns: String,
    },
    /// This container already has this interface attached.
    #[error(
        "interface {ifname} already exists in container {container}: VF {vf} is already attached"
    )]
    AlreadyAttached {
        /// PCI address of the VF.
        vf: String,
        /// Container id.
        container: String,
        /// Interface name.
        ifname: String,
    },
    /// A step of ADD failed; everything applied before was rolled back.
    #[error("VF {vf}: {step}: {source}{}", rollback_suffix(.rollback))]
    Step {
        /// PCI address of the VF.
        vf: String,
        /// The step that failed.
        step: String,
        /// The cause.
        #[source]
        source: Box<SriovError>,
        /// Errors of undo actions that failed in turn.
        rollback: Vec<String>,
    },
    /// An error from the delegated IPAM plugin, already in CNI form.
    #[error("IPAM: {0}")]
    Ipam(plexus_conf::error::CniError),
    /// CHECK found a mismatch.
    #[error("check failed: {0}")]
    Check(String),
    /// Several errors (DEL runs to the end and reports all of them).
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Multi(Vec<SriovError>),
    /// Anything else that carries just a message (e.g. a namespace that cannot be entered).
    #[error("{0}")]
    Other(String),
}

fn rollback_suffix(rollback: &[String]) -> String {
    if rollback.is_empty() {
        String::new()
    } else {
        format!(" (rollback also failed: {})", rollback.join("; "))
    }
}

impl SriovError {
    /// Wraps `self` as the failure of `step` on VF `vf`.
    pub fn at_step(self, vf: &str, step: impl Into<String>) -> SriovError {
        SriovError::Step {
            vf: vf.to_string(),
            step: step.into(),
            source: Box::new(self),
            rollback: Vec::new(),
        }
    }

    /// Builds an [`SriovError::Io`].
    pub fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SriovError::Io {
            what,
            path: path.into(),
            source,
        }
    }

    /// The CNI error code for this error.
    pub fn cni_code(&self) -> u32 {
        match self {
            SriovError::Config(_) | SriovError::Sysfs(_) => code::INVALID_CONFIG,
            SriovError::Args(_) => code::INVALID_ENV,
            SriovError::Io { .. } => code::IO_FAILURE,
            SriovError::Busy { .. } => code::VF_BUSY,
            SriovError::AlreadyAttached { .. } => code::VF_BUSY,
            SriovError::Step { source, .. } => source.cni_code(),
            SriovError::Ipam(e) => e.code,
            SriovError::Check(_) => code::CHECK_FAILED,
            SriovError::Multi(v) => v.first().map_or(code::OPERATION_FAILED, |e| e.cni_code()),
            SriovError::Pf(_) | SriovError::Netlink(_) | SriovError::Other(_) => {
                code::OPERATION_FAILED
            }
        }
    }

    /// A short message for the CNI error `msg` field (the full chain goes into `details`).
    pub fn cni_msg(&self) -> String {
        match self {
            SriovError::Config(_) => "invalid sriov config".into(),
            SriovError::Args(_) => "invalid CNI_ARGS".into(),
            SriovError::Busy { .. } | SriovError::AlreadyAttached { .. } => {
                "VF already attached".into()
            }
            SriovError::Step { vf, step, .. } => format!("VF {vf}: {step} failed"),
            SriovError::Check(_) => "check failed".into(),
            _ => "sriov failed".into(),
        }
    }
}

impl From<SriovError> for plexus_conf::error::CniError {
    fn from(e: SriovError) -> Self {
        if let SriovError::Ipam(inner) = &e {
            return inner.clone().context("sriov");
        }
        plexus_conf::error::CniError::new(e.cni_code(), e.cni_msg(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_conf::error::CniError;

    #[test]
    fn cni_error_carries_code_short_msg_and_full_chain() {
        let inner = SriovError::Config("vlan 5000 invalid".into());
        let e: CniError = inner.into();
        assert_eq!((e.code, e.msg.as_str()), (7, "invalid sriov config"));
        let step = SriovError::Other("EOPNOTSUPP".into()).at_step("0000:af:06.0", "set VF trust");
        let step = match step {
            SriovError::Step {
                vf, step, source, ..
            } => SriovError::Step {
                vf,
                step,
                source,
                rollback: vec!["undo Pf(Vlan): boom".into()],
            },
            other => other,
        };
        let e: CniError = step.into();
        assert_eq!(e.code, code::OPERATION_FAILED);
        assert_eq!(e.msg, "VF 0000:af:06.0: set VF trust failed");
        assert_eq!(
            e.details,
            "VF 0000:af:06.0: set VF trust: EOPNOTSUPP (rollback also failed: undo Pf(Vlan): boom)"
        );
        let busy = SriovError::Busy {
            vf: "v".into(),
            owner: "c".into(),
            ifname: "net1".into(),
            netns: "/n".into(),
        };
        assert_eq!(CniError::from(busy).code, code::VF_BUSY);
        let ipam = SriovError::Ipam(CniError::new(7, "bad subnet", ""));
        let e = CniError::from(ipam);
        assert_eq!((e.code, e.msg.as_str()), (7, "sriov: bad subnet"));
    }
}
