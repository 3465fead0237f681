//! State shared between the control thread and the workers.
//!
//! The control thread edits a [`DpTable`] under a mutex and bumps a generation
//! counter; each worker notices the new generation at the top of its loop
//! (one relaxed load) and rebuilds its private [`WorkerView`] from the table.
//! Workers therefore never lock on the hot path, and adding or removing a port
//! never stalls traffic on the others. Queues are reference counted, so shared
//! memory stays mapped until the last worker has let go of it.

use std::cell::UnsafeCell;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::observe::{Capture, Trace};
use crate::queue::{PortQueues, RxQueue, TxQueue};
use crate::reactor::Waker;
use crate::switch::mac_table::{Learned, MacEntry, MacTable, GENERATION_MASK};
use crate::switch::security::{PortSecurity, SecurityState, DEFAULT_MOVE_HOLD_SECS};
use crate::types::{
    BridgeCounters, BridgeId, Counters, DropReason, PortId, QueueCounters, WorkerCounters,
};
use crate::vlan::VlanMode;
use crate::wire::MacAddr;

/// How long taking a port's queues back waits for workers to leave a burst.
pub const DETACH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

pub use switchyard_api::PortTotals;

/// What the control thread and the workers share about one port.
pub struct PortShared {
    /// Port name.
    pub name: String,
    /// One counter block per worker, plus one for the control thread.
    counters: Box<[Counters]>,
    fault_flag: AtomicBool,
    fault: Mutex<Option<String>>,
    link_up: AtomicBool,
    /// Port security settings and the entries the port holds.
    pub security: SecurityState,
}

impl PortShared {
    fn new(name: &str, workers: usize, security: &PortSecurity) -> PortShared {
        PortShared {
            name: name.to_string(),
            counters: (0..=workers).map(|_| Counters::default()).collect(),
            fault_flag: AtomicBool::new(false),
            fault: Mutex::new(None),
            link_up: AtomicBool::new(false),
            security: SecurityState::new(security),
        }
    }

    /// The counter block of worker `w`.
    #[inline]
    pub fn counters(&self, w: usize) -> &Counters {
        &self.counters[w]
    }

    /// Sum over workers.
    pub fn totals(&self) -> PortTotals {
        let mut t = PortTotals::default();
        let mut drops = [0u64; DropReason::COUNT];
        for c in self.counters.iter() {
            t.rx_packets += c.rx_packets.load(Ordering::Relaxed);
            t.rx_bytes += c.rx_bytes.load(Ordering::Relaxed);
            t.tx_packets += c.tx_packets.load(Ordering::Relaxed);
            t.tx_bytes += c.tx_bytes.load(Ordering::Relaxed);
            for (d, a) in drops.iter_mut().zip(c.drops.iter()) {
                *d += a.load(Ordering::Relaxed);
            }
        }
        for r in DropReason::ALL {
            t.drops.insert(r, drops[r as usize]);
        }
        t
    }

    /// True while queues are attached.
    pub fn link_up(&self) -> bool {
        self.link_up.load(Ordering::Relaxed)
    }
}

/// A receive queue and its interrupt fd. The queue is reached only through
/// an [`RxClaim`], which one worker at a time holds.
pub struct RxSlot {
    queue: UnsafeCell<Box<dyn RxQueue>>,
    /// Whether an [`RxClaim`] on this slot exists.
    claimed: AtomicBool,
    /// The queue's interrupt eventfd, cached so sleeping needs no claim
    /// (read through [`RxSlot::irq_fd`]).
    irq_fd: Option<RawFd>,
    /// Whether the worker drains `irq_fd` when it wakes (an eventfd).
    pub irq_drain: bool,
    /// The queue's load, counted by the worker polling it.
    pub load: QueueCounters,
}

// SAFETY: the queue inside is only reached through an `RxClaim`, and at most
// one claim per slot exists at a time (`claimed`, set by a compare-exchange
// and cleared when the claim drops), so one thread at a time touches it;
// `RxQueue: Send`.
unsafe impl Sync for RxSlot {}

impl RxSlot {
    fn new(queue: Box<dyn RxQueue>) -> RxSlot {
        let irq_fd = queue.interrupt_fd().map(|fd| fd.as_raw_fd());
        let irq_drain = queue.interrupt_is_eventfd();
        RxSlot {
            queue: UnsafeCell::new(queue),
            claimed: AtomicBool::new(false),
            irq_fd,
            irq_drain,
            load: QueueCounters::default(),
        }
    }

    /// Takes the queue for the caller until the returned claim drops: None
    /// while another worker still holds it, which happens only in the
    /// instant a queue moves between workers (the old one lets go when it
    /// next rebuilds its view).
    pub fn claim(self: &Arc<Self>) -> Option<RxClaim> {
        self.claimed
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| RxClaim(self.clone()))
    }

    /// The queue's interrupt eventfd, without a claim.
    #[inline]
    pub fn irq_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the number was the queue's own fd when the slot was made;
        // the queue owns it (it closes it when dropped) and the slot owns
        // the queue, so it stays open for as long as `self` is borrowed.
        self.irq_fd.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) })
    }
}

/// A worker's hold on a receive queue, the one way to reach it. A worker
/// claims its queues when it builds its view and keeps them until the
/// next, so that a poll takes no lock: a locked instruction per poll would
/// also wait for every store of the last burst (into the peers' rings) to
/// reach their caches, and a one-frame round trip would pay it each time.
pub struct RxClaim(Arc<RxSlot>);

impl RxClaim {
    /// The claimed queue.
    #[inline]
    pub fn queue(&mut self) -> &mut dyn RxQueue {
        // SAFETY: this claim set `claimed` and clears it only when dropped,
        // so no other claim, and no other reference to the queue, exists
        // meanwhile; `&mut self` makes this borrow the only one through
        // this claim.
        unsafe { &mut **self.0.queue.get() }
    }
}

impl Drop for RxClaim {
    fn drop(&mut self) {
        // Release: the next claimant sees the queue as this one left it.
        self.0.claimed.store(false, Ordering::Release);
    }
}

/// A transmit queue that several workers may feed.
pub struct TxSlot {
    busy: AtomicBool,
    queue: UnsafeCell<Box<dyn TxQueue>>,
}

// SAFETY: the queue inside is only reached through `with`, which holds the
// `busy` flag, so at most one thread touches it at a time; `TxQueue: Send`.
unsafe impl Sync for TxSlot {}

impl TxSlot {
    fn new(q: Box<dyn TxQueue>) -> TxSlot {
        TxSlot {
            busy: AtomicBool::new(false),
            queue: UnsafeCell::new(q),
        }
    }

    /// Runs `f` with exclusive access to the queue. Uncontended when every
    /// worker has a queue of its own (the usual case).
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&mut dyn TxQueue) -> R) -> R {
        while self
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // Unlocks when dropped, a panic in `f` included: a worker that
        // panicked must not leave the queue locked for every other one.
        let _unlock = SlotGuard(&self.busy);
        // SAFETY: `busy` was false and we set it, so no other thread is inside
        // this block for this slot until the guard stores false.
        f(unsafe { &mut **self.queue.get() })
    }
}

/// Clears a [`TxSlot`]'s `busy` flag when dropped.
struct SlotGuard<'a>(&'a AtomicBool);

impl Drop for SlotGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A bridge's event counters, one block per worker plus one for the
/// control thread (aging).
pub struct BridgeStats {
    counters: Box<[BridgeCounters]>,
}

/// A bridge's counters summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BridgeTotals {
    /// MAC entries learned.
    pub learned: u64,
    /// MAC entries moved between ports.
    pub moved: u64,
    /// Entries evicted from full buckets.
    pub evicted: u64,
    /// Entries aged out.
    pub aged: u64,
    /// Frames flooded.
    pub flooded: u64,
}

impl BridgeStats {
    fn new(workers: usize) -> BridgeStats {
        BridgeStats {
            counters: (0..=workers).map(|_| BridgeCounters::default()).collect(),
        }
    }

    /// The counter block of worker `w` (the last is the control thread's).
    #[inline]
    pub fn counters(&self, w: usize) -> &BridgeCounters {
        &self.counters[w]
    }

    /// Sum over workers.
    pub fn totals(&self) -> BridgeTotals {
        let mut t = BridgeTotals::default();
        for c in self.counters.iter() {
            t.learned += c.learned.load(Ordering::Relaxed);
            t.moved += c.moved.load(Ordering::Relaxed);
            t.evicted += c.evicted.load(Ordering::Relaxed);
            t.aged += c.aged.load(Ordering::Relaxed);
            t.flooded += c.flooded.load(Ordering::Relaxed);
        }
        t
    }
}

struct DpPort {
    shared: Arc<PortShared>,
    generation: u16,
    bridge: Option<BridgeId>,
    vlan: VlanMode,
    rx: Vec<Arc<RxSlot>>,
    /// The worker polling each of `rx`.
    rx_worker: Vec<usize>,
    tx: Vec<Arc<TxSlot>>,
    capture: Option<Arc<Capture>>,
}

struct DpBridge {
    macs: Arc<MacTable>,
    stats: Arc<BridgeStats>,
    ports: Vec<PortId>,
}

#[derive(Default)]
struct DpTable {
    ports: Vec<Option<DpPort>>,
    bridges: Vec<Option<DpBridge>>,
    /// Generation per port slot, kept after removal so reuse is detectable.
    slot_gens: Vec<u16>,
    /// The running trace, if any.
    trace: Option<Arc<Trace>>,
}

impl DpTable {
    /// The port a MAC entry belongs to, if the slot still holds that port.
    fn owner(&self, e: &MacEntry) -> Option<&PortShared> {
        self.ports
            .get(e.port as usize)
            .and_then(Option::as_ref)
            .filter(|p| p.generation == e.port_gen)
            .map(|p| &*p.shared)
    }
}

/// A port as one worker sees it.
pub struct ViewPort {
    /// Slot generation (MAC entries carry it).
    pub generation: u16,
    /// Bridge, if the port is in one.
    pub bridge: Option<BridgeId>,
    /// The VLANs it carries.
    pub vlan: VlanMode,
    /// The first of `txs`, if connected: kept apart as one pointer for
    /// the link test made for every frame queued (testing the list's
    /// length there cost 7 instructions a frame in the code generated).
    pub tx: Option<Arc<TxSlot>>,
    /// All the transmit queues this worker uses (none while not
    /// connected): the port's queues `w`, `w + workers`, ... when it has
    /// more queues than there are workers (each worker's own), else the
    /// one queue `w % queues`, shared with other workers. See
    /// [`ViewPort::tx_for`].
    pub txs: Box<[Arc<TxSlot>]>,
    /// Counters and fault reporting.
    pub shared: Arc<PortShared>,
    /// The capture running on the port, if any.
    pub capture: Option<Arc<Capture>>,
}

impl ViewPort {
    /// The transmit queue for frames received on queue `rxq` of their
    /// port, if connected: one of this worker's queues of the port, by the
    /// receive queue's number. A port with as many queues as the port the
    /// frames came from takes them on the same queue number, as testpmd's
    /// io forwarding does, so that a multi-queue peer gets its frames back
    /// spread over its queues as it sent them (and never more on one queue
    /// than it put in flight there); the frames of one receive queue keep
    /// their order.
    #[inline]
    pub fn tx_for(&self, rxq: usize) -> Option<&TxSlot> {
        match self.txs.len() {
            0 | 1 => self.tx.as_deref(),
            n => Some(&self.txs[rxq % n]),
        }
    }
}

/// A bridge as one worker sees it.
pub struct ViewBridge {
    /// Learning table.
    pub macs: Arc<MacTable>,
    /// Event counters.
    pub stats: Arc<BridgeStats>,
    /// Member ports.
    pub ports: Vec<PortId>,
}

/// Where a burst was received: its port and the port's receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ingress {
    /// The port.
    pub port: PortId,
    /// The receive queue's number in the port; it picks the transmit
    /// queue on each destination ([`ViewPort::tx_for`]).
    pub queue: usize,
}

/// A receive queue assigned to a worker.
pub struct ViewRx {
    /// Owning port.
    pub port: PortId,
    /// The queue's number in its port.
    pub queue: usize,
    /// The queue.
    pub slot: Arc<RxSlot>,
}

impl ViewRx {
    /// Where this queue's bursts come from, for the forwarder.
    #[inline]
    pub fn ingress(&self) -> Ingress {
        Ingress {
            port: self.port,
            queue: self.queue,
        }
    }
}

/// Everything a worker needs, private to that worker.
#[derive(Default)]
pub struct WorkerView {
    /// Receive queues to poll.
    pub rx: Vec<ViewRx>,
    /// Ports by slot.
    pub ports: Vec<Option<ViewPort>>,
    /// Bridges by slot.
    pub bridges: Vec<Option<ViewBridge>>,
    /// The running trace, if any.
    pub trace: Option<Arc<Trace>>,
}

struct DpInner {
    generation: AtomicU64,
    table: Mutex<DpTable>,
    workers: usize,
    worker_wakers: Vec<Waker>,
    fault_waker: Waker,
    clock: AtomicU32,
    /// Seconds a MAC entry must be quiet before it moves to another port.
    move_hold: AtomicU32,
    epoch: Instant,
    stop: AtomicBool,
    /// Per worker: the table generation its view was last built from
    /// (`u64::MAX` while the worker is not running).
    acks: Box<[AtomicU64]>,
    /// Per worker: its load.
    load: Box<[WorkerCounters]>,
    /// Per worker: its recent busy share in permille, as the control
    /// thread last measured it (new queues go to the least busy).
    recent_load: Box<[AtomicU32]>,
}

/// Handle to the shared data-plane state (cheap to clone).
#[derive(Clone)]
pub struct Dataplane {
    inner: Arc<DpInner>,
}

impl Dataplane {
    /// State for `workers` worker threads.
    pub fn new(workers: usize) -> std::io::Result<Dataplane> {
        Ok(Dataplane {
            inner: Arc::new(DpInner {
                generation: AtomicU64::new(1),
                table: Mutex::new(DpTable::default()),
                workers,
                worker_wakers: (0..workers)
                    .map(|_| Waker::new())
                    .collect::<Result<_, _>>()?,
                fault_waker: Waker::new()?,
                clock: AtomicU32::new(0),
                move_hold: AtomicU32::new(DEFAULT_MOVE_HOLD_SECS),
                epoch: Instant::now(),
                stop: AtomicBool::new(false),
                acks: (0..workers).map(|_| AtomicU64::new(u64::MAX)).collect(),
                load: (0..workers).map(|_| WorkerCounters::default()).collect(),
                recent_load: (0..workers).map(|_| AtomicU32::new(0)).collect(),
            }),
        })
    }

    fn table(&self) -> MutexGuard<'_, DpTable> {
        self.inner.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.inner.workers
    }

    /// Worker `w`'s load counters.
    pub fn worker_load(&self, w: usize) -> &WorkerCounters {
        &self.inner.load[w]
    }

    /// Every connected receive queue: (its worker, port, queue number,
    /// slot), in port order.
    pub fn rx_queues(&self) -> Vec<(usize, PortId, usize, Arc<RxSlot>)> {
        let t = self.table();
        let mut v = Vec::new();
        for (i, p) in t.ports.iter().enumerate() {
            let Some(p) = p else { continue };
            for (q, (slot, &w)) in p.rx.iter().zip(&p.rx_worker).enumerate() {
                v.push((w, i as PortId, q, slot.clone()));
            }
        }
        v
    }

    /// Records worker `w`'s recent busy share (0.0..=1.0), measured by the
    /// control thread; queues attached later go to the least busy worker.
    pub fn set_recent_load(&self, w: usize, share: f64) {
        if let Some(l) = self.inner.recent_load.get(w) {
            l.store((share.clamp(0.0, 1.0) * 1000.0) as u32, Ordering::Relaxed);
        }
    }

    /// Moves receive queues between workers: each `(port, queue, slot,
    /// worker)` whose slot is still that port's queue goes to `worker`.
    /// Workers pick the change up at their next pass; a queue's frames wait
    /// in its ring meanwhile (the slot's claim keeps the two workers from
    /// polling it at once), so none is lost. Returns how many moved.
    pub fn move_queues(&self, moves: &[(PortId, usize, Arc<RxSlot>, usize)]) -> usize {
        let mut t = self.table();
        let mut n = 0;
        for (port, q, slot, to) in moves {
            if *to >= self.inner.workers {
                continue;
            }
            let Some(p) = t.ports.get_mut(*port as usize).and_then(Option::as_mut) else {
                continue;
            };
            if p.rx.get(*q).is_some_and(|s| Arc::ptr_eq(s, slot)) && p.rx_worker[*q] != *to {
                p.rx_worker[*q] = *to;
                n += 1;
            }
        }
        drop(t);
        if n > 0 {
            self.publish();
        }
        n
    }

    /// Current table generation.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    fn publish(&self) {
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        for w in &self.inner.worker_wakers {
            w.wake();
        }
    }

    /// Publishes what changed under `t` and waits until no worker runs on
    /// a view from before, so what was taken out of the table is no longer
    /// touched; false if a worker did not answer in time (see
    /// [`Dataplane::quiesce`]).
    fn publish_and_quiesce(&self, t: MutexGuard<'_, DpTable>) -> bool {
        drop(t);
        self.publish();
        self.quiesce(DETACH_TIMEOUT)
    }

    /// The wakeup fd of worker `w`.
    pub fn worker_waker(&self, w: usize) -> &Waker {
        &self.inner.worker_wakers[w]
    }

    /// The fd the control thread polls for worker fault reports.
    pub fn fault_waker(&self) -> &Waker {
        &self.inner.fault_waker
    }

    /// Switch clock in seconds (for MAC aging), updated by [`Dataplane::tick`].
    #[inline]
    pub fn now_secs(&self) -> u32 {
        self.inner.clock.load(Ordering::Relaxed)
    }

    /// Seconds a MAC entry must be quiet before it may move to another
    /// port (0: moves at once).
    #[inline]
    pub fn mac_move_hold(&self) -> u32 {
        self.inner.move_hold.load(Ordering::Relaxed)
    }

    /// Sets [`Dataplane::mac_move_hold`].
    pub fn set_mac_move_hold(&self, secs: u32) {
        self.inner.move_hold.store(secs, Ordering::Relaxed);
    }

    /// Advances the switch clock; called by the control thread.
    pub fn tick(&self) -> u32 {
        let s = self.inner.epoch.elapsed().as_secs() as u32;
        self.inner.clock.store(s, Ordering::Relaxed);
        s
    }

    /// Worker `w` has rebuilt its view from `generation` (0: starting,
    /// `u64::MAX`: exited). Everything the old view held is released.
    #[inline]
    pub fn ack_generation(&self, w: usize, generation: u64) {
        self.inner.acks[w].store(generation, Ordering::Release);
    }

    /// Waits until every running worker has dropped the views older than the
    /// current generation, so queues detached before this call are no longer
    /// touched by any worker. Returns false if a worker did not answer within
    /// `timeout` (it is then still inside one burst of the old view).
    pub fn quiesce(&self, timeout: std::time::Duration) -> bool {
        let target = self.generation();
        let deadline = Instant::now() + timeout;
        for (w, ack) in self.inner.acks.iter().enumerate() {
            loop {
                let seen = ack.load(Ordering::Acquire);
                if seen == u64::MAX || seen >= target || self.stopping() {
                    break;
                }
                if Instant::now() >= deadline {
                    return false;
                }
                self.inner.worker_wakers[w].wake();
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        true
    }

    /// Asks workers to exit.
    pub fn request_stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        self.publish();
    }

    /// True once [`Dataplane::request_stop`] was called.
    #[inline]
    pub fn stopping(&self) -> bool {
        self.inner.stop.load(Ordering::Acquire)
    }

    /// Adds a bridge with a MAC table of `mac_capacity` entries.
    pub fn add_bridge(&self, mac_capacity: usize) -> BridgeId {
        let mut t = self.table();
        let b = DpBridge {
            macs: Arc::new(MacTable::new(mac_capacity)),
            stats: Arc::new(BridgeStats::new(self.inner.workers)),
            ports: Vec::new(),
        };
        let id = match t.bridges.iter().position(Option::is_none) {
            Some(i) => {
                t.bridges[i] = Some(b);
                i
            }
            None => {
                t.bridges.push(Some(b));
                t.bridges.len() - 1
            }
        };
        drop(t);
        self.publish();
        id as BridgeId
    }

    /// Removes a bridge (its ports must have left it).
    pub fn remove_bridge(&self, id: BridgeId) {
        let mut t = self.table();
        if let Some(b) = t.bridges.get_mut(id as usize) {
            *b = None;
        }
        drop(t);
        self.publish();
    }

    /// The MAC table of a bridge.
    pub fn mac_table(&self, id: BridgeId) -> Option<Arc<MacTable>> {
        self.table()
            .bridges
            .get(id as usize)?
            .as_ref()
            .map(|b| b.macs.clone())
    }

    /// The event counters of a bridge.
    pub fn bridge_stats(&self, id: BridgeId) -> Option<Arc<BridgeStats>> {
        self.table()
            .bridges
            .get(id as usize)?
            .as_ref()
            .map(|b| b.stats.clone())
    }

    /// The name of the port in slot `id`, if any.
    pub fn port_name(&self, id: PortId) -> Option<String> {
        self.table()
            .ports
            .get(id as usize)?
            .as_ref()
            .map(|p| p.shared.name.clone())
    }

    /// Starts capture `cap` on its port. `Err(false)`: no such port;
    /// `Err(true)`: a capture runs on it already.
    pub fn start_capture(&self, cap: Arc<Capture>) -> Result<(), bool> {
        let mut t = self.table();
        let p = t
            .ports
            .get_mut(cap.port as usize)
            .and_then(Option::as_mut)
            .ok_or(false)?;
        if p.capture.is_some() {
            return Err(true);
        }
        p.capture = Some(cap);
        drop(t);
        self.publish();
        Ok(())
    }

    /// Ends capture `cap` (if still running) and waits until no worker
    /// writes to it any more.
    pub fn stop_capture(&self, cap: &Arc<Capture>) {
        let mut t = self.table();
        let Some(p) = t.ports.get_mut(cap.port as usize).and_then(Option::as_mut) else {
            return;
        };
        if !p.capture.as_ref().is_some_and(|c| Arc::ptr_eq(c, cap)) {
            return;
        }
        p.capture = None;
        self.publish_and_quiesce(t);
    }

    /// Starts trace `trace`; false if one runs already.
    pub fn start_trace(&self, trace: Arc<Trace>) -> bool {
        let mut t = self.table();
        if t.trace.is_some() {
            return false;
        }
        t.trace = Some(trace);
        drop(t);
        self.publish();
        true
    }

    /// Ends trace `trace` (if still running) and waits until no worker
    /// writes to it any more.
    pub fn stop_trace(&self, trace: &Arc<Trace>) {
        let mut t = self.table();
        if !t.trace.as_ref().is_some_and(|x| Arc::ptr_eq(x, trace)) {
            return;
        }
        t.trace = None;
        self.publish_and_quiesce(t);
    }

    /// Adds a port (no queues until it connects).
    pub fn add_port(
        &self,
        name: &str,
        bridge: Option<BridgeId>,
        vlan: VlanMode,
        security: &PortSecurity,
    ) -> (PortId, Arc<PortShared>) {
        let shared = Arc::new(PortShared::new(name, self.inner.workers, security));
        let mut t = self.table();
        let id = match t.ports.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                t.ports.push(None);
                t.slot_gens.push(0);
                t.ports.len() - 1
            }
        };
        t.slot_gens[id] = t.slot_gens[id].wrapping_add(1) & GENERATION_MASK;
        let generation = t.slot_gens[id];
        t.ports[id] = Some(DpPort {
            shared: shared.clone(),
            generation,
            bridge,
            vlan,
            rx: Vec::new(),
            rx_worker: Vec::new(),
            tx: Vec::new(),
            capture: None,
        });
        if let Some(b) = bridge
            .and_then(|b| t.bridges.get_mut(b as usize))
            .and_then(Option::as_mut)
        {
            b.ports.push(id as PortId);
        }
        drop(t);
        self.publish();
        (id as PortId, shared)
    }

    /// Removes a port; its MAC entries are flushed.
    pub fn remove_port(&self, id: PortId) {
        let mut t = self.table();
        let Some(p) = t.ports.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        let mut macs = None;
        if let Some(b) = p
            .bridge
            .and_then(|b| t.bridges.get_mut(b as usize))
            .and_then(Option::as_mut)
        {
            b.ports.retain(|&x| x != id);
            macs = Some(b.macs.clone());
        }
        drop(t);
        self.publish();
        if let Some(m) = macs {
            m.flush_port(id, false);
        }
    }

    /// Pins `macs` to port `id` in its bridge, in the VLAN its untagged
    /// frames belong to (a trunk without untagged frames pins its MACs per
    /// VLAN as it sends from them). `Err` names a MAC pinned to another
    /// port (and that port's slot), or one whose table bucket is full of
    /// pinned entries.
    pub fn pin_macs(&self, id: PortId, macs: &[MacAddr]) -> Result<(), (MacAddr, Option<PortId>)> {
        let t = self.table();
        let Some(p) = t.ports.get(id as usize).and_then(Option::as_ref) else {
            return Ok(());
        };
        let (Some(domain), Some(table)) = (
            p.vlan.ingress(0),
            p.bridge
                .and_then(|b| t.bridges.get(b as usize))
                .and_then(Option::as_ref)
                .map(|b| b.macs.clone()),
        ) else {
            return Ok(());
        };
        let entry = MacEntry {
            port: id,
            port_gen: p.generation,
            last_seen: self.now_secs(),
            pinned: true,
        };
        for &mac in macs {
            match table.pin(mac, domain, entry) {
                Learned::New => p.shared.security.take(1),
                Learned::Moved(old) | Learned::Evicted(old) => {
                    p.shared.security.take(1);
                    if let Some(o) = t.owner(&old) {
                        o.security.release(1);
                    }
                }
                Learned::Refreshed | Learned::Unchanged => {}
                Learned::Pinned(old) => return Err((mac, Some(old.port))),
                Learned::Held(_) | Learned::Full => return Err((mac, None)),
            }
        }
        Ok(())
    }

    /// Removes unpinned MAC entries older than `max_age` seconds from every
    /// bridge, giving their ports' places back.
    pub fn age_macs(&self, now: u32, max_age: u32) {
        let tables: Vec<(Arc<MacTable>, Arc<BridgeStats>)> = self
            .table()
            .bridges
            .iter()
            .flatten()
            .map(|b| (b.macs.clone(), b.stats.clone()))
            .collect();
        for (m, stats) in tables {
            let mut gone: Vec<MacEntry> = Vec::new();
            m.age(now, max_age, |r| gone.push(r.entry));
            if !gone.is_empty() {
                // The control thread's own block.
                crate::types::bump(&stats.counters(self.inner.workers).aged, gone.len() as u64);
                let t = self.table();
                for e in &gone {
                    if let Some(o) = t.owner(e) {
                        o.security.release(1);
                    }
                }
            }
        }
    }

    /// Gives a connected port's queues to the workers.
    pub fn attach_queues(&self, id: PortId, q: PortQueues) {
        let mut t = self.table();
        // Each new queue goes to the least busy worker (load in 5% steps,
        // then fewest queues), so a port's queues spread out and a loaded
        // worker gets no more.
        let workers = self.inner.workers.max(1);
        let mut count = vec![0usize; workers];
        for p in t.ports.iter().flatten() {
            for &w in &p.rx_worker {
                count[w.min(workers - 1)] += 1;
            }
        }
        let load: Vec<u32> = (0..workers)
            .map(|w| {
                self.inner
                    .recent_load
                    .get(w)
                    .map_or(0, |l| l.load(Ordering::Relaxed) / 50)
            })
            .collect();
        let rx_worker: Vec<usize> = (0..q.rx.len())
            .map(|_| {
                let w = (0..workers)
                    .min_by_key(|&w| (load[w], count[w], w))
                    .unwrap_or(0);
                count[w] += 1;
                w
            })
            .collect();
        if let Some(p) = t.ports.get_mut(id as usize).and_then(Option::as_mut) {
            p.rx_worker = rx_worker;
            p.rx = q.rx.into_iter().map(|q| Arc::new(RxSlot::new(q))).collect();
            p.tx = q.tx.into_iter().map(|q| Arc::new(TxSlot::new(q))).collect();
            p.shared.link_up.store(true, Ordering::Relaxed);
        }
        drop(t);
        self.publish();
    }

    /// Takes a port's queues back (link down) and waits until no worker
    /// polls them any more (at most `DETACH_TIMEOUT`; false if one did not
    /// answer in time). Its MAC entries are flushed and a pending fault
    /// report is cleared: it was about the queues just taken back.
    pub fn detach_queues(&self, id: PortId) -> bool {
        let mut t = self.table();
        let mut macs = None;
        let mut shared = None;
        if let Some(p) = t.ports.get_mut(id as usize).and_then(Option::as_mut) {
            p.rx.clear();
            p.rx_worker.clear();
            p.tx.clear();
            p.shared.link_up.store(false, Ordering::Relaxed);
            shared = Some(p.shared.clone());
            if let Some(b) = p.bridge {
                macs = t
                    .bridges
                    .get(b as usize)
                    .and_then(Option::as_ref)
                    .map(|b| b.macs.clone());
            }
        }
        // Clearing the fault flag any earlier would let a worker still on
        // the old view report the same fault again: counted twice, and left
        // standing against the port's next connection.
        let quiet = self.publish_and_quiesce(t);
        if let Some(s) = &shared {
            *s.fault.lock().unwrap_or_else(|e| e.into_inner()) = None;
            s.fault_flag.store(false, Ordering::Release);
        }
        if let Some(m) = macs {
            // Learned entries go with the link; pinned ones stay, so no
            // other port takes the address while this one is down.
            let removed = m.flush_port(id, true);
            if let Some(s) = shared {
                s.security.release(removed as u32);
            }
        }
        quiet
    }

    /// Reports a protocol fault seen by a worker on port `id`. The worker stops
    /// polling the port; the control thread disconnects it.
    pub fn report_fault(&self, shared: &PortShared, reason: String) {
        if !shared.fault_flag.swap(true, Ordering::AcqRel) {
            *shared.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
            self.inner.fault_waker.wake();
        }
    }

    /// Ports with a pending fault report, with the reason (control thread).
    pub fn take_faults(&self) -> Vec<(PortId, String)> {
        self.inner.fault_waker.drain();
        let t = self.table();
        let mut out = Vec::new();
        for (i, p) in t.ports.iter().enumerate() {
            if let Some(p) = p {
                if p.shared.fault_flag.load(Ordering::Acquire) {
                    if let Some(r) = p
                        .shared
                        .fault
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take()
                    {
                        out.push((i as PortId, r));
                    }
                }
            }
        }
        out
    }

    /// True when worker code must skip port `shared` (fault pending).
    #[inline]
    pub fn faulted(shared: &PortShared) -> bool {
        shared.fault_flag.load(Ordering::Relaxed)
    }

    /// Builds worker `w`'s private view of the current table.
    pub fn build_view(&self, w: usize, view: &mut WorkerView) -> u64 {
        let t = self.table();
        let generation = self.generation();
        view.rx.clear();
        view.ports.clear();
        view.bridges.clear();
        let workers = self.inner.workers.max(1);
        for (i, p) in t.ports.iter().enumerate() {
            let Some(p) = p else {
                view.ports.push(None);
                continue;
            };
            for (queue, (slot, &qw)) in p.rx.iter().zip(&p.rx_worker).enumerate() {
                if qw == w {
                    view.rx.push(ViewRx {
                        port: i as PortId,
                        queue,
                        slot: slot.clone(),
                    });
                }
            }
            let txs: Box<[_]> = if p.tx.len() > workers {
                p.tx.iter().skip(w).step_by(workers).cloned().collect()
            } else if p.tx.is_empty() {
                Box::new([])
            } else {
                Box::new([p.tx[w % p.tx.len()].clone()])
            };
            view.ports.push(Some(ViewPort {
                generation: p.generation,
                bridge: p.bridge,
                vlan: p.vlan.clone(),
                tx: txs.first().cloned(),
                txs,
                shared: p.shared.clone(),
                capture: p.capture.clone(),
            }));
        }
        for b in t.bridges.iter() {
            view.bridges.push(b.as_ref().map(|b| ViewBridge {
                macs: b.macs.clone(),
                stats: b.stats.clone(),
                ports: b.ports.clone(),
            }));
        }
        view.trace = t.trace.clone();
        generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_a_transmit_slot_leaves_it_unlocked() {
        struct Nothing;
        impl TxQueue for Nothing {
            fn tx(&mut self, _: &crate::queue::TxFrame<'_>) -> Result<(), crate::queue::TxError> {
                Ok(())
            }
            fn flush(&mut self) {}
        }
        let slot = TxSlot::new(Box::new(Nothing));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            slot.with(|_| panic!("inside"));
        }));
        assert!(r.is_err());
        // Taken again at once (it would spin for ever if still locked).
        assert_eq!(slot.with(|_| 7), 7);
    }
}
