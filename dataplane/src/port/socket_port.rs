//! The one socket port: what memif and vhost-user share, written once.
//! A [`SocketPort`] owns its end of the socket (a member of the socket's
//! [`Listener`], or a [`Connector`] that retries), the one-peer policy, the
//! port's [`PortStatus`] and the disconnect; a socket kind adds only its
//! [`Protocol`] on the one connection.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use nix::sys::socket::SockType;
use tracing::{debug, info, warn};

use switchyard_api::{PortStatus, Side, SocketAddr, SocketSpec};

use super::endpoint::{Connector, SUB_CONN};
use super::handover::{self, FdIn, FdOut, HandoverError, Saved};
use super::listener::{Joining, Listener, SUB_HANDED, SUB_LISTENER, SUB_UNNAMED};
use super::{Port, PortCtx, PortError};
use crate::types::PortId;

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
pub trait Protocol: Send + 'static {
    /// One connection's state.
    type Conn: Send;
    /// What a peer of a socket the switch listens on says first, naming
    /// the interface it wants (memif: its INIT); `()` for a kind whose
    /// peers name none.
    type Intro: Send + 'static;
    /// What a port asks of the greeting each new peer of its socket gets
    /// (memif: its queue pairs, the most that HELLO may offer).
    type Offer: Clone + Send + 'static;
    /// The kind's name, for logs.
    const KIND: &'static str;
    /// The socket's type.
    const SOCK_TYPE: SockType;

    /// What this port asks of the greeting.
    fn offer(&self) -> Self::Offer;
    /// Greets a peer that connected to a socket the switch listens on,
    /// for the ports there, which ask `offers` (memif's HELLO). `Err`:
    /// the peer cannot be greeted, and is closed.
    fn greet(fd: BorrowedFd<'_>, offers: &[Self::Offer]) -> Result<(), String> {
        let _ = (fd, offers);
        Ok(())
    }
    /// Hears a greeted peer until it names the interface it wants:
    /// `Ok(None)`, not yet; `Ok(Some((interface, intro)))` hands it to the
    /// port of that interface, with what it said. A kind whose peers name
    /// none answers interface 0 at once.
    fn introduce(fd: BorrowedFd<'_>) -> Result<Option<(u32, Self::Intro)>, Closed>;
    /// Closes a peer no port takes (an interface nobody serves, or one
    /// already connected: one peer per interface, as VPP and DPDK serve),
    /// telling it `reason` where the protocol can.
    fn refuse(fd: OwnedFd, reason: &str) {
        let _ = reason;
        drop(fd);
    }
    /// Takes a new connection: accepted (`side` [`Side::Listen`], then
    /// [`Protocol::on_intro`]) or connected. `Err` says why it cannot be
    /// used (it is then closed).
    fn open(&mut self, cx: &PortCtx<'_>, fd: OwnedFd, side: Side) -> Result<Self::Conn, String>;
    /// What the peer of an accepted connection said to name its interface
    /// ([`Protocol::introduce`]), which the connection now takes up.
    fn on_intro(
        &mut self,
        cx: &PortCtx<'_>,
        conn: &mut Self::Conn,
        intro: Self::Intro,
        status: &mut PortStatus,
    ) -> Result<(), Closed>;
    /// The connection's socket, which the port watches.
    fn fd(conn: &Self::Conn) -> BorrowedFd<'_>;
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
    end: End<P>,
    conn: Option<P::Conn>,
    status: PortStatus,
}

/// A port's end of its socket.
enum End<P: Protocol> {
    /// The switch listens: once started, the port is a member of the
    /// socket's listener, as port `port`.
    Listens {
        addr: SocketAddr,
        group: Option<u32>,
        interface: u32,
        member: Option<(Arc<Listener<P>>, PortId)>,
    },
    /// The switch connects.
    Connects(Connector),
}

impl<P: Protocol> SocketPort<P> {
    /// Port `name` at `socket` (the switch listens or connects as its role
    /// says), not started yet.
    pub fn new(name: &str, socket: SocketSpec<'_>, proto: P) -> SocketPort<P> {
        let end = if socket.switch_creates() {
            End::Listens {
                addr: socket.addr.clone(),
                group: socket.group,
                interface: socket.interface.unwrap_or(0),
                member: None,
            }
        } else {
            End::Connects(Connector::new(P::SOCK_TYPE, socket.addr.clone()))
        };
        SocketPort {
            name: name.to_string(),
            proto,
            end,
            conn: None,
            status: PortStatus::default(),
        }
    }

    /// Joins the socket's listener (on `handed`, a listening socket handed
    /// over, if it is the first there).
    fn join(&mut self, cx: &PortCtx<'_>, handed: Option<OwnedFd>) -> Result<(), PortError> {
        let offer = self.proto.offer();
        if let End::Listens {
            addr,
            group,
            interface,
            member,
        } = &mut self.end
        {
            let j = Joining {
                addr,
                group: *group,
                interface: *interface,
                offer,
            };
            *member = Some((Listener::join(cx, j, handed)?, cx.id));
        }
        Ok(())
    }

    /// Leaves the socket's listener, if the port is a member.
    fn leave(&mut self, cx: &PortCtx<'_>) {
        if let End::Listens { member, .. } = &mut self.end {
            if let Some((l, _)) = member.take() {
                l.leave(cx);
            }
        }
    }

    fn listener(&self) -> Option<&Arc<Listener<P>>> {
        match &self.end {
            End::Listens {
                member: Some((l, _)),
                ..
            } => Some(l),
            _ => None,
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
        let End::Connects(connector) = &mut self.end else {
            return;
        };
        let res = connector
            .connect()
            .map_err(|e| format!("connect: {e}"))
            .and_then(|fd| self.open(cx, fd, Side::Connect));
        if let Err(e) = res {
            if let End::Connects(c) = &mut self.end {
                c.lost();
                debug!(port = %self.name, socket = %c.address(), "{e}; retrying");
            }
            self.status.last_error = Some(e);
        }
    }

    /// Takes the connections the listener handed to this port: the first,
    /// if the port has none; any other is refused (one peer per
    /// interface, as VPP and DPDK serve).
    fn take_handed(&mut self, cx: &PortCtx<'_>) {
        let Some(l) = self.listener().cloned() else {
            return;
        };
        for (fd, intro) in l.take(cx.id) {
            if self.conn.is_some() {
                debug!(port = %self.name, "refusing a second peer");
                P::refuse(fd, "Already connected");
                continue;
            }
            if let Err(e) = self.open(cx, fd, Side::Listen) {
                warn!(port = %self.name, "{e}");
                continue;
            }
            let Some(conn) = self.conn.as_mut() else {
                continue;
            };
            if let Err(why) = self.proto.on_intro(cx, conn, intro, &mut self.status) {
                self.disconnect(cx, why);
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
        if let End::Connects(c) = &mut self.end {
            c.lost();
        }
    }
}

impl<P: Protocol> Port for SocketPort<P> {
    fn start(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError> {
        match self.end {
            End::Listens { .. } => self.join(cx, None),
            End::Connects(_) => {
                self.try_connect(cx);
                Ok(())
            }
        }
    }

    fn on_ready(&mut self, cx: &PortCtx<'_>, sub: u32) {
        match sub {
            SUB_LISTENER | SUB_UNNAMED => {
                if let Some(l) = self.listener() {
                    l.on_ready(cx, sub);
                }
            }
            SUB_HANDED => self.take_handed(cx),
            _ => {
                let Some(conn) = self.conn.as_mut() else {
                    return;
                };
                if let Err(why) = self.proto.on_ready(cx, conn, &mut self.status) {
                    self.disconnect(cx, why);
                }
            }
        }
    }

    fn deadline(&self) -> Option<Instant> {
        let conn = self.conn.as_ref().and_then(|c| self.proto.deadline(c));
        let end = match &self.end {
            End::Listens {
                member: Some((l, port)),
                ..
            } => l.deadline(*port),
            End::Listens { .. } => None,
            End::Connects(c) => c.deadline(),
        };
        match (conn, end) {
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
        match &self.end {
            End::Listens {
                member: Some((l, _)),
                ..
            } => l.expire(cx, now),
            End::Listens { .. } => {}
            End::Connects(c) => {
                if self.conn.is_none() && c.retry_due(now) {
                    self.try_connect(cx);
                }
            }
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
        self.leave(cx);
        if let End::Connects(c) = &mut self.end {
            c.stop();
        }
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
        // Every port on a shared socket hands it over; the new switch
        // listens on the first and closes the others' duplicates.
        Ok(handover::write(&SavedSocketPort {
            listener: self.listener().and_then(|l| l.save(fds)),
            conn,
            status: self.status.clone(),
        }))
    }

    fn restore(&mut self, cx: &PortCtx<'_>, saved: Saved, fds: &mut FdIn) -> Result<(), PortError> {
        let saved: SavedSocketPort = handover::read(saved)?;
        let listens = matches!(self.end, End::Listens { .. });
        if saved.listener.is_some() != listens {
            return Err(HandoverError::Invalid(format!(
                "the saved port {} listen, this one does{}",
                if saved.listener.is_some() {
                    "does"
                } else {
                    "does not"
                },
                if listens { "" } else { " not" }
            ))
            .into());
        }
        self.status = saved.status;
        if let Some(i) = saved.listener {
            self.join(cx, Some(fds.take(i)?))?;
        }
        let restored = match saved.conn {
            Some(c) => self
                .proto
                .restore(cx, c, fds, &mut self.status)
                .and_then(|conn| match cx.watch(P::fd(&conn), SUB_CONN) {
                    Ok(()) => {
                        self.conn = Some(conn);
                        Ok(())
                    }
                    Err(e) => {
                        self.proto.close(cx, conn, "", false);
                        Err(HandoverError::Io(e))
                    }
                }),
            None => {
                self.status.link_up = false;
                self.try_connect(cx);
                Ok(())
            }
        };
        if restored.is_err() {
            // The port is dropped, not stopped: it leaves the socket now.
            self.leave(cx);
        }
        Ok(restored?)
    }

    fn requeue(&mut self, cx: &PortCtx<'_>) {
        if let Some(conn) = self.conn.as_mut() {
            if let Err(why) = self.proto.requeue(cx, conn) {
                self.disconnect(cx, why);
            }
        }
    }
}
