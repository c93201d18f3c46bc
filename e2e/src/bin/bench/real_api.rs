//! `plexus-bench --real-api`: thin-mode ADD and DEL against a real kube-apiserver over TLS
//! (`PLEXUS_K8S_BIN`), one macvlan NAD on top of a bridge default network, next to the same
//! two delegates run directly; then where plexus' own time went, read from the per-call
//! `phases` it logs ([`plexus_delegates::timing`]), and its peak RSS.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::{ControlPlane, K8sBins};
use serde_json::{json, Value};

use crate::{exec, median, plexus_env, run_with, Env};

/// The phases plexus logs, in the order of an ADD (DEL logs a subset), and whether each adds
/// to the call's time: a thin ADD sends the status PATCH and the event together, so those two
/// overlap inside `status_and_event`.
const PHASES: &[(&str, bool)] = &[
    ("config", true),
    ("lock", true),
    ("plugin_lookup", true),
    ("netns", true),
    ("client_build", true),
    ("pod_get", true),
    ("nad_get", true),
    ("plan_save", true),
    ("delegates", true),
    ("result_cache", true),
    ("status_and_event", true),
    ("status_patch", false),
    ("event", false),
];

/// One call's closing log line: in-process milliseconds and its phases.
#[derive(Debug, Default)]
pub(crate) struct Done {
    pub(crate) elapsed_ms: f64,
    peak_rss_kib: u64,
    pub(crate) phases: BTreeMap<String, f64>,
}

/// The `ADD done` / `DEL done` lines of a plexus log file, in order.
pub(crate) fn parse_log(text: &str, verb: &str) -> Vec<Done> {
    let marker = format!("{verb} done");
    text.lines()
        .filter(|l| l.contains(&marker))
        .map(|l| {
            let mut d = Done::default();
            if let Some(v) = l.split("elapsed_ms=").nth(1) {
                d.elapsed_ms = v
                    .split_whitespace()
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0.0);
            }
            if let Some(v) = l.split("peak_rss_kib=").nth(1) {
                d.peak_rss_kib = v
                    .split_whitespace()
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
            }
            // `phases` is the line's last field (quoted or not, depending on the formatter).
            if let Some(v) = l.split_once("phases=").map(|(_, v)| v.trim_matches('"')) {
                for pair in v.split_whitespace() {
                    if let Some((k, ms)) = pair.split_once('=') {
                        d.phases.insert(k.to_string(), ms.parse().unwrap_or(0.0));
                    }
                }
            }
            d
        })
        .collect()
}

fn median_f(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Print the table of one verb: wall-clock overhead and its breakdown.
fn print_breakdown(verb: &str, wall: &[Duration], direct: &[Duration], done: &[Done]) {
    let wall_ms = median(wall.to_vec());
    let direct_ms = median(direct.to_vec());
    let in_process = median_f(done.iter().map(|d| d.elapsed_ms).collect());
    // plexus' own time per call: its wall time minus the time its delegates ran (robust to the
    // delegates' own spread, which the difference of two medians is not).
    let own = median_f(
        wall.iter()
            .zip(done)
            .map(|(w, d)| {
                w.as_secs_f64() * 1000.0 - d.phases.get("delegates").copied().unwrap_or(0.0)
            })
            .collect(),
    );
    println!(
        "  {verb}: plexus {wall_ms:.2} ms, delegates alone {direct_ms:.2} ms, overhead {:+.2} ms; plexus' own time (wall minus its delegates) {own:.2} ms (medians of {})",
        wall_ms - direct_ms,
        wall.len()
    );
    println!(
        "    {:<34} {:>8.2} ms",
        "exec, start-up and exit (outside main)",
        wall_ms - in_process
    );
    let mut accounted = 0.0;
    let overlapped = done
        .iter()
        .any(|d| d.phases.contains_key("status_and_event"));
    for (name, adds) in PHASES {
        let v: Vec<f64> = done
            .iter()
            .map(|d| d.phases.get(*name).copied().unwrap_or(0.0))
            .collect();
        if v.iter().all(|x| *x == 0.0) {
            continue;
        }
        let m = median_f(v);
        if *adds || !overlapped {
            accounted += m;
            println!("    {name:<34} {m:>8.2} ms");
        } else {
            println!("      {:<32} {m:>8.2} ms  (inside status_and_event)", name);
        }
    }
    println!(
        "    {:<34} {:>8.2} ms",
        "rest of main (plan, checks, locks)",
        in_process - accounted
    );
}

/// Figures of one configuration: wall times and the calls' log lines.
struct Round {
    direct_add: Vec<Duration>,
    direct_del: Vec<Duration>,
    add: Vec<Duration>,
    del: Vec<Duration>,
}

/// The cluster side of the benchmark: a control plane with the CRD, plexus' RBAC and token,
/// the `db/data` macvlan NAD, and the node's namespace and links.
struct Bench {
    cp: ControlPlane,
    e: Env,
    cni_bin: std::path::PathBuf,
    pods: usize,
}

impl Bench {
    fn start(cni_bin: &Path) -> Result<Bench> {
        let Some(bins) = K8sBins::from_env()? else {
            bail!("--real-api needs PLEXUS_K8S_BIN (the kube-apiserver and etcd binaries)");
        };
        let cp = ControlPlane::start(&bins)?;
        cp.apply_deploy(&["nad-crd.yaml", "rbac.yaml"])?;
        cp.create_namespace("db")?;
        let e = Env::new();
        let token = cp.create_token("kube-system", "plexus")?;
        cp.write_kubeconfig(&e.path("kubeconfig"), &token)?;
        let mut nad_conf = e.delegates()[1].clone();
        nad_conf.as_object_mut().unwrap().remove("name");
        cp.apply(
            &json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
                "metadata":{"name":"data","namespace":"db"},"spec":{"config":nad_conf.to_string()}})
            .to_string(),
        )?;
        Ok(Bench {
            cp,
            e,
            cni_bin: cni_bin.to_path_buf(),
            pods: 0,
        })
    }

    /// A new pod asking for `db/data`: (name, uid).
    fn pod(&mut self) -> Result<(String, String)> {
        self.pods += 1;
        let pod = format!("bench-{}", self.pods);
        self.cp.apply(
            &json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":pod,"namespace":"db",
                "annotations":{"k8s.v1.cni.cncf.io/networks":"data"}},
                "spec":{"nodeName":"bench-node","containers":[{"name":"c","image":"pause"}]}})
            .to_string(),
        )?;
        let uid = self
            .cp
            .get_json(&format!("/api/v1/namespaces/db/pods/{pod}"))?["metadata"]["uid"]
            .as_str()
            .context("pod uid")?
            .to_string();
        Ok((pod, uid))
    }

    /// plexus' config: the bridge default network, logging to `log` at info level; with
    /// `runtime_annotations`, the pod's annotations as containerd passes them when the config
    /// declares `io.kubernetes.cri.pod-annotations` (the installer does).
    fn config(&self, log: &Path, runtime_annotations: bool) -> Value {
        let e = &self.e;
        let mut conf = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","cniDir":e.path("state"),
            "binDir":self.cni_bin,"kubeconfig":e.path("kubeconfig"),"logLevel":"info","logFile":log,
            "logToStderr":false,"delegates":[e.delegates()[0]],
            "nadPolicy":nad_policy_allowing(&[e.dir.path()])});
        if runtime_annotations {
            conf["runtimeConfig"] = json!({"io.kubernetes.cri.pod-annotations":
                {"k8s.v1.cni.cncf.io/networks":"data"}});
        }
        conf
    }

    /// `n` timed rounds (after one warm-up) of: the two delegates directly, then plexus ADD
    /// and DEL; with `strace`, one more ADD under strace when `PLEXUS_BENCH_STRACE` is set.
    fn rounds(&mut self, plexus: &Path, conf: &Value, n: usize, strace: bool) -> Result<Round> {
        let mut r = Round {
            direct_add: vec![],
            direct_del: vec![],
            add: vec![],
            del: vec![],
        };
        let netns = format!("/run/netns/{}", self.e.netns);
        let cni_path = self.cni_bin.display().to_string();
        let d = self.e.delegates();
        for i in 0..=n {
            let (pod, uid) = self.pod()?;
            let cid = format!("bench-direct-{}", self.pods);
            let direct = |cmd: &str, order: &[(&Value, &str)]| -> Result<Duration> {
                let t = Instant::now();
                for (conf, ifn) in order {
                    let env = [
                        ("CNI_COMMAND", cmd),
                        ("CNI_CONTAINERID", cid.as_str()),
                        ("CNI_NETNS", netns.as_str()),
                        ("CNI_IFNAME", ifn),
                        ("CNI_PATH", cni_path.as_str()),
                    ];
                    let bin = self.cni_bin.join(conf["type"].as_str().unwrap());
                    let (ok, out) = exec(&bin, &env, conf);
                    if !ok {
                        bail!("direct {cmd} of {} failed: {out}", conf["type"]);
                    }
                }
                Ok(t.elapsed())
            };
            let add = direct("ADD", &[(&d[0], "eth0"), (&d[1], "net1")])?;
            let del = direct("DEL", &[(&d[1], "net1"), (&d[0], "eth0")])?;
            let cid = format!("bench-plexus-{}", self.pods);
            let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={pod};K8S_POD_UID={uid};K8S_POD_INFRA_CONTAINER_ID={cid}");
            let env = |cmd: &'static str| plexus_env(cmd, &cid, &netns, &cni_path, &args);
            let call = |cmd: &'static str| -> Result<Duration> {
                let t = Instant::now();
                let (ok, out) = exec(plexus, &env(cmd), conf);
                let took = t.elapsed();
                if !ok {
                    bail!("plexus {cmd} failed: {out}");
                }
                Ok(took)
            };
            let (padd, pdel) = (call("ADD")?, call("DEL")?);
            if i > 0 {
                r.direct_add.push(add);
                r.direct_del.push(del);
                r.add.push(padd);
                r.del.push(pdel);
            }
        }
        // `PLEXUS_BENCH_STRACE=FILE`: one more ADD under `strace -f -ttt -T -o FILE` (analysis), then
        // its DEL into `FILE.del`.
        if let Some(out) = std::env::var_os("PLEXUS_BENCH_STRACE").filter(|_| strace) {
            let (pod, uid) = self.pod()?;
            let cid = format!("bench-strace-{}", self.pods);
            let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={pod};K8S_POD_UID={uid};K8S_POD_INFRA_CONTAINER_ID={cid}");
            let mut cmd = Command::new("strace");
            cmd.args(["-f", "-ttt", "-T", "-o"]).arg(&out).arg(plexus);
            let add = run_with(
                cmd,
                &plexus_env("ADD", &cid, &netns, &cni_path, &args),
                conf,
            );
            if !add.status.success() {
                bail!("plexus ADD under strace failed");
            }
            // Then its DEL, into FILE.del.
            let mut del_out = out.clone();
            del_out.push(".del");
            let mut cmd = Command::new("strace");
            cmd.args(["-f", "-ttt", "-T", "-o"])
                .arg(del_out)
                .arg(plexus);
            let del = run_with(
                cmd,
                &plexus_env("DEL", &cid, &netns, &cni_path, &args),
                conf,
            );
            if !del.status.success() {
                bail!("plexus DEL under strace failed");
            }
        }
        Ok(r)
    }
}

/// Run the real-API benchmark with `n` timed rounds per configuration.
pub fn run(plexus: &Path, cni_bin: &Path, n: usize) -> Result<()> {
    let mut b = Bench::start(cni_bin)?;
    println!(
        "real kube-apiserver over TLS (ECDSA P-256 serving cert), bridge default + 1 macvlan NAD, thin mode:"
    );
    for (label, runtime_annotations) in [
        ("pod read from the API (GET pod)", false),
        (
            "pod annotations from the runtime (io.kubernetes.cri.pod-annotations, no GET pod)",
            true,
        ),
    ] {
        let log = b.e.path(&format!("plexus-{runtime_annotations}.log"));
        let conf = b.config(&log, runtime_annotations);
        let r = b.rounds(plexus, &conf, n, !runtime_annotations)?;
        let text = std::fs::read_to_string(&log)?;
        // The warm-up's lines first, then one ADD and one DEL per timed round, then RSS runs.
        let lines =
            |verb| -> Vec<Done> { parse_log(&text, verb).into_iter().skip(1).take(n).collect() };
        println!(" {label}:");
        print_breakdown("ADD", &r.add, &r.direct_add, &lines("ADD"));
        print_breakdown("DEL", &r.del, &r.direct_del, &lines("DEL"));
        let peak = |v: &[Done]| v.iter().map(|d| d.peak_rss_kib).max().unwrap_or(0);
        println!(
            "  peak RSS of plexus itself (VmHWM, max of {n}): ADD {} KiB, DEL {} KiB",
            peak(&lines("ADD")),
            peak(&lines("DEL"))
        );
    }
    // Process start alone: a VERSION call does nothing but parse its stdin; /bin/true is the
    // floor of this harness (spawn, pipes, wait) and a Go plugin's VERSION the reference.
    let version = |bin: &Path| -> f64 {
        let mut v = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            let (ok, _) = exec(
                bin,
                &[("CNI_COMMAND", "VERSION")],
                &json!({"cniVersion":"1.0.0"}),
            );
            if ok {
                v.push(t.elapsed());
            }
        }
        if v.is_empty() {
            f64::NAN
        } else {
            median(v)
        }
    };
    // The handshake floor: a fresh TCP + TLS connection and a trivial GET, with plain rustls.
    let mut fresh = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        if matches!(b.cp.get("/version"), Ok((200, _))) {
            fresh.push(t.elapsed());
        }
    }
    println!(
        " a fresh TCP+TLS connection and GET /version (rustls alone, as the admin): {:.2} ms",
        median(fresh)
    );
    // What the apiserver itself spent per request kind (all users, the whole run).
    let means = b.cp.mean_request_durations()?;
    let show = |verb: &str, res: &str, sub: &str| {
        means
            .get(&plexus_e2e::realk8s::RequestKey::new(verb, res, sub))
            .map_or("-".to_string(), |s| format!("{:.2} ms", s * 1000.0))
    };
    println!(
        " apiserver's own time per request (mean): GET pod {}, GET NAD {}, PATCH pods/status {}, POST event {}",
        show("GET", "pods", ""),
        show("GET", "network-attachment-definitions", ""),
        show("PATCH", "pods", "status"),
        show("POST", "events", "")
    );
    println!(
        " exec, start-up and exit of a VERSION call: plexus {:.2} ms, {} {:.2} ms, /bin/true {:.2} ms",
        version(plexus),
        cni_bin.join("bridge").display(),
        version(&cni_bin.join("bridge")),
        version(Path::new("/bin/true"))
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_parse_into_elapsed_and_phases() {
        let text = "2026-11-23T16:00:00Z  INFO plexus_meta::plugin: ADD done container=\"c\" ifname=\"eth0\" ok=true elapsed_ms=12.5 peak_rss_kib=6144 phases=\"config=0.10 pod_get=3.25\"\nunrelated\n";
        let got = parse_log(text, "ADD");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].elapsed_ms, 12.5);
        assert_eq!(got[0].peak_rss_kib, 6144);
        assert_eq!(got[0].phases["pod_get"], 3.25);
        assert_eq!(got[0].phases.len(), 2);
        assert!(parse_log(text, "DEL").is_empty());
        let bare = "x DEL done ok=true elapsed_ms=3 phases=config=0.5 delegates=1.25";
        let got = parse_log(bare, "DEL");
        assert_eq!(got[0].phases["delegates"], 1.25);
        assert_eq!(got[0].elapsed_ms, 3.0);
    }
}
