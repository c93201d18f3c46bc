//! Packets across the VFs: every interface the tier hands to a pod must carry traffic, not only
//! show the right settings.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::Netns;
use crate::guest::{Case, T};
use crate::vf::{nad, sh, vf_netdev, wait_for};

/// The cases of this module, in run order.
pub const CASES: &[Case] = &[
    ("vfs_get_carrier_and_carry_frames", carrier_and_frames),
    ("sriov_settings_seen_by_packets", settings_by_packets),
];

/// The kernel's lines about igb and igbvf, for a failure message.
pub fn driver_log() -> String {
    let dmesg = sh(&["dmesg"]).unwrap_or_default();
    let lines: Vec<&str> = dmesg
        .lines()
        .filter(|l| l.contains("igb") || l.contains("igbvf"))
        .collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Whether `dev` in `ns` has carrier.
pub fn has_carrier(ns: &Netns, dev: &str) -> bool {
    let v: serde_json::Value =
        serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", dev])).unwrap_or_default();
    v[0]["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == "LOWER_UP"))
}

/// `ping -c 1 -W 2` from `ns` to `addr` succeeds.
pub fn pings(ns: &Netns, addr: &str) -> bool {
    sh(&[
        "ip", "netns", "exec", &ns.name, "ping", "-c", "1", "-W", "2", addr,
    ])
    .is_ok()
}

/// Two VFs of the PF, each in a netns with an address, up: both get carrier and ping each
/// other through the PF's switch; then each goes back to the root netns as it was.
fn carrier_and_frames(t: &T<'_>) {
    let nets: Vec<(Netns, String, String)> = (0..2)
        .map(|i| {
            let dev = vf_netdev(&t.vf(i)).expect("VF netdev");
            let ns = Netns::new();
            sh(&["ip", "link", "set", "dev", &dev, "netns", &ns.name]).expect("move VF");
            let addr = format!("10.99.0.{}", i + 1);
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", &dev]);
            ns.ip(&["link", "set", "dev", &dev, "up"]);
            (ns, dev, addr)
        })
        .collect();
    let carrier = nets
        .iter()
        .map(|(ns, dev, _)| wait_for(Duration::from_secs(20), || has_carrier(ns, dev)));
    let carrier: Vec<Option<Duration>> = carrier.collect();
    let ping = carrier.iter().all(Option::is_some) && pings(&nets[0].0, &nets[1].2);
    t.note(format!(
        "VF carrier after {:?}; ping VF0 -> VF1: {ping}",
        carrier
    ));
    let log = driver_log();
    for (ns, dev, _) in &nets {
        ns.ip(&["link", "set", "dev", dev, "down"]);
        ns.ip(&["addr", "flush", "dev", dev]);
        ns.ip(&["link", "set", "dev", dev, "netns", "1"]);
    }
    assert!(
        carrier.iter().all(Option::is_some),
        "a VF has no carrier 20 s after link-up: {carrier:?}\n{log}"
    );
    assert!(ping, "no ping between the VFs\n{log}");
}

/// The addresses of the two pods (VF 0 and VF 1) and of the station behind pod A's VF.
const A: &str = "10.56.217.10";
const B: &str = "10.56.217.11";
const STATION: &str = "10.56.217.77";
const STATION_MAC: &str = "02:00:00:00:00:77";

/// The bank NAD on VF `i` with `settings` and the pod address `addr`.
fn pod_conf(t: &T<'_>, i: u32, addr: &str, settings: Value) -> Value {
    let mut c = nad(&t.vf(i), settings);
    c["ipam"]["addresses"] = json!([{"address": format!("{addr}/24")}]);
    c
}

/// Two pods attached by the plugin (VF 0 as net1 of pod A, VF 1 of pod B), deleted on drop.
struct Pair<'a> {
    t: &'a T<'a>,
    a: Netns,
    b: Netns,
    confs: [Value; 2],
    id: &'static str,
}

impl<'a> Pair<'a> {
    fn add(t: &'a T<'a>, id: &'static str, a: Value, b: Value) -> Self {
        let pair = Pair {
            t,
            a: Netns::new(),
            b: Netns::new(),
            confs: [pod_conf(t, 0, A, a), pod_conf(t, 1, B, b)],
            id,
        };
        for (i, ns) in [&pair.a, &pair.b].into_iter().enumerate() {
            t.dir
                .sriov("ADD", &format!("{id}-{i}"), &ns.path(), &pair.confs[i])
                .ok();
        }
        // Carrier first (igbvf takes ~50 ms after link-up), so that a ping is about the path.
        for ns in [&pair.a, &pair.b] {
            wait_for(Duration::from_secs(10), || has_carrier(ns, "net1"));
        }
        pair
    }
}

impl Drop for Pair<'_> {
    fn drop(&mut self) {
        for (i, ns) in [&self.a, &self.b].into_iter().enumerate() {
            let r = self.t.dir.sriov(
                "DEL",
                &format!("{}-{i}", self.id),
                &ns.path(),
                &self.confs[i],
            );
            if !std::thread::panicking() {
                r.ok();
            }
        }
    }
}

/// A station behind pod A's VF with its own MAC (a veth into a netns, bridged with net1 in pod
/// A), as a VM or container inside the pod would be: its frames leave the VF with a source MAC
/// that is not the VF's. Returns its netns.
fn station_behind(a: &Netns) -> Netns {
    let st = Netns::new();
    a.ip(&["link", "add", "br0", "type", "bridge"]);
    a.ip(&["link", "add", "stp", "type", "veth", "peer", "name", "sta"]);
    a.ip(&["link", "set", "sta", "netns", &st.name]);
    a.ip(&["link", "set", "net1", "master", "br0"]);
    a.ip(&["link", "set", "stp", "master", "br0"]);
    for l in ["br0", "stp"] {
        a.ip(&["link", "set", l, "up"]);
    }
    st.ip(&["link", "set", "sta", "address", STATION_MAC]);
    st.ip(&["addr", "add", &format!("{STATION}/24"), "dev", "sta"]);
    st.ip(&["link", "set", "sta", "up"]);
    st
}

/// Takes the station and pod A's bridge away again (net1 stays).
fn remove_station(a: &Netns, st: &Netns) {
    a.ip(&["link", "del", "stp"]);
    a.ip(&["link", "del", "br0"]);
    st.delete();
}

/// Whether pod B has heard the station: its ARP request (for B's address) crossed the VFs.
fn b_heard_station(b: &Netns) -> bool {
    b.ip(&["neigh", "show", STATION]).contains(STATION_MAC)
}

/// Large-packet ping that may not be fragmented (`-M do`), `size` bytes of ICMP payload.
fn pings_unfragmented(ns: &Netns, addr: &str, size: u32) -> bool {
    sh(&[
        "ip",
        "netns",
        "exec",
        &ns.name,
        "ping",
        "-c",
        "1",
        "-W",
        "2",
        "-M",
        "do",
        "-s",
        &size.to_string(),
        addr,
    ])
    .is_ok()
}

/// The OpenShift SR-IOV conformance behaviours, seen by packets between two pods the plugin
/// attached to two VFs of one PF (the PF's internal switch carries them): same VLAN passes and
/// across VLANs fails; MTU 9000 carries 8972-byte unfragmented pings; spoofchk on drops frames
/// whose source MAC is not the VF's, off lets them out; trust on lets the VF receive frames for
/// another MAC (promiscuous, the station's replies), off does not.
fn settings_by_packets(t: &T<'_>) {
    let mut seen = Vec::new();
    let mut wrong: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            wrong.push(what)
        }
    };
    {
        // Same VLAN, jumbo MTU, spoofchk on (the default), trust off.
        let p = Pair::add(
            t,
            "vlan-same",
            json!({"vlan":100,"vlanQoS":3,"mtu":9000,"mac":"02:42:ac:11:00:0a","spoofchk":"on"}),
            json!({"vlan":100,"mtu":9000}),
        );
        let ping = pings(&p.a, B) && pings(&p.b, A);
        let jumbo = pings_unfragmented(&p.a, B, 8972);
        let st = station_behind(&p.a);
        let _ = pings(&st, B);
        let spoofed = b_heard_station(&p.b);
        remove_station(&p.a, &st);
        seen.push(format!(
            "VLAN 100 both: ping {ping}, 8972-byte unfragmented {jumbo}; spoofchk on: station's frames reach B {spoofed} (QEMU does not emulate anti-spoofing)"
        ));
        check(ping, "no ping between two pods on VLAN 100".into());
        check(
            jumbo,
            "MTU 9000 on both VFs: no 8972-byte unfragmented ping".into(),
        );
        // QEMU's igb does not emulate the 82576's MAC anti-spoofing (DTXSWC): the frames get
        // through there, where a real 82576 drops them; recorded, not asserted.
    }
    {
        let p = Pair::add(t, "vlan-other", json!({"vlan":100}), json!({"vlan":200}));
        let ping = pings(&p.a, B);
        seen.push(format!("VLAN 100 and 200: ping {ping}"));
        check(!ping, "a ping crossed from VLAN 100 to VLAN 200".into());
    }
    {
        let p = Pair::add(
            t,
            "spoof-off",
            json!({"vlan":100,"spoofchk":"off"}),
            json!({"vlan":100}),
        );
        let st = station_behind(&p.a);
        let _ = pings(&st, B);
        let spoofed = b_heard_station(&p.b);
        remove_station(&p.a, &st);
        seen.push(format!("spoofchk off: station's frames reach B {spoofed}"));
        check(
            spoofed,
            "spoofchk off: the station's frames did not leave the VF".into(),
        );
    }
    // Trust, as igb applies it: a trusted VF may change the MAC the PF pinned, an untrusted one
    // may not (EADDRNOTAVAIL); B then reaches A at the MAC A has.
    for trust in [false, true] {
        let on = if trust { "on" } else { "off" };
        let p = Pair::add(
            t,
            if trust { "trust-on" } else { "trust-off" },
            json!({"vlan":100,"mac":"02:42:ac:11:00:0a","trust":on}),
            json!({"vlan":100}),
        );
        let changed = sh(&[
            "ip",
            "netns",
            "exec",
            &p.a.name,
            "ip",
            "link",
            "set",
            "net1",
            "address",
            "02:42:ac:11:00:99",
        ])
        .is_ok();
        let want = if changed {
            "02:42:ac:11:00:99"
        } else {
            "02:42:ac:11:00:0a"
        };
        let ping = pings(&p.b, A);
        let neigh = p.b.ip(&["neigh", "show", A]);
        seen.push(format!(
            "trust {on}: the pod changes its pinned MAC {changed}; B reaches A {ping} at {}",
            neigh.split_whitespace().nth(4).unwrap_or("?")
        ));
        check(
            changed == trust,
            format!("trust {on}: the pod changed its pinned MAC: {changed}"),
        );
        check(
            ping && neigh.contains(want),
            format!("trust {on}: B does not reach A at {want}: {neigh}"),
        );
    }
    t.note(format!("packets across two VFs: {}", seen.join("; ")));
    assert!(wrong.is_empty(), "{}\n{}", wrong.join("\n"), driver_log());
}
