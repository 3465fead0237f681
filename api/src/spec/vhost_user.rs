//! The vhost-user part of a port spec.

use serde::{Deserialize, Serialize};

use super::socket::socket_roles;
use super::{validate_queues, KindOptions, SocketAddr, SocketSpec, SpecError};

socket_roles! {
    /// Which end of the vhost-user socket a side is. (The switch is always
    /// the virtio backend, which the vhost-user spec calls the back-end or
    /// slave; `master`/`slave` are refused here because in vhost-user they
    /// name the frontend and the backend, not the socket's ends.)
    VhostUserRole of VhostUser:
    /// Creates the socket; the other end connects (QEMU with
    /// `reconnect=1`, DPDK's virtio_user).
    Server = "server",
    /// Connects to the other end's socket (QEMU `server=on`, virtio_user
    /// `server=1`), and again when it goes away.
    Client = "client";
    error: "vhost-user roles are server (creates the socket) or client (connects to it)"
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
            interface: None,
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
