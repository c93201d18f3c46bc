//! `plexus-shim`: daemon mode's CNI entry (the binary is a one-line call of [`main`]). The runtime execs it for every CNI call (the CNI
//! config's `"type": "plexus-shim"`); it sends the call (its `CNI_*` environment and stdin) to
//! the plexus daemon over the Unix socket named by the config's `daemonSocket` and prints the
//! answer. std only — no async runtime, TLS, netlink, API client or serde — so it costs a
//! process start of a small binary and one round trip on the socket.
//!
//! Everything else is `plexus`' (installed next to it), which this shim runs with the same
//! environment and stdin:
//! - a config without `daemonSocket` (thin mode), `VERSION`, or a config it cannot read;
//! - `STATUS`, always: the node's readiness (containerd ≥ 2.0.1 asks on every CRI `Status`)
//!   must not follow the daemon's, so `plexus` answers it from local files, never the daemon;
//! - the daemon unreachable or not answering: `plexus` is told so (`PLEXUS_SHIM_FORWARD`) and
//!   applies the documented fallbacks without trying the socket again (DEL, CHECK, GC
//!   in-process from the saved plans; ADD per `daemonUnavailable`; an ADD the daemon accepted
//!   but never answered: code 11). See docs/daemon.md.

pub mod json;
pub mod wire;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Largest config read from stdin (as `plexus`: `plexus_conf::limits::MAX_STDIN_CONFIG_BYTES`).
const MAX_STDIN_BYTES: usize = 1 << 20;

/// The environment variable that tells `plexus` why the shim handed it the call.
const FORWARD_ENV: &str = "PLEXUS_SHIM_FORWARD";
/// Its companion: the connection error, for `plexus`' message.
const FORWARD_ERROR_ENV: &str = "PLEXUS_SHIM_FORWARD_ERROR";

/// The shim's main: serve the CNI call of this process (environment, stdin); exits.
pub fn main() {
    let Some(verb) = std::env::var_os("CNI_COMMAND") else {
        eprintln!(
            "plexus-shim: the CNI shim of plexus' daemon mode (run by the container runtime \
             with the CNI environment and a config with \"daemonSocket\" on stdin)"
        );
        return;
    };
    if std::env::var_os(FORWARD_ENV).is_some() {
        // `plexus` next to us is a copy of this shim: running it would loop.
        fail(
            &[],
            "plexus-shim cannot run plexus",
            format!("{} is plexus-shim itself", plexus_path().display()),
        );
    }
    let mut stdin = Vec::new();
    let read = std::io::stdin()
        .take(MAX_STDIN_BYTES as u64 + 1)
        .read_to_end(&mut stdin);
    if read.is_err() || stdin.len() > MAX_STDIN_BYTES || verb == "VERSION" || verb == "STATUS" {
        // plexus reports a stdin it cannot read or that is too large, answers VERSION, and
        // answers STATUS in-process (the daemon's state is not the node's network's).
        hand_over(stdin, "none", "");
    }
    let Some(socket) = wire::daemon_socket(&stdin) else {
        hand_over(stdin, "none", "");
    };
    let env: Vec<(String, String)> = wire::CNI_ENV
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    let req = wire::request(&env, &String::from_utf8_lossy(&stdin));
    match wire::forward(&socket, &req) {
        Ok(answer) => {
            if !answer.stdout.is_empty() {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{}", answer.stdout);
                let _ = out.flush();
            }
            std::process::exit(answer.code);
        }
        Err(wire::ForwardError::Unreachable(e)) => hand_over(stdin, "unreachable", &e.to_string()),
        Err(wire::ForwardError::NoAnswer(e)) => hand_over(stdin, "no-answer", &e.to_string()),
    }
}

/// `plexus` in the shim's own directory: the one the runtime named (`argv[0]`, an absolute
/// path when libcni execs a plugin; a symlink is not followed), else the executable's.
fn plexus_path() -> PathBuf {
    let exe = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_default();
    exe.parent()
        .map(|d| d.join("plexus"))
        .unwrap_or_else(|| PathBuf::from("plexus"))
}

/// Run `plexus` with this call (environment and `stdin`), telling it why (`how`: `none`,
/// `unreachable`, `no-answer`; `error`: the connection error); exit with its exit code. Its
/// stdout and stderr are ours.
fn hand_over(stdin: Vec<u8>, how: &str, error: &str) -> ! {
    let path = plexus_path();
    let child = Command::new(&path)
        .env(FORWARD_ENV, how)
        .env(FORWARD_ERROR_ENV, error)
        .stdin(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let why = if error.is_empty() {
                String::new()
            } else {
                format!("; the daemon: {error}")
            };
            fail(
                &stdin,
                "plexus-shim cannot run plexus",
                format!("{}: {e}{why}", path.display()),
            )
        }
    };
    if let Some(mut pipe) = child.stdin.take() {
        // plexus may exit without reading everything (it reports that itself).
        let _ = pipe.write_all(&stdin);
    }
    let code = match child.wait() {
        Ok(s) => s.code().unwrap_or(1),
        Err(_) => 1,
    };
    std::process::exit(code)
}

/// Print a CNI error (code 11, try again later: nothing was done) naming the network and pod
/// of the call, and exit 1.
fn fail(stdin: &[u8], msg: &str, details: String) -> ! {
    let details = format!("{details} ({})", wire::call_names(stdin));
    let mut out = String::from("{\"cniVersion\":");
    json::push_str(&mut out, &wire::cni_version(stdin));
    out.push_str(",\"code\":11,\"msg\":");
    json::push_str(&mut out, msg);
    out.push_str(",\"details\":");
    json::push_str(&mut out, &details);
    out.push('}');
    println!("{out}");
    std::process::exit(1)
}
