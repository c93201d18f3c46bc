//! Address claims against a real kube-apiserver: the `AddressClaim` CRD
//! (`deploy/components/fixed-ips/address-claim-crd.yaml`) and
//! `deploy/components/fixed-ips/rbac-fixed-ips.yaml` applied for real.
//!
//! - The requests: two clients (as two nodes would) claim the same addresses at the same moment
//!   and exactly one wins each (also IPv6 addresses, each written canonically by one and
//!   long-hand by the other: one object per address); a claim of a pod that is gone is taken
//!   over by exactly one of two contenders; a release leaves a claim another pod took over.
//! - Through plexus (its own service account's token, macvlan in real network namespaces, two
//!   "nodes" = two state directories): an ADD of a fixed address creates one claim and lists no
//!   pods, DEL removes it; two nodes ADDing one address at once: exactly one wins, the other gets
//!   code 11 and a Warning event; the same for an IPv6 address asked for in two spellings
//!   (`fd00:56:7::a` and its long form: one claim, in canonical form, the winner answering over
//!   IPv6); a claim whose DEL met a stopped apiserver is released by the runtime's next DEL; a
//!   node that died holding an address (its pod force-deleted) loses it to the replacement, and
//!   its late DEL leaves the new claim; a fixed address inside a whereabouts pool on its segment
//!   is refused until excluded, in each family.
//!
//! Skipped (and passing) without `PLEXUS_K8S_BIN`.

mod common;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Barrier;

use anyhow::{ensure, Context, Result};
use common::{bin, files_under, flannel_like, run, Call, HostLink, Netns, Run};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::rig::{PlexusToken, Rig};
use plexus_e2e::realk8s::{
    control_plane_or_skip, metrics, setup_or_report, ControlPlane, RequestKey, Suite,
};
use plexus_meta::k8s::{ClaimHolder, ClaimOutcome, ClaimSpec, KubeClient, RetryPolicy};
use serde_json::{json, Value};

const NS: &str = "bank";
const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let setup = || -> Result<()> {
        cp.apply_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy/components/fixed-ips/address-claim-crd.yaml"),
        )?;
        cp.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/addressclaims.plexus.cni.io",
        ])?;
        cp.create_namespace(NS)
    };
    let Some(nodes) = setup_or_report(
        "real_address_claims",
        &cp,
        setup().and_then(|()| Nodes::new(&cp)),
    ) else {
        return ExitCode::FAILURE;
    };
    let mut suite = Suite::new("real_address_claims");
    suite.case(
        "two_nodes_claim_one_address_at_once_exactly_one_wins",
        || race(&cp),
    );
    suite.case(
        "two_nodes_claim_one_ipv6_address_in_two_spellings_at_once_exactly_one_wins",
        || race6(&cp),
    );
    suite.case("a_gone_holders_claim_is_taken_over_by_exactly_one", || {
        take_over(&cp)
    });
    suite.case(
        "plexus_add_claims_the_address_without_listing_pods_del_releases_it",
        || add_claims_del_releases(&nodes),
    );
    suite.case(
        "plexus_on_two_nodes_add_one_address_at_once_one_wins_one_gets_11_and_an_event",
        || two_nodes_race(&nodes),
    );
    suite.case(
        "plexus_on_two_nodes_add_one_ipv6_address_in_two_spellings_one_wins_it_answers_over_ipv6",
        || two_nodes_race6(&nodes),
    );
    suite.case(
        "plexus_del_with_the_apiserver_stopped_releases_the_claim_at_the_next_del",
        || del_apiserver_down(&nodes),
    );
    suite.case(
        "plexus_replacement_takes_over_a_dead_nodes_address_its_late_del_leaves_it",
        || dead_node_take_over(&nodes),
    );
    suite.case(
        "a_fixed_address_in_a_whereabouts_pool_on_its_segment_is_refused_until_excluded",
        || fixed_in_pool(&nodes, &V4_POOL),
    );
    suite.case(
        "a_fixed_ipv6_address_in_an_ipv6_whereabouts_pool_is_refused_until_excluded",
        || fixed_in_pool(&nodes, &V6_POOL),
    );
    suite.case(
        "host_local_on_a_macvlan_nad_used_from_two_nodes_is_warned_of",
        || host_local_two_nodes(&nodes),
    );
    suite.case(
        "real_whereabouts_clients_on_two_nodes_and_a_fixed_replica_never_collide_and_talk",
        || whereabouts(&nodes),
    );
    drop(nodes);
    suite.finish()
}

/// Two nodes' plexus (state, bridge, kubeconfig of `kube-system/plexus`) and a macvlan master.
struct Nodes<'a> {
    cp: &'a ControlPlane,
    rig: Rig<'a>,
    bridges: [HostLink; 2],
    master: HostLink,
}

/// The bank NAD's one fixed address (static IPAM in the NAD).
const FIXED: &str = "10.56.7.10";

impl<'a> Nodes<'a> {
    fn new(cp: &'a ControlPlane) -> Result<Nodes<'a>> {
        let rig = Rig::builder()
            .deploy(&[
                "base/nad-crd.yaml",
                "base/rbac.yaml",
                "components/fixed-ips/rbac-fixed-ips.yaml",
            ])
            .plexus_token(PlexusToken::Unbound)
            .build(cp)?;
        // Plugins beyond Debian's (CNI_PATH): real whereabouts, when PLEXUS_IPAM_BIN is given.
        std::fs::create_dir_all(rig.path("bin"))?;
        let nodes = Nodes {
            cp,
            rig,
            bridges: [HostLink::bridge_name(), HostLink::bridge_name()],
            master: HostLink::veth_master(),
        };
        nodes.macvlan_nad(
            "ledger",
            &nodes.master,
            json!({"type":"static","addresses":[{"address":format!("{FIXED}/24")}]}),
        )?;
        Ok(nodes)
    }

    /// A macvlan NAD `NS/name` on `master` with `ipam` (admin, `kubectl apply`).
    fn macvlan_nad(&self, name: &str, master: &HostLink, ipam: Value) -> Result<()> {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":master.0,"mode":"bridge","ipam":ipam});
        self.cp.apply(
            &json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":{"name":name,"namespace":NS},"spec":{"config":cfg.to_string()}})
            .to_string(),
        )?;
        Ok(())
    }

    fn path(&self, p: &str) -> PathBuf {
        self.rig.path(p)
    }

    /// Node `n`'s plexus config.
    fn config(&self, n: usize) -> Value {
        json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus",
            "kubeconfig": self.rig.kubeconfig(), "cniDir": self.path(&format!("state-{n}")), "binDir": self.path("bin"),
            "confDir": self.path("confdir"), "logLevel":"debug", "logFile": self.path(&format!("plexus-{n}.log")), "logToStderr": false,
            "nadPolicy": nad_policy_allowing(&[self.rig.dir()]),
            "delegates":[flannel_like(&self.bridges[n].0, 61 + n as u8, &self.path(&format!("ipam-{n}")))]})
    }

    /// A pod asking for the ledger network; its UID.
    fn pod(&self, name: &str) -> Result<String> {
        self.pod_on(name, "ledger")
    }

    /// A pod asking for `network`; its UID.
    fn pod_on(&self, name: &str, network: &str) -> Result<String> {
        let pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":name,"namespace":NS,"annotations":{NETWORKS:network}},
            "spec":{"nodeName":"plexus-claims-node","automountServiceAccountToken":false,
                "containers":[{"name":"c","image":"local/pause:1"}]}});
        self.cp
            .kubectl_stdin(&["create", "-f", "-"], Some(&pod.to_string()))?;
        let p = self
            .cp
            .get_json(&format!("/api/v1/namespaces/{NS}/pods/{name}"))?;
        Ok(p["metadata"]["uid"].as_str().context("uid")?.to_string())
    }

    fn delete_pod(&self, name: &str) -> Result<()> {
        self.cp.kubectl(&[
            "-n",
            NS,
            "delete",
            "pod",
            name,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ])?;
        Ok(())
    }

    fn args(name: &str, uid: &str) -> String {
        format!("K8S_POD_INFRA_CONTAINER_ID=cid-{name};K8S_POD_UID={uid};IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={name}")
    }

    /// `command` for pod `name` on node `n`.
    fn call(&self, n: usize, command: &str, name: &str, uid: &str, netns: &str) -> Run {
        self.call_with(&bin("plexus"), n, command, name, uid, netns)
    }

    /// [`Nodes::call`] through `binary` (a wrapper giving the node its own files).
    fn call_with(
        &self,
        binary: &std::path::Path,
        n: usize,
        command: &str,
        name: &str,
        uid: &str,
        netns: &str,
    ) -> Run {
        run(
            binary,
            &Call {
                command,
                container_id: &format!("cid-{name}"),
                netns,
                ifname: "eth0",
                args: &Self::args(name, uid),
            },
            &self.config(n),
            &[],
        )
    }

    /// The claims of the ledger network: `(address, holder pod name, holder UID, node)`.
    fn claims(&self) -> Result<Vec<(String, String, String, String)>> {
        self.claims_of("ledger")
    }

    /// The claims of network `NS/network`.
    fn claims_of(&self, network: &str) -> Result<Vec<(String, String, String, String)>> {
        self.cp.address_claims(NS, network)
    }

    /// Plans, leases and pending releases left on both nodes.
    fn leftovers(&self) -> Vec<String> {
        (0..2)
            .flat_map(|n| {
                let mut v: Vec<String> = files_under(&self.path(&format!("state-{n}")))
                    .into_iter()
                    .filter(|f| !f.starts_with("locks"))
                    .collect();
                v.extend(files_under(&self.path(&format!("ipam-{n}"))));
                v
            })
            .collect()
    }

    fn events(&self, pod: &str) -> Result<Vec<Value>> {
        let list = self.cp.get_json(&format!(
            "/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name%3D{pod}"
        ))?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }
}

fn add_claims_del_releases(nodes: &Nodes<'_>) -> Result<()> {
    let uid = nodes.pod("vault-0")?;
    let ns = Netns::new();
    let before = nodes.cp.request_totals()?;
    let r = nodes.call(0, "ADD", "vault-0", &uid, &ns.path());
    let after = nodes.cp.request_totals()?;
    ensure!(r.code == 0, "ADD: {} {}", r.out, r.stderr);
    ensure!(
        ns.addrs("net1").iter().any(|a| a.starts_with(FIXED)),
        "net1: {:?}",
        ns.addrs("net1")
    );
    let d = metrics::delta(&before, &after, &["pods", "addressclaims"]);
    let n = |verb: &str, res: &str| d.get(&RequestKey::new(verb, res, "")).copied().unwrap_or(0);
    ensure!(
        n("LIST", "pods") == 0 && n("POST", "addressclaims") == 1,
        "requests: {d:?}"
    );
    let claims = nodes.claims()?;
    ensure!(
        claims.len() == 1 && claims[0].0 == FIXED && claims[0].1 == "vault-0" && claims[0].2 == uid,
        "{claims:?}"
    );
    let r = nodes.call(0, "DEL", "vault-0", &uid, &ns.path());
    ensure!(r.code == 0, "DEL: {}", r.out);
    ensure!(nodes.claims()?.is_empty(), "{:?}", nodes.claims()?);
    ensure!(nodes.leftovers().is_empty(), "{:?}", nodes.leftovers());
    nodes.delete_pod("vault-0")
}

fn two_nodes_race(nodes: &Nodes<'_>) -> Result<()> {
    let names = ["race-a", "race-b"];
    let uids = [nodes.pod(names[0])?, nodes.pod(names[1])?];
    let nss = [Netns::new(), Netns::new()];
    let barrier = Barrier::new(2);
    let runs: Vec<Run> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|n| {
                let (barrier, nss, uids) = (&barrier, &nss, &uids);
                s.spawn(move || {
                    barrier.wait();
                    nodes.call(n, "ADD", names[n], &uids[n], &nss[n].path())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("ADD")).collect()
    });
    let won: Vec<usize> = (0..2).filter(|n| runs[*n].code == 0).collect();
    ensure!(
        won.len() == 1,
        "want exactly one winner: {} / {}",
        runs[0].out,
        runs[1].out
    );
    let (w, l) = (won[0], 1 - won[0]);
    let err = &runs[l].out;
    ensure!(err["code"] == 11, "{err}");
    let msg = format!("{}", err["msg"]);
    let details = format!("{}", err["details"]);
    ensure!(
        msg.contains(names[l]) && (msg.contains(FIXED) || details.contains(FIXED)),
        "{err}"
    );
    ensure!(
        details.contains(&format!("{NS}/{}", names[w]))
            || msg.contains(&format!("{NS}/{}", names[w])),
        "the error does not name the holder: {err}"
    );
    ensure!(
        nss[l].links() == ["lo"],
        "the loser kept {:?}",
        nss[l].links()
    );
    only_the_holder_answers(&nodes.master, &nss[w])?;
    let mut warned = false;
    for _ in 0..50 {
        warned = nodes
            .events(names[l])?
            .iter()
            .any(|e| e["type"] == "Warning" && e["message"].as_str().unwrap_or("").contains(FIXED));
        if warned {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ensure!(
        warned,
        "no Warning event on {}: {:?}",
        names[l],
        nodes.events(names[l])?
    );
    let claims = nodes.claims()?;
    ensure!(
        claims.len() == 1 && claims[0].1 == names[w],
        "claims: {claims:?}"
    );
    for n in 0..2 {
        let r = nodes.call(n, "DEL", names[n], &uids[n], &nss[n].path());
        ensure!(r.code == 0, "DEL: {}", r.out);
        nodes.delete_pod(names[n])?;
    }
    ensure!(nodes.claims()?.is_empty(), "{:?}", nodes.claims()?);
    ensure!(nodes.leftovers().is_empty(), "{:?}", nodes.leftovers());
    Ok(())
}

/// The IPv6 address two pods ask for through the `ips` of their network selection, one
/// canonically, one in long form ([`FIXED6_LONG`]).
const FIXED6: &str = "fd00:56:7::a";
const FIXED6_LONG: &str = "fd00:0056:0007:0000:0000:0000:0000:000a";

/// [`two_nodes_race`] over IPv6 with the address spelled two ways: a macvlan NAD with static
/// IPAM taking requested addresses; pod `race6-a` asks for [`FIXED6`], `race6-b` for
/// [`FIXED6_LONG`] at the same moment on two nodes. Exactly one wins; the loser gets code 11
/// naming the address and the holder; one claim exists, its address in canonical form; a
/// client on the segment reaches the address over IPv6 at the winner's MAC.
fn two_nodes_race6(nodes: &Nodes<'_>) -> Result<()> {
    nodes.macvlan_nad("ledger6", &nodes.master, json!({"type":"static"}))?;
    let names = ["race6-a", "race6-b"];
    let asks = [FIXED6, FIXED6_LONG];
    let mut uids = Vec::new();
    for (name, ask) in names.iter().zip(asks) {
        let sel = json!([{"name":"ledger6","ips":[format!("{ask}/64")]}]).to_string();
        uids.push(nodes.pod_on(name, &sel)?);
    }
    let nss = [Netns::new(), Netns::new()];
    let barrier = Barrier::new(2);
    let runs: Vec<Run> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|n| {
                let (barrier, nss, uids) = (&barrier, &nss, &uids);
                s.spawn(move || {
                    barrier.wait();
                    nodes.call(n, "ADD", names[n], &uids[n], &nss[n].path())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("ADD")).collect()
    });
    let won: Vec<usize> = (0..2).filter(|n| runs[*n].code == 0).collect();
    ensure!(
        won.len() == 1,
        "want exactly one winner: {} / {}",
        runs[0].out,
        runs[1].out
    );
    let (w, l) = (won[0], 1 - won[0]);
    let err = &runs[l].out;
    ensure!(err["code"] == 11, "{err}");
    let text = format!("{} {}", err["msg"], err["details"]);
    ensure!(
        text.contains(names[l]) && text.contains(FIXED6),
        "the error does not name the pod and the address: {err}"
    );
    ensure!(
        text.contains(&format!("{NS}/{}", names[w])),
        "the error does not name the holder: {err}"
    );
    ensure!(
        nss[l].links() == ["lo"],
        "the loser kept {:?}",
        nss[l].links()
    );
    let claims = nodes.claims_of("ledger6")?;
    ensure!(
        claims.len() == 1 && claims[0].1 == names[w] && claims[0].0 == FIXED6,
        "want one claim of {FIXED6} by {}: {claims:?}",
        names[w]
    );
    ensure!(
        nss[w]
            .addrs("net1")
            .iter()
            .any(|a| a.starts_with(&format!("{FIXED6}/"))),
        "the winner's net1: {:?}",
        nss[w].addrs("net1")
    );
    the_holder_answers_over_ipv6(&nodes.master, &nss[w])?;
    for n in 0..2 {
        let r = nodes.call(n, "DEL", names[n], &uids[n], &nss[n].path());
        ensure!(r.code == 0, "DEL: {}", r.out);
        nodes.delete_pod(names[n])?;
    }
    ensure!(
        nodes.claims_of("ledger6")?.is_empty(),
        "{:?}",
        nodes.claims_of("ledger6")?
    );
    ensure!(nodes.leftovers().is_empty(), "{:?}", nodes.leftovers());
    Ok(())
}

/// A client on the segment pings [`FIXED6`] over IPv6 and finds it at the MAC of `holder`'s
/// `net1` (`ip -6 neigh`).
fn the_holder_answers_over_ipv6(master: &HostLink, holder: &Netns) -> Result<()> {
    let links: Value = serde_json::from_str(&holder.ip(&["-j", "link", "show", "net1"]))?;
    let mac = links[0]["address"]
        .as_str()
        .context("the holder's net1 has no MAC")?
        .to_string();
    let client = Netns::new();
    let link = common::uniq("pxq");
    let sh = |args: &[&str]| -> Result<()> {
        let ok = std::process::Command::new(args[0])
            .args(&args[1..])
            .stdout(std::process::Stdio::null())
            .status()?
            .success();
        ensure!(ok, "{args:?} failed");
        Ok(())
    };
    sh(&[
        "ip", "link", "add", &link, "link", &master.0, "type", "macvlan", "mode", "bridge",
    ])?;
    sh(&["ip", "link", "set", &link, "netns", &client.name])?;
    sh(&[
        "ip",
        "-n",
        &client.name,
        "addr",
        "add",
        "fd00:56:7::99/64",
        "dev",
        &link,
        "nodad",
    ])?;
    sh(&["ip", "-n", &client.name, "link", "set", &link, "up"])?;
    // The winner's address may still be in DAD (macvlan does not wait for it): up to 5 s.
    let mut answered = false;
    for _ in 0..10 {
        if sh(&[
            "ip",
            "netns",
            "exec",
            &client.name,
            "ping",
            "-6",
            "-c",
            "1",
            "-W",
            "1",
            FIXED6,
        ])
        .is_ok()
        {
            answered = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    ensure!(
        answered,
        "a client on the segment got no IPv6 answer from the winner"
    );
    let neigh = client.ip(&["-6", "neigh", "show", FIXED6]);
    ensure!(
        neigh.contains(&mac),
        "{FIXED6} answered from {neigh}, not the winner's {mac}"
    );
    Ok(())
}

/// A client on the segment (a macvlan of `master` in its own netns) pings [`FIXED`] and finds it
/// at the MAC of `holder`'s `net1`: the address is in use once, by the winner.
fn only_the_holder_answers(master: &HostLink, holder: &Netns) -> Result<()> {
    let links: Value = serde_json::from_str(&holder.ip(&["-j", "link", "show", "net1"]))?;
    let mac = links[0]["address"]
        .as_str()
        .context("the holder's net1 has no MAC")?
        .to_string();
    let client = Netns::new();
    let link = common::uniq("pxq");
    let sh = |args: &[&str]| -> Result<()> {
        let ok = std::process::Command::new(args[0])
            .args(&args[1..])
            .status()?
            .success();
        ensure!(ok, "{args:?} failed");
        Ok(())
    };
    sh(&[
        "ip", "link", "add", &link, "link", &master.0, "type", "macvlan", "mode", "bridge",
    ])?;
    sh(&["ip", "link", "set", &link, "netns", &client.name])?;
    sh(&[
        "ip",
        "-n",
        &client.name,
        "addr",
        "add",
        "10.56.7.99/24",
        "dev",
        &link,
    ])?;
    sh(&["ip", "-n", &client.name, "link", "set", &link, "up"])?;
    sh(&[
        "ip",
        "netns",
        "exec",
        &client.name,
        "ping",
        "-c",
        "2",
        "-W",
        "2",
        FIXED,
    ])
    .context("a client on the segment got no answer from the winner")?;
    let neigh = client.ip(&["neigh", "show", FIXED]);
    ensure!(
        neigh.contains(&mac),
        "{FIXED} answered from {neigh}, not the winner's {mac}"
    );
    Ok(())
}

fn del_apiserver_down(nodes: &Nodes<'_>) -> Result<()> {
    let uid = nodes.pod("vault-1")?;
    let ns = Netns::new();
    let r = nodes.call(0, "ADD", "vault-1", &uid, &ns.path());
    ensure!(r.code == 0, "ADD: {}", r.out);
    ensure!(nodes.claims()?.len() == 1);
    nodes.cp.stop_apiserver();
    let first = nodes.call(0, "DEL", "vault-1", &uid, &ns.path());
    let pending = files_under(&nodes.path("state-0/claims-pending"));
    let started = nodes.cp.start_apiserver();
    ensure!(
        first.code == 0,
        "DEL with the apiserver stopped: {}",
        first.out
    );
    started?;
    ensure!(ns.links() == ["lo"], "{:?}", ns.links());
    ensure!(pending.len() == 1, "pending releases: {pending:?}");
    let claims = nodes.claims()?;
    ensure!(claims.len() == 1 && claims[0].2 == uid, "{claims:?}");
    // The runtime's next DEL (empty netns) releases it.
    let again = nodes.call(0, "DEL", "vault-1", &uid, "");
    ensure!(again.code == 0, "{}", again.out);
    ensure!(nodes.claims()?.is_empty(), "{:?}", nodes.claims()?);
    ensure!(nodes.leftovers().is_empty(), "{:?}", nodes.leftovers());
    nodes.delete_pod("vault-1")
}

fn dead_node_take_over(nodes: &Nodes<'_>) -> Result<()> {
    // vault-2 runs on node 0, which dies: the operator force-deletes the pod, the StatefulSet
    // controller creates it again (same name, new UID), scheduled on node 1.
    let old = nodes.pod("vault-2")?;
    let ns0 = Netns::new();
    ensure!(nodes.call(0, "ADD", "vault-2", &old, &ns0.path()).code == 0);
    // While the old pod exists, the address is its.
    let other = nodes.pod("vault-x")?;
    let nsx = Netns::new();
    let refused = nodes.call(1, "ADD", "vault-x", &other, &nsx.path());
    ensure!(refused.out["code"] == 11, "{}", refused.out);
    ensure!(nodes.call(1, "DEL", "vault-x", &other, &nsx.path()).code == 0);
    nodes.delete_pod("vault-x")?;
    nodes.delete_pod("vault-2")?;
    let mut new = String::new();
    for _ in 0..50 {
        if let Ok(u) = nodes.pod("vault-2") {
            new = u;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ensure!(!new.is_empty() && new != old, "vault-2 not recreated");
    let ns1 = Netns::new();
    let r = nodes.call(1, "ADD", "vault-2", &new, &ns1.path());
    ensure!(r.code == 0, "the replacement: {}", r.out);
    let claims = nodes.claims()?;
    ensure!(claims.len() == 1 && claims[0].2 == new, "{claims:?}");
    // Node 0 comes back and its runtime DELs the old sandbox: the new claim stays.
    ensure!(nodes.call(0, "DEL", "vault-2", &old, &ns0.path()).code == 0);
    let claims = nodes.claims()?;
    ensure!(claims.len() == 1 && claims[0].2 == new, "{claims:?}");
    ensure!(nodes.call(1, "DEL", "vault-2", &new, &ns1.path()).code == 0);
    ensure!(nodes.claims()?.is_empty(), "{:?}", nodes.claims()?);
    nodes.delete_pod("vault-2")?;
    ensure!(nodes.leftovers().is_empty(), "{:?}", nodes.leftovers());
    Ok(())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn client(cp: &ControlPlane, rt: &tokio::runtime::Runtime) -> Result<KubeClient> {
    rt.block_on(KubeClient::from_kubeconfig_path(&cp.admin_kubeconfig()))
        .context("client")
}

fn spec(addr: IpAddr, pod: &str, uid: &str, node: &str) -> ClaimSpec {
    ClaimSpec {
        network: format!("{NS}/db-net"),
        address: addr.to_string(),
        node: node.into(),
        container_id: format!("c-{pod}"),
        pod: ClaimHolder {
            namespace: NS.into(),
            name: pod.into(),
            uid: uid.into(),
        },
    }
}

/// [`race`] over IPv6: 10 addresses, node-a spelling each canonically (`fd00:56:100::a0`),
/// node-b long-hand (`fd00:0056:0100:0000:0000:0000:0000:00a0`), at the same moment. One
/// claim object per address (its name does not depend on the spelling): exactly one creates
/// it, the other finds it held.
fn race6(cp: &ControlPlane) -> Result<()> {
    let n = 10u16;
    let barrier = Barrier::new(2);
    let net = format!("{NS}/db-net6");
    let outcomes: Vec<Vec<ClaimOutcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = ["node-a", "node-b"]
            .into_iter()
            .map(|node| {
                let (barrier, net) = (&barrier, &net);
                s.spawn(move || -> Result<Vec<ClaimOutcome>> {
                    let rt = rt();
                    let c = client(cp, &rt)?;
                    let mut got = vec![];
                    for i in 0..n {
                        let text = if node == "node-a" {
                            format!("fd00:56:100::{:x}", 0xa0 + i)
                        } else {
                            format!("fd00:0056:0100:0000:0000:0000:0000:{:04x}", 0xa0 + i)
                        };
                        let mut sp = spec(
                            text.parse()?,
                            &format!("pg-{i}-{node}"),
                            &format!("{node}-6-{i}"),
                            node,
                        );
                        sp.network = net.clone();
                        sp.address = text;
                        barrier.wait();
                        got.push(rt.block_on(c.claim_address(NS, &sp, RetryPolicy::none()))?);
                    }
                    Ok(got)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("claimer"))
            .collect::<Result<Vec<_>>>()
    })?;
    for (i, (a, b)) in outcomes[0].iter().zip(&outcomes[1]).enumerate() {
        let wins = [a, b]
            .iter()
            .filter(|o| ***o == ClaimOutcome::Created)
            .count();
        ensure!(wins == 1, "IPv6 address {i}: {a:?} / {b:?}");
        let loser = if *a == ClaimOutcome::Created { b } else { a };
        ensure!(
            matches!(loser, ClaimOutcome::HeldBy { .. }),
            "IPv6 address {i}: the loser saw {loser:?}"
        );
    }
    let claims = cp.address_claims(NS, "db-net6")?;
    ensure!(
        claims.len() == usize::from(n),
        "want {n} claims, one per address: {claims:?}"
    );
    Ok(())
}

/// 20 addresses, each claimed by two threads with their own connections released together.
fn race(cp: &ControlPlane) -> Result<()> {
    let n = 20;
    let barrier = Barrier::new(2);
    let outcomes: Vec<Vec<ClaimOutcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = ["node-a", "node-b"]
            .into_iter()
            .map(|node| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Vec<ClaimOutcome>> {
                    let rt = rt();
                    let c = client(cp, &rt)?;
                    let mut got = vec![];
                    for i in 0..n {
                        let addr: IpAddr = format!("10.56.100.{}", 100 + i).parse()?;
                        let sp = spec(
                            addr,
                            &format!("mysql-{i}-{node}"),
                            &format!("{node}-{i}"),
                            node,
                        );
                        barrier.wait();
                        got.push(rt.block_on(c.claim_address(NS, &sp, RetryPolicy::none()))?);
                    }
                    Ok(got)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("claimer"))
            .collect::<Result<Vec<_>>>()
    })?;
    for (i, (a, b)) in outcomes[0].iter().zip(&outcomes[1]).enumerate() {
        let wins = [a, b]
            .iter()
            .filter(|o| ***o == ClaimOutcome::Created)
            .count();
        ensure!(wins == 1, "address {i}: {a:?} / {b:?}");
        let loser = if *a == ClaimOutcome::Created { b } else { a };
        ensure!(
            matches!(loser, ClaimOutcome::HeldBy { .. }),
            "address {i}: the loser saw {loser:?}"
        );
    }
    Ok(())
}

/// The holder is gone (its claim names a UID no pod has): two contenders take over at the same
/// resourceVersion; exactly one PUT succeeds, the other is a conflict; a release by the old
/// holder's UID leaves the new claim.
fn take_over(cp: &ControlPlane) -> Result<()> {
    let rt = rt();
    let c = client(cp, &rt)?;
    let addr: IpAddr = "10.56.100.200".parse()?;
    ensure!(
        rt.block_on(c.claim_address(
            NS,
            &spec(addr, "mysql-0", "old-uid", "node-a"),
            RetryPolicy::none()
        ))? == ClaimOutcome::Created
    );
    let ClaimOutcome::HeldBy {
        resource_version, ..
    } = rt.block_on(c.claim_address(
        NS,
        &spec(addr, "mysql-0", "new-a", "node-b"),
        RetryPolicy::none(),
    ))?
    else {
        anyhow::bail!("a second claim was not refused");
    };
    let first = rt.block_on(c.take_over_claim(
        NS,
        &spec(addr, "mysql-0", "new-a", "node-b"),
        &resource_version,
    ));
    let second = rt.block_on(c.take_over_claim(
        NS,
        &spec(addr, "mysql-0", "new-b", "node-a"),
        &resource_version,
    ));
    ensure!(first.is_ok(), "first take-over: {first:?}");
    ensure!(
        second.is_err(),
        "the second take-over at the same version won too"
    );
    rt.block_on(c.release_claim(
        NS,
        &format!("{NS}/db-net"),
        addr,
        "old-uid",
        RetryPolicy::none(),
    ))?;
    ensure!(
        rt.block_on(c.claim_address(
            NS,
            &spec(addr, "mysql-0", "new-a", "node-b"),
            RetryPolicy::none()
        ))? == ClaimOutcome::AlreadyOurs,
        "the old holder's release removed the new claim"
    );
    rt.block_on(c.release_claim(
        NS,
        &format!("{NS}/db-net"),
        addr,
        "new-a",
        RetryPolicy::none(),
    ))?;
    ensure!(
        rt.block_on(c.claim_address(
            NS,
            &spec(addr, "mysql-1", "x", "node-a"),
            RetryPolicy::none()
        ))? == ClaimOutcome::Created,
        "released claim still there"
    );
    Ok(())
}

/// One family's fixed address, the pool holding it and the exclude that frees it.
struct PoolCase {
    /// NAD and pod name suffix.
    tag: &'static str,
    /// The fixed address as the NAD writes it, and in the form messages and `ip` print it.
    fixed: &'static str,
    printed: &'static str,
    /// The whereabouts range, and the exclude (one address) that frees the fixed one.
    range: &'static str,
    exclude: &'static str,
}

const V4_POOL: PoolCase = PoolCase {
    tag: "",
    fixed: "10.58.0.10/24",
    printed: "10.58.0.10",
    range: "10.58.0.0/24",
    exclude: "10.58.0.10/32",
};

/// IPv6, the fixed address written long-hand in the NAD.
const V6_POOL: PoolCase = PoolCase {
    tag: "6",
    fixed: "fd00:0058:0000:0000:0000:0000:0000:0010/64",
    printed: "fd00:58::10",
    range: "fd00:58::/64",
    exclude: "fd00:58::10/128",
};

/// A NAD fixing an address and a whereabouts NAD whose range holds it, on one macvlan master:
/// the fixed pod is refused (code 7, both networks named, a Warning event) until the pool
/// excludes the address; a NAD on another master is no concern.
fn fixed_in_pool(nodes: &Nodes<'_>, c: &PoolCase) -> Result<()> {
    let master = HostLink::veth_master();
    let nad = |name: &str, ipam: Value| nodes.macvlan_nad(name, &master, ipam);
    let (fixed, clients, pod) = (
        format!("vault-fixed{}", c.tag),
        format!("vault-clients{}", c.tag),
        format!("vault-9{}", c.tag),
    );
    let pod = pod.as_str();
    nad(
        &fixed,
        json!({"type":"static","addresses":[{"address":c.fixed}]}),
    )?;
    nad(&clients, json!({"type":"whereabouts","range":c.range}))?;
    let uid = nodes.pod_on(pod, &fixed)?;
    let ns = Netns::new();
    let refused = nodes.call(0, "ADD", pod, &uid, &ns.path());
    let err = &refused.out;
    ensure!(refused.code != 0 && err["code"] == 7, "{err}");
    let msg = err["msg"].as_str().unwrap_or("");
    ensure!(
        msg.contains(pod)
            && msg.contains(&format!("{NS}/{fixed}"))
            && msg.contains(&format!("{NS}/{clients}"))
            && msg.contains(c.printed)
            && msg.contains("whereabouts"),
        "{err}"
    );
    ensure!(ns.links() == ["lo"], "{:?}", ns.links());
    ensure!(
        nodes.claims_of(&fixed)?.is_empty(),
        "a refused ADD claimed the address"
    );
    let mut warned = false;
    for _ in 0..50 {
        warned = nodes.events(pod)?.iter().any(|e| {
            e["type"] == "Warning" && e["message"].as_str().unwrap_or("").contains(&clients)
        });
        if warned {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ensure!(warned, "no Warning event: {:?}", nodes.events(pod)?);
    ensure!(nodes.call(0, "DEL", pod, &uid, &ns.path()).code == 0);
    // The operator excludes the fixed address from the pool: the replica starts.
    nad(
        &clients,
        json!({"type":"whereabouts","range":c.range,"exclude":[c.exclude]}),
    )?;
    let ok = nodes.call(0, "ADD", pod, &uid, &ns.path());
    ensure!(ok.code == 0, "after the exclude: {}", ok.out);
    ensure!(
        ns.addrs("net1")
            .iter()
            .any(|a| a.starts_with(&format!("{}/", c.printed))),
        "{:?}",
        ns.addrs("net1")
    );
    ensure!(nodes.call(0, "DEL", pod, &uid, &ns.path()).code == 0);
    nodes.delete_pod(pod)?;
    ensure!(nodes.leftovers().is_empty(), "{:?}", nodes.leftovers());
    Ok(())
}

/// A macvlan NAD with host-local used from two nodes, each with its own host-local store (node
/// 1's plexus runs in a mount namespace where another directory is bind-mounted over the
/// store): both hand out the first address; the second pod starts but gets a Warning event
/// naming the first pod and the fix; the claim is the first pod's and goes with its DEL.
fn host_local_two_nodes(nodes: &Nodes<'_>) -> Result<()> {
    let master = HostLink::veth_master();
    let store = nodes.path("hl-store");
    let other_store = nodes.path("hl-store-node1");
    std::fs::create_dir_all(&store)?;
    std::fs::create_dir_all(&other_store)?;
    nodes.macvlan_nad(
        "spread",
        &master,
        json!({"type":"host-local","dataDir":store,"ranges":[[{"subnet":"10.60.0.0/24"}]]}),
    )?;
    let wrapper = nodes.path("plexus-node1");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec unshare -m --propagation private sh -c 'mount --bind \"$1\" \"$2\" && exec \"$3\"' node1 {} {} {}\n",
            other_store.display(),
            store.display(),
            bin("plexus").display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let (ua, ub) = (
        nodes.pod_on("web-a", "spread")?,
        nodes.pod_on("web-b", "spread")?,
    );
    let (na, nb) = (Netns::new(), Netns::new());
    let a = nodes.call(0, "ADD", "web-a", &ua, &na.path());
    ensure!(a.code == 0, "{}", a.out);
    let b = nodes.call_with(&wrapper, 1, "ADD", "web-b", &ub, &nb.path());
    ensure!(b.code == 0, "the second node's ADD: {} {}", b.out, b.stderr);
    let (aa, ab) = (na.addrs("net1"), nb.addrs("net1"));
    ensure!(
        !aa.is_empty() && aa == ab,
        "want one address handed out twice (two host-local stores): {aa:?} / {ab:?}"
    );
    let mut warned = None;
    for _ in 0..50 {
        warned = nodes
            .events("web-b")?
            .into_iter()
            .find(|e| e["reason"] == "AddressDuplicated");
        if warned.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let warned = warned.context("no AddressDuplicated event on web-b")?;
    let msg = warned["message"].as_str().unwrap_or("");
    ensure!(
        warned["type"] == "Warning"
            && msg.contains(&format!("{NS}/web-a"))
            && msg.contains("whereabouts"),
        "{warned}"
    );
    ensure!(
        nodes
            .events("web-a")?
            .iter()
            .all(|e| e["reason"] != "AddressDuplicated"),
        "the first pod was warned"
    );
    let spread: Vec<_> = nodes
        .claims_of("spread")?
        .into_iter()
        .map(|c| c.1)
        .collect();
    ensure!(spread == ["web-a"], "claims: {spread:?}");
    ensure!(
        nodes
            .call_with(&wrapper, 1, "DEL", "web-b", &ub, &nb.path())
            .code
            == 0
    );
    ensure!(nodes.call(0, "DEL", "web-a", &ua, &na.path()).code == 0);
    ensure!(
        nodes.claims_of("spread")?.is_empty(),
        "{:?}",
        nodes.claims_of("spread")?
    );
    for p in ["web-a", "web-b"] {
        nodes.delete_pod(p)?;
    }
    ensure!(
        files_under(&store)
            .iter()
            .chain(files_under(&other_store).iter())
            .all(|f| !f.starts_with("10.")),
        "leases left"
    );
    ensure!(nodes.leftovers().is_empty(), "{:?}", nodes.leftovers());
    Ok(())
}

/// Real whereabouts v0.8.0 (`PLEXUS_IPAM_BIN`, its CRDs from `../shared/ipam`) beside a fixed
/// address on one macvlan segment: the replica's NAD fixes 10.62.0.10, the clients' NAD pools
/// 10.62.0.8–14 through whereabouts and excludes it. Six clients on two nodes get the six other
/// addresses (one pool for the cluster), never the replica's; each reaches the replica on net1
/// by ping; after DEL whereabouts' pool is empty and no claim is left.
fn whereabouts(nodes: &Nodes<'_>) -> Result<()> {
    let Some(ipam_bin) = std::env::var_os("PLEXUS_IPAM_BIN").map(PathBuf::from) else {
        ensure!(
            std::env::var("PLEXUS_K8S_REQUIRE").as_deref() != Ok("1"),
            "PLEXUS_IPAM_BIN is not set (../shared/ipam/bin)"
        );
        println!("    skipped: PLEXUS_IPAM_BIN not set");
        return Ok(());
    };
    let crds = ipam_bin.join("../whereabouts");
    for crd in [
        "whereabouts.cni.cncf.io_ippools.yaml",
        "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
    ] {
        nodes.cp.apply_file(&crds.join(crd))?;
    }
    nodes.cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/ippools.whereabouts.cni.cncf.io",
        "crd/overlappingrangeipreservations.whereabouts.cni.cncf.io",
    ])?;
    let plugin = nodes.path("bin/whereabouts");
    let unpacked = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "xz -dc '{}' > '{}' && chmod 0755 '{}'",
            ipam_bin.join("whereabouts.xz").display(),
            plugin.display(),
            plugin.display()
        ))
        .status()?;
    ensure!(unpacked.success(), "cannot unpack whereabouts");
    // whereabouts' own flat config: the API server (admin here; its DaemonSet has its own RBAC).
    let flat = nodes.path("whereabouts.conf");
    std::fs::write(
        &flat,
        json!({"datastore":"kubernetes","kubernetes":{"kubeconfig":nodes.cp.admin_kubeconfig()},
            "log_file":nodes.path("whereabouts.log"),"log_level":"debug"})
        .to_string(),
    )?;
    let master = HostLink::veth_master();
    let nad = |name: &str, ipam: Value| nodes.macvlan_nad(name, &master, ipam);
    nad(
        "teller-db",
        json!({"type":"static","addresses":[{"address":"10.62.0.10/24"}]}),
    )?;
    nad(
        "teller-clients",
        json!({"type":"whereabouts","range":"10.62.0.0/24","range_start":"10.62.0.8",
            "range_end":"10.62.0.14","exclude":["10.62.0.10/32"],"configuration_path":flat}),
    )?;
    let db_uid = nodes.pod_on("teller-0", "teller-db")?;
    let db_ns = Netns::new();
    let db = nodes.call(0, "ADD", "teller-0", &db_uid, &db_ns.path());
    ensure!(db.code == 0, "the replica: {}", db.out);
    let mut clients = Vec::new();
    for i in 0..6 {
        let name = format!("teller-client-{i}");
        let uid = nodes.pod_on(&name, "teller-clients")?;
        let ns = Netns::new();
        let r = nodes.call(i % 2, "ADD", &name, &uid, &ns.path());
        ensure!(r.code == 0, "{name}: {} {}", r.out, r.stderr);
        clients.push((name, uid, ns, i % 2));
    }
    let addrs: Vec<String> = clients
        .iter()
        .map(|c| c.2.addrs("net1").first().cloned().unwrap_or_default())
        .collect();
    println!("    whereabouts gave the clients {addrs:?}");
    let distinct: std::collections::BTreeSet<&String> = addrs.iter().collect();
    ensure!(
        distinct.len() == addrs.len(),
        "an address given twice: {addrs:?}"
    );
    ensure!(
        addrs
            .iter()
            .all(|a| a.starts_with("10.62.0.") && !a.starts_with("10.62.0.10/")),
        "{addrs:?}"
    );
    for (name, _, ns, _) in &clients {
        let ping = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.name,
                "ping",
                "-c",
                "1",
                "-W",
                "2",
                "10.62.0.10",
            ])
            .output()?;
        ensure!(
            ping.status.success(),
            "{name} -> the replica 10.62.0.10 on net1: no answer"
        );
    }
    for (name, uid, ns, n) in &clients {
        ensure!(nodes.call(*n, "DEL", name, uid, &ns.path()).code == 0);
        nodes.delete_pod(name)?;
    }
    ensure!(
        nodes
            .call(0, "DEL", "teller-0", &db_uid, &db_ns.path())
            .code
            == 0
    );
    nodes.delete_pod("teller-0")?;
    let pools = nodes.cp.get_json(&format!(
        "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/{NS}/ippools"
    ))?;
    let left: usize = pools["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p["spec"]["allocations"].as_object().map_or(0, |a| a.len()))
        .sum();
    ensure!(left == 0, "whereabouts allocations left: {pools}");
    ensure!(nodes.claims_of("teller-db")?.is_empty());
    ensure!(nodes.leftovers().is_empty(), "{:?}", nodes.leftovers());
    Ok(())
}
