//! Leaf types every layer uses: slot numbers, drop reasons and per-worker
//! counters. It imports nothing of ours.

use std::sync::atomic::{AtomicU64, Ordering};

/// A port slot number (reused after the port is removed).
pub type PortId = u16;
/// A bridge slot number.
pub type BridgeId = u16;

/// Why a frame was dropped; each has a counter per port (indexed by its
/// value). Defined with the API, which reports it.
pub use switchyard_api::DropReason;

/// Per-worker counters of one port. Each worker writes only its own copy, so
/// updates are plain load+store, never a locked instruction.
#[repr(align(64))]
#[derive(Default)]
pub struct Counters {
    /// Frames received from the peer.
    pub rx_packets: AtomicU64,
    /// Bytes received from the peer.
    pub rx_bytes: AtomicU64,
    /// Frames delivered to the peer.
    pub tx_packets: AtomicU64,
    /// Bytes delivered to the peer.
    pub tx_bytes: AtomicU64,
    /// Drops by reason (indexed by [`DropReason`]).
    pub drops: [AtomicU64; DropReason::COUNT],
    /// The port's floods in the current second, as the worker counts them
    /// against its flood limit (`SecurityState::may_flood`).
    pub flood_window: AtomicU64,
}

/// Per-worker counters of one bridge (written as [`Counters`]); the
/// control thread's block counts aging.
#[repr(align(64))]
#[derive(Default)]
pub struct BridgeCounters {
    /// MAC entries learned (new stations, evictions included).
    pub learned: AtomicU64,
    /// MAC entries moved from one port to another.
    pub moved: AtomicU64,
    /// Entries evicted from a full bucket to make room.
    pub evicted: AtomicU64,
    /// Entries removed by aging.
    pub aged: AtomicU64,
    /// Frames flooded (unknown unicast, broadcast, multicast).
    pub flooded: AtomicU64,
    /// ARP requests and neighbour solicitations the bridge answered
    /// itself (from its known neighbours) instead of flooding them.
    pub answered: AtomicU64,
}

/// Adds `n` to a counter that only the calling thread writes.
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Upper bounds of the burst-size histogram's buckets (frames per
/// non-empty receive burst); the last bucket takes everything larger.
pub const BURST_BUCKETS: [u32; 6] = [1, 3, 7, 15, 31, 63];

/// A worker's load, written only by that worker (plain load+store, as
/// [`Counters`]) and read by the control thread.
#[repr(align(64))]
#[derive(Default)]
pub struct WorkerCounters {
    /// Passes over the worker's receive queues.
    pub polls: AtomicU64,
    /// Passes that found frames.
    pub busy_polls: AtomicU64,
    /// Ticks ([`ticks`]) spent in passes that found frames.
    pub busy_ticks: AtomicU64,
    /// Ticks spent in passes that found nothing.
    pub idle_ticks: AtomicU64,
    /// Frames received.
    pub frames: AtomicU64,
    /// Non-empty bursts by size ([`BURST_BUCKETS`]).
    pub bursts: [AtomicU64; BURST_BUCKETS.len()],
    /// Times the worker went to sleep on its interrupts (adaptive and
    /// interrupt modes).
    pub sleeps: AtomicU64,
    /// Sleeps ended by an interrupt or a kick, not by the timeout.
    pub wakeups: AtomicU64,
}

impl WorkerCounters {
    /// Counts a non-empty burst of `n` frames.
    #[inline]
    pub fn burst(&self, n: usize) {
        let i = BURST_BUCKETS
            .iter()
            .position(|&b| n as u64 <= u64::from(b))
            .unwrap_or(BURST_BUCKETS.len() - 1);
        bump(&self.bursts[i], 1);
        bump(&self.frames, n as u64);
    }
}

/// A receive queue's share of its worker's time, written by the worker
/// polling it.
#[derive(Default)]
pub struct QueueCounters {
    /// Frames received.
    pub frames: AtomicU64,
    /// Ticks spent receiving and forwarding them.
    pub ticks: AtomicU64,
}

/// A cheap monotonic clock for load accounting: the time-stamp counter on
/// x86-64 (a few cycles, no system call), nanoseconds elsewhere. Only
/// differences mean anything; [`ticks_per_second`] converts them.
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` exists on every x86-64 CPU and has no
        // preconditions.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        EPOCH
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

/// How many [`ticks`] make a second, measured once (20 ms) on first use.
pub fn ticks_per_second() -> f64 {
    static RATE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *RATE.get_or_init(|| {
        let (t0, i0) = (ticks(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (t1, i1) = (ticks(), std::time::Instant::now());
        (t1.wrapping_sub(t0)) as f64 / i1.duration_since(i0).as_secs_f64()
    })
}
