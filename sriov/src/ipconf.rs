//! Addresses and routes from the IPAM result, configured on the VF netdev in the pod.

use std::net::IpAddr;

use plexus_conf::result::CniResult;

use crate::error::SriovError;
use crate::nl::{Addr, Netlink, Route};

/// Adds every IP of `r` to link `idx` and its routes (a route without `gw` uses the gateway of
/// the same family from the IP configs, like libcni's ConfigureIface).
pub fn configure(pod: &mut Netlink, idx: u32, r: &CniResult) -> Result<(), SriovError> {
    let mut gws: Vec<IpAddr> = Vec::new();
    for ip in &r.ips {
        let a = parse_cidr(&ip.address)?;
        pod.add_address(idx, a)?;
        if let Some(gw) = &ip.gateway {
            gws.push(parse_ip(gw)?);
        }
    }
    for rt in &r.routes {
        let d = parse_cidr(&rt.dst)?;
        let gw = match &rt.gw {
            Some(g) => Some(parse_ip(g)?),
            // libcni ConfigureIface: a route without gw uses the IP config's gateway of the
            // same family.
            None => gws.iter().copied().find(|g| g.is_ipv4() == d.ip.is_ipv4()),
        };
        pod.add_route(
            idx,
            Route {
                dst: d.ip,
                prefix: d.prefix,
                gw,
            },
        )?;
    }
    Ok(())
}

/// The first 6 bytes of a link-layer address (zero-padded).
pub fn mac6(b: &[u8]) -> [u8; 6] {
    let mut m = [0u8; 6];
    for (d, s) in m.iter_mut().zip(b) {
        *d = *s;
    }
    m
}

/// Parses `ip/prefix`.
pub fn parse_cidr(s: &str) -> Result<Addr, SriovError> {
    let bad = || SriovError::Other(format!("invalid CIDR {s:?} in IPAM result"));
    let (ip, p) = s.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let prefix: u8 = p.parse().map_err(|_| bad())?;
    if prefix > if ip.is_ipv4() { 32 } else { 128 } {
        return Err(bad());
    }
    Ok(Addr { ip, prefix })
}

fn parse_ip(s: &str) -> Result<IpAddr, SriovError> {
    s.parse()
        .map_err(|_| SriovError::Other(format!("invalid IP {s:?} in IPAM result")))
}
