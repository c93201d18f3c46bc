//! A stand-in container runtime for `plexus state`'s cross-check: CRI
//! `runtime.v1.RuntimeService/ListPodSandbox` over a Unix socket (real gRPC over HTTP/2, tonic,
//! with the prost messages plexus decodes), answering a fixed list of sandbox IDs, on its own
//! thread; stopped and its socket removed on drop.

use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use plexus_meta::daemon::cri::proto::{ListPodSandboxRequest, ListPodSandboxResponse, PodSandbox};
use plexus_meta::daemon::cri::LIST_PATH;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::body::Body;
use tonic_prost::ProstCodec;

#[derive(Clone)]
struct Runtime {
    ids: Vec<String>,
}

impl tonic::server::NamedService for Runtime {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}

impl tower::Service<http::Request<Body>> for Runtime {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let ids = self.ids.clone();
        Box::pin(async move {
            if req.uri().path() != LIST_PATH {
                return Ok(tonic::Status::unimplemented(req.uri().path().to_string()).into_http());
            }
            let handler = tower::service_fn(move |_: tonic::Request<ListPodSandboxRequest>| {
                let items = ids
                    .iter()
                    .map(|id| PodSandbox {
                        id: id.clone(),
                        state: 0,
                    })
                    .collect();
                async move {
                    Ok::<_, tonic::Status>(tonic::Response::new(ListPodSandboxResponse { items }))
                }
            });
            let codec = ProstCodec::<ListPodSandboxResponse, ListPodSandboxRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(handler, req).await)
        })
    }
}

/// A running stand-in runtime.
pub struct FakeCri {
    socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeCri {
    /// Serve `ids` on `socket`; accepting connections when this returns.
    pub fn start(socket: &Path, ids: &[&str]) -> FakeCri {
        let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind CRI socket");
        listener.set_nonblocking(true).unwrap();
        let service = Runtime {
            ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::from_std(listener).unwrap();
                let server = tonic::transport::Server::builder()
                    .serve_with_incoming(service, UnixListenerStream::new(listener));
                tokio::spawn(server);
                let _ = rx.await;
            });
        });
        FakeCri {
            socket: socket.to_path_buf(),
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for FakeCri {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
