//! The vhost-user part of a port spec.

use serde::{Deserialize, Serialize};

use super::{parse_named, validate_socket_and_queues, KindOptions, SpecError};

/// Which end of the vhost-user socket the switch is. (The switch is always
/// the virtio backend, which the vhost-user spec calls the back-end or
/// slave; `master`/`slave` are refused here because in vhost-user they name
/// the frontend and the backend, not the socket's ends.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VhostUserRole {
    /// The switch creates the socket and the frontend (QEMU with
    /// `reconnect=1`, DPDK's virtio_user) connects.
    Server,
    /// The switch connects to the frontend's socket (QEMU `server=on`,
    /// virtio_user `server=1`) and reconnects when it goes away.
    Client,
}

impl VhostUserRole {
    /// The name specs use.
    pub fn as_str(self) -> &'static str {
        match self {
            VhostUserRole::Server => "server",
            VhostUserRole::Client => "client",
        }
    }

    /// The other end's role.
    pub fn peer(self) -> VhostUserRole {
        match self {
            VhostUserRole::Server => VhostUserRole::Client,
            VhostUserRole::Client => VhostUserRole::Server,
        }
    }
}

impl std::str::FromStr for VhostUserRole {
    type Err = String;
    fn from_str(s: &str) -> Result<VhostUserRole, String> {
        match s {
            "server" => Ok(VhostUserRole::Server),
            "client" => Ok(VhostUserRole::Client),
            r => Err(format!(
                "role: {r:?}: vhost-user roles are server (the switch creates the socket) or client (the switch connects)"
            )),
        }
    }
}

impl std::fmt::Display for VhostUserRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for VhostUserRole {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for VhostUserRole {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        parse_named(d, str::parse)
    }
}

/// A vhost-user port. The frontend sizes its own rings and buffers, so
/// there is nothing to say about them here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VhostUserSpec {
    /// The switch's role.
    pub role: VhostUserRole,
    /// Socket path.
    pub socket: String,
    /// Queue pairs offered (default: one per worker, as OVS-DPDK).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    /// Numeric group given the socket the switch creates (role server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<u32>,
}

impl VhostUserSpec {
    /// A spec with only the role and socket set.
    pub fn new(role: VhostUserRole, socket: impl Into<String>) -> VhostUserSpec {
        VhostUserSpec {
            role,
            socket: socket.into(),
            queues: None,
            socket_group: None,
        }
    }
}

impl KindOptions for VhostUserSpec {
    fn kind_name(&self) -> &'static str {
        "vhost-user"
    }
    fn role(&self) -> &'static str {
        self.role.as_str()
    }
    fn socket(&self) -> Option<&str> {
        Some(&self.socket)
    }
    fn set_socket(&mut self, socket: String) {
        self.socket = socket;
    }
    fn socket_is_path(&self) -> bool {
        true
    }
    fn creates_socket(&self) -> bool {
        self.role == VhostUserRole::Server
    }
    fn queues(&self) -> Option<u16> {
        self.queues
    }

    fn validate(&self, at: &str) -> Result<(), SpecError> {
        validate_socket_and_queues(at, &self.socket, self.queues)?;
        if self.socket.starts_with('@') || self.socket.starts_with("abstract:") {
            return Err(SpecError::new(
                format!("{at}socket"),
                "vhost-user sockets are filesystem paths (no abstract names)",
            ));
        }
        if self.socket_group.is_some() && self.role == VhostUserRole::Client {
            return Err(SpecError::new(
                format!("{at}socket_group"),
                "applies where the switch creates the socket (role server)",
            ));
        }
        Ok(())
    }
}
