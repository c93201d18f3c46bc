//! SR-IOV VFs through plexus on a real kube-apiserver, by both allocation paths: DRA (a
//! DeviceClass, a ResourceSlice whose devices carry `k8s.cni.cncf.io/deviceID` and
//! `k8s.cni.cncf.io/resourceName`, a ResourceClaim whose allocation the admin writes since no
//! scheduler runs, a pod whose status names the claim) and the device plugin (the kubelet's
//! checkpoint file). plexus runs with a TokenRequest token of `kube-system/plexus` under
//! `deploy/base/rbac.yaml` + `deploy/components/dra/rbac-dra.yaml`. The VFs are the usual stand-ins: a fake sysfs
//! tree, the file-backed fake PF, and veth ends in a per-run "host" netns as VF netdevs.
//! Skipped (and passing) without `PLEXUS_K8S_BIN`.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{ensure, Context, Result};
use common::*;
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::rig::{PlexusToken, Rig};
use plexus_e2e::realk8s::{control_plane_or_skip, metrics, setup_or_report, ControlPlane, Suite};
use plexus_sriov::fake_sysfs::{FakeSysfs, FakeVf};
use plexus_sriov::pf_fake::{FakePfState, FilePf};
use serde_json::{json, Value};

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
const RESOURCE_NAME: &str = "k8s.v1.cni.cncf.io/resourceName";
const PLEXUS_USER: &str = "system:serviceaccount:kube-system:plexus";
const DRIVER: &str = "sriov.plexus.test";
const NODE: &str = "node-a";
const PF: &str = "enp175s0f1";
const PF_PCI: &str = "0000:af:00.1";
/// VF PCI addresses, their stand-in netdevs and their DRA device names.
const VFS: [(&str, &str, &str); 4] = [
    ("0000:af:06.0", "vf0", "vf-0"),
    ("0000:af:06.1", "vf1", "vf-1"),
    ("0000:af:06.2", "vf2", "vf-2"),
    ("0000:af:06.3", "vf3", "vf-3"),
];
const RES_A: &str = "intel.com/sriov_a";
const RES_B: &str = "intel.com/sriov_b";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let Some(rig) = setup_or_report("real_dra", &cp, DraRig::new(&cp)) else {
        return ExitCode::FAILURE;
    };
    let mut suite = Suite::new("real_dra");
    suite.case(
        "dra_bank_scenario_three_vfs_device_info_claim_network_data_del_with_apiserver_stopped",
        || dra_bank(&rig),
    );
    suite.case("dra_devices_named_by_the_kubelet_need_no_claim_get", || {
        dra_kubelet_named(&rig)
    });
    suite.case("device_plugin_bank_scenario_from_the_checkpoint", || {
        device_plugin_bank(&rig)
    });
    suite.case("dra_errors_are_clear_and_leave_nothing", || {
        dra_errors(&rig)
    });
    suite.case(
        "extended_resource_claim_with_a_mismatched_resource_name_is_refused",
        || extended_mismatch(&rig),
    );
    suite.case("dra_cluster_role_grants_exactly_what_plexus_calls", || {
        dra_rbac_exact(&rig)
    });
    drop(rig);
    suite.finish()
}

/// The node side: fake SR-IOV hardware, plexus' dirs and kubeconfig, the NADs and DRA objects.
struct DraRig<'a> {
    cp: &'a ControlPlane,
    rig: Rig<'a>,
    host: Netns,
    bridge: HostLink,
}

impl<'a> DraRig<'a> {
    fn new(cp: &'a ControlPlane) -> Result<DraRig<'a>> {
        // As in the DaemonSet: plexus' token is bound to its pod on this node, so the API
        // server knows the node it speaks for (authentication.kubernetes.io/node-name).
        let rig = Rig::builder()
            .deploy(&[
                "base/nad-crd.yaml",
                "base/rbac.yaml",
                "components/dra/rbac-dra.yaml",
            ])
            .namespaces(&["bank"])
            .plexus_token(PlexusToken::BoundToPod {
                node: NODE.into(),
                pod: "plexus-node-a".into(),
            })
            .build(cp)?;
        let dir = rig.dir();
        let host = Netns::new();
        let mut fake_vfs = Vec::new();
        for (i, (pci, dev, _)) in VFS.iter().enumerate() {
            host.ip(&[
                "link",
                "add",
                dev,
                "address",
                &format!("02:00:00:00:00:1{i}"),
                "type",
                "veth",
                "peer",
                "name",
                &format!("{dev}p"),
            ]);
            host.ip(&["link", "set", &format!("{dev}p"), "up"]);
            fake_vfs.push(FakeVf::netdev(pci, dev));
        }
        FakeSysfs::new(&dir.join("sys")).add_pf(PF_PCI, PF, &fake_vfs)?;
        FilePf::create(&dir.join("pf.json"), &FakePfState::with_pf(PF, VFS.len()))?;
        let bindir = dir.join("bin");
        std::fs::create_dir_all(&bindir)?;
        std::fs::write(
            bindir.join("sriov"),
            format!(
                "#!/bin/sh\nexec ip netns exec {} {} \"$@\"\n",
                host.name,
                bin("sriov-fake-pf").display()
            ),
        )?;
        std::fs::set_permissions(
            bindir.join("sriov"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let rig = DraRig {
            cp,
            rig,
            host,
            bridge: HostLink::bridge_name(),
        };
        // Two NADs of resource A (one with the bank's fixed IP, VLAN and rate), one of B.
        rig.nad("vf-a1", RES_A, json!({"vlan":100,"vlanQoS":3,"max_tx_rate":1000,"trust":"off","spoofchk":"on",
            "ipam":{"type":"static","addresses":[{"address":"10.56.217.10/24","gateway":"10.56.217.1"}]}}))?;
        rig.nad("vf-a2", RES_A, json!({"vlan":200}))?;
        rig.nad("vf-b", RES_B, json!({}))?;
        rig.dra_objects()?;
        Ok(rig)
    }

    fn p(&self, s: &str) -> PathBuf {
        self.rig.path(s)
    }

    fn nad(&self, name: &str, resource: &str, extra: Value) -> Result<()> {
        let mut cfg =
            json!({"cniVersion":"1.0.0","type":"sriov","capabilities":{"CNIDeviceInfoFile":true}});
        for (k, v) in extra.as_object().into_iter().flatten() {
            cfg[k] = v.clone();
        }
        let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":name,"namespace":"bank","annotations":{RESOURCE_NAME:resource}},
            "spec":{"config":cfg.to_string()}});
        self.cp.apply(&nad.to_string())?;
        Ok(())
    }

    /// The DeviceClass and the driver's ResourceSlice: vf-0..2 carry both attributes (vf-0 and
    /// vf-1 of resource A, vf-2 of B); vf-3 is published without them (like a GPU).
    fn dra_objects(&self) -> Result<()> {
        let class = json!({"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass",
            "metadata":{"name":"sriov-vf"},"spec":{"selectors":[{"cel":{"expression":format!("device.driver == '{DRIVER}'")}}]}});
        self.cp.apply(&class.to_string())?;
        let mut devices = Vec::new();
        for (i, (pci, _, name)) in VFS.iter().enumerate() {
            let attrs = match i {
                0 | 1 => {
                    json!({"k8s.cni.cncf.io/deviceID":{"string":pci},"k8s.cni.cncf.io/resourceName":{"string":RES_A}})
                }
                2 => {
                    json!({"k8s.cni.cncf.io/deviceID":{"string":pci},"k8s.cni.cncf.io/resourceName":{"string":RES_B}})
                }
                _ => json!({"vendor.example.com/model":{"string":"not-a-nic"}}),
            };
            devices.push(json!({"name":name,"attributes":attrs}));
        }
        let slice = json!({"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice",
            "metadata":{"name":format!("{NODE}-sriov")},
            "spec":{"driver":DRIVER,"nodeName":NODE,"pool":{"name":NODE,"generation":1,"resourceSliceCount":1},"devices":devices}});
        self.cp.apply(&slice.to_string())?;
        Ok(())
    }

    /// A claim for `devices` (names in the slice), allocated by the admin when `allocate`.
    fn claim(&self, name: &str, devices: &[&str], allocate: bool) -> Result<()> {
        let claim = json!({"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
            "metadata":{"name":name,"namespace":"bank"},
            "spec":{"devices":{"requests":[{"name":"vfs","exactly":{"deviceClassName":"sriov-vf","allocationMode":"ExactCount","count":devices.len().max(1)}}]}}});
        self.cp.apply(&claim.to_string())?;
        if allocate {
            let results: Vec<Value> = devices
                .iter()
                .map(|d| json!({"request":"vfs","driver":DRIVER,"pool":NODE,"device":d}))
                .collect();
            // What the scheduler writes for node-local devices: the node is part of it.
            let status = json!({"status":{"allocation":{"devices":{"results":results},
                "nodeSelector":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":[NODE]}]}]}}}});
            self.cp.kubectl(&[
                "patch",
                "resourceclaim",
                name,
                "-n",
                "bank",
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ])?;
        }
        Ok(())
    }

    /// A pod on the node asking for `networks`, holding `claim` (its status names it).
    fn pod(&self, name: &str, networks: &str, claim: Option<&str>) -> Result<String> {
        let mut pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":name,"namespace":"bank","annotations":{NETWORKS:networks}},
            "spec":{"nodeName":NODE,"automountServiceAccountToken":false,"containers":[{"name":"db","image":"pg"}]}});
        if let Some(c) = claim {
            pod["spec"]["resourceClaims"] = json!([{"name":"vfs","resourceClaimName":c}]);
            pod["spec"]["containers"][0]["resources"] = json!({"claims":[{"name":"vfs"}]});
        }
        self.cp.apply(&pod.to_string())?;
        if let Some(c) = claim {
            let st =
                json!({"status":{"resourceClaimStatuses":[{"name":"vfs","resourceClaimName":c}]}});
            self.cp.kubectl(&[
                "patch",
                "pod",
                name,
                "-n",
                "bank",
                "--subresource=status",
                "--type=merge",
                "-p",
                &st.to_string(),
            ])?;
        }
        let got = self
            .cp
            .get_json(&format!("/api/v1/namespaces/bank/pods/{name}"))?;
        Ok(got["metadata"]["uid"].as_str().context("uid")?.to_string())
    }

    fn delete(&self, kind: &str, name: &str) {
        let _ = self
            .cp
            .kubectl(&["delete", kind, name, "-n", "bank", "--wait=false"]);
    }

    fn config(&self, extra: Value) -> Value {
        let mut c = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","kubeconfig":self.p("kubeconfig"),
            "cniDir":self.p("state"),"binDir":self.p("bin"),"logFile":self.p("plexus.log"),"logLevel":"debug","logToStderr":false,
            "deviceInfoDir":self.p("devinfo"),"podResourcesSocket":self.p("no-kubelet.sock"),
            "deviceCheckpointFile":self.p("kubelet_internal_checkpoint"),
            "delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":self.bridge.0,"isGateway":true,
                "ipam":{"type":"host-local","dataDir":self.p("ipam"),"ranges":[[{"subnet":"10.244.78.0/24"}]]}}],
            "nadPolicy":nad_policy_allowing(&[self.rig.dir()])});
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }

    fn plexus(&self, cmd: &str, pod: &str, uid: &str, netns: &str) -> Run {
        let args =
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bank;K8S_POD_NAME={pod};K8S_POD_UID={uid}");
        let (sysfs, state, pf) = (self.p("sys"), self.p("sriov-state"), self.p("pf.json"));
        let env = [
            ("PLEXUS_SYSFS_ROOT", sysfs.to_str().unwrap()),
            ("PLEXUS_SRIOV_STATE_DIR", state.to_str().unwrap()),
            ("PLEXUS_SRIOV_FAKE_PF", pf.to_str().unwrap()),
        ];
        let call = Call {
            command: cmd,
            container_id: &format!("cid-{pod}"),
            netns,
            ifname: "eth0",
            args: &args,
        };
        run(&bin("plexus"), &call, &self.config(json!({})), &env)
    }

    /// The PF side of every VF (the fake PF's table without its call log).
    fn pf_side(&self) -> Value {
        let st = FilePf::new(self.p("pf.json")).load().unwrap();
        serde_json::to_value(&st.pfs[PF]).unwrap()
    }

    fn host_links(&self) -> Vec<String> {
        let mut l = self.host.links();
        l.sort();
        l
    }

    fn status(&self, pod: &str) -> Result<Value> {
        let p = self
            .cp
            .get_json(&format!("/api/v1/namespaces/bank/pods/{pod}"))?;
        let s = p["metadata"]["annotations"][STATUS]
            .as_str()
            .context("no network-status")?;
        Ok(serde_json::from_str(s)?)
    }

    /// Nothing of plexus' or the delegates' state is left, and every VF is home.
    fn assert_clean(&self, before_pf: &Value, what: &str) -> Result<()> {
        let mut left = files_under(&self.p("state"));
        left.extend(files_under(&self.p("ipam")));
        left.extend(files_under(&self.p("devinfo/cni")));
        left.retain(|f| !f.starts_with("locks"));
        ensure!(left.is_empty(), "{what}: left behind {left:?}");
        ensure!(&self.pf_side() == before_pf, "{what}: PF side not restored");
        let mut want: Vec<String> = VFS.iter().map(|v| v.1.to_string()).collect();
        want.extend(VFS.iter().map(|v| format!("{}p", v.1)));
        want.push("lo".into());
        want.sort();
        ensure!(
            self.host_links() == want,
            "{what}: host links {:?}",
            self.host_links()
        );
        Ok(())
    }
}

/// Sum of the request deltas for DRA resources.
fn dra_requests(cp: &ControlPlane, f: impl FnOnce()) -> Result<metrics::RequestCounts> {
    let before = cp.request_totals()?;
    f();
    let after = cp.request_totals()?;
    Ok(metrics::delta(
        &before,
        &after,
        &[
            "pods",
            "events",
            "network-attachment-definitions",
            "resourceclaims",
            "resourceslices",
        ],
    ))
}

fn dra_bank(rig: &DraRig<'_>) -> Result<()> {
    let before_pf = rig.pf_side();
    rig.claim("pg-vfs", &["vf-1", "vf-2", "vf-0", "vf-3"], true)?;
    let uid = rig.pod("pg-dra", "vf-a1,vf-a2,vf-b", Some("pg-vfs"))?;
    let ns = Netns::new();
    let mut add = None;
    let counts = dra_requests(rig.cp, || {
        add = Some(rig.plexus("ADD", "pg-dra", &uid, &ns.path()));
    })?;
    let add = add.unwrap();
    println!("    DRA ADD requests: {counts:?}");
    let checks = (|| -> Result<()> {
        ensure!(add.code == 0, "ADD failed: {} {}", add.out, add.stderr);
        // Three distinct VFs: the two of resource A in sorted order, then B.
        let mut links = ns.links();
        links.sort();
        ensure!(
            links == ["eth0", "lo", "net1", "net2", "net3"],
            "links {links:?}"
        );
        ensure!(
            ns.addrs("net1") == ["10.56.217.10/24"],
            "net1 {:?}",
            ns.addrs("net1")
        );
        let pf = rig.pf_side();
        ensure!(
            pf[0]["vlan"] == 100 && pf[0]["qos"] == 3 && pf[0]["maxTxRate"] == 1000,
            "vf0 {}",
            pf[0]
        );
        ensure!(pf[1]["vlan"] == 200, "vf1 {}", pf[1]);
        let st = rig.status("pg-dra")?;
        let pci = |i: usize| st[i]["device-info"]["pci"]["pci-address"].clone();
        ensure!(
            pci(1) == VFS[0].0 && pci(2) == VFS[1].0 && pci(3) == VFS[2].0,
            "device-info {st}"
        );
        // The sriov delegate wrote the CNI-side file, with the PF's address.
        ensure!(
            st[1]["device-info"]["pci"]["pf-pci-address"] == PF_PCI,
            "{st}"
        );
        // The claim knows which VF became which interface.
        let claim = rig
            .cp
            .get_json("/apis/resource.k8s.io/v1/namespaces/bank/resourceclaims/pg-vfs")?;
        let devs = claim["status"]["devices"].as_array().with_context(|| {
            format!(
                "claim status.devices: {claim}\n{}",
                plexus_e2e::realk8s::tail(&rig.p("plexus.log"), 15)
            )
        })?;
        let by_dev = |d: &str| {
            devs.iter()
                .find(|e| e["device"] == d)
                .cloned()
                .unwrap_or(Value::Null)
        };
        ensure!(
            by_dev("vf-0")["networkData"]["interfaceName"] == "net1",
            "{claim}"
        );
        ensure!(
            by_dev("vf-0")["networkData"]["ips"] == json!(["10.56.217.10/24"]),
            "{claim}"
        );
        ensure!(
            by_dev("vf-2")["networkData"]["interfaceName"] == "net3",
            "{claim}"
        );
        ensure!(
            by_dev("vf-3").is_null(),
            "a device without the attributes is not touched"
        );
        // Request budget: GET pod, 3 NAD GETs, 1 claim GET, 1 slice LIST, PATCH status, claim apply, event.
        let total: u64 = counts.values().sum();
        ensure!(total == 9, "requests {counts:?}");
        let check = rig.plexus("CHECK", "pg-dra", &uid, &ns.path());
        ensure!(check.code == 0, "CHECK failed: {}", check.out);
        Ok(())
    })();
    // DEL with the API server stopped restores all three VFs (run even when a check failed,
    // so nothing is left for the next case).
    rig.cp.stop_apiserver();
    let del = rig.plexus("DEL", "pg-dra", &uid, &ns.path());
    rig.cp.start_apiserver()?;
    checks?;
    ensure!(del.code == 0, "DEL failed: {} {}", del.out, del.stderr);
    rig.plexus("DEL", "pg-dra", &uid, "").ok();
    ensure!(ns.links() == ["lo"], "pod links {:?}", ns.links());
    rig.assert_clean(&before_pf, "DRA bank")?;
    rig.delete("pod", "pg-dra");
    rig.delete("resourceclaim", "pg-vfs");
    Ok(())
}

/// The kubelet's pod-resources API reports the claim's prepared devices (dynamic_resources):
/// plexus reads only the slices for their attributes, no claim.
fn dra_kubelet_named(rig: &DraRig<'_>) -> Result<()> {
    use plexus_e2e::fake_kubelet::{FakeKubelet, FakeKubeletOptions, FakePod};
    let before_pf = rig.pf_side();
    rig.claim("pg-named", &["vf-2"], true)?;
    let uid = rig.pod("pg-named", "vf-b", Some("pg-named"))?;
    let mut kubelet = FakeKubelet::start(
        &rig.p("no-kubelet.sock"),
        vec![FakePod::new("bank", "pg-named")
            .with_claim_device("bank", "pg-named", DRIVER, NODE, "vf-2")],
        FakeKubeletOptions::default(),
    )?;
    let ns = Netns::new();
    let mut add = None;
    let counts = dra_requests(rig.cp, || {
        add = Some(rig.plexus("ADD", "pg-named", &uid, &ns.path()));
    })?;
    let add = add.unwrap();
    println!("    kubelet-named DRA ADD requests: {counts:?}");
    let del = rig.plexus("DEL", "pg-named", &uid, &ns.path());
    kubelet.stop();
    std::fs::remove_file(rig.p("no-kubelet.sock")).ok();
    ensure!(add.code == 0, "ADD failed: {} {}", add.out, add.stderr);
    ensure!(del.code == 0, "DEL failed: {} {}", del.out, del.stderr);
    let of = |resource: &str, verb: &str| -> u64 {
        counts
            .iter()
            .filter(|(k, _)| k.resource == resource && k.verb == verb)
            .map(|(_, v)| v)
            .sum()
    };
    ensure!(
        of("resourceclaims", "GET") == 0 && of("resourceslices", "LIST") == 1,
        "{counts:?}"
    );
    rig.assert_clean(&before_pf, "kubelet-named")?;
    rig.delete("pod", "pg-named");
    rig.delete("resourceclaim", "pg-named");
    Ok(())
}

fn device_plugin_bank(rig: &DraRig<'_>) -> Result<()> {
    let before_pf = rig.pf_side();
    let uid = rig.pod("pg-dp", "vf-a1,vf-b", None)?;
    // The kubelet's device-manager checkpoint (no pod-resources socket on this node).
    let cp = json!({"Data":{"PodDeviceEntries":[
        {"PodUID":uid,"ContainerName":"db","ResourceName":RES_A,"DeviceIDs":{"-1":[VFS[1].0]},"AllocResp":""},
        {"PodUID":uid,"ContainerName":"db","ResourceName":RES_B,"DeviceIDs":{"-1":[VFS[2].0]},"AllocResp":""}],
        "RegisteredDevices":{}},"Checksum":0});
    std::fs::write(rig.p("kubelet_internal_checkpoint"), cp.to_string())?;
    // The device plugin's own device-info file for the first VF.
    let dp = rig.p("devinfo/dp");
    std::fs::create_dir_all(&dp)?;
    std::fs::write(
        dp.join(format!("intel.com-sriov_a-{}-device.json", VFS[1].0)),
        json!({"type":"pci","version":"1.1.0","pci":{"pci-address":VFS[1].0,"rdma-device":"mlx5_7"}}).to_string(),
    )?;
    let ns = Netns::new();
    let mut add = None;
    let counts = dra_requests(rig.cp, || {
        add = Some(rig.plexus("ADD", "pg-dp", &uid, &ns.path()));
    })?;
    let add = add.unwrap();
    println!("    device-plugin ADD requests: {counts:?}");
    let checks = (|| -> Result<()> {
        ensure!(add.code == 0, "ADD failed: {} {}", add.out, add.stderr);
        ensure!(
            ns.addrs("net1") == ["10.56.217.10/24"],
            "net1 {:?}",
            ns.addrs("net1")
        );
        let pf = rig.pf_side();
        ensure!(
            pf[1]["vlan"] == 100 && pf[1]["maxTxRate"] == 1000,
            "vf1 {}",
            pf[1]
        );
        let st = rig.status("pg-dp")?;
        ensure!(
            st[1]["device-info"]["pci"]["rdma-device"] == "mlx5_7",
            "device plugin file kept: {st}"
        );
        ensure!(
            st[1]["device-info"]["pci"]["pf-pci-address"] == PF_PCI,
            "{st}"
        );
        ensure!(
            st[2]["device-info"]["pci"]["pci-address"] == VFS[2].0,
            "{st}"
        );
        let total: u64 = counts.values().sum();
        ensure!(
            total == 5,
            "GET pod + 2 NADs + PATCH + event, no DRA request: {counts:?}"
        );
        Ok(())
    })();
    let del = rig.plexus("DEL", "pg-dp", &uid, &ns.path());
    checks?;
    ensure!(del.code == 0, "DEL failed: {} {}", del.out, del.stderr);
    rig.assert_clean(&before_pf, "device-plugin bank")?;
    std::fs::remove_file(rig.p("kubelet_internal_checkpoint"))?;
    std::fs::remove_dir_all(&dp)?;
    rig.delete("pod", "pg-dp");
    Ok(())
}

fn dra_errors(rig: &DraRig<'_>) -> Result<()> {
    let before_pf = rig.pf_side();
    let cases: [(&str, &[&str], bool, &str, &str); 3] = [
        (
            "pending",
            &["vf-0"],
            false,
            "vf-a1",
            "ResourceClaim pending is not allocated",
        ),
        ("ghost", &["vf-9"], true, "vf-a1", "vf-9"),
        (
            "short",
            &["vf-0"],
            true,
            "vf-a1,vf-a2",
            "no device of resource",
        ),
    ];
    for (claim, devices, allocate, networks, needle) in cases {
        rig.claim(claim, devices, allocate)?;
        let pod = format!("pg-{claim}");
        let uid = rig.pod(&pod, networks, Some(claim))?;
        let ns = Netns::new();
        let r = rig.plexus("ADD", &pod, &uid, &ns.path());
        let e = r.err().clone();
        let msg = format!("{} {}", e["msg"], e["details"]);
        ensure!(
            msg.contains(&format!("pod bank/{pod}")) && msg.contains(needle),
            "{claim}: {e}"
        );
        ensure!(ns.links() == ["lo"], "{claim}: links {:?}", ns.links());
        rig.plexus("DEL", &pod, &uid, &ns.path()).ok();
        rig.assert_clean(&before_pf, claim)?;
        rig.delete("pod", &pod);
        rig.delete("resourceclaim", claim);
    }
    Ok(())
}

/// A pod whose extended resource `intel.com/sriov_a` was satisfied through DRA
/// (`status.extendedResourceClaimStatus`), but the device the claim got says it is of another
/// resource: refused, naming both.
fn extended_mismatch(rig: &DraRig<'_>) -> Result<()> {
    let before_pf = rig.pf_side();
    rig.claim("pg-ext", &["vf-2"], true)?;
    // The container asks for the extended resource; the scheduler satisfied it through DRA.
    let pod = json!({"apiVersion":"v1","kind":"Pod",
        "metadata":{"name":"pg-ext","namespace":"bank","annotations":{NETWORKS:"vf-a1"}},
        "spec":{"nodeName":NODE,"automountServiceAccountToken":false,"containers":[{"name":"db","image":"pg",
            "resources":{"requests":{RES_A:"1"},"limits":{RES_A:"1"}}}]}});
    rig.cp.apply(&pod.to_string())?;
    let uid = rig.cp.get_json("/api/v1/namespaces/bank/pods/pg-ext")?["metadata"]["uid"]
        .as_str()
        .context("uid")?
        .to_string();
    let st = json!({"status":{"extendedResourceClaimStatus":{"resourceClaimName":"pg-ext",
        "requestMappings":[{"containerName":"db","resourceName":RES_A,"requestName":"vfs"}]}}});
    rig.cp.kubectl(&[
        "patch",
        "pod",
        "pg-ext",
        "-n",
        "bank",
        "--subresource=status",
        "--type=merge",
        "-p",
        &st.to_string(),
    ])?;
    let got = rig.cp.get_json("/api/v1/namespaces/bank/pods/pg-ext")?;
    ensure!(
        !got["status"]["extendedResourceClaimStatus"].is_null(),
        "the apiserver dropped status.extendedResourceClaimStatus (DRAExtendedResource off?)"
    );
    let ns = Netns::new();
    let r = rig.plexus("ADD", "pg-ext", &uid, &ns.path());
    let e = r.err().clone();
    let msg = format!("{} {}", e["msg"], e["details"]);
    ensure!(
        msg.contains("pod bank/pg-ext") && msg.contains(RES_A) && msg.contains(RES_B),
        "{e}"
    );
    rig.plexus("DEL", "pg-ext", &uid, &ns.path()).ok();
    rig.assert_clean(&before_pf, "extended")?;
    rig.delete("pod", "pg-ext");
    rig.delete("resourceclaim", "pg-ext");
    Ok(())
}

/// (apiGroup, resource[/subresource], verb).
type Right = (String, String, String);

fn dra_rbac_exact(rig: &DraRig<'_>) -> Result<()> {
    let used: BTreeSet<Right> = rig
        .cp
        .audit()
        .into_iter()
        .filter(|e| e.user == PLEXUS_USER && e.group == "resource.k8s.io")
        .inspect(|e| assert_ne!(e.code, 403, "plexus denied: {e:?}"))
        .map(|e| {
            let res = if e.subresource.is_empty() {
                e.resource.clone()
            } else {
                format!("{}/{}", e.resource, e.subresource)
            };
            (e.group.clone(), res, e.verb.clone())
        })
        .collect();
    let role = rig
        .cp
        .get_json("/apis/rbac.authorization.k8s.io/v1/clusterroles/plexus-dra")?;
    let mut granted = BTreeSet::<Right>::new();
    for rule in role["rules"].as_array().context("rules")? {
        for g in rule["apiGroups"].as_array().into_iter().flatten() {
            for r in rule["resources"].as_array().into_iter().flatten() {
                for v in rule["verbs"].as_array().into_iter().flatten() {
                    granted.insert((
                        g.as_str().unwrap_or_default().into(),
                        r.as_str().unwrap_or_default().into(),
                        v.as_str().unwrap_or_default().into(),
                    ));
                }
            }
        }
    }
    // The per-driver check of a status.devices write (resourceclaims/driver) is an
    // authorization step of the status PATCH, not a request of its own: the claim's networkData
    // in the bank case proves it is granted and needed.
    let synthetic: BTreeSet<Right> = granted
        .iter()
        .filter(|(_, r, _)| r == "resourceclaims/driver")
        .cloned()
        .collect();
    ensure!(
        synthetic
            == BTreeSet::from([(
                "resource.k8s.io".to_string(),
                "resourceclaims/driver".to_string(),
                "associated-node:patch".to_string()
            )]),
        "node-restricted driver write only: {synthetic:?}"
    );
    let granted: BTreeSet<Right> = granted.difference(&synthetic).cloned().collect();
    println!("    plexus used (DRA): {used:?}");
    ensure!(used == granted, "used {used:?} but granted {granted:?}");
    Ok(())
}
