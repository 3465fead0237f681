//! What the socket port kinds (memif, vhost-user) share: where the socket
//! is ([`SocketAddr`]), which end of it a side is ([`SocketRole`], typed by
//! the kind, with the [`Side`] it implies) and who may open it: together a
//! [`SocketSpec`].
//!
//! A role is whoever holds it: the switch's role in a port spec, the pod's
//! in device-info and the CNI netconf; [`SocketRole::peer`] turns one into
//! the other, so the mapping is written once.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{KindOptions, KindSpec, SpecError, MAX_SOCKET_PATH};

/// Declares a socket kind's two roles: an enum whose variants are named as
/// the kind names them (with the other names it also takes), each on its
/// [`Side`], read and written by serde as those names (an error names the
/// `role` field: a flattened spec's errors would not), and turned into a
/// [`SocketRole`] of the kind. Both socket kinds declare theirs with it, so
/// what a role is is written once.
macro_rules! socket_roles {
    (
        $(#[$doc:meta])* $ty:ident of $kind:ident:
        $(#[$ldoc:meta])* $listen:ident = $lname:literal $(| $lalias:literal)*,
        $(#[$cdoc:meta])* $connect:ident = $cname:literal $(| $calias:literal)*;
        error: $err:literal
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "&'static str")]
        pub enum $ty {
            $(#[$ldoc])*
            $listen,
            $(#[$cdoc])*
            $connect,
        }

        impl $ty {
            /// The role's name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $ty::$listen => $lname,
                    $ty::$connect => $cname,
                }
            }

            /// Which end of the socket the role's holder is.
            pub fn side(self) -> $crate::spec::Side {
                match self {
                    $ty::$listen => $crate::spec::Side::Listen,
                    $ty::$connect => $crate::spec::Side::Connect,
                }
            }
        }

        impl From<$crate::spec::Side> for $ty {
            fn from(side: $crate::spec::Side) -> $ty {
                match side {
                    $crate::spec::Side::Listen => $ty::$listen,
                    $crate::spec::Side::Connect => $ty::$connect,
                }
            }
        }

        impl From<$ty> for $crate::spec::SocketRole {
            fn from(r: $ty) -> $crate::spec::SocketRole {
                $crate::spec::SocketKind::$kind.role(r.side())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<$ty, String> {
                match s {
                    $lname $(| $lalias)* => Ok($ty::$listen),
                    $cname $(| $calias)* => Ok($ty::$connect),
                    r => Err(format!("{r:?}: {}", $err)),
                }
            }
        }

        impl TryFrom<String> for $ty {
            type Error = String;
            fn try_from(s: String) -> Result<$ty, String> {
                s.parse().map_err(|e| format!("role: {e}"))
            }
        }

        impl From<$ty> for &'static str {
            fn from(r: $ty) -> &'static str {
                r.as_str()
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl $crate::spec::socket::KindRole for $ty {
            fn name(self) -> &'static str {
                self.as_str()
            }
            fn side(self) -> $crate::spec::Side {
                $ty::side(self)
            }
        }
    };
}

pub(crate) use socket_roles;

/// Where a socket lives: parsed from its spec string once, where it enters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum SocketAddr {
    /// A filesystem path.
    Path(PathBuf),
    /// A name in the abstract namespace (memif only): `@name` as libmemif
    /// writes it, `abstract:name` as VPP does.
    Abstract(String),
}

impl SocketAddr {
    /// Parses a socket string as specs write it.
    pub fn parse(s: &str) -> SocketAddr {
        match s.strip_prefix('@').or_else(|| s.strip_prefix("abstract:")) {
            Some(name) => SocketAddr::Abstract(name.to_string()),
            None => SocketAddr::Path(PathBuf::from(s)),
        }
    }

    /// The path, for a filesystem socket.
    pub fn path(&self) -> Option<&Path> {
        match self {
            SocketAddr::Path(p) => Some(p),
            SocketAddr::Abstract(_) => None,
        }
    }

    /// Checks what the kernel will take: `at` prefixes the field name.
    pub fn validate(&self, at: &str) -> Result<(), SpecError> {
        let field = || format!("{at}socket");
        let (name, len) = match self {
            SocketAddr::Path(p) => (p.as_os_str().as_bytes(), p.as_os_str().len()),
            // sun_path holds a NUL, then the name.
            SocketAddr::Abstract(n) => (n.as_bytes(), n.len() + 1),
        };
        if name.is_empty() {
            return Err(SpecError::new(field(), "must not be empty"));
        }
        if len > MAX_SOCKET_PATH {
            return Err(SpecError::new(
                field(),
                format!("longer than a Unix socket path allows ({MAX_SOCKET_PATH} bytes)"),
            ));
        }
        if name.contains(&0) {
            return Err(SpecError::new(field(), "must not hold a NUL byte"));
        }
        Ok(())
    }
}

impl std::fmt::Display for SocketAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SocketAddr::Path(p) => write!(f, "{}", p.display()),
            SocketAddr::Abstract(n) => write!(f, "@{n}"),
        }
    }
}

impl From<String> for SocketAddr {
    fn from(s: String) -> SocketAddr {
        SocketAddr::parse(&s)
    }
}

impl From<SocketAddr> for String {
    fn from(a: SocketAddr) -> String {
        a.to_string()
    }
}

/// Which end of a socket a side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// It creates the socket and accepts (memif master, vhost-user server).
    Listen,
    /// It connects, and retries until the socket is there.
    Connect,
}

/// A socket kind's role, as its module declares them (`socket_roles!`).
pub trait KindRole: Copy + From<Side> + std::str::FromStr<Err = String> {
    /// The role's name.
    fn name(self) -> &'static str;
    /// Which end of the socket the role's holder is.
    fn side(self) -> Side;
}

/// What the pod says of its socket kind in its CNI netconf (the kind's
/// section, the pod's point of view), as far as the CNI itself needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSection {
    /// The pod's role as written, if given.
    pub role: Option<String>,
    /// A socket the pod's networks of the kind share, by name (memif's
    /// `socket`: each network that names it is one interface of it).
    pub shared_socket: Option<String>,
    /// Keys of the section the kind does not read (`memif.ringsize`).
    pub ignored: Vec<String>,
}

/// What a socket kind is, besides its spec: implemented by the spec in
/// the kind's own module (its roles, its names, its device-info section,
/// its CNI netconf section), listed once in `socket_kinds!`.
pub trait SocketKindSpec: KindOptions + Sized {
    /// The kind's roles.
    type Role: KindRole;
    /// The kind's name: device-info's `type`, the CNI's `interfaceType`,
    /// the device plugin's `interface_type`, the spec's `kind`.
    const NAME: &'static str;
    /// The key of the kind's section in the CNI netconf (`memif`,
    /// `vhostUser`).
    const NETCONF_KEY: &'static str;
    /// The field of that section naming the pod's role (`role`, `mode`),
    /// and what its values are, for errors.
    const NETCONF_ROLE: (&'static str, &'static str);

    /// The spec of a port whose switch is in `role` at `addr`, with the
    /// kind's defaults.
    fn with_socket(role: Self::Role, addr: SocketAddr) -> Self;
    /// The spec as a port's [`KindSpec`].
    fn into_kind(self) -> KindSpec;
    /// The kind's section of the NPWG device-info document for a pod in
    /// `role` whose socket is `path`.
    fn device_info(role: Self::Role, path: &str) -> serde_json::Value;
    /// The pod's role a device-info section of the kind names.
    fn device_info_role(section: &serde_json::Value) -> Option<Self::Role>;
    /// Reads the kind's section of a CNI netconf (`Null` when absent).
    /// Errors name the field (`memif.mode`).
    fn pod_section(section: &serde_json::Value) -> Result<PodSection, SpecError>;
    /// Takes into the switch's spec the options of the pod's netconf
    /// section both ends share (queues, sizes, a secret, an id), and the
    /// group of a socket the switch creates.
    fn take_pod_section(&mut self, section: &serde_json::Value, socket_group: Option<u32>);
}

/// The keys of a netconf `section` (the one at `key`) that options type
/// `T` does not read, as `<key>.<name>` (for [`PodSection::ignored`]).
/// `T`'s keys are those it writes: every field, as its default.
pub fn unknown_keys<T: Serialize + Default>(key: &str, section: &serde_json::Value) -> Vec<String> {
    let known = serde_json::to_value(T::default()).unwrap_or_default();
    let Some(known) = known.as_object() else {
        return Vec::new();
    };
    section
        .as_object()
        .map(|o| {
            o.keys()
                .filter(|k| !known.contains_key(*k))
                .map(|k| format!("{key}.{k}"))
                .collect()
        })
        .unwrap_or_default()
}

/// Declares the socket kinds, one line each: `Variant(module::Spec)`, the
/// variant being the kind's [`KindSpec`] variant too. Makes [`SocketKind`]
/// and its dispatch to each kind's [`SocketKindSpec`]: the one list of the
/// socket kinds.
macro_rules! socket_kinds {
    ($($variant:ident($module:ident::$spec:ident),)*) => {
        /// The socket port kinds, as device-info's `type`, the CNI's
        /// `interfaceType` and the device plugin's `interface_type` name
        /// them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "&'static str")]
        pub enum SocketKind {
            $(
                #[doc = concat!("[`super::", stringify!($module), "::", stringify!($spec), "`].")]
                $variant,
            )*
        }

        impl SocketKind {
            /// Every socket kind.
            pub const ALL: &'static [SocketKind] = &[$(SocketKind::$variant),*];

            /// The kind's name (`memif`, `vhost-user`).
            pub fn name(self) -> &'static str {
                match self {
                    $(SocketKind::$variant => <super::$module::$spec as SocketKindSpec>::NAME,)*
                }
            }

            /// The names of the role that listens and of the one that
            /// connects.
            pub fn role_names(self) -> [&'static str; 2] {
                match self {
                    $(SocketKind::$variant => {
                        type R = <super::$module::$spec as SocketKindSpec>::Role;
                        [R::from(Side::Listen).name(), R::from(Side::Connect).name()]
                    })*
                }
            }

            /// Parses a role of this kind by name (memif: `master`/`slave`,
            /// or DPDK's `server`/`client`; vhost-user: `server`/`client`).
            /// The error says which names the kind takes.
            pub fn parse_role(self, s: &str) -> Result<SocketRole, String> {
                let side = match self {
                    $(SocketKind::$variant => s.parse::<<super::$module::$spec as SocketKindSpec>::Role>()?.side(),)*
                };
                Ok(self.role(side))
            }

            /// The spec of a port whose switch is on `side` of a socket at
            /// `addr`, with the kind's defaults.
            pub fn spec(self, side: Side, addr: SocketAddr) -> KindSpec {
                match self {
                    $(SocketKind::$variant => super::$module::$spec::with_socket(side.into(), addr).into_kind(),)*
                }
            }

            /// The kind's section of a device-info document for a pod on
            /// `side` whose socket is `path`.
            pub fn device_info(self, side: Side, path: &str) -> serde_json::Value {
                match self {
                    $(SocketKind::$variant => super::$module::$spec::device_info(side.into(), path),)*
                }
            }

            /// The pod's side a device-info section of the kind names.
            pub fn device_info_side(self, section: &serde_json::Value) -> Option<Side> {
                match self {
                    $(SocketKind::$variant => super::$module::$spec::device_info_role(section).map(KindRole::side),)*
                }
            }

            /// The key of the kind's section in the CNI netconf.
            pub fn netconf_key(self) -> &'static str {
                match self {
                    $(SocketKind::$variant => <super::$module::$spec as SocketKindSpec>::NETCONF_KEY,)*
                }
            }

            /// The field of that section naming the pod's role, and what
            /// its values are.
            pub fn netconf_role(self) -> (&'static str, &'static str) {
                match self {
                    $(SocketKind::$variant => <super::$module::$spec as SocketKindSpec>::NETCONF_ROLE,)*
                }
            }

            /// Reads the kind's section of a CNI netconf (`Null`: absent).
            pub fn pod_section(self, section: &serde_json::Value) -> Result<PodSection, SpecError> {
                match self {
                    $(SocketKind::$variant => super::$module::$spec::pod_section(section),)*
                }
            }

            /// Takes the pod's netconf section into `spec`, a spec of this
            /// kind (another kind's is left as it is).
            pub fn take_pod_section(
                self,
                spec: &mut KindSpec,
                section: &serde_json::Value,
                socket_group: Option<u32>,
            ) {
                match (self, spec) {
                    $((SocketKind::$variant, KindSpec::$variant(s)) => s.take_pod_section(section, socket_group),)*
                    _ => {}
                }
            }
        }
    };
}

socket_kinds! {
    Memif(memif::MemifSpec),
    VhostUser(vhost_user::VhostUserSpec),
}

impl SocketKind {
    /// The kind named `s`, if it is a socket kind.
    pub fn from_name(s: &str) -> Option<SocketKind> {
        SocketKind::ALL.iter().copied().find(|k| k.name() == s)
    }

    /// The role of this kind whose holder is on `side`.
    pub fn role(self, side: Side) -> SocketRole {
        SocketRole { kind: self, side }
    }

    /// The pod's role when a netconf or a device plugin pool names none:
    /// the pod connects, the switch creates the socket.
    pub fn default_pod_role(self) -> SocketRole {
        self.role(Side::Connect)
    }
}

impl TryFrom<String> for SocketKind {
    type Error = String;
    fn try_from(s: String) -> Result<SocketKind, String> {
        SocketKind::from_name(&s).ok_or_else(|| {
            let names: Vec<String> = SocketKind::ALL
                .iter()
                .map(|k| format!("`{}`", k.name()))
                .collect();
            format!("unknown variant `{s}`, expected {}", names.join(" or "))
        })
    }
}

impl From<SocketKind> for &'static str {
    fn from(k: SocketKind) -> &'static str {
        k.name()
    }
}

/// A role at a socket port: the switch's in a port spec, the pod's in
/// device-info and the netconf. Each kind names its two roles
/// ([`SocketKind::role_names`]); which end of the socket the holder is,
/// the [`Side`], is what they mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketRole {
    kind: SocketKind,
    side: Side,
}

impl SocketRole {
    /// The kind the role belongs to.
    pub fn kind(self) -> SocketKind {
        self.kind
    }

    /// Which end of the socket the role's holder is.
    pub fn side(self) -> Side {
        self.side
    }

    /// The other end's role: the pod's from the switch's, and back.
    pub fn peer(self) -> SocketRole {
        let side = match self.side {
            Side::Listen => Side::Connect,
            Side::Connect => Side::Listen,
        };
        self.kind.role(side)
    }

    /// The spec of a port whose switch holds this role at `addr`, with
    /// the kind's defaults.
    pub fn spec(self, addr: SocketAddr) -> KindSpec {
        self.kind.spec(self.side, addr)
    }

    /// The role's name as its kind spells it.
    pub fn as_str(self) -> &'static str {
        let [listen, connect] = self.kind.role_names();
        match self.side {
            Side::Listen => listen,
            Side::Connect => connect,
        }
    }
}

impl std::fmt::Display for SocketRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why two ports cannot share a socket address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareRefused {
    /// The address is the other port's: another kind or role there, or a
    /// kind whose sockets carry one interface.
    Taken,
    /// Both would be the same interface on it.
    SameInterface,
    /// The switch creates the socket file, and the other port gave it
    /// another group.
    OtherGroup,
}

/// A socket port's socket, as its kind's spec gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketSpec<'a> {
    /// Where the socket is.
    pub addr: &'a SocketAddr,
    /// The switch's role.
    pub role: SocketRole,
    /// The group given the socket the switch creates.
    pub group: Option<u32>,
    /// The interface on the socket, for kinds whose sockets carry several
    /// told apart by an id (memif's `id`, as VPP and DPDK serve them).
    pub interface: Option<u32>,
}

impl SocketSpec<'_> {
    /// Which end of the socket the switch is.
    pub fn side(&self) -> Side {
        self.role.side()
    }

    /// Whether the switch creates the socket (and so may give it a group).
    pub fn switch_creates(&self) -> bool {
        self.side() == Side::Listen
    }

    /// Whether a port of this socket may share its address with `other`,
    /// a port there: both of one kind and role, each an interface of its
    /// own (memif's id), as VPP and DPDK serve a memif socket and connect
    /// to one. A socket the switch creates has one group. Else the
    /// address is the other port's alone.
    pub fn shares_with(&self, other: &SocketSpec<'_>) -> Result<(), ShareRefused> {
        if self.role != other.role || self.interface.is_none() {
            return Err(ShareRefused::Taken);
        }
        if self.interface == other.interface {
            return Err(ShareRefused::SameInterface);
        }
        if self.switch_creates() && self.group != other.group {
            return Err(ShareRefused::OtherGroup);
        }
        Ok(())
    }

    /// Checks what every socket kind shares: the address, and a group only
    /// on a socket file the switch creates. `at` prefixes field names.
    pub fn validate(&self, at: &str) -> Result<(), SpecError> {
        self.addr.validate(at)?;
        if self.group.is_some() {
            if !self.switch_creates() {
                return Err(SpecError::new(
                    format!("{at}socket_group"),
                    format!(
                        "applies where the switch creates the socket (role {})",
                        self.role.kind().role(Side::Listen)
                    ),
                ));
            }
            if self.addr.path().is_none() {
                return Err(SpecError::new(
                    format!("{at}socket_group"),
                    "an abstract socket has no file to give a group",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemifRole;

    #[test]
    fn addresses_parse_once_and_print_as_written() {
        assert_eq!(
            SocketAddr::parse("/run/a.sock"),
            SocketAddr::Path("/run/a.sock".into())
        );
        assert_eq!(
            SocketAddr::parse("@memif"),
            SocketAddr::Abstract("memif".into())
        );
        assert_eq!(
            SocketAddr::parse("abstract:vpp"),
            SocketAddr::Abstract("vpp".into())
        );
        assert_eq!(SocketAddr::parse("@m").to_string(), "@m");
        assert!(SocketAddr::parse("@").validate("").is_err());
        assert!(SocketAddr::parse("").validate("").is_err());
        let long = format!("/{}", "a".repeat(MAX_SOCKET_PATH));
        let e = SocketAddr::parse(&long).validate("port.").unwrap_err();
        assert_eq!(e.field, "port.socket");
    }

    #[test]
    fn the_pods_role_is_the_switchs_peer() {
        for &kind in SocketKind::ALL {
            for side in [Side::Listen, Side::Connect] {
                let r = kind.role(side);
                assert_eq!((r.kind(), r.side()), (kind, side));
                assert_eq!(r.peer().peer(), r);
                assert_ne!(r.peer().side(), side);
                assert_eq!(kind.parse_role(r.as_str()), Ok(r));
            }
            assert_eq!(SocketKind::from_name(kind.name()), Some(kind));
            assert_eq!(kind.default_pod_role().side(), Side::Connect);
        }
        assert_eq!(
            SocketKind::Memif.parse_role("server"),
            Ok(MemifRole::Master.into())
        );
        assert!(SocketKind::VhostUser.parse_role("master").is_err());
    }

    #[test]
    fn interfaces_of_one_kind_and_role_share_a_socket() {
        let addr = SocketAddr::parse("/run/s.sock");
        let spec = |kind: SocketKind, side, interface| SocketSpec {
            addr: &addr,
            role: kind.role(side),
            group: None,
            interface,
        };
        for side in [Side::Connect, Side::Listen] {
            let memif = |id| spec(SocketKind::Memif, side, Some(id));
            assert_eq!(memif(1).shares_with(&memif(0)), Ok(()));
            assert_eq!(
                memif(0).shares_with(&memif(0)),
                Err(ShareRefused::SameInterface)
            );
        }
        let master = spec(SocketKind::Memif, Side::Listen, Some(1));
        let slave = spec(SocketKind::Memif, Side::Connect, Some(0));
        assert_eq!(master.shares_with(&slave), Err(ShareRefused::Taken));
        assert_eq!(slave.shares_with(&master), Err(ShareRefused::Taken));
        let grouped = SocketSpec {
            group: Some(1000),
            ..spec(SocketKind::Memif, Side::Listen, Some(0))
        };
        assert_eq!(master.shares_with(&grouped), Err(ShareRefused::OtherGroup));
        for side in [Side::Connect, Side::Listen] {
            let vhost = spec(SocketKind::VhostUser, side, None);
            assert_eq!(vhost.shares_with(&vhost), Err(ShareRefused::Taken));
            let memif = spec(SocketKind::Memif, side, Some(0));
            assert_eq!(vhost.shares_with(&memif), Err(ShareRefused::Taken));
            assert_eq!(memif.shares_with(&vhost), Err(ShareRefused::Taken));
        }
    }
}
