//! The network configuration (`"type": "switchyard"`) read from stdin.
//!
//! Roles here are the **pod's**: `memif.role: slave` means the pod is the
//! memif slave, so the switch is master and creates the socket;
//! `vhostUser.mode: client` means the pod connects, so the switch is the
//! socket server.

use std::path::PathBuf;

use serde::Deserialize;
use switchyard_api::spec::socket::PodSection;
use switchyard_api::spec::{Meter, RateLimits};
use switchyard_api::{SocketKind, SocketRole, VlanSet};

use crate::error::{CniError, DECODE_FAILURE, INVALID_CONFIG};

/// Default directory of per-pod socket directories.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/switchyard/pods";
/// Default control socket of the switch.
pub const DEFAULT_CONTROL_SOCKET: &str = switchyard_api::DEFAULT_CONTROL_SOCKET;
/// Where device plugins write device-info files (NPWG Device Information
/// spec, the `dp` directory Multus reads).
pub const DEFAULT_DEVICE_INFO_DIR: &str = "/var/run/k8s.cni.cncf.io/devinfo/dp";

/// Runtime-provided values (from declared capabilities: libcni passes a
/// key only when the netconf's `capabilities` declares it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RuntimeConfig {
    /// Where to read/write device information (Multus generates it when the
    /// network has a device: `<devinfo>/cni/<ns>-<net>-<container>_<ifname>`).
    #[serde(rename = "CNIDeviceInfoFile")]
    pub device_info_file: Option<String>,
    /// Requested MAC address.
    pub mac: Option<String>,
    /// The device Multus took from the pod's resources or its network
    /// selection (informational: only the top-level `deviceID` names a
    /// device plugin's device).
    #[serde(rename = "deviceID")]
    pub device_id: Option<String>,
    /// The `bandwidth` capability (Multus fills it from the network
    /// selection's `bandwidth`): the pod's port is limited to it, unless
    /// the netconf has limits of its own.
    pub bandwidth: Option<Bandwidth>,
    /// The `ips` capability (the selection's `ips`): the delegated IPAM
    /// plugin reads them from the same netconf; a network without IPAM
    /// cannot give them.
    pub ips: Option<Vec<String>>,
    /// Other capabilities (`portMappings`, ...), which concern other
    /// plugins.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// A bandwidth entry as the CNI conventions define it (and the reference
/// `bandwidth` plugin reads it, `plugins/meta/bandwidth/main.go`
/// `BandwidthEntry`): rates in bits a second, bursts in bits, 0 for no
/// limit. Ingress is what the pod receives, egress what it sends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bandwidth {
    /// Bits a second into the pod.
    #[serde(default)]
    pub ingress_rate: u64,
    /// The burst into the pod, in bits.
    #[serde(default)]
    pub ingress_burst: u64,
    /// Bits a second out of the pod.
    #[serde(default)]
    pub egress_rate: u64,
    /// The burst out of the pod, in bits.
    #[serde(default)]
    pub egress_burst: u64,
}

impl Bandwidth {
    /// The switch's limits for the pod's port: ingress is what the switch
    /// sends the port (`tx`), egress what it receives (`rx`). Checked as
    /// the reference plugin checks an entry (`validateRateAndBurst`), the
    /// field named below `at`.
    pub fn limits(&self, at: &str) -> Result<Option<RateLimits>, CniError> {
        let meter = |rate: u64, burst: u64, dir: &str| -> Result<Option<Meter>, CniError> {
            match (rate, burst) {
                (0, 0) => Ok(None),
                (_, 0) => Err(invalid(
                    &format!("{at}{dir}Burst"),
                    "if rate is set, burst must also be set",
                )),
                (0, _) => Err(invalid(
                    &format!("{at}{dir}Rate"),
                    "if burst is set, rate must also be set",
                )),
                (_, b) if b / 8 >= u64::from(u32::MAX) => Err(invalid(
                    &format!("{at}{dir}Burst"),
                    "burst cannot be more than 4GB",
                )),
                (r, b) => Ok(Some(Meter {
                    bits_per_sec: Some(r),
                    burst_bits: Some(b),
                    ..Meter::default()
                })),
            }
        };
        let limits = RateLimits {
            tx: meter(self.ingress_rate, self.ingress_burst, "ingress")?,
            rx: meter(self.egress_rate, self.egress_burst, "egress")?,
        };
        Ok((!limits.is_empty()).then_some(limits))
    }
}

/// One entry of a `trunk` list: a VLAN id, a range `"100-200"`, or the
/// ovs-cni forms `{"id": 42}` and `{"minID": 100, "maxID": 200}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TrunkItem {
    /// One VLAN id (0: untagged frames).
    Id(u16),
    /// A list in the switch's syntax (`"100-200"`, `"all"`).
    Text(String),
    /// `{"id": n}`.
    Object {
        /// The VLAN.
        id: u16,
    },
    /// `{"minID": a, "maxID": b}`.
    #[serde(rename_all = "camelCase")]
    Range {
        /// First VLAN.
        #[serde(rename = "minID")]
        min_id: u16,
        /// Last VLAN.
        #[serde(rename = "maxID")]
        max_id: u16,
    },
}

/// The raw netconf. Keys it does not name are ignored with a warning (a
/// runtime or meta-plugin may add keys meant for others; a typo in ours is
/// still reported).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawNetConf {
    /// CNI version of the config.
    pub cni_version: String,
    /// Network name.
    pub name: String,
    /// Plugin type.
    #[serde(rename = "type")]
    pub plugin: String,
    /// Bridge (default `default`).
    pub bridge: Option<String>,
    /// Physical network: the pod's port joins the bridge the switch keeps
    /// for it (named after it, with the physnet's uplink), so the network's
    /// frames leave the node on its `vlan`.
    pub physnet: Option<String>,
    /// Access VLAN.
    pub vlan: Option<u16>,
    /// Trunk: the VLANs the pod's port carries tagged (0: untagged too).
    pub trunk: Option<Vec<TrunkItem>>,
    /// `memif` or `vhost-user`.
    pub interface_type: Option<String>,
    /// Base of the per-pod directories.
    pub socket_dir: Option<String>,
    /// Group given access to pod directories and the sockets the switch
    /// creates (numeric gid): non-root pods in it can connect.
    pub socket_group: Option<u32>,
    /// Which source MAC the pod's port is bound to: `result` (default: the
    /// MAC the result reports, `runtimeConfig.mac` or a derived one),
    /// `first` (the first the pod sends from) or `none`.
    pub pin: Option<String>,
    /// Which source IP addresses the pod's port is bound to (`pinIps`): `result`
    /// (default: the addresses of this interface in the result, from its
    /// IPAM; none without IPAM) or `none` (any: a pod that routes).
    pub pin_ips: Option<String>,
    /// Most MAC addresses the pod's port may hold in the bridge's table
    /// (the switch's default, 64, when absent; 0: no limit).
    pub mac_limit: Option<u32>,
    /// Most frames a second the pod's port may have flooded (broadcast,
    /// multicast, unknown unicast; default 1000; 0: no limit).
    pub flood_limit: Option<u32>,
    /// The network's own bandwidth limits for each pod, as the reference
    /// `bandwidth` plugin reads them beside `runtimeConfig.bandwidth`
    /// (these win when any is given): bits a second into the pod.
    pub ingress_rate: Option<u64>,
    /// Its burst into the pod, in bits.
    pub ingress_burst: Option<u64>,
    /// Bits a second out of the pod.
    pub egress_rate: Option<u64>,
    /// Its burst out of the pod, in bits.
    pub egress_burst: Option<u64>,
    /// Where the device plugin writes its device-info files (searched for
    /// `deviceID`).
    pub device_info_dir: Option<String>,
    /// The kubelet's Pod Resources API socket, asked whether a Kubernetes
    /// pod holds its `deviceID`.
    pub pod_resources_socket: Option<String>,
    /// The device the kubelet allocated to the pod for this network, added
    /// by Multus when the network names a device-plugin resource.
    #[serde(rename = "deviceID")]
    pub device_id: Option<String>,
    /// Multus adds the device here too (for SR-IOV plugins); unused.
    #[serde(rename = "pciBusID")]
    pub pci_bus_id: Option<String>,
    /// Control socket of the switch.
    pub control_socket: Option<String>,
    /// IPAM delegation.
    pub ipam: Option<serde_json::Value>,
    /// DNS (passed through to the result).
    pub dns: Option<serde_json::Value>,
    /// Declared capabilities.
    pub capabilities: Option<serde_json::Value>,
    /// Runtime values.
    #[serde(rename = "runtimeConfig")]
    pub runtime_config: Option<RuntimeConfig>,
    /// Previous plugin's result (chaining).
    pub prev_result: Option<serde_json::Value>,
    /// Opaque args.
    pub args: Option<serde_json::Value>,
    /// Standard field, unused.
    pub ip_masq: Option<bool>,
    /// Conflist-level key some runtimes copy into each plugin; unused.
    pub cni_versions: Option<serde_json::Value>,
    /// CNI 1.1: CHECK disabled.
    pub disable_check: Option<bool>,
    /// CNI 1.1: GC disabled.
    pub disable_gc: Option<bool>,
    /// GC: attachments still in use.
    #[serde(rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<ValidAttachment>>,
    /// GC (older spelling used by libcni).
    #[serde(rename = "cni.dev/attachments")]
    pub attachments: Option<Vec<ValidAttachment>>,
    /// The keys not named above: a socket kind's section (`memif: {...}`,
    /// `vhostUser: {...}`), which the kind's spec module reads
    /// ([`switchyard_api::SocketKind::pod_section`]); any other is ignored
    /// with a warning.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// An attachment named by GC as still valid.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidAttachment {
    /// Container id.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

/// A validated netconf.
#[derive(Debug, Clone)]
pub struct NetConf {
    /// The raw fields.
    pub raw: RawNetConf,
    /// CNI version requested.
    pub cni_version: String,
    /// Bridge.
    pub bridge: String,
    /// Access VLAN.
    pub vlan: Option<u16>,
    /// Trunk VLANs (exclusive with `vlan`; neither: untagged only).
    pub trunk: Option<VlanSet>,
    /// The pod's role at its socket (the kind is `interfaceType`; the
    /// switch takes the other end, [`SocketRole::peer`]).
    pub pod_role: SocketRole,
    /// What the kind's section says (`memif: {...}`), as the CNI needs it.
    pub pod_section: PodSection,
    /// The kind's section as given (`Null`: none), for the port's options.
    pub pod_options: serde_json::Value,
    /// Base of the per-pod directories.
    pub socket_dir: PathBuf,
    /// Control socket.
    pub control_socket: PathBuf,
    /// Device-info file, when the runtime passed one.
    pub device_info_file: Option<PathBuf>,
    /// Requested MAC.
    pub mac: Option<String>,
    /// What the pod's port is pinned to.
    pub pin: Pin,
    /// The pod's port may send only from its result's addresses.
    pub pin_ips: bool,
    /// The pod's port's policers: the netconf's bandwidth, else
    /// `runtimeConfig.bandwidth`'s.
    pub rate_limit: Option<RateLimits>,
    /// The device-plugin device of this attachment (Multus's `deviceID`).
    pub device_id: Option<String>,
    /// The device plugin's device-info directory.
    pub device_info_dir: PathBuf,
    /// The kubelet's Pod Resources API socket.
    pub pod_resources_socket: PathBuf,
    /// Keys that were ignored (logged as warnings).
    pub ignored: Vec<String>,
}

/// Which source MAC a pod's port is bound to (netconf `pin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// The MAC the result reports.
    Result,
    /// The first MAC the pod sends from.
    First,
    /// Any (within the port's MAC limit).
    None,
}

fn invalid(field: &str, msg: impl std::fmt::Display) -> CniError {
    CniError::new(INVALID_CONFIG, format!("{field}: {msg}"))
}

/// The pod's role, from `interfaceType` and that kind's section (another
/// kind's section is refused: it would be ignored), with what the section
/// says and the section itself.
fn pod_role(raw: &RawNetConf) -> Result<(SocketRole, PodSection, serde_json::Value), CniError> {
    let itype = raw.interface_type.as_deref().unwrap_or("memif");
    let kind = SocketKind::from_name(itype).ok_or_else(|| {
        let names: Vec<&str> = SocketKind::ALL.iter().map(|k| k.name()).collect();
        invalid(
            "interfaceType",
            format!("{itype:?} is not supported ({})", names.join(" or ")),
        )
    })?;
    if let Some(other) = SocketKind::ALL
        .iter()
        .map(|k| k.netconf_key())
        .find(|k| *k != kind.netconf_key() && raw.other.contains_key(*k))
    {
        return Err(invalid(other, format!("given with interfaceType {itype}")));
    }
    let section = raw
        .other
        .get(kind.netconf_key())
        .cloned()
        .unwrap_or_default();
    let said = kind.pod_section(&section).map_err(|e| {
        // The section is not the kind's shape: as the netconf's decoding
        // reports it.
        if e.field == kind.netconf_key() {
            CniError::new(DECODE_FAILURE, format!("netconf: {e}"))
        } else {
            CniError::new(INVALID_CONFIG, e.to_string())
        }
    })?;
    let role = match &said.role {
        None => kind.default_pod_role(),
        Some(g) => {
            let (field, what) = kind.netconf_role();
            kind.parse_role(g).map_err(|_| {
                invalid(
                    &format!("{}.{field}", kind.netconf_key()),
                    format!("{g:?}: the pod's {what}"),
                )
            })?
        }
    };
    Ok((role, said, section))
}

/// Checks that `s`, given as `field`, is safe as one path component: 1 to
/// `max` of letters, digits, `-`, `_`, `.`, not starting with `.`. Else
/// the error has `code`.
pub(crate) fn path_component(field: &str, s: &str, max: usize, code: u32) -> Result<(), CniError> {
    let ok = !s.is_empty()
        && s.len() <= max
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        return Ok(());
    }
    Err(CniError::new(
        code,
        format!("{field}: {s:?} must be 1 to {max} of letters, digits, '-', '_', '.' and not start with '.'"),
    ))
}

/// An absolute path without `..` components.
pub fn clean_absolute(field: &str, p: &str) -> Result<PathBuf, CniError> {
    switchyard_api::fs::clean_absolute(field, p).map_err(|e| CniError::new(INVALID_CONFIG, e))
}

/// Whether `v` is `first` or later (both among [`SUPPORTED_VERSIONS`]).
pub fn version_at_least(v: &str, first: &str) -> bool {
    let pos = |x: &str| SUPPORTED_VERSIONS.iter().position(|s| *s == x);
    matches!((pos(v), pos(first)), (Some(a), Some(b)) if a >= b)
}

/// Supported CNI versions.
pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

impl NetConf {
    /// The name of the socket this network shares with the pod's other
    /// networks that name it (memif's `memif.socket`).
    pub fn shared_socket(&self) -> Option<&str> {
        self.pod_section.shared_socket.as_deref()
    }

    /// Parses and validates stdin bytes. Keys the plugin does not know are
    /// ignored and listed in [`NetConf::ignored`].
    pub fn parse(bytes: &[u8]) -> Result<NetConf, CniError> {
        let mut ignored = Vec::new();
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let raw: RawNetConf = serde_ignored::deserialize(&mut de, |path| {
            // `?` marks an Option on the way: not part of the key's name.
            ignored.push(path.to_string().replace(".?", "").replace("?.", ""));
        })
        .and_then(|r| de.end().map(|()| r))
        .map_err(|e| CniError::new(DECODE_FAILURE, format!("netconf: {e}")))?;
        let mut nc = NetConf::validate(raw)?;
        // The kind's section's unknown keys, then the netconf's own (the
        // ones no socket kind's section is named by).
        ignored.extend(nc.pod_section.ignored.iter().cloned());
        ignored.extend(
            nc.raw
                .other
                .keys()
                .filter(|k| {
                    !SocketKind::ALL
                        .iter()
                        .any(|s| s.netconf_key() == k.as_str())
                })
                .cloned(),
        );
        nc.ignored = ignored;
        Ok(nc)
    }

    fn validate(raw: RawNetConf) -> Result<NetConf, CniError> {
        if !SUPPORTED_VERSIONS.contains(&raw.cni_version.as_str()) {
            return Err(CniError::new(
                crate::error::INCOMPATIBLE_VERSION,
                format!(
                    "cniVersion: {:?} is not supported (supported: {})",
                    raw.cni_version,
                    SUPPORTED_VERSIONS.join(", ")
                ),
            ));
        }
        if raw.plugin != "switchyard" {
            return Err(invalid(
                "type",
                format!("{:?}: this plugin is \"switchyard\"", raw.plugin),
            ));
        }
        if raw.name.is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        if let Some(p) = &raw.physnet {
            switchyard_api::spec::validate_name("physnet", p)
                .map_err(|e| CniError::new(INVALID_CONFIG, e.to_string()))?;
            if raw.bridge.as_ref().is_some_and(|b| b != p) {
                return Err(invalid(
                    "bridge",
                    format!(
                        "{:?} with physnet {p:?}: a physnet's pods join the bridge of its name",
                        raw.bridge.as_deref().unwrap_or_default()
                    ),
                ));
            }
        }
        let bridge = raw
            .bridge
            .clone()
            .or_else(|| raw.physnet.clone())
            .unwrap_or_else(|| "default".into());
        switchyard_api::spec::validate_name("bridge", &bridge)
            .map_err(|e| CniError::new(INVALID_CONFIG, e.to_string()))?;
        if let Some(v) = raw.vlan {
            if v == 0 || v > 4094 {
                return Err(invalid("vlan", format!("{v} is not a VLAN id (1..=4094)")));
            }
        }
        let trunk = raw.trunk.as_deref().map(trunk_set).transpose()?;
        if raw.vlan.is_some() && trunk.is_some() {
            return Err(invalid(
                "trunk",
                "a network is an access VLAN (vlan) or a trunk, not both",
            ));
        }
        let (pod_role, pod_section, pod_options) = pod_role(&raw)?;
        if let Some(name) = &pod_section.shared_socket {
            let field = format!("{}.socket", pod_role.kind().netconf_key());
            path_component(&field, name, 64, INVALID_CONFIG)?;
        }
        let socket_dir = clean_absolute(
            "socketDir",
            raw.socket_dir.as_deref().unwrap_or(DEFAULT_SOCKET_DIR),
        )?;
        if socket_dir.parent().is_none() {
            return Err(invalid("socketDir", "must not be /"));
        }
        let control_socket = clean_absolute(
            "controlSocket",
            raw.control_socket
                .as_deref()
                .unwrap_or(DEFAULT_CONTROL_SOCKET),
        )?;
        let rc = raw.runtime_config.clone().unwrap_or_default();
        let device_info_file = rc
            .device_info_file
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(|p| clean_absolute("runtimeConfig.CNIDeviceInfoFile", p))
            .transpose()?;
        let mac = rc.mac.clone().filter(|m| !m.is_empty());
        if let Some(m) = &mac {
            parse_mac(m).ok_or_else(|| {
                invalid("runtimeConfig.mac", format!("{m:?} is not a MAC address"))
            })?;
        }
        // The netconf's own entry wins, as the reference plugin's
        // `getBandwidth` has it (any of its keys makes one).
        let own = [
            raw.ingress_rate,
            raw.ingress_burst,
            raw.egress_rate,
            raw.egress_burst,
        ];
        let rate_limit = if own.iter().any(Option::is_some) {
            Bandwidth {
                ingress_rate: raw.ingress_rate.unwrap_or(0),
                ingress_burst: raw.ingress_burst.unwrap_or(0),
                egress_rate: raw.egress_rate.unwrap_or(0),
                egress_burst: raw.egress_burst.unwrap_or(0),
            }
            .limits("")?
        } else {
            rc.bandwidth
                .map(|b| b.limits("runtimeConfig.bandwidth."))
                .transpose()?
                .flatten()
        };
        let pin = match raw.pin.as_deref().unwrap_or("result") {
            "result" => Pin::Result,
            "first" => Pin::First,
            "none" => Pin::None,
            p => {
                return Err(invalid(
                    "pin",
                    format!("{p:?}: expected result, first or none"),
                ))
            }
        };
        let pin_ips = match raw.pin_ips.as_deref().unwrap_or("result") {
            "result" => true,
            "none" => false,
            p => return Err(invalid("pinIps", format!("{p:?}: expected result or none"))),
        };
        let device_info_dir = clean_absolute(
            "deviceInfoDir",
            raw.device_info_dir
                .as_deref()
                .unwrap_or(DEFAULT_DEVICE_INFO_DIR),
        )?;
        let pod_resources_socket = clean_absolute(
            "podResourcesSocket",
            raw.pod_resources_socket
                .as_deref()
                .unwrap_or(crate::podresources::DEFAULT_SOCKET),
        )?;
        let device_id = raw.device_id.clone().filter(|d| !d.is_empty());
        if let Some(d) = &device_id {
            let ok = d.len() <= 253
                && !d.contains("..")
                && d.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/')
                });
            if !ok {
                return Err(invalid(
                    "deviceID",
                    format!("{d:?} is not a device ID (letters, digits, '-', '_', '.', ':', '/')"),
                ));
            }
        }
        if let Some(ipam) = &raw.ipam {
            let t = ipam.get("type").and_then(|t| t.as_str()).unwrap_or("");
            if t.is_empty() || t.contains('/') || t.starts_with('.') {
                return Err(invalid("ipam.type", format!("{t:?} is not a plugin name")));
            }
        }
        Ok(NetConf {
            cni_version: raw.cni_version.clone(),
            bridge,
            vlan: raw.vlan,
            trunk,
            pod_role,
            pod_section,
            pod_options,
            socket_dir,
            control_socket,
            device_info_file,
            mac,
            pin,
            pin_ips,
            rate_limit,
            device_id,
            device_info_dir,
            pod_resources_socket,
            ignored: Vec::new(),
            raw,
        })
    }
}

/// The VLAN set of a `trunk` list.
fn trunk_set(items: &[TrunkItem]) -> Result<VlanSet, CniError> {
    if items.is_empty() {
        return Err(invalid("trunk", "lists no VLAN"));
    }
    let text: Vec<String> = items
        .iter()
        .map(|i| match i {
            TrunkItem::Id(v) | TrunkItem::Object { id: v } => v.to_string(),
            TrunkItem::Text(t) => t.clone(),
            TrunkItem::Range { min_id, max_id } => format!("{min_id}-{max_id}"),
        })
        .collect();
    text.join(",")
        .parse()
        .map_err(|e| invalid("trunk", format!("{e}")))
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in out.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<NetConf, CniError> {
        NetConf::parse(s.as_bytes())
    }

    #[test]
    fn bandwidth_comes_from_the_capability_or_the_netconf_and_maps_to_the_switchs_directions() {
        let base = r#""cniVersion":"1.1.0","name":"n","type":"switchyard""#;
        let p = |extra: &str| parse(&format!("{{{base},{extra}}}"));
        // Multus serializes every field of its entry: 0 is no limit.
        let nc = p(r#""capabilities":{"bandwidth":true},"runtimeConfig":{"bandwidth":
                    {"ingressRate":100000000,"ingressBurst":1000000,"egressRate":0,"egressBurst":0}}"#)
        .unwrap();
        let l = nc.rate_limit.expect("limits");
        assert_eq!(
            l.tx.and_then(|m| m.bits_bucket()),
            Some((100_000_000, 1_000_000))
        );
        assert!(l.rx.is_none(), "egress 0: not limited");
        let nc =
            p(r#""runtimeConfig":{"bandwidth":{"egressRate":8000,"egressBurst":800}}"#).unwrap();
        assert_eq!(
            nc.rate_limit
                .and_then(|l| l.rx)
                .and_then(|m| m.bits_bucket()),
            Some((8000, 800))
        );
        // All zero: none.
        let nc = p(r#""runtimeConfig":{"bandwidth":{"ingressRate":0,"ingressBurst":0,"egressRate":0,"egressBurst":0}}"#).unwrap();
        assert!(nc.rate_limit.is_none());
        // The netconf's own keys win over the runtime's.
        let nc = p(r#""egressRate":5000,"egressBurst":500,"runtimeConfig":{"bandwidth":{"ingressRate":8000,"ingressBurst":800}}"#).unwrap();
        let l = nc.rate_limit.unwrap();
        assert!(l.tx.is_none());
        assert_eq!(l.rx.and_then(|m| m.bits_bucket()), Some((5000, 500)));
        // What the reference plugin refuses, refused by name.
        let e = p(r#""runtimeConfig":{"bandwidth":{"ingressRate":8000}}"#).unwrap_err();
        assert_eq!(e.code, INVALID_CONFIG);
        assert!(
            e.msg.starts_with("runtimeConfig.bandwidth.ingressBurst:"),
            "{e}"
        );
        let e = p(r#""egressBurst":800"#).unwrap_err();
        assert!(e.msg.starts_with("egressRate:"), "{e}");
        let e = p(r#""egressRate":1,"egressBurst":40000000000"#).unwrap_err();
        assert!(e.msg.contains("4GB"), "{e}");
        let e = p(r#""runtimeConfig":{"bandwidth":{"ingressRate":-5}}"#).unwrap_err();
        assert_eq!(e.code, DECODE_FAILURE, "{e}");
    }

    #[test]
    fn a_physnet_names_the_bridge() {
        let n = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","physnet":"physnet1","vlan":100}"#,
        )
        .unwrap();
        assert_eq!((n.bridge.as_str(), n.vlan), ("physnet1", Some(100)));
        let e = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","physnet":"physnet1","bridge":"other"}"#,
        )
        .unwrap_err();
        assert!(e.msg.starts_with("bridge:"), "{e:?}");
        let e = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","physnet":"../x"}"#,
        )
        .unwrap_err();
        assert!(e.msg.starts_with("physnet:"), "{e:?}");
    }

    #[test]
    fn defaults_and_role_mapping() {
        let n = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard"}"#).unwrap();
        assert_eq!(n.pod_role.peer().as_str(), "master");
        assert_eq!(n.bridge, "default");
        assert_eq!(n.socket_dir, PathBuf::from(DEFAULT_SOCKET_DIR));
        let n = parse(r#"{"cniVersion":"1.0.0","name":"n","type":"switchyard","interfaceType":"vhost-user","vhostUser":{"mode":"server"}}"#).unwrap();
        assert_eq!(n.pod_role.peer().as_str(), "client");
        let n = parse(
            r#"{"cniVersion":"1.0.0","name":"n","type":"switchyard","memif":{"role":"master"}}"#,
        )
        .unwrap();
        assert_eq!(n.pod_role.peer().as_str(), "slave");
    }

    #[test]
    fn errors_name_the_field_and_carry_cni_codes() {
        let e =
            parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","interfaceType":"tap"}"#)
                .unwrap_err();
        assert_eq!(e.code, INVALID_CONFIG);
        assert!(e.msg.starts_with("interfaceType:"), "{e}");
        let e =
            parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","memif":{"mode":"ip"}}"#)
                .unwrap_err();
        assert_eq!(e.code, INVALID_CONFIG);
        assert!(e.msg.starts_with("memif.mode:"), "{e}");
        let e = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","memif":{"mode":"inject-punt"}}"#).unwrap_err();
        assert!(e.msg.starts_with("memif.mode:"), "{e}");
        let e =
            parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","vlan":5,"trunk":[6]}"#)
                .unwrap_err();
        assert!(e.msg.starts_with("trunk:"), "{e}");
        let e = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","trunk":[4095]}"#)
            .unwrap_err();
        assert!(e.msg.starts_with("trunk:"), "{e}");
        let e =
            parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","deviceID":"../../x"}"#)
                .unwrap_err();
        assert!(e.msg.starts_with("deviceID:"), "{e}");
        let e = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","pinIps":"first"}"#)
            .unwrap_err();
        assert!(e.msg.starts_with("pinIps:"), "{e}");
        let nc = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard"}"#).unwrap();
        assert!(nc.pin_ips, "addresses pinned by default");
        let nc = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","pinIps":"none"}"#)
            .unwrap();
        assert!(!nc.pin_ips);
        let e = parse(r#"{"cniVersion":"9.9.9","name":"n","type":"switchyard"}"#).unwrap_err();
        assert_eq!(e.code, crate::error::INCOMPATIBLE_VERSION);
        let e = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","socketDir":"/var/run/../etc"}"#).unwrap_err();
        assert!(e.msg.starts_with("socketDir:"), "{e}");
        let e =
            parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","socketDir":"pods"}"#)
                .unwrap_err();
        assert!(e.msg.starts_with("socketDir:"), "{e}");
        let e = parse(
            r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","memif":{"role":"boss"}}"#,
        )
        .unwrap_err();
        assert!(e.msg.starts_with("memif.role:"), "{e}");
        for bad in ["", "../x", ".hidden", "a/b"] {
            let e = parse(&format!(
                r#"{{"cniVersion":"1.1.0","name":"n","type":"switchyard","memif":{{"socket":"{bad}","id":1}}}}"#
            ))
            .unwrap_err();
            assert!(e.msg.starts_with("memif.socket:"), "{e}");
        }
        let e = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","ipam":{"type":"../../bin/sh"}}"#).unwrap_err();
        assert!(e.msg.starts_with("ipam.type:"), "{e}");
        assert_eq!(parse("{").unwrap_err().code, DECODE_FAILURE);
    }

    #[test]
    fn keys_of_runtimes_and_multus_are_accepted_and_unknown_ones_listed() {
        // What Multus hands a delegate whose network names a device-plugin
        // resource, with libcni's runtimeConfig and a typo of ours.
        let n = parse(
            r#"{"cniVersion":"1.0.0","name":"n","type":"switchyard",
                "deviceID":"memif-3","pciBusID":"memif-3",
                "capabilities":{"CNIDeviceInfoFile":true,"deviceID":true,"mac":true,"ips":true},
                "runtimeConfig":{"CNIDeviceInfoFile":"/var/run/k8s.cni.cncf.io/devinfo/cni/ns-net-abc_net1",
                    "deviceID":"memif-3","mac":"02:00:00:00:00:01","ips":["10.1.1.1/24"],
                    "portMappings":[],"bandwidth":{"ingressRate":1,"ingressBurst":8}},
                "args":{"cni":{"foo":"bar"}},
                "memif":{"role":"slave","ringsize":512},
                "bridgee":"typo"}"#,
        )
        .unwrap();
        assert_eq!(n.device_id.as_deref(), Some("memif-3"));
        assert_eq!(n.mac.as_deref(), Some("02:00:00:00:00:01"));
        assert_eq!(n.ignored, vec!["memif.ringsize", "bridgee"]);
        assert_eq!(n.device_info_dir, PathBuf::from(DEFAULT_DEVICE_INFO_DIR));
    }

    #[test]
    fn trunks_take_ids_ranges_and_ovs_cni_objects() {
        let n = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard","trunk":[100,"200-202",{"id":7},{"minID":300,"maxID":301}]}"#).unwrap();
        assert_eq!(n.trunk.unwrap().to_string(), "7,100,200-202,300-301");
        let n = parse(r#"{"cniVersion":"1.1.0","name":"n","type":"switchyard"}"#).unwrap();
        assert_eq!((n.vlan, n.trunk), (None, None), "untagged only");
    }

    #[test]
    fn macs() {
        assert_eq!(parse_mac("02:00:00:00:00:0a"), Some([2, 0, 0, 0, 0, 10]));
        assert_eq!(parse_mac("02:00:00:00:00"), None);
        assert_eq!(parse_mac("02:00:00:00:00:0a:01"), None);
        assert_eq!(parse_mac("zz:00:00:00:00:0a"), None);
    }
}
