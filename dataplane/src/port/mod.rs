//! Ports: the switch's attachments to peers, one module per kind.
//!
//! A kind is two things behind two seams:
//! - a [`Port`], the control-plane side (sockets, handshakes, link state),
//!   driven by the control thread's reactor through a [`PortCtx`]; every
//!   kind hands its queues to the workers through one [`QueueLink`];
//! - [`crate::queue::RxQueue`] / [`crate::queue::TxQueue`]s, the data-plane side,
//!   polled by workers in bursts.
//!
//! The tree:
//! - [`socket`]: the socket machinery. Socket kinds (memif, vhost-user)
//!   are a [`socket::Protocol`] on a [`socket::SocketPort`], which listens
//!   through the socket's [`socket::listener::Listener`] (several memif
//!   interfaces share a socket) or connects.
//! - [`kernel`]: uplink kinds (af-packet, af-xdp) are an
//!   [`kernel::Uplink`] on a [`kernel::KernelIf`], which follows the
//!   kernel interface.
//! - [`takeover`]: a port handed to another switch process; each kind's
//!   takeover is its `persist.rs`, behind [`Persist`].
//! - [`sigbus`]: surviving a peer that truncates shared memory.
//! - [`registry`]: the one list of the kinds (`registry::port_kinds!`,
//!   invoked here) and [`build`].
//! - the kinds: [`memif`], [`vhost_user`], [`tap`], [`af_packet`],
//!   [`af_xdp`], [`vxlan`]; a kind's module knows nothing of the others.

pub mod kernel;
pub mod registry;
pub mod sigbus;
pub mod socket;
pub mod takeover;

// The kinds: the one list of them.
registry::port_kinds! {
    Memif => memif,
    VhostUser => vhost_user,
    Tap => tap,
    AfPacket => af_packet,
    AfXdp => af_xdp,
    Vxlan => vxlan,
}

use std::os::fd::AsFd;
use std::time::Instant;

use takeover::{FdIn, FdOut, Saved};

use crate::queue::PortQueues;

use switchyard_api::PortStatus;

use crate::dataplane::Dataplane;
use crate::reactor::Reactor;
use crate::types::PortId;

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
    #[error("socket {0} is in use by another process: something listens on it")]
    SocketInUse(String),
    /// Saved state from a process handing over cannot be taken up.
    #[error(transparent)]
    Takeover(#[from] takeover::TakeoverError),
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
    /// This port's link to the workers.
    pub fn link(&self) -> QueueLink {
        QueueLink {
            id: self.id,
            dp: self.dp.clone(),
        }
    }
    /// Hands connected queues to the workers and marks the link up.
    pub fn attach(&self, queues: PortQueues) {
        self.link().attach(queues);
    }
    /// Takes the queues back from the workers and marks the link down.
    pub fn detach(&self) {
        self.link().detach();
    }
    /// Makes this port one of its bridge's full mesh of tunnels (split
    /// horizon: [`Dataplane::set_split_horizon`]).
    pub fn set_split_horizon(&self) {
        self.dp.set_split_horizon(self.id, true);
    }
    /// Where this port's queues stand, for a takeover (the workers are
    /// paused): see [`crate::queue::RxQueue::position`].
    pub fn queue_positions(&self) -> crate::dataplane::QueuePositions {
        self.dp.queue_positions(self.id)
    }
}

/// A port's link to the workers: the one path by which every port kind
/// hands its queues to the data plane and takes them back. [`PortCtx`]
/// gives it out; a kind that must stop its queues from inside a protocol
/// callback (vhost-user's `GET_VRING_BASE`, answered by the `vhost` crate's
/// handler) keeps a clone.
#[derive(Clone)]
pub struct QueueLink {
    id: PortId,
    dp: Dataplane,
}

impl QueueLink {
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

/// How a port starts ([`Port::start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Added over the API: a missing kernel interface is an error.
    Now,
    /// Made by the daemon at its start (from its config or its state
    /// file): an uplink whose interface is missing is made anyway, down,
    /// and comes up when the interface does (as Open vSwitch keeps a port
    /// whose device is missing). Other errors stay errors.
    Waiting,
}

/// The control-plane side of a port kind.
pub trait Port: Send {
    /// Opens sockets (listen or first connect attempt) or queues.
    fn start(&mut self, cx: &PortCtx<'_>, start: Start) -> Result<(), PortError>;
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
    /// The port is deleted, not only stopped with the switch: also removes
    /// what a port keeps across the switch's restarts (a tap's interface).
    fn remove(&mut self, cx: &PortCtx<'_>) {
        self.stop(cx);
    }

    /// Nothing of the port changes while the daemon's thread does
    /// something else (no queue, no connection, no thread of its own): a
    /// takeover saves it, and the new process takes it up, before the
    /// workers pause. Default: false (saved in the pause).
    fn quiet(&self) -> bool {
        false
    }
    /// Takeover, first step (see [`takeover`]), the workers paused at a
    /// burst boundary: stops what the saved state must not change under
    /// (vhost-user's device takes its queues back; a half-done handshake
    /// is dropped). `Err` refuses the takeover, saying why. Default:
    /// nothing.
    fn pause(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError> {
        let _ = cx;
        Ok(())
    }
    /// Writes down what a process taking over needs to carry the port on
    /// where it is, its fds into `fds`; changes nothing. The kind's
    /// [`Persist::save_state`], as JSON ([`save_as`]). `Err` refuses the
    /// takeover, saying why.
    fn save(&self, cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<Saved, PortError>;
    /// Takes up, instead of [`Port::start`], a port another process saved
    /// with [`Port::save`]: its sockets, its connection and its queues,
    /// which resume where the shared rings are ([`restore_as`]).
    fn restore(&mut self, cx: &PortCtx<'_>, saved: Saved, fds: &mut FdIn) -> Result<(), PortError>;
    /// The takeover failed (the workers are still paused, the process that
    /// asked never ran a queue): undoes [`Port::pause`], the queues going
    /// on from where the rings are. Default: nothing.
    fn resume(&mut self, cx: &PortCtx<'_>) {
        let _ = cx;
    }
}

/// A kind's takeover state, typed: its `persist.rs` (as firecracker's
/// `Persist`). [`Port::save`] and [`Port::restore`] are these, through
/// [`save_as`] and [`restore_as`].
pub trait Persist {
    /// What the kind saves.
    type Saved: serde::Serialize + serde::de::DeserializeOwned;
    /// Writes the port down (the workers paused, [`Port::pause`] done),
    /// its fds into `fds`.
    fn save_state(&self, cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<Self::Saved, PortError>;
    /// Takes up a port another process saved.
    fn restore_state(
        &mut self,
        cx: &PortCtx<'_>,
        saved: Self::Saved,
        fds: &mut FdIn,
    ) -> Result<(), PortError>;
}

/// [`Port::save`] of a kind: its [`Persist::save_state`] as [`Saved`].
pub fn save_as<T: Persist>(
    port: &T,
    cx: &PortCtx<'_>,
    fds: &mut FdOut,
) -> Result<Saved, PortError> {
    Ok(takeover::write(&port.save_state(cx, fds)?))
}

/// [`Port::restore`] of a kind: [`Saved`] read as its [`Persist::Saved`].
pub fn restore_as<T: Persist>(
    port: &mut T,
    cx: &PortCtx<'_>,
    saved: Saved,
    fds: &mut FdIn,
) -> Result<(), PortError> {
    let saved = takeover::read(saved)?;
    port.restore_state(cx, saved, fds)
}
