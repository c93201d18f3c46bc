//! IPv6 duplicate address detection (DAD) of the addresses ADD put on the VF.
//!
//! The kernel adds an IPv6 address tentative and probes the link for it (one neighbour
//! solicitation, answered within `retrans_time`, after a random delay of up to
//! `rtr_solicit_delay`: 0–2 s with the defaults). While tentative the address takes no traffic;
//! when another host answers, the kernel keeps it marked `dadfailed` and never uses it, and
//! nothing tells the runtime. So ADD waits for DAD to end (as the reference bridge plugin's
//! `SettleAddresses` does) and fails, naming the address and the interface, when it failed.
//! The neighbour announcement goes out only after that: an address another host still holds
//! must not be announced at this VF's MAC (peers would send the holder's traffic here).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::error::SriovError;
use crate::nl::{AddrState, Netlink};

/// How long ADD waits for DAD to end (the reference plugins wait 10 s).
pub const DAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the addresses are read while waiting.
const POLL: Duration = Duration::from_millis(20);

/// Where DAD of the wanted addresses stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every wanted IPv6 address is usable.
    Done,
    /// At least one is still tentative.
    Waiting,
    /// These failed DAD: another host on the link holds them.
    Failed(Vec<IpAddr>),
    /// This one is no longer on the interface.
    Gone(IpAddr),
}

/// The verdict for the IPv6 addresses of `wanted` (IPv4 ones have no DAD) given the
/// interface's address `states`.
pub fn verdict(states: &[AddrState], wanted: &[IpAddr]) -> Verdict {
    let mut failed = Vec::new();
    let mut waiting = false;
    for ip in wanted.iter().filter(|ip| ip.is_ipv6()) {
        match states.iter().find(|s| s.ip == *ip) {
            None => return Verdict::Gone(*ip),
            Some(s) if s.dad_failed => failed.push(*ip),
            Some(s) if s.tentative => waiting = true,
            Some(_) => {}
        }
    }
    if !failed.is_empty() {
        Verdict::Failed(failed)
    } else if waiting {
        Verdict::Waiting
    } else {
        Verdict::Done
    }
}

/// Waits until DAD of the IPv6 addresses among `wanted` on link `index` (`ifname` in the pod)
/// has ended, at most `timeout`; how long it took. Fails naming the addresses another host
/// holds, an address that vanished, or DAD still running at the deadline.
pub fn settle(
    pod: &mut Netlink,
    index: u32,
    ifname: &str,
    wanted: &[IpAddr],
    timeout: Duration,
) -> Result<Duration, SriovError> {
    let started = Instant::now();
    if !wanted.iter().any(IpAddr::is_ipv6) {
        return Ok(Duration::ZERO);
    }
    loop {
        let states = pod.address_states(index)?;
        match verdict(&states, wanted) {
            Verdict::Done => {
                let took = started.elapsed();
                tracing::debug!(ifname, ms = took.as_millis() as u64, "IPv6 DAD done");
                return Ok(took);
            }
            Verdict::Failed(ips) => {
                let list: Vec<String> = ips.iter().map(ToString::to_string).collect();
                return Err(SriovError::Other(format!(
                    "{} on {ifname}: another host on the link already holds it (the kernel \
                     marked it dadfailed); free it there or give this pod another address",
                    list.join(", ")
                )));
            }
            Verdict::Gone(ip) => {
                return Err(SriovError::Other(format!(
                    "IPv6 address {ip} vanished from {ifname} during duplicate address detection"
                )));
            }
            Verdict::Waiting if started.elapsed() >= timeout => {
                return Err(SriovError::Other(format!(
                    "IPv6 duplicate address detection on {ifname} did not end within {} s",
                    timeout.as_secs()
                )));
            }
            Verdict::Waiting => std::thread::sleep(POLL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(ip: &str, tentative: bool, dad_failed: bool) -> AddrState {
        AddrState {
            ip: ip.parse().unwrap(),
            tentative,
            dad_failed,
        }
    }

    fn ips(v: &[&str]) -> Vec<IpAddr> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn ipv4_only_and_settled_addresses_are_done() {
        let states = [
            st("10.0.0.5", false, false),
            st("2001:db8::a", false, false),
        ];
        assert_eq!(verdict(&states, &ips(&["10.0.0.5"])), Verdict::Done);
        assert_eq!(
            verdict(&states, &ips(&["10.0.0.5", "2001:db8::a"])),
            Verdict::Done
        );
        // An IPv4 address is not looked up at all (no DAD).
        assert_eq!(verdict(&[], &ips(&["10.0.0.9"])), Verdict::Done);
    }

    #[test]
    fn tentative_waits_and_dadfailed_fails_naming_the_address() {
        let waiting = [st("2001:db8::a", true, false)];
        assert_eq!(verdict(&waiting, &ips(&["2001:db8::a"])), Verdict::Waiting);
        // The kernel keeps a failed address tentative and dadfailed: failed wins.
        let failed = [
            st("2001:db8::a", true, true),
            st("2001:db8::b", true, false),
        ];
        assert_eq!(
            verdict(&failed, &ips(&["2001:db8::b", "2001:db8::a"])),
            Verdict::Failed(ips(&["2001:db8::a"]))
        );
        assert_eq!(
            verdict(&[], &ips(&["2001:db8::a"])),
            Verdict::Gone("2001:db8::a".parse().unwrap())
        );
    }

    #[test]
    fn the_same_address_in_another_spelling_is_matched() {
        let states = [st("2001:db8::a", false, true)];
        assert_eq!(
            verdict(&states, &ips(&["2001:0db8:0:0::a"])),
            Verdict::Failed(ips(&["2001:db8::a"]))
        );
    }
}
