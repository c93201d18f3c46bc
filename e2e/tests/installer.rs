//! Tests of the node installer `deploy/install.sh`, run for real in temp dirs: binary install
//! (idempotent, a busy binary replaced by rename), the kubeconfig, the generated config, and the
//! containerd 1.6 contract (a write event on the final config after its rename; the old config is
//! never removed), observed with inotify.

mod common;

use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The service account token the tests use; it must never appear in the installer's output.
const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.plexus-test-token-7f3a9c";
const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBplexustestca\n-----END CERTIFICATE-----\n";

/// Linux errno for "text file busy".
const ETXTBSY: i32 = 26;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/install.sh")
}

/// A fake node: source binaries, host bin and conf dirs, a service account.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let node = Node {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        for d in ["src", "bin", "conf", "sa"] {
            fs::create_dir(node.path(d)).expect("mkdir");
        }
        fs::copy("/bin/true", node.path("src/plexus")).expect("copy true");
        fs::copy("/bin/false", node.path("src/sriov")).expect("copy false");
        fs::write(node.path("sa/token"), format!("{TOKEN}\n")).expect("token");
        fs::write(node.path("sa/ca.crt"), CA).expect("ca");
        node
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn conf(&self, name: &str) -> PathBuf {
        self.path("conf").join(name)
    }

    /// Write a file in the conf dir the way a CNI installer would (temp + rename).
    fn put_conf(&self, name: &str, v: &Value) {
        let tmp = self.path(&format!("conf/.{name}.tmp"));
        fs::write(&tmp, serde_json::to_vec_pretty(v).expect("json")).expect("write");
        fs::rename(&tmp, self.conf(name)).expect("rename");
    }

    fn command(&self, extra: &[&str]) -> Command {
        let mut c = Command::new("sh");
        c.arg(script());
        for (flag, rel) in [
            ("--src-dir", "src"),
            ("--bin-dir", "bin"),
            ("--conf-dir", "conf"),
            ("--host-conf-dir", "conf"),
            ("--token-file", "sa/token"),
            ("--ca-file", "sa/ca.crt"),
        ] {
            c.arg(flag).arg(self.path(rel));
        }
        c.args(["--primary-wait", "0"]).args(extra);
        let plexus_vars: Vec<_> = std::env::vars()
            .map(|(k, _)| k)
            .filter(|k| k.starts_with("PLEXUS_") || k.starts_with("KUBERNETES_"))
            .collect();
        for k in plexus_vars {
            c.env_remove(k);
        }
        c.env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
            .env("KUBERNETES_SERVICE_PORT", "443")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, extra: &[&str]) -> Output {
        let out = self.command(extra).output().expect("run install.sh");
        assert_no_token(&out);
        out
    }

    fn install(&self, extra: &[&str]) -> String {
        let out = self.run(extra);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "install.sh failed: {stderr}");
        stderr
    }

    fn read_json(&self, name: &str) -> Value {
        let bytes = fs::read(self.conf(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
    }
}

fn assert_no_token(out: &Output) {
    for (what, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let s = String::from_utf8_lossy(bytes);
        assert!(
            !s.contains("plexus-test-token"),
            "token printed on {what}: {s}"
        );
    }
}

fn flannel_conflist(version: &str) -> Value {
    json!({"name": "cbr0", "cniVersion": version, "plugins": [
        {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
        {"type": "portmap", "capabilities": {"portMappings": true}},
        {"type": "bandwidth", "capabilities": {"bandwidth": true, "ips": false}}
    ]})
}

/// Poll `cond` every 20 ms until it holds or `timeout` passes.
fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

mod inotify {
    //! A non-blocking inotify reader over `nix::sys::inotify`, with the raw mask kept so tests
    //! can compare event kinds.

    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    use std::path::Path;

    pub const IN_MODIFY: u32 = AddWatchFlags::IN_MODIFY.bits();
    pub const IN_MOVED_FROM: u32 = AddWatchFlags::IN_MOVED_FROM.bits();
    pub const IN_MOVED_TO: u32 = AddWatchFlags::IN_MOVED_TO.bits();
    pub const IN_CREATE: u32 = AddWatchFlags::IN_CREATE.bits();
    pub const IN_DELETE: u32 = AddWatchFlags::IN_DELETE.bits();

    /// One event: the mask and the file name in the watched directory.
    #[derive(Debug, Clone)]
    pub struct Event {
        pub mask: u32,
        pub name: String,
    }

    /// A non-blocking inotify instance watching one directory.
    pub struct Watch {
        inner: Inotify,
    }

    impl Watch {
        pub fn dir(path: &Path) -> std::io::Result<Watch> {
            let inner = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
            let mask = AddWatchFlags::IN_MODIFY
                | AddWatchFlags::IN_ATTRIB
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE;
            inner.add_watch(path, mask)?;
            Ok(Watch { inner })
        }

        /// Every queued event, in order.
        pub fn drain(&mut self) -> Vec<Event> {
            let mut events = Vec::new();
            loop {
                match self.inner.read_events() {
                    Ok(batch) if !batch.is_empty() => events.extend(batch.into_iter().map(|e| {
                        Event {
                            mask: e.mask.bits(),
                            name: e
                                .name
                                .map(|n| n.to_string_lossy().into_owned())
                                .unwrap_or_default(),
                        }
                    })),
                    Ok(_) | Err(nix::errno::Errno::EAGAIN) => return events,
                    Err(e) => panic!("read inotify: {e}"),
                }
            }
        }
    }
}

use inotify::{Event, IN_CREATE, IN_DELETE, IN_MODIFY, IN_MOVED_FROM, IN_MOVED_TO};

/// Index of the last event on `name` matching `mask`.
fn last(events: &[Event], name: &str, mask: u32) -> Option<usize> {
    events
        .iter()
        .rposition(|e| e.name == name && e.mask & mask != 0)
}

/// The containerd 1.6 contract for one publication of `name`: it was renamed in, a write event on
/// it follows the rename, and it was never deleted or renamed away.
fn assert_containerd_contract(events: &[Event], name: &str) {
    let moved = last(events, name, IN_MOVED_TO)
        .unwrap_or_else(|| panic!("no IN_MOVED_TO for {name}: {events:?}"));
    let modified = last(events, name, IN_MODIFY)
        .unwrap_or_else(|| panic!("no IN_MODIFY for {name}: {events:?}"));
    assert!(
        modified > moved,
        "IN_MODIFY must follow the rename: {events:?}"
    );
    assert!(
        last(events, name, IN_DELETE | IN_MOVED_FROM).is_none(),
        "{name} was removed or renamed away: {events:?}"
    );
    // The final name was never created empty and then filled (a partial file).
    assert!(
        last(events, name, IN_CREATE).is_none(),
        "{name} was created in place: {events:?}"
    );
    // fsnotify (containerd) sees IN_MOVED_TO as Create, which containerd 1.6 ignores: the reload
    // comes from the write, so the last reload-triggering event must come after the rename.
    let reload_mask = IN_MODIFY | IN_DELETE | IN_MOVED_FROM;
    let last_reload = events
        .iter()
        .rposition(|e| e.mask & reload_mask != 0)
        .expect("a reload event");
    assert!(
        last_reload > moved,
        "no reload after the rename: {events:?}"
    );
}

#[test]
fn binaries_are_installed_and_reinstall_is_idempotent() {
    let node = Node::new();
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    node.install(&[]);
    for b in ["plexus", "sriov"] {
        let dst = node.path(&format!("bin/{b}"));
        assert_eq!(
            fs::read(&dst).expect("installed"),
            fs::read(node.path(&format!("src/{b}"))).expect("src")
        );
        assert_eq!(
            fs::metadata(&dst).expect("meta").permissions().mode() & 0o7777,
            0o755
        );
    }
    let ino = fs::metadata(node.path("bin/plexus")).expect("meta").ino();

    let stderr = node.install(&[]);
    assert!(stderr.contains("is up to date"), "{stderr}");
    assert_eq!(
        fs::metadata(node.path("bin/plexus")).expect("meta").ino(),
        ino,
        "an identical binary must not be rewritten"
    );

    // A new version replaces the file (a new inode: renamed, not written in place).
    fs::copy("/bin/echo", node.path("src/plexus")).expect("copy echo");
    node.install(&[]);
    let meta = fs::metadata(node.path("bin/plexus")).expect("meta");
    assert_ne!(meta.ino(), ino);
    assert_eq!(
        fs::read(node.path("bin/plexus")).expect("read"),
        fs::read("/bin/echo").expect("echo")
    );
    let leftovers: Vec<_> = fs::read_dir(node.path("bin"))
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

#[test]
fn busy_binary_is_replaced_without_disturbing_the_running_process() {
    let node = Node::new();
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    let dst = node.path("bin/plexus");
    fs::copy("/bin/sleep", &dst).expect("copy sleep");
    // Another test thread may fork while our copy's fd is open; its child then holds the file
    // open for writing until it execs, and our exec fails with ETXTBSY for a moment.
    let mut child = None;
    for _ in 0..100 {
        match Command::new(&dst).arg("30").spawn() {
            Ok(c) => {
                child = Some(Reaped(c));
                break;
            }
            Err(e) if e.raw_os_error() == Some(ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("spawn busy binary: {e}"),
        }
    }
    let mut child = child.expect("busy binary started");
    // The situation is real: writing into the running binary fails with "text file busy".
    let err = fs::OpenOptions::new()
        .write(true)
        .open(&dst)
        .expect_err("a running binary cannot be opened for writing");
    assert_eq!(err.raw_os_error(), Some(ETXTBSY), "{err}");

    node.install(&[]);
    assert_eq!(
        fs::read(&dst).expect("read"),
        fs::read(node.path("src/plexus")).expect("src")
    );
    assert!(
        child.0.try_wait().expect("try_wait").is_none(),
        "the running process must be unaffected"
    );
    let exe = fs::read_link(format!("/proc/{}/exe", child.0.id())).expect("exe link");
    assert!(
        exe.to_string_lossy().ends_with("(deleted)"),
        "the process keeps running its old (now unlinked) file: {}",
        exe.display()
    );
}

#[test]
fn kubeconfig_is_private_and_the_token_is_never_printed() {
    let node = Node::new();
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    node.install(&[]);
    let kc = node.conf("plexus.d/plexus.kubeconfig");
    let mode = |p: &Path| fs::metadata(p).expect("meta").permissions().mode() & 0o7777;
    assert_eq!(mode(&kc), 0o600);
    assert_eq!(mode(&node.conf("plexus.d")), 0o700);
    // The CNI config the runtime reads names the kubeconfig, never the token: world-readable.
    let conf = node.conf("00-plexus.conflist");
    assert_eq!(mode(&conf), 0o644);
    let published = fs::read_to_string(&conf).expect("config");
    assert!(!published.contains("plexus-test-token"), "{published}");
    let text = fs::read_to_string(&kc).expect("kubeconfig");
    use base64::Engine as _;
    let ca_data = base64::engine::general_purpose::STANDARD.encode(CA);
    for want in [
        "server: https://10.96.0.1:443".to_string(),
        format!("certificate-authority-data: {ca_data}"),
        format!("token: \"{TOKEN}\""),
        "current-context: plexus-context".to_string(),
    ] {
        assert!(text.contains(&want), "missing {want:?} in:\n{text}");
    }
    // The file is a kubeconfig kube-rs reads (plexus uses kube's parser).
    let parsed = kube::config::Kubeconfig::read_from(&kc).expect("kube parses the kubeconfig");
    assert_eq!(parsed.current_context.as_deref(), Some("plexus-context"));

    // An IPv6 API address is bracketed.
    let out = node
        .command(&[])
        .env("KUBERNETES_SERVICE_HOST", "fd00::1")
        .output()
        .expect("run");
    assert_no_token(&out);
    assert!(out.status.success());
    let text = fs::read_to_string(&kc).expect("kubeconfig");
    assert!(text.contains("server: https://[fd00::1]:443"), "{text}");

    // Without an API address there is no kubeconfig to write: a clear error, still no token.
    let out = node
        .command(&[])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run");
    assert_no_token(&out);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("KUBERNETES_SERVICE_HOST"));
}

#[test]
fn config_is_generated_from_the_first_primary_config() {
    let node = Node::new();
    // Skipped: our own and Multus' configs, non-CNI names; "10-…" sorts before "20-…".
    node.put_conf(
        "00-multus.conf",
        &json!({"cniVersion": "0.3.1", "name": "m", "type": "multus"}),
    );
    fs::write(node.conf("05-notes.txt"), "not a config").expect("write");
    node.put_conf(
        "20-bridge.conf",
        &json!({"cniVersion": "0.3.1", "name": "b", "type": "bridge"}),
    );
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    // The leftover Multus config sorts first: the runtime would keep calling Multus, so the
    // installer publishes its config but fails loudly until the leftover is removed.
    let out = node.run(&[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("00-multus.conf sorts before 00-plexus.conflist"),
        "{stderr}"
    );
    fs::remove_file(node.conf("00-multus.conf")).expect("rm");
    node.install(&[]);

    let c = node.read_json("00-plexus.conflist");
    // The primary's version for a runtime whose libcni predates 1.2, 1.1.0 for the others.
    assert_eq!(c["cniVersion"], "1.0.0");
    assert_eq!(c["cniVersions"], json!(["1.0.0", "1.1.0"]));
    assert_eq!(c["name"], "plexus-cni-network");
    let plugins = c["plugins"].as_array().expect("plugins");
    assert_eq!(plugins.len(), 1);
    let p = &plugins[0];
    let primary = node.conf("10-flannel.conflist");
    assert_eq!(p["type"], "plexus");
    assert_eq!(p["clusterNetwork"], primary.to_string_lossy().as_ref());
    assert_eq!(
        p["kubeconfig"],
        node.conf("plexus.d/plexus.kubeconfig")
            .to_string_lossy()
            .as_ref()
    );
    // The union of the enabled capabilities of every plugin; `ips: false` is not one.
    assert_eq!(
        p["capabilities"],
        json!({"portMappings": true, "bandwidth": true, "io.kubernetes.cri.pod-annotations": true})
    );
    assert_eq!(p["logFile"], "/var/log/plexus.log");
    assert_eq!(p["logLevel"], "warn");
    assert!(!node.conf("00-plexus.conf").exists());

    // The real plexus accepts the plugin config libcni would hand it and resolves the primary.
    let mut plugin = p.clone();
    plugin["cniVersion"] = c["cniVersion"].clone();
    plugin["name"] = c["name"].clone();
    fs::write(node.path("plugin.json"), plugin.to_string()).expect("write");
    fs::write(
        node.path("pod.json"),
        json!({"metadata": {"name": "p", "namespace": "default", "uid": "u1"}}).to_string(),
    )
    .expect("write");
    let out = Command::new(common::bin("plexus"))
        .arg("explain")
        .arg("--config")
        .arg(node.path("plugin.json"))
        .arg("--pod")
        .arg(node.path("pod.json"))
        .output()
        .expect("plexus explain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let plan: Value = serde_json::from_slice(&out.stdout).expect("plan JSON");
    let types: Vec<_> = plan["attachments"][0]["delegates"]
        .as_array()
        .expect("delegates")
        .iter()
        .map(|d| d["type"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(types, ["flannel", "portmap", "bandwidth"]);
    assert_eq!(plan["attachments"][0]["network"], "cbr0");

    // A 0.x primary (a single-plugin .conf): still a .conflist at the primary's version with
    // 1.1.0 offered beside it.
    fs::remove_file(node.conf("10-flannel.conflist")).expect("rm");
    node.put_conf(
        "10-calico.conf",
        &json!({"cniVersion": "0.4.0", "name": "k8s-pod-network", "type": "calico",
                "capabilities": {"portMappings": true}}),
    );
    node.install(&[]);
    let c = node.read_json("00-plexus.conflist");
    assert_eq!(c["cniVersion"], "0.4.0");
    assert_eq!(c["cniVersions"], json!(["0.4.0", "1.1.0"]));

    // plexus written at a 0.x version alone (--cni-version) is a single-plugin .conf with
    // top-level capabilities; the .conflist from before is removed only after the .conf exists.
    let mut watch = inotify::Watch::dir(&node.path("conf")).expect("inotify");
    node.install(&[
        "--cni-version",
        "0.4.0",
        "--extra-config",
        r#"{"namespaceIsolation": true}"#,
    ]);
    let events = watch.drain();
    let c = node.read_json("00-plexus.conf");
    assert_eq!(c["cniVersion"], "0.4.0");
    assert!(c.get("cniVersions").is_none(), "{c}");
    assert_eq!(c["type"], "plexus");
    assert_eq!(
        c["clusterNetwork"],
        node.conf("10-calico.conf").to_string_lossy().as_ref()
    );
    assert_eq!(
        c["capabilities"],
        json!({"portMappings": true, "io.kubernetes.cri.pod-annotations": true})
    );
    assert_eq!(c["namespaceIsolation"], true);
    assert!(!node.conf("00-plexus.conflist").exists());
    assert_containerd_contract(&events, "00-plexus.conf");
    let removed = last(&events, "00-plexus.conflist", IN_DELETE).expect("old removed");
    let first_write = events
        .iter()
        .position(|e| e.name == "00-plexus.conf" && e.mask & IN_MODIFY != 0)
        .expect("new written");
    assert!(
        removed > first_write,
        "the old config went away before the new one was complete: {events:?}"
    );
    // containerd 1.6 does not reload on a removal, and at the first write event both files
    // existed (the old one may sort first): one more write event must follow the removal.
    assert!(
        last(&events, "00-plexus.conf", IN_MODIFY).expect("new written") > removed,
        "no write event after the old config was removed: {events:?}"
    );
}

#[test]
fn primary_config_is_waited_for_with_a_bound() {
    let node = Node::new();
    let started = Instant::now();
    let out = node.run(&["--primary-wait", "1"]);
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(5));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no usable primary CNI config"), "{stderr}");
    assert!(!node.conf("00-plexus.conflist").exists());

    // A primary that shows up while the installer waits is used.
    let child = node
        .command(&["--primary-wait", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(300));
    node.put_conf("10-flannel.conflist", &flannel_conflist("0.3.1"));
    let out = child.wait_with_output().expect("wait");
    assert_no_token(&out);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = node.read_json("00-plexus.conflist");
    assert_eq!(
        (&c["cniVersion"], &c["cniVersions"]),
        (&json!("0.3.1"), &json!(["0.3.1", "1.1.0"]))
    );
}

#[test]
fn a_plexus_or_multus_config_is_never_the_primary() {
    let node = Node::new();
    // Not skipped by name, but delegating to it would make plexus call itself (Multus #1108).
    node.put_conf(
        "10-old-multus.conflist",
        &json!({"cniVersion": "1.0.0", "name": "multus-cni-network",
                "plugins": [{"type": "multus", "kubeconfig": "/x"}]}),
    );
    let out = node.run(&[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing"), "{stderr}");
    assert!(!node.conf("00-plexus.conflist").exists());
}

/// The version libcni runs a conflist at: the highest of `cniVersion` and `cniVersions` that
/// it implements (`newest`: 1.0.0 for libcni 1.1, containerd 1.6, which reads `cniVersion`
/// alone; 1.1.0 for libcni >= 1.2).
fn libcni_version(c: &Value, newest: &str) -> String {
    let parse = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    let mut candidates = vec![c["cniVersion"].as_str().unwrap_or("").to_string()];
    if parse(newest) >= parse("1.1.0") {
        for v in c["cniVersions"].as_array().into_iter().flatten() {
            candidates.push(v.as_str().unwrap_or("").to_string());
        }
    }
    candidates
        .into_iter()
        .filter(|v| parse(v) <= parse(newest))
        .max_by_key(|v| parse(v))
        .unwrap_or_default()
}

#[test]
fn plexus_runs_at_1_1_0_where_the_runtime_can_and_the_version_can_be_chosen() {
    let node = Node::new();
    let read = |n: &Node| n.read_json("00-plexus.conflist");
    // flannel's and calico's upstream conflists say 0.3.1: containerd 2.x (libcni 1.3) runs
    // plexus at 1.1.0 and calls its STATUS; containerd 1.6 (libcni 1.1) stays at 0.3.1.
    node.put_conf("10-flannel.conflist", &flannel_conflist("0.3.1"));
    let stderr = node.install(&[]);
    let c = read(&node);
    assert_eq!(libcni_version(&c, "1.1.0"), "1.1.0", "{c}");
    assert_eq!(libcni_version(&c, "1.0.0"), "0.3.1", "{c}");
    assert!(
        stderr.contains(r#"(cniVersion 0.3.1, cniVersions ["0.3.1","1.1.0"])"#),
        "{stderr}"
    );

    // A primary at 1.1.0, or newer than plexus implements: 1.1.0 alone.
    for primary in ["1.1.0", "1.2.0"] {
        node.put_conf("10-flannel.conflist", &flannel_conflist(primary));
        node.install(&[]);
        let c = read(&node);
        assert_eq!(c["cniVersion"], "1.1.0", "{primary}: {c}");
        assert!(c.get("cniVersions").is_none(), "{primary}: {c}");
    }
    // A primary without cniVersion: 1.0.0 and 1.1.0.
    let mut bare = flannel_conflist("x");
    bare.as_object_mut().expect("object").remove("cniVersion");
    node.put_conf("10-flannel.conflist", &bare);
    node.install(&[]);
    assert_eq!(read(&node)["cniVersions"], json!(["1.0.0", "1.1.0"]));

    // Chosen: written alone, by flag or environment (1.0.0: no runtime calls STATUS).
    node.put_conf("10-flannel.conflist", &flannel_conflist("0.3.1"));
    node.install(&["--cni-version", "1.0.0"]);
    let c = read(&node);
    assert_eq!(c["cniVersion"], "1.0.0");
    assert!(c.get("cniVersions").is_none(), "{c}");
    let out = node
        .command(&[])
        .env("PLEXUS_CNI_VERSION", "1.1.0")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read(&node)["cniVersion"], "1.1.0");
    let out = node.run(&["--cni-version", "1.2.0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--cni-version must be auto or a CNI version plexus implements"),
        "{stderr}"
    );
    assert_eq!(read(&node)["cniVersion"], "1.1.0", "the config is kept");

    // A .conf cannot offer cniVersions: the primary's version alone, and the log says so.
    let stderr = node.install(&["--conf-name", "00-plexus.conf"]);
    let c = node.read_json("00-plexus.conf");
    assert_eq!(c["cniVersion"], "0.3.1");
    assert!(c.get("cniVersions").is_none(), "{c}");
    assert!(
        stderr.contains("cannot offer cniVersions") && stderr.contains("STATUS"),
        "{stderr}"
    );
    assert!(!node.conf("00-plexus.conflist").exists());
}

#[test]
fn a_daemon_mode_conflist_is_checked_as_the_runtime_hands_it_to_plexus() {
    let node = Node::new();
    // The real plexus checks the config; daemon mode's plugin is plexus-shim (the daemon
    // DaemonSet's PLEXUS_EXTRA_CONFIG), inside a .conflist now that 1.1.0 is offered.
    fs::copy(common::bin("plexus"), node.path("src/plexus")).expect("copy plexus");
    node.put_conf("10-flannel.conflist", &flannel_conflist("0.3.1"));
    let extra = json!({"type": "plexus-shim", "daemonSocket": "/run/plexus/plexus.sock",
                       "daemonUnavailable": "thin"})
    .to_string();
    node.install(&["--extra-config", &extra]);
    let c = node.read_json("00-plexus.conflist");
    assert_eq!(c["plugins"][0]["type"], "plexus-shim", "{c}");
    assert_eq!(c["cniVersions"], json!(["0.3.1", "1.1.0"]), "{c}");
    let leftovers: Vec<_> = fs::read_dir(node.conf("plexus.d"))
        .expect("plexus.d")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".config.checked"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A config plexus refuses is still refused through the list (a bad policy value).
    let bad = json!({"type": "plexus-shim", "daemonSocket": "/run/plexus/plexus.sock",
                     "readinessTimeoutSeconds": u64::MAX})
    .to_string();
    let out = node.run(&["--extra-config", &bad]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("refused by plexus, keeping"),
        "{stderr}"
    );
    assert_eq!(
        node.read_json("00-plexus.conflist"),
        c,
        "the good config is kept"
    );
}

#[test]
fn config_update_keeps_the_old_file_and_ends_with_a_write_event() {
    let node = Node::new();
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));

    // First install into an empty dir: the same contract.
    let mut watch = inotify::Watch::dir(&node.path("conf")).expect("inotify");
    node.install(&[]);
    assert_containerd_contract(&watch.drain(), "00-plexus.conflist");

    // Update: a reader polling the final file never finds it missing or partial.
    let mut primary = flannel_conflist("1.0.0");
    primary["plugins"][1]["capabilities"] =
        json!({"portMappings": true, "io.kubernetes.cri.pod-annotations": true});
    node.put_conf("10-flannel.conflist", &primary);
    let _ = watch.drain();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, reads, path) = (stop.clone(), reads.clone(), node.conf("00-plexus.conflist"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let bytes = fs::read(&path).expect("the config is never missing");
                let v: Value = serde_json::from_slice(&bytes).expect("the config is never partial");
                assert_eq!(v["plugins"][0]["type"], "plexus");
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    node.install(&[]);
    stop.store(true, Ordering::Relaxed);
    reader
        .join()
        .expect("reader saw a complete config every time");
    assert!(reads.load(Ordering::Relaxed) > 0);
    let events = watch.drain();
    assert_containerd_contract(&events, "00-plexus.conflist");
    assert_eq!(
        node.read_json("00-plexus.conflist")["plugins"][0]["capabilities"],
        json!({"portMappings": true, "bandwidth": true, "io.kubernetes.cri.pod-annotations": true})
    );

    // Unchanged inputs: no rename, but still one write event so a runtime that missed the last
    // one (installer killed between rename and rewrite) loads the config.
    let ino = fs::metadata(node.conf("00-plexus.conflist"))
        .expect("meta")
        .ino();
    node.install(&[]);
    let events = watch.drain();
    assert!(last(&events, "00-plexus.conflist", IN_MOVED_TO).is_none());
    assert!(last(&events, "00-plexus.conflist", IN_MODIFY).is_some());
    assert!(last(&events, "00-plexus.conflist", IN_DELETE).is_none());
    assert_eq!(
        fs::metadata(node.conf("00-plexus.conflist"))
            .expect("meta")
            .ino(),
        ino
    );
}

#[test]
fn watch_regenerates_on_changes_and_keeps_the_config_on_exit() {
    let node = Node::new();
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    let mut proc = Reaped(
        node.command(&["--watch", "--watch-interval", "0.1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let conf = node.conf("00-plexus.conflist");
    let kc = node.conf("plexus.d/plexus.kubeconfig");
    let limit = Duration::from_secs(10);
    assert!(wait_until(limit, || conf.exists()), "config written");

    // Token rotation (kubelet swaps the projected file atomically).
    let rotated = "eyJhbGciOiJSUzI1NiJ9.plexus-test-token-rotated";
    fs::write(node.path("sa/.token.new"), rotated).expect("write");
    fs::rename(node.path("sa/.token.new"), node.path("sa/token")).expect("rename");
    assert!(
        wait_until(limit, || fs::read_to_string(&kc)
            .map(|t| t.contains(rotated))
            .unwrap_or(false)),
        "kubeconfig follows the rotated token"
    );

    // The primary changes: the config follows, with the same contract.
    let mut watch = inotify::Watch::dir(&node.path("conf")).expect("inotify");
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.1.0"));
    let read_version = || {
        fs::read(&conf)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .map(|v| v["cniVersion"].clone())
    };
    assert!(
        wait_until(limit, || read_version() == Some(json!("1.1.0"))),
        "config follows the primary"
    );
    // The in-place rewrite follows the rename within the same pass; give it a moment.
    assert!(wait_until(limit, || {
        let e = watch.drain();
        last(&e, "00-plexus.conflist", IN_MODIFY).is_some()
    }));

    // Someone removes our config (another CNI's installer): it is restored.
    fs::remove_file(&conf).expect("rm");
    assert!(wait_until(limit, || conf.exists()), "config restored");
    fs::remove_file(&kc).expect("rm");
    assert!(wait_until(limit, || kc.exists()), "kubeconfig restored");

    // The primary goes away (the primary CNI restarting): our config stays.
    fs::remove_file(node.conf("10-flannel.conflist")).expect("rm");
    std::thread::sleep(Duration::from_millis(500));
    assert!(conf.exists(), "config kept while the primary is gone");

    // SIGTERM: a clean exit, nothing removed.
    let pid = proc.0.id().to_string();
    let ok = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success();
    assert!(ok);
    let mut status = None;
    assert!(
        wait_until(limit, || {
            status = proc.0.try_wait().expect("try_wait");
            status.is_some()
        }),
        "installer exits on SIGTERM"
    );
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(conf.exists() && kc.exists(), "nothing removed on exit");
    let mut out = Vec::new();
    let mut err = Vec::new();
    use std::io::Read as _;
    if let Some(mut s) = proc.0.stdout.take() {
        s.read_to_end(&mut out).expect("stdout");
    }
    if let Some(mut s) = proc.0.stderr.take() {
        s.read_to_end(&mut err).expect("stderr");
    }
    let stderr = String::from_utf8_lossy(&err);
    assert!(
        !stderr.contains("plexus-test-token") && !String::from_utf8_lossy(&out).contains("token-"),
        "token printed: {stderr}"
    );
    assert!(stderr.contains("restoring"), "{stderr}");
}

#[test]
fn a_foreign_sriov_binary_is_not_replaced_without_consent() {
    let node = Node::new();
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    // sriov-cni's binary is installed: replacing it would strand the VFs it attached.
    fs::create_dir_all(node.path("bin")).expect("mkdir");
    fs::write(node.path("bin/sriov"), "#!/bin/sh\necho sriov-cni\n").expect("write");
    let out = node.run(&[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("another sriov plugin"), "{stderr}");
    assert_eq!(
        fs::read_to_string(node.path("bin/sriov")).expect("read"),
        "#!/bin/sh\necho sriov-cni\n"
    );
    // With the operator's consent (pods drained) it is replaced.
    let out = node
        .command(&[])
        .env("PLEXUS_REPLACE_SRIOV_CNI", "true")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::read(node.path("bin/sriov")).expect("read"),
        fs::read("/bin/false").expect("read")
    );
    // plexus' own sriov (it names its state-dir variable) is upgraded without asking.
    fs::write(
        node.path("bin/sriov"),
        "#!/bin/sh\n# PLEXUS_SRIOV_STATE_DIR\n",
    )
    .expect("write");
    node.install(&[]);
}

#[test]
fn ready_file_is_removed_at_start_and_written_only_after_publishing() {
    let node = Node::new();
    let ready = node.path("state/ready");
    fs::create_dir_all(node.path("state")).expect("mkdir");
    // Left by an earlier run of the same pod (a container restart keeps its emptyDir).
    fs::write(&ready, "").expect("stale ready file");
    let ready_arg = ready.display().to_string();
    let out = node.run(&["--ready-file", &ready_arg, "--primary-wait", "0"]);
    assert!(!out.status.success(), "no primary: the install must fail");
    assert!(
        !ready.exists(),
        "a failed run must not leave the node ready"
    );

    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    let stderr = node.install(&["--ready-file", &ready_arg]);
    assert!(ready.exists(), "{stderr}");
    assert!(node.conf("00-plexus.conflist").exists());
    assert!(stderr.contains("ready ("), "{stderr}");
}

#[test]
fn the_node_name_goes_into_the_config_from_the_daemonsets_node() {
    let node = Node::new();
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    node.install(&[]);
    let plugin = |n: &Node| n.read_json("00-plexus.conflist")["plugins"][0].clone();
    // Not given: none in the config (plexus names the host then).
    assert!(plugin(&node).get("nodeName").is_none(), "{}", plugin(&node));
    node.install(&["--node-name", "worker-7"]);
    assert_eq!(plugin(&node)["nodeName"], "worker-7");
    // Both DaemonSets hand the installer its Pod's spec.nodeName (the daemon's installer too:
    // its config serves the thin fallback and the shim's own calls).
    for file in [
        "components/thin/plexus-daemonset.yaml",
        "components/daemon/plexus-daemon-daemonset.yaml",
    ] {
        let manifest = fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy")
                .join(file),
        )
        .expect("manifest");
        let installer = &manifest[manifest.find("- name: install-plexus").expect(file)..];
        let at = installer
            .find("- name: PLEXUS_NODE_NAME")
            .unwrap_or_else(|| panic!("no PLEXUS_NODE_NAME for {file}'s installer"));
        // In the installer container's env, not a later container's.
        assert!(
            !installer[..at].contains("\n        - name: "),
            "{file}: PLEXUS_NODE_NAME is not the installer's"
        );
        let entry = &installer[at..];
        assert!(
            entry
                .lines()
                .nth(2)
                .is_some_and(|l| l.contains("fieldPath: spec.nodeName")),
            "{file}: {entry}"
        );
    }
}

/// The value of env var `name` of the `install-plexus` container in a DaemonSet manifest
/// (single-quoted or bare YAML scalar on the line after `- name: NAME`).
fn manifest_env(manifest: &str, name: &str) -> Option<String> {
    let mut lines = manifest.lines();
    lines.find(|l| l.trim() == format!("- name: {name}"))?;
    let v = lines.next()?.trim().strip_prefix("value:")?.trim();
    Some(v.trim_matches('\'').to_string())
}

#[test]
fn the_daemon_daemonsets_installer_installs_plexus_shim_and_names_it_as_the_type() {
    let manifest = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/components/daemon/plexus-daemon-daemonset.yaml"),
    )
    .expect("daemon manifest");
    let binaries = manifest_env(&manifest, "PLEXUS_BINARIES").expect("PLEXUS_BINARIES");
    let extra = manifest_env(&manifest, "PLEXUS_EXTRA_CONFIG").expect("PLEXUS_EXTRA_CONFIG");
    let node = Node::new();
    fs::copy("/bin/echo", node.path("src/plexus-shim")).expect("copy echo");
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    node.install(&["--binaries", &binaries, "--extra-config", &extra]);
    for b in ["plexus", "plexus-shim", "sriov"] {
        assert_eq!(
            fs::read(node.path(&format!("bin/{b}"))).expect("installed"),
            fs::read(node.path(&format!("src/{b}"))).expect("src"),
            "{b}"
        );
    }
    let conf = node.read_json("00-plexus.conflist");
    let plugin = &conf["plugins"][0];
    assert_eq!(plugin["type"], "plexus-shim", "{conf}");
    assert_eq!(plugin["daemonSocket"], "/run/plexus/plexus.sock");
    assert_eq!(plugin["daemonUnavailable"], "thin");
    assert!(
        plugin["kubeconfig"].as_str().is_some_and(|k| !k.is_empty()),
        "the thin fallback keeps its kubeconfig: {conf}"
    );
}

/// Write a ConfigMap volume as the kubelet updates it: the keys in a new timestamped
/// directory, `..data` swapped to it by a rename, then one `key -> ..data/key` link per key
/// (links of keys gone removed).
fn configmap_volume(dir: &Path, data: &[(&str, &str)]) {
    fs::create_dir_all(dir).expect("mkdir");
    let stamp = format!("..{}", common::uniq("ts"));
    fs::create_dir(dir.join(&stamp)).expect("mkdir stamp");
    for (k, v) in data {
        fs::write(dir.join(&stamp).join(k), v).expect("write key");
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&stamp, &tmp).expect("..data_tmp");
    fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for (k, _) in data {
        let link = dir.join(k);
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{k}"), &link).expect("key link");
        }
    }
    for e in fs::read_dir(dir).expect("read_dir").filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") {
            if name != "..data" && name != stamp {
                let _ = fs::remove_dir_all(e.path());
            }
        } else if !data.iter().any(|(k, _)| *k == name) {
            fs::remove_file(e.path()).expect("remove key link");
        }
    }
}

#[test]
fn the_nad_policy_configmap_becomes_nad_policy_and_a_bad_one_is_never_published() {
    let node = Node::new();
    // The real plexus: the installer asks it to check every config before publishing.
    fs::copy(common::bin("plexus"), node.path("src/plexus")).expect("copy plexus");
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    let cm = node.path("nad-policy");
    let policy_dir = cm.display().to_string();

    // A policy with a bad VLAN range: the first install fails and publishes nothing.
    configmap_volume(&cm, &[("bank.vlans", "100, 5000")]);
    let out = node.run(&["--nad-policy-dir", &policy_dir]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("refused by plexus") && stderr.contains("bank.vlans"),
        "{stderr}"
    );
    assert!(!node.conf("00-plexus.conflist").exists());

    configmap_volume(
        &cm,
        &[
            ("bank.interfaces", " ens1f0, br-bank "),
            ("bank.vlans", "100, 200-209"),
            ("_all.resourceNames", "intel.com/shared_*"),
            ("hostResources.mode", "enforce\n"),
            ("paths.data", "/var/lib/cni/networks, /srv/ipam"),
        ],
    );
    let mut proc = Reaped(
        node.command(&[
            "--watch",
            "--watch-interval",
            "0.1",
            "--nad-policy-dir",
            &policy_dir,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn"),
    );
    let conf = node.conf("00-plexus.conflist");
    let policy = || -> Value {
        fs::read(&conf)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .map(|v| v["plugins"][0]["nadPolicy"].clone())
            .unwrap_or(Value::Null)
    };
    let limit = Duration::from_secs(10);
    let want = json!({
        "hostResources": {"mode": "enforce", "allow": {
            "bank.interfaces": "ens1f0, br-bank", "bank.vlans": "100, 200-209",
            "_all.resourceNames": "intel.com/shared_*"}},
        "paths": {"data": ["/var/lib/cni/networks", "/srv/ipam"]}});
    assert!(wait_until(limit, || policy() == want), "{}", policy());

    // A change of the ConfigMap (the kubelet swaps ..data) is followed.
    configmap_volume(&cm, &[("bank.interfaces", "ens1f1")]);
    let changed = json!({"hostResources": {"allow": {"bank.interfaces": "ens1f1"}}});
    assert!(wait_until(limit, || policy() == changed), "{}", policy());
    // A bad one is refused by plexus: the published config stays as it was.
    configmap_volume(
        &cm,
        &[
            ("bank.interfaces", "ens1f1"),
            ("paths.logs", "relative/logs"),
        ],
    );
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(policy(), changed);
    // The ConfigMap deleted (optional volume, empty dir): the defaults, no nadPolicy key.
    configmap_volume(&cm, &[]);
    assert!(wait_until(limit, || policy().is_null()), "{}", policy());
    let _ = Command::new("kill")
        .args(["-TERM", &proc.0.id().to_string()])
        .status();
    let mut err = Vec::new();
    use std::io::Read as _;
    let _ = proc.0.wait();
    if let Some(mut s) = proc.0.stderr.take() {
        s.read_to_end(&mut err).expect("stderr");
    }
    let stderr = String::from_utf8_lossy(&err);
    assert!(
        stderr.contains("the new config is refused by plexus, keeping")
            && stderr.contains("paths.logs"),
        "{stderr}"
    );
}

// ------------------------------------------------- coexistence with the SR-IOV network operator

/// sriov-cni as the SR-IOV network operator's config daemon installs it (its image's entrypoint
/// runs `cp -f /usr/bin/sriov /host/opt/cni/bin` in an init container at every start of the
/// daemon's pod: in place, over whatever is there).
const OPERATOR_SRIOV: &str = "#!/bin/sh\necho sriov-cni from the operator\n";

/// A node whose source `sriov` is recognisably plexus' (it names its state-dir variable).
fn operator_node() -> Node {
    let node = Node::new();
    fs::write(
        node.path("src/sriov"),
        "#!/bin/sh\n# plexus sriov, reads PLEXUS_SRIOV_STATE_DIR\n",
    )
    .expect("write");
    node.put_conf("10-flannel.conflist", &flannel_conflist("1.0.0"));
    node
}

/// What the operator's init container does to `<bin>/sriov`.
fn operator_installs_sriov_cni(node: &Node) {
    let dst = node.path("bin/sriov");
    fs::create_dir_all(node.path("bin")).expect("mkdir");
    // cp -f: truncate and write the existing file (same inode), or create it.
    fs::write(&dst, OPERATOR_SRIOV).expect("cp -f");
    fs::set_permissions(&dst, fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn bin_sriov(node: &Node) -> Option<String> {
    fs::read_to_string(node.path("bin/sriov")).ok()
}

fn plexus_sriov(node: &Node) -> String {
    fs::read_to_string(node.path("src/sriov")).expect("src sriov")
}

#[test]
fn sriov_binary_skip_installs_no_sriov_and_lets_the_operators_serve() {
    let node = operator_node();
    // No sriov on the node yet: skip installs none (plexus still is installed).
    let stderr = node.install(&["--sriov-binary", "skip"]);
    assert!(bin_sriov(&node).is_none(), "{stderr}");
    assert!(node.path("bin/plexus").exists());
    assert!(
        stderr.contains("sriov not installed (--sriov-binary skip): none installed"),
        "{stderr}"
    );
    // The operator's sriov-cni is there: kept as it is, by the option and by the variable, and
    // whatever PLEXUS_REPLACE_SRIOV_CNI says.
    operator_installs_sriov_cni(&node);
    let ino = fs::metadata(node.path("bin/sriov")).expect("stat").ino();
    let stderr = node.install(&["--sriov-binary=skip"]);
    assert!(
        stderr.contains("another sriov plugin (sriov-cni?)"),
        "{stderr}"
    );
    let out = node
        .command(&[])
        .env("PLEXUS_SRIOV_BINARY", "skip")
        .env("PLEXUS_REPLACE_SRIOV_CNI", "true")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(bin_sriov(&node).as_deref(), Some(OPERATOR_SRIOV));
    assert_eq!(
        fs::metadata(node.path("bin/sriov")).expect("stat").ino(),
        ino
    );
    // The config is the same as in the other modes: the NADs' "type": "sriov" runs that binary.
    assert!(node.conf("00-plexus.conflist").exists());

    // A mode that does not exist is refused before anything is done.
    let fresh = operator_node();
    let out = fresh.run(&["--sriov-binary", "operator"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--sriov-binary must be install, skip or auto (got operator)"),
        "{stderr}"
    );
    assert!(!fresh.path("bin/plexus").exists());
    let out = fresh
        .command(&[])
        .env("PLEXUS_REPLACE_SRIOV_CNI", "yes")
        .output()
        .expect("run");
    assert!(!out.status.success(), "a typo is not consent");
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be true or false"));
}

#[test]
fn sriov_binary_auto_installs_where_free_and_defers_to_another_sriov() {
    let node = operator_node();
    let stderr = node.install(&["--sriov-binary", "auto"]);
    assert_eq!(bin_sriov(&node), Some(plexus_sriov(&node)), "{stderr}");
    // plexus' own is upgraded.
    fs::write(
        node.path("src/sriov"),
        "#!/bin/sh\n# plexus sriov v2, reads PLEXUS_SRIOV_STATE_DIR\n",
    )
    .expect("write");
    node.install(&["--sriov-binary", "auto"]);
    assert_eq!(bin_sriov(&node), Some(plexus_sriov(&node)));
    // The operator's daemon starts on the node and installs sriov-cni: plexus leaves it there
    // at every later start (an upgrade included), without failing.
    operator_installs_sriov_cni(&node);
    for _ in 0..2 {
        let out = node
            .command(&[])
            .env("PLEXUS_SRIOV_BINARY", "auto")
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(
            stderr.contains("left in place (--sriov-binary auto)"),
            "{stderr}"
        );
        assert_eq!(bin_sriov(&node).as_deref(), Some(OPERATOR_SRIOV));
        fs::write(
            node.path("src/sriov"),
            "#!/bin/sh\n# plexus sriov v3, reads PLEXUS_SRIOV_STATE_DIR\n",
        )
        .expect("write");
    }
    assert!(node.path("bin/plexus").exists());
}

/// PLEXUS_REPLACE_SRIOV_CNI replaces another sriov once. When a second installer puts its own
/// back (the operator's daemon pod restarting), plexus stops rather than overwrite it again: the
/// two DaemonSets' restarts never take turns over the file.
#[test]
fn replacing_another_sriov_happens_once_so_two_installers_never_take_turns() {
    let node = operator_node();
    operator_installs_sriov_cni(&node);
    let replace = |node: &Node| {
        node.command(&[])
            .env("PLEXUS_REPLACE_SRIOV_CNI", "true")
            .output()
            .expect("run")
    };
    let out = replace(&node);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("it will not be replaced again"), "{stderr}");
    assert_eq!(bin_sriov(&node), Some(plexus_sriov(&node)));
    let marker = node.conf("plexus.d/sriov-replaced");
    assert!(marker.exists());

    // Both DaemonSets restart a few times, in turn. The operator's copy is unconditional; plexus
    // overwrote once and never again.
    let mut plexus_overwrites = 0;
    for _ in 0..3 {
        operator_installs_sriov_cni(&node);
        let out = replace(&node);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            plexus_overwrites += 1;
        } else {
            assert!(
                stderr.contains("another sriov plugin again after plexus replaced one")
                    && stderr.contains("PLEXUS_SRIOV_BINARY=skip"),
                "{stderr}"
            );
        }
        assert_eq!(bin_sriov(&node).as_deref(), Some(OPERATOR_SRIOV));
    }
    assert_eq!(plexus_overwrites, 0);
    // The way out the message names: skip.
    let out = node
        .command(&[])
        .env("PLEXUS_SRIOV_BINARY", "skip")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(bin_sriov(&node).as_deref(), Some(OPERATOR_SRIOV));
    // plexus' own sriov is still upgraded without asking after that.
    fs::write(node.path("bin/sriov"), plexus_sriov(&node) + "# old\n").expect("write");
    node.install(&[]);
    assert_eq!(bin_sriov(&node), Some(plexus_sriov(&node)));
}

/// The watch loop (the DaemonSet's container runs for the node's lifetime) never copies a
/// binary: another sriov put over plexus' is reported, not overwritten, in every mode.
#[test]
fn the_watch_loop_never_copies_over_another_sriov() {
    for mode in ["install", "auto", "skip"] {
        let node = operator_node();
        if mode == "skip" {
            operator_installs_sriov_cni(&node);
        }
        let log = node.path("install.log");
        let proc = Reaped(
            node.command(&["--watch", "--watch-interval", "0.1", "--sriov-binary", mode])
                .stdout(Stdio::null())
                .stderr(fs::File::create(&log).expect("log"))
                .spawn()
                .expect("spawn"),
        );
        let read_log = || fs::read_to_string(&log).unwrap_or_default();
        let limit = Duration::from_secs(10);
        assert!(
            wait_until(limit, || read_log().contains("watching every")),
            "{mode}: {}",
            read_log()
        );
        // The operator's daemon (re)starts: sriov-cni lands over whatever is there; then it is
        // removed and put back, as a node's operator could.
        fs::write(node.path("bin/sriov"), "#!/bin/sh\n# the operator's, v2\n").expect("write");
        assert!(
            wait_until(limit, || read_log().contains(
                "sriov changed: now another sriov plugin (sriov-cni?); not reinstalled"
            )),
            "{mode}: {}",
            read_log()
        );
        fs::remove_file(node.path("bin/sriov")).expect("rm");
        assert!(
            wait_until(limit, || read_log()
                .contains("sriov changed: now none installed")),
            "{mode}: {}",
            read_log()
        );
        operator_installs_sriov_cni(&node);
        // Many passes later, still the operator's.
        std::thread::sleep(Duration::from_millis(800));
        assert_eq!(bin_sriov(&node).as_deref(), Some(OPERATOR_SRIOV), "{mode}");
        assert_eq!(
            read_log().matches("plexus-install: installed ").count(),
            if mode == "skip" { 1 } else { 2 },
            "{mode}: binaries installed at start only: {}",
            read_log()
        );
        drop(proc);
    }
}

#[test]
fn help_documents_the_sriov_binary_modes() {
    let out = Command::new("sh")
        .arg(script())
        .arg("--help")
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&out.stdout);
    let at = help
        .find("--sriov-binary MODE")
        .expect("--sriov-binary in --help");
    let section = &help[at..];
    for word in [
        "install:",
        "skip:",
        "auto:",
        "PLEXUS_REPLACE_SRIOV_CNI",
        "[install]",
    ] {
        assert!(section.contains(word), "{word}: {section}");
    }
}
