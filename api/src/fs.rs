//! File helpers the daemon and both plugins share.

use std::io::Write;
use std::path::{Component, Path, PathBuf};

/// `p` as a path if it is absolute, without `.` or `..` components, and
/// usable (no NUL, at most 4096 bytes); else why not, naming `field`.
pub fn clean_absolute(field: &str, p: &str) -> Result<PathBuf, String> {
    let path = Path::new(p);
    if !path.is_absolute() {
        return Err(format!("{field}: {p:?} is not an absolute path"));
    }
    if path
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(format!("{field}: {p:?} must not contain '.' or '..'"));
    }
    if p.len() > 4096 || p.contains('\0') {
        return Err(format!("{field}: not a usable path"));
    }
    Ok(path.to_path_buf())
}

/// Replaces `path` with `body` so that a reader or a crash sees the old or
/// the new content, never a torn one: a temp file beside it (mode `mode`),
/// fsync, rename, fsync of the directory. The directory must exist.
pub fn write_atomic(path: &Path, body: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(body)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Gives `path` to group `gid` with `mode`: how sockets (0660) and the
/// directories holding them (0770) are opened to non-root pods in a group.
/// Every such grant (port sockets, the control socket, the CNI's pod
/// directories, the device plugin's device directories) goes through here.
pub fn share_with_group(path: &Path, gid: u32, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::chown(path, None, Some(gid))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_replace_whole_files() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.json");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!d.path().join(".f.json.tmp").exists());
    }
}
