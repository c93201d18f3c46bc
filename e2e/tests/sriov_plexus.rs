//! The SR-IOV delegate through plexus: a NAD of `"type": "sriov"` (deviceID in the NAD) in the
//! test API server; plexus runs as usual and execs `sriov` from its `binDir`, where a wrapper
//! runs the real binary inside a per-test "host" netns whose veth ends stand in for VF netdevs
//! (the machine's own links stay untouched); a fake sysfs tree and the file-backed fake PF
//! stand in for the hardware.

mod common;

use common::fake_pf::*;
use common::*;
use plexus_e2e::{nad_policy_allowing, Access, TestApiServer, TestApiServerOptions};
use plexus_sriov::fake_sysfs::FakeSysfs;
use plexus_sriov::pf_fake::FilePf;
use serde_json::{json, Value};
use std::path::PathBuf;

struct Rig {
    extra: Value,
    host: Netns,
    bridge: HostLink,
    api: TestApiServer,
    dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let (host, _) = fake_pf_host(dir.path());
        let api = TestApiServer::start(TestApiServerOptions::default()).unwrap();
        api.add_token("t", Access::Full);
        api.write_kubeconfig(&dir.path().join("kubeconfig"), "t")
            .unwrap();
        let nad = json!({"cniVersion":"1.0.0","type":"sriov","deviceID":VF0,"vlan":100,"max_tx_rate":1000,"trust":"off","spoofchk":"on",
            "ipam":{"type":"static","addresses":[{"address":"10.56.217.10/24","gateway":"10.56.217.1"}]}});
        api.put_nad("bank", "sriov-data", &nad.to_string(), &[])
            .unwrap();
        Rig {
            host,
            api,
            dir,
            bridge: HostLink::bridge_name(),
            extra: json!({}),
        }
    }
    fn p(&self, s: &str) -> PathBuf {
        self.dir.path().join(s)
    }
    fn pf(&self) -> Value {
        serde_json::to_value(FilePf::new(self.p("pf.json")).load().unwrap()).unwrap()
    }
    fn set_fail_at(&self, op: &str) {
        let mut st = FilePf::new(self.p("pf.json")).load().unwrap();
        st.fail_at = Some(op.to_string());
        FilePf::create(&self.p("pf.json"), &st).unwrap();
    }
    fn vf_pf_side(&self) -> Value {
        let mut v = self.pf()["pfs"][PF][0].clone();
        v.as_object_mut().unwrap().remove("calls");
        v
    }
    fn pod(&self, name: &str) -> String {
        let uid = format!("uid-{name}");
        self.api.put_pod(json!({"metadata":{"name":name,"namespace":"bank","uid":uid,
            "annotations":{"k8s.v1.cni.cncf.io/networks":"sriov-data"}},"spec":{"containers":[{"name":"db","image":"pg"}]}})).unwrap();
        uid
    }
    /// Run plexus (in the root netns, like the kubelet does).
    fn plexus(&self, cmd: &str, pod: &str, netns: &str) -> Run {
        let conf = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","kubeconfig":self.p("kubeconfig"),
            "cniDir":self.p("state"),"binDir":self.p("bin"),"logFile":self.p("plexus.log"),"logLevel":"debug","logToStderr":false,
            "delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":self.bridge.0,"isGateway":true,
                "ipam":{"type":"host-local","dataDir":self.p("ipam"),"ranges":[[{"subnet":"10.244.77.0/24"}]]}}],
            "nadPolicy":nad_policy_allowing(&[self.dir.path()])});
        let mut conf = conf;
        for (k, v) in self.extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=bank;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"
        );
        let cid = format!("cid-{pod}");
        let (sysfs, state, pf) = (self.p("sys"), self.p("sriov-state"), self.p("pf.json"));
        let log_dir = self.p("sriov-log");
        let env = [
            ("PLEXUS_SYSFS_ROOT", sysfs.to_str().unwrap()),
            ("PLEXUS_SRIOV_STATE_DIR", state.to_str().unwrap()),
            ("PLEXUS_SRIOV_FAKE_PF", pf.to_str().unwrap()),
            ("PLEXUS_SRIOV_LOG_DIR", log_dir.to_str().unwrap()),
        ];
        let call = Call {
            command: cmd,
            container_id: &cid,
            netns,
            ifname: "eth0",
            args: &args,
        };
        run(&bin("plexus"), &call, &conf, &env)
    }

    fn host_vf(&self) -> Value {
        let v: Value = serde_json::from_str(&self.host.ip(&["-j", "link", "show", "vf0"]))
            .unwrap_or(json!([]));
        v[0].clone()
    }
}

#[test]
fn bank_scenario_add_check_del_restores_everything() {
    let rig = Rig::new();
    let pod = Netns::new();
    let before_pf = rig.vf_pf_side();
    let before_link = rig.host_vf();
    rig.pod("pg-0");
    rig.plexus("ADD", "pg-0", &pod.path()).ok();
    assert_eq!(pod.addrs("net1"), vec!["10.56.217.10/24"]);
    assert!(rig.host_vf().is_null(), "the VF netdev moved into the pod");
    let vf = rig.vf_pf_side();
    assert_eq!(vf["vlan"], 100, "{vf}");
    assert_eq!(vf["maxTxRate"], 1000, "{vf}");
    assert_eq!(vf["trust"], false, "{vf}");
    let status: Value = serde_json::from_str(
        rig.api.get_pod("bank", "pg-0").unwrap()["metadata"]["annotations"]
            ["k8s.v1.cni.cncf.io/network-status"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(status[1]["name"], "bank/sriov-data");
    assert_eq!(status[1]["ips"], json!(["10.56.217.10"]));
    assert_eq!(
        status[1]["device-info"],
        json!({"type":"pci","version":"1.1.0","pci":{"pci-address":VF0}})
    );
    assert!(status[0].get("device-info").is_none());
    rig.plexus("CHECK", "pg-0", &pod.path()).ok();
    rig.plexus("DEL", "pg-0", &pod.path()).ok();
    assert_eq!(rig.vf_pf_side(), before_pf, "PF side restored");
    let after = rig.host_vf();
    assert_eq!(after["ifname"], before_link["ifname"]);
    assert_eq!(after["address"], before_link["address"]);
    assert_eq!(after["mtu"], before_link["mtu"]);
    assert_eq!(pod.links(), vec!["lo"]);
}

#[test]
fn failure_at_each_pf_step_leaves_nothing_changed() {
    for op in [
        "set_vf_vlan",
        "set_vf_rate",
        "set_vf_spoofchk",
        "set_vf_trust",
    ] {
        let rig = Rig::new();
        let pod = Netns::new();
        let before_pf = rig.vf_pf_side();
        let before_link = rig.host_vf();
        rig.pod("pg-f");
        rig.set_fail_at(op);
        let r = rig.plexus("ADD", "pg-f", &pod.path());
        let e = r.err();
        let text = e.to_string();
        assert!(
            text.contains("pod bank/pg-f") && text.contains("bank/sriov-data"),
            "{op}: {e}"
        );
        assert_eq!(rig.vf_pf_side(), before_pf, "{op}: PF side restored");
        assert_eq!(rig.host_vf()["address"], before_link["address"], "{op}");
        assert_eq!(rig.host_vf()["ifname"], "vf0", "{op}");
        assert_eq!(pod.links(), vec!["lo"], "{op}: eth0 rolled back too");
        rig.plexus("DEL", "pg-f", "").ok();
    }
}

#[test]
fn netns_gone_before_del_brings_vf_back_under_its_name() {
    let rig = Rig::new();
    let pod = Netns::new();
    rig.pod("pg-1");
    rig.plexus("ADD", "pg-1", &pod.path()).ok();
    // Emulate the kernel returning a physical netdev of a dying netns to the host as dev<ifindex>
    // (a veth would be destroyed instead), with sysfs showing the new name.
    let idx: Value = serde_json::from_str(&pod.ip(&["-j", "link", "show", "net1"])).unwrap();
    let dev = format!("dev{}", idx[0]["ifindex"]);
    pod.ip(&["link", "set", "net1", "name", &dev]);
    pod.ip(&["link", "set", &dev, "netns", &rig.host.name]);
    FakeSysfs::new(&rig.p("sys"))
        .rename_netdev(VF0, "vf0", &dev)
        .unwrap();
    pod.delete();
    rig.plexus("DEL", "pg-1", "").ok();
    rig.plexus("DEL", "pg-1", "").ok();
    assert_eq!(rig.host_vf()["ifname"], "vf0");
    assert_eq!(rig.host_vf()["address"], "02:00:00:00:00:10");
    assert_eq!(rig.vf_pf_side()["vlan"], 0);
}

#[test]
fn two_pods_asking_for_the_same_vf() {
    let rig = Rig::new();
    let (a, b) = (Netns::new(), Netns::new());
    rig.pod("pg-a");
    rig.pod("pg-b");
    rig.plexus("ADD", "pg-a", &a.path()).ok();
    // The NAD's static address is held by pg-a: refused (11) before the VF is even tried.
    let e = rig.plexus("ADD", "pg-b", &b.path()).err().clone();
    assert_eq!(e["code"], 11, "{e}");
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("address 10.56.217.10 is in use by pod bank/pg-a"),
        "{e}"
    );
    // With an address of its own, the VF conflict itself refuses pg-b.
    let nad = json!({"cniVersion":"1.0.0","type":"sriov","deviceID":VF0,"vlan":100,
        "ipam":{"type":"static","addresses":[{"address":"10.56.217.11/24"}]}});
    rig.api
        .put_nad("bank", "sriov-data", &nad.to_string(), &[])
        .unwrap();
    let e = rig.plexus("ADD", "pg-b", &b.path()).err().clone();
    assert!(e.to_string().contains(VF0), "{e}");
    assert_eq!(b.links(), vec!["lo"], "second pod rolled back");
    assert_eq!(
        a.addrs("net1"),
        vec!["10.56.217.10/24"],
        "first pod untouched"
    );
    rig.plexus("DEL", "pg-b", "").ok();
    assert_eq!(
        a.addrs("net1"),
        vec!["10.56.217.10/24"],
        "a late DEL of the refused pod leaves the VF alone"
    );
    rig.plexus("DEL", "pg-a", &a.path()).ok();
    assert_eq!(rig.host_vf()["ifname"], "vf0");
}

/// The NAD of sriov-cni's README, unchanged: no deviceID; the VF comes from the device plugin
/// (`k8s.v1.cni.cncf.io/resourceName`), looked up in the kubelet's device-manager checkpoint.
#[test]
fn sriov_cni_readme_nad_with_device_plugin_resource() {
    let mut rig = Rig::new();
    let readme_config = r#"{
  "type": "sriov",
  "cniVersion": "0.3.1",
  "name": "sriov-network",
  "ipam": {
    "type": "host-local",
    "subnet": "10.56.217.0/24",
    "routes": [{ "dst": "0.0.0.0/0" }],
    "gateway": "10.56.217.1"
  }
}"#;
    let ipam_dir = std::path::Path::new("/var/lib/cni/networks/sriov-network");
    let ipam_dir_existed = ipam_dir.exists();
    // host-local creates the parents too: those that did not exist go with it.
    let parents_missing: Vec<&std::path::Path> = ipam_dir
        .ancestors()
        .skip(1)
        .take_while(|a| !a.exists())
        .collect();
    rig.api
        .put_nad(
            "bank",
            "sriov-net1",
            readme_config,
            &[(
                "k8s.v1.cni.cncf.io/resourceName",
                "intel.com/intel_sriov_netdevice",
            )],
        )
        .unwrap();
    rig.api
        .put_pod(json!({"metadata":{"name":"dp","namespace":"bank","uid":"uid-dp",
            "annotations":{"k8s.v1.cni.cncf.io/networks":"sriov-net1"}},"spec":{"containers":[{"name":"db","image":"pg"}]}}))
        .unwrap();
    let checkpoint = json!({"Data":{"PodDeviceEntries":[
        {"PodUID":"uid-dp","ContainerName":"db","ResourceName":"intel.com/intel_sriov_netdevice","DeviceIDs":{"0":[VF0]},"AllocResp":""},
        {"PodUID":"someone-else","ContainerName":"x","ResourceName":"intel.com/intel_sriov_netdevice","DeviceIDs":{"0":["0000:af:06.7"]},"AllocResp":""}],
        "RegisteredDevices":{"intel.com/intel_sriov_netdevice":[VF0,"0000:af:06.7"]}},"Checksum":0});
    std::fs::write(rig.p("checkpoint"), checkpoint.to_string()).unwrap();
    rig.extra = json!({"deviceCheckpointFile": rig.p("checkpoint"), "podResourcesSocket": rig.p("no-kubelet.sock")});
    let pod = Netns::new();
    rig.plexus("ADD", "dp", &pod.path()).ok();
    let addrs = pod.addrs("net1");
    assert!(
        addrs.len() == 1 && addrs[0].starts_with("10.56.217.") && addrs[0].ends_with("/24"),
        "{addrs:?}"
    );
    assert!(rig.host_vf().is_null(), "VF {VF0} moved into the pod");
    rig.plexus("CHECK", "dp", &pod.path()).ok();
    rig.plexus("DEL", "dp", &pod.path()).ok();
    assert_eq!(rig.host_vf()["ifname"], "vf0");
    assert_eq!(pod.links(), vec!["lo"]);
    if !ipam_dir_existed {
        let _ = std::fs::remove_dir_all(ipam_dir);
        for p in &parents_missing {
            let _ = std::fs::remove_dir(p);
        }
    }
}

#[test]
fn device_plugin_network_without_an_allocation_is_a_clear_error() {
    let mut rig = Rig::new();
    rig.api
        .put_nad(
            "bank",
            "sriov-dp",
            &json!({"cniVersion":"1.0.0","type":"sriov","name":"sriov-dp"}).to_string(),
            &[(
                "k8s.v1.cni.cncf.io/resourceName",
                "intel.com/intel_sriov_netdevice",
            )],
        )
        .unwrap();
    rig.api
        .put_pod(json!({"metadata":{"name":"nodev","namespace":"bank","uid":"uid-nodev",
            "annotations":{"k8s.v1.cni.cncf.io/networks":"sriov-dp"}},"spec":{"containers":[{"name":"db","image":"pg"}]}}))
        .unwrap();
    std::fs::write(
        rig.p("checkpoint"),
        r#"{"Data":{"PodDeviceEntries":[]},"Checksum":0}"#,
    )
    .unwrap();
    rig.extra = json!({"deviceCheckpointFile": rig.p("checkpoint"), "podResourcesSocket": rig.p("no-kubelet.sock")});
    let pod = Netns::new();
    let e = rig.plexus("ADD", "nodev", &pod.path()).err().clone();
    let text = e.to_string();
    assert!(
        text.contains("pod bank/nodev")
            && text.contains("bank/sriov-dp")
            && text.contains("intel.com/intel_sriov_netdevice"),
        "{e}"
    );
    assert_eq!(pod.links(), vec!["lo"]);
}

/// The same device-plugin network, with the allocation answered by the kubelet pod-resources
/// gRPC API over its Unix socket (the path Multus prefers), and no checkpoint file at all.
#[test]
fn device_plugin_allocation_from_the_pod_resources_api() {
    use plexus_e2e::fake_kubelet::{FakeKubelet, FakeKubeletOptions, FakePod};
    let mut rig = Rig::new();
    let nad = json!({"cniVersion":"1.0.0","type":"sriov","name":"sriov-dp",
        "ipam":{"type":"static","addresses":[{"address":"10.56.218.10/24"}]}});
    rig.api
        .put_nad(
            "bank",
            "sriov-dp",
            &nad.to_string(),
            &[(
                "k8s.v1.cni.cncf.io/resourceName",
                "intel.com/intel_sriov_netdevice",
            )],
        )
        .unwrap();
    rig.api
        .put_pod(json!({"metadata":{"name":"grpc","namespace":"bank","uid":"uid-grpc",
            "annotations":{"k8s.v1.cni.cncf.io/networks":"sriov-dp"}},"spec":{"containers":[{"name":"db","image":"pg"}]}}))
        .unwrap();
    let socket = rig.p("kubelet.sock");
    let kubelet = FakeKubelet::start(
        &socket,
        vec![
            FakePod::new("bank", "grpc").with_devices(
                "db",
                "intel.com/intel_sriov_netdevice",
                &[VF0],
            ),
            FakePod::new("bank", "other").with_devices(
                "db",
                "intel.com/intel_sriov_netdevice",
                &["0000:af:06.7"],
            ),
        ],
        FakeKubeletOptions {
            implement_get: true,
            ..FakeKubeletOptions::default()
        },
    )
    .unwrap();
    rig.extra =
        json!({"podResourcesSocket": socket, "deviceCheckpointFile": rig.p("no-checkpoint")});
    let pod = Netns::new();
    rig.plexus("ADD", "grpc", &pod.path()).ok();
    assert_eq!(pod.addrs("net1"), vec!["10.56.218.10/24"]);
    assert_eq!(kubelet.requests(), 1, "one pod-resources call per ADD");
    rig.plexus("DEL", "grpc", &pod.path()).ok();
    assert_eq!(kubelet.requests(), 1, "DEL asks nobody");
    assert_eq!(rig.host_vf()["ifname"], "vf0");
}

/// The rig's NAD with `extra` keys and host-local IPAM (leases under `vf-ipam`).
fn put_nad_with(rig: &Rig, extra: Value) {
    let mut nad = json!({"cniVersion":"1.0.0","type":"sriov","deviceID":VF0,"vlan":100,
        "ipam":{"type":"host-local","dataDir":rig.p("vf-ipam"),"ranges":[[{"subnet":"10.56.219.0/24"}]]}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        nad[k] = v.clone();
    }
    rig.api
        .put_nad("bank", "sriov-data", &nad.to_string(), &[])
        .unwrap();
}

fn leases(rig: &Rig) -> Vec<String> {
    let mut v = files_under(&rig.p("vf-ipam"));
    v.retain(|f| f.contains("10.56.219."));
    v
}

#[test]
fn sriov_del_with_a_corrupt_state_file_still_releases_ipam() {
    let rig = Rig::new();
    put_nad_with(&rig, json!({}));
    let pod = Netns::new();
    rig.pod("pg-c");
    rig.plexus("ADD", "pg-c", &pod.path()).ok();
    assert_eq!(
        leases(&rig).len(),
        1,
        "{:?}",
        files_under(&rig.p("vf-ipam"))
    );
    let state = rig.p("sriov-state/cid-pg-c-net1.json");
    assert!(state.exists());
    assert!(rig.p(&format!("sriov-state/pci/{VF0}.json")).exists());
    std::fs::write(&state, b"\x00\x01{trunc").unwrap();
    // The runtime's DEL succeeds, releases the lease and the VF, and keeps the file aside.
    rig.plexus("DEL", "pg-c", &pod.path()).ok();
    assert!(leases(&rig).is_empty(), "{:?}", leases(&rig));
    assert!(!state.exists());
    assert!(rig.p("sriov-state/cid-pg-c-net1.json.corrupt").exists());
    assert!(!rig.p(&format!("sriov-state/pci/{VF0}.json")).exists());
    rig.plexus("DEL", "pg-c", &pod.path()).ok();
    rig.plexus("DEL", "pg-c", "").ok();
    assert!(files_under(&rig.p("state/plans")).is_empty());
}

#[test]
fn a_nad_log_file_cannot_steer_root_writes() {
    use std::os::unix::fs::PermissionsExt;
    // Every file below is under the rig's directory, which the node's NAD policy allows: what
    // is checked is the delegate's own confinement to PLEXUS_SRIOV_LOG_DIR (`sriov-log`).
    let mut rig = Rig::new();
    let dir = rig.p("sriov-log");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let target = rig.p("target");
    std::fs::write(&target, b"keep").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&target, dir.join("link.log")).unwrap();
    std::fs::write(dir.join("old.log"), b"").unwrap();
    std::fs::set_permissions(dir.join("old.log"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let outside = rig.p("outside.log");
    for (i, (file, written)) in [
        (outside.clone(), None),
        (dir.join("link.log"), None),
        (dir.join("../outside.log"), None),
        (dir.join("old.log"), Some(dir.join("old.log"))),
        (dir.join("new.log"), Some(dir.join("new.log"))),
    ]
    .into_iter()
    .enumerate()
    {
        put_nad_with(&rig, json!({"logFile": file, "logLevel": "debug"}));
        let pod = Netns::new();
        let name = format!("pg-log{i}");
        rig.pod(&name);
        rig.extra = json!({});
        if file.to_string_lossy().contains("/../") {
            // A `..` is refused by the node's NAD policy before any delegate runs…
            let e = rig.plexus("ADD", &name, &pod.path()).err().clone();
            let msg = e["msg"].as_str().unwrap_or_default();
            assert_eq!(e["code"], 7, "{e}");
            assert!(msg.contains("logFile") && msg.contains("NAD policy"), "{e}");
            rig.plexus("DEL", &name, &pod.path()).ok();
            assert_eq!(pod.links(), vec!["lo"], "{}", file.display());
            // …and the delegate refuses it without that policy too (paths only audited).
            let mut audit = nad_policy_allowing(&[rig.dir.path()]);
            audit["paths"]["mode"] = json!("audit");
            rig.extra = json!({ "nadPolicy": audit });
        }
        // The key is accepted: the attachment works either way.
        rig.plexus("ADD", &name, &pod.path()).ok();
        rig.plexus("DEL", &name, &pod.path()).ok();
        assert!(
            !outside.exists(),
            "{}: wrote outside the log dir",
            file.display()
        );
        assert_eq!(
            std::fs::read(&target).unwrap(),
            b"keep",
            "{}",
            file.display()
        );
        assert_eq!(mode(&target), 0o644, "{}", file.display());
        match written {
            Some(p) => {
                assert!(std::fs::metadata(&p).unwrap().len() > 0, "{}", p.display());
                assert_eq!(mode(&p), 0o600, "{}", p.display());
            }
            None => {
                let log = std::fs::read_to_string(rig.p("plexus.log")).unwrap_or_default();
                assert!(
                    log.contains(&format!("logFile {} refused", file.display())),
                    "{}: no warning in the plexus log",
                    file.display()
                );
            }
        }
    }
}
