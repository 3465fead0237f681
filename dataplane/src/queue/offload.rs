//! Checksum and segmentation offloads as a frame carries them through the
//! switch: what is left to do to it (a checksum to finish, a TCP or UDP
//! super-frame to cut into segments), in the terms of the virtio-net header
//! that the kernel (`PACKET_VNET_HDR`, `IFF_VNET_HDR`) and virtio drivers
//! speak.
//!
//! A port that receives such frames records the work in
//! [`RxFrame::offload`](crate::queue::RxFrame::offload). At the egress, a
//! transmit queue says which work its peer takes over
//! ([`crate::queue::TxQueue::offloads`]): a kernel interface or a virtio
//! driver that negotiated it gets the frame as it is, with its header; for
//! any other peer [`finish`] does the work in software first (as the
//! kernel's `skb_gso_segment` and `skb_checksum_help` do for a device
//! without the offload), so that no peer ever gets an unfinished checksum
//! or a frame longer than its MTU it did not ask for.

use crate::queue::{TxError, TxFrame, TxOutcome, BURST_SIZE};
use crate::wire::checksum::{same, Checksum};
use crate::wire::ip::{self, Headers, IpVersion, PROTO_TCP, PROTO_UDP};

use crate::wire::virtio_net::{
    OffloadFields, F_DATA_VALID, F_NEEDS_CSUM, GSO_ECN, GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4,
    VNET_HDR_LEN,
};

/// The smallest segment size taken (Linux's `TCP_MIN_MSS`): a super-frame
/// of up to 64 KB becomes at most about 750 segments.
pub const MIN_GSO_SIZE: u16 = 88;

/// The most header bytes (Ethernet, tags, IP, TCP) a frame finished in
/// software may have in front of its checksum field or payload.
pub const MAX_HDR: usize = 192;

/// What is left to do to a frame: a checksum and a segmentation, or none.
///
/// The virtio-net header's offload fields packed in one word (flags, GSO
/// type, segment size, checksum start and offset, from the low bits up),
/// so that the usual frame's "nothing to do" is one compare on the hot
/// path.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Offload(u64);

impl std::fmt::Debug for Offload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offload")
            .field("flags", &self.flags())
            .field("gso_type", &self.gso_type())
            .field("gso_size", &self.gso_size())
            .field("csum_start", &self.csum_start())
            .field("csum_offset", &self.csum_offset())
            .finish()
    }
}

/// Kinds of segmentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gso {
    /// TCP over IPv4.
    Tcp4,
    /// TCP over IPv6.
    Tcp6,
    /// UDP (over either).
    Udp,
}

/// Offload metadata that does not fit the frame it came with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadOffload {
    /// The checksum field lies past the frame's end.
    #[error("checksum at {start}+{offset} outside a frame of {len} bytes")]
    ChecksumOutside {
        /// `csum_start`.
        start: u16,
        /// `csum_offset`.
        offset: u16,
        /// The frame's length.
        len: usize,
    },
    /// A segmentation kind the switch does not do (UFO, or unknown).
    #[error("segmentation type {0:#x} not supported")]
    GsoType(u8),
    /// Segmentation into segments smaller than any TCP stack makes
    /// (`TCP_MIN_MSS`, 88 bytes): refused, so that one frame never becomes
    /// thousands.
    #[error("segmentation with a segment size under {MIN_GSO_SIZE} bytes")]
    GsoSize,
}

impl Offload {
    /// Nothing left to do.
    pub const NONE: Offload = Offload(0);

    const fn pack(
        flags: u8,
        gso_type: u8,
        gso_size: u16,
        csum_start: u16,
        csum_offset: u16,
    ) -> Offload {
        Offload(
            flags as u64
                | (gso_type as u64) << 8
                | (gso_size as u64) << 16
                | (csum_start as u64) << 32
                | (csum_offset as u64) << 48,
        )
    }

    fn flags(self) -> u8 {
        self.0 as u8
    }

    fn gso_type(self) -> u8 {
        (self.0 >> 8) as u8
    }

    fn gso_size(self) -> u16 {
        (self.0 >> 16) as u16
    }

    fn csum_start(self) -> u16 {
        (self.0 >> 32) as u16
    }

    fn csum_offset(self) -> u16 {
        (self.0 >> 48) as u16
    }

    /// A checksum to finish: from `start` to the end, stored at
    /// `start + offset`.
    pub fn checksum(start: u16, offset: u16) -> Offload {
        Offload::pack(F_NEEDS_CSUM, 0, 0, start, offset)
    }

    /// Reads the offload fields of a virtio-net header (little-endian, as
    /// virtio 1.0 and the kernel on every little-endian host have them) in
    /// front of a frame of `len` bytes, and checks them against it.
    pub fn from_vnet(h: &[u8; VNET_HDR_LEN], len: usize) -> Result<Offload, BadOffload> {
        let h = OffloadFields::read(h);
        let flags = h.flags & (F_NEEDS_CSUM | F_DATA_VALID);
        let (gso_type, gso_size, start, offset) =
            (h.gso_type, h.gso_size, h.csum_start, h.csum_offset);
        let needs = flags & F_NEEDS_CSUM != 0;
        if needs && u64::from(start) + u64::from(offset) + 2 > len as u64 {
            return Err(BadOffload::ChecksumOutside { start, offset, len });
        }
        // Checksum fields mean nothing without the flag.
        let (start, offset) = if needs { (start, offset) } else { (0, 0) };
        match gso_type & !GSO_ECN {
            0 => Ok(Offload::pack(flags, 0, 0, start, offset)),
            GSO_TCPV4 | GSO_TCPV6 | GSO_UDP_L4 if gso_size < MIN_GSO_SIZE => {
                Err(BadOffload::GsoSize)
            }
            GSO_TCPV4 | GSO_TCPV6 | GSO_UDP_L4 => {
                Ok(Offload::pack(flags, gso_type, gso_size, start, offset))
            }
            t => Err(BadOffload::GsoType(t)),
        }
    }

    /// The virtio-net header's offload fields for this frame.
    pub fn to_vnet(&self) -> [u8; VNET_HDR_LEN] {
        // `hdr_len`: the kernel needs at least the checksum field in the
        // linear part; it finds the rest of the headers itself.
        let hdr_len = if self.needs_checksum() {
            self.csum_start()
                .saturating_add(self.csum_offset())
                .saturating_add(2)
        } else {
            0
        };
        OffloadFields {
            flags: self.flags(),
            gso_type: self.gso_type(),
            hdr_len,
            gso_size: self.gso_size(),
            csum_start: self.csum_start(),
            csum_offset: self.csum_offset(),
        }
        .to_bytes()
    }

    /// [`Offload::to_vnet`] for a peer that takes `caps`: without
    /// checksum offload a virtio driver may not be told a checksum was
    /// verified (`DATA_VALID` is only defined with `GUEST_CSUM`).
    pub fn to_vnet_for(&self, caps: OffloadCaps) -> [u8; VNET_HDR_LEN] {
        if caps.contains(OffloadCaps::CSUM) {
            self.to_vnet()
        } else {
            self.without_data_valid().to_vnet()
        }
    }

    /// Nothing to do and nothing to tell (the usual frame).
    #[inline(always)]
    pub fn is_none(&self) -> bool {
        self.0 == 0
    }

    /// A checksum or a segmentation is still to be done.
    #[inline(always)]
    pub fn needs_work(&self) -> bool {
        self.0 & (u64::from(F_NEEDS_CSUM) | 0xff00) != 0
    }

    /// The same work without `DATA_VALID`: what a virtio driver sends
    /// (the flag is the device's to give; a driver's would vouch for its
    /// own checksums to every other peer).
    pub fn without_data_valid(self) -> Offload {
        Offload(self.0 & !u64::from(F_DATA_VALID))
    }

    /// Both offloads' bits together: whether either of two frames has work
    /// left is `a.or(b).needs_work()` (the fields mix, the flags do not).
    #[inline(always)]
    pub fn or(self, other: Offload) -> Offload {
        Offload(self.0 | other.0)
    }

    /// A checksum is still to be computed.
    pub fn needs_checksum(&self) -> bool {
        self.flags() & F_NEEDS_CSUM != 0
    }

    /// Where the checksum to compute starts and where it goes, from the
    /// frame's start.
    pub fn checksum_at(&self) -> Option<(usize, usize)> {
        self.needs_checksum().then_some((
            usize::from(self.csum_start()),
            usize::from(self.csum_offset()),
        ))
    }

    /// The segmentation to do and its segment size (payload bytes).
    pub fn gso(&self) -> Option<(Gso, u16)> {
        let kind = match self.gso_type() & !GSO_ECN {
            GSO_TCPV4 => Gso::Tcp4,
            GSO_TCPV6 => Gso::Tcp6,
            GSO_UDP_L4 => Gso::Udp,
            _ => return None,
        };
        Some((kind, self.gso_size()))
    }

    /// The checksum work a frame whose first bytes are `head` was sent
    /// with, as far as its bytes tell: a TCP or UDP checksum field that
    /// holds its pseudo-header's sum, which is what a sender with checksum
    /// offload leaves there (`CHECKSUM_PARTIAL`). For a port that receives
    /// frames without the kernel's metadata (AF_XDP on a veth).
    ///
    /// A finished checksum that happens to equal that sum is finished
    /// again to the same value (it is then the complement of the rest's
    /// sum, which is what finishing computes), so a complete frame never
    /// changes.
    pub fn partial_in(head: &[u8]) -> Option<Offload> {
        let hs = ip::locate(head)?;
        let at = hs.l4 + hs.check_offset();
        let field = u16::from_ne_bytes([*head.get(at)?, *head.get(at + 1)?]);
        if hs.proto == PROTO_UDP && hs.version == IpVersion::V4 && field == 0 {
            return None; // no checksum
        }
        let mut c = Checksum::new();
        hs.add_pseudo(head, hs.l4_len, &mut c);
        same(field, c.folded()).then(|| Offload::checksum(hs.l4 as u16, hs.check_offset() as u16))
    }

    /// The work a frame of `len` bytes, longer than `max_frame`, whose
    /// first bytes are `head`, was sent with, as far as its bytes tell: a
    /// TCP super-frame (its checksum left to do, as [`Offload::partial_in`]
    /// sees it), to cut into segments that fit `max_frame`. What a
    /// sender's segmentation offload hands on where nothing cut it: the
    /// kernel delivers a VXLAN packet that crossed only virtual devices
    /// (veths, a bridge, forwarding) to a UDP socket whole, its frame a
    /// 64 KB super-frame. Any segment size up to the sender's MSS is a
    /// valid TCP stream; the one that fits `max_frame` is taken.
    pub fn super_frame_in(head: &[u8], len: usize, max_frame: usize) -> Option<Offload> {
        let hs = ip::locate(head)?;
        if hs.proto != PROTO_TCP || len <= max_frame || hs.end >= max_frame {
            return None;
        }
        let partial = Offload::partial_in(head)?;
        let size = u16::try_from(max_frame - hs.end).unwrap_or(u16::MAX);
        if size < MIN_GSO_SIZE {
            return None;
        }
        let gso = match hs.version {
            IpVersion::V4 => GSO_TCPV4,
            IpVersion::V6 => GSO_TCPV6,
        };
        Some(Offload::pack(
            F_NEEDS_CSUM,
            gso,
            size,
            partial.csum_start(),
            partial.csum_offset(),
        ))
    }

    /// The work a frame of `len` bytes that came with no metadata was sent
    /// with, as far as its first bytes `head` tell (a VXLAN tunnel's frame,
    /// after a path that carries frames up to `max_frame` bytes): a
    /// super-frame to cut ([`Offload::super_frame_in`]), else a checksum to
    /// finish ([`Offload::partial_in`]), else none.
    pub fn inferred(head: &[u8], len: usize, max_frame: usize) -> Option<Offload> {
        Offload::super_frame_in(head, len, max_frame).or_else(|| Offload::partial_in(head))
    }

    /// The same work for the frame with `delta` bytes more (or fewer) in
    /// front of the checksummed part: a VLAN tag pushed or popped.
    #[inline]
    pub fn shifted(self, delta: i32) -> Offload {
        if !self.needs_checksum() || delta == 0 {
            return self;
        }
        let start = (i32::from(self.csum_start()) + delta).clamp(0, 0xffff) as u16;
        Offload(self.0 & !(0xffff << 32) | u64::from(start) << 32)
    }
}

/// The offloads a transmit queue's peer takes over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffloadCaps(u8);

impl OffloadCaps {
    /// None: every frame leaves finished.
    pub const NONE: OffloadCaps = OffloadCaps(0);
    /// Checksums to finish.
    pub const CSUM: OffloadCaps = OffloadCaps(1);
    /// TCP over IPv4 segmentation.
    pub const TSO4: OffloadCaps = OffloadCaps(2);
    /// TCP over IPv6 segmentation.
    pub const TSO6: OffloadCaps = OffloadCaps(4);
    /// UDP segmentation.
    pub const USO: OffloadCaps = OffloadCaps(8);
    /// All of them (a kernel interface through a virtio-net header).
    pub const ALL: OffloadCaps = OffloadCaps(15);

    /// Both sets.
    pub const fn with(self, other: OffloadCaps) -> OffloadCaps {
        OffloadCaps(self.0 | other.0)
    }

    /// Whether every offload of `other` is in this set.
    pub const fn contains(self, other: OffloadCaps) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the peer takes `o` as it is.
    #[inline]
    pub fn accepts(self, o: &Offload) -> bool {
        if o.needs_checksum() && !self.contains(OffloadCaps::CSUM) {
            return false;
        }
        match o.gso() {
            None => o.gso_type() == 0,
            Some((Gso::Tcp4, _)) => self.contains(OffloadCaps::TSO4),
            Some((Gso::Tcp6, _)) => self.contains(OffloadCaps::TSO6),
            Some((Gso::Udp, _)) => self.contains(OffloadCaps::USO),
        }
    }
}

/// Header space for a burst of segments, allocated once per worker.
pub struct Scratch {
    hdrs: Box<[[u8; MAX_HDR]; BURST_SIZE]>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            hdrs: Box::new([[0; MAX_HDR]; BURST_SIZE]),
        }
    }
}

/// What [`finish`] sent of one frame.
#[derive(Debug)]
pub struct Finished {
    /// Frames that went out (segments, or the one frame).
    pub frames: u32,
    /// Their bytes.
    pub bytes: u64,
    /// `Ok` when all of it went; otherwise why the rest did not.
    pub result: Result<(), TxError>,
}

impl Finished {
    const NOTHING: Finished = Finished {
        frames: 0,
        bytes: 0,
        result: Ok(()),
    };

    /// Counts what `send` made of `segs`; true when it stopped (full or
    /// broken), so that no more are sent.
    fn tally(&mut self, segs: &[TxFrame<'_>], out: TxOutcome) -> bool {
        for (j, seg) in segs.iter().enumerate() {
            match out.of(j) {
                Some(Ok(())) => {
                    self.frames += 1;
                    self.bytes += seg.len() as u64;
                }
                Some(Err(e)) if self.result.is_ok() => self.result = Err(e),
                _ => {}
            }
        }
        match out.stop {
            Some(e) => {
                self.result = Err(e);
                true
            }
            None => false,
        }
    }
}

/// Why [`finish`] could not do a frame's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfinished {
    /// The metadata does not match the frame's headers (or the headers
    /// are longer than [`MAX_HDR`]).
    BadOffload,
}

/// What `frame` becomes on a wire, leaving `len` bytes long (its length
/// with a VLAN tag pushed or popped): its bytes and frames. A super-frame
/// is the segments its segmentation makes, each with the headers, as the
/// kernel's `qdisc_pkt_len` charges a GSO packet; any other frame is
/// itself. (Headers that cannot be read count once.)
pub fn wire_size(frame: &crate::queue::RxFrame, len: u32) -> (u64, u64) {
    let len = u64::from(len);
    let Some((_, mss)) = frame.offload.gso().filter(|&(_, mss)| mss > 0) else {
        return (len, 1);
    };
    let mut head = [0u8; MAX_HDR];
    let got = frame.read_prefix(&mut head);
    let Some(hs) = ip::locate(&head[..got]) else {
        return (len, 1);
    };
    let hdr = hs.end as u64;
    let payload = u64::from(frame.len).saturating_sub(hdr);
    let segs = payload.div_ceil(u64::from(mss)).max(1);
    // The headers as they leave (a tag pushed or popped with them).
    let hdr_out = (hdr + len).saturating_sub(u64::from(frame.len));
    (len + (segs - 1) * hdr_out, segs)
}

/// Checksums `len` bytes of `frame` from `at` into `c`.
fn sum_range(frame: &TxFrame<'_>, at: usize, len: usize, c: &mut Checksum) {
    let (mut pos, end) = (0usize, at + len);
    frame.for_each_piece(|p, n| {
        let (lo, hi) = (pos.max(at), (pos + n).min(end));
        if lo < hi {
            // SAFETY: `p..p+n` is a piece of the frame (readable, checked
            // against its mapping when received) and `lo - pos .. hi - pos`
            // lies inside it.
            unsafe { c.add_raw(p.add(lo - pos), hi - lo) };
        }
        pos += n;
    });
}

/// Does `frame`'s offload work in software and sends the result through
/// `send` (a queue's `tx_burst`): the checksum finished, or the
/// super-frame cut into segments of its segment size, each with its own
/// headers (IP length, IPv4 identification and checksum, TCP sequence
/// number and flags, UDP length) and checksums, as Linux's
/// `tcp_gso_segment` / `__udp_gso_segment` make them.
pub fn finish(
    frame: &TxFrame<'_>,
    scratch: &mut Scratch,
    mut send: impl FnMut(&[TxFrame<'_>]) -> TxOutcome,
) -> Result<Finished, Unfinished> {
    let o = frame.offload;
    let len = frame.len();
    let mut head = [0u8; MAX_HDR];
    let got = {
        let mut r = frame.reader();
        // SAFETY: `head` is a local buffer of the length given.
        unsafe { r.copy_to(head.as_mut_ptr(), MAX_HDR) }
    };
    let head = &head[..got];
    let prefix = frame.prefix_len();
    let Some((kind, mss)) = o.gso() else {
        // Only the checksum: the headers up to its field, then the rest.
        let (start, offset) = o.checksum_at().ok_or(Unfinished::BadOffload)?;
        let field = start + offset;
        if field + 2 > got || field + 2 < prefix {
            return Err(Unfinished::BadOffload);
        }
        let h = &mut scratch.hdrs[0];
        h[..field + 2].copy_from_slice(&head[..field + 2]);
        let mut c = Checksum::new();
        c.add(&h[start..field + 2]);
        sum_range(frame, field + 2, len - field - 2, &mut c);
        h[field..field + 2].copy_from_slice(&c.finish().to_ne_bytes());
        let one = [frame.window(field + 2, len - field - 2, &h[..field + 2])];
        let mut done = Finished::NOTHING;
        done.tally(&one, send(&one));
        return Ok(done);
    };
    let hs = ip::locate(head).ok_or(Unfinished::BadOffload)?;
    let fits = match kind {
        Gso::Tcp4 => hs.proto == PROTO_TCP && hs.version == IpVersion::V4,
        Gso::Tcp6 => hs.proto == PROTO_TCP && hs.version == IpVersion::V6,
        Gso::Udp => hs.proto == PROTO_UDP,
    };
    if !fits || hs.end < prefix || mss == 0 {
        return Err(Unfinished::BadOffload);
    }
    // The payload as the IP header counts it (padding past it is not
    // payload), bounded by the bytes there are.
    let payload = (hs.l4 + hs.l4_len).min(len).saturating_sub(hs.end);
    let mss = usize::from(mss);
    let count = payload.div_ceil(mss).max(1);
    // Segment `i`: where its payload starts in the frame, and its length.
    let bounds = |i: usize| {
        let at = hs.end + i * mss;
        (at, mss.min(payload - (i * mss).min(payload)))
    };
    let mut done = Finished::NOTHING;
    let mut k = 0;
    while k < count {
        let n = (count - k).min(BURST_SIZE);
        for j in 0..n {
            let i = k + j;
            let (at, seg_len) = bounds(i);
            let h = &mut scratch.hdrs[j];
            h[..hs.end].copy_from_slice(&head[..hs.end]);
            segment_headers(h, &hs, i, mss, seg_len, i + 1 == count);
            let mut c = Checksum::new();
            hs.add_pseudo(h, hs.end - hs.l4 + seg_len, &mut c);
            let check = hs.l4 + hs.check_offset();
            h[check..check + 2].fill(0);
            c.add(&h[hs.l4..hs.end]);
            sum_range(frame, at, seg_len, &mut c);
            let mut sum = c.finish();
            if hs.proto == PROTO_UDP && sum == 0 {
                sum = 0xffff;
            }
            h[check..check + 2].copy_from_slice(&sum.to_ne_bytes());
        }
        let mut segs = [TxFrame::EMPTY; BURST_SIZE];
        for (j, seg) in segs[..n].iter_mut().enumerate() {
            let (at, seg_len) = bounds(k + j);
            *seg = frame.window(at, seg_len, &scratch.hdrs[j][..hs.end]);
        }
        if done.tally(&segs[..n], send(&segs[..n])) {
            break;
        }
        k += n;
    }
    Ok(done)
}

/// Rewrites the copied headers `h` (through `hs.end`) for segment `i` of
/// `seg_len` payload bytes, segments being `mss` long; `last`: the final
/// one. The transport checksum is left to the caller.
fn segment_headers(h: &mut [u8], hs: &Headers, i: usize, mss: usize, seg_len: usize, last: bool) {
    let l4_len = hs.end - hs.l4 + seg_len;
    match hs.version {
        IpVersion::V4 => {
            let l3 = hs.l3;
            let total = (hs.l4 - l3 + l4_len) as u16;
            h[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
            let id = u16::from_be_bytes([h[l3 + 4], h[l3 + 5]]).wrapping_add(i as u16);
            h[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
            h[l3 + 10..l3 + 12].fill(0);
            let mut c = Checksum::new();
            c.add(&h[l3..hs.l4]);
            h[l3 + 10..l3 + 12].copy_from_slice(&c.finish().to_ne_bytes());
        }
        IpVersion::V6 => {
            let l3 = hs.l3;
            h[l3 + 4..l3 + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        }
    }
    let l4 = hs.l4;
    if hs.proto == PROTO_TCP {
        let seq = u32::from_be_bytes([h[l4 + 4], h[l4 + 5], h[l4 + 6], h[l4 + 7]])
            .wrapping_add((i * mss) as u32);
        h[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        // FIN and PSH only on the last segment, CWR only on the first.
        if !last {
            h[l4 + 13] &= !0x09;
        }
        if i > 0 {
            h[l4 + 13] &= !0x80;
        }
    } else {
        h[l4 + 4..l4 + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::RxFrame;
    use crate::wire::checksum::same;
    use crate::wire::ip::tests::tcp4;
    use crate::wire::virtio_net::GSO_UDP;

    fn frame(bytes: &[u8]) -> RxFrame {
        let mut f = RxFrame::default();
        // Two segments, split at an odd place, to take the piecewise sums.
        let cut = bytes.len().min(77);
        // SAFETY: `bytes` outlives the frame in every test.
        unsafe {
            assert!(f.push(bytes.as_ptr(), cut as u32));
            assert!(f.push(bytes.as_ptr().add(cut), (bytes.len() - cut) as u32));
        }
        f
    }

    /// The frames `finish` sends for `tx`, as bytes.
    fn run(tx: &TxFrame<'_>) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut s = Scratch::default();
        let fin = finish(tx, &mut s, |segs| {
            for f in segs {
                let mut b = vec![0u8; f.len()];
                // SAFETY: `b` holds `f.len()` bytes.
                unsafe { f.reader().copy_to(b.as_mut_ptr(), b.len()) };
                out.push(b);
            }
            crate::queue::tx_each(segs, |_| Ok(()))
        })
        .unwrap();
        assert!(fin.result.is_ok());
        assert_eq!(fin.frames as usize, out.len());
        out
    }

    /// Whether the IPv4 TCP frame `b`'s IP and TCP checksums verify.
    fn verifies(b: &[u8]) -> bool {
        let h = ip::locate(b).unwrap();
        let mut ipc = Checksum::new();
        ipc.add(&b[h.l3..h.l4]);
        let mut c = Checksum::new();
        h.add_pseudo(b, h.l4_len, &mut c);
        c.add(&b[h.l4..h.l4 + h.l4_len]);
        same(ipc.finish(), 0) && same(c.finish(), 0)
    }

    /// `b` with its TCP checksum left partial, as a sender with checksum
    /// offload hands it over.
    fn partial(mut b: Vec<u8>) -> Vec<u8> {
        let h = ip::locate(&b).unwrap();
        let mut c = Checksum::new();
        h.add_pseudo(&b, h.l4_len, &mut c);
        let at = h.l4 + ip::TCP_CHECK;
        b[at..at + 2].copy_from_slice(&c.folded().to_ne_bytes());
        let mut ipc = Checksum::new();
        ipc.add(&b[h.l3..h.l4]);
        b[24..26].copy_from_slice(&ipc.finish().to_ne_bytes());
        b
    }

    #[test]
    fn a_partial_checksum_is_finished() {
        let b = partial(tcp4(1000));
        assert!(!verifies(&b));
        let f = frame(&b);
        let tx = TxFrame::plain(&f).with_offload(Offload::checksum(34, 16));
        let out = run(&tx);
        assert_eq!(out.len(), 1);
        assert!(verifies(&out[0]));
        assert_eq!(out[0][..50], b[..50]);
        assert_eq!(out[0][52..], b[52..]);
    }

    #[test]
    fn a_tcp_super_frame_is_cut_into_segments_that_add_up() {
        let mut b = partial(tcp4(4000));
        b[18..20].copy_from_slice(&0x1234u16.to_be_bytes()); // IP id
        b[38..42].copy_from_slice(&0xffff_ff00u32.to_be_bytes()); // seq, wraps
        b[47] = 0x18 | 0x01 | 0x80; // PSH ACK FIN CWR
        let b = partial(b);
        let f = frame(&b);
        let mut vnet = Offload::checksum(34, 16).to_vnet();
        vnet[1] = GSO_TCPV4;
        vnet[4..6].copy_from_slice(&1448u16.to_le_bytes());
        let o = Offload::from_vnet(&vnet, b.len()).unwrap();
        let out = run(&TxFrame::plain(&f).with_offload(o));
        assert_eq!(
            out.iter().map(Vec::len).collect::<Vec<_>>(),
            [1502, 1502, 54 + 1104]
        );
        // A policer charges it as those segments, tagged or not.
        let mut g = frame(&b);
        g.offload = o;
        assert_eq!(wire_size(&g, g.len), (1502 + 1502 + 1158, 3));
        assert_eq!(wire_size(&g, g.len + 4), (1506 + 1506 + 1162, 3));
        assert_eq!(wire_size(&f, f.len), (b.len() as u64, 1));
        let mut payload = Vec::new();
        for (i, s) in out.iter().enumerate() {
            assert!(verifies(s), "segment {i}");
            assert_eq!(u16::from_be_bytes([s[18], s[19]]), 0x1234 + i as u16);
            let seq = u32::from_be_bytes([s[38], s[39], s[40], s[41]]);
            assert_eq!(seq, 0xffff_ff00u32.wrapping_add(1448 * i as u32));
            let last = i == 2;
            assert_eq!(s[47] & 0x09 != 0, last, "FIN/PSH on the last only");
            assert_eq!(s[47] & 0x80 != 0, i == 0, "CWR on the first only");
            assert_eq!(s[..14], b[..14]);
            payload.extend_from_slice(&s[54..]);
        }
        assert_eq!(payload, b[54..]);
    }

    #[test]
    fn a_udp_super_frame_over_ipv6_is_cut_into_datagrams() {
        // Ethernet, IPv6 (40), UDP (8), 3000 bytes of payload.
        let payload = 3000;
        let mut b = vec![0u8; 62 + payload];
        b[12..14].copy_from_slice(&ip::ETHERTYPE_IPV6.to_be_bytes());
        b[14] = 0x60;
        b[18..20].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
        b[20] = PROTO_UDP;
        b[21] = 64;
        b[22..38].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        b[38..54].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        b[54..56].copy_from_slice(&5000u16.to_be_bytes());
        b[56..58].copy_from_slice(&6000u16.to_be_bytes());
        for (i, x) in b[62..].iter_mut().enumerate() {
            *x = (i * 13) as u8;
        }
        let f = frame(&b);
        let mut v = Offload::checksum(54, 6).to_vnet();
        v[1] = GSO_UDP_L4;
        v[4..6].copy_from_slice(&1200u16.to_le_bytes());
        let o = Offload::from_vnet(&v, b.len()).unwrap();
        let out = run(&TxFrame::plain(&f).with_offload(o));
        assert_eq!(
            out.iter().map(Vec::len).collect::<Vec<_>>(),
            [62 + 1200, 62 + 1200, 62 + 600]
        );
        let mut got = Vec::new();
        for s in &out {
            let h = ip::locate(s).unwrap();
            assert_eq!(h.l4_len, s.len() - 54, "IPv6 payload length");
            assert_eq!(
                usize::from(u16::from_be_bytes([s[58], s[59]])),
                s.len() - 54
            );
            let mut c = Checksum::new();
            h.add_pseudo(s, h.l4_len, &mut c);
            c.add(&s[54..]);
            assert!(same(c.finish(), 0), "UDP checksum");
            got.extend_from_slice(&s[62..]);
        }
        assert_eq!(got, b[62..]);
    }

    #[test]
    fn a_pushed_vlan_tag_moves_the_checksum_with_it() {
        let b = partial(tcp4(300));
        let f = frame(&b);
        let mut hdr = [0u8; 16];
        hdr[..12].copy_from_slice(&b[..12]);
        hdr[12..16].copy_from_slice(&[0x81, 0, 0, 100]);
        let tx = TxFrame::rewritten(&f, &hdr, 12);
        let tx = tx.with_offload(Offload::checksum(34, 16).shifted(4));
        let out = run(&tx);
        let mut untagged = out[0][..12].to_vec();
        untagged.extend_from_slice(&out[0][16..]);
        assert!(verifies(&untagged));
    }

    #[test]
    fn a_partial_checksum_is_recognised_and_a_finished_one_left_alone() {
        let b = partial(tcp4(500));
        let o = Offload::partial_in(&b[..MAX_HDR]).unwrap();
        assert_eq!(o.checksum_at(), Some((34, 16)));
        // Finished, it is not partial any more.
        let f = frame(&b);
        let done = run(&TxFrame::plain(&f).with_offload(o)).remove(0);
        assert!(verifies(&done));
        assert_eq!(Offload::partial_in(&done[..MAX_HDR]), None);
        // Not TCP or UDP: nothing to say.
        assert_eq!(Offload::partial_in(&[0u8; 100]), None);
    }

    #[test]
    fn metadata_that_does_not_fit_is_refused() {
        let mut v = Offload::checksum(60, 16).to_vnet();
        assert!(Offload::from_vnet(&v, 77).is_err());
        assert!(Offload::from_vnet(&v, 78).is_ok());
        v[1] = GSO_UDP;
        v[4] = 100;
        assert_eq!(
            Offload::from_vnet(&v, 1000),
            Err(BadOffload::GsoType(GSO_UDP))
        );
        v[1] = GSO_TCPV4;
        v[4] = 0;
        assert_eq!(Offload::from_vnet(&v, 1000), Err(BadOffload::GsoSize));
        v[4] = MIN_GSO_SIZE as u8 - 1;
        assert_eq!(Offload::from_vnet(&v, 1000), Err(BadOffload::GsoSize));
        v[4] = MIN_GSO_SIZE as u8;
        assert!(Offload::from_vnet(&v, 1000).is_ok());
        // A TCP segmentation of a frame that is not TCP.
        let b = vec![0u8; 100];
        let f = frame(&b);
        v[4] = 100;
        let o = Offload::from_vnet(&v, 100).unwrap();
        let r = finish(
            &TxFrame::plain(&f).with_offload(o),
            &mut Scratch::default(),
            |s| crate::queue::tx_each(s, |_| Ok(())),
        );
        assert_eq!(r.unwrap_err(), Unfinished::BadOffload);
    }

    #[test]
    fn caps_accept_what_they_cover() {
        let csum = Offload::checksum(34, 16);
        let mut v = csum.to_vnet();
        v[1] = GSO_TCPV6;
        v[4] = 100;
        let tso6 = Offload::from_vnet(&v, 100).unwrap();
        assert!(!OffloadCaps::NONE.accepts(&csum));
        assert!(OffloadCaps::CSUM.accepts(&csum));
        assert!(!OffloadCaps::CSUM.with(OffloadCaps::TSO4).accepts(&tso6));
        assert!(OffloadCaps::CSUM.with(OffloadCaps::TSO6).accepts(&tso6));
        assert!(OffloadCaps::NONE.accepts(&Offload::NONE));
    }
}
