//! Policers on the forwarding path ([`crate::switch::police`]): a limited
//! port's received burst metered before it is switched
//! ([`police_rx`]), and the frames queued for a limited port metered
//! before they are sent (`tx`). Apart from the forwarder's own code, so
//! that a port without a limit changes nothing of it but one test.

use super::{trace_unswitched, Pending, PendingQueue, Retag};
use crate::dataplane::{Dataplane, ViewPort, WorkerView};
use crate::observe::TraceRecord;
use crate::queue::{offload, RxFrame, BURST_SIZE};
use crate::switch::police::{Cost, Policer};
use crate::types::{bump, DropReason, PortId};
use crate::wire::ethernet::VLAN_TAG_LEN;

/// What frame `frame`, `len` bytes long as it leaves, costs a policer (a
/// super-frame: the segments it becomes).
#[inline]
fn cost(frame: &RxFrame, len: u32) -> Cost {
    // The usual frame is itself; a super-frame's headers are read.
    let (bytes, frames) = if frame.offload.is_none() || frame.offload.gso().is_none() {
        (u64::from(len), 1)
    } else {
        offload::wire_size(frame, len)
    };
    Cost {
        bits: bytes * 8,
        frames,
    }
}

/// The frames of burst `frames`, received from port `id` on worker `w`,
/// that go on to be switched ([`super::Forwarder::forward_burst`]): all of them,
/// unless the port has an `rx` policer `pol` ([`ViewRx::policer`] for a
/// queue's own port), which meters them: those it passes are moved to the
/// front, in order; the others are dropped, counted as `policed_rx` and,
/// while a trace runs, traced. The worker calls it before forwarding, so
/// that a port without a limit costs the forwarding loop nothing.
///
/// [`ViewRx::policer`]: crate::dataplane::ViewRx::policer
#[inline]
pub fn police_rx<'a>(
    dp: &Dataplane,
    view: &WorkerView,
    w: usize,
    id: PortId,
    pol: Option<&Policer>,
    frames: &'a mut [RxFrame],
) -> &'a [RxFrame] {
    match pol {
        None => frames,
        Some(pol) => {
            let n = meter_rx(pol, dp, view, w, id, frames);
            &frames[..n]
        }
    }
}

/// [`police_rx`] for a port with a policer: how many frames pass, moved
/// to the front.
#[cold]
#[inline(never)]
fn meter_rx(
    pol: &Policer,
    dp: &Dataplane,
    view: &WorkerView,
    w: usize,
    id: PortId,
    frames: &mut [RxFrame],
) -> usize {
    let trace = view.trace.as_deref();
    let now = dp.now_ns();
    // Frames metered at once: their verdicts are the bits of a `u64`.
    const CHUNK: usize = u64::BITS as usize;
    let (mut kept, mut at) = (0, 0);
    // The frames' costs, read before the buckets are locked.
    let mut costs = [Cost { bits: 0, frames: 0 }; CHUNK];
    while at < frames.len() {
        let end = (at + CHUNK).min(frames.len());
        for (c, f) in costs.iter_mut().zip(&frames[at..end]) {
            *c = cost(f, f.len);
        }
        let (mut passed, mut k) = (0u64, 0);
        pol.admit(now, costs[..end - at].iter().copied(), |pass| {
            passed |= u64::from(pass) << k;
            k += 1;
        });
        for i in at..end {
            if passed & (1 << (i - at)) != 0 {
                if kept != i {
                    frames.swap(kept, i);
                }
                kept += 1;
            } else if let Some(t) = trace {
                let one = std::slice::from_ref(&frames[i]);
                trace_unswitched(t, w, id, one, DropReason::PolicedRx);
            }
        }
        at = end;
    }
    // The dropped frames, now at the end, were received all the same:
    // counted as such (the forwarder counts those that pass) and shown to
    // a capture of what the port sends.
    let dropped = &frames[kept..];
    let port = view.ports.get(id as usize).and_then(Option::as_ref);
    if let Some(p) = port.filter(|_| !dropped.is_empty()) {
        let counters = p.shared.counters(w);
        let bytes: u64 = dropped.iter().map(|f| u64::from(f.len)).sum();
        bump(&counters.rx_packets, dropped.len() as u64);
        bump(&counters.rx_bytes, bytes);
        bump(
            &counters.drops[DropReason::PolicedRx as usize],
            dropped.len() as u64,
        );
        if let Some(c) = p.capture.as_deref().filter(|c| c.wants_rx()) {
            c.take_rx(dropped);
        }
    }
    kept
}

/// Meters the frames queued on port `p` (slot `id`) through its `tx`
/// policer `pol` on worker `w`: keeps those that pass, in order, and
/// returns how many. The others are dropped, counted (`policed_tx`) and
/// noted in their trace records (`traced`, while a trace runs).
#[cold]
#[inline(never)]
pub(super) fn tx(
    pol: &Policer,
    dp: &Dataplane,
    w: usize,
    (id, p): (PortId, &ViewPort),
    q: &mut PendingQueue,
    frames: &[RxFrame],
    mut traced: Option<&mut [Option<TraceRecord>]>,
) -> usize {
    let leaving = |e: &Pending| {
        let f = &frames[usize::from(e.frame)];
        let len = match e.tag {
            Retag::Keep => f.len,
            Retag::Pop => f.len.saturating_sub(VLAN_TAG_LEN as u32),
            Retag::Push => f.len + VLAN_TAG_LEN as u32,
        };
        cost(f, len)
    };
    let n = usize::from(q.len);
    let (mut read, mut kept) = (0, 0);
    let items = q.items;
    // The frames' costs, read before the buckets are locked.
    let mut costs = [Cost { bits: 0, frames: 0 }; BURST_SIZE];
    for (c, e) in costs.iter_mut().zip(&items[..n]) {
        *c = leaving(e);
    }
    let passed = pol.admit(dp.now_ns(), costs[..n].iter().copied(), |pass| {
        let e = items[read];
        read += 1;
        if pass {
            q.items[kept] = e;
            kept += 1;
        } else if let Some(t) = traced
            .as_deref_mut()
            .and_then(|t| t[usize::from(e.frame)].as_mut())
        {
            t.out.push((id, Err(DropReason::PolicedTx)));
        }
    });
    if passed < n {
        bump(
            &p.shared.counters(w).drops[DropReason::PolicedTx as usize],
            (n - passed) as u64,
        );
    }
    q.truncate(passed);
    passed
}
