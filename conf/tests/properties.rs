//! Property tests of the parsers that read untrusted input: the networks annotation (both
//! forms), network configs and conflists, CNI results and their version conversions, CNI
//! versions, and `CNI_ARGS`. Generated valid inputs round-trip; arbitrary inputs never panic
//! and fail with an error that says why. Case counts are kept small (the whole file runs in a
//! few seconds); `scripts/fuzz.sh` explores the same entry points for longer.

use plexus_conf::args::CniArgs;
use plexus_conf::k8s::selection::{parse_selections, NetworkSelection, NETWORKS_ANNOTATION};
use plexus_conf::netconf::NetConfList;
use plexus_conf::plexus_config::PlexusConfig;
use plexus_conf::result::{CniResult, Dns, Interface, IpConfig, Route};
use plexus_conf::validate;
use plexus_conf::version::{self, CniVersion, SUPPORTED};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

// ---------------------------------------------------------------- generators

/// Arbitrary JSON whose object keys are mostly drawn from `keys` (so the parsers' interesting
/// branches are reached) and sometimes arbitrary.
fn arb_json(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![
            "[a-z0-9./:-]{0,12}",
            ".{0,8}",
            Just("1.0.0".to_string()),
            Just("true".to_string())
        ]
        .prop_map(Value::String),
    ];
    let key = prop_oneof![
        4 => proptest::sample::select(keys).prop_map(str::to_string),
        1 => ".{0,6}",
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn dns_label() -> impl Strategy<Value = String> {
    "[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?"
}

/// A valid interface name for the comma form (no ',', '@', '[', '{', '"').
fn comma_ifname() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_.-]{0,14}"
}

/// Any interface name libcni accepts (JSON form).
fn any_ifname() -> impl Strategy<Value = String> {
    "[^/:]{1,15}".prop_filter("valid interface name", |s| {
        validate::interface_name_problem(s).is_none()
    })
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|n| IpAddr::V4(Ipv4Addr::from(n))),
        any::<u128>().prop_map(|n| IpAddr::V6(Ipv6Addr::from(n))),
    ]
}

fn ip_of(v6: bool) -> BoxedStrategy<IpAddr> {
    if v6 {
        any::<u128>()
            .prop_map(|n| IpAddr::V6(Ipv6Addr::from(n)))
            .boxed()
    } else {
        any::<u32>()
            .prop_map(|n| IpAddr::V4(Ipv4Addr::from(n)))
            .boxed()
    }
}

fn cidr_of(v6: bool) -> impl Strategy<Value = String> {
    (ip_of(v6), 0u8..=if v6 { 128 } else { 32 }).prop_map(|(a, p)| format!("{a}/{p}"))
}

fn ip_or_cidr() -> impl Strategy<Value = String> {
    prop_oneof![
        ip().prop_map(|a| a.to_string()),
        any::<bool>().prop_flat_map(cidr_of)
    ]
}

fn hw_addr(bytes: usize) -> impl Strategy<Value = String> {
    vec(any::<u8>(), bytes).prop_map(|b| {
        b.iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    })
}

/// A selection the comma form can express: name, namespace, interface.
fn comma_selection() -> impl Strategy<Value = NetworkSelection> {
    (
        dns_label(),
        option::of(prop_oneof![dns_label(), Just(String::new())]),
        option::of(prop_oneof![comma_ifname(), Just(String::new())]),
    )
        .prop_map(|(name, namespace, interface)| NetworkSelection {
            name,
            namespace,
            interface,
            ..NetworkSelection::default()
        })
}

fn render_comma(list: &[NetworkSelection]) -> String {
    list.iter()
        .map(|s| {
            let mut out = String::new();
            if let Some(ns) = &s.namespace {
                out.push_str(ns);
                out.push('/');
            }
            out.push_str(&s.name);
            if let Some(i) = &s.interface {
                out.push('@');
                out.push_str(i);
            }
            out
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A selection with every key of the JSON form set to a valid (or absent) value.
fn json_selection() -> impl Strategy<Value = NetworkSelection> {
    let port = (
        any::<u16>(),
        any::<u16>(),
        prop_oneof!["tcp", "udp", "sctp"],
    )
        .prop_map(|(h, c, p)| json!({"hostPort": h, "containerPort": c, "protocol": p}));
    (
        (
            dns_label(),
            option::of(dns_label()),
            option::of(any_ifname()),
            option::of(any_ifname()),
            vec(ip_or_cidr(), 0..3),
            option::of(hw_addr(6)),
        ),
        (
            vec(ip().prop_map(|a| a.to_string()), 0..2),
            vec(port, 0..2),
            option::of(
                (any::<u32>(), any::<u32>())
                    .prop_map(|(i, e)| json!({"ingressRate": i, "egressRate": e})),
            ),
            option::of(btree_map("[a-zA-Z]{1,8}", ".{0,8}", 0..3).prop_map(|m| {
                m.into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect::<Map<_, _>>()
            })),
            option::of(prop_oneof![hw_addr(8), hw_addr(20)]),
            option::of(".{0,16}"),
            option::of(".{0,16}"),
        ),
    )
        .prop_map(
            |(
                (name, namespace, interface, interface_request, ips, mac),
                (default_route, port_mappings, bandwidth, cni_args, guid, device, claim),
            )| NetworkSelection {
                name,
                namespace,
                interface,
                interface_request,
                ips,
                mac,
                default_route,
                port_mappings,
                bandwidth,
                cni_args,
                infiniband_guid: guid,
                device_id: device,
                ipam_claim_reference: claim,
            },
        )
}

fn interface() -> impl Strategy<Value = Interface> {
    (
        "[a-z][a-z0-9]{0,8}",
        prop_oneof![Just(String::new()), hw_addr(6)],
        option::of(any::<u32>()),
        prop_oneof![Just(String::new()), Just("/run/netns/pod".to_string())],
        prop_oneof![Just(String::new()), Just("/run/vhost.sock".to_string())],
        prop_oneof![Just(String::new()), Just("0000:04:00.5".to_string())],
    )
        .prop_map(|(name, mac, mtu, sandbox, socket_path, pci_id)| Interface {
            name,
            mac,
            mtu,
            sandbox,
            socket_path,
            pci_id,
        })
}

fn ip_config() -> impl Strategy<Value = IpConfig> {
    any::<bool>().prop_flat_map(|v6| {
        (
            option::of(0i64..4),
            cidr_of(v6),
            option::of(ip_of(v6).prop_map(|a| a.to_string())),
        )
            .prop_map(|(interface, address, gateway)| IpConfig {
                interface,
                address,
                gateway,
            })
    })
}

fn route() -> impl Strategy<Value = Route> {
    any::<bool>().prop_flat_map(|v6| {
        (
            cidr_of(v6),
            option::of(ip_of(v6).prop_map(|a| a.to_string())),
            option::of(any::<u32>()),
            option::of(any::<u32>()),
            option::of(any::<u32>()),
            option::of(any::<u32>()),
            option::of(prop_oneof![Just(0u32), Just(253), Just(254)]),
        )
            .prop_map(|(dst, gw, mtu, advmss, priority, table, scope)| Route {
                dst,
                gw,
                mtu,
                advmss,
                priority,
                table,
                scope,
            })
    })
}

fn dns() -> impl Strategy<Value = Dns> {
    (
        vec(ip().prop_map(|a| a.to_string()), 0..2),
        "([a-z]{1,8}(\\.[a-z]{1,8})?)?",
        vec("[a-z]{1,8}\\.[a-z]{2,3}", 0..2),
        vec("(ndots:[0-9]|rotate)", 0..2),
    )
        .prop_map(|(nameservers, domain, search, options)| Dns {
            nameservers,
            domain,
            search,
            options,
        })
}

fn result() -> impl Strategy<Value = CniResult> {
    (
        vec(interface(), 0..3),
        vec(ip_config(), 0..4),
        vec(route(), 0..3),
        dns(),
    )
        .prop_map(|(interfaces, ips, routes, dns)| CniResult {
            cni_version: version::CURRENT.to_string(),
            interfaces,
            ips,
            routes,
            dns,
        })
}

const CONF_KEYS: &[&str] = &[
    "cniVersion",
    "cniVersions",
    "name",
    "type",
    "plugins",
    "ipam",
    "capabilities",
    "disableCheck",
    "disableGC",
    "loadOnlyInlinedPlugins",
    "runtimeConfig",
    "prevResult",
];

const PLEXUS_KEYS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "kubeconfig",
    "clusterNetwork",
    "defaultNetworks",
    "delegates",
    "plugins",
    "confDir",
    "cniDir",
    "binDir",
    "readinessindicatorfile",
    "namespaceIsolation",
    "globalNamespaces",
    "systemNamespaces",
    "multusNamespace",
    "logFile",
    "logLevel",
    "logToStderr",
    "capabilities",
    "retryDeleteOnError",
    "delegateTimeoutSeconds",
    "events",
    "readinessTimeoutSeconds",
    "podTimeoutMs",
    "auxiliaryCNIChainName",
];

const RESULT_KEYS: &[&str] = &[
    "cniVersion",
    "interfaces",
    "ips",
    "routes",
    "dns",
    "ip4",
    "ip6",
    "ip",
    "gateway",
    "version",
    "interface",
    "address",
    "name",
    "mac",
    "sandbox",
    "dst",
    "gw",
    "mtu",
    "nameservers",
];

const SELECTION_KEYS: &[&str] = &[
    "name",
    "namespace",
    "interface",
    "interfaceRequest",
    "ips",
    "mac",
    "default-route",
    "portMappings",
    "bandwidth",
    "cni-args",
    "infiniband-guid",
    "deviceID",
    "ipam-claim-reference",
];

/// A valid plugin object: a bare `type`, maybe an IPAM type, capabilities and vendor keys.
fn plugin() -> impl Strategy<Value = Map<String, Value>> {
    (
        "[a-z][a-z0-9-]{0,10}",
        option::of("[a-z][a-z0-9-]{0,10}"),
        btree_map(
            prop_oneof!["portMappings", "bandwidth", "mac", "ips"],
            any::<bool>(),
            0..3,
        ),
        btree_map("x-[a-z]{1,6}", arb_json(&["k", "x"]), 0..3),
    )
        .prop_map(|(ty, ipam, caps, extra)| {
            let mut m = Map::new();
            m.insert("type".into(), json!(ty));
            if let Some(i) = ipam {
                m.insert("ipam".into(), json!({"type": i}));
            }
            if !caps.is_empty() {
                m.insert("capabilities".into(), json!(caps));
            }
            m.extend(extra);
            m
        })
}

/// A valid single-plugin config or conflist.
fn valid_conf() -> impl Strategy<Value = Value> {
    (
        "[a-zA-Z0-9][a-zA-Z0-9_.-]{0,15}",
        proptest::sample::select(SUPPORTED),
        vec(plugin(), 1..4),
        any::<bool>(),
        option::of(any::<bool>()),
        btree_map("x-[a-z]{1,6}", arb_json(&["k", "x"]), 0..2),
    )
        .prop_map(|(name, ver, plugins, single, disable_check, extra)| {
            let mut top = Map::new();
            top.insert("cniVersion".into(), json!(ver));
            top.insert("name".into(), json!(name));
            if let Some(d) = disable_check {
                top.insert("disableCheck".into(), json!(d));
            }
            top.extend(extra);
            if single {
                top.extend(plugins[0].clone());
            } else {
                top.insert(
                    "plugins".into(),
                    Value::Array(plugins.into_iter().map(Value::Object).collect()),
                );
            }
            Value::Object(top)
        })
}

fn assert_named_annotation_error(r: &Result<Vec<NetworkSelection>, plexus_conf::CniError>) {
    if let Err(e) = r {
        assert_eq!(e.code, 7, "{e}");
        assert!(e.msg.contains(NETWORKS_ANNOTATION), "{e}");
        assert!(!e.details.is_empty(), "{e}");
    }
}

// ---------------------------------------------------------------- properties

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn comma_form_round_trips(list in vec(comma_selection(), 0..8)) {
        let text = render_comma(&list);
        let parsed = parse_selections(&text, NETWORKS_ANNOTATION).unwrap();
        prop_assert_eq!(parsed, list);
    }

    #[test]
    fn json_form_round_trips(list in vec(json_selection(), 0..6)) {
        let text = serde_json::to_string(&list).unwrap();
        let parsed = parse_selections(&text, NETWORKS_ANNOTATION).unwrap();
        prop_assert_eq!(parsed, list);
    }

    #[test]
    fn comma_selections_read_the_same_in_json(list in vec(comma_selection(), 1..6)) {
        let from_comma = parse_selections(&render_comma(&list), NETWORKS_ANNOTATION).unwrap();
        let from_json =
            parse_selections(&serde_json::to_string(&list).unwrap(), NETWORKS_ANNOTATION).unwrap();
        prop_assert_eq!(from_comma, from_json);
    }

    #[test]
    fn arbitrary_annotations_never_panic(s in ".{0,64}") {
        assert_named_annotation_error(&parse_selections(&s, NETWORKS_ANNOTATION));
    }

    #[test]
    fn comma_like_annotations_never_panic(s in "[a-z0-9/@, .-]{0,48}") {
        let r = parse_selections(&s, NETWORKS_ANNOTATION);
        assert_named_annotation_error(&r);
        for sel in r.iter().flatten() {
            prop_assert!(!sel.name.is_empty());
        }
    }

    #[test]
    fn json_like_annotations_never_panic(v in arb_json(SELECTION_KEYS)) {
        assert_named_annotation_error(&parse_selections(&v.to_string(), NETWORKS_ANNOTATION));
        let list = Value::Array(vec![v]);
        assert_named_annotation_error(&parse_selections(&list.to_string(), NETWORKS_ANNOTATION));
    }

    #[test]
    fn arbitrary_configs_never_panic(v in arb_json(CONF_KEYS)) {
        match NetConfList::from_value(v.clone()) {
            Ok(l) => {
                prop_assert!(!l.plugins.is_empty());
                let _ = l.capabilities();
                let back = l.to_value();
                prop_assert_eq!(NetConfList::from_value(back).unwrap(), l.clone());
                for i in 0..l.plugins.len() {
                    let _ = l.plugin_request(i, "1.0.0", &Map::new(), Some(&v));
                }
            }
            Err(e) => {
                prop_assert!(e.code == 6 || e.code == 7, "{}", e);
                prop_assert!(!e.msg.is_empty());
            }
        }
    }

    #[test]
    fn arbitrary_plexus_configs_never_panic(v in arb_json(PLEXUS_KEYS)) {
        match PlexusConfig::parse(v.to_string().as_bytes()) {
            Ok(c) => {
                let _ = c.global_namespace_list();
                if let Err(e) = c.delegate_lists() {
                    prop_assert!(e.msg.contains("delegates["), "{}", e);
                }
            }
            Err(e) => prop_assert!(matches!(e.code, 2 | 6 | 7), "{}", e),
        }
    }

    #[test]
    fn arbitrary_config_bytes_never_panic(b in vec(any::<u8>(), 0..64)) {
        if let Err(e) = NetConfList::parse(&b) {
            prop_assert!(e.code == 6 || e.code == 7, "{}", e);
        }
    }

    #[test]
    fn valid_configs_round_trip(v in valid_conf()) {
        let l = NetConfList::parse(v.to_string().as_bytes()).unwrap();
        prop_assert!(!l.name_derived);
        prop_assert_eq!(&l.name, v["name"].as_str().unwrap());
        prop_assert_eq!(l.single, v.get("plugins").is_none());
        prop_assert_eq!(l.to_value(), v.clone());
        let plugins = v.get("plugins").and_then(Value::as_array).map_or(1, Vec::len);
        prop_assert_eq!(l.plugins.len(), plugins);
        for (i, p) in l.plugins.iter().enumerate() {
            let req = l.plugin_request(i, "1.0.0", &Map::new(), None);
            prop_assert_eq!(&req["name"], &v["name"]);
            prop_assert_eq!(req["type"].as_str().unwrap(), p.plugin_type());
        }
    }

    #[test]
    fn v1_results_are_lossless(r in result()) {
        for v in ["1.0.0", "1.1.0"] {
            let out = r.to_value(v).unwrap();
            let back = CniResult::parse(&out).unwrap();
            prop_assert_eq!(back, CniResult { cni_version: v.to_string(), ..r.clone() });
        }
    }

    #[test]
    fn up_then_down_round_trips_for_every_version_pair(r in result()) {
        for (i, lo) in SUPPORTED.iter().enumerate() {
            let down = match r.to_value(lo) {
                Ok(v) => v,
                Err(e) => {
                    // Only 0.1.0/0.2.0 can refuse: a result without any IP.
                    prop_assert_eq!(e.code, 1);
                    prop_assert!(CniVersion::parse(lo).unwrap() < CniVersion::V030 && r.ips.is_empty());
                    continue;
                }
            };
            for hi in &SUPPORTED[i..] {
                let up = CniResult::parse(&down).unwrap().to_value(hi).unwrap();
                prop_assert_eq!(&up["cniVersion"], hi);
                let again = CniResult::parse(&up).unwrap().to_value(lo).unwrap();
                prop_assert_eq!(&again, &down, "{} -> {} -> {}", lo, hi, lo);
            }
        }
    }

    #[test]
    fn arbitrary_results_never_panic(v in arb_json(RESULT_KEYS), fallback in proptest::sample::select(SUPPORTED)) {
        match CniResult::parse_with_version(&v, fallback) {
            Ok(r) => {
                for ver in SUPPORTED {
                    if let Err(e) = r.to_value(ver) {
                        prop_assert_eq!(e.code, 1, "{}", e);
                    }
                }
            }
            Err(e) => prop_assert_eq!(e.code, 6, "{}", e),
        }
    }

    #[test]
    fn versions_parse_back_and_negotiation_never_panics(
        ours in ".{0,6}",
        list in vec(prop_oneof![proptest::sample::select(SUPPORTED).prop_map(str::to_string), "[0-9.]{0,6}"], 0..4),
        plugins in vec(vec(proptest::sample::select(SUPPORTED).prop_map(str::to_string), 0..5), 0..3),
    ) {
        for s in SUPPORTED {
            prop_assert_eq!(CniVersion::parse(s).unwrap().as_str(), *s);
        }
        match version::negotiate(&ours, &list, &plugins) {
            Ok(v) => {
                prop_assert!(list.iter().any(|c| c == v.as_str()) || ours == v.as_str() || (v == CniVersion::V010 && list.iter().any(String::is_empty)));
                prop_assert!(plugins.iter().all(|p| p.iter().any(|s| s == v.as_str())));
            }
            Err(e) => prop_assert_eq!(e.code, 1),
        }
        prop_assert_eq!(version::compare(&ours, &list.join(".")), version::compare(&list.join("."), &ours).reverse());
    }

    #[test]
    fn cni_args_render_parse_round_trip(
        pairs in vec(("[A-Za-z_][A-Za-z0-9_]{0,15}", "[^;]{0,20}"), 0..8),
    ) {
        let text = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";");
        let a = CniArgs::parse(&text).unwrap();
        let got: Vec<(String, String)> = a.pairs().to_vec();
        prop_assert_eq!(&got, &pairs);
        prop_assert_eq!(a.render(), text);
        // set() keeps one entry per key and renders to what parses back the same.
        let mut b = CniArgs::default();
        for (k, v) in &pairs {
            b.set(k, v);
        }
        prop_assert_eq!(CniArgs::parse(&b.render()).unwrap(), b.clone());
        for (k, _) in &pairs {
            prop_assert_eq!(b.get(k), a.get(k), "last one wins either way for {}", k);
        }
    }

    #[test]
    fn arbitrary_cni_args_never_panic(s in ".{0,64}") {
        match CniArgs::parse(&s) {
            Ok(a) => prop_assert_eq!(CniArgs::parse(&a.render()).unwrap(), a),
            Err(e) => {
                prop_assert_eq!(e.code, 4);
                prop_assert!(e.details.contains("pair"), "{}", e);
            }
        }
    }
}
