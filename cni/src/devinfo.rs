//! Device Information Specification 1.1.0 (Network Plumbing WG): the file
//! that tells a pod which socket is its interface. Roles and modes are the
//! **pod's**: memif `slave` and vhost-user `client` mean the host (the
//! switch) created the socket.

use std::path::Path;

use serde::{Deserialize, Serialize};
use switchyard_api::{MemifRole, VhostUserRole};

use crate::error::{io, CniError, DECODE_FAILURE, INVALID_CONFIG};

/// The spec version written.
pub const VERSION: &str = "1.1.0";

/// memif details.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemifInfo {
    /// The pod's role: `master` or `slave`.
    pub role: MemifRole,
    /// `ethernet`, `ip` or `inject-punt`.
    pub mode: String,
    /// Socket path.
    pub path: String,
}

/// vhost-user details.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VhostUserInfo {
    /// The pod's mode: `client` (the host made the socket) or `server`.
    pub mode: VhostUserRole,
    /// Socket path.
    pub path: String,
}

/// A device information document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `memif`, `vhost-user` (or another type we do not use).
    #[serde(rename = "type")]
    pub kind: String,
    /// Spec version.
    pub version: String,
    /// memif details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memif: Option<MemifInfo>,
    /// vhost-user details.
    #[serde(
        default,
        rename = "vhost-user",
        skip_serializing_if = "Option::is_none"
    )]
    pub vhost_user: Option<VhostUserInfo>,
}

impl DeviceInfo {
    /// Parses a document, checking the part its type requires.
    pub fn parse(bytes: &[u8]) -> Result<DeviceInfo, CniError> {
        // JSON text is UTF-8 (RFC 8259 8.1) throughout: serde_json checks
        // only the strings it keeps, and would pass bad bytes in a field we
        // ignore.
        let text = std::str::from_utf8(bytes)
            .map_err(|e| CniError::new(DECODE_FAILURE, format!("device-info: not UTF-8: {e}")))?;
        let bad = |e: String| CniError::new(DECODE_FAILURE, format!("device-info: {e}"));
        // An object, as Go's encoding/json reads one into a struct (serde
        // would take an array as the fields in order); a key given twice
        // counts once, the last, as there.
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if !v.is_object() {
            return Err(bad("not a JSON object".into()));
        }
        let d: DeviceInfo = serde_json::from_value(v).map_err(|e| bad(e.to_string()))?;
        let ok = match d.kind.as_str() {
            "memif" => d.memif.is_some(),
            "vhost-user" => d.vhost_user.is_some(),
            _ => true,
        };
        if !ok {
            return Err(CniError::new(
                DECODE_FAILURE,
                format!(
                    "device-info: type {:?} without its {:?} section",
                    d.kind, d.kind
                ),
            ));
        }
        Ok(d)
    }

    /// The socket path, for the types we know.
    pub fn socket_path(&self) -> Option<&str> {
        self.memif
            .as_ref()
            .map(|m| m.path.as_str())
            .or(self.vhost_user.as_ref().map(|v| v.path.as_str()))
    }

    /// Reads `path`; `Ok(None)` when it does not exist or is empty.
    pub fn read(path: &Path) -> Result<Option<DeviceInfo>, CniError> {
        match std::fs::read(path) {
            Ok(b) if b.iter().all(u8::is_ascii_whitespace) => Ok(None),
            Ok(b) => DeviceInfo::parse(&b).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(path.display(), e)),
        }
    }

    /// Writes `path` atomically, creating its directory.
    pub fn write(&self, path: &Path) -> Result<(), CniError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io(dir.display(), e))?;
        }
        let body = serde_json::to_vec_pretty(self).unwrap_or_default();
        switchyard_api::fs::write_atomic(path, &body, 0o644).map_err(|e| io(path.display(), e))
    }
}

/// How a resource name or device ID appears in an NPWG file name ('/' as
/// '-').
pub fn file_name_part(name: &str) -> String {
    name.replace('/', "-")
}

/// The end of the NPWG file name of `device_id`'s device-info file.
fn device_plugin_suffix(device_id: &str) -> String {
    format!("-{}-device.json", file_name_part(device_id))
}

/// The resource part of `file`'s name (`file_name_part` of the resource),
/// a device plugin's device-info file for `device_id`.
pub fn device_plugin_file_resource(file: &Path, device_id: &str) -> Option<String> {
    let name = file.file_name()?.to_str()?;
    Some(
        name.strip_suffix(&device_plugin_suffix(device_id))?
            .to_string(),
    )
}

/// The file a device plugin wrote for `device_id` in `dir`: the NPWG name
/// is `<resource with '/' as '-'>-<device ID with '/' as '-'>-device.json`,
/// and the CNI is not told the resource, so the name is matched by its end
/// (as Multus's `LoadDeviceInfo` does by the device ID). `Ok(None)` when no
/// file matches; two matches are an error naming both.
pub fn find_device_plugin_file(
    dir: &Path,
    device_id: &str,
) -> Result<Option<std::path::PathBuf>, CniError> {
    let suffix = device_plugin_suffix(device_id);
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(dir.display(), e)),
    };
    let mut found: Vec<std::path::PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(&suffix)))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .collect();
    found.sort();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(CniError::new(
            INVALID_CONFIG,
            format!(
                "deviceID: {device_id:?} matches several device-info files in {}: {}",
                dir.display(),
                found
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vhost_user_matches_the_spec_example() {
        let d = DeviceInfo::parse(
            br#"{"type":"vhost-user","version":"1.1.0","vhost-user":{"mode":"server","path":"/var/run/vhost.sock"}}"#,
        )
        .unwrap();
        assert_eq!(d.socket_path(), Some("/var/run/vhost.sock"));
        let back = serde_json::to_value(&d).unwrap();
        assert_eq!(back["vhost-user"]["mode"], "server");
        assert!(back.get("memif").is_none());
    }

    #[test]
    fn only_a_utf8_json_object_is_a_document() {
        // Found by the device_info fuzz target (its corpus keeps it):
        // serde_json skips an unknown field's string unchecked.
        let e = DeviceInfo::parse(b"{\"type\":\"x\",\"version\":\"1.1.0\",\"other\":\"a\x84b\"}")
            .unwrap_err();
        assert!(e.msg.contains("not UTF-8"), "{}", e.msg);
        // Also found by it: an array is no document.
        let e = DeviceInfo::parse(br#"["v",","]"#).unwrap_err();
        assert!(e.msg.contains("not a JSON object"), "{}", e.msg);
    }

    #[test]
    fn device_plugin_files_are_found_by_device_id() {
        let d = tempfile::tempdir().unwrap();
        let w = |n: &str| std::fs::write(d.path().join(n), b"{}").unwrap();
        w("switchyard.io-memif-memif-1-device.json");
        w("switchyard.io-memif-memif-11-device.json");
        w("example.com-fast-fast-1-device.json");
        let f = find_device_plugin_file(d.path(), "memif-1")
            .unwrap()
            .unwrap();
        assert!(f.ends_with("switchyard.io-memif-memif-1-device.json"));
        assert_eq!(find_device_plugin_file(d.path(), "memif-2").unwrap(), None);
        assert_eq!(
            find_device_plugin_file(&d.path().join("none"), "memif-1").unwrap(),
            None
        );
        w("other.io-memif-memif-1-device.json");
        let e = find_device_plugin_file(d.path(), "memif-1").unwrap_err();
        assert!(e.msg.starts_with("deviceID:"), "{e}");
    }

    #[test]
    fn type_without_section_is_refused() {
        assert!(DeviceInfo::parse(br#"{"type":"memif","version":"1.1.0"}"#).is_err());
        assert!(DeviceInfo::parse(b"{").is_err());
        let d = DeviceInfo::parse(
            br#"{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:01:02.2"}}"#,
        )
        .unwrap();
        assert_eq!(d.socket_path(), None);
    }
}
