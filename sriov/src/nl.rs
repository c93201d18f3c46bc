//! A small synchronous rtnetlink client named after kernel operations.
//!
//! A socket stays bound to the netns it was opened in, so open one per namespace (inside the
//! namespace, through `plexus_delegates::netns::NetNs::run`) and use it from any thread afterwards.

use std::net::IpAddr;
use std::os::fd::AsRawFd;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage, Prop};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// Error of a netlink request.
#[derive(Debug, thiserror::Error)]
pub enum NlError {
    /// The kernel answered with an errno.
    #[error("{op}: {source}")]
    Kernel {
        /// The operation and its object (e.g. "set mtu of eth1").
        op: String,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
    /// The socket failed or a reply could not be decoded.
    #[error("{op}: netlink: {msg}")]
    Protocol {
        /// The operation.
        op: String,
        /// What went wrong.
        msg: String,
    },
}

impl NlError {
    /// The errno, if the kernel returned one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NlError::Kernel { source, .. } => source.raw_os_error(),
            NlError::Protocol { .. } => None,
        }
    }

    /// True for "no such device" style answers.
    pub fn is_not_found(&self) -> bool {
        matches!(self.errno(), Some(libc::ENODEV) | Some(libc::ENOENT))
    }
}

/// The facts about a link the plugin needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Name.
    pub name: String,
    /// MAC address (empty for links without one).
    pub mac: Vec<u8>,
    /// MTU.
    pub mtu: u32,
    /// IFF_UP.
    pub up: bool,
    /// Alternative names.
    pub altnames: Vec<String>,
    /// IFLA_CARRIER, when reported.
    pub carrier: Option<bool>,
}

impl Link {
    /// Extracts [`Link`] from a link message.
    pub fn from_msg(m: &LinkMessage) -> Link {
        let mut l = Link {
            index: m.header.index,
            name: String::new(),
            mac: Vec::new(),
            mtu: 0,
            up: m.header.flags.contains(LinkFlags::Up),
            altnames: Vec::new(),
            carrier: None,
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => l.name = n.clone(),
                LinkAttribute::Address(a) => l.mac = a.clone(),
                LinkAttribute::Mtu(v) => l.mtu = *v,
                LinkAttribute::Carrier(c) => l.carrier = Some(*c != 0),
                LinkAttribute::PropList(props) => {
                    for p in props {
                        if let Prop::AltIfName(n) = p {
                            l.altnames.push(n.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        l
    }
}

/// An address' duplicate address detection state ([`Netlink::address_states`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrState {
    /// The address.
    pub ip: IpAddr,
    /// `IFA_F_TENTATIVE`: DAD has not finished (or failed: the kernel keeps both flags).
    pub tentative: bool,
    /// `IFA_F_DADFAILED`: another host on the link holds the address.
    pub dad_failed: bool,
}

/// An address on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr {
    /// The address.
    pub ip: IpAddr,
    /// Prefix length.
    pub prefix: u8,
}

/// A route through a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Destination.
    pub dst: IpAddr,
    /// Destination prefix length.
    pub prefix: u8,
    /// Gateway, if any.
    pub gw: Option<IpAddr>,
}

/// A netlink route socket bound to the netns it was opened in.
pub struct Netlink {
    sock: Socket,
    seq: u32,
}

fn proto(op: &str, msg: impl ToString) -> NlError {
    NlError::Protocol {
        op: op.to_string(),
        msg: msg.to_string(),
    }
}

impl Netlink {
    /// Opens a socket in the calling thread's current network namespace.
    pub fn open() -> Result<Netlink, NlError> {
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| proto("open socket", e))?;
        sock.bind_auto().map_err(|e| proto("bind socket", e))?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(|e| proto("connect socket", e))?;
        // Extended ACKs give readable kernel messages; failure to enable them is harmless.
        let _ = sock.set_ext_ack(true);
        Ok(Netlink { sock, seq: 1 })
    }

    /// Sends `msg` and collects the replies until the ACK (or DONE for dumps).
    pub fn request(
        &mut self,
        op: &str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, NlError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        nl.finalize();
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        self.sock.send(&buf, 0).map_err(|e| proto(op, e))?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        loop {
            let (data, _) = self.sock.recv_from_full().map_err(|e| proto(op, e))?;
            let mut off = 0usize;
            while off + 16 <= data.len() {
                let len =
                    u32::from_ne_bytes([data[off], data[off + 1], data[off + 2], data[off + 3]])
                        as usize;
                if len < 16 || off + len > data.len() {
                    return Err(proto(op, "truncated reply"));
                }
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..off + len])
                    .map_err(|e| proto(op, e))?;
                off += (len + 3) & !3;
                if msg.header.sequence_number != seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Error(e) => {
                        if e.code.is_none() {
                            return Ok(out);
                        }
                        return Err(NlError::Kernel {
                            op: op.to_string(),
                            source: e.to_io(),
                        });
                    }
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::InnerMessage(m) => {
                        out.push(m);
                        if !dump && flags & NLM_F_ACK == 0 {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn get_link(&mut self, op: &str, mut m: LinkMessage) -> Result<Option<Link>, NlError> {
        m.attributes.push(LinkAttribute::ExtMask(vec![
            netlink_packet_route::link::LinkExtentMask::SkipStats,
        ]));
        match self.request(op, RouteNetlinkMessage::GetLink(m), 0) {
            Ok(v) => Ok(v.iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(Link::from_msg(l)),
                _ => None,
            })),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The link called `name`, or None.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>, NlError> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(&format!("get link {name}"), m)
    }

    /// The link with index `index`, or None.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>, NlError> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        self.get_link(&format!("get link #{index}"), m)
    }

    /// Sends RTM_SETLINK with the given attributes on `index`.
    fn set_link(
        &mut self,
        op: String,
        index: u32,
        attrs: Vec<LinkAttribute>,
        flags: Option<(LinkFlags, LinkFlags)>,
    ) -> Result<(), NlError> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        if let Some((f, mask)) = flags {
            m.header.flags = f;
            m.header.change_mask = mask;
        }
        m.attributes = attrs;
        self.request(&op, RouteNetlinkMessage::SetLink(m), NLM_F_ACK)
            .map(drop)
    }

    /// Renames link `index` (it must be down).
    pub fn set_name(&mut self, index: u32, name: &str) -> Result<(), NlError> {
        let op = format!("rename link #{index} to {name}");
        self.set_link(op, index, vec![LinkAttribute::IfName(name.into())], None)
    }

    /// Sets the MAC of link `index`.
    pub fn set_mac(&mut self, index: u32, mac: &[u8]) -> Result<(), NlError> {
        let op = format!("set MAC of link #{index}");
        self.set_link(op, index, vec![LinkAttribute::Address(mac.to_vec())], None)
    }

    /// Sets the MTU of link `index`.
    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<(), NlError> {
        let op = format!("set MTU {mtu} on link #{index}");
        self.set_link(op, index, vec![LinkAttribute::Mtu(mtu)], None)
    }

    /// Sets link `index` up or down.
    pub fn set_up(&mut self, index: u32, up: bool) -> Result<(), NlError> {
        let op = format!("set link #{index} {}", if up { "up" } else { "down" });
        let f = if up {
            LinkFlags::Up
        } else {
            LinkFlags::empty()
        };
        self.set_link(op, index, vec![], Some((f, LinkFlags::Up)))
    }

    /// Moves link `index` into the netns `ns`, renaming it to `name` in the same request (the
    /// kernel applies IFLA_IFNAME as the name in the target netns, so a clash with an existing
    /// host-side name is avoided).
    pub fn set_netns(
        &mut self,
        index: u32,
        ns: &impl AsRawFd,
        name: Option<&str>,
    ) -> Result<(), NlError> {
        let op = format!("move link #{index} to another netns");
        let mut attrs = vec![LinkAttribute::NetNsFd(ns.as_raw_fd())];
        if let Some(n) = name {
            attrs.push(LinkAttribute::IfName(n.into()));
        }
        self.set_link(op, index, attrs, None)
    }

    /// Deletes an alternative name of link `index`.
    pub fn del_altname(&mut self, index: u32, altname: &str) -> Result<(), NlError> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes
            .push(LinkAttribute::PropList(vec![Prop::AltIfName(
                altname.into(),
            )]));
        let op = format!("delete altname {altname} of link #{index}");
        self.request(&op, RouteNetlinkMessage::DelLinkProp(m), NLM_F_ACK)
            .map(drop)
    }

    /// Adds an address to link `index`.
    pub fn add_address(&mut self, index: u32, a: Addr) -> Result<(), NlError> {
        let mut m = AddressMessage::default();
        m.header.family = family(a.ip);
        m.header.prefix_len = a.prefix;
        m.header.index = index;
        m.attributes.push(AddressAttribute::Local(a.ip));
        m.attributes.push(AddressAttribute::Address(a.ip));
        if let IpAddr::V4(v4) = a.ip {
            let bits = u32::from(v4);
            let host = if a.prefix >= 32 {
                0
            } else {
                u32::MAX >> a.prefix
            };
            if a.prefix < 31 {
                m.attributes
                    .push(AddressAttribute::Broadcast((bits | host).into()));
            }
        }
        if a.ip.is_ipv6() {
            // Optimistic DAD (RFC 4429; the link's `optimistic_dad` is on, see `garp`): DAD
            // starts at once instead of after a random delay of up to a second, and the
            // address takes traffic while it runs.
            m.attributes
                .push(AddressAttribute::Flags(AddressFlags::Optimistic));
        }
        let op = format!("add address {}/{} to link #{index}", a.ip, a.prefix);
        self.request(
            &op,
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// The addresses of link `index` (all families, universe and link scope).
    pub fn addresses(&mut self, index: u32) -> Result<Vec<Addr>, NlError> {
        let op = format!("list addresses of link #{index}");
        let replies = self.request(
            &op,
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for r in replies {
            let RouteNetlinkMessage::NewAddress(m) = r else {
                continue;
            };
            if m.header.index != index {
                continue;
            }
            for a in &m.attributes {
                if let AddressAttribute::Address(ip) = a {
                    out.push(Addr {
                        ip: *ip,
                        prefix: m.header.prefix_len,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The IPv6 duplicate address detection state of each address of link `index`: whether
    /// it is still tentative (DAD running) and whether DAD failed (another host on the link
    /// answered for it).
    pub fn address_states(&mut self, index: u32) -> Result<Vec<AddrState>, NlError> {
        let op = format!("list addresses of link #{index}");
        let replies = self.request(
            &op,
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for r in replies {
            let RouteNetlinkMessage::NewAddress(m) = r else {
                continue;
            };
            if m.header.index != index {
                continue;
            }
            // IFA_FLAGS (32 bits) supersedes the header's 8 when present.
            let mut flags = AddressFlags::from_bits_truncate(u32::from(m.header.flags.bits()));
            let mut ip = None;
            for a in &m.attributes {
                match a {
                    AddressAttribute::Flags(f) => flags = *f,
                    AddressAttribute::Address(a) => ip = Some(*a),
                    _ => {}
                }
            }
            if let Some(ip) = ip {
                out.push(AddrState {
                    ip,
                    tentative: flags.contains(AddressFlags::Tentative),
                    dad_failed: flags.contains(AddressFlags::Dadfailed),
                });
            }
        }
        Ok(out)
    }

    /// Adds a route via link `index` in the main table.
    pub fn add_route(&mut self, index: u32, r: Route) -> Result<(), NlError> {
        let mut m = RouteMessage::default();
        m.header.address_family = family(r.dst);
        m.header.destination_prefix_length = r.prefix;
        m.header.table = RouteHeader::RT_TABLE_MAIN;
        m.header.protocol = RouteProtocol::Boot;
        m.header.kind = RouteType::Unicast;
        m.header.scope = if r.gw.is_some() {
            RouteScope::Universe
        } else {
            RouteScope::Link
        };
        if r.prefix > 0 {
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(r.dst)));
        }
        if let Some(gw) = r.gw {
            m.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        m.attributes.push(RouteAttribute::Oif(index));
        let op = format!(
            "add route {}/{} via {:?} on link #{index}",
            r.dst, r.prefix, r.gw
        );
        self.request(
            &op,
            RouteNetlinkMessage::NewRoute(m),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
        .map(drop)
    }

    /// The main-table routes whose output interface is `index`, for `family` (IPv4 or IPv6).
    pub fn routes(&mut self, index: u32, v6: bool) -> Result<Vec<Route>, NlError> {
        let mut q = RouteMessage::default();
        q.header.address_family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let op = format!("list routes of link #{index}");
        let replies = self.request(&op, RouteNetlinkMessage::GetRoute(q), NLM_F_DUMP)?;
        let mut out = Vec::new();
        for r in replies {
            let RouteNetlinkMessage::NewRoute(m) = r else {
                continue;
            };
            if m.header.table != RouteHeader::RT_TABLE_MAIN {
                continue;
            }
            let mut oif = None;
            let mut dst = None;
            let mut gw = None;
            for a in &m.attributes {
                match a {
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Destination(d) => dst = route_ip(d),
                    RouteAttribute::Gateway(g) => gw = route_ip(g),
                    _ => {}
                }
            }
            if oif != Some(index) {
                continue;
            }
            let unspec = if v6 {
                IpAddr::from([0u16; 8])
            } else {
                IpAddr::from([0u8; 4])
            };
            out.push(Route {
                dst: dst.unwrap_or(unspec),
                prefix: m.header.destination_prefix_length,
                gw,
            });
        }
        Ok(out)
    }
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

fn family(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}
