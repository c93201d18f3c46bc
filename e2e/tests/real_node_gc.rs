//! Node tier, the node reconciler (issue 36 item 5): containerd never sends CNI GC, so state
//! of a sandbox the runtime lost without a DEL stays unless plexus reclaims it itself. A real
//! kubelet and containerd (the node rig), flannel as the cluster network, plexus thin installed
//! by `deploy/install.sh` with the thin DaemonSet's command (`reconcileGraceSeconds` 10,
//! `runtimeEndpoint` the node's containerd socket). Thin mode's reconciler, on containerd 2.3:
//! the thin DaemonSet's `reconcile` container, its command line as the manifest has it with
//! the container's paths mapped to the node's dirs and `--every 60` made 5 (the manifest's
//! installer has `PLEXUS_RECONCILE_INTERVAL=0`, so its pass does not run); on containerd 1.6:
//! install.sh's own watch-loop pass every 5 s (install.sh run directly on a host).
//!
//! Cases:
//! - a leaked sandbox, thin and daemon mode (fails without the reconciler: nothing else removes
//!   that state): plexus ADDed for a container ID the runtime never had (as a runtime that lost
//!   the sandbox leaves it: plan, flannel's and a NAD's host-local leases, interfaces in its
//!   netns) plus a plexus device-info file for it; all of it is reclaimed while two live pods
//!   keep their plans and leases and ping each other on eth0 and net1;
//! - containerd SIGKILLed mid-`RunPodSandbox`: a NAD's delegate (a script in the node's bin dir)
//!   blocks the first ADD, containerd is killed with SIGKILL and started again, the ADD it
//!   never hears of finishes, the kubelet's next sandbox runs the pod. Measured: containerd
//!   2.3.4 and 1.6.20 both list the orphan (not ready) after the restart and DEL it themselves
//!   (the DEL waits for plexus' container lock, held by the ADD), so nothing is left and this
//!   case passes with or without the reconciler; were the orphan not listed, it would require
//!   the reconciler to reclaim it.
//!
//! Figures printed: what was left before, how long the reclaim took, what is left after.
//! Skipped (and passing) without `PLEXUS_K8S_BIN`; `PLEXUS_K8S_REQUIRE=1` makes that a failure.

#[allow(dead_code)]
#[path = "real_node/api.rs"]
mod api;
mod common;
#[path = "real_node_gc/diagnostics.rs"]
mod diagnostics;
#[allow(dead_code)]
#[path = "real_node/pods.rs"]
mod pods;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::node::{use_containerd, wait_for};
use plexus_e2e::realk8s::node_rig::{
    DaemonOpts, InstallSh, OverlayNode, PlexusDaemon, DAEMON_OVERLAY, THIN_OVERLAY,
};
use plexus_e2e::realk8s::overlay::Kind;
use plexus_e2e::realk8s::rig::{plexus_token, PlexusToken, Rig};
use plexus_e2e::realk8s::runtimes::Containerd;
use plexus_e2e::realk8s::{
    control_plane_or_skip, free_port, setup_or_report, ControlPlane, Proc, Suite,
};
use serde_json::{json, Value};

use api::Api;

const NS: &str = "gc";
/// The installer's reconciler interval and plexus' grace period in this tier.
const INTERVAL_S: u64 = 5;
const GRACE_S: u64 = 10;
/// How long a reclaim may take: grace + two intervals + a pass, with room for a loaded host.
const RECLAIM_WITHIN: Duration = Duration::from_secs(90);

#[test]
fn real_node_gc() {
    let Some(cp) = control_plane_or_skip() else {
        return;
    };
    let mut suite = Suite::new("real_node_gc");
    let rig = Rig::builder().namespaces(&[NS]).build(&cp);
    let Some(_rig) = setup_or_report("real_node_gc", &cp, rig) else {
        panic!("real_node_gc: setup failed");
    };
    for (line, octet) in [(Containerd::V2, 250), (Containerd::V1_6, 251)] {
        use_containerd(line);
        let Some(mut tier) = setup_or_report("real_node_gc", &cp, Tier::start(&cp, line, octet))
        else {
            use_containerd(Containerd::V2);
            panic!("real_node_gc: node setup failed");
        };
        let rt = tier.runtime();
        let name = |c: &str| format!("{rt}/{c}");
        let installed = tier.install();
        let ok = installed.is_ok();
        suite.case(&name("thin_installed_with_the_reconciler"), || installed);
        if ok {
            suite.case(
                &name("leaked_sandbox_reclaimed_live_pods_keep_their_networks"),
                || tier.leaked_sandbox(),
            );
            suite.case(
                &name("sigkilled_mid_run_pod_sandbox_no_orphan_left"),
                || tier.killed_mid_add(),
            );
            if line == Containerd::V2 {
                suite.case(
                    &name("daemon_mode_daemon_reclaims_a_leaked_sandbox"),
                    || {
                        tier.switch_to_daemon()?;
                        tier.leaked_sandbox()
                    },
                );
            }
        }
        tier.stop();
    }
    use_containerd(Containerd::V2);
    let failed = suite.any_failed();
    let _ = suite.finish();
    assert!(!failed, "real_node_gc: a case failed (see above)");
}

/// A short unique link name (at most 15 bytes).
fn link(suffix: &str) -> String {
    format!("pxg{}{suffix}", std::process::id() % 100_000)
}

/// A container ID no runtime made: 64 hex digits from the pid, the time and `salt`.
fn fake_id(salt: u64) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!(
        "{:016x}{:016x}{:016x}{:016x}",
        0xfeed_0000_0000_0000u64 | u64::from(std::process::id()),
        t,
        salt,
        t ^ salt.rotate_left(17)
    )
}

struct Tier<'a> {
    cp: &'a ControlPlane,
    line: Containerd,
    on: OverlayNode<'a>,
    api: Api,
    bridges: Vec<String>,
    installer: Option<Proc>,
    /// The thin DaemonSet's `reconcile` container, as a process of the node.
    reconciler: Option<Proc>,
    daemon: Option<PlexusDaemon>,
    token: String,
    netns: Vec<String>,
}

impl<'a> Tier<'a> {
    fn start(cp: &'a ControlPlane, line: Containerd, octet: u8) -> Result<Tier<'a>> {
        let t = if line == Containerd::V1_6 { "o" } else { "n" };
        let bridges = vec![link(&format!("{t}a")), link(&format!("{t}b"))];
        let on = OverlayNode::start(
            cp,
            Kind::Flannel,
            octet,
            &link(&format!("{t}f")),
            &format!("plexus-gcnode-{t}"),
            &bridges,
        )?;
        Ok(Tier {
            cp,
            line,
            on,
            api: Api::new(&cp.admin_kubeconfig())?,
            bridges,
            installer: None,
            reconciler: None,
            daemon: None,
            token: String::new(),
            netns: Vec::new(),
        })
    }

    fn runtime(&self) -> &'static str {
        if self.line == Containerd::V1_6 {
            "containerd-1.6"
        } else {
            "containerd-2.3"
        }
    }

    /// Delete every pod of the tier while its kubelet still runs (a pod bound to a stopped node
    /// would stay Terminating and block the next tier's probe).
    fn delete_all_pods(&self) {
        for batch in ["gc", "probe"] {
            for p in self.api.list_pods(NS, batch).unwrap_or_default() {
                if let Some(n) = p["metadata"]["name"].as_str() {
                    let _ = self.api.delete_pod(NS, n);
                }
            }
        }
        let gone = wait_for("the tier's pods gone", Duration::from_secs(60), || {
            Ok(["gc", "probe"]
                .iter()
                .all(|b| self.api.list_pods(NS, b).is_ok_and(|v| v.is_empty())))
        });
        if let Err(e) = gone {
            eprintln!("real_node_gc: {e:#}");
        }
    }

    fn stop(&mut self) {
        self.delete_all_pods();
        if let Some(mut i) = self.installer.take() {
            i.stop(Duration::from_secs(10));
        }
        if let Some(mut r) = self.reconciler.take() {
            r.stop(Duration::from_secs(10));
        }
        if let Some(d) = self.daemon.take() {
            d.stop();
        }
        for n in &self.netns {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
        self.on.stop();
    }

    /// The config plexus is called with, as the runtime passes it: the plexus plugin of
    /// install.sh's conflist with the list's name and version (or its single-plugin .conf).
    fn plugin_conf(&self) -> Result<Vec<u8>> {
        let dir = self.on.node.conf_dir();
        if let Ok(b) = std::fs::read(dir.join("00-plexus.conf")) {
            return Ok(b);
        }
        let list: Value = serde_json::from_slice(&std::fs::read(dir.join("00-plexus.conflist"))?)?;
        let mut plugin = list["plugins"][0].clone();
        plugin["name"] = list["name"].clone();
        plugin["cniVersion"] = list["cniVersion"].clone();
        Ok(serde_json::to_vec(&plugin)?)
    }

    fn devinfo_dir(&self) -> PathBuf {
        self.on.node.path("devinfo")
    }

    fn block_dir(&self) -> PathBuf {
        self.on.node.path("block")
    }

    /// RBAC, the thin DaemonSet's installer (with `plexus-daemon` in its image dir, as the
    /// image has it), two NADs: `br-a` (bridge + host-local) and `slow` (its ADD blocks once).
    fn install(&mut self) -> Result<()> {
        self.cp.apply_kustomization(THIN_OVERLAY)?;
        self.token = plexus_token(self.cp, &PlexusToken::Unbound)?;
        self.run_installer("kube-plexus-ds", false)?;
        let node = &self.on.node;
        // The blocking delegate: the first ADD waits for `<block>/release`, then every call is
        // the bridge plugin's (same stdin).
        let block = self.block_dir();
        std::fs::create_dir_all(&block)?;
        let script = node.bin_dir().join("pxgc-block");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nd={d}\nif [ \"$CNI_COMMAND\" = ADD ] && [ ! -e \"$d/first\" ]; then\n\
                 \techo \"$CNI_CONTAINERID\" > \"$d/first.tmp\" && mv \"$d/first.tmp\" \"$d/first\"\n\
                 \ti=0\n\twhile [ ! -e \"$d/release\" ] && [ $i -lt 1800 ]; do sleep 0.1; i=$((i+1)); done\n\
                 fi\nexec {bridge}\n",
                d = block.display(),
                bridge = Path::new(plexus_e2e::realk8s::node::SYSTEM_CNI_BIN)
                    .join("bridge")
                    .display()
            ),
        )?;
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let ipam = |subnet: &str| json!({"type":"host-local","dataDir":node.ipam_dir(),"ranges":[[{"subnet":subnet}]]});
        for (i, (name, ty)) in [("br-a", "bridge"), ("slow", "pxgc-block")]
            .into_iter()
            .enumerate()
        {
            let cfg = json!({"cniVersion":"1.0.0","name":name,"type":ty,
                "bridge":self.bridges[i],"ipam":ipam(&format!("10.238.{}.0/24", i + 1))});
            let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":{"name":name,"namespace":NS},"spec":{"config":cfg.to_string()}});
            self.cp.apply(&nad.to_string())?;
        }
        pods::wait_until_plexus_is_in_the_path(&self.api, NS, node.name())?;
        Ok(())
    }

    /// Whether thin mode's reconciler is the DaemonSet's `reconcile` container (containerd 2.3)
    /// rather than install.sh's own pass (1.6, install.sh run on a host).
    fn reconcile_container(&self) -> bool {
        self.line == Containerd::V2
    }

    /// The log of whatever runs the reconciler now.
    fn reconciler_log(&self) -> &'static str {
        if self.daemon.is_some() {
            "daemon.log"
        } else if self.reconciler.is_some() {
            "reconcile.log"
        } else {
            "installer.log"
        }
    }

    /// install.sh as `daemonset`'s install container runs it (SIGTERM to the one running), with
    /// this tier's config: grace 10 s, this node's containerd socket. Thin mode with the
    /// `reconcile` container: the manifest's installer env must turn its own pass off, and the
    /// container's command runs once the config is published; otherwise install.sh's pass runs
    /// every 5 s.
    fn run_installer(&mut self, daemonset: &str, daemon: bool) -> Result<()> {
        if let Some(mut old) = self.installer.take() {
            old.stop(Duration::from_secs(10));
        }
        let cp = self.cp;
        let container = !daemon && self.reconcile_container();
        let node = &self.on.node;
        let mut install = InstallSh::from_daemonset(cp, daemonset, "install-plexus")?;
        if container {
            let v = install
                .env
                .iter()
                .rfind(|(k, _)| k == "PLEXUS_RECONCILE_INTERVAL")
                .map(|(_, v)| v.as_str());
            ensure!(
                v == Some("0"),
                "{daemonset}'s installer does not turn its reconciler pass off (PLEXUS_RECONCILE_INTERVAL {v:?})"
            );
        } else {
            install
                .env
                .push(("PLEXUS_RECONCILE_INTERVAL".into(), INTERVAL_S.to_string()));
        }
        let mut cfg = install.extra.clone();
        if daemon {
            cfg["daemonSocket"] = json!(self.socket());
            // `plexus check-config` refuses a conflist whose plugin is `plexus-shim` (it finds
            // no plexus plugin in the list), so install.sh keeps the thin config; `plexus` with
            // `daemonSocket` is the same shim.
            cfg["type"] = json!("plexus");
        }
        cfg["cniDir"] = json!(node.plexus_dir());
        cfg["nadPolicy"] = nad_policy_allowing(&[&node.ipam_dir()]);
        cfg["deviceInfoDir"] = json!(self.devinfo_dir());
        cfg["runtimeEndpoint"] = json!(node.path("containerd/containerd.sock"));
        cfg["reconcileGraceSeconds"] = json!(GRACE_S);
        cfg["logLevel"] = json!("info");
        if container && self.reconciler.is_none() {
            // Started with the installer, as the pod's containers are: it waits for the config.
            let (args, env) = reconcile_command(cp, daemonset, node)?;
            println!("    reconcile container's command on the node: plexus-daemon {args:?}");
            let log = node.path("reconcile.log");
            self.reconciler = Some(Proc::spawn_with(
                "reconcile",
                &common::bin("plexus-daemon"),
                &args,
                &log,
                |cmd| {
                    cmd.envs(env);
                },
            )?);
            wait_for(
                "the reconcile loop's start",
                Duration::from_secs(20),
                || {
                    Ok(std::fs::read_to_string(&log)
                        .is_ok_and(|l| l.contains("node reconciler loop started")))
                },
            )
            .with_context(|| plexus_e2e::realk8s::tail(&log, 20))?;
        }
        let ready = InstallSh::ready_file(node);
        let _ = std::fs::remove_file(&ready);
        let mut binaries = vec![
            ("plexus", common::bin("plexus")),
            ("sriov", common::bin("sriov")),
            ("plexus-daemon", common::bin("plexus-daemon")),
        ];
        if daemon {
            binaries.push(("plexus-shim", common::bin("plexus-shim")));
        }
        self.installer = Some(install.spawn(cp, node, &self.token, &binaries, &cfg)?);
        wait_for(
            "the installer's ready file",
            Duration::from_secs(120),
            || Ok(ready.exists()),
        )
        .with_context(|| plexus_e2e::realk8s::tail(&node.path("installer.log"), 20))?;
        Ok(())
    }

    /// SIGTERM to the `reconcile` container's process (the thin DaemonSet replaced): it must
    /// end at once (not at the SIGKILL 10 s later) and say so.
    fn stop_reconcile_container(&mut self) -> Result<()> {
        let Some(mut r) = self.reconciler.take() else {
            return Ok(());
        };
        let t0 = Instant::now();
        r.stop(Duration::from_secs(10));
        let took = t0.elapsed();
        let log = std::fs::read_to_string(self.on.node.path("reconcile.log"))?;
        println!(
            "    reconcile loop ended {:.2} s after SIGTERM",
            took.as_secs_f64()
        );
        ensure!(
            took < Duration::from_secs(3) && log.contains("node reconciler loop stopped (signal)"),
            "the reconcile loop did not end on SIGTERM ({:.1} s)",
            took.as_secs_f64()
        );
        Ok(())
    }

    fn socket(&self) -> PathBuf {
        self.on.node.path("run/plexus.sock")
    }

    /// Daemon mode: plexus-daemon as the node's process (its reconciler every 60 s, the
    /// default), then the daemon DaemonSet's installer; a probe pod served through it.
    fn switch_to_daemon(&mut self) -> Result<()> {
        // The daemon DaemonSet replaces the thin one (deploy/README.md), its reconcile container too.
        self.stop_reconcile_container()?;
        let node = &self.on.node;
        self.cp.apply_kustomization(DAEMON_OVERLAY)?;
        std::fs::create_dir_all(node.path("run"))?;
        let kubeconfig = node.path("daemon.kubeconfig");
        self.cp.write_kubeconfig(&kubeconfig, &self.token)?;
        self.daemon = Some(PlexusDaemon::start(&DaemonOpts {
            bin: &common::bin("plexus-daemon"),
            socket: &self.socket(),
            kubeconfig: &kubeconfig,
            node: node.name(),
            dir: node.dir(),
            metrics_port: free_port()?,
        })?);
        self.run_installer("kube-plexus-daemon", true)?;
        pods::wait_until_plexus_is_in_the_path(&self.api, NS, self.on.node.name())?;
        let conf: Value = serde_json::from_slice(&std::fs::read(
            self.on.node.conf_dir().join("00-plexus.conflist"),
        )?)?;
        ensure!(
            conf["plugins"][0]["daemonSocket"] == json!(self.socket()),
            "not daemon mode: {conf}"
        );
        Ok(())
    }

    /// Pods `names` with `networks`, Running; their (sandbox ID, netns).
    fn run_pods(&self, names: &[&str], networks: &str) -> Result<Vec<(String, String)>> {
        let node = &self.on.node;
        let manifests: Vec<Value> = names
            .iter()
            .map(|n| pods::manifest(NS, n, node.name(), "gc", Some(&json!(networks))))
            .collect();
        pods::create_and_wait(&self.api, &manifests, Duration::from_secs(120))?;
        names
            .iter()
            .map(|n| {
                let p = self.api.get_pod(NS, n)?.context("pod")?;
                node.pod_sandbox(p["metadata"]["uid"].as_str().context("uid")?)
            })
            .collect()
    }

    /// What is left of container `id` on the node: its plans, leases, device-info files.
    fn state_of(&self, id: &str) -> Vec<String> {
        let node = &self.on.node;
        let mut v: Vec<String> = common::files_under(&node.plexus_dir().join("plans"))
            .into_iter()
            .filter(|f| f.contains(id))
            .map(|f| format!("plan {f}"))
            .collect();
        for f in common::files_under(&node.ipam_dir()) {
            let p = node.ipam_dir().join(&f);
            if std::fs::read_to_string(&p).is_ok_and(|s| s.starts_with(id)) {
                v.push(format!("lease {f}"));
            }
        }
        v.extend(
            common::files_under(&self.devinfo_dir())
                .into_iter()
                .filter(|f| f.contains(id))
                .map(|f| format!("device-info {f}")),
        );
        v
    }

    /// Wait until nothing of `id` is left; the time it took.
    fn wait_reclaimed(&self, id: &str) -> Result<Duration> {
        let log_file = self.reconciler_log();
        let within = if self.daemon.is_some() {
            // The daemon's first pass 10 s after its start, then one per minute.
            Duration::from_secs(150)
        } else {
            RECLAIM_WITHIN
        };
        let t0 = Instant::now();
        wait_for("the reconciler to reclaim the sandbox", within, || {
            Ok(self.state_of(id).is_empty())
        })
        .with_context(|| {
            format!(
                "left of {id}: {:?}\n{log_file}:\n{}",
                self.state_of(id),
                plexus_e2e::realk8s::tail(&self.on.node.path(log_file), 20)
            )
        })?;
        let log = std::fs::read_to_string(self.on.node.path(log_file))?;
        ensure!(
            log.lines().any(
                |l| l.contains("reclaimed a sandbox the runtime no longer has") && l.contains(id)
            ),
            "the reconciler did not log the reclaim of {id} in {log_file}"
        );
        if log_file == "reconcile.log" {
            // The installer's own pass is off in the DaemonSet: the container did it.
            let installer = std::fs::read_to_string(self.on.node.path("installer.log"))?;
            ensure!(
                !installer.contains("reclaimed a sandbox"),
                "the installer ran a reconciler pass although its DaemonSet turns it off"
            );
        }
        Ok(t0.elapsed())
    }

    /// Live pods keep their plans and leases, and ping each other on eth0 and net1.
    fn live_pods_intact(&self, live: &[(String, String)]) -> Result<()> {
        for (id, _) in live {
            let s = self.state_of(id);
            ensure!(
                s.iter().any(|x| x.starts_with("plan")) && s.iter().any(|x| x.starts_with("lease")),
                "live sandbox {id} lost its state: {s:?}"
            );
        }
        let (a, b) = (&live[0].1, &live[1].1);
        for ifname in ["eth0", "net1"] {
            let to = pods::address(b, ifname)?;
            ensure!(
                pods::pings(Some(a), &to),
                "{a} does not reach {to} on {ifname}"
            );
        }
        Ok(())
    }

    fn leaked_sandbox(&mut self) -> Result<()> {
        let node = &self.on.node;
        let live = self.run_pods(&["live-a", "live-b"], "br-a")?;
        // The leak: plexus ADDed, as containerd would call it, for a container ID containerd
        // never had, in a netns of the test's own, for pod `leaky` (its NADs); then `leaky`
        // is deleted (its real sandbox DELed). Plus a plexus device-info file for that ID.
        self.run_pods(&["leaky"], "br-a")?;
        let leaky = self.api.get_pod(NS, "leaky")?.context("leaky")?;
        let uid = leaky["metadata"]["uid"]
            .as_str()
            .context("uid")?
            .to_string();
        let id = fake_id(1);
        let netns = format!(
            "pxgc{}{}{}",
            &self.runtime()[11..12],
            self.netns.len(),
            std::process::id()
        );
        let st = Command::new("ip").args(["netns", "add", &netns]).status()?;
        ensure!(st.success(), "ip netns add {netns}");
        self.netns.push(netns.clone());
        let netns_path = format!("/run/netns/{netns}");
        let out = self.cni_add(&id, &netns_path, "leaky", &uid)?;
        ensure!(out.0, "hand ADD failed: {}", out.1);
        let devinfo = self
            .devinfo_dir()
            .join("cni")
            .join(format!("{NS}-br-a-{id}_net1"));
        std::fs::create_dir_all(devinfo.parent().context("dir")?)?;
        std::fs::write(
            &devinfo,
            br#"{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:00:00.0"}}"#,
        )?;
        pods::delete_and_wait(
            &self.api,
            NS,
            "gc",
            &["leaky".into()],
            &[node.pod_sandbox(&uid).map(|s| s.1).unwrap_or_default()],
            Duration::from_secs(60),
        )?;
        let before = self.state_of(&id);
        let ifaces_before = pods::interfaces(&netns_path)?;
        println!(
            "    left by the leaked sandbox {id}: {before:?}; interfaces in its netns: {:?}",
            ifaces_before.keys().collect::<Vec<_>>()
        );
        ensure!(
            before.iter().filter(|x| x.starts_with("lease")).count() >= 2
                && before.iter().any(|x| x.starts_with("plan"))
                && before.iter().any(|x| x.starts_with("device-info")),
            "the leak was not made: {before:?}"
        );
        self.diagnose(&live, &id)?;
        let took = self.wait_reclaimed(&id)?;
        let ifaces_after = pods::interfaces(&netns_path)?;
        println!(
            "    reclaimed in {:.1} s after the pod's deletion by the {} (grace {GRACE_S} s, interval {} s); left after: {:?}; interfaces in its netns: {:?}",
            took.as_secs_f64(),
            match self.reconciler_log() {
                "daemon.log" => "daemon",
                "reconcile.log" => "DaemonSet's reconcile container",
                _ => "installer's pass",
            },
            if self.daemon.is_some() { 60 } else { INTERVAL_S },
            self.state_of(&id),
            ifaces_after.keys().collect::<Vec<_>>()
        );
        ensure!(
            !ifaces_after.contains_key("eth0") && !ifaces_after.contains_key("net1"),
            "the leaked sandbox's interfaces are still in its netns: {ifaces_after:?}"
        );
        self.live_pods_intact(&live)?;
        self.delete_pods(&["live-a", "live-b"], &live)
    }

    fn killed_mid_add(&mut self) -> Result<()> {
        let node = &self.on.node;
        let first = self.block_dir().join("first");
        let release = self.block_dir().join("release");
        let _ = std::fs::remove_file(&first);
        let _ = std::fs::remove_file(&release);
        let live = self.run_pods(&["live-c", "live-d"], "br-a")?;
        let victim = pods::manifest(NS, "victim", node.name(), "gc", Some(&json!("slow")));
        self.api.create_pod(&victim)?;
        wait_for("the blocked ADD", Duration::from_secs(60), || {
            Ok(first.exists())
        })?;
        let orphan = std::fs::read_to_string(&first)?.trim().to_string();
        let pid = containerd_pid(&node.path("containerd/config.toml"))?;
        let st = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()?;
        ensure!(st.success(), "kill -9 {pid}");
        println!("    containerd (pid {pid}) SIGKILLed while sandbox {orphan}'s ADD blocked");
        std::fs::write(&release, b"")?;
        let released = Instant::now();
        node.restart_containerd()?;
        wait_for("victim Running", Duration::from_secs(180), || {
            Ok(self
                .api
                .get_pod(NS, "victim")?
                .is_some_and(|p| pods::running(&p)))
        })?;
        let p = self.api.get_pod(NS, "victim")?.context("victim")?;
        let (sandbox, netns) = node.pod_sandbox(p["metadata"]["uid"].as_str().context("uid")?)?;
        ensure!(
            sandbox != orphan,
            "the runtime kept the killed sandbox {orphan}"
        );
        let listed = node.cri().sandboxes(None)?;
        let still_listed = listed.iter().any(|s| s.id == orphan);
        // The orphan's ADD finishes once released (the plan is in place before its delegates).
        wait_for(
            "the orphaned ADD to finish",
            Duration::from_secs(60),
            || Ok(plexus_log(node).contains(&format!("ADD done container={orphan}"))),
        )?;
        let before = self.state_of(&orphan);
        println!(
            "    after the restart: the runtime lists the orphan: {still_listed}; left by it: {before:?}"
        );
        if !still_listed {
            // A runtime that forgot the sandbox never DELs it: the reconciler must.
            ensure!(
                before.iter().any(|x| x.starts_with("plan"))
                    && before.iter().any(|x| x.starts_with("lease")),
                "the orphan left no plan and lease to reclaim: {before:?}"
            );
            self.wait_reclaimed(&orphan)?;
            println!(
                "    orphan reclaimed {:.1} s after its ADD was released (grace {GRACE_S} s, interval {INTERVAL_S} s); left after: {:?}; DELs from the runtime: {}",
                released.elapsed().as_secs_f64(),
                self.state_of(&orphan),
                runtime_dels(node, &orphan)
            );
        } else {
            wait_for(
                "the runtime's DEL of the orphan",
                Duration::from_secs(60),
                || Ok(self.state_of(&orphan).is_empty()),
            )
            .with_context(|| format!("left of {orphan}: {:?}", self.state_of(&orphan)))?;
            let log = std::fs::read_to_string(node.path(self.reconciler_log()))?;
            ensure!(
                runtime_dels(node, &orphan) > 0 && !log.contains(&orphan),
                "the orphan was not DELed by the runtime (runtime DELs {}, reconciler log mentions it: {})",
                runtime_dels(node, &orphan),
                log.contains(&orphan)
            );
            println!(
                "    {} listed the orphan (not ready) after its restart and DELed it itself ({} DEL calls, {:.1} s after the release); left after: {:?}",
                self.runtime(),
                runtime_dels(node, &orphan),
                released.elapsed().as_secs_f64(),
                self.state_of(&orphan)
            );
        }
        let s = self.state_of(&sandbox);
        ensure!(
            s.iter().filter(|x| x.starts_with("lease")).count() >= 2,
            "the victim's live sandbox lost its state: {s:?}"
        );
        pods::address(&netns, "net1")?;
        let to = pods::address(&netns, "eth0")?;
        ensure!(
            pods::pings(Some(&live[0].1), &to),
            "live-c does not reach the victim on eth0 ({to})"
        );
        self.live_pods_intact(&live)?;
        self.delete_pods(
            &["live-c", "live-d", "victim"],
            &[live[0].clone(), live[1].clone(), (sandbox, netns)],
        )
    }

    fn delete_pods(&self, names: &[&str], sandboxes: &[(String, String)]) -> Result<()> {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let netns: Vec<String> = sandboxes.iter().map(|s| s.1.clone()).collect();
        pods::delete_and_wait(&self.api, NS, "gc", &names, &netns, Duration::from_secs(60))?;
        Ok(())
    }

    /// Run the installed plexus as containerd would for an ADD: (success, stdout + stderr).
    fn cni_add(&self, id: &str, netns: &str, pod: &str, uid: &str) -> Result<(bool, String)> {
        let node = &self.on.node;
        let stdin = self.plugin_conf()?;
        let mut child = Command::new(node.bin_dir().join("plexus"))
            .env_clear()
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", node.bin_dir())
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID={uid}"),
            )
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child.stdin.take().context("stdin")?.write_all(&stdin)?;
        let out = child.wait_with_output()?;
        Ok((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    }
}

/// The node's plexus log (the config's `logFile`).
fn plexus_log(node: &plexus_e2e::realk8s::node::Node<'_>) -> String {
    std::fs::read_to_string(node.path("plexus.log")).unwrap_or_default()
}

/// DELs of container `id` plexus served (the runtime's; the reconciler runs no CNI DEL).
fn runtime_dels(node: &plexus_e2e::realk8s::node::Node<'_>, id: &str) -> usize {
    plexus_log(node)
        .lines()
        .filter(|l| l.contains(&format!("DEL done container={id}")))
        .count()
}

/// The pid of the containerd started with `--config <config>` (this node's, no other).
fn containerd_pid(config: &Path) -> Result<u32> {
    let want = config.display().to_string();
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_containerd = args
            .first()
            .is_some_and(|a| Path::new(a).file_name().is_some_and(|n| n == "containerd"));
        if is_containerd && args.windows(2).any(|w| w[0] == "--config" && w[1] == want) {
            return Ok(pid);
        }
    }
    bail!("no containerd runs with --config {want}")
}

/// A container's env: (name, value).
type ContainerEnv = Vec<(String, String)>;

/// The thin DaemonSet's `reconcile` container's command line as `daemonset` has it on the API
/// server, for a process of `node`: the image's `plexus-daemon` is the test build's, every path
/// argument under one of the container's mounts becomes that volume's host path as the node
/// has it (`/opt/cni/bin`, `/etc/cni/net.d`: the node's dirs; `/`: the host's root, so
/// `--host-root` is no chroot), and `--every` becomes [`INTERVAL_S`]. An error when the
/// container lacks what a pass needs (privileged; the runtime's socket dir /run, /var/lib/cni,
/// the plugin and config dirs, the host root). With it: the container's env (plain values).
fn reconcile_command(
    cp: &ControlPlane,
    daemonset: &str,
    node: &plexus_e2e::realk8s::node::Node<'_>,
) -> Result<(Vec<String>, ContainerEnv)> {
    let ds: Value = serde_json::from_str(&cp.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "daemonset",
        daemonset,
        "-o",
        "json",
    ])?)?;
    let spec = &ds["spec"]["template"]["spec"];
    let c = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "reconcile")
        .with_context(|| format!("{daemonset} has no reconcile container"))?;
    ensure!(
        c["securityContext"]["privileged"] == json!(true),
        "the reconcile container is not privileged: {}",
        c["securityContext"]
    );
    let host_of = |volume: &str| -> Option<String> {
        spec["volumes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == volume)?["hostPath"]["path"]
            .as_str()
            .map(str::to_string)
    };
    // mountPath -> host path.
    let mut mounts: Vec<(String, String)> = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let (Some(at), Some(vol)) = (m["mountPath"].as_str(), m["name"].as_str()) else {
            continue;
        };
        let host = host_of(vol).with_context(|| format!("mount {at}: not a hostPath volume"))?;
        mounts.push((at.to_string(), host));
    }
    for (at, host) in [
        ("/run", "/run"),
        ("/var/lib/cni", "/var/lib/cni"),
        ("/opt/cni/bin", "/opt/cni/bin"),
        ("/etc/cni/net.d", "/etc/cni/net.d"),
        ("/hostroot", "/"),
    ] {
        ensure!(
            mounts.iter().any(|(a, h)| a == at && h == host),
            "the reconcile container does not mount the host's {host} at {at}: {mounts:?}"
        );
    }
    let on_node = |host: &str| -> Result<PathBuf> {
        Ok(match host {
            "/opt/cni/bin" => node.bin_dir(),
            "/etc/cni/net.d" => node.conf_dir(),
            "/" => PathBuf::from("/"),
            other => bail!("no node dir for the host's {other}"),
        })
    };
    let command: Vec<String> = c["command"]
        .as_array()
        .context("the reconcile container has no command")?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    ensure!(
        command.first().map(String::as_str) == Some("/usr/src/plexus/bin/plexus-daemon")
            && command.get(1).map(String::as_str) == Some("reconcile"),
        "{command:?}"
    );
    let mut args = Vec::new();
    let mut every = false;
    for a in &command[1..] {
        if std::mem::replace(&mut every, a == "--every") {
            args.push(INTERVAL_S.to_string());
            continue;
        }
        let under = mounts
            .iter()
            .filter_map(|(at, host)| {
                let rest = Path::new(a).strip_prefix(at).ok()?;
                Some((at.len(), host, rest.to_path_buf()))
            })
            .max_by_key(|(n, _, _)| *n);
        match under {
            Some((_, host, rest)) => args.push(on_node(host)?.join(rest).display().to_string()),
            None => args.push(a.clone()),
        }
    }
    ensure!(
        command.iter().any(|a| a == "--every"),
        "the reconcile container runs one pass, not a loop: {command:?}"
    );
    let env = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect();
    Ok((args, env))
}
