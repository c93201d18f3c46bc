//! `plexus`: the CNI entry point (thin mode, or daemon mode's shim when the config has
//! `daemonSocket`), plus `plexus explain` (offline attachment plan), `plexus version`, and
//! `plexus daemon`, which runs the `plexus-daemon` binary installed next to this one. The body
//! is [`plexus_meta::cli::main`].

fn main() {
    plexus_meta::cli::main();
}
