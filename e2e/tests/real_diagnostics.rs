//! Live diagnostics (issue 38) on the real kube-apiserver: `plexus explain --pod` reads the pod
//! and its NADs with the node's config — a kubeconfig holding a TokenRequest token of
//! `kube-system/plexus` under exactly `deploy/base/rbac.yaml`, so the diagnostics need no right
//! ADD does not have — and says what ADD does or why it fails: a missing NAD and a NAD the
//! node's policy refuses give the CNI error the real ADD returns (the refusal with its class);
//! a good pod its plan, then after its ADD the saved plan and the network-status the ADD wrote,
//! which `plexus state` lists too. Skipped (and passing) without `PLEXUS_K8S_BIN`.

mod common;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{ensure, Context, Result};
use common::*;
use plexus_e2e::realk8s::rig::{PlexusToken, Rig};
use plexus_e2e::realk8s::{control_plane_or_skip, setup_or_report, ControlPlane, Suite};
use serde_json::{json, Value};

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const NODE: &str = "plexus-diag-node";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let Some(node) = setup_or_report("real_diagnostics", &cp, Node::new(&cp)) else {
        return ExitCode::FAILURE;
    };
    let mut suite = Suite::new("real_diagnostics");
    suite.case("explain_pod_names_a_missing_nad_as_add_does", || {
        missing_nad(&node)
    });
    suite.case(
        "explain_pod_names_a_refused_nad_and_its_policy_class_as_add_does",
        || refused_nad(&node),
    );
    suite.case(
        "explain_pod_plans_a_good_pod_then_shows_its_saved_plan_and_status",
        || good_pod(&node),
    );
    drop(node);
    suite.finish()
}

struct Node<'a> {
    cp: &'a ControlPlane,
    rig: Rig<'a>,
    bridge: HostLink,
    master: HostLink,
}

impl<'a> Node<'a> {
    fn new(cp: &'a ControlPlane) -> Result<Node<'a>> {
        let rig = Rig::builder()
            .deploy(&["base/nad-crd.yaml", "base/rbac.yaml"])
            .namespaces(&["bank"])
            .plexus_token(PlexusToken::Unbound)
            .build(cp)?;
        let node = Node {
            cp,
            rig,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
        };
        std::fs::create_dir_all(node.path("allowed/data"))?;
        std::fs::write(node.path("plexus.conflist"), node.config().to_string())?;
        Ok(node)
    }

    fn path(&self, p: &str) -> PathBuf {
        self.rig.path(p)
    }

    fn config(&self) -> Value {
        json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus",
            "kubeconfig": self.rig.kubeconfig(), "cniDir": self.path("state"), "binDir": CNI_BIN,
            "nodeName": NODE, "logLevel":"debug", "logFile": self.path("plexus.log"), "logToStderr": false,
            "nadPolicy": {"paths":{"data":[self.path("allowed/data")]}},
            "delegates":[flannel_like(&self.bridge.0, 74, &self.path("allowed/data"))]})
    }

    fn nad(&self, name: &str, data_dir: &str, subnet: &str) -> Result<()> {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":self.master.0,"mode":"bridge",
            "ipam":{"type":"host-local","dataDir":data_dir,"ranges":[[{"subnet":subnet}]]}});
        let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":name,"namespace":"bank"},"spec":{"config":cfg.to_string()}});
        self.cp.apply(&nad.to_string()).map(drop)
    }

    /// A pod of `bank` on this node asking for `networks`; its CNI_ARGS.
    fn pod(&self, name: &str, networks: &str) -> Result<String> {
        let _ = self
            .cp
            .kubectl(&["-n", "bank", "delete", "pod", name, "--ignore-not-found"]);
        let pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":name,"namespace":"bank","annotations":{NETWORKS:networks}},
            "spec":{"nodeName":NODE,"automountServiceAccountToken":false,
                "containers":[{"name":"c","image":"local/pause:1"}]}});
        self.cp
            .kubectl_stdin(&["create", "-f", "-"], Some(&pod.to_string()))?;
        let got = self
            .cp
            .get_json(&format!("/api/v1/namespaces/bank/pods/{name}"))?;
        let uid = got["metadata"]["uid"].as_str().context("uid")?;
        Ok(format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=bank;K8S_POD_NAME={name};K8S_POD_UID={uid}"
        ))
    }

    fn cni(&self, command: &str, cid: &str, netns: &Netns, args: &str) -> Run {
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: cid,
                netns: &netns.path(),
                ifname: "eth0",
                args,
            },
            &self.config(),
            &[],
        )
    }

    /// `plexus ARGS… --json --config <the node's conflist>`: exit code and the JSON printed.
    fn plexus(&self, args: &[&str]) -> Result<(i32, Value)> {
        let out = Command::new(bin("plexus"))
            .args(args)
            .args(["--json", "--config"])
            .arg(self.path("plexus.conflist"))
            .env_clear()
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v = serde_json::from_str(&text).with_context(|| {
            format!(
                "plexus {args:?}: not JSON: {text} / {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        Ok((out.status.code().unwrap_or(-1), v))
    }

    /// explain's failure equals the real ADD's CNI error (code, msg, details).
    fn same_as_add(&self, explained: &Value, pod: &str, args: &str) -> Result<()> {
        let netns = Netns::new();
        let cid = uniq("diag");
        let add = self.cni("ADD", &cid, &netns, args);
        self.cni("DEL", &cid, &netns, args);
        ensure!(add.code != 0, "{pod}: ADD succeeded: {}", add.out);
        for k in ["code", "msg", "details"] {
            ensure!(
                explained["failure"][k] == add.out[k],
                "{pod}: explain's {k} {} differs from ADD's {}",
                explained["failure"][k],
                add.out[k]
            );
        }
        Ok(())
    }
}

fn missing_nad(node: &Node<'_>) -> Result<()> {
    let args = node.pod("p-missing", "nope")?;
    let (code, v) = node.plexus(&["explain", "--pod", "bank/p-missing"])?;
    ensure!(code == 1, "exit {code}: {v:#}");
    ensure!(v["found"] == true && v["node"] == NODE, "{v:#}");
    ensure!(v["failure"]["stage"] == "plan", "{v:#}");
    ensure!(
        v["failure"]["msg"]
            .as_str()
            .is_some_and(|m| m.contains("network bank/nope")),
        "{v:#}"
    );
    node.same_as_add(&v, "p-missing", &args)
}

fn refused_nad(node: &Node<'_>) -> Result<()> {
    node.nad(
        "outside",
        "/var/lib/cni/plexus-diag-outside",
        "10.74.9.0/24",
    )?;
    let args = node.pod("p-refused", "outside")?;
    let (code, v) = node.plexus(&["explain", "--pod", "bank/p-refused"])?;
    ensure!(code == 1, "exit {code}: {v:#}");
    ensure!(v["failure"]["stage"] == "nadPolicy", "{v:#}");
    ensure!(v["failure"]["class"] == "paths/data", "{v:#}");
    ensure!(
        v["plan"]["attachments"][1]["network"] == "bank/outside",
        "the plan up to the refusal: {v:#}"
    );
    node.same_as_add(&v, "p-refused", &args)?;
    ensure!(
        !std::path::Path::new("/var/lib/cni/plexus-diag-outside").exists(),
        "a refused NAD's dataDir was written"
    );
    Ok(())
}

fn good_pod(node: &Node<'_>) -> Result<()> {
    let data = node.path("allowed/data");
    node.nad("data", data.to_str().context("path")?, "10.74.8.0/24")?;
    let args = node.pod("p-good", "data")?;
    let (code, v) = node.plexus(&["explain", "--pod", "bank/p-good"])?;
    ensure!(code == 0 && v["verdict"] == "ok", "exit {code}: {v:#}");
    ensure!(
        v["plan"]["attachments"][1]["delegates"][0]["type"] == "macvlan",
        "{v:#}"
    );
    ensure!(v["networkStatus"].is_null(), "status before any ADD: {v:#}");
    let netns = Netns::new();
    let cid = uniq("diag-good");
    let add = node.cni("ADD", &cid, &netns, &args);
    let after = node.plexus(&["explain", "--pod", "bank/p-good"]);
    let state = node.plexus(&["state", "--runtime-endpoint", "none"]);
    let addr = netns.addrs("net1");
    node.cni("DEL", &cid, &netns, &args);
    ensure!(add.code == 0, "ADD: {}", add.out);
    let (code, v) = after?;
    ensure!(code == 0, "{v:#}");
    ensure!(v["saved"][0]["containerId"] == cid.as_str(), "{v:#}");
    let status_ip = v["networkStatus"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["interface"] == "net1")
        .and_then(|s| s["ips"][0].as_str())
        .context("net1 in network-status")?
        .to_string();
    ensure!(
        addr.iter().any(|a| a.starts_with(&status_ip)),
        "{status_ip} vs {addr:?}"
    );
    let (_, st) = state?;
    let plans = st["plans"].as_array().context("plans")?;
    ensure!(
        plans
            .iter()
            .any(|p| p["containerId"] == cid.as_str() && p["pod"] == "bank/p-good"),
        "{st:#}"
    );
    ensure!(
        st["runtime"]["crossChecked"] == false,
        "runtimeEndpoint none: {st:#}"
    );
    Ok(())
}
