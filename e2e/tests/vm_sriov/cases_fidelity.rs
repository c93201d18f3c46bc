//! The fake PF's `igb` model against the real igb driver: the same sequence of PF-side VF calls
//! goes to the real PF (netlink, as the plugin sends them) and to `RecordingPf` with
//! `FakeDriver::Igb`; every call must succeed or fail alike (same errno) and leave the same VF
//! configuration, with and without carrier.

use plexus_sriov::nl::Netlink;
use plexus_sriov::pf::{LinkState, MacAddr, PfError, PfVfConfig, VlanProto};
use plexus_sriov::pf_fake::{FakeDriver, FakePfState, RecordingPf};
use plexus_sriov::pf_netlink::NetlinkPf;

use crate::guest::{Case, T};

/// The cases of this module, in run order.
pub const CASES: &[Case] = &[("fake_igb_model_matches_the_real_igb", fidelity)];

type Step = (
    &'static str,
    fn(&dyn PfVfConfig, &str) -> Result<(), PfError>,
);

const MAC: MacAddr = MacAddr([0x02, 0x42, 0xac, 0x11, 0x00, 0x0c]);

/// With carrier: every setting the plugin can send, accepted and refused ones.
const WITH_LINK: &[Step] = &[
    ("vlan 100 qos 3", |p, pf| {
        p.set_vf_vlan(pf, 0, 100, 3, VlanProto::Dot1Q)
    }),
    ("vlan 100 802.1ad", |p, pf| {
        p.set_vf_vlan(pf, 0, 100, 3, VlanProto::Dot1Ad)
    }),
    ("mac", |p, pf| p.set_vf_mac(pf, 0, MAC)),
    ("spoofchk off", |p, pf| p.set_vf_spoofchk(pf, 0, false)),
    ("trust on", |p, pf| p.set_vf_trust(pf, 0, true)),
    ("rate 0-100", |p, pf| p.set_vf_rate(pf, 0, 0, 100)),
    ("rate 10-100", |p, pf| p.set_vf_rate(pf, 0, 10, 100)),
    ("rate 0-2000", |p, pf| p.set_vf_rate(pf, 0, 0, 2000)),
    ("link_state enable", |p, pf| {
        p.set_vf_link_state(pf, 0, LinkState::Enable)
    }),
    ("link_state auto", |p, pf| {
        p.set_vf_link_state(pf, 0, LinkState::Auto)
    }),
];

/// Without carrier: the restore a DEL would send.
const WITHOUT_LINK: &[Step] = &[
    ("rate 0-0 without carrier", |p, pf| {
        p.set_vf_rate(pf, 0, 0, 0)
    }),
    ("vlan 0 without carrier", |p, pf| {
        p.set_vf_vlan(pf, 0, 0, 0, VlanProto::Dot1Q)
    }),
    ("mac zero without carrier", |p, pf| {
        p.set_vf_mac(pf, 0, MacAddr::default())
    }),
    ("spoofchk on without carrier", |p, pf| {
        p.set_vf_spoofchk(pf, 0, true)
    }),
    ("trust off without carrier", |p, pf| {
        p.set_vf_trust(pf, 0, false)
    }),
];

/// "ok" or the errno part of the error ("os error 22").
fn outcome(r: &Result<(), PfError>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => {
            let s = e.to_string();
            s.rfind("(os error ")
                .and_then(|i| s[i + 1..].split(')').next().map(str::to_string))
                .unwrap_or(s)
        }
    }
}

/// Puts VF 0 back to igb's defaults with the PF up (runs even when the case fails).
struct Reset<'a>(&'a T<'a>);

impl Drop for Reset<'_> {
    fn drop(&mut self) {
        let _ = self
            .0
            .pf
            .set_up(true)
            .and_then(|()| self.0.pf.wait_rate_ready());
        if let Ok(nl) = Netlink::open() {
            let p = NetlinkPf::new(nl);
            let pf = self.0.pf.name.as_str();
            let _ = p.set_vf_vlan(pf, 0, 0, 0, VlanProto::Dot1Q);
            let _ = p.set_vf_mac(pf, 0, MacAddr::default());
            let _ = p.set_vf_spoofchk(pf, 0, true);
            let _ = p.set_vf_trust(pf, 0, false);
            let _ = p.set_vf_rate(pf, 0, 0, 0);
        }
        // With no admin MAC igb reports the MAC the VF last gave itself: the VF asks for its
        // own MAC again (a change to another and back, so the kernel does not skip it). The PF
        // went down and up, which leaves the VF's mailbox closed until the VF resets: that
        // is what bringing it up does.
        if let Some(dev) = crate::vf::vf_netdev(&self.0.vf(0)) {
            if let Ok(mac) = std::fs::read_to_string(format!("/sys/class/net/{dev}/address")) {
                let set =
                    |a: &[&str]| crate::vf::sh(&[&["ip", "link", "set", "dev", &dev], a].concat());
                let _ = set(&["up"]);
                let carrier = format!("/sys/class/net/{dev}/carrier");
                crate::vf::wait_for(std::time::Duration::from_secs(10), || {
                    std::fs::read_to_string(&carrier).is_ok_and(|c| c.trim() == "1")
                });
                for m in ["02:00:00:00:00:98", mac.trim()] {
                    let _ = set(&["address", m]);
                }
                let _ = set(&["down"]);
            }
        }
    }
}

fn fidelity<'a>(t: &'a T<'a>) {
    let _reset = Reset(t);
    let pf = t.pf.name.as_str();
    let real = NetlinkPf::new(Netlink::open().expect("netlink"));
    let mut st = FakePfState::with_pf(pf, 2);
    st.pfs.get_mut(pf).expect("pf")[0] = real.get_vf(pf, 0).expect("real get_vf");
    st.driver = FakeDriver::Igb;
    let fake = RecordingPf::new(st);
    let mut table = Vec::new();
    for (name, step) in WITH_LINK {
        let (r, f) = (outcome(&step(&real, pf)), outcome(&step(&fake, pf)));
        assert_eq!(r, f, "{name}: real igb {r}, fake {f}");
        let (rv, fv) = (
            real.get_vf(pf, 0).expect("real"),
            fake.get_vf(pf, 0).expect("fake"),
        );
        assert_eq!(rv, fv, "{name}: VF config after the call");
        table.push(format!("{name}: {r}"));
    }
    t.pf.set_up(false).expect("PF down");
    let mut st = fake.snapshot();
    st.no_carrier = true;
    let fake = RecordingPf::new(st);
    for (name, step) in WITHOUT_LINK {
        let (r, f) = (outcome(&step(&real, pf)), outcome(&step(&fake, pf)));
        assert_eq!(r, f, "{name}: real igb {r}, fake {f}");
        table.push(format!("{name}: {r}"));
    }
    // igb may clear VF rate limits itself when the link changes (its watchdog): compare the
    // rest of the configuration only.
    let (mut rv, mut fv) = (
        real.get_vf(pf, 0).expect("real"),
        fake.get_vf(pf, 0).expect("fake"),
    );
    let rate_real = (rv.min_tx_rate, rv.max_tx_rate);
    (
        rv.min_tx_rate,
        rv.max_tx_rate,
        fv.min_tx_rate,
        fv.max_tx_rate,
    ) = (0, 0, 0, 0);
    assert_eq!(rv, fv, "VF config without carrier");
    t.note(format!(
        "igb fidelity of the fake PF (real = fake for every call): {}; real rate after the carrier loss: {rate_real:?}",
        table.join(", ")
    ));
}
