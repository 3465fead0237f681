//! The socket machinery of the socket kinds (memif, vhost-user), written
//! once: a kind adds its [`Greeting`] and [`Protocol`] and names none of
//! this.
//!
//! - [`protocol`]: the contract a kind implements, [`Closed`], and the
//!   sub-tokens ([`Sub`]).
//! - [`endpoint`]: binding, listening, accepting and connecting, with
//!   retries.
//! - [`listener`]: the sockets the switch listens on, each an object of its
//!   own in the daemon's table ([`Listeners`]), and the ports each serves.
//! - [`SocketPort`]: a port's end of its socket, the one-peer policy, its
//!   status and the disconnect; `persist.rs` its takeover.

pub mod endpoint;
pub mod listener;
mod persist;
mod port;
pub mod protocol;

pub use listener::{Listeners, SocketId};
pub use persist::SavedSocketPort;
pub use port::SocketPort;
pub use protocol::{Closed, Greeting, Protocol, Sub};
