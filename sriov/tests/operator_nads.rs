//! NADs exactly as the SR-IOV network operator renders them (`tests/fixtures/operator/`, see
//! its README for the template and the SriovNetwork spec behind each file), through plexus'
//! `sriov`: each parses with the strict NetConf parser, and an ADD/CHECK/DEL of the real binary
//! against the file-backed fake PF applies what the NAD asks and restores everything on DEL.
//! The config handed to `sriov` is the one plexus builds from the NAD: for a conflist the sriov
//! entry with the list's `cniVersion` and `name`, plus the allocated VF as `deviceID` and
//! `pciBusID`, and `runtimeConfig` for the capabilities the NAD declares.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::*;
use plexus_sriov::netconf::{self, Purpose};
use plexus_sriov::pf::LinkState;
use serde_json::{json, Value};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/operator")
}

/// What a fixture asks for, as the fake PF and the pod must show it after ADD.
struct Expect {
    file: &'static str,
    vlan: u16,
    qos: u8,
    proto: &'static str,
    spoofchk: Option<bool>,
    trust: Option<bool>,
    rate: Option<(u32, u32)>,
    link_state: Option<LinkState>,
    log_level: Option<&'static str>,
    log_file: Option<&'static str>,
    ipam_type: Option<&'static str>,
    /// The pod's request through `runtimeConfig` (only for NADs declaring the capabilities).
    runtime: Option<Value>,
    /// MAC the VF must end with (from `runtimeConfig.mac`), if any.
    mac: Option<&'static str>,
    /// The address the pod's net1 must carry (None: the NAD has no IPAM).
    addr: Option<&'static str>,
}

fn expectations() -> Vec<Expect> {
    let base = |file| Expect {
        file,
        vlan: 0,
        qos: 0,
        proto: "802.1q",
        spoofchk: None,
        trust: None,
        rate: None,
        link_state: None,
        log_level: None,
        log_file: None,
        ipam_type: None,
        runtime: None,
        mac: None,
        addr: None,
    };
    vec![
        base("golden-simple.json"),
        base("golden-chained.json"),
        Expect {
            vlan: 100,
            qos: 5,
            spoofchk: Some(false),
            trust: Some(true),
            rate: Some((100, 1000)),
            link_state: Some(LinkState::Enable),
            log_level: Some("debug"),
            log_file: Some("/var/log/sriov-cni.log"),
            ipam_type: Some("static"),
            runtime: Some(json!({"mac": "02:55:00:00:00:10"})),
            mac: Some("02:55:00:00:00:10"),
            addr: Some("10.56.217.10/24"),
            ..base("full-static.json")
        },
        Expect {
            vlan: 200,
            proto: "802.1ad",
            rate: Some((0, 0)),
            link_state: Some(LinkState::Auto),
            ipam_type: Some("host-local"),
            addr: Some("10.56.217.171/24"),
            ..base("qinq-host-local.json")
        },
        Expect {
            vlan: 300,
            spoofchk: Some(true),
            trust: Some(false),
            rate: Some((0, 500)),
            link_state: Some(LinkState::Disable),
            log_level: Some("info"),
            ipam_type: Some("whereabouts"),
            addr: Some("192.168.2.226/28"),
            ..base("whereabouts.json")
        },
        Expect {
            ipam_type: Some("static"),
            runtime: Some(json!({"mac": "02:55:00:00:00:07", "ips": ["10.30.0.7/24"]})),
            mac: Some("02:55:00:00:00:07"),
            addr: Some("10.30.0.7/24"),
            ..base("runtime-static.json")
        },
        Expect {
            vlan: 10,
            ipam_type: Some("static"),
            addr: Some("10.20.0.5/24"),
            ..base("chained-tuning.json")
        },
    ]
}

/// The NAD's `spec.config`, parsed.
fn nad_config(file: &str) -> Value {
    let nad: Value = serde_json::from_slice(
        &std::fs::read(fixtures_dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}")),
    )
    .unwrap_or_else(|e| panic!("{file}: {e}"));
    assert_eq!(nad["kind"], "NetworkAttachmentDefinition", "{file}");
    let raw = nad["spec"]["config"].as_str().expect("spec.config");
    serde_json::from_str(raw).unwrap_or_else(|e| panic!("{file} config: {e}"))
}

/// The config plexus hands `sriov` for `file` with VF `pci` and the pod's `runtime` request.
fn delegate_conf(file: &str, pci: &str, runtime: Option<&Value>) -> Value {
    let config = nad_config(file);
    let mut conf = match config.get("plugins").and_then(Value::as_array) {
        Some(list) => {
            let sriov: Vec<_> = list.iter().filter(|p| p["type"] == "sriov").collect();
            assert_eq!(sriov.len(), 1, "{file}: one sriov entry");
            let mut c = sriov[0].clone();
            c["cniVersion"] = config["cniVersion"].clone();
            c["name"] = config["name"].clone();
            c
        }
        None => config,
    };
    conf["deviceID"] = json!(pci);
    conf["pciBusID"] = json!(pci);
    if let Some(rt) = runtime {
        // libcni and plexus pass only capabilities the NAD declares.
        let mut rc = serde_json::Map::new();
        for (k, v) in rt.as_object().unwrap() {
            assert_eq!(
                conf["capabilities"][k], true,
                "{file} does not declare the {k} capability"
            );
            rc.insert(k.clone(), v.clone());
        }
        conf["runtimeConfig"] = Value::Object(rc);
    }
    conf
}

#[test]
fn every_fixture_is_covered_and_parses_with_plexus_netconf() {
    let table = expectations();
    let mut files: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    files.sort();
    let mut covered: Vec<String> = table.iter().map(|e| e.file.to_string()).collect();
    covered.sort();
    assert_eq!(files, covered, "every fixture has expectations");

    for e in &table {
        let conf = delegate_conf(e.file, "0000:af:06.0", e.runtime.as_ref());
        let c = netconf::parse(conf.to_string().as_bytes(), "", Purpose::Attach)
            .unwrap_or_else(|err| panic!("{}: plexus' sriov rejects it: {err}\n{conf}", e.file));
        assert_eq!(c.cni_version, "1.0.0", "{}", e.file);
        assert_eq!(c.device_id.as_deref(), Some("0000:af:06.0"));
        // The operator always writes "vlan" (0 by default), so the VLAN is always set.
        let v = c.vlan.unwrap_or_else(|| panic!("{}: vlan", e.file));
        assert_eq!(
            (v.id, v.qos, v.proto.to_string().as_str()),
            (e.vlan, e.qos, e.proto),
            "{}",
            e.file
        );
        assert_eq!(c.spoofchk, e.spoofchk, "{}", e.file);
        assert_eq!(c.trust, e.trust, "{}", e.file);
        assert_eq!(c.rate.map(|r| (r.min, r.max)), e.rate, "{}", e.file);
        assert_eq!(c.link_state, e.link_state, "{}", e.file);
        assert_eq!(c.log_level.as_deref(), e.log_level, "{}", e.file);
        assert_eq!(
            c.log_file.as_deref(),
            e.log_file.map(Path::new),
            "{}",
            e.file
        );
        assert_eq!(c.ipam_type.as_deref(), e.ipam_type, "{}", e.file);
        assert_eq!(c.mac.map(|m| m.to_string()).as_deref(), e.mac, "{}", e.file);
        // DEL (no deviceID needed: the state file has it) parses the NAD as well.
        let mut del = conf.clone();
        let o = del.as_object_mut().unwrap();
        o.remove("deviceID");
        o.remove("pciBusID");
        netconf::parse(del.to_string().as_bytes(), "", Purpose::Other)
            .unwrap_or_else(|err| panic!("{} as DEL: {err}", e.file));
    }
}

/// The spellings the operator's CRD allows for `vlanProto` (`802.1q`, `802.1Q`, `802.1ad`,
/// `802.1AD`) all parse, as sriov-cni lower-cases them.
#[test]
fn every_vlan_proto_spelling_the_operator_allows_parses() {
    for (p, want) in [
        ("802.1q", "802.1q"),
        ("802.1Q", "802.1q"),
        ("802.1ad", "802.1ad"),
        ("802.1AD", "802.1ad"),
    ] {
        let mut conf = delegate_conf("qinq-host-local.json", "0000:af:06.0", None);
        conf["vlanProto"] = json!(p);
        let c = netconf::parse(conf.to_string().as_bytes(), "", Purpose::Attach).unwrap();
        assert_eq!(c.vlan.unwrap().proto.to_string(), want);
    }
}

/// An IPAM plugin standing in for host-local / whereabouts: records the config it is given and
/// answers ADD with `addr`.
fn write_recording_ipam(dir: &Path, name: &str, addr: &str) {
    let script = format!(
        r#"#!/bin/sh
conf=$(cat)
d=$(dirname "$0")
printf '%s' "$conf" > "$d/{name}.$CNI_COMMAND.json"
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME" >> "$d/ipam.log"
case "$CNI_COMMAND" in
ADD) printf '{{"cniVersion":"%s","ips":[{{"address":"{addr}"}}]}}' "$(printf '%s' "$conf" | jq -r .cniVersion)" ;;
VERSION) echo '{{"cniVersion":"1.1.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}}' ;;
esac
"#
    );
    let p = dir.join(name);
    std::fs::write(&p, script).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The real `static` IPAM plugin (Debian's containernetworking-plugins) instead of the shared
/// jq stand-in: it honours `runtimeConfig.ips`, as the operator's `{"type": "static"}` needs.
fn use_real_static(env: &Env) {
    let real = Path::new("/usr/lib/cni/static");
    assert!(
        real.exists(),
        "{} missing: apt-get install containernetworking-plugins",
        real.display()
    );
    let p = env.cni_path().join("static");
    std::fs::remove_file(&p).unwrap();
    std::os::unix::fs::symlink(real, &p).unwrap();
}

/// Runs the real `sriov` (fake PF build) in the host netns on `net1`, logging under the
/// test's own directory (never the node's /var/log/plexus-sriov); returns (ok, stdout JSON,
/// stderr).
fn sriov(env: &Env, cmd: &str, cid: &str, netns: &str, conf: &Value) -> (bool, Value, String) {
    let log_dir = env.dir.path().join("log");
    let log_dir = log_dir.to_str().unwrap();
    env.sriov_output(
        cmd,
        cid,
        "net1",
        netns,
        conf,
        &[("PLEXUS_SRIOV_LOG_DIR", log_dir)],
    )
}

/// A fixture's logFile pointed into the test's own directories (the rendered
/// `/var/log/sriov-cni.log` is the node's; its refusal is checked by
/// `log_file_outside_the_sriov_log_dir_is_refused_and_never_written`).
fn keep_logs_local(conf: &mut Value, env: &Env) {
    if conf.get("logFile").is_some() {
        conf["logFile"] = json!(env.dir.path().join("elsewhere/sriov-cni.log"));
    }
}

#[test]
fn each_fixture_adds_checks_and_dels_through_the_sriov_binary() {
    for e in expectations() {
        let env = Env::new(1, 0);
        use_real_static(&env);
        let ipam_addr = e.addr.unwrap_or("");
        for stub in ["host-local", "whereabouts"] {
            write_recording_ipam(&env.cni_path(), stub, ipam_addr);
        }
        let (pci, name) = vf(0);
        let before = env.link(&env.host.name, &name).unwrap();
        let pf_before = env.vf_config(0);
        let mut conf = delegate_conf(e.file, &pci, e.runtime.as_ref());
        keep_logs_local(&mut conf, &env);
        let cid = format!("c-{}", e.file.trim_end_matches(".json"));

        let (ok, res, stderr) = sriov(&env, "ADD", &cid, &env.pod.path(), &conf);
        assert!(ok, "{} ADD: {res}\n{stderr}", e.file);
        assert_eq!(res["cniVersion"], "1.0.0", "{}", e.file);
        assert_eq!(res["interfaces"][0]["name"], "net1");

        // PF side: what the NAD asks, and nothing else changed.
        let c = env.vf_config(0);
        assert_eq!(
            (c.vlan, c.qos, c.proto.to_string().as_str()),
            (e.vlan, e.qos, e.proto),
            "{}",
            e.file
        );
        assert_eq!(c.spoofchk, e.spoofchk.unwrap_or(pf_before.spoofchk));
        assert_eq!(c.trust, e.trust.unwrap_or(pf_before.trust), "{}", e.file);
        assert_eq!(
            (c.min_tx_rate, c.max_tx_rate),
            e.rate
                .unwrap_or((pf_before.min_tx_rate, pf_before.max_tx_rate)),
            "{}",
            e.file
        );
        assert_eq!(c.link_state, e.link_state.unwrap_or(pf_before.link_state));
        // Pod side: the VF's netdev as net1, with the requested MAC and the IPAM address.
        let pod = env
            .link(&env.pod.name, "net1")
            .unwrap_or_else(|| panic!("{}: no net1 in the pod", e.file));
        assert!(env.link(&env.host.name, &name).is_none(), "{}", e.file);
        if let Some(mac) = e.mac {
            assert_eq!(pod.mac, mac, "{}", e.file);
            assert_eq!(c.mac.to_string(), mac, "{}: PF-side MAC", e.file);
            assert_eq!(res["interfaces"][0]["mac"], mac);
        }
        let global: Vec<String> = env
            .addrs(&env.pod.name, "net1")
            .into_iter()
            .filter(|a| !a.starts_with("fe80"))
            .collect();
        match e.addr {
            Some(a) => {
                assert_eq!(global, vec![a.to_string()], "{}", e.file);
                assert_eq!(res["ips"][0]["address"], a, "{}", e.file);
            }
            None => assert!(global.is_empty(), "{}: {global:?}", e.file),
        }
        // The operator's IPAM block reaches the IPAM plugin unchanged.
        if let Some(t @ ("host-local" | "whereabouts")) = e.ipam_type {
            let seen: Value = serde_json::from_slice(
                &std::fs::read(env.cni_path().join(format!("{t}.ADD.json"))).unwrap(),
            )
            .unwrap();
            assert_eq!(seen["ipam"], conf["ipam"], "{}", e.file);
        }

        let mut chk = conf.clone();
        chk["prevResult"] = res.clone();
        let (ok, out, stderr) = sriov(&env, "CHECK", &cid, &env.pod.path(), &chk);
        assert!(ok, "{} CHECK: {out}\n{stderr}", e.file);

        let (ok, out, stderr) = sriov(&env, "DEL", &cid, &env.pod.path(), &conf);
        assert!(ok, "{} DEL: {out}\n{stderr}", e.file);
        assert_eq!(
            env.link(&env.host.name, &name).as_ref(),
            Some(&before),
            "{}: netdev name/MAC/MTU back in the host",
            e.file
        );
        assert_eq!(env.vf_config(0), pf_before, "{}: PF side restored", e.file);
        assert!(env.link(&env.pod.name, "net1").is_none());
        if e.ipam_type.is_some() {
            assert!(
                env.ipam_log().contains(&format!("DEL {cid} net1"))
                    || e.ipam_type == Some("static"),
                "{}: IPAM released: {}",
                e.file,
                env.ipam_log()
            );
        }
        // DEL again: idempotent.
        let (ok, out, _) = sriov(&env, "DEL", &cid, &env.pod.path(), &conf);
        assert!(ok, "{} second DEL: {out}", e.file);
    }
}

/// The operator's `logFile` is chosen by whoever writes the SriovNetwork (or the NAD, which a
/// namespace user can edit): plexus' sriov honours it only directly in its log directory.
#[test]
fn log_file_outside_the_sriov_log_dir_is_refused_and_never_written() {
    let env = Env::new(1, 0);
    use_real_static(&env);
    let (pci, _) = vf(0);
    let log_dir = env.dir.path().join("log");
    let mut conf = delegate_conf(
        "full-static.json",
        &pci,
        Some(&json!({"mac": "02:55:00:00:00:10"})),
    );
    // As rendered: /var/log/sriov-cni.log is outside the log dir. Checked without touching the
    // node: the refusal is decided before anything is opened, and the file's state is compared.
    let node_file = Path::new("/var/log/sriov-cni.log");
    let node_before = std::fs::symlink_metadata(node_file).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.ino(), m.size(), m.mtime_nsec())
    });
    let (ok, res, stderr) = sriov(&env, "ADD", "c-log", &env.pod.path(), &conf);
    assert!(
        ok,
        "a refused logFile is not a network error: {res}\n{stderr}"
    );
    assert!(
        stderr.contains("logFile /var/log/sriov-cni.log refused"),
        "{stderr}"
    );
    let node_after = std::fs::symlink_metadata(node_file).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.ino(), m.size(), m.mtime_nsec())
    });
    assert_eq!(node_before, node_after, "the node's file was not touched");
    let (ok, _, _) = sriov(&env, "DEL", "c-log", &env.pod.path(), &conf);
    assert!(ok);

    // A path that escapes the log dir by `..`, and one in a subdirectory: refused, not created.
    for (i, p) in [log_dir.join("../escaped.log"), log_dir.join("sub/x.log")]
        .iter()
        .enumerate()
    {
        conf["logFile"] = json!(p);
        let cid = format!("c-log{i}");
        let (ok, res, stderr) = sriov(&env, "ADD", &cid, &env.pod.path(), &conf);
        assert!(ok, "{res}\n{stderr}");
        assert!(stderr.contains("refused"), "{stderr}");
        assert!(!p.exists(), "{} was created", p.display());
        let (ok, _, _) = sriov(&env, "DEL", &cid, &env.pod.path(), &conf);
        assert!(ok);
    }
    assert!(!env.dir.path().join("escaped.log").exists());

    // Directly in the log dir: honoured, private, and the debug level the NAD asks is applied.
    let inside = log_dir.join("sriov-cni.log");
    conf["logFile"] = json!(inside);
    let (ok, res, stderr) = sriov(&env, "ADD", "c-log-in", &env.pod.path(), &conf);
    assert!(ok, "{res}\n{stderr}");
    let (ok, _, _) = sriov(&env, "DEL", "c-log-in", &env.pod.path(), &conf);
    assert!(ok);
    let text = std::fs::read_to_string(&inside).expect("log file written");
    assert!(
        text.contains("DEBUG") && text.contains("plugin=static"),
        "logLevel debug honoured: {text}"
    );
    let mode = std::fs::metadata(&inside).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600);
}

/// On the fake PF's igb model (an emulated 82576, as the VM tier checks against the real
/// driver) the operator's NADs fail where igb refuses a setting, naming the step and the kernel
/// error, and leave the VF as it was; the settings igb has work.
#[test]
fn on_the_igb_model_refused_settings_fail_the_add_and_roll_back() {
    for (file, refusal) in [
        // min_tx_rate 100: igb has no minimum rate (the rate is set before link_state).
        ("full-static.json", Some(("set VF tx rate", "os error 22"))),
        ("qinq-host-local.json", Some(("set VF vlan", "os error 93"))),
        // link_state disable: igb has no ndo_set_vf_link_state.
        (
            "whereabouts.json",
            Some(("set VF link state", "os error 95")),
        ),
        ("golden-simple.json", None),
        ("chained-tuning.json", None),
    ] {
        let env = Env::new(1, 0);
        use_real_static(&env);
        for stub in ["host-local", "whereabouts"] {
            write_recording_ipam(&env.cni_path(), stub, "10.1.0.2/24");
        }
        let mut st = env.pf_state();
        st.driver = plexus_sriov::pf_fake::FakeDriver::Igb;
        plexus_sriov::pf_fake::FilePf::create(&env.fake_pf(), &st).unwrap();
        let (pci, name) = vf(0);
        let before = env.link(&env.host.name, &name).unwrap();
        let pf_before = env.vf_config(0);
        let runtime = (file == "full-static.json").then(|| json!({"mac": "02:55:00:00:00:10"}));
        let mut conf = delegate_conf(file, &pci, runtime.as_ref());
        keep_logs_local(&mut conf, &env);
        let (ok, res, stderr) = sriov(&env, "ADD", "c-igb", &env.pod.path(), &conf);
        match refusal {
            Some((step, errno)) => {
                assert!(!ok, "{file}: igb must refuse: {res}");
                let d = res["details"].as_str().unwrap_or_default();
                assert!(
                    d.contains(step) && d.contains(errno) && d.contains(&pci),
                    "{file}: {d}"
                );
                assert_eq!(env.link(&env.host.name, &name).as_ref(), Some(&before));
                assert_eq!(env.vf_config(0), pf_before, "{file}: rolled back");
                assert!(env.link(&env.pod.name, "net1").is_none());
            }
            None => {
                assert!(ok, "{file}: {res}\n{stderr}");
                assert!(env.link(&env.pod.name, "net1").is_some());
            }
        }
        let (ok, out, _) = sriov(&env, "DEL", "c-igb", &env.pod.path(), &conf);
        assert!(ok, "{file} DEL: {out}");
        assert_eq!(env.vf_config(0), pf_before, "{file}: restored");
    }
}
