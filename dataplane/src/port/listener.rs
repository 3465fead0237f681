//! A socket the switch listens on, and the ports it serves.
//!
//! A memif socket carries several interfaces, told apart by the id a peer
//! names in its first message (`INIT`), as VPP's and DPDK's memif sockets
//! do. So a listening socket is not one port's: every listening
//! [`SocketPort`](super::socket_port::SocketPort) is a member of the one
//! [`Listener`] at its address. The listener accepts each peer, greets it
//! ([`Protocol::greet`]), hears it until it names its interface
//! ([`Protocol::introduce`]) and hands the connection to that interface's
//! port. A socket that serves one port (every vhost-user socket) is the
//! case of one member, on the same path.
//!
//! - The first member watches the listening socket and the peers not named
//!   yet, under its own token; when it leaves, the next member takes them
//!   up. The socket file goes with the last member.
//! - A connection for another port is kept in the listener and
//!   [posted](crate::reactor::Reactor::post) to that port with
//!   [`SUB_HANDED`]; the port takes it with [`Listener::take`].
//! - A peer that names no member's interface is told so and closed (as VPP
//!   and DPDK do); one that names nothing in [`NAMING_TIMEOUT`], or breaks
//!   the protocol first, is closed. Either belongs to no port: it is
//!   logged, and counts nowhere.
//! - At most [`MAX_UNNAMED`] peers wait unnamed; a newer one closes the
//!   oldest, so a peer that floods the socket with connections holds
//!   nothing for long, and a peer that names its interface at once (as
//!   every real one does) gets through.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use nix::sys::socket::UnixAddr;
use tracing::{debug, info, warn};

use switchyard_api::SocketAddr;

use super::endpoint::{accept, listen, unix_addr};
use super::handover::FdOut;
use super::socket_port::Protocol;
use super::{PortCtx, PortError};
use crate::reactor::Token;
use crate::types::PortId;

/// The sub-token of the listening socket.
pub const SUB_LISTENER: u32 = 0;
/// The sub-token of the peers that have not named their interface.
pub const SUB_UNNAMED: u32 = 2;
/// The sub-token by which a port learns that a connection was handed to it.
pub const SUB_HANDED: u32 = 3;
/// How many peers may wait unnamed at once.
pub const MAX_UNNAMED: usize = 16;
/// How long a peer has to name its interface.
pub const NAMING_TIMEOUT: Duration = Duration::from_secs(5);

/// A listening socket and the ports on it.
pub struct Listener<P: Protocol> {
    addr: SocketAddr,
    inner: Mutex<Inner<P>>,
}

struct Inner<P: Protocol> {
    /// The listening socket; `None` once the last member left.
    socket: Option<OwnedFd>,
    /// In joining order; the first watches.
    members: Vec<Member<P>>,
    /// Peers that have not named their interface yet, oldest first.
    unnamed: VecDeque<Unnamed>,
    /// Connections handed to a member, not yet taken.
    handed: Vec<(PortId, OwnedFd, P::Intro)>,
}

/// A port on the socket.
struct Member<P: Protocol> {
    port: PortId,
    /// The interface it serves (memif's id; 0 on a socket of one port).
    interface: u32,
    /// What it asks of the greeting (memif: its queue pairs).
    offer: P::Offer,
}

struct Unnamed {
    fd: OwnedFd,
    since: Instant,
}

/// The listeners open, by address. A listener of another socket kind at
/// the address does not downcast, and is refused.
fn registry() -> &'static Mutex<HashMap<SocketAddr, Weak<dyn Any + Send + Sync>>> {
    static R: OnceLock<Mutex<HashMap<SocketAddr, Weak<dyn Any + Send + Sync>>>> = OnceLock::new();
    R.get_or_init(Mutex::default)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A member of the listener at `addr`, as a port joins it.
pub struct Joining<'a, P: Protocol> {
    /// Where the socket is.
    pub addr: &'a SocketAddr,
    /// The group a new socket file is given.
    pub group: Option<u32>,
    /// The interface the port serves.
    pub interface: u32,
    /// What it asks of the greeting.
    pub offer: P::Offer,
}

impl<P: Protocol + 'static> Listener<P> {
    /// Joins port `cx.id` to the listener at `j.addr`: the one open there
    /// (`handed`, a listener another switch handed over, is then a
    /// duplicate of its socket, and closed), or a new one, listening on
    /// `handed` or on a socket bound now. A new listener is watched under
    /// `cx.id`.
    pub fn join(
        cx: &PortCtx<'_>,
        j: Joining<'_, P>,
        handed: Option<OwnedFd>,
    ) -> Result<Arc<Listener<P>>, PortError> {
        let mut r = lock(registry());
        r.retain(|_, l| l.strong_count() > 0);
        let member = Member {
            port: cx.id,
            interface: j.interface,
            offer: j.offer,
        };
        if let Some(open) = r.get(j.addr).and_then(Weak::upgrade) {
            let l = open.downcast::<Listener<P>>().map_err(|_| {
                PortError::Other(format!(
                    "socket {}: the switch serves another kind of port on it",
                    j.addr
                ))
            })?;
            {
                let mut inner = lock(&l.inner);
                if let Some(m) = inner.members.iter().find(|m| m.interface == j.interface) {
                    return Err(PortError::Other(format!(
                        "socket {}: interface {} is served by another port (slot {})",
                        j.addr, j.interface, m.port
                    )));
                }
                inner.members.push(member);
            }
            return Ok(l);
        }
        let err = |cause: io::Error| {
            if cause.kind() == io::ErrorKind::AddrInUse {
                PortError::SocketInUse(j.addr.to_string())
            } else {
                PortError::Socket {
                    path: j.addr.to_string(),
                    cause,
                }
            }
        };
        let socket = match handed {
            Some(fd) => adopt::<P>(j.addr, fd).map_err(err)?,
            None => listen(P::SOCK_TYPE, j.addr, None, j.group).map_err(err)?,
        };
        cx.watch(&socket, SUB_LISTENER).map_err(err)?;
        let l = Arc::new(Listener {
            addr: j.addr.clone(),
            inner: Mutex::new(Inner {
                socket: Some(socket),
                members: vec![member],
                unnamed: VecDeque::new(),
                handed: Vec::new(),
            }),
        });
        let any: Arc<dyn Any + Send + Sync> = l.clone();
        r.insert(j.addr.clone(), Arc::downgrade(&any));
        Ok(l)
    }

    /// The socket (or one of the peers on it not yet named) that port
    /// `cx.id` watches is ready: `sub` is [`SUB_LISTENER`] or
    /// [`SUB_UNNAMED`].
    pub fn on_ready(&self, cx: &PortCtx<'_>, sub: u32) {
        let mut inner = lock(&self.inner);
        if inner.members.first().map(|m| m.port) != Some(cx.id) {
            return; // a late event from before a member left
        }
        if sub == SUB_LISTENER {
            self.accept_all(cx, &mut inner);
        } else {
            self.hear_all(cx, &mut inner);
        }
    }

    fn accept_all(&self, cx: &PortCtx<'_>, inner: &mut Inner<P>) {
        loop {
            let Some(socket) = &inner.socket else { return };
            let fd = match accept(socket) {
                Ok(Some(fd)) => fd,
                Ok(None) => return,
                Err(e) => {
                    warn!(socket = %self.addr, "accept failed: {e}");
                    return;
                }
            };
            let offers: Vec<P::Offer> = inner.members.iter().map(|m| m.offer.clone()).collect();
            if let Err(e) = P::greet(fd.as_fd(), &offers) {
                debug!(socket = %self.addr, "a new peer: {e}");
                continue;
            }
            if inner.unnamed.len() >= MAX_UNNAMED {
                if let Some(old) = inner.unnamed.pop_front() {
                    cx.unwatch(&old.fd);
                    warn!(
                        socket = %self.addr,
                        "{MAX_UNNAMED} peers connected without naming their interface: closing the oldest"
                    );
                    P::refuse(old.fd, "too many connections waiting");
                }
            }
            if let Err(e) = cx.watch(&fd, SUB_UNNAMED) {
                warn!(socket = %self.addr, "cannot watch a new peer: {e}");
                continue;
            }
            inner.unnamed.push_back(Unnamed {
                fd,
                since: Instant::now(),
            });
            // A kind whose peers name nothing (vhost-user) hands it over
            // at once; memif's peer is not readable until it sends INIT.
            self.hear_all(cx, inner);
        }
    }

    fn hear_all(&self, cx: &PortCtx<'_>, inner: &mut Inner<P>) {
        let mut i = 0;
        while i < inner.unnamed.len() {
            let heard = match P::introduce(inner.unnamed[i].fd.as_fd()) {
                Ok(None) => {
                    i += 1;
                    continue;
                }
                Ok(Some(named)) => Ok(named),
                Err(why) => Err(why),
            };
            let Some(peer) = inner.unnamed.remove(i) else {
                return;
            };
            cx.unwatch(&peer.fd);
            let (interface, intro) = match heard {
                Ok(named) => named,
                Err(why) => {
                    warn!(socket = %self.addr, "a new peer, before it named its interface: {}", why.reason);
                    if why.say {
                        P::refuse(peer.fd, &why.reason);
                    }
                    continue;
                }
            };
            match inner.members.iter().find(|m| m.interface == interface) {
                Some(m) => {
                    inner.handed.push((m.port, peer.fd, intro));
                    cx.reactor.post(Token::port(m.port, SUB_HANDED));
                }
                None => {
                    info!(socket = %self.addr, interface, "a peer asked for an interface the socket does not serve");
                    P::refuse(peer.fd, "ID mismatch");
                }
            }
        }
    }

    /// The connections handed to port `port`, oldest first.
    pub fn take(&self, port: PortId) -> Vec<(OwnedFd, P::Intro)> {
        let mut inner = lock(&self.inner);
        let (mine, rest) = std::mem::take(&mut inner.handed)
            .into_iter()
            .partition(|(p, _, _)| *p == port);
        inner.handed = rest;
        mine.into_iter().map(|(_, fd, intro)| (fd, intro)).collect()
    }

    /// When the oldest unnamed peer's time is up, if `port` watches them.
    pub fn deadline(&self, port: PortId) -> Option<Instant> {
        let inner = lock(&self.inner);
        if inner.members.first().map(|m| m.port) != Some(port) {
            return None;
        }
        inner.unnamed.front().map(|u| u.since + NAMING_TIMEOUT)
    }

    /// Closes the peers that named no interface in time.
    pub fn expire(&self, cx: &PortCtx<'_>, now: Instant) {
        let mut inner = lock(&self.inner);
        while let Some(u) = inner.unnamed.front() {
            if now < u.since + NAMING_TIMEOUT {
                break;
            }
            let Some(u) = inner.unnamed.pop_front() else {
                break;
            };
            cx.unwatch(&u.fd);
            info!(socket = %self.addr, "a peer named no interface in time");
            P::refuse(u.fd, "handshake timed out");
        }
    }

    /// Adds the listening socket to a takeover's fds; its index there.
    pub fn save(&self, fds: &mut FdOut) -> Option<usize> {
        lock(&self.inner)
            .socket
            .as_ref()
            .map(|s| fds.add(s.as_fd()))
    }

    /// Whether more than one port serves the socket.
    pub fn shared(&self) -> bool {
        lock(&self.inner).members.len() > 1
    }

    /// Port `cx.id` leaves. Connections handed to it and not taken are
    /// closed; if it watched, the next member takes the socket and the
    /// unnamed peers up. The last member closes the socket and removes
    /// its file.
    pub fn leave(&self, cx: &PortCtx<'_>) {
        let mut inner = lock(&self.inner);
        let Some(at) = inner.members.iter().position(|m| m.port == cx.id) else {
            return;
        };
        inner.members.remove(at);
        let (mine, rest) = std::mem::take(&mut inner.handed)
            .into_iter()
            .partition::<Vec<_>, _>(|(p, _, _)| *p == cx.id);
        inner.handed = rest;
        for (_, fd, _) in mine {
            P::refuse(fd, "interface deleted");
        }
        if at != 0 {
            return;
        }
        let fds = inner
            .socket
            .iter()
            .map(|s| (s.as_fd(), SUB_LISTENER))
            .chain(inner.unnamed.iter().map(|u| (u.fd.as_fd(), SUB_UNNAMED)));
        match inner.members.first().map(|m| m.port) {
            Some(next) => {
                for (fd, sub) in fds {
                    cx.unwatch(fd);
                    if let Err(e) = cx.reactor.add(fd, Token::port(next, sub)) {
                        warn!(socket = %self.addr, "the next port cannot watch the socket: {e}");
                    }
                }
            }
            None => {
                for (fd, _) in fds {
                    cx.unwatch(fd);
                }
                inner.unnamed.clear();
                inner.socket = None;
                drop(inner);
                if let Some(p) = self.addr.path() {
                    let _ = std::fs::remove_file(p);
                }
                // The entry is this listener's: a port of it is still here.
                lock(registry()).remove(&self.addr);
            }
        }
    }
}

/// Checks that `l`, handed over by another switch, is a listening socket of
/// `P`'s type bound at `addr`.
fn adopt<P: Protocol>(addr: &SocketAddr, l: OwnedFd) -> io::Result<OwnedFd> {
    use nix::sys::socket::{getsockname, getsockopt, sockopt};
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let ty = getsockopt(&l, sockopt::SockType).map_err(io::Error::from)?;
    let listening = getsockopt(&l, sockopt::AcceptConn).map_err(io::Error::from)?;
    if ty != P::SOCK_TYPE || !listening {
        return Err(invalid(format!(
            "the listener handed over is a {ty:?} socket{}, not a listening {:?} one",
            if listening { "" } else { " not listening" },
            P::SOCK_TYPE
        )));
    }
    let bound: UnixAddr = getsockname(l.as_raw_fd()).map_err(io::Error::from)?;
    if bound != unix_addr(addr)? {
        return Err(invalid(format!(
            "the listener handed over is bound to {bound}, not here"
        )));
    }
    Ok(l)
}
