//! The VXLAN header (RFC 7348, section 5): 8 bytes before the inner
//! Ethernet frame in a UDP datagram.
//!
//! ```text
//!  0               1               2               3
//! |R|R|R|R|I|R|R|R|            Reserved                           |
//! |                VXLAN Network Identifier (VNI) |   Reserved    |
//! ```
//!
//! A header is read as the Linux kernel reads one (`vxlan_rcv`): the I flag
//! set and every reserved bit clear, else the packet is malformed. The RFC
//! lets a receiver ignore reserved bits; the kernel does not, because
//! extensions (GBP, GPE, RCO) put meaning there that a plain VTEP would
//! misread, and neither does this switch.

use super::ethernet::HEADER_LEN as ETH_HEADER_LEN;

/// Bytes of the header.
pub const HEADER_LEN: usize = 8;
/// Bytes a VXLAN packet adds around its frame besides the header: the
/// UDP header and an IPv4 header (without options).
pub const UDP_IPV4_LEN: usize = 8 + 20;
/// The same over IPv6 (without extension headers).
pub const UDP_IPV6_LEN: usize = 8 + 40;
/// The I flag: the VNI is valid.
const FLAG_VNI: u8 = 0x08;

/// Why a datagram is no VXLAN packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VxlanError {
    /// Shorter than the header and an Ethernet header.
    Truncated,
    /// The I flag clear, or a reserved bit set.
    BadHeader,
}

/// The VNI of the VXLAN packet `datagram` (a UDP payload), whose inner
/// frame starts at [`HEADER_LEN`] and is at least an Ethernet header long.
pub fn parse(datagram: &[u8]) -> Result<u32, VxlanError> {
    if datagram.len() < HEADER_LEN + ETH_HEADER_LEN {
        return Err(VxlanError::Truncated);
    }
    let word = |i: usize| {
        u32::from_be_bytes([
            datagram[i],
            datagram[i + 1],
            datagram[i + 2],
            datagram[i + 3],
        ])
    };
    let (flags, vni) = (word(0), word(4));
    if flags != u32::from(FLAG_VNI) << 24 || vni & 0xff != 0 {
        return Err(VxlanError::BadHeader);
    }
    Ok(vni >> 8)
}

/// The header for VNI `vni` (at most 24 bits), as the kernel writes it.
pub fn header(vni: u32) -> [u8; HEADER_LEN] {
    debug_assert!(vni <= 0x00ff_ffff);
    let v = (vni << 8).to_be_bytes();
    [FLAG_VNI, 0, 0, 0, v[0], v[1], v[2], v[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_read_back_and_the_kernels_rules_hold() {
        let mut p = header(0x12_3456).to_vec();
        assert_eq!(p, [0x08, 0, 0, 0, 0x12, 0x34, 0x56, 0]);
        p.extend_from_slice(&[0u8; ETH_HEADER_LEN]);
        assert_eq!(parse(&p), Ok(0x12_3456));
        assert_eq!(
            parse(&p[..HEADER_LEN + ETH_HEADER_LEN - 1]),
            Err(VxlanError::Truncated)
        );
        // No I flag; a reserved flag (GPE's P); the reserved byte after the VNI.
        for (at, v) in [(0, 0x00), (0, 0x0c), (1, 0x01), (7, 0x01)] {
            let mut q = p.clone();
            q[at] = v;
            assert_eq!(parse(&q), Err(VxlanError::BadHeader), "byte {at} = {v:#x}");
        }
    }
}
