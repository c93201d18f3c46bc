//! Node-restricted writes on the real kube-apiserver: `deploy/admission/node-restriction.yaml`
//! (a ValidatingAdmissionPolicy) lets plexus' ServiceAccount, with a token bound to its pod on
//! one node, write the status of pods on that node, events it reports as that node and the
//! status of claims allocated there, and nothing of another node; a token bound to no pod can
//! write none of them. plexus itself runs end to end under the policy. Skipped (and passing)
//! without `PLEXUS_K8S_BIN`.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{ensure, Context, Result};
use common::raw_api::{answer, kube_client};
use common::*;
use plexus_e2e::realk8s::rig::{plexus_kubeconfig, PlexusToken, Rig};
use plexus_e2e::realk8s::{control_plane_or_skip, setup_or_report, ControlPlane, Suite};
use serde_json::{json, Value};

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
const OTHER_NODE: &str = "other-node";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let Some(rig) = setup_or_report("real_admission", &cp, AdmissionRig::new(&cp)) else {
        return ExitCode::FAILURE;
    };
    let mut suite = Suite::new("real_admission");
    suite.case("plexus_attaches_a_pod_on_its_own_node", || own_node(&rig));
    suite.case(
        "plexus_cannot_write_the_status_of_a_pod_on_another_node",
        || other_node(&rig),
    );
    suite.case("direct_writes_are_checked_per_node_and_per_token", || {
        direct_writes(&rig)
    });
    suite.case("manifests_in_the_docs_and_examples_are_accepted", || {
        doc_manifests(&rig)
    });
    drop(rig);
    suite.finish()
}

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// The node plexus runs on. Not this host's name: plexus reports events as the pod's
/// `spec.nodeName`, which is what the policy checks.
fn own_node_name() -> String {
    "plexus-node-a".to_string()
}

struct AdmissionRig<'a> {
    cp: &'a ControlPlane,
    rig: Rig<'a>,
    bridge: HostLink,
    master: HostLink,
    node: String,
}

impl<'a> AdmissionRig<'a> {
    fn new(cp: &'a ControlPlane) -> Result<AdmissionRig<'a>> {
        let node = own_node_name();
        ensure!(!node.is_empty(), "no host name");
        // plexus' DaemonSet pod on this node, and its bound token (as the kubelet projects it).
        let rig = Rig::builder()
            .deploy(&[
                "nad-crd.yaml",
                "rbac.yaml",
                "rbac-dra.yaml",
                "admission/node-restriction.yaml",
            ])
            .namespaces(&["bank"])
            .node_objects(&[node.as_str(), OTHER_NODE])
            .plexus_token(PlexusToken::BoundToPod {
                node: node.clone(),
                pod: "plexus-ds".into(),
            })
            .build(cp)?;
        plexus_kubeconfig(cp, &rig.path("unbound.kubeconfig"), &PlexusToken::Unbound)?;
        let rig = AdmissionRig {
            cp,
            rig,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
            node,
        };
        let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":"mv","namespace":"bank"},
            "spec":{"config":json!({"cniVersion":"1.0.0","type":"macvlan","master":rig.master.0,"mode":"bridge",
                "ipam":{"type":"host-local","dataDir":rig.p("ipam"),"ranges":[[{"subnet":"10.171.0.0/24"}]]}}).to_string()}});
        cp.apply(&nad.to_string())?;
        Ok(rig)
    }

    fn p(&self, s: &str) -> PathBuf {
        self.rig.path(s)
    }

    fn pod(&self, name: &str, node: &str) -> Result<String> {
        self.cp.apply(
            &json!({"apiVersion":"v1","kind":"Pod",
                "metadata":{"name":name,"namespace":"bank","annotations":{NETWORKS:"mv"}},
                "spec":{"nodeName":node,"automountServiceAccountToken":false,"containers":[{"name":"db","image":"pg"}]}})
            .to_string(),
        )?;
        let got = self
            .cp
            .get_json(&format!("/api/v1/namespaces/bank/pods/{name}"))?;
        Ok(got["metadata"]["uid"].as_str().context("uid")?.to_string())
    }

    fn plexus(&self, cmd: &str, pod: &str, uid: &str, netns: &str) -> Run {
        let conf = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","kubeconfig":self.p("kubeconfig"),
            "cniDir":self.p("state"),"binDir":CNI_BIN,"logFile":self.p("plexus.log"),"logLevel":"debug","logToStderr":false,
            "delegates":[flannel_like(&self.bridge.0, 72, &self.p("ipam"))]});
        let args =
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bank;K8S_POD_NAME={pod};K8S_POD_UID={uid}");
        let call = Call {
            command: cmd,
            container_id: &format!("cid-{pod}"),
            netns,
            ifname: "eth0",
            args: &args,
        };
        run(&bin("plexus"), &call, &conf, &[])
    }

    fn leftovers(&self) -> Vec<String> {
        let mut v = files_under(&self.p("state"));
        v.extend(files_under(&self.p("ipam")));
        v.retain(|f| !f.starts_with("locks"));
        v
    }
}

fn own_node(rig: &AdmissionRig<'_>) -> Result<()> {
    let uid = rig.pod("pg-own", &rig.node.clone())?;
    let ns = Netns::new();
    let add = rig.plexus("ADD", "pg-own", &uid, &ns.path());
    let del_later = || rig.plexus("DEL", "pg-own", &uid, &ns.path());
    if add.code != 0 {
        del_later();
        anyhow::bail!("ADD failed: {} {}", add.out, add.stderr);
    }
    let pod = rig.cp.get_json("/api/v1/namespaces/bank/pods/pg-own")?;
    let status = pod["metadata"]["annotations"][STATUS]
        .as_str()
        .unwrap_or("");
    let events = rig.cp.get_json("/api/v1/namespaces/bank/events")?;
    let added = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e["involvedObject"]["name"] == "pg-own" && e["reason"] == "AddedInterface");
    let del = del_later();
    ensure!(status.contains("bank/mv"), "network-status: {pod}");
    ensure!(added, "the AddedInterface event was admitted: {events}");
    ensure!(del.code == 0, "DEL: {}", del.out);
    ensure!(rig.leftovers().is_empty(), "{:?}", rig.leftovers());
    Ok(())
}

fn other_node(rig: &AdmissionRig<'_>) -> Result<()> {
    let uid = rig.pod("pg-far", OTHER_NODE)?;
    let ns = Netns::new();
    let add = rig.plexus("ADD", "pg-far", &uid, &ns.path());
    rig.plexus("DEL", "pg-far", &uid, &ns.path());
    let e = add.err().clone();
    let text = format!("{} {}", e["msg"], e["details"]);
    ensure!(
        text.contains("pod bank/pg-far")
            && text.contains(&format!(
                "may not write the status of a pod on node {OTHER_NODE}"
            )),
        "{e}"
    );
    ensure!(ns.links() == ["lo"], "rolled back: {:?}", ns.links());
    let pod = rig.cp.get_json("/api/v1/namespaces/bank/pods/pg-far")?;
    ensure!(pod["metadata"]["annotations"][STATUS].is_null(), "{pod}");
    ensure!(rig.leftovers().is_empty(), "{:?}", rig.leftovers());
    Ok(())
}

fn direct_writes(rig: &AdmissionRig<'_>) -> Result<()> {
    rig.pod("pg-a", &rig.node.clone())?;
    rig.pod("pg-b", OTHER_NODE)?;
    // A claim allocated on each node (as the scheduler writes it).
    for (claim, node) in [("vf-here", rig.node.as_str()), ("vf-there", OTHER_NODE)] {
        rig.cp.apply(&json!({"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
            "metadata":{"name":claim,"namespace":"bank"},
            "spec":{"devices":{"requests":[{"name":"vf","exactly":{"deviceClassName":"sriov-vf"}}]}}}).to_string())?;
        let alloc = json!({"status":{"allocation":{"devices":{"results":[{"request":"vf","driver":"sriov.plexus.test","pool":node,"device":"vf-0"}]},
            "nodeSelector":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":[node]}]}]}}}});
        rig.cp.kubectl(&[
            "patch",
            "resourceclaim",
            claim,
            "-n",
            "bank",
            "--subresource=status",
            "--type=merge",
            "-p",
            &alloc.to_string(),
        ])?;
    }
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let bound = kube_client(&rig.p("kubeconfig")).await?;
        let unbound = kube_client(&rig.p("unbound.kubeconfig")).await?;
        let status = |pod: &str| format!("/api/v1/namespaces/bank/pods/{pod}/status");
        let note = json!({"metadata":{"annotations":{STATUS:"[]"}}});
        let event = |host: &str, pod: &str| {
            json!({"apiVersion":"v1","kind":"Event","metadata":{"generateName":"t-","namespace":"bank"},
                "involvedObject":{"kind":"Pod","namespace":"bank","name":pod},"reason":"AddedInterface",
                "message":"x","type":"Normal","source":{"component":"plexus","host":host}})
        };
        let claim_status = |claim: &str| format!("/apis/resource.k8s.io/v1/namespaces/bank/resourceclaims/{claim}/status");
        let net_data = |pool: &str| {
            json!({"status":{"devices":[{"driver":"sriov.plexus.test","pool":pool,"device":"vf-0",
                "networkData":{"interfaceName":"net1"}}]}})
        };
        let cases: Vec<(&str, &kube::Client, &str, String, Value, u16, &str)> = vec![
            ("claim on own node", &bound, "PATCH", claim_status("vf-here"), net_data(&rig.node), 200, ""),
            // Kubernetes 1.36 refuses this itself (per-driver associated-node check, 422) before
            // the policy's own claim rule, which guards clusters without that check.
            ("claim on another node", &bound, "PATCH", claim_status("vf-there"), net_data(OTHER_NODE), 422, "arbitrary-node:patch"),
            ("own pod", &bound, "PATCH", status("pg-a"), note.clone(), 200, ""),
            ("other node's pod", &bound, "PATCH", status("pg-b"), note.clone(), 403, "may not write the status of a pod on node other-node"),
            ("token without node", &unbound, "PATCH", status("pg-a"), note.clone(), 403, "not bound to a pod"),
            ("event as own node", &bound, "POST", "/api/v1/namespaces/bank/events".into(), event(&rig.node, "pg-a"), 200, ""),
            ("event as another node", &bound, "POST", "/api/v1/namespaces/bank/events".into(), event(OTHER_NODE, "pg-b"), 403, "only report pod events as its own node"),
        ];
        for (what, client, method, path, body, code, needle) in cases {
            let (got, reason, message) = answer(client, method, &path, &body).await;
            let got = if got == 201 { 200 } else { got };
            ensure!(
                got == code && message.contains(needle),
                "{what}: want {code} {needle:?}, got {got} {reason} {message}"
            );
        }
        Ok(())
    })
}

/// Every YAML manifest in the user docs and in `deploy/examples/` is valid for the real API
/// server (server-side dry run: schema, CRD validation, admission), with this tier's CRD.
fn doc_manifests(rig: &AdmissionRig<'_>) -> Result<()> {
    let mut manifests: Vec<(String, String)> = Vec::new();
    for doc in user_documents() {
        let text = std::fs::read_to_string(&doc)?;
        for (line, block) in markdown_blocks(&text, "yaml") {
            manifests.push((format!("{}:{line}", doc.display()), block));
        }
    }
    for entry in std::fs::read_dir(repo("deploy/examples"))? {
        let path = entry?.path();
        manifests.push((path.display().to_string(), std::fs::read_to_string(&path)?));
    }
    ensure!(
        manifests.len() >= 5,
        "only {} manifests found",
        manifests.len()
    );
    // No controller-manager here: the examples' namespace needs its default ServiceAccount.
    rig.cp.apply(
        &json!({"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"default","namespace":"default"}})
            .to_string(),
    )?;
    for (what, yaml) in &manifests {
        rig.cp
            .kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], Some(yaml))
            .with_context(|| format!("{what} is refused"))?;
    }
    Ok(())
}
