//! The virtio-net header that precedes every frame on a virtio-net queue.
//!
//! With `VIRTIO_F_VERSION_1` the header is always [`HEADER_LEN`] bytes,
//! little-endian, whether or not mergeable receive buffers were negotiated
//! (virtio 1.2, section 5.1.6). Its offload fields (flags, GSO type and
//! size, checksum start and offset) are read and written as
//! [`crate::queue::Offload`]; a header for a frame with no work left is all
//! zeroes except `num_buffers`.

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
    fn short_buffer_is_refused() {
        assert_eq!(
            NetHeader::new_checked(&[0u8; 11][..]).unwrap_err(),
            Truncated(11)
        );
    }
}
