//! Delegated IPAM: running the plugin named by `ipam.type` with the caller's own config (the
//! spec's delegation rule: the complete stdin, same environment).

use crate::exec::{exec_plugin, find_plugin, CniEnv, Verb};
use crate::skel::CmdArgs;
use plexus_conf::error::{code, CniError};
use plexus_conf::result::CniResult;
use serde_json::Value;
use std::time::Duration;

/// Default deadline for an IPAM exec.
pub const IPAM_TIMEOUT: Duration = Duration::from_secs(60);

fn env_of(args: &CmdArgs) -> CniEnv {
    CniEnv {
        container_id: args.container_id.clone(),
        netns: args.netns.clone(),
        ifname: args.ifname.clone(),
        args: args.args.clone(),
        path: args.path.clone(),
    }
}

fn run(
    ipam_type: &str,
    verb: Verb,
    args: &CmdArgs,
    stdin: &[u8],
) -> Result<Option<Value>, CniError> {
    let bin = find_plugin(ipam_type, &args.path).map_err(|e| e.context("ipam"))?;
    exec_plugin(&bin, verb, &env_of(args), stdin, IPAM_TIMEOUT)
}

/// IPAM ADD; the result must carry at least one IP.
pub fn add(
    ipam_type: &str,
    args: &CmdArgs,
    stdin: &[u8],
    version: &str,
) -> Result<CniResult, CniError> {
    let out = run(ipam_type, Verb::Add, args, stdin)?.ok_or_else(|| {
        CniError::new(
            code::DELEGATE_FAILED,
            format!("ipam {ipam_type} ADD printed no result"),
            "",
        )
    })?;
    let r = CniResult::parse_with_version(&out, version)?;
    if r.ips.is_empty() {
        return Err(CniError::new(
            code::DELEGATE_FAILED,
            format!("ipam {ipam_type} returned no IP configuration"),
            out.to_string(),
        ));
    }
    Ok(r)
}

/// IPAM DEL (idempotent on the plugin's side).
pub fn del(ipam_type: &str, args: &CmdArgs, stdin: &[u8]) -> Result<(), CniError> {
    run(ipam_type, Verb::Del, args, stdin).map(|_| ())
}

/// IPAM CHECK.
pub fn check(ipam_type: &str, args: &CmdArgs, stdin: &[u8]) -> Result<(), CniError> {
    run(ipam_type, Verb::Check, args, stdin).map(|_| ())
}

/// IPAM GC or STATUS forwarding.
pub fn forward(ipam_type: &str, verb: Verb, args: &CmdArgs, stdin: &[u8]) -> Result<(), CniError> {
    run(ipam_type, verb, args, stdin).map(|_| ())
}
