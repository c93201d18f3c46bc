//! Opt-in benchmark (the host writes `bench.json`, see `bench_host`): the bank NAD's ADD and DEL
//! on the same real igbvf VF through plexus' release `sriov` and through sriov-cni v2.10, same
//! config (only the binary differs), plus `sriov` with the NAD minus `mtu` (sriov-cni ignores
//! `mtu`: that series does the same work as sriov-cni), rounds rotating which goes first. Prints the
//! figures as `note` lines (never a timed assertion); asserts that every call succeeds, that
//! every DEL leaves the VF exactly as before (else the figures mean nothing), and that the two
//! differ in the resulting VF state and result JSON only where the docs say they do.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{Netns, Run, CNI_BIN};
use crate::guest::{Case, T};
use crate::vf::{link_summary, nad};

/// The case's name (the host also turns the benchmark on for a `PLEXUS_VM_CASES` filter naming
/// it).
pub const NAME: &str = "bench_sriov_vs_sriov_cni";

/// The benchmark when the host asked for it (`$PLEXUS_VM_OUT/bench.json` exists), else nothing.
pub fn cases() -> Vec<Case> {
    if config().is_some() {
        vec![(NAME, bench)]
    } else {
        Vec::new()
    }
}

fn config() -> Option<Value> {
    let out = PathBuf::from(std::env::var("PLEXUS_VM_OUT").ok()?);
    let text = std::fs::read_to_string(out.join(crate::bench_host::FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// One plugin under test.
#[derive(Clone)]
struct Plugin {
    label: &'static str,
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// One measured run: what it printed, its wall time, the peak RSS of its process tree
/// (`wait4` rusage `ru_maxrss`: the plugin and the children it reaped, i.e. the IPAM plugin)
/// and, when polled, the plugin process' own `VmHWM` (the last value seen before it exited: a
/// lower bound of its peak).
struct Measured {
    run: Run,
    wall: Duration,
    tree_kib: u64,
    own_kib: Option<u64>,
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Runs `bin` as a CNI plugin in the root netns (the PF's), `CNI_PATH=/usr/lib/cni`.
fn exec(p: &Plugin, cmd: &str, cid: &str, netns: &str, conf: &Value, poll: bool) -> Measured {
    let mut c = Command::new(&p.bin);
    c.args(&p.args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "net1")
        .env("CNI_ARGS", "")
        .env("CNI_PATH", CNI_BIN)
        .envs(p.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", p.bin.display()));
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(conf.to_string().as_bytes())
        .expect("write stdin");
    drop(stdin);
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let done = AtomicBool::new(false);
    let own = AtomicU64::new(0);
    let (out, err, status, rusage) = std::thread::scope(|s| {
        let ho = s.spawn(move || {
            let mut b = Vec::new();
            let _ = so.read_to_end(&mut b);
            b
        });
        let he = s.spawn(move || {
            let mut b = Vec::new();
            let _ = se.read_to_end(&mut b);
            b
        });
        let poller = poll.then(|| {
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    if let Some(k) = vm_hwm_kib(pid) {
                        own.fetch_max(k, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_micros(500));
                }
            })
        });
        // Wait for the exit without reaping (the poller's pid stays this process'), then reap
        // with wait4 for the rusage.
        let npid = nix::unistd::Pid::from_raw(pid as i32);
        let flags = nix::sys::wait::WaitPidFlag::WEXITED | nix::sys::wait::WaitPidFlag::WNOWAIT;
        let _ = nix::sys::wait::waitid(nix::sys::wait::Id::Pid(npid), flags);
        done.store(true, Ordering::Relaxed);
        if let Some(h) = poller {
            let _ = h.join();
        }
        let (status, rusage) = reap(pid);
        (
            ho.join().expect("stdout"),
            he.join().expect("stderr"),
            status,
            rusage,
        )
    });
    let wall = started.elapsed();
    // The child is reaped: std must not wait for it again (it would not; Child has no Drop).
    std::mem::forget(child);
    let code = if nix::libc::WIFEXITED(status) {
        nix::libc::WEXITSTATUS(status)
    } else {
        -1
    };
    let text = String::from_utf8_lossy(&out);
    let run = Run {
        code,
        out: if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| json!({ "raw": text }))
        },
        stderr: String::from_utf8_lossy(&err).into_owned(),
    };
    Measured {
        run,
        wall,
        tree_kib: u64::try_from(rusage.ru_maxrss).unwrap_or(0),
        own_kib: poll.then(|| own.load(Ordering::Relaxed)),
    }
}

/// Reaps child `pid` with `wait4`: its wait status and rusage (`ru_maxrss` in KiB covers it and
/// the children it reaped). nix has no `wait4`.
#[allow(unsafe_code)]
fn reap(pid: u32) -> (i32, nix::libc::rusage) {
    let mut status = 0;
    // SAFETY: wait4 on our own child with pointers to live, zero-initialised plain structs.
    unsafe {
        let mut ru: nix::libc::rusage = std::mem::zeroed();
        nix::libc::wait4(pid as nix::libc::pid_t, &mut status, 0, &mut ru);
        (status, ru)
    }
}

/// What an ADD leaves behind, for the fidelity comparison: the result, the pod's `net1`, its
/// addresses and routes, and the PF's view of the VF.
fn observe(t: &T<'_>, pod: &Netns, result: &Value) -> Value {
    json!({
        "result": result,
        "pod": {
            "net1": link_summary(Some(&pod.name), "net1"),
            "addrs": pod.addrs("net1"),
            "routes": pod.routes().lines().map(str::trim).collect::<Vec<_>>(),
            "links": pod.links(),
        },
        "pf": t.pf.vfinfo(0),
    })
}

/// Paths (`a.b[0].c`) where two JSON values differ, with both sides.
fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let n = Value::Null;
                diff(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&n),
                    y.get(k).unwrap_or(&n),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff(&format!("{path}[{i}]"), p, q, out);
            }
        }
        _ if a != b => out.push(format!("{}: sriov {a} / sriov-cni {b}", &path[1..])),
        _ => {}
    }
}

/// The differences docs/compatibility.md lists for this NAD (sriov first, sriov-cni second):
/// sriov-cni has no MTU setting (its `mtu` key is overwritten) and never sets the CNI 1.1
/// `pciID`.
const EXPECTED: &[&str] = &[
    "pod.net1.mtu: sriov 9000 / sriov-cni 1500",
    "result.interfaces[0].mtu: sriov 9000 / sriov-cni 1500",
];

fn pct(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn spread(v: &[Duration]) -> (f64, String) {
    let mut s = v.to_vec();
    s.sort();
    let med = pct(&s, 0.5);
    (
        med,
        format!(
            "median {med:.0} ms (p10 {:.0}, p90 {:.0})",
            pct(&s, 0.1),
            pct(&s, 0.9)
        ),
    )
}

fn kib_range(v: &[u64]) -> String {
    let mib = |k: u64| format!("{:.1}", k as f64 / 1024.0);
    let lo = mib(v.iter().min().copied().unwrap_or(0));
    let hi = mib(v.iter().max().copied().unwrap_or(0));
    if lo == hi {
        format!("{lo} MiB")
    } else {
        format!("{lo}–{hi} MiB")
    }
}

/// One measured series: a plugin with a config.
struct Series<'a> {
    label: &'static str,
    plugin: &'a Plugin,
    conf: Value,
}

/// ADD then DEL of `s` in a fresh pod netns; asserts both succeed and the DEL restores the VF.
/// Returns the ADD's observation (see [`observe`]) and both measurements.
fn add_del(
    t: &T<'_>,
    s: &Series<'_>,
    cid: &str,
    before: &crate::vf::VfSnap,
    poll: bool,
) -> (Value, Measured, Measured) {
    let pod = Netns::new();
    let a = exec(s.plugin, "ADD", cid, &pod.path(), &s.conf, poll);
    let mut seen = observe(t, &pod, a.run.ok());
    // Each pod has its own netns path: the same on both sides for the comparison.
    if seen["result"]["interfaces"][0]["sandbox"] == pod.path().as_str() {
        seen["result"]["interfaces"][0]["sandbox"] = json!("<pod netns>");
    }
    let d = exec(s.plugin, "DEL", cid, &pod.path(), &s.conf, poll);
    d.run.ok();
    assert_eq!(
        t.pf.snap(0),
        *before,
        "{} {cid}: DEL left the VF changed",
        s.label
    );
    assert_eq!(pod.links(), vec!["lo"], "{} {cid}", s.label);
    (seen, a, d)
}

/// One ADD + DEL of each series under `strace -f -tt -T` into `$PLEXUS_VM_OUT/strace-*.txt`
/// (diagnosis of where the time goes; strace slows Go's threads far more than sriov).
fn strace(t: &T<'_>, series: &[Series<'_>], before: &crate::vf::VfSnap) {
    let out = std::env::var("PLEXUS_VM_OUT").unwrap_or_default();
    for (i, s) in series.iter().enumerate() {
        let pod = Netns::new();
        for cmd in ["ADD", "DEL"] {
            let traced = Plugin {
                bin: PathBuf::from("/usr/bin/strace"),
                args: vec![
                    "-f".into(),
                    "-tt".into(),
                    "-T".into(),
                    "-o".into(),
                    format!("{out}/strace-{i}-{}-{cmd}.txt", s.plugin.label),
                    s.plugin.bin.to_string_lossy().into_owned(),
                ],
                ..s.plugin.clone()
            };
            exec(&traced, cmd, "bench-strace", &pod.path(), &s.conf, false)
                .run
                .ok();
        }
        assert_eq!(
            t.pf.snap(0),
            *before,
            "{}: DEL under strace left the VF changed",
            s.label
        );
    }
}

fn bench(t: &T<'_>) {
    let cfg = config().expect("bench.json");
    let rounds = cfg["rounds"].as_u64().unwrap_or(10) as usize;
    let path = |k: &str| PathBuf::from(cfg[k].as_str().expect("bench.json path"));
    let state = t.dir.state();
    let sriov = Plugin {
        label: "sriov",
        bin: path("sriov"),
        args: Vec::new(),
        env: vec![(
            "PLEXUS_SRIOV_STATE_DIR".into(),
            state.to_string_lossy().into_owned(),
        )],
    };
    let cni = Plugin {
        label: "sriov-cni",
        bin: path("sriovCni"),
        args: Vec::new(),
        env: Vec::new(),
    };
    let pci = t.vf(0);
    let before = t.pf.snap(0);
    let bank = nad(&pci, crate::cases::bank_settings());
    let mut no_mtu = bank.clone();
    no_mtu.as_object_mut().expect("nad").remove("mtu");
    // sriov-cni has no MTU setting (it ignores the key), so the bank NAD asks sriov for work
    // sriov-cni skips (a VF reset for each MTU change on igbvf): the third series is sriov
    // with the same NAD minus `mtu`, the same work as sriov-cni.
    let series = [
        Series {
            label: "sriov",
            plugin: &sriov,
            conf: bank.clone(),
        },
        Series {
            label: "sriov-cni",
            plugin: &cni,
            conf: bank.clone(),
        },
        Series {
            label: "sriov without mtu",
            plugin: &sriov,
            conf: no_mtu,
        },
    ];
    if cfg["strace"] == true {
        strace(t, &series, &before);
    }

    // Round 0 (not timed; it also brings the binaries into the page cache): the fidelity
    // comparison and each plugin's own peak RSS (polled).
    let mut seen = Vec::new();
    let mut own = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let (o, a, d) = add_del(t, s, &format!("bench-{i}-0"), &before, true);
        seen.push(o);
        own.push((a.own_kib.unwrap_or(0), d.own_kib.unwrap_or(0)));
    }
    let mut with_mtu = Vec::new();
    diff("", &seen[0], &seen[1], &mut with_mtu);
    let mut without_mtu = Vec::new();
    diff("", &seen[2], &seen[1], &mut without_mtu);
    t.note(format!(
        "bench fidelity, bank NAD on {pci}: sriov {}\n  sriov-cni {}\n  differences: {with_mtu:?}; \
         without mtu: {without_mtu:?}",
        seen[0], seen[1]
    ));

    // The static IPAM plugin alone: both plugins run it, so it bounds the process tree's peak.
    let ipam = Plugin {
        label: "static",
        bin: PathBuf::from(CNI_BIN).join("static"),
        args: Vec::new(),
        env: Vec::new(),
    };
    let pod = Netns::new();
    let ipam_kib = exec(&ipam, "ADD", "bench-ipam", &pod.path(), &bank, false);
    ipam_kib.run.ok();
    exec(&ipam, "DEL", "bench-ipam", &pod.path(), &bank, false)
        .run
        .ok();
    drop(pod);

    // Timed rounds, rotating which series goes first.
    let n = series.len();
    let mut add = vec![Vec::new(); n];
    let mut del = vec![Vec::new(); n];
    let mut tree = vec![Vec::new(); n];
    for r in 0..rounds {
        for k in 0..n {
            let i = (r + k) % n;
            let (_, a, d) = add_del(
                t,
                &series[i],
                &format!("bench-{i}-{}", r + 1),
                &before,
                false,
            );
            add[i].push(a.wall);
            del[i].push(d.wall);
            tree[i].extend([a.tree_kib, d.tree_kib]);
        }
    }
    let a: Vec<_> = add.iter().map(|v| spread(v)).collect();
    let d: Vec<_> = del.iter().map(|v| spread(v)).collect();
    t.note(format!(
        "bench sriov (release) vs sriov-cni v2.10 on the same igbvf VF {pci} in QEMU/TCG (software \
         CPU: not host speed), bank NAD (VLAN 100, QoS 3, static IP, MAC, spoofchk, trust, \
         max_tx_rate, MTU 9000), {rounds} rounds rotating which goes first, every DEL checked to \
         restore the VF:\n  ADD: sriov {}; sriov-cni {}; sriov without mtu {}; sriov-cni/sriov \
         {:.2}x, sriov-cni/sriov without mtu {:.2}x\n  DEL: sriov {}; sriov-cni {}; sriov without \
         mtu {}; sriov-cni/sriov {:.2}x, sriov-cni/sriov without mtu {:.2}x\n  (sriov-cni ignores \
         `mtu`: with it, sriov also sets MTU 9000 on ADD and 1500 on DEL, each a VF reset on igbvf)",
        a[0].1,
        a[1].1,
        a[2].1,
        a[1].0 / a[0].0,
        a[1].0 / a[2].0,
        d[0].1,
        d[1].1,
        d[2].1,
        d[1].0 / d[0].0,
        d[1].0 / d[2].0,
    ));
    t.note(format!(
        "bench peak RSS: process tree (wait4 ru_maxrss: the plugin and its static IPAM child) \
         sriov {}, sriov-cni {}; the static IPAM plugin alone {}; the plugin's own VmHWM \
         (polled, ADD/DEL) sriov {}/{}, sriov-cni {}/{}",
        kib_range(&tree[0]),
        kib_range(&tree[1]),
        kib_range(&[ipam_kib.tree_kib]),
        kib_range(&[own[0].0]),
        kib_range(&[own[0].1]),
        kib_range(&[own[1].0]),
        kib_range(&[own[1].1]),
    ));
    // After the figures: a new difference fails the case, but the figures are printed first.
    // pciID: sriov sets it (CNI 1.1 field), sriov-cni never does.
    for (what, diffs, expected) in [
        ("bank NAD", with_mtu, EXPECTED),
        ("without mtu", without_mtu, &[][..]),
    ] {
        let (pci_diffs, rest): (Vec<String>, Vec<String>) = diffs
            .into_iter()
            .partition(|d| d.starts_with("result.interfaces[0].pciID:"));
        assert_eq!(pci_diffs.len(), 1, "{what}: pciID: {pci_diffs:?}");
        assert_eq!(
            rest, expected,
            "{what}: differences between sriov and sriov-cni"
        );
    }
}
