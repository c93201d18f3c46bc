//! `e2e-plexus`: the shipped `plexus`, built by cargo for the e2e tests, which run it under its
//! real name through `common::bin("plexus")` (tests/common/mod.rs).

fn main() {
    plexus_meta::cli::main();
}
