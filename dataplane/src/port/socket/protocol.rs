//! What a socket kind adds to the socket machinery: a [`Greeting`] (what a
//! listening socket asks of its kind: greet a new peer, hear which
//! interface it names) and a [`Protocol`] on one connection (what a
//! [`SocketPort`](super::SocketPort) asks). A kind implements both, in its
//! own module; the machinery names no kind.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Instant;

use nix::sys::socket::SockType;

use switchyard_api::{PortStatus, Side};

use crate::port::takeover::{FdIn, FdOut, TakeoverError};
use crate::port::PortCtx;

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

/// The sub-tokens of the socket machinery's fds in the control thread's
/// reactor: a listening socket's under its own token
/// ([`crate::reactor::Token::Socket`]), a port's under the port's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Sub {
    /// A listening socket.
    Listener = 0,
    /// A port's connection.
    Conn = 1,
    /// The peers of a listening socket that have not named their
    /// interface yet.
    Unnamed = 2,
    /// A connection the listener handed to a port (posted, not an fd).
    Handed = 3,
}

impl Sub {
    /// The sub-token a reactor event carries.
    pub fn from_u32(sub: u32) -> Option<Sub> {
        [Sub::Listener, Sub::Conn, Sub::Unnamed, Sub::Handed]
            .into_iter()
            .find(|s| *s as u32 == sub)
    }
}

/// What a socket the switch listens on asks of its kind: how the kind's
/// peers are greeted and name the interface they want (memif's HELLO and
/// INIT). See [`super::listener`].
pub trait Greeting: Send + Sync + 'static {
    /// What a peer says first, naming the interface it wants (memif: its
    /// INIT); `()` for a kind whose peers name none.
    type Intro: Send + 'static;
    /// What a port asks of the greeting each new peer of its socket gets
    /// (memif: its queue pairs, the most that HELLO may offer).
    type Offer: Clone + Send + 'static;
    /// The kind's name, for logs.
    const KIND: &'static str;
    /// The socket's type.
    const SOCK_TYPE: SockType;

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
}

/// A socket kind's protocol on one connection: all that a kind adds to
/// [`SocketPort`](super::SocketPort), with its [`Greeting`].
pub trait Protocol: Greeting + Send + 'static {
    /// One connection's state.
    type Conn: Send;
    /// A connection as saved for a takeover (the kind's `persist.rs`).
    type Saved: serde::Serialize + serde::de::DeserializeOwned;

    /// What this port asks of the greeting.
    fn offer(&self) -> Self::Offer;
    /// Takes a new connection: accepted (`side` [`Side::Listen`], then
    /// [`Protocol::on_intro`]) or connected. `Err` says why it cannot be
    /// used (it is then closed).
    fn open(&mut self, cx: &PortCtx<'_>, fd: OwnedFd, side: Side) -> Result<Self::Conn, String>;
    /// What the peer of an accepted connection said to name its interface
    /// ([`Greeting::introduce`]), which the connection now takes up.
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

    /// Whether the connection can be saved for a takeover as it is: `false`
    /// while a handshake is half done, which [`Port::pause`](crate::port::Port::pause)
    /// then drops (the peer starts again, as after any failed handshake).
    fn settled(conn: &Self::Conn) -> bool {
        let _ = conn;
        true
    }
    /// Takeover, first step (see [`crate::port::takeover`]): stops what
    /// the connection's saved state must not change under. Default:
    /// nothing.
    fn pause(&mut self, cx: &PortCtx<'_>, conn: &mut Self::Conn) {
        let _ = (cx, conn);
    }
    /// Writes a settled connection down, its socket and other fds into
    /// `fds`. `Err` refuses the takeover, saying why.
    fn save(&self, conn: &Self::Conn, fds: &mut FdOut) -> Result<Self::Saved, String>;
    /// Takes up a connection saved by [`Protocol::save`] in another
    /// process: the link comes up where it was, its queues where the rings
    /// are. `status` is the port's status as saved.
    fn restore(
        &mut self,
        cx: &PortCtx<'_>,
        saved: Self::Saved,
        fds: &mut FdIn,
        status: &mut PortStatus,
    ) -> Result<Self::Conn, TakeoverError>;
    /// The takeover failed: undoes [`Protocol::pause`], the queues going on
    /// from where the rings are. `Err` drops the connection.
    fn resume(&mut self, cx: &PortCtx<'_>, conn: &mut Self::Conn) -> Result<(), Closed>;
}
