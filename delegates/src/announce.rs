//! Neighbour announcements: a gratuitous ARP per IPv4 address and an unsolicited neighbour
//! advertisement per IPv6 address of an interface, so a peer whose neighbour entry still names
//! the address' previous holder (a StatefulSet replica recreated with its fixed address and a
//! new MAC, a reused lease, a VF handed to the next pod) reaches the new one at once instead of
//! after its entry goes stale and is re-probed (measured on the real node tier: 6 s to over
//! 20 s). Used by the `sriov` delegate and by plexus after every ADD. Must run on a thread
//! inside the pod netns (sockets are per netns). Best effort: callers log failures.

// Sending to a link-layer address needs a `sockaddr_ll`, and an interface's index and MAC come
// from ioctls on an `ifreq`: neither has a safe constructor in nix.
#![allow(unsafe_code)]

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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

fn send_garp(fd: &OwnedFd, ifindex: u32, mac: [u8; 6], ip: Ipv4Addr) -> io::Result<()> {
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

fn send_na(fd: &OwnedFd, ifindex: u32, mac: [u8; 6], ip: Ipv6Addr) -> io::Result<()> {
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

/// Sockets for announcements, opened on first use and shared by every announcement of one
/// call: closing an `AF_PACKET` socket waits for an RCU grace period (`packet_release` calls
/// `synchronize_net`, measured 7–15 ms each here), so one per call, not one per address.
#[derive(Default)]
pub struct Announcer {
    packet: Option<OwnedFd>,
    icmpv6: Option<OwnedFd>,
}

impl Announcer {
    /// Close the sockets on a thread of their own, so that the RCU grace period an
    /// `AF_PACKET` close waits for (see above) is not on the caller's path: in the daemon it
    /// is off every call's path, in a plexus process it overlaps the API writes that follow.
    pub fn close_in_background(self) {
        if self.packet.is_none() && self.icmpv6.is_none() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("announce-close".into())
            .spawn(move || drop(self));
        if let Err(e) = spawned {
            // The closure was dropped with the error: the sockets are closed already.
            tracing::debug!(error = %e, "no thread to close the announcement sockets");
        }
    }

    /// Send the announcement for `ip` (gratuitous ARP or unsolicited NA) on interface
    /// `ifindex` with hardware address `mac`.
    pub fn send(&mut self, ifindex: u32, mac: [u8; 6], ip: IpAddr) -> io::Result<()> {
        match ip {
            IpAddr::V4(v4) => {
                if self.packet.is_none() {
                    self.packet = Some(sock(libc::AF_PACKET, libc::SOCK_DGRAM, 0)?);
                }
                let fd = self.packet.as_ref().expect("opened above");
                send_garp(fd, ifindex, mac, v4)
            }
            IpAddr::V6(v6) => {
                if self.icmpv6.is_none() {
                    self.icmpv6 = Some(sock(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6)?);
                }
                let fd = self.icmpv6.as_ref().expect("opened above");
                send_na(fd, ifindex, mac, v6)
            }
        }
    }

    /// Announce each of `ips` on `ifname` of the current netns; how many were sent. An
    /// interface that takes no announcement (see [`interface`]) gets none; errors name the
    /// address.
    pub fn announce(&mut self, ifname: &str, ips: &[IpAddr]) -> Result<usize, String> {
        if ips.is_empty() {
            return Ok(0);
        }
        let Some((index, mac)) = interface(ifname).map_err(|e| format!("{ifname}: {e}"))? else {
            return Ok(0);
        };
        let errs: Vec<String> = ips
            .iter()
            .filter_map(|ip| {
                self.send(index, mac, *ip)
                    .err()
                    .map(|e| format!("{ip}: {e}"))
            })
            .collect();
        if errs.is_empty() {
            Ok(ips.len())
        } else {
            Err(format!("announce on {ifname}: {}", errs.join(", ")))
        }
    }
}

fn ifreq(ifname: &str) -> io::Result<libc::ifreq> {
    let name = ifname.as_bytes();
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {ifname:?}"),
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

fn ioctl(fd: &OwnedFd, request: libc::Ioctl, ifname: &str) -> io::Result<libc::ifreq> {
    let mut req = ifreq(ifname)?;
    // SAFETY: `req` is a valid, named ifreq; these SIOCGIF* requests only fill it in.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, &mut req as *mut libc::ifreq) };
    check(rc as isize)?;
    Ok(req)
}

/// `ifname`'s index and MAC in the current netns, or `None` when it takes no announcement
/// (loopback, `NOARP`, not Ethernet).
pub fn interface(ifname: &str) -> io::Result<Option<(u32, [u8; 6])>> {
    let fd = sock(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let flags_req = ioctl(&fd, libc::SIOCGIFFLAGS as libc::Ioctl, ifname)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member.
    let flags = i32::from(unsafe { flags_req.ifr_ifru.ifru_flags });
    if flags & (libc::IFF_LOOPBACK | libc::IFF_NOARP) != 0 {
        return Ok(None);
    }
    let hw_req = ioctl(&fd, libc::SIOCGIFHWADDR as libc::Ioctl, ifname)?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member.
    let hw = unsafe { hw_req.ifr_ifru.ifru_hwaddr };
    if hw.sa_family != libc::ARPHRD_ETHER {
        return Ok(None);
    }
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    let index_req = ioctl(&fd, libc::SIOCGIFINDEX as libc::Ioctl, ifname)?;
    // SAFETY: SIOCGIFINDEX filled the ifindex member.
    let index = unsafe { index_req.ifr_ifru.ifru_ifindex };
    Ok(Some((index as u32, mac)))
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

    #[test]
    fn names_are_checked_and_nothing_to_announce_is_no_work() {
        assert!(ifreq("").is_err());
        assert!(ifreq("sixteen-chars-16").is_err());
        assert_eq!(Announcer::default().announce("no-such-if", &[]), Ok(0));
        // The loopback takes no announcement.
        assert_eq!(interface("lo").unwrap(), None);
    }
}
