//! Container Device Interface: one spec file of kind `switchyard.io/socket`
//! with a device per allocatable socket directory, each a bind mount of the
//! directory (at the same path) plus an environment variable naming the
//! socket.

use std::path::PathBuf;

use serde::Serialize;

use crate::config::{device_env, Config};

/// The CDI kind (`<vendor>/<class>`).
pub const KIND: &str = "switchyard.io/socket";

/// The spec version written: the lowest that has every field we use
/// (`env` and `mounts` without `type` exist since 0.3.0), so that older
/// runtimes accept the file too.
pub const CDI_VERSION: &str = "0.3.0";

/// A CDI spec document.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// Spec version.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// The devices.
    pub devices: Vec<SpecDevice>,
}

/// One device of the spec.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDevice {
    /// Unqualified name (the device ID).
    pub name: String,
    /// What the runtime changes in the container.
    pub container_edits: ContainerEdits,
}

/// Container edits of one device.
#[derive(Debug, Clone, Serialize)]
pub struct ContainerEdits {
    /// `KEY=value` entries.
    pub env: Vec<String>,
    /// Mounts.
    pub mounts: Vec<Mount>,
}

/// A bind mount.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// Mount options.
    pub options: Vec<String>,
}

/// The qualified CDI name of a device, `switchyard.io/socket=<id>`.
pub fn qualified_name(id: &str) -> String {
    format!("{KIND}={id}")
}

/// The spec describing every device of every pool.
pub fn spec(cfg: &Config) -> Spec {
    let devices = cfg
        .pools
        .iter()
        .flat_map(|p| cfg.devices(p))
        .map(|d| SpecDevice {
            container_edits: ContainerEdits {
                env: vec![format!("{}={}", device_env(&d.id), d.socket.display())],
                mounts: vec![Mount {
                    host_path: d.dir.display().to_string(),
                    container_path: d.dir.display().to_string(),
                    options: vec!["rbind".into(), "rw".into()],
                }],
            },
            name: d.id,
        })
        .collect();
    Spec {
        cdi_version: CDI_VERSION.into(),
        kind: KIND.into(),
        devices,
    }
}

/// The spec file's path: `<cdi_dir>/switchyard.io-socket.json`.
pub fn spec_path(cfg: &Config) -> PathBuf {
    cfg.cdi_dir.join(format!("{}.json", KIND.replace('/', "-")))
}

/// Writes the spec atomically.
pub fn write(cfg: &Config) -> std::io::Result<PathBuf> {
    let path = spec_path(cfg);
    std::fs::create_dir_all(&cfg.cdi_dir)?;
    let body = serde_json::to_vec_pretty(&spec(cfg)).map_err(std::io::Error::other)?;
    // The runtime may read it at any time.
    switchyard_api::fs::write_atomic(&path, &body, 0o644)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_CONFIG;

    #[test]
    fn spec_has_one_device_per_socket_dir() {
        let cfg = Config::parse(DEFAULT_CONFIG).unwrap();
        let s = spec(&cfg);
        assert_eq!(s.devices.len(), 32);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["cdiVersion"], CDI_VERSION);
        assert_eq!(v["kind"], "switchyard.io/socket");
        let d = &v["devices"][17];
        assert_eq!(d["name"], "vhost-user-1");
        assert_eq!(
            d["containerEdits"]["env"][0],
            "SWITCHYARD_SOCKET_VHOST_USER_1=/var/run/switchyard/pods/devices/vhost-user-1/vhost-user.sock"
        );
        assert_eq!(
            d["containerEdits"]["mounts"][0]["hostPath"],
            "/var/run/switchyard/pods/devices/vhost-user-1"
        );
        assert_eq!(qualified_name("memif-0"), "switchyard.io/socket=memif-0");
        assert_eq!(
            spec_path(&cfg),
            PathBuf::from("/var/run/cdi/switchyard.io-socket.json")
        );
    }
}
