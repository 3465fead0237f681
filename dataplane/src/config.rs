//! The daemon's configuration file (TOML) and the socket path policy.
//! Port and bridge specs are `switchyard_api`'s, typed as they parse.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use switchyard_api::SocketAddr;

pub use switchyard_api::spec::{validate_name, BridgeSpec, KindSpec, PortSpec, SpecError};
pub use switchyard_api::{DEFAULT_CONTROL_SOCKET, DEFAULT_SOCKET_DIR};

use crate::switch::security::DEFAULT_MOVE_HOLD_SECS;
use crate::worker::PollMode;

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

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
    /// The TOML does not parse, has unknown fields or values of the wrong
    /// type: where (`port[1]`), what, and the line.
    #[error("{0}")]
    Parse(String),
    /// The file cannot be read.
    #[error("config {path}: {cause}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause (in the message, not repeated as a `source()`).
        cause: std::io::Error,
    },
}

impl From<SpecError> for ConfigError {
    fn from(e: SpecError) -> ConfigError {
        ConfigError::Invalid {
            field: e.field,
            message: e.message,
        }
    }
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
fn default_rebalance_interval() -> u64 {
    60
}
fn default_rebalance_load() -> u8 {
    95
}
fn default_rebalance_improvement() -> u8 {
    25
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
    /// Where the Prometheus endpoint listens (`GET /metrics`), e.g.
    /// `"127.0.0.1:9477"`; unset: no endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Worker threads.
    #[serde(default)]
    pub dataplane: DataplaneConfig,
    /// Bridges created at start.
    #[serde(default, rename = "bridge")]
    pub bridges: Vec<BridgeSpec>,
    /// Ports created at start.
    #[serde(default, rename = "port")]
    pub ports: Vec<PortSpec>,
    /// Physical networks: each gets a bridge of its name and an uplink on
    /// its interface (a VLAN trunk of every VLAN), so the networks that name
    /// it (CNI `physnet`) leave the node on their VLAN.
    #[serde(default)]
    pub physnets: std::collections::BTreeMap<String, Physnet>,
    /// Overlay networks: each gets a bridge of its name, joined to the
    /// other nodes' bridges of that name by VXLAN tunnels to their VTEPs,
    /// so the networks that name it (CNI `physnet`) span the nodes over any
    /// IP network.
    #[serde(default)]
    pub overlays: std::collections::BTreeMap<String, Overlay>,
}

/// Longest overlay name: its tunnels are named after it and a remote
/// VTEP's address (an IPv6 one is 39 characters) within a port name's 64.
pub const MAX_OVERLAY_NAME: usize = 16;

/// An overlay network: its VNIs, this node's VTEP and the remote VTEPs
/// the daemon makes tunnels to at start (`switchyard vtep add` adds more).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    /// The VNI of an untagged overlay: the bridge's untagged frames.
    #[serde(default)]
    pub vni: Option<u32>,
    /// A trunked overlay's VNI for each VLAN (`vlans = [{ vlan = 100, vni
    /// = 5100 }]`): the frames of VLAN 100 cross in VNI 5100.
    #[serde(default)]
    pub vlans: Vec<VlanVni>,
    /// This node's VTEP address; unset, the address the host's route to
    /// each remote VTEP leaves from.
    #[serde(default)]
    pub local: Option<std::net::IpAddr>,
    /// The UDP port on every node (default 4789).
    #[serde(default)]
    pub dstport: Option<u16>,
    /// Remote VTEPs joined at start.
    #[serde(default)]
    pub remotes: Vec<std::net::IpAddr>,
    /// Addresses for the networks on the overlay that name no IPAM of
    /// their own: its subnets, split in a slice per node (the node agent
    /// claims this node's).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict_ipam"
    )]
    pub ipam: Option<switchyard_api::overlay::OverlayIpam>,
}

/// A VLAN of a trunked overlay and its VNI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VlanVni {
    /// The VLAN (1..=4094).
    pub vlan: u16,
    /// Its VNI.
    pub vni: u32,
}

/// An overlay's `ipam` as the config spells it: a key it does not have
/// is refused, naming it (the API's type reads what a newer switch
/// reports and leaves what it does not know).
fn strict_ipam<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<switchyard_api::overlay::OverlayIpam>, D::Error> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        #[serde(default)]
        subnet: Option<ipnet::Ipv4Net>,
        #[serde(default)]
        node_prefix: Option<u8>,
        #[serde(default)]
        subnet6: Option<ipnet::Ipv6Net>,
        #[serde(default)]
        node_prefix6: Option<u8>,
    }
    Ok(
        Option::<Strict>::deserialize(d)?.map(|s| switchyard_api::overlay::OverlayIpam {
            subnet: s.subnet,
            node_prefix: s.node_prefix,
            subnet6: s.subnet6,
            node_prefix6: s.node_prefix6,
        }),
    )
}

impl Overlay {
    /// The tunnel ports of overlay `name` to remote VTEP `remote` from
    /// `local`: one per VNI, in the bridge of the overlay's name, each an
    /// access port of its VLAN (untagged-only for an untagged overlay).
    pub fn tunnels(
        &self,
        name: &str,
        remote: std::net::IpAddr,
        local: std::net::IpAddr,
    ) -> Vec<PortSpec> {
        let kind = |vni| {
            KindSpec::Vxlan(switchyard_api::VxlanSpec {
                remote,
                vni,
                local,
                dstport: self.dstport,
            })
        };
        let port = |vlan: Option<u16>, vni| PortSpec {
            bridge: Some(name.to_string()),
            vlan,
            ..PortSpec::new(Overlay::tunnel_name(name, remote, vlan), kind(vni))
        };
        match self.vni {
            Some(vni) => vec![port(None, vni)],
            None => self
                .vlans
                .iter()
                .map(|v| port(Some(v.vlan), v.vni))
                .collect(),
        }
    }

    /// Its VNIs, as the bridge list shows them: `vni 42`, `vlan 100 vni
    /// 5100, vlan 200 vni 5200`.
    pub fn describe(&self) -> String {
        match self.vni {
            Some(v) => format!("vni {v}"),
            None => self
                .vlans
                .iter()
                .map(|v| format!("vlan {} vni {}", v.vlan, v.vni))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// The name of overlay `name`'s tunnel to `remote` for `vlan`:
    /// `overlay1-10.0.2.2`, `overlay1-10.0.2.2-v100` (an IPv6 address's
    /// colons as dashes).
    pub fn tunnel_name(name: &str, remote: std::net::IpAddr, vlan: Option<u16>) -> String {
        let ip = remote.to_string().replace(':', "-");
        match vlan {
            Some(v) => format!("{name}-{ip}-v{v}"),
            None => format!("{name}-{ip}"),
        }
    }

    fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let at = format!("overlays.{name}");
        validate_name(&at, name)?;
        if name.len() > MAX_OVERLAY_NAME {
            return Err(invalid(
                at,
                format!("an overlay's name is at most {MAX_OVERLAY_NAME} characters (its tunnels are named after it)"),
            ));
        }
        match (self.vni, self.vlans.is_empty()) {
            (Some(_), false) => {
                return Err(invalid(
                    format!("{at}.vlans"),
                    "an overlay has one VNI (`vni`, untagged) or one per VLAN (`vlans`), not both",
                ))
            }
            (None, true) => {
                return Err(invalid(
                    format!("{at}.vni"),
                    "missing: the overlay's VNI (`vni`), or one per VLAN (`vlans`)",
                ))
            }
            _ => {}
        }
        if let Some(ipam) = &self.ipam {
            // The error names its field below `ipam`.
            ipam.validate()
                .map_err(|e| invalid(at.clone(), e.to_string()))?;
            // The node agent names each slice's Lease after the overlay
            // and labels it with the name: a DNS label, as both need.
            let dns_label = name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !name.starts_with('-')
                && !name.ends_with('-');
            if !dns_label {
                return Err(invalid(
                    format!("{at}.ipam"),
                    "an overlay that splits its addresses is named as a DNS label (lowercase letters, digits and '-', not at either end): its slices are claimed in the cluster under its name",
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (i, v) in self.vlans.iter().enumerate() {
            if !(1..=switchyard_api::vlan::VLAN_ID_MAX).contains(&v.vlan) {
                return Err(invalid(
                    format!("{at}.vlans[{i}].vlan"),
                    format!(
                        "{} is out of range 1..={}",
                        v.vlan,
                        switchyard_api::vlan::VLAN_ID_MAX
                    ),
                ));
            }
            if !seen.insert(v.vlan) || self.vlans.iter().filter(|o| o.vni == v.vni).count() > 1 {
                return Err(invalid(
                    format!("{at}.vlans[{i}]"),
                    format!("VLAN {} or VNI {} twice", v.vlan, v.vni),
                ));
            }
        }
        // Every tunnel it makes is a valid port (its VNI, UDP port and
        // addresses): checked on those to each remote and to an address
        // of the documentation's.
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        // Address `n` of the documentation's range of the family asked.
        let doc = |v4: bool, n: u8| -> IpAddr {
            if v4 {
                Ipv4Addr::new(192, 0, 2, n).into()
            } else {
                Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n.into()).into()
            }
        };
        let local_for = |r: IpAddr| self.local.unwrap_or(doc(r.is_ipv4(), 1));
        let probe = doc(self.local.is_none_or(|l| l.is_ipv4()), 2);
        let remotes = self
            .remotes
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("{at}.remotes[{i}]."), *r))
            .chain([(format!("{at}."), probe)]);
        for (field, r) in remotes {
            for t in self.tunnels(name, r, local_for(r)) {
                t.validate(&field)?;
            }
        }
        Ok(())
    }
}

/// A physical network's uplink: an interface name, or a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Physnet {
    /// `physnet1 = "eth1"`: an af-xdp uplink on `eth1` (af-packet if
    /// AF_XDP cannot be had there).
    Interface(String),
    /// `physnet1 = { interface = "eth1", kind = "af-packet", queues = 2 }`.
    Uplink {
        /// The interface.
        interface: String,
        /// `af-xdp` or `af-packet`; unset: af-xdp, falling back to
        /// af-packet where AF_XDP cannot be had.
        #[serde(default)]
        kind: Option<String>,
        /// Queues of the uplink.
        #[serde(default)]
        queues: Option<u16>,
    },
}

impl Physnet {
    /// The uplink port of physnet `name`: a trunk of every VLAN (and
    /// untagged frames) in the bridge of the physnet's name.
    pub fn uplink(&self, name: &str) -> PortSpec {
        let (interface, queues, kind) = self.parts();
        let kind = match kind {
            Some("af-packet") => {
                KindSpec::AfPacket(switchyard_api::AfPacketSpec { interface, queues })
            }
            _ => KindSpec::AfXdp(switchyard_api::AfXdpSpec {
                interface,
                queues,
                mode: None,
            }),
        };
        PortSpec {
            bridge: Some(name.to_string()),
            trunk: Some(switchyard_api::VlanSet::all()),
            ..PortSpec::new(format!("uplink-{name}"), kind)
        }
    }

    /// With no kind asked for, the uplink to use when the af-xdp one cannot
    /// be made (no libxdp, no AF_XDP in the kernel, no `CAP_BPF`): the same
    /// over af-packet.
    pub fn fallback(&self, name: &str) -> Option<PortSpec> {
        let (interface, queues, kind) = self.parts();
        kind.is_none().then(|| PortSpec {
            kind: KindSpec::AfPacket(switchyard_api::AfPacketSpec { interface, queues }),
            ..self.uplink(name)
        })
    }

    /// The interface the uplink attaches to.
    pub fn interface(&self) -> &str {
        match self {
            Physnet::Interface(i) | Physnet::Uplink { interface: i, .. } => i,
        }
    }

    fn parts(&self) -> (String, Option<u16>, Option<&str>) {
        match self {
            Physnet::Interface(i) => (i.clone(), None, None),
            Physnet::Uplink {
                interface,
                queues,
                kind,
            } => (interface.clone(), *queues, kind.as_deref()),
        }
    }

    fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let at = format!("physnets.{name}");
        validate_name(&at, name)?;
        if let Physnet::Uplink { kind: Some(k), .. } = self {
            if k != "af-packet" && k != "af-xdp" {
                return Err(invalid(
                    format!("{at}.kind"),
                    format!("{k:?}: a physnet uplink is af-xdp or af-packet"),
                ));
            }
        }
        self.uplink(name).validate(&format!("{at}."))?;
        Ok(())
    }
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
    /// Load balancing of receive queues across workers (as OVS's PMD auto
    /// load balance): when the busiest worker has stayed at
    /// `rebalance_load_percent` or more for this many seconds, queues are
    /// reassigned by their measured load if that lowers the spread of the
    /// workers' loads by `rebalance_improvement_percent`; at most once per
    /// interval. 0: queues stay where they were first put.
    #[serde(default = "default_rebalance_interval")]
    pub rebalance_interval_secs: u64,
    /// See `rebalance_interval_secs`.
    #[serde(default = "default_rebalance_load")]
    pub rebalance_load_percent: u8,
    /// See `rebalance_interval_secs`.
    #[serde(default = "default_rebalance_improvement")]
    pub rebalance_improvement_percent: u8,
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        DataplaneConfig {
            workers: default_workers(),
            cpus: Vec::new(),
            auto_pin: false,
            poll_mode: PollMode::default(),
            adaptive_idle_us: default_idle_us(),
            rebalance_interval_secs: default_rebalance_interval(),
            rebalance_load_percent: default_rebalance_load(),
            rebalance_improvement_percent: default_rebalance_improvement(),
        }
    }
}

/// `p` with its deepest existing ancestor resolved (links followed) and the
/// rest appended as given: two spellings of one place compare equal, even
/// where the place does not exist yet.
fn resolved(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = p;
    loop {
        if let Ok(mut real) = at.canonicalize() {
            real.extend(rest.iter().rev());
            return real;
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                at = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
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
    addr: &SocketAddr,
) -> Result<SocketAddr, ConfigError> {
    let SocketAddr::Path(given) = addr else {
        return Ok(addr.clone());
    };
    if given
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(invalid(
            field,
            format!("{:?}: '..' is not allowed", given.display()),
        ));
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
    if !path
        .parent()
        .is_some_and(|d| resolved(d).starts_with(&root))
    {
        return Err(outside());
    }
    crate::port::socket::endpoint::refuse_symlink(&path)
        .map_err(|_| invalid(field, format!("{} is a symbolic link", path.display())))?;
    Ok(SocketAddr::Path(path))
}

impl Config {
    /// Who owns `path` if it is one of the switch's own paths or its
    /// companions' (its control socket, its state directory, the CNI
    /// plugin's records in the socket directory), which no port may take.
    pub fn reserved_owner(&self, path: &Path) -> Option<String> {
        let p = resolved(path);
        if p == resolved(&self.control_socket) {
            return Some(format!(
                "the switch's control socket (control_socket {})",
                self.control_socket.display()
            ));
        }
        if p.starts_with(resolved(&self.state_dir)) {
            return Some(format!(
                "in the switch's state directory (state_dir {})",
                self.state_dir.display()
            ));
        }
        let records = self.socket_dir.join(switchyard_api::CNI_RECORDS_DIR);
        if p.starts_with(resolved(&records)) {
            return Some(format!(
                "in the CNI plugin's records ({})",
                records.display()
            ));
        }
        None
    }

    /// Refuses a port whose socket path (`socket`, a path resolved against
    /// `socket_dir`) is one [`Config::reserved_owner`] names; `field` names
    /// the field in the error.
    pub fn refuse_reserved(&self, field: &str, socket: &Path) -> Result<(), ConfigError> {
        match self.reserved_owner(&self.socket_dir.join(socket)) {
            Some(owner) => Err(invalid(
                field,
                format!("{} is {owner}: no port may take it", socket.display()),
            )),
            None => Ok(()),
        }
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let c: Config =
            serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
                let at = e.path().to_string();
                let line = e
                    .inner()
                    .span()
                    .map(|s| format!(" (line {})", text[..s.start].matches('\n').count() + 1))
                    .unwrap_or_default();
                let what = e.inner().message().trim_end().to_string();
                ConfigError::Parse(if at == "." {
                    format!("config: {what}{line}")
                } else {
                    format!("{at}: {what}{line}")
                })
            })?;
        c.validate()?;
        Ok(c)
    }

    /// The embedded default.
    pub fn embedded() -> Config {
        Config::parse(DEFAULT_CONFIG).expect("embedded default config is valid")
    }

    /// Reads a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Io {
            path: path.to_path_buf(),
            cause,
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
        for (field, v) in [
            ("dataplane.rebalance_load_percent", d.rebalance_load_percent),
            (
                "dataplane.rebalance_improvement_percent",
                d.rebalance_improvement_percent,
            ),
        ] {
            if !(1..=100).contains(&v) {
                return Err(invalid(field, format!("{v} is out of range 1..=100")));
            }
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
        for (name, p) in &self.physnets {
            p.validate(name)?;
            // Its bridge: declared or made for it.
            names.insert(name.as_str());
        }
        for (name, o) in &self.overlays {
            o.validate(name)?;
            if self.physnets.contains_key(name) {
                return Err(invalid(
                    format!("overlays.{name}"),
                    "a physnet of that name has the bridge",
                ));
            }
            names.insert(name.as_str());
        }
        let mut pnames = std::collections::HashSet::new();
        for name in self.physnets.keys() {
            pnames.insert(format!("uplink-{name}"));
        }
        for (i, p) in self.ports.iter().enumerate() {
            let at = format!("port[{i}].");
            p.validate(&at)?;
            if let Some(path) = p.kind.socket().and_then(|s| s.addr.path()) {
                self.refuse_reserved(&format!("{at}socket"), path)?;
            }
            if !pnames.insert(p.name.clone()) {
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
    fn a_port_of_the_config_may_not_take_the_switchs_own_paths() {
        let port = |socket: &str| {
            format!("[[port]]\nname='p'\nkind='vhost-user'\nrole='client'\nsocket='{socket}'\n")
        };
        for (socket, owner) in [
            (
                "/run/switchyard/control.sock",
                "the switch's control socket",
            ),
            ("control.sock", "the switch's control socket"),
            (
                "/run/switchyard/./control.sock",
                "the switch's control socket",
            ),
            ("/var/lib/switchyard/p.sock", "the switch's state directory"),
            (
                "/run/switchyard/.switchyard-cni/p.sock",
                "the CNI plugin's records",
            ),
        ] {
            let e = Config::parse(&port(socket)).unwrap_err().to_string();
            assert!(
                e.starts_with("port[0].socket: ") && e.contains(owner),
                "{socket}: {e}"
            );
        }
        // Elsewhere, or the control socket somewhere else: accepted.
        Config::parse(&port("/run/switchyard/p.sock")).unwrap();
        Config::parse(&format!(
            "control_socket = '/run/sy/ctl.sock'\n{}",
            port("/run/switchyard/control.sock")
        ))
        .unwrap();
    }

    #[test]
    fn a_ports_rate_limits_read_from_the_config_and_bad_ones_are_named() {
        let port = |limit: &str| {
            format!("[[port]]\nname='p'\nkind='tap'\ninterface='t0'\nrate_limit = {limit}\n")
        };
        let c = Config::parse(&port(
            "{ rx = { bits_per_sec = 100000000 }, tx = { packets_per_sec = 5000, burst_packets = 100 } }",
        ))
        .unwrap();
        let l = c.ports[0].rate_limit.expect("limits");
        assert_eq!(
            l.rx.and_then(|m| m.bits_bucket()),
            Some((100_000_000, 80_000_000))
        );
        assert_eq!(l.tx.and_then(|m| m.packets_bucket()), Some((5000, 100)));
        let e = Config::parse(&port("{ rx = { burst_bits = 8 } }"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("port[0].rate_limit.rx.burst_bits:"), "{e}");
        let e = Config::parse(&port("{ up = {} }")).unwrap_err().to_string();
        assert!(e.contains("unknown field `up`"), "{e}");
    }

    #[test]
    fn sockets_stay_inside_the_socket_dir() {
        let base = tempfile::tempdir().unwrap();
        let b = base.path();
        std::fs::create_dir(b.join("pod")).unwrap();
        let ok = |s: &str| {
            confine_socket("port.socket", b, &SocketAddr::parse(s)).map(|a| a.to_string())
        };
        let inside = |rel: &str| b.join(rel).to_str().unwrap().to_string();
        // Relative paths are taken from the socket dir; absolute ones inside
        // it are kept; directories that do not exist yet are fine.
        assert_eq!(ok("a.sock").unwrap(), inside("a.sock"));
        assert_eq!(ok("./pod/./v.sock").unwrap(), inside("pod/v.sock"));
        assert_eq!(ok(&inside("pod/m.sock")).unwrap(), inside("pod/m.sock"));
        assert_eq!(
            ok(&inside("new/dir/m.sock")).unwrap(),
            inside("new/dir/m.sock")
        );
        // memif abstract names have no path.
        assert_eq!(ok("@sw").unwrap(), "@sw");
        assert_eq!(ok("abstract:sw").unwrap(), "@sw");
        // Escapes: elsewhere, '..', a symlinked directory, a symlinked socket.
        let refused = |s: &str, why: &str| {
            let e = ok(s).unwrap_err().to_string();
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
        let e = confine_socket("port.socket", &b.join("none"), &SocketAddr::parse("a.sock"));
        assert!(e.unwrap_err().to_string().contains("(socket_dir)"));
    }

    #[test]
    fn overlays_make_tunnels_per_vni_and_name_their_fields() {
        let c = Config::parse(
            "[overlays]\nflat = { vni = 42, remotes = [\"10.0.2.2\"] }\n\
             trunk = { vlans = [{ vlan = 100, vni = 5100 }, { vlan = 200, vni = 5200 }], local = \"fd00::1\" }\n\
             [[port]]\nname='p'\nkind='memif'\nrole='master'\nsocket='/x'\nbridge='trunk'\nvlan=100\n",
        )
        .unwrap();
        let t = c.overlays["trunk"].tunnels(
            "trunk",
            "fd00::2".parse().unwrap(),
            "fd00::1".parse().unwrap(),
        );
        let names: Vec<_> = t.iter().map(|p| (p.name.as_str(), p.vlan)).collect();
        assert_eq!(
            names,
            [
                ("trunk-fd00--2-v100", Some(100)),
                ("trunk-fd00--2-v200", Some(200))
            ]
        );
        assert!(t.iter().all(|p| p.bridge.as_deref() == Some("trunk")));
        for (text, field) in [
            ("o = { vni = 16777216 }", "overlays.o.vni"),
            ("o = { }", "overlays.o.vni"),
            (
                "o = { vni = 1, vlans = [{ vlan = 5, vni = 2 }] }",
                "overlays.o.vlans",
            ),
            (
                "o = { vlans = [{ vlan = 4095, vni = 2 }] }",
                "overlays.o.vlans[0].vlan",
            ),
            (
                "o = { vlans = [{ vlan = 5, vni = 2 }, { vlan = 6, vni = 2 }] }",
                "overlays.o.vlans[0]",
            ),
            (
                "o = { vni = 1, remotes = [\"224.0.0.1\"] }",
                "overlays.o.remotes[0].remote",
            ),
            (
                "o = { vni = 1, local = \"10.0.0.1\", remotes = [\"fd00::1\"] }",
                "overlays.o.remotes[0].remote",
            ),
            ("o = { vni = 1, dstport = 0 }", "overlays.o.dstport"),
            (
                "this-name-is-too-long = { vni = 1 }",
                "overlays.this-name-is-too-long",
            ),
            (
                "Ov_1 = { vni = 1, ipam = { subnet = \"10.66.0.0/16\" } }",
                "overlays.Ov_1.ipam",
            ),
            (
                "o = { vni = 1, ipam = { subnet = \"10.66.0.0/16\", node_prefx = 24 } }",
                "overlays.o.ipam.node_prefx",
            ),
        ] {
            let e = Config::parse(&format!("[overlays]\n{text}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(&format!("{field}:")), "{text}: {e}");
        }
    }

    #[test]
    fn physnets_make_a_bridge_and_a_trunk_uplink() {
        let c = Config::parse(
            "[physnets]\nphysnet1 = \"eth1\"\nphysnet2 = { interface = \"bond0\", queues = 2 }\n\
             [[port]]\nname='p'\nkind='memif'\nrole='master'\nsocket='/x'\nbridge='physnet1'\nvlan=100\n",
        )
        .unwrap();
        let up = c.physnets["physnet2"].uplink("physnet2");
        assert_eq!(up.name, "uplink-physnet2");
        assert_eq!(up.bridge.as_deref(), Some("physnet2"));
        assert_eq!(up.trunk, Some(switchyard_api::VlanSet::all()));
        assert_eq!(up.kind.interface(), Some("bond0"));
        assert_eq!(up.kind.queues(), Some(2));
        let e = Config::parse("[physnets]\np = \"this-name-is-too-long\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("physnets.p.interface:"), "{e}");
        let e = Config::parse("[physnets]\np = { interface = \"eth1\", kind = \"tap\" }\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("physnets.p.kind:"), "{e}");
        // af-xdp unless told, with af-packet to fall back on; a kind asked
        // for has no fallback.
        let up = c.physnets["physnet1"].uplink("physnet1");
        assert_eq!(up.kind.options().kind_name(), "af-xdp");
        let fb = c.physnets["physnet1"].fallback("physnet1").unwrap();
        assert_eq!(fb.kind.options().kind_name(), "af-packet");
        assert_eq!((fb.name.as_str(), fb.trunk), ("uplink-physnet1", up.trunk));
        let c = Config::parse("[physnets]\np = { interface = \"eth1\", kind = \"af-packet\" }\n")
            .unwrap();
        assert_eq!(
            c.physnets["p"].uplink("p").kind.options().kind_name(),
            "af-packet"
        );
        assert!(c.physnets["p"].fallback("p").is_none());
        let e = Config::parse(
            "[physnets]\np = \"eth1\"\n[[port]]\nname='uplink-p'\nkind='memif'\nrole='master'\nsocket='/x'\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("duplicate port"), "{e}");
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
        assert!(e.starts_with("port[0]: role: \"boss\""), "{e}");
        assert!(e.ends_with("(line 1)"), "{e}");
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
        assert!(e.starts_with("port[0]: unknown field `ring_size`"), "{e}");
        let e =
            Config::parse("[[port]]\nname='v'\nkind='vhost-user'\nrole='master'\nsocket='/x'\n")
                .unwrap_err()
                .to_string();
        assert!(e.starts_with("port[0]: role: \"master\""), "{e}");
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
