//! End-to-end tests of the real `sriov` binary, run inside a per-test host netns with veth
//! ends as VF netdevs, a fake sysfs tree and the file-backed fake PF (`PLEXUS_SRIOV_FAKE_PF`).

mod common;

use common::*;
use serde_json::{json, Value};

fn assert_restored(env: &Env, i: u32, before: &LinkState, pf_before: &plexus_sriov::pf::VfConfig) {
    let (_, name) = vf(i);
    let now = env
        .link(&env.host.name, &name)
        .unwrap_or_else(|| panic!("{name} not back in the host netns"));
    assert_eq!(&now, before, "netdev name/MAC/MTU/ifindex restored");
    assert_eq!(&env.vf_config(i), pf_before, "PF-side VF config restored");
}

#[test]
fn bank_scenario_add_check_del_restores_everything_for_each_version() {
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let env = Env::new(1, 0);
        let (pci, name) = vf(0);
        let before = env.link(&env.host.name, &name).unwrap();
        let pf_before = env.vf_config(0);
        let conf = bank_conf(version, &pci);

        let (ok, res) = env.sriov("ADD", "c-bank", "net1", &env.pod.path(), &conf);
        assert!(ok, "{version} ADD: {res}");
        assert_eq!(res["cniVersion"], version);
        let iface = &res["interfaces"][0];
        assert_eq!(iface["name"], "net1");
        assert_eq!(iface["mac"], "02:66:00:00:00:01");
        assert_eq!(iface["sandbox"], env.pod.path());
        if version == "1.1.0" {
            assert_eq!(iface["pciID"], pci.as_str());
            assert_eq!(iface["mtu"], 9000);
        }
        assert_eq!(res["ips"][0]["address"], "10.10.0.5/24");
        assert_eq!(res["ips"][0]["gateway"], "10.10.0.1");
        if version != "0.3.1" || res["ips"][0].get("interface").is_some() {
            assert_eq!(res["ips"][0]["interface"], 0);
        }

        // PF side applied; netdev moved, renamed, MAC/MTU set, address and route configured.
        let c = env.vf_config(0);
        assert_eq!(
            (c.vlan, c.max_tx_rate, c.trust, c.spoofchk),
            (100, 1000, false, true)
        );
        assert_eq!(c.mac.to_string(), "02:66:00:00:00:01");
        assert!(
            env.link(&env.host.name, &name).is_none(),
            "VF left the host"
        );
        let pod = env.link(&env.pod.name, "net1").expect("net1 in pod");
        assert_eq!((pod.mac.as_str(), pod.mtu), ("02:66:00:00:00:01", 9000));
        let addrs = env.addrs(&env.pod.name, "net1");
        let global: Vec<_> = addrs.iter().filter(|a| !a.starts_with("fe80")).collect();
        assert_eq!(global, vec!["10.10.0.5/24"]);
        let routes = run(&[
            "ip",
            "-n",
            &env.pod.name,
            "route",
            "show",
            "192.168.50.0/24",
        ]);
        assert!(routes.contains("via 10.10.0.1 dev net1"), "{routes}");

        // CHECK with prevResult passes, and notices a drift.
        let mut chk = conf.clone();
        chk["prevResult"] = res.clone();
        let (ok, out) = env.sriov("CHECK", "c-bank", "net1", &env.pod.path(), &chk);
        if version == "0.3.1" {
            // CHECK is not defined before 0.4.0; the skel still runs it, and it passes.
            assert!(ok, "{out}");
        } else {
            assert!(ok, "{version} CHECK: {out}");
        }
        run(&[
            "ip",
            "-n",
            &env.pod.name,
            "link",
            "set",
            "net1",
            "mtu",
            "1400",
        ]);
        let (ok, out) = env.sriov("CHECK", "c-bank", "net1", &env.pod.path(), &chk);
        assert!(!ok, "CHECK must notice the MTU change");
        assert!(
            out["details"]
                .as_str()
                .unwrap()
                .contains("MTU 1400 want 9000"),
            "{out}"
        );

        let (ok, out) = env.sriov("DEL", "c-bank", "net1", &env.pod.path(), &conf);
        assert!(ok, "{version} DEL: {out}");
        assert_restored(&env, 0, &before, &pf_before);
        assert!(env.link(&env.pod.name, "net1").is_none());
        assert!(env.ipam_log().contains("DEL c-bank net1"), "IPAM released");
        let left: Vec<_> = std::fs::read_dir(env.state_dir())
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_file())
            .collect();
        assert!(left.is_empty(), "state files left: {left:?}");
    }
}

#[test]
fn pod_netns_deleted_before_del_restores_original_name() {
    let env = Env::new(2, 0);
    let mut pods = Vec::new();
    for i in 0..2u32 {
        let (pci, name) = vf(i);
        let before = env.link(&env.host.name, &name).unwrap();
        let pf_before = env.vf_config(i);
        let pod = Ns::new("gone");
        let conf = bank_conf("1.0.0", &pci);
        let (ok, res) = env.sriov("ADD", &format!("c-gone{i}"), "net1", &pod.path(), &conf);
        assert!(ok, "{res}");
        pods.push((pod, before, pf_before, pci, name, conf));
    }
    for (i, (pod, before, pf_before, pci, name, conf)) in pods.iter_mut().enumerate() {
        // Emulate the kernel's default_device_exit_net: a physical netdev in a dying netns is
        // returned to init_net as dev<ifindex>; sysfs then shows the new name. (veth would be
        // destroyed instead, so the test moves it first.)
        let l = env.link(&pod.name, "net1").unwrap();
        let dev = format!("dev{}", l.ifindex);
        run(&["ip", "-n", &pod.name, "link", "set", "net1", "name", &dev]);
        run(&[
            "ip",
            "-n",
            &pod.name,
            "link",
            "set",
            &dev,
            "netns",
            &env.host.name,
        ]);
        if i == 0 {
            plexus_sriov::fake_sysfs::FakeSysfs::new(&env.sysfs())
                .rename_netdev(pci, name, &dev)
                .unwrap();
        } // VF 1: sysfs not updated, found through the saved ifindex instead.
        assert_eq!(
            env.link(&env.host.name, &dev).unwrap().ifindex,
            before.ifindex
        );
        let path = pod.path();
        pod.delete();
        let netns = if i == 0 { path } else { String::new() }; // empty CNI_NETNS is accepted
        let (ok, out) = env.sriov("DEL", &format!("c-gone{i}"), "net1", &netns, conf);
        assert!(ok, "DEL after netns deletion: {out}");
        assert!(
            env.link(&env.host.name, &dev).is_none(),
            "{dev} renamed back"
        );
        assert_restored(&env, i as u32, before, pf_before);
    }
}

#[test]
fn second_container_is_refused_and_repeated_add_is_an_error() {
    let env = Env::new(1, 0);
    let (pci, _) = vf(0);
    let conf = bank_conf("1.0.0", &pci);
    let (ok, res) = env.sriov("ADD", "c-one", "net1", &env.pod.path(), &conf);
    assert!(ok, "{res}");
    let other = Ns::new("other");
    let (ok, err) = env.sriov("ADD", "c-two", "net1", &other.path(), &conf);
    assert!(!ok);
    assert_eq!(err["code"], 110);
    let details = err["details"].as_str().unwrap();
    assert!(
        details.contains("already attached to container c-one"),
        "{details}"
    );
    assert!(env.link(&other.name, "net1").is_none());

    let (ok, err) = env.sriov("ADD", "c-one", "net1", &env.pod.path(), &conf);
    assert!(!ok, "repeated ADD must fail");
    assert!(
        err["details"]
            .as_str()
            .unwrap()
            .contains("already attached"),
        "{err}"
    );
    // The failed ADDs did not disturb the attachment.
    let c = env.vf_config(0);
    assert_eq!(c.vlan, 100);
    assert!(env.link(&env.pod.name, "net1").is_some());
    let (ok, out) = env.sriov("DEL", "c-one", "net1", &env.pod.path(), &conf);
    assert!(ok, "{out}");
}

#[test]
fn del_twice_and_del_without_add_succeed_and_release_ipam() {
    let env = Env::new(1, 0);
    let (pci, name) = vf(0);
    let conf = bank_conf("1.1.0", &pci);
    let (ok, out) = env.sriov("DEL", "c-never", "net1", &env.pod.path(), &conf);
    assert!(ok, "DEL without ADD: {out}");
    assert!(env.ipam_log().contains("DEL c-never net1"));
    let before = env.link(&env.host.name, &name).unwrap();
    let pf_before = env.vf_config(0);
    let (ok, _) = env.sriov("ADD", "c-twice", "net1", &env.pod.path(), &conf);
    assert!(ok);
    for _ in 0..2 {
        let (ok, out) = env.sriov("DEL", "c-twice", "net1", &env.pod.path(), &conf);
        assert!(ok, "{out}");
        assert_restored(&env, 0, &before, &pf_before);
    }
}

#[test]
fn dpdk_mode_add_del() {
    let env = Env::new(0, 1);
    let (pci, _) = vf(0);
    let pf_before = env.vf_config(0);
    let conf = json!({"cniVersion":"1.1.0","name":"dpdk-net","type":"sriov","deviceID": pci,
        "vlan": 200, "vlanQoS": 3, "vlanProto": "802.1ad", "mac": "02:77:00:00:00:01",
        "link_state": "enable", "spoofchk": "off"});
    let (ok, res) = env.sriov("ADD", "c-dpdk", "net1", &env.pod.path(), &conf);
    assert!(ok, "{res}");
    assert_eq!(res["interfaces"][0]["pciID"], pci.as_str());
    assert_eq!(res["interfaces"][0]["mac"], "02:77:00:00:00:01");
    assert!(
        res["interfaces"][0].get("mtu").is_none(),
        "fake PF has no netdev here: {res}"
    );
    let c = env.vf_config(0);
    assert_eq!(
        (c.vlan, c.qos, c.proto.to_string().as_str()),
        (200, 3, "802.1ad")
    );
    assert_eq!(c.link_state, plexus_sriov::pf::LinkState::Enable);
    let (ok, out) = env.sriov("DEL", "c-dpdk", "net1", &env.pod.path(), &conf);
    assert!(ok, "{out}");
    assert_eq!(env.vf_config(0), pf_before);
    let (ok, _) = env.sriov("DEL", "c-dpdk", "net1", &env.pod.path(), &conf);
    assert!(ok);
}

#[test]
fn failed_add_rolls_back_pf_and_netdev_and_names_vf_and_step() {
    let env = Env::new(1, 0);
    let (pci, name) = vf(0);
    let before = env.link(&env.host.name, &name).unwrap();
    let pf_before = env.vf_config(0);
    let mut conf = bank_conf("1.0.0", &pci);
    conf["link_state"] = json!("disable");
    // sriov-cni #119: link_state fails after the VLAN was set; here everything is undone.
    // An ifname already taken in the pod is reported before anything is touched.
    run(&[
        "ip",
        "-n",
        &env.pod.name,
        "link",
        "add",
        "net1",
        "type",
        "veth",
        "peer",
        "name",
        "x1",
    ]);
    let (ok, err) = env.sriov("ADD", "c-fail", "net1", &env.pod.path(), &conf);
    assert!(!ok);
    assert!(
        err["details"]
            .as_str()
            .unwrap()
            .contains("net1 already exists"),
        "{err}"
    );
    assert_restored(&env, 0, &before, &pf_before);
    run(&["ip", "-n", &env.pod.name, "link", "del", "net1"]);

    // A pod netns that does not exist is reported before anything is touched.
    let (ok, err) = env.sriov(
        "ADD",
        "c-fail",
        "net1",
        "/run/netns/plxsr-does-not-exist",
        &conf,
    );
    assert!(!ok);
    assert!(
        err["details"].as_str().unwrap().contains("does not exist"),
        "{err}"
    );
    let calls = env.pf_state().calls;
    assert!(
        calls.iter().all(|c| c.op() == "get_vf"),
        "no PF change: {calls:?}"
    );
    assert_restored(&env, 0, &before, &pf_before);
    env.set_fail_at(Some("set_vf_link_state"));
    let (ok, err) = env.sriov("ADD", "c-fail", "net1", &env.pod.path(), &conf);
    assert!(!ok);
    let d = err["details"].as_str().unwrap();
    assert!(
        d.contains(&pci) && d.contains("set VF link state") && d.contains("injected"),
        "{d}"
    );
    assert_restored(&env, 0, &before, &pf_before);

    // The kernel refuses a multicast MAC on the netdev after it moved into the pod: the netdev
    // comes back and the PF-side settings are reverted.
    let mut mc = conf.clone();
    mc["mac"] = json!("01:00:5e:00:00:01");
    mc.as_object_mut().unwrap().remove("link_state");
    let (ok, err) = env.sriov("ADD", "c-fail", "net1", &env.pod.path(), &mc);
    assert!(!ok);
    assert!(
        err["details"].as_str().unwrap().contains("set netdev MAC"),
        "{err}"
    );
    assert_restored(&env, 0, &before, &pf_before);
    assert!(env.link(&env.pod.name, "net1").is_none());

    // A failure after the netdev moved (IPAM plugin missing) also brings it back.
    conf["ipam"]["type"] = json!("no-such-ipam");
    let (ok, err) = env.sriov("ADD", "c-fail", "net1", &env.pod.path(), &conf);
    assert!(!ok);
    assert!(
        err["details"].as_str().unwrap().contains("IPAM ADD"),
        "{err}"
    );
    assert_restored(&env, 0, &before, &pf_before);
    assert!(env.link(&env.pod.name, "net1").is_none());
    // Nothing is left for DEL, and DEL is still fine.
    let (ok, _) = env.sriov(
        "DEL",
        "c-fail",
        "net1",
        &env.pod.path(),
        &bank_conf("1.0.0", &pci),
    );
    assert!(ok);
}

#[test]
fn gc_releases_attachments_not_listed_and_status_version_work() {
    let env = Env::new(2, 0);
    let mut pods = Vec::new();
    let befores: Vec<_> = (0..2)
        .map(|i| env.link(&env.host.name, &vf(i).1).unwrap())
        .collect();
    for i in 0..2u32 {
        let pod = Ns::new("gc");
        let (ok, res) = env.sriov(
            "ADD",
            &format!("c-gc{i}"),
            "net1",
            &pod.path(),
            &bank_conf("1.1.0", &vf(i).0),
        );
        assert!(ok, "{res}");
        pods.push(pod);
    }
    let gc = json!({"cniVersion":"1.1.0","name":"bank-net","type":"sriov",
        "ipam": {"type": "static"},
        "cni.dev/valid-attachments": [{"containerID": "c-gc0", "ifname": "net1"}]});
    let (ok, out) = env.sriov("GC", "", "", "", &gc);
    assert!(ok, "{out}");
    assert!(
        env.link(&pods[0].name, "net1").is_some(),
        "valid attachment kept"
    );
    assert_eq!(
        env.link(&env.host.name, "vf1").as_ref(),
        Some(&befores[1]),
        "stale VF returned"
    );
    assert!(env.ipam_log().contains("DEL c-gc1 net1"));
    assert!(!env.ipam_log().contains("DEL c-gc0 net1"));

    let (ok, out) = env.sriov("STATUS", "", "", "", &gc);
    assert!(ok, "{out}");
    let (ok, v) = env.sriov("VERSION", "", "", "", &json!({"cniVersion":"1.1.0"}));
    assert!(ok);
    assert!(v["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&Value::from("1.1.0")));
}

#[test]
fn list_shows_vfs_settings_and_holder() {
    let env = Env::new(1, 1);
    let (pci, _) = vf(0);
    let (ok, _) = env.sriov(
        "ADD",
        "c-list",
        "net1",
        &env.pod.path(),
        &bank_conf("1.0.0", &pci),
    );
    assert!(ok);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sriov-fake-pf"))
        .args(["list", "--json"])
        .env("PLEXUS_SYSFS_ROOT", env.sysfs())
        .env("PLEXUS_SRIOV_STATE_DIR", env.state_dir())
        .env("PLEXUS_SRIOV_FAKE_PF", env.fake_pf())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 2);
    assert_eq!(rows[0]["pci"], pci.as_str());
    assert_eq!(rows[0]["containerId"], "c-list");
    assert_eq!(rows[0]["config"]["vlan"], 100);
    assert_eq!(rows[1]["driver"], "vfio-pci");
    assert!(rows[1]["containerId"].is_null());
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_sriov-fake-pf"))
        .args(["list", "--sysfs-root"])
        .arg(env.sysfs())
        .args(["--state-dir"])
        .arg(env.state_dir())
        .env("PLEXUS_SRIOV_FAKE_PF", env.fake_pf())
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(
        t.starts_with("PF ") && t.contains("c-list") && t.contains("vfio-pci"),
        "{t}"
    );
    let (ok, _) = env.sriov(
        "DEL",
        "c-list",
        "net1",
        &env.pod.path(),
        &bank_conf("1.0.0", &pci),
    );
    assert!(ok);
}

#[test]
fn concurrent_adds_for_one_vf_one_wins_one_is_refused() {
    let env = std::sync::Arc::new(Env::new(1, 0));
    let (pci, _) = vf(0);
    let pods = [Ns::new("ca"), Ns::new("cb")];
    let results: Vec<(bool, Value)> = std::thread::scope(|s| {
        let hs: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let env = env.clone();
                let conf = bank_conf("1.0.0", &pci);
                let path = p.path();
                s.spawn(move || env.sriov("ADD", &format!("c-race{i}"), "net1", &path, &conf))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wins = results.iter().filter(|(ok, _)| *ok).count();
    assert_eq!(wins, 1, "{results:?}");
    let loser = results.iter().find(|(ok, _)| !*ok).unwrap();
    assert_eq!(loser.1["code"], 110, "{loser:?}");
    let w = results.iter().position(|(ok, _)| *ok).unwrap();
    let (ok, out) = env.sriov(
        "DEL",
        &format!("c-race{w}"),
        "net1",
        &pods[w].path(),
        &bank_conf("1.0.0", &pci),
    );
    assert!(ok, "{out}");
}

#[test]
fn gratuitous_arp_reaches_the_wire() {
    let env = Env::new(1, 0);
    let (pci, _) = vf(0);
    // The veth peer plays the switch/neighbour: it learns the pod's MAC only from our GARP
    // (the address is configured after link-up, so the kernel's arp_notify cannot send it).
    run(&[
        "ip",
        "-n",
        &env.host.name,
        "addr",
        "add",
        "10.10.0.1/24",
        "dev",
        "vf0p",
    ]);
    run(&[
        "ip",
        "netns",
        "exec",
        &env.host.name,
        "sysctl",
        "-qw",
        "net.ipv4.conf.vf0p.arp_accept=1",
    ]);
    let (ok, res) = env.sriov(
        "ADD",
        "c-garp",
        "net1",
        &env.pod.path(),
        &bank_conf("1.0.0", &pci),
    );
    assert!(ok, "{res}");
    let mut neigh = String::new();
    for _ in 0..50 {
        neigh = run(&[
            "ip",
            "-n",
            &env.host.name,
            "neigh",
            "show",
            "10.10.0.5",
            "dev",
            "vf0p",
        ]);
        if neigh.contains("02:66:00:00:00:01") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        neigh.contains("lladdr 02:66:00:00:00:01"),
        "neighbour not learned: {neigh:?}"
    );
    let (ok, _) = env.sriov(
        "DEL",
        "c-garp",
        "net1",
        &env.pod.path(),
        &bank_conf("1.0.0", &pci),
    );
    assert!(ok);
}

#[test]
fn dead_holder_is_taken_over_without_losing_the_original_state() {
    let env = Env::new(1, 0);
    let (pci, name) = vf(0);
    let before = env.link(&env.host.name, &name).unwrap();
    let pf_before = env.vf_config(0);
    let conf = bank_conf("1.0.0", &pci);
    let mut old = Ns::new("old");
    let (ok, res) = env.sriov("ADD", "c-old", "net1", &old.path(), &conf);
    assert!(ok, "{res}");
    // The pod dies without a DEL (kubelet lost, node reboot): kernel returns the VF as devN.
    let l = env.link(&old.name, "net1").unwrap();
    let dev = format!("dev{}", l.ifindex);
    run(&["ip", "-n", &old.name, "link", "set", "net1", "name", &dev]);
    run(&[
        "ip",
        "-n",
        &old.name,
        "link",
        "set",
        &dev,
        "netns",
        &env.host.name,
    ]);
    plexus_sriov::fake_sysfs::FakeSysfs::new(&env.sysfs())
        .rename_netdev(&pci, &name, &dev)
        .unwrap();
    old.delete();

    let (ok, res) = env.sriov("ADD", "c-new", "net1", &env.pod.path(), &conf);
    assert!(ok, "takeover ADD: {res}");
    // The late DEL of the dead pod must not touch the VF the new pod holds (sriov-cni #219).
    let (ok, out) = env.sriov("DEL", "c-old", "net1", "", &conf);
    assert!(ok, "{out}");
    assert!(env.link(&env.pod.name, "net1").is_some());
    assert_eq!(env.vf_config(0).vlan, 100);
    let (ok, out) = env.sriov("DEL", "c-new", "net1", &env.pod.path(), &conf);
    assert!(ok, "{out}");
    // Original name, not the dev<N> the new ADD found.
    assert_restored(&env, 0, &before, &pf_before);
}

#[test]
fn stale_altname_equal_to_pod_ifname_does_not_block_attach() {
    let env = Env::new(1, 0);
    let (pci, name) = vf(0);
    // Left behind by an earlier pod on kernels that keep renamed names as altnames (#445).
    run(&[
        "ip",
        "-n",
        &env.host.name,
        "link",
        "property",
        "add",
        "dev",
        &name,
        "altname",
        "net1",
    ]);
    let before = env.link(&env.host.name, &name).unwrap();
    let conf = bank_conf("1.0.0", &pci);
    let (ok, res) = env.sriov("ADD", "c-alt", "net1", &env.pod.path(), &conf);
    assert!(ok, "{res}");
    assert!(env.link(&env.pod.name, "net1").is_some());
    let (ok, out) = env.sriov("DEL", "c-alt", "net1", &env.pod.path(), &conf);
    assert!(ok, "{out}");
    assert_eq!(env.link(&env.host.name, &name).as_ref(), Some(&before));
    let alt = run(&[
        "ip",
        "-n",
        &env.host.name,
        "-j",
        "link",
        "show",
        "dev",
        &name,
    ]);
    assert!(!alt.contains("\"net1\""), "stale altname dropped: {alt}");
}

#[test]
fn check_detects_pf_side_drift_and_missing_attachment() {
    let env = Env::new(1, 1);
    let (pci, _) = vf(0);
    let (dpdk_pci, _) = vf(1);
    let conf = bank_conf("1.1.0", &pci);
    let (ok, err) = env.sriov("CHECK", "c-chk", "net1", &env.pod.path(), &conf);
    assert!(!ok);
    assert!(
        err["details"].as_str().unwrap().contains("no attachment"),
        "{err}"
    );
    let (ok, res) = env.sriov("ADD", "c-chk", "net1", &env.pod.path(), &conf);
    assert!(ok, "{res}");
    let mut chk = conf.clone();
    chk["prevResult"] = res;
    let (ok, out) = env.sriov("CHECK", "c-chk", "net1", &env.pod.path(), &chk);
    assert!(ok, "{out}");
    // Someone changes the VF behind our back on the PF.
    let mut st = env.pf_state();
    st.pfs.get_mut(PF).unwrap()[0].vlan = 7;
    st.pfs.get_mut(PF).unwrap()[0].trust = true;
    plexus_sriov::pf_fake::FilePf::create(&env.fake_pf(), &st).unwrap();
    let (ok, err) = env.sriov("CHECK", "c-chk", "net1", &env.pod.path(), &chk);
    assert!(!ok);
    let d = err["details"].as_str().unwrap();
    assert!(
        d.contains("vlan 7/0/802.1q want 100/0/802.1q") && d.contains("trust true"),
        "{d}"
    );
    assert_eq!(err["code"], 111);
    // A removed address is noticed too.
    run(&[
        "ip",
        "-n",
        &env.pod.name,
        "addr",
        "del",
        "10.10.0.5/24",
        "dev",
        "net1",
    ]);
    let (_, err) = env.sriov("CHECK", "c-chk", "net1", &env.pod.path(), &chk);
    assert!(
        err["details"]
            .as_str()
            .unwrap()
            .contains("address 10.10.0.5/24 missing"),
        "{err}"
    );
    let (ok, _) = env.sriov("DEL", "c-chk", "net1", &env.pod.path(), &conf);
    assert!(ok);

    // DPDK: CHECK covers the PF side only.
    let d =
        json!({"cniVersion":"1.1.0","name":"dpdk","type":"sriov","deviceID": dpdk_pci, "vlan": 9});
    let (ok, _) = env.sriov("ADD", "c-chk2", "net1", &env.pod.path(), &d);
    assert!(ok);
    let (ok, out) = env.sriov("CHECK", "c-chk2", "net1", &env.pod.path(), &d);
    assert!(ok, "{out}");
    let (ok, _) = env.sriov("DEL", "c-chk2", "net1", &env.pod.path(), &d);
    assert!(ok);
}

#[test]
fn unsolicited_na_reaches_the_wire() {
    let env = Env::new(1, 0);
    let (pci, _) = vf(0);
    let h = env.host.name.clone();
    // The kernel learns untracked NAs only as a router (ndisc_recv_na: forwarding + knob).
    run(&[
        "ip",
        "netns",
        "exec",
        &h,
        "sysctl",
        "-qw",
        "net.ipv6.conf.vf0p.forwarding=1",
    ]);
    run(&[
        "ip",
        "netns",
        "exec",
        &h,
        "sysctl",
        "-qw",
        "net.ipv6.conf.vf0p.accept_untracked_na=1",
    ]);
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
    conf["ipam"]["addresses"] = json!([{"address": "fd00:10::5/64"}]);
    conf["ipam"]["routes"] = json!([]);
    let (ok, res) = env.sriov("ADD", "c-na", "net1", &env.pod.path(), &conf);
    assert!(ok, "{res}");
    let mut neigh = String::new();
    for _ in 0..50 {
        neigh = run(&[
            "ip",
            "-n",
            &h,
            "-6",
            "neigh",
            "show",
            "fd00:10::5",
            "dev",
            "vf0p",
        ]);
        if neigh.contains("02:66:00:00:00:01") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        neigh.contains("lladdr 02:66:00:00:00:01"),
        "neighbour not learned: {neigh:?}"
    );
    let (ok, _) = env.sriov("DEL", "c-na", "net1", &env.pod.path(), &conf);
    assert!(ok);
}

/// What the VM tier shows on a real kernel (igbvf, Linux 6.1): a VF in a destroyed netns comes
/// back under the name it had in the pod (`net1`) when that name is free in the host (only a
/// clash gives `dev<ifindex>`). Here sysfs is not updated either, so DEL finds it by ifindex.
#[test]
fn vf_returned_under_its_pod_name_is_renamed_back() {
    let env = Env::new(1, 0);
    let (pci, name) = vf(0);
    let before = env.link(&env.host.name, &name).unwrap();
    let pf_before = env.vf_config(0);
    let mut pod = Ns::new("gone");
    let conf = bank_conf("1.0.0", &pci);
    let (ok, res) = env.sriov("ADD", "c-podname", "net1", &pod.path(), &conf);
    assert!(ok, "{res}");
    run(&[
        "ip",
        "-n",
        &pod.name,
        "link",
        "set",
        "net1",
        "netns",
        &env.host.name,
    ]);
    pod.delete();
    assert!(env.link(&env.host.name, "net1").is_some());
    let (ok, out) = env.sriov("DEL", "c-podname", "net1", "", &conf);
    assert!(ok, "DEL after netns deletion: {out}");
    assert!(env.link(&env.host.name, "net1").is_none(), "renamed back");
    assert_restored(&env, 0, &before, &pf_before);
}

/// The fake PF's `igb` model (checked against the real driver by the VM tier): the settings
/// igb refuses fail at their step with the kernel's errno and roll back everything before them.
#[test]
fn igb_model_refusals_roll_back_the_whole_add() {
    let env = Env::new(1, 0);
    let (pci, name) = vf(0);
    let before = env.link(&env.host.name, &name).unwrap();
    let pf_before = env.vf_config(0);
    let mut st = env.pf_state();
    st.driver = plexus_sriov::pf_fake::FakeDriver::Igb;
    plexus_sriov::pf_fake::FilePf::create(&env.fake_pf(), &st).unwrap();
    for (extra, step, errno) in [
        (
            json!({"link_state": "enable"}),
            "set VF link state",
            "os error 95",
        ),
        (
            json!({"vlanProto": "802.1ad"}),
            "set VF vlan",
            "os error 93",
        ),
        (json!({"min_tx_rate": 10}), "set VF tx rate", "os error 22"),
    ] {
        let mut conf = bank_conf("1.0.0", &pci);
        for (k, v) in extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        let (ok, err) = env.sriov("ADD", "c-igb", "net1", &env.pod.path(), &conf);
        assert!(!ok, "{extra}: {err}");
        let details = err["details"].as_str().unwrap_or_default();
        assert!(
            details.contains(step) && details.contains(errno),
            "{details}"
        );
        assert_restored(&env, 0, &before, &pf_before);
        assert!(env.link(&env.pod.name, "net1").is_none());
    }
}
