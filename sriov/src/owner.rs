//! VF ownership: one attachment per VF, refusing live holders and taking over dead ones.

use plexus_delegates::netns::NetNs;
use plexus_delegates::skel::CmdArgs;

use crate::ctx::Ctx;
use crate::error::SriovError;

/// What [`claim`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nobody held the VF.
    Free,
    /// A stale holder (netns gone, DEL never ran) was released first; the VF netdev, if it has
    /// one, is back under this host name.
    TookOver(Option<String>),
}

/// Checks that (container, ifname) may take `vf_pci` (the per-VF lock must be held).
pub fn claim(ctx: &Ctx<'_>, args: &CmdArgs, vf_pci: &str) -> Result<Claim, SriovError> {
    // The state file is keyed by (container, ifname); the allocation by VF.
    if ctx.store.load(&args.container_id, &args.ifname)?.is_some() {
        return Err(SriovError::AlreadyAttached {
            vf: vf_pci.to_string(),
            container: args.container_id.clone(),
            ifname: args.ifname.clone(),
        });
    }
    if let Some(a) = ctx.store.allocation(vf_pci)? {
        if a.container_id == args.container_id && a.ifname == args.ifname {
            return Err(SriovError::AlreadyAttached {
                vf: vf_pci.to_string(),
                container: a.container_id,
                ifname: a.ifname,
            });
        }
        if !a.netns.is_empty() && NetNs::open(&a.netns).is_ok() {
            return Err(SriovError::Busy {
                vf: vf_pci.to_string(),
                owner: a.container_id,
                ifname: a.ifname,
                netns: a.netns,
            });
        }
        // The previous holder's netns is gone and its DEL never ran: restore the VF from its
        // state first, so this ADD saves the true original state (not `devN` and its config).
        tracing::warn!(vf = %vf_pci, owner = %a.container_id, "taking over VF from a dead netns");
        let mut name = None;
        if let Some(old) = ctx.store.load(&a.container_id, &a.ifname)? {
            crate::del::release_vf(ctx, &old, None)?;
            ctx.store.remove(&old.container_id, &old.ifname)?;
            name = old.orig_netdev.map(|o| o.name);
        }
        ctx.store.clear_allocation(vf_pci)?;
        return Ok(Claim::TookOver(name));
    }
    Ok(Claim::Free)
}
