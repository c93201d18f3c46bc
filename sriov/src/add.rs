//! ADD: validate and look everything up, save the original state, then apply with an undo stack.

use std::fs::File;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use plexus_conf::result::{CniResult, Interface};
use plexus_delegates::ipam;
use plexus_delegates::netns::NetNs;
use plexus_delegates::skel::CmdArgs;

use crate::ctx::Ctx;
use crate::error::SriovError;
use crate::ipconf::{self, mac6, parse_cidr};
use crate::netconf::NetConf;
use crate::nl::{Link, Netlink};
use crate::owner;
use crate::pf::MacAddr;
use crate::restore::{self, PfField};
use crate::sysfs::VfMode;
use crate::vf_state::{Allocation, Applied, NetdevOrig, VfState};

/// How often and how long to re-read the admin MAC after setting it (i40e/iavf apply it
/// asynchronously; sriov-cni retries 20 x 100 ms).
const MAC_VERIFY_TRIES: u32 = 20;
const MAC_VERIFY_PAUSE: Duration = Duration::from_millis(100);

/// An applied step and how to undo it.
#[derive(Debug)]
enum Undo {
    /// Remove the state file written before any change.
    RemoveState,
    /// Restore one PF-side field.
    Pf(PfField),
    /// Give the netdev (still in the host) its original MAC back.
    HostMac,
    /// Move the netdev back to the host under its original name.
    NetdevBack,
    /// Release the IPAM allocation.
    IpamDel,
}

struct Adder<'c, 'a> {
    ctx: &'c Ctx<'a>,
    args: &'c CmdArgs,
    conf: &'c NetConf,
    st: VfState,
    undo: Vec<Undo>,
    host: Option<Netlink>,
    pod: Option<Netlink>,
    pod_ns: Option<NetNs>,
    host_fd: Option<File>,
    pod_fd: Option<File>,
    /// Index of the VF netdev inside the pod.
    pod_index: u32,
}

fn open_file(p: &Path, what: &'static str) -> Result<File, SriovError> {
    File::open(p).map_err(|e| SriovError::io(what, p, e))
}

fn ns_err(e: plexus_delegates::netns::NetNsError) -> SriovError {
    SriovError::Other(e.to_string())
}

/// Runs ADD. On failure everything applied is undone and the error names the VF, the step and
/// the cause (plus any undo that failed in turn).
pub fn add(ctx: &Ctx<'_>, args: &CmdArgs, conf: &NetConf) -> Result<CniResult, SriovError> {
    let vf_pci = conf
        .device_id
        .clone()
        .ok_or_else(|| SriovError::Config("deviceID (VF PCI address) is required".into()))?;
    let mut loc = ctx.sysfs.find_vf(&vf_pci)?;
    let _lock = ctx.store.lock_vf(&vf_pci)?;

    let claim = owner::claim(ctx, args, &vf_pci)?;
    if claim != owner::Claim::Free {
        loc = ctx.sysfs.find_vf(&vf_pci)?;
    }
    let mut mode = loc.mode()?;
    if let (VfMode::Netdev(_), owner::Claim::TookOver(Some(name))) = (&mode, &claim) {
        // The release just renamed the netdev back; sysfs may not have caught up (a fake
        // tree never does), the restored name is authoritative.
        mode = VfMode::Netdev(name.clone());
    }

    let applied = Applied {
        vlan: conf.vlan.is_some(),
        mac: conf.mac.is_some(),
        rate: conf.rate.is_some(),
        spoofchk: conf.spoofchk.is_some(),
        trust: conf.trust.is_some(),
        link_state: conf.link_state.is_some(),
    };
    let orig_pf = ctx
        .pf
        .get_vf(&loc.pf_netdev, loc.vf_index)
        .map_err(|e| SriovError::from(e).at_step(&vf_pci, "read PF VF config"))?;
    let mut a = Adder {
        ctx,
        args,
        conf,
        st: VfState {
            container_id: args.container_id.clone(),
            ifname: args.ifname.clone(),
            netns: args.netns.clone(),
            vf_pci: vf_pci.clone(),
            pf: loc.pf_netdev.clone(),
            vf_index: loc.vf_index,
            userspace_driver: match &mode {
                VfMode::Userspace(d) => Some(d.clone()),
                VfMode::Netdev(_) => None,
            },
            orig_pf,
            applied,
            orig_netdev: None,
            ipam_type: conf.ipam_type.clone(),
            config: serde_json::from_slice(&args.stdin).unwrap_or(serde_json::Value::Null),
            complete: false,
        },
        undo: Vec::new(),
        host: None,
        pod: None,
        pod_ns: None,
        host_fd: None,
        pod_fd: None,
        pod_index: 0,
    };
    match a.run(&mode) {
        Ok(r) => {
            if let Some(f) = &conf.device_info_file {
                crate::devinfo::write(f, &vf_pci, &loc.pf_pci);
            }
            Ok(r)
        }
        Err((step, e)) => Err(a.rollback(step, e)),
    }
}

type StepResult<T> = Result<T, (String, SriovError)>;

fn at<T>(step: &str, r: Result<T, SriovError>) -> StepResult<T> {
    r.map_err(|e| (step.to_string(), e))
}

impl Adder<'_, '_> {
    fn run(&mut self, mode: &VfMode) -> StepResult<CniResult> {
        let netdev = match mode {
            VfMode::Netdev(name) => Some(at("prepare netdev", self.prepare_netdev(name))?),
            VfMode::Userspace(_) => {
                // No netdev to move, but the sandbox must exist (sriov-cni opens it too).
                at(
                    "open pod netns",
                    NetNs::open(&self.args.netns).map_err(ns_err),
                )?;
                None
            }
        };
        // Save the original state before the first change (sriov-cni writes it at the end, so
        // a failed or interrupted ADD could not be undone: #119, #212).
        at("save VF state", self.ctx.store.save(&self.st))?;
        self.undo.push(Undo::RemoveState);
        self.apply_pf()?;

        let mut result = CniResult {
            cni_version: self.conf.cni_version.clone(),
            ..CniResult::default()
        };
        let mut iface = Interface {
            name: self.args.ifname.clone(),
            sandbox: self.args.netns.clone(),
            pci_id: self.st.vf_pci.clone(),
            ..Interface::default()
        };
        if let Some(link) = &netdev {
            let l = self.attach_netdev(link)?;
            iface.mac = MacAddr(mac6(&l.mac)).to_string();
            iface.mtu = Some(l.mtu);
        } else {
            // DPDK: report the admin MAC when set and the PF's MTU, as sriov-cni does (best
            // effort: the VF has no netdev of its own).
            let mac = self.conf.mac.unwrap_or(self.st.orig_pf.mac);
            if !mac.is_zero() {
                iface.mac = mac.to_string();
            }
            iface.mtu = Netlink::open()
                .and_then(|mut nl| nl.link_by_name(&self.st.pf))
                .ok()
                .flatten()
                .map(|l| l.mtu);
        }
        if let Some(t) = self.conf.ipam_type.clone() {
            let r = at(
                "IPAM ADD",
                ipam::add(&t, self.args, &self.args.stdin, &self.conf.cni_version)
                    .map_err(SriovError::Ipam),
            )?;
            self.undo.push(Undo::IpamDel);
            result.ips = r.ips;
            result.routes = r.routes;
            result.dns = r.dns;
            for ip in &mut result.ips {
                ip.interface = Some(0);
            }
            if netdev.is_some() {
                at("configure addresses and routes", self.configure_ip(&result))?;
                at("IPv6 duplicate address detection", self.settle_dad(&result))?;
            }
        }
        result.interfaces = vec![iface];

        self.st.complete = true;
        at("save VF state", self.ctx.store.save(&self.st))?;
        at(
            "record allocation",
            self.ctx.store.set_allocation(
                &self.st.vf_pci,
                &Allocation {
                    container_id: self.st.container_id.clone(),
                    ifname: self.st.ifname.clone(),
                    netns: self.st.netns.clone(),
                },
            ),
        )?;
        if netdev.is_some() && !result.ips.is_empty() {
            self.announce(&result);
        }
        Ok(result)
    }

    /// Opens both netlink handles, checks the pod ifname is free and records the netdev's
    /// original name, MAC, MTU and index.
    fn prepare_netdev(&mut self, name: &str) -> Result<Link, SriovError> {
        let pod_ns = NetNs::open(&self.args.netns).map_err(ns_err)?;
        self.pod_fd = Some(open_file(Path::new(&self.args.netns), "open pod netns")?);
        self.host_fd = Some(open_file(
            Path::new("/proc/thread-self/ns/net"),
            "open host netns",
        )?);
        let mut host = Netlink::open()?;
        let mut pod = pod_ns.run(Netlink::open).map_err(ns_err)??;
        let link = host.link_by_name(name)?.ok_or_else(|| {
            SriovError::Other(format!(
                "VF netdev {name} is not in this (host) network namespace; is the VF in use elsewhere?"
            ))
        })?;
        if pod.link_by_name(&self.args.ifname)?.is_some() {
            return Err(SriovError::Other(format!(
                "interface {} already exists in {}",
                self.args.ifname, self.args.netns
            )));
        }
        self.st.orig_netdev = Some(NetdevOrig {
            name: link.name.clone(),
            mac: MacAddr(mac6(&link.mac)),
            mtu: link.mtu,
            ifindex: link.index,
        });
        self.host = Some(host);
        self.pod = Some(pod);
        self.pod_ns = Some(pod_ns);
        Ok(link)
    }

    /// PF-side settings in sriov-cni's order: VLAN, MAC, rate, spoofchk, trust, link state.
    fn apply_pf(&mut self) -> StepResult<()> {
        let (pf, vf, c) = (self.st.pf.clone(), self.st.vf_index, self.conf);
        let p = self.ctx.pf;
        if let Some(v) = c.vlan {
            at(
                "set VF vlan",
                p.set_vf_vlan(&pf, vf, v.id, v.qos, v.proto)
                    .map_err(Into::into),
            )?;
            self.undo.push(Undo::Pf(PfField::Vlan));
        }
        if let Some(mac) = c.mac {
            self.set_own_mac_first(mac)?;
            at(
                "set VF admin MAC",
                p.set_vf_mac(&pf, vf, mac).map_err(Into::into),
            )?;
            self.undo.push(Undo::Pf(PfField::Mac));
            at("verify VF admin MAC", self.verify_admin_mac(mac))?;
        }
        if let Some(r) = c.rate {
            at(
                "set VF tx rate",
                p.set_vf_rate(&pf, vf, r.min, r.max).map_err(Into::into),
            )?;
            self.undo.push(Undo::Pf(PfField::Rate));
        }
        if let Some(on) = c.spoofchk {
            at(
                "set VF spoofchk",
                p.set_vf_spoofchk(&pf, vf, on).map_err(Into::into),
            )?;
            self.undo.push(Undo::Pf(PfField::SpoofChk));
        }
        if let Some(on) = c.trust {
            at(
                "set VF trust",
                p.set_vf_trust(&pf, vf, on).map_err(Into::into),
            )?;
            self.undo.push(Undo::Pf(PfField::Trust));
        }
        if let Some(s) = c.link_state {
            at(
                "set VF link state",
                p.set_vf_link_state(&pf, vf, s).map_err(Into::into),
            )?;
            self.undo.push(Undo::Pf(PfField::LinkState));
        }
        Ok(())
    }

    /// Gives the netdev (still in the host) the MAC `want` before the PF pins it as the admin
    /// MAC. Once a PF pins a VF's MAC, igb refuses any MAC change the (untrusted) VF asks for,
    /// the same value included (EADDRNOTAVAIL), so asking afterwards, as sriov-cni does, fails;
    /// other drivers take it either way. A MAC the PF pinned before the pod is cleared (zero)
    /// first, restored by the undo of the admin MAC. Best effort: a driver that still refuses is
    /// reported by [`Self::attach_netdev`], which sets the MAC again only when it differs.
    fn set_own_mac_first(&mut self, want: MacAddr) -> StepResult<()> {
        let (Some(host), Some(orig)) = (self.host.as_mut(), self.st.orig_netdev.as_ref()) else {
            return Ok(()); // no netdev (userspace driver)
        };
        if orig.mac == want {
            return Ok(());
        }
        let index = orig.ifindex;
        if host.set_mac(index, &want.0).is_ok() {
            self.undo.push(Undo::HostMac);
            return Ok(());
        }
        let (pf, vf) = (self.st.pf.clone(), self.st.vf_index);
        if self.st.orig_pf.mac.is_zero() {
            return Ok(());
        }
        at(
            "clear VF admin MAC",
            self.ctx
                .pf
                .set_vf_mac(&pf, vf, MacAddr::default())
                .map_err(Into::into),
        )?;
        self.undo.push(Undo::Pf(PfField::Mac));
        if let Some(host) = self.host.as_mut() {
            if host.set_mac(index, &want.0).is_ok() {
                self.undo.push(Undo::HostMac);
            }
        }
        Ok(())
    }

    fn verify_admin_mac(&self, want: MacAddr) -> Result<(), SriovError> {
        let mut last = MacAddr::default();
        for i in 0..MAC_VERIFY_TRIES {
            last = self.ctx.pf.get_vf(&self.st.pf, self.st.vf_index)?.mac;
            if last == want {
                return Ok(());
            }
            if i + 1 < MAC_VERIFY_TRIES {
                std::thread::sleep(MAC_VERIFY_PAUSE);
            }
        }
        Err(SriovError::Other(format!(
            "PF reports admin MAC {last}, want {want}"
        )))
    }

    /// Moves the netdev into the pod as CNI_IFNAME, sets MAC/MTU, enables notifications and
    /// brings it up. Returns the link as seen in the pod.
    fn attach_netdev(&mut self, link: &Link) -> StepResult<Link> {
        let (Some(host), Some(pod_fd)) = (self.host.as_mut(), self.pod_fd.as_ref()) else {
            return Err((
                "attach netdev".into(),
                SriovError::Other("netdev not prepared".into()),
            ));
        };
        at(
            "set netdev down",
            host.set_up(link.index, false).map_err(Into::into),
        )?;
        if link.altnames.contains(&self.args.ifname) {
            // A device cannot take a name it already carries as an altname (a stale one from
            // an earlier pod, sriov-cni #445): drop it.
            at(
                "delete stale altname",
                host.del_altname(link.index, &self.args.ifname)
                    .map_err(Into::into),
            )?;
        }
        at(
            "move netdev into pod netns",
            host.set_netns(link.index, pod_fd, Some(&self.args.ifname))
                .map_err(Into::into),
        )?;
        self.undo.push(Undo::NetdevBack);
        let ifname = self.args.ifname.clone();
        let Some(pod) = self.pod.as_mut() else {
            return Err((
                "attach netdev".into(),
                SriovError::Other("no pod handle".into()),
            ));
        };
        let l = at(
            "find netdev in pod",
            pod.link_by_name(&ifname).map_err(Into::into),
        )?
        .ok_or_else(|| {
            (
                "find netdev in pod".to_string(),
                SriovError::Other(format!("{ifname} not found after the move")),
            )
        })?;
        self.pod_index = l.index;
        if let Some(orig) = &self.st.orig_netdev {
            if l.altnames.contains(&orig.name) {
                // The host name as an altname would block the move back (sriov-cni #250).
                at(
                    "delete host-name altname",
                    pod.del_altname(l.index, &orig.name).map_err(Into::into),
                )?;
            }
        }
        if let Some(mac) = self.conf.mac.filter(|m| m.0[..] != l.mac[..]) {
            at(
                "set netdev MAC",
                pod.set_mac(l.index, &mac.0).map_err(Into::into),
            )?;
        }
        if let Some(mtu) = self.conf.mtu {
            at(
                "set netdev MTU",
                pod.set_mtu(l.index, mtu).map_err(Into::into),
            )?;
        }
        if let Some(ns) = &self.pod_ns {
            // Best effort, as sriov-cni: the kernel sends GARP/NA on link-up and MAC changes.
            let _ = ns.run(|| crate::garp::enable_notify(&ifname));
        }
        at(
            "set netdev up",
            pod.set_up(l.index, true).map_err(Into::into),
        )?;
        let l = at(
            "read netdev in pod",
            pod.link_by_index(l.index).map_err(Into::into),
        )?
        .unwrap_or(l);
        Ok(l)
    }

    fn configure_ip(&mut self, r: &CniResult) -> Result<(), SriovError> {
        let pod = self
            .pod
            .as_mut()
            .ok_or_else(|| SriovError::Other("no pod handle".into()))?;
        ipconf::configure(pod, self.pod_index, r)
    }

    /// Waits for the kernel's duplicate address detection of the IPv6 addresses of `r`
    /// ([`crate::dad`]): an address another host holds fails the ADD instead of staying on the
    /// VF unusable, and is never announced.
    fn settle_dad(&mut self, r: &CniResult) -> Result<(), SriovError> {
        let ips: Vec<IpAddr> = r
            .ips
            .iter()
            .filter_map(|i| parse_cidr(&i.address).ok().map(|a| a.ip))
            .collect();
        let (idx, ifname) = (self.pod_index, self.args.ifname.clone());
        let pod = self
            .pod
            .as_mut()
            .ok_or_else(|| SriovError::Other("no pod handle".into()))?;
        crate::dad::settle(pod, idx, &ifname, &ips, crate::dad::DAD_TIMEOUT).map(drop)
    }

    fn announce(&self, r: &CniResult) {
        let Some(ns) = &self.pod_ns else { return };
        let ips: Vec<IpAddr> = r
            .ips
            .iter()
            .filter_map(|i| parse_cidr(&i.address).ok().map(|a| a.ip))
            .collect();
        let ifname = self.args.ifname.clone();
        let idx = self.pod_index;
        match ns.run(|| crate::garp::announce(&ifname, idx, &ips)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "gratuitous ARP / unsolicited NA failed"),
            Err(e) => tracing::warn!(error = %e, "gratuitous ARP / unsolicited NA failed"),
        }
    }

    /// Unwinds the undo stack in reverse and builds the final error.
    fn rollback(mut self, step: String, cause: SriovError) -> SriovError {
        let mut failed = Vec::new();
        let mut undos = std::mem::take(&mut self.undo);
        undos.reverse();
        // The admin MAC goes back first, as on DEL: while the PF pins another admin MAC an
        // untrusted VF's own MAC cannot be changed (i40e/iavf).
        undos.sort_by_key(|u| !matches!(u, Undo::Pf(PfField::Mac)));
        for u in undos {
            if matches!(u, Undo::RemoveState) && !failed.is_empty() {
                // Something could not be undone: keep the saved original state so that the
                // runtime's DEL finishes the restore (and the VF stays marked as taken).
                tracing::error!("rollback incomplete: keeping the VF state for DEL");
                continue;
            }
            if let Err(e) = self.undo_one(&u) {
                tracing::error!(?u, error = %e, "rollback step failed");
                failed.push(format!("undo {u:?}: {e}"));
            }
        }
        if failed.is_empty() && self.st.applied.mac {
            if let Err(e) = restore::settle_admin_mac(self.ctx.pf, &self.st) {
                failed.push(format!("restore admin MAC: {e}"));
            }
        }
        SriovError::Step {
            vf: self.st.vf_pci.clone(),
            step,
            source: Box::new(cause),
            rollback: failed,
        }
    }

    fn undo_one(&mut self, u: &Undo) -> Result<(), SriovError> {
        match u {
            Undo::RemoveState => self
                .ctx
                .store
                .remove(&self.st.container_id, &self.st.ifname),
            Undo::Pf(f) => restore::restore_pf_field(self.ctx.pf, &self.st, *f),
            Undo::IpamDel => match &self.conf.ipam_type {
                Some(t) => ipam::del(t, self.args, &self.args.stdin).map_err(SriovError::Ipam),
                None => Ok(()),
            },
            Undo::HostMac => {
                let (Some(host), Some(orig)) = (self.host.as_mut(), self.st.orig_netdev.as_ref())
                else {
                    return Err(SriovError::Other("netdev state missing".into()));
                };
                // Gone from the host means it was moved: NetdevBack restores its MAC.
                match host.link_by_index(orig.ifindex)? {
                    Some(l) if l.mac != orig.mac.0 => {
                        host.set_mac(orig.ifindex, &orig.mac.0).map_err(Into::into)
                    }
                    _ => Ok(()),
                }
            }
            Undo::NetdevBack => {
                let (Some(pod), Some(host_fd), Some(orig)) = (
                    self.pod.as_mut(),
                    self.host_fd.as_ref(),
                    self.st.orig_netdev.as_ref(),
                ) else {
                    return Err(SriovError::Other("netdev state missing".into()));
                };
                let link = pod
                    .link_by_name(&self.args.ifname)?
                    .ok_or_else(|| SriovError::Other(format!("{} not in pod", self.args.ifname)))?;
                restore::move_back(pod, &link, host_fd, orig)
            }
        }
    }
}
