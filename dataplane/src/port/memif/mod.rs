//! memif ports, as master (we listen and map the peer's memory) or slave (we
//! connect, own the memory, and reconnect when the master goes away).

pub mod handshake;
pub mod queue;
pub mod region;
pub mod ring;
pub mod socket;

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use switchyard_api::{MemifMode, MemifRole, MemifSpec, PortStatus, SocketAddr};

use crate::port::{Port, PortCtx, PortError};
use crate::queue::{PortQueues, RxQueue, TxQueue};
use crate::wire::memif::{Message, MsgType};
use handshake::{
    Established, HsError, MasterHandshake, MasterStep, Params, SlaveHandshake, SlaveStep,
};
use queue::{MemifRx, MemifTx, OwnBuffers, Side};

use crate::port::endpoint::{Endpoint, SUB_CONN, SUB_LISTENER};

pub use crate::wire::memif::Mode;

/// How long a handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A memif port's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemifConfig {
    /// The switch's role.
    pub side: Side,
    /// Socket path or abstract name.
    pub socket: SocketAddr,
    /// Connection parameters.
    pub params: Params,
    /// Group given access to the socket when the switch is master.
    pub socket_group: Option<u32>,
}

impl MemifConfig {
    /// The settings of port `name` as its (validated) spec gives them.
    pub fn from_spec(name: &str, spec: &MemifSpec) -> MemifConfig {
        use switchyard_api::spec::memif::{DEFAULT_BUFFER_SIZE, DEFAULT_RING_SIZE};
        MemifConfig {
            side: match spec.role {
                MemifRole::Master => Side::Master,
                MemifRole::Slave => Side::Slave,
            },
            socket: spec.socket.clone(),
            socket_group: spec.socket_group,
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
        }
    }
}

enum Handshake {
    Master(MasterHandshake),
    Slave(SlaveHandshake),
    Up,
}

struct Conn {
    fd: OwnedFd,
    hs: Handshake,
    started: Instant,
}

/// A memif port.
pub struct MemifPort {
    cfg: MemifConfig,
    endpoint: Endpoint,
    conn: Option<Conn>,
    status: PortStatus,
    name: String,
}

impl MemifPort {
    /// A port that is not started yet.
    pub fn new(name: &str, cfg: MemifConfig) -> MemifPort {
        MemifPort {
            endpoint: Endpoint::new(
                nix::sys::socket::SockType::SeqPacket,
                cfg.socket.clone(),
                cfg.side == Side::Master,
                cfg.socket_group,
            ),
            cfg,
            conn: None,
            status: PortStatus::default(),
            name: name.to_string(),
        }
    }

    fn try_connect(&mut self, cx: &PortCtx<'_>) {
        match self.endpoint.connect() {
            Ok(fd) => {
                if let Err(e) = cx.watch(&fd, SUB_CONN) {
                    warn!(port = %self.name, "cannot watch control socket: {e}");
                    self.endpoint.lost();
                    return;
                }
                self.conn = Some(Conn {
                    fd,
                    hs: Handshake::Slave(SlaveHandshake::new(self.cfg.params.clone())),
                    started: Instant::now(),
                });
            }
            Err(e) => {
                debug!(port = %self.name, socket = %self.cfg.socket, "connect failed, retrying: {e}");
                self.status.last_error = Some(format!("connect: {e}"));
            }
        }
    }

    fn accept_all(&mut self, cx: &PortCtx<'_>) {
        loop {
            let fd = match self.endpoint.accept() {
                Ok(Some(fd)) => fd,
                Ok(None) => return,
                Err(e) => {
                    warn!(port = %self.name, "accept failed: {e}");
                    return;
                }
            };
            if self.conn.is_some() {
                // One peer per interface, as VPP and DPDK do.
                let _ = socket::send(
                    fd.as_raw_fd(),
                    &Message::disconnect("Already connected").to_bytes(),
                    None,
                );
                continue;
            }
            let hs = MasterHandshake::new(self.cfg.params.clone());
            if socket::send(fd.as_raw_fd(), &hs.hello().to_bytes(), None).is_err()
                || cx.watch(&fd, SUB_CONN).is_err()
            {
                continue;
            }
            self.conn = Some(Conn {
                fd,
                hs: Handshake::Master(hs),
                started: Instant::now(),
            });
        }
    }

    /// Drops the connection; `say` is sent to the peer as DISCONNECT.
    fn disconnect(&mut self, cx: &PortCtx<'_>, reason: &str, say: bool) {
        let Some(conn) = self.conn.take() else { return };
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
        cx.unwatch(&conn.fd);
        drop(conn);
        self.status.link_up = false;
        self.status.rx_queues = 0;
        self.status.tx_queues = 0;
        self.status.last_error = Some(reason.to_string());
        if was_up {
            info!(port = %self.name, "link down: {reason}");
        } else {
            info!(port = %self.name, "connection dropped during handshake: {reason}");
        }
        self.endpoint.lost();
    }

    /// Drops a peer that broke the protocol (in the handshake or on the
    /// rings): counted in `faults`, logged, and told why.
    fn refuse(&mut self, cx: &PortCtx<'_>, reason: &str) {
        if self.conn.is_none() {
            return; // a late report about a connection already dropped
        }
        warn!(port = %self.name, "peer broke the memif protocol, disconnecting: {reason}");
        self.status.faults += 1;
        self.disconnect(cx, reason, true);
    }

    fn on_conn_ready(&mut self, cx: &PortCtx<'_>) {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return;
            };
            let fd = conn.fd.as_raw_fd();
            let rx = match socket::recv(fd) {
                Ok(Some(rx)) => rx,
                Ok(None) => return,
                Err(e) => {
                    let reason = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        "peer closed the connection".to_string()
                    } else {
                        format!("control socket error: {e}")
                    };
                    return self.disconnect(cx, &reason, false);
                }
            };
            let msg = match Message::parse(&rx.buf[..rx.len.min(rx.buf.len())]) {
                Ok(m) if rx.len == rx.buf.len() => m,
                Ok(_) => return self.refuse(cx, "invalid message size"),
                Err(e) => return self.refuse(cx, &e.to_string()),
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
                Err(e) if e.reply => return self.refuse(cx, &e.reason),
                Err(e) => return self.disconnect(cx, &e.reason, false),
                Ok((send, est)) => {
                    if let Some((m, afd)) = send {
                        if let Err(e) = socket::send(fd, &m.to_bytes(), afd) {
                            return self.disconnect(cx, &format!("send failed: {e}"), false);
                        }
                    }
                    if let Some(est) = est {
                        self.link_up(cx, est);
                    }
                }
            }
        }
    }

    fn link_up(&mut self, cx: &PortCtx<'_>, est: Established) {
        let side = self.cfg.side;
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
        let q = PortQueues {
            rx: rx_rings
                .into_iter()
                .map(|r| {
                    Box::new(MemifRx::new(
                        side,
                        r.ring,
                        est.regions.clone(),
                        r.irq,
                        own(r.buffers),
                    )) as Box<dyn RxQueue>
                })
                .collect(),
            tx: tx_rings
                .into_iter()
                .map(|r| {
                    Box::new(MemifTx::new(
                        side,
                        r.ring,
                        est.regions.clone(),
                        r.irq,
                        own(r.buffers),
                    )) as Box<dyn TxQueue>
                })
                .collect(),
        };
        self.status.link_up = true;
        self.status.rx_queues = q.rx.len();
        self.status.tx_queues = q.tx.len();
        self.status.peer = Some(format!("{} ({})", est.peer_if_name, est.peer_name));
        self.status.connects += 1;
        self.status.last_error = None;
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
        if let Some(c) = self.conn.as_mut() {
            c.hs = Handshake::Up;
        }
    }
}

impl Port for MemifPort {
    fn start(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError> {
        self.endpoint.start(cx)?;
        if !self.endpoint.listens() {
            self.try_connect(cx);
        }
        Ok(())
    }

    fn on_ready(&mut self, cx: &PortCtx<'_>, sub: u32) {
        match sub {
            SUB_LISTENER => self.accept_all(cx),
            _ => self.on_conn_ready(cx),
        }
    }

    fn deadline(&self) -> Option<Instant> {
        let hs = self.conn.as_ref().and_then(|c| match c.hs {
            Handshake::Up => None,
            _ => Some(c.started + HANDSHAKE_TIMEOUT),
        });
        match (hs, self.endpoint.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_timer(&mut self, cx: &PortCtx<'_>, now: Instant) {
        if let Some(c) = &self.conn {
            if !matches!(c.hs, Handshake::Up) && now >= c.started + HANDSHAKE_TIMEOUT {
                self.refuse(cx, "handshake timed out");
            }
        }
        if self.conn.is_none() && self.endpoint.retry_due(now) {
            self.try_connect(cx);
        }
    }

    fn on_fault(&mut self, cx: &PortCtx<'_>, reason: &str) {
        self.refuse(cx, reason);
    }

    fn status(&self) -> PortStatus {
        self.status.clone()
    }

    fn stop(&mut self, cx: &PortCtx<'_>) {
        self.disconnect(cx, "interface deleted", true);
        self.endpoint.stop(cx);
    }
}
