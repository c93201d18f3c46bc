//! The SR-IOV network operator's NADs (sriov/tests/fixtures/operator, rendered as the operator
//! renders them) through plexus, unchanged: each NAD is stored in the test API server with the
//! operator's annotations (the device plugin's `resourceName`, its owner reference), a pod asks
//! for it, the VF comes from the kubelet's device checkpoint, and plexus runs its `sriov`
//! against the fake PF in a per-test "host" netns (the machine's own links are never touched).
//! What the NAD asks must be on the VF and in the pod after ADD; CHECK passes; DEL restores.

mod common;

use common::fake_pf::*;
use common::*;
use plexus_e2e::{Access, TestApiServer, TestApiServerOptions};
use plexus_sriov::pf::VfConfig;
use plexus_sriov::pf_fake::FilePf;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

fn fixture(file: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sriov/tests/fixtures/operator")
        .join(file);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

/// An IPAM plugin standing in for host-local and whereabouts (no node directory, no API):
/// records the config it gets and answers ADD with `addr`.
fn recording_ipam(dir: &Path, name: &str, addr: &str) {
    let script = format!(
        r#"#!/bin/sh
conf=$(cat)
d=$(dirname "$0")
printf '%s' "$conf" > "$d/{name}.$CNI_COMMAND.json"
case "$CNI_COMMAND" in
ADD) printf '{{"cniVersion":"%s","ips":[{{"address":"{addr}"}}]}}' "$(printf '%s' "$conf" | jq -r .cniVersion)" ;;
VERSION) echo '{{"cniVersion":"1.1.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}}' ;;
esac
"#
    );
    let p = dir.join(name);
    std::fs::write(&p, script).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

struct Rig {
    host: Netns,
    bridge: HostLink,
    api: TestApiServer,
    dir: tempfile::TempDir,
    /// Extra keys for plexus' own config (e.g. nadPolicy).
    extra: Value,
}

impl Rig {
    fn new(ipam_addr: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let (host, bindir) = fake_pf_host(dir.path());
        for stub in ["host-local", "whereabouts"] {
            recording_ipam(&bindir, stub, ipam_addr);
        }
        // This machine's kernel has no VRF device type: the operator's golden `vrf` meta
        // plugin is a stand-in that records its config and passes the sriov result on.
        let vrf = "#!/bin/sh\nconf=$(cat)\nprintf '%s' \"$conf\" > \"$(dirname \"$0\")/vrf.$CNI_COMMAND.json\"\n\
                   case \"$CNI_COMMAND\" in ADD) printf '%s' \"$conf\" | jq -c .prevResult ;; esac\n";
        std::fs::write(bindir.join("vrf"), vrf).unwrap();
        std::fs::set_permissions(bindir.join("vrf"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        let api = TestApiServer::start(TestApiServerOptions::default()).unwrap();
        api.add_token("t", Access::Full);
        api.write_kubeconfig(&dir.path().join("kubeconfig"), "t")
            .unwrap();
        Rig {
            host,
            bridge: HostLink::bridge_name(),
            api,
            dir,
            extra: json!({}),
        }
    }

    fn p(&self, s: &str) -> PathBuf {
        self.dir.path().join(s)
    }

    fn vf(&self) -> VfConfig {
        FilePf::new(self.p("pf.json")).load().unwrap().pfs[PF][0].clone()
    }

    fn host_vf(&self) -> Value {
        let v: Value = serde_json::from_str(&self.host.ip(&["-j", "link", "show", "vf0"]))
            .unwrap_or(json!([]));
        v[0].clone()
    }

    /// Store the fixture's NAD as the operator would, a pod in its namespace selecting it with
    /// `selection` (a name or a JSON list), and the device plugin's allocation of VF0 to it.
    fn setup(&self, nad: &Value, pod: &str, selection: &str) -> String {
        let meta = &nad["metadata"];
        let ns = meta["namespace"].as_str().unwrap();
        let annotations: Vec<(&str, &str)> = meta["annotations"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
            .collect();
        self.api
            .put_nad(
                ns,
                meta["name"].as_str().unwrap(),
                nad["spec"]["config"].as_str().unwrap(),
                &annotations,
            )
            .unwrap();
        let uid = format!("uid-{pod}");
        self.api
            .put_pod(json!({"metadata":{"name":pod,"namespace":ns,"uid":uid,
                "annotations":{"k8s.v1.cni.cncf.io/networks":selection}},
                "spec":{"containers":[{"name":"app","image":"app"}]}}))
            .unwrap();
        let resource = meta["annotations"]["k8s.v1.cni.cncf.io/resourceName"]
            .as_str()
            .unwrap();
        let checkpoint = json!({"Data":{"PodDeviceEntries":[
            {"PodUID":uid,"ContainerName":"app","ResourceName":resource,"DeviceIDs":{"0":[VF0]},"AllocResp":""}],
            "RegisteredDevices":{resource:[VF0]}},"Checksum":0});
        std::fs::write(self.p("checkpoint"), checkpoint.to_string()).unwrap();
        ns.to_string()
    }

    /// Run plexus (in the root netns, as the kubelet does) for `pod` in `ns`.
    fn plexus(&self, cmd: &str, ns: &str, pod: &str, netns: &str) -> Run {
        let mut conf = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus",
            "kubeconfig":self.p("kubeconfig"),"cniDir":self.p("state"),"binDir":self.p("bin"),
            "logFile":self.p("plexus.log"),"logLevel":"debug","logToStderr":false,
            "deviceCheckpointFile":self.p("checkpoint"),"podResourcesSocket":self.p("no-kubelet.sock"),
            "delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":self.bridge.0,
                "ipam":{"type":"static","addresses":[{"address":"10.244.78.2/24"}]}}]});
        for (k, v) in self.extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"
        );
        let cid = format!("cid-{pod}");
        let (sysfs, state, pf, logs) = (
            self.p("sys"),
            self.p("sriov-state"),
            self.p("pf.json"),
            self.p("sriov-log"),
        );
        let env = [
            ("PLEXUS_SYSFS_ROOT", sysfs.to_str().unwrap()),
            ("PLEXUS_SRIOV_STATE_DIR", state.to_str().unwrap()),
            ("PLEXUS_SRIOV_FAKE_PF", pf.to_str().unwrap()),
            ("PLEXUS_SRIOV_LOG_DIR", logs.to_str().unwrap()),
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

    fn log(&self) -> String {
        std::fs::read_to_string(self.p("plexus.log")).unwrap_or_default()
    }
}

/// One fixture's case: how the pod selects the network, and what must show after ADD.
struct Case {
    file: &'static str,
    selection: &'static str,
    /// (vlan, qos, proto, spoofchk, trust, min, max, link_state) on the VF.
    vf: (u16, u8, &'static str, bool, bool, u32, u32, &'static str),
    mac: Option<&'static str>,
    addr: Option<&'static str>,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            file: "golden-simple.json",
            selection: "test",
            vf: (0, 0, "802.1q", true, false, 0, 0, "auto"),
            mac: None,
            addr: None,
        },
        Case {
            file: "golden-chained.json",
            selection: "test",
            vf: (0, 0, "802.1q", true, false, 0, 0, "auto"),
            mac: None,
            addr: None,
        },
        Case {
            file: "full-static.json",
            selection: r#"[{"name":"bank-data","mac":"02:55:00:00:00:10"}]"#,
            vf: (100, 5, "802.1q", false, true, 100, 1000, "enable"),
            mac: Some("02:55:00:00:00:10"),
            addr: Some("10.56.217.10/24"),
        },
        Case {
            file: "qinq-host-local.json",
            selection: "qinq-net",
            vf: (200, 0, "802.1ad", true, false, 0, 0, "auto"),
            mac: None,
            addr: Some("10.56.217.171/24"),
        },
        Case {
            file: "whereabouts.json",
            selection: "wb-net",
            vf: (300, 0, "802.1q", true, false, 0, 500, "disable"),
            mac: None,
            addr: Some("192.168.2.226/28"),
        },
        Case {
            file: "runtime-static.json",
            selection: r#"[{"name":"static-ips","ips":["10.30.0.7/24"],"mac":"02:55:00:00:00:07"}]"#,
            vf: (0, 0, "802.1q", true, false, 0, 0, "auto"),
            mac: Some("02:55:00:00:00:07"),
            addr: Some("10.30.0.7/24"),
        },
        Case {
            file: "chained-tuning.json",
            selection: "tuned-net",
            vf: (10, 0, "802.1q", true, false, 0, 0, "auto"),
            mac: None,
            addr: Some("10.20.0.5/24"),
        },
    ]
}

#[test]
fn operator_nads_attach_through_plexus_unchanged() {
    for c in cases() {
        let rig = Rig::new(c.addr.unwrap_or("10.99.0.2/24"));
        let nad = fixture(c.file);
        let pod_name = c.file.trim_end_matches(".json").replace('.', "-");
        let ns = rig.setup(&nad, &pod_name, c.selection);
        let vf_before = rig.vf();
        let node_log_before = node_log_state();
        let host_before = rig.host_vf();
        if c.file == "full-static.json" {
            // The operator renders logFile /var/log/sriov-cni.log: outside the directories the
            // node's default NAD policy lets a NAD name, so ADD is refused before any delegate.
            let pod = Netns::new();
            let e = rig.plexus("ADD", &ns, &pod_name, &pod.path()).err().clone();
            let msg = e["msg"].as_str().unwrap_or_default().to_string() + &e.to_string();
            assert_eq!(e["code"], 7, "{e}");
            assert!(
                msg.contains("logFile") && msg.contains("/var/log/sriov-cni.log"),
                "{e}"
            );
            rig.plexus("DEL", &ns, &pod_name, &pod.path()).ok();
            assert_eq!(rig.vf(), vf_before);
        }
        let mut rig = rig;
        if c.file == "full-static.json" {
            // The node operator lists /var/log for NAD logs (nadPolicy.paths.logs): plexus'
            // sriov still keeps to its own log dir and logs to plexus' log instead.
            rig.extra = json!({"nadPolicy":{"paths":{"logs":["/var/log"]}}});
        }
        let pod = Netns::new();
        let res = rig.plexus("ADD", &ns, &pod_name, &pod.path()).ok().clone();
        let v = rig.vf();
        let got = (
            v.vlan,
            v.qos,
            v.proto.to_string(),
            v.spoofchk,
            v.trust,
            v.min_tx_rate,
            v.max_tx_rate,
            v.link_state.to_string(),
        );
        let want = (
            c.vf.0,
            c.vf.1,
            c.vf.2.to_string(),
            c.vf.3,
            c.vf.4,
            c.vf.5,
            c.vf.6,
            c.vf.7.to_string(),
        );
        assert_eq!(got, want, "{}: VF {v:?}", c.file);
        assert!(rig.host_vf().is_null(), "{}: VF left the host", c.file);
        assert!(pod.links().contains(&"net1".to_string()), "{}", c.file);
        if let Some(mac) = c.mac {
            assert_eq!(pod.mac("net1"), mac, "{}", c.file);
            assert_eq!(v.mac.to_string(), mac, "{}", c.file);
        }
        match c.addr {
            Some(a) => assert_eq!(pod.addrs("net1"), vec![a.to_string()], "{}", c.file),
            None => assert!(pod.addrs("net1").is_empty(), "{}", c.file),
        }
        assert_eq!(pod.addrs("eth0"), vec!["10.244.78.2/24"], "{}", c.file);
        // plexus returns the cluster network's result (as Multus does); net1 is in the pod.
        assert!(!res["interfaces"].to_string().contains("net1"), "{res}");
        match c.file {
            "full-static.json" => assert!(
                rig.log().contains("logFile /var/log/sriov-cni.log refused"),
                "{}",
                rig.log()
            ),
            "golden-chained.json" => {
                // The chain ran: vrf got sriov's result for net1, and its own keys.
                let seen: Value =
                    serde_json::from_slice(&std::fs::read(rig.p("bin/vrf.ADD.json")).unwrap())
                        .unwrap();
                assert_eq!(seen["vrfname"], "blue");
                assert_eq!(
                    seen["prevResult"]["interfaces"][0]["name"], "net1",
                    "{seen}"
                );
            }
            "chained-tuning.json" => {
                // The operator's metaPlugins ran after sriov, in the pod.
                let out = std::process::Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        &pod.name,
                        "sysctl",
                        "-n",
                        "net.core.somaxconn",
                    ])
                    .output()
                    .unwrap();
                assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1024");
            }
            "qinq-host-local.json" | "whereabouts.json" => {
                let t = if c.file.starts_with("qinq") {
                    "host-local"
                } else {
                    "whereabouts"
                };
                let seen: Value = serde_json::from_slice(
                    &std::fs::read(rig.p(&format!("bin/{t}.ADD.json"))).unwrap(),
                )
                .unwrap();
                let rendered: Value =
                    serde_json::from_str(nad["spec"]["config"].as_str().unwrap()).unwrap();
                assert_eq!(seen["ipam"], rendered["ipam"], "{}", c.file);
            }
            _ => {}
        }
        rig.plexus("CHECK", &ns, &pod_name, &pod.path()).ok();
        rig.plexus("DEL", &ns, &pod_name, &pod.path()).ok();
        assert_eq!(rig.vf(), vf_before, "{}: VF restored", c.file);
        assert_eq!(
            rig.host_vf()["ifname"],
            host_before["ifname"],
            "{}: VF back in the host",
            c.file
        );
        assert_eq!(pod.links(), vec!["lo"], "{}", c.file);
        // DEL again: idempotent.
        rig.plexus("DEL", &ns, &pod_name, &pod.path()).ok();
        assert_eq!(
            node_log_state(),
            node_log_before,
            "{}: the node's /var/log/sriov-cni.log untouched",
            c.file
        );
    }
}

/// The node's `/var/log/sriov-cni.log` (inode, size, mtime), to show nothing wrote to it.
fn node_log_state() -> Option<(u64, u64, i64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata("/var/log/sriov-cni.log")
        .ok()
        .map(|m| (m.ino(), m.size(), m.mtime_nsec()))
}
