//! The same VF through `plexus`: Kubernetes mode with the test API server and sriov-cni's
//! device-plugin NAD (the VF comes from the kubelet checkpoint file), static mode, and a
//! refused setting rolling back the whole pod.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::cases::{bank_settings, MAC};
use crate::common::{bin, run, Call, HostLink, Netns, Run};
use crate::guest::{Case, T};
use plexus_e2e::{nad_policy_allowing, Access, TestApiServer, TestApiServerOptions};

/// The cases of this module, in run order.
pub const CASES: &[Case] = &[
    ("plexus_kube_mode_device_plugin_nad", kube_mode),
    ("plexus_static_mode_delegates", static_mode),
    (
        "plexus_refused_setting_rolls_back_the_pod",
        kube_mode_refused,
    ),
];

const RESOURCE: &str = "intel.com/intel_sriov_netdevice";

struct Rig<'t, 'a> {
    t: &'t T<'a>,
    api: TestApiServer,
    bridge: HostLink,
}

impl<'t, 'a> Rig<'t, 'a> {
    /// API server with the bank NAD (no deviceID: the device plugin allocates the VF) and a
    /// kubelet checkpoint giving pod `pg-0` VF 0.
    fn new(t: &'t T<'a>, nad_extra: Value) -> Rig<'t, 'a> {
        let api = TestApiServer::start(TestApiServerOptions::default()).expect("API server");
        api.add_token("t", Access::Full);
        api.write_kubeconfig(&t.dir.p("kubeconfig"), "t")
            .expect("kubeconfig");
        let mut nad = json!({"cniVersion":"1.0.0","type":"sriov","name":"sriov-data",
            "ipam":{"type":"static","addresses":[{"address":"10.56.217.10/24","gateway":"10.56.217.1"}]}});
        for src in [bank_settings(), nad_extra] {
            for (k, v) in src.as_object().into_iter().flatten() {
                nad[k] = v.clone();
            }
        }
        api.put_nad(
            "bank",
            "sriov-data",
            &nad.to_string(),
            &[("k8s.v1.cni.cncf.io/resourceName", RESOURCE)],
        )
        .expect("NAD");
        api.put_pod(
            json!({"metadata":{"name":"pg-0","namespace":"bank","uid":"uid-pg-0",
            "annotations":{"k8s.v1.cni.cncf.io/networks":"sriov-data"}},
            "spec":{"containers":[{"name":"db","image":"pg"}]}}),
        )
        .expect("pod");
        let vf = t.vf(0);
        let checkpoint = json!({"Data":{"PodDeviceEntries":[
            {"PodUID":"uid-pg-0","ContainerName":"db","ResourceName":RESOURCE,"DeviceIDs":{"0":[vf]},"AllocResp":""}],
            "RegisteredDevices":{RESOURCE:[t.vf(0), t.vf(1)]}},"Checksum":0});
        std::fs::write(t.dir.p("checkpoint"), checkpoint.to_string()).expect("checkpoint");
        Rig {
            t,
            api,
            bridge: HostLink::bridge_name(),
        }
    }

    fn conf(&self) -> Value {
        let p = |s: &str| self.t.dir.p(s);
        json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","kubeconfig":p("kubeconfig"),
            "cniDir":p("plexus"),"binDir":sriov_dir(),"logFile":p("plexus.log"),"logLevel":"debug",
            "deviceCheckpointFile":p("checkpoint"),"podResourcesSocket":p("no-kubelet.sock"),
            "delegates":[default_net(&self.bridge.0, &p("ipam"))],
            "nadPolicy":nad_policy_allowing(&[&self.t.dir.0])})
    }

    fn plexus(&self, cmd: &str, netns: &str) -> Run {
        plexus(
            self.t,
            &self.conf(),
            cmd,
            "cid-pg-0",
            netns,
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=bank;K8S_POD_NAME=pg-0;K8S_POD_UID=uid-pg-0",
        )
    }
}

fn sriov_dir() -> PathBuf {
    bin("sriov").parent().map(PathBuf::from).unwrap_or_default()
}

fn default_net(bridge: &str, ipam_dir: &std::path::Path) -> Value {
    json!({"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":bridge,"isGateway":true,
        "ipam":{"type":"host-local","dataDir":ipam_dir,"ranges":[[{"subnet":"10.244.77.0/24"}]]}})
}

fn plexus(t: &T<'_>, conf: &Value, cmd: &str, cid: &str, netns: &str, args: &str) -> Run {
    let state = t.dir.state();
    let call = Call {
        command: cmd,
        container_id: cid,
        netns,
        ifname: "eth0",
        args,
    };
    run(
        &bin("plexus"),
        &call,
        conf,
        &[("PLEXUS_SRIOV_STATE_DIR", state.to_str().unwrap_or(""))],
    )
}

fn kube_mode(t: &T<'_>) {
    let before = t.pf.snap(0);
    let rig = Rig::new(t, json!({}));
    let pod = Netns::new();
    rig.plexus("ADD", &pod.path()).ok();
    assert_eq!(pod.addrs("net1"), vec!["10.56.217.10/24"]);
    assert_eq!(pod.mac("net1"), MAC);
    assert_eq!(pod.addrs("eth0").len(), 1, "default network on eth0");
    let v = t.pf.vfinfo(0);
    assert_eq!(v["vlan_list"], json!([{"vlan":100,"qos":3}]), "{v}");
    assert_eq!(v["trust"], true, "{v}");
    let pod_obj = rig.api.get_pod("bank", "pg-0").expect("pod");
    let status: Value = serde_json::from_str(
        pod_obj["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
            .as_str()
            .unwrap_or("[]"),
    )
    .expect("network-status");
    assert_eq!(status[1]["name"], "bank/sriov-data", "{status}");
    assert_eq!(status[1]["interface"], "net1", "{status}");
    assert_eq!(
        status[1]["device-info"]["pci"]["pci-address"],
        t.vf(0).as_str(),
        "{status}"
    );
    rig.plexus("CHECK", &pod.path()).ok();
    rig.plexus("DEL", &pod.path()).ok();
    assert_eq!(t.pf.snap(0), before);
    assert_eq!(pod.links(), vec!["lo"]);
    rig.plexus("DEL", &pod.path()).ok();
}

fn kube_mode_refused(t: &T<'_>) {
    let before = t.pf.snap(0);
    let rig = Rig::new(t, json!({"link_state":"enable"}));
    let pod = Netns::new();
    let e = rig.plexus("ADD", &pod.path()).err().to_string();
    assert!(
        e.contains("pod bank/pg-0") && e.contains("set VF link state"),
        "{e}"
    );
    assert_eq!(t.pf.snap(0), before, "VF untouched");
    assert_eq!(pod.links(), vec!["lo"], "eth0 rolled back too");
    rig.plexus("DEL", &pod.path()).ok();
    assert_eq!(t.pf.snap(0), before);
}

fn static_mode(t: &T<'_>) {
    let before = t.pf.snap(0);
    let bridge = HostLink::bridge_name();
    let mut sriov = crate::vf::nad(&t.vf(0), bank_settings());
    sriov["name"] = json!("sriov-data");
    let conf = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus",
        "cniDir":t.dir.p("plexus"),"binDir":sriov_dir(),"logFile":t.dir.p("plexus.log"),
        "delegates":[default_net(&bridge.0, &t.dir.p("ipam")), sriov],
        "nadPolicy":nad_policy_allowing(&[&t.dir.0])});
    let pod = Netns::new();
    let res = plexus(t, &conf, "ADD", "cid-static", &pod.path(), "")
        .ok()
        .clone();
    assert_eq!(pod.addrs("net1"), vec!["10.56.217.10/24"], "{res}");
    assert_eq!(t.pf.vfinfo(0)["address"], MAC);
    let mut check = conf.clone();
    check["prevResult"] = res;
    plexus(t, &check, "CHECK", "cid-static", &pod.path(), "").ok();
    plexus(t, &conf, "DEL", "cid-static", &pod.path(), "").ok();
    assert_eq!(t.pf.snap(0), before);
    assert_eq!(pod.links(), vec!["lo"]);
}
