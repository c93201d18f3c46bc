//! `plexus-bench --address-scale`: what "never one address twice" costs per ADD as the
//! namespace grows: one node's Plexus (thin, then the daemon) against a real kube-apiserver,
//! without the AddressClaim CRD (the guard LISTs the namespace's pods) and with it (one claim
//! per address), a namespace holding 0, 1,000 and 5,000 other pods, and rounds of
//! "create a pod asking for a network with a fixed address, ADD it, DEL it, delete it". Prints
//! the ADD's median time, and the API requests and response bytes per ADD
//! (`apiserver_request_total`, `apiserver_response_sizes_sum`; the bench's own pod writes
//! excluded). Knob: `PLEXUS_ADDRESS_SCALE_SIZES` (comma list, default `0,1000,5000`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use plexus_e2e::realk8s::metrics;

use crate::fleet::{metric_sum, remove_fleet_netns, Bins, Fleet, Kind, NETNS_PREFIX};
use crate::sh;

const ROUNDS: usize = 5;

/// One system at one namespace size: ADD median ms, requests and response bytes per ADD.
fn measure(kind: Kind, claims: bool, others: usize, bins: Arc<Bins>) -> Result<(f64, f64, f64)> {
    remove_fleet_netns();
    let mut f = Fleet::start_with(kind, 1, bins, claims)?;
    f.populate(others)?;
    f.start_all()?;
    std::thread::sleep(Duration::from_secs(2));
    let (mut wall, mut reqs, mut bytes) = (vec![], 0u64, 0f64);
    for r in 0..=ROUNDS {
        let pod = format!("fixed-{r}");
        let uid = f.create_pod_with(&pod, &Fleet::node(0), "fixed")?;
        std::thread::sleep(Duration::from_millis(500));
        let netns = format!("{NETNS_PREFIX}a{r}");
        sh(&["ip", "netns", "add", &netns]);
        let before = f.cp_metrics()?;
        let t = Instant::now();
        let (ok, out) = f.call(0, "ADD", &pod, &uid, &netns);
        let took = t.elapsed().as_secs_f64() * 1000.0;
        ensure!(ok, "ADD {pod}: {out}");
        // The daemon's status write follows its answer: let it land inside the window.
        std::thread::sleep(Duration::from_millis(300));
        let after = f.cp_metrics()?;
        let (ok, out) = f.call(0, "DEL", &pod, &uid, &netns);
        ensure!(ok, "DEL {pod}: {out}");
        sh(&["ip", "netns", "del", &netns]);
        f.delete_pod(&pod)?;
        if r == 0 {
            continue;
        }
        wall.push(took);
        let (rb, ra) = (
            metrics::parse_request_totals(&before),
            metrics::parse_request_totals(&after),
        );
        reqs += ra
            .iter()
            .filter(|(k, _)| k.verb != "WATCH")
            .map(|(k, v)| v.saturating_sub(rb.get(k).copied().unwrap_or(0)))
            .sum::<u64>();
        bytes += metric_sum(&after, "apiserver_response_sizes_sum", &[])
            - metric_sum(&before, "apiserver_response_sizes_sum", &[]);
    }
    wall.sort_by(f64::total_cmp);
    drop(f);
    remove_fleet_netns();
    Ok((
        wall[wall.len() / 2],
        reqs as f64 / ROUNDS as f64,
        bytes / ROUNDS as f64,
    ))
}

/// Prints the table.
pub fn run(plexus: &Path, cni_bin: &Path) -> Result<()> {
    let sizes: Vec<usize> = std::env::var("PLEXUS_ADDRESS_SCALE_SIZES")
        .unwrap_or_else(|_| "0,1000,5000".into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let bins = Arc::new(Bins::find(plexus, cni_bin)?);
    println!(
        "a fixed address per ADD (static IPAM NAD), {ROUNDS} rounds per cell, real kube-apiserver; load average {}",
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    println!("| other pods in the namespace | system | guard | ADD median | API requests per ADD | response bytes per ADD |");
    println!("|---|---|---|---|---|---|");
    for &n in &sizes {
        for kind in [Kind::PlexusThin, Kind::PlexusDaemon] {
            for claims in [false, true] {
                let (ms, reqs, bytes) = measure(kind, claims, n, bins.clone())?;
                println!(
                    "| {n} | {} | {} | {ms:.0} ms | {reqs:.1} | {:.1} KiB |",
                    kind.label(),
                    if claims {
                        "address claims (CRD)"
                    } else {
                        "namespace LIST (no CRD)"
                    },
                    bytes / 1024.0
                );
            }
        }
    }
    Ok(())
}
