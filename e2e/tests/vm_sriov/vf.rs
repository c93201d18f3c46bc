//! Inside the VM: the real PF and its VFs, read back the way an operator would (`ip -d link show
//! <pf>`, `ip link`, sysfs), and the real `sriov` binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{bin, run, Call, Run};

const PCI: &str = "/sys/bus/pci/devices";

/// Runs a command, returning stdout or an error with stderr.
pub fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Writes a sysfs attribute.
pub fn write_sys(path: &str, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("write {value:?} to {path}: {e}"))
}

/// Polls `f` every 20 ms until it returns true or `limit` passes; returns the wait.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    loop {
        if f() {
            return Some(t.elapsed());
        }
        if t.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The emulated 82576 PF.
pub struct Pf {
    /// Netdev name (eth0).
    pub name: String,
    /// PCI address.
    pub pci: String,
}

/// The observable state of one VF: the PF's view (`vfinfo_list` entry of `ip -j -d link show
/// <pf>`) and, when it has one, its netdev in the root netns (name, MAC, MTU, up or not).
#[derive(Clone, Debug, PartialEq)]
pub struct VfSnap {
    /// PF side.
    pub pf_side: Value,
    /// Driver bound to the VF.
    pub driver: String,
    /// Netdev: `{"ifname","address","mtu","up"}`, Null when none in the root netns.
    pub netdev: Value,
}

impl Pf {
    /// The PCI functions bound to `igb`, lowest address first.
    fn igb_functions() -> Result<Vec<String>, String> {
        let dir = "/sys/bus/pci/drivers/igb";
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| format!("{dir}: {e} (igb not loaded?)"))?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(':'))
            .collect();
        v.sort();
        Ok(v)
    }

    /// The first PCI function bound to `igb` (the PF whose VFs the cases use).
    pub fn discover() -> Result<Pf, String> {
        let pci = Self::igb_functions()?
            .into_iter()
            .next()
            .ok_or("no PCI device bound to igb: is QEMU started with -device igb?")?;
        let name = first_entry(&format!("{PCI}/{pci}/net")).ok_or("igb PF has no netdev")?;
        Ok(Pf { name, pci })
    }

    /// The second igb PF, the far end of the first one's wire (QEMU joins both to one hub).
    pub fn far_end() -> Option<Pf> {
        let pci = Self::igb_functions().ok()?.into_iter().nth(1)?;
        let name = first_entry(&format!("{PCI}/{pci}/net"))?;
        Some(Pf { name, pci })
    }

    /// Sets the PF admin state and waits for the carrier to follow.
    pub fn set_up(&self, up: bool) -> Result<(), String> {
        sh(&[
            "ip",
            "link",
            "set",
            &self.name,
            if up { "up" } else { "down" },
        ])?;
        let want = if up { "1" } else { "0" };
        let carrier = format!("/sys/class/net/{}/carrier", self.name);
        wait_for(Duration::from_secs(15), || {
            // Reading carrier of a down link is EINVAL: that is "no carrier" too.
            std::fs::read_to_string(&carrier)
                .map(|s| s.trim() == want)
                .unwrap_or(!up)
        })
        .map(drop)
        .ok_or_else(|| format!("PF {} carrier did not become {want}", self.name))
    }

    /// Waits until igb takes a VF rate change (it refuses them until it knows the link speed,
    /// which lags the carrier after the PF comes up or its VFs are created). Probes by setting
    /// VF 0's current maximum rate again, which changes nothing.
    pub fn wait_rate_ready(&self) -> Result<(), String> {
        let pf = self.name.clone();
        wait_for(Duration::from_secs(20), || {
            let max = self.vfinfo(0)["rate"]["max_tx"]
                .as_u64()
                .unwrap_or(0)
                .to_string();
            sh(&["ip", "link", "set", &pf, "vf", "0", "max_tx_rate", &max]).is_ok()
        })
        .map(drop)
        .ok_or_else(|| format!("PF {pf} refuses VF rate changes 20 s after link-up"))
    }

    /// Creates `n` VFs (after removing any) and waits until every one has its netdev.
    ///
    /// igbvf is bound only after the PF has been reopened with its VFs: Linux 6.1's igb enables
    /// SR-IOV before it reinitialises itself, so a VF probed inside `pci_enable_sriov` sends its
    /// reset over the mailbox while the PF still masks the mailbox interrupt and has not written
    /// `CTRL_EXT.PFRSTD`: the VF logs "PF still in reset state" and never gets carrier (fixed
    /// upstream by 50f303496d92 "igb: Enable SR-IOV after reinit", v6.3; docs/sriov.md).
    pub fn create_vfs(&self, n: u32) -> Result<(), String> {
        let numvfs = format!("{PCI}/{}/sriov_numvfs", self.pci);
        let autoprobe = format!("{PCI}/{}/sriov_drivers_autoprobe", self.pci);
        write_sys(&numvfs, "0")?;
        write_sys(&autoprobe, "0")?;
        write_sys(&numvfs, &n.to_string())?;
        let carrier = format!("/sys/class/net/{}/carrier", self.name);
        wait_for(Duration::from_secs(15), || {
            std::fs::read_to_string(&carrier).is_ok_and(|s| s.trim() == "1")
        })
        .ok_or_else(|| format!("PF {} has no carrier after creating its VFs", self.name))?;
        write_sys(&autoprobe, "1")?;
        for i in 0..n {
            let vf = self
                .vf_pci(i)
                .ok_or_else(|| format!("VF {i} of {} has no PCI function", self.name))?;
            write_sys(&format!("{PCI}/{vf}/driver_override"), "\n")?;
            write_sys("/sys/bus/pci/drivers_probe", &vf)?;
        }
        wait_for(Duration::from_secs(30), || {
            (0..n).all(|i| self.vf_pci(i).is_some_and(|p| vf_netdev(&p).is_some()))
        })
        .map(drop)
        .ok_or_else(|| format!("{n} VFs of {} did not all get a netdev", self.name))
    }

    /// PCI address of VF `i` (`virtfn<i>`).
    pub fn vf_pci(&self, i: u32) -> Option<String> {
        std::fs::read_link(format!("{PCI}/{}/virtfn{i}", self.pci))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    /// The `vfinfo_list` entry of VF `i` as `ip -j -d link show <pf>` prints it.
    pub fn vfinfo(&self, i: u32) -> Value {
        let v: Value = sh(&["ip", "-j", "-d", "link", "show", &self.name])
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(json!([]));
        v[0]["vfinfo_list"]
            .as_array()
            .and_then(|l| l.iter().find(|e| e["vf"] == i).cloned())
            .unwrap_or(Value::Null)
    }

    /// The full state of VF `i`.
    pub fn snap(&self, i: u32) -> VfSnap {
        let pci = self.vf_pci(i).unwrap_or_default();
        VfSnap {
            pf_side: self.vfinfo(i),
            driver: driver(&pci),
            netdev: vf_netdev(&pci)
                .map(|n| link_summary(None, &n))
                .unwrap_or(Value::Null),
        }
    }
}

fn first_entry(dir: &str) -> Option<String> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .min()
}

/// The VF's netdev name in the root netns (sysfs `net/`), if any.
pub fn vf_netdev(pci: &str) -> Option<String> {
    first_entry(&format!("{PCI}/{pci}/net"))
}

/// The driver bound to a PCI function ("" when none).
pub fn driver(pci: &str) -> String {
    std::fs::read_link(format!("{PCI}/{pci}/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

/// Binds a PCI function to `drv` through driver_override ("" = back to the default driver).
pub fn rebind(pci: &str, drv: &str) -> Result<(), String> {
    write_sys(&format!("{PCI}/{pci}/driver_override"), &format!("{drv}\n"))?;
    if !driver(pci).is_empty() {
        write_sys(&format!("{PCI}/{pci}/driver/unbind"), pci)?;
    }
    write_sys("/sys/bus/pci/drivers_probe", pci)?;
    Ok(())
}

/// `{"ifname","address","mtu","up"}` of a link in netns `ns` (root when None), Null if absent.
pub fn link_summary(ns: Option<&str>, name: &str) -> Value {
    let mut a = Vec::new();
    if let Some(ns) = ns {
        a.extend(["-n", ns]);
    }
    a.extend(["-j", "link", "show", "dev", name]);
    let mut args = vec!["ip"];
    args.extend(a);
    let v: Value = sh(&args)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(json!([]));
    let l = &v[0];
    if l.is_null() {
        return Value::Null;
    }
    let up = l["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == "UP"));
    json!({"ifname": l["ifname"], "address": l["address"], "mtu": l["mtu"], "up": up})
}

/// A directory for one case: the sriov state dir, plexus' files.
pub struct CaseDir(pub PathBuf);

impl CaseDir {
    /// A path inside it.
    pub fn p(&self, s: &str) -> PathBuf {
        self.0.join(s)
    }
    /// The sriov state directory.
    pub fn state(&self) -> PathBuf {
        self.p("sriov-state")
    }
    /// Runs the real `sriov` binary in the root netns (where the PF is), with the real sysfs
    /// and netlink, `CNI_PATH=/usr/lib/cni` (Debian's static IPAM).
    pub fn sriov(&self, cmd: &str, cid: &str, netns: &str, conf: &Value) -> Run {
        let state = self.state();
        let call = Call {
            command: cmd,
            container_id: cid,
            netns,
            ifname: "net1",
            args: "",
        };
        run(
            &bin("sriov"),
            &call,
            conf,
            &[("PLEXUS_SRIOV_STATE_DIR", state.to_str().unwrap_or(""))],
        )
    }
    /// Saved attachments in the state dir (json files, not locks or the allocation table).
    pub fn saved(&self) -> Vec<String> {
        std::fs::read_dir(self.state())
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json") && !n.starts_with("alloc"))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A sriov-cni style NAD for VF `pci` with a fixed IP (Debian's `static` IPAM) plus `extra`.
pub fn nad(pci: &str, extra: Value) -> Value {
    let mut v = json!({"cniVersion":"1.0.0","name":"bank-sriov","type":"sriov","deviceID":pci,
        "ipam":{"type":"static","addresses":[{"address":"10.56.217.10/24","gateway":"10.56.217.1"}],
                "routes":[{"dst":"10.56.0.0/16"}]}});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in e {
            o.insert(k.clone(), x.clone());
        }
    }
    v
}

/// True when `path` exists.
pub fn exists(path: impl AsRef<Path>) -> bool {
    path.as_ref().exists()
}
