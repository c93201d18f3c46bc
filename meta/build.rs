//! Link the shipped binaries with packed relative relocations (`DT_RELR`): the dynamic loader
//! then reads a few KiB instead of a ~0.4 MB `.rela.dyn` table at every start, which makes the
//! file smaller and each CNI call's start-up and RSS lower. Needs glibc >= 2.36 on the node,
//! which the binaries need anyway (they are built on Debian 12, see deploy/Dockerfile).

fn main() {
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if linux_gnu {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
