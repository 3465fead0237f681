//! The tap part of a port spec: a kernel tap interface the switch creates,
//! so the host's own stack (kubelet probes, host services) reaches the
//! bridge, as an Open vSwitch internal port does.

use serde::{Deserialize, Serialize};

use super::{validate_queues, KindOptions, SocketAddr, SpecError};

/// Longest Linux interface name (`IFNAMSIZ` less its NUL).
pub const MAX_IFNAME: usize = 15;

/// A tap port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TapSpec {
    /// The interface's name (created by the switch; it outlives the
    /// switch's restarts and goes with the port).
    pub interface: String,
    /// Queue pairs (`IFF_MULTI_QUEUE`; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    /// The interface's MAC. A port added through the API gets one chosen
    /// once and kept in its persisted spec, so the host keeps its address
    /// across reboots too; unset (a port of the config file), the
    /// interface keeps whatever MAC it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_mac: Option<crate::MacAddr>,
}

impl TapSpec {
    /// A spec with only the interface set.
    pub fn new(interface: impl Into<String>) -> TapSpec {
        TapSpec {
            interface: interface.into(),
            queues: None,
            interface_mac: None,
        }
    }
}

/// Checks a Linux interface name: 1 to 15 bytes, no `/`, no white space,
/// not `.` or `..` (what the kernel's `dev_valid_name` refuses), and only
/// letters, digits, `-`, `_` and `.` (what tools quote safely).
pub fn validate_ifname(field: &str, name: &str) -> Result<(), SpecError> {
    if name.is_empty() || name.len() > MAX_IFNAME {
        return Err(SpecError::new(
            field,
            format!("{name:?}: an interface name is 1 to {MAX_IFNAME} bytes"),
        ));
    }
    if name == "."
        || name == ".."
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(SpecError::new(
            field,
            format!("{name:?}: an interface name holds letters, digits, '-', '_' and '.'"),
        ));
    }
    Ok(())
}

/// Checks what the kinds on a kernel interface share: the interface's
/// name and the queue pairs (1 when unset).
pub(crate) fn validate_interface_and_queues(
    at: &str,
    interface: &str,
    queues: Option<u16>,
) -> Result<(), SpecError> {
    validate_ifname(&format!("{at}interface"), interface)?;
    validate_queues(at, queues)
}

impl KindOptions for TapSpec {
    fn kind_name(&self) -> &'static str {
        "tap"
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

    fn validate(&self, at: &str) -> Result<(), SpecError> {
        if let Some(m) = self.interface_mac {
            if m.is_multicast() || m == crate::MacAddr::default() {
                return Err(SpecError::new(
                    format!("{at}interface_mac"),
                    format!("{m}: an interface's MAC is a unicast address, not zero"),
                ));
            }
        }
        validate_interface_and_queues(at, &self.interface, self.queues)
    }
}
