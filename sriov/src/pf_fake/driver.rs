//! Driver models for the fake PF: which VF settings a PF driver refuses, and with which errno,
//! on top of the kernel's own rtnetlink checks. The `igb` model is what the VM tier measured on
//! an emulated 82576 with Linux 6.1 (and checks against the real driver on every run).

use serde::{Deserialize, Serialize};

use super::Call;
use crate::pf::VlanProto;

/// The PF driver the fake mirrors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FakeDriver {
    /// Accepts every setting the kernel's own checks accept (like netdevsim).
    #[default]
    Generic,
    /// Intel 82576 `igb`: no link state (EOPNOTSUPP), no 802.1ad VLAN (EPROTONOSUPPORT), no
    /// minimum rate, and no rate change at all without carrier or above the link speed (EINVAL).
    Igb,
}

/// `io::Error`'s text for the errnos the models produce, as the real plugin reports them.
const EOPNOTSUPP: &str = "Operation not supported (os error 95)";
const EPROTONOSUPPORT: &str = "Protocol not supported (os error 93)";
const EINVAL: &str = "Invalid argument (os error 22)";

/// The link speed of the modelled igb PF (Mbps).
pub const IGB_LINK_MBPS: u32 = 1000;

impl FakeDriver {
    /// Why this driver refuses `call` (the kernel error text), or None when it accepts it.
    /// `carrier` is whether the PF has link.
    pub fn refusal(self, call: &Call, carrier: bool) -> Option<&'static str> {
        match self {
            FakeDriver::Generic => None,
            FakeDriver::Igb => match call {
                // igb has no ndo_set_vf_link_state: rtnetlink answers EOPNOTSUPP for any value.
                Call::SetVfLinkState { .. } => Some(EOPNOTSUPP),
                Call::SetVfVlan {
                    proto: VlanProto::Dot1Ad,
                    ..
                } => Some(EPROTONOSUPPORT),
                // igb_ndo_set_vf_bw: min must be 0; the link must be up and max within its speed.
                Call::SetVfRate { min, max, .. }
                    if *min != 0 || !carrier || *max > IGB_LINK_MBPS =>
                {
                    Some(EINVAL)
                }
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pf::LinkState;

    fn rate(min: u32, max: u32) -> Call {
        Call::SetVfRate {
            pf: "eth0".into(),
            vf: 0,
            min,
            max,
        }
    }

    #[test]
    fn igb_refuses_what_the_real_driver_refuses() {
        let igb = FakeDriver::Igb;
        let ls = Call::SetVfLinkState {
            pf: "eth0".into(),
            vf: 0,
            state: LinkState::Auto,
        };
        assert_eq!(igb.refusal(&ls, true), Some(EOPNOTSUPP));
        let vlan = |proto| Call::SetVfVlan {
            pf: "eth0".into(),
            vf: 0,
            vlan: 100,
            qos: 3,
            proto,
        };
        assert_eq!(
            igb.refusal(&vlan(VlanProto::Dot1Ad), true),
            Some(EPROTONOSUPPORT)
        );
        assert_eq!(igb.refusal(&vlan(VlanProto::Dot1Q), true), None);
        assert_eq!(igb.refusal(&rate(0, 100), true), None);
        assert_eq!(igb.refusal(&rate(10, 100), true), Some(EINVAL));
        assert_eq!(igb.refusal(&rate(0, 2000), true), Some(EINVAL));
        // Without carrier even the reset to unlimited is refused.
        assert_eq!(igb.refusal(&rate(0, 0), false), Some(EINVAL));
        assert_eq!(FakeDriver::Generic.refusal(&ls, false), None);
        assert_eq!(FakeDriver::Generic.refusal(&rate(10, 0), false), None);
    }
}
