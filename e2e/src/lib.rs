//! plexus end-to-end test support: an in-memory Kubernetes API server that the real `kube`
//! client (and the `plexus` binary) talk to over HTTP, with fault injection and a request log.

pub mod apiserver;
pub mod fake_kubelet;
pub mod nad_policy;
pub mod procfs;
pub mod realk8s;

pub use apiserver::{
    Access, ApiServerError, RequestMatcher, RequestRecord, TestApiServer, TestApiServerOptions,
};
pub use nad_policy::nad_policy_allowing;
