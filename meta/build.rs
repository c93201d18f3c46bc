//! Build facts for `--version` and the link arguments of the shipped binaries
//! (build-support/build_info.rs).

include!("../build-support/build_info.rs");

fn main() {
    emit_build_info();
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../build-support/build_info.rs");
}
