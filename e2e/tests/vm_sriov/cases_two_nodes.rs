//! Inside the first VM, after the node cases, with the second VM a kubelet node too (peer
//! `start_node`, sent after the delegate failover case): docs/sriov.md's bank database on two
//! nodes. The StatefulSet `mysql` spreads over both nodes with its fixed addresses on the VF
//! network, a client Deployment takes a whereabouts address on the same VLAN, and packets cross
//! between the nodes on both networks. Then the second node loses power and the operator fences
//! it: the replica restarts on this node with its address, and the peers' first answers are
//! timed with the gratuitous ARP and without it.
//!
//! Commands in the second node's pods go through `peer_link` (op `pod_sh`).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cases_node::Record;
use crate::node::{Node, DEVINFO_DIR, WHEREABOUTS_CONF};
use crate::node_host::SECOND_NODE_TAINT;
use crate::vf::{sh, wait_for, Pf};

/// The namespace of docs/sriov.md's two-node objects.
const NS: &str = "bank";
/// The database's fixed addresses, by ordinal (docs/sriov.md, `db-net`).
const FIXED: [&str; 3] = ["10.56.217.10", "10.56.217.11", "10.56.217.12"];
/// VFs this node needs: two replicas and the client, and the failed node's replica after.
const VFS_HERE: u32 = 4;
/// How long a pod may take to run. Alone the set runs 25–37 s after the apply; beside the
/// host tiers on 2 cores it took 150 s once.
const POD_WAIT: Duration = Duration::from_secs(480);
/// The out-of-service taint of Kubernetes' non-graceful node shutdown.
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute";

type Case = fn(&mut Two<'_>) -> Result<(), String>;

const CASES: &[(&str, Case)] = &[
    (
        "two_nodes_pods_reach_each_other_across_nodes_on_flannel",
        flannel_across,
    ),
    (
        "two_nodes_bank_statefulset_and_whereabouts_client_talk_across_nodes",
        bank_across,
    ),
    (
        "two_nodes_failover_the_replica_restarts_on_the_survivor_with_its_address",
        failover,
    ),
];

/// The two nodes and what the cases found.
struct Two<'a> {
    node: &'a mut Node,
    pf: &'a Pf,
    /// The second node's name.
    b: String,
    record: Record<'a>,
    /// docs/sriov.md's objects, patched for the tier (see [`patched`]).
    objects: Vec<Value>,
    /// The replicas, once the StatefulSet case found them Running.
    replicas: Vec<Pod>,
    client: Option<Pod>,
}

/// A pod of the case: where it runs and its `net1`.
#[derive(Clone, Debug)]
struct Pod {
    name: String,
    uid: String,
    node: String,
    eth0: String,
    net1: String,
    mac: String,
}

/// Whether `filters` (PLEXUS_VM_CASES) select any two-node case.
pub fn wanted(filters: &[String]) -> bool {
    filters.is_empty()
        || CASES
            .iter()
            .any(|(n, _)| filters.iter().any(|f| n.contains(f.as_str())))
}

/// Runs the cases the filters select, then removes the case's objects. Skipped (with a note)
/// when the second node was not started.
pub fn run(node: &mut Node, pf: &Pf, outdir: &Path, filters: &[String], record: Record<'_>) {
    let selected = |n: &str| filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str()));
    if !wanted(filters) {
        return;
    }
    if std::env::var("PLEXUS_VM_PEER_NODE").as_deref() != Ok("1") {
        record(
            json!({"note": "two nodes: skipped, no second kubelet node in this run (PLEXUS_VM_PEER_VM=0 or no node cases)"}),
        );
        return;
    }
    // The second VM has waited idle since the delegate cases: its kubelet starts now, after
    // this node's cases, which it would slow.
    let t = Instant::now();
    let n = match crate::peer_link::post(&json!({"op": "start_node"})) {
        Ok(n) => n,
        Err(e) => {
            record(
                json!({"case":"two_nodes_second_node_ready","ok":false,"secs":0.0,
                "detail":format!("cannot ask the second node to start: {e}")}),
            );
            return;
        }
    };
    let b = format!("{}-b", node.name);
    let objects = load(outdir);
    let mut two = Two {
        node,
        pf,
        b: b.clone(),
        record,
        objects: objects.clone().unwrap_or_default(),
        replicas: Vec::new(),
        client: None,
    };
    // This node grows its VFs while the second one starts.
    let first = objects
        .map(drop)
        .and_then(|()| grow_vfs(&mut two))
        .and_then(|()| crate::peer_link::wait(n, Duration::from_secs(600)))
        .and_then(|v| {
            if v["ok"] == true {
                Ok(())
            } else {
                Err(format!("the second node did not start: {v}"))
            }
        });
    (two.record)(
        json!({"case":"two_nodes_second_node_ready","ok":first.is_ok(),
        "secs":t.elapsed().as_secs_f64(),"detail":first.clone().err().unwrap_or_default()}),
    );
    if first.is_err() {
        return;
    }
    (two.record)(json!({"note": format!(
        "second node {b} (kubelet, containerd, flanneld, install.sh, sriovdp) Ready {:.1} s after it was asked to start; this node grown to {VFS_HERE} VFs meanwhile",
        t.elapsed().as_secs_f64())}));
    for (name, f) in CASES {
        if !selected(name) {
            continue;
        }
        let t = Instant::now();
        let r = f(&mut two);
        if let Err(e) = &r {
            println!("vm-two-nodes: {name} FAILED: {e}");
        }
        (two.record)(
            json!({"case":name,"ok":r.is_ok(),"secs":t.elapsed().as_secs_f64(),
            "detail": r.err().map(|e| format!("{e}\n--- kubelet.log:\n{}\n--- plexus.log:\n{}",
                crate::node::log_tail("kubelet", 10), crate::node::log_tail("plexus", 10))).unwrap_or_default()}),
        );
    }
    let t = Instant::now();
    let r = clean_up(&mut two);
    (two.record)(
        json!({"case":"two_nodes_nothing_left_on_this_node","ok":r.is_ok(),
        "secs":t.elapsed().as_secs_f64(),"detail":r.err().unwrap_or_default()}),
    );
}

/// docs/sriov.md's two-node objects (`node_host` converted them), patched for the tier.
fn load(outdir: &Path) -> Result<Vec<Value>, String> {
    let items = crate::cases_node::read_objects(&outdir.join("node/two-nodes.json"))?;
    let kinds: Vec<&str> = items.iter().filter_map(|o| o["kind"].as_str()).collect();
    if kinds
        != [
            "NetworkAttachmentDefinition",
            "NetworkAttachmentDefinition",
            "Service",
            "StatefulSet",
            "Deployment",
        ]
    {
        return Err(format!(
            "docs/sriov.md's two-node objects changed: {kinds:?}"
        ));
    }
    Ok(items.iter().map(patched).collect())
}

/// What the tier changes in docs/sriov.md's objects, and only that: the local pause image
/// (nothing can be pulled; no command or env), a toleration of the second node's test taint
/// (it keeps the other cases' pods away), and whereabouts' flat config named where the nodes
/// keep it. (`bank_across` pins the client to this node: the failure victim is the other.)
fn patched(o: &Value) -> Value {
    let mut o = o.clone();
    if o["kind"] == "NetworkAttachmentDefinition" {
        let mut cfg: Value =
            serde_json::from_str(o["spec"]["config"].as_str().unwrap_or("{}")).unwrap_or_default();
        if cfg["ipam"]["type"] == "whereabouts" {
            cfg["ipam"]["configuration_path"] = json!(WHEREABOUTS_CONF);
            o["spec"]["config"] = json!(cfg.to_string());
        }
        return o;
    }
    if o["kind"] != "StatefulSet" && o["kind"] != "Deployment" {
        return o;
    }
    let spec = &mut o["spec"]["template"]["spec"];
    spec["tolerations"] =
        json!([{"key": SECOND_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]);
    spec["terminationGracePeriodSeconds"] = json!(2);
    spec["automountServiceAccountToken"] = json!(false);
    if let Some(cs) = spec["containers"].as_array_mut() {
        for c in cs {
            c["image"] = json!("local/pause:1");
            if let Some(m) = c.as_object_mut() {
                m.remove("command");
                m.remove("env");
            }
        }
    }
    o
}

/// This node's PF with [`VFS_HERE`] VFs, sriovdp restarted to advertise them.
fn grow_vfs(two: &mut Two<'_>) -> Result<(), String> {
    two.node.stop_proc("sriovdp");
    two.pf.create_vfs(VFS_HERE)?;
    two.pf.wait_rate_ready()?;
    two.node.start_sriovdp()?;
    two.node
        .wait_allocatable(&VFS_HERE.to_string(), Duration::from_secs(120))
}

/// Runs `argv` in `pod`'s netns, on whichever node it is: output, or the failure.
fn in_pod(two: &Two<'_>, pod: &Pod, argv: &[&str]) -> Result<String, String> {
    if pod.node == two.b {
        let v = crate::peer_link::send(
            &json!({"op":"pod_sh","ns":NS,"pod":pod.name,"argv":argv}),
            Duration::from_secs(90),
        )?;
        if v["ok"] == true && v["code"] == 0 {
            return Ok(v["out"].as_str().unwrap_or_default().to_string());
        }
        return Err(format!("{argv:?} in {} on {}: {v}", pod.name, two.b));
    }
    let netns = two.node.pod_netns(NS, &pod.name)?;
    let mut a = vec!["ip", "netns", "exec", netns.as_str()];
    a.extend_from_slice(argv);
    sh(&a).map_err(|e| format!("{argv:?} in {}: {e}", pod.name))
}

/// Starts a one-shot TCP server on port 3306 in `pod` that answers its name (busybox nc).
fn serve_name(two: &Two<'_>, pod: &Pod) -> Result<(), String> {
    let argv = [
        "timeout",
        "60",
        "busybox",
        "nc",
        "-l",
        "-p",
        "3306",
        "-e",
        "/bin/echo",
        &pod.name,
    ];
    if pod.node == two.b {
        let v = crate::peer_link::send(
            &json!({"op":"pod_sh","ns":NS,"pod":pod.name,"argv":argv,"background":true}),
            Duration::from_secs(90),
        )?;
        return (v["ok"] == true)
            .then_some(())
            .ok_or(format!("server in {}: {v}", pod.name));
    }
    let netns = two.node.pod_netns(NS, &pod.name)?;
    std::process::Command::new("ip")
        .args(["netns", "exec", &netns])
        .args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|e| format!("server in {}: {e}", pod.name))
}

/// `from` connects to `to`'s server over `to`'s net1 and must read `to`'s name.
fn tcp(two: &Two<'_>, from: &Pod, to: &Pod) -> Result<(), String> {
    serve_name(two, to)?;
    let mut last = String::new();
    // The server may take a moment to listen (a command's trip to the second node).
    for _ in 0..10 {
        match in_pod(two, from, &["busybox", "nc", "-w", "5", &to.net1, "3306"]) {
            Ok(out) if out.trim() == to.name => return Ok(()),
            Ok(out) => last = format!("read {out:?}"),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!(
        "TCP {} -> {} ({}:3306 on net1): {last}",
        from.name, to.name, to.net1
    ))
}

fn ping(two: &Two<'_>, from: &Pod, addr: &str, what: &str) -> Result<(), String> {
    in_pod(two, from, &["ping", "-c", "2", "-W", "2", addr])
        .map(drop)
        .map_err(|e| format!("{} -> {what} ({addr}): no answer: {e}", from.name))
}

/// A pod with the cluster network only, bound to `node` (the second node is tainted against
/// the scheduler's placements).
fn plain_pod(name: &str, node: &str) -> Value {
    json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":NS},
        "spec":{"nodeName":node,"automountServiceAccountToken":false,
            "containers":[{"name":"c","image":"local/pause:1"}]}})
}

/// A pod on each node; the one here pings the one there across flannel's VXLAN on the node
/// network between the VMs, and the one there pings back.
fn flannel_across(two: &mut Two<'_>) -> Result<(), String> {
    let a = two.node.name.clone();
    let b = two.b.clone();
    for (name, on) in [("across-a", &a), ("across-b", &b)] {
        two.node.apply(&plain_pod(name, on))?;
    }
    let out = (|| {
        let pa = running(two, "across-a")?;
        let pb = running(two, "across-b")?;
        if !pb.eth0.starts_with("10.244.1.") || !pa.eth0.starts_with("10.244.0.") {
            return Err(format!(
                "pod addresses {} and {}: not in each node's podCIDR",
                pa.eth0, pb.eth0
            ));
        }
        ping(two, &pa, &pb.eth0, "the pod on the second node")?;
        ping(two, &pb, &pa.eth0, "the pod on the first node")?;
        (two.record)(json!({"note": format!(
            "two nodes: {} (this node) <-> {} (the second node) across flannel's VXLAN between the VMs",
            pa.eth0, pb.eth0)}));
        Ok(())
    })();
    for name in ["across-a", "across-b"] {
        let _ = two
            .node
            .kubectl(&["-n", NS, "delete", "pod", name, "--wait=false"]);
    }
    wait_gone(two, &["across-a", "across-b"])?;
    out
}

/// Waits (up to [`POD_WAIT`]) for pod `name` Running with an address; what the case needs of it.
fn running(two: &Two<'_>, name: &str) -> Result<Pod, String> {
    let mut last = Value::Null;
    wait_for(POD_WAIT, || {
        last = two
            .node
            .get(&["-n", NS, "pod", name])
            .unwrap_or(Value::Null);
        last["status"]["phase"] == "Running" && last["status"]["podIP"].is_string()
    })
    .ok_or_else(|| {
        let ev = crate::cases_node::pod_events(two.node, NS, name);
        format!(
            "pod {name} not Running in {POD_WAIT:?}: {}\nevents:\n{ev}",
            last["status"]
        )
    })?;
    Ok(pod_of(&last))
}

fn pod_of(p: &Value) -> Pod {
    let status: Value = p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
        .as_str()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    let net1 = status
        .as_array()
        .and_then(|l| l.iter().find(|e| e["interface"] == "net1"))
        .cloned()
        .unwrap_or_default();
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Pod {
        name: s(&p["metadata"]["name"]),
        uid: s(&p["metadata"]["uid"]),
        node: s(&p["spec"]["nodeName"]),
        eth0: s(&p["status"]["podIP"]),
        net1: s(&net1["ips"][0]),
        mac: s(&net1["mac"]),
    }
}

/// Waits (up to 240 s) until none of `names` exists.
fn wait_gone(two: &Two<'_>, names: &[&str]) -> Result<(), String> {
    wait_for(Duration::from_secs(240), || {
        names.iter().all(|n| {
            two.node
                .kubectl(&["-n", NS, "get", "pod", n])
                .is_err_and(|e| e.contains("NotFound") || e.contains("not found"))
        })
    })
    .map(drop)
    .ok_or(format!("pods {names:?} still there 240 s after delete"))
}

/// Waits (up to 240 s) until no pod matches `selector` (an answer that lists none, not an
/// error).
fn wait_none(two: &Two<'_>, selector: &str) -> Result<(), String> {
    let mut last = Value::Null;
    wait_for(Duration::from_secs(240), || {
        last = two
            .node
            .get(&["-n", NS, "pods", "-l", selector])
            .unwrap_or(Value::Null);
        last["items"].as_array().is_some_and(|l| l.is_empty())
    })
    .map(drop)
    .ok_or(format!(
        "pods {selector} still there 240 s after their owners' delete: {:?}",
        last["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p["metadata"]["name"].clone())
            .collect::<Vec<_>>()
    ))
}

/// The pods labelled `app`, Running with an address, once there are `n` of them.
fn running_set(two: &Two<'_>, app: &str, n: usize) -> Result<Vec<Pod>, String> {
    let mut last = Value::Null;
    wait_for(POD_WAIT, || {
        last = two
            .node
            .get(&["-n", NS, "pods", "-l", &format!("app={app}")])
            .unwrap_or(Value::Null);
        let items = last["items"].as_array().cloned().unwrap_or_default();
        items.len() == n
            && items.iter().all(|p| {
                p["status"]["phase"] == "Running"
                    && p["metadata"]["deletionTimestamp"].is_null()
                    && pod_of(p).net1.contains('.')
            })
    })
    .ok_or_else(|| {
        let ev = two
            .node
            .kubectl(&["-n", NS, "get", "events"])
            .unwrap_or_default();
        let st: Vec<String> = last["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "{} {} on {}",
                    p["metadata"]["name"], p["status"]["phase"], p["spec"]["nodeName"]
                )
            })
            .collect();
        format!("{n} pods app={app} not Running in {POD_WAIT:?}: {st:?}\nevents:\n{ev}")
    })?;
    let mut pods: Vec<Pod> = last["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(pod_of)
        .collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(pods)
}

/// The StatefulSet over both nodes with its fixed addresses, the client from whereabouts, and
/// traffic across the nodes: replica <-> replica on net1 (ICMP, TCP, a 9000-byte frame), the
/// client -> every replica on net1 and eth0 (and TCP to the far one).
fn bank_across(two: &mut Two<'_>) -> Result<(), String> {
    let a = two.node.name.clone();
    let mut objects = two.objects.clone();
    if let Some(d) = objects.iter_mut().find(|o| o["kind"] == "Deployment") {
        d["spec"]["template"]["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": a});
    }
    let t = Instant::now();
    for o in &objects {
        two.node.apply(o)?;
    }
    let replicas = running_set(two, "mysql", 3)?;
    let t_set = t.elapsed();
    let client = running_set(two, "teller", 1)?.remove(0);
    two.replicas = replicas.clone();
    two.client = Some(client.clone());

    // Placement and addresses.
    let on_b: Vec<&Pod> = replicas.iter().filter(|p| p.node == two.b).collect();
    let on_a: Vec<&Pod> = replicas.iter().filter(|p| p.node == a).collect();
    if on_b.len() != 1 || on_a.len() != 2 {
        return Err(format!(
            "replicas not spread 2/1 over {a} and {}: {replicas:?}",
            two.b
        ));
    }
    for (i, r) in replicas.iter().enumerate() {
        if r.net1 != FIXED[i] {
            return Err(format!(
                "{} has {} on net1, not its fixed {}",
                r.name, r.net1, FIXED[i]
            ));
        }
        let inside = in_pod(two, r, &["ip", "-o", "-4", "addr", "show", "net1"])?;
        if !inside.contains(&format!("{}/24", FIXED[i])) {
            return Err(format!("{}: net1 in the pod: {inside}", r.name));
        }
    }
    let last: u8 = client
        .net1
        .rsplit('.')
        .next()
        .and_then(|o| o.parse().ok())
        .unwrap_or(0);
    if !client.net1.starts_with("10.56.217.") || last < 16 || client.node != a {
        return Err(format!(
            "the client: {client:?} (wanted a whereabouts address above the replicas' /28, on {a})"
        ));
    }

    // Traffic. `far` is the replica on the second node, `near` one here.
    let far = on_b[0].clone();
    let near = on_a[0].clone();
    for x in &replicas {
        for y in &replicas {
            if x.name != y.name {
                ping(two, x, &y.net1, &format!("{} on net1", y.name))?;
            }
        }
    }
    tcp(two, &near, &far)?;
    tcp(two, &far, &near)?;
    in_pod(
        two,
        &near,
        &[
            "ping", "-c", "1", "-W", "3", "-M", "do", "-s", "8972", &far.net1,
        ],
    )
    .map_err(|e| {
        format!(
            "a 9000-byte frame {} -> {} on net1: {e}",
            near.name, far.name
        )
    })?;
    for r in &replicas {
        ping(two, &client, &r.net1, &format!("{} on net1", r.name))?;
        ping(two, &client, &r.eth0, &format!("{} on eth0", r.name))?;
    }
    tcp(two, &client, &far)?;
    (two.record)(json!({"note": format!(
        "two nodes: mysql-0..2 Running {:.1} s after apply, {} on {} and {} on {} with {:?}; client {} (whereabouts) on {a}; net1 ICMP between all replicas, TCP {}<->{} across the nodes, a 9000-byte frame across; client -> every replica on net1 and eth0",
        t_set.as_secs_f64(), on_a.len(), a, on_b.len(), two.b,
        replicas.iter().map(|r| format!("{}={}", r.name, r.net1)).collect::<Vec<_>>(),
        client.net1, near.name, far.name)}));
    Ok(())
}

/// Time until `pod` gets an answer from `addr` (pings every 200 ms, up to 30 s).
fn first_answer(netns: &str, addr: &str) -> Result<Duration, String> {
    let t = Instant::now();
    sh(&[
        "ip", "netns", "exec", netns, "ping", "-c", "1", "-i", "0.2", "-w", "30", addr,
    ])
    .map(|_| t.elapsed())
    .map_err(|e| format!("no answer from {addr} in 30 s: {e}"))
}

/// The second node loses power; the operator fences it (out-of-service taint, its pod
/// force-deleted); the replica restarts here with its address and a new VF (another MAC).
/// Timed: the peers' first answer after Running, one with the gratuitous ARP `sriov` sent, one
/// whose neighbour entry is put back to the old MAC (a peer that missed the announcement).
fn failover(two: &mut Two<'_>) -> Result<(), String> {
    let a = two.node.name.clone();
    let far = two
        .replicas
        .iter()
        .find(|p| p.node == two.b)
        .cloned()
        .ok_or("no replica on the second node (the StatefulSet case did not pass)")?;
    let peers: Vec<Pod> = two
        .replicas
        .iter()
        .filter(|p| p.node == a)
        .cloned()
        .collect();
    if peers.len() < 2 {
        return Err(format!(
            "two replicas on {a} wanted as peers: {:?}",
            two.replicas
        ));
    }
    let client = two.client.clone().ok_or("no client")?;
    let (with, without) = (&peers[0], &peers[1]);
    let ns_with = two.node.pod_netns(NS, &with.name)?;
    let ns_without = two.node.pod_netns(NS, &without.name)?;
    let ns_client = two.node.pod_netns(NS, &client.name)?;
    for ns in [&ns_with, &ns_without] {
        sh(&[
            "ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "2", &far.net1,
        ])?;
    }

    // Power off; the node is dead once its replica stops answering.
    let t_kill = Instant::now();
    crate::peer_link::post(&json!({"op":"power_off"}))?;
    wait_for(Duration::from_secs(60), || {
        sh(&[
            "ip", "netns", "exec", &ns_client, "ping", "-c", "1", "-W", "1", &far.net1,
        ])
        .is_err()
    })
    .ok_or("the second node's replica still answers 60 s after its power-off")?;
    let t_dead = t_kill.elapsed();

    // The operator's fence: Kubernetes' non-graceful node shutdown.
    two.node
        .kubectl(&["taint", "node", &two.b, OUT_OF_SERVICE])?;
    two.node.kubectl(&[
        "-n",
        NS,
        "delete",
        "pod",
        &far.name,
        "--force",
        "--grace-period=0",
    ])?;
    let t_fence = t_kill.elapsed();
    let mut new = far.clone();
    wait_for(POD_WAIT, || {
        let p = two
            .node
            .get(&["-n", NS, "pod", &far.name])
            .unwrap_or(Value::Null);
        new = pod_of(&p);
        p["status"]["phase"] == "Running" && new.uid != far.uid && new.net1.contains('.')
    })
    .ok_or_else(|| {
        format!(
            "{} not Running again {POD_WAIT:?} after the fence: {new:?}",
            far.name
        )
    })?;
    let t_running = t_kill.elapsed();
    // The announcement reached the peer that kept its entry: the new MAC, before any ping.
    let seen = sh(&[
        "ip", "netns", "exec", &ns_with, "ip", "neigh", "show", &far.net1,
    ])?;
    // The peer that missed the announcement: its entry back to the old MAC, stale.
    sh(&[
        "ip",
        "netns",
        "exec",
        &ns_without,
        "ip",
        "neigh",
        "replace",
        &far.net1,
        "lladdr",
        &far.mac,
        "dev",
        "net1",
        "nud",
        "stale",
    ])?;
    let (w, wo, c) = std::thread::scope(|s| {
        let w = s.spawn(|| first_answer(&ns_with, &far.net1));
        let wo = s.spawn(|| first_answer(&ns_without, &far.net1));
        let c = s.spawn(|| first_answer(&ns_client, &far.net1));
        let j = |h: std::thread::ScopedJoinHandle<'_, Result<Duration, String>>| {
            h.join().unwrap_or(Err("panicked".into()))
        };
        (j(w), j(wo), j(c))
    });
    let (w, wo, c) = (w?, wo?, c?);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (two.record)(json!({"note": format!(
        "failover: {} lost power; dead (no answer) after {:.1} s, fenced at {:.1} s, Running on {a} at {:.1} s with {} (MAC {} -> {}); first answer after Running: {:.0} ms with the gratuitous ARP, {:.0} ms without (entry at the old MAC), client {:.0} ms",
        two.b, t_dead.as_secs_f64(), t_fence.as_secs_f64(), t_running.as_secs_f64(),
        new.net1, far.mac, new.mac, ms(w), ms(wo), ms(c))}));
    let mut wrong = Vec::new();
    if new.node != a {
        wrong.push(format!("the new {} runs on {}", new.name, new.node));
    }
    if new.net1 != far.net1 {
        wrong.push(format!(
            "the new {} has {}, not {}",
            new.name, new.net1, far.net1
        ));
    }
    if new.mac == far.mac || new.mac.is_empty() {
        wrong.push(format!(
            "the new {} kept MAC {:?}: not a new VF",
            new.name, new.mac
        ));
    }
    if new.mac.is_empty() || !seen.contains(&new.mac) {
        wrong.push(format!(
            "{}'s neighbour entry for {} right after Running is not the new MAC {}: {seen:?}",
            with.name, far.net1, new.mac
        ));
    }
    if w >= Duration::from_secs(2) || w >= wo {
        wrong.push(format!(
            "first answer with the announcement {:.0} ms, without {:.0} ms",
            ms(w),
            ms(wo)
        ));
    }
    let holder = claim_holder(two, &far.net1)?;
    if holder != (new.uid.clone(), a.clone()) {
        wrong.push(format!(
            "the address claim names {holder:?}, not the new pod {} on {a}",
            new.uid
        ));
    }
    if let Some(r) = two.replicas.iter_mut().find(|p| p.name == new.name) {
        *r = new;
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// (pod UID, node) of the AddressClaim holding `addr` in the namespace.
fn claim_holder(two: &Two<'_>, addr: &str) -> Result<(String, String), String> {
    let list = two.node.get(&["-n", NS, "addressclaims.plexus.cni.io"])?;
    let c = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["spec"]["address"] == addr)
        .ok_or(format!("no AddressClaim for {addr}"))?;
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Ok((s(&c["spec"]["pod"]["uid"]), s(&c["spec"]["node"])))
}

/// Deletes the case's objects (their pods by the kubelet, so plexus' DEL runs) and checks this
/// node: every VF back in the root netns, no attachment's device-info file, no address claim, no
/// whereabouts allocation.
fn clean_up(two: &mut Two<'_>) -> Result<(), String> {
    // The garbage collector deletes their pods (by the kubelet: plexus' DEL runs).
    two.node.kubectl(&[
        "-n",
        NS,
        "delete",
        "--wait=false",
        "--ignore-not-found",
        "deployment/teller",
        "statefulset/mysql",
        "service/mysql",
    ])?;
    // Pods left on a fenced (dead) node can only go by force: their DEL never runs there. The
    // others go by the garbage collector and the kubelet; deleting them by name here would race
    // their controllers (a ReplicaSet not yet collected makes a new pod).
    let fenced = two
        .node
        .kubectl(&["get", "node", &two.b, "-o", "jsonpath={.spec.taints}"])
        .is_ok_and(|t| t.contains("out-of-service"));
    if fenced {
        let pods = two.node.get(&["-n", NS, "pods"])?;
        for p in pods["items"].as_array().into_iter().flatten() {
            if p["spec"]["nodeName"] == json!(two.b) {
                let name = p["metadata"]["name"].as_str().unwrap_or_default();
                two.node.kubectl(&[
                    "-n",
                    NS,
                    "delete",
                    "pod",
                    name,
                    "--force",
                    "--grace-period=0",
                    "--ignore-not-found",
                ])?;
            }
        }
    }
    wait_none(two, "app in (mysql,teller)")?;
    let mut wrong = Vec::new();
    for i in 0..VFS_HERE {
        let pci = two.pf.vf_pci(i).unwrap_or_default();
        if crate::vf::vf_netdev(&pci).is_none() {
            wrong.push(format!("VF {i} ({pci}) has no netdev in the root netns"));
        }
    }
    // plexus' per-attachment device-info files (sriovdp's own under `dp/` stay). A pod object
    // can be gone before the kubelet's last teardown of one of its sandboxes ran (a sandbox
    // replaced during the failover): their DEL removes the file, so it is waited for (60 s),
    // and how long it took is said.
    let devinfo_files = || -> Vec<String> {
        std::fs::read_dir(format!("{DEVINFO_DIR}/../cni"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    let t0 = Instant::now();
    let first = devinfo_files();
    let mut devinfo = first.clone();
    while !devinfo.is_empty() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        devinfo = devinfo_files();
    }
    if !first.is_empty() && devinfo.is_empty() {
        eprintln!(
            "vm-runner: device-info files {first:?} were still there once the pods were gone; removed {:.1} s later",
            t0.elapsed().as_secs_f64()
        );
    }
    if !devinfo.is_empty() {
        wrong.push(format!("device-info files left: {devinfo:?}"));
    }
    let claims = two.node.get(&["-n", NS, "addressclaims.plexus.cni.io"])?;
    if claims["items"].as_array().is_some_and(|l| !l.is_empty()) {
        wrong.push(format!("address claims left: {}", claims["items"]));
    }
    let pools = two
        .node
        .get(&["-n", NS, "ippools.whereabouts.cni.cncf.io"])?;
    let left: usize = pools["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p["spec"]["allocations"].as_object().map_or(0, |a| a.len()))
        .sum();
    if left > 0 {
        wrong.push(format!("whereabouts allocations left: {}", pools["items"]));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}
