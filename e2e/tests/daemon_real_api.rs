//! Daemon mode against a real kube-apiserver + etcd (`plexus_e2e::realk8s`): `plexus daemon`
//! with the `kube-system/plexus` token (deploy/base/rbac.yaml +
//! deploy/components/daemon/rbac-daemon.yaml applied as they are) watches the node's pods and
//! the NADs; `plexus-shim` (the config's type, as the daemon DaemonSet installs it) forwards CNI
//! calls to it.
//! Checks: readiness after the first sync, ADD = the network-status PATCH (+ one event) and
//! DEL = 0 requests once cached, a pod created right before its ADD, the API down with a warm
//! cache (the status converges once it is back), a daemon restart, a NAD changed between ADD
//! and DEL (DEL uses the plan), and watch semantics: a pod listed by the initial LIST, a dropped
//! watch reconnecting (apiserver stopped and started), and a 410 Gone relist (etcd compacted
//! while the watch was down, a pod deleted behind its back), and the network-status written
//! after the ADD's answer: it lands, in ADD order per pod, a DEL drops a write not yet sent,
//! `--status-in-call` has it before the answer. Prints ADD times (not asserted).
//! Skipped (and passing) without `PLEXUS_K8S_BIN`.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use common::*;
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::node_rig::scrape_metric;
use plexus_e2e::realk8s::rig::{PlexusToken, Rig};
use plexus_e2e::realk8s::{
    control_plane_or_skip, metrics, setup_or_report, ControlPlane, RequestCounts, Suite,
};
use serde_json::{json, Value};

const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
const NODE: &str = "plexus-daemon-node";
const RESOURCES: &[&str] = &["pods", "events", "network-attachment-definitions"];

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let Some(node) = setup_or_report("daemon_real_api", &cp, Node::new(&cp)) else {
        return ExitCode::FAILURE;
    };
    let mut suite = Suite::new("daemon_real_api");
    suite.case("add_is_one_patch_and_one_event_del_is_zero", || {
        one_request_per_pod(&node)
    });
    suite.case("pod_created_right_before_its_add", || {
        created_just_before(&node)
    });
    suite.case("api_down_with_a_warm_cache_status_converges", || {
        api_down_warm_cache(&node)
    });
    suite.case("daemon_restarted_between_add_and_del", || restarted(&node));
    suite.case(
        "daemon_killed_before_the_status_patch_next_daemon_writes_it",
        || killed_before_the_status_patch(&node),
    );
    suite.case(
        "daemon_killed_before_the_status_patch_a_del_first_drops_it_unsent",
        || killed_then_del_first(&node),
    );
    suite.case("the_daemon_refuses_what_the_nad_policy_refuses", || {
        nad_policy_refusal(&node)
    });
    suite.case("nad_changed_between_add_and_del_del_uses_the_plan", || {
        nad_changed(&node)
    });
    suite.case(
        "watch_initial_list_serves_a_pod_created_before_the_daemon",
        || initial_list(&node),
    );
    suite.case(
        "watch_lists_are_served_by_the_apiservers_cache_not_etcd",
        || lists_from_the_watch_cache(&node),
    );
    suite.case(
        "watch_dropped_reconnects_and_keeps_serving_from_the_cache",
        || dropped_watch(&node),
    );
    suite.case("watch_410_gone_after_an_etcd_compaction_relists", || {
        gone_relist(&node)
    });
    suite.case(
        "status_after_the_answer_in_add_order_del_drops_unsent",
        || status_after_the_answer(&node),
    );
    suite.case("rss_with_110_pods_and_1000_nads_cached", || {
        rss_with_caches(&node)
    });
    drop(node);
    suite.finish()
}

/// A running daemon, killed on drop.
struct Daemon {
    child: Child,
    ready: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Node<'a> {
    cp: &'a ControlPlane,
    rig: Rig<'a>,
    bridge: HostLink,
    master: HostLink,
    metrics_port: u16,
}

impl<'a> Node<'a> {
    fn new(cp: &'a ControlPlane) -> Result<Node<'a>> {
        let rig = Rig::builder()
            .deploy(&[
                "base/nad-crd.yaml",
                "base/rbac.yaml",
                "components/daemon/rbac-daemon.yaml",
            ])
            .namespaces(&["db"])
            .plexus_token(PlexusToken::Unbound)
            .build(cp)?;
        let n = Node {
            cp,
            rig,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
            metrics_port: plexus_e2e::realk8s::free_port()?,
        };
        n.nad("mv-a", "10.171.1.0/24")?;
        Ok(n)
    }

    fn path(&self, p: &str) -> PathBuf {
        self.rig.path(p)
    }

    fn start_daemon(&self) -> Result<Daemon> {
        self.start_daemon_with(&[])
    }

    fn start_daemon_with(&self, extra: &[&str]) -> Result<Daemon> {
        let ready = self.path("daemon.ready");
        let _ = std::fs::remove_file(&ready);
        let child = Command::new(bin("plexus"))
            .arg("daemon")
            .args(["--socket", self.path("run/plexus.sock").to_str().unwrap()])
            .args(["--kubeconfig", self.path("kubeconfig").to_str().unwrap()])
            .args(["--node", NODE])
            .args(["--readiness-file", ready.to_str().unwrap()])
            .args([
                "--metrics-address",
                &format!("127.0.0.1:{}", self.metrics_port),
            ])
            .args(extra)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(self.path("daemon.log"))?,
            )
            .spawn()?;
        let d = Daemon { child, ready };
        let t = Instant::now();
        while !d.ready.exists() {
            ensure!(
                t.elapsed() < Duration::from_secs(20),
                "daemon not ready after 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    fn config(&self, extra: &Value) -> Value {
        let mut c = json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus-shim",
            "daemonSocket": self.path("run/plexus.sock"),
            "kubeconfig": self.path("kubeconfig"), "cniDir": self.path("state"), "binDir": CNI_BIN,
            "confDir": self.path("confdir"), "logLevel":"debug", "logFile": self.path("plexus.log"), "logToStderr": false,
            "delegates":[flannel_like(&self.bridge.0, 71, &self.path("ipam"))],
            "nadPolicy": nad_policy_allowing(&[self.rig.dir()])});
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }

    fn nad(&self, name: &str, subnet: &str) -> Result<()> {
        self.nad_on(name, &self.master.0, subnet)
    }

    /// A macvlan NAD on `master` with host-local leases in the node's ipam dir.
    fn nad_on(&self, name: &str, master: &str, subnet: &str) -> Result<()> {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":master,"mode":"bridge",
            "ipam":{"type":"host-local","dataDir":self.path("ipam"),"ranges":[[{"subnet":subnet}]]}});
        let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":name,"namespace":"db"},"spec":{"config":cfg.to_string()}});
        self.cp.apply(&nad.to_string()).map(drop)
    }

    fn pod(&self, name: &str) -> Result<String> {
        self.pod_with(name, "mv-a")
    }

    /// Sum of the daemon's `/metrics` series `name` whose labels contain all of `labels`.
    fn metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        scrape_metric(self.metrics_port, name, labels)
    }

    /// Pods in the daemon's cache.
    fn cached_pods(&self) -> Result<f64> {
        self.metric("plexus_cache_objects", &["pods"])
    }

    /// Wait until `f` holds (`what` names it in the error).
    fn wait(&self, what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
        let t = Instant::now();
        while !f() {
            ensure!(t.elapsed() < timeout, "{what}: not after {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Create pod `name` in `db` on the node with `networks`; its UID.
    fn pod_with(&self, name: &str, networks: &str) -> Result<String> {
        let pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":name,"namespace":"db","annotations":{"k8s.v1.cni.cncf.io/networks":networks}},
            "spec":{"nodeName":NODE,"automountServiceAccountToken":false,
                "containers":[{"name":"c","image":"local/pause:1"}]}});
        self.cp
            .kubectl_stdin(&["create", "-f", "-"], Some(&pod.to_string()))?;
        let p = self
            .cp
            .get_json(&format!("/api/v1/namespaces/db/pods/{name}"))?;
        Ok(p["metadata"]["uid"].as_str().context("uid")?.to_string())
    }

    fn call(&self, command: &str, name: &str, uid: &str, netns: &str, extra: &Value) -> Run {
        self.call_in(command, &format!("cid-{name}"), name, uid, netns, extra)
    }

    /// A call for sandbox `cid` of pod `name`.
    fn call_in(
        &self,
        command: &str,
        cid: &str,
        name: &str,
        uid: &str,
        netns: &str,
        extra: &Value,
    ) -> Run {
        let args = format!("K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid};IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={name}");
        run(
            &bin("plexus-shim"),
            &Call {
                command,
                container_id: cid,
                netns,
                ifname: "eth0",
                args: &args,
            },
            &self.config(extra),
            &[],
        )
    }

    fn status(&self, name: &str) -> Result<Vec<String>> {
        let p = self
            .cp
            .get_json(&format!("/api/v1/namespaces/db/pods/{name}"))?;
        let st: Value = serde_json::from_str(
            p["metadata"]["annotations"][STATUS]
                .as_str()
                .unwrap_or("[]"),
        )?;
        Ok(st
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["name"].as_str().unwrap_or("?").to_string())
            .collect())
    }

    /// Requests `f` caused, the background event included (given 300 ms to land).
    fn counted<T>(&self, f: impl FnOnce() -> T) -> Result<(T, RequestCounts)> {
        let before = self.cp.request_totals()?;
        let out = f();
        std::thread::sleep(Duration::from_millis(300));
        let after = self.cp.request_totals()?;
        let mut d = metrics::delta(&before, &after, RESOURCES);
        // The daemon's own watches are not per-pod requests.
        d.retain(|k, _| k.verb != "WATCH" && k.verb != "LIST");
        Ok((out, d))
    }

    fn leftovers(&self) -> Vec<String> {
        let mut v: Vec<String> = files_under(&self.path("state"))
            .into_iter()
            .filter(|f| !f.starts_with("locks"))
            .collect();
        v.extend(files_under(&self.path("ipam")));
        v
    }
}

/// The addresses of the pod's network-status entry `net` (empty when absent).
fn status_ips(node: &Node<'_>, name: &str, net: &str) -> Result<Vec<String>> {
    let p = node
        .cp
        .get_json(&format!("/api/v1/namespaces/db/pods/{name}"))?;
    let st: Value = serde_json::from_str(
        p["metadata"]["annotations"][STATUS]
            .as_str()
            .unwrap_or("[]"),
    )?;
    Ok(st
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["name"] == net)
        .flat_map(|e| e["ips"].as_array().cloned().unwrap_or_default())
        .filter_map(|ip| ip.as_str().map(str::to_string))
        .collect())
}

/// Whether container `cid`'s network-status write is still pending: the daemon's record of it
/// (`<cniDir>/status-pending/<container>.json`) is removed once the write is over, written or
/// dropped (docs/daemon.md).
fn pending_status(node: &Node<'_>, cid: &str) -> bool {
    node.path("state")
        .join("status-pending")
        .join(format!("{cid}.json"))
        .exists()
}

/// The first address of an ADD's result (the default network's), without its prefix length.
fn result_ip(r: &Run) -> String {
    r.ok()["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .unwrap_or("?")
        .to_string()
}

/// The last lines of the daemon's log, for a failure's message.
fn daemon_log_tail(node: &Node<'_>) -> String {
    let text = std::fs::read_to_string(node.path("daemon.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn status_after_the_answer(node: &Node<'_>) -> Result<()> {
    let uid = node.pod("d9")?;
    wait_cached(node, "d9");
    let (ns1, ns2, ns3) = (Netns::new(), Netns::new(), Netns::new());
    let none = json!({});
    {
        let _d = node.start_daemon()?;
        // Two sandboxes of one pod ADDed back to back (a recreated sandbox): the status that
        // stays is the second's, whatever order the background writes were ready in.
        let t = Instant::now();
        let r1 = node.call_in("ADD", "d9-a", "d9", &uid, &ns1.path(), &none);
        let first_ms = t.elapsed().as_secs_f64() * 1e3;
        let r2 = node.call_in("ADD", "d9-b", "d9", &uid, &ns2.path(), &none);
        let (ip1, ip2) = (result_ip(&r1), result_ip(&r2));
        ensure!(ip1 != ip2, "two sandboxes, two leases: {ip1} {ip2}");
        node.wait(
            "network-status of the second sandbox",
            Duration::from_secs(10),
            || status_ips(node, "d9", "cbr0").unwrap_or_default() == vec![ip2.clone()],
        )?;
        // Both writes over (each removes its record when written or dropped): nothing can
        // land after this.
        node.wait("both writes finished", Duration::from_secs(10), || {
            !pending_status(node, "d9-a") && !pending_status(node, "d9-b")
        })?;
        ensure!(
            status_ips(node, "d9", "cbr0")? == vec![ip2.clone()],
            "an older sandbox's status landed last"
        );
        println!("    ADD answered in {first_ms:.1} ms, network-status after it");
        // A write not sent yet (the API is down) is dropped by its container's DEL: the
        // status stays the second sandbox's once the API is back.
        node.cp.stop_apiserver();
        let r3 = node.call_in("ADD", "d9-c", "d9", &uid, &ns3.path(), &none);
        let del = node.call_in("DEL", "d9-c", "d9", &uid, &ns3.path(), &none);
        node.cp.start_apiserver()?;
        ensure!(r3.code == 0, "ADD with the API down: {}", r3.out);
        ensure!(del.code == 0, "DEL with the API down: {}", del.out);
        // Until the write is over (its record removed: dropped, or written if the DEL failed
        // to drop it), the status never is the DELeted sandbox's; after, it is the second's.
        let t = Instant::now();
        loop {
            let now = status_ips(node, "d9", "cbr0").unwrap_or_default();
            ensure!(
                now.is_empty() || now == vec![ip2.clone()],
                "a DELeted sandbox's status was written: {now:?}"
            );
            if !pending_status(node, "d9-c") {
                break;
            }
            ensure!(
                t.elapsed() < Duration::from_secs(30),
                "the DELeted sandbox's write still pending after 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        println!(
            "    the DELeted sandbox's pending write over {:.1} s after the API came back",
            t.elapsed().as_secs_f64()
        );
        ensure!(
            status_ips(node, "d9", "cbr0")? == vec![ip2.clone()],
            "a DELeted sandbox's status was written: {:?}",
            status_ips(node, "d9", "cbr0")?
        );
        for (cid, ns) in [("d9-a", &ns1), ("d9-b", &ns2)] {
            node.call_in("DEL", cid, "d9", &uid, &ns.path(), &none).ok();
        }
    }
    // --status-in-call: the status is there when the ADD answers.
    let _d = node.start_daemon_with(&["--status-in-call"])?;
    let r = node.call_in("ADD", "d9-d", "d9", &uid, &ns1.path(), &none);
    let ip = result_ip(&r);
    ensure!(
        status_ips(node, "d9", "cbr0")? == vec![ip],
        "in-call status missing at the answer"
    );
    node.call_in("DEL", "d9-d", "d9", &uid, &ns1.path(), &none)
        .ok();
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    Ok(())
}

fn shown(c: &RequestCounts) -> String {
    c.iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Wait (up to 5 s) until the running daemon's pod cache holds pod `name` just created: as many
/// pods as the API has on the node (no case deletes one before this). No daemon running: its
/// start lists the pod before it is ready.
fn wait_cached(node: &Node<'_>, name: &str) {
    if node.cached_pods().is_err() {
        return;
    }
    let on_node = || -> Result<usize> {
        let l = node.cp.get_json(&format!(
            "/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"
        ))?;
        Ok(l["items"].as_array().map_or(0, Vec::len))
    };
    let Ok(want) = on_node() else {
        return;
    };
    let cached = node.wait(&format!("{name} cached"), Duration::from_secs(5), || {
        node.cached_pods().unwrap_or(0.0) >= want as f64
    });
    if let Err(e) = cached {
        eprintln!("    {e:#} (the case's own checks tell what follows from it)");
    }
}

fn one_request_per_pod(node: &Node<'_>) -> Result<()> {
    let _d = node.start_daemon()?;
    let uid = node.pod("d1")?;
    wait_cached(node, "d1");
    let ns = Netns::new();
    let (r, add) = node.counted(|| {
        let t = Instant::now();
        let r = node.call("ADD", "d1", &uid, &ns.path(), &json!({}));
        (r, t.elapsed().as_secs_f64() * 1e3)
    })?;
    let (r, add_ms) = r;
    ensure!(r.code == 0, "ADD failed: {} {}", r.out, r.stderr);
    ensure!(
        node.status("d1")? == vec!["cbr0", "db/mv-a"],
        "status {:?}",
        node.status("d1")?
    );
    println!(
        "    daemon ADD (shim + daemon + delegates) {add_ms:.1} ms: {}",
        shown(&add)
    );
    let patches = add
        .iter()
        .filter(|(k, _)| k.verb == "PATCH")
        .map(|(_, n)| n)
        .sum::<u64>();
    let posts = add
        .iter()
        .filter(|(k, _)| k.verb == "POST")
        .map(|(_, n)| n)
        .sum::<u64>();
    ensure!(
        patches == 1 && posts == 1 && add.values().sum::<u64>() == 2,
        "ADD requests: {}",
        shown(&add)
    );
    let (r, del) = node.counted(|| node.call("DEL", "d1", &uid, &ns.path(), &json!({})))?;
    ensure!(r.code == 0, "DEL failed: {}", r.out);
    ensure!(del.is_empty(), "DEL requests: {}", shown(&del));
    // Events off: the PATCH alone.
    let uid2 = node.pod("d1b")?;
    wait_cached(node, "d1b");
    let ns2 = Netns::new();
    let (r, add) =
        node.counted(|| node.call("ADD", "d1b", &uid2, &ns2.path(), &json!({"events": false})))?;
    ensure!(r.code == 0, "ADD failed: {}", r.out);
    ensure!(
        add.values().sum::<u64>() == 1,
        "ADD with events off: {}",
        shown(&add)
    );
    node.call("DEL", "d1b", &uid2, &ns2.path(), &json!({})).ok();
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    Ok(())
}

fn created_just_before(node: &Node<'_>) -> Result<()> {
    let _d = node.start_daemon()?;
    let ns = Netns::new();
    let uid = node.pod("d2")?;
    let (r, add) = node.counted(|| node.call("ADD", "d2", &uid, &ns.path(), &json!({})))?;
    ensure!(r.code == 0, "ADD failed: {} {}", r.out, r.stderr);
    ensure!(node.status("d2")?.len() == 2, "status");
    let gets = add
        .iter()
        .filter(|(k, _)| k.verb == "GET")
        .map(|(_, n)| n)
        .sum::<u64>();
    ensure!(
        gets <= 1,
        "at most one GET (watch lag fallback): {}",
        shown(&add)
    );
    println!("    pod created right before ADD: {}", shown(&add));
    node.call("DEL", "d2", &uid, &ns.path(), &json!({})).ok();
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    Ok(())
}

fn api_down_warm_cache(node: &Node<'_>) -> Result<()> {
    let _d = node.start_daemon()?;
    let uid = node.pod("d3")?;
    wait_cached(node, "d3");
    let ns = Netns::new();
    node.cp.stop_apiserver();
    let r = node.call("ADD", "d3", &uid, &ns.path(), &json!({}));
    let ok = r.code == 0;
    node.cp.start_apiserver()?;
    ensure!(
        ok,
        "ADD with a warm cache and the API down: {} {}",
        r.out,
        r.stderr
    );
    ensure!(ns.links().contains(&"net1".to_string()), "attachments kept");
    // The status PATCH is retried in the background until the API answers.
    let t = Instant::now();
    while node.status("d3").map(|s| s.len()).unwrap_or(0) != 2 {
        ensure!(
            t.elapsed() < Duration::from_secs(60),
            "network-status never converged; the daemon's log ends:\n{}",
            daemon_log_tail(node)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    println!(
        "    network-status written {:.1} s after the API came back",
        t.elapsed().as_secs_f64()
    );
    node.call("DEL", "d3", &uid, &ns.path(), &json!({})).ok();
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    Ok(())
}

fn restarted(node: &Node<'_>) -> Result<()> {
    let d = node.start_daemon()?;
    let uid = node.pod("d4")?;
    wait_cached(node, "d4");
    let ns = Netns::new();
    ensure!(
        node.call("ADD", "d4", &uid, &ns.path(), &json!({})).code == 0,
        "ADD"
    );
    drop(d);
    let _d = node.start_daemon()?;
    let (r, del) = node.counted(|| node.call("DEL", "d4", &uid, &ns.path(), &json!({})))?;
    ensure!(
        r.code == 0 && del.is_empty(),
        "DEL after restart: {} {}",
        r.out,
        shown(&del)
    );
    ensure!(
        ns.links().iter().all(|l| l == "lo"),
        "links {:?}",
        ns.links()
    );
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    Ok(())
}

/// Pod `name` ADDed through a daemon with the API down, the daemon SIGKILLed before its
/// network-status PATCH, the API back: the pending record it left (checked there, no status
/// written yet). Returns the pod's UID, its netns and the record's path under `state/`.
fn leave_pending_record(node: &Node<'_>, name: &str) -> Result<(String, Netns, String)> {
    let d = node.start_daemon()?;
    let uid = node.pod(name)?;
    wait_cached(node, name);
    let ns = Netns::new();
    node.cp.stop_apiserver();
    let r = node.call("ADD", name, &uid, &ns.path(), &json!({}));
    drop(d);
    node.cp.start_apiserver()?;
    ensure!(r.code == 0, "ADD with the API down: {} {}", r.out, r.stderr);
    let record = format!("status-pending/cid-{name}.json");
    ensure!(
        files_under(&node.path("state")).contains(&record),
        "no pending record: {:?}",
        files_under(&node.path("state"))
    );
    ensure!(
        node.status(name)?.is_empty(),
        "status written by a killed daemon"
    );
    Ok((uid, ns, record))
}

/// A daemon SIGKILLed between an ADD's answer and its network-status PATCH (held back here by
/// the API being down): the pending write it recorded is replayed by the next daemon's first
/// call, and the record is gone once written.
fn killed_before_the_status_patch(node: &Node<'_>) -> Result<()> {
    let (uid, ns, record) = leave_pending_record(node, "d10")?;
    let _d = node.start_daemon()?;
    let check = node.call("CHECK", "d10", &uid, &ns.path(), &json!({}));
    ensure!(check.code == 0, "CHECK: {} {}", check.out, check.stderr);
    node.wait(
        "network-status replayed by the next daemon",
        Duration::from_secs(15),
        || node.status("d10").map(|s| s.len()).unwrap_or(0) == 2,
    )
    .with_context(|| daemon_log_tail(node))?;
    node.wait("record removed", Duration::from_secs(5), || {
        !files_under(&node.path("state")).contains(&record)
    })?;
    node.call("DEL", "d10", &uid, &ns.path(), &json!({})).ok();
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    Ok(())
}

/// As above, but the next daemon's first call is the container's DEL: the pending write is
/// dropped, never sent (a replay spawned by that first call must not race the DEL's cancel).
fn killed_then_del_first(node: &Node<'_>) -> Result<()> {
    let (uid, ns, record) = leave_pending_record(node, "d11")?;
    let _d = node.start_daemon()?;
    let (r, del) = node.counted(|| node.call("DEL", "d11", &uid, &ns.path(), &json!({})))?;
    ensure!(
        r.code == 0 && del.is_empty(),
        "DEL as the first call: {} {}",
        r.out,
        shown(&del)
    );
    ensure!(
        !files_under(&node.path("state")).contains(&record),
        "pending record left after the DEL"
    );
    // A late replay would show as the annotation; 1 s is 3× the counted window.
    std::thread::sleep(Duration::from_secs(1));
    ensure!(
        node.status("d11")?.is_empty(),
        "network-status written for a deleted sandbox: {:?}",
        node.status("d11")?
    );
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    Ok(())
}

fn gets(c: &RequestCounts) -> u64 {
    c.iter()
        .filter(|(k, _)| k.verb == "GET")
        .map(|(_, n)| n)
        .sum()
}

fn nad_changed(node: &Node<'_>) -> Result<()> {
    let _d = node.start_daemon()?;
    node.nad("mv-chg", "10.171.5.0/24")?;
    let uid = node.pod_with("d5", "mv-chg")?;
    wait_cached(node, "d5");
    let ns = Netns::new();
    let r = node.call("ADD", "d5", &uid, &ns.path(), &json!({}));
    ensure!(r.code == 0, "ADD failed: {} {}", r.out, r.stderr);
    ensure!(ns.links().contains(&"net1".to_string()), "net1 attached");
    // The NAD now names a master that does not exist and another range: a DEL that re-read it
    // could not find the lease it has to release.
    node.nad_on("mv-chg", "pxnomaster0", "10.171.6.0/24")?;
    std::thread::sleep(Duration::from_millis(500));
    let (r, del) = node.counted(|| node.call("DEL", "d5", &uid, &ns.path(), &json!({})))?;
    ensure!(
        r.code == 0 && del.is_empty(),
        "DEL: {} {}",
        r.out,
        shown(&del)
    );
    ensure!(
        ns.links().iter().all(|l| l == "lo"),
        "links {:?}",
        ns.links()
    );
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    node.cp
        .kubectl(&["-n", "db", "delete", "net-attach-def", "mv-chg"])?;
    Ok(())
}

/// The NAD policy in the daemon: the same ADD stages as thin mode refuse a `dataDir` outside
/// the node's directories (code 7, nothing run, nothing written), served by the daemon.
fn nad_policy_refusal(node: &Node<'_>) -> Result<()> {
    let _d = node.start_daemon()?;
    let outside = tempfile::tempdir()?;
    let data = outside.path().join("leases");
    let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":node.master.0,"mode":"bridge",
        "ipam":{"type":"host-local","dataDir":data,"ranges":[[{"subnet":"10.171.9.0/24"}]]}});
    let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
        "metadata":{"name":"mv-out","namespace":"db"},"spec":{"config":cfg.to_string()}});
    node.cp.apply(&nad.to_string())?;
    let uid = node.pod_with("dpol", "mv-out")?;
    wait_cached(node, "dpol");
    let ns = Netns::new();
    let r = node.call("ADD", "dpol", &uid, &ns.path(), &json!({}));
    let del = node.call("DEL", "dpol", &uid, &ns.path(), &json!({}));
    let e = r.err().clone();
    let msg = e["msg"].as_str().unwrap_or("");
    ensure!(
        e["code"] == 7
            && msg.contains("pod db/dpol")
            && msg.contains("ipam.dataDir")
            && msg.contains("NAD policy"),
        "{e}"
    );
    ensure!(!data.exists(), "host-local ran: {}", data.display());
    ensure!(ns.links() == ["lo"], "links {:?}", ns.links());
    let log = std::fs::read_to_string(node.path("daemon.log")).unwrap_or_default();
    ensure!(
        log.lines()
            .any(|l| l.contains("ADD done") && l.contains("cid-dpol")),
        "not served by the daemon: {}",
        daemon_log_tail(node)
    );
    ensure!(del.code == 0, "DEL: {}", del.out);
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    // Whatever it logged (refusals, errors, its API client), never the token.
    let kubeconfig = std::fs::read_to_string(node.path("kubeconfig"))?;
    let token = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().trim_matches('"').to_string())
        .context("token in plexus' kubeconfig")?;
    ensure!(token.len() > 20, "token {} bytes", token.len());
    ensure!(!log.contains(&token), "the daemon's log carries the token");
    node.cp
        .kubectl(&["-n", "db", "delete", "net-attach-def", "mv-out"])?;
    Ok(())
}

fn initial_list(node: &Node<'_>) -> Result<()> {
    let uid = node.pod("w1")?;
    // Ready means both watches listed: the pod must come from that LIST.
    let _d = node.start_daemon()?;
    let ns = Netns::new();
    let (r, add) = node.counted(|| node.call("ADD", "w1", &uid, &ns.path(), &json!({})))?;
    ensure!(r.code == 0, "ADD failed: {} {}", r.out, r.stderr);
    ensure!(
        gets(&add) == 0,
        "pod not from the initial list: {}",
        shown(&add)
    );
    ensure!(
        node.metric("plexus_cache_misses_total", &[])? == 0.0,
        "cache misses"
    );
    node.call("DEL", "w1", &uid, &ns.path(), &json!({})).ok();
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    Ok(())
}

/// LISTs of `resource` the API server answered from etcd rather than its watch cache.
fn storage_lists(cp: &ControlPlane, resource: &str) -> Result<f64> {
    let text = cp.metrics_text()?;
    let label = format!("resource=\"{resource}\"");
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_storage_list_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

/// The daemon's initial LISTs (and so every relist: the same request) are answered from the
/// API server's watch cache: `resourceVersion=0`, as client-go's informers send it. Without
/// it, each daemon start made etcd scan every pod of the cluster for the node's few.
fn lists_from_the_watch_cache(node: &Node<'_>) -> Result<()> {
    let resources = ["pods", "network-attachment-definitions"];
    let before: Vec<f64> = resources
        .iter()
        .map(|r| storage_lists(node.cp, r))
        .collect::<Result<_>>()?;
    let since = node.cp.audit().len();
    let _d = node.start_daemon()?;
    let after: Vec<f64> = resources
        .iter()
        .map(|r| storage_lists(node.cp, r))
        .collect::<Result<_>>()?;
    ensure!(
        before == after,
        "LISTs answered by etcd (apiserver_storage_list_total) for {resources:?}: {before:?} -> {after:?}"
    );
    let lists: Vec<String> = node.cp.audit()[since..]
        .iter()
        .filter(|e| e.verb == "list" && e.user.ends_with(":plexus"))
        .map(|e| e.uri.clone())
        .collect();
    ensure!(
        lists.len() >= 2,
        "the daemon's LISTs not audited: {lists:?}"
    );
    ensure!(
        lists.iter().all(|u| u.contains("resourceVersion=0")),
        "a LIST without resourceVersion=0: {lists:?}"
    );
    Ok(())
}

fn dropped_watch(node: &Node<'_>) -> Result<()> {
    let _d = node.start_daemon()?;
    let before = node.cached_pods()?;
    let restarts0 = node.metric("plexus_watch_restarts_total", &["pods"])?;
    node.cp.stop_apiserver();
    // Down until the daemon has seen its pod watch fail (not a fixed time: the longer it is
    // down, the longer the watch's backoff and the later the reconnection below).
    let failed = node.wait(
        "the pod watch failed with the apiserver down",
        Duration::from_secs(15),
        || {
            node.metric("plexus_watch_restarts_total", &["pods"])
                .unwrap_or(0.0)
                > restarts0
        },
    );
    node.cp.start_apiserver()?;
    failed?;
    // A pod created after the reconnection reaches the cache through the new watch.
    let back = Instant::now();
    let uid = node.pod("w2")?;
    // Retries back off to 5 s at most (±25 %): the watch is back well within 15 s.
    node.wait("w2 in the cache", Duration::from_secs(15), || {
        node.cached_pods().unwrap_or(0.0) > before
    })?;
    println!(
        "    a pod created after the apiserver came back was cached {:.1} s later",
        back.elapsed().as_secs_f64()
    );
    let restarts = node.metric("plexus_watch_restarts_total", &["pods"])? - restarts0;
    ensure!(restarts >= 1.0, "watch restarts: {restarts}");
    let ns = Netns::new();
    let (r, add) = node.counted(|| node.call("ADD", "w2", &uid, &ns.path(), &json!({})))?;
    ensure!(r.code == 0, "ADD failed: {} {}", r.out, r.stderr);
    ensure!(gets(&add) == 0, "ADD read the API: {}", shown(&add));
    println!("    watch restarts counted while the apiserver was down: {restarts}");
    node.call("DEL", "w2", &uid, &ns.path(), &json!({})).ok();
    ensure!(node.leftovers().is_empty(), "left: {:?}", node.leftovers());
    Ok(())
}

/// The harness' etcd client URL (from the etcd process' command line).
fn etcd_url(cp: &ControlPlane) -> Result<String> {
    let want = format!("--data-dir={}", cp.etcd_dir().join("data").display());
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.contains(&want) {
            if let Some(u) = args
                .iter()
                .find_map(|a| a.strip_prefix("--listen-client-urls="))
            {
                return Ok(u.split(',').next().unwrap_or(u).to_string());
            }
        }
    }
    anyhow::bail!("no etcd process with {want}")
}

/// POST a JSON body to etcd's v3 HTTP gateway.
fn etcd_post(url: &str, path: &str, body: &Value) -> Result<Value> {
    let out = Command::new("curl")
        .args(["-sS", "--fail", "-X", "POST", "-d", &body.to_string()])
        .arg(format!("{url}{path}"))
        .output()?;
    ensure!(
        out.status.success(),
        "etcd {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn gone_relist(node: &Node<'_>) -> Result<()> {
    use base64::Engine as _;
    let _d = node.start_daemon()?;
    let empty = node.cached_pods()?;
    let _uid = node.pod("w3")?;
    node.wait("w3 cached", Duration::from_secs(10), || {
        node.cached_pods().unwrap_or(0.0) > empty
    })?;
    let before = node.cached_pods()?;
    let url = etcd_url(node.cp)?;
    let gone_errors = || {
        let log = std::fs::read_to_string(node.path("daemon.log")).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("watch failed"))
            .filter(|l| l.contains("410") || l.contains("Expired") || l.contains("too old"))
            .count()
    };
    let gone_before = gone_errors();
    node.cp.stop_apiserver();
    // Behind the watch's back: the pod's key deleted and every older revision compacted, so
    // the resourceVersion the daemon resumes from is gone (410) and only a relist sees it.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let del = etcd_post(
        &url,
        "/v3/kv/deleterange",
        &json!({"key": b64("/registry/pods/db/w3")}),
    );
    let compacted = del.as_ref().ok().and_then(|d| {
        let rev = d["header"]["revision"].as_str()?.to_string();
        etcd_post(
            &url,
            "/v3/kv/compaction",
            &json!({"revision": rev, "physical": true}),
        )
        .ok()
    });
    node.cp.start_apiserver()?;
    let del = del?;
    ensure!(del["deleted"] == "1", "etcd delete: {del}");
    ensure!(compacted.is_some(), "etcd compaction failed");
    node.wait(
        "the relist dropped the pod deleted behind the watch",
        Duration::from_secs(30),
        || node.cached_pods().unwrap_or(before) < before,
    )?;
    let gone = gone_errors() - gone_before;
    ensure!(
        gone >= 1,
        "no 410 Gone/Expired watch error in the daemon's log"
    );
    println!("    410/Expired watch errors logged by the daemon: {gone}, then a relist");
    Ok(())
}

/// The memory figure: the daemon at rest with a full node (110 pods) and 1,000 NADs
/// in its caches (printed; the target is checked against a release build in docs/daemon.md).
fn rss_with_caches(node: &Node<'_>) -> Result<()> {
    const PODS: usize = 110;
    const NADS: usize = 1000;
    node.cp.create_namespace("bulk")?;
    let d = node.start_daemon()?;
    let (pods0, nads0) = (
        node.cached_pods()?,
        node.metric("plexus_cache_objects", &["network"])?,
    );
    let (rest0, _) = plexus_e2e::procfs::rss_kib(d.child.id());
    let nad_cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":"eth9","mode":"bridge",
        "ipam":{"type":"host-local","ranges":[[{"subnet":"10.200.0.0/16"}]]}})
    .to_string();
    let nads: Vec<Value> = (0..NADS)
        .map(|i| {
            json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":format!("bulk-{i}"),"namespace":"bulk"},"spec":{"config":nad_cfg}})
        })
        .collect();
    let pods: Vec<Value> = (0..PODS)
        .map(|i| json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":format!("bulk-{i}"),"namespace":"bulk",
                "labels":{"app":"bulk","pod-template-hash":"5d8f7c9b6d"},
                "annotations":{"k8s.v1.cni.cncf.io/networks":"bulk-1, bulk-2@net2, bulk-3"}},
            "spec":{"nodeName":NODE,"automountServiceAccountToken":false,
                "containers":[{"name":"c","image":"local/pause:1","env":[{"name":"A","value":"b"}]}]}}))
        .collect();
    let list =
        |items: Vec<Value>| json!({"apiVersion":"v1","kind":"List","items":items}).to_string();
    node.cp
        .kubectl_stdin(&["create", "-f", "-", "-o", "name"], Some(&list(nads)))?;
    node.cp
        .kubectl_stdin(&["create", "-f", "-", "-o", "name"], Some(&list(pods)))?;
    let full = node.wait("caches filled", Duration::from_secs(60), || {
        node.cached_pods().unwrap_or(0.0) >= pods0 + PODS as f64
            && node
                .metric("plexus_cache_objects", &["network"])
                .unwrap_or(0.0)
                >= nads0 + NADS as f64
    });
    std::thread::sleep(Duration::from_secs(1));
    let (rest, peak) = plexus_e2e::procfs::rss_kib(d.child.id());
    println!(
        "    daemon RSS: {rest0} KiB before, {rest} KiB with {PODS} pods and {NADS} NADs cached (VmHWM {peak} KiB)"
    );
    let _ = node.cp.kubectl(&[
        "-n",
        "bulk",
        "delete",
        "pods",
        "--all",
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    let _ = node.cp.kubectl(&[
        "-n",
        "bulk",
        "delete",
        "net-attach-def",
        "--all",
        "--wait=false",
    ]);
    full
}
