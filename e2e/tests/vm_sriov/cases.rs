//! Cases on the real VFs: the bank scenario with CHECK and DEL, `sriov list`, the pod netns
//! deleted before DEL, two pods racing for one VF, DPDK mode (vfio-pci), and ADD/DEL timings.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::Netns;
use crate::guest::{Case, T};
use crate::vf::{driver, link_summary, nad, rebind, vf_netdev, wait_for};

/// The cases of this module, in run order.
pub const CASES: &[Case] = &[
    ("sriov_list_reads_the_real_tree", list_real_tree),
    ("bank_add_check_del_restores_everything", bank_add_check_del),
    ("netns_deleted_before_del", netns_deleted_before_del),
    ("two_pods_race_for_one_vf", two_pods_race),
    ("gc_releases_stale_attachments", gc_stale),
    ("dpdk_mode_vfio_pci", dpdk_vfio),
    ("add_del_timing", timing),
];

/// The admin MAC the bank NAD pins.
pub const MAC: &str = "02:42:ac:11:00:0a";

/// The bank NAD's VF settings that igb accepts (it refuses `link_state` and `min_tx_rate`:
/// see `cases_fail`).
pub fn bank_settings() -> Value {
    json!({"vlan":100,"vlanQoS":3,"mac":MAC,"spoofchk":"off","trust":"on","max_tx_rate":100,"mtu":9000})
}

fn list_json(t: &T<'_>) -> Value {
    let out = Command::new(crate::common::bin("sriov"))
        .args(["list", "--json", "--state-dir"])
        .arg(t.dir.state())
        .output()
        .expect("run sriov list");
    assert!(
        out.status.success(),
        "sriov list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("sriov list --json")
}

fn list_real_tree(t: &T<'_>) {
    let rows = list_json(t);
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (i, r) in rows.iter().enumerate() {
        let i = i as u32;
        let pci = t.vf(i);
        assert_eq!(r["pf"], t.pf.name.as_str(), "{r}");
        assert_eq!(r["pfPci"], t.pf.pci.as_str(), "{r}");
        assert_eq!(r["vf"], i, "{r}");
        assert_eq!(r["pci"], pci.as_str(), "{r}");
        assert_eq!(r["driver"], "igbvf", "{r}");
        assert_eq!(r["netdevs"], json!([vf_netdev(&pci).unwrap()]), "{r}");
        // The PF side as `sriov list` reads it over netlink equals what `ip -d link` prints.
        let ip = t.pf.vfinfo(i);
        assert_eq!(r["config"]["mac"], ip["address"], "{r} vs {ip}");
        assert_eq!(r["config"]["spoofchk"], ip["spoofchk"], "{r} vs {ip}");
        assert_eq!(r["config"]["trust"], ip["trust"], "{r} vs {ip}");
        assert_eq!(r["containerId"], Value::Null, "{r}");
    }
    // While attached, the holder shows and the netdev is gone from the root netns.
    let pod = Netns::new();
    let conf = nad(&t.vf(1), json!({"vlan": 7}));
    t.dir.sriov("ADD", "list-1", &pod.path(), &conf).ok();
    let rows = list_json(t);
    assert_eq!(rows[1]["containerId"], "list-1", "{rows}");
    assert_eq!(rows[1]["ifname"], "net1", "{rows}");
    assert_eq!(rows[1]["netdevs"], json!([]), "{rows}");
    assert_eq!(rows[1]["config"]["vlan"], 7, "{rows}");
    t.dir.sriov("DEL", "list-1", &pod.path(), &conf).ok();
    let text = Command::new(crate::common::bin("sriov"))
        .arg("list")
        .output()
        .expect("sriov list");
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    t.note(format!(
        "`sriov list` on the real tree:\n{}",
        text.trim_end()
    ));
}

fn bank_add_check_del(t: &T<'_>) {
    let pci = t.vf(0);
    let before = t.pf.snap(0);
    let host_name = before.netdev["ifname"]
        .as_str()
        .expect("VF netdev")
        .to_string();
    let pod = Netns::new();
    let conf = nad(&pci, bank_settings());
    let res = t
        .dir
        .sriov("ADD", "bank-1", &pod.path(), &conf)
        .ok()
        .clone();
    let i = &res["interfaces"][0];
    assert_eq!(i["name"], "net1", "{res}");
    assert_eq!(i["mac"], MAC, "{res}");
    assert_eq!(i["mtu"], 9000, "{res}");
    assert_eq!(i["pciID"], pci.as_str(), "{res}");
    assert_eq!(i["sandbox"], pod.path().as_str(), "{res}");
    assert_eq!(res["ips"][0]["address"], "10.56.217.10/24", "{res}");
    // The VF netdev is in the pod, renamed, with the MAC, MTU, address and route.
    assert_eq!(
        link_summary(Some(&pod.name), "net1"),
        json!({"ifname":"net1","address":MAC,"mtu":9000,"up":true})
    );
    assert_eq!(pod.addrs("net1"), vec!["10.56.217.10/24"]);
    // And it has carrier: a VF configured right that carries nothing fails here.
    assert!(
        wait_for(Duration::from_secs(10), || {
            crate::cases_traffic::has_carrier(&pod, "net1")
        })
        .is_some(),
        "the bank pod's VF has no carrier 10 s after ADD:\n{}",
        crate::cases_traffic::driver_log()
    );
    assert!(
        pod.routes()
            .contains("10.56.0.0/16 via 10.56.217.1 dev net1"),
        "{}",
        pod.routes()
    );
    assert!(
        link_summary(None, &host_name).is_null(),
        "{host_name} still in the root netns"
    );
    // The PF side, read back the way an operator does (`ip -d link show <pf>`).
    let v = t.pf.vfinfo(0);
    assert_eq!(v["address"], MAC, "{v}");
    assert_eq!(v["vlan_list"], json!([{"vlan":100,"qos":3}]), "{v}");
    assert_eq!(v["spoofchk"], false, "{v}");
    assert_eq!(v["trust"], true, "{v}");
    assert_eq!(v["rate"], json!({"max_tx":100,"min_tx":0}), "{v}");
    assert_eq!(v["link_state"], "auto", "{v}");

    let mut check = conf.clone();
    check["prevResult"] = res.clone();
    t.dir.sriov("CHECK", "bank-1", &pod.path(), &check).ok();
    // Someone changes the VF behind the plugin's back: CHECK reads the real PF and says so.
    let vf_cmd = |args: &[&str]| {
        let mut a = vec!["ip", "link", "set", t.pf.name.as_str(), "vf", "0"];
        a.extend_from_slice(args);
        crate::vf::sh(&a).expect("ip link set vf");
    };
    vf_cmd(&["vlan", "7", "qos", "3"]);
    let drift = t.dir.sriov("CHECK", "bank-1", &pod.path(), &check);
    assert_eq!(drift.err()["code"], 111, "{:?}", drift);
    assert!(drift.out.to_string().contains("vlan"), "{}", drift.out);
    vf_cmd(&["vlan", "100", "qos", "3"]);
    t.dir.sriov("CHECK", "bank-1", &pod.path(), &check).ok();

    t.dir.sriov("DEL", "bank-1", &pod.path(), &conf).ok();
    assert_eq!(t.pf.snap(0), before, "DEL restores PF side and netdev");
    assert_eq!(pod.links(), vec!["lo"]);
    assert!(t.dir.saved().is_empty(), "{:?}", t.dir.saved());
    // containerd repeats DEL.
    t.dir.sriov("DEL", "bank-1", &pod.path(), &conf).ok();
    assert_eq!(t.pf.snap(0), before);
}

fn netns_deleted_before_del(t: &T<'_>) {
    let pci = t.vf(0);
    let before = t.pf.snap(0);
    let host_name = before.netdev["ifname"]
        .as_str()
        .expect("VF netdev")
        .to_string();
    let pod = Netns::new();
    let conf = nad(&pci, bank_settings());
    t.dir.sriov("ADD", "gone-1", &pod.path(), &conf).ok();
    pod.delete();
    // The kernel hands a physical netdev of a destroyed netns back to the root netns: under
    // its pod name when that is free there, as dev<ifindex> otherwise.
    let back = wait_for(Duration::from_secs(5), || vf_netdev(&pci).is_some());
    let name = vf_netdev(&pci);
    t.note(format!(
        "VF back in the root netns after the pod netns was deleted: after {back:?}, named {name:?} (was {host_name} on the host, net1 in the pod)"
    ));
    // The runtime's DEL after the sandbox is gone: empty CNI_NETNS, then the repeat with the
    // old path.
    t.dir.sriov("DEL", "gone-1", "", &conf).ok();
    assert_eq!(t.pf.snap(0), before, "VF renamed back and PF side restored");
    t.dir.sriov("DEL", "gone-1", &pod.path(), &conf).ok();
    assert!(t.dir.saved().is_empty());

    // Same with the DEL racing the kernel: netns deleted and DEL started at once.
    let pod = Netns::new();
    t.dir.sriov("ADD", "gone-2", &pod.path(), &conf).ok();
    let path = pod.path();
    pod.delete();
    t.dir.sriov("DEL", "gone-2", &path, &conf).ok();
    assert_eq!(t.pf.snap(0), before, "immediate DEL");

    // And when the pod name is taken in the root netns the kernel falls back to dev<ifindex>.
    let clash = crate::common::HostLink("net1".into());
    Command::new("ip")
        .args([
            "link", "add", "net1", "type", "veth", "peer", "name", "vmclash1",
        ])
        .status()
        .expect("ip link add");
    let pod = Netns::new();
    let mut c = conf.clone();
    c["vlan"] = json!(5);
    t.dir.sriov("ADD", "gone-3", &pod.path(), &c).ok();
    pod.delete();
    wait_for(Duration::from_secs(5), || vf_netdev(&pci).is_some());
    let name = vf_netdev(&pci).unwrap_or_default();
    assert!(name.starts_with("dev"), "returned as {name}");
    t.dir.sriov("DEL", "gone-3", "", &c).ok();
    drop(clash);
    assert_eq!(t.pf.snap(0), before, "renamed back from {name}");
}

fn two_pods_race(t: &T<'_>) {
    let pci = t.vf(0);
    let before = t.pf.snap(0);
    let (a, b) = (Netns::new(), Netns::new());
    let conf = nad(&pci, bank_settings());
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| t.dir.sriov("ADD", "race-a", &a.path(), &conf));
        let hb = s.spawn(|| t.dir.sriov("ADD", "race-b", &b.path(), &conf));
        (ha.join().expect("a"), hb.join().expect("b"))
    });
    assert!(
        (ra.code == 0) != (rb.code == 0),
        "exactly one ADD wins: a={ra:?} b={rb:?}"
    );
    let (win, winner, lose, loser, lost) = if ra.code == 0 {
        ("race-a", &a, "race-b", &b, &rb)
    } else {
        ("race-b", &b, "race-a", &a, &ra)
    };
    let text = lost.out.to_string();
    assert!(text.contains(&pci) && text.contains(win), "{text}");
    assert_eq!(lost.out["code"], 110, "{text}");
    assert_eq!(loser.links(), vec!["lo"]);
    assert_eq!(winner.addrs("net1"), vec!["10.56.217.10/24"]);
    // The refused pod's DEL leaves the winner alone.
    t.dir.sriov("DEL", lose, &loser.path(), &conf).ok();
    assert_eq!(winner.addrs("net1"), vec!["10.56.217.10/24"]);
    assert_eq!(t.pf.vfinfo(0)["vlan_list"], json!([{"vlan":100,"qos":3}]));
    t.dir.sriov("DEL", win, &winner.path(), &conf).ok();
    assert_eq!(t.pf.snap(0), before);
}

fn gc_stale(t: &T<'_>) {
    let before = [t.pf.snap(0), t.pf.snap(1)];
    let pods = [Netns::new(), Netns::new()];
    let mut confs = Vec::new();
    for i in 0..2u32 {
        // ADD at 1.0.0: Debian 12's static IPAM plugin stops there.
        let mut c = nad(&t.vf(i), json!({"vlan": 300 + i, "spoofchk": "off"}));
        c["ipam"]["addresses"][0]["address"] = json!(format!("10.56.217.{}/24", 20 + i));
        let pod = &pods[i as usize];
        t.dir.sriov("ADD", &format!("gc-{i}"), &pod.path(), &c).ok();
        confs.push(c);
    }
    // GC is a 1.1.0 command; no `ipam` here, or sriov would forward GC to a plugin that does
    // not speak 1.1.0. The stale attachment's IPAM is released with its saved config.
    let gc = json!({"cniVersion":"1.1.0","name":"bank-sriov","type":"sriov",
        "cni.dev/valid-attachments":[{"containerID":"gc-0","ifname":"net1"}]});
    t.dir.sriov("GC", "", "", &gc).ok();
    assert_eq!(t.pf.snap(1), before[1], "stale attachment released");
    assert_eq!(pods[1].links(), vec!["lo"]);
    assert_eq!(
        pods[0].addrs("net1"),
        vec!["10.56.217.20/24"],
        "valid one kept"
    );
    assert_eq!(t.pf.vfinfo(0)["vlan_list"], json!([{"vlan":300}]));
    t.dir.sriov("DEL", "gc-0", &pods[0].path(), &confs[0]).ok();
    t.dir.sriov("DEL", "gc-1", &pods[1].path(), &confs[1]).ok();
    assert_eq!(t.pf.snap(0), before[0]);
    assert_eq!(t.pf.snap(1), before[1]);
}

fn dpdk_vfio(t: &T<'_>) {
    let pci = t.vf(1);
    let old = t.pf.snap(1).netdev;
    let (old_mac, old_name) = (old["address"].clone(), old["ifname"].clone());
    rebind(&pci, "vfio-pci").expect("bind vfio-pci");
    let bound = driver(&pci);
    let group = std::fs::read_link(format!("/sys/bus/pci/devices/{pci}/iommu_group"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let body = || {
        assert_eq!(bound, "vfio-pci", "VF {pci} bound to {bound:?}");
        assert!(
            crate::vf::exists(format!("/dev/vfio/{group}")),
            "/dev/vfio/{group} missing"
        );
        let before = t.pf.snap(1);
        assert!(before.netdev.is_null(), "{before:?}");
        let pod = Netns::new();
        let conf = nad(
            &pci,
            json!({"vlan":200,"vlanQoS":1,"mac":"02:42:ac:11:00:0b","spoofchk":"off"}),
        );
        let res = t
            .dir
            .sriov("ADD", "dpdk-1", &pod.path(), &conf)
            .ok()
            .clone();
        assert_eq!(res["interfaces"][0]["pciID"], pci.as_str(), "{res}");
        assert_eq!(res["interfaces"][0]["mac"], "02:42:ac:11:00:0b", "{res}");
        assert_eq!(pod.links(), vec!["lo"], "DPDK mode moves no netdev");
        let v = t.pf.vfinfo(1);
        assert_eq!(v["vlan_list"], json!([{"vlan":200,"qos":1}]), "{v}");
        assert_eq!(v["address"], "02:42:ac:11:00:0b", "{v}");
        assert_eq!(v["spoofchk"], false, "{v}");
        let mut check = conf.clone();
        check["prevResult"] = res;
        t.dir.sriov("CHECK", "dpdk-1", &pod.path(), &check).ok();
        t.dir.sriov("DEL", "dpdk-1", &pod.path(), &conf).ok();
        assert_eq!(
            t.pf.snap(1),
            before,
            "DEL restores the PF side in DPDK mode"
        );
        assert!(t.dir.saved().is_empty());
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    // Back to igbvf either way; igbvf picks a new random MAC and the kernel a new name: put the
    // old ones back so the VF is as the case found it.
    rebind(&pci, "").expect("bind igbvf back");
    let back = wait_for(Duration::from_secs(20), || vf_netdev(&pci).is_some());
    if let (Some(dev), Some(mac)) = (vf_netdev(&pci), old_mac.as_str()) {
        let _ = Command::new("ip")
            .args(["link", "set", &dev, "address", mac])
            .status();
        // The kernel names the new netdev after the first free ethN, not the old name.
        if let Some(name) = old_name.as_str().filter(|n| *n != dev) {
            let _ = Command::new("ip")
                .args(["link", "set", &dev, "name", name])
                .status();
        }
    }
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
    assert!(back.is_some(), "igbvf did not bring the netdev back");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn timing(t: &T<'_>) {
    let pci = t.vf(0);
    let before = t.pf.snap(0);
    let pod = Netns::new();
    let conf = nad(&pci, bank_settings());
    let n = 5;
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    for k in 0..n {
        let cid = format!("time-{k}");
        let s = Instant::now();
        t.dir.sriov("ADD", &cid, &pod.path(), &conf).ok();
        adds.push(s.elapsed());
        let s = Instant::now();
        t.dir.sriov("DEL", &cid, &pod.path(), &conf).ok();
        dels.push(s.elapsed());
    }
    // Where the time goes: a DEL with nothing attached is process start + the Go static IPAM
    // plugin; the rest is netlink to igb/igbvf (each VF netdev change is a mailbox round trip
    // to the PF, and link down/up resets the VF).
    let (mut idle, mut vf_ops) = (Vec::new(), Vec::new());
    let dev = before.netdev["ifname"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mac = before.netdev["address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for _ in 0..2 {
        let s = Instant::now();
        t.dir.sriov("DEL", "time-none", &pod.path(), &conf).ok();
        idle.push(s.elapsed());
        let s = Instant::now();
        for a in [
            vec!["link", "set", &dev, "up"],
            vec!["link", "set", &dev, "down"],
            vec!["link", "set", &dev, "address", "02:00:00:00:00:99"],
            vec!["link", "set", &dev, "address", &mac],
        ] {
            crate::vf::sh(&[&["ip"], a.as_slice()].concat()).expect("ip link set");
        }
        vf_ops.push(s.elapsed());
    }
    assert_eq!(t.pf.snap(0), before);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let spread = |v: &[Duration]| {
        format!(
            "median {:.0} ms (min {:.0}, max {:.0})",
            ms(median(v.to_vec())),
            ms(*v.iter().min().unwrap_or(&Duration::ZERO)),
            ms(*v.iter().max().unwrap_or(&Duration::ZERO))
        )
    };
    t.note(format!(
        "ADD/DEL of sriov on the real igbvf VF inside QEMU/TCG (software CPU emulation: not host speed), bank NAD with Debian static IPAM, n={n}: ADD {}, DEL {}; of which process start + static IPAM (a DEL with nothing attached): {}; `ip link set <vf> up / down / address x2` on the VF alone: {}",
        spread(&adds),
        spread(&dels),
        spread(&idle),
        spread(&vf_ops),
    ));
}
