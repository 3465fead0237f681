//! memif data path: receive and transmit queues for both roles.
//!
//! Counters are free-running `u16`s. The slave writes only `head`, the master
//! only `tail`:
//! - master receives on S2M (reads head, writes tail) and transmits on M2S
//!   into buffers the slave posted (reads head, writes tail);
//! - slave transmits on S2M from its own buffers (writes head, reads tail)
//!   and receives on M2S after posting empty buffers (writes head, reads tail).
//!
//! Every descriptor is re-read and checked against the mapped regions before
//! its buffer is touched; a peer that breaks the rules gets a [`QueueFault`].

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::region::Regions;
use super::ring::{Desc, Ring};
use crate::eventfd::kick_eventfd;
use crate::queue::{
    prefetch, rx_unless_truncated, tx_each, tx_unless_truncated, QueueFault, RxBurst, RxQueue,
    Segment, TxError, TxFrame, TxOutcome, TxQueue, BURST_SIZE,
};
use crate::wire::memif::{DESC_FLAG_NEXT, RING_FLAG_MASK_INT};

/// Longest descriptor chain we write for one frame.
pub const MAX_TX_CHAIN: u16 = 64;

/// Which end of the connection we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// We listen; the peer owns the memory.
    Master,
    /// We connect and own the memory.
    Slave,
}

/// Where a slave's own buffers for one ring are: buffer for slot `i` is at
/// `first + (i & mask) * size` in region 0.
#[derive(Debug, Clone, Copy)]
pub struct OwnBuffers {
    /// Offset of the buffer of slot 0.
    pub first: u32,
    /// Buffer size.
    pub size: u32,
}

impl OwnBuffers {
    #[inline]
    fn desc(&self, ring: &Ring, slot: u16, length: u32, flags: u16) -> Desc {
        let i = u32::from(slot) & (ring.size() - 1);
        Desc {
            flags,
            region: 0,
            length,
            offset: self.first + i * self.size,
        }
    }
}

/// A receive queue.
pub struct MemifRx {
    role: Role,
    ring: Ring,
    regions: Arc<Regions>,
    irq: OwnedFd,
    cursor: u16,
    consumed: u16,
    /// Slave only: our posting counter and buffers.
    posted: u16,
    own: Option<OwnBuffers>,
}

impl MemifRx {
    /// Wraps a ring we receive on. The slave side posts every buffer now.
    pub fn new(
        role: Role,
        ring: Ring,
        regions: Arc<Regions>,
        irq: OwnedFd,
        own: Option<OwnBuffers>,
    ) -> MemifRx {
        let mut q = MemifRx {
            role,
            ring,
            regions,
            irq,
            cursor: 0,
            consumed: 0,
            posted: 0,
            own,
        };
        match role {
            Role::Master => q.ring.set_tail(0),
            Role::Slave => {
                q.ring.set_head(0);
                q.refill();
            }
        }
        // Start in polling mode; the worker unmasks before it sleeps.
        q.ring.set_flags(RING_FLAG_MASK_INT);
        q
    }

    /// Wraps a ring another process received on until now (a takeover),
    /// where its last burst left it: the cursor is read from the counter
    /// this side writes (a master's tail; a slave's head, which its refills
    /// keep one ring ahead of what it consumed). Nothing is written.
    pub fn resume(
        role: Role,
        ring: Ring,
        regions: Arc<Regions>,
        irq: OwnedFd,
        own: Option<OwnBuffers>,
    ) -> MemifRx {
        let (cursor, posted) = match role {
            Role::Master => (ring.tail(), 0),
            Role::Slave => {
                let head = ring.head();
                (head.wrapping_sub(ring.size() as u16), head)
            }
        };
        MemifRx {
            role,
            ring,
            regions,
            irq,
            cursor,
            consumed: 0,
            posted,
            own,
        }
    }

    fn refill(&mut self) {
        let Some(own) = self.own else { return };
        let target = self.cursor.wrapping_add(self.ring.size() as u16);
        let mut h = self.posted;
        while h != target {
            self.ring.set_desc(h, own.desc(&self.ring, h, own.size, 0));
            h = h.wrapping_add(1);
        }
        self.posted = h;
        self.ring.set_head(h);
    }

    #[inline]
    fn peer_counter(&self) -> u16 {
        match self.role {
            Role::Master => self.ring.head(),
            Role::Slave => self.ring.tail(),
        }
    }
}

/// Where descriptor `d` of `slot` points in `regions`, bounds-checked:
/// a buffer the peer wrote (receive) or posted (a master's transmit).
#[inline]
fn resolve(regions: &Regions, slot: u16, d: &Desc) -> Result<*mut u8, QueueFault> {
    regions
        .resolve(d.region, d.offset, d.length)
        .ok_or(QueueFault::BadDescriptor {
            slot,
            region: d.region,
            offset: d.offset,
            length: d.length,
        })
}

impl MemifRx {
    /// Gathers up to a burst of the peer's frames.
    fn take_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        let limit = self.peer_counter();
        let avail = limit.wrapping_sub(self.cursor);
        let allowed = match self.role {
            Role::Master => self.ring.size(),
            Role::Slave => u32::from(self.posted.wrapping_sub(self.cursor)),
        };
        if u32::from(avail) > allowed {
            return Err(QueueFault::BadRingIndex {
                what: if self.role == Role::Master {
                    "s2m head"
                } else {
                    "m2s tail"
                },
                cursor: self.cursor,
                peer: limit,
                size: self.ring.size(),
            });
        }
        let mut slot = self.cursor;
        // The count of frames held and of frames dropped are kept here and
        // stored once, after the loop.
        let (frames, mut n) = burst.slots();
        let mut dropped = 0;
        while slot != limit && n < BURST_SIZE {
            let start = slot;
            let d = self.ring.desc(slot);
            let ptr = resolve(&self.regions, slot, &d)?;
            // The peer has just written this frame, so its first line is
            // in the peer's cache: the switch reads it next (the Ethernet
            // header). Hinting the whole burst's headers here lets those
            // misses overlap.
            prefetch::read(ptr);
            slot = slot.wrapping_add(1);
            let frame = &mut frames[n];
            if d.flags & DESC_FLAG_NEXT == 0 {
                // The usual frame: one buffer.
                // SAFETY: `resolve` bounds-checked the descriptor against
                // a region this queue maps until it is dropped, and a
                // burst is released before its queue can be.
                unsafe { frame.set_single(ptr, d.length) };
                n += 1;
                continue;
            }
            frame.clear();
            // SAFETY: as above.
            let mut fits = unsafe { frame.push(ptr, d.length) };
            loop {
                if slot == limit {
                    return Err(QueueFault::UnterminatedChain { slot: start });
                }
                let d = self.ring.desc(slot);
                let ptr = resolve(&self.regions, slot, &d)?;
                // SAFETY: as above.
                fits &= unsafe { frame.push(ptr, d.length) };
                slot = slot.wrapping_add(1);
                if d.flags & DESC_FLAG_NEXT == 0 {
                    break;
                }
            }
            if fits {
                n += 1;
            } else {
                dropped += 1;
            }
        }
        // SAFETY: the loop above filled slots `len..n` of this burst (one
        // `set_single` or pushes each, over buffers bounds-checked against
        // the mapping the burst holds); slots below `len` were already held.
        unsafe { burst.set_len(n) };
        burst.dropped += dropped;
        self.consumed = slot.wrapping_sub(self.cursor);
        Ok(burst.len())
    }
}

impl RxQueue for MemifRx {
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        let got = self.take_burst(burst);
        rx_unless_truncated(got, self.regions.truncated())
    }

    fn release(&mut self) {
        if self.consumed == 0 {
            return;
        }
        self.cursor = self.cursor.wrapping_add(self.consumed);
        self.consumed = 0;
        match self.role {
            Role::Master => self.ring.set_tail(self.cursor),
            Role::Slave => self.refill(),
        }
    }

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.irq.as_fd())
    }

    fn set_interrupt(&mut self, enabled: bool) {
        self.ring
            .set_flags(if enabled { 0 } else { RING_FLAG_MASK_INT });
    }

    fn has_pending(&self) -> bool {
        // Order our flag store before reading the peer's counter, so a frame
        // enqueued just before we unmasked is seen here.
        fence(Ordering::SeqCst);
        self.peer_counter() != self.cursor
    }
}

/// A transmit queue.
pub struct MemifTx {
    role: Role,
    ring: Ring,
    regions: Arc<Regions>,
    irq: OwnedFd,
    cursor: u16,
    published: u16,
    limit: u16,
    own: Option<OwnBuffers>,
}

impl MemifTx {
    /// Wraps a ring we transmit on.
    pub fn new(
        role: Role,
        ring: Ring,
        regions: Arc<Regions>,
        irq: OwnedFd,
        own: Option<OwnBuffers>,
    ) -> MemifTx {
        match role {
            Role::Master => ring.set_tail(0),
            Role::Slave => ring.set_head(0),
        }
        MemifTx {
            role,
            ring,
            regions,
            irq,
            cursor: 0,
            published: 0,
            limit: 0,
            own,
        }
    }

    /// Wraps a ring another process transmitted on until now (a takeover),
    /// where its last flush left it: at the counter this side writes (a
    /// master's tail, a slave's head). Nothing is written.
    pub fn resume(
        role: Role,
        ring: Ring,
        regions: Arc<Regions>,
        irq: OwnedFd,
        own: Option<OwnBuffers>,
    ) -> MemifTx {
        let at = match role {
            Role::Master => ring.tail(),
            Role::Slave => ring.head(),
        };
        MemifTx {
            role,
            ring,
            regions,
            irq,
            cursor: at,
            published: at,
            limit: at,
            own,
        }
    }

    /// Re-reads the peer's counter; returns the new limit of fillable slots.
    fn refresh(&mut self) -> Result<(), QueueFault> {
        let size = self.ring.size();
        match self.role {
            Role::Master => {
                let head = self.ring.head();
                if u32::from(head.wrapping_sub(self.cursor)) > size {
                    return Err(QueueFault::BadRingIndex {
                        what: "m2s head",
                        cursor: self.cursor,
                        peer: head,
                        size,
                    });
                }
                self.limit = head;
            }
            Role::Slave => {
                let tail = self.ring.tail();
                if u32::from(self.published.wrapping_sub(tail)) > size {
                    return Err(QueueFault::BadRingIndex {
                        what: "s2m tail",
                        cursor: self.published,
                        peer: tail,
                        size,
                    });
                }
                self.limit = tail.wrapping_add(size as u16);
            }
        }
        Ok(())
    }
}

impl MemifTx {
    /// The buffer of `slot` (refreshing the limit when the known slots are
    /// used up): `(host pointer, capacity, our descriptor)`, the descriptor
    /// when we are a slave writing whole descriptors for our own buffers.
    #[inline(always)]
    fn buffer(&mut self, slot: u16) -> Result<(*mut u8, u32, Option<Desc>), TxError> {
        if slot == self.limit {
            self.refresh().map_err(TxError::fault)?;
            if slot == self.limit {
                return Err(TxError::Full);
            }
        }
        // A slave writes whole descriptors pointing at its own buffers; a
        // master fills the buffer the slave posted and sets length/flags.
        match (self.role, self.own) {
            (Role::Slave, Some(own)) => {
                let d = own.desc(&self.ring, slot, own.size, 0);
                let p = self.regions.resolve(0, d.offset, own.size).ok_or_else(|| {
                    TxError::fault(QueueFault::Other("own buffer outside region".into()))
                })?;
                Ok((p, own.size, Some(d)))
            }
            _ => {
                let d = self.ring.desc(slot);
                let p = resolve(&self.regions, slot, &d).map_err(TxError::fault)?;
                Ok((p, d.length, None))
            }
        }
    }

    /// Records that `n` bytes were written to `slot`'s buffer.
    #[inline]
    fn filled(&self, slot: u16, own_desc: Option<Desc>, n: u32, flags: u16) {
        match own_desc {
            Some(d) => self.ring.set_desc(
                slot,
                Desc {
                    length: n,
                    flags,
                    ..d
                },
            ),
            None => self.ring.set_len_flags(slot, n, flags),
        }
    }

    /// Copies `frame` into the next buffers (see [`TxQueue::tx`]).
    #[inline(always)]
    fn put(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        let start = self.cursor;
        let (ptr, cap, own_desc) = self.buffer(start)?;
        // The common case: one segment, unchanged, that fits one buffer.
        if let Some(seg) = frame.single().filter(|s| s.len() <= cap) {
            // SAFETY: `ptr..ptr+cap` was checked to lie in a mapped region
            // and `seg.len <= cap`.
            unsafe { self.put_single(start, ptr, seg, own_desc) };
            return Ok(());
        }
        self.put_chained(frame, start, (ptr, cap, own_desc))
    }

    /// Copies `seg`, a frame of one segment, into the buffer of `slot` at
    /// `ptr`, records it and takes the slot.
    ///
    /// # Safety
    ///
    /// `ptr..ptr+seg.len` lies in a mapped region. The segment was checked
    /// against its own port's mapping on receive, and the switch never
    /// sends a frame back out of the port it came in on, so the ranges are
    /// disjoint.
    #[inline(always)]
    unsafe fn put_single(&mut self, slot: u16, ptr: *mut u8, seg: Segment, own: Option<Desc>) {
        // SAFETY: as the caller guarantees.
        unsafe { crate::queue::copy_frame(seg.ptr(), ptr, seg.len() as usize) };
        self.filled(slot, own, seg.len(), 0);
        self.cursor = slot.wrapping_add(1);
    }

    /// [`MemifTx::put`] of a frame that is rewritten, in several segments
    /// or larger than one buffer: through a [`crate::queue::FrameReader`],
    /// into as many buffers as it takes, the first of them `first` (at
    /// `start`).
    #[inline(never)]
    fn put_chained(
        &mut self,
        frame: &TxFrame<'_>,
        start: u16,
        first: (*mut u8, u32, Option<Desc>),
    ) -> Result<(), TxError> {
        let mut reader = frame.reader();
        let mut slot = start;
        let (mut ptr, mut cap, mut own_desc) = first;
        loop {
            // SAFETY: `ptr..ptr+cap` was checked to lie in a mapped region; the
            // source frame is in another port's memory (or another buffer).
            let n = unsafe { reader.copy_to(ptr, cap as usize) } as u32;
            let more = reader.remaining() > 0;
            self.filled(slot, own_desc, n, if more { DESC_FLAG_NEXT } else { 0 });
            slot = slot.wrapping_add(1);
            if !more {
                break;
            }
            if slot.wrapping_sub(start) >= MAX_TX_CHAIN {
                return Err(TxError::TooLong);
            }
            (ptr, cap, own_desc) = self.buffer(slot)?;
        }
        self.cursor = slot;
        Ok(())
    }
}

impl TxQueue for MemifTx {
    /// Inlined into this queue's `tx_burst` loop, for the frames that
    /// loop does not copy itself.
    #[inline(always)]
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        let got = self.put(frame);
        tx_unless_truncated(got, || self.regions.truncated())
    }

    /// A master's usual frame (one segment, unchanged, that fits the
    /// buffer the slave posted, with room known in the ring) is copied
    /// straight in; any other frame, and a slave's, goes through
    /// [`MemifTx::tx`], which refreshes the room and reports errors.
    fn tx_burst(&mut self, frames: &[TxFrame<'_>]) -> TxOutcome {
        if self.role == Role::Slave {
            return tx_each(frames, |f| self.tx(f));
        }
        tx_each(frames, |f| {
            let slot = self.cursor;
            if slot != self.limit {
                if let Some(seg) = f.single() {
                    let d = self.ring.desc(slot);
                    if seg.len() <= d.length {
                        if let Some(p) = self.regions.resolve(d.region, d.offset, d.length) {
                            // SAFETY: `p..p+d.length` lies in a mapped
                            // region and `seg.len <= d.length`.
                            unsafe { self.put_single(slot, p, seg, None) };
                            return Ok(());
                        }
                    }
                }
            }
            self.tx(f)
        })
    }

    fn flush(&mut self) {
        if self.cursor == self.published {
            return;
        }
        match self.role {
            Role::Master => self.ring.set_tail(self.cursor),
            Role::Slave => self.ring.set_head(self.cursor),
        }
        self.published = self.cursor;
        // No fence between the counter store and the flag read, as DPDK,
        // VPP and libmemif publish: a fence here waits for every store of
        // the burst (the frames, the descriptors, the counter, all in the
        // peer's cache) to land, once per flush, and a one-frame round trip
        // pays it in full. The cost is the memif protocol's own: a peer
        // that unmasks at this instant may read the old counter and sleep
        // until its next interrupt or timeout (the switch's own workers
        // look again a moment after unmasking, which catches it).
        if self.ring.flags() & RING_FLAG_MASK_INT == 0 {
            kick_eventfd(self.irq.as_fd());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::memif::region::Region;
    use crate::queue::testing::mixed_burst;
    use crate::queue::{TxFrame, MAX_SEGS};
    use crate::wire::memif::{ring_bytes, COOKIE};

    const LOG2: u8 = 4;
    const BUF: u32 = 256;

    /// One region holding a ring at 0 and 16 buffers after it, as a slave lays it out.
    fn setup() -> (Arc<Regions>, Ring, u32) {
        setup_sized(LOG2)
    }

    /// [`setup`] with a ring of `1 << log2` slots (still 16 buffers).
    fn setup_sized(log2: u8) -> (Arc<Regions>, Ring, u32) {
        let first = ring_bytes(log2) as u32;
        let size = u64::from(first) + 16 * u64::from(BUF);
        let r = Region::create("q", size).unwrap();
        // SAFETY: the ring fits at offset 0 of a fresh, page-aligned mapping
        // kept alive by the returned Regions.
        let ring = unsafe { Ring::new(r.base(), log2) };
        ring.set_cookie(COOKIE);
        (Arc::new(Regions::new(vec![r])), ring, first)
    }

    /// A master's receive queue on `ring`, in `regions`.
    fn master_rx(ring: Ring, regions: &Arc<Regions>) -> MemifRx {
        let irq = crate::eventfd::new_eventfd().unwrap();
        MemifRx::new(Role::Master, ring, regions.clone(), irq, None)
    }

    fn peer_fill(regions: &Regions, ring: &Ring, slot: u16, d: Desc, byte: u8) {
        if let Some(p) = regions.resolve(d.region, d.offset, d.length) {
            // SAFETY: the range was just checked against the mapping.
            unsafe { std::ptr::write_bytes(p, byte, d.length as usize) };
        }
        ring.set_desc(slot, d);
    }

    #[test]
    fn master_rx_reads_frames_and_chains() {
        let (regions, ring, first) = setup();
        let mut rx = master_rx(ring, &regions);
        let d = |i: u32, len: u32, flags: u16| Desc {
            flags,
            region: 0,
            length: len,
            offset: first + i * BUF,
        };
        peer_fill(&regions, &ring, 0, d(0, 60, 0), 0xaa);
        peer_fill(&regions, &ring, 1, d(1, 256, DESC_FLAG_NEXT), 0xbb);
        peer_fill(&regions, &ring, 2, d(2, 100, 0), 0xcc);
        ring.set_head(3);
        let mut burst = RxBurst::default();
        assert_eq!(rx.rx_burst(&mut burst).unwrap(), 2);
        assert_eq!(burst.frames()[0].len, 60);
        assert_eq!(burst.frames()[1].len, 356);
        assert_eq!(burst.frames()[1].segments().len(), 2);
        rx.release();
        assert_eq!(ring.tail(), 3);
    }

    #[test]
    fn master_rx_drops_a_chain_of_too_many_buffers_and_keeps_its_neighbours() {
        let (regions, ring, first) = setup_sized(6);
        let mut rx = master_rx(ring, &regions);
        let d = |len: u32, flags: u16| Desc {
            flags,
            region: 0,
            length: len,
            offset: first,
        };
        // A one-buffer frame, a chain of MAX_SEGS + 1 buffers, one of
        // MAX_SEGS - 3 and a one-buffer frame: the 64 slots of the ring.
        let mut slot = 0u16;
        let mut put = |n: usize, len: u32| {
            for i in 0..n {
                let flags = if i + 1 < n { DESC_FLAG_NEXT } else { 0 };
                ring.set_desc(slot, d(len, flags));
                slot += 1;
            }
        };
        put(1, 60);
        put(MAX_SEGS + 1, 10);
        put(MAX_SEGS - 3, 10);
        put(1, 61);
        ring.set_head(slot);
        let mut burst = RxBurst::default();
        assert_eq!(rx.rx_burst(&mut burst).unwrap(), 3);
        let lens: Vec<u32> = burst.frames().iter().map(|f| f.len).collect();
        assert_eq!(lens, [60, 10 * (MAX_SEGS as u32 - 3), 61]);
        assert_eq!(burst.frames()[1].segments().len(), MAX_SEGS - 3);
        assert_eq!(burst.dropped, 1, "the chain of MAX_SEGS + 1");
        rx.release();
        assert_eq!(ring.tail(), slot);
    }

    #[test]
    fn master_rx_faults_on_hostile_descriptors_and_counters() {
        let cases: Vec<(Desc, u16)> = vec![
            // offset + length past the region, including u32 overflow
            (
                Desc {
                    flags: 0,
                    region: 0,
                    length: 4096,
                    offset: u32::MAX - 10,
                },
                1,
            ),
            (
                Desc {
                    flags: 0,
                    region: 0,
                    length: u32::MAX,
                    offset: 16,
                },
                1,
            ),
            // a region that does not exist
            (
                Desc {
                    flags: 0,
                    region: 3,
                    length: 10,
                    offset: 0,
                },
                1,
            ),
            // head beyond the ring size
            (
                Desc {
                    flags: 0,
                    region: 0,
                    length: 10,
                    offset: 0,
                },
                17,
            ),
            // a chain that never ends inside what was published
            (
                Desc {
                    flags: DESC_FLAG_NEXT,
                    region: 0,
                    length: 10,
                    offset: 0,
                },
                1,
            ),
        ];
        for (d, head) in cases {
            let (regions, ring, _) = setup();
            let mut rx = master_rx(ring, &regions);
            for s in 0..16 {
                ring.set_desc(s, d);
            }
            ring.set_head(head);
            let mut burst = RxBurst::default();
            assert!(
                rx.rx_burst(&mut burst).is_err(),
                "{d:?} head {head} accepted"
            );
        }
    }

    #[test]
    fn master_tx_burst_fills_posted_buffers_and_chains_what_does_not_fit() {
        let (regions, ring, first) = setup();
        let irq = crate::eventfd::new_eventfd().unwrap();
        let mut tx = MemifTx::new(Role::Master, ring, regions.clone(), irq, None);
        // The slave posts 6 buffers of BUF bytes, slot i at buffer i.
        let post = |slot: u16| Desc {
            flags: 0,
            region: 0,
            length: BUF,
            offset: first + u32::from(slot) * BUF,
        };
        for slot in 0..6 {
            ring.set_desc(slot, post(slot));
        }
        ring.set_head(6);
        let bytes = |slot: u16, n: usize| {
            let d = ring.desc(slot);
            let p = regions.resolve(d.region, d.offset, d.length).unwrap();
            // SAFETY: `resolve` checked the range against the mapping.
            unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
        };
        let short: Vec<u8> = (0..60u8).collect();
        let long: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let (mut a, mut b) = (
            crate::queue::RxFrame::default(),
            crate::queue::RxFrame::default(),
        );
        // SAFETY: `short` and `long` outlive the frames.
        unsafe {
            assert!(a.push(short.as_ptr(), 60));
            assert!(b.push(long.as_ptr(), 300));
        }
        let tag = [0xeeu8; 16];
        let frames = mixed_burst(&a, &b, &tag);
        let out = tx.tx_burst(&frames);
        assert_eq!((out.sent, out.tried), (0b1111, 4));
        assert!(matches!(out.stop, Some(TxError::Full)));
        tx.flush();
        assert_eq!(ring.tail(), 5);
        assert_eq!((ring.desc(0).length, ring.desc(0).flags), (60, 0));
        assert_eq!(bytes(0, 60), short);
        assert_eq!(
            (ring.desc(1).length, ring.desc(1).flags),
            (BUF, DESC_FLAG_NEXT)
        );
        assert_eq!((ring.desc(2).length, ring.desc(2).flags), (300 - BUF, 0));
        assert_eq!(
            [bytes(1, BUF as usize), bytes(2, 300 - BUF as usize)].concat(),
            long
        );
        assert_eq!(ring.desc(3).length, 16 + 48);
        assert_eq!(bytes(3, 16), tag);
        assert_eq!(bytes(3, 64)[16..], short[12..]);
        assert_eq!((ring.desc(4).length, ring.desc(4).flags), (60, 0));
        // A posted buffer outside the slave's region is a fault, not a copy.
        ring.set_desc(
            5,
            Desc {
                offset: u32::MAX - 8,
                ..post(5)
            },
        );
        let out = tx.tx_burst(&frames[..1]);
        assert_eq!(out.sent, 0);
        assert!(matches!(out.stop, Some(TxError::Fault(_))));
    }

    #[test]
    fn slave_tx_chains_long_frames_and_respects_the_master_tail() {
        let (regions, ring, first) = setup();
        let mut tx = MemifTx::new(
            Role::Slave,
            ring,
            regions.clone(),
            crate::eventfd::new_eventfd().unwrap(),
            Some(OwnBuffers { first, size: BUF }),
        );
        let payload: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
        let mut f = crate::queue::RxFrame::default();
        // SAFETY: `payload` outlives the frame.
        assert!(unsafe { f.push(payload.as_ptr(), 600) });
        tx.tx(&TxFrame::plain(&f)).unwrap();
        tx.flush();
        assert_eq!(
            ring.head(),
            3,
            "600 bytes in 256-byte buffers: 3 descriptors"
        );
        assert_eq!(ring.desc(0).flags, DESC_FLAG_NEXT);
        assert_eq!(ring.desc(2).flags, 0);
        assert_eq!(ring.desc(2).length, 600 - 512);
        // Fill the ring: 13 more slots free, then Full.
        let mut sent = 0;
        while tx.tx(&TxFrame::plain(&f)).is_ok() {
            sent += 1;
        }
        assert_eq!(sent, 4);
        // A master tail beyond our head is a fault.
        ring.set_tail(200);
        tx.limit = tx.cursor; // force a re-read
        assert!(matches!(tx.tx(&TxFrame::plain(&f)), Err(TxError::Fault(_))));
    }
}
