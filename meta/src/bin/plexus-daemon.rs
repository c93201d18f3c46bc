//! `plexus-daemon`: daemon mode's node daemon (watch caches, the shim's socket, metrics). A
//! binary of its own so that the thin `plexus` the kubelet runs for every call carries none of
//! the watch runtime or the metrics code; `plexus daemon …` runs this one. The body is
//! [`plexus_meta::cli::daemon_main`].

fn main() {
    plexus_meta::cli::daemon_main();
}
