//! Rollback with the recording double: ADD fails at each PF-side call in turn, and afterwards
//! the VF table and the netdev (name, MAC, MTU, netns) are exactly as before.

mod common;

use common::*;
use plexus_delegates::netns::NetNs;
use plexus_delegates::skel::{CmdArgs, Command};
use plexus_sriov::netconf::{self, Purpose};
use plexus_sriov::pf::VfConfig;
use plexus_sriov::pf_fake::{Call, FakePfState, RecordingPf};
use plexus_sriov::{add, del, Ctx, Settings};

#[test]
fn add_failing_at_each_pf_call_leaves_everything_as_before() {
    let env = Env::new(1, 0);
    let (pci, name) = vf(0);
    let mut conf = bank_conf("1.1.0", &pci);
    conf["link_state"] = serde_json::json!("enable");
    conf["min_tx_rate"] = serde_json::json!(10);
    let stdin = conf.to_string().into_bytes();
    let nc = netconf::parse(&stdin, "", Purpose::Attach).unwrap();
    let mut initial = FakePfState::with_pf(PF, 1);
    initial.pfs.get_mut(PF).unwrap()[0] = VfConfig {
        mac: "02:aa:00:00:00:00".parse().unwrap(),
        trust: true,
        ..VfConfig::default()
    };
    let pf = RecordingPf::new(initial.clone());
    let settings = Settings {
        sysfs_root: Some(env.sysfs()),
        state_dir: Some(env.state_dir()),
        log_dir: None,
        fake_pf: None,
    };
    let ctx = Ctx::new(&pf, &settings, Some(&nc));
    let args = CmdArgs {
        command: Command::Add,
        container_id: "c-rb".into(),
        netns: env.pod.path(),
        ifname: "net1".into(),
        args: String::new(),
        path: vec![env.cni_path()],
        stdin: stdin.clone(),
    };
    let host = NetNs::open(env.host.path()).unwrap();
    let before = env.link(&env.host.name, &name).unwrap();

    let mut failures = 0;
    for n in 1.. {
        pf.fail_nth_call(Some(n));
        let calls_before = pf.calls().len();
        let r = host.run(|| add::add(&ctx, &args, &nc)).unwrap();
        pf.fail_nth_call(None);
        let Err(e) = r else {
            // Every PF call has had its turn; the next ADD succeeded.
            assert!(n > 8, "ADD succeeded too early, at n={n}");
            break;
        };
        failures += 1;
        let failed_call = &pf.calls()[calls_before + n - 1];
        let msg = e.to_string();
        assert!(
            msg.contains(&pci) && msg.contains("injected"),
            "n={n}: {msg}"
        );
        assert!(!msg.contains("rollback also failed"), "n={n}: {msg}");
        assert_eq!(
            pf.snapshot().pfs,
            initial.pfs,
            "n={n} ({}): VF table restored",
            failed_call.op()
        );
        assert_eq!(
            env.link(&env.host.name, &name).as_ref(),
            Some(&before),
            "n={n}: netdev"
        );
        assert!(
            env.link(&env.pod.name, "net1").is_none(),
            "n={n}: nothing in pod"
        );
        assert!(
            ctx.store.load("c-rb", "net1").unwrap().is_none(),
            "n={n}: no state left"
        );
    }
    assert!(failures >= 8, "each PF step failed once ({failures})");
    let ops: Vec<&str> = pf.calls().iter().map(Call::op).collect();
    for op in [
        "set_vf_vlan",
        "set_vf_mac",
        "set_vf_rate",
        "set_vf_spoofchk",
        "set_vf_trust",
        "set_vf_link_state",
    ] {
        assert!(ops.contains(&op), "{op} exercised");
    }

    // The successful ADD is undone by DEL through the same double.
    let mut dargs = args.clone();
    dargs.command = Command::Del;
    host.run(|| del::del(&ctx, &dargs, &nc)).unwrap().unwrap();
    assert_eq!(pf.snapshot().pfs, initial.pfs);
    assert_eq!(env.link(&env.host.name, &name).as_ref(), Some(&before));
}
