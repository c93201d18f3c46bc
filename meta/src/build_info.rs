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

/// The version, for `plexus_build_info`.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The commit a release build was made from, for `plexus_build_info`; `unknown` for a
/// development build.
pub fn commit() -> &'static str {
    commit_of(env!("PLEXUS_BUILD_DESCRIBE"))
}

fn commit_of(describe: &'static str) -> &'static str {
    describe
        .strip_prefix("commit ")
        .map(|r| r.split(',').next().unwrap_or(r).trim())
        .filter(|c| !c.is_empty())
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_commit_is_read_from_the_description() {
        assert_eq!(super::commit_of("commit abc123, 2026-11-28"), "abc123");
        assert_eq!(super::commit_of("commit abc123"), "abc123");
        assert_eq!(
            super::commit_of("development build, no commit recorded"),
            "unknown"
        );
    }
}
