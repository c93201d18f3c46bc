//! Node tier, CNI STATUS as containerd 2.x calls it: a real kubelet v1.36 and containerd 2.3
//! (`plexus_e2e::realk8s::node`; ≥ 2.0.1 calls STATUS on every CRI `Status` when the config's
//! version is ≥ 1.1.0, and any failure is NetworkReady=false, the Node NotReady), real flannel,
//! plexus installed by `deploy/install.sh` with the DaemonSet's command and environment (its
//! config offers 1.1.0 in `cniVersions`), then in daemon mode with the daemon DaemonSet's.
//!
//! The Node's Ready condition is read every 200 ms for the whole run. Cases, per mode: STATUS
//! calls counted (plexus' log, one `STATUS done` line per call) and timed (in plexus, and the
//! whole exec as libcni runs it), with no request of plexus' ServiceAccount in the apiserver's
//! audit log meanwhile; transients that must not flap the node (thin: plexus' config rewritten
//! by install.sh over and over, the cluster network's conflist rewritten in place the way
//! `cp` does; daemon: the daemon SIGKILLed, down, started, SIGTERMed and started again, then
//! frozen by SIGSTOP, taking connections and answering none) with
//! Ready=True at every sample; and real causes (a plugin of the cluster network gone, its
//! conflist gone, the readiness indicator file gone, the cluster network's own STATUS failing):
//! NotReady with plexus' message naming its network and the cause, then Ready once fixed.
//!
//! Then the same on a flannel node on CRI-O 1.36 (thin mode, compact): CRI-O calls STATUS once
//! at its start-up and never again with its default config (none when install.sh publishes the
//! config, none in the 10 s after a restart); with `cni_status_grace_period` set it polls STATUS
//! every 5 s (counted and timed as above, no API request); a plugin of the cluster network gone
//! for less than the grace period never flaps the Node, gone for good it turns the Node NotReady
//! with plexus' message once the grace period has run out, Ready after the fix.
//!
//! Skipped (and passing) without `PLEXUS_K8S_BIN`; `PLEXUS_K8S_REQUIRE=1` makes that a failure.
//! `cargo test -p plexus-e2e --test real_node_status -- NAME` runs the cases whose name holds
//! NAME (after the install cases they need).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use plexus_e2e::realk8s::node::{use_runtime, wait_for};
use plexus_e2e::realk8s::node_rig::{
    DaemonOpts, InstallSh, OverlayNode, PlexusDaemon, DAEMON_OVERLAY, THIN_OVERLAY,
};
use plexus_e2e::realk8s::overlay::{Kind, Overlay};
use plexus_e2e::realk8s::rig::{plexus_token, PlexusToken, Rig};
use plexus_e2e::realk8s::runtimes::{Containerd, Runtime};
use plexus_e2e::realk8s::{
    control_plane_or_skip, free_port, setup_or_report, CliArgs, ControlPlane, Proc, Suite,
};
use serde_json::{json, Value};

/// plexus' ServiceAccount as the audit log names it (thin mode's and the daemon's token).
const PLEXUS_USER: &str = "system:serviceaccount:kube-system:plexus";

/// How long each measurement window lasts.
const WINDOW: Duration = Duration::from_secs(30);

/// How long the CRI-O pass' measurement window lasts (CRI-O polls every 5 s).
const CRIO_WINDOW: Duration = Duration::from_secs(20);

/// The CRI-O pass' `cni_status_grace_period`.
const CRIO_GRACE: Duration = Duration::from_secs(10);

/// How long the kubelet may take to report a change of NetworkReady (it asks the runtime every
/// 5 s and posts the Node every 2 s here).
const NODE_REPORTS: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let mut suite = Suite::new("real_node_status");
    let rig = Rig::builder().namespaces(&["default"]).build(&cp);
    let Some(_rig) = setup_or_report("real_node_status", &cp, rig) else {
        return ExitCode::FAILURE;
    };
    let containerd = Runtime::Containerd(Containerd::V2);
    // A pass runs when the name filter may select one of its cases (no containerd case's name
    // holds "crio").
    let args = CliArgs::from_env();
    let passes = [
        (
            containerd,
            !args.filter.as_deref().is_some_and(|f| f.contains("crio")),
        ),
        (Runtime::Crio, CRIO_CASES.iter().any(|c| args.selects(c))),
    ];
    for runtime in passes.into_iter().filter(|p| p.1).map(|p| p.0) {
        use_runtime(runtime);
        let started = Tier::start(&cp, runtime);
        let Some(mut tier) = setup_or_report("real_node_status", &cp, started) else {
            use_runtime(containerd);
            return ExitCode::FAILURE;
        };
        let watch = ReadyWatch::start(&cp, tier.node.node.name());
        if runtime == Runtime::Crio {
            run_crio_cases(&mut suite, &mut tier, &watch);
        } else {
            run_cases(&mut suite, &mut tier, &watch);
        }
        let samples = watch.stop();
        println!(
            "    {}: Node Ready sampled {} times, {} of them NotReady (each case asserts what it \
             expects in its own span)",
            tier.runtime_label,
            samples.len(),
            samples.iter().filter(|s| !s.ready).count()
        );
        tier.stop();
    }
    use_runtime(containerd);
    suite.finish()
}

/// The CRI-O pass' cases, in order.
const CRIO_CASES: [&str; 3] = [
    "crio/install_sh_offers_1_1_0_and_crio_calls_status_at_start_up_only",
    "crio/cni_status_grace_period_set_status_polled_counted_and_timed_with_no_api_request",
    "crio/a_plugin_of_the_cluster_network_gone_shorter_than_the_grace_period_never_flaps_longer_is_not_ready_then_ready",
];

/// CRI-O 1.36 (thin mode on flannel): STATUS at start-up only by default; polled with
/// `cni_status_grace_period` set, and a real cause NotReady after the grace period.
fn run_crio_cases(suite: &mut Suite, tier: &mut Tier<'_>, watch: &ReadyWatch) {
    let started = tier.crio_start_up(watch);
    let ok = started.is_ok();
    suite.case(CRIO_CASES[0], || started);
    if !ok {
        return;
    }
    let polled = tier.crio_continuous(watch);
    let ok = polled.is_ok();
    suite.case(CRIO_CASES[1], || polled);
    if !ok {
        return;
    }
    suite.case(CRIO_CASES[2], || tier.crio_plugin_gone(watch));
}

fn run_cases(suite: &mut Suite, tier: &mut Tier<'_>, watch: &ReadyWatch) {
    let installed = tier.install_thin(watch);
    let ok = installed.is_ok();
    suite.case(
        "thin/install_sh_offers_1_1_0_and_containerd_2_calls_plexus_status",
        || installed,
    );
    if !ok {
        return;
    }
    suite.case(
        "thin/status_calls_counted_and_timed_with_no_api_request",
        || tier.measure("thin", watch),
    );
    suite.case(
        "thin/config_rewrites_by_install_sh_and_in_place_never_flap_ready",
        || tier.rewrites(watch),
    );
    suite.case(
        "thin/a_plugin_of_the_cluster_network_gone_is_not_ready_with_the_reason_then_ready",
        || tier.plugin_gone(watch),
    );
    suite.case(
        "thin/the_cluster_networks_config_gone_is_not_ready_with_the_reason_then_ready",
        || tier.conflist_gone(watch),
    );
    suite.case(
        "thin/the_readiness_indicator_file_gone_is_not_ready_with_the_reason_then_ready",
        || tier.indicator_gone(watch),
    );
    suite.case(
        "thin/the_cluster_networks_own_status_failing_is_not_ready_with_its_error_then_ready",
        || tier.delegate_status_fails(watch),
    );
    let daemon = tier.install_daemon(watch);
    let ok = daemon.is_ok();
    suite.case(
        "daemon/install_sh_of_the_daemon_daemonset_switches_the_config_ready_throughout",
        || daemon,
    );
    if !ok {
        return;
    }
    suite.case(
        "daemon/status_calls_counted_and_timed_with_no_api_request",
        || tier.measure("daemon", watch),
    );
    suite.case(
        "daemon/daemon_killed_stopped_and_restarted_never_flaps_ready",
        || tier.daemon_restarts(watch),
    );
    suite.case(
        "daemon/a_daemon_that_takes_calls_and_never_answers_does_not_hold_status",
        || tier.daemon_frozen(watch),
    );
    suite.case(
        "daemon/a_plugin_of_the_cluster_network_gone_is_not_ready_with_the_reason_then_ready",
        || tier.plugin_gone(watch),
    );
}

// ---------------------------------------------------------------------------------- Ready watch

/// One reading of the Node's Ready condition.
#[derive(Clone, Debug)]
struct Sample {
    at: Instant,
    ready: bool,
    message: String,
}

/// A thread reading the Node's Ready condition every 200 ms for the whole run.
struct ReadyWatch {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReadyWatch {
    fn start(cp: &ControlPlane, node: &str) -> ReadyWatch {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        // The admin's own client (no kubectl process per read: 5 reads a second).
        let kubeconfig = cp.admin_kubeconfig();
        let path = format!("/api/v1/nodes/{node}");
        let thread = {
            let (samples, stop) = (samples.clone(), stop.clone());
            std::thread::spawn(move || {
                let Ok(client) = AdminClient::new(&kubeconfig) else {
                    eprintln!("real_node_status: no admin client for the Ready watch");
                    return;
                };
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    if let Ok(node) = client.get(&path) {
                        if let Some((ready, message)) = ready_condition(&node) {
                            samples
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(Sample {
                                    at: t,
                                    ready,
                                    message,
                                });
                        }
                    }
                    std::thread::sleep(Duration::from_millis(200).saturating_sub(t.elapsed()));
                }
            })
        };
        ReadyWatch {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// The samples taken since `t`.
    fn since(&self, t: Instant) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| s.at >= t)
            .cloned()
            .collect()
    }

    /// The latest sample taken after `t`.
    fn latest_after(&self, t: Instant) -> Option<Sample> {
        self.since(t).pop()
    }

    /// Wait until a sample after now says `ready` (and, for NotReady, its message holds every
    /// one of `words`); that sample and how long it took.
    fn wait_for(&self, ready: bool, words: &[&str], timeout: Duration) -> Result<(Sample, f64)> {
        let t0 = Instant::now();
        let mut found = None;
        wait_for(
            &format!("the Node {}", if ready { "Ready" } else { "NotReady" }),
            timeout,
            || {
                found = self
                    .since(t0)
                    .into_iter()
                    .find(|s| s.ready == ready && words.iter().all(|w| s.message.contains(w)));
                Ok(found.is_some())
            },
        )
        .with_context(|| {
            format!(
                "last Ready condition: {:?}",
                self.latest_after(t0).map(|s| (s.ready, s.message))
            )
        })?;
        let s = found.context("no sample")?;
        let secs = s.at.duration_since(t0).as_secs_f64();
        Ok((s, secs))
    }

    /// An error naming the first NotReady sample since `t`, if any; else how many samples
    /// (all Ready) were taken.
    fn ready_throughout(&self, t: Instant, what: &str) -> Result<usize> {
        let samples = self.since(t);
        if let Some(s) = samples.iter().find(|s| !s.ready) {
            bail!(
                "the Node went NotReady during {what} ({:.1} s in): {}",
                s.at.duration_since(t).as_secs_f64(),
                s.message
            );
        }
        ensure!(!samples.is_empty(), "no Node sample during {what}");
        Ok(samples.len())
    }

    fn stop(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// (Ready, message) of a Node object.
fn ready_condition(node: &Value) -> Option<(bool, String)> {
    let c = node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?;
    Some((
        c["status"] == "True",
        c["message"].as_str().unwrap_or("").to_string(),
    ))
}

/// GETs as the admin through a kept-alive kube client.
struct AdminClient {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

impl AdminClient {
    fn new(kubeconfig: &Path) -> Result<AdminClient> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
            let cfg = kube::Config::from_custom_kubeconfig(
                kc,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            anyhow::Ok(kube::Client::try_from(cfg)?)
        })?;
        Ok(AdminClient { rt, client })
    }

    fn get(&self, path: &str) -> Result<Value> {
        let req = http::Request::builder()
            .method("GET")
            .uri(path)
            .body(Vec::new())?;
        let text = self.rt.block_on(self.client.request_text(req))?;
        Ok(serde_json::from_str(&text)?)
    }
}

// ------------------------------------------------------------------------------------- the tier

fn link(suffix: &str) -> String {
    format!("pxs{}{suffix}", std::process::id() % 100_000)
}

struct Tier<'a> {
    cp: &'a ControlPlane,
    node: OverlayNode<'a>,
    installer: Option<Proc>,
    daemon: Option<PlexusDaemon>,
    metrics_port: u16,
    /// The mode's binaries installed (thin: plexus; daemon: plexus-shim too).
    daemon_mode: bool,
    /// Who calls STATUS, for the figures (`containerd 2.3`, `CRI-O 1.36`).
    runtime_label: &'static str,
}

impl<'a> Tier<'a> {
    /// A flannel node on `runtime` (as [`use_runtime`] selected it).
    fn start(cp: &'a ControlPlane, runtime: Runtime) -> Result<Tier<'a>> {
        let crio = runtime == Runtime::Crio;
        let (octet, tag, name) = if crio {
            (234, "c", "plexus-node-status-crio")
        } else {
            (236, "f", "plexus-node-status")
        };
        let node = OverlayNode::start(cp, Kind::Flannel, octet, &link(tag), name, &[])?;
        ensure!(
            node.node.runtime() == runtime,
            "the node runs {:?}, not {runtime:?}",
            node.node.runtime()
        );
        if !crio {
            let line = node.node.containerd_line();
            ensure!(
                line == Containerd::V2,
                "STATUS needs containerd >= 2.0.1; this node runs {}",
                line.label()
            );
        }
        Ok(Tier {
            runtime_label: if crio { "CRI-O 1.36" } else { "containerd 2.3" },
            cp,
            node,
            installer: None,
            daemon: None,
            metrics_port: free_port()?,
            daemon_mode: false,
        })
    }

    fn stop(&mut self) {
        if let Some(mut p) = self.installer.take() {
            p.stop(Duration::from_secs(10));
        }
        if let Some(d) = self.daemon.take() {
            d.stop();
        }
        self.node.stop();
        let _ = std::fs::remove_dir_all(self.run_dir());
    }

    fn overlay(&self) -> &Overlay {
        &self.node.overlay
    }

    fn conf(&self) -> PathBuf {
        self.node.node.conf_dir().join("00-plexus.conflist")
    }

    fn primary(&self) -> PathBuf {
        self.node.node.conf_dir().join(self.overlay().conf_name())
    }

    fn plexus_log(&self) -> PathBuf {
        self.node.node.path("plexus.log")
    }

    /// flanneld's subnet.env: the readiness indicator file (Multus' usual choice for flannel).
    fn indicator(&self) -> PathBuf {
        self.node.node.path("flannel/subnet.env")
    }

    fn run_dir(&self) -> PathBuf {
        PathBuf::from(format!("/run/plexus-e2e-{}", self.node.node.name()))
    }

    fn socket(&self) -> PathBuf {
        self.run_dir().join("plexus.sock")
    }

    /// What the installer adds to the DaemonSet's `PLEXUS_EXTRA_CONFIG` on this node.
    fn extra_config(&self, mut extra: Value) -> Value {
        extra["cniDir"] = json!(self.node.node.plexus_dir());
        extra["readinessindicatorfile"] = json!(self.indicator());
        if self.daemon_mode {
            extra["daemonSocket"] = json!(self.socket());
        }
        extra
    }

    /// Run `install` (the installer container of a DaemonSet) with log level debug (one line per
    /// STATUS call) and `binaries`; wait for its ready file and the config.
    fn run_installer(
        &mut self,
        mut install: InstallSh,
        binaries: &[(&str, PathBuf)],
    ) -> Result<()> {
        if let Some(mut p) = self.installer.take() {
            p.stop(Duration::from_secs(10));
        }
        install
            .env
            .push(("PLEXUS_LOG_LEVEL".into(), "debug".into()));
        let token = plexus_token(self.cp, &PlexusToken::Unbound)?;
        let extra = self.extra_config(install.extra.clone());
        // The last installer's ready file would answer before this one has published.
        let ready = InstallSh::ready_file(&self.node.node);
        let _ = std::fs::remove_file(&ready);
        let proc = install.spawn(self.cp, &self.node.node, &token, binaries, &extra)?;
        self.installer = Some(proc);
        wait_for(
            "the installer's ready file",
            Duration::from_secs(60),
            || Ok(ready.exists()),
        )
        .with_context(|| plexus_e2e::realk8s::tail(&self.node.node.path("installer.log"), 20))?;
        Ok(())
    }

    /// The config as libcni hands it to plexus at `version`: the list's first plugin with the
    /// list's name and that version.
    fn plugin_config(&self, version: &str) -> Result<Value> {
        let conf: Value = serde_json::from_slice(&std::fs::read(self.conf())?)?;
        let mut p = conf["plugins"][0].clone();
        p["name"] = conf["name"].clone();
        p["cniVersion"] = json!(version);
        Ok(p)
    }

    // ------------------------------------------------------------------------------ install

    /// The thin DaemonSet's installer run; its config checked.
    fn install_thin_config(&mut self) -> Result<()> {
        let cp = self.cp;
        cp.apply_kustomization(THIN_OVERLAY)?;
        let install = InstallSh::from_daemonset(cp, "kube-plexus-ds", "install-plexus")?;
        self.run_installer(
            install,
            &[
                ("plexus", common::bin("plexus")),
                ("sriov", common::bin("sriov")),
            ],
        )?;
        let conf: Value = serde_json::from_slice(&std::fs::read(self.conf())?)?;
        // flannel's conflist says 0.3.1: plexus' config keeps it for an older libcni and offers
        // 1.1.0, which containerd 2.3 (libcni 1.3) and CRI-O 1.36 (libcni 1.2) pick.
        ensure!(
            conf["cniVersion"] == "0.3.1" && conf["cniVersions"] == json!(["0.3.1", "1.1.0"]),
            "{conf}"
        );
        ensure!(conf["plugins"][0]["type"] == "plexus", "{conf}");
        Ok(())
    }

    fn install_thin(&mut self, watch: &ReadyWatch) -> Result<()> {
        let t0 = Instant::now();
        self.install_thin_config()?;
        // containerd calls plexus' STATUS: the first lines in its log.
        let log = self.plexus_log();
        wait_for("a STATUS call in plexus' log", NODE_REPORTS, || {
            Ok(status_lines(&log, 0).0 > 0)
        })
        .with_context(|| self.node.node.logs(20))?;
        let n = watch.ready_throughout(t0, "the install")?;
        println!(
            "    config {}: cniVersion 0.3.1 + cniVersions [0.3.1, 1.1.0]; first STATUS {:.1} s \
             after the installer started; Node Ready at all {n} samples",
            self.conf().display(),
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// CRI-O: install.sh's config in place (CRI-O reloads its conf dir), STATUS calls counted;
    /// CRI-O restarted: STATUS at its start-up, then none for 10 s (continuous monitoring off
    /// by default, as its log says).
    fn crio_start_up(&mut self, watch: &ReadyWatch) -> Result<()> {
        let t0 = Instant::now();
        self.install_thin_config()?;
        let log = self.plexus_log();
        std::thread::sleep(Duration::from_secs(5));
        let on_install = status_lines(&log, 0).0;
        let n = watch.ready_throughout(t0, "the install")?;
        let crio_log = self.node.node.path("crio.log");
        let crio_from = file_len(&crio_log);
        let from = file_len(&log);
        let t1 = Instant::now();
        self.node.node.restart_runtime()?;
        wait_for(
            "a STATUS call at CRI-O's start-up",
            Duration::from_secs(30),
            || Ok(status_lines(&log, from).0 > 0),
        )
        .with_context(|| plexus_e2e::realk8s::tail(&crio_log, 20))?;
        let first = t1.elapsed().as_secs_f64();
        watch.wait_for(true, &[], NODE_REPORTS)?;
        let flaps = watch.since(t1).iter().filter(|s| !s.ready).count();
        let at_start = status_lines(&log, from).0;
        let quiet_from = file_len(&log);
        std::thread::sleep(Duration::from_secs(10));
        let later = status_lines(&log, quiet_from).0;
        let crio_text = log_from(&crio_log, crio_from);
        ensure!(
            crio_text.contains("Continuous CNI STATUS monitoring is disabled"),
            "CRI-O's log does not say continuous STATUS monitoring is off: {}",
            plexus_e2e::realk8s::tail(&crio_log, 20)
        );
        ensure!(
            later == 0,
            "CRI-O called STATUS {later} times in the 10 s after its start-up with continuous \
             monitoring off"
        );
        println!(
            "    config {}: cniVersions [0.3.1, 1.1.0]; {on_install} STATUS calls in the 5 s after \
             install.sh published it (Node Ready at all {n} samples); CRI-O restarted: first \
             STATUS {first:.1} s after, {at_start} at its start-up (\"CNI plugin is now healthy\" \
             in its log: {}), then 0 in 10 s (\"Continuous CNI STATUS monitoring is disabled\"); \
             {flaps} NotReady samples across the restart",
            self.conf().display(),
            crio_text.contains("CNI plugin is now healthy"),
        );
        Ok(())
    }

    /// CRI-O with `cni_status_grace_period` ([`CRIO_GRACE`]) set and restarted: STATUS polled,
    /// counted and timed over [`CRIO_WINDOW`], no API request.
    fn crio_continuous(&mut self, watch: &ReadyWatch) -> Result<()> {
        self.node
            .node
            .crio_cni_status_grace_period(Some(CRIO_GRACE))?;
        let crio_log = self.node.node.path("crio.log");
        let crio_from = file_len(&crio_log);
        self.node.node.restart_runtime()?;
        watch.wait_for(true, &[], NODE_REPORTS)?;
        let text = log_from(&crio_log, crio_from);
        let enabled = text
            .lines()
            .find(|l| l.contains("Continuous CNI STATUS monitoring enabled"))
            .with_context(|| {
                format!(
                    "CRI-O's log does not say continuous STATUS monitoring is on: {}",
                    plexus_e2e::realk8s::tail(&crio_log, 20)
                )
            })?;
        println!("    CRI-O: {}", enabled.trim());
        self.measure_over("thin", CRIO_WINDOW, watch)
    }

    fn install_daemon(&mut self, watch: &ReadyWatch) -> Result<()> {
        let cp = self.cp;
        let t0 = Instant::now();
        cp.apply_kustomization(DAEMON_OVERLAY)?;
        let token = plexus_token(cp, &PlexusToken::Unbound)?;
        cp.write_kubeconfig(&self.node.node.path("daemon.kubeconfig"), &token)?;
        self.daemon_mode = true;
        self.start_daemon()?;
        let install = InstallSh::from_daemonset(cp, "kube-plexus-daemon", "install-plexus")?;
        ensure!(
            install.extra["type"] == "plexus-shim",
            "the daemon DaemonSet's installer does not select plexus-shim: {}",
            install.extra
        );
        self.run_installer(
            install,
            &[
                ("plexus", common::bin("plexus")),
                ("plexus-shim", common::bin("plexus-shim")),
                ("sriov", common::bin("sriov")),
            ],
        )?;
        let conf: Value = serde_json::from_slice(&std::fs::read(self.conf())?)?;
        ensure!(
            conf["plugins"][0]["type"] == "plexus-shim"
                && conf["plugins"][0]["daemonSocket"] == json!(self.socket())
                && conf["cniVersions"] == json!(["0.3.1", "1.1.0"]),
            "{conf}"
        );
        // STATUS goes on through the switch: a call after the new config is in place.
        let log = self.plexus_log();
        let from = file_len(&log);
        wait_for("a STATUS call after the switch", NODE_REPORTS, || {
            Ok(status_lines(&log, from).0 > 0)
        })?;
        let n = watch.ready_throughout(t0, "the switch to daemon mode")?;
        println!("    switched to daemon mode (plexus-shim); Node Ready at all {n} samples");
        Ok(())
    }

    fn start_daemon(&mut self) -> Result<()> {
        std::fs::create_dir_all(self.run_dir())?;
        let kubeconfig = self.node.node.path("daemon.kubeconfig");
        let daemon = PlexusDaemon::start(&DaemonOpts {
            bin: &common::bin("plexus-daemon"),
            socket: &self.socket(),
            kubeconfig: &kubeconfig,
            node: self.node.node.name(),
            dir: self.node.node.dir(),
            metrics_port: self.metrics_port,
        })?;
        self.daemon = Some(daemon);
        Ok(())
    }

    // ---------------------------------------------------------------------------- measuring

    /// Count STATUS calls over [`WINDOW`] and their cost; no request of plexus' ServiceAccount
    /// may reach the apiserver meanwhile (daemon mode: no request but its watches').
    fn measure(&mut self, mode: &str, watch: &ReadyWatch) -> Result<()> {
        self.measure_over(mode, WINDOW, watch)
    }

    /// [`Tier::measure`] over `window`.
    fn measure_over(&mut self, mode: &str, window: Duration, watch: &ReadyWatch) -> Result<()> {
        let log = self.plexus_log();
        let from = file_len(&log);
        let audit_before = self.cp.audit().len();
        let t0 = Instant::now();
        std::thread::sleep(window);
        let secs = t0.elapsed().as_secs_f64();
        let (calls, mut in_plexus) = status_lines(&log, from);
        let audit = self.cp.audit();
        let ours: Vec<_> = audit
            .get(audit_before..)
            .unwrap_or_default()
            .iter()
            .filter(|e| e.user == PLEXUS_USER)
            .collect();
        // The daemon's caches list and watch pods and NADs on their own schedule (a watch ends
        // and is re-listed every few minutes): not STATUS' doing. Anything else is.
        let background = |v: &str| self.daemon_mode && (v == "watch" || v == "list");
        let requests: Vec<_> = ours
            .iter()
            .filter(|e| !background(&e.verb))
            .map(|e| format!("{} {} {}", e.verb, e.resource, e.uri))
            .collect();
        let informer = ours.len() - requests.len();
        let samples = watch.ready_throughout(t0, "the measurement")?;
        ensure!(
            calls >= 3,
            "{mode}: only {calls} STATUS calls in {secs:.0} s"
        );
        ensure!(
            requests.is_empty(),
            "{mode}: plexus' ServiceAccount made {} API requests during {calls} STATUS calls: {requests:?}",
            requests.len()
        );
        // One call as libcni makes it: exec of the config's type with the 1.1.0 plugin config.
        let bin = if self.daemon_mode {
            self.node.node.bin_dir().join("plexus-shim")
        } else {
            self.node.node.bin_dir().join("plexus")
        };
        let mut cfg = self.plugin_config("1.1.0")?;
        cfg["logLevel"] = json!("warn");
        let mut wall = Vec::new();
        for _ in 0..50 {
            let (ok, ms, out) = run_status(&bin, &self.node.node.bin_dir(), &cfg)?;
            ensure!(ok, "{mode}: STATUS by hand failed: {out}");
            wall.push(ms);
        }
        let (p50, p95) = (percentile(&mut wall, 0.5), percentile(&mut wall, 0.95));
        let (i50, i95) = (
            percentile(&mut in_plexus, 0.5),
            percentile(&mut in_plexus, 0.95),
        );
        println!(
            "    {mode}: {calls} STATUS calls in {secs:.0} s ({:.1}/min, one every {:.1} s) from \
             {} + kubelet 1.36; in plexus {i50:.2} ms median, {i95:.2} ms p95; \
             a whole call as libcni execs it ({}): {p50:.1} ms median, {p95:.1} ms p95 (50 \
             calls); API requests by {PLEXUS_USER}: 0 (the daemon's cache list/watch meanwhile: \
             {informer}); Node Ready at all {samples} samples",
            calls as f64 * 60.0 / secs,
            secs / calls as f64,
            self.runtime_label,
            bin.file_name().unwrap_or_default().to_string_lossy()
        );
        Ok(())
    }

    // ---------------------------------------------------------------------------- transients

    /// plexus' config rewritten by install.sh 10 times (each a new config: rename, then the
    /// same bytes written in place), then flannel's conflist rewritten in place 40 times the way
    /// `cp` does (truncate, then write), each left empty 150 ms, far longer than `cp` does, so
    /// that STATUS calls land in the gap: Ready at every sample, STATUS calls going on.
    fn rewrites(&mut self, watch: &ReadyWatch) -> Result<()> {
        let log = self.plexus_log();
        let from = file_len(&log);
        let t0 = Instant::now();
        // The watch installer would restore its own config: one-shot runs instead.
        if let Some(mut p) = self.installer.take() {
            p.stop(Duration::from_secs(10));
        }
        let install = InstallSh::from_daemonset(self.cp, "kube-plexus-ds", "install-plexus")?;
        let token = plexus_token(self.cp, &PlexusToken::Unbound)?;
        let binaries = [
            ("plexus", common::bin("plexus")),
            ("sriov", common::bin("sriov")),
        ];
        let mut inodes = std::collections::BTreeSet::new();
        for i in 0..10 {
            let mut once = InstallSh {
                command: install
                    .command
                    .iter()
                    .filter(|a| *a != "--watch")
                    .cloned()
                    .collect(),
                env: install.env.clone(),
                extra: install.extra.clone(),
                script: None,
            };
            once.env.push(("PLEXUS_LOG_LEVEL".into(), "debug".into()));
            once.env.push((
                "PLEXUS_NODE_NAME".into(),
                format!("plexus-node-status-{}", i % 2),
            ));
            let extra = self.extra_config(once.extra.clone());
            let mut p = once.spawn(self.cp, &self.node.node, &token, &binaries, &extra)?;
            wait_for("the one-shot installer", Duration::from_secs(60), || {
                Ok(p.check_alive().is_err())
            })?;
            p.stop(Duration::from_secs(1));
            inodes.insert(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(
                self.conf(),
            )?));
            std::thread::sleep(Duration::from_millis(300));
        }
        ensure!(
            inodes.len() >= 2,
            "install.sh did not rename a new config in ({inodes:?})"
        );
        let primary = self.primary();
        let bytes = std::fs::read(&primary)?;
        for _ in 0..40 {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&primary)?;
            std::thread::sleep(Duration::from_millis(150));
            f.write_all(&bytes)?;
            drop(f);
            std::thread::sleep(Duration::from_millis(250));
        }
        // Back to the DaemonSet's own installer (node name as it was).
        let install = InstallSh::from_daemonset(self.cp, "kube-plexus-ds", "install-plexus")?;
        self.run_installer(install, &binaries)?;
        // Let the kubelet ask again after the last rewrite.
        std::thread::sleep(Duration::from_secs(12));
        let (calls, _) = status_lines(&log, from);
        let n = watch.ready_throughout(t0, "the rewrites")?;
        let retried = retried_lines(&log, from);
        ensure!(calls > 0, "no STATUS call during the rewrites");
        println!(
            "    10 config rewrites by install.sh ({} inodes) and 40 in-place rewrites of {} \
             (150 ms empty each): {calls} STATUS calls, {retried} of them met the empty file and \
             passed on the second probe, Node Ready at all {n} samples over {:.1} s",
            inodes.len(),
            self.overlay().conf_name(),
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// The daemon SIGKILLed (its socket stays) and left down 12 s, started, SIGTERMed and left
    /// down 12 s, started again: Ready at every sample, STATUS calls going on throughout.
    fn daemon_restarts(&mut self, watch: &ReadyWatch) -> Result<()> {
        let log = self.plexus_log();
        let from = file_len(&log);
        let t0 = Instant::now();
        self.daemon.take().context("no daemon")?.kill();
        ensure!(self.socket().exists(), "a killed daemon leaves its socket");
        let down = file_len(&log);
        std::thread::sleep(Duration::from_secs(12));
        let while_killed = status_lines(&log, down).0;
        self.start_daemon()?;
        std::thread::sleep(Duration::from_secs(6));
        self.daemon.take().context("no daemon")?.stop();
        let down = file_len(&log);
        std::thread::sleep(Duration::from_secs(12));
        let while_stopped = status_lines(&log, down).0;
        self.start_daemon()?;
        std::thread::sleep(Duration::from_secs(6));
        let n = watch.ready_throughout(t0, "the daemon restarts")?;
        ensure!(
            while_killed > 0 && while_stopped > 0,
            "STATUS was not called while the daemon was down ({while_killed} killed, \
             {while_stopped} stopped)"
        );
        println!(
            "    daemon SIGKILLed 12 s ({while_killed} STATUS calls meanwhile), restarted, \
             SIGTERMed 12 s ({while_stopped}), restarted: {} STATUS calls, Node Ready at all {n} \
             samples",
            status_lines(&log, from).0
        );
        Ok(())
    }

    /// The daemon frozen (SIGSTOP) for 15 s: its socket still takes connections, nothing
    /// answers. STATUS goes on being answered (it never asks the daemon; forwarded, it would
    /// wait for good and the runtime's STATUS with it), Ready at every sample.
    fn daemon_frozen(&mut self, watch: &ReadyWatch) -> Result<()> {
        let pid = daemon_pid(&self.socket())?;
        let log = self.plexus_log();
        let from = file_len(&log);
        let t0 = Instant::now();
        let signal = |sig: &str| -> Result<()> {
            let ok = Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()?
                .success();
            ensure!(ok, "kill {sig} {pid}");
            Ok(())
        };
        signal("-STOP")?;
        // One call by hand too, as libcni makes it: plexus-shim with the 1.1.0 plugin config.
        std::thread::sleep(Duration::from_secs(2));
        let by_hand = run_status(
            &self.node.node.bin_dir().join("plexus-shim"),
            &self.node.node.bin_dir(),
            &self.plugin_config("1.1.0")?,
        );
        std::thread::sleep(Duration::from_secs(13));
        let (during, _) = status_lines(&log, from);
        signal("-CONT")?;
        let (ok, ms, out) = by_hand?;
        ensure!(ok, "STATUS by hand while the daemon was frozen: {out}");
        std::thread::sleep(Duration::from_secs(3));
        let n = watch.ready_throughout(t0, "the frozen daemon")?;
        ensure!(
            during >= 2,
            "only {during} STATUS calls answered in 15 s while the daemon was frozen"
        );
        println!(
            "    daemon frozen (SIGSTOP) 15 s: {during} STATUS calls answered meanwhile, one by \
             hand through plexus-shim in {ms:.1} ms, Node Ready at all {n} samples"
        );
        Ok(())
    }

    // ------------------------------------------------------------------------- real outages

    /// `break_it` then wait for NotReady with a message holding `words`; `fix` then wait for
    /// Ready. `fix` runs whatever happened.
    fn outage(
        &self,
        watch: &ReadyWatch,
        what: &str,
        words: &[&str],
        break_it: impl FnOnce() -> Result<()>,
        fix: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.outage_timed(watch, what, words, break_it, fix)
            .map(drop)
    }

    /// [`Tier::outage`]; how long NotReady took to show (s).
    fn outage_timed(
        &self,
        watch: &ReadyWatch,
        what: &str,
        words: &[&str],
        break_it: impl FnOnce() -> Result<()>,
        fix: impl FnOnce() -> Result<()>,
    ) -> Result<f64> {
        let (ready, _) = watch.wait_for(true, &[], Duration::from_secs(30))?;
        ensure!(ready.ready);
        break_it()?;
        let down = watch.wait_for(false, words, NODE_REPORTS);
        let fixed = fix();
        let (sample, to_not_ready) = down?;
        fixed?;
        let (_, to_ready) = watch.wait_for(true, &[], NODE_REPORTS)?;
        println!(
            "    {what}: NotReady after {to_not_ready:.1} s with {:?}; Ready again {to_ready:.1} s \
             after the fix",
            sample.message
        );
        Ok(to_not_ready)
    }

    fn plugin_gone(&mut self, watch: &ReadyWatch) -> Result<()> {
        self.plugin_gone_timed(watch).map(drop)
    }

    /// [`Tier::plugin_gone`]; how long NotReady took to show (s).
    fn plugin_gone_timed(&mut self, watch: &ReadyWatch) -> Result<f64> {
        let bin = self.node.node.bin_dir();
        let (from, to) = (bin.join("portmap"), bin.join(".portmap.away"));
        self.outage_timed(
            watch,
            "portmap removed from the CNI bin dir",
            &[
                "plexus-cni-network",
                "default network cbr0",
                "plugin portmap is not installed",
            ],
            || Ok(std::fs::rename(&from, &to)?),
            || Ok(std::fs::rename(&to, &from)?),
        )
    }

    /// CRI-O with [`CRIO_GRACE`]: flannel's portmap gone until CRI-O has seen one STATUS fail
    /// ("will report unhealthy after grace period"), then back: Ready at every sample. Gone for
    /// good: NotReady with plexus' message no sooner than the grace period ("unhealthy beyond
    /// grace period" in CRI-O's log), Ready after the fix.
    fn crio_plugin_gone(&mut self, watch: &ReadyWatch) -> Result<()> {
        let bin = self.node.node.bin_dir();
        let (from, to) = (bin.join("portmap"), bin.join(".portmap.away"));
        let crio_log = self.node.node.path("crio.log");
        watch.wait_for(true, &[], Duration::from_secs(30))?;
        let c0 = file_len(&crio_log);
        let t0 = Instant::now();
        std::fs::rename(&from, &to)?;
        let seen = wait_for("CRI-O's STATUS failing", Duration::from_secs(8), || {
            Ok(log_from(&crio_log, c0).contains("CNI plugin status check failed"))
        });
        let back = std::fs::rename(&to, &from);
        seen?;
        back?;
        let away = t0.elapsed().as_secs_f64();
        // One more poll (every 5 s) finds it back.
        std::thread::sleep(Duration::from_secs(7));
        let n = watch.ready_throughout(t0, "portmap gone for less than the grace period")?;
        println!(
            "    portmap gone {away:.1} s (CRI-O saw STATUS fail once, grace {} s): Node Ready at \
             all {n} samples",
            CRIO_GRACE.as_secs()
        );
        let c1 = file_len(&crio_log);
        let down = self.plugin_gone_timed(watch)?;
        let text = log_from(&crio_log, c1);
        let beyond = text
            .lines()
            .find(|l| l.contains("CNI plugin unhealthy beyond grace period"))
            .context("CRI-O never logged the plugin unhealthy beyond its grace period")?;
        println!("    CRI-O: {}", beyond.trim());
        ensure!(
            down >= CRIO_GRACE.as_secs_f64(),
            "NotReady {down:.1} s after portmap went, within CRI-O's grace period of {} s",
            CRIO_GRACE.as_secs()
        );
        Ok(())
    }

    fn conflist_gone(&mut self, watch: &ReadyWatch) -> Result<()> {
        let primary = self.primary();
        let away = self.node.node.path("10-flannel.conflist.away");
        self.outage(
            watch,
            "flannel's conflist removed",
            &[
                "plexus-cni-network",
                "the cluster network's config",
                "10-flannel.conflist cannot be loaded",
            ],
            || Ok(std::fs::rename(&primary, &away)?),
            || Ok(std::fs::rename(&away, &primary)?),
        )
    }

    /// flannel's conflist rewritten at cniVersion 1.1.0 (atomically): plexus now sends the
    /// cluster network STATUS, and Debian's portmap (CNI up to 1.0.0) in its chain cannot take
    /// it; the error names the plugin and its versions. Its ADD would fail the same way.
    fn delegate_status_fails(&mut self, watch: &ReadyWatch) -> Result<()> {
        let primary = self.primary();
        let original = std::fs::read(&primary)?;
        let mut declared: Value = serde_json::from_slice(&original)?;
        declared["cniVersion"] = json!("1.1.0");
        let tmp = self.node.node.conf_dir().join(".10-flannel.conflist.tmp");
        let put = |bytes: &[u8]| -> Result<()> {
            std::fs::write(&tmp, bytes)?;
            Ok(std::fs::rename(&tmp, &primary)?)
        };
        self.outage(
            watch,
            "flannel's conflist declared 1.1.0 (Debian's portmap in its chain)",
            &[
                "plexus-cni-network",
                "default network cbr0",
                "plugin portmap does not support cniVersion 1.1.0, so it cannot take STATUS",
            ],
            || put(declared.to_string().as_bytes()),
            || put(&original),
        )
    }

    fn indicator_gone(&mut self, watch: &ReadyWatch) -> Result<()> {
        let file = self.indicator();
        let away = self.node.node.path("subnet.env.away");
        ensure!(file.exists(), "{} does not exist", file.display());
        self.outage(
            watch,
            "flannel's subnet.env (the readiness indicator file) removed",
            &[
                "plexus-cni-network",
                "the default network cbr0 is not ready",
                "subnet.env does not exist",
            ],
            || Ok(std::fs::rename(&file, &away)?),
            || Ok(std::fs::rename(&away, &file)?),
        )
    }
}

// ------------------------------------------------------------------------------------ helpers

/// The pid of the plexus daemon serving `socket` (its `--socket` argument).
fn daemon_pid(socket: &Path) -> Result<u32> {
    let want = socket.as_os_str().as_encoded_bytes();
    for e in std::fs::read_dir("/proc")?.filter_map(Result::ok) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.first().is_some_and(|a| a.ends_with(b"plexus-daemon"))
            && args.windows(2).any(|w| w[0] == b"--socket" && w[1] == want)
        {
            return Ok(pid);
        }
    }
    bail!("no plexus-daemon process on {}", socket.display())
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// The log from byte `from` on.
fn log_from(p: &Path, from: u64) -> String {
    let bytes = std::fs::read(p).unwrap_or_default();
    let from = (from as usize).min(bytes.len());
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}

/// STATUS calls logged from byte `from` on (`STATUS done`), and each one's `elapsed_ms`.
fn status_lines(p: &Path, from: u64) -> (usize, Vec<f64>) {
    let text = log_from(p, from);
    let mut n = 0;
    let mut ms = Vec::new();
    for line in text.lines().filter(|l| l.contains("STATUS done")) {
        n += 1;
        if let Some(v) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("elapsed_ms="))
            .and_then(|v| v.parse().ok())
        {
            ms.push(v);
        }
    }
    (n, ms)
}

/// STATUS calls whose first probe failed and the second passed, from byte `from` on.
fn retried_lines(p: &Path, from: u64) -> usize {
    log_from(p, from)
        .lines()
        .filter(|l| l.contains("a transient failure cleared"))
        .count()
}

/// `q`-quantile (nearest rank) of `v` (sorted in place); 0 when empty.
fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Exec `bin` as libcni does for STATUS: (succeeded, wall-clock ms, stdout); an error when it
/// has not answered within 5 s (it is killed then).
fn run_status(bin: &Path, cni_path: &Path, cfg: &Value) -> Result<(bool, f64, String)> {
    let t = Instant::now();
    let mut child = Command::new(bin)
        .env_clear()
        .env("CNI_COMMAND", "STATUS")
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("exec {}", bin.display()))?;
    std::io::Write::write_all(
        child.stdin.as_mut().context("stdin")?,
        cfg.to_string().as_bytes(),
    )?;
    drop(child.stdin.take());
    while child.try_wait()?.is_none() {
        if t.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{} STATUS: no answer within 5 s", bin.display());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let out = child.wait_with_output()?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    Ok((
        out.status.success(),
        ms,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}
