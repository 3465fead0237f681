//! Port and bridge specs: what a user asks for, typed once at the edge
//! (config file, API request, CLI, CNI plugin) and kept typed everywhere
//! after, in the state file and in the daemon alike.
//!
//! A [`PortSpec`] holds what every port has (name, bridge, VLANs, port
//! security) and a [`KindSpec`]: one variant per port kind, each in its own
//! module with its own typed role, socket and options. In JSON and TOML a
//! spec is one flat object whose `kind` field picks the variant:
//!
//! ```json
//! {"name": "pod1", "kind": "memif", "role": "master", "socket": "/run/switchyard/pod1.sock", "bridge": "br0"}
//! ```
//!
//! Roles are the **switch's** own: memif `master` means the switch creates
//! the socket; vhost-user `server` means the switch creates the socket.
//!
//! Adding a port kind is a module here (its spec, implementing
//! [`KindOptions`], and for a socket kind [`socket::SocketKindSpec`]) and
//! its line in the `kinds!` list below (a socket kind also its line in
//! [`socket::SocketKind`]'s), plus the kind's port in the daemon.

pub mod rate;
pub mod socket;

use serde::{Deserialize, Serialize};

pub use af_packet::AfPacketSpec;
pub use af_xdp::{AfXdpSpec, XdpMode};
pub use memif::{MemifMode, MemifRole, MemifSpec};
pub use rate::{Meter, RateLimits};
pub use socket::{ShareRefused, Side, SocketAddr, SocketKind, SocketRole, SocketSpec};
pub use tap::TapSpec;
pub use vhost_user::{VhostUserRole, VhostUserSpec};
pub use vxlan::VxlanSpec;

use crate::mac::MacAddr;
use crate::policy::PortPolicy;
use crate::vlan::{VlanSet, VLAN_ID_MAX};

/// Most MAC table entries a port may hold unless told (`mac_limit`).
pub const DEFAULT_MAC_LIMIT: u32 = 64;
/// The flood limit of a pod's port (one the CNI plugin made: with `pod`)
/// whose spec sets none (netconf `floodLimit`): a pod that looks for its
/// peers floods a few frames a second; one that sweeps a range, or sprays
/// unknown destinations, is held to this.
pub const DEFAULT_POD_FLOOD_LIMIT: u32 = 1000;
/// Most MACs a port may be pinned to.
pub const MAX_PINNED_MACS: usize = 64;
/// Most queue pairs a port may have.
pub const MAX_QUEUES: u16 = 255;
/// Longest Unix socket path (`sun_path` less its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// A spec problem, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// Dotted field path, e.g. `port[2].ring_size`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl SpecError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> SpecError {
        SpecError {
            field: field.into(),
            message: message.into(),
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

/// A port as the user describes it (config `[[port]]`, `port add`, the API,
/// the state file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSpec {
    /// Port name.
    pub name: String,
    /// The kind, its role, socket and options (`kind` picks the variant;
    /// a field the kind does not have is refused).
    #[serde(flatten)]
    pub kind: KindSpec,
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
    /// Most MAC table entries the port may hold at once (default
    /// [`DEFAULT_MAC_LIMIT`], none for uplinks; 0: no limit). Frames from
    /// further new source addresses are dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_limit: Option<u32>,
    /// Most frames a second the port may have flooded (broadcast,
    /// multicast and unknown unicast its bridge sends to every port);
    /// further ones are dropped (`flood_limit`) until the next second,
    /// counted by each worker apart. Absent: [`DEFAULT_POD_FLOOD_LIMIT`]
    /// for a pod's port (one with `pod`, as the CNI plugin makes it), no
    /// limit for others; 0: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flood_limit: Option<u32>,
    /// Policers per direction ([`RateLimits`]: `rx` what the port sends
    /// into the switch, `tx` what the switch sends it): frames beyond them
    /// are dropped (`policed_rx`, `policed_tx`). Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimits>,
    /// The only source MACs the port may send from, pinned to it: they
    /// never age and no other port can take them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macs: Option<Vec<MacAddr>>,
    /// Pin the first source MAC the port sends from (ignored with `macs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_first: Option<bool>,
    /// The IP addresses the port's station was given (the CNI's IPAM
    /// result): IPv4, IPv6 and ARP from any other source address are
    /// dropped (`spoofed_ip`; IPv6 link-local and unspecified sources
    /// pass, for neighbour discovery). Absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<std::net::IpAddr>>,
    /// L3/L4 policy: what the station may send and receive
    /// ([`PortPolicy`]). Absent: everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PortPolicy>,
    /// The pod attachment the port serves, as the CNI plugin made it: what
    /// the node agent finds the port's pod and network by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodAttachment>,
}

/// A pod's attachment to a network, as the CNI plugin knows it
/// (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID` in `CNI_ARGS`,
/// `CNI_IFNAME`, the netconf's `name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodAttachment {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID, where the runtime passed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The interface in the pod (`net1`): its entry in the pod's
    /// network-status.
    pub interface: String,
    /// The network's name in the netconf.
    pub network: String,
}

/// Declares the port kinds, one line each: `Variant(module::Spec)`. Makes
/// each kind's module (`spec/<module>.rs`), the [`KindSpec`] enum (one
/// variant per kind, `kind` in JSON and TOML its kebab-case name) and its
/// dispatch to the kind's [`KindOptions`]: the one list of the kinds in the
/// API.
macro_rules! kinds {
    ($($(#[$attr:meta])* $variant:ident($module:ident::$spec:ident),)*) => {
        $(pub mod $module;)*

        /// The kind-specific part of a port spec: one variant per port
        /// kind, each its module's spec.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(tag = "kind", rename_all = "kebab-case")]
        pub enum KindSpec {
            $(
                #[doc = concat!("A ", stringify!($module), " port ([`", stringify!($module), "::", stringify!($spec), "`]).")]
                $(#[$attr])*
                $variant($module::$spec),
            )*
        }

        impl KindSpec {
            /// The kind's own spec, behind the interface every kind
            /// implements.
            pub fn options(&self) -> &dyn KindOptions {
                match self {
                    $(KindSpec::$variant(k) => k,)*
                }
            }

            /// As [`KindSpec::options`], to change it.
            pub fn options_mut(&mut self) -> &mut dyn KindOptions {
                match self {
                    $(KindSpec::$variant(k) => k,)*
                }
            }
        }
    };
}

kinds! {
    Memif(memif::MemifSpec),
    #[serde(alias = "vhostuser")]
    VhostUser(vhost_user::VhostUserSpec),
    Tap(tap::TapSpec),
    AfPacket(af_packet::AfPacketSpec),
    AfXdp(af_xdp::AfXdpSpec),
    Vxlan(vxlan::VxlanSpec),
}

impl KindSpec {
    /// The kind's name as specs spell it (`memif`, `vhost-user`).
    pub fn name(&self) -> &'static str {
        self.options().kind_name()
    }

    /// The socket the port listens on or connects to, with the switch's
    /// role there (none for a kind without one, such as an uplink).
    pub fn socket(&self) -> Option<SocketSpec<'_>> {
        self.options().socket()
    }

    /// The socket's address, to change it (the daemon resolves it below
    /// its socket dir). Every kind says, in its own module
    /// ([`KindOptions::socket_addr_mut`]): a new socket kind must say where
    /// its socket is, or it would escape that check.
    pub fn socket_mut(&mut self) -> Option<&mut SocketAddr> {
        self.options_mut().socket_addr_mut()
    }

    /// The switch's role at the socket, for a socket kind.
    pub fn role(&self) -> Option<SocketRole> {
        self.socket().map(|s| s.role)
    }

    /// The role's name ("" for a kind without one), for display.
    pub fn role_name(&self) -> &'static str {
        self.role().map_or("", SocketRole::as_str)
    }

    /// The pod's role at the socket: the switch's peer.
    pub fn pod_role(&self) -> Option<SocketRole> {
        self.role().map(SocketRole::peer)
    }

    /// Checks the kind's values: the socket's, then the kind's own.
    pub fn validate(&self, at: &str) -> Result<(), SpecError> {
        if let Some(s) = self.socket() {
            s.validate(at)?;
        }
        self.options().validate(at)
    }

    /// Queue pairs asked for, if any.
    pub fn queues(&self) -> Option<u16> {
        self.options().queues()
    }

    /// The kernel interface, for kinds attached to one.
    pub fn interface(&self) -> Option<&str> {
        self.options().interface()
    }
}

/// What every kind's spec tells the rest of the switch. A new kind
/// implements it in its own module and adds its line to `kinds!`.
pub trait KindOptions {
    /// The kind's name, as the `kind` field spells it.
    fn kind_name(&self) -> &'static str;
    /// The socket and the switch's role there, for socket kinds.
    fn socket(&self) -> Option<SocketSpec<'_>> {
        None
    }
    /// The socket's address, to change it (`None` for a kind without
    /// one). No default: every kind says.
    fn socket_addr_mut(&mut self) -> Option<&mut SocketAddr>;
    /// Queue pairs asked for, if any.
    fn queues(&self) -> Option<u16>;
    /// The kernel interface, for kinds attached to one.
    fn interface(&self) -> Option<&str> {
        None
    }
    /// The remote end's address, for a tunnel kind.
    fn remote(&self) -> Option<std::net::IpAddr> {
        None
    }
    /// The local address a tunnel kind's packets leave from.
    fn local(&self) -> Option<std::net::IpAddr> {
        None
    }
    /// The MAC learning limit when the spec sets none: [`DEFAULT_MAC_LIMIT`]
    /// for a port to one station (a pod, a VM); uplinks, behind which a
    /// whole network lies, have none.
    fn default_mac_limit(&self) -> u32 {
        DEFAULT_MAC_LIMIT
    }
    /// Checks the values the types leave open (besides the socket, which
    /// [`KindSpec::validate`] checks for every socket kind); `at` prefixes
    /// field names.
    fn validate(&self, at: &str) -> Result<(), SpecError>;
}

/// Checks a name used for ports and bridges.
pub fn validate_name(field: &str, name: &str) -> Result<(), SpecError> {
    if name.is_empty() || name.len() > 64 {
        return Err(SpecError::new(field, "must be 1 to 64 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || name.starts_with('.')
    {
        return Err(SpecError::new(
            field,
            format!("{name:?} may only hold letters, digits, '-', '_' and '.'"),
        ));
    }
    Ok(())
}

/// Checks the queue pairs asked for (1 when unset): 1 to [`MAX_QUEUES`].
pub(crate) fn validate_queues(at: &str, queues: Option<u16>) -> Result<(), SpecError> {
    let q = queues.unwrap_or(1);
    if q == 0 || q > MAX_QUEUES {
        return Err(SpecError::new(
            format!("{at}queues"),
            format!("{q} is out of range 1..={MAX_QUEUES}"),
        ));
    }
    Ok(())
}

impl PortSpec {
    /// Validates the values the types leave open; `at` prefixes field names
    /// in errors (e.g. `port[1].`).
    pub fn validate(&self, at: &str) -> Result<(), SpecError> {
        let f = |n: &str| format!("{at}{n}");
        validate_name(&f("name"), &self.name)?;
        self.validate_security(at)?;
        if let Some(v) = self.vlan {
            if v == 0 || v > VLAN_ID_MAX {
                return Err(SpecError::new(
                    f("vlan"),
                    format!("{v} is not a VLAN id (1..={VLAN_ID_MAX})"),
                ));
            }
        }
        if self.vlan.is_some() && self.trunk.is_some() {
            return Err(SpecError::new(
                f("trunk"),
                "a port is an access port (vlan) or a trunk, not both",
            ));
        }
        if let Some(b) = &self.bridge {
            validate_name(&f("bridge"), b)?;
        }
        if let Some(ips) = &self.ips {
            crate::policy::validate_ips(ips, &f("ips"))?;
        }
        if let Some(p) = &self.policy {
            p.validate(&f("policy"))?;
        }
        if let Some(r) = &self.rate_limit {
            r.validate(&f("rate_limit."))?;
        }
        if let Some(a) = &self.pod {
            for (field, v) in [
                ("namespace", &a.namespace),
                ("name", &a.name),
                ("interface", &a.interface),
                ("network", &a.network),
            ] {
                if v.is_empty() || v.len() > 253 || v.chars().any(char::is_control) {
                    return Err(SpecError::new(
                        f(&format!("pod.{field}")),
                        "1 to 253 bytes, no control characters",
                    ));
                }
            }
        }
        self.kind.validate(at)
    }

    fn validate_security(&self, at: &str) -> Result<(), SpecError> {
        let Some(macs) = &self.macs else {
            return Ok(());
        };
        if macs.len() > MAX_PINNED_MACS {
            return Err(SpecError::new(
                format!("{at}macs"),
                format!("{} addresses; at most {MAX_PINNED_MACS}", macs.len()),
            ));
        }
        for (i, m) in macs.iter().enumerate() {
            if m.is_multicast() || m.to_u64() == 0 {
                return Err(SpecError::new(
                    format!("{at}macs[{i}]"),
                    format!("{m} is not a station address (unicast, not zero)"),
                ));
            }
            if macs[..i].contains(m) {
                return Err(SpecError::new(
                    format!("{at}macs[{i}]"),
                    format!("{m} is listed twice"),
                ));
            }
        }
        Ok(())
    }

    /// A spec of `kind` with nothing else set.
    pub fn new(name: impl Into<String>, kind: KindSpec) -> PortSpec {
        PortSpec {
            name: name.into(),
            kind,
            bridge: None,
            vlan: None,
            trunk: None,
            mac_limit: None,
            flood_limit: None,
            rate_limit: None,
            macs: None,
            pin_first: None,
            ips: None,
            policy: None,
            pod: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<PortSpec, String> {
        let p: PortSpec = serde_json::from_str(json).map_err(|e| e.to_string())?;
        p.validate("port.").map_err(|e| e.to_string())?;
        Ok(p)
    }

    #[test]
    fn specs_are_typed_and_keep_their_json_form() {
        let text = r#"{"name":"a","kind":"memif","role":"master","socket":"/s","id":3,"bridge":"b","trunk":"10,20-30","mac_limit":8,"macs":["02:00:00:00:00:01"]}"#;
        let p = parse(text).unwrap();
        let KindSpec::Memif(m) = &p.kind else {
            panic!("{p:?}")
        };
        assert_eq!(m.role, MemifRole::Master);
        assert_eq!(m.id, Some(3));
        assert_eq!(serde_json::to_string(&p).unwrap(), text);
        let v =
            parse(r#"{"name":"v","kind":"vhost-user","role":"client","socket":"/v","queues":2}"#)
                .unwrap();
        assert_eq!(v.kind.role_name(), "client");
        assert_eq!(v.kind.pod_role().unwrap().as_str(), "server");
        assert_eq!(v.kind.queues(), Some(2));
        assert!(!v.kind.socket().unwrap().switch_creates());
        // DPDK's memif names are the same roles.
        let s = parse(r#"{"name":"a","kind":"memif","role":"server","socket":"/s"}"#).unwrap();
        assert_eq!(s.kind.role_name(), "master");
    }

    #[test]
    fn errors_name_the_field() {
        let e = |json: &str| parse(json).unwrap_err();
        let r = e(r#"{"name":"a","kind":"memif","role":"boss","socket":"/s"}"#);
        assert!(r.starts_with("role: \"boss\""), "{r}");
        let r = e(r#"{"name":"a","kind":"vhost-user","role":"master","socket":"/s"}"#);
        assert!(
            r.starts_with("role: \"master\"") && r.contains("server"),
            "{r}"
        );
        let r =
            e(r#"{"name":"a","kind":"vhost-user","role":"server","socket":"/s","ring_size":4}"#);
        assert!(r.contains("unknown field `ring_size`"), "{r}");
        let r = e(r#"{"name":"a","kind":"carrier-pigeon","socket":"/s"}"#);
        assert!(r.contains("unknown variant `carrier-pigeon`"), "{r}");
        let r = e(r#"{"name":"a","kind":"memif","role":"master","socket":"/s","vlan":4095}"#);
        assert!(r.starts_with("port.vlan:"), "{r}");
        let r =
            e(r#"{"name":"a","kind":"memif","role":"master","socket":"/s","vlan":5,"trunk":"6"}"#);
        assert!(r.starts_with("port.trunk:"), "{r}");
        let r = e(r#"{"name":"a","kind":"memif","role":"master","socket":"/s","ring_size":1000}"#);
        assert!(r.starts_with("port.ring_size:"), "{r}");
        let r = e(r#"{"name":"a","kind":"memif","role":"slave","socket":"/s","socket_group":1}"#);
        assert!(r.starts_with("port.socket_group:"), "{r}");
        let r = e(r#"{"name":"a","kind":"memif","role":"master","socket":"@a","socket_group":1}"#);
        assert!(r.starts_with("port.socket_group:"), "{r}");
        let r =
            e(r#"{"name":"a","kind":"vhost-user","role":"client","socket":"/s","socket_group":1}"#);
        assert!(r.starts_with("port.socket_group:"), "{r}");
        let r = e(r#"{"name":"a","kind":"vhost-user","role":"client","socket":"@s"}"#);
        assert!(r.starts_with("port.socket:"), "{r}");
        let r = e(r#"{"name":"a","kind":"memif","role":"master","socket":"/s","queues":0}"#);
        assert!(r.starts_with("port.queues:"), "{r}");
        let r = e(
            r#"{"name":"a","kind":"memif","role":"master","socket":"/s","macs":["01:00:5e:00:00:01"]}"#,
        );
        assert!(r.starts_with("port.macs[0]:"), "{r}");
        assert!(validate_name("name", "../x").is_err());
        assert!(validate_name("name", "eth0.100").is_ok());
        let r = e(r#"{"name":"t","kind":"tap","interface":"a/b"}"#);
        assert!(r.starts_with("port.interface:"), "{r}");
        let r = e(r#"{"name":"t","kind":"tap","interface":"sixteen-chars-xx"}"#);
        assert!(r.starts_with("port.interface:"), "{r}");
        let r = e(r#"{"name":"t","kind":"tap","interface":"t0","socket":"/s"}"#);
        assert!(r.contains("unknown field `socket`"), "{r}");
        let t = parse(r#"{"name":"t","kind":"tap","interface":"t0","queues":2}"#).unwrap();
        assert_eq!((t.kind.interface(), t.kind.socket()), (Some("t0"), None));
        // An abstract name is typed as one, and written back as `@name`.
        let a =
            parse(r#"{"name":"a","kind":"memif","role":"master","socket":"abstract:x"}"#).unwrap();
        assert_eq!(
            a.kind.socket().unwrap().addr,
            &SocketAddr::Abstract("x".into())
        );
        assert!(serde_json::to_string(&a)
            .unwrap()
            .contains(r#""socket":"@x""#));
    }
}
