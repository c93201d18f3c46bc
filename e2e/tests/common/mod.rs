//! Shared helpers for the end-to-end tests: uniquely named namespaces and links removed on drop,
//! running the real `plexus` binary with the CNI protocol, and reading kernel state with `ip -j`.
#![allow(dead_code)]

pub mod fake_pf;
pub mod raw_api;
pub mod transfer;

use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where the Debian plugins live.
pub const CNI_BIN: &str = "/usr/lib/cni";

/// A unique short name (interface names are at most 15 bytes).
pub fn uniq(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}{}",
        std::process::id() % 10000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// The binaries under test, by the name they are installed and run under, and the file cargo
/// built for this package's tests: `e2e-<name>` (e2e/src/bin), a one-line call of the shipped
/// binary's library main (`plexus_meta::cli`, `plexus_sriov::cli`).
pub const BUILT: &[(&str, &str)] = &[
    ("plexus", env!("CARGO_BIN_EXE_e2e-plexus")),
    ("plexus-daemon", env!("CARGO_BIN_EXE_e2e-plexus-daemon")),
    ("plexus-shim", env!("CARGO_BIN_EXE_e2e-plexus-shim")),
    ("sriov", env!("CARGO_BIN_EXE_e2e-sriov")),
    ("sriov-fake-pf", env!("CARGO_BIN_EXE_e2e-sriov-fake-pf")),
];

/// `<target>/<profile>/e2e-bin`: where [`bin`] links the binaries under their real names, next
/// to the files cargo built (same filesystem; inside the VM tier's guest, the same path over the
/// host root's 9p share).
pub fn bin_dir() -> PathBuf {
    Path::new(BUILT[0].1)
        .parent()
        .expect("cargo's binary directory")
        .join("e2e-bin")
}

/// The binary under test `name` (`plexus`, `plexus-daemon`, `sriov`, `sriov-fake-pf`), named
/// exactly `name` (tests put it into CNI bin dirs, the installer copies it by name, `plexus
/// daemon` runs the `plexus-daemon` next to it): `bin_dir()/name`, a hard link to the file cargo
/// built for this test run (`CARGO_BIN_EXE_e2e-<name>`), so no manual build and no stale
/// `target/debug` file. `PLEXUS_<NAME>_BIN` overrides the path.
pub fn bin(name: &str) -> PathBuf {
    let var = format!("PLEXUS_{}_BIN", name.to_uppercase().replace('-', "_"));
    if let Ok(p) = std::env::var(var) {
        return PathBuf::from(p);
    }
    assert!(
        BUILT.iter().any(|(n, _)| *n == name),
        "no binary {name:?} under test (see common::BUILT)"
    );
    // All of them at once, once per process: `plexus daemon` needs its `plexus-daemon` too.
    static LINKED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LINKED
        .get_or_init(|| {
            let dir = bin_dir();
            for (n, built) in BUILT {
                link_binary(Path::new(built), &dir.join(n)).unwrap_or_else(|e| {
                    panic!("cannot link {built} as {}: {e}", dir.join(n).display())
                });
            }
            dir
        })
        .join(name)
}

/// Makes `dest` the file `src` unless it already is: a hard link (a copy with the same mtime
/// where hard links fail) made under a temporary name and renamed over `dest`, so parallel
/// test processes never see a partial file or a missing one.
pub fn link_binary(src: &Path, dest: &Path) -> std::io::Result<()> {
    if same_binary(src, dest) {
        return Ok(());
    }
    let dir = dest.parent().expect("dest has a directory");
    std::fs::create_dir_all(dir)?;
    static N: AtomicU32 = AtomicU32::new(0);
    let tmp = dir.join(format!(
        ".{}.{}.{}",
        dest.file_name().unwrap().to_string_lossy(),
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(src, &tmp).is_err() {
        std::fs::copy(src, &tmp)?;
        let mtime = std::fs::metadata(src)?.modified()?;
        std::fs::File::options()
            .write(true)
            .open(&tmp)?
            .set_modified(mtime)?;
    }
    let renamed = std::fs::rename(&tmp, dest);
    // rename(2) leaves both names when they already are the same file (a parallel process won).
    let _ = std::fs::remove_file(&tmp);
    renamed
}

/// Whether `dest` is `src`: the same inode, or (a copy) the same size and modification time.
fn same_binary(src: &Path, dest: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(src), std::fs::metadata(dest)) {
        (Ok(a), Ok(b)) => {
            (a.dev(), a.ino()) == (b.dev(), b.ino())
                || (a.len(), a.mtime(), a.mtime_nsec()) == (b.len(), b.mtime(), b.mtime_nsec())
        }
        _ => false,
    }
}

/// Run `ip` with args; stdout.
pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named network namespace, deleted on drop.
pub struct Netns {
    /// Its name.
    pub name: String,
}

impl Netns {
    /// Create one.
    pub fn new() -> Netns {
        let name = uniq("pxe");
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add {name}");
        Netns { name }
    }
    /// `/run/netns/<name>`
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }
    /// `ip -n <ns> <args>` output.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        ip(&a)
    }
    /// Link names in the namespace.
    pub fn links(&self) -> Vec<String> {
        let v: Value = serde_json::from_str(&self.ip(&["-j", "link", "show"])).unwrap_or(json!([]));
        v.as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l["ifname"].as_str().map(str::to_string))
            .collect()
    }
    /// IPv4/IPv6 addresses (CIDR) of an interface.
    pub fn addrs(&self, ifname: &str) -> Vec<String> {
        let v: Value = serde_json::from_str(&self.ip(&["-j", "addr", "show", "dev", ifname]))
            .unwrap_or(json!([]));
        v.as_array()
            .and_then(|a| a.first())
            .and_then(|l| l["addr_info"].as_array())
            .map(|a| {
                a.iter()
                    .filter(|i| i["scope"] != "link")
                    .map(|i| format!("{}/{}", i["local"].as_str().unwrap(), i["prefixlen"]))
                    .collect()
            })
            .unwrap_or_default()
    }
    /// MAC of an interface.
    pub fn mac(&self, ifname: &str) -> String {
        let v: Value =
            serde_json::from_str(&self.ip(&["-j", "link", "show", ifname])).unwrap_or(json!([]));
        v[0]["address"].as_str().unwrap_or("").to_string()
    }
    /// `ip route` text.
    pub fn routes(&self) -> String {
        self.ip(&["route"])
    }
    /// Delete the namespace now (for "netns gone" cases).
    pub fn delete(&self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.delete();
    }
}

/// A host link (bridge, veth) deleted on drop.
pub struct HostLink(pub String);

impl HostLink {
    /// A veth pair whose first end (returned) is up: a macvlan master.
    pub fn veth_master() -> HostLink {
        let a = uniq("pxm");
        let b = uniq("pxp");
        let ok = Command::new("ip")
            .args(["link", "add", &a, "type", "veth", "peer", "name", &b])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        ip(&["link", "set", &a, "up"]);
        ip(&["link", "set", &b, "up"]);
        HostLink(a)
    }
    /// A name for a bridge a plugin will create (deleted on drop).
    pub fn bridge_name() -> HostLink {
        HostLink(uniq("pxbr"))
    }
}

impl Drop for HostLink {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

/// What a plugin run printed.
#[derive(Debug)]
pub struct Run {
    /// Exit code.
    pub code: i32,
    /// Parsed stdout (Null when empty).
    pub out: Value,
    /// stderr text.
    pub stderr: String,
}

impl Run {
    /// Assert success and return stdout.
    pub fn ok(&self) -> &Value {
        assert_eq!(
            self.code, 0,
            "plugin failed: {} / {}",
            self.out, self.stderr
        );
        &self.out
    }
    /// Assert failure and return the error object.
    pub fn err(&self) -> &Value {
        assert_ne!(self.code, 0, "plugin unexpectedly succeeded: {}", self.out);
        &self.out
    }
}

/// One CNI call of a binary.
pub struct Call<'a> {
    /// `CNI_COMMAND`
    pub command: &'a str,
    /// `CNI_CONTAINERID`
    pub container_id: &'a str,
    /// `CNI_NETNS`
    pub netns: &'a str,
    /// `CNI_IFNAME`
    pub ifname: &'a str,
    /// `CNI_ARGS`
    pub args: &'a str,
}

/// Run `binary` with the call's environment and `stdin`.
/// Spawn `cmd`, retrying "text file busy": a script a test has just written can be held open
/// for writing by the child of another test thread between its fork and exec.
fn spawn_retrying_busy(cmd: &mut Command) -> std::process::Child {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.expect("spawn plugin"),
        }
    }
}

pub fn run(binary: &Path, call: &Call<'_>, stdin: &Value, extra_env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(binary);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", call.command)
        .env("CNI_CONTAINERID", call.container_id)
        .env("CNI_NETNS", call.netns)
        .env("CNI_IFNAME", call.ifname)
        .env("CNI_ARGS", call.args)
        .env("CNI_PATH", CNI_BIN)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = spawn_retrying_busy(&mut cmd);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    Run {
        code: out.status.code().unwrap_or(-1),
        out: if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text}))
        },
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Files under a directory, recursively (relative paths), excluding lock files and the
/// node-wide markers that are no pod's state: host-local's `last_reserved_ip*`, plexus'
/// tombstones, `locks/claims-off` and `locks/claims-allowed` (what the node last learnt of
/// AddressClaims: no CRD or no right a moment ago, or allowed).
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                if name != "lock"
                    && name != "claims-off"
                    && name != "claims-allowed"
                    && !name.starts_with("last_reserved_ip")
                    && !rel.starts_with("tombstones")
                {
                    out.push(rel);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// A flannel-shaped default network: bridge + host-local on a /24 of 10.244.0.0/16.
pub fn flannel_like(bridge: &str, subnet_octet: u8, ipam_dir: &Path) -> Value {
    json!({"cniVersion":"1.0.0","name":"cbr0","plugins":[
        {"type":"bridge","bridge":bridge,"isGateway":true,"isDefaultGateway":true,"ipMasq":false,"hairpinMode":true,
         "ipam":{"type":"host-local","dataDir":ipam_dir,"ranges":[[{"subnet":format!("10.244.{subnet_octet}.0/24")}]],"routes":[{"dst":"10.244.0.0/16","gw":format!("10.244.{subnet_octet}.1")}]}}]})
}

/// A script that runs `binary` (stdin, environment and all) in a private mount namespace where
/// `ro_dir` is mounted read-only: the host's view of `ro_dir` never changes, and nothing has to
/// be undone when a test fails. Written under `script_dir`.
pub fn with_read_only_dir(script_dir: &Path, binary: &Path, ro_dir: &Path) -> PathBuf {
    let path = script_dir.join(format!("ro-{}", uniq("w")));
    let body = format!(
        "#!/bin/sh\nexec unshare -m --propagation private sh -c 'mount -o bind,ro \"$1\" \"$1\" && exec \"$2\"' ro {} {}\n",
        ro_dir.display(),
        binary.display()
    );
    std::fs::write(&path, body).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The user-facing documents: `README.md` and `docs/*.md`, sorted.
pub fn user_documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

/// The fenced blocks of `lang` in a markdown text, with their first line number.
pub fn markdown_blocks(text: &str, lang: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        match &mut cur {
            None if t.starts_with("```") && t[3..].trim() == lang => {
                cur = Some((i + 2, String::new()))
            }
            Some(_) if t.starts_with("```") => out.extend(cur.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    out
}
