//! Leaf types every layer uses: slot numbers, drop reasons and per-worker
//! counters. It imports nothing of ours.

use std::sync::atomic::{AtomicU64, Ordering};

/// A port slot number (reused after the port is removed).
pub type PortId = u16;
/// A bridge slot number.
pub type BridgeId = u16;

/// Why a frame was dropped; each has a counter per port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum DropReason {
    /// Shorter than an Ethernet header.
    Runt = 0,
    /// A frame of a VLAN its ingress port does not carry (a tagged frame on
    /// an access or untagged-only port, or outside a trunk's list).
    VlanFiltered = 1,
    /// The destination MAC was learned on the ingress port (no hairpin).
    Hairpin = 2,
    /// The destination ring had no free buffer.
    NoBuffer = 3,
    /// The destination is not connected.
    LinkDown = 4,
    /// The frame does not fit the destination's buffers.
    TooLong = 5,
    /// The ingress port is in no bridge.
    NoBridge = 6,
    /// More buffers in one frame than the switch follows.
    TooManySegments = 7,
    /// From a new source address while the ingress port holds as many MAC
    /// entries as its limit allows.
    MacLimit = 8,
    /// From a source address the ingress port may not use (not one of its
    /// pinned MACs, or pinned to another port).
    SpoofedSource = 9,
    /// From a source address in use on another port within the move hold
    /// time.
    MacMove = 10,
}

impl DropReason {
    /// Number of reasons.
    pub const COUNT: usize = 11;
    /// Every reason, in counter order.
    pub const ALL: [DropReason; DropReason::COUNT] = [
        DropReason::Runt,
        DropReason::VlanFiltered,
        DropReason::Hairpin,
        DropReason::NoBuffer,
        DropReason::LinkDown,
        DropReason::TooLong,
        DropReason::NoBridge,
        DropReason::TooManySegments,
        DropReason::MacLimit,
        DropReason::SpoofedSource,
        DropReason::MacMove,
    ];
    /// Stable name used in stats output.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Runt => "runt",
            DropReason::VlanFiltered => "vlan_filtered",
            DropReason::Hairpin => "hairpin",
            DropReason::NoBuffer => "no_buffer",
            DropReason::LinkDown => "link_down",
            DropReason::TooLong => "too_long",
            DropReason::NoBridge => "no_bridge",
            DropReason::TooManySegments => "too_many_segments",
            DropReason::MacLimit => "mac_limit",
            DropReason::SpoofedSource => "spoofed_source",
            DropReason::MacMove => "mac_move",
        }
    }
}

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
}

/// Adds `n` to a counter that only the calling thread writes.
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}
