//! CHECK, STATUS and GC: from the saved plans and the static config, no inputs stage.

use crate::attach;
use crate::context::Ctx;
use crate::error::MetaError;
use crate::plan::requests as planner;
use crate::plan::resolve::{self, NetRef};
use crate::state::SavedPlan;
use plexus_conf::netconf::NetConfList;
use plexus_delegates::skel::CmdArgs;
use serde_json::Value;
use std::collections::BTreeMap;

/// CHECK every attachment of the container from its saved plan. A container plexus has no plan
/// for is answered code 3 and leaves no lock file behind: CRI-O sends CHECK right after every
/// ADD with the network config current *then*, so a sandbox ADDed through the cluster network
/// just before plexus' config appeared gets plexus' CHECK, fails, and is DELeted through the
/// network it was ADDed on — plexus never hears of it again.
pub fn check(ctx: &mut Ctx, args: &CmdArgs) -> Result<(), MetaError> {
    let lock = ctx.store.lock(&args.container_id)?;
    let Some(plan) = ctx.store.load(&args.container_id, &args.ifname)? else {
        // No ADD holds the lock (it saves its plan first), so none is running: the file goes
        // while held, as DEL drops it for a container already deleted.
        ctx.store.drop_lock_file(&args.container_id);
        drop(lock);
        return Err(MetaError::NotAttached {
            container_id: args.container_id.clone(),
        });
    };
    let _lock = lock;
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

/// STATUS: ready unless the readiness indicator file is missing, the default network's config
/// or one of its plugins is gone, or its own STATUS fails ([`status::run`]: files only, no API).
pub fn status(ctx: &mut Ctx) -> Result<(), MetaError> {
    status::run(ctx)
}

mod status;

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

/// The GC keys of the spec: `cni.dev/valid-attachments` (CNI 1.1) and its pre-release name
/// `cni.dev/attachments`, which libcni still sends alongside.
const GC_KEYS: [&str; 2] = ["cni.dev/valid-attachments", "cni.dev/attachments"];

/// The valid attachments of a GC's stdin, read strictly: the key is required by the spec and
/// every entry needs a non-empty `containerID` and `ifname` (`[]`, or `null` as Go encodes an
/// empty list, means none is valid). A missing key or a malformed entry
/// is an error (7) and the GC changes nothing: read as "nothing is valid", it would DEL every
/// live pod's networks.
pub fn gc_valid_attachments(stdin: &[u8]) -> Result<Vec<(String, String)>, MetaError> {
    let bad = |msg: String, details: String| MetaError::Config {
        source: Box::new(plexus_conf::error::CniError::invalid_config(
            format!("GC: {msg}; nothing was collected"),
            details,
        )),
    };
    let stdin: Value = serde_json::from_slice(stdin)
        .map_err(|e| bad("the GC configuration is not JSON".into(), e.to_string()))?;
    let Some((key, list)) = GC_KEYS.iter().find_map(|k| stdin.get(*k).map(|v| (*k, v))) else {
        return Err(bad(
            format!("{} is missing", GC_KEYS[0]),
            "the CNI spec (1.1) makes the list of valid attachments required; an empty list \
             ([]) means that no attachment is valid"
                .into(),
        ));
    };
    // Go runtimes (libcni's GCArgs) encode an empty valid list as `null`: no pod on the node.
    if list.is_null() {
        return Ok(Vec::new());
    }
    let Some(list) = list.as_array() else {
        return Err(bad(
            format!("{key} is not a list"),
            format!("got {}", clip(list)),
        ));
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            let field = |f: &str| {
                v.get(f)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
            };
            match (field("containerID"), field("ifname")) {
                (Some(c), Some(n)) => Ok((c, n)),
                _ => Err(bad(
                    format!("{key}[{i}] has no containerID or no ifname"),
                    format!(
                        "every entry needs both as non-empty strings; got {}",
                        clip(v)
                    ),
                )),
            }
        })
        .collect()
}

/// A JSON value for an error message, cut at 200 bytes.
fn clip(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 200 {
        let mut end = 200;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// Release everything a saved plan holds, as a DEL of a container the runtime no longer has:
/// the delegates' DEL (IPAM leases, VFs; their result caches), then the plan itself, the
/// attachments' device-info files and the address claims, and a tombstone for the runtime's
/// own late DELs. `netns` is the namespace the delegates are given (`""`: none, only what lives
/// outside the pod is released). The caller holds the container's lock. GC and the node
/// reconciler ([`crate::daemon::reconcile`]) both come here.
pub fn release_plan(ctx: &mut Ctx, plan: &SavedPlan, netns: &str) -> Result<(), MetaError> {
    let label = plan
        .pod
        .as_ref()
        .map(|p| format!("pod {}", p.key()))
        .unwrap_or_else(|| format!("container {}", plan.container_id));
    attach::del_all(
        &ctx.runtime,
        &plan.attachments,
        &plan.container_id,
        netns,
        &label,
    )?;
    ctx.store.remove(&plan.container_id, &plan.ifname)?;
    crate::devices::devinfo::remove(&plan.attachments);
    crate::address_guard::release(ctx, plan.pod.as_ref(), &plan.claims);
    ctx.store.finish_delete(&plan.container_id, &plan.ifname);
    Ok(())
}

/// GC: DEL every saved plan the runtime no longer lists as valid, then forward GC to every
/// known network with the attachments still valid on it. A GC whose valid-attachment list is
/// missing or malformed changes nothing ([`gc_valid_attachments`]).
pub fn gc(ctx: &mut Ctx, args: &CmdArgs) -> Result<(), MetaError> {
    let valid = gc_valid_attachments(&args.stdin)?;
    crate::address_guard::release_pending(ctx);
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
            if let Err(e) = release_plan(ctx, plan, "") {
                errors.push(e);
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
    use super::{gc_valid_attachments, gc_valid_list};

    #[test]
    fn check_of_an_unknown_container_fails_with_code_3_and_leaves_no_lock_file() {
        use plexus_delegates::skel::{CmdArgs, Command};
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        let config = format!(
            r#"{{"cniVersion":"1.1.0","name":"p","type":"plexus","cniDir":"{}",
               "delegates":[{{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}}]}}"#,
            state.display()
        );
        let args = CmdArgs {
            command: Command::Check,
            container_id: "never-added".into(),
            netns: "/run/netns/plexus-never-existed".into(),
            ifname: "eth0".into(),
            args: "IgnoreUnknown=1".into(),
            path: vec![],
            stdin: config.into_bytes(),
        };
        let mut ctx = crate::context::Ctx::new(&args, None).unwrap();
        let e = super::check(&mut ctx, &args).unwrap_err();
        assert_eq!(e.code(), 3, "{e:?}");
        let locks: Vec<_> = std::fs::read_dir(state.join("locks"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(locks.is_empty(), "lock files left: {locks:?}");
    }

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

    #[test]
    fn gc_refuses_a_missing_or_malformed_valid_attachment_list() {
        let ok = |s: &str| gc_valid_attachments(s.as_bytes()).unwrap();
        let err = |s: &str| {
            let e =
                plexus_conf::error::CniError::from(gc_valid_attachments(s.as_bytes()).unwrap_err());
            assert_eq!(e.code, 7, "{s}: {e}");
            e.to_string()
        };
        assert_eq!(
            ok(r#"{"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}"#),
            vec![p("a", "eth0")]
        );
        // The legacy key, and an explicit empty list: nothing is valid, on purpose.
        assert_eq!(
            ok(r#"{"cni.dev/attachments":[{"containerID":"a","ifname":"net1"}]}"#),
            vec![p("a", "net1")]
        );
        assert!(ok(r#"{"cni.dev/valid-attachments":[]}"#).is_empty());
        assert!(ok(r#"{"cni.dev/valid-attachments":null}"#).is_empty());
        let e = err(r#"{"name":"x"}"#);
        assert!(
            e.contains("cni.dev/valid-attachments is missing")
                && e.contains("nothing was collected"),
            "{e}"
        );
        let e = err(r#"{"cni.dev/valid-attachments":{"containerID":"a"}}"#);
        assert!(e.contains("is not a list"), "{e}");
        for bad in [
            r#"{"containerID":"a"}"#,
            r#"{"ifname":"eth0"}"#,
            r#"{"containerID":"","ifname":"eth0"}"#,
            r#"{"containerID":7,"ifname":"eth0"}"#,
            r#""a""#,
        ] {
            let e = err(&format!(
                r#"{{"cni.dev/valid-attachments":[{{"containerID":"b","ifname":"eth0"}},{bad}]}}"#
            ));
            assert!(e.contains("cni.dev/valid-attachments[1]"), "{e}");
        }
        assert!(err("{").contains("not JSON"));
    }
}
