//! The control plane: the daemon's event loop that owns every port, the
//! server of the JSON API (whose types and client are `switchyard_api`'s),
//! the packet capture and trace streams, the balancing of receive queues
//! across workers, the Prometheus endpoint and the persisted state.

pub mod daemon;
pub mod metrics;
pub mod observe;
pub mod rebalance;
pub mod server;
pub mod state;
pub mod takeover;

pub use daemon::Daemon;

/// This process's PID namespace (the inode of `/proc/self/ns/pid`): the
/// control API's ping says it, so a probe can tell whether the switch that
/// answers runs in its own container.
pub fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}
