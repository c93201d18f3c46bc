//! GC: release the VFs, caches and IPAM allocations of this network's attachments that are not
//! in `cni.dev/valid-attachments`.

use plexus_delegates::ipam;
use plexus_delegates::skel::{CmdArgs, Command};

use crate::ctx::Ctx;
use crate::del::release_if_owner;
use crate::error::SriovError;
use crate::netconf::NetConf;

/// Runs GC.
pub fn gc(ctx: &Ctx<'_>, args: &CmdArgs, conf: &NetConf) -> Result<(), SriovError> {
    let Some(valid) = &conf.valid_attachments else {
        // The spec requires the list; without it nothing is known to be stale.
        return Ok(());
    };
    let mut errs = Vec::new();
    for st in ctx.store.all()? {
        let same_net = st.config.get("name").and_then(|n| n.as_str()) == Some(conf.name.as_str());
        if !same_net || valid.contains(&(st.container_id.clone(), st.ifname.clone())) {
            continue;
        }
        tracing::info!(container = %st.container_id, ifname = %st.ifname, vf = %st.vf_pci, "GC: releasing stale attachment");
        let _lock = match ctx.store.lock_vf(&st.vf_pci) {
            Ok(l) => l,
            Err(e) => {
                errs.push(e);
                continue;
            }
        };
        let mut these = Vec::new();
        if let Some(t) = &st.ipam_type {
            let stale = CmdArgs {
                command: Command::Del,
                container_id: st.container_id.clone(),
                netns: String::new(),
                ifname: st.ifname.clone(),
                args: String::new(),
                path: args.path.clone(),
                stdin: serde_json::to_vec(&st.config).unwrap_or_default(),
            };
            if let Err(e) = ipam::del(t, &stale, &stale.stdin) {
                these.push(SriovError::Ipam(e));
            }
        }
        release_if_owner(ctx, &st, None, &mut these);
        if these.is_empty() {
            if let Err(e) = ctx.store.remove(&st.container_id, &st.ifname) {
                these.push(e);
            }
        }
        errs.extend(these);
    }
    if let Some(t) = &conf.ipam_type {
        if let Err(e) = ipam::forward(t, Command::Gc, args, &args.stdin) {
            errs.push(SriovError::Ipam(e));
        }
    }
    match errs.len() {
        0 => Ok(()),
        _ => Err(SriovError::Multi(errs)),
    }
}
