//! Thin-mode inputs: the API server, read by this CNI call (GET pod, concurrent NAD GETs), or
//! the pod annotations the runtime passed when the config declares that capability.

use super::Inputs;
use crate::context::Ctx;
use crate::devices::dra::DraDevice;
use crate::error::MetaError;
use crate::k8s::{ClientOptions, KubeClient, RetryPolicy};
use crate::plan::requests::NadMap;
use crate::plan::resolve::NadData;
use crate::plan::DeviceMap;
use crate::pod::{PodIdentity, PodInfo};
use plexus_conf::plexus_config::PlexusConfig;
use std::collections::BTreeSet;
use std::time::Duration;

/// The one attempt of [`Inputs::pod_quick`] gets at most this long.
pub const QUICK_TIMEOUT: Duration = Duration::from_secs(1);

/// The runtime capability carrying the pod's annotations (containerd, CRI-O).
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";

/// Inputs read from the API server by this call, through the call's client (built on first
/// use); without an API (static mode) there is no pod and NAD references resolve only
/// through the `confDir` fallback.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiInputs;

impl Inputs for ApiInputs {
    fn pod(&mut self, ctx: &mut Ctx, id: &PodIdentity) -> Result<Option<PodInfo>, MetaError> {
        let client = ctx.client()?;
        if client.is_some() {
            if let Some(p) = pod_from_runtime(&ctx.config, Some(id)) {
                return Ok(Some(p));
            }
        }
        fetch_pod(ctx, client.as_ref(), Some(id))
    }

    fn pod_quick(&mut self, ctx: &mut Ctx, id: &PodIdentity) -> Result<Option<PodInfo>, MetaError> {
        let Some(client) = ctx.client()? else {
            return Ok(None);
        };
        if let Some(p) = pod_from_runtime(&ctx.config, Some(id)) {
            return Ok(Some(p));
        }
        let opts = ClientOptions {
            retry: RetryPolicy::none(),
            request_timeout: client.options().request_timeout.min(QUICK_TIMEOUT),
            ..client.options().clone()
        };
        fetch_pod(ctx, Some(&client.with_options(opts)), Some(id))
    }

    fn nads(
        &mut self,
        ctx: &mut Ctx,
        refs: &[(String, String)],
        label: &str,
    ) -> Result<NadMap, MetaError> {
        let client = ctx.client()?;
        fetch_nads(ctx, client.as_ref(), refs, label)
    }

    fn devices(
        &mut self,
        ctx: &mut Ctx,
        pod: &PodInfo,
        wanted: &BTreeSet<String>,
    ) -> Result<(DeviceMap, Vec<DraDevice>), MetaError> {
        let client = ctx.client()?;
        super::devices::allocated(ctx, client.as_ref(), pod, wanted)
    }

    fn client(&mut self, ctx: &mut Ctx) -> Result<Option<KubeClient>, MetaError> {
        ctx.client()
    }

    fn namespace_nads(&mut self, ctx: &mut Ctx, ns: &str) -> Option<Vec<(String, NadData)>> {
        let client = ctx.client().ok()??;
        match ctx.block_on(client.list_nads(ns)) {
            Ok(Ok(nads)) => Some(
                nads.iter()
                    .map(|n| {
                        (
                            n.metadata.name.clone().unwrap_or_default(),
                            NadData::from_nad(n),
                        )
                    })
                    .collect(),
            ),
            Ok(Err(e)) => {
                tracing::warn!(namespace = %ns, error = %e, "cannot list the namespace's NADs (thin mode: deploy/components/fixed-ips)");
                None
            }
            Err(e) => {
                tracing::warn!(namespace = %ns, error = %e, "cannot list the namespace's NADs");
                None
            }
        }
    }
}

/// The pod from what the runtime passed, without an API request: when plexus' config declares
/// the `io.kubernetes.cri.pod-annotations` capability the runtime hands over the annotations,
/// and `K8S_POD_UID` identifies the pod (the status PATCH carries it as a precondition).
pub fn pod_from_runtime(config: &PlexusConfig, id: Option<&PodIdentity>) -> Option<PodInfo> {
    let id = id.filter(|i| !i.uid.is_empty())?;
    let ann = config
        .runtime_config
        .get(POD_ANNOTATIONS_CAPABILITY)?
        .as_object()?;
    Some(PodInfo {
        id: id.clone(),
        annotations: ann
            .iter()
            .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
            .collect(),
        claims: None,
        statefulset: None,
    })
}

/// Fetch the pod (bounded retry). `Ok(None)`: no API, no pod identity, or the pod is gone.
/// Fails with [`MetaError::PodRead`].
pub fn fetch_pod(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    id: Option<&PodIdentity>,
) -> Result<Option<PodInfo>, MetaError> {
    let (Some(client), Some(id)) = (client, id) else {
        return Ok(None);
    };
    let policy = client.options().retry;
    let uid = (!id.uid.is_empty()).then_some(id.uid.as_str());
    let got = ctx.block_on(client.get_pod(&id.namespace, &id.name, uid, policy))?;
    match got {
        Ok(Some(pod)) => Ok(Some(PodInfo::from_pod(&pod, id))),
        Ok(None) => {
            tracing::warn!(pod = %id.key(), "pod not found (already deleted?): only the default network and the static config are known for it");
            Ok(None)
        }
        Err(source) => Err(MetaError::PodRead {
            pod: id.key(),
            source: source.into(),
        }),
    }
}

/// Fetch NADs concurrently into a map (a missing NAD maps to `None`); a NAD that cannot be
/// read fails with [`MetaError::NadRead`].
pub fn fetch_nads(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    refs: &[(String, String)],
    pod: &str,
) -> Result<NadMap, MetaError> {
    let mut map = NadMap::new();
    if refs.is_empty() {
        return Ok(map);
    }
    let Some(client) = client else {
        // Static mode: NAD references resolve only through the confDir fallback.
        return Ok(map);
    };
    let borrowed: Vec<(&str, &str)> = refs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let results = ctx.block_on(client.get_nads(&borrowed))?;
    for (rf, res) in refs.iter().zip(results) {
        match res {
            Ok(nad) => {
                map.insert(rf.clone(), nad.as_ref().map(NadData::from_nad));
            }
            Err(source) => {
                return Err(MetaError::NadRead {
                    pod: pod.to_string(),
                    ns: rf.0.clone(),
                    name: rf.1.clone(),
                    source: source.into(),
                })
            }
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::testutil::{json_response, MockApi};

    /// A client whose API server answers every request with `status` and a `Status` body.
    fn client_answering(rt: &tokio::runtime::Runtime, status: u16) -> KubeClient {
        // kube's client spawns its buffer worker on the current runtime.
        let _in_rt = rt.enter();
        let reason = if status == 404 {
            "NotFound"
        } else {
            "Forbidden"
        };
        MockApi::repeating(json_response(
            status,
            &format!(
                r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"m","reason":"{reason}","details":{{"name":"mv"}},"code":{status}}}"#
            ),
        ))
        .client()
    }

    fn ctx(rt: &tokio::runtime::Runtime, client: KubeClient) -> Ctx {
        let cfg = PlexusConfig::parse(
            br#"{"cniVersion":"1.0.0","name":"p","type":"plexus","delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}]}"#,
        )
        .unwrap();
        Ctx::from_config(cfg, &[], None).with_shared(rt.handle().clone(), Some(client))
    }

    fn id() -> PodIdentity {
        PodIdentity {
            namespace: "db".into(),
            name: "p".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_refused_read_names_the_pod_or_the_nad_and_keeps_the_api_error() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = client_answering(&rt, 403);
        let mut ctx = ctx(&rt, client.clone());

        let e = fetch_pod(&mut ctx, Some(&client), Some(&id())).unwrap_err();
        assert!(
            matches!(&e, MetaError::PodRead { pod, source } if pod == "db/p"
                && matches!(**source, crate::k8s::K8sError::Api { code: 403, .. })),
            "{e:?}"
        );
        assert_eq!(e.code(), 102);

        let refs = vec![("db".to_string(), "mv".to_string())];
        let e = ApiInputs.nads(&mut ctx, &refs, "pod db/p").unwrap_err();
        assert!(
            matches!(&e, MetaError::NadRead { ns, name, source, .. }
                if ns == "db" && name == "mv" && matches!(**source, crate::k8s::K8sError::Api { code: 403, .. })),
            "{e:?}"
        );
        // The CNI error it becomes at the edge.
        let c = e.to_cni();
        assert_eq!(
            (c.code, c.msg.as_str()),
            (
                102,
                "pod db/p, network db/mv: cannot read the NetworkAttachmentDefinition"
            )
        );

        // A NAD that does not exist is no error here: the planner names it.
        let client = client_answering(&rt, 404);
        let mut ctx = self::ctx(&rt, client);
        let map = ApiInputs.nads(&mut ctx, &refs, "pod db/p").unwrap();
        assert_eq!(map.get(&refs[0]), Some(&None));
    }
}
