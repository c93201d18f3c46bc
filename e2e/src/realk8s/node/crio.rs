//! A node on CRI-O 1.36 (`../shared/runtimes`, with Debian's runc and conmon): its config file
//! with every path under the node's directory (root, runroot, socket, version and clean-shutdown
//! files, exits and attach dirs, hooks, namespaces, runc's root, the namespaced auth dir CRI-O
//! creates at start-up (`/etc/crio/auth` by default); NRI off, no CDI dir), the
//! pause image copied into its containers-storage by skopeo, crio started in a mount namespace
//! of its own like containerd, and the conmon processes it leaves killed when the node stops.
//!
//! Where the pods' namespaces go: CRI-O pins them (pinns) under `namespaces_dir`, i.e.
//! `<ns>/netns`, `<ns>/ipcns`, `<ns>/utsns`. `<ns>` is the node's `crio/ns`, and the host's
//! `/run/netns` (a shared mount) is bind-mounted on `<ns>/netns` before crio starts: the pods'
//! network namespaces are in `/run/netns` like containerd's (`ip netns` sees them; the tests'
//! helpers take them by name there), and the IPC and UTS ones stay in the node's directory.
//! [`Node::host_netns`] maps a path CRI-O reports to `/run/netns/<name>`.
//!
//! hugetlb: on a cgroup v1 host without a `hugetlb` hierarchy (this one: the controller sits on
//! the unused v2 hierarchy) CRI-O 1.36 still logs "hugetlb cgroup is true" and puts the
//! kubelet's hugepage limits (one per page size the node has, 0 for a pod that asks none) into
//! the OCI spec, and runc fails every container ("cannot set hugetlb limit: container could not
//! join or create cgroup"). containerd drops them (`tolerate_missing_hugetlb_controller`, on by
//! default); CRI-O has no such setting. Such a node runs runc through a wrapper
//! ([`RUNC_WRAPPER`]) that removes `linux.resources.hugepageLimits` from the bundle's spec.
//!
//! Images: CRI-O refuses short names unless a registries.conf names search registries; the
//! node's own (`CONTAINERS_REGISTRIES_CONF`, never `/etc/containers`) lists `docker.io`, and the
//! tiers name their images fully (`docker.io/local/pause:1`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::mount::{mount, MsFlags};

use super::super::pause::PAUSE_IMAGE;
use super::super::runtimes::CrioBins;
use super::super::Proc;
use super::mount_ns::NodeMounts;
use super::{wait_for, Engine, Node};

/// CRI-O's socket, relative to the node's directory.
pub const SOCKET: &str = "crio/crio.sock";

/// runc for CRI-O on a host without a cgroup v1 `hugetlb` hierarchy: the bundle's spec loses
/// its hugepage limits, then runc runs (`{runc}` is replaced by runc's path).
const RUNC_WRAPPER: &str = r#"#!/bin/sh
# CRI-O's runtime_path on a cgroup v1 host without a hugetlb hierarchy (see node/crio.rs):
# the hugepage limits CRI-O puts in the spec would make runc fail every container.
prev=
for a in "$@"; do
	case $prev in --bundle | -b) bundle=$a ;; esac
	case $a in --bundle=*) bundle=${a#--bundle=} ;; esac
	prev=$a
done
if [ -n "${bundle:-}" ] && [ -f "$bundle/config.json" ]; then
	jq -c 'del(.linux.resources.hugepageLimits)' "$bundle/config.json" >"$bundle/config.json.tmp" &&
		mv "$bundle/config.json.tmp" "$bundle/config.json"
fi
exec {runc} "$@"
"#;

/// The drop-in turning on CRI-O's continuous CNI STATUS monitoring, relative to the node's
/// directory ([`Node::crio_cni_status_grace_period`]).
const CNI_STATUS_DROP_IN: &str = "crio/conf.d/50-cni-status.conf";

/// The host directory of named network namespaces (`ip netns`).
const RUN_NETNS: &str = "/run/netns";

impl Node<'_> {
    fn crio_bins(&self) -> Result<&CrioBins> {
        match &self.engine {
            Engine::Crio(b) => Ok(b),
            Engine::Containerd(_) => bail!("node {} runs containerd", self.name),
        }
    }

    /// CRI-O's config, the pause image in its storage, crio started.
    pub(super) fn boot_crio(&self, pause_tarball: &Path) -> Result<()> {
        let bins = self.crio_bins()?.clone();
        for d in [
            "crio/root",
            "crio/runroot",
            "crio/conf.d",
            "crio/hooks.d",
            "crio/exits",
            "crio/attach",
            "crio/keys",
            "crio/pod-logs",
            "crio/runc",
            "crio/ns/netns",
        ] {
            std::fs::create_dir_all(self.path(d))?;
        }
        // The pods' netns in the host's /run/netns (see the module doc).
        let ns_dir = self.path("crio/ns/netns");
        mount(
            Some(RUN_NETNS),
            &ns_dir,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .with_context(|| format!("bind {RUN_NETNS} onto {}", ns_dir.display()))?;
        std::fs::write(
            self.path("crio/policy.json"),
            r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )?;
        std::fs::write(
            self.path("crio/registries.conf"),
            "unqualified-search-registries = [\"docker.io\"]\nshort-name-mode = \"permissive\"\n",
        )?;
        let runc = if needs_hugetlb_wrapper() {
            let w = self.path("crio/runc-wrapper");
            std::fs::write(
                &w,
                RUNC_WRAPPER.replace("{runc}", &bins.runc.display().to_string()),
            )?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755))?;
            w
        } else {
            bins.runc.clone()
        };
        std::fs::write(self.path("crio/crio.conf"), self.crio_config(&bins, &runc))?;
        // Into the storage before crio runs: it then finds the pause image at start-up.
        self.skopeo_import(&bins, pause_tarball)?;
        self.start_crio()
    }

    /// CRI-O's continuous CNI STATUS monitoring (`cni_status_grace_period`, off by default:
    /// CRI-O then calls STATUS at start-up only): `Some(grace)` writes a drop-in to the node's
    /// `crio/conf.d` that turns it on (CRI-O polls STATUS every 5 s and reports NetworkReady=false
    /// once it has failed for `grace`), `None` removes it. Read at CRI-O's next start
    /// ([`Node::restart_runtime`]).
    pub fn crio_cni_status_grace_period(&self, grace: Option<Duration>) -> Result<()> {
        self.crio_bins()?;
        let file = self.path(CNI_STATUS_DROP_IN);
        match grace {
            Some(g) => std::fs::write(
                &file,
                format!(
                    "[crio.network]\ncni_status_grace_period = \"{}ms\"\n",
                    g.as_millis()
                ),
            )
            .with_context(|| format!("write {}", file.display())),
            None => match std::fs::remove_file(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("remove {}", file.display()))
                }
                _ => Ok(()),
            },
        }
    }

    /// CRI-O's config file (see the module doc).
    fn crio_config(&self, bins: &CrioBins, runc: &Path) -> String {
        let p = |s: &str| self.path(s).display().to_string();
        format!(
            r#"[crio]
root = "{root}"
runroot = "{runroot}"
storage_driver = "overlay"
log_dir = "{logs}"
version_file = "{version}"
version_file_persist = ""
clean_shutdown_file = "{clean}"

[crio.api]
listen = "{sock}"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
default_runtime = "runc"
pinns_path = "{pinns}"
namespaces_dir = "{ns}"
container_exits_dir = "{exits}"
container_attach_socket_dir = "{attach}"
hooks_dir = ["{hooks}"]
cdi_spec_dirs = []
decryption_keys_path = "{keys}"
apparmor_profile = "unconfined"
irqbalance_config_file = "{irqbalance}"
irqbalance_config_restore_file = "disable"
log_level = "info"

[crio.runtime.runtimes.runc]
runtime_path = "{runc}"
runtime_root = "{runc_root}"
monitor_path = "{conmon}"

[crio.image]
pause_image = "{PAUSE_IMAGE}"
pause_command = "/pause"
pinned_images = ["{PAUSE_IMAGE}"]
signature_policy = "{policy}"
signature_policy_dir = "{policies}"
namespaced_auth_dir = "{auth}"

[crio.network]
network_dir = "{conf}"
plugin_dirs = ["{bin}"]

[crio.nri]
enable_nri = false
nri_listen = "{nri}"
"#,
            root = p("crio/root"),
            runroot = p("crio/runroot"),
            logs = p("crio/pod-logs"),
            version = p("crio/version"),
            clean = p("crio/clean.shutdown"),
            sock = p(SOCKET),
            pinns = bins.pinns.display(),
            ns = p("crio/ns"),
            exits = p("crio/exits"),
            attach = p("crio/attach"),
            hooks = p("crio/hooks.d"),
            keys = p("crio/keys"),
            irqbalance = p("crio/irqbalance"),
            runc = runc.display(),
            runc_root = p("crio/runc"),
            conmon = bins.conmon.display(),
            policy = p("crio/policy.json"),
            policies = p("crio/policies"),
            auth = p("crio/auth"),
            conf = self.conf_dir().display(),
            bin = self.bin_dir().display(),
            nri = p("crio/nri.sock"),
        )
    }

    /// The mount namespace of crio and skopeo: libcni's cache and containers/image's blob-info
    /// cache (`/var/lib/containers/cache`) in the node's directory.
    fn crio_mounts(&self) -> NodeMounts {
        NodeMounts::default()
            .redirect("/var/lib/cni", self.host_path("/var/lib/cni"))
            .redirect("/var/lib/containers", self.host_path("/var/lib/containers"))
    }

    /// Start crio with the node's config and wait until it answers on its socket.
    pub(super) fn start_crio(&self) -> Result<()> {
        let bins = self.crio_bins()?;
        let args: Vec<String> = vec![
            "--config".into(),
            self.path("crio/crio.conf").display().to_string(),
            "--config-dir".into(),
            self.path("crio/conf.d").display().to_string(),
        ];
        let steps = self.crio_mounts().prepare()?;
        let registries = self.path("crio/registries.conf");
        let proc = Proc::spawn_with("crio", &bins.crio, &args, &self.path("crio.log"), |cmd| {
            cmd.env("CONTAINERS_REGISTRIES_CONF", &registries);
            steps.install(cmd);
        })?;
        *self.runtime.lock().unwrap_or_else(|e| e.into_inner()) = Some(proc);
        let log = self.path("crio.log");
        wait_for("crio's socket", Duration::from_secs(60), || {
            if let Some(p) = self
                .runtime
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
            {
                p.check_alive()
                    .with_context(|| super::super::tail(&log, 20))?;
            }
            Ok(self.path(SOCKET).exists() && self.cri.sandboxes(None).is_ok())
        })
    }

    /// `skopeo copy oci-archive:<tarball> containers-storage:[overlay@root+runroot]<name>`,
    /// `<name>` being the archive index's `org.opencontainers.image.ref.name`.
    pub(super) fn skopeo_import(&self, bins: &CrioBins, tarball: &Path) -> Result<()> {
        let name = archive_ref_name(tarball)?;
        let dest = format!(
            "containers-storage:[overlay@{}+{}]{name}",
            self.path("crio/root").display(),
            self.path("crio/runroot").display()
        );
        let steps = self.crio_mounts().prepare()?;
        let tmp = self.path("crio/tmp");
        std::fs::create_dir_all(&tmp)?;
        let mut cmd = Command::new(&bins.skopeo);
        cmd.env(
            "CONTAINERS_REGISTRIES_CONF",
            self.path("crio/registries.conf"),
        )
        .arg("--policy")
        .arg(self.path("crio/policy.json"))
        .arg("--tmpdir")
        .arg(&tmp)
        .arg("copy")
        .arg("--quiet")
        .arg(format!("oci-archive:{}", tarball.display()))
        .arg(&dest);
        steps.install(&mut cmd);
        let out = cmd.output().context("run skopeo")?;
        if !out.status.success() {
            bail!(
                "skopeo copy {} {dest}: {}",
                tarball.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// conmon processes of this node's crio (they leave its process group, as a shim does):
    /// killed by pid, found by the node's directory in their arguments.
    pub(super) fn kill_conmons(&self) {
        let dir = self.dir.path().display().to_string();
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return;
        };
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            if comm.trim() != "conmon" {
                continue;
            }
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(&dir) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// The conmon processes of this node still running (pids).
    pub fn conmons(&self) -> Vec<i32> {
        let dir = self.dir.path().display().to_string();
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
                let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                (comm.trim() == "conmon" && String::from_utf8_lossy(&cmd).contains(&dir))
                    .then_some(pid)
            })
            .collect()
    }

    /// A netns path the runtime reports, as the host names it: CRI-O's
    /// `<node>/crio/ns/netns/<name>` is `/run/netns/<name>`; anything else as it is.
    pub fn host_netns(&self, reported: &str) -> String {
        let ours = self.path("crio/ns/netns");
        match Path::new(reported).strip_prefix(&ours) {
            Ok(name) if !name.as_os_str().is_empty() => {
                PathBuf::from(RUN_NETNS).join(name).display().to_string()
            }
            _ => reported.to_string(),
        }
    }
}

/// Whether the host is on cgroup v1 without a `hugetlb` hierarchy (see the module doc).
fn needs_hugetlb_wrapper() -> bool {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    !v2 && !Path::new("/sys/fs/cgroup/hugetlb").exists()
}

/// The `org.opencontainers.image.ref.name` of an OCI archive's (single) manifest.
fn archive_ref_name(tarball: &Path) -> Result<String> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(tarball)
        .arg("index.json")
        .output()
        .context("run tar")?;
    if !out.status.success() {
        bail!(
            "tar -xOf {} index.json: {}",
            tarball.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let index: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("{}: no ref.name in index.json", tarball.display()))
}
