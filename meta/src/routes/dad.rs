//! IPv6 duplicate address detection in the pod, waited for after ADD. A kernel address is
//! *tentative* until DAD ends (up to ~2 s: a random delay of up to 1 s, then one probe and 1 s
//! for an answer), and a tentative address answers no neighbour solicitation, so until then
//! nothing reaches it. The bridge plugin waits for DAD before it returns; macvlan (and others)
//! do not: on the node tier a pod's last macvlan IPv6 address was still tentative when the pod
//! was Running, in every run (`real_node_dualstack`). Plexus waits once for all of a pod's
//! interfaces that got an IPv6 address, before it returns the result: the pod starts with every
//! family usable. IPv4-only pods pay nothing; a wait that runs out is logged, never an error.

use crate::error::MetaError;
use futures::TryStreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
use netlink_packet_route::AddressFamily;
use plexus_conf::result::{is_v6, CniResult};
use plexus_delegates::netns::NetNs;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::err;

/// How long ADD waits for DAD at most (DAD itself takes up to ~2 s).
pub const DAD_WAIT: Duration = Duration::from_secs(3);

/// Wait ([`DAD_WAIT`]) until no IPv6 address of the attachments' interfaces (ifname and its
/// delegate's result) is tentative; only interfaces whose result holds an IPv6 address are
/// looked at. Best effort: what is still tentative, or a failure to look, is logged.
pub fn settle<'a>(netns: &str, attached: impl IntoIterator<Item = (&'a str, &'a CniResult)>) {
    let ifnames: Vec<&str> = attached
        .into_iter()
        .filter(|(_, r)| r.ips.iter().any(|ip| is_v6(&ip.address)))
        .map(|(ifname, _)| ifname)
        .collect();
    if ifnames.is_empty() {
        return;
    }
    let _phase = plexus_delegates::timing::phase("ipv6 dad");
    match wait(netns, &ifnames, DAD_WAIT) {
        Ok(d) => {
            if !d.tentative.is_empty() {
                tracing::warn!(
                    interfaces = ?d.tentative,
                    "IPv6 address still tentative (duplicate address detection) after {DAD_WAIT:?}"
                );
            }
            for (ifname, address) in &d.failed {
                tracing::warn!(
                    ifname,
                    %address,
                    "IPv6 duplicate address detection failed: another host on the link holds \
                     the address; the kernel will not use it"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "IPv6 duplicate address detection not waited for"),
    }
}

/// What [`wait`] saw at its end.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dad {
    /// Interfaces with an IPv6 address still tentative.
    pub tentative: Vec<String>,
    /// IPv6 addresses whose DAD failed (a duplicate on the link), with their interface.
    pub failed: Vec<(String, std::net::IpAddr)>,
}

/// Wait at most `timeout` until no IPv6 address on `ifnames` in `netns` is tentative (an
/// address whose DAD failed is not waited for): what is still tentative, and what failed.
pub fn wait(netns: &str, ifnames: &[&str], timeout: Duration) -> Result<Dad, MetaError> {
    let first = ifnames.first().copied().unwrap_or("");
    let ns = NetNs::open(netns).map_err(|e| err(first, "open netns", e))?;
    ns.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err(first, "runtime", e))?;
        rt.block_on(wait_async(ifnames, timeout))
    })
    .map_err(|e| err(first, "enter netns", e))?
}

async fn wait_async(ifnames: &[&str], timeout: Duration) -> Result<Dad, MetaError> {
    let first = ifnames.first().copied().unwrap_or("");
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| err(first, "netlink", e))?;
    tokio::spawn(conn);
    let links: Vec<_> = handle
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|e| err(first, "list interfaces", e))?;
    let wanted: BTreeMap<u32, String> = links
        .iter()
        .filter_map(|l| {
            let name = l.attributes.iter().find_map(|a| match a {
                netlink_packet_route::link::LinkAttribute::IfName(n) => Some(n.clone()),
                _ => None,
            })?;
            ifnames
                .contains(&name.as_str())
                .then_some((l.header.index, name))
        })
        .collect();
    let deadline = Instant::now() + timeout;
    loop {
        let addrs: Vec<_> = handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| err(first, "list addresses", e))?;
        let mine = addrs
            .iter()
            .filter(|m| m.header.family == AddressFamily::Inet6)
            .filter_map(|m| Some((wanted.get(&m.header.index)?, m)));
        let mut d = Dad::default();
        for (ifname, m) in mine {
            let (tentative, failed) = state(m);
            if tentative && !d.tentative.contains(ifname) {
                d.tentative.push(ifname.clone());
            }
            if failed {
                let address = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) | AddressAttribute::Local(ip) => Some(*ip),
                    _ => None,
                });
                if let Some(address) = address {
                    d.failed.push((ifname.clone(), address));
                }
            }
        }
        if d.tentative.is_empty() || Instant::now() >= deadline {
            return Ok(d);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// (tentative and not failed, DAD failed): a failed DAD keeps the tentative flag for good.
fn state(m: &netlink_packet_route::address::AddressMessage) -> (bool, bool) {
    let flags = m
        .attributes
        .iter()
        .find_map(|a| match a {
            AddressAttribute::Flags(f) => Some(*f),
            _ => None,
        })
        .unwrap_or_else(|| AddressFlags::from_bits_retain(u32::from(m.header.flags.bits())));
    let header_tentative = m.header.flags.contains(AddressHeaderFlags::Tentative);
    let failed = flags.contains(AddressFlags::Dadfailed);
    (
        (flags.contains(AddressFlags::Tentative) || header_tentative) && !failed,
        failed,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn ip(args: &[&str]) -> bool {
        Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A netns of the test's own with a veth pair inside, removed on drop.
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            ip(&["netns", "del", &self.0]);
        }
    }

    #[test]
    fn waits_until_dad_is_done_and_names_what_stays_tentative() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root (netns)");
            return;
        }
        let ns = Ns(format!("pxdad{}", std::process::id()));
        assert!(ip(&["netns", "add", &ns.0]));
        let n = |a: &[&str]| {
            let mut v = vec!["-n", ns.0.as_str()];
            v.extend_from_slice(a);
            assert!(ip(&v), "{a:?}");
        };
        n(&[
            "link", "add", "name", "dada", "type", "veth", "peer", "name", "dadb",
        ]);
        n(&["link", "set", "dada", "up"]);
        n(&["link", "set", "dadb", "up"]);
        n(&["-6", "addr", "add", "2001:db8:dad::1/64", "dev", "dada"]);
        // The peer down: its address stays tentative (DAD never runs).
        n(&[
            "link", "add", "name", "dadc", "type", "veth", "peer", "name", "dadd",
        ]);
        n(&["-6", "addr", "add", "2001:db8:dad::2/64", "dev", "dadc"]);
        let path = format!("/run/netns/{}", ns.0);
        let t = Instant::now();
        let d = wait(&path, &["dada"], Duration::from_secs(5)).unwrap();
        assert_eq!(d, Dad::default());
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
        let out = Command::new("ip")
            .args([
                "-n",
                &ns.0,
                "-6",
                "addr",
                "show",
                "dev",
                "dada",
                "tentative",
            ])
            .output()
            .unwrap();
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let d = wait(&path, &["dada", "dadc"], Duration::from_millis(200)).unwrap();
        assert_eq!(d.tentative, vec!["dadc".to_string()]);
        // An interface not asked about is not waited for.
        let d = wait(&path, &["dada"], Duration::from_millis(200)).unwrap();
        assert!(d.tentative.is_empty());
        // A duplicate on the link: dadb takes dada's address, its DAD fails (dada answers),
        // and that is reported, not waited for.
        n(&["-6", "addr", "add", "2001:db8:dad::1/64", "dev", "dadb"]);
        let t = Instant::now();
        let mut d = Dad::default();
        while t.elapsed() < Duration::from_secs(5) && d.failed.is_empty() {
            d = wait(&path, &["dadb"], Duration::from_secs(5)).unwrap();
        }
        assert_eq!(
            d.failed,
            vec![("dadb".to_string(), "2001:db8:dad::1".parse().unwrap())]
        );
        assert!(d.tentative.is_empty(), "{d:?}");
    }
}
