//! Daemon configuration (TOML) and the port/bridge specs shared with the
//! control API.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::port::memif::handshake::Params;
use crate::port::memif::queue::Side;
use crate::port::memif::socket::SocketAddr;
use crate::port::memif::{MemifConfig, Mode};
use crate::port::vhost_user::{SocketRole, VhostUserConfig};
use crate::port::PortKind;
use crate::switch::security::{PortSecurity, DEFAULT_MAC_LIMIT, DEFAULT_MOVE_HOLD_SECS};
use crate::vlan::VlanSet;
use crate::wire::MacAddr;
use crate::worker::PollMode;

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// Default control socket.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/switchyard/control.sock";
/// Default `socket_dir`: port sockets lie below it.
pub const DEFAULT_SOCKET_DIR: &str = "/run/switchyard";

/// A configuration problem, naming the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A field has a bad value.
    #[error("{field}: {message}")]
    Invalid {
        /// Dotted field path, e.g. `port[2].ring_size`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The TOML does not parse or has unknown fields.
    #[error("config: {0}")]
    Parse(#[from] toml::de::Error),
    /// The file cannot be read.
    #[error("config {path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

fn default_control() -> PathBuf {
    PathBuf::from(DEFAULT_CONTROL_SOCKET)
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/switchyard")
}
fn default_socket_dir() -> PathBuf {
    PathBuf::from(DEFAULT_SOCKET_DIR)
}
fn default_aging() -> u32 {
    300
}
fn default_mac_table_size() -> usize {
    16384
}
fn default_move_hold() -> u32 {
    DEFAULT_MOVE_HOLD_SECS
}
fn default_workers() -> usize {
    1
}
fn default_idle_us() -> u64 {
    1000
}

/// The whole configuration file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Control API socket.
    #[serde(default = "default_control")]
    pub control_socket: PathBuf,
    /// Numeric group allowed to use the control socket (mode 0660 instead
    /// of the default 0600, root only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_group: Option<u32>,
    /// Where ports added at run time are persisted.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The directory every port socket lies in (as OVS keeps its vhost-user
    /// sockets in its run directory): a relative `socket` is taken from
    /// here, and one that resolves outside it is refused.
    #[serde(default = "default_socket_dir")]
    pub socket_dir: PathBuf,
    /// Seconds a learned MAC lives without traffic.
    #[serde(default = "default_aging")]
    pub mac_aging_secs: u32,
    /// MAC table entries per bridge.
    #[serde(default = "default_mac_table_size")]
    pub mac_table_size: usize,
    /// Seconds a MAC must be quiet on its port before it may move to
    /// another (move protection; 0: moves at once).
    #[serde(default = "default_move_hold")]
    pub mac_move_hold_secs: u32,
    /// Worker threads.
    #[serde(default)]
    pub dataplane: DataplaneConfig,
    /// Bridges created at start.
    #[serde(default, rename = "bridge")]
    pub bridges: Vec<BridgeSpec>,
    /// Ports created at start.
    #[serde(default, rename = "port")]
    pub ports: Vec<PortSpec>,
}

/// Worker settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataplaneConfig {
    /// Number of worker threads.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// CPU of each worker, in order (missing entries: not pinned).
    #[serde(default)]
    pub cpus: Vec<usize>,
    /// With no `cpus`, pin the workers to the last CPUs the process may run
    /// on (its affinity mask, e.g. the exclusive cpuset Kubernetes' static
    /// CPU manager gives a Guaranteed pod), leaving the first to the control
    /// thread when there are more CPUs than workers.
    #[serde(default)]
    pub auto_pin: bool,
    /// poll, interrupt or adaptive.
    #[serde(default)]
    pub poll_mode: PollMode,
    /// Adaptive mode: microseconds without traffic before a worker sleeps.
    #[serde(default = "default_idle_us")]
    pub adaptive_idle_us: u64,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            workers: default_workers(),
            cpus: Vec::new(),
            auto_pin: false,
            poll_mode: PollMode::default(),
            adaptive_idle_us: default_idle_us(),
        }
    }
}

/// A bridge domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeSpec {
    /// Name.
    pub name: String,
}

/// A port as the user describes it (config `[[port]]`, `port add`, API).
/// Roles are the **switch's** own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// Port name.
    pub name: String,
    /// memif or vhost-user.
    pub kind: PortKind,
    /// memif: master | slave; vhost-user: server | client.
    pub role: String,
    /// Socket path.
    pub socket: String,
    /// memif interface id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// memif secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// memif mode: ethernet | ip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Queue pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    /// Descriptors per ring (power of two, 2..=16384).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_size: Option<u32>,
    /// Bytes per buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_size: Option<u32>,
    /// Bridge to join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<String>,
    /// Access VLAN (1..=4094). Without it and without `trunk` the port is
    /// untagged-only: it carries its bridge's untagged frames and no VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// Trunk: the VLANs carried tagged (`100,200-210`; `0` adds untagged
    /// frames; `all` is every VLAN and untagged frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trunk: Option<VlanSet>,
    /// Numeric group given access to a socket the switch creates (memif
    /// master, vhost-user server): the socket file becomes `root:<gid>`,
    /// mode 0660, so a non-root pod in that group can connect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<u32>,
    /// Most MAC table entries the port may hold at once (default 64; 0: no
    /// limit). Frames from further new source addresses are dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_limit: Option<u32>,
    /// The only source MACs the port may send from, pinned to it: they
    /// never age and no other port can take them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macs: Option<Vec<MacAddr>>,
    /// Pin the first source MAC the port sends from (ignored with `macs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_first: Option<bool>,
}

/// A validated port, ready to build.
#[derive(Debug, Clone)]
pub enum PortSetup {
    /// memif.
    Memif(MemifConfig),
    /// vhost-user.
    VhostUser(VhostUserConfig),
}

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

/// Checks a name used for ports and bridges.
pub fn validate_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > 64 {
        return Err(invalid(field, "must be 1 to 64 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || name.starts_with('.')
    {
        return Err(invalid(
            field,
            format!("{name:?} may only hold letters, digits, '-', '_' and '.'"),
        ));
    }
    Ok(())
}

/// Where a port's socket lies: `socket` resolved against `base`, the
/// configured `socket_dir`. A relative path is taken from `base`; `..` is
/// refused; the deepest directory of the path that exists must resolve
/// (symbolic links followed) inside `base`, and the socket itself may not be
/// a symbolic link. memif abstract names (`@name`, `abstract:name`) have no
/// path and are returned as they are. `field` names the field in errors.
pub fn confine_socket(
    field: &str,
    base: &Path,
    kind: PortKind,
    socket: &str,
) -> Result<String, ConfigError> {
    if kind == PortKind::Memif && matches!(SocketAddr::parse(socket), SocketAddr::Abstract(_)) {
        return Ok(socket.to_string());
    }
    let given = Path::new(socket);
    if given
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(invalid(field, format!("{socket:?}: '..' is not allowed")));
    }
    let path: PathBuf = base
        .join(given)
        .components()
        .filter(|c| !matches!(c, std::path::Component::CurDir))
        .collect();
    let outside = || {
        invalid(
            field,
            format!(
                "{} is outside the socket directory {} (socket_dir)",
                path.display(),
                base.display()
            ),
        )
    };
    let root = base.canonicalize().map_err(|e| {
        invalid(
            field,
            format!("socket directory {} (socket_dir): {e}", base.display()),
        )
    })?;
    if path.file_name().is_none() {
        return Err(outside());
    }
    let mut dir = path.parent();
    while let Some(d) = dir {
        match d.canonicalize() {
            Ok(real) if real.starts_with(&root) => break,
            Ok(_) => return Err(outside()),
            Err(_) => dir = d.parent(),
        }
    }
    if dir.is_none() {
        return Err(outside());
    }
    crate::port::refuse_symlink(&path)
        .map_err(|_| invalid(field, format!("{} is a symbolic link", path.display())))?;
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| invalid(field, "not valid UTF-8"))
}

/// Most MACs a port may be pinned to.
pub const MAX_PINNED_MACS: usize = 64;

impl PortSpec {
    /// The port's security settings (after [`PortSpec::validate`]).
    pub fn security(&self) -> PortSecurity {
        PortSecurity {
            mac_limit: self.mac_limit.unwrap_or(DEFAULT_MAC_LIMIT),
            macs: self.macs.clone().unwrap_or_default(),
            pin_first: self.pin_first.unwrap_or(false),
        }
    }

    fn validate_security(&self, at: &str) -> Result<(), ConfigError> {
        let Some(macs) = &self.macs else {
            return Ok(());
        };
        if macs.len() > MAX_PINNED_MACS {
            return Err(invalid(
                format!("{at}macs"),
                format!("{} addresses; at most {MAX_PINNED_MACS}", macs.len()),
            ));
        }
        for (i, m) in macs.iter().enumerate() {
            if m.is_multicast() || m.to_u64() == 0 {
                return Err(invalid(
                    format!("{at}macs[{i}]"),
                    format!("{m} is not a station address (unicast, not zero)"),
                ));
            }
            if macs[..i].contains(m) {
                return Err(invalid(
                    format!("{at}macs[{i}]"),
                    format!("{m} is listed twice"),
                ));
            }
        }
        Ok(())
    }

    /// Validates the spec; `at` prefixes field names in errors (e.g. `port[1].`).
    pub fn validate(&self, at: &str) -> Result<PortSetup, ConfigError> {
        let f = |n: &str| format!("{at}{n}");
        validate_name(&f("name"), &self.name)?;
        self.validate_security(at)?;
        if self.socket.is_empty() {
            return Err(invalid(f("socket"), "must not be empty"));
        }
        if self.socket.len() > 107 {
            return Err(invalid(
                f("socket"),
                "longer than a Unix socket path allows (107 bytes)",
            ));
        }
        if let Some(v) = self.vlan {
            if v == 0 || v > crate::wire::ethernet::VLAN_ID_MAX {
                return Err(invalid(
                    f("vlan"),
                    format!("{v} is not a VLAN id (1..=4094)"),
                ));
            }
        }
        if self.vlan.is_some() && self.trunk.is_some() {
            return Err(invalid(
                f("trunk"),
                "a port is an access port (vlan) or a trunk, not both",
            ));
        }
        if let Some(b) = &self.bridge {
            validate_name(&f("bridge"), b)?;
        }
        let queues = self.queues.unwrap_or(1);
        if queues == 0 || queues > 255 {
            return Err(invalid(
                f("queues"),
                format!("{queues} is out of range 1..=255"),
            ));
        }
        match self.kind {
            PortKind::Memif => {
                let side = match self.role.as_str() {
                    "master" | "server" => Side::Master,
                    "slave" | "client" => Side::Slave,
                    r => {
                        return Err(invalid(
                            f("role"),
                            format!("{r:?}: memif roles are master or slave"),
                        ))
                    }
                };
                let mode = match self.mode.as_deref().unwrap_or("ethernet") {
                    "ethernet" => Mode::Ethernet,
                    "ip" => Mode::Ip,
                    m => {
                        return Err(invalid(
                            f("mode"),
                            format!("{m:?}: expected ethernet or ip"),
                        ))
                    }
                };
                if mode == Mode::Ip {
                    return Err(invalid(
                        f("mode"),
                        "ip mode is not supported on a bridge port (the bridge switches Ethernet frames)",
                    ));
                }
                let ring = self.ring_size.unwrap_or(1024);
                if !ring.is_power_of_two() || !(2..=16384).contains(&ring) {
                    return Err(invalid(
                        f("ring_size"),
                        format!("{ring} is not a power of two in 2..=16384"),
                    ));
                }
                let bs = self.buffer_size.unwrap_or(2048);
                if !(128..=65535).contains(&bs) {
                    return Err(invalid(
                        f("buffer_size"),
                        format!("{bs} is out of range 128..=65535"),
                    ));
                }
                if let Some(s) = &self.secret {
                    if s.len() > 23 || s.contains('\0') {
                        return Err(invalid(f("secret"), "at most 23 bytes, no NUL"));
                    }
                }
                if self.socket_group.is_some() {
                    if side == Side::Slave {
                        return Err(invalid(
                            f("socket_group"),
                            "applies where the switch creates the socket (role master)",
                        ));
                    }
                    if matches!(SocketAddr::parse(&self.socket), SocketAddr::Abstract(_)) {
                        return Err(invalid(
                            f("socket_group"),
                            "an abstract socket has no file to give a group",
                        ));
                    }
                }
                Ok(PortSetup::Memif(MemifConfig {
                    side,
                    socket_group: self.socket_group,
                    socket: self.socket.clone(),
                    params: Params {
                        if_name: self.name.clone(),
                        id: self.id.unwrap_or(0),
                        secret: self.secret.clone().filter(|s| !s.is_empty()),
                        mode,
                        queues,
                        log2_ring_size: ring.trailing_zeros() as u8,
                        buffer_size: bs,
                    },
                }))
            }
            PortKind::VhostUser => {
                let role = match self.role.as_str() {
                    "server" => SocketRole::Server,
                    "client" => SocketRole::Client,
                    r => {
                        return Err(invalid(
                            f("role"),
                            format!("{r:?}: vhost-user roles are server (the switch creates the socket) or client (the switch connects)"),
                        ))
                    }
                };
                let memif_only = [
                    ("id", self.id.is_some()),
                    ("secret", self.secret.is_some()),
                    ("mode", self.mode.is_some()),
                    ("ring_size", self.ring_size.is_some()),
                    ("buffer_size", self.buffer_size.is_some()),
                ];
                if let Some((field, _)) = memif_only.iter().find(|(_, set)| *set) {
                    return Err(invalid(
                        f(field),
                        "applies to memif ports only (a vhost-user frontend sizes its own rings and buffers)",
                    ));
                }
                if self.socket.starts_with('@') || self.socket.starts_with("abstract:") {
                    return Err(invalid(
                        f("socket"),
                        "vhost-user sockets are filesystem paths (no abstract names)",
                    ));
                }
                if self.socket_group.is_some() && role == SocketRole::Client {
                    return Err(invalid(
                        f("socket_group"),
                        "applies where the switch creates the socket (role server)",
                    ));
                }
                Ok(PortSetup::VhostUser(VhostUserConfig {
                    role,
                    socket_group: self.socket_group,
                    socket: PathBuf::from(&self.socket),
                    queues,
                }))
            }
        }
    }
}

impl Config {
    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text)?;
        c.validate()?;
        Ok(c)
    }

    /// The embedded default.
    pub fn embedded() -> Config {
        Config::parse(DEFAULT_CONFIG).expect("embedded default config is valid")
    }

    /// Reads a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text)
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let d = &self.dataplane;
        if d.workers == 0 || d.workers > 64 {
            return Err(invalid(
                "dataplane.workers",
                format!("{} is out of range 1..=64", d.workers),
            ));
        }
        if d.cpus.len() > d.workers {
            return Err(invalid("dataplane.cpus", "more CPUs than workers"));
        }
        if d.auto_pin && !d.cpus.is_empty() {
            return Err(invalid(
                "dataplane.auto_pin",
                "set either cpus or auto_pin, not both",
            ));
        }
        if self.mac_table_size == 0 || self.mac_table_size > 1 << 24 {
            return Err(invalid("mac_table_size", "out of range 1..=16777216"));
        }
        if !self.socket_dir.is_absolute() {
            return Err(invalid("socket_dir", "must be an absolute path"));
        }
        if self.mac_aging_secs == 0 {
            return Err(invalid("mac_aging_secs", "must be at least 1"));
        }
        let mut names = std::collections::HashSet::new();
        for (i, b) in self.bridges.iter().enumerate() {
            validate_name(&format!("bridge[{i}].name"), &b.name)?;
            if !names.insert(b.name.as_str()) {
                return Err(invalid(
                    format!("bridge[{i}].name"),
                    format!("duplicate bridge {:?}", b.name),
                ));
            }
        }
        let mut pnames = std::collections::HashSet::new();
        for (i, p) in self.ports.iter().enumerate() {
            let at = format!("port[{i}].");
            p.validate(&at)?;
            if !pnames.insert(p.name.as_str()) {
                return Err(invalid(
                    format!("{at}name"),
                    format!("duplicate port {:?}", p.name),
                ));
            }
            if let Some(b) = &p.bridge {
                if !names.contains(b.as_str()) {
                    return Err(invalid(
                        format!("{at}bridge"),
                        format!("no bridge named {b:?}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_stay_inside_the_socket_dir() {
        let base = tempfile::tempdir().unwrap();
        let b = base.path();
        std::fs::create_dir(b.join("pod")).unwrap();
        let ok = |s: &str, k: PortKind| confine_socket("port.socket", b, k, s);
        let inside = |rel: &str| b.join(rel).to_str().unwrap().to_string();
        // Relative paths are taken from the socket dir; absolute ones inside
        // it are kept; directories that do not exist yet are fine.
        assert_eq!(ok("a.sock", PortKind::Memif).unwrap(), inside("a.sock"));
        assert_eq!(
            ok("./pod/./v.sock", PortKind::VhostUser).unwrap(),
            inside("pod/v.sock")
        );
        assert_eq!(
            ok(&inside("pod/m.sock"), PortKind::Memif).unwrap(),
            inside("pod/m.sock")
        );
        assert_eq!(
            ok(&inside("new/dir/m.sock"), PortKind::Memif).unwrap(),
            inside("new/dir/m.sock")
        );
        // memif abstract names have no path.
        assert_eq!(ok("@sw", PortKind::Memif).unwrap(), "@sw");
        assert_eq!(ok("abstract:sw", PortKind::Memif).unwrap(), "abstract:sw");
        // Escapes: elsewhere, '..', a symlinked directory, a symlinked socket.
        let refused = |s: &str, why: &str| {
            let e = ok(s, PortKind::VhostUser).unwrap_err().to_string();
            assert!(
                e.starts_with("port.socket: ") && e.contains(why),
                "{s}: {e}"
            );
        };
        refused("/etc/evil.sock", "outside the socket directory");
        refused("/evil.sock", "outside the socket directory");
        refused("../evil.sock", "'..' is not allowed");
        refused(&inside("pod/../../evil.sock"), "'..' is not allowed");
        std::os::unix::fs::symlink("/etc", b.join("pod/etc")).unwrap();
        refused(&inside("pod/etc/evil.sock"), "outside the socket directory");
        refused("pod/etc/deeper/evil.sock", "outside the socket directory");
        std::os::unix::fs::symlink("/run/other.sock", b.join("pod/link.sock")).unwrap();
        refused("pod/link.sock", "is a symbolic link");
        // A socket directory that does not exist is named.
        let e = confine_socket("port.socket", &b.join("none"), PortKind::Memif, "a.sock");
        assert!(e.unwrap_err().to_string().contains("(socket_dir)"));
    }

    #[test]
    fn embedded_default_parses() {
        let c = Config::embedded();
        assert_eq!(c.control_socket, PathBuf::from(DEFAULT_CONTROL_SOCKET));
        assert_eq!(c.bridges[0].name, "default");
        assert_eq!(c.dataplane.workers, 1);
        assert_eq!(c.dataplane.poll_mode, PollMode::Adaptive);
    }

    #[test]
    fn example_config_parses() {
        let text = include_str!("../../config/switchyard.toml");
        let c = Config::parse(text).unwrap();
        assert!(!c.ports.is_empty());
    }

    #[test]
    fn errors_name_the_field() {
        let e = Config::parse("[[bridge]]\nname='b'\n[[port]]\nname='p'\nkind='memif'\nrole='master'\nsocket='/x'\nring_size=1000\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("port[0].ring_size:"), "{e}");
        let e = Config::parse("[[port]]\nname='p'\nkind='memif'\nrole='boss'\nsocket='/x'\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("port[0].role:"), "{e}");
        let e = Config::parse(
            "[[port]]\nname='p'\nkind='memif'\nrole='master'\nsocket='/x'\nbridge='nope'\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("port[0].bridge:"), "{e}");
        let e = Config::parse("wrkers = 3\n").unwrap_err().to_string();
        assert!(e.contains("wrkers"), "{e}");
        let e = Config::parse(
            "[[port]]\nname='p'\nkind='memif'\nrole='master'\nsocket='/x'\nvlan=4095\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("port[0].vlan:"), "{e}");
        let e = Config::parse(
            "[[port]]\nname='v'\nkind='vhost-user'\nrole='server'\nsocket='/x'\nring_size=256\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("port[0].ring_size:"), "{e}");
        let e =
            Config::parse("[[port]]\nname='v'\nkind='vhost-user'\nrole='master'\nsocket='/x'\n")
                .unwrap_err()
                .to_string();
        assert!(e.starts_with("port[0].role:"), "{e}");
        assert!(Config::parse(
            "[[port]]\nname='v'\nkind='vhost-user'\nrole='client'\nsocket='/x'\nqueues=2\n"
        )
        .is_ok());
        assert!(validate_name("name", "../x").is_err());
        assert!(validate_name("name", "eth0.100").is_ok());
        let port = |extra: &str| {
            Config::parse(&format!(
                "[[port]]\nname='p'\nkind='memif'\nsocket='/x'\n{extra}\n"
            ))
            .map_err(|e| e.to_string())
        };
        let e = port("role='master'\nvlan=5\ntrunk='6'").unwrap_err();
        assert!(e.starts_with("port[0].trunk:"), "{e}");
        let e = port("role='master'\ntrunk='1-4095'").unwrap_err();
        assert!(
            e.contains("trunk") && e.contains("4095 is not a VLAN id"),
            "{e}"
        );
        assert!(port("role='master'\ntrunk='0,100-200'").is_ok());
        assert!(port("role='master'\nsocket_group=1000").is_ok());
        let e = port("role='slave'\nsocket_group=1000").unwrap_err();
        assert!(e.starts_with("port[0].socket_group:"), "{e}");
        let e = Config::parse(
            "[[port]]\nname='p'\nkind='memif'\nrole='master'\nsocket='@abs'\nsocket_group=1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("port[0].socket_group:"), "{e}");
        let e = Config::parse(
            "[[port]]\nname='v'\nkind='vhost-user'\nrole='client'\nsocket='/x'\nsocket_group=1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("port[0].socket_group:"), "{e}");
    }
}
