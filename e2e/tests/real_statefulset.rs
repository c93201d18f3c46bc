//! StatefulSet tier: fixed addresses bound to replica identity (NAD annotation
//! `plexus.cni.io/fixed-ips`) on a real one-node cluster — kube-apiserver, the real
//! kube-scheduler (binds the replicas) and kube-controller-manager running the statefulset
//! controller, a real kubelet and containerd (`plexus_e2e::realk8s::node`) with a bridge primary.
//! Plexus runs with a TokenRequest token for `kube-system/plexus` (deploy/base/rbac.yaml +
//! components/fixed-ips/rbac-fixed-ips.yaml + components/daemon/rbac-daemon.yaml, with the AddressClaim CRD: each replica's address is
//! claimed in the API, and no claim is left at the end) and declares the runtime's pod-annotations capability
//! (so the owner of a replica is read with one GET when a NAD has a mapping).
//!
//! Cases, in order, thin mode: 3 replicas get the 3 mapped addresses; a deleted replica comes
//! back with its address; 3 → 5 with 4 mapped: replica 4 gets a clear event and no network;
//! down to 2 and up to 4 again; the mapping changed while pods run (running ones keep theirs,
//! a recreated one gets the new one); a NAD with a static address used by a 2-replica set and a
//! pod asking for a replica's address: never one address twice (AddressInUse event); a set `pg`
//! mapped in both families (`pg-0` IPv4 and IPv6, `pg-1` IPv6 only): the addresses on net1, in
//! network-status and claimed, IPv6 pings between the replicas, `pg-0` recreated keeps both.
//! Then daemon
//! mode (plexus-daemon, the shim): the replicas again, a recreated one with its address, the
//! unmapped ordinal refused. Finally everything deleted: no plan, netns or pod left.
//!
//! Skipped (and passing) without `PLEXUS_K8S_BIN`; `PLEXUS_K8S_REQUIRE=1` makes that a failure.

#[allow(dead_code)]
#[path = "real_node/api.rs"]
mod api;
mod common;
#[allow(dead_code)]
#[path = "real_node/pods.rs"]
mod pods;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::node::{wait_for, Node};
use plexus_e2e::realk8s::node_rig::{scrape_metric, DaemonOpts, PlexusDaemon};
use plexus_e2e::realk8s::rig::{plexus_kubeconfig, ControlLoops, PlexusToken};
use plexus_e2e::realk8s::{control_plane_or_skip, free_port, setup_or_report, ControlPlane, Suite};
use serde_json::{json, Value};

use api::Api;
use pods::{network_status, running, wait_until_plexus_is_in_the_path, IMAGE, NETWORKS};

const NS: &str = "sts";
const NODE: &str = "plexus-snode";
/// The bridge primary's conflist in the node's CNI config directory.
const PRIMARY_CONF: &str = "10-bridge.conflist";
const MAPPING: &str = "plexus.cni.io/fixed-ips";
const WAIT: Duration = Duration::from_secs(60);

fn addr(ord: usize) -> String {
    format!("10.246.0.1{ord}")
}

/// The initial mapping: 4 addresses for StatefulSet mysql.
fn mapping(one: &str) -> String {
    json!({"mysql": [format!("{}/24", addr(0)), format!("{one}/24"),
                     format!("{}/24", addr(2)), format!("{}/24", addr(3))]})
    .to_string()
}

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let Some(mut tier) = setup_or_report("real_statefulset", &cp, Tier::start(&cp)) else {
        return ExitCode::FAILURE;
    };
    let mut suite = Suite::new("real_statefulset");
    let installed = tier.install();
    let ok = installed.is_ok();
    suite.case("scheduler_controller_manager_and_plexus_running", || {
        installed
    });
    if ok {
        suite.case("three_replicas_get_the_three_mapped_addresses", || {
            tier.apply_set("mysql", "data", 3)?;
            tier.expect_addresses(&[0, 1, 2], &|o| addr(o))
        });
        suite.case("deleted_replica_comes_back_with_its_address", || {
            tier.recreate("mysql-1")?;
            tier.expect_addresses(&[0, 1, 2], &|o| addr(o))
        });
        suite.case(
            "scale_3_to_5_with_4_mapped_replica_4_gets_an_event_and_no_network",
            || {
                tier.scale("mysql", 5)?;
                tier.expect_addresses(&[0, 1, 2, 3], &|o| addr(o))?;
                tier.expect_refused("mysql-4", "no fixed address for mysql-4")
            },
        );
        suite.case("scale_down_to_2_and_up_to_4_again", || {
            tier.scale("mysql", 2)?;
            tier.wait_gone(&["mysql-2", "mysql-3", "mysql-4"])?;
            tier.scale("mysql", 4)?;
            tier.expect_addresses(&[0, 1, 2, 3], &|o| addr(o))
        });
        suite.case("mapping_changed_while_pods_run", || tier.mapping_changed());
        suite.case("a_static_address_is_never_given_twice", || {
            tier.never_twice()
        });
        suite.case(
            "ipv6_and_dual_entries_per_ordinal_a_recreated_replica_keeps_both",
            || tier.dual_set(),
        );
        suite.case("daemon_mode_replicas_get_and_keep_their_addresses", || {
            tier.daemon_mode()
        });
        suite.case("everything_deleted_nothing_left", || tier.delete_all());
    }
    tier.stop();
    drop(tier);
    suite.finish()
}

/// A short unique link name (at most 15 bytes).
fn link(suffix: &str) -> String {
    format!("pxs{}{suffix}", std::process::id() % 100_000)
}

struct Tier<'a> {
    cp: &'a ControlPlane,
    node: Node<'a>,
    api: Api,
    bridges: Vec<String>,
    loops: Option<ControlLoops>,
    daemon: Option<PlexusDaemon>,
    metrics_port: u16,
    /// The netns of every replica checked (all must be gone at the end; other tiers on the
    /// machine make netns of their own, so the host's list is no measure).
    netns_seen: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl<'a> Tier<'a> {
    fn start(cp: &'a ControlPlane) -> Result<Tier<'a>> {
        let bridges = vec![link("c"), link("d"), link("f")];
        let primary_bridge = bridges[0].clone();
        let primary = move |ipam: &Path| {
            json!({"cniVersion":"1.0.0","name":"cbr0","plugins":[
                {"type":"bridge","bridge":primary_bridge,"isGateway":true,"isDefaultGateway":true,
                 "ipMasq":false,"hairpinMode":true,
                 "ipam":{"type":"host-local","dataDir":ipam,"ranges":[[{"subnet":"10.245.0.0/24"}]]}}]})
        };
        // No namespace controller: the namespaces' default ServiceAccount and CA ConfigMap.
        for ns in [NS, "default"] {
            cp.create_namespace(ns)?;
        }
        let node = Node::start(cp, cp.bins(), NODE, PRIMARY_CONF, &primary)?;
        for b in &bridges {
            node.own_link(b);
        }
        let api = Api::new(&cp.admin_kubeconfig())?;
        Ok(Tier {
            cp,
            node,
            api,
            bridges,
            loops: None,
            daemon: None,
            metrics_port: free_port()?,
            netns_seen: Default::default(),
        })
    }

    fn plexus_conf(&self, daemon: bool) -> Value {
        let mut p = json!({"type":"plexus",
            "clusterNetwork": self.node.conf_dir().join(PRIMARY_CONF),
            "kubeconfig": self.node.path("plexus.kubeconfig"),
            "cniDir": self.node.plexus_dir(),
            "logFile": self.node.path("plexus.log"),
            "nadPolicy": nad_policy_allowing(&[&self.node.ipam_dir()]),
            "capabilities":{"io.kubernetes.cri.pod-annotations":true}});
        if daemon {
            p["daemonSocket"] = json!(self.socket());
        }
        json!({"cniVersion":"1.0.0","name":"plexus","plugins":[p]})
    }

    /// RBAC, plexus' kubeconfig and config, the control loops, the NADs.
    fn install(&mut self) -> Result<()> {
        let cp = self.cp;
        cp.apply_deploy(&[
            "base/nad-crd.yaml",
            "components/fixed-ips/address-claim-crd.yaml",
            "base/rbac.yaml",
            "components/fixed-ips/rbac-fixed-ips.yaml",
            "components/daemon/rbac-daemon.yaml",
        ])?;
        plexus_kubeconfig(
            cp,
            &self.node.path("plexus.kubeconfig"),
            &PlexusToken::Unbound,
        )?;
        std::fs::copy(common::bin("plexus"), self.node.bin_dir().join("plexus"))?;
        // containerd 1.6 loads a config on WRITE events: write in place.
        std::fs::write(
            self.node.conf_dir().join("00-plexus.conflist"),
            serde_json::to_vec(&self.plexus_conf(false))?,
        )?;
        // kube-scheduler and kube-controller-manager (statefulset controller only).
        self.loops = Some(ControlLoops::start(cp, self.node.dir())?);
        // The probe pod sets nodeName: no scheduler needed for it.
        wait_until_plexus_is_in_the_path(&self.api, NS, NODE)?;
        self.api.delete_pod(NS, "probe")?;
        let nad = |name: &str, cfg: Value, mapping: Option<String>| -> Result<()> {
            let mut meta = json!({"name":name,"namespace":NS});
            if let Some(m) = mapping {
                meta["annotations"] = json!({ MAPPING: m });
            }
            let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":meta,"spec":{"config":cfg.to_string()}});
            cp.apply(&nad.to_string()).map(drop)
        };
        nad(
            "data",
            json!({"cniVersion":"1.0.0","name":"data","type":"bridge","bridge":self.bridges[1],
                   "ipam":{"type":"static"}}),
            Some(mapping(&addr(1))),
        )?;
        // The misuse: one static address in the NAD itself.
        nad(
            "fixed",
            json!({"cniVersion":"1.0.0","name":"fixed","type":"bridge","bridge":self.bridges[2],
                   "ipam":{"type":"static","addresses":[{"address":"10.246.1.10/24"}]}}),
            None,
        )
    }

    fn apply_set(&self, name: &str, network: &str, replicas: u32) -> Result<()> {
        let set = json!({"apiVersion":"apps/v1","kind":"StatefulSet",
            "metadata":{"name":name,"namespace":NS},
            "spec":{"replicas":replicas,"serviceName":name,"podManagementPolicy":"Parallel",
                "selector":{"matchLabels":{"app":name}},
                "template":{"metadata":{"labels":{"app":name},"annotations":{ NETWORKS: network }},
                    // The node's taints (no node controller clears them) do not matter here.
                    "spec":{"tolerations":[{"operator":"Exists"}],
                        "automountServiceAccountToken":false,"enableServiceLinks":false,
                        "dnsPolicy":"Default","terminationGracePeriodSeconds":1,
                        "containers":[{"name":"db","image":IMAGE,"imagePullPolicy":"Never"}]}}}});
        self.cp.apply(&set.to_string()).map(drop)
    }

    fn scale(&self, name: &str, replicas: u32) -> Result<()> {
        self.cp
            .kubectl(&[
                "-n",
                NS,
                "scale",
                "statefulset",
                name,
                &format!("--replicas={replicas}"),
            ])
            .map(drop)
    }

    fn pod(&self, name: &str) -> Result<Option<Value>> {
        self.api.get_pod(NS, name)
    }

    /// net1's address in the pod's network-status.
    fn net1(pod: &Value) -> Result<Option<String>> {
        Ok(network_status(pod)?
            .iter()
            .find(|e| e["interface"] == "net1")
            .and_then(|e| e["ips"][0].as_str().map(str::to_string)))
    }

    /// Wait until `mysql-<ord>` runs with `want(ord)` on net1 for every ordinal, and check the
    /// address is on net1 inside the pod.
    fn expect_addresses(&self, ords: &[usize], want: &dyn Fn(usize) -> String) -> Result<()> {
        let mut replicas: Vec<(String, String)> = Vec::new();
        for &o in ords {
            let name = format!("mysql-{o}");
            let mut last = Value::Null;
            wait_for(&format!("{name} Running"), WAIT, || {
                last = self.pod(&name)?.unwrap_or(Value::Null);
                Ok(running(&last) && Self::net1(&last)?.is_some())
            })
            .with_context(|| format!("{name}: {}", last["status"]))?;
            let got = Self::net1(&last)?.unwrap_or_default();
            ensure!(got == want(o), "{name} has {got} on net1, want {}", want(o));
            let uid = last["metadata"]["uid"].as_str().unwrap_or("");
            let (_, netns) = self.node.pod_sandbox(uid)?;
            self.netns_seen.borrow_mut().insert(netns.clone());
            let ifs = pods::interfaces(&netns)?;
            let ips = ifs.get("net1").map(|i| i.ips.clone()).unwrap_or_default();
            ensure!(ips == vec![want(o)], "{name}: net1 in the pod has {ips:?}");
            // The API server arbitrates the address: its claim names this very pod.
            let claims = self.claims()?;
            ensure!(
                claims.contains(&(want(o), name.clone(), uid.to_string())),
                "no address claim of {} by {name} ({uid}): {claims:?}",
                want(o)
            );
            replicas.push((netns, want(o)));
        }
        // Packets: every replica reaches every other one at its fixed address on net1, also
        // right after one was recreated with its address and a new MAC (plexus announces each
        // address after ADD: without it the peer kept the old MAC for 6 to over 20 s).
        for (i, (from, own)) in replicas.iter().enumerate() {
            for (to_ns, to) in replicas.iter().skip(i + 1) {
                ensure!(
                    pods::pings(Some(from), to),
                    "{own} -> {to} on net1: no answer"
                );
                ensure!(
                    pods::pings(Some(to_ns), own),
                    "{to} -> {own} on net1: no answer"
                );
            }
        }
        Ok(())
    }

    /// Delete a replica and wait for its successor (a new UID) to run.
    /// The address claims of the `data` network: `(address, pod name, pod UID)`.
    fn claims(&self) -> Result<Vec<(String, String, String)>> {
        Ok(self
            .cp
            .address_claims(NS, "data")?
            .into_iter()
            .map(|(address, pod, uid, _)| (address, pod, uid))
            .collect())
    }

    fn recreate(&self, name: &str) -> Result<()> {
        let old = self.pod(name)?.context("no pod")?["metadata"]["uid"].clone();
        self.api.delete_pod(NS, name)?;
        wait_for(&format!("{name} recreated"), WAIT, || {
            Ok(self
                .pod(name)?
                .is_some_and(|p| p["metadata"]["uid"] != old && running(&p)))
        })
    }

    fn wait_gone(&self, names: &[&str]) -> Result<()> {
        for n in names {
            wait_for(&format!("{n} gone"), WAIT, || Ok(self.pod(n)?.is_none()))?;
        }
        Ok(())
    }

    /// The pod exists, is not Running, and carries plexus' AddInterfaceFailed event with `msg`
    /// (an event of this pod object: an earlier pod of the same name had its own).
    fn expect_refused(&self, name: &str, msg: &str) -> Result<()> {
        let mut seen = Vec::new();
        let mut uid = Value::Null;
        wait_for(&format!("{name} created"), WAIT, || {
            uid = self
                .pod(name)?
                .map_or(Value::Null, |p| p["metadata"]["uid"].clone());
            Ok(!uid.is_null())
        })?;
        wait_for(&format!("{name}'s AddInterfaceFailed event"), WAIT, || {
            seen = self.api.events(NS, name)?;
            Ok(seen.iter().any(|e| {
                e["reason"] == "AddInterfaceFailed"
                    && e["involvedObject"]["uid"] == uid
                    && e["message"].as_str().is_some_and(|m| m.contains(msg))
            }))
        })
        .with_context(|| {
            let msgs: Vec<&Value> = seen.iter().map(|e| &e["message"]).collect();
            format!("events: {msgs:?}")
        })?;
        let p = self.pod(name)?.context("pod gone")?;
        ensure!(!running(&p), "{name} is Running: {}", p["status"]);
        ensure!(Self::net1(&p)?.is_none(), "{name} has a network-status");
        Ok(())
    }

    fn mapping_changed(&self) -> Result<()> {
        let new = "10.246.0.21";
        self.cp.kubectl(&[
            "-n",
            NS,
            "annotate",
            "--overwrite",
            "net-attach-def",
            "data",
            &format!("{MAPPING}={}", mapping(new)),
        ])?;
        // Running replicas keep theirs (give the kubelet a sync period to prove nothing moves).
        std::thread::sleep(Duration::from_secs(2));
        self.expect_addresses(&[0, 1, 2, 3], &|o| addr(o))?;
        self.recreate("mysql-1")?;
        self.expect_addresses(&[0, 1, 2, 3], &|o| {
            if o == 1 {
                new.to_string()
            } else {
                addr(o)
            }
        })?;
        // Back to the first mapping for the daemon case.
        self.cp.kubectl(&[
            "-n",
            NS,
            "annotate",
            "--overwrite",
            "net-attach-def",
            "data",
            &format!("{MAPPING}={}", mapping(&addr(1))),
        ])?;
        self.recreate("mysql-1")?;
        self.expect_addresses(&[1], &|o| addr(o))
    }

    fn never_twice(&self) -> Result<()> {
        // The case: 2 replicas of a set whose NAD fixes one address.
        self.apply_set("dup", "fixed", 2)?;
        let mut holders = Vec::new();
        wait_for("one dup replica Running", WAIT, || {
            holders = ["dup-0", "dup-1"]
                .into_iter()
                .filter_map(|n| self.pod(n).ok().flatten())
                .filter(running)
                .collect::<Vec<_>>();
            Ok(!holders.is_empty())
        })?;
        let winner = holders[0]["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let loser = if winner == "dup-0" { "dup-1" } else { "dup-0" };
        self.expect_refused(
            loser,
            &format!("address 10.246.1.10 is in use by pod {NS}/{winner}"),
        )?;
        // A pod asking for a replica's address in its own annotation.
        let mut p = pods::manifest(NS, "intruder", NODE, "intruder", None);
        p["metadata"]["annotations"][NETWORKS] =
            json!(json!([{"name":"data","ips":[format!("{}/24", addr(0))]}]).to_string());
        self.api.create_pod(&p)?;
        self.expect_refused(
            "intruder",
            &format!("address {} is in use by pod {NS}/mysql-0", addr(0)),
        )?;
        self.api.delete_pod(NS, "intruder")?;
        self.cp
            .kubectl(&["-n", NS, "delete", "statefulset", "dup"])?;
        for n in ["dup-0", "dup-1"] {
            self.api.delete_pod(NS, n)?;
        }
        self.wait_gone(&["intruder", "dup-0", "dup-1"])
    }

    fn socket(&self) -> PathBuf {
        self.node.path("run-plexus/plexus.sock")
    }

    fn metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        scrape_metric(self.metrics_port, name, labels)
    }

    fn daemon_mode(&mut self) -> Result<()> {
        self.scale("mysql", 0)?;
        self.wait_gone(&["mysql-0", "mysql-1", "mysql-2", "mysql-3"])?;
        let kubeconfig = self.node.path("plexus.kubeconfig");
        self.daemon = Some(PlexusDaemon::start(&DaemonOpts {
            bin: &common::bin("plexus-daemon"),
            socket: &self.socket(),
            kubeconfig: &kubeconfig,
            node: NODE,
            dir: self.node.dir(),
            metrics_port: self.metrics_port,
        })?);
        std::fs::write(
            self.node.conf_dir().join("00-plexus.conflist"),
            serde_json::to_vec(&self.plexus_conf(true))?,
        )?;
        // Let containerd reload the config (a WRITE event) before the replicas come.
        std::thread::sleep(Duration::from_secs(1));
        let before = self.metric("plexus_cni_requests_total", &["ADD", "ok"])?;
        self.scale("mysql", 5)?;
        self.expect_addresses(&[0, 1, 2, 3], &|o| addr(o))?;
        self.expect_refused("mysql-4", "no fixed address for mysql-4")?;
        self.recreate("mysql-2")?;
        self.expect_addresses(&[2], &|o| addr(o))?;
        let served = self.metric("plexus_cni_requests_total", &["ADD", "ok"])? - before;
        ensure!(
            served >= 5.0,
            "the daemon served {served} ADDs, want the 4 replicas and the recreated one"
        );
        Ok(())
    }

    /// The addresses of `net1` of `pg-<ord>`, Running, as network-status and the pod's netns
    /// list them (sorted; the same in both, checked), and its netns.
    fn pg_addresses(&self, ord: usize) -> Result<(Vec<String>, String, String)> {
        let name = format!("pg-{ord}");
        let mut last = Value::Null;
        wait_for(&format!("{name} Running"), WAIT, || {
            last = self.pod(&name)?.unwrap_or(Value::Null);
            Ok(running(&last) && Self::net1(&last)?.is_some())
        })
        .with_context(|| format!("{name}: {}", last["status"]))?;
        let mut status: Vec<String> = network_status(&last)?
            .iter()
            .find(|e| e["interface"] == "net1")
            .and_then(|e| e["ips"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        status.sort();
        let uid = last["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let (_, netns) = self.node.pod_sandbox(&uid)?;
        self.netns_seen.borrow_mut().insert(netns.clone());
        let mut inside = pods::interfaces(&netns)?
            .get("net1")
            .map(|i| i.ips.clone())
            .unwrap_or_default();
        inside.sort();
        ensure!(
            inside == status,
            "{name}: net1 has {inside:?}, network-status says {status:?}"
        );
        Ok((status, netns, uid))
    }

    /// A set mapped in both families on `data6`: `pg-0` gets an IPv4 and an IPv6 address,
    /// `pg-1` an IPv6 one; each is claimed by its replica; the replicas ping each other over
    /// IPv6; `pg-0` deleted comes back with both and `pg-1` reaches its IPv6 address again.
    fn dual_set(&self) -> Result<()> {
        let mapping = json!({"pg": [["10.246.2.20/24", "fd00:246:2::20/64"], "fd00:246:2::21/64"]})
            .to_string();
        let cfg = json!({"cniVersion":"1.0.0","name":"data6","type":"bridge",
            "bridge":self.bridges[1],"ipam":{"type":"static"}});
        let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":"data6","namespace":NS,"annotations":{ MAPPING: mapping }},
            "spec":{"config":cfg.to_string()}});
        self.cp.apply(&nad.to_string())?;
        self.apply_set("pg", "data6", 2)?;
        let want = [
            vec!["10.246.2.20".to_string(), "fd00:246:2::20".to_string()],
            vec!["fd00:246:2::21".to_string()],
        ];
        let check = |ord: usize| -> Result<String> {
            let (got, netns, uid) = self.pg_addresses(ord)?;
            ensure!(
                got == want[ord],
                "pg-{ord} has {got:?}, want {:?}",
                want[ord]
            );
            let claims = self.cp.address_claims(NS, "data6")?;
            for a in &want[ord] {
                ensure!(
                    claims
                        .iter()
                        .any(|c| &c.0 == a && c.1 == format!("pg-{ord}") && c.2 == uid),
                    "no claim of {a} by pg-{ord} ({uid}): {claims:?}"
                );
            }
            Ok(netns)
        };
        let ns0 = check(0)?;
        let ns1 = check(1)?;
        // IPv6 between the replicas (DAD on the bridge may still run for a moment).
        for (from, to) in [(&ns0, "fd00:246:2::21"), (&ns1, "fd00:246:2::20")] {
            wait_for(&format!("{to} answering over IPv6"), WAIT, || {
                Ok(pods::pings(Some(from), to))
            })?;
        }
        self.recreate("pg-0")?;
        let ns0 = check(0)?;
        let t = std::time::Instant::now();
        wait_for("the recreated pg-0 answering over IPv6", WAIT, || {
            Ok(pods::pings(Some(&ns1), "fd00:246:2::20"))
        })?;
        ensure!(
            pods::pings(Some(&ns0), "fd00:246:2::21"),
            "the recreated pg-0 does not reach pg-1 over IPv6"
        );
        println!(
            "real_statefulset: pg-0 recreated with 10.246.2.20 and fd00:246:2::20; pg-1 reached it over IPv6 after {:.1} s",
            t.elapsed().as_secs_f64()
        );
        self.cp
            .kubectl(&["-n", NS, "delete", "statefulset", "pg"])?;
        for n in ["pg-0", "pg-1"] {
            self.api.delete_pod(NS, n)?;
        }
        self.wait_gone(&["pg-0", "pg-1"])?;
        let claims = self.cp.address_claims(NS, "data6")?;
        ensure!(claims.is_empty(), "data6 claims left: {claims:?}");
        Ok(())
    }

    fn delete_all(&self) -> Result<()> {
        self.cp
            .kubectl(&["-n", NS, "delete", "statefulset", "mysql"])?;
        // No garbage collector: delete the replicas too.
        let names: Vec<String> = (0..5).map(|o| format!("mysql-{o}")).collect();
        for n in &names {
            self.api.delete_pod(NS, n)?;
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        self.wait_gone(&refs)?;
        wait_for("no plan left", WAIT, || {
            let plans = std::fs::read_dir(self.node.plexus_dir().join("plans"))
                .map(|d| d.count())
                .unwrap_or(0);
            Ok(plans == 0)
        })?;
        let claims = self.claims()?;
        ensure!(claims.is_empty(), "address claims left: {claims:?}");
        // The runtime tears sandboxes down after the pod objects are gone.
        let seen = self.netns_seen.borrow().clone();
        ensure!(seen.len() >= 5, "only {} netns seen", seen.len());
        let mut left = Vec::new();
        wait_for("the replicas' netns gone", Duration::from_secs(30), || {
            left = seen
                .iter()
                .filter(|n| Path::new(n).exists())
                .cloned()
                .collect();
            let sandboxes = self.node.cri().sandboxes(None)?;
            left.extend(
                sandboxes
                    .iter()
                    .filter(|s| s.state == 0)
                    .map(|s| format!("ready sandbox {}", s.id)),
            );
            Ok(left.is_empty())
        })
        .with_context(|| format!("netns left: {left:?}"))
    }

    fn stop(&mut self) {
        if let Some(mut l) = self.loops.take() {
            l.stop();
        }
        if let Some(d) = self.daemon.take() {
            d.stop();
        }
        self.node.stop();
    }
}
