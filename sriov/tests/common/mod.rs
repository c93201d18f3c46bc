//! Shared fixtures for the sriov tests: per-test "host" and "pod" network namespaces with veth
//! ends standing in for VF netdevs, a fake sysfs tree, a fake PF state file, a static IPAM
//! script, and a runner for the real `sriov` binary inside the host netns.
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use plexus_sriov::fake_sysfs::{FakeSysfs, FakeVf};
use plexus_sriov::pf_fake::{FakePfState, FilePf};
use serde_json::Value;

pub const PF: &str = "enp175s0f1";
pub const PF_PCI: &str = "0000:af:00.1";

/// VF i: PCI address, host netdev name.
pub fn vf(i: u32) -> (String, String) {
    (format!("0000:af:06.{i}"), format!("vf{i}"))
}

fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command and panics with its stderr on failure.
pub fn run(args: &[&str]) -> String {
    sh(args).unwrap_or_else(|e| panic!("{e}"))
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A named netns removed on drop.
pub struct Ns {
    pub name: String,
    deleted: bool,
}

impl Ns {
    pub fn new(tag: &str) -> Ns {
        let name = format!(
            "plxsr-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        run(&["ip", "netns", "add", &name]);
        Ns {
            name,
            deleted: false,
        }
    }
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }
    /// Deletes the namespace now (the "pod went away" case).
    pub fn delete(&mut self) {
        if !self.deleted {
            let _ = sh(&["ip", "netns", "del", &self.name]);
            self.deleted = true;
        }
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        self.delete();
    }
}

/// A netdev's observable state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkState {
    pub name: String,
    pub mac: String,
    pub mtu: u64,
    pub ifindex: u64,
}

/// Everything a test needs: host + pod netns, fake sysfs, fake PF file, state dir, CNI_PATH.
pub struct Env {
    pub host: Ns,
    pub pod: Ns,
    pub dir: tempfile::TempDir,
    pub n_vfs: u32,
}

impl Env {
    /// `n_netdev` VFs backed by veth ends `vf0..` in the host netns, then `dpdk` VFs bound to
    /// vfio-pci (no netdev).
    pub fn new(n_netdev: u32, dpdk: u32) -> Env {
        let host = Ns::new("h");
        let pod = Ns::new("p");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut vfs = Vec::new();
        for i in 0..n_netdev {
            let (pci, name) = vf(i);
            run(&[
                "ip",
                "-n",
                &host.name,
                "link",
                "add",
                &name,
                "address",
                &format!("02:00:00:00:00:{:02x}", 0x10 + i),
                "mtu",
                "1500",
                "type",
                "veth",
                "peer",
                "name",
                &format!("{name}p"),
            ]);
            run(&[
                "ip",
                "-n",
                &host.name,
                "link",
                "set",
                &format!("{name}p"),
                "up",
            ]);
            vfs.push(FakeVf::netdev(&pci, &name));
        }
        for j in 0..dpdk {
            let (pci, _) = vf(n_netdev + j);
            vfs.push(FakeVf::userspace(&pci, "vfio-pci"));
        }
        let env = Env {
            host,
            pod,
            dir,
            n_vfs: n_netdev + dpdk,
        };
        FakeSysfs::new(&env.sysfs())
            .add_pf(PF_PCI, PF, &vfs)
            .expect("fake sysfs");
        let mut st = FakePfState::with_pf(PF, env.n_vfs as usize);
        // Start from a non-default PF-side state so restores are visible.
        for (i, v) in st.pfs.get_mut(PF).unwrap().iter_mut().enumerate() {
            v.mac = format!("02:aa:00:00:00:{i:02x}").parse().unwrap();
            v.max_tx_rate = 0;
            v.trust = true;
        }
        FilePf::create(&env.fake_pf(), &st).expect("fake pf");
        std::fs::create_dir_all(env.cni_path()).unwrap();
        write_static_ipam(&env.cni_path());
        env
    }

    pub fn sysfs(&self) -> PathBuf {
        self.dir.path().join("sys")
    }
    pub fn fake_pf(&self) -> PathBuf {
        self.dir.path().join("pf.json")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    pub fn cni_path(&self) -> PathBuf {
        self.dir.path().join("bin")
    }
    pub fn ipam_log(&self) -> String {
        std::fs::read_to_string(self.cni_path().join("ipam.log")).unwrap_or_default()
    }

    pub fn pf_state(&self) -> FakePfState {
        FilePf::new(self.fake_pf()).load().expect("load fake pf")
    }
    pub fn vf_config(&self, i: u32) -> plexus_sriov::pf::VfConfig {
        self.pf_state().pfs[PF][i as usize].clone()
    }
    pub fn set_fail_at(&self, op: Option<&str>) {
        let mut st = self.pf_state();
        st.fail_at = op.map(str::to_string);
        FilePf::create(&self.fake_pf(), &st).unwrap();
    }

    /// `ip -j link show dev <name>` in a netns.
    pub fn link(&self, ns: &str, name: &str) -> Option<LinkState> {
        let out = sh(&["ip", "-n", ns, "-j", "link", "show", "dev", name]).ok()?;
        let v: Value = serde_json::from_str(&out).ok()?;
        let l = v.get(0)?;
        Some(LinkState {
            name: l["ifname"].as_str()?.to_string(),
            mac: l["address"].as_str()?.to_string(),
            mtu: l["mtu"].as_u64()?,
            ifindex: l["ifindex"].as_u64()?,
        })
    }

    /// Addresses (`ip/prefix`) of a link.
    pub fn addrs(&self, ns: &str, name: &str) -> Vec<String> {
        let out = run(&["ip", "-n", ns, "-j", "addr", "show", "dev", name]);
        let v: Value = serde_json::from_str(&out).unwrap();
        v[0]["addr_info"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| format!("{}/{}", i["local"].as_str().unwrap(), i["prefixlen"]))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Runs the real `sriov` binary inside the host netns. Returns (exit ok, stdout JSON).
    pub fn sriov(
        &self,
        cmd: &str,
        cid: &str,
        ifname: &str,
        netns: &str,
        conf: &Value,
    ) -> (bool, Value) {
        self.sriov_env(cmd, cid, ifname, netns, conf, &[])
    }

    /// [`Env::sriov`] with extra environment; a failure's stderr is printed.
    pub fn sriov_env(
        &self,
        cmd: &str,
        cid: &str,
        ifname: &str,
        netns: &str,
        conf: &Value,
        extra: &[(&str, &str)],
    ) -> (bool, Value) {
        let (ok, v, stderr) = self.sriov_output(cmd, cid, ifname, netns, conf, extra);
        if !ok {
            eprintln!("sriov {cmd} stderr: {stderr}");
        }
        (ok, v)
    }

    /// Runs the real `sriov` binary inside the host netns with extra environment. Returns
    /// (exit ok, stdout JSON, stderr).
    pub fn sriov_output(
        &self,
        cmd: &str,
        cid: &str,
        ifname: &str,
        netns: &str,
        conf: &Value,
        extra: &[(&str, &str)],
    ) -> (bool, Value, String) {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &self.host.name,
            env!("CARGO_BIN_EXE_sriov-fake-pf"),
        ])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_IFNAME", ifname)
        .env("CNI_NETNS", netns)
        .env("CNI_PATH", self.cni_path())
        .env("PLEXUS_SYSFS_ROOT", self.sysfs())
        .env("PLEXUS_SRIOV_STATE_DIR", self.state_dir())
        .env("PLEXUS_SRIOV_FAKE_PF", self.fake_pf())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        for (k, v) in extra {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("spawn sriov");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().expect("wait sriov");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("stdout {stdout:?}: {e}"))
        };
        (
            out.status.success(),
            v,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// A `static` IPAM plugin as a shell script (jq): ADD prints `ipam.addresses`/`routes`, every
/// call is appended to `ipam.log` next to it.
fn write_static_ipam(dir: &Path) {
    let script = r#"#!/bin/sh
conf=$(cat)
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME" >> "$(dirname "$0")/ipam.log"
case "$CNI_COMMAND" in
ADD)
  printf '%s' "$conf" | jq -c '{cniVersion: .cniVersion,
     ips: [.ipam.addresses[] | {address: .address} + (if .gateway then {gateway: .gateway} else {} end)],
     routes: (.ipam.routes // []), dns: (.ipam.dns // {})}'
  ;;
VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}' ;;
*) ;;
esac
"#;
    let p = dir.join("static");
    std::fs::write(&p, script).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The bank scenario config: static IP, vlan 100, max_tx_rate 1000, trust off.
pub fn bank_conf(version: &str, vf_pci: &str) -> Value {
    serde_json::json!({
        "cniVersion": version,
        "name": "bank-net",
        "type": "sriov",
        "deviceID": vf_pci,
        "pciBusID": vf_pci,
        "vlan": 100,
        "max_tx_rate": 1000,
        "trust": "off",
        "spoofchk": "on",
        "mac": "02:66:00:00:00:01",
        "mtu": 9000,
        "ipam": {
            "type": "static",
            "addresses": [{"address": "10.10.0.5/24", "gateway": "10.10.0.1"}],
            "routes": [{"dst": "192.168.50.0/24"}]
        }
    })
}
