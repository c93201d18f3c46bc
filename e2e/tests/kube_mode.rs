//! plexus driven by pods and NADs in the test API server (real HTTP, real kube client), with
//! the Debian plugins in real network namespaces.

mod common;

use common::*;
use plexus_e2e::{nad_policy_allowing, Access, TestApiServer, TestApiServerOptions};
use serde_json::{json, Value};
use std::path::PathBuf;

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// A node: API server, plexus state dirs, a default bridge network and a macvlan master.
struct Node {
    api: TestApiServer,
    dir: tempfile::TempDir,
    bridge: HostLink,
    master: HostLink,
    octet: u8,
    extra: Value,
}

impl Node {
    fn new(octet: u8) -> Node {
        Node::with(octet, TestApiServerOptions::default())
    }

    fn with(octet: u8, opts: TestApiServerOptions) -> Node {
        let api = TestApiServer::start(opts).unwrap();
        api.add_token("node-token", Access::Full);
        let dir = tempfile::tempdir().unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"), "node-token")
            .unwrap();
        for ns in ["default", "db", "other", "kube-system"] {
            api.put_namespace(ns).unwrap();
        }
        Node {
            api,
            dir,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
            octet,
            extra: json!({}),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn config(&self) -> Value {
        let mut c = json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus",
            "kubeconfig": self.path("kubeconfig"), "cniDir": self.path("state"), "binDir": CNI_BIN,
            "confDir": self.path("confdir"), "logLevel":"debug", "logFile": self.path("plexus.log"), "logToStderr": false,
            "delegates":[flannel_like(&self.bridge.0, self.octet, &self.path("ipam"))],
            "nadPolicy": nad_policy_allowing(&[self.dir.path()])});
        for (k, v) in self.extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }

    fn macvlan_nad(&self, ns: &str, name: &str, ipam: Value) {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":self.master.0,"mode":"bridge","ipam":ipam});
        self.api.put_nad(ns, name, &cfg.to_string(), &[]).unwrap();
    }

    fn host_local(&self, subnet: &str) -> Value {
        json!({"type":"host-local","dataDir":self.path("ipam"),"ranges":[[{"subnet":subnet}]]})
    }

    fn pod(&self, ns: &str, name: &str, annotations: Value) -> String {
        let uid = format!("uid-{name}");
        self.api
            .put_pod(json!({"metadata":{"name":name,"namespace":ns,"uid":uid,"annotations":annotations},"spec":{"containers":[{"name":"c","image":"x"}]}}))
            .unwrap();
        uid
    }

    fn args(ns: &str, name: &str, uid: &str) -> String {
        format!("K8S_POD_INFRA_CONTAINER_ID=cid-{name};K8S_POD_UID={uid};IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}")
    }

    fn call(&self, command: &str, cid: &str, netns: &str, args: &str) -> Run {
        self.call_with(&bin("plexus"), command, cid, netns, args)
    }

    fn call_with(
        &self,
        binary: &std::path::Path,
        command: &str,
        cid: &str,
        netns: &str,
        args: &str,
    ) -> Run {
        run(
            binary,
            &Call {
                command,
                container_id: cid,
                netns,
                ifname: "eth0",
                args,
            },
            &self.config(),
            &[],
        )
    }

    fn status(&self, ns: &str, name: &str) -> Value {
        let pod = self.api.get_pod(ns, name).unwrap();
        let s = pod["metadata"]["annotations"][STATUS]
            .as_str()
            .unwrap_or("[]")
            .to_string();
        serde_json::from_str(&s).unwrap()
    }

    fn leftovers(&self) -> Vec<String> {
        let mut v = files_under(&self.path("state"));
        v.extend(files_under(&self.path("ipam")));
        v
    }
}

/// The `name` of every network-status entry, in order.
fn status_names(st: &Value) -> Vec<&str> {
    st.as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect()
}

#[test]
fn three_extra_networks_both_forms_status_events_and_request_budget() {
    let node = Node::new(31);
    node.macvlan_nad("db", "mv-a", node.host_local("10.131.1.0/24"));
    node.macvlan_nad("db", "mv-b", node.host_local("10.131.2.0/24"));
    node.macvlan_nad("default", "mv-c", node.host_local("10.131.3.0/24"));
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
        let uid = node.pod("db", &pod, json!({NETWORKS: value}));
        node.api.clear_requests();
        let args = Node::args("db", &pod, &uid);
        let out = node
            .call("ADD", &format!("cid-{form}"), &ns.path(), &args)
            .ok()
            .clone();
        // The kubelet gets the default network's result.
        assert_eq!(out["cniVersion"], "1.0.0");
        assert!(
            out["ips"][0]["address"]
                .as_str()
                .unwrap()
                .starts_with("10.244.31."),
            "{out}"
        );
        let mut links = ns.links();
        links.sort();
        assert_eq!(links, vec!["data0", "eth0", "lo", "net1", "net3"], "{form}");
        assert!(ns.addrs("net1")[0].starts_with("10.131.1."));
        assert!(ns.addrs("data0")[0].starts_with("10.131.2."));
        assert!(ns.addrs("net3")[0].starts_with("10.131.3."));
        // network-status: default first, names ns/nad, IPs without prefix, no "<nil>".
        let st = node.status("db", &pod);
        let names = status_names(&st);
        assert_eq!(names, vec!["cbr0", "db/mv-a", "db/mv-b", "default/mv-c"]);
        assert_eq!(st[0]["default"], true);
        assert_eq!(st[0]["interface"], "eth0");
        assert_eq!(st[0]["gateway"], json!([format!("10.244.31.1")]));
        assert_eq!(st[2]["interface"], "data0");
        assert!(!st[1]["ips"][0].as_str().unwrap().contains('/'));
        assert_eq!(st[1]["mac"].as_str().unwrap(), ns.mac("net1"));
        // One summary event.
        let events = node.api.events("db");
        let ours: Vec<&Value> = events
            .iter()
            .filter(|e| e["involvedObject"]["name"] == pod.as_str())
            .collect();
        assert_eq!(ours.len(), 1, "{events:?}");
        assert_eq!(ours[0]["reason"], "AddedInterface");
        assert!(ours[0]["message"].as_str().unwrap().contains("data0"));
        // Request budget: GET pod + 3 NADs + PATCH status + event = N + 3.
        let reqs = without_claims_probe(node.api.requests());
        assert_eq!(reqs.len(), 3 + 3, "{reqs:#?}");
        assert_eq!(
            node.api
                .count_requests("PATCH", &format!("/api/v1/namespaces/db/pods/{pod}/status")),
            1
        );
        // CHECK passes; DEL makes no API request and leaves nothing.
        node.call("CHECK", &format!("cid-{form}"), &ns.path(), &args)
            .ok();
        node.api.clear_requests();
        node.call("DEL", &format!("cid-{form}"), &ns.path(), &args)
            .ok();
        assert_eq!(node.api.requests().len(), 0, "DEL must not call the API");
        assert_eq!(ns.links(), vec!["lo"]);
        assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    }
}

#[test]
fn pod_without_networks_gets_default_only_and_status() {
    let node = Node::new(32);
    let ns = Netns::new();
    let uid = node.pod("db", "solo", json!({}));
    node.api.clear_requests();
    node.call(
        "ADD",
        "cid-solo",
        &ns.path(),
        &Node::args("db", "solo", &uid),
    )
    .ok();
    assert_eq!(ns.links().len(), 2);
    assert_eq!(node.status("db", "solo").as_array().unwrap().len(), 1);
    assert_eq!(node.api.requests().len(), 3, "GET pod, PATCH status, event");
    node.call(
        "DEL",
        "cid-solo",
        &ns.path(),
        &Node::args("db", "solo", &uid),
    )
    .ok();
    assert!(node.leftovers().is_empty());
}

#[test]
fn static_ip_mac_through_static_ipam_and_tuning_and_default_route() {
    let node = Node::new(33);
    let cfg = json!({"cniVersion":"1.0.0","name":"tuned","plugins":[
        {"type":"macvlan","master":node.master.0,"mode":"bridge","ipam":{"type":"static","routes":[{"dst":"10.99.0.0/16","gw":"10.133.0.1"}]}},
        {"type":"tuning","capabilities":{"mac":true}}]});
    node.api
        .put_nad("db", "fixed", &cfg.to_string(), &[])
        .unwrap();
    let ns = Netns::new();
    let ann = json!(
        r#"[{"name":"fixed","ips":["10.133.0.50/24"],"mac":"02:ab:cd:00:00:50","default-route":["10.133.0.1"]}]"#
    );
    let uid = node.pod("db", "bank", json!({NETWORKS: ann}));
    let args = Node::args("db", "bank", &uid);
    node.call("ADD", "cid-bank", &ns.path(), &args).ok();
    assert_eq!(ns.addrs("net1"), vec!["10.133.0.50/24"]);
    assert_eq!(ns.mac("net1"), "02:ab:cd:00:00:50");
    let routes = ns.routes();
    assert!(
        routes.contains("default via 10.133.0.1 dev net1"),
        "{routes}"
    );
    assert!(
        !routes.contains("default via 10.244.33.1"),
        "eth0 lost its default route: {routes}"
    );
    let st = node.status("db", "bank");
    assert_eq!(st[1]["ips"], json!(["10.133.0.50"]));
    assert_eq!(st[1]["mac"], "02:ab:cd:00:00:50");
    node.call("CHECK", "cid-bank", &ns.path(), &args).ok();
    node.call("DEL", "cid-bank", &ns.path(), &args).ok();
    assert_eq!(ns.links(), vec!["lo"]);
}

#[test]
fn default_network_override_from_annotation() {
    let node = Node::new(34);
    node.macvlan_nad(
        "kube-system",
        "alt-default",
        node.host_local("10.134.0.0/24"),
    );
    let ns = Netns::new();
    let uid = node.pod(
        "db",
        "alt",
        json!({"v1.multus-cni.io/default-network": "alt-default"}),
    );
    let out = node
        .call("ADD", "cid-alt", &ns.path(), &Node::args("db", "alt", &uid))
        .ok()
        .clone();
    assert!(out["ips"][0]["address"]
        .as_str()
        .unwrap()
        .starts_with("10.134.0."));
    assert!(ns.addrs("eth0")[0].starts_with("10.134.0."));
    assert_eq!(
        node.status("db", "alt")[0]["name"],
        "kube-system/alt-default"
    );
    node.call("DEL", "cid-alt", &ns.path(), &Node::args("db", "alt", &uid))
        .ok();
    assert!(node.leftovers().is_empty());
}

#[test]
fn user_errors_are_cni_errors_naming_pod_and_network_and_leave_nothing() {
    let mut node = Node::new(35);
    node.extra = json!({"namespaceIsolation": true});
    node.macvlan_nad("other", "foreign", node.host_local("10.135.1.0/24"));
    node.macvlan_nad("db", "ok-net", node.host_local("10.135.2.0/24"));
    // A NAD that fails mid-chain: macvlan + host-local succeed (link, lease), then tuning fails.
    let broken = json!({"cniVersion":"1.0.0","name":"broken","plugins":[
        {"type":"macvlan","master":node.master.0,"mode":"bridge","ipam":node.host_local("10.135.3.0/24")},
        {"type":"tuning","sysctl":{"net.ipv4.conf.no-such-knob":"1"}}]});
    node.api
        .put_nad("db", "broken", &broken.to_string(), &[])
        .unwrap();
    let cases = [
        ("iso", json!("other/foreign"), 7, "isolation"),
        ("badann", json!("[{\"name\":"), 7, NETWORKS),
        ("missing", json!("db/nope"), 7, "db/nope"),
        ("midway", json!("ok-net,broken"), 999, "db/broken"),
        ("dupif", json!("ok-net@eth0"), 7, "eth0"),
    ];
    for (name, ann, code, needle) in cases {
        let ns = Netns::new();
        let uid = node.pod("db", name, json!({NETWORKS: ann}));
        let r = node.call(
            "ADD",
            &format!("cid-{name}"),
            &ns.path(),
            &Node::args("db", name, &uid),
        );
        let e = r.err();
        assert_eq!(e["code"], code, "{name}: {e}");
        let msg = e["msg"].as_str().unwrap();
        assert!(
            msg.contains(&format!("pod db/{name}"))
                && (msg.contains(needle) || e["details"].as_str().unwrap_or("").contains(needle)),
            "{name}: {e}"
        );
        assert_eq!(ns.links(), vec!["lo"], "{name}: rollback left links: {e}");
        eprintln!("{name}: {e}");
        assert!(
            node.leftovers().is_empty(),
            "{name}: {:?}",
            node.leftovers()
        );
        // The runtime's DEL after a failed ADD succeeds.
        node.call(
            "DEL",
            &format!("cid-{name}"),
            "",
            &Node::args("db", name, &uid),
        )
        .ok();
    }
    let warn = node
        .api
        .events("db")
        .into_iter()
        .filter(|e| e["type"] == "Warning")
        .count();
    assert!(warn >= 1, "a failure event is posted");
}

#[test]
fn del_survives_every_fault() {
    let node = Node::new(37);
    node.macvlan_nad("db", "mv", node.host_local("10.137.0.0/24"));
    for fault in [
        "api-down",
        "pod-gone",
        "nad-gone",
        "netns-gone",
        "cache-missing",
        "plan-lost-api-down",
        "plan-corrupt-pod-gone",
        "empty-netns-first",
        "state-read-only",
    ] {
        let ns = Netns::new();
        let pod = format!("f-{fault}");
        let uid = node.pod("db", &pod, json!({NETWORKS: "mv"}));
        let args = Node::args("db", &pod, &uid);
        let cid = format!("cid-{fault}");
        node.call("ADD", &cid, &ns.path(), &args).ok();
        let mut netns = ns.path();
        match fault {
            "api-down" => node.api.down(),
            "pod-gone" => assert!(node.api.delete_pod("db", &pod)),
            "nad-gone" => assert!(node.api.delete_nad("db", "mv")),
            "netns-gone" => {
                ns.delete();
                netns = String::new();
            }
            "cache-missing" => std::fs::remove_dir_all(node.path("state/plans")).unwrap(),
            // Without a plan and without the API, only the result cache knows about net1.
            "plan-lost-api-down" => {
                std::fs::remove_dir_all(node.path("state/plans")).unwrap();
                node.api.down();
            }
            "plan-corrupt-pod-gone" => {
                std::fs::write(
                    node.path(&format!("state/plans/{cid}-eth0.json")),
                    b"{trunc",
                )
                .unwrap();
                assert!(node.api.delete_pod("db", &pod));
            }
            "empty-netns-first" => {
                node.call("DEL", &cid, "", &args).ok();
                assert_eq!(ns.links(), vec!["lo"], "{fault}");
            }
            "state-read-only" => {
                let ro = with_read_only_dir(node.dir.path(), &bin("plexus"), &node.path("state"));
                let e = node
                    .call_with(&ro, "DEL", &cid, &netns, &args)
                    .err()
                    .clone();
                assert_eq!(e["code"], 5, "{fault}: {e}");
                assert!(e["msg"].as_str().unwrap().contains(&pod), "{fault}: {e}");
                assert_eq!(ns.links(), vec!["lo"], "{fault}: cleanup ran");
            }
            _ => unreachable!(),
        }
        node.call("DEL", &cid, &netns, &args).ok();
        // The runtime repeats DEL, with an empty netns.
        node.call("DEL", &cid, "", &args).ok();
        node.call("DEL", &cid, "", &args).ok();
        let left: Vec<String> = node
            .leftovers()
            .into_iter()
            .filter(|f| !f.starts_with("locks"))
            .collect();
        assert!(left.is_empty(), "{fault}: leftovers {left:?}");
        if fault != "netns-gone" {
            assert_eq!(ns.links(), vec!["lo"], "{fault}");
        }
        if fault == "api-down" || fault == "plan-lost-api-down" {
            node.api.up().unwrap();
        }
        if fault == "plan-corrupt-pod-gone" {
            node.pod("db", &pod, json!({NETWORKS: "mv"}));
        }
        if fault == "nad-gone" {
            node.macvlan_nad("db", "mv", node.host_local("10.137.0.0/24"));
        }
    }
}

#[test]
fn gc_removes_attachments_no_longer_valid() {
    let node = Node::new(38);
    node.macvlan_nad("db", "mv", node.host_local("10.138.0.0/24"));
    let ns1 = Netns::new();
    let ns2 = Netns::new();
    let u1 = node.pod("db", "keep", json!({NETWORKS: "mv"}));
    let u2 = node.pod("db", "stale", json!({NETWORKS: "mv"}));
    node.call(
        "ADD",
        "cid-keep",
        &ns1.path(),
        &Node::args("db", "keep", &u1),
    )
    .ok();
    node.call(
        "ADD",
        "cid-stale",
        &ns2.path(),
        &Node::args("db", "stale", &u2),
    )
    .ok();
    // A pod attached before plexus was installed: bridge directly, same default network.
    let ns3 = Netns::new();
    let flannel = flannel_like(&node.bridge.0, 38, &node.path("ipam"));
    let direct = json!({"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":node.bridge.0,"isGateway":true,
        "ipam":flannel["plugins"][0]["ipam"].clone()});
    let bridge = std::path::Path::new(CNI_BIN).join("bridge");
    let old = |command| Call {
        command,
        container_id: "cid-old",
        netns: "",
        ifname: "eth0",
        args: "",
    };
    let ns3p = ns3.path();
    run(
        &bridge,
        &Call {
            netns: &ns3p,
            ..old("ADD")
        },
        &direct,
        &[],
    )
    .ok();
    let mut cfg = node.config();
    cfg["cni.dev/valid-attachments"] = json!([{"containerID":"cid-keep","ifname":"eth0"},{"containerID":"cid-old","ifname":"eth0"}]);
    let r = run(
        &bin("plexus"),
        &Call {
            command: "GC",
            container_id: "",
            netns: "",
            ifname: "",
            args: "",
        },
        &cfg,
        &[],
    );
    r.ok();
    let plans = files_under(&node.path("state/plans"));
    assert_eq!(plans, vec!["cid-keep-eth0.json"]);
    let leases = files_under(&node.path("ipam"));
    assert_eq!(
        leases.len(),
        3,
        "keep's two leases and the pre-plexus pod's: {leases:?}"
    );
    node.call(
        "DEL",
        "cid-keep",
        &ns1.path(),
        &Node::args("db", "keep", &u1),
    )
    .ok();
    run(
        &bridge,
        &Call {
            netns: &ns3p,
            ..old("DEL")
        },
        &direct,
        &[],
    )
    .ok();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

#[test]
fn https_api_server_log_file_and_clean_stdout() {
    let node = Node::with(
        39,
        TestApiServerOptions {
            tls: true,
            ..TestApiServerOptions::default()
        },
    );
    assert!(node.api.url().starts_with("https://"));
    node.macvlan_nad("db", "mv", node.host_local("10.139.0.0/24"));
    let ns = Netns::new();
    let uid = node.pod("db", "tls", json!({NETWORKS: "mv"}));
    let args = Node::args("db", "tls", &uid);
    let r = node.call("ADD", "cid-tls", &ns.path(), &args);
    r.ok();
    assert!(
        r.stderr.is_empty(),
        "logToStderr=false keeps stderr quiet: {}",
        r.stderr
    );
    assert_eq!(node.status("db", "tls").as_array().unwrap().len(), 2);
    // The log file is private and carries no token.
    let log = node.path("plexus.log");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&log).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("ADD done") && !text.contains("node-token"),
        "{text}"
    );
    // The kubeconfig and the state files are private too.
    for f in files_under(&node.path("state")) {
        let m = std::fs::metadata(node.path("state").join(&f))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&m) & 0o077,
            0,
            "{f}"
        );
    }
    node.call("DEL", "cid-tls", &ns.path(), &args).ok();
}

#[test]
fn explain_prints_the_plan_or_the_add_error() {
    let node = Node::new(40);
    let dir = node.path("explain");
    std::fs::create_dir_all(&dir).unwrap();
    let pod =
        json!({"metadata":{"name":"pg","namespace":"db","annotations":{NETWORKS: "mv@data0"}}});
    let nads = json!({"kind":"List","items":[{"metadata":{"name":"mv","namespace":"db"},
        "spec":{"config":json!({"cniVersion":"1.0.0","type":"macvlan","master":node.master.0}).to_string()}}]});
    std::fs::write(dir.join("pod.json"), pod.to_string()).unwrap();
    std::fs::write(dir.join("nads.json"), nads.to_string()).unwrap();
    std::fs::write(dir.join("plexus.conf"), node.config().to_string()).unwrap();
    let run_explain = |extra: &[&str]| {
        let mut a = vec!["explain", "--config", "plexus.conf", "--pod", "pod.json"];
        a.extend_from_slice(extra);
        std::process::Command::new(bin("plexus"))
            .args(&a)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let out = run_explain(&["--nad", "nads.json"]);
    assert!(out.status.success());
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["attachments"][1]["interface"], "data0");
    assert_eq!(
        plan["attachments"][1]["delegates"][0]["master"],
        node.master.0.as_str()
    );
    let out = run_explain(&[]);
    assert_eq!(out.status.code(), Some(1));
    let err: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["code"], 7);
    assert!(err["msg"].as_str().unwrap().contains("db/mv"));
    assert!(node.api.requests().is_empty(), "explain is offline");
}

#[test]
fn pod_recreated_with_another_uid_is_refused() {
    let node = Node::new(42);
    let ns = Netns::new();
    node.pod("db", "sts-0", json!({}));
    let r = node.call(
        "ADD",
        "cid-sts",
        &ns.path(),
        &Node::args("db", "sts-0", "uid-of-the-old-pod"),
    );
    let e = r.err();
    let text = e.to_string();
    assert!(
        text.contains("db/sts-0") && text.contains("uid-of-the-old-pod"),
        "{e}"
    );
    assert_eq!(ns.links(), vec!["lo"]);
    assert!(node.leftovers().is_empty());
    let pod = node.api.get_pod("db", "sts-0").unwrap();
    assert!(
        pod["metadata"]["annotations"].get(STATUS).is_none(),
        "no status on the new pod"
    );
}

#[test]
fn multus_style_cluster_network_and_default_networks() {
    let mut node = Node::new(43);
    // The primary CNI config on disk, as the installer points clusterNetwork at it.
    let primary = node.path("10-flannel.conflist");
    let mut flannel = flannel_like(&node.bridge.0, 43, &node.path("ipam"));
    flannel["name"] = json!("cbr0");
    std::fs::write(&primary, flannel.to_string()).unwrap();
    node.macvlan_nad(
        "kube-system",
        "monitoring",
        node.host_local("10.143.9.0/24"),
    );
    node.macvlan_nad("db", "mv", node.host_local("10.143.1.0/24"));
    node.extra = json!({"clusterNetwork": primary, "defaultNetworks": ["monitoring"], "delegates": [], "events": false});
    let ns = Netns::new();
    let uid = node.pod("db", "m", json!({NETWORKS: "mv"}));
    node.api.clear_requests();
    node.call("ADD", "cid-m", &ns.path(), &Node::args("db", "m", &uid))
        .ok();
    let st = node.status("db", "m");
    let names = status_names(&st);
    assert_eq!(names, vec!["cbr0", "kube-system/monitoring", "db/mv"]);
    assert_eq!(st[1]["interface"], "net1");
    assert_eq!(st[2]["interface"], "net2");
    // events: false → GET pod, 2 NADs, PATCH status, and no event.
    let reqs = without_claims_probe(node.api.requests());
    assert_eq!(reqs.len(), 4, "{reqs:#?}");
    assert!(node.api.events("db").is_empty());
    node.call("DEL", "cid-m", &ns.path(), &Node::args("db", "m", &uid))
        .ok();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    // Pods in systemNamespaces do not get defaultNetworks.
    let ns2 = Netns::new();
    node.api.put_namespace("kube-system").unwrap();
    let uid = node.pod("kube-system", "coredns", json!({}));
    node.call(
        "ADD",
        "cid-dns",
        &ns2.path(),
        &Node::args("kube-system", "coredns", &uid),
    )
    .ok();
    let mut links = ns2.links();
    links.sort();
    assert_eq!(links, vec!["eth0", "lo"]);
    node.call(
        "DEL",
        "cid-dns",
        &ns2.path(),
        &Node::args("kube-system", "coredns", &uid),
    )
    .ok();
}

#[test]
fn pod_annotations_from_the_runtime_save_the_pod_get() {
    let mut node = Node::new(44);
    node.macvlan_nad("db", "mv", node.host_local("10.144.0.0/24"));
    let uid = node.pod("db", "rt", json!({NETWORKS: "mv"}));
    // What containerd passes when plexus declares the capability: the pod's annotations.
    node.extra = json!({"capabilities": {"io.kubernetes.cri.pod-annotations": true},
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {NETWORKS: "mv", "other": "x"}}});
    let ns = Netns::new();
    node.api.clear_requests();
    node.call("ADD", "cid-rt", &ns.path(), &Node::args("db", "rt", &uid))
        .ok();
    assert!(ns.links().contains(&"net1".to_string()));
    assert_eq!(
        node.api
            .count_requests("GET", "/api/v1/namespaces/db/pods/rt"),
        0,
        "no GET pod"
    );
    assert_eq!(
        without_claims_probe(node.api.requests()).len(),
        1 + 2,
        "NAD GET, status PATCH, event: N+2"
    );
    assert_eq!(node.status("db", "rt").as_array().unwrap().len(), 2);
    node.call("DEL", "cid-rt", &ns.path(), &Node::args("db", "rt", &uid))
        .ok();
    assert!(node.leftovers().is_empty());
}

#[test]
fn pod_names_that_address_another_object_are_refused() {
    let node = Node::new(44);
    node.pod("db", "victim", json!({}));
    for (ns, name) in [
        ("db", "../../namespaces/kube-system/pods/victim"),
        ("db", "victim?dryRun=All"),
        ("db", "victim/status"),
        ("db/pods/victim", "x"),
        ("DB", "victim"),
    ] {
        let netns = Netns::new();
        node.api.clear_requests();
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}");
        let r = node.call("ADD", "cid-bad-name", &netns.path(), &args);
        let e = r.err();
        assert_eq!(e["code"], 4, "{ns}/{name}: {e}");
        assert!(
            e["msg"]
                .as_str()
                .unwrap()
                .contains("is not a Kubernetes name"),
            "{e}"
        );
        assert!(
            node.api.requests().is_empty(),
            "{ns}/{name}: {:?}",
            node.api.requests()
        );
        assert_eq!(netns.links(), vec!["lo"]);
        node.call("DEL", "cid-bad-name", &netns.path(), &args).ok();
        assert!(node.leftovers().iter().all(|f| !f.starts_with("plans")));
    }
}

/// A 404 for a path the API server does not serve (a kubeconfig `server` with a wrong path
/// prefix) is an error, not "the pod was deleted" (which gave the pod its default network only).
#[test]
fn a_404_for_a_wrong_server_path_fails_the_add() {
    let node = Node::new(45);
    let uid = node.pod("db", "wrongpath", json!({NETWORKS: "mv"}));
    let kc = node
        .api
        .kubeconfig_yaml("node-token")
        .replace(&node.api.url(), &format!("{}/not-the-api", node.api.url()));
    std::fs::write(node.path("kubeconfig"), kc).unwrap();
    let netns = Netns::new();
    let args = Node::args("db", "wrongpath", &uid);
    let r = node.call("ADD", "cid-wrongpath", &netns.path(), &args);
    let e = r.err();
    assert_eq!(e["code"], 102, "{e}");
    assert!(e["details"].as_str().unwrap().contains("HTTP 404"), "{e}");
    assert_eq!(netns.links(), vec!["lo"], "nothing ran");
    node.call("DEL", "cid-wrongpath", &netns.path(), &args).ok();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

/// A DEL without its plan while the API server is down asks it once and does not wait out the
/// ADD's retry budget (it took 2.3 s over 10 requests); the cached results still clean up.
#[test]
fn del_without_a_plan_does_not_wait_for_a_down_api() {
    let node = Node::new(46);
    node.macvlan_nad("db", "mv", node.host_local("10.146.0.0/24"));
    let uid = node.pod("db", "quickdel", json!({NETWORKS: "mv"}));
    let netns = Netns::new();
    let args = Node::args("db", "quickdel", &uid);
    node.call("ADD", "cid-quickdel", &netns.path(), &args).ok();
    std::fs::remove_dir_all(node.path("state/plans")).unwrap();
    node.api.down();
    let started = std::time::Instant::now();
    node.call("DEL", "cid-quickdel", &netns.path(), &args).ok();
    let took = started.elapsed();
    node.api.up().unwrap();
    assert!(took < std::time::Duration::from_millis(1500), "{took:?}");
    assert_eq!(netns.links(), vec!["lo"]);
    let left: Vec<String> = node
        .leftovers()
        .into_iter()
        .filter(|f| !f.starts_with("locks"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A plexus killed in the middle of an ADD (SIGKILL, as containerd does when its CNI call times
/// out) takes its delegate down with it, and the runtime's DEL kills what that delegate had
/// started (here: an "IPAM" child that would record a lease 1.5 s later) before deleting:
/// nothing is left, even from a slow plugin.
#[test]
fn sigkill_mid_add_then_del_leaves_nothing() {
    sigkill_mid_add_then_del(47, "(sleep 1.5; echo lease > $d/lease-$CNI_CONTAINERID) &");
}

/// The same, when what the killed ADD set going is out of any DEL's reach and lands after the
/// runtime's DEL (an API server carrying out an IPAM plugin's last request, its client gone):
/// here a process without the CNI environment records the lease 1 s later. The DEL after an
/// interrupted ADD deletes once more after settling: nothing is left.
#[test]
fn sigkill_mid_add_a_late_write_is_deleted_by_the_second_del() {
    sigkill_mid_add_then_del(
        48,
        "setsid env -i /bin/sh -c \"sleep 1; echo lease > $d/lease-$CNI_CONTAINERID\" &\n  \
         sleep 30 &",
    );
}

/// Kill plexus while its delegate's ADD runs `ipam` (shell, `$d` the lease dir; the last
/// background job's pid is recorded as the IPAM's), then the runtime's DEL; no lease is left.
fn sigkill_mid_add_then_del(octet: u8, ipam: &str) {
    use std::io::Write as _;
    let node = Node::new(octet);
    let plugins = node.path("slowbin");
    let leases = node.path("slowleases");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&leases).unwrap();
    let plugin = plugins.join("slowplug");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nd={}\ncase \"$CNI_COMMAND\" in\n\
             ADD) cat >/dev/null; echo $$ > $d/plugin.pid\n  \
             {ipam}\n  \
             echo $! > $d/ipam.pid; wait; echo '{{\"cniVersion\":\"1.0.0\"}}' ;;\n\
             DEL) rm -f $d/lease-$CNI_CONTAINERID ;;\n\
             VERSION) echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\"]}}' ;;\n\
             esac\n",
            leases.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let uid = node.pod("db", "killed", json!({}));
    let args = Node::args("db", "killed", &uid);
    let netns = Netns::new();
    let mut config = node.config();
    config["binDir"] = json!(plugins);
    config["delegates"] = json!([{"cniVersion":"1.0.0","name":"slow","type":"slowplug"}]);
    let mut add = std::process::Command::new(bin("plexus"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "cid-killed")
        .env("CNI_NETNS", netns.path())
        .env("CNI_IFNAME", "eth0")
        .env("CNI_ARGS", &args)
        .env("CNI_PATH", CNI_BIN)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    add.stdin
        .take()
        .unwrap()
        .write_all(config.to_string().as_bytes())
        .unwrap();
    let pid_of = |f: &str| -> Option<i32> {
        std::fs::read_to_string(leases.join(f))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while pid_of("ipam.pid").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the delegate never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    add.kill().unwrap();
    add.wait().unwrap();
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    // The delegate dies with plexus (before any DEL could kill it).
    let plugin_pid = pid_of("plugin.pid").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while alive(plugin_pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let delegate_survived = alive(plugin_pid);
    // The runtime's DEL, with the same config.
    let del = run(
        &bin("plexus"),
        &Call {
            command: "DEL",
            container_id: "cid-killed",
            netns: &netns.path(),
            ifname: "eth0",
            args: &args,
        },
        &config,
        &[],
    );
    del.ok();
    // Past the moment the orphan would have recorded its lease.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let ipam_pid = pid_of("ipam.pid").unwrap();
    let leaked: Vec<String> = files_under(&leases)
        .into_iter()
        .filter(|f| f.starts_with("lease-"))
        .collect();
    for pid in [plugin_pid, ipam_pid] {
        if alive(pid) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
    assert!(!delegate_survived, "the delegate outlived plexus");
    assert!(leaked.is_empty(), "leaked after DEL: {leaked:?}");
    let left: Vec<String> = files_under(&node.path("state"))
        .into_iter()
        .filter(|f| !f.starts_with("locks"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The requests without the node's one AddressClaim probe: a macvlan NAD with host-local spans
/// nodes, so plexus would claim the address host-local gave (a duplicate on another node is
/// warned of) and first asks whether it may (a SelfSubjectAccessReview); this stand-in does not
/// serve that, so the node's first such ADD gets a 404 and its calls do not ask again for a
/// minute (`<cniDir>/locks/claims-off`). At most one probe, answered 404.
fn without_claims_probe(
    reqs: Vec<plexus_e2e::apiserver::RequestRecord>,
) -> Vec<plexus_e2e::apiserver::RequestRecord> {
    let (probes, rest): (Vec<_>, Vec<_>) = reqs.into_iter().partition(|r| {
        r.path.contains("/addressclaims") || r.path.contains("/selfsubjectaccessreviews")
    });
    assert!(
        probes.len() <= 1 && probes.iter().all(|p| p.method == "POST" && p.status == 404),
        "{probes:#?}"
    );
    rest
}
