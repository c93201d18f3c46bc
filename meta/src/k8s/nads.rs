//! The NetworkAttachmentDefinition custom resource and concurrent NAD GETs.

use std::borrow::Cow;

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use serde::{Deserialize, Deserializer, Serialize};

use super::client::{built, KubeClient};
use super::error::{Ctx, K8sError};
use super::names::segment;
use super::retry;

/// NAD annotation naming the device-plugin / DRA resource (e.g. `intel.com/sriov_vf`).
pub const RESOURCE_NAME_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";

/// A `k8s.cni.cncf.io/v1` `NetworkAttachmentDefinition` (namespaced, plural
/// `network-attachment-definitions`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkAttachmentDefinition {
    /// Standard object metadata (annotations included).
    pub metadata: ObjectMeta,
    /// The spec; absent or `null` reads as an empty spec.
    #[serde(default, deserialize_with = "null_as_default")]
    pub spec: NadSpec,
}

/// Short name for [`NetworkAttachmentDefinition`].
pub type Nad = NetworkAttachmentDefinition;

/// `spec` of a NAD.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NadSpec {
    /// The CNI configuration as a JSON string; may be absent or empty (then the config is
    /// looked up on disk by NAD name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
}

fn null_as_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl NetworkAttachmentDefinition {
    /// `spec.config` when present and not blank.
    pub fn config(&self) -> Option<&str> {
        self.spec.config.as_deref().filter(|c| !c.trim().is_empty())
    }

    /// The `k8s.v1.cni.cncf.io/resourceName` annotation, if set and non-empty.
    pub fn resource_name(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(RESOURCE_NAME_ANNOTATION)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }
}

impl kube::Resource for NetworkAttachmentDefinition {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "NetworkAttachmentDefinition".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "k8s.cni.cncf.io".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "network-attachment-definitions".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl KubeClient {
    /// GET each `(namespace, name)` NAD, all concurrently, each with the client's transient-retry
    /// policy. Results are in input order; a missing NAD is `Ok(None)` (not retried).
    pub async fn get_nads(&self, refs: &[(&str, &str)]) -> Vec<Result<Option<Nad>, K8sError>> {
        let _phase = plexus_delegates::timing::phase("nad_get");
        join_all(refs.iter().map(|&(ns, name)| self.get_nad(ns, name))).await
    }

    /// GET one NAD (see [`KubeClient::get_nads`]).
    pub async fn get_nad(&self, ns: &str, name: &str) -> Result<Option<Nad>, K8sError> {
        let ctx = Ctx {
            what: "get network-attachment-definition",
            ns,
            name,
        };
        K8sError::check_names(ctx)?;
        let url = Nad::url_path(&(), Some(&segment(ns)));
        let name = segment(name);
        let got = retry::run(self.opts.retry, self.opts.request_timeout, ctx, || async {
            let req = built(
                ctx,
                kube::core::Request::new(&url).get(&name, &Default::default()),
            )?;
            self.fetch::<Nad>(ctx, req).await
        })
        .await;
        match got {
            Ok(nad) => Ok(Some(nad)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// LIST the NADs of `ns`, from the API server's watch cache (`resourceVersion=0`: a
    /// moment stale at most, and no etcd read).
    pub async fn list_nads(&self, ns: &str) -> Result<Vec<Nad>, K8sError> {
        let ctx = Ctx {
            what: "list network-attachment-definitions",
            ns,
            name: "",
        };
        K8sError::check_namespace(ctx)?;
        #[derive(Deserialize)]
        struct List {
            #[serde(default)]
            items: Vec<Nad>,
        }
        let url = format!(
            "{}?resourceVersion=0",
            Nad::url_path(&(), Some(&segment(ns)))
        );
        let list = retry::run(self.opts.retry, self.opts.request_timeout, ctx, || async {
            let req = http::Request::get(url.as_str()).body(Vec::new());
            let req = built(ctx, req.map_err(kube::core::request::Error::BuildRequest))?;
            self.fetch::<List>(ctx, req).await
        })
        .await?;
        Ok(list.items)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testutil::{json_response, MockApi};
    use super::*;

    const PREFIX: &str = "/apis/k8s.cni.cncf.io/v1/namespaces/";

    fn nad_json(ns: &str, name: &str, spec: &str) -> String {
        format!(
            r#"{{"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition","metadata":{{"name":"{name}","namespace":"{ns}","annotations":{{"{RESOURCE_NAME_ANNOTATION}":"intel.com/sriov"}}}}{spec}}}"#
        )
    }

    #[test]
    fn parses_spec_variants() {
        let n: Nad = serde_json::from_str(&nad_json(
            "a",
            "b",
            r#","spec":{"config":"{\"type\":\"x\"}"}"#,
        ))
        .unwrap();
        assert_eq!(n.config(), Some(r#"{"type":"x"}"#));
        assert_eq!(n.resource_name(), Some("intel.com/sriov"));
        for spec in [
            "",
            r#","spec":null"#,
            r#","spec":{}"#,
            r#","spec":{"config":"  "}"#,
        ] {
            let n: Nad = serde_json::from_str(&nad_json("a", "b", spec)).unwrap();
            assert_eq!(n.config(), None, "{spec}");
        }
    }

    #[tokio::test]
    async fn fetches_concurrently_in_order_with_404_as_none() {
        // Each answer is held until all three requests have arrived: passes only if concurrent.
        let mock = MockApi::with_handler(|req| {
            let path = req.path_and_query.strip_prefix(PREFIX).unwrap_or("");
            Some(match path {
                "ns1/network-attachment-definitions/a" => {
                    json_response(200, &nad_json("ns1", "a", r#","spec":{"config":"{}"}"#))
                }
                "ns2/network-attachment-definitions/b" => {
                    json_response(200, &nad_json("ns2", "b", ""))
                }
                _ => json_response(
                    404,
                    r#"{"kind":"Status","code":404,"reason":"NotFound","message":"nf","details":{"name":"missing"}}"#,
                ),
            })
        })
        .hold_until(3);
        let client = mock.client();
        let start = std::time::Instant::now();
        let out = client
            .get_nads(&[("ns1", "a"), ("ns2", "b"), ("ns1", "missing")])
            .await;
        // Sequential GETs would each wait out the mock's 2 s hold.
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(out.len(), 3);
        let a = out[0].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(a.metadata.name.as_deref(), Some("a"));
        let b = out[1].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(b.metadata.namespace.as_deref(), Some("ns2"));
        assert!(out[2].as_ref().unwrap().is_none());
        let reqs = mock.requests();
        assert_eq!(reqs.len(), 3, "404 must not be retried");
        assert!(reqs.iter().all(|r| r.method == "GET"));
    }

    #[tokio::test]
    async fn transient_nad_errors_are_retried() {
        let mock = MockApi::new(vec![
            json_response(502, r#"{"kind":"Status","code":502,"message":"x"}"#),
            json_response(200, &nad_json("ns1", "a", "")),
        ]);
        let mut opts = super::super::client::ClientOptions::default();
        opts.retry.interval = Duration::from_millis(10);
        let out = mock.client_with(opts).get_nad("ns1", "a").await.unwrap();
        assert!(out.is_some());
        assert_eq!(mock.requests().len(), 2);
    }
}
