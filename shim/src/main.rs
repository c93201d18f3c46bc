//! `plexus-shim`: daemon mode's CNI shim (see the library's documentation).

fn main() {
    plexus_shim::main()
}
