//! Live diagnostics (issue 38) with the real `plexus` binary: `plexus state` over a state
//! directory made by real ADDs (Debian's plugins in real network namespaces, pods and NADs in
//! the stand-in API server), cross-checked with a stand-in runtime's CRI sandbox list; `plexus
//! explain --pod` against the same API; JSON log lines and the per-module filter.

mod common;
#[path = "diagnostics/fake_cri.rs"]
mod fake_cri;

use common::*;
use plexus_e2e::{nad_policy_allowing, Access, TestApiServer, TestApiServerOptions};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// The node's API token: it must appear in no output and no log line.
const TOKEN: &str = "diag-token-5f1c9a7e2b";

struct Node {
    api: TestApiServer,
    dir: tempfile::TempDir,
    bridge: HostLink,
    master: HostLink,
}

impl Node {
    fn new() -> Node {
        let api = TestApiServer::start(TestApiServerOptions::default()).unwrap();
        api.add_token(TOKEN, Access::Full);
        let dir = tempfile::tempdir().unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"), TOKEN)
            .unwrap();
        api.put_namespace("db").unwrap();
        let node = Node {
            api,
            dir,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
        };
        std::fs::write(node.path("plexus.conflist"), node.config().to_string()).unwrap();
        node
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn config(&self) -> Value {
        json!({"cniVersion":"1.0.0","name":"plexus-net","type":"plexus",
            "kubeconfig": self.path("kubeconfig"), "cniDir": self.path("state"), "binDir": CNI_BIN,
            "deviceInfoDir": self.path("devinfo"),
            "logLevel":"debug", "logFile": self.path("plexus.log"), "logToStderr": false,
            "reconcileGraceSeconds": 0,
            "delegates":[flannel_like(&self.bridge.0, 91, &self.path("ipam"))],
            "nadPolicy": nad_policy_allowing(&[self.dir.path()])})
    }

    fn nad(&self, name: &str, ipam: Value) {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":self.master.0,"mode":"bridge","ipam":ipam});
        self.api.put_nad("db", name, &cfg.to_string(), &[]).unwrap();
    }

    fn pod(&self, name: &str, networks: &str) -> String {
        let uid = format!("uid-{name}");
        self.api
            .put_pod(json!({"metadata":{"name":name,"namespace":"db","uid":uid,
                "annotations":{NETWORKS: networks}},"spec":{"containers":[{"name":"c","image":"x"}]}}))
            .unwrap();
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={name};K8S_POD_UID={uid}")
    }

    fn cni(
        &self,
        command: &str,
        cid: &str,
        netns: &Netns,
        args: &str,
        env: &[(&str, &str)],
    ) -> Run {
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
            env,
        )
    }

    /// `plexus ARGS… --config <the node's conflist>`: exit code, stdout, stderr.
    fn plexus(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(bin("plexus"))
            .args(args)
            .arg("--config")
            .arg(self.path("plexus.conflist"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .unwrap();
        let (o, e) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(
            !o.contains(TOKEN) && !e.contains(TOKEN),
            "the token was printed: {o}{e}"
        );
        (out.status.code().unwrap_or(-1), o, e)
    }

    fn plexus_json(&self, args: &[&str]) -> (i32, Value) {
        let (code, out, err) = self.plexus(args);
        let v = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out} / {err}"));
        (code, v)
    }
}

/// Every file under `dir` with its size and mtime (what "read-only" must leave unchanged).
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let m = e.metadata().unwrap();
        if m.is_dir() {
            out.extend(snapshot(&e.path()));
        } else {
            out.push((e.path(), m.len(), m.modified().unwrap()));
        }
    }
    out.sort();
    out
}

/// Two pods attached by real ADDs; the runtime then lists only the first (the second's sandbox
/// was lost without a DEL: a leaked attachment). `plexus state` lists both plans with their
/// networks and addresses' result caches, flags exactly the second as a leftover naming its
/// pod, changes nothing, and without a reachable runtime says it did not cross-check and
/// flags no plan.
#[test]
fn state_lists_real_adds_and_flags_the_leaked_sandbox() {
    let node = Node::new();
    node.nad("data", json!({"type":"host-local","dataDir":node.path("ipam"),"ranges":[[{"subnet":"10.91.7.0/24"}]]}));
    let (a, b) = (Netns::new(), Netns::new());
    let (cid_a, cid_b) = (uniq("diag-live"), uniq("diag-leak"));
    let args_a = node.pod("pg-0", "data");
    let args_b = node.pod("pg-1", "data");
    node.cni("ADD", &cid_a, &a, &args_a, &[]).ok();
    node.cni("ADD", &cid_b, &b, &args_b, &[]).ok();

    let sock = node.path("cri.sock");
    let cri = fake_cri::FakeCri::start(&sock, &[&cid_a]);
    let before = snapshot(&node.path("state"));
    let endpoint = format!("unix://{}", sock.display());
    let (code, v) = node.plexus_json(&["state", "--json", "--runtime-endpoint", &endpoint]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["runtime"]["crossChecked"], true, "{}", v["runtime"]);
    assert_eq!(v["runtime"]["sandboxes"], 1);
    let plans = v["plans"].as_array().unwrap();
    assert_eq!(plans.len(), 2, "{v:#}");
    let plan = |cid: &str| {
        plans
            .iter()
            .find(|p| p["containerId"] == cid)
            .unwrap()
            .clone()
    };
    assert_eq!(plan(&cid_a)["sandbox"], "live");
    assert_eq!(plan(&cid_a)["pod"], "db/pg-0");
    assert_eq!(plan(&cid_b)["sandbox"], "gone");
    let plan_b = plan(&cid_b);
    let nets: Vec<(&str, &str)> = plan_b["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["interface"].as_str().unwrap(),
                a["network"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(nets[1], ("net1", "db/data"), "{nets:?}");
    // One result cache per delegate network of each ADD, tied to its plan.
    let caches = v["resultCaches"].as_array().unwrap();
    assert!(
        caches
            .iter()
            .filter(|c| c["containerId"] == cid_b.as_str() && c["hasPlan"] == true)
            .count()
            >= 2,
        "{caches:?}"
    );
    let left = v["leftovers"].as_array().unwrap();
    assert_eq!(left.len(), 1, "{left:#?}");
    assert_eq!(left[0]["kind"], "plan");
    assert_eq!(left[0]["containerId"], cid_b.as_str());
    assert_eq!(left[0]["pod"], "db/pg-1");
    assert!(
        left[0]["why"].as_str().unwrap().contains("sandbox gone"),
        "{left:?}"
    );
    // The text a person reads names the same.
    let (code, text, _) = node.plexus(&["state", "--runtime-endpoint", &endpoint]);
    assert_eq!(code, 0);
    assert!(
        text.contains("LEFTOVERS (1)") && text.contains("pod db/pg-1"),
        "{text}"
    );
    assert!(
        text.contains("sandbox GONE") && text.contains("sandbox live"),
        "{text}"
    );
    drop(cri);

    // No runtime answering: nothing is called gone.
    let (code, v) = node.plexus_json(&["state", "--json", "--runtime-endpoint", &endpoint]);
    assert_eq!(code, 0);
    assert_eq!(v["runtime"]["crossChecked"], false);
    assert!(
        v["runtime"]["note"]
            .as_str()
            .unwrap()
            .starts_with("runtime not reachable, not cross-checked"),
        "{v}"
    );
    assert!(
        v["leftovers"].as_array().unwrap().is_empty(),
        "{:#}",
        v["leftovers"]
    );
    assert_eq!(
        snapshot(&node.path("state")),
        before,
        "plexus state changed the state directory"
    );

    node.cni("DEL", &cid_a, &a, &args_a, &[]).ok();
    node.cni("DEL", &cid_b, &b, &args_b, &[]).ok();
    let (_, v) = node.plexus_json(&["state", "--json", "--runtime-endpoint", "none"]);
    assert!(v["plans"].as_array().unwrap().is_empty(), "{v:#}");
}

/// `plexus explain --pod` reads the pod and its NADs from the API with the node's config:
/// a missing NAD and a NAD the node's policy refuses give the exact CNI error ADD returns (the
/// refusal with its class), a good one the plan, and after its ADD the saved plan and the
/// network-status ADD wrote.
#[test]
fn explain_pod_says_what_add_does_and_why_it_fails() {
    let node = Node::new();
    node.nad("data", json!({"type":"host-local","dataDir":node.path("ipam"),"ranges":[[{"subnet":"10.91.8.0/24"}]]}));
    node.nad("outside", json!({"type":"host-local","dataDir":"/var/lib/cni/diag-outside","ranges":[[{"subnet":"10.91.9.0/24"}]]}));

    // A NAD that does not exist.
    let args = node.pod("missing", "nope");
    let (code, v) = node.plexus_json(&["explain", "--pod", "db/missing", "--json"]);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(v["failure"]["stage"], "plan", "{v:#}");
    let netns = Netns::new();
    let add = node.cni("ADD", &uniq("diag-miss"), &netns, &args, &[]);
    assert_eq!(
        v["failure"]["code"],
        add.err()["code"],
        "{v:#} vs {}",
        add.out
    );
    assert_eq!(v["failure"]["msg"], add.err()["msg"]);
    assert!(
        v["failure"]["msg"]
            .as_str()
            .unwrap()
            .contains("network db/nope"),
        "{v}"
    );

    // A NAD the node's policy refuses: the same error as ADD, with the class.
    let args = node.pod("refused", "outside");
    let (code, v) = node.plexus_json(&["explain", "--pod", "db/refused", "--json"]);
    assert_eq!(code, 1);
    assert_eq!(v["failure"]["stage"], "nadPolicy", "{v:#}");
    assert_eq!(v["failure"]["class"], "paths/data", "{v:#}");
    let add = node.cni("ADD", &uniq("diag-ref"), &netns, &args, &[]);
    assert_eq!(
        v["failure"]["msg"],
        add.err()["msg"],
        "{v:#} vs {}",
        add.out
    );
    assert_eq!(v["failure"]["details"], add.err()["details"]);
    let (_, text, _) = node.plexus(&["explain", "--pod", "db/refused"]);
    assert!(
        text.contains("ADD FAILS at nadPolicy") && text.contains("NAD policy class: paths/data"),
        "{text}"
    );

    // A good one: the plan, then what the ADD did.
    let args = node.pod("good", "data");
    let (code, v) = node.plexus_json(&["explain", "--pod", "db/good", "--json"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["verdict"], "ok");
    assert_eq!(v["plan"]["attachments"][1]["network"], "db/data");
    assert_eq!(
        v["plan"]["attachments"][1]["delegates"][0]["type"],
        "macvlan"
    );
    assert!(v["saved"].as_array().unwrap().is_empty());
    let good = Netns::new();
    let cid = uniq("diag-good");
    node.cni("ADD", &cid, &good, &args, &[]).ok();
    let (code, v) = node.plexus_json(&["explain", "--pod", "db/good", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v["saved"][0]["containerId"], cid.as_str(), "{v:#}");
    assert_eq!(v["saved"][0]["podUid"], "uid-good");
    let status = v["networkStatus"].as_array().expect("network-status");
    let net1 = status
        .iter()
        .find(|s| s["interface"] == "net1")
        .expect("net1 in status");
    let addr = good.addrs("net1");
    assert!(
        addr.iter()
            .any(|a| a.starts_with(net1["ips"][0].as_str().unwrap())),
        "{net1} vs {addr:?}"
    );
    node.cni("DEL", &cid, &good, &args, &[]).ok();

    // A pod that does not exist.
    let (code, v) = node.plexus_json(&["explain", "--pod", "db/ghost", "--json"]);
    assert_eq!(
        (code, v["found"].clone(), v["failure"]["stage"].clone()),
        (1, json!(false), json!("pod"))
    );
}

/// `PLEXUS_LOG_FORMAT=json`: every line of the log file is a JSON object with level, target and
/// fields, and the API token reaches no line even at `trace` for every module (the HTTP client
/// included); `PLEXUS_LOG` filters per module: `warn,plexus_meta::plugin=info` keeps the
/// plugin's closing lines and drops every debug line.
#[test]
fn json_log_lines_parse_filter_per_module_and_carry_no_token() {
    let node = Node::new();
    node.nad("data", json!({"type":"host-local","dataDir":node.path("ipam"),"ranges":[[{"subnet":"10.91.10.0/24"}]]}));
    let args = node.pod("logged", "data");
    let netns = Netns::new();
    let cid = uniq("diag-log");
    let parse = |text: &str| -> Vec<Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    };
    node.cni(
        "ADD",
        &cid,
        &netns,
        &args,
        &[("PLEXUS_LOG_FORMAT", "json"), ("PLEXUS_LOG", "trace")],
    )
    .ok();
    let log = std::fs::read_to_string(node.path("plexus.log")).unwrap();
    assert!(!log.contains(TOKEN), "the token reached the log");
    let lines = parse(&log);
    for l in &lines {
        assert!(
            l["level"].is_string() && l["target"].is_string() && l["fields"].is_object(),
            "{l}"
        );
    }
    let called = lines
        .iter()
        .find(|l| l["fields"]["message"] == "plexus called")
        .unwrap_or_else(|| panic!("no debug line 'plexus called': {log}"));
    assert_eq!(
        (called["level"].as_str(), called["target"].as_str()),
        (Some("DEBUG"), Some("plexus_meta::plugin"))
    );
    assert_eq!(called["fields"]["container"], cid.as_str());
    // Every module logged: plexus' own debug lines from several of them.
    let targets: std::collections::BTreeSet<&str> = lines
        .iter()
        .filter(|l| l["level"] == "DEBUG")
        .filter_map(|l| l["target"].as_str())
        .collect();
    assert!(targets.len() >= 2, "{targets:?}");

    let seen = log.len();
    node.cni(
        "DEL",
        &cid,
        &netns,
        &args,
        &[
            ("PLEXUS_LOG_FORMAT", "json"),
            ("PLEXUS_LOG", "warn,plexus_meta::plugin=info"),
        ],
    )
    .ok();
    let log = std::fs::read_to_string(node.path("plexus.log")).unwrap();
    assert!(!log.contains(TOKEN), "the token reached the log");
    let lines = parse(&log[seen..]);
    for l in &lines {
        let (target, level) = (l["target"].as_str().unwrap(), l["level"].as_str().unwrap());
        assert!(
            matches!(level, "WARN" | "ERROR")
                || (target.starts_with("plexus_meta::plugin") && level == "INFO"),
            "a line the filter should have dropped: {l}"
        );
    }
    let done: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "DEL done")
        .collect();
    assert_eq!(done.len(), 1, "{}", &log[seen..]);
    assert_eq!(done[0]["fields"]["container"], cid.as_str());
}

/// The config's `logFormat: json` (what the thin plugin reads: the runtime gives it no
/// environment of ours) makes every line of the call's log a JSON object; an unknown value logs
/// as text with a warning naming it, and the call still succeeds.
#[test]
fn the_configs_log_format_selects_json_and_an_unknown_one_warns() {
    let node = Node::new();
    node.nad("data", json!({"type":"host-local","dataDir":node.path("ipam"),"ranges":[[{"subnet":"10.91.11.0/24"}]]}));
    for (format, json_lines) in [("json", true), ("yaml", false)] {
        let args = node.pod(&format!("fmt-{format}"), "data");
        let netns = Netns::new();
        let cid = uniq("diag-fmt");
        let log = node.path(&format!("plexus-{format}.log"));
        let mut cfg = node.config();
        cfg["logFormat"] = json!(format);
        cfg["logFile"] = json!(log);
        cfg["logLevel"] = json!("info");
        let netns_path = netns.path();
        let call = |command| Call {
            command,
            container_id: &cid,
            netns: &netns_path,
            ifname: "eth0",
            args: &args,
        };
        run(&bin("plexus"), &call("ADD"), &cfg, &[]).ok();
        let text = std::fs::read_to_string(&log).unwrap();
        let parsed: Vec<Option<Value>> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .filter(Value::is_object)
            })
            .collect();
        assert!(!parsed.is_empty(), "{format}: no log line");
        if json_lines {
            assert!(parsed.iter().all(Option::is_some), "not all JSON: {text}");
            assert!(
                parsed
                    .iter()
                    .flatten()
                    .any(|l| l["fields"]["message"] == "ADD done"),
                "{text}"
            );
        } else {
            assert!(
                parsed.iter().all(Option::is_none),
                "JSON for {format}: {text}"
            );
            assert!(
                text.lines().any(|l| l.contains("WARN")
                    && l.contains("unknown logFormat")
                    && l.contains("yaml")),
                "no warning naming the value: {text}"
            );
        }
        run(&bin("plexus"), &call("DEL"), &cfg, &[]).ok();
    }
}
