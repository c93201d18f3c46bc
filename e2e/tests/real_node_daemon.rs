//! Node tier, daemon mode, on real cluster networks: a real kubelet and containerd
//! (`plexus_e2e::realk8s::node`) on a real kube-apiserver, the cluster network laid out by
//! `plexus_e2e::realk8s::overlay` (**calico** with the full case list, then **flannel** with the
//! compact one; real_node swaps them), `plexus daemon` first as a process of the node with a
//! kubeconfig from a TokenRequest token for `kube-system/plexus`, after `kubectl apply -k
//! deploy/overlays/daemon` (the base's RBAC + the daemon component's), and plexus installed by
//! `deploy/install.sh` with the command and environment of the install container of the
//! DaemonSet that overlay applied (deploy/components/daemon/plexus-daemon-daemonset.yaml; its
//! `PLEXUS_BINARIES` adds `plexus-shim`, its `PLEXUS_EXTRA_CONFIG` makes `plexus-shim` the
//! config's type and puts `daemonSocket` in it): containerd execs `plexus-shim`.
//!
//! Cases, in order (compact: the ones marked *): * pods with 0, 1 (JSON form) and 3 (comma
//! form) extra networks Running with plexus' network-status, served by the daemon (its metrics
//! count the ADDs); a burst of 20; the daemon stopped (SIGTERM): a pod created then runs
//! through the shim's thin fallback; the daemon started again: pods created after the restart
//! run through the new daemon; * all pods deleted (the ones from before the restart are DELed by
//! the new daemon from their saved plans): nothing left on the node (netns, veth, leases, plans,
//! results, calico ipamhandles and routes, flannel state, iptables rules); a hostPort +
//! bandwidth pod (DNAT and ifb while it runs, gone after); * the daemon **as the DaemonSet's
//! pod** from deploy/ (its containers, mounts, `--host-root /hostroot`, its projected token;
//! host paths mapped to the node's directories): pods get the overlay through it (calico's
//! nodename file and flannel's subnet.env are in none of its mounts: only the host root makes
//! them visible), and nothing is left after delete; pods deleted while the apiserver is stopped
//! (the process daemon again; nothing left once it is back), last: the kubelet's pod watch
//! comes back from an apiserver restart only after its backoff.
//!
//! Skipped (and passing) without `PLEXUS_K8S_BIN`; `PLEXUS_K8S_REQUIRE=1` makes that a failure.

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
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::image;
use plexus_e2e::realk8s::node::{use_containerd, wait_for, Node};
use plexus_e2e::realk8s::node_rig::{
    daemon_run_dir, daemonset_json, import_plexus_image, scrape_metric, selected_overlays,
    stop_tier, DaemonOpts, InstallSh, OverlayNode, PlexusDaemon, DAEMON_OVERLAY, PLEXUS_NAMESPACE,
};
use plexus_e2e::realk8s::overlay::{Kind, Overlay};
use plexus_e2e::realk8s::overlay_hostroot::SharedHostRoot;
use plexus_e2e::realk8s::rig::{plexus_token, PlexusToken, Rig};
use plexus_e2e::realk8s::runtime_log;
use plexus_e2e::realk8s::runtimes::Containerd;
use plexus_e2e::realk8s::{
    control_plane_or_skip, free_port, setup_or_report, ControlPlane, Proc, Suite,
};
use serde_json::{json, Value};

use api::Api;
use leftovers::{wait_clean, Seen};
use pods::{
    address, create_and_wait, delete_and_wait, dnat_rules, ensure_host_port_answers,
    ensure_host_port_gone, ensure_no_address_answers, hostport_manifest, ifb_links, manifest,
    median, network_status, pings, wait_until_plexus_is_in_the_path,
};

const NS: &str = "app";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let mut suite = Suite::new("real_node_daemon");
    // No controller-manager: the namespaces' default ServiceAccount and CA ConfigMap.
    let rig = Rig::builder().namespaces(&[NS, "default"]).build(&cp);
    let Some(_rig) = setup_or_report("real_node_daemon", &cp, rig) else {
        return ExitCode::FAILURE;
    };
    let overlays = selected_overlays(&[(Kind::Calico, 241, true), (Kind::Flannel, 245, false)]);
    if !each_node(&cp, &mut suite, &overlays, run_cases) {
        return ExitCode::FAILURE;
    }
    // The compatibility tier: Debian's containerd 1.6, compact: daemon mode on calico here,
    // thin mode on flannel in real_node (the CI budget).
    use_containerd(Containerd::V1_6);
    let compat = selected_overlays(&[(Kind::Calico, 249, false)]);
    if !each_node(&cp, &mut suite, &compat, |s, t, _| compat_cases(s, t)) {
        return ExitCode::FAILURE;
    }
    use_containerd(Containerd::V2);
    suite.finish()
}

/// For each of `overlays` (kind, pod-range octet, full case list): a node started, `cases` run
/// on it, the node stopped ([`stop_tier`]); false (reported) when a node could not start.
fn each_node(
    cp: &ControlPlane,
    suite: &mut Suite,
    overlays: &[(Kind, u8, bool)],
    cases: impl Fn(&mut Suite, &mut Tier<'_>, bool),
) -> bool {
    for &(kind, octet, full) in overlays {
        let started = Tier::start(cp, kind, octet);
        let Some(mut tier) = setup_or_report("real_node_daemon", cp, started) else {
            return false;
        };
        cases(suite, &mut tier, full);
        stop_tier(
            tier.daemon.take(),
            tier.installer.take(),
            &mut tier.overlay,
            &mut tier.node,
        );
    }
    true
}

/// containerd 1.6's cases on one overlay: the daemon installed, pods served by it (every
/// network, network-status), containerd restarted and pods served again, then every pod
/// deleted with nothing left.
fn compat_cases(suite: &mut Suite, tier: &mut Tier<'_>) {
    assert_eq!(tier.node.containerd_line(), Containerd::V1_6);
    let k = tier.overlay.kind().name();
    let name = |c: &str| format!("{k}/containerd_1_6/{c}");
    let installed = tier.install();
    let ok = installed.is_ok();
    suite.case(&name("daemon_started_and_install_sh_run"), || installed);
    if !ok {
        return;
    }
    suite.case(
        &name("pods_running_with_network_status_served_by_the_daemon"),
        || tier.batch("before", 3, 3),
    );
    suite.case(
        &name("containerd_restarted_pods_created_after_it_served_by_the_daemon"),
        || {
            tier.node.restart_containerd()?;
            tier.batch("after", 2, 2)
        },
    );
    suite.case(&name("every_pod_deleted_nothing_left_on_the_node"), || {
        tier.delete_all()
    });
}

/// The cases on one overlay, in order; `full`: all of them, else the compact list.
fn run_cases(suite: &mut Suite, tier: &mut Tier<'_>, full: bool) {
    let k = tier.overlay.kind().name();
    let name = |c: &str| format!("{k}/{c}");
    let installed = tier.install();
    let ok = installed.is_ok();
    if let Err(e) = &installed {
        eprintln!("real_node_daemon: {k}: install failed: {e:#}");
    }
    suite.case(
        &name("daemon_started_and_install_sh_run_with_the_daemon_daemonsets_environment"),
        || installed,
    );
    if !ok {
        return;
    }
    suite.case(
        &name("pods_running_with_network_status_served_by_the_daemon"),
        || tier.batch("before", 3, 3),
    );
    if full {
        suite.case(&name("burst_of_20_pods_served_by_the_daemon"), || {
            tier.batch("burst", 20, 20)
        });
        suite.case(
            &name("daemon_stopped_a_pod_runs_through_the_thin_fallback"),
            || {
                tier.stop_daemon()?;
                tier.batch("down", 1, 0)
            },
        );
        suite.case(&name("daemon_restarted_pods_created_after_it_run"), || {
            tier.start_daemon()?;
            tier.batch("after", 2, 2)
        });
    }
    suite.case(&name("every_pod_deleted_nothing_left_on_the_node"), || {
        tier.delete_all()
    });
    if full {
        suite.case(&name("timings_through_the_daemon"), || tier.timings());
        suite.case(
            &name("host_port_and_bandwidth_through_the_daemon_gone_after"),
            || tier.host_port_and_bandwidth(),
        );
    }
    suite.case(
        &name("daemon_as_the_daemonsets_pod_runs_delegates_in_the_host_root"),
        || tier.daemon_pod(),
    );
    if full {
        // Last: after an apiserver restart the kubelet's pod watch is back only after its
        // reflector's backoff (seen: 39 s), and a pod created meanwhile waits for it (the
        // DaemonSet's pod was "Ready 43.7 s after create" when this case came before it).
        suite.case(
            &name("pods_deleted_while_the_apiserver_is_stopped_nothing_left_after"),
            || tier.deleted_while_apiserver_down(),
        );
    }
}

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// A short unique link name (at most 15 bytes).
fn link(suffix: &str) -> String {
    format!("pxd{}{suffix}", std::process::id() % 100_000)
}

/// A pod the tier created and still holds.
struct Placed {
    batch: String,
    name: String,
    netns: String,
}

struct Tier<'a> {
    cp: &'a ControlPlane,
    node: Node<'a>,
    api: Api,
    daemon: Option<PlexusDaemon>,
    installer: Option<Proc>,
    metrics_port: u16,
    /// The cluster network.
    overlay: Overlay,
    /// The plexus binary, resolved once (a source edited mid-run must not fail a restart).
    plexus: PathBuf,
    bridges: Vec<String>,
    pods: Vec<Placed>,
    /// Pods' eth0 addresses that must stop answering once every pod is deleted.
    addresses: Vec<String>,
    /// Every sandbox ID and pod netns path seen (leak checks after their pods are gone).
    seen: Seen,
}

impl<'a> Tier<'a> {
    fn start(cp: &'a ControlPlane, kind: Kind, octet: u8) -> Result<Tier<'a>> {
        let k = kind.name();
        let bridges = vec![
            link(&format!("{}a", &k[..1])),
            link(&format!("{}b", &k[..1])),
            link(&format!("{}c", &k[..1])),
        ];
        let OverlayNode { node, overlay } = OverlayNode::start(
            cp,
            kind,
            octet,
            &link(&k[..1]),
            &format!("plexus-dnode-{k}"),
            &bridges,
        )?;
        let api = Api::new(&cp.admin_kubeconfig())?;
        Ok(Tier {
            cp,
            node,
            api,
            daemon: None,
            installer: None,
            metrics_port: free_port()?,
            overlay,
            plexus: common::bin("plexus"),
            bridges,
            pods: Vec::new(),
            addresses: Vec::new(),
            seen: Seen::default(),
        })
    }

    /// The socket's directory: under the host's /run, which the daemon pod mounts (as deployed).
    fn run_dir(&self) -> PathBuf {
        daemon_run_dir(&self.node)
    }

    fn socket(&self) -> PathBuf {
        self.run_dir().join("plexus.sock")
    }

    /// What the installer adds to the config besides the DaemonSet's `PLEXUS_EXTRA_CONFIG`:
    /// the socket and plans dir of this node, and a `nadPolicy` allowing its IPAM dir (the
    /// NADs' `dataDir`) (no `retryDeleteOnError`, with calico either: see real_node).
    fn extra_config(&self, mut extra: Value) -> Value {
        extra["daemonSocket"] = json!(self.socket());
        extra["cniDir"] = json!(self.node.plexus_dir());
        extra["nadPolicy"] = nad_policy_allowing(&[&self.node.ipam_dir()]);
        extra
    }

    /// Start `plexus-daemon` (the DaemonSet's daemon container runs it) on the node and wait
    /// for its readiness file.
    fn start_daemon(&mut self) -> Result<()> {
        let kubeconfig = self.node.path("daemon.kubeconfig");
        let daemon = PlexusDaemon::start(&DaemonOpts {
            bin: &common::bin("plexus-daemon"),
            socket: &self.socket(),
            kubeconfig: &kubeconfig,
            node: self.node.name(),
            dir: self.node.dir(),
            metrics_port: self.metrics_port,
        })?;
        self.daemon = Some(daemon);
        Ok(())
    }

    /// SIGTERM the daemon; its socket must be gone after.
    fn stop_daemon(&mut self) -> Result<()> {
        self.daemon.take().context("daemon not running")?.stop();
        ensure!(!self.socket().exists(), "socket left after SIGTERM");
        Ok(())
    }

    /// One value of the daemon's `/metrics` (sum over the series matching all of `labels`).
    fn metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        scrape_metric(self.metrics_port, name, labels)
    }

    /// `kubectl apply -k deploy/overlays/daemon` (the base, the daemon's RBAC, its DaemonSet),
    /// the daemon's kubeconfig, the daemon, then install.sh with the daemon DaemonSet's
    /// installer command and environment; wait until the config is in place.
    fn install(&mut self) -> Result<()> {
        let cp = self.cp;
        let overlay = cp.apply_kustomization(DAEMON_OVERLAY)?;
        ensure!(
            overlay.namespace()? == PLEXUS_NAMESPACE,
            "{DAEMON_OVERLAY} installs into {}, the tier expects {PLEXUS_NAMESPACE}",
            overlay.namespace()?
        );
        let token = plexus_token(cp, &PlexusToken::Unbound)?;
        cp.write_kubeconfig(&self.node.path("daemon.kubeconfig"), &token)?;
        self.start_daemon()?;

        let ds = daemonset_json(cp, "kube-plexus-daemon")?;
        let containers = ds["spec"]["template"]["spec"]["containers"]
            .as_array()
            .context("containers")?;
        let daemon = containers
            .iter()
            .find(|c| c["name"] == "plexus-daemon")
            .context("no plexus-daemon container")?;
        ensure!(
            daemon["command"][0] == "/usr/src/plexus/bin/plexus-daemon"
                && daemon["command"][1] == "--socket"
                && daemon["command"][2] == "/run/plexus/plexus.sock",
            "the daemon container does not run plexus-daemon on the socket the shim uses: {}",
            daemon["command"]
        );
        let c = containers
            .iter()
            .find(|c| c["name"] == "install-plexus")
            .context("no install-plexus container")?;
        let install = InstallSh::from_container(c)?;
        ensure!(
            install.extra["daemonSocket"] == "/run/plexus/plexus.sock",
            "the DaemonSet's installer does not select daemon mode: {}",
            install.extra
        );
        // Host paths mapped to the node's directories: the socket and the plans dir.
        let extra = self.extra_config(install.extra.clone());
        let binaries = [
            ("plexus", self.plexus.clone()),
            ("plexus-shim", common::bin("plexus-shim")),
            ("sriov", common::bin("sriov")),
        ];
        self.installer = Some(install.spawn(cp, &self.node, &token, &binaries, &extra)?);
        let log = self.node.path("installer.log");
        let ready = InstallSh::ready_file(&self.node);
        wait_for(
            "the installer's ready file",
            Duration::from_secs(60),
            || Ok(ready.exists()),
        )
        .with_context(|| plexus_e2e::realk8s::tail(&log, 20))?;
        // A conflist whatever the primary's version: it carries `cniVersions` (install.sh).
        let final_conf = self.node.conf_dir().join("00-plexus.conflist");
        let conf: Value = serde_json::from_slice(&std::fs::read(&final_conf)?)?;
        let plugin = &conf["plugins"][0];
        ensure!(
            plugin["type"] == "plexus-shim" && plugin["daemonSocket"] == json!(self.socket()),
            "{conf}"
        );
        ensure!(plugin["daemonUnavailable"] == "thin", "{conf}");
        ensure!(plugin["kubeconfig"].is_string(), "{conf}");

        let ipam = |subnet: &str| json!({"type":"host-local","dataDir":self.node.ipam_dir(),"ranges":[[{"subnet":subnet}]]});
        for (i, name) in ["br-a", "br-b", "br-c"].into_iter().enumerate() {
            let cfg = json!({"cniVersion":"1.0.0","name":name,"type":"bridge",
                "bridge":self.bridges[i],"ipam":ipam(&format!("10.246.{}.0/24", i + 1))});
            let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":{"name":name,"namespace":NS},"spec":{"config":cfg.to_string()}});
            cp.apply(&nad.to_string())?;
        }
        wait_until_plexus_is_in_the_path(&self.api, NS, self.node.name())?;
        self.place("probe", &["probe".to_string()])
    }

    /// Record the sandbox and netns of running pods of `batch`.
    fn place(&mut self, batch: &str, names: &[String]) -> Result<()> {
        for name in names {
            let (sandbox, netns) = self.seen.pod_netns(&self.api, &self.node, NS, name)?;
            self.seen.sandboxes.push(sandbox);
            self.pods.push(Placed {
                batch: batch.into(),
                name: name.clone(),
                netns,
            });
        }
        Ok(())
    }

    /// `n` pods, in turn with 3 extra networks (comma form), none, and 1 (JSON form)
    /// (`daemon_adds`: how many ADDs the daemon must have served for them; 0 when it is stopped).
    fn batch(&mut self, batch: &str, n: usize, daemon_adds: usize) -> Result<()> {
        let before = if self.daemon.is_some() {
            self.metric("plexus_cni_requests_total", &["ADD", "ok"])?
        } else {
            0.0
        };
        let names: Vec<String> = (0..n).map(|i| format!("{batch}-{i}")).collect();
        let forms = [
            Some(json!("br-a, br-b@data1, app/br-c")),
            None,
            Some(json!([{"name": "br-a"}])),
        ];
        let manifests: Vec<Value> = names
            .iter()
            .enumerate()
            .map(|(i, name)| manifest(NS, name, self.node.name(), batch, forms[i % 3].as_ref()))
            .collect();
        let t = create_and_wait(&self.api, &manifests, Duration::from_secs(60))
            .with_context(|| self.node.logs(10))?;
        println!("    {batch}: {n} pods Running, ms {t:.0?}");
        self.place(batch, &names)?;
        for (i, name) in names.iter().enumerate() {
            let pod = self.api.get_pod(NS, name)?.context("pod")?;
            let st = network_status(&pod)?;
            let want = [4, 1, 2][i % 3];
            ensure!(st.len() == want, "{name}: network-status {st:?}");
            ensure!(
                st[0]["default"] == true && st[0]["name"] == self.overlay.network_name(),
                "{name}: {st:?}"
            );
            if want >= 2 {
                ensure!(
                    st[1]["name"] == "app/br-a" && st[1]["interface"] == "net1",
                    "{name}: {st:?}"
                );
            }
            if want == 4 {
                ensure!(
                    st[2]["interface"] == "data1"
                        && st[3]["name"] == "app/br-c"
                        && st[3]["interface"] == "net3",
                    "{name}: {st:?}"
                );
            }
        }
        self.traffic(batch, &names)?;
        if self.daemon.is_some() {
            let served = self.metric("plexus_cni_requests_total", &["ADD", "ok"])? - before;
            ensure!(
                served >= daemon_adds as f64,
                "the daemon served {served} ADDs for {n} new pods"
            );
        }
        // With the daemon stopped, the 4 entries above can only come from the shim's thin fallback.
        Ok(())
    }

    /// Packets across a batch's pods (3 extra networks, none, 1): eth0 pod <-> pod over the
    /// overlay and pod -> node, net1 pod <-> pod on the bridge NAD; their eth0 addresses are
    /// kept for the after-delete check.
    fn traffic(&mut self, batch: &str, names: &[String]) -> Result<()> {
        let netns = |name: &str| -> Result<String> {
            self.pods
                .iter()
                .find(|p| p.batch == batch && p.name == name)
                .map(|p| p.netns.clone())
                .with_context(|| format!("{name} not placed"))
        };
        for name in names {
            self.addresses.push(address(&netns(name)?, "eth0")?);
        }
        if names.len() < 3 {
            return Ok(());
        }
        let (a, b, c) = (netns(&names[0])?, netns(&names[1])?, netns(&names[2])?);
        let pairs = [
            (&a, &b, "eth0"),
            (&b, &a, "eth0"),
            (&a, &c, "net1"),
            (&c, &a, "net1"),
        ];
        for (from, to, ifname) in pairs {
            let addr = address(to, ifname)?;
            ensure!(
                pings(Some(from), &addr),
                "{batch}: {from} -> {addr} over {ifname}: no answer"
            );
        }
        let node_ip = self.node.ip().to_string();
        ensure!(
            pings(Some(&b), &node_ip),
            "{batch}: pod -> the node ({node_ip}): no answer"
        );
        Ok(())
    }

    /// Delete every pod; the daemon DELs them (the pre-restart ones from their plans).
    fn delete_all(&mut self) -> Result<()> {
        let before = self.metric("plexus_cni_requests_total", &["DEL", "ok"])?;
        let mut batches: Vec<String> = self.pods.iter().map(|p| p.batch.clone()).collect();
        batches.dedup();
        for b in &batches {
            let (names, netns): (Vec<String>, Vec<String>) = self
                .pods
                .iter()
                .filter(|p| &p.batch == b)
                .map(|p| (p.name.clone(), p.netns.clone()))
                .unzip();
            delete_and_wait(&self.api, NS, b, &names, &netns, Duration::from_secs(60))?;
        }
        let dels = self.metric("plexus_cni_requests_total", &["DEL", "ok"])? - before;
        ensure!(
            dels >= self.pods.len() as f64,
            "the daemon served {dels} DELs for {} pods",
            self.pods.len()
        );
        self.pods.clear();
        wait_clean(Duration::from_secs(10), || self.leftovers())?;
        ensure_no_address_answers(&std::mem::take(&mut self.addresses))?;
        Ok(())
    }

    /// Forget batch `batch`'s placed pods (the caller deletes them); their netns paths.
    fn take_batch(&mut self, batch: &str) -> Vec<String> {
        let (mine, rest): (Vec<Placed>, Vec<Placed>) = std::mem::take(&mut self.pods)
            .into_iter()
            .partition(|p| p.batch == batch);
        self.pods = rest;
        mine.into_iter().map(|p| p.netns).collect()
    }

    /// Daemon-mode timing (benchmark output, not a timed test): 10 pods one after another and
    /// 10 at once, no extra network, every CNI call through the shim and the daemon; medians
    /// printed as the thin tier's table (`real_node`'s `timings_with_plexus`). Nothing left after.
    fn timings(&mut self) -> Result<()> {
        // Run alone (a filter), the install's probe pod still runs: delete it first.
        if !self.pods.is_empty() {
            self.delete_all()?;
        }
        let wait = Duration::from_secs(60);
        let (mut seq_create, mut seq_delete) = (Vec::new(), Vec::new());
        for i in 0..10 {
            let batch = format!("tseq{i}");
            let names = vec![format!("{batch}-0")];
            let m = manifest(NS, &names[0], self.node.name(), &batch, None);
            seq_create.extend(create_and_wait(&self.api, &[m], wait)?);
            self.place(&batch, &names)?;
            let netns = self.take_batch(&batch);
            seq_delete.extend(delete_and_wait(
                &self.api, NS, &batch, &names, &netns, wait,
            )?);
        }
        let names: Vec<String> = (0..10).map(|i| format!("tburst-{i}")).collect();
        let manifests: Vec<Value> = names
            .iter()
            .map(|n| manifest(NS, n, self.node.name(), "tburst", None))
            .collect();
        let burst_create = create_and_wait(&self.api, &manifests, wait)?;
        self.place("tburst", &names)?;
        let netns = self.take_batch("tburst");
        let burst_delete = delete_and_wait(&self.api, NS, "tburst", &names, &netns, wait)?;
        let log = std::fs::read_to_string(self.node.path("containerd.log"))?;
        let (run, teardown) = runtime_log::sandbox_times(&log, "tseq");
        let k = self.overlay.kind().name();
        println!("\n    {k}, daemon mode: create→Running / delete→gone, medians in ms (real kubelet + containerd):");
        println!("    | config | 10 one after another: create→Running | delete→gone | 10 at once: create→Running | delete→gone |");
        println!("    |---|---|---|---|---|");
        println!(
            "    | plexus-daemon (shim → daemon), no extra network | {:.0} | {:.0} | {:.0} | {:.0} |",
            median(&seq_create),
            median(&seq_delete),
            median(&burst_create),
            median(&burst_delete)
        );
        println!("\n    inside containerd, one pod at a time (medians in ms, from its log):");
        println!("    | config | RunPodSandbox (CNI ADD inside) | StopPodSandbox → network torn down (CNI DEL) |");
        println!("    |---|---|---|");
        println!(
            "    | plexus-daemon (shim → daemon), no extra network | {:.0} | {:.0} |",
            median(&run),
            median(&teardown)
        );
        let t0 = std::time::Instant::now();
        let r = wait_for("nothing left on the node", Duration::from_secs(10), || {
            Ok(self.leftovers().is_empty())
        });
        println!(
            "    clean {:.1} s after the last delete",
            t0.elapsed().as_secs_f64()
        );
        r.with_context(|| format!("left: {:?}", self.leftovers()))
    }

    /// A pod with a `hostPort`, bandwidth annotations and 1 NAD through the daemon: portmap's
    /// DNAT and (calico's chain has `bandwidth`) an ifb while it runs, neither after delete.
    fn host_port_and_bandwidth(&mut self) -> Result<()> {
        let port = free_port()?;
        let m = hostport_manifest(NS, self.node.name(), port);
        let ifb_before = ifb_links();
        let served = self.metric("plexus_cni_requests_total", &["ADD", "ok"])?;
        create_and_wait(&self.api, &[m], Duration::from_secs(60))
            .with_context(|| self.node.logs(10))?;
        self.place("hostport", &["hostport".to_string()])?;
        let checked = (|| {
            ensure!(
                self.metric("plexus_cni_requests_total", &["ADD", "ok"])? > served,
                "not served by the daemon"
            );
            let dnat = dnat_rules(port);
            ensure!(!dnat.is_empty(), "no DNAT rule for hostPort {port}");
            let ifbs: Vec<String> = ifb_links().difference(&ifb_before).cloned().collect();
            ensure!(
                !self.overlay.has_bandwidth() || ifbs.iter().any(|i| i.starts_with("bwp")),
                "no bandwidth ifb (have {ifbs:?})"
            );
            println!("    hostPort {port}: {}; ifb {ifbs:?}", dnat[0]);
            // The node's address and the hostPort reach a listener inside the pod.
            let netns = self
                .pods
                .last()
                .map(|p| p.netns.clone())
                .context("placed")?;
            let token = format!("plexus-hostport-{port}");
            ensure_host_port_answers(&netns, self.node.ip(), port, &token)?;
            if self.overlay.has_bandwidth() {
                // The shaping, by packets: 10 Mbit/s asked out of the pod, the steady rate once
                // the runtime's burst is through.
                let node: std::net::IpAddr = self.node.ip().parse()?;
                let rate = common::transfer::steady_shaped_rate(
                    None,
                    std::net::SocketAddr::new(node, 0),
                    Some(std::path::Path::new(&netns)),
                    10e6,
                    Duration::from_secs(90),
                )
                .context("pod -> node, shaped")?;
                println!(
                    "    pod -> node: {:.1} Mbit/s once the burst is through (asked 10)",
                    rate / 1e6
                );
                ensure!(
                    (8e6..=12e6).contains(&rate),
                    "egress shaped to {:.1} Mbit/s, asked 10 (±20 %)",
                    rate / 1e6
                );
            }
            Ok(())
        })();
        let deleted = self.delete_all();
        checked?;
        deleted?;
        ensure_host_port_gone(self.node.ip(), port, &ifb_before)
    }

    /// Two pods (1 and 3 extra networks) deleted, their teardown (the daemon's DEL) coming while
    /// the apiserver is stopped: calico's DEL fails until it is back (retried), then the pods
    /// are gone and nothing is left.
    fn deleted_while_apiserver_down(&mut self) -> Result<()> {
        /// Longer than stopping the apiserver takes (`stop_apiserver` kills it 2 s after
        /// SIGTERM), so the teardown surely comes after.
        const GRACE: u64 = 6;
        // After the DaemonSet's pod case the process daemon serves the node again.
        if self.daemon.is_none() {
            self.metrics_port = free_port()?;
            self.start_daemon()?;
        }
        let names = ["apidown-1".to_string(), "apidown-3".to_string()];
        let nets = [json!([{"name": "br-a"}]), json!("br-a, br-b, br-c")];
        let manifests: Vec<Value> = names
            .iter()
            .zip(&nets)
            .map(|(n, nets)| {
                let mut m = manifest(NS, n, self.node.name(), "apidown", Some(nets));
                m["spec"]["terminationGracePeriodSeconds"] = json!(GRACE);
                m["spec"]["containers"][0]["command"] = json!(["/pause", "ignore-sigterm"]);
                m
            })
            .collect();
        create_and_wait(&self.api, &manifests, Duration::from_secs(60))?;
        self.place("apidown", &names)?;
        let netns: Vec<String> = self
            .pods
            .iter()
            .filter(|p| p.batch == "apidown")
            .map(|p| p.netns.clone())
            .collect();
        for n in &names {
            self.api.delete_pod(NS, n)?;
        }
        let kubelet_log = self.node.path("kubelet.log");
        wait_for(
            "the kubelet killing both pods",
            Duration::from_secs(10),
            || {
                let log = std::fs::read_to_string(&kubelet_log)?;
                Ok(names.iter().all(|n| {
                    log.lines().any(|l| {
                        l.contains("Killing container with a grace period")
                            && l.contains(&format!("pod=\"{NS}/{n}\""))
                    })
                }))
            },
        )?;
        self.cp.stop_apiserver();
        let stopped = std::time::Instant::now();
        ensure!(
            netns.iter().all(|n| Path::new(n).exists()),
            "torn down before the apiserver was stopped: nothing tested"
        );
        // Down until the daemon has answered a DEL of each pod (the teardown after the grace
        // period; calico's fails without the API), not a fixed time. The log is the daemon
        // process' (this case runs after the DaemonSet's pod case, see run_cases).
        let daemon_log = self.node.path("daemon.log");
        let deleted = wait_for(
            "a DEL of each pod with the apiserver stopped",
            Duration::from_secs(GRACE + 20),
            || {
                let log = std::fs::read_to_string(&daemon_log)?;
                // Failed (logged with the pod's name), or done (its netns then gone).
                Ok(names.iter().zip(&netns).all(|(n, ns)| {
                    !Path::new(ns).exists()
                        || log.lines().any(|l| {
                            l.contains("CNI call failed") && l.contains(&format!("pod {NS}/{n},"))
                        })
                }))
            },
        );
        let gone_while_down = netns.iter().all(|n| !Path::new(n).exists());
        self.cp.start_apiserver()?;
        deleted?;
        println!(
            "    {:.1} s after the apiserver stopped: netns {}",
            stopped.elapsed().as_secs_f64(),
            if gone_while_down {
                "gone"
            } else {
                "still there (DEL retried)"
            }
        );
        wait_for("the pods gone", Duration::from_secs(90), || {
            Ok(self.api.list_pods(NS, "apidown")?.is_empty()
                && netns.iter().all(|n| !Path::new(n).exists()))
        })?;
        self.pods.retain(|p| p.batch != "apidown");
        // The netns files are gone; the kernel frees a namespace (and calico's host veth and
        // /32 route with it) from a work queue, which on a loaded 2-core machine was seen to
        // take over 30 s: wait longer than that before calling a route a leak.
        wait_clean(Duration::from_secs(90), || self.leftovers())
    }

    /// The daemon DaemonSet's pod, as the DaemonSet controller would create it on this node:
    /// its template from the apiserver (both containers, every mount, `--host-root
    /// /hostroot`), `spec.nodeName` set, host paths mapped to the node's directories (a
    /// same-path mount stays same-path), the socket and metrics port of this tier, the API
    /// address. The image (`plexus:<version>`, as deploy/settings names it) is built from the host
    /// (image::plexus_image). The
    /// process daemon is stopped first: pods then get the overlay only through the pod's
    /// daemon, whose delegates must find files that none of its mounts holds (calico's nodename
    /// file, flannel's subnet.env and state, host-local's leases: all under the node's dir).
    fn daemon_pod(&mut self) -> Result<()> {
        if self.daemon.is_some() {
            self.stop_daemon()?;
        }
        let tar = image::plexus_image(
            &self.node.path("plexus-image"),
            &repo("deploy/install.sh"),
            &[
                ("plexus", self.plexus.clone()),
                ("plexus-shim", common::bin("plexus-shim")),
                ("plexus-daemon", common::bin("plexus-daemon")),
                ("sriov", common::bin("sriov")),
            ],
        )?;
        let cp = self.cp;
        // The DaemonSet as `kubectl apply -k deploy/overlays/daemon` stored it: its image is
        // deploy/settings' `plexus:<version>`.
        let ds = daemonset_json(cp, "kube-plexus-daemon")?;
        import_plexus_image(&self.node, &tar, &ds)?;
        cp.create_namespace(PLEXUS_NAMESPACE)?;
        // These kube-apiserver binaries also project this ConfigMap into every token volume.
        let ca = json!({"apiVersion":"v1","kind":"ConfigMap",
            "metadata":{"name":"openshift-service-ca.crt","namespace":PLEXUS_NAMESPACE},
            "data":{"service-ca.crt": cp.ca_pem()}});
        cp.apply(&ca.to_string())?;
        // The pod's `hostPath: /` and `/run` (HostToContainer) need a shared source.
        let host_root = SharedHostRoot::new(Path::new(&format!(
            "/run/plexus-e2e-{}-root",
            self.node.name()
        )))?;
        // containerd and the kubelet (its hostPath type checks) run in mount namespaces of
        // their own, copied from the host's when they started: a mount made on the host since
        // (the host's `/` is private) never reaches them. Restarted (pods keep running), they
        // copy the shared root as a peer.
        self.node.restart_runtime()?;
        self.node.restart_kubelet()?;
        let pod = self.daemon_pod_manifest(&ds["spec"]["template"], host_root.path())?;
        let name = pod["metadata"]["name"]
            .as_str()
            .context("name")?
            .to_string();
        let name = name.as_str();
        let res = self.run_daemon_pod(&pod, name);
        // The pod gone before its host root is taken away.
        let _ = self.api.delete_pod(PLEXUS_NAMESPACE, name);
        let gone = wait_for("the daemon pod gone", Duration::from_secs(60), || {
            Ok(self.api.get_pod(PLEXUS_NAMESPACE, name)?.is_none())
        });
        drop(host_root);
        res.and(gone)
    }

    /// Create the daemon pod, wait Ready, run pods through it, delete them.
    fn run_daemon_pod(&mut self, pod: &Value, name: &str) -> Result<()> {
        let t0 = std::time::Instant::now();
        self.api.create_pod(pod)?;
        let ready = wait_for("the daemon pod Ready", Duration::from_secs(90), || {
            let p = self.api.get_pod(PLEXUS_NAMESPACE, name)?;
            Ok(p.is_some_and(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            }))
        });
        if let Err(e) = ready {
            let p = self.api.get_pod(PLEXUS_NAMESPACE, name)?;
            let evs: Vec<String> = self
                .api
                .events(PLEXUS_NAMESPACE, name)?
                .iter()
                .map(|e| format!("{} {}: {}", e["type"], e["reason"], e["message"]))
                .collect();
            let logs = self.node.container_log(PLEXUS_NAMESPACE, name);
            return Err(e.context(format!(
                "status {}\nevents {evs:#?}\nlogs:\n{logs}",
                p.map(|p| p["status"].clone()).unwrap_or_default()
            )));
        }
        println!(
            "    the daemon DaemonSet's pod Ready {:.1} s after create",
            t0.elapsed().as_secs_f64()
        );
        self.batch("dspod", 3, 3)?;
        self.delete_all()?;
        let logs = self.node.container_log(PLEXUS_NAMESPACE, name);
        ensure!(
            logs.contains("delegates run chrooted into the host root"),
            "the pod's daemon does not chroot its delegates:\n{logs}"
        );
        Ok(())
    }

    /// The pod of the DaemonSet template `tpl` on this node (see [`Tier::daemon_pod`]).
    fn daemon_pod_manifest(&mut self, tpl: &Value, host_root: &Path) -> Result<Value> {
        let mut spec = tpl["spec"].clone();
        spec["nodeName"] = json!(self.node.name());
        let multus = self.node.path("multus-net.d");
        std::fs::create_dir_all(&multus)?;
        std::fs::create_dir_all(self.run_dir())?;
        // hostPath → the node's directory (None: keep, e.g. / and /run).
        let map = |host: &str| -> Result<Option<PathBuf>> {
            Ok(match host {
                "/opt/cni/bin" => Some(self.node.bin_dir()),
                "/etc/cni/net.d" => Some(self.node.conf_dir()),
                "/etc/cni/multus/net.d" => Some(multus.clone()),
                // The daemon's plans (cniDir /var/lib/cni/plexus as deployed).
                "/var/lib/cni" => Some(self.node.plexus_dir()),
                "/var/lib/kubelet/pod-resources" => {
                    Some(self.node.path("kubelet/root/pod-resources"))
                }
                "/" => Some(host_root.to_path_buf()),
                "/run" => Some(host_root.join("run")),
                other => anyhow::bail!("unexpected hostPath {other} in the daemon DaemonSet"),
            })
        };
        let mut moved = std::collections::BTreeMap::new();
        for v in spec["volumes"].as_array_mut().context("volumes")? {
            let Some(host) = v["hostPath"]["path"].as_str().map(str::to_string) else {
                continue;
            };
            if let Some(p) = map(&host)? {
                v["hostPath"]["path"] = json!(p);
                moved.insert(v["name"].as_str().unwrap_or("").to_string(), (host, p));
            }
        }
        let port = free_port()?;
        self.metrics_port = port;
        let extra_env = [
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT", self.cp.port().to_string()),
        ];
        for c in spec["containers"].as_array_mut().context("containers")? {
            // A same-path mount stays same-path (the host's / and /run views stay where they are).
            for m in c["volumeMounts"].as_array_mut().into_iter().flatten() {
                if let Some((host, p)) = moved.get(m["name"].as_str().unwrap_or("")) {
                    if m["mountPath"] == json!(host) && host != "/" && host != "/run" {
                        m["mountPath"] = json!(p);
                    }
                }
            }
            let installer = c["name"] == "install-plexus";
            let env = c["env"].as_array_mut().context("env")?;
            for (k, v) in &extra_env {
                env.push(json!({"name": k, "value": v}));
            }
            if installer {
                for e in env.iter_mut() {
                    if e["name"] == "PLEXUS_EXTRA_CONFIG" {
                        let ds: Value = serde_json::from_str(e["value"].as_str().unwrap_or("{}"))?;
                        e["value"] = json!(self.extra_config(ds).to_string());
                    }
                }
                env.push(json!({"name":"PLEXUS_HOST_CONF_DIR","value": self.node.conf_dir()}));
                env.push(json!({"name":"PLEXUS_LOG_FILE","value": self.node.path("plexus.log")}));
            } else {
                let cmd = c["command"].as_array_mut().context("command")?;
                for i in 0..cmd.len() {
                    if cmd[i] == "--socket" {
                        cmd[i + 1] = json!(self.socket());
                    }
                    if cmd[i] == "--metrics-address" {
                        cmd[i + 1] = json!(format!("127.0.0.1:{port}"));
                    }
                }
                ensure!(
                    cmd.iter().any(|a| a == "--host-root"),
                    "the daemon container has no --host-root: {cmd:?}"
                );
                for probe in ["readinessProbe", "livenessProbe"] {
                    if c[probe]["httpGet"].is_object() {
                        c[probe]["httpGet"]["port"] = json!(port);
                    }
                }
            }
        }
        Ok(json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":format!("kube-plexus-daemon-{}", self.overlay.kind().name()),
                        "namespace":PLEXUS_NAMESPACE,
                        "labels": tpl["metadata"]["labels"]},
            "spec": spec}))
    }

    /// Plans and result files, leases, `cni-*` netns, veths on the bridges, libcni cache.
    fn leftovers(&self) -> Vec<String> {
        self.seen
            .leftovers(self.cp, &self.node, &self.overlay, &self.bridges)
    }
}
