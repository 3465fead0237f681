//! The L2 forwarding of one worker: a burst in, learned, looked up, VLAN
//! rewritten and queued on its destinations, flooded where unknown.
//!
//! It knows frames and queues, not protocols: frames come in as [`RxFrame`]s
//! from any port kind and leave through any [`crate::queue::TxQueue`].
//!
//! VLAN model (as Open vSwitch's access and trunk ports, see
//! [`crate::vlan::VlanMode`]): an access port carries untagged frames of its
//! VLAN (VLAN 0, untagged-only, by default); tagged frames arriving on it are
//! dropped (priority tags, VID 0, are accepted and stripped); a trunk carries
//! the VLANs of its list tagged, and untagged frames as VLAN 0 when the list
//! holds 0.

use std::mem::MaybeUninit;

use crate::dataplane::{Dataplane, Ingress, ViewBridge, ViewPort, WorkerView};
use crate::observe::{capture, Trace, TraceLearn, TraceLookup, TraceRecord};
use crate::queue::{RxFrame, TxError, TxFrame, BURST_SIZE};
use crate::switch::mac_table::{MacEntry, MacKey};
use crate::switch::security::{self, Admitted};
use crate::types::{bump, BridgeId, DropReason, PortId};
use crate::wire::ethernet::{ETHERTYPE_VLAN, HEADER_LEN, VLAN_TAG_LEN};
use crate::wire::MacAddr;

/// Per-worker scratch state for forwarding, sized when the view changes so
/// that forwarding itself never allocates.
///
/// A burst is switched in two passes: every frame is first decided (parsed,
/// learned, looked up) and queued on its destinations, then each destination
/// takes its frames in one go, under one acquisition of its queue, and is
/// flushed. That is one lock and one ring update per destination and burst
/// instead of per frame.
#[derive(Default)]
pub struct Forwarder {
    /// Frames queued per destination port slot (at most one burst each).
    pending: Vec<PendingQueue>,
    /// Destinations with frames queued, in first-use order.
    touched: Vec<PortId>,
    /// For each frame of the burst whose VLAN tag changes somewhere, its
    /// rewritten header from a private copy: the two addresses, then
    /// (tag pushed) the new tag. A frame is either tagged (its tag may be
    /// popped) or not (one may be pushed, of its one VLAN), so one header
    /// serves every destination.
    hdrs: Vec<[u8; PUSHED_LEN]>,
    /// While a trace runs: the records of the chunk's traced frames.
    traced: Vec<Option<TraceRecord>>,
}

/// One frame queued on one destination.
#[derive(Clone, Copy)]
struct Pending {
    /// Index of the frame in the burst.
    frame: u8,
    /// Its VLAN rewrite.
    tag: Retag,
}

/// The frames of one burst queued on one destination: room for every
/// frame of a burst, so that queueing one is a store.
#[derive(Clone, Copy)]
struct PendingQueue {
    len: u8,
    items: [Pending; BURST_SIZE],
}

impl PendingQueue {
    const EMPTY: PendingQueue = PendingQueue {
        len: 0,
        items: [Pending {
            frame: 0,
            tag: Retag::Keep,
        }; BURST_SIZE],
    };

    #[inline]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `p`; a frame more than a burst holds is not queued.
    #[inline]
    fn push(&mut self, p: Pending) {
        if let Some(slot) = self.items.get_mut(usize::from(self.len)) {
            *slot = p;
            self.len += 1;
        }
    }

    #[inline]
    fn as_slice(&self) -> &[Pending] {
        &self.items[..usize::from(self.len)]
    }

    #[inline]
    fn clear(&mut self) {
        self.len = 0;
    }
}

/// How a frame's VLAN tag changes on its way out.
#[derive(Clone, Copy)]
enum Retag {
    /// Leaves as it came.
    Keep,
    /// Its tag is removed.
    Pop,
    /// A tag of this VLAN is pushed.
    Push(u16),
}

/// Length of the header written in front of a frame whose tag is pushed:
/// the addresses and the new tag.
const PUSHED_LEN: usize = 12 + VLAN_TAG_LEN;

/// A frame's L2 facts, parsed from a private copy of its first bytes.
struct L2 {
    hdr: [u8; HEADER_LEN + VLAN_TAG_LEN],
    dst: MacAddr,
    src: MacAddr,
    tagged: bool,
    vid: u16,
}

fn parse_l2(frame: &RxFrame) -> Result<L2, DropReason> {
    let mut hdr = [0u8; HEADER_LEN + VLAN_TAG_LEN];
    let n = frame.read_prefix(&mut hdr);
    if n < HEADER_LEN {
        return Err(DropReason::Runt);
    }
    let ethertype = u16::from_be_bytes([hdr[12], hdr[13]]);
    let tagged = ethertype == ETHERTYPE_VLAN;
    if tagged && n < HEADER_LEN + VLAN_TAG_LEN {
        return Err(DropReason::Runt);
    }
    let vid = if tagged {
        u16::from_be_bytes([hdr[14], hdr[15]]) & 0x0fff
    } else {
        0
    };
    Ok(L2 {
        dst: MacAddr::from_bytes(&hdr[0..6]),
        src: MacAddr::from_bytes(&hdr[6..12]),
        hdr,
        tagged,
        vid,
    })
}

/// The entry learning a source on port `id` (`p` in the view) writes at
/// time `now`: the fast check compares a stored entry with it, the full
/// admission writes it.
#[inline(always)]
fn seen_now(id: PortId, p: &ViewPort, now: u32) -> MacEntry {
    MacEntry {
        port: id,
        port_gen: p.generation,
        last_seen: now,
        pinned: false,
    }
}

/// The full admission of a source that the fast checks did not find
/// known (new, moved, refreshed once a second, or sent by a port that pins
/// its sources): learns it, counts what changed in the bridge's counters of
/// worker `w` and notes it in the frame's trace record. `Ok(true)`: known
/// on this port, nothing written; `Err`: why the frame is dropped (noted
/// in the record, not counted). Out of line, so that the per-frame loop
/// keeps its registers for the usual case.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn admit<'a>(
    w: usize,
    bridge: &ViewBridge,
    inp: &ViewPort,
    in_port: PortId,
    src: MacAddr,
    domain: u16,
    now: u32,
    hold: u32,
    owner: &impl Fn(&MacEntry) -> Option<&'a security::SecurityState>,
    traced: Option<&mut TraceRecord>,
) -> Result<bool, DropReason> {
    let admitted = security::admit_source(
        &bridge.macs,
        &inp.shared.security,
        src,
        domain,
        seen_now(in_port, inp, now),
        hold,
        owner,
    );
    let counters = bridge.stats.counters(w);
    let learn = match admitted {
        Err(r) => {
            if let Some(t) = traced {
                t.drop = Some(r);
            }
            return Err(r);
        }
        Ok(Admitted::Known) => TraceLearn::Known,
        Ok(Admitted::Refreshed) => TraceLearn::Refreshed,
        Ok(Admitted::New) => {
            bump(&counters.learned, 1);
            TraceLearn::New
        }
        Ok(Admitted::Moved(old)) => {
            bump(&counters.moved, 1);
            TraceLearn::Moved(old.port)
        }
        Ok(Admitted::Evicted(old)) => {
            bump(&counters.learned, 1);
            bump(&counters.evicted, 1);
            TraceLearn::Evicted(old.port)
        }
        Ok(Admitted::NotLearned) => TraceLearn::TableFull,
    };
    if let Some(t) = traced {
        t.learn = learn;
    }
    Ok(matches!(admitted, Ok(Admitted::Known)))
}

impl Forwarder {
    /// Resizes scratch state for a new view.
    pub fn resize(&mut self, view: &WorkerView) {
        self.pending = vec![PendingQueue::EMPTY; view.ports.len()];
        self.touched = Vec::with_capacity(view.ports.len());
        self.hdrs = vec![[0; PUSHED_LEN]; BURST_SIZE];
        self.traced = vec![None; BURST_SIZE];
    }

    /// Switches one burst received from `from` (in chunks of
    /// [`BURST_SIZE`] frames). `w` is the worker index.
    ///
    /// `release` gives the burst's buffers back to the receiving port's
    /// peer. It is called once: after the last frame has been copied out,
    /// before the last destination is flushed (or at the end, if no
    /// destination took a frame). So a peer that forwards what it receives
    /// back out (a loop, a router pod) always sees its transmit slots free
    /// before it sees the frames they carried arrive, as with DPDK's vhost
    /// library, which gives guest buffers back when it dequeues; published
    /// the other way round, a peer whose frames in flight fill its ring
    /// finds it full and drops.
    #[inline]
    pub fn forward_burst(
        &mut self,
        dp: &Dataplane,
        view: &WorkerView,
        w: usize,
        from: Ingress,
        frames: &[RxFrame],
        release: impl FnOnce(),
    ) {
        self.forward_burst_with::<true>(dp, view, w, from, frames, release)
    }

    /// [`Forwarder::forward_burst`], with the capture and trace hooks
    /// compiled in (`HOOKS`) or out: the hot-path benchmark measures what
    /// idle hooks cost by running both.
    pub fn forward_burst_with<const HOOKS: bool>(
        &mut self,
        dp: &Dataplane,
        view: &WorkerView,
        w: usize,
        from: Ingress,
        frames: &[RxFrame],
        release: impl FnOnce(),
    ) {
        let in_port = from.port;
        let mut release = Some(release);
        // Frames no destination takes (no port, no bridge, all dropped)
        // are released after the block.
        'switch: {
            let Some(inp) = view.ports.get(in_port as usize).and_then(Option::as_ref) else {
                break 'switch;
            };
            let in_counters = inp.shared.counters(w);
            let bytes: u64 = frames.iter().map(|f| u64::from(f.len)).sum();
            bump(&in_counters.rx_packets, frames.len() as u64);
            bump(&in_counters.rx_bytes, bytes);
            if HOOKS {
                if let Some(c) = &inp.capture {
                    if c.wants_rx() {
                        c.take_rx(frames);
                    }
                }
            }

            let bridge = inp.bridge.and_then(|b| {
                view.bridges
                    .get(b as usize)
                    .and_then(Option::as_ref)
                    .map(|v| (b, v))
            });
            let Some(bridge) = bridge else {
                bump(
                    &in_counters.drops[DropReason::NoBridge as usize],
                    frames.len() as u64,
                );
                if HOOKS {
                    if let Some(t) = &view.trace {
                        trace_unswitched(t, w, in_port, frames, DropReason::NoBridge);
                    }
                }
                break 'switch;
            };
            let r = &mut release;
            match (HOOKS, &view.trace) {
                (true, Some(t)) => self.switch_burst::<true, true, _>(
                    dp,
                    view,
                    w,
                    from,
                    inp,
                    bridge,
                    frames,
                    Some(t),
                    r,
                ),
                _ => self.switch_burst::<HOOKS, false, _>(
                    dp, view, w, from, inp, bridge, frames, None, r,
                ),
            }
        }
        if let Some(r) = release {
            r();
        }
    }

    /// Learns, looks up and sends a burst of frames received from `from`
    /// in `bridge`; with `TRACE`, fills a record for each frame `trace`
    /// claims. `release` goes to the last chunk's sending.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn switch_burst<const HOOKS: bool, const TRACE: bool, R: FnOnce()>(
        &mut self,
        dp: &Dataplane,
        view: &WorkerView,
        w: usize,
        from: Ingress,
        inp: &ViewPort,
        (bridge_id, bridge): (BridgeId, &ViewBridge),
        frames: &[RxFrame],
        trace: Option<&Trace>,
        release: &mut Option<R>,
    ) {
        let in_port = from.port;
        let in_counters = inp.shared.counters(w);
        let bridge_counters = bridge.stats.counters(w);
        let now = dp.now_secs();
        let hold = dp.mac_move_hold();
        // The security state of the port an entry belongs to, if it is
        // still that port.
        let owner = |e: &MacEntry| {
            view.ports
                .get(e.port as usize)
                .and_then(Option::as_ref)
                .filter(|p| p.generation == e.port_gen)
                .map(|p| &p.shared.security)
        };

        // The last source that was known on this port, and the last
        // destination looked up with where it went, as (VLAN, MAC) keys: a
        // burst mostly repeats a few conversations, and a frame that
        // repeats the one before skips its table lookups (VPP's l2-learn
        // and l2-fwd keep the same one-entry caches). They live for one
        // burst, a few microseconds: what another worker changes in the
        // table meanwhile applies from the next burst, as it would had the
        // burst been received a moment earlier.
        let mut known_src = MacKey::NONE;
        let mut last_dst: (MacKey, Option<(PortId, &ViewPort)>) = (MacKey::NONE, None);

        let last_chunk = frames.len().saturating_sub(1) / BURST_SIZE;
        for (c, chunk) in frames.chunks(BURST_SIZE).enumerate() {
            for (i, frame) in chunk.iter().enumerate() {
                if TRACE {
                    self.traced[i] = trace
                        .filter(|t| t.claim(in_port))
                        .map(|_| TraceRecord::new(w, in_port, frame.len));
                }
                // Notes a decision in the frame's trace record, if traced.
                macro_rules! note {
                    (|$r:ident| $body:expr) => {
                        if TRACE {
                            if let Some($r) = self.traced[i].as_mut() {
                                $body;
                            }
                        }
                    };
                }
                let l2 = match parse_l2(frame) {
                    Ok(l2) => l2,
                    Err(r) => {
                        bump(&in_counters.drops[r as usize], 1);
                        note!(|t| t.drop = Some(r));
                        continue;
                    }
                };
                note!(|t| {
                    t.src = l2.src;
                    t.dst = l2.dst;
                    t.tag = l2.tagged.then_some(l2.vid);
                });
                // The VLAN this frame belongs to inside the bridge.
                let Some(domain) = inp.vlan.ingress(l2.vid) else {
                    bump(&in_counters.drops[DropReason::VlanFiltered as usize], 1);
                    note!(|t| t.drop = Some(DropReason::VlanFiltered));
                    continue;
                };
                note!(|t| t.vlan = Some(domain));
                let src_key = MacKey::new(l2.src, domain);
                if l2.src.is_multicast() {
                    note!(|t| t.learn = TraceLearn::Multicast);
                    // Never a station's own address: learned nowhere, and
                    // refused from a port bound to its MACs.
                    if inp.shared.security.filters_sources() {
                        bump(&in_counters.drops[DropReason::SpoofedSource as usize], 1);
                        note!(|t| t.drop = Some(DropReason::SpoofedSource));
                        continue;
                    }
                } else if !TRACE && src_key == known_src {
                    // Known on this port, as the frame before.
                } else if !inp.shared.security.filters_sources()
                    && bridge.macs.get(src_key).is_some_and(|e| {
                        // This port's entry as learning now would write it:
                        // known (the usual case with many hosts, where the
                        // cache above misses). A port that pins its sources
                        // has the full admission below.
                        e.is_fresh(seen_now(in_port, inp, now).packed())
                    })
                {
                    known_src = src_key;
                    note!(|t| t.learn = TraceLearn::Known);
                } else {
                    let traced = if TRACE { self.traced[i].as_mut() } else { None };
                    match admit(
                        w, bridge, inp, in_port, l2.src, domain, now, hold, &owner, traced,
                    ) {
                        Err(r) => {
                            bump(&in_counters.drops[r as usize], 1);
                            continue;
                        }
                        Ok(true) => known_src = src_key,
                        Ok(false) => {}
                    }
                }
                let mut unicast = None;
                let dst_key = MacKey::new(l2.dst, domain);
                if !TRACE && last_dst.1.is_some() && dst_key == last_dst.0 {
                    unicast = last_dst.1;
                } else if !l2.dst.is_multicast() {
                    if let Some(e) = bridge.macs.get(dst_key) {
                        let (port, port_gen) = (e.port(), e.port_gen());
                        if port == in_port {
                            bump(&in_counters.drops[DropReason::Hairpin as usize], 1);
                            note!(|t| {
                                t.lookup = TraceLookup::Unicast(in_port);
                                t.drop = Some(DropReason::Hairpin);
                            });
                            continue;
                        }
                        if let Some(p) = view.ports.get(port as usize).and_then(Option::as_ref) {
                            if p.generation == port_gen && p.bridge == Some(bridge_id) {
                                unicast = Some((port, p));
                                last_dst = (dst_key, unicast);
                            }
                        }
                    }
                }
                match unicast {
                    Some((id, p)) => {
                        note!(|t| t.lookup = TraceLookup::Unicast(id));
                        self.queue::<TRACE>(w, id, p, i, &l2, domain, true);
                    }
                    None => {
                        bump(&bridge_counters.flooded, 1);
                        note!(|t| {
                            t.lookup = if l2.dst.is_multicast() {
                                TraceLookup::Multicast
                            } else {
                                TraceLookup::Unknown
                            }
                        });
                        for &id in &bridge.ports {
                            if id == in_port {
                                continue;
                            }
                            if let Some(p) = view.ports.get(id as usize).and_then(Option::as_ref) {
                                self.queue::<TRACE>(w, id, p, i, &l2, domain, false);
                            }
                        }
                    }
                }
            }
            let mut not_yet = None;
            let release = if c == last_chunk {
                &mut *release
            } else {
                &mut not_yet
            };
            self.send_queued::<HOOKS, TRACE, R>(dp, view, w, from.queue, chunk, release);
            if TRACE {
                if let Some(t) = trace {
                    for r in self.traced[..chunk.len()].iter_mut() {
                        if let Some(r) = r.take() {
                            t.record(r);
                        }
                    }
                }
            }
        }
    }

    /// Queues frame `i` on port `id` of the bridge, with the VLAN rewrite
    /// it needs there.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn queue<const TRACE: bool>(
        &mut self,
        w: usize,
        id: PortId,
        p: &ViewPort,
        i: usize,
        l2: &L2,
        domain: u16,
        unicast: bool,
    ) {
        let Some(out_tagged) = p.vlan.egress(domain) else {
            return; // not a member of this VLAN
        };
        if p.tx.is_none() {
            if unicast {
                let counters = p.shared.counters(w);
                bump(&counters.drops[DropReason::LinkDown as usize], 1);
            }
            if TRACE {
                if let Some(t) = self.traced[i].as_mut() {
                    t.out.push((id, Err(DropReason::LinkDown)));
                }
            }
            return;
        }
        let tag = match (l2.tagged, out_tagged) {
            (true, true) | (false, false) => Retag::Keep,
            (true, false) => Retag::Pop,
            (false, true) => Retag::Push(domain),
        };
        let Some(q) = self.pending.get_mut(id as usize) else {
            return;
        };
        // The rewrite's header comes from the private copy.
        match tag {
            Retag::Keep => {}
            Retag::Pop => self.hdrs[i][..12].copy_from_slice(&l2.hdr[..12]),
            Retag::Push(domain) => {
                let h = &mut self.hdrs[i];
                h[..12].copy_from_slice(&l2.hdr[..12]);
                h[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
                h[14..16].copy_from_slice(&(domain & 0x0fff).to_be_bytes());
            }
        }
        if q.is_empty() {
            self.touched.push(id);
        }
        q.push(Pending {
            frame: i as u8,
            tag,
        });
    }

    /// Hands each destination its queued frames under one acquisition of
    /// its transmit queue (the one for receive queue `rxq`), then flushes
    /// it. `release`, if given, is made between the last destination's
    /// copies and its flush.
    fn send_queued<const HOOKS: bool, const TRACE: bool, R: FnOnce()>(
        &mut self,
        dp: &Dataplane,
        view: &WorkerView,
        w: usize,
        rxq: usize,
        frames: &[RxFrame],
        release: &mut Option<R>,
    ) {
        let Forwarder {
            pending,
            touched,
            hdrs,
            traced,
        } = self;
        let last = touched.len().saturating_sub(1);
        for (k, &id) in touched.iter().enumerate() {
            let q = &mut pending[id as usize];
            let Some(p) = view.ports.get(id as usize).and_then(Option::as_ref) else {
                q.clear();
                continue;
            };
            let Some(tx) = p.tx_for(rxq) else {
                q.clear();
                continue;
            };
            if Dataplane::faulted(&p.shared) {
                q.clear();
                continue;
            }
            let counters = p.shared.counters(w);
            // A capture of what this port sends: one test per destination.
            let cap = if HOOKS {
                p.capture.as_deref().filter(|c| c.wants_tx())
            } else {
                None
            };
            let ts = if cap.is_some() {
                capture::now()
            } else {
                Default::default()
            };
            // The destination's frames, each as it leaves (tag rewritten):
            // only the slots used are written, not a whole burst's worth
            // (a kilobyte, which a one-frame burst would pay in full).
            let mut txfs = [const { MaybeUninit::<TxFrame>::uninit() }; BURST_SIZE];
            let mut all_bytes = 0u64;
            let queued = q.as_slice();
            let n = queued.len().min(BURST_SIZE);
            for (txf, e) in txfs[..n].iter_mut().zip(&queued[..n]) {
                let frame = &frames[usize::from(e.frame)];
                let hdr = &hdrs[usize::from(e.frame)];
                let f = txf.write(match e.tag {
                    Retag::Keep => TxFrame::plain(frame),
                    Retag::Pop => TxFrame {
                        frame,
                        prefix: &hdr[..12],
                        skip: (HEADER_LEN + VLAN_TAG_LEN - 2) as u32,
                    },
                    Retag::Push(_) => TxFrame {
                        frame,
                        prefix: hdr,
                        skip: 12,
                    },
                });
                all_bytes += f.len() as u64;
            }
            // SAFETY: the loop wrote `txfs[..n]`, and `n <= BURST_SIZE`;
            // `MaybeUninit<TxFrame>` has `TxFrame`'s layout.
            let txfs: &[TxFrame] =
                unsafe { std::slice::from_raw_parts(txfs.as_ptr().cast::<TxFrame>(), n) };
            let out = tx.with(|txq| {
                let out = txq.tx_burst(txfs);
                if k == last {
                    if let Some(r) = release.take() {
                        r();
                    }
                }
                txq.flush();
                out
            });
            let bytes = if out.sent == ((1u64 << txfs.len()) - 1) as u32 {
                all_bytes
            } else {
                // Some did not go: counted apart.
                let (mut bytes, mut too_long, mut no_buffer) = (0u64, 0u64, 0u64);
                for (i, txf) in txfs.iter().enumerate() {
                    match out.of(i) {
                        Some(Ok(())) => bytes += txf.len() as u64,
                        Some(Err(TxError::TooLong)) => too_long += 1,
                        Some(Err(_)) => no_buffer += 1,
                        None => {}
                    }
                }
                bump(&counters.drops[DropReason::TooLong as usize], too_long);
                bump(&counters.drops[DropReason::NoBuffer as usize], no_buffer);
                bytes
            };
            if out.sent != 0 {
                bump(&counters.tx_packets, u64::from(out.sent.count_ones()));
                bump(&counters.tx_bytes, bytes);
            }
            if let Some(c) = cap {
                for (i, txf) in txfs.iter().enumerate() {
                    if out.sent & (1 << i) != 0 {
                        c.take_tx(txf, ts);
                    }
                }
            }
            if TRACE {
                for (i, e) in q.as_slice().iter().enumerate() {
                    let Some(t) = traced[usize::from(e.frame)].as_mut() else {
                        continue;
                    };
                    if let Some(r) = out.of(i) {
                        t.out.push((
                            id,
                            r.map_err(|e| match e {
                                TxError::TooLong => DropReason::TooLong,
                                _ => DropReason::NoBuffer,
                            }),
                        ));
                    }
                }
            }
            q.clear();
            if let Some(TxError::Fault(f)) = out.stop {
                // The port is reset; the rest of its frames went nowhere.
                dp.report_fault(&p.shared, f.to_string());
            }
        }
        touched.clear();
    }
}

/// Records frames that reached no bridge in a running trace.
#[cold]
fn trace_unswitched(t: &Trace, w: usize, in_port: PortId, frames: &[RxFrame], why: DropReason) {
    for f in frames {
        if t.claim(in_port) {
            let mut r = TraceRecord::new(w, in_port, f.len);
            if let Ok(l2) = parse_l2(f) {
                r.src = l2.src;
                r.dst = l2.dst;
                r.tag = l2.tagged.then_some(l2.vid);
            }
            r.drop = Some(why);
            t.record(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::dataplane::PortShared;
    use crate::queue::{PortQueues, TxQueue};
    use crate::switch::security::PortSecurity;
    use crate::vlan::VlanMode;

    /// A transmit queue that records the destination MAC of what it sends.
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl TxQueue for Sink {
        fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
            let mut b = [0u8; 6];
            let mut r = frame.reader();
            // SAFETY: `b` has room for the 6 bytes asked for.
            unsafe { r.copy_to(b.as_mut_ptr(), 6) };
            self.0.lock().unwrap().push(b[5]);
            Ok(())
        }

        fn flush(&mut self) {}
    }

    /// A transmit queue with room for `room` more frames, taking none
    /// longer than `max_len`; records the length of what it sends.
    struct Limited {
        log: Arc<Mutex<Vec<usize>>>,
        room: usize,
        max_len: usize,
    }

    impl TxQueue for Limited {
        fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
            if frame.len() > self.max_len {
                return Err(TxError::TooLong);
            }
            if self.room == 0 {
                return Err(TxError::Full);
            }
            self.room -= 1;
            self.log.lock().unwrap().push(frame.len());
            Ok(())
        }

        fn flush(&mut self) {}
    }

    fn mac(last: u8) -> MacAddr {
        MacAddr([2, 0, 0, 0, 0, last])
    }

    /// A transmit queue that logs its copies and flushes, as `tx NAME`
    /// and `flush NAME`.
    struct Events(Arc<Mutex<Vec<String>>>, &'static str);

    impl TxQueue for Events {
        fn tx(&mut self, _: &TxFrame<'_>) -> Result<(), TxError> {
            self.0.lock().unwrap().push(format!("tx {}", self.1));
            Ok(())
        }

        fn flush(&mut self) {
            self.0.lock().unwrap().push(format!("flush {}", self.1));
        }
    }

    /// Forwards `bufs` as one burst received on port `inp`, through a
    /// fresh view and forwarder.
    fn forward_bufs(dp: &Dataplane, inp: PortId, bufs: &[Vec<u8>]) {
        forward_bufs_then(dp, inp, bufs, || {});
    }

    /// [`forward_bufs`] by worker `w`, as received on queue `queue`.
    fn forward_on(dp: &Dataplane, w: usize, port: PortId, queue: usize, bufs: &[Vec<u8>]) {
        forward_from(dp, w, Ingress { port, queue }, bufs, || {});
    }

    /// [`forward_bufs`], with `release` as the burst's release.
    fn forward_bufs_then(dp: &Dataplane, inp: PortId, bufs: &[Vec<u8>], release: impl FnOnce()) {
        let from = Ingress {
            port: inp,
            queue: 0,
        };
        forward_from(dp, 0, from, bufs, release);
    }

    /// Worker `w` forwards `bufs` received from `from` through a fresh view.
    fn forward_from(
        dp: &Dataplane,
        w: usize,
        from: Ingress,
        bufs: &[Vec<u8>],
        release: impl FnOnce(),
    ) {
        let frames: Vec<RxFrame> = bufs
            .iter()
            .map(|b| {
                let mut f = RxFrame::default();
                // SAFETY: `bufs` outlives the frames, which are dropped
                // before this returns.
                assert!(unsafe { f.push(b.as_ptr(), b.len() as u32) });
                f
            })
            .collect();
        let mut view = WorkerView::default();
        dp.build_view(w, &mut view);
        let mut fwd = Forwarder::default();
        fwd.resize(&view);
        fwd.forward_burst(dp, &view, w, from, &frames, release);
    }

    /// A data plane with one bridge and its port `in`.
    fn one_bridge() -> (Dataplane, BridgeId, PortId, Arc<PortShared>) {
        let dp = Dataplane::new(1).unwrap();
        let br = dp.add_bridge(64);
        let (inp, in_shared) = add(&dp, br, "in");
        (dp, br, inp, in_shared)
    }

    /// Adds port `name` to bridge `br`, untagged and unsecured.
    fn add(dp: &Dataplane, br: BridgeId, name: &str) -> (PortId, Arc<PortShared>) {
        dp.add_port(
            name,
            Some(br),
            VlanMode::default(),
            &PortSecurity::default(),
        )
    }

    /// Learns `mac(last)` behind `port` in bridge `br`, seen now.
    fn learn(dp: &Dataplane, br: BridgeId, last: u8, port: PortId) {
        let entry = MacEntry {
            port,
            port_gen: 1,
            last_seen: dp.now_secs(),
            pinned: false,
        };
        dp.mac_table(br).unwrap().learn(mac(last), 0, entry, 0);
    }

    fn frame(dst: u8, src: u8) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[0..6].copy_from_slice(&mac(dst).0);
        f[6..12].copy_from_slice(&mac(src).0);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f
    }

    #[test]
    fn repeated_addresses_in_a_burst_go_where_the_table_says() {
        let (dp, br, inp, in_shared) = one_bridge();
        let mut sent = Vec::new();
        let mut ports = Vec::new();
        for name in ["p1", "p2"] {
            let (id, _) = add(&dp, br, name);
            let log = Arc::new(Mutex::new(Vec::new()));
            dp.attach_queues(
                id,
                PortQueues {
                    rx: vec![],
                    tx: vec![Box::new(Sink(log.clone()))],
                },
            );
            sent.push(log);
            ports.push(id);
        }
        dp.attach_queues(
            inp,
            PortQueues {
                rx: vec![],
                tx: vec![Box::new(Sink(Arc::new(Mutex::new(Vec::new()))))],
            },
        );
        let table = dp.mac_table(br).unwrap();
        // 0x0b behind p1, 0x0c behind p2, 0x0e behind the sender's own port.
        learn(&dp, br, 0x0b, ports[0]);
        learn(&dp, br, 0x0c, ports[1]);
        learn(&dp, br, 0x0e, inp);
        let run = |pairs: &[(u8, u8)]| {
            let bufs: Vec<Vec<u8>> = pairs.iter().map(|&(d, s)| frame(d, s)).collect();
            forward_bufs(&dp, inp, &bufs);
            let out: Vec<Vec<u8>> = sent
                .iter()
                .map(|l| std::mem::take(&mut *l.lock().unwrap()))
                .collect();
            out
        };
        // Runs of one destination, a change, a hairpin among them, and a
        // source that changes: each frame as if alone.
        let out = run(&[
            (0x0b, 0x0a),
            (0x0b, 0x0a),
            (0x0c, 0x0a),
            (0x0e, 0x0a),
            (0x0b, 0x0a),
            (0x0b, 0x0d),
            (0x0c, 0x0d),
        ]);
        assert_eq!(out[0], [0x0b, 0x0b, 0x0b, 0x0b]);
        assert_eq!(out[1], [0x0c, 0x0c]);
        assert_eq!(in_shared.totals().drops[DropReason::Hairpin.name()], 1);
        // Both sources were learned on the sender's port.
        for src in [0x0a, 0x0d] {
            assert_eq!(table.lookup(mac(src), 0).map(|e| e.port), Some(inp));
        }
        // The table changes between bursts: the next burst follows it.
        learn(&dp, br, 0x0b, ports[1]);
        let out = run(&[(0x0b, 0x0a), (0x0b, 0x0a)]);
        assert!(out[0].is_empty());
        assert_eq!(out[1], [0x0b, 0x0b]);
    }

    #[test]
    fn a_source_known_but_stale_moved_or_pinned_takes_the_full_admission() {
        let (dp, br, inp, in_shared) = one_bridge();
        let (other, _) = add(&dp, br, "other");
        let table = dp.mac_table(br).unwrap();
        let stats = dp.bridge_stats(br).unwrap();
        let now = dp.now_secs();
        let at = |port, last_seen| MacEntry {
            port,
            port_gen: 1,
            last_seen,
            pinned: false,
        };
        // Fresh on this port: known, nothing written or counted.
        table.learn(mac(0x0a), 0, at(inp, now), 0);
        forward_bufs(&dp, inp, &[frame(0xff, 0x0a)]);
        assert_eq!(table.lookup(mac(0x0a), 0), Some(at(inp, now)));
        assert_eq!(stats.totals().learned, 0);
        // Seen at another time on this port: refreshed to now.
        table.learn(mac(0x0a), 0, at(inp, now.wrapping_add(7)), 0);
        forward_bufs(&dp, inp, &[frame(0xff, 0x0a)]);
        assert_eq!(table.lookup(mac(0x0a), 0), Some(at(inp, now)));
        // Behind another port, quiet for longer than the hold: moves.
        dp.set_mac_move_hold(0);
        table.learn(mac(0x0a), 0, at(other, now), 0);
        forward_bufs(&dp, inp, &[frame(0xff, 0x0a)]);
        assert_eq!(table.lookup(mac(0x0a), 0).map(|e| e.port), Some(inp));
        assert_eq!(stats.totals().moved, 1);
        // An entry of the port's slot from before it was reused (another
        // generation) is not the port's: learned anew.
        table.learn(
            mac(0x0c),
            0,
            MacEntry {
                port_gen: 2,
                ..at(inp, now)
            },
            0,
        );
        forward_bufs(&dp, inp, &[frame(0xff, 0x0c)]);
        assert_eq!(table.lookup(mac(0x0c), 0), Some(at(inp, now)));
        // Pinned to this port: known as well, and stays pinned.
        let pinned = MacEntry {
            pinned: true,
            ..at(inp, now)
        };
        table.pin(mac(0x0d), 0, pinned);
        forward_bufs(&dp, inp, &[frame(0xff, 0x0d)]);
        assert_eq!(table.lookup(mac(0x0d), 0), Some(pinned));
        assert_eq!(in_shared.totals().drops.values().sum::<u64>(), 0);
    }

    #[test]
    fn frames_a_destination_refuses_are_counted_by_reason() {
        let (dp, br, inp, _) = one_bridge();
        let (out, out_shared) = add(&dp, br, "out");
        let log = Arc::new(Mutex::new(Vec::new()));
        dp.attach_queues(
            out,
            PortQueues {
                rx: vec![],
                tx: vec![Box::new(Limited {
                    log: log.clone(),
                    room: 2,
                    max_len: 80,
                })],
            },
        );
        learn(&dp, br, 0x0b, out);
        // 60, 100 (too long), 60 (the last there is room for), 70, 60.
        let bufs: Vec<Vec<u8>> = [60usize, 100, 60, 70, 60]
            .iter()
            .map(|&n| {
                let mut f = frame(0x0b, 0x0a);
                f.resize(n, 0);
                f
            })
            .collect();
        forward_bufs(&dp, inp, &bufs);
        // The too-long frame is skipped, the queue fills after the third.
        assert_eq!(*log.lock().unwrap(), [60, 60]);
        let t = out_shared.totals();
        assert_eq!((t.tx_packets, t.tx_bytes), (2, 120));
        assert_eq!(t.drops[DropReason::TooLong.name()], 1);
        assert_eq!(t.drops[DropReason::NoBuffer.name()], 2);
    }

    #[test]
    fn a_burst_is_released_once_after_its_last_copy_and_before_the_last_flush() {
        let (dp, br, inp, _) = one_bridge();
        let log = Arc::new(Mutex::new(Vec::new()));
        for name in ["p1", "p2"] {
            let (id, _) = add(&dp, br, name);
            dp.attach_queues(
                id,
                PortQueues {
                    rx: vec![],
                    tx: vec![Box::new(Events(log.clone(), name))],
                },
            );
        }
        let release = |log: &Arc<Mutex<Vec<String>>>| {
            let log = log.clone();
            move || log.lock().unwrap().push("release".into())
        };
        // Flooded to both: the first destination is flushed as usual, the
        // last only after the burst is given back.
        forward_bufs_then(&dp, inp, &[frame(0x0b, 0x0a)], release(&log));
        let events = std::mem::take(&mut *log.lock().unwrap());
        assert_eq!(
            events,
            ["tx p1", "flush p1", "tx p2", "release", "flush p2"]
        );
        // A burst no destination takes (a hairpin) is released all the same.
        learn(&dp, br, 0x0e, inp);
        forward_bufs_then(&dp, inp, &[frame(0x0e, 0x0a)], release(&log));
        assert_eq!(*log.lock().unwrap(), ["release"]);
    }

    #[test]
    fn the_receive_queue_picks_the_transmit_queue_among_the_workers_own() {
        // Two workers; "out" has four transmit queues (each worker owns
        // two: 0 and 2, 1 and 3), "one" a single queue both share.
        let dp = Dataplane::new(2).unwrap();
        let br = dp.add_bridge(64);
        let (inp, _) = add(&dp, br, "in");
        let attach = |name: &str, queues: usize| {
            let (id, _) = add(&dp, br, name);
            let logs: Vec<_> = (0..queues)
                .map(|_| Arc::new(Mutex::new(Vec::new())))
                .collect();
            let tx = logs
                .iter()
                .map(|l| Box::new(Sink(l.clone())) as Box<dyn TxQueue>)
                .collect();
            dp.attach_queues(id, PortQueues { rx: vec![], tx });
            logs
        };
        let out = attach("out", 4);
        let one = attach("one", 1);
        // Flooded: every frame reaches both ports.
        let sent = |logs: &[Arc<Mutex<Vec<u8>>>]| -> Vec<usize> {
            logs.iter()
                .map(|l| std::mem::take(&mut *l.lock().unwrap()).len())
                .collect()
        };
        let cases = [
            // (worker, receive queue, frames per queue of "out")
            (0, 0, [1, 0, 0, 0]),
            (0, 1, [0, 0, 1, 0]),
            (0, 2, [1, 0, 0, 0]),
            (1, 0, [0, 1, 0, 0]),
            (1, 1, [0, 0, 0, 1]),
            (1, 5, [0, 0, 0, 1]),
        ];
        for (w, q, want) in cases {
            forward_on(&dp, w, inp, q, &[frame(0xff, 0x0a)]);
            assert_eq!(sent(&out), want, "worker {w}, receive queue {q}");
            assert_eq!(sent(&one), [1], "worker {w}, receive queue {q}");
        }
    }
}
