//! ADD: read (pod, NADs, devices) → plan → save the plan → attach with undo → report
//! (network-status, claims, event) → the default network's result.

use crate::attach;
use crate::context::{wait_ready, Ctx};
use crate::inputs::{self, Inputs};
use crate::k8s::{EventType, KubeClient};
use crate::plan::{self, PlannedAttachment};
use crate::pod::{PodIdentity, PodInfo};
use crate::report;
use crate::state::SavedPlan;
use plexus_conf::args::CniArgs;
use plexus_conf::error::{code, CniError};
use plexus_conf::version;
use plexus_delegates::skel::{AddOutput, CmdArgs};
use std::path::Path;

/// What ADD knows before it changes anything: the pod, its label for messages, the API client
/// and the plan.
struct Prepared {
    id: Option<PodIdentity>,
    client: Option<KubeClient>,
    pod: Option<PodInfo>,
    label: String,
    plan: Vec<PlannedAttachment>,
}

/// Run ADD with its inputs read from `inputs`.
pub fn add(ctx: &mut Ctx, inputs: &mut dyn Inputs, args: &CmdArgs) -> Result<AddOutput, CniError> {
    match prepare(ctx, inputs, args) {
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

/// The side-effect-free part of ADD: read the inputs, plan, check the plugins are installed.
fn prepare(ctx: &mut Ctx, inputs: &mut dyn Inputs, args: &CmdArgs) -> Result<Prepared, CniError> {
    let cni_args = CniArgs::parse(&args.args)?;
    let id = PodIdentity::from_args(&cni_args);
    wait_ready(&ctx.config)?;
    let client = if id.is_some() {
        inputs.client(ctx)?
    } else {
        None
    };
    let pod = match &id {
        Some(id) => inputs.pod(ctx, id)?,
        None => None,
    };
    let label = id
        .as_ref()
        .map(|p| format!("pod {}", p.key()))
        .unwrap_or_else(|| format!("container {}", args.container_id));
    let planned = inputs::read(ctx, inputs, pod.clone(), &label)
        .and_then(|read| {
            plan::for_pod(
                &ctx.config,
                &args.ifname,
                &cni_args,
                &args.container_id,
                &read,
            )
        })
        .and_then(|plan| attach::validate_plugins(&ctx.runtime, &plan, &label).map(|()| plan));
    let plan = match planned {
        Ok(plan) => plan,
        Err(e) => {
            // The pod author's mistakes (a missing NAD, a bad annotation) show on the pod.
            report::event(
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
            report::event(
                ctx,
                client.as_ref(),
                pod.as_ref(),
                EventType::Warning,
                "AddInterfaceFailed",
                &f.error.to_string(),
            );
            return Err(f.error);
        }
    };
    if let Err(report::StatusFailure(e)) =
        report::added(ctx, client.as_ref(), pod.as_ref(), &plan, &done)
    {
        // The attachments are fine but the pod would carry no status: undo and let the
        // runtime retry rather than leave a pod that looks single-homed.
        if attach::del_all(&ctx.runtime, &plan, &args.container_id, &args.netns, &label).is_ok() {
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
