//! The control plane: the JSON API over a Unix socket, persisted state, and
//! the daemon's event loop that owns every port.

pub mod api;
pub mod client;
pub mod daemon;
pub mod server;
pub mod state;

pub use api::{ApiError, ErrorCode, Request, Response};
pub use client::{Client, ClientError};
pub use daemon::Daemon;
