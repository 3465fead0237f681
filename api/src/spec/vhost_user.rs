//! The vhost-user part of a port spec.

use serde::{Deserialize, Serialize};

use super::socket::{socket_roles, unknown_keys, PodSection, SocketKindSpec};
use super::{validate_queues, KindOptions, KindSpec, SocketAddr, SocketSpec, SpecError};

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
        <Self as SocketKindSpec>::NAME
    }
    fn socket_addr_mut(&mut self) -> Option<&mut SocketAddr> {
        Some(&mut self.socket)
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

/// The vhost-user section of an NPWG device-info document (the pod's
/// mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostUserInfo {
    /// The pod's mode: `client` (the host made the socket) or `server`.
    pub mode: VhostUserRole,
    /// Socket path.
    pub path: String,
}

/// The vhost-user section of a CNI netconf (`vhostUser: {...}`): the pod's
/// point of view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VhostUserOptions {
    /// The pod's mode: `client` (default: the switch creates the socket) or
    /// `server`.
    pub mode: Option<String>,
    /// Queue pairs.
    pub queues: Option<u16>,
}

impl VhostUserOptions {
    fn read(section: &serde_json::Value) -> Result<VhostUserOptions, SpecError> {
        if section.is_null() {
            return Ok(VhostUserOptions::default());
        }
        serde_json::from_value(section.clone()).map_err(|e| {
            SpecError::new(<VhostUserSpec as SocketKindSpec>::NETCONF_KEY, e.to_string())
        })
    }
}

impl SocketKindSpec for VhostUserSpec {
    type Role = VhostUserRole;
    const NAME: &'static str = "vhost-user";
    const NETCONF_KEY: &'static str = "vhostUser";
    const NETCONF_ROLE: (&'static str, &'static str) =
        ("mode", "vhost-user mode is client or server");

    fn with_socket(role: VhostUserRole, addr: SocketAddr) -> VhostUserSpec {
        VhostUserSpec::new(role, addr)
    }

    fn into_kind(self) -> KindSpec {
        KindSpec::VhostUser(self)
    }

    fn device_info(role: VhostUserRole, path: &str) -> serde_json::Value {
        serde_json::to_value(VhostUserInfo {
            mode: role,
            path: path.to_string(),
        })
        .unwrap_or_default()
    }

    fn device_info_role(section: &serde_json::Value) -> Option<VhostUserRole> {
        serde_json::from_value::<VhostUserInfo>(section.clone())
            .ok()
            .map(|i| i.mode)
    }

    fn pod_section(section: &serde_json::Value) -> Result<PodSection, SpecError> {
        let o = VhostUserOptions::read(section)?;
        Ok(PodSection {
            role: o.mode,
            shared_socket: None,
            ignored: unknown_keys::<VhostUserOptions>(Self::NETCONF_KEY, section),
        })
    }

    fn take_pod_section(&mut self, section: &serde_json::Value, socket_group: Option<u32>) {
        self.queues = VhostUserOptions::read(section).unwrap_or_default().queues;
        self.socket_group = socket_group;
    }
}
