//! Property tests of the sriov NetConf parser: objects built from its known keys (in any case,
//! as sriov-cni's Go decoder matches them) with arbitrary values never panic and fail with a
//! config or CNI_ARGS error; valid generated configs parse to the values given. Case counts are
//! small; `scripts/fuzz.sh` explores the same entry point for longer.

use plexus_conf::error::{code, CniError};
use plexus_sriov::netconf::{self, Purpose};
use plexus_sriov::pf::{LinkState, MacAddr, VlanProto};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Every top-level key the parser knows (standard CNI, sriov-cni, accepted-and-ignored).
const KEYS: &[&str] = &[
    "cniVersion",
    "cniVersions",
    "name",
    "type",
    "capabilities",
    "runtimeConfig",
    "args",
    "ipam",
    "dns",
    "prevResult",
    "pciBusID",
    "deviceID",
    "vlan",
    "vlanQoS",
    "vlanProto",
    "mac",
    "spoofchk",
    "trust",
    "link_state",
    "min_tx_rate",
    "max_tx_rate",
    "logLevel",
    "logFile",
    "mtu",
    "master",
    "VFID",
    "vf",
    "OrigVfState",
    "dpdk",
    "cni.dev/valid-attachments",
    "containerID",
    "ifname",
    "type",
    "CNIDeviceInfoFile",
];

/// `cases` per property, or `PROPTEST_CASES` when set (for a longer local run).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A known key, sometimes with its case flipped (still the same key for the parser).
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(KEYS).prop_map(str::to_string),
        1 => (proptest::sample::select(KEYS), any::<u64>()).prop_map(|(k, bits)| flip_case(k, bits)),
        1 => ".{0,8}",
    ]
}

fn flip_case(k: &str, bits: u64) -> String {
    k.chars()
        .enumerate()
        .map(|(i, c)| {
            if bits >> (i % 64) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-10i64..5000).prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![
            Just("on".to_string()),
            Just("off".to_string()),
            Just("auto".to_string()),
            Just("802.1ad".to_string()),
            Just("0000:03:02.3".to_string()),
            Just("02:00:00:00:00:01".to_string()),
            Just("/var/log/x".to_string()),
            ".{0,12}",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map(key(), inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(MacAddr)
}

fn pci() -> impl Strategy<Value = String> {
    "[0-9a-f]{4,5}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]"
}

fn assert_sriov_error(e: plexus_sriov::SriovError) -> Result<(), TestCaseError> {
    let e = CniError::from(e);
    prop_assert!(
        e.code == code::INVALID_CONFIG || e.code == code::INVALID_ENV,
        "{}",
        e
    );
    prop_assert!(!e.to_string().is_empty());
    Ok(())
}

/// What a generated valid config asks for.
#[derive(Debug, Clone)]
struct Want {
    pci: String,
    vlan: Option<(u16, Option<u8>, Option<VlanProto>)>,
    mac: Option<MacAddr>,
    rc_mac: Option<MacAddr>,
    args_mac: Option<MacAddr>,
    spoofchk: Option<bool>,
    trust: Option<bool>,
    link_state: Option<LinkState>,
    rate: Option<(Option<u32>, Option<u32>)>,
    mtu: Option<u32>,
    ipam: Option<String>,
    log_level: Option<String>,
    case_bits: u64,
}

fn want() -> impl Strategy<Value = Want> {
    let vlan = (
        0u16..=4094,
        option::of(0u8..=7),
        option::of(prop_oneof![Just(VlanProto::Dot1Q), Just(VlanProto::Dot1Ad)]),
    )
        .prop_map(|(id, qos, proto)| {
            if id == 0 {
                (0, qos.map(|_| 0), proto.map(|_| VlanProto::Dot1Q))
            } else {
                (id, qos, proto)
            }
        });
    let rate = (option::of(any::<u32>()), option::of(any::<u32>())).prop_map(|(min, max)| {
        match (min, max) {
            (Some(a), Some(b)) if b != 0 && a > b => (Some(b), Some(a)),
            other => other,
        }
    });
    (
        (
            pci(),
            option::of(vlan),
            option::of(mac()),
            option::of(mac()),
            option::of(mac()),
            option::of(any::<bool>()),
            option::of(any::<bool>()),
        ),
        (
            option::of(prop_oneof![
                Just(LinkState::Auto),
                Just(LinkState::Enable),
                Just(LinkState::Disable)
            ]),
            option::of(rate),
            option::of(68u32..=65535),
            option::of("[a-z][a-z-]{0,10}"),
            option::of(
                prop_oneof!["info", "debug", "warning", "error", "panic"].prop_map(String::from),
            ),
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                (pci, vlan, mac, rc_mac, args_mac, spoofchk, trust),
                (link_state, rate, mtu, ipam, log_level, case_bits),
            )| Want {
                pci,
                vlan,
                mac,
                rc_mac,
                args_mac,
                spoofchk,
                trust,
                link_state,
                rate,
                mtu,
                ipam,
                log_level,
                case_bits,
            },
        )
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// The config JSON and CNI_ARGS for `w`; the sriov keys' case follows `w.case_bits`.
fn render(w: &Want) -> (Value, String) {
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        let k = if w.case_bits & 1 == 1 && k != "runtimeConfig" {
            flip_case(k, w.case_bits >> 1)
        } else {
            k.to_string()
        };
        m.insert(k, v);
    };
    put("cniVersion", json!("1.0.0"));
    put("name", json!("sriov-net"));
    put("type", json!("sriov"));
    put("deviceID", json!(w.pci));
    if let Some((id, qos, proto)) = w.vlan {
        put("vlan", json!(id));
        if let Some(q) = qos {
            put("vlanQoS", json!(q));
        }
        if let Some(p) = proto {
            put(
                "vlanProto",
                json!(match p {
                    VlanProto::Dot1Q => "802.1Q",
                    VlanProto::Dot1Ad => "802.1ad",
                }),
            );
        }
    }
    if let Some(mac) = w.mac {
        put("mac", json!(mac.to_string()));
    }
    if let Some(b) = w.spoofchk {
        put("spoofchk", json!(on_off(b)));
    }
    if let Some(b) = w.trust {
        put("trust", json!(on_off(b)));
    }
    if let Some(l) = w.link_state {
        put(
            "link_state",
            json!(match l {
                LinkState::Auto => "auto",
                LinkState::Enable => "enable",
                LinkState::Disable => "disable",
            }),
        );
    }
    if let Some((min, max)) = w.rate {
        if let Some(v) = min {
            put("min_tx_rate", json!(v));
        }
        if let Some(v) = max {
            put("max_tx_rate", json!(v));
        }
    }
    if let Some(v) = w.mtu {
        put("mtu", json!(v));
    }
    if let Some(t) = &w.ipam {
        put("ipam", json!({"type": t}));
    }
    if let Some(l) = &w.log_level {
        put("logLevel", json!(l));
    }
    if let Some(mac) = w.rc_mac {
        put("runtimeConfig", json!({"mac": mac.to_string()}));
    }
    let args = match w.args_mac {
        Some(mac) => format!("IgnoreUnknown=1;K8S_POD_NAME=p;MAC={mac}"),
        None => "K8S_POD_NAMESPACE=ns".to_string(),
    };
    (Value::Object(m), args)
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn objects_of_known_keys_never_panic(
        obj in btree_map(key(), value(), 0..10),
        args in prop_oneof![Just(String::new()), "[A-Za-z_=;:0-9]{0,24}", Just("MAC=02:00:00:00:00:01".to_string())],
        attach in any::<bool>(),
    ) {
        let stdin = Value::Object(obj.into_iter().collect()).to_string();
        let purpose = if attach { Purpose::Attach } else { Purpose::Other };
        match netconf::parse(stdin.as_bytes(), &args, purpose) {
            Ok(c) => {
                prop_assert!(c.device_id.is_some() || !attach);
                if let Some(v) = c.vlan {
                    prop_assert!(v.id <= 4094 && v.qos <= 7);
                }
                if let Some(r) = c.rate {
                    prop_assert!(r.max == 0 || r.min <= r.max);
                }
                if let Some(m) = c.mtu {
                    prop_assert!((68..=65535).contains(&m));
                }
            }
            Err(e) => assert_sriov_error(e)?,
        }
    }

    #[test]
    fn arbitrary_bytes_and_cni_args_never_panic(b in vec(any::<u8>(), 0..48), args in ".{0,32}") {
        if let Err(e) = netconf::parse(&b, &args, Purpose::Other) {
            assert_sriov_error(e)?;
        }
        if let Err(e) = netconf::mac_from_cni_args(&args) {
            assert_sriov_error(e)?;
        }
        let _ = netconf::validate_pci_address(&args);
    }

    #[test]
    fn valid_configs_parse_to_the_values_given(w in want()) {
        let (v, args) = render(&w);
        let c = netconf::parse(v.to_string().as_bytes(), &args, Purpose::Attach)
            .map_err(|e| TestCaseError::fail(format!("{v} / {args}: {e}")))?;
        prop_assert_eq!(c.cni_version.as_str(), "1.0.0");
        prop_assert_eq!(c.name.as_str(), "sriov-net");
        prop_assert_eq!(c.device_id.as_deref(), Some(w.pci.as_str()));
        match (w.vlan, c.vlan) {
            (None, None) => {}
            (Some((id, qos, proto)), Some(got)) => {
                prop_assert_eq!(got.id, id);
                prop_assert_eq!(got.qos, qos.unwrap_or(0));
                prop_assert_eq!(got.proto, proto.unwrap_or_default());
            }
            (want, got) => prop_assert!(false, "vlan {:?} parsed as {:?}", want, got),
        }
        // runtimeConfig.mac > CNI_ARGS MAC > mac.
        prop_assert_eq!(c.mac, w.rc_mac.or(w.args_mac).or(w.mac));
        prop_assert_eq!(c.spoofchk, w.spoofchk);
        prop_assert_eq!(c.trust, w.trust);
        prop_assert_eq!(c.link_state, w.link_state);
        match (w.rate, c.rate) {
            (None, None) => {}
            (Some((None, None)), None) => {}
            (Some((min, max)), Some(got)) => {
                prop_assert_eq!((got.min, got.max), (min.unwrap_or(0), max.unwrap_or(0)));
            }
            (want, got) => prop_assert!(false, "rate {:?} parsed as {:?}", want, got),
        }
        prop_assert_eq!(c.mtu, w.mtu);
        prop_assert_eq!(c.ipam_type, w.ipam.clone());
        prop_assert_eq!(c.log_level, w.log_level.clone());
    }
}
