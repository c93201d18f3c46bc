//! The node's two config files: containerd's `config.toml` (its own root, state, socket and CNI
//! dirs, the locally built pause image; version 3 for containerd 2.x, version 2 for 1.6) and the kubelet's `KubeletConfiguration` (cgroupfs under
//! the node's own cgroup root, no eviction, no image GC).

use std::path::Path;

use anyhow::Result;

use super::super::free_port;
use super::super::pause::PAUSE_IMAGE;
use super::super::runtimes::Containerd;
use super::Node;

impl Node<'_> {
    pub(super) fn containerd_config(&self) -> String {
        let base = self.path("containerd");
        match self.containerd_bins().line {
            Containerd::V2 => containerd_config(&base, &self.bin_dir(), &self.conf_dir()),
            Containerd::V1_6 => containerd_1_6_config(&base, &self.bin_dir(), &self.conf_dir()),
        }
    }

    pub(super) fn kubelet_config(&self) -> Result<String> {
        let p = |s: &str| self.path(s).display().to_string();
        Ok(format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: "{cgroup_root}"
containerRuntimeEndpoint: "unix://{sock}"
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzPort: 0
failSwapOn: false
podLogsDir: "{logs}"
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
# "0%" switches a signal off. With any threshold met the kubelet reclaims by
# deleting "unused" containers and images (the tests import theirs locally:
# nothing can be pulled again) and refuses new pods: a nearly full disk on a test
# machine must not turn into pods that never start.
evictionHard: {{memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%", pid.available: "0%"}}
evictionSoft: {{}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
staticPodPath: ""
syncFrequency: 10s
nodeStatusUpdateFrequency: 2s
"#,
            cgroup_root = self.cgroup_root,
            sock = self.runtime_socket().display(),
            port = free_port()?,
            logs = p("kubelet/pod-logs"),
        ))
    }
}

/// containerd 2.x's `config.toml` (version 3) for a node whose containerd dirs are under `base`
/// (root, state, socket, opt, runc root), with the CNI plugins in `bin_dir` and configs in
/// `conf_dir`, and the locally built pause image; also used by the node inside the SR-IOV VM.
/// Version 3 splits the CRI plugin: images (snapshotter, pinned sandbox image), runtime
/// (runtimes, CNI with `bin_dirs`, `restrict_oom_score_adj`), and the gRPC service (streaming).
/// 2.3 migrates it to its version 4 in memory. NRI (on by default in 2.x, a socket in
/// /var/run/nri) is off and CDI reads no host directory: a node writes only under `base`.
pub fn containerd_config(base: &Path, bin_dir: &Path, conf_dir: &Path) -> String {
    format!(
        r#"{head}[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  enable_selinux = false
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{conf}"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
"#,
        head = head("version = 3\nimports = []", base),
        runc_root = base.join("runc").display(),
        bin = bin_dir.display(),
        conf = conf_dir.display(),
    )
}

/// containerd 1.6's `config.toml` (version 2), the compatibility tier's; same layout as
/// [`containerd_config`].
pub fn containerd_1_6_config(base: &Path, bin_dir: &Path, conf_dir: &Path) -> String {
    format!(
        r#"{head}[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
snapshotter = "overlayfs"
default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = false
    Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
bin_dir = "{bin}"
conf_dir = "{conf}"
"#,
        head = head("version = 2", base),
        runc_root = base.join("runc").display(),
        bin = bin_dir.display(),
        conf = conf_dir.display(),
    )
}

/// The part every containerd config version shares: `version_lines`, then root, state, the
/// gRPC and ttrpc sockets under `base`, no debug or metrics listener, the opt directory.
fn head(version_lines: &str, base: &Path) -> String {
    let p = |s: &str| base.join(s).display().to_string();
    format!(
        r#"{version_lines}
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"#,
        root = p("root"),
        state = p("state"),
        sock = p("containerd.sock"),
        opt = p("opt"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_containerd_configs_keep_every_path_under_the_node() {
        let (base, bin, conf) = (Path::new("/n/c"), Path::new("/n/bin"), Path::new("/n/conf"));
        let v3 = containerd_config(base, bin, conf);
        assert!(v3.starts_with("version = 3\nimports = []\nroot = \"/n/c/root\"\n"));
        assert!(v3.contains("bin_dirs = [\"/n/bin\"]") && v3.contains("Root = \"/n/c/runc\""));
        assert!(v3.contains("[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true"));
        let v2 = containerd_1_6_config(base, bin, conf);
        assert!(v2.starts_with("version = 2\nroot = \"/n/c/root\"\n"));
        assert!(
            v2.contains("bin_dir = \"/n/bin\"")
                && v2.contains("address = \"/n/c/containerd.sock.ttrpc\"")
        );
        for c in [&v3, &v2] {
            let outside: Vec<&str> = c
                .split('"')
                .filter(|s| s.starts_with('/') && !s.starts_with("/n/"))
                .collect();
            assert!(outside.is_empty(), "{outside:?}");
        }
    }
}
