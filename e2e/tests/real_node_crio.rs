//! CRI-O tier: a real kubelet v1.36 in front of **CRI-O 1.36** (`../shared/runtimes`, Debian's
//! runc and conmon; `plexus_e2e::realk8s::node::crio`) registered with a real kube-apiserver,
//! the cluster network real flannel, then real calico (`plexus_e2e::realk8s::overlay`), and
//! plexus installed the way the DaemonSets do it (`deploy/install.sh` with the DaemonSet's
//! command and environment): thin mode on both overlays, daemon mode (`plexus-shim` +
//! `plexus-daemon`, its /metrics counting what it served) on calico.
//!
//! On each overlay: the Node reports `cri-o://1.36.x` and goes Ready; two pods with a bridge
//! NAD and a macvlan NAD ping each other on eth0, net1 and net2 (and the node); a hostPort
//! reaches a listener in its pod; after delete nothing is left (netns, plexus plan, host-local
//! or calico lease, flannel state, libcni cache entry, iptables rule); CRI-O restarted (its
//! pods keep running and answering, a new pod gets every network); the kubelet restarted (the
//! same); and CRI-O's start-up GC (plexus' config at cniVersion 1.1.0): a restart keeps every
//! live pod's attachments and reclaims those of a sandbox CRI-O does not know (a plexus ADD
//! run by hand for a pod of another node: its plan and leases). With the 1.1.0 config CRI-O
//! also sends CHECK after every ADD (counted in its log). On calico (thin), the conflist
//! declared 1.0.0 makes that CHECK reach Debian's `bandwidth` 1.1.1, which panics: the sandbox
//! fails with an error naming the pod, the network and the plugin, and nothing leaks.
//!
//! What differs from containerd, seen here: CRI-O validates a CNI config's plugins when it
//! loads it (the overlay's binaries must be in place before it starts); it sends CHECK after
//! every ADD and when it restores its sandboxes at start-up (Debian's bridge 1.1.1 fails CHECK
//! once its bridge's MAC moved: "Could not restore sandbox IP"), with the config current at
//! that moment; it runs GC at start-up with its sandboxes as the valid list; libcni 1.2 picks
//! 1.1.0 from install.sh's `cniVersions`.
//!
//! Skipped (and passing) without `PLEXUS_K8S_BIN`; `PLEXUS_K8S_REQUIRE=1` makes that a failure.
//! `cargo test -p plexus-e2e --test real_node_crio -- NAME` runs the cases whose name contains
//! NAME; `calico/…` starts only calico's node.

#[allow(dead_code)]
#[path = "real_node/api.rs"]
mod api;
mod common;
#[allow(dead_code)]
#[path = "real_node/leftovers.rs"]
mod leftovers;
#[allow(dead_code)]
#[path = "real_node/pods.rs"]
mod pods;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::node::mount_ns::NodeMounts;
use plexus_e2e::realk8s::node::{use_runtime, wait_for, Node};
use plexus_e2e::realk8s::node_rig::{
    selected_overlays, veth_pair, DaemonOpts, InstallSh, OverlayNode, PlexusDaemon, DAEMON_OVERLAY,
    THIN_OVERLAY,
};
use plexus_e2e::realk8s::overlay::{Kind, Overlay};
use plexus_e2e::realk8s::rig::{plexus_token, PlexusToken, Rig};
use plexus_e2e::realk8s::runtimes::{Containerd, Runtime};
use plexus_e2e::realk8s::{
    control_plane_or_skip, setup_or_report, tail, ControlPlane, Proc, Suite,
};
use serde_json::{json, Value};

use api::Api;
use leftovers::{wait_clean, Seen};
use pods::*;

/// Namespace of the test pods and NADs.
const NS: &str = "app";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let mut suite = Suite::new("real_node_crio");
    let rig = Rig::builder().namespaces(&[NS, "default"]).build(&cp);
    let Some(_rig) = setup_or_report("real_node_crio", &cp, rig) else {
        return ExitCode::FAILURE;
    };
    use_runtime(Runtime::Crio);
    // Thin mode on both overlays, daemon mode on calico (`full` = daemon here).
    for (kind, octet, daemon) in selected_overlays(&[
        (Kind::Flannel, 238, false),
        (Kind::Calico, 237, false),
        (Kind::Calico, 235, true),
    ]) {
        let mode = if daemon { Mode::Daemon } else { Mode::Thin };
        let t0 = Instant::now();
        let started = Tier::start(&cp, kind, octet, mode);
        let Some(mut tier) = setup_or_report("real_node_crio", &cp, started) else {
            use_runtime(Runtime::Containerd(Containerd::V2));
            return ExitCode::FAILURE;
        };
        println!(
            "real_node_crio: {} node on CRI-O ({mode:?} mode) ready in {:.1} s",
            kind.name(),
            t0.elapsed().as_secs_f64()
        );
        run_cases(&mut suite, &mut tier);
        tier.stop_and_check();
    }
    use_runtime(Runtime::Containerd(Containerd::V2));
    suite.finish()
}

/// The cases on one overlay, in order.
fn run_cases(suite: &mut Suite, tier: &mut Tier<'_>) {
    let k = tier.overlay.kind().name();
    let m = match tier.mode {
        Mode::Thin => "crio",
        Mode::Daemon => "crio-daemon",
    };
    let name = |c: &str| format!("{k}/{m}/{c}");
    let installed = tier.install();
    let ok = installed.is_ok();
    suite.case(
        &name("node_reports_cri_o_and_install_sh_runs_with_the_daemonsets_environment"),
        || installed,
    );
    if !ok {
        return;
    }
    suite.case(
        &name("pods_with_a_bridge_and_a_macvlan_nad_traffic_on_each_interface_nothing_left"),
        || tier.pods_with_traffic("nads"),
    );
    suite.case(&name("host_port_answers_and_nothing_is_left"), || {
        tier.host_port()
    });
    suite.case(
        &name("crio_restarted_pods_keep_running_new_pods_get_every_network"),
        || tier.across_restart("crio", |t| t.node.restart_runtime()),
    );
    suite.case(
        &name("kubelet_restarted_pods_keep_running_new_pods_get_every_network"),
        || tier.across_restart("kubelet", |t| t.node.restart_kubelet()),
    );
    suite.case(
        &name("startup_gc_keeps_live_pods_and_reclaims_a_sandbox_crio_does_not_know"),
        || tier.startup_gc(),
    );
    if tier.overlay.has_bandwidth() && tier.mode == Mode::Thin {
        suite.case(
            &name(
                "bandwidth_check_panic_over_a_1_0_0_conflist_gives_a_clear_error_and_leaks_nothing",
            ),
            || tier.bandwidth_check(),
        );
    }
}

/// How plexus runs on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The `plexus` binary (deploy/components/thin/plexus-daemonset.yaml's installer).
    Thin,
    /// `plexus-shim` + `plexus-daemon` (deploy/components/daemon/plexus-daemon-daemonset.yaml).
    Daemon,
}

/// Everything the cases share.
struct Tier<'a> {
    cp: &'a ControlPlane,
    mode: Mode,
    daemon: Option<PlexusDaemon>,
    node: Node<'a>,
    overlay: Overlay,
    api: Api,
    installer: Option<Proc>,
    /// The cluster network's name (network-status of eth0).
    net: &'static str,
    /// The bridge NAD's bridge, the macvlan NAD's master (a veth of the test's own).
    bridge: String,
    master: String,
    /// Every sandbox ID (libcni cache and iptables checks) and pod netns path seen.
    seen: std::cell::RefCell<Seen>,
}

/// A short unique link name (at most 15 bytes), swept by a later run if this one is killed.
fn link(suffix: &str) -> String {
    format!("pxo{}{suffix}", std::process::id() % 100_000)
}

impl<'a> Tier<'a> {
    fn start(cp: &'a ControlPlane, kind: Kind, octet: u8, mode: Mode) -> Result<Tier<'a>> {
        let k = match mode {
            Mode::Thin => &kind.name()[..1],
            Mode::Daemon => "d",
        };
        let bridge = link(&format!("{k}a"));
        let master = link(&format!("{k}m"));
        let links = vec![bridge.clone(), master.clone(), format!("{master}p")];
        let OverlayNode { node, overlay } = OverlayNode::start(
            cp,
            kind,
            octet,
            &link(k),
            &format!("plexus-crio-{}-{}", kind.name(), k),
            &links,
        )?;
        veth_pair(&master)?;
        Ok(Tier {
            cp,
            mode,
            daemon: None,
            api: Api::new(&cp.admin_kubeconfig())?,
            installer: None,
            net: overlay.network_name(),
            node,
            overlay,
            bridge,
            master,
            seen: Default::default(),
        })
    }

    /// Stop everything; say what the node left on the host.
    fn stop_and_check(mut self) {
        if let Some(mut p) = self.installer.take() {
            p.stop(Duration::from_secs(10));
        }
        self.overlay.stop();
        self.node.stop();
        if let Some(d) = self.daemon.take() {
            d.stop();
        }
        let dir = self.node.dir().display().to_string();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if mounts.contains(&dir) {
            eprintln!("real_node_crio: WARNING: mounts left under {dir}");
        }
        let left: Vec<&String> = self
            .seen
            .get_mut()
            .netns
            .iter()
            .filter(|n| Path::new(n).exists())
            .collect();
        if !left.is_empty() {
            eprintln!("real_node_crio: WARNING: netns left: {left:?}");
        }
        let conmons = self.node.conmons();
        if !conmons.is_empty() {
            eprintln!("real_node_crio: WARNING: conmon processes left: {conmons:?}");
        }
    }

    // ------------------------------------------------------------------------------ install

    /// The Node says `cri-o://1.36`; deploy's manifests applied; install.sh run as the
    /// DaemonSet would; a pod gets plexus' network-status; the NADs.
    fn install(&mut self) -> Result<()> {
        let cp = self.cp;
        let node: Value = cp.get_json(&format!("/api/v1/nodes/{}", self.node.name()))?;
        let rt = node["status"]["nodeInfo"]["containerRuntimeVersion"]
            .as_str()
            .unwrap_or("");
        ensure!(
            rt.starts_with("cri-o://1.36."),
            "the Node's runtime: {rt:?}"
        );
        println!("    Node {}: {rt}", self.node.name());
        let (install, binaries) = match self.mode {
            Mode::Thin => {
                cp.apply_kustomization(THIN_OVERLAY)?;
                let install = InstallSh::from_daemonset(cp, "kube-plexus-ds", "install-plexus")?;
                (install, vec![("plexus", common::bin("plexus"))])
            }
            Mode::Daemon => {
                cp.apply_kustomization(DAEMON_OVERLAY)?;
                let token = plexus_token(cp, &PlexusToken::Unbound)?;
                let kubeconfig = self.node.path("daemon.kubeconfig");
                cp.write_kubeconfig(&kubeconfig, &token)?;
                std::fs::create_dir_all(self.node.path("run"))?;
                self.daemon = Some(PlexusDaemon::start(&DaemonOpts {
                    bin: &common::bin("plexus-daemon"),
                    socket: &self.socket(),
                    kubeconfig: &kubeconfig,
                    node: self.node.name(),
                    dir: self.node.dir(),
                    metrics_port: plexus_e2e::realk8s::free_port()?,
                })?);
                let install =
                    InstallSh::from_daemonset(cp, "kube-plexus-daemon", "install-plexus")?;
                (
                    install,
                    vec![
                        ("plexus", common::bin("plexus")),
                        ("plexus-shim", common::bin("plexus-shim")),
                    ],
                )
            }
        };
        let token = plexus_token(cp, &PlexusToken::Unbound)?;
        let mut binaries = binaries;
        binaries.push(("sriov", common::bin("sriov")));
        let mut extra = install.extra.clone();
        extra["cniDir"] = json!(self.node.plexus_dir());
        extra["nadPolicy"] = nad_policy_allowing(&[&self.node.ipam_dir()]);
        if self.mode == Mode::Daemon {
            extra["daemonSocket"] = json!(self.socket());
            // The daemon's node reconciler asks this node's CRI-O, not a default socket.
            extra["runtimeEndpoint"] =
                json!(format!("unix://{}", self.node.runtime_socket().display()));
        }
        self.installer = Some(install.spawn(cp, &self.node, &token, &binaries, &extra)?);
        wait_for("plexus' config", Duration::from_secs(60), || {
            Ok(self.plexus_conf().exists())
        })
        .with_context(|| tail(&self.node.path("installer.log"), 20))?;
        let conf: Value = serde_json::from_slice(&std::fs::read(self.plexus_conf())?)?;
        println!(
            "    {}: cniVersion {} cniVersions {}",
            self.plexus_conf().display(),
            conf["cniVersion"],
            conf["cniVersions"]
        );
        let plugin = if conf["plugins"].is_array() {
            &conf["plugins"][0]
        } else {
            &conf
        };
        let want = match self.mode {
            Mode::Thin => "plexus",
            Mode::Daemon => "plexus-shim",
        };
        ensure!(plugin["type"] == want, "{conf}");
        wait_until_plexus_is_in_the_path(&self.api, NS, self.node.name())
            .with_context(|| self.node.logs(15))?;
        let (sb, netns) = self.pod_netns("probe")?;
        self.seen.borrow_mut().sandboxes.push(sb);
        delete_one(&self.api, NS, "probe", &netns, Duration::from_secs(30))?;
        self.wait_clean()?;
        let nad = |name: &str, cfg: Value| -> Result<()> {
            let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":{"name":name,"namespace":NS},"spec":{"config":cfg.to_string()}});
            cp.apply(&nad.to_string()).map(drop)
        };
        let ipam = |subnet: &str| json!({"type":"host-local","dataDir":self.node.ipam_dir(),"ranges":[[{"subnet":subnet}]]});
        nad(
            "br-a",
            json!({"cniVersion":"1.0.0","name":"br-a","type":"bridge","bridge":self.bridge,"ipam":ipam("10.236.1.0/24")}),
        )?;
        nad(
            "mv-c",
            json!({"cniVersion":"0.4.0","name":"mv-c","type":"macvlan","master":self.master,"mode":"bridge","ipam":ipam("10.236.3.0/24")}),
        )?;
        Ok(())
    }

    /// The daemon's socket (daemon mode), in the node's directory: CRI-O's shim calls reach it
    /// from CRI-O's mount namespace.
    fn socket(&self) -> PathBuf {
        self.node.path("run/plexus.sock")
    }

    /// install.sh's config: `00-plexus.conf` (a 0.x primary) or `00-plexus.conflist` (an
    /// installer that writes a conflist with `cniVersions`), whichever exists.
    fn plexus_conf(&self) -> PathBuf {
        let list = self.node.conf_dir().join("00-plexus.conflist");
        if list.exists() {
            list
        } else {
            self.node.conf_dir().join("00-plexus.conf")
        }
    }

    // ---------------------------------------------------------------------------- helpers

    /// (sandbox ID, netns path) of a running pod.
    fn pod_netns(&self, name: &str) -> Result<(String, String)> {
        self.seen
            .borrow_mut()
            .pod_netns(&self.api, &self.node, NS, name)
    }

    /// What the node still holds of deleted pods: plexus plans and caches, host-local
    /// leases, netns, veths on the NAD's bridge, libcni cache entries, the overlay's state.
    fn leftovers(&self) -> Vec<String> {
        self.seen.borrow().leftovers(
            self.cp,
            &self.node,
            &self.overlay,
            std::slice::from_ref(&self.bridge),
        )
    }

    /// Wait (10 s) until [`Tier::leftovers`] is empty.
    fn wait_clean(&self) -> Result<()> {
        wait_clean(Duration::from_secs(10), || self.leftovers())
    }

    /// Two pods `<batch>-a`, `<batch>-b` with `br-a` and `mv-c`, Running; each one's network
    /// checked against its netns; (name, netns) of each.
    fn create_pair(&self, batch: &str) -> Result<Vec<(String, String)>> {
        let names = [format!("{batch}-a"), format!("{batch}-b")];
        let manifests: Vec<Value> = names
            .iter()
            .map(|n| manifest(NS, n, self.node.name(), batch, Some(&json!("br-a, mv-c"))))
            .collect();
        create_and_wait(&self.api, &manifests, Duration::from_secs(90))
            .with_context(|| self.node.logs(15))?;
        let mut out = Vec::new();
        for n in &names {
            let (sb, netns) = self.pod_netns(n)?;
            self.seen.borrow_mut().sandboxes.push(sb);
            let pod = self.api.get_pod(NS, n)?.context("pod")?;
            check_pod_network(
                &network_status(&pod)?,
                &netns,
                &[
                    (self.net, "eth0"),
                    ("app/br-a", "net1"),
                    ("app/mv-c", "net2"),
                ],
            )
            .with_context(|| format!("pod {n}"))?;
            out.push((n.clone(), netns));
        }
        Ok(out)
    }

    /// Pings between the two pods on eth0, net1 and net2, both ways, and pod -> node.
    fn traffic(&self, pair: &[(String, String)]) -> Result<()> {
        let [(a, na), (b, nb)] = pair else {
            anyhow::bail!("two pods expected: {pair:?}");
        };
        for ifname in ["eth0", "net1", "net2"] {
            ensure_pings_both_ways(a, na, b, nb, ifname)?;
        }
        let node_ip = self.node.ip();
        ensure!(
            pings(Some(na), node_ip),
            "{a} -> the node ({node_ip}): no answer"
        );
        Ok(())
    }

    /// Delete the batch, wait until gone and nothing is left; their eth0 addresses stop
    /// answering.
    fn delete_pair(&self, batch: &str, pair: &[(String, String)]) -> Result<()> {
        self.delete_batches(&[(batch, pair)])
    }

    /// [`Tier::delete_pair`] for several batches (nothing left once all are gone).
    fn delete_batches(&self, batches: &[(&str, &[(String, String)])]) -> Result<()> {
        let mut addrs = Vec::new();
        for (batch, pair) in batches {
            addrs.extend(pair.iter().filter_map(|(_, ns)| address(ns, "eth0").ok()));
            let names: Vec<String> = pair.iter().map(|(n, _)| n.clone()).collect();
            let netns: Vec<String> = pair.iter().map(|(_, n)| n.clone()).collect();
            delete_and_wait(
                &self.api,
                NS,
                batch,
                &names,
                &netns,
                Duration::from_secs(60),
            )?;
        }
        self.wait_clean()?;
        ensure_no_address_answers(&addrs)?;
        Ok(())
    }

    /// Delete whatever pods of `batch` exist (after a failure), best effort.
    fn cleanup(&self, batch: &str) {
        let pods = self.api.list_pods(NS, batch).unwrap_or_default();
        let names: Vec<String> = pods
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        let none = vec![String::new(); names.len()];
        let _ = delete_and_wait(&self.api, NS, batch, &names, &none, Duration::from_secs(60));
    }

    // ------------------------------------------------------------------------------ cases

    /// The daemon's request count for `verb` with outcome `ok` (0 in thin mode).
    fn daemon_served(&self, verb: &str) -> Result<f64> {
        match &self.daemon {
            Some(d) => d.metric("plexus_cni_requests_total", &[verb, "ok"]),
            None => Ok(0.0),
        }
    }

    fn pods_with_traffic(&self, batch: &str) -> Result<()> {
        let run = || -> Result<()> {
            let served = self.daemon_served("ADD")?;
            let pair = self.create_pair(batch)?;
            if self.mode == Mode::Daemon {
                let n = self.daemon_served("ADD")? - served;
                ensure!(n >= 2.0, "the daemon served {n} ADDs for 2 pods");
            }
            self.traffic(&pair)?;
            self.delete_pair(batch, &pair)
        };
        let r = run();
        if r.is_err() {
            self.cleanup(batch);
        }
        r
    }

    /// A hostPort pod (bandwidth annotations too; 1 NAD): the node's address and port reach a
    /// listener on the containerPort in the pod; with `bandwidth` in the overlay's conflist
    /// (calico), an ifb while it runs. Nothing left after.
    fn host_port(&self) -> Result<()> {
        let port = plexus_e2e::realk8s::free_port()?;
        let ifb_before = ifb_links();
        create_and_wait(
            &self.api,
            &[hostport_manifest(NS, self.node.name(), port)],
            Duration::from_secs(90),
        )
        .with_context(|| self.node.logs(15))?;
        let (sb, netns) = self.pod_netns("hostport")?;
        self.seen.borrow_mut().sandboxes.push(sb);
        let checked: Result<()> = (|| {
            check_hostport_pod_network(&self.api, NS, &netns, self.net)?;
            let token = format!("plexus-crio-hostport-{port}");
            ensure_host_port_answers(&netns, self.node.ip(), port, &token)?;
            let ifbs = new_ifbs(&ifb_before, self.overlay.has_bandwidth())?;
            println!("    hostPort {port} answered from the pod; ifb {ifbs:?}");
            Ok(())
        })();
        delete_one(&self.api, NS, "hostport", &netns, Duration::from_secs(60))?;
        checked?;
        self.wait_clean()?;
        ensure_host_port_gone(self.node.ip(), port, &ifb_before)
    }

    /// Two pods with NADs, `restart` (CRI-O or the kubelet), then: the same sandboxes, still
    /// answering on every interface; two new pods get every network and traffic; all deleted,
    /// nothing left.
    fn across_restart(&self, what: &str, restart: impl Fn(&Self) -> Result<()>) -> Result<()> {
        let run = || -> Result<()> {
            let old = self.create_pair(&format!("{what}-old"))?;
            let before: Vec<String> = old
                .iter()
                .map(|(n, _)| self.pod_netns(n).map(|(sb, _)| sb))
                .collect::<Result<_>>()?;
            let t = Instant::now();
            restart(self)?;
            println!("    {what} restarted in {:.1} s", t.elapsed().as_secs_f64());
            // The kubelet's next sync must not replace the sandboxes.
            std::thread::sleep(Duration::from_secs(5));
            let after: Vec<String> = old
                .iter()
                .map(|(n, _)| self.pod_netns(n).map(|(sb, _)| sb))
                .collect::<Result<_>>()?;
            ensure!(
                before == after,
                "sandboxes replaced: {before:?} -> {after:?}"
            );
            for (n, _) in &old {
                let pod = self.api.get_pod(NS, n)?.context("pod")?;
                ensure!(running(&pod), "{n} not Running after the {what} restart");
            }
            self.traffic(&old)?;
            let new = self.create_pair(&format!("{what}-new"))?;
            self.traffic(&new)?;
            self.traffic(&[old[0].clone(), new[1].clone()])?;
            self.delete_batches(&[
                (&format!("{what}-old"), &old),
                (&format!("{what}-new"), &new),
            ])
        };
        let r = run();
        if r.is_err() {
            self.cleanup(&format!("{what}-old"));
            self.cleanup(&format!("{what}-new"));
        }
        r
    }

    /// CRI-O's start-up GC. plexus' config at cniVersion 1.1.0 (installer stopped first: it
    /// would write its own back), CRI-O restarted to load it; two live pods (CRI-O sends CHECK
    /// after each ADD: counted in plexus' log); a leaked attachment: plexus ADD run by hand, as
    /// CRI-O would, for a pod bound to another node, in a netns of the test's, so its plan and
    /// leases exist for a sandbox CRI-O does not know. CRI-O restarted: its GC keeps both live
    /// pods' plans, leases and traffic, and releases the leaked ones. The 0.3.1 config is
    /// written back at the end.
    /// The overlay's conflist (calico's, chaining Debian's `bandwidth` 1.1.1) declared
    /// cniVersion 1.0.0: CRI-O's CHECK after ADD reaches plexus, which forwards it to the
    /// chain, and `bandwidth` panics in CHECK for a pod without bandwidth settings (fixed
    /// upstream in plugins v1.9.1). What is asserted: the sandbox fails with an error naming
    /// the pod, the network and the plugin; the retries leave no plan, lease or calico handle;
    /// after the conflist is written back, a pod runs again. The kubelet's retry count is
    /// printed.
    fn bandwidth_check(&mut self) -> Result<()> {
        let primary = self.node.conf_dir().join(self.overlay.conf_name());
        let original = std::fs::read_to_string(&primary)?;
        let mut declared: Value = serde_json::from_str(&original)?;
        declared["cniVersion"] = json!("1.0.0");
        write_atomically(&primary, &serde_json::to_string_pretty(&declared)?)?;
        let r = self.bandwidth_check_with();
        self.cleanup("bwcheck");
        write_atomically(&primary, &original)?;
        let after = self.wait_clean();
        r?;
        after?;
        // Written back: pods run again.
        self.pods_with_traffic("after-bw")
    }

    fn bandwidth_check_with(&self) -> Result<()> {
        let name = "bw-check";
        // CRI-O reloads the conf dir on the write event.
        std::thread::sleep(Duration::from_secs(1));
        self.api.create_pod(&manifest(
            NS,
            name,
            self.node.name(),
            "bwcheck",
            Some(&json!("br-a")),
        ))?;
        let mut failure = String::new();
        let mut outcome = "";
        wait_for(
            "the pod Running or its sandbox failing",
            Duration::from_secs(60),
            || {
                let pod = self.api.get_pod(NS, name)?.context("pod gone")?;
                if running(&pod) {
                    outcome = "running";
                    return Ok(true);
                }
                if let Some(m) = self
                    .api
                    .events(NS, name)?
                    .iter()
                    .filter(|e| e["reason"] == "FailedCreatePodSandBox")
                    .filter_map(|e| e["message"].as_str())
                    .next()
                {
                    failure = m.to_string();
                    outcome = "failed";
                    return Ok(true);
                }
                Ok(false)
            },
        )?;
        if outcome == "running" {
            println!("    the pod runs: no CHECK failure over the 1.0.0 conflist");
            let (sb, netns) = self.pod_netns(name)?;
            self.seen.borrow_mut().sandboxes.push(sb);
            delete_and_wait(
                &self.api,
                NS,
                "bwcheck",
                &[name.to_string()],
                &[netns],
                Duration::from_secs(60),
            )?;
            return Ok(());
        }
        println!("    sandbox failed: {}", &failure[..failure.len().min(600)]);
        for want in ["app/bw-check", self.net, "bandwidth", "CHECK"] {
            ensure!(
                failure.contains(want),
                "the error does not name {want:?}: {failure}"
            );
        }
        // The kubelet retries; each failed sandbox is DELeted through plexus.
        std::thread::sleep(Duration::from_secs(10));
        let tries = self
            .api
            .events(NS, name)?
            .iter()
            .filter(|e| e["reason"] == "FailedCreatePodSandBox")
            .map(|e| e["count"].as_u64().unwrap_or(1))
            .sum::<u64>();
        let plans = common::files_under(&self.node.plexus_dir().join("plans"));
        println!("    after 10 s: {tries} failed sandboxes, plans on the node: {plans:?}");
        // At most the attempt in flight holds one.
        ensure!(plans.len() <= 1, "failed sandboxes left plans: {plans:?}");
        Ok(())
    }

    fn startup_gc(&mut self) -> Result<()> {
        if let Some(mut p) = self.installer.take() {
            p.stop(Duration::from_secs(10));
        }
        let path = self.plexus_conf();
        let original = std::fs::read_to_string(&path)?;
        let mut conf: Value = serde_json::from_str(&original)?;
        // A config that offers 1.1.0 in `cniVersions` is run at 1.1.0 by CRI-O's libcni as
        // it is; else `cniVersion` becomes 1.1.0.
        let offers = conf["cniVersions"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v == "1.1.0"));
        if !offers {
            conf["cniVersion"] = json!("1.1.0");
            write_atomically(&path, &serde_json::to_string_pretty(&conf)?)?;
        }
        // What libcni sends plexus: its plugin's config with the list's name and version.
        let mut plugin = if conf["plugins"].is_array() {
            conf["plugins"][0].clone()
        } else {
            conf.clone()
        };
        plugin["name"] = conf["name"].clone();
        plugin["cniVersion"] = json!("1.1.0");
        if let Some(o) = plugin.as_object_mut() {
            o.remove("cniVersions");
        }
        let batch = "gc";
        let ghost = Ghost::new(self)?;
        let r = self.startup_gc_with(batch, &plugin, &ghost);
        if r.is_err() {
            self.cleanup(batch);
        }
        ghost.remove(self);
        write_atomically(&path, &original)?;
        let _ = self.node.restart_runtime();
        r
    }

    fn startup_gc_with(&self, batch: &str, conf: &Value, ghost: &Ghost) -> Result<()> {
        let log = self.node.path("crio.log");
        self.node.restart_runtime()?;
        let checks_before = count_in(&log, "Checking pod app_gc-");
        let live = self.create_pair(batch)?;
        let checks = count_in(&log, "Checking pod app_gc-") - checks_before;
        println!(
            "    CHECKs CRI-O sent while the 2 pods were created (at cniVersion 1.1.0): {checks}"
        );
        ensure!(checks >= 2, "CRI-O sent {checks} CHECKs for 2 new pods");
        self.traffic(&live)?;
        let live_ids: Vec<String> = live
            .iter()
            .map(|(n, _)| self.pod_netns(n).map(|(sb, _)| sb))
            .collect::<Result<_>>()?;
        // The leak.
        ghost.add(self, conf)?;
        let leaked = self.holding(&ghost.id);
        ensure!(
            leaked.iter().any(|l| l.starts_with("plexus"))
                && leaked
                    .iter()
                    .any(|l| l.starts_with("lease") || l.starts_with("calico")),
            "the hand-run ADD left no plan and lease: {leaked:?}"
        );
        println!("    leaked (no sandbox in CRI-O): {leaked:?}");
        let live_before: Vec<Vec<String>> = live_ids.iter().map(|id| self.holding(id)).collect();
        // Nothing else releases it (no installer, no reconciler, no runtime call).
        std::thread::sleep(Duration::from_secs(5));
        let still = self.holding(&ghost.id);
        // Its plan, leases and handles (the cache and lock files may be rewritten meanwhile,
        // and the pending network-status write ends: the hand-run pod is not on this node).
        let durable = |v: &[String]| -> Vec<String> {
            v.iter()
                .filter(|l| {
                    !l.starts_with("plexus: locks")
                        && !l.starts_with("plexus: results")
                        && !l.starts_with("plexus: status-pending")
                })
                .cloned()
                .collect()
        };
        ensure!(
            durable(&still) == durable(&leaked),
            "the leak changed before CRI-O's restart: {leaked:?} -> {still:?}"
        );
        let restores_before = count_in(&log, "Error checking network");
        let gcs_before = self.daemon_served("GC")?;
        let t = Instant::now();
        self.node.restart_runtime()?;
        wait_for(
            "the leaked attachment released",
            Duration::from_secs(60),
            || Ok(self.holding(&ghost.id).is_empty()),
        )
        .with_context(|| {
            format!(
                "still held: {:?}\n{}",
                self.holding(&ghost.id),
                tail(&log, 30)
            )
        })?;
        println!(
            "    CRI-O restarted; leaked plan and leases released {:.1} s after the restart began",
            t.elapsed().as_secs_f64()
        );
        // The only CNI call a runtime makes about a container it does not know is GC (the
        // hand-run ADD left no libcni cache entry for its GC to DEL): plexus' GC released it
        // and left its tombstone.
        if self.mode == Mode::Daemon {
            let n = self.daemon_served("GC")? - gcs_before;
            ensure!(n >= 1.0, "the daemon served {n} GCs over CRI-O's restart");
            println!("    the daemon served {n} GC over CRI-O's restart");
        }
        let tombstone = self
            .node
            .plexus_dir()
            .join(format!("tombstones/{}-eth0", ghost.id));
        ensure!(tombstone.exists(), "no tombstone {}", tombstone.display());
        let restores = count_in(&log, "Error checking network") - restores_before;
        println!(
            "    CRI-O restored its sandboxes with CHECK: {restores} CHECKs failed (\"Error checking network\")"
        );
        for (id, before) in live_ids.iter().zip(&live_before) {
            let now = self.holding(id);
            ensure!(
                &now == before,
                "a live pod's attachments changed across the GC: {before:?} -> {now:?}"
            );
        }
        self.traffic(&live)?;
        // The leaked sandbox's netns goes as its runtime would have removed it (its veths
        // with it).
        ghost.remove(self);
        self.delete_pair(batch, &live)
    }

    /// What the node holds for container `id`: plexus files naming it, leases naming it,
    /// calico's handle for it, flannel's state for it.
    fn holding(&self, id: &str) -> Vec<String> {
        let mut v = Vec::new();
        let dir = self.node.plexus_dir();
        for f in common::files_under(&dir) {
            let text = std::fs::read_to_string(dir.join(&f)).unwrap_or_default();
            if f.contains(id) || text.contains(id) {
                v.push(format!("plexus: {f}"));
            }
        }
        let ipam = self.node.ipam_dir();
        for f in common::files_under(&ipam) {
            let text = std::fs::read_to_string(ipam.join(&f)).unwrap_or_default();
            if text.contains(id) {
                v.push(format!("lease: {f}"));
            }
        }
        for e in std::fs::read_dir(self.node.path("flannel/data"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().contains(id) {
                v.push(format!("flannel: {}", e.file_name().to_string_lossy()));
            }
        }
        if self.overlay.kind() == Kind::Calico {
            let out = self
                .cp
                .kubectl(&["get", "ipamhandles.crd.projectcalico.org", "-o", "name"])
                .unwrap_or_default();
            v.extend(
                out.lines()
                    .filter(|l| l.contains(id))
                    .map(|l| format!("calico {l}")),
            );
        }
        v.sort();
        v
    }
}

/// A sandbox CRI-O does not know: a pod object bound to another node (the kubelet leaves it
/// alone), a netns of the test's, and a container ID; plexus ADD run by hand for it.
struct Ghost {
    id: String,
    netns: String,
    pod: String,
}

impl Ghost {
    fn new(tier: &Tier<'_>) -> Result<Ghost> {
        let pod = "ghost".to_string();
        let mut m = manifest(NS, &pod, "elsewhere", "ghost", Some(&json!("br-a")));
        m["spec"]["nodeName"] = json!("elsewhere");
        tier.api.create_pod(&m)?;
        let netns = link("g");
        let ok = Command::new("ip")
            .args(["netns", "add", &netns])
            .status()?
            .success();
        ensure!(ok, "ip netns add {netns}");
        let id = format!("{:0>64x}", 0x9e0c_0000_u64 + u64::from(std::process::id()));
        Ok(Ghost { id, netns, pod })
    }

    /// plexus ADD (eth0) as CRI-O runs it: the node's CNI bin dir, the pod's CNI_ARGS, in a
    /// mount namespace where /var/lib/cni is the node's.
    fn add(&self, tier: &Tier<'_>, conf: &Value) -> Result<()> {
        let pod = tier.api.get_pod(NS, &self.pod)?.context("ghost pod")?;
        let uid = pod["metadata"]["uid"].as_str().context("uid")?;
        let steps = NodeMounts::default()
            .redirect("/var/lib/cni", tier.node.host_path("/var/lib/cni"))
            .prepare()?;
        let plugin = conf["type"].as_str().context("the plugin's type")?;
        let mut cmd = Command::new(tier.node.bin_dir().join(plugin));
        cmd.env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", &self.id)
            .env("CNI_NETNS", format!("/run/netns/{}", self.netns))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", tier.node.bin_dir())
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={uid}",
                    self.pod, self.id
                ),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        steps.install(&mut cmd);
        let mut child = cmd.spawn().context("run plexus ADD")?;
        std::io::Write::write_all(
            child.stdin.as_mut().context("stdin")?,
            conf.to_string().as_bytes(),
        )?;
        drop(child.stdin.take());
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "plexus ADD for the ghost: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// The pod object and the netns go (the attachments are the GC's to release).
    fn remove(&self, tier: &Tier<'_>) {
        let _ = tier.cp.kubectl(&[
            "-n",
            NS,
            "delete",
            "pod",
            &self.pod,
            "--grace-period=0",
            "--force",
            "--ignore-not-found",
        ]);
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// Lines of `path` containing `s`.
fn count_in(path: &Path, s: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(s))
        .count()
}

/// Write `text` to `path` by rename (the runtime's watcher sees a whole file).
fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp-crio-test");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
