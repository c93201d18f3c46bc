//! The node tiers' leak check (real_node, real_node_crio, real_node_daemon, real_node_churn):
//! every sandbox and pod netns a tier saw ([`Seen`]), and what the node still holds of them once
//! their pods are deleted ([`Seen::leftovers`], [`wait_clean`]).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use plexus_e2e::realk8s::node::{wait_for, Node};
use plexus_e2e::realk8s::overlay::Overlay;
use plexus_e2e::realk8s::ControlPlane;
use serde_json::{json, Value};

use super::api::Api;
use crate::common;

/// Every sandbox ID and pod netns path a tier has seen (the leak checks after their pods are
/// gone).
#[derive(Default)]
pub struct Seen {
    /// Sandbox IDs (the overlay's state, iptables rules and libcni cache entries naming one).
    pub sandboxes: Vec<String>,
    /// Pod netns paths (this tier's pods' only: another kubelet may run on the machine).
    pub netns: Vec<String>,
}

impl Seen {
    /// (sandbox ID, netns path) of the running pod `ns/name`; its netns recorded.
    pub fn pod_netns(
        &mut self,
        api: &Api,
        node: &Node<'_>,
        ns: &str,
        name: &str,
    ) -> Result<(String, String)> {
        let pod = api.get_pod(ns, name)?.context("pod gone")?;
        let uid = pod["metadata"]["uid"].as_str().context("uid")?;
        let (sb, netns) = node.pod_sandbox(uid)?;
        self.netns.push(netns.clone());
        Ok((sb, netns))
    }

    /// What `node` still holds of the seen pods: plexus plans and result-cache files,
    /// host-local leases, their netns, host veths on the overlay's bridge and on `bridges`,
    /// the overlay's per-pod state ([`Overlay::leftovers`]), libcni cache entries. Call when no
    /// test pod exists.
    pub fn leftovers(
        &self,
        cp: &ControlPlane,
        node: &Node<'_>,
        overlay: &Overlay,
        bridges: &[String],
    ) -> Vec<String> {
        let mut v: Vec<String> = common::files_under(&node.plexus_dir())
            .into_iter()
            .map(|f| format!("plexus: {f}"))
            .collect();
        v.extend(
            common::files_under(&node.ipam_dir())
                .into_iter()
                .map(|f| format!("lease: {f}")),
        );
        v.extend(
            self.netns
                .iter()
                .filter(|n| Path::new(n).exists())
                .map(|n| format!("netns: {n}")),
        );
        for br in overlay.bridge().iter().chain(bridges) {
            let out = common::ip(&["-j", "link", "show", "master", br]);
            let links: Value = serde_json::from_str(&out).unwrap_or(json!([]));
            for l in links.as_array().into_iter().flatten() {
                v.push(format!("veth on {br}: {}", l["ifname"]));
            }
        }
        v.extend(overlay.leftovers(cp, node, &self.sandboxes));
        for e in std::fs::read_dir(node.host_path("/var/lib/cni/results"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = e.file_name().to_string_lossy().into_owned();
            if self.sandboxes.iter().any(|s| n.contains(s.as_str())) {
                v.push(format!("libcni cache: {n}"));
            }
        }
        v
    }
}

/// Wait (`timeout`) until `leftovers` is empty; else an error listing them.
pub fn wait_clean(timeout: Duration, leftovers: impl Fn() -> Vec<String>) -> Result<()> {
    wait_for("nothing left on the node", timeout, || {
        Ok(leftovers().is_empty())
    })
    .with_context(|| format!("left: {:?}", leftovers()))
}
