//! IPv6 duplicate address detection on the VF, with the real `sriov` binary (veth ends as VF
//! netdevs, `binary_e2e`'s host): an address another host on the link holds fails the ADD with
//! an error naming it (the kernel would otherwise leave it `dadfailed` on the VF, unusable,
//! and the pod would start); a free one is usable the moment ADD returns.

mod common;

use std::time::Instant;

use common::*;
use serde_json::json;

/// The VF's link partner (`vf0p`, in the host netns) holds `fd00:10::5`; a pod asking for it
/// gets an error naming the address, the interface and DAD; the VF, the PF side and IPAM are
/// as before; nothing was announced at the VF's MAC.
#[test]
fn an_ipv6_address_held_on_the_link_fails_the_add_by_dad_and_rolls_back() {
    let env = Env::new(1, 0);
    let (pci, name) = vf(0);
    let h = env.host.name.clone();
    let before = env.link(&h, &name).unwrap();
    let pf_before = env.vf_config(0);
    run(&[
        "ip",
        "-n",
        &h,
        "addr",
        "add",
        "fd00:10::5/64",
        "dev",
        "vf0p",
        "nodad",
    ]);
    let mut conf = bank_conf("1.0.0", &pci);
    conf["ipam"]["addresses"] = json!([
        {"address": "10.10.0.5/24"},
        {"address": "fd00:10::5/64"}
    ]);
    conf["ipam"]["routes"] = json!([]);
    let (ok, res) = env.sriov("ADD", "c-dad", "net1", &env.pod.path(), &conf);
    assert!(!ok, "ADD with an address held on the link succeeded: {res}");
    let msg = res["msg"].as_str().unwrap_or_default().to_string()
        + res["details"].as_str().unwrap_or_default();
    for want in [
        "fd00:10::5",
        "net1",
        "duplicate address detection",
        "dadfailed",
        &pci,
    ] {
        assert!(
            msg.contains(want),
            "the error does not name {want:?}: {res}"
        );
    }
    assert_eq!(
        env.link(&h, &name).as_ref(),
        Some(&before),
        "the VF netdev is back as it was"
    );
    assert_eq!(env.vf_config(0), pf_before, "PF-side VF config restored");
    assert!(
        env.ipam_log().contains("DEL c-dad net1"),
        "IPAM released: {}",
        env.ipam_log()
    );
    // The holder's address still answers from the holder only: no neighbour entry on the
    // holder's side names the VF's MAC for it (an NA at the VF's MAC would have hijacked it).
    let neigh = run(&["ip", "-n", &h, "-6", "neigh", "show", "dev", "vf0p"]);
    assert!(!neigh.contains("02:66:00:00:00:01"), "{neigh}");
    let (ok, out) = env.sriov("DEL", "c-dad", "net1", &env.pod.path(), &conf);
    assert!(ok, "DEL after the failed ADD: {out}");
}

/// A free IPv6 address (static, beside an IPv4 one) is past DAD when ADD returns: not
/// tentative, announced (the link partner's stale entry names the VF's MAC) and reached with
/// the first ping.
#[test]
fn a_free_ipv6_address_is_usable_when_add_returns() {
    let env = Env::new(1, 0);
    let (pci, _) = vf(0);
    let h = env.host.name.clone();
    run(&[
        "ip",
        "-n",
        &h,
        "addr",
        "add",
        "fd00:10::1/64",
        "dev",
        "vf0p",
        "nodad",
    ]);
    let mut conf = bank_conf("1.0.0", &pci);
    conf["ipam"]["addresses"] = json!([
        {"address": "10.10.0.5/24"},
        {"address": "fd00:10::6/64"}
    ]);
    conf["ipam"]["routes"] = json!([]);
    // The link partner still has the address at a previous holder's MAC (a replica that
    // moved): the unsolicited NA, sent once DAD is done, must have corrected it when ADD
    // returns, before the partner sends anything.
    run(&[
        "ip",
        "-n",
        &h,
        "-6",
        "neigh",
        "replace",
        "fd00:10::6",
        "lladdr",
        "02:00:00:00:00:99",
        "dev",
        "vf0p",
        "nud",
        "stale",
    ]);
    let t = Instant::now();
    let (ok, res) = env.sriov("ADD", "c-free", "net1", &env.pod.path(), &conf);
    let add_ms = t.elapsed().as_millis();
    assert!(ok, "{res}");
    let neigh = run(&["ip", "-n", &h, "-6", "neigh", "show", "fd00:10::6"]);
    assert!(
        neigh.contains("02:66:00:00:00:01"),
        "the partner's entry when ADD returned: {neigh}"
    );
    let addrs = run(&[
        "ip",
        "-n",
        &env.pod.name,
        "-6",
        "addr",
        "show",
        "dev",
        "net1",
        "scope",
        "global",
    ]);
    assert!(addrs.contains("fd00:10::6/64"), "{addrs}");
    assert!(!addrs.contains("tentative"), "still in DAD: {addrs}");
    let ping = std::process::Command::new("ip")
        .args(["netns", "exec", &h, "ping", "-6", "-c", "1", "-W", "1"])
        .arg("fd00:10::6")
        .output()
        .expect("ping");
    assert!(
        ping.status.success(),
        "first ping after ADD: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    eprintln!("ADD with an IPv6 address (DAD included): {add_ms} ms");
    let (ok, out) = env.sriov("DEL", "c-free", "net1", &env.pod.path(), &conf);
    assert!(ok, "DEL: {out}");
}
