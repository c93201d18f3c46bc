//! ADD: pod → plan → save plan → attach (undo on failure) → network-status + event → the default
//! network's result.

use crate::attach::{self, Attached};
use crate::context::{wait_ready, Ctx};
use crate::k8s::{EventType, KubeClient, PodRef};
use crate::plan::PlannedAttachment;
use crate::planner::{self, NadMap};
use crate::pod::{PodIdentity, PodInfo};
use crate::resolve::NadData;
use crate::state::SavedPlan;
use plexus_conf::args::CniArgs;
use plexus_conf::error::{code, CniError};
use plexus_conf::k8s::network_status::{statuses_from_result, to_annotation, NetworkStatus};
use plexus_conf::version;
use plexus_delegates::skel::{AddOutput, CmdArgs};
use std::path::Path;

/// The runtime capability carrying the pod's annotations (containerd, CRI-O).
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";

/// The pod from what the runtime passed, without an API request: when plexus' config declares
/// the `io.kubernetes.cri.pod-annotations` capability the runtime hands over the annotations,
/// and `K8S_POD_UID` identifies the pod (the status PATCH carries it as a precondition).
pub fn pod_from_runtime(
    config: &plexus_conf::plexus_config::PlexusConfig,
    id: Option<&PodIdentity>,
) -> Option<PodInfo> {
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
    })
}

/// Fetch the pod (bounded retry). `Ok(None)`: no API, no pod identity, or the pod is gone.
pub fn fetch_pod(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    id: Option<&PodIdentity>,
) -> Result<Option<PodInfo>, CniError> {
    let (Some(client), Some(id)) = (client, id) else {
        return Ok(None);
    };
    let policy = client.options().retry;
    let uid = (!id.uid.is_empty()).then_some(id.uid.as_str());
    let got = ctx.block_on(client.get_pod(&id.namespace, &id.name, uid, policy))?;
    match got {
        Ok(Some(pod)) => Ok(Some(PodInfo {
            id: PodIdentity {
                uid: pod.metadata.uid.clone().unwrap_or_else(|| id.uid.clone()),
                ..id.clone()
            },
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            claims: Some(crate::pod::PodClaims::from_pod(&pod)),
        })),
        Ok(None) => {
            tracing::warn!(pod = %id.key(), "pod not found (deleted during ADD?): attaching the default network only");
            Ok(None)
        }
        Err(e) => Err(CniError::new(
            e.cni_code(),
            format!("pod {}: cannot read the pod", id.key()),
            e.to_string(),
        )),
    }
}

/// Fetch NADs concurrently into a map.
pub fn fetch_nads(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    refs: &[(String, String)],
    pod: &str,
) -> Result<NadMap, CniError> {
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
                map.insert(
                    rf.clone(),
                    nad.map(|n| NadData {
                        config: n.config().unwrap_or_default().to_string(),
                        resource_name: n.resource_name().map(str::to_string),
                    }),
                );
            }
            Err(e) => {
                return Err(CniError::new(
                    e.cni_code(),
                    format!(
                        "{pod}, network {}/{}: cannot read the NetworkAttachmentDefinition",
                        rf.0, rf.1
                    ),
                    e.to_string(),
                ))
            }
        }
    }
    Ok(map)
}

fn summary(plan: &[PlannedAttachment], done: &[Attached]) -> String {
    done.iter()
        .map(|d| {
            let a = &plan[d.index];
            let ips: Vec<&str> = d.result.ips.iter().map(|i| i.address.as_str()).collect();
            format!("{} [{}] from {}", a.ifname, ips.join(","), a.network)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The network-status entries for a finished ADD.
pub fn network_status(plan: &[PlannedAttachment], done: &[Attached]) -> Vec<NetworkStatus> {
    done.iter()
        .flat_map(|d| {
            let a = &plan[d.index];
            let info = device_info(a);
            statuses_from_result(&a.network, &d.result, a.is_default, info.as_ref())
        })
        .collect()
}

/// NPWG device-info for an attachment that uses a device: its device-info file as the
/// delegate left it, else a `pci` document for the PCI address in its config (the NAD's, or
/// the allocated device). DPDK applications read their VF's address from it.
pub fn device_info(a: &PlannedAttachment) -> Option<serde_json::Value> {
    crate::devices::devinfo::read(a)
}

/// What ADD knows before it changes anything: the pod, its label for messages, the API client
/// and the plan.
struct Prepared {
    id: Option<PodIdentity>,
    client: Option<KubeClient>,
    pod: Option<PodInfo>,
    label: String,
    plan: Vec<PlannedAttachment>,
}

/// Run ADD.
pub fn add(ctx: &mut Ctx, args: &CmdArgs) -> Result<AddOutput, CniError> {
    match prepare(ctx, args) {
        Ok(p) => attach_planned(ctx, args, p),
        Err(e) => {
            forget_unstarted_add(ctx, args);
            Err(e)
        }
    }
}

/// An ADD that failed before running anything leaves nothing to delete: mark the container
/// deleted, so the runtime's DEL that follows returns at once instead of rebuilding a plan
/// that may not even run (a missing plugin). Skipped when the container already has state
/// (a repeated ADD must not hide the first one's attachments from DEL).
fn forget_unstarted_add(ctx: &Ctx, args: &CmdArgs) {
    let Ok(lock) = ctx.store.lock(&args.container_id) else {
        return;
    };
    let has_plan = !matches!(ctx.store.load(&args.container_id, &args.ifname), Ok(None));
    let has_results = ctx
        .runtime
        .cache
        .as_ref()
        .is_some_and(|c| !c.list_container(&args.container_id).is_empty());
    if !has_plan && !has_results {
        ctx.store.finish_delete(&args.container_id, &args.ifname);
    }
    drop(lock);
}

/// The side-effect-free part of ADD: pod, NADs, devices, plan, plugin presence.
fn prepare(ctx: &mut Ctx, args: &CmdArgs) -> Result<Prepared, CniError> {
    let cni_args = CniArgs::parse(&args.args)?;
    let id = PodIdentity::from_args(&cni_args);
    wait_ready(&ctx.config)?;
    let client = if id.is_some() { ctx.client()? } else { None };
    let pod = match pod_from_runtime(&ctx.config, id.as_ref()).filter(|_| client.is_some()) {
        Some(p) => Some(p),
        None => fetch_pod(ctx, client.as_ref(), id.as_ref())?,
    };
    let label = id
        .as_ref()
        .map(|p| format!("pod {}", p.key()))
        .unwrap_or_else(|| format!("container {}", args.container_id));
    let plan = match plan_pod(ctx, args, &cni_args, client.as_ref(), pod.as_ref(), &label) {
        Ok(plan) => plan,
        Err(e) => {
            // The pod author's mistakes (a missing NAD, a bad annotation) show on the pod.
            post_event(
                ctx,
                client.as_ref(),
                pod.as_ref(),
                EventType::Warning,
                "AddInterfaceFailed",
                &e.to_string(),
            );
            return Err(e);
        }
    };
    Ok(Prepared {
        id,
        client,
        pod,
        label,
        plan,
    })
}

/// The pod's attachment plan: its networks resolved, devices looked up, plugins present.
fn plan_pod(
    ctx: &mut Ctx,
    args: &CmdArgs,
    cni_args: &CniArgs,
    client: Option<&KubeClient>,
    pod: Option<&PodInfo>,
    label: &str,
) -> Result<Vec<PlannedAttachment>, CniError> {
    let requests = planner::requests(&ctx.config, pod)?;
    let refs = planner::nad_refs(
        &requests,
        pod.map(|p| p.id.namespace.as_str()).unwrap_or(""),
    );
    let nads = fetch_nads(ctx, client, &refs, label)?;
    // Device networks: ask the kubelet (device plugins) and the pod's DRA claims what was
    // allocated, only when a NAD names a resource.
    let wanted: std::collections::BTreeSet<String> = nads
        .values()
        .flatten()
        .filter_map(|n| n.resource_name.clone())
        .collect();
    let (devices, dra_devices) = match (wanted.is_empty(), pod) {
        (false, Some(p)) => {
            let (map, found) = crate::devices::allocated(ctx, client, p, &wanted)?;
            (Some(map), found)
        }
        _ => (None, Vec::new()),
    };
    let mut plan = planner::make_plan(
        &ctx.config,
        &args.ifname,
        cni_args,
        pod,
        &requests,
        &nads,
        devices.as_ref(),
    )?;
    crate::devices::annotate(
        &mut plan,
        &dra_devices,
        std::path::Path::new(&ctx.config.device_info_dir),
        &args.container_id,
    );
    attach::validate_plugins(&ctx.runtime, &plan, label)?;
    Ok(plan)
}

/// The part of ADD that changes things: save the plan, attach with undo, report.
fn attach_planned(ctx: &mut Ctx, args: &CmdArgs, p: Prepared) -> Result<AddOutput, CniError> {
    let Prepared {
        id,
        client,
        pod,
        label,
        plan,
    } = p;
    // From here on state is written, under the container lock.
    let lock = ctx.store.lock(&args.container_id)?;
    // A second ADD for an attachment that exists must change nothing (the spec: error out).
    if ctx
        .store
        .load(&args.container_id, &args.ifname)
        .ok()
        .flatten()
        .is_some()
    {
        return Err(CniError::invalid_config(
            format!(
                "{label}: container {} already has its networks attached on {}",
                args.container_id, args.ifname
            ),
            "DEL it first; the runtime must not ADD twice without a DEL",
        ));
    }
    ctx.store.clear_tombstone(&args.container_id, &args.ifname);
    ctx.store.save(&SavedPlan::new(
        &args.container_id,
        &args.ifname,
        &args.netns,
        id.clone(),
        plan.clone(),
    ))?;
    crate::devices::devinfo::seed(&plan, Path::new(&ctx.config.device_info_dir));
    let done = match attach::add_all(&ctx.runtime, &plan, &args.container_id, &args.netns, &label) {
        Ok(d) => d,
        Err(f) => {
            // A clean rollback leaves nothing for the runtime's DEL to do; otherwise the
            // saved plan stays so that DEL retries the cleanup.
            if f.clean {
                crate::devices::devinfo::remove(&plan);
                let _ = ctx.store.remove(&args.container_id, &args.ifname);
                ctx.store.finish_delete(&args.container_id, &args.ifname);
                drop(lock);
            }
            let msg = f.error.to_string();
            post_event(
                ctx,
                client.as_ref(),
                pod.as_ref(),
                EventType::Warning,
                "AddInterfaceFailed",
                &msg,
            );
            return Err(f.error);
        }
    };
    if let (Some(client), Some(p)) = (client.as_ref(), pod.as_ref()) {
        let status = to_annotation(&network_status(&plan, &done));
        let res = ctx.block_on(client.set_network_status(
            &p.id.namespace,
            &p.id.name,
            &p.id.uid,
            &status,
        ))?;
        match res {
            Ok(()) => {}
            Err(e) if e.is_not_found() || matches!(e, crate::k8s::K8sError::PodReplaced { .. }) => {
                tracing::warn!(pod = %p.id.key(), error = %e, "network-status not written: the pod is gone");
            }
            Err(e) => {
                // The attachments are fine but the pod would carry no status: undo and let the
                // runtime retry rather than leave a pod that looks single-homed.
                if attach::del_all(&ctx.runtime, &plan, &args.container_id, &args.netns, &label)
                    .is_ok()
                {
                    let _ = ctx.store.remove(&args.container_id, &args.ifname);
                    ctx.store.finish_delete(&args.container_id, &args.ifname);
                    drop(lock);
                }
                return Err(CniError::new(
                    e.cni_code(),
                    format!("{label}: cannot write the network-status annotation"),
                    e.to_string(),
                ));
            }
        }
    }
    if let Some(client) = client.as_ref() {
        crate::devices::claims::write_network_data(ctx, client, &plan, &done);
    }
    post_event(
        ctx,
        client.as_ref(),
        pod.as_ref(),
        EventType::Normal,
        "AddedInterface",
        &format!("Added {}", summary(&plan, &done)),
    );
    let default = done
        .iter()
        .find(|d| plan[d.index].is_default)
        .ok_or_else(|| CniError::new(code::INTERNAL, "no default network result", ""))?;
    let cni_version = if ctx.config.cni_version.is_empty() {
        version::CURRENT.to_string()
    } else {
        ctx.config.cni_version.clone()
    };
    Ok(AddOutput {
        result: default.result.clone(),
        cni_version,
    })
}

fn post_event(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    pod: Option<&PodInfo>,
    t: EventType,
    reason: &str,
    msg: &str,
) {
    if !ctx.config.events {
        return;
    }
    let (Some(client), Some(p)) = (client, pod) else {
        return;
    };
    let r = PodRef {
        ns: p.id.namespace.clone(),
        name: p.id.name.clone(),
        uid: p.id.uid.clone(),
    };
    if let Ok(Err(e)) = ctx.block_on(client.post_event(&r, t, reason, msg)) {
        tracing::warn!(pod = %p.id.key(), error = %e, "event not posted");
    }
}
