//! The real [`PfVfConfig`]: RTM_SETLINK / RTM_GETLINK on the PF with IFLA_VFINFO_LIST.

use std::sync::Mutex;

use netlink_packet_core::NLM_F_ACK;
use netlink_packet_route::link::{
    LinkAttribute, LinkExtentMask, LinkMessage, LinkVfInfo, VfInfo, VfInfoLinkState, VfInfoMac,
    VfInfoRate, VfInfoSpoofCheck, VfInfoTrust, VfLinkState, VfVlan, VfVlanInfo, VlanProtocol,
};
use netlink_packet_route::RouteNetlinkMessage;

use crate::nl::{Link, Netlink};
use crate::pf::{LinkState, MacAddr, PfError, PfVfConfig, VfConfig, VlanProto};

/// One IFLA_VF_INFO attribute to set on a VF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VfSetting {
    /// IFLA_VF_VLAN_LIST with one IFLA_VF_VLAN_INFO.
    Vlan {
        /// VLAN id.
        vlan: u16,
        /// QoS.
        qos: u8,
        /// Protocol.
        proto: VlanProto,
    },
    /// IFLA_VF_MAC.
    Mac(MacAddr),
    /// IFLA_VF_RATE.
    Rate {
        /// Min Mbps.
        min: u32,
        /// Max Mbps.
        max: u32,
    },
    /// IFLA_VF_SPOOFCHK.
    SpoofChk(bool),
    /// IFLA_VF_TRUST.
    Trust(bool),
    /// IFLA_VF_LINK_STATE.
    LinkState(LinkState),
}

/// Builds the netlink VF attribute for one setting of VF `vf`.
pub fn vf_info(vf: u32, s: &VfSetting) -> VfInfo {
    match *s {
        VfSetting::Vlan { vlan, qos, proto } => {
            let p = match proto {
                VlanProto::Dot1Q => VlanProtocol::Ieee8021Q,
                VlanProto::Dot1Ad => VlanProtocol::Ieee8021Ad,
            };
            // VLAN_LIST rather than the legacy IFLA_VF_VLAN so the protocol is carried; the
            // crate emits the 16-byte padded payload current kernels require (CVE-2024-36017).
            VfInfo::VlanList(vec![VfVlan::Info(VfVlanInfo::new(
                vf,
                u32::from(vlan),
                u32::from(qos),
                p,
            ))])
        }
        VfSetting::Mac(mac) => VfInfo::Mac(VfInfoMac::new(vf, &mac.0)),
        VfSetting::Rate { min, max } => VfInfo::Rate(VfInfoRate::new(vf, min, max)),
        VfSetting::SpoofChk(on) => VfInfo::SpoofCheck(VfInfoSpoofCheck::new(vf, on)),
        VfSetting::Trust(on) => VfInfo::Trust(VfInfoTrust::new(vf, on)),
        VfSetting::LinkState(st) => VfInfo::LinkState(VfInfoLinkState::new(
            vf,
            match st {
                LinkState::Auto => VfLinkState::Auto,
                LinkState::Enable => VfLinkState::Enable,
                LinkState::Disable => VfLinkState::Disable,
            },
        )),
    }
}

/// The RTM_SETLINK request that applies `setting` to VF `vf` of the PF with index `pf_index`.
pub fn set_vf_request(pf_index: u32, vf: u32, setting: &VfSetting) -> RouteNetlinkMessage {
    let mut m = LinkMessage::default();
    m.header.index = pf_index;
    m.attributes
        .push(LinkAttribute::VfInfoList(vec![LinkVfInfo(vec![vf_info(
            vf, setting,
        )])]));
    RouteNetlinkMessage::SetLink(m)
}

/// The RTM_GETLINK request that reads the VF table of the PF `pf_name`.
pub fn get_vfs_request(pf_name: &str) -> RouteNetlinkMessage {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(pf_name.into()));
    m.attributes.push(LinkAttribute::ExtMask(vec![
        LinkExtentMask::Vf,
        LinkExtentMask::SkipStats,
    ]));
    RouteNetlinkMessage::GetLink(m)
}

/// Extracts VF `vf` from a PF link message. The `vf` field inside each attribute is used, not
/// the position in the list (the kernel omits VFs whose `ndo_get_vf_config` fails).
pub fn parse_vf(msg: &LinkMessage, vf: u32) -> Option<VfConfig> {
    for attr in &msg.attributes {
        let LinkAttribute::VfInfoList(list) = attr else {
            continue;
        };
        for LinkVfInfo(infos) in list {
            let id = infos.iter().find_map(|i| match i {
                VfInfo::Mac(m) => Some(m.vf_id),
                _ => None,
            });
            if id != Some(vf) {
                continue;
            }
            let mut c = VfConfig::default();
            for i in infos {
                match i {
                    VfInfo::Mac(m) => {
                        let mut mac = [0u8; 6];
                        mac.copy_from_slice(&m.mac[..6]);
                        c.mac = MacAddr(mac);
                    }
                    VfInfo::Vlan(v) => {
                        c.vlan = v.vlan_id as u16;
                        c.qos = v.qos as u8;
                    }
                    VfInfo::VlanList(l) => {
                        for v in l {
                            if let VfVlan::Info(v) = v {
                                c.vlan = v.vlan_id as u16;
                                c.qos = v.qos as u8;
                                c.proto = match v.protocol {
                                    VlanProtocol::Ieee8021Ad => VlanProto::Dot1Ad,
                                    _ => VlanProto::Dot1Q,
                                };
                            }
                        }
                    }
                    VfInfo::Rate(r) => {
                        c.min_tx_rate = r.min_tx_rate;
                        c.max_tx_rate = r.max_tx_rate;
                    }
                    VfInfo::SpoofCheck(s) => c.spoofchk = s.enabled,
                    VfInfo::Trust(t) => c.trust = t.enabled,
                    VfInfo::LinkState(l) => {
                        c.link_state = match l.state {
                            VfLinkState::Enable => LinkState::Enable,
                            VfLinkState::Disable => LinkState::Disable,
                            _ => LinkState::Auto,
                        }
                    }
                    _ => {}
                }
            }
            return Some(c);
        }
    }
    None
}

/// Explains an EINVAL on a rate change when the PF has no link: igb (and other drivers) check
/// the link speed and refuse any VF rate change, a reset to 0 included, while there is none.
pub fn no_carrier_hint(s: &VfSetting, errno: Option<i32>, pf: &Link) -> String {
    let no_link = !pf.up || pf.carrier == Some(false);
    if matches!(s, VfSetting::Rate { .. }) && errno == Some(libc::EINVAL) && no_link {
        format!(
            " (PF {} has no carrier: the driver accepts no VF rate change without link)",
            pf.name
        )
    } else {
        String::new()
    }
}

/// [`PfVfConfig`] over a netlink socket in the PF's (host) network namespace.
pub struct NetlinkPf {
    nl: Mutex<Netlink>,
}

impl NetlinkPf {
    /// Uses `nl`, which must be bound to the netns holding the PF.
    pub fn new(nl: Netlink) -> Self {
        NetlinkPf { nl: Mutex::new(nl) }
    }

    fn with_nl<T>(&self, f: impl FnOnce(&mut Netlink) -> T) -> T {
        let mut g = self.nl.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    fn pf_link(&self, nl: &mut Netlink, pf: &str) -> Result<Link, PfError> {
        nl.link_by_name(pf)
            .map_err(|e| PfError::Failed {
                op: "lookup PF",
                pf: pf.into(),
                vf: 0,
                cause: e.to_string(),
            })?
            .ok_or_else(|| PfError::PfNotFound { pf: pf.into() })
    }

    fn set(&self, op: &'static str, pf: &str, vf: u32, s: VfSetting) -> Result<(), PfError> {
        self.with_nl(|nl| {
            let link = self.pf_link(nl, pf)?;
            nl.request(op, set_vf_request(link.index, vf, &s), NLM_F_ACK)
                .map(drop)
                .map_err(|e| PfError::Failed {
                    op,
                    pf: pf.into(),
                    vf,
                    cause: e.to_string() + &no_carrier_hint(&s, e.errno(), &link),
                })
        })
    }
}

impl PfVfConfig for NetlinkPf {
    fn get_vf(&self, pf: &str, vf: u32) -> Result<VfConfig, PfError> {
        self.with_nl(|nl| {
            let replies = nl.request("get_vf", get_vfs_request(pf), 0).map_err(|e| {
                if e.is_not_found() {
                    PfError::PfNotFound { pf: pf.into() }
                } else {
                    PfError::Failed {
                        op: "get_vf",
                        pf: pf.into(),
                        vf,
                        cause: e.to_string(),
                    }
                }
            })?;
            replies
                .iter()
                .find_map(|r| match r {
                    RouteNetlinkMessage::NewLink(m) => parse_vf(m, vf),
                    _ => None,
                })
                .ok_or_else(|| PfError::VfNotFound { pf: pf.into(), vf })
        })
    }

    fn set_vf_vlan(
        &self,
        pf: &str,
        vf: u32,
        vlan: u16,
        qos: u8,
        proto: VlanProto,
    ) -> Result<(), PfError> {
        self.set("set_vf_vlan", pf, vf, VfSetting::Vlan { vlan, qos, proto })
    }
    fn set_vf_mac(&self, pf: &str, vf: u32, mac: MacAddr) -> Result<(), PfError> {
        self.set("set_vf_mac", pf, vf, VfSetting::Mac(mac))
    }
    fn set_vf_spoofchk(&self, pf: &str, vf: u32, on: bool) -> Result<(), PfError> {
        self.set("set_vf_spoofchk", pf, vf, VfSetting::SpoofChk(on))
    }
    fn set_vf_trust(&self, pf: &str, vf: u32, on: bool) -> Result<(), PfError> {
        self.set("set_vf_trust", pf, vf, VfSetting::Trust(on))
    }
    fn set_vf_rate(&self, pf: &str, vf: u32, min: u32, max: u32) -> Result<(), PfError> {
        self.set("set_vf_rate", pf, vf, VfSetting::Rate { min, max })
    }
    fn set_vf_link_state(&self, pf: &str, vf: u32, state: LinkState) -> Result<(), PfError> {
        self.set("set_vf_link_state", pf, vf, VfSetting::LinkState(state))
    }
}

#[cfg(test)]
mod tests;
