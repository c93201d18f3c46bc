//! `plexus state`: what this node's plexus holds on disk — saved plans and their attachments,
//! delegate result caches, address claims waiting for release, device-info files, the thin
//! mode's metrics outcome files — and which of it is left over: state of a sandbox the runtime
//! no longer lists (asked through CRI `ListPodSandbox`, [`crate::daemon::cri`], when the
//! runtime's socket answers), or state that no plan names. Read-only: it opens files for
//! reading and lists directories, nothing else (no lock is taken, nothing is removed or
//! rewritten). It prints no delegate config and no cached result (they may carry what a NAD's
//! author put there): names, addresses and paths only.

use crate::daemon::cri;
use crate::state::{ClaimedAddress, SavedPlan, PLAN_KIND};
use plexus_delegates::cache::CachedAttachment;
use plexus_delegates::fsutil;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long the runtime's sandbox list may take.
pub const CRI_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the state lives and how to reach the runtime.
#[derive(Debug, Clone, Default)]
pub struct Where {
    /// `cniDir`: plans, locks, results, claims-pending, metrics.
    pub state_dir: PathBuf,
    /// `deviceInfoDir` (its `cni/` holds the per-attachment files).
    pub device_info_dir: PathBuf,
    /// The config file these came from, if one was read.
    pub config: Option<PathBuf>,
    /// `runtimeEndpoint` (empty: auto-detect one of [`cri::KNOWN_SOCKETS`]).
    pub runtime_endpoint: String,
    /// Where the host's files are seen, for the socket's auto-detection.
    pub host_root: Option<PathBuf>,
    /// Plans younger than this are not called leftovers (`reconcileGraceSeconds`).
    pub grace: Duration,
}

/// What the runtime said.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeView {
    /// The CRI socket asked, if one was found.
    pub endpoint: Option<PathBuf>,
    /// Whether its sandbox list was read and used for the cross-check.
    pub cross_checked: bool,
    /// Sandboxes it listed.
    pub sandboxes: Option<usize>,
    /// Why there is no cross-check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The listed sandbox IDs (not printed).
    #[serde(skip)]
    pub ids: Option<BTreeSet<String>>,
}

/// A sandbox's standing with the runtime.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Sandbox {
    /// Listed by the runtime.
    Live,
    /// Not listed.
    Gone,
    /// Not cross-checked.
    Unknown,
}

/// One attachment of a plan.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentView {
    /// Interface in the pod.
    pub interface: String,
    /// Network.
    pub network: String,
    /// The default network.
    pub default: bool,
    /// Device resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_name: Option<String>,
    /// The device allocated to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
}

/// One saved plan.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlanView {
    /// The plan file.
    pub file: PathBuf,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `namespace/name`, when known.
    pub pod: Option<String>,
    /// The pod's UID, when known.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    /// Network namespace at ADD.
    pub netns: String,
    /// Whether that path still exists (as seen from here).
    pub netns_exists: bool,
    /// Seconds since the plan was written (its ADD).
    pub age_seconds: u64,
    /// Failed DEL attempts.
    pub del_failures: u32,
    /// Attachments, in ADD order.
    pub attachments: Vec<AttachmentView>,
    /// Fixed addresses it holds an AddressClaim for.
    pub claims: Vec<ClaimedAddress>,
    /// Its sandbox with the runtime.
    pub sandbox: Sandbox,
}

/// A result cache entry, a device-info file or an unreadable plan: a file tied to a container.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FileView {
    /// The file.
    pub file: PathBuf,
    /// The container it belongs to, when its name or content says.
    pub container_id: Option<String>,
    /// Its network, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Its interface, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// Whether a saved plan names that container.
    pub has_plan: bool,
    /// Its sandbox with the runtime.
    pub sandbox: Sandbox,
}

/// An address claim whose release failed and waits for a later call.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PendingView {
    /// The record.
    pub file: PathBuf,
    /// Network.
    pub network: String,
    /// Address.
    pub address: String,
    /// The pod the claim names.
    pub pod: String,
}

/// Something that should not be there, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Leftover {
    /// `plan`, `resultCache`, `deviceInfo`, `pendingClaimRelease`, `unreadablePlan`,
    /// `delFailing`.
    pub kind: &'static str,
    /// The file.
    pub file: PathBuf,
    /// Its container, when known.
    pub container_id: Option<String>,
    /// Its pod, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Why it is flagged, and what releases it.
    pub why: String,
}

/// The thin mode's metrics outcome files.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MetricsView {
    /// The directory.
    pub dir: PathBuf,
    /// Its files: name and size in bytes.
    pub files: Vec<(String, u64)>,
}

/// Everything `plexus state` reports.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `cniDir`.
    pub state_dir: PathBuf,
    /// `deviceInfoDir`.
    pub device_info_dir: PathBuf,
    /// The config read, if any.
    pub config: Option<PathBuf>,
    /// The runtime cross-check.
    pub runtime: RuntimeView,
    /// Saved plans.
    pub plans: Vec<PlanView>,
    /// Delegate result caches (`<cniDir>/results`).
    pub result_caches: Vec<FileView>,
    /// Address claims pending release.
    pub pending_claim_releases: Vec<PendingView>,
    /// Per-attachment device-info files.
    pub device_info_files: Vec<FileView>,
    /// Lock files (one per container with an ADD/DEL running or recently run).
    pub lock_files: usize,
    /// DEL tombstones (the last hour's finished DELs).
    pub tombstones: usize,
    /// Metrics outcome files, when the directory exists.
    pub metrics: Option<MetricsView>,
    /// What is flagged.
    pub leftovers: Vec<Leftover>,
}

/// Ask the runtime for its sandboxes; never fails: a runtime that cannot be asked is a note.
pub fn ask_runtime(endpoint: &str, host_root: Option<&Path>) -> RuntimeView {
    let unreachable = |endpoint: Option<PathBuf>, why: String| RuntimeView {
        endpoint,
        cross_checked: false,
        sandboxes: None,
        note: Some(format!("runtime not reachable, not cross-checked: {why}")),
        ids: None,
    };
    let socket = match cri::endpoint(endpoint, host_root) {
        Ok(Some(s)) => s,
        Ok(None) => return unreachable(None, "runtimeEndpoint is none".into()),
        Err(e) => return unreachable(None, e.to_string()),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return unreachable(Some(socket), e.to_string()),
    };
    match rt.block_on(cri::sandbox_ids(&socket, CRI_TIMEOUT)) {
        Ok(ids) => RuntimeView {
            endpoint: Some(socket),
            cross_checked: true,
            sandboxes: Some(ids.len()),
            note: None,
            ids: Some(ids),
        },
        Err(e) => unreachable(Some(socket), e.to_string()),
    }
}

fn age(path: &Path, now: SystemTime) -> Duration {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| now.duration_since(t).ok())
        .unwrap_or_default()
}

/// The entries of `dir` (sorted; files being written, `.`-prefixed, left out).
fn files_of(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> Result<T, String> {
    let b = fsutil::read_capped(p, fsutil::MAX_STATE_FILE_BYTES).map_err(|e| e.to_string())?;
    serde_json::from_slice(&b).map_err(|e| e.to_string())
}

fn attachment_view(a: &crate::plan::PlannedAttachment) -> AttachmentView {
    AttachmentView {
        interface: a.ifname.clone(),
        network: a.network.clone(),
        default: a.is_default,
        resource_name: a.resource_name.clone(),
        device_id: a
            .capability_args
            .get("deviceID")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string),
    }
}

/// The container ID in a device-info file name (`<network>-<containerID>_<ifname>`,
/// flattened), given the containers plans name: the planned one it holds, else a 64-hex run
/// before the last `_` (the runtime's IDs).
fn devinfo_container(name: &str, planned: &BTreeSet<String>) -> Option<String> {
    let stem = &name[..name.rfind('_')?];
    if let Some(id) = planned
        .iter()
        .find(|id| stem.ends_with(&format!("-{id}")) || stem == id.as_str())
    {
        return Some(id.clone());
    }
    let tail = stem.rsplit('-').next()?;
    (tail.len() == 64 && tail.bytes().all(|c| c.is_ascii_hexdigit())).then(|| tail.to_string())
}

/// Collect the report: read `at`'s directories, judge with `runtime`'s sandbox list.
pub fn collect(at: &Where, runtime: RuntimeView, now: SystemTime) -> Report {
    let mut runtime = runtime;
    let mut leftovers = Vec::new();
    let mut plans = Vec::new();
    for file in files_of(&at.state_dir.join("plans")) {
        if !file.to_string_lossy().ends_with(".json") {
            continue;
        }
        match read_json::<SavedPlan>(&file) {
            Ok(p) if p.kind == PLAN_KIND => plans.push((file, p)),
            Ok(p) => leftovers.push(Leftover {
                kind: "unreadablePlan",
                container_id: Some(p.container_id),
                pod: None,
                why: format!(
                    "a plan of kind {:?} (this plexus reads {PLAN_KIND}): written by another plexus version",
                    p.kind
                ),
                file,
            }),
            Err(e) => leftovers.push(Leftover {
                kind: "unreadablePlan",
                container_id: None,
                pod: None,
                why: format!("unreadable plan: {e}; a DEL of its container fails with code 6"),
                file,
            }),
        }
    }
    // A runtime listing no sandbox while plans' namespaces exist is likely not the kubelet's
    // (the reconciler's own caution): nothing is judged by it.
    if let Some(ids) = &runtime.ids {
        let in_use = plans
            .iter()
            .filter(|(_, p)| !p.netns.is_empty() && Path::new(&p.netns).exists())
            .count();
        if ids.is_empty() && in_use > 0 {
            runtime.cross_checked = false;
            runtime.note = Some(format!(
                "the runtime lists no sandbox while {in_use} plans' network namespaces exist: is it the kubelet's runtime (--runtime-endpoint)? not cross-checked"
            ));
        }
    }
    let live = runtime.ids.as_ref().filter(|_| runtime.cross_checked);
    let standing = |id: &str| match live {
        Some(ids) if ids.contains(id) => Sandbox::Live,
        Some(_) => Sandbox::Gone,
        None => Sandbox::Unknown,
    };
    let planned: BTreeSet<String> = plans.iter().map(|(_, p)| p.container_id.clone()).collect();

    let mut plan_views = Vec::new();
    for (file, p) in plans {
        let pod = p.pod.as_ref().map(|i| i.key());
        let sandbox = standing(&p.container_id);
        let age = age(&file, now);
        if sandbox == Sandbox::Gone && age >= at.grace {
            leftovers.push(Leftover {
                kind: "plan",
                file: file.clone(),
                container_id: Some(p.container_id.clone()),
                pod: pod.clone(),
                why: format!(
                    "sandbox gone: the runtime no longer lists it, no DEL came ({}s old); the reconciler releases it",
                    age.as_secs()
                ),
            });
        }
        if p.del_failures > 0 {
            leftovers.push(Leftover {
                kind: "delFailing",
                file: file.clone(),
                container_id: Some(p.container_id.clone()),
                pod: pod.clone(),
                why: format!(
                    "{} DEL attempts failed; the runtime retries DEL (see the log for the cause)",
                    p.del_failures
                ),
            });
        }
        plan_views.push(PlanView {
            container_id: p.container_id.clone(),
            ifname: p.ifname.clone(),
            pod,
            pod_uid: p.pod.as_ref().map(|i| i.uid.clone()).unwrap_or_default(),
            netns_exists: !p.netns.is_empty() && Path::new(&p.netns).exists(),
            netns: p.netns.clone(),
            age_seconds: age.as_secs(),
            del_failures: p.del_failures,
            attachments: p.attachments.iter().map(attachment_view).collect(),
            claims: p.claims.clone(),
            sandbox,
            file,
        });
    }

    let orphan =
        |kind: &'static str, v: &FileView, age: Duration, leftovers: &mut Vec<Leftover>| {
            if v.has_plan || v.sandbox == Sandbox::Live || age < at.grace {
                return;
            }
            let why = match v.sandbox {
                Sandbox::Gone => {
                    "no plan names its container and the runtime no longer lists the sandbox"
                        .to_string()
                }
                _ => "no plan names its container (runtime not reachable, not cross-checked)"
                    .to_string(),
            };
            leftovers.push(Leftover {
                kind,
                file: v.file.clone(),
                container_id: v.container_id.clone(),
                pod: None,
                why,
            });
        };

    let mut result_caches = Vec::new();
    for file in files_of(&at.state_dir.join("results")) {
        let entry = read_json::<CachedAttachment>(&file).ok();
        let container_id = entry.as_ref().map(|c| c.container_id.clone());
        let v = FileView {
            has_plan: container_id.as_ref().is_some_and(|c| planned.contains(c)),
            sandbox: container_id.as_deref().map_or(Sandbox::Unknown, &standing),
            network: entry.as_ref().map(|c| c.network_name.clone()),
            ifname: entry.as_ref().map(|c| c.if_name.clone()),
            container_id,
            file,
        };
        orphan("resultCache", &v, age(&v.file, now), &mut leftovers);
        result_caches.push(v);
    }

    let mut device_info_files = Vec::new();
    for file in files_of(&at.device_info_dir.join("cni")) {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let container_id = devinfo_container(&name, &planned);
        let v = FileView {
            has_plan: container_id.as_ref().is_some_and(|c| planned.contains(c)),
            sandbox: container_id.as_deref().map_or(Sandbox::Unknown, &standing),
            network: None,
            ifname: name.rsplit_once('_').map(|(_, i)| i.to_string()),
            container_id,
            file,
        };
        if v.container_id.is_some() {
            orphan("deviceInfo", &v, age(&v.file, now), &mut leftovers);
        }
        device_info_files.push(v);
    }

    let mut pending_claim_releases = Vec::new();
    for file in files_of(&at.state_dir.join("claims-pending")) {
        match read_json::<crate::claims_pending::PendingRelease>(&file) {
            Ok(p) => {
                leftovers.push(Leftover {
                    kind: "pendingClaimRelease",
                    file: file.clone(),
                    container_id: None,
                    pod: Some(p.pod.clone()),
                    why: format!(
                        "the AddressClaim for {} on {} could not be released (API down at DEL); the next DEL or GC on this node (the daemon: within a minute) releases it",
                        p.address, p.network
                    ),
                });
                pending_claim_releases.push(PendingView {
                    file,
                    network: p.network,
                    address: p.address.to_string(),
                    pod: p.pod,
                });
            }
            Err(e) => leftovers.push(Leftover {
                kind: "pendingClaimRelease",
                file,
                container_id: None,
                pod: None,
                why: format!("unreadable record ({e}): the next release sweep removes it"),
            }),
        }
    }

    let metrics_dir = at.state_dir.join("metrics");
    let metrics = metrics_dir.is_dir().then(|| MetricsView {
        files: files_of(&metrics_dir)
            .into_iter()
            .map(|f| {
                let len = std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
                (
                    f.file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    len,
                )
            })
            .collect(),
        dir: metrics_dir,
    });

    Report {
        state_dir: at.state_dir.clone(),
        device_info_dir: at.device_info_dir.clone(),
        config: at.config.clone(),
        lock_files: files_of(&at.state_dir.join("locks")).len(),
        tombstones: files_of(&at.state_dir.join("tombstones")).len(),
        runtime,
        plans: plan_views,
        result_caches,
        pending_claim_releases,
        device_info_files,
        metrics,
        leftovers,
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
