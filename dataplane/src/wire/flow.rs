//! What L3/L4 policy reads of a frame: its addresses, protocol and ports,
//! or the ARP sender, or the connection an ICMP error is about
//! ([`Packet::parse`]). Read from a copy of the frame's first bytes
//! ([`PREFIX_LEN`]), each offset checked against what was copied; IPv6
//! extension headers are followed as far as the copy goes.

use crate::wire::ethernet::{ETHERTYPE_VLAN, HEADER_LEN as ETH_HEADER_LEN, VLAN_TAG_LEN};
use crate::wire::ip::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, PROTO_TCP, PROTO_UDP};

/// Bytes of a frame policy reads: an Ethernet header with a tag, an IPv4
/// header with options or an IPv6 header with a few extension headers, a
/// transport header, and for an ICMP error the headers it quotes.
pub const PREFIX_LEN: usize = 192;

/// `ETH_P_8021AD`, a service tag.
pub const ETHERTYPE_QINQ: u16 = 0x88a8;
/// `ETH_P_QINQ1`, the pre-standard outer tag.
pub const ETHERTYPE_QINQ_OLD: u16 = 0x9100;
/// `ETH_P_ARP`.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// `IPPROTO_ICMP`.
pub const PROTO_ICMP: u8 = 1;
/// `IPPROTO_ICMPV6`.
pub const PROTO_ICMPV6: u8 = 58;
/// `IPPROTO_SCTP`.
pub const PROTO_SCTP: u8 = 132;

/// TCP flags policy follows.
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// An IP packet's addresses, protocol and ports: one direction of a
/// connection. Addresses are 128-bit (an IPv4 address in the low 32 bits,
/// `v6` false).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// IP protocol number.
    pub proto: u8,
    /// Source address.
    pub src: u128,
    /// Destination address.
    pub dst: u128,
    /// Source port (TCP, UDP, SCTP), the echo identifier (ICMP echo), else 0.
    pub sport: u16,
    /// Destination port, the echo identifier (ICMP echo), else 0.
    pub dport: u16,
}

impl Tuple {
    /// The other direction.
    pub fn reversed(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            ..*self
        }
    }
}

/// What a packet is, for policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet {
    /// Neither IP nor ARP: policy is L3/L4 and lets it be.
    NotIp,
    /// An IP packet whose headers the frame cuts short or gets wrong.
    Malformed,
    /// An ARP packet from `sender` (its sender protocol address).
    Arp {
        /// The IPv4 address the sender claims.
        sender: u32,
    },
    /// IPv6 neighbour discovery or multicast listener traffic (ICMPv6 types
    /// 130-137, 143): always passes policy.
    Neighbour {
        /// The source address.
        src: u128,
    },
    /// A packet of a connection: TCP, UDP, SCTP (ports), ICMP echo (the
    /// identifier as both ports), or another protocol (no ports).
    Flow {
        /// Its tuple.
        tuple: Tuple,
        /// Its TCP flags (0 for other protocols).
        flags: u8,
        /// The transport header is in a later fragment: no ports read.
        fragment: bool,
        /// An ICMP echo reply (its request is the other direction).
        reply: bool,
    },
    /// An ICMP error about the packet `about` (as quoted: the direction
    /// the erring packet took, from the receiver of this error).
    IcmpError {
        /// The error's own source and destination.
        tuple: Tuple,
        /// The quoted packet's tuple.
        about: Tuple,
    },
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be128(b: &[u8], at: usize) -> Option<u128> {
    Some(u128::from_be_bytes(b.get(at..at + 16)?.try_into().ok()?))
}

/// An IP header's facts: the tuple without ports, where the transport
/// header starts, and whether it is a later fragment.
struct L3 {
    proto: u8,
    src: u128,
    dst: u128,
    l4: usize,
    later_fragment: bool,
}

/// Reads the IPv4 or IPv6 header at `at` (`v6` picks which), following
/// IPv6 extension headers.
fn l3(b: &[u8], at: usize, v6: bool) -> Option<L3> {
    if !v6 {
        let vihl = *b.get(at)?;
        let ihl = usize::from(vihl & 0x0f) * 4;
        if vihl >> 4 != 4 || ihl < 20 {
            return None;
        }
        let frag = be16(b, at + 6)?;
        return Some(L3 {
            proto: *b.get(at + 9)?,
            src: u128::from(be32(b, at + 12)?),
            dst: u128::from(be32(b, at + 16)?),
            l4: at + ihl,
            later_fragment: frag & 0x1fff != 0,
        });
    }
    if *b.get(at)? >> 4 != 6 {
        return None;
    }
    let (src, dst) = (be128(b, at + 8)?, be128(b, at + 24)?);
    let mut next = *b.get(at + 6)?;
    let mut l4 = at + 40;
    let mut later_fragment = false;
    // Hop-by-hop, routing, fragment, destination options: at most a few,
    // each within the copy.
    for _ in 0..4 {
        match next {
            0 | 43 | 60 => {
                let len = (usize::from(*b.get(l4 + 1)?) + 1) * 8;
                next = *b.get(l4)?;
                l4 += len;
            }
            44 => {
                later_fragment = be16(b, l4 + 2)? & 0xfff8 != 0;
                next = *b.get(l4)?;
                l4 += 8;
            }
            _ => break,
        }
    }
    if matches!(next, 0 | 43 | 44 | 60) {
        return None;
    }
    Some(L3 {
        proto: next,
        src,
        dst,
        l4,
        later_fragment,
    })
}

/// Reads the ports (or the echo identifier) of the transport header at
/// `l4`, for protocol `proto`: `None` where the copy cuts it short.
fn ports(b: &[u8], l4: usize, proto: u8) -> Option<(u16, u16)> {
    match proto {
        PROTO_TCP | PROTO_UDP | PROTO_SCTP => Some((be16(b, l4)?, be16(b, l4 + 2)?)),
        _ => Some((0, 0)),
    }
}

impl Packet {
    /// Reads frame prefix `b` (its first bytes, up to [`PREFIX_LEN`]; the
    /// frame may be longer). Up to two VLAN tags are skipped.
    pub fn parse(b: &[u8]) -> Packet {
        Packet::read(b).unwrap_or(Packet::Malformed)
    }

    fn read(b: &[u8]) -> Option<Packet> {
        let mut at = ETH_HEADER_LEN;
        let mut ty = be16(b, 12)?;
        // Tags, 802.1Q and 802.1ad (and the 0x9100 of older QinQ), one
        // after another: two are skipped, a third makes the frame
        // malformed. What they carry is judged as if untagged, whatever
        // its VLAN: a station cannot hide IP from policy behind a tag.
        for _ in 0..2 {
            if !matches!(ty, ETHERTYPE_VLAN | ETHERTYPE_QINQ | ETHERTYPE_QINQ_OLD) {
                break;
            }
            ty = be16(b, at + 2)?;
            at += VLAN_TAG_LEN;
        }
        if matches!(ty, ETHERTYPE_VLAN | ETHERTYPE_QINQ | ETHERTYPE_QINQ_OLD) {
            return None;
        }
        let v6 = match ty {
            ETHERTYPE_IPV4 => false,
            ETHERTYPE_IPV6 => true,
            ETHERTYPE_ARP => {
                // Ethernet/IPv4 ARP: the sender's protocol address at 14.
                if be16(b, at)? != 1 || be16(b, at + 2)? != ETHERTYPE_IPV4 {
                    return Some(Packet::NotIp);
                }
                return Some(Packet::Arp {
                    sender: be32(b, at + 14)?,
                });
            }
            _ => return Some(Packet::NotIp),
        };
        let h = l3(b, at, v6)?;
        let mut tuple = Tuple {
            v6,
            proto: h.proto,
            src: h.src,
            dst: h.dst,
            sport: 0,
            dport: 0,
        };
        if h.later_fragment {
            return Some(Packet::Flow {
                tuple,
                flags: 0,
                fragment: true,
                reply: false,
            });
        }
        let l4 = h.l4;
        let mut flags = 0;
        let mut reply = false;
        match (v6, h.proto) {
            (false, PROTO_ICMP) | (true, PROTO_ICMPV6) => {
                let ty = *b.get(l4)?;
                let (echo_req, echo_reply, error) = if v6 {
                    (ty == 128, ty == 129, (1..=4).contains(&ty))
                } else {
                    (ty == 8, ty == 0, matches!(ty, 3 | 4 | 5 | 11 | 12))
                };
                if v6 && (matches!(ty, 130..=137) || ty == 143) {
                    return Some(Packet::Neighbour { src: h.src });
                }
                if error {
                    // The quoted packet: its IP header and the first 8
                    // bytes after it.
                    let inner = l3(b, l4 + 8, v6)?;
                    if inner.later_fragment {
                        return None;
                    }
                    let (sport, dport) = match inner.proto {
                        PROTO_ICMP | PROTO_ICMPV6 => {
                            let id = be16(b, inner.l4 + 4)?;
                            (id, id)
                        }
                        p => ports(b, inner.l4, p)?,
                    };
                    return Some(Packet::IcmpError {
                        tuple,
                        about: Tuple {
                            v6,
                            proto: inner.proto,
                            src: inner.src,
                            dst: inner.dst,
                            sport,
                            dport,
                        },
                    });
                }
                if echo_req || echo_reply {
                    let id = be16(b, l4 + 4)?;
                    tuple.sport = id;
                    tuple.dport = id;
                    reply = echo_reply;
                }
            }
            (_, p) => {
                let (s, d) = ports(b, l4, p)?;
                tuple.sport = s;
                tuple.dport = d;
                if p == PROTO_TCP {
                    flags = *b.get(l4 + 13)?;
                }
            }
        }
        Some(Packet::Flow {
            tuple,
            flags,
            fragment: false,
            reply,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An Ethernet frame carrying IPv4 `proto` from `src` to `dst` with
    /// transport bytes `l4`.
    pub(crate) fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = proto;
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&dst);
        f.extend_from_slice(&ip);
        f.extend_from_slice(l4);
        f
    }

    /// A TCP header from `sport` to `dport` with `flags`.
    pub(crate) fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        t
    }

    #[test]
    fn reads_tcp_udp_icmp_arp_and_fragments() {
        let f = ipv4(
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            PROTO_TCP,
            &tcp(40000, 80, tcp_flags::SYN),
        );
        let Packet::Flow {
            tuple,
            flags,
            fragment,
            ..
        } = Packet::parse(&f)
        else {
            panic!("{:?}", Packet::parse(&f));
        };
        assert_eq!(
            (
                tuple.src,
                tuple.dst,
                tuple.sport,
                tuple.dport,
                flags,
                fragment
            ),
            (0x0a00_0001, 0x0a00_0002, 40000, 80, tcp_flags::SYN, false)
        );
        // Cut short in the TCP header.
        assert_eq!(Packet::parse(&f[..14 + 20 + 10]), Packet::Malformed);
        // A later fragment: no ports.
        let mut frag = f.clone();
        frag[14 + 6] = 0x00;
        frag[14 + 7] = 0x10;
        assert!(matches!(
            Packet::parse(&frag),
            Packet::Flow {
                fragment: true,
                tuple: Tuple { sport: 0, .. },
                ..
            }
        ));
        // Echo request and reply: the identifier as both ports.
        let echo = |ty: u8| {
            ipv4(
                [10, 0, 0, 1],
                [10, 0, 0, 2],
                PROTO_ICMP,
                &[ty, 0, 0, 0, 0x12, 0x34, 0, 1],
            )
        };
        assert!(matches!(
            Packet::parse(&echo(8)),
            Packet::Flow {
                reply: false,
                tuple: Tuple {
                    sport: 0x1234,
                    dport: 0x1234,
                    ..
                },
                ..
            }
        ));
        assert!(matches!(
            Packet::parse(&echo(0)),
            Packet::Flow { reply: true, .. }
        ));
        // A port unreachable quoting a UDP datagram from 10.0.0.2:5000 to
        // 10.0.0.1:53.
        let quoted = ipv4(
            [10, 0, 0, 2],
            [10, 0, 0, 1],
            PROTO_UDP,
            &[0x13, 0x88, 0, 53, 0, 8, 0, 0],
        );
        let mut icmp = vec![3u8, 3, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&quoted[14..]);
        let err = ipv4([10, 0, 0, 1], [10, 0, 0, 2], PROTO_ICMP, &icmp);
        let Packet::IcmpError { about, .. } = Packet::parse(&err) else {
            panic!()
        };
        assert_eq!(
            (about.src, about.sport, about.dport, about.proto),
            (0x0a00_0002, 5000, 53, PROTO_UDP)
        );
        // ARP: the sender's address.
        let mut arp = vec![0u8; 14 + 28];
        arp[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        arp[14..16].copy_from_slice(&1u16.to_be_bytes());
        arp[16..18].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        arp[14 + 14..14 + 18].copy_from_slice(&[10, 0, 0, 9]);
        assert_eq!(
            Packet::parse(&arp),
            Packet::Arp {
                sender: 0x0a00_0009
            }
        );
        // Not IP.
        let mut lldp = vec![0u8; 60];
        lldp[12..14].copy_from_slice(&0x88ccu16.to_be_bytes());
        assert_eq!(Packet::parse(&lldp), Packet::NotIp);
        assert_eq!(Packet::parse(&[0u8; 5]), Packet::Malformed);
    }

    #[test]
    fn ip_behind_one_or_two_tags_of_any_kind_is_read_and_three_are_malformed() {
        let plain = ipv4([10, 0, 0, 1], [10, 0, 0, 2], PROTO_TCP, &tcp(1, 80, 0x02));
        let want = Packet::parse(&plain);
        assert!(matches!(want, Packet::Flow { .. }));
        let tagged = |types: &[u16]| {
            let mut f = plain[..12].to_vec();
            for &ty in types {
                f.extend_from_slice(&ty.to_be_bytes());
                f.extend_from_slice(&0u16.to_be_bytes()); // VID 0
            }
            f.extend_from_slice(&plain[12..]);
            Packet::parse(&f)
        };
        for tags in [
            &[ETHERTYPE_VLAN][..],
            &[ETHERTYPE_QINQ],
            &[ETHERTYPE_QINQ, ETHERTYPE_VLAN],
            &[ETHERTYPE_VLAN, ETHERTYPE_VLAN],
            &[ETHERTYPE_QINQ_OLD, ETHERTYPE_QINQ],
        ] {
            assert_eq!(tagged(tags), want, "{tags:x?}");
        }
        assert_eq!(
            tagged(&[ETHERTYPE_VLAN, ETHERTYPE_QINQ, ETHERTYPE_VLAN]),
            Packet::Malformed
        );
    }

    #[test]
    fn reads_ipv6_through_extension_headers_and_knows_neighbour_discovery() {
        let v6 = |next: u8, rest: &[u8]| {
            let mut f = vec![0u8; 14];
            f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(rest.len() as u16).to_be_bytes());
            ip[6] = next;
            ip[8..24].copy_from_slice(&0xfd00_0000_0000_0000_0000_0000_0000_0001u128.to_be_bytes());
            ip[24..40]
                .copy_from_slice(&0xfd00_0000_0000_0000_0000_0000_0000_0002u128.to_be_bytes());
            f.extend_from_slice(&ip);
            f.extend_from_slice(rest);
            f
        };
        // A destination-options header, then UDP.
        let mut rest = vec![PROTO_UDP, 0, 0, 0, 0, 0, 0, 0];
        rest.extend_from_slice(&[0x00, 0x35, 0x13, 0x88, 0, 8, 0, 0]);
        let Packet::Flow { tuple, .. } = Packet::parse(&v6(60, &rest)) else {
            panic!()
        };
        assert_eq!(
            (tuple.v6, tuple.proto, tuple.sport, tuple.dport),
            (true, PROTO_UDP, 53, 5000)
        );
        // A neighbour solicitation.
        assert!(matches!(
            Packet::parse(&v6(PROTO_ICMPV6, &[135, 0, 0, 0, 0, 0, 0, 0])),
            Packet::Neighbour { .. }
        ));
        // Extension headers past the copy.
        assert_eq!(Packet::parse(&v6(0, &[0, 200])), Packet::Malformed);
    }
}
