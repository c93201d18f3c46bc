//! Host side of the opt-in benchmark `bench_sriov_vs_sriov_cni` (see `cases_bench`): finds the
//! release `sriov` and unpacks sriov-cni v2.10 (both under the host root the VM mounts
//! read-only), and tells the guest where they are in `<out>/bench.json`. Without that file the
//! guest does not run the benchmark.
//!
//! `PLEXUS_VM_BENCH=1` (or a `PLEXUS_VM_CASES` filter containing `bench`) turns it on;
//! `PLEXUS_VM_BENCH_ROUNDS` (default 10) rounds of one ADD + DEL per plugin;
//! `PLEXUS_VM_BENCH_SRIOV` (default `target/release/sriov`, from `cargo build --release -p
//! plexus-sriov`); `PLEXUS_PEERS_BIN` (default `/work/shared/peers/bin`): `sriov-cni[.xz]`;
//! `PLEXUS_VM_BENCH_STRACE=1`: first one ADD + DEL of each series under `strace -f -tt -T`
//! into the run directory (`strace-*.txt`; keep it with `PLEXUS_VM_KEEP=1`), to see where the
//! time goes.

use std::path::{Path, PathBuf};

use serde_json::json;

/// The name of the file the guest reads.
pub const FILE: &str = "bench.json";

/// Default rounds (each: both plugins, one ADD + DEL each, the first one alternating).
const ROUNDS: u32 = 10;

fn enabled() -> bool {
    let name = crate::cases_bench::NAME;
    std::env::var("PLEXUS_VM_BENCH").is_ok_and(|v| !v.is_empty() && v != "0")
        || std::env::var("PLEXUS_VM_CASES").is_ok_and(|c| {
            c.split(',')
                .any(|f| f.contains("bench") && name.contains(f))
        })
}

/// Writes `<out>/bench.json` when the benchmark is on; an error names what is missing.
pub fn prepare(out: &Path) -> Result<(), String> {
    if !enabled() {
        return Ok(());
    }
    let target = plexus_e2e::realk8s::bins::target_dir();
    let sriov = std::env::var_os("PLEXUS_VM_BENCH_SRIOV")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("release/sriov"));
    if !sriov.is_file() {
        return Err(format!(
            "the benchmark needs the release sriov at {}: build it first with `cargo build \
             --release -p plexus-sriov` (or point PLEXUS_VM_BENCH_SRIOV at one)",
            sriov.display()
        ));
    }
    let sriov = std::fs::canonicalize(&sriov).map_err(|e| format!("{}: {e}", sriov.display()))?;
    let stale = stale_against_sources(&sriov);
    let (peers, _) = peers_dir();
    let cni = plexus_e2e::realk8s::bins::find_usable(&peers, "sriov-cni")
        .map_err(|e| format!("unpacking sriov-cni from {}: {e:#}", peers.display()))?
        .ok_or_else(|| {
            format!(
                "the benchmark needs sriov-cni: no sriov-cni[.xz] in {} (PLEXUS_PEERS_BIN)",
                peers.display()
            )
        })?;
    let rounds = std::env::var("PLEXUS_VM_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(ROUNDS);
    let strace = std::env::var("PLEXUS_VM_BENCH_STRACE").is_ok_and(|v| v == "1");
    let cfg = json!({"sriov": sriov, "sriovCni": cni, "rounds": rounds, "stale": stale,
        "strace": strace});
    std::fs::write(out.join(FILE), cfg.to_string())
        .map_err(|e| format!("{}: {e}", out.join(FILE).display()))?;
    println!(
        "vm_sriov: benchmark on: {} vs {}, {rounds} rounds{}",
        sriov.display(),
        cni.display(),
        if stale {
            " (WARNING: the release sriov is older than sriov/src: rebuild it)"
        } else {
            ""
        }
    );
    Ok(())
}

/// The peers' directory: `PLEXUS_PEERS_BIN`, else `peers/bin` beside `PLEXUS_K8S_BIN`'s
/// `k8s/bin` (`../shared/`), else `/work/shared/peers/bin`; and whether it was named
/// explicitly.
fn peers_dir() -> (PathBuf, bool) {
    if let Some(d) = std::env::var_os("PLEXUS_PEERS_BIN").filter(|d| !d.is_empty()) {
        return (PathBuf::from(d), true);
    }
    let beside = std::env::var_os("PLEXUS_K8S_BIN")
        .map(|k| PathBuf::from(k).join("../../peers/bin"))
        .filter(|d| d.is_dir());
    (
        beside.unwrap_or_else(|| PathBuf::from("/work/shared/peers/bin")),
        false,
    )
}

/// Writes `<out>/peers.json` with the sriov-cni the conformance case runs side by side with
/// `sriov`; without it (no peers directory) that column is skipped with a note. A named
/// `PLEXUS_PEERS_BIN` without sriov-cni is an error.
pub fn prepare_peers(out: &Path) -> Result<(), String> {
    let (dir, named) = peers_dir();
    let cni = plexus_e2e::realk8s::bins::find_usable(&dir, "sriov-cni")
        .map_err(|e| format!("unpacking sriov-cni from {}: {e:#}", dir.display()))?;
    let Some(cni) = cni else {
        if named {
            return Err(format!(
                "no sriov-cni[.xz] in PLEXUS_PEERS_BIN={}",
                dir.display()
            ));
        }
        println!(
            "vm_sriov: no sriov-cni in {} (set PLEXUS_PEERS_BIN): the conformance case runs sriov only",
            dir.display()
        );
        return Ok(());
    };
    std::fs::write(out.join("peers.json"), json!({"sriovCni": cni}).to_string())
        .map_err(|e| format!("{}: {e}", out.join("peers.json").display()))
}

/// Whether a file under `sriov/src` is newer than the binary.
fn stale_against_sources(bin: &Path) -> bool {
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return false;
    };
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sriov/src");
    let mut stack = vec![src];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|m| m > built)
            {
                return true;
            }
        }
    }
    false
}
