//! Node tier, daemon mode: a real kubelet and containerd (`plexus_e2e::realk8s::node`) on a real
//! kube-apiserver, `plexus daemon` running as a process of the node with a kubeconfig from a
//! TokenRequest token for `kube-system/plexus` (deploy/rbac.yaml + deploy/rbac-daemon.yaml), and
//! plexus installed by `deploy/install.sh` with the command and environment of the install
//! container of deploy/plexus-daemon-daemonset.yaml (its `PLEXUS_BINARIES` adds `plexus-shim`,
//! its `PLEXUS_EXTRA_CONFIG` makes `plexus-shim` the config's type and puts `daemonSocket` in
//! it, here pointed at the node's socket): containerd execs `plexus-shim`.
//!
//! Cases, in order: pods with 0 and 2 extra networks Running with plexus' network-status, served
//! by the daemon (its metrics count the ADDs); the daemon stopped (SIGTERM): a pod created then
//! runs through the shim's thin fallback; the daemon started again: pods created after the
//! restart run through the new daemon; all pods deleted (the ones from before the restart are
//! DELed by the new daemon from their saved plans): nothing left on the node (netns, veth,
//! leases, plans, results).
//!
//! Skipped (and passing) without `PLEXUS_K8S_BIN`; `PLEXUS_K8S_REQUIRE=1` makes that a failure.

#[allow(dead_code)]
#[path = "real_node/api.rs"]
mod api;
mod common;
#[allow(dead_code)]
#[path = "real_node/pods.rs"]
mod pods;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use plexus_e2e::realk8s::node::{cni_netns, wait_for, Node};
use plexus_e2e::realk8s::{
    control_plane_or_skip, free_port, setup_or_report, ControlPlane, K8sBins, Proc, Suite,
};
use serde_json::{json, Value};

use api::Api;
use pods::{
    create_and_wait, delete_and_wait, manifest, network_status, wait_until_plexus_is_in_the_path,
};

const NS: &str = "app";
const NODE: &str = "plexus-dnode";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let Some(mut tier) = setup_or_report("real_node_daemon", &cp, Tier::start(&cp, cp.bins()))
    else {
        return ExitCode::FAILURE;
    };
    let mut suite = Suite::new("real_node_daemon");
    let installed = tier.install();
    let ok = installed.is_ok();
    suite.case(
        "daemon_started_and_install_sh_run_with_the_daemon_daemonsets_environment",
        || installed,
    );
    if ok {
        suite.case(
            "pods_running_with_network_status_served_by_the_daemon",
            || tier.batch("before", 2, 2),
        );
        suite.case(
            "daemon_stopped_a_pod_runs_through_the_thin_fallback",
            || {
                tier.stop_daemon()?;
                tier.batch("down", 1, 0)
            },
        );
        suite.case("daemon_restarted_pods_created_after_it_run", || {
            tier.start_daemon()?;
            tier.batch("after", 2, 2)
        });
        suite.case("every_pod_deleted_nothing_left_on_the_node", || {
            tier.delete_all()
        });
    }
    tier.daemon.take();
    tier.installer.take();
    tier.node.stop();
    drop(tier);
    suite.finish()
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
    sandbox: String,
}

struct Tier<'a> {
    cp: &'a ControlPlane,
    node: Node<'a>,
    api: Api,
    daemon: Option<Proc>,
    installer: Option<Proc>,
    metrics_port: u16,
    /// The plexus binary, resolved once (a source edited mid-run must not fail a restart).
    plexus: PathBuf,
    bridges: Vec<String>,
    pods: Vec<Placed>,
}

impl<'a> Tier<'a> {
    fn start(cp: &'a ControlPlane, bins: &K8sBins) -> Result<Tier<'a>> {
        let bridges = vec![link("c"), link("a"), link("b")];
        let primary_bridge = bridges[0].clone();
        let primary = move |ipam: &Path| {
            json!({"cniVersion":"1.0.0","name":"cbr0","plugins":[
                {"type":"bridge","bridge":primary_bridge,"isGateway":true,"isDefaultGateway":true,
                 "ipMasq":false,"hairpinMode":true,
                 "ipam":{"type":"host-local","dataDir":ipam,"ranges":[[{"subnet":"10.247.0.0/24"}]]}},
                {"type":"portmap","capabilities":{"portMappings":true}}]})
        };
        for ns in [NS, "default"] {
            cp.create_namespace(ns)?;
        }
        let node = Node::start(cp, bins, NODE, &primary)?;
        for b in &bridges {
            node.own_link(b);
        }
        let api = Api::new(&cp.admin_kubeconfig())?;
        Ok(Tier {
            cp,
            node,
            api,
            daemon: None,
            installer: None,
            metrics_port: free_port()?,
            plexus: common::bin("plexus"),
            bridges,
            pods: Vec::new(),
        })
    }

    fn socket(&self) -> PathBuf {
        self.node.path("run-plexus/plexus.sock")
    }

    /// Start `plexus-daemon` (the DaemonSet's daemon container runs it) on the node and wait
    /// for its readiness file.
    fn start_daemon(&mut self) -> Result<()> {
        let ready = self.node.path("daemon.ready");
        let _ = std::fs::remove_file(&ready);
        let p = |p: PathBuf| p.display().to_string();
        let args = vec![
            "--socket".to_string(),
            p(self.socket()),
            "--kubeconfig".into(),
            p(self.node.path("daemon.kubeconfig")),
            "--node".into(),
            NODE.into(),
            "--readiness-file".into(),
            p(ready.clone()),
            "--metrics-address".into(),
            format!("127.0.0.1:{}", self.metrics_port),
        ];
        let log = self.node.path("daemon.log");
        let daemon = common::bin("plexus-daemon");
        self.daemon = Some(Proc::spawn("plexus-daemon", &daemon, &args, &log)?);
        wait_for(
            "the daemon's readiness file",
            Duration::from_secs(20),
            || Ok(ready.exists()),
        )
        .with_context(|| plexus_e2e::realk8s::tail(&log, 20))
    }

    /// SIGTERM the daemon; its socket must be gone after.
    fn stop_daemon(&mut self) -> Result<()> {
        let mut d = self.daemon.take().context("daemon not running")?;
        d.stop(Duration::from_secs(10));
        ensure!(!self.socket().exists(), "socket left after SIGTERM");
        Ok(())
    }

    /// One value of the daemon's `/metrics` (sum over the series matching all of `labels`).
    fn metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body
            .lines()
            .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// RBAC for the daemon, its kubeconfig, the daemon, then install.sh with the daemon
    /// DaemonSet's installer command and environment; wait until the config is in place.
    fn install(&mut self) -> Result<()> {
        let cp = self.cp;
        cp.apply_deploy(&[
            "nad-crd.yaml",
            "rbac.yaml",
            "rbac-daemon.yaml",
            "plexus-daemon-daemonset.yaml",
        ])?;
        let token = cp.create_token("kube-system", "plexus")?;
        cp.write_kubeconfig(&self.node.path("daemon.kubeconfig"), &token)?;
        self.start_daemon()?;

        let ds: Value = serde_json::from_str(&cp.kubectl(&[
            "-n",
            "kube-system",
            "get",
            "daemonset",
            "kube-plexus-daemon",
            "-o",
            "json",
        ])?)?;
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
        let command: Vec<String> = c["command"]
            .as_array()
            .context("installer has no command")?
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        ensure!(command.first().map(String::as_str) == Some("/install.sh"));
        let mut env: Vec<(String, String)> = Vec::new();
        let mut extra = json!({});
        for e in c["env"].as_array().into_iter().flatten() {
            let (k, v) = (
                e["name"].as_str().unwrap_or("").to_string(),
                e["value"].as_str().unwrap_or("").to_string(),
            );
            if k == "PLEXUS_EXTRA_CONFIG" {
                extra = serde_json::from_str(&v).context("PLEXUS_EXTRA_CONFIG")?;
            } else {
                env.push((k, v));
            }
        }
        ensure!(
            extra["daemonSocket"] == "/run/plexus/plexus.sock",
            "the DaemonSet's installer does not select daemon mode: {extra}"
        );
        // Host paths mapped to the node's directories: the socket and the plans dir.
        extra["daemonSocket"] = json!(self.socket());
        extra["cniDir"] = json!(self.node.plexus_dir());
        let sa = self.node.path("serviceaccount");
        std::fs::create_dir_all(&sa)?;
        std::fs::write(sa.join("token"), &token)?;
        std::fs::write(sa.join("ca.crt"), cp.ca_pem())?;
        let src = self.node.path("image-bin");
        std::fs::create_dir_all(&src)?;
        for b in ["plexus", "plexus-shim", "sriov"] {
            std::fs::copy(
                if b == "plexus" {
                    self.plexus.clone()
                } else {
                    common::bin(b)
                },
                src.join(b),
            )?;
        }
        let conf = self.node.conf_dir().display().to_string();
        let p = |p: &Path| p.display().to_string();
        env.extend([
            ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT".into(), cp.port().to_string()),
            ("PLEXUS_SRC_DIR".into(), p(&src)),
            ("PLEXUS_BIN_DIR".into(), p(&self.node.bin_dir())),
            ("PLEXUS_CONF_DIR".into(), conf.clone()),
            ("PLEXUS_HOST_CONF_DIR".into(), conf),
            ("PLEXUS_TOKEN_FILE".into(), p(&sa.join("token"))),
            ("PLEXUS_CA_FILE".into(), p(&sa.join("ca.crt"))),
            ("PLEXUS_LOG_FILE".into(), p(&self.node.path("plexus.log"))),
            (
                "PLEXUS_READY_FILE".into(),
                p(&self.node.path("install-state/ready")),
            ),
            ("PLEXUS_EXTRA_CONFIG".into(), extra.to_string()),
        ]);
        let mut args: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        args.push("sh".into());
        args.push(p(&repo("deploy/install.sh")));
        args.extend(command[1..].iter().cloned());
        let log = self.node.path("installer.log");
        self.installer = Some(Proc::spawn("install.sh", Path::new("env"), &args, &log)?);
        let ready = self.node.path("install-state/ready");
        wait_for(
            "the installer's ready file",
            Duration::from_secs(60),
            || Ok(ready.exists()),
        )
        .with_context(|| plexus_e2e::realk8s::tail(&log, 20))?;
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
        for (i, name) in ["br-a", "br-b"].into_iter().enumerate() {
            let cfg = json!({"cniVersion":"1.0.0","name":name,"type":"bridge",
                "bridge":self.bridges[i + 1],"ipam":ipam(&format!("10.246.{}.0/24", i + 1))});
            let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":{"name":name,"namespace":NS},"spec":{"config":cfg.to_string()}});
            cp.apply(&nad.to_string())?;
        }
        wait_until_plexus_is_in_the_path(&self.api, NS, NODE)?;
        self.place("probe", &["probe".to_string()])
    }

    /// Record the sandbox and netns of running pods of `batch`.
    fn place(&mut self, batch: &str, names: &[String]) -> Result<()> {
        for name in names {
            let pod = self.api.get_pod(NS, name)?.context("pod gone")?;
            let uid = pod["metadata"]["uid"].as_str().context("uid")?;
            let (sandbox, netns) = self.node.pod_sandbox(uid)?;
            self.pods.push(Placed {
                batch: batch.into(),
                name: name.clone(),
                netns,
                sandbox,
            });
        }
        Ok(())
    }

    /// `n` pods with br-a and br-b (`daemon_adds`: how many ADDs the daemon must have served
    /// for them; 0 when it is stopped).
    fn batch(&mut self, batch: &str, n: usize, daemon_adds: usize) -> Result<()> {
        let before = if self.daemon.is_some() {
            self.metric("plexus_cni_requests_total", &["ADD", "ok"])?
        } else {
            0.0
        };
        let names: Vec<String> = (0..n).map(|i| format!("{batch}-{i}")).collect();
        let nets = json!("br-a, br-b@data1");
        let manifests: Vec<Value> = names
            .iter()
            .enumerate()
            .map(|(i, name)| manifest(NS, name, NODE, batch, (i % 2 == 0).then_some(&nets)))
            .collect();
        let t = create_and_wait(&self.api, &manifests, Duration::from_secs(60))
            .with_context(|| self.node.logs(10))?;
        println!("    {batch}: {n} pods Running, ms {t:.0?}");
        self.place(batch, &names)?;
        for (i, name) in names.iter().enumerate() {
            let pod = self.api.get_pod(NS, name)?.context("pod")?;
            let st = network_status(&pod)?;
            let want = if i % 2 == 0 { 3 } else { 1 };
            ensure!(st.len() == want, "{name}: network-status {st:?}");
            ensure!(st[0]["default"] == true, "{name}: {st:?}");
            if want == 3 {
                ensure!(
                    st[1]["name"] == "app/br-a" && st[2]["interface"] == "data1",
                    "{name}: {st:?}"
                );
            }
        }
        if self.daemon.is_some() {
            let served = self.metric("plexus_cni_requests_total", &["ADD", "ok"])? - before;
            ensure!(
                served >= daemon_adds as f64,
                "the daemon served {served} ADDs for {n} new pods"
            );
        }
        // With the daemon stopped, the 3 entries above can only come from the shim's thin fallback.
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
        let r = wait_for("nothing left on the node", Duration::from_secs(10), || {
            Ok(self.leftovers().is_empty())
        });
        r.with_context(|| format!("left: {:?}", self.leftovers()))
    }

    /// Plans and result files, leases, `cni-*` netns, veths on the bridges, libcni cache.
    fn leftovers(&self) -> Vec<String> {
        let mut v: Vec<String> = common::files_under(&self.node.plexus_dir())
            .into_iter()
            .map(|f| format!("plexus: {f}"))
            .collect();
        v.extend(
            common::files_under(&self.node.ipam_dir())
                .into_iter()
                .map(|f| format!("lease: {f}")),
        );
        v.extend(
            cni_netns()
                .difference(self.node.netns_before())
                .map(|n| format!("netns: {n}")),
        );
        for br in &self.bridges {
            let out = common::ip(&["-j", "link", "show", "master", br]);
            let links: Value = serde_json::from_str(&out).unwrap_or(json!([]));
            for l in links.as_array().into_iter().flatten() {
                v.push(format!("veth on {br}: {}", l["ifname"]));
            }
        }
        if let Ok(rd) = std::fs::read_dir("/var/lib/cni/results") {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if self.pods.iter().any(|p| n.contains(p.sandbox.as_str())) {
                    v.push(format!("libcni cache: {n}"));
                }
            }
        }
        v
    }
}
