//! memif ports, as master (we listen and map the peer's memory) or slave (we
//! connect, own the memory, and reconnect when the master goes away): the
//! memif [`Protocol`] on a [`SocketPort`].

pub mod handshake;
mod persist;
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

use crate::port::registry::Build;
use crate::port::socket::{Closed, Greeting, Protocol, SocketPort};
use crate::port::takeover::{FdIn, FdOut, TakeoverError};
use crate::port::{Port, PortCtx};
use crate::queue::{PortQueues, RxQueue, TxQueue};
use crate::wire::memif::{Message, MsgType};
use handshake::{
    Established, HsError, MasterHandshake, MasterStep, Params, SlaveHandshake, SlaveStep,
};
use queue::{MemifRx, MemifTx, OwnBuffers, Role};
use region::Regions;
use ring::Ring;

pub use crate::wire::memif::Mode;

/// How long a handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A memif port: the memif protocol on a socket port (the switch's
/// listening sockets are `listeners`).
pub fn port(spec: &MemifSpec, b: &Build<'_>) -> Box<dyn Port> {
    let name = b.name();
    use switchyard_api::spec::memif::{DEFAULT_BUFFER_SIZE, DEFAULT_RING_SIZE};
    let memif = Memif {
        name: name.to_string(),
        role: match spec.role {
            MemifRole::Master => Role::Master,
            MemifRole::Slave => Role::Slave,
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
    Box::new(SocketPort::new(name, spec.socket_spec(), memif, b.listeners))
}

/// The memif protocol of one port.
struct Memif {
    name: String,
    /// The switch's role.
    role: Role,
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
/// interface: the id of its INIT and the INIT ([`Greeting::introduce`] of
/// memif; `Ok(None)` while nothing is waiting). Anything else is refused.
pub fn introduce(fd: BorrowedFd<'_>) -> Result<Option<(u32, Message)>, Closed> {
    match read(fd)? {
        Some((msg, _)) => handshake::named(msg).map(Some).map_err(closed),
        None => Ok(None),
    }
}

impl Greeting for Memif {
    /// The slave's INIT.
    type Intro = Message;
    /// The queue pairs of the port's interface.
    type Offer = u16;
    const KIND: &'static str = "memif";
    const SOCK_TYPE: SockType = SockType::SeqPacket;

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
}

impl Protocol for Memif {
    type Conn = Conn;
    type Saved = persist::SavedLink;

    fn offer(&self) -> u16 {
        self.params.queues
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

    fn settled(conn: &Conn) -> bool {
        matches!(conn.hs, Handshake::Up(_))
    }

    fn save(&self, conn: &Conn, fds: &mut FdOut) -> Result<persist::SavedLink, String> {
        self.save_link(conn, fds)
    }

    fn restore(
        &mut self,
        cx: &PortCtx<'_>,
        saved: persist::SavedLink,
        fds: &mut FdIn,
        status: &mut PortStatus,
    ) -> Result<Conn, TakeoverError> {
        self.restore_link(cx, saved, fds, status)
    }

    fn resume(&mut self, cx: &PortCtx<'_>, conn: &mut Conn) -> Result<(), Closed> {
        self.resume_link(cx, conn)
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
        let q = self.queues(&linked, QueuesFrom::Zero)?;
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
    fn queues(&self, l: &Linked, from: QueuesFrom) -> Result<PortQueues, Closed> {
        let role = self.role;
        let (rx_rings, tx_rings) = match role {
            Role::Master => (&l.s2m, &l.m2s),
            Role::Slave => (&l.m2s, &l.s2m),
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
            q.rx.push(Box::new(match from {
                QueuesFrom::Zero => MemifRx::new(role, ring, regions, irq, own),
                QueuesFrom::Rings => MemifRx::resume(role, ring, regions, irq, own),
            }) as Box<dyn RxQueue>);
        }
        for r in tx_rings {
            let (ring, regions, irq, own) = (r.ring, l.regions.clone(), irq(r)?, own(r));
            q.tx.push(Box::new(match from {
                QueuesFrom::Zero => MemifTx::new(role, ring, regions, irq, own),
                QueuesFrom::Rings => MemifTx::resume(role, ring, regions, irq, own),
            }) as Box<dyn TxQueue>);
        }
        Ok(q)
    }
}

/// Where a link's queues begin.
#[derive(Clone, Copy)]
enum QueuesFrom {
    /// A new connection: counters at zero.
    Zero,
    /// Taken over: where the rings are.
    Rings,
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
