//! DEL: undo everything from the plan saved at ADD, with no API request (the inputs stage is
//! skipped; the report stage only releases DRA claims' network data). Without a usable plan
//! the networks are taken from the delegates' result cache (each entry holds the exact config
//! its network was added with) and from a plan rebuilt from the API when it answers at once (one
//! attempt, no retry budget: [`Inputs::pod_quick`]), else from the static config; cleanup still
//! runs. Repeated DELs succeed at once.
//!
//! When a delegate DEL fails the plan is kept and the error returned, so the runtime's retry
//! runs the same plan again. With `retryDeleteOnError` (Multus' name) that goes on until it
//! succeeds; without it plexus gives up once [`MAX_DEL_ATTEMPTS`] attempts have failed **and**
//! [`GIVE_UP_AFTER`] has passed since the first failure, logs what is left, and reports success
//! so a broken delegate cannot keep a pod in Terminating forever. The time floor matters: the
//! kubelet makes three attempts within about 15 s, and an API server outage of that length
//! (calico-ipam keeps its leases in the API) must not turn into leaked addresses.
//!
//! A state directory that cannot be written never stops the cleanup: DEL reads the plan and
//! runs the delegates without its lock, then reports the I/O failure (code 5).

use crate::attach;
use crate::context::Ctx;
use crate::error::MetaError;
use crate::inputs::Inputs;
use crate::plan::requests as planner;
use crate::plan::PlannedAttachment;
use crate::pod::PodIdentity;
use crate::state::SavedPlan;
use plexus_conf::args::CniArgs;
use plexus_conf::error::code;
use plexus_delegates::cache::CachedAttachment;
use plexus_delegates::netns::NetNs;
use plexus_delegates::skel::CmdArgs;
use std::path::Path;

/// Failed DEL attempts after which plexus may stop retrying (without `retryDeleteOnError`).
pub const MAX_DEL_ATTEMPTS: u32 = 3;

/// How long after the first failed DEL attempt plexus keeps failing DEL (so the runtime
/// retries) before it may give up (without `retryDeleteOnError`).
pub const GIVE_UP_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// Seconds since the Unix epoch.
fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether a DEL that failed `failures` times, first at `first` (Unix seconds), may give up at
/// `now`.
fn may_give_up(failures: u32, first: u64, now: u64) -> bool {
    failures >= MAX_DEL_ATTEMPTS && now.saturating_sub(first) >= GIVE_UP_AFTER.as_secs()
}

/// Whether `netns` names a network namespace that can be entered now.
fn usable(netns: &str) -> bool {
    !netns.is_empty() && NetNs::open(netns).is_ok()
}

/// The namespace DEL works in: the runtime's when it gave one, else the one recorded at ADD
/// while it still exists (the runtime's later DELs carry an empty `CNI_NETNS`, and may run
/// before the one that carries it).
fn pick_netns(given: &str, recorded: &str) -> String {
    if !given.is_empty() || !usable(recorded) {
        given.to_string()
    } else {
        recorded.to_string()
    }
}

/// Run DEL, then release the address claims earlier DELs of this node could not (the API
/// server was down): the runtime's repeated DELs of every pod are what retries them in thin mode.
pub fn del(ctx: &mut Ctx, inputs: &mut dyn Inputs, args: &CmdArgs) -> Result<(), MetaError> {
    let out = del_container(ctx, inputs, args);
    crate::address_guard::release_pending(ctx);
    out
}

/// Delete this container's attachments.
fn del_container(ctx: &mut Ctx, inputs: &mut dyn Inputs, args: &CmdArgs) -> Result<(), MetaError> {
    let cni_args = CniArgs::parse(&args.args).unwrap_or_default();
    let id = PodIdentity::from_args(&cni_args);
    let label = id
        .as_ref()
        .map(|p| format!("pod {}", p.key()))
        .unwrap_or_else(|| format!("container {}", args.container_id));
    let has_netns = usable(&args.netns);
    if ctx
        .store
        .deleted(&args.container_id, &args.ifname, has_netns)
    {
        tracing::debug!(container = %args.container_id, "already deleted");
        return Ok(());
    }
    // The lock serialises this DEL with ADD, GC and the runtime's other DELs; a state
    // directory where it cannot be created must not stop the cleanup.
    let lock = match ctx.store.lock(&args.container_id) {
        Ok(l) => Some(l),
        Err(e) if e.code() == code::IO_FAILURE => {
            tracing::error!(error = %e, "DEL continues without the plexus lock");
            None
        }
        Err(e) => return Err(e),
    };
    // Another DEL may have finished while this one waited for the lock (and removed the lock
    // file, which this one's wait re-created).
    if ctx
        .store
        .deleted(&args.container_id, &args.ifname, has_netns)
    {
        ctx.store.drop_lock_file(&args.container_id);
        return Ok(());
    }
    let saved = match ctx.store.load(&args.container_id, &args.ifname) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "unusable attachment plan; rebuilding it");
            None
        }
    };
    // The plan is saved before any delegate runs: an ADD that ran some left one. Each delegate
    // that finished its ADD left a cached result, so only a plan with an attachment but no
    // cached result can have an interrupted delegate (and its children) still running: the
    // /proc scan stays off the common DEL path.
    let interrupted = saved
        .as_ref()
        .filter(|s| lock.is_some() && !s.netns.is_empty())
        .filter(|s| add_may_have_been_interrupted(ctx, &args.container_id, s));
    if let Some(s) = interrupted {
        kill_orphaned_adds(Path::new("/proc"), &args.container_id, &s.netns);
    }
    // Only with a result cache does a missing result tell an interrupted ADD apart.
    let interrupted = interrupted.is_some() && ctx.runtime.cache.is_some();
    let (mut record, netns) = match saved {
        Some(s) => {
            let netns = pick_netns(&args.netns, &s.netns);
            (s, netns)
        }
        None => {
            let cached = ctx
                .runtime
                .cache
                .as_ref()
                .map(|c| c.list_container(&args.container_id))
                .unwrap_or_default();
            let rebuilt = rebuild(ctx, inputs, args, &cni_args, id.as_ref(), &label)
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "cannot rebuild the attachment plan");
                    Vec::new()
                });
            let attachments = merge(&args.ifname, &cached, rebuilt);
            let recorded = cached
                .iter()
                .map(|c| c.netns.as_str())
                .find(|n| !n.is_empty())
                .unwrap_or("");
            let netns = pick_netns(&args.netns, recorded);
            if attachments.is_empty() {
                tracing::warn!("no attachment plan, no cached results and none can be rebuilt: nothing to delete");
                ctx.store.finish_delete(&args.container_id, &args.ifname);
                return Ok(());
            }
            let record = SavedPlan::new(
                &args.container_id,
                &args.ifname,
                recorded,
                id.clone(),
                attachments,
            );
            (record, netns)
        }
    };
    // With no namespace at all (none given, none recorded) the pod's interfaces, if any, were
    // out of reach: later DELs that carry a namespace must still run.
    let reached_everything = !netns.is_empty() || !record.netns.is_empty();
    match attach::del_all(
        &ctx.runtime,
        &record.attachments,
        &args.container_id,
        &netns,
        &label,
    ) {
        Ok(()) => {
            if interrupted {
                del_again_after_settling(ctx, &record, &args.container_id, &netns, &label);
            }
            crate::devices::devinfo::remove(&record.attachments);
            crate::report::claims::release_network_data(ctx, &record.attachments);
            crate::address_guard::release(ctx, record.pod.as_ref(), &record.claims);
            finish(ctx, args, &label, reached_everything)
        }
        Err(e) => {
            record.del_failures += 1;
            let now = now_unix();
            let first = *record.first_del_failure.get_or_insert(now);
            if !ctx.config.retry_delete_on_error && may_give_up(record.del_failures, first, now) {
                tracing::error!(error = %e, attempts = record.del_failures,
                    "DEL keeps failing; giving up: what the failing delegates hold may be left behind");
                attach::forget_results(&ctx.runtime, &record.attachments, &args.container_id);
                crate::devices::devinfo::remove(&record.attachments);
                crate::address_guard::release(ctx, record.pod.as_ref(), &record.claims);
                return finish(ctx, args, &label, true);
            }
            if let Err(save) = ctx.store.save(&record) {
                tracing::error!(error = %save, "cannot record the failed DEL attempt");
            }
            drop(lock);
            Err(e)
        }
    }
}

/// How long a DEL after an interrupted ADD waits before it runs the delegates' DEL once more.
pub const INTERRUPTED_ADD_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// After an interrupted ADD (its plexus or daemon killed mid-delegate), the killed delegates'
/// last API writes can still land after the first DEL: a request the API server had received
/// is carried out though its client is gone, and on a loaded server that takes a while. A CI
/// run on a loaded host leaked one calico IPAM handle after the daemon was SIGKILLed under
/// churn (not reproduced since; this is the likely way). So this rare path settles, then
/// deletes once more (DEL is idempotent); a failure then is logged, the first DEL having
/// succeeded.
fn del_again_after_settling(
    ctx: &Ctx,
    record: &SavedPlan,
    container_id: &str,
    netns: &str,
    label: &str,
) {
    std::thread::sleep(INTERRUPTED_ADD_SETTLE);
    if let Err(e) = attach::del_all(
        &ctx.runtime,
        &record.attachments,
        container_id,
        netns,
        label,
    ) {
        tracing::warn!(error = %e, "second DEL after an interrupted ADD failed");
    } else {
        tracing::info!(container = %container_id, "deleted again after an interrupted ADD");
    }
}

/// Whether some attachment of `saved` has no cached result (its delegate's ADD did not finish,
/// or no result cache is kept): only then can an interrupted ADD have left processes behind.
fn add_may_have_been_interrupted(ctx: &Ctx, container_id: &str, saved: &SavedPlan) -> bool {
    let Some(cache) = ctx.runtime.cache.as_ref() else {
        return true;
    };
    let cached = cache.list_container(container_id);
    saved
        .attachments
        .iter()
        .any(|a| !cached.iter().any(|c| c.if_name == a.ifname))
}

/// Kill what is left of an ADD for this container whose plexus died (SIGKILL, OOM kill): the
/// delegates themselves die with plexus (parent-death signal), but their own children — an IPAM
/// plugin — do not, and would finish the ADD after this DEL (a leaked lease). Under the
/// container lock no live ADD of this plexus runs, so every process whose environment has
/// `CNI_COMMAND=ADD`, this `CNI_CONTAINERID` and the `CNI_NETNS` the ADD recorded is such an
/// orphan (the netns keeps another plexus' calls — another `cniDir`, a test — out of it).
/// Returns how many were killed.
fn kill_orphaned_adds(proc_root: &Path, container_id: &str, netns: &str) -> usize {
    let _phase = plexus_delegates::timing::phase("orphan_scan");
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return 0;
    };
    let me = std::process::id();
    let want_id = format!("CNI_CONTAINERID={container_id}");
    let want_netns = format!("CNI_NETNS={netns}");
    let mut killed = Vec::new();
    for pid in entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| u32::try_from(*pid).ok() != Some(me))
    {
        let Ok(env) = std::fs::read(proc_root.join(pid.to_string()).join("environ")) else {
            continue;
        };
        let mut vars = env.split(|b| *b == 0);
        let (mut add, mut ours, mut same_netns) = (false, false, false);
        for v in &mut vars {
            add |= v == b"CNI_COMMAND=ADD";
            ours |= v == want_id.as_bytes();
            same_netns |= v == want_netns.as_bytes();
        }
        if add && ours && same_netns {
            let target = nix::unistd::Pid::from_raw(pid);
            if nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL).is_ok() {
                killed.push(pid);
            }
        }
    }
    if !killed.is_empty() {
        tracing::warn!(container = %container_id, pids = ?killed,
            "killed what an interrupted ADD left running, before deleting");
        // Let the kernel tear them down (their files and locks) before the delegates' DEL.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline
            && killed.iter().any(|p| {
                std::fs::read_to_string(proc_root.join(p.to_string()).join("stat"))
                    .is_ok_and(|s| !s.contains(") Z "))
            })
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    killed.len()
}

/// After every delegate DEL succeeded: drop the plan and leave a tombstone, but only when
/// nothing known is left (no plan, no cached result); otherwise report the I/O failure so the
/// runtime retries once the state directory is fixed.
fn finish(
    ctx: &mut Ctx,
    args: &CmdArgs,
    label: &str,
    reached_everything: bool,
) -> Result<(), MetaError> {
    let removed = ctx.store.remove(&args.container_id, &args.ifname);
    let left: Vec<String> = ctx
        .runtime
        .cache
        .as_ref()
        .map(|c| c.list_container(&args.container_id))
        .unwrap_or_default()
        .into_iter()
        .map(|c| format!("{} ({})", c.network_name, c.if_name))
        .collect();
    if let Err(e) = removed {
        return Err(MetaError::PlanNotRemoved {
            pod: label.to_string(),
            source: Box::new(e),
        });
    }
    if !left.is_empty() {
        return Err(MetaError::ResultsLeft {
            pod: label.to_string(),
            cni_dir: ctx.config.cni_dir.clone(),
            left,
        });
    }
    if reached_everything {
        ctx.store.finish_delete(&args.container_id, &args.ifname);
    } else {
        ctx.store
            .finish_delete_without_netns(&args.container_id, &args.ifname);
    }
    Ok(())
}

/// The attachments to DEL without a saved plan: every network in the result cache (exactly as
/// it was added), then those of the rebuilt plan the cache does not cover (a network whose ADD
/// failed before caching still holds an IPAM lease). The default interface comes first, so it
/// is deleted last, as after ADD.
fn merge(
    ifname: &str,
    cached: &[CachedAttachment],
    rebuilt: Vec<PlannedAttachment>,
) -> Vec<PlannedAttachment> {
    let mut out: Vec<PlannedAttachment> = cached.iter().filter_map(from_cache).collect();
    out.sort_by_key(|a| a.ifname != ifname);
    for a in &mut out {
        a.is_default = a.ifname == ifname;
    }
    for r in rebuilt {
        if !out.iter().any(|a| a.ifname == r.ifname) {
            out.push(r);
        }
    }
    out
}

/// A cached result entry as an attachment to DEL.
fn from_cache(c: &CachedAttachment) -> Option<PlannedAttachment> {
    let config = c
        .config_bytes()
        .and_then(|b| serde_json::from_slice(&b).ok())?;
    let mut args = CniArgs::default();
    for [k, v] in &c.cni_args {
        args.set(k, v);
    }
    Some(PlannedAttachment {
        network: c.network_name.clone(),
        ifname: c.if_name.clone(),
        is_default: false,
        config,
        capability_args: c.capability_args.clone(),
        cni_args: args.render(),
        default_route: Vec::new(),
        filter_v4: false,
        filter_v6: false,
        resource_name: None,
        dra: None,
        nad: None,
    })
}

/// Rebuild a plan without a saved one: from the pod and NADs if the API answers quickly, else
/// from the static config only (the default network and static delegates). Networks whose
/// plugin is not installed are left out: they cannot be deleted, and an ADD could not have run
/// them either.
fn rebuild(
    ctx: &mut Ctx,
    inputs: &mut dyn Inputs,
    args: &CmdArgs,
    cni_args: &CniArgs,
    id: Option<&PodIdentity>,
    label: &str,
) -> Result<Vec<PlannedAttachment>, MetaError> {
    tracing::info!(container = %args.container_id, "no saved plan: rebuilding it for DEL");
    // One quick attempt: an API server that is down must not hold the pod's teardown, and
    // then the NADs are not asked for either.
    let mut api_down = false;
    let pod = match id {
        Some(id) => inputs.pod_quick(ctx, id).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the pod; rebuilding from the static config");
            api_down = true;
            None
        }),
        None => None,
    };
    let requests = planner::requests(&ctx.config, pod.as_ref()).unwrap_or_default();
    let refs = planner::nad_refs(
        &requests,
        pod.as_ref().map(|p| p.id.namespace.as_str()).unwrap_or(""),
    );
    // Without a pod identity there is no API to ask (as at ADD).
    let nads = if refs.is_empty() || id.is_none() || api_down {
        planner::NadMap::new()
    } else {
        inputs.nads(ctx, &refs, label).unwrap_or_default()
    };
    let plan = match planner::make_plan(
        &ctx.config,
        &args.ifname,
        cni_args,
        pod.as_ref(),
        &requests,
        &nads,
        None,
    ) {
        Ok(p) => p,
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
            )?
        }
    };
    let pod_ns = pod.as_ref().map(|p| p.id.namespace.as_str());
    Ok(plan
        .into_iter()
        .filter(|a| {
            // A network ADD would have refused was never run: running its DEL would let the
            // NAD steer a root plugin now (host-local creates its dataDir even on DEL).
            let refused = crate::nad_guard::enforced(&ctx.config.nad_policy, pod_ns, a);
            if let Some(r) = refused.first() {
                tracing::warn!(network = %a.network, location = %r.location, value = %r.value,
                    why = %r.why, "not deleting a network the NAD policy refuses");
            }
            refused.is_empty()
        })
        .filter(|a| match attach::validate_plugins(&ctx.runtime, std::slice::from_ref(a), label) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "not deleting a network whose plugin is not installed");
                false
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cached(network: &str, ifname: &str) -> CachedAttachment {
        CachedAttachment {
            kind: "cniCacheV1".into(),
            container_id: "c1".into(),
            config: CachedAttachment::encode_config(
                json!({"cniVersion":"1.0.0","name":network,"type":"macvlan"})
                    .to_string()
                    .as_bytes(),
            ),
            if_name: ifname.into(),
            network_name: network.into(),
            netns: "/run/netns/gone".into(),
            cni_args: vec![["K8S_POD_NAME".into(), "p".into()]],
            capability_args: Default::default(),
            result: None,
        }
    }

    #[test]
    fn cached_networks_are_deleted_with_their_own_config_default_last() {
        let rebuilt = vec![
            PlannedAttachment {
                ifname: "eth0".into(),
                is_default: true,
                ..PlannedAttachment::for_test("cbr0", json!({"name":"cbr0","type":"bridge"}))
            },
            PlannedAttachment {
                ifname: "net2".into(),
                ..PlannedAttachment::for_test("ns/extra", json!({"name":"extra","type":"bridge"}))
            },
        ];
        let plan = merge(
            "eth0",
            &[cached("macvlan-conf", "net1"), cached("cbr0", "eth0")],
            rebuilt,
        );
        let names: Vec<(&str, &str, bool)> = plan
            .iter()
            .map(|a| (a.network.as_str(), a.ifname.as_str(), a.is_default))
            .collect();
        assert_eq!(
            names,
            vec![
                ("cbr0", "eth0", true),
                ("macvlan-conf", "net1", false),
                ("ns/extra", "net2", false)
            ]
        );
        // The cached entry's config and CNI_ARGS are what DEL runs.
        assert_eq!(plan[1].config["type"], "macvlan");
        assert_eq!(plan[1].cni_args, "K8S_POD_NAME=p");
    }

    /// A DEL without a plan while the API server is down asks it once (no retry budget: DEL
    /// must not keep a pod's teardown waiting) and does not go on to the NADs.
    #[test]
    fn a_del_without_a_plan_asks_a_down_api_once() {
        use crate::inputs::api::ApiInputs;
        use crate::k8s::testutil::{json_response, MockApi};
        use plexus_delegates::skel::Command;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _in_rt = rt.enter();
        let mock = MockApi::repeating(json_response(
            503,
            r#"{"kind":"Status","code":503,"reason":"ServiceUnavailable","message":"down"}"#,
        ));
        let t = tempfile::tempdir().unwrap();
        let config = format!(
            r#"{{"cniVersion":"1.0.0","name":"p","type":"plexus","cniDir":"{}","binDir":"{}",
               "delegates":[{{"cniVersion":"1.0.0","name":"cbr0","type":"not-installed"}}]}}"#,
            t.path().join("state").display(),
            t.path().display()
        );
        let args = CmdArgs {
            command: Command::Del,
            container_id: "c1".into(),
            netns: String::new(),
            ifname: "eth0".into(),
            args: "K8S_POD_NAMESPACE=db;K8S_POD_NAME=p;K8S_POD_UID=u1".into(),
            path: vec![],
            stdin: config.into_bytes(),
        };
        let mut ctx = Ctx::new(&args, None)
            .unwrap()
            .with_shared(rt.handle().clone(), Some(mock.client()));
        let started = std::time::Instant::now();
        del(&mut ctx, &mut ApiInputs, &args).unwrap();
        let took = started.elapsed();
        let reqs = mock.requests();
        assert_eq!(reqs.len(), 1, "{reqs:?}");
        assert!(took < std::time::Duration::from_millis(1000), "{took:?}");
    }

    /// What an interrupted ADD left running for this container (an IPAM plugin under a killed
    /// delegate) is killed before DEL; other containers' and other verbs' processes are not.
    #[test]
    fn giving_up_needs_three_failures_and_five_minutes_since_the_first() {
        let t = 1_000_000;
        assert!(
            !may_give_up(3, t, t + 15),
            "three quick failures (an API outage)"
        );
        assert!(!may_give_up(2, t, t + 600), "two failures, however old");
        assert!(!may_give_up(3, t, t + 299));
        assert!(may_give_up(3, t, t + 300));
        assert!(
            !may_give_up(3, t + 10, t),
            "a clock set back never gives up early"
        );
    }

    #[test]
    fn orphans_of_an_interrupted_add_are_killed() {
        let cid = format!("orphan-test-{}", std::process::id());
        let spawn = |command: &str, id: &str, netns: &str| {
            std::process::Command::new("sleep")
                .arg("30")
                .env("CNI_COMMAND", command)
                .env("CNI_CONTAINERID", id)
                .env("CNI_NETNS", netns)
                .spawn()
                .unwrap()
        };
        let mut orphan = spawn("ADD", &cid, "/run/netns/a");
        let mut other = spawn("ADD", &format!("{cid}-other"), "/run/netns/a");
        let mut deleting = spawn("DEL", &cid, "/run/netns/a");
        let mut elsewhere = spawn("ADD", &cid, "/run/netns/b");
        // Wait until exec has replaced the environment of all of them.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(
            kill_orphaned_adds(Path::new("/proc"), &cid, "/run/netns/a"),
            1
        );
        let status = orphan.wait().unwrap();
        assert!(!status.success(), "killed: {status:?}");
        for c in [&mut other, &mut deleting, &mut elsewhere] {
            assert!(c.try_wait().unwrap().is_none(), "left alone");
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert_eq!(
            kill_orphaned_adds(Path::new("/nonexistent"), &cid, "/run/netns/a"),
            0
        );
    }

    #[test]
    fn an_empty_netns_falls_back_to_the_recorded_one_only_while_it_exists() {
        assert_eq!(
            pick_netns("/run/netns/given", "/proc/self/ns/net"),
            "/run/netns/given"
        );
        assert_eq!(pick_netns("", "/proc/self/ns/net"), "/proc/self/ns/net");
        assert_eq!(pick_netns("", "/run/netns/plexus-never-existed"), "");
        assert_eq!(pick_netns("", ""), "");
    }
}
