//! Kubernetes API access for one CNI invocation: fetch the pod and its NADs, write the
//! network-status annotation, post events.
//!
//! Request budget (thin mode, N = number of NetworkAttachmentDefinitions referenced):
//!
//! | step | requests |
//! |---|---|
//! | [`KubeClient::get_pod`] | 1 (more only on transient errors, ≤ 2.5 s) |
//! | [`KubeClient::get_nads`] | N, issued concurrently |
//! | [`KubeClient::set_network_status`] | 1 merge PATCH of `pods/status` with a UID precondition (no GET, no PUT) |
//! | [`KubeClient::post_event`] | 1 per event the caller posts; budget: one summary event |
//!
//! so an ADD costs **N + 3** requests including one event (Multus thin: about N + 4 plus an
//! event per interface). DEL makes **no** API request: it works from the ADD-time cache (a DEL
//! whose plan is lost makes one GET pod, a single attempt of at most 1 s).
//!
//! Every namespace and name is checked as a Kubernetes name before a request is built, and
//! every path segment is percent-encoded ([`names`]).
//!
//! Requests go through a [`transport`] seam: the thin plugin's own HTTP/1.1 client
//! ([`http1`], keeping `kube` out of its code path) or, in the daemon, its `kube::Client`. Both
//! use TCP_NODELAY (avoids a ≈40 ms delayed-ACK stall on the first TLS request), rustls with the
//! ring provider, per-request timeouts, and work with `https://` and plain `http://` servers.

mod address_claims;
mod api_labels;
mod client;
mod connect;
mod dra;
mod error;
mod events;
mod exec_credential;
mod http1;
mod kube_transport;
mod nads;
pub mod names;
mod pod_list;
mod pods;
mod retry;
mod status;
#[cfg(test)]
pub(crate) mod testutil;
#[cfg(test)]
mod tls_tests;
mod transport;

pub use address_claims::{claim_name, claim_namespace, ClaimHolder, ClaimOutcome, ClaimSpec};
pub use client::{ClientOptions, InClusterEnv, KubeClient, SA_CA_FILE, SA_TOKEN_FILE};
pub use dra::{network_data_apply, DeviceNetworkData, FIELD_MANAGER, RESOURCE_NAME_ATTR};
pub use error::{
    chain as error_chain, K8sError, CNI_INVALID_CONFIG, CNI_K8S_FAILURE, CNI_TRY_AGAIN_LATER,
};
pub use events::{build_event, EventType, PodRef, EVENT_ACTION, EVENT_COMPONENT};
pub use nads::{Nad, NadSpec, NetworkAttachmentDefinition, RESOURCE_NAME_ANNOTATION};
pub use pod_list::ListedPod;
pub use pods::{is_static_pod, pod_from_json, PodView, CONFIG_SOURCE_ANNOTATION};
pub use retry::RetryPolicy;
pub use status::{network_status_patch, NETWORK_STATUS_ANNOTATION};

/// Re-exported so callers need not depend on k8s-openapi for the pod type.
pub use k8s_openapi::api::core::v1::Pod;
