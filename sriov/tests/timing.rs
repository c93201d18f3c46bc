//! Not an assertion on speed: measures ADD/DEL wall time of the real binary (run through
//! `ip netns exec`, whose own cost is measured too) and prints the figures.
//! `cargo test -p plexus-sriov --release --test timing -- --nocapture`

mod common;

use common::*;
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
fn add_del_timing_report() {
    let env = Env::new(1, 0);
    let (pci, _) = vf(0);
    let n = 15;
    let mut base = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        run(&["ip", "netns", "exec", &env.host.name, "true"]);
        base.push(t.elapsed());
    }
    // The real Debian `static` IPAM plugin (what a bank NAD uses for a fixed IP).
    let real_ipam = [("CNI_PATH", "/usr/lib/cni")];
    for (label, with_ipam) in [("no IPAM", false), ("Debian static IPAM", true)] {
        let mut conf = bank_conf("1.0.0", &pci);
        if !with_ipam {
            conf.as_object_mut().unwrap().remove("ipam");
        }
        let (mut adds, mut dels) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let t = Instant::now();
            let (ok, res) =
                env.sriov_env("ADD", "c-time", "net1", &env.pod.path(), &conf, &real_ipam);
            adds.push(t.elapsed());
            assert!(ok, "{res}");
            let t = Instant::now();
            let (ok, res) =
                env.sriov_env("DEL", "c-time", "net1", &env.pod.path(), &conf, &real_ipam);
            dels.push(t.elapsed());
            assert!(ok, "{res}");
        }
        eprintln!(
            "sriov timing ({label}, n={n}): ADD median {:?}, DEL median {:?}; `ip netns exec true` median {:?}",
            median(adds),
            median(dels),
            median(base.clone())
        );
    }
}
