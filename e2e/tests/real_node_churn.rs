//! Node tier, day-2 operations under churn: a real kubelet and containerd on a real
//! kube-apiserver, flannel as the cluster network (calico with the compact list), plexus
//! installed by `deploy/install.sh` with the command and environment of the DaemonSets in
//! `deploy/` (thin: `kube-plexus-ds`; daemon: `kube-plexus-daemon`, with `plexus-daemon` as a
//! process of the node). While each operation runs, a churn (`real_node/churn.rs`) creates a pod
//! every 0.5 s (none, one and two extra networks in turn; at most 10 live, the oldest deleted)
//! and checks each one once Running: exactly eth0 plus its networks in its netns, and the same
//! in its network-status. A pod Running without its networks fails the case outright; so does a
//! pod never Running, and anything left on the node once the churn's pods are gone (netns,
//! veths, leases, plans, result caches, the overlay's per-pod state).
//!
//! Operations, in order (compact list: the ones marked *): the installer re-run with changed
//! binaries and a changed config while the kubelet execs them (a rolling update of the
//! DaemonSet); * thin → daemon (the daemon DaemonSet's installer replaces the thin one's, pods
//! added under thin DELed through the daemon); * the daemon SIGKILLed and started again; the
//! daemon DaemonSet's pod replaced (SIGTERM to both containers, a new pod 3 s later); * the
//! kubelet restarted; * containerd restarted (SIGTERM to containerd alone, as systemd's
//! `KillMode=process` does); * daemon → thin (pods added through the daemon DELed by thin plexus);
//! last, the uninstall DaemonSet (`kubectl apply -k deploy/uninstall`) applied: pods created
//! before it keep their networks and are DELed through plexus, pods created during it get the
//! cluster network alone with a `NetworksNotAttached` event, then without plexus at all; nothing
//! of plexus is left on the node, and after `kubectl delete -k` of deploy/uninstall and both
//! overlays none of their objects is left in the API. The table at the end gives, per operation, the pods created, Running correctly, with
//! the cluster network only, on the wrong network, failed, the kubelet's sandbox retries and the
//! median create → Running.
//!
//! Skipped (and passing) without `PLEXUS_K8S_BIN`; `PLEXUS_K8S_REQUIRE=1` makes that a failure.

#[allow(dead_code)]
#[path = "real_node/api.rs"]
mod api;
#[path = "real_node/churn.rs"]
mod churn;
mod common;
#[allow(dead_code)]
#[path = "real_node/leftovers.rs"]
mod leftovers;
#[path = "real_node/multus_thick.rs"]
mod multus_thick;
#[allow(dead_code)]
#[path = "real_node/pods.rs"]
mod pods;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::node::{wait_for, Node};
use plexus_e2e::realk8s::node_rig::{
    daemon_run_dir, selected_overlays, stop_tier, DaemonOpts, InstallSh, OverlayNode, PlexusDaemon,
    DAEMON_OVERLAY, THIN_OVERLAY,
};
use plexus_e2e::realk8s::overlay::{Kind, Overlay};
use plexus_e2e::realk8s::rig::{plexus_token, PlexusToken, Rig};
use plexus_e2e::realk8s::{
    control_plane_or_skip, free_port, setup_or_report, ControlPlane, Proc, Suite,
};
use serde_json::{json, Value};

use api::Api;
use churn::{Churn, Form, Outcome, Spec, Verdict};
use leftovers::{wait_clean, Seen};
use multus_thick::MultusThick;
use pods::{median, wait_until_plexus_is_in_the_path};

const NS: &str = "app";

/// How long an installer may take to write its ready file.
const INSTALL_READY: Duration = Duration::from_secs(120);
/// The same for `--uninstall`, which waits for the pods with secondary networks to be deleted.
const UNINSTALL_READY: Duration = Duration::from_secs(300);

/// Churn before and after each operation.
const BEFORE: Duration = Duration::from_secs(8);
const AFTER: Duration = Duration::from_secs(12);

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let mut suite = Suite::new("real_node_churn");
    let rig = Rig::builder().namespaces(&[NS]).build(&cp);
    let Some(_rig) = setup_or_report("real_node_churn", &cp, rig) else {
        return ExitCode::FAILURE;
    };
    for (kind, octet, full) in
        selected_overlays(&[(Kind::Flannel, 242, true), (Kind::Calico, 247, false)])
    {
        let Some(mut tier) = setup_or_report("real_node_churn", &cp, Tier::start(&cp, kind, octet))
        else {
            return ExitCode::FAILURE;
        };
        run_cases(&mut suite, &mut tier, full);
        tier.print_table();
        stop_tier(
            tier.daemon.take(),
            tier.installer.take(),
            &mut tier.overlay,
            &mut tier.node,
        );
        drop(tier);
    }
    suite.finish()
}

fn run_cases(suite: &mut Suite, tier: &mut Tier<'_>, full: bool) {
    let k = tier.overlay.kind().name();
    let name = |c: &str| format!("{k}/{c}");
    let installed = tier.install_thin();
    let ok = installed.is_ok();
    if let Err(e) = &installed {
        eprintln!("real_node_churn: {k}: install failed: {e:#}");
    }
    suite.case(&name("thin_installed_by_install_sh"), || installed);
    if !ok {
        return;
    }
    if full {
        suite.case(
            &name("binaries_and_config_replaced_while_the_kubelet_execs_them"),
            || tier.under_churn("update", Tier::rolling_update),
        );
    }
    if full {
        if std::env::var_os("PLEXUS_PREV_BIN").is_some()
            || std::env::var_os("PLEXUS_PREV_REQUIRE").is_some()
        {
            let commit = prev_build()
                .ok()
                .and_then(|d| std::fs::read_to_string(d.join("commit")).ok())
                .unwrap_or_default();
            println!("    previous build: {}", commit.trim());
            suite.case(
                &name("rolled_back_to_the_previous_build_under_churn"),
                || tier.under_churn("rollback", Tier::roll_back),
            );
            suite.case(
                &name("upgraded_from_the_previous_build_under_churn"),
                || tier.under_churn("upgrade", Tier::upgrade),
            );
        } else {
            println!("    no previous build (PLEXUS_PREV_BIN unset): the upgrade and roll-back cases do not run");
        }
    }
    suite.case(&name("thin_to_daemon_under_churn"), || {
        tier.under_churn("todaemon", Tier::thin_to_daemon)
    });
    suite.case(&name("daemon_sigkilled_and_restarted_under_churn"), || {
        tier.under_churn("dkill", Tier::kill_daemon)
    });
    if full {
        suite.case(&name("daemon_daemonset_pod_replaced_under_churn"), || {
            tier.under_churn("dpod", Tier::replace_daemon_pod)
        });
    }
    suite.case(&name("kubelet_restarted_under_churn"), || {
        tier.under_churn("kubelet", |t| t.node.restart_kubelet())
    });
    suite.case(&name("containerd_restarted_under_churn"), || {
        tier.under_churn("containerd", |t| t.node.restart_containerd())
    });
    suite.case(&name("daemon_to_thin_under_churn"), || {
        tier.under_churn("tothin", Tier::daemon_to_thin)
    });
    if full {
        // Last: plexus is gone from the node after it.
        suite.case(
            &name("uninstalled_under_churn_old_pods_deleted_through_plexus"),
            || {
                tier.under_churn_judged("uninstall", Tier::uninstall, |t, out, t0| {
                    t.judge_uninstall(out, t0)?;
                    t.wait_clean()?;
                    t.delete_from_the_cluster()
                })
            },
        );
        // On the node plexus was just removed from: the peer, same churn, same operation.
        suite.case(
            &name("multus_thick_daemon_replaced_under_the_same_churn"),
            || tier.multus_side_by_side(),
        );
    }
}

/// The previous build's directory (`PLEXUS_PREV_BIN`, from scripts/prev-build.sh, which
/// scripts/test.sh runs), and which commit it is.
fn prev_build() -> Result<PathBuf> {
    let dir = std::env::var_os("PLEXUS_PREV_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .context(
            "PLEXUS_PREV_BIN is not set: run `bash scripts/prev-build.sh` and export its output",
        )?;
    for f in ["plexus", "sriov", "install.sh"] {
        ensure!(dir.join(f).is_file(), "no {f} in {}", dir.display());
    }
    Ok(dir)
}

/// A short unique link name (at most 15 bytes).
fn link(suffix: &str) -> String {
    format!("pxc{}{suffix}", std::process::id() % 100_000)
}

/// One row of the table.
struct Row {
    op: String,
    secs: f64,
    out: Outcome,
    /// Things left on the node after every pod was deleted (plexus' rows: checked to be 0).
    left: usize,
}

struct Tier<'a> {
    cp: &'a ControlPlane,
    node: Node<'a>,
    api: Api,
    overlay: Overlay,
    bridges: Vec<String>,
    installer: Option<Proc>,
    daemon: Option<PlexusDaemon>,
    metrics_port: u16,
    token: String,
    /// Every sandbox ID and netns the churns saw (leak checks).
    seen: Seen,
    rows: Vec<Row>,
    /// Leftovers a peer's row already counted.
    counted: std::collections::BTreeSet<String>,
}

impl<'a> Tier<'a> {
    fn start(cp: &'a ControlPlane, kind: Kind, octet: u8) -> Result<Tier<'a>> {
        let k = kind.name();
        let bridges = vec![
            link(&format!("{}a", &k[..1])),
            link(&format!("{}b", &k[..1])),
        ];
        let OverlayNode { node, overlay } = OverlayNode::start(
            cp,
            kind,
            octet,
            &link(&k[..1]),
            &format!("plexus-cnode-{k}"),
            &bridges,
        )?;
        Ok(Tier {
            cp,
            node,
            api: Api::new(&cp.admin_kubeconfig())?,
            overlay,
            bridges,
            installer: None,
            daemon: None,
            metrics_port: free_port()?,
            token: String::new(),
            seen: Seen::default(),
            rows: Vec::new(),
            counted: Default::default(),
        })
    }

    fn run_dir(&self) -> PathBuf {
        daemon_run_dir(&self.node)
    }

    fn socket(&self) -> PathBuf {
        self.run_dir().join("plexus.sock")
    }

    fn conf(&self) -> PathBuf {
        // This build's install.sh writes a conflist (it carries `cniVersions`); the previous
        // build's (the roll-back cases) a .conf over flannel's and calico's 0.3.1 conflists.
        let list = self.node.conf_dir().join("00-plexus.conflist");
        if list.exists() {
            list
        } else {
            self.node.conf_dir().join("00-plexus.conf")
        }
    }

    /// The installed config's plexus plugin (a .conf's top level, a conflist's first plugin).
    fn conf_plugin(&self) -> Result<Value> {
        let mut v: Value = serde_json::from_slice(&std::fs::read(self.conf())?)?;
        Ok(match v["plugins"].get_mut(0) {
            Some(p) => p.take(),
            None => v,
        })
    }

    /// The config's plugin type (`plexus` or `plexus-shim`).
    fn conf_type(&self) -> Result<String> {
        Ok(self.conf_plugin()?["type"]
            .as_str()
            .unwrap_or("")
            .to_string())
    }

    /// Both overlays (`kubectl apply -k deploy/overlays/thin`, then `deploy/overlays/daemon`
    /// for the DaemonSet thin_to_daemon switches to), the thin installer, two bridge NADs; a
    /// probe pod gets plexus.
    fn install_thin(&mut self) -> Result<()> {
        let cp = self.cp;
        cp.apply_kustomization(THIN_OVERLAY)?;
        cp.apply_kustomization(DAEMON_OVERLAY)?;
        self.token = plexus_token(cp, &PlexusToken::Unbound)?;
        cp.write_kubeconfig(&self.node.path("daemon.kubeconfig"), &self.token)?;
        self.run_installer("kube-plexus-ds", &self.binaries(false), json!({}))?;
        self.create_nads()?;
        wait_until_plexus_is_in_the_path(&self.api, NS, self.node.name())?;
        self.delete_probe()?;
        self.wait_clean()
    }

    /// The two bridge NADs the churn's pods ask for.
    fn create_nads(&self) -> Result<()> {
        let cp = self.cp;
        let ipam = |subnet: &str| json!({"type":"host-local","dataDir":self.node.ipam_dir(),"ranges":[[{"subnet":subnet}]]});
        for (i, name) in ["br-a", "br-b"].into_iter().enumerate() {
            let cfg = json!({"cniVersion":"1.0.0","name":name,"type":"bridge",
                "bridge":self.bridges[i],"ipam":ipam(&format!("10.236.{}.0/24", i + 1))});
            let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":{"name":name,"namespace":NS},"spec":{"config":cfg.to_string()}});
            cp.apply(&nad.to_string())?;
        }
        Ok(())
    }

    /// Delete the probe pod `wait_until_plexus_is_in_the_path` left running (its sandbox and
    /// netns join the leak checks) and wait until it is gone.
    fn delete_probe(&mut self) -> Result<()> {
        let probe = self.api.get_pod(NS, "probe")?.context("probe")?;
        let (sb, netns) = self
            .node
            .pod_sandbox(probe["metadata"]["uid"].as_str().context("uid")?)?;
        self.seen.sandboxes.push(sb);
        self.seen.netns.push(netns.clone());
        pods::delete_and_wait(
            &self.api,
            NS,
            "probe",
            &["probe".into()],
            &[netns],
            Duration::from_secs(30),
        )?;
        Ok(())
    }

    /// The image's binaries: plexus and sriov, plus plexus-shim for the daemon's installer.
    fn binaries(&self, daemon: bool) -> Vec<(&'static str, PathBuf)> {
        let mut v = vec![
            ("plexus", common::bin("plexus")),
            ("sriov", common::bin("sriov")),
        ];
        if daemon {
            v.push(("plexus-shim", common::bin("plexus-shim")));
        }
        v
    }

    /// Stop the running installer (SIGTERM, as a rollout does: its config stays), then run
    /// install.sh with the command and environment of `daemonset`'s install container, this
    /// node's paths and `extra` merged into its `PLEXUS_EXTRA_CONFIG`; wait for its ready file.
    fn run_installer(
        &mut self,
        daemonset: &str,
        binaries: &[(&str, PathBuf)],
        extra: Value,
    ) -> Result<()> {
        self.run_installer_script(daemonset, None, binaries, extra, INSTALL_READY)
    }

    /// [`Tier::run_installer`] with another build's install.sh (`None`: this tree's).
    fn run_installer_script(
        &mut self,
        daemonset: &str,
        script: Option<PathBuf>,
        binaries: &[(&str, PathBuf)],
        extra: Value,
        ready_within: Duration,
    ) -> Result<()> {
        if let Some(mut old) = self.installer.take() {
            old.stop(Duration::from_secs(10));
        }
        let mut install = InstallSh::from_daemonset(self.cp, daemonset, "install-plexus")?;
        install.script = script;
        let mut cfg = install.extra.clone();
        if cfg.get("daemonSocket").is_some() {
            cfg["daemonSocket"] = json!(self.socket());
        }
        cfg["cniDir"] = json!(self.node.plexus_dir());
        cfg["nadPolicy"] = nad_policy_allowing(&[&self.node.ipam_dir()]);
        for (k, v) in extra.as_object().into_iter().flatten() {
            cfg[k] = v.clone();
        }
        // The new container's emptyDir starts empty (the installer removes it too, but only
        // once its shell runs).
        let ready = InstallSh::ready_file(&self.node);
        let _ = std::fs::remove_file(&ready);
        let proc = install.spawn(self.cp, &self.node, &self.token, binaries, &cfg)?;
        self.installer = Some(proc);
        wait_for("the installer's ready file", ready_within, || {
            Ok(ready.exists())
        })
        .with_context(|| plexus_e2e::realk8s::tail(&self.node.path("installer.log"), 20))
    }

    fn start_daemon(&mut self) -> Result<()> {
        std::fs::create_dir_all(self.run_dir())?;
        let daemon = PlexusDaemon::start(&DaemonOpts {
            bin: &common::bin("plexus-daemon"),
            socket: &self.socket(),
            kubeconfig: &self.node.path("daemon.kubeconfig"),
            node: self.node.name(),
            dir: self.node.dir(),
            metrics_port: self.metrics_port,
        })?;
        self.daemon = Some(daemon);
        Ok(())
    }

    // -------------------------------------------------------------------------- operations

    /// A rolling update of the thin DaemonSet: the installer restarted with binaries whose
    /// bytes differ (each with a trailing marker) and a config that differs (`logLevel`): both
    /// renamed into place while containerd execs and reads them.
    fn rolling_update(&mut self) -> Result<()> {
        let dir = self.node.path("next-image");
        std::fs::create_dir_all(&dir)?;
        let mut next = Vec::new();
        for (name, file) in self.binaries(false) {
            let mut bytes = std::fs::read(&file)?;
            bytes.extend_from_slice(b"\0plexus-next-build\0");
            let dst = dir.join(name);
            std::fs::write(&dst, &bytes)?;
            std::fs::set_permissions(&dst, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
            next.push((name, dst));
        }
        self.run_installer("kube-plexus-ds", &next, json!({"logLevel": "info"}))?;
        for (name, file) in &next {
            ensure!(
                std::fs::read(self.node.bin_dir().join(name))? == std::fs::read(file)?,
                "{name} in the CNI bin dir is not the new build"
            );
        }
        let conf = self.conf_plugin()?;
        ensure!(conf["logLevel"] == "info", "config not rewritten: {conf}");
        Ok(())
    }

    /// Roll the thin DaemonSet back to the previous build (`PLEXUS_PREV_BIN`: its binaries and
    /// its install.sh, from scripts/prev-build.sh): pods created by this build are DELed by the
    /// previous one from plans it did not write.
    fn roll_back(&mut self) -> Result<()> {
        let prev = prev_build()?;
        let binaries = vec![
            ("plexus", prev.join("plexus")),
            ("sriov", prev.join("sriov")),
        ];
        self.run_installer_script(
            "kube-plexus-ds",
            Some(prev.join("install.sh")),
            &binaries,
            json!({}),
            INSTALL_READY,
        )?;
        ensure!(
            std::fs::read(self.node.bin_dir().join("plexus"))?
                == std::fs::read(prev.join("plexus"))?,
            "plexus in the CNI bin dir is not the previous build"
        );
        Ok(())
    }

    /// Roll the thin DaemonSet forward again, from the previous build to this one.
    fn upgrade(&mut self) -> Result<()> {
        self.run_installer("kube-plexus-ds", &self.binaries(false), json!({}))?;
        ensure!(
            std::fs::read(self.node.bin_dir().join("plexus"))?
                == std::fs::read(common::bin("plexus"))?,
            "plexus in the CNI bin dir is not this build"
        );
        Ok(())
    }

    /// The daemon DaemonSet replaces the thin one: the daemon starts, then its installer runs
    /// (the thin installer stopped); the config becomes plexus-shim's.
    fn thin_to_daemon(&mut self) -> Result<()> {
        self.start_daemon()?;
        self.run_installer("kube-plexus-daemon", &self.binaries(true), json!({}))?;
        ensure!(self.conf_type()? == "plexus-shim");
        Ok(())
    }

    /// SIGKILL the daemon (its socket stays), 3 s of the shim's thin fallback, start it again.
    fn kill_daemon(&mut self) -> Result<()> {
        self.daemon.take().context("daemon not running")?.kill();
        std::thread::sleep(Duration::from_secs(3));
        self.start_daemon()
    }

    /// The daemon DaemonSet's pod deleted and recreated: both its containers get SIGTERM (the
    /// installer leaves the config, the daemon removes its socket), 3 s, then the new pod's
    /// daemon and installer start.
    fn replace_daemon_pod(&mut self) -> Result<()> {
        if let Some(mut p) = self.installer.take() {
            p.stop(Duration::from_secs(10));
        }
        self.daemon.take().context("daemon not running")?.stop();
        ensure!(
            self.conf_type()? == "plexus-shim",
            "the config changed while the pod was gone"
        );
        std::thread::sleep(Duration::from_secs(3));
        self.start_daemon()?;
        self.run_installer("kube-plexus-daemon", &self.binaries(true), json!({}))
    }

    /// The thin DaemonSet replaces the daemon one: its installer writes plexus' config, then
    /// the daemon stops (SIGTERM).
    fn daemon_to_thin(&mut self) -> Result<()> {
        self.run_installer("kube-plexus-ds", &self.binaries(false), json!({}))?;
        ensure!(self.conf_type()? == "plexus");
        self.daemon.take().context("daemon not running")?.stop();
        Ok(())
    }

    /// `kubectl apply -k deploy/uninstall` (its DaemonSet over the thin one), its installer
    /// run (`--uninstall`): ready once plexus is gone from the node; nothing of plexus is left.
    fn uninstall(&mut self) -> Result<()> {
        self.cp.apply_kustomization("uninstall")?;
        // It is ready only once every pod that has a secondary network is deleted: the churn's
        // pods, at the kubelet's pace on a loaded node.
        self.run_installer_script(
            "kube-plexus-ds",
            None,
            &self.binaries(true),
            json!({}),
            UNINSTALL_READY,
        )?;
        let log = std::fs::read_to_string(self.node.path("installer.log"))?;
        ensure!(
            log.contains("uninstalled"),
            "no 'uninstalled' in the installer's log"
        );
        let mut left = Vec::new();
        for f in [
            self.node.conf_dir().join("00-plexus.conf"),
            self.node.conf_dir().join("00-plexus.conflist"),
            self.node.conf_dir().join("plexus.d"),
            self.node.bin_dir().join("plexus"),
            self.node.bin_dir().join("plexus-shim"),
            self.node.bin_dir().join("sriov"),
        ] {
            if f.exists() {
                left.push(f);
            }
        }
        ensure!(left.is_empty(), "left after uninstall: {left:?}");
        Ok(())
    }

    /// After the uninstall: `kubectl delete -k` of deploy/uninstall and of both overlays, and
    /// none of their objects is left in the API (the ServiceAccount, RBAC, DaemonSets, the NAD
    /// CRD and with it every NAD). Then the NAD CRD and the two NADs again, for the peer's
    /// case that follows.
    fn delete_from_the_cluster(&self) -> Result<()> {
        for dir in ["uninstall", DAEMON_OVERLAY, THIN_OVERLAY] {
            self.cp.delete_kustomization(dir)?;
        }
        self.cp.apply_deploy(&["base/nad-crd.yaml"])?;
        self.create_nads()
    }

    /// Multus thick on the same node, churn and operation as [`Tier::kill_daemon`] (its
    /// DaemonSet's pod replaced: SIGTERM, 3 s, a new daemon): measured, never judged (a peer).
    /// What the node holds after is counted in the row, then removed with the node.
    fn multus_side_by_side(&mut self) -> Result<()> {
        if self.conf().exists() {
            // Run alone (a filter): plexus off the node first, as the uninstall case leaves it.
            self.uninstall()?;
        }
        let mut m = MultusThick::start(self.cp, &self.node)?;
        let r = self.multus_rounds(&mut m);
        m.remove(&self.node);
        r
    }

    fn multus_rounds(&mut self, m: &mut MultusThick) -> Result<()> {
        wait_until_plexus_is_in_the_path(&self.api, NS, self.node.name())
            .context("a pod with Multus' network-status")?;
        self.delete_probe()?;
        // The same churn without an operation first: what Multus leaves in steady state.
        self.under_churn_judged("multus-steady", |_| Ok(()), |_, _, _| Ok(()))?;
        self.count_left("multus-steady")?;
        let conf_dir = self.node.conf_dir();
        let mut kept = None;
        self.under_churn_judged(
            "multus-thick",
            |_| {
                kept = Some(m.restart(&conf_dir, Duration::from_secs(3))?);
                Ok(())
            },
            |_, _, _| Ok(()),
        )?;
        println!(
            "    multus-thick: its config {} while its daemon was down",
            if kept == Some(true) {
                "stayed"
            } else {
                "was removed (multus-cni #1527)"
            }
        );
        self.count_left("multus-thick")
    }

    /// After a peer's churn: wait 15 s, then count what it left on the node (beyond what
    /// earlier rows left) into the last row, by kind (printed).
    fn count_left(&mut self, label: &str) -> Result<()> {
        std::thread::sleep(Duration::from_secs(15));
        let left: Vec<String> = self
            .leftovers()
            .into_iter()
            .filter(|l| !self.counted.contains(l))
            .collect();
        let row = self.rows.last_mut().context("no row")?;
        row.left = left.len();
        let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
        for l in &left {
            let k = l.split(['/', ':']).next().unwrap_or(l).to_string();
            *kinds.entry(k).or_default() += 1;
        }
        println!(
            "    {label}: {} thing(s) left on the node after every pod was deleted, by kind {kinds:?}: first {:?}",
            left.len(),
            left.iter().take(6).collect::<Vec<_>>()
        );
        if !left.is_empty() {
            println!(
                "    multus-daemon's log:\n{}",
                plexus_e2e::realk8s::tail(&self.node.path("multus/daemon.log"), 6)
            );
        }
        // Counted once: the next row counts only what it adds.
        self.counted.extend(left);
        Ok(())
    }

    /// The churn across the uninstall: pods created before it got their networks; pods
    /// created after it started got the cluster network alone, told by a `NetworksNotAttached`
    /// event while plexus was still in the path (network-status lists eth0), and with no
    /// network-status once plexus' config was gone; none on a wrong network, none failed.
    fn judge_uninstall(&self, out: &Outcome, started: Instant) -> Result<()> {
        ensure!(
            out.wrong_network.is_empty() && out.failed.is_empty(),
            "wrong network: {:?}; failed: {:?}",
            out.wrong_network,
            out.failed
        );
        let early: Vec<&str> = out
            .cluster_only()
            .iter()
            .filter(|p| p.created < started)
            .map(|p| p.name.as_str())
            .collect();
        ensure!(
            early.is_empty(),
            "created before the uninstall, yet the cluster network alone: {early:?}"
        );
        let mut told = 0;
        let mut untold = Vec::new();
        let mut after_removal = 0;
        for p in out.cluster_only() {
            match p.verdict {
                Verdict::ClusterOnly { status: true } if p.form != 0 => {
                    let events = self.api.events(NS, &p.name)?;
                    if events.iter().any(|e| e["reason"] == "NetworksNotAttached") {
                        told += 1;
                    } else {
                        untold.push(p.name.as_str());
                    }
                }
                Verdict::ClusterOnly { status: false } => after_removal += 1,
                _ => {}
            }
        }
        ensure!(
            untold.is_empty(),
            "no NetworksNotAttached event on {untold:?}"
        );
        ensure!(
            told > 0 && after_removal > 0,
            "expected pods told by an event ({told}) and pods after the config's removal ({after_removal})"
        );
        println!(
            "    uninstall: {told} pods told by an event while draining, {after_removal} after plexus' config was gone"
        );
        Ok(())
    }

    // -------------------------------------------------------------------------------- churn

    /// Churn for [`BEFORE`], run `op`, churn for [`AFTER`], then every churn pod deleted: no
    /// pod on the wrong network, none failed, nothing left on the node.
    fn under_churn(&mut self, label: &str, op: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        self.under_churn_judged(label, op, |t, out, _| {
            out.ensure_clean()?;
            t.wait_clean()
        })
    }

    /// [`Tier::under_churn`] with `judge` deciding what the pods must have got (given when the
    /// operation started).
    fn under_churn_judged(
        &mut self,
        label: &str,
        op: impl FnOnce(&mut Self) -> Result<()>,
        judge: impl FnOnce(&Self, &Outcome, Instant) -> Result<()>,
    ) -> Result<()> {
        let net = self.overlay.network_name().to_string();
        let spec = Spec {
            kubeconfig: self.cp.admin_kubeconfig(),
            cri_socket: self.node.path("containerd/containerd.sock"),
            ns: NS.into(),
            node: self.node.name().into(),
            prefix: label.into(),
            default_net: net,
            interval: Duration::from_millis(500),
            live: 10,
            run_deadline: Duration::from_secs(90),
            forms: vec![
                Form {
                    annotation: None,
                    extra: vec![],
                },
                Form {
                    annotation: Some(json!("br-a")),
                    extra: vec![("app/br-a".into(), "net1".into())],
                },
                Form {
                    annotation: Some(
                        json!([{"name": "br-a"}, {"name": "br-b", "interface": "data1"}]),
                    ),
                    extra: vec![
                        ("app/br-a".into(), "net1".into()),
                        ("app/br-b".into(), "data1".into()),
                    ],
                },
            ],
        };
        let churn = Churn::start(spec);
        std::thread::sleep(BEFORE);
        let t0 = Instant::now();
        let r = op(self);
        let secs = t0.elapsed().as_secs_f64();
        std::thread::sleep(AFTER);
        let out = churn.finish()?;
        self.seen.sandboxes.extend(out.sandboxes.iter().cloned());
        self.seen.netns.extend(out.netns.iter().cloned());
        r.with_context(|| format!("the operation ({})", self.node.logs(10)))?;
        println!(
            "    {label}: {} pods created, {} correct, {} wrong network, {} failed, {} sandbox retries, create→Running median {:.0} ms; operation {secs:.1} s",
            out.created,
            out.correct,
            out.wrong_network.len(),
            out.failed.len(),
            out.sandbox_retries,
            median(&out.running_ms)
        );
        let clean = judge(self, &out, t0);
        self.rows.push(Row {
            op: label.into(),
            secs,
            out,
            left: 0,
        });
        clean?;
        if let Some(p) = self.installer.as_mut() {
            p.check_alive().context("the installer exited")?;
        }
        Ok(())
    }

    /// Plans and result files, leases, netns, veths on the bridges, the overlay's per-pod
    /// state, libcni cache entries.
    fn leftovers(&self) -> Vec<String> {
        self.seen
            .leftovers(self.cp, &self.node, &self.overlay, &self.bridges)
    }

    /// Wait (15 s) until nothing is left.
    fn wait_clean(&self) -> Result<()> {
        wait_clean(Duration::from_secs(15), || self.leftovers())
    }

    fn print_table(&self) {
        if self.rows.is_empty() {
            return;
        }
        println!(
            "\n  day-2 operations under churn ({}; a pod per 0.5 s, at most 10 live):",
            self.overlay.kind().name()
        );
        println!("  | operation | op s | pods | correct | cluster network only | wrong network | failed | sandbox retries | create→Running p50 ms | left on the node |");
        println!("  |---|---|---|---|---|---|---|---|---|---|");
        for r in &self.rows {
            println!(
                "  | {} | {:.1} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
                r.op,
                r.secs,
                r.out.created,
                r.out.correct,
                r.out.cluster_only().len(),
                r.out.wrong_network.len(),
                r.out.failed.len(),
                r.out.sandbox_retries,
                median(&r.out.running_ms),
                r.left
            );
        }
    }
}
