//! The virtio-net header that precedes every frame on a virtio-net queue.
//!
//! With `VIRTIO_F_VERSION_1` the header is always [`HEADER_LEN`] bytes,
//! little-endian, whether or not mergeable receive buffers were negotiated
//! (virtio 1.2, section 5.1.6). Its offload fields (flags, GSO type and
//! size, checksum start and offset: [`OffloadFields`], the
//! [`VNET_HDR_LEN`] bytes the kernel's `PACKET_VNET_HDR` and
//! `IFF_VNET_HDR` put in front of a frame too) are what a frame carries
//! through the switch as [`crate::queue::Offload`]; a header for a frame
//! with no work left is all zeroes except `num_buffers`.

use std::mem::{offset_of, size_of};

use virtio_bindings::virtio_net::virtio_net_hdr_v1 as Hdr;

/// Size of `struct virtio_net_hdr_v1` (12 bytes).
pub const HEADER_LEN: usize = size_of::<Hdr>();

/// Field offsets, from `virtio-bindings`' `virtio_net_hdr_v1`. The view
/// reads bytes at these offsets (the header lies in guest memory a driver
/// may change, so it is never borrowed as the struct).
pub mod field {
    use super::{offset_of, Hdr};
    /// `u8` flags (`VIRTIO_NET_HDR_F_*`).
    pub const FLAGS: usize = offset_of!(Hdr, flags);
    /// `u8` GSO type.
    pub const GSO_TYPE: usize = offset_of!(Hdr, gso_type);
    /// `le16` header length.
    pub const HDR_LEN: usize = offset_of!(Hdr, hdr_len);
    /// `le16` GSO segment size.
    pub const GSO_SIZE: usize = offset_of!(Hdr, gso_size);
    /// `le16` checksum start (the first field of the checksum union).
    pub const CSUM_START: usize = offset_of!(Hdr, __bindgen_anon_1);
    /// `le16` checksum offset.
    pub const CSUM_OFFSET: usize = CSUM_START + 2;
    /// `le16` number of merged receive buffers.
    pub const NUM_BUFFERS: usize = offset_of!(Hdr, num_buffers);
}

const _: () = assert!(HEADER_LEN == 12 && field::NUM_BUFFERS == 10 && field::CSUM_START == 6);

/// Bytes of the header's offload fields (`struct virtio_net_hdr`, without
/// `num_buffers`): what `PACKET_VNET_HDR` and `IFF_VNET_HDR` put in front
/// of a frame.
pub const VNET_HDR_LEN: usize = field::NUM_BUFFERS;

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum from `csum_start` to the
/// end is to be computed and stored at `csum_start + csum_offset`.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksum was verified already.
pub const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP` (UFO: IP fragmentation, which no current
/// kernel sends; refused).
pub const GSO_UDP: u8 = 3;
/// `VIRTIO_NET_HDR_GSO_TCPV6`.
pub const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP segmentation (USO).
pub const GSO_UDP_L4: u8 = 5;
/// `VIRTIO_NET_HDR_GSO_ECN`: the TCP flow uses ECN.
pub const GSO_ECN: u8 = 0x80;

/// The header's offload fields, as the wire has them (little-endian, as
/// virtio 1.0 and the kernel on every little-endian host write them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadFields {
    /// `VIRTIO_NET_HDR_F_*`.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*` (0: none).
    pub gso_type: u8,
    /// Bytes of headers in the linear part.
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Where the checksum to compute starts.
    pub csum_start: u16,
    /// Where it goes, from `csum_start`.
    pub csum_offset: u16,
}

impl OffloadFields {
    /// Reads the fields.
    #[inline]
    pub fn read(h: &[u8; VNET_HDR_LEN]) -> OffloadFields {
        let le = |at: usize| u16::from_le_bytes([h[at], h[at + 1]]);
        OffloadFields {
            flags: h[field::FLAGS],
            gso_type: h[field::GSO_TYPE],
            hdr_len: le(field::HDR_LEN),
            gso_size: le(field::GSO_SIZE),
            csum_start: le(field::CSUM_START),
            csum_offset: le(field::CSUM_OFFSET),
        }
    }

    /// Writes the fields.
    #[inline]
    pub fn to_bytes(self) -> [u8; VNET_HDR_LEN] {
        let mut h = [0u8; VNET_HDR_LEN];
        h[field::FLAGS] = self.flags;
        h[field::GSO_TYPE] = self.gso_type;
        h[field::HDR_LEN..field::HDR_LEN + 2].copy_from_slice(&self.hdr_len.to_le_bytes());
        h[field::GSO_SIZE..field::GSO_SIZE + 2].copy_from_slice(&self.gso_size.to_le_bytes());
        h[field::CSUM_START..field::CSUM_START + 2].copy_from_slice(&self.csum_start.to_le_bytes());
        h[field::CSUM_OFFSET..field::CSUM_OFFSET + 2]
            .copy_from_slice(&self.csum_offset.to_le_bytes());
        h
    }
}

/// Error for a buffer shorter than the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("virtio-net header needs {HEADER_LEN} bytes, got {0}")]
pub struct Truncated(pub usize);

/// A view of a virtio-net header.
#[derive(Debug, Clone, Copy)]
pub struct NetHeader<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> NetHeader<T> {
    /// Wraps `buf` after checking it holds a whole header.
    pub fn new_checked(buf: T) -> Result<Self, Truncated> {
        let n = buf.as_ref().len();
        if n < HEADER_LEN {
            return Err(Truncated(n));
        }
        Ok(NetHeader { buf })
    }

    fn u16_at(&self, at: usize) -> u16 {
        let b = self.buf.as_ref();
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    /// Flags.
    pub fn flags(&self) -> u8 {
        self.buf.as_ref()[field::FLAGS]
    }

    /// GSO type (0: none).
    pub fn gso_type(&self) -> u8 {
        self.buf.as_ref()[field::GSO_TYPE]
    }

    /// GSO segment size.
    pub fn gso_size(&self) -> u16 {
        self.u16_at(field::GSO_SIZE)
    }

    /// Number of receive buffers the frame spans.
    pub fn num_buffers(&self) -> u16 {
        self.u16_at(field::NUM_BUFFERS)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> NetHeader<T> {
    /// Zeroes every field: no offloads, one buffer unless set otherwise.
    pub fn clear(&mut self) {
        self.buf.as_mut()[..HEADER_LEN].fill(0);
    }

    /// Sets `num_buffers`.
    pub fn set_num_buffers(&mut self, n: u16) {
        self.buf.as_mut()[field::NUM_BUFFERS..field::NUM_BUFFERS + 2]
            .copy_from_slice(&n.to_le_bytes());
    }
}

/// The header Switchyard writes in front of a frame spanning `num_buffers`
/// receive buffers.
pub fn header_bytes(num_buffers: u16) -> [u8; HEADER_LEN] {
    let mut b = [0u8; HEADER_LEN];
    let mut h = NetHeader { buf: &mut b[..] };
    h.clear();
    h.set_num_buffers(num_buffers);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let b = header_bytes(3);
        let h = NetHeader::new_checked(&b[..]).unwrap();
        assert_eq!(h.num_buffers(), 3);
        assert_eq!(h.flags(), 0);
        assert_eq!(h.gso_type(), 0);
        assert_eq!(h.gso_size(), 0);
        assert_eq!(&b[10..12], &[3, 0]);
    }

    #[test]
    fn offload_fields_round_trip_at_their_offsets() {
        let f = OffloadFields {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 0x0102,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        let b = f.to_bytes();
        assert_eq!(b, [1, 1, 2, 1, 0xa8, 5, 34, 0, 16, 0]);
        assert_eq!(OffloadFields::read(&b), f);
    }

    #[test]
    fn short_buffer_is_refused() {
        assert_eq!(
            NetHeader::new_checked(&[0u8; 11][..]).unwrap_err(),
            Truncated(11)
        );
    }
}
