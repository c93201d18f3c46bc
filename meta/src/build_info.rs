//! What `plexus version` and `plexus-daemon --version` print: the version, and the commit and
//! date a release build was made from (build-support/build_info.rs).

/// `"<program> <version> (commit <sha>, <date>)"`, or `(development build, …)` for a build
/// made without the release script.
pub fn version_line(program: &str) -> String {
    format!(
        "{program} {} ({})",
        env!("CARGO_PKG_VERSION"),
        env!("PLEXUS_BUILD_DESCRIBE")
    )
}
