//! `common::bin`: the tests run the binaries cargo built for this run, under their real names.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::{bin, bin_dir, link_binary, BUILT};

#[test]
fn bin_is_the_file_cargo_built_under_its_real_name() {
    for (name, built) in BUILT {
        let p = bin(name);
        assert_eq!(p.file_name().unwrap().to_str(), Some(*name));
        assert_eq!(p.parent(), Some(bin_dir().as_path()));
        let (a, b) = (
            std::fs::metadata(&p).unwrap(),
            std::fs::metadata(built).unwrap(),
        );
        assert_eq!(
            (a.dev(), a.ino(), a.len()),
            (b.dev(), b.ino(), b.len()),
            "{name}"
        );
    }
    assert_eq!(
        Path::new(env!("CARGO_BIN_EXE_e2e-plexus"))
            .file_name()
            .unwrap(),
        "e2e-plexus"
    );
}

#[test]
fn the_linked_binaries_are_the_shipped_mains() {
    let out = Command::new(bin("plexus")).arg("version").output().unwrap();
    assert!(out.status.success());
    let version = |program: &str| format!("{program} {} (", env!("CARGO_PKG_VERSION"));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        line.starts_with(&version("plexus")) && line.ends_with(')'),
        "{line}"
    );
    // `plexus daemon` runs the `plexus-daemon` next to it.
    let out = Command::new(bin("plexus"))
        .args(["daemon", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("usage: plexus daemon"));
    let out = Command::new(bin("plexus-daemon"))
        .arg("--version")
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success() && line.starts_with(&version("plexus-daemon")),
        "{out:?}"
    );
    for b in ["sriov", "sriov-fake-pf"] {
        let out = Command::new(bin(b)).arg("version").output().unwrap();
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            line.starts_with(&version("sriov")) && line.ends_with(')'),
            "{line}"
        );
    }
}

#[test]
fn a_stale_link_is_replaced_atomically_by_racing_writers() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("built");
    std::fs::write(&src, "new").unwrap();
    let dest = t.path().join("bin/plexus");
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::write(&dest, "old, stale").unwrap();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                link_binary(&src, &dest).unwrap();
                // Whoever wins, a reader sees the whole new file, never a missing one.
                assert_eq!(std::fs::read(&dest).unwrap(), b"new");
            });
        }
    });
    let (a, b) = (
        std::fs::metadata(&src).unwrap(),
        std::fs::metadata(&dest).unwrap(),
    );
    assert_eq!(a.ino(), b.ino());
    let names: Vec<_> = std::fs::read_dir(dest.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["plexus"], "temporary names left behind");
}
