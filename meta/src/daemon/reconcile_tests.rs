use super::*;
use crate::plan::PlannedAttachment;
use plexus_conf::plexus_config::PlexusConfig;
use std::os::unix::fs::PermissionsExt;

fn facts(id: &str, age_s: u64) -> PlanFacts {
    PlanFacts {
        container_id: id.into(),
        age: Duration::from_secs(age_s),
    }
}

fn ids(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn only_plans_absent_from_the_list_and_older_than_the_margin_are_reclaimed() {
    let grace = Duration::from_secs(120);
    let live = ids(&["a"]);
    assert_eq!(decide(&facts("a", 9999), Some(&live), grace), Verdict::Live);
    assert_eq!(decide(&facts("a", 0), Some(&live), grace), Verdict::Live);
    assert_eq!(decide(&facts("b", 119), Some(&live), grace), Verdict::Young);
    assert_eq!(
        decide(&facts("b", 120), Some(&live), grace),
        Verdict::Reclaim
    );
    // An empty list is a runtime with no sandbox: everything old is gone.
    assert_eq!(
        decide(&facts("a", 500), Some(&BTreeSet::new()), grace),
        Verdict::Reclaim
    );
}

#[test]
fn nothing_is_reclaimed_when_the_runtime_list_could_not_be_read() {
    for age in [0, 119, 120, 86_400] {
        assert_eq!(
            decide(&facts("b", age), None, Duration::from_secs(120)),
            Verdict::Unknown
        );
    }
}

#[test]
fn devinfo_file_names_give_their_container_id() {
    let id = "0123456789abcdef".repeat(4);
    assert_eq!(
        devinfo_container_id(&format!("app-br-a-{id}_net1")),
        Some(id.as_str())
    );
    assert_eq!(
        devinfo_container_id(&format!("{id}_net1")),
        Some(id.as_str())
    );
    assert_eq!(devinfo_container_id(&format!("n-{id}net1")), None);
    assert_eq!(devinfo_container_id("n-abc_net1"), None);
    assert_eq!(devinfo_container_id(&format!("n-x{id}_net1")), None);
}

/// A node's state in a temp dir: a recording delegate (`rec` logs `COMMAND CONTAINERID`), the
/// plexus config, its plan store.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new(runtime_endpoint: &str) -> (Node, Ctx) {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let rec = bin.join("rec");
        std::fs::write(
            &rec,
            format!(
                "#!/bin/sh\necho \"$CNI_COMMAND $CNI_CONTAINERID $CNI_NETNS\" >> {}\n",
                dir.path().join("calls").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = serde_json::json!({
            "cniVersion": "1.0.0", "name": "p", "type": "plexus",
            "clusterNetwork": "/nonexistent.conflist",
            "cniDir": dir.path().join("state"), "binDir": bin,
            "deviceInfoDir": dir.path().join("devinfo"),
            "reconcileGraceSeconds": 120, "runtimeEndpoint": runtime_endpoint,
        });
        let config = PlexusConfig::parse(cfg.to_string().as_bytes()).unwrap();
        let ctx = Ctx::from_config(config, &[], None);
        (Node { dir }, ctx)
    }

    fn plan(&self, ctx: &Ctx, id: &str, age_s: u64) {
        let a = PlannedAttachment {
            ifname: "eth0".into(),
            is_default: true,
            ..PlannedAttachment::for_test(
                "rec-net",
                serde_json::json!({"cniVersion":"1.0.0","name":"rec-net","type":"rec"}),
            )
        };
        ctx.store
            .save(&SavedPlan::new(id, "eth0", "", None, vec![a]))
            .unwrap();
        let f = self
            .dir
            .path()
            .join("state/plans")
            .join(format!("{id}-eth0.json"));
        age(&f, age_s);
    }

    fn devinfo(&self, id: &str, age_s: u64) -> PathBuf {
        let d = self.dir.path().join("devinfo/cni");
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join(format!("app-sriov-{id}_net1"));
        std::fs::write(&f, b"{}").unwrap();
        age(&f, age_s);
        f
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("calls")).unwrap_or_default()
    }
}

fn age(f: &Path, age_s: u64) {
    std::fs::File::options()
        .write(true)
        .open(f)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(age_s))
        .unwrap();
}

fn id(c: char) -> String {
    c.to_string().repeat(64)
}

fn plan_ids(ctx: &Ctx) -> BTreeSet<String> {
    ctx.store
        .all()
        .into_iter()
        .map(|p| p.container_id)
        .collect()
}

#[test]
fn a_pass_releases_gone_sandboxes_through_their_delegates_and_keeps_the_rest() {
    let (node, mut ctx) = Node::new("/nonexistent.sock");
    let (gone, live, young, busy) = (id('a'), id('b'), id('c'), id('d'));
    node.plan(&ctx, &gone, 600);
    node.plan(&ctx, &live, 600);
    node.plan(&ctx, &young, 5);
    node.plan(&ctx, &busy, 600);
    let orphan = node.devinfo(&id('e'), 600);
    let of_live = node.devinfo(&live, 600);
    let fresh = node.devinfo(&id('f'), 5);
    // An ADD of `busy` is running: it holds the container lock.
    let held = ctx.store.lock(&busy).unwrap();
    let pass = apply(&mut ctx, &ids(&[&live]), SystemTime::now());
    drop(held);
    assert_eq!(pass.reclaimed, vec![(gone.clone(), "eth0".to_string())]);
    assert_eq!((pass.kept_live, pass.kept_young, pass.failed), (1, 2, 0));
    assert_eq!(plan_ids(&ctx), ids(&[&live, &young, &busy]));
    // The delegate's DEL ran for the gone sandbox alone (no netns: it was never there).
    assert_eq!(node.calls(), format!("DEL {gone} \n"));
    assert!(
        ctx.store.deleted(&gone, "eth0", false),
        "tombstone for late DELs"
    );
    assert_eq!(pass.devinfo_removed, vec![orphan.clone()]);
    assert!(!orphan.exists() && of_live.exists() && fresh.exists());
    // The next pass, with the lock free, takes `busy`.
    let pass = apply(&mut ctx, &ids(&[&live]), SystemTime::now());
    assert_eq!(pass.reclaimed, vec![(busy.clone(), "eth0".to_string())]);
    assert_eq!(plan_ids(&ctx), ids(&[&live, &young]));
}

#[test]
fn a_runtime_that_cannot_be_asked_means_nothing_is_released() {
    let (node, mut ctx) = Node::new(
        &tempfile::tempdir()
            .unwrap()
            .path()
            .join("nobody.sock")
            .display()
            .to_string(),
    );
    node.plan(&ctx, &id('a'), 86_400);
    let orphan = node.devinfo(&id('e'), 86_400);
    let pass = run_once(&mut ctx, None);
    assert!(
        pass.skipped
            .as_deref()
            .is_some_and(|s| s.contains("connect")),
        "{pass:?}"
    );
    assert!(pass.reclaimed.is_empty());
    assert_eq!(plan_ids(&ctx), ids(&[&id('a')]));
    assert!(orphan.exists());
    assert_eq!(node.calls(), "");
    // Off: not even asked.
    ctx.config.runtime_endpoint = "none".into();
    assert!(run_once(&mut ctx, None).skipped.is_some());
    assert_eq!(plan_ids(&ctx), ids(&[&id('a')]));
}

#[test]
fn an_empty_list_while_plans_network_namespaces_exist_releases_nothing() {
    let (node, mut ctx) = Node::new("/nonexistent.sock");
    node.plan(&ctx, &id('a'), 600);
    node.plan(&ctx, &id('b'), 600);
    // `b`'s namespace is still there (any existing path stands for it).
    let mut plan = ctx.store.load(&id('b'), "eth0").unwrap().unwrap();
    plan.netns = node.dir.path().display().to_string();
    ctx.store.save(&plan).unwrap();
    age(
        &node
            .dir
            .path()
            .join("state/plans")
            .join(format!("{}-eth0.json", id('b'))),
        600,
    );
    let pass = apply(&mut ctx, &BTreeSet::new(), SystemTime::now());
    assert!(
        pass.skipped.is_some() && pass.reclaimed.is_empty(),
        "{pass:?}"
    );
    assert_eq!(plan_ids(&ctx), ids(&[&id('a'), &id('b')]));
    assert_eq!(node.calls(), "");
    // Once no namespace is left, an empty list is a node without pods: both go.
    plan.netns = "/nonexistent/netns".into();
    ctx.store.save(&plan).unwrap();
    age(
        &node
            .dir
            .path()
            .join("state/plans")
            .join(format!("{}-eth0.json", id('b'))),
        600,
    );
    let pass = apply(&mut ctx, &BTreeSet::new(), SystemTime::now());
    assert_eq!(pass.reclaimed.len(), 2, "{pass:?}");
    assert!(plan_ids(&ctx).is_empty());
}
