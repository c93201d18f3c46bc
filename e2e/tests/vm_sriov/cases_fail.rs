//! Real error paths: settings igb refuses (link_state, min_tx_rate, 802.1ad), a rate on a PF
//! without carrier, and the PF losing carrier between ADD and DEL. Each failed ADD must leave
//! the VF exactly as it was (PF side and netdev), with no state file and an empty pod netns.

use serde_json::{json, Value};

use crate::cases::bank_settings;
use crate::common::Netns;
use crate::guest::{Case, T};
use crate::vf::nad;

/// The cases of this module, in run order.
pub const CASES: &[Case] = &[
    ("link_state_refused_rolls_back", link_state_refused),
    ("min_tx_rate_refused_rolls_back", min_rate_refused),
    ("vlan_proto_8021ad_refused_rolls_back", dot1ad_refused),
    (
        "rate_on_pf_without_carrier_rolls_back",
        rate_without_carrier,
    ),
    (
        "pf_loses_carrier_between_add_and_del",
        carrier_lost_after_add,
    ),
    (
        "vf_driver_unbound_while_attached",
        driver_unbound_while_attached,
    ),
];

/// Runs an ADD that must fail at `step` with `cause` in the message, then checks the VF is
/// untouched and the runtime's DEL after the failed ADD succeeds.
fn refused(t: &T<'_>, cid: &str, extra: Value, step: &str, cause: &str) -> String {
    let pci = t.vf(0);
    let before = t.pf.snap(0);
    let pod = Netns::new();
    let mut settings = bank_settings();
    if let (Some(o), Some(e)) = (settings.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            o.insert(k.clone(), v.clone());
        }
    }
    let conf = nad(&pci, settings);
    let r = t.dir.sriov("ADD", cid, &pod.path(), &conf);
    let e = r.err().clone();
    let msg = e["msg"].as_str().unwrap_or_default().to_string()
        + " "
        + e["details"].as_str().unwrap_or_default();
    assert!(msg.contains(&pci), "names the VF: {e}");
    assert!(msg.contains(step), "names the step {step:?}: {e}");
    assert!(
        msg.contains(cause),
        "carries the kernel's error {cause:?}: {e}"
    );
    assert!(!msg.contains("undo"), "rollback complete: {e}");
    assert_eq!(t.pf.snap(0), before, "VF exactly as before the ADD");
    assert_eq!(pod.links(), vec!["lo"]);
    assert!(t.dir.saved().is_empty(), "{:?}", t.dir.saved());
    t.dir.sriov("DEL", cid, &pod.path(), &conf).ok();
    assert_eq!(t.pf.snap(0), before);
    msg
}

fn link_state_refused(t: &T<'_>) {
    let m = refused(
        t,
        "ls-1",
        json!({"link_state":"enable"}),
        "set VF link state",
        "not supported",
    );
    t.note(format!("igb refuses link_state: {m}"));
}

fn min_rate_refused(t: &T<'_>) {
    let m = refused(
        t,
        "minrate-1",
        json!({"min_tx_rate":10,"max_tx_rate":100}),
        "set VF tx rate",
        "Invalid argument",
    );
    t.note(format!("igb refuses min_tx_rate: {m}"));
}

fn dot1ad_refused(t: &T<'_>) {
    let m = refused(
        t,
        "qinq-1",
        json!({"vlanProto":"802.1ad"}),
        "set VF vlan",
        "not supported",
    );
    t.note(format!("igb refuses vlanProto 802.1ad: {m}"));
}

/// Puts the PF back up when dropped (a failing case must not leave the PF without carrier).
struct PfUp<'a>(&'a crate::vf::Pf);

impl Drop for PfUp<'_> {
    fn drop(&mut self) {
        let _ = self.0.set_up(true).and_then(|()| self.0.wait_rate_ready());
    }
}

fn rate_without_carrier(t: &T<'_>) {
    let _up = PfUp(t.pf);
    t.pf.set_up(false).expect("PF down");
    // VLAN and MAC are applied (igb takes them without carrier), then the rate fails: both must
    // be undone.
    let m = refused(
        t,
        "nocarrier-1",
        json!({}),
        "set VF tx rate",
        "Invalid argument",
    );
    t.note(format!("max_tx_rate on a PF without carrier: {m}"));
}

fn carrier_lost_after_add(t: &T<'_>) {
    let _up = PfUp(t.pf);
    let pci = t.vf(0);
    let before = t.pf.snap(0);
    let pod = Netns::new();
    let conf = nad(&pci, bank_settings());
    t.dir.sriov("ADD", "carrier-1", &pod.path(), &conf).ok();
    assert_eq!(t.pf.vfinfo(0)["rate"]["max_tx"], 100);
    t.pf.set_up(false).expect("PF down");
    let rate_down = t.pf.vfinfo(0)["rate"].clone();
    let first = t.dir.sriov("DEL", "carrier-1", &pod.path(), &conf);
    let after_first = t.pf.snap(0);
    t.pf.set_up(true).expect("PF up");
    t.pf.wait_rate_ready().expect("PF takes rate changes again");
    let second = t.dir.sriov("DEL", "carrier-1", &pod.path(), &conf);
    t.note(format!(
        "PF carrier lost after ADD: VF rate then {rate_down}; DEL without carrier: code {} {}; VF restored by it: {}; DEL after carrier is back: code {}",
        first.code,
        first.out,
        after_first == before,
        second.code
    ));
    second.ok();
    if first.code != 0 {
        // A failed DEL keeps the state so the repeated DEL finishes the restore.
        let text = first.out.to_string();
        assert!(text.contains("restore"), "{text}");
    } else {
        assert_eq!(after_first, before, "a successful DEL restored everything");
    }
    assert_eq!(t.pf.snap(0), before);
    assert!(t.dir.saved().is_empty());
}

/// The VF's driver is unbound while the VF is in a pod (an operator reconfiguring the node):
/// the netdev is gone for good, so DEL must not wait for it to come back, and still restores the
/// PF side.
fn driver_unbound_while_attached(t: &T<'_>) {
    let pci = t.vf(1);
    let before = t.pf.snap(1);
    let pod = Netns::new();
    let conf = nad(&pci, bank_settings());
    t.dir.sriov("ADD", "unbound-1", &pod.path(), &conf).ok();
    crate::vf::write_sys(&format!("/sys/bus/pci/devices/{pci}/driver/unbind"), &pci)
        .expect("unbind igbvf");
    let started = std::time::Instant::now();
    let del = t.dir.sriov("DEL", "unbound-1", &pod.path(), &conf);
    let took = started.elapsed();
    // Back to igbvf (a new random MAC and the first free ethN: put the old ones back) before
    // asserting.
    crate::vf::write_sys("/sys/bus/pci/drivers_probe", &pci).expect("reprobe");
    let back = crate::vf::wait_for(std::time::Duration::from_secs(20), || {
        crate::vf::vf_netdev(&pci).is_some()
    });
    if let (Some(dev), Some(mac)) = (
        crate::vf::vf_netdev(&pci),
        before.netdev["address"].as_str(),
    ) {
        let _ = crate::vf::sh(&["ip", "link", "set", &dev, "address", mac]);
        if let Some(name) = before.netdev["ifname"].as_str().filter(|n| *n != dev) {
            let _ = crate::vf::sh(&["ip", "link", "set", &dev, "name", name]);
        }
    }
    del.ok();
    assert!(back.is_some(), "igbvf did not come back");
    assert!(
        took.as_secs() < 8,
        "DEL waited {took:?} for a netdev that cannot return"
    );
    assert_eq!(
        t.pf.snap(1),
        before,
        "PF side restored, netdev back after the reprobe"
    );
    assert!(t.dir.saved().is_empty());
    t.note(format!(
        "DEL with the VF's driver unbound while attached: {took:?}"
    ));
}
