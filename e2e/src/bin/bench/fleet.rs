//! `plexus-bench --fleet N`: N daemon-mode nodes against one real kube-apiserver + etcd on this
//! machine, measured, not modelled. Each system gets a fresh control plane with the same
//! objects (N nodes' worth of pods, one NAD) and then:
//! - **steady state**: the apiserver's and etcd's CPU and memory, watches open, requests per
//!   second, the daemons' RSS and CPU, over a quiet window;
//! - **churn**: pods created and deleted across the fleet at a fixed rate, each ADDed and DELed
//!   through its node's shim (bridge + host-local default network, one macvlan NAD): ADD
//!   latency percentiles and API requests per pod start;
//! - **restart storm**: every daemon SIGKILLed and started again at once, each node then asked
//!   for an ADD until one succeeds: time until every node serves, relist requests and bytes,
//!   the apiserver's peak memory, 429s.
//!
//! Systems: the Plexus daemon (`plexus-daemon` + `plexus-shim`), Multus thick v4.3.0
//! (`multus-daemon` + `multus-shim`, in-cluster token, `MULTUS_NODE_NAME`) and Plexus thin (no
//! daemon: churn only). Everything listens on 127.0.0.1. Knobs (environment):
//! `PLEXUS_FLEET_PODS_PER_NODE` (10), `PLEXUS_FLEET_RATE` (pod starts per second, 5),
//! `PLEXUS_FLEET_CHURN_SECS` (30), `PLEXUS_FLEET_STEADY_SECS` (30), `PLEXUS_FLEET_SYSTEMS`
//! (comma list of `plexus-daemon,multus-thick,plexus-thin`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::procfs::rss_kib;
use plexus_e2e::realk8s::{bins::find_usable, metrics, ControlPlane, K8sBins, RequestCounts};
use serde_json::{json, Value};

use crate::{exec, plexus_env, sh};

const NS: &str = "fleet";
const SA_DIR: &str = "/run/secrets/kubernetes.io/serviceaccount";
/// Prefix of every network namespace the fleet creates (removed at start and end).
pub(crate) const NETNS_PREFIX: &str = "pxf-";

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Which system a run measures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    PlexusDaemon,
    MultusThick,
    PlexusThin,
}

impl Kind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::PlexusDaemon => "Plexus daemon",
            Kind::MultusThick => "Multus thick",
            Kind::PlexusThin => "Plexus thin",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Kind::PlexusDaemon => "plexus-daemon",
            Kind::MultusThick => "multus-thick",
            Kind::PlexusThin => "plexus-thin",
        }
    }
}

/// The binaries a run needs.
pub(crate) struct Bins {
    plexus: PathBuf,
    shim: PathBuf,
    multus_daemon: PathBuf,
    multus_shim: PathBuf,
    cni: PathBuf,
}

impl Bins {
    /// `plexus` and `plexus-shim` next to it, Multus from `PLEXUS_PEERS_BIN`, the plugins.
    pub(crate) fn find(plexus: &Path, cni_bin: &Path) -> Result<Bins> {
        let peers_dir = std::env::var_os("PLEXUS_PEERS_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/work/shared/peers/bin"));
        let peer = |name: &str| -> Result<PathBuf> {
            find_usable(&peers_dir, name)?
                .with_context(|| format!("no {name} in {}", peers_dir.display()))
        };
        let shim = plexus.with_file_name("plexus-shim");
        ensure!(shim.exists(), "no plexus-shim next to {}", plexus.display());
        Ok(Bins {
            plexus: plexus.to_path_buf(),
            shim,
            multus_daemon: peer("multus-daemon")?,
            multus_shim: peer("multus-shim")?,
            cni: cni_bin.to_path_buf(),
        })
    }
}

/// CPU time (user + system) of `pid` so far, seconds.
fn cpu_secs(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Sum of the samples of metric `name` whose labels include every `(key, value)` of `want`.
pub(crate) fn metric_sum(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (head, value) = l.rsplit_once(' ')?;
            let (n, labels) = match head.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (head, ""),
            };
            if n != name {
                return None;
            }
            let ok = want
                .iter()
                .all(|(k, v)| labels.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            ok.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

/// Percentiles (p50, p90, p99, max) of `v`, ms.
fn percentiles(v: &[f64]) -> (f64, f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    }
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9), at(0.99), s[s.len() - 1])
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// A daemon process of the fleet, killed on drop.
struct Daemon {
    child: Child,
}

impl Daemon {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A sysctl raised to at least a value for the run, restored on drop.
struct RaisedSysctl {
    path: &'static str,
    old: Option<String>,
}

impl RaisedSysctl {
    fn at_least(path: &'static str, want: u64) -> RaisedSysctl {
        let old = std::fs::read_to_string(path).ok();
        let cur = old
            .as_deref()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if cur < want {
            let _ = std::fs::write(path, want.to_string());
            return RaisedSysctl { path, old };
        }
        RaisedSysctl { path, old: None }
    }
}

impl Drop for RaisedSysctl {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            let _ = std::fs::write(self.path, old.trim());
        }
    }
}

/// One system's fleet on its own control plane.
pub(crate) struct Fleet {
    kind: Kind,
    cp: ControlPlane,
    dir: tempfile::TempDir,
    nodes: usize,
    bins: Arc<Bins>,
    bridge: String,
    master: String,
    daemons: Vec<Daemon>,
    /// The config the runtime hands each node's CNI entry.
    confs: Vec<Value>,
    made_sa_dir: Option<PathBuf>,
    /// Every multus-daemon holds an inotify instance (its config watcher): a machine hosting
    /// hundreds of "nodes" needs more than the default 128 per user.
    _inotify: Option<RaisedSysctl>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.daemons.clear();
        sh(&["ip", "link", "del", &self.master]);
        sh(&["ip", "link", "del", &self.bridge]);
        if let Some(d) = &self.made_sa_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Removes every network namespace the fleet made (a run stopped half-way leaves some).
pub(crate) fn remove_fleet_netns() {
    let out = Command::new("ip").args(["netns", "list"]).output();
    if let Ok(out) = out {
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let name = l.split_whitespace().next().unwrap_or("");
            if name.starts_with(NETNS_PREFIX) {
                sh(&["ip", "netns", "del", name]);
            }
        }
    }
}

impl Fleet {
    pub(crate) fn start(kind: Kind, nodes: usize, bins: Arc<Bins>) -> Result<Fleet> {
        Self::start_with(kind, nodes, bins, false)
    }

    /// [`Fleet::start`]; `address_claims`: with the AddressClaim CRD installed.
    pub(crate) fn start_with(
        kind: Kind,
        nodes: usize,
        bins: Arc<Bins>,
        address_claims: bool,
    ) -> Result<Fleet> {
        let Some(k8s) = K8sBins::from_env()? else {
            bail!("--fleet needs PLEXUS_K8S_BIN (the kube-apiserver and etcd binaries)");
        };
        let cp = ControlPlane::start(&k8s)?;
        let mut deploy = vec!["nad-crd.yaml", "rbac.yaml", "rbac-daemon.yaml"];
        if address_claims {
            deploy.extend(["rbac-fixed-ips.yaml", "address-claim-crd.yaml"]);
        }
        cp.apply_deploy(&deploy)?;
        cp.create_namespace(NS)?;
        let dir = tempfile::Builder::new().prefix("plexus-fleet-").tempdir()?;
        let id = std::process::id() % 10000;
        let (bridge, master) = (format!("pxfb{id}"), format!("pxfm{id}"));
        sh(&[
            "ip",
            "link",
            "add",
            &master,
            "type",
            "veth",
            "peer",
            "name",
            &format!("pxfp{id}"),
        ]);
        sh(&["ip", "link", "set", &master, "up"]);
        let f = Fleet {
            kind,
            cp,
            dir,
            nodes,
            bins,
            bridge,
            master,
            daemons: vec![],
            confs: vec![],
            made_sa_dir: None,
            _inotify: (kind == Kind::MultusThick).then(|| {
                RaisedSysctl::at_least(
                    "/proc/sys/fs/inotify/max_user_instances",
                    128 + 2 * nodes as u64,
                )
            }),
        };
        let token = f.cp.create_token("kube-system", "plexus")?;
        f.cp.write_kubeconfig(&f.path("kubeconfig"), &token)?;
        crate::peers::multus_service_account(&f.cp, &f.path("multus-sa"))?;
        let mut nad = f.macvlan();
        nad.as_object_mut().unwrap().remove("name");
        let (code, body) = f.cp.send(
            "POST",
            &format!("/apis/k8s.cni.cncf.io/v1/namespaces/{NS}/network-attachment-definitions"),
            Some(
                &json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                    "metadata":{"name":"data","namespace":NS},"spec":{"config":nad.to_string()}})
                .to_string(),
            ),
        )?;
        ensure!(code == 201, "NAD: HTTP {code}: {body}");
        // A network with one fixed address (the address guard's case, `--address-scale`).
        let fixed = json!({"cniVersion":"1.0.0","type":"macvlan","master":f.master,"mode":"bridge",
            "ipam":{"type":"static","addresses":[{"address":"10.195.0.10/24"}]}});
        let (code, body) = f.cp.send(
            "POST",
            &format!("/apis/k8s.cni.cncf.io/v1/namespaces/{NS}/network-attachment-definitions"),
            Some(
                &json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                    "metadata":{"name":"fixed","namespace":NS},"spec":{"config":fixed.to_string()}})
                .to_string(),
            ),
        )?;
        ensure!(code == 201, "NAD fixed: HTTP {code}: {body}");
        Ok(f)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The apiserver's `/metrics` text.
    pub(crate) fn cp_metrics(&self) -> Result<String> {
        self.cp.metrics_text()
    }

    pub(crate) fn node(i: usize) -> String {
        format!("fleet-{i:03}")
    }

    /// The default network: bridge + host-local, one lease directory for the whole fleet (all
    /// nodes share this machine's bridge).
    fn default_network(&self) -> Value {
        json!({"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":self.bridge,"isGateway":true,
            "ipam":{"type":"host-local","dataDir":self.path("ipam"),"ranges":[[{"subnet":"10.197.0.0/16"}]]}})
    }

    /// The NAD's network: macvlan on the fleet's veth with host-local leases.
    fn macvlan(&self) -> Value {
        json!({"cniVersion":"1.0.0","name":"data","type":"macvlan","master":self.master,"mode":"bridge",
            "ipam":{"type":"host-local","dataDir":self.path("ipam-nad"),"ranges":[[{"subnet":"10.196.0.0/16"}]]}})
    }

    /// Plexus' config for node `i` (`type` plexus or plexus-shim), its own state directory.
    fn plexus_conf(&self, i: usize, type_: &str) -> Value {
        json!({"cniVersion":"1.0.0","name":"fleet","type":type_,
            "kubeconfig":self.path("kubeconfig"),"cniDir":self.path(&format!("n{i}/state")),
            "binDir":self.bins.cni,"logLevel":"error","logToStderr":false,
            "daemonSocket":self.path(&format!("n{i}/plexus.sock")),
            "nadPolicy":nad_policy_allowing(&[self.dir.path()]),
            "delegates":[self.default_network()]})
    }

    /// A pod on node `node` asking for the NAD: its uid.
    fn create_pod(&self, name: &str, node: &str) -> Result<String> {
        self.create_pod_with(name, node, "data")
    }

    /// A pod on node `node` asking for `networks`: its uid.
    pub(crate) fn create_pod_with(&self, name: &str, node: &str, networks: &str) -> Result<String> {
        let pod = json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":NS,
            "labels":{"app":"fleet"},
            "annotations":{"k8s.v1.cni.cncf.io/networks":networks}},
            "spec":{"nodeName":node,"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}});
        let (code, body) = self.cp.send(
            "POST",
            &format!("/api/v1/namespaces/{NS}/pods"),
            Some(&pod.to_string()),
        )?;
        ensure!(code == 201, "create pod {name}: HTTP {code}: {body}");
        let v: Value = serde_json::from_str(&body)?;
        Ok(v["metadata"]["uid"].as_str().context("uid")?.to_string())
    }

    pub(crate) fn delete_pod(&self, name: &str) -> Result<()> {
        let (code, body) = self.cp.send(
            "DELETE",
            &format!("/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0"),
            None,
        )?;
        ensure!(
            code == 200 || code == 404,
            "delete pod {name}: HTTP {code}: {body}"
        );
        Ok(())
    }

    /// `per_node` pods on every node, created by 4 writers.
    pub(crate) fn populate(&self, per_node: usize) -> Result<()> {
        let total = self.nodes * per_node;
        let next = AtomicU64::new(0);
        std::thread::scope(|s| -> Result<()> {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| -> Result<()> {
                        loop {
                            let j = next.fetch_add(1, Ordering::Relaxed) as usize;
                            if j >= total {
                                return Ok(());
                            }
                            self.create_pod(&format!("idle-{j}"), &Self::node(j % self.nodes))?;
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().expect("populate worker")?;
            }
            Ok(())
        })
    }

    /// Start node `i`'s daemon (none in thin mode); its config for the runtime.
    fn start_daemon(&self, i: usize) -> Result<Option<Daemon>> {
        let node = Self::node(i);
        let nd = self.path(&format!("n{i}"));
        std::fs::create_dir_all(&nd)?;
        match self.kind {
            Kind::PlexusThin => Ok(None),
            Kind::PlexusDaemon => {
                let _ = std::fs::remove_file(nd.join("ready"));
                let child = Command::new(&self.bins.plexus)
                    .arg("daemon")
                    .args(["--socket", nd.join("plexus.sock").to_str().unwrap()])
                    .args(["--kubeconfig", self.path("kubeconfig").to_str().unwrap()])
                    .args(["--node", &node])
                    .args(["--readiness-file", nd.join("ready").to_str().unwrap()])
                    .env_remove("KUBERNETES_SERVICE_HOST")
                    .env("PLEXUS_LOG_LEVEL", "warn")
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(nd.join("daemon.log"))?,
                    )
                    .spawn()
                    .context("start plexus daemon")?;
                Ok(Some(Daemon { child }))
            }
            Kind::MultusThick => {
                for sub in ["netd", "auto", "run"] {
                    std::fs::create_dir_all(nd.join(sub))?;
                }
                let auto =
                    json!({"cniVersion":"1.0.0","name":"cbr0","plugins":[self.default_network()]});
                std::fs::write(nd.join("auto/10-bridge.conflist"), auto.to_string())?;
                let run = format!("{}/", nd.join("run").display());
                let cfg = json!({"chrootDir":"","cniVersion":"0.3.1","logToStderr":true,"logLevel":"error",
                    "cniConfigDir":nd.join("netd"),"multusAutoconfigDir":nd.join("auto"),"multusConfigFile":"auto",
                    "socketDir":run,"daemonSocketDir":run,"binDir":self.bins.cni});
                std::fs::write(nd.join("daemon.json"), cfg.to_string())?;
                let script = format!(
                    "mount --bind {} {SA_DIR} && exec {} -config {}",
                    self.path("multus-sa").display(),
                    self.bins.multus_daemon.display(),
                    nd.join("daemon.json").display()
                );
                let child = Command::new("unshare")
                    // `slave`: the pods' netns mounts made after the start reach the daemon; its
                    // token mount stays its own.
                    .args(["-m", "--propagation", "slave", "sh", "-c", &script])
                    .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
                    .env("KUBERNETES_SERVICE_PORT", self.cp.port().to_string())
                    .env("MULTUS_NODE_NAME", &node)
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(nd.join("daemon.log"))?,
                    )
                    .spawn()
                    .context("start multus-daemon")?;
                Ok(Some(Daemon { child }))
            }
        }
    }

    /// Whether node `i`'s daemon says it is ready (Plexus: readiness file; Multus: its config
    /// and socket written).
    fn ready(&self, i: usize) -> bool {
        let nd = self.path(&format!("n{i}"));
        match self.kind {
            Kind::PlexusThin => true,
            Kind::PlexusDaemon => nd.join("ready").exists(),
            Kind::MultusThick => {
                nd.join("netd/00-multus.conf").exists() && nd.join("run/multus.sock").exists()
            }
        }
    }

    /// Start every node's daemon at once; seconds until all say they are ready.
    pub(crate) fn start_all(&mut self) -> Result<f64> {
        if self.kind == Kind::MultusThick && !Path::new(SA_DIR).exists() {
            let top = Path::new("/run/secrets");
            if !top.exists() {
                self.made_sa_dir = Some(top.to_path_buf());
            }
            std::fs::create_dir_all(SA_DIR)?;
        }
        let t = Instant::now();
        for i in 0..self.nodes {
            if let Some(d) = self.start_daemon(i)? {
                self.daemons.push(d);
            }
        }
        while !(0..self.nodes).all(|i| self.ready(i)) {
            ensure!(
                t.elapsed() < Duration::from_secs(300),
                "{} of {} daemons ready after 300 s",
                (0..self.nodes).filter(|i| self.ready(*i)).count(),
                self.nodes
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let took = t.elapsed().as_secs_f64();
        self.confs = (0..self.nodes)
            .map(|i| self.runtime_conf(i))
            .collect::<Result<_>>()?;
        Ok(took)
    }

    fn runtime_conf(&self, i: usize) -> Result<Value> {
        Ok(match self.kind {
            Kind::PlexusThin => self.plexus_conf(i, "plexus"),
            Kind::PlexusDaemon => self.plexus_conf(i, "plexus-shim"),
            Kind::MultusThick => serde_json::from_slice(&std::fs::read(
                self.path(&format!("n{i}/netd/00-multus.conf")),
            )?)?,
        })
    }

    fn entry(&self) -> &Path {
        match self.kind {
            Kind::PlexusThin => &self.bins.plexus,
            Kind::PlexusDaemon => &self.bins.shim,
            Kind::MultusThick => &self.bins.multus_shim,
        }
    }

    /// One CNI call on node `i` for pod (`pod`, `uid`) in netns `netns`: success and output.
    pub(crate) fn call(
        &self,
        i: usize,
        cmd: &str,
        pod: &str,
        uid: &str,
        netns: &str,
    ) -> (bool, String) {
        let cid = format!("{pod}-{uid}");
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={pod};K8S_POD_UID={uid};K8S_POD_INFRA_CONTAINER_ID={cid}");
        let netns = format!("/run/netns/{netns}");
        let cni_path = self.bins.cni.display().to_string();
        exec(
            self.entry(),
            &plexus_env(cmd, &cid, &netns, &cni_path, &args),
            &self.confs[i],
        )
    }

    fn daemon_pids(&self) -> Vec<u32> {
        self.daemons.iter().map(Daemon::pid).collect()
    }
}

/// What the apiserver's `/metrics` says at one moment, the parts the fleet reads.
struct Snapshot {
    at: Instant,
    requests: RequestCounts,
    text: String,
    api_cpu: f64,
    etcd_cpu: f64,
    daemons_cpu: f64,
}

fn snapshot(f: &Fleet) -> Result<Snapshot> {
    let text = f.cp.metrics_text()?;
    let (api, etcd) = f.cp.pids();
    Ok(Snapshot {
        at: Instant::now(),
        requests: metrics::parse_request_totals(&text),
        api_cpu: api.map(cpu_secs).unwrap_or(0.0),
        etcd_cpu: etcd.map(cpu_secs).unwrap_or(0.0),
        daemons_cpu: f.daemon_pids().into_iter().map(cpu_secs).sum(),
        text,
    })
}

fn requests_between(a: &Snapshot, b: &Snapshot, keep: impl Fn(&str, &str) -> bool) -> u64 {
    b.requests
        .iter()
        .filter(|(k, _)| keep(&k.verb, &k.resource))
        .map(|(k, v)| v.saturating_sub(a.requests.get(k).copied().unwrap_or(0)))
        .sum()
}

fn metric_delta(a: &Snapshot, b: &Snapshot, name: &str, want: &[(&str, &str)]) -> f64 {
    metric_sum(&b.text, name, want) - metric_sum(&a.text, name, want)
}

/// Samples `pid`'s RSS every 50 ms until dropped; the peak, KiB.
struct PeakSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl PeakSampler {
    fn start(pid: Option<u32>) -> PeakSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (s, p) = (stop.clone(), peak.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(pid) = pid {
                    p.fetch_max(rss_kib(pid).0, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        PeakSampler {
            stop,
            peak,
            handle: Some(handle),
        }
    }
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// One system's figures.
#[derive(Default)]
struct Figures {
    start_all_s: f64,
    api_rss_before_mib: f64,
    watches_before: f64,
    // Steady state.
    api_cpu_pct: f64,
    etcd_cpu_pct: f64,
    api_rss_mib: f64,
    etcd_rss_mib: f64,
    watches: f64,
    req_per_s: f64,
    daemon_rss_median_mib: f64,
    daemon_rss_total_mib: f64,
    daemons_cpu_pct: f64,
    // Churn.
    churn_adds: usize,
    churn_failed: usize,
    add_ms: (f64, f64, f64, f64),
    req_per_add: f64,
    churn_api_cpu_pct: f64,
    // Restart storm.
    storm: Option<Storm>,
}

struct Storm {
    all_serving_s: f64,
    median_serving_s: f64,
    lists: f64,
    list_mib: f64,
    watches_after: f64,
    api_peak_mib: f64,
    api_cpu_s: f64,
    too_many: f64,
    failed_adds: u64,
}

fn steady(f: &Fleet, secs: u64, fig: &mut Figures) -> Result<()> {
    let a = snapshot(f)?;
    std::thread::sleep(Duration::from_secs(secs));
    let b = snapshot(f)?;
    if let Ok(dir) = std::env::var("PLEXUS_FLEET_METRICS_DIR") {
        let _ = std::fs::write(
            Path::new(&dir).join(format!("{}-steady.prom", f.kind.key())),
            &b.text,
        );
        let uris: std::collections::BTreeSet<String> =
            f.cp.audit()
                .into_iter()
                .filter(|e| e.verb == "list" || e.verb == "watch")
                .map(|e| format!("{} {} {}", e.user, e.verb, e.uri))
                .collect();
        let _ = std::fs::write(
            Path::new(&dir).join(format!("{}-lists.txt", f.kind.key())),
            uris.into_iter().collect::<Vec<_>>().join("\n"),
        );
    }
    let wall = b.at.duration_since(a.at).as_secs_f64();
    fig.api_cpu_pct = (b.api_cpu - a.api_cpu) / wall * 100.0;
    fig.etcd_cpu_pct = (b.etcd_cpu - a.etcd_cpu) / wall * 100.0;
    fig.daemons_cpu_pct = (b.daemons_cpu - a.daemons_cpu) / wall * 100.0;
    fig.req_per_s = requests_between(&a, &b, |v, _| v != "WATCH") as f64 / wall;
    fig.watches = metric_sum(
        &b.text,
        "apiserver_longrunning_requests",
        &[("verb", "WATCH")],
    );
    let (api, etcd) = f.cp.pids();
    fig.api_rss_mib = mib(api.map(|p| rss_kib(p).0).unwrap_or(0));
    fig.etcd_rss_mib = mib(etcd.map(|p| rss_kib(p).0).unwrap_or(0));
    let mut rss: Vec<u64> = f.daemon_pids().into_iter().map(|p| rss_kib(p).0).collect();
    rss.sort();
    if !rss.is_empty() {
        fig.daemon_rss_median_mib = mib(rss[rss.len() / 2]);
        fig.daemon_rss_total_mib = mib(rss.iter().sum());
    }
    Ok(())
}

/// Pod starts at `rate` per second for `secs` s, round robin over the nodes; each pod is
/// created, ADDed through its node's entry a second later (as a kubelet would, after the
/// scheduler), held 2 s, DELed and deleted.
fn churn(f: &Fleet, rate: u64, secs: u64, fig: &mut Figures) -> Result<()> {
    let total = (rate * secs) as usize;
    let lat = Mutex::new(Vec::new());
    let failed = AtomicU64::new(0);
    let errors = Mutex::new(Vec::new());
    let a = snapshot(f)?;
    std::thread::scope(|s| {
        let t0 = Instant::now();
        for j in 0..total {
            let due = Duration::from_secs_f64(j as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
            let (lat, failed, errors) = (&lat, &failed, &errors);
            s.spawn(move || {
                let i = j % f.nodes;
                let pod = format!("churn-{j}");
                let netns = format!("{NETNS_PREFIX}c{j}");
                let run = || -> Result<()> {
                    let uid = f.create_pod(&pod, &Fleet::node(i))?;
                    std::thread::sleep(Duration::from_secs(1));
                    sh(&["ip", "netns", "add", &netns]);
                    let t = Instant::now();
                    let (ok, out) = f.call(i, "ADD", &pod, &uid, &netns);
                    let took = t.elapsed().as_secs_f64() * 1000.0;
                    if ok {
                        lat.lock().unwrap().push(took);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        errors.lock().unwrap().push(format!("{pod}: {out}"));
                    }
                    std::thread::sleep(Duration::from_secs(2));
                    let (ok, out) = f.call(i, "DEL", &pod, &uid, &netns);
                    ensure!(ok, "DEL {pod}: {out}");
                    sh(&["ip", "netns", "del", &netns]);
                    f.delete_pod(&pod)
                };
                if let Err(e) = run() {
                    errors.lock().unwrap().push(format!("{pod}: {e:#}"));
                }
            });
        }
    });
    // The daemons' status writes after the answer: give the last ones time to land.
    std::thread::sleep(Duration::from_secs(2));
    let b = snapshot(f)?;
    let wall = b.at.duration_since(a.at).as_secs_f64();
    let lat = lat.into_inner().unwrap();
    fig.churn_adds = lat.len();
    fig.churn_failed = failed.load(Ordering::Relaxed) as usize;
    fig.add_ms = percentiles(&lat);
    fig.churn_api_cpu_pct = (b.api_cpu - a.api_cpu) / wall * 100.0;
    // The system's own requests: everything but the bench's pod creates and deletes and the
    // standing watches.
    let own = requests_between(&a, &b, |verb, res| {
        verb != "WATCH" && !(res == "pods" && (verb == "POST" || verb == "DELETE"))
    });
    fig.req_per_add = own as f64 / total as f64;
    let errors = errors.into_inner().unwrap();
    for e in errors.iter().take(5) {
        eprintln!("  churn error: {e}");
    }
    Ok(())
}

/// Every daemon SIGKILLed and started again at once; each node asked for an ADD (a pod made
/// for it beforehand) every 100 ms until one succeeds.
fn storm(f: &mut Fleet) -> Result<Storm> {
    let n = f.nodes;
    let mut uids = vec![];
    for i in 0..n {
        uids.push(f.create_pod(&format!("storm-{i}"), &Fleet::node(i))?);
        sh(&["ip", "netns", "add", &format!("{NETNS_PREFIX}s{i}")]);
    }
    std::thread::sleep(Duration::from_secs(2));
    for d in &mut f.daemons {
        d.kill();
    }
    f.daemons.clear();
    std::thread::sleep(Duration::from_millis(500));
    let a = snapshot(f)?;
    let sampler = PeakSampler::start(f.cp.pids().0);
    let t0 = Instant::now();
    for i in 0..n {
        if let Some(d) = f.start_daemon(i)? {
            f.daemons.push(d);
        }
    }
    let served = Mutex::new(vec![f64::NAN; n]);
    let failed = AtomicU64::new(0);
    let fr: &Fleet = f;
    std::thread::scope(|s| {
        for (i, uid) in uids.iter().enumerate() {
            let (served, failed) = (&served, &failed);
            s.spawn(move || {
                let pod = format!("storm-{i}");
                let netns = format!("{NETNS_PREFIX}s{i}");
                while t0.elapsed() < Duration::from_secs(300) {
                    let (ok, out) = fr.call(i, "ADD", &pod, uid, &netns);
                    if ok {
                        served.lock().unwrap()[i] = t0.elapsed().as_secs_f64();
                        return;
                    }
                    if failed.fetch_add(1, Ordering::Relaxed) < 3 {
                        eprintln!("  storm ADD on node {i} failed: {}", out.trim());
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    let served = served.into_inner().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let api_peak = sampler.finish();
    let b = snapshot(f)?;
    // Who was told to back off (APF rejections by flow schema and reason, 429s by request).
    for l in b.text.lines().filter(|l| {
        (l.starts_with("apiserver_flowcontrol_rejected_requests_total{")
            || (l.starts_with("apiserver_request_total{") && l.contains("code=\"429\"")))
            && !l.ends_with(" 0")
    }) {
        eprintln!("  storm: {l}");
    }
    let mut ok: Vec<f64> = served.iter().copied().filter(|v| v.is_finite()).collect();
    ok.sort_by(f64::total_cmp);
    ensure!(
        ok.len() == n,
        "{} of {n} nodes never served an ADD after the restart",
        n - ok.len()
    );
    for (i, uid) in uids.iter().enumerate() {
        let (okd, out) = f.call(
            i,
            "DEL",
            &format!("storm-{i}"),
            uid,
            &format!("{NETNS_PREFIX}s{i}"),
        );
        if !okd {
            eprintln!("  storm DEL {i}: {out}");
        }
        sh(&["ip", "netns", "del", &format!("{NETNS_PREFIX}s{i}")]);
        f.delete_pod(&format!("storm-{i}"))?;
    }
    Ok(Storm {
        all_serving_s: ok[n - 1],
        median_serving_s: ok[n / 2],
        lists: requests_between(&a, &b, |v, _| v == "LIST") as f64,
        list_mib: metric_delta(&a, &b, "apiserver_response_sizes_sum", &[("verb", "LIST")])
            / 1048576.0,
        watches_after: metric_sum(
            &b.text,
            "apiserver_longrunning_requests",
            &[("verb", "WATCH")],
        ),
        api_peak_mib: mib(api_peak),
        api_cpu_s: b.api_cpu - a.api_cpu,
        too_many: metric_delta(&a, &b, "apiserver_request_total", &[("code", "429")]),
        failed_adds: failed.load(Ordering::Relaxed),
    })
}

fn run_one(kind: Kind, nodes: usize, bins: Arc<Bins>) -> Result<Figures> {
    let per_node = knob("PLEXUS_FLEET_PODS_PER_NODE", 10) as usize;
    let rate = knob("PLEXUS_FLEET_RATE", 5);
    let churn_secs = knob("PLEXUS_FLEET_CHURN_SECS", 30);
    let steady_secs = knob("PLEXUS_FLEET_STEADY_SECS", 30);
    remove_fleet_netns();
    let mut f = Fleet::start(kind, nodes, bins)?;
    let t = Instant::now();
    f.populate(per_node)?;
    eprintln!(
        "fleet {}: {} pods created in {:.1} s",
        kind.label(),
        nodes * per_node,
        t.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(3));
    let mut fig = Figures {
        api_rss_before_mib: mib(f.cp.pids().0.map(|p| rss_kib(p).0).unwrap_or(0)),
        watches_before: metric_sum(
            &f.cp.metrics_text()?,
            "apiserver_longrunning_requests",
            &[("verb", "WATCH")],
        ),
        ..Figures::default()
    };
    fig.start_all_s = f.start_all()?;
    eprintln!(
        "fleet {}: {nodes} nodes ready in {:.1} s",
        kind.label(),
        fig.start_all_s
    );
    std::thread::sleep(Duration::from_secs(10));
    steady(&f, steady_secs, &mut fig)?;
    eprintln!("fleet {}: steady state measured", kind.label());
    churn(&f, rate, churn_secs, &mut fig)?;
    eprintln!("fleet {}: churn measured", kind.label());
    if kind != Kind::PlexusThin {
        fig.storm = Some(storm(&mut f)?);
        eprintln!("fleet {}: restart storm measured", kind.label());
    }
    drop(f);
    remove_fleet_netns();
    Ok(fig)
}

fn print(nodes: usize, figs: &[(Kind, Figures)]) {
    let per_node = knob("PLEXUS_FLEET_PODS_PER_NODE", 10);
    let rate = knob("PLEXUS_FLEET_RATE", 5);
    let churn_secs = knob("PLEXUS_FLEET_CHURN_SECS", 30);
    println!(
        "fleet: {nodes} nodes, {} pods ({per_node} per node), one real kube-apiserver + etcd per system; churn {rate} pod starts/s for {churn_secs} s; load average at the end: {}",
        nodes as u64 * per_node,
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    type Cell = fn(&Figures) -> String;
    type StormCell = fn(&Storm) -> String;
    let rows: [(&str, Cell); 13] = [
        ("all daemons ready after start (s)", |f| {
            format!("{:.1}", f.start_all_s)
        }),
        ("steady: apiserver CPU (% of a core)", |f| {
            format!("{:.1}", f.api_cpu_pct)
        }),
        ("steady: etcd CPU (% of a core)", |f| {
            format!("{:.1}", f.etcd_cpu_pct)
        }),
        ("steady: apiserver RSS (MiB; before the daemons)", |f| {
            format!("{:.0} ({:.0})", f.api_rss_mib, f.api_rss_before_mib)
        }),
        ("steady: etcd RSS (MiB)", |f| {
            format!("{:.0}", f.etcd_rss_mib)
        }),
        (
            "steady: watches open (before the daemons: the apiserver's own)",
            |f| format!("{:.0} ({:.0})", f.watches, f.watches_before),
        ),
        ("steady: requests per second (watches excluded)", |f| {
            format!("{:.2}", f.req_per_s)
        }),
        ("steady: daemon RSS, median / all (MiB)", |f| {
            format!(
                "{:.1} / {:.0}",
                f.daemon_rss_median_mib, f.daemon_rss_total_mib
            )
        }),
        ("steady: daemons' CPU, all (% of a core)", |f| {
            format!("{:.1}", f.daemons_cpu_pct)
        }),
        ("churn: ADDs ok / failed", |f| {
            format!("{} / {}", f.churn_adds, f.churn_failed)
        }),
        (
            "churn: ADD through the entry, p50 / p90 / p99 / max (ms)",
            |f| {
                let (p50, p90, p99, max) = f.add_ms;
                format!("{p50:.0} / {p90:.0} / {p99:.0} / {max:.0}")
            },
        ),
        ("churn: API requests per pod start (ADD + DEL)", |f| {
            format!("{:.2}", f.req_per_add)
        }),
        ("churn: apiserver CPU (% of a core)", |f| {
            format!("{:.1}", f.churn_api_cpu_pct)
        }),
    ];
    let storm_rows: [(&str, StormCell); 7] = [
        (
            "storm: every node serving an ADD again, median / last (s)",
            |s| format!("{:.1} / {:.1}", s.median_serving_s, s.all_serving_s),
        ),
        ("storm: failed ADD attempts before serving", |s| {
            s.failed_adds.to_string()
        }),
        ("storm: LISTs / their response bytes (MiB)", |s| {
            format!("{:.0} / {:.1}", s.lists, s.list_mib)
        }),
        ("storm: watches open after", |s| {
            format!("{:.0}", s.watches_after)
        }),
        ("storm: apiserver peak RSS (MiB)", |s| {
            format!("{:.0}", s.api_peak_mib)
        }),
        ("storm: apiserver CPU (s)", |s| {
            format!("{:.1}", s.api_cpu_s)
        }),
        ("storm: HTTP 429 answers", |s| format!("{:.0}", s.too_many)),
    ];
    let header: Vec<&str> = figs.iter().map(|(k, _)| k.label()).collect();
    println!("| | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(header.len()));
    let line = |label: &str, vals: Vec<String>| println!("| {label} | {} |", vals.join(" | "));
    for (label, cell) in rows {
        line(label, figs.iter().map(|(_, f)| cell(f)).collect());
    }
    for (label, cell) in storm_rows {
        let vals = figs
            .iter()
            .map(|(_, f)| f.storm.as_ref().map_or("– (no daemon)".into(), cell))
            .collect();
        line(label, vals);
    }
}

/// Runs the fleet for each system in `PLEXUS_FLEET_SYSTEMS` and prints the table.
pub fn run(plexus: &Path, cni_bin: &Path, nodes: usize) -> Result<()> {
    let bins = Arc::new(Bins::find(plexus, cni_bin)?);
    let wanted = std::env::var("PLEXUS_FLEET_SYSTEMS")
        .unwrap_or_else(|_| "plexus-daemon,multus-thick,plexus-thin".into());
    let mut figs = vec![];
    for kind in [Kind::PlexusDaemon, Kind::MultusThick, Kind::PlexusThin] {
        if !wanted.split(',').any(|w| w.trim() == kind.key()) {
            continue;
        }
        eprintln!("fleet {}: {nodes} nodes", kind.label());
        figs.push((kind, run_one(kind, nodes, bins.clone())?));
    }
    print(nodes, &figs);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_match_name_and_labels() {
        let text = "# HELP x\napiserver_longrunning_requests{component=\"apiserver\",resource=\"pods\",verb=\"WATCH\"} 3\napiserver_longrunning_requests{component=\"apiserver\",resource=\"pods\",verb=\"LIST\"} 9\napiserver_longrunning_requests_other{verb=\"WATCH\"} 100\napiserver_longrunning_requests{resource=\"nads\",verb=\"WATCH\"} 2\n";
        assert_eq!(
            metric_sum(text, "apiserver_longrunning_requests", &[("verb", "WATCH")]),
            5.0
        );
        assert_eq!(
            metric_sum(text, "apiserver_longrunning_requests", &[]),
            14.0
        );
    }

    #[test]
    fn cpu_of_this_process_is_read() {
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(30) {}
        assert!(cpu_secs(std::process::id()) > 0.0);
        assert_eq!(cpu_secs(u32::MAX), 0.0);
    }
}
