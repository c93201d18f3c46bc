//! Inside the VM: set up the PF and two VFs, run every case (a panic fails the case), check after
//! each case that both VFs are exactly as before it (PF side, driver, netdev in the root netns),
//! and write one JSON line per case to `$PLEXUS_VM_OUT/results.jsonl`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::json;

use crate::vf::{sh, CaseDir, Pf, VfSnap};

/// Number of VFs the runner creates.
pub const NUM_VFS: u32 = 2;

/// What a case gets: the PF and a fresh directory.
pub struct T<'a> {
    /// The PF.
    pub pf: &'a Pf,
    /// Per-case directory (state dir, plexus files).
    pub dir: CaseDir,
    out: &'a Out,
}

impl T<'_> {
    /// PCI address of VF `i`.
    pub fn vf(&self, i: u32) -> String {
        self.pf.vf_pci(i).expect("VF exists")
    }
    /// Records a measurement line for the host's report.
    pub fn note(&self, text: String) {
        println!("vm-runner: {text}");
        self.out.line(&json!({ "note": text }));
    }
}

/// A case: name and body.
pub type Case = (&'static str, fn(&T<'_>));

struct Out(Mutex<std::fs::File>);

impl Out {
    fn line(&self, v: &serde_json::Value) {
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(f, "{v}");
        let _ = f.sync_all();
    }
}

static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

fn snaps(pf: &Pf) -> Vec<VfSnap> {
    (0..NUM_VFS).map(|i| pf.snap(i)).collect()
}

fn setup(pf: &Pf) -> Result<(), String> {
    sh(&["ip", "link", "set", "lo", "up"])?;
    // The PF must not transmit: QEMU's igb then reports a Tx unit hang now and again, and igb
    // resets the adapter, dropping the link for a while (rate changes fail meanwhile). IPv6
    // (DAD, MLD, router solicitations) is all it would send.
    crate::vf::write_sys(
        &format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", pf.name),
        "1",
    )?;
    // The far end first: its netdev leaves the root netns before the VFs get theirs, so the
    // VFs are named as with one PF (eth1, eth2) and a VF rebound later takes a name after them.
    setup_far_end()?;
    pf.set_up(true)?;
    pf.create_vfs(NUM_VFS)?;
    pf.wait_rate_ready()
}

/// The netns holding the far end of the PF's wire, and the far end's names in it.
pub const WIRE_NS: &str = "plexus-wire";
/// The second igb PF, renamed, in [`WIRE_NS`].
pub const WIRE_DEV: &str = "wire0";
/// Its VLAN 100 interface's address (what a VLAN 100 pod reaches across the wire).
pub const WIRE_ADDR: &str = "10.56.217.50";

/// The second igb PF as the far end of the first one's wire: in its own netns, a VLAN 100
/// interface with an address, and a tc flower filter on its ingress counting frames tagged
/// VLAN 100 with priority 3 (the bank NAD's QoS). Nothing when QEMU gave no second PF.
fn setup_far_end() -> Result<(), String> {
    let Some(w) = Pf::far_end() else {
        return Ok(());
    };
    crate::vf::write_sys(
        &format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", w.name),
        "1",
    )?;
    sh(&["ip", "netns", "add", WIRE_NS])?;
    sh(&[
        "ip", "link", "set", "dev", &w.name, "name", WIRE_DEV, "netns", WIRE_NS,
    ])?;
    let vlan = format!("{WIRE_DEV}.100");
    for a in [
        vec!["link", "set", "lo", "up"],
        vec!["link", "set", WIRE_DEV, "up"],
        vec![
            "link", "add", "link", WIRE_DEV, "name", &vlan, "type", "vlan", "id", "100",
        ],
        vec!["addr", "add", "10.56.217.50/24", "dev", &vlan],
        vec!["link", "set", &vlan, "up"],
    ] {
        sh(&[&["ip", "-n", WIRE_NS], a.as_slice()].concat())?;
    }
    for a in [
        vec!["qdisc", "add", "dev", WIRE_DEV, "ingress"],
        vec![
            "filter",
            "add",
            "dev",
            WIRE_DEV,
            "ingress",
            "protocol",
            "802.1Q",
            "flower",
            "vlan_id",
            "100",
            "vlan_prio",
            "3",
            "action",
            "pass",
        ],
    ] {
        sh(&[&["ip", "netns", "exec", WIRE_NS, "tc"], a.as_slice()].concat())?;
    }
    Ok(())
}

/// Frames the far end has received tagged VLAN 100 with priority 3 (its tc flower counter).
pub fn wire_frames_100_prio_3() -> u64 {
    let out = sh(&[
        "ip", "netns", "exec", WIRE_NS, "tc", "-s", "filter", "show", "dev", WIRE_DEV, "ingress",
    ])
    .unwrap_or_default();
    // "Sent <bytes> bytes <packets> pkt (dropped ...)" under the action.
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let i = w.iter().position(|x| *x == "pkt")?;
            (w.first() == Some(&"Sent")).then(|| w[i - 1].parse::<u64>().ok())?
        })
        .max()
        .unwrap_or(0)
}

/// The in-VM entry point.
pub fn main() -> i32 {
    let outdir = PathBuf::from(std::env::var("PLEXUS_VM_OUT").unwrap_or_else(|_| "/tmp".into()));
    let file = match std::fs::File::create(outdir.join("results.jsonl")) {
        Ok(f) => f,
        Err(e) => {
            println!(
                "vm-runner: cannot write results in {}: {e}",
                outdir.display()
            );
            return 1;
        }
    };
    let out = Out(Mutex::new(file));
    let t0 = Instant::now();
    let pf = match Pf::discover() {
        Ok(p) => p,
        Err(e) => {
            out.line(&json!({"case":"setup","ok":false,"secs":0.0,"detail":e}));
            out.line(&json!({"done": true}));
            return 1;
        }
    };
    if let Err(e) = setup(&pf) {
        out.line(&json!({"case":"setup","ok":false,"secs":0.0,"detail":e}));
        out.line(&json!({"done": true}));
        return 1;
    }
    let kernel = sh(&["uname", "-r"]).unwrap_or_default();
    out.line(&json!({"note": format!(
        "kernel {} in QEMU/TCG: PF {} ({}, igb) with {NUM_VFS} igbvf VFs ready after {:.1} s",
        kernel.trim(), pf.name, pf.pci, t0.elapsed().as_secs_f64())}));
    std::panic::set_hook(Box::new(|info| {
        let msg = match info.payload().downcast_ref::<String>() {
            Some(s) => s.clone(),
            None => info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .unwrap_or_default(),
        };
        let loc = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let text = format!("{loc}: {msg}");
        println!("vm-runner: panic at {text}");
        *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = text;
    }));

    let mut all: Vec<Case> = Vec::new();
    all.extend_from_slice(crate::cases_traffic::CASES);
    all.extend_from_slice(crate::cases::CASES);
    all.extend_from_slice(crate::cases_fail::CASES);
    all.extend_from_slice(crate::cases_fidelity::CASES);
    all.extend_from_slice(crate::cases_plexus::CASES);
    all.extend_from_slice(crate::peer::CASES);
    all.extend_from_slice(crate::cases_failover::CASES);
    all.extend(crate::cases_bench::cases());
    // PLEXUS_VM_CASES=a,b runs only the cases whose name contains one of the filters.
    let filters: Vec<String> = std::env::var("PLEXUS_VM_CASES")
        .unwrap_or_default()
        .split(',')
        .filter(|f| !f.is_empty())
        .map(str::to_string)
        .collect();
    if !filters.is_empty() {
        all.retain(|(name, _)| filters.iter().any(|f| name.contains(f.as_str())));
    }
    let mut failed = 0;
    for (n, (name, body)) in all.iter().enumerate() {
        let before = snaps(&pf);
        let dir = CaseDir(PathBuf::from(format!("/tmp/vmcase-{n}")));
        let _ = std::fs::create_dir_all(&dir.0);
        println!("vm-runner: case {name} ...");
        let t = T {
            pf: &pf,
            dir,
            out: &out,
        };
        let started = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&t)));
        let secs = started.elapsed().as_secs_f64();
        let mut detail = match r {
            Ok(()) => String::new(),
            Err(_) => LAST_PANIC
                .lock()
                .map(|s| s.clone())
                .unwrap_or_else(|p| p.into_inner().clone()),
        };
        // Every case must leave both VFs exactly as it found them.
        let after = snaps(&pf);
        if after != before {
            detail +=
                &format!("\nthe case left a VF changed:\n  before {before:?}\n  after  {after:?}");
            if let Err(e) = setup(&pf) {
                detail += &format!("\nre-creating the VFs failed too: {e}");
            }
        }
        let ok = detail.is_empty();
        if !ok {
            failed += 1;
        }
        println!(
            "vm-runner: case {name} {} ({secs:.1} s){}",
            if ok { "ok" } else { "FAILED" },
            if ok {
                String::new()
            } else {
                format!(": {detail}")
            }
        );
        out.line(&json!({"case": name, "ok": ok, "secs": secs, "detail": detail.trim()}));
    }
    // The node cases (host started a control plane for them: `node_host`).
    let mut ran = all.len();
    if outdir.join("node/node.json").exists() {
        crate::cases_node::run(&pf, &outdir, &filters, &mut |v| {
            if v["ok"] == false {
                failed += 1;
            }
            ran += usize::from(v["case"].is_string());
            out.line(&v);
        });
    }
    out.line(&json!({"done": true, "cases": ran, "failed": failed}));
    i32::from(failed > 0)
}
