//! The admin's view of the apiserver for the node tier, through a kube client (one kept-alive
//! connection, so timings are not inflated by process starts): create, list, get and delete
//! pods, read events.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

/// A kube client and the runtime it runs on.
pub struct Api {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
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
            let cfg = kube::Config::from_custom_kubeconfig(
                kc,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            anyhow::Ok(kube::Client::try_from(cfg)?)
        })?;
        Ok(Api { rt, client })
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
    pub fn create_pod(&self, pod: &Value) -> Result<Value> {
        let ns = pod["metadata"]["namespace"].as_str().context("namespace")?;
        self.send("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(pod))
    }

    /// The pod, or `None` when it does not exist.
    pub fn get_pod(&self, ns: &str, name: &str) -> Result<Option<Value>> {
        match self.send("GET", &format!("/api/v1/namespaces/{ns}/pods/{name}"), None) {
            Ok(v) => Ok(Some(v)),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Pods of `ns` with label `batch=<batch>`.
    pub fn list_pods(&self, ns: &str, batch: &str) -> Result<Vec<Value>> {
        let v = self.send(
            "GET",
            &format!("/api/v1/namespaces/{ns}/pods?labelSelector=batch%3D{batch}"),
            None,
        )?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// DELETE a pod (its own grace period); a missing pod is fine.
    pub fn delete_pod(&self, ns: &str, name: &str) -> Result<()> {
        match self.send(
            "DELETE",
            &format!("/api/v1/namespaces/{ns}/pods/{name}"),
            None,
        ) {
            Ok(_) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Events about object `name` in `ns`.
    pub fn events(&self, ns: &str, name: &str) -> Result<Vec<Value>> {
        let v = self.send(
            "GET",
            &format!("/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3D{name}"),
            None,
        )?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// Events in `ns` with reason `reason`.
    pub fn events_with_reason(&self, ns: &str, reason: &str) -> Result<Vec<Value>> {
        let v = self.send(
            "GET",
            &format!("/api/v1/namespaces/{ns}/events?fieldSelector=reason%3D{reason}"),
            None,
        )?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }
}

fn not_found(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<kube::Error>()
            .is_some_and(|k| matches!(k, kube::Error::Api(s) if s.code == 404))
    })
}
