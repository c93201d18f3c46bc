//! A gRPC client over a node-local Unix socket (the kubelet's pod-resources API, the runtime's
//! CRI): connected and ready, its errors as one line with their causes.

use std::path::Path;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

/// The largest answer decoded (a node's pod-resources or sandbox list).
pub const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// A client on one socket.
pub type Client = tonic::client::Grpc<Channel>;

/// Connect to `socket` and wait until the client is ready; the error is [`error_chain`]'s text.
pub async fn connect(socket: &Path) -> Result<Client, String> {
    let path = socket.to_path_buf();
    // The authority is never used: every connection goes to the Unix socket.
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| error_chain(&e))?;
    let mut client = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE_SIZE);
    client.ready().await.map_err(|e| error_chain(&e))?;
    Ok(client)
}

/// An error and its sources, `: `-separated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
