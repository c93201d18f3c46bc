//! DEL: release IPAM, restore the VF from the saved state, run to the end, and keep the state
//! file when something could not be restored so a retried DEL can finish the job.

use std::fs::File;
use std::path::Path;

use plexus_delegates::ipam;
use plexus_delegates::netns::NetNs;
use plexus_delegates::skel::CmdArgs;

use crate::ctx::Ctx;
use crate::error::SriovError;
use crate::netconf::NetConf;
use crate::nl::Netlink;
use crate::restore;
use crate::vf_state::{self, NetdevOrig, VfState};

fn combine(mut errs: Vec<SriovError>) -> Result<(), SriovError> {
    match errs.len() {
        0 => Ok(()),
        1 => Err(errs.remove(0)),
        _ => Err(SriovError::Multi(errs)),
    }
}

/// Runs DEL for (CNI_CONTAINERID, CNI_IFNAME).
pub fn del(ctx: &Ctx<'_>, args: &CmdArgs, conf: &NetConf) -> Result<(), SriovError> {
    let loaded = match ctx.store.load(&args.container_id, &args.ifname) {
        Err(e) if vf_state::is_corrupt(&e) => return del_without_state(ctx, args, conf, e),
        other => other?,
    };
    let Some(st) = loaded else {
        // Nothing attached (DEL without ADD, a repeated DEL, or a failed ADD that rolled back).
        // Still release IPAM: sriov-cni skips it here and leaks the address (#178).
        if let Some(t) = &conf.ipam_type {
            ipam::del(t, args, &args.stdin).map_err(SriovError::Ipam)?;
        }
        return Ok(());
    };
    let _lock = ctx.store.lock_vf(&st.vf_pci)?;
    let mut errs = Vec::new();
    if let Some(t) = conf.ipam_type.as_ref().or(st.ipam_type.as_ref()) {
        if let Err(e) = ipam::del(t, args, &args.stdin) {
            errs.push(SriovError::Ipam(e));
        }
    }
    release_if_owner(ctx, &st, Some(&args.netns), &mut errs);
    if errs.is_empty() {
        ctx.store.remove(&st.container_id, &st.ifname)?;
    }
    combine(errs)
}

/// DEL whose state file cannot be decoded. The VF's saved PF-side settings and netdev name are
/// lost with it and cannot be restored (a warning says so; the kernel returns the netdev to the
/// host when the pod's netns goes), but everything else is done: IPAM is released from the
/// config's `ipam`, the allocation records naming this attachment are cleared (the VF is not
/// held forever) and the file is moved aside (`.corrupt`) for the operator. Only an IPAM
/// release that fails keeps it all for the runtime's retry.
fn del_without_state(
    ctx: &Ctx<'_>,
    args: &CmdArgs,
    conf: &NetConf,
    cause: SriovError,
) -> Result<(), SriovError> {
    tracing::warn!(container = %args.container_id, ifname = %args.ifname, %cause,
        "state file unusable: releasing IPAM and the VF record; the VF's PF-side settings and \
         netdev name cannot be restored");
    if let Some(t) = &conf.ipam_type {
        ipam::del(t, args, &args.stdin).map_err(SriovError::Ipam)?;
    }
    for vf in ctx.store.allocations_of(&args.container_id, &args.ifname) {
        let _lock = ctx.store.lock_vf(&vf)?;
        let still_ours = matches!(ctx.store.allocation(&vf), Ok(Some(a))
            if a.container_id == args.container_id && a.ifname == args.ifname);
        if still_ours {
            ctx.store.clear_allocation(&vf)?;
            tracing::warn!(%vf, "VF released without its saved state: check its VLAN, MAC, \
                rate, trust and spoof-check settings on the PF");
        }
    }
    let kept = ctx.store.quarantine(&args.container_id, &args.ifname)?;
    tracing::warn!(file = %kept.display(), "unusable state file kept for inspection");
    Ok(())
}

/// Restores the VF of `st` unless the allocation record says another attachment holds it now
/// (then only our record goes; touching the VF would break the new holder, sriov-cni #219).
pub(crate) fn release_if_owner(
    ctx: &Ctx<'_>,
    st: &VfState,
    netns_hint: Option<&str>,
    errs: &mut Vec<SriovError>,
) {
    let owner = match ctx.store.allocation(&st.vf_pci) {
        Ok(o) => o,
        Err(e) => {
            errs.push(e);
            return;
        }
    };
    if let Some(a) = &owner {
        if a.container_id != st.container_id || a.ifname != st.ifname {
            tracing::warn!(vf = %st.vf_pci, holder = %a.container_id,
                "VF is held by another attachment now; leaving it alone");
            return;
        }
    }
    match release_vf(ctx, st, netns_hint) {
        Ok(()) => {
            if owner.is_some() {
                if let Err(e) = ctx.store.clear_allocation(&st.vf_pci) {
                    errs.push(e);
                }
            }
        }
        Err(e) => errs.push(e),
    }
}

/// Restores PF-side settings and returns the netdev to the host under its original name.
pub fn release_vf(ctx: &Ctx<'_>, st: &VfState, netns_hint: Option<&str>) -> Result<(), SriovError> {
    // PF side first: some drivers refuse netdev MAC changes while trust is off (sriov-cni).
    let mut errs = restore::restore_pf(ctx.pf, st);
    if let Some(orig) = &st.orig_netdev {
        if let Err(e) = netdev_home(ctx, st, orig, netns_hint) {
            errs.push(e.at_step(&st.vf_pci, "return netdev to host"));
        }
    }
    if errs.is_empty() {
        if let Err(e) = restore::settle_admin_mac(ctx.pf, st) {
            errs.push(e.at_step(&st.vf_pci, "restore admin MAC"));
        }
    }
    combine(errs)
}

/// How long DEL waits for a VF netdev the kernel is still handing back from a destroyed netns.
/// A VF bound to a kernel network driver has a netdev somewhere, so it is worth waiting for
/// (1.8 s measured on igbvf under QEMU/TCG, where the old 2 s limit was nearly hit); a VF with no
/// driver or a userspace one has none, and nothing will come back.
pub const NETDEV_RETURN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn return_wait(ctx: &Ctx<'_>, vf_pci: &str) -> std::time::Duration {
    let bound_to_netdev_driver = ctx
        .sysfs
        .find_vf(vf_pci)
        .ok()
        .and_then(|l| l.driver)
        .is_some_and(|d| !crate::sysfs::USERSPACE_DRIVERS.contains(&d.as_str()));
    if bound_to_netdev_driver {
        NETDEV_RETURN_WAIT
    } else {
        std::time::Duration::ZERO
    }
}

fn netdev_home(
    ctx: &Ctx<'_>,
    st: &VfState,
    orig: &NetdevOrig,
    netns_hint: Option<&str>,
) -> Result<(), SriovError> {
    let host_path = Path::new("/proc/thread-self/ns/net");
    let host_fd =
        File::open(host_path).map_err(|e| SriovError::io("open host netns", host_path, e))?;
    let mut host = Netlink::open()?;
    let mut candidates: Vec<&str> = Vec::new();
    for p in [netns_hint.unwrap_or(""), st.netns.as_str()] {
        if !p.is_empty() && !candidates.contains(&p) {
            candidates.push(p);
        }
    }
    for path in candidates {
        // A missing netns is expected (pod already gone): the kernel has then returned the VF
        // to the host as dev<ifindex>, handled below.
        let Ok(ns) = NetNs::open(path) else { continue };
        let mut pod = ns
            .run(Netlink::open)
            .map_err(|e| SriovError::Other(e.to_string()))??;
        if let Some(l) = pod.link_by_name(&st.ifname)? {
            restore::move_back(&mut pod, &l, &host_fd, orig)?;
            break;
        }
    }
    // When the pod netns was just destroyed the kernel hands the VF back to the host
    // asynchronously (netns cleanup runs in a workqueue, after RCU grace periods): look again
    // before concluding that the netdev is gone.
    let deadline = std::time::Instant::now() + return_wait(ctx, &st.vf_pci);
    let found = loop {
        let names = ctx.sysfs.vf_netdevs(&st.vf_pci).unwrap_or_default();
        match restore::find_in_host(&mut host, &names, orig, &st.ifname)? {
            Some(l) => break Some(l),
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            None => break None,
        }
    };
    match found {
        Some(l) => restore::restore_in_host(&mut host, &l, orig, &st.ifname),
        None => {
            // Not in the pod and not in the host: nothing we can restore (e.g. the driver was
            // unbound). Reported as a warning, not an error, so DEL does not loop forever.
            tracing::warn!(vf = %st.vf_pci, name = %orig.name, "VF netdev not found anywhere");
            Ok(())
        }
    }
}
