//! Daemon mode's CNI entry: when the config the runtime passes has `daemonSocket`, `plexus`
//! forwards the call (its `CNI_*` environment and stdin) to `plexus daemon` over that Unix
//! socket and prints the answer. It reads no API, starts no async runtime and parses only
//! the few keys below, so it costs a process start and one round trip on the socket.
//!
//! STATUS never goes to the daemon: it runs in-process ([`crate::verbs::check::status`]: local
//! files and the default network's own STATUS, no API). containerd ≥ 2.0.1 sends it on every
//! CRI `Status` and takes any failure for NetworkReady=false, so the node's readiness must not
//! follow the daemon's: a daemon restarting, upgraded, or busy (its queue full answers code 11)
//! is not a node whose network is down, and ADDs meanwhile follow `daemonUnavailable` below.
//!
//! When the daemon cannot be reached (absent, starting, draining after SIGTERM, crashed):
//! - DEL, CHECK and GC run in-process from the saved plans (DEL needs no API), so a
//!   pod never stays Terminating because of the daemon;
//! - ADD follows `daemonUnavailable`: `"thin"` (default) runs the whole ADD in-process in thin
//!   mode with the config's `kubeconfig` (the pod gets its networks; the API pays thin mode's
//!   N+3 requests for it); `"tryAgain"` returns code 11 and the kubelet retries later. Without
//!   a `kubeconfig` the thin fallback could not read the pod, so ADD returns code 11 too.
//! - A daemon that accepted an ADD and died before answering: code 11. The runtime then DELs
//!   the container, which cleans up from the plan saved before the first delegate ran.
//!
//! The runtime normally execs the small `plexus-shim` (its own crate, std only), which
//! forwards the same way and runs `plexus` for everything else. It then sets
//! [`FORWARD_ENV`] (`unreachable`, `no-answer`, or `none`) and [`FORWARD_ERROR_ENV`] so this
//! process applies the fallbacks above without trying the socket a second time.

use crate::daemon::protocol::{read_message, write_message, Request, Response, CNI_ENV};
use crate::error::MetaError;
use plexus_conf::error::CniError;
use plexus_delegates::skel::{self, Outcome, Plugin};
use serde::Deserialize;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Set by `plexus-shim` when it hands a call to `plexus`: `unreachable` (nothing listens on
/// the socket), `no-answer` (the daemon took the call and gave no answer) or `none` (the
/// shim did not forward: thin mode, `VERSION`, a config it did not read).
pub const FORWARD_ENV: &str = "PLEXUS_SHIM_FORWARD";
/// Set by `plexus-shim` with [`FORWARD_ENV`]: the connection error it met.
pub const FORWARD_ERROR_ENV: &str = "PLEXUS_SHIM_FORWARD_ERROR";

/// The keys of the CNI config the shim reads.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct ShimConfig {
    /// The daemon's socket; empty: thin mode.
    pub daemon_socket: String,
    /// ADD when the daemon is unreachable: `thin` (default) or `tryAgain`.
    pub daemon_unavailable: String,
    /// The thin fallback's kubeconfig.
    pub kubeconfig: String,
}

impl ShimConfig {
    /// `Some` when the config selects daemon mode.
    pub fn from_stdin(stdin: &[u8]) -> Option<ShimConfig> {
        serde_json::from_slice::<ShimConfig>(stdin)
            .ok()
            .filter(|c| !c.daemon_socket.is_empty())
    }

    fn add_falls_back_to_thin(&self) -> Result<(), &'static str> {
        match self.daemon_unavailable.as_str() {
            "tryAgain" => Err("daemonUnavailable is \"tryAgain\""),
            _ if self.kubeconfig.is_empty() => {
                Err("the config has no kubeconfig for an in-process (thin) ADD")
            }
            _ => Ok(()),
        }
    }
}

/// How forwarding failed.
#[derive(Debug)]
pub enum ForwardError {
    /// Nothing listens on the socket: nothing was sent.
    Unreachable(std::io::Error),
    /// The daemon took the call but gave no answer (it died or was killed).
    NoAnswer(std::io::Error),
}

/// Send one call to the daemon and wait for its answer.
pub fn forward(socket: &str, req: &Request) -> Result<Response, ForwardError> {
    let mut conn = UnixStream::connect(socket).map_err(ForwardError::Unreachable)?;
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    write_message(&mut conn, req).map_err(ForwardError::NoAnswer)?;
    conn.shutdown(std::net::Shutdown::Write)
        .map_err(ForwardError::NoAnswer)?;
    read_message(&mut conn, 16 << 20).map_err(ForwardError::NoAnswer)
}

/// The edge of an ADD the shim cannot serve: `err` (code 11) as the CNI error printed.
fn try_again(err: MetaError, stdin: &[u8]) -> Outcome {
    let ver = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .unwrap_or_else(|| plexus_conf::version::CURRENT.to_string());
    Outcome {
        stdout: CniError::from(err).with_version(&ver).to_json(),
        exit_code: 1,
    }
}

/// Run one CNI call in daemon mode; `thin` is the in-process plugin used as the fallback.
pub fn run(
    conf: &ShimConfig,
    env: impl Fn(&str) -> Option<String>,
    stdin: Vec<u8>,
    thin: &dyn Plugin,
) -> Outcome {
    let verb = env("CNI_COMMAND").unwrap_or_default();
    // STATUS: the node's readiness, never the daemon's (see the module's doc).
    if verb == "VERSION" || verb == "STATUS" {
        return skel::dispatch(thin, env, stdin);
    }
    let req = Request {
        env: CNI_ENV
            .iter()
            .filter_map(|k| env(k).map(|v| (k.to_string(), v)))
            .collect(),
        stdin: String::from_utf8_lossy(&stdin).into_owned(),
    };
    // plexus-shim already tried the socket: take its verdict instead of a second attempt.
    let shim_error = || std::io::Error::other(env(FORWARD_ERROR_ENV).unwrap_or_default());
    let forwarded = match env(FORWARD_ENV).as_deref() {
        Some("unreachable") => Err(ForwardError::Unreachable(shim_error())),
        Some("no-answer") => Err(ForwardError::NoAnswer(shim_error())),
        _ => forward(&conf.daemon_socket, &req),
    };
    match forwarded {
        Ok(r) => Outcome {
            stdout: r.stdout,
            exit_code: r.code,
        },
        Err(ForwardError::Unreachable(e)) if verb == "ADD" => match conf.add_falls_back_to_thin() {
            Ok(()) => {
                eprintln!(
                    "plexus: daemon {} unreachable ({e}): ADD in thin mode",
                    conf.daemon_socket
                );
                skel::dispatch(thin, env, stdin)
            }
            Err(why) => try_again(
                MetaError::DaemonUnreachable {
                    socket: conf.daemon_socket.clone(),
                    why,
                    source: e,
                },
                &stdin,
            ),
        },
        Err(ForwardError::NoAnswer(e)) if verb == "ADD" => try_again(
            MetaError::DaemonNoAnswer {
                socket: conf.daemon_socket.clone(),
                source: e,
            },
            &stdin,
        ),
        // DEL, CHECK, GC: in-process, from the saved plans.
        Err(ForwardError::Unreachable(e) | ForwardError::NoAnswer(e)) => {
            eprintln!(
                "plexus: daemon {} unavailable ({e}): {verb} in-process",
                conf.daemon_socket
            );
            skel::dispatch(thin, env, stdin)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_mode_and_add_fallback_policy() {
        assert!(ShimConfig::from_stdin(br#"{"type":"plexus"}"#).is_none());
        assert!(ShimConfig::from_stdin(br#"{"daemonSocket":""}"#).is_none());
        let c = ShimConfig::from_stdin(
            br#"{"daemonSocket":"/run/plexus/plexus.sock","kubeconfig":"/k"}"#,
        )
        .unwrap();
        assert!(c.add_falls_back_to_thin().is_ok());
        let c = ShimConfig {
            daemon_unavailable: "tryAgain".into(),
            ..c
        };
        assert!(c.add_falls_back_to_thin().is_err());
        let c = ShimConfig::from_stdin(br#"{"daemonSocket":"/s"}"#).unwrap();
        assert!(c
            .add_falls_back_to_thin()
            .unwrap_err()
            .contains("kubeconfig"));
    }

    #[test]
    fn status_never_asks_the_daemon() {
        use std::os::unix::net::UnixListener;
        // A daemon that takes calls and never answers (busy, wedged): STATUS must not wait
        // for it, nor be refused by it.
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("plexus.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        listener.set_nonblocking(true).unwrap();
        let conf = ShimConfig {
            daemon_socket: sock.display().to_string(),
            daemon_unavailable: "tryAgain".into(),
            kubeconfig: String::new(),
        };
        struct Ready;
        impl Plugin for Ready {
            fn add(&self, _: skel::CmdArgs) -> Result<skel::AddOutput, CniError> {
                unreachable!()
            }
            fn del(&self, _: skel::CmdArgs) -> Result<(), CniError> {
                unreachable!()
            }
            fn check(&self, _: skel::CmdArgs) -> Result<(), CniError> {
                unreachable!()
            }
            fn status(&self, _: skel::CmdArgs) -> Result<(), CniError> {
                Err(CniError::new(50, "in-process", "answered here"))
            }
        }
        let env = |k: &str| match k {
            "CNI_COMMAND" => Some("STATUS".to_string()),
            "CNI_PATH" => Some("/nonexistent".to_string()),
            _ => None,
        };
        // Forwarded, the call would wait for good: give it 5 s in a thread of its own.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let out = run(
                &conf,
                env,
                br#"{"cniVersion":"1.1.0","name":"n"}"#.to_vec(),
                &Ready,
            );
            let _ = tx.send(out);
        });
        let out = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("STATUS answered at once, not held by the daemon");
        let e: CniError = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!((e.code, e.msg.as_str()), (50, "in-process"), "{e}");
        // Nothing connected to the daemon's socket.
        assert!(listener.accept().is_err());
    }

    #[test]
    fn an_unreachable_daemon_is_try_again_later_naming_the_socket() {
        let conf = ShimConfig {
            daemon_socket: "/nonexistent/plexus.sock".into(),
            daemon_unavailable: "tryAgain".into(),
            kubeconfig: String::new(),
        };
        let env = |k: &str| (k == "CNI_COMMAND").then(|| "ADD".to_string());
        struct Never;
        impl Plugin for Never {
            fn add(&self, _: skel::CmdArgs) -> Result<skel::AddOutput, CniError> {
                unreachable!("no thin fallback with tryAgain")
            }
            fn del(&self, _: skel::CmdArgs) -> Result<(), CniError> {
                unreachable!()
            }
            fn check(&self, _: skel::CmdArgs) -> Result<(), CniError> {
                unreachable!()
            }
        }
        let out = run(&conf, env, br#"{"cniVersion":"1.0.0"}"#.to_vec(), &Never);
        let e: CniError = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!((e.code, out.exit_code), (11, 1));
        assert_eq!(
            e.msg,
            "the plexus daemon at /nonexistent/plexus.sock is unreachable"
        );
        assert!(
            e.details
                .ends_with("; no in-process ADD: daemonUnavailable is \"tryAgain\""),
            "{e}"
        );
        assert_eq!(e.cni_version, "1.0.0");
    }
}
