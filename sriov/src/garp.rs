//! Neighbour announcements after ADD: the `arp_notify`/`ndisc_notify` sysctls, then (once the
//! VF has carrier) a gratuitous ARP per IPv4 address and an unsolicited neighbour advertisement
//! per IPv6 address (`plexus_delegates::announce`). Best effort, as in sriov-cni: callers log
//! failures and carry on.
//!
//! Must run on a thread inside the pod netns (sysctls under /proc/sys/net and sockets are
//! per-netns).

use std::net::IpAddr;

use plexus_delegates::announce;

use crate::error::SriovError;

/// Writes 1 to `arp_notify`, `ndisc_notify` and `optimistic_dad` of `ifname` (errors ignored:
/// IPv6 may be disabled).
pub fn enable_notify(ifname: &str) {
    for p in [
        format!("/proc/sys/net/ipv4/conf/{ifname}/arp_notify"),
        format!("/proc/sys/net/ipv6/conf/{ifname}/ndisc_notify"),
        format!("/proc/sys/net/ipv6/conf/{ifname}/optimistic_dad"),
    ] {
        if let Err(e) = std::fs::write(&p, b"1") {
            tracing::debug!(path = %p, error = %e, "sysctl not set");
        }
    }
}

/// Waits briefly for carrier (≤ 200 ms, as sriov-cni) then announces every address.
pub fn announce(ifname: &str, ifindex: u32, ips: &[IpAddr]) -> Result<(), SriovError> {
    let mut nl = crate::nl::Netlink::open()?;
    let mut pause = std::time::Duration::from_millis(2);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    let link = loop {
        let l = nl
            .link_by_index(ifindex)?
            .ok_or_else(|| SriovError::Other(format!("{ifname} vanished before announcing")))?;
        if l.carrier != Some(false) || std::time::Instant::now() >= deadline {
            break l;
        }
        std::thread::sleep(pause);
        pause = pause.mul_f32(1.5);
    };
    let mac = crate::ipconf::mac6(&link.mac);
    let mut errs = Vec::new();
    let mut announcer = announce::Announcer::default();
    for ip in ips {
        if let Err(e) = announcer.send(ifindex, mac, *ip) {
            errs.push(format!("{ip}: {e}"));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(SriovError::Other(format!(
            "announce on {ifname}: {}",
            errs.join(", ")
        )))
    }
}
