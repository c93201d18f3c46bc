//! `plexus-bench --peers`: Plexus side by side with the systems it replaces, in one run on a
//! real kube-apiserver over TLS (`PLEXUS_K8S_BIN`): Multus thin vs Plexus thin and Multus
//! thick vs the Plexus daemon (`plexus-shim` + `plexus-daemon`; its network-status written
//! after the answer, and with `--status-in-call`). Same configs (only `type` and the keys that
//! select a mode differ): the bridge default network + one macvlan NAD, same plugins, same
//! pods. Rounds interleave every system (order rotated per round) next to the plugins run
//! directly; it prints medians and spread of the overhead over the plugins, ratios to the
//! peer, API requests per ADD and DEL (`apiserver_request_total`) and peak RSS. With a
//! previous build ([`Options::previous`]) its thin plugin and daemon join the same rounds, and
//! this build's wall time over the previous one's is printed per round, verb and mode.
//!
//! Peers: `PLEXUS_PEERS_BIN` (default `/work/shared/peers/bin`): `multus`, `multus-daemon`,
//! `multus-shim` (v4.3.0), plain or `.xz`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::{bins::find_usable, metrics, ControlPlane, K8sBins, RequestCounts};
use serde_json::{json, Value};

use crate::{exec, plexus_env, Env};

const RESOURCES: &[&str] = &["pods", "events", "network-attachment-definitions"];
const NODE: &str = "bench-node";
const SA_DIR: &str = "/run/secrets/kubernetes.io/serviceaccount";

/// The secondary network: the bench's macvlan delegate with host-local leases.
fn macvlan(e: &Env) -> Value {
    let mut c = e.delegates()[1].clone();
    c["ipam"] = json!({"type":"host-local","dataDir":e.path("ipam-nad"),
        "ranges":[[{"subnet":"10.199.0.0/24"}]]});
    c
}

/// One system under test: the binary the runtime execs and its config.
struct System {
    label: &'static str,
    bin: PathBuf,
    conf: Value,
    /// Where its `ADD done` lines (phases) go: the thin log file or the daemon's stderr.
    log: Option<String>,
}

const MULTUS_THIN: &str = "Multus thin";
const MULTUS_THICK: &str = "Multus thick";
const PLEXUS_THIN: &str = "Plexus thin";
const PLEXUS_DAEMON: &str = "Plexus daemon";
const PREV_THIN: &str = "Plexus thin, previous";
const PREV_DAEMON: &str = "Plexus daemon, previous";

/// A background process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Milliseconds: median, p10 and p90 of `v`.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// The machine's load (`/proc/loadavg`: 1, 5 and 15 minutes), printed with the figures.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Peak RSS (KiB) of one call of `bin` under GNU time (its process and the children it waited
/// for, i.e. its delegates too).
fn peak_rss(bin: &Path, env: &[(&str, &str)], conf: &Value) -> u64 {
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args(["-f", "%M"]).arg(bin);
    let out = crate::run_with(cmd, env, conf);
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

/// Multus' own service account, bound to cluster-admin (its RBAC is not under test), with its
/// token, CA and namespace written to `dir` as a pod would see them mounted; its token.
pub(crate) fn multus_service_account(cp: &ControlPlane, dir: &Path) -> Result<String> {
    cp.kubectl(&["-n", "kube-system", "create", "serviceaccount", "multus"])?;
    cp.kubectl(&[
        "create",
        "clusterrolebinding",
        "multus-bench",
        "--clusterrole=cluster-admin",
        "--serviceaccount=kube-system:multus",
    ])?;
    let token = cp.create_token("kube-system", "multus")?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("token"), &token)?;
    std::fs::write(dir.join("ca.crt"), cp.ca_pem())?;
    std::fs::write(dir.join("namespace"), "kube-system")?;
    Ok(token)
}

struct Peers {
    cp: ControlPlane,
    e: Env,
    cni_bin: PathBuf,
    pods: usize,
    /// Daemons (and where the Multus one's in-cluster token is mounted), killed on drop.
    procs: Vec<Proc>,
    made_sa_dir: Option<PathBuf>,
}

impl Drop for Peers {
    fn drop(&mut self) {
        self.procs.clear();
        if let Some(d) = &self.made_sa_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

impl Peers {
    fn start(cni_bin: &Path) -> Result<Peers> {
        let Some(bins) = K8sBins::from_env()? else {
            bail!("--peers needs PLEXUS_K8S_BIN (the kube-apiserver and etcd binaries)");
        };
        let cp = ControlPlane::start(&bins)?;
        cp.apply_deploy(&["nad-crd.yaml", "rbac.yaml", "rbac-daemon.yaml"])?;
        cp.create_namespace("db")?;
        let e = Env::new();
        let token = cp.create_token("kube-system", "plexus")?;
        cp.write_kubeconfig(&e.path("kubeconfig"), &token)?;
        let mtoken = multus_service_account(&cp, &e.path("multus-sa"))?;
        cp.write_kubeconfig(&e.path("multus.kubeconfig"), &mtoken)?;
        // The macvlan network with host-local leases (a static address would make every
        // system's pod claim the same address: Plexus refuses one address twice, at one pods
        // LIST per ADD, docs/annotations.md).
        let mut nad_conf = macvlan(&e);
        nad_conf.as_object_mut().unwrap().remove("name");
        cp.apply(
            &json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":{"name":"data","namespace":"db"},"spec":{"config":nad_conf.to_string()}})
            .to_string(),
        )?;
        Ok(Peers {
            cp,
            e,
            cni_bin: cni_bin.to_path_buf(),
            pods: 0,
            procs: vec![],
            made_sa_dir: None,
        })
    }

    /// A new pod on the node asking for `db/data`: (name, uid).
    fn pod(&mut self) -> Result<(String, String)> {
        self.pods += 1;
        let pod = format!("peer-{}", self.pods);
        self.cp.apply(
            &json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":pod,"namespace":"db",
                "annotations":{"k8s.v1.cni.cncf.io/networks":"data"}},
                "spec":{"nodeName":NODE,"containers":[{"name":"c","image":"pause"}]}})
            .to_string(),
        )?;
        let uid = self
            .cp
            .get_json(&format!("/api/v1/namespaces/db/pods/{pod}"))?["metadata"]["uid"]
            .as_str()
            .context("pod uid")?
            .to_string();
        Ok((pod, uid))
    }

    /// A thin config of `type` (its own state dir and kubeconfig), logging errors only; plexus'
    /// with a `nadPolicy` allowing the bench's directory (the NAD's leases are there).
    fn thin(&self, type_: &str, kubeconfig: &str) -> Value {
        let mut c = json!({"cniVersion":"1.0.0","name":"bench","type":type_,
            "kubeconfig":self.e.path(kubeconfig),"cniDir":self.e.path(&format!("{type_}-state")),
            "binDir":self.cni_bin,"logLevel":"error","logToStderr":false,
            "delegates":[self.e.delegates()[0]]});
        if type_.starts_with("plexus") {
            c["nadPolicy"] = nad_policy_allowing(&[self.e.dir.path()]);
        }
        c
    }

    /// `plexus-daemon` on its own socket (`name`), watching the node's pods; it logs at info
    /// level (one `ADD done` line with its phases per ADD) to `<name>.log`.
    fn plexus_daemon(&mut self, plexus: &Path, name: &str, extra: &[&str]) -> Result<u32> {
        let ready = self.e.path(&format!("{name}.ready"));
        let child = Command::new(plexus)
            .arg("daemon")
            .args([
                "--socket",
                self.e
                    .path(&format!("{name}/plexus.sock"))
                    .to_str()
                    .unwrap(),
            ])
            .args(["--kubeconfig", self.e.path("kubeconfig").to_str().unwrap()])
            .args(["--node", NODE])
            .args(["--readiness-file", ready.to_str().unwrap()])
            .args(extra)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("PLEXUS_LOG_LEVEL", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.e.path(&format!("{name}.log")))?)
            .spawn()
            .context("start plexus daemon")?;
        let pid = child.id();
        self.procs.push(Proc(child));
        let t = Instant::now();
        while !ready.exists() {
            ensure!(
                t.elapsed() < Duration::from_secs(20),
                "plexus daemon not ready"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(pid)
    }

    /// `multus-daemon` with in-cluster credentials (its only way): the token bind-mounted at
    /// the service-account path in a mount namespace of its own; returns its pid and the
    /// shim config it generated.
    fn multus_daemon(&mut self, daemon: &Path) -> Result<(u32, Value)> {
        let d = self.e.path("multus");
        for sub in ["netd", "auto", "run"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        let auto = json!({"cniVersion":"1.0.0","name":"cbr0","plugins":[self.e.delegates()[0]]});
        std::fs::write(d.join("auto/10-bridge.conflist"), auto.to_string())?;
        let cfg = json!({"chrootDir":"","cniVersion":"0.3.1","logToStderr":true,"logLevel":"error",
            "cniConfigDir":d.join("netd"),"multusAutoconfigDir":d.join("auto"),"multusConfigFile":"auto",
            "socketDir":format!("{}/", d.join("run").display()),
            "daemonSocketDir":format!("{}/", d.join("run").display()),"binDir":self.cni_bin});
        std::fs::write(d.join("daemon.json"), cfg.to_string())?;
        if !Path::new(SA_DIR).exists() {
            let top = Path::new("/run/secrets");
            if !top.exists() {
                self.made_sa_dir = Some(top.to_path_buf());
            }
            std::fs::create_dir_all(SA_DIR)?;
        }
        let script = format!(
            "mount --bind {} {SA_DIR} && exec {} -config {}",
            self.e.path("multus-sa").display(),
            daemon.display(),
            d.join("daemon.json").display()
        );
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", self.cp.port().to_string())
            .env("MULTUS_NODE_NAME", NODE)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("daemon.log"))?)
            .spawn()
            .context("start multus-daemon")?;
        let pid = child.id();
        self.procs.push(Proc(child));
        let conf = d.join("netd/00-multus.conf");
        let t = Instant::now();
        while !conf.exists() || !d.join("run/multus.sock").exists() {
            ensure!(
                t.elapsed() < Duration::from_secs(30),
                "multus-daemon wrote no config: {}",
                std::fs::read_to_string(d.join("daemon.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(200));
        Ok((pid, serde_json::from_slice(&std::fs::read(&conf)?)?))
    }

    /// One call of `s` for pod (`pod`, `uid`), container `cid`.
    fn call(
        &self,
        s: &System,
        cmd: &'static str,
        cid: &str,
        pod: &str,
        uid: &str,
    ) -> Result<Duration> {
        let netns = format!("/run/netns/{}", self.e.netns);
        let cni_path = self.cni_bin.display().to_string();
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={pod};K8S_POD_UID={uid};K8S_POD_INFRA_CONTAINER_ID={cid}");
        let t = Instant::now();
        let (ok, out) = exec(
            &s.bin,
            &plexus_env(cmd, cid, &netns, &cni_path, &args),
            &s.conf,
        );
        let took = t.elapsed();
        ensure!(ok, "{} {cmd} failed: {out}", s.label);
        Ok(took)
    }

    /// The two plugins run directly (ADD, DEL).
    fn direct(&self, cid: &str) -> Result<(Duration, Duration)> {
        let netns = format!("/run/netns/{}", self.e.netns);
        let cni_path = self.cni_bin.display().to_string();
        let d = [self.e.delegates()[0].clone(), macvlan(&self.e)];
        let run = |cmd: &str, order: &[(&Value, &str)]| -> Result<Duration> {
            let t = Instant::now();
            for (conf, ifn) in order {
                let env = [
                    ("CNI_COMMAND", cmd),
                    ("CNI_CONTAINERID", cid),
                    ("CNI_NETNS", netns.as_str()),
                    ("CNI_IFNAME", ifn),
                    ("CNI_PATH", cni_path.as_str()),
                ];
                let bin = self.cni_bin.join(conf["type"].as_str().unwrap());
                let (ok, out) = exec(&bin, &env, conf);
                ensure!(ok, "direct {cmd} of {} failed: {out}", conf["type"]);
            }
            Ok(t.elapsed())
        };
        Ok((
            run("ADD", &[(&d[0], "eth0"), (&d[1], "net1")])?,
            run("DEL", &[(&d[1], "net1"), (&d[0], "eth0")])?,
        ))
    }

    /// API requests of one ADD and of its DEL through `s` (per-pod ones; the daemons' watches
    /// excluded), the background writes given 500 ms to land.
    fn requests(&mut self, s: &System) -> Result<(RequestCounts, RequestCounts)> {
        let (pod, uid) = self.pod()?;
        std::thread::sleep(Duration::from_millis(400));
        let cid = format!("req-{}", self.pods);
        let counted = |cmd| -> Result<RequestCounts> {
            let before = self.cp.request_totals()?;
            self.call(s, cmd, &cid, &pod, &uid)?;
            std::thread::sleep(Duration::from_millis(500));
            let mut d = metrics::delta(&before, &self.cp.request_totals()?, RESOURCES);
            d.retain(|k, _| k.verb != "WATCH" && k.verb != "LIST");
            Ok(d)
        };
        Ok((counted("ADD")?, counted("DEL")?))
    }
}

fn total(c: &RequestCounts) -> u64 {
    c.values().sum()
}

fn shown(c: &RequestCounts) -> String {
    c.iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `--peers` and `--previous` compare.
pub struct Options<'a> {
    /// This build's `plexus` (`plexus-shim` next to it).
    pub plexus: &'a Path,
    /// The previous release's build directory (`plexus`, `plexus-shim`), run side by side.
    pub previous: Option<&'a Path>,
    /// Multus thin and thick, and the daemon's variants (status in call, events off), too.
    pub peers: bool,
    /// Timed rounds.
    pub rounds: usize,
    /// Make the thin plugins' metrics directory (`<cniDir>/metrics`, as thin mode's exporter
    /// does), so a build that records its calls' outcomes writes them during the rounds.
    pub thin_metrics: bool,
}

/// Run the side-by-side benchmark: rounds interleave every system of `o`.
pub fn run(o: &Options, cni_bin: &Path) -> Result<()> {
    let n = o.rounds;
    let mut p = Peers::start(cni_bin)?;
    if o.thin_metrics {
        let dir = p.e.path("plexus-state/metrics");
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        println!(
            " thin mode's metrics directory made ({}): calls record their outcomes",
            dir.display()
        );
    }
    let thin_logged = |p: &Peers, bin: &Path, log: &str| {
        // Its `ADD done` lines (phases) go to `log`: one appended line per call.
        let mut c = p.thin("plexus", "kubeconfig");
        c["logLevel"] = json!("info");
        c["logFile"] = json!(p.e.path(log));
        System {
            label: "",
            bin: bin.to_path_buf(),
            conf: c,
            log: Some(log.to_string()),
        }
    };
    let shim_conf = |p: &Peers, dir: &str| {
        let mut c = p.thin("plexus-shim", "kubeconfig");
        c["daemonSocket"] = json!(p.e.path(&format!("{dir}/plexus.sock")));
        c
    };
    let shim_of = |plexus: &Path| -> Result<PathBuf> {
        let shim = plexus.with_file_name("plexus-shim");
        ensure!(shim.exists(), "no plexus-shim next to {}", plexus.display());
        Ok(shim)
    };
    let mut systems = vec![];
    let mut daemons: Vec<(&'static str, u32)> = vec![];
    let mut md_pid = None;
    if o.peers {
        let peers_dir = std::env::var_os("PLEXUS_PEERS_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/work/shared/peers/bin"));
        let peer = |name: &str| -> Result<PathBuf> {
            find_usable(&peers_dir, name)?
                .with_context(|| format!("no {name} in {}", peers_dir.display()))
        };
        let (multus, multus_daemon, multus_shim) = (
            peer("multus")?,
            peer("multus-daemon")?,
            peer("multus-shim")?,
        );
        let (pid, multus_conf) = p.multus_daemon(&multus_daemon)?;
        md_pid = Some(pid);
        systems.push(System {
            label: MULTUS_THIN,
            bin: multus,
            conf: p.thin("multus", "multus.kubeconfig"),
            log: None,
        });
        systems.push(System {
            label: MULTUS_THICK,
            bin: multus_shim,
            conf: multus_conf,
            log: None,
        });
    }
    let shim = shim_of(o.plexus)?;
    systems.push(System {
        label: PLEXUS_THIN,
        ..thin_logged(&p, o.plexus, "thin.log")
    });
    daemons.push((PLEXUS_DAEMON, p.plexus_daemon(o.plexus, "pd", &[])?));
    systems.push(System {
        label: PLEXUS_DAEMON,
        bin: shim.clone(),
        conf: shim_conf(&p, "pd"),
        log: Some("pd.log".into()),
    });
    if o.peers {
        daemons.push((
            "Plexus daemon (status in call)",
            p.plexus_daemon(o.plexus, "pc", &["--status-in-call"])?,
        ));
        systems.push(System {
            label: "Plexus daemon, status in call",
            bin: shim.clone(),
            conf: shim_conf(&p, "pc"),
            log: Some("pc.log".into()),
        });
        // "Status off": the status after the answer and no event (`"events": false`): the
        // call's own work with no API request in or after it but the background PATCH.
        daemons.push((
            "Plexus daemon (events off)",
            p.plexus_daemon(o.plexus, "po", &[])?,
        ));
        let mut c = shim_conf(&p, "po");
        c["events"] = json!(false);
        systems.push(System {
            label: "Plexus daemon, events off",
            bin: shim.clone(),
            conf: c,
            log: Some("po.log".into()),
        });
    }
    if let Some(prev) = o.previous {
        let prev_plexus = prev.join("plexus");
        let prev_shim = shim_of(&prev_plexus)?;
        systems.push(System {
            label: PREV_THIN,
            ..thin_logged(&p, &prev_plexus, "thin-prev.log")
        });
        daemons.push((PREV_DAEMON, p.plexus_daemon(&prev_plexus, "pp", &[])?));
        systems.push(System {
            label: PREV_DAEMON,
            bin: prev_shim,
            conf: shim_conf(&p, "pp"),
            log: Some("pp.log".into()),
        });
    }
    println!(
        "side by side on a real kube-apiserver over TLS: bridge default + 1 macvlan NAD, {n} interleaved rounds (+1 warm-up), order rotated per round; load average before: {}",
        loadavg()
    );
    let k = systems.len();
    let (mut add, mut del) = (vec![vec![]; k], vec![vec![]; k]);
    let (mut add_wall, mut del_wall): (Vec<Vec<f64>>, Vec<Vec<f64>>) =
        (vec![vec![]; k], vec![vec![]; k]);
    let index = |label: &str| systems.iter().position(|s| s.label == label).unwrap_or(0);
    let (mut dadd, mut ddel) = (vec![], vec![]);
    for round in 0..=n {
        let mut pods = vec![];
        for _ in 0..k {
            pods.push(p.pod()?);
        }
        // The daemons' watches deliver new pods within ms; make sure every cache has them.
        std::thread::sleep(Duration::from_millis(300));
        let (da, dd) = p.direct(&format!("direct-{round}"))?;
        for j in 0..k {
            let i = (j + round) % k;
            let (pod, uid) = &pods[i];
            let cid = format!("c-{round}-{i}");
            let a = p.call(&systems[i], "ADD", &cid, pod, uid)?;
            let d = p.call(&systems[i], "DEL", &cid, pod, uid)?;
            if round > 0 {
                add_wall[i].push(ms(a));
                del_wall[i].push(ms(d));
                add[i].push(ms(a) - ms(da));
                del[i].push(ms(d) - ms(dd));
            }
        }
        if round > 0 {
            dadd.push(ms(da));
            ddel.push(ms(dd));
        }
    }
    println!(" load average after the rounds: {}", loadavg());
    let (pa, _, _) = stats(&dadd);
    let (pd, _, _) = stats(&ddel);
    println!(" the plugins alone (bridge + macvlan): ADD {pa:.1} ms, DEL {pd:.1} ms (medians)");
    println!(" overhead over the plugins, per round (median [p10, p90]):");
    let mut med = BTreeMap::new();
    for (i, s) in systems.iter().enumerate() {
        let (am, a10, a90) = stats(&add[i]);
        let (dm, d10, d90) = stats(&del[i]);
        med.insert(s.label, (am, dm));
        println!(
            "  {:<30} ADD {am:+6.1} ms [{a10:+.1}, {a90:+.1}]   DEL {dm:+6.1} ms [{d10:+.1}, {d90:+.1}]",
            s.label
        );
    }
    let ratio = |a: &str, b: &str| {
        let (x, y) = (med.get(a)?, med.get(b)?);
        Some((x.0 / y.0, x.1 / y.1))
    };
    for (a, b) in [
        (PLEXUS_THIN, MULTUS_THIN),
        (PLEXUS_DAEMON, MULTUS_THICK),
        ("Plexus daemon, status in call", MULTUS_THICK),
        ("Plexus daemon, events off", MULTUS_THICK),
        (PLEXUS_THIN, PREV_THIN),
        (PLEXUS_DAEMON, PREV_DAEMON),
    ] {
        if let Some((ra, rd)) = ratio(a, b) {
            println!(" {a} / {b}: ADD overhead {ra:.2}×, DEL overhead {rd:.2}×");
        }
    }
    if o.previous.is_some() {
        // This build against the previous one, per call: the median of the per-round ratio of
        // wall times (each round runs both on the same pods and API server, back to back).
        for (a, b) in [(PLEXUS_THIN, PREV_THIN), (PLEXUS_DAEMON, PREV_DAEMON)] {
            let (i, j) = (index(a), index(b));
            let per = |v: &[Vec<f64>]| {
                stats(
                    &v[i]
                        .iter()
                        .zip(&v[j])
                        .map(|(x, y)| x / y)
                        .collect::<Vec<_>>(),
                )
            };
            let (ra, ra10, ra90) = per(&add_wall);
            let (rd, rd10, rd90) = per(&del_wall);
            println!(
                " this build / previous, {}: ADD wall {ra:.3}× [{ra10:.3}, {ra90:.3}], DEL wall {rd:.3}× [{rd10:.3}, {rd90:.3}] (per-round ratio, median [p10, p90])",
                if a == PLEXUS_THIN { "thin" } else { "daemon" }
            );
        }
    }
    // Where the daemon's ADD time goes: its own `ADD done` lines (the timed rounds' ADDs).
    for (idx, s) in systems.iter().enumerate() {
        let (Some(log), label) = (&s.log, s.label) else {
            continue;
        };
        let thin = s.conf["type"] == "plexus";
        let text = std::fs::read_to_string(p.e.path(log))?;
        let done: Vec<_> = crate::real_api::parse_log(&text, "ADD")
            .into_iter()
            .skip(1)
            .take(n)
            .collect();
        let med = |f: &dyn Fn(&crate::real_api::Done) -> f64| {
            stats(&done.iter().map(f).collect::<Vec<_>>()).0
        };
        let mut phases: Vec<String> = done
            .iter()
            .flat_map(|d| d.phases.keys().cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|k| {
                let m = med(&|d| d.phases.get(&k).copied().unwrap_or(0.0));
                format!("{k} {m:.2}")
            })
            .collect();
        phases.sort();
        println!(
            " {label}: ADD inside {} {:.2} ms (median of {}), phases (ms): {}",
            if thin { "plexus" } else { "the daemon" },
            med(&|d| d.elapsed_ms),
            done.len(),
            phases.join(", ")
        );
        // Per call (robust to the delegates' spread): wall minus the delegates' time, and the
        // part outside the daemon's pipeline (shim exec, socket, queueing).
        let delegates =
            |d: &crate::real_api::Done| d.phases.get("delegates").copied().unwrap_or(0.0);
        let pairs = || add_wall[idx].iter().zip(&done);
        let own: Vec<f64> = pairs().map(|(w, d)| w - delegates(d)).collect();
        let outside: Vec<f64> = pairs().map(|(w, d)| w - d.elapsed_ms).collect();
        let inside: Vec<f64> = done.iter().map(|d| d.elapsed_ms - delegates(d)).collect();
        let (o, o10, o90) = stats(&own);
        println!(
            "   own time per ADD (wall minus its delegates): {o:.2} ms [{o10:.2}, {o90:.2}] = outside the pipeline ({}) {:.2} + inside it, delegates excluded {:.2}",
            if thin { "exec, start-up before main, exit" } else { "shim exec, socket, answer" },
            stats(&outside).0,
            stats(&inside).0
        );
        // The part of "inside" no top-level phase names (`report` holds `status_patch` /
        // `status_and_event`, `pod_read` holds `pod_get`, `inputs` holds `nad_get`,
        // `plugin_check` holds `plugin_lookup`; the daemon's `queue` and `request_read` come
        // before its `elapsed_ms` starts).
        let top = [
            "config",
            "args",
            "client_build",
            "pod_read",
            "inputs",
            "plan",
            "plugin_check",
            "address_guard",
            "lock",
            "plan_load",
            "tombstone",
            "plan_save",
            "devinfo",
            "attach_prep",
            "netns",
            "delegates",
            "routes",
            "result_cache",
            "plan_sync_wait",
            "report",
        ];
        let unnamed: Vec<f64> = done
            .iter()
            .map(|d| {
                d.elapsed_ms
                    - top
                        .iter()
                        .map(|k| d.phases.get(*k).copied().unwrap_or(0.0))
                        .sum::<f64>()
            })
            .collect();
        println!(
            "   inside, in no top-level phase: {:.2} ms (median)",
            stats(&unnamed).0
        );
    }
    println!(" API requests per ADD / DEL (apiserver_request_total, watches excluded):");
    for s in &systems {
        let (a, d) = p.requests(s)?;
        println!(
            "  {:<30} {} / {}   (ADD: {}; DEL: {})",
            s.label,
            total(&a),
            total(&d),
            shown(&a),
            shown(&d)
        );
    }
    if o.previous.is_some() {
        instructions(&mut p, &systems)?;
    }
    println!(" peak RSS (KiB; GNU time, a thin plugin's figure includes its delegates):");
    let (pod, uid) = p.pod()?;
    std::thread::sleep(Duration::from_millis(300));
    let netns = format!("/run/netns/{}", p.e.netns);
    let cni_path = p.cni_bin.display().to_string();
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={pod};K8S_POD_UID={uid}");
    for s in &systems {
        let cid = format!("rss-{}", s.label.replace(' ', "-"));
        let add = peak_rss(
            &s.bin,
            &plexus_env("ADD", &cid, &netns, &cni_path, &args),
            &s.conf,
        );
        let del = peak_rss(
            &s.bin,
            &plexus_env("DEL", &cid, &netns, &cni_path, &args),
            &s.conf,
        );
        println!("  {:<30} ADD {add} DEL {del}", s.label);
    }
    let d = p.e.delegates();
    let env = plexus_env("ADD", "rss-direct", &netns, &cni_path, "");
    let bridge = peak_rss(&p.cni_bin.join("bridge"), &env, &d[0]);
    let del_env = plexus_env("DEL", "rss-direct", &netns, &cni_path, "");
    let _ = exec(&p.cni_bin.join("bridge"), &del_env, &d[0]);
    println!("  {:<30} ADD {bridge}", "the bridge plugin alone");
    for (label, pid) in md_pid
        .map(|pid| ("Multus thick daemon", pid))
        .into_iter()
        .chain(daemons)
    {
        let (now, hwm) = plexus_e2e::procfs::rss_kib(pid);
        println!("  {label:<30} RSS {now}, peak {hwm} (VmHWM, whole run)");
    }
    Ok(())
}

/// One thin ADD (and its DEL, untraced) of `s` on a new pod, run under `tracer` (a program and
/// its arguments, the plugin's path appended).
fn traced_add(p: &mut Peers, s: &System, tracer: &[String]) -> Result<()> {
    let (pod, uid) = p.pod()?;
    std::thread::sleep(Duration::from_millis(300));
    let netns = format!("/run/netns/{}", p.e.netns);
    let cni_path = p.cni_bin.display().to_string();
    let cid = format!("traced-{}", p.pods);
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={pod};K8S_POD_UID={uid};K8S_POD_INFRA_CONTAINER_ID={cid}");
    let mut cmd = Command::new(&tracer[0]);
    cmd.args(&tracer[1..]).arg(&s.bin);
    let run = crate::run_with(
        cmd,
        &plexus_env("ADD", &cid, &netns, &cni_path, &args),
        &s.conf,
    );
    ensure!(
        run.status.success(),
        "{} ADD under {} failed: {}",
        s.label,
        tracer[0],
        String::from_utf8_lossy(&run.stdout)
    );
    p.call(s, "DEL", &cid, &pod, &uid)?;
    Ok(())
}

/// Work of one thin ADD of this build and of the previous one, the plexus process alone (its
/// delegates not traced): instructions counted by callgrind and system calls by strace, figures
/// that stay the same whatever else the machine is doing, so a commit that makes the plugin do
/// more shows even on a busy machine. The largest changes are named: per object file
/// (instructions) and per system call. Skipped with a line when valgrind or strace is missing.
fn instructions(p: &mut Peers, systems: &[System]) -> Result<()> {
    let has = |bin: &str| Command::new(bin).arg("--version").output().is_ok();
    let mut ir = vec![];
    let mut sys = vec![];
    for label in [PLEXUS_THIN, PREV_THIN] {
        let Some(s) = systems.iter().find(|s| s.label == label) else {
            continue;
        };
        if has("valgrind") {
            let out = p.e.path(&format!("callgrind-{}.out", ir.len()));
            let tracer = [
                "valgrind".to_string(),
                "--tool=callgrind".into(),
                format!("--callgrind-out-file={}", out.display()),
            ];
            traced_add(p, s, &tracer)?;
            ir.push((label, callgrind_by_object(&out)?));
        }
        if has("strace") {
            let out = p.e.path(&format!("strace-{}.out", sys.len()));
            let tracer = [
                "strace".to_string(),
                "-c".into(),
                "-U".into(),
                "name,calls".into(),
                "-o".into(),
                out.display().to_string(),
            ];
            traced_add(p, s, &tracer)?;
            sys.push((label, strace_calls(&out)?));
        }
    }
    if ir.is_empty() {
        println!(" instructions per thin ADD: valgrind not installed, not counted");
    }
    if sys.is_empty() {
        println!(" system calls per thin ADD: strace not installed, not counted");
    }
    for (what, unit, counted) in [("instructions", 1e6, &ir), ("system calls", 1.0, &sys)] {
        let total = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
        for (label, m) in counted.iter() {
            println!(
                " {what} per thin ADD (plexus alone), {label}: {}",
                if unit > 1.0 {
                    format!("{:.2} M", total(m) as f64 / unit)
                } else {
                    total(m).to_string()
                }
            );
        }
        if let [(_, head), (_, prev)] = &counted[..] {
            let mut keys: Vec<(&String, i64)> = head
                .keys()
                .chain(prev.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|k| {
                    let h = head.get(k).copied().unwrap_or(0);
                    let p = prev.get(k).copied().unwrap_or(0);
                    (k, h as i64 - p as i64)
                })
                .filter(|(_, d)| *d != 0)
                .collect();
            keys.sort_by_key(|(_, d)| std::cmp::Reverse(d.abs()));
            let shown: Vec<String> = keys
                .iter()
                .take(8)
                .map(|(k, d)| {
                    if unit > 1.0 {
                        format!("{k} {:+.3} M", *d as f64 / unit)
                    } else {
                        format!("{k} {d:+}")
                    }
                })
                .collect();
            println!(
                " this build / previous, {what} per thin ADD: {:.3}× (largest changes: {})",
                total(head) as f64 / total(prev).max(1) as f64,
                if shown.is_empty() {
                    "none".to_string()
                } else {
                    shown.join(", ")
                }
            );
        }
    }
    Ok(())
}

/// Calls per system call from `strace -c -U name,calls` output.
fn strace_calls(out: &Path) -> Result<BTreeMap<String, u64>> {
    let text = std::fs::read_to_string(out).context("strace output")?;
    let mut by = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(name), Some(calls)) = (f.next(), f.next()) else {
            continue;
        };
        if let Ok(n) = calls.parse::<u64>() {
            if name != "total" {
                by.insert(name.to_string(), n);
            }
        }
    }
    ensure!(
        !by.is_empty(),
        "strace counted no calls in {}",
        out.display()
    );
    Ok(by)
}

/// Self instruction counts of a callgrind profile summed per crate (the first path segment of
/// the function's name where symbols are there) or else per object file (a stripped binary,
/// libc).
fn callgrind_by_object(out: &Path) -> Result<BTreeMap<String, u64>> {
    let text = Command::new("callgrind_annotate")
        .args(["--threshold=100", "--inclusive=no"])
        .arg(out)
        .output()
        .context("callgrind_annotate")?;
    let mut by = BTreeMap::new();
    for line in String::from_utf8_lossy(&text.stdout).lines() {
        let line = line.trim();
        let Some((count, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(n) = count.replace(',', "").parse::<u64>() else {
            continue;
        };
        // "(12.3%)  file:function [object]" or "file:function [object]".
        let rest = rest.trim();
        let rest = match rest.strip_prefix('(') {
            Some(r) => r.split_once(')').map(|(_, r)| r.trim()).unwrap_or(r),
            None => rest,
        };
        if rest.starts_with("PROGRAM TOTALS") || rest.is_empty() {
            continue;
        }
        let func = rest.split_once(':').map(|(_, f)| f).unwrap_or(rest);
        let func = func.trim_start_matches('<').trim_start_matches('&');
        let krate = match func.split_once("::") {
            Some((c, _)) if !c.contains(' ') => c.to_string(),
            _ => rest
                .rsplit_once('[')
                .map(|(_, o)| {
                    Path::new(o.trim_end_matches(']'))
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default()
                })
                .unwrap_or_else(|| "other".into()),
        };
        *by.entry(krate).or_insert(0) += n;
    }
    ensure!(
        !by.is_empty(),
        "callgrind_annotate printed no counts for {}",
        out.display()
    );
    Ok(by)
}
