//! memif protocol version 2.0: control messages, ring header and descriptors.
//!
//! Layouts follow FD.io VPP `memif.h` and DPDK `drivers/net/memif`: every
//! control message is exactly [`MSG_SIZE`] bytes, a `u16` type followed by a
//! packed payload, in host byte order (memif peers share one host).

use std::ops::Range;

/// Size of every control message.
pub const MSG_SIZE: usize = 128;
/// Protocol version 2.0: `(major << 8) | minor`.
pub const VERSION: u16 = 0x0200;
/// Ring cookie that both sides check.
pub const COOKIE: u32 = 0x03E3_1F20;
/// Length of the name fields.
pub const NAME_LEN: usize = 32;
/// Length of the secret field (NUL-terminated).
pub const SECRET_LEN: usize = 24;
/// Length of the DISCONNECT reason string.
pub const DISCONNECT_STRING_LEN: usize = 96;
/// Largest ring size exponent we accept (2^14 descriptors).
pub const MAX_LOG2_RING_SIZE: u8 = 14;

/// Ring header size with 64-byte cache lines (x86): cookie/flags/head on the
/// first line, tail on the second, descriptors from the third.
pub const RING_HEADER_SIZE: usize = 128;
/// Size of one descriptor.
pub const DESC_SIZE: usize = 16;

/// Offsets inside the ring header.
pub mod ring_field {
    /// `u32` cookie.
    pub const COOKIE: usize = 0;
    /// `u16` flags, written by the ring's receiver.
    pub const FLAGS: usize = 4;
    /// `u16` head, written only by the slave.
    pub const HEAD: usize = 6;
    /// `u16` tail, written only by the master.
    pub const TAIL: usize = 64;
}

/// Offsets inside a descriptor.
pub mod desc_field {
    /// `u16` flags.
    pub const FLAGS: usize = 0;
    /// `u16` region index.
    pub const REGION: usize = 2;
    /// `u32` length.
    pub const LENGTH: usize = 4;
    /// `u32` offset inside the region.
    pub const OFFSET: usize = 8;
    /// `u32` metadata.
    pub const METADATA: usize = 12;
}

/// Ring flag: the receiver is polling; do not signal its eventfd.
pub const RING_FLAG_MASK_INT: u16 = 1;
/// Descriptor flag: the frame continues in the next descriptor.
pub const DESC_FLAG_NEXT: u16 = 1;

/// Bytes a ring of `2^log2` descriptors occupies.
pub fn ring_bytes(log2_size: u8) -> u64 {
    RING_HEADER_SIZE as u64 + ((DESC_SIZE as u64) << log2_size)
}

/// Message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum MsgType {
    /// Master acknowledges INIT, ADD_REGION, ADD_RING.
    Ack = 1,
    /// Master greets a new connection.
    Hello = 2,
    /// Slave identifies itself.
    Init = 3,
    /// Slave passes a shared memory region (fd attached).
    AddRegion = 4,
    /// Slave describes a ring (eventfd attached).
    AddRing = 5,
    /// Slave asks to bring the link up.
    Connect = 6,
    /// Master confirms the link is up.
    Connected = 7,
    /// Either side tears the link down.
    Disconnect = 8,
}

impl MsgType {
    /// Decodes a type number.
    pub fn from_u16(v: u16) -> Option<MsgType> {
        Some(match v {
            1 => MsgType::Ack,
            2 => MsgType::Hello,
            3 => MsgType::Init,
            4 => MsgType::AddRegion,
            5 => MsgType::AddRing,
            6 => MsgType::Connect,
            7 => MsgType::Connected,
            8 => MsgType::Disconnect,
            _ => return None,
        })
    }
}

/// Interface mode carried in INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Ethernet frames.
    Ethernet,
    /// Raw IP packets.
    Ip,
    /// VPP punt/inject.
    PuntInject,
}

impl Mode {
    /// Wire value.
    pub fn to_u8(self) -> u8 {
        match self {
            Mode::Ethernet => 0,
            Mode::Ip => 1,
            Mode::PuntInject => 2,
        }
    }
    /// Decodes a wire value.
    pub fn from_u8(v: u8) -> Option<Mode> {
        match v {
            0 => Some(Mode::Ethernet),
            1 => Some(Mode::Ip),
            2 => Some(Mode::PuntInject),
            _ => None,
        }
    }
}

/// Why a message could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    /// The datagram was not exactly 128 bytes.
    #[error("control message is {0} bytes, expected 128")]
    BadSize(usize),
    /// Unknown type number.
    #[error("unknown control message type {0}")]
    UnknownType(u16),
    /// A field outside what the protocol allows.
    #[error("invalid {field} in {msg:?} message")]
    BadField {
        /// The message.
        msg: MsgType,
        /// The field.
        field: &'static str,
    },
}

/// A fixed-size name or string field, NUL-padded.
#[derive(Clone, PartialEq, Eq)]
pub struct FixedStr<const N: usize>(pub [u8; N]);

impl<const N: usize> FixedStr<N> {
    /// Builds a field from a string, truncated so a NUL always fits.
    pub fn new(s: &str) -> Self {
        let mut b = [0u8; N];
        let n = s.len().min(N - 1);
        b[..n].copy_from_slice(&s.as_bytes()[..n]);
        FixedStr(b)
    }
    /// The bytes up to the first NUL (or all of them).
    pub fn as_bytes(&self) -> &[u8] {
        let end = self.0.iter().position(|&c| c == 0).unwrap_or(N);
        &self.0[..end]
    }
    /// Lossy text, for logs.
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }
}

impl<const N: usize> std::fmt::Debug for FixedStr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string_lossy())
    }
}

/// A parsed control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// ACK.
    Ack,
    /// HELLO from the master.
    Hello {
        /// Peer name.
        name: FixedStr<NAME_LEN>,
        /// Lowest version spoken.
        min_version: u16,
        /// Highest version spoken.
        max_version: u16,
        /// Largest region index accepted.
        max_region: u16,
        /// Largest master-to-slave ring index accepted.
        max_m2s_ring: u16,
        /// Largest slave-to-master ring index accepted.
        max_s2m_ring: u16,
        /// Largest ring size exponent accepted.
        max_log2_ring_size: u8,
    },
    /// INIT from the slave.
    Init {
        /// Protocol version.
        version: u16,
        /// Interface id on the socket.
        id: u32,
        /// Raw mode byte.
        mode: u8,
        /// Shared secret.
        secret: FixedStr<SECRET_LEN>,
        /// Peer name.
        name: FixedStr<NAME_LEN>,
    },
    /// ADD_REGION.
    AddRegion {
        /// Region index.
        index: u16,
        /// Region size in bytes.
        size: u64,
    },
    /// ADD_RING.
    AddRing {
        /// Flags; bit 0 set for slave-to-master.
        flags: u16,
        /// Ring index.
        index: u16,
        /// Region holding the ring.
        region: u16,
        /// Offset of the ring in the region.
        offset: u32,
        /// Ring size exponent.
        log2_ring_size: u8,
        /// Private header size (must be 0).
        private_hdr_size: u16,
    },
    /// CONNECT.
    Connect {
        /// Slave's interface name.
        if_name: FixedStr<NAME_LEN>,
    },
    /// CONNECTED.
    Connected {
        /// Master's interface name.
        if_name: FixedStr<NAME_LEN>,
    },
    /// DISCONNECT.
    Disconnect {
        /// Error code.
        code: u32,
        /// Reason.
        reason: FixedStr<DISCONNECT_STRING_LEN>,
    },
}

/// ADD_RING flag: the ring carries slave-to-master traffic.
pub const ADD_RING_FLAG_S2M: u16 = 1;

/// Where each field of each message lies, from the start of the 128-byte
/// message: the 2-byte type, then the packed payload, as the
/// `memif_msg_*_t` structs of VPP's `memif.h` (`__attribute__((packed))`).
/// [`Message::parse`] and [`Message::emit`] both read this one table.
mod off {
    use std::ops::Range;
    pub const TYPE: Range<usize> = 0..2;
    pub mod hello {
        use std::ops::Range;
        pub const NAME: Range<usize> = 2..34;
        pub const MIN_VERSION: Range<usize> = 34..36;
        pub const MAX_VERSION: Range<usize> = 36..38;
        pub const MAX_REGION: Range<usize> = 38..40;
        pub const MAX_M2S_RING: Range<usize> = 40..42;
        pub const MAX_S2M_RING: Range<usize> = 42..44;
        pub const MAX_LOG2_RING_SIZE: usize = 44;
    }
    pub mod init {
        use std::ops::Range;
        pub const VERSION: Range<usize> = 2..4;
        pub const ID: Range<usize> = 4..8;
        pub const MODE: usize = 8;
        pub const SECRET: Range<usize> = 9..33;
        pub const NAME: Range<usize> = 33..65;
    }
    pub mod add_region {
        use std::ops::Range;
        pub const INDEX: Range<usize> = 2..4;
        pub const SIZE: Range<usize> = 4..12;
    }
    pub mod add_ring {
        use std::ops::Range;
        pub const FLAGS: Range<usize> = 2..4;
        pub const INDEX: Range<usize> = 4..6;
        pub const REGION: Range<usize> = 6..8;
        pub const OFFSET: Range<usize> = 8..12;
        pub const LOG2_RING_SIZE: usize = 12;
        pub const PRIVATE_HDR_SIZE: Range<usize> = 13..15;
    }
    /// CONNECT and CONNECTED.
    pub mod connect {
        use std::ops::Range;
        pub const IF_NAME: Range<usize> = 2..34;
    }
    pub mod disconnect {
        use std::ops::Range;
        pub const CODE: Range<usize> = 2..6;
        pub const REASON: Range<usize> = 6..102;
    }
}

// The string fields are as long as their types; every field fits.
const _: () = {
    assert!(off::hello::NAME.end - off::hello::NAME.start == NAME_LEN);
    assert!(off::init::SECRET.end - off::init::SECRET.start == SECRET_LEN);
    assert!(off::init::NAME.end - off::init::NAME.start == NAME_LEN);
    assert!(off::connect::IF_NAME.end - off::connect::IF_NAME.start == NAME_LEN);
    assert!(off::disconnect::REASON.end - off::disconnect::REASON.start == DISCONNECT_STRING_LEN);
    assert!(off::disconnect::REASON.end <= MSG_SIZE && off::init::NAME.end <= MSG_SIZE);
};

fn rd16(b: &[u8], r: Range<usize>) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[r]);
    u16::from_ne_bytes(a)
}
fn rd32(b: &[u8], r: Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_ne_bytes(a)
}
fn rd64(b: &[u8], r: Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_ne_bytes(a)
}
fn rdstr<const N: usize>(b: &[u8], r: Range<usize>) -> FixedStr<N> {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[r]);
    FixedStr(a)
}

impl Message {
    /// The message's type.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Message::Ack => MsgType::Ack,
            Message::Hello { .. } => MsgType::Hello,
            Message::Init { .. } => MsgType::Init,
            Message::AddRegion { .. } => MsgType::AddRegion,
            Message::AddRing { .. } => MsgType::AddRing,
            Message::Connect { .. } => MsgType::Connect,
            Message::Connected { .. } => MsgType::Connected,
            Message::Disconnect { .. } => MsgType::Disconnect,
        }
    }

    /// Parses one datagram.
    pub fn parse(buf: &[u8]) -> Result<Message, MsgError> {
        if buf.len() != MSG_SIZE {
            return Err(MsgError::BadSize(buf.len()));
        }
        let t = rd16(buf, off::TYPE);
        let ty = MsgType::from_u16(t).ok_or(MsgError::UnknownType(t))?;
        Ok(match ty {
            MsgType::Ack => Message::Ack,
            MsgType::Hello => {
                use off::hello as o;
                Message::Hello {
                    name: rdstr(buf, o::NAME),
                    min_version: rd16(buf, o::MIN_VERSION),
                    max_version: rd16(buf, o::MAX_VERSION),
                    max_region: rd16(buf, o::MAX_REGION),
                    max_m2s_ring: rd16(buf, o::MAX_M2S_RING),
                    max_s2m_ring: rd16(buf, o::MAX_S2M_RING),
                    max_log2_ring_size: buf[o::MAX_LOG2_RING_SIZE],
                }
            }
            MsgType::Init => {
                use off::init as o;
                Message::Init {
                    version: rd16(buf, o::VERSION),
                    id: rd32(buf, o::ID),
                    mode: buf[o::MODE],
                    secret: rdstr(buf, o::SECRET),
                    name: rdstr(buf, o::NAME),
                }
            }
            MsgType::AddRegion => Message::AddRegion {
                index: rd16(buf, off::add_region::INDEX),
                size: rd64(buf, off::add_region::SIZE),
            },
            MsgType::AddRing => {
                use off::add_ring as o;
                Message::AddRing {
                    flags: rd16(buf, o::FLAGS),
                    index: rd16(buf, o::INDEX),
                    region: rd16(buf, o::REGION),
                    offset: rd32(buf, o::OFFSET),
                    log2_ring_size: buf[o::LOG2_RING_SIZE],
                    private_hdr_size: rd16(buf, o::PRIVATE_HDR_SIZE),
                }
            }
            MsgType::Connect => Message::Connect {
                if_name: rdstr(buf, off::connect::IF_NAME),
            },
            MsgType::Connected => Message::Connected {
                if_name: rdstr(buf, off::connect::IF_NAME),
            },
            MsgType::Disconnect => Message::Disconnect {
                code: rd32(buf, off::disconnect::CODE),
                reason: rdstr(buf, off::disconnect::REASON),
            },
        })
    }

    /// Writes the message into a 128-byte buffer (unused bytes zeroed).
    pub fn emit(&self, buf: &mut [u8; MSG_SIZE]) {
        buf.fill(0);
        let put = |b: &mut [u8; MSG_SIZE], r: Range<usize>, v: &[u8]| b[r].copy_from_slice(v);
        put(buf, off::TYPE, &(self.msg_type() as u16).to_ne_bytes());
        match self {
            Message::Ack => {}
            Message::Hello {
                name,
                min_version,
                max_version,
                max_region,
                max_m2s_ring,
                max_s2m_ring,
                max_log2_ring_size,
            } => {
                use off::hello as o;
                put(buf, o::NAME, &name.0);
                put(buf, o::MIN_VERSION, &min_version.to_ne_bytes());
                put(buf, o::MAX_VERSION, &max_version.to_ne_bytes());
                put(buf, o::MAX_REGION, &max_region.to_ne_bytes());
                put(buf, o::MAX_M2S_RING, &max_m2s_ring.to_ne_bytes());
                put(buf, o::MAX_S2M_RING, &max_s2m_ring.to_ne_bytes());
                buf[o::MAX_LOG2_RING_SIZE] = *max_log2_ring_size;
            }
            Message::Init {
                version,
                id,
                mode,
                secret,
                name,
            } => {
                use off::init as o;
                put(buf, o::VERSION, &version.to_ne_bytes());
                put(buf, o::ID, &id.to_ne_bytes());
                buf[o::MODE] = *mode;
                put(buf, o::SECRET, &secret.0);
                put(buf, o::NAME, &name.0);
            }
            Message::AddRegion { index, size } => {
                put(buf, off::add_region::INDEX, &index.to_ne_bytes());
                put(buf, off::add_region::SIZE, &size.to_ne_bytes());
            }
            Message::AddRing {
                flags,
                index,
                region,
                offset,
                log2_ring_size,
                private_hdr_size,
            } => {
                use off::add_ring as o;
                put(buf, o::FLAGS, &flags.to_ne_bytes());
                put(buf, o::INDEX, &index.to_ne_bytes());
                put(buf, o::REGION, &region.to_ne_bytes());
                put(buf, o::OFFSET, &offset.to_ne_bytes());
                buf[o::LOG2_RING_SIZE] = *log2_ring_size;
                put(buf, o::PRIVATE_HDR_SIZE, &private_hdr_size.to_ne_bytes());
            }
            Message::Connect { if_name } | Message::Connected { if_name } => {
                put(buf, off::connect::IF_NAME, &if_name.0);
            }
            Message::Disconnect { code, reason } => {
                put(buf, off::disconnect::CODE, &code.to_ne_bytes());
                put(buf, off::disconnect::REASON, &reason.0);
            }
        }
    }

    /// Convenience: a DISCONNECT with a reason.
    pub fn disconnect(reason: &str) -> Message {
        Message::Disconnect {
            code: 0,
            reason: FixedStr::new(reason),
        }
    }

    /// Emits into a fresh array.
    pub fn to_bytes(&self) -> [u8; MSG_SIZE] {
        let mut b = [0u8; MSG_SIZE];
        self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_messages() -> Vec<Message> {
        vec![
            Message::Ack,
            Message::Hello {
                name: FixedStr::new("DPDK 22.11.0"),
                min_version: VERSION,
                max_version: VERSION,
                max_region: 254,
                max_m2s_ring: 255,
                max_s2m_ring: 255,
                max_log2_ring_size: 14,
            },
            Message::Init {
                version: VERSION,
                id: 7,
                mode: 0,
                secret: FixedStr::new("s3cret"),
                name: FixedStr::new("switchyard"),
            },
            Message::AddRegion {
                index: 0,
                size: 0x1_0000_0000,
            },
            Message::AddRing {
                flags: ADD_RING_FLAG_S2M,
                index: 3,
                region: 0,
                offset: 0x2100,
                log2_ring_size: 10,
                private_hdr_size: 0,
            },
            Message::Connect {
                if_name: FixedStr::new("eth0"),
            },
            Message::Connected {
                if_name: FixedStr::new("port1"),
            },
            Message::disconnect("bye"),
        ]
    }

    #[test]
    fn round_trips_every_type() {
        for m in all_messages() {
            let b = m.to_bytes();
            assert_eq!(Message::parse(&b).unwrap(), m);
        }
    }

    #[test]
    fn byte_layout_matches_vpp() {
        // Offsets from VPP memif.h (packed structs after a u16 type).
        let b = Message::AddRing {
            flags: 1,
            index: 0x0203,
            region: 0x0405,
            offset: 0x0a0b0c0d,
            log2_ring_size: 10,
            private_hdr_size: 0,
        }
        .to_bytes();
        assert_eq!(u16::from_ne_bytes([b[0], b[1]]), 5);
        assert_eq!(u16::from_ne_bytes([b[2], b[3]]), 1);
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), 0x0203);
        assert_eq!(u16::from_ne_bytes([b[6], b[7]]), 0x0405);
        assert_eq!(u32::from_ne_bytes([b[8], b[9], b[10], b[11]]), 0x0a0b0c0d);
        assert_eq!(b[12], 10);
        let b = Message::Init {
            version: VERSION,
            id: 0x11223344,
            mode: 1,
            secret: FixedStr::new("abc"),
            name: FixedStr::new("n"),
        }
        .to_bytes();
        assert_eq!(u16::from_ne_bytes([b[2], b[3]]), 0x0200);
        assert_eq!(u32::from_ne_bytes([b[4], b[5], b[6], b[7]]), 0x11223344);
        assert_eq!(b[8], 1);
        assert_eq!(&b[9..12], b"abc");
        assert_eq!(b[33], b'n');
        let b = Message::Hello {
            name: FixedStr::new("x"),
            min_version: 1,
            max_version: 2,
            max_region: 3,
            max_m2s_ring: 4,
            max_s2m_ring: 5,
            max_log2_ring_size: 6,
        }
        .to_bytes();
        assert_eq!(b[34], 1);
        assert_eq!(b[36], 2);
        assert_eq!(b[38], 3);
        assert_eq!(b[40], 4);
        assert_eq!(b[42], 5);
        assert_eq!(b[44], 6);
    }

    #[test]
    fn rejects_bad_datagrams() {
        assert_eq!(Message::parse(&[0u8; 127]), Err(MsgError::BadSize(127)));
        let mut b = [0u8; 128];
        b[0] = 99;
        assert_eq!(Message::parse(&b), Err(MsgError::UnknownType(99)));
        b[0] = 0;
        assert_eq!(Message::parse(&b), Err(MsgError::UnknownType(0)));
    }

    #[test]
    fn fixed_str_truncates_and_terminates() {
        let s = FixedStr::<4>::new("abcdef");
        assert_eq!(s.as_bytes(), b"abc");
        let s = FixedStr::<4>([b'a', b'b', b'c', b'd']);
        assert_eq!(s.as_bytes(), b"abcd");
    }

    #[test]
    fn ring_bytes_is_header_plus_descriptors() {
        assert_eq!(ring_bytes(10), 128 + 16 * 1024);
        assert_eq!(ring_bytes(1), 128 + 32);
    }
}
