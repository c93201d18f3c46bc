//! `e2e-plexus-daemon`: the shipped `plexus-daemon`, built by cargo for the e2e tests, which run it
//! under its real name through `common::bin("plexus-daemon")` (tests/common/mod.rs).

fn main() {
    plexus_meta::cli::daemon_main();
}
