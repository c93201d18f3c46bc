//! A churn generator for the node tiers: pods created at a fixed rate and deleted once a bounded
//! number are live, on a thread of its own while the test runs a day-2 operation; each pod is
//! checked once Running (its netns holds exactly eth0 and the interfaces its networks
//! annotation asks for, and its network-status lists the same), and every pod is gone again
//! when [`Churn::finish`] returns.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use plexus_e2e::realk8s::cri::Cri;
use serde_json::Value;

use super::api::Api;
use super::pods::{check_pod_network, interfaces, manifest, network_status, running};

/// One shape of pod the churn cycles through: its networks annotation and the (network name,
/// interface) entries it must get besides the default network's eth0.
#[derive(Clone)]
pub struct Form {
    /// `k8s.v1.cni.cncf.io/networks`, or none.
    pub annotation: Option<Value>,
    /// Expected extra networks, in order.
    pub extra: Vec<(String, String)>,
}

/// What the churn runs against and how fast.
pub struct Spec {
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// containerd's CRI socket on the node (netns paths of running pods).
    pub cri_socket: PathBuf,
    /// Pods' namespace.
    pub ns: String,
    /// The node the pods are bound to.
    pub node: String,
    /// Name prefix and `batch` label of this churn's pods.
    pub prefix: String,
    /// The default network's name in network-status.
    pub default_net: String,
    /// One pod created per interval.
    pub interval: Duration,
    /// Once more than this many are live, the oldest checked pod is deleted.
    pub live: usize,
    /// A pod not Running this long after its create is a failed pod.
    pub run_deadline: Duration,
    /// Cycled through, pod by pod.
    pub forms: Vec<Form>,
}

/// How one pod came out.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Running with exactly its networks.
    Correct,
    /// Running with eth0 alone although it asked for more, or with no network-status at all
    /// (`status`: whether plexus wrote one): right only while plexus is being uninstalled.
    ClusterOnly {
        /// network-status present (eth0 only).
        status: bool,
    },
    /// Running with other interfaces than it asked for, or a network-status that disagrees.
    Wrong(String),
    /// Not Running within the deadline.
    Failed(String),
}

/// One pod's record.
#[derive(Debug, Clone)]
pub struct PodRecord {
    /// Its name.
    pub name: String,
    /// Index into [`Spec::forms`].
    pub form: usize,
    /// When the churn created it.
    pub created: Instant,
    /// How it came out.
    pub verdict: Verdict,
}

/// What the churn saw.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every pod, in creation order, once settled.
    pub pods: Vec<PodRecord>,
    /// Pods created.
    pub created: usize,
    /// Running with exactly their networks.
    pub correct: usize,
    /// Running without exactly their networks (the worst outcome): name and what was wrong.
    pub wrong_network: Vec<String>,
    /// Not Running within the deadline: name and phase.
    pub failed: Vec<String>,
    /// The pods' `FailedCreatePodSandBox` events (the kubelet retried those sandboxes).
    pub sandbox_retries: usize,
    /// Create → Running, ms, of the correct pods.
    pub running_ms: Vec<f64>,
    /// Sandbox IDs and netns paths of every pod that ran (for the leak checks).
    pub sandboxes: Vec<String>,
    /// See `sandboxes`.
    pub netns: Vec<String>,
    /// API errors the churn retried past (the apiserver stays up in these cases: expected 0).
    pub api_errors: usize,
}

impl Outcome {
    /// Pods that got the cluster network alone.
    pub fn cluster_only(&self) -> Vec<&PodRecord> {
        self.pods
            .iter()
            .filter(|p| matches!(p.verdict, Verdict::ClusterOnly { .. }))
            .collect()
    }

    /// Pods on the wrong network (cluster network only counts as wrong) or never Running, as
    /// an error.
    pub fn ensure_clean(&self) -> Result<()> {
        let cluster_only: Vec<&str> = self
            .cluster_only()
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        anyhow::ensure!(
            cluster_only.is_empty(),
            "{} pod(s) Running with the cluster network alone: {cluster_only:?}",
            cluster_only.len()
        );
        anyhow::ensure!(
            self.wrong_network.is_empty() && self.failed.is_empty(),
            "{} pod(s) on the wrong network: {:?}; {} never Running: {:?}",
            self.wrong_network.len(),
            self.wrong_network,
            self.failed.len(),
            self.failed
        );
        Ok(())
    }
}

/// A churn running on its thread.
pub struct Churn {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Outcome>>>,
}

/// A pod the churn created and has not seen gone yet.
struct Live {
    name: String,
    form: usize,
    created: Instant,
    /// Checked (or failed): may be deleted.
    settled: bool,
    /// DELETE sent: waiting for it and its netns to be gone.
    deleting: bool,
    netns: Option<String>,
    /// First seen Running.
    running_since: Option<Instant>,
}

impl Churn {
    /// Start creating pods now.
    pub fn start(spec: Spec) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || run(&spec, &flag));
        Churn {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop creating, wait until every pod created is checked, delete them all and wait until
    /// each is gone from the API and its netns is gone.
    pub fn finish(mut self) -> Result<Outcome> {
        self.stop.store(true, Ordering::SeqCst);
        let t = self.thread.take().context("churn already finished")?;
        t.join()
            .map_err(|_| anyhow::anyhow!("the churn thread panicked"))?
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(spec: &Spec, stop: &AtomicBool) -> Result<Outcome> {
    let api = Api::new(&spec.kubeconfig)?;
    let cri = Cri::new(&spec.cri_socket);
    let mut out = Outcome::default();
    let mut live: VecDeque<Live> = VecDeque::new();
    let mut next = Instant::now();
    let mut n = 0usize;
    // Pods seen Running without a network-status yet (daemon mode writes it after the answer).
    let status_grace = Duration::from_secs(15);
    let mut stopping_since: Option<Instant> = None;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if stopping && stopping_since.is_none() {
            stopping_since = Some(Instant::now());
        }
        if !stopping && Instant::now() >= next {
            let form = n % spec.forms.len();
            let name = format!("{}-{n}", spec.prefix);
            let pod = manifest(
                &spec.ns,
                &name,
                &spec.node,
                &spec.prefix,
                spec.forms[form].annotation.as_ref(),
            );
            match api.create_pod(&pod) {
                Ok(_) => {
                    out.created += 1;
                    live.push_back(Live {
                        name,
                        form,
                        created: Instant::now(),
                        settled: false,
                        deleting: false,
                        netns: None,
                        running_since: None,
                    });
                    n += 1;
                }
                Err(e) => {
                    out.api_errors += 1;
                    eprintln!("    churn: create {name}: {e:#}");
                }
            }
            next += spec.interval;
        }
        let pods = match api.list_pods(&spec.ns, &spec.prefix) {
            Ok(p) => p,
            Err(e) => {
                out.api_errors += 1;
                eprintln!("    churn: list: {e:#}");
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let by_name = |name: &str| {
            pods.iter()
                .find(|p| p["metadata"]["name"].as_str() == Some(name))
        };
        for l in live.iter_mut().filter(|l| !l.settled) {
            let Some(pod) = by_name(&l.name) else {
                continue;
            };
            let verdict = if running(pod) {
                let first = *l.running_since.get_or_insert_with(Instant::now);
                match check(spec, &cri, pod, &spec.forms[l.form], &mut out) {
                    Ok(Seen::Networks(netns, true)) => {
                        out.correct += 1;
                        out.running_ms
                            .push(l.created.elapsed().as_secs_f64() * 1000.0);
                        l.netns = Some(netns);
                        Some(Verdict::Correct)
                    }
                    Ok(Seen::Networks(netns, false)) => {
                        l.netns = Some(netns);
                        Some(Verdict::ClusterOnly { status: true })
                    }
                    // Running, network-status not written yet (daemon mode writes it after
                    // the answer).
                    Ok(Seen::NoStatus(_)) if first.elapsed() < status_grace => None,
                    Ok(Seen::NoStatus(netns)) => {
                        l.netns = Some(netns);
                        Some(Verdict::ClusterOnly { status: false })
                    }
                    Ok(Seen::Unavailable(_)) if l.created.elapsed() < spec.run_deadline => None,
                    Ok(Seen::Unavailable(why)) => Some(Verdict::Failed(format!(
                        "Running, but the runtime could not be asked for its sandbox: {why}"
                    ))),
                    Err(e) => Some(Verdict::Wrong(format!("{e:#}"))),
                }
            } else if l.created.elapsed() > spec.run_deadline {
                Some(Verdict::Failed(format!(
                    "{} after {:?}",
                    pod["status"]["phase"], spec.run_deadline
                )))
            } else {
                None
            };
            if let Some(v) = verdict {
                match &v {
                    Verdict::Wrong(why) => out.wrong_network.push(format!("{}: {why}", l.name)),
                    Verdict::Failed(why) => out.failed.push(format!("{}: {why}", l.name)),
                    _ => {}
                }
                out.pods.push(PodRecord {
                    name: l.name.clone(),
                    form: l.form,
                    created: l.created,
                    verdict: v,
                });
                l.settled = true;
            }
        }
        // Delete the oldest settled pods beyond `live` (all of them when stopping and every
        // pod is settled).
        let all_settled = live.iter().all(|l| l.settled);
        let undeleted = live.iter().filter(|l| !l.deleting).count();
        let mut excess = if stopping && all_settled {
            undeleted
        } else {
            undeleted.saturating_sub(spec.live)
        };
        for l in live.iter_mut().filter(|l| l.settled && !l.deleting) {
            if excess == 0 {
                break;
            }
            match api.delete_pod(&spec.ns, &l.name) {
                Ok(()) => {
                    l.deleting = true;
                    excess -= 1;
                }
                Err(e) => {
                    out.api_errors += 1;
                    eprintln!("    churn: delete {}: {e:#}", l.name);
                }
            }
        }
        live.retain(|l| {
            let gone = l.deleting
                && by_name(&l.name).is_none()
                && !l
                    .netns
                    .as_deref()
                    .is_some_and(|p| std::path::Path::new(p).exists());
            !gone
        });
        if stopping && live.is_empty() {
            break;
        }
        if stopping_since.is_some_and(|t| t.elapsed() > spec.run_deadline * 2) {
            let left: Vec<&str> = live.iter().map(|l| l.name.as_str()).collect();
            anyhow::bail!("churn pods not gone after stopping: {left:?} ({out:?})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    out.sandbox_retries = sandbox_retries(&api, spec).unwrap_or_else(|e| {
        eprintln!("    churn: events: {e:#}");
        0
    });
    Ok(out)
}

/// What a Running pod's netns and network-status say.
enum Seen {
    /// network-status written; netns path, and whether the pod has all its networks (`false`:
    /// eth0 alone although it asked for more, and network-status agreeing).
    Networks(String, bool),
    /// eth0 alone (or all its networks), no network-status (yet).
    NoStatus(String),
    /// The runtime could not be asked (containerd restarting): look again later.
    Unavailable(String),
}

/// A Running pod's network: its netns must hold eth0 plus either all of its form's interfaces
/// or none of them, and network-status (once written) must list exactly what the netns holds;
/// anything else is an error naming the difference.
fn check(spec: &Spec, cri: &Cri, pod: &Value, form: &Form, out: &mut Outcome) -> Result<Seen> {
    let uid = pod["metadata"]["uid"].as_str().context("uid")?;
    let sandboxes = match cri.sandboxes(Some(uid)) {
        Ok(s) => s,
        Err(e) => return Ok(Seen::Unavailable(format!("{e:#}"))),
    };
    let sb = sandboxes
        .into_iter()
        .find(|s| s.state == 0)
        .context("no ready sandbox")?;
    let netns = match cri.sandbox_netns(&sb.id) {
        Ok(n) => n,
        Err(e) => return Ok(Seen::Unavailable(format!("{e:#}"))),
    };
    if !out.sandboxes.contains(&sb.id) {
        out.sandboxes.push(sb.id.clone());
        out.netns.push(netns.clone());
    }
    let mut want: Vec<String> = vec!["eth0".into()];
    want.extend(form.extra.iter().map(|(_, i)| i.clone()));
    let mut have: Vec<String> = interfaces(&netns)?
        .into_keys()
        .filter(|i| i != "lo")
        .collect();
    have.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    let all = have == want_sorted;
    anyhow::ensure!(
        all || have == ["eth0"],
        "netns has {have:?}, its networks ask for {want:?}"
    );
    let status = network_status(pod)?;
    if status.is_empty() {
        return Ok(Seen::NoStatus(netns));
    }
    let mut expected: Vec<(&str, &str)> = vec![(spec.default_net.as_str(), "eth0")];
    if all {
        expected.extend(form.extra.iter().map(|(n, i)| (n.as_str(), i.as_str())));
    }
    check_pod_network(&status, &netns, &expected)?;
    Ok(Seen::Networks(netns, all))
}

/// `FailedCreatePodSandBox` events about this churn's pods.
fn sandbox_retries(api: &Api, spec: &Spec) -> Result<usize> {
    let events = api.events_with_reason(&spec.ns, "FailedCreatePodSandBox")?;
    Ok(events
        .iter()
        .filter(|e| {
            e["involvedObject"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("{}-", spec.prefix)))
        })
        .map(|e| e["count"].as_u64().unwrap_or(1) as usize)
        .sum())
}
