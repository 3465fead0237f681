//! The vhost-user part of a port spec.

use serde::{Deserialize, Serialize};

use super::{
    validate_queues, KindOptions, Side, SocketAddr, SocketKind, SocketRole, SocketSpec, SpecError,
};

/// Which end of the vhost-user socket the switch is. (The switch is always
/// the virtio backend, which the vhost-user spec calls the back-end or
/// slave; `master`/`slave` are refused here because in vhost-user they name
/// the frontend and the backend, not the socket's ends.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
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

    /// Which end of the socket the role's holder is.
    pub fn side(self) -> Side {
        match self {
            VhostUserRole::Server => Side::Listen,
            VhostUserRole::Client => Side::Connect,
        }
    }
}

impl From<Side> for VhostUserRole {
    fn from(side: Side) -> VhostUserRole {
        match side {
            Side::Listen => VhostUserRole::Server,
            Side::Connect => VhostUserRole::Client,
        }
    }
}

impl From<VhostUserRole> for SocketRole {
    fn from(r: VhostUserRole) -> SocketRole {
        SocketKind::VhostUser.role(r.side())
    }
}

/// As serde reads it: the error names the field (a flattened spec's
/// errors would not).
impl TryFrom<String> for VhostUserRole {
    type Error = String;
    fn try_from(s: String) -> Result<VhostUserRole, String> {
        s.parse().map_err(|e| format!("role: {e}"))
    }
}

impl From<VhostUserRole> for &'static str {
    fn from(r: VhostUserRole) -> &'static str {
        r.as_str()
    }
}

impl std::str::FromStr for VhostUserRole {
    type Err = String;
    fn from_str(s: &str) -> Result<VhostUserRole, String> {
        match s {
            "server" => Ok(VhostUserRole::Server),
            "client" => Ok(VhostUserRole::Client),
            r => Err(format!(
                "{r:?}: vhost-user roles are server (creates the socket) or client (connects to it)"
            )),
        }
    }
}

impl std::fmt::Display for VhostUserRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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
    pub socket: SocketAddr,
    /// Queue pairs offered (default: one per worker, as OVS-DPDK).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    /// Numeric group given the socket the switch creates (role server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<u32>,
}

impl VhostUserSpec {
    /// A spec with only the role and socket set.
    pub fn new(role: VhostUserRole, socket: SocketAddr) -> VhostUserSpec {
        VhostUserSpec {
            role,
            socket,
            queues: None,
            socket_group: None,
        }
    }
}

impl VhostUserSpec {
    /// The socket, the switch's role there and the socket's group.
    pub fn socket_spec(&self) -> SocketSpec<'_> {
        SocketSpec {
            addr: &self.socket,
            role: self.role.into(),
            group: self.socket_group,
        }
    }
}

impl KindOptions for VhostUserSpec {
    fn kind_name(&self) -> &'static str {
        "vhost-user"
    }
    fn socket(&self) -> Option<SocketSpec<'_>> {
        Some(self.socket_spec())
    }
    fn socket_mut(&mut self) -> Option<&mut SocketAddr> {
        Some(&mut self.socket)
    }
    fn queues(&self) -> Option<u16> {
        self.queues
    }

    fn validate(&self, at: &str) -> Result<(), SpecError> {
        validate_queues(at, self.queues)?;
        if self.socket.path().is_none() {
            return Err(SpecError::new(
                format!("{at}socket"),
                "vhost-user sockets are filesystem paths (no abstract names)",
            ));
        }
        Ok(())
    }
}
