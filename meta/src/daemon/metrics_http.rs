//! The metrics endpoint both modes serve (`/metrics`, `/healthz`, `/readyz`): hyper, with the
//! ServiceAccount-token authentication and authorisation Kubernetes components use for
//! `/metrics` (TokenReview + SubjectAccessReview on the non-resource URL).
//!
//! Interface agreed between the metrics helpers; the body is being built (issue 38).

use std::sync::Arc;

/// What the endpoint serves: the daemon's registry, or thin mode's exporter.
pub trait MetricsSource: Send + Sync + 'static {
    /// Every metric family, OpenMetrics text.
    fn render(&self) -> String;
    /// `/readyz`: `Ok` when ready, else the reason (e.g. "caches not synced", "draining").
    fn ready(&self) -> Result<(), String>;
}

/// How `/metrics` is protected.
pub enum Access {
    /// TokenReview + SubjectAccessReview (`get` on the non-resource URL `/metrics`) through the
    /// API server, with the caller's bearer token.
    Kubernetes(kube::Client),
    /// No check: only for a loopback address (tests, a node-local scraper).
    LoopbackOnly,
}

/// Serve on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, access: Access, source: Arc<dyn MetricsSource>) {
    let _ = (listener, access, source);
    tracing::warn!("metrics endpoint not built yet");
}
