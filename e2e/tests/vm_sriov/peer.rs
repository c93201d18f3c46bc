//! A second node: a second QEMU VM (its own kernel, igb PF and igbvf VF) whose PF's wire is
//! joined to the first VM's over a UDP datagram link on 127.0.0.1 (QEMU `-netdev dgram`, a
//! port of the first VM's hub). It runs this binary with `--peer-vm`: one VF attached by the
//! real `sriov` delegate as a pod's `net1` on VLAN 100 with [`PEER_ADDR`], [`PEER_ADDR6`] (the
//! bank NAD with a dual static address) and [`PEER_MAC`], then it does what the first VM asks
//! through `peer_link` (detach, attach, stop). The first VM's case attaches one of its own VFs
//! on VLAN 100, also dual, and must reach both addresses at that MAC: VF to VF across two
//! nodes in each family, by packets; one on VLAN 200 must not.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::Netns;
use crate::guest::{Case, T};
use crate::vf::{nad, sh, wait_for, CaseDir, Pf};

/// The second node's VF address on VLAN 100.
pub const PEER_ADDR: &str = "10.56.217.60";
/// The second node's VF IPv6 address on VLAN 100 (beside [`PEER_ADDR`]).
pub const PEER_ADDR6: &str = "fd00:56:217::60";
/// The MAC the second node's `sriov` gives its VF (the NAD's `mac`).
pub const PEER_MAC: &str = "52:54:00:27:0b:10";
/// This node's VF address in the case, and the MAC it gives it.
const OWN_ADDR: &str = "10.56.217.61";
const OWN_ADDR6: &str = "fd00:56:217::61";
const OWN_MAC: &str = "52:54:00:27:0a:10";
/// This node's other VF, on VLAN 200 in the same subnet: the second node must not answer it.
const OTHER_ADDR: &str = "10.56.217.62";
const OTHER_MAC: &str = "52:54:00:27:0a:11";

/// The cases of this module (the first VM's side).
pub const CASES: &[Case] = &[(
    "a_vf_reaches_a_vf_of_a_second_node_across_the_wire",
    vf_to_vf_across_nodes,
)];

/// A bank NAD on `vlan` for VF `pci` with the static `addrs` (IPv4 in a /24, IPv6 in a /64)
/// and `mac`.
pub fn on_vlan(vlan: u16, pci: &str, addrs: &[&str], mac: &str) -> serde_json::Value {
    let mut c = nad(pci, json!({"vlan": vlan, "mac": mac}));
    let list: Vec<serde_json::Value> = addrs.iter().map(|a| json!({"address": cidr(a)})).collect();
    c["ipam"]["addresses"] = json!(list);
    c
}

/// `addr` with the VLAN's prefix: /24 for IPv4, /64 for IPv6.
pub fn cidr(addr: &str) -> String {
    if addr.contains(':') {
        format!("{addr}/64")
    } else {
        format!("{addr}/24")
    }
}

/// The first VM's case: VF 0 as `net1` on VLAN 100; the second node's VF answers a ping at its
/// own MAC (a frame that crossed the wire both ways: nothing on this node has that address),
/// and VF 1 on VLAN 200 in the same subnet gets no answer.
/// Without a second node (`PLEXUS_VM_PEER` unset) there is nothing to reach: it says so.
fn vf_to_vf_across_nodes(t: &T<'_>) {
    let peer = std::env::var("PLEXUS_VM_PEER").unwrap_or_default();
    if peer.is_empty() {
        t.note(
            "second node: none booted (PLEXUS_VM_PEER_VM=0), VF to VF across nodes not run".into(),
        );
        return;
    }
    assert_eq!(
        peer, PEER_ADDR,
        "the host booted the second node with another address"
    );
    let ns = Netns::new();
    let conf = on_vlan(100, &t.vf(0), &[OWN_ADDR, OWN_ADDR6], OWN_MAC);
    let r = t.dir.sriov("ADD", "peer-a", &ns.path(), &conf);
    assert_eq!(r.code, 0, "ADD: {} {}", r.out, r.stderr);
    let started = Instant::now();
    // The second node boots beside this one: give it time to attach its VF.
    let reached = wait_for(Duration::from_secs(240), || {
        sh(&[
            "ip", "netns", "exec", &ns.name, "ping", "-c", "1", "-W", "2", PEER_ADDR,
        ])
        .is_ok()
    });
    let waited = started.elapsed();
    let neigh = ns.ip(&["neigh", "show", PEER_ADDR]);
    // The same VFs over IPv6: neighbour discovery (multicast solicitations through the PF's
    // VF filters) and the echo, across the wire.
    let started6 = Instant::now();
    let reached6 = reached.is_some().then(|| {
        wait_for(Duration::from_secs(20), || {
            sh(&[
                "ip", "netns", "exec", &ns.name, "ping", "-6", "-c", "1", "-W", "2", PEER_ADDR6,
            ])
            .is_ok()
        })
    });
    let waited6 = started6.elapsed();
    let neigh6 = ns.ip(&["-6", "neigh", "show", PEER_ADDR6]);
    // Where it must stop: this node's other VF, same subnet but VLAN 200, gets no answer
    // while the VLAN 100 one still does.
    let other = reached.is_some().then(|| on_another_vlan(t));
    let still6 = sh(&[
        "ip", "netns", "exec", &ns.name, "ping", "-6", "-c", "3", "-i", "0.3", "-W", "2",
        PEER_ADDR6,
    ]);
    let still = sh(&[
        "ip", "netns", "exec", &ns.name, "ping", "-c", "1", "-W", "2", PEER_ADDR,
    ]);
    let del = t.dir.sriov("DEL", "peer-a", &ns.path(), &conf);
    assert!(
        reached.is_some(),
        "no answer from the second node's VF {PEER_ADDR} on VLAN 100 within 240 s"
    );
    assert!(
        neigh.contains(PEER_MAC),
        "{PEER_ADDR} answered from another MAC: {neigh}"
    );
    assert!(
        reached6.flatten().is_some(),
        "no answer from the second node's VF {PEER_ADDR6} over IPv6 within 20 s (IPv4 answered)"
    );
    assert!(
        neigh6.contains(PEER_MAC),
        "{PEER_ADDR6} answered from another MAC: {neigh6}"
    );
    let other = other.unwrap_or_default();
    assert!(other.is_empty(), "{other}");
    assert!(still.is_ok(), "VLAN 100 stopped answering: {still:?}");
    assert!(
        still6.is_ok(),
        "VLAN 100 stopped answering over IPv6: {still6:?}"
    );
    assert_eq!(del.code, 0, "DEL: {}", del.out);
    t.note(format!(
        "second node: its VF {PEER_ADDR} ({PEER_MAC}) answered on VLAN 100 across the wire after {:.1} s, {PEER_ADDR6} over IPv6 {:.1} s after that, 3 of 3 again later; a VF on VLAN 200 got no answer (3 pings)",
        waited.as_secs_f64(),
        waited6.as_secs_f64()
    ));
}

/// VF 1 on VLAN 200 in the second node's subnet: what went wrong, or nothing when the second
/// node stayed silent to it (no answer to 3 pings, no neighbour entry with its MAC).
fn on_another_vlan(t: &T<'_>) -> String {
    let ns = Netns::new();
    let conf = on_vlan(200, &t.vf(1), &[OTHER_ADDR], OTHER_MAC);
    let r = t.dir.sriov("ADD", "peer-other", &ns.path(), &conf);
    if r.code != 0 {
        return format!("ADD on VLAN 200: {} {}", r.out, r.stderr);
    }
    let ping = sh(&[
        "ip", "netns", "exec", &ns.name, "ping", "-c", "3", "-i", "0.5", "-W", "1", PEER_ADDR,
    ]);
    let neigh = ns.ip(&["neigh", "show", PEER_ADDR]);
    let del = t.dir.sriov("DEL", "peer-other", &ns.path(), &conf);
    let mut wrong = Vec::new();
    if ping.is_ok() {
        wrong.push(format!("{PEER_ADDR} answered a VF on VLAN 200"));
    }
    if neigh.contains(PEER_MAC) {
        wrong.push(format!("VLAN 200 learnt {PEER_MAC}: {neigh}"));
    }
    if del.code != 0 {
        wrong.push(format!("DEL on VLAN 200: {}", del.out));
    }
    wrong.join("; ")
}

/// The second VM's entry point (`--peer-vm`): attach its VF as [`PEER_ADDR`], report, then
/// carry out the first VM's commands (`peer_link`) until it says stop.
pub fn main() -> i32 {
    let out = PathBuf::from(std::env::var("PLEXUS_VM_OUT").unwrap_or_else(|_| "/tmp".into()));
    let report = |v: serde_json::Value| {
        println!("vm-peer: {v}");
        let _ = std::fs::write(out.join("peer.json"), v.to_string());
    };
    let started = (|| -> Result<Node, String> {
        sh(&["ip", "link", "set", "lo", "up"])?;
        let pf = Pf::discover()?;
        crate::vf::write_sys(
            &format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", pf.name),
            "1",
        )?;
        pf.set_up(true)?;
        pf.create_vfs(1)?;
        pf.wait_rate_ready()?;
        let vf = pf.vf_pci(0).ok_or("no VF 0")?;
        let dir = CaseDir(PathBuf::from("/tmp/peer"));
        std::fs::create_dir_all(&dir.0).map_err(|e| e.to_string())?;
        let mut node = Node {
            vf,
            dir,
            pod: None,
            pods: 0,
            out: out.clone(),
            kube: None,
        };
        node.attach(&[PEER_ADDR.into(), PEER_ADDR6.into()], PEER_MAC, true)?;
        Ok(node)
    })();
    let mut node = match started {
        Ok(n) => {
            report(json!({"ready": true, "vf": n.vf, "addr": PEER_ADDR, "mac": PEER_MAC}));
            n
        }
        Err(e) => {
            report(json!({"ready": false, "error": e}));
            return 1;
        }
    };
    let code = crate::peer_link::serve(&out, |cmd| node.carry_out(cmd));
    if let Some(mut k) = node.kube.take() {
        k.stop();
    }
    if let Err(e) = node.detach() {
        println!("vm-peer: {e}");
    }
    code
}

/// The second node's one VF and the pod holding it, if any.
struct Node {
    vf: String,
    dir: CaseDir,
    pod: Option<(Netns, String, serde_json::Value)>,
    pods: u32,
    /// This VM's out share (its `node/node.json` when it is to run a kubelet).
    out: PathBuf,
    /// The kubelet node, once started.
    kube: Option<crate::node::Node>,
}

impl Node {
    /// A command from the first VM: `{"op":"attach","addr"|"addrs":[…],"mac","announce"}` or
    /// `{"op":"detach"}`; the answer says how long the delegate took.
    fn carry_out(&mut self, cmd: &serde_json::Value) -> Result<serde_json::Value, String> {
        let t = Instant::now();
        match cmd["op"].as_str() {
            Some("attach") => {
                let addrs: Vec<String> = match cmd["addrs"].as_array() {
                    Some(a) => a
                        .iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect(),
                    None => vec![cmd["addr"].as_str().ok_or("no addr")?.to_string()],
                };
                self.attach(
                    &addrs,
                    cmd["mac"].as_str().ok_or("no mac")?,
                    cmd["announce"].as_bool().unwrap_or(true),
                )?
            }
            Some("detach") => self.detach()?,
            Some("start_node") => {
                // The VF goes back to the node: sriovdp advertises it.
                self.detach()?;
                self.kube = Some(crate::node::Node::start(&self.out)?);
            }
            Some("pod_sh") => return self.pod_sh(cmd, t),
            Some("power_off") => {
                // Power lost: no kubelet shutdown, no CNI DEL, nothing written back.
                crate::vf::write_sys("/proc/sysrq-trigger", "o")?;
            }
            other => return Err(format!("unknown op {other:?}")),
        }
        Ok(json!({"ms": t.elapsed().as_secs_f64() * 1000.0}))
    }

    /// `{"op":"pod_sh","ns","pod","argv":[…],"background":bool}`: runs `argv` in the netns of
    /// pod `ns/pod` on this node (the kubelet node must be running). The answer carries its
    /// exit code and output; `background` starts it and answers at once.
    fn pod_sh(&self, cmd: &serde_json::Value, t: Instant) -> Result<serde_json::Value, String> {
        let kube = self
            .kube
            .as_ref()
            .ok_or("the kubelet node is not running")?;
        let netns = kube.pod_netns(
            cmd["ns"].as_str().ok_or("no ns")?,
            cmd["pod"].as_str().ok_or("no pod")?,
        )?;
        let argv: Vec<String> = cmd["argv"]
            .as_array()
            .ok_or("no argv")?
            .iter()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &netns]).args(&argv);
        if cmd["background"].as_bool().unwrap_or(false) {
            c.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            let child = c.spawn().map_err(|e| format!("{argv:?}: {e}"))?;
            std::mem::forget(child);
            return Ok(json!({"ms": t.elapsed().as_secs_f64() * 1000.0, "code": 0}));
        }
        let o = c.output().map_err(|e| format!("{argv:?}: {e}"))?;
        Ok(json!({"ms": t.elapsed().as_secs_f64() * 1000.0,
            "code": o.status.code().unwrap_or(-1),
            "out": String::from_utf8_lossy(&o.stdout),
            "err": String::from_utf8_lossy(&o.stderr)}))
    }

    /// A pod with the VF as `net1` on VLAN 100 at `addrs` and `mac`, by the real `sriov`.
    /// Without `announce` the addresses are not in the delegate's config but added by hand
    /// after it (`arp_notify` and `ndisc_notify` off, IPv6 without DAD so that it is usable at
    /// once, as with the delegate): the VF is set up the same, and nothing tells the wire it
    /// moved, as with a delegate that does not announce.
    fn attach(&mut self, addrs: &[String], mac: &str, announce: bool) -> Result<(), String> {
        if self.pod.is_some() {
            return Err("the VF is attached already".into());
        }
        self.pods += 1;
        let id = format!("peer-b{}", self.pods);
        let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
        let mut conf = on_vlan(100, &self.vf, &refs, mac);
        if !announce {
            conf.as_object_mut().map(|o| o.remove("ipam"));
        }
        let ns = Netns::new();
        let r = self.dir.sriov("ADD", &id, &ns.path(), &conf);
        if r.code != 0 {
            return Err(format!("ADD: {} {}", r.out, r.stderr));
        }
        if !announce {
            let cidrs: Vec<String> = addrs.iter().map(|a| cidr(a)).collect();
            let mut cmds = vec![
                vec!["sysctl", "-qw", "net.ipv4.conf.net1.arp_notify=0"],
                vec!["sysctl", "-qw", "net.ipv6.conf.net1.ndisc_notify=0"],
            ];
            for c in &cidrs {
                let mut a = vec!["ip", "addr", "add", c.as_str(), "dev", "net1"];
                if c.contains(':') {
                    a.push("nodad");
                }
                cmds.push(a);
            }
            for c in cmds {
                let mut a = vec!["ip", "netns", "exec", ns.name.as_str()];
                a.extend(c);
                sh(&a)?;
            }
        }
        self.pod = Some((ns, id, conf));
        Ok(())
    }

    /// The pod's DEL (the VF back on the node), and its netns removed.
    fn detach(&mut self) -> Result<(), String> {
        let Some((ns, id, conf)) = self.pod.take() else {
            return Ok(());
        };
        let r = self.dir.sriov("DEL", &id, &ns.path(), &conf);
        if r.code != 0 {
            return Err(format!("DEL: {}", r.out));
        }
        Ok(())
    }
}
