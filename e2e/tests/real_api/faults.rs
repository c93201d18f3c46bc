//! The API faults on the real apiserver, through
//! [`plexus_e2e::realk8s::fault_proxy::FaultProxy`] (they ran on the stand-in in tests/faults.rs
//! and tests/kube_mode.rs): the apiserver slow beyond plexus' pod timeout, throttling (429) and
//! server errors (500, 503) in a short burst (retried) and without end (reported), the apiserver
//! unreachable and back, the status PATCH refused (403) after the event. Each
//! asserts the exact CNI code and what the message names, then the runtime's DELs, and that
//! nothing is left: no link in the pod, no lease, no plan, no result-cache file.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plexus_e2e::realk8s::fault_proxy::FaultProxy;
use plexus_e2e::RequestMatcher;
use serde_json::{json, Value};

use super::common::{Netns, Run};
use super::{Node, NETWORKS};

/// plexus through the proxy, with the fault matrix's short pod timeout.
struct Faulty<'n, 'a> {
    node: &'n Node<'a>,
    proxy: FaultProxy,
    extra: Value,
}

impl<'n, 'a> Faulty<'n, 'a> {
    fn new(node: &'n Node<'a>) -> Result<Self> {
        let proxy = FaultProxy::start(node.cp)?;
        let kubeconfig = node.path("proxy.kubeconfig");
        let token = plexus_e2e::realk8s::rig::plexus_token(
            node.cp,
            &plexus_e2e::realk8s::rig::PlexusToken::Unbound,
        )?;
        proxy.write_kubeconfig(&kubeconfig, &token)?;
        node.macvlan_nad("db", "mv-faults", node.host_local("10.158.0.0/24"))?;
        Ok(Faulty {
            node,
            proxy,
            extra: json!({"kubeconfig": kubeconfig, "podTimeoutMs": 1500}),
        })
    }

    /// A pod in `db` with the macvlan NAD; its CNI_ARGS.
    fn pod(&self, name: &str) -> Result<String> {
        let uid = self.node.pod("db", name, json!({NETWORKS: "mv-faults"}))?;
        Ok(Node::args("db", name, &uid))
    }

    fn call(&self, cmd: &str, pod: &str, netns: &str, args: &str) -> Run {
        self.node
            .call(cmd, &format!("cid-{pod}"), netns, args, &self.extra)
    }

    /// The runtime's three DELs (netns, then twice empty), then nothing is left.
    fn del_all_and_ensure_clean(&self, pod: &str, ns: &Netns, args: &str) -> Result<()> {
        self.call("DEL", pod, &ns.path(), args).ok();
        self.call("DEL", pod, "", args).ok();
        self.call("DEL", pod, "", args).ok();
        ensure!(ns.links() == ["lo"], "{pod}: links left {:?}", ns.links());
        let left = self.node.leftovers();
        ensure!(left.is_empty(), "{pod}: left {left:?}");
        Ok(())
    }
}

/// `(code, msg | details)` of an error result.
fn error(r: &Run) -> (i64, String) {
    let e = r.err();
    (
        e["code"].as_i64().unwrap_or(-1),
        format!(
            "{} | {}",
            e["msg"].as_str().unwrap_or(""),
            e["details"].as_str().unwrap_or("")
        ),
    )
}

/// The pod GET slower than plexus' pod timeout: "try again later" (11) naming the pod, within
/// the timeout, and nothing attached.
pub fn api_slow(node: &Node<'_>) -> Result<()> {
    let f = Faulty::new(node)?;
    let args = f.pod("slow")?;
    let ns = Netns::new();
    f.proxy
        .set_latency(Duration::from_secs(8), RequestMatcher::path("/pods/slow"));
    let t0 = Instant::now();
    let (code, msg) = error(&f.call("ADD", "slow", &ns.path(), &args));
    let took = t0.elapsed();
    f.proxy.clear_latency();
    ensure!(code == 11, "{msg}");
    ensure!(msg.contains("pod db/slow"), "{msg}");
    ensure!(
        took < Duration::from_secs(8),
        "bounded by the pod timeout: {took:?}"
    );
    f.del_all_and_ensure_clean("slow", &ns, &args)
}

/// Two 429s or 500s are retried and the ADD succeeds; 500s without end fail it with 11 naming
/// the pod and the code, with nothing attached.
pub fn api_throttling_and_server_errors(node: &Node<'_>) -> Result<()> {
    let f = Faulty::new(node)?;
    for code in [429, 500] {
        let pod = format!("burst-{code}");
        let args = f.pod(&pod)?;
        let ns = Netns::new();
        f.proxy
            .fail_next(2, code, RequestMatcher::path(&format!("/pods/{pod}")));
        let r = f.call("ADD", &pod, &ns.path(), &args);
        ensure!(f.proxy.pending_failures() == 0, "{code}: not retried");
        ensure!(r.code == 0, "{code}: {}", r.out);
        ensure!(
            ns.links().len() == 3,
            "{code}: eth0 and net1: {:?}",
            ns.links()
        );
        f.del_all_and_ensure_clean(&pod, &ns, &args)?;
    }
    let args = f.pod("down500")?;
    let ns = Netns::new();
    f.proxy
        .fail_next(1000, 500, RequestMatcher::path("/pods/down500"));
    let (code, msg) = error(&f.call("ADD", "down500", &ns.path(), &args));
    f.proxy.clear_failures();
    ensure!(code == 11, "{msg}");
    ensure!(
        msg.contains("pod db/down500") && msg.contains("500"),
        "{msg}"
    );
    f.del_all_and_ensure_clean("down500", &ns, &args)
}

/// The apiserver unreachable (connection refused): ADD is 11 naming the pod, the runtime's DEL
/// of the failed ADD succeeds meanwhile; once it is back the ADD succeeds.
pub fn api_down_then_back(node: &Node<'_>) -> Result<()> {
    let f = Faulty::new(node)?;
    let args = f.pod("flap")?;
    let ns = Netns::new();
    f.proxy.down();
    let (code, msg) = error(&f.call("ADD", "flap", &ns.path(), &args));
    let del = f.call("DEL", "flap", &ns.path(), &args);
    f.proxy.up()?;
    ensure!(code == 11, "{msg}");
    ensure!(msg.contains("pod db/flap"), "{msg}");
    ensure!(del.code == 0, "DEL with the API down: {}", del.out);
    ensure!(ns.links() == ["lo"], "{:?}", ns.links());
    let r = f.call("ADD", "flap", &ns.path(), &args);
    ensure!(r.code == 0, "ADD with the API back: {}", r.out);
    ensure!(ns.links().len() == 3, "{:?}", ns.links());
    f.del_all_and_ensure_clean("flap", &ns, &args)
}

/// The apiserver unreachable at ADD: 11 and nothing attached; back, with two 503s on the next
/// GETs: retried, and the ADD succeeds.
pub fn api_unreachable_then_503s_retried(node: &Node<'_>) -> Result<()> {
    let f = Faulty::new(node)?;
    let args = f.pod("late")?;
    let ns = Netns::new();
    f.proxy.down();
    let r = f.call("ADD", "late", &ns.path(), &args);
    f.proxy.up()?;
    ensure!(r.code != 0 && r.out["code"] == 11, "{}", r.out);
    ensure!(ns.links() == ["lo"], "{:?}", ns.links());
    f.proxy.fail_next(2, 503, RequestMatcher::method("GET"));
    let r = f.call("ADD", "late", &ns.path(), &args);
    ensure!(f.proxy.pending_failures() == 0, "the 503s were not retried");
    ensure!(r.code == 0, "{}", r.out);
    f.del_all_and_ensure_clean("late", &ns, &args)
}

/// A thin ADD sends the status PATCH and the AddedInterface event together. When the PATCH is
/// then refused for good (403), the attachments are undone, a warning event says so, the ADD
/// fails with the Kubernetes code (102), and nothing is left.
pub fn status_refused_after_the_event_undoes_and_warns(node: &Node<'_>) -> Result<()> {
    let f = Faulty::new(node)?;
    let args = f.pod("refused")?;
    let ns = Netns::new();
    f.proxy.fail_next(
        1,
        403,
        RequestMatcher::method("PATCH").and_path("/pods/refused/status"),
    );
    let r = f.call("ADD", "refused", &ns.path(), &args);
    f.proxy.clear_failures();
    ensure!(r.code != 0 && r.out["code"] == 102, "{}", r.out);
    let msg = r.out["msg"].as_str().unwrap_or("");
    ensure!(
        msg.contains("pod db/refused: cannot write the network-status annotation"),
        "{}",
        r.out
    );
    ensure!(ns.links() == ["lo"], "only lo is left: {:?}", ns.links());
    // Events are posted in the background of the answer: give them a moment to land.
    let mut events = Vec::new();
    for _ in 0..50 {
        events = node.events("db", "refused")?;
        if events.iter().any(|e| e["reason"] == "AddInterfaceFailed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let has = |ty: &str, reason: &str| {
        events
            .iter()
            .any(|e| e["type"] == ty && e["reason"] == reason)
    };
    ensure!(has("Normal", "AddedInterface"), "{events:?}");
    let warning = events
        .iter()
        .find(|e| e["reason"] == "AddInterfaceFailed")
        .context("no AddInterfaceFailed event")?;
    ensure!(warning["type"] == "Warning", "{warning}");
    ensure!(
        warning["message"]
            .as_str()
            .unwrap_or("")
            .contains("removing the interfaces"),
        "{warning}"
    );
    let left = node.leftovers();
    ensure!(left.is_empty(), "{left:?}");
    f.del_all_and_ensure_clean("refused", &ns, &args)
}
