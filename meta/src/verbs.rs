//! CHECK, STATUS and GC.

use crate::attach;
use crate::context::Ctx;
use crate::planner;
use crate::resolve::{self, NetRef};
use plexus_conf::error::{code, CniError};
use plexus_conf::netconf::NetConfList;
use plexus_delegates::chain::combine;
use plexus_delegates::skel::CmdArgs;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// CHECK every attachment of the container from its saved plan.
pub fn check(ctx: &mut Ctx, args: &CmdArgs) -> Result<(), CniError> {
    let _lock = ctx.store.lock(&args.container_id)?;
    let plan = ctx
        .store
        .load(&args.container_id, &args.ifname)?
        .ok_or_else(|| {
            CniError::new(
                code::UNKNOWN_CONTAINER,
                format!("container {}: no attachments recorded", args.container_id),
                "CHECK needs a successful ADD first",
            )
        })?;
    let label = plan
        .pod
        .as_ref()
        .map(|p| format!("pod {}", p.key()))
        .unwrap_or_else(|| format!("container {}", args.container_id));
    attach::check_all(
        &ctx.runtime,
        &plan.attachments,
        &args.container_id,
        &args.netns,
        &label,
    )
}

/// The default network's config when it can be known without a pod (file, confDir name or
/// static delegate); a NAD-only default network needs the API and yields `None`.
fn default_network(ctx: &Ctx) -> Result<Option<NetConfList>, CniError> {
    let r = planner::requests(&ctx.config, None)?;
    match &r.cluster {
        Some(NetRef::Path(p)) => resolve::load_path(p).map(Some),
        Some(NetRef::Nad {
            name,
            conf_fallback: true,
            ..
        }) => Ok(plexus_conf::k8s::nad::find_by_name(
            name,
            &resolve::read_conf_dir(ctx.conf_dir()),
        )),
        Some(_) => Ok(None),
        None => Ok(ctx.config.delegate_lists()?.into_iter().next()),
    }
}

/// STATUS: ready when the readiness indicator file exists and the default network's STATUS passes.
pub fn status(ctx: &mut Ctx) -> Result<(), CniError> {
    let f = &ctx.config.readiness_indicator_file;
    if !f.is_empty() && !Path::new(f).exists() {
        return Err(CniError::new(
            code::NOT_AVAILABLE,
            "the default network is not ready",
            format!("readiness indicator file {f} does not exist"),
        ));
    }
    if let Some(list) = default_network(ctx)? {
        ctx.runtime.status(&list).map_err(|e| {
            CniError::new(
                e.code,
                format!("default network {}: {}", list.name, e.msg),
                e.details,
            )
        })?;
    }
    Ok(())
}

/// GC: DEL every saved plan the runtime no longer lists as valid, then forward GC to every
/// known network with the attachments still valid on it.
pub fn gc(ctx: &mut Ctx, args: &CmdArgs) -> Result<(), CniError> {
    let stdin: Value = serde_json::from_slice(&args.stdin).unwrap_or(Value::Null);
    let key = if stdin.get("cni.dev/valid-attachments").is_some() {
        "cni.dev/valid-attachments"
    } else {
        "cni.dev/attachments"
    };
    let valid: Vec<(String, String)> = stdin
        .get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| {
                    Some((
                        v.get("containerID")?.as_str()?.to_string(),
                        v.get("ifname")?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut errors = Vec::new();
    let mut per_network: BTreeMap<String, (NetConfList, Vec<(String, String)>)> = BTreeMap::new();
    for plan in ctx.store.all() {
        let is_valid = valid
            .iter()
            .any(|(c, i)| *c == plan.container_id && *i == plan.ifname);
        if !is_valid {
            let lock = ctx.store.lock(&plan.container_id)?;
            let label = format!("container {}", plan.container_id);
            match attach::del_all(
                &ctx.runtime,
                &plan.attachments,
                &plan.container_id,
                "",
                &label,
            ) {
                Ok(()) => {
                    ctx.store.remove(&plan.container_id, &plan.ifname)?;
                    drop(lock);
                    ctx.store.finish_delete(&plan.container_id, &plan.ifname);
                }
                Err(e) => errors.push(e),
            }
            continue;
        }
        for a in &plan.attachments {
            if let Ok(list) = a.list() {
                let entry = per_network
                    .entry(list.name.clone())
                    .or_insert_with(|| (list, Vec::new()));
                entry.1.push((plan.container_id.clone(), a.ifname.clone()));
            }
        }
    }
    if let Ok(Some(list)) = default_network(ctx) {
        per_network
            .entry(list.name.clone())
            .or_insert_with(|| (list, Vec::new()));
    }
    for (_, (list, attachments)) in per_network {
        if let Err(e) = ctx.runtime.gc(&list, &attachments) {
            errors.push(e);
        }
    }
    combine(errors).map_or(Ok(()), Err)
}
