//! `e2e-sriov-fake-pf`: the test-only `sriov-fake-pf`, built by cargo for the e2e tests, which run
//! it under its real name through `common::bin("sriov-fake-pf")` (tests/common/mod.rs).

fn main() {
    plexus_sriov::cli::fake_pf_main();
}
