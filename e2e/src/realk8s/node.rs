//! A real node for the node tier: a container runtime — containerd (2.3 by default, 1.6 for the
//! compatibility tier: [`use_containerd`]) or CRI-O 1.36 ([`use_runtime`], [`crio`]); its own
//! config, root, state, socket, CNI dirs — and a kubelet v1.36 registered with a
//! [`ControlPlane`], with a locally built pause image. Everything lives under one temporary
//! directory; the pods' cgroups under a cgroup root of its own. The runtime and the kubelet run
//! in mount namespaces of their own ([`mount_ns`]) where the fixed host paths they write
//! (`/var/lib/cni`, `/var/lib/kubelet/device-plugins`, `/var/log/containers`, CRI-O's
//! `/var/lib/containers`) are the node's directories ([`Node::host_path`]). [`Node::stop`] (also
//! run on drop) stops the kubelet, removes the remaining pod sandboxes through the CRI (which
//! runs CNI DEL), stops the runtime and what it left running (shims, conmons), unmounts what is
//! left under its directory, removes the pod netns it created and the links it was told about.
//!
//! Facts it relies on: `../shared/k8s/README.md` (kubelet settings for cgroup v1, containerd's
//! `restrict_oom_score_adj`, the CRI's normalized image names), `../shared/runtimes/README.md`
//! (CRI-O's config, skopeo, its fully qualified image names).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

mod config;
pub use config::{containerd_1_6_config, containerd_config};
pub mod crio;
mod host;
pub mod mount_ns;
mod stale;

use super::cri::Cri;
use super::pause::{self, PAUSE_IMAGE};
use super::runtimes::{Containerd, ContainerdBins, CrioBins, Runtime};
use super::{tail, ControlPlane, K8sBins, Proc};

pub(crate) use host::mount_points;
pub use host::{cni_netns, eth0_ipv4};
use host::{ensure_run_netns_mounted, remove_links_into, unmount_under};
use mount_ns::{share_node_dir, NodeMounts};

/// The runtime of the nodes started from now on.
static RUNTIME: Mutex<Runtime> = Mutex::new(Runtime::Containerd(Containerd::V2));

/// Start the next nodes on containerd `line` (2.3 unless a tier asks for 1.6).
pub fn use_containerd(line: Containerd) {
    use_runtime(Runtime::Containerd(line));
}

/// Start the next nodes on `runtime` (containerd 2.3 unless a tier asks otherwise).
pub fn use_runtime(runtime: Runtime) {
    *RUNTIME.lock().unwrap_or_else(|e| e.into_inner()) = runtime;
}

/// The IPv6 node address of the nodes started from now on (`None`: IPv4 only, every tier's
/// unless it asks otherwise).
static NODE_IPV6: Mutex<Option<String>> = Mutex::new(None);

/// Start the next nodes dual-stack: the kubelet's `--node-ip` is eth0's IPv4 address and
/// `ipv6` (an address on a host link of the tier's own, which must exist before the node
/// starts: the kubelet checks its node IPs are local); `None` goes back to IPv4 only.
pub fn use_node_ipv6(ipv6: Option<&str>) {
    *NODE_IPV6.lock().unwrap_or_else(|e| e.into_inner()) = ipv6.map(str::to_string);
}

/// A node's runtime and its programs.
#[derive(Clone, Debug)]
pub(crate) enum Engine {
    /// containerd (either line).
    Containerd(ContainerdBins),
    /// CRI-O.
    Crio(CrioBins),
}

/// The host paths a node's processes write, and where they land under the node's directory
/// ([`Node::host_path`]).
const REDIRECTED: &[&str] = &[
    "/var/lib/cni",
    "/var/lib/kubelet/device-plugins",
    "/var/log/containers",
    "/var/lib/containers",
];

/// Where Debian's CNI plugins are; the node's CNI bin dir links to them.
pub const SYSTEM_CNI_BIN: &str = "/usr/lib/cni";

/// A running runtime (containerd or CRI-O) + kubelet. Drop (or [`Node::stop`]) cleans up.
pub struct Node<'a> {
    cp: &'a ControlPlane,
    name: String,
    node_ip: String,
    node_ip6: Option<String>,
    cgroup_root: String,
    cri: Cri,
    engine: Engine,
    netns_before: BTreeSet<String>,
    links: Mutex<Vec<String>>,
    kubelet: Mutex<Option<Proc>>,
    runtime: Mutex<Option<Proc>>,
    stopped: bool,
    dir: tempfile::TempDir,
}

impl<'a> Node<'a> {
    /// Start the runtime ([`use_runtime`]) with `primary(node dir)` (a conflist, e.g.
    /// [`super::overlay::Overlay::conflist`]) as `<conf dir>/<conf_name>`, import the pause
    /// image, start the kubelet as node `name` and wait for the Node to be Ready.
    pub fn start(
        cp: &'a ControlPlane,
        bins: &K8sBins,
        name: &str,
        conf_name: &str,
        primary: &dyn Fn(&Path) -> Value,
    ) -> Result<Node<'a>> {
        let t0 = Instant::now();
        let dir = tempfile::Builder::new().prefix("plexus-node-").tempdir()?;
        let node_ip = eth0_ipv4()?;
        // containerd 1.6 mounts pod netns files in /run/netns without making it a mount point
        // first; an `ip netns add` after that (any test) bind-mounts /run/netns over itself and
        // hides those mounts, so containerd's later unlink fails with EBUSY and the pod cannot be
        // removed. Make /run/netns a mount point now, the way `ip netns` does.
        ensure_run_netns_mounted()?;
        stale::sweep_dead_runs(dir.path());
        let netns_before = cni_netns();
        let cgroup_root = format!("/plexus-node-{}", std::process::id());
        let line = *RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        let engine = match line {
            Runtime::Containerd(l) => Engine::Containerd(ContainerdBins::find(l)?),
            Runtime::Crio => Engine::Crio(CrioBins::find()?),
        };
        let socket = dir.path().join(match line {
            Runtime::Containerd(_) => "containerd/containerd.sock",
            Runtime::Crio => crio::SOCKET,
        });
        let mut node = Node {
            cp,
            name: name.to_string(),
            node_ip,
            node_ip6: NODE_IPV6.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            cgroup_root,
            cri: Cri::new(&socket),
            engine,
            netns_before,
            links: Mutex::new(Vec::new()),
            kubelet: Mutex::new(None),
            runtime: Mutex::new(None),
            stopped: false,
            dir,
        };
        if let Err(e) = node.boot(bins, conf_name, primary) {
            let logs = format!(
                "{}:\n{}\nkubelet.log:\n{}",
                node.runtime_log_name(),
                tail(&node.path(node.runtime_log_name()), 15),
                tail(&node.path("kubelet.log"), 25)
            );
            node.stop();
            return Err(e.context(logs));
        }
        eprintln!(
            "realk8s: node {name} ({}) ready in {:.1} s (dir {})",
            line.label(),
            t0.elapsed().as_secs_f64(),
            node.dir().display()
        );
        Ok(node)
    }

    fn boot(
        &mut self,
        bins: &K8sBins,
        conf_name: &str,
        primary: &dyn Fn(&Path) -> Value,
    ) -> Result<()> {
        // Pod volumes the kubelet mounts here must reach the runtime, both in namespaces of
        // their own: the node's directory is a shared mount point.
        share_node_dir(self.dir.path())?;
        for d in [
            "cni/bin",
            "cni/net.d",
            "cni/ipam",
            "plexus",
            "kubelet/root",
            "kubelet/pki",
            "kubelet/pod-logs",
            "pause",
        ] {
            std::fs::create_dir_all(self.path(d))?;
        }
        for entry in std::fs::read_dir(SYSTEM_CNI_BIN)
            .with_context(|| format!("{SYSTEM_CNI_BIN} (containernetworking-plugins)"))?
        {
            let entry = entry?;
            std::os::unix::fs::symlink(entry.path(), self.bin_dir().join(entry.file_name()))?;
        }
        std::fs::write(
            self.conf_dir().join(conf_name),
            serde_json::to_vec_pretty(&primary(self.dir.path()))?,
        )?;
        self.make_cgroup_root()?;
        let tarball = self.path("pause/pause-oci.tar");
        pause::build_image(&self.path("pause"), &tarball)?;
        match &self.engine {
            Engine::Containerd(_) => self.boot_containerd(&tarball)?,
            Engine::Crio(_) => self.boot_crio(&tarball)?,
        }

        // kubelet: a client certificate as system:node:<name> (the Node authorizer).
        let cert = self
            .cp
            .client_cert(&format!("system:node:{}", self.name), Some("system:nodes"))?;
        self.cp
            .write_cert_kubeconfig(&self.path("kubelet/kubeconfig"), &cert)?;
        std::fs::write(self.path("kubelet/config.yaml"), self.kubelet_config()?)?;
        // A Node object left by an earlier run would still say Ready (no node controller).
        let _ = self
            .cp
            .kubectl(&["delete", "node", &self.name, "--ignore-not-found"]);
        self.start_kubelet(bins)?;
        wait_for("the Node to be Ready", Duration::from_secs(60), || {
            let n = self.cp.get_json(&format!("/api/v1/nodes/{}", self.name));
            Ok(n.ok().is_some_and(|n| node_ready(&n)))
        })
    }

    /// containerd's config, containerd, and the pause image in it.
    fn boot_containerd(&self, pause_tarball: &Path) -> Result<()> {
        for d in ["containerd/root", "containerd/state"] {
            std::fs::create_dir_all(self.path(d))?;
        }
        std::fs::write(
            self.path("containerd/config.toml"),
            self.containerd_config(),
        )?;
        self.start_containerd()?;
        self.import_image(pause_tarball)?;
        let images = self.ctr(&["images", "ls", "-q"])?;
        if !images.lines().any(|l| l == PAUSE_IMAGE) {
            bail!("{PAUSE_IMAGE} not in containerd after import: {images}");
        }
        Ok(())
    }

    /// Start containerd with the node's config and wait for its socket.
    fn start_containerd(&self) -> Result<()> {
        let args: Vec<String> = vec![
            "--config".into(),
            self.path("containerd/config.toml").display().to_string(),
        ];
        let steps = NodeMounts::default()
            .redirect("/var/lib/cni", self.host_path("/var/lib/cni"))
            .prepare()?;
        let bins = self.containerd_bins();
        let path = bins.path_env();
        let proc = Proc::spawn_with(
            "containerd",
            &bins.containerd(),
            &args,
            &self.path("containerd.log"),
            |cmd| {
                cmd.env("PATH", path);
                steps.install(cmd);
            },
        )?;
        *self.runtime.lock().unwrap_or_else(|e| e.into_inner()) = Some(proc);
        wait_for("containerd's socket", Duration::from_secs(30), || {
            Ok(self.ctr(&["version"]).is_ok())
        })
    }

    fn start_kubelet(&self, bins: &K8sBins) -> Result<()> {
        let p = |s: &str| self.path(s).display().to_string();
        let args: Vec<String> = vec![
            format!("--config={}", p("kubelet/config.yaml")),
            format!("--kubeconfig={}", p("kubelet/kubeconfig")),
            format!("--hostname-override={}", self.name),
            match &self.node_ip6 {
                Some(v6) => format!("--node-ip={},{v6}", self.node_ip),
                None => format!("--node-ip={}", self.node_ip),
            },
            format!("--root-dir={}", p("kubelet/root")),
            format!("--cert-dir={}", p("kubelet/pki")),
            "--v=2".into(),
        ];
        let steps = NodeMounts::default()
            .redirect(
                "/var/lib/kubelet/device-plugins",
                self.host_path("/var/lib/kubelet/device-plugins"),
            )
            .redirect("/var/log/containers", self.host_path("/var/log/containers"))
            .prepare()?;
        let proc = Proc::spawn_with(
            "kubelet",
            &bins.kubelet,
            &args,
            &self.path("kubelet.log"),
            |cmd| steps.install(cmd),
        )?;
        *self.kubelet.lock().unwrap_or_else(|e| e.into_inner()) = Some(proc);
        Ok(())
    }

    /// Restart the kubelet (SIGTERM, then the same command line), as a node upgrade or a
    /// config change does; pods keep running meanwhile.
    pub fn restart_kubelet(&self) -> Result<()> {
        if let Some(mut k) = self
            .kubelet
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            k.stop(Duration::from_secs(10));
        }
        self.start_kubelet(self.cp.bins())
    }

    /// Restart the node's runtime ([`Node::restart_runtime`]; containerd on a containerd node).
    pub fn restart_containerd(&self) -> Result<()> {
        self.restart_runtime()
    }

    /// Restart the runtime as `systemctl restart containerd` / `systemctl restart crio` does
    /// (their units' `KillMode=process` / `mixed` main process first: SIGTERM to the runtime
    /// alone; the pods' shims or conmons and any CNI plugin it is running go on), then wait for
    /// its socket.
    pub fn restart_runtime(&self) -> Result<()> {
        if let Some(mut c) = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            c.stop_leader(Duration::from_secs(10));
        }
        match &self.engine {
            Engine::Containerd(_) => self.start_containerd(),
            Engine::Crio(_) => self.start_crio(),
        }
    }

    /// Which runtime this node runs.
    pub fn runtime(&self) -> Runtime {
        match &self.engine {
            Engine::Containerd(b) => Runtime::Containerd(b.line),
            Engine::Crio(_) => Runtime::Crio,
        }
    }

    /// The runtime's CRI socket.
    pub fn runtime_socket(&self) -> PathBuf {
        match &self.engine {
            Engine::Containerd(_) => self.path("containerd/containerd.sock"),
            Engine::Crio(_) => self.path(crio::SOCKET),
        }
    }

    /// The runtime's log file name in the node's directory (`containerd.log`, `crio.log`).
    pub fn runtime_log_name(&self) -> &'static str {
        match &self.engine {
            Engine::Containerd(_) => "containerd.log",
            Engine::Crio(_) => "crio.log",
        }
    }

    /// The containerd programs; a CRI-O node has none (a test's mistake: panics).
    pub(crate) fn containerd_bins(&self) -> &ContainerdBins {
        match &self.engine {
            Engine::Containerd(b) => b,
            Engine::Crio(_) => panic!("node {}: containerd asked of a CRI-O node", self.name),
        }
    }

    /// The node's name (pods set `spec.nodeName` to it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's own directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `<dir>/<rel>`
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Where fixed host path `p` (one of `/var/lib/cni`, `/var/lib/kubelet/device-plugins`,
    /// `/var/log/containers`, `/var/lib/containers`, or below) is for this node's runtime,
    /// kubelet and CNI plugins.
    pub fn host_path(&self, p: &str) -> PathBuf {
        debug_assert!(REDIRECTED.iter().any(|r| Path::new(p).starts_with(r)));
        self.path("host").join(p.trim_start_matches('/'))
    }

    /// The containerd release line this node runs (a CRI-O node has none: panics).
    pub fn containerd_line(&self) -> Containerd {
        self.containerd_bins().line
    }

    /// The container logs the kubelet wrote for pod `ns/name` (all containers, all restarts).
    pub fn container_log(&self, ns: &str, name: &str) -> String {
        let mut out = String::new();
        let prefix = format!("{ns}_{name}_");
        let root = self.path("kubelet/pod-logs");
        for pod_dir in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            if !pod_dir.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            for c in std::fs::read_dir(pod_dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                for f in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
                    out.push_str(&std::fs::read_to_string(f.path()).unwrap_or_default());
                }
            }
        }
        out
    }

    /// The runtime's CNI bin dir (links to Debian's plugins; plexus is installed here).
    pub fn bin_dir(&self) -> PathBuf {
        self.path("cni/bin")
    }

    /// The runtime's CNI conf dir.
    pub fn conf_dir(&self) -> PathBuf {
        self.path("cni/net.d")
    }

    /// A `dataDir` for host-local IPAM.
    pub fn ipam_dir(&self) -> PathBuf {
        self.path("cni/ipam")
    }

    /// A `cniDir` for plexus (plans, result cache, tombstones).
    pub fn plexus_dir(&self) -> PathBuf {
        self.path("plexus")
    }

    /// The node's CRI client.
    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    /// The `cni-*` netns that existed before the node started (not the node's).
    pub fn netns_before(&self) -> &BTreeSet<String> {
        &self.netns_before
    }

    /// The node's IPv4 address (eth0's, read only).
    pub fn ip(&self) -> &str {
        &self.node_ip
    }

    /// The node's IPv6 address on a dual-stack node (see [`use_node_ipv6`]).
    pub fn ip6(&self) -> Option<&str> {
        self.node_ip6.as_deref()
    }

    /// Delete host link `name` when the node stops (bridges the CNI plugins create, test links).
    pub fn own_link(&self, name: &str) {
        self.links
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.to_string());
    }

    /// Run `ctr -n k8s.io` against this node's containerd; stdout (an error on a CRI-O node).
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let Engine::Containerd(bins) = &self.engine else {
            bail!("ctr {}: node {} runs CRI-O", args.join(" "), self.name);
        };
        let out = Command::new(bins.ctr())
            .arg("--address")
            .arg(self.path("containerd/containerd.sock"))
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .context("run ctr")?;
        if !out.status.success() {
            bail!(
                "ctr {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Import an OCI image tarball into the CRI's image store (containerd: `ctr images
    /// import`; CRI-O: `skopeo copy` into its containers-storage, under the name in the
    /// archive's index, which must be fully qualified).
    pub fn import_image(&self, tarball: &Path) -> Result<()> {
        match &self.engine {
            Engine::Containerd(_) => self
                .ctr(&["images", "import", &tarball.display().to_string()])
                .map(drop),
            Engine::Crio(bins) => self.skopeo_import(bins, tarball),
        }
    }

    /// The ready sandbox of pod `uid`: (sandbox ID = CNI container ID, netns path).
    pub fn pod_sandbox(&self, uid: &str) -> Result<(String, String)> {
        let sb = self
            .cri
            .sandboxes(Some(uid))?
            .into_iter()
            .find(|s| s.state == 0)
            .with_context(|| format!("no ready sandbox for pod {uid}"))?;
        let netns = self.host_netns(&self.cri.sandbox_netns(&sb.id)?);
        Ok((sb.id, netns))
    }

    /// The last `n` lines of the kubelet's and the runtime's logs (for failure messages).
    pub fn logs(&self, n: usize) -> String {
        format!(
            "--- kubelet.log\n{}\n--- {}\n{}",
            tail(&self.path("kubelet.log"), n),
            self.runtime_log_name(),
            tail(&self.path(self.runtime_log_name()), n)
        )
    }

    /// Whether the runtime answers (containerd: `ctr version`; CRI-O: a CRI call).
    fn runtime_answers(&self) -> bool {
        match &self.engine {
            Engine::Containerd(_) => self.ctr(&["version"]).is_ok(),
            Engine::Crio(_) => self.runtime_socket().exists() && self.cri.sandboxes(None).is_ok(),
        }
    }

    /// Stop everything and clean up (idempotent; also run on drop). Failures are printed, not
    /// returned: every step runs.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if let Some(mut k) = self
            .kubelet
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            k.stop(Duration::from_secs(10));
        }
        // Only this node's pod namespaces are removed below: other tiers (or helpers) may run
        // kubelets of their own meanwhile, whose `cni-*` namespaces are none of ours.
        let mut own_netns = Vec::new();
        if self.runtime_answers() {
            match self.cri.sandboxes(None) {
                Ok(sbs) => {
                    for sb in sbs {
                        if let Ok(ns) = self.cri.sandbox_netns(&sb.id) {
                            own_netns.push(self.host_netns(&ns));
                        }
                        if let Err(e) = self.cri.stop_and_remove(&sb.id) {
                            eprintln!("realk8s node: remove sandbox {}: {e:#}", sb.id);
                        }
                    }
                }
                Err(e) => eprintln!("realk8s node: list sandboxes: {e:#}"),
            }
        }
        if let Some(mut c) = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            c.stop(Duration::from_secs(10));
        }
        match &self.engine {
            Engine::Containerd(_) => self.kill_shims(),
            Engine::Crio(_) => self.kill_conmons(),
        }
        unmount_under(self.dir.path());
        for p in own_netns
            .iter()
            .filter(|p| !p.is_empty() && Path::new(p).exists())
        {
            let _ = nix::mount::umount2(p.as_str(), nix::mount::MntFlags::MNT_DETACH);
            if let Err(e) = std::fs::remove_file(p) {
                eprintln!("realk8s node: remove {p}: {e}");
            }
        }
        for l in self
            .links
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = Command::new("ip")
                .args(["link", "del", &l])
                .stderr(std::process::Stdio::null())
                .status();
        }
        self.remove_cgroup_root();
        stale::after_stop(self.dir.path());
        // Nodes of earlier builds linked container logs into the host's own directory.
        remove_links_into("/var/log/containers", self.dir.path());
        let _ = self.cp.kubectl(&[
            "delete",
            "node",
            &self.name,
            "--ignore-not-found",
            "--wait=false",
        ]);
        if std::env::var_os("PLEXUS_K8S_KEEP").is_some() {
            eprintln!("realk8s: keeping {}", self.dir().display());
            // Cleaned up above: the next run's sweep of killed runs leaves it alone.
            let _ = std::fs::write(self.path(stale::KEPT), "");
            self.dir.disable_cleanup(true);
        }
    }
}

impl Drop for Node<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Poll `f` every 50 ms until it says true.
pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if f()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn node_ready(node: &Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}
