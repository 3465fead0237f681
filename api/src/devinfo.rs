//! Device Information Specification 1.1.0 (Network Plumbing WG): the
//! document that tells a pod which socket is its interface. The device
//! plugin writes it for each device, the CNI for each attachment (and
//! reads the device plugin's). Roles here are **the pod's**: memif `slave`
//! and vhost-user `client` mean the host (the switch) created the socket.
//!
//! Each socket kind's section (`memif`, `vhost-user`) is its spec
//! module's ([`crate::spec::socket::SocketKindSpec::device_info`]); this
//! document knows none of them by name.

use serde::{Deserialize, Serialize};

use crate::spec::{SocketKind, SocketRole};

/// The spec version written.
pub const VERSION: &str = "1.1.0";

/// A device information document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `memif`, `vhost-user` (or another type we do not use).
    #[serde(rename = "type")]
    pub kind: String,
    /// Spec version.
    pub version: String,
    /// The sections, by type (`memif`, `vhost-user`, `pci`, ...): the
    /// type's own is the one read.
    #[serde(flatten)]
    pub sections: serde_json::Map<String, serde_json::Value>,
}

/// A document that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device-info: {0}")]
pub struct DeviceInfoError(String);

impl DeviceInfo {
    /// The document telling a pod whose role is `pod_role` that its
    /// socket is `path`.
    pub fn for_pod(pod_role: SocketRole, path: &str) -> DeviceInfo {
        let kind = pod_role.kind();
        let mut sections = serde_json::Map::new();
        sections.insert(
            kind.name().to_string(),
            kind.device_info(pod_role.side(), path),
        );
        DeviceInfo {
            kind: kind.name().to_string(),
            version: VERSION.to_string(),
            sections,
        }
    }

    /// The socket kind the document describes, and its section.
    fn socket_section(&self) -> Option<(SocketKind, &serde_json::Value)> {
        let kind = SocketKind::from_name(&self.kind)?;
        Some((kind, self.sections.get(kind.name())?))
    }

    /// The section of the document's type, read as `T` (a kind's info
    /// type, e.g. `MemifInfo`).
    pub fn section<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(self.sections.get(&self.kind)?.clone()).ok()
    }

    /// The pod's role the document names, for a socket kind.
    pub fn pod_role(&self) -> Option<SocketRole> {
        let (kind, section) = self.socket_section()?;
        Some(kind.role(kind.device_info_side(section)?))
    }

    /// Parses a document: a UTF-8 JSON object whose socket type (if it is
    /// one) has its section, readable as the kind's.
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
        if let Some(kind) = SocketKind::from_name(&d.kind) {
            let section = d.sections.get(kind.name()).ok_or_else(|| {
                bad(format!(
                    "type {:?} without its {:?} section",
                    d.kind, d.kind
                ))
            })?;
            if kind.device_info_side(section).is_none() || d.socket_path().is_none() {
                return Err(bad(format!(
                    "the {:?} section names no role or path it can be read by",
                    d.kind
                )));
            }
        }
        Ok(d)
    }

    /// Writes the document (atomically, mode 0644).
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let body = serde_json::to_vec_pretty(self).unwrap_or_default();
        crate::fs::write_atomic(path, &body, 0o644)
    }

    /// The socket path, for a socket kind's document.
    pub fn socket_path(&self) -> Option<&str> {
        self.socket_section()?.1.get("path")?.as_str()
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
        for &kind in SocketKind::ALL {
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
