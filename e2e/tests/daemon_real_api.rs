//! Daemon mode against a real kube-apiserver + etcd (`plexus_e2e::realk8s`): `plexus daemon`
//! with the `kube-system/plexus` token (deploy/rbac.yaml + deploy/rbac-daemon.yaml applied as
//! they are) watches the node's pods and the NADs; the `plexus` shim forwards CNI calls to it.
//! Checks: readiness after the first sync, ADD = the network-status PATCH (+ one event) and
//! DEL = 0 requests once cached, a pod created right before its ADD, the API down with a warm
//! cache (the status converges once it is back), and a daemon restart. Prints ADD/DEL times
//! next to thin mode's (not asserted). Skipped (and passing) without `PLEXUS_K8S_BIN`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use common::*;
use plexus_e2e::realk8s::{bins_or_skip, metrics, ControlPlane, RequestCounts, Suite};
use serde_json::{json, Value};

const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
const NODE: &str = "plexus-daemon-node";
const RESOURCES: &[&str] = &["pods", "events", "network-attachment-definitions"];

fn main() -> ExitCode {
    let Some(bins) = bins_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let cp = ControlPlane::start(&bins).expect("start control plane");
    let node = match Node::new(&cp) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("daemon_real_api setup failed: {e:#}");
            return ExitCode::FAILURE;
        }
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
    drop(node);
    suite.finish()
}

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
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
    dir: tempfile::TempDir,
    bridge: HostLink,
    master: HostLink,
}

impl<'a> Node<'a> {
    fn new(cp: &'a ControlPlane) -> Result<Node<'a>> {
        cp.apply_file(&repo("deploy/nad-crd.yaml"))?;
        cp.apply_file(&repo("deploy/rbac.yaml"))?;
        cp.apply_file(&repo("deploy/rbac-daemon.yaml"))?;
        cp.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/network-attachment-definitions.k8s.cni.cncf.io",
        ])?;
        cp.create_namespace("db")?;
        let dir = tempfile::tempdir()?;
        let token = cp.create_token("kube-system", "plexus")?;
        cp.write_kubeconfig(&dir.path().join("kubeconfig"), &token)?;
        let n = Node {
            cp,
            dir,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
        };
        n.nad("mv-a", "10.171.1.0/24")?;
        Ok(n)
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn start_daemon(&self) -> Result<Daemon> {
        let ready = self.path("daemon.ready");
        let _ = std::fs::remove_file(&ready);
        let child = Command::new(bin("plexus"))
            .arg("daemon")
            .args(["--socket", self.path("run/plexus.sock").to_str().unwrap()])
            .args(["--kubeconfig", self.path("kubeconfig").to_str().unwrap()])
            .args(["--node", NODE])
            .args(["--readiness-file", ready.to_str().unwrap()])
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
        let mut c = json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus",
            "daemonSocket": self.path("run/plexus.sock"),
            "kubeconfig": self.path("kubeconfig"), "cniDir": self.path("state"), "binDir": CNI_BIN,
            "confDir": self.path("confdir"), "logLevel":"debug", "logFile": self.path("plexus.log"), "logToStderr": false,
            "delegates":[flannel_like(&self.bridge.0, 71, &self.path("ipam"))]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }

    fn nad(&self, name: &str, subnet: &str) -> Result<()> {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":self.master.0,"mode":"bridge",
            "ipam":{"type":"host-local","dataDir":self.path("ipam"),"ranges":[[{"subnet":subnet}]]}});
        let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":name,"namespace":"db"},"spec":{"config":cfg.to_string()}});
        self.cp.apply(&nad.to_string()).map(drop)
    }

    fn pod(&self, name: &str) -> Result<String> {
        let pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":name,"namespace":"db","annotations":{"k8s.v1.cni.cncf.io/networks":"mv-a"}},
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
        let args = format!("K8S_POD_INFRA_CONTAINER_ID=cid-{name};K8S_POD_UID={uid};IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={name}");
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: &format!("cid-{name}"),
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

fn shown(c: &RequestCounts) -> String {
    c.iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn wait_cached(node: &Node<'_>, name: &str) {
    // The watch delivers a new pod within milliseconds; give it a moment.
    let _ = (node, name);
    std::thread::sleep(Duration::from_millis(300));
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
            "network-status never converged"
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
