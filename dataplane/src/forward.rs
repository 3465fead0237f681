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
use crate::queue::offload;
use crate::queue::{Offload, RxFrame, TxError, TxFrame, TxOutcome, TxQueue, BURST_SIZE};
use crate::switch::mac_table::{MacEntry, MacKey};
use crate::switch::neigh;
use crate::switch::policy::conntrack;
use crate::switch::policy::{Decision, Direction, FrameCheck, Judge};
use crate::switch::security::{self, Admitted};
use crate::types::{bump, BridgeId, DropReason, PortId};
use crate::wire::ethernet::{
    HeadWords, L2Head, ETHERTYPE_VLAN, HEADER_LEN, HEAD_LEN, VLAN_TAG_LEN,
};
use crate::wire::MacAddr;

mod police;
pub use police::police_rx;

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
    /// rewritten header, from the addresses read once ([`L2Head`]): the two, then
    /// (tag pushed) the new tag. A frame is either tagged (its tag may be
    /// popped) or not (one may be pushed, of its one VLAN), so one header
    /// serves every destination.
    hdrs: Vec<[u8; PUSHED_LEN]>,
    /// For each frame of the chunk that a bridge answers itself (an ARP
    /// request or a neighbour solicitation for a known neighbour), the
    /// reply sent back on its port in its place.
    replies: Vec<Reply>,
    /// The chunk's frames answered ([`Forwarder::replies`]): sent apart
    /// from the queued ones, before them.
    answers: Vec<u8>,
    /// While a trace runs: the records of the chunk's traced frames.
    traced: Vec<Option<TraceRecord>>,
    /// Headers of the segments of a frame cut in software.
    soft: offload::Scratch,
    /// The head of a frame of the chunk being switched that went to one
    /// port unchanged, its source known on the receiving port, and that
    /// port ([`Forwarder::switch_burst`]). Kept here rather than in
    /// registers, which a frame that misses it needs for its lookups.
    repeat: Repeat,
}

/// [`Forwarder::repeat`]: a head, and the port its frames go to.
#[derive(Clone, Copy)]
struct Repeat {
    head: L2Head,
    port: PortId,
}

impl Repeat {
    /// The empty entry: a head no frame has.
    const NONE: Repeat = Repeat {
        head: NO_HEAD,
        port: 0,
    };
}

impl Default for Repeat {
    fn default() -> Repeat {
        Repeat::NONE
    }
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

    /// Keeps the first `n` frames queued.
    fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n as u8);
    }
}

/// How a frame's VLAN tag changes on its way out (the tag a push writes is
/// in the frame's rewritten header, [`Forwarder::hdrs`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retag {
    /// Leaves as it came.
    Keep,
    /// Its tag is removed.
    Pop,
    /// A tag of its VLAN is pushed.
    Push,
}

/// A bridge's reply to a request it answers itself ([`neigh::answer`]):
/// the whole frame.
#[derive(Clone, Copy)]
struct Reply {
    bytes: [u8; neigh::REPLY_MAX],
    len: u8,
}

impl Reply {
    const EMPTY: Reply = Reply {
        bytes: [0; neigh::REPLY_MAX],
        len: 0,
    };
}

/// Notes policy decision `d`, made for port `p`, in trace record `t`.
#[cold]
fn describe(t: &mut TraceRecord, d: Decision, p: &ViewPort) {
    let text = match d {
        Decision::Exempt => return,
        Decision::Established => "established".to_string(),
        Decision::Rule {
            direction, rule, ..
        } => {
            let name = p
                .rules
                .as_deref()
                .and_then(|r| match direction {
                    Direction::Ingress => r.ingress.as_ref(),
                    Direction::Egress => r.egress.as_ref(),
                })
                .and_then(|s| s.name(rule))
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            format!(
                "{} of {}: rule {rule}{name}",
                direction.name(),
                p.shared.name
            )
        }
    };
    // A flood's egress rule is noted once.
    if !t.policy.contains(&text) {
        t.policy.push(text);
    }
}

/// Length of the header written in front of a frame whose tag is pushed:
/// the addresses and the new tag.
const PUSHED_LEN: usize = 12 + VLAN_TAG_LEN;

/// A frame's L2 facts ([`L2Head`], the one Ethernet parser in `wire/`):
/// read in place from its first segment, where that holds the head (the
/// usual frame), else from a copy of its first bytes. A frame too short for
/// its header is a runt.
#[inline]
fn parse_l2(frame: &RxFrame) -> Result<L2Head, DropReason> {
    let w = match frame.first_segment() {
        // SAFETY: the segment was bounds-checked against a live mapping
        // when it was pushed, and holds `HEAD_LEN` bytes at least.
        Some(s) if s.len() as usize >= HEAD_LEN => unsafe { HeadWords::load(s.ptr(), HEAD_LEN) },
        _ => head_copied(frame),
    };
    L2Head::decode(w, DropReason::Runt)
}

/// The head words of a frame whose first segment is shorter than
/// `HEAD_LEN` (a chain split early, or a runt), from a copy.
#[cold]
#[inline(never)]
fn head_copied(frame: &RxFrame) -> HeadWords {
    let mut copy = [0u8; HEAD_LEN];
    let n = frame.read_prefix(&mut copy);
    // SAFETY: `copy` is our own `HEAD_LEN` bytes.
    unsafe { HeadWords::load(copy.as_ptr(), n) }
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

/// One burst being switched: what is the same for each of its frames.
struct Burst<'a> {
    dp: &'a Dataplane,
    view: &'a WorkerView,
    /// The worker.
    w: usize,
    /// The port and receive queue it came from, and that port's view.
    from: Ingress,
    inp: &'a ViewPort,
    /// The bridge it is switched in.
    bridge_id: BridgeId,
    bridge: &'a ViewBridge,
    /// The trace that may claim its frames.
    trace: Option<&'a Trace>,
    /// The clock in seconds, and how long a MAC must be quiet on its port
    /// before it moves ([`Dataplane::mac_move_hold`]).
    now: u32,
    hold: u32,
}

/// A frame about to be queued on a destination: its index in the burst,
/// its headers and the VLAN it is in inside the bridge. (The head is held
/// by value, so that the usual frame's stays in registers.)
struct Queued {
    i: usize,
    l2: L2Head,
    domain: u16,
}

/// A head no frame has (its VLAN id is wider than a tag's 12 bits): the
/// empty one-entry cache of [`Forwarder::switch_burst`].
const NO_HEAD: L2Head = L2Head {
    dst: u64::MAX,
    src: u64::MAX,
    tagged: true,
    vid: u16::MAX,
};

/// The full admission of a source that the fast checks did not find
/// known (new, moved, refreshed once a second, or sent by a port that pins
/// its sources): learns it, counts what changed in the bridge's counters of
/// the burst's worker and notes it in the frame's trace record. `Ok(true)`: known
/// on this port, nothing written; `Err`: why the frame is dropped (noted
/// in the record, not counted). Out of line, so that the per-frame loop
/// keeps its registers for the usual case.
#[cold]
#[inline(never)]
fn admit<'a>(
    b: &Burst<'_>,
    src: MacAddr,
    domain: u16,
    owner: &impl Fn(&MacEntry) -> Option<&'a security::SecurityState>,
    traced: Option<&mut TraceRecord>,
) -> Result<bool, DropReason> {
    let admitted = security::admit_source(
        &b.bridge.macs,
        &b.inp.shared.security,
        src,
        domain,
        seen_now(b.from.port, b.inp, b.now),
        b.hold,
        owner,
    );
    let counters = b.bridge.stats.counters(b.w);
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
        self.replies = vec![Reply::EMPTY; BURST_SIZE];
        self.answers = Vec::with_capacity(BURST_SIZE);
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
            let (bridge_id, bridge) = bridge;
            let mut b = Burst {
                dp,
                view,
                w,
                from,
                inp,
                bridge_id,
                bridge,
                trace: None,
                now: dp.now_secs(),
                hold: dp.mac_move_hold(),
            };
            // A bridge with a port under L3/L4 policy has its frames
            // judged (and a trace runs the checks, which find no rules in
            // a bridge without); the others pay one test per burst.
            match (HOOKS, &view.trace) {
                (true, Some(t)) => {
                    b.trace = Some(t);
                    self.switch_burst::<true, true, true, _>(&b, frames, r)
                }
                _ if bridge.policed => self.switch_policed::<HOOKS, _>(&b, frames, r),
                _ => self.switch_burst::<HOOKS, false, false, _>(&b, frames, r),
            }
        }
        if let Some(r) = release {
            r();
        }
    }

    /// [`Forwarder::switch_burst`] with L3/L4 policy, out of line: the
    /// bridges without policy keep the code they had.
    #[inline(never)]
    fn switch_policed<const HOOKS: bool, R: FnOnce()>(
        &mut self,
        b: &Burst<'_>,
        frames: &[RxFrame],
        release: &mut Option<R>,
    ) {
        self.switch_burst::<HOOKS, false, true, R>(b, frames, release)
    }

    /// Learns, looks up and sends burst `b`'s frames in its bridge; with
    /// `TRACE`, fills a record for each frame its trace claims. `release`
    /// goes to the last chunk's sending.
    #[inline(always)]
    fn switch_burst<const HOOKS: bool, const TRACE: bool, const POLICY: bool, R: FnOnce()>(
        &mut self,
        b: &Burst<'_>,
        frames: &[RxFrame],
        release: &mut Option<R>,
    ) {
        let Burst {
            dp,
            view,
            w,
            from,
            inp,
            bridge_id,
            bridge,
            trace,
            now,
            ..
        } = *b;
        let in_port = from.port;
        let in_counters = inp.shared.counters(w);
        let bridge_counters = bridge.stats.counters(w);
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
            // The head of a frame of this chunk that went to one port
            // unchanged, its source known on the receiving port, and that
            // port: a frame with the same head (addresses, tag) is decided
            // the same way without a look at the tables, the VLANs or the
            // port (a burst is mostly one conversation: OVS's exact-match
            // cache, for one entry and one burst). A source admitted in
            // full empties it (learning may move an address).
            self.repeat = Repeat::NONE;
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
                if !TRACE && !POLICY && l2 == self.repeat.head {
                    if let Some(q) = self.pending.get_mut(self.repeat.port as usize) {
                        q.push(Pending {
                            frame: i as u8,
                            tag: Retag::Keep,
                        });
                    }
                    continue;
                }
                note!(|t| {
                    t.src = l2.src_mac();
                    t.dst = l2.dst_mac();
                    t.tag = l2.tagged.then_some(l2.vid);
                });
                // The VLAN this frame belongs to inside the bridge.
                let Some(domain) = inp.vlan.ingress(l2.vid) else {
                    bump(&in_counters.drops[DropReason::VlanFiltered as usize], 1);
                    note!(|t| t.drop = Some(DropReason::VlanFiltered));
                    continue;
                };
                note!(|t| t.vlan = Some(domain));
                // L3/L4 policy: what was read of the frame and found in
                // the connection table, once for all its steps.
                let mut check = FrameCheck::default();
                let judge = Judge {
                    conntrack: dp.conntrack(),
                    zone: conntrack::zone(bridge_id, domain),
                    now,
                };
                if POLICY {
                    if let Some(r) = inp.rules.as_deref() {
                        let read = |b: &mut [u8]| frame.read_prefix(b);
                        if let Err(r) = judge.from_port(&mut check, read, r) {
                            bump(&in_counters.drops[r as usize], 1);
                            note!(|t| t.drop = Some(r));
                            continue;
                        }
                    }
                }
                let src_key = MacKey::from_wire(l2.src, domain);
                if l2.src_multicast() {
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
                    self.repeat = Repeat::NONE;
                    match admit(b, l2.src_mac(), domain, &owner, traced) {
                        Err(r) => {
                            bump(&in_counters.drops[r as usize], 1);
                            continue;
                        }
                        Ok(true) => known_src = src_key,
                        Ok(false) => {}
                    }
                }
                let mut unicast = None;
                // A conversation's second frame (its destination cached,
                // its source known) makes the entry the rest of it hits, if
                // it is sent unchanged (below).
                let mut repeats = false;
                let dst_key = MacKey::from_wire(l2.dst, domain);
                if !TRACE && last_dst.1.is_some() && dst_key == last_dst.0 {
                    unicast = last_dst.1;
                    repeats = known_src == src_key;
                } else if !l2.dst_multicast() {
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
                            if p.member == ViewPort::membership(bridge_id, port_gen) {
                                if inp.split_horizon && p.split_horizon {
                                    // From one tunnel to another: the
                                    // remote end sends there itself.
                                    bump(&in_counters.drops[DropReason::Hairpin as usize], 1);
                                    note!(|t| {
                                        t.lookup = TraceLookup::Unicast(port);
                                        t.drop = Some(DropReason::Hairpin);
                                    });
                                    continue;
                                }
                                unicast = Some((port, p));
                                last_dst = (dst_key, unicast);
                            }
                        }
                    }
                }
                let f = Queued { i, l2, domain };
                // The policy of the port the frame goes to, and the
                // connection it opens: `false` when it may not go there
                // (counted and noted).
                let mut allowed = |id: PortId, p: &ViewPort, traced: &mut Option<TraceRecord>| {
                    if !POLICY || (inp.rules.is_none() && p.rules.is_none()) {
                        return true;
                    }
                    // Not a member of its VLAN, or down: the frame does not
                    // go there, and policy has nothing to say (queue counts
                    // it).
                    if p.tx.is_none() || p.vlan.egress(domain).is_none() {
                        return true;
                    }
                    let read = |b: &mut [u8]| frame.read_prefix(b);
                    // A connection is charged to the station's port whose
                    // it is: the share of those it opened, if it came in
                    // on a station's port (with rules), else (from an
                    // uplink or a tunnel, shared by many) the share of
                    // those opened towards the port it goes to, apart, so
                    // that others' cannot take a pod's own. A flood opens
                    // none.
                    let (quota, share) = if inp.rules.is_some() {
                        (inp, &inp.shared.conntrack)
                    } else {
                        (p, &p.shared.conntrack_in)
                    };
                    let at = |id, generation| conntrack::PortRef { id, generation };
                    let ends = (
                        (at(in_port, inp.generation), inp.rules.as_deref()),
                        (at(id, p.generation), p.rules.as_deref()),
                    );
                    let share = unicast.is_some().then_some(share);
                    // The source, if the bridge has it on this port (asked
                    // only of a packet that opens a connection).
                    let src = || {
                        let e = bridge.macs.get(src_key)?;
                        let here = e.port() == in_port && e.port_gen() == inp.generation;
                        here.then(|| l2.src_mac())
                    };
                    match judge.to_port(&mut check, read, ends.0, ends.1, share, src) {
                        Ok(v) => {
                            if let Some(t) = traced.as_mut().filter(|_| TRACE) {
                                describe(t, v.egress, inp);
                                describe(t, v.ingress, p);
                            }
                            true
                        }
                        Err(r) => {
                            // Counted on the port whose policy refused it (a
                            // flood's egress once), a full table on the one
                            // whose share it is.
                            let at = match r {
                                DropReason::ConntrackFull => Some(quota),
                                DropReason::PolicyEgress => {
                                    check.count_egress_drop().then_some(inp)
                                }
                                _ => Some(p),
                            };
                            if let Some(at) = at {
                                bump(&at.shared.counters(w).drops[r as usize], 1);
                            }
                            if let Some(t) = traced.as_mut().filter(|_| TRACE) {
                                t.out.push((id, Err(r)));
                            }
                            false
                        }
                    }
                };
                match unicast {
                    Some((id, p)) => {
                        note!(|t| t.lookup = TraceLookup::Unicast(id));
                        if POLICY && !allowed(id, p, &mut self.traced[i]) {
                            continue;
                        }
                        // (A frame of another head that is not sent
                        // unchanged leaves the entry as it is: what
                        // decided it, the view's ports and VLANs, holds
                        // for the burst.)
                        if self.queue::<TRACE>(w, (id, p), &f, true) && repeats {
                            self.repeat = Repeat { head: l2, port: id };
                        }
                    }
                    None => {
                        // An overlay bridge answers for the neighbours it
                        // knows, asked from a port of this node (a tunnel's
                        // remote end asks its own switch).
                        if bridge.neigh.is_some()
                            && self.answer::<TRACE>(b, frame, l2.dst_multicast(), domain, i)
                        {
                            continue;
                        }
                        if !inp
                            .shared
                            .security
                            .may_flood(&in_counters.flood_window, now)
                        {
                            bump(&in_counters.drops[DropReason::FloodLimit as usize], 1);
                            note!(|t| t.drop = Some(DropReason::FloodLimit));
                            continue;
                        }
                        bump(&bridge_counters.flooded, 1);
                        note!(|t| {
                            t.lookup = if l2.dst_multicast() {
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
                                if inp.split_horizon && p.split_horizon {
                                    continue;
                                }
                                if POLICY && !allowed(id, p, &mut self.traced[i]) {
                                    continue;
                                }
                                self.queue::<TRACE>(w, (id, p), &f, false);
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
            if !self.answers.is_empty() {
                self.send_answers::<HOOKS>(b, chunk);
            }
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

    /// The bridge's reply to frame `i` of the chunk (`frame`, of VLAN
    /// domain `domain`, to a group address if `group`) of burst `b`, if it
    /// is a request for one of the bridge's neighbours from a port of this
    /// node: queued back on that port in its place, counted and traced.
    /// Out of line: only frames a bridge with neighbours would flood come
    /// here.
    #[inline(never)]
    #[cold]
    fn answer<const TRACE: bool>(
        &mut self,
        b: &Burst<'_>,
        frame: &RxFrame,
        group: bool,
        domain: u16,
        i: usize,
    ) -> bool {
        let p = b.inp;
        // A tunnel's remote end asks its own switch.
        let Some(n) = b
            .bridge
            .neigh
            .as_deref()
            .filter(|_| group && !p.split_horizon)
        else {
            return false;
        };
        let mut head = [0u8; neigh::READ_LEN];
        let got = frame.read_prefix(&mut head);
        let r = &mut self.replies[i];
        let Some(len) = neigh::answer(n, domain, &head[..got], &mut r.bytes) else {
            return false;
        };
        if p.tx.is_none() {
            return false;
        }
        r.len = len as u8;
        self.answers.push(i as u8);
        bump(&b.bridge.stats.counters(b.w).answered, 1);
        if TRACE {
            if let Some(t) = self.traced[i].as_mut() {
                t.lookup = TraceLookup::Answered;
            }
        }
        true
    }

    /// Sends the chunk's answers ([`Forwarder::answers`]) back on the port
    /// burst `b` came from (the receive queue's transmit queue, as any
    /// frame to it), before the queued frames.
    #[inline(never)]
    #[cold]
    fn send_answers<const HOOKS: bool>(&mut self, b: &Burst<'_>, chunk: &[RxFrame]) {
        let p = b.inp;
        let counters = p.shared.counters(b.w);
        let Some(tx) = p
            .tx_for(b.from.queue)
            .filter(|_| !Dataplane::faulted(&p.shared))
        else {
            bump(
                &counters.drops[DropReason::LinkDown as usize],
                self.answers.len() as u64,
            );
            self.answers.clear();
            return;
        };
        let mut txfs = [const { MaybeUninit::<TxFrame>::uninit() }; BURST_SIZE];
        let n = self.answers.len().min(BURST_SIZE);
        for (txf, &i) in txfs[..n].iter_mut().zip(&self.answers) {
            let (frame, r) = (&chunk[usize::from(i)], &self.replies[usize::from(i)]);
            // Made here whole (none of the request's bytes follow): no
            // work left on it.
            txf.write(
                TxFrame::rewritten(frame, &r.bytes[..usize::from(r.len)], frame.len)
                    .with_offload(Offload::NONE),
            );
        }
        // SAFETY: the loop wrote `txfs[..n]`, and `n <= BURST_SIZE`;
        // `MaybeUninit<TxFrame>` has `TxFrame`'s layout.
        let txfs: &[TxFrame] =
            unsafe { std::slice::from_raw_parts(txfs.as_ptr().cast::<TxFrame>(), n) };
        let cap = if HOOKS {
            p.capture.as_deref().filter(|c| c.wants_tx())
        } else {
            None
        };
        let out = tx.with(|txq| {
            let out = txq.tx_burst(txfs);
            txq.flush();
            out
        });
        if let Some(c) = cap {
            capture_sent(c, txfs, out.sent, capture::now());
        }
        let (mut packets, mut bytes) = (0u64, 0u64);
        for (k, txf) in txfs.iter().enumerate() {
            match out.of(k) {
                Some(Ok(())) => {
                    packets += 1;
                    bytes += txf.len() as u64;
                }
                Some(Err(e)) => bump(&counters.drops[tx_drop(e) as usize], 1),
                None => {}
            }
        }
        bump(&counters.tx_packets, packets);
        bump(&counters.tx_bytes, bytes);
        self.answers.clear();
        if let Some(TxError::Fault(f)) = out.stop {
            b.dp.report_fault(&p.shared, f.to_string());
        }
    }

    /// Queues frame `f` on port `id` of the bridge (worker `w`), with the
    /// VLAN rewrite it needs there; `unicast`: its one destination. True
    /// when it was queued as it came (no rewrite).
    #[inline(always)]
    fn queue<const TRACE: bool>(
        &mut self,
        w: usize,
        (id, p): (PortId, &ViewPort),
        f: &Queued,
        unicast: bool,
    ) -> bool {
        let Queued { i, l2, domain } = *f;
        let Some(out_tagged) = p.vlan.egress(domain) else {
            return false; // not a member of this VLAN
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
            return false;
        }
        let Some(q) = self.pending.get_mut(id as usize) else {
            return false;
        };
        let tag = if l2.tagged == out_tagged {
            Retag::Keep
        } else {
            // The rewrite's header comes from the frame's facts.
            Self::rewrite(&mut self.hdrs[i], l2.dst, l2.src, l2.tagged, domain)
        };
        if q.is_empty() {
            self.touched.push(id);
        }
        q.push(Pending {
            frame: i as u8,
            tag,
        });
        tag == Retag::Keep
    }

    /// Writes the header a frame leaves with where its tag changes (tagged
    /// in, untagged out or the other way round) into `hdr`: its addresses
    /// (`dst`, `src`, as [`L2Head`] holds them) and, if it came untagged,
    /// the tag of VLAN `domain`. (Taken as numbers, not as the head, which
    /// would go through memory on every frame's way.)
    #[cold]
    #[inline(never)]
    fn rewrite(hdr: &mut [u8; PUSHED_LEN], dst: u64, src: u64, tagged: bool, domain: u16) -> Retag {
        let head = L2Head {
            dst,
            src,
            tagged,
            vid: 0,
        };
        hdr[..12].copy_from_slice(&head.addrs());
        if tagged {
            return Retag::Pop;
        }
        hdr[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        hdr[14..16].copy_from_slice(&(domain & 0x0fff).to_be_bytes());
        Retag::Push
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
            soft,
            ..
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
            // A port limited in what it receives: the frames its policer
            // passes, in order (one test a destination for the others).
            if let Some(pol) = &p.policers.tx {
                let traced = if TRACE { Some(&mut traced[..]) } else { None };
                if police::tx(pol, dp, w, (id, p), q, frames, traced) == 0 {
                    q.clear();
                    continue;
                }
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
            // The offload words of the frames OR-ed: whether any has work
            // left is tested once, after the loop.
            let mut work = Offload::NONE;
            let queued = q.as_slice();
            let n = queued.len().min(BURST_SIZE);
            for (txf, e) in txfs[..n].iter_mut().zip(&queued[..n]) {
                let frame = &frames[usize::from(e.frame)];
                work = work.or(frame.offload);
                all_bytes += u64::from(if e.tag == Retag::Keep {
                    txf.write(TxFrame::plain(frame));
                    frame.len
                } else {
                    let hdr = &hdrs[usize::from(e.frame)];
                    txf.write(match e.tag {
                        Retag::Pop => TxFrame::rewritten(
                            frame,
                            &hdr[..12],
                            (HEADER_LEN + VLAN_TAG_LEN - 2) as u32,
                        ),
                        _ => TxFrame::rewritten(frame, hdr, 12),
                    })
                    .len() as u32
                });
            }
            // SAFETY: the loop wrote `txfs[..n]`, and `n <= BURST_SIZE`;
            // `MaybeUninit<TxFrame>` has `TxFrame`'s layout.
            let txfs: &[TxFrame] =
                unsafe { std::slice::from_raw_parts(txfs.as_ptr().cast::<TxFrame>(), n) };
            let (out, sent) = tx.with(|txq| {
                let (out, sent) = if work.needs_work() {
                    let (out, sent) = send_finishing(txq, txfs, soft);
                    (out, Some(sent))
                } else {
                    (txq.tx_burst(txfs), None)
                };
                if k == last {
                    // The last destination's copies are captured before the
                    // source's buffers go back to its peer, who may write
                    // them at once.
                    if let Some(c) = cap {
                        capture_sent(c, txfs, out.sent, ts);
                    }
                    if let Some(r) = release.take() {
                        r();
                    }
                }
                txq.flush();
                (out, sent)
            });
            let (packets, bytes) = if out.sent == ((1u64 << txfs.len()) - 1) as u32 {
                (u64::from(out.sent.count_ones()), all_bytes)
            } else {
                // Some did not go: counted apart.
                let (mut bytes, mut too_long, mut no_buffer, mut bad) = (0u64, 0u64, 0u64, 0u64);
                for (i, txf) in txfs.iter().enumerate() {
                    match out.of(i) {
                        Some(Ok(())) => bytes += txf.len() as u64,
                        Some(Err(TxError::TooLong)) => too_long += 1,
                        Some(Err(TxError::Unfinished)) => bad += 1,
                        Some(Err(_)) => no_buffer += 1,
                        None => {}
                    }
                }
                bump(&counters.drops[DropReason::TooLong as usize], too_long);
                bump(&counters.drops[DropReason::NoBuffer as usize], no_buffer);
                bump(&counters.drops[DropReason::BadOffload as usize], bad);
                (u64::from(out.sent.count_ones()), bytes)
            };
            // What software segmentation sent is counted as it left.
            let (packets, bytes) = sent.unwrap_or((packets, bytes));
            if packets != 0 {
                bump(&counters.tx_packets, packets);
                bump(&counters.tx_bytes, bytes);
            }
            if let Some(c) = cap.filter(|_| k != last) {
                capture_sent(c, txfs, out.sent, ts);
            }
            if TRACE {
                for (i, e) in q.as_slice().iter().enumerate() {
                    let Some(t) = traced[usize::from(e.frame)].as_mut() else {
                        continue;
                    };
                    if let Some(r) = out.of(i) {
                        t.out.push((id, r.map_err(tx_drop)));
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

/// Why a frame a transmit queue did not take is dropped: too long for the
/// peer, work left on it that nothing can finish, else no room.
fn tx_drop(e: TxError) -> DropReason {
    match e {
        TxError::TooLong => DropReason::TooLong,
        TxError::Unfinished => DropReason::BadOffload,
        _ => DropReason::NoBuffer,
    }
}

/// [`TxQueue::tx_burst`] for a burst in which some frames have checksum or
/// segmentation work left: those whose work the queue's peer does not
/// take over are finished in software ([`offload::finish`]) and sent as
/// the frames that makes; the others go as they are, in order. Returns the
/// outcome per frame of `frames`, and how many frames and bytes went out
/// in all (software's segments counted as they left).
#[cold]
#[inline(never)]
fn send_finishing(
    txq: &mut dyn TxQueue,
    frames: &[TxFrame<'_>],
    scratch: &mut offload::Scratch,
) -> (TxOutcome, (u64, u64)) {
    let caps = txq.offloads();
    let mut out = TxOutcome {
        sent: 0,
        tried: 0,
        stop: None,
        unfinished: 0,
    };
    // Frames and bytes that left.
    let mut total = (0u64, 0u64);
    let mut i = 0;
    while i < frames.len() {
        // A run of frames that go as they are.
        let run = frames[i..]
            .iter()
            .take_while(|f| !f.offload.needs_work() || caps.accepts(&f.offload))
            .count();
        if run > 0 {
            let o = txq.tx_burst(&frames[i..i + run]);
            for j in 0..o.tried {
                if o.sent & (1 << j) != 0 {
                    total.0 += 1;
                    total.1 += frames[i + j].len() as u64;
                }
            }
            out.sent |= o.sent << i;
            out.tried = i + o.tried;
            if o.stop.is_some() {
                out.stop = o.stop;
                return (out, total);
            }
            i += run;
            continue;
        }
        let f = &frames[i];
        let done = offload::finish(f, scratch, |segs| txq.tx_burst(segs));
        out.tried = i + 1;
        match done {
            Ok(d) => {
                total.0 += u64::from(d.frames);
                total.1 += d.bytes;
                match d.result {
                    Ok(()) => out.sent |= 1 << i,
                    Err(TxError::TooLong) => {}
                    Err(e) => {
                        out.tried = i;
                        out.stop = Some(e);
                        return (out, total);
                    }
                }
            }
            Err(offload::Unfinished::BadOffload) => out.unfinished |= 1 << i,
        }
        i += 1;
    }
    (out, total)
}

/// Records frames that reached no bridge in a running trace.
#[cold]
fn trace_unswitched(t: &Trace, w: usize, in_port: PortId, frames: &[RxFrame], why: DropReason) {
    for f in frames {
        if t.claim(in_port) {
            let mut r = TraceRecord::new(w, in_port, f.len);
            if let Ok(l2) = parse_l2(f) {
                r.src = l2.src_mac();
                r.dst = l2.dst_mac();
                r.tag = l2.tagged.then_some(l2.vid);
            }
            r.drop = Some(why);
            t.record(r);
        }
    }
}

/// Hands capture `c` the frames of `txfs` whose bit is set in `sent`.
#[cold]
fn capture_sent(c: &crate::observe::Capture, txfs: &[TxFrame], sent: u32, ts: std::time::Duration) {
    for (i, txf) in txfs.iter().enumerate() {
        if sent & (1 << i) != 0 {
            c.take_tx(txf, ts);
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
        let frames: Vec<RxFrame> = bufs.iter().map(|b| RxFrame::of(&[b])).collect();
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

    /// Gives port `id` the one transmit queue `tx` (and no receive queue).
    fn attach_tx(dp: &Dataplane, id: PortId, tx: impl TxQueue + 'static) {
        dp.attach_queues(
            id,
            PortQueues {
                rx: vec![],
                tx: vec![Box::new(tx)],
            },
        );
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

    /// A transmit queue that records every frame it sends, whole.
    struct Whole(Arc<Mutex<Vec<Vec<u8>>>>);

    impl TxQueue for Whole {
        fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError> {
            let mut b = vec![0u8; frame.len()];
            // SAFETY: `b` has room for the frame.
            let n = unsafe { frame.reader().copy_to(b.as_mut_ptr(), b.len()) };
            assert_eq!(n, b.len());
            self.0.lock().unwrap().push(b);
            Ok(())
        }

        fn flush(&mut self) {}
    }

    #[test]
    fn a_header_reads_the_same_in_place_or_from_a_copy() {
        let mut tagged = frame(0x0b, 0x0a);
        tagged.splice(12..12, [0x81, 0x00, 0x20, 0x64]); // PCP 1, VLAN 100
        let one = |b: &[u8]| RxFrame::of(&[b]);
        // The header split after 5 bytes: read from a copy.
        let split = |b: &[u8]| {
            let mut f = RxFrame::default();
            // SAFETY: as above.
            unsafe {
                assert!(f.push(b.as_ptr(), 5));
                assert!(f.push(b.as_ptr().add(5), b.len() as u32 - 5));
            }
            f
        };
        let facts = |l2: L2Head| (l2.dst_mac(), l2.src_mac(), l2.tagged, l2.vid);
        let untagged = frame(0x0b, 0x0a);
        for b in [&untagged, &tagged] {
            let (a, c) = (parse_l2(&one(b)).ok(), parse_l2(&split(b)).ok());
            let (a, c) = (facts(a.unwrap()), facts(c.unwrap()));
            assert_eq!(a, c);
            assert_eq!((a.0, a.1), (mac(0x0b), mac(0x0a)));
        }
        assert_eq!(facts(parse_l2(&one(&tagged)).ok().unwrap()).3, 100);
        let group = frame(0x0b, 0x0a);
        let mut group = group.clone();
        group[0] = 0x01;
        let l2 = parse_l2(&one(&group)).ok().unwrap();
        assert!(l2.dst_multicast() && !l2.src_multicast());
        // Runts: shorter than a header, or a tag cut short.
        for b in [&untagged[..13], &tagged[..17]] {
            for f in [one(b), split(b)] {
                assert!(matches!(parse_l2(&f), Err(DropReason::Runt)));
            }
        }
        // A bare header, 14 bytes, untagged: read from a copy.
        let l2 = parse_l2(&one(&untagged[..14])).ok().unwrap();
        assert_eq!(
            (l2.dst_mac(), l2.src_mac(), l2.tagged),
            (mac(0x0b), mac(0x0a), false)
        );
    }

    #[test]
    fn tags_are_pushed_and_popped_between_access_ports_and_trunks() {
        let dp = Dataplane::new(1).unwrap();
        let br = dp.add_bridge(64);
        let trunk = VlanMode::from_spec(None, Some(&"100".parse().unwrap()));
        let mut logs = Vec::new();
        let mut ids = Vec::new();
        for (name, mode) in [("access", VlanMode::Access(100)), ("trunk", trunk)] {
            let (id, _) = dp.add_port(name, Some(br), mode, &PortSecurity::default());
            let log = Arc::new(Mutex::new(Vec::new()));
            attach_tx(&dp, id, Whole(log.clone()));
            logs.push(log);
            ids.push(id);
        }
        let tag = |mut f: Vec<u8>| {
            f.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
            f
        };
        // 0x0a behind the access port, 0x0b behind the trunk: flooded the
        // first time round, unicast once both are learned.
        for _ in 0..2 {
            forward_bufs(&dp, ids[0], &[frame(0x0b, 0x0a)]);
            assert_eq!(logs[1].lock().unwrap().pop(), Some(tag(frame(0x0b, 0x0a))));
            forward_bufs(&dp, ids[1], &[tag(frame(0x0a, 0x0b))]);
            assert_eq!(logs[0].lock().unwrap().pop(), Some(frame(0x0a, 0x0b)));
        }
        assert!(logs.iter().all(|l| l.lock().unwrap().is_empty()));
    }

    #[test]
    fn a_burst_mixing_tagged_and_unchanged_conversations_keeps_each_frames_rewrite() {
        let dp = Dataplane::new(1).unwrap();
        let br = dp.add_bridge(64);
        let trunk = VlanMode::from_spec(None, Some(&"100".parse().unwrap()));
        let mut logs = Vec::new();
        let mut ids = Vec::new();
        for (name, mode) in [
            ("a", VlanMode::Access(100)),
            ("t", trunk),
            ("b", VlanMode::Access(100)),
        ] {
            let (id, _) = dp.add_port(name, Some(br), mode, &PortSecurity::default());
            let log = Arc::new(Mutex::new(Vec::new()));
            attach_tx(&dp, id, Whole(log.clone()));
            logs.push(log);
            ids.push(id);
        }
        // 0x0b behind the trunk (its frames get a tag pushed), 0x0c behind
        // the other access port (its frames leave as they came).
        for (last, id) in [(0x0b, ids[1]), (0x0c, ids[2])] {
            let entry = MacEntry {
                port: id,
                port_gen: 1,
                last_seen: dp.now_secs(),
                pinned: false,
            };
            dp.mac_table(br).unwrap().learn(mac(last), 100, entry, 0);
        }
        // Runs long enough for the head cache, one way and the other, in
        // one burst: a frame that needs its tag never takes the cache, nor
        // empties it for the other conversation.
        let dsts = [
            0x0c, 0x0c, 0x0c, 0x0b, 0x0b, 0x0b, 0x0b, 0x0c, 0x0b, 0x0b, 0x0c, 0x0c,
        ];
        let bufs: Vec<Vec<u8>> = dsts.iter().map(|&d| frame(d, 0x0a)).collect();
        forward_bufs(&dp, ids[0], &bufs);
        let mut tagged = frame(0x0b, 0x0a);
        tagged.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
        let count = |d: u8| dsts.iter().filter(|&&x| x == d).count();
        assert_eq!(*logs[1].lock().unwrap(), vec![tagged; count(0x0b)]);
        assert_eq!(
            *logs[2].lock().unwrap(),
            vec![frame(0x0c, 0x0a); count(0x0c)]
        );
        assert!(logs[0].lock().unwrap().is_empty());
    }

    #[test]
    fn the_same_addresses_in_two_vlans_of_a_trunk_go_to_each_vlans_port() {
        let dp = Dataplane::new(1).unwrap();
        let br = dp.add_bridge(64);
        let trunk = |set: &str| VlanMode::from_spec(None, Some(&set.parse().unwrap()));
        let (inp, _) = dp.add_port("in", Some(br), trunk("100,200"), &PortSecurity::default());
        attach_tx(&dp, inp, Whole(Arc::new(Mutex::new(Vec::new()))));
        let mut logs = Vec::new();
        for (name, set, vlan) in [("t100", "100", 100), ("t200", "200", 200)] {
            let (id, _) = dp.add_port(name, Some(br), trunk(set), &PortSecurity::default());
            let log = Arc::new(Mutex::new(Vec::new()));
            attach_tx(&dp, id, Whole(log.clone()));
            logs.push(log);
            let entry = MacEntry {
                port: id,
                port_gen: 1,
                last_seen: dp.now_secs(),
                pinned: false,
            };
            dp.mac_table(br).unwrap().learn(mac(0x0b), vlan, entry, 0);
        }
        let tagged = |vid: u8| {
            let mut f = frame(0x0b, 0x0a);
            f.splice(12..12, [0x81, 0x00, 0x00, vid]);
            f
        };
        // Runs long enough for the head cache, the tag the one difference.
        let vids = [100, 100, 100, 200, 200, 200, 100, 200, 200, 100];
        let bufs: Vec<Vec<u8>> = vids.iter().map(|&v| tagged(v)).collect();
        forward_bufs(&dp, inp, &bufs);
        for (log, vid) in logs.iter().zip([100u8, 200]) {
            let got = std::mem::take(&mut *log.lock().unwrap());
            let want = vids.iter().filter(|&&v| v == vid).count();
            assert_eq!(got, vec![tagged(vid); want], "VLAN {vid}");
        }
    }

    #[test]
    fn repeated_addresses_in_a_burst_go_where_the_table_says() {
        let (dp, br, inp, in_shared) = one_bridge();
        let mut sent = Vec::new();
        let mut ports = Vec::new();
        for name in ["p1", "p2"] {
            let (id, _) = add(&dp, br, name);
            let log = Arc::new(Mutex::new(Vec::new()));
            attach_tx(&dp, id, Sink(log.clone()));
            sent.push(log);
            ports.push(id);
        }
        attach_tx(&dp, inp, Sink(Arc::new(Mutex::new(Vec::new()))));
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
        assert_eq!(in_shared.totals().drops[&DropReason::Hairpin], 1);
        // Conversations of three frames and more (the third frame on takes
        // the head cache), interleaved, with a hairpin amid one of them.
        let out = run(&[
            (0x0b, 0x0a),
            (0x0b, 0x0a),
            (0x0b, 0x0a),
            (0x0c, 0x0a),
            (0x0b, 0x0a),
            (0x0e, 0x0a),
            (0x0b, 0x0a),
            (0x0c, 0x0d),
            (0x0c, 0x0d),
            (0x0c, 0x0d),
            (0x0b, 0x0a),
            (0x0c, 0x0d),
        ]);
        assert_eq!(out[0], [0x0b; 6]);
        assert_eq!(out[1], [0x0c; 5]);
        assert_eq!(in_shared.totals().drops[&DropReason::Hairpin], 2);
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
        attach_tx(
            &dp,
            out,
            Limited {
                log: log.clone(),
                room: 2,
                max_len: 80,
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
        assert_eq!(t.drops[&DropReason::TooLong], 1);
        assert_eq!(t.drops[&DropReason::NoBuffer], 2);
    }

    #[test]
    fn a_burst_is_released_once_after_its_last_copy_and_before_the_last_flush() {
        let (dp, br, inp, _) = one_bridge();
        let log = Arc::new(Mutex::new(Vec::new()));
        for name in ["p1", "p2"] {
            let (id, _) = add(&dp, br, name);
            attach_tx(&dp, id, Events(log.clone(), name));
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
    fn the_last_destinations_copies_are_captured_before_the_burst_is_released() {
        let (dp, br, inp, _) = one_bridge();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (out, _) = add(&dp, br, "out");
        attach_tx(&dp, out, Events(log, "out"));
        let cap = Arc::new(crate::observe::Capture::new(out, false, true, 2048, None));
        dp.start_capture(cap.clone()).unwrap();
        // The source buffer, which its peer overwrites once it is given
        // back (here, the release zeroes it).
        let bytes = frame(0x0b, 0x0a);
        let len = bytes.len();
        let raw = Box::into_raw(bytes.clone().into_boxed_slice()).cast::<u8>();
        let mut f = RxFrame::default();
        // SAFETY: `raw..raw+len` is our allocation, freed below after the
        // frame is dropped.
        assert!(unsafe { f.push(raw, len as u32) });
        let release = move || {
            // SAFETY: as above; nothing reads it while this runs.
            unsafe { std::ptr::write_bytes(raw, 0, len) }
        };
        let mut view = WorkerView::default();
        dp.build_view(0, &mut view);
        let mut fwd = Forwarder::default();
        fwd.resize(&view);
        let from = Ingress {
            port: inp,
            queue: 0,
        };
        fwd.forward_burst(&dp, &view, 0, from, std::slice::from_ref(&f), release);
        let got = cap.pop().expect("the frame captured");
        assert_eq!(got.data, bytes, "captured after the release");
        // SAFETY: the allocation made above; the frame pointing at it is
        // not read again.
        unsafe { drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(raw, len))) };
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
