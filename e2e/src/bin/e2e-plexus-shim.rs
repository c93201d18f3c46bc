//! `plexus-shim` under test (linked as `plexus-shim` by tests/common/mod.rs).

fn main() {
    plexus_shim::main()
}
