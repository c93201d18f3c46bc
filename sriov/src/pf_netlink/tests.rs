//! Netlink message round trips: build, serialize, parse back with netlink-packet-route.

use super::*;
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};

fn round_trip(msg: RouteNetlinkMessage) -> (Vec<u8>, RouteNetlinkMessage) {
    let mut h = NetlinkHeader::default();
    h.flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut nl = NetlinkMessage::new(h, NetlinkPayload::from(msg));
    nl.finalize();
    let mut buf = vec![0u8; nl.buffer_len()];
    nl.serialize(&mut buf);
    let back = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf).expect("parse back");
    match back.payload {
        NetlinkPayload::InnerMessage(m) => (buf, m),
        other => panic!("unexpected payload {other:?}"),
    }
}

/// Parses a set request back and returns the single VfInfo it carries, checking the envelope.
fn single_vf_info(msg: RouteNetlinkMessage) -> (Vec<u8>, VfInfo) {
    let (buf, back) = round_trip(msg);
    let RouteNetlinkMessage::SetLink(m) = back else {
        panic!("not RTM_SETLINK: {back:?}")
    };
    assert_eq!(m.header.index, 7, "sent to the PF index");
    assert_eq!(m.attributes.len(), 1);
    let LinkAttribute::VfInfoList(list) = &m.attributes[0] else {
        panic!("not IFLA_VFINFO_LIST: {:?}", m.attributes)
    };
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].0.len(), 1);
    (buf, list[0].0[0].clone())
}

#[test]
fn vlan_with_proto_and_qos_uses_vlan_list_with_16_byte_info() {
    let s = VfSetting::Vlan {
        vlan: 100,
        qos: 5,
        proto: VlanProto::Dot1Ad,
    };
    let (buf, info) = single_vf_info(set_vf_request(7, 3, &s));
    let VfInfo::VlanList(l) = info else {
        panic!("{info:?}")
    };
    assert_eq!(l.len(), 1);
    let VfVlan::Info(v) = &l[0] else {
        panic!("{l:?}")
    };
    assert_eq!((v.vf_id, v.vlan_id, v.qos), (3, 100, 5));
    assert_eq!(v.protocol, VlanProtocol::Ieee8021Ad);
    // Raw bytes: IFLA_VF_VLAN_INFO nla = 4-byte header + 16-byte payload, proto big-endian.
    let needle = [
        20u8, 0, 1, 0, 3, 0, 0, 0, 100, 0, 0, 0, 5, 0, 0, 0, 0x88, 0xa8,
    ];
    assert!(
        buf.windows(needle.len()).any(|w| w == needle),
        "VLAN_INFO not 16 bytes with big-endian 802.1ad: {buf:02x?}"
    );
    let (_, info) = single_vf_info(set_vf_request(
        7,
        0,
        &VfSetting::Vlan {
            vlan: 0,
            qos: 0,
            proto: VlanProto::Dot1Q,
        },
    ));
    let VfInfo::VlanList(l) = info else { panic!() };
    let VfVlan::Info(v) = &l[0] else { panic!() };
    assert_eq!(
        (v.vf_id, v.vlan_id, v.qos, v.protocol),
        (0, 0, 0, VlanProtocol::Ieee8021Q)
    );
}

#[test]
fn mac_rate_spoofchk_trust_link_state_round_trip() {
    let mac: MacAddr = "02:aa:bb:cc:dd:ee".parse().unwrap();
    let (_, info) = single_vf_info(set_vf_request(7, 2, &VfSetting::Mac(mac)));
    let VfInfo::Mac(m) = info else {
        panic!("{info:?}")
    };
    assert_eq!(m.vf_id, 2);
    assert_eq!(&m.mac[..6], &mac.0);
    assert!(m.mac[6..].iter().all(|b| *b == 0));

    let (_, info) = single_vf_info(set_vf_request(
        7,
        2,
        &VfSetting::Rate { min: 10, max: 1000 },
    ));
    assert_eq!(info, VfInfo::Rate(VfInfoRate::new(2, 10, 1000)));

    for on in [true, false] {
        let (_, info) = single_vf_info(set_vf_request(7, 4, &VfSetting::SpoofChk(on)));
        let VfInfo::SpoofCheck(s) = info else {
            panic!()
        };
        assert_eq!((s.vf_id, s.enabled), (4, on));
        let (_, info) = single_vf_info(set_vf_request(7, 4, &VfSetting::Trust(on)));
        let VfInfo::Trust(t) = info else { panic!() };
        assert_eq!((t.vf_id, t.enabled), (4, on));
    }
    for (st, want) in [
        (LinkState::Auto, VfLinkState::Auto),
        (LinkState::Enable, VfLinkState::Enable),
        (LinkState::Disable, VfLinkState::Disable),
    ] {
        let (_, info) = single_vf_info(set_vf_request(7, 1, &VfSetting::LinkState(st)));
        let VfInfo::LinkState(l) = info else { panic!() };
        assert_eq!((l.vf_id, l.state), (1, want));
    }
}

#[test]
fn get_request_asks_for_vf_info() {
    let (_, back) = round_trip(get_vfs_request("enp175s0f1"));
    let RouteNetlinkMessage::GetLink(m) = back else {
        panic!("{back:?}")
    };
    assert!(m
        .attributes
        .contains(&LinkAttribute::IfName("enp175s0f1".into())));
    let mask = m.attributes.iter().find_map(|a| match a {
        LinkAttribute::ExtMask(v) => Some(v.clone()),
        _ => None,
    });
    assert!(mask.unwrap().contains(&LinkExtentMask::Vf));
}

#[test]
fn reply_with_vf_table_parses_into_vf_config_by_vf_id() {
    // A kernel-style RTM_NEWLINK reply: two VFs, listed out of order.
    let mac1 = [2u8, 0, 0, 0, 0, 1];
    let vf = |id: u32, mac: &[u8], vlan: u32, proto| {
        LinkVfInfo(vec![
            VfInfo::Mac(VfInfoMac::new(id, mac)),
            VfInfo::VlanList(vec![VfVlan::Info(VfVlanInfo::new(id, vlan, 2, proto))]),
            VfInfo::Rate(VfInfoRate::new(id, 0, 1000)),
            VfInfo::SpoofCheck(VfInfoSpoofCheck::new(id, false)),
            VfInfo::LinkState(VfInfoLinkState::new(id, VfLinkState::Disable)),
            VfInfo::Trust(VfInfoTrust::new(id, true)),
        ])
    };
    let mut m = LinkMessage::default();
    m.header.index = 7;
    m.attributes.push(LinkAttribute::NumVf(2));
    m.attributes.push(LinkAttribute::VfInfoList(vec![
        vf(1, &mac1, 100, VlanProtocol::Ieee8021Ad),
        vf(0, &[0; 6], 0, VlanProtocol::Ieee8021Q),
    ]));
    let (_, back) = round_trip(RouteNetlinkMessage::NewLink(m));
    let RouteNetlinkMessage::NewLink(m) = back else {
        panic!()
    };
    let c = parse_vf(&m, 1).unwrap();
    assert_eq!(
        c,
        VfConfig {
            mac: MacAddr(mac1),
            vlan: 100,
            qos: 2,
            proto: VlanProto::Dot1Ad,
            spoofchk: false,
            trust: true,
            min_tx_rate: 0,
            max_tx_rate: 1000,
            link_state: LinkState::Disable,
        }
    );
    assert_eq!(parse_vf(&m, 0).unwrap().vlan, 0);
    assert_eq!(parse_vf(&m, 2), None);
}

#[test]
fn rate_einval_on_a_pf_without_link_says_why() {
    let mut pf = Link {
        index: 2,
        name: "eth0".into(),
        mac: vec![0; 6],
        mtu: 1500,
        up: true,
        altnames: vec![],
        carrier: Some(false),
    };
    let rate = VfSetting::Rate { min: 0, max: 100 };
    let hint = no_carrier_hint(&rate, Some(libc::EINVAL), &pf);
    assert!(hint.contains("PF eth0 has no carrier"), "{hint}");
    pf.carrier = Some(true);
    assert_eq!(no_carrier_hint(&rate, Some(libc::EINVAL), &pf), "");
    pf.up = false;
    assert!(!no_carrier_hint(&rate, Some(libc::EINVAL), &pf).is_empty());
    // Only a rate EINVAL gets the hint.
    assert_eq!(
        no_carrier_hint(&VfSetting::Trust(true), Some(libc::EINVAL), &pf),
        ""
    );
    assert_eq!(no_carrier_hint(&rate, Some(libc::EOPNOTSUPP), &pf), "");
}
