//! The Rust skel shared by `plexus` and `sriov`: the CNI environment and stdin become a
//! [`CmdArgs`], a [`Plugin`] handles the verb, and the result or error becomes stdout JSON and an
//! exit code. Core logic receives `CmdArgs` by value and never reads the environment.

use plexus_conf::error::{code, CniError};
use plexus_conf::limits;
use plexus_conf::result::CniResult;
use plexus_conf::validate;
use plexus_conf::version::{self, CniVersion};
use serde_json::{json, Value};
use std::io::Read;
use std::path::PathBuf;

pub use crate::exec::Verb as Command;

/// One CNI call: the environment and stdin.
#[derive(Debug, Clone)]
pub struct CmdArgs {
    /// `CNI_COMMAND`
    pub command: Command,
    /// `CNI_CONTAINERID`
    pub container_id: String,
    /// `CNI_NETNS` (may be empty on DEL)
    pub netns: String,
    /// `CNI_IFNAME`
    pub ifname: String,
    /// `CNI_ARGS`
    pub args: String,
    /// `CNI_PATH` entries.
    pub path: Vec<PathBuf>,
    /// The config bytes from stdin.
    pub stdin: Vec<u8>,
}

/// What ADD returns: the result and the version to print it in.
#[derive(Debug, Clone)]
pub struct AddOutput {
    /// The result.
    pub result: CniResult,
    /// The version to print (normally the config's `cniVersion`).
    pub cni_version: String,
}

/// A CNI plugin's verbs.
pub trait Plugin {
    /// Spec versions the plugin accepts in its config.
    fn supported_versions(&self) -> &[&str] {
        version::SUPPORTED
    }
    /// ADD.
    fn add(&self, args: CmdArgs) -> Result<AddOutput, CniError>;
    /// DEL (idempotent, best effort).
    fn del(&self, args: CmdArgs) -> Result<(), CniError>;
    /// CHECK.
    fn check(&self, args: CmdArgs) -> Result<(), CniError>;
    /// STATUS.
    fn status(&self, _args: CmdArgs) -> Result<(), CniError> {
        Ok(())
    }
    /// GC.
    fn gc(&self, _args: CmdArgs) -> Result<(), CniError> {
        Ok(())
    }
}

fn parse_command(s: &str) -> Result<Command, CniError> {
    Ok(match s {
        "ADD" => Command::Add,
        "DEL" => Command::Del,
        "CHECK" => Command::Check,
        "STATUS" => Command::Status,
        "GC" => Command::Gc,
        "VERSION" => Command::Version,
        other => {
            return Err(CniError::invalid_env(
                "unknown CNI_COMMAND",
                format!("{other:?} is not one of ADD, DEL, CHECK, STATUS, GC, VERSION"),
            ))
        }
    })
}

impl CmdArgs {
    /// Build from an environment lookup and stdin bytes, validating what the verb requires.
    pub fn from_env(
        env: impl Fn(&str) -> Option<String>,
        stdin: Vec<u8>,
    ) -> Result<Self, CniError> {
        let get = |k: &str| env(k).unwrap_or_default();
        let command = parse_command(&get("CNI_COMMAND"))?;
        plexus_conf::limits::check_cni_args(get("CNI_ARGS").len())?;
        let required: &[&str] = match command {
            Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME"],
            _ => &[],
        };
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|k| get(k).is_empty())
            .collect();
        if !missing.is_empty() {
            return Err(CniError::invalid_env(
                format!("required env variables [{}] missing", missing.join(",")),
                "",
            ));
        }
        let a = CmdArgs {
            command,
            container_id: get("CNI_CONTAINERID"),
            netns: get("CNI_NETNS"),
            ifname: get("CNI_IFNAME"),
            args: get("CNI_ARGS"),
            path: std::env::split_paths(&get("CNI_PATH"))
                .filter(|p| !p.as_os_str().is_empty())
                .collect(),
            stdin,
        };
        if !required.is_empty() {
            validate::container_id(&a.container_id)?;
            validate::interface_name(&a.ifname)?;
        }
        Ok(a)
    }

    /// The config's `cniVersion`, if stdin is a JSON object that has one.
    pub fn config_version(&self) -> Option<String> {
        let v: Value = serde_json::from_slice(&self.stdin).ok()?;
        v.get("cniVersion")
            .and_then(Value::as_str)
            .map(str::to_string)
    }
}

/// What to print and how to exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Text for stdout (may be empty).
    pub stdout: String,
    /// Process exit code.
    pub exit_code: i32,
}

fn error_outcome(e: CniError, ver: &str) -> Outcome {
    Outcome {
        stdout: e.with_version(ver).to_json(),
        exit_code: 1,
    }
}

/// Run one CNI call given an environment lookup and stdin (testable core of [`run`]).
pub fn dispatch(
    plugin: &dyn Plugin,
    env: impl Fn(&str) -> Option<String>,
    stdin: Vec<u8>,
) -> Outcome {
    let cfg_version = serde_json::from_slice::<Value>(&stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .filter(|v| CniVersion::parse(v).is_ok() && !v.is_empty())
        .unwrap_or_else(|| version::CURRENT.to_string());
    let args = match CmdArgs::from_env(env, stdin) {
        Ok(a) => a,
        Err(e) => return error_outcome(e, &cfg_version),
    };
    let supported = plugin.supported_versions();
    if args.command == Command::Version {
        return Outcome {
            stdout: json!({"cniVersion": version::CURRENT, "supportedVersions": supported})
                .to_string(),
            exit_code: 0,
        };
    }
    // Validate the config's version before any work, except for GC/STATUS which may omit it.
    let raw_version = match serde_json::from_slice::<Value>(&args.stdin) {
        Ok(v) if v.is_object() => v
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        Ok(_) => {
            return error_outcome(
                CniError::decode(
                    "failed to parse network configuration",
                    "stdin is not a JSON object",
                ),
                &cfg_version,
            )
        }
        Err(e) => {
            return error_outcome(
                CniError::decode("failed to parse network configuration", e.to_string()),
                &cfg_version,
            )
        }
    };
    if !raw_version.is_empty() && !supported.contains(&raw_version.as_str()) {
        return error_outcome(
            CniError::new(
                code::INCOMPATIBLE_VERSION,
                "incompatible CNI versions",
                format!("config is {raw_version:?}, plugin supports {supported:?}"),
            ),
            &cfg_version,
        );
    }
    let res = match args.command {
        Command::Add => plugin
            .add(args)
            .and_then(|out| out.result.to_value(&out.cni_version).map(|v| v.to_string())),
        Command::Del => plugin.del(args).map(|_| String::new()),
        Command::Check => plugin.check(args).map(|_| String::new()),
        Command::Status => plugin.status(args).map(|_| String::new()),
        Command::Gc => plugin.gc(args).map(|_| String::new()),
        Command::Version => unreachable!("handled above"),
    };
    match res {
        Ok(stdout) => Outcome {
            stdout,
            exit_code: 0,
        },
        Err(e) => {
            tracing::error!(code = e.code, error = %e, "CNI call failed");
            error_outcome(e, &cfg_version)
        }
    }
}

/// Read the network configuration from `input` (stdin), keeping at most
/// [`limits::MAX_STDIN_CONFIG_BYTES`]: a longer one is read to its end (so the writer is not
/// blocked), counted and refused with code 6 naming its size; a read failure is code 5.
pub fn read_config(input: impl Read) -> Result<Vec<u8>, CniError> {
    let io_err =
        |e: std::io::Error| CniError::new(code::IO_FAILURE, "failed to read stdin", e.to_string());
    let mut input = input.take(limits::MAX_STDIN_CONFIG_BYTES as u64 + 1);
    let mut buf = Vec::new();
    input.read_to_end(&mut buf).map_err(io_err)?;
    if buf.len() > limits::MAX_STDIN_CONFIG_BYTES {
        let rest = std::io::copy(&mut input.into_inner(), &mut std::io::sink()).map_err(io_err)?;
        return Err(limits::too_large(
            "network configuration on stdin",
            buf.len() + rest as usize,
            limits::MAX_STDIN_CONFIG_BYTES,
            code::DECODE_FAILURE,
        ));
    }
    Ok(buf)
}

/// Print a failure to read the config as a CNI error; returns the exit code.
pub fn print_read_error(e: CniError) -> i32 {
    let o = error_outcome(e, version::CURRENT);
    println!("{}", o.stdout);
    o.exit_code
}

/// Read the process environment and stdin, run the plugin, print stdout; returns the exit code.
pub fn run(plugin: &dyn Plugin) -> i32 {
    let stdin = match read_config(std::io::stdin()) {
        Ok(b) => b,
        Err(e) => return print_read_error(e),
    };
    let o = dispatch(plugin, |k| std::env::var(k).ok(), stdin);
    if !o.stdout.is_empty() {
        println!("{}", o.stdout);
    }
    o.exit_code
}

/// Make a panic print a CNI error on stdout instead of nothing (release builds abort on panic).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let e = CniError::internal("plexus internal error (panic)", info.to_string());
        println!("{}", e.with_version(version::CURRENT).to_json());
        tracing::error!(panic = %info, "panic");
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Echo;
    impl Plugin for Echo {
        fn supported_versions(&self) -> &[&str] {
            &["0.4.0", "1.0.0"]
        }
        fn add(&self, a: CmdArgs) -> Result<AddOutput, CniError> {
            Ok(AddOutput {
                result: CniResult {
                    ips: vec![plexus_conf::result::IpConfig {
                        interface: None,
                        address: format!("10.0.0.{}/24", a.ifname.len()),
                        gateway: None,
                    }],
                    ..CniResult::default()
                },
                cni_version: a.config_version().unwrap_or_default(),
            })
        }
        fn del(&self, _a: CmdArgs) -> Result<(), CniError> {
            Ok(())
        }
        fn check(&self, _a: CmdArgs) -> Result<(), CniError> {
            Err(CniError::new(code::INTERNAL, "check failed", "because"))
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    const FULL: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
    ];

    #[test]
    fn add_prints_result_in_config_version() {
        let o = dispatch(
            &Echo,
            env(FULL),
            br#"{"cniVersion":"0.4.0","name":"n","type":"echo"}"#.to_vec(),
        );
        assert_eq!(o.exit_code, 0);
        let v: Value = serde_json::from_str(&o.stdout).unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["ips"][0]["version"], "4");
    }

    #[test]
    fn missing_env_is_code_4_listing_vars() {
        let o = dispatch(&Echo, env(&[("CNI_COMMAND", "ADD")]), b"{}".to_vec());
        assert_eq!(o.exit_code, 1);
        let v: Value = serde_json::from_str(&o.stdout).unwrap();
        assert_eq!(v["code"], 4);
        assert_eq!(
            v["msg"],
            "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME] missing"
        );
    }

    #[test]
    fn bad_ifname_bad_json_bad_version_unknown_command() {
        let mut e = FULL.to_vec();
        e[3] = ("CNI_IFNAME", "way-too-long-ifname");
        let o = dispatch(&Echo, env(&e), br#"{"cniVersion":"1.0.0"}"#.to_vec());
        assert!(o.stdout.contains(r#""code":4"#) && o.stdout.contains("longer than 15"));
        let o = dispatch(&Echo, env(FULL), b"{not json".to_vec());
        assert!(o.stdout.contains(r#""code":6"#), "{}", o.stdout);
        let o = dispatch(
            &Echo,
            env(FULL),
            br#"{"cniVersion":"1.1.0","name":"n"}"#.to_vec(),
        );
        assert!(o.stdout.contains(r#""code":1"#), "{}", o.stdout);
        let o = dispatch(&Echo, env(&[("CNI_COMMAND", "FROB")]), b"{}".to_vec());
        assert!(o.stdout.contains(r#""code":4"#), "{}", o.stdout);
    }

    #[test]
    fn oversized_stdin_and_cni_args_are_refused_with_their_size() {
        let max = limits::MAX_STDIN_CONFIG_BYTES;
        let fits = vec![b' '; max];
        assert_eq!(read_config(&fits[..]).unwrap().len(), max);
        let over = vec![b' '; max + 10];
        let e = read_config(&over[..]).unwrap_err();
        assert_eq!(e.code, code::DECODE_FAILURE);
        assert_eq!(e.msg, "network configuration on stdin is too large");
        assert_eq!(
            e.details,
            format!("{} bytes, the limit is {max} bytes", max + 10)
        );
        let args = format!("A={}", "x".repeat(limits::MAX_CNI_ARGS_BYTES));
        let mut e = FULL.to_vec();
        e.push(("CNI_ARGS", &args));
        let o = dispatch(&Echo, env(&e), br#"{"cniVersion":"1.0.0"}"#.to_vec());
        let v: Value = serde_json::from_str(&o.stdout).unwrap();
        assert_eq!((o.exit_code, v["code"].as_u64()), (1, Some(4)));
        assert_eq!(v["msg"], "CNI_ARGS is too large");
    }

    #[test]
    fn version_and_del_without_netns_and_errors() {
        let o = dispatch(&Echo, env(&[("CNI_COMMAND", "VERSION")]), b"".to_vec());
        assert_eq!(
            o.stdout,
            r#"{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0"]}"#
        );
        let o = dispatch(
            &Echo,
            env(&[
                ("CNI_COMMAND", "DEL"),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_IFNAME", "eth0"),
            ]),
            br#"{"cniVersion":"1.0.0"}"#.to_vec(),
        );
        assert_eq!(
            o,
            Outcome {
                stdout: String::new(),
                exit_code: 0
            }
        );
        let mut e = FULL.to_vec();
        e[0] = ("CNI_COMMAND", "CHECK");
        let o = dispatch(&Echo, env(&e), br#"{"cniVersion":"1.0.0"}"#.to_vec());
        assert_eq!(
            o.stdout,
            r#"{"cniVersion":"1.0.0","code":999,"msg":"check failed","details":"because"}"#
        );
    }
}
