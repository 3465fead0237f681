//! Ports: the switch's attachments to peers.
//!
//! Two seams separate port kinds from the switch core:
//! - [`Port`] is the control-plane side (sockets, handshakes, link state), driven
//!   by the control thread's reactor.
//! - [`RxQueue`] / [`TxQueue`] are the data-plane side, polled by workers in
//!   bursts. A received frame is a list of [`Segment`]s that point into the
//!   peer's shared memory; transmit copies straight from them into the
//!   destination's buffers, so a frame is copied exactly once.

pub mod frame;
pub mod memif;
pub mod prefetch;
pub mod sigbus;
pub mod vhost_user;

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

pub use frame::{FrameReader, RxBurst, RxFrame, Segment, TxFrame, BURST_SIZE, MAX_SEGS};

use switchyard_api::{KindSpec, PortStatus};

use crate::dataplane::{Dataplane, PortId};
use crate::reactor::Reactor;

/// Refuses a socket path that is a symbolic link: a pod may write in its
/// own socket directory, and a link there could send the switch to any
/// socket on the host. `config::confine_socket` calls it where a socket is
/// named, and client ports again before each connect (a peer could have
/// swapped the socket since).
pub fn refuse_symlink(path: &std::path::Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the socket is a symbolic link",
        )),
        _ => Ok(()),
    }
}

/// Connects a Unix socket of type `ty` to `addr` without blocking: a Unix
/// connect either completes at once or, when the listener's backlog is full
/// (a peer that listens and never accepts), fails with `EAGAIN` instead of
/// waiting for room, which would hold the control thread. The socket is
/// left non-blocking. memif (seqpacket) and vhost-user (stream) client
/// ports both connect through here.
pub fn connect_unix(
    ty: nix::sys::socket::SockType,
    addr: &nix::sys::socket::UnixAddr,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        ty,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    connect(fd.as_raw_fd(), addr)?;
    Ok(fd)
}

/// Whether a [`connect_unix`] attempt found someone listening: it
/// connected, or the listener's backlog is full (`EAGAIN`). Anything else
/// (`ECONNREFUSED` on a socket file nobody listens on) means a stale file.
pub fn listener_alive<T>(attempt: std::io::Result<T>) -> bool {
    match attempt {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    }
}

/// Opens a socket the switch created to the members of group `gid`: the
/// file becomes `<owner>:<gid>` with mode 0660, so that a non-root pod in
/// that group can `connect()` (which needs write permission on the file).
/// Without a group the file keeps the mode it was created with.
pub fn share_socket(path: &std::path::Path, gid: Option<u32>) -> std::io::Result<()> {
    match gid {
        Some(gid) => switchyard_api::fs::share_with_group(path, gid, 0o660),
        None => Ok(()),
    }
}

/// Builds the port a validated spec describes (not started yet); a
/// vhost-user port that names no queue count offers `queues` (one per
/// worker, as OVS-DPDK). The one place that lists every port kind.
pub fn build(name: &str, kind: &KindSpec, queues: u16) -> Box<dyn Port> {
    match kind {
        KindSpec::Memif(m) => Box::new(memif::MemifPort::new(
            name,
            memif::MemifConfig::from_spec(name, m),
        )),
        KindSpec::VhostUser(v) => Box::new(vhost_user::VhostUserPort::new(
            name,
            vhost_user::VhostUserConfig::from_spec(v, queues),
        )),
    }
}

/// A peer broke the shared-memory protocol; its port must be reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueFault {
    /// A descriptor points outside the peer's regions.
    #[error("descriptor {slot}: region {region} offset {offset} length {length} outside the shared memory")]
    BadDescriptor {
        /// Ring slot.
        slot: u16,
        /// Region index.
        region: u16,
        /// Offset.
        offset: u32,
        /// Length.
        length: u32,
    },
    /// A ring counter moved outside what the protocol allows.
    #[error("ring counter out of range: {what} (cursor {cursor}, peer {peer}, size {size})")]
    BadRingIndex {
        /// Which counter.
        what: &'static str,
        /// Our position.
        cursor: u16,
        /// The peer's value.
        peer: u16,
        /// Ring size.
        size: u32,
    },
    /// A descriptor chain never ends inside the published part of the ring.
    #[error("descriptor chain at slot {slot} runs past the published descriptors")]
    UnterminatedChain {
        /// First slot of the chain.
        slot: u16,
    },
    /// The peer shrank the file behind memory it shares: an access raised
    /// `SIGBUS`, which [`sigbus`] caught.
    #[error(
        "the peer truncated the memory it shares (SIGBUS caught; its pages now read as zeros)"
    )]
    PeerMemoryTruncated,
    /// Descriptor chain or guest-memory fault described by text (other port kinds).
    #[error("{0}")]
    Other(String),
}

/// Why a transmit did not take a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxError {
    /// No free descriptor or buffer: the peer is not draining.
    Full,
    /// The frame does not fit what the peer offered.
    TooLong,
    /// The peer broke the ring.
    Fault(QueueFault),
}

/// Receive side of one queue, owned by one worker at a time.
pub trait RxQueue: Send {
    /// Fills `burst` with up to its capacity of frames. The frames' memory
    /// stays valid until [`RxQueue::release`].
    fn rx_burst(&mut self, burst: &mut RxBurst) -> Result<usize, QueueFault>;
    /// Returns the buffers of the last burst to the peer.
    fn release(&mut self);
    /// The eventfd the peer signals when it enqueues while we sleep.
    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>>;
    /// Asks the peer to signal (`true`) or not (`false`) on enqueue.
    fn set_interrupt(&mut self, enabled: bool);
    /// True when frames are waiting (checked after enabling interrupts).
    fn has_pending(&self) -> bool;
}

/// Transmit side of one queue. May be shared by workers (see `TxSlot`).
pub trait TxQueue: Send {
    /// Copies one frame into the peer's buffers (published at [`TxQueue::flush`]).
    fn tx(&mut self, frame: &TxFrame<'_>) -> Result<(), TxError>;
    /// Publishes what was queued since the last flush and signals the peer if
    /// it asked for interrupts.
    fn flush(&mut self);
}

/// Queues a connected port hands to the data plane.
#[derive(Default)]
pub struct PortQueues {
    /// Receive queues.
    pub rx: Vec<Box<dyn RxQueue>>,
    /// Transmit queues.
    pub tx: Vec<Box<dyn TxQueue>>,
}

/// Error starting a port.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The socket path is unusable.
    #[error("socket {path}: {cause}")]
    Socket {
        /// Path.
        path: String,
        /// Cause (in the message, not repeated as a `source()`).
        cause: std::io::Error,
    },
    /// Another port or process owns the socket.
    #[error("socket {0} is in use by a running process")]
    SocketInUse(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// What a port may do to the rest of the switch while handling an event.
pub struct PortCtx<'a> {
    /// This port's slot.
    pub id: PortId,
    /// The control thread's reactor (register fds with sub-tokens).
    pub reactor: &'a Reactor,
    /// The data plane (attach and detach queues).
    pub dp: &'a Dataplane,
}

impl PortCtx<'_> {
    /// Watches `fd` for readability; events arrive as [`Port::on_ready`] with `sub`.
    pub fn watch(&self, fd: impl AsFd, sub: u32) -> std::io::Result<()> {
        self.reactor
            .add(fd, crate::reactor::Token::port(self.id, sub))
    }
    /// Stops watching `fd`.
    pub fn unwatch(&self, fd: impl AsFd) {
        self.reactor.remove(fd);
    }
    /// Hands connected queues to the workers and marks the link up.
    pub fn attach(&self, queues: PortQueues) {
        self.dp.attach_queues(self.id, queues);
    }
    /// Takes the queues back from the workers and marks the link down.
    pub fn detach(&self) {
        if !self.dp.detach_queues(self.id) {
            tracing::warn!(port = self.id, "a worker did not leave its burst in time");
        }
    }
}

/// The control-plane side of a port kind.
pub trait Port: Send {
    /// The kind's name, as specs spell it.
    fn kind(&self) -> &'static str;
    /// Opens sockets (listen or first connect attempt).
    fn start(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError>;
    /// An fd registered with sub-token `sub` is readable (or hung up).
    fn on_ready(&mut self, cx: &PortCtx<'_>, sub: u32);
    /// When the port next wants [`Port::on_timer`].
    fn deadline(&self) -> Option<Instant>;
    /// The deadline passed.
    fn on_timer(&mut self, cx: &PortCtx<'_>, now: Instant);
    /// A worker found the peer breaking the protocol: drop the connection.
    fn on_fault(&mut self, cx: &PortCtx<'_>, reason: &str);
    /// Connection state.
    fn status(&self) -> PortStatus;
    /// Disconnects the peer and removes sockets this port created.
    fn stop(&mut self, cx: &PortCtx<'_>);
}
