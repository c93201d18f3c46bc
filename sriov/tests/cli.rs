//! The `sriov` command line: a mistyped command or flag prints the usage on stderr and exits 2;
//! `--help` and `version` succeed.

use std::process::{Command, Output};

fn sriov(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sriov"))
        .args(args)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run sriov")
}

#[test]
fn unknown_command_prints_usage_and_exits_2() {
    for args in [&["bogus"][..], &["lst"], &["--json"], &["ADD", "x"]] {
        let out = sriov(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("unknown command {:?}", args[0])),
            "{err}"
        );
        assert!(err.contains("usage: sriov list"), "{err}");
        assert!(out.stdout.is_empty(), "nothing on stdout for {args:?}");
    }
}

#[test]
fn bad_list_flags_exit_2() {
    let out = sriov(&["list", "--bogus"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown argument \"--bogus\""), "{err}");
}

#[test]
fn help_and_version_succeed() {
    for args in [&["--help"][..], &["list", "--help"]] {
        let out = sriov(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("usage: sriov list"));
    }
    let out = sriov(&["version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("sriov {}", env!("CARGO_PKG_VERSION"))
    );
}
