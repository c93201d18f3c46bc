//! Validation of the names the CNI environment carries: container IDs, network names and
//! interface names, with libcni's rules.

use crate::error::{code, CniError};

/// libcni's `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, for container IDs and network names (ASCII only,
/// as Go's regexp classes are).
fn is_id(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Validate `CNI_CONTAINERID` (libcni `ValidateContainerID`).
pub fn container_id(id: &str) -> Result<(), CniError> {
    if id.is_empty() {
        return Err(CniError::invalid_env("missing CNI_CONTAINERID", ""));
    }
    if !is_id(id) {
        return Err(CniError::invalid_env(
            "invalid CNI_CONTAINERID",
            format!("{id:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"),
        ));
    }
    Ok(())
}

/// Validate a network name (libcni `ValidateNetworkName`).
pub fn network_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() || !is_id(name) {
        return Err(CniError::invalid_config(
            "invalid network name",
            format!("{name:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"),
        ));
    }
    Ok(())
}

/// Why an interface name is invalid, or `None` if it is valid (libcni `ValidateInterfaceName`).
pub fn interface_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.len() > 15 {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("is '.' or '..'")
    } else if name.contains('/') || name.contains(':') || name.chars().any(char::is_whitespace) {
        Some("contains '/', ':' or whitespace")
    } else {
        None
    }
}

/// Validate `CNI_IFNAME`.
pub fn interface_name(name: &str) -> Result<(), CniError> {
    match interface_name_problem(name) {
        None => Ok(()),
        Some(why) => Err(CniError::new(
            code::INVALID_ENV,
            "invalid CNI_IFNAME",
            format!("interface name {name:?} {why}"),
        )),
    }
}

/// Validate a plugin `type`: a bare file name that cannot escape the plugin directories.
pub fn plugin_type(t: &str) -> Result<(), CniError> {
    if t.is_empty() {
        return Err(CniError::invalid_config(
            "missing plugin type",
            "'type' is empty",
        ));
    }
    if t.contains('/') || t.contains('\\') || t == "." || t == ".." || t.contains('\0') {
        return Err(CniError::invalid_config(
            "invalid plugin type",
            format!("{t:?} must be a bare binary name (no '/', not '.' or '..')"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids() {
        assert!(container_id("abc-1.2_3").is_ok());
        assert_eq!(container_id("").unwrap_err().code, 4);
        assert!(container_id("-abc").is_err());
        assert!(container_id("a/b").is_err());
    }

    #[test]
    fn interface_names() {
        for ok in ["eth0", "net1", "a", "fifteen-chars15"] {
            assert!(interface_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "sixteen-chars-16",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
        ] {
            let e = interface_name(bad).unwrap_err();
            assert_eq!(e.code, 4, "{bad}");
            assert!(e.details.contains("interface name"));
        }
    }

    #[test]
    fn plugin_types_cannot_escape() {
        assert!(plugin_type("bridge").is_ok());
        assert!(plugin_type("host-local").is_ok());
        for bad in ["", "../bridge", "/bin/sh", "a/b", "..", "."] {
            assert_eq!(plugin_type(bad).unwrap_err().code, 7, "{bad}");
        }
    }

    #[test]
    fn network_names() {
        assert!(network_name("macvlan-conf").is_ok());
        assert!(network_name("").is_err());
        assert!(network_name("a b").is_err());
        // The libcni pattern, character by character: ASCII letters and digits first, then
        // also `_`, `.` and `-`; nothing else (no Unicode letters, no `/`, `:` or spaces).
        for ok in ["a", "0", "Z9_.-", "cbr0", "k8s-pod-network"] {
            assert!(is_id(ok), "{ok}");
        }
        for bad in ["", "_a", ".a", "-a", "a/b", "a:b", "é", "aé", "a\n"] {
            assert!(!is_id(bad), "{bad:?}");
        }
    }
}
