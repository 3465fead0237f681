//! memif ports, as master (we listen and map the peer's memory) or slave (we
//! connect, own the memory, and reconnect when the master goes away): the
//! memif [`Protocol`] on a [`SocketPort`].

pub mod handshake;
pub mod queue;
pub mod region;
pub mod ring;
pub mod socket;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::socket::SockType;
use tracing::info;

use switchyard_api::{MemifMode, MemifRole, MemifSpec, PortStatus};

use crate::port::socket_port::{Closed, Protocol, SocketPort};
use crate::port::{Port, PortCtx};
use crate::queue::{PortQueues, RxQueue, TxQueue};
use crate::wire::memif::{Message, MsgType};
use handshake::{
    Established, HsError, MasterHandshake, MasterStep, Params, SlaveHandshake, SlaveStep,
};
use queue::{MemifRx, MemifTx, OwnBuffers, Side};

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
    Up,
}

/// One connection.
pub struct Conn {
    fd: OwnedFd,
    hs: Handshake,
    started: Instant,
}

impl Protocol for Memif {
    type Conn = Conn;
    const KIND: &'static str = "memif";
    const SOCK_TYPE: SockType = SockType::SeqPacket;

    fn open(
        &mut self,
        _cx: &PortCtx<'_>,
        fd: OwnedFd,
        side: switchyard_api::Side,
    ) -> Result<Conn, String> {
        let hs = match side {
            switchyard_api::Side::Listen => {
                let hs = MasterHandshake::new(self.params.clone());
                socket::send(fd.as_raw_fd(), &hs.hello().to_bytes(), None)
                    .map_err(|e| format!("sending HELLO: {e}"))?;
                Handshake::Master(hs)
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

    fn fd(conn: &Conn) -> BorrowedFd<'_> {
        conn.fd.as_fd()
    }

    fn refuse_extra(&mut self, fd: OwnedFd) {
        // As VPP and DPDK do: the peer is told why.
        let _ = socket::send(
            fd.as_raw_fd(),
            &Message::disconnect("Already connected").to_bytes(),
            None,
        );
    }

    fn on_ready(
        &mut self,
        cx: &PortCtx<'_>,
        conn: &mut Conn,
        status: &mut PortStatus,
    ) -> Result<(), Closed> {
        let fd = conn.fd.as_raw_fd();
        loop {
            let rx = match socket::recv(fd) {
                Ok(Some(rx)) => rx,
                Ok(None) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(Closed::gone("peer closed the connection"))
                }
                Err(e) => return Err(Closed::gone(format!("control socket error: {e}"))),
            };
            let msg = match Message::parse(&rx.buf[..rx.len.min(rx.buf.len())]) {
                Ok(m) if rx.len == rx.buf.len() => m,
                Ok(_) => return Err(Closed::fault("invalid message size")),
                Err(e) => return Err(Closed::fault(e.to_string())),
            };
            let step = match &mut conn.hs {
                Handshake::Master(m) => m.on_message(msg, rx.fd).map(|s| match s {
                    MasterStep::Reply(r) => (Some((r, None)), None),
                    MasterStep::Connected(r, est) => (Some((r, None)), Some(est)),
                }),
                Handshake::Slave(s) => s.on_message(msg).map(|s| match s {
                    SlaveStep::Send(m, fd) => (Some((m, fd)), None),
                    SlaveStep::Wait => (None, None),
                    SlaveStep::Connected(est) => (None, Some(est)),
                }),
                Handshake::Up => match msg {
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
            match step {
                // `reply` is false when the peer itself said DISCONNECT.
                Err(e) if e.reply => return Err(Closed::fault(e.reason)),
                Err(e) => return Err(Closed::gone(e.reason)),
                Ok((send, est)) => {
                    if let Some((m, afd)) = send {
                        socket::send(fd, &m.to_bytes(), afd)
                            .map_err(|e| Closed::gone(format!("send failed: {e}")))?;
                    }
                    if let Some(est) = est {
                        self.link_up(cx, est, status);
                        conn.hs = Handshake::Up;
                    }
                }
            }
        }
    }

    fn deadline(&self, conn: &Conn) -> Option<Instant> {
        match conn.hs {
            Handshake::Up => None,
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
        let was_up = matches!(conn.hs, Handshake::Up);
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
}

impl Memif {
    fn link_up(&mut self, cx: &PortCtx<'_>, est: Established, status: &mut PortStatus) {
        let side = self.side;
        let (rx_rings, tx_rings) = match side {
            Side::Master => (est.s2m, est.m2s),
            Side::Slave => (est.m2s, est.s2m),
        };
        let own = |first: Option<u32>| {
            first.map(|first| OwnBuffers {
                first,
                size: est.buffer_size,
            })
        };
        // Each ring with the regions and the buffers it owns, if any.
        let parts = |r: handshake::RingSetup| (r.ring, est.regions.clone(), r.irq, own(r.buffers));
        let q = PortQueues {
            rx: rx_rings
                .into_iter()
                .map(parts)
                .map(|(ring, regions, irq, own)| {
                    Box::new(MemifRx::new(side, ring, regions, irq, own)) as Box<dyn RxQueue>
                })
                .collect(),
            tx: tx_rings
                .into_iter()
                .map(parts)
                .map(|(ring, regions, irq, own)| {
                    Box::new(MemifTx::new(side, ring, regions, irq, own)) as Box<dyn TxQueue>
                })
                .collect(),
        };
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
            regions = est.regions.len(),
            unsealed = est.regions.watched_count(),
            "link up"
        );
        cx.attach(q);
    }
}
