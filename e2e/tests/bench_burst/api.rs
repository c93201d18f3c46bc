//! The bench's own view of the apiserver (admin, one kept-alive kube client): create, list and
//! delete pods, counting every request it sends so they can be taken out of the
//! apiserver's totals.

use std::cell::Cell;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// A kube client and the runtime it runs on.
pub struct Api {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    /// (POST, LIST, DELETE) pods sent so far.
    pub sent: Cell<(u64, u64, u64)>,
}

impl Api {
    /// A client from `kubeconfig`.
    pub fn new(kubeconfig: &Path) -> Result<Api> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
            let opts = kube::config::KubeConfigOptions::default();
            let mut cfg = kube::Config::from_custom_kubeconfig(kc, &opts).await?;
            cfg.read_timeout = Some(std::time::Duration::from_secs(60));
            anyhow::Ok(kube::Client::try_from(cfg)?)
        })?;
        Ok(Api {
            rt,
            client,
            sent: Cell::new((0, 0, 0)),
        })
    }

    fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())?;
        let text = self
            .rt
            .block_on(self.client.request_text(req))
            .with_context(|| format!("{method} {path}"))?;
        Ok(serde_json::from_str(&text)?)
    }

    /// POST a pod.
    pub fn create_pod(&self, pod: &Value) -> Result<()> {
        let ns = pod["metadata"]["namespace"].as_str().context("namespace")?;
        let (p, l, d) = self.sent.get();
        self.sent.set((p + 1, l, d));
        self.send("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(pod))
            .map(drop)
    }

    /// Pods of `ns` with label `batch=<batch>`.
    pub fn list_pods(&self, ns: &str, batch: &str) -> Result<Vec<Value>> {
        let (p, l, d) = self.sent.get();
        self.sent.set((p, l + 1, d));
        let v = self.send(
            "GET",
            &format!("/api/v1/namespaces/{ns}/pods?labelSelector=batch%3D{batch}"),
            None,
        )?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// DELETE a pod (its own grace period).
    pub fn delete_pod(&self, ns: &str, name: &str) -> Result<()> {
        let (p, l, d) = self.sent.get();
        self.sent.set((p, l, d + 1));
        self.send(
            "DELETE",
            &format!("/api/v1/namespaces/{ns}/pods/{name}"),
            None,
        )
        .map(drop)
    }
}
