//! The device plugin's configuration: where the kubelet, Multus and the
//! container runtime look for files, and the pools of socket devices.
//!
//! Roles here are **the pod's**, as in device-info files and the CNI
//! netconf: a memif pool with `pod_role = "slave"` hands out sockets the
//! switch creates as master.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use switchyard_api::devinfo::DeviceInfo;
use switchyard_api::{SocketKind, SocketRole};

/// The built-in configuration (two pools of 16 sockets).
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// The largest pool.
pub const MAX_DEVICES: u32 = 4096;

impl From<toml::de::Error> for ConfigError {
    fn from(e: toml::de::Error) -> ConfigError {
        ConfigError::Parse(e)
    }
}

/// A configuration error, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML did not parse or has unknown fields.
    #[error("config: {0}")]
    Parse(toml::de::Error),
    /// A path is not absolute and clean (the message names the field).
    #[error("config: {0}")]
    Path(String),
    /// A value is out of range.
    #[error("config: {field}: {reason}")]
    Invalid {
        /// The offending field, e.g. `pool[1].resource`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    resource: String,
    interface_type: SocketKind,
    count: u32,
    pod_role: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    plugin_dir: Option<PathBuf>,
    devinfo_dir: Option<PathBuf>,
    cdi: Option<bool>,
    cdi_dir: Option<PathBuf>,
    socket_dir: Option<PathBuf>,
    control_socket: Option<PathBuf>,
    health_interval_ms: Option<u64>,
    socket_group: Option<u32>,
    #[serde(default, rename = "pool")]
    pools: Vec<RawPool>,
}

/// One advertised resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Extended resource name, `<domain>/<class>`.
    pub resource: String,
    /// The part after the `/`: prefixes device IDs, names the endpoint.
    pub class: String,
    /// Number of devices.
    pub count: u32,
    /// The pod's role at the pool's sockets (memif `slave`/`master`,
    /// vhost-user `client`/`server`): its kind is the pool's.
    pub pod_role: SocketRole,
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The kubelet's device plugin directory (holds `kubelet.sock`).
    pub plugin_dir: PathBuf,
    /// Where device-info files for Multus go (`.../devinfo/dp`).
    pub devinfo_dir: PathBuf,
    /// Whether to write a CDI spec and return CDI device names.
    pub cdi: bool,
    /// CDI spec directory.
    pub cdi_dir: PathBuf,
    /// Parent of the per-device socket directories. It must lie inside the
    /// CNI netconf's `socketDir`.
    pub socket_dir: PathBuf,
    /// The switch daemon's control socket (health).
    pub control_socket: PathBuf,
    /// How often health and the kubelet socket are checked.
    pub health_interval_ms: u64,
    /// Numeric group given access to the device directories (mode 0770
    /// instead of 0700), for pods that run as non-root members of it; the
    /// CNI netconf's `socketGroup` gives the sockets in them the same group.
    pub socket_group: Option<u32>,
    /// The pools.
    pub pools: Vec<Pool>,
}

/// One device of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Device ID, `<class>-<n>`; also its CDI device name.
    pub id: String,
    /// Its socket directory (mounted into the pod at the same path).
    pub dir: PathBuf,
    /// The socket the switch port will use.
    pub socket: PathBuf,
}

fn absolute(field: &str, p: Option<PathBuf>, default: &str) -> Result<PathBuf, ConfigError> {
    let p = p.unwrap_or_else(|| PathBuf::from(default));
    let s = p.to_str().unwrap_or_default();
    switchyard_api::fs::clean_absolute(field, s)
        .map_err(ConfigError::Path)
        .and_then(|c| {
            if c.parent().is_none() {
                Err(invalid(field, "must not be /"))
            } else {
                Ok(c)
            }
        })
}

/// A DNS-1123 label: lower-case alphanumerics and `-`, alphanumeric at
/// both ends, at most 63 characters.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Checks an extended resource name and returns its class.
fn resource_class(field: &str, r: &str) -> Result<String, ConfigError> {
    let bad = |why: &str| invalid(field, format!("{r:?} {why}"));
    let (domain, class) = r
        .split_once('/')
        .ok_or_else(|| bad("is not <domain>/<name>"))?;
    if domain.len() > 253 || !domain.split('.').all(is_dns_label) || !domain.contains('.') {
        return Err(bad("has no valid DNS domain before the '/'"));
    }
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
        return Err(bad("uses a kubernetes.io domain, which is reserved"));
    }
    if !is_dns_label(class) {
        return Err(bad(
            "has a name that is not a DNS label (a-z, 0-9, '-', at most 63)",
        ));
    }
    Ok(class.to_string())
}

impl Config {
    /// Parses and checks a TOML configuration.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text)?;
        let interval = raw.health_interval_ms.unwrap_or(2000);
        if !(100..=60_000).contains(&interval) {
            return Err(invalid("health_interval_ms", "must be 100..=60000"));
        }
        let mut pools = Vec::new();
        let mut classes = BTreeSet::new();
        for (i, p) in raw.pools.into_iter().enumerate() {
            let f = |name: &str| format!("pool[{i}].{name}");
            let class = resource_class(&f("resource"), &p.resource)?;
            if !classes.insert(class.clone()) {
                return Err(invalid(
                    f("resource"),
                    format!("another pool already uses the name {class:?}"),
                ));
            }
            if p.count == 0 || p.count > MAX_DEVICES {
                return Err(invalid(f("count"), format!("must be 1..={MAX_DEVICES}")));
            }
            let kind = p.interface_type;
            let pod_role = match p.pod_role.as_deref() {
                None => kind.default_pod_role(),
                Some(r) => kind.parse_role(r).map_err(|e| invalid(f("pod_role"), e))?,
            };
            pools.push(Pool {
                resource: p.resource,
                class,
                count: p.count,
                pod_role,
            });
        }
        if pools.is_empty() {
            return Err(invalid("pool", "at least one [[pool]] is needed"));
        }
        Ok(Config {
            plugin_dir: absolute(
                "plugin_dir",
                raw.plugin_dir,
                "/var/lib/kubelet/device-plugins",
            )?,
            devinfo_dir: absolute(
                "devinfo_dir",
                raw.devinfo_dir,
                "/var/run/k8s.cni.cncf.io/devinfo/dp",
            )?,
            cdi: raw.cdi.unwrap_or(true),
            cdi_dir: absolute("cdi_dir", raw.cdi_dir, "/var/run/cdi")?,
            socket_dir: absolute(
                "socket_dir",
                raw.socket_dir,
                "/var/run/switchyard/pods/devices",
            )?,
            control_socket: absolute(
                "control_socket",
                raw.control_socket,
                switchyard_api::DEFAULT_CONTROL_SOCKET,
            )?,
            health_interval_ms: interval,
            socket_group: raw.socket_group,
            pools,
        })
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid(path.display().to_string(), e.to_string()))?;
        Config::parse(&text)
    }

    /// The kubelet's registration socket.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.plugin_dir.join("kubelet.sock")
    }

    /// The devices of `pool`.
    pub fn devices<'a>(&'a self, pool: &'a Pool) -> impl Iterator<Item = Device> + 'a {
        (0..pool.count).map(move |n| {
            let id = format!("{}-{n}", pool.class);
            let dir = self.socket_dir.join(&id);
            let socket = dir.join(format!("{}.sock", pool.pod_role.kind().name()));
            Device { id, dir, socket }
        })
    }

    /// The device-info file the plugin writes for `id` of `pool`:
    /// `<devinfo_dir>/<resource with '/' as '-'>-<id>-device.json`.
    pub fn devinfo_file(&self, pool: &Pool, id: &str) -> PathBuf {
        self.devinfo_dir.join(format!(
            "{}-{id}-device.json",
            pool.resource.replace('/', "-")
        ))
    }
}

impl Pool {
    /// The environment variable listing the allocated sockets of this pool.
    pub fn list_env(&self) -> String {
        format!("SWITCHYARD_{}_SOCKETS", env_part(&self.class))
    }

    /// The device-info document of one device.
    pub fn device_info(&self, dev: &Device) -> DeviceInfo {
        DeviceInfo::for_pod(self.pod_role, &dev.socket.display().to_string())
    }
}

/// The per-device environment variable naming its socket.
pub fn device_env(id: &str) -> String {
    format!("SWITCHYARD_SOCKET_{}", env_part(id))
}

fn env_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_parses() {
        let c = Config::parse(DEFAULT_CONFIG).unwrap();
        assert_eq!(c.pools.len(), 2);
        assert_eq!(c.pools[0].resource, "switchyard.io/memif");
        assert_eq!(c.pools[0].pod_role, switchyard_api::MemifRole::Slave.into());
        assert_eq!(
            c.pools[1].pod_role,
            switchyard_api::VhostUserRole::Client.into()
        );
        assert!(c.cdi);
        assert_eq!(
            c.kubelet_socket(),
            PathBuf::from("/var/lib/kubelet/device-plugins/kubelet.sock")
        );
    }

    #[test]
    fn names_follow_the_conventions() {
        let c = Config::parse(DEFAULT_CONFIG).unwrap();
        let p = &c.pools[0];
        let d = c.devices(p).nth(3).unwrap();
        assert_eq!(d.id, "memif-3");
        assert_eq!(
            d.socket,
            PathBuf::from("/var/run/switchyard/pods/devices/memif-3/memif.sock")
        );
        assert_eq!(
            c.devinfo_file(p, &d.id),
            PathBuf::from(
                "/var/run/k8s.cni.cncf.io/devinfo/dp/switchyard.io-memif-memif-3-device.json"
            )
        );
        assert_eq!(p.list_env(), "SWITCHYARD_MEMIF_SOCKETS");
        assert_eq!(
            device_env("vhost-user-12"),
            "SWITCHYARD_SOCKET_VHOST_USER_12"
        );
        let info = c.pools[1].device_info(&c.devices(&c.pools[1]).next().unwrap());
        let v: switchyard_api::spec::vhost_user::VhostUserInfo = info.section().unwrap();
        assert_eq!(v.mode, switchyard_api::VhostUserRole::Client);
    }

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn bad_values_name_their_field() {
        let pool = |extra: &str| {
            format!("[[pool]]\nresource = \"switchyard.io/memif\"\ninterface_type = \"memif\"\ncount = 4\n{extra}")
        };
        assert!(err(&pool("pod_role = \"boss\"")).contains("pool[0].pod_role"));
        assert!(err(&pool("colour = 1")).contains("colour"));
        assert!(err("").contains("pool"));
        assert!(err(&pool("").replace("count = 4", "count = 0")).contains("pool[0].count"));
        for bad in [
            "memif",
            "switchyard.io/Memif",
            "x/memif",
            "k8s.kubernetes.io/m",
        ] {
            let e = err(&pool("").replace("switchyard.io/memif", bad));
            assert!(e.contains("pool[0].resource"), "{bad}: {e}");
        }
        let two = format!(
            "{}\n{}",
            pool(""),
            pool("").replace("switchyard.io", "other.io")
        );
        assert!(err(&two).contains("pool[1].resource"));
        assert!(err(&format!("socket_dir = \"rel\"\n{}", pool(""))).contains("socket_dir"));
        assert!(err(&format!("socket_dir = \"/a/../..\"\n{}", pool(""))).contains("socket_dir"));
        assert!(
            err(&format!("health_interval_ms = 1\n{}", pool(""))).contains("health_interval_ms")
        );
    }
}
