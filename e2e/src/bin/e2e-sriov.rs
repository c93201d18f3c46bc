//! `e2e-sriov`: the shipped `sriov`, built by cargo for the e2e tests, which run it under its real
//! name through `common::bin("sriov")` (tests/common/mod.rs).

fn main() {
    plexus_sriov::cli::sriov_main();
}
