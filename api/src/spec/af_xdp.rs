//! The af-xdp part of a port spec: an existing kernel interface as an
//! uplink, through AF_XDP sockets and the switch's own XDP program.

use serde::{Deserialize, Serialize};

use super::tap::validate_interface_and_queues;
use super::{KindOptions, SocketAddr, SpecError};

/// An af-xdp port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfXdpSpec {
    /// The interface (it must exist; the port follows it when it goes away
    /// and comes back).
    pub interface: String,
    /// Sockets, one per interface queue from 0 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    /// How the XDP program and sockets attach (default best-effort).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<XdpMode>,
}

/// How an af-xdp port attaches, in Open vSwitch's words (`xdp-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum XdpMode {
    /// The best the driver has: native with zero-copy, native with copy,
    /// generic (skb) otherwise.
    #[default]
    BestEffort,
    /// Native XDP with zero-copy, or fail.
    NativeWithZerocopy,
    /// Native XDP (copy mode), or fail.
    Native,
    /// Generic (skb) XDP, copy mode: every driver has it.
    Generic,
}

impl AfXdpSpec {
    /// A spec with only the interface set.
    pub fn new(interface: impl Into<String>) -> AfXdpSpec {
        AfXdpSpec {
            interface: interface.into(),
            queues: None,
            mode: None,
        }
    }
}

impl KindOptions for AfXdpSpec {
    fn kind_name(&self) -> &'static str {
        "af-xdp"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_spelt_as_in_open_vswitch() {
        let s: AfXdpSpec =
            serde_json::from_str(r#"{"interface":"eth1","mode":"native-with-zerocopy"}"#).unwrap();
        assert_eq!(s.mode, Some(XdpMode::NativeWithZerocopy));
        assert!(
            serde_json::from_str::<AfXdpSpec>(r#"{"interface":"eth1","mode":"fast"}"#).is_err()
        );
        let back = serde_json::to_string(&AfXdpSpec::new("eth1")).unwrap();
        assert_eq!(back, r#"{"interface":"eth1"}"#);
    }
}
