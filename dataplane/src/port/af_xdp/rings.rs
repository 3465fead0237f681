//! The XSK rings as the workers use them: a socket's fill and rx rings
//! behind a receive queue, its tx and completion rings behind a transmit
//! queue.

use super::*;
use crate::queue::QueuePosition;

/// `struct xsk_ring_prod` / `struct xsk_ring_cons` of `<xdp/xsk.h>`.
///
/// libxdp keeps a pointer to the rings it filled in (to unmap them at
/// delete), so those stay where they were made, in [`Xsk`]; the queues
/// work on copies (the pointers never change, only the cached indices,
/// which are the queue's own).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct XskRing {
    pub(super) cached_prod: u32,
    pub(super) cached_cons: u32,
    pub(super) mask: u32,
    pub(super) size: u32,
    pub(super) producer: *mut u32,
    pub(super) consumer: *mut u32,
    pub(super) ring: *mut libc::c_void,
    pub(super) flags: *mut u32,
}

// SAFETY: the pointers lead into the socket's ring mappings, which the
// queue holding the copy keeps alive (through its `Arc<Xsk>`); each ring is
// used by one queue, on one thread at a time.
unsafe impl Send for XskRing {}

impl XskRing {
    pub(super) fn empty() -> XskRing {
        XskRing {
            cached_prod: 0,
            cached_cons: 0,
            mask: 0,
            size: 0,
            producer: std::ptr::null_mut(),
            consumer: std::ptr::null_mut(),
            ring: std::ptr::null_mut(),
            flags: std::ptr::null_mut(),
        }
    }

    pub(super) fn producer(&self) -> &AtomicU32 {
        // SAFETY: libxdp set `producer` to the ring's producer index in the
        // socket's ring mapping, which lives as long as the socket; the
        // kernel and we only access it atomically.
        unsafe { &*(self.producer as *const AtomicU32) }
    }

    pub(super) fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*(self.consumer as *const AtomicU32) }
    }

    pub(super) fn needs_wakeup(&self) -> bool {
        // SAFETY: `flags` points at the ring's flags word (as `producer`).
        let flags = unsafe { (*(self.flags as *const AtomicU32)).load(Ordering::Relaxed) };
        flags & XDP_RING_NEED_WAKEUP != 0
    }

    /// Slot `i` (masked) of a ring of `T`.
    pub(super) fn at<T>(&self, i: u32) -> *mut T {
        // SAFETY: `i & mask < size` entries of `T` lie at `ring`.
        unsafe { (self.ring as *mut T).add((i & self.mask) as usize) }
    }
}

/// `struct xdp_desc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct XdpDesc {
    pub(super) addr: u64,
    pub(super) len: u32,
    pub(super) options: u32,
}

/// The receive side of one socket: its fill and rx rings.
pub(super) struct XdpRx {
    pub(super) xsk: Arc<Xsk>,
    pub(super) fill: XskRing,
    pub(super) rx: XskRing,
    /// Frames of the burst being read, given back to the fill ring at
    /// release.
    pub(super) taken: Vec<u64>,
    /// The rx ring's consumer index as last given to the kernel.
    pub(super) released: u32,
    /// The interface may hand over frames with their checksum left to
    /// finish (a veth whose peer offloads it): each TCP or UDP frame is
    /// looked at ([`Offload::partial_in`]), and a frame longer than the
    /// MTU is a TCP super-frame to cut ([`Offload::super_frame_in`]).
    pub(super) partial_checksums: bool,
    /// The interface's MTU.
    pub(super) mtu: Arc<AtomicU32>,
}

impl XdpRx {
    /// Gives frames to the kernel's fill ring.
    pub(super) fn refill(&mut self, frames: impl Iterator<Item = u64>) {
        let mut prod = self.fill.cached_prod;
        for addr in frames {
            // SAFETY: the fill ring has room (it holds RING entries and at
            // most FRAMES / 2 <= RING frames are ever ours to give).
            unsafe { *self.fill.at::<u64>(prod) = addr };
            prod = prod.wrapping_add(1);
        }
        self.fill.cached_prod = prod;
        self.fill.producer().store(prod, Ordering::Release);
        if self.fill.needs_wakeup() {
            // SAFETY: no buffer: a wake-up of the kernel's receive side.
            unsafe {
                libc::recvfrom(
                    self.xsk.fd,
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
    }
}

impl RxQueue for XdpRx {
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault> {
        let cons = self.rx.cached_cons;
        let avail = self
            .rx
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(cons);
        let desc = |k: u32| -> XdpDesc {
            // SAFETY: entries `cons..cons+avail` are the kernel's,
            // published; `k < avail`.
            unsafe { *self.rx.at::<XdpDesc>(cons.wrapping_add(k)) }
        };
        let mut k = 0;
        while k < avail && !burst.is_full() {
            // A frame's descriptors: each but its last says more follow
            // (`XDP_PKT_CONTD`, a socket bound with `XDP_USE_SG`). The
            // kernel publishes them together; a frame not yet whole is
            // left for the next burst.
            let Some(n) = (k..avail)
                .position(|j| desc(j).options & XDP_PKT_CONTD == 0)
                .map(|i| i as u32 + 1)
            else {
                break;
            };
            let slot = burst.next_slot();
            let mut whole = true;
            for j in k..k + n {
                let d = desc(j);
                // Only frames of the receive half go back to the fill ring.
                let base = d.addr & !(FRAME - 1);
                if base < FRAME * FRAMES / 2 {
                    self.taken.push(base);
                }
                // The kernel wrote these; check them all the same, in u64.
                let inside = d
                    .addr
                    .checked_add(u64::from(d.len))
                    .is_some_and(|e| e <= FRAME * FRAMES)
                    && (d.addr % FRAME) + u64::from(d.len) <= FRAME;
                // SAFETY: `addr + len` lies in one frame of the UMEM area,
                // ours until the frame goes back to the fill ring at
                // release.
                whole = whole
                    && inside
                    && unsafe { slot.push(self.xsk.area().add(d.addr as usize), d.len) };
            }
            k += n;
            let len = slot.len as usize;
            if !whole || len < ETH_HEADER_LEN {
                // More buffers than a frame holds, or not a frame.
                if n > 1 {
                    burst.dropped += 1;
                }
                continue;
            }
            if self.partial_checksums {
                // The checksum the sender left, and a super-frame's cut:
                // its segments as the interface's MTU takes them.
                let mut head = [0u8; MAX_HDR];
                let h = slot.read_prefix(&mut head);
                let max_frame = self.mtu.load(Ordering::Relaxed) as usize + ETH_HEADER_LEN;
                if let Some(o) = Offload::inferred(&head[..h], len, max_frame) {
                    slot.offload = o;
                }
            }
            burst.commit();
        }
        self.rx.cached_cons = cons.wrapping_add(k);
        Ok(burst.len())
    }

    fn release(&mut self) {
        if self.rx.cached_cons != self.released {
            self.released = self.rx.cached_cons;
            self.rx.consumer().store(self.released, Ordering::Release);
        }
        if self.taken.is_empty() {
            return;
        }
        let frames = std::mem::take(&mut self.taken);
        self.refill(frames.iter().copied());
        self.taken = frames;
        self.taken.clear();
    }

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the socket's fd is open while `xsk` (held by this queue)
        // is alive.
        Some(unsafe { BorrowedFd::borrow_raw(self.xsk.fd) })
    }

    fn interrupt_is_eventfd(&self) -> bool {
        false
    }

    fn set_interrupt(&mut self, _: bool) {}

    fn has_pending(&self) -> bool {
        self.rx.producer().load(Ordering::Acquire) != self.rx.cached_cons
    }

    /// Where the fill and rx rings stand (every frame read was released:
    /// the receive half is all the kernel's).
    fn position(&self) -> Option<QueuePosition> {
        Some(QueuePosition::new(RxPosition {
            fill_prod: self.fill.cached_prod,
            rx_cons: self.rx.cached_cons,
        }))
    }
}

/// Where a receive queue stands between bursts.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RxPosition {
    pub(super) fill_prod: u32,
    pub(super) rx_cons: u32,
}

/// Where a transmit queue stands between bursts: its rings, and the
/// frames of the transmit half not in flight.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TxPosition {
    pub(super) tx_prod: u32,
    pub(super) comp_cons: u32,
    pub(super) pool: Vec<u64>,
}

impl XdpRx {
    /// The receive side of socket `xsk` over its `fill` and `rx` rings, as
    /// they stand at `at` (the kernel holds every frame of the receive
    /// half).
    pub(super) fn resume(
        xsk: Arc<Xsk>,
        mut fill: XskRing,
        mut rx: XskRing,
        at: &RxPosition,
        partial_checksums: bool,
        mtu: Arc<AtomicU32>,
    ) -> XdpRx {
        fill.cached_prod = at.fill_prod;
        rx.cached_cons = at.rx_cons;
        XdpRx {
            xsk,
            fill,
            rx,
            taken: Vec::with_capacity(BURST_SIZE * MAX_SEGS),
            released: at.rx_cons,
            partial_checksums,
            mtu,
        }
    }
}

impl XdpTx {
    /// The transmit side of socket `xsk` over its `tx` and `comp` rings, as
    /// they stand at `at`. Every pool frame must be a distinct frame of the
    /// transmit half (`Err` says which is not).
    pub(super) fn resume(
        xsk: Arc<Xsk>,
        mut tx: XskRing,
        mut comp: XskRing,
        at: TxPosition,
        mtu: Arc<AtomicU32>,
    ) -> Result<XdpTx, String> {
        let mut seen = vec![false; (FRAMES / 2) as usize];
        let half = FRAME * FRAMES / 2..FRAME * FRAMES;
        for &addr in &at.pool {
            let fresh = addr % FRAME == 0
                && half.contains(&addr)
                && !std::mem::replace(&mut seen[((addr - half.start) / FRAME) as usize], true);
            if !fresh {
                return Err(format!(
                    "transmit frame {addr:#x} is not a frame of the transmit half, or twice in the pool"
                ));
            }
        }
        tx.cached_prod = at.tx_prod;
        comp.cached_cons = at.comp_cons;
        Ok(XdpTx {
            xsk,
            tx,
            comp,
            pool: at.pool,
            queued: false,
            mtu,
        })
    }
}

/// The transmit side of one socket: its tx and completion rings, and the
/// pool of frames not in flight.
pub(super) struct XdpTx {
    pub(super) xsk: Arc<Xsk>,
    pub(super) tx: XskRing,
    pub(super) comp: XskRing,
    pub(super) pool: Vec<u64>,
    pub(super) queued: bool,
    pub(super) mtu: Arc<AtomicU32>,
}

impl XdpTx {
    /// Takes back the frames the kernel has sent.
    pub(super) fn reclaim(&mut self) {
        let cons = self.comp.cached_cons;
        let done = self
            .comp
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(cons);
        for k in 0..done {
            // SAFETY: published completion entries.
            let addr = unsafe { *self.comp.at::<u64>(cons.wrapping_add(k)) };
            // Only frames of our half go back (a bad address is dropped).
            if addr % FRAME == 0 && (FRAME * FRAMES / 2..FRAME * FRAMES).contains(&addr) {
                self.pool.push(addr);
            }
        }
        self.comp.cached_cons = cons.wrapping_add(done);
        self.comp
            .consumer()
            .store(self.comp.cached_cons, Ordering::Release);
    }
}

impl TxQueue for XdpTx {
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
        let len = frame.len();
        if exceeds_mtu(frame, self.mtu.load(Ordering::Relaxed)) || len as u64 > FRAME {
            return Err(TxError::TooLong);
        }
        if self.pool.is_empty() {
            self.reclaim();
        }
        let free = RING
            - self
                .tx
                .cached_prod
                .wrapping_sub(self.tx.consumer().load(Ordering::Acquire));
        let Some(addr) = self.pool.pop().filter(|_| free > 0) else {
            return Err(TxError::Full);
        };
        // SAFETY: `addr` is a pool frame of the UMEM area (ours until the
        // kernel completes it) and `len <= FRAME`; the padding stays in it
        // (FRAME holds far more than 60 bytes).
        let n = unsafe {
            let at = self.xsk.area().add(addr as usize);
            pad_short(at, frame.reader().copy_to(at, len))
        };
        // SAFETY: there is room in the tx ring (checked above).
        unsafe {
            *self.tx.at::<XdpDesc>(self.tx.cached_prod) = XdpDesc {
                addr,
                len: n as u32,
                options: 0,
            }
        };
        self.tx.cached_prod = self.tx.cached_prod.wrapping_add(1);
        self.queued = true;
        Ok(())
    }

    fn position(&self) -> Option<QueuePosition> {
        Some(QueuePosition::new(TxPosition {
            tx_prod: self.tx.cached_prod,
            comp_cons: self.comp.cached_cons,
            pool: self.pool.clone(),
        }))
    }

    fn flush(&mut self) {
        if !std::mem::take(&mut self.queued) {
            return;
        }
        self.tx
            .producer()
            .store(self.tx.cached_prod, Ordering::Release);
        // Copy mode needs a kick for every batch; zero-copy only when the
        // driver asks. In copy mode one kick sends at most the socket's
        // budget (32 frames by default) and says EAGAIN while more wait
        // (or while the completion ring is full): kick again until the
        // ring is empty, else the rest would wait for the next burst (a
        // super-frame cut in software is 45 frames).
        for _ in 0..=RING / 32 {
            let before = self.tx.consumer().load(Ordering::Acquire);
            // SAFETY: no buffer: the kernel sends what the tx ring holds.
            let r = unsafe {
                libc::sendto(
                    self.xsk.fd,
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            self.reclaim();
            let again = r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN);
            // Done, refused, or no progress (a driver's queue full): the
            // rest goes at the next kick.
            let now = self.tx.consumer().load(Ordering::Acquire);
            if !again || now == self.tx.cached_prod || now == before {
                break;
            }
        }
    }
}
