//! plexus static mode (Multus' `delegates`, no Kubernetes): three networks attached, checked and
//! removed with the Debian plugins, and every user-visible error path of the binary.

mod common;

use common::*;
use plexus_e2e::nad_policy_allowing;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

struct Setup {
    dir: tempfile::TempDir,
    bridge: HostLink,
    master: HostLink,
}

impl Setup {
    fn new() -> Setup {
        Setup {
            dir: tempfile::tempdir().unwrap(),
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
        }
    }
    fn p(&self, s: &str) -> String {
        self.dir.path().join(s).display().to_string()
    }
    fn config(&self, version: &str, extra: Vec<Value>) -> Value {
        let mut delegates = vec![
            flannel_like(&self.bridge.0, 41, Path::new(&self.p("ipam"))),
            json!({"cniVersion":"0.3.1","name":"data","type":"macvlan","master":self.master.0,"mode":"bridge",
                   "ipam":{"type":"static","addresses":[{"address":"10.141.0.10/24","gateway":"10.141.0.1"}],"routes":[{"dst":"10.199.0.0/16","gw":"10.141.0.1"}]}}),
            json!({"cniVersion":"0.4.0","name":"ptpnet","type":"ptp","ipMasq":false,
                   "ipam":{"type":"host-local","dataDir":self.p("ipam"),"ranges":[[{"subnet":"10.142.0.0/24"}]]}}),
        ];
        delegates.extend(extra);
        json!({"cniVersion":version,"name":"plexus-static","type":"plexus","cniDir":self.p("state"),"binDir":self.p("bin"),
               "logFile":self.p("plexus.log"),"logLevel":"debug","logToStderr":false,"delegateTimeoutSeconds":2,
               "delegates":delegates,"nadPolicy":nad_policy_allowing(&[self.dir.path()])})
    }
    fn script(&self, name: &str, body: &str) {
        std::fs::create_dir_all(self.p("bin")).unwrap();
        let path = self.dir.path().join("bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    fn call(&self, command: &str, ns: &str, cfg: &Value) -> Run {
        run(
            &bin("plexus"),
            &Call {
                command,
                container_id: "static-1",
                netns: ns,
                ifname: "eth0",
                args: "",
            },
            cfg,
            &[],
        )
    }
    fn leftovers(&self) -> Vec<String> {
        let mut v = files_under(&self.dir.path().join("state"));
        v.extend(files_under(&self.dir.path().join("ipam")));
        v
    }
}

#[test]
fn attaches_three_networks_and_removes_them_leaving_nothing() {
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let s = Setup::new();
        let ns = Netns::new();
        let cfg = s.config(version, vec![]);
        let out = s.call("ADD", &ns.path(), &cfg).ok().clone();
        // The default network's result, in the caller's version.
        assert_eq!(out["cniVersion"], version);
        let ip0 = &out["ips"][0];
        assert!(
            ip0["address"].as_str().unwrap().starts_with("10.244.41."),
            "{out}"
        );
        assert_eq!(
            ip0.get("version").is_some(),
            version.starts_with("0."),
            "{version}: {out}"
        );
        let mut links = ns.links();
        links.sort();
        assert_eq!(links, vec!["eth0", "lo", "net1", "net2"]);
        assert_eq!(ns.addrs("net1"), vec!["10.141.0.10/24"]);
        assert!(ns.addrs("net2")[0].starts_with("10.142.0."));
        let routes = ns.routes();
        assert!(
            routes.contains("default via 10.244.41.1 dev eth0"),
            "{routes}"
        );
        assert!(
            routes.contains("10.199.0.0/16 via 10.141.0.1 dev net1"),
            "{routes}"
        );
        // CHECK skips the 0.3.1 network (no CHECK before 0.4.0) and checks the others.
        s.call("CHECK", &ns.path(), &cfg).ok();
        // A second ADD for the same container changes nothing and is refused.
        let again = s.call("ADD", &ns.path(), &cfg);
        assert_eq!(again.err()["code"], 7, "{version}");
        assert_eq!(
            ns.links().len(),
            4,
            "{version}: the first ADD's interfaces stay"
        );
        s.call("DEL", &ns.path(), &cfg).ok();
        assert_eq!(ns.links(), vec!["lo"]);
        assert!(s.leftovers().is_empty(), "{version}: {:?}", s.leftovers());
        s.call("DEL", &ns.path(), &cfg).ok();
        s.call("DEL", "", &cfg).ok();
    }
}

#[test]
fn cache_missing_del_still_releases_leases() {
    let s = Setup::new();
    let ns = Netns::new();
    let cfg = s.config("1.0.0", vec![]);
    s.call("ADD", &ns.path(), &cfg).ok();
    std::fs::remove_dir_all(s.dir.path().join("state")).unwrap();
    ns.delete();
    s.call("DEL", "", &cfg).ok();
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
}

#[test]
fn failure_midway_rolls_back_everything() {
    let s = Setup::new();
    let ns = Netns::new();
    s.script("failer", r#"cat >/dev/null; if [ "$CNI_COMMAND" = ADD ]; then echo '{"code":11,"msg":"backend busy","details":"try later"}'; exit 1; fi"#);
    let cfg = s.config(
        "1.0.0",
        vec![json!({"cniVersion":"1.0.0","name":"flaky","type":"failer"})],
    );
    let e = s.call("ADD", &ns.path(), &cfg).err().clone();
    assert_eq!(e["code"], 11, "the delegate's code is kept: {e}");
    assert!(
        e["msg"].as_str().unwrap().contains("network flaky (net3)"),
        "{e}"
    );
    assert!(e["msg"].as_str().unwrap().contains("backend busy"), "{e}");
    assert_eq!(ns.links(), vec!["lo"], "rolled back");
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
    s.call("DEL", &ns.path(), &cfg).ok();
}

#[test]
fn error_paths_have_exact_codes_and_name_the_cause() {
    let s = Setup::new();
    let ns = Netns::new();
    s.script("garbage", "cat >/dev/null; echo 'this is not json'");
    s.script("hang", "cat >/dev/null; sleep 30");
    let one = |t: &str| {
        s.config("1.0.0", vec![])
            .as_object()
            .unwrap()
            .clone()
            .into_iter()
            .map(|(k, v)| {
                if k == "delegates" {
                    (k, json!([{"cniVersion":"1.0.0","name":"only","type":t}]))
                } else {
                    (k, v)
                }
            })
            .collect::<serde_json::Map<_, _>>()
    };
    let cases: Vec<(&str, Value, i64, &str)> = vec![
        (
            "not found",
            Value::Object(one("no-such-plugin")),
            7,
            "no-such-plugin",
        ),
        ("escape", Value::Object(one("../../../bin/sh")), 7, "type"),
        ("garbage", Value::Object(one("garbage")), 6, "garbage"),
        ("hang", Value::Object(one("hang")), 101, "hang"),
        ("version", s.config("9.9.9", vec![]), 1, "9.9.9"),
    ];
    for (what, cfg, code, needle) in cases {
        let started = std::time::Instant::now();
        let e = s.call("ADD", &ns.path(), &cfg).err().clone();
        assert_eq!(e["code"], code, "{what}: {e}");
        let text = format!("{} {}", e["msg"], e["details"]);
        assert!(text.contains(needle), "{what}: {e}");
        assert!(started.elapsed().as_secs() < 10, "{what} took too long");
        assert_eq!(ns.links(), vec!["lo"], "{what}");
        if what == "hang" {
            // The rollback DEL hung too: the plan is kept so that the runtime's DEL retries.
            assert_eq!(
                s.leftovers(),
                vec!["locks/static-1.lock", "plans/static-1-eth0.json"]
            );
            s.script("hang", "cat >/dev/null");
            s.call("DEL", &ns.path(), &cfg).ok();
        }
        assert!(s.leftovers().is_empty(), "{what}: {:?}", s.leftovers());
    }
    // Environment and stdin problems.
    let cfg = s.config("1.0.0", vec![]);
    let bad_if = run(
        &bin("plexus"),
        &Call {
            command: "ADD",
            container_id: "c",
            netns: &ns.path(),
            ifname: "a/b",
            args: "",
        },
        &cfg,
        &[],
    );
    assert_eq!(bad_if.err()["code"], 4);
    let no_cid = run(
        &bin("plexus"),
        &Call {
            command: "ADD",
            container_id: "",
            netns: &ns.path(),
            ifname: "eth0",
            args: "",
        },
        &cfg,
        &[],
    );
    assert!(no_cid.err()["msg"]
        .as_str()
        .unwrap()
        .contains("CNI_CONTAINERID"));
    let malformed = run(
        &bin("plexus"),
        &Call {
            command: "ADD",
            container_id: "c",
            netns: &ns.path(),
            ifname: "eth0",
            args: "",
        },
        &json!("just a string"),
        &[],
    );
    assert_eq!(malformed.err()["code"], 6);
    let bad_netns = s.call("ADD", "/run/netns/plexus-does-not-exist", &cfg);
    assert_eq!(bad_netns.err()["code"], 3);
    assert_eq!(ns.links(), vec!["lo"]);
}

#[test]
fn version_status_and_about() {
    let s = Setup::new();
    let v = run(
        &bin("plexus"),
        &Call {
            command: "VERSION",
            container_id: "",
            netns: "",
            ifname: "",
            args: "",
        },
        &json!({"cniVersion":"1.1.0"}),
        &[],
    );
    assert_eq!(v.ok()["supportedVersions"].as_array().unwrap().len(), 7);
    let mut cfg = s.config("1.1.0", vec![]);
    s.call("STATUS", "", &cfg).ok();
    cfg["readinessindicatorfile"] = json!(s.p("ready"));
    assert_eq!(s.call("STATUS", "", &cfg).err()["code"], 50);
    std::fs::write(s.p("ready"), "").unwrap();
    s.call("STATUS", "", &cfg).ok();
}

#[test]
fn status_on_a_1_1_0_conflist_with_debian_portmap_names_the_plugin_and_its_versions() {
    let s = Setup::new();
    // A 1.1.0 plugin that is ready, then Debian's portmap (CNI up to 1.0.0).
    s.script(
        "ready11",
        r#"cat >/dev/null; [ "$CNI_COMMAND" = VERSION ] && echo '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}'; exit 0"#,
    );
    let mut cfg = s.config("1.1.0", vec![]);
    cfg["delegates"][0] = json!({"cniVersion":"1.1.0","name":"pm11","plugins":[
        {"type":"ready11"},{"type":"portmap","capabilities":{"portMappings":true}}]});
    let e = s.call("STATUS", "", &cfg).err().clone();
    assert_eq!(e["code"], 1, "{e}");
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("pm11") && msg.contains("plugin portmap") && msg.contains("STATUS"),
        "{e}"
    );
    let details = e["details"].as_str().unwrap();
    assert!(details.contains("0.4.0, 1.0.0"), "{e}");
    assert!(!e.to_string().contains("containerID"), "{e}");
    // Written at 1.0.0 the network is not sent STATUS (libcni's rule): ready.
    cfg["delegates"][0]["cniVersion"] = json!("1.0.0");
    s.call("STATUS", "", &cfg).ok();
    // GC with a portmap at 1.1.0 reports the same cause and still GCs the rest.
    cfg["delegates"][0]["cniVersion"] = json!("1.1.0");
    cfg["cni.dev/valid-attachments"] = json!([]);
    let e = s.call("GC", "", &cfg).err().clone();
    assert!(
        e.to_string().contains("plugin portmap") && e.to_string().contains("GC"),
        "{e}"
    );
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
}

#[test]
fn failing_delegate_del_is_retried_then_given_up() {
    let s = Setup::new();
    let ns = Netns::new();
    s.script("stubborn", r#"cat >/dev/null; case "$CNI_COMMAND" in ADD) echo '{"cniVersion":"1.0.0"}';; DEL) echo '{"code":999,"msg":"backend down"}'; exit 1;; esac"#);
    let cfg = s.config(
        "1.0.0",
        vec![json!({"cniVersion":"1.0.0","name":"stub","type":"stubborn"})],
    );
    s.call("ADD", &ns.path(), &cfg).ok();
    for attempt in 1..super_max() {
        let e = s.call("DEL", &ns.path(), &cfg).err().clone();
        assert!(
            e["msg"].as_str().unwrap().contains("backend down"),
            "{attempt}: {e}"
        );
        assert!(
            s.leftovers().iter().any(|f| f.starts_with("plans/")),
            "{attempt}: plan kept for the retry"
        );
    }
    // The other networks were deleted on the first attempt. Three failures within the time
    // floor: still failing, so the runtime keeps retrying (an API outage must not leak).
    assert_eq!(ns.links(), vec!["lo"]);
    let e = s.call("DEL", &ns.path(), &cfg).err().clone();
    assert!(e["msg"].as_str().unwrap().contains("backend down"), "{e}");
    // The first failure 6 minutes ago: the next failing attempt gives up.
    let plan = s
        .leftovers()
        .into_iter()
        .find(|f| f.starts_with("plans/"))
        .expect("plan kept");
    let path = s.dir.path().join("state").join(&plan);
    let mut saved: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(saved["delFailures"], 3, "{saved}");
    let first = saved["firstDelFailure"]
        .as_u64()
        .expect("first failure recorded");
    saved["firstDelFailure"] = json!(first - 360);
    std::fs::write(&path, saved.to_string()).unwrap();
    s.call("DEL", &ns.path(), &cfg).ok();
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
    s.call("DEL", "", &cfg).ok();
}

fn super_max() -> u32 {
    3
}

#[test]
fn multus_thin_config_with_nameless_delegates_works_unchanged() {
    // As Multus accepts it: delegates without "name". Each is known by its first plugin's type.
    let s = Setup::new();
    let ns = Netns::new();
    let mut cfg = s.config("1.0.0", vec![]);
    let bridge = HostLink::bridge_name();
    cfg["delegates"] = json!([
        {"cniVersion":"1.0.0","type":"bridge","bridge":bridge.0,"isGateway":true,
         "ipam":{"type":"host-local","dataDir":s.p("ipam"),"ranges":[[{"subnet":"10.143.0.0/24"}]]}},
        {"cniVersion":"1.0.0","type":"macvlan","master":s.master.0,"mode":"bridge",
         "ipam":{"type":"host-local","dataDir":s.p("ipam"),"ranges":[[{"subnet":"10.144.0.0/24"}]]}}
    ]);
    let out = s.call("ADD", &ns.path(), &cfg).ok().clone();
    assert!(
        out["ips"][0]["address"]
            .as_str()
            .unwrap()
            .starts_with("10.143.0."),
        "{out}"
    );
    let mut links = ns.links();
    links.sort();
    assert_eq!(links, vec!["eth0", "lo", "net1"]);
    // host-local keeps its leases under the derived network name.
    let mut left = s.leftovers();
    left.retain(|f| !f.starts_with("plans/"));
    assert!(
        left.contains(&"results/bridge-static-1-eth0".to_string()),
        "{left:?}"
    );
    assert!(
        left.contains(&"results/macvlan-static-1-net1".to_string()),
        "{left:?}"
    );
    assert!(
        left.iter().any(|f| f.starts_with("bridge/10.143.0.")),
        "{left:?}"
    );
    s.call("CHECK", &ns.path(), &cfg).ok();
    s.call("DEL", &ns.path(), &cfg).ok();
    assert_eq!(ns.links(), vec!["lo"]);
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
}

#[test]
fn del_after_an_add_that_ran_nothing_succeeds_at_once_and_leaves_nothing() {
    let s = Setup::new();
    let ns = Netns::new();
    let cfg = s.config(
        "1.0.0",
        vec![json!({"cniVersion":"1.0.0","name":"gone","type":"not-installed"})],
    );
    let e = s.call("ADD", &ns.path(), &cfg).err().clone();
    assert_eq!(e["code"], 7, "{e}");
    assert_eq!(ns.links(), vec!["lo"]);
    // The runtime's DELs: the first one already succeeds, with and without a netns.
    s.call("DEL", &ns.path(), &cfg).ok();
    s.call("DEL", "", &cfg).ok();
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
    assert!(
        !s.dir.path().join("state/locks/static-1.lock").exists(),
        "lock file left"
    );
}

#[test]
fn an_empty_netns_del_before_the_netns_del_still_removes_the_links() {
    let s = Setup::new();
    let ns = Netns::new();
    let cfg = s.config("1.0.0", vec![]);
    s.call("ADD", &ns.path(), &cfg).ok();
    // The runtime's empty-netns DEL wins the race: plexus uses the netns recorded at ADD.
    s.call("DEL", "", &cfg).ok();
    assert_eq!(ns.links(), vec!["lo"]);
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
    s.call("DEL", &ns.path(), &cfg).ok();
}

#[test]
fn a_del_that_knew_no_netns_does_not_stop_the_one_that_has_it() {
    let s = Setup::new();
    let ns = Netns::new();
    let cfg = s.config("1.0.0", vec![]);
    s.call("ADD", &ns.path(), &cfg).ok();
    // Every record of the container is lost: the empty-netns DEL can only release IPAM.
    std::fs::remove_dir_all(s.dir.path().join("state")).unwrap();
    s.call("DEL", "", &cfg).ok();
    assert_eq!(ns.links().len(), 4, "out of reach without a netns");
    s.call("DEL", &ns.path(), &cfg).ok();
    assert_eq!(ns.links(), vec!["lo"]);
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
}

#[test]
fn an_unwritable_state_dir_is_code_5_and_del_still_cleans_up() {
    let s = Setup::new();
    let ns = Netns::new();
    let cfg = s.config("1.0.0", vec![]);
    std::fs::create_dir_all(s.p("state")).unwrap();
    let ro = with_read_only_dir(s.dir.path(), &bin("plexus"), &s.dir.path().join("state"));
    let call_ro = |command: &str, netns: &str| {
        run(
            &ro,
            &Call {
                command,
                container_id: "static-1",
                netns,
                ifname: "eth0",
                args: "",
            },
            &cfg,
            &[],
        )
    };
    let e = call_ro("ADD", &ns.path()).err().clone();
    assert_eq!(e["code"], 5, "{e}");
    assert_eq!(ns.links(), vec!["lo"]);
    // A successful ADD, then the state dir turns read-only: DEL runs every delegate and
    // reports that it could not clear its own files.
    s.call("ADD", &ns.path(), &cfg).ok();
    let e = call_ro("DEL", &ns.path()).err().clone();
    assert_eq!(e["code"], 5, "{e}");
    assert!(
        e["msg"].as_str().unwrap().contains("networks deleted"),
        "{e}"
    );
    assert_eq!(ns.links(), vec!["lo"], "links removed");
    assert!(
        files_under(&s.dir.path().join("ipam")).is_empty(),
        "leases released"
    );
    // Once the directory is writable again the runtime's retry finishes the bookkeeping.
    s.call("DEL", "", &cfg).ok();
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
}

/// The bandwidth capability, seen by packets: plexus hands `runtimeConfig.bandwidth` to the
/// Debian `bandwidth` plugin chained after the default network's bridge, and a bounded TCP
/// transfer into the pod (ingress, shaped on the host side of its veth) and out of it (egress,
/// through the ifb) runs at the configured rate within ±20 %; after DEL the shaping is gone.
/// The bursts are small (64 KiB) so that the rate governs a 4 MB transfer.
#[test]
fn bandwidth_capability_shapes_a_bounded_transfer() {
    use std::time::Duration;
    const INGRESS: u64 = 16_000_000;
    const EGRESS: u64 = 8_000_000;
    const BURST: u64 = 64 * 1024 * 8;
    let s = Setup::new();
    let ns = Netns::new();
    let net = json!({"cniVersion":"1.0.0","name":"shaped","plugins":[
        {"type":"bridge","bridge":s.bridge.0,"isGateway":true,"ipMasq":false,
         "ipam":{"type":"host-local","dataDir":s.p("ipam"),"ranges":[[{"subnet":"10.243.7.0/24"}]]}},
        {"type":"bandwidth","capabilities":{"bandwidth":true}}]});
    let mut cfg = s.config("1.0.0", vec![]);
    cfg["delegates"] = json!([net]);
    cfg["capabilities"] = json!({"bandwidth": true});
    cfg["runtimeConfig"] = json!({"bandwidth":{"ingressRate":INGRESS,"ingressBurst":BURST,
        "egressRate":EGRESS,"egressBurst":BURST}});
    let out = s.call("ADD", &ns.path(), &cfg).ok().clone();
    let pod_ip = out["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .expect("pod address")
        .to_string();
    let pod_ns = std::path::PathBuf::from(ns.path());
    let measure = |into_pod: bool, bytes: usize| {
        let (server_ns, server, client_ns) = if into_pod {
            (Some(pod_ns.as_path()), format!("{pod_ip}:0"), None)
        } else {
            (None, "10.243.7.1:0".to_string(), Some(pod_ns.as_path()))
        };
        let took = transfer::timed(
            server_ns,
            server.parse().unwrap(),
            client_ns,
            bytes,
            Duration::from_secs(30),
        )
        .expect("transfer");
        transfer::bits_per_second(bytes, took)
    };
    let ingress = measure(true, 4_000_000);
    let egress = measure(false, 2_000_000);
    println!(
        "    shaped: into the pod {:.1} Mbit/s (rate {} Mbit/s), out of it {:.1} Mbit/s (rate {} Mbit/s)",
        ingress / 1e6,
        INGRESS / 1_000_000,
        egress / 1e6,
        EGRESS / 1_000_000
    );
    for (what, got, rate) in [("ingress", ingress, INGRESS), ("egress", egress, EGRESS)] {
        let ratio = got / rate as f64;
        assert!(
            (0.8..=1.2).contains(&ratio),
            "{what}: {:.2} Mbit/s against a rate of {} Mbit/s ({:.0} %)",
            got / 1e6,
            rate / 1_000_000,
            ratio * 100.0
        );
    }
    s.call("DEL", &ns.path(), &cfg).ok();
    // Unshaped again: the same transfer runs far above the rate (the veth is gone; a new ADD
    // without the capability shows the path itself is fast).
    cfg["runtimeConfig"] = json!({});
    let out = s.call("ADD", &ns.path(), &cfg).ok().clone();
    let pod_ip2 = out["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let took = transfer::timed(
        Some(pod_ns.as_path()),
        format!("{pod_ip2}:0").parse().unwrap(),
        None,
        4_000_000,
        Duration::from_secs(30),
    )
    .expect("transfer");
    let free = transfer::bits_per_second(4_000_000, took);
    println!("    unshaped: into the pod {:.0} Mbit/s", free / 1e6);
    assert!(
        free > 2.0 * INGRESS as f64,
        "without the bandwidth capability the transfer is still slow: {:.1} Mbit/s",
        free / 1e6
    );
    s.call("DEL", &ns.path(), &cfg).ok();
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
}
