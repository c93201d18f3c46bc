//! Metrics tier: both modes' metrics endpoints against a real kube-apiserver + etcd
//! (`plexus_e2e::realk8s`), scraped by Debian's real Prometheus (2.42) with the shipped scrape
//! config (deploy/monitoring/prometheus-scrape.yaml) and rules.
//!
//! `plexus daemon` runs with the `kube-system/plexus` token after deploy/base/rbac.yaml,
//! components/daemon/rbac-daemon.yaml and components/metrics/rbac-metrics.yaml are applied as
//! they are, and serves `/metrics` over HTTPS (a certificate given by flags, so curl verifies
//! it) behind TokenReview + SubjectAccessReview. Pods are served through `plexus-shim` (the
//! daemon-mode CNI config) in real network namespaces with the Debian plugins.
//!
//! Thin mode's exporter (`plexus-daemon reconcile --metrics-address`, the thin DaemonSet's
//! `reconcile` container) runs beside it with the in-cluster API client (a private mount
//! namespace with plexus' token and the CA on /run/secrets) and the same certificate; thin
//! calls are `plexus` itself.
//!
//! Cases: the endpoint answers 401 without a token and with a garbage one, 403 for a
//! ServiceAccount without ClusterRole plexus-metrics-reader, 200 for one bound to it (one
//! TokenReview for repeated scrapes: the cache), 405 for POST, `/healthz` and `/readyz` without a
//! token, never a token in its log; then Prometheus (its own data dir under the test's temp
//! dir) finds the daemon's and the exporter's pods (pod objects of the DaemonSets' shape, their
//! status set to the processes' address since no kubelet runs here) — through file_sd with the targets and
//! `__meta_kubernetes_*` labels kubernetes_sd (role pod) makes of the API's pod list, because
//! Debian's Prometheus is built without kubernetes_sd — relabels it with the shipped
//! relabelings (node, plexus_mode) and scrapes both with the reader's token file: after 3
//! daemon-mode pods, 2 thin ones and one NAD the node policy refuses in each mode, PromQL answers
//! the ADD counts and the refusals per mode; the same jobs without a token and with the other
//! ServiceAccount's token are down with 401 / 403; the shipped rules load.
//!
//! The metrics component's patched DaemonSets pass a server-side dry run in both modes.
//!
//! One libtest test (`cargo test -p plexus-e2e --test real_metrics -- --nocapture` prints the
//! PromQL figures). Skipped (and passing) without `PLEXUS_K8S_BIN`, or without
//! /usr/bin/prometheus unless `PLEXUS_PROMETHEUS_REQUIRE` is set.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use common::*;
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::node_rig::PLEXUS_NAMESPACE;
use plexus_e2e::realk8s::rig::{plexus_token, PlexusToken, Rig};
use plexus_e2e::realk8s::{control_plane_or_skip, free_port, tail, ControlPlane, Proc};
use serde_json::{json, Value};

const NODE: &str = "plexus-metrics-node";
const NS: &str = "mdb";
/// The ServiceAccounts scraping: bound to plexus-metrics-reader, and not.
const READER: (&str, &str) = ("monitoring", "prometheus");
const OTHER: (&str, &str) = ("monitoring", "other");
const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A case of the tier.
type Case = fn(&Node<'_>) -> Result<()>;

/// One test (libtest harness; the cases run in order on this thread, which owns the control
/// plane's processes): the first failing case fails it.
#[test]
fn real_metrics() {
    if !Path::new(PROMETHEUS).is_file() {
        let required = std::env::var_os("PLEXUS_PROMETHEUS_REQUIRE").is_some_and(|v| !v.is_empty());
        assert!(
            !required,
            "PLEXUS_PROMETHEUS_REQUIRE is set and {PROMETHEUS} is missing (apt-get install prometheus)"
        );
        println!("real_metrics skipped: no {PROMETHEUS} (apt-get install prometheus)");
        return;
    }
    let Some(cp) = control_plane_or_skip() else {
        return;
    };
    let node = Node::new(&cp)
        .unwrap_or_else(|e| panic!("setup: {e:#}\n{}", tail(&cp.apiserver_log(), 30)));
    let daemon = node
        .start_daemon()
        .unwrap_or_else(|e| panic!("daemon: {e:#}"));
    let cases: [(&str, Case); 3] = [
        ("tokens_401_403_200_and_open_health", endpoint),
        (
            "metrics_component_passes_a_server_side_dry_run",
            component_dry_run,
        ),
        (
            "prometheus_scrapes_with_the_shipped_config_and_answers_promql",
            prometheus,
        ),
    ];
    for (name, case) in cases {
        let t = Instant::now();
        if let Err(e) = case(&node) {
            panic!("{name}: {e:#}\ndaemon log:\n{}", node.log_tail());
        }
        println!(
            "real_metrics {name}: ok ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
    }
    drop(daemon);
}

/// A running daemon, killed on drop.
struct Daemon {
    child: Child,
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
    /// Thin mode's exporter (`plexus-daemon reconcile --metrics-address`).
    thin_port: u16,
    reader_token: String,
    other_token: String,
}

impl<'a> Node<'a> {
    fn new(cp: &'a ControlPlane) -> Result<Node<'a>> {
        let rig = Rig::builder()
            .deploy(&[
                "base/nad-crd.yaml",
                "base/rbac.yaml",
                "components/daemon/rbac-daemon.yaml",
                "components/metrics/rbac-metrics.yaml",
            ])
            .namespaces(&[NS, READER.0])
            .plexus_token(PlexusToken::Unbound)
            .build(cp)?;
        for (ns, sa) in [READER, OTHER] {
            cp.apply(
                &json!({"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":sa,"namespace":ns}})
                    .to_string(),
            )?;
        }
        cp.apply(
            &json!({"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding",
                "metadata":{"name":"prometheus-plexus-metrics"},
                "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"plexus-metrics-reader"},
                "subjects":[{"kind":"ServiceAccount","name":READER.1,"namespace":READER.0}]})
            .to_string(),
        )?;
        let n = Node {
            cp,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
            metrics_port: free_port()?,
            thin_port: free_port()?,
            reader_token: cp.create_token(READER.0, READER.1)?,
            other_token: cp.create_token(OTHER.0, OTHER.1)?,
            rig,
        };
        n.nad("mv-a", "10.173.1.0/24")?;
        // The metrics certificate (curl verifies it against its CA).
        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])?;
        std::fs::write(n.path("tls.crt"), ck.cert.pem())?;
        std::fs::write(n.path("tls.key"), ck.signing_key.serialize_pem())?;
        Ok(n)
    }

    fn path(&self, p: &str) -> PathBuf {
        self.rig.path(p)
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.metrics_port)
    }

    /// Thin mode's exporter as the thin DaemonSet's `reconcile` container runs it, with the
    /// same certificate: its API client is the in-cluster one (KUBERNETES_SERVICE_HOST/PORT and
    /// the ServiceAccount token and CA files), so it runs in a private mount namespace where a
    /// tmpfs on /run/secrets holds plexus' token and the API's CA (the host's stay as they are).
    fn start_exporter(&self) -> Result<Daemon> {
        let config = self.path("plexus-thin.conf");
        std::fs::write(&config, self.thin_config().to_string())?;
        let sa = self.path("sa");
        std::fs::create_dir_all(&sa)?;
        std::fs::write(
            sa.join("token"),
            plexus_token(self.cp, &PlexusToken::Unbound)?,
        )?;
        std::fs::write(sa.join("ca.crt"), self.cp.ca_pem())?;
        let p = |s: &str| self.path(s).display().to_string();
        let script = "mount -t tmpfs -o size=1m,mode=0755 plexus-e2e-sa /run/secrets \
            && mkdir -p /run/secrets/kubernetes.io/serviceaccount \
            && cp \"$1\"/token \"$1\"/ca.crt /run/secrets/kubernetes.io/serviceaccount/ \
            && shift && exec \"$@\"";
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
            .arg(&sa)
            .arg(bin("plexus-daemon"))
            .args(["reconcile", "--config", &config.display().to_string()])
            .args(["--every", "3600"])
            .args([
                "--metrics-address",
                &format!("127.0.0.1:{}", self.thin_port),
            ])
            .args(["--metrics-dir", &p("state/metrics")])
            .args(["--metrics-cert-file", &p("tls.crt")])
            .args(["--metrics-key-file", &p("tls.key")])
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", self.cp.port().to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.path("exporter.log"))?)
            .spawn()?;
        let mut d = Daemon { child };
        let t = Instant::now();
        let url = format!("https://127.0.0.1:{}/healthz", self.thin_port);
        loop {
            let ok = Command::new("curl")
                .args(["-sf", "--max-time", "2", "--cacert", &p("tls.crt"), &url])
                .output()?
                .status
                .success();
            if ok {
                break;
            }
            let log = std::fs::read_to_string(self.path("exporter.log")).unwrap_or_default();
            if let Some(st) = d.child.try_wait()? {
                bail!("exporter exited ({st}): {log}");
            }
            ensure!(
                t.elapsed() < Duration::from_secs(20),
                "exporter not serving: {log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        ensure!(
            self.path("state/metrics").is_dir(),
            "the exporter makes the dir"
        );
        Ok(d)
    }

    /// Thin mode's CNI config: `plexus` itself, the same delegates, state and policy.
    fn thin_config(&self) -> Value {
        let mut c = self.config();
        c["type"] = json!("plexus");
        c.as_object_mut().expect("config").remove("daemonSocket");
        c
    }

    /// A thin-mode call (`plexus` with [`Node::thin_config`]).
    fn call_thin(&self, command: &str, name: &str, uid: &str, netns: &str) -> Run {
        let cid = format!("cid-{name}");
        let args = format!("K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid};IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={name}");
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: &cid,
                netns,
                ifname: "eth0",
                args: &args,
            },
            &self.thin_config(),
            &[],
        )
    }

    fn start_daemon(&self) -> Result<Daemon> {
        let ready = self.path("daemon.ready");
        let p = |s: &str| self.path(s).display().to_string();
        let child = Command::new(bin("plexus"))
            .arg("daemon")
            .args(["--socket", &p("run/plexus.sock")])
            .args(["--kubeconfig", &p("kubeconfig")])
            .args(["--node", NODE])
            .args(["--readiness-file", &p("daemon.ready")])
            .args([
                "--metrics-address",
                &format!("127.0.0.1:{}", self.metrics_port),
            ])
            .args(["--metrics-cert-file", &p("tls.crt")])
            .args(["--metrics-key-file", &p("tls.key")])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(self.path("daemon.log"))?,
            )
            .spawn()?;
        let mut d = Daemon { child };
        let t = Instant::now();
        while !ready.exists() {
            if let Some(st) = d.child.try_wait()? {
                bail!("daemon exited ({st}): {}", self.log_tail());
            }
            ensure!(
                t.elapsed() < Duration::from_secs(20),
                "daemon not ready after 20 s: {}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.path("daemon.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// `curl` of the endpoint: (HTTP code, body), verifying the certificate.
    fn curl(&self, path: &str, token: Option<&str>, method: &str) -> Result<(u16, String)> {
        let mut c = Command::new("curl");
        c.args(["-sS", "--max-time", "20", "-X", method])
            .arg("--cacert")
            .arg(self.path("tls.crt"))
            .args(["-w", "\n%{http_code}"]);
        if let Some(t) = token {
            c.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        let out = c.arg(self.url(path)).output()?;
        ensure!(
            out.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').context("curl output")?;
        Ok((code.trim().parse()?, body.to_string()))
    }

    fn config(&self) -> Value {
        json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus-shim",
            "daemonSocket": self.path("run/plexus.sock"),
            "kubeconfig": self.path("kubeconfig"), "cniDir": self.path("state"), "binDir": CNI_BIN,
            "confDir": self.path("confdir"), "logLevel":"debug", "logFile": self.path("plexus.log"), "logToStderr": false,
            "delegates":[flannel_like(&self.bridge.0, 73, &self.path("ipam"))],
            "nadPolicy": nad_policy_allowing(&[self.rig.dir()])})
    }

    /// A macvlan NAD with host-local leases under `data_dir` (the node's ipam dir: allowed by
    /// the node's NAD policy; elsewhere: refused).
    fn nad_with(&self, name: &str, subnet: &str, data_dir: &Path) -> Result<()> {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":self.master.0,"mode":"bridge",
            "ipam":{"type":"host-local","dataDir":data_dir,"ranges":[[{"subnet":subnet}]]}});
        let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":name,"namespace":NS},"spec":{"config":cfg.to_string()}});
        self.cp.apply(&nad.to_string()).map(drop)
    }

    fn nad(&self, name: &str, subnet: &str) -> Result<()> {
        self.nad_with(name, subnet, &self.path("ipam"))
    }

    /// Create pod `name` on the node with `networks`; its UID.
    fn pod(&self, name: &str, networks: &str) -> Result<String> {
        let pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":name,"namespace":NS,"annotations":{"k8s.v1.cni.cncf.io/networks":networks}},
            "spec":{"nodeName":NODE,"automountServiceAccountToken":false,
                "containers":[{"name":"c","image":"local/pause:1"}]}});
        self.cp
            .kubectl_stdin(&["create", "-f", "-"], Some(&pod.to_string()))?;
        let p = self
            .cp
            .get_json(&format!("/api/v1/namespaces/{NS}/pods/{name}"))?;
        Ok(p["metadata"]["uid"].as_str().context("uid")?.to_string())
    }

    fn call(&self, command: &str, name: &str, uid: &str, netns: &str) -> Run {
        let cid = format!("cid-{name}");
        let args = format!("K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid};IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME={name}");
        run(
            &bin("plexus-shim"),
            &Call {
                command,
                container_id: &cid,
                netns,
                ifname: "eth0",
                args: &args,
            },
            &self.config(),
            &[],
        )
    }

    /// The pod objects of both DaemonSets' shape on this node (labels, hostNetwork, the
    /// container with the `metrics` port: the daemon's, thin mode's `reconcile`), their status
    /// set as the kubelet would: Running, their IP the processes' address. Prometheus finds
    /// the daemon and the exporter through them.
    fn pod_objects(&self) -> Result<()> {
        self.cp.create_namespace(PLEXUS_NAMESPACE)?;
        for (name, app, container, port) in [
            (
                "kube-plexus-daemon-mtier",
                "plexus-daemon",
                "plexus-daemon",
                self.metrics_port,
            ),
            (
                "kube-plexus-ds-mtier",
                "plexus",
                "reconcile",
                self.thin_port,
            ),
        ] {
            let pod = json!({"apiVersion":"v1","kind":"Pod",
                "metadata":{"name":name,"namespace":PLEXUS_NAMESPACE,
                    "labels":{"name":app,"app":app,"tier":"node"}},
                "spec":{"nodeName":NODE,"hostNetwork":true,"automountServiceAccountToken":false,
                    "containers":[{"name":container,"image":"plexus",
                        "ports":[{"name":"metrics","containerPort":port,"protocol":"TCP"}]}]}});
            self.cp
                .kubectl_stdin(&["apply", "-f", "-"], Some(&pod.to_string()))?;
            let status = json!({"status":{"phase":"Running","podIP":"127.0.0.1","hostIP":"127.0.0.1",
                "podIPs":[{"ip":"127.0.0.1"}],
                "conditions":[{"type":"Ready","status":"True"}]}});
            self.cp.kubectl(&[
                "-n",
                PLEXUS_NAMESPACE,
                "patch",
                "pod",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ])?;
        }
        Ok(())
    }
}

/// TokenReviews the API server's audit log has.
fn token_reviews(cp: &ControlPlane) -> usize {
    cp.audit()
        .iter()
        .filter(|e| e.resource == "tokenreviews" && e.verb == "create")
        .count()
}

fn endpoint(node: &Node<'_>) -> Result<()> {
    let (code, body) = node.curl("/metrics", None, "GET")?;
    ensure!(
        code == 401 && body.contains("no bearer token"),
        "no token: {code} {body}"
    );
    let (code, body) = node.curl("/metrics", Some("garbage.not-a-token"), "GET")?;
    ensure!(code == 401, "garbage token: {code} {body}");
    let (code, body) = node.curl("/metrics", Some(&node.other_token), "GET")?;
    ensure!(
        code == 403 && body.contains("system:serviceaccount:monitoring:other"),
        "unbound ServiceAccount: {code} {body}"
    );
    let before = token_reviews(node.cp);
    let mut took = Vec::new();
    for i in 0..3 {
        let t = Instant::now();
        let (code, body) = node.curl("/metrics", Some(&node.reader_token), "GET")?;
        took.push(t.elapsed().as_secs_f64() * 1000.0);
        ensure!(code == 200, "reader, scrape {i}: {code} {body}");
        ensure!(
            body.contains("plexus_cache_synced{resource=\"pods\"} 1") && body.ends_with("# EOF\n"),
            "{body}"
        );
    }
    // The audit log is written asynchronously: give it a moment.
    std::thread::sleep(Duration::from_secs(2));
    let reviews = token_reviews(node.cp) - before;
    ensure!(
        reviews == 1,
        "3 scrapes with one token made {reviews} TokenReviews (the cache keeps an allowed token 60 s)"
    );
    println!(
        "    curl scrape (TLS handshake included): first {:.1} ms (TokenReview + SubjectAccessReview), then {:.1} / {:.1} ms (cached)",
        took[0], took[1], took[2]
    );
    let (code, _) = node.curl("/metrics", Some(&node.reader_token), "POST")?;
    ensure!(code == 405, "POST: {code}");
    for p in ["/healthz", "/readyz"] {
        let (code, body) = node.curl(p, None, "GET")?;
        ensure!(code == 200, "{p}: {code} {body}");
    }
    let (code, _) = node.curl("/nothing", None, "GET")?;
    ensure!(code == 404, "/nothing: {code}");
    let log = std::fs::read_to_string(node.path("daemon.log"))?;
    for t in [&node.reader_token, &node.other_token] {
        ensure!(
            !log.contains(t.as_str()),
            "the daemon's log carries a scraper's token"
        );
    }
    ensure!(
        log.contains("metrics endpoint serving") && log.contains("https"),
        "{}",
        node.log_tail()
    );
    Ok(())
}

/// Both modes with components/metrics (the PodMonitor needs the operator's CRD, absent here)
/// pass `kubectl apply --dry-run=server -k`: the patched DaemonSets (the env's fieldRef, the
/// named port, the HTTPS probes) are valid for the real API server.
fn component_dry_run(node: &Node<'_>) -> Result<()> {
    let deploy = repo("deploy").canonicalize()?;
    let dir = node.path("kustomize");
    for mode in ["daemon", "thin"] {
        let combo = dir.join(mode);
        std::fs::create_dir_all(&combo)?;
        // A kustomization names directories by relative path only.
        let up = "../".repeat(combo.components().count() - 1);
        let rel = |p: &str| {
            format!(
                "{up}{}/{p}",
                deploy.display().to_string().trim_start_matches('/')
            )
        };
        std::fs::write(
            combo.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - {}\n  - {}\n  - {}\n",
                rel("base"),
                rel(&format!("components/{mode}")),
                rel("components/metrics"),
                rel("settings")
            ),
        )?;
        let out = node.cp.kubectl(&[
            "apply",
            "--dry-run=server",
            "-k",
            &combo.display().to_string(),
        ])?;
        let ds = if mode == "daemon" {
            "daemonset.apps/kube-plexus-daemon"
        } else {
            "daemonset.apps/kube-plexus-ds"
        };
        ensure!(out.contains(ds), "{mode}: {out}");
        ensure!(
            out.contains("clusterrole.rbac.authorization.k8s.io/plexus-metrics-reader"),
            "{mode}: {out}"
        );
    }
    Ok(())
}

/// The `kubernetes_sd_configs` block of the shipped job.
const K8S_SD: &str = "    kubernetes_sd_configs:\n      - role: pod\n        namespaces:\n          # plexus' namespace (deploy/settings).\n          names: [kube-system]\n";

/// The shipped scrape config for this tier: the token file, a 2 s interval, and two more jobs
/// of the same shape (no token; the unbound ServiceAccount's). Debian's Prometheus is built
/// without kubernetes_sd (its README.Debian), so the `kubernetes_sd_configs` block becomes a
/// file_sd of the targets kubernetes_sd would make ([`pod_targets`]); the shipped relabelings
/// run on them unchanged.
fn scrape_config(node: &Node<'_>, dir: &Path) -> Result<String> {
    let shipped = std::fs::read_to_string(repo("deploy/monitoring/prometheus-scrape.yaml"))?;
    let token = dir.join("token");
    let other = dir.join("other-token");
    std::fs::write(&token, &node.reader_token)?;
    std::fs::write(&other, &node.other_token)?;
    const TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
    for (what, n) in [(TOKEN_FILE, 1), (K8S_SD, 1), ("scrape_interval: 30s", 1)] {
        ensure!(
            shipped.matches(what).count() == n,
            "prometheus-scrape.yaml: {what:?} not {n} time(s)"
        );
    }
    let job = &shipped[shipped.find("  - job_name: plexus\n").context("job")?..];
    let job = job
        .replace(
            K8S_SD,
            &format!(
                "    file_sd_configs:\n      - files: [{}]\n        refresh_interval: 2s\n",
                dir.join("targets.json").display()
            ),
        )
        .replace("scrape_interval: 30s", "scrape_interval: 2s");
    let noauth: String = job
        .replace("job_name: plexus\n", "job_name: plexus-noauth\n")
        .lines()
        .filter(|l| {
            !["authorization:", "type: Bearer", "credentials_file:"]
                .iter()
                .any(|k| l.contains(k))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let forbidden = job
        .replace("job_name: plexus\n", "job_name: plexus-forbidden\n")
        .replace(TOKEN_FILE, &other.display().to_string());
    let main = job.replace(TOKEN_FILE, &token.display().to_string());
    Ok(format!(
        "global:\n  evaluation_interval: 5s\nrule_files:\n  - {}\nscrape_configs:\n{main}{noauth}{forbidden}",
        repo("deploy/monitoring/rules/plexus.rules.yaml").display()
    ))
}

/// What kubernetes_sd (role pod) makes of the pods of plexus' namespace as the API lists them:
/// one target per container port, `<pod IP>:<port>`, with its `__meta_kubernetes_*` labels
/// (pod labels sanitised as Prometheus does), as file_sd JSON.
fn pod_targets(cp: &ControlPlane) -> Result<Value> {
    let pods: Value = serde_json::from_str(&cp.kubectl(&[
        "-n",
        PLEXUS_NAMESPACE,
        "get",
        "pods",
        "-o",
        "json",
    ])?)?;
    let mut groups = Vec::new();
    for p in pods["items"].as_array().into_iter().flatten() {
        let Some(ip) = p["status"]["podIP"].as_str() else {
            continue;
        };
        for c in p["spec"]["containers"].as_array().into_iter().flatten() {
            for port in c["ports"].as_array().into_iter().flatten() {
                let mut labels = serde_json::Map::new();
                let mut set = |k: String, v: &Value| {
                    labels.insert(k, json!(v.as_str().unwrap_or_default()));
                };
                set(
                    "__meta_kubernetes_namespace".into(),
                    &p["metadata"]["namespace"],
                );
                set("__meta_kubernetes_pod_name".into(), &p["metadata"]["name"]);
                set(
                    "__meta_kubernetes_pod_node_name".into(),
                    &p["spec"]["nodeName"],
                );
                set("__meta_kubernetes_pod_ip".into(), &json!(ip));
                set("__meta_kubernetes_pod_container_name".into(), &c["name"]);
                set(
                    "__meta_kubernetes_pod_container_port_name".into(),
                    &port["name"],
                );
                for (k, v) in p["metadata"]["labels"].as_object().into_iter().flatten() {
                    let k: String = k
                        .chars()
                        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                        .collect();
                    set(format!("__meta_kubernetes_pod_label_{k}"), v);
                }
                groups.push(
                    json!({"targets":[format!("{ip}:{}", port["containerPort"])],"labels":labels}),
                );
            }
        }
    }
    Ok(Value::Array(groups))
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// GET `path` of Prometheus' HTTP API (`query` URL-encoded): its `data`.
fn prom(port: u16, path: &str, query: Option<&str>) -> Result<Value> {
    let mut c = Command::new("curl");
    c.args(["-sS", "--max-time", "10", "-G"]);
    if let Some(q) = query {
        c.args(["--data-urlencode", &format!("query={q}")]);
    }
    let out = c.arg(format!("http://127.0.0.1:{port}{path}")).output()?;
    ensure!(
        out.status.success(),
        "curl {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{path}: {}", String::from_utf8_lossy(&out.stdout)))?;
    ensure!(v["status"] == "success", "{path}: {v}");
    Ok(v["data"].clone())
}

/// The value of an instant query returning one series (None: no series).
fn scalar(port: u16, q: &str) -> Result<Option<f64>> {
    let d = prom(port, "/api/v1/query", Some(q))?;
    let r = d["result"].as_array().context("result")?;
    ensure!(r.len() <= 1, "{q}: {} series: {d}", r.len());
    Ok(match r.first() {
        Some(s) => Some(s["value"][1].as_str().context("value")?.parse()?),
        None => None,
    })
}

/// Poll `f` every 500 ms until it returns `Some`, for `timeout`.
fn poll<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let t = Instant::now();
    let mut last = String::new();
    loop {
        match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if t.elapsed() > timeout {
            bail!("{what}: not after {timeout:?} {last}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn prometheus(node: &Node<'_>) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("plexus-prom-").tempdir()?;
    node.pod_objects()?;
    let _exporter = node.start_exporter()?;
    std::fs::write(
        dir.path().join("targets.json"),
        pod_targets(node.cp)?.to_string(),
    )?;
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, scrape_config(node, dir.path())?)?;
    let port = free_port()?;
    let args: Vec<String> = vec![
        format!("--config.file={}", config.display()),
        format!("--storage.tsdb.path={}", dir.path().join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--storage.tsdb.retention.time=1h".into(),
        "--log.level=info".into(),
    ];
    let log = dir.path().join("prometheus.log");
    let mut proc = Proc::spawn("prometheus", Path::new(PROMETHEUS), &args, &log)?;
    let res = scrape_and_query(node, port).with_context(|| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "prometheus log tail:\n{}",
            lines[lines.len().saturating_sub(15)..].join("\n")
        )
    });
    proc.stop(Duration::from_secs(10));
    res
}

fn scrape_and_query(node: &Node<'_>, port: u16) -> Result<()> {
    poll("prometheus ready", Duration::from_secs(30), || {
        Ok(prom(port, "/api/v1/status/buildinfo", None).ok())
    })?;
    // The rules load in a real Prometheus.
    let rules = prom(port, "/api/v1/rules", None)?;
    let n = rules["groups"][0]["rules"].as_array().map_or(0, Vec::len);
    ensure!(n == 7, "rules loaded: {rules}");
    // The three jobs find both pods; only the reader's token scrapes them.
    let targets = poll("targets scraped", Duration::from_secs(60), || {
        let d = prom(port, "/api/v1/targets", None)?;
        let t = d["activeTargets"].as_array().cloned().unwrap_or_default();
        let done = t.len() >= 6 && t.iter().all(|t| t["health"] != "unknown");
        Ok(done.then_some(t))
    })?;
    let target = |job: &str, mode: &str| -> Result<&Value> {
        targets
            .iter()
            .find(|t| t["labels"]["job"] == job && t["labels"]["plexus_mode"] == mode)
            .with_context(|| format!("no target of job {job} mode {mode}: {targets:?}"))
    };
    for (mode, port) in [("daemon", node.metrics_port), ("thin", node.thin_port)] {
        let main = target("plexus", mode)?;
        ensure!(main["health"] == "up", "plexus {mode}: {main}");
        ensure!(main["labels"]["node"] == NODE, "the relabelings: {main}");
        ensure!(
            main["scrapeUrl"] == format!("https://127.0.0.1:{port}/metrics").as_str(),
            "{main}"
        );
        for (job, code) in [("plexus-noauth", "401"), ("plexus-forbidden", "403")] {
            let t = target(job, mode)?;
            ensure!(
                t["health"] == "down" && t["lastError"].as_str().unwrap_or("").contains(code),
                "{job} ({mode}) should be refused with {code}: {t}"
            );
        }
    }
    // Pods: 3 attached, one with a NAD the node policy refuses.
    let mut netns = Vec::new();
    let mut pods = Vec::new();
    for i in 0..3 {
        let name = format!("mp{i}");
        let uid = node.pod(&name, "mv-a")?;
        let ns = Netns::new();
        let r = node.call("ADD", &name, &uid, &ns.path());
        ensure!(r.code == 0, "ADD {name}: {} {}", r.out, r.stderr);
        pods.push((name, uid));
        netns.push(ns);
    }
    let outside = tempfile::tempdir()?;
    node.nad_with("mv-out", "10.173.9.0/24", &outside.path().join("leases"))?;
    let uid = node.pod("mpol", "mv-out")?;
    let ns = Netns::new();
    let refused = node.call("ADD", "mpol", &uid, &ns.path());
    ensure!(
        refused.code != 0,
        "the NAD policy let mv-out through: {}",
        refused.out
    );
    ensure!(
        refused.out["msg"]
            .as_str()
            .unwrap_or("")
            .contains("NAD policy"),
        "{}",
        refused.out
    );
    // Thin mode: 2 pods and the refused NAD through `plexus` itself, counted by the exporter.
    let mut thin = Vec::new();
    for i in 0..2 {
        let name = format!("mt{i}");
        let uid = node.pod(&name, "mv-a")?;
        let ns = Netns::new();
        let r = node.call_thin("ADD", &name, &uid, &ns.path());
        ensure!(r.code == 0, "thin ADD {name}: {} {}", r.out, r.stderr);
        thin.push((name, uid, ns));
    }
    let tpol = node.pod("mtpol", "mv-out")?;
    let tns = Netns::new();
    let r = node.call_thin("ADD", "mtpol", &tpol, &tns.path());
    ensure!(
        r.code != 0,
        "thin: the NAD policy let mv-out through: {}",
        r.out
    );
    let ok_adds = poll("ADD ok counted", Duration::from_secs(30), || {
        let v = scalar(
            port,
            r#"sum(plexus_cni_requests_total{job="plexus",plexus_mode="daemon",verb="ADD",result="ok"})"#,
        )?;
        Ok(v.filter(|v| *v >= 3.0))
    })?;
    let errors = poll("the refused ADD counted", Duration::from_secs(30), || {
        let v = scalar(
            port,
            r#"sum(plexus_cni_requests_total{job="plexus",plexus_mode="daemon",verb="ADD",result="error"})"#,
        )?;
        Ok(v.filter(|v| *v >= 1.0))
    })?;
    let refusals = poll(
        "the NAD policy refusal counted",
        Duration::from_secs(30),
        || {
            let v = scalar(
                port,
                r#"sum(plexus_nad_policy_refusals_total{job="plexus",plexus_mode="daemon"})"#,
            )?;
            Ok(v.filter(|v| *v >= 1.0))
        },
    )?;
    let build = scalar(
        port,
        r#"sum(plexus_build_info{job="plexus",mode="daemon"})"#,
    )?;
    ensure!(build == Some(1.0), "plexus_build_info: {build:?}");
    let thin_ok = poll("thin ADDs counted", Duration::from_secs(30), || {
        let v = scalar(
            port,
            r#"sum(plexus_cni_requests_total{job="plexus",plexus_mode="thin",verb="ADD",result="ok"})"#,
        )?;
        Ok(v.filter(|v| *v >= 2.0))
    })?;
    let thin_refusals = poll("the thin refusal counted", Duration::from_secs(30), || {
        let v = scalar(
            port,
            r#"sum(plexus_nad_policy_refusals_total{job="plexus",plexus_mode="thin"})"#,
        )?;
        Ok(v.filter(|v| *v >= 1.0))
    })?;
    let build = scalar(port, r#"sum(plexus_build_info{job="plexus",mode="thin"})"#)?;
    ensure!(build == Some(1.0), "thin plexus_build_info: {build:?}");
    println!("    PromQL thin: ADD ok {thin_ok}, NAD policy refusals {thin_refusals}");
    let up = scalar(port, r#"max(up{job=~"plexus-noauth|plexus-forbidden"})"#)?;
    ensure!(up == Some(0.0), "up of the unauthenticated job: {up:?}");
    // The histograms the dashboard and the p99 alert read: every ADD observed.
    let observed = scalar(
        port,
        r#"sum(plexus_cni_request_duration_seconds_count{job="plexus",plexus_mode="daemon",verb="ADD"})"#,
    )?
    .unwrap_or(0.0);
    ensure!(observed >= 4.0, "ADD durations observed: {observed}");
    let phases = prom(
        port,
        "/api/v1/query",
        Some(
            r#"count by (phase) (plexus_cni_phase_duration_seconds_count{job="plexus",verb="ADD"})"#,
        ),
    )?;
    let phases: Vec<&str> = phases["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["metric"]["phase"].as_str())
        .collect();
    ensure!(!phases.is_empty(), "no ADD phase histogram");
    println!(
        "    PromQL: ADD ok {ok_adds}, ADD error {errors}, NAD policy refusals {refusals}, ADD durations observed {observed}, phases {phases:?}"
    );
    for ((name, uid), ns) in pods.iter().zip(&netns) {
        let r = node.call("DEL", name, uid, &ns.path());
        ensure!(r.code == 0, "DEL {name}: {}", r.out);
    }
    for (name, uid, ns) in &thin {
        let r = node.call_thin("DEL", name, uid, &ns.path());
        ensure!(r.code == 0, "thin DEL {name}: {}", r.out);
    }
    let r = node.call_thin("DEL", "mtpol", &tpol, &tns.path());
    ensure!(r.code == 0, "thin DEL mtpol: {}", r.out);
    let r = node.call("DEL", "mpol", &uid, &ns.path());
    ensure!(r.code == 0, "DEL mpol: {}", r.out);
    node.cp
        .kubectl(&["-n", NS, "delete", "net-attach-def", "mv-out"])?;
    Ok(())
}
