//! Inside the VM: a real Kubernetes node on the SR-IOV VM. containerd 2.3 (the host unpacked it
//! into the target directory, which the VM sees at the same path; config version 3, cgroupfs on
//! the guest's cgroup v2) + kubelet v1.36
//! (root dir `/var/lib/kubelet`, a tmpfs of the VM, so the device-plugin and pod-resources
//! sockets are where every agent expects them), registered with the host's kube-apiserver
//! (`node_host`), flanneld `--kube-subnet-mgr` on the node's own NIC as the cluster network,
//! plexus installed by `deploy/install.sh`, and sriovdp advertising the VFs as
//! `intel.com/sriov_igb`. Writable state lives in the VM's tmpfs (`/tmp/node`, `/run`,
//! `/var/lib/kubelet`); the host's root is read-only. [`Node::stop`] stops everything in reverse.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plexus_e2e::realk8s::cri::Cri;
use plexus_e2e::realk8s::runtimes::{Containerd, ContainerdBins};
use serde_json::{json, Value};

use crate::vf::{sh, wait_for};

/// The node's working directory in the VM.
pub const DIR: &str = "/tmp/node";
/// The node's CNI conf dir.
pub const CONF_DIR: &str = "/tmp/node/cni/net.d";
/// The node's CNI bin dir.
pub const BIN_DIR: &str = "/tmp/node/cni/bin";
/// whereabouts' flat config on a node (the NADs' `configuration_path`).
pub const WHEREABOUTS_CONF: &str = "/tmp/node/cni/net.d/whereabouts.d/whereabouts.conf";
/// dra-driver-sriov's CDI specs, the one CDI directory containerd reads.
pub const CDI_DIR: &str = "/tmp/node/cdi";
/// The sriovdp resource.
pub const RESOURCE: &str = "intel.com/sriov_igb";
/// The VF device-info files sriovdp writes.
pub const DEVINFO_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/dp";
/// What the Node must report as its runtime (`status.nodeInfo.containerRuntimeVersion`).
pub const RUNTIME_VERSION: &str = "containerd://2.3.";
/// Present only on a cgroup v2 hierarchy.
const CGROUP_V2_PROBE: &str = "/sys/fs/cgroup/cgroup.controllers";
/// The kubelet's pod-resources socket.
pub const POD_RESOURCES_SOCK: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// A running node.
pub struct Node {
    /// Node name.
    pub name: String,
    /// `node.json` from the host.
    pub cfg: Value,
    /// The address the kubelet reports (`--node-ip`).
    node_ip: String,
    /// containerd 2.3's programs (node.json `containerd_dir`).
    containerd: ContainerdBins,
    procs: Vec<(String, Child)>,
}

fn p(s: &str) -> PathBuf {
    Path::new(DIR).join(s)
}

fn spawn(name: &str, prog: &str, args: &[String], env: &[(&str, String)]) -> Result<Child, String> {
    // Appended: a restarted process keeps its earlier log.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p(&format!("{name}.log")))
        .map_err(|e| e.to_string())?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut c = Command::new(prog);
    c.args(args).stdout(log).stderr(err).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().map_err(|e| format!("{prog}: {e}"))
}

/// The last `n` lines of a node log (`kubelet`, `containerd`, …).
pub fn log_tail(name: &str, n: usize) -> String {
    let s = std::fs::read_to_string(p(&format!("{name}.log"))).unwrap_or_default();
    let l: Vec<&str> = s.lines().collect();
    l[l.len().saturating_sub(n)..].join("\n")
}

/// The last `n` lines of a node log that contain `needle`.
pub fn log_grep(name: &str, needle: &str, n: usize) -> String {
    let s = std::fs::read_to_string(p(&format!("{name}.log"))).unwrap_or_default();
    let l: Vec<&str> = s.lines().filter(|l| l.contains(needle)).collect();
    l[l.len().saturating_sub(n)..].join("\n")
}

/// Relays 127.0.0.1:`port` to the host's apiserver (QEMU's guestfwd at 10.0.2.100:`port`), so
/// the serving certificate (127.0.0.1) and every kubeconfig hold unchanged in the VM.
fn relay(port: u16) -> Result<(), String> {
    let l = TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("relay bind: {e}"))?;
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let Ok(up) = TcpStream::connect((crate::node_host::GUEST_FWD_IP, port)) else {
                continue;
            };
            let (Ok(c2), Ok(up2)) = (c.try_clone(), up.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || pipe(c, up));
            std::thread::spawn(move || pipe(up2, c2));
        }
    });
    Ok(())
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 1];
    let _ = from.read(&mut sink);
}

/// The VM's address on QEMU's user network (the way to the apiserver).
const API_IP: &str = "10.0.2.15";

/// The netdev with MAC `mac` (QEMU's `-device …,mac=`).
fn nic_by_mac(mac: &str) -> Result<String, String> {
    for e in std::fs::read_dir("/sys/class/net").map_err(|e| e.to_string())? {
        let n = e.map_err(|e| e.to_string())?.file_name();
        let n = n.to_string_lossy().into_owned();
        let a = std::fs::read_to_string(format!("/sys/class/net/{n}/address")).unwrap_or_default();
        if a.trim().eq_ignore_ascii_case(mac) {
            return Ok(n);
        }
    }
    Err(format!("no NIC with MAC {mac} in the VM"))
}

/// The netdev driven by virtio_net (the node's own NIC).
fn node_nic() -> Result<String, String> {
    for e in std::fs::read_dir("/sys/class/net").map_err(|e| e.to_string())? {
        let n = e.map_err(|e| e.to_string())?.file_name();
        let n = n.to_string_lossy().into_owned();
        let drv = std::fs::read_link(format!("/sys/class/net/{n}/device/driver")).ok();
        if drv.is_some_and(|d| d.ends_with("virtio_net")) {
            return Ok(n);
        }
    }
    Err("no virtio_net NIC in the VM (QEMU started without the node's netdev?)".into())
}

impl Node {
    /// kubectl as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_stdin(args, None)
    }

    /// kubectl as the admin, with `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write as _;
        let kc = p("admin.kubeconfig").display().to_string();
        let mut c = Command::new(self.cfg["kubectl"].as_str().unwrap_or("kubectl"))
            .arg(format!("--kubeconfig={kc}"))
            .arg(format!("--cache-dir={}", p("kubectl-cache").display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("kubectl: {e}"))?;
        if let Some(s) = stdin {
            let _ = c.stdin.take().map(|mut i| i.write_all(s.as_bytes()));
        }
        drop(c.stdin.take());
        let o = c.wait_with_output().map_err(|e| e.to_string())?;
        if o.status.success() {
            Ok(String::from_utf8_lossy(&o.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
    }

    /// `kubectl get -o json`.
    pub fn get(&self, args: &[&str]) -> Result<Value, String> {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a)?).map_err(|e| e.to_string())
    }

    /// `kubectl apply -f -` of a JSON object.
    pub fn apply(&self, obj: &Value) -> Result<String, String> {
        self.kubectl_stdin(&["apply", "-f", "-"], Some(&obj.to_string()))
    }

    /// Starts the node; `out` is the host's share with `node/node.json`.
    pub fn start(out: &Path) -> Result<Node, String> {
        let t0 = Instant::now();
        let src = out.join("node");
        let cfg: Value = serde_json::from_slice(
            &std::fs::read(src.join("node.json")).map_err(|e| format!("node.json: {e}"))?,
        )
        .map_err(|e| e.to_string())?;
        let containerd = ContainerdBins {
            line: Containerd::V2,
            dir: cfg["containerd_dir"]
                .as_str()
                .ok_or("node.json names no containerd_dir (containerd 2.3's programs)")?
                .into(),
        };
        let mut node = Node {
            name: cfg["name"].as_str().unwrap_or("vm-node").to_string(),
            cfg,
            node_ip: API_IP.into(),
            containerd,
            procs: Vec::new(),
        };
        for d in [
            "cni/bin",
            "cni/net.d",
            "containerd/root",
            "containerd/state",
            "sa",
            "pcidp",
        ] {
            std::fs::create_dir_all(p(d)).map_err(|e| e.to_string())?;
        }
        for f in [
            "admin.kubeconfig",
            "kubelet.kubeconfig",
            "pause.tar",
            "ca.crt",
        ] {
            std::fs::copy(src.join(f), p(f)).map_err(|e| format!("{f}: {e}"))?;
        }
        std::fs::copy(src.join("plexus.token"), p("sa/token")).map_err(|e| e.to_string())?;
        std::fs::copy(src.join("ca.crt"), p("sa/ca.crt")).map_err(|e| e.to_string())?;
        let r = node.boot(t0);
        if let Err(e) = r {
            let logs = ["containerd", "kubelet", "flanneld", "sriovdp", "install"]
                .iter()
                .map(|n| format!("--- {n}.log:\n{}", log_tail(n, 12)))
                .collect::<Vec<_>>()
                .join("\n");
            node.stop();
            return Err(format!("{e}\n{logs}"));
        }
        Ok(node)
    }

    fn s(&self, k: &str) -> String {
        self.cfg[k].as_str().unwrap_or_default().to_string()
    }

    /// This node's pod CIDR (node.json `pod_cidr`; one node alone: 10.244.0.0/24).
    fn pod_cidr(&self) -> String {
        self.cfg["pod_cidr"]
            .as_str()
            .unwrap_or("10.244.0.0/24")
            .to_string()
    }

    fn boot(&mut self, t0: Instant) -> Result<(), String> {
        // The NIC to the apiserver (QEMU's user network); with two nodes (`node_mac`,
        // `node_ip` in node.json) a second NIC between the VMs carries the node traffic
        // (flannel's VXLAN), each NIC found by its MAC.
        let api_nic = match self.cfg["api_mac"].as_str() {
            Some(mac) => nic_by_mac(mac)?,
            None => node_nic()?,
        };
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{API_IP}/24"),
            "dev",
            &api_nic,
        ])?;
        sh(&["ip", "link", "set", &api_nic, "up"])?;
        sh(&["ip", "route", "add", "default", "via", "10.0.2.2"])?;
        let nic = match (self.cfg["node_mac"].as_str(), self.cfg["node_ip"].as_str()) {
            (Some(mac), Some(cidr)) => {
                let n = nic_by_mac(mac)?;
                sh(&["ip", "addr", "add", cidr, "dev", &n])?;
                sh(&["ip", "link", "set", &n, "up"])?;
                self.node_ip = cidr.split('/').next().unwrap_or(cidr).to_string();
                n
            }
            _ => api_nic,
        };
        let port = self.cfg["port"].as_u64().unwrap_or(0) as u16;
        relay(port)?;
        let sys = |k: &str, v: &str| crate::vf::write_sys(&format!("/proc/sys/{k}"), v);
        sys("net/ipv4/ip_forward", "1")?;
        for e in std::fs::read_dir("/usr/lib/cni").map_err(|e| format!("/usr/lib/cni: {e}"))? {
            let e = e.map_err(|e| e.to_string())?;
            let _ = std::os::unix::fs::symlink(e.path(), Path::new(BIN_DIR).join(e.file_name()));
        }
        let _ = std::os::unix::fs::symlink(self.s("flannel"), Path::new(BIN_DIR).join("flannel"));
        self.whereabouts()?;
        // sriov-cni v2.10 under another name, for the side-by-side case.
        let _ =
            std::os::unix::fs::symlink(self.s("sriov_cni"), Path::new(BIN_DIR).join("sriov-cni"));

        // containerd 2.3 on the guest's cgroup v2 (the initramfs mounts cgroup2 on
        // /sys/fs/cgroup; v1 would have no cgroup.controllers there).
        if !Path::new(CGROUP_V2_PROBE).exists() {
            return Err(format!(
                "the VM has no cgroup v2 ({CGROUP_V2_PROBE} missing): the initramfs did not mount cgroup2"
            ));
        }
        std::fs::write(p("containerd/config.toml"), containerd_config()?)
            .map_err(|e| e.to_string())?;
        self.start_containerd()?;
        let sock = p("containerd/containerd.sock").display().to_string();
        let ctr_bin = self.containerd.ctr().display().to_string();
        let ctr = |a: &[&str]| {
            let mut v = vec![ctr_bin.as_str(), "--address", &sock, "-n", "k8s.io"];
            v.extend_from_slice(a);
            sh(&v)
        };
        ctr(&["images", "import", &p("pause.tar").display().to_string()])?;
        let t_cd = t0.elapsed();

        // kubelet
        std::fs::write(p("kubelet.yaml"), kubelet_config(&sock)).map_err(|e| e.to_string())?;
        self.start_kubelet()?;
        let name = self.name.clone();
        wait_for(Duration::from_secs(120), || {
            self.kubectl(&["get", "node", &name]).is_ok()
        })
        .ok_or("the kubelet did not register the Node in 120 s")?;
        let t_reg = t0.elapsed();
        let runtime = self.get(&["node", &name])?["status"]["nodeInfo"]["containerRuntimeVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !runtime.starts_with(RUNTIME_VERSION) {
            return Err(format!(
                "the Node reports runtime {runtime:?}, not {RUNTIME_VERSION}* (containerd from {})",
                self.containerd.dir.display()
            ));
        }

        // flannel: the Node's podCIDR (no controller-manager), flanneld on the node's NIC.
        self.kubectl(&[
            "patch",
            "node",
            &name,
            "--type",
            "merge",
            "-p",
            &json!({"spec":{"podCIDR":self.pod_cidr(),"podCIDRs":[self.pod_cidr()]}}).to_string(),
        ])?;
        std::fs::write(
            p("net-conf.json"),
            r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#,
        )
        .map_err(|e| e.to_string())?;
        let f = spawn(
            "flanneld",
            &self.s("flanneld"),
            &[
                "--kube-subnet-mgr".into(),
                format!("--kubeconfig-file={}", p("admin.kubeconfig").display()),
                format!("--iface={nic}"),
                format!("--public-ip={}", self.node_ip),
                "--ip-masq=false".into(),
                format!("--net-config-path={}", p("net-conf.json").display()),
                "--subnet-file=/run/flannel/subnet.env".into(),
            ],
            &[("NODE_NAME", name.clone())],
        )?;
        self.procs.push(("flanneld".into(), f));
        wait_for(Duration::from_secs(60), || {
            Path::new("/run/flannel/subnet.env").exists()
        })
        .ok_or("flanneld wrote no subnet.env in 60 s")?;
        let flannel = json!({"name":"cbr0","cniVersion":"0.3.1","plugins":[
            {"type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}},
            {"type":"portmap","capabilities":{"portMappings":true}}]});
        std::fs::write(
            Path::new(CONF_DIR).join("10-flannel.conflist"),
            serde_json::to_vec_pretty(&flannel).unwrap_or_default(),
        )
        .map_err(|e| e.to_string())?;

        // plexus, by deploy/install.sh (one shot, the DaemonSet's environment mapped to the
        // node's dirs), with a token bound to this Node: the apiserver then knows the node
        // plexus speaks for (DRA's per-driver `associated-node` check of claim status writes).
        match self.kubectl(&[
            "create",
            "token",
            "plexus",
            "-n",
            "kube-system",
            "--bound-object-kind",
            "Node",
            "--bound-object-name",
            &name,
            "--duration",
            "2h",
        ]) {
            Ok(t) => std::fs::write(p("sa/token"), t.trim()).map_err(|e| e.to_string())?,
            Err(e) => println!("vm-node: no Node-bound token ({e}); the unbound one is used"),
        }
        self.install()?;
        wait_for(Duration::from_secs(120), || {
            self.get(&["node", &name])
                .ok()
                .and_then(|n| {
                    n["status"]["conditions"].as_array().map(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                })
                .unwrap_or(false)
        })
        .ok_or("the Node did not become Ready in 120 s")?;
        // The kubelet's cgroupfs driver made its QoS hierarchy as cgroup v2 groups.
        if !Path::new("/sys/fs/cgroup/kubepods/cgroup.controllers").exists() {
            return Err("the Ready node has no cgroup v2 group /sys/fs/cgroup/kubepods".into());
        }
        // The kubelet registers with node.kubernetes.io/not-ready:NoSchedule; the node
        // lifecycle controller (kube-controller-manager, not run here) would lift it once Ready.
        self.kubectl(&[
            "patch",
            "node",
            &name,
            "--type",
            "merge",
            "-p",
            &json!({"spec":{"taints":self.cfg.get("taints").cloned().unwrap_or(Value::Null)}})
                .to_string(),
        ])?;
        let t_ready = t0.elapsed();

        // sriovdp: the VFs exist and are bound (the runner made them) before it starts.
        self.start_sriovdp()?;
        let want = RESOURCE.to_string();
        wait_for(Duration::from_secs(120), || {
            self.get(&["node", &name]).ok().is_some_and(|n| {
                n["status"]["allocatable"][&want]
                    .as_str()
                    .is_some_and(|v| v != "0")
            })
        })
        .ok_or("the Node's allocatable never showed intel.com/sriov_igb (120 s)")?;
        println!(
            "vm-node: {runtime} on cgroup v2: containerd {:.1} s, Node registered {:.1} s, Ready (flannel + plexus) {:.1} s, {RESOURCE} allocatable {:.1} s",
            t_cd.as_secs_f64(),
            t_reg.as_secs_f64(),
            t_ready.as_secs_f64(),
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Starts (or restarts) containerd 2.3 and waits for its CRI: its own directory first on
    /// its `PATH`, so it starts its own shim (not Debian's 1.6 one).
    pub fn start_containerd(&mut self) -> Result<(), String> {
        let path = self.containerd.path_env().to_string_lossy().into_owned();
        let c = spawn(
            "containerd",
            &self.containerd.containerd().display().to_string(),
            &[
                "--config".into(),
                p("containerd/config.toml").display().to_string(),
            ],
            &[("PATH", path)],
        )?;
        self.procs.push(("containerd".into(), c));
        // Its own API answers before the CRI plugin has recovered its state; the kubelet's
        // start-up check ("validate CRI v1 runtime API") fails until the CRI answers too.
        let sock = p("containerd/containerd.sock");
        let cri = plexus_e2e::realk8s::cri::Cri::new(&sock);
        wait_for(Duration::from_secs(60), || cri.sandboxes(None).is_ok())
            .map(drop)
            .ok_or("containerd's CRI did not answer in 60 s".into())
    }

    /// Restarts the kubelet and waits until it serves again: its pod-resources socket, removed
    /// first, is created only after the kubelet validated the CRI runtime.
    pub fn restart_kubelet(&mut self) -> Result<(), String> {
        self.stop_proc("kubelet");
        let sock = Path::new(POD_RESOURCES_SOCK);
        let _ = std::fs::remove_file(sock);
        self.start_kubelet()?;
        wait_for(Duration::from_secs(120), || {
            sock.exists() || !self.alive("kubelet")
        })
        .ok_or("the restarted kubelet has no pod-resources socket after 120 s")?;
        if !self.alive("kubelet") {
            return Err(format!(
                "the restarted kubelet exited:\n{}",
                log_tail("kubelet", 5)
            ));
        }
        Ok(())
    }

    /// The length of a node log now (a mark for [`Node::wait_log`]).
    pub fn log_len(&self, name: &str) -> usize {
        std::fs::metadata(p(&format!("{name}.log"))).map_or(0, |m| m.len() as usize)
    }

    /// Waits until a line written to log `name` after byte `from` satisfies `pred`; that line.
    pub fn wait_log(
        &self,
        name: &str,
        from: usize,
        limit: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<String> {
        let file = p(&format!("{name}.log"));
        let mut found = None;
        wait_for(limit, || {
            let s = std::fs::read(&file).unwrap_or_default();
            found = String::from_utf8_lossy(s.get(from..).unwrap_or_default())
                .lines()
                .find(|l| pred(l))
                .map(str::to_string);
            found.is_some()
        });
        found
    }

    /// Whether the named process still runs.
    pub fn alive(&mut self, name: &str) -> bool {
        self.procs
            .iter_mut()
            .any(|(n, c)| n == name && c.try_wait().ok().flatten().is_none())
    }

    /// Starts (or restarts) the kubelet.
    pub fn start_kubelet(&mut self) -> Result<(), String> {
        let k = spawn(
            "kubelet",
            &self.s("kubelet"),
            &[
                format!("--config={}", p("kubelet.yaml").display()),
                format!("--kubeconfig={}", p("kubelet.kubeconfig").display()),
                format!("--hostname-override={}", self.name),
                format!("--node-ip={}", self.node_ip),
                "--root-dir=/var/lib/kubelet".into(),
                format!("--cert-dir={}", p("kubelet-pki").display()),
                "--v=2".into(),
            ],
            &[],
        )?;
        self.procs.push(("kubelet".into(), k));
        Ok(())
    }

    /// The name (under /run/netns) of the netns of pod `ns/name` on this node, from
    /// containerd's sandbox (the ready one when there are several).
    pub fn pod_netns(&self, ns: &str, name: &str) -> Result<String, String> {
        let uid = self.get(&["-n", ns, "pod", name])?["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let cri = Cri::new(Path::new("/tmp/node/containerd/containerd.sock"));
        let sb = cri
            .sandboxes(Some(&uid))
            .map_err(|e| format!("CRI: {e:#}"))?;
        let sb = sb
            .iter()
            .find(|s| s.state == 0)
            .or(sb.first())
            .ok_or(format!("no sandbox for {ns}/{name}"))?;
        let path = cri.sandbox_netns(&sb.id).map_err(|e| format!("{e:#}"))?;
        Ok(Path::new(&path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default())
    }

    /// Starts sriovdp with the config for QEMU's 82576 VFs.
    pub fn start_sriovdp(&mut self) -> Result<(), String> {
        let conf = json!({"resourceList":[{"resourceName":"sriov_igb","selectors":[
            {"vendors":["8086"],"devices":["10ca"],"drivers":["igbvf"]}]}]});
        std::fs::write(p("pcidp/config.json"), conf.to_string()).map_err(|e| e.to_string())?;
        let d = spawn(
            "sriovdp",
            &self.s("sriovdp"),
            &[
                "-config-file".into(),
                p("pcidp/config.json").display().to_string(),
                "-logtostderr".into(),
                "-v".into(),
                "2".into(),
            ],
            &[("PCIDB_PATH", "/usr/share/misc/pci.ids".into())],
        )?;
        self.procs.push(("sriovdp".into(), d));
        Ok(())
    }

    /// Starts dra-driver-sriov in MULTUS mode (the node's containerd runs with NRI off) with the
    /// kubelet's own plugin dirs.
    pub fn start_dra(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(CDI_DIR).map_err(|e| e.to_string())?;
        let d = spawn(
            "dra",
            &self.s("dra"),
            &[
                format!("--node-name={}", self.name),
                format!("--kubeconfig={}", p("admin.kubeconfig").display()),
                "--namespace=dra-driver-sriov".into(),
                "--configuration-mode=MULTUS".into(),
                "--kubelet-registrar-directory-path=/var/lib/kubelet/plugins_registry".into(),
                "--kubelet-plugins-directory-path=/var/lib/kubelet/plugins".into(),
                format!("--cdi-root={CDI_DIR}"),
            ],
            &[],
        )?;
        self.procs.push(("dra".into(), d));
        Ok(())
    }

    /// Waits until the Node advertises `n` (as a string, e.g. "2") of the sriovdp resource.
    pub fn wait_allocatable(&self, n: &str, limit: Duration) -> Result<(), String> {
        let name = self.name.clone();
        wait_for(limit, || {
            self.get(&["node", &name])
                .ok()
                .is_some_and(|x| x["status"]["allocatable"][RESOURCE] == n)
        })
        .map(drop)
        .ok_or(format!(
            "the Node's allocatable {RESOURCE} is not {n} after {limit:?}"
        ))
    }

    /// Stops the named process (SIGTERM, then SIGKILL after 10 s).
    pub fn stop_proc(&mut self, name: &str) {
        let mut keep = Vec::new();
        for (n, mut c) in std::mem::take(&mut self.procs) {
            if n != name {
                keep.push((n, c));
                continue;
            }
            let _ = sh(&["kill", "-TERM", &c.id().to_string()]);
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) {
                if c.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        self.procs = keep;
    }

    /// Real whereabouts (two nodes: the clients' pool) when node.json names it: the plugin in
    /// the CNI bin dir, its flat config (the admin's kubeconfig) under the node's conf dir at
    /// [`WHEREABOUTS_CONF`], and a NAD policy letting NADs name that directory (plexus' default
    /// is `/etc/cni/net.d/whereabouts.d`, read-only here).
    fn whereabouts(&self) -> Result<(), String> {
        let Some(bin) = self.cfg["whereabouts"].as_str() else {
            return Ok(());
        };
        let _ = std::os::unix::fs::symlink(bin, Path::new(BIN_DIR).join("whereabouts"));
        let conf = Path::new(WHEREABOUTS_CONF);
        let dir = conf.parent().unwrap_or(Path::new(CONF_DIR));
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        std::fs::write(
            conf,
            json!({"datastore":"kubernetes","kubernetes":{"kubeconfig":p("admin.kubeconfig")},
                "log_file":p("whereabouts.log"),"log_level":"debug"})
            .to_string(),
        )
        .map_err(|e| e.to_string())?;
        std::fs::create_dir_all(p("nad-policy")).map_err(|e| e.to_string())?;
        std::fs::write(p("nad-policy/paths.config"), dir.display().to_string())
            .map_err(|e| e.to_string())
    }

    fn install(&mut self) -> Result<(), String> {
        let src = self.s("plexus_src");
        let mut env: Vec<(&str, String)> = vec![
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT", self.cfg["port"].to_string()),
            ("PLEXUS_SRC_DIR", src),
            ("PLEXUS_BIN_DIR", BIN_DIR.into()),
            ("PLEXUS_CONF_DIR", CONF_DIR.into()),
            ("PLEXUS_HOST_CONF_DIR", CONF_DIR.into()),
            ("PLEXUS_TOKEN_FILE", p("sa/token").display().to_string()),
            ("PLEXUS_CA_FILE", p("sa/ca.crt").display().to_string()),
            ("PLEXUS_LOG_FILE", p("plexus.log").display().to_string()),
            ("PLEXUS_LOG_LEVEL", "debug".into()),
            // The DaemonSet's spec.nodeName: the VM's host name is "(none)".
            ("PLEXUS_NODE_NAME", self.name.clone()),
        ];
        if p("nad-policy").is_dir() {
            env.push((
                "PLEXUS_NAD_POLICY_DIR",
                p("nad-policy").display().to_string(),
            ));
        }
        let mut c = spawn("install", "sh", &[self.s("install_sh")], &env)?;
        let st = c.wait().map_err(|e| e.to_string())?;
        if !st.success() {
            return Err(format!("install.sh failed: {}", log_tail("install", 20)));
        }
        Ok(())
    }

    /// Stops everything in reverse: pods first (the caller deletes them), then sriovdp,
    /// flanneld, the kubelet, containerd's sandboxes and containerd.
    pub fn stop(&mut self) {
        for n in ["dra", "sriovdp", "flanneld", "kubelet"] {
            self.stop_proc(n);
        }
        self.stop_proc("containerd");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// containerd 2.3's config (`realk8s::node::containerd_config`, version 3) with one directory
/// for CDI specs: dra-driver-sriov's (`--cdi-root`). The kubelet passes the claim's CDI device
/// names to the runtime, and containerd 2.x resolves them (1.6 ignored them): with no spec
/// dir the container fails ("CDI device injection failed: unresolvable CDI devices").
fn containerd_config() -> Result<String, String> {
    let c = plexus_e2e::realk8s::node::containerd_config(
        &Path::new(DIR).join("containerd"),
        Path::new(BIN_DIR),
        Path::new(CONF_DIR),
    );
    let none = "cdi_spec_dirs = []";
    if !c.contains(none) {
        return Err(format!(
            "containerd's config has no `{none}` line to point at {CDI_DIR}:\n{c}"
        ));
    }
    Ok(c.replace(none, &format!("cdi_spec_dirs = [\"{CDI_DIR}\"]")))
}

fn kubelet_config(sock: &str) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
# cgroup v2, cgroupfs: no systemd runs in the VM (PID 1 is the initramfs' busybox sh), so the
# systemd driver has no manager to ask for its slices and scopes.
cgroupDriver: cgroupfs
containerRuntimeEndpoint: "unix://{sock}"
address: 127.0.0.1
readOnlyPort: 0
healthzPort: 0
failSwapOn: false
podLogsDir: "{DIR}/pod-logs"
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
evictionHard: {{memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%", pid.available: "0%"}}
evictionSoft: {{}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
staticPodPath: ""
syncFrequency: 10s
nodeStatusUpdateFrequency: 2s
"#
    )
}
