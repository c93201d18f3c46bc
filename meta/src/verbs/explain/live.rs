//! `plexus explain --pod NAMESPACE/NAME`, live: the pod and its NADs read from the API server
//! as this node's ADD reads them (the node's config: its `kubeconfig`, else the in-cluster
//! service account), run through ADD's own stages up to the point where delegates would run —
//! inputs → plan → NAD policy → delegate binaries → pool overlap — then each fixed address's
//! AddressClaim looked up (read only). Beside it, what ADD did on this node: the saved plan(s)
//! of the pod's sandbox and the pod's `network-status` annotation. Nothing is written: no
//! claim, no status, no event, no state file.

use crate::context::{ApiSource, Ctx};
use crate::error::MetaError;
use crate::inputs::{self, api::ApiInputs};
use crate::k8s::KubeClient;
use crate::pod::{PodIdentity, PodInfo};
use crate::state::{ClaimedAddress, SavedPlan};
use plexus_conf::args::CniArgs;
use plexus_conf::error::CniError;
use plexus_conf::k8s::selection::NETWORK_STATUS_ANNOTATION;
use plexus_conf::plexus_config::PlexusConfig;
use serde::Serialize;
use serde_json::Value;
use std::path::PathBuf;

/// What to explain.
#[derive(Debug, Clone)]
pub struct Request {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The kubelet's `CNI_IFNAME`.
    pub ifname: String,
    /// The runtime's `CNI_PATH` (searched after the config's `binDir` for delegates).
    pub cni_path: Vec<PathBuf>,
}

/// Why ADD fails (or would), as the CNI error it returns.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// The stage that refuses: `config`, `api`, `pod`, `inputs`, `plan`, `nadPolicy`,
    /// `plugins`, `poolOverlap`, `addressClaim`.
    pub stage: &'static str,
    /// CNI error code.
    pub code: u32,
    /// CNI error message (names the pod and the network).
    pub msg: String,
    /// CNI error details.
    pub details: String,
    /// For a NAD-policy refusal: the policy part and class (`paths/data`, `paths/logs`, …,
    /// `hostResources`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

/// One fixed address and who holds its AddressClaim.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimCheck {
    /// Network.
    pub network: String,
    /// Address.
    pub address: String,
    /// The claim object (`namespace/name`).
    pub claim: String,
    /// `namespace/name (uid)` of the pod holding it, when a claim exists.
    pub holder: Option<String>,
    /// `free`, `ours`, `heldByOther`, `stale` (held by a pod that is gone: ADD takes it
    /// over), `unknown` (not readable: why in `note`).
    pub state: &'static str,
    /// Why it is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What ADD did for the pod on this node: one saved plan.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SavedView {
    /// The sandbox.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// Its pod UID (a plan of an earlier pod of the same name has another).
    pub pod_uid: String,
    /// `interface network` pairs, in ADD order.
    pub attachments: Vec<(String, String)>,
    /// Fixed addresses it claimed.
    pub claims: Vec<ClaimedAddress>,
    /// Failed DEL attempts.
    pub del_failures: u32,
}

/// The whole answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `namespace/name`.
    pub pod: String,
    /// The config file used.
    pub config: PathBuf,
    /// How the API was reached: `kubeconfig PATH`, `in-cluster`, `none`.
    pub api: String,
    /// Whether the pod exists.
    pub found: bool,
    /// Its UID.
    pub uid: Option<String>,
    /// The node it is scheduled to.
    pub node: Option<String>,
    /// This node's name as plexus knows it (`nodeName` / `PLEXUS_NODE_NAME`).
    pub this_node: String,
    /// `ok` (ADD would run the plan) or `refused` (ADD returns `failure`).
    pub verdict: &'static str,
    /// Why ADD fails.
    pub failure: Option<Failure>,
    /// The plan ADD runs (as `plexus explain` prints it), when it gets that far.
    pub plan: Option<Value>,
    /// Fixed addresses and their claims.
    pub claims: Vec<ClaimCheck>,
    /// This node's saved plans for the pod (what ADD did).
    pub saved: Vec<SavedView>,
    /// The pod's `network-status` annotation (what ADD reported), parsed.
    pub network_status: Option<Value>,
    /// Remarks (another node, static mode, …).
    pub notes: Vec<String>,
}

fn failure(stage: &'static str, e: MetaError) -> Failure {
    let c: CniError = e.into();
    Failure {
        stage,
        code: c.code,
        msg: c.msg,
        details: c.details,
        class: None,
    }
}

/// The policy part and class of the first enforced refusal of `plan` (what
/// [`crate::nad_guard::check`] returned as the error).
fn refusal_class(
    config: &PlexusConfig,
    pod_ns: &str,
    plan: &[crate::plan::PlannedAttachment],
) -> Option<String> {
    let policy = &config.nad_policy;
    for a in plan {
        let Some(r) = crate::nad_guard::refusals(policy, Some(pod_ns), a)
            .into_iter()
            .find(|r| r.mode == plexus_conf::nad_policy::Mode::Enforce)
        else {
            continue;
        };
        let path = plexus_conf::nad_policy::paths::find(&a.config, &policy.paths.keys)
            .into_iter()
            .find(|p| p.location == r.location || r.location.ends_with(&p.location));
        return Some(match path {
            Some(p) => format!("paths/{}", p.class.name()),
            None => "hostResources".to_string(),
        });
    }
    None
}

fn saved_views(plans: Vec<SavedPlan>, id: &PodIdentity) -> Vec<SavedView> {
    plans
        .into_iter()
        .filter(|p| {
            p.pod
                .as_ref()
                .is_some_and(|i| i.namespace == id.namespace && i.name == id.name)
        })
        .map(|p| SavedView {
            pod_uid: p.pod.as_ref().map(|i| i.uid.clone()).unwrap_or_default(),
            attachments: p
                .attachments
                .iter()
                .map(|a| (a.ifname.clone(), a.network.clone()))
                .collect(),
            claims: p.claims,
            del_failures: p.del_failures,
            container_id: p.container_id,
            ifname: p.ifname,
        })
        .collect()
}

/// Look up the AddressClaim of each fixed address (GET, never a write).
fn claim_checks(
    ctx: &mut Ctx,
    client: &KubeClient,
    me: &PodIdentity,
    plan: &[crate::plan::PlannedAttachment],
) -> Vec<ClaimCheck> {
    use crate::k8s::{claim_name, claim_namespace};
    let mut out = Vec::new();
    for (network, address) in crate::address_guard::static_addresses(plan) {
        let ns = claim_namespace(&network, &me.namespace).to_string();
        let name = claim_name(&network, address);
        let mut check = ClaimCheck {
            network: network.clone(),
            address: address.to_string(),
            claim: format!("{ns}/{name}"),
            holder: None,
            state: "unknown",
            note: None,
        };
        let Some(kc) = client.kube_client() else {
            check.note = Some("no API client for claims".into());
            out.push(check);
            continue;
        };
        let url = format!(
            "/apis/plexus.cni.io/v1alpha1/namespaces/{}/addressclaims/{}",
            crate::k8s::names::segment(&ns),
            crate::k8s::names::segment(&name)
        );
        let got = ctx.block_on(async {
            let req = http::Request::get(url.as_str())
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            kc.request::<Value>(req).await.map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 => "404".to_string(),
                other => other.to_string(),
            })
        });
        match got {
            Ok(Ok(v)) => {
                let h = &v["spec"]["pod"];
                let (hns, hname, huid) = (
                    h["namespace"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .unwrap_or(&ns)
                        .to_string(),
                    h["name"].as_str().unwrap_or("").to_string(),
                    h["uid"].as_str().unwrap_or("").to_string(),
                );
                check.holder = Some(format!("{hns}/{hname} ({huid})"));
                check.state = if huid == me.uid {
                    "ours"
                } else {
                    // A holder that is gone (or replaced by a pod of another UID) is taken over.
                    let policy = client.options().retry;
                    match ctx.block_on(client.get_pod(&hns, &hname, None, policy)) {
                        Ok(Ok(Some(p))) if p.metadata.uid.as_deref() == Some(huid.as_str()) => {
                            "heldByOther"
                        }
                        Ok(Ok(_)) => "stale",
                        _ => "heldByOther",
                    }
                };
            }
            Ok(Err(e)) if e == "404" => check.state = "free",
            Ok(Err(e)) => check.note = Some(e),
            Err(e) => check.note = Some(e.to_string()),
        }
        out.push(check);
    }
    out
}

/// Explain `req` with the node's `config` (read from `config_path`); `in_cluster` is the
/// process' in-cluster API environment.
pub fn explain(
    config: PlexusConfig,
    config_path: PathBuf,
    req: &Request,
    in_cluster: Option<crate::k8s::InClusterEnv>,
) -> Explanation {
    let this_node = config.node_name.clone();
    let mut ctx = Ctx::from_config(config, &req.cni_path, in_cluster);
    let id = PodIdentity {
        namespace: req.namespace.clone(),
        name: req.name.clone(),
        ..Default::default()
    };
    let mut ex = Explanation {
        pod: id.key(),
        config: config_path,
        api: match &ctx.api {
            ApiSource::Kubeconfig(p) => format!("kubeconfig {}", p.display()),
            ApiSource::InCluster(_) => "in-cluster".into(),
            ApiSource::None => "none".into(),
        },
        found: false,
        uid: None,
        node: None,
        this_node,
        verdict: "refused",
        failure: None,
        plan: None,
        claims: Vec::new(),
        saved: saved_views(ctx.store.all(), &id),
        network_status: None,
        notes: Vec::new(),
    };
    run(&mut ctx, req, id, &mut ex);
    ex
}

fn run(ctx: &mut Ctx, req: &Request, id: PodIdentity, ex: &mut Explanation) {
    let label = format!("pod {}", id.key());
    if !ctx.has_api() {
        ex.notes.push(
            "static mode: the config names no kubeconfig and this is not a pod of the cluster; only this node's saved plans are shown"
                .into(),
        );
        return;
    }
    let client = match ctx.client() {
        Ok(Some(c)) => c,
        Ok(None) => return,
        Err(e) => {
            ex.failure = Some(failure("api", e));
            return;
        }
    };
    let policy = client.options().retry;
    let pod = match ctx.block_on(client.get_pod(&id.namespace, &id.name, None, policy)) {
        Ok(Ok(Some(p))) => p,
        Ok(Ok(None)) => {
            ex.failure = Some(Failure {
                stage: "pod",
                code: plexus_conf::error::code::TRY_AGAIN_LATER,
                msg: format!("{label}: not found in the API"),
                details: "ADD for a pod that does not exist attaches only the default network; check the namespace and name".into(),
                class: None,
            });
            return;
        }
        Ok(Err(source)) => {
            ex.failure = Some(failure(
                "pod",
                MetaError::PodRead {
                    pod: id.key(),
                    source: source.into(),
                },
            ));
            return;
        }
        Err(e) => {
            ex.failure = Some(failure("api", e));
            return;
        }
    };
    ex.found = true;
    ex.uid = pod.metadata.uid.clone();
    ex.node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    ex.network_status = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NETWORK_STATUS_ANNOTATION))
        .and_then(|s| serde_json::from_str(s).ok());
    if let Some(n) = &ex.node {
        if !ex.this_node.is_empty() && *n != ex.this_node {
            ex.notes.push(format!(
                "the pod runs on node {n}, not this node ({}): its devices and saved plan are that node's; run plexus explain there",
                ex.this_node
            ));
        }
    }
    let info = PodInfo::from_pod(&pod, &id);
    let me = info.id.clone();
    if let Some(uid) = &ex.uid {
        let others = ex
            .saved
            .iter()
            .filter(|s| s.pod_uid != *uid && !s.pod_uid.is_empty())
            .count();
        if others > 0 {
            ex.notes.push(format!("{others} saved plan(s) here belong to an earlier pod of this name (another UID): a DEL has not come for it yet"));
        }
    }
    let container_id = ex
        .saved
        .iter()
        .find(|s| Some(&s.pod_uid) == ex.uid.as_ref())
        .map_or("<containerID>".to_string(), |s| s.container_id.clone());
    let args = match CniArgs::parse(&format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_UID={}",
        me.namespace, me.name, me.uid
    )) {
        Ok(a) => a,
        Err(source) => {
            ex.failure = Some(failure(
                "inputs",
                MetaError::CniArgs {
                    source: source.into(),
                },
            ));
            return;
        }
    };
    let read = match inputs::read(ctx, &mut ApiInputs, Some(info), &label) {
        Ok(r) => r,
        Err(e) => {
            ex.failure = Some(failure("inputs", e));
            return;
        }
    };
    let plan = match crate::plan::for_pod(&ctx.config, &req.ifname, &args, &container_id, &read) {
        Ok(p) => p,
        Err(e) => {
            ex.failure = Some(failure("plan", e));
            return;
        }
    };
    ex.plan = Some(super::plan_json(&ctx.config, &me.key(), &plan));
    if let Err(e) =
        crate::nad_guard::check(&ctx.config.nad_policy, Some(&me.namespace), &label, &plan)
    {
        let mut f = failure("nadPolicy", e);
        f.class = refusal_class(&ctx.config, &me.namespace, &plan);
        ex.failure = Some(f);
        return;
    }
    if let Err(e) = crate::attach::validate_plugins(&ctx.runtime, &plan, &label) {
        if req.cni_path.is_empty() {
            ex.notes.push(
                "only the config's binDir was searched for plugins: give the runtime's CNI bin directory with --cni-path (or CNI_PATH)"
                    .into(),
            );
        }
        ex.failure = Some(failure("plugins", e));
        return;
    }
    if let Err(e) = crate::pool_guard::check(ctx, &mut ApiInputs, &label, &plan) {
        ex.failure = Some(failure("poolOverlap", e));
        return;
    }
    ex.claims = claim_checks(ctx, &client, &me, &plan);
    if let Some(c) = ex.claims.iter().find(|c| c.state == "heldByOther") {
        ex.failure = Some(failure(
            "addressClaim",
            MetaError::AddressInUse {
                pod: label.clone(),
                network: c.network.clone(),
                address: c.address.clone(),
                holder: format!(
                    "pod {} (AddressClaim {})",
                    c.holder.as_deref().unwrap_or("?"),
                    c.claim
                ),
            },
        ));
        return;
    }
    ex.verdict = "ok";
}
