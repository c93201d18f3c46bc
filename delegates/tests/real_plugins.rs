//! The chain runner against Debian's real plugins in real network namespaces.

use plexus_conf::args::CniArgs;
use plexus_conf::netconf::NetConfList;
use plexus_delegates::cache::ResultCache;
use plexus_delegates::{Attachment, Runtime};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const CNI_BIN: &str = "/usr/lib/cni";

fn uniq(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}x{}",
        std::process::id() % 100000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named netns removed on drop.
struct Ns(String);
impl Ns {
    fn new() -> Ns {
        let name = uniq("pxd");
        assert!(Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success());
        Ns(name)
    }
    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
    fn exec(&self, args: &[&str]) -> String {
        let mut a = vec!["netns", "exec", &self.0, "ip"];
        a.extend_from_slice(args);
        ip(&a)
    }
}
impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A host link removed on drop.
struct Link(String);
impl Drop for Link {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).status();
    }
}

fn runtime(cache: &Path) -> Runtime {
    Runtime {
        search_path: vec![PathBuf::from(CNI_BIN)],
        timeout: Duration::from_secs(20),
        cache: Some(ResultCache::new(cache)),
    }
}

fn att(ns: &Ns, cid: &str, ifname: &str) -> Attachment {
    Attachment {
        container_id: cid.into(),
        netns: ns.path(),
        ifname: ifname.into(),
        args: CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=p").unwrap(),
        capability_args: Default::default(),
    }
}

fn leases(dir: &Path, net: &str) -> Vec<String> {
    std::fs::read_dir(dir.join(net))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains('.') || n.contains(':'))
                .filter(|n| !n.starts_with("last_reserved"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn bridge_chain_with_tuning_and_portmap_add_check_del() {
    let ns = Ns::new();
    let tmp = tempfile::tempdir().unwrap();
    let ipam_dir = tmp.path().join("ipam");
    let br = uniq("pxb");
    let _br = Link(br.clone());
    let conf = json!({"cniVersion":"1.0.0","name":"brchain","plugins":[
        {"type":"bridge","bridge":br,"isGateway":true,"ipMasq":false,
         "ipam":{"type":"host-local","dataDir":ipam_dir,"ranges":[[{"subnet":"10.123.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
        {"type":"tuning","capabilities":{"mac":true},"mtu":1400},
        {"type":"portmap","capabilities":{"portMappings":true},"snat":false}]});
    let list = NetConfList::from_value(conf).unwrap();
    let rt = runtime(tmp.path());
    let mut a = att(&ns, "cid-chain", "eth0");
    a.capability_args = json!({"mac":"02:11:22:33:44:55","portMappings":[{"hostPort":18181,"containerPort":80,"protocol":"tcp"}]})
        .as_object().unwrap().clone();
    let r = rt.add(&list, &a).unwrap();
    assert_eq!(r.ips[0].address, "10.123.0.2/24");
    let link = ns.exec(&["-j", "link", "show", "eth0"]);
    let link: Value = serde_json::from_str(&link).unwrap();
    assert_eq!(
        link[0]["address"], "02:11:22:33:44:55",
        "tuning got the mac capability"
    );
    assert_eq!(link[0]["mtu"], 1400);
    let routes = ns.exec(&["-j", "route"]);
    assert!(
        routes.contains("\"dst\":\"default\"") && routes.contains("10.123.0.1"),
        "{routes}"
    );
    assert_eq!(leases(&ipam_dir, "brchain"), vec!["10.123.0.2"]);
    let cache = ResultCache::new(tmp.path());
    assert!(cache.load("brchain", "cid-chain", "eth0").is_some());
    rt.del(&list, &a).unwrap();
    assert!(ns.exec(&["link", "show", "eth0"]).is_empty());
    assert!(leases(&ipam_dir, "brchain").is_empty(), "lease released");
    assert!(
        cache.load("brchain", "cid-chain", "eth0").is_none(),
        "cache removed"
    );
    // Idempotent, and fine with the netns gone.
    rt.del(&list, &a).unwrap();
    let mut gone = a.clone();
    gone.netns = String::new();
    rt.del(&list, &gone).unwrap();
}

#[test]
fn check_after_add_and_version_gates() {
    let ns = Ns::new();
    let tmp = tempfile::tempdir().unwrap();
    let (m0, m1) = (uniq("pxm"), uniq("pxn"));
    let _l = Link(m0.clone());
    assert!(Command::new("ip")
        .args(["link", "add", &m0, "type", "veth", "peer", "name", &m1])
        .status()
        .unwrap()
        .success());
    ip(&["link", "set", &m0, "up"]);
    let conf = json!({"cniVersion":"0.4.0","name":"mvstatic","type":"macvlan","master":m0,"mode":"bridge",
        "ipam":{"type":"static","addresses":[{"address":"10.124.0.10/24","gateway":"10.124.0.1"}],"routes":[{"dst":"10.99.0.0/16","gw":"10.124.0.1"}]}});
    let list = NetConfList::from_value(conf).unwrap();
    let rt = runtime(tmp.path());
    let a = att(&ns, "cid-mv", "net1");
    let r = rt.add(&list, &a).unwrap();
    assert_eq!(r.cni_version, "0.4.0");
    assert_eq!(r.ips[0].address, "10.124.0.10/24");
    let addrs = ns.exec(&["-j", "addr", "show", "net1"]);
    assert!(addrs.contains("10.124.0.10"), "{addrs}");
    assert!(ns.exec(&["route"]).contains("10.99.0.0/16 via 10.124.0.1"));
    rt.check(&list, &a).unwrap();
    // CHECK notices a removed address.
    ns.exec(&["addr", "flush", "dev", "net1"]);
    let e = rt.check(&list, &a).unwrap_err();
    assert!(e.msg.contains("mvstatic") && e.msg.contains("CHECK"), "{e}");
    rt.del(&list, &a).unwrap();
    assert!(ns.exec(&["link", "show", "net1"]).is_empty());
    // CHECK with 0.3.1 is refused with code 1.
    let old = NetConfList::from_value(
        json!({"cniVersion":"0.3.1","name":"old","type":"macvlan","master":m0}),
    )
    .unwrap();
    assert_eq!(rt.check(&old, &a).unwrap_err().code, 1);
}

#[test]
fn negotiation_with_cni_versions_asks_plugins() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime(tmp.path());
    let list = NetConfList::from_value(json!({"cniVersion":"1.1.0","cniVersions":["1.0.0","0.4.0"],"name":"neg","plugins":[{"type":"bridge"},{"type":"bandwidth"}]})).unwrap();
    assert_eq!(rt.negotiate(&list).unwrap().as_str(), "1.0.0");
    let versions = rt.plugin_versions("bridge").unwrap();
    assert!(versions.contains(&"1.0.0".to_string()) && !versions.contains(&"1.1.0".to_string()));
    // A plain 1.1.0 list is taken as written; the Debian plugin then refuses it with code 1.
    let ns = Ns::new();
    let l11 = NetConfList::from_value(json!({"cniVersion":"1.1.0","name":"v11","type":"loopback"}))
        .unwrap();
    let e = rt.add(&l11, &att(&ns, "cid-v11", "lo")).unwrap_err();
    assert_eq!(e.code, 1, "{e}");
    // STATUS on a pre-1.1 network is a no-op success; GC with nothing cached succeeds.
    rt.status(&list).unwrap();
    rt.gc(&list, &[]).unwrap();
}

#[test]
fn gc_deletes_stale_cached_attachments() {
    let ns = Ns::new();
    let tmp = tempfile::tempdir().unwrap();
    let ipam_dir = tmp.path().join("ipam");
    let br = uniq("pxg");
    let _br = Link(br.clone());
    let list = NetConfList::from_value(
        json!({"cniVersion":"1.0.0","name":"gcnet","type":"bridge","bridge":br,
        "ipam":{"type":"host-local","dataDir":ipam_dir,"ranges":[[{"subnet":"10.125.0.0/24"}]]}}),
    )
    .unwrap();
    let rt = runtime(tmp.path());
    rt.add(&list, &att(&ns, "keep", "eth0")).unwrap();
    rt.add(&list, &att(&ns, "stale", "eth1")).unwrap();
    assert_eq!(leases(&ipam_dir, "gcnet").len(), 2);
    rt.gc(&list, &[("keep".into(), "eth0".into())]).unwrap();
    assert_eq!(leases(&ipam_dir, "gcnet").len(), 1);
    assert!(ns.exec(&["link", "show", "eth1"]).is_empty());
    assert!(!ns.exec(&["link", "show", "eth0"]).is_empty());
    rt.del(&list, &att(&ns, "keep", "eth0")).unwrap();
    assert!(leases(&ipam_dir, "gcnet").is_empty());
}

#[test]
fn loopback_and_legacy_020_static() {
    let ns = Ns::new();
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime(tmp.path());
    let lo = NetConfList::from_value(json!({"cniVersion":"1.0.0","name":"lo","type":"loopback"}))
        .unwrap();
    let r = rt.add(&lo, &att(&ns, "cid-lo", "lo")).unwrap();
    assert!(r.ips.iter().any(|i| i.address == "127.0.0.1/8"));
    assert!(ns.exec(&["link", "show", "lo"]).contains("UP"));
    rt.del(&lo, &att(&ns, "cid-lo", "lo")).unwrap();
    // IPAM run directly at 0.2.0 gives a legacy result, parsed into the canonical model.
    let st = NetConfList::from_value(json!({"cniVersion":"0.2.0","name":"st","type":"static",
        "ipam":{"type":"static","addresses":[{"address":"10.1.1.1/24","gateway":"10.1.1.254"}]}}))
    .unwrap();
    let r = rt.add(&st, &att(&ns, "cid-st", "eth9")).unwrap();
    assert_eq!(r.cni_version, "0.2.0");
    assert_eq!(r.ips[0].address, "10.1.1.1/24");
    assert_eq!(
        r.to_value("1.0.0").unwrap()["ips"][0]["gateway"],
        "10.1.1.254"
    );
}

#[test]
fn status_and_gc_at_1_1_0_name_debian_portmap_and_its_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime(tmp.path());
    let list = NetConfList::from_value(json!({"cniVersion":"1.1.0","name":"pm11",
        "plugins":[{"type":"portmap","capabilities":{"portMappings":true}}]}))
    .unwrap();
    // Sent as written, portmap would say "missing containerID".
    let e = rt.status(&list).unwrap_err();
    assert_eq!(e.code, 1, "{e}");
    assert!(
        e.msg.contains("\"pm11\"") && e.msg.contains("portmap") && e.msg.contains("STATUS"),
        "{e}"
    );
    assert!(
        e.details.contains("1.0.0") && !e.to_string().contains("containerID"),
        "{e}"
    );
    let e = rt.gc(&list, &[]).unwrap_err();
    assert!(e.msg.contains("portmap") && e.msg.contains("GC"), "{e}");
    // With cniVersions the network runs at 1.0.0: STATUS and GC are not sent, as in libcni.
    let neg = NetConfList::from_value(
        json!({"cniVersion":"1.1.0","cniVersions":["1.1.0","1.0.0"],"name":"pm",
        "plugins":[{"type":"portmap","capabilities":{"portMappings":true}}]}),
    )
    .unwrap();
    rt.status(&neg).unwrap();
    rt.gc(&neg, &[]).unwrap();
}
