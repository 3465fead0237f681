//! Device Information Specification 1.1.0 (Network Plumbing WG): the
//! document that tells a pod which socket is its interface. The device
//! plugin writes it for each device, the CNI for each attachment (and
//! reads the device plugin's). Roles here are **the pod's**: memif `slave`
//! and vhost-user `client` mean the host (the switch) created the socket.

use serde::{Deserialize, Serialize};

use crate::spec::{MemifRole, SocketKind, SocketRole, VhostUserRole};

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

/// Why bytes are not a device-info document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device-info: {0}")]
pub struct DeviceInfoError(String);

impl DeviceInfo {
    /// The document telling a pod whose role is `pod_role` that its
    /// socket is `path` (memif in ethernet mode, the one a bridge serves).
    pub fn for_pod(pod_role: SocketRole, path: &str) -> DeviceInfo {
        let path = path.to_string();
        let side = pod_role.side();
        let (memif, vhost_user) = match pod_role.kind() {
            SocketKind::Memif => (
                Some(MemifInfo {
                    role: side.into(),
                    mode: "ethernet".into(),
                    path,
                }),
                None,
            ),
            SocketKind::VhostUser => (
                None,
                Some(VhostUserInfo {
                    mode: side.into(),
                    path,
                }),
            ),
        };
        DeviceInfo {
            kind: pod_role.kind().name().to_string(),
            version: VERSION.to_string(),
            memif,
            vhost_user,
        }
    }

    /// The pod's role, for the socket types we know.
    pub fn pod_role(&self) -> Option<SocketRole> {
        match self.kind.as_str() {
            "memif" => self.memif.as_ref().map(|m| m.role.into()),
            "vhost-user" => self.vhost_user.as_ref().map(|v| v.mode.into()),
            _ => None,
        }
    }

    /// Parses a document, checking the part its type requires.
    pub fn parse(bytes: &[u8]) -> Result<DeviceInfo, DeviceInfoError> {
        let bad = |e: String| DeviceInfoError(e);
        // JSON text is UTF-8 (RFC 8259 8.1) throughout: serde_json checks
        // only the strings it keeps, and would pass bad bytes in a field we
        // ignore.
        let text = std::str::from_utf8(bytes).map_err(|e| bad(format!("not UTF-8: {e}")))?;
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
            return Err(bad(format!(
                "type {:?} without its {:?} section",
                d.kind, d.kind
            )));
        }
        Ok(d)
    }

    /// Writes the document to `path` atomically (mode 0644), creating its
    /// directory.
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let body = serde_json::to_vec_pretty(self).unwrap_or_default();
        crate::fs::write_atomic(path, &body, 0o644)
    }

    /// The socket path, for the types we know.
    pub fn socket_path(&self) -> Option<&str> {
        self.memif
            .as_ref()
            .map(|m| m.path.as_str())
            .or(self.vhost_user.as_ref().map(|v| v.path.as_str()))
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
        assert!(e.to_string().contains("not UTF-8"), "{e}");
        // Also found by it: an array is no document.
        let e = DeviceInfo::parse(br#"["v",","]"#).unwrap_err();
        assert!(e.to_string().contains("not a JSON object"), "{e}");
    }

    #[test]
    fn type_without_section_is_refused() {
        assert!(DeviceInfo::parse(br#"{"type":"memif","version":"1.1.0"}"#).is_err());
        assert!(DeviceInfo::parse(b"{").is_err());
        let d = DeviceInfo::parse(
            br#"{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:01:02.2"}}"#,
        )
        .unwrap();
        assert_eq!((d.socket_path(), d.pod_role()), (None, None));
    }

    #[test]
    fn a_pods_document_says_its_role_and_socket() {
        for kind in SocketKind::ALL {
            let role = kind.default_pod_role();
            let d = DeviceInfo::for_pod(role, "/run/p/x.sock");
            let back = DeviceInfo::parse(&serde_json::to_vec(&d).unwrap()).unwrap();
            assert_eq!(back.pod_role(), Some(role));
            assert_eq!(back.socket_path(), Some("/run/p/x.sock"));
            assert_eq!(back.kind, kind.name());
        }
        let m = serde_json::to_value(DeviceInfo::for_pod(
            SocketKind::Memif.default_pod_role(),
            "/s",
        ))
        .unwrap();
        assert_eq!(
            m,
            serde_json::json!({"type":"memif","version":"1.1.0","memif":{"role":"slave","mode":"ethernet","path":"/s"}})
        );
    }
}
