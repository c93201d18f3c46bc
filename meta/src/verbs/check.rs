//! CHECK, STATUS and GC: from the saved plans and the static config, no inputs stage.

use crate::attach;
use crate::context::Ctx;
use crate::error::MetaError;
use crate::plan::requests as planner;
use crate::plan::resolve::{self, NetRef};
use plexus_conf::netconf::NetConfList;
use plexus_delegates::skel::CmdArgs;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// CHECK every attachment of the container from its saved plan.
pub fn check(ctx: &mut Ctx, args: &CmdArgs) -> Result<(), MetaError> {
    let _lock = ctx.store.lock(&args.container_id)?;
    let plan = ctx
        .store
        .load(&args.container_id, &args.ifname)?
        .ok_or_else(|| MetaError::NotAttached {
            container_id: args.container_id.clone(),
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
fn default_network(ctx: &Ctx) -> Result<Option<NetConfList>, MetaError> {
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
        None => Ok(ctx
            .config
            .delegate_lists()
            .map_err(|source| MetaError::Config {
                source: source.into(),
            })?
            .into_iter()
            .next()),
    }
}

/// STATUS: ready when the readiness indicator file exists and the default network's STATUS passes.
pub fn status(ctx: &mut Ctx) -> Result<(), MetaError> {
    let f = &ctx.config.readiness_indicator_file;
    if !f.is_empty() && !Path::new(f).exists() {
        return Err(MetaError::StatusNotReady { file: f.into() });
    }
    if let Some(list) = default_network(ctx)? {
        for p in &list.plugins {
            plexus_delegates::find_plugin(p.plugin_type(), &ctx.runtime.search_path).map_err(
                |source| MetaError::StatusPluginMissing {
                    network: list.name.clone(),
                    source: source.into(),
                },
            )?;
        }
        ctx.runtime
            .status(&list)
            .map_err(|source| MetaError::StatusFailed {
                network: list.name.clone(),
                source: source.into(),
            })?;
    }
    Ok(())
}

/// A network to GC: its config, whether it is a default network, its valid attachments.
type NetworkGc = (NetConfList, bool, Vec<(String, String)>);

/// The valid-attachment list to send a network's GC, or `None` to skip it. Containers the
/// runtime lists as alive but plexus has no plan for (attached before plexus was installed, or
/// plan lost) hold the default network on the runtime's `(containerID, ifname)`; their other
/// attachments are unknown, so secondary networks are not GC'd while such containers exist.
pub fn gc_valid_list(
    is_default: bool,
    mut planned: Vec<(String, String)>,
    runtime_valid: &[(String, String)],
    plans: &[(String, String)],
) -> Option<Vec<(String, String)>> {
    let unknown: Vec<&(String, String)> = runtime_valid
        .iter()
        .filter(|v| !plans.contains(v))
        .collect();
    if is_default {
        planned.extend(unknown.into_iter().cloned());
        Some(planned)
    } else if unknown.is_empty() {
        Some(planned)
    } else {
        None
    }
}

/// GC: DEL every saved plan the runtime no longer lists as valid, then forward GC to every
/// known network with the attachments still valid on it.
pub fn gc(ctx: &mut Ctx, args: &CmdArgs) -> Result<(), MetaError> {
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
    // Per network: its config, whether it is some pod's default network, and the attachments
    // known valid on it.
    let mut per_network: BTreeMap<String, NetworkGc> = BTreeMap::new();
    let plans = ctx.store.all();
    for plan in &plans {
        let is_valid = valid
            .iter()
            .any(|(c, i)| *c == plan.container_id && *i == plan.ifname);
        if !is_valid {
            let lock = match ctx.store.lock(&plan.container_id) {
                Ok(l) => l,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let label = format!("container {}", plan.container_id);
            let res = attach::del_all(
                &ctx.runtime,
                &plan.attachments,
                &plan.container_id,
                "",
                &label,
            )
            .and_then(|()| ctx.store.remove(&plan.container_id, &plan.ifname));
            if res.is_ok() {
                crate::devices::devinfo::remove(&plan.attachments);
            }
            match res {
                Ok(()) => ctx.store.finish_delete(&plan.container_id, &plan.ifname),
                Err(e) => errors.push(e),
            }
            drop(lock);
            continue;
        }
        for a in &plan.attachments {
            if let Ok(list) = a.list() {
                let entry = per_network
                    .entry(list.name.clone())
                    .or_insert_with(|| (list, false, Vec::new()));
                entry.1 |= a.is_default;
                entry.2.push((plan.container_id.clone(), a.ifname.clone()));
            }
        }
    }
    if let Ok(Some(list)) = default_network(ctx) {
        per_network
            .entry(list.name.clone())
            .or_insert_with(|| (list, true, Vec::new()))
            .1 = true;
    }
    let valid_plans: Vec<(String, String)> = plans
        .iter()
        .map(|p| (p.container_id.clone(), p.ifname.clone()))
        .collect();
    for (name, (list, is_default, attachments)) in per_network {
        match gc_valid_list(is_default, attachments, &valid, &valid_plans) {
            Some(attachments) => {
                if let Err(source) = ctx.runtime.gc(&list, &attachments) {
                    errors.push(MetaError::Delegate {
                        source: source.into(),
                    });
                }
            }
            None => {
                tracing::info!(network = %name, "GC skipped: some valid containers have no plan")
            }
        }
    }
    MetaError::combine(errors).map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::gc_valid_list;

    fn p(c: &str, i: &str) -> (String, String) {
        (c.to_string(), i.to_string())
    }

    #[test]
    fn gc_never_drops_containers_plexus_does_not_know() {
        let runtime = vec![p("a", "eth0"), p("old", "eth0")];
        let plans = vec![p("a", "eth0")];
        // Default network: plan entries plus the runtime's unknown containers.
        assert_eq!(
            gc_valid_list(true, vec![p("a", "eth0")], &runtime, &plans),
            Some(vec![p("a", "eth0"), p("old", "eth0")])
        );
        // Secondary network: skipped while an unknown container may hold it.
        assert_eq!(
            gc_valid_list(false, vec![p("a", "net1")], &runtime, &plans),
            None
        );
        // Everything known: the plan entries as they are.
        assert_eq!(
            gc_valid_list(false, vec![p("a", "net1")], &runtime[..1], &plans),
            Some(vec![p("a", "net1")])
        );
    }
}
