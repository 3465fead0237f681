//! Switchyard: a userspace L2 switch for Kubernetes pods: the daemon. Its
//! control protocol, port specs and client are the `switchyard_api` crate.
//!
//! Layers, from the bottom up. A module imports only from layers below its
//! own (`tests/layers.rs` reads this list and checks every import):
//!
//! 0. [`types`], [`wire`], [`vlan`], [`eventfd`]: slot numbers, drop
//!    reasons and counters; byte-level views of Ethernet, IP, memif and
//!    virtio-net headers and the Internet checksum; VLAN membership;
//!    eventfd kicks.
//! 1. [`queue`]: the data-plane seam (frames, their offload work and its
//!    software finishing, the [`queue::RxQueue`] / [`queue::TxQueue`]
//!    traits).
//! 2. [`reactor`], [`switch`], [`observe`]: the control thread's epoll;
//!    the MAC tables and port security state; packet capture and
//!    forwarding traces as workers record them.
//! 3. [`dataplane`]: the state the control thread shares with the workers
//!    (ports, bridges, queue slots, counters) and the views workers take.
//! 4. [`forward`], [`port`]: one worker's L2 forwarding of a burst; the port
//!    kinds (memif, vhost-user, tap, af-packet, af-xdp) behind the [`port::Port`] trait and the
//!    [`port::PortCtx`] seam, each a module that knows nothing of the other.
//! 5. [`worker`]: the poll-mode worker loop.
//! 6. [`config`]: the configuration file and the socket path policy.
//! 7. [`control`]: the daemon (the event loop owning every port), the API
//!    server and the persisted state.

#![warn(missing_docs)]

pub mod config;
pub mod control;
pub mod dataplane;
pub mod eventfd;
pub mod forward;
pub mod observe;
pub mod port;
pub mod queue;
pub mod reactor;
pub mod switch;
pub mod types;
pub mod vlan;
pub mod wire;
pub mod worker;
