//! Input size caps. Every input plexus and sriov read from outside has an upper bound, checked
//! before it is parsed (or, for streams, while it is read), and going over it is a CNI error that
//! names the input, the limit and the actual size. `docs/limits.md` lists them all.

use crate::error::{code, CniError};

/// A network configuration on stdin (plexus' and sriov's): 1 MiB. The biggest real configs
/// (a Multus-style config with inline delegates) are a few KiB.
pub const MAX_STDIN_CONFIG_BYTES: usize = 1 << 20;

/// A configuration file read from disk (`clusterNetwork`, `defaultNetworks` or a file of
/// `confDir`): 1 MiB, as stdin.
pub const MAX_CONFIG_FILE_BYTES: usize = 1 << 20;

/// A NetworkAttachmentDefinition's `spec.config`: 1 MiB (a whole Kubernetes object is at most
/// about 1.5 MiB in etcd).
pub const MAX_NAD_CONFIG_BYTES: usize = 1 << 20;

/// The value of a networks annotation (`k8s.v1.cni.cncf.io/networks`,
/// `v1.multus-cni.io/default-network`): 256 KiB, the limit Kubernetes puts on all annotations
/// of an object together.
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// Network selection elements in one annotation: 64 (interfaces `net1` … `net64`).
pub const MAX_NETWORKS: usize = 64;

/// `CNI_ARGS`: 64 KiB (the kubelet's are under 1 KiB; Linux caps one environment string at
/// 128 KiB).
pub const MAX_CNI_ARGS_BYTES: usize = 64 * 1024;

/// A delegate plugin's stdout (its result or error): 1 MiB. A plugin printing more is killed
/// and its call fails.
pub const MAX_DELEGATE_STDOUT_BYTES: usize = 1 << 20;

/// A delegate plugin's stderr kept for the log: 64 KiB; the rest is read and dropped.
pub const MAX_DELEGATE_STDERR_BYTES: usize = 64 * 1024;

/// A state file read back (saved plan, result cache entry, DEL tombstone, sriov VF state and
/// allocation): 4 MiB. Plexus writes them at a few KiB.
pub const MAX_STATE_FILE_BYTES: usize = 4 << 20;

/// The error for an input over its cap: `code`, "`what` is too large", and details naming the
/// actual size and the limit.
pub fn too_large(what: &str, actual: usize, limit: usize, code: u32) -> CniError {
    CniError::new(
        code,
        format!("{what} is too large"),
        format!("{actual} bytes, the limit is {limit} bytes"),
    )
}

/// `Ok` when `actual <= limit`, otherwise [`too_large`].
pub fn check(what: &str, actual: usize, limit: usize, code: u32) -> Result<(), CniError> {
    if actual <= limit {
        Ok(())
    } else {
        Err(too_large(what, actual, limit, code))
    }
}

/// [`check`] for the network configuration on stdin (code 6, like undecodable stdin).
pub fn check_stdin(actual: usize) -> Result<(), CniError> {
    check(
        "network configuration on stdin",
        actual,
        MAX_STDIN_CONFIG_BYTES,
        code::DECODE_FAILURE,
    )
}

/// [`check`] for `CNI_ARGS` (code 4, like other `CNI_ARGS` errors).
pub fn check_cni_args(actual: usize) -> Result<(), CniError> {
    check("CNI_ARGS", actual, MAX_CNI_ARGS_BYTES, code::INVALID_ENV)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_input_the_size_and_the_limit() {
        assert!(check("x", 10, 10, 7).is_ok());
        let e = check("the thing", 11, 10, 7).unwrap_err();
        assert_eq!(e.code, 7);
        assert_eq!(e.msg, "the thing is too large");
        assert_eq!(e.details, "11 bytes, the limit is 10 bytes");
    }

    #[test]
    fn stdin_and_cni_args_caps() {
        assert!(check_stdin(MAX_STDIN_CONFIG_BYTES).is_ok());
        let e = check_stdin(MAX_STDIN_CONFIG_BYTES + 1).unwrap_err();
        assert_eq!(e.code, code::DECODE_FAILURE);
        assert!(e.details.contains(&MAX_STDIN_CONFIG_BYTES.to_string()));
        assert!(check_cni_args(MAX_CNI_ARGS_BYTES).is_ok());
        let e = check_cni_args(MAX_CNI_ARGS_BYTES + 5).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(e.msg.contains("CNI_ARGS"));
        assert!(e
            .details
            .starts_with(&format!("{} bytes", MAX_CNI_ARGS_BYTES + 5)));
    }
}
