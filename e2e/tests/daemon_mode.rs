//! Daemon mode without an API server (static delegates): `plexus daemon` serving the calls the
//! `plexus` shim forwards over its Unix socket, in real network namespaces with the Debian
//! plugins. Socket permissions, the concurrency limit and bounded queue (a full queue is a
//! clear code 11 with nothing done), SIGTERM draining, a daemon killed mid-ADD, and the shim's
//! fallbacks (DEL in-process, ADD per `daemonUnavailable`). The runtime execs `plexus-shim`
//! (the config's `"type": "plexus-shim"`), which hands every fallback to `plexus` next to it;
//! the first test runs `plexus` as the shim too (a config of type `plexus` with
//! `daemonSocket`). The API side (watch caches, one
//! request per ADD) is in `daemon_real_api.rs`.

mod common;

use common::*;
use plexus_e2e::nad_policy_allowing;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `plexus daemon`, killed on drop.
struct Daemon {
    child: Child,
    socket: PathBuf,
    metrics: String,
}

impl Daemon {
    fn start(dir: &Path, extra: &[&str]) -> Daemon {
        let socket = dir.join("run/plexus.sock");
        let ready = dir.join("daemon.ready");
        let _ = std::fs::remove_file(&ready);
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
        while !ready.exists() {
            assert!(t.elapsed() < Duration::from_secs(10), "daemon not ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon {
            child,
            socket,
            metrics,
        }
    }

    /// The value of one metric line (`name{labels}`), 0 when absent.
    fn metric(&self, line_prefix: &str) -> f64 {
        let mut s = std::net::TcpStream::connect(&self.metrics).unwrap();
        use std::io::{Read, Write};
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    fn signal(&self, sig: &str) {
        Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
    }

    fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let t = Instant::now();
        while t.elapsed() < within {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Setup {
    dir: tempfile::TempDir,
    bridge: HostLink,
    /// The binary the runtime execs: `plexus-shim`, or `plexus` in its own shim role.
    shim: &'static str,
}

impl Setup {
    fn new() -> Setup {
        let s = Setup {
            dir: tempfile::tempdir().unwrap(),
            bridge: HostLink::bridge_name(),
            shim: "plexus-shim",
        };
        // A slow default network: the bridge plugin after a pause, logging when each ADD ran.
        let log = s.p("slow.log");
        s.script(
            "slow",
            &format!(
                "if [ \"$CNI_COMMAND\" = ADD ]; then echo \"start $(date +%s%N)\" >> {log}; sleep ${{SLOW:-0.4}}; fi\n\
                 out=$(/usr/lib/cni/bridge); rc=$?\n\
                 [ \"$CNI_COMMAND\" = ADD ] && echo \"end $(date +%s%N)\" >> {log}\n\
                 echo \"$out\"; exit $rc"
            ),
        );
        s
    }
    fn p(&self, s: &str) -> String {
        self.dir.path().join(s).display().to_string()
    }
    fn script(&self, name: &str, body: &str) {
        std::fs::create_dir_all(self.p("bin")).unwrap();
        let path = self.dir.path().join("bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    /// The shim config: static delegates, daemon mode.
    fn config(&self, plugin: &str, extra: Value) -> Value {
        let mut net = flannel_like(&self.bridge.0, 61, Path::new(&self.p("ipam")));
        net["plugins"][0]["type"] = json!(plugin);
        let mut c = json!({"cniVersion":"1.0.0","name":"plexus-daemon","type":self.shim,
            "daemonSocket": self.p("run/plexus.sock"),
            "cniDir":self.p("state"),"binDir":self.p("bin"),"logLevel":"debug","logToStderr":false,
            "logFile":self.p("plexus.log"),"delegates":[net],
            "nadPolicy":nad_policy_allowing(&[self.dir.path()])});
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }
    fn call(&self, command: &str, id: &str, ns: &str, cfg: &Value) -> Run {
        run(
            &bin(self.shim),
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
    fn leftovers(&self) -> Vec<String> {
        let mut v = files_under(&self.dir.path().join("state"));
        v.extend(
            files_under(&self.dir.path().join("ipam"))
                .into_iter()
                .filter(|f| !f.ends_with("lock")),
        );
        v
    }
    /// The largest number of ADDs of the slow plugin that ran at the same time.
    fn max_overlap(&self) -> usize {
        let text = std::fs::read_to_string(self.p("slow.log")).unwrap_or_default();
        let mut ev: Vec<(u128, i32)> = text
            .lines()
            .filter_map(|l| {
                let (k, t) = l.split_once(' ')?;
                Some((t.parse().ok()?, if k == "start" { 1 } else { -1 }))
            })
            .collect();
        ev.sort();
        let (mut cur, mut max) = (0i32, 0i32);
        for (_, d) in ev {
            cur += d;
            max = max.max(cur);
        }
        max as usize
    }
}

#[test]
fn add_and_del_are_served_by_the_daemon_on_a_private_socket() {
    for shim in ["plexus-shim", "plexus"] {
        served_by_the_daemon(Setup {
            shim,
            ..Setup::new()
        });
    }
}

fn served_by_the_daemon(s: Setup) {
    let d = Daemon::start(s.dir.path(), &[]);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.socket), 0o600, "socket mode");
    assert_eq!(
        mode(d.socket.parent().unwrap()),
        0o700,
        "socket directory mode"
    );
    let cfg = s.config("bridge", json!({}));
    let ns = Netns::new();
    let r = s.call("ADD", "d-1", &ns.path(), &cfg);
    let out = r.ok();
    assert_eq!(out["cniVersion"], "1.0.0");
    assert!(out["ips"][0]["address"]
        .as_str()
        .unwrap()
        .starts_with("10.244.61."));
    assert!(ns.links().contains(&"eth0".to_string()));
    assert_eq!(
        d.metric("plexus_cni_requests_total{verb=\"ADD\",result=\"ok\",code=\"0\"}"),
        1.0
    );
    s.call("CHECK", "d-1", &ns.path(), &cfg).ok();
    s.call("DEL", "d-1", &ns.path(), &cfg).ok();
    assert_eq!(
        d.metric("plexus_cni_requests_total{verb=\"DEL\",result=\"ok\",code=\"0\"}"),
        1.0
    );
    assert!(!ns.links().contains(&"eth0".to_string()));
    assert_eq!(s.leftovers(), Vec::<String>::new());
    // The shim forwarded: it wrote no log of its own for these calls, the daemon did the work.
    assert!(!Path::new(&s.p("plexus.log")).exists(), "{}", s.shim);
}

#[test]
fn plexus_shim_hands_thin_mode_and_version_to_plexus() {
    let s = Setup::new();
    let ns = Netns::new();
    // No daemonSocket: thin mode, in the plexus next to the shim (its log says so).
    let mut cfg = s.config("bridge", json!({}));
    cfg.as_object_mut().unwrap().remove("daemonSocket");
    let r = s.call("ADD", "thin-1", &ns.path(), &cfg);
    assert!(r.ok()["ips"][0]["address"]
        .as_str()
        .unwrap()
        .starts_with("10.244.61."));
    s.call("DEL", "thin-1", &ns.path(), &cfg).ok();
    assert!(ns.links().iter().all(|l| l == "lo"));
    assert_eq!(s.leftovers(), Vec::<String>::new());
    assert!(
        Path::new(&s.p("plexus.log")).exists(),
        "plexus ran the calls"
    );
    // VERSION is plexus' answer, whatever the config.
    let v = s.call("VERSION", "", "", &s.config("bridge", json!({})));
    assert!(v.ok()["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("1.1.0")));
    // A config plexus-shim cannot read is plexus' error to report, as a CNI error.
    let r = run(
        &bin("plexus-shim"),
        &Call {
            command: "ADD",
            container_id: "bad-1",
            netns: &ns.path(),
            ifname: "eth0",
            args: "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p",
        },
        &json!("not an object"),
        &[],
    );
    assert_eq!(r.err()["code"], 6, "{}", r.out);
}

#[test]
fn concurrency_is_limited_and_a_full_queue_is_code_11_with_nothing_done() {
    let s = Setup::new();
    let _d = Daemon::start(
        s.dir.path(),
        &["--max-concurrent", "2", "--queue-size", "2"],
    );
    let cfg = s.config("slow", json!({}));
    let nss: Vec<Netns> = (0..8).map(|_| Netns::new()).collect();
    let runs: Vec<(String, Run)> = std::thread::scope(|sc| {
        let hs: Vec<_> = nss
            .iter()
            .enumerate()
            .map(|(i, ns)| {
                let (s, cfg) = (&s, &cfg);
                sc.spawn(move || {
                    let id = format!("burst-{i}");
                    let r = s.call("ADD", &id, &ns.path(), cfg);
                    (id, r)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy: Vec<&(String, Run)> = runs.iter().filter(|(_, r)| r.code != 0).collect();
    let served = runs.len() - busy.len();
    assert!(served >= 4, "2 running + 2 queued at least: {served}");
    assert!(!busy.is_empty(), "8 calls at once must overflow 2 + 2");
    for (id, r) in &busy {
        assert_eq!(r.out["code"], 11, "{}", r.out);
        assert!(r.out["msg"].as_str().unwrap().contains("busy"), "{}", r.out);
        // Nothing half-done: no plan, no interface.
        assert!(!Path::new(&s.p(&format!("state/plans/{id}-eth0.json"))).exists());
    }
    assert!(
        s.max_overlap() <= 2,
        "at most 2 ADDs at once, saw {}",
        s.max_overlap()
    );
    for (i, ns) in nss.iter().enumerate() {
        s.call("DEL", &format!("burst-{i}"), &ns.path(), &cfg).ok();
        assert!(ns.links().iter().all(|l| l == "lo"), "{:?}", ns.links());
    }
    assert_eq!(s.leftovers(), Vec::<String>::new());
}

#[test]
fn daemon_absent_del_runs_in_process_and_add_follows_the_policy() {
    let s = Setup::new();
    let ns = Netns::new();
    // ADD while the daemon runs, then the daemon dies: the DEL runs in-process from the plan.
    let mut d = Daemon::start(s.dir.path(), &[]);
    let cfg = s.config("bridge", json!({}));
    s.call("ADD", "gone-1", &ns.path(), &cfg).ok();
    d.signal("KILL");
    d.wait_exit(Duration::from_secs(5));
    s.call("DEL", "gone-1", &ns.path(), &cfg).ok();
    assert!(ns.links().iter().all(|l| l == "lo"));
    assert_eq!(s.leftovers(), Vec::<String>::new());
    // ADD without a daemon and without a kubeconfig for a thin ADD: code 11, nothing done.
    let r = s.call("ADD", "gone-2", &ns.path(), &cfg);
    assert_eq!(r.err()["code"], 11, "{}", r.out);
    assert!(
        r.out["details"].as_str().unwrap().contains("kubeconfig"),
        "{}",
        r.out
    );
    let try_again = s.config(
        "bridge",
        json!({"daemonUnavailable":"tryAgain","kubeconfig":"/nonexistent"}),
    );
    let r = s.call("ADD", "gone-2", &ns.path(), &try_again);
    assert_eq!(r.err()["code"], 11, "{}", r.out);
    assert!(
        r.out["details"].as_str().unwrap().contains("tryAgain"),
        "{}",
        r.out
    );
    assert!(ns.links().iter().all(|l| l == "lo"));
    // STATUS in-process.
    s.call("STATUS", "", "", &cfg).ok();
}

#[test]
fn sigterm_drains_accepted_calls_then_the_shim_falls_back() {
    let s = Setup::new();
    let mut d = Daemon::start(s.dir.path(), &[]);
    let cfg = s.config("slow", json!({}));
    let ns = Netns::new();
    std::thread::scope(|sc| {
        let h = sc.spawn(|| s.call("ADD", "drain-1", &ns.path(), &cfg));
        // Let the ADD reach the slow plugin, then ask the daemon to stop.
        let t = Instant::now();
        while !Path::new(&s.p("slow.log")).exists() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        d.signal("TERM");
        h.join().unwrap().ok();
    });
    assert_eq!(
        d.wait_exit(Duration::from_secs(10)),
        Some(0),
        "daemon exits 0 after draining"
    );
    assert!(!d.socket.exists(), "the socket is gone");
    assert!(ns.links().contains(&"eth0".to_string()));
    s.call("DEL", "drain-1", &ns.path(), &cfg).ok();
    assert!(ns.links().iter().all(|l| l == "lo"));
    assert_eq!(s.leftovers(), Vec::<String>::new());
}

#[test]
fn a_daemon_killed_mid_add_is_cleaned_up_by_the_runtimes_del() {
    let s = Setup::new();
    let mut d = Daemon::start(s.dir.path(), &[]);
    let cfg = s.config("slow", json!({}));
    let ns = Netns::new();
    let r = std::thread::scope(|sc| {
        let h = sc.spawn(|| s.call("ADD", "crash-1", &ns.path(), &cfg));
        let t = Instant::now();
        while !Path::new(&s.p("slow.log")).exists() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        d.signal("KILL");
        h.join().unwrap()
    });
    assert_eq!(r.err()["code"], 11, "{}", r.out);
    assert!(
        r.out["msg"].as_str().unwrap().contains("did not answer"),
        "{}",
        r.out
    );
    d.wait_exit(Duration::from_secs(5));
    // The orphaned delegate may still be finishing; the runtime's DEL comes after.
    std::thread::sleep(Duration::from_millis(800));
    s.call("DEL", "crash-1", &ns.path(), &cfg).ok();
    assert!(ns.links().iter().all(|l| l == "lo"), "{:?}", ns.links());
    assert_eq!(s.leftovers(), Vec::<String>::new());
}

#[test]
fn concurrent_add_and_del_for_one_container_serialise() {
    let s = Setup::new();
    let _d = Daemon::start(s.dir.path(), &[]);
    let cfg = s.config("slow", json!({}));
    let ns = Netns::new();
    std::thread::scope(|sc| {
        let add = sc.spawn(|| s.call("ADD", "same-1", &ns.path(), &cfg));
        std::thread::sleep(Duration::from_millis(100));
        let del = sc.spawn(|| s.call("DEL", "same-1", &ns.path(), &cfg));
        add.join().unwrap();
        del.join().unwrap().ok();
    });
    // Whatever the order, a final DEL leaves nothing.
    s.call("DEL", "same-1", &ns.path(), &cfg).ok();
    assert!(ns.links().iter().all(|l| l == "lo"), "{:?}", ns.links());
    assert_eq!(s.leftovers(), Vec::<String>::new());
}
