//! The `sriov` command line: a mistyped command or flag prints the usage on stderr and exits 2;
//! `--help` and `version` succeed.

use std::io::Write;
use std::process::{Command, Output, Stdio};

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
        format!(
            "sriov {} ({})",
            env!("CARGO_PKG_VERSION"),
            env!("PLEXUS_BUILD_DESCRIBE")
        )
    );
}

#[test]
fn an_oversized_config_on_stdin_is_refused_with_its_size() {
    let max = plexus_conf::limits::MAX_STDIN_CONFIG_BYTES;
    let mut child = Command::new(env!("CARGO_BIN_EXE_sriov"))
        .env("CNI_COMMAND", "ADD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run sriov");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&vec![b' '; max + 100]);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a CNI error");
    assert_eq!(v["code"], 6);
    assert_eq!(v["msg"], "network configuration on stdin is too large");
    assert_eq!(
        v["details"],
        format!("{} bytes, the limit is {max} bytes", max + 100)
    );
}
