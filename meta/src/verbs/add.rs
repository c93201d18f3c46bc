//! ADD: read (pod, NADs, devices) → plan → save the plan → attach with undo → report
//! (network-status, claims, event) → the default network's result.

use crate::attach;
use crate::context::{wait_ready, Ctx};
use crate::error::MetaError;
use crate::inputs::{self, Inputs};
use crate::k8s::{names, EventType, KubeClient};
use crate::plan::{self, PlannedAttachment};
use crate::pod::{PodIdentity, PodInfo};
use crate::report;
use crate::state::SavedPlan;
use plexus_conf::args::CniArgs;
use plexus_conf::error::{code, CniError};
use plexus_conf::k8s::selection::{DEFAULT_NETWORK_ANNOTATION, NETWORKS_ANNOTATION};
use plexus_conf::version;
use plexus_delegates::skel::{AddOutput, CmdArgs};
use plexus_delegates::timing;
use std::path::Path;

/// What ADD knows before it changes anything: the pod, its label for messages, the API client
/// and the plan.
struct Prepared {
    id: Option<PodIdentity>,
    client: Option<KubeClient>,
    pod: Option<PodInfo>,
    label: String,
    plan: Vec<PlannedAttachment>,
    /// The node's static-address lock, held until the plan is saved (crate::address_guard).
    guarded: crate::address_guard::Guarded,
}

/// Run ADD with its inputs read from `inputs`.
pub fn add(ctx: &mut Ctx, inputs: &mut dyn Inputs, args: &CmdArgs) -> Result<AddOutput, MetaError> {
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
fn prepare(ctx: &mut Ctx, inputs: &mut dyn Inputs, args: &CmdArgs) -> Result<Prepared, MetaError> {
    let phase = timing::phase("args");
    let cni_args = CniArgs::parse(&args.args).map_err(|source| MetaError::CniArgs {
        source: source.into(),
    })?;
    let id = PodIdentity::from_args(&cni_args);
    if let Some(id) = &id {
        check_pod_names(id)?;
    }
    wait_ready(&ctx.config)?;
    drop(phase);
    let client = if id.is_some() {
        inputs.client(ctx)?
    } else {
        None
    };
    let pod = match &id {
        Some(id) => {
            // Thin mode: the GET (its `pod_get` phase within); daemon mode: the cache.
            let _phase = timing::phase("pod_read");
            inputs.pod(ctx, id)?
        }
        None => None,
    };
    let label = id
        .as_ref()
        .map(|p| format!("pod {}", p.key()))
        .unwrap_or_else(|| format!("container {}", args.container_id));
    let planned = timed("inputs", || inputs::read(ctx, inputs, pod.clone(), &label))
        .and_then(|mut read| {
            let _phase = timing::phase("plan");
            crate::address_guard::complete_owner(ctx, client.as_ref(), &mut read)?;
            plan::for_pod(
                &ctx.config,
                &args.ifname,
                &cni_args,
                &args.container_id,
                &read,
            )
        })
        .and_then(|plan| {
            timed("nad_policy", || {
                crate::nad_guard::check(
                    &ctx.config.nad_policy,
                    pod.as_ref().map(|p| p.id.namespace.as_str()),
                    &label,
                    &plan,
                )
            })
            .map(|()| plan)
        })
        .and_then(|plan| {
            timed("plugin_check", || {
                attach::validate_plugins(&ctx.runtime, &plan, &label)
            })
            .map(|()| plan)
        })
        .and_then(|plan| {
            timed("pool_guard", || {
                crate::pool_guard::check(ctx, inputs, &label, &plan)
            })
            .map(|()| plan)
        })
        .and_then(|plan| {
            let _phase = timing::phase("address_guard");
            let node = node_of(pod.as_ref());
            crate::address_guard::check(ctx, client.as_ref(), id.as_ref(), node, &plan)
                .map(|lock| (plan, lock))
        });
    let (plan, guarded) = match planned {
        Ok(planned) => planned,
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
    if ctx.config.uninstalling {
        tell_networks_not_attached(ctx, client.as_ref(), pod.as_ref());
    }
    Ok(Prepared {
        id,
        client,
        pod,
        label,
        plan,
        guarded,
    })
}

/// On a node being uninstalled: a Warning event on a pod that asked for networks it does not
/// get (it gets the cluster network alone, as it would once plexus is gone).
fn tell_networks_not_attached(ctx: &mut Ctx, client: Option<&KubeClient>, pod: Option<&PodInfo>) {
    let Some(p) = pod else { return };
    let asked: Vec<String> = [NETWORKS_ANNOTATION, DEFAULT_NETWORK_ANNOTATION]
        .into_iter()
        .filter_map(|k| p.annotations.get(k).map(|v| format!("{k}={v}")))
        .collect();
    if asked.is_empty() {
        return;
    }
    let msg = format!(
        "plexus is being uninstalled from this node: pod {} gets its cluster network only; not attached: {}",
        p.id.key(),
        asked.join("; ")
    );
    tracing::warn!(pod = %p.id.key(), "{msg}");
    report::event(
        ctx,
        client,
        pod,
        EventType::Warning,
        "NetworksNotAttached",
        &msg,
    );
}

/// Run `f` as the phase `name` (the call's closing log line, [`timing`]).
/// The pod's node when the pod object was read (`spec.nodeName`), else empty.
fn node_of(pod: Option<&crate::pod::PodInfo>) -> &str {
    pod.and_then(|p| p.claims.as_ref())
        .map_or("", |c| c.node_name.as_str())
}

fn timed<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    let _phase = timing::phase(name);
    f()
}

/// Refuse a `K8S_POD_NAMESPACE` / `K8S_POD_NAME` that is not a Kubernetes name (code 4): it
/// would go into API paths (`/`, `?` or `..` address another object) and into messages.
fn check_pod_names(id: &PodIdentity) -> Result<(), MetaError> {
    let problem = names::namespace_problem(&id.namespace)
        .map(|why| ("K8S_POD_NAMESPACE", why))
        .or_else(|| names::name_problem(&id.name).map(|why| ("K8S_POD_NAME", why)));
    match problem {
        None => Ok(()),
        Some((key, why)) => Err(MetaError::CniArgs {
            source: Box::new(CniError::new(
                code::INVALID_ENV,
                format!("CNI_ARGS {key} is not a Kubernetes name"),
                why,
            )),
        }),
    }
}

/// The part of ADD that changes things: save the plan, attach with undo, report.
fn attach_planned(ctx: &mut Ctx, args: &CmdArgs, p: Prepared) -> Result<AddOutput, MetaError> {
    let Prepared {
        id,
        client,
        pod,
        label,
        plan,
        guarded,
    } = p;
    let crate::address_guard::Guarded {
        lock: address_lock,
        mut claimed,
    } = guarded;
    // From here on state is written, under the container lock.
    let lock = ctx.store.lock(&args.container_id)?;
    // A second ADD for an attachment that exists must change nothing (the spec: error out).
    if timed("plan_load", || {
        ctx.store.load(&args.container_id, &args.ifname)
    })
    .ok()
    .flatten()
    .is_some()
    {
        return Err(MetaError::AlreadyAttached {
            pod: label,
            container_id: args.container_id.clone(),
            ifname: args.ifname.clone(),
        });
    }
    timed("tombstone", || {
        ctx.store.clear_tombstone(&args.container_id, &args.ifname)
    });
    let mut saved = SavedPlan::new(
        &args.container_id,
        &args.ifname,
        &args.netns,
        id.clone(),
        plan.clone(),
    );
    saved.claims = claimed.clone();
    let durable = match ctx.store.save_for_add(&saved) {
        Ok(d) => d,
        Err(e) => {
            crate::address_guard::release(ctx, id.as_ref(), &claimed);
            return Err(e);
        }
    };
    drop(address_lock);
    timed("devinfo", || {
        crate::devices::devinfo::seed(&plan, Path::new(&ctx.config.device_info_dir))
    });
    let attached = attach::add_all(&ctx.runtime, &plan, &args.container_id, &args.netns, &label);
    // The plan's fsync ran alongside the delegates: it is on disk before the runtime hears of
    // the outcome, success or a failure whose plan stays for DEL (PlanStore::save_for_add).
    durable.wait();
    let done = match attached {
        Ok(d) => d,
        Err(e) => {
            // A clean rollback leaves nothing for the runtime's DEL to do; otherwise the
            // saved plan stays so that DEL retries the cleanup.
            if attach::rolled_back_cleanly(&e) {
                crate::devices::devinfo::remove(&plan);
                crate::address_guard::release(ctx, id.as_ref(), &claimed);
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
                &e.to_string(),
            );
            return Err(e);
        }
    };
    // host-local on a network spanning nodes: its addresses claimed, a duplicate warned of.
    let (pooled, duplicates) = timed("host_local_guard", || {
        crate::host_local_guard::check(
            ctx,
            client.as_ref(),
            id.as_ref(),
            node_of(pod.as_ref()),
            &plan,
            &done,
        )
    });
    for msg in &duplicates {
        report::event(
            ctx,
            client.as_ref(),
            pod.as_ref(),
            EventType::Warning,
            "AddressDuplicated",
            msg,
        );
    }
    if !pooled.is_empty() {
        saved.claims.extend(pooled.iter().cloned());
        claimed.extend(pooled);
        if let Err(e) = ctx.store.save(&saved) {
            tracing::warn!(error = %e, "host-local address claims not recorded in the plan: the next pod that wants them takes them over once this one is gone");
        }
    }
    let reported = timed("report", || {
        report::added(ctx, client.as_ref(), pod.as_ref(), &plan, &done)
    });
    if let Err(failure) = reported {
        // The attachments are fine but the pod would carry no status: undo and let the
        // runtime retry rather than leave a pod that looks single-homed.
        if attach::del_all(&ctx.runtime, &plan, &args.container_id, &args.netns, &label).is_ok() {
            crate::address_guard::release(ctx, id.as_ref(), &claimed);
            let _ = ctx.store.remove(&args.container_id, &args.ifname);
            ctx.store.finish_delete(&args.container_id, &args.ifname);
            drop(lock);
        }
        return Err(match failure {
            report::StatusFailure::Api(source) => MetaError::StatusWrite {
                pod: label,
                source: source.into(),
            },
            report::StatusFailure::NotSent(e) => *e,
        });
    }
    let default = done
        .iter()
        .find(|d| plan[d.index].is_default)
        .ok_or(MetaError::Internal {
            what: "no default network result",
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::files::FileInputs;
    use crate::verbs::check;
    use plexus_delegates::skel::Command;
    use std::os::unix::fs::PermissionsExt;

    /// A static-mode call (no pod, no API) with a stand-in default-network plugin.
    fn setup(extra: &str) -> (tempfile::TempDir, CmdArgs) {
        let t = tempfile::tempdir().unwrap();
        let bin = t.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let plugin = bin.join("fakebr");
        std::fs::write(
            &plugin,
            "#!/bin/sh\ncat >/dev/null\necho '{\"cniVersion\":\"1.0.0\"}'\n",
        )
        .unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = format!(
            r#"{{"cniVersion":"1.0.0","name":"p","type":"plexus","cniDir":"{}","binDir":"{}"{extra},
               "delegates":[{{"cniVersion":"1.0.0","name":"cbr0","type":"fakebr"}}]}}"#,
            t.path().join("state").display(),
            bin.display()
        );
        let args = CmdArgs {
            command: Command::Add,
            container_id: "c1".into(),
            netns: "/run/netns/plexus-never-existed".into(),
            ifname: "eth0".into(),
            args: "IgnoreUnknown=1".into(),
            path: vec![],
            stdin: config.into_bytes(),
        };
        (t, args)
    }

    fn run(args: &CmdArgs) -> (Ctx, Result<AddOutput, MetaError>) {
        let mut ctx = Ctx::new(args, None).unwrap();
        let out = add(&mut ctx, &mut FileInputs::default(), args);
        (ctx, out)
    }

    #[test]
    fn add_fails_with_what_went_wrong() {
        let (_t, args) = setup(
            r#","readinessindicatorfile":"/nonexistent/plexus-ready","readinessTimeoutSeconds":0"#,
        );
        let e = run(&args).1.unwrap_err();
        assert!(
            matches!(&e, MetaError::NotReady { file } if file.ends_with("plexus-ready")),
            "{e:?}"
        );
        assert_eq!(e.code(), 11);

        let (_t, mut args) = setup("");
        args.args = "K8S_POD_NAME".into();
        let e = run(&args).1.unwrap_err();
        assert!(matches!(e, MetaError::CniArgs { .. }), "{e:?}");
        assert_eq!(e.code(), 4);

        // The netns is gone: nothing ran, nothing is left, the runtime's DEL has nothing to do.
        let (_t, args) = setup("");
        let (ctx, out) = run(&args);
        let e = out.unwrap_err();
        assert!(matches!(e, MetaError::NetnsOpen { .. }), "{e:?}");
        assert_eq!(e.code(), 3);
        assert!(ctx.store.load("c1", "eth0").unwrap().is_none());
        assert!(ctx.store.deleted("c1", "eth0", true));

        // A second ADD of an attached container changes nothing.
        let (_t, args) = setup("");
        let (ctx, _) = run(&args);
        let saved = SavedPlan::new("c1", "eth0", "", None, vec![]);
        ctx.store.save(&saved).unwrap();
        let e = run(&args).1.unwrap_err();
        assert!(
            matches!(&e, MetaError::AlreadyAttached { pod, container_id, ifname }
                if pod == "container c1" && container_id == "c1" && ifname == "eth0"),
            "{e:?}"
        );
        assert_eq!(e.code(), 7);
        assert_eq!(ctx.store.load("c1", "eth0").unwrap(), Some(saved));

        // A pod name or namespace that would address another API object: refused before
        // anything runs (names from CNI_ARGS go into API paths).
        for (ns, name, key) in [
            ("db", "../../secrets/x", "K8S_POD_NAME"),
            ("db", "p?dryRun=All", "K8S_POD_NAME"),
            ("db/pods/other", "p", "K8S_POD_NAMESPACE"),
            ("..", "p", "K8S_POD_NAMESPACE"),
        ] {
            let (_t, mut args) = setup("");
            args.args = format!("K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}");
            let (ctx, out) = run(&args);
            let e = out.unwrap_err();
            assert!(matches!(e, MetaError::CniArgs { .. }), "{e:?}");
            assert_eq!(e.code(), 4);
            assert_eq!(e.msg(), format!("CNI_ARGS {key} is not a Kubernetes name"));
            assert!(e.details().contains("DNS-1123"), "{}", e.details());
            assert!(ctx.store.load("c1", "eth0").unwrap().is_none());
        }

        // CHECK without a plan.
        let (_t, args) = setup("");
        let mut ctx = Ctx::new(&args, None).unwrap();
        let e = check::check(&mut ctx, &args).unwrap_err();
        assert!(matches!(e, MetaError::NotAttached { .. }), "{e:?}");
        assert_eq!(e.code(), 3);
    }

    #[test]
    fn a_missing_plugin_is_found_before_anything_runs() {
        let (_t, mut args) = setup("");
        let cfg = String::from_utf8(args.stdin.clone())
            .unwrap()
            .replace("fakebr", "not-installed");
        args.stdin = cfg.into_bytes();
        let (ctx, out) = run(&args);
        let e = out.unwrap_err();
        assert!(
            matches!(&e, MetaError::PluginMissing { pod, network, .. } if pod == "container c1" && network == "cbr0"),
            "{e:?}"
        );
        assert_eq!(e.code(), 7);
        assert!(ctx.store.load("c1", "eth0").unwrap().is_none());
    }
}
