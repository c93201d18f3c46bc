//! [`PodResourcesError`]: why the kubelet's pod-resources API gave no answer.

use std::path::PathBuf;

/// Why the pod-resources API gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The socket file does not exist (no kubelet API here; use the checkpoint file).
    #[error("kubelet pod-resources socket {0} does not exist")]
    NoSocket(PathBuf),
    /// The socket exists but nothing accepted the connection or the HTTP/2 handshake.
    #[error("cannot connect to kubelet pod-resources socket {}: {message}", socket.display())]
    Connect {
        /// Socket path.
        socket: PathBuf,
        /// What failed.
        message: String,
    },
    /// The kubelet answered a call with an error status.
    #[error("kubelet pod-resources {method} failed: {code:?}: {message}")]
    Rpc {
        /// gRPC method path.
        method: &'static str,
        /// gRPC status code.
        code: tonic::Code,
        /// Status message.
        message: String,
    },
    /// No complete answer within the bound.
    #[error("kubelet pod-resources API did not answer within {0:?}")]
    Timeout(std::time::Duration),
}

impl PodResourcesError {
    /// True when the API could not be reached at all (no socket, refused, hung, or a transport
    /// status), so another source (the checkpoint file) may be tried; false when the kubelet
    /// answered with an application error.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::NoSocket(_) | Self::Connect { .. } | Self::Timeout(_) => true,
            Self::Rpc { code, .. } => matches!(
                code,
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
        }
    }
}
