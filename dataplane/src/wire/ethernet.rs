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
