//! The fault matrix, in one suite: every way the world around plexus can break during ADD or
//! between ADD and DEL — the NAD changed or deleted; the netns gone; a delegate missing,
//! crashing, hanging, printing garbage or nothing; plexus' state directory unwritable or full;
//! its files corrupt; plexus killed between two delegates. Each case asserts the exact CNI code
//! and what the message names, then the runtime's DELs, and that nothing leaked: no link in the
//! pod, no IPAM lease, no plan, no result-cache file. Real Debian plugins, real netns, the
//! stand-in API server. The API server slow, throttling, failing, down and back: on the real
//! apiserver behind a fault proxy (real_api, tests/real_api/faults.rs).

mod common;

use common::*;
use plexus_e2e::{nad_policy_allowing, Access, TestApiServer, TestApiServerOptions};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";

/// A node with the stand-in API server, a bridge default network and one macvlan NAD.
struct Node {
    api: TestApiServer,
    dir: tempfile::TempDir,
    bridge: HostLink,
    master: HostLink,
    octet: u8,
}

impl Node {
    fn new(octet: u8) -> Node {
        let api = TestApiServer::start(TestApiServerOptions::default()).unwrap();
        api.add_token("t", Access::Full);
        let dir = tempfile::tempdir().unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"), "t")
            .unwrap();
        api.put_namespace("db").unwrap();
        let node = Node {
            api,
            dir,
            bridge: HostLink::bridge_name(),
            master: HostLink::veth_master(),
            octet,
        };
        node.nad(&format!("10.{}.9.0/24", node.octet));
        node
    }

    fn p(&self, s: &str) -> PathBuf {
        self.dir.path().join(s)
    }

    fn nad(&self, subnet: &str) {
        let cfg = json!({"cniVersion":"1.0.0","type":"macvlan","master":self.master.0,"mode":"bridge",
            "ipam":{"type":"host-local","dataDir":self.p("ipam"),"ranges":[[{"subnet":subnet}]]}});
        self.api.put_nad("db", "mv", &cfg.to_string(), &[]).unwrap();
    }

    fn config(&self, extra: Value) -> Value {
        let mut c = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus","kubeconfig":self.p("kubeconfig"),
            "cniDir":self.p("state"),"binDir":self.p("bin"),"logFile":self.p("plexus.log"),"logLevel":"debug",
            "logToStderr":false,"delegateTimeoutSeconds":2,"podTimeoutMs":1500,
            "delegates":[flannel_like(&self.bridge.0, self.octet, &self.p("ipam"))],
            "nadPolicy":nad_policy_allowing(&[self.dir.path()])});
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }

    fn pod(&self, name: &str) -> String {
        let uid = format!("uid-{name}");
        self.api
            .put_pod(json!({"metadata":{"name":name,"namespace":"db","uid":uid,"annotations":{NETWORKS:"mv"}},
                "spec":{"containers":[{"name":"c","image":"x"}]}}))
            .unwrap();
        uid
    }

    fn call_with(
        &self,
        binary: &std::path::Path,
        cmd: &str,
        pod: &str,
        netns: &str,
        cfg: &Value,
    ) -> Run {
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"
        );
        run(
            binary,
            &Call {
                command: cmd,
                container_id: &format!("cid-{pod}"),
                netns,
                ifname: "eth0",
                args: &args,
            },
            cfg,
            &[],
        )
    }

    fn call(&self, cmd: &str, pod: &str, netns: &str) -> Run {
        self.call_with(&bin("plexus"), cmd, pod, netns, &self.config(json!({})))
    }

    /// A delegate script in `binDir`.
    fn script(&self, name: &str, body: &str) {
        std::fs::create_dir_all(self.p("bin")).unwrap();
        let path = self.p("bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// What is left of plexus' and the delegates' state (lock files and tombstones aside).
    fn leftovers(&self) -> Vec<String> {
        let mut v = files_under(&self.p("state"));
        v.extend(files_under(&self.p("ipam")));
        v.retain(|f| !f.starts_with("locks"));
        v
    }

    /// The runtime's three DELs (netns, then twice empty), then nothing is left.
    fn del_all_and_assert_clean(&self, pod: &str, ns: &Netns, what: &str) {
        self.call("DEL", pod, &ns.path()).ok();
        self.call("DEL", pod, "").ok();
        self.call("DEL", pod, "").ok();
        assert_eq!(ns.links(), vec!["lo"], "{what}: links left");
        assert!(
            self.leftovers().is_empty(),
            "{what}: left {:?}",
            self.leftovers()
        );
    }
}

/// `(code, msg + details)` of an error result.
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

#[test]
fn nad_changed_or_deleted_between_add_and_del() {
    let node = Node::new(64);
    for change in ["changed", "deleted"] {
        let pod = format!("nad-{change}");
        node.pod(&pod);
        let ns = Netns::new();
        node.call("ADD", &pod, &ns.path()).ok();
        match change {
            // Another subnet, another master: DEL must still undo what ADD did.
            "changed" => node.nad("10.199.199.0/24"),
            _ => assert!(node.api.delete_nad("db", "mv")),
        }
        node.del_all_and_assert_clean(&pod, &ns, change);
        node.nad(&format!("10.{}.9.0/24", node.octet));
    }
}

#[test]
fn netns_gone_before_del() {
    let node = Node::new(65);
    node.pod("gone");
    let ns = Netns::new();
    node.call("ADD", "gone", &ns.path()).ok();
    let path = ns.path();
    ns.delete();
    node.call("DEL", "gone", &path).ok();
    node.call("DEL", "gone", "").ok();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
}

/// A NAD whose plugin is a script in binDir.
fn scripted_nad(node: &Node, plugin: &str) {
    let cfg = json!({"cniVersion":"1.0.0","type":plugin});
    node.api.put_nad("db", "mv", &cfg.to_string(), &[]).unwrap();
}

#[test]
fn delegate_missing_crashing_hanging_garbage_or_silent() {
    let node = Node::new(66);
    // Crashes on ADD only (a DEL that keeps failing is given up after three attempts: the
    // static-mode suite covers it).
    node.script(
        "crasher",
        r#"cat >/dev/null; [ "$CNI_COMMAND" = ADD ] && kill -SEGV $$; exit 0"#,
    );
    node.script(
        "hanger",
        r#"cat >/dev/null; [ "$CNI_COMMAND" = ADD ] && sleep 30; exit 0"#,
    );
    node.script(
        "garbler",
        r#"cat >/dev/null; [ "$CNI_COMMAND" = ADD ] && echo '{not json'; exit 0"#,
    );
    node.script(
        "mute",
        r#"cat >/dev/null; [ "$CNI_COMMAND" = ADD ] && exit 0; exit 0"#,
    );
    let cases: [(&str, i64, &str); 5] = [
        ("not-installed", 7, "not-installed"),
        ("crasher", 100, "killed by signal 11 (SIGSEGV)"),
        ("hanger", 101, "hanger"),
        ("garbler", 6, "garbler"),
        ("mute", 100, "printed no result"),
    ];
    for (plugin, want, needle) in cases {
        scripted_nad(&node, plugin);
        let pod = format!("d-{plugin}");
        node.pod(&pod);
        let ns = Netns::new();
        let (code, msg) = error(&node.call("ADD", &pod, &ns.path()));
        assert_eq!(code, want, "{plugin}: {msg}");
        assert!(
            msg.contains(&format!("pod db/{pod}")) && msg.contains("db/mv") && msg.contains(needle),
            "{plugin}: {msg}"
        );
        // eth0 was rolled back: nothing for the runtime's DELs to do.
        assert_eq!(ns.links(), vec!["lo"], "{plugin}");
        node.del_all_and_assert_clean(&pod, &ns, plugin);
    }
}

#[test]
fn state_dir_full_is_an_io_failure_and_leaves_nothing() {
    let node = Node::new(67);
    node.pod("full");
    let ns = Netns::new();
    std::fs::create_dir_all(node.p("state")).unwrap();
    // plexus in a private mount namespace where cniDir is a full 64 KiB tmpfs.
    let wrapper = node.p("full-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec unshare -m --propagation private sh -c 'mount -t tmpfs -o size=64k tmpfs \"$1\" && dd if=/dev/zero of=\"$1/filler\" bs=4k count=64 2>/dev/null; exec \"$2\"' full {} {}\n",
            node.p("state").display(),
            bin("plexus").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, msg) =
        error(&node.call_with(&wrapper, "ADD", "full", &ns.path(), &node.config(json!({}))));
    assert_eq!(code, 5, "{msg}");
    assert!(
        msg.contains("pod db/full") || msg.contains("cid-full"),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("no space"), "{msg}");
    node.del_all_and_assert_clean("full", &ns, "full");
}

#[test]
fn corrupt_plan_and_result_files() {
    let node = Node::new(68);
    for what in ["plan", "result"] {
        let pod = format!("corrupt-{what}");
        node.pod(&pod);
        let ns = Netns::new();
        node.call("ADD", &pod, &ns.path()).ok();
        let victim = match what {
            "plan" => node.p(&format!("state/plans/cid-{pod}-eth0.json")),
            _ => node.p(&format!("state/results/mv-cid-{pod}-net1")),
        };
        assert!(victim.exists(), "{}", victim.display());
        std::fs::write(&victim, b"\x00\x01{trunc").unwrap();
        node.del_all_and_assert_clean(&pod, &ns, what);
    }
}

#[test]
fn plexus_killed_between_two_delegates_then_the_runtime_del() {
    let node = Node::new(69);
    // The second network's plugin kills plexus (its parent) with SIGKILL, as an OOM kill would.
    node.script(
        "killer",
        r#"cat >/dev/null; if [ "$CNI_COMMAND" = ADD ]; then kill -KILL $PPID; sleep 1; fi"#,
    );
    let cfg = json!({"cniVersion":"1.0.0","type":"killer"});
    node.api
        .put_nad("db", "killer", &cfg.to_string(), &[])
        .unwrap();
    node.api
        .put_pod(json!({"metadata":{"name":"killed","namespace":"db","uid":"uid-killed",
            "annotations":{NETWORKS:"mv,killer"}},"spec":{"containers":[{"name":"c","image":"x"}]}}))
        .unwrap();
    let ns = Netns::new();
    let r = node.call("ADD", "killed", &ns.path());
    assert_eq!(r.code, -1, "killed by a signal: {:?}", r.out);
    let mut links = ns.links();
    links.sort();
    assert_eq!(links, vec!["eth0", "lo", "net1"], "half-attached");
    node.del_all_and_assert_clean("killed", &ns, "killed");
}

#[test]
fn state_dir_unwritable() {
    let node = Node::new(70);
    node.pod("ro");
    let ns = Netns::new();
    std::fs::create_dir_all(node.p("state")).unwrap();
    let ro = with_read_only_dir(node.dir.path(), &bin("plexus"), &node.p("state"));
    let cfg = node.config(json!({}));
    let (code, msg) = error(&node.call_with(&ro, "ADD", "ro", &ns.path(), &cfg));
    assert_eq!(code, 5, "{msg}");
    assert!(
        msg.contains("cannot take the plexus lock") && msg.contains("Read-only"),
        "{msg}"
    );
    // A successful ADD, then the directory turns read-only: DEL cleans up and reports code 5.
    node.call("ADD", "ro", &ns.path()).ok();
    let (code, msg) = error(&node.call_with(&ro, "DEL", "ro", &ns.path(), &cfg));
    assert_eq!(code, 5, "{msg}");
    assert!(
        msg.contains("pod db/ro") && msg.contains("networks deleted"),
        "{msg}"
    );
    assert_eq!(ns.links(), vec!["lo"]);
    node.del_all_and_assert_clean("ro", &ns, "read-only");
}

/// A GC (CNI 1.1) call with `extra` merged into the config.
fn gc(node: &Node, extra: Value) -> Run {
    let mut cfg = node.config(json!({"cniVersion":"1.1.0"}));
    for (k, v) in extra.as_object().into_iter().flatten() {
        cfg[k] = v.clone();
    }
    run(
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
    )
}

#[test]
fn gc_without_a_valid_attachment_list_changes_nothing() {
    let node = Node::new(81);
    node.pod("live");
    let ns = Netns::new();
    node.call("ADD", "live", &ns.path()).ok();
    let mut links = ns.links();
    links.sort();
    assert_eq!(links, vec!["eth0", "lo", "net1"]);
    let before = node.leftovers();
    assert!(
        before.iter().filter(|f| f.contains("/10.")).count() == 2,
        "two leases: {before:?}"
    );
    let key = "cni.dev/valid-attachments";
    for (what, extra) in [
        ("no key", json!({})),
        (
            "not a list",
            json!({key: {"containerID":"cid-live","ifname":"eth0"}}),
        ),
        ("no ifname", json!({key: [{"containerID":"cid-live"}]})),
        (
            "no containerID",
            json!({key: [{"containerID":"cid-live","ifname":"eth0"},{"ifname":"eth0"}]}),
        ),
        (
            "legacy key, no ifname",
            json!({"cni.dev/attachments": [{"containerID":"x"}]}),
        ),
    ] {
        let (code, msg) = error(&gc(&node, extra));
        assert_eq!(code, 7, "{what}: {msg}");
        assert!(msg.contains("nothing was collected"), "{what}: {msg}");
        let mut now = ns.links();
        now.sort();
        assert_eq!(now, vec!["eth0", "lo", "net1"], "{what}: links");
        assert_eq!(node.leftovers(), before, "{what}: plans and leases");
    }
    // A well-formed list naming the pod keeps it; then the runtime's DELs clean up.
    gc(
        &node,
        json!({key: [{"containerID":"cid-live","ifname":"eth0"}]}),
    )
    .ok();
    assert_eq!(node.leftovers(), before);
    node.del_all_and_assert_clean("live", &ns, "gc");
}

/// A script that runs plexus from `cwd` (the runtime's working directory).
fn in_dir(node: &Node, cwd: &std::path::Path) -> PathBuf {
    let path = node.p("cwd-wrapper");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\ncd {} && exec {}\n",
            cwd.display(),
            bin("plexus").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn config_values_out_of_range_and_relative_cni_dir_are_clear_errors() {
    let node = Node::new(82);
    node.pod("bounds");
    let ns = Netns::new();
    let cwd = node.p("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let wrapper = in_dir(&node, &cwd);
    for (extra, want) in [
        (
            json!({"readinessTimeoutSeconds":u64::MAX,"readinessindicatorfile":node.p("never")}),
            "readinessTimeoutSeconds 18446744073709551615 is out of range",
        ),
        (
            json!({"delegateTimeoutSeconds":u64::MAX}),
            "delegateTimeoutSeconds",
        ),
        (json!({"podTimeoutMs":u64::MAX}), "podTimeoutMs"),
        (
            json!({"logOptions":{"maxBackups":u32::MAX}}),
            "logOptions.maxBackups",
        ),
        (
            json!({"cniDir":""}),
            "cniDir \"\" is not usable: it is empty",
        ),
        (json!({"cniDir":"state"}), "it is a relative path"),
    ] {
        let r = node.call_with(
            &wrapper,
            "ADD",
            "bounds",
            &ns.path(),
            &node.config(extra.clone()),
        );
        let (code, msg) = error(&r);
        assert_eq!(code, 7, "{extra}: {msg} / {}", r.stderr);
        assert!(msg.contains(want), "{extra}: {msg}");
        assert_eq!(ns.links(), vec!["lo"], "{extra}");
        assert!(
            files_under(&cwd).is_empty(),
            "{extra}: wrote {:?}",
            files_under(&cwd)
        );
        // DEL with the same config fails the same way and writes nothing either.
        let (code, _) = error(&node.call_with(
            &wrapper,
            "DEL",
            "bounds",
            &ns.path(),
            &node.config(extra.clone()),
        ));
        assert_eq!(code, 7, "{extra}");
        assert!(
            files_under(&cwd).is_empty(),
            "{extra}: DEL wrote {:?}",
            files_under(&cwd)
        );
    }
    node.del_all_and_assert_clean("bounds", &ns, "bounds");
}

#[test]
fn a_delegate_cni_version_plexus_cannot_speak_is_refused_before_anything_runs() {
    let node = Node::new(83);
    let marker = node.p("toucher-ran");
    node.script(
        "toucher",
        &format!(
            r#"cat >/dev/null; [ "$CNI_COMMAND" = ADD ] && touch {}; echo '{{"cniVersion":"1.0.0"}}'"#,
            marker.display()
        ),
    );
    let toucher = json!({"cniVersion":"1.0.0","type":"toucher"});
    node.api
        .put_nad("db", "toucher", &toucher.to_string(), &[])
        .unwrap();
    let newer = json!({"cniVersion":"9.9.9","type":"macvlan","master":node.master.0,
        "ipam":{"type":"host-local","dataDir":node.p("ipam"),"ranges":[[{"subnet":"10.83.9.0/24"}]]}});
    node.api
        .put_nad("db", "newer", &newer.to_string(), &[])
        .unwrap();
    node.api
        .put_pod(json!({"metadata":{"name":"ver","namespace":"db","uid":"uid-ver",
            "annotations":{NETWORKS:"toucher,newer"}},"spec":{"containers":[{"name":"c","image":"x"}]}}))
        .unwrap();
    let ns = Netns::new();
    let (code, msg) = error(&node.call("ADD", "ver", &ns.path()));
    assert_eq!(code, 1, "{msg}");
    assert!(
        msg.contains("pod db/ver") && msg.contains("network db/newer") && msg.contains("9.9.9"),
        "{msg}"
    );
    assert!(!msg.contains("rollback"), "{msg}");
    assert!(
        !marker.exists(),
        "a delegate ran before the version was checked"
    );
    assert_eq!(ns.links(), vec!["lo"]);
    node.del_all_and_assert_clean("ver", &ns, "version");
}

/// `cniVersions` with a version plexus speaks but the plugin's VERSION answer does not: known
/// only when the plugins are asked at ADD; that network ran nothing, so its rollback is not
/// attempted (it would fail the same way) and the networks before it are rolled back.
#[test]
fn no_version_common_with_the_plugin_rolls_back_the_networks_before_it_cleanly() {
    let node = Node::new(84);
    node.script(
        "oldie",
        r#"cat >/dev/null; echo '{"cniVersion":"0.1.0","supportedVersions":["0.1.0"]}'"#,
    );
    let oldie = json!({"cniVersion":"1.0.0","cniVersions":["1.0.0"],"type":"oldie"});
    node.api
        .put_nad("db", "oldie", &oldie.to_string(), &[])
        .unwrap();
    node.api
        .put_pod(
            json!({"metadata":{"name":"nego","namespace":"db","uid":"uid-nego",
            "annotations":{NETWORKS:"mv,oldie"}},"spec":{"containers":[{"name":"c","image":"x"}]}}),
        )
        .unwrap();
    let ns = Netns::new();
    let (code, msg) = error(&node.call("ADD", "nego", &ns.path()));
    assert_eq!(code, 1, "{msg}");
    assert!(
        msg.contains("pod db/nego") && msg.contains("network db/oldie"),
        "{msg}"
    );
    assert!(!msg.contains("rollback"), "{msg}");
    assert_eq!(ns.links(), vec!["lo"]);
    node.del_all_and_assert_clean("nego", &ns, "negotiation");
}
