//! The `sriov` binary as shipped: the node's settings (`PLEXUS_SRIOV_STATE_DIR`) and nothing
//! else from the environment — no test seam can be switched on here.

fn main() {
    plexus_sriov::cli::main(plexus_sriov::Settings::from_env(|k| std::env::var(k).ok()));
}
