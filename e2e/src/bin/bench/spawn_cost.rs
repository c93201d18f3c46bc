//! `--spawn-cost`: what starting one delegate costs plexus, by how it is started: std's
//! `Command` with a `pre_exec` hook (a fork: plexus' page tables copied, as plexus did up to
//! 78bc617) against `plexus_delegates::spawn` (clone with CLONE_VM|CLONE_VFORK), each starting
//! `/bin/true` and waiting for it, interleaved in rounds, with plexus-sized memory touched
//! (the thin plugin's ~7 MiB, the daemon's ~12 MiB and a larger daemon's 64 MiB).

use anyhow::{ensure, Result};
use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

fn fork_spawn() -> Result<()> {
    let mut cmd = Command::new("/bin/true");
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // The hook alone makes std fork instead of using posix_spawn.
    plexus_delegates::exec::die_with_parent(&mut cmd);
    let status = cmd.spawn()?.wait()?;
    ensure!(status.success(), "/bin/true failed");
    Ok(())
}

fn vfork_spawn() -> Result<()> {
    let env: [(&str, &OsStr); 0] = [];
    let s = plexus_delegates::spawn::spawn(&plexus_delegates::spawn::Spec {
        program: Path::new("/bin/true"),
        env: &env,
        root: None,
    })?;
    let status = plexus_delegates::spawn::wait(s.pid)?;
    ensure!(status.success(), "/bin/true failed");
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Run `rounds` interleaved rounds of 20 starts each way, per memory size.
pub fn run(rounds: usize) -> Result<()> {
    println!(
        "starting one delegate (/bin/true, started and waited for), {rounds} interleaved rounds of 20 each way, median per start:"
    );
    for mib in [7usize, 12, 64] {
        // Touched memory, as plexus' own heap would be.
        let ballast: Vec<u8> = (0..mib << 20).map(|i| i as u8).collect();
        let (mut fork, mut vfork) = (vec![], vec![]);
        for _ in 0..rounds {
            let t = Instant::now();
            for _ in 0..20 {
                fork_spawn()?;
            }
            fork.push(t.elapsed().as_secs_f64() * 1000.0 / 20.0);
            let t = Instant::now();
            for _ in 0..20 {
                vfork_spawn()?;
            }
            vfork.push(t.elapsed().as_secs_f64() * 1000.0 / 20.0);
        }
        let ratios: Vec<f64> = vfork.iter().zip(&fork).map(|(v, f)| v / f).collect();
        println!(
            "  {mib:>3} MiB touched: fork (pre_exec) {:.3} ms, clone(VM|VFORK) {:.3} ms, saved {:.3} ms per delegate (per-round ratio {:.2}×)",
            median(fork.clone()),
            median(vfork.clone()),
            median(fork) - median(vfork),
            median(ratios)
        );
        std::hint::black_box(&ballast);
    }
    Ok(())
}
