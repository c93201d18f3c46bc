//! What a killed test run left on the host, taken back before a node starts.
//!
//! [`super::Node::stop`] cleans up on every normal exit, but a SIGKILLed run (a timeout, the
//! end of a session) leaves its node behind: mounts under its directory, the `cni-*` netns
//! files containerd pinned (and so the pods' host-side veths and routes), its cgroup root and
//! its links. The next run's leak checks would count them as its own. A run is dead when no
//! containerd, crio or kubelet names its directory; only the test runs' own names are touched
//! (`/tmp/plexus-node-*`, `plexus-node-<pid>` cgroups, the node tiers' `px<tier><pid>…` links, `cni-*`
//! and CRI-O's UUID-named netns nobody is in, only while no node of any run is alive).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::host::{cgroup_mounts, remove_cgroup_tree, unmount_under};

/// The file a node stopped with `PLEXUS_K8S_KEEP` leaves in its directory: kept on purpose.
pub(super) const KEPT: &str = "kept";

/// Take back what dead test runs left (never `own`, the starting node's directory); say what
/// was removed.
pub(super) fn sweep_dead_runs(own: &Path) {
    let procs = processes();
    let tmp = std::env::temp_dir();
    let node_dirs: Vec<PathBuf> = dirs_with_prefix(&tmp, "plexus-node-")
        .into_iter()
        .filter(|d| d != own && !d.join(KEPT).exists())
        .collect();
    let live = |d: &Path| {
        let s = d.display().to_string();
        procs.iter().any(|p| {
            matches!(p.name.as_str(), "containerd" | "crio" | "kubelet")
                && p.args.iter().any(|a| a.contains(&s))
        })
    };
    let dead: Vec<&PathBuf> = node_dirs.iter().filter(|d| !live(d)).collect();
    let any_live = dead.len() < node_dirs.len();
    for d in &dead {
        // Shims (and so the pods' pause processes) can outlive a killed containerd.
        let s = d.display().to_string();
        for p in procs
            .iter()
            .filter(|p| p.args.iter().any(|a| a.contains(&s)))
        {
            kill(p.pid);
        }
    }
    let cgroups = dead_cgroup_roots();
    for c in &cgroups {
        kill_members(c);
    }
    for d in &dead {
        unmount_under(d);
        match std::fs::remove_dir_all(d) {
            Ok(()) => eprintln!("realk8s: removed {} (a killed run's node)", d.display()),
            Err(e) => eprintln!("realk8s: remove {}: {e}", d.display()),
        }
    }
    for c in &cgroups {
        remove_cgroup_tree(c);
    }
    if !any_live {
        remove_empty_cni_netns(&processes());
        remove_per_container_nat();
    }
    remove_dead_runs_links();
    for d in dirs_with_prefix(&tmp, "plexus-k8s-") {
        let s = d.display().to_string();
        let owner_alive = std::fs::read_to_string(d.join(super::super::OWNER_FILE))
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
            .is_some_and(alive);
        if !owner_alive && !procs.iter().any(|p| p.args.iter().any(|a| a.contains(&s))) {
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}

/// At a node's stop, when no other test node is alive: the per-container NAT chains left by
/// the peers the tiers measure (Multus leaves a hundred per churn row) go with the node.
pub(super) fn after_stop(own: &Path) {
    let own = own.display().to_string();
    let others = processes().iter().any(|p| {
        matches!(p.name.as_str(), "containerd" | "crio" | "kubelet")
            && p.args
                .iter()
                .any(|a| a.contains("/plexus-node-") && !a.contains(&own))
    });
    if !others {
        remove_per_container_nat();
    }
}

/// Whether `chain` is a CNI plugin's per-container NAT chain: bridge's `ipMasq` chain
/// (`CNI-<24 hex>`) or portmap's DNAT chain (`CNI-DN-<hex>`).
fn per_container_chain(chain: &str) -> bool {
    let hex = chain
        .strip_prefix("CNI-DN-")
        .or_else(|| chain.strip_prefix("CNI-"));
    hex.is_some_and(|h| h.len() >= 16 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The `iptables-restore --noflush` input that removes the per-container chains of a
/// `iptables-save -t nat` dump and every rule jumping to them (empty: none).
fn nat_cleanup_script(dump: &str) -> String {
    let chains: Vec<&str> = dump
        .lines()
        .filter_map(|l| l.strip_prefix(':')?.split(' ').next())
        .filter(|c| per_container_chain(c))
        .collect();
    if chains.is_empty() {
        return String::new();
    }
    let mut script = String::from("*nat\n");
    for l in dump.lines().filter(|l| l.starts_with("-A ")) {
        let target = l.rsplit_once(" -j ").map(|(_, t)| t.trim());
        if target.is_some_and(|t| chains.contains(&t)) {
            script.push_str(&format!("-D {}\n", &l[3..]));
        }
    }
    for c in &chains {
        script.push_str(&format!("-F {c}\n-X {c}\n"));
    }
    script.push_str("COMMIT\n");
    script
}

/// Remove the per-container NAT chains CNI plugins left in the host's table, with the rules
/// jumping to them: thousands of them (runs killed, peers' leaks, kept across runs on one
/// machine) make every later iptables call slow (nf_tables reads the whole table each time),
/// enough for the bridge plugin's `ipMasq` to time out under churn.
fn remove_per_container_nat() {
    let Ok(out) = Command::new("iptables-save").args(["-t", "nat"]).output() else {
        return;
    };
    let script = nat_cleanup_script(&String::from_utf8_lossy(&out.stdout));
    if script.is_empty() {
        return;
    }
    let n = script.lines().filter(|l| l.starts_with("-X ")).count();
    let restored = Command::new("iptables-restore")
        .arg("--noflush")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().map(|mut i| i.write_all(script.as_bytes()));
            c.wait()
        });
    match restored {
        Ok(st) if st.success() => {
            eprintln!("realk8s: removed {n} leftover per-container NAT chains")
        }
        other => eprintln!("realk8s: removing {n} leftover NAT chains failed: {other:?}"),
    }
}

/// A running process: pid, command name (`comm`) and arguments.
struct ProcInfo {
    pid: i32,
    name: String,
    args: Vec<String>,
}

fn processes() -> Vec<ProcInfo> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let name = std::fs::read_to_string(e.path().join("comm")).ok()?;
            Some(ProcInfo {
                pid,
                name: name.trim().to_string(),
                args: cmd
                    .split(|&b| b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect(),
            })
        })
        .collect()
}

fn dirs_with_prefix(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn kill(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// `plexus-node-<pid>` cgroups (every hierarchy) whose test process is gone.
fn dead_cgroup_roots() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for m in cgroup_mounts() {
        for d in dirs_with_prefix(&m, "plexus-node-") {
            let pid = d
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("plexus-node-"))
                .and_then(|n| n.parse::<u32>().ok());
            if pid.is_some_and(|p| !alive(p)) {
                v.push(d);
            }
        }
    }
    v
}

/// SIGKILL every process in the cgroup tree `d`.
fn kill_members(d: &Path) {
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            kill_members(&e.path());
        }
    }
    let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        kill(pid);
    }
}

/// The netns inode a `/proc/<pid>/ns/net` link or a `/run/netns` file names.
fn netns_inode(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| m.ino())
}

/// Whether `name` is a pod netns name CRI-O's pinns gives (a UUID, `8-4-4-4-12` hex digits).
fn crio_netns_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Remove `/run/netns/cni-*` files (containerd's) and UUID-named ones (CRI-O's) no process is
/// in (a live sandbox has its pause process).
fn remove_empty_cni_netns(procs: &[ProcInfo]) {
    let used: BTreeSet<u64> = procs
        .iter()
        .filter_map(|p| netns_inode(Path::new(&format!("/proc/{}/ns/net", p.pid))))
        .collect();
    let crio: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| crio_netns_name(n))
        .collect();
    for name in super::host::cni_netns().into_iter().chain(crio) {
        let p = Path::new("/run/netns").join(&name);
        if netns_inode(&p).is_some_and(|i| used.contains(&i)) {
            continue;
        }
        let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        if std::fs::remove_file(&p).is_ok() {
            eprintln!("realk8s: removed netns {name} (a killed run's pod)");
        }
    }
}

/// The node tiers' link name tags: `px<tier letter><pid><letters>` (real_node_churn,
/// real_node, real_node_daemon, real_statefulset, real_node_crio). Other test links (`common::uniq`'s
/// `<prefix><pid % 10000><counter>`) carry no exact pid and are never swept.
const NODE_TIER_TAGS: [&str; 5] = ["pxc", "pxn", "pxd", "pxs", "pxo"];

/// The test process id a node tier's link name carries.
fn link_owner(name: &str) -> Option<u32> {
    let tail = NODE_TIER_TAGS.iter().find_map(|t| name.strip_prefix(t))?;
    let digits: String = tail.chars().take_while(char::is_ascii_digit).collect();
    let suffix = &tail[digits.len()..];
    if digits.is_empty() || suffix.is_empty() || !suffix.chars().all(|c| c.is_ascii_lowercase()) {
        return None;
    }
    digits.parse().ok()
}

/// Delete the host links of test runs whose process is gone.
fn remove_dead_runs_links() {
    let out = Command::new("ip").args(["-j", "link", "show"]).output();
    let links: serde_json::Value = out
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or_default();
    for l in links.as_array().into_iter().flatten() {
        let Some(name) = l["ifname"].as_str() else {
            continue;
        };
        if link_owner(name).is_some_and(|pid| !alive(pid)) {
            let _ = Command::new("ip").args(["link", "del", name]).status();
            eprintln!("realk8s: removed link {name} (a killed run's)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{crio_netns_name, link_owner, nat_cleanup_script};

    #[test]
    fn crio_netns_names_are_uuids() {
        assert!(crio_netns_name("c5e24b0d-42e4-40e0-8381-15e9995580a2"));
        for other in [
            "cni-51cf552c-c34b-9ed5-41d7-2a29dd78b358",
            "pxo4242g",
            "c5e24b0d-42e4-40e0-8381-15e9995580a",
            "g5e24b0d-42e4-40e0-8381-15e9995580a2",
            "",
        ] {
            assert!(!crio_netns_name(other), "{other}");
        }
    }

    #[test]
    fn nat_cleanup_removes_per_container_chains_and_their_jumps_only() {
        let dump = r#"*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-18a7fc6da3589bc0eea7b6c8 - [0:0]
:CNI-DN-1c7bd3d1ab6e4e5b8a4f0 - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A POSTROUTING -s 10.242.0.153/32 -m comment --comment "name: \"cbr0\" id: \"6a05\"" -j CNI-18a7fc6da3589bc0eea7b6c8
-A CNI-18a7fc6da3589bc0eea7b6c8 -d 10.242.0.0/24 -j ACCEPT
-A CNI-HOSTPORT-DNAT -p tcp -j CNI-DN-1c7bd3d1ab6e4e5b8a4f0
COMMIT
"#;
        let s = nat_cleanup_script(dump);
        assert_eq!(
            s,
            "*nat\n\
             -D POSTROUTING -s 10.242.0.153/32 -m comment --comment \"name: \\\"cbr0\\\" id: \\\"6a05\\\"\" -j CNI-18a7fc6da3589bc0eea7b6c8\n\
             -D CNI-HOSTPORT-DNAT -p tcp -j CNI-DN-1c7bd3d1ab6e4e5b8a4f0\n\
             -F CNI-18a7fc6da3589bc0eea7b6c8\n-X CNI-18a7fc6da3589bc0eea7b6c8\n\
             -F CNI-DN-1c7bd3d1ab6e4e5b8a4f0\n-X CNI-DN-1c7bd3d1ab6e4e5b8a4f0\n\
             COMMIT\n"
        );
        assert_eq!(
            nat_cleanup_script("*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"),
            ""
        );
    }

    #[test]
    fn link_owner_reads_the_pid_of_test_links_only() {
        assert_eq!(link_owner("pxc31888ca"), Some(31888));
        assert_eq!(link_owner("pxn2601f"), Some(2601));
        assert_eq!(link_owner("pxd77v"), Some(77));
        assert_eq!(link_owner("pxs123a"), Some(123));
        assert_eq!(link_owner("pxo4242fm"), Some(4242));
        for other in [
            "pxc12",
            "pxm12341",
            "pxp12342",
            "pxbr99",
            "pxu12m",
            "eth0",
            "ifb0",
            "lo",
            "px",
            "pxc",
            "pxcab",
            "pxc12x3",
            "cali12",
            "flannel.1",
        ] {
            assert_eq!(link_owner(other), None, "{other}");
        }
    }
}
