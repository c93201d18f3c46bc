//! The PF-side VF configuration seam: types and the [`PfVfConfig`] trait.
//!
//! Implementations: [`crate::pf_netlink::NetlinkPf`] (real, rtnetlink on the PF),
//! [`crate::pf_fake::RecordingPf`] (in-memory double) and [`crate::pf_fake::FilePf`]
//! (JSON-file-backed double, a test-only seam selected by `PLEXUS_SRIOV_FAKE_PF`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// True for 00:00:00:00:00:00 ("no admin MAC set").
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 6]
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split([':', '-']).collect();
        if parts.len() != 6 {
            return Err(format!("invalid MAC address {s:?}: want 6 hex octets"));
        }
        let mut out = [0u8; 6];
        for (i, p) in parts.iter().enumerate() {
            if p.len() != 2 {
                return Err(format!("invalid MAC address {s:?}"));
            }
            out[i] = u8::from_str_radix(p, 16).map_err(|_| format!("invalid MAC address {s:?}"))?;
        }
        Ok(MacAddr(out))
    }
}

impl Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// VLAN protocol of a VF VLAN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum VlanProto {
    /// 802.1Q (0x8100).
    #[default]
    #[serde(rename = "802.1q")]
    Dot1Q,
    /// 802.1ad (0x88a8).
    #[serde(rename = "802.1ad")]
    Dot1Ad,
}

impl fmt::Display for VlanProto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VlanProto::Dot1Q => "802.1q",
            VlanProto::Dot1Ad => "802.1ad",
        })
    }
}

/// Administrative link state of a VF (IFLA_VF_LINK_STATE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    /// Follow the PF link (0).
    #[default]
    Auto,
    /// Always up (1).
    Enable,
    /// Always down (2).
    Disable,
}

impl fmt::Display for LinkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkState::Auto => "auto",
            LinkState::Enable => "enable",
            LinkState::Disable => "disable",
        })
    }
}

/// The PF-side configuration of one VF, as reported by the PF driver.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfConfig {
    /// Admin MAC (00:00:00:00:00:00 when unset).
    pub mac: MacAddr,
    /// VLAN id (0 = untagged).
    pub vlan: u16,
    /// VLAN QoS / PCP.
    pub qos: u8,
    /// VLAN protocol.
    pub proto: VlanProto,
    /// Spoof checking.
    pub spoofchk: bool,
    /// Trusted VF.
    pub trust: bool,
    /// Minimum TX rate in Mbps (0 = none).
    pub min_tx_rate: u32,
    /// Maximum TX rate in Mbps (0 = unlimited).
    pub max_tx_rate: u32,
    /// Administrative link state.
    pub link_state: LinkState,
}

/// Error of a PF-side operation.
#[derive(Debug, thiserror::Error)]
pub enum PfError {
    /// The PF netdev does not exist.
    #[error("PF {pf} not found")]
    PfNotFound {
        /// PF netdev name.
        pf: String,
    },
    /// The PF does not report this VF.
    #[error("PF {pf} has no VF {vf}")]
    VfNotFound {
        /// PF netdev name.
        pf: String,
        /// VF index.
        vf: u32,
    },
    /// The operation failed (driver or kernel error).
    #[error("{op} on PF {pf} VF {vf}: {cause}")]
    Failed {
        /// The operation (e.g. `set_vf_vlan`).
        op: &'static str,
        /// PF netdev name.
        pf: String,
        /// VF index.
        vf: u32,
        /// Cause.
        cause: String,
    },
}

/// PF-side VF configuration. Passed explicitly to every caller (never selected by `cfg!(test)`).
pub trait PfVfConfig: Send + Sync {
    /// Reads the current configuration of VF `vf` of PF `pf`.
    fn get_vf(&self, pf: &str, vf: u32) -> Result<VfConfig, PfError>;
    /// Sets VLAN id, QoS and protocol (IFLA_VF_VLAN_LIST).
    fn set_vf_vlan(
        &self,
        pf: &str,
        vf: u32,
        vlan: u16,
        qos: u8,
        proto: VlanProto,
    ) -> Result<(), PfError>;
    /// Sets the admin MAC (IFLA_VF_MAC).
    fn set_vf_mac(&self, pf: &str, vf: u32, mac: MacAddr) -> Result<(), PfError>;
    /// Sets spoof checking (IFLA_VF_SPOOFCHK).
    fn set_vf_spoofchk(&self, pf: &str, vf: u32, on: bool) -> Result<(), PfError>;
    /// Sets trust (IFLA_VF_TRUST).
    fn set_vf_trust(&self, pf: &str, vf: u32, on: bool) -> Result<(), PfError>;
    /// Sets min/max TX rate in Mbps (IFLA_VF_RATE).
    fn set_vf_rate(&self, pf: &str, vf: u32, min: u32, max: u32) -> Result<(), PfError>;
    /// Sets the administrative link state (IFLA_VF_LINK_STATE).
    fn set_vf_link_state(&self, pf: &str, vf: u32, state: LinkState) -> Result<(), PfError>;
}
