//! Node-restricted writes on the real kube-apiserver: `deploy/components/node-restriction/node-restriction.yaml`
//! (a ValidatingAdmissionPolicy) lets plexus' ServiceAccount, with a token bound to its pod on
//! one node, write the status of pods on that node, events it reports as that node and the
//! status of claims allocated there, and nothing of another node; a token bound to no pod can
//! write none of them. plexus itself runs end to end under the policy. And
//! `deploy/components/nad-policy/nad-policy.yaml` (a ValidatingAdmissionPolicy with the ConfigMap
//! `kube-system/plexus-nad-policy` as parameters) refuses NADs naming host interfaces, VLANs,
//! devices, device resources or host paths their namespace was not given, with a message naming
//! the key, the value and what is allowed. Skipped (and passing) without `PLEXUS_K8S_BIN`.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use common::raw_api::{answer, kube_client};
use common::*;
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::rig::{plexus_kubeconfig, PlexusToken, Rig};
use plexus_e2e::realk8s::{control_plane_or_skip, setup_or_report, ControlPlane, Suite};
use serde_json::{json, Value};

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
const OTHER_NODE: &str = "other-node";
const RESOURCE_NAME: &str = "k8s.v1.cni.cncf.io/resourceName";
/// The NAD policy's parameters (deploy/components/nad-policy/nad-policy.yaml's paramRef).
const POLICY_CM: &str = "/api/v1/namespaces/kube-system/configmaps/plexus-nad-policy";

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
    suite.case(
        "nad_policy_refuses_what_the_namespace_was_not_given",
        || nad_policy_refuses(&rig),
    );
    suite.case("nad_policy_allows_what_the_namespace_was_given", || {
        nad_policy_allows(&rig)
    });
    suite.case("nad_policy_reads_the_shipped_example_configmap", || {
        nad_policy_example_configmap(&rig)
    });
    // Last: it deletes and re-creates the ConfigMap.
    suite.case("nad_policy_without_its_configmap_allows_everything", || {
        nad_policy_without_configmap(&rig)
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
                "base/nad-crd.yaml",
                "components/fixed-ips/address-claim-crd.yaml",
                "base/rbac.yaml",
                "components/dra/rbac-dra.yaml",
                "components/fixed-ips/rbac-fixed-ips.yaml",
                "components/node-restriction/node-restriction.yaml",
                "components/nad-policy/nad-policy.yaml",
                "components/nad-policy/nad-policy-configmap.yaml",
            ])
            .namespaces(&["bank", "dev"])
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
        // The shipped example ConfigMap is in effect: bank may use ens1f0 and br-bank only.
        rig.wait_for_policy("the example ConfigMap", Some("allowed: ens1f0, br-bank ("))?;
        // This tier's own: what `mv` below, the docs and the examples need.
        cp.apply(&rig.policy_configmap().to_string())?;
        rig.wait_for_policy("this tier's ConfigMap", None)?;
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

    /// The NAD policy's parameters for this tier: the shipped example's allowances for bank,
    /// plus the veth master and the data directory (in the rig's directory) of the `mv` NAD,
    /// the resources docs/sriov.md's bank NAD names, and anything for the `default` namespace
    /// (the docs' and the examples' NADs).
    fn policy_configmap(&self) -> Value {
        json!({"apiVersion":"v1","kind":"ConfigMap",
        "metadata":{"name":"plexus-nad-policy","namespace":"kube-system"},
        "data":{
            "bank.interfaces": format!("ens1f0, br-bank, {}", self.master.0),
            "bank.vlans": "100, 200-209",
            "bank.resourceNames": "intel.com/bank_vf, intel.com/sriov_*",
            "default.interfaces": "*",
            "default.vlans": "*",
            "default.resourceNames": "*",
            "default.devices": "*",
            "paths.data": format!("/var/lib/cni/networks, {}", self.rig.dir().display()),
        }})
    }

    /// Wait until the NAD policy is in effect with the ConfigMap a case just applied: a bank
    /// NAD on an interface no ConfigMap gives is refused (with `refusal` in the message, when
    /// given) and, for this tier's ConfigMap (`refusal` None), one on the veth master allowed.
    /// Policies and their parameters reach admission through informers, a moment after the
    /// write.
    fn wait_for_policy(&self, what: &str, refusal: Option<&str>) -> Result<()> {
        let bad = nad(
            "bank",
            "probe",
            &json!({"type":"macvlan","master":"probe-eth9"}).to_string(),
            None,
        );
        let good = nad(
            "bank",
            "probe",
            &json!({"type":"macvlan","master":self.master.0}).to_string(),
            None,
        );
        wait_until(&format!("the NAD policy in effect with {what}"), || {
            let refused = match dry_run(self.cp, &bad) {
                Ok(()) => return Ok(false),
                Err(e) => e.contains(refusal.unwrap_or("\"probe-eth9\"")),
            };
            Ok(refused && (refusal.is_some() || dry_run(self.cp, &good).is_ok()))
        })
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
            "nadPolicy":nad_policy_allowing(&[self.rig.dir()]),
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
    // An address claim another node's plexus made.
    let addr_claim = |name: &str, node: &str| {
        json!({"apiVersion":"plexus.cni.io/v1alpha1","kind":"AddressClaim",
            "metadata":{"name":name,"namespace":"bank"},
            "spec":{"network":"bank/mv","address":"10.171.0.9","node":node,
                "pod":{"namespace":"bank","name":"pg-b","uid":"u-b"}}})
    };
    rig.cp
        .apply(&addr_claim("theirs", OTHER_NODE).to_string())?;
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
        let claims = "/apis/plexus.cni.io/v1alpha1/namespaces/bank/addressclaims".to_string();
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
            ("address claim naming own node", &bound, "POST", claims.clone(), addr_claim("mine", &rig.node), 200, ""),
            ("address claim naming another node", &bound, "POST", claims.clone(), addr_claim("forged", OTHER_NODE), 403, "may only write AddressClaims that name its own node"),
            ("another node's address claim deleted", &bound, "DELETE", format!("{claims}/theirs"), Value::Null, 403, "may only write AddressClaims that name its own node"),
            ("own address claim deleted", &bound, "DELETE", format!("{claims}/mine"), Value::Null, 200, ""),
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

/// A NetworkAttachmentDefinition `ns/name` with `config`, and the resourceName annotation.
fn nad(ns: &str, name: &str, config: &str, resource: Option<&str>) -> Value {
    let mut meta = json!({"name":name,"namespace":ns});
    if let Some(r) = resource {
        meta["annotations"] = json!({RESOURCE_NAME: r});
    }
    json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
        "metadata":meta,"spec":{"config":config}})
}

/// `kubectl apply` of a NAD, as its namespace's user would: the error is kubectl's (the API
/// server's answer).
fn apply_nad(cp: &ControlPlane, nad: &Value) -> std::result::Result<(), String> {
    cp.apply(&nad.to_string())
        .map(drop)
        .map_err(|e| format!("{e:#}"))
}

/// The same through admission without storing it.
fn dry_run(cp: &ControlPlane, nad: &Value) -> std::result::Result<(), String> {
    cp.kubectl_stdin(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&nad.to_string()),
    )
    .map(drop)
    .map_err(|e| format!("{e:#}"))
}

fn nad_path(ns: &str, name: &str) -> String {
    format!("/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions/{name}")
}

fn wait_until(what: &str, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let t0 = Instant::now();
    loop {
        if f()? {
            return Ok(());
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `(what, namespace, config, resourceName, what the refusal must say)`
type Refused<'a> = (&'a str, &'a str, Value, Option<&'a str>, Vec<&'a str>);

fn nad_policy_refuses(rig: &AdmissionRig<'_>) -> Result<()> {
    let macvlan = |master: &str| json!({"cniVersion":"1.0.0","type":"macvlan","master":master,"mode":"bridge"});
    let with_ipam = |ipam: Value| {
        let mut c = macvlan("ens1f0");
        c["ipam"] = ipam;
        c
    };
    let bank_ifaces = format!("allowed: ens1f0, br-bank, {} (keys bank.interfaces, _all.interfaces of ConfigMap kube-system/plexus-nad-policy)", rig.master.0);
    let cases: Vec<Refused<'_>> = vec![
        ("an interface bank was not given", "bank", macvlan("eth0"), None,
            vec!["host interface not allowed in namespace bank", "\"master\": \"eth0\"", &bank_ifaces]),
        ("an interface in a namespace given nothing", "dev", macvlan("ens1f0"), None,
            vec!["NetworkAttachmentDefinition dev/", "\"master\": \"ens1f0\"", "allowed: (none) (keys dev.interfaces, _all.interfaces"]),
        ("a VLAN outside the ranges", "bank",
            json!({"cniVersion":"1.0.0","type":"bridge","bridge":"br-bank","vlan":210}), None,
            vec!["VLAN not allowed in namespace bank", "\"vlan\": 210", "allowed: 100, 200-209 (keys bank.vlans, _all.vlans"]),
        ("a quoted VLAN", "bank",
            json!({"cniVersion":"1.0.0","type":"sriov","vlanId":"4000"}), Some("intel.com/bank_vf"),
            vec!["\"vlanId\": \"4000\"", "allowed: 100, 200-209"]),
        ("a VLAN trunk without *", "bank",
            json!({"cniVersion":"1.0.0","type":"bridge","bridge":"br-bank","vlanTrunk":[{"minID":200,"maxID":201}]}), None,
            vec!["\"vlanTrunk\" needs \"*\"", "bank.vlans"]),
        ("host-local's dataDir in /etc", "bank",
            with_ipam(json!({"type":"host-local","dataDir":"/etc/ceo-nad-datadir","ranges":[[{"subnet":"10.9.0.0/24"}]]})), None,
            vec!["host path not allowed", "\"dataDir\": \"/etc/ceo-nad-datadir\" is outside the data directories",
                 "(key paths.data of ConfigMap kube-system/plexus-nad-policy)", "/var/lib/cni/networks"]),
        ("whereabouts reading the kubelet's credentials", "bank",
            with_ipam(json!({"type":"whereabouts","range":"10.9.0.0/24","kubernetes":{"kubeconfig":"/etc/kubernetes/kubelet.conf"}})), None,
            vec!["\"kubeconfig\": \"/etc/kubernetes/kubelet.conf\" is outside the config directories",
                 "allowed: /etc/cni/net.d/whereabouts.d and below (key paths.config"]),
        ("a log file climbing out of its directory", "bank",
            with_ipam(json!({"type":"whereabouts","range":"10.9.0.0/24","log_file":"/var/log/cni/../../../etc/x"})), None,
            vec!["\"log_file\": \"/var/log/cni/../../../etc/x\" has a \"..\" component",
                 "allowed: /var/log/cni, /var/log/plexus-sriov and below (key paths.logs"]),
        // The last of two keys wins in JSON: the node would take eth0, the regexes see ens1f0.
        ("a \\u escape hiding \"master\"", "bank",
            Value::String(r#"{"cniVersion":"1.0.0","type":"macvlan","master":"ens1f0","m\u0061ster":"eth0"}"#.into()), None,
            vec!["spec.config has a JSON \\u escape, which could hide a key or a value"]),
        ("a macvlan on the node's default-route interface", "bank",
            json!({"cniVersion":"1.0.0","type":"macvlan","mode":"bridge"}), None,
            vec!["a macvlan or ipvlan without \"master\"", "only \"*\" allows", "bank.interfaces"]),
        ("a device resource bank was not given", "bank",
            json!({"cniVersion":"1.0.0","type":"sriov","vlan":205}), Some("intel.com/other_vf"),
            vec!["device resource not allowed in namespace bank", "resourceName \"intel.com/other_vf\"",
                 "allowed: intel.com/bank_vf, intel.com/sriov_* (keys bank.resourceNames, _all.resourceNames"]),
        ("a PCI device bank was not given", "bank",
            json!({"cniVersion":"1.0.0","type":"sriov","deviceID":"0000:af:06.1","vlan":205}), None,
            vec!["host device not allowed in namespace bank", "\"deviceID\": \"0000:af:06.1\"", "allowed: (none) (keys bank.devices"]),
    ];
    let mut failures = Vec::new();
    for (i, (what, ns, config, resource, needles)) in cases.into_iter().enumerate() {
        let config = match config {
            Value::String(s) => s,
            v => v.to_string(),
        };
        let name = format!("refused-{i}");
        let got = apply_nad(rig.cp, &nad(ns, &name, &config, resource));
        let (code, _) = rig.cp.get(&nad_path(ns, &name))?;
        match got {
            Ok(()) => failures.push(format!("{what}: admitted ({config})")),
            Err(e) => {
                let missing: Vec<&&str> = needles
                    .iter()
                    .chain(&[
                        "(Forbidden)",
                        "ValidatingAdmissionPolicy 'plexus-nad-policy'",
                    ])
                    .filter(|n| !e.contains(**n))
                    .collect();
                if !missing.is_empty() {
                    failures.push(format!("{what}: the refusal does not say {missing:?}: {e}"));
                }
            }
        }
        if code != 404 {
            failures.push(format!("{what}: {ns}/{name} exists (GET: {code})"));
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

fn nad_policy_allows(rig: &AdmissionRig<'_>) -> Result<()> {
    let cases: Vec<(&str, &str, String, Option<&str>)> = vec![
        ("bank's uplink, a VLAN in range, host-local's default dataDir", "bank",
            json!({"cniVersion":"1.0.0","type":"macvlan","master":"ens1f0","mode":"bridge","vlan":205,
                "ipam":{"type":"host-local","dataDir":"/var/lib/cni/networks","ranges":[[{"subnet":"10.9.0.0/24"}]]}}).to_string(), None),
        ("whereabouts' own kubeconfig and log", "bank",
            json!({"cniVersion":"1.0.0","plugins":[{"type":"bridge","bridge":"br-bank","vlan":0,
                "ipam":{"type":"whereabouts","range":"10.9.0.0/24","log_file":"/var/log/cni/whereabouts.log",
                    "kubernetes":{"kubeconfig":"/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}}},
                {"type":"tuning","sysctl":{"net.ipv4.conf.all.log_martians":"1"}}]}).to_string(), None),
        ("bank's VF pool with a VLAN", "bank",
            json!({"cniVersion":"1.0.0","type":"sriov","vlan":100,"ipam":{"type":"static"}}).to_string(), Some("intel.com/bank_vf")),
        ("an empty config", "dev", String::new(), None),
        ("a config naming nothing on the host", "dev",
            json!({"cniVersion":"1.0.0","type":"bridge","isGateway":false}).to_string(), None),
        ("anything in kube-system", "kube-system",
            json!({"cniVersion":"1.0.0","type":"macvlan","master":"eth0","vlanTrunk":[{"id":5}],
                "ipam":{"type":"host-local","dataDir":"/etc/ceo-nad-datadir"}}).to_string(), Some("intel.com/any")),
    ];
    let mut failures = Vec::new();
    for (i, (what, ns, config, resource)) in cases.iter().enumerate() {
        let name = format!("allowed-{i}");
        match apply_nad(rig.cp, &nad(ns, &name, config, *resource)) {
            Ok(()) => {
                let (code, body) = rig.cp.get(&nad_path(ns, &name))?;
                if code != 200 {
                    failures.push(format!("{what}: GET {ns}/{name}: {code} {body}"));
                }
                // An unchanged config with a new label is an UPDATE the policy also admits.
                let label = ["label", "nad", &name, "-n", ns, "checked=yes"];
                if let Err(e) = rig.cp.kubectl(&label) {
                    failures.push(format!("{what}: label: {e:#}"));
                }
                rig.cp.kubectl(&["delete", "nad", &name, "-n", ns])?;
            }
            Err(e) => failures.push(format!("{what}: refused: {e}")),
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// deploy/components/nad-policy/nad-policy-configmap.yaml loads and the policy reads it as it says: bank
/// may use ens1f0, br-bank, VLANs 100 and 200-209, intel.com/bank_vf, and nothing else; another
/// namespace nothing.
fn nad_policy_example_configmap(rig: &AdmissionRig<'_>) -> Result<()> {
    rig.cp.apply_file(&repo(
        "deploy/components/nad-policy/nad-policy-configmap.yaml",
    ))?;
    let checked = (|| -> Result<()> {
        rig.wait_for_policy("the example ConfigMap", Some("allowed: ens1f0, br-bank ("))?;
        let cm = rig.cp.get_json(POLICY_CM)?;
        ensure!(
            cm["data"]["bank.vlans"] == "100, 200-209"
                && cm["data"].as_object().is_some_and(|d| d.len() == 3),
            "the example's data: {}",
            cm["data"]
        );
        let ok = [
            (
                "bank",
                json!({"cniVersion":"1.0.0","type":"macvlan","master":"ens1f0","vlan":200,
                "ipam":{"type":"host-local","dataDir":"/var/lib/cni/networks/bank"}}),
                None,
            ),
            (
                "bank",
                json!({"cniVersion":"1.0.0","type":"bridge","bridge":"br-bank","vlan":"209"}),
                None,
            ),
            (
                "bank",
                json!({"cniVersion":"1.0.0","type":"sriov","vlan":100}),
                Some("intel.com/bank_vf"),
            ),
        ];
        for (ns, config, resource) in ok {
            dry_run(rig.cp, &nad(ns, "example", &config.to_string(), resource))
                .map_err(|e| anyhow::anyhow!("{config} refused: {e}"))?;
        }
        let refused = [
            ("bank", json!({"cniVersion":"1.0.0","type":"macvlan","master":"ens1f1"}), None,
                "\"master\": \"ens1f1\"; allowed: ens1f0, br-bank (keys bank.interfaces"),
            ("bank", json!({"cniVersion":"1.0.0","type":"bridge","bridge":"br-bank","vlan":101}), None,
                "\"vlan\": 101; allowed: 100, 200-209 (keys bank.vlans"),
            ("bank", json!({"cniVersion":"1.0.0","type":"sriov"}), Some("intel.com/shared_vf"),
                "resourceName \"intel.com/shared_vf\"; allowed: intel.com/bank_vf (keys bank.resourceNames"),
            ("bank", json!({"cniVersion":"1.0.0","type":"bridge","bridge":"br-bank",
                "ipam":{"type":"host-local","dataDir":"/var/lib/cni/networks-other"}}), None,
                "is outside the data directories; allowed: /var/lib/cni/networks and below"),
            ("dev", json!({"cniVersion":"1.0.0","type":"bridge","bridge":"br-bank"}), None,
                "\"bridge\": \"br-bank\"; allowed: (none) (keys dev.interfaces"),
        ];
        for (ns, config, resource, needle) in refused {
            match dry_run(rig.cp, &nad(ns, "example", &config.to_string(), resource)) {
                Ok(()) => anyhow::bail!("{ns}: {config} admitted"),
                Err(e) => ensure!(
                    e.contains(needle),
                    "{ns}: {config}: want {needle:?}, got {e}"
                ),
            }
        }
        Ok(())
    })();
    rig.cp.apply(&rig.policy_configmap().to_string())?;
    rig.wait_for_policy("this tier's ConfigMap again", None)?;
    checked
}

/// Without the ConfigMap the policy is not in use: every NAD is admitted, as before it was
/// installed. With it back, a NAD admitted meanwhile can still be labelled (its config
/// unchanged), but not changed unless the result is allowed.
fn nad_policy_without_configmap(rig: &AdmissionRig<'_>) -> Result<()> {
    let bad = json!({"cniVersion":"1.0.0","type":"macvlan","master":"eth0","vlan":4000,
        "ipam":{"type":"host-local","dataDir":"/etc/ceo-nad-datadir"}})
    .to_string();
    rig.cp.kubectl(&[
        "delete",
        "configmap",
        "plexus-nad-policy",
        "-n",
        "kube-system",
    ])?;
    let checked = (|| -> Result<()> {
        let probe = nad("dev", "probe", &bad, Some("intel.com/any"));
        wait_until("the NAD policy without its ConfigMap", || {
            Ok(dry_run(rig.cp, &probe).is_ok())
        })?;
        for ns in ["bank", "dev"] {
            apply_nad(rig.cp, &nad(ns, "unchecked", &bad, Some("intel.com/any")))
                .map_err(|e| anyhow::anyhow!("{ns}: refused without the ConfigMap: {e}"))?;
        }
        Ok(())
    })();
    rig.cp.apply(&rig.policy_configmap().to_string())?;
    rig.wait_for_policy("this tier's ConfigMap, re-created", None)?;
    checked?;
    rig.cp
        .kubectl(&["label", "nad", "unchecked", "-n", "bank", "seen=yes"])
        .context("a label on a NAD admitted without the ConfigMap")?;
    let changed = nad(
        "bank",
        "unchecked",
        &json!({"cniVersion":"1.0.0","type":"macvlan","master":"eth0","vlan":4000}).to_string(),
        Some("intel.com/any"),
    );
    let e = apply_nad(rig.cp, &changed).err().unwrap_or_default();
    ensure!(
        e.contains("\"master\": \"eth0\"") && e.contains("bank.interfaces"),
        "a changed config is checked again: {e}"
    );
    for ns in ["bank", "dev"] {
        rig.cp.kubectl(&["delete", "nad", "unchecked", "-n", ns])?;
    }
    Ok(())
}
