//! The memif connection handshake as two state machines, one per role.
//!
//! They take parsed messages (plus the fd that came with each) and answer
//! with the message to send; sockets stay outside, so the machines can be
//! tested and fuzzed directly. The exchange is lockstep: one reply per
//! message received.
//!
//! HELLO → INIT → ACK → ADD_REGION×n (ACK each) → ADD_RING×n (ACK each)
//! → CONNECT → CONNECTED.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use super::region::{Region, Regions, MAX_REGIONS};
use super::ring::{Desc, Ring};
use crate::port::sigbus::Tripwire;
use crate::wire::memif::{
    ring_bytes, FixedStr, Message, Mode, ADD_RING_FLAG_S2M, COOKIE, MAX_LOG2_RING_SIZE, VERSION,
};

/// Our name in HELLO and INIT.
pub const SELF_NAME: &str = "switchyard";

/// Connection parameters of one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// Interface name sent in CONNECT/CONNECTED.
    pub if_name: String,
    /// Interface id on the socket.
    pub id: u32,
    /// Shared secret.
    pub secret: Option<String>,
    /// Interface mode.
    pub mode: Mode,
    /// Queue pairs wanted.
    pub queues: u16,
    /// Ring size exponent (slave: rings we create).
    pub log2_ring_size: u8,
    /// Buffer size (slave: buffers we create).
    pub buffer_size: u32,
}

/// A handshake failure; the text goes into our DISCONNECT.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct HsError {
    /// Why.
    pub reason: String,
    /// False when the peer already said DISCONNECT (do not answer it).
    pub reply: bool,
}

fn fail<T>(reason: impl Into<String>) -> Result<T, HsError> {
    Err(HsError {
        reason: reason.into(),
        reply: true,
    })
}

fn peer_disconnected<T>(reason: &FixedStr<96>) -> Result<T, HsError> {
    Err(HsError {
        reason: format!("peer disconnected: {}", reason.to_string_lossy()),
        reply: false,
    })
}

/// One ring as agreed in the handshake.
pub struct RingSetup {
    /// The ring in mapped memory.
    pub ring: Ring,
    /// Its eventfd.
    pub irq: OwnedFd,
    /// Slave only: offset of our first buffer for this ring.
    pub buffers: Option<u32>,
    /// The region it is in.
    pub region: u16,
    /// Where in the region.
    pub offset: u32,
}

/// A completed handshake: memory and rings ready for queues.
pub struct Established {
    /// The shared memory.
    pub regions: Arc<Regions>,
    /// Slave-to-master rings by index.
    pub s2m: Vec<RingSetup>,
    /// Master-to-slave rings by index.
    pub m2s: Vec<RingSetup>,
    /// The peer's name (HELLO or INIT).
    pub peer_name: String,
    /// The peer's interface name (CONNECT or CONNECTED).
    pub peer_if_name: String,
    /// Buffer size (slave: ours).
    pub buffer_size: u32,
}

/// What the master says next.
pub enum MasterStep {
    /// Send this and keep going.
    Reply(Message),
    /// Send CONNECTED: the link is up.
    Connected(Message, Established),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MasterState {
    AwaitInit,
    AwaitSetup,
    Done,
}

struct PendingRing {
    region: u16,
    offset: u32,
    log2: u8,
    irq: OwnedFd,
}

/// The HELLO a master sends each slave that connects, before it knows
/// which interface the slave wants: the socket's limits, so `queues` is
/// the most queue pairs any interface on the socket has. (The `max_*`
/// fields are largest indices.)
pub fn hello(queues: u16) -> Message {
    let qmax = queues.saturating_sub(1);
    Message::Hello {
        name: FixedStr::new(SELF_NAME),
        min_version: VERSION,
        max_version: VERSION,
        max_region: (MAX_REGIONS - 1) as u16,
        max_m2s_ring: qmax,
        max_s2m_ring: qmax,
        max_log2_ring_size: MAX_LOG2_RING_SIZE,
    }
}

/// The interface a slave's first message names: the id of its INIT,
/// which [`MasterHandshake::on_message`] then takes. Anything else first
/// is refused (a DISCONNECT ends it quietly).
pub fn named(msg: Message) -> Result<(u32, Message), HsError> {
    match msg {
        Message::Init { id, .. } => Ok((id, msg)),
        Message::Disconnect { reason, .. } => peer_disconnected(&reason),
        m => fail(format!("unexpected {:?} message before INIT", m.msg_type())),
    }
}

/// The master (listening) side of one connection, from the slave's INIT
/// on ([`hello`] went first, from the socket).
pub struct MasterHandshake {
    p: Params,
    state: MasterState,
    /// Watches the slave's unsealed regions; declared before them, so it is
    /// dropped first.
    wire: Tripwire,
    regions: Vec<Region>,
    s2m: Vec<Option<PendingRing>>,
    m2s: Vec<Option<PendingRing>>,
    peer_name: String,
}

impl MasterHandshake {
    /// A connection for the interface `p` describes.
    pub fn new(p: Params) -> Self {
        let q = p.queues as usize;
        MasterHandshake {
            p,
            state: MasterState::AwaitInit,
            wire: Tripwire::new(),
            regions: Vec::new(),
            s2m: (0..q).map(|_| None).collect(),
            m2s: (0..q).map(|_| None).collect(),
            peer_name: String::new(),
        }
    }

    /// Handles one message from the slave.
    pub fn on_message(&mut self, msg: Message, fd: Option<OwnedFd>) -> Result<MasterStep, HsError> {
        match (self.state, msg) {
            (_, Message::Disconnect { reason, .. }) => peer_disconnected(&reason),
            (
                MasterState::AwaitInit,
                Message::Init {
                    version,
                    id,
                    mode,
                    secret,
                    name,
                },
            ) => {
                if version != VERSION {
                    return fail(format!("incompatible memif version {version:#06x}"));
                }
                if id != self.p.id {
                    return fail("ID mismatch");
                }
                if Mode::from_u8(mode) != Some(self.p.mode) {
                    return fail("mode mismatch");
                }
                if let Some(s) = &self.p.secret {
                    if secret.as_bytes() != s.as_bytes() {
                        return fail(if secret.as_bytes().is_empty() {
                            "secret required"
                        } else {
                            "incorrect secret"
                        });
                    }
                }
                self.peer_name = name.to_string_lossy();
                self.state = MasterState::AwaitSetup;
                Ok(MasterStep::Reply(Message::Ack))
            }
            (MasterState::AwaitSetup, Message::AddRegion { index, size }) => {
                let Some(fd) = fd else {
                    return fail("missing region fd");
                };
                if index as usize != self.regions.len() || self.regions.len() >= MAX_REGIONS {
                    return fail("invalid region index");
                }
                let r = Region::from_peer(fd, size, &mut self.wire)
                    .or_else(|e| fail(format!("region {index}: {e}")))?;
                self.regions.push(r);
                Ok(MasterStep::Reply(Message::Ack))
            }
            (
                MasterState::AwaitSetup,
                Message::AddRing {
                    flags,
                    index,
                    region,
                    offset,
                    log2_ring_size,
                    private_hdr_size,
                },
            ) => {
                let Some(irq) = fd else {
                    return fail("missing interrupt fd");
                };
                if private_hdr_size != 0 {
                    return fail("private header not supported");
                }
                if log2_ring_size == 0 || log2_ring_size > MAX_LOG2_RING_SIZE {
                    return fail("invalid ring size");
                }
                let Some(r) = self.regions.get(region as usize) else {
                    return fail("invalid ring region");
                };
                if offset % 8 != 0 || u64::from(offset) + ring_bytes(log2_ring_size) > r.size() {
                    return fail("ring outside its region");
                }
                let list = if flags & ADD_RING_FLAG_S2M != 0 {
                    &mut self.s2m
                } else {
                    &mut self.m2s
                };
                let queues = list.len();
                match list.get_mut(index as usize) {
                    Some(slot @ None) => {
                        *slot = Some(PendingRing {
                            region,
                            offset,
                            log2: log2_ring_size,
                            irq,
                        })
                    }
                    Some(Some(_)) => return fail("invalid ring index"),
                    // Another interface on the socket has more queues, so
                    // HELLO offered more than this one takes.
                    None => {
                        return fail(format!(
                            "invalid ring index {index}: this interface has {queues} queue pair(s)"
                        ))
                    }
                }
                Ok(MasterStep::Reply(Message::Ack))
            }
            (MasterState::AwaitSetup, Message::Connect { if_name }) => {
                let regions = Arc::new(Regions::watched(
                    std::mem::take(&mut self.regions),
                    std::mem::take(&mut self.wire),
                ));
                let s2m = take_rings(&mut self.s2m, &regions)?;
                let m2s = take_rings(&mut self.m2s, &regions)?;
                self.state = MasterState::Done;
                Ok(MasterStep::Connected(
                    Message::Connected {
                        if_name: FixedStr::new(&self.p.if_name),
                    },
                    Established {
                        regions,
                        s2m,
                        m2s,
                        peer_name: self.peer_name.clone(),
                        peer_if_name: if_name.to_string_lossy(),
                        buffer_size: 0,
                    },
                ))
            }
            (state, m) => fail(format!(
                "unexpected {:?} message in state {state:?}",
                m.msg_type()
            )),
        }
    }
}

/// Turns the rings a slave announced into [`RingSetup`]s: indices must run
/// 0..n without gaps, n >= 1, and each ring must carry the cookie.
fn take_rings(
    list: &mut [Option<PendingRing>],
    regions: &Arc<Regions>,
) -> Result<Vec<RingSetup>, HsError> {
    let n = list.iter().take_while(|r| r.is_some()).count();
    if n == 0 || list[n..].iter().any(Option::is_some) {
        return fail("rings missing");
    }
    let mut out = Vec::with_capacity(n);
    for pr in list.iter_mut().take(n).filter_map(Option::take) {
        // The region and range were checked when the ring was added.
        let Some(r) = regions.get(pr.region as usize) else {
            return fail("invalid ring region");
        };
        // SAFETY: offset is 8-aligned and offset + ring_bytes(log2) <= size
        // (checked in ADD_RING); the mapping is kept alive by `regions`,
        // which every queue built from this ring holds.
        let ring = unsafe { Ring::new(r.base().add(pr.offset as usize), pr.log2) };
        if ring.cookie() != COOKIE {
            return fail("wrong ring cookie");
        }
        out.push(RingSetup {
            ring,
            irq: pr.irq,
            buffers: None,
            region: pr.region,
            offset: pr.offset,
        });
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlaveState {
    AwaitHello,
    Setup,
    AwaitConnected,
    Done,
}

/// The slave (connecting) side of one connection.
pub struct SlaveHandshake {
    p: Params,
    state: SlaveState,
    outbox: VecDeque<(Message, Option<RawFd>)>,
    prepared: Option<Established>,
}

impl SlaveHandshake {
    /// We just connected.
    pub fn new(p: Params) -> Self {
        SlaveHandshake {
            p,
            state: SlaveState::AwaitHello,
            outbox: VecDeque::new(),
            prepared: None,
        }
    }

    /// Handles one message from the master; returns what to send (and the fd
    /// to attach), or the established connection once CONNECTED arrives.
    pub fn on_message(&mut self, msg: Message) -> Result<SlaveStep, HsError> {
        match (self.state, msg) {
            (_, Message::Disconnect { reason, .. }) => peer_disconnected(&reason),
            (
                SlaveState::AwaitHello,
                Message::Hello {
                    name,
                    min_version,
                    max_version,
                    max_s2m_ring,
                    max_m2s_ring,
                    max_log2_ring_size,
                    ..
                },
            ) => {
                if min_version > VERSION || max_version < VERSION {
                    return fail("incompatible memif version");
                }
                let n_s2m = u32::from(max_s2m_ring)
                    .saturating_add(1)
                    .min(u32::from(self.p.queues)) as u16;
                let n_m2s = u32::from(max_m2s_ring)
                    .saturating_add(1)
                    .min(u32::from(self.p.queues)) as u16;
                let log2 = self.p.log2_ring_size.min(max_log2_ring_size);
                if log2 == 0 || n_s2m == 0 || n_m2s == 0 {
                    return fail("master limits leave no usable ring");
                }
                let mut est = build_slave_memory(&self.p, n_s2m, n_m2s, log2).or_else(fail)?;
                est.peer_name = name.to_string_lossy();
                let r0 = est.regions.get(0).map(|r| (r.fd().as_raw_fd(), r.size()));
                let Some((rfd, rsize)) = r0 else {
                    return fail("region missing");
                };
                self.outbox.push_back((
                    Message::Init {
                        version: VERSION,
                        id: self.p.id,
                        mode: self.p.mode.to_u8(),
                        secret: FixedStr::new(self.p.secret.as_deref().unwrap_or("")),
                        name: FixedStr::new(SELF_NAME),
                    },
                    None,
                ));
                self.outbox.push_back((
                    Message::AddRegion {
                        index: 0,
                        size: rsize,
                    },
                    Some(rfd),
                ));
                for (flags, list) in [(ADD_RING_FLAG_S2M, &est.s2m), (0, &est.m2s)] {
                    for (i, rs) in list.iter().enumerate() {
                        self.outbox.push_back((
                            Message::AddRing {
                                flags,
                                index: i as u16,
                                region: 0,
                                offset: rs.offset,
                                log2_ring_size: log2,
                                private_hdr_size: 0,
                            },
                            Some(rs.irq.as_raw_fd()),
                        ));
                    }
                }
                self.outbox.push_back((
                    Message::Connect {
                        if_name: FixedStr::new(&self.p.if_name),
                    },
                    None,
                ));
                self.prepared = Some(est);
                self.state = SlaveState::Setup;
                Ok(self.next_out())
            }
            (SlaveState::Setup, Message::Ack) => Ok(self.next_out()),
            (SlaveState::AwaitConnected, Message::Connected { if_name }) => {
                self.state = SlaveState::Done;
                let mut est = self.prepared.take().ok_or_else(|| HsError {
                    reason: "internal: nothing prepared".into(),
                    reply: true,
                })?;
                est.peer_if_name = if_name.to_string_lossy();
                Ok(SlaveStep::Connected(est))
            }
            (state, m) => fail(format!(
                "unexpected {:?} message in state {state:?}",
                m.msg_type()
            )),
        }
    }

    fn next_out(&mut self) -> SlaveStep {
        match self.outbox.pop_front() {
            Some((m, fd)) => {
                if matches!(m, Message::Connect { .. }) {
                    self.state = SlaveState::AwaitConnected;
                }
                SlaveStep::Send(m, fd)
            }
            None => SlaveStep::Wait,
        }
    }
}

/// What the slave does next.
pub enum SlaveStep {
    /// Send this message, with this fd attached.
    Send(Message, Option<RawFd>),
    /// Nothing to send.
    Wait,
    /// The link is up.
    Connected(Established),
}

/// Lays out region 0 the way VPP, libmemif and DPDK slaves do: S2M rings,
/// then M2S rings, then one buffer per descriptor (S2M buffers first).
fn build_slave_memory(p: &Params, n_s2m: u16, n_m2s: u16, log2: u8) -> Result<Established, String> {
    let rb = ring_bytes(log2);
    let nrings = u64::from(n_s2m) + u64::from(n_m2s);
    let slots = 1u64 << log2;
    let buffers_at = nrings * rb;
    let size = buffers_at + nrings * slots * u64::from(p.buffer_size);
    if size > u64::from(u32::MAX) {
        return Err(format!(
            "shared memory of {size} bytes exceeds the 4 GiB memif offsets allow"
        ));
    }
    let region = Region::create(&format!("switchyard-memif-{}", p.if_name), size)
        .map_err(|e| e.to_string())?;
    let base = region.base();
    let regions = Arc::new(Regions::new(vec![region]));
    let mut s2m = Vec::new();
    let mut m2s = Vec::new();
    for i in 0..nrings {
        // SAFETY: i * rb + rb <= buffers_at <= size, and rb is a multiple of
        // 16, so the ring lies inside the fresh, aligned mapping held by
        // `regions`.
        let ring = unsafe { Ring::new(base.add((i * rb) as usize), log2) };
        ring.set_cookie(COOKIE);
        ring.set_flags(0);
        ring.set_head(0);
        ring.set_tail(0);
        let first = (buffers_at + i * slots * u64::from(p.buffer_size)) as u32;
        for s in 0..slots {
            ring.set_desc(
                s as u16,
                Desc {
                    flags: 0,
                    region: 0,
                    length: p.buffer_size,
                    offset: first + (s as u32) * p.buffer_size,
                },
            );
        }
        let irq = crate::eventfd::new_eventfd().map_err(|e| e.to_string())?;
        let rs = RingSetup {
            ring,
            irq,
            buffers: Some(first),
            region: 0,
            offset: (i * rb) as u32,
        };
        if i < u64::from(n_s2m) {
            s2m.push(rs);
        } else {
            m2s.push(rs);
        }
    }
    Ok(Established {
        regions,
        s2m,
        m2s,
        peer_name: String::new(),
        peer_if_name: String::new(),
        buffer_size: p.buffer_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(queues: u16) -> Params {
        Params {
            if_name: "p0".into(),
            id: 0,
            secret: Some("s".into()),
            mode: Mode::Ethernet,
            queues,
            log2_ring_size: 8,
            buffer_size: 2048,
        }
    }

    /// Runs our slave against our master, passing fds by duplicating them as
    /// the kernel would.
    fn run_pair(mp: Params, sp: Params) -> Result<(Established, Established), HsError> {
        let mut m = MasterHandshake::new(mp);
        let mut s = SlaveHandshake::new(sp);
        let mut to_slave = hello(m.p.queues);
        loop {
            match s.on_message(to_slave)? {
                SlaveStep::Send(msg, fd) => {
                    let owned = fd.map(|f| {
                        // SAFETY: `f` is open (held by the slave's prepared state).
                        unsafe { std::os::fd::BorrowedFd::borrow_raw(f) }
                            .try_clone_to_owned()
                            .unwrap()
                    });
                    match m.on_message(msg, owned)? {
                        MasterStep::Reply(r) => to_slave = r,
                        MasterStep::Connected(c, me) => match s.on_message(c)? {
                            SlaveStep::Connected(se) => return Ok((me, se)),
                            _ => panic!("slave did not connect"),
                        },
                    }
                }
                SlaveStep::Wait => panic!("slave stalled"),
                SlaveStep::Connected(_) => panic!("connected early"),
            }
        }
    }

    #[test]
    fn our_master_and_slave_agree() {
        let (m, s) = run_pair(params(2), params(4)).unwrap();
        assert_eq!(m.s2m.len(), 2, "slave limited by master's HELLO");
        assert_eq!(m.m2s.len(), 2);
        assert_eq!(s.s2m.len(), 2);
        assert_eq!(m.peer_if_name, "p0");
        assert_eq!(s.peer_name, SELF_NAME);
        assert_eq!(m.regions.len(), 1);
        assert_eq!(
            m.regions.get(0).unwrap().size(),
            s.regions.get(0).unwrap().size()
        );
    }

    #[test]
    fn wrong_secret_or_id_is_refused() {
        let mut sp = params(1);
        sp.secret = Some("nope".into());
        assert_eq!(
            run_pair(params(1), sp).err().unwrap().reason,
            "incorrect secret"
        );
        let mut sp = params(1);
        sp.secret = None;
        assert_eq!(
            run_pair(params(1), sp).err().unwrap().reason,
            "secret required"
        );
        let mut sp = params(1);
        sp.id = 9;
        assert_eq!(run_pair(params(1), sp).err().unwrap().reason, "ID mismatch");
    }

    #[test]
    fn master_rejects_out_of_order_and_bad_rings() {
        let mut m = MasterHandshake::new(params(1));
        assert!(m
            .on_message(
                Message::Connect {
                    if_name: FixedStr::new("x")
                },
                None
            )
            .is_err());
        let mut m = MasterHandshake::new(params(1));
        let init = Message::Init {
            version: VERSION,
            id: 0,
            mode: 0,
            secret: FixedStr::new("s"),
            name: FixedStr::new("t"),
        };
        assert!(matches!(
            m.on_message(init, None),
            Ok(MasterStep::Reply(Message::Ack))
        ));
        let r = Region::create("t", 4096).unwrap();
        let fd = r.fd().try_clone_to_owned().unwrap();
        assert!(m
            .on_message(
                Message::AddRegion {
                    index: 1,
                    size: 4096
                },
                Some(fd)
            )
            .is_err());
        let mut m2 = MasterHandshake::new(params(1));
        m2.state = MasterState::AwaitSetup;
        let fd = r.fd().try_clone_to_owned().unwrap();
        assert!(m2
            .on_message(
                Message::AddRegion {
                    index: 0,
                    size: 4096
                },
                Some(fd)
            )
            .is_ok());
        let efd = crate::eventfd::new_eventfd().unwrap();
        let bad = Message::AddRing {
            flags: 1,
            index: 0,
            region: 0,
            offset: 4096 - 64,
            log2_ring_size: 1,
            private_hdr_size: 0,
        };
        assert_eq!(
            m2.on_message(bad, Some(efd)).err().unwrap().reason,
            "ring outside its region"
        );
        let efd = crate::eventfd::new_eventfd().unwrap();
        let bad_index = Message::AddRing {
            flags: 1,
            index: 1,
            region: 0,
            offset: 0,
            log2_ring_size: 1,
            private_hdr_size: 0,
        };
        assert_eq!(
            m2.on_message(bad_index, Some(efd)).err().unwrap().reason,
            "invalid ring index 1: this interface has 1 queue pair(s)"
        );
    }
}
