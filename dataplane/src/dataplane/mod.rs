//! State shared between the control thread and the workers.
//!
//! The control thread edits a [`DpTable`] under a mutex and bumps a generation
//! counter; each worker notices the new generation at the top of its loop
//! (one relaxed load) and rebuilds its private [`WorkerView`] from the table.
//! Workers therefore never lock on the hot path, and adding or removing a port
//! never stalls traffic on the others. Queues are reference counted, so shared
//! memory stays mapped until the last worker has let go of it.
//!
//! By job: this file holds the table and the registry of ports and bridges;
//! [`stats`] what the workers count, [`slots`] the queue slots they claim,
//! [`view`] the view they build; the rest of [`Dataplane`]'s methods are in
//! `queues.rs` (handing queues to workers and back, spreading them),
//! `macs.rs` (pinned MACs, aging) and `hooks.rs` (capture, trace, faults).

use std::cell::UnsafeCell;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::observe::{Capture, Trace};
use crate::queue::{PortQueues, RxQueue, TxQueue};
use crate::reactor::Waker;
use crate::switch::mac_table::{Learned, MacEntry, MacTable, GENERATION_MASK};
use crate::switch::neigh::Neighbours;
use crate::switch::police::Policer;
use crate::switch::policy::conntrack::{Conntrack, CtQuota, PortRef};
use crate::switch::policy::PortRules;
use crate::switch::security::{PortSecurity, SecurityState, DEFAULT_MOVE_HOLD_SECS};
use crate::types::{
    BridgeCounters, BridgeId, Counters, DropReason, PortId, QueueCounters, WorkerCounters,
};
use crate::vlan::VlanMode;
use crate::wire::MacAddr;
use switchyard_api::spec::{Meter, RateLimits};

/// How long taking a port's queues back waits for workers to leave a burst.
pub const DETACH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

pub use switchyard_api::PortTotals;

mod hooks;
mod macs;
pub use macs::MacSeen;
mod queues;
pub mod slots;
pub mod stats;
pub mod view;

pub use slots::{RxClaim, RxSlot, TxSlot};
pub use stats::{BridgeStats, BridgeTotals, PortShared};
pub use view::{Ingress, ViewBridge, ViewPort, ViewRx, WorkerView};

/// Where a port's queues stand ([`Dataplane::queue_positions`]).
#[derive(Debug, Default)]
pub struct QueuePositions {
    /// Receive queues, in order.
    pub rx: Vec<Option<crate::queue::QueuePosition>>,
    /// Transmit queues, in order.
    pub tx: Vec<Option<crate::queue::QueuePosition>>,
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
    /// One of a full mesh of tunnels (split horizon): see
    /// [`Dataplane::set_split_horizon`].
    split_horizon: bool,
    /// Its L3/L4 policy and station addresses, compiled
    /// ([`Dataplane::set_port_rules`]).
    rules: Option<Arc<PortRules>>,
    /// Its policers ([`Dataplane::set_port_rate_limits`]).
    policers: Policers,
}

/// A port's policers: what it sends into the switch (`rx`) and what the
/// switch sends it (`tx`); none where not limited.
#[derive(Clone, Default)]
pub struct Policers {
    /// Frames received from the port.
    pub rx: Option<Arc<Policer>>,
    /// Frames sent to the port.
    pub tx: Option<Arc<Policer>>,
}

struct DpBridge {
    macs: Arc<MacTable>,
    stats: Arc<BridgeStats>,
    ports: Vec<PortId>,
    /// Its known neighbours, answered for ([`Dataplane::set_neighbours`]).
    neigh: Option<Arc<Neighbours>>,
}

#[derive(Default)]
struct DpTable {
    ports: Vec<Option<DpPort>>,
    bridges: Vec<Option<DpBridge>>,
    /// Generation per port slot, kept after removal so reuse is detectable.
    slot_gens: Vec<u16>,
    /// The running trace, if any.
    trace: Option<Arc<Trace>>,
    /// Workers poll no receive queue (a takeover is handing the queues to
    /// another process, or has not yet been given the go).
    paused: bool,
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
    /// Set once [`Dataplane::pause`] has the workers stopped, until
    /// [`Dataplane::resume`]: [`Dataplane::publish`] then wakes none.
    paused: AtomicBool,
    /// Per worker: the table generation its view was last built from
    /// (`u64::MAX` while the worker is not running).
    acks: Box<[AtomicU64]>,
    /// Per worker: its load.
    load: Box<[WorkerCounters]>,
    /// Per worker: its recent busy share in permille, as the control
    /// thread last measured it (new queues go to the least busy).
    recent_load: Box<[AtomicU32]>,
    /// The connections policy allowed.
    conntrack: Conntrack,
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
                paused: AtomicBool::new(false),
                acks: (0..workers).map(|_| AtomicU64::new(u64::MAX)).collect(),
                load: (0..workers).map(|_| WorkerCounters::default()).collect(),
                recent_load: (0..workers).map(|_| AtomicU32::new(0)).collect(),
                conntrack: Conntrack::default(),
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

    /// Current table generation.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    fn publish(&self) {
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        // Paused workers have nothing to do with a new view: left asleep,
        // a takeover's thousand port additions do not keep them spinning
        // beside the control thread ([`Dataplane::quiesce`] still wakes
        // one it waits for).
        if !self.inner.paused.load(Ordering::Acquire) {
            self.wake_workers();
        }
    }

    fn wake_workers(&self) {
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

    /// Nanoseconds since the switch started, read now (policers' clock).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.inner.epoch.elapsed().as_nanos() as u64
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

    /// Stops every worker at its next burst boundary: their views get no
    /// receive queue (and so send nothing) until [`Dataplane::resume`].
    /// Waits until no worker is inside a burst of an older view; false if
    /// one did not answer within `DETACH_TIMEOUT`. Every queue is then as a
    /// worker left it after a burst: received frames released, sent ones
    /// flushed.
    pub fn pause(&self) -> bool {
        let mut t = self.table();
        t.paused = true;
        let quiet = self.publish_and_quiesce(t);
        self.inner.paused.store(true, Ordering::Release);
        quiet
    }

    /// Lets the workers poll their queues again after [`Dataplane::pause`].
    pub fn resume(&self) {
        let mut t = self.table();
        t.paused = false;
        self.inner.paused.store(false, Ordering::Release);
        drop(t);
        self.publish();
    }

    /// Asks workers to exit.
    pub fn request_stop(&self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        self.wake_workers();
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
            neigh: None,
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

    /// Gives bridge `id` the neighbours it answers ARP requests and
    /// neighbour solicitations for (`None`, or an empty table: none, it
    /// floods them), replacing what it had at once.
    pub fn set_neighbours(&self, id: BridgeId, neigh: Option<Arc<Neighbours>>) {
        let mut t = self.table();
        if let Some(b) = t.bridges.get_mut(id as usize).and_then(Option::as_mut) {
            b.neigh = neigh.filter(|n| !n.is_empty());
        }
        drop(t);
        self.publish();
    }

    /// What `f` takes from bridge `id`, if there is one.
    fn bridge<R>(&self, id: BridgeId, f: impl FnOnce(&DpBridge) -> R) -> Option<R> {
        self.table().bridges.get(id as usize)?.as_ref().map(f)
    }

    /// The MAC table of a bridge.
    pub fn mac_table(&self, id: BridgeId) -> Option<Arc<MacTable>> {
        self.bridge(id, |b| b.macs.clone())
    }

    /// The event counters of a bridge.
    pub fn bridge_stats(&self, id: BridgeId) -> Option<Arc<BridgeStats>> {
        self.bridge(id, |b| b.stats.clone())
    }

    /// Every slot's port as connections name it (`None`: an empty slot),
    /// by slot.
    pub fn port_refs(&self) -> Vec<Option<PortRef>> {
        let t = self.table();
        (t.ports.iter().enumerate())
            .map(|(id, p)| {
                p.as_ref().map(|p| PortRef {
                    id: id as PortId,
                    generation: p.generation,
                })
            })
            .collect()
    }

    /// The name of the port in slot `id`, if any.
    pub fn port_name(&self, id: PortId) -> Option<String> {
        self.table()
            .ports
            .get(id as usize)?
            .as_ref()
            .map(|p| p.shared.name.clone())
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
            split_horizon: false,
            rules: None,
            policers: Policers::default(),
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

    /// Makes port `id` one of its bridge's full mesh of tunnels (split
    /// horizon, as VPP's split-horizon group and OVS's tunnel ports): no
    /// frame it receives is sent to another such port, since every remote
    /// end has a tunnel of its own to every other.
    pub fn set_split_horizon(&self, id: PortId, on: bool) {
        let mut t = self.table();
        if let Some(p) = t.ports.get_mut(id as usize).and_then(Option::as_mut) {
            p.split_horizon = on;
        }
        drop(t);
        self.publish();
    }

    /// Gives port `id` its L3/L4 policy and station addresses (`None`:
    /// none), replacing what it had at once: each frame is judged by the
    /// old rules or the new ones, never by a mix. Connections the old
    /// rules allowed stay open.
    pub fn set_port_rules(&self, id: PortId, rules: Option<Arc<PortRules>>) {
        let mut t = self.table();
        if let Some(p) = t.ports.get_mut(id as usize).and_then(Option::as_mut) {
            p.rules = rules;
        }
        drop(t);
        self.publish();
    }

    /// Gives port `id` the policers `limits` asks for (validated), in
    /// place of those it had: a direction whose meter is unchanged keeps
    /// its policer and its buckets' levels, a new one starts full, one
    /// absent is not limited.
    pub fn set_port_rate_limits(&self, id: PortId, limits: &RateLimits) {
        let now = self.now_ns();
        let next = |old: &Option<Arc<Policer>>, meter: &Option<Meter>| match (old, meter) {
            (_, None) => None,
            (Some(p), Some(m)) if p.meter() == m => Some(p.clone()),
            (_, Some(m)) => Some(Arc::new(Policer::new(m, now))),
        };
        let mut t = self.table();
        if let Some(p) = t.ports.get_mut(id as usize).and_then(Option::as_mut) {
            p.policers = Policers {
                rx: next(&p.policers.rx, &limits.rx),
                tx: next(&p.policers.tx, &limits.tx),
            };
        }
        drop(t);
        self.publish();
    }

    /// The connection table policy keeps.
    pub fn conntrack(&self) -> &Conntrack {
        &self.inner.conntrack
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
        let gone = PortRef {
            id,
            generation: p.generation,
        };
        drop(t);
        self.publish();
        // Its connections match no port again (named with its slot's
        // generation, as MAC entries are), but hold the table until
        // forgotten; one a worker still on a view with the port records
        // after this expires as any other.
        if !self.inner.conntrack.is_empty() {
            self.inner.conntrack.forget_port(gone);
        }
        if let Some(m) = macs {
            m.flush_port(id, false);
        }
    }
}
