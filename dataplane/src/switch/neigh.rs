//! An overlay bridge's known neighbours, and the ARP/ND responder that
//! answers for them.
//!
//! The stations behind each remote VTEP (a remote node's pods: their MACs
//! and IP addresses, as the cluster knows them from each pod's
//! `network-status`) are given to the switch per VTEP
//! ([`switchyard_api::Request::VtepStations`]). The bridge then answers an ARP request or an IPv6
//! neighbour solicitation for a known address itself, on the port it came
//! in on, instead of flooding it to every tunnel: as OVN answers ARP from
//! its logical-port table and EVPN fabrics suppress ARP with their type-2
//! routes. Requests for addresses it does not know are flooded as before,
//! so anything the agent does not know still works by learning.
//!
//! The table is built by the control thread and replaced whole (the
//! workers' views hold it); the responder only reads it, for broadcast
//! and multicast frames a bridge with neighbours would flood.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::wire::MacAddr;

/// The longest reply: an 802.1Q-tagged neighbour advertisement with its
/// target link-layer address option.
pub const REPLY_MAX: usize = 18 + 40 + 32;

/// A bridge's known neighbours: (VLAN domain, IP address) to MAC.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Neighbours {
    map: HashMap<(u16, IpAddr), MacAddr>,
}

impl Neighbours {
    /// The table of `entries` ((VLAN domain, address), MAC); a later
    /// entry of an address replaces an earlier.
    pub fn new(entries: impl IntoIterator<Item = ((u16, IpAddr), MacAddr)>) -> Neighbours {
        Neighbours {
            map: entries.into_iter().collect(),
        }
    }

    /// The MAC of `ip` in VLAN domain `vlan`.
    #[inline]
    pub fn get(&self, vlan: u16, ip: IpAddr) -> Option<MacAddr> {
        self.map.get(&(vlan, ip)).copied()
    }

    /// How many addresses it knows.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it knows none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ICMPV6: u8 = 58;
const NEIGHBOR_SOLICITATION: u8 = 135;
const NEIGHBOR_ADVERTISEMENT: u8 = 136;

/// How many bytes of a frame [`answer`] reads.
pub const READ_LEN: usize = 18 + 40 + 24;

/// The reply to `head` (the first bytes of a frame, as many as it has up
/// to [`READ_LEN`]), an ARP request for an IPv4 address or a neighbour
/// solicitation for an IPv6 address that `n` knows in VLAN domain `vlan`,
/// written whole to `out` (an ARP reply zero-padded to the shortest
/// Ethernet frame): its length. `None` for anything else: another frame,
/// a gratuitous ARP, an address conflict probe (ARP from `0.0.0.0`, RFC
/// 5227; a solicitation from `::`, duplicate address detection: their
/// answer would tell the prober its address is taken), a solicitation
/// whose source or target is a group address, an address not known.
///
/// The reply goes back where the request came from, in its VLAN (with its
/// tag if it had one), from the neighbour's MAC.
pub fn answer(n: &Neighbours, vlan: u16, head: &[u8], out: &mut [u8; REPLY_MAX]) -> Option<usize> {
    let tagged = head.get(12..14)? == [0x81, 0x00];
    let h = if tagged { 18 } else { 14 };
    let ethertype = u16::from_be_bytes(head.get(h - 2..h)?.try_into().ok()?);
    let requester: [u8; 6] = head[6..12].try_into().ok()?;
    match ethertype {
        ETHERTYPE_ARP => {
            let arp = head.get(h..h + 28)?;
            // Ethernet, IPv4, 6- and 4-byte addresses, a request.
            if arp[..8] != [0, 1, 8, 0, 6, 4, 0, 1] {
                return None;
            }
            let (sha, spa, tpa) = (&arp[8..14], &arp[14..18], &arp[24..28]);
            if spa == tpa || spa == [0; 4] {
                return None; // an announcement, or a probe
            }
            let target = Ipv4Addr::new(tpa[0], tpa[1], tpa[2], tpa[3]);
            let mac = n.get(vlan, IpAddr::V4(target))?.0;
            out[..6].copy_from_slice(&requester);
            out[6..12].copy_from_slice(&mac);
            out[12..h].copy_from_slice(&head[12..h]);
            let r = &mut out[h..h + 28];
            r[..6].copy_from_slice(&[0, 1, 8, 0, 6, 4]);
            r[6..8].copy_from_slice(&2u16.to_be_bytes());
            r[8..14].copy_from_slice(&mac);
            r[14..18].copy_from_slice(tpa);
            r[18..24].copy_from_slice(sha);
            r[24..28].copy_from_slice(spa);
            // Zero padding to the shortest frame (with its tag if tagged).
            let min = h + 46;
            out[h + 28..min].fill(0);
            Some(min)
        }
        ETHERTYPE_IPV6 => {
            let ip = head.get(h..h + 40)?;
            let icmp = head.get(h + 40..h + 64)?;
            // No extension header, the hop limit of a neighbour message
            // (RFC 4861 7.1.1), a solicitation.
            if ip[0] >> 4 != 6 || ip[6] != ICMPV6 || ip[7] != 255 {
                return None;
            }
            if icmp[0] != NEIGHBOR_SOLICITATION || icmp[1] != 0 {
                return None;
            }
            if u16::from_be_bytes([ip[4], ip[5]]) < 24 {
                return None;
            }
            let src: [u8; 16] = ip[8..24].try_into().ok()?;
            if src == [0; 16] || src[0] == 0xff {
                return None; // duplicate address detection; a group
            }
            let target: [u8; 16] = icmp[8..24].try_into().ok()?;
            if target[0] == 0xff {
                return None;
            }
            let mac = n.get(vlan, IpAddr::V6(Ipv6Addr::from(target)))?.0;
            out[..6].copy_from_slice(&requester);
            out[6..12].copy_from_slice(&mac);
            out[12..h].copy_from_slice(&head[12..h]);
            let r = &mut out[h..h + 72];
            // IPv6: payload 32 bytes of ICMPv6, hop limit 255, from the
            // target to the solicitation's source.
            r[..4].copy_from_slice(&[0x60, 0, 0, 0]);
            r[4..6].copy_from_slice(&32u16.to_be_bytes());
            r[6] = ICMPV6;
            r[7] = 255;
            r[8..24].copy_from_slice(&target);
            r[24..40].copy_from_slice(&src);
            // The advertisement: solicited and override (RFC 4861 4.4),
            // the target, its link-layer address (option 2).
            let a = &mut r[40..72];
            a[0] = NEIGHBOR_ADVERTISEMENT;
            a[1] = 0;
            a[2..4].copy_from_slice(&[0, 0]);
            a[4..8].copy_from_slice(&[0x60, 0, 0, 0]);
            a[8..24].copy_from_slice(&target);
            a[24..26].copy_from_slice(&[2, 1]);
            a[26..32].copy_from_slice(&mac);
            let sum = icmpv6_checksum(&target, &src, a);
            a[2..4].copy_from_slice(&sum.to_be_bytes());
            Some(h + 72)
        }
        _ => None,
    }
}

/// The ICMPv6 checksum of `msg` (its checksum field zero) from `src` to
/// `dst` (RFC 4443 2.3: over the pseudo-header of RFC 8200 8.1).
fn icmpv6_checksum(src: &[u8; 16], dst: &[u8; 16], msg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
            sum += u32::from(w);
        }
    };
    add(src);
    add(dst);
    add(&(msg.len() as u32).to_be_bytes());
    add(&[0, 0, 0, ICMPV6]);
    add(msg);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASKER: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const KNOWN: [u8; 6] = [2, 0, 0, 0, 0, 9];

    fn table() -> Neighbours {
        Neighbours::new([
            ((0, "10.66.2.5".parse().unwrap()), MacAddr(KNOWN)),
            ((0, "fd66:0:0:2::5".parse().unwrap()), MacAddr(KNOWN)),
            ((7, "10.66.2.6".parse().unwrap()), MacAddr(KNOWN)),
        ])
    }

    fn arp_request(tag: Option<u16>, spa: [u8; 4], tpa: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&ASKER);
        if let Some(v) = tag {
            f.extend_from_slice(&[0x81, 0]);
            f.extend_from_slice(&v.to_be_bytes());
        }
        f.extend_from_slice(&[8, 6, 0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&ASKER);
        f.extend_from_slice(&spa);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&tpa);
        f.resize(f.len().max(60), 0);
        f
    }

    fn solicitation(src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
        let t = target.octets();
        let mut f = vec![0x33, 0x33, 0xff, t[13], t[14], t[15]];
        f.extend_from_slice(&ASKER);
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 32, 58, 255]);
        f.extend_from_slice(&src.octets());
        let mut dst = [0u8; 16];
        dst[..2].copy_from_slice(&[0xff, 0x02]);
        dst[11..].copy_from_slice(&[1, 0xff, t[13], t[14], t[15]]);
        f.extend_from_slice(&dst);
        let mut ns = vec![135, 0, 0, 0, 0, 0, 0, 0];
        ns.extend_from_slice(&t);
        ns.extend_from_slice(&[1, 1]);
        ns.extend_from_slice(&ASKER);
        let sum = icmpv6_checksum(&src.octets(), &dst, &ns);
        ns[2..4].copy_from_slice(&sum.to_be_bytes());
        f.extend_from_slice(&ns);
        f
    }

    fn ask(n: &Neighbours, vlan: u16, f: &[u8]) -> Option<Vec<u8>> {
        let mut out = [0u8; REPLY_MAX];
        let head = &f[..f.len().min(READ_LEN)];
        let len = answer(n, vlan, head, &mut out)?;
        Some(out[..len].to_vec())
    }

    #[test]
    fn an_arp_request_for_a_known_address_is_answered_in_its_vlan() {
        let n = table();
        let r = ask(&n, 0, &arp_request(None, [10, 66, 1, 2], [10, 66, 2, 5])).unwrap();
        assert_eq!(r.len(), 60);
        assert_eq!(&r[..6], &ASKER);
        assert_eq!(&r[6..12], &KNOWN);
        assert_eq!(&r[12..22], &[8, 6, 0, 1, 8, 0, 6, 4, 0, 2]);
        assert_eq!(&r[22..28], &KNOWN);
        assert_eq!(&r[28..32], &[10, 66, 2, 5]);
        assert_eq!(&r[32..38], &ASKER);
        assert_eq!(&r[38..42], &[10, 66, 1, 2]);
        // Tagged, in its VLAN: the tag stays.
        let r = ask(&n, 7, &arp_request(Some(7), [10, 66, 1, 2], [10, 66, 2, 6])).unwrap();
        assert_eq!(r.len(), 64);
        assert_eq!(&r[12..16], &[0x81, 0, 0, 7]);
        assert!(r[46..].iter().all(|b| *b == 0));
        assert_eq!(&r[26..32], &KNOWN);
        // Another VLAN's, unknown, gratuitous, a reply: not answered.
        assert!(ask(&n, 0, &arp_request(None, [10, 66, 1, 2], [10, 66, 2, 6])).is_none());
        assert!(ask(&n, 0, &arp_request(None, [10, 66, 1, 2], [10, 66, 2, 7])).is_none());
        assert!(ask(&n, 0, &arp_request(None, [10, 66, 2, 5], [10, 66, 2, 5])).is_none());
        assert!(ask(&n, 0, &arp_request(None, [0, 0, 0, 0], [10, 66, 2, 5])).is_none());
        let mut reply = arp_request(None, [10, 66, 1, 2], [10, 66, 2, 5]);
        reply[21] = 2;
        assert!(ask(&n, 0, &reply).is_none());
        // Cut short: not read past its end.
        let f = arp_request(None, [10, 66, 1, 2], [10, 66, 2, 5]);
        assert!(ask(&n, 0, &f[..40]).is_none());
    }

    #[test]
    fn a_solicitation_for_a_known_address_gets_an_advertisement() {
        let n = table();
        let src: Ipv6Addr = "fd66:0:0:1::2".parse().unwrap();
        let target: Ipv6Addr = "fd66:0:0:2::5".parse().unwrap();
        let r = ask(&n, 0, &solicitation(src, target)).unwrap();
        assert_eq!(r.len(), 14 + 40 + 32);
        assert_eq!(&r[..6], &ASKER);
        assert_eq!(&r[6..12], &KNOWN);
        assert_eq!(&r[12..14], &[0x86, 0xdd]);
        let ip = &r[14..54];
        assert_eq!(&ip[4..8], &[0, 32, 58, 255]);
        assert_eq!(&ip[8..24], &target.octets());
        assert_eq!(&ip[24..40], &src.octets());
        let na = &r[54..];
        assert_eq!(na[0], 136);
        assert_eq!(&na[4..8], &[0x60, 0, 0, 0]);
        assert_eq!(&na[8..24], &target.octets());
        assert_eq!(&na[24..32], &[2, 1, 2, 0, 0, 0, 0, 9]);
        // The checksum verifies: summed with it, the sum is all ones.
        assert_eq!(icmpv6_checksum(&target.octets(), &src.octets(), na), 0);
        // Duplicate address detection, an unknown target: flooded.
        assert!(ask(&n, 0, &solicitation(Ipv6Addr::UNSPECIFIED, target)).is_none());
        let other: Ipv6Addr = "fd66:0:0:2::6".parse().unwrap();
        assert!(ask(&n, 0, &solicitation(src, other)).is_none());
    }
}
