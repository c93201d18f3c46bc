//! STATUS as the runtimes call it: containerd ≥ 2.0.1 on every CRI `Status` (the kubelet asks
//! every few seconds) and CRI-O continuously, whenever plexus' config runs at `cniVersion`
//! 1.1.0. Any error sets the node's NetworkReady=false, so the node goes NotReady and its
//! message reaches `kubectl describe node`.
//!
//! So STATUS reads only local files and runs only the default network's own STATUS: no API
//! request, no daemon (daemon mode's shim answers it in-process, [`crate::shim`]). It fails for
//! what would fail every pod's ADD: the readiness indicator file missing, the cluster network's
//! config unreadable, one of its plugins not installed, or its own STATUS failing. A failure
//! is probed once more after [`SETTLE`] before it is reported, so a file caught in the middle
//! of a non-atomic rewrite (an overlay's installer copying its conflist in place) does not flap
//! the node; a real outage fails both probes. The error names plexus' network, the default
//! network and the cause.

use super::default_network;
use crate::context::Ctx;
use crate::error::MetaError;
use plexus_conf::error::{code, CniError};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a failed probe waits before the second one.
pub const SETTLE: Duration = Duration::from_millis(200);

/// STATUS: ready when both probes agree it is not, else `Ok`. Logs one line per call (debug;
/// a failure at warn, a failure that the second probe cleared at info).
pub fn run(ctx: &mut Ctx) -> Result<(), MetaError> {
    let started = Instant::now();
    let first = probe(ctx);
    let (outcome, retried) = match first {
        Ok(net) => (Ok(net), false),
        Err(first) => {
            std::thread::sleep(SETTLE);
            let second = probe(ctx);
            if second.is_ok() {
                tracing::info!(network = %ctx.config.name, first_error = %first,
                    "STATUS: a transient failure cleared on the second probe");
            }
            (second, true)
        }
    };
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    match outcome {
        Ok(default) => {
            tracing::debug!(network = %ctx.config.name, default = default.as_deref().unwrap_or("-"),
                retried, elapsed_ms, "STATUS done: ready");
            Ok(())
        }
        Err(e) => {
            tracing::warn!(network = %ctx.config.name, code = e.code, error = %e, elapsed_ms,
                "STATUS done: not ready");
            Err(MetaError::Delegate {
                source: Box::new(e),
            })
        }
    }
}

/// One look at the node's readiness: the default network's name when known (`None`: it is a
/// NAD, which STATUS cannot read without the API).
fn probe(ctx: &mut Ctx) -> Result<Option<String>, CniError> {
    let ours = network_label(&ctx.config.name);
    let default = default_network(ctx).map_err(|e| {
        CniError::new(
            code::NOT_AVAILABLE,
            format!(
                "{ours}: the cluster network's config {} cannot be loaded",
                cluster_label(ctx)
            ),
            join(
                &e.to_string(),
                "every pod's ADD would fail; restore the cluster network (its DaemonSet writes \
                 this file) or fix clusterNetwork in plexus' config",
            ),
        )
    })?;
    let default_name = default.as_ref().map(|l| l.name.clone());
    let f = &ctx.config.readiness_indicator_file;
    if !f.is_empty() && !Path::new(f).exists() {
        return Err(CniError::new(
            code::NOT_AVAILABLE,
            format!(
                "{ours}: the default network{} is not ready",
                default_name
                    .as_deref()
                    .map(|n| format!(" {n}"))
                    .unwrap_or_default()
            ),
            format!(
                "readiness indicator file {f} does not exist (the cluster network's agent \
                 writes it once it runs on this node)"
            ),
        ));
    }
    let Some(list) = default else {
        return Ok(None);
    };
    for p in &list.plugins {
        plexus_delegates::find_plugin(p.plugin_type(), &ctx.runtime.search_path).map_err(|e| {
            CniError::new(
                code::NOT_AVAILABLE,
                format!(
                    "{ours}: default network {}: plugin {} is not installed",
                    list.name,
                    p.plugin_type()
                ),
                join(
                    &e.details,
                    "every pod's ADD would fail; reinstall the cluster network's plugins",
                ),
            )
        })?;
    }
    ctx.runtime
        .status(&list)
        .map_err(|e| e.context(format!("{ours}: default network {}", list.name)))?;
    Ok(Some(list.name))
}

/// `network "<plexus' name>"` (or `plexus` when the config has none).
fn network_label(name: &str) -> String {
    if name.is_empty() {
        "plexus".into()
    } else {
        format!("network {name}")
    }
}

/// The clusterNetwork value as the error names it.
fn cluster_label(ctx: &Ctx) -> String {
    if ctx.config.cluster_network.is_empty() {
        "(the first delegate)".into()
    } else {
        ctx.config.cluster_network.clone()
    }
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.into()
    } else {
        format!("{a}; {b}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_delegates::skel::{CmdArgs, Command};
    use std::os::unix::fs::PermissionsExt;

    struct Node {
        dir: tempfile::TempDir,
    }

    impl Node {
        fn new() -> Node {
            let n = Node {
                dir: tempfile::tempdir().unwrap(),
            };
            std::fs::create_dir(n.p("bin")).unwrap();
            for plugin in ["fakeflannel", "fakeportmap"] {
                n.plugin(plugin, "exit 0");
            }
            n.primary("0.3.1");
            n
        }

        fn p(&self, rel: &str) -> std::path::PathBuf {
            self.dir.path().join(rel)
        }

        fn plugin(&self, name: &str, body: &str) {
            let path = self.p(&format!("bin/{name}"));
            std::fs::write(&path, format!("#!/bin/sh\ncat >/dev/null\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }

        fn primary(&self, version: &str) {
            std::fs::write(
                self.p("10-flannel.conflist"),
                format!(
                    r#"{{"cniVersion":"{version}","name":"cbr0","plugins":[{{"type":"fakeflannel"}},{{"type":"fakeportmap"}}]}}"#
                ),
            )
            .unwrap();
        }

        fn ctx(&self, extra: &str) -> Ctx {
            let stdin = format!(
                r#"{{"cniVersion":"1.1.0","name":"plexus-cni-network","type":"plexus","clusterNetwork":"{}","cniDir":"{}"{extra}}}"#,
                self.p("10-flannel.conflist").display(),
                self.p("state").display()
            );
            let args = CmdArgs {
                command: Command::Status,
                container_id: String::new(),
                netns: String::new(),
                ifname: String::new(),
                args: String::new(),
                path: vec![self.p("bin")],
                stdin: stdin.into_bytes(),
            };
            Ctx::new(&args, None).unwrap()
        }

        fn status(&self, extra: &str) -> Result<(), CniError> {
            run(&mut self.ctx(extra)).map_err(CniError::from)
        }
    }

    #[test]
    fn ready_over_a_working_cluster_network_of_any_version() {
        let n = Node::new();
        n.status("").unwrap();
        // At 1.1.0 the network's own STATUS runs (these plugins know it: they exit 0).
        n.plugin(
            "fakeflannel",
            r#"[ "$CNI_COMMAND" = VERSION ] && echo '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}'; exit 0"#,
        );
        n.plugin(
            "fakeportmap",
            r#"[ "$CNI_COMMAND" = VERSION ] && echo '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}'; exit 0"#,
        );
        n.primary("1.1.0");
        n.status("").unwrap();
    }

    #[test]
    fn each_real_cause_names_plexus_network_the_default_network_and_why() {
        let n = Node::new();
        // The readiness indicator file.
        let ready = n.p("subnet.env");
        let extra = format!(r#","readinessindicatorfile":"{}""#, ready.display());
        let e = n.status(&extra).unwrap_err();
        assert_eq!(e.code, 50, "{e}");
        assert!(
            e.msg
                .contains("network plexus-cni-network: the default network cbr0 is not ready")
                && e.details.contains(&format!(
                    "readiness indicator file {} does not exist",
                    ready.display()
                )),
            "{e}"
        );
        std::fs::write(&ready, "").unwrap();
        n.status(&extra).unwrap();

        // A plugin of the cluster network is gone.
        std::fs::remove_file(n.p("bin/fakeportmap")).unwrap();
        let e = n.status("").unwrap_err();
        assert_eq!(e.code, 50, "{e}");
        assert!(
            e.msg.contains(
                "network plexus-cni-network: default network cbr0: plugin fakeportmap is not installed"
            ) && e.details.contains(&n.p("bin").display().to_string()),
            "{e}"
        );
        n.plugin("fakeportmap", "exit 0");

        // The cluster network's config is gone.
        std::fs::remove_file(n.p("10-flannel.conflist")).unwrap();
        let e = n.status("").unwrap_err();
        assert_eq!(e.code, 50, "{e}");
        assert!(
            e.msg
                .starts_with("network plexus-cni-network: the cluster network's config ")
                && e.msg.contains("10-flannel.conflist cannot be loaded")
                && e.details.contains("No such file"),
            "{e}"
        );
        // Half-written (an installer copying in place, caught for good).
        std::fs::write(n.p("10-flannel.conflist"), r#"{"cniVersion":"0.3.1","na"#).unwrap();
        let e = n.status("").unwrap_err();
        assert!(e.msg.contains("cannot be loaded"), "{e}");
    }

    #[test]
    fn the_default_networks_own_status_failure_keeps_its_code_and_names_both_networks() {
        let n = Node::new();
        n.plugin(
            "fakeflannel",
            r#"case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}';;
STATUS) echo '{"cniVersion":"1.1.0","code":51,"msg":"flanneld is not running","details":"no lease"}'; exit 1;;
esac
exit 0"#,
        );
        n.plugin(
            "fakeportmap",
            r#"[ "$CNI_COMMAND" = VERSION ] && echo '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}'; exit 0"#,
        );
        n.primary("1.1.0");
        let e = n.status("").unwrap_err();
        assert_eq!(e.code, 51, "{e}");
        assert!(
            e.msg
                .starts_with("network plexus-cni-network: default network cbr0: ")
                && e.msg.contains("flanneld is not running"),
            "{e}"
        );
        // Below 1.1.0 the network is not sent STATUS (libcni's rule): ready.
        n.primary("1.0.0");
        n.status("").unwrap();
    }

    #[test]
    fn a_config_rewritten_within_the_settle_time_does_not_fail() {
        let n = Node::new();
        let path = n.p("10-flannel.conflist");
        let good = std::fs::read(&path).unwrap();
        // Truncated now, whole again well within SETTLE: the second probe sees it whole.
        std::fs::write(&path, b"").unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(SETTLE / 4);
            std::fs::write(&path, good).unwrap();
        });
        let t = Instant::now();
        n.status("").unwrap();
        writer.join().unwrap();
        assert!(t.elapsed() >= SETTLE, "the first probe failed and waited");
    }
}
