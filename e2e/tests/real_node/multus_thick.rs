//! Multus thick (v4.3.0, `PLEXUS_PEERS_BIN`) on a real node, set up as its DaemonSet does it:
//! `multus-daemon` with its in-cluster ServiceAccount (bind-mounted where it insists on reading
//! it, in a mount namespace of its own), wrapping the first config of the node's conf dir and
//! writing `00-multus.conf` for `multus-shim` there. Never shipped: a peer to measure against.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use plexus_e2e::realk8s::bins::find_usable;
use plexus_e2e::realk8s::node::{wait_for, Node};
use plexus_e2e::realk8s::{ControlPlane, Proc};
use serde_json::json;

/// Where multus-daemon reads its in-cluster credentials (its only way).
const SA_DIR: &str = "/run/secrets/kubernetes.io/serviceaccount";

/// A running multus-daemon and what it needs.
pub struct MultusThick {
    daemon: PathBuf,
    dir: PathBuf,
    node: String,
    port: u16,
    proc: Option<Proc>,
    /// A /run/secrets made for the mount point, removed at the end.
    made: Option<PathBuf>,
}

impl MultusThick {
    /// Install `multus-shim` into the node's bin dir, give multus-daemon a cluster-admin
    /// ServiceAccount token, start it on `node` and wait for its `00-multus.conf`.
    pub fn start(cp: &ControlPlane, node: &Node<'_>) -> Result<MultusThick> {
        let peers = std::env::var_os("PLEXUS_PEERS_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/work/shared/peers/bin"));
        let get = |n: &str| -> Result<PathBuf> {
            find_usable(&peers, n)?.with_context(|| format!("no {n}(.xz) in {}", peers.display()))
        };
        let (daemon, shim) = (get("multus-daemon")?, get("multus-shim")?);
        std::fs::copy(&shim, node.bin_dir().join("multus-shim"))?;
        let dir = node.path("multus");
        for sub in ["sa", "run", "cache"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        // Multus' own RBAC is not under test: cluster-admin.
        let _ = cp.kubectl(&[
            "-n",
            "kube-system",
            "create",
            "serviceaccount",
            "multus-churn",
        ]);
        let _ = cp.kubectl(&[
            "create",
            "clusterrolebinding",
            "multus-churn",
            "--clusterrole=cluster-admin",
            "--serviceaccount=kube-system:multus-churn",
        ]);
        std::fs::write(
            dir.join("sa/token"),
            cp.create_token("kube-system", "multus-churn")?,
        )?;
        std::fs::write(dir.join("sa/ca.crt"), cp.ca_pem())?;
        std::fs::write(dir.join("sa/namespace"), "kube-system")?;
        let made = if Path::new(SA_DIR).is_dir() {
            None
        } else {
            let top = Path::new("/run/secrets");
            let made = (!top.exists()).then(|| top.to_path_buf());
            std::fs::create_dir_all(SA_DIR)?;
            made
        };
        let conf_dir = node.conf_dir();
        let cfg = json!({"chrootDir":"","cniVersion":"0.3.1","logToStderr":true,"logLevel":"error",
            "cniConfigDir":conf_dir,"multusAutoconfigDir":conf_dir,
            "multusConfigFile":"auto","socketDir":format!("{}/", dir.join("run").display()),
            "daemonSocketDir":format!("{}/", dir.join("run").display()),
            "cniDir":dir.join("cache"),"binDir":node.bin_dir()});
        std::fs::write(dir.join("daemon.json"), cfg.to_string())?;
        let mut m = MultusThick {
            daemon,
            dir,
            node: node.name().to_string(),
            port: cp.port(),
            proc: None,
            made,
        };
        m.run(&conf_dir)?;
        Ok(m)
    }

    /// Start the daemon and wait (30 s) for its config and socket.
    fn run(&mut self, conf_dir: &Path) -> Result<()> {
        let script = format!(
            "mount --bind {} {SA_DIR} && exec {} -config {}",
            self.dir.join("sa").display(),
            self.daemon.display(),
            self.dir.join("daemon.json").display()
        );
        let args: Vec<String> = vec![
            "KUBERNETES_SERVICE_HOST=127.0.0.1".into(),
            format!("KUBERNETES_SERVICE_PORT={}", self.port),
            format!("MULTUS_NODE_NAME={}", self.node),
            "unshare".into(),
            "-m".into(),
            // slave: the pods' netns mounts reach it; its bind mount stays inside.
            "--propagation".into(),
            "slave".into(),
            "sh".into(),
            "-c".into(),
            script,
        ];
        let log = self.dir.join("daemon.log");
        let mut proc = Proc::spawn("multus-daemon", Path::new("env"), &args, &log)?;
        let conf = conf_dir.join("00-multus.conf");
        let sock = self.dir.join("run/multus.sock");
        wait_for(
            "multus-daemon's config and socket",
            Duration::from_secs(30),
            || {
                proc.check_alive()?;
                Ok(conf.exists() && sock.exists())
            },
        )
        .with_context(|| plexus_e2e::realk8s::tail(&log, 20))?;
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&conf)?)?;
        ensure!(v["type"] == "multus-shim", "unexpected multus config: {v}");
        self.proc = Some(proc);
        Ok(())
    }

    /// Its DaemonSet pod replaced: SIGTERM (10 s grace), `gap` until the new pod's daemon
    /// starts, then wait for it to serve again. Whether the config was there during the gap
    /// is returned (multus-cni #1527: the exiting daemon removes it).
    pub fn restart(&mut self, conf_dir: &Path, gap: Duration) -> Result<bool> {
        if let Some(mut p) = self.proc.take() {
            p.stop(Duration::from_secs(10));
        }
        let kept = conf_dir.join("00-multus.conf").exists();
        std::thread::sleep(gap);
        self.run(conf_dir)?;
        Ok(kept)
    }

    /// Stop the daemon and remove what it and its shim left in the node's directories.
    pub fn remove(&mut self, node: &Node<'_>) {
        if let Some(mut p) = self.proc.take() {
            p.stop(Duration::from_secs(10));
        }
        let _ = std::fs::remove_file(node.conf_dir().join("00-multus.conf"));
        let _ = std::fs::remove_file(node.bin_dir().join("multus-shim"));
        if let Some(top) = self.made.take() {
            let _ = std::fs::remove_dir_all(top);
        }
    }
}

impl Drop for MultusThick {
    fn drop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop(Duration::from_secs(10));
        }
        if let Some(top) = self.made.take() {
            let _ = std::fs::remove_dir_all(top);
        }
    }
}
