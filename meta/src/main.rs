//! `plexus`: the CNI entry point, plus `plexus explain` (offline attachment plan) and
//! `plexus version`.

use plexus_delegates::skel;
use plexus_meta::k8s::InClusterEnv;
use plexus_meta::{explain, plugin::Plexus};

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
        Some("explain") => std::process::exit(explain::main(&argv[1..])),
        Some("version" | "--version") => {
            println!("plexus {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        _ => {}
    }
    if std::env::var_os("CNI_COMMAND").is_none() {
        eprintln!(
            "plexus {}: multi-network CNI meta-plugin (CNI {})\nusage: run by the container runtime with CNI_COMMAND set, or `plexus explain --help`",
            env!("CARGO_PKG_VERSION"),
            plexus_conf::version::SUPPORTED.join(", ")
        );
        return;
    }
    skel::install_panic_hook();
    let plugin = Plexus {
        in_cluster: InClusterEnv::from_process_env(),
    };
    std::process::exit(skel::run(&plugin));
}
