//! Pods on the real node: manifests, waiting for Running and for gone, timings, and what a
//! running pod's network namespace holds.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use plexus_e2e::realk8s::node::wait_for;

use super::api::Api;

/// The locally built image (pause), never pulled.
pub const IMAGE: &str = "docker.io/local/pause:1";
/// Multus' annotations.
pub const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// network-status annotation.
pub const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// A pod manifest bound to `node`, labelled `batch=<batch>`.
pub fn manifest(ns: &str, name: &str, node: &str, batch: &str, networks: Option<&Value>) -> Value {
    let mut annotations = json!({});
    if let Some(n) = networks {
        let v = match n {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        annotations[NETWORKS] = json!(v);
    }
    json!({"apiVersion":"v1","kind":"Pod",
        "metadata":{"name":name,"namespace":ns,"labels":{"batch":batch},"annotations":annotations},
        "spec":{"nodeName":node,"automountServiceAccountToken":false,"enableServiceLinks":false,
            "dnsPolicy":"Default","terminationGracePeriodSeconds":1,
            "containers":[{"name":"c","image":IMAGE,"imagePullPolicy":"Never"}]}})
}

/// Whether the pod's phase is Running.
pub fn running(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
}

/// The pod's network-status, parsed (`[]` when absent).
pub fn network_status(pod: &Value) -> Result<Vec<Value>> {
    let s = pod["metadata"]["annotations"][STATUS]
        .as_str()
        .unwrap_or("[]");
    serde_json::from_str(s).with_context(|| format!("network-status: {s}"))
}

/// (Re)create the pod `probe` in `ns` on `node` until it runs with a network-status: the
/// runtime picks a new CNI config up from a write event, and until then pods get the primary
/// network alone.
pub fn wait_until_plexus_is_in_the_path(api: &Api, ns: &str, node: &str) -> Result<()> {
    let pod = manifest(ns, "probe", node, "probe", None);
    wait_for(
        "a pod with network-status (containerd loaded plexus' config)",
        Duration::from_secs(30),
        || {
            let _ = api.delete_pod(ns, "probe");
            wait_for("probe gone", Duration::from_secs(30), || {
                Ok(api.get_pod(ns, "probe")?.is_none())
            })?;
            api.create_pod(&pod)?;
            wait_for("probe Running", Duration::from_secs(30), || {
                Ok(api.get_pod(ns, "probe")?.is_some_and(|p| running(&p)))
            })?;
            let p = api.get_pod(ns, "probe")?.context("probe")?;
            Ok(!network_status(&p)?.is_empty())
        },
    )
}

/// Create `pods` (back to back) and wait until each is Running; milliseconds per pod from its
/// POST to the first poll that saw it Running. Polls one LIST per 10 ms.
pub fn create_and_wait(api: &Api, pods: &[Value], timeout: Duration) -> Result<Vec<f64>> {
    let ns = pods[0]["metadata"]["namespace"].as_str().context("ns")?;
    let batch = pods[0]["metadata"]["labels"]["batch"]
        .as_str()
        .context("batch")?;
    let mut started: BTreeMap<String, Instant> = BTreeMap::new();
    for p in pods {
        let name = p["metadata"]["name"].as_str().context("name")?.to_string();
        started.insert(name, Instant::now());
        api.create_pod(p)?;
    }
    let mut done: BTreeMap<String, f64> = BTreeMap::new();
    let deadline = Instant::now() + timeout;
    while done.len() < started.len() {
        for p in api.list_pods(ns, batch)? {
            let name = p["metadata"]["name"].as_str().unwrap_or("").to_string();
            if let (true, Some(t0)) = (running(&p), started.get(&name)) {
                done.entry(name)
                    .or_insert_with(|| t0.elapsed().as_secs_f64() * 1000.0);
            }
        }
        if Instant::now() > deadline {
            let missing: Vec<_> = started.keys().filter(|k| !done.contains_key(*k)).collect();
            bail!("not Running after {timeout:?}: {missing:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(done.into_values().collect())
}

/// Delete pods `names` (back to back) and wait until each is gone from the API and its netns
/// (`netns[i]`) is gone; milliseconds per pod.
pub fn delete_and_wait(
    api: &Api,
    ns: &str,
    batch: &str,
    names: &[String],
    netns: &[String],
    timeout: Duration,
) -> Result<Vec<f64>> {
    let mut started = Vec::new();
    for n in names {
        started.push(Instant::now());
        api.delete_pod(ns, n)?;
    }
    let mut done: Vec<Option<f64>> = vec![None; names.len()];
    let deadline = Instant::now() + timeout;
    while done.iter().any(Option::is_none) {
        let present: BTreeSet<String> = api
            .list_pods(ns, batch)?
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        for (i, n) in names.iter().enumerate() {
            let gone = !present.contains(n) && !std::path::Path::new(&netns[i]).exists();
            if gone && done[i].is_none() {
                done[i] = Some(started[i].elapsed().as_secs_f64() * 1000.0);
            }
        }
        if Instant::now() > deadline {
            bail!("pods not gone after {timeout:?}: {names:?} / {done:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(done.into_iter().flatten().collect())
}

/// [`delete_and_wait`] for the one pod `name` (its batch label the same), its netns `netns`.
pub fn delete_one(api: &Api, ns: &str, name: &str, netns: &str, timeout: Duration) -> Result<()> {
    let names = [name.to_string()];
    delete_and_wait(api, ns, name, &names, &[netns.to_string()], timeout).map(drop)
}

/// Median of `v` (ms).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// One interface inside a pod's netns.
#[derive(Debug)]
pub struct Iface {
    /// MAC address.
    pub mac: String,
    /// Addresses without prefix length (global scope).
    pub ips: Vec<String>,
}

/// The interfaces in network namespace `netns` (a path under /run/netns), by name.
pub fn interfaces(netns: &str) -> Result<BTreeMap<String, Iface>> {
    let name = netns.rsplit('/').next().unwrap_or(netns);
    let out = Command::new("ip")
        .args(["-n", name, "-j", "addr", "show"])
        .output()?;
    ensure!(
        out.status.success(),
        "ip -n {name} addr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    let mut map = BTreeMap::new();
    for l in v.as_array().into_iter().flatten() {
        let ips = l["addr_info"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["scope"] == "global")
            .filter_map(|a| a["local"].as_str().map(str::to_string))
            .collect();
        map.insert(
            l["ifname"].as_str().unwrap_or("?").to_string(),
            Iface {
                mac: l["address"].as_str().unwrap_or("").to_string(),
                ips,
            },
        );
    }
    Ok(map)
}

/// Check that network-status and the netns agree: the same interfaces (plus `lo`), and each
/// entry's IPs and MAC on the interface it names. `expected` = (network name, interface) in order.
pub fn check_pod_network(status: &[Value], netns: &str, expected: &[(&str, &str)]) -> Result<()> {
    let got: Vec<(String, String)> = status
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or("?").to_string(),
                e["interface"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = expected
        .iter()
        .map(|(n, i)| (n.to_string(), i.to_string()))
        .collect();
    ensure!(got == want, "network-status {got:?}, expected {want:?}");
    ensure!(
        status[0]["default"] == true,
        "first entry is the default network: {status:?}"
    );
    let ifs = interfaces(netns)?;
    let mut names: BTreeSet<String> = ifs.keys().cloned().collect();
    ensure!(names.remove("lo"), "no lo in {netns}");
    let listed: BTreeSet<String> = want.iter().map(|(_, i)| i.clone()).collect();
    ensure!(
        names == listed,
        "netns has {names:?}, network-status lists {listed:?}"
    );
    for e in status {
        let ifname = e["interface"].as_str().unwrap_or("?");
        let iface = &ifs[ifname];
        ensure!(
            e["mac"].as_str() == Some(iface.mac.as_str()),
            "{ifname}: status MAC {} vs {}",
            e["mac"],
            iface.mac
        );
        let ips: Vec<String> = e["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i.as_str().map(str::to_string))
            .collect();
        ensure!(
            !ips.is_empty() && ips == iface.ips,
            "{ifname}: status IPs {ips:?} vs netns {:?}",
            iface.ips
        );
    }
    Ok(())
}

/// Names of the host's ifb links.
pub fn ifb_links() -> BTreeSet<String> {
    let out = Command::new("ip")
        .args(["-j", "link", "show", "type", "ifb"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let v: Value = serde_json::from_str(&out).unwrap_or(json!([]));
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect()
}

/// nat-table rules that DNAT host port `port`.
pub fn dnat_rules(port: u16) -> Vec<String> {
    let out = Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter(|l| l.contains("DNAT") && l.contains(&format!("--dport {port} ")))
        .map(str::to_string)
        .collect()
}

/// A pod (1 NAD, `br-a`) with a `hostPort` `port` and 10M ingress/egress bandwidth
/// annotations: what portmap and bandwidth act on.
pub fn hostport_manifest(ns: &str, node: &str, port: u16) -> Value {
    let mut m = manifest(ns, "hostport", node, "hostport", Some(&json!("br-a")));
    m["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 8080, "hostPort": port, "protocol": "TCP"}]);
    m["metadata"]["annotations"]["kubernetes.io/ingress-bandwidth"] = json!("10M");
    m["metadata"]["annotations"]["kubernetes.io/egress-bandwidth"] = json!("10M");
    m
}

/// After the hostPort pod is gone: no DNAT rule for `port`, no ifb beyond `ifb_before`.
pub fn ensure_no_hostport_left(port: u16, ifb_before: &BTreeSet<String>) -> Result<()> {
    let dnat = dnat_rules(port);
    ensure!(dnat.is_empty(), "DNAT rule left: {dnat:?}");
    let left: Vec<String> = ifb_links().difference(ifb_before).cloned().collect();
    ensure!(left.is_empty(), "ifb left: {left:?}");
    Ok(())
}

/// While the hostPort pod (netns `netns`) runs: `node_ip:port` reaches a listener on its
/// containerPort 8080, which answers `token` once.
pub fn ensure_host_port_answers(netns: &str, node_ip: &str, port: u16, token: &str) -> Result<()> {
    let server = NetnsServer::start(netns, 8080, token)?;
    let got = tcp_answer(node_ip, port);
    let served = server.stop()?;
    ensure!(
        got.as_deref().ok() == Some(token) && served == 1,
        "{node_ip}:{port} -> the pod's 8080: {got:?}, {served} answered"
    );
    Ok(())
}

/// After the hostPort pod is gone: `node_ip:port` no longer answers, and
/// [`ensure_no_hostport_left`].
pub fn ensure_host_port_gone(
    node_ip: &str,
    port: u16,
    ifb_before: &BTreeSet<String>,
) -> Result<()> {
    ensure!(
        tcp_answer(node_ip, port).is_err(),
        "hostPort {port} still answers after the pod is gone"
    );
    ensure_no_hostport_left(port, ifb_before)
}

/// The hostPort pod ([`hostport_manifest`], netns `netns`): `net` on eth0 and `<ns>/br-a` on
/// net1, in its network-status and its netns.
pub fn check_hostport_pod_network(api: &Api, ns: &str, netns: &str, net: &str) -> Result<()> {
    let pod = api.get_pod(ns, "hostport")?.context("pod")?;
    let br_a = format!("{ns}/br-a");
    check_pod_network(
        &network_status(&pod)?,
        netns,
        &[(net, "eth0"), (br_a.as_str(), "net1")],
    )
}

/// The ifbs that came since `ifb_before`; with `bandwidth` (the overlay's conflist chains
/// it), one of bandwidth's (`bwp…`) among them.
pub fn new_ifbs(ifb_before: &BTreeSet<String>, bandwidth: bool) -> Result<Vec<String>> {
    let ifbs: Vec<String> = ifb_links().difference(ifb_before).cloned().collect();
    if bandwidth {
        ensure!(
            ifbs.iter().any(|i| i.starts_with("bwp")),
            "no bandwidth ifb (have {ifbs:?})"
        );
    }
    Ok(ifbs)
}

/// None of `addrs` (deleted pods' addresses) answers from the node any more.
pub fn ensure_no_address_answers(addrs: &[String]) -> Result<()> {
    let answering = answering_from_the_node(addrs);
    ensure!(
        answering.is_empty(),
        "deleted pods' addresses still answer: {answering:?}"
    );
    Ok(())
}

/// Pod `a` (netns `na`) and pod `b` (netns `nb`) ping each other's `ifname` address.
pub fn ensure_pings_both_ways(a: &str, na: &str, b: &str, nb: &str, ifname: &str) -> Result<()> {
    let (ia, ib) = (address(na, ifname)?, address(nb, ifname)?);
    ensure!(
        pings(Some(na), &ib),
        "{a} -> {b} over {ifname} ({ib}): no answer"
    );
    ensure!(
        pings(Some(nb), &ia),
        "{b} -> {a} over {ifname} ({ia}): no answer"
    );
    Ok(())
}

/// `ping -c 1 -W 2 addr` from inside `netns` (a path under /run/netns), or from the node's
/// own namespace with `None`: whether an answer came back.
pub fn pings(netns: Option<&str>, addr: &str) -> bool {
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = netns {
        args.extend(["netns", "exec", ns.rsplit('/').next().unwrap_or(ns)]);
    }
    let mut cmd = if netns.is_some() {
        Command::new("ip")
    } else {
        Command::new("ping")
    };
    if netns.is_some() {
        cmd.args(&args).arg("ping");
    }
    cmd.args(["-c", "1", "-W", "2", addr])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Those of `addrs` that answer a ping from the node, all pinged at once.
pub fn answering_from_the_node(addrs: &[String]) -> Vec<String> {
    std::thread::scope(|s| {
        let pinged: Vec<_> = addrs
            .iter()
            .map(|a| s.spawn(move || pings(None, a).then(|| a.clone())))
            .collect();
        pinged
            .into_iter()
            .filter_map(|h| h.join().ok().flatten())
            .collect()
    })
}

/// The first global address of `ifname` in `netns`.
pub fn address(netns: &str, ifname: &str) -> Result<String> {
    interfaces(netns)?
        .remove(ifname)
        .and_then(|i| i.ips.into_iter().next())
        .with_context(|| format!("no address on {ifname} in {netns}"))
}

/// A TCP server inside a pod's netns (the thread enters it: `setns` affects only that thread)
/// that answers every connection with its token, until [`NetnsServer::stop`].
pub struct NetnsServer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Result<usize>>,
}

impl NetnsServer {
    /// Listen on `0.0.0.0:port` inside `netns` (a path under /run/netns).
    pub fn start(netns: &str, port: u16, token: &str) -> Result<NetnsServer> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let file = std::fs::File::open(netns).with_context(|| format!("open {netns}"))?;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (ready, listening) = std::sync::mpsc::channel();
        let (flag, token) = (stop.clone(), token.to_string());
        let handle = std::thread::spawn(move || -> Result<usize> {
            let listener = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(anyhow::Error::from)
                .and_then(|()| Ok(std::net::TcpListener::bind(("0.0.0.0", port))?));
            let listener = match listener {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            listener.set_nonblocking(true)?;
            let _ = ready.send(Ok(()));
            let mut served = 0;
            while !flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false)?;
                        std::io::Write::write_all(&mut s, token.as_bytes())?;
                        served += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(served)
        });
        match listening.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => Ok(NetnsServer { stop, handle }),
            Ok(Err(e)) => bail!("listen on {port} in {netns}: {e}"),
            Err(_) => bail!("no listener in {netns} after 5 s"),
        }
    }

    /// Stop listening; how many connections were answered.
    pub fn stop(self) -> Result<usize> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.handle
            .join()
            .map_err(|_| anyhow::anyhow!("listener thread panicked"))?
    }
}

/// What the TCP server at `addr:port` sends before it closes (connect within 3 s).
pub fn tcp_answer(addr: &str, port: u16) -> Result<String> {
    let sock: std::net::SocketAddr = format!("{addr}:{port}").parse()?;
    let mut s = std::net::TcpStream::connect_timeout(&sock, Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out)?;
    Ok(out)
}
