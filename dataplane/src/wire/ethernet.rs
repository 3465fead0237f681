//! Ethernet II and IEEE 802.1Q headers.

pub use switchyard_api::{MacAddr, MacParseError};

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = 14;
/// Length of an 802.1Q tag.
pub const VLAN_TAG_LEN: usize = 4;
/// Ethertype of an 802.1Q tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Ethertype of an 802.1ad (QinQ) service tag.
pub const ETHERTYPE_QINQ: u16 = 0x88a8;
pub use switchyard_api::vlan::VLAN_ID_MAX;

mod field {
    use std::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const TCI: Range<usize> = 14..16;
    pub const INNER_ETHERTYPE: Range<usize> = 16..18;
}

/// An 802.1Q tag control information field.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct VlanTag {
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN id (12 bits); 0 means "priority tag only".
    pub vid: u16,
}

impl VlanTag {
    /// Decodes a TCI.
    pub fn from_tci(tci: u16) -> VlanTag {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }

    /// Encodes the TCI.
    pub fn tci(&self) -> u16 {
        (u16::from(self.pcp & 7) << 13) | (u16::from(self.dei) << 12) | (self.vid & 0x0fff)
    }
}

/// Error for a buffer too short to hold the header it claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("truncated frame: {len} bytes, need {need}")]
pub struct Truncated {
    /// Bytes present.
    pub len: usize,
    /// Bytes needed.
    pub need: usize,
}

/// Bytes of a frame's head that [`L2Head`] is read from: the header and
/// one tag.
pub const HEAD_LEN: usize = HEADER_LEN + VLAN_TAG_LEN;

/// A frame's L2 facts as a switch decides on them, each read once from its
/// first bytes (a peer may write them meanwhile: the lookups and a
/// rewritten header see the same values). The addresses are the low 48
/// bits of a little-endian load of their six bytes (the first byte, with
/// the group bit, lowest; the top 16 bits are the next field's). The
/// forwarding path reads every frame through it; [`EthernetFrame`] is the
/// view for code that holds a slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L2Head {
    /// The destination (low 48 bits).
    pub dst: u64,
    /// The source (low 48 bits).
    pub src: u64,
    /// Whether an 802.1Q tag follows the addresses.
    pub tagged: bool,
    /// The tag's VLAN id (0 untagged).
    pub vid: u16,
}

/// The words an [`L2Head`] is decoded from: bytes 0..8, 6..14 and 12..16
/// of a frame's head, each loaded once (in native byte order), and how
/// many of the head's bytes are the frame's.
#[derive(Debug, Clone, Copy)]
pub struct HeadWords(u64, u64, u32, usize);

impl HeadWords {
    /// Loads the head at `p`, of which the first `len` bytes are the
    /// frame's (all [`HEAD_LEN`] of them, or fewer, zero-padded, for a
    /// short frame).
    ///
    /// # Safety
    ///
    /// `p..p+HEAD_LEN` must be readable. It may be memory a peer writes
    /// meanwhile: it is only loaded by value, never referenced.
    #[inline(always)]
    pub unsafe fn load(p: *const u8, len: usize) -> HeadWords {
        // SAFETY: the caller's promise; unaligned loads of plain integers.
        unsafe {
            HeadWords(
                std::ptr::read_unaligned(p.cast::<u64>()),
                std::ptr::read_unaligned(p.add(6).cast::<u64>()),
                std::ptr::read_unaligned(p.add(12).cast::<u32>()),
                len,
            )
        }
    }

    /// The words of a frame's first bytes (all of them, or its first
    /// [`HEAD_LEN`] or more), zero-padded.
    pub fn from_prefix(bytes: &[u8]) -> HeadWords {
        let mut head = [0u8; HEAD_LEN];
        let n = bytes.len().min(HEAD_LEN);
        head[..n].copy_from_slice(&bytes[..n]);
        // SAFETY: `head` is our own `HEAD_LEN` bytes.
        unsafe { HeadWords::load(head.as_ptr(), bytes.len()) }
    }
}

impl L2Head {
    /// The head the words hold; `Err(runt)` if the frame is too short for
    /// its header (the caller's error value: the forwarding path's drop
    /// reason, built in place).
    #[inline]
    pub fn decode<E>(w: HeadWords, runt: E) -> Result<L2Head, E> {
        let HeadWords(a, b, c, len) = w;
        if len < HEADER_LEN {
            return Err(runt);
        }
        // In wire order, as the addresses: the type in bytes 0..2, the
        // tag's control field in bytes 2..4.
        let c = u32::from_le(c);
        let tagged = u16::from_be(c as u16) == ETHERTYPE_VLAN;
        if tagged && len < HEAD_LEN {
            return Err(runt);
        }
        let vid = if tagged {
            u16::from_be((c >> 16) as u16) & 0x0fff
        } else {
            0
        };
        Ok(L2Head {
            dst: u64::from_le(a),
            src: u64::from_le(b),
            tagged,
            vid,
        })
    }

    /// The head of a frame whose first bytes are `bytes` (all of them, or
    /// its first [`HEAD_LEN`] or more); `None` for a runt.
    pub fn from_prefix(bytes: &[u8]) -> Option<L2Head> {
        L2Head::decode(HeadWords::from_prefix(bytes), ()).ok()
    }

    /// The destination address.
    #[inline]
    pub fn dst_mac(&self) -> MacAddr {
        MacAddr::from_bytes(&self.dst.to_le_bytes())
    }

    /// The source address.
    #[inline]
    pub fn src_mac(&self) -> MacAddr {
        MacAddr::from_bytes(&self.src.to_le_bytes())
    }

    /// The destination is a group (multicast or broadcast) address.
    #[inline]
    pub fn dst_multicast(&self) -> bool {
        self.dst & 1 != 0
    }

    /// The source is a group address (never a station's own).
    #[inline]
    pub fn src_multicast(&self) -> bool {
        self.src & 1 != 0
    }

    /// The two addresses as they lead the frame.
    #[inline]
    pub fn addrs(&self) -> [u8; 12] {
        let mut a = [0u8; 12];
        a[..6].copy_from_slice(&self.dst_mac().0);
        a[6..].copy_from_slice(&self.src_mac().0);
        a
    }
}

/// A view of an Ethernet frame, optionally carrying one 802.1Q tag.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checking it.
    pub fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps a buffer, checking that the (possibly tagged) header fits.
    pub fn new_checked(buffer: T) -> Result<Self, Truncated> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Checks the buffer holds the full header, including the tag if there is one.
    pub fn check_len(&self) -> Result<(), Truncated> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Truncated {
                len,
                need: HEADER_LEN,
            });
        }
        let need = self.header_len();
        if len < need {
            return Err(Truncated { len, need });
        }
        Ok(())
    }

    /// Destination address.
    pub fn dst(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::DST])
    }

    /// Source address.
    pub fn src(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::SRC])
    }

    /// The outer ethertype (0x8100 for a tagged frame).
    pub fn ethertype(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::ETHERTYPE];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The 802.1Q tag, if the frame has one.
    pub fn vlan(&self) -> Option<VlanTag> {
        if self.ethertype() != ETHERTYPE_VLAN {
            return None;
        }
        let b = &self.buffer.as_ref()[field::TCI];
        Some(VlanTag::from_tci(u16::from_be_bytes([b[0], b[1]])))
    }

    /// The ethertype of the payload (after the tag, if any).
    pub fn inner_ethertype(&self) -> u16 {
        if self.ethertype() == ETHERTYPE_VLAN {
            let b = &self.buffer.as_ref()[field::INNER_ETHERTYPE];
            u16::from_be_bytes([b[0], b[1]])
        } else {
            self.ethertype()
        }
    }

    /// Header length: 18 when tagged, else 14.
    pub fn header_len(&self) -> usize {
        if self.ethertype() == ETHERTYPE_VLAN {
            HEADER_LEN + VLAN_TAG_LEN
        } else {
            HEADER_LEN
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination address.
    pub fn set_dst(&mut self, mac: MacAddr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&mac.0);
    }
    /// Sets the source address.
    pub fn set_src(&mut self, mac: MacAddr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&mac.0);
    }
    /// Sets the outer ethertype.
    pub fn set_ethertype(&mut self, t: u16) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&t.to_be_bytes());
    }
    /// Writes an 802.1Q tag in bytes 12..16 (the caller has made room).
    pub fn set_vlan(&mut self, tag: VlanTag) {
        self.set_ethertype(ETHERTYPE_VLAN);
        self.buffer.as_mut()[field::TCI].copy_from_slice(&tag.tci().to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forwarding_head_agrees_with_the_frame_view() {
        let mut f = [0u8; 64];
        f[0..6].copy_from_slice(&[0x01, 0, 0x5e, 0, 0, 1]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        f[14..16].copy_from_slice(&0x2064u16.to_be_bytes());
        for len in [0, 13, 14, 17, 18, 64] {
            let head = L2Head::from_prefix(&f[..len]);
            let view = EthernetFrame::new_checked(&f[..len]);
            assert_eq!(head.is_some(), view.is_ok(), "{len} bytes");
            let (Some(h), Ok(v)) = (head, view) else {
                continue;
            };
            assert_eq!((h.dst_mac(), h.src_mac()), (v.dst(), v.src()));
            assert_eq!((h.tagged, h.vid), (true, 100));
            assert!(h.dst_multicast() && !h.src_multicast());
            // SAFETY: `f` holds `HEAD_LEN` bytes and more.
            let loaded = L2Head::decode(unsafe { HeadWords::load(f.as_ptr(), len) }, ());
            assert_eq!(loaded, Ok(h));
        }
        // Untagged, 14 bytes is whole.
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let h = L2Head::from_prefix(&f[..14]).unwrap();
        assert_eq!((h.tagged, h.vid), (false, 0));
        assert_eq!(&h.addrs()[..], &f[..12]);
    }

    #[test]
    fn parses_untagged_and_tagged() {
        let mut f = [0u8; 64];
        f[0..6].copy_from_slice(&[0xff; 6]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert!(e.dst().is_broadcast());
        assert_eq!(e.src().to_string(), "02:00:00:00:00:01");
        assert_eq!(e.vlan(), None);
        assert_eq!(e.header_len(), 14);

        let mut t = EthernetFrame::new_unchecked(&mut f[..]);
        t.set_vlan(VlanTag {
            pcp: 5,
            dei: false,
            vid: 100,
        });
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!(e.vlan().unwrap().vid, 100);
        assert_eq!(e.vlan().unwrap().pcp, 5);
        assert_eq!(e.header_len(), 18);
    }

    #[test]
    fn rejects_short_frames() {
        assert!(EthernetFrame::new_checked(&[0u8; 13][..]).is_err());
        let mut f = [0u8; 15];
        f[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        assert!(EthernetFrame::new_checked(&f[..]).is_err());
    }
}
