// Shared by the build scripts of the crates that ship binaries (`include!`d from their
// build.rs): what `--version` says and how the binaries are linked.
//
// - `PLEXUS_BUILD_COMMIT` / `PLEXUS_BUILD_DATE` (set by scripts/release-build.sh and the
//   Dockerfile from git) become the commit and date `--version` prints. Without them the build
//   is a development build and says so: reading git here would need a rebuild of every
//   dependant crate on each commit, or print a stale commit.
// - Packed relative relocations (`DT_RELR`) make the loader read a few KiB instead of a
//   ~0.4 MB `.rela.dyn` table at every start, but need glibc >= 2.36 on the node. They are
//   left out when the build targets an older glibc: `PLEXUS_GLIBC_FLOOR=2.28`, or a
//   cargo-zigbuild linker for `…-linux-gnu.2.28`.

/// Emits the build facts and link arguments; `main` of each build.rs calls this.
fn emit_build_info() {
    for var in [
        "PLEXUS_BUILD_COMMIT",
        "PLEXUS_BUILD_DATE",
        "PLEXUS_GLIBC_FLOOR",
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let commit = std::env::var("PLEXUS_BUILD_COMMIT").unwrap_or_default();
    let date = std::env::var("PLEXUS_BUILD_DATE").unwrap_or_default();
    let describe = if commit.trim().is_empty() {
        "development build, no commit recorded".to_string()
    } else if date.trim().is_empty() {
        format!("commit {}", commit.trim())
    } else {
        format!("commit {}, {}", commit.trim(), date.trim())
    };
    println!("cargo:rustc-env=PLEXUS_BUILD_DESCRIBE={describe}");

    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if linux_gnu && glibc_floor().is_none_or(|v| v >= (2, 36)) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// The oldest glibc the build targets, when it targets one older than the build host's.
fn glibc_floor() -> Option<(u32, u32)> {
    if let Ok(v) = std::env::var("PLEXUS_GLIBC_FLOOR") {
        return parse_major_minor(&v);
    }
    // cargo-zigbuild names its linker wrapper after the target, e.g.
    // `zigcc-x86_64-unknown-linux-gnu.2.28-1a2b.sh`.
    let linker = std::env::var("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").ok()?;
    let (_, rest) = linker.rsplit_once("linux-gnu.")?;
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    parse_major_minor(rest[..end].trim_end_matches('.'))
}

fn parse_major_minor(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}
