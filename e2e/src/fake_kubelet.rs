//! A fake kubelet pod-resources gRPC server (v1 `PodResourcesLister`: `List`, and `Get` when
//! asked) on a Unix socket, on its own thread and runtime, with per-method request counters.
//! It speaks real gRPC over HTTP/2 (tonic) with the same prost messages plexus decodes.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use plexus_meta::devices::podresources::proto::{
    self, ContainerDevices, ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse,
    ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::body::Body;
use tonic::Status;
use tonic_prost::ProstCodec;

/// One pod the fake kubelet knows.
#[derive(Clone, Debug, Default)]
pub struct FakePod {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// `(container name, resource name, device IDs)`; several rows per container are allowed.
    pub containers: Vec<(String, String, Vec<String>)>,
    /// DRA devices: `(claim namespace, claim name, driver, pool, device)`, reported on the
    /// first container.
    pub claim_devices: Vec<[String; 5]>,
}

impl FakePod {
    /// A pod with no containers yet.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            containers: Vec::new(),
            claim_devices: Vec::new(),
        }
    }

    /// Add a DRA device prepared for claim `ns/claim`.
    pub fn with_claim_device(
        mut self,
        ns: &str,
        claim: &str,
        driver: &str,
        pool: &str,
        device: &str,
    ) -> Self {
        self.claim_devices
            .push([ns, claim, driver, pool, device].map(str::to_string));
        self
    }

    /// Add devices of `resource` to `container`.
    pub fn with_devices(mut self, container: &str, resource: &str, ids: &[&str]) -> Self {
        self.containers.push((
            container.to_string(),
            resource.to_string(),
            ids.iter().map(|s| s.to_string()).collect(),
        ));
        self
    }

    fn to_proto(&self) -> PodResources {
        let mut containers: Vec<ContainerResources> = Vec::new();
        for (cname, resource, ids) in &self.containers {
            let devices = ContainerDevices {
                resource_name: resource.clone(),
                device_ids: ids.clone(),
                topology: None,
            };
            match containers.iter_mut().find(|c| &c.name == cname) {
                Some(c) => c.devices.push(devices),
                None => containers.push(ContainerResources {
                    name: cname.clone(),
                    devices: vec![devices],
                    cpu_ids: Vec::new(),
                    dynamic_resources: Vec::new(),
                }),
            }
        }
        if !self.claim_devices.is_empty() {
            if containers.is_empty() {
                containers.push(ContainerResources {
                    name: "c".into(),
                    ..Default::default()
                });
            }
            for [ns, claim, driver, pool, device] in &self.claim_devices {
                containers[0]
                    .dynamic_resources
                    .push(proto::DynamicResource {
                        claim_name: claim.clone(),
                        claim_namespace: ns.clone(),
                        claim_resources: vec![proto::ClaimResource {
                            driver_name: driver.clone(),
                            pool_name: pool.clone(),
                            device_name: device.clone(),
                        }],
                    });
            }
        }
        PodResources {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            containers,
        }
    }
}

/// How the fake kubelet behaves.
#[derive(Clone, Debug, Default)]
pub struct FakeKubeletOptions {
    /// Serve `Get` (kubelet ≥ 1.34 by default). When false, `Get` fails like an older kubelet.
    pub implement_get: bool,
    /// With `implement_get` false: fail `Get` as a kubelet with the `KubeletPodResourcesGet`
    /// gate off does (`Unknown`, "PodResources API Get method disabled") instead of as a
    /// kubelet without the method (`Unimplemented`).
    pub get_gate_off: bool,
    /// Hold every answer this long (a hung kubelet).
    pub response_delay: Option<Duration>,
}

#[derive(Default)]
struct Counters {
    requests: AtomicUsize,
    list: AtomicUsize,
    get: AtomicUsize,
}

struct State {
    pods: Vec<PodResources>,
    options: FakeKubeletOptions,
    counters: Counters,
}

impl State {
    async fn list(&self) -> Result<ListPodResourcesResponse, Status> {
        self.hold().await;
        Ok(ListPodResourcesResponse {
            pod_resources: self.pods.clone(),
        })
    }

    async fn get(&self, req: GetPodResourcesRequest) -> Result<GetPodResourcesResponse, Status> {
        self.hold().await;
        if !self.options.implement_get {
            return Err(if self.options.get_gate_off {
                Status::unknown("PodResources API Get method disabled")
            } else {
                Status::unimplemented("unknown method Get for service v1.PodResourcesLister")
            });
        }
        let pod = self
            .pods
            .iter()
            .find(|p| p.name == req.pod_name && p.namespace == req.pod_namespace)
            .ok_or_else(|| {
                // The kubelet's wording; a plain Go error reaches the client as Unknown.
                Status::unknown(format!(
                    "pod {} in namespace {} not found",
                    req.pod_name, req.pod_namespace
                ))
            })?;
        Ok(GetPodResourcesResponse {
            pod_resources: Some(pod.clone()),
        })
    }

    async fn hold(&self) {
        if let Some(delay) = self.options.response_delay {
            tokio::time::sleep(delay).await;
        }
    }
}

/// The hand-written `v1.PodResourcesLister` service: dispatches on the gRPC path.
#[derive(Clone)]
struct Lister {
    state: Arc<State>,
}

impl tonic::server::NamedService for Lister {
    const NAME: &'static str = proto::SERVICE_NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<Body>> for Lister {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let state = self.state.clone();
        Box::pin(async move {
            state.counters.requests.fetch_add(1, Ordering::SeqCst);
            let path = req.uri().path().to_string();
            let resp = match path.as_str() {
                proto::LIST_PATH => {
                    state.counters.list.fetch_add(1, Ordering::SeqCst);
                    let handler =
                        tower::service_fn(move |_: tonic::Request<ListPodResourcesRequest>| {
                            let state = state.clone();
                            async move { state.list().await.map(tonic::Response::new) }
                        });
                    let codec =
                        ProstCodec::<ListPodResourcesResponse, ListPodResourcesRequest>::default();
                    tonic::server::Grpc::new(codec).unary(handler, req).await
                }
                proto::GET_PATH => {
                    state.counters.get.fetch_add(1, Ordering::SeqCst);
                    let handler =
                        tower::service_fn(move |r: tonic::Request<GetPodResourcesRequest>| {
                            let state = state.clone();
                            async move { state.get(r.into_inner()).await.map(tonic::Response::new) }
                        });
                    let codec =
                        ProstCodec::<GetPodResourcesResponse, GetPodResourcesRequest>::default();
                    tonic::server::Grpc::new(codec).unary(handler, req).await
                }
                other => Status::unimplemented(format!("unknown method {other}")).into_http(),
            };
            Ok(resp)
        })
    }
}

/// A running fake kubelet. Stops (and removes its socket) on [`FakeKubelet::stop`] or drop.
pub struct FakeKubelet {
    socket: PathBuf,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeKubelet {
    /// Serve `pods` on `socket_path` (a stale socket file there is replaced). The socket accepts
    /// connections when this returns.
    pub fn start(
        socket_path: &Path,
        pods: Vec<FakePod>,
        options: FakeKubeletOptions,
    ) -> io::Result<FakeKubelet> {
        match std::fs::remove_file(socket_path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = std::os::unix::net::UnixListener::bind(socket_path)?;
        listener.set_nonblocking(true)?;
        let state = Arc::new(State {
            pods: pods.iter().map(FakePod::to_proto).collect(),
            options,
            counters: Counters::default(),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let service = Lister {
            state: state.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("fake-kubelet".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::UnixListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!("fake kubelet: cannot use the listener: {e}");
                            return;
                        }
                    };
                    let server = tonic::transport::Server::builder()
                        .serve_with_incoming(service, UnixListenerStream::new(listener));
                    tokio::spawn(async move {
                        if let Err(e) = server.await {
                            tracing::error!("fake kubelet: server stopped: {e}");
                        }
                    });
                    let _ = stop_rx.await;
                });
                // Dropping the runtime here aborts the server and every open connection.
            })?;
        Ok(FakeKubelet {
            socket: socket_path.to_path_buf(),
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Requests received, all methods (including unknown ones).
    pub fn requests(&self) -> usize {
        self.state.counters.requests.load(Ordering::SeqCst)
    }

    /// `List` calls received.
    pub fn list_calls(&self) -> usize {
        self.state.counters.list.load(Ordering::SeqCst)
    }

    /// `Get` calls received (answered or refused).
    pub fn get_calls(&self) -> usize {
        self.state.counters.get.load(Ordering::SeqCst)
    }

    /// Stop serving, close every connection and remove the socket file.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_meta::devices::podresources::{pod_devices, PodResourcesError};
    use std::collections::BTreeMap;
    use std::time::Instant;

    const VF: &str = "intel.com/sriov_netdevice";
    const T: Duration = Duration::from_secs(5);

    fn pods() -> Vec<FakePod> {
        vec![
            FakePod::new("other", "web").with_devices("c", VF, &["0000:99:00.1"]),
            FakePod::new("prod", "web")
                .with_devices("app", VF, &["0000:04:00.5", "0000:04:00.2"])
                .with_devices("app", "nvidia.com/gpu", &["GPU-b", "GPU-a"])
                .with_devices("sidecar", VF, &["0000:04:00.3", "0000:04:00.2"]),
            FakePod::new("prod", "plain"),
        ]
    }

    fn expected_web() -> BTreeMap<String, Vec<String>> {
        let v = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        BTreeMap::from([
            (
                VF.to_string(),
                v(&["0000:04:00.2", "0000:04:00.3", "0000:04:00.5"]),
            ),
            ("nvidia.com/gpu".to_string(), v(&["GPU-a", "GPU-b"])),
        ])
    }

    fn start(dir: &tempfile::TempDir, options: FakeKubeletOptions) -> FakeKubelet {
        FakeKubelet::start(&dir.path().join("kubelet.sock"), pods(), options).unwrap()
    }

    fn get_on() -> FakeKubeletOptions {
        FakeKubeletOptions {
            implement_get: true,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn get_path_merges_containers_sorted_without_list() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = start(&dir, get_on());
        let map = pod_devices(kubelet.socket(), "prod", "web", T)
            .await
            .unwrap();
        assert_eq!(map, expected_web());
        assert_eq!((kubelet.get_calls(), kubelet.list_calls()), (1, 0));
    }

    #[tokio::test]
    async fn list_path_when_get_is_unimplemented() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = start(&dir, FakeKubeletOptions::default());
        let map = pod_devices(kubelet.socket(), "prod", "web", T)
            .await
            .unwrap();
        assert_eq!(map, expected_web());
        assert_eq!((kubelet.get_calls(), kubelet.list_calls()), (1, 1));
        assert_eq!(kubelet.requests(), 2);
    }

    #[tokio::test]
    async fn list_path_when_the_get_gate_is_off() {
        let dir = tempfile::tempdir().unwrap();
        let options = FakeKubeletOptions {
            get_gate_off: true,
            ..Default::default()
        };
        let kubelet = start(&dir, options);
        let map = pod_devices(kubelet.socket(), "prod", "web", T)
            .await
            .unwrap();
        assert_eq!(map, expected_web());
        assert_eq!((kubelet.get_calls(), kubelet.list_calls()), (1, 1));
    }

    #[tokio::test]
    async fn absent_pod_and_pod_without_devices_give_an_empty_map() {
        let dir = tempfile::tempdir().unwrap();
        for options in [get_on(), FakeKubeletOptions::default()] {
            let kubelet = start(&dir, options);
            for name in ["absent", "plain"] {
                let map = pod_devices(kubelet.socket(), "prod", name, T)
                    .await
                    .unwrap();
                assert!(map.is_empty(), "{name}: {map:?}");
            }
            // Same name, other namespace: only that pod's device.
            let map = pod_devices(kubelet.socket(), "other", "web", T)
                .await
                .unwrap();
            assert_eq!(map.get(VF).map(Vec::len), Some(1));
        }
    }

    #[tokio::test]
    async fn hung_kubelet_times_out_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let options = FakeKubeletOptions {
            implement_get: true,
            response_delay: Some(Duration::from_secs(30)),
            ..Default::default()
        };
        let mut kubelet = start(&dir, options);
        let bound = Duration::from_millis(400);
        let started = Instant::now();
        let err = pod_devices(kubelet.socket(), "prod", "web", bound)
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(matches!(err, PodResourcesError::Timeout(_)), "{err:?}");
        assert!(took < bound + Duration::from_secs(1), "{took:?}");
        assert_eq!(kubelet.get_calls(), 1);
        // Stopping does not wait for the held answer.
        let stopping = Instant::now();
        kubelet.stop();
        assert!(stopping.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn stop_removes_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let mut kubelet = start(&dir, get_on());
        let socket = kubelet.socket().to_path_buf();
        assert!(pod_devices(&socket, "prod", "web", T).await.is_ok());
        kubelet.stop();
        let err = pod_devices(&socket, "prod", "web", T).await.unwrap_err();
        assert!(matches!(err, PodResourcesError::NoSocket(_)), "{err:?}");
    }

    #[tokio::test]
    async fn list_answers_above_tonics_default_4_mib_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        // ~6 MiB of pods: within the 16 MiB plexus (and Multus) accept.
        let long_id = "x".repeat(200);
        let mut many: Vec<FakePod> = (0..30_000)
            .map(|i| FakePod::new("bulk", &format!("pod-{i}")).with_devices("c", VF, &[&long_id]))
            .collect();
        many.push(FakePod::new("prod", "web").with_devices("c", VF, &["0000:04:00.7"]));
        let kubelet = FakeKubelet::start(
            &dir.path().join("kubelet.sock"),
            many,
            FakeKubeletOptions::default(),
        )
        .unwrap();
        let map = pod_devices(kubelet.socket(), "prod", "web", Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(map.get(VF), Some(&vec!["0000:04:00.7".to_string()]));
    }
}
