//! The control plane: the daemon's event loop that owns every port, the
//! server of the JSON API (whose types and client are `switchyard_api`'s),
//! the packet capture and trace streams, the balancing of receive queues
//! across workers, the Prometheus endpoint and the persisted state.

pub mod daemon;
pub mod handover;
pub mod metrics;
pub mod observe;
pub mod rebalance;
pub mod server;
pub mod state;

pub use daemon::Daemon;
