//! The `plexus` command line: a mistyped command or flag prints the usage on stderr and exits 2;
//! `--help` and `version` succeed.

use std::process::{Command, Output};

fn plexus(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plexus"))
        .args(args)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run plexus")
}

#[test]
fn unknown_command_prints_usage_and_exits_2() {
    for args in [
        &["bogus"][..],
        &["--frobnicate"],
        &["ADD"],
        &["version2", "x"],
    ] {
        let out = plexus(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("unknown command {:?}", args[0])),
            "{err}"
        );
        assert!(err.contains("usage: plexus"), "{err}");
        assert!(out.stdout.is_empty(), "nothing on stdout for {args:?}");
    }
}

#[test]
fn bad_explain_flags_print_usage_and_exit_2() {
    let out = plexus(&["explain", "--bogus"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown argument \"--bogus\"") && err.contains("usage: plexus explain"));
    let out = plexus(&["explain", "--config", "x.conf"]);
    assert_eq!(out.status.code(), Some(2), "--pod is required");
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: plexus explain"));
}

#[test]
fn help_and_version_succeed() {
    let out = plexus(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("usage: plexus"));
    let out = plexus(&["version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("plexus {}", env!("CARGO_PKG_VERSION"))
    );
}
