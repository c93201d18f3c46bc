//! Host side of the node cases: a real control plane (etcd + kube-apiserver, the realk8s rig) on
//! the host's loopback, reached from the VM through QEMU's user network: a second NIC
//! (virtio-net) on a `restrict=on` user network whose only way out is a `guestfwd` of
//! 10.0.2.100:<port> to the apiserver (each connection relayed by `busybox nc`). The VM then only
//! carries what a node carries (containerd, kubelet, flanneld, sriovdp, plexus), and the
//! apiserver's serving certificate for 127.0.0.1 stays valid: the guest relays 127.0.0.1:<port>
//! to 10.0.2.100:<port>.
//!
//! Everything the guest needs goes into `<out>/node/` (the writable 9p share): `node.json`
//! (paths of the binaries, containerd 2.3's unpacked here, which the guest sees at the same
//! paths over the read-only host root,
//! the port, the node name), the kubelet's and the admin's kubeconfigs, plexus' ServiceAccount
//! token and the pause image.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plexus_e2e::realk8s::bins::{find_usable, target_dir};
use plexus_e2e::realk8s::runtimes::{Containerd, ContainerdBins};
use plexus_e2e::realk8s::{pause, ControlPlane, K8sBins, Proc};
use serde_json::json;

use crate::common::bin_dir;

/// Guest-side address QEMU's guestfwd listens on.
pub const GUEST_FWD_IP: &str = "10.0.2.100";

/// MACs of the two nodes' NICs when a second node runs: the first VM's (`a`) and the second's
/// (`b`) NIC to the apiserver (user network) and NIC between them (node network).
const API_MAC: [&str; 2] = ["52:54:00:27:0a:03", "52:54:00:27:0b:03"];
const NODE_MAC: [&str; 2] = ["52:54:00:27:0a:02", "52:54:00:27:0b:02"];
/// The taint the second node carries (pods reach it by `nodeName` only).
pub const SECOND_NODE_TAINT: &str = "plexus.cni.io/second-test-node";

/// The running control plane; dropping it stops everything (after QEMU has gone).
pub struct NodeHost {
    /// Extra QEMU arguments (the second NIC and its user network).
    pub qemu_args: Vec<String>,
    /// The second node's QEMU arguments, when asked for: its NIC to the apiserver and the
    /// node network to the first VM.
    pub second_qemu_args: Option<Vec<String>>,
    // Drop order: processes before the control plane.
    _scheduler: Option<Proc>,
    _controller_manager: Option<Proc>,
    _cp: ControlPlane,
}

/// `Ok(None)`: no `PLEXUS_K8S_BIN` (the node cases are skipped, with a note, unless
/// `PLEXUS_K8S_REQUIRE=1`, which makes that an error).
///
/// With `second` (the second VM's out share) a second node's files go to `<second>/node/`, and
/// both nodes get a node network between them (a `-netdev dgram` pair on 127.0.0.1) for
/// flannel's VXLAN.
pub fn prepare(out: &Path, second: Option<&Path>) -> Result<Option<NodeHost>> {
    let Some(bins) = K8sBins::from_env()? else {
        if plexus_e2e::realk8s::bins::required() {
            anyhow::bail!(
                "PLEXUS_K8S_REQUIRE=1 but {}",
                plexus_e2e::realk8s::bins::skip_message()
            );
        }
        return Ok(None);
    };
    // `../shared/<dir>/bin`, found next to PLEXUS_K8S_BIN (`../shared/k8s/bin`) like the
    // overlay rig does; PLEXUS_OVERLAYS_BIN / PLEXUS_SRIOV_STACK_BIN override.
    let k8s =
        PathBuf::from(std::env::var_os(plexus_e2e::realk8s::bins::BIN_ENV).unwrap_or_default());
    let dir_of = |env: &str, dir: &str| {
        std::env::var_os(env)
            .map(PathBuf::from)
            .unwrap_or_else(|| k8s.join("../..").join(dir).join("bin"))
    };
    let overlays = dir_of(plexus_e2e::realk8s::overlay::OVERLAYS_ENV, "overlays");
    let stack = dir_of("PLEXUS_SRIOV_STACK_BIN", "sriov-stack");
    let need = |dir: &Path, name: &str| -> Result<PathBuf> {
        find_usable(dir, name)?.with_context(|| format!("{name} not in {}", dir.display()))
    };
    let flanneld = need(&overlays, "flanneld")?;
    let flannel = need(&overlays, "flannel")?;
    let sriovdp = need(&stack, "sriovdp")?;
    let dra = need(&stack, "dra-driver-sriov")?;
    let peers = dir_of("PLEXUS_PEERS_BIN", "peers");
    let sriov_cni = need(&peers, "sriov-cni")?;
    // containerd 2.3 (with its shim and ctr), unpacked here: the guest's root is read-only, and
    // it sees the target directory at the same path.
    let containerd = ContainerdBins::find(Containerd::V2)?;
    // The second kubelet node's case needs real whereabouts and kube-controller-manager.
    let ipam = dir_of("PLEXUS_IPAM_BIN", "ipam");
    let whereabouts = find_usable(&ipam, "whereabouts")?;
    let second = match second {
        Some(s) if whereabouts.is_some() && bins.controller_manager.is_some() => Some(s),
        Some(_) => {
            let why = format!(
                "the second kubelet node needs whereabouts (in {}) and kube-controller-manager (in PLEXUS_K8S_BIN)",
                ipam.display()
            );
            if plexus_e2e::realk8s::bins::required() {
                anyhow::bail!("PLEXUS_K8S_REQUIRE=1 but {why}");
            }
            println!("vm_sriov: {why}: the second VM runs no kubelet");
            None
        }
        None => None,
    };
    let scheduler = bins
        .scheduler
        .clone()
        .context("kube-scheduler not in PLEXUS_K8S_BIN (the DRA case needs it)")?;
    let cp = ControlPlane::start(&bins)?;
    cp.apply_deploy(&["nad-crd.yaml", "rbac.yaml", "rbac-dra.yaml"])?;
    dra_objects(&cp, &stack.join("../dra-driver-sriov"))?;
    cp.create_namespace("bank")?;
    // The quickstart's namespace (no controller-manager: its default ServiceAccount and CA
    // ConfigMap are made here).
    cp.create_namespace("default")?;
    // This Kubernetes build (openshift/microshift's vendored v1.36.2) projects the ConfigMap
    // `openshift-service-ca.crt` into every ServiceAccount token volume, and the kubelet waits
    // for it; the quickstart pod mounts its token, so the ConfigMap is made here.
    for ns in ["default", "bank"] {
        cp.apply(
            &json!({"apiVersion":"v1","kind":"ConfigMap",
                "metadata":{"name":"openshift-service-ca.crt","namespace":ns},
                "data":{"service-ca.crt":cp.ca_pem()}})
            .to_string(),
        )?;
    }
    // The real kube-scheduler allocates the DRA claim (and binds that pod).
    let kc = cp.admin_kubeconfig().display().to_string();
    let sched = Proc::spawn(
        "kube-scheduler",
        &scheduler,
        &[
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ],
        &cp.dir().join("scheduler.log"),
    )?;
    let dir = out.join("node");
    std::fs::create_dir_all(&dir)?;
    let token = cp.create_token("kube-system", "plexus")?;
    std::fs::write(dir.join("plexus.token"), &token)?;
    std::fs::write(dir.join("ca.crt"), cp.ca_pem())?;
    let name = format!("vm-sriov-{}", std::process::id());
    let cert = cp.client_cert(&format!("system:node:{name}"), Some("system:nodes"))?;
    cp.write_cert_kubeconfig(&dir.join("kubelet.kubeconfig"), &cert)?;
    cp.write_kubeconfig(&dir.join("admin.kubeconfig"), cp.admin_token())?;
    pause::build_image(&dir.join("pause-work"), &dir.join("pause.tar"))?;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut cfg = json!({
        "name": name,
        "port": cp.port(),
        "kubelet": bins.kubelet,
        "kubectl": bins.kubectl,
        "flanneld": flanneld,
        "flannel": flannel,
        "sriovdp": sriovdp,
        "dra": dra,
        "sriov_cni": sriov_cni,
        "containerd_dir": containerd.dir,
        "plexus_src": bin_dir(),
        "install_sh": repo.join("deploy/install.sh").canonicalize()?,
        "target": target_dir(),
    });
    let port = cp.port();
    let api_netdev = |mac: Option<&str>| {
        let device = match mac {
            Some(m) => format!("virtio-net-pci,netdev=n1,mac={m}"),
            None => "virtio-net-pci,netdev=n1".to_string(),
        };
        vec![
            "-netdev".to_string(),
            format!("user,id=n1,restrict=on,net=10.0.2.0/24,guestfwd=tcp:{GUEST_FWD_IP}:{port}-cmd:busybox nc 127.0.0.1 {port}"),
            "-device".to_string(),
            device,
        ]
    };
    let mut qemu_args = api_netdev(None);
    let mut second_qemu_args = None;
    if let Some(second) = second {
        let ports = [free_udp_port()?, free_udp_port()?];
        let node_net = |i: usize| {
            vec![
                "-netdev".to_string(),
                format!("dgram,id=nodenet,local.type=inet,local.host=127.0.0.1,local.port={},remote.type=inet,remote.host=127.0.0.1,remote.port={}", ports[i], ports[1 - i]),
                "-device".to_string(),
                format!("virtio-net-pci,netdev=nodenet,mac={}", NODE_MAC[i]),
            ]
        };
        qemu_args = api_netdev(Some(API_MAC[0]));
        qemu_args.extend(node_net(0));
        let mut b = api_netdev(Some(API_MAC[1]));
        b.extend(node_net(1));
        second_qemu_args = Some(b);
        cfg["whereabouts"] = json!(whereabouts);
        let two = |i: usize| {
            json!({"api_mac": API_MAC[i], "node_mac": NODE_MAC[i],
                   "node_ip": format!("10.0.3.{}/24", i + 1),
                   "pod_cidr": format!("10.244.{i}.0/24")})
        };
        for (k, v) in two(0).as_object().into_iter().flatten() {
            cfg[k] = v.clone();
        }
        // The second node: its own name and kubelet certificate, the rest as the first's.
        let bdir = second.join("node");
        std::fs::create_dir_all(&bdir)?;
        let bname = format!("{name}-b");
        let bcert = cp.client_cert(&format!("system:node:{bname}"), Some("system:nodes"))?;
        cp.write_cert_kubeconfig(&bdir.join("kubelet.kubeconfig"), &bcert)?;
        for f in ["plexus.token", "ca.crt", "admin.kubeconfig", "pause.tar"] {
            std::fs::copy(dir.join(f), bdir.join(f))?;
        }
        let mut bcfg = cfg.clone();
        bcfg["name"] = json!(bname);
        // The first node's cases leave their pods to the scheduler: none may land here.
        bcfg["taints"] = json!([{"key": SECOND_NODE_TAINT, "effect": "NoSchedule"}]);
        for (k, v) in two(1).as_object().into_iter().flatten() {
            bcfg[k] = v.clone();
        }
        std::fs::write(bdir.join("node.json"), serde_json::to_vec_pretty(&bcfg)?)?;
        two_nodes_objects(&cp, &dir, &repo, &ipam)?;
    }
    std::fs::write(dir.join("node.json"), serde_json::to_vec_pretty(&cfg)?)?;
    std::fs::write(
        dir.join("quickstart-bank.json"),
        quickstart_bank(&cp, &repo)?,
    )?;
    // Two nodes run the bank's StatefulSet and its client Deployment: their controllers.
    let controller_manager = match second {
        Some(_) => Some(controllers(&cp, &bins)?),
        None => None,
    };
    Ok(Some(NodeHost {
        qemu_args,
        second_qemu_args,
        _scheduler: Some(sched),
        _controller_manager: controller_manager,
        _cp: cp,
    }))
}

/// A free UDP port on 127.0.0.1 (bound, then released for QEMU), never one this process
/// handed out before.
pub fn free_udp_port() -> Result<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..100 {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    anyhow::bail!("no UDP port not handed out already")
}

/// kube-controller-manager with the controllers the two-node case needs (StatefulSet,
/// Deployment and its ReplicaSet, the garbage collector that deletes their pods); no node lifecycle controller: the test fences the dead node
/// itself, as an operator does.
fn controllers(cp: &ControlPlane, bins: &K8sBins) -> Result<Proc> {
    let kcm = bins
        .controller_manager
        .clone()
        .context("kube-controller-manager not in PLEXUS_K8S_BIN (the two-node case needs it)")?;
    let kc = cp.admin_kubeconfig().display().to_string();
    Proc::spawn(
        "kube-controller-manager",
        &kcm,
        &[
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--use-service-account-credentials=false".into(),
            format!("--root-ca-file={}", cp.ca_path().display()),
            format!(
                "--service-account-private-key-file={}",
                cp.dir().join("sa.key").display()
            ),
            "--controllers=statefulset,deployment,replicaset,garbagecollector".into(),
        ],
        &cp.dir().join("controller-manager.log"),
    )
}

/// What the two-node case needs besides the nodes: the address-claim CRD and plexus' rights on
/// it, real whereabouts' CRDs (its binary goes into node.json), and docs/sriov.md's two-node
/// objects as a JSON List in `<dir>/two-nodes.json`.
fn two_nodes_objects(cp: &ControlPlane, dir: &Path, repo: &Path, ipam: &Path) -> Result<()> {
    cp.apply_deploy(&["address-claim-crd.yaml", "rbac-fixed-ips.yaml"])?;
    for crd in [
        "whereabouts.cni.cncf.io_ippools.yaml",
        "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
    ] {
        cp.apply_file(&ipam.join("../whereabouts").join(crd))?;
    }
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/ippools.whereabouts.cni.cncf.io",
        "crd/overlappingrangeipreservations.whereabouts.cni.cncf.io",
        "crd/addressclaims.plexus.cni.io",
    ])?;
    let list = doc_objects(
        cp,
        repo,
        "docs/sriov.md",
        "## The bank database on two nodes",
    )?;
    std::fs::write(dir.join("two-nodes.json"), list)?;
    Ok(())
}

/// The DRA driver's CRDs, DeviceClass and a policy that gives the VM's VFs (82576 VF, igbvf)
/// the attribute `k8s.cni.cncf.io/resourceName: intel.com/sriov_igb`, the bank NAD's
/// resourceName: the same NAD serves both paths.
fn dra_objects(cp: &ControlPlane, dir: &Path) -> Result<()> {
    for f in [
        "sriovnetwork.k8snetworkplumbingwg.io_deviceattributes.yaml",
        "sriovnetwork.k8snetworkplumbingwg.io_sriovresourcepolicies.yaml",
        "deviceclass.yaml",
    ] {
        cp.apply_file(&dir.join(f))
            .with_context(|| format!("apply {}", dir.join(f).display()))?;
    }
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/sriovresourcepolicies.sriovnetwork.k8snetworkplumbingwg.io",
        "crd/deviceattributes.sriovnetwork.k8snetworkplumbingwg.io",
    ])?;
    cp.create_namespace("dra-driver-sriov")?;
    let g = "sriovnetwork.k8snetworkplumbingwg.io/v1alpha1";
    cp.apply(
        &json!({"apiVersion":g,"kind":"DeviceAttributes","metadata":{"name":"igb-vfs",
            "namespace":"dra-driver-sriov","labels":{"pool":"igb-vfs"}},
            "spec":{"attributes":{"k8s.cni.cncf.io/resourceName":{"string":crate::node::RESOURCE}}}})
        .to_string(),
    )?;
    cp.apply(
        &json!({"apiVersion":g,"kind":"SriovResourcePolicy","metadata":{"name":"igb-vfs",
            "namespace":"dra-driver-sriov"},
            "spec":{"configs":[{"deviceAttributesSelector":{"matchLabels":{"pool":"igb-vfs"}},
                "resourceFilters":[{"vendors":["8086"],"devices":["10ca"],"drivers":["igbvf"]}]}]}})
        .to_string(),
    )?;
    Ok(())
}

/// The bank case of docs/quickstart.md (its section 3 YAML block: the NAD and the pod) as
/// JSON: the tier runs exactly these objects.
fn quickstart_bank(cp: &ControlPlane, repo: &Path) -> Result<String> {
    doc_objects(cp, repo, "docs/quickstart.md", "## 3. The bank case")
}

/// The first YAML block after `heading` in the repo's document `doc`, as JSON objects
/// converted by kubectl on the host (`create --dry-run=client`).
fn doc_objects(cp: &ControlPlane, repo: &Path, doc: &str, heading: &str) -> Result<String> {
    let text = std::fs::read_to_string(repo.join(doc))?;
    let start = text
        .find(heading)
        .with_context(|| format!("{doc} has no '{heading}' section"))?;
    let (_, yaml) = crate::common::markdown_blocks(&text[start..], "yaml")
        .into_iter()
        .next()
        .with_context(|| format!("no YAML block in {doc}'s '{heading}'"))?;
    cp.kubectl_stdin(
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        Some(&yaml),
    )
}
