//! The node's NAD policy (`nadPolicy`, docs/security.md) on the real kube-apiserver: NADs
//! written in an ordinary namespace that name a host path outside the operator's directories
//! (host-local's `dataDir`, whereabouts' kubeconfig, a log file through a symlink) or a host
//! interface / VLAN the namespace was not given are refused at ADD before any plugin runs —
//! code 7 naming the pod, the network, the key, the value and what is allowed, a Warning event
//! on the pod, nothing left — and the same NADs work when the policy allows them. Each refusal
//! has a control run with the policy off that shows the real plugin (host-local, whereabouts)
//! does write where the NAD says. Skipped (and passing) without `PLEXUS_K8S_BIN`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{ensure, Context, Result};
use common::*;
use plexus_e2e::realk8s::rig::{PlexusToken, Rig};
use plexus_e2e::realk8s::{bins, control_plane_or_skip, setup_or_report, ControlPlane, Suite};
use serde_json::{json, Value};

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// Where whereabouts comes from when `PLEXUS_IPAM_BIN` is not set: `../shared/ipam/bin`.
const IPAM_ENV: &str = "PLEXUS_IPAM_BIN";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let Some(node) = setup_or_report("real_nad_policy", &cp, Node::new(&cp)) else {
        return ExitCode::FAILURE;
    };
    let mut suite = Suite::new("real_nad_policy");
    suite.case(
        "host_local_data_dir_outside_the_allowed_dirs_is_refused_before_any_plugin",
        || data_dir(&node),
    );
    suite.case(
        "whereabouts_pointed_at_another_kubeconfig_is_refused",
        || whereabouts_kubeconfig(&node),
    );
    suite.case("a_log_path_through_a_symlink_is_refused", || {
        log_through_symlink(&node)
    });
    suite.case(
        "host_interfaces_and_vlans_outside_the_namespace_allowance_are_refused",
        || host_resources(&node),
    );
    drop(node);
    suite.finish()
}

/// The ipam binaries' directory (whereabouts).
fn ipam_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(IPAM_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    std::env::var_os(bins::BIN_ENV)
        .map(|k| PathBuf::from(k).join("../../ipam/bin"))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"))
}

/// The node: plexus' state, the operator's allowed directories (`allowed/…`), a directory no
/// policy allows (`outside/`), whereabouts installed with its flat config, two macvlan masters.
struct Node<'a> {
    cp: &'a ControlPlane,
    rig: Rig<'a>,
    bridge: HostLink,
    master: HostLink,
    other_master: HostLink,
}

impl<'a> Node<'a> {
    fn new(cp: &'a ControlPlane) -> Result<Node<'a>> {
        let rig = Rig::builder()
            .deploy(&["base/nad-crd.yaml", "base/rbac.yaml"])
            .namespaces(&["bank", "dev"])
            .plexus_token(PlexusToken::Unbound)
            .build(cp)?;
        let node = Node {
            cp,
            rig,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
            other_master: HostLink::veth_master(),
        };
        for d in [
            "allowed/data",
            "allowed/logs",
            "allowed/wb",
            "outside",
            "wbin",
        ] {
            std::fs::create_dir_all(node.path(d))?;
        }
        // A symlink inside an allowed directory that leads out of it.
        std::os::unix::fs::symlink(node.path("outside"), node.path("allowed/logs/escape"))?;
        // whereabouts: the binary in plexus' binDir, its CRDs, its flat config and kubeconfig
        // in the operator's whereabouts directory.
        let wb = bins::find_usable(&ipam_dir(), "whereabouts")?.with_context(|| {
            format!(
                "no whereabouts(.xz) in {} (set {IPAM_ENV})",
                ipam_dir().display()
            )
        })?;
        std::fs::copy(&wb, node.path("wbin/whereabouts"))?;
        let crds = ipam_dir().join("../whereabouts");
        for f in [
            "whereabouts.cni.cncf.io_ippools.yaml",
            "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
        ] {
            cp.apply_file(&crds.join(f))?;
        }
        cp.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/ippools.whereabouts.cni.cncf.io",
            "crd/overlappingrangeipreservations.whereabouts.cni.cncf.io",
        ])?;
        std::fs::copy(
            cp.admin_kubeconfig(),
            node.path("allowed/wb/whereabouts.kubeconfig"),
        )?;
        std::fs::write(
            node.path("allowed/wb/whereabouts.conf"),
            json!({"datastore":"kubernetes",
                "kubernetes":{"kubeconfig":node.path("allowed/wb/whereabouts.kubeconfig")},
                "log_level":"debug"})
            .to_string(),
        )?;
        Ok(node)
    }

    fn path(&self, p: &str) -> PathBuf {
        self.rig.path(p)
    }

    /// The operator's policy: the `allowed/` directories, plus `extra` (e.g. host resources).
    fn policy(&self, extra: Value) -> Value {
        let mut p = json!({"paths":{
            "data":[self.path("allowed/data")],
            "logs":[self.path("allowed/logs")],
            "config":[self.path("allowed/wb")]}});
        for (k, v) in extra.as_object().into_iter().flatten() {
            p[k] = v.clone();
        }
        p
    }

    fn config(&self, policy: Value) -> Value {
        json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus",
            "kubeconfig": self.rig.kubeconfig(), "cniDir": self.path("state"), "binDir": self.path("wbin"),
            "logLevel":"debug", "logFile": self.path("plexus.log"), "logToStderr": false,
            "nadPolicy": policy,
            "delegates":[flannel_like(&self.bridge.0, 73, &self.path("allowed/data"))]})
    }

    fn nad(&self, ns: &str, name: &str, cfg: Value) -> Result<()> {
        let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":name,"namespace":ns},"spec":{"config":cfg.to_string()}});
        self.cp.apply(&nad.to_string()).map(drop)
    }

    fn macvlan(&self, master: &str, ipam: Value) -> Value {
        json!({"cniVersion":"1.0.0","type":"macvlan","master":master,"mode":"bridge","ipam":ipam})
    }

    fn host_local(dir: &Path, subnet: &str) -> Value {
        json!({"type":"host-local","dataDir":dir,"ranges":[[{"subnet":subnet}]]})
    }

    /// A pod asking for `networks`; its ADD/DEL arguments.
    fn pod(&self, ns: &str, name: &str, networks: &str) -> Result<String> {
        let _ = self
            .cp
            .kubectl(&["-n", ns, "delete", "pod", name, "--ignore-not-found"]);
        let pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":name,"namespace":ns,"annotations":{NETWORKS:networks}},
            "spec":{"nodeName":"plexus-policy-node","automountServiceAccountToken":false,
                "containers":[{"name":"c","image":"local/pause:1"}]}});
        self.cp
            .kubectl_stdin(&["create", "-f", "-"], Some(&pod.to_string()))?;
        let got = self
            .cp
            .get_json(&format!("/api/v1/namespaces/{ns}/pods/{name}"))?;
        let uid = got["metadata"]["uid"].as_str().context("uid")?;
        Ok(format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID={uid}"
        ))
    }

    fn call(&self, command: &str, cid: &str, netns: &Netns, args: &str, policy: &Value) -> Run {
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: cid,
                netns: &netns.path(),
                ifname: "eth0",
                args,
            },
            &self.config(policy.clone()),
            &[],
        )
    }

    /// Warning events about the pod.
    fn warnings(&self, ns: &str, pod: &str) -> Result<Vec<String>> {
        let list = self.cp.get_json(&format!(
            "/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3D{pod}"
        ))?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["type"] == "Warning")
            .map(|e| format!("{}: {}", e["reason"], e["message"]))
            .collect())
    }

    /// Two pods of `bank` on NAD `nad` under `policy`: both attached, `net1` of the second in
    /// `subnet`, and a ping from the first reaches it; both DELeted.
    fn two_pods_ping(&self, tag: &str, nad: &str, subnet: &str, policy: &Value) -> Result<()> {
        let (a, b) = (Netns::new(), Netns::new());
        let (pa, pb) = (format!("p-{tag}-a"), format!("p-{tag}-b"));
        let args_a = self.pod("bank", &pa, nad)?;
        let args_b = self.pod("bank", &pb, nad)?;
        let add_a = self.call("ADD", &format!("cid-{pa}"), &a, &args_a, policy);
        let add_b = self.call("ADD", &format!("cid-{pb}"), &b, &args_b, policy);
        let addr_b = b.addrs("net1").first().cloned().unwrap_or_default();
        let ping = pings(&a, bare(&addr_b));
        self.call("DEL", &format!("cid-{pa}"), &a, &args_a, policy);
        self.call("DEL", &format!("cid-{pb}"), &b, &args_b, policy);
        ensure!(
            add_a.code == 0 && add_b.code == 0,
            "{nad}: {} {}",
            add_a.out,
            add_b.out
        );
        ensure!(addr_b.starts_with(subnet), "{nad}: net1 of b: {addr_b:?}");
        ensure!(ping, "{nad}: no ping from a to b over net1 ({addr_b})");
        Ok(())
    }

    /// plexus state files left (lock files aside).
    fn state_left(&self) -> Vec<String> {
        files_under(&self.path("state"))
            .into_iter()
            .filter(|f| !f.starts_with("locks"))
            .collect()
    }

    /// An ADD that the policy must refuse: code 7 naming the pod, the network, `location` and
    /// `value`, details containing `details`; a Warning event on the pod; nothing in the netns;
    /// the runtime's DEL that follows succeeds and leaves no state.
    fn expect_refused(
        &self,
        (ns, pod, network): (&str, &str, &str),
        policy: &Value,
        location: &str,
        value: &str,
        details: &str,
    ) -> Result<()> {
        let args = self.pod(ns, pod, network)?;
        let netns = Netns::new();
        let cid = format!("cid-{pod}");
        let add = self.call("ADD", &cid, &netns, &args, policy);
        let del = self.call("DEL", &cid, &netns, &args, policy);
        ensure!(add.code != 0, "{pod}: ADD was not refused: {}", add.out);
        let e = add.err();
        let (msg, det) = (
            e["msg"].as_str().unwrap_or(""),
            e["details"].as_str().unwrap_or(""),
        );
        ensure!(e["code"] == 7, "{pod}: code {e}");
        ensure!(
            msg.contains(&format!("pod {ns}/{pod}"))
                && msg.contains(&format!("network {ns}/{network}"))
                && msg.contains(location)
                && msg.contains(&format!("{value:?}"))
                && msg.contains("NAD policy"),
            "{pod}: msg {msg:?}"
        );
        ensure!(
            det.contains(details),
            "{pod}: details {det:?} lack {details:?}"
        );
        ensure!(netns.links() == ["lo"], "{pod}: {:?}", netns.links());
        let warnings = self.warnings(ns, pod)?;
        ensure!(
            warnings
                .iter()
                .any(|w| w.starts_with("\"AddInterfaceFailed\"") && w.contains(location)),
            "{pod}: no Warning event naming {location}: {warnings:?}"
        );
        ensure!(del.code == 0, "{pod}: DEL {}", del.out);
        ensure!(
            self.state_left().is_empty(),
            "{pod}: {:?}",
            self.state_left()
        );
        Ok(())
    }
}

/// `ping` from `netns` to `addr` (address without prefix), once, 2 s.
fn pings(netns: &Netns, addr: &str) -> bool {
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &netns.name,
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            addr,
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn bare(cidr: &str) -> &str {
    cidr.split('/').next().unwrap_or(cidr)
}

fn data_dir(node: &Node<'_>) -> Result<()> {
    let outside = node.path("outside/ceo-nad-datadir");
    node.nad(
        "bank",
        "hl-out",
        node.macvlan(&node.master.0, Node::host_local(&outside, "10.173.1.0/24")),
    )?;
    let policy = node.policy(json!({}));
    node.expect_refused(
        ("bank", "p-hl-out", "hl-out"),
        &policy,
        "ipam.dataDir",
        &outside.display().to_string(),
        &format!("{:?} (nadPolicy.paths.data)", [node.path("allowed/data")]),
    )?;
    ensure!(!outside.exists(), "host-local wrote {}", outside.display());

    // A DEL of a container no ADD ever saw (no plan, no tombstone) rebuilds the plan from the
    // NADs: the refused network is skipped, so host-local does not run (it creates its dataDir
    // even on DEL); with the path policy off it does.
    let off = json!({"paths":{"mode":"off"}});
    let args = node.pod("bank", "p-hl-del", "hl-out")?;
    let netns = Netns::new();
    let del = node.call("DEL", "cid-hl-never-added", &netns, &args, &policy);
    ensure!(del.code == 0, "DEL without a plan: {}", del.out);
    ensure!(
        !outside.exists(),
        "a DEL without a plan ran host-local for a refused NAD"
    );
    let del_off = node.call("DEL", "cid-hl-never-added-2", &netns, &args, &off);
    let created = outside.exists();
    let _ = std::fs::remove_dir_all(&outside);
    ensure!(del_off.code == 0, "control DEL: {}", del_off.out);
    ensure!(
        created,
        "control: host-local's DEL did not create its dataDir"
    );

    // Control: with the path policy off, the root host-local does create the NAD's directory
    // and writes its lease there (what plexus refuses above).
    let args = node.pod("bank", "p-hl-off", "hl-out")?;
    let netns = Netns::new();
    let add = node.call("ADD", "cid-hl-off", &netns, &args, &off);
    let leased = files_under(&outside);
    node.call("DEL", "cid-hl-off", &netns, &args, &off);
    let _ = std::fs::remove_dir_all(&outside);
    ensure!(add.code == 0, "control ADD: {}", add.out);
    ensure!(
        leased.iter().any(|f| f.contains("10.173.1.")),
        "control: no lease under {}: {leased:?}",
        outside.display()
    );

    // Allowed: the same NAD with dataDir under the operator's directory, and packets cross.
    node.nad(
        "bank",
        "hl-in",
        node.macvlan(
            &node.master.0,
            Node::host_local(&node.path("allowed/data"), "10.173.2.0/24"),
        ),
    )?;
    node.two_pods_ping("hl", "hl-in", "10.173.2.", &policy)?;
    let leases: Vec<String> = files_under(&node.path("allowed/data"))
        .into_iter()
        .filter(|f| f.contains("10.173.2."))
        .collect();
    ensure!(leases.is_empty(), "leases left: {leases:?}");
    ensure!(node.state_left().is_empty(), "{:?}", node.state_left());
    Ok(())
}

/// Allocations whereabouts recorded for `range` (its IPPools, in whichever namespace its
/// kubeconfig puts them).
fn ippool_allocations(node: &Node<'_>, range: &str) -> Result<usize> {
    let pools = node
        .cp
        .get_json("/apis/whereabouts.cni.cncf.io/v1alpha1/ippools")?;
    Ok(pools["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["spec"]["range"] == range)
        .map(|p| p["spec"]["allocations"].as_object().map_or(0, |a| a.len()))
        .sum())
}

fn whereabouts(node: &Node<'_>, range: &str, extra: Value) -> Value {
    let mut ipam = json!({"type":"whereabouts","range":range,
        "configuration_path":node.path("allowed/wb/whereabouts.conf")});
    for (k, v) in extra.as_object().into_iter().flatten() {
        ipam[k] = v.clone();
    }
    node.macvlan(&node.master.0, ipam)
}

fn whereabouts_kubeconfig(node: &Node<'_>) -> Result<()> {
    let other = node.cp.admin_kubeconfig();
    node.nad(
        "bank",
        "wb-other",
        whereabouts(
            node,
            "10.174.1.0/24",
            json!({"kubernetes":{"kubeconfig":other}}),
        ),
    )?;
    let policy = node.policy(json!({}));
    node.expect_refused(
        ("bank", "p-wb-other", "wb-other"),
        &policy,
        "ipam.kubernetes.kubeconfig",
        &other.display().to_string(),
        "(nadPolicy.paths.config)",
    )?;
    ensure!(
        ippool_allocations(node, "10.174.1.0/24")? == 0,
        "whereabouts ran for a refused NAD"
    );

    // Allowed: whereabouts with the operator's flat config (its kubeconfig in the allowed
    // directory) allocates from the real apiserver, and DEL releases it.
    node.nad(
        "bank",
        "wb-own",
        whereabouts(node, "10.174.2.0/24", json!({})),
    )?;
    let args = node.pod("bank", "p-wb-own", "wb-own")?;
    let netns = Netns::new();
    let add = node.call("ADD", "cid-wb-own", &netns, &args, &policy);
    let held = ippool_allocations(node, "10.174.2.0/24")?;
    let addr = netns.addrs("net1").first().cloned().unwrap_or_default();
    let del = node.call("DEL", "cid-wb-own", &netns, &args, &policy);
    ensure!(add.code == 0, "ADD: {} {}", add.out, add.stderr);
    ensure!(addr.starts_with("10.174.2."), "net1: {addr:?}");
    ensure!(held == 1, "allocations while attached: {held}");
    ensure!(del.code == 0, "DEL: {}", del.out);
    ensure!(
        ippool_allocations(node, "10.174.2.0/24")? == 0,
        "whereabouts' allocation left after DEL"
    );
    Ok(())
}

fn log_through_symlink(node: &Node<'_>) -> Result<()> {
    let via_link = node.path("allowed/logs/escape/wb.log");
    let target = node.path("outside/wb.log");
    node.nad(
        "bank",
        "wb-log",
        whereabouts(node, "10.174.3.0/24", json!({"log_file":via_link})),
    )?;
    let policy = node.policy(json!({}));
    node.expect_refused(
        ("bank", "p-wb-log", "wb-log"),
        &policy,
        "ipam.log_file",
        &via_link.display().to_string(),
        &format!("it resolves to {}", target.display()),
    )?;
    ensure!(!target.exists(), "{} was written", target.display());

    // Control: with the path policy off, the root whereabouts follows the symlink and writes
    // its log outside every allowed directory.
    let off = json!({"paths":{"mode":"off"}});
    let args = node.pod("bank", "p-wb-log-off", "wb-log")?;
    let netns = Netns::new();
    let add = node.call("ADD", "cid-wb-log-off", &netns, &args, &off);
    let written = target.exists();
    node.call("DEL", "cid-wb-log-off", &netns, &args, &off);
    let _ = std::fs::remove_file(&target);
    ensure!(add.code == 0, "control ADD: {}", add.out);
    ensure!(
        written,
        "control: whereabouts did not write {}",
        target.display()
    );
    Ok(())
}

fn host_resources(node: &Node<'_>) -> Result<()> {
    let hl = |subnet: &str| Node::host_local(&node.path("allowed/data"), subnet);
    let bridge = HostLink::bridge_name();
    let enforce = node.policy(json!({"hostResources":{"mode":"enforce","allow":{
        "bank.interfaces": format!("{}, pxbr*", node.master.0),
        "bank.vlans": "100-199"}}}));
    node.nad(
        "bank",
        "mv-other",
        node.macvlan(&node.other_master.0, hl("10.175.1.0/24")),
    )?;
    node.nad(
        "bank",
        "mv-given",
        node.macvlan(&node.master.0, hl("10.175.2.0/24")),
    )?;
    node.nad(
        "dev",
        "mv-given",
        node.macvlan(&node.master.0, hl("10.175.3.0/24")),
    )?;
    let br = |vlan: u32, subnet: &str| json!({"cniVersion":"1.0.0","type":"bridge","bridge":bridge.0,"vlan":vlan,"ipam":hl(subnet)});
    node.nad("bank", "br-300", br(300, "10.175.4.0/24"))?;
    node.nad("bank", "br-150", br(150, "10.175.5.0/24"))?;

    let master_ns = "(nadPolicy.hostResources.allow bank.interfaces";
    node.expect_refused(
        ("bank", "p-mv-other", "mv-other"),
        &enforce,
        "master",
        &node.other_master.0,
        &format!(
            "namespace bank is not given host interface {}",
            node.other_master.0
        ),
    )?;
    node.expect_refused(
        ("dev", "p-dev", "mv-given"),
        &enforce,
        "master",
        &node.master.0,
        "namespace dev is not given host interface",
    )?;
    node.expect_refused(
        ("bank", "p-br-300", "br-300"),
        &enforce,
        "vlan",
        "300",
        "namespace bank is not given VLAN 300",
    )?;
    ensure!(
        !ip(&["link", "show"]).contains(&bridge.0),
        "the bridge was created for a refused NAD"
    );
    // Within the allowance: attached, and the packets cross.
    node.two_pods_ping("mv-given", "mv-given", "10.175.2.", &enforce)?;
    // A VLAN within the allowance passes the policy and reaches the bridge plugin. (This
    // kernel has no bridge VLAN filtering or 8021q: where it has, the pod is attached; the VM
    // tier carries VLAN traffic on VFs.)
    let args = node.pod("bank", "p-br-150", "br-150")?;
    let netns = Netns::new();
    let add = node.call("ADD", "cid-br-150", &netns, &args, &enforce);
    let del = node.call("DEL", "cid-br-150", &netns, &args, &enforce);
    let text = add.out.to_string();
    ensure!(
        add.code == 0 || (text.contains("plugin bridge ADD") && !text.contains("NAD policy")),
        "br-150: {text}"
    );
    ensure!(del.code == 0, "br-150 DEL: {}", del.out);
    ensure!(node.state_left().is_empty(), "{:?}", node.state_left());

    // The default (audit) mode attaches and logs what enforce mode would refuse.
    let audit = node.policy(json!({}));
    let args = node.pod("bank", "p-audit", "mv-other")?;
    let netns = Netns::new();
    let add = node.call("ADD", "cid-audit", &netns, &args, &audit);
    node.call("DEL", "cid-audit", &netns, &args, &audit);
    ensure!(add.code == 0, "audit ADD: {}", add.out);
    let log = std::fs::read_to_string(node.path("plexus.log")).unwrap_or_default();
    ensure!(
        log.contains("NAD policy (audit mode)") && log.contains(master_ns),
        "no audit line in plexus.log"
    );
    Ok(())
}
