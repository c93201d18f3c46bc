//! Inside the VM, after the delegate cases: the bank pod end to end on a real node (`node`):
//! the kubelet allocates a VF that sriovdp advertises, plexus (installed by deploy/install.sh,
//! flannel as eth0) finds it through the kubelet's pod-resources API (and through the
//! checkpoint when that socket is gone) and `sriov` configures it. Each case checks the pod, the
//! netns, the PF's view of the VF and, after delete, that the VF is exactly as before.

use std::path::Path;
use std::time::{Duration, Instant};

use plexus_e2e::realk8s::cri::Cri;
use serde_json::{json, Value};

use crate::node::{Node, DEVINFO_DIR, RESOURCE};
use crate::vf::{link_summary, wait_for, Pf, VfSnap};

/// The quickstart's namespace, NAD, MAC and address (checked against the document at load).
const NS: &str = "default";
const NAD: &str = "pg-data";
const MAC: &str = "02:42:ac:11:00:0a";
const IP: &str = "10.56.217.10/24";

/// docs/quickstart.md's bank case (NAD, pod), as the host converted it (`node_host`).
static BANK: std::sync::OnceLock<(Value, Value)> = std::sync::OnceLock::new();

fn load_bank(outdir: &Path) -> Result<(), String> {
    let objs = read_objects(&outdir.join("node/quickstart-bank.json"))?;
    let find = |k: &str| objs.iter().find(|o| o["kind"] == k).cloned();
    let nad = find("NetworkAttachmentDefinition").ok_or("the quickstart has no NAD")?;
    let pod = find("Pod").ok_or("the quickstart has no Pod")?;
    let cfg: Value = serde_json::from_str(nad["spec"]["config"].as_str().unwrap_or("{}"))
        .map_err(|e| format!("the quickstart NAD's config: {e}"))?;
    let ok = nad["metadata"]["namespace"] == NS
        && nad["metadata"]["name"] == NAD
        && nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"] == RESOURCE
        && cfg["mac"] == MAC
        && cfg["ipam"]["addresses"][0]["address"] == IP
        && pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == NAD;
    if !ok {
        return Err(format!("the quickstart's bank case changed: {nad} {pod}"));
    }
    let _ = BANK.set((nad, pod));
    Ok(())
}

/// The objects in a file kubectl wrote on the host: one after another, or a List.
pub fn read_objects(path: &Path) -> Result<Vec<Value>, String> {
    let raw = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut objs = Vec::new();
    for v in serde_json::Deserializer::from_slice(&raw).into_iter::<Value>() {
        let v = v.map_err(|e| format!("{}: {e}", path.display()))?;
        match v["items"].as_array() {
            Some(items) if v["kind"] == "List" => objs.extend(items.iter().cloned()),
            _ => objs.push(v),
        }
    }
    Ok(objs)
}

/// The events of pod `ns/name`, as kubectl prints them (empty when they cannot be read).
pub fn pod_events(node: &Node, ns: &str, name: &str) -> String {
    node.kubectl(&[
        "-n",
        ns,
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={name}"),
    ])
    .unwrap_or_default()
}

/// The bank NAD, exactly as the quickstart has it.
pub fn bank_nad() -> Value {
    BANK.get().map(|b| b.0.clone()).unwrap_or_default()
}

/// The quickstart's bank pod named `name`, with the one change the VM needs: the image is the
/// local pause image (nothing can be pulled). No nodeName: the real kube-scheduler binds it.
pub fn bank_pod(name: &str) -> Value {
    let mut pod = BANK.get().map(|b| b.1.clone()).unwrap_or_default();
    pod["metadata"]["name"] = json!(name);
    pod["spec"]["containers"][0]["image"] = json!("local/pause:1");
    pod
}

/// A node case: the node, the PF, where to record notes.
type NodeCase = fn(&mut Node, &Pf, Record<'_>) -> Result<(), String>;

/// Benchmark cases: they run with the VM benchmark (`PLEXUS_VM_BENCH=1`, see `bench_host`) or
/// when `PLEXUS_VM_CASES` names them, not in CI (figures, not checks).
const OPT_IN: &[&str] = &["node_bank_pod_create_to_running_sriov_vs_sriov_cni"];

/// The node cases, in order (the node starts when any is selected).
const CASES: &[(&str, NodeCase)] = &[
    (
        "node_bank_pod_by_device_plugin_pod_resources",
        bank_by_device_plugin,
    ),
    (
        "node_bank_pod_by_dra_claim_allocated_by_the_scheduler",
        bank_by_dra,
    ),
    (
        "node_as_many_pods_as_vfs_one_refused_kubelet_sriovdp_containerd_restarted",
        capacity_and_restarts,
    ),
    (
        "node_bank_pod_create_to_running_sriov_vs_sriov_cni",
        sriov_vs_sriov_cni,
    ),
    (
        "node_bank_pod_by_checkpoint_when_pod_resources_is_gone",
        bank_by_checkpoint,
    ),
];

/// What the runner records.
pub type Record<'a> = &'a mut dyn FnMut(Value);

/// Runs the node cases; `filters` as PLEXUS_VM_CASES.
pub fn run(pf: &Pf, outdir: &Path, filters: &[String], record: Record<'_>) {
    let selected = |n: &str| filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str()));
    let bench = outdir.join(crate::bench_host::FILE).exists();
    let selected = |n: &str| {
        if OPT_IN.contains(&n) {
            bench || filters.iter().any(|f| n.contains(f.as_str()))
        } else {
            selected(n)
        }
    };
    if !CASES.iter().any(|(n, _)| selected(n)) && !crate::cases_two_nodes::wanted(filters) {
        return;
    }
    let t = Instant::now();
    if let Err(e) = load_bank(outdir) {
        record(json!({"case":"node_quickstart_bank_case_loaded","ok":false,"secs":0.0,"detail":e}));
        return;
    }
    let node = Node::start(outdir);
    let mut node = match node {
        Ok(n) => {
            record(
                json!({"case":"node_kubelet_containerd_flannel_plexus_sriovdp_ready","ok":true,
                "secs":t.elapsed().as_secs_f64(),"detail":""}),
            );
            record(json!({"note": format!(
                "node in the VM (containerd 2.3 on cgroup v2, kubelet, flanneld, install.sh, sriovdp) ready in {:.1} s",
                t.elapsed().as_secs_f64())}));
            n
        }
        Err(e) => {
            record(
                json!({"case":"node_kubelet_containerd_flannel_plexus_sriovdp_ready",
                "ok":false,"secs":t.elapsed().as_secs_f64(),"detail":e}),
            );
            return;
        }
    };
    let cases = CASES;
    for (name, f) in cases {
        if !selected(name) {
            continue;
        }
        let before: Vec<VfSnap> = (0..crate::guest::NUM_VFS).map(|i| pf.snap(i)).collect();
        let t = Instant::now();
        let mut r = f(&mut node, pf, record);
        let after: Vec<VfSnap> = (0..crate::guest::NUM_VFS).map(|i| pf.snap(i)).collect();
        if r.is_ok() && after != before {
            r = Err(format!(
                "a VF changed:\n  before {before:?}\n  after  {after:?}"
            ));
        }
        if let Err(e) = &r {
            println!("vm-node: {name} FAILED: {e}");
            let _ = node.kubectl(&[
                "-n",
                NS,
                "delete",
                "pods",
                "--all",
                "--grace-period=0",
                "--force",
            ]);
        }
        record(
            json!({"case":name,"ok":r.is_ok(),"secs":t.elapsed().as_secs_f64(),
            "detail": r.err().map(|e| format!("{e}\n--- kubelet.log:\n{}\n--- plexus.log:\n{}",
                crate::node::log_tail("kubelet", 10), crate::node::log_tail("plexus", 10))).unwrap_or_default()}),
        );
    }
    // Last: the second node joins (the bank database across both nodes, a node failing).
    crate::cases_two_nodes::run(&mut node, pf, outdir, filters, record);
    node.stop();
}

fn setup_nad(node: &Node) -> Result<(), String> {
    node.apply(&bank_nad()).map(drop)
}

/// Creates the pod and waits for Running; the create→Running time.
pub fn create_running(node: &Node, pod: &Value) -> Result<(Value, Duration), String> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let t = Instant::now();
    node.apply(pod)?;
    let mut last = Value::Null;
    let ok = wait_for(Duration::from_secs(300), || {
        last = node.get(&["-n", NS, "pod", name]).unwrap_or(Value::Null);
        last["status"]["phase"] == "Running"
    });
    let took = t.elapsed();
    match ok {
        Some(_) => Ok((last, took)),
        None => {
            let ev = pod_events(node, NS, name);
            Err(format!(
                "pod {name} not Running in 300 s: {}\nevents:\n{ev}",
                last["status"]
            ))
        }
    }
}

/// Deletes the pod and waits until it is gone.
pub fn delete_gone(node: &Node, name: &str) -> Result<Duration, String> {
    let t = Instant::now();
    node.kubectl(&["-n", NS, "delete", "pod", name, "--wait=false"])?;
    wait_for(Duration::from_secs(240), || {
        node.kubectl(&["-n", NS, "get", "pod", name]).is_err()
    })
    .ok_or(format!("pod {name} still there 240 s after delete"))?;
    Ok(t.elapsed())
}

/// The bank pod's VF: network-status' device-info PCI address, its VF index, the netns name.
struct Attached {
    pci: String,
    vf: u32,
    netns: String,
}

/// `dp`: the VF came from the device plugin (the kubelet's checkpoint and sriovdp's
/// device-info file name it), else from a DRA claim.
fn check_attached(pf: &Pf, pod: &Value, nad: &str, dp: bool) -> Result<Attached, String> {
    let ann = pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
        .as_str()
        .ok_or(format!("no network-status on the pod: {}", pod["metadata"]))?;
    let status: Value = serde_json::from_str(ann).map_err(|e| e.to_string())?;
    let entries = status.as_array().cloned().unwrap_or_default();
    let eth0 = entries
        .iter()
        .find(|e| e["interface"] == "eth0" || e["default"] == true);
    let eth0 = eth0.ok_or(format!("no default network: {status}"))?;
    if eth0["name"] != "cbr0"
        || !eth0["ips"][0]
            .as_str()
            .is_some_and(|i| i.starts_with("10.244.0."))
    {
        return Err(format!("eth0 is not flannel's: {eth0}"));
    }
    let want_name = format!("{NS}/{nad}");
    let e = entries
        .iter()
        .find(|e| e["name"] == want_name.as_str())
        .ok_or(format!("no {want_name} in network-status: {status}"))?;
    let pci = e["device-info"]["pci"]["pci-address"]
        .as_str()
        .ok_or(format!("no device-info in {e}"))?
        .to_string();
    if e["interface"] != "net1" || e["mac"] != MAC || e["ips"] != json!([IP.split('/').next()]) {
        return Err(format!("network-status entry: {e}"));
    }
    let vf = (0..crate::guest::NUM_VFS)
        .find(|&i| pf.vf_pci(i).as_deref() == Some(pci.as_str()))
        .ok_or(format!("{pci} is not a VF of {}", pf.name))?;
    // The kubelet allocated exactly that VF to this pod (its checkpoint) and sriovdp wrote
    // the device-info file for it.
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    if dp {
        check_device_plugin(uid, &pci)?;
        // Plexus seeded the attachment's device-info file from sriovdp's.
        if devinfo_cni_files().is_empty() {
            return Err("plexus wrote no attachment device-info file".into());
        }
    }
    if e["device-info"]["pci"]["pci-address"] != json!(pci) || e["device-info"]["type"] != "pci" {
        return Err(format!("device-info: {e}"));
    }
    attached_in_pod_and_pf(pf, uid, pci, vf)
}

fn check_device_plugin(uid: &str, pci: &str) -> Result<(), String> {
    let cp = std::fs::read_to_string("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
        .map_err(|e| format!("kubelet checkpoint: {e}"))?;
    let cpj: Value = serde_json::from_str(&cp).map_err(|e| e.to_string())?;
    let entries_cp = cpj["Data"]["PodDeviceEntries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !entries_cp.iter().any(|x| {
        x["PodUID"] == uid
            && x["ResourceName"] == RESOURCE
            && x["DeviceIDs"].to_string().contains(pci)
    }) {
        return Err(format!(
            "the kubelet's checkpoint does not give {pci} to pod {uid}: {cp}"
        ));
    }
    let dp_file = format!("{DEVINFO_DIR}/intel.com-sriov_igb-{pci}-device.json");
    if !Path::new(&dp_file).exists() {
        return Err(format!("sriovdp wrote no {dp_file}"));
    }
    Ok(())
}

/// The name of pod `name`'s netns (under /run/netns), from its sandbox.
fn pod_netns(node: &Node, name: &str) -> Result<String, String> {
    node.pod_netns(NS, name)
}

fn attached_in_pod_and_pf(pf: &Pf, uid: &str, pci: String, vf: u32) -> Result<Attached, String> {
    // In the pod: net1 is that VF with the MAC, MTU and address.
    let cri = Cri::new(Path::new("/tmp/node/containerd/containerd.sock"));
    let sb = cri
        .sandboxes(Some(uid))
        .map_err(|e| format!("CRI: {e:#}"))?;
    let sb = sb.first().ok_or("no sandbox for the pod")?;
    let netns_path = cri.sandbox_netns(&sb.id).map_err(|e| format!("{e:#}"))?;
    let netns = Path::new(&netns_path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let l = link_summary(Some(&netns), "net1");
    if l != json!({"ifname":"net1","address":MAC,"mtu":9000,"up":true}) {
        return Err(format!("net1 in the pod: {l}"));
    }
    // Carrier: the VF can carry traffic, not only show the settings.
    let has = || {
        crate::vf::sh(&["ip", "-n", &netns, "-j", "link", "show", "net1"])
            .is_ok_and(|j| j.contains("LOWER_UP"))
    };
    if wait_for(Duration::from_secs(10), has).is_none() {
        return Err(format!(
            "net1 in the pod has no carrier 10 s after Running:\n{}",
            crate::cases_traffic::driver_log()
        ));
    }
    // net1 is that VF: its PCI device's netdev is no longer in the node's namespace, and the
    // pod's net1 is bound to that PCI function (sysfs seen from the pod's namespace).
    let dev = crate::vf::sh(&[
        "ip",
        "netns",
        "exec",
        &netns,
        "readlink",
        "-f",
        "/sys/class/net/net1/device",
    ])
    .unwrap_or_default();
    if !dev.trim().ends_with(&pci) {
        return Err(format!("net1 in the pod is not {pci}: {dev}"));
    }
    let addrs = crate::vf::sh(&["ip", "-n", &netns, "-j", "addr", "show", "net1"])?;
    if !addrs.contains("10.56.217.10") {
        return Err(format!("net1 has no {IP}: {addrs}"));
    }
    // The PF's view.
    let v = pf.vfinfo(vf);
    let ok = v["address"] == MAC
        && v["vlan_list"] == json!([{"vlan":100,"qos":3}])
        && v["spoofchk"] == true
        && v["trust"] == true
        && v["rate"]["max_tx"] == 100;
    if !ok {
        return Err(format!("PF side of VF {vf}: {v}"));
    }
    Ok(Attached { pci, vf, netns })
}

fn devinfo_cni_files() -> Vec<String> {
    std::fs::read_dir(format!("{}/../cni", DEVINFO_DIR))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn check_released(pf: &Pf, a: &Attached, before: &VfSnap) -> Result<(), String> {
    let after = pf.snap(a.vf);
    if &after != before {
        return Err(format!(
            "VF {} ({}) not restored:\n  before {before:?}\n  after  {after:?}",
            a.vf, a.pci
        ));
    }
    let v = &after.pf_side;
    // `ip -j` prints a VF without VLAN as `"vlan_list":[{}]`.
    if v["vlan_list"][0]["vlan"].as_u64().unwrap_or(0) != 0
        || v["trust"] == true
        || v["rate"]["max_tx"].as_u64().unwrap_or(0) != 0
    {
        return Err(format!("VF {} PF side after delete: {v}", a.vf));
    }
    if Path::new(&format!("/run/netns/{}", a.netns)).exists() {
        return Err(format!("netns {} still there", a.netns));
    }
    let left = devinfo_cni_files();
    if !left.is_empty() {
        return Err(format!("attachment device-info files left: {left:?}"));
    }
    Ok(())
}

fn plexus_log_mentions(s: &str) -> bool {
    std::fs::read_to_string("/tmp/node/plexus.log").is_ok_and(|l| l.contains(s))
}

const FALLBACK: &str = "pod-resources API unavailable; reading the device checkpoint";

fn bank_once(
    node: &mut Node,
    pf: &Pf,
    record: Record<'_>,
    pod_name: &str,
    label: &str,
) -> Result<Attached, String> {
    setup_nad(node)?;
    let before: Vec<VfSnap> = (0..crate::guest::NUM_VFS).map(|i| pf.snap(i)).collect();
    let (pod, took) = create_running(node, &bank_pod(pod_name))?;
    let a = check_attached(pf, &pod, NAD, true)?;
    let gone = delete_gone(node, pod_name)?;
    // The kubelet tears the sandbox down after the pod object is gone: wait for the VF.
    let b = before[a.vf as usize].clone();
    wait_for(Duration::from_secs(60), || pf.snap(a.vf) == b);
    check_released(pf, &a, &b)?;
    record(json!({"note": format!(
        "bank pod ({label}): create→Running {:.1} s, delete→gone {:.1} s, VF {} ({})",
        took.as_secs_f64(), gone.as_secs_f64(), a.vf, a.pci)}));
    Ok(a)
}

fn bank_by_device_plugin(node: &mut Node, pf: &Pf, record: Record<'_>) -> Result<(), String> {
    bank_once(node, pf, record, "pg-0", "device plugin, pod-resources API")?;
    if plexus_log_mentions(FALLBACK) {
        return Err("plexus fell back to the checkpoint while the pod-resources API was up".into());
    }
    Ok(())
}

fn bank_by_checkpoint(node: &mut Node, pf: &Pf, record: Record<'_>) -> Result<(), String> {
    // The socket gone (the kubelet keeps running): plexus must read the checkpoint.
    std::fs::remove_file(crate::node::POD_RESOURCES_SOCK)
        .map_err(|e| format!("remove the pod-resources socket: {e}"))?;
    bank_once(node, pf, record, "pg-1", "device plugin, checkpoint")?;
    if !plexus_log_mentions(FALLBACK) {
        return Err("plexus did not log the checkpoint fallback".into());
    }
    Ok(())
}

const DRA_DRIVER: &str = "sriovnetwork.k8snetworkplumbingwg.io";

/// The DRA path: sriovdp goes (one agent per VF), dra-driver-sriov publishes the VFs, the bank
/// pod asks for one through a ResourceClaim the real kube-scheduler allocates; plexus maps the
/// claim's device to the bank NAD by its `k8s.cni.cncf.io/resourceName` attribute and writes
/// the claim's `status.devices[].networkData`, released at delete. sriovdp comes back after.
fn bank_by_dra(node: &mut Node, pf: &Pf, record: Record<'_>) -> Result<(), String> {
    let r = bank_by_dra_inner(node, pf, record);
    if r.is_err() {
        let _ = node.kubectl(&[
            "-n",
            NS,
            "delete",
            "pod",
            "pg-dra",
            "--grace-period=0",
            "--force",
        ]);
    }
    let _ = node.kubectl(&[
        "-n",
        NS,
        "delete",
        "resourceclaim",
        "bank-vf",
        "--ignore-not-found",
        "--wait=false",
    ]);
    node.stop_proc("dra");
    node.start_sriovdp()?;
    node.wait_allocatable(&crate::guest::NUM_VFS.to_string(), Duration::from_secs(120))?;
    r
}

fn bank_by_dra_inner(node: &mut Node, pf: &Pf, record: Record<'_>) -> Result<(), String> {
    node.stop_proc("sriovdp");
    node.wait_allocatable("0", Duration::from_secs(120))?;
    node.start_dra()?;
    let sel = format!("spec.nodeName={}", node.name);
    let mut slices = Value::Null;
    let t = Instant::now();
    wait_for(Duration::from_secs(120), || {
        slices = node
            .get(&["resourceslices", "--field-selector", &sel])
            .unwrap_or(Value::Null);
        devices(&slices).len() == crate::guest::NUM_VFS as usize
    })
    .ok_or_else(|| {
        format!(
            "no ResourceSlice with the VFs in 120 s: {slices}\n{}",
            crate::node::log_tail("dra", 15)
        )
    })?;
    let devs = devices(&slices);
    for d in &devs {
        let a = &d["attributes"];
        if a["k8s.cni.cncf.io/resourceName"]["string"] != RESOURCE
            || !a["k8s.cni.cncf.io/deviceID"]["string"].is_string()
        {
            return Err(format!("device without the NPWG attributes: {d}"));
        }
    }
    record(
        json!({"note": format!("dra-driver-sriov published {} VFs in {:.1} s", devs.len(), t.elapsed().as_secs_f64())}),
    );
    setup_nad(node)?;
    node.apply(&json!({"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
        "metadata":{"name":"bank-vf","namespace":NS},
        "spec":{"devices":{"requests":[{"name":"vf","exactly":{"deviceClassName":DRA_DRIVER,"count":1}}]}}}))?;
    let before: Vec<VfSnap> = (0..crate::guest::NUM_VFS).map(|i| pf.snap(i)).collect();
    let mut pod = bank_pod("pg-dra");
    let spec = &mut pod["spec"];
    spec["resourceClaims"] = json!([{"name":"vf","resourceClaimName":"bank-vf"}]);
    spec["containers"][0]["resources"] = json!({"claims":[{"name":"vf"}]});
    let (pod, took) = create_running(node, &pod)?;
    let claim = node.get(&["-n", NS, "resourceclaim", "bank-vf"])?;
    let res = &claim["status"]["allocation"]["devices"]["results"][0];
    let dev = devs
        .iter()
        .find(|d| d["name"] == res["device"])
        .ok_or(format!("allocated device not in the slice: {claim}"))?;
    let dev_pci = dev["attributes"]["k8s.cni.cncf.io/deviceID"]["string"].clone();
    let a = check_attached(pf, &pod, NAD, false)?;
    if dev_pci != json!(a.pci) {
        return Err(format!("plexus used {} but the claim got {dev_pci}", a.pci));
    }
    let st = claim["status"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let nd = st
        .iter()
        .find(|d| d["device"] == res["device"])
        .map(|d| d["networkData"].clone())
        .unwrap_or(Value::Null);
    if nd["interfaceName"] != "net1" || nd["hardwareAddress"] != MAC || nd["ips"] != json!([IP]) {
        return Err(format!("claim status.devices: {}", claim["status"]));
    }
    let gone = delete_gone(node, "pg-dra")?;
    let b = before[a.vf as usize].clone();
    wait_for(Duration::from_secs(60), || pf.snap(a.vf) == b);
    check_released(pf, &a, &b)?;
    let claim = node.get(&["-n", NS, "resourceclaim", "bank-vf"])?;
    let left = claim["status"]["devices"]
        .as_array()
        .is_some_and(|l| l.iter().any(|d| !d["networkData"].is_null()));
    if left {
        return Err(format!("networkData not released: {}", claim["status"]));
    }
    record(json!({"note": format!(
        "bank pod (DRA claim, kube-scheduler): create→Running {:.1} s, delete→gone {:.1} s, VF {} ({})",
        took.as_secs_f64(), gone.as_secs_f64(), a.vf, a.pci)}));
    Ok(())
}

fn devices(slices: &Value) -> Vec<Value> {
    slices["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["spec"]["driver"] == DRA_DRIVER)
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// As many bank pods as VFs (each its own NAD: the static IP and MAC must differ), one more
/// the kubelet refuses (no VF left: a clear reason, no sandbox, no VF touched); then, while
/// they run, the kubelet restarted, sriovdp killed and containerd restarted; deleting them
/// afterwards still gives every VF back exactly as it was.
fn capacity_and_restarts(node: &mut Node, pf: &Pf, record: Record<'_>) -> Result<(), String> {
    let r = capacity_and_restarts_inner(node, pf, record);
    if r.is_err() && !node.alive("sriovdp") {
        // The cases after this one need the device plugin back.
        let _ = node.start_sriovdp();
    }
    r
}

fn capacity_and_restarts_inner(node: &mut Node, pf: &Pf, record: Record<'_>) -> Result<(), String> {
    let before: Vec<VfSnap> = (0..crate::guest::NUM_VFS).map(|i| pf.snap(i)).collect();
    let n = crate::guest::NUM_VFS as usize;
    let names: Vec<String> = (0..n).map(|i| format!("pg-cap-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let mut nad = bank_nad();
        let nad_name = format!("{NAD}-{i}");
        let mut cfg: Value = serde_json::from_str(nad["spec"]["config"].as_str().unwrap_or("{}"))
            .map_err(|e| e.to_string())?;
        cfg["name"] = json!(nad_name);
        cfg["mac"] = json!(format!("02:42:ac:11:01:{:02x}", i + 1));
        cfg["ipam"]["addresses"][0]["address"] = json!(format!("10.56.217.{}/24", 21 + i));
        nad["metadata"]["name"] = json!(nad_name);
        nad["spec"]["config"] = json!(cfg.to_string());
        node.apply(&nad)?;
        let mut pod = bank_pod(name);
        pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] = json!(nad_name);
        node.apply(&pod)?;
    }
    let t = Instant::now();
    for name in &names {
        wait_for(Duration::from_secs(240), || {
            node.get(&["-n", NS, "pod", name])
                .is_ok_and(|p| p["status"]["phase"] == "Running")
        })
        .ok_or(format!("{name} not Running in 240 s"))?;
    }
    record(
        json!({"note": format!("{n} bank pods (one per VF) Running {:.1} s after create", t.elapsed().as_secs_f64())}),
    );
    // Packets: every pod reaches every other one on net1 (VLAN 100 through the PF's switch) and
    // on eth0 (flannel).
    let bank_pings = |node: &Node, when: &str| -> Result<(), String> {
        let netns: Vec<String> = names
            .iter()
            .map(|name| pod_netns(node, name))
            .collect::<Result<_, _>>()?;
        // eth0 (flannel) addresses, from inside each pod.
        let eth0: Vec<String> = netns
            .iter()
            .map(|ns| {
                let j: Value = crate::vf::sh(&["ip", "-n", ns, "-j", "-4", "addr", "show", "eth0"])
                    .ok()
                    .and_then(|s| serde_json::from_str(&s).ok())
                    .unwrap_or_default();
                j[0]["addr_info"][0]["local"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        for (i, ns) in netns.iter().enumerate() {
            for j in (0..n).filter(|j| *j != i) {
                for (to, via) in [
                    (format!("10.56.217.{}", 21 + j), "net1"),
                    (eth0[j].clone(), "eth0"),
                ] {
                    crate::vf::sh(&["ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", &to])
                        .map_err(|e| {
                            format!("{when}: {} does not reach {to} on {via}: {e}", names[i])
                        })?;
                }
            }
        }
        Ok(())
    };
    bank_pings(node, "once Running")?;
    let used: Vec<VfSnap> = (0..crate::guest::NUM_VFS).map(|i| pf.snap(i)).collect();
    if used
        .iter()
        .any(|s| s.pf_side["vlan_list"][0]["vlan"] != 100)
    {
        return Err(format!("not every VF is in use: {used:?}"));
    }
    // One more, bound to the node directly: the kubelet's admission refuses it.
    let mut extra = bank_pod("pg-cap-extra");
    extra["spec"]["nodeName"] = json!(node.name);
    node.apply(&extra)?;
    let mut st = Value::Null;
    wait_for(Duration::from_secs(120), || {
        st = node
            .get(&["-n", NS, "pod", "pg-cap-extra"])
            .map(|p| p["status"].clone())
            .unwrap_or(Value::Null);
        st["phase"] == "Failed"
    })
    .ok_or_else(|| format!("the extra pod was not refused: {st}"))?;
    let why = format!("{} {}", st["reason"], st["message"]);
    if !why.contains(RESOURCE) {
        return Err(format!("the refusal does not name {RESOURCE}: {why}"));
    }
    let uid = node.get(&["-n", NS, "pod", "pg-cap-extra"])?["metadata"]["uid"].clone();
    let cri = Cri::new(Path::new("/tmp/node/containerd/containerd.sock"));
    if !cri
        .sandboxes(uid.as_str())
        .map_err(|e| format!("{e:#}"))?
        .is_empty()
    {
        return Err("the refused pod got a sandbox".into());
    }
    if (0..crate::guest::NUM_VFS)
        .map(|i| pf.snap(i))
        .collect::<Vec<_>>()
        != used
    {
        return Err("the refused pod changed a VF".into());
    }
    record(json!({"note": format!("pod beyond the VFs refused by the kubelet: {why}")}));
    node.kubectl(&["-n", NS, "delete", "pod", "pg-cap-extra", "--wait=false"])?;

    // Restarts while the pods run.
    let mark = node.log_len("kubelet");
    node.restart_kubelet()?;
    // sriovdp re-registers with the new kubelet (it watches for the kubelet's restart); until
    // then the kubelet counts no healthy device of the resource, and a plugin killed in that
    // window leaves running pods to a re-admission without devices. Kill it once registered.
    // The device manager's lines (not the plugin watcher's about the socket: those come
    // before the registration is over).
    let registered = |l: &str| {
        l.contains("sriov_igb")
            && (l.contains("Got registration request from device plugin")
                || l.contains("Device plugin connected"))
    };
    let Some(line) = node.wait_log("kubelet", mark, Duration::from_secs(120), registered) else {
        return Err(format!(
            "sriovdp did not re-register with the restarted kubelet in 120 s:\n{}\n--- kubelet on sriov_igb:\n{}",
            crate::node::log_tail("sriovdp", 5),
            crate::node::log_grep("kubelet", "sriov_igb", 15)
        ));
    };
    record(json!({"note": format!("sriovdp re-registered with the restarted kubelet: {line}")}));
    node.wait_allocatable(&n.to_string(), Duration::from_secs(60))?;
    node.stop_proc("sriovdp");
    node.stop_proc("containerd");
    node.start_containerd()?;
    if !node.alive("kubelet") {
        return Err(format!(
            "the kubelet exited when containerd restarted:\n{}",
            crate::node::log_tail("kubelet", 5)
        ));
    }
    // Back to service: every pod Running and Ready, then every ping, within 180 s. On a loaded
    // host the kubelet may find a sandbox gone with containerd and make a new one ("No ready
    // sandbox for pod can be found"), which plexus attaches again; reading the pods at once
    // then sees a sandbox without its eth0 yet.
    let t_back = Instant::now();
    let mut last = String::new();
    while t_back.elapsed() < Duration::from_secs(180) {
        let not_ready: Vec<String> = names
            .iter()
            .filter_map(|name| {
                let st = node.get(&["-n", NS, "pod", name]).ok()?["status"].clone();
                let ready = st["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
                (st["phase"] != "Running" || !ready)
                    .then(|| format!("{name}: {} {} {}", st["phase"], st["reason"], st["message"]))
            })
            .collect();
        if not_ready.is_empty() {
            match bank_pings(node, "after the kubelet and containerd restarts") {
                Ok(()) => {
                    last.clear();
                    break;
                }
                Err(e) => last = e,
            }
        } else {
            last = format!("not Running and Ready after the restarts: {not_ready:?}");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    if !last.is_empty() {
        return Err(format!(
            "{last} (180 s)\n--- kubelet on the pods:\n{}",
            crate::node::log_grep("kubelet", "pg-cap", 12)
        ));
    }
    record(json!({"note": format!(
        "after the restarts every bank pod was Ready and reached the others {:.1} s later",
        t_back.elapsed().as_secs_f64())}));
    record(
        json!({"note": format!("{n} bank pods reach each other on net1 (VLAN 100) and eth0 (flannel), before and after the restarts")}),
    );
    let t = Instant::now();
    for name in &names {
        node.kubectl(&["-n", NS, "delete", "pod", name, "--wait=false"])?;
    }
    let back = wait_for(Duration::from_secs(180), || {
        (0..crate::guest::NUM_VFS)
            .map(|i| pf.snap(i))
            .collect::<Vec<_>>()
            == before
    });
    let after: Vec<VfSnap> = (0..crate::guest::NUM_VFS).map(|i| pf.snap(i)).collect();
    node.start_sriovdp()?;
    back.ok_or(format!(
        "VFs not restored after the restarts and delete:\n  before {before:?}\n  after  {after:?}"
    ))?;
    for name in names
        .iter()
        .chain(std::iter::once(&"pg-cap-extra".to_string()))
    {
        wait_for(Duration::from_secs(120), || {
            node.kubectl(&["-n", NS, "get", "pod", name]).is_err()
        })
        .ok_or(format!("{name} not gone"))?;
    }
    record(
        json!({"note": format!("kubelet + containerd restarted, sriovdp killed: both VFs back {:.1} s after delete", t.elapsed().as_secs_f64())}),
    );
    if !devinfo_cni_files().is_empty() {
        return Err(format!(
            "attachment device-info files left: {:?}",
            devinfo_cni_files()
        ));
    }
    node.wait_allocatable(&n.to_string(), Duration::from_secs(120))
}

/// create→Running (and delete→VF back) of the bank pod through `sriov` and through sriov-cni
/// v2.10 (installed as `sriov-cni`, the same NAD with that type), in the order A B B A (the VM is
/// TCG: figures are relative). Per pod also the delegate's own ADD time (plexus' log) and how
/// many sandboxes the kubelet had to try, so a slow create→Running is explained. The ADD/DEL
/// micro-benchmark is cases_bench's.
fn sriov_vs_sriov_cni(node: &mut Node, pf: &Pf, record: Record<'_>) -> Result<(), String> {
    let before: Vec<VfSnap> = (0..crate::guest::NUM_VFS).map(|i| pf.snap(i)).collect();
    let mut figures = Vec::new();
    for (i, ty) in ["sriov-cni", "sriov", "sriov", "sriov-cni"]
        .iter()
        .enumerate()
    {
        let mut nad = bank_nad();
        let mut cfg: Value = serde_json::from_str(nad["spec"]["config"].as_str().unwrap_or("{}"))
            .map_err(|e| e.to_string())?;
        cfg["type"] = json!(ty);
        nad["spec"]["config"] = json!(cfg.to_string());
        node.apply(&nad)?;
        let name = format!("pg-cmp-{i}");
        let log_from = node.log_len("plexus");
        let (pod, took) = create_running(node, &bank_pod(&name))?;
        let adds = delegate_add_ms(log_from, ty);
        let failed = sandbox_failures(node, &name);
        // plexus + sriov gets the full check; for sriov-cni only which VF it took (the PF's view
        // of the MAC) matters here.
        let a = if *ty == "sriov" {
            check_attached(pf, &pod, NAD, true)?
        } else {
            let vf = (0..crate::guest::NUM_VFS)
                .find(|&i| pf.vfinfo(i)["address"] == MAC)
                .ok_or_else(|| format!("sriov-cni: no VF with {MAC}: {}", pod["metadata"]))?;
            Attached {
                pci: pf.vf_pci(vf).unwrap_or_default(),
                vf,
                netns: String::new(),
            }
        };
        let t = Instant::now();
        delete_gone(node, &name)?;
        let b = before[a.vf as usize].clone();
        let back = wait_for(Duration::from_secs(120), || pf.snap(a.vf) == b);
        let after = pf.snap(a.vf);
        figures.push(format!(
            "{ty}: create→Running {:.1} s (delegate ADD {adds:?} ms, {failed} failed sandbox), delete→VF back {}",
            took.as_secs_f64(),
            back.map_or(format!("NOT restored ({after:?})"), |_| format!(
                "{:.1} s",
                t.elapsed().as_secs_f64()
            ))
        ));
        if back.is_none() {
            record(json!({"note": format!("bank pod side by side: {}", figures.join("; "))}));
            return Err(format!(
                "{ty} left VF {} changed:\n  before {b:?}\n  after  {after:?}",
                a.vf
            ));
        }
    }
    setup_nad(node)?;
    record(
        json!({"note": format!("bank pod side by side (TCG VM, order A B B A): {}", figures.join("; "))}),
    );
    Ok(())
}

/// The `elapsed_ms` of every ADD of delegate `ty` plexus logged after byte `from` of its log.
fn delegate_add_ms(from: usize, ty: &str) -> Vec<u64> {
    let log = std::fs::read_to_string("/tmp/node/plexus.log").unwrap_or_default();
    let key = format!("delegate finished plugin={ty} verb=\"ADD\"");
    log.get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&key))
        .filter_map(|l| {
            l.split("elapsed_ms=")
                .nth(1)?
                .split([' ', '.'])
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// How many times the kubelet reported a failed sandbox for pod `name`.
fn sandbox_failures(node: &Node, name: &str) -> u64 {
    node.get(&[
        "-n",
        NS,
        "events",
        "--field-selector",
        &format!("involvedObject.name={name},reason=FailedCreatePodSandBox"),
    ])
    .ok()
    .and_then(|v| v["items"].as_array().cloned())
    .unwrap_or_default()
    .iter()
    .map(|e| e["count"].as_u64().unwrap_or(1))
    .sum()
}
