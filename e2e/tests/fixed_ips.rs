//! Fixed addresses for StatefulSet replicas (NAD annotation `plexus.cni.io/fixed-ips`), with
//! plexus driven by pods and NADs in the test API server and macvlan + static IPAM in real
//! network namespaces: each replica gets its ordinal's address, an unmapped ordinal and a
//! held address are refused with an event, the owner is read when the runtime passed the
//! annotations, and `plexus explain` shows a replica's address from a StatefulSet manifest.

mod common;

use common::*;
use plexus_e2e::{nad_policy_allowing, Access, TestApiServer, TestApiServerOptions};
use serde_json::{json, Value};
use std::path::PathBuf;

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
const MAPPING: &str = "plexus.cni.io/fixed-ips";

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
        let api = TestApiServer::start(TestApiServerOptions::default()).unwrap();
        api.add_token("node-token", Access::Full);
        let dir = tempfile::tempdir().unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"), "node-token")
            .unwrap();
        api.put_namespace("db").unwrap();
        let node = Node {
            api,
            dir,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
            octet,
            extra: json!({}),
        };
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":node.master.0,"mode":"bridge",
            "ipam":{"type":"static"}});
        let mapping = format!(r#"{{"mysql":["10.1{octet}.0.10/24","10.1{octet}.0.11/24"]}}"#);
        node.api
            .put_nad("db", "data", &cfg.to_string(), &[(MAPPING, &mapping)])
            .unwrap();
        node
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn addr(&self, ord: u8) -> String {
        format!("10.1{}.0.1{ord}", self.octet)
    }

    fn config(&self) -> Value {
        let mut c = json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus",
            "kubeconfig": self.path("kubeconfig"), "cniDir": self.path("state"), "binDir": CNI_BIN,
            "logLevel":"debug", "logFile": self.path("plexus.log"), "logToStderr": false,
            "delegates":[flannel_like(&self.bridge.0, self.octet, &self.path("ipam"))],
            "nadPolicy": nad_policy_allowing(&[self.dir.path()])});
        for (k, v) in self.extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }

    /// A pod; `set`: the StatefulSet owning it.
    fn pod(&self, name: &str, set: Option<&str>, networks: Value) -> String {
        let uid = format!("uid-{name}");
        let mut meta =
            json!({"name":name,"namespace":"db","uid":uid,"annotations":{NETWORKS: networks}});
        if let Some(s) = set {
            meta["ownerReferences"] = json!([{"apiVersion":"apps/v1","kind":"StatefulSet",
                "name":s,"uid":"uid-set","controller":true}]);
        }
        self.api
            .put_pod(json!({"metadata":meta,"spec":{"containers":[{"name":"c","image":"x"}]}}))
            .unwrap();
        uid
    }

    fn call(&self, command: &str, name: &str, netns: &Netns) -> Run {
        let args = format!(
            "K8S_POD_INFRA_CONTAINER_ID=cid-{name};K8S_POD_UID=uid-{name};IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={name}"
        );
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: &format!("cid-{name}"),
                netns: &netns.path(),
                ifname: "eth0",
                args: &args,
            },
            &self.config(),
            &[],
        )
    }

    fn events_of(&self, name: &str) -> Vec<Value> {
        self.api
            .events("db")
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == name)
            .collect()
    }

    fn leftovers(&self) -> Vec<String> {
        let mut v = files_under(&self.path("state/plans"));
        v.extend(files_under(&self.path("ipam")));
        v
    }
}

#[test]
fn replicas_get_their_ordinals_address_and_no_address_is_given_twice() {
    let node = Node::new(71);
    let (n0, n1, n2, n3) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
    for (o, ns) in [(0u8, &n0), (1, &n1)] {
        let name = format!("mysql-{o}");
        node.pod(&name, Some("mysql"), json!("data"));
        node.call("ADD", &name, ns).ok();
        assert_eq!(ns.addrs("net1"), vec![format!("{}/24", node.addr(o))]);
        let pod = node.api.get_pod("db", &name).unwrap();
        let st: Value =
            serde_json::from_str(pod["metadata"]["annotations"][STATUS].as_str().unwrap()).unwrap();
        assert_eq!(st[1]["ips"], json!([node.addr(o)]));
    }

    // Ordinal 2 has no entry: code 7, an event, nothing attached.
    node.pod("mysql-2", Some("mysql"), json!("data"));
    let r = node.call("ADD", "mysql-2", &n2);
    let e = r.err();
    assert_eq!(e["code"], 7, "{e}");
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("pod db/mysql-2")
            && msg.contains("db/data")
            && msg.contains("no fixed address for mysql-2"),
        "{e}"
    );
    assert_eq!(n2.links(), vec!["lo"]);
    let ev = node.events_of("mysql-2");
    assert!(
        ev.iter().any(|e| e["reason"] == "AddInterfaceFailed"
            && e["message"].as_str().unwrap().contains("no fixed address")),
        "{ev:?}"
    );

    // A bare pod asking for mysql-0's address: refused (11), this node's saved plan holds it.
    let intruder =
        json!(json!([{"name":"data","ips":[format!("{}/24", node.addr(0))]}]).to_string());
    node.pod("intruder", None, intruder);
    let e = node.call("ADD", "intruder", &n3).err().clone();
    assert_eq!(e["code"], 11, "{e}");
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains(&format!(
            "address {} is in use by pod db/mysql-0",
            node.addr(0)
        )),
        "{e}"
    );
    assert_eq!(n3.links(), vec!["lo"]);
    assert!(node
        .events_of("intruder")
        .iter()
        .any(|e| e["reason"] == "AddInterfaceFailed"));

    // mysql-0 as if on another node: no plan here, its network-status in the API still holds
    // the address (the namespace LIST finds it).
    node.call("DEL", "mysql-0", &n0).ok();
    let e = node.call("ADD", "intruder", &n3).err().clone();
    assert_eq!(e["code"], 11, "{e}");
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("pod db/mysql-0 (network-status)"),
        "{e}"
    );
    // Once mysql-0 is gone from the API too, the address is free.
    node.api.delete_pod("db", "mysql-0");
    node.call("ADD", "intruder", &n3).ok();
    assert_eq!(n3.addrs("net1"), vec![format!("{}/24", node.addr(0))]);

    for (name, ns) in [("intruder", &n3), ("mysql-1", &n1), ("mysql-2", &n2)] {
        node.call("DEL", name, ns).ok();
    }
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

/// IPv6 and dual entries per ordinal: `pg-0` gets an IPv4 and an IPv6 address, `pg-1` an IPv6
/// one only, both on `net1` and in network-status; a bare pod asking for `pg-0`'s IPv6 address
/// in its long form is refused (11) naming `pg-0` (one address, however written).
#[test]
fn ipv6_and_dual_entries_per_ordinal_reach_the_replicas_and_are_held() {
    let node = Node::new(75);
    let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":node.master.0,"mode":"bridge",
        "ipam":{"type":"static"}});
    let mapping = r#"{"pg":[["10.175.0.20/24","fd00:175::20/64"],"fd00:175::21/64"]}"#;
    node.api
        .put_nad("db", "data6", &cfg.to_string(), &[(MAPPING, mapping)])
        .unwrap();
    let (n0, n1, n2) = (Netns::new(), Netns::new(), Netns::new());
    for (name, ns, want) in [
        ("pg-0", &n0, vec!["10.175.0.20", "fd00:175::20"]),
        ("pg-1", &n1, vec!["fd00:175::21"]),
    ] {
        node.pod(name, Some("pg"), json!("data6"));
        node.call("ADD", name, ns).ok();
        let mut got = ns.addrs("net1");
        got.sort();
        let mut cidrs: Vec<String> = want
            .iter()
            .map(|a| {
                if a.contains(':') {
                    format!("{a}/64")
                } else {
                    format!("{a}/24")
                }
            })
            .collect();
        cidrs.sort();
        assert_eq!(got, cidrs, "{name}'s net1");
        let pod = node.api.get_pod("db", name).unwrap();
        let st: Value =
            serde_json::from_str(pod["metadata"]["annotations"][STATUS].as_str().unwrap()).unwrap();
        let mut ips: Vec<String> = st[1]["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        ips.sort();
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(ips, want, "{name}'s network-status: {st}");
    }
    let intruder = json!(
        json!([{"name":"data6","ips":["fd00:0175:0000:0000:0000:0000:0000:0020/64"]}]).to_string()
    );
    node.pod("intruder6", None, intruder);
    let e = node.call("ADD", "intruder6", &n2).err().clone();
    assert_eq!(e["code"], 11, "{e}");
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("address fd00:175::20 is in use by pod db/pg-0"),
        "{e}"
    );
    assert_eq!(n2.links(), vec!["lo"]);
    for (name, ns) in [("intruder6", &n2), ("pg-0", &n0), ("pg-1", &n1)] {
        node.call("DEL", name, ns).ok();
    }
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

#[test]
fn a_successor_waits_for_the_old_replica_still_attached_on_this_node() {
    let node = Node::new(74);
    let (old_ns, new_ns) = (Netns::new(), Netns::new());
    node.pod("mysql-0", Some("mysql"), json!("data"));
    node.call("ADD", "mysql-0", &old_ns).ok();
    // The controller recreated mysql-0 (a new UID) while the old sandbox is not torn down yet.
    let mut pod = node.api.get_pod("db", "mysql-0").unwrap();
    pod["metadata"]["uid"] = json!("uid-mysql-0-new");
    pod["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(STATUS);
    node.api.put_pod(pod).unwrap();
    let args = "K8S_POD_INFRA_CONTAINER_ID=cid-new;K8S_POD_UID=uid-mysql-0-new;IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=mysql-0";
    let call = |command: &str| {
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: "cid-new",
                netns: &new_ns.path(),
                ifname: "eth0",
                args,
            },
            &node.config(),
            &[],
        )
    };
    let r = call("ADD");
    let e = r.err();
    assert_eq!(e["code"], 11, "{e}");
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("earlier pod db/mysql-0 (UID uid-mysql-0") && msg.contains("cid-mysql-0"),
        "{e}"
    );
    assert_eq!(new_ns.links(), vec!["lo"]);
    // The runtime tears the old sandbox down: the successor gets the address.
    node.call("DEL", "mysql-0", &old_ns).ok();
    call("ADD").ok();
    assert_eq!(new_ns.addrs("net1"), vec![format!("{}/24", node.addr(0))]);
    call("DEL").ok();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

#[test]
fn the_owner_is_read_when_the_runtime_passed_the_annotations() {
    let mut node = Node::new(72);
    node.extra = json!({"capabilities":{"io.kubernetes.cri.pod-annotations":true},
        "runtimeConfig":{"io.kubernetes.cri.pod-annotations":{NETWORKS: "data"}}});
    node.pod("mysql-1", Some("mysql"), json!("data"));
    let ns = Netns::new();
    node.api.clear_requests();
    node.call("ADD", "mysql-1", &ns).ok();
    assert_eq!(ns.addrs("net1"), vec![format!("{}/24", node.addr(1))]);
    assert_eq!(
        node.api
            .count_requests("GET", "/api/v1/namespaces/db/pods/mysql-1"),
        1,
        "one GET for the owner"
    );
    node.call("DEL", "mysql-1", &ns).ok();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

#[test]
fn explain_shows_the_address_a_replica_would_get() {
    let node = Node::new(73);
    let dir = node.path("explain");
    std::fs::create_dir_all(&dir).unwrap();
    let set = json!({"apiVersion":"apps/v1","kind":"StatefulSet",
        "metadata":{"name":"mysql","namespace":"db"},
        "spec":{"replicas":3,"serviceName":"mysql","selector":{"matchLabels":{"app":"mysql"}},
            "template":{"metadata":{"labels":{"app":"mysql"},"annotations":{NETWORKS:"data"}},
                "spec":{"containers":[{"name":"db","image":"mysql"}]}}}});
    std::fs::write(dir.join("sts.json"), set.to_string()).unwrap();
    std::fs::write(
        dir.join("nad.json"),
        node.api.get_nad("db", "data").unwrap().to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("plexus.conf"), node.config().to_string()).unwrap();
    let explain = |name: &str| {
        let out = std::process::Command::new(bin("plexus"))
            .args(["explain", "--config", "plexus.conf", "--pod", "sts.json"])
            .args(["--nad", "nad.json", "--pod-name", name])
            .current_dir(&dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        )
    };
    let (code, plan) = explain("mysql-1");
    assert_eq!(code, Some(0), "{plan}");
    assert_eq!(plan["pod"], "db/mysql-1");
    let a = &plan["attachments"][1];
    assert_eq!(
        a["capabilityArgs"]["ips"],
        json!([format!("{}/24", node.addr(1))])
    );
    assert!(a["cniArgs"]
        .as_str()
        .unwrap()
        .contains(&format!("IP={}/24", node.addr(1))));
    let (code, err) = explain("mysql-2");
    assert_eq!(code, Some(1));
    assert_eq!(err["code"], 7);
    assert!(
        err["msg"]
            .as_str()
            .unwrap()
            .contains("no fixed address for mysql-2"),
        "{err}"
    );
    assert!(node.api.requests().is_empty(), "explain is offline");
}
