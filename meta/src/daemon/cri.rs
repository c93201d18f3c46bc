//! The container runtime's CRI (`runtime.v1.RuntimeService/ListPodSandbox`) over its Unix
//! socket: which pod sandboxes the runtime knows, for the node reconciler
//! ([`super::reconcile`]). The gRPC client is tonic's, as in [`crate::devices::podresources`]
//! (already in the thin binary for the kubelet's pod-resources API); the two messages are
//! hand-derived with prost, so no crate and no code generation is added.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::PathAndQuery;
use tonic_prost::ProstCodec;

/// The runtimes' default CRI sockets, in the order auto-detection looks for them.
pub const KNOWN_SOCKETS: [&str; 2] = ["/run/containerd/containerd.sock", "/var/run/crio/crio.sock"];

/// `runtimeEndpoint` value that turns the reconciler off.
pub const OFF: &str = "none";

/// gRPC path of `RuntimeService.ListPodSandbox`.
pub const LIST_PATH: &str = "/runtime.v1.RuntimeService/ListPodSandbox";

/// The messages of `k8s.io/cri-api/pkg/apis/runtime/v1/api.proto` plexus reads (unknown fields
/// are skipped on decode).
pub mod proto {
    /// `ListPodSandboxRequest{ PodSandboxFilter filter = 1 }`, sent without a filter: every
    /// sandbox, ready or not.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxRequest {}

    /// `ListPodSandboxResponse{ repeated PodSandbox items = 1 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxResponse {
        /// The sandboxes.
        #[prost(message, repeated, tag = "1")]
        pub items: Vec<PodSandbox>,
    }

    /// `PodSandbox{ string id = 1; PodSandboxMetadata metadata = 2; PodSandboxState state = 3; … }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandbox {
        /// Sandbox ID: the CNI container ID.
        #[prost(string, tag = "1")]
        pub id: String,
        /// `SANDBOX_READY` (0) or `SANDBOX_NOTREADY` (1).
        #[prost(int32, tag = "3")]
        pub state: i32,
    }
}

/// Why the runtime's sandbox list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// `runtimeEndpoint` is empty and no known runtime socket exists, or both do.
    #[error("no runtime endpoint: {0}")]
    NoEndpoint(String),
    /// Connecting or the HTTP/2 handshake failed.
    #[error("cannot connect to the runtime's CRI socket {}: {message}", socket.display())]
    Connect {
        /// Socket path.
        socket: PathBuf,
        /// What failed.
        message: String,
    },
    /// The runtime answered with an error status.
    #[error("CRI ListPodSandbox on {} failed: {code:?}: {message}", socket.display())]
    Rpc {
        /// Socket path.
        socket: PathBuf,
        /// gRPC status code.
        code: tonic::Code,
        /// Status message.
        message: String,
    },
    /// No answer within the bound.
    #[error("CRI ListPodSandbox on {} did not answer within {timeout:?}", socket.display())]
    Timeout {
        /// Socket path.
        socket: PathBuf,
        /// The bound.
        timeout: Duration,
    },
}

/// The runtime's socket from a `runtimeEndpoint` value: a path, or `unix://PATH` as the
/// kubelet's `--container-runtime-endpoint` spells it; empty auto-detects (`host_root`
/// prefixed for the look-up only: the daemon sees the host's files there): the one of
/// [`KNOWN_SOCKETS`] that exists. `Ok(None)`: the reconciler is off ([`OFF`]).
pub fn endpoint(configured: &str, host_root: Option<&Path>) -> Result<Option<PathBuf>, CriError> {
    let configured = configured.trim();
    if configured == OFF {
        return Ok(None);
    }
    if !configured.is_empty() {
        let path = configured.strip_prefix("unix://").unwrap_or(configured);
        return Ok(Some(PathBuf::from(path)));
    }
    let under_root = |p: &str| match host_root {
        Some(r) => r.join(p.trim_start_matches('/')),
        None => PathBuf::from(p),
    };
    let found: Vec<PathBuf> = KNOWN_SOCKETS
        .iter()
        .map(|p| under_root(p))
        .filter(|p| p.exists())
        .collect();
    match found.as_slice() {
        [one] => Ok(Some(one.clone())),
        [] => Err(CriError::NoEndpoint(format!(
            "none of {} exists; set runtimeEndpoint",
            KNOWN_SOCKETS.join(", ")
        ))),
        _ => Err(CriError::NoEndpoint(format!(
            "both {} exist; set runtimeEndpoint to the one the kubelet uses",
            KNOWN_SOCKETS.join(" and ")
        ))),
    }
}

/// The IDs of every pod sandbox the runtime on `socket` knows (ready or not), within `timeout`.
pub async fn sandbox_ids(socket: &Path, timeout: Duration) -> Result<BTreeSet<String>, CriError> {
    match tokio::time::timeout(timeout, list(socket)).await {
        Ok(r) => r,
        Err(_) => Err(CriError::Timeout {
            socket: socket.to_path_buf(),
            timeout,
        }),
    }
}

async fn list(socket: &Path) -> Result<BTreeSet<String>, CriError> {
    let connect_error = |message: String| CriError::Connect {
        socket: socket.to_path_buf(),
        message,
    };
    let mut client = crate::grpc_unix::connect(socket)
        .await
        .map_err(connect_error)?;
    let resp = client
        .unary(
            tonic::Request::new(proto::ListPodSandboxRequest {}),
            PathAndQuery::from_static(LIST_PATH),
            ProstCodec::<proto::ListPodSandboxRequest, proto::ListPodSandboxResponse>::default(),
        )
        .await
        .map_err(|s| CriError::Rpc {
            socket: socket.to_path_buf(),
            code: s.code(),
            message: s.message().to_string(),
        })?;
    Ok(resp.into_inner().items.into_iter().map(|s| s.id).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_is_a_path_a_unix_url_off_or_the_one_known_socket() {
        assert_eq!(
            endpoint("unix:///x/c.sock", None).unwrap(),
            Some(PathBuf::from("/x/c.sock"))
        );
        assert_eq!(
            endpoint("/x/c.sock", None).unwrap(),
            Some(PathBuf::from("/x/c.sock"))
        );
        assert_eq!(endpoint("none", None).unwrap(), None);
        let root = tempfile::tempdir().unwrap();
        let e = endpoint("", Some(root.path())).unwrap_err().to_string();
        assert!(
            e.contains("none of") && e.contains("runtimeEndpoint"),
            "{e}"
        );
        let c = root.path().join("run/containerd/containerd.sock");
        std::fs::create_dir_all(c.parent().unwrap()).unwrap();
        std::fs::write(&c, b"").unwrap();
        assert_eq!(endpoint("", Some(root.path())).unwrap(), Some(c));
        let o = root.path().join("var/run/crio/crio.sock");
        std::fs::create_dir_all(o.parent().unwrap()).unwrap();
        std::fs::write(&o, b"").unwrap();
        let e = endpoint("", Some(root.path())).unwrap_err().to_string();
        assert!(e.contains("both"), "{e}");
    }

    #[test]
    fn a_socket_nobody_listens_on_is_an_error_not_an_empty_list() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt
            .block_on(sandbox_ids(
                &dir.path().join("absent.sock"),
                Duration::from_secs(2),
            ))
            .unwrap_err();
        assert!(matches!(e, CriError::Connect { .. }), "{e}");
    }
}
