//! Node tier: a real kubelet v1.36 and containerd 2.3 (`plexus_e2e::realk8s::node`) registered
//! with a real kube-apiserver, the CNI config and plugins in directories of the node's own, the
//! cluster network a real overlay laid out as its installer does (`plexus_e2e::realk8s::overlay`:
//! flanneld + flannel's `10-flannel.conflist`, then calico + calico-ipam's `10-calico.conflist`
//! with its kubeconfig), and plexus installed the way the DaemonSet does it: every manifest in
//! `deploy/` applied for real, then `deploy/install.sh` run with the DaemonSet's command and
//! environment (token from the TokenRequest API for `kube-system/plexus`; the config generated
//! from the overlay's conflist).
//!
//! **flannel** gets the full case list, **calico** the compact one (real_node_daemon swaps them;
//! the CI budget): both get pods with 0, 1 and 3 extra networks in both annotation forms, a
//! hostPort + bandwidth pod (portmap's DNAT, bandwidth's ifb while it runs, gone after), a burst
//! of 20, deletes while the apiserver is down, version mixes (plexus at CNI 1.1.0: STATUS, GC);
//! flannel also the timing table (create→Running / delete→gone, overlay alone vs plexus vs
//! plexus + 1 NAD; on calico too with `PLEXUS_NODE_TIMINGS=all`), a missing NAD, the installer's SIGTERM, the DaemonSet's own pod and a
//! Multus-style thin config. After every delete: no netns, veth, lease, plan or result-cache
//! file, no calico ipamhandle or /32 route, no flannel per-container state, no iptables rule
//! naming a deleted container.
//!
//! Skipped (and passing) without `PLEXUS_K8S_BIN`; `PLEXUS_K8S_REQUIRE=1` makes that a failure.
//! One control plane, one node per overlay; cases run in order (`cargo test -p plexus-e2e --test
//! real_node -- NAME` runs the cases whose name contains NAME, plus the setup; `calico/…` starts
//! only calico's node).

#[allow(dead_code)]
#[path = "real_node/api.rs"]
mod api;
mod common;
#[allow(dead_code)]
#[path = "real_node/leftovers.rs"]
mod leftovers;
#[path = "real_node/pods.rs"]
mod pods;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::image;
use plexus_e2e::realk8s::node::{cni_netns, use_containerd, wait_for, Node};
use plexus_e2e::realk8s::node_rig::{
    daemonset_json, import_plexus_image, selected_overlays, veth_pair, InstallSh, OverlayNode,
    PLEXUS_NAMESPACE, THIN_OVERLAY,
};
use plexus_e2e::realk8s::overlay::{Kind, Overlay};
use plexus_e2e::realk8s::rig::{plexus_token, PlexusToken, Rig};
use plexus_e2e::realk8s::runtime_log;
use plexus_e2e::realk8s::runtimes::Containerd;
use plexus_e2e::realk8s::{control_plane_or_skip, setup_or_report, ControlPlane, Proc, Suite};
use serde_json::{json, Value};

use api::Api;
use leftovers::{wait_clean, Seen};
use pods::*;

/// A check that sends packets across running pods, given each one's (name, netns), and returns
/// the addresses that must stop answering once they are deleted.
type Traffic<'a> = dyn Fn(&[(String, String)]) -> Result<Vec<String>> + 'a;

/// Namespace of the test pods and most NADs.
const NS: &str = "app";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let mut suite = Suite::new("real_node");
    // No controller-manager: the namespaces' default ServiceAccount and CA ConfigMap.
    let rig = Rig::builder().namespaces(&[NS, "default"]).build(&cp);
    let Some(_rig) = setup_or_report("real_node", &cp, rig) else {
        return ExitCode::FAILURE;
    };
    // The full case list on flannel, a compact one on calico (the daemon tier swaps them); a
    // filter naming one overlay (`calico/…`) starts no node for the other.
    for (kind, octet, full) in
        selected_overlays(&[(Kind::Flannel, 244, true), (Kind::Calico, 240, false)])
    {
        let Some(mut tier) = setup_or_report("real_node", &cp, Tier::start(&cp, kind, octet))
        else {
            return ExitCode::FAILURE;
        };
        run_cases(&mut suite, &mut tier, full);
        tier.overlay.stop();
        tier.node.stop();
        ensure_gone_after_stop(&tier);
        drop(tier);
    }
    // The compatibility tier: Debian's containerd 1.6 (end of life upstream; kubelet 1.36 is
    // the last to support it), compact: thin mode on flannel here, daemon mode on calico in
    // real_node_daemon (the CI budget).
    use_containerd(Containerd::V1_6);
    for (kind, octet, _) in selected_overlays(&[(Kind::Flannel, 246, false)]) {
        let Some(mut tier) = setup_or_report("real_node", &cp, Tier::start(&cp, kind, octet))
        else {
            return ExitCode::FAILURE;
        };
        compat_cases(&mut suite, &mut tier);
        tier.overlay.stop();
        tier.node.stop();
        ensure_gone_after_stop(&tier);
        drop(tier);
    }
    use_containerd(Containerd::V2);
    suite.finish()
}

/// containerd 1.6's cases on one overlay: plexus installed by install.sh, pods with 0, 1 and 3
/// extra networks (traffic on each interface, nothing left after delete), then containerd
/// restarted and the same again.
fn compat_cases(suite: &mut Suite, tier: &mut Tier<'_>) {
    assert_eq!(tier.node.containerd_line(), Containerd::V1_6);
    let k = tier.overlay.kind().name();
    let name = |c: &str| format!("{k}/containerd_1_6/{c}");
    let installed = tier.install();
    let ok = installed.is_ok();
    suite.case(
        &name("install_sh_run_with_the_daemonsets_environment"),
        || installed,
    );
    if !ok {
        return;
    }
    suite.case(
        &name("pods_with_0_1_and_3_extra_networks_traffic_on_each_nothing_left"),
        || tier.extra_networks(),
    );
    suite.case(
        &name("containerd_restarted_then_pods_get_every_network_again"),
        || {
            tier.node.restart_containerd()?;
            tier.extra_networks()
        },
    );
}

/// The cases on one overlay, in order; `full`: all of them, else the compact list.
fn run_cases(suite: &mut Suite, tier: &mut Tier<'_>, full: bool) {
    let k = tier.overlay.kind().name();
    let name = |c: &str| format!("{k}/{c}");
    // The timing table (a benchmark, 60 pods) on the full list's overlay; on every overlay
    // with PLEXUS_NODE_TIMINGS=all.
    let timings = full || std::env::var("PLEXUS_NODE_TIMINGS").is_ok_and(|v| v == "all");
    let mut baseline = None;
    if timings {
        suite.case(&name("timings_with_the_overlay_alone_as_primary"), || {
            baseline = Some(tier.timings("bare", None)?);
            Ok(())
        });
    }
    let installed = tier.install();
    let install_ok = installed.is_ok();
    if let Err(e) = &installed {
        eprintln!("real_node: {k}: install failed: {e:#}");
    }
    suite.case(
        &name("deploy_manifests_applied_and_install_sh_run_with_the_daemonsets_environment"),
        || installed,
    );
    if !install_ok {
        return;
    }
    suite.case(
        &name("pods_with_0_1_and_3_extra_networks_in_both_forms"),
        || tier.extra_networks(),
    );
    suite.case(
        &name("host_port_and_bandwidth_applied_while_running_gone_after"),
        || tier.host_port_and_bandwidth(),
    );
    if full {
        suite.case(
            &name("missing_nad_gives_a_clear_event_and_leaks_nothing"),
            || tier.missing_nad(),
        );
    }
    suite.case(&name("burst_of_20_pods_created_and_deleted"), || {
        tier.burst(20)
    });
    suite.case(&name("pods_deleted_while_the_apiserver_is_stopped"), || {
        tier.deleted_while_apiserver_down()
    });
    suite.case(
        &name("cni_1_1_0_status_and_gc_reach_the_overlay_or_fail_clearly"),
        || tier.version_mixes(),
    );
    if timings {
        suite.case(&name("timings_with_plexus"), || {
            let none = tier.timings("plexus", None)?;
            let one = tier.timings("plexus-1nad", Some(json!("br-a")))?;
            print_timings(k, baseline.as_ref(), &none, &one);
            Ok(())
        });
    }
    if !full {
        suite.case(
            &name("plexus_at_cni_1_1_0_over_the_overlays_0_3_1_conflist"),
            || tier.plexus_at_1_1_0(),
        );
        return;
    }
    suite.case(
        &name("installer_exits_on_sigterm_and_leaves_its_config"),
        || tier.stop_installer(),
    );
    suite.case(
        &name("daemonset_pod_from_deploy_runs_the_installer_on_the_node"),
        || tier.daemonset_pod(),
    );
    suite.case(&name("multus_thin_config_with_a_nameless_delegate"), || {
        tier.multus_thin_config()
    });
}

/// Everything the cases share.
struct Tier<'a> {
    cp: &'a ControlPlane,
    node: Node<'a>,
    api: Api,
    installer: Option<Proc>,
    /// The cluster network.
    overlay: Overlay,
    /// Its network name (the default network's network-status name).
    net: &'static str,
    /// The NADs' bridges (and the multus case's), the macvlan master.
    bridges: Vec<String>,
    master: String,
    /// Every sandbox ID (for the libcni cache check) and pod netns path seen.
    seen: std::cell::RefCell<Seen>,
}

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// A short unique link name (at most 15 bytes).
fn link(suffix: &str) -> String {
    format!("pxn{}{suffix}", std::process::id() % 100_000)
}

impl<'a> Tier<'a> {
    fn start(cp: &'a ControlPlane, kind: Kind, octet: u8) -> Result<Tier<'a>> {
        let k = kind.name();
        let bridges = vec![
            link(&format!("{}a", &k[..1])),
            link(&format!("{}b", &k[..1])),
            link(&format!("{}u", &k[..1])),
        ];
        let master = link(&format!("{}m", &k[..1]));
        let mut links = vec![master.clone()];
        links.extend(bridges.iter().cloned());
        links.push(format!("{master}p"));
        let OverlayNode { node, overlay } = OverlayNode::start(
            cp,
            kind,
            octet,
            &link(&k[..1]),
            &format!("plexus-node-{k}"),
            &links,
        )?;
        // The macvlan master: a veth pair of the test's own.
        veth_pair(&master)?;
        let api = Api::new(&cp.admin_kubeconfig())?;
        Ok(Tier {
            cp,
            node,
            api,
            installer: None,
            net: overlay.network_name(),
            overlay,
            bridges,
            master,
            seen: Default::default(),
        })
    }

    // ------------------------------------------------------------------------------ install

    /// Install plexus as users do, `kubectl apply -k deploy/overlays/thin`, and apply every
    /// manifest in deploy/examples/; then run install.sh as the DaemonSet would, against the
    /// node's directories; wait until a pod gets plexus' status.
    fn install(&mut self) -> Result<()> {
        let cp = self.cp;
        let overlay = cp.apply_kustomization(THIN_OVERLAY)?;
        ensure!(
            overlay.namespace()? == PLEXUS_NAMESPACE,
            "{THIN_OVERLAY} installs into {}, the tier expects {PLEXUS_NAMESPACE}",
            overlay.namespace()?
        );
        let examples = yaml_files(&repo("deploy/examples"))?;
        for f in &examples {
            cp.apply_file(f)
                .with_context(|| format!("kubectl apply -f {}", f.display()))?;
        }
        // The example pod (an SR-IOV device request) cannot run here; no scheduler binds it.
        for f in &examples {
            let text = std::fs::read_to_string(f)?;
            if text.contains("\nkind: Pod\n") {
                cp.kubectl(&[
                    "delete",
                    "-f",
                    &f.display().to_string(),
                    "--grace-period=0",
                    "--force",
                ])?;
            }
        }
        let have = cp.still_there(&overlay)?;
        ensure!(
            have.len() == overlay.objects.len(),
            "applied {} objects of {THIN_OVERLAY}, the API has {have:?}",
            overlay.objects.len()
        );
        for (kind, name) in [
            ("serviceaccount", "plexus"),
            ("daemonset", "kube-plexus-ds"),
        ] {
            cp.kubectl(&["-n", PLEXUS_NAMESPACE, "get", kind, name])?;
        }
        cp.kubectl(&["get", "clusterrole,clusterrolebinding", "plexus"])?;
        cp.kubectl(&["-n", "default", "get", "net-attach-def", "macvlan-conf"])?;

        // The DaemonSet's command and environment, as the apiserver stored them, run on the
        // node's directories.
        let install = InstallSh::from_daemonset(cp, "kube-plexus-ds", "install-plexus")?;
        let token = plexus_token(cp, &PlexusToken::Unbound)?;
        let binaries = [
            ("plexus", common::bin("plexus")),
            ("sriov", common::bin("sriov")),
        ];
        let proc = install.spawn(cp, &self.node, &token, &binaries, &self.extra_config())?;
        let log = self.node.path("installer.log");
        self.installer = Some(proc);
        let final_conf = self.plexus_conf();
        wait_for(
            &final_conf.display().to_string(),
            Duration::from_secs(60),
            || Ok(final_conf.exists()),
        )
        .with_context(|| plexus_e2e::realk8s::tail(&log, 20))?;
        let ready = InstallSh::ready_file(&self.node);
        wait_for(
            "the installer's ready file",
            Duration::from_secs(30),
            || Ok(ready.exists()),
        )?;
        let conf: Value = serde_json::from_slice(&std::fs::read(&final_conf)?)?;
        let plugin = if conf["plugins"].is_array() {
            &conf["plugins"][0]
        } else {
            &conf
        };
        ensure!(plugin["type"] == "plexus", "{conf}");
        ensure!(
            plugin["clusterNetwork"] == json!(self.node.conf_dir().join(self.overlay.conf_name())),
            "{conf}"
        );
        ensure!(
            !self.overlay.has_bandwidth() || plugin["capabilities"]["bandwidth"] == true,
            "{conf}"
        );
        ensure!(
            plugin["capabilities"]["portMappings"] == true
                && plugin["capabilities"]["io.kubernetes.cri.pod-annotations"] == true,
            "{conf}"
        );
        ensure!(self.node.bin_dir().join("plexus").is_file());
        wait_until_plexus_is_in_the_path(&self.api, NS, self.node.name())?;
        let (sb, netns) = self.pod_netns(NS, "probe")?;
        self.seen.borrow_mut().sandboxes.push(sb);
        delete_one(&self.api, NS, "probe", &netns, Duration::from_secs(30))?;
        self.wait_clean()?;

        // The NADs the cases use: two bridges and a macvlan on the test's veth.
        let nad = |ns: &str, name: &str, cfg: Value| -> Result<()> {
            let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":{"name":name,"namespace":ns},"spec":{"config":cfg.to_string()}});
            cp.apply(&nad.to_string()).map(drop)
        };
        let ipam = |subnet: &str| json!({"type":"host-local","dataDir":self.node.ipam_dir(),"ranges":[[{"subnet":subnet}]]});
        nad(
            NS,
            "br-a",
            json!({"cniVersion":"1.0.0","name":"br-a","type":"bridge","bridge":self.bridges[0],"ipam":ipam("10.249.1.0/24")}),
        )?;
        nad(
            NS,
            "br-b",
            json!({"cniVersion":"1.0.0","name":"br-b","type":"bridge","bridge":self.bridges[1],"ipam":ipam("10.249.2.0/24")}),
        )?;
        nad(
            "default",
            "mv-c",
            json!({"cniVersion":"0.4.0","name":"mv-c","type":"macvlan","master":self.master,"mode":"bridge","ipam":ipam("10.249.3.0/24")}),
        )?;
        Ok(())
    }

    /// SIGTERM the installer (as a DaemonSet rollout would); its config and binary stay.
    fn stop_installer(&mut self) -> Result<()> {
        let mut p = self.installer.take().context("installer not running")?;
        p.stop(Duration::from_secs(10));
        let log = std::fs::read_to_string(self.node.path("installer.log"))?;
        ensure!(
            log.contains("the config stays in place"),
            "installer did not log its SIGTERM exit:\n{log}"
        );
        ensure!(self.plexus_conf().exists());
        ensure!(self
            .node
            .path("cni/net.d/plexus.d/plexus.kubeconfig")
            .exists());
        Ok(())
    }

    // ---------------------------------------------------------------------------- helpers

    /// `PLEXUS_EXTRA_CONFIG`: the node's plans dir, and a `nadPolicy` allowing the node's IPAM
    /// dir (the NADs' `dataDir`). No `retryDeleteOnError`, with calico either: calico-ipam's
    /// DEL needs the API, and plexus keeps failing a DEL (so the kubelet retries) for 5 minutes
    /// after its first failure before it may give up, so an apiserver outage of ~20 s leaks
    /// nothing.
    fn extra_config(&self) -> Value {
        json!({"cniDir": self.node.plexus_dir(),
            "nadPolicy": nad_policy_allowing(&[&self.node.ipam_dir()])})
    }

    /// install.sh's config: `.conflist` for a 1.x primary, `.conf` for a 0.x one (flannel's
    /// and calico's installers write cniVersion 0.3.1).
    fn plexus_conf(&self) -> PathBuf {
        // A conflist whatever the primary's version: it carries `cniVersions` (install.sh).
        self.node.conf_dir().join("00-plexus.conflist")
    }

    /// (sandbox ID, netns path) of a running pod.
    fn pod_netns(&self, ns: &str, name: &str) -> Result<(String, String)> {
        self.seen
            .borrow_mut()
            .pod_netns(&self.api, &self.node, ns, name)
    }

    /// What the node still holds that belongs to deleted pods: plexus plans and result-cache
    /// files, host-local leases, `cni-*` netns, host veths on the test bridges, libcni cache
    /// entries of seen sandboxes. Call when no test pod exists.
    fn leftovers(&self) -> Vec<String> {
        self.seen
            .borrow()
            .leftovers(self.cp, &self.node, &self.overlay, &self.bridges)
    }

    /// Wait (10 s) until [`Tier::leftovers`] is empty.
    fn wait_clean(&self) -> Result<()> {
        wait_clean(Duration::from_secs(10), || self.leftovers())
    }

    /// Create pods, wait Running, check each with `check`, delete, wait gone, check clean.
    fn run_pods(
        &self,
        batch: &str,
        pods: &[(String, Option<Value>)],
        check: impl Fn(&str, &[Value], &str) -> Result<()>,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        self.run_pods_with_traffic(batch, pods, check, &|_| Ok(Vec::new()))
    }

    /// [`Self::run_pods`], and `traffic` with every pod's (name, netns) once all are Running
    /// and checked: it sends packets across their interfaces and returns the addresses that
    /// must stop answering once the pods are deleted (checked from the node).
    fn run_pods_with_traffic(
        &self,
        batch: &str,
        pods: &[(String, Option<Value>)],
        check: impl Fn(&str, &[Value], &str) -> Result<()>,
        traffic: &Traffic<'_>,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        let manifests: Vec<Value> = pods
            .iter()
            .map(|(name, nets)| manifest(NS, name, self.node.name(), batch, nets.as_ref()))
            .collect();
        let created = create_and_wait(&self.api, &manifests, Duration::from_secs(60))
            .with_context(|| self.node.logs(10))?;
        let names: Vec<String> = pods.iter().map(|(n, _)| n.clone()).collect();
        let mut netns = Vec::new();
        let mut failed = None;
        for (name, _) in pods {
            let (sb, ns) = self.pod_netns(NS, name)?;
            self.seen.borrow_mut().sandboxes.push(sb);
            let pod = self.api.get_pod(NS, name)?.context("pod")?;
            if failed.is_none() {
                failed = network_status(&pod)
                    .and_then(|st| check(name, &st, &ns))
                    .with_context(|| format!("pod {name}"))
                    .err();
            }
            netns.push(ns);
        }
        let mut gone_after = Vec::new();
        if failed.is_none() {
            let all: Vec<(String, String)> = names.iter().cloned().zip(netns.clone()).collect();
            match traffic(&all) {
                Ok(addrs) => gone_after = addrs,
                Err(e) => failed = Some(e.context("traffic")),
            }
        }
        if let Some(e) = failed {
            // Leave nothing behind for the next case.
            let _ = delete_and_wait(
                &self.api,
                NS,
                batch,
                &names,
                &netns,
                Duration::from_secs(60),
            );
            return Err(e);
        }
        let deleted = delete_and_wait(
            &self.api,
            NS,
            batch,
            &names,
            &netns,
            Duration::from_secs(60),
        )?;
        self.wait_clean()?;
        ensure_no_address_answers(&gone_after)?;
        Ok((created, deleted))
    }

    // ------------------------------------------------------------------------------ cases

    fn extra_networks(&mut self) -> Result<()> {
        let three_comma = json!("br-a, app/br-b@data0, default/mv-c");
        let three_json = json!([{"name":"br-a"},{"name":"br-b","namespace":"app","interface":"data0"},
            {"name":"mv-c","namespace":"default"}]);
        let pods = vec![
            ("zero".to_string(), None),
            ("one-comma".to_string(), Some(json!("br-a"))),
            ("one-json".to_string(), Some(json!([{"name":"br-a"}]))),
            ("three-comma".to_string(), Some(three_comma)),
            ("three-json".to_string(), Some(three_json)),
        ];
        let net = self.net;
        let node_ip = self.node.ip().to_string();
        // Packets: eth0 pod <-> pod over the overlay and pod -> node; net1 pod <-> pod on the
        // bridge NAD; net3 pod <-> pod on the macvlan NAD. Each pod's eth0 address must stop
        // answering once it is deleted.
        let traffic = |all: &[(String, String)]| -> Result<Vec<String>> {
            let ns = |n: &str| -> Result<&str> {
                all.iter()
                    .find(|(p, _)| p == n)
                    .map(|(_, ns)| ns.as_str())
                    .with_context(|| format!("no pod {n}"))
            };
            let both_ways = |a: &str, b: &str, ifname: &str| -> Result<()> {
                let (na, nb) = (ns(a)?, ns(b)?);
                ensure_pings_both_ways(a, na, b, nb, ifname)
            };
            both_ways("zero", "three-json", "eth0")?;
            ensure!(
                pings(Some(ns("zero")?), &node_ip),
                "zero -> the node ({node_ip}): no answer"
            );
            both_ways("one-comma", "three-comma", "net1")?;
            both_ways("three-comma", "three-json", "net3")?;
            all.iter().map(|(_, n)| address(n, "eth0")).collect()
        };
        self.run_pods_with_traffic(
            "extra",
            &pods,
            |name, status, netns| {
                let expected: Vec<(&str, &str)> = match name {
                    "zero" => vec![(net, "eth0")],
                    "one-comma" | "one-json" => vec![(net, "eth0"), ("app/br-a", "net1")],
                    _ => vec![
                        (net, "eth0"),
                        ("app/br-a", "net1"),
                        ("app/br-b", "data0"),
                        ("default/mv-c", "net3"),
                    ],
                };
                check_pod_network(status, netns, &expected)
            },
            &traffic,
        )?;
        // Events plexus posted were accepted by the real apiserver and are on the pods.
        for name in ["zero", "three-json"] {
            let evs = self.api.events(NS, name)?;
            ensure!(
                evs.iter().any(|e| e["reason"] == "AddedInterface"
                    && e["type"] == "Normal"
                    && e["reportingComponent"] == "plexus"),
                "{name}: no AddedInterface event from plexus: {evs:#?}"
            );
        }
        Ok(())
    }

    /// A pod with a `hostPort` and bandwidth annotations (and 1 NAD): portmap's DNAT for the
    /// port and (when the overlay's conflist chains `bandwidth`) an ifb with shaping while it
    /// runs; neither after delete.
    fn host_port_and_bandwidth(&mut self) -> Result<()> {
        let port = plexus_e2e::realk8s::free_port()?;
        let m = hostport_manifest(NS, self.node.name(), port);
        let ifb_before = ifb_links();
        create_and_wait(&self.api, &[m], Duration::from_secs(60))
            .with_context(|| self.node.logs(10))?;
        let (sb, netns) = self.pod_netns(NS, "hostport")?;
        self.seen.borrow_mut().sandboxes.push(sb);
        let checked = (|| {
            check_hostport_pod_network(&self.api, NS, &netns, self.net)?;
            let dnat = dnat_rules(port);
            ensure!(!dnat.is_empty(), "no DNAT rule for hostPort {port}");
            println!("    hostPort {port}: {}", dnat[0]);
            // portmap's DNAT really works: the node's address and the hostPort reach a
            // listener on the containerPort inside the pod.
            let token = format!("plexus-hostport-{port}");
            ensure_host_port_answers(&netns, self.node.ip(), port, &token)?;
            let ifbs = new_ifbs(&ifb_before, self.overlay.has_bandwidth())?;
            if self.overlay.has_bandwidth() {
                println!("    bandwidth: ifb {ifbs:?}");
                // The shaping, by packets: the pod's annotations ask 10 Mbit/s each way. What
                // the runtime passes as the burst (the tbf's) goes through at the path's speed
                // first; the steady rate after it is what is checked.
                let ifb = ifbs
                    .iter()
                    .find(|i| i.starts_with("bwp"))
                    .cloned()
                    .unwrap_or_default();
                let tbf = std::process::Command::new("tc")
                    .args(["qdisc", "show", "dev", &ifb])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                    .unwrap_or_default();
                let node: std::net::IpAddr = self.node.ip().parse()?;
                let t = Instant::now();
                let rate = common::transfer::steady_shaped_rate(
                    None,
                    std::net::SocketAddr::new(node, 0),
                    Some(Path::new(&netns)),
                    10e6,
                    Duration::from_secs(90),
                )
                .with_context(|| format!("pod -> node through {tbf}"))?;
                println!(
                    "    pod -> node: {:.1} Mbit/s once the burst is through (asked 10; {:.1} s; {tbf})",
                    rate / 1e6,
                    t.elapsed().as_secs_f64()
                );
                ensure!(
                    (8e6..=12e6).contains(&rate),
                    "egress shaped to {:.1} Mbit/s, asked 10 (±20 %)",
                    rate / 1e6
                );
            } else {
                ensure!(
                    ifbs.is_empty(),
                    "an ifb without bandwidth in the conflist: {ifbs:?}"
                );
            }
            Ok(())
        })();
        delete_one(&self.api, NS, "hostport", &netns, Duration::from_secs(60))?;
        checked?;
        self.wait_clean()?;
        ensure_host_port_gone(self.node.ip(), port, &ifb_before)
    }

    /// Version mixes, with the installed plexus binary run as the runtime would: plexus' config
    /// at cniVersion 1.1.0 (STATUS, GC) over the overlay's conflist as installed (0.3.1: STATUS
    /// reports ready without a call, as libcni), and over the same conflist declared 1.1.0
    /// (calico speaks ≤ 1.0.0, Debian's portmap and bandwidth ≤ 1.0.0): success or a CNI error
    /// naming the network. GC with no valid attachment (no pod runs) succeeds and leaves nothing.
    fn version_mixes(&mut self) -> Result<()> {
        let conf: Value = serde_json::from_slice(&std::fs::read(self.plexus_conf())?)?;
        let mut plexus = if conf["plugins"].is_array() {
            let mut p = conf["plugins"][0].clone();
            p["name"] = conf["name"].clone();
            p
        } else {
            conf.clone()
        };
        plexus["cniVersion"] = json!("1.1.0");
        let primary = self.node.conf_dir().join(self.overlay.conf_name());
        let mut declared: Value = serde_json::from_slice(&std::fs::read(&primary)?)?;
        declared["cniVersion"] = json!("1.1.0");
        let declared_path = self.node.path("primary-1.1.0.conflist");
        std::fs::write(&declared_path, declared.to_string())?;
        let bin = self.node.bin_dir().join("plexus");
        let run = |verb: &str, cfg: &Value| -> Result<(bool, String)> {
            let mut child = Command::new(&bin)
                .env("CNI_COMMAND", verb)
                .env("CNI_PATH", self.node.bin_dir())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            std::io::Write::write_all(
                child.stdin.as_mut().context("stdin")?,
                cfg.to_string().as_bytes(),
            )?;
            let out = child.wait_with_output()?;
            Ok((
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).trim().to_string(),
            ))
        };
        let (ok, out) = run("STATUS", &plexus)?;
        ensure!(
            ok,
            "STATUS over the installed {}: {out}",
            self.overlay.conf_name()
        );
        println!("    STATUS 1.1.0 over the installed 0.3.1 conflist: ok");
        let mut over_declared = plexus.clone();
        over_declared["clusterNetwork"] = json!(declared_path);
        // Both overlays chain a plugin built for CNI ≤ 1.0.0 (calico; flannel's portmap): it is
        // not sent STATUS, and the error names it, its versions and the verb.
        let (ok, out) = run("STATUS", &over_declared)?;
        ensure!(
            !ok,
            "STATUS over the conflist declared 1.1.0 succeeded: {out}"
        );
        let e: Value = serde_json::from_str(&out)
            .with_context(|| format!("STATUS failed without a CNI error: {out:?}"))?;
        let msg = e["msg"].as_str().unwrap_or("");
        ensure!(
            e["code"] == 1
                && msg.contains(self.net)
                && msg.contains("does not support cniVersion 1.1.0")
                && msg.contains("STATUS")
                && e["details"].as_str().is_some_and(|d| d.contains("1.0.0")),
            "STATUS error is not the clear one naming {}, the plugin and its versions: {e}",
            self.net
        );
        println!(
            "    STATUS 1.1.0 over the conflist declared 1.1.0: {} {}: {}",
            e["code"], e["msg"], e["details"]
        );
        let mut gc = plexus.clone();
        gc["cni.dev/valid-attachments"] = json!([]);
        let (ok, out) = run("GC", &gc)?;
        ensure!(ok, "GC: {out}");
        println!("    GC 1.1.0 (no valid attachment): ok");
        self.wait_clean()
    }

    /// plexus' own config at cniVersion 1.1.0 over the overlay's 0.3.1 conflist, run by the
    /// real runtime: the installer is stopped (its config stays), `cniVersion` rewritten in
    /// place (same length: containerd 1.6 reloads on the write event) and one pod with a NAD
    /// created. A runtime whose libcni knows 1.1.0 (containerd 2.x) runs it: network-status
    /// right, its libcni cache entry holds the 1.1.0 config and result. containerd 1.6 (libcni
    /// 1.1, spec ≤ 1.0.0) refuses plexus' 1.1.0 result (`unsupported CNI result version`) and
    /// runs DEL: the case then asserts that refusal. Either way, after delete nothing is left
    /// (plans, calico's IPAM handles, flannel's leases). The 0.3.1 config is written back.
    fn plexus_at_1_1_0(&mut self) -> Result<()> {
        if let Some(mut p) = self.installer.take() {
            p.stop(Duration::from_secs(10));
        }
        let path = self.plexus_conf();
        let original = std::fs::read_to_string(&path)?;
        let conf: Value = serde_json::from_str(&original)?;
        let old = conf["cniVersion"]
            .as_str()
            .context("no cniVersion")?
            .to_string();
        ensure!(old.len() == 5 && old != "1.1.0", "installed at {old}");
        // The installer pretty-prints: replace the 5 bytes of the value after the key.
        let key = original
            .find("\"cniVersion\"")
            .context("no cniVersion key")?;
        let at = key
            + original[key..]
                .find(&format!("\"{old}\""))
                .context("no value")?
            + 1;
        let v110 = format!("{}1.1.0{}", &original[..at], &original[at + old.len()..]);
        let write_in_place = |text: &str| -> Result<()> {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
            f.write_all(text.as_bytes())?;
            Ok(())
        };
        write_in_place(&v110)?;
        // containerd reloads on the write event; give its watcher a moment.
        std::thread::sleep(Duration::from_millis(500));
        let outcome = self.pod_at_1_1_0();
        write_in_place(&original)?;
        std::thread::sleep(Duration::from_millis(500));
        outcome
    }

    /// The pod of [`Tier::plexus_at_1_1_0`]: Running or refused by the runtime, then deleted.
    fn pod_at_1_1_0(&self) -> Result<()> {
        let name = format!("v110-{}", std::process::id());
        let net = self.net;
        self.api.create_pod(&manifest(
            NS,
            &name,
            self.node.name(),
            "v110",
            Some(&json!("br-a")),
        ))?;
        let refusal = "unsupported CNI result version \"1.1.0\"";
        let mut outcome = None;
        let waited = wait_for(
            "the pod Running or refused",
            Duration::from_secs(30),
            || {
                let pod = self.api.get_pod(NS, &name)?.context("pod gone")?;
                if running(&pod) {
                    outcome = Some(Ok(pod));
                } else if self.api.events(NS, &name)?.iter().any(|e| {
                    e["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(refusal) && m.contains("plexus"))
                }) {
                    outcome = Some(Err(()));
                }
                Ok(outcome.is_some())
            },
        );
        let checked = match (waited, outcome) {
            (Err(e), _) => Err(e.context(format!("pod {name}: neither Running nor refused"))),
            (Ok(()), None) => Err(anyhow::anyhow!("pod {name}: no outcome")),
            (Ok(()), Some(Ok(pod))) => (|| {
                let (sb, netns) = self.pod_netns(NS, &name)?;
                self.seen.borrow_mut().sandboxes.push(sb);
                check_pod_network(
                    &network_status(&pod)?,
                    &netns,
                    &[(net, "eth0"), ("app/br-a", "net1")],
                )?;
                let entry = libcni_cache_entry(&self.node, &name)?;
                let config: Value = serde_json::from_slice(&base64::Engine::decode(
                    &base64::engine::general_purpose::STANDARD,
                    entry["config"].as_str().context("config")?,
                )?)?;
                ensure!(
                    config["cniVersion"] == "1.1.0" && entry["result"]["cniVersion"] == "1.1.0",
                    "not run at 1.1.0: config {config}, result {}",
                    entry["result"]
                );
                println!("    plexus 1.1.0 over the 0.3.1 {net}: pod Running, result 1.1.0");
                Ok(())
            })(),
            (Ok(()), Some(Err(()))) => {
                println!(
                    "    plexus 1.1.0 over the 0.3.1 {net}: the runtime (libcni < 1.2) refuses: {refusal}"
                );
                Ok(())
            }
        };
        delete_and_wait(
            &self.api,
            NS,
            "v110",
            std::slice::from_ref(&name),
            // A Running pod's netns is checked by `wait_clean` (pod_netns records it).
            &[String::new()],
            Duration::from_secs(60),
        )?;
        checked.with_context(|| self.node.logs(5))?;
        self.wait_clean()
    }

    fn missing_nad(&mut self) -> Result<()> {
        let pod = manifest(
            NS,
            "nonad",
            self.node.name(),
            "nonad",
            Some(&json!("app/nope")),
        );
        self.api.create_pod(&pod)?;
        // The kubelet retries the sandbox; plexus explains on the pod, and so does the kubelet.
        let mut evs = Vec::new();
        let seen = wait_for(
            "events about the missing NAD",
            Duration::from_secs(30),
            || {
                evs = self.api.events(NS, "nonad")?;
                let plexus = evs.iter().any(|e| {
                    e["type"] == "Warning"
                        && e["reportingComponent"] == "plexus"
                        && e["message"].as_str().unwrap_or("").contains("app/nope")
                });
                let kubelet = evs.iter().any(|e| {
                    e["reason"] == "FailedCreatePodSandBox"
                        && e["message"].as_str().unwrap_or("").contains("nope")
                });
                Ok(plexus && kubelet)
            },
        );
        seen.with_context(|| format!("events: {evs:#?}"))?;
        let p = self.api.get_pod(NS, "nonad")?.context("pod")?;
        ensure!(p["status"]["phase"] == "Pending", "{}", p["status"]);
        ensure!(network_status(&p)?.is_empty(), "no network-status expected");
        for e in &evs {
            if e["reportingComponent"] == "plexus" {
                println!(
                    "    plexus: {} {}: {}",
                    e["type"], e["reason"], e["message"]
                );
            } else if e["reason"] == "FailedCreatePodSandBox" {
                println!("    kubelet: {}", e["message"]);
            }
        }
        let start = Instant::now();
        self.api.delete_pod(NS, "nonad")?;
        wait_for("nonad gone", Duration::from_secs(60), || {
            Ok(self.api.get_pod(NS, "nonad")?.is_none())
        })?;
        println!(
            "    failing pod deleted in {:.0} ms",
            start.elapsed().as_secs_f64() * 1000.0
        );
        ensure!(
            self.node
                .cri()
                .sandboxes(Some(p["metadata"]["uid"].as_str().unwrap_or("")))?
                .iter()
                .all(|s| s.state != 0),
            "a ready sandbox is left"
        );
        self.wait_clean()
    }

    fn burst(&mut self, n: usize) -> Result<()> {
        let pods: Vec<(String, Option<Value>)> = (0..n)
            .map(|i| (format!("burst-{i}"), Some(json!("br-a"))))
            .collect();
        let ips = std::cell::RefCell::new(BTreeSet::new());
        let net = self.net;
        let (created, deleted) = self.run_pods("burst", &pods, |_, status, netns| {
            check_pod_network(status, netns, &[(net, "eth0"), ("app/br-a", "net1")])?;
            for e in status {
                let ip = e["ips"][0].as_str().unwrap_or("").to_string();
                ensure!(ips.borrow_mut().insert(ip.clone()), "IP {ip} given twice");
            }
            Ok(())
        })?;
        println!(
            "    burst of {n} (1 NAD): create→Running median {:.0} ms (max {:.0}), delete→gone median {:.0} ms (max {:.0})",
            median(&created),
            created.iter().cloned().fold(0.0, f64::max),
            median(&deleted),
            deleted.iter().cloned().fold(0.0, f64::max)
        );
        Ok(())
    }

    fn deleted_while_apiserver_down(&mut self) -> Result<()> {
        /// Longer than stopping the apiserver takes (`stop_apiserver` kills it 2 s after
        /// SIGTERM), so the teardown surely comes after.
        const GRACE: u64 = 6;
        // The container ignores SIGTERM (PID 1 without a handler): the kubelet's teardown (and
        // so the CNI DEL) comes after the grace period, when the apiserver is already stopped.
        let mut manifests = Vec::new();
        for (name, nets) in [
            ("down-1", json!("br-a")),
            ("down-3", json!("br-a,br-b,default/mv-c")),
        ] {
            let mut m = manifest(NS, name, self.node.name(), "down", Some(&nets));
            m["spec"]["terminationGracePeriodSeconds"] = json!(GRACE);
            m["spec"]["containers"][0]["command"] = json!(["/pause", "ignore-sigterm"]);
            manifests.push(m);
        }
        create_and_wait(&self.api, &manifests, Duration::from_secs(60))?;
        let mut netns = Vec::new();
        let mut sandboxes = Vec::new();
        for (name, expected) in [
            ("down-1", &[(self.net, "eth0"), ("app/br-a", "net1")][..]),
            (
                "down-3",
                &[
                    (self.net, "eth0"),
                    ("app/br-a", "net1"),
                    ("app/br-b", "net2"),
                    ("default/mv-c", "net3"),
                ][..],
            ),
        ] {
            let (sb, ns) = self.pod_netns(NS, name)?;
            sandboxes.push(sb.clone());
            self.seen.borrow_mut().sandboxes.push(sb);
            let pod = self.api.get_pod(NS, name)?.context("pod")?;
            check_pod_network(&network_status(&pod)?, &ns, expected)
                .with_context(|| format!("pod {name}"))?;
            netns.push(ns);
        }
        for name in ["down-1", "down-3"] {
            self.api.delete_pod(NS, name)?;
        }
        // Once the kubelet has started killing them (SIGTERM, ignored for the grace period),
        // take the apiserver away: the CNI DEL comes after that.
        let kubelet_log = self.node.path("kubelet.log");
        wait_for(
            "the kubelet killing both pods",
            Duration::from_secs(10),
            || {
                let log = std::fs::read_to_string(&kubelet_log)?;
                Ok(["down-1", "down-3"].iter().all(|n| {
                    log.lines().any(|l| {
                        l.contains("Killing container with a grace period")
                            && l.contains(&format!("pod=\"{NS}/{n}\""))
                    })
                }))
            },
        )?;
        let relists = kubelet_pod_relists(&kubelet_log);
        let t0 = Instant::now();
        self.cp.stop_apiserver();
        let stopped = Instant::now();
        ensure!(
            netns.iter().all(|n| Path::new(n).exists()),
            "torn down before the apiserver was stopped ({:.1} s to stop it): nothing tested",
            t0.elapsed().as_secs_f64()
        );
        // calico-ipam releases addresses through the API: its DEL fails until the apiserver is
        // back (the kubelet retries; plexus keeps failing the DEL until then), and the pods are torn down after that.
        let del_needs_api = self.overlay.kind() == Kind::Calico;
        let res = (|| {
            if del_needs_api {
                // Down until the teardown of each pod was tried (its StopPodSandbox failed:
                // calico's DEL needs the API) or done (its netns gone), not a fixed time.
                wait_for(
                    "a teardown of each pod with the apiserver stopped",
                    Duration::from_secs(GRACE + 20),
                    || {
                        let log = std::fs::read_to_string(&kubelet_log)?;
                        Ok(sandboxes.iter().zip(&netns).all(|(sb, ns)| {
                            !Path::new(ns).exists()
                                || log.lines().any(|l| {
                                    l.contains("StopPodSandbox from runtime service failed")
                                        && l.contains(sb.as_str())
                                })
                        }))
                    },
                )?;
                let gone = netns.iter().all(|n| !Path::new(n).exists());
                println!(
                    "    {:.1} s after the apiserver stopped: pods {}",
                    stopped.elapsed().as_secs_f64(),
                    if gone {
                        "netns gone"
                    } else {
                        "netns still there (calico's DEL failing, retried)"
                    }
                );
                return Ok(());
            }
            wait_for(
                "the pods' netns gone with the apiserver stopped",
                Duration::from_secs(30),
                || Ok(netns.iter().all(|n| !Path::new(n).exists())),
            )?;
            println!(
                "    apiserver stopped in {:.1} s; pods torn down {:.1} s later (grace period {GRACE} s)",
                stopped.duration_since(t0).as_secs_f64(),
                stopped.elapsed().as_secs_f64()
            );
            // Nothing left, while the apiserver is still down (DEL needs no API) but the
            // releases of the address claims host-local's addresses on mv-c hold (a macvlan
            // NAD spans nodes): recorded, and done by a later DEL once the API is back.
            let pending = |s: &String| s.starts_with("plexus: claims-pending/");
            let r = wait_for("nothing left", Duration::from_secs(10), || {
                Ok(self.leftovers().iter().all(pending))
            });
            r.with_context(|| format!("left: {:?}", self.leftovers()))
        })();
        self.cp.start_apiserver()?;
        res?;
        let restarted = Instant::now();
        wait_for("the pod objects gone", Duration::from_secs(90), || {
            Ok(self.api.list_pods(NS, "down")?.is_empty()
                && netns.iter().all(|n| !Path::new(n).exists()))
        })?;
        println!(
            "    pod objects gone {:.1} s after the apiserver was back",
            restarted.elapsed().as_secs_f64()
        );
        // The kubelet sees new pods only once its pod watch is back (its reflector's backoff,
        // seen up to 39 s). It may come back by a relist or by resuming the watch from its
        // resourceVersion (no log line then), so what is waited for is what the next case
        // needs: a new pod on this node gets Running.
        let probe = manifest(NS, "down-probe", self.node.name(), "down-probe", None);
        create_and_wait(&self.api, &[probe], Duration::from_secs(120))
            .context("a new pod after the apiserver came back")?;
        println!(
            "    a new pod Running {:.1} s after the apiserver was back ({} kubelet pod relists since)",
            restarted.elapsed().as_secs_f64(),
            kubelet_pod_relists(&kubelet_log).saturating_sub(relists)
        );
        let (sb, ns) = self.pod_netns(NS, "down-probe")?;
        self.seen.borrow_mut().sandboxes.push(sb);
        delete_and_wait(
            &self.api,
            NS,
            "down-probe",
            &["down-probe".to_string()],
            &[ns],
            Duration::from_secs(60),
        )?;
        // The probe's DEL released what the DELs with the apiserver down could not.
        wait_for(
            "the pending claim releases done",
            Duration::from_secs(30),
            || Ok(self.leftovers().is_empty()),
        )
        .with_context(|| format!("left: {:?}", self.leftovers()))?;
        self.wait_clean()
    }

    /// The DaemonSet's pod itself, as the DaemonSet controller would create it on this node
    /// (none runs here): its template from the apiserver, `spec.nodeName` set, the hostPath
    /// volumes pointed at the node's test dirs, and the API address (no kube-proxy here). The
    /// image (`plexus:<version>`, as deploy/settings names it) is built from deploy/install.sh, the host's sh, jq and coreutils and
    /// the workspace binaries. Checks: the pod gets Ready (its readiness probe), it rewrote the
    /// kubeconfig with its own projected ServiceAccount token, pods get their networks with it,
    /// and on delete (SIGTERM) the config stays.
    fn daemonset_pod(&mut self) -> Result<()> {
        let tar = image::plexus_image(
            &self.node.path("plexus-image"),
            &repo("deploy/install.sh"),
            &[
                ("plexus", common::bin("plexus")),
                ("sriov", common::bin("sriov")),
                ("plexus-daemon", common::bin("plexus-daemon")),
            ],
        )?;
        let cp = self.cp;
        // The DaemonSet as `kubectl apply -k deploy/overlays/thin` stored it: its image is
        // deploy/settings' `plexus:<version>`.
        let ds = daemonset_json(cp, "kube-plexus-ds")?;
        import_plexus_image(&self.node, &tar, &ds)?;
        cp.create_namespace(PLEXUS_NAMESPACE)?; // its kube-root-ca.crt, for the projected token
                                                // These kube-apiserver binaries (openshift/kubernetes source) also project this
                                                // ConfigMap into every ServiceAccount token volume; no controller creates it here.
        let ca = json!({"apiVersion":"v1","kind":"ConfigMap",
            "metadata":{"name":"openshift-service-ca.crt","namespace":PLEXUS_NAMESPACE},
            "data":{"service-ca.crt": cp.ca_pem()}});
        cp.apply(&ca.to_string())?;
        let tpl = &ds["spec"]["template"];
        let mut spec = tpl["spec"].clone();
        spec["nodeName"] = json!(self.node.name());
        for v in spec["volumes"].as_array_mut().context("volumes")? {
            let host = match v["hostPath"]["path"].as_str() {
                Some("/opt/cni/bin") => self.node.bin_dir(),
                Some("/etc/cni/net.d") => self.node.conf_dir(),
                Some("/var/lib/cni/plexus") => self.node.plexus_dir(),
                // The `reconcile` container's: empty test dirs. No runtime socket is under
                // them, so its passes release nothing here (real_node_gc runs its command
                // against a node's containerd); this case shows it starts and stops cleanly.
                Some("/var/lib/cni") => self.node.path("ds-var-lib-cni"),
                Some("/run") => self.node.path("ds-run"),
                Some("/") => self.node.path("ds-hostroot"),
                Some("/run/netns") | None => continue,
                Some(other) => anyhow::bail!("unexpected hostPath {other} in the DaemonSet"),
            };
            std::fs::create_dir_all(&host)?;
            v["hostPath"]["path"] = json!(host);
        }
        let c = &mut spec["containers"][0];
        let env = c["env"].as_array_mut().context("env")?;
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT", cp.port().to_string()),
            (
                "PLEXUS_HOST_CONF_DIR",
                self.node.conf_dir().display().to_string(),
            ),
            (
                "PLEXUS_LOG_FILE",
                self.node.path("plexus.log").display().to_string(),
            ),
            ("PLEXUS_EXTRA_CONFIG", self.extra_config().to_string()),
        ] {
            env.push(json!({"name": k, "value": v}));
        }
        let pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":"kube-plexus-ds-node","namespace":PLEXUS_NAMESPACE,
                        "labels": tpl["metadata"]["labels"]},
            "spec": spec});
        let kubeconfig = self.node.conf_dir().join("plexus.d/plexus.kubeconfig");
        let before = std::fs::read_to_string(&kubeconfig)?;
        let t0 = Instant::now();
        self.api.create_pod(&pod)?;
        let mut log_at_ready = String::new();
        let ready = wait_for("the DaemonSet pod Ready", Duration::from_secs(90), || {
            let p = self.api.get_pod(PLEXUS_NAMESPACE, "kube-plexus-ds-node")?;
            let is_ready = p.is_some_and(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            if is_ready {
                log_at_ready = self
                    .node
                    .container_log(PLEXUS_NAMESPACE, "kube-plexus-ds-node");
            }
            Ok(is_ready)
        });
        // Ready means this pod's installer has published (the old config was there all along).
        let ready = ready.and_then(|()| {
            ensure!(
                log_at_ready.contains("plexus-install: ready"),
                "Ready before its installer published:\n{log_at_ready}"
            );
            Ok(())
        });
        let ready = ready.and_then(|()| {
            wait_for(
                "the reconcile container's loop",
                Duration::from_secs(30),
                || {
                    Ok(self
                        .node
                        .container_log(PLEXUS_NAMESPACE, "kube-plexus-ds-node")
                        .contains("node reconciler loop started"))
                },
            )
        });
        let ready = ready.and_then(|()| {
            wait_for(
                "the installer's watch loop",
                Duration::from_secs(90),
                || {
                    Ok(self
                        .node
                        .container_log(PLEXUS_NAMESPACE, "kube-plexus-ds-node")
                        .contains("watching every"))
                },
            )
        });
        let logs = self
            .node
            .container_log(PLEXUS_NAMESPACE, "kube-plexus-ds-node");
        if let Err(e) = ready {
            let p = self.api.get_pod(PLEXUS_NAMESPACE, "kube-plexus-ds-node")?;
            let evs = self.api.events(PLEXUS_NAMESPACE, "kube-plexus-ds-node")?;
            let evs: Vec<String> = evs
                .iter()
                .map(|e| format!("{} {}: {}", e["type"], e["reason"], e["message"]))
                .collect();
            let _ = self.api.delete_pod(PLEXUS_NAMESPACE, "kube-plexus-ds-node");
            return Err(e.context(format!(
                "status {}\nevents {evs:#?}\ninstaller log:\n{logs}",
                p.map(|p| p["status"].clone()).unwrap_or_default()
            )));
        }
        println!(
            "    DaemonSet pod's installer done (watching) {:.1} s after create",
            t0.elapsed().as_secs_f64()
        );
        for l in logs.lines() {
            println!("      {l}");
        }
        let after = std::fs::read_to_string(&kubeconfig)?;
        ensure!(
            after != before && logs.contains("wrote"),
            "the pod's installer did not rewrite the kubeconfig with its own token:\n{logs}"
        );
        // plexus now runs with the pod's projected token.
        let net = self.net;
        self.run_pods(
            "dspod",
            &[("ds-net".into(), Some(json!("br-a")))],
            |_, status, netns| {
                check_pod_network(status, netns, &[(net, "eth0"), ("app/br-a", "net1")])
            },
        )?;
        // Delete it (a rollout): SIGTERM, exit 0, nothing removed. The kubelet removes the pod's
        // logs with the pod: keep what was last seen.
        self.api
            .delete_pod(PLEXUS_NAMESPACE, "kube-plexus-ds-node")?;
        let (mut last_log, mut exit, mut reconcile_exit) =
            (String::new(), Value::Null, Value::Null);
        wait_for("the DaemonSet pod gone", Duration::from_secs(60), || {
            let log = self
                .node
                .container_log(PLEXUS_NAMESPACE, "kube-plexus-ds-node");
            if !log.is_empty() {
                last_log = log;
            }
            match self.api.get_pod(PLEXUS_NAMESPACE, "kube-plexus-ds-node")? {
                Some(p) => {
                    for c in p["status"]["containerStatuses"]
                        .as_array()
                        .into_iter()
                        .flatten()
                    {
                        let t = &c["state"]["terminated"];
                        if t.is_null() {
                            continue;
                        }
                        if c["name"] == "install-plexus" {
                            exit = t["exitCode"].clone();
                        } else if c["name"] == "reconcile" {
                            reconcile_exit = t["exitCode"].clone();
                        }
                    }
                    Ok(false)
                }
                None => Ok(true),
            }
        })?;
        println!(
            "    DaemonSet pod deleted: exit code {exit}, last log line: {:?}",
            last_log.lines().last()
        );
        ensure!(
            last_log.contains("the config stays in place") && exit == 0,
            "no clean SIGTERM exit (exit code {exit}):\n{last_log}"
        );
        // The loop exits 0 only from its signal branch (1 when it cannot start); its last log
        // line may go with the pod's logs before it is read, so the exit code is what counts.
        ensure!(
            reconcile_exit == 0,
            "the reconcile container did not exit 0 on SIGTERM (exit code {reconcile_exit})"
        );
        println!(
            "    reconcile container: exit 0{}",
            if last_log.contains("node reconciler loop stopped (signal)") {
                ", \"node reconciler loop stopped (signal)\" logged"
            } else {
                " (its last log line went with the pod)"
            }
        );
        ensure!(self.plexus_conf().exists());
        // The kubeconfig now holds the deleted pod's bound token, which the apiserver refuses
        // once its authentication cache (10 s) has expired: put back the node installer's, as
        // the next DaemonSet pod would write a live one, so the cases after this one do not
        // depend on how fast they start.
        std::fs::write(&kubeconfig, &before)?;
        Ok(())
    }

    /// A Multus thin config as Multus' README shows it (a delegate with neither `name` nor
    /// `cniVersion`), changed only in `"type"`, put in front of plexus' own config.
    fn multus_thin_config(&mut self) -> Result<()> {
        let log = self.node.path("multus-style.log");
        let conf = json!({"cniVersion":"0.3.1","name":"multus-cni-network","type":"plexus",
            "kubeconfig": self.node.conf_dir().join("plexus.d/plexus.kubeconfig"),
            "cniDir": self.node.plexus_dir(), "logFile": log, "logLevel": "debug",
            "delegates":[{"type":"bridge","bridge":self.bridges[2],"isGateway":true,
                "hairpinMode":true,"ipam":{"type":"host-local","subnet":"10.239.0.0/24",
                "dataDir":self.node.ipam_dir()}}],
            "nadPolicy": nad_policy_allowing(&[&self.node.ipam_dir()])});
        let path = self.node.conf_dir().join("00-multus.conf");
        // A new file written (not renamed) in: containerd sees the write and reloads.
        std::fs::write(&path, serde_json::to_vec_pretty(&conf)?)?;
        let res = self.multus_pods(&log);
        // Back to plexus' config (containerd reloads on the remove).
        std::fs::remove_file(&path)?;
        res
    }

    fn multus_pods(&mut self, log: &Path) -> Result<()> {
        // Until the runtime uses the new config (its log file appears), pods still get plexus'.
        wait_for(
            "containerd to load 00-multus.conf",
            Duration::from_secs(30),
            || {
                if log.exists() {
                    return Ok(true);
                }
                self.run_pods("mprobe", &[("mprobe".into(), None)], |_, _, _| Ok(()))?;
                Ok(log.exists())
            },
        )?;
        let pods = vec![
            ("multus-0".to_string(), None),
            ("multus-1".to_string(), Some(json!("br-a"))),
        ];
        let api = &self.api;
        let seen = std::cell::RefCell::new(Vec::new());
        self.run_pods("multus", &pods, |name, status, netns| {
            println!("    {name}: network-status {}", json!(status));
            let ifs = interfaces(netns)?;
            let eth0 = ifs.get("eth0").context("no eth0 in the pod")?;
            let default = status.first().context("empty network-status")?;
            ensure!(default["default"] == true, "{default}");
            ensure!(
                default["name"].as_str().is_some_and(|n| !n.is_empty()),
                "{default}"
            );
            // A delegate without cniVersion answers in CNI 0.2.0 (no interfaces): the entry may
            // then lack interface and mac, but its IPs must be eth0's.
            ensure!(
                default["interface"].is_null() || default["interface"] == "eth0",
                "{default}"
            );
            ensure!(
                default["mac"].is_null() || default["mac"] == json!(eth0.mac),
                "{default}"
            );
            ensure!(
                default["ips"] == json!(eth0.ips),
                "{default} vs eth0 {:?}",
                eth0.ips
            );
            let pod = api.get_pod(NS, name)?.context("pod")?;
            ensure!(
                pod["status"]["podIP"] == json!(eth0.ips[0]),
                "podIP {} vs eth0 {:?}",
                pod["status"]["podIP"],
                eth0.ips
            );
            let extra: Vec<&str> = ifs
                .keys()
                .map(String::as_str)
                .filter(|i| *i != "lo" && *i != "eth0")
                .collect();
            if name == "multus-1" {
                ensure!(extra == ["net1"], "{extra:?}");
                ensure!(
                    status.len() == 2
                        && status[1]["name"] == "app/br-a"
                        && status[1]["interface"] == "net1"
                        && status[1]["ips"] == json!(ifs["net1"].ips),
                    "{status:?}"
                );
            } else {
                ensure!(
                    extra.is_empty() && status.len() == 1,
                    "{extra:?} {status:?}"
                );
            }
            seen.borrow_mut().push(default.clone());
            Ok(())
        })?;
        let seen = seen.into_inner();
        if seen.iter().any(|d| d["interface"].is_null()) {
            println!(
                "    NOTE: the nameless, versionless delegate's network-status entry has no interface/mac (0.2.0 result)"
            );
        }
        Ok(())
    }

    /// create→Running and delete→gone medians: 10 pods one after another, then 10 at once.
    fn timings(&mut self, label: &str, nets: Option<Value>) -> Result<Timings> {
        let mut seq_create = Vec::new();
        let mut seq_delete = Vec::new();
        for i in 0..10 {
            let pods = vec![(format!("{label}-s{i}"), nets.clone())];
            let (c, d) = self.run_pods(&format!("{label}-s{i}"), &pods, |_, _, _| Ok(()))?;
            seq_create.extend(c);
            seq_delete.extend(d);
        }
        let pods: Vec<(String, Option<Value>)> = (0..10)
            .map(|i| (format!("{label}-b{i}"), nets.clone()))
            .collect();
        let (burst_create, burst_delete) =
            self.run_pods(&format!("{label}-b"), &pods, |_, _, _| Ok(()))?;
        let log = std::fs::read_to_string(self.node.path("containerd.log"))?;
        let (run, teardown) = runtime_log::sandbox_times(&log, &format!("{label}-s"));
        let t = Timings {
            seq_create: median(&seq_create),
            seq_delete: median(&seq_delete),
            burst_create: median(&burst_create),
            burst_delete: median(&burst_delete),
            seq_sandbox: median(&run),
            seq_teardown: median(&teardown),
        };
        println!("    {label}: {t:?}");
        Ok(t)
    }
}

/// Medians in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Timings {
    seq_create: f64,
    seq_delete: f64,
    burst_create: f64,
    burst_delete: f64,
    /// containerd's RunPodSandbox (CNI ADD inside), one after another.
    seq_sandbox: f64,
    /// containerd's StopPodSandbox until the network is torn down (CNI DEL inside).
    seq_teardown: f64,
}

/// How many times the kubelet logging to `log` has (re)listed the pods bound to its node.
fn kubelet_pod_relists(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("\"Caches populated\" type=\"*v1.Pod\"")
                && l.contains("pkg/kubelet/config/apiserver.go")
        })
        .count()
}

fn print_timings(overlay: &str, bare: Option<&Timings>, none: &Timings, one: &Timings) {
    println!(
        "\n    {overlay}: create→Running / delete→gone, medians in ms (real kubelet + containerd):"
    );
    println!("    | config | 10 one after another: create→Running | delete→gone | 10 at once: create→Running | delete→gone |");
    println!("    |---|---|---|---|---|");
    let row = |name: &str, t: &Timings| {
        println!(
            "    | {name} | {:.0} | {:.0} | {:.0} | {:.0} |",
            t.seq_create, t.seq_delete, t.burst_create, t.burst_delete
        )
    };
    if let Some(b) = bare {
        row(&format!("{overlay} alone (no plexus)"), b);
    }
    row("plexus, no extra network", none);
    row("plexus + 1 bridge NAD", one);
    println!("\n    inside containerd, one pod at a time (medians in ms, from its log):");
    println!("    | config | RunPodSandbox (CNI ADD inside) | StopPodSandbox → network torn down (CNI DEL) |");
    println!("    |---|---|---|");
    let row = |name: &str, t: &Timings| {
        println!(
            "    | {name} | {:.0} | {:.0} |",
            t.seq_sandbox, t.seq_teardown
        )
    };
    if let Some(b) = bare {
        row(&format!("{overlay} alone (no plexus)"), b);
    }
    row("plexus, no extra network", none);
    row("plexus + 1 bridge NAD", one);
}

/// The runtime's libcni cache entry (`/var/lib/cni/results`, the node's own) of pod `name`
/// (its `cniArgs` carry `K8S_POD_NAME`).
fn libcni_cache_entry(node: &Node<'_>, name: &str) -> Result<Value> {
    for e in std::fs::read_dir(node.host_path("/var/lib/cni/results"))?.flatten() {
        let Ok(v) = serde_json::from_slice::<Value>(&std::fs::read(e.path()).unwrap_or_default())
        else {
            continue;
        };
        let ours = v["cniArgs"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|kv| kv[0] == "K8S_POD_NAME" && kv[1] == name);
        // containerd 2.x also runs the `loopback` plugin through libcni for every sandbox
        // (network `cni-loopback` on `lo`) and caches that result beside the pod network's.
        if ours && v["ifName"] != "lo" {
            return Ok(v);
        }
    }
    anyhow::bail!("no libcni cache entry for pod {name}")
}

/// After the node stopped: no process of it, no mount under its dir, no netns it created.
fn ensure_gone_after_stop(tier: &Tier<'_>) {
    let dir = tier.node.dir().display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if mounts.contains(&dir) {
        eprintln!("real_node: WARNING: mounts left under {dir}");
    }
    let left: Vec<_> = cni_netns()
        .difference(tier.node.netns_before())
        .cloned()
        .collect();
    if !left.is_empty() {
        eprintln!("real_node: WARNING: netns left: {left:?}");
    }
}

/// `*.yaml` files of a directory, sorted.
fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    v.sort();
    Ok(v)
}
