//! Device-info files (NPWG Device Information Specification): reading and
//! writing them, and finding the one a device plugin wrote for a device.
//! The document itself is [`switchyard_api::devinfo::DeviceInfo`].

use std::path::Path;

pub use switchyard_api::devinfo::{DeviceInfo, VERSION};

use crate::error::{io, CniError, DECODE_FAILURE, INVALID_CONFIG};

/// Reads `path`; `Ok(None)` when it does not exist or is empty.
pub fn read(path: &Path) -> Result<Option<DeviceInfo>, CniError> {
    match std::fs::read(path) {
        Ok(b) if b.iter().all(u8::is_ascii_whitespace) => Ok(None),
        Ok(b) => DeviceInfo::parse(&b)
            .map(Some)
            .map_err(|e| CniError::new(DECODE_FAILURE, e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path.display(), e)),
    }
}

/// Writes `info` to `path` atomically, creating its directory.
pub fn write(info: &DeviceInfo, path: &Path) -> Result<(), CniError> {
    info.write(path).map_err(|e| io(path.display(), e))
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
}
