//! `plexus-bench`: prints how long plexus takes, measured on this machine with the Debian
//! plugins in real network namespaces:
//! 1. static mode: plexus ADD/DEL of three networks vs. exec'ing the same three plugins directly;
//! 2. Kubernetes mode: ADD/DEL of a pod with N extra networks against the test API server, and
//!    the API requests each made;
//! 3. daemon mode vs thin mode: per-call overhead, the shim alone, and a simulated node reboot
//!    (110 pods × 3 networks at once) with the daemon's RSS.
//!
//! 4. `--real-api`: thin mode against a real kube-apiserver over TLS (`PLEXUS_K8S_BIN`), with the
//!    breakdown of plexus' own time per phase and its peak RSS ([`real_api`]).
//!
//! 5. `--peers`: side by side with Multus thin and thick on the real kube-apiserver, same
//!    configs, interleaved rounds ([`peers`]). With `--previous DIR` the previous release's
//!    build (`scripts/prev-build.sh --release`) runs in the same rounds, thin and daemon, and
//!    the ratio of this build to it is printed per verb and mode; `--previous DIR` alone runs
//!    only the two Plexus builds (the short form `scripts/test.sh` runs).
//!
//! 6. `--fleet N`: N daemon-mode nodes (Plexus daemon, Multus thick) and thin mode against one
//!    real kube-apiserver: steady state, churn, restart storm ([`fleet`]).
//!
//! 7. `--tls-resume`: full vs resumed TLS handshakes to a real kube-apiserver ([`tls_resume`]).
//!
//! 8. `--address-scale`: requests, bytes and time per ADD of a fixed address as the namespace
//!    grows to 5,000 pods ([`address_scale`]).
//!
//! 9. `--spawn-cost`: starting a delegate by fork (std's `Command` with a `pre_exec` hook)
//!    against plexus' clone(CLONE_VM|CLONE_VFORK) start, with plexus-sized memory
//!    ([`spawn_cost`]).
//!
//! Usage: `plexus-bench [--iterations N] [--plexus PATH] [--cni-bin DIR] [--daemon-only | --real-api | --peers [--previous DIR] [--thin-metrics] | --previous DIR [--thin-metrics] | --fleet NODES | --tls-resume | --address-scale | --spawn-cost]`
//! (as root).

mod address_scale;
mod fleet;
mod peers;
mod real_api;
mod spawn_cost;
mod tls_resume;

use plexus_e2e::{nad_policy_allowing, Access, TestApiServer, TestApiServerOptions};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn sh(args: &[&str]) {
    let _ = Command::new(args[0])
        .args(&args[1..])
        .stderr(Stdio::null())
        .status();
}

/// Run `cmd` with `env` added and `stdin` fed; its whole output.
fn run_with(mut cmd: Command, env: &[(&str, &str)], stdin: &Value) -> std::process::Output {
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // A program that exits without reading its stdin (/bin/true) closes the pipe early.
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.to_string().as_bytes());
    child.wait_with_output().unwrap()
}

fn exec(bin: &Path, env: &[(&str, &str)], stdin: &Value) -> (bool, String) {
    let out = run_with(Command::new(bin), env, stdin);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The CNI environment of one plexus call (eth0, as the kubelet sends it).
fn plexus_env<'a>(
    cmd: &'a str,
    cid: &'a str,
    netns: &'a str,
    cni_path: &'a str,
    args: &'a str,
) -> [(&'static str, &'a str); 6] {
    [
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", cid),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", cni_path),
        ("CNI_ARGS", args),
    ]
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

struct Env {
    netns: String,
    master: String,
    bridge: String,
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let id = std::process::id() % 10000;
        let e = Env {
            netns: format!("pxbench{id}"),
            master: format!("pxbm{id}"),
            bridge: format!("pxbb{id}"),
            dir: tempfile::tempdir().unwrap(),
        };
        sh(&["ip", "netns", "add", &e.netns]);
        sh(&[
            "ip",
            "link",
            "add",
            &e.master,
            "type",
            "veth",
            "peer",
            "name",
            &format!("pxbp{id}"),
        ]);
        sh(&["ip", "link", "set", &e.master, "up"]);
        e
    }
    fn path(&self, s: &str) -> PathBuf {
        self.dir.path().join(s)
    }
    fn delegates(&self) -> Vec<Value> {
        vec![
            json!({"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":self.bridge,"isGateway":true,
                   "ipam":{"type":"host-local","dataDir":self.path("ipam"),"ranges":[[{"subnet":"10.244.99.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}}),
            json!({"cniVersion":"1.0.0","name":"data","type":"macvlan","master":self.master,"mode":"bridge",
                   "ipam":{"type":"static","addresses":[{"address":"10.199.0.10/24"}]}}),
            json!({"cniVersion":"1.0.0","name":"ptpnet","type":"ptp","ipam":{"type":"host-local","dataDir":self.path("ipam"),"ranges":[[{"subnet":"10.198.0.0/24"}]]}}),
        ]
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        sh(&["ip", "netns", "del", &self.netns]);
        sh(&["ip", "link", "del", &self.master]);
        sh(&["ip", "link", "del", &self.bridge]);
    }
}

fn static_mode(plexus: &Path, cni_bin: &Path, n: usize) {
    let e = Env::new();
    let netns = format!("/run/netns/{}", e.netns);
    let cni_path = cni_bin.display().to_string();
    let (mut direct_add, mut direct_del, mut px_add, mut px_del) = (vec![], vec![], vec![], vec![]);
    let ifnames = ["eth0", "net1", "net2"];
    for i in 0..n {
        let cid = format!("bench-direct-{i}");
        let t = Instant::now();
        for (d, ifn) in e.delegates().iter().zip(ifnames) {
            let env = [
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", cid.as_str()),
                ("CNI_NETNS", netns.as_str()),
                ("CNI_IFNAME", ifn),
                ("CNI_PATH", cni_path.as_str()),
            ];
            let (ok, out) = exec(&cni_bin.join(d["type"].as_str().unwrap()), &env, d);
            assert!(ok, "direct ADD failed: {out}");
        }
        direct_add.push(t.elapsed());
        let t = Instant::now();
        for (d, ifn) in e.delegates().iter().zip(ifnames).rev() {
            let env = [
                ("CNI_COMMAND", "DEL"),
                ("CNI_CONTAINERID", cid.as_str()),
                ("CNI_NETNS", netns.as_str()),
                ("CNI_IFNAME", ifn),
                ("CNI_PATH", cni_path.as_str()),
            ];
            assert!(exec(&cni_bin.join(d["type"].as_str().unwrap()), &env, d).0);
        }
        direct_del.push(t.elapsed());
        let conf = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","cniDir":e.path("state"),"binDir":cni_path,
                          "logLevel":"error","logToStderr":false,"delegates":e.delegates(),
                          "nadPolicy":nad_policy_allowing(&[e.dir.path()])});
        let cid = format!("bench-plexus-{i}");
        let env = |cmd: &'static str| plexus_env(cmd, &cid, &netns, &cni_path, "");
        let t = Instant::now();
        let (ok, out) = exec(plexus, &env("ADD"), &conf);
        assert!(ok, "plexus ADD failed: {out}");
        px_add.push(t.elapsed());
        let t = Instant::now();
        assert!(exec(plexus, &env("DEL"), &conf).0);
        px_del.push(t.elapsed());
    }
    let (da, dd, pa, pd) = (
        median(direct_add),
        median(direct_del),
        median(px_add),
        median(px_del),
    );
    println!("static mode, 3 networks (bridge+host-local, macvlan+static, ptp+host-local), median of {n}:");
    println!(
        "  ADD  direct {da:7.2} ms   plexus {pa:7.2} ms   overhead {:+6.2} ms",
        pa - da
    );
    println!(
        "  DEL  direct {dd:7.2} ms   plexus {pd:7.2} ms   overhead {:+6.2} ms",
        pd - dd
    );
}

fn kube_mode(plexus: &Path, cni_bin: &Path, n: usize, tls: bool) {
    let e = Env::new();
    let api = TestApiServer::start(TestApiServerOptions {
        tls,
        ..TestApiServerOptions::default()
    })
    .unwrap();
    api.add_token("bench", Access::Full);
    api.write_kubeconfig(&e.path("kubeconfig"), "bench")
        .unwrap();
    let netns = format!("/run/netns/{}", e.netns);
    let cni_path = cni_bin.display().to_string();
    let d = e.delegates();
    api.put_nad("db", "data", &d[1].to_string(), &[]).unwrap();
    api.put_nad("db", "ptpnet", &d[2].to_string(), &[]).unwrap();
    let conf = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","cniDir":e.path("state"),"binDir":cni_path,
                      "kubeconfig":e.path("kubeconfig"),"logLevel":"error","logToStderr":false,"delegates":[d[0]],
                      "nadPolicy":nad_policy_allowing(&[e.dir.path()])});
    for (label, ann) in [
        ("0 extra networks", ""),
        ("2 extra networks", "data,ptpnet"),
    ] {
        let (mut adds, mut dels) = (vec![], vec![]);
        let (mut add_reqs, mut del_reqs) = (0, 0);
        for i in 0..n {
            let pod = format!("pg-{i}-{}", label.len());
            api.put_pod(json!({"metadata":{"name":pod,"namespace":"db","uid":format!("u-{i}"),
                "annotations":{"k8s.v1.cni.cncf.io/networks":ann}},"spec":{"containers":[{"name":"c","image":"x"}]}})).unwrap();
            let cid = format!("bench-k8s-{i}-{}", label.len());
            let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={pod};K8S_POD_UID=u-{i};K8S_POD_INFRA_CONTAINER_ID={cid}");
            let env = |cmd: &'static str| plexus_env(cmd, &cid, &netns, &cni_path, &args);
            api.clear_requests();
            let t = Instant::now();
            let (ok, out) = exec(plexus, &env("ADD"), &conf);
            assert!(ok, "plexus ADD failed: {out}");
            adds.push(t.elapsed());
            add_reqs = api.requests().len();
            api.clear_requests();
            let t = Instant::now();
            assert!(exec(plexus, &env("DEL"), &conf).0);
            dels.push(t.elapsed());
            del_reqs = api.requests().len();
            // The pod is gone, as after the kubelet's teardown: its network-status no longer
            // holds the static address the next pod gets (plexus' address guard).
            api.delete_pod("db", &pod);
        }
        let scheme = if tls { "https" } else { "http" };
        println!("kubernetes mode ({scheme}), pod with {label}, median of {n}:");
        println!(
            "  ADD {:7.2} ms ({add_reqs} API requests)   DEL {:7.2} ms ({del_reqs} API requests)",
            median(adds),
            median(dels)
        );
    }
}

/// A `plexus daemon` (static mode) for the benchmark, killed on drop.
struct BenchDaemon {
    child: std::process::Child,
}

impl BenchDaemon {
    fn start(plexus: &Path, dir: &Path) -> BenchDaemon {
        let ready = dir.join("daemon.ready");
        let child = Command::new(plexus)
            .arg("daemon")
            .args(["--socket", dir.join("run/plexus.sock").to_str().unwrap()])
            .args(["--readiness-file", ready.to_str().unwrap()])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("PLEXUS_LOG_LEVEL", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start plexus daemon");
        let t = Instant::now();
        while !ready.exists() {
            assert!(t.elapsed() < Duration::from_secs(10), "daemon not ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        BenchDaemon { child }
    }

    /// `VmRSS` and `VmHWM` (peak) of the daemon, KiB.
    fn rss(&self) -> (u64, u64) {
        plexus_e2e::procfs::rss_kib(self.child.id())
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Daemon mode vs thin mode (static delegates, no API): per-call overhead over the delegates
/// alone, the shim on its own, and a simulated node reboot (110 pods × 3 networks ADDed
/// concurrently, then DELed concurrently).
fn daemon_mode(plexus: &Path, cni_bin: &Path, n: usize) {
    let e = Env::new();
    let d = BenchDaemon::start(plexus, e.dir.path());
    let netns = format!("/run/netns/{}", e.netns);
    let cni_path = cni_bin.display().to_string();
    let thin = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","cniDir":e.path("state"),"binDir":cni_path,
                      "logLevel":"error","logToStderr":false,"delegates":e.delegates(),
                      "nadPolicy":nad_policy_allowing(&[e.dir.path()])});
    let mut daemon = thin.clone();
    daemon["daemonSocket"] = json!(e.path("run/plexus.sock"));
    let (mut ta, mut td, mut da, mut dd) = (vec![], vec![], vec![], vec![]);
    for i in 0..n {
        for (conf, add, del) in [(&thin, &mut ta, &mut td), (&daemon, &mut da, &mut dd)] {
            let cid = format!("bench-mode-{i}");
            let env = |cmd: &'static str| plexus_env(cmd, &cid, &netns, &cni_path, "");
            let t = Instant::now();
            let (ok, out) = exec(plexus, &env("ADD"), conf);
            assert!(ok, "ADD failed: {out}");
            add.push(t.elapsed());
            let t = Instant::now();
            assert!(exec(plexus, &env("DEL"), conf).0);
            del.push(t.elapsed());
        }
    }
    let (ta, td, da, dd) = (median(ta), median(td), median(da), median(dd));
    println!("daemon mode vs thin, static delegates (3 networks), median of {n}:");
    println!(
        "  ADD  thin {ta:7.2} ms   daemon {da:7.2} ms   daemon - thin {:+6.2} ms",
        da - ta
    );
    println!(
        "  DEL  thin {td:7.2} ms   daemon {dd:7.2} ms   daemon - thin {:+6.2} ms",
        dd - td
    );
    // The shim on its own: a DEL the daemon answers at once (already deleted).
    let env = plexus_env("DEL", "bench-mode-0", &netns, &cni_path, "");
    let mut shim = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        assert!(exec(plexus, &env, &daemon).0);
        shim.push(t.elapsed());
    }
    let mut measure = Command::new(std::env::current_exe().unwrap());
    measure.arg("--peak-rss-of").arg(plexus);
    let out = run_with(measure, &env, &daemon);
    println!(
        "  shim alone (process + socket round trip, a DEL answered at once): {:.2} ms median, peak RSS {} KiB",
        median(shim),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    burst(plexus, &e, &d, &thin, &daemon, cni_bin);
}

/// 110 pods × 3 networks at once, through `conf`; (failures, wall time) of ADD and of DEL.
fn burst_run(
    plexus: &Path,
    e: &Env,
    conf: &Value,
    cni_bin: &Path,
    pods: usize,
) -> [(usize, f64); 2] {
    let cni_path = cni_bin.display().to_string();
    let names: Vec<String> = (0..pods).map(|i| format!("{}b{i}", e.netns)).collect();
    for n in &names {
        sh(&["ip", "netns", "add", n]);
    }
    let mut out = [(0, 0.0); 2];
    for (k, cmd) in ["ADD", "DEL"].iter().enumerate() {
        let t = Instant::now();
        let failures = std::thread::scope(|sc| {
            let hs: Vec<_> = names
                .iter()
                .map(|n| {
                    let (cni_path, netns) = (&cni_path, format!("/run/netns/{n}"));
                    sc.spawn(move || {
                        let env = plexus_env(cmd, n, &netns, cni_path, "");
                        exec(plexus, &env, conf)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .filter(|(ok, _)| !ok)
                .count()
        });
        out[k] = (failures, t.elapsed().as_secs_f64() * 1000.0);
    }
    let leaked_links: usize = names
        .iter()
        .map(|n| {
            let o = Command::new("ip")
                .args(["-n", n, "-o", "link"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.contains(" lo:"))
                .count()
        })
        .sum();
    for n in &names {
        sh(&["ip", "netns", "del", n]);
    }
    assert_eq!(leaked_links, 0, "links left in pod namespaces");
    out
}

fn burst(plexus: &Path, e: &Env, d: &BenchDaemon, thin: &Value, daemon: &Value, cni_bin: &Path) {
    const PODS: usize = 110;
    // Distinct addresses per pod: host-local for every network.
    let with_ipam = |conf: &Value| {
        let mut c = conf.clone();
        c["delegates"][1]["ipam"] = json!({"type":"host-local","dataDir":e.path("ipam"),"ranges":[[{"subnet":"10.197.0.0/24"}]]});
        c
    };
    let (rest, _) = d.rss();
    println!("simulated node reboot: {PODS} pods × 3 networks ADDed at once, then DELed at once (daemon: maxConcurrent 8, queue 512):");
    println!("  daemon RSS at rest before the burst: {rest} KiB");
    for (name, conf) in [("thin", with_ipam(thin)), ("daemon", with_ipam(daemon))] {
        let [(af, aw), (df, dw)] = burst_run(plexus, e, &conf, cni_bin, PODS);
        let leaks = {
            let mut v: Vec<String> = Vec::new();
            for sub in ["state/plans", "state/results"] {
                if let Ok(rd) = std::fs::read_dir(e.path(sub)) {
                    v.extend(
                        rd.filter_map(Result::ok)
                            .map(|x| x.file_name().to_string_lossy().into_owned()),
                    );
                }
            }
            if let Ok(rd) = std::fs::read_dir(e.path("ipam")) {
                for net in rd.filter_map(Result::ok) {
                    if let Ok(leases) = std::fs::read_dir(net.path()) {
                        v.extend(
                            leases
                                .filter_map(Result::ok)
                                .map(|x| x.file_name().to_string_lossy().into_owned())
                                .filter(|f| {
                                    f.contains('.')
                                        && !f.starts_with("last_reserved")
                                        && f != "lock"
                                }),
                        );
                    }
                }
            }
            v.len()
        };
        println!("  {name:6}  ADD {af} failed, {aw:7.0} ms wall   DEL {df} failed, {dw:7.0} ms wall   leaks (plans, results, leases, links) {leaks}");
    }
    let (now, peak) = d.rss();
    println!("  daemon RSS after: {now} KiB, peak {peak} KiB (VmHWM, whole run)");
}

/// Peak RSS of plexus itself, in Kubernetes mode over HTTPS with two extra networks whose
/// delegates are a no-op shell plugin (so the figure is plexus', not a Go delegate's).
fn memory(plexus: &Path) {
    let e = Env::new();
    let bin = e.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let noop = bin.join("noop");
    std::fs::write(&noop, "#!/bin/sh\ncat >/dev/null\n[ \"$CNI_COMMAND\" = ADD ] && printf '{\"cniVersion\":\"1.0.0\",\"interfaces\":[{\"name\":\"%s\",\"sandbox\":\"%s\"}],\"ips\":[{\"address\":\"10.9.9.9/24\",\"interface\":0}]}' \"$CNI_IFNAME\" \"$CNI_NETNS\"\nexit 0\n").unwrap();
    std::fs::set_permissions(&noop, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let api = TestApiServer::start(TestApiServerOptions {
        tls: true,
        ..TestApiServerOptions::default()
    })
    .unwrap();
    api.add_token("bench", Access::Full);
    api.write_kubeconfig(&e.path("kubeconfig"), "bench")
        .unwrap();
    let nad = json!({"cniVersion":"1.0.0","type":"noop"}).to_string();
    api.put_nad("db", "a", &nad, &[]).unwrap();
    api.put_nad("db", "b", &nad, &[]).unwrap();
    api.put_pod(json!({"metadata":{"name":"mem","namespace":"db","uid":"u-mem","annotations":{"k8s.v1.cni.cncf.io/networks":"a,b"}},
        "spec":{"containers":[{"name":"c","image":"x"}]}})).unwrap();
    let conf = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","cniDir":e.path("state"),"binDir":bin,
        "kubeconfig":e.path("kubeconfig"),"logLevel":"error","logToStderr":false,
        "delegates":[{"cniVersion":"1.0.0","name":"noopnet","type":"noop"}],
        "nadPolicy":nad_policy_allowing(&[e.dir.path()])});
    let netns = format!("/run/netns/{}", e.netns);
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=mem;K8S_POD_UID=u-mem";
    let mut peaks = Vec::new();
    for (i, cmd) in ["ADD", "DEL"].iter().enumerate() {
        let env = plexus_env(cmd, "mem", &netns, "/usr/lib/cni", args);
        let mut measure = Command::new(std::env::current_exe().unwrap());
        measure.arg("--peak-rss-of").arg(plexus);
        let out = run_with(measure, &env, &conf);
        assert!(out.status.success(), "plexus {} failed", ["ADD", "DEL"][i]);
        peaks.push(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    println!("memory: plexus peak RSS, kubernetes mode over https, 2 extra networks: ADD {} KiB, DEL {} KiB", peaks[0], peaks[1]);
}

/// `--peak-rss-of BIN`: run BIN with this process' stdin/env, print its peak RSS (KiB) on stderr.
fn peak_rss_of(bin: &str) -> ! {
    let status = Command::new(bin).status().expect("run");
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    eprintln!("{}", usage.max_rss());
    std::process::exit(if status.success() { 0 } else { 1 });
}

fn main() {
    let mut n = 20usize;
    let mut daemon_only = false;
    let mut real_api_only = false;
    let mut peers_only = false;
    let mut previous: Option<PathBuf> = None;
    let mut thin_metrics = false;
    let mut fleet = None;
    let mut tls_resume = false;
    let mut address_scale = false;
    let mut spawn_cost = false;
    let mut plexus = None;
    let mut cni_bin = PathBuf::from("/usr/lib/cni");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--iterations" => n = it.next().and_then(|v| v.parse().ok()).unwrap_or(n),
            "--plexus" => plexus = it.next().map(PathBuf::from),
            "--cni-bin" => cni_bin = it.next().map(PathBuf::from).unwrap_or(cni_bin),
            "--peak-rss-of" => peak_rss_of(it.next().map(String::as_str).unwrap_or("plexus")),
            "--daemon-only" => daemon_only = true,
            "--real-api" => real_api_only = true,
            "--peers" => peers_only = true,
            "--previous" => previous = it.next().map(PathBuf::from),
            "--thin-metrics" => thin_metrics = true,
            "--tls-resume" => tls_resume = true,
            "--address-scale" => address_scale = true,
            "--spawn-cost" => spawn_cost = true,
            "--fleet" => fleet = it.next().and_then(|v| v.parse::<usize>().ok()),
            _ => {
                eprintln!("usage: plexus-bench [--iterations N] [--plexus PATH] [--cni-bin DIR] [--daemon-only | --real-api | --peers [--previous DIR] [--thin-metrics] | --previous DIR [--thin-metrics] | --fleet NODES | --tls-resume | --address-scale | --spawn-cost]");
                std::process::exit(2);
            }
        }
    }
    let plexus =
        plexus.unwrap_or_else(|| std::env::current_exe().unwrap().with_file_name("plexus"));
    println!(
        "plexus {} (binary {} bytes)",
        plexus.display(),
        std::fs::metadata(&plexus).map(|m| m.len()).unwrap_or(0)
    );
    if spawn_cost {
        if let Err(e) = spawn_cost::run(n) {
            eprintln!("plexus-bench --spawn-cost: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if address_scale {
        if let Err(e) = address_scale::run(&plexus, &cni_bin) {
            eprintln!("plexus-bench --address-scale: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if tls_resume {
        if let Err(e) = tls_resume::run(n) {
            eprintln!("plexus-bench --tls-resume: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(nodes) = fleet {
        if let Err(e) = fleet::run(&plexus, &cni_bin, nodes) {
            eprintln!("plexus-bench --fleet: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if peers_only || previous.is_some() {
        let o = peers::Options {
            plexus: &plexus,
            previous: previous.as_deref(),
            peers: peers_only,
            rounds: n,
            thin_metrics,
        };
        if let Err(e) = peers::run(&o, &cni_bin) {
            eprintln!("plexus-bench --peers/--previous: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if real_api_only {
        if let Err(e) = real_api::run(&plexus, &cni_bin, n) {
            eprintln!("plexus-bench --real-api: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if daemon_only {
        daemon_mode(&plexus, &cni_bin, n);
        return;
    }
    static_mode(&plexus, &cni_bin, n);
    kube_mode(&plexus, &cni_bin, n, false);
    kube_mode(&plexus, &cni_bin, n, true);
    memory(&plexus);
    daemon_mode(&plexus, &cni_bin, n);
}
