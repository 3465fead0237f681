//! Switchyard's control protocol, shared by the daemon (`switchyard`), the
//! CNI plugin and the device plugin, none of which links the others.
//!
//! - [`spec`]: typed port and bridge specs, parsed once where they enter;
//! - [`protocol`]: the requests and answers on the control socket;
//! - [`call`]: each request paired with the type of its answer;
//! - [`client`]: a blocking client of that socket;
//! - [`devinfo`]: the NPWG device-info document the CNI and the device
//!   plugin write for a pod;
//! - [`overlay`]: an overlay's addresses split in one slice per node;
//! - [`mac`], [`vlan`]: the value types the specs hold;
//! - [`fs`]: the atomic file writer, the group grant and the path check the
//!   three share.
//!
//! It imports nothing of Switchyard and needs nothing beyond serde.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod call;
pub mod client;
pub mod devinfo;
pub mod fs;
pub mod mac;
pub mod overlay;
pub mod policy;
pub mod protocol;
pub mod spec;
pub mod vlan;

pub use call::{Call, Pong};
pub use client::{Client, ClientError, RETRY_FOR};
pub use mac::{MacAddr, MacParseError};
pub use protocol::{
    ApiError, BridgeCounts, BridgeInfo, CaptureDirection, CaptureFormat, CaptureInfo, Delivery,
    DropReason, ErrorCode, LearnOutcome, LookupOutcome, MacInfo, PollMode, PortInfo, PortStats,
    PortStatus, PortTotals, QueueLoad, RemoteStation, Request, Response, StationSet, TraceEntry,
    TraceOut, VtepInfo, WorkerInfo, WORKER_STALL_LIMIT,
};
pub use spec::{
    AfPacketSpec, AfXdpSpec, BridgeSpec, KindSpec, MemifMode, MemifRole, MemifSpec, PortSpec, Side,
    SocketAddr, SocketKind, SocketRole, SocketSpec, SpecError, TapSpec, VhostUserRole,
    VhostUserSpec, VxlanSpec, XdpMode,
};
pub use vlan::VlanSet;

/// Default control socket.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/switchyard/control.sock";
/// Default `socket_dir`: port sockets lie below it.
pub const DEFAULT_SOCKET_DIR: &str = "/run/switchyard";
/// The CNI plugin's node-wide records, a directory of its socket directory
/// (`socketDir`): no port's socket may lie in it.
pub const CNI_RECORDS_DIR: &str = ".switchyard-cni";

/// FNV-1a of `name`: a hash that stays the same across releases (unlike
/// std's), for identifiers and MAC addresses derived from names.
pub fn stable_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_stable_hash_is_fnv1a() {
        assert_eq!(super::stable_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
