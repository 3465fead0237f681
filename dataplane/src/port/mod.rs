//! Ports: the switch's attachments to peers, one module per kind.
//!
//! A kind is two things behind two seams:
//! - a [`Port`], the control-plane side (sockets, handshakes, link state),
//!   driven by the control thread's reactor through a [`PortCtx`]; socket
//!   kinds listen through the socket's one [`listener::Listener`] (several
//!   memif interfaces share a socket) or connect through an
//!   [`endpoint::Connector`], and every
//!   kind hands its queues to the workers through one [`QueueLink`];
//! - [`crate::queue::RxQueue`] / [`crate::queue::TxQueue`]s, the data-plane side,
//!   polled by workers in bursts.
//!
//! Socket kinds (memif, vhost-user) are a [`socket_port::Protocol`] on a
//! [`socket_port::SocketPort`]; uplink kinds (af-packet, af-xdp) an
//! [`kernel_if::Uplink`] on a [`kernel_if::KernelIf`]. A kind's module
//! knows nothing of the others, and nothing here names a kind:
//! [`registry::build`] is the one place that lists them.

pub mod af_packet;
pub mod af_xdp;
pub mod endpoint;
pub mod handover;
pub mod kernel_if;
pub mod listener;
pub mod memif;
pub mod netdev;
pub mod registry;
pub mod sigbus;
pub mod socket_port;
pub mod tap;
pub mod vhost_user;
pub mod vxlan;

use std::os::fd::AsFd;
use std::time::Instant;

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
    Handover(#[from] handover::HandoverError),
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

/// The control-plane side of a port kind.
pub trait Port: Send {
    /// Opens sockets (listen or first connect attempt).
    fn start(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError>;
    /// Starts a port the daemon makes itself at start (from its config or
    /// its state file), whose kernel interface may appear later: an uplink
    /// whose interface is missing is made anyway, down, and comes up when
    /// the interface does (as Open vSwitch keeps a port whose device is
    /// missing). Other errors stay errors. Kinds with a socket: `start`.
    fn start_waiting(&mut self, cx: &PortCtx<'_>) -> Result<(), PortError> {
        self.start(cx)
    }
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
    /// Writes down what a process taking over needs to carry the port on
    /// where it is (see [`handover`]), its fds into `fds`. The workers are
    /// paused at a burst boundary meanwhile, so the queues are as a burst
    /// left them. `Err` refuses the takeover, saying why.
    fn save(
        &mut self,
        cx: &PortCtx<'_>,
        fds: &mut handover::FdOut,
    ) -> Result<handover::Saved, PortError>;
    /// Takes up, instead of [`Port::start`], a port another process saved
    /// with [`Port::save`]: its sockets, its connection and its queues,
    /// which resume where the shared rings are.
    fn restore(
        &mut self,
        cx: &PortCtx<'_>,
        saved: handover::Saved,
        fds: &mut handover::FdIn,
    ) -> Result<(), PortError>;
    /// A takeover failed (the workers are still paused, the process that
    /// asked never ran a queue): the queues go on from where the rings
    /// are, which [`Port::save`] may have stopped.
    fn requeue(&mut self, cx: &PortCtx<'_>) {
        let _ = cx;
    }
}
