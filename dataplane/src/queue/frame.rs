//! Frames as the data plane sees them: byte ranges in a peer's shared memory.

use std::ptr;

use crate::queue::offload::Offload;
use crate::types::PortId;

/// Frames moved per burst.
pub const BURST_SIZE: usize = 32;
/// Most buffers one frame may span (9000-byte frames in 1024-byte buffers
/// fit, and a 64 KB super-frame in the pages of a virtio driver's skb).
pub const MAX_SEGS: usize = 32;

/// A byte range in memory mapped from a peer.
///
/// The memory may be written by the peer at any time, so it is never turned
/// into a `&[u8]`; bytes are only copied out with [`std::ptr::copy_nonoverlapping`].
///
/// Its fields are private: a segment is made only by [`RxFrame::push`] and
/// [`RxFrame::set_single`], under their contract.
///
/// ```compile_fail
/// # use switchyard::queue::Segment;
/// let s = Segment { ptr: 0x1000 as *const u8, len: 64 };
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    ptr: *const u8,
    len: u32,
}

impl Segment {
    const EMPTY: Segment = Segment {
        ptr: ptr::null(),
        len: 0,
    };

    /// Start of the range: reading it is `unsafe`, under the contract of
    /// [`RxFrame::push`] (while the frame's burst is held).
    #[inline(always)]
    pub fn ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Length in bytes.
    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True for a segment of no bytes.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One received frame: up to [`MAX_SEGS`] segments.
///
/// Neither `Copy` nor `Clone`: a frame is read (safely, by
/// [`RxFrame::read_prefix`]) only where its burst lends it, while its memory
/// is mapped; a copy could outlive that.
///
/// ```compile_fail
/// # use switchyard::queue::RxFrame;
/// fn keep(f: &RxFrame) -> RxFrame {
///     *f // a frame cannot be copied out of its burst
/// }
/// ```
#[derive(Debug)]
pub struct RxFrame {
    /// Total length.
    pub len: u32,
    nsegs: u8,
    /// Checksum or segmentation work the sender left to the switch (or to
    /// the peer it goes to), from the port's virtio-net header.
    pub offload: Offload,
    segs: [Segment; MAX_SEGS],
}

impl Default for RxFrame {
    fn default() -> Self {
        RxFrame::EMPTY
    }
}

impl RxFrame {
    /// A frame of no segments.
    pub const EMPTY: RxFrame = RxFrame {
        len: 0,
        nsegs: 0,
        offload: Offload::NONE,
        segs: [Segment::EMPTY; MAX_SEGS],
    };

    /// Empties the frame.
    #[inline]
    pub fn clear(&mut self) {
        self.len = 0;
        self.nsegs = 0;
        self.offload = Offload::NONE;
    }

    /// Appends a segment. Returns false when the frame already has [`MAX_SEGS`].
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must lie inside memory that stays mapped and readable
    /// for as long as the frame is read (until its burst is released):
    /// [`RxFrame::read_prefix`] and the transmit copy read it without
    /// further checks. The bytes may change under the reader (memory shared
    /// with a peer); they are only ever copied, never referenced.
    #[inline]
    pub unsafe fn push(&mut self, ptr: *const u8, len: u32) -> bool {
        let n = self.nsegs as usize;
        if n == MAX_SEGS {
            return false;
        }
        self.segs[n] = Segment { ptr, len };
        self.nsegs += 1;
        self.len = self.len.saturating_add(len);
        true
    }

    /// Makes the frame the one segment `ptr..ptr+len`: the usual frame, in
    /// one buffer, set with three stores instead of a clear and a push.
    ///
    /// # Safety
    ///
    /// As for [`RxFrame::push`].
    #[inline]
    pub unsafe fn set_single(&mut self, ptr: *const u8, len: u32) {
        self.segs[0] = Segment { ptr, len };
        self.nsegs = 1;
        self.len = len;
        self.offload = Offload::NONE;
    }

    /// The frame's first segment, if it has one.
    #[inline]
    pub fn first_segment(&self) -> Option<Segment> {
        (self.nsegs != 0).then_some(self.segs[0])
    }

    /// The frame's segment, if it has exactly one (the usual frame).
    #[inline]
    pub fn single_segment(&self) -> Option<Segment> {
        (self.nsegs == 1).then_some(self.segs[0])
    }

    /// The frame's segments.
    #[inline]
    pub fn segments(&self) -> &[Segment] {
        &self.segs[..self.nsegs as usize]
    }

    /// Copies the first `out.len()` bytes (or fewer, if the frame is shorter)
    /// into `out`, across segments. Returns how many were copied.
    #[inline]
    pub fn read_prefix(&self, out: &mut [u8]) -> usize {
        // The usual case: the first segment holds the whole prefix, one
        // copy of a length the caller usually knows at compile time (no
        // call to `memcpy` for a header).
        if let Some(s) = self.first_segment().filter(|s| s.len as usize >= out.len()) {
            // SAFETY: `s.ptr..s.ptr+s.len` was bounds-checked against a
            // live mapping when the segment was pushed, `out.len() <=
            // s.len`, and `out` is our own buffer. The source may change
            // under us: bytes are copied, never referenced.
            unsafe { ptr::copy_nonoverlapping(s.ptr, out.as_mut_ptr(), out.len()) };
            return out.len();
        }
        let mut done = 0;
        for s in self.segments() {
            if done == out.len() {
                break;
            }
            let n = (s.len as usize).min(out.len() - done);
            // SAFETY: `s.ptr..s.ptr+s.len` was bounds-checked against a live
            // mapping when the segment was pushed, and `out[done..done+n]` is
            // in bounds. The source may change under us (shared with the peer):
            // we copy bytes, never form a reference to them.
            unsafe { ptr::copy_nonoverlapping(s.ptr, out.as_mut_ptr().add(done), n) };
            done += n;
        }
        done
    }
}

/// Copies `len` bytes of a frame from `src` to `dst`: on x86-64, 16 to
/// 64 bytes inline, as two or four 16-byte SSE2 moves that may overlap;
/// others through `memcpy`. At 64 bytes the call and the registers kept
/// across it cost more than the copy.
///
/// # Safety
///
/// As [`std::ptr::copy_nonoverlapping`]: `src..src+len` readable,
/// `dst..dst+len` writable, the two disjoint. Either may be memory a peer
/// writes meanwhile: bytes are moved, never referenced.
#[inline(always)]
pub unsafe fn copy_frame(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if (16..=64).contains(&len) {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
        // SAFETY: SSE2 is part of x86-64. 16 <= len <= 64, so every
        // 16-byte move below starts at or after `src`/`dst` and ends at or
        // before `src + len`/`dst + len` (`len - 32` is used only when
        // len > 32); the unaligned forms need no alignment.
        unsafe {
            let (s, d) = (src.cast::<__m128i>(), dst.cast::<__m128i>());
            let head = _mm_loadu_si128(s);
            let tail = _mm_loadu_si128(src.add(len - 16).cast());
            if len > 32 {
                let head2 = _mm_loadu_si128(s.add(1));
                let tail2 = _mm_loadu_si128(src.add(len - 32).cast());
                _mm_storeu_si128(d.add(1), head2);
                _mm_storeu_si128(dst.add(len - 32).cast(), tail2);
            }
            _mm_storeu_si128(d, head);
            _mm_storeu_si128(dst.add(len - 16).cast(), tail);
        }
        return;
    }
    // SAFETY: the caller's promise.
    unsafe { ptr::copy_nonoverlapping(src, dst, len) };
}

/// A burst of received frames, allocated once per worker.
pub struct RxBurst {
    frames: Box<[RxFrame; BURST_SIZE]>,
    len: usize,
    /// Frames the queue had to discard (more than [`MAX_SEGS`] buffers).
    pub dropped: u32,
    /// Frames the queue discarded for offload metadata that does not fit
    /// them ([`crate::queue::offload::BadOffload`]).
    pub bad_offload: u32,
    /// Datagrams of a tunnel socket from no tunnel's remote end or VNI.
    pub unknown_tunnel: u32,
    /// Datagrams of a tunnel socket that are no tunnel packet (a bad or
    /// truncated header, no whole frame inside).
    pub bad_tunnel: u32,
    /// The port each frame came from, where a queue receives for other
    /// ports than its own ([`RxBurst::commit_from`]).
    from: Box<[PortId; BURST_SIZE]>,
    /// Whether `from` says where the frames came from.
    mixed: bool,
}

impl Default for RxBurst {
    fn default() -> Self {
        RxBurst {
            frames: Box::new([RxFrame::EMPTY; BURST_SIZE]),
            len: 0,
            dropped: 0,
            bad_offload: 0,
            unknown_tunnel: 0,
            bad_tunnel: 0,
            from: Box::new([0; BURST_SIZE]),
            mixed: false,
        }
    }
}

/// The frames of a burst by the port they came from: runs of frames in
/// order, each with its port ([`RxBurst::runs_and_frames`]).
pub struct Runs<'a> {
    from: &'a [PortId],
    at: usize,
}

impl Iterator for Runs<'_> {
    type Item = (PortId, std::ops::Range<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        let start = self.at;
        let port = *self.from.get(start)?;
        let len = self.from[start..]
            .iter()
            .take_while(|&&p| p == port)
            .count();
        self.at = start + len;
        Some((port, start..self.at))
    }
}

impl RxBurst {
    /// Starts a new burst.
    #[inline]
    pub fn clear(&mut self) {
        self.len = 0;
        self.dropped = 0;
        self.bad_offload = 0;
        self.unknown_tunnel = 0;
        self.bad_tunnel = 0;
        self.mixed = false;
    }
    /// Keeps the frame filled through [`RxBurst::next_slot`], received for
    /// port `port` rather than for the queue's own: a queue that receives
    /// for several ports (the socket every VXLAN tunnel of an address
    /// shares) commits each frame this way, grouped by port.
    #[inline]
    pub fn commit_from(&mut self, port: PortId) {
        debug_assert!(self.mixed || self.len == 0, "a burst is mixed or not");
        self.from[self.len] = port;
        self.mixed = true;
        self.commit();
    }
    /// The frames by the port they came from, in runs, if they were
    /// committed with [`RxBurst::commit_from`] (`None`: all are the queue's
    /// own port's), and the frames, to reorder within each run (a policer
    /// moves those it passes to the front of theirs).
    #[inline]
    pub fn runs_and_frames(&mut self) -> (Option<Runs<'_>>, &mut [RxFrame]) {
        let runs = self.mixed.then(|| Runs {
            from: &self.from[..self.len],
            at: 0,
        });
        (runs, &mut self.frames[..self.len])
    }
    /// Whether any frame was discarded (and is to be counted).
    #[inline]
    pub fn has_drops(&self) -> bool {
        self.dropped | self.bad_offload | self.unknown_tunnel | self.bad_tunnel != 0
    }
    /// Frames held.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// True when no more frames fit.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == BURST_SIZE
    }
    /// The next free frame, cleared; call [`RxBurst::commit`] to keep it.
    #[inline]
    pub fn next_slot(&mut self) -> &mut RxFrame {
        let f = &mut self.frames[self.len];
        f.clear();
        f
    }
    /// Keeps the frame filled through [`RxBurst::next_slot`].
    #[inline]
    pub fn commit(&mut self) {
        debug_assert!(self.len < BURST_SIZE);
        self.len += 1;
    }
    /// Every frame slot and how many are held, for a queue that fills
    /// several in a row and then says how many it holds once
    /// ([`RxBurst::set_len`]) rather than committing each.
    #[inline]
    pub fn slots(&mut self) -> (&mut [RxFrame; BURST_SIZE], usize) {
        (&mut self.frames, self.len)
    }
    /// Holds the first `n` frame slots (filled through
    /// [`RxBurst::slots`]); `n` is at most [`BURST_SIZE`].
    ///
    /// ```compile_fail
    /// # use switchyard::queue::RxBurst;
    /// let mut b = RxBurst::default();
    /// b.clear();
    /// b.set_len(32); // stale frames: only under `unsafe`, with its contract
    /// ```
    ///
    /// # Safety
    ///
    /// Each of the first `n` slots must hold a frame made since the burst
    /// was last cleared (through [`RxFrame::push`] or
    /// [`RxFrame::set_single`], whose contract then holds): a slot left from
    /// an earlier burst may point into memory since unmapped, which the
    /// safe [`RxFrame::read_prefix`] would read.
    #[inline]
    pub unsafe fn set_len(&mut self, n: usize) {
        debug_assert!(n <= BURST_SIZE);
        self.len = n.min(BURST_SIZE);
    }
    /// The frames.
    #[inline]
    pub fn frames(&self) -> &[RxFrame] {
        &self.frames[..self.len]
    }
}

/// A frame to transmit: a rewritten header `prefix`, then the source
/// frame's bytes from offset `skip` (to `end`, when it is a window). This is how VLAN tags are pushed or
/// popped while the payload is copied once, and how a segment of a larger
/// frame is sent with headers of its own.
#[derive(Clone, Copy)]
pub struct TxFrame<'a> {
    frame: &'a RxFrame,
    prefix: &'a [u8],
    /// The bytes of the source left out at its start (low 32 bits), and
    /// where its bytes stop (high 32 bits; 0 for its end, as in every frame
    /// but a window): the usual frame's is one zero word.
    span: u64,
    /// The checksum or segmentation work left on the frame, at its offsets
    /// as it leaves. Only a queue whose peer takes it over
    /// ([`crate::queue::TxQueue::offloads`]) is given a frame with work
    /// left; the forwarder does it in software for the others.
    pub offload: Offload,
}

impl TxFrame<'static> {
    /// An empty frame (a placeholder in arrays of frames).
    pub const EMPTY: TxFrame<'static> = TxFrame {
        frame: &RxFrame::EMPTY,
        prefix: &[],
        span: 0,
        offload: Offload::NONE,
    };
}

impl<'a> TxFrame<'a> {
    /// The frame unchanged.
    #[inline(always)]
    pub fn plain(frame: &'a RxFrame) -> Self {
        TxFrame {
            frame,
            prefix: &[],
            span: 0,
            offload: frame.offload,
        }
    }

    /// The frame with its first `skip` bytes replaced by `prefix` (a VLAN
    /// tag pushed or popped), its offload offsets moved with it.
    #[inline]
    pub fn rewritten(frame: &'a RxFrame, prefix: &'a [u8], skip: u32) -> Self {
        let skip = skip.min(frame.len);
        TxFrame {
            frame,
            prefix,
            span: u64::from(skip),
            offload: frame.offload.shifted(prefix.len() as i32 - skip as i32),
        }
    }

    /// `len` bytes of this frame from `at` (which is past its prefix),
    /// after `prefix` (their headers), with no work left: a segment of it,
    /// or the frame from its checksum on.
    pub fn window<'b>(&self, at: usize, len: usize, prefix: &'b [u8]) -> TxFrame<'b>
    where
        'a: 'b,
    {
        let (start, stop) = (self.skip(), self.stop());
        let skip = (u64::from(start) + at.saturating_sub(self.prefix.len()) as u64)
            .min(u64::from(stop)) as u32;
        let end = (u64::from(skip) + len as u64).min(u64::from(stop)) as u32;
        TxFrame {
            frame: self.frame,
            prefix,
            // A window that reaches the frame's end ends there too (0).
            span: u64::from(skip) | u64::from(if end == self.frame.len { 0 } else { end }) << 32,
            offload: Offload::NONE,
        }
    }

    /// The same frame with `offload` as the work left on it.
    pub fn with_offload(self, offload: Offload) -> Self {
        TxFrame { offload, ..self }
    }

    /// Bytes of the source left out at its start.
    #[inline]
    fn skip(&self) -> u32 {
        self.span as u32
    }

    /// Where the source's bytes stop.
    #[inline]
    fn stop(&self) -> u32 {
        match (self.span >> 32) as u32 {
            0 => self.frame.len,
            end => end,
        }
    }

    /// Bytes of the rewritten header in front.
    #[inline]
    pub fn prefix_len(&self) -> usize {
        self.prefix.len()
    }

    /// The frame's one segment, when it goes out unchanged and whole in
    /// one piece: the common case, which transmit queues copy without a
    /// [`FrameReader`].
    #[inline]
    pub fn single(&self) -> Option<Segment> {
        if self.prefix.is_empty() && self.span == 0 {
            self.frame.single_segment()
        } else {
            None
        }
    }

    /// Length on the wire.
    #[inline]
    pub fn len(&self) -> usize {
        self.prefix.len() + self.stop().saturating_sub(self.skip()) as usize
    }
    /// True for a zero-length frame.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Calls `f` with each piece of the frame in order (the prefix, then the
    /// source's segments past `skip`), as raw ranges: for handing the frame
    /// to the kernel in one `writev` without copying it first.
    #[inline]
    pub fn for_each_piece(&self, mut f: impl FnMut(*const u8, usize)) {
        if !self.prefix.is_empty() {
            f(self.prefix.as_ptr(), self.prefix.len());
        }
        let mut skip = self.skip() as usize;
        let mut left = self.stop().saturating_sub(self.skip()) as usize;
        for s in self.frame.segments() {
            let len = s.len as usize;
            if skip >= len {
                skip -= len;
                continue;
            }
            if left == 0 {
                break;
            }
            let n = (len - skip).min(left);
            // SAFETY: `skip + n <= len`, so the range stays inside the
            // segment, which was bounds-checked against a live mapping
            // when pushed.
            f(unsafe { s.ptr.add(skip) }, n);
            left -= n;
            skip = 0;
        }
    }

    /// A cursor that copies the frame out piece by piece.
    #[inline]
    pub fn reader(&self) -> FrameReader<'a> {
        FrameReader::new(*self)
    }
}

/// Copies a [`TxFrame`] into destination buffers of any size.
pub struct FrameReader<'a> {
    prefix: &'a [u8],
    segs: &'a [Segment],
    seg: usize,
    seg_off: usize,
    remaining: usize,
}

impl<'a> FrameReader<'a> {
    fn new(f: TxFrame<'a>) -> Self {
        let segs = f.frame.segments();
        let mut skip = f.skip() as usize;
        let mut seg = 0;
        while seg < segs.len() && skip >= segs[seg].len as usize {
            skip -= segs[seg].len as usize;
            seg += 1;
        }
        FrameReader {
            prefix: f.prefix,
            segs,
            seg,
            seg_off: skip,
            remaining: f.len(),
        }
    }

    /// Bytes not yet copied.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Copies up to `cap` bytes to `dst`; returns how many.
    ///
    /// # Safety
    /// `dst..dst+cap` must be valid for writes and must not overlap the source
    /// segments.
    #[inline]
    pub unsafe fn copy_to(&mut self, dst: *mut u8, cap: usize) -> usize {
        let cap = cap.min(self.remaining);
        let mut done = 0;
        if !self.prefix.is_empty() && cap > 0 {
            let n = self.prefix.len().min(cap);
            // SAFETY: caller guarantees dst..dst+cap is writable; n <= cap.
            unsafe { ptr::copy_nonoverlapping(self.prefix.as_ptr(), dst, n) };
            self.prefix = &self.prefix[n..];
            done = n;
        }
        while done < cap && self.seg < self.segs.len() {
            let s = self.segs[self.seg];
            let avail = s.len as usize - self.seg_off;
            let n = avail.min(cap - done);
            // SAFETY: the segment range was bounds-checked against a live
            // mapping on receive (seg_off + n <= s.len), and dst+done..+n is
            // within the caller's writable range.
            unsafe { ptr::copy_nonoverlapping(s.ptr.add(self.seg_off), dst.add(done), n) };
            done += n;
            self.seg_off += n;
            if self.seg_off == s.len as usize {
                self.seg += 1;
                self.seg_off = 0;
            }
        }
        self.remaining -= done;
        done
    }
}

#[cfg(test)]
impl RxFrame {
    /// For tests: a frame of `parts`, one segment each. The caller keeps
    /// `parts` alive while the frame is read.
    pub(crate) fn of(parts: &[&[u8]]) -> RxFrame {
        let mut f = RxFrame::default();
        for p in parts {
            // SAFETY: every caller keeps `parts` alive while it reads the frame.
            assert!(unsafe { f.push(p.as_ptr(), p.len() as u32) });
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(tx: TxFrame<'_>, chunk: usize) -> Vec<u8> {
        let mut r = tx.reader();
        let mut out = Vec::new();
        while r.remaining() > 0 {
            let mut buf = vec![0u8; chunk];
            // SAFETY: buf is a fresh, writable allocation of `chunk` bytes.
            let n = unsafe { r.copy_to(buf.as_mut_ptr(), chunk) };
            assert!(n > 0);
            out.extend_from_slice(&buf[..n]);
        }
        out
    }

    #[test]
    fn copies_across_segments_with_prefix_and_skip() {
        let a: Vec<u8> = (0..20).collect();
        let b: Vec<u8> = (20..50).collect();
        let f = RxFrame::of(&[&a, &b]);
        assert_eq!(f.len, 50);
        let all: Vec<u8> = (0..50).collect();
        for chunk in [1, 3, 7, 64] {
            assert_eq!(collect(TxFrame::plain(&f), chunk), all);
        }
        // Pop a 4-byte tag at offset 12: prefix = bytes 0..12, skip 16.
        let tx = TxFrame::rewritten(&f, &all[..12], 16);
        let mut want = all[..12].to_vec();
        want.extend_from_slice(&all[16..]);
        assert_eq!(tx.len(), 46);
        assert_eq!(collect(tx, 5), want);
        // Skip exactly the first segment.
        let tx = TxFrame::rewritten(&f, &[], 20);
        assert_eq!(collect(tx, 8), b);
        // A window: 25 bytes from offset 14 (past a 12-byte prefix), after
        // a header of its own; one piece at a time too.
        let tx = TxFrame::rewritten(&f, &all[..12], 16);
        let w = tx.window(14, 25, &[9, 9]);
        let mut want = vec![9, 9];
        want.extend_from_slice(&all[18..43]);
        assert_eq!(w.len(), 27);
        assert_eq!(collect(w, 4), want);
        let mut pieces = Vec::new();
        w.for_each_piece(|p, n| {
            // SAFETY: the pieces lie in `all`, `a` and `b`, alive here.
            pieces.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) })
        });
        assert_eq!(pieces, want);
    }

    #[test]
    fn copy_frame_moves_exactly_the_bytes_asked_for() {
        let src: Vec<u8> = (0..=255u8).collect();
        for off in [0, 1, 7] {
            for len in 0..=100 {
                let mut dst = [0xeeu8; 120];
                // SAFETY: both ranges are inside their vectors, which are
                // distinct.
                unsafe { copy_frame(src[off..].as_ptr(), dst[3..].as_mut_ptr(), len) };
                assert_eq!(&dst[3..3 + len], &src[off..off + len], "len {len}");
                assert!(dst[..3].iter().chain(&dst[3 + len..]).all(|&b| b == 0xee));
            }
        }
    }

    #[test]
    fn read_prefix_spans_segments() {
        let a = [1u8, 2, 3];
        let b = [4u8, 5, 6, 7];
        let f = RxFrame::of(&[&a, &b]);
        let mut out = [0u8; 5];
        assert_eq!(f.read_prefix(&mut out), 5);
        assert_eq!(out, [1, 2, 3, 4, 5]);
        let mut big = [0u8; 18];
        assert_eq!(f.read_prefix(&mut big), 7);
        // A first segment that holds the whole prefix, and one exactly
        // as long as it.
        let mut two = [0u8; 2];
        assert_eq!(f.read_prefix(&mut two), 2);
        assert_eq!(two, [1, 2]);
        let mut three = [0u8; 3];
        assert_eq!(f.read_prefix(&mut three), 3);
        assert_eq!(three, [1, 2, 3]);
        let empty = RxFrame::default();
        assert_eq!(empty.read_prefix(&mut three), 0);
    }

    #[test]
    fn push_stops_at_max_segments() {
        let b = [0u8; 1];
        let mut f = RxFrame::default();
        for _ in 0..MAX_SEGS {
            // SAFETY: `b` outlives the frame.
            assert!(unsafe { f.push(b.as_ptr(), 1) });
        }
        // SAFETY: as above.
        assert!(!unsafe { f.push(b.as_ptr(), 1) });
    }
}
