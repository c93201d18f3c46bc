//! The cluster network of a node-tier node, laid out as its own installer does: `bridge` (the
//! fastest stand-in), real **flannel** (flanneld v0.28.9 with `--kube-subnet-mgr` + the flannel
//! CNI plugin, `10-flannel.conflist`) or real **calico** (calico + calico-ipam v3.32.1,
//! Kubernetes datastore, `10-calico.conflist` + `calico-kubeconfig`). Facts:
//! `../shared/overlays/README.md`.
//!
//! Use: [`Overlay::new`] (finds the binaries), `Node::start(…, overlay.conf_name(), &|dir|
//! overlay.conflist(dir))`, then [`Overlay::start`] with the running node: plugin binaries into
//! the node's CNI bin dir, the overlay's RBAC and ServiceAccount token kubeconfig, and what its
//! daemon would do (flannel: the Node's podCIDR as admin, flanneld on a veth pair of the tier's
//! own, never the host's interfaces; calico: CRDs by server-side apply, an IPPool, the
//! ClusterInformation `default` with `datastoreReady`, as calico-node would). Everything it makes
//! on the host is unique per tier (bridge names, subnets, the VXLAN VNI) and removed with the
//! node; [`Overlay::leftovers`] lists what a deleted pod left (calico's ipamhandles and /32
//! routes, flannel's per-container state, iptables and ip6tables rules naming a container).
//!
//! Pods get IPv4 only unless the tier asks [`Overlay::with_family`] ([`Family::Dual`] or
//! [`Family::V6`]: flannel's `EnableIPv6`/`IPv6Network` and the Node's podCIDRs in both
//! families, calico's IPv6 IPPool with `assign_ipv6`; the host side made before the node starts
//! by [`Overlay::prepare_host`], see `node_rig::OverlayNode::start_family`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use super::node::{wait_for, Node};
use super::{bins, ControlPlane, Proc};

/// Env var naming the directory with `flanneld`, `flannel`, `calico` (`.xz` or plain);
/// default `<PLEXUS_K8S_BIN>/../../overlays/bin`.
pub const OVERLAYS_ENV: &str = "PLEXUS_OVERLAYS_BIN";

/// Which cluster network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `bridge` + `host-local` + `portmap` (Debian's plugins), standing in for flannel.
    Bridge,
    /// Real flannel (vxlan).
    Flannel,
    /// Real calico (no calico-node: connectivity, no policy).
    Calico,
}

impl Kind {
    /// Lower-case name (case names, pod names).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bridge => "bridge",
            Kind::Flannel => "flannel",
            Kind::Calico => "calico",
        }
    }
}

/// The address families pods get on the cluster network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// IPv4 only (every tier's unless it asks otherwise).
    V4,
    /// IPv4 and IPv6 (IPv4 the primary family).
    Dual,
    /// IPv6 only.
    V6,
}

impl Family {
    /// Whether pods get an IPv4 address.
    pub fn v4(self) -> bool {
        self != Family::V6
    }

    /// Whether pods get an IPv6 address.
    pub fn v6(self) -> bool {
        self != Family::V4
    }

    /// Lower-case name (case names).
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::Dual => "dual",
            Family::V6 => "ipv6",
        }
    }
}

/// One tier's cluster network.
pub struct Overlay {
    kind: Kind,
    /// The pods' families ([`Family::V4`] unless [`Overlay::with_family`]).
    family: Family,
    /// Whether [`Overlay::prepare_host`] made the veth pair flanneld binds to.
    veth_ready: bool,
    /// Second octet of the pod range `10.<octet>.0.0/16` (unique per tier).
    octet: u8,
    /// Prefix for host link names (≤ 10 bytes; unique per tier).
    tag: String,
    /// flanneld, calico/calico-ipam (empty for bridge).
    binaries: Vec<(String, PathBuf)>,
    /// calico's CRDs (`calico-crds.yaml.xz`).
    crds: Option<PathBuf>,
    flanneld: Option<Proc>,
}

/// The overlay binaries' directory.
fn overlays_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(OVERLAYS_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let k8s = std::env::var_os(bins::BIN_ENV).map(PathBuf::from);
    k8s.map(|k| k.join("../../overlays/bin"))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"))
}

impl Overlay {
    /// The overlay `kind` for a tier whose host names start with `tag` and whose pods use
    /// `10.<octet>.0.0/16`; an error when its binaries are missing.
    pub fn new(kind: Kind, octet: u8, tag: &str) -> Result<Overlay> {
        let dir = overlays_dir();
        let mut binaries = Vec::new();
        let mut crds = None;
        let need = |name: &str| -> Result<PathBuf> {
            bins::find_usable(&dir, name)?.with_context(|| {
                format!(
                    "{kind:?}: no {name}(.xz) in {} (set {OVERLAYS_ENV})",
                    dir.display()
                )
            })
        };
        match kind {
            Kind::Bridge => {}
            Kind::Flannel => {
                binaries.push(("flannel".into(), need("flannel")?));
                binaries.push(("flanneld".into(), need("flanneld")?));
            }
            Kind::Calico => {
                let calico = need("calico")?;
                binaries.push(("calico".into(), calico.clone()));
                binaries.push(("calico-ipam".into(), calico));
                let c = dir.join("../calico-crds.yaml.xz");
                ensure!(c.is_file(), "no {}", c.display());
                crds = Some(c);
            }
        }
        Ok(Overlay {
            kind,
            family: Family::V4,
            veth_ready: false,
            octet,
            tag: tag.to_string(),
            binaries,
            crds,
            flanneld: None,
        })
    }

    /// Which overlay.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The same overlay giving pods `family` (IPv6 in `fd00:10:<octet>::/56`; flannel with
    /// `EnableIPv6`, calico with an IPv6 IPPool and `assign_ipv6`); the node needs
    /// [`Overlay::prepare_host`] before it starts.
    pub fn with_family(mut self, family: Family) -> Overlay {
        self.family = family;
        self
    }

    /// The pods' families.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The pods' IPv6 range (flannel's `IPv6Network`, calico's IPv6 pool).
    pub fn pod_cidr6(&self) -> String {
        match self.kind {
            Kind::Bridge => format!("fd00:10:{}::/64", self.octet),
            _ => format!("fd00:10:{}::/56", self.octet),
        }
    }

    /// The node's IPv6 address on the tier's veth (made by [`Overlay::prepare_host`]): the
    /// kubelet's second `--node-ip` and the address flanneld's IPv6 VXLAN binds to.
    pub fn node_ipv6(&self) -> String {
        format!("fd00:31:{}::1", self.octet)
    }

    /// The host side of a node with IPv6 pods, made before the node starts (the kubelet checks
    /// its node IPs are local): the tier's veth pair with `172.31.<octet>.1/30` and
    /// [`Overlay::node_ipv6`]`/64` (flannel binds its VXLANs to it). Returns the host links made,
    /// for the node to delete. Nothing for an IPv4-only overlay.
    pub fn prepare_host(&mut self) -> Result<Vec<String>> {
        if !self.family.v6() {
            return Ok(Vec::new());
        }
        let (a, b) = self.veth();
        let _ = Command::new("ip").args(["link", "del", &a]).output();
        run(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
        let v4 = format!("172.31.{}.1/30", self.octet);
        let v6 = format!("{}/64", self.node_ipv6());
        run(&["ip", "addr", "add", &v4, "dev", &a])?;
        run(&["ip", "-6", "addr", "add", &v6, "dev", &a, "nodad"])?;
        run(&["ip", "link", "set", &a, "up"])?;
        run(&["ip", "link", "set", &b, "up"])?;
        self.veth_ready = true;
        Ok(vec![a])
    }

    /// The file its installer writes in the CNI conf dir.
    pub fn conf_name(&self) -> &'static str {
        match self.kind {
            Kind::Bridge => "10-bridge.conflist",
            Kind::Flannel => "10-flannel.conflist",
            Kind::Calico => "10-calico.conflist",
        }
    }

    /// The network name in its conflist (the default network's network-status name).
    pub fn network_name(&self) -> &'static str {
        match self.kind {
            Kind::Bridge | Kind::Flannel => "cbr0",
            Kind::Calico => "k8s-pod-network",
        }
    }

    /// The host bridge pods attach to (bridge and flannel), for leak checks.
    pub fn bridge(&self) -> Option<String> {
        match self.kind {
            Kind::Bridge => Some(format!("{}c", self.tag)),
            Kind::Flannel => Some(format!("{}f", self.tag)),
            Kind::Calico => None,
        }
    }

    /// The pods' range.
    pub fn pod_cidr(&self) -> String {
        match self.kind {
            Kind::Bridge => format!("10.{}.0.0/24", self.octet),
            _ => format!("10.{}.0.0/16", self.octet),
        }
    }

    fn vxlan(&self) -> String {
        format!("flannel.{}", self.octet)
    }

    fn veth(&self) -> (String, String) {
        (format!("{}v", self.tag), format!("{}w", self.tag))
    }

    /// Whether the conflist chains `bandwidth` (calico's installer does; flannel's does not).
    pub fn has_bandwidth(&self) -> bool {
        self.kind == Kind::Calico
    }

    /// The conflist, as its installer writes it, for a node whose directory is `node_dir`
    /// (state paths moved under it: host-local's and flannel's `dataDir`, calico's log).
    pub fn conflist(&self, node_dir: &Path) -> Value {
        let ipam_dir = node_dir.join("cni/ipam");
        match self.kind {
            Kind::Bridge => json!({"cniVersion":"1.0.0","name":"cbr0","plugins":[
                {"type":"bridge","bridge":self.bridge(),"isGateway":true,"isDefaultGateway":true,
                 "ipMasq":false,"hairpinMode":true,
                 "ipam":{"type":"host-local","dataDir":ipam_dir,"ranges":self.bridge_ranges()}},
                {"type":"portmap","capabilities":{"portMappings":true}}]}),
            // kube-flannel.yml's cni-conf.json (cniVersion 0.3.1), with the state paths and the
            // bridge name of this node.
            Kind::Flannel => json!({"name":"cbr0","cniVersion":"0.3.1","plugins":[
                {"type":"flannel","subnetFile":node_dir.join("flannel/subnet.env"),
                 "dataDir":node_dir.join("flannel/data"),
                 "ipam":{"dataDir":ipam_dir},
                 "delegate":{"bridge":self.bridge(),"hairpinMode":true,"isDefaultGateway":true}},
                {"type":"portmap","capabilities":{"portMappings":true}}]}),
            // calico.yaml's cni_network_config (cniVersion 0.3.1) after calico's install-cni.
            Kind::Calico => json!({"name":"k8s-pod-network","cniVersion":"0.3.1","plugins":[
                {"type":"calico","log_level":"info",
                 "log_file_path":node_dir.join("calico/cni.log"),
                 "datastore_type":"kubernetes","nodename":"__NODE__","mtu":1440,
                 // calico-node writes /var/lib/calico/nodename; the plugin requires the file
                 // even with "nodename" set (unless nodename_file_optional).
                 "nodename_file":node_dir.join("calico/nodename"),
                 "ipam":self.calico_ipam(),"policy":{"type":"k8s"},
                 "kubernetes":{"kubeconfig":node_dir.join("cni/net.d/calico-kubeconfig")}},
                {"type":"bandwidth","capabilities":{"bandwidth":true}},
                {"type":"portmap","snat":true,"capabilities":{"portMappings":true}}]}),
        }
    }

    /// host-local's ranges of the bridge stand-in, one per family.
    fn bridge_ranges(&self) -> Value {
        let mut r = Vec::new();
        if self.family.v4() {
            r.push(json!([{"subnet": self.pod_cidr()}]));
        }
        if self.family.v6() {
            r.push(json!([{"subnet": self.pod_cidr6()}]));
        }
        json!(r)
    }

    /// calico-ipam's config: as calico.yaml has it for IPv4 only; otherwise `assign_ipv4`,
    /// `assign_ipv6` and this tier's own pools (`ipv4_pools`, `ipv6_pools`: another tier's pools
    /// on the same control plane are never drawn from).
    fn calico_ipam(&self) -> Value {
        match self.family {
            Family::V4 => json!({"type":"calico-ipam"}),
            f => {
                let mut ipam = json!({"type":"calico-ipam",
                    "assign_ipv4": f.v4().to_string(), "assign_ipv6": "true",
                    "ipv6_pools": [self.pod_cidr6()]});
                if f.v4() {
                    ipam["ipv4_pools"] = json!([self.pod_cidr()]);
                }
                ipam
            }
        }
    }

    /// The node's `spec.podCIDRs` (flannel's `--kube-subnet-mgr` reads them), one per family.
    fn node_pod_cidrs(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.family.v4() {
            v.push(format!("10.{}.0.0/24", self.octet));
        }
        if self.family.v6() {
            v.push(format!("fd00:10:{}::/64", self.octet));
        }
        v
    }

    /// flanneld's net-conf.json.
    fn flannel_net_conf(&self) -> Value {
        let mut c = json!({"Backend": {"Type": "vxlan", "VNI": self.octet}});
        if self.family.v4() {
            c["Network"] = json!(self.pod_cidr());
        } else {
            c["EnableIPv4"] = json!(false);
        }
        if self.family.v6() {
            c["EnableIPv6"] = json!(true);
            c["IPv6Network"] = json!(self.pod_cidr6());
        }
        c
    }

    /// Set the overlay up on the running `node` (see the module doc); the conflist is already
    /// in place. Host links it makes are removed with the node.
    pub fn start(&mut self, cp: &ControlPlane, node: &Node<'_>) -> Result<()> {
        for (name, bin) in &self.binaries {
            if name == "flanneld" {
                continue;
            }
            let dst = node.bin_dir().join(name);
            let _ = std::fs::remove_file(&dst);
            std::os::unix::fs::symlink(bin, &dst)?;
        }
        if let Some(b) = self.bridge() {
            node.own_link(&b);
        }
        match self.kind {
            Kind::Bridge => Ok(()),
            Kind::Flannel => self.start_flannel(cp, node),
            Kind::Calico => self.start_calico(cp, node),
        }
    }

    fn start_flannel(&mut self, cp: &ControlPlane, node: &Node<'_>) -> Result<()> {
        let name = node.name();
        let cidrs = self.node_pod_cidrs();
        let patch = json!({"spec":{"podCIDR":cidrs[0],"podCIDRs":cidrs}}).to_string();
        cp.kubectl(&["patch", "node", name, "--type", "merge", "-p", &patch])?;
        let rbac = json!({"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"kube-flannel"}},
            {"apiVersion":"v1","kind":"ServiceAccount",
             "metadata":{"name":"flannel","namespace":"kube-flannel"}},
            {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole",
             "metadata":{"name":"flannel"},
             "rules":[{"apiGroups":[""],"resources":["pods"],"verbs":["get"]},
                      {"apiGroups":[""],"resources":["nodes"],"verbs":["get","list","watch"]},
                      {"apiGroups":[""],"resources":["nodes/status"],"verbs":["patch"]}]},
            {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding",
             "metadata":{"name":"flannel"},
             "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"flannel"},
             "subjects":[{"kind":"ServiceAccount","name":"flannel","namespace":"kube-flannel"}]}]});
        cp.apply(&rbac.to_string())?;
        let dir = node.path("flannel");
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = dir.join("flanneld.kubeconfig");
        cp.write_kubeconfig(&kubeconfig, &cp.create_token("kube-flannel", "flannel")?)?;
        let conf = dir.join("net-conf.json");
        std::fs::write(&conf, self.flannel_net_conf().to_string())?;
        // The interface flanneld binds the VXLAN to: a veth pair of the tier's own.
        let (a, b) = self.veth();
        node.own_link(&a);
        node.own_link(&self.vxlan());
        if self.family.v6() {
            node.own_link(&format!("flannel-v6.{}", self.octet));
        }
        if !self.veth_ready {
            let _ = Command::new("ip").args(["link", "del", &a]).output();
            run(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
            let addr = format!("172.31.{}.1/30", self.octet);
            run(&["ip", "addr", "add", &addr, "dev", &a])?;
            run(&["ip", "link", "set", &a, "up"])?;
            run(&["ip", "link", "set", &b, "up"])?;
        }
        let flanneld = &self
            .binaries
            .iter()
            .find(|(n, _)| n == "flanneld")
            .context("flanneld")?
            .1;
        let subnet_env = dir.join("subnet.env");
        let args: Vec<String> = vec![
            format!("NODE_NAME={name}"),
            flanneld.display().to_string(),
            "--kube-subnet-mgr".into(),
            format!("--kubeconfig-file={}", kubeconfig.display()),
            format!("--iface={a}"),
            "--ip-masq=false".into(),
            // No FLANNEL-FWD chain in the host's filter table (shared with the machine).
            "--iptables-forward-rules=false".into(),
            format!("--net-config-path={}", conf.display()),
            format!("--subnet-file={}", subnet_env.display()),
        ];
        let log = node.path("flanneld.log");
        self.flanneld = Some(Proc::spawn("flanneld", Path::new("env"), &args, &log)?);
        wait_for("flanneld's subnet.env", Duration::from_secs(30), || {
            if let Some(p) = self.flanneld.as_mut() {
                p.check_alive().with_context(|| super::tail(&log, 20))?;
            }
            Ok(subnet_env.exists())
        })
        .with_context(|| super::tail(&log, 20))?;
        let env = std::fs::read_to_string(&subnet_env)?;
        ensure!(
            !self.family.v4() || env.contains(&format!("FLANNEL_SUBNET=10.{}.0.1/24", self.octet)),
            "{env}"
        );
        ensure!(
            !self.family.v6()
                || env.contains(&format!("FLANNEL_IPV6_SUBNET=fd00:10:{}::1/64", self.octet)),
            "{env}"
        );
        Ok(())
    }

    fn start_calico(&mut self, cp: &ControlPlane, node: &Node<'_>) -> Result<()> {
        // The node name goes where calico's install-cni substitutes __KUBERNETES_NODE_NAME__.
        let conf_path = node.conf_dir().join(self.conf_name());
        let text = std::fs::read_to_string(&conf_path)?.replace("__NODE__", node.name());
        std::fs::write(&conf_path, text)?;
        std::fs::create_dir_all(node.path("calico"))?;
        std::fs::write(node.path("calico/nodename"), node.name())?;
        let crds = self.crds.as_ref().context("crds")?;
        let out = Command::new("xz").arg("-dc").arg(crds).output()?;
        ensure!(out.status.success(), "xz -dc {}", crds.display());
        cp.kubectl_stdin(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            Some(&String::from_utf8_lossy(&out.stdout)),
        )?;
        for crd in [
            "ippools",
            "clusterinformations",
            "ipamhandles",
            "ipamblocks",
            "blockaffinities",
        ] {
            cp.kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{crd}.crd.projectcalico.org"),
            ])?;
        }
        let pool = format!("plexus-{}", self.octet);
        if self.family.v6() {
            let v6 = json!({"apiVersion":"crd.projectcalico.org/v1","kind":"IPPool",
                "metadata":{"name":format!("{pool}-v6")},
                "spec":{"cidr":self.pod_cidr6(),"blockSize":122,"ipipMode":"Never",
                        "vxlanMode":"Never","natOutgoing":false,"nodeSelector":"all()"}});
            cp.apply(&v6.to_string())?;
        }
        cp.apply(&format!(
            r#"{{"apiVersion":"v1","kind":"List","items":[
  {{"apiVersion":"crd.projectcalico.org/v1","kind":"IPPool","metadata":{{"name":"{pool}"}},
    "spec":{{"cidr":"{cidr}","blockSize":26,"ipipMode":"Never","vxlanMode":"Never","natOutgoing":false,"nodeSelector":"all()","disabled":{disabled}}}}},
  {{"apiVersion":"crd.projectcalico.org/v1","kind":"ClusterInformation","metadata":{{"name":"default"}},
    "spec":{{"datastoreReady":true}}}},
  {{"apiVersion":"v1","kind":"ServiceAccount","metadata":{{"name":"calico-cni-plugin","namespace":"kube-system"}}}},
  {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{{"name":"calico-cni-plugin"}},
    "rules":[{{"apiGroups":[""],"resources":["pods","nodes","namespaces"],"verbs":["get"]}},
             {{"apiGroups":[""],"resources":["pods/status"],"verbs":["patch"]}},
             {{"apiGroups":["crd.projectcalico.org"],
               "resources":["blockaffinities","ipamblocks","ipamhandles","clusterinformations","ippools","ipreservations","ipamconfigs"],
               "verbs":["get","list","create","update","delete"]}}]}},
  {{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{{"name":"calico-cni-plugin"}},
    "roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"calico-cni-plugin"}},
    "subjects":[{{"kind":"ServiceAccount","name":"calico-cni-plugin","namespace":"kube-system"}}]}}
]}}"#,
            cidr = self.pod_cidr(),
            disabled = !self.family.v4(),
        ))?;
        cp.create_namespace("kube-system")?;
        let token = cp.create_token("kube-system", "calico-cni-plugin")?;
        cp.write_kubeconfig(&node.conf_dir().join("calico-kubeconfig"), &token)?;
        Ok(())
    }

    /// What deleted pods left that belongs to the overlay: calico's `ipamhandles` and /32 routes
    /// into its pool, flannel's per-container files; for all, iptables rules naming one of
    /// `containers`. Call when no pod of the overlay runs.
    pub fn leftovers(
        &self,
        cp: &ControlPlane,
        node: &Node<'_>,
        containers: &[String],
    ) -> Vec<String> {
        let mut v = Vec::new();
        match self.kind {
            Kind::Bridge => {}
            Kind::Flannel => {
                let data = node.path("flannel/data");
                for e in std::fs::read_dir(&data).into_iter().flatten().flatten() {
                    v.push(format!(
                        "flannel state: {}",
                        e.file_name().to_string_lossy()
                    ));
                }
            }
            Kind::Calico => {
                match cp.kubectl(&["get", "ipamhandles.crd.projectcalico.org", "-o", "name"]) {
                    Ok(out) => v.extend(
                        out.lines()
                            .filter(|l| !l.trim().is_empty())
                            .map(|l| format!("calico {l}")),
                    ),
                    // The apiserver may be down (a case stops it): not a leftover.
                    Err(e) => eprintln!("overlay: list ipamhandles: {e:#}"),
                }
                for (family, prefix) in [
                    ("-4", format!("10.{}.", self.octet)),
                    ("-6", format!("fd00:10:{}:", self.octet)),
                ] {
                    let out = Command::new("ip")
                        .args(["-j", family, "route", "show"])
                        .output();
                    let routes: Value = out
                        .ok()
                        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
                        .unwrap_or(json!([]));
                    for r in routes.as_array().into_iter().flatten() {
                        let dst = r["dst"].as_str().unwrap_or("");
                        if dst.starts_with(&prefix) && !dst.contains('/') {
                            v.push(format!("calico route {dst} dev {}", r["dev"]));
                        }
                    }
                }
            }
        }
        v.extend(iptables_naming(containers));
        v
    }

    /// Stop flanneld (also on drop).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.flanneld.take() {
            p.stop(Duration::from_secs(5));
        }
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Lines of `iptables-save` and `ip6tables-save` (every table) that name one of `ids`
/// (portmap's and bridge's ipMasq rules carry the container ID in their comments).
pub fn iptables_naming(ids: &[String]) -> Vec<String> {
    let ids: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let mut v = Vec::new();
    for (tool, label) in [
        ("iptables-save", "iptables"),
        ("ip6tables-save", "ip6tables"),
    ] {
        let Ok(out) = Command::new(tool).output() else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        v.extend(
            text.lines()
                .filter(|l| ids.iter().any(|id| l.contains(id)))
                .map(|l| format!("{label}: {l}")),
        );
    }
    v
}

fn run(args: &[&str]) -> Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    if !out.status.success() {
        bail!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
