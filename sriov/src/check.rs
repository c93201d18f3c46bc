//! CHECK: the PF-side settings, the interface, its addresses and routes are still as ADD left
//! them (sriov-cni's CHECK is a no-op, #146).

use plexus_conf::result::CniResult;
use plexus_delegates::ipam;
use plexus_delegates::netns::NetNs;
use plexus_delegates::skel::CmdArgs;

use crate::ctx::Ctx;
use crate::error::SriovError;
use crate::ipconf::{mac6, parse_cidr};
use crate::netconf::NetConf;
use crate::nl::Netlink;
use crate::pf::MacAddr;

fn fail(msg: String) -> SriovError {
    SriovError::Check(msg)
}

/// Runs CHECK.
pub fn check(ctx: &Ctx<'_>, args: &CmdArgs, conf: &NetConf) -> Result<(), SriovError> {
    let st = ctx
        .store
        .load(&args.container_id, &args.ifname)?
        .filter(|s| s.complete)
        .ok_or_else(|| {
            fail(format!(
                "no attachment for container {} ifname {}",
                args.container_id, args.ifname
            ))
        })?;
    let vf = st.vf_pci.as_str();
    if conf.device_id.as_deref() != Some(vf) {
        return Err(fail(format!(
            "deviceID {:?} differs from the attached VF {vf}",
            conf.device_id
        )));
    }
    let _lock = ctx.store.lock_vf(vf)?;
    let cur = ctx.pf.get_vf(&st.pf, st.vf_index)?;
    let mut diffs = Vec::new();
    if let Some(v) = conf.vlan {
        if (cur.vlan, cur.qos, cur.proto) != (v.id, v.qos, v.proto) {
            diffs.push(format!(
                "vlan {}/{}/{} want {}/{}/{}",
                cur.vlan, cur.qos, cur.proto, v.id, v.qos, v.proto
            ));
        }
    }
    if let Some(m) = conf.mac {
        if cur.mac != m {
            diffs.push(format!("admin MAC {} want {m}", cur.mac));
        }
    }
    if let Some(r) = conf.rate {
        if (cur.min_tx_rate, cur.max_tx_rate) != (r.min, r.max) {
            diffs.push(format!(
                "tx rate {}-{} want {}-{}",
                cur.min_tx_rate, cur.max_tx_rate, r.min, r.max
            ));
        }
    }
    if conf.spoofchk.is_some_and(|s| s != cur.spoofchk) {
        diffs.push(format!("spoofchk {}", cur.spoofchk));
    }
    if conf.trust.is_some_and(|s| s != cur.trust) {
        diffs.push(format!("trust {}", cur.trust));
    }
    if conf.link_state.is_some_and(|s| s != cur.link_state) {
        diffs.push(format!("link_state {}", cur.link_state));
    }
    if st.orig_netdev.is_some() {
        let prev = prev_result(&args.stdin, &conf.cni_version)?;
        let ns = NetNs::open(&args.netns).map_err(|e| fail(e.to_string()))?;
        let ifname = args.ifname.clone();
        let nd = ns
            .run(|| check_netdev(&ifname, conf, prev.as_ref()))
            .map_err(|e| fail(e.to_string()))??;
        diffs.extend(nd);
    }
    if !diffs.is_empty() {
        return Err(fail(format!("VF {vf}: {}", diffs.join("; "))));
    }
    if let Some(t) = &conf.ipam_type {
        ipam::check(t, args, &args.stdin).map_err(SriovError::Ipam)?;
    }
    Ok(())
}

fn prev_result(stdin: &[u8], version: &str) -> Result<Option<CniResult>, SriovError> {
    let v: serde_json::Value = serde_json::from_slice(stdin)
        .map_err(|e| SriovError::Config(format!("not valid JSON: {e}")))?;
    match v.get("prevResult").filter(|p| !p.is_null()) {
        None => Ok(None),
        Some(p) => CniResult::parse_with_version(p, version)
            .map(Some)
            .map_err(|e| SriovError::Config(format!("prevResult: {e}"))),
    }
}

fn check_netdev(
    ifname: &str,
    conf: &NetConf,
    prev: Option<&CniResult>,
) -> Result<Vec<String>, SriovError> {
    let mut nl = Netlink::open()?;
    let mut d = Vec::new();
    let Some(l) = nl.link_by_name(ifname)? else {
        return Ok(vec![format!("interface {ifname} not found in the netns")]);
    };
    let mac = MacAddr(mac6(&l.mac));
    if let Some(m) = conf.mac {
        if mac != m {
            d.push(format!("{ifname} MAC {mac} want {m}"));
        }
    }
    if let Some(m) = conf.mtu {
        if l.mtu != m {
            d.push(format!("{ifname} MTU {} want {m}", l.mtu));
        }
    }
    if !l.up {
        d.push(format!("{ifname} is down"));
    }
    let Some(prev) = prev else { return Ok(d) };
    if let Some(i) = prev.interfaces.iter().find(|i| i.name == ifname) {
        if !i.mac.is_empty() && i.mac.to_ascii_lowercase() != mac.to_string() {
            d.push(format!("{ifname} MAC {mac}, prevResult says {}", i.mac));
        }
    }
    let have = nl.addresses(l.index)?;
    for ip in &prev.ips {
        let a = parse_cidr(&ip.address)?;
        if !have.contains(&a) {
            d.push(format!("address {} missing on {ifname}", ip.address));
        }
    }
    let mut routes = nl.routes(l.index, false)?;
    routes.extend(nl.routes(l.index, true)?);
    for r in &prev.routes {
        let dst = parse_cidr(&r.dst)?;
        let found = routes.iter().any(|x| {
            x.dst == dst.ip
                && x.prefix == dst.prefix
                && match &r.gw {
                    Some(g) => x.gw.map(|v| v.to_string()) == Some(g.clone()),
                    None => true,
                }
        });
        if !found {
            d.push(format!(
                "route {} via {:?} missing on {ifname}",
                r.dst, r.gw
            ));
        }
    }
    Ok(d)
}
