//! memif ports, as master (we listen and map the peer's memory) or slave (we
//! connect, own the memory, and reconnect when the master goes away): the
//! memif [`Protocol`] on a [`SocketPort`].

pub mod handshake;
pub mod queue;
pub mod region;
pub mod ring;
pub mod socket;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::SockType;
use tracing::info;

use switchyard_api::{MemifMode, MemifRole, MemifSpec, PortStatus};

use crate::port::handover::{self, FdIn, FdOut, HandoverError, Saved};
use crate::port::sigbus::Tripwire;
use crate::port::socket_port::{Closed, Protocol, SocketPort};
use crate::port::{Port, PortCtx};
use crate::queue::{PortQueues, RxQueue, TxQueue};
use crate::wire::memif::{ring_bytes, Message, MsgType, COOKIE, MAX_LOG2_RING_SIZE};
use handshake::{
    Established, HsError, MasterHandshake, MasterStep, Params, SlaveHandshake, SlaveStep,
};
use queue::{MemifRx, MemifTx, OwnBuffers, Side};
use region::{Region, Regions};
use ring::Ring;

pub use crate::wire::memif::Mode;

/// How long a handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A memif port: the memif protocol on a socket port.
pub fn port(name: &str, spec: &MemifSpec) -> Box<dyn Port> {
    use switchyard_api::spec::memif::{DEFAULT_BUFFER_SIZE, DEFAULT_RING_SIZE};
    let memif = Memif {
        name: name.to_string(),
        side: match spec.role {
            MemifRole::Master => Side::Master,
            MemifRole::Slave => Side::Slave,
        },
        params: Params {
            if_name: name.to_string(),
            id: spec.id.unwrap_or(0),
            secret: spec.secret.clone().filter(|s| !s.is_empty()),
            mode: match spec.mode.unwrap_or_default() {
                MemifMode::Ethernet => Mode::Ethernet,
                MemifMode::Ip => Mode::Ip,
            },
            queues: spec.queues.unwrap_or(1),
            log2_ring_size: spec.ring_size.unwrap_or(DEFAULT_RING_SIZE).trailing_zeros() as u8,
            buffer_size: spec.buffer_size.unwrap_or(DEFAULT_BUFFER_SIZE),
        },
    };
    Box::new(SocketPort::new(name, spec.socket_spec(), memif))
}

/// The memif protocol of one port.
struct Memif {
    name: String,
    /// The switch's role.
    side: Side,
    /// Connection parameters.
    params: Params,
}

enum Handshake {
    Master(MasterHandshake),
    Slave(SlaveHandshake),
    Up(Linked),
}

/// One connection.
pub struct Conn {
    fd: OwnedFd,
    hs: Handshake,
    started: Instant,
}

/// Reads the next message on a memif socket, with the fd it carried:
/// `Ok(None)` when none is waiting.
fn read(fd: BorrowedFd<'_>) -> Result<Option<(Message, Option<OwnedFd>)>, Closed> {
    let rx = match socket::recv(fd.as_raw_fd()) {
        Ok(Some(rx)) => rx,
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(Closed::gone("peer closed the connection"))
        }
        Err(e) => return Err(Closed::gone(format!("control socket error: {e}"))),
    };
    match Message::parse(&rx.buf[..rx.len.min(rx.buf.len())]) {
        Ok(m) if rx.len == rx.buf.len() => Ok(Some((m, rx.fd))),
        Ok(_) => Err(Closed::fault("invalid message size")),
        Err(e) => Err(Closed::fault(e.to_string())),
    }
}

/// A handshake's failure as the connection ends: `reply` is false when
/// the peer itself said DISCONNECT.
fn closed(e: HsError) -> Closed {
    if e.reply {
        Closed::fault(e.reason)
    } else {
        Closed::gone(e.reason)
    }
}

/// What a slave connected to a master socket says first, to name its
/// interface: the id of its INIT and the INIT ([`Protocol::introduce`] of
/// memif; `Ok(None)` while nothing is waiting). Anything else is refused.
pub fn introduce(fd: BorrowedFd<'_>) -> Result<Option<(u32, Message)>, Closed> {
    match read(fd)? {
        Some((msg, _)) => handshake::named(msg).map(Some).map_err(closed),
        None => Ok(None),
    }
}

impl Protocol for Memif {
    type Conn = Conn;
    /// The slave's INIT.
    type Intro = Message;
    /// The queue pairs of the port's interface.
    type Offer = u16;
    const KIND: &'static str = "memif";
    const SOCK_TYPE: SockType = SockType::SeqPacket;

    fn offer(&self) -> u16 {
        self.params.queues
    }

    fn greet(fd: BorrowedFd<'_>, offers: &[u16]) -> Result<(), String> {
        let queues = offers.iter().copied().max().unwrap_or(1);
        socket::send(fd.as_raw_fd(), &handshake::hello(queues).to_bytes(), None)
            .map_err(|e| format!("sending HELLO: {e}"))
    }

    fn introduce(fd: BorrowedFd<'_>) -> Result<Option<(u32, Message)>, Closed> {
        introduce(fd)
    }

    fn refuse(fd: OwnedFd, reason: &str) {
        // As VPP and DPDK do: the peer is told why.
        let _ = socket::send(
            fd.as_raw_fd(),
            &Message::disconnect(reason).to_bytes(),
            None,
        );
    }

    fn open(
        &mut self,
        _cx: &PortCtx<'_>,
        fd: OwnedFd,
        side: switchyard_api::Side,
    ) -> Result<Conn, String> {
        let hs = match side {
            switchyard_api::Side::Listen => {
                Handshake::Master(MasterHandshake::new(self.params.clone()))
            }
            switchyard_api::Side::Connect => {
                Handshake::Slave(SlaveHandshake::new(self.params.clone()))
            }
        };
        Ok(Conn {
            fd,
            hs,
            started: Instant::now(),
        })
    }

    fn on_intro(
        &mut self,
        cx: &PortCtx<'_>,
        conn: &mut Conn,
        init: Message,
        status: &mut PortStatus,
    ) -> Result<(), Closed> {
        self.step(cx, conn, init, None, status)
    }

    fn fd(conn: &Conn) -> BorrowedFd<'_> {
        conn.fd.as_fd()
    }

    fn on_ready(
        &mut self,
        cx: &PortCtx<'_>,
        conn: &mut Conn,
        status: &mut PortStatus,
    ) -> Result<(), Closed> {
        while let Some((msg, fd)) = read(conn.fd.as_fd())? {
            self.step(cx, conn, msg, fd, status)?;
        }
        Ok(())
    }

    fn deadline(&self, conn: &Conn) -> Option<Instant> {
        match conn.hs {
            Handshake::Up(_) => None,
            _ => Some(conn.started + HANDSHAKE_TIMEOUT),
        }
    }

    fn on_timer(&mut self, conn: &mut Conn, now: Instant) -> Result<(), Closed> {
        match self.deadline(conn) {
            Some(t) if now >= t => Err(Closed::fault("handshake timed out")),
            _ => Ok(()),
        }
    }

    fn close(&mut self, cx: &PortCtx<'_>, conn: Conn, reason: &str, say: bool) -> bool {
        let was_up = matches!(conn.hs, Handshake::Up(_));
        if was_up {
            cx.detach();
        }
        if say {
            let _ = socket::send(
                conn.fd.as_raw_fd(),
                &Message::disconnect(reason).to_bytes(),
                None,
            );
        }
        was_up
    }

    fn save(&self, conn: &Conn, fds: &mut FdOut) -> Result<Option<Saved>, String> {
        Ok(match &conn.hs {
            Handshake::Up(l) => Some(handover::write(&l.save(conn.fd.as_fd(), fds))),
            _ => None,
        })
    }

    fn restore(
        &mut self,
        cx: &PortCtx<'_>,
        saved: Saved,
        fds: &mut FdIn,
        status: &mut PortStatus,
    ) -> Result<Conn, HandoverError> {
        let saved: SavedLink = handover::read(saved)?;
        let linked = self.relink(&saved, fds)?;
        let fd = fds.take(saved.socket)?;
        let q = self
            .queues(&linked, Start::Resume)
            .map_err(|c| HandoverError::Invalid(c.reason))?;
        status.rx_queues = q.rx.len();
        status.tx_queues = q.tx.len();
        status.link_up = true;
        info!(port = %self.name, rx_queues = q.rx.len(), tx_queues = q.tx.len(), "link taken over");
        cx.attach(q);
        Ok(Conn {
            fd,
            hs: Handshake::Up(linked),
            started: Instant::now(),
        })
    }

    fn requeue(&mut self, cx: &PortCtx<'_>, conn: &mut Conn) -> Result<(), Closed> {
        let Handshake::Up(linked) = &conn.hs else {
            return Ok(());
        };
        // Replaces the queues the workers had (paused, they hold none).
        cx.attach(self.queues(linked, Start::Resume)?);
        Ok(())
    }
}

impl Memif {
    /// Takes one message from the peer (with the fd it carried): the
    /// handshake's next step, and the reply sent.
    fn step(
        &mut self,
        cx: &PortCtx<'_>,
        conn: &mut Conn,
        msg: Message,
        fd: Option<OwnedFd>,
        status: &mut PortStatus,
    ) -> Result<(), Closed> {
        let step = match &mut conn.hs {
            Handshake::Master(m) => m.on_message(msg, fd).map(|s| match s {
                MasterStep::Reply(r) => (Some((r, None)), None),
                MasterStep::Connected(r, est) => (Some((r, None)), Some(est)),
            }),
            Handshake::Slave(s) => s.on_message(msg).map(|s| match s {
                SlaveStep::Send(m, fd) => (Some((m, fd)), None),
                SlaveStep::Wait => (None, None),
                SlaveStep::Connected(est) => (None, Some(est)),
            }),
            Handshake::Up(_) => match msg {
                Message::Disconnect { reason, .. } => Err(HsError {
                    reason: format!("peer disconnected: {}", reason.to_string_lossy()),
                    reply: false,
                }),
                m => Err(HsError {
                    reason: format!("unexpected {:?} message while connected", m.msg_type()),
                    reply: m.msg_type() != MsgType::Disconnect,
                }),
            },
        };
        let (send, est) = step.map_err(closed)?;
        if let Some((m, afd)) = send {
            socket::send(conn.fd.as_raw_fd(), &m.to_bytes(), afd)
                .map_err(|e| Closed::gone(format!("send failed: {e}")))?;
        }
        if let Some(est) = est {
            conn.hs = Handshake::Up(self.link_up(cx, est, status)?);
        }
        Ok(())
    }

    fn link_up(
        &mut self,
        cx: &PortCtx<'_>,
        est: Established,
        status: &mut PortStatus,
    ) -> Result<Linked, Closed> {
        let ring = |r: handshake::RingSetup| LinkedRing {
            ring: r.ring,
            irq: r.irq,
            buffers: r.buffers,
            region: r.region,
            offset: r.offset,
        };
        let linked = Linked {
            regions: est.regions,
            s2m: est.s2m.into_iter().map(ring).collect(),
            m2s: est.m2s.into_iter().map(ring).collect(),
            buffer_size: est.buffer_size,
        };
        let q = self.queues(&linked, Start::Fresh)?;
        status.link_up = true;
        status.rx_queues = q.rx.len();
        status.tx_queues = q.tx.len();
        status.peer = Some(format!("{} ({})", est.peer_if_name, est.peer_name));
        status.connects += 1;
        status.last_error = None;
        info!(
            port = %self.name,
            peer = %est.peer_name,
            rx_queues = q.rx.len(),
            tx_queues = q.tx.len(),
            regions = linked.regions.len(),
            unsealed = linked.regions.watched_count(),
            "link up"
        );
        cx.attach(q);
        Ok(linked)
    }

    /// The queues of a link: fresh (a new connection; a slave posts its
    /// buffers) or resumed where the rings are (a takeover).
    fn queues(&self, l: &Linked, start: Start) -> Result<PortQueues, Closed> {
        let side = self.side;
        let (rx_rings, tx_rings) = match side {
            Side::Master => (&l.s2m, &l.m2s),
            Side::Slave => (&l.m2s, &l.s2m),
        };
        let own = |r: &LinkedRing| {
            r.buffers.map(|first| OwnBuffers {
                first,
                size: l.buffer_size,
            })
        };
        let irq = |r: &LinkedRing| {
            r.irq
                .try_clone()
                .map_err(|e| Closed::gone(format!("cannot duplicate an interrupt fd: {e}")))
        };
        let mut q = PortQueues::default();
        for r in rx_rings {
            let (ring, regions, irq, own) = (r.ring, l.regions.clone(), irq(r)?, own(r));
            q.rx.push(Box::new(match start {
                Start::Fresh => MemifRx::new(side, ring, regions, irq, own),
                Start::Resume => MemifRx::resume(side, ring, regions, irq, own),
            }) as Box<dyn RxQueue>);
        }
        for r in tx_rings {
            let (ring, regions, irq, own) = (r.ring, l.regions.clone(), irq(r)?, own(r));
            q.tx.push(Box::new(match start {
                Start::Fresh => MemifTx::new(side, ring, regions, irq, own),
                Start::Resume => MemifTx::resume(side, ring, regions, irq, own),
            }) as Box<dyn TxQueue>);
        }
        Ok(q)
    }

    /// Maps the memory and finds the rings of a link another process saved.
    fn relink(&self, saved: &SavedLink, fds: &mut FdIn) -> Result<Linked, HandoverError> {
        let invalid = |why: String| HandoverError::Invalid(why);
        let mut wire = Tripwire::new();
        let mut list = Vec::with_capacity(saved.regions.len());
        for (i, r) in saved.regions.iter().enumerate() {
            let fd = fds.take(r.fd)?;
            let region = match self.side {
                Side::Master => Region::from_peer(fd, r.size, &mut wire),
                Side::Slave => Region::adopt(fd, r.size),
            };
            list.push(region.map_err(|e| invalid(format!("region {i}: {e}")))?);
        }
        if list.is_empty() || list.len() > region::MAX_REGIONS {
            return Err(invalid(format!("{} regions", list.len())));
        }
        let regions = Arc::new(Regions::watched(list, wire));
        let mut ring = |r: &SavedRing| -> Result<LinkedRing, HandoverError> {
            let region = regions.get(r.region as usize).ok_or_else(|| {
                invalid(format!("a ring in region {}, which is not there", r.region))
            })?;
            if r.log2 == 0
                || r.log2 > MAX_LOG2_RING_SIZE
                || r.offset % 8 != 0
                || u64::from(r.offset) + ring_bytes(r.log2) > region.size()
            {
                return Err(invalid(format!(
                    "a ring of 2^{} slots at {} is outside region {}",
                    r.log2, r.offset, r.region
                )));
            }
            if r.buffers.is_some() != (self.side == Side::Slave) {
                return Err(invalid("buffers saved for the wrong side".into()));
            }
            // SAFETY: the offset is 8-aligned and the ring lies inside the
            // region (checked above), which `regions` keeps mapped for as
            // long as any queue built from this ring.
            let ring = unsafe { Ring::new(region.base().add(r.offset as usize), r.log2) };
            if ring.cookie() != COOKIE {
                return Err(invalid(format!(
                    "no memif cookie at ring offset {}",
                    r.offset
                )));
            }
            Ok(LinkedRing {
                ring,
                irq: fds.take(r.irq)?,
                buffers: r.buffers,
                region: r.region,
                offset: r.offset,
            })
        };
        let s2m = saved
            .s2m
            .iter()
            .map(&mut ring)
            .collect::<Result<Vec<_>, _>>()?;
        let m2s = saved
            .m2s
            .iter()
            .map(&mut ring)
            .collect::<Result<Vec<_>, _>>()?;
        if s2m.is_empty() || m2s.is_empty() {
            return Err(invalid("a link without rings".into()));
        }
        Ok(Linked {
            regions,
            s2m,
            m2s,
            buffer_size: saved.buffer_size,
        })
    }
}

/// How a link's queues begin.
#[derive(Clone, Copy)]
enum Start {
    /// A new connection: counters at zero.
    Fresh,
    /// Taken over: where the rings are.
    Resume,
}

/// A ring of a link that is up.
struct LinkedRing {
    ring: Ring,
    /// The original of the eventfd its queue holds a duplicate of.
    irq: OwnedFd,
    buffers: Option<u32>,
    region: u16,
    offset: u32,
}

/// A link that is up: what its queues are made of, kept to rebuild them
/// (a takeover).
struct Linked {
    regions: Arc<Regions>,
    s2m: Vec<LinkedRing>,
    m2s: Vec<LinkedRing>,
    buffer_size: u32,
}

/// A link as saved for a takeover; fds by their index in the handover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedLink {
    socket: usize,
    regions: Vec<SavedRegion>,
    s2m: Vec<SavedRing>,
    m2s: Vec<SavedRing>,
    buffer_size: u32,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedRegion {
    fd: usize,
    size: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedRing {
    region: u16,
    offset: u32,
    log2: u8,
    irq: usize,
    buffers: Option<u32>,
}

impl Linked {
    fn save(&self, socket: BorrowedFd<'_>, fds: &mut FdOut) -> SavedLink {
        let mut ring = |r: &LinkedRing| SavedRing {
            region: r.region,
            offset: r.offset,
            log2: r.ring.size().trailing_zeros() as u8,
            irq: fds.add(r.irq.as_fd()),
            buffers: r.buffers,
        };
        let s2m = self.s2m.iter().map(&mut ring).collect();
        let m2s = self.m2s.iter().map(&mut ring).collect();
        SavedLink {
            socket: fds.add(socket),
            regions: (0..self.regions.len())
                .filter_map(|i| self.regions.get(i))
                .map(|r| SavedRegion {
                    fd: fds.add(r.fd()),
                    size: r.size(),
                })
                .collect(),
            s2m,
            m2s,
            buffer_size: self.buffer_size,
        }
    }
}
