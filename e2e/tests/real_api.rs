//! API tier: plexus against a real kube-apiserver + etcd (`plexus_e2e::realk8s`), with the
//! Debian plugins in real network namespaces. `deploy/base/nad-crd.yaml` and `deploy/base/rbac.yaml` are
//! applied for real and plexus runs with a TokenRequest token of `kube-system/plexus`, so a
//! missing or excessive right fails. Pods and NADs are created by the admin (no scheduler: pods
//! carry `spec.nodeName`). The API faults (slow, 429/500, unreachable) come from a fault proxy in
//! front of the real apiserver (`tests/real_api/faults.rs`). Skipped (and passing) without
//! `PLEXUS_K8S_BIN`.

mod common;
#[path = "real_api/faults.rs"]
mod faults;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{ensure, Context, Result};
use common::raw_api::{answer, kube_client};
use common::*;
use plexus_e2e::nad_policy_allowing;
use plexus_e2e::realk8s::rig::{PlexusToken, Rig};
use plexus_e2e::realk8s::{
    control_plane_or_skip, metrics, setup_or_report, ControlPlane, RequestCounts, RequestKey, Suite,
};
use serde_json::{json, Value};

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
const PLEXUS_USER: &str = "system:serviceaccount:kube-system:plexus";
/// The resources plexus touches; request deltas are counted for these only.
const RESOURCES: &[&str] = &["pods", "events", "network-attachment-definitions"];

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let Some(node) = setup_or_report("real_api", &cp, Node::new(&cp)) else {
        return ExitCode::FAILURE;
    };
    let mut suite = Suite::new("real_api");
    suite.case(
        "three_extra_networks_both_forms_status_events_and_request_counts",
        || three_extra_networks(&node),
    );
    suite.case("pod_without_networks_gets_default_only", || {
        no_networks(&node)
    });
    suite.case("kubeconfig_forms_the_thin_client_reads", || {
        kubeconfig_forms(&node)
    });
    suite.case("default_network_override_from_annotation", || {
        default_override(&node)
    });
    suite.case(
        "namespace_isolation_and_missing_nad_fail_with_a_warning_event",
        || isolation_and_missing(&node),
    );
    suite.case("pod_annotations_from_the_runtime_save_the_pod_get", || {
        runtime_annotations(&node)
    });
    suite.case(
        "cluster_network_file_default_networks_and_no_events",
        || multus_style(&node),
    );
    suite.case("pod_recreated_with_another_uid_is_refused", || {
        recreated_pod(&node)
    });
    suite.case("pod_replaced_before_the_status_patch_is_recognised", || {
        replaced_before_patch(&node)
    });
    suite.case("del_and_add_with_the_apiserver_stopped", || {
        del_apiserver_stopped(&node)
    });
    suite.case("stand_in_answers_like_the_real_apiserver", || {
        stand_in_fidelity(&node)
    });
    suite.case("cluster_role_grants_exactly_what_plexus_calls", || {
        rbac_exact(&node)
    });
    suite.case(
        "pod_names_wrong_server_paths_and_missing_pods_are_told_apart",
        || names_and_not_found(&node),
    );
    suite.case(
        "del_without_a_plan_with_the_apiserver_stopped_is_quick",
        || planless_del_apiserver_stopped(&node),
    );
    // The fault matrix's API faults, injected by a proxy in front of the real apiserver.
    suite.case(
        "api_slow_beyond_the_timeout_is_try_again_later_and_leaves_nothing",
        || faults::api_slow(&node),
    );
    suite.case(
        "api_throttling_and_server_errors_are_retried_then_reported",
        || faults::api_throttling_and_server_errors(&node),
    );
    suite.case("api_down_then_back", || faults::api_down_then_back(&node));
    suite.case("api_unreachable_at_add_is_try_again_later", || {
        faults::api_unreachable_then_503s_retried(&node)
    });
    suite.case("status_refused_after_the_event_undoes_and_warns", || {
        faults::status_refused_after_the_event_undoes_and_warns(&node)
    });
    drop(node);
    suite.finish()
}

/// The node side: plexus' state dirs and kubeconfig, a default bridge network, a macvlan master.
struct Node<'a> {
    cp: &'a ControlPlane,
    rig: Rig<'a>,
    bridge: HostLink,
    master: HostLink,
    octet: u8,
}

impl<'a> Node<'a> {
    fn new(cp: &'a ControlPlane) -> Result<Node<'a>> {
        let rig = Rig::builder()
            .deploy(&["base/nad-crd.yaml", "base/rbac.yaml"])
            .namespaces(&["db", "other"])
            .plexus_token(PlexusToken::Unbound)
            .build(cp)?;
        Ok(Node {
            cp,
            rig,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
            octet: 51,
        })
    }

    fn path(&self, p: &str) -> PathBuf {
        self.rig.path(p)
    }

    fn config(&self, extra: &Value) -> Value {
        let mut c = json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus",
            "kubeconfig": self.path("kubeconfig"), "cniDir": self.path("state"), "binDir": CNI_BIN,
            "confDir": self.path("confdir"), "logLevel":"debug", "logFile": self.path("plexus.log"), "logToStderr": false,
            "nadPolicy": nad_policy_allowing(&[self.rig.dir()]),
            "delegates":[flannel_like(&self.bridge.0, self.octet, &self.path("ipam"))]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }

    fn host_local(&self, subnet: &str) -> Value {
        json!({"type":"host-local","dataDir":self.path("ipam"),"ranges":[[{"subnet":subnet}]]})
    }

    /// A macvlan NAD (admin, `kubectl apply`).
    fn macvlan_nad(&self, ns: &str, name: &str, ipam: Value) -> Result<()> {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":self.master.0,"mode":"bridge","ipam":ipam});
        self.nad(ns, name, &cfg)
    }

    fn nad(&self, ns: &str, name: &str, cfg: &Value) -> Result<()> {
        let nad = json!({"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition",
            "metadata":{"name":name,"namespace":ns},"spec":{"config":cfg.to_string()}});
        self.cp.apply(&nad.to_string()).map(drop)
    }

    /// Create a pod bound to a (never running) node; its UID.
    fn pod(&self, ns: &str, name: &str, annotations: Value) -> Result<String> {
        let pod = json!({"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":name,"namespace":ns,"annotations":annotations},
            "spec":{"nodeName":"plexus-api-node","automountServiceAccountToken":false,
                "containers":[{"name":"c","image":"local/pause:1"}]}});
        self.cp
            .kubectl_stdin(&["create", "-f", "-"], Some(&pod.to_string()))?;
        self.uid(ns, name)
    }

    fn uid(&self, ns: &str, name: &str) -> Result<String> {
        let p = self
            .cp
            .get_json(&format!("/api/v1/namespaces/{ns}/pods/{name}"))?;
        Ok(p["metadata"]["uid"]
            .as_str()
            .context("pod uid")?
            .to_string())
    }

    fn args(ns: &str, name: &str, uid: &str) -> String {
        format!("K8S_POD_INFRA_CONTAINER_ID=cid-{name};K8S_POD_UID={uid};IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}")
    }

    fn call(&self, command: &str, cid: &str, netns: &str, args: &str, extra: &Value) -> Run {
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: cid,
                netns,
                ifname: "eth0",
                args,
            },
            &self.config(extra),
            &[],
        )
    }

    /// network-status of the pod, read back from the apiserver.
    fn status(&self, ns: &str, name: &str) -> Result<Value> {
        let pod = self
            .cp
            .get_json(&format!("/api/v1/namespaces/{ns}/pods/{name}"))?;
        let s = pod["metadata"]["annotations"][STATUS]
            .as_str()
            .unwrap_or("[]");
        Ok(serde_json::from_str(s)?)
    }

    /// Events about the pod, read back from the apiserver.
    fn events(&self, ns: &str, pod: &str) -> Result<Vec<Value>> {
        let list = self.cp.get_json(&format!(
            "/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3D{pod}"
        ))?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// Plexus state and host-local leases left on the node.
    fn leftovers(&self) -> Vec<String> {
        let mut v: Vec<String> = files_under(&self.path("state"))
            .into_iter()
            .filter(|f| !f.starts_with("locks"))
            .collect();
        v.extend(files_under(&self.path("ipam")));
        v
    }

    /// Run `f` and return the API requests it caused (by verb, resource, subresource).
    fn counted<T>(&self, f: impl FnOnce() -> T) -> Result<(T, RequestCounts)> {
        let before = self.cp.request_totals()?;
        let out = f();
        let after = self.cp.request_totals()?;
        Ok((out, metrics::delta(&before, &after, RESOURCES)))
    }
}

/// `f()` and its wall time in milliseconds.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t0 = std::time::Instant::now();
    let out = f();
    (out, t0.elapsed().as_secs_f64() * 1e3)
}

/// `GET pods ×1, PATCH pods/status ×1, …`
fn shown(c: &RequestCounts) -> String {
    let v: Vec<String> = c.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
    v.join(", ")
}

fn total(c: &RequestCounts) -> u64 {
    c.values().sum()
}

fn key(verb: &str, resource: &str, sub: &str) -> RequestKey {
    RequestKey::new(verb, resource, sub)
}

fn status_names(st: &Value) -> Vec<String> {
    st.as_array()
        .into_iter()
        .flatten()
        .map(|e| e["name"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn three_extra_networks(node: &Node<'_>) -> Result<()> {
    node.macvlan_nad("db", "mv-a", node.host_local("10.151.1.0/24"))?;
    node.macvlan_nad("db", "mv-b", node.host_local("10.151.2.0/24"))?;
    node.macvlan_nad("default", "mv-c", node.host_local("10.151.3.0/24"))?;
    for (form, value) in [
        ("comma", json!("mv-a,db/mv-b@data0,default/mv-c")),
        (
            "json",
            json!(
                r#"[{"name":"mv-a"},{"name":"mv-b","namespace":"db","interface":"data0"},{"name":"mv-c","namespace":"default"}]"#
            ),
        ),
    ] {
        let ns = Netns::new();
        let pod = format!("pg-{form}");
        let uid = node.pod("db", &pod, json!({NETWORKS: value}))?;
        let args = Node::args("db", &pod, &uid);
        let cid = format!("cid-{form}");
        let (r, reqs) =
            node.counted(|| timed(|| node.call("ADD", &cid, &ns.path(), &args, &json!({}))))?;
        let (r, add_ms) = r;
        let out = r.ok().clone();
        ensure!(
            out["ips"][0]["address"]
                .as_str()
                .unwrap_or("")
                .starts_with(&format!("10.244.{}.", node.octet)),
            "{out}"
        );
        let mut links = ns.links();
        links.sort();
        ensure!(
            links == ["data0", "eth0", "lo", "net1", "net3"],
            "{form}: {links:?}"
        );
        ensure!(ns.addrs("data0")[0].starts_with("10.151.2."));
        // network-status as the apiserver stored it.
        let st = node.status("db", &pod)?;
        ensure!(
            status_names(&st) == ["cbr0", "db/mv-a", "db/mv-b", "default/mv-c"],
            "{st}"
        );
        ensure!(
            st[0]["default"] == true && st[0]["interface"] == "eth0",
            "{st}"
        );
        ensure!(st[2]["interface"] == "data0", "{st}");
        ensure!(
            st[1]["mac"].as_str() == Some(ns.mac("net1").as_str()),
            "{st}"
        );
        ensure!(
            !st[1]["ips"][0].as_str().unwrap_or("/").contains('/'),
            "{st}"
        );
        // The event was accepted and is on the pod.
        let evs = node.events("db", &pod)?;
        ensure!(evs.len() == 1, "{form}: one event expected: {evs:#?}");
        let ev = &evs[0];
        ensure!(
            ev["reason"] == "AddedInterface" && ev["type"] == "Normal",
            "{ev}"
        );
        ensure!(ev["involvedObject"]["uid"] == uid.as_str(), "{ev}");
        ensure!(
            ev["message"].as_str().unwrap_or("").contains("data0"),
            "{ev}"
        );
        ensure!(
            ev["reportingComponent"] == "plexus" && ev["action"].is_string(),
            "{ev}"
        );
        // Requests, from the apiserver's own counters: GET pod, 3 NAD GETs, PATCH status, POST event.
        println!(
            "    ADD ({form}, 3 NADs): {add_ms:.0} ms, {} requests: {}",
            total(&reqs),
            shown(&reqs)
        );
        ensure!(reqs.get(&key("GET", "pods", "")) == Some(&1), "{reqs:?}");
        ensure!(
            reqs.get(&key("GET", "network-attachment-definitions", "")) == Some(&3),
            "{reqs:?}"
        );
        ensure!(
            reqs.get(&key("PATCH", "pods", "status")) == Some(&1),
            "{reqs:?}"
        );
        ensure!(reqs.get(&key("POST", "events", "")) == Some(&1), "{reqs:?}");
        ensure!(total(&reqs) == 6, "N + 3 = 6: {reqs:?}");
        node.call("CHECK", &cid, &ns.path(), &args, &json!({})).ok();
        let ((r, del_ms), reqs) =
            node.counted(|| timed(|| node.call("DEL", &cid, &ns.path(), &args, &json!({}))))?;
        r.ok();
        println!(
            "    DEL ({form}): {del_ms:.0} ms, {} requests",
            total(&reqs)
        );
        ensure!(reqs.is_empty(), "DEL must not call the API: {reqs:?}");
        ensure!(ns.links() == ["lo"]);
        ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    }
    Ok(())
}

fn no_networks(node: &Node<'_>) -> Result<()> {
    let ns = Netns::new();
    let uid = node.pod("db", "solo", json!({}))?;
    let args = Node::args("db", "solo", &uid);
    let (r, reqs) = node.counted(|| node.call("ADD", "cid-solo", &ns.path(), &args, &json!({})))?;
    r.ok();
    println!(
        "    ADD (no NAD): {} requests: {}",
        total(&reqs),
        shown(&reqs)
    );
    ensure!(total(&reqs) == 3, "GET pod, PATCH status, event: {reqs:?}");
    ensure!(ns.links().len() == 2);
    ensure!(status_names(&node.status("db", "solo")?) == ["cbr0"]);
    ensure!(node.events("db", "solo")?.len() == 1);
    node.call("DEL", "cid-solo", &ns.path(), &args, &json!({}))
        .ok();
    ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    Ok(())
}

/// The kubeconfig forms a node may carry, each as plexus' own identity on the real apiserver:
/// a client certificate (inline data), a token file with a trailing newline and a CA file by
/// relative path with `tls-server-name`, an exec credential plugin. Each ADD writes the
/// network-status (so the PATCH was authenticated and authorised) and DEL leaves nothing; an
/// `auth-provider` user is refused with code 7 before anything is created.
fn kubeconfig_forms(node: &Node<'_>) -> Result<()> {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let token = node.cp.create_token("kube-system", "plexus")?;
    let dir = node.path("kubeconfigs");
    std::fs::create_dir_all(&dir)?;
    let write = |name: &str, cluster: String, user: String| -> Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}users:\n- name: u\n  user:\n{user}\
                 contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
            ),
        )?;
        Ok(path)
    };
    let server = node.cp.url();
    let ca_data = format!(
        "    server: {server}\n    certificate-authority-data: {}\n",
        b64(&node.cp.ca_pem())
    );
    std::fs::write(dir.join("ca.crt"), node.cp.ca_pem())?;
    std::fs::write(dir.join("token"), format!("{token}\n"))?;
    let cred = dir.join("credential.sh");
    std::fs::write(
        &cred,
        format!(
            "#!/bin/sh\nprintf '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"%s\"}}}}' \"$(cat {})\"\n",
            dir.join("token").display()
        ),
    )?;
    std::fs::set_permissions(&cred, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let cert = node.cp.client_cert(PLEXUS_USER, None)?;
    let forms = [
        (
            "client certificate",
            write(
                "cert",
                ca_data.clone(),
                format!(
                    "    client-certificate-data: {}\n    client-key-data: {}\n",
                    b64(&cert.cert_pem),
                    b64(&cert.key_pem)
                ),
            )?,
        ),
        (
            "token file, CA file, tls-server-name",
            write(
                "token-file",
                format!(
                    "    server: https://127.0.0.1:{}\n    certificate-authority: ca.crt\n    tls-server-name: localhost\n",
                    node.cp.port()
                ),
                "    tokenFile: token\n".into(),
            )?,
        ),
        (
            "exec credential plugin",
            write(
                "exec",
                ca_data.clone(),
                format!(
                    "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {}\n      interactiveMode: Never\n",
                    cred.display()
                ),
            )?,
        ),
    ];
    for (i, (form, path)) in forms.iter().enumerate() {
        let name = format!("kc-{i}");
        let ns = Netns::new();
        let uid = node.pod("db", &name, json!({}))?;
        let args = Node::args("db", &name, &uid);
        let extra = json!({"kubeconfig": path});
        let r = node.call("ADD", &name, &ns.path(), &args, &extra);
        ensure!(r.code == 0, "{form}: ADD failed: {} {}", r.out, r.stderr);
        ensure!(
            status_names(&node.status("db", &name)?) == ["cbr0"],
            "{form}: no network-status written"
        );
        node.call("DEL", &name, &ns.path(), &args, &extra).ok();
        ensure!(
            node.leftovers().is_empty(),
            "{form}: {:?}",
            node.leftovers()
        );
        println!("    {form}: ADD wrote the network-status, DEL left nothing");
    }

    let refused = write(
        "auth-provider",
        ca_data,
        "    auth-provider:\n      name: oidc\n      config:\n        id-token: s3cr3t\n".into(),
    )?;
    let ns = Netns::new();
    let uid = node.pod("db", "kc-refused", json!({}))?;
    let args = Node::args("db", "kc-refused", &uid);
    let extra = json!({"kubeconfig": refused});
    let r = node.call("ADD", "kc-refused", &ns.path(), &args, &extra);
    let err = r.err();
    ensure!(err["code"] == 7, "{err}");
    let text = err.to_string();
    ensure!(text.contains("auth-provider is not supported"), "{text}");
    ensure!(!text.contains("s3cr3t"), "{text}");
    ensure!(ns.links().len() == 1, "nothing attached: {:?}", ns.links());
    node.call("DEL", "kc-refused", &ns.path(), &args, &extra)
        .ok();
    ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    Ok(())
}

fn default_override(node: &Node<'_>) -> Result<()> {
    node.macvlan_nad(
        "kube-system",
        "alt-default",
        node.host_local("10.154.0.0/24"),
    )?;
    let ns = Netns::new();
    let uid = node.pod(
        "db",
        "alt",
        json!({"v1.multus-cni.io/default-network": "alt-default"}),
    )?;
    let args = Node::args("db", "alt", &uid);
    let out = node
        .call("ADD", "cid-alt", &ns.path(), &args, &json!({}))
        .ok()
        .clone();
    ensure!(
        out["ips"][0]["address"]
            .as_str()
            .unwrap_or("")
            .starts_with("10.154.0."),
        "{out}"
    );
    ensure!(ns.addrs("eth0")[0].starts_with("10.154.0."));
    let st = node.status("db", "alt")?;
    ensure!(
        st[0]["name"] == "kube-system/alt-default" && st[0]["default"] == true,
        "{st}"
    );
    node.call("DEL", "cid-alt", &ns.path(), &args, &json!({}))
        .ok();
    ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    Ok(())
}

fn isolation_and_missing(node: &Node<'_>) -> Result<()> {
    node.macvlan_nad("other", "foreign", node.host_local("10.155.1.0/24"))?;
    let extra = json!({"namespaceIsolation": true});
    for (name, ann, needle) in [
        ("iso", "other/foreign", "isolation"),
        ("missing", "db/nope", "db/nope"),
    ] {
        let ns = Netns::new();
        let uid = node.pod("db", name, json!({NETWORKS: ann}))?;
        let args = Node::args("db", name, &uid);
        let r = node.call("ADD", &format!("cid-{name}"), &ns.path(), &args, &extra);
        let e = r.err().clone();
        ensure!(e["code"] == 7, "{name}: {e}");
        ensure!(e.to_string().contains(needle), "{name}: {e}");
        ensure!(ns.links() == ["lo"], "{name}");
        node.call("DEL", &format!("cid-{name}"), "", &args, &extra)
            .ok();
        ensure!(
            node.leftovers().is_empty(),
            "{name}: {:?}",
            node.leftovers()
        );
        // The pod author sees why, on the pod.
        let evs = node.events("db", name)?;
        ensure!(
            evs.iter().any(|ev| ev["type"] == "Warning"
                && ev["reason"] == "AddInterfaceFailed"
                && ev["message"].as_str().unwrap_or("").contains(needle)),
            "{name}: a warning event naming {needle}: {evs:#?}"
        );
        ensure!(node
            .status("db", name)?
            .as_array()
            .is_none_or(Vec::is_empty));
    }
    Ok(())
}

fn runtime_annotations(node: &Node<'_>) -> Result<()> {
    node.macvlan_nad("db", "mv-rt", node.host_local("10.156.0.0/24"))?;
    let uid = node.pod("db", "rt", json!({NETWORKS: "mv-rt"}))?;
    let extra = json!({"capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {NETWORKS: "mv-rt"}}});
    let ns = Netns::new();
    let args = Node::args("db", "rt", &uid);
    let (r, reqs) = node.counted(|| node.call("ADD", "cid-rt", &ns.path(), &args, &extra))?;
    r.ok();
    println!(
        "    ADD (1 NAD, runtime annotations): {} requests: {}",
        total(&reqs),
        shown(&reqs)
    );
    ensure!(
        !reqs.contains_key(&key("GET", "pods", "")),
        "no GET pod: {reqs:?}"
    );
    ensure!(total(&reqs) == 1 + 2, "N + 2: {reqs:?}");
    ensure!(status_names(&node.status("db", "rt")?) == ["cbr0", "db/mv-rt"]);
    node.call("DEL", "cid-rt", &ns.path(), &args, &extra).ok();
    ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    Ok(())
}

/// `clusterNetwork` from a file, `defaultNetworks` from kube-system, `events: false`.
fn multus_style(node: &Node<'_>) -> Result<()> {
    let primary = node.path("10-flannel.conflist");
    std::fs::write(
        &primary,
        flannel_like(&node.bridge.0, node.octet, &node.path("ipam")).to_string(),
    )?;
    node.macvlan_nad(
        "kube-system",
        "monitoring",
        node.host_local("10.159.9.0/24"),
    )?;
    node.macvlan_nad("db", "mv-m", node.host_local("10.159.1.0/24"))?;
    let extra = json!({"clusterNetwork": primary, "defaultNetworks": ["monitoring"], "delegates": [], "events": false});
    let ns = Netns::new();
    let uid = node.pod("db", "m", json!({NETWORKS: "mv-m"}))?;
    let args = Node::args("db", "m", &uid);
    let (r, reqs) = node.counted(|| node.call("ADD", "cid-m", &ns.path(), &args, &extra))?;
    r.ok();
    println!(
        "    ADD (2 NADs, events off): {} requests: {}",
        total(&reqs),
        shown(&reqs)
    );
    ensure!(total(&reqs) == 4, "GET pod, 2 NADs, PATCH status: {reqs:?}");
    let st = node.status("db", "m")?;
    ensure!(
        status_names(&st) == ["cbr0", "kube-system/monitoring", "db/mv-m"],
        "{st}"
    );
    ensure!(
        st[1]["interface"] == "net1" && st[2]["interface"] == "net2",
        "{st}"
    );
    ensure!(node.events("db", "m")?.is_empty(), "events: false");
    node.call("DEL", "cid-m", &ns.path(), &args, &extra).ok();
    ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    Ok(())
}

fn recreated_pod(node: &Node<'_>) -> Result<()> {
    let ns = Netns::new();
    node.pod("db", "sts-0", json!({}))?;
    let args = Node::args("db", "sts-0", "uid-of-the-old-pod");
    let e = node
        .call("ADD", "cid-sts", &ns.path(), &args, &json!({}))
        .err()
        .to_string();
    ensure!(
        e.contains("db/sts-0") && e.contains("uid-of-the-old-pod"),
        "{e}"
    );
    ensure!(ns.links() == ["lo"]);
    ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    let pod = node.cp.get_json("/api/v1/namespaces/db/pods/sts-0")?;
    ensure!(
        pod["metadata"]["annotations"].get(STATUS).is_none(),
        "no status on the new pod"
    );
    Ok(())
}

/// With the runtime's pod annotations plexus skips the GET pod, so a pod replaced under the
/// same name (another UID) is only noticed by the status PATCH: the real apiserver answers 422
/// `metadata.uid: … field is immutable` (not 409 Precondition failed). plexus must read that
/// as "pod replaced": nothing written on the new pod, the ADD for the old sandbox not failed.
fn replaced_before_patch(node: &Node<'_>) -> Result<()> {
    let uid = node.pod("db", "swap", json!({}))?;
    let stale = "0b0e0000-0000-4000-8000-00000000beef";
    ensure!(uid != stale);
    let extra = json!({"capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {}}});
    let ns = Netns::new();
    let args = Node::args("db", "swap", stale);
    let (r, reqs) = node.counted(|| node.call("ADD", "cid-swap", &ns.path(), &args, &extra))?;
    println!(
        "    ADD (stale UID): {} requests: {}",
        total(&reqs),
        shown(&reqs)
    );
    ensure!(
        reqs.get(&key("PATCH", "pods", "status")) == Some(&1),
        "{reqs:?}"
    );
    ensure!(
        r.code == 0,
        "a replaced pod is not an ADD failure: {} {}",
        r.out,
        r.stderr
    );
    let pod = node.cp.get_json("/api/v1/namespaces/db/pods/swap")?;
    ensure!(
        pod["metadata"]["annotations"].get(STATUS).is_none(),
        "no status on the new pod"
    );
    node.call("DEL", "cid-swap", &ns.path(), &args, &extra).ok();
    ensure!(ns.links() == ["lo"]);
    ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    Ok(())
}

fn del_apiserver_stopped(node: &Node<'_>) -> Result<()> {
    node.macvlan_nad("db", "mv-down", node.host_local("10.157.0.0/24"))?;
    let ns = Netns::new();
    let uid = node.pod("db", "down", json!({NETWORKS: "mv-down"}))?;
    let args = Node::args("db", "down", &uid);
    node.call("ADD", "cid-down", &ns.path(), &args, &json!({}))
        .ok();
    ensure!(ns.links().len() == 3);
    ensure!(!node.leftovers().is_empty(), "ADD left a plan and leases");
    let uid2 = node.pod("db", "down-add", json!({}))?;
    node.cp.stop_apiserver();
    let res = (|| -> Result<()> {
        node.call("DEL", "cid-down", &ns.path(), &args, &json!({}))
            .ok();
        // The runtime repeats DEL, with an empty netns.
        node.call("DEL", "cid-down", "", &args, &json!({})).ok();
        node.call("DEL", "cid-down", "", &args, &json!({})).ok();
        ensure!(ns.links() == ["lo"], "{:?}", ns.links());
        ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
        // An ADD meanwhile is "try again later" (11) and attaches nothing.
        let ns2 = Netns::new();
        let args2 = Node::args("db", "down-add", &uid2);
        let (r, ms) = timed(|| node.call("ADD", "cid-down-add", &ns2.path(), &args2, &json!({})));
        println!(
            "    ADD with the apiserver stopped: code {} after {ms:.0} ms",
            r.out["code"]
        );
        ensure!(r.err()["code"] == 11, "{}", r.out);
        ensure!(ns2.links() == ["lo"]);
        node.call("DEL", "cid-down-add", "", &args2, &json!({}))
            .ok();
        ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
        Ok(())
    })();
    node.cp.start_apiserver()?;
    res
}

/// What the real apiserver's 404s mean: a pod name that would address another object is never
/// sent (code 4, no request); a kubeconfig `server` with a wrong path prefix gets the Go mux's
/// `404 page not found` (for a user allowed every path; plexus' own account gets 403), which
/// fails the ADD (102) instead of reading as "pod deleted"; a pod that really does not exist
/// gets a `NotFound` Status naming it, and only that is "gone".
fn names_and_not_found(node: &Node<'_>) -> Result<()> {
    let victim = node.pod("db", "names-victim", json!({}))?;
    let ns = Netns::new();
    for (pod_ns, name) in [
        ("db", "../../namespaces/db/pods/names-victim"),
        ("db", "names-victim?dryRun=All"),
        ("db/pods/names-victim", "x"),
    ] {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={pod_ns};K8S_POD_NAME={name}");
        let (r, counts) =
            node.counted(|| node.call("ADD", "cid-names", &ns.path(), &args, &json!({})))?;
        ensure!(r.code != 0, "{pod_ns}/{name}: ADD succeeded: {}", r.out);
        ensure!(r.out["code"] == 4, "{pod_ns}/{name}: {}", r.out);
        ensure!(total(&counts) == 0, "{pod_ns}/{name}: {}", shown(&counts));
        ensure!(ns.links() == ["lo"]);
        node.call("DEL", "cid-names", &ns.path(), &args, &json!({}))
            .ok();
    }

    // The same pod through a server URL with a wrong path prefix, as a user allowed every path.
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let cert = node
        .cp
        .client_cert("plexus-404-probe", Some("system:masters"))?;
    let wrong = node.path("kubeconfig-wrong-path");
    std::fs::write(
        &wrong,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}/not-the-api\n    certificate-authority-data: {}\n\
             users:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
            node.cp.url(),
            b64(&node.cp.ca_pem()),
            b64(&cert.cert_pem),
            b64(&cert.key_pem)
        ),
    )?;
    std::fs::set_permissions(&wrong, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let args = Node::args("db", "names-victim", &victim);
    let r = node.call(
        "ADD",
        "cid-names",
        &ns.path(),
        &args,
        &json!({"kubeconfig": wrong}),
    );
    println!("    ADD through a wrong server path: {}", r.out);
    ensure!(r.code != 0, "ADD succeeded: {}", r.out);
    ensure!(r.out["code"] == 102, "{}", r.out);
    ensure!(
        r.out["details"].as_str().unwrap_or("").contains("HTTP 404"),
        "{}",
        r.out
    );
    ensure!(ns.links() == ["lo"], "{:?}", ns.links());
    node.call("DEL", "cid-names", &ns.path(), &args, &json!({}))
        .ok();

    // A pod that does not exist: the apiserver's NotFound names it, plexus reads it as gone
    // (default network only, no status to write).
    let args = Node::args("db", "names-never-created", "");
    let r = node.call("ADD", "cid-names-gone", &ns.path(), &args, &json!({}));
    ensure!(r.code == 0, "{} / {}", r.out, r.stderr);
    ensure!(ns.links().len() == 2, "{:?}", ns.links());
    node.call("DEL", "cid-names-gone", &ns.path(), &args, &json!({}))
        .ok();
    ensure!(ns.links() == ["lo"], "{:?}", ns.links());
    ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    Ok(())
}

/// A DEL whose plan is lost while the apiserver is stopped asks it once instead of spending the
/// ADD's 2.5 s retry budget (10 attempts before), and the result cache still cleans up.
fn planless_del_apiserver_stopped(node: &Node<'_>) -> Result<()> {
    node.macvlan_nad("db", "mv-planless", node.host_local("10.158.0.0/24"))?;
    let ns = Netns::new();
    let uid = node.pod("db", "planless", json!({NETWORKS: "mv-planless"}))?;
    let args = Node::args("db", "planless", &uid);
    node.call("ADD", "cid-planless", &ns.path(), &args, &json!({}))
        .ok();
    ensure!(ns.links().len() == 3, "{:?}", ns.links());
    std::fs::remove_dir_all(node.path("state/plans"))?;
    node.cp.stop_apiserver();
    let res = (|| -> Result<()> {
        let (r, ms) = timed(|| node.call("DEL", "cid-planless", &ns.path(), &args, &json!({})));
        println!("    DEL without a plan, apiserver stopped: {ms:.0} ms");
        r.ok();
        ensure!(ms < 1500.0, "DEL took {ms:.0} ms");
        ensure!(ns.links() == ["lo"], "{:?}", ns.links());
        ensure!(node.leftovers().is_empty(), "{:?}", node.leftovers());
        Ok(())
    })();
    node.cp.start_apiserver()?;
    res
}

/// (apiGroup, resource[/subresource], verb) of an RBAC rule or an audited request.
type Right = (String, String, String);

fn rbac_exact(node: &Node<'_>) -> Result<()> {
    // Exercise every path that talks to the API: a pod with networks (GET pod, GET NADs,
    // PATCH status, Normal event) and one whose NAD is missing (Warning event).
    node.macvlan_nad("db", "mv-rbac", node.host_local("10.158.0.0/24"))?;
    let ns = Netns::new();
    let uid = node.pod("db", "rbac", json!({NETWORKS: "mv-rbac"}))?;
    let args = Node::args("db", "rbac", &uid);
    node.call("ADD", "cid-rbac", &ns.path(), &args, &json!({}))
        .ok();
    node.call("DEL", "cid-rbac", &ns.path(), &args, &json!({}))
        .ok();
    let uid = node.pod("db", "rbac-miss", json!({NETWORKS: "nope"}))?;
    let args = Node::args("db", "rbac-miss", &uid);
    node.call("ADD", "cid-rbac-miss", &ns.path(), &args, &json!({}))
        .err();
    node.call("DEL", "cid-rbac-miss", "", &args, &json!({}))
        .ok();

    let entries: Vec<_> = node
        .cp
        .audit()
        .into_iter()
        .filter(|e| e.user == PLEXUS_USER)
        .collect();
    ensure!(!entries.is_empty(), "no audited request by {PLEXUS_USER}");
    let denied: Vec<_> = entries.iter().filter(|e| e.code == 403).collect();
    ensure!(denied.is_empty(), "plexus was denied: {denied:#?}");
    // Every user may review its own access (system:basic-user): plexus asks before it claims a
    // host-local address (host_local_guard), and is told no here.
    let used: BTreeSet<Right> = entries
        .iter()
        .filter(|e| {
            !(e.group == "authorization.k8s.io" && e.resource == "selfsubjectaccessreviews")
        })
        .map(|e| {
            let res = if e.subresource.is_empty() {
                e.resource.clone()
            } else {
                format!("{}/{}", e.resource, e.subresource)
            };
            (e.group.clone(), res, e.verb.clone())
        })
        .collect();
    let role = node
        .cp
        .get_json("/apis/rbac.authorization.k8s.io/v1/clusterroles/plexus")?;
    let mut granted = BTreeSet::<Right>::new();
    for rule in role["rules"].as_array().context("rules")? {
        let list = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        };
        ensure!(rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none());
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    ensure!(g != "*" && r != "*" && v != "*", "wildcard in {rule}");
                    granted.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    println!("    plexus used: {used:?}");
    let missing: Vec<_> = used.difference(&granted).collect();
    let excess: Vec<_> = granted.difference(&used).collect();
    ensure!(missing.is_empty(), "used but not granted: {missing:?}");
    ensure!(
        excess.is_empty(),
        "granted but never used by plexus: {excess:?}"
    );
    Ok(())
}

/// The requests plexus makes, and the failures it must recognise, sent to both the real
/// apiserver and the stand-in (same objects, same client): same code, reason and message.
fn stand_in_fidelity(node: &Node<'_>) -> Result<()> {
    use plexus_e2e::{Access, TestApiServer, TestApiServerOptions};
    let real_uid = node.pod("db", "fid", json!({}))?;
    let stand_in = TestApiServer::start(TestApiServerOptions::default())?;
    stand_in.add_token("t", Access::Full);
    stand_in.put_namespace("db")?;
    let fake_uid = "2d7c1f3e-0000-4000-8000-000000000001";
    stand_in.put_pod(
        json!({"metadata":{"name":"fid","namespace":"db","uid":fake_uid},
        "spec":{"containers":[{"name":"c","image":"x"}]}}),
    )?;
    let fake_kc = node.path("stand-in.kubeconfig");
    stand_in.write_kubeconfig(&fake_kc, "t")?;
    // An authenticated identity without rights, and a token no server knows.
    node.cp.apply(r#"{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"nobody","namespace":"db"}}"#)?;
    let real_nobody = node.path("real-nobody.kubeconfig");
    node.cp
        .write_kubeconfig(&real_nobody, &node.cp.create_token("db", "nobody")?)?;
    stand_in.add_token_for("n", "system:serviceaccount:db:nobody", Access::None);
    let fake_nobody = node.path("stand-in-nobody.kubeconfig");
    stand_in.write_kubeconfig(&fake_nobody, "n")?;
    let (real_bad, fake_bad) = (
        node.path("real-bad.kubeconfig"),
        node.path("stand-in-bad.kubeconfig"),
    );
    node.cp.write_kubeconfig(&real_bad, "not-a-token")?;
    stand_in.write_kubeconfig(&fake_bad, "not-a-token")?;

    let old_style = json!({"metadata":{"name":"fid.1"},"involvedObject":{"kind":"Pod","namespace":"db","name":"fid"},
        "reason":"AddedInterface","message":"m","type":"Normal"});
    let mut no_action = json!({"metadata":{"name":"fid.2"},"involvedObject":{"kind":"Pod","namespace":"db","name":"fid"},
        "reason":"AddedInterface","message":"m","type":"Normal","eventTime":"2026-01-01T00:00:00.000000Z",
        "reportingComponent":"plexus","reportingInstance":"n1"});
    let mut with_action = no_action.clone();
    with_action["metadata"]["name"] = json!("fid.3");
    with_action["action"] = json!("CNIAdd");
    let mut mismatch = old_style.clone();
    mismatch["metadata"]["name"] = json!("fid.4");
    mismatch["involvedObject"]["namespace"] = json!("other");
    no_action["reportingInstance"] = json!("");
    let status_patch = |uid: &str| json!({"metadata":{"uid":uid,"annotations":{STATUS:"[]"}}});
    let ev = "/api/v1/namespaces/db/events";
    let cases: Vec<(&str, &str, String, Value)> = vec![
        ("old-style event", "POST", ev.into(), old_style),
        (
            "event with eventTime, no action/instance",
            "POST",
            ev.into(),
            no_action,
        ),
        (
            "event with eventTime and action",
            "POST",
            ev.into(),
            with_action,
        ),
        ("event namespace mismatch", "POST", ev.into(), mismatch),
        (
            "GET missing pod",
            "GET",
            "/api/v1/namespaces/db/pods/nope".into(),
            Value::Null,
        ),
        (
            "GET missing NAD",
            "GET",
            "/apis/k8s.cni.cncf.io/v1/namespaces/db/network-attachment-definitions/nope".into(),
            Value::Null,
        ),
        (
            "PATCH status, missing pod",
            "PATCH",
            "/api/v1/namespaces/db/pods/nope/status".into(),
            status_patch("u"),
        ),
        (
            "PATCH status, stale UID",
            "PATCH",
            "/api/v1/namespaces/db/pods/fid/status".into(),
            status_patch("0b0e0000-0000-4000-8000-00000000dead"),
        ),
    ];
    // What plexus sends, as identities that may not.
    let denied: Vec<(&str, &str, String, Value)> = vec![
        (
            "GET pod",
            "GET",
            "/api/v1/namespaces/db/pods/fid".into(),
            Value::Null,
        ),
        (
            "GET NAD",
            "GET",
            "/apis/k8s.cni.cncf.io/v1/namespaces/db/network-attachment-definitions/x".into(),
            Value::Null,
        ),
        (
            "PATCH status",
            "PATCH",
            "/api/v1/namespaces/db/pods/fid/status".into(),
            status_patch("u"),
        ),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut diffs = Vec::new();
    rt.block_on(async {
        let admin = (
            kube_client(&node.cp.admin_kubeconfig()).await?,
            kube_client(&fake_kc).await?,
        );
        let nobody = (
            kube_client(&real_nobody).await?,
            kube_client(&fake_nobody).await?,
        );
        let bad = (kube_client(&real_bad).await?, kube_client(&fake_bad).await?);
        let runs = cases
            .iter()
            .map(|c| ("admin", &admin, c))
            .chain(denied.iter().map(|c| ("no rights", &nobody, c)))
            .chain(denied.iter().map(|c| ("bad token", &bad, c)));
        for (who, (real, fake), (what, method, path, body)) in runs {
            let what = format!("{who}: {what}");
            let r = answer(real, method, path, body).await;
            let f = answer(fake, method, path, body).await;
            // Only the pods' UIDs differ between the two servers.
            let f = (f.0, f.1, f.2.replace(fake_uid, &real_uid));
            println!("    {what}: real {} {} {:?}", r.0, r.1, r.2);
            if r != f {
                diffs.push(format!(
                    "{what}:\n      real     {r:?}\n      stand-in {f:?}"
                ));
            }
        }
        anyhow::Ok(())
    })?;
    ensure!(
        diffs.is_empty(),
        "the stand-in disagrees:\n{}",
        diffs.join("\n")
    );
    Ok(())
}
