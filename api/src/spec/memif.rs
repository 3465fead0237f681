//! The memif part of a port spec.

use serde::{Deserialize, Serialize};

use super::{parse_named, validate_socket_and_queues, KindOptions, SpecError};

/// The switch's memif role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemifRole {
    /// The switch creates the socket and the shared memory.
    Master,
    /// The switch connects to the peer's socket.
    Slave,
}

impl MemifRole {
    /// The name specs use.
    pub fn as_str(self) -> &'static str {
        match self {
            MemifRole::Master => "master",
            MemifRole::Slave => "slave",
        }
    }

    /// The other side's role.
    pub fn peer(self) -> MemifRole {
        match self {
            MemifRole::Master => MemifRole::Slave,
            MemifRole::Slave => MemifRole::Master,
        }
    }
}

impl std::str::FromStr for MemifRole {
    type Err = String;
    /// `master` or `slave`; DPDK's newer names `server` and `client` are the
    /// same roles.
    fn from_str(s: &str) -> Result<MemifRole, String> {
        match s {
            "master" | "server" => Ok(MemifRole::Master),
            "slave" | "client" => Ok(MemifRole::Slave),
            r => Err(format!(
                "role: {r:?}: memif roles are master or slave (DPDK's server and client are the same)"
            )),
        }
    }
}

impl std::fmt::Display for MemifRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for MemifRole {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for MemifRole {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        parse_named(d, str::parse)
    }
}

/// memif interface mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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

impl Serialize for MemifMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for MemifMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        parse_named(d, |s| match s {
            "ethernet" => Ok(MemifMode::Ethernet),
            "ip" => Ok(MemifMode::Ip),
            m => Err(format!("mode: {m:?}: expected ethernet or ip")),
        })
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
    pub socket: String,
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
    pub fn new(role: MemifRole, socket: impl Into<String>) -> MemifSpec {
        MemifSpec {
            role,
            socket: socket.into(),
            id: None,
            secret: None,
            mode: None,
            queues: None,
            ring_size: None,
            buffer_size: None,
            socket_group: None,
        }
    }

    /// Whether the socket is an abstract name (`@name`, `abstract:name`).
    pub fn socket_is_abstract(&self) -> bool {
        self.socket.starts_with('@') || self.socket.starts_with("abstract:")
    }
}

impl KindOptions for MemifSpec {
    fn kind_name(&self) -> &'static str {
        "memif"
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
        !self.socket_is_abstract()
    }
    fn creates_socket(&self) -> bool {
        self.role == MemifRole::Master
    }
    fn queues(&self) -> Option<u16> {
        self.queues
    }

    fn validate(&self, at: &str) -> Result<(), SpecError> {
        let f = |n: &str| format!("{at}{n}");
        validate_socket_and_queues(at, &self.socket, self.queues)?;
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
        if self.socket_group.is_some() {
            if self.role == MemifRole::Slave {
                return Err(SpecError::new(
                    f("socket_group"),
                    "applies where the switch creates the socket (role master)",
                ));
            }
            if self.socket_is_abstract() {
                return Err(SpecError::new(
                    f("socket_group"),
                    "an abstract socket has no file to give a group",
                ));
            }
        }
        Ok(())
    }
}
