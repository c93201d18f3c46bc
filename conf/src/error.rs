//! The CNI error result (`code`, `msg`, `details`) and the well-known error codes.

use serde::{Deserialize, Serialize};

/// Well-known CNI error codes (spec section "Error"), plus the Go library's extras.
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in network configuration.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODE_FAILURE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later (transient).
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// Plugin not available (STATUS).
    pub const NOT_AVAILABLE: u32 = 50;
    /// Plugin not available and existing containers may have limited connectivity (STATUS).
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// First code free for plugin-specific errors.
    pub const PLUGIN_BASE: u32 = 100;
    /// Plexus: a delegate plugin failed (its own error is in `details`).
    pub const DELEGATE_FAILED: u32 = 100;
    /// Plexus: a delegate plugin did not answer in time.
    pub const DELEGATE_TIMEOUT: u32 = 101;
    /// Plexus: the Kubernetes API refused or failed a request that is not transient.
    pub const KUBERNETES: u32 = 102;
    /// Internal error (the Go library's `ErrInternal`, used by every Go plugin for runtime failures).
    pub const INTERNAL: u32 = 999;
}

/// A CNI error result, serialized exactly as the spec shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
pub struct CniError {
    /// Version of the error format; set when printed.
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub cni_version: String,
    /// Error code (see [`code`]).
    pub code: u32,
    /// Short message.
    #[serde(default)]
    pub msg: String,
    /// Longer details (cause, context).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    /// A new error with a code, a message and details.
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        CniError {
            cni_version: String::new(),
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// Code 7: invalid network configuration.
    pub fn invalid_config(msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self::new(code::INVALID_CONFIG, msg, details)
    }

    /// Code 6: failed to decode content.
    pub fn decode(msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self::new(code::DECODE_FAILURE, msg, details)
    }

    /// Code 4: invalid environment variables.
    pub fn invalid_env(msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self::new(code::INVALID_ENV, msg, details)
    }

    /// Code 999: internal error.
    pub fn internal(msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self::new(code::INTERNAL, msg, details)
    }

    /// Prefix the message with context (e.g. `pod ns/name, network ns/nad`).
    pub fn context(mut self, ctx: impl AsRef<str>) -> Self {
        self.msg = format!("{}: {}", ctx.as_ref(), self.msg);
        self
    }

    /// Set the version the error is printed in.
    pub fn with_version(mut self, version: &str) -> Self {
        self.cni_version = version.to_string();
        self
    }

    /// Parse an error object printed by a plugin; tolerant of a missing `cniVersion` or `msg`.
    pub fn parse(value: &serde_json::Value) -> Option<Self> {
        let obj = value.as_object()?;
        let code = obj.get("code")?.as_u64()?;
        let text = |k: &str| {
            obj.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        Some(CniError {
            cni_version: text("cniVersion"),
            code: u32::try_from(code).unwrap_or(code::INTERNAL),
            msg: text("msg"),
            details: text("details"),
        })
    }

    /// The JSON bytes printed on stdout.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self)
            .unwrap_or_else(|_| format!(r#"{{"code":{},"msg":"unprintable error"}}"#, self.code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_like_the_spec_example() {
        let e = CniError::new(7, "Invalid Configuration", "some details").with_version("1.1.0");
        assert_eq!(
            e.to_json(),
            r#"{"cniVersion":"1.1.0","code":7,"msg":"Invalid Configuration","details":"some details"}"#
        );
    }

    #[test]
    fn omits_empty_version_and_details() {
        assert_eq!(
            CniError::new(11, "later", "").to_json(),
            r#"{"code":11,"msg":"later"}"#
        );
    }

    #[test]
    fn parses_debian_plugin_errors_without_version() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"code":4,"msg":"required env variables [CNI_NETNS] missing"}"#,
        )
        .unwrap();
        let e = CniError::parse(&v).unwrap();
        assert_eq!(e.code, 4);
        assert_eq!(e.msg, "required env variables [CNI_NETNS] missing");
        assert!(e.cni_version.is_empty());
        assert!(CniError::parse(&serde_json::json!({"msg": "no code"})).is_none());
    }

    #[test]
    fn plugin_codes_and_context() {
        let e = CniError::new(code::DELEGATE_FAILED, "boom", "x").context("pod a/b");
        assert_eq!(e.msg, "pod a/b: boom");
        assert_eq!(e.to_string(), "pod a/b: boom: x");
        assert!(e.code >= code::PLUGIN_BASE);
    }
}
