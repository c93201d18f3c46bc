//! Raw requests to an API server through the kube client (the client plexus uses), answered as
//! (HTTP code, reason, message): for tests that compare servers or check admission decisions.

use anyhow::Result;
use serde_json::Value;
use std::path::Path;

/// (HTTP code, reason, message) of one answer; `""` reason and message on success.
pub type Answer = (u16, String, String);

/// Send `method path body` (a PATCH is a JSON merge patch).
pub async fn answer(c: &kube::Client, method: &str, path: &str, body: &Value) -> Answer {
    let mut req = http::Request::builder().method(method).uri(path);
    if method == "PATCH" {
        req = req.header("content-type", "application/merge-patch+json");
    } else {
        req = req.header("content-type", "application/json");
    }
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    match c.request_text(req.body(body).expect("request")).await {
        Ok(_) => (200, String::new(), String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone(), s.message.clone()),
        Err(e) => (0, "client".into(), e.to_string()),
    }
}

/// A kube client from a kubeconfig file.
pub async fn kube_client(kubeconfig: &Path) -> Result<kube::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    Ok(kube::Client::try_from(cfg)?)
}
