//! Test build only (feature `testkit`): the `sriov` plugin on a fake node — the sysfs tree from
//! `PLEXUS_SYSFS_ROOT` and the file-backed PF from `PLEXUS_SRIOV_FAKE_PF`.

fn main() {
    plexus_sriov::cli::main(plexus_sriov::Settings::from_test_env(|k| {
        std::env::var(k).ok()
    }));
}
