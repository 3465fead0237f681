//! The one socket port: what memif and vhost-user share, written once.
//! A [`SocketPort`] owns the [`Endpoint`] (listen, or connect and retry),
//! the one-peer policy, the port's [`PortStatus`] and the disconnect; a
//! socket kind adds only its [`Protocol`] on the one connection.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Instant;

use nix::sys::socket::SockType;
use tracing::{debug, info, warn};

use switchyard_api::{PortStatus, Side, SocketSpec};

use super::endpoint::{Endpoint, SUB_CONN, SUB_LISTENER};
use super::handover::{self, FdIn, FdOut, HandoverError, Saved};
use super::{Port, PortCtx, PortError};

/// Why a connection ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// What happened, for the log and the port's `last_error`.
    pub reason: String,
    /// The peer broke the protocol (counted in the port's `faults`).
    pub fault: bool,
    /// Tell the peer why, where the protocol has a way to (memif's
    /// DISCONNECT).
    pub say: bool,
}

impl Closed {
    /// The peer broke the protocol: it is told why and the fault counted.
    pub fn fault(reason: impl Into<String>) -> Closed {
        Closed {
            reason: reason.into(),
            fault: true,
            say: true,
        }
    }

    /// The connection is gone or unusable (closed, or an I/O error): no
    /// fault, and nothing to say.
    pub fn gone(reason: impl Into<String>) -> Closed {
        Closed {
            reason: reason.into(),
            fault: false,
            say: false,
        }
    }
}

/// A socket kind's protocol on one connection: all that a kind adds to
/// [`SocketPort`].
pub trait Protocol: Send {
    /// One connection's state.
    type Conn: Send;
    /// The kind's name, for logs.
    const KIND: &'static str;
    /// The socket's type.
    const SOCK_TYPE: SockType;

    /// Takes a new connection: accepted (`side` [`Side::Listen`]) or
    /// connected. `Err` says why it cannot be used (it is then closed).
    fn open(&mut self, cx: &PortCtx<'_>, fd: OwnedFd, side: Side) -> Result<Self::Conn, String>;
    /// The connection's socket, which the port watches.
    fn fd(conn: &Self::Conn) -> BorrowedFd<'_>;
    /// A second peer while one is connected (one peer per socket, as VPP
    /// and DPDK do): closed at once, so a flood holds nothing. A kind may
    /// say why first.
    fn refuse_extra(&mut self, fd: OwnedFd) {
        drop(fd);
    }
    /// The connection's socket is readable (or hung up). The kind updates
    /// `status` as its link comes up or goes down.
    fn on_ready(
        &mut self,
        cx: &PortCtx<'_>,
        conn: &mut Self::Conn,
        status: &mut PortStatus,
    ) -> Result<(), Closed>;
    /// When the connection next wants [`Protocol::on_timer`] (a handshake
    /// or a message that must finish by then).
    fn deadline(&self, conn: &Self::Conn) -> Option<Instant>;
    /// The deadline passed.
    fn on_timer(&mut self, conn: &mut Self::Conn, now: Instant) -> Result<(), Closed>;
    /// Ends the connection (no longer watched), telling the peer
    /// `reason` if `say` and the protocol can. Returns whether its link was
    /// up.
    fn close(&mut self, cx: &PortCtx<'_>, conn: Self::Conn, reason: &str, say: bool) -> bool;
    /// Writes the connection down for a takeover (see [`Port::save`]), its
    /// socket and other fds into `fds`; `None` while a handshake is half
    /// done, which is then started again (the connection is closed).
    /// `Err` refuses the takeover, saying why.
    fn save(&self, conn: &Self::Conn, fds: &mut FdOut) -> Result<Option<Saved>, String>;
    /// Takes up a connection saved by [`Protocol::save`] in another
    /// process: the link comes up where it was, its queues where the rings
    /// are. `status` is the port's status as saved.
    fn restore(
        &mut self,
        cx: &PortCtx<'_>,
        saved: Saved,
        fds: &mut FdIn,
        status: &mut PortStatus,
    ) -> Result<Self::Conn, HandoverError>;
    /// See [`Port::requeue`]; `Err` drops the connection.
    fn requeue(&mut self, cx: &PortCtx<'_>, conn: &mut Self::Conn) -> Result<(), Closed>;
}

/// A socket port as saved for a takeover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedSocketPort {
    /// The listener's index among the fds, if the switch listens.
    listener: Option<usize>,
    /// The connection, as the kind saved it.
    conn: Option<Saved>,
    status: PortStatus,
}

/// A port on a socket, speaking protocol `P`.
pub struct SocketPort<P: Protocol> {
    name: String,
    proto: P,
    endpoint: Endpoint,
    conn: Option<P::Conn>,
    status: PortStatus,
}

impl<P: Protocol> SocketPort<P> {
    /// Port `name` at `socket` (the switch listens or connects as its role
    /// says), not started yet.
    pub fn new(name: &str, socket: SocketSpec<'_>, proto: P) -> SocketPort<P> {
        SocketPort {
            name: name.to_string(),
            proto,
            endpoint: Endpoint::new(
                P::SOCK_TYPE,
                socket.addr.clone(),
                socket.switch_creates(),
                socket.group,
            ),
            conn: None,
            status: PortStatus::default(),
        }
    }

    /// Opens `fd` with the protocol and watches it.
    fn open(&mut self, cx: &PortCtx<'_>, fd: OwnedFd, side: Side) -> Result<(), String> {
        let conn = self.proto.open(cx, fd, side)?;
        if let Err(e) = cx.watch(P::fd(&conn), SUB_CONN) {
            self.proto.close(cx, conn, "", false);
            return Err(format!("cannot watch the socket: {e}"));
        }
        self.conn = Some(conn);
        Ok(())
    }

    fn try_connect(&mut self, cx: &PortCtx<'_>) {
        let res = match self.endpoint.connect() {
            Ok(fd) => self
                .open(cx, fd, Side::Connect)
                .inspect_err(|_| self.endpoint.lost()),
            Err(e) => Err(format!("connect: {e}")),
        };
        if let Err(e) = res {
            debug!(port = %self.name, socket = %self.endpoint.address(), "{e}; retrying");
            self.status.last_error = Some(e);
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
                debug!(port = %self.name, "refusing a second peer");
                self.proto.refuse_extra(fd);
                continue;
            }
            if let Err(e) = self.open(cx, fd, Side::Listen) {
                warn!(port = %self.name, "{e}");
            }
        }
    }

    /// Drops the connection, if there is one (a late report about one
    /// already dropped is ignored).
    fn disconnect(&mut self, cx: &PortCtx<'_>, why: Closed) {
        let Some(conn) = self.conn.take() else { return };
        cx.unwatch(P::fd(&conn));
        let was_up = self.proto.close(cx, conn, &why.reason, why.say);
        let (name, reason, kind) = (&self.name, &why.reason, P::KIND);
        if why.fault {
            self.status.faults += 1;
            warn!(port = %name, "peer broke the {kind} protocol, disconnecting: {reason}");
        } else if was_up {
            info!(port = %name, "link down: {reason}");
        } else {
            info!(port = %name, "connection dropped before the link came up: {reason}");
        }
        self.status.link_up = false;
        self.status.rx_queues = 0;
        self.status.tx_queues = 0;
        self.status.peer = None;
        self.status.last_error = Some(why.reason);
        self.endpoint.lost();
    }
}

impl<P: Protocol> Port for SocketPort<P> {
    fn start(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError> {
        self.endpoint.start(cx)?;
        if !self.endpoint.listens() {
            self.try_connect(cx);
        }
        Ok(())
    }

    fn on_ready(&mut self, cx: &PortCtx<'_>, sub: u32) {
        if sub == SUB_LISTENER {
            return self.accept_all(cx);
        }
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if let Err(why) = self.proto.on_ready(cx, conn, &mut self.status) {
            self.disconnect(cx, why);
        }
    }

    fn deadline(&self) -> Option<Instant> {
        let conn = self.conn.as_ref().and_then(|c| self.proto.deadline(c));
        match (conn, self.endpoint.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_timer(&mut self, cx: &PortCtx<'_>, now: Instant) {
        if let Some(conn) = self.conn.as_mut() {
            if let Err(why) = self.proto.on_timer(conn, now) {
                self.disconnect(cx, why);
            }
        }
        if self.conn.is_none() && self.endpoint.retry_due(now) {
            self.try_connect(cx);
        }
    }

    fn on_fault(&mut self, cx: &PortCtx<'_>, reason: &str) {
        self.disconnect(cx, Closed::fault(reason));
    }

    fn status(&self) -> PortStatus {
        self.status.clone()
    }

    fn stop(&mut self, cx: &PortCtx<'_>) {
        self.disconnect(
            cx,
            Closed {
                say: true,
                ..Closed::gone("interface deleted")
            },
        );
        self.endpoint.stop(cx);
    }

    fn save(&mut self, cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<Saved, PortError> {
        let conn = match &self.conn {
            Some(c) => match self.proto.save(c, fds).map_err(PortError::Other)? {
                Some(saved) => Some(saved),
                None => {
                    // Nothing of it has reached the workers: the peer
                    // starts its handshake again, as after any failed one.
                    self.disconnect(
                        cx,
                        Closed {
                            say: true,
                            ..Closed::gone("the switch is being upgraded: handshake restarted")
                        },
                    );
                    None
                }
            },
            None => None,
        };
        Ok(handover::write(&SavedSocketPort {
            listener: self.endpoint.listener().map(|l| fds.add(l)),
            conn,
            status: self.status.clone(),
        }))
    }

    fn restore(&mut self, cx: &PortCtx<'_>, saved: Saved, fds: &mut FdIn) -> Result<(), PortError> {
        let saved: SavedSocketPort = handover::read(saved)?;
        if saved.listener.is_some() != self.endpoint.listens() {
            return Err(HandoverError::Invalid(format!(
                "the saved port {} listen, this one does{}",
                if saved.listener.is_some() {
                    "does"
                } else {
                    "does not"
                },
                if self.endpoint.listens() { "" } else { " not" }
            ))
            .into());
        }
        self.status = saved.status;
        if let Some(i) = saved.listener {
            self.endpoint.adopt(cx, fds.take(i)?)?;
        }
        match saved.conn {
            Some(c) => {
                let conn = self.proto.restore(cx, c, fds, &mut self.status)?;
                if let Err(e) = cx.watch(P::fd(&conn), SUB_CONN) {
                    self.proto.close(cx, conn, "", false);
                    return Err(HandoverError::Io(e).into());
                }
                self.conn = Some(conn);
            }
            None => {
                self.status.link_up = false;
                if !self.endpoint.listens() {
                    self.try_connect(cx);
                }
            }
        }
        Ok(())
    }

    fn requeue(&mut self, cx: &PortCtx<'_>) {
        if let Some(conn) = self.conn.as_mut() {
            if let Err(why) = self.proto.requeue(cx, conn) {
                self.disconnect(cx, why);
            }
        }
    }
}
