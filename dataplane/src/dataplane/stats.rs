//! What the control thread and the workers count, per port and bridge.

use super::*;

/// What the control thread and the workers share about one port.
pub struct PortShared {
    /// Port name.
    pub name: String,
    /// One counter block per worker, plus one for the control thread.
    pub(super) counters: Box<[Counters]>,
    pub(super) fault_flag: AtomicBool,
    pub(super) fault: Mutex<Option<String>>,
    pub(super) link_up: AtomicBool,
    /// Port security settings and the entries the port holds.
    pub security: SecurityState,
    /// The connections the port opened: what they hold of the connection
    /// table.
    pub conntrack: Arc<CtQuota>,
    /// The connections others opened towards the port from ports without
    /// rules (uplinks, tunnels): a share of their own, so that they cannot
    /// take the port's.
    pub conntrack_in: Arc<CtQuota>,
}

impl PortShared {
    pub(super) fn new(name: &str, workers: usize, security: &PortSecurity) -> PortShared {
        PortShared {
            name: name.to_string(),
            counters: (0..=workers).map(|_| Counters::default()).collect(),
            fault_flag: AtomicBool::new(false),
            fault: Mutex::new(None),
            link_up: AtomicBool::new(false),
            security: SecurityState::new(security),
            conntrack: Arc::default(),
            conntrack_in: Arc::default(),
        }
    }

    /// The counter block of worker `w`.
    #[inline]
    pub fn counters(&self, w: usize) -> &Counters {
        &self.counters[w]
    }

    /// Every frame counted, in one number: counters only grow, so an equal
    /// count later means nothing was counted since (no allocation: a
    /// takeover asks it of a thousand ports in its pause).
    pub fn counted(&self) -> u64 {
        let mut n = 0u64;
        for c in self.counters.iter() {
            n = n
                .wrapping_add(c.rx_packets.load(Ordering::Relaxed))
                .wrapping_add(c.tx_packets.load(Ordering::Relaxed));
            for d in c.drops.iter() {
                n = n.wrapping_add(d.load(Ordering::Relaxed));
            }
        }
        n
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

    /// Adds `t`, another process's totals for this port (a takeover), to
    /// the control thread's counter block: the port counts on from there.
    pub fn carry(&self, t: &PortTotals) {
        let c = self
            .counters
            .last()
            .expect("one block per worker and one more");
        c.rx_packets.fetch_add(t.rx_packets, Ordering::Relaxed);
        c.rx_bytes.fetch_add(t.rx_bytes, Ordering::Relaxed);
        c.tx_packets.fetch_add(t.tx_packets, Ordering::Relaxed);
        c.tx_bytes.fetch_add(t.tx_bytes, Ordering::Relaxed);
        for (r, n) in &t.drops {
            c.drops[*r as usize].fetch_add(*n, Ordering::Relaxed);
        }
    }

    /// True while queues are attached.
    pub fn link_up(&self) -> bool {
        self.link_up.load(Ordering::Relaxed)
    }
}

/// A bridge's event counters, one block per worker plus one for the
/// control thread (aging).
pub struct BridgeStats {
    pub(super) counters: Box<[BridgeCounters]>,
}

/// A bridge's counters summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Requests answered from the known neighbours (absent from an older
    /// switch's state, and left out when none, for one).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub answered: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl BridgeStats {
    pub(super) fn new(workers: usize) -> BridgeStats {
        BridgeStats {
            counters: (0..=workers).map(|_| BridgeCounters::default()).collect(),
        }
    }

    /// The counter block of worker `w` (the last is the control thread's).
    #[inline]
    pub fn counters(&self, w: usize) -> &BridgeCounters {
        &self.counters[w]
    }

    /// Adds `t`, another process's totals for this bridge (a takeover), to
    /// the control thread's counter block.
    pub fn carry(&self, t: &BridgeTotals) {
        let c = self
            .counters
            .last()
            .expect("one block per worker and one more");
        c.learned.fetch_add(t.learned, Ordering::Relaxed);
        c.moved.fetch_add(t.moved, Ordering::Relaxed);
        c.evicted.fetch_add(t.evicted, Ordering::Relaxed);
        c.aged.fetch_add(t.aged, Ordering::Relaxed);
        c.flooded.fetch_add(t.flooded, Ordering::Relaxed);
        c.answered.fetch_add(t.answered, Ordering::Relaxed);
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
            t.answered += c.answered.load(Ordering::Relaxed);
        }
        t
    }
}
