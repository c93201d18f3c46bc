//! Default-route handling in the pod: drop an attachment's default routes of a family another
//! attachment claims, and install `default via <gw> dev <if>` for the claiming attachment.
//! All netlink work runs inside the pod netns on a dedicated thread with its own runtime.

pub mod dad;

use crate::error::{BoxError, MetaError};
use futures::TryStreamExt;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::AddressFamily;
use plexus_delegates::netns::NetNs;
use rtnetlink::RouteMessageBuilder;
use std::net::IpAddr;

/// What to do on one interface.
#[derive(Debug, Clone, Default)]
pub struct RouteChange {
    /// Interface in the pod.
    pub ifname: String,
    /// Remove IPv4 default routes via this interface.
    pub drop_v4: bool,
    /// Remove IPv6 default routes via this interface.
    pub drop_v6: bool,
    /// Gateways to install default routes through on this interface.
    pub gateways: Vec<IpAddr>,
}

fn err(ifname: &str, what: &str, e: impl Into<BoxError>) -> MetaError {
    MetaError::Route {
        ifname: ifname.to_string(),
        what: what.to_string(),
        source: e.into(),
    }
}

/// The main routing table (`RT_TABLE_MAIN`): policy tables (e.g. the `sbr` plugin's) are left alone.
const MAIN_TABLE: u32 = 254;

fn table_of(msg: &RouteMessage) -> u32 {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(msg.header.table))
}

fn is_default_via(msg: &RouteMessage, index: u32) -> bool {
    table_of(msg) == MAIN_TABLE
        && msg.header.destination_prefix_length == 0
        && msg
            .attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Oif(i) if *i == index))
        && !msg
            .attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Destination(d) if !is_unspecified(d)))
}

fn is_unspecified(d: &RouteAddress) -> bool {
    match d {
        RouteAddress::Inet(a) => a.is_unspecified(),
        RouteAddress::Inet6(a) => a.is_unspecified(),
        _ => false,
    }
}

async fn apply_async(change: &RouteChange) -> Result<(), MetaError> {
    let ifname = change.ifname.as_str();
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| err(ifname, "netlink", e))?;
    tokio::spawn(conn);
    let link = handle
        .link()
        .get()
        .match_name(ifname.to_string())
        .execute()
        .try_next()
        .await
        .map_err(|e| err(ifname, "find interface", e))?
        .ok_or_else(|| err(ifname, "find interface", "not found"))?;
    let index = link.header.index;
    for (family, wanted) in [
        (AddressFamily::Inet, change.drop_v4),
        (AddressFamily::Inet6, change.drop_v6),
    ] {
        if !wanted {
            continue;
        }
        let query = match family {
            AddressFamily::Inet => RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            _ => RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        };
        let routes: Vec<RouteMessage> = handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(|e| err(ifname, "list routes", e))?;
        for r in routes.into_iter().filter(|r| is_default_via(r, index)) {
            handle
                .route()
                .del(r)
                .execute()
                .await
                .map_err(|e| err(ifname, "delete default route", e))?;
        }
    }
    for gw in &change.gateways {
        let msg = match gw {
            IpAddr::V4(a) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .gateway(*a)
                .output_interface(index)
                .build(),
            IpAddr::V6(a) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .gateway(*a)
                .output_interface(index)
                .build(),
        };
        handle
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(|e| err(ifname, &format!("add default via {gw}"), e))?;
    }
    Ok(())
}

/// Apply a change inside the namespace at `netns`.
pub fn apply(netns: &str, change: &RouteChange) -> Result<(), MetaError> {
    let ns = NetNs::open(netns).map_err(|e| err(&change.ifname, "open netns", e))?;
    ns.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err(&change.ifname, "runtime", e))?;
        rt.block_on(apply_async(change))
    })
    .map_err(|e| err(&change.ifname, "enter netns", e))?
}
