//! The sockets the switch listens on, and the ports each serves.
//!
//! A memif socket carries several interfaces, told apart by the id a peer
//! names in its first message (`INIT`), as VPP's and DPDK's memif sockets
//! do. So a listening socket is not one port's: it is an object of its
//! own, a [`Listener`] in the daemon's one table of them ([`Listeners`], as
//! VPP's `memif_socket_file_t`), watched under its own token
//! ([`Token::Socket`]), and every listening
//! [`SocketPort`](super::SocketPort) at its address is a member. The
//! listener accepts each peer, greets it ([`Greeting::greet`]), hears it
//! until it names its interface ([`Greeting::introduce`]) and hands the
//! connection to that interface's port. A socket that serves one port
//! (every vhost-user socket) is the case of one member, on the same path.
//!
//! - A connection for a port is kept in the listener and
//!   [posted](crate::reactor::Reactor::post) to that port with
//!   [`Sub::Handed`]; the port takes it with [`Listener::take`].
//! - A peer that names no member's interface is told so and closed (as VPP
//!   and DPDK do); one that names nothing in [`NAMING_TIMEOUT`], or breaks
//!   the protocol first, is closed. Either belongs to no port: it is
//!   logged, and counts nowhere.
//! - At most [`MAX_UNNAMED`] peers wait unnamed; a newer one closes the
//!   oldest, so a peer that floods the socket with connections holds
//!   nothing for long, and a peer that names its interface at once (as
//!   every real one does) gets through.
//! - The socket file goes with the last member.

use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::socket::UnixAddr;
use tracing::{debug, info, warn};

use switchyard_api::SocketAddr;

use super::endpoint::{accept, listen, unix_addr};
use super::protocol::{Greeting, Sub};
use crate::port::takeover::{FdOut, FdRef};
use crate::reactor::{Reactor, Token};
use crate::types::PortId;

/// How many peers may wait unnamed at once.
pub const MAX_UNNAMED: usize = 16;
/// How long a peer has to name its interface.
pub const NAMING_TIMEOUT: Duration = Duration::from_secs(5);
/// How many connections one readiness of the socket accepts.
pub const ACCEPT_BATCH: usize = 16;
/// Most listening sockets open at once (their numbers fit a token).
pub const MAX_SOCKETS: u32 = 1 << 30;

/// A listening socket's number in [`Listeners`], in its token.
pub type SocketId = u32;

/// Why a port cannot join the socket at its address.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Another process listens there.
    #[error("socket {0} is in use by another process: something listens on it")]
    InUse(String),
    /// The socket cannot be made (or the one handed over is not it).
    #[error("socket {path}: {cause}")]
    Socket {
        /// Where.
        path: String,
        /// Why.
        cause: io::Error,
    },
    /// The switch listens there for another kind of port.
    #[error("socket {0}: the switch serves another kind of port on it")]
    OtherKind(String),
    /// Another member serves the interface.
    #[error("socket {addr}: interface {interface} is served by another port (slot {port})")]
    InterfaceTaken {
        /// Where.
        addr: String,
        /// The interface.
        interface: u32,
        /// The port serving it.
        port: PortId,
    },
    /// No number is free.
    #[error("{MAX_SOCKETS} listening sockets are open")]
    Full,
}

/// The listening sockets the switch serves: the daemon owns the one table,
/// and dispatches each socket's events to it ([`Listeners::on_ready`],
/// [`Listeners::expire`]).
#[derive(Default)]
pub struct Listeners {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    by_addr: HashMap<SocketAddr, SocketId>,
    open: BTreeMap<SocketId, Arc<dyn Listening>>,
    /// Where the search for a free id starts.
    next: SocketId,
}

/// A listener, whatever its kind: what the table calls.
trait Listening: Send + Sync {
    fn on_ready(&self, reactor: &Reactor, sub: Sub);
    fn deadline(&self) -> Option<Instant>;
    fn expire(&self, reactor: &Reactor, now: Instant);
    /// For [`Listeners::join`] to take it as its own kind's.
    fn any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A member of the listener at `addr`, as a port joins it.
pub struct Joining<'a, G: Greeting> {
    /// Where the socket is.
    pub addr: &'a SocketAddr,
    /// The group a new socket file is given.
    pub group: Option<u32>,
    /// The interface the port serves.
    pub interface: u32,
    /// What it asks of the greeting.
    pub offer: G::Offer,
}

impl Listeners {
    /// Joins port `port` to the listener at `j.addr`: the one open there
    /// (`handed`, a listener another switch handed over, is then a
    /// duplicate of its socket, and closed), or a new one, listening on
    /// `handed` or on a socket bound now, and watched under its own token.
    pub fn join<G: Greeting>(
        &self,
        reactor: &Reactor,
        port: PortId,
        j: Joining<'_, G>,
        handed: Option<OwnedFd>,
    ) -> Result<Arc<Listener<G>>, ListenError> {
        let mut t = lock(&self.table);
        let member = Member {
            port,
            interface: j.interface,
            offer: j.offer,
        };
        if let Some(open) = t.by_addr.get(j.addr).and_then(|id| t.open.get(id)) {
            let l = open
                .clone()
                .any()
                .downcast::<Listener<G>>()
                .map_err(|_| ListenError::OtherKind(j.addr.to_string()))?;
            {
                let mut inner = lock(&l.inner);
                if let Some(m) = inner.members.iter().find(|m| m.interface == j.interface) {
                    return Err(ListenError::InterfaceTaken {
                        addr: j.addr.to_string(),
                        interface: j.interface,
                        port: m.port,
                    });
                }
                inner.members.push(member);
            }
            return Ok(l);
        }
        // The first free id at or after the last one given (a scan from 0
        // would make a node's thousand ports a million lookups).
        let id = (t.next..MAX_SOCKETS)
            .chain(0..t.next)
            .find(|i| !t.open.contains_key(i))
            .ok_or(ListenError::Full)?;
        let err = |cause: io::Error| {
            if cause.kind() == io::ErrorKind::AddrInUse {
                ListenError::InUse(j.addr.to_string())
            } else {
                ListenError::Socket {
                    path: j.addr.to_string(),
                    cause,
                }
            }
        };
        let socket = match handed {
            Some(fd) => adopt::<G>(j.addr, fd).map_err(err)?,
            None => listen(G::SOCK_TYPE, j.addr, None, j.group).map_err(err)?,
        };
        reactor
            .add(&socket, Token::Socket(id, Sub::Listener as u32))
            .map_err(err)?;
        let l = Arc::new(Listener {
            id,
            addr: j.addr.clone(),
            inner: Mutex::new(Inner {
                socket: Some(socket),
                members: vec![member],
                unnamed: VecDeque::new(),
                handed: Vec::new(),
            }),
        });
        t.by_addr.insert(j.addr.clone(), id);
        t.open.insert(id, l.clone());
        t.next = (id + 1) % MAX_SOCKETS;
        Ok(l)
    }

    /// Port `port` leaves `l`. Connections handed to it and not taken are
    /// closed. The last member closes the socket, removes its file and
    /// the listener from the table.
    pub fn leave<G: Greeting>(&self, reactor: &Reactor, l: &Listener<G>, port: PortId) {
        self.leave_and(reactor, l, port, SocketFile::Remove);
    }

    /// As [`Listeners::leave`], but the socket's file stays: a port whose
    /// takeover failed leaves a socket the switch that handed it over
    /// still serves, at that path.
    pub fn leave_keeping_file<G: Greeting>(
        &self,
        reactor: &Reactor,
        l: &Listener<G>,
        port: PortId,
    ) {
        self.leave_and(reactor, l, port, SocketFile::Keep);
    }

    fn leave_and<G: Greeting>(
        &self,
        reactor: &Reactor,
        l: &Listener<G>,
        port: PortId,
        file: SocketFile,
    ) {
        let mut t = lock(&self.table);
        if !l.leave(reactor, port, file) {
            return;
        }
        if t.by_addr.get(&l.addr) == Some(&l.id) {
            t.by_addr.remove(&l.addr);
        }
        t.open.remove(&l.id);
    }

    /// The listener `id`'s socket, or one of its unnamed peers, is ready
    /// (a late event for a listener gone is ignored).
    pub fn on_ready(&self, reactor: &Reactor, id: SocketId, sub: u32) {
        let l = lock(&self.table).open.get(&id).cloned();
        if let (Some(l), Some(sub)) = (l, Sub::from_u32(sub)) {
            l.on_ready(reactor, sub);
        }
    }

    /// When the first unnamed peer of any listener runs out of time.
    pub fn deadline(&self) -> Option<Instant> {
        // Table, then listener: the order every path takes both locks in.
        lock(&self.table)
            .open
            .values()
            .filter_map(|l| l.deadline())
            .min()
    }

    /// Closes the peers that named no interface in time.
    pub fn expire(&self, reactor: &Reactor, now: Instant) {
        let open: Vec<_> = lock(&self.table).open.values().cloned().collect();
        for l in open {
            l.expire(reactor, now);
        }
    }

    /// How many sockets are open.
    pub fn len(&self) -> usize {
        lock(&self.table).open.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A listening socket and the ports on it.
pub struct Listener<G: Greeting> {
    id: SocketId,
    addr: SocketAddr,
    inner: Mutex<Inner<G>>,
}

struct Inner<G: Greeting> {
    /// The listening socket; `None` once the last member left.
    socket: Option<OwnedFd>,
    /// In joining order.
    members: Vec<Member<G>>,
    /// Peers that have not named their interface yet, oldest first.
    unnamed: VecDeque<Unnamed>,
    /// Connections handed to a member, not yet taken.
    handed: Vec<(PortId, OwnedFd, G::Intro)>,
}

impl<G: Greeting> Inner<G> {
    /// Takes the connections handed to `port` out of [`Inner::handed`].
    fn take(&mut self, port: PortId) -> Vec<(OwnedFd, G::Intro)> {
        let (mine, rest) = std::mem::take(&mut self.handed)
            .into_iter()
            .partition::<Vec<_>, _>(|(p, _, _)| *p == port);
        self.handed = rest;
        mine.into_iter().map(|(_, fd, intro)| (fd, intro)).collect()
    }
}

/// A port on the socket.
struct Member<G: Greeting> {
    port: PortId,
    /// The interface it serves (memif's id; 0 on a socket of one port).
    interface: u32,
    /// What it asks of the greeting (memif: its queue pairs).
    offer: G::Offer,
}

struct Unnamed {
    fd: OwnedFd,
    since: Instant,
}

impl<G: Greeting> Listening for Listener<G> {
    fn on_ready(&self, reactor: &Reactor, sub: Sub) {
        let mut inner = lock(&self.inner);
        match sub {
            Sub::Listener => self.accept_all(reactor, &mut inner),
            Sub::Unnamed => self.hear_all(reactor, &mut inner),
            Sub::Conn | Sub::Handed => {}
        }
    }

    fn deadline(&self) -> Option<Instant> {
        lock(&self.inner)
            .unnamed
            .front()
            .map(|u| u.since + NAMING_TIMEOUT)
    }

    fn expire(&self, reactor: &Reactor, now: Instant) {
        let mut inner = lock(&self.inner);
        while let Some(u) = inner.unnamed.front() {
            if now < u.since + NAMING_TIMEOUT {
                break;
            }
            let Some(u) = inner.unnamed.pop_front() else {
                break;
            };
            reactor.remove(&u.fd);
            info!(socket = %self.addr, "a peer named no interface in time");
            G::refuse(u.fd, "handshake timed out");
        }
    }

    fn any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

impl<G: Greeting> Listener<G> {
    /// Its number in the table.
    pub fn id(&self) -> SocketId {
        self.id
    }

    /// Accepts what is pending, [`ACCEPT_BATCH`] at most: a socket still
    /// readable is reported again, after the other events, so a flood of
    /// connections neither holds the control thread nor piles up
    /// connections handed to ports that have not taken them yet.
    fn accept_all(&self, reactor: &Reactor, inner: &mut Inner<G>) {
        let offers: Vec<G::Offer> = inner.members.iter().map(|m| m.offer.clone()).collect();
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
            if let Err(e) = G::greet(fd.as_fd(), &offers) {
                debug!(socket = %self.addr, "a new peer: {e}");
                continue;
            }
            if inner.unnamed.len() >= MAX_UNNAMED {
                if let Some(old) = inner.unnamed.pop_front() {
                    reactor.remove(&old.fd);
                    warn!(
                        socket = %self.addr,
                        "{MAX_UNNAMED} peers connected without naming their interface: closing the oldest"
                    );
                    G::refuse(old.fd, "too many connections waiting");
                }
            }
            if let Err(e) = reactor.add(&fd, Token::Socket(self.id, Sub::Unnamed as u32)) {
                warn!(socket = %self.addr, "cannot watch a new peer: {e}");
                continue;
            }
            inner.unnamed.push_back(Unnamed {
                fd,
                since: Instant::now(),
            });
            // A kind whose peers name nothing (vhost-user) hands it over
            // at once; memif's peer is not readable until it sends INIT.
            self.hear_all(reactor, inner);
        }
    }

    fn hear_all(&self, reactor: &Reactor, inner: &mut Inner<G>) {
        let mut i = 0;
        while i < inner.unnamed.len() {
            let Some(heard) = G::introduce(inner.unnamed[i].fd.as_fd()).transpose() else {
                i += 1;
                continue;
            };
            let Some(peer) = inner.unnamed.remove(i) else {
                return;
            };
            reactor.remove(&peer.fd);
            let (interface, intro) = match heard {
                Ok(named) => named,
                Err(why) => {
                    warn!(socket = %self.addr, "a new peer, before it named its interface: {}", why.reason);
                    if why.say {
                        G::refuse(peer.fd, &why.reason);
                    }
                    continue;
                }
            };
            match inner.members.iter().find(|m| m.interface == interface) {
                Some(m) => {
                    inner.handed.push((m.port, peer.fd, intro));
                    reactor.post(Token::port(m.port, Sub::Handed as u32));
                }
                None => {
                    info!(socket = %self.addr, interface, "a peer asked for an interface the socket does not serve");
                    G::refuse(peer.fd, "ID mismatch");
                }
            }
        }
    }

    /// The connections handed to port `port`, oldest first.
    pub fn take(&self, port: PortId) -> Vec<(OwnedFd, G::Intro)> {
        lock(&self.inner).take(port)
    }

    /// Adds the listening socket to a takeover's fds.
    pub fn save(&self, fds: &mut FdOut) -> Option<FdRef> {
        lock(&self.inner)
            .socket
            .as_ref()
            .map(|s| fds.add(s.as_fd()))
    }

    /// Port `port` leaves; connections handed to it and not taken are
    /// closed. The last member closes the socket and removes its file
    /// (unless told to keep it): returns whether it was the last.
    fn leave(&self, reactor: &Reactor, port: PortId, file: SocketFile) -> bool {
        let mut inner = lock(&self.inner);
        let Some(at) = inner.members.iter().position(|m| m.port == port) else {
            return false;
        };
        inner.members.remove(at);
        for (fd, _) in inner.take(port) {
            G::refuse(fd, "interface deleted");
        }
        if !inner.members.is_empty() {
            return false;
        }
        for u in inner.unnamed.drain(..) {
            reactor.remove(&u.fd);
        }
        if let Some(s) = inner.socket.take() {
            reactor.remove(&s);
        }
        drop(inner);
        if let (SocketFile::Remove, Some(p)) = (file, self.addr.path()) {
            let _ = std::fs::remove_file(p);
        }
        true
    }
}

/// What the last member leaving a listener does with its socket's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SocketFile {
    Remove,
    Keep,
}

/// Checks that `l`, handed over by another switch, is a listening socket of
/// `G`'s type bound at `addr`.
fn adopt<G: Greeting>(addr: &SocketAddr, l: OwnedFd) -> io::Result<OwnedFd> {
    use nix::sys::socket::{getsockname, getsockopt, sockopt};
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let ty = getsockopt(&l, sockopt::SockType).map_err(io::Error::from)?;
    let listening = getsockopt(&l, sockopt::AcceptConn).map_err(io::Error::from)?;
    if ty != G::SOCK_TYPE || !listening {
        return Err(invalid(format!(
            "the listener handed over is a {ty:?} socket{}, not a listening {:?} one",
            if listening { "" } else { " not listening" },
            G::SOCK_TYPE
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
    use crate::port::socket::protocol::Closed;
    use nix::sys::socket::{recv, send, MsgFlags, SockType};
    use std::os::fd::BorrowedFd;

    /// A kind whose peers name their interface in their first message, a
    /// little-endian u32; greeted with "hi", refused with the reason.
    struct Ids;

    impl Greeting for Ids {
        type Intro = ();
        type Offer = ();
        const KIND: &'static str = "ids";
        const SOCK_TYPE: SockType = SockType::SeqPacket;

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
    }

    /// Another kind, on the same socket type.
    struct Other;

    impl Greeting for Other {
        type Intro = ();
        type Offer = ();
        const KIND: &'static str = "other";
        const SOCK_TYPE: SockType = SockType::SeqPacket;
        fn introduce(_: BorrowedFd<'_>) -> Result<Option<(u32, ())>, Closed> {
            Ok(Some((0, ())))
        }
    }

    /// A peer that connects, reads the greeting and names `id`.
    fn peer(addr: &SocketAddr, id: u32) -> OwnedFd {
        let c = crate::port::socket::endpoint::connect(SockType::SeqPacket, addr).unwrap();
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
    fn a_socket_is_its_own_and_hands_each_peer_to_the_interface_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let addr = SocketAddr::Path(dir.path().join("s.sock"));
        let (reactor, table) = (Reactor::new().unwrap(), Listeners::default());
        let joining = |interface| Joining::<Ids> {
            addr: &addr,
            group: None,
            interface,
            offer: (),
        };
        let l = table.join(&reactor, 1, joining(1), None).unwrap();
        let l2 = table.join(&reactor, 2, joining(2), None).unwrap();
        assert!(Arc::ptr_eq(&l, &l2) && lock(&l.inner).members.len() == 2);
        assert!(matches!(
            table.join(&reactor, 3, joining(2), None),
            Err(ListenError::InterfaceTaken { port: 2, .. })
        ));
        let other = Joining::<Other> {
            addr: &addr,
            group: None,
            interface: 5,
            offer: (),
        };
        assert!(matches!(
            table.join(&reactor, 3, other, None),
            Err(ListenError::OtherKind(_))
        ));
        let sock = |sub: Sub| Token::Socket(l.id(), sub as u32);
        // The tokens ready within a second, each handled as the daemon does.
        let wait = || {
            let mut ready = Vec::new();
            reactor
                .wait(Some(Duration::from_secs(1)), &mut ready)
                .unwrap();
            for t in &ready {
                if let Token::Socket(id, sub) = *t {
                    table.on_ready(&reactor, id, sub);
                }
            }
            ready
        };

        // The socket's own token; a peer naming interface 2 is handed to
        // port 2.
        let c = peer(&addr, 2);
        assert_eq!(wait(), [sock(Sub::Listener)]);
        assert_eq!(wait(), [Token::port(2, Sub::Handed as u32)]);
        assert_eq!(l.take(1).len(), 0);
        assert_eq!(l.take(2).len(), 1);
        assert_eq!(heard(&c), ["hi"]);
        // One naming an interface nobody serves is told so.
        let c = peer(&addr, 7);
        assert_eq!(wait(), [sock(Sub::Listener)]);
        assert_eq!(heard(&c), ["hi", "ID mismatch"]);
        // One that names nothing waits under the socket's token, and is
        // closed when its time is up.
        let quiet = crate::port::socket::endpoint::connect(SockType::SeqPacket, &addr).unwrap();
        assert_eq!(wait(), [sock(Sub::Listener)]);
        let due = table.deadline().unwrap();
        table.expire(&reactor, due);
        assert_eq!(heard(&quiet), ["hi", "handshake timed out"]);
        assert_eq!(table.deadline(), None);

        // Port 1 goes: nothing moves, the socket serves port 2.
        table.leave(&reactor, &l, 1);
        let c = peer(&addr, 2);
        assert_eq!(wait(), [sock(Sub::Listener)]);
        assert_eq!(wait(), [Token::port(2, Sub::Handed as u32)]);
        assert_eq!(l2.take(2).len(), 1);
        drop(c);
        // The last port takes the socket file with it; the address is free
        // for a new listener.
        table.leave(&reactor, &l2, 2);
        assert!(table.is_empty());
        assert!(!dir.path().join("s.sock").exists());
        let l = table.join(&reactor, 4, joining(0), None).unwrap();
        assert_eq!(lock(&l.inner).members.len(), 1);
        // A port whose takeover failed leaves the socket's file to the
        // switch that handed it over (it serves on).
        table.leave_keeping_file(&reactor, &l, 4);
        assert!(table.is_empty());
        assert!(dir.path().join("s.sock").exists());
    }
}
