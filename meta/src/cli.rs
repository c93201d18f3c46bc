//! The shipped binaries' mains as library functions: `plexus` ([`main`]: the CNI entry point in
//! thin mode, or daemon mode's shim when the config has `daemonSocket`, plus `plexus explain`
//! (offline attachment plan, or live for a pod: [`explain_pod`]), `plexus state` (this node's
//! state and leftovers: [`state`]), `plexus version`, and `plexus daemon`, which runs the
//! `plexus-daemon` binary installed next to this one) and `plexus-daemon` ([`daemon_main`]).
//! `src/main.rs` and `src/bin/plexus-daemon.rs` are one-line calls of these, and so are the
//! e2e tests' wrapper binaries, so the tests run exactly what cargo built for them.

pub mod explain_pod;
pub mod node_config;
pub mod state;
pub mod state_cmd;

use crate::k8s::InClusterEnv;
use crate::{plugin::Plexus, shim, verbs::explain};
use plexus_delegates::skel;

fn usage() -> String {
    format!(
        "plexus {}: multi-network CNI meta-plugin (CNI {})\n\
         usage: plexus                      (run by the container runtime with CNI_COMMAND set)\n       \
         plexus explain --config FILE --pod FILE [--nad FILE]... [--ifname NAME]\n                        [--device RESOURCE=ID]... [--claims FILE]... [--slices FILE]...\n       \
         plexus explain --pod NAMESPACE/NAME [--config FILE] [--json]   (live: the API and this node's plan)\n       \
         plexus state [--json] [--config FILE] [--runtime-endpoint SOCKET] ...   (this node's state, leftovers)\n       \
         plexus daemon [--config FILE] [--socket PATH] ...   (daemon mode: see plexus daemon --help)\n       \
         plexus check-config FILE       (exit 0 when plexus accepts the config or conflist FILE)\n       \
         plexus version",
        env!("CARGO_PKG_VERSION"),
        plexus_conf::version::SUPPORTED.join(", ")
    )
}

/// `plexus check-config FILE`: 0 when FILE (a plexus config or a conflist holding one) parses
/// and validates as the runtime's call would; else the CNI error on stderr and 1 (2: usage).
fn check_config(args: &[String]) -> i32 {
    let [file] = args else {
        eprintln!("usage: plexus check-config FILE");
        return 2;
    };
    let bytes = match plexus_delegates::fsutil::read_capped(
        std::path::Path::new(file),
        plexus_conf::limits::MAX_CONFIG_FILE_BYTES,
    ) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{file}: {e}");
            return 1;
        }
    };
    match plexus_conf::plexus_config::PlexusConfig::parse(&bytes) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("{file}: {}: {}", e.msg, e.details);
            1
        }
    }
}

/// `plexus daemon ARGS…`: replace this process with `plexus-daemon ARGS…` from this binary's
/// directory (the daemon is a binary of its own, so the thin plugin stays small). Returns
/// only on failure, with exit code 2.
fn exec_daemon(args: &[String]) -> i32 {
    use std::os::unix::process::CommandExt;
    let daemon = match std::env::current_exe() {
        Ok(me) => me.with_file_name("plexus-daemon"),
        Err(e) => {
            eprintln!("plexus daemon: cannot find this binary's directory: {e}");
            return 2;
        }
    };
    let err = std::process::Command::new(&daemon)
        .arg0("plexus-daemon")
        .args(args)
        .exec();
    eprintln!(
        "plexus daemon: cannot run {} ({err}): the daemon is the plexus-daemon binary, installed next to plexus",
        daemon.display()
    );
    2
}

/// The `plexus` binary's main (meta/src/main.rs calls it; the e2e tests' `e2e-plexus` wrapper
/// too): argv and the CNI environment from the process, exits the process with the CNI exit
/// code.
pub fn main() {
    let started = std::time::Instant::now();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
        Some("explain") if explain_pod::wanted(&argv[1..]) => {
            std::process::exit(explain_pod::main(&argv[1..]))
        }
        Some("explain") => std::process::exit(explain::main(&argv[1..])),
        Some("state") => std::process::exit(state_cmd::main(&argv[1..])),
        Some("daemon") => std::process::exit(exec_daemon(&argv[1..])),
        Some("check-config") => std::process::exit(check_config(&argv[1..])),
        Some("version" | "--version") => {
            println!("{}", crate::build_info::version_line("plexus"));
            return;
        }
        Some("-h" | "--help" | "help") => {
            println!("{}", usage());
            return;
        }
        Some(other) => {
            eprintln!("plexus: unknown command {other:?}\n{}", usage());
            std::process::exit(2);
        }
        None => {}
    }
    if std::env::var_os("CNI_COMMAND").is_none() {
        // Like the Go skel's "about": a bare run without the CNI environment says what this is.
        eprintln!("{}", usage());
        return;
    }
    skel::install_panic_hook();
    let plugin = Plexus {
        in_cluster: InClusterEnv::from_process_env(),
        started: Some(started),
    };
    let stdin = match skel::read_config(std::io::stdin()) {
        Ok(b) => b,
        Err(e) => std::process::exit(skel::print_read_error(e)),
    };
    let env = |k: &str| std::env::var(k).ok();
    // Daemon mode: the config names the daemon's socket; this process only forwards.
    let out = match shim::ShimConfig::from_stdin(&stdin) {
        Some(conf) => shim::run(&conf, env, stdin, &plugin),
        None => skel::dispatch(&plugin, env, stdin),
    };
    if !out.stdout.is_empty() {
        println!("{}", out.stdout);
    }
    std::process::exit(out.exit_code);
}

/// The `plexus-daemon` binary's main: daemon mode's node daemon (watch caches, the shim's
/// socket, metrics) with the process' arguments; exits the process with its exit code.
pub fn daemon_main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(crate::daemon::main(&argv));
}
