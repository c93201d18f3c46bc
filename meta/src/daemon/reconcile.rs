//! The node reconciler: the CNI GC no runtime sends. containerd never calls GC and CRI-O only
//! at its start, so a sandbox the runtime lost without a DEL (the runtime SIGKILLed in the
//! middle of `RunPodSandbox`, a leak of unknown cause) would keep its plan, IPAM leases, VFs,
//! device-info files, address claims and result caches forever. The reconciler compares the
//! node's saved plans with the sandboxes the runtime lists (CRI `ListPodSandbox`, [`super::cri`])
//! and releases, the way GC does ([`check::release_plan`]), every plan whose container ID the
//! runtime does not list, is older than `reconcileGraceSeconds` and whose container lock is
//! free (no ADD or DEL of it running). A runtime that cannot be asked means: nothing is
//! released. The daemon runs it every minute and at start; in thin mode `install.sh --watch`
//! runs `plexus-daemon reconcile` (docs/daemon.md).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::context::Ctx;
use crate::state::SavedPlan;
use crate::verbs::check;

/// How long one `ListPodSandbox` may take.
pub const CRI_TIMEOUT: Duration = Duration::from_secs(10);

/// What the reconciler knows of one saved plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanFacts {
    /// `CNI_CONTAINERID`: the sandbox ID.
    pub container_id: String,
    /// How long ago the plan was written (its ADD started then).
    pub age: Duration,
}

/// Why a plan is kept or released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The runtime lists its sandbox.
    Live,
    /// Younger than the grace period: its sandbox may still be in `RunPodSandbox`.
    Young,
    /// The runtime's list could not be read: nothing is known to be gone.
    Unknown,
    /// Its sandbox is gone: release it.
    Reclaim,
}

/// The verdict for `plan` given the runtime's sandbox IDs (`None`: the list could not be read).
pub fn decide(plan: &PlanFacts, live: Option<&BTreeSet<String>>, grace: Duration) -> Verdict {
    let Some(live) = live else {
        return Verdict::Unknown;
    };
    if live.contains(&plan.container_id) {
        Verdict::Live
    } else if plan.age < grace {
        Verdict::Young
    } else {
        Verdict::Reclaim
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The pass did not run: the reconciler is off or the runtime could not be asked (why).
    pub skipped: Option<String>,
    /// Sandboxes the runtime listed.
    pub live: usize,
    /// Plans released: (container ID, ifname).
    pub reclaimed: Vec<(String, String)>,
    /// Plans kept: the runtime lists them.
    pub kept_live: usize,
    /// Plans kept: younger than the grace period, or their container lock was held.
    pub kept_young: usize,
    /// Plans whose release failed (they stay for the next pass).
    pub failed: usize,
    /// Device-info files without a plan or a live sandbox, removed.
    pub devinfo_removed: Vec<PathBuf>,
}

/// One pass over `ctx`'s `cniDir` (its config's `runtimeEndpoint` and
/// `reconcileGraceSeconds`); `host_root` is where the host's files are seen (the daemon's
/// `--host-root`), for the runtime socket's auto-detection.
pub fn run_once(ctx: &mut Ctx, host_root: Option<&Path>) -> Pass {
    let cni_dir = PathBuf::from(&ctx.config.cni_dir);
    let socket = match super::cri::endpoint(&ctx.config.runtime_endpoint, host_root) {
        Ok(Some(s)) => s,
        Ok(None) => {
            tracing::debug!(cni_dir = %cni_dir.display(), "reconciler off (runtimeEndpoint none)");
            return skipped("runtimeEndpoint is none".into());
        }
        Err(e) => {
            // Auto-detection finding no runtime (a node without the default sockets) is said
            // once per process at warn level, then at debug.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::debug!(cni_dir = %cni_dir.display(), error = %e, "reconciler: cannot find the runtime; nothing reclaimed");
            } else {
                tracing::warn!(cni_dir = %cni_dir.display(), error = %e, "reconciler: cannot find the runtime; nothing reclaimed");
            }
            return skipped(e.to_string());
        }
    };
    let live = match ctx.block_on(super::cri::sandbox_ids(&socket, CRI_TIMEOUT)) {
        Ok(Ok(ids)) => ids,
        Ok(Err(e)) => {
            tracing::warn!(socket = %socket.display(), error = %e, "reconciler: the runtime's sandbox list could not be read; nothing reclaimed");
            return skipped(e.to_string());
        }
        Err(e) => {
            tracing::warn!(error = %e, "reconciler: no async runtime; nothing reclaimed");
            return skipped(e.to_string());
        }
    };
    let pass = apply(ctx, &live, SystemTime::now());
    if !pass.reclaimed.is_empty() || pass.failed > 0 || !pass.devinfo_removed.is_empty() {
        tracing::info!(
            socket = %socket.display(),
            live = pass.live,
            reclaimed = pass.reclaimed.len(),
            kept_live = pass.kept_live,
            kept_young = pass.kept_young,
            failed = pass.failed,
            devinfo_removed = pass.devinfo_removed.len(),
            "reconciler pass"
        );
    } else {
        tracing::debug!(socket = %socket.display(), live = pass.live, kept = pass.kept_live + pass.kept_young, "reconciler pass: nothing to reclaim");
    }
    crate::address_guard::release_pending(ctx);
    pass
}

/// The pass itself, given the runtime's sandbox IDs `live` (read): every plan decided
/// ([`decide`]) and the ones to reclaim released; then the device-info sweep.
pub fn apply(ctx: &mut Ctx, live: &BTreeSet<String>, now: SystemTime) -> Pass {
    let grace = Duration::from_secs(ctx.config.reconcile_grace_seconds);
    let cni_dir = PathBuf::from(&ctx.config.cni_dir);
    let mut pass = Pass {
        live: live.len(),
        ..Pass::default()
    };
    let plans = ctx.store.all();
    // A runtime that lists no sandbox at all while a plan's network namespace still exists is
    // most likely not the kubelet's (a second containerd, runtimeEndpoint wrong): releasing
    // would take every pod's networks. Nothing is released; the operator is told.
    if live.is_empty() {
        let in_use = plans
            .iter()
            .filter(|p| !p.netns.is_empty() && Path::new(&p.netns).exists())
            .count();
        if in_use > 0 {
            tracing::warn!(
                plans_with_netns = in_use,
                "reconciler: the runtime lists no sandbox while plans' network namespaces exist; is runtimeEndpoint the kubelet's runtime? nothing reclaimed"
            );
            pass.kept_young = plans.len();
            pass.skipped = Some(format!(
                "the runtime lists no sandbox while {in_use} plans' network namespaces exist"
            ));
            return pass;
        }
    }
    for plan in &plans {
        let facts = PlanFacts {
            container_id: plan.container_id.clone(),
            age: plan_age(&cni_dir, plan, now),
        };
        match decide(&facts, Some(live), grace) {
            Verdict::Live => pass.kept_live += 1,
            Verdict::Young | Verdict::Unknown => pass.kept_young += 1,
            Verdict::Reclaim => match reclaim(ctx, &cni_dir, plan, facts.age) {
                Some(true) => pass
                    .reclaimed
                    .push((plan.container_id.clone(), plan.ifname.clone())),
                Some(false) => pass.failed += 1,
                None => pass.kept_young += 1,
            },
        }
    }
    let planned: BTreeSet<String> = ctx
        .store
        .all()
        .into_iter()
        .map(|p| p.container_id)
        .collect();
    pass.devinfo_removed = sweep_devinfo(
        &Path::new(&ctx.config.device_info_dir).join("cni"),
        live,
        &planned,
        grace,
        now,
    );
    pass
}

fn skipped(why: String) -> Pass {
    Pass {
        skipped: Some(why),
        ..Pass::default()
    }
}

/// The plan file's age (written when its ADD started); unreadable: zero (kept).
fn plan_age(cni_dir: &Path, plan: &SavedPlan, now: SystemTime) -> Duration {
    // The store's own naming (state::PlanStore): plans/<containerID>-<ifname>.json.
    let file = cni_dir
        .join("plans")
        .join(format!("{}-{}.json", plan.container_id, plan.ifname));
    std::fs::metadata(file)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| now.duration_since(t).ok())
        .unwrap_or_default()
}

/// Release one plan: `None` when its container lock is held (an ADD or DEL of it is running:
/// left for the next pass), else whether the release succeeded.
fn reclaim(ctx: &mut Ctx, cni_dir: &Path, plan: &SavedPlan, age: Duration) -> Option<bool> {
    // Never wait: a held lock is an ADD in progress (the plan is saved before the delegates
    // run) or a DEL; the store's own lock path (state::PlanStore::lock).
    let lock_path = cni_dir
        .join("locks")
        .join(format!("{}.lock", plan.container_id));
    let lock = plexus_delegates::lock::FileLock::acquire(&lock_path, Duration::ZERO).ok()?;
    // A DEL may have finished between the listing and the lock.
    match ctx.store.load(&plan.container_id, &plan.ifname) {
        Ok(Some(_)) => {}
        _ => {
            ctx.store.drop_lock_file(&plan.container_id);
            return None;
        }
    }
    let pod = plan
        .pod
        .as_ref()
        .map(|p| p.key())
        .unwrap_or_else(|| "-".into());
    let networks: Vec<String> = plan
        .attachments
        .iter()
        .map(|a| format!("{}:{}", a.ifname, a.network))
        .collect();
    // The sandbox's netns, when the runtime left it behind, so its interfaces go too.
    let netns = if !plan.netns.is_empty() && Path::new(&plan.netns).exists() {
        plan.netns.as_str()
    } else {
        ""
    };
    let res = check::release_plan(ctx, plan, netns);
    drop(lock);
    match res {
        Ok(()) => {
            tracing::info!(
                container = %plan.container_id,
                ifname = %plan.ifname,
                pod = %pod,
                networks = ?networks,
                age_s = age.as_secs(),
                netns = if netns.is_empty() { "gone" } else { netns },
                "reconciler: reclaimed a sandbox the runtime no longer has (no DEL came)"
            );
            Some(true)
        }
        Err(e) => {
            tracing::warn!(container = %plan.container_id, pod = %pod, error = %e,
                "reconciler: could not release a sandbox the runtime no longer has; tried again next pass");
            Some(false)
        }
    }
}

/// The container ID in a device-info file name (`<network>-<containerID>_<ifname>`, flattened):
/// the 64 hex digits followed by `_`.
fn devinfo_container_id(name: &str) -> Option<&str> {
    let b = name.as_bytes();
    (0..b.len().saturating_sub(64)).find_map(|i| {
        let id = &name[i..i + 64];
        let before_ok = i == 0 || b[i - 1] == b'-';
        (before_ok && b.get(i + 64) == Some(&b'_') && id.bytes().all(|c| c.is_ascii_hexdigit()))
            .then_some(id)
    })
}

/// Remove the per-attachment device-info files of `dir` (`<deviceInfoDir>/cni`) whose sandbox
/// neither the runtime lists nor a plan names, older than `grace`: a file left without its plan
/// (issue 27's device-info file, cause not found) is reclaimed like a plan.
pub fn sweep_devinfo(
    dir: &Path,
    live: &BTreeSet<String>,
    planned: &BTreeSet<String>,
    grace: Duration,
    now: SystemTime,
) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = devinfo_container_id(&name) else {
            continue;
        };
        if live.contains(id) || planned.contains(id) {
            continue;
        }
        let age = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .unwrap_or_default();
        if age < grace {
            continue;
        }
        match std::fs::remove_file(e.path()) {
            Ok(()) => {
                tracing::info!(file = %e.path().display(), container = %id, age_s = age.as_secs(),
                    "reconciler: removed a device-info file whose sandbox the runtime no longer has and no plan names");
                removed.push(e.path());
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                tracing::warn!(file = %e.path().display(), error = %err, "reconciler: cannot remove a device-info file")
            }
        }
    }
    removed
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
