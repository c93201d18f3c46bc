//! Thin mode's metrics (docs/metrics.md): the real `plexus` binary's ADD and DEL against the
//! test API server append their outcomes to `<cniDir>/metrics/outcomes.jsonl`, and the
//! exporter (`plexus-daemon reconcile --metrics-address`) serves them as the metric families
//! daemon mode exports: requests by verb, result and code, phases, delegates by type, API
//! requests by verb/resource/code, NAD-policy refusals by class; no pod name, IP or NAD name
//! in any label. Also the cost of the recording on a thin ADD (`--ignored`, prints figures).

mod common;

use common::*;
use plexus_e2e::{nad_policy_allowing, Access, TestApiServer, TestApiServerOptions};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";

struct Node {
    api: TestApiServer,
    dir: tempfile::TempDir,
    bridge: HostLink,
    master: HostLink,
}

impl Node {
    fn new() -> Node {
        let api = TestApiServer::start(TestApiServerOptions::default()).unwrap();
        api.add_token("node-token", Access::Full);
        let dir = tempfile::tempdir().unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"), "node-token")
            .unwrap();
        api.put_namespace("metricsns").unwrap();
        Node {
            api,
            dir,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn config(&self) -> Value {
        json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus",
            "kubeconfig": self.path("kubeconfig"), "cniDir": self.path("state"), "binDir": CNI_BIN,
            "confDir": self.path("confdir"), "logLevel":"debug", "logFile": self.path("plexus.log"),
            "logToStderr": false,
            "delegates":[flannel_like(&self.bridge.0, 37, &self.path("ipam"))],
            "nadPolicy": nad_policy_allowing(&[self.dir.path()])})
    }

    fn nad(&self, name: &str, data_dir: &str, subnet: &str) {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":self.master.0,"mode":"bridge",
            "ipam":{"type":"host-local","dataDir":data_dir,"ranges":[[{"subnet":subnet}]]}});
        self.api
            .put_nad("metricsns", name, &cfg.to_string(), &[])
            .unwrap();
    }

    fn pod(&self, name: &str, networks: &str) -> String {
        let uid = format!("uid-{name}");
        let annotations = if networks.is_empty() {
            json!({})
        } else {
            json!({NETWORKS: networks})
        };
        self.api
            .put_pod(
                json!({"metadata":{"name":name,"namespace":"metricsns","uid":uid,
                "annotations":annotations},"spec":{"containers":[{"name":"c","image":"x"}]}}),
            )
            .unwrap();
        uid
    }

    fn call(&self, command: &str, pod: &str, uid: &str, netns: &str) -> Run {
        let args = format!(
            "K8S_POD_INFRA_CONTAINER_ID=cid-{pod};K8S_POD_UID={uid};IgnoreUnknown=1;K8S_POD_NAMESPACE=metricsns;K8S_POD_NAME={pod}"
        );
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: &format!("cid-{pod}"),
                netns,
                ifname: "eth0",
                args: &args,
            },
            &self.config(),
            &[],
        )
    }
}

/// `plexus-daemon reconcile --every … --metrics-address 127.0.0.1:<port>`, killed on drop.
struct Exporter {
    child: Child,
    address: String,
}

impl Exporter {
    fn start(node: &Node) -> Exporter {
        let config = node.path("plexus.conf");
        std::fs::write(&config, node.config().to_string()).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("127.0.0.1:{port}");
        let child = Command::new(bin("plexus-daemon"))
            .arg("reconcile")
            .args(["--config", config.to_str().unwrap()])
            .args(["--every", "3600"])
            .args(["--metrics-address", &address, "--metrics-insecure-http"])
            .args([
                "--metrics-dir",
                node.path("state/metrics").to_str().unwrap(),
            ])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(node.path("exporter.log")).unwrap())
            .spawn()
            .expect("start the exporter");
        let e = Exporter { child, address };
        let t = Instant::now();
        while e.get("/healthz").is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "exporter not serving: {}",
                std::fs::read_to_string(node.path("exporter.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            node.path("state/metrics").is_dir(),
            "the exporter makes the dir"
        );
        e
    }

    fn get(&self, path: &str) -> Option<String> {
        let mut s = std::net::TcpStream::connect(&self.address).ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        text.starts_with("HTTP/1.").then_some(text)
    }

    fn metrics(&self) -> String {
        self.get("/metrics").expect("GET /metrics")
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the series `series` (name and labels exactly), 0 when absent.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .filter(|r| r.starts_with(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

#[test]
fn thin_calls_are_counted_by_the_exporter_without_pod_names_or_ips() {
    let node = Node::new();
    let exporter = Exporter::start(&node);
    node.nad(
        "metrics-nad-ok",
        node.path("ipam").to_str().unwrap(),
        "10.137.1.0/24",
    );
    // A host-local dataDir outside the policy's directories: refused (class path_data).
    node.nad(
        "metrics-nad-refused",
        "/var/lib/plexus-evil",
        "10.137.2.0/24",
    );
    let uid_a = node.pod("metrics-pod-a", "metrics-nad-ok");
    let uid_b = node.pod("metrics-pod-b", "metrics-nad-refused");
    let ns_a = Netns::new();
    let ns_b = Netns::new();
    let ok = node
        .call("ADD", "metrics-pod-a", &uid_a, &ns_a.path())
        .ok()
        .clone();
    let ip = ok["ips"][0]["address"].as_str().unwrap().to_string();
    let refused = node.call("ADD", "metrics-pod-b", &uid_b, &ns_b.path());
    let code = refused.err()["code"].as_u64().unwrap();
    assert!(
        refused.out["msg"].as_str().unwrap_or("").contains("policy")
            || refused.out["details"]
                .as_str()
                .unwrap_or("")
                .contains("plexus-evil"),
        "{}",
        refused.out
    );
    node.call("DEL", "metrics-pod-a", &uid_a, &ns_a.path()).ok();
    node.call("DEL", "metrics-pod-b", &uid_b, &ns_b.path()).ok();
    let lines = std::fs::read_to_string(node.path("state/metrics/outcomes.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 4, "one line per call:\n{lines}");

    let add_ok = r#"plexus_cni_requests_total{verb="ADD",result="ok",code="0"}"#;
    let t = Instant::now();
    let mut text = exporter.metrics();
    while value(
        &text,
        r#"plexus_cni_requests_total{verb="DEL",result="ok",code="0"}"#,
    ) < 2.0
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "not ingested:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
        text = exporter.metrics();
    }
    assert_eq!(value(&text, add_ok), 1.0, "{text}");
    let add_refused =
        format!(r#"plexus_cni_requests_total{{verb="ADD",result="error",code="{code}"}}"#);
    assert_eq!(value(&text, &add_refused), 1.0, "{text}");
    assert_eq!(
        value(
            &text,
            r#"plexus_nad_policy_refusals_total{class="path_data"}"#
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"plexus_cni_request_duration_seconds_count{verb="ADD"}"#
        ),
        2.0
    );
    assert_eq!(
        value(
            &text,
            r#"plexus_cni_phase_duration_seconds_count{verb="ADD",phase="config"}"#
        ),
        2.0,
        "{text}"
    );
    // The ok ADD ran bridge (default network) and macvlan; the refused one ran none.
    for ty in ["bridge", "macvlan"] {
        let s = format!(r#"plexus_delegate_duration_seconds_count{{verb="ADD",type="{ty}"}}"#);
        assert_eq!(value(&text, &s), 1.0, "{s}\n{text}");
    }
    // Each ADD read its pod and NAD; the ok one wrote its network-status.
    assert!(
        value(
            &text,
            r#"plexus_api_requests_total{verb="get",resource="pods",code="200"}"#
        ) >= 2.0,
        "{text}"
    );
    assert!(
        value(
            &text,
            r#"plexus_api_requests_total{verb="get",resource="network-attachment-definitions",code="200"}"#
        ) >= 2.0,
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"plexus_api_requests_total{verb="patch",resource="pods",code="200"}"#
        ),
        1.0,
        "{text}"
    );
    assert!(text.contains(r#"mode="thin"} 1"#), "{text}");
    // Bounded cardinality: no pod, namespace, NAD, container or address in the text.
    let bare_ip = ip.split('/').next().unwrap();
    for leak in [
        "metrics-pod-a",
        "metrics-pod-b",
        "metricsns",
        "metrics-nad-ok",
        "metrics-nad-refused",
        "cid-metrics",
        bare_ip,
        "10.137.",
    ] {
        assert!(!text.contains(leak), "{leak} in\n{text}");
    }
}

/// The cost of the recording on a thin ADD: 400 ADD + DEL pairs, every other one with the
/// metrics dir (recording) and the others without (alternating, so load changes on the machine
/// hit both alike); prints the medians. And the write path alone.
#[test]
#[ignore = "a measurement: cargo test -p plexus-e2e --test metrics_record -- --ignored --nocapture"]
fn cost_of_recording_on_a_thin_add() {
    let node = Node::new();
    let uid = node.pod("cost-pod", "");
    let ns = Netns::new();
    let metrics = node.path("state/metrics");
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut line = Vec::new();
    for i in 0..400 {
        let on = i % 2 == 0;
        if on {
            std::fs::create_dir_all(&metrics).unwrap();
        } else if metrics.exists() {
            line = std::fs::read(metrics.join("outcomes.jsonl")).unwrap();
            std::fs::remove_dir_all(&metrics).unwrap();
        }
        let t = Instant::now();
        node.call("ADD", "cost-pod", &uid, &ns.path()).ok();
        let add = t.elapsed();
        node.call("DEL", "cost-pod", &uid, &ns.path()).ok();
        if on { &mut with } else { &mut without }.push(add);
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (w, wo) = (median(&mut with), median(&mut without));
    println!(
        "thin ADD median over {} calls each: {:.3} ms with recording, {:.3} ms without ({:+.3} ms)",
        with.len(),
        w.as_secs_f64() * 1000.0,
        wo.as_secs_f64() * 1000.0,
        (w.as_secs_f64() - wo.as_secs_f64()) * 1000.0
    );
    // The write path alone, as a call runs it (open O_APPEND, fstat, one write, close), with
    // the line an ADD wrote.
    std::fs::create_dir_all(&metrics).unwrap();
    let one = line.split(|b| *b == b'\n').next().unwrap().to_vec();
    let o: plexus_meta::outcome::Outcome = serde_json::from_slice(&one).unwrap();
    assert_eq!(o.verb, "ADD");
    let t = Instant::now();
    for _ in 0..200 {
        assert_eq!(plexus_meta::outcome::append(&metrics, &o), Ok(true));
    }
    println!(
        "outcome write path: {:.1} us per call (200 appends of a {}-byte line, debug build)",
        t.elapsed().as_secs_f64() * 1e6 / 200.0,
        one.len() + 1
    );
}
