//! The systems of the reboot burst, set up the same way: one default network (bridge +
//! host-local, a /24) and one macvlan NAD, each with its own state under the round's
//! directory. Per system: the CNI config containerd finds, the binaries it execs, and the node
//! daemon it needs (plexus-daemon, or multus-daemon with the in-cluster token it insists on).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::bins::find_usable;
use plexus_e2e::realk8s::node::wait_for;
use plexus_e2e::realk8s::{ControlPlane, Proc};
use serde_json::{json, Value};

/// Where multus-daemon looks for its in-cluster credentials (its only way).
pub const SA_DIR: &str = "/run/secrets/kubernetes.io/serviceaccount";

/// One system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    /// bridge + host-local alone: the floor.
    Floor,
    /// `plexus` exec'd by containerd.
    PlexusThin,
    /// `plexus-shim` + `plexus-daemon`.
    PlexusDaemon,
    /// `multus-shim` + `multus-daemon` (v4.3.0).
    MultusThick,
}

impl System {
    /// Every system, floor first.
    pub const ALL: [System; 4] = [
        System::Floor,
        System::PlexusThin,
        System::PlexusDaemon,
        System::MultusThick,
    ];

    /// Short label (node names, directories, the report).
    pub fn label(self) -> &'static str {
        match self {
            System::Floor => "floor",
            System::PlexusThin => "plexus-thin",
            System::PlexusDaemon => "plexus-daemon",
            System::MultusThick => "multus-thick",
        }
    }

    /// Whether its pods get the NAD (all but the floor).
    pub fn with_nad(self) -> bool {
        self != System::Floor
    }
}

/// The peers' binaries (`PLEXUS_PEERS_BIN`, default `/work/shared/peers/bin`).
pub struct Peers {
    /// `multus-daemon`.
    pub daemon: PathBuf,
    /// `multus-shim`.
    pub shim: PathBuf,
}

impl Peers {
    /// Find (unpack) them; an error names the directory.
    pub fn find() -> Result<Peers> {
        let dir = std::env::var_os("PLEXUS_PEERS_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/work/shared/peers/bin"));
        let get = |n: &str| -> Result<PathBuf> {
            find_usable(&dir, n)?.with_context(|| format!("no {n}(.xz) in {}", dir.display()))
        };
        Ok(Peers {
            daemon: get("multus-daemon")?,
            shim: get("multus-shim")?,
        })
    }
}

/// One round's names and directories.
pub struct Layout {
    /// The round's own directory (IPAM state, daemon sockets and logs).
    pub dir: PathBuf,
    /// The default network's host bridge.
    pub bridge: String,
    /// The NAD's macvlan master (a veth of the bench's own).
    pub master: String,
    /// The default network's /24.
    pub subnet: String,
    /// The NAD's /24.
    pub nad_subnet: String,
}

impl Layout {
    /// `<dir>/<rel>`
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// The default network: bridge + host-local, one plugin (a `.conf`: Multus thick v4.3.0
    /// wrapping the same as a one-plugin conflist fails every DEL with bridge's "no IP ranges
    /// specified" and leaks the leases).
    pub fn default_network(&self) -> Value {
        json!({"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":self.bridge,
            "isGateway":true,"isDefaultGateway":true,"ipMasq":false,"hairpinMode":true,
            "ipam":{"type":"host-local","dataDir":self.path("ipam"),
                    "ranges":[[{"subnet":self.subnet}]]}})
    }

    /// The NAD `ns/data`: macvlan on the bench's veth, host-local in the round's dir.
    pub fn nad(&self, ns: &str) -> Value {
        let cfg = json!({"cniVersion":"1.0.0","name":"data","type":"macvlan","master":self.master,
            "mode":"bridge","ipam":{"type":"host-local","dataDir":self.path("ipam"),
            "ranges":[[{"subnet":self.nad_subnet}]]}});
        json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":"data","namespace":ns},"spec":{"config":cfg.to_string()}})
    }

    /// Plexus' config for a node whose directory is `node_dir`: `plexus` (thin) or
    /// `plexus-shim` with the round's daemon socket.
    pub fn plexus_conf(&self, node_dir: &Path, kubeconfig: &Path, daemon: bool) -> Value {
        let mut c = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus",
            "kubeconfig":kubeconfig,"cniDir":node_dir.join("plexus"),
            "binDir":node_dir.join("cni/bin"),"logLevel":"error",
            "delegates":[self.default_network()],
            "nadPolicy":nad_policy_allowing(&[&self.dir])});
        if daemon {
            c["type"] = json!("plexus-shim");
            c["daemonSocket"] = json!(self.path("plexus.sock"));
        }
        c
    }
}

/// Start `plexus-daemon` for node `node` and wait for its readiness file.
pub fn plexus_daemon(daemon: &Path, l: &Layout, kubeconfig: &Path, node: &str) -> Result<Proc> {
    let ready = l.path("daemon.ready");
    let p = |p: &Path| p.display().to_string();
    let args = vec![
        "--socket".to_string(),
        p(&l.path("plexus.sock")),
        "--kubeconfig".into(),
        p(kubeconfig),
        "--node".into(),
        node.into(),
        "--readiness-file".into(),
        p(&ready),
    ];
    // E.g. `--max-concurrent 32` (a variant of the daemon's defaults, for a comparison).
    let mut args = args;
    if let Ok(extra) = std::env::var("PLEXUS_BURST_DAEMON_ARGS") {
        args.extend(extra.split_whitespace().map(str::to_string));
    }
    let log = l.path("plexus-daemon.log");
    let proc = Proc::spawn("plexus-daemon", daemon, &args, &log)?;
    wait_for("plexus-daemon ready", Duration::from_secs(30), || {
        Ok(ready.exists())
    })
    .with_context(|| plexus_e2e::realk8s::tail(&log, 20))?;
    Ok(proc)
}

/// Write the ServiceAccount files multus-daemon reads (token, ca.crt, namespace) into `dir`.
pub fn multus_credentials(cp: &ControlPlane, dir: &Path) -> Result<()> {
    cp.kubectl(&[
        "-n",
        "kube-system",
        "create",
        "serviceaccount",
        "multus-burst",
    ])?;
    // Multus' own RBAC is not under test: cluster-admin.
    cp.kubectl(&[
        "create",
        "clusterrolebinding",
        "multus-burst",
        "--clusterrole=cluster-admin",
        "--serviceaccount=kube-system:multus-burst",
    ])?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("token"),
        cp.create_token("kube-system", "multus-burst")?,
    )?;
    std::fs::write(dir.join("ca.crt"), cp.ca_pem())?;
    std::fs::write(dir.join("namespace"), "kube-system")?;
    Ok(())
}

/// Make [`SA_DIR`] exist (an empty mount point for a private bind mount); the top directory
/// it had to create, for removal after.
pub fn sa_mount_point() -> Result<Option<PathBuf>> {
    if Path::new(SA_DIR).is_dir() {
        return Ok(None);
    }
    let top = Path::new("/run/secrets");
    let made = (!top.exists()).then(|| top.to_path_buf());
    std::fs::create_dir_all(SA_DIR)?;
    Ok(made)
}

/// Start `multus-daemon` for node `node` in a mount namespace of its own (a slave of the
/// host's) where `sa` is bind-mounted at [`SA_DIR`]; wait for the shim config it generates and return it.
pub fn multus_daemon(
    cp: &ControlPlane,
    peers: &Peers,
    l: &Layout,
    sa: &Path,
    node: &str,
) -> Result<(Proc, Value)> {
    let d = l.path("multus");
    for sub in ["netd", "auto", "run"] {
        std::fs::create_dir_all(d.join(sub))?;
    }
    std::fs::write(
        d.join("auto/10-bridge.conf"),
        l.default_network().to_string(),
    )?;
    let run = format!("{}/", d.join("run").display());
    let cfg = json!({"chrootDir":"","cniVersion":"0.3.1","logToStderr":true,"logLevel":"error",
        "cniConfigDir":d.join("netd"),"multusAutoconfigDir":d.join("auto"),
        "multusConfigFile":"auto","socketDir":run,"daemonSocketDir":run,
        "binDir":plexus_e2e::realk8s::node::SYSTEM_CNI_BIN});
    std::fs::write(d.join("daemon.json"), cfg.to_string())?;
    let script = format!(
        "mount --bind {} {SA_DIR} && exec {} -config {}",
        sa.display(),
        peers.daemon.display(),
        d.join("daemon.json").display()
    );
    let args: Vec<String> = vec![
        "KUBERNETES_SERVICE_HOST=127.0.0.1".into(),
        format!("KUBERNETES_SERVICE_PORT={}", cp.port()),
        format!("MULTUS_NODE_NAME={node}"),
        "unshare".into(),
        "-m".into(),
        // slave: the pods' netns mounts (made later in /run/netns) reach it; its bind mount
        // stays inside.
        "--propagation".into(),
        "slave".into(),
        "sh".into(),
        "-c".into(),
        script,
    ];
    let log = d.join("daemon.log");
    let mut proc = Proc::spawn("multus-daemon", Path::new("env"), &args, &log)?;
    let conf = d.join("netd/00-multus.conf");
    wait_for(
        "multus-daemon's shim config",
        Duration::from_secs(30),
        || {
            proc.check_alive()?;
            Ok(conf.exists() && d.join("run/multus.sock").exists())
        },
    )
    .with_context(|| plexus_e2e::realk8s::tail(&log, 20))?;
    // It writes the file, then may rewrite it once: let it settle.
    std::thread::sleep(Duration::from_millis(300));
    let v: Value = serde_json::from_slice(&std::fs::read(&conf)?)?;
    ensure!(v["type"] == "multus-shim", "unexpected multus config: {v}");
    Ok((proc, v))
}

/// The daemon's `ADD done` / `DEL done` lines (`elapsed_ms=…`, `phases="name=ms …"`): per verb,
/// the call count, the sum, median and p90 of `elapsed_ms`, and each phase's median.
pub fn daemon_calls(log: &str, verb: &str) -> Option<String> {
    let marker = format!("{verb} done");
    let mut elapsed = Vec::new();
    let mut phases: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for l in log.lines().filter(|l| l.contains(&marker)) {
        let num = |s: &str| s.split_whitespace().next()?.parse::<f64>().ok();
        if let Some(ms) = l.split("elapsed_ms=").nth(1).and_then(num) {
            elapsed.push(ms);
        }
        if let Some((_, v)) = l.split_once("phases=") {
            for pair in v.trim_matches('"').split_whitespace() {
                if let Some((k, ms)) = pair.trim_matches('"').split_once('=') {
                    let ms = ms.parse().unwrap_or(0.0);
                    phases.entry(k.to_string()).or_default().push(ms);
                }
            }
        }
    }
    if elapsed.is_empty() {
        return None;
    }
    let q = |v: &mut Vec<f64>, f: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * f).round() as usize]
    };
    let sum: f64 = elapsed.iter().sum();
    let n = elapsed.len();
    let shown: Vec<String> = phases
        .iter_mut()
        .map(|(k, v)| format!("{k} {:.0}", q(v, 0.5)))
        .collect();
    Some(format!(
        "{n} {verb}s inside the daemon: median {:.0} ms, p90 {:.0} ms, sum {:.1} s; phase medians (ms): {}",
        q(&mut elapsed, 0.5),
        q(&mut elapsed, 0.9),
        sum / 1000.0,
        shown.join(", ")
    ))
}
