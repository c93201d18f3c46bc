//! The `sriov` binary as shipped: the node's settings (`PLEXUS_SRIOV_STATE_DIR`) and nothing
//! else from the environment — no test seam can be switched on here (see
//! [`plexus_sriov::cli::sriov_main`]).

fn main() {
    plexus_sriov::cli::sriov_main();
}
