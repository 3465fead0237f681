//! The data path of a vhost-user port: split virtqueues polled by workers.
//!
//! `virtio-queue`'s `Queue` keeps each ring's configuration and position and
//! sets notification suppression; the per-frame work (avail entries,
//! descriptor chains, used elements) goes straight through host pointers
//! ([`super::split`]), checked as it is read. A driver that breaks a ring
//! (an avail index or head out of range, a loop, a buffer outside its
//! memory or of the wrong direction) costs its port a reset.
//!
//! Receive (the driver's transmit queue) is zero-copy: a frame's segments
//! point into guest memory until the burst is released. Transmit (the
//! driver's receive queue) copies each frame once, straight from the source
//! port's memory into guest buffers, merging buffers when the frame does not
//! fit one (`VIRTIO_NET_F_MRG_RXBUF`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::split::{Broken, Desc, MemTable, SplitRing};

use crate::eventfd::kick_eventfd;
use crate::port::sigbus::Tripwire;
use crate::wire::virtio_net::VNET_HDR_LEN;
use crate::queue::{
    prefetch, rx_unless_truncated, tx_each, tx_unless_truncated, Offload, OffloadCaps, QueueFault,
    RxBurst, RxFrame, RxQueue, Segment, TxError, TxFrame, TxOutcome, TxQueue, BURST_SIZE,
};
use crate::wire::virtio_net::{header_bytes, HEADER_LEN};

/// Most guest buffers one transmitted frame may be spread over.
const MAX_MERGED: usize = 64;
/// Most memory pieces one guest receive chain may consist of (a driver
/// without mergeable buffers that takes 64 KB frames posts chains of
/// `MAX_SKB_FRAGS + 2` pages).
const MAX_PIECES: usize = 32;

/// Where a ring stopped, written when a worker lets go of its queue.
#[derive(Debug, Default)]
pub struct RingProgress(AtomicU32);

impl RingProgress {
    /// `(next_avail, next_used)`.
    pub fn load(&self) -> (u16, u16) {
        let v = self.0.load(Ordering::Acquire);
        (v as u16, (v >> 16) as u16)
    }

    fn store(&self, next_avail: u16, next_used: u16) {
        self.0.store(
            u32::from(next_avail) | u32::from(next_used) << 16,
            Ordering::Release,
        );
    }
}

/// One virtqueue as a worker owns it.
pub struct Vq {
    /// Trips when the driver truncates the memory behind `mem`. Declared
    /// before `mem`, so it is dropped before the mapping may be unmapped
    /// (the rule of [`Tripwire`]).
    wire: Option<Arc<Tripwire>>,
    queue: Queue,
    /// Host views of the rings and of the memory (valid while `mem` lives).
    ring: SplitRing,
    table: MemTable,
    mem: Arc<GuestMemoryMmap>,
    kick: Option<OwnedFd>,
    call: Option<OwnedFd>,
    progress: Arc<RingProgress>,
    /// Used elements written after `next_used` but not yet published.
    pending: u16,
    /// `next_used` when the driver was last considered for a signal.
    signalled: u16,
}

impl Vq {
    /// A queue over `mem`; `Err` names the ring part that does not lie
    /// inside one region of it.
    pub fn new(
        queue: Queue,
        mem: Arc<GuestMemoryMmap>,
        kick: Option<OwnedFd>,
        call: Option<OwnedFd>,
    ) -> Result<Vq, String> {
        let table = MemTable::new(&mem).ok_or("guest memory without a host mapping")?;
        let ring = SplitRing::new(
            &table,
            queue.desc_table(),
            queue.avail_ring(),
            queue.used_ring(),
            queue.size(),
        )
        .ok_or_else(|| {
            format!(
                "rings (desc {:#x}, avail {:#x}, used {:#x}, size {}) do not each lie inside one memory region, aligned",
                queue.desc_table(),
                queue.avail_ring(),
                queue.used_ring(),
                queue.size()
            )
        })?;
        let progress = Arc::new(RingProgress::default());
        progress.store(queue.next_avail(), queue.next_used());
        let mut vq = Vq {
            signalled: queue.next_used(),
            queue,
            ring,
            table,
            mem,
            kick,
            call,
            progress,
            wire: None,
            pending: 0,
        };
        // Workers poll: ask the driver not to kick (re-enabled before sleep).
        let _ = vq.queue.disable_notification(&*vq.mem);
        Ok(vq)
    }

    /// The queue, watching `wire`: once it trips, every call fails with
    /// [`QueueFault::PeerMemoryTruncated`].
    pub fn watched_by(mut self, wire: Arc<Tripwire>) -> Vq {
        self.wire = Some(wire);
        self
    }

    /// True once the driver truncated the memory the queue works in.
    #[inline]
    fn memory_gone(&self) -> bool {
        self.wire.as_ref().is_some_and(|w| w.tripped())
    }

    /// A ready queue of `size` entries whose rings lie at the given guest
    /// addresses, without eventfds: how benchmarks, fuzz targets and tests
    /// drive a queue as a simulated driver. `None` when the layout is not
    /// a valid split ring inside `mem`.
    pub fn with_rings(
        mem: Arc<GuestMemoryMmap>,
        size: u16,
        desc: u64,
        avail: u64,
        used: u64,
    ) -> Option<Vq> {
        let mut q = Queue::new(size).ok()?;
        q.set_size(size);
        q.set_ready(true);
        let split = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
        let (lo, hi) = split(desc);
        q.set_desc_table_address(lo, hi);
        let (lo, hi) = split(avail);
        q.set_avail_ring_address(lo, hi);
        let (lo, hi) = split(used);
        q.set_used_ring_address(lo, hi);
        if !q.is_valid(&*mem) {
            return None;
        }
        Vq::new(q, mem, None, None).ok()
    }

    /// The shared record of this ring's position.
    pub fn progress(&self) -> Arc<RingProgress> {
        self.progress.clone()
    }

    /// Writes a used element after the ones already pending, without
    /// publishing it: the driver sees nothing until [`Vq::publish_used`].
    /// `head` was checked against the ring size when it was taken.
    #[inline]
    fn write_used(&mut self, head: u16, len: u32) {
        let counter = self.queue.next_used().wrapping_add(self.pending);
        self.ring.write_used(counter, head, len);
        self.pending += 1;
    }

    /// Publishes every pending used element with one store of the used
    /// index (release: the elements and the buffers' contents are visible
    /// first). A frame spread over several buffers is thus never seen in
    /// part, and the index line the driver polls is written once a burst.
    fn publish_used(&mut self) {
        if self.pending == 0 {
            return;
        }
        let next = self.queue.next_used().wrapping_add(self.pending);
        self.pending = 0;
        self.queue.set_next_used(next);
        self.ring.publish_used(next);
    }

    /// Publishes pending used elements and signals the driver, unless it
    /// asked not to be (`used_event` with EVENT_IDX, else
    /// `VRING_AVAIL_F_NO_INTERRUPT`).
    fn notify_driver(&mut self) {
        self.publish_used();
        let new = self.queue.next_used();
        let old = std::mem::replace(&mut self.signalled, new);
        let Some(call) = &self.call else { return };
        if new == old {
            return;
        }
        // The used index store must be visible before the driver's flag or
        // event index is read (the driver does the mirror image).
        std::sync::atomic::fence(Ordering::SeqCst);
        let wanted = if self.queue.event_idx_enabled() {
            need_event(self.ring.used_event(), new, old)
        } else {
            self.ring.avail_flags() & VRING_AVAIL_F_NO_INTERRUPT as u16 == 0
        };
        if wanted {
            kick_eventfd(call.as_fd());
        }
    }
}

/// The virtio rule for EVENT_IDX: signal when the driver's `event` index
/// lies in `[old, new)`, the used entries added since the last decision.
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

impl Drop for Vq {
    fn drop(&mut self) {
        // Chains taken from the avail ring are always given back.
        self.publish_used();
        self.progress
            .store(self.queue.next_avail(), self.queue.next_used());
    }
}

impl Vq {
    /// The chain head in avail slot `next` (the caller keeps `next` short
    /// of the driver's avail index), checked against the table.
    #[inline]
    fn head_at(&self, next: u16) -> Result<u16, QueueFault> {
        let head = self.ring.avail_entry(next);
        if head >= self.ring.size() {
            return Err(QueueFault::Other(format!(
                "avail ring names descriptor {head} of a {}-entry table",
                self.ring.size()
            )));
        }
        Ok(head)
    }

    /// The driver's avail index, checked: at most `size` chains ahead.
    #[inline]
    fn avail(&self) -> Result<u16, QueueFault> {
        let avail = self.ring.avail_idx();
        let next = self.queue.next_avail();
        if avail.wrapping_sub(next) > self.ring.size() {
            return Err(QueueFault::Other(format!(
                "virtqueue: avail index {avail} is more than {} entries past {next} \
                 (more descriptors to process than queue size)",
                self.ring.size()
            )));
        }
        Ok(avail)
    }
}

/// Why a chain could not be used.
enum ChainError {
    /// The driver broke the ring: a buffer outside guest memory or of the
    /// wrong direction, or a broken chain. The port is reset.
    Bad(Broken),
    /// More pieces than we follow (the frame alone is dropped).
    TooManyPieces,
    /// The frame's virtio-net header leaves work that does not fit it
    /// (the frame alone is dropped).
    BadOffload,
}

impl From<Broken> for ChainError {
    fn from(why: Broken) -> Self {
        ChainError::Bad(why)
    }
}

const OUTSIDE: ChainError = ChainError::Bad("buffer outside guest memory");

/// Receive side: the driver's transmit queue.
pub struct VirtioRx {
    vq: Vq,
    heads: [u16; BURST_SIZE],
    nheads: usize,
    /// The driver negotiated `VIRTIO_NET_F_CSUM`: its headers may leave
    /// checksum and segmentation work, read into each frame.
    offloads: bool,
}

impl VirtioRx {
    /// Wraps a transmit virtqueue; `offloads`: the driver may leave work
    /// in its frames (`VIRTIO_NET_F_CSUM` negotiated).
    pub fn new(vq: Vq, offloads: bool) -> VirtioRx {
        VirtioRx {
            vq,
            heads: [0; BURST_SIZE],
            nheads: 0,
            offloads,
        }
    }

    /// Fills `frame` with the buffers of chain `head`, minus the virtio-net
    /// header; with `offloads`, the header's work goes in the frame.
    #[inline]
    fn gather(
        ring: &SplitRing,
        table: &MemTable,
        head: u16,
        frame: &mut RxFrame,
        offloads: bool,
    ) -> Result<(), ChainError> {
        // The common chain: one readable buffer holding header and frame.
        if let Some(d) = ring.desc(head).filter(|d| d.lone_readable()) {
            if d.len as usize > HEADER_LEN {
                if let Some(p) = table.translate(d.addr, u64::from(d.len)) {
                    // SAFETY: `translate` bounds-checked the whole buffer
                    // against a mapping held past the burst's release, and
                    // HEADER_LEN < d.len keeps the segment inside it.
                    unsafe { frame.set_single(p.add(HEADER_LEN), d.len - HEADER_LEN as u32) };
                    if offloads {
                        let mut h = [0u8; VNET_HDR_LEN];
                        // SAFETY: the header's bytes lie in the buffer
                        // (checked above); copied, never referenced.
                        unsafe { std::ptr::copy_nonoverlapping(p, h.as_mut_ptr(), VNET_HDR_LEN) };
                        frame.offload = Offload::from_vnet(&h, frame.len as usize)
                            .map_err(|_| ChainError::BadOffload)?
                            .without_data_valid();
                    }
                    return Ok(());
                }
            }
        }
        frame.clear();
        let mut hdr = [0u8; HEADER_LEN];
        let mut skip = HEADER_LEN as u32;
        // Past MAX_SEGS pieces the frame is dropped, but the chain is still
        // walked to its end (bounded by the queue size): only a chain that
        // ends is a frame too long; one that does not is a broken ring.
        let mut too_many = false;
        ring.walk(table, head, |d: Desc| {
            if d.write() {
                return Err(ChainError::Bad(
                    "device-writable buffer on a transmit queue",
                ));
            }
            let cut = skip.min(d.len);
            if cut > 0 {
                // The header's bytes in this buffer, kept for its offloads.
                let at = HEADER_LEN - skip as usize;
                let p = table.translate(d.addr, u64::from(cut)).ok_or(OUTSIDE)?;
                // SAFETY: `translate` bounds-checked `cut` bytes at `p`,
                // and `at + cut <= HEADER_LEN`; copied, never referenced.
                unsafe { std::ptr::copy_nonoverlapping(p, hdr.as_mut_ptr().add(at), cut as usize) };
            }
            skip -= cut;
            let addr = d.addr.checked_add(u64::from(cut)).ok_or(OUTSIDE)?;
            table.for_each_piece(
                addr,
                d.len - cut,
                |p, n| {
                    // SAFETY: `for_each_piece` hands out pieces of guest
                    // memory it bounds-checked, mapped for the life of the
                    // memory table the queue holds past the burst's release.
                    too_many |= !unsafe { frame.push(p, n as u32) };
                    Ok(())
                },
                OUTSIDE,
            )
        })?;
        if skip > 0 {
            return Err(ChainError::Bad("frame shorter than the virtio-net header"));
        }
        if too_many {
            return Err(ChainError::TooManyPieces);
        }
        if offloads {
            let mut h = [0u8; VNET_HDR_LEN];
            h.copy_from_slice(&hdr[..VNET_HDR_LEN]);
            frame.offload = Offload::from_vnet(&h, frame.len as usize)
                .map_err(|_| ChainError::BadOffload)?
                .without_data_valid();
        }
        Ok(())
    }

    /// Gathers up to a burst of the driver's frames.
    fn take_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        let avail = self.vq.avail()?;
        let mut next = self.vq.queue.next_avail();
        // The count of frames held and of frames dropped are kept here and
        // stored once, after the loop.
        let (frames, mut n) = burst.slots();
        let (mut dropped, mut bad_offload) = (0, 0);
        while next != avail && self.nheads < BURST_SIZE && n < BURST_SIZE {
            let head = self.vq.head_at(next)?;
            next = next.wrapping_add(1);
            self.heads[self.nheads] = head;
            self.nheads += 1;
            let slot = &mut frames[n];
            match Self::gather(&self.vq.ring, &self.vq.table, head, slot, self.offloads) {
                Ok(()) => {
                    // The switch reads each frame's Ethernet header next; a
                    // driver that wrote the frame has that line in its own
                    // cache. Hinting the whole burst's headers here lets
                    // those misses overlap (as for memif).
                    if let Some(s) = slot.first_segment() {
                        prefetch::read(s.ptr());
                    }
                    n += 1;
                }
                Err(ChainError::TooManyPieces) => dropped += 1,
                // Metadata that does not fit its frame: that frame is
                // dropped (counted), the ring is sound.
                Err(ChainError::BadOffload) => bad_offload += 1,
                // As kernel vhost-net and QEMU stop a device whose driver
                // broke a ring, the port is reset (counted and logged).
                Err(ChainError::Bad(why)) => {
                    return Err(QueueFault::Other(format!(
                        "transmit chain at descriptor {head}: {why}"
                    )))
                }
            }
        }
        // SAFETY: the loop above filled slots `len..n` of this burst (one
        // `set_single` or pushes each, over buffers bounds-checked against
        // the mapping the burst holds); slots below `len` were already held.
        unsafe { burst.set_len(n) };
        burst.dropped += dropped;
        burst.bad_offload += bad_offload;
        self.vq.queue.set_next_avail(next);
        Ok(burst.len())
    }
}

impl RxQueue for VirtioRx {
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        let got = self.take_burst(burst);
        rx_unless_truncated(got, self.vq.memory_gone())
    }

    fn release(&mut self) {
        if self.nheads == 0 {
            return;
        }
        for i in 0..self.nheads {
            self.vq.write_used(self.heads[i], 0);
        }
        self.nheads = 0;
        self.vq.notify_driver();
    }

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        self.vq.kick.as_ref().map(|k| k.as_fd())
    }

    fn set_interrupt(&mut self, enabled: bool) {
        let mem = &*self.vq.mem;
        let _ = if enabled {
            self.vq.queue.enable_notification(mem).map(|_| ())
        } else {
            self.vq.queue.disable_notification(mem)
        };
    }

    fn has_pending(&self) -> bool {
        self.vq.ring.avail_idx() != self.vq.queue.next_avail()
    }
}

/// One guest receive chain being filled.
struct Sink {
    head: u16,
    pieces: [(*mut u8, usize); MAX_PIECES],
    n: usize,
}

impl Sink {
    fn new() -> Sink {
        Sink {
            head: 0,
            pieces: [(std::ptr::null_mut(), 0); MAX_PIECES],
            n: 0,
        }
    }

    /// Resolves chain `head`'s buffers (all must be device-writable).
    #[inline]
    fn load(&mut self, ring: &SplitRing, table: &MemTable, head: u16) -> Result<(), ChainError> {
        self.head = head;
        self.n = 0;
        ring.walk(table, head, |d: Desc| {
            if !d.write() {
                return Err(ChainError::Bad("driver-readable buffer on a receive queue"));
            }
            table.for_each_piece(
                d.addr,
                d.len,
                |p, n| {
                    if self.n == MAX_PIECES {
                        return Err(ChainError::TooManyPieces);
                    }
                    self.pieces[self.n] = (p, n);
                    self.n += 1;
                    Ok(())
                },
                OUTSIDE,
            )
        })
    }
}

/// Transmit side: the driver's receive queue.
pub struct VirtioTx {
    vq: Vq,
    mergeable: bool,
    /// The offloads the driver negotiated taking.
    caps: OffloadCaps,
    added: u32,
    /// The driver's avail index as last read: chains up to it are known to
    /// be published, so the shared index (a line the driver keeps writing)
    /// is read again only once they are used up, not once per frame.
    avail: u16,
    sink: Sink,
    /// Where the current frame's header goes (pieces of the first chain).
    header: [(*mut u8, usize); HEADER_LEN],
    used: [(u16, u32); MAX_MERGED],
}

impl VirtioTx {
    /// Wraps a receive virtqueue; `mergeable`: MRG_RXBUF was negotiated;
    /// `caps`: the offloads the driver takes (`GUEST_CSUM`, `GUEST_TSO4/6`).
    pub fn new(vq: Vq, mergeable: bool, caps: OffloadCaps) -> VirtioTx {
        VirtioTx {
            avail: vq.queue.next_avail(),
            vq,
            mergeable,
            caps,
            added: 0,
            sink: Sink::new(),
            header: [(std::ptr::null_mut(), 0); HEADER_LEN],
            used: [(0, 0); MAX_MERGED],
        }
    }

    /// Copies the frame into as many chains as it needs; returns how many,
    /// with `(head, bytes)` of each in `self.used`. The chains are taken
    /// (next_avail moves) only when the whole frame fits.
    #[inline(always)]
    fn fill(&mut self, frame: &TxFrame<'_>) -> Result<usize, TxError> {
        let next = self.vq.queue.next_avail();
        if next == self.avail {
            self.avail = self.vq.avail().map_err(TxError::fault)?;
            if next == self.avail {
                return Err(TxError::Full);
            }
        }
        if frame.offload.is_none() {
            if let Some(used) = frame.single().and_then(|seg| self.fill_single(next, seg)) {
                self.used[0] = used;
                return Ok(1);
            }
        }
        self.fill_chains(frame, next)
    }

    /// The common case: `seg`, a frame of one segment, unchanged, into
    /// the chain at `next` when that is one writable buffer that holds it
    /// and its header. Returns the chain's used element, or `None` (nothing
    /// taken) for the general path, which also reports a bad head.
    #[inline(always)]
    fn fill_single(&mut self, next: u16, seg: Segment) -> Option<(u16, u32)> {
        let head = self.vq.ring.avail_entry(next);
        let d = self.vq.ring.desc(head).filter(|d| d.lone_writable())?;
        let len = HEADER_LEN + seg.len() as usize;
        if len > d.len as usize {
            return None;
        }
        let p = self.vq.table.translate(d.addr, u64::from(d.len))?;
        // SAFETY: `translate` bounds-checked the whole buffer, a live
        // device-writable guest range, and HEADER_LEN + seg.len <= d.len.
        unsafe { put_single(p, seg) };
        self.vq.queue.set_next_avail(next.wrapping_add(1));
        Some((head, len as u32))
    }

    /// [`VirtioTx::fill`] of a frame that is rewritten, in several
    /// segments, or for chains of several buffers or several chains: through
    /// a [`crate::queue::FrameReader`], from the chain at `next`.
    #[inline(never)]
    fn fill_chains(&mut self, frame: &TxFrame<'_>, mut next: u16) -> Result<usize, TxError> {
        let VirtioTx {
            vq,
            mergeable,
            caps,
            avail,
            sink,
            header,
            used,
            ..
        } = self;
        let mut reader = frame.reader();
        let mut header_left = HEADER_LEN;
        let mut header_pieces = 0;
        let mut chains = 0usize;
        while header_left > 0 || reader.remaining() > 0 {
            if chains == MAX_MERGED || (chains == 1 && !*mergeable) {
                return Err(TxError::TooLong);
            }
            if next == *avail {
                *avail = vq.avail().map_err(TxError::fault)?;
                if next == *avail {
                    return Err(TxError::Full);
                }
            }
            let head = vq.head_at(next).map_err(TxError::fault)?;
            next = next.wrapping_add(1);
            if let Err(e) = sink.load(&vq.ring, &vq.table, head) {
                let why = match e {
                    ChainError::Bad(why) => why,
                    ChainError::TooManyPieces => "more buffers in one chain than followed",
                    ChainError::BadOffload => "a receive chain has no header to read",
                };
                return Err(TxError::fault(QueueFault::Other(format!(
                    "receive chain at descriptor {head}: {why}"
                ))));
            }
            if chains == 0 && frame.offload.is_none() {
                if let Some(n) = Self::fill_one(sink, frame) {
                    used[0] = (head, n as u32);
                    vq.queue.set_next_avail(next);
                    return Ok(1);
                }
            }
            let mut written = 0usize;
            for &(p, n) in &sink.pieces[..sink.n] {
                let mut off = 0;
                if header_left > 0 {
                    // The header is written once the chain count is known.
                    let k = header_left.min(n);
                    header[header_pieces] = (p, k);
                    header_pieces += 1;
                    header_left -= k;
                    off = k;
                }
                // SAFETY: `p+off..p+n` is a live guest mapping resolved by
                // `Sink::load`; the reader writes at most `n - off` bytes.
                off += unsafe { reader.copy_to(p.add(off), n - off) };
                written += off;
                if header_left == 0 && reader.remaining() == 0 {
                    break;
                }
            }
            used[chains] = (head, written as u32);
            chains += 1;
        }
        let mut bytes = header_bytes(chains as u16);
        if !frame.offload.is_none() {
            bytes[..VNET_HDR_LEN].copy_from_slice(&frame.offload.to_vnet_for(*caps));
        }
        if header_pieces == 1 {
            // SAFETY: the one piece is a live, writable guest range of
            // HEADER_LEN bytes resolved by `Sink::load` for this frame.
            unsafe { write_unless_equal(header[0].0, &bytes) };
        } else {
            let mut rest = &bytes[..];
            for &(p, k) in &header[..header_pieces] {
                // SAFETY: as above, for a piece of `k` bytes.
                unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), p, k) };
                rest = &rest[k..];
            }
        }
        vq.queue.set_next_avail(next);
        Ok(chains)
    }
}

/// Writes the virtio-net header at `p` unless it is already there.
///
/// The driver reads each header it is handed, so the line holding it sits
/// in the driver's cache; a store takes it away (a cross-core miss a frame,
/// most of a small frame's cost), while a load of a header that is already
/// right (zeroes and `num_buffers`, as last time this buffer went round)
/// leaves it shared. DPDK's vhost library does the same
/// (`ASSIGN_UNLESS_EQUAL`).
///
/// # Safety
/// `p..p+HEADER_LEN` must be a live guest mapping writable by the device.
#[inline]
unsafe fn write_unless_equal(p: *mut u8, bytes: &[u8; HEADER_LEN]) {
    const _: () = assert!(HEADER_LEN == 12);
    let same = if p as usize % 4 == 0 {
        // The usual case (DPDK and Linux place it 4-aligned): three
        // aligned loads instead of twelve byte loads.
        let w = p as *const u32;
        let word = |i: usize| u32::from_ne_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
        // SAFETY: per the caller, 12 bytes at `p`, here 4-aligned;
        // volatile, as the driver's memory may change under us.
        unsafe {
            std::ptr::read_volatile(w) == word(0)
                && std::ptr::read_volatile(w.add(1)) == word(1)
                && std::ptr::read_volatile(w.add(2)) == word(2)
        }
    } else {
        // SAFETY: per the caller; a byte-aligned volatile read.
        unsafe { std::ptr::read_volatile(p as *const [u8; HEADER_LEN]) == *bytes }
    };
    if !same {
        // SAFETY: per the caller.
        unsafe { std::ptr::write_volatile(p as *mut [u8; HEADER_LEN], *bytes) };
    }
}

impl VirtioTx {
    /// The first chain's first buffer holds the whole frame of one segment
    /// and its header: written without a [`FrameReader`]. Returns the bytes
    /// written, or `None` to take the general path.
    #[inline]
    fn fill_one(sink: &Sink, frame: &TxFrame<'_>) -> Option<usize> {
        let seg = frame.single()?;
        let &(p, cap) = sink.pieces[..sink.n].first()?;
        let len = HEADER_LEN + seg.len() as usize;
        if cap < len {
            return None;
        }
        // SAFETY: `p..p+cap` is a live, device-writable guest range resolved
        // by `Sink::load`, and HEADER_LEN + seg.len <= cap.
        unsafe { put_single(p, seg) };
        Some(len)
    }
}

/// Writes the virtio-net header of a one-buffer frame at `p`, and `seg`
/// after it.
///
/// # Safety
/// `p..p+HEADER_LEN+seg.len` must be a live guest range the device may
/// write. The segment was checked against its own port's mapping when it
/// was received; the switch never sends a frame out of the port it came in
/// on, and every port maps its peer's memory itself, so the two ranges are
/// disjoint (as `FrameReader::copy_to` requires too).
#[inline]
unsafe fn put_single(p: *mut u8, seg: Segment) {
    // SAFETY: per the caller.
    unsafe {
        write_unless_equal(p, &header_bytes(1));
        crate::queue::copy_frame(seg.ptr(), p.add(HEADER_LEN), seg.len() as usize);
    }
}

// SAFETY: the raw pointers in `sink` and `header` are scratch space, valid
// only within one `fill` call and never dereferenced after it returns; the
// memory they point into is owned through `vq.mem`, which is `Send`.
unsafe impl Send for VirtioTx {}

impl TxQueue for VirtioTx {
    /// Inlined into this queue's `tx_burst` loop, for the frames that
    /// loop does not write itself.
    #[inline(always)]
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        let got = self.fill(frame);
        let chains = tx_unless_truncated(got, || self.vq.memory_gone())?;
        for i in 0..chains {
            let (head, len) = self.used[i];
            self.vq.write_used(head, len);
        }
        self.added += 1;
        Ok(())
    }

    /// A one-segment, unchanged frame into a chain of one writable buffer
    /// that holds it, with a chain known to be there, is written and its
    /// used element recorded in the burst loop itself; any other frame
    /// goes through [`VirtioTx::tx`], which re-reads the avail index and
    /// reports errors.
    fn tx_burst(&mut self, frames: &[TxFrame<'_>]) -> TxOutcome {
        tx_each(frames, |frame| {
            let next = self.vq.queue.next_avail();
            if next != self.avail && frame.offload.is_none() {
                if let Some((head, len)) =
                    frame.single().and_then(|seg| self.fill_single(next, seg))
                {
                    self.vq.write_used(head, len);
                    self.added += 1;
                    return Ok(());
                }
            }
            self.tx(frame)
        })
    }

    fn offloads(&self) -> OffloadCaps {
        self.caps
    }

    fn flush(&mut self) {
        if self.added > 0 {
            self.added = 0;
            self.vq.notify_driver();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::testing::mixed_burst;
    use vm_memory::{Bytes, GuestAddress};

    const SIZE: u16 = 16;
    const DESC: u64 = 0x0;
    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;
    const BUFS: u64 = 0x4000;
    const MEM: usize = 0x10000;
    const F_NEXT: u16 = 1;
    const F_WRITE: u16 = 2;
    const F_INDIRECT: u16 = 4;

    struct Ring {
        mem: Arc<GuestMemoryMmap>,
        avail: u16,
    }

    impl Ring {
        fn new() -> Ring {
            let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
            Ring {
                mem: Arc::new(mem),
                avail: 0,
            }
        }

        fn desc(&self, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
            let mut b = [0u8; 16];
            b[0..8].copy_from_slice(&addr.to_le_bytes());
            b[8..12].copy_from_slice(&len.to_le_bytes());
            b[12..14].copy_from_slice(&flags.to_le_bytes());
            b[14..16].copy_from_slice(&next.to_le_bytes());
            self.mem
                .write_slice(&b, GuestAddress(table + 16 * u64::from(i)))
                .unwrap();
        }

        /// Publishes the chain starting at descriptor `head`.
        fn publish(&mut self, head: u16) {
            let slot = u64::from(self.avail % SIZE);
            self.mem
                .write_obj(head, GuestAddress(AVAIL + 4 + 2 * slot))
                .unwrap();
            self.avail = self.avail.wrapping_add(1);
            self.mem
                .write_obj(self.avail, GuestAddress(AVAIL + 2))
                .unwrap();
        }

        fn used_idx(&self) -> u16 {
            self.mem.read_obj(GuestAddress(USED + 2)).unwrap()
        }

        fn used_len(&self, slot: u64) -> u32 {
            self.mem
                .read_obj(GuestAddress(USED + 4 + 8 * slot + 4))
                .unwrap()
        }

        fn used_id(&self, slot: u64) -> u32 {
            self.mem
                .read_obj(GuestAddress(USED + 4 + 8 * slot))
                .unwrap()
        }

        fn vq(&self) -> Vq {
            Vq::with_rings(self.mem.clone(), SIZE, DESC, AVAIL, USED).unwrap()
        }
    }

    fn rx_once(q: &mut VirtioRx) -> (Vec<Vec<u8>>, u32) {
        let mut burst = RxBurst::default();
        q.rx_burst(&mut burst).unwrap();
        let frames = burst
            .frames()
            .iter()
            .map(|f| {
                let mut v = vec![0u8; f.len as usize];
                f.read_prefix(&mut v);
                v
            })
            .collect();
        q.release();
        (frames, burst.dropped)
    }

    #[test]
    fn receive_strips_the_header_across_descriptors() {
        let mut r = Ring::new();
        let payload: Vec<u8> = (0..64).collect();
        r.mem
            .write_slice(&payload, GuestAddress(BUFS + 12))
            .unwrap();
        // Header and data in one buffer.
        r.desc(DESC, 0, BUFS, 12 + 64, 0, 0);
        r.publish(0);
        // Header alone, then data in two pieces.
        r.mem
            .write_slice(&payload, GuestAddress(BUFS + 0x100))
            .unwrap();
        r.desc(DESC, 1, BUFS + 0x200, 12, F_NEXT, 2);
        r.desc(DESC, 2, BUFS + 0x100, 30, F_NEXT, 3);
        r.desc(DESC, 3, BUFS + 0x100 + 30, 34, 0, 0);
        r.publish(1);
        let mut q = VirtioRx::new(r.vq(), false);
        let (frames, dropped) = rx_once(&mut q);
        assert_eq!(dropped, 0);
        assert_eq!(frames, vec![payload.clone(), payload]);
        assert_eq!(r.used_idx(), 2, "both chains returned");
    }

    #[test]
    fn indirect_chains_are_followed() {
        // An aligned table (descriptors read as words) and one at an odd
        // address (read byte by byte): the same chain either way.
        for table in [BUFS + 0x800, BUFS + 0x903] {
            let mut r = Ring::new();
            r.desc(table, 0, BUFS, 12, F_NEXT, 1);
            r.desc(table, 1, BUFS + 12, 50, 0, 0);
            r.desc(DESC, 0, table, 32, F_INDIRECT, 0);
            r.publish(0);
            let mut q = VirtioRx::new(r.vq(), false);
            let (frames, _) = rx_once(&mut q);
            assert_eq!(frames[0].len(), 50, "table at {table:#x}");
        }
    }

    #[test]
    fn every_hostile_transmit_chain_is_a_fault_naming_it() {
        let table = BUFS + 0x800;
        type Bend<'a> = &'a dyn Fn(&Ring);
        let cases: [(Bend, &str); 8] = [
            (
                &|r| r.desc(DESC, 0, 0xffff_0000, 100, 0, 0),
                "outside guest memory",
            ),
            // Length running past the end of memory (u32 near max).
            (
                &|r| r.desc(DESC, 0, BUFS, u32::MAX - 8, 0, 0),
                "outside guest memory",
            ),
            // A loop: 0 -> 1 -> 0.
            (
                &|r| {
                    r.desc(DESC, 0, BUFS, 12, F_NEXT, 1);
                    r.desc(DESC, 1, BUFS, 64, F_NEXT, 0);
                },
                "a loop",
            ),
            (
                &|r| r.desc(DESC, 0, BUFS, 12, F_NEXT, 999),
                "past the table",
            ),
            (
                &|r| r.desc(DESC, 0, BUFS, 76, F_WRITE, 0),
                "device-writable",
            ),
            (
                &|r| r.desc(DESC, 0, BUFS, 8, 0, 0),
                "shorter than the virtio-net header",
            ),
            // Nested indirect table.
            (
                &|r| {
                    r.desc(table, 0, table, 16, F_INDIRECT, 0);
                    r.desc(DESC, 0, table, 16, F_INDIRECT, 0);
                },
                "nested indirect",
            ),
            // Zero-length indirect table.
            (
                &|r| r.desc(DESC, 0, table, 0, F_INDIRECT, 0),
                "malformed indirect",
            ),
        ];
        for (i, (bend, why)) in cases.iter().enumerate() {
            let mut r = Ring::new();
            // One good frame first: it is forwarded before the bad chain.
            r.desc(DESC, 5, BUFS, 12 + 60, 0, 0);
            r.publish(5);
            bend(&r);
            r.publish(0);
            let mut q = VirtioRx::new(r.vq(), false);
            let mut burst = RxBurst::default();
            let e = q.rx_burst(&mut burst).expect_err("a fault");
            assert!(
                e.to_string().contains("descriptor 0") && e.to_string().contains(why),
                "case {i}: {e}"
            );
        }
    }

    #[test]
    fn a_head_index_past_the_table_is_a_fault() {
        let mut r = Ring::new();
        r.publish(200);
        let mut q = VirtioRx::new(r.vq(), false);
        let mut burst = RxBurst::default();
        assert!(q.rx_burst(&mut burst).is_err());
    }

    #[test]
    fn an_avail_index_beyond_the_ring_is_a_fault() {
        let r = Ring::new();
        r.mem.write_obj(SIZE + 1, GuestAddress(AVAIL + 2)).unwrap();
        let mut q = VirtioRx::new(r.vq(), false);
        let mut burst = RxBurst::default();
        assert!(q.rx_burst(&mut burst).is_err());
    }

    #[test]
    fn transmit_merges_buffers_and_sets_num_buffers() {
        let mut r = Ring::new();
        for i in 0..3u16 {
            r.desc(DESC, i, BUFS + 0x100 * u64::from(i), 64, F_WRITE, 0);
            r.publish(i);
        }
        let data: Vec<u8> = (0..150u8).collect();
        let f = RxFrame::of(&[&data]);
        let mut q = VirtioTx::new(r.vq(), true, OffloadCaps::NONE);
        q.tx(&TxFrame::plain(&f)).unwrap();
        q.flush();
        assert_eq!(r.used_idx(), 3);
        assert_eq!(
            (r.used_len(0), r.used_len(1), r.used_len(2)),
            (64, 64, 12 + 150 - 128)
        );
        let mut got = [0u8; 64 * 3];
        for i in 0..3u64 {
            r.mem
                .read_slice(
                    &mut got[64 * i as usize..64 * (i as usize + 1)],
                    GuestAddress(BUFS + 0x100 * i),
                )
                .unwrap();
        }
        assert_eq!(&got[..12], &header_bytes(3));
        assert_eq!(&got[12..12 + 150], &data[..]);
    }

    /// VIRTIO_F_IN_ORDER is offered: chains come back in the order they
    /// were made available, whatever their descriptor numbers, on both
    /// queues (a frame dropped for its length included).
    #[test]
    fn chains_are_used_in_the_order_they_were_made_available() {
        let order = [3u16, 0, 2, 1];
        let mut r = Ring::new();
        for &i in &order {
            let len = if i == 2 { 12 } else { 12 + 60 };
            r.desc(DESC, i, BUFS + 0x100 * u64::from(i), len, 0, 0);
            r.publish(i);
        }
        let mut q = VirtioRx::new(r.vq(), false);
        let (frames, _) = rx_once(&mut q);
        assert_eq!(frames.len(), 4);
        let ids: Vec<u32> = (0..4).map(|s| r.used_id(s)).collect();
        assert_eq!(ids, order.map(u32::from));

        let mut r = Ring::new();
        for &i in &order {
            r.desc(DESC, i, BUFS + 0x100 * u64::from(i), 64, F_WRITE, 0);
            r.publish(i);
        }
        let mut q = VirtioTx::new(r.vq(), true, OffloadCaps::NONE);
        let data = [5u8; 100];
        q.tx(&TxFrame::plain(&RxFrame::of(&[&data]))).unwrap(); // two chains
        q.tx(&TxFrame::plain(&RxFrame::of(&[&data[..20]]))).unwrap();
        q.tx(&TxFrame::plain(&RxFrame::of(&[&data[..30]]))).unwrap();
        q.flush();
        let ids: Vec<u32> = (0..4).map(|s| r.used_id(s)).collect();
        assert_eq!(ids, order.map(u32::from));
    }

    /// A burst: one-buffer frames written in place, a frame needing two
    /// chains and a rewritten one through the general path, in order; the
    /// ring running out, then a buffer outside memory, stop it.
    #[test]
    fn a_transmit_burst_takes_each_frame_the_way_it_needs() {
        let mut r = Ring::new();
        for i in 0..4u16 {
            r.desc(DESC, i, BUFS + 0x100 * u64::from(i), 12 + 64, F_WRITE, 0);
            r.publish(i);
        }
        let mut q = VirtioTx::new(r.vq(), true, OffloadCaps::NONE);
        let short: Vec<u8> = (0..60u8).collect();
        let long = [9u8; 100];
        let (a, b) = (RxFrame::of(&[&short]), RxFrame::of(&[&long]));
        let tag = [0xeeu8; 16];
        let frames = mixed_burst(&a, &b, &tag);
        let out = q.tx_burst(&frames);
        assert_eq!((out.sent, out.tried), (0b0111, 3));
        assert!(matches!(out.stop, Some(TxError::Full)));
        q.flush();
        assert_eq!(r.used_idx(), 4);
        let lens: Vec<u32> = (0..4).map(|s| r.used_len(s)).collect();
        assert_eq!(lens, [12 + 60, 12 + 64, 100 - 64, 12 + 64]);
        let read = |i: u64, n: usize| {
            let mut v = vec![0u8; n];
            r.mem
                .read_slice(&mut v, GuestAddress(BUFS + 0x100 * i))
                .unwrap();
            v
        };
        assert_eq!(read(0, 12 + 60)[12..], short);
        assert_eq!(&read(1, 12)[..], &header_bytes(2));
        assert_eq!(read(3, 12 + 16)[12..], tag);
        assert_eq!(read(3, 12 + 64)[12 + 16..], short[12..]);
        // A buffer outside guest memory: a fault, nothing written.
        r.desc(DESC, 4, MEM as u64 - 10, 12 + 64, F_WRITE, 0);
        r.publish(4);
        let out = q.tx_burst(&frames[..1]);
        assert_eq!(out.sent, 0);
        assert!(matches!(out.stop, Some(TxError::Fault(_))));
    }

    #[test]
    fn transmit_without_room_or_mergeable_buffers_takes_nothing() {
        let mut r = Ring::new();
        let data = [7u8; 100];
        let f = RxFrame::of(&[&data]);
        let mut q = VirtioTx::new(r.vq(), false, OffloadCaps::NONE);
        assert_eq!(q.tx(&TxFrame::plain(&f)), Err(TxError::Full));
        r.desc(DESC, 0, BUFS, 64, F_WRITE, 0);
        r.publish(0);
        // Too long for one buffer and no merging: refused, buffer kept.
        assert_eq!(q.tx(&TxFrame::plain(&f)), Err(TxError::TooLong));
        let small = RxFrame::of(&[&data[..40]]);
        q.tx(&TxFrame::plain(&small)).unwrap();
        // Published once per burst, at flush.
        assert_eq!(r.used_idx(), 0);
        q.flush();
        assert_eq!(r.used_idx(), 1);
        assert_eq!(r.used_len(0), 52);
    }

    #[test]
    fn event_idx_signals_once_the_driver_event_is_passed() {
        // Entries 10..13 added since the last signal.
        assert!(need_event(10, 13, 10));
        assert!(need_event(12, 13, 10));
        assert!(!need_event(13, 13, 10));
        assert!(!need_event(9, 13, 10));
        // Across the u16 wrap.
        assert!(need_event(u16::MAX, 2, 65534));
        assert!(!need_event(2, 2, 65534));
    }

    #[test]
    fn a_receive_buffer_outside_memory_is_a_fault() {
        let mut r = Ring::new();
        r.desc(DESC, 0, MEM as u64 - 10, 64, F_WRITE, 0);
        r.publish(0);
        let data = [1u8; 60];
        let f = RxFrame::of(&[&data]);
        let mut q = VirtioTx::new(r.vq(), true, OffloadCaps::NONE);
        assert!(matches!(q.tx(&TxFrame::plain(&f)), Err(TxError::Fault(_))));
        assert_eq!(r.used_idx(), 0);
    }

    #[test]
    fn dropping_a_queue_records_its_position() {
        let mut r = Ring::new();
        r.desc(DESC, 0, BUFS, 12 + 60, 0, 0);
        r.publish(0);
        let vq = r.vq();
        let progress = vq.progress();
        let mut q = VirtioRx::new(vq, false);
        rx_once(&mut q);
        drop(q);
        assert_eq!(progress.load(), (1, 1));
    }
}
