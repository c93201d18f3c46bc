//! Neighbour announcements after ADD: the `arp_notify`/`ndisc_notify` sysctls, a gratuitous
//! ARP per IPv4 address and an unsolicited neighbour advertisement per IPv6 address. Best
//! effort, as in sriov-cni: callers log failures and carry on.
//!
//! Must run on a thread inside the pod netns (sysctls under /proc/sys/net and sockets are
//! per-netns).

// Sending to a link-layer address needs a `sockaddr_ll`, which has no safe constructor in nix.
#![allow(unsafe_code)]

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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

fn sock(domain: i32, ty: i32, proto: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) has no memory-safety preconditions; a non-negative return is a fresh fd
    // that we own exclusively.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a valid, open descriptor returned just above and not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(rc: isize) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The ARP request a gratuitous ARP is made of (sender IP = target IP, broadcast target).
pub fn garp_packet(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    let mut p = Vec::with_capacity(28);
    p.extend_from_slice(&1u16.to_be_bytes()); // htype Ethernet
    p.extend_from_slice(&0x0800u16.to_be_bytes()); // ptype IPv4
    p.extend_from_slice(&[6, 4]);
    p.extend_from_slice(&1u16.to_be_bytes()); // ARP request
    p.extend_from_slice(&mac);
    p.extend_from_slice(&ip.octets());
    p.extend_from_slice(&[0xff; 6]);
    p.extend_from_slice(&ip.octets());
    p
}

/// An unsolicited NA (type 136, Override flag, target link-layer address option).
pub fn unsolicited_na_packet(mac: [u8; 6], ip: Ipv6Addr) -> Vec<u8> {
    let mut p = Vec::with_capacity(32);
    p.extend_from_slice(&[136, 0, 0, 0]); // type, code, checksum (kernel fills it)
    p.extend_from_slice(&0x2000_0000u32.to_be_bytes()); // Override
    p.extend_from_slice(&ip.octets());
    p.extend_from_slice(&[2, 1]); // option: target link-layer address, 8 bytes
    p.extend_from_slice(&mac);
    p
}

fn send_garp(ifindex: u32, mac: [u8; 6], ip: Ipv4Addr) -> io::Result<()> {
    let fd = sock(libc::AF_PACKET, libc::SOCK_DGRAM, 0)?;
    let pkt = garp_packet(mac, ip);
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = (libc::ETH_P_ARP as u16).to_be();
    sll.sll_ifindex = ifindex as i32;
    sll.sll_halen = 6;
    sll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
    // SAFETY: buffer pointer/length come from a live Vec; the address points to a properly
    // initialised sockaddr_ll of the size passed.
    let rc = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    check(rc)
}

fn send_na(ifindex: u32, mac: [u8; 6], ip: Ipv6Addr) -> io::Result<()> {
    let fd = sock(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6)?;
    let hops: libc::c_int = 255;
    let ifi: libc::c_int = ifindex as i32;
    for (opt, val) in [
        (libc::IPV6_MULTICAST_HOPS, &hops),
        (libc::IPV6_MULTICAST_IF, &ifi),
    ] {
        // SAFETY: the option value is a live c_int of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_IPV6,
                opt,
                (val as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            )
        };
        check(rc as isize)?;
    }
    let pkt = unsolicited_na_packet(mac, ip);
    // SAFETY: sockaddr_in6 is plain old data; all-zero is a valid value.
    let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    sa.sin6_family = libc::AF_INET6 as u16;
    sa.sin6_addr.s6_addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1).octets();
    sa.sin6_scope_id = ifindex;
    // SAFETY: as in send_garp, with a sockaddr_in6.
    let rc = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            pkt.as_ptr().cast(),
            pkt.len(),
            0,
            (&sa as *const libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as u32,
        )
    };
    check(rc)
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
    for ip in ips {
        let r = match ip {
            IpAddr::V4(v4) => send_garp(ifindex, mac, *v4),
            IpAddr::V6(v6) => send_na(ifindex, mac, *v6),
        };
        if let Err(e) = r {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_have_the_wire_layout() {
        let mac = [2, 0, 0, 0, 0, 9];
        let g = garp_packet(mac, Ipv4Addr::new(10, 0, 0, 5));
        assert_eq!(g.len(), 28);
        assert_eq!(&g[6..8], &[0, 1]);
        assert_eq!(&g[14..18], &[10, 0, 0, 5]);
        assert_eq!(&g[24..28], &[10, 0, 0, 5]);
        assert_eq!(&g[18..24], &[0xff; 6]);
        let n = unsolicited_na_packet(mac, "fd00::5".parse().unwrap());
        assert_eq!(n.len(), 32);
        assert_eq!(n[0], 136);
        assert_eq!(&n[4..8], &[0x20, 0, 0, 0]);
        assert_eq!(&n[26..32], &mac);
    }
}
