//! The command line of the `sriov` binary: `sriov list ...` diagnostics, otherwise a CNI plugin
//! via the shared skel. The shipped binary runs it with the node's settings only; test builds
//! (feature `testkit`) have a second binary that adds the fake sysfs and PF.

use crate::{list_main, logfile, Settings, SriovPlugin};
use plexus_delegates::logging::{self, LogOptions};
use plexus_delegates::skel;

/// Log options from the config's `logLevel`/`logFile` (sriov-cni keys); stdin is peeked here
/// only for logging, the skel parses it again. The file is not opened here: see [`init_logging`].
fn log_options(stdin: &[u8]) -> LogOptions {
    let v: serde_json::Value = serde_json::from_slice(stdin).unwrap_or_default();
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
    let file = s("logFile");
    LogOptions {
        level: match s("logLevel").as_str() {
            "" => "info".into(),
            l => l.into(),
        },
        to_stderr: file.is_empty(),
        file: (!file.is_empty()).then(|| file.into()),
        // Never rotated: sriov appends and leaves rotation to logrotate.
        ..LogOptions::default()
    }
}

/// Logging for a CNI call: the config's `logFile` only when [`logfile::open`] accepts it under
/// the node's log directory, otherwise stderr with a warning saying why.
fn init_logging(stdin: &[u8], settings: &Settings) {
    let opts = log_options(stdin);
    let (file, warnings) = match &opts.file {
        None => (None, Vec::new()),
        Some(p) => match logfile::open(&settings.log_dir(), p) {
            Ok(f) => (Some(f), Vec::new()),
            Err(why) => (None, vec![why]),
        },
    };
    logging::init_with_file(&opts, file, warnings);
}

const USAGE: &str = "usage: sriov list [--json] [--sysfs-root DIR] [--state-dir DIR]
       sriov version
       sriov (run by the container runtime or plexus with CNI_COMMAND set and the config on stdin)";

/// The shipped `sriov` binary's main (src/main.rs calls it; the e2e tests' `e2e-sriov` wrapper
/// too): the node's settings (`PLEXUS_SRIOV_STATE_DIR`, `PLEXUS_SRIOV_LOG_DIR`) and nothing else from the environment —
/// no test seam can be switched on here.
pub fn sriov_main() {
    main(Settings::from_env(|k| std::env::var(k).ok()));
}

/// The test-only `sriov-fake-pf` binary's main (feature `testkit`): the `sriov` plugin on a
/// fake node — the sysfs tree from `PLEXUS_SYSFS_ROOT` and the file-backed PF from
/// `PLEXUS_SRIOV_FAKE_PF`.
#[cfg(feature = "testkit")]
pub fn fake_pf_main() {
    main(Settings::from_test_env(|k| std::env::var(k).ok()));
}

/// Run the binary with `settings` (read from the environment by the caller) and exit.
pub fn main(settings: Settings) {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
        None | Some("list") => {}
        Some("version" | "--version") => {
            println!(
                "sriov {} ({})",
                env!("CARGO_PKG_VERSION"),
                env!("PLEXUS_BUILD_DESCRIBE")
            );
            return;
        }
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return;
        }
        Some(other) => {
            eprintln!("sriov: unknown command {other:?}\n{USAGE}");
            std::process::exit(2);
        }
    }
    if argv.first().map(String::as_str) == Some("list") {
        logging::init(&LogOptions {
            level: "warn".into(),
            file: None,
            to_stderr: true,
            ..LogOptions::default()
        });
        match list_main(&argv[1..], &settings) {
            Ok(out) => print!("{out}"),
            // --help: the usage is the "error".
            Err(e) if e.starts_with("usage:") => println!("{e}"),
            Err(e) => {
                eprintln!("sriov list: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    skel::install_panic_hook();
    let stdin = match skel::read_config(std::io::stdin()) {
        Ok(b) => b,
        Err(e) => std::process::exit(skel::print_read_error(e)),
    };
    init_logging(&stdin, &settings);
    let plugin = SriovPlugin { settings };
    let o = skel::dispatch(&plugin, |k| std::env::var(k).ok(), stdin);
    if !o.stdout.is_empty() {
        println!("{}", o.stdout);
    }
    std::process::exit(o.exit_code);
}
