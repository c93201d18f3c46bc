//! The real netlink PF implementation against the kernel. No SR-IOV hardware here, so a veth
//! stands in for the PF: the kernel parses our RTM_SETLINK/RTM_GETLINK and answers that the
//! device has no VF support, which proves the requests reach `do_setvfinfo` intact.

mod common;

use common::*;
use plexus_delegates::netns::NetNs;
use plexus_sriov::nl::Netlink;
use plexus_sriov::pf::{LinkState, PfError, PfVfConfig, VlanProto};
use plexus_sriov::pf_netlink::NetlinkPf;

#[test]
fn netlink_pf_requests_reach_the_kernel() {
    let ns = Ns::new("nlpf");
    run(&[
        "ip", "-n", &ns.name, "link", "add", "fakepf", "type", "veth", "peer", "name", "fakepfp",
    ]);
    let h = NetNs::open(ns.path()).unwrap();
    h.run(|| {
        let pf = NetlinkPf::new(Netlink::open().unwrap());
        // veth reports no VF table.
        assert!(matches!(
            pf.get_vf("fakepf", 0),
            Err(PfError::VfNotFound { .. })
        ));
        assert!(matches!(
            pf.get_vf("nosuchpf", 0),
            Err(PfError::PfNotFound { .. })
        ));
        let mac = "02:00:00:00:00:01".parse().unwrap();
        let results = [
            (
                "set_vf_vlan",
                pf.set_vf_vlan("fakepf", 0, 100, 3, VlanProto::Dot1Ad),
            ),
            ("set_vf_mac", pf.set_vf_mac("fakepf", 0, mac)),
            ("set_vf_rate", pf.set_vf_rate("fakepf", 0, 0, 1000)),
            ("set_vf_spoofchk", pf.set_vf_spoofchk("fakepf", 0, true)),
            ("set_vf_trust", pf.set_vf_trust("fakepf", 0, false)),
            (
                "set_vf_link_state",
                pf.set_vf_link_state("fakepf", 0, LinkState::Enable),
            ),
        ];
        for (op, r) in results {
            let e = r.expect_err(op).to_string();
            // EOPNOTSUPP (no ndo_set_vf_*), not EINVAL (a malformed attribute) or a parse error.
            assert!(e.contains("Operation not supported"), "{op}: {e}");
            assert!(e.contains(op) && e.contains("fakepf"), "{op}: {e}");
        }
    })
    .unwrap();
}
