//! Issue 38's live diagnostics on this tier's real node (kubelet, containerd, plexus installed
//! by install.sh): `plexus state`, cross-checked with containerd's own CRI sandbox list, flags
//! the deliberately leaked sandbox and only it, while the live pods' plans are `live`; `plexus
//! explain --pod` on a live pod shows its sandbox's saved plan and network-status, and on a pod
//! stuck in ContainerCreating (a NAD that does not exist) the error the kubelet reports.
//! Both run as the installed binary with the installed config, as `kubectl exec … plexus` does.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use plexus_e2e::realk8s::node::wait_for;
use serde_json::{json, Value};

use super::{pods, Tier, NS};

impl Tier<'_> {
    /// The config install.sh published.
    fn installed_config(&self) -> PathBuf {
        let dir = self.on.node.conf_dir();
        let list = dir.join("00-plexus.conflist");
        if list.exists() {
            list
        } else {
            dir.join("00-plexus.conf")
        }
    }

    /// The installed `plexus ARGS… --json --config <installed>`: exit code and its JSON.
    fn plexus_json(&self, args: &[&str]) -> Result<(i32, Value)> {
        let out = Command::new(self.on.node.bin_dir().join("plexus"))
            .args(args)
            .arg("--json")
            .arg("--config")
            .arg(self.installed_config())
            .env_clear()
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        ensure!(
            !text.contains(&self.token),
            "plexus {args:?} printed the token"
        );
        let v = serde_json::from_str(&text).with_context(|| {
            format!(
                "plexus {args:?}: {text} / {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        Ok((out.status.code().unwrap_or(-1), v))
    }

    /// `live`: the live pods' (sandbox ID, netns), `live-a` first; `leaked`: the sandbox ID
    /// containerd never had.
    pub(super) fn diagnose(&self, live: &[(String, String)], leaked: &str) -> Result<()> {
        // --grace 0: the leak is seconds old (the reconciler waits its grace period).
        let (code, st) = self.plexus_json(&["state", "--grace", "0"])?;
        ensure!(code == 0, "plexus state: {st:#}");
        ensure!(
            st["runtime"]["crossChecked"] == true,
            "not cross-checked with containerd: {:#}",
            st["runtime"]
        );
        let plans = st["plans"].as_array().context("plans")?;
        let sandbox = |id: &str| {
            plans
                .iter()
                .find(|p| p["containerId"] == id)
                .map(|p| p["sandbox"].clone())
        };
        for (id, _) in live {
            ensure!(
                sandbox(id) == Some(json!("live")),
                "live sandbox {id}: {st:#}"
            );
        }
        ensure!(
            sandbox(leaked) == Some(json!("gone")),
            "leaked {leaked}: {st:#}"
        );
        let flagged: Vec<(&str, &str)> = st["leftovers"]
            .as_array()
            .context("leftovers")?
            .iter()
            .map(|l| {
                (
                    l["kind"].as_str().unwrap_or(""),
                    l["containerId"].as_str().unwrap_or(""),
                )
            })
            .collect();
        ensure!(
            flagged.contains(&("plan", leaked)),
            "the leak is not flagged: {flagged:?}"
        );
        ensure!(
            !flagged
                .iter()
                .any(|(_, id)| live.iter().any(|(l, _)| l == id)),
            "a live sandbox is flagged: {flagged:?}"
        );
        println!(
            "    plexus state: {} plans, {} sandboxes listed by containerd, leftovers {flagged:?}",
            plans.len(),
            st["runtime"]["sandboxes"]
        );

        // A live pod: what its ADD did on this node. The runtime's CNI_PATH is the node's bin
        // dir (the config's binDir is the default /opt/cni/bin).
        let cni_path = self.on.node.bin_dir().display().to_string();
        let (code, ex) = self.plexus_json(&[
            "explain",
            "--pod",
            &format!("{NS}/live-a"),
            "--cni-path",
            &cni_path,
        ])?;
        ensure!(code == 0 && ex["verdict"] == "ok", "explain live-a: {ex:#}");
        ensure!(
            ex["saved"][0]["containerId"] == live[0].0.as_str(),
            "explain live-a's saved plan: {ex:#}"
        );
        let net1 = ex["networkStatus"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["interface"] == "net1")
            .and_then(|s| s["ips"][0].as_str())
            .context("net1 in live-a's network-status")?
            .to_string();
        let addr = pods::address(&live[0].1, "net1")?;
        ensure!(addr.starts_with(&net1), "{net1} vs {addr}");

        // A pod stuck in ContainerCreating: its NAD does not exist.
        let node = &self.on.node;
        let broken = pods::manifest(NS, "broken", node.name(), "gc", Some(&json!("nope")));
        self.api.create_pod(&broken)?;
        let (code, ex) = self.plexus_json(&[
            "explain",
            "--pod",
            &format!("{NS}/broken"),
            "--cni-path",
            &cni_path,
        ])?;
        let msg = ex["failure"]["msg"].as_str().unwrap_or("").to_string();
        let reported = wait_for(
            "the kubelet's FailedCreatePodSandBox",
            Duration::from_secs(90),
            || {
                Ok(self.api.events(NS, "broken")?.iter().any(|e| {
                    e["message"]
                        .as_str()
                        .is_some_and(|m| !msg.is_empty() && m.contains(&msg))
                }))
            },
        );
        let _ = self.api.delete_pod(NS, "broken");
        let gone = wait_for("pod broken deleted", Duration::from_secs(60), || {
            Ok(self.api.get_pod(NS, "broken")?.is_none())
        });
        ensure!(
            code == 1 && ex["failure"]["stage"] == "plan",
            "explain broken: {ex:#}"
        );
        ensure!(msg.contains(&format!("network {NS}/nope")), "{msg}");
        reported.with_context(|| {
            format!(
                "no event of pod broken carries explain's message {msg:?}: {:?}",
                self.api.events(NS, "broken")
            )
        })?;
        println!("    plexus explain --pod {NS}/broken: {msg}");
        gone
    }
}
