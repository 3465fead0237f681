//! Forwarding traces: what the switch decided for each of the next N
//! frames (VPP's `trace add`, OVS's `ofproto/trace` on live traffic).
//!
//! Workers that see a trace in their view switch the burst through the
//! traced path of [`crate::forward`], which fills one [`TraceRecord`] per
//! frame it claims. The records go into a queue sized for the count when
//! the trace starts.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam::queue::ArrayQueue;
use smallvec::SmallVec;

use crate::types::{DropReason, PortId};
use crate::wire::MacAddr;

/// Most frames one trace follows.
pub const MAX_TRACE: u32 = 10_000;

/// What learning did with a frame's source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceLearn {
    /// Not reached (the frame was dropped first).
    Skipped,
    /// A group address: never learned.
    Multicast,
    /// Already known on this port.
    Known,
    /// Known on this port; its age was reset.
    Refreshed,
    /// Learned now.
    New,
    /// Moved here from another port (its slot).
    Moved(PortId),
    /// Learned by evicting another port's entry from a full bucket.
    Evicted(PortId),
    /// Not learned: its bucket is full of pinned entries.
    TableFull,
}

/// How the destination was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceLookup {
    /// Not reached (the frame was dropped first).
    Skipped,
    /// Found in the MAC table, on this port.
    Unicast(PortId),
    /// Not in the table (or its port is gone): flooded.
    Unknown,
    /// A group address: flooded.
    Multicast,
    /// A request for a known neighbour: answered by the bridge, not
    /// flooded.
    Answered,
}

/// One frame's way through the switch.
#[derive(Debug, Clone)]
pub struct TraceRecord {
    /// The worker that switched it.
    pub worker: u16,
    /// Where it came in.
    pub in_port: PortId,
    /// Its length.
    pub len: u32,
    /// Source address.
    pub src: MacAddr,
    /// Destination address.
    pub dst: MacAddr,
    /// Its 802.1Q tag on arrival, if it had one.
    pub tag: Option<u16>,
    /// The VLAN it belongs to inside the bridge (after the ingress port's
    /// VLAN mode), once known.
    pub vlan: Option<u16>,
    /// What learning did.
    pub learn: TraceLearn,
    /// What the lookup found.
    pub lookup: TraceLookup,
    /// Each port it was handed to, and what became of it there: held in
    /// the record up to four ports, so tracing a unicast frame allocates
    /// nothing (a flood to more ports does).
    pub out: SmallVec<[(PortId, Result<(), DropReason>); 4]>,
    /// Why it went nowhere, if it was dropped on the way in.
    pub drop: Option<DropReason>,
    /// What L3/L4 policy decided, step by step (a port's rule that allowed
    /// it, a connection it belongs to, a port's rules that refused it).
    pub policy: Vec<String>,
}

impl TraceRecord {
    /// A record of a frame from `in_port`, nothing decided yet.
    pub fn new(worker: usize, in_port: PortId, len: u32) -> TraceRecord {
        TraceRecord {
            worker: worker as u16,
            in_port,
            len,
            src: MacAddr::from_u64(0),
            dst: MacAddr::from_u64(0),
            tag: None,
            vlan: None,
            learn: TraceLearn::Skipped,
            lookup: TraceLookup::Skipped,
            out: SmallVec::new(),
            drop: None,
            policy: Vec::new(),
        }
    }
}

/// A trace of the next frames (of one port, or of any).
pub struct Trace {
    port: Option<PortId>,
    remaining: AtomicU64,
    records: ArrayQueue<TraceRecord>,
}

impl Trace {
    /// A trace of the next `count` frames (at most [`MAX_TRACE`]) that
    /// come in on `port` (any port if `None`).
    pub fn new(count: u32, port: Option<PortId>) -> Trace {
        let count = count.clamp(1, MAX_TRACE);
        Trace {
            port,
            remaining: AtomicU64::new(u64::from(count)),
            records: ArrayQueue::new(count as usize),
        }
    }

    /// Whether a frame from `in_port` is traced; if so it counts against
    /// the trace's count.
    #[inline]
    pub fn claim(&self, in_port: PortId) -> bool {
        if self.port.is_some_and(|p| p != in_port) {
            return false;
        }
        self.remaining
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
            .is_ok()
    }

    /// True once every frame of the count was claimed.
    pub fn claimed_all(&self) -> bool {
        self.remaining.load(Ordering::Relaxed) == 0
    }

    /// Hands in a finished record.
    pub fn record(&self, r: TraceRecord) {
        // Never full: one place per claim.
        let _ = self.records.push(r);
    }

    /// The records handed in so far.
    pub fn drain(&self) -> Vec<TraceRecord> {
        std::iter::from_fn(|| self.records.pop()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_claims_its_count_from_its_port_only() {
        let t = Trace::new(2, Some(3));
        assert!(!t.claim(1));
        assert!(t.claim(3));
        assert!(t.claim(3));
        assert!(!t.claim(3));
        assert!(t.claimed_all());
        t.record(TraceRecord::new(0, 3, 60));
        t.record(TraceRecord::new(0, 3, 61));
        assert_eq!(t.drain().len(), 2);
    }
}
