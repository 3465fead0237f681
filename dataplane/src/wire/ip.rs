//! Where the IP and transport headers of an Ethernet frame are, as far as
//! checksum and segmentation offloads need them: up to two VLAN tags, IPv4
//! (with options) or IPv6 (without extension headers), then TCP or UDP.
//! Offsets are from the frame's first byte; every one is checked against
//! the bytes given.

use crate::wire::checksum::Checksum;
use crate::wire::ethernet::{ETHERTYPE_VLAN, HEADER_LEN as ETH_HEADER_LEN, VLAN_TAG_LEN};

/// `ETH_P_IP`.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// `ETH_P_IPV6`.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// 802.1ad service tag (QinQ).
const ETHERTYPE_QINQ: u16 = 0x88a8;
/// `IPPROTO_TCP`.
pub const PROTO_TCP: u8 = 6;
/// `IPPROTO_UDP`.
pub const PROTO_UDP: u8 = 17;
/// Offset of the checksum in a TCP header.
pub const TCP_CHECK: usize = 16;
/// Offset of the checksum in a UDP header.
pub const UDP_CHECK: usize = 6;
/// The length of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;

/// The IP version of a frame's network header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpVersion {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// A TCP or UDP frame's headers, located.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    /// Start of the IP header.
    pub l3: usize,
    /// IPv4 or IPv6.
    pub version: IpVersion,
    /// Start of the TCP or UDP header.
    pub l4: usize,
    /// [`PROTO_TCP`] or [`PROTO_UDP`].
    pub proto: u8,
    /// End of the TCP or UDP header: where the payload starts.
    pub end: usize,
    /// The transport header and payload's length as the IP header gives it
    /// (an Ethernet frame may carry padding after it).
    pub l4_len: usize,
}

impl Headers {
    /// Offset of the transport checksum field from the transport header.
    pub fn check_offset(&self) -> usize {
        if self.proto == PROTO_TCP {
            TCP_CHECK
        } else {
            UDP_CHECK
        }
    }

    /// Adds the pseudo-header of `hdr` (the frame's first bytes, holding
    /// these headers) for a transport length of `l4_len` to `c`.
    pub fn add_pseudo(&self, hdr: &[u8], l4_len: usize, c: &mut Checksum) {
        match self.version {
            IpVersion::V4 => {
                c.add(&hdr[self.l3 + 12..self.l3 + 20]);
                c.add_be16(u16::from(self.proto));
                c.add_be16(l4_len as u16);
            }
            IpVersion::V6 => {
                c.add(&hdr[self.l3 + 8..self.l3 + 40]);
                c.add_be16((l4_len >> 16) as u16);
                c.add_be16(l4_len as u16);
                c.add_be16(u16::from(self.proto));
            }
        }
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Locates the headers of a TCP or UDP frame in its first bytes `b`.
/// `None` for anything else (another protocol, IPv6 extension headers, an
/// IP fragment, a header cut short), which no offload applies to.
pub fn locate(b: &[u8]) -> Option<Headers> {
    let mut l3 = ETH_HEADER_LEN;
    let mut ty = be16(b, 12)?;
    for _ in 0..2 {
        if ty != ETHERTYPE_VLAN && ty != ETHERTYPE_QINQ {
            break;
        }
        ty = be16(b, l3 + 2)?;
        l3 += VLAN_TAG_LEN;
    }
    let (version, proto, l4, l4_len) = match ty {
        ETHERTYPE_IPV4 => {
            let vihl = *b.get(l3)?;
            let ihl = usize::from(vihl & 0x0f) * 4;
            if vihl >> 4 != 4 || ihl < 20 {
                return None;
            }
            let total = usize::from(be16(b, l3 + 2)?);
            // More fragments, or an offset: not a whole datagram.
            if be16(b, l3 + 6)? & 0x3fff != 0 || total < ihl {
                return None;
            }
            (IpVersion::V4, *b.get(l3 + 9)?, l3 + ihl, total - ihl)
        }
        ETHERTYPE_IPV6 => {
            if *b.get(l3)? >> 4 != 6 {
                return None;
            }
            let payload = usize::from(be16(b, l3 + 4)?);
            (IpVersion::V6, *b.get(l3 + 6)?, l3 + 40, payload)
        }
        _ => return None,
    };
    let end = match proto {
        PROTO_TCP => l4 + usize::from(*b.get(l4 + 12)? >> 4) * 4,
        PROTO_UDP => l4 + UDP_HEADER_LEN,
        _ => return None,
    };
    if end > b.len() || end - l4 < UDP_HEADER_LEN || end - l4 > l4_len {
        return None;
    }
    if proto == PROTO_TCP && end - l4 < 20 {
        return None;
    }
    Some(Headers {
        l3,
        version,
        l4,
        proto,
        end,
        l4_len,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An untagged IPv4 TCP frame with `payload` bytes of payload.
    pub(crate) fn tcp4(payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 54 + payload];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((40 + payload) as u16).to_be_bytes());
        f[22] = 64;
        f[23] = PROTO_TCP;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[46] = 5 << 4;
        for (i, b) in f[54..].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        f
    }

    #[test]
    fn finds_tcp_behind_two_tags_and_ipv4_options() {
        let mut f = tcp4(10);
        assert_eq!(
            locate(&f),
            Some(Headers {
                l3: 14,
                version: IpVersion::V4,
                l4: 34,
                proto: PROTO_TCP,
                end: 54,
                l4_len: 30,
            })
        );
        // Two tags in front, 8 bytes of IP options.
        let mut t = f[..12].to_vec();
        t.extend_from_slice(&[0x88, 0xa8, 0, 5, 0x81, 0, 0, 7]);
        t.extend_from_slice(&f[12..34]);
        t.extend_from_slice(&[1; 8]);
        t.extend_from_slice(&f[34..]);
        t[22] = 0x47;
        t[24..26].copy_from_slice(&58u16.to_be_bytes());
        let h = locate(&t).unwrap();
        assert_eq!((h.l3, h.l4, h.end, h.l4_len), (22, 50, 70, 30));
        // A fragment is not located; nor is a header cut short.
        f[20] = 0x20;
        assert_eq!(locate(&f), None);
        assert_eq!(locate(&tcp4(0)[..53]), None);
    }
}
