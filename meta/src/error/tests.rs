//! The error table: every variant's code, message and details, as the wire shows them.

use super::*;
use crate::k8s::K8sError;
use plexus_conf::error::CniError;
use plexus_delegates::netns::NetNsError;
use std::collections::BTreeSet;
use std::io::{Error as IoError, ErrorKind};

fn io(kind: ErrorKind) -> IoError {
    IoError::new(kind, "boom")
}

fn json_err() -> serde_json::Error {
    serde_json::from_str::<serde_json::Value>("{").unwrap_err()
}

fn api(code: u16) -> Box<K8sError> {
    Box::new(K8sError::Api {
        what: "get pod",
        ns: "db".into(),
        name: "p".into(),
        code,
        reason: "R".into(),
        message: "m".into(),
    })
}

fn cni(code: u32) -> Box<CniError> {
    Box::new(CniError::new(code, "inner", "why"))
}

fn s(v: &str) -> String {
    v.to_string()
}

/// The variant's name; exhaustive, so a new variant cannot be left out of the table.
fn name(e: &MetaError) -> &'static str {
    use MetaError::*;
    match e {
        Config { .. } => "Config",
        CniArgs { .. } => "CniArgs",
        InterfaceName { .. } => "InterfaceName",
        NotReady { .. } => "NotReady",
        StatusNotReady { .. } => "StatusNotReady",
        StatusPluginMissing { .. } => "StatusPluginMissing",
        StatusFailed { .. } => "StatusFailed",
        KubeClient { .. } => "KubeClient",
        PodRead { .. } => "PodRead",
        NadRead { .. } => "NadRead",
        StatusWrite { .. } => "StatusWrite",
        Annotation { .. } => "Annotation",
        Isolation { .. } => "Isolation",
        NadNotFound { .. } => "NadNotFound",
        NetworkNotFound { .. } => "NetworkNotFound",
        NadInvalid { .. } => "NadInvalid",
        NadEmpty { .. } => "NadEmpty",
        NoDefaultNetwork => "NoDefaultNetwork",
        ConfigFile { .. } => "ConfigFile",
        ConfigDirEmpty { .. } => "ConfigDirEmpty",
        ConfigParse { .. } => "ConfigParse",
        NetworkConfig { .. } => "NetworkConfig",
        NoDeviceLeft { .. } => "NoDeviceLeft",
        CapabilityNotHonoured { .. } => "CapabilityNotHonoured",
        DuplicateInterface { .. } => "DuplicateInterface",
        MetaPluginDelegate { .. } => "MetaPluginDelegate",
        NadPolicy { .. } => "NadPolicy",
        MultipleDefaultRoutes { .. } => "MultipleDefaultRoutes",
        PluginMissing { .. } => "PluginMissing",
        FixedIps { .. } => "FixedIps",
        AddressInUse { .. } => "AddressInUse",
        AddressInPool { .. } => "AddressInPool",
        CheckpointUnreadable { .. } => "CheckpointUnreadable",
        CheckpointInvalid { .. } => "CheckpointInvalid",
        DevicesUnavailable { .. } => "DevicesUnavailable",
        ClaimRead { .. } => "ClaimRead",
        ClaimMissing { .. } => "ClaimMissing",
        ClaimNotAllocated { .. } => "ClaimNotAllocated",
        SliceList { .. } => "SliceList",
        DraDeviceUnpublished { .. } => "DraDeviceUnpublished",
        DraResourceMismatch { .. } => "DraResourceMismatch",
        Manifest { .. } => "Manifest",
        NetnsOpen { .. } => "NetnsOpen",
        NetnsEnter { .. } => "NetnsEnter",
        InterfaceExists { .. } => "InterfaceExists",
        PlanInvalid { .. } => "PlanInvalid",
        Delegate { .. } => "Delegate",
        Route { .. } => "Route",
        ResultCache { .. } => "ResultCache",
        Attachment { .. } => "Attachment",
        Rollback { .. } => "Rollback",
        RollbackFailed { .. } => "RollbackFailed",
        Combined(_) => "Combined",
        Lock { .. } => "Lock",
        PlanEncode { .. } => "PlanEncode",
        PlanSave { .. } => "PlanSave",
        PlanRead { .. } => "PlanRead",
        CorruptPlan { .. } => "CorruptPlan",
        PlanOfAnotherVersion { .. } => "PlanOfAnotherVersion",
        PlanRemove { .. } => "PlanRemove",
        AlreadyAttached { .. } => "AlreadyAttached",
        NotAttached { .. } => "NotAttached",
        PlanNotRemoved { .. } => "PlanNotRemoved",
        ResultsLeft { .. } => "ResultsLeft",
        ReadFile { .. } => "ReadFile",
        JsonFile { .. } => "JsonFile",
        DaemonUnreachable { .. } => "DaemonUnreachable",
        DaemonNoAnswer { .. } => "DaemonNoAnswer",
        Runtime { .. } => "Runtime",
        Internal { .. } => "Internal",
    }
}

const ALL: usize = 70;

/// One example per variant (several where the code depends on the cause) and the code
/// docs/design.md's "Error codes" table gives it. One row per line: a table.
#[rustfmt::skip]
fn table() -> Vec<(MetaError, u32)> {
    use MetaError::*;
    let pod = || s("pod db/p");
    let attachment = |source: MetaError| Attachment { pod: pod(), network: s("db/mv"), ifname: s("net1"), source: Box::new(source) };
    let rollback = |code| Rollback { pod: pod(), network: s("cbr0"), ifname: s("eth0"), source: cni(code) };
    let unreadable = || CheckpointUnreadable { pod: pod(), path: "/cp".into(), source: io(ErrorKind::NotFound) };
    vec![
        // 1, 2, 6, 7 from the config's own validation; 4 for CNI_ARGS and CNI_IFNAME.
        (Config { source: cni(1) }, 1),
        (Config { source: cni(2) }, 2),
        (Config { source: cni(6) }, 6),
        (CniArgs { source: cni(4) }, 4),
        (InterfaceName { pod: pod(), network: s("cbr0"), source: cni(4) }, 4),
        // Readiness: 11 at ADD, 50 at STATUS.
        (NotReady { file: "/r".into() }, 11),
        (StatusNotReady { file: "/r".into() }, 50),
        (StatusPluginMissing { network: s("cbr0"), source: cni(7) }, 50),
        (StatusFailed { network: s("cbr0"), source: cni(51) }, 51),
        // Kubernetes: 11 transient, 102 refused, 7 credentials / kubeconfig.
        (KubeClient { source: Box::new(K8sError::Kubeconfig { path: "/k".into(), reason: s("r") }) }, 7),
        (PodRead { pod: s("db/p"), source: api(503) }, 11),
        (PodRead { pod: s("db/p"), source: api(401) }, 7),
        (NadRead { pod: pod(), ns: s("db"), name: s("mv"), source: api(403) }, 102),
        (StatusWrite { pod: pod(), source: api(422) }, 102),
        (StatusWrite { pod: pod(), source: Box::new(K8sError::PodReplaced { ns: s("db"), name: s("p"), uid: s("u") }) }, 102),
        // 7: annotations, NADs, isolation, plan checks.
        (Annotation { pod: s("db/p"), source: cni(7) }, 7),
        (Isolation { pod: s("db/p"), ns: s("x"), name: s("n"), pod_ns: s("db"), allowed: vec![] }, 7),
        (NadNotFound { pod: pod(), ns: s("db"), name: s("mv") }, 7),
        (NetworkNotFound { pod: pod(), ns: s("kube-system"), name: s("cbr0"), conf_dir: "/c".into() }, 7),
        (NadInvalid { ns: s("db"), name: s("mv"), source: cni(7) }, 7),
        (NadEmpty { ns: s("db"), name: s("mv"), conf_dir: "/c".into() }, 7),
        (NoDefaultNetwork, 7),
        (ConfigFile { path: "/f".into(), source: io(ErrorKind::NotFound) }, 7),
        (ConfigDirEmpty { path: "/d".into() }, 7),
        (ConfigParse { file: s("/f"), source: cni(6) }, 6),
        (NetworkConfig { network: s("db/mv"), source: cni(7) }, 7),
        (NoDeviceLeft { pod: pod(), network: s("db/vf"), resource: s("r"), allocated: 1 }, 7),
        (CapabilityNotHonoured { pod: pod(), network: s("db/mv"), capability: s("mac"), config_name: s("mv") }, 7),
        (DuplicateInterface { pod: pod(), ifname: s("eth0"), first: s("a"), second: s("b") }, 7),
        (MetaPluginDelegate { pod: pod(), network: s("db/l"), plugin_type: s("multus") }, 7),
        (NadPolicy { pod: pod(), network: s("db/mv"), refusal: Box::new(NadRefusal { location: s("ipam.dataDir"), value: s("/etc/x"), why: s("outside"), allowed: s("[]") }) }, 7),
        (MultipleDefaultRoutes { pod: pod() }, 7),
        (PluginMissing { pod: pod(), network: s("db/mv"), source: cni(7) }, 7),
        (FixedIps { pod: pod(), source: cni(7) }, 7),
        (AddressInUse { pod: pod(), network: s("db/mv"), address: s("10.1.1.5"), holder: s("pod db/q") }, 11),
        (AddressInPool { pod: pod(), network: s("db/bank"), overlap: Box::new(super::PoolOverlap { address: s("10.1.1.5"), pool_network: s("db/clients"), ipam: s("whereabouts"), segment: s("link eth1") }) }, 7),
        // Devices: 11 while the kubelet or the scheduler may still provide them.
        (unreadable(), 11),
        (CheckpointInvalid { pod: pod(), source: cni(6) }, 6),
        (DevicesUnavailable { source: Box::new(unreadable()), pod_resources: PodResourcesError::NoSocket("/s".into()) }, 11),
        (ClaimRead { pod: pod(), ns: s("db"), name: s("c"), source: api(403) }, 102),
        (ClaimMissing { pod: pod(), ns: s("db"), name: s("c") }, 11),
        (ClaimNotAllocated { pod: pod(), name: s("c") }, 11),
        (SliceList { pod: pod(), driver: s("d"), node: s("n"), source: api(500) }, 11),
        (DraDeviceUnpublished { pod: pod(), device: s("d/p/v"), claim: s("c"), node: s("n") }, 7),
        (DraResourceMismatch { pod: pod(), device: s("v"), claim: s("c"), got: s("a"), wanted: s("b") }, 7),
        (Manifest { what: "a claim", manifest: s("{}"), source: json_err() }, 6),
        // Attach: 3 netns gone at ADD, 999 plexus' own netns / netlink work, delegates'
        // codes kept through every wrapper.
        (NetnsOpen { pod: pod(), source: NetNsError::NotFound("/n".into()) }, 3),
        (NetnsEnter { source: NetNsError::NotFound("/n".into()) }, 999),
        (InterfaceExists { ifname: s("net1") }, 7),
        (PlanInvalid { pod: pod(), source: Box::new(CniArgs { source: cni(4) }) }, 4),
        (Delegate { source: cni(100) }, 100),
        (Delegate { source: cni(110) }, 110),
        (Route { ifname: s("net1"), what: s("find interface"), source: "not found".into() }, 999),
        (ResultCache { source: cni(5) }, 5),
        (attachment(Delegate { source: cni(101) }), 101),
        (rollback(11), 11),
        (RollbackFailed { source: Box::new(attachment(Delegate { source: cni(42) })), rollback: vec![rollback(100)] }, 42),
        (Combined(vec![attachment(Delegate { source: cni(112) }), attachment(Delegate { source: cni(100) })]), 112),
        // State: 5 I/O, 6 unusable content, 11 lock busy.
        (Lock { container_id: s("c"), path: "/l".into(), source: io(ErrorKind::TimedOut) }, 11),
        (Lock { container_id: s("c"), path: "/l".into(), source: io(ErrorKind::ReadOnlyFilesystem) }, 5),
        (PlanEncode { source: json_err() }, 999),
        (PlanSave { path: "/p".into(), source: io(ErrorKind::StorageFull) }, 5),
        (PlanRead { path: "/p".into(), source: io(ErrorKind::InvalidData) }, 6),
        (PlanRead { path: "/p".into(), source: io(ErrorKind::PermissionDenied) }, 5),
        (CorruptPlan { path: "/p".into(), source: None }, 6),
        (PlanOfAnotherVersion { path: "/p".into(), kind: s("plexusPlanV2"), reads: "plexusPlanV1" }, 6),
        (PlanRemove { path: "/p".into(), source: io(ErrorKind::PermissionDenied) }, 5),
        // Verbs.
        (AlreadyAttached { pod: pod(), container_id: s("c"), ifname: s("eth0") }, 7),
        (NotAttached { container_id: s("c") }, 3),
        (PlanNotRemoved { pod: pod(), source: Box::new(PlanRemove { path: "/p".into(), source: io(ErrorKind::PermissionDenied) }) }, 5),
        (ResultsLeft { pod: pod(), cni_dir: s("/var/lib/cni/plexus"), left: vec![s("mv (net1)")] }, 5),
        (ReadFile { path: s("/f"), source: io(ErrorKind::NotFound) }, 5),
        (JsonFile { path: s("/f"), source: json_err() }, 6),
        (DaemonUnreachable { socket: s("/s"), why: "w", source: io(ErrorKind::ConnectionRefused) }, 11),
        (DaemonNoAnswer { socket: s("/s"), source: io(ErrorKind::UnexpectedEof) }, 11),
        (Runtime { source: io(ErrorKind::Other) }, 999),
        (Internal { what: "no default network result" }, 999),
    ]
}

#[test]
fn every_variant_has_the_code_of_the_design_table() {
    let mut seen = BTreeSet::new();
    for (e, want) in table() {
        assert_eq!(e.code(), want, "{} {e:?}", name(&e));
        seen.insert(name(&e));
        // The wire form carries the same code.
        assert_eq!(CniError::from(e).code, want);
    }
    assert_eq!(seen.len(), ALL, "one example per variant: {seen:?}");
}

#[test]
fn the_wire_form_names_the_pod_and_keeps_the_cause() {
    let e = MetaError::NadRead {
        pod: s("pod db/p"),
        ns: s("db"),
        name: s("mv"),
        source: api(403),
    };
    let c = CniError::from(e);
    assert_eq!(
        (c.code, c.msg.as_str(), c.details.as_str()),
        (
            102,
            "pod db/p, network db/mv: cannot read the NetworkAttachmentDefinition",
            "get pod db/p: HTTP 403 R: m"
        )
    );
    // Display is exactly the CniError's.
    let e = MetaError::Lock {
        container_id: s("c1"),
        path: "/var/lib/cni/plexus/locks/c1.lock".into(),
        source: io(ErrorKind::ReadOnlyFilesystem),
    };
    assert_eq!(e.to_string(), e.to_cni().to_string());
    assert_eq!(
        e.to_string(),
        "container c1: cannot take the plexus lock: /var/lib/cni/plexus/locks/c1.lock: boom"
    );
    // The typed cause stays reachable through `source()`.
    let src = std::error::Error::source(&e).unwrap();
    assert_eq!(
        src.downcast_ref::<IoError>().unwrap().kind(),
        ErrorKind::ReadOnlyFilesystem
    );
}

#[test]
fn wrappers_prefix_the_message_and_keep_the_delegates_code() {
    let failed = MetaError::Attachment {
        pod: s("pod db/p"),
        network: s("db/mv"),
        ifname: s("net1"),
        source: Box::new(MetaError::Delegate {
            source: Box::new(CniError::new(
                42,
                "plugin macvlan ADD: boom",
                "exit status 1",
            )),
        }),
    };
    let rolled = MetaError::RollbackFailed {
        source: Box::new(failed),
        rollback: vec![MetaError::Rollback {
            pod: s("pod db/p"),
            network: s("cbr0"),
            ifname: s("eth0"),
            source: Box::new(CniError::new(
                100,
                "plugin bridge DEL: plugin failed",
                "exit status 2",
            )),
        }],
    };
    let c = rolled.to_cni();
    assert_eq!(c.code, 42);
    assert_eq!(
        c.msg,
        "pod db/p, network db/mv (net1): plugin macvlan ADD: boom"
    );
    assert_eq!(
        c.details,
        "exit status 1; rollback also failed: rollback of pod db/p, network cbr0 (eth0): plugin bridge DEL: plugin failed: exit status 2"
    );
    // Several failures: the first one's code and message, every one in the details.
    let all = MetaError::combine(vec![
        MetaError::Delegate {
            source: Box::new(CniError::new(7, "a", "x")),
        },
        MetaError::Delegate {
            source: Box::new(CniError::new(11, "b", "")),
        },
    ])
    .unwrap();
    let c = all.to_cni();
    assert_eq!(
        (c.code, c.msg.as_str(), c.details.as_str()),
        (7, "a", "a: x / b")
    );
    assert!(MetaError::combine(vec![]).is_none());
    assert!(matches!(
        MetaError::combine(vec![MetaError::NoDefaultNetwork]),
        Some(MetaError::NoDefaultNetwork)
    ));
}

#[test]
fn the_chain_leaves_out_what_an_error_already_says() {
    let e = NetNsError::Io {
        path: "/run/netns/x".into(),
        source: io(ErrorKind::PermissionDenied),
    };
    assert_eq!(chain(&e), "network namespace /run/netns/x: boom");
    let outer = MetaError::PlanNotRemoved {
        pod: s("pod db/p"),
        source: Box::new(MetaError::PlanRemove {
            path: "/p".into(),
            source: io(ErrorKind::PermissionDenied),
        }),
    };
    assert_eq!(outer.details(), "/p: boom");
}
