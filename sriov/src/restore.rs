//! Putting a VF back the way it was: PF-side settings and the VF netdev (shared by ADD's
//! rollback, DEL and GC).

use std::fs::File;

use crate::error::SriovError;
use crate::nl::{Link, Netlink};
use crate::pf::PfVfConfig;
use crate::vf_state::{Applied, NetdevOrig, VfState};

/// One PF-side setting, for restore and rollback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PfField {
    /// VLAN / QoS / proto.
    Vlan,
    /// Admin MAC.
    Mac,
    /// Rates.
    Rate,
    /// Spoof check.
    SpoofChk,
    /// Trust.
    Trust,
    /// Link state.
    LinkState,
}

impl PfField {
    /// The fields `applied` marks, in the order DEL restores them. sriov-cni resets before
    /// releasing the netdev and restores trust after the MAC because some drivers refuse a MAC
    /// change on an untrusted VF.
    pub fn restore_order(applied: &Applied) -> Vec<PfField> {
        let mut v = Vec::new();
        if applied.vlan {
            v.push(PfField::Vlan);
        }
        if applied.spoofchk {
            v.push(PfField::SpoofChk);
        }
        // The admin MAC is always restored (sriov-cni #214: DPDK apps set it themselves).
        v.push(PfField::Mac);
        if applied.trust {
            v.push(PfField::Trust);
        }
        if applied.rate {
            v.push(PfField::Rate);
        }
        if applied.link_state {
            v.push(PfField::LinkState);
        }
        v
    }
}

/// Sets `field` of the VF back to its value in `st.orig_pf`.
pub fn restore_pf_field(
    pf: &dyn PfVfConfig,
    st: &VfState,
    field: PfField,
) -> Result<(), SriovError> {
    let o = &st.orig_pf;
    let (p, vf) = (st.pf.as_str(), st.vf_index);
    match field {
        PfField::Vlan => pf.set_vf_vlan(p, vf, o.vlan, o.qos, o.proto)?,
        PfField::Mac => pf.set_vf_mac(p, vf, admin_mac_to_write(st))?,
        PfField::Rate => pf.set_vf_rate(p, vf, o.min_tx_rate, o.max_tx_rate)?,
        PfField::SpoofChk => pf.set_vf_spoofchk(p, vf, o.spoofchk)?,
        PfField::Trust => pf.set_vf_trust(p, vf, o.trust)?,
        PfField::LinkState => pf.set_vf_link_state(p, vf, o.link_state)?,
    }
    Ok(())
}

/// Whether the saved admin MAC is the VF's own address rather than one the PF pinned: igb
/// reports the MAC a VF gave itself (igbvf's random one, or one set on its netdev) as the VF's
/// MAC, and writing that value back through the PF would pin it, so that an untrusted VF could
/// no longer change its own MAC (EADDRNOTAVAIL), which it could before the pod.
pub fn admin_mac_is_the_vfs_own(st: &VfState) -> bool {
    let o = &st.orig_pf;
    !o.mac.is_zero() && st.orig_netdev.as_ref().is_some_and(|n| n.mac == o.mac)
}

/// The admin MAC a restore writes: the saved one, or none (zero) when the saved one was the VF's
/// own ([`admin_mac_is_the_vfs_own`]): the netdev then restores its own MAC and
/// [`settle_admin_mac`] checks that the PF reports it again.
fn admin_mac_to_write(st: &VfState) -> crate::pf::MacAddr {
    if admin_mac_is_the_vfs_own(st) {
        crate::pf::MacAddr::default()
    } else {
        st.orig_pf.mac
    }
}

/// After the netdev has its own MAC back: when the PF does not report the saved admin MAC (a
/// driver that does not show a VF's own address), write it through the PF, as sriov-cni does.
pub fn settle_admin_mac(pf: &dyn PfVfConfig, st: &VfState) -> Result<(), SriovError> {
    if !admin_mac_is_the_vfs_own(st) {
        return Ok(());
    }
    let (p, vf) = (st.pf.as_str(), st.vf_index);
    if pf.get_vf(p, vf)?.mac != st.orig_pf.mac {
        pf.set_vf_mac(p, vf, st.orig_pf.mac)?;
    }
    Ok(())
}

/// Restores every PF-side field ADD changed (plus the admin MAC), skipping fields that already
/// have their original value. Runs to the end and returns all errors.
pub fn restore_pf(pf: &dyn PfVfConfig, st: &VfState) -> Vec<SriovError> {
    let mut errs = Vec::new();
    let current = match pf.get_vf(&st.pf, st.vf_index) {
        Ok(c) => Some(c),
        Err(e) => {
            errs.push(SriovError::from(e).at_step(&st.vf_pci, "read PF VF config"));
            None
        }
    };
    for f in PfField::restore_order(&st.applied) {
        if let Some(c) = &current {
            let o = &st.orig_pf;
            let same = match f {
                PfField::Vlan => (c.vlan, c.qos, c.proto) == (o.vlan, o.qos, o.proto),
                PfField::Mac => c.mac == o.mac,
                PfField::Rate => (c.min_tx_rate, c.max_tx_rate) == (o.min_tx_rate, o.max_tx_rate),
                PfField::SpoofChk => c.spoofchk == o.spoofchk,
                PfField::Trust => c.trust == o.trust,
                PfField::LinkState => c.link_state == o.link_state,
            };
            if same {
                continue;
            }
        }
        if let Err(e) = restore_pf_field(pf, st, f) {
            errs.push(e.at_step(&st.vf_pci, format!("restore {f:?}")));
        }
    }
    errs
}

/// Restores name, MAC and MTU of a VF netdev that is in the host netns (down while renaming),
/// and drops an altname equal to the pod ifname (kernels that keep the old name as an altname
/// on rename would otherwise block the next attach, sriov-cni #445).
pub fn restore_in_host(
    host: &mut Netlink,
    link: &Link,
    orig: &NetdevOrig,
    pod_ifname: &str,
) -> Result<(), SriovError> {
    if link.altnames.iter().any(|a| a == pod_ifname) {
        host.del_altname(link.index, pod_ifname)?;
    }
    if link.name != orig.name {
        host.set_up(link.index, false)?;
        host.set_name(link.index, &orig.name)?;
    }
    if link.mac != orig.mac.0 {
        restore_netdev_mac(host, link, orig)?;
    }
    if link.mtu != orig.mtu && orig.mtu != 0 {
        host.set_mtu(link.index, orig.mtu)?;
    }
    Ok(())
}

/// Gives the netdev its original MAC back. A PF that pins the VF's admin MAC refuses the
/// untrusted VF's own change (EADDRNOTAVAIL, igb): that is logged and not an error, since no
/// retry of DEL could change it and the admin MAC is what the VF uses.
fn restore_netdev_mac(nl: &mut Netlink, link: &Link, orig: &NetdevOrig) -> Result<(), SriovError> {
    match nl.set_mac(link.index, &orig.mac.0) {
        Err(crate::nl::NlError::Kernel { source, op })
            if source.raw_os_error() == Some(nix::errno::Errno::EADDRNOTAVAIL as i32) =>
        {
            tracing::warn!(%op, netdev = %orig.name, "the PF refuses the VF's own MAC change (admin MAC pinned); the netdev keeps its MAC");
            Ok(())
        }
        r => r.map_err(Into::into),
    }
}

/// Moves the VF netdev `link` (in the pod netns served by `pod`) back to the host netns `host_ns`
/// under its original name, restoring MAC and MTU first.
pub fn move_back(
    pod: &mut Netlink,
    link: &Link,
    host_ns: &File,
    orig: &NetdevOrig,
) -> Result<(), SriovError> {
    pod.set_up(link.index, false)?;
    if link.mac != orig.mac.0 {
        restore_netdev_mac(pod, link, orig)?;
    }
    if link.mtu != orig.mtu && orig.mtu != 0 {
        pod.set_mtu(link.index, orig.mtu)?;
    }
    // Rename and move in one request: the pod ifname may be taken in the host, the original
    // name is free there (the VF had it).
    pod.set_netns(link.index, host_ns, Some(&orig.name))?;
    Ok(())
}

/// Finds a VF netdev that is in the host netns: by the names sysfs shows for the PCI address,
/// else by the saved ifindex when the link there has one of the names a VF can come back with
/// (see [`returned_name_matches`]).
pub fn find_in_host(
    host: &mut Netlink,
    sysfs_names: &[String],
    orig: &NetdevOrig,
    pod_ifname: &str,
) -> Result<Option<Link>, SriovError> {
    for n in sysfs_names {
        if let Some(l) = host.link_by_name(n)? {
            return Ok(Some(l));
        }
    }
    if let Some(l) = host.link_by_index(orig.ifindex)? {
        if returned_name_matches(&l.name, orig, pod_ifname) {
            return Ok(Some(l));
        }
    }
    Ok(None)
}

/// True when `name`, on the link with the VF's saved ifindex in the host, is a name the VF can
/// have there: its original name, the pod ifname (the kernel returns a physical netdev of a
/// destroyed netns under the name it had in the pod when that name is free in the host, as
/// the VM tier shows on igbvf), or `dev<ifindex>` (the kernel's fallback when it is taken).
pub fn returned_name_matches(name: &str, orig: &NetdevOrig, pod_ifname: &str) -> bool {
    name == orig.name || name == pod_ifname || name == format!("dev{}", orig.ifindex)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pf::MacAddr;

    #[test]
    fn a_returned_vf_is_recognised_under_each_name_the_kernel_gives_it() {
        let orig = NetdevOrig {
            name: "ens1f0v3".into(),
            mac: MacAddr::default(),
            mtu: 1500,
            ifindex: 42,
        };
        for n in ["ens1f0v3", "net1", "dev42"] {
            assert!(returned_name_matches(n, &orig, "net1"), "{n}");
        }
        for n in ["dev43", "net2", "eth0"] {
            assert!(!returned_name_matches(n, &orig, "net1"), "{n}");
        }
    }
}
