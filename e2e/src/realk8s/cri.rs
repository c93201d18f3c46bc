//! A minimal CRI (`runtime.v1.RuntimeService`) client over containerd's Unix socket: list pod
//! sandboxes, read one's status (netns path), stop and remove them. `crictl` is not installed
//! here; stopping a sandbox through the CRI is what runs the CNI DEL.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::Endpoint;
use tonic_prost::ProstCodec;

/// Protobuf messages of `k8s.io/cri-api/pkg/apis/runtime/v1/api.proto` (the subset used here;
/// unknown fields are skipped on decode).
pub mod proto {
    use std::collections::HashMap;

    /// `PodSandboxFilter{ string id = 1; PodSandboxStateValue state = 2; map<string,string> label_selector = 3 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxFilter {
        /// Sandbox ID.
        #[prost(string, tag = "1")]
        pub id: String,
        /// Labels that must match.
        #[prost(map = "string, string", tag = "3")]
        pub label_selector: HashMap<String, String>,
    }

    /// `ListPodSandboxRequest{ PodSandboxFilter filter = 1 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxRequest {
        /// Optional filter.
        #[prost(message, optional, tag = "1")]
        pub filter: Option<PodSandboxFilter>,
    }

    /// `PodSandboxMetadata{ string name = 1; string uid = 2; string namespace = 3; uint32 attempt = 4 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxMetadata {
        /// Pod name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// Pod UID.
        #[prost(string, tag = "2")]
        pub uid: String,
        /// Pod namespace.
        #[prost(string, tag = "3")]
        pub namespace: String,
    }

    /// `PodSandbox{ string id = 1; PodSandboxMetadata metadata = 2; PodSandboxState state = 3; … }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandbox {
        /// Sandbox ID (the CNI container ID).
        #[prost(string, tag = "1")]
        pub id: String,
        /// Which pod.
        #[prost(message, optional, tag = "2")]
        pub metadata: Option<PodSandboxMetadata>,
        /// 0 = ready, 1 = not ready.
        #[prost(int32, tag = "3")]
        pub state: i32,
    }

    /// `ListPodSandboxResponse{ repeated PodSandbox items = 1 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxResponse {
        /// The sandboxes.
        #[prost(message, repeated, tag = "1")]
        pub items: Vec<PodSandbox>,
    }

    /// `PodSandboxStatusRequest{ string pod_sandbox_id = 1; bool verbose = 2 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxStatusRequest {
        /// Sandbox ID.
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
        /// Ask for the runtime's extra info (containerd: pid, runtime spec).
        #[prost(bool, tag = "2")]
        pub verbose: bool,
    }

    /// `PodSandboxStatusResponse{ PodSandboxStatus status = 1; map<string,string> info = 2; … }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxStatusResponse {
        /// `info["info"]` is containerd's JSON sandbox info.
        #[prost(map = "string, string", tag = "2")]
        pub info: HashMap<String, String>,
    }

    /// `StopPodSandboxRequest` / `RemovePodSandboxRequest{ string pod_sandbox_id = 1 }`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SandboxIdRequest {
        /// Sandbox ID.
        #[prost(string, tag = "1")]
        pub pod_sandbox_id: String,
    }

    /// An empty response.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Empty {}
}

use proto::*;

/// A CRI runtime endpoint (a Unix socket).
#[derive(Clone, Debug)]
pub struct Cri {
    socket: PathBuf,
}

impl Cri {
    /// The runtime at `socket`.
    pub fn new(socket: &Path) -> Cri {
        Cri {
            socket: socket.to_path_buf(),
        }
    }

    /// Every pod sandbox, or those with label `io.kubernetes.pod.uid` = `uid`.
    pub fn sandboxes(&self, uid: Option<&str>) -> Result<Vec<PodSandbox>> {
        let filter = uid.map(|u| PodSandboxFilter {
            id: String::new(),
            label_selector: HashMap::from([("io.kubernetes.pod.uid".into(), u.into())]),
        });
        let resp: ListPodSandboxResponse =
            self.call("ListPodSandbox", ListPodSandboxRequest { filter })?;
        Ok(resp.items)
    }

    /// containerd's verbose sandbox info (JSON: `pid`, `runtimeSpec`, …).
    pub fn sandbox_info(&self, id: &str) -> Result<serde_json::Value> {
        let resp: PodSandboxStatusResponse = self.call(
            "PodSandboxStatus",
            PodSandboxStatusRequest {
                pod_sandbox_id: id.into(),
                verbose: true,
            },
        )?;
        let info = resp.info.get("info").context("no verbose sandbox info")?;
        Ok(serde_json::from_str(info)?)
    }

    /// The network namespace path of a sandbox (from its runtime spec).
    pub fn sandbox_netns(&self, id: &str) -> Result<String> {
        let info = self.sandbox_info(id)?;
        info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["type"] == "network")
            .and_then(|n| n["path"].as_str())
            .map(str::to_string)
            .context("sandbox has no network namespace path")
    }

    /// `StopPodSandbox` (runs CNI DEL), then `RemovePodSandbox`.
    pub fn stop_and_remove(&self, id: &str) -> Result<()> {
        let req = || SandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        let _: Empty = self.call("StopPodSandbox", req())?;
        let _: Empty = self.call("RemovePodSandbox", req())?;
        Ok(())
    }

    fn call<Req, Resp>(&self, method: &str, msg: Req) -> Result<Resp>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let socket = self.socket.clone();
        let path = PathAndQuery::try_from(format!("/runtime.v1.RuntimeService/{method}"))?;
        rt.block_on(async move {
            let fut = async {
                let channel = Endpoint::from_static("http://localhost")
                    .connect_with_connector(tower::service_fn(move |_| {
                        let socket = socket.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(
                                UnixStream::connect(socket).await?,
                            ))
                        }
                    }))
                    .await?;
                let mut client = tonic::client::Grpc::new(channel);
                client.ready().await?;
                let resp = client
                    .unary(
                        tonic::Request::new(msg),
                        path,
                        ProstCodec::<Req, Resp>::default(),
                    )
                    .await?;
                anyhow::Ok(resp.into_inner())
            };
            tokio::time::timeout(Duration::from_secs(120), fut)
                .await
                .with_context(|| format!("CRI {method}: no answer in 120 s"))?
                .with_context(|| format!("CRI {method}"))
        })
    }
}
