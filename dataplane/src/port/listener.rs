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
/// How many connections one readiness of the socket accepts.
pub const ACCEPT_BATCH: usize = 16;

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
impl<P: Protocol> Inner<P> {
    /// Takes the connections handed to `port` out of [`Inner::handed`].
    fn take(&mut self, port: PortId) -> Vec<(OwnedFd, P::Intro)> {
        let (mine, rest) = std::mem::take(&mut self.handed)
            .into_iter()
            .partition::<Vec<_>, _>(|(p, _, _)| *p == port);
        self.handed = rest;
        mine.into_iter().map(|(_, fd, intro)| (fd, intro)).collect()
    }
}

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

    /// Accepts what is pending, [`ACCEPT_BATCH`] at most: a socket still
    /// readable is reported again, after the other events, so a flood of
    /// connections neither holds the control thread nor piles up
    /// connections handed to ports that have not taken them yet.
    fn accept_all(&self, cx: &PortCtx<'_>, inner: &mut Inner<P>) {
        let offers: Vec<P::Offer> = inner.members.iter().map(|m| m.offer.clone()).collect();
        for _ in 0..ACCEPT_BATCH {
            let Some(socket) = &inner.socket else { return };
            let fd = match accept(socket) {
                Ok(Some(fd)) => fd,
                Ok(None) => return,
                Err(e) => {
                    warn!(socket = %self.addr, "accept failed: {e}");
                    return;
                }
            };
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
            let Some(heard) = P::introduce(inner.unnamed[i].fd.as_fd()).transpose() else {
                i += 1;
                continue;
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
        lock(&self.inner).take(port)
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
        for (fd, _) in inner.take(cx.id) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::Dataplane;
    use crate::port::handover::{FdIn, HandoverError, Saved};
    use crate::port::socket_port::Closed;
    use crate::reactor::Reactor;
    use nix::sys::socket::{recv, send, MsgFlags, SockType};
    use std::os::fd::BorrowedFd;
    use switchyard_api::{PortStatus, Side};

    /// A protocol whose peers name their interface in their first message,
    /// a little-endian u32; greeted with "hi", refused with the reason.
    struct Ids;

    impl Protocol for Ids {
        type Conn = OwnedFd;
        type Intro = ();
        type Offer = ();
        const KIND: &'static str = "ids";
        const SOCK_TYPE: SockType = SockType::SeqPacket;

        fn offer(&self) {}
        fn greet(fd: BorrowedFd<'_>, _: &[()]) -> Result<(), String> {
            send(fd.as_raw_fd(), b"hi", MsgFlags::MSG_NOSIGNAL)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        fn introduce(fd: BorrowedFd<'_>) -> Result<Option<(u32, ())>, Closed> {
            let mut b = [0u8; 4];
            match recv(fd.as_raw_fd(), &mut b, MsgFlags::MSG_DONTWAIT) {
                Ok(4) => Ok(Some((u32::from_le_bytes(b), ()))),
                Err(nix::errno::Errno::EAGAIN) => Ok(None),
                _ => Err(Closed::fault("not an id")),
            }
        }
        fn refuse(fd: OwnedFd, reason: &str) {
            let _ = send(fd.as_raw_fd(), reason.as_bytes(), MsgFlags::MSG_NOSIGNAL);
        }
        fn open(&mut self, _: &PortCtx<'_>, fd: OwnedFd, _: Side) -> Result<OwnedFd, String> {
            Ok(fd)
        }
        fn on_intro(
            &mut self,
            _: &PortCtx<'_>,
            _: &mut OwnedFd,
            _: (),
            _: &mut PortStatus,
        ) -> Result<(), Closed> {
            Ok(())
        }
        fn fd(conn: &OwnedFd) -> BorrowedFd<'_> {
            conn.as_fd()
        }
        fn on_ready(
            &mut self,
            _: &PortCtx<'_>,
            _: &mut OwnedFd,
            _: &mut PortStatus,
        ) -> Result<(), Closed> {
            Ok(())
        }
        fn deadline(&self, _: &OwnedFd) -> Option<Instant> {
            None
        }
        fn on_timer(&mut self, _: &mut OwnedFd, _: Instant) -> Result<(), Closed> {
            Ok(())
        }
        fn close(&mut self, _: &PortCtx<'_>, _: OwnedFd, _: &str, _: bool) -> bool {
            false
        }
        fn save(&self, _: &OwnedFd, _: &mut FdOut) -> Result<Option<Saved>, String> {
            Ok(None)
        }
        fn restore(
            &mut self,
            _: &PortCtx<'_>,
            _: Saved,
            _: &mut FdIn,
            _: &mut PortStatus,
        ) -> Result<OwnedFd, HandoverError> {
            Err(HandoverError::Invalid("not saved".into()))
        }
        fn requeue(&mut self, _: &PortCtx<'_>, _: &mut OwnedFd) -> Result<(), Closed> {
            Ok(())
        }
    }

    /// A peer that connects, reads the greeting and names `id`.
    fn peer(addr: &SocketAddr, id: u32) -> OwnedFd {
        let c = crate::port::endpoint::connect(SockType::SeqPacket, addr).unwrap();
        send(c.as_raw_fd(), &id.to_le_bytes(), MsgFlags::empty()).unwrap();
        c
    }

    /// What the switch said to `c`, in order (waits up to a second).
    fn heard(c: &OwnedFd) -> Vec<String> {
        let mut out = Vec::new();
        let end = Instant::now() + Duration::from_secs(1);
        while Instant::now() < end {
            let mut b = [0u8; 64];
            match recv(c.as_raw_fd(), &mut b, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => break,
                Ok(n) => out.push(String::from_utf8_lossy(&b[..n]).into_owned()),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
            if out.len() == 2 {
                break;
            }
        }
        out
    }

    #[test]
    fn a_socket_hands_each_peer_to_the_interface_it_names_and_outlives_its_first_port() {
        let dir = tempfile::tempdir().unwrap();
        let addr = SocketAddr::Path(dir.path().join("s.sock"));
        let (reactor, dp) = (Reactor::new().unwrap(), Dataplane::new(1).unwrap());
        let cx = |id| PortCtx {
            id,
            reactor: &reactor,
            dp: &dp,
        };
        let joining = |interface| Joining::<Ids> {
            addr: &addr,
            group: None,
            interface,
            offer: (),
        };
        let l = Listener::<Ids>::join(&cx(1), joining(1), None).unwrap();
        let l2 = Listener::<Ids>::join(&cx(2), joining(2), None).unwrap();
        assert!(Arc::ptr_eq(&l, &l2) && lock(&l.inner).members.len() == 2);
        assert!(Listener::<Ids>::join(&cx(3), joining(2), None).is_err());
        // The tokens ready within a second.
        let wait = || {
            let mut ready = Vec::new();
            reactor
                .wait(Some(Duration::from_secs(1)), &mut ready)
                .unwrap();
            ready
        };

        // Port 1 watches; a peer naming interface 2 is handed to port 2.
        let c = peer(&addr, 2);
        assert_eq!(wait(), [Token::port(1, SUB_LISTENER)]);
        l.on_ready(&cx(1), SUB_LISTENER);
        assert_eq!(wait(), [Token::port(2, SUB_HANDED)]);
        assert_eq!(l.take(1).len(), 0);
        assert_eq!(l.take(2).len(), 1);
        assert_eq!(heard(&c), ["hi"]);
        // One naming an interface nobody serves is told so.
        let c = peer(&addr, 7);
        assert_eq!(wait(), [Token::port(1, SUB_LISTENER)]);
        l.on_ready(&cx(1), SUB_LISTENER);
        assert_eq!(heard(&c), ["hi", "ID mismatch"]);

        // Port 1 goes: port 2 watches the socket now.
        l.leave(&cx(1));
        drop(l);
        let c = peer(&addr, 2);
        assert_eq!(wait(), [Token::port(2, SUB_LISTENER)]);
        l2.on_ready(&cx(2), SUB_LISTENER);
        assert_eq!(wait(), [Token::port(2, SUB_HANDED)]);
        assert_eq!(l2.take(2).len(), 1);
        drop(c);
        // The last port takes the socket file with it; the address is free
        // for a new listener.
        l2.leave(&cx(2));
        drop(l2);
        assert!(!dir.path().join("s.sock").exists());
        let l = Listener::<Ids>::join(&cx(4), joining(0), None).unwrap();
        assert_eq!(lock(&l.inner).members.len(), 1);
        l.leave(&cx(4));
    }
}
