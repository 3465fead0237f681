//! The one socket port: what memif and vhost-user share, written once.
//! A [`SocketPort`] owns its end of the socket (a member of the socket's
//! [`Listener`], or a [`Connector`] that retries), the one-peer policy, the
//! port's [`PortStatus`] and the disconnect; a socket kind adds only its
//! [`Protocol`] on the one connection. Its takeover is `persist.rs`.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info, warn};

use switchyard_api::{PortStatus, Side, SocketAddr, SocketSpec};

use super::endpoint::Connector;
use super::listener::{Joining, ListenError, Listener, Listeners};
use super::protocol::{Closed, Protocol, Sub};
use crate::port::takeover::{FdIn, FdOut, Saved};
use crate::port::{Port, PortCtx, PortError, Start};

/// A port on a socket, speaking protocol `P`.
pub struct SocketPort<P: Protocol> {
    pub(super) name: String,
    pub(super) proto: P,
    pub(super) end: End<P>,
    pub(super) conn: Option<P::Conn>,
    pub(super) status: PortStatus,
}

/// A port's end of its socket.
pub(super) enum End<P: Protocol> {
    /// The switch listens: once started, the port is a member of the
    /// socket's listener.
    Listens {
        addr: SocketAddr,
        group: Option<u32>,
        interface: u32,
        /// The daemon's table of listening sockets.
        table: Arc<Listeners>,
        /// The listener, once the port has joined it.
        member: Option<Arc<Listener<P>>>,
    },
    /// The switch connects.
    Connects(Connector),
}

impl<P: Protocol> SocketPort<P> {
    /// Port `name` at `socket` (the switch listens, in the daemon's table
    /// of listening sockets, or connects, as its role says), not started
    /// yet.
    pub fn new(
        name: &str,
        socket: SocketSpec<'_>,
        proto: P,
        listeners: &Arc<Listeners>,
    ) -> SocketPort<P> {
        let end = if socket.switch_creates() {
            End::Listens {
                addr: socket.addr.clone(),
                group: socket.group,
                interface: socket.interface.unwrap_or(0),
                table: listeners.clone(),
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
    pub(super) fn join(
        &mut self,
        cx: &PortCtx<'_>,
        handed: Option<OwnedFd>,
    ) -> Result<(), PortError> {
        let offer = self.proto.offer();
        if let End::Listens {
            addr,
            group,
            interface,
            table,
            member,
        } = &mut self.end
        {
            let j = Joining {
                addr,
                group: *group,
                interface: *interface,
                offer,
            };
            let l = table
                .join(cx.reactor, cx.id, j, handed)
                .map_err(|e| match e {
                    ListenError::InUse(a) => PortError::SocketInUse(a),
                    ListenError::Socket { path, cause } => PortError::Socket { path, cause },
                    e => PortError::Other(e.to_string()),
                })?;
            *member = Some(l);
        }
        Ok(())
    }

    /// Leaves the socket's listener, if the port is a member.
    pub(super) fn leave(&mut self, cx: &PortCtx<'_>) {
        if let End::Listens { table, member, .. } = &mut self.end {
            if let Some(l) = member.take() {
                table.leave(cx.reactor, &l, cx.id);
            }
        }
    }

    /// Leaves the listener a takeover handed over, its file left to the
    /// switch that still serves it.
    pub(super) fn leave_handed(&mut self, cx: &PortCtx<'_>) {
        if let End::Listens { table, member, .. } = &mut self.end {
            if let Some(l) = member.take() {
                table.leave_keeping_file(cx.reactor, &l, cx.id);
            }
        }
    }

    pub(super) fn listener(&self) -> Option<&Arc<Listener<P>>> {
        match &self.end {
            End::Listens { member, .. } => member.as_ref(),
            End::Connects(_) => None,
        }
    }

    /// Opens `fd` with the protocol and watches it.
    fn open(&mut self, cx: &PortCtx<'_>, fd: OwnedFd, side: Side) -> Result<(), String> {
        let conn = self.proto.open(cx, fd, side)?;
        if let Err(e) = self.watch(cx, conn) {
            return Err(format!("cannot watch the socket: {e}"));
        }
        Ok(())
    }

    /// Watches `conn` and keeps it as the port's connection; one that
    /// cannot be watched is closed.
    pub(super) fn watch(&mut self, cx: &PortCtx<'_>, conn: P::Conn) -> std::io::Result<()> {
        if let Err(e) = cx.watch(P::fd(&conn), Sub::Conn as u32) {
            self.proto.close(cx, conn, "", false);
            return Err(e);
        }
        self.conn = Some(conn);
        Ok(())
    }

    pub(super) fn try_connect(&mut self, cx: &PortCtx<'_>) {
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
    pub(super) fn disconnect(&mut self, cx: &PortCtx<'_>, why: Closed) {
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
    /// Without a connection, only the daemon's thread changes the port
    /// (accepting, connecting, handshakes).
    fn quiet(&self) -> bool {
        self.conn.is_none()
    }

    /// Listens (joins the socket's listener) or makes the first connect
    /// attempt; a socket port has no interface to wait for.
    fn start(&mut self, cx: &PortCtx<'_>, _: Start) -> Result<(), PortError> {
        match self.end {
            End::Listens { .. } => self.join(cx, None),
            End::Connects(_) => {
                self.try_connect(cx);
                Ok(())
            }
        }
    }

    fn on_ready(&mut self, cx: &PortCtx<'_>, sub: u32) {
        match Sub::from_u32(sub) {
            Some(Sub::Handed) => self.take_handed(cx),
            Some(Sub::Conn) => {
                let Some(conn) = self.conn.as_mut() else {
                    return;
                };
                if let Err(why) = self.proto.on_ready(cx, conn, &mut self.status) {
                    self.disconnect(cx, why);
                }
            }
            // A listening socket's are under its own token.
            Some(Sub::Listener | Sub::Unnamed) | None => {}
        }
    }

    fn deadline(&self) -> Option<Instant> {
        let conn = self.conn.as_ref().and_then(|c| self.proto.deadline(c));
        let end = match &self.end {
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
        if let End::Connects(c) = &self.end {
            if self.conn.is_none() && c.retry_due(now) {
                self.try_connect(cx);
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

    fn pause(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError> {
        self.pause_conn(cx);
        Ok(())
    }

    fn save(&self, cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<Saved, PortError> {
        crate::port::save_as(self, cx, fds)
    }

    fn restore(&mut self, cx: &PortCtx<'_>, saved: Saved, fds: &mut FdIn) -> Result<(), PortError> {
        crate::port::restore_as(self, cx, saved, fds)
    }

    fn resume(&mut self, cx: &PortCtx<'_>) {
        self.resume_conn(cx);
    }
}
