//! Daemon mode's metrics (docs/metrics.md): `plexus daemon` serving ADD and DEL forwarded by
//! the shim counts requests by verb, result and CNI code, the call's phases (the queue wait
//! included), each delegate exec by type and its failures, and says `mode="daemon"` in
//! `plexus_build_info`; no container ID, IP or path in any label.

mod common;

use common::*;
use plexus_e2e::{nad_policy_allowing, Access, TestApiServer, TestApiServerOptions};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    metrics: String,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        Self::start_with(dir, &[], true)
    }

    /// `ready`: wait for the readiness file (caches synced); else for the socket.
    fn start_with(dir: &Path, extra: &[&str], ready_wait: bool) -> Daemon {
        let socket = dir.join("run/plexus.sock");
        let ready = dir.join("daemon.ready");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let metrics = format!("127.0.0.1:{port}");
        let child = Command::new(bin("plexus"))
            .arg("daemon")
            .args(["--socket", socket.to_str().unwrap()])
            .args(["--readiness-file", ready.to_str().unwrap()])
            .args(["--metrics-address", &metrics])
            .args(extra)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("PLEXUS_LOG_LEVEL", "debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap())
            .spawn()
            .expect("start plexus daemon");
        let t = Instant::now();
        let wait_for = if ready_wait { ready } else { socket };
        while !wait_for.exists() {
            assert!(t.elapsed() < Duration::from_secs(10), "daemon not ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { child, metrics }
    }

    fn text(&self) -> String {
        let mut s = std::net::TcpStream::connect(&self.metrics).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    }
}

impl Drop for Daemon {
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

struct Setup {
    dir: tempfile::TempDir,
    bridge: HostLink,
}

impl Setup {
    fn p(&self, s: &str) -> PathBuf {
        self.dir.path().join(s)
    }
    /// A shim config (`plexus` in its shim role) whose default network is `plugin`.
    fn config(&self, plugin: &str) -> Value {
        let mut net = flannel_like(&self.bridge.0, 63, &self.p("ipam"));
        net["plugins"][0]["type"] = json!(plugin);
        json!({"cniVersion":"1.0.0","name":"plexus-daemon","type":"plexus",
            "daemonSocket": self.p("run/plexus.sock"),
            "cniDir":self.p("state"),"binDir":self.p("bin"),"logLevel":"debug","logToStderr":false,
            "logFile":self.p("plexus.log"),"delegates":[net],
            "nadPolicy":nad_policy_allowing(&[self.dir.path()])})
    }
    fn call(&self, command: &str, id: &str, ns: &str, cfg: &Value) -> Run {
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: id,
                netns: ns,
                ifname: "eth0",
                args: "",
            },
            cfg,
            &[],
        )
    }
}

#[test]
fn the_daemon_counts_calls_phases_and_delegates_by_type_and_code() {
    let s = Setup {
        dir: tempfile::tempdir().unwrap(),
        bridge: HostLink::bridge_name(),
    };
    // A default network that fails its ADD with code 100 and a message (its DEL succeeds).
    std::fs::create_dir_all(s.p("bin")).unwrap();
    let broken = s.p("bin/broken");
    std::fs::write(
        &broken,
        "#!/bin/sh\nif [ \"$CNI_COMMAND\" = ADD ]; then echo '{\"cniVersion\":\"1.0.0\",\"code\":100,\"msg\":\"broken on purpose\"}'; exit 1; fi\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = Daemon::start(s.dir.path());
    let ns = Netns::new();
    let ok = s
        .call("ADD", "ctr-metrics-one", &ns.path(), &s.config("bridge"))
        .ok()
        .clone();
    let ip = ok["ips"][0]["address"].as_str().unwrap().to_string();
    s.call("DEL", "ctr-metrics-one", &ns.path(), &s.config("bridge"))
        .ok();
    let failed = s.call("ADD", "ctr-metrics-two", &ns.path(), &s.config("broken"));
    let code = failed.err()["code"].as_u64().unwrap();
    s.call("DEL", "ctr-metrics-two", &ns.path(), &s.config("broken"))
        .ok();

    let text = d.text();
    let v = |series: &str| value(&text, series);
    assert_eq!(
        v(r#"plexus_cni_requests_total{verb="ADD",result="ok",code="0"}"#),
        1.0,
        "{text}"
    );
    assert_eq!(
        v(&format!(
            r#"plexus_cni_requests_total{{verb="ADD",result="error",code="{code}"}}"#
        )),
        1.0,
        "{text}"
    );
    assert_eq!(
        v(r#"plexus_cni_requests_total{verb="DEL",result="ok",code="0"}"#),
        2.0
    );
    assert_eq!(
        v(r#"plexus_cni_request_duration_seconds_count{verb="ADD"}"#),
        2.0
    );
    // Phases of the daemon's calls: the queue wait, the config, the delegates.
    for phase in ["queue", "config", "delegates"] {
        let series =
            format!(r#"plexus_cni_phase_duration_seconds_count{{verb="ADD",phase="{phase}"}}"#);
        assert_eq!(v(&series), 2.0, "{series}\n{text}");
    }
    assert_eq!(
        v(r#"plexus_delegate_duration_seconds_count{verb="ADD",type="bridge"}"#),
        1.0,
        "{text}"
    );
    assert_eq!(
        v(r#"plexus_delegate_duration_seconds_count{verb="ADD",type="broken"}"#),
        1.0
    );
    assert_eq!(
        v(r#"plexus_delegate_errors_total{verb="ADD",type="broken"}"#),
        1.0,
        "{text}"
    );
    assert_eq!(
        v(r#"plexus_delegate_errors_total{verb="ADD",type="bridge"}"#),
        0.0
    );
    assert!(v(r#"plexus_delegate_duration_seconds_count{verb="DEL",type="bridge"}"#) >= 1.0);
    assert!(text.contains(r#"mode="daemon"} 1"#), "{text}");
    assert!(
        text.contains("# TYPE plexus_status_writes_pending gauge"),
        "{text}"
    );
    // Bounded cardinality.
    let bare_ip = ip.split('/').next().unwrap();
    let dir = s.dir.path().display().to_string();
    for leak in ["ctr-metrics", bare_ip, "10.244.63.", dir.as_str(), "cbr0"] {
        assert!(!text.contains(leak), "{leak} in\n{text}");
    }
}

/// The daemon's API requests (its `kube::Client` under the shared request code) are counted by
/// verb, resource and code: an ADD's network-status PATCH (written in the background) and its
/// event; the namespace and pod name appear nowhere.
#[test]
fn the_daemon_counts_its_api_requests_by_verb_resource_and_code() {
    let api = TestApiServer::start(TestApiServerOptions::default()).unwrap();
    api.add_token("node-token", Access::Full);
    let s = Setup {
        dir: tempfile::tempdir().unwrap(),
        bridge: HostLink::bridge_name(),
    };
    let kubeconfig = s.p("kubeconfig");
    api.write_kubeconfig(&kubeconfig, "node-token").unwrap();
    api.put_namespace("dmetricsns").unwrap();
    api.put_pod(
        json!({"metadata":{"name":"dmetrics-pod","namespace":"dmetricsns","uid":"uid-dm",
        "annotations":{}},"spec":{"nodeName":"dm-node","containers":[{"name":"c","image":"x"}]}}),
    )
    .unwrap();
    // The test API server has no watch: the daemon reads the pod itself after its sync wait.
    let d = Daemon::start_with(
        s.dir.path(),
        &[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--node",
            "dm-node",
        ],
        false,
    );
    let ns = Netns::new();
    let args = "K8S_POD_INFRA_CONTAINER_ID=cid-dm;K8S_POD_UID=uid-dm;IgnoreUnknown=1;K8S_POD_NAMESPACE=dmetricsns;K8S_POD_NAME=dmetrics-pod";
    let r = run(
        &bin("plexus"),
        &Call {
            command: "ADD",
            container_id: "cid-dm",
            netns: &ns.path(),
            ifname: "eth0",
            args,
        },
        &s.config("bridge"),
        &[],
    );
    r.ok();
    let patch = r#"plexus_api_requests_total{verb="patch",resource="pods",code="200"}"#;
    let t = Instant::now();
    let mut text = d.text();
    while value(&text, patch) < 1.0 {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "no status PATCH counted:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
        text = d.text();
    }
    assert!(
        value(
            &text,
            r#"plexus_api_requests_total{verb="create",resource="events",code="201"}"#
        ) >= 1.0
            || value(
                &text,
                r#"plexus_api_requests_total{verb="create",resource="events",code="200"}"#
            ) >= 1.0,
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"plexus_cni_requests_total{verb="ADD",result="ok",code="0"}"#
        ),
        1.0
    );
    for leak in ["dmetrics", "cid-dm", "uid-dm"] {
        assert!(!text.contains(leak), "{leak} in\n{text}");
    }
    run(
        &bin("plexus"),
        &Call {
            command: "DEL",
            container_id: "cid-dm",
            netns: &ns.path(),
            ifname: "eth0",
            args,
        },
        &s.config("bridge"),
        &[],
    )
    .ok();
}
