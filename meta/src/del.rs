//! DEL: undo everything from the plan saved at ADD, with no API request. Without a plan the
//! plan is rebuilt from the API when reachable, else from the static config, and cleanup still
//! runs. Repeated DELs succeed at once.
//!
//! When a delegate DEL fails the plan is kept and the error returned, so the runtime's retry
//! runs the same plan again. With `retryDeleteOnError` (Multus' name) that goes on until it
//! succeeds; without it plexus gives up after [`MAX_DEL_ATTEMPTS`] failed attempts, logs what
//! is left, and reports success so a broken delegate cannot keep a pod in Terminating forever.

use crate::add::{fetch_nads, fetch_pod};
use crate::attach;
use crate::context::Ctx;
use crate::plan::PlannedAttachment;
use crate::planner;
use crate::pod::PodIdentity;
use crate::state::SavedPlan;
use plexus_conf::args::CniArgs;
use plexus_conf::error::CniError;
use plexus_delegates::skel::CmdArgs;

/// Failed DEL attempts after which plexus stops retrying (without `retryDeleteOnError`).
pub const MAX_DEL_ATTEMPTS: u32 = 3;

/// Run DEL.
pub fn del(ctx: &mut Ctx, args: &CmdArgs) -> Result<(), CniError> {
    let cni_args = CniArgs::parse(&args.args).unwrap_or_default();
    let id = PodIdentity::from_args(&cni_args);
    let label = id
        .as_ref()
        .map(|p| format!("pod {}", p.key()))
        .unwrap_or_else(|| format!("container {}", args.container_id));
    if ctx.store.deleted(&args.container_id, &args.ifname) {
        tracing::debug!(container = %args.container_id, "already deleted");
        return Ok(());
    }
    let lock = ctx.store.lock(&args.container_id)?;
    // Another DEL may have finished while this one waited for the lock.
    if ctx.store.deleted(&args.container_id, &args.ifname) {
        return Ok(());
    }
    let saved = match ctx.store.load(&args.container_id, &args.ifname) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "unusable attachment plan; rebuilding it");
            None
        }
    };
    let mut record = match saved {
        Some(s) => s,
        None => match rebuild(ctx, args, &cni_args, id.as_ref(), &label) {
            Ok(p) => SavedPlan::new(&args.container_id, &args.ifname, &args.netns, id.clone(), p),
            Err(e) => {
                // Nothing is known about this container's networks: nothing to undo.
                tracing::warn!(error = %e, "no attachment plan and none can be rebuilt; nothing to delete");
                ctx.store.finish_delete(&args.container_id, &args.ifname);
                drop(lock);
                return Ok(());
            }
        },
    };
    match attach::del_all(
        &ctx.runtime,
        &record.attachments,
        &args.container_id,
        &args.netns,
        &label,
    ) {
        Ok(()) => {
            ctx.store.remove(&args.container_id, &args.ifname)?;
            ctx.store.finish_delete(&args.container_id, &args.ifname);
            drop(lock);
            Ok(())
        }
        Err(e) => {
            record.del_failures += 1;
            if !ctx.config.retry_delete_on_error && record.del_failures >= MAX_DEL_ATTEMPTS {
                tracing::error!(error = %e, attempts = record.del_failures,
                    "DEL keeps failing; giving up: what the failing delegates hold may be left behind");
                attach::forget_results(&ctx.runtime, &record.attachments, &args.container_id);
                ctx.store.remove(&args.container_id, &args.ifname)?;
                ctx.store.finish_delete(&args.container_id, &args.ifname);
                return Ok(());
            }
            ctx.store.save(&record)?;
            Err(e)
        }
    }
}

/// Rebuild a plan without a saved one: from the pod and NADs if the API answers quickly, else
/// from the static config only (the default network and static delegates).
fn rebuild(
    ctx: &mut Ctx,
    args: &CmdArgs,
    cni_args: &CniArgs,
    id: Option<&PodIdentity>,
    label: &str,
) -> Result<Vec<PlannedAttachment>, CniError> {
    tracing::info!(container = %args.container_id, "no saved plan: rebuilding it for DEL");
    let client = if id.is_some() {
        ctx.client().ok().flatten()
    } else {
        None
    };
    let pod = fetch_pod(ctx, client.as_ref(), id).ok().flatten();
    let requests = planner::requests(&ctx.config, pod.as_ref()).unwrap_or_default();
    let refs = planner::nad_refs(
        &requests,
        pod.as_ref().map(|p| p.id.namespace.as_str()).unwrap_or(""),
    );
    let nads = fetch_nads(ctx, client.as_ref(), &refs, label).unwrap_or_default();
    match planner::make_plan(
        &ctx.config,
        &args.ifname,
        cni_args,
        pod.as_ref(),
        &requests,
        &nads,
        None,
    ) {
        Ok(p) => Ok(p),
        Err(e) => {
            tracing::warn!(error = %e, "cannot rebuild the pod's extra networks; deleting the default network only");
            let fallback = planner::Requests {
                cluster: requests.cluster.clone(),
                ..Default::default()
            };
            planner::make_plan(
                &ctx.config,
                &args.ifname,
                cni_args,
                None,
                &fallback,
                &nads,
                None,
            )
        }
    }
}
