//! Reboot burst benchmark (issue 18, item 4): as many pods at once as a node holds (110, the
//! kubelet's `maxPods`) on a real node (containerd + kubelet v1.36, `realk8s::node`) whose
//! kubelet has just started, through each system with the same default network (bridge +
//! host-local, a /24) and, for all but the floor, one macvlan NAD:
//!
//! - **floor**: bridge + host-local alone (containerd execs `bridge`);
//! - **plexus-thin**: containerd execs `plexus`;
//! - **plexus-daemon**: containerd execs `plexus-shim`, `plexus-daemon` runs on the node;
//! - **multus-thick**: `multus-shim` + `multus-daemon` v4.3.0 (`/work/shared/peers`, or
//!   `PLEXUS_PEERS_BIN`) as host processes, the daemon in a mount namespace of its own with its
//!   ServiceAccount token bind-mounted where its in-cluster config looks.
//!
//! Every round of every system gets a fresh node (containerd and kubelet started, Node Ready:
//! a node just after a reboot), then the burst: all pods POSTed back to back, polled until all
//! are Running (and, with the NAD, carry a two-entry network-status), then all deleted and
//! polled until gone from the API with their netns gone. It prints, per run and as medians per
//! system against the floor: time until all Running, time until all gone, API requests
//! (`apiserver_request_total` deltas by verb + resource, the bench's own POST/LIST/DELETE taken
//! out), the node daemon's peak RSS (VmHWM) and the load average. After each run it checks that
//! nothing is left (netns, sandboxes still holding a network, host-local leases, bridge ports,
//! plexus' per-container files, libcni's cache entries), then stops the node, which removes
//! everything it made.
//!
//! Opt-in (minutes per run): skipped unless `PLEXUS_BURST=1`:
//!
//! ```sh
//! PLEXUS_BURST=1 PLEXUS_K8S_BIN=/work/shared/k8s/bin cargo test -p plexus-e2e --test bench_burst
//! ```
//!
//! `PLEXUS_BURST_PODS` (default 110), `PLEXUS_BURST_ROUNDS` (default 1; the order of systems
//! rotates per round, `PLEXUS_BURST_ROTATE=N` starts it N places on), `PLEXUS_BURST_SYSTEMS`
//! (comma-separated labels, default all), `PLEXUS_BURST_DAEMON_ARGS` (extra `plexus-daemon`
//! flags, e.g. `--max-concurrent 32`), and
//! `PLEXUS_PLEXUS_BIN` / `PLEXUS_PLEXUS_DAEMON_BIN` / `PLEXUS_PLEXUS_SHIM_BIN` for release
//! builds.

#[path = "bench_burst/api.rs"]
mod api;
mod common;
#[path = "bench_burst/systems.rs"]
mod systems;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use plexus_e2e::realk8s::node::Node;
use plexus_e2e::realk8s::{control_plane_or_skip, ControlPlane, Proc, RequestCounts};
use serde_json::{json, Value};

use api::Api;
use systems::{Layout, Peers, System};

const NS: &str = "burst";
const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
const IMAGE: &str = "docker.io/local/pause:1";

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> ExitCode {
    if std::env::var("PLEXUS_BURST").as_deref() != Ok("1") {
        eprintln!("bench_burst SKIPPED: a benchmark of minutes; run it with PLEXUS_BURST=1");
        return ExitCode::SUCCESS;
    }
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    match run(&cp) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_burst FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What one burst measured.
struct Figures {
    system: System,
    running: f64,
    running_p50: f64,
    gone: f64,
    create_requests: RequestCounts,
    delete_requests: RequestCounts,
    own: (u64, u64, u64),
    rss_peak_kib: Option<u64>,
    load: (String, String),
    /// What the deleted pods left behind (empty: nothing).
    leaks: Vec<String>,
    /// plexus-daemon's own per-call figures (from its log).
    inside: Vec<String>,
}

/// The bench's shared state: control plane, client, credentials, binaries.
struct Bench<'a> {
    cp: &'a ControlPlane,
    api: Api,
    dir: tempfile::TempDir,
    id: u32,
    pods: usize,
    plexus: PathBuf,
    plexus_daemon: PathBuf,
    plexus_shim: PathBuf,
    peers: Option<Peers>,
}

impl Bench<'_> {
    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("plexus.kubeconfig")
    }
}

fn run(cp: &ControlPlane) -> Result<()> {
    let pods = env_num("PLEXUS_BURST_PODS", 110);
    let rounds = env_num("PLEXUS_BURST_ROUNDS", 1).max(1);
    let rotate = env_num("PLEXUS_BURST_ROTATE", 0);
    let only: Option<Vec<String>> = std::env::var("PLEXUS_BURST_SYSTEMS")
        .ok()
        .map(|s| s.split(',').map(str::to_string).collect());
    cp.apply_deploy(&["nad-crd.yaml", "rbac.yaml", "rbac-daemon.yaml"])?;
    cp.create_namespace(NS)?;
    let dir = tempfile::Builder::new().prefix("plexus-burst-").tempdir()?;
    let peers = match Peers::find() {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("bench_burst: multus-thick left out: {e:#}");
            None
        }
    };
    let b = Bench {
        cp,
        api: Api::new(&cp.admin_kubeconfig())?,
        id: std::process::id() % 10_000,
        pods,
        plexus: common::bin("plexus"),
        plexus_daemon: common::bin("plexus-daemon"),
        plexus_shim: common::bin("plexus-shim"),
        peers,
        dir,
    };
    cp.write_kubeconfig(&b.kubeconfig(), &cp.create_token("kube-system", "plexus")?)?;
    let sa = b.dir.path().join("multus-sa");
    let made_sa_top = if b.peers.is_some() {
        systems::multus_credentials(cp, &sa)?;
        systems::sa_mount_point()?
    } else {
        None
    };
    let wanted: Vec<System> = System::ALL
        .into_iter()
        .filter(|s| {
            only.as_ref()
                .is_none_or(|o| o.iter().any(|x| x == s.label()))
        })
        .filter(|s| *s != System::MultusThick || b.peers.is_some())
        .collect();
    println!(
        "reboot burst: {pods} pods at once on a fresh node (containerd + kubelet v1.36), bridge + host-local default network, 1 macvlan NAD (not for the floor); {rounds} round(s), order rotated per round; plexus binaries: {}; 2-core machine shared with other work, load average shown per run",
        b.plexus.display()
    );
    let mut all = Vec::new();
    let mut failed = Vec::new();
    for round in 0..rounds {
        for i in 0..wanted.len() {
            let s = wanted[(i + round + rotate) % wanted.len()];
            match one_run(&b, s, round, &sa) {
                Ok(f) => {
                    print_run(&f, round);
                    if !f.leaks.is_empty() {
                        failed.push(format!("{} round {round}: left {:?}", s.label(), f.leaks));
                    }
                    all.push(f);
                }
                Err(e) => {
                    eprintln!("bench_burst: {} round {round} FAILED: {e:#}", s.label());
                    failed.push(format!("{} round {round}", s.label()));
                }
            }
        }
    }
    if let Some(top) = made_sa_top {
        let _ = std::fs::remove_dir_all(top);
    }
    summary(&all);
    ensure!(failed.is_empty(), "failed runs: {failed:?}");
    Ok(())
}

/// A host link deleted on drop (the bench's macvlan master, the default network's bridge).
struct LinkGuard(String);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.0])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn sh(args: &[&str]) -> Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    ensure!(
        out.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The node's CNI config, given the node's directory.
type ConfFn<'a> = dyn Fn(&Path) -> Value + 'a;

/// One system, one round: daemon, fresh node, burst, delete, leak checks, teardown.
fn one_run(b: &Bench<'_>, s: System, round: usize, sa: &Path) -> Result<Figures> {
    let l = Layout {
        dir: b.dir.path().join(format!("{}-{round}", s.label())),
        bridge: format!("pxu{}b", b.id),
        master: format!("pxu{}m", b.id),
        subnet: "10.237.0.0/24".into(),
        nad_subnet: "10.237.1.0/24".into(),
    };
    std::fs::create_dir_all(l.path("ipam"))?;
    let _bridge = LinkGuard(l.bridge.clone());
    let _master = LinkGuard(l.master.clone());
    // No dummy module on every kernel: a veth pair (deleting one end deletes both).
    let peer = format!("pxu{}p", b.id);
    sh(&[
        "ip", "link", "add", &l.master, "type", "veth", "peer", "name", &peer,
    ])?;
    sh(&["ip", "link", "set", &l.master, "up"])?;
    b.cp.apply(&l.nad(NS).to_string())?;
    let node_name = format!("burst-{}-{round}", s.label());

    let mut daemon: Option<Proc> = None;
    let (conf_name, conf): (&str, Box<ConfFn>) = match s {
        System::Floor => ("10-bridge.conf", Box::new(|_| l.default_network())),
        System::PlexusThin => (
            "00-plexus.conf",
            Box::new(|d| l.plexus_conf(d, &b.kubeconfig(), false)),
        ),
        System::PlexusDaemon => {
            daemon = Some(systems::plexus_daemon(
                &b.plexus_daemon,
                &l,
                &b.kubeconfig(),
                &node_name,
            )?);
            (
                "00-plexus.conf",
                Box::new(|d| l.plexus_conf(d, &b.kubeconfig(), true)),
            )
        }
        System::MultusThick => {
            let peers = b.peers.as_ref().context("no peers")?;
            let (p, v) = systems::multus_daemon(b.cp, peers, &l, sa, &node_name)?;
            daemon = Some(p);
            ("00-multus.conf", Box::new(move |_| v.clone()))
        }
    };
    let mut node = Node::start(b.cp, b.cp.bins(), &node_name, conf_name, &*conf)?;
    node.own_link(&l.bridge);
    let exec = match s {
        System::Floor => None,
        System::PlexusThin => Some(("plexus", b.plexus.clone())),
        System::PlexusDaemon => Some(("plexus-shim", b.plexus_shim.clone())),
        System::MultusThick => Some(("multus-shim", b.peers.as_ref().unwrap().shim.clone())),
    };
    if let Some((name, bin)) = exec {
        std::os::unix::fs::symlink(&bin, node.bin_dir().join(name))?;
    }
    if s == System::PlexusDaemon {
        // The shim's thin fallback, installed next to it as the DaemonSet's installer does.
        std::os::unix::fs::symlink(&b.plexus, node.bin_dir().join("plexus"))?;
    }
    let result = burst(b, s, &node, &l, round, daemon.as_mut());
    if result.is_err() {
        eprintln!("{}", node.logs(30));
        for log in ["plexus-daemon.log", "multus/daemon.log"] {
            if l.path(log).exists() {
                eprintln!("--- {log}\n{}", plexus_e2e::realk8s::tail(&l.path(log), 30));
            }
        }
    }
    // The node first: its stop removes the remaining (stopped) sandboxes, which runs DEL
    // again, through the daemon while it is there.
    node.stop();
    drop(node);
    drop(daemon);
    let mut f = result?;
    f.load.1 = loadavg();
    for link in [&l.bridge, &l.master] {
        let shown = Command::new("ip").args(["link", "show", link]).output()?;
        if link == &l.bridge {
            ensure!(!shown.status.success(), "bridge {link} left after the node");
        }
    }
    Ok(f)
}

/// The burst on a ready node: create, wait Running, delete, wait gone, check leftovers.
fn burst(
    b: &Bench<'_>,
    s: System,
    node: &Node<'_>,
    l: &Layout,
    round: usize,
    daemon: Option<&mut Proc>,
) -> Result<Figures> {
    let batch = format!("{}-{round}", s.label());
    let load0 = loadavg();
    let own0 = b.api.sent.get();
    let before = b.cp.request_totals()?;
    let t0 = Instant::now();
    let mut names = Vec::new();
    for i in 0..b.pods {
        let name = format!("{batch}-{i}");
        let mut annotations = json!({});
        if s.with_nad() {
            annotations[NETWORKS] = json!("data");
        }
        let pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":name,"namespace":NS,"labels":{"batch":batch},"annotations":annotations},
            "spec":{"nodeName":node.name(),"automountServiceAccountToken":false,"enableServiceLinks":false,
                "dnsPolicy":"Default","terminationGracePeriodSeconds":1,
                "containers":[{"name":"c","image":IMAGE,"imagePullPolicy":"Never"}]}});
        b.api.create_pod(&pod)?;
        names.push(name);
    }
    // All Running (and, with the NAD, a network-status naming both networks).
    let mut at: BTreeMap<String, f64> = BTreeMap::new();
    let deadline = t0 + Duration::from_secs(420);
    let running = loop {
        let list = b.api.list_pods(NS, &batch)?;
        for p in &list {
            let ready =
                p["status"]["phase"] == "Running" && (!s.with_nad() || status_entries(p) >= 2);
            let name = p["metadata"]["name"].as_str().unwrap_or("").to_string();
            if ready {
                at.entry(name).or_insert_with(|| t0.elapsed().as_secs_f64());
            }
        }
        if at.len() == names.len() {
            break t0.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            let failed = list
                .iter()
                .filter(|p| p["status"]["phase"] != "Running")
                .count();
            bail!(
                "{}/{} pods ready after 420 s ({failed} not Running)",
                at.len(),
                names.len()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let mid = b.cp.request_totals()?;
    let own_mid = b.api.sent.get();
    let sandboxes = node.cri().sandboxes(None)?;
    let mut netns = Vec::new();
    for sb in sandboxes.iter().filter(|sb| sb.state == 0) {
        netns.push(node.cri().sandbox_netns(&sb.id)?);
    }
    ensure!(
        netns.len() == names.len(),
        "{} ready sandboxes for {} pods",
        netns.len(),
        names.len()
    );
    let ids: Vec<String> = sandboxes.iter().map(|sb| sb.id.clone()).collect();

    // All deleted.
    let t1 = Instant::now();
    for n in &names {
        b.api.delete_pod(NS, n)?;
    }
    let deadline = t1 + Duration::from_secs(600);
    let gone = loop {
        let left = b.api.list_pods(NS, &batch)?.len();
        let ns_left = netns.iter().filter(|p| Path::new(p).exists()).count();
        if left == 0 && ns_left == 0 {
            break t1.elapsed().as_secs_f64();
        }
        if Instant::now() > deadline {
            bail!("after 600 s: {left} pods in the API, {ns_left} netns left");
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let end = b.cp.request_totals()?;
    let own_end = b.api.sent.get();
    let rss_peak_kib = daemon
        .and_then(|d| d.pid())
        .map(|pid| plexus_e2e::procfs::rss_kib(pid).1);
    let leaks = leftovers(node, l, &ids)?;
    let log = std::fs::read_to_string(l.path("plexus-daemon.log")).unwrap_or_default();
    let inside: Vec<String> = ["ADD", "DEL"]
        .iter()
        .filter_map(|v| systems::daemon_calls(&log, v))
        .collect();

    let mut pod_times: Vec<f64> = at.into_values().collect();
    pod_times.sort_by(f64::total_cmp);
    let own = |a: (u64, u64, u64), z: (u64, u64, u64)| (z.0 - a.0, z.1 - a.1, z.2 - a.2);
    Ok(Figures {
        system: s,
        running,
        running_p50: pod_times[pod_times.len() / 2],
        gone,
        create_requests: others(&before, &mid, own(own0, own_mid)),
        delete_requests: others(&mid, &end, own(own_mid, own_end)),
        own: own(own0, own_end),
        rss_peak_kib,
        load: (load0, String::new()),
        leaks,
        inside,
    })
}

/// Entries in the pod's network-status annotation.
fn status_entries(pod: &Value) -> usize {
    pod["metadata"]["annotations"][STATUS]
        .as_str()
        .and_then(|s| serde_json::from_str::<Vec<Value>>(s).ok())
        .map_or(0, |v| v.len())
}

/// `after - before` for every resource request, minus the bench's own (POST, LIST, DELETE pods).
fn others(before: &RequestCounts, after: &RequestCounts, own: (u64, u64, u64)) -> RequestCounts {
    let mut d: RequestCounts = after
        .iter()
        .filter(|(k, _)| !k.resource.is_empty())
        .filter_map(|(k, v)| {
            let n = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (n > 0).then(|| (k.clone(), n))
        })
        .collect();
    for (verb, n) in [("POST", own.0), ("LIST", own.1), ("DELETE", own.2)] {
        let k = plexus_e2e::realk8s::RequestKey::new(verb, "pods", "");
        if let Some(v) = d.get_mut(&k) {
            *v = v.saturating_sub(n);
        }
    }
    d.retain(|_, v| *v > 0);
    d
}

/// What the deleted pods left on the node (empty: nothing). Plexus' tombstones are by design
/// (repeated-DEL markers, swept after an hour); a file anywhere else under plexus' `cniDir`
/// or `/var/lib/cni` (libcni's cache, Multus' cache) naming a sandbox is a leak, and is
/// removed after being reported.
fn leftovers(node: &Node<'_>, l: &Layout, ids: &[String]) -> Result<Vec<String>> {
    let mut leaks = Vec::new();
    let ready: Vec<_> = node
        .cri()
        .sandboxes(None)?
        .into_iter()
        .filter(|sb| sb.state == 0)
        .map(|sb| sb.id)
        .collect();
    if !ready.is_empty() {
        leaks.push(format!("{} sandboxes still ready", ready.len()));
    }
    let mut leases: BTreeMap<String, usize> = BTreeMap::new();
    for p in files_under(&l.path("ipam")) {
        let is_lease = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok());
        if is_lease {
            let net = p.parent().and_then(|d| d.file_name());
            let net = net.map_or(String::new(), |n| n.to_string_lossy().into_owned());
            *leases.entry(net).or_default() += 1;
        }
    }
    for (net, n) in leases {
        leaks.push(format!("{n} host-local leases of network {net}"));
    }
    let ports = Command::new("ip")
        .args(["-o", "link", "show", "master", &l.bridge])
        .output()?;
    let ports = String::from_utf8_lossy(&ports.stdout);
    let ports = ports.lines().count();
    if ports > 0 {
        leaks.push(format!("{ports} ports on {}", l.bridge));
    }
    let mut named: BTreeMap<String, usize> = BTreeMap::new();
    for root in [node.plexus_dir(), node.host_path("/var/lib/cni")] {
        for f in files_under(&root) {
            let s = f.display().to_string();
            if s.contains("/tombstones/") || !ids.iter().any(|id| s.contains(id.as_str())) {
                continue;
            }
            let dir = f
                .parent()
                .map_or(String::new(), |d| d.display().to_string());
            *named.entry(dir).or_default() += 1;
            let _ = std::fs::remove_file(&f);
        }
    }
    for (dir, n) in named {
        leaks.push(format!("{n} files naming a deleted pod's sandbox in {dir}"));
    }
    Ok(leaks)
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn total(c: &RequestCounts) -> u64 {
    c.values().sum()
}

fn shown(c: &RequestCounts) -> String {
    c.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_run(f: &Figures, round: usize) {
    let rss = f.rss_peak_kib.map_or("–".to_string(), |k| {
        format!("{:.1} MiB", k as f64 / 1024.0)
    });
    println!(
        "{} round {round}: all Running {:.1} s (median pod {:.1} s), all gone {:.1} s; daemon peak RSS {rss}; load {} → {}\n  API requests, create→Running: {} ({})\n  API requests, delete→gone: {} ({})\n  (the bench's own POST/LIST/DELETE pods taken out: {:?})",
        f.system.label(),
        f.running,
        f.running_p50,
        f.gone,
        f.load.0,
        f.load.1,
        total(&f.create_requests),
        shown(&f.create_requests),
        total(&f.delete_requests),
        shown(&f.delete_requests),
        f.own,
    );
    for line in &f.inside {
        println!("  {line}");
    }
    if f.leaks.is_empty() {
        println!("  nothing left after delete");
    } else {
        println!("  LEFT AFTER DELETE: {}", f.leaks.join("; "));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Medians per system against the floor, as a Markdown table.
fn summary(all: &[Figures]) {
    let pick = |s: System, f: &dyn Fn(&Figures) -> f64| {
        median(all.iter().filter(|x| x.system == s).map(f).collect())
    };
    let floor_run = pick(System::Floor, &|f| f.running);
    let floor_gone = pick(System::Floor, &|f| f.gone);
    let floor_req = pick(System::Floor, &|f| {
        (total(&f.create_requests) + total(&f.delete_requests)) as f64
    });
    let vs = |x: f64, floor: f64| {
        if floor.is_nan() {
            String::new()
        } else {
            format!(" ({:+.1} %)", (x / floor - 1.0) * 100.0)
        }
    };
    println!("\n| system | runs | all Running | all gone | API requests (create + delete) | daemon peak RSS |");
    println!("|---|---|---|---|---|---|");
    for s in System::ALL {
        let n = all.iter().filter(|x| x.system == s).count();
        if n == 0 {
            continue;
        }
        let run = pick(s, &|f| f.running);
        let gone = pick(s, &|f| f.gone);
        let c = pick(s, &|f| total(&f.create_requests) as f64);
        let d = pick(s, &|f| total(&f.delete_requests) as f64);
        let rss = all
            .iter()
            .filter(|x| x.system == s)
            .filter_map(|x| x.rss_peak_kib)
            .max()
            .map_or("–".to_string(), |k| {
                format!("{:.1} MiB", k as f64 / 1024.0)
            });
        println!(
            "| {} | {n} | {run:.1} s{} | {gone:.1} s{} | {c:.0} + {d:.0}{} | {rss} |",
            s.label(),
            vs(run, floor_run),
            vs(gone, floor_gone),
            vs(c + d, floor_req)
        );
    }
}
