//! The node side of the one rig (see [`super::rig`]) for the node tiers: a [`Node`] with its
//! cluster network ([`OverlayNode`]), which overlays a run's filter selects
//! ([`selected_overlays`]), plexus installed by `deploy/install.sh` with a DaemonSet
//! container's command and environment ([`InstallSh`]), and `plexus-daemon` as a process of the
//! node ([`PlexusDaemon`], with its `/metrics`).

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use super::node::{use_node_ipv6, wait_for, Node};
use super::overlay::{Family, Kind, Overlay};
use super::{tail, ControlPlane, Proc};

/// The overlays of `list` (kind, pod-range octet, full case list) a run's filter selects: a
/// filter naming an overlay (`calico/…`, the first non-flag argument) leaves out the others, so
/// their nodes are not started.
pub fn selected_overlays(list: &[(Kind, u8, bool)]) -> Vec<(Kind, u8, bool)> {
    let filter = super::suite::CliArgs::from_env().filter;
    list.iter()
        .copied()
        .filter(|(kind, _, _)| {
            let k = kind.name();
            !filter
                .as_deref()
                .is_some_and(|f| f.contains('/') && !f.starts_with(&format!("{k}/")))
        })
        .collect()
}

/// A running node with its cluster network laid out (see [`super::overlay`]).
pub struct OverlayNode<'a> {
    /// containerd + kubelet.
    pub node: Node<'a>,
    /// The cluster network.
    pub overlay: Overlay,
}

impl<'a> OverlayNode<'a> {
    /// Overlay `kind` (pods in `10.<octet>.0.0/16`, host links named from `tag`), node `name`
    /// started with its conflist, then the overlay started on it; `links` are host links the
    /// node deletes when it stops.
    pub fn start(
        cp: &'a ControlPlane,
        kind: Kind,
        octet: u8,
        tag: &str,
        name: &str,
        links: &[String],
    ) -> Result<OverlayNode<'a>> {
        Self::start_family(cp, kind, Family::V4, octet, tag, name, links)
    }

    /// [`OverlayNode::start`] with pods of `family`: for IPv6, the overlay's host side first
    /// ([`Overlay::prepare_host`]), the kubelet with both node IPs ([`use_node_ipv6`]), the
    /// node's podCIDRs, flanneld's or calico's IPv6 config.
    pub fn start_family(
        cp: &'a ControlPlane,
        kind: Kind,
        family: Family,
        octet: u8,
        tag: &str,
        name: &str,
        links: &[String],
    ) -> Result<OverlayNode<'a>> {
        let mut overlay = Overlay::new(kind, octet, tag)?.with_family(family);
        let host_links = overlay.prepare_host()?;
        let ipv6 = family.v6().then(|| overlay.node_ipv6());
        use_node_ipv6(ipv6.as_deref());
        let node = Self::boot(cp, &overlay, kind, name);
        use_node_ipv6(None);
        let node = match node {
            Ok(n) => n,
            Err(e) => {
                for l in &host_links {
                    let _ = std::process::Command::new("ip")
                        .args(["link", "del", l])
                        .output();
                }
                return Err(e);
            }
        };
        for l in &host_links {
            node.own_link(l);
        }
        overlay.start(cp, &node)?;
        for l in links {
            node.own_link(l);
        }
        Ok(OverlayNode { node, overlay })
    }

    /// The node started with `overlay`'s conflist and plugins.
    fn boot(cp: &'a ControlPlane, overlay: &Overlay, kind: Kind, name: &str) -> Result<Node<'a>> {
        let plugins = overlay_plugins(kind)?;
        // The overlay's plugins are in the CNI bin dir with its conflist, before the runtime
        // starts: CRI-O loads a CNI config only when every plugin it names is there (else the
        // node stays NetworkReady=false until the conf dir changes). [`Overlay::start`] links
        // them again.
        Node::start(cp, cp.bins(), name, overlay.conf_name(), &|dir: &Path| {
            let bin_dir = dir.join("cni/bin");
            for (name, bin) in &plugins {
                let dst = bin_dir.join(name);
                let _ = std::fs::remove_file(&dst);
                if let Err(e) = std::os::unix::fs::symlink(bin, &dst) {
                    eprintln!("realk8s: link {}: {e}", dst.display());
                }
            }
            overlay.conflist(dir)
        })
    }

    /// Stop the overlay, then the node (idempotent; the node also stops on drop).
    pub fn stop(&mut self) {
        self.overlay.stop();
        self.node.stop();
    }
}

/// The overlay a thin-mode node tier installs: `kubectl apply -k deploy/overlays/thin` (the NAD
/// CRD, plexus' ServiceAccount and RBAC, the thin DaemonSet; see [`super::deploy`]).
pub const THIN_OVERLAY: &str = "overlays/thin";

/// The overlay a daemon-mode node tier installs: `kubectl apply -k deploy/overlays/daemon` (the
/// base, the daemon's RBAC, the daemon DaemonSet).
pub const DAEMON_OVERLAY: &str = "overlays/daemon";

/// The namespace the node tiers find plexus' DaemonSets and ServiceAccount in: the one
/// deploy/settings sets (checked by the `deploy` test), `kube-system`.
pub const PLEXUS_NAMESPACE: &str = super::rig::PLEXUS_SA.0;

/// A veth pair of the test's own, `name` and `<name>p`, both up (a macvlan NAD's master); list
/// both among [`OverlayNode::start`]'s `links` so the node deletes them when it stops.
pub fn veth_pair(name: &str) -> Result<()> {
    let ok = std::process::Command::new("ip")
        .args(["link", "add", name, "type", "veth", "peer", "name"])
        .arg(format!("{name}p"))
        .status()?
        .success();
    ensure!(ok, "ip link add {name}");
    for l in [name.to_string(), format!("{name}p")] {
        std::process::Command::new("ip")
            .args(["link", "set", &l, "up"])
            .status()?;
    }
    Ok(())
}

/// The directory under /run of a daemon-mode tier's `node` (its daemon's socket's):
/// `/run/plexus-e2e-<node>`.
pub fn daemon_run_dir(node: &Node<'_>) -> PathBuf {
    PathBuf::from(format!("/run/plexus-e2e-{}", node.name()))
}

/// Stop a daemon-mode tier: `daemon` and `installer` (dropped), `overlay`, `node`; then
/// the daemon's `plexus.sock` in [`daemon_run_dir`] and that directory if empty (never a
/// recursive removal under /run).
pub fn stop_tier(
    daemon: Option<PlexusDaemon>,
    installer: Option<Proc>,
    overlay: &mut Overlay,
    node: &mut Node<'_>,
) {
    drop(daemon);
    drop(installer);
    overlay.stop();
    node.stop();
    let dir = daemon_run_dir(node);
    let _ = std::fs::remove_file(dir.join("plexus.sock"));
    let _ = std::fs::remove_dir(dir);
}

/// The CNI plugins overlay `kind` installs (name in the bin dir, binary), found as
/// [`Overlay::new`] finds them.
fn overlay_plugins(kind: Kind) -> Result<Vec<(String, PathBuf)>> {
    let dir = std::env::var_os(super::overlay::OVERLAYS_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os(super::bins::BIN_ENV)
                .map(|k| PathBuf::from(k).join("../../overlays/bin"))
        })
        .unwrap_or_else(|| PathBuf::from("/nonexistent"));
    let find = |n: &str| -> Result<PathBuf> {
        super::bins::find_usable(&dir, n)?
            .with_context(|| format!("{kind:?}: no {n}(.xz) in {}", dir.display()))
    };
    Ok(match kind {
        Kind::Bridge => Vec::new(),
        Kind::Flannel => vec![("flannel".into(), find("flannel")?)],
        Kind::Calico => {
            let calico = find("calico")?;
            vec![
                ("calico".into(), calico.clone()),
                ("calico-ipam".into(), calico),
            ]
        }
    })
}

/// `<repo>/<p>`
fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// `deploy/install.sh` run on a node as a DaemonSet's install container runs it: its command
/// and environment as the apiserver stored them, what the pod's volumes and ServiceAccount give
/// it mapped to the node's directories (hostPath /opt/cni/bin → the node's bin dir,
/// /etc/cni/net.d → its conf dir, the projected token and CA → `<node>/serviceaccount`, the
/// image's binaries → `<node>/image-bin`), the DaemonSet's emptyDir ready file →
/// `<node>/install-state/ready`.
pub struct InstallSh {
    /// The container's `command` (`/install.sh` and its arguments).
    pub command: Vec<String>,
    /// The container's environment (`PLEXUS_EXTRA_CONFIG` left out: see [`InstallSh::extra`]).
    pub env: Vec<(String, String)>,
    /// The container's `PLEXUS_EXTRA_CONFIG`, parsed (`{}` when unset).
    pub extra: Value,
    /// The installer script run (`None`: this tree's `deploy/install.sh`; another build's for
    /// an upgrade or roll-back).
    pub script: Option<PathBuf>,
}

/// DaemonSet `<PLEXUS_NAMESPACE>/<name>` as the API has it (`kubectl get -o json`): the one
/// the overlay applied.
pub fn daemonset_json(cp: &ControlPlane, name: &str) -> Result<Value> {
    Ok(serde_json::from_str(&cp.kubectl(&[
        "-n",
        PLEXUS_NAMESPACE,
        "get",
        "daemonset",
        name,
        "-o",
        "json",
    ])?)?)
}

/// Import the plexus image archive `tar` into `node`'s containerd under every image reference
/// the DaemonSet `ds` names (`plexus:<version>`, from deploy/settings): when the archive was
/// tagged otherwise (e.g. `plexus:latest`), its image is tagged as the DaemonSet names it, so
/// the pod runs that image and never pulls.
pub fn import_plexus_image(node: &super::node::Node<'_>, tar: &Path, ds: &Value) -> Result<()> {
    node.import_image(tar)?;
    let have = node.ctr(&["images", "ls", "-q"])?;
    let have: Vec<&str> = have.lines().map(str::trim).collect();
    let spec = &ds["spec"]["template"]["spec"];
    let mut wanted: Vec<String> = spec["initContainers"]
        .as_array()
        .into_iter()
        .chain(spec["containers"].as_array())
        .flatten()
        .filter_map(|c| c["image"].as_str().map(normalized_image))
        .collect();
    wanted.sort();
    wanted.dedup();
    for image in wanted {
        if have.contains(&image.as_str()) {
            continue;
        }
        let repo = image.rsplit_once(':').map_or(image.as_str(), |(r, _)| r);
        let from = have
            .iter()
            .find(|h| h.starts_with(&format!("{repo}:")))
            .with_context(|| {
                format!("the image archive holds no {repo} image for {image}: {have:?}")
            })?;
        eprintln!("realk8s: the image archive is {from}; tagged {image} as the DaemonSet names it");
        node.ctr(&["images", "tag", "--force", from, &image])?;
    }
    Ok(())
}

/// An image reference as containerd stores it: `plexus:0.1.0` → `docker.io/library/plexus:0.1.0`
/// (`:latest` when untagged).
pub fn normalized_image(image: &str) -> String {
    let (name, tag) = match image.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n.to_string(), t.to_string()),
        _ => (image.to_string(), "latest".to_string()),
    };
    let first = name.split('/').next().unwrap_or("");
    let name = if !name.contains('/') {
        format!("docker.io/library/{name}")
    } else if !(first.contains('.') || first.contains(':') || first == "localhost") {
        format!("docker.io/{name}")
    } else {
        name
    };
    format!("{name}:{tag}")
}

impl InstallSh {
    /// From container `container` of DaemonSet `<PLEXUS_NAMESPACE>/<daemonset>`; an error unless it
    /// runs `/install.sh`.
    pub fn from_daemonset(cp: &ControlPlane, daemonset: &str, container: &str) -> Result<Self> {
        let ds = daemonset_json(cp, daemonset)?;
        let spec = &ds["spec"]["template"]["spec"];
        let c = spec["initContainers"]
            .as_array()
            .into_iter()
            .chain(spec["containers"].as_array())
            .flatten()
            .find(|c| c["name"] == container)
            .with_context(|| format!("DaemonSet {daemonset} has no container {container}"))?;
        Self::from_container(c)
    }

    /// From a container spec; an error unless it runs `/install.sh`.
    pub fn from_container(c: &Value) -> Result<Self> {
        let command: Vec<String> = c["command"]
            .as_array()
            .context("the install container has no command")?
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        ensure!(
            command.first().map(String::as_str) == Some("/install.sh"),
            "{command:?}"
        );
        let mut env = Vec::new();
        let mut extra = serde_json::json!({});
        for e in c["env"].as_array().into_iter().flatten() {
            let (k, v) = (
                e["name"].as_str().unwrap_or("").to_string(),
                e["value"].as_str().unwrap_or("").to_string(),
            );
            if k == "PLEXUS_EXTRA_CONFIG" {
                extra = serde_json::from_str(&v).context("PLEXUS_EXTRA_CONFIG")?;
            } else {
                env.push((k, v));
            }
        }
        Ok(InstallSh {
            command,
            env,
            extra,
            script: None,
        })
    }

    /// The ready file the installer writes (the DaemonSet's emptyDir, here a node dir).
    pub fn ready_file(node: &Node<'_>) -> PathBuf {
        node.path("install-state/ready")
    }

    /// Start install.sh on `node` with `token` as the pod's projected token, `binaries` (name,
    /// file) as the image's, `extra` as `PLEXUS_EXTRA_CONFIG`; its log is `<node>/installer.log`.
    /// The caller waits for what it needs (the config, [`InstallSh::ready_file`]).
    pub fn spawn(
        &self,
        cp: &ControlPlane,
        node: &Node<'_>,
        token: &str,
        binaries: &[(&str, PathBuf)],
        extra: &Value,
    ) -> Result<Proc> {
        let sa = node.path("serviceaccount");
        std::fs::create_dir_all(&sa)?;
        std::fs::write(sa.join("token"), token)?;
        std::fs::write(sa.join("ca.crt"), cp.ca_pem())?;
        let src = node.path("image-bin");
        std::fs::create_dir_all(&src)?;
        for (name, file) in binaries {
            std::fs::copy(file, src.join(name))
                .with_context(|| format!("copy {} into the image dir", file.display()))?;
        }
        let conf = node.conf_dir().display().to_string();
        let p = |p: &Path| p.display().to_string();
        let mut env = self.env.clone();
        // Later assignments win in `env`.
        env.extend([
            ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT".into(), cp.port().to_string()),
            ("PLEXUS_SRC_DIR".into(), p(&src)),
            ("PLEXUS_BIN_DIR".into(), p(&node.bin_dir())),
            ("PLEXUS_CONF_DIR".into(), conf.clone()),
            ("PLEXUS_HOST_CONF_DIR".into(), conf),
            // The runtime's libcni cache is the node's own (its mount namespace): uninstall
            // removes plexus' entries there.
            (
                "PLEXUS_CNI_CACHE_DIR".into(),
                p(&node.host_path("/var/lib/cni/results")),
            ),
            ("PLEXUS_TOKEN_FILE".into(), p(&sa.join("token"))),
            ("PLEXUS_CA_FILE".into(), p(&sa.join("ca.crt"))),
            ("PLEXUS_LOG_FILE".into(), p(&node.path("plexus.log"))),
            ("PLEXUS_READY_FILE".into(), p(&Self::ready_file(node))),
            ("PLEXUS_EXTRA_CONFIG".into(), extra.to_string()),
        ]);
        let mut args: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        args.push("sh".into());
        let script = self
            .script
            .clone()
            .unwrap_or_else(|| repo("deploy/install.sh"));
        args.push(p(&script));
        args.extend(self.command[1..].iter().cloned());
        Proc::spawn(
            "install.sh",
            Path::new("env"),
            &args,
            &node.path("installer.log"),
        )
    }
}

/// `plexus-daemon` as a process of a node (the DaemonSet's daemon container runs it), with its
/// readiness file and log in a directory of the node's; stopped (SIGTERM) on drop.
pub struct PlexusDaemon {
    proc: Proc,
    metrics_port: u16,
}

/// Where and how a [`PlexusDaemon`] runs.
pub struct DaemonOpts<'p> {
    /// The daemon binary.
    pub bin: &'p Path,
    /// Its socket.
    pub socket: &'p Path,
    /// Its kubeconfig.
    pub kubeconfig: &'p Path,
    /// `--node`.
    pub node: &'p str,
    /// `daemon.ready` and `daemon.log` go here.
    pub dir: &'p Path,
    /// `/metrics` on `127.0.0.1:<port>`.
    pub metrics_port: u16,
}

impl PlexusDaemon {
    /// Start it and wait (20 s) for its readiness file; an error carries its log's tail.
    pub fn start(o: &DaemonOpts<'_>) -> Result<PlexusDaemon> {
        let ready = o.dir.join("daemon.ready");
        let _ = std::fs::remove_file(&ready);
        let p = |p: &Path| p.display().to_string();
        let args = vec![
            "--socket".to_string(),
            p(o.socket),
            "--kubeconfig".into(),
            p(o.kubeconfig),
            "--node".into(),
            o.node.into(),
            "--readiness-file".into(),
            p(&ready),
            "--metrics-address".into(),
            format!("127.0.0.1:{}", o.metrics_port),
        ];
        let log = o.dir.join("daemon.log");
        let proc = Proc::spawn("plexus-daemon", o.bin, &args, &log)?;
        wait_for(
            "the daemon's readiness file",
            Duration::from_secs(20),
            || Ok(ready.exists()),
        )
        .with_context(|| tail(&log, 20))?;
        Ok(PlexusDaemon {
            proc,
            metrics_port: o.metrics_port,
        })
    }

    /// SIGTERM, SIGKILL after 10 s.
    pub fn stop(mut self) {
        self.proc.stop(Duration::from_secs(10));
    }

    /// SIGKILL (a crash): its socket file stays behind.
    pub fn kill(mut self) {
        self.proc.kill();
    }

    /// Sum of its `/metrics` series `name` whose labels contain all of `labels`.
    pub fn metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        scrape_metric(self.metrics_port, name, labels)
    }
}

/// Sum of the series `name` on `http://127.0.0.1:<port>/metrics` whose line contains all of
/// `labels`.
pub fn scrape_metric(port: u16, name: &str, labels: &[&str]) -> Result<f64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connect to the metrics port {port}"))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}
