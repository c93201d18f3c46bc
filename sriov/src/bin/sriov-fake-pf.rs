//! Test build only (feature `testkit`): the `sriov` plugin on a fake node — the sysfs tree from
//! `PLEXUS_SYSFS_ROOT` and the file-backed PF from `PLEXUS_SRIOV_FAKE_PF` (see
//! [`plexus_sriov::cli::fake_pf_main`]).

fn main() {
    plexus_sriov::cli::fake_pf_main();
}
