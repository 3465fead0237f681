//! The af-packet part of a port spec: an existing kernel interface (a NIC,
//! a bond, a veth) as an uplink, through `AF_PACKET` sockets.

use serde::{Deserialize, Serialize};

use super::tap::validate_interface_and_queues;
use super::{KindOptions, SocketAddr, SpecError};

/// An af-packet port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfPacketSpec {
    /// The interface (it must exist; the port follows it when it goes away
    /// and comes back).
    pub interface: String,
    /// Sockets, spread by a `PACKET_FANOUT_HASH` group (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
}

impl AfPacketSpec {
    /// A spec with only the interface set.
    pub fn new(interface: impl Into<String>) -> AfPacketSpec {
        AfPacketSpec {
            interface: interface.into(),
            queues: None,
        }
    }
}

impl KindOptions for AfPacketSpec {
    fn kind_name(&self) -> &'static str {
        "af-packet"
    }
    fn socket_addr_mut(&mut self) -> Option<&mut SocketAddr> {
        None
    }
    fn queues(&self) -> Option<u16> {
        self.queues
    }
    fn interface(&self) -> Option<&str> {
        Some(&self.interface)
    }
    /// An uplink carries the stations of a whole network: no limit.
    fn default_mac_limit(&self) -> u32 {
        0
    }

    fn validate(&self, at: &str) -> Result<(), SpecError> {
        validate_interface_and_queues(at, &self.interface, self.queues)
    }
}
