//! The memif part of a port spec.

use serde::{Deserialize, Serialize};

use super::socket::{socket_roles, unknown_keys, PodSection, SocketKindSpec};
use super::{validate_queues, KindOptions, KindSpec, SocketAddr, SocketSpec, SpecError};

socket_roles! {
    /// A memif role: the switch's in a port spec, the pod's in device-info.
    MemifRole of Memif:
    /// Creates the socket and the shared memory (DPDK's `server`).
    Master = "master" | "server",
    /// Connects to the peer's socket (DPDK's `client`).
    Slave = "slave" | "client";
    error: "memif roles are master or slave (DPDK's server and client are the same)"
}

/// memif interface mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
pub enum MemifMode {
    /// Ethernet frames (the only mode a bridge port takes).
    #[default]
    Ethernet,
    /// IP packets.
    Ip,
}

impl MemifMode {
    /// The name specs use.
    pub fn as_str(self) -> &'static str {
        match self {
            MemifMode::Ethernet => "ethernet",
            MemifMode::Ip => "ip",
        }
    }
}

impl TryFrom<String> for MemifMode {
    type Error = String;
    fn try_from(s: String) -> Result<MemifMode, String> {
        match s.as_str() {
            "ethernet" => Ok(MemifMode::Ethernet),
            "ip" => Ok(MemifMode::Ip),
            m => Err(format!("mode: {m:?}: expected ethernet or ip")),
        }
    }
}

impl From<MemifMode> for &'static str {
    fn from(m: MemifMode) -> &'static str {
        m.as_str()
    }
}

/// Default descriptors per ring.
pub const DEFAULT_RING_SIZE: u32 = 1024;
/// Default bytes per buffer.
pub const DEFAULT_BUFFER_SIZE: u32 = 2048;
/// Longest secret the handshake carries.
pub const MAX_SECRET: usize = 23;

/// A memif port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemifSpec {
    /// The switch's role.
    pub role: MemifRole,
    /// Socket path, or an abstract name (`@name`, `abstract:name`).
    pub socket: SocketAddr,
    /// Interface id (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// Secret the slave must present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Interface mode (default ethernet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MemifMode>,
    /// Queue pairs (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    /// Descriptors per ring (power of two, 2..=16384; default 1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_size: Option<u32>,
    /// Bytes per buffer (128..=65535; default 2048).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_size: Option<u32>,
    /// Numeric group given the socket the switch creates (role master):
    /// the file becomes `root:<gid>`, mode 0660, so a non-root pod in that
    /// group can connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<u32>,
}

impl MemifSpec {
    /// A spec with only the role and socket set.
    pub fn new(role: MemifRole, socket: SocketAddr) -> MemifSpec {
        MemifSpec {
            role,
            socket,
            id: None,
            secret: None,
            mode: None,
            queues: None,
            ring_size: None,
            buffer_size: None,
            socket_group: None,
        }
    }
}

impl MemifSpec {
    /// The socket, the switch's role there and the socket's group.
    pub fn socket_spec(&self) -> SocketSpec<'_> {
        SocketSpec {
            addr: &self.socket,
            role: self.role.into(),
            group: self.socket_group,
            interface: Some(self.id.unwrap_or(0)),
        }
    }
}

impl KindOptions for MemifSpec {
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
        let f = |n: &str| format!("{at}{n}");
        validate_queues(at, self.queues)?;
        if self.mode == Some(MemifMode::Ip) {
            return Err(SpecError::new(
                f("mode"),
                "ip mode is not supported on a bridge port (the bridge switches Ethernet frames)",
            ));
        }
        let ring = self.ring_size.unwrap_or(DEFAULT_RING_SIZE);
        if !ring.is_power_of_two() || !(2..=16384).contains(&ring) {
            return Err(SpecError::new(
                f("ring_size"),
                format!("{ring} is not a power of two in 2..=16384"),
            ));
        }
        let bs = self.buffer_size.unwrap_or(DEFAULT_BUFFER_SIZE);
        if !(128..=65535).contains(&bs) {
            return Err(SpecError::new(
                f("buffer_size"),
                format!("{bs} is out of range 128..=65535"),
            ));
        }
        if let Some(s) = &self.secret {
            if s.len() > MAX_SECRET || s.contains('\0') {
                return Err(SpecError::new(
                    f("secret"),
                    format!("at most {MAX_SECRET} bytes, no NUL"),
                ));
            }
        }
        Ok(())
    }
}

/// The memif section of an NPWG device-info document (the pod's role).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemifInfo {
    /// The pod's role: `master` or `slave`.
    pub role: MemifRole,
    /// `ethernet`, `ip` or `inject-punt`.
    pub mode: String,
    /// Socket path.
    pub path: String,
}

/// The memif section of a CNI netconf (`memif: {...}`): the pod's point of
/// view.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemifOptions {
    /// The pod's role: `slave` (default: the switch creates the socket) or
    /// `master`.
    pub role: Option<String>,
    /// `ethernet` (default; `ip` and `inject-punt` are refused: the bridge
    /// switches Ethernet frames).
    pub mode: Option<String>,
    /// Queue pairs.
    pub queues: Option<u16>,
    /// Descriptors per ring.
    pub ring_size: Option<u32>,
    /// Buffer size.
    pub buffer_size: Option<u32>,
    /// Shared secret.
    pub secret: Option<String>,
    /// A socket the pod's memif networks share, by name: each network
    /// that names it is one interface of it, told apart by `id`, as VPP's
    /// and DPDK's memif sockets carry several. Without it a network has a
    /// socket of its own.
    pub socket: Option<String>,
    /// The interface's id on its socket (default 0).
    pub id: Option<u32>,
}

impl MemifOptions {
    fn read(section: &serde_json::Value) -> Result<MemifOptions, SpecError> {
        if section.is_null() {
            return Ok(MemifOptions::default());
        }
        serde_json::from_value(section.clone())
            .map_err(|e| SpecError::new(<MemifSpec as SocketKindSpec>::NETCONF_KEY, e.to_string()))
    }
}

impl SocketKindSpec for MemifSpec {
    type Role = MemifRole;
    const NAME: &'static str = "memif";
    const NETCONF_KEY: &'static str = "memif";
    const NETCONF_ROLE: (&'static str, &'static str) = ("role", "memif role is master or slave");

    fn with_socket(role: MemifRole, addr: SocketAddr) -> MemifSpec {
        MemifSpec::new(role, addr)
    }

    fn into_kind(self) -> KindSpec {
        KindSpec::Memif(self)
    }

    /// memif in ethernet mode, the one a bridge serves.
    fn device_info(role: MemifRole, path: &str) -> serde_json::Value {
        serde_json::to_value(MemifInfo {
            role,
            mode: "ethernet".into(),
            path: path.to_string(),
        })
        .unwrap_or_default()
    }

    fn device_info_role(section: &serde_json::Value) -> Option<MemifRole> {
        serde_json::from_value::<MemifInfo>(section.clone())
            .ok()
            .map(|i| i.role)
    }

    fn pod_section(section: &serde_json::Value) -> Result<PodSection, SpecError> {
        let o = MemifOptions::read(section)?;
        match o.mode.as_deref() {
            None | Some("ethernet") => {}
            Some(m @ ("ip" | "inject-punt")) => {
                return Err(SpecError::new(
                    "memif.mode",
                    format!("{m:?} is not served: the switch's bridges carry Ethernet frames (use ethernet)"),
                ))
            }
            Some(m) => {
                return Err(SpecError::new(
                    "memif.mode",
                    format!("{m:?}: the memif modes are ethernet, ip and inject-punt, and the switch serves ethernet"),
                ))
            }
        }
        Ok(PodSection {
            role: o.role,
            shared_socket: o.socket,
            ignored: unknown_keys::<MemifOptions>(Self::NETCONF_KEY, section),
        })
    }

    fn take_pod_section(&mut self, section: &serde_json::Value, socket_group: Option<u32>) {
        let o = MemifOptions::read(section).unwrap_or_default();
        self.mode = Some(MemifMode::Ethernet);
        self.queues = o.queues;
        self.ring_size = o.ring_size;
        self.buffer_size = o.buffer_size;
        self.secret = o.secret;
        self.id = o.id;
        self.socket_group = socket_group;
    }
}
