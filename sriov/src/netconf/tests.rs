//! Validation table for the sriov NetConf.

use super::*;

fn conf(extra: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"n","type":"sriov","deviceID":"0000:03:02.3"{extra}}}"#
    )
}

fn parse_ok(extra: &str) -> NetConf {
    parse(conf(extra).as_bytes(), "", Purpose::Attach).unwrap_or_else(|e| panic!("{extra}: {e}"))
}

fn parse_err(extra: &str) -> String {
    match parse(conf(extra).as_bytes(), "", Purpose::Attach) {
        Ok(c) => panic!("{extra}: expected error, got {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn invalid_values_are_rejected_with_the_key_named() {
    let table: &[(&str, &str)] = &[
        (r#","vlan":4095"#, "vlan 4095 invalid"),
        (r#","vlan":-1"#, "vlan -1 invalid"),
        (r#","vlan":"100""#, "vlan must be an integer"),
        (r#","vlan":1,"vlanQoS":8"#, "vlanQoS 8 invalid"),
        (r#","vlanQoS":1"#, "vlanQoS requires vlan"),
        (
            r#","vlan":0,"vlanQoS":1"#,
            "non-zero vlanQoS requires a non-zero vlan",
        ),
        (r#","vlanProto":"802.1q""#, "vlanProto requires vlan"),
        (
            r#","vlan":1,"vlanProto":"802.1x""#,
            "vlanProto \"802.1x\" invalid",
        ),
        (
            r#","vlan":0,"vlanProto":"802.1ad""#,
            "802.1ad requires a non-zero vlan",
        ),
        (r#","spoofchk":"yes""#, "spoofchk \"yes\" invalid"),
        (r#","trust":"true""#, "trust \"true\" invalid"),
        (r#","trust":true"#, "trust must be a string"),
        (r#","link_state":"up""#, "link_state \"up\" invalid"),
        (
            r#","min_tx_rate":200,"max_tx_rate":100"#,
            "min_tx_rate 200 is greater than max_tx_rate 100",
        ),
        (r#","max_tx_rate":-5"#, "max_tx_rate -5 invalid"),
        (r#","mac":"zz:00:00:00:00:00""#, "mac: invalid MAC"),
        (r#","mtu":20"#, "mtu 20 invalid"),
        (
            r#","max-tx-rate":100"#,
            "unknown key \"max-tx-rate\" (did you mean \"max_tx_rate\"?)",
        ),
        (r#","vlanqos_x":1"#, "unknown key \"vlanqos_x\""),
        (r#","ipam":"host-local""#, "ipam must be an object"),
        (
            r#","runtimeConfig":{"ips":[1]}"#,
            "runtimeConfig.ips must be a list of strings",
        ),
        (r#","deviceid":"0000:03:02.4""#, "given twice"),
    ];
    for (extra, want) in table {
        let got = parse_err(extra);
        assert!(got.contains(want), "{extra}: got {got:?}, want {want:?}");
    }
}

#[test]
fn device_id_is_required_and_validated() {
    let no_dev = br#"{"cniVersion":"1.0.0","name":"n","type":"sriov"}"#;
    let e = parse(no_dev, "", Purpose::Attach).unwrap_err().to_string();
    assert!(e.contains("deviceID"), "{e}");
    assert_eq!(parse(no_dev, "", Purpose::Other).unwrap().device_id, None);
    for bad in [
        "03:02.3",
        "0000:03:02",
        "0000:03:02.8",
        "0000:3:02.1",
        "../x",
    ] {
        let c = format!(r#"{{"cniVersion":"1.0.0","type":"sriov","deviceID":"{bad}"}}"#);
        assert!(parse(c.as_bytes(), "", Purpose::Attach).is_err(), "{bad}");
    }
}

#[test]
fn real_world_sriov_cni_nads_are_accepted() {
    // An old NAD with the historical `master` key, mtu 0, a Multus-style log level, and a
    // five-digit PCI domain.
    let c = br#"{"cniVersion":"0.3.1","name":"n","type":"sriov","master":"ens785f0","mtu":0,"logLevel":"verbose","deviceID":"10000:03:02.3"}"#;
    let conf = parse(c, "", Purpose::Attach).unwrap();
    assert_eq!(conf.mtu, None);
    assert_eq!(conf.device_id.as_deref(), Some("10000:03:02.3"));
    let unknown_level = br#"{"cniVersion":"1.0.0","name":"n","type":"sriov","deviceID":"0000:03:02.3","logLevel":"loud"}"#;
    assert_eq!(
        parse(unknown_level, "", Purpose::Attach)
            .unwrap()
            .log_level
            .as_deref(),
        Some("info")
    );
}

#[test]
fn runtime_config_device_id_is_a_fallback_only() {
    let rc = br#"{"cniVersion":"1.0.0","name":"n","type":"sriov","capabilities":{"deviceID":true},"runtimeConfig":{"deviceID":"0000:04:00.5"}}"#;
    assert_eq!(
        parse(rc, "", Purpose::Attach).unwrap().device_id.as_deref(),
        Some("0000:04:00.5")
    );
    let both = br#"{"cniVersion":"1.0.0","name":"n","type":"sriov","deviceID":"0000:03:02.3","runtimeConfig":{"deviceID":"0000:04:00.5"}}"#;
    assert_eq!(
        parse(both, "", Purpose::Attach)
            .unwrap()
            .device_id
            .as_deref(),
        Some("0000:03:02.3")
    );
    let bad = br#"{"cniVersion":"1.0.0","name":"n","type":"sriov","runtimeConfig":{"deviceID":"../../x"}}"#;
    assert!(parse(bad, "", Purpose::Attach).is_err());
}

#[test]
fn valid_values_parse() {
    let c = parse_ok(
        r#","vlan":100,"vlanQoS":3,"vlanProto":"802.1AD","spoofchk":"off","trust":"on",
           "link_state":"disable","min_tx_rate":10,"max_tx_rate":1000,"mtu":9000,
           "ipam":{"type":"static"},"pciBusID":"0000:03:02.3","cni.dev/x":1"#,
    );
    assert_eq!(
        c.vlan,
        Some(VlanSpec {
            id: 100,
            qos: 3,
            proto: VlanProto::Dot1Ad
        })
    );
    assert_eq!((c.spoofchk, c.trust), (Some(false), Some(true)));
    assert_eq!(c.link_state, Some(LinkState::Disable));
    assert_eq!(c.rate, Some(RateSpec { min: 10, max: 1000 }));
    assert_eq!(
        (c.mtu, c.ipam_type.as_deref()),
        (Some(9000), Some("static"))
    );
    // Only max given: min is sent as 0 (sriov-cni); only min with max 0 = unlimited is valid.
    assert_eq!(
        parse_ok(r#","max_tx_rate":5"#).rate,
        Some(RateSpec { min: 0, max: 5 })
    );
    assert_eq!(
        parse_ok(r#","min_tx_rate":5"#).rate,
        Some(RateSpec { min: 5, max: 0 })
    );
    assert_eq!(
        parse_ok(r#","vlan":0"#).vlan,
        Some(VlanSpec {
            id: 0,
            qos: 0,
            proto: VlanProto::Dot1Q
        })
    );
    assert_eq!(parse_ok("").vlan, None);
    // Go's JSON decoding is case-insensitive; keep NADs that relied on it working.
    assert_eq!(parse_ok(r#","VLAN":7"#).vlan.map(|v| v.id), Some(7));
}

#[test]
fn mac_precedence_runtime_config_then_cni_args_then_config() {
    let base = conf(r#","mac":"CA:FE:C0:FF:EE:00","runtimeConfig":{"mac":"02:00:00:00:00:0a"}"#);
    let c = parse(
        base.as_bytes(),
        "IgnoreUnknown=1;MAC=02:00:00:00:00:0b",
        Purpose::Attach,
    )
    .unwrap();
    assert_eq!(c.mac.unwrap().to_string(), "02:00:00:00:00:0a");
    let base = conf(r#","mac":"CA:FE:C0:FF:EE:00""#);
    let c = parse(base.as_bytes(), "MAC=02:00:00:00:00:0b", Purpose::Attach).unwrap();
    assert_eq!(c.mac.unwrap().to_string(), "02:00:00:00:00:0b");
    let c = parse(base.as_bytes(), "", Purpose::Attach).unwrap();
    assert_eq!(c.mac.unwrap().to_string(), "ca:fe:c0:ff:ee:00");
    // Unknown CNI_ARGS keys need IgnoreUnknown (sriov-cni: "failed to parse args").
    assert!(parse(base.as_bytes(), "FOO=1", Purpose::Attach).is_err());
    assert!(parse(base.as_bytes(), "IgnoreUnknown=true;FOO=1", Purpose::Attach).is_ok());
    assert!(parse(
        base.as_bytes(),
        "K8S_POD_NAME=p;K8S_POD_NAMESPACE=d",
        Purpose::Attach
    )
    .is_ok());
    assert!(parse(base.as_bytes(), "MAC=nope", Purpose::Attach).is_err());
}

#[test]
fn sriov_cni_documented_nad_parses_unchanged() {
    // Verbatim from sriov-cni docs/configuration-reference.md.
    let doc =
        br#"{"cniVersion":"0.3.1","name":"sriov-dpdk","type":"sriov","deviceID":"0000:03:02.0",
 "mac":"CA:FE:C0:FF:EE:00","vlan":1000,"vlanQoS":4,"vlanProto":"802.1ad",
 "min_tx_rate":100,"max_tx_rate":200,"spoofchk":"off","trust":"on",
 "link_state":"enable","logLevel":"debug","logFile":"/tmp/sriov.log"}"#;
    let c = parse(doc, "", Purpose::Attach).unwrap();
    assert_eq!(c.device_id.as_deref(), Some("0000:03:02.0"));
    assert_eq!(
        c.vlan,
        Some(VlanSpec {
            id: 1000,
            qos: 4,
            proto: VlanProto::Dot1Ad
        })
    );
    assert_eq!(c.rate, Some(RateSpec { min: 100, max: 200 }));
    assert_eq!(c.mac.unwrap().to_string(), "ca:fe:c0:ff:ee:00");
    assert_eq!(
        c.log_file.as_deref(),
        Some(std::path::Path::new("/tmp/sriov.log"))
    );
    // The README's kernel-driver example with host-local IPAM, as Multus delivers it.
    let readme = br#"{"cniVersion":"0.3.1","name":"sriov-net","type":"sriov","vlan":1000,
      "spoofchk":"off","trust":"on","deviceID":"0000:af:06.0","pciBusID":"0000:af:06.0",
      "ipam":{"type":"host-local","subnet":"10.56.217.0/24","routes":[{"dst":"0.0.0.0/0"}],
      "gateway":"10.56.217.1"}}"#;
    assert_eq!(
        parse(readme, "", Purpose::Attach)
            .unwrap()
            .ipam_type
            .as_deref(),
        Some("host-local")
    );
}

#[test]
fn every_key_sriov_cni_defines_is_accepted() {
    // sriov-cni's own unit-test configs carry `vf`; Go also decodes its untagged fields
    // (`VFID`, `Master`, `MAC`, `MTU`, `OrigVfState`…) case-insensitively from stdin.
    for extra in [
        r#","vf":0"#,
        r#","VFID":3"#,
        r#","vfid":3"#,
        r#","Master":"ens785f0""#,
        r#","OrigVfState":{"HostIFName":"ens785f0v0"}"#,
        r#","ContIFNames":"net1""#,
        r#","DPDKMode":true"#,
        r#","vlan_trunk":"10-20""#,
        r#","dpdk":{},"cniDir":"/var/lib/cni/sriov","l2enable":true,"sharedvf":false,"if0name":"net0""#,
    ] {
        let c = parse_ok(extra);
        // Accepted, never used: the VF is the one deviceID names.
        assert_eq!(c.device_id.as_deref(), Some("0000:03:02.3"), "{extra}");
    }
    // A key sriov-cni does not know is still an error, with a suggestion for near misses.
    assert!(parse_err(r#","vf_id":0"#).contains("unknown key \"vf_id\""));
    assert!(parse_err(r#","max-tx-rate":10"#).contains("did you mean \"max_tx_rate\""));
}

#[test]
fn gc_valid_attachments_are_read() {
    let c = br#"{"cniVersion":"1.1.0","name":"n","type":"sriov",
      "cni.dev/valid-attachments":[{"containerID":"c1","ifname":"net1"}]}"#;
    let c = parse(c, "", Purpose::Other).unwrap();
    assert_eq!(
        c.valid_attachments,
        Some(vec![("c1".into(), "net1".into())])
    );
}

#[test]
fn device_info_file_comes_from_runtime_config_and_must_be_absolute() {
    let c = parse_ok(r#","runtimeConfig":{"CNIDeviceInfoFile":"/run/devinfo/cni/n-c1_net1"}"#);
    assert_eq!(
        c.device_info_file.as_deref(),
        Some(std::path::Path::new("/run/devinfo/cni/n-c1_net1"))
    );
    assert!(parse_ok("").device_info_file.is_none());
    assert!(
        parse_err(r#","runtimeConfig":{"CNIDeviceInfoFile":"rel/path"}"#).contains("absolute path")
    );
}
