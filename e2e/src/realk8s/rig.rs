//! One rig for the real-cluster tiers: what every tier sets up on its [`ControlPlane`] before its
//! cases, written once. A [`Rig`] takes a started control plane and gives
//!
//! - the `deploy/` manifests applied for real (RBAC, the NAD CRD, admission policies…);
//! - the tier's namespaces (with what pods need where no controller-manager runs) and Node
//!   objects for nodes with no kubelet;
//! - plexus' kubeconfig at [`Rig::kubeconfig`], from a TokenRequest token for
//!   `kube-system/plexus`, unbound or bound to a pod on a node as the kubelet projects it
//!   ([`PlexusToken`]);
//! - optionally the control loops ([`ControlLoops`]: kube-scheduler and the statefulset
//!   controller of kube-controller-manager);
//! - a directory of the tier's own ([`Rig::path`]), removed on drop.
//!
//! The node side is in [`super::node_rig`] (containerd + kubelet with an overlay, the DaemonSet's
//! install.sh, the plexus daemon).
//!
//! ```no_run
//! use plexus_e2e::realk8s::rig::{PlexusToken, Rig};
//! # fn f(cp: &plexus_e2e::realk8s::ControlPlane) -> anyhow::Result<()> {
//! let rig = Rig::builder()
//!     .deploy(&["base/nad-crd.yaml", "base/rbac.yaml"])
//!     .namespaces(&["db"])
//!     .plexus_token(PlexusToken::Unbound)
//!     .build(cp)?;
//! assert!(rig.kubeconfig().exists());
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::json;

use super::{ControlPlane, Proc};

/// Namespace and name of plexus' ServiceAccount (deploy/base/rbac.yaml, in the namespace
/// deploy/settings sets).
pub const PLEXUS_SA: (&str, &str) = ("kube-system", "plexus");

/// Which token plexus' kubeconfig carries.
#[derive(Clone, Debug)]
pub enum PlexusToken {
    /// A TokenRequest token for `kube-system/plexus`, valid 24 h, bound to nothing.
    Unbound,
    /// As the kubelet projects it into plexus' DaemonSet pod: a 1 h token bound to pod
    /// `kube-system/<pod>` on node `<node>` (created with the Node object, no kubelet), so the
    /// API server knows the node plexus speaks for (`authentication.kubernetes.io/node-name`).
    BoundToPod {
        /// The node the pod is bound to.
        node: String,
        /// The pod's name in `kube-system`.
        pod: String,
    },
}

/// What a tier wants set up; [`RigBuilder::build`] does it in a fixed order: manifests, Node
/// objects, namespaces, token, control loops.
#[derive(Default)]
pub struct RigBuilder {
    deploy: Vec<String>,
    namespaces: Vec<String>,
    nodes: Vec<String>,
    token: Option<PlexusToken>,
    control_loops: bool,
}

impl RigBuilder {
    /// `deploy/<file>` manifests to apply, in order (see [`ControlPlane::apply_deploy`]).
    pub fn deploy(mut self, files: &[&str]) -> Self {
        self.deploy.extend(files.iter().map(|f| f.to_string()));
        self
    }

    /// Namespaces to create (see [`ControlPlane::create_namespace`]).
    pub fn namespaces(mut self, names: &[&str]) -> Self {
        self.namespaces.extend(names.iter().map(|n| n.to_string()));
        self
    }

    /// Node objects to create (nodes with no kubelet, for pods bound by `spec.nodeName`).
    pub fn node_objects(mut self, names: &[&str]) -> Self {
        self.nodes.extend(names.iter().map(|n| n.to_string()));
        self
    }

    /// Write plexus' kubeconfig ([`Rig::kubeconfig`]) with this token (needs `rbac.yaml`).
    pub fn plexus_token(mut self, token: PlexusToken) -> Self {
        self.token = Some(token);
        self
    }

    /// Start kube-scheduler and kube-controller-manager (statefulset controller only).
    pub fn control_loops(mut self) -> Self {
        self.control_loops = true;
        self
    }

    /// Set it all up on `cp`.
    pub fn build(self, cp: &ControlPlane) -> Result<Rig<'_>> {
        if !self.deploy.is_empty() {
            let files: Vec<&str> = self.deploy.iter().map(String::as_str).collect();
            cp.apply_deploy(&files)?;
        }
        for n in &self.nodes {
            cp.apply(&json!({"apiVersion":"v1","kind":"Node","metadata":{"name":n}}).to_string())?;
        }
        for ns in &self.namespaces {
            cp.create_namespace(ns)?;
        }
        let dir = tempfile::Builder::new().prefix("plexus-rig-").tempdir()?;
        let mut rig = Rig {
            cp,
            loops: None,
            dir,
        };
        if let Some(token) = &self.token {
            plexus_kubeconfig(cp, &rig.kubeconfig(), token)?;
        }
        if self.control_loops {
            rig.loops = Some(ControlLoops::start(cp, rig.dir())?);
        }
        Ok(rig)
    }
}

/// A tier's setup on the control plane (see the module docs). Dropping it stops the control
/// loops and removes its directory.
pub struct Rig<'a> {
    cp: &'a ControlPlane,
    // Field order is drop order: the processes before the directory of their logs.
    loops: Option<ControlLoops>,
    dir: tempfile::TempDir,
}

impl<'a> Rig<'a> {
    /// What to set up; see [`RigBuilder`].
    pub fn builder() -> RigBuilder {
        RigBuilder::default()
    }

    /// The control plane.
    pub fn cp(&self) -> &'a ControlPlane {
        self.cp
    }

    /// The rig's own directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `<dir>/<rel>`
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// plexus' kubeconfig (written when [`RigBuilder::plexus_token`] was asked for).
    pub fn kubeconfig(&self) -> PathBuf {
        self.path("kubeconfig")
    }

    /// The control loops, when [`RigBuilder::control_loops`] was asked for.
    pub fn control_loops(&self) -> Option<&ControlLoops> {
        self.loops.as_ref()
    }

    /// Stop the control loops now (also done on drop).
    pub fn stop_control_loops(&mut self) {
        if let Some(mut l) = self.loops.take() {
            l.stop();
        }
    }
}

/// A TokenRequest token for plexus' ServiceAccount as `token` says (see [`PlexusToken`]).
pub fn plexus_token(cp: &ControlPlane, token: &PlexusToken) -> Result<String> {
    let (ns, sa) = PLEXUS_SA;
    match token {
        PlexusToken::Unbound => cp.create_token(ns, sa),
        PlexusToken::BoundToPod { node, pod } => {
            cp.apply(
                &json!({"apiVersion":"v1","kind":"Node","metadata":{"name":node}}).to_string(),
            )?;
            cp.apply(&json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":pod,"namespace":ns},
                "spec":{"nodeName":node,"serviceAccountName":sa,"automountServiceAccountToken":false,
                        "containers":[{"name":"plexus","image":"plexus"}]}}).to_string())?;
            let t = cp.kubectl(&[
                "create",
                "token",
                sa,
                "-n",
                ns,
                "--bound-object-kind",
                "Pod",
                "--bound-object-name",
                pod,
                "--duration",
                "1h",
            ])?;
            Ok(t.trim().to_string())
        }
    }
}

/// Write a kubeconfig at `path` with a token for plexus as `token` says.
pub fn plexus_kubeconfig(cp: &ControlPlane, path: &Path, token: &PlexusToken) -> Result<()> {
    cp.write_kubeconfig(path, &plexus_token(cp, token)?)
}

/// kube-scheduler and kube-controller-manager (statefulset controller only) as the admin, as
/// ../shared/k8s/README.md runs them; stopped on drop.
pub struct ControlLoops {
    scheduler: Option<Proc>,
    controllers: Option<Proc>,
}

impl ControlLoops {
    /// Start both, logging to `<log_dir>/scheduler.log` and `controller-manager.log`.
    pub fn start(cp: &ControlPlane, log_dir: &Path) -> Result<ControlLoops> {
        let bins = cp.bins();
        let (Some(sched), Some(kcm)) = (&bins.scheduler, &bins.controller_manager) else {
            bail!("PLEXUS_K8S_BIN has no kube-scheduler or kube-controller-manager");
        };
        let k = cp.admin_kubeconfig().display().to_string();
        let common = vec![
            format!("--kubeconfig={k}"),
            format!("--authentication-kubeconfig={k}"),
            format!("--authorization-kubeconfig={k}"),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ];
        let scheduler = Proc::spawn(
            "kube-scheduler",
            sched,
            &common,
            &log_dir.join("scheduler.log"),
        )?;
        let mut args = common.clone();
        args.extend([
            "--use-service-account-credentials=false".to_string(),
            format!("--root-ca-file={}", cp.ca_path().display()),
            format!(
                "--service-account-private-key-file={}",
                cp.dir().join("sa.key").display()
            ),
            "--controllers=statefulset".into(),
        ]);
        let controllers = Proc::spawn(
            "kube-controller-manager",
            kcm,
            &args,
            &log_dir.join("controller-manager.log"),
        )?;
        Ok(ControlLoops {
            scheduler: Some(scheduler),
            controllers: Some(controllers),
        })
    }

    /// Stop both (controller-manager first).
    pub fn stop(&mut self) {
        for p in [&mut self.controllers, &mut self.scheduler] {
            if let Some(mut p) = p.take() {
                p.stop(Duration::from_secs(5));
            }
        }
    }
}

impl Drop for ControlLoops {
    fn drop(&mut self) {
        self.stop();
    }
}
