use super::*;
use crate::plan::PlannedAttachment;
use crate::pod::PodIdentity;
use crate::state::{PlanStore, SavedPlan};

fn live(ids: &[&str]) -> RuntimeView {
    RuntimeView {
        endpoint: Some("/run/x.sock".into()),
        cross_checked: true,
        sandboxes: Some(ids.len()),
        note: None,
        ids: Some(ids.iter().map(|s| s.to_string()).collect()),
    }
}

fn plan(cid: &str, pod: &str, netns: &Path) -> SavedPlan {
    let mut p = SavedPlan::new(
        cid,
        "eth0",
        netns.to_str().unwrap(),
        Some(PodIdentity {
            namespace: "db".into(),
            name: pod.into(),
            uid: format!("uid-{pod}"),
            ..Default::default()
        }),
        vec![PlannedAttachment::for_test(
            "db/data",
            serde_json::json!({"type":"macvlan"}),
        )],
    );
    p.claims.push(ClaimedAddress {
        network: "db/data".into(),
        address: "10.56.100.10".parse().unwrap(),
    });
    p
}

/// Plans of live sandboxes are kept, a plan whose sandbox is gone is flagged, and so are a
/// result cache and a device-info file no plan names, an unreadable plan and a pending claim
/// release; without the runtime nothing is called gone and the report says so.
#[test]
fn flags_leftovers_against_the_runtime_list() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("state");
    let devinfo = t.path().join("devinfo");
    let store = PlanStore::new(&dir);
    let netns = t.path().join("netns");
    std::fs::write(&netns, b"").unwrap();
    store.save(&plan("live1", "pg-0", &netns)).unwrap();
    store.save(&plan("gone1", "pg-1", &netns)).unwrap();
    std::fs::write(dir.join("plans/broken-eth0.json"), b"{").unwrap();
    std::fs::create_dir_all(dir.join("results")).unwrap();
    let cache = |net: &str, cid: &str| {
        serde_json::json!({"kind":"cniCacheV1","containerId":cid,"config":"e30=","ifName":"net1",
            "networkName":net,"cniArgs":[],"capabilityArgs":{},"result":{}})
    };
    std::fs::write(
        dir.join("results/data-live1-net1"),
        cache("data", "live1").to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("results/data-orphan9-net1"),
        cache("data", "orphan9").to_string(),
    )
    .unwrap();
    let orphan_dev = format!("db-data-{}_net1", "a".repeat(64));
    std::fs::create_dir_all(devinfo.join("cni")).unwrap();
    std::fs::write(devinfo.join("cni").join(&orphan_dev), b"{}").unwrap();
    std::fs::write(devinfo.join("cni/db-data-live1_net1"), b"{}").unwrap();
    crate::claims_pending::record(
        &dir,
        &crate::claims_pending::PendingRelease {
            namespace: "db".into(),
            network: "db/data".into(),
            address: "10.56.100.11".parse().unwrap(),
            pod: "db/pg-2".into(),
            pod_uid: "u2".into(),
        },
    );
    let at = Where {
        state_dir: dir.clone(),
        device_info_dir: devinfo.clone(),
        ..Default::default()
    };
    let before: Vec<_> = walk(t.path());
    let r = collect(&at, live(&["live1"]), SystemTime::now());
    assert_eq!(walk(t.path()), before, "state must not change");
    assert_eq!(r.plans.len(), 2);
    let by = |c: &str| r.plans.iter().find(|p| p.container_id == c).unwrap();
    assert_eq!(by("live1").sandbox, Sandbox::Live);
    assert_eq!(by("gone1").sandbox, Sandbox::Gone);
    assert_eq!(by("gone1").claims[0].address.to_string(), "10.56.100.10");
    let kinds: Vec<(&str, Option<&str>)> = r
        .leftovers
        .iter()
        .map(|l| (l.kind, l.container_id.as_deref()))
        .collect();
    assert!(kinds.contains(&("plan", Some("gone1"))), "{kinds:?}");
    assert!(
        kinds.contains(&("resultCache", Some("orphan9"))),
        "{kinds:?}"
    );
    let aaa = "a".repeat(64);
    assert!(
        kinds.contains(&("deviceInfo", Some(aaa.as_str()))),
        "{kinds:?}"
    );
    assert!(kinds.contains(&("unreadablePlan", None)), "{kinds:?}");
    assert!(
        kinds.iter().any(|k| k.0 == "pendingClaimRelease"),
        "{kinds:?}"
    );
    assert!(!kinds.iter().any(|k| k.1 == Some("live1")), "{kinds:?}");
    assert_eq!(r.leftovers.len(), 5, "{kinds:?}");
    let text = super::super::state_cmd::text(&r);
    assert!(
        text.contains("LEFTOVERS (5)") && text.contains("pod db/pg-1"),
        "{text}"
    );

    // The runtime not reachable: no plan is called gone, the cache is flagged as planless.
    let r = collect(
        &at,
        ask_runtime(t.path().join("none.sock").to_str().unwrap(), None),
        SystemTime::now(),
    );
    assert!(!r.runtime.cross_checked);
    assert!(r
        .runtime
        .note
        .as_deref()
        .unwrap()
        .starts_with("runtime not reachable, not cross-checked"));
    assert!(r.plans.iter().all(|p| p.sandbox == Sandbox::Unknown));
    assert!(!r.leftovers.iter().any(|l| l.kind == "plan"));
    assert!(r
        .leftovers
        .iter()
        .any(|l| l.kind == "resultCache" && l.why.contains("not cross-checked")));

    // An empty list while plans' namespaces exist is not believed.
    let r = collect(&at, live(&[]), SystemTime::now());
    assert!(!r.runtime.cross_checked, "{:?}", r.runtime);
    assert!(!r.leftovers.iter().any(|l| l.kind == "plan"));

    // Younger than the grace period: not a leftover yet.
    let young = Where {
        grace: Duration::from_secs(3600),
        ..at
    };
    let r = collect(&young, live(&["live1"]), SystemTime::now());
    assert!(!r
        .leftovers
        .iter()
        .any(|l| l.kind == "plan" || l.kind == "resultCache"));
}

fn walk(p: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap().flatten() {
        let m = e.metadata().unwrap();
        if m.is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push((e.path(), m.len(), m.modified().ok()));
        }
    }
    out.sort();
    out
}

#[test]
fn devinfo_names_give_their_container() {
    let planned: BTreeSet<String> = ["c-1".to_string()].into();
    assert_eq!(
        devinfo_container("db-data-c-1_net1", &planned).as_deref(),
        Some("c-1")
    );
    let id = "0123456789abcdef".repeat(4);
    assert_eq!(
        devinfo_container(&format!("db-data-{id}_net1"), &planned),
        Some(id)
    );
    assert_eq!(devinfo_container("junk", &planned), None);
}
